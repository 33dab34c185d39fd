#!/usr/bin/env bash
# Parquet inputs (tokenize/input/parquet.cc through Arrow's C++ reader), on files
# tests/parquet_write.py writes with pyarrow from the Python docs and GCIDE.
# Usage: test_parquet.sh BIN_DIR WORKDIR CASE   (needs the build_setup fixture)
#   CASE same: a directory of Parquet files (every codec, dictionary and plain
#   encodings, row groups of 1 to 1000 rows, page CRCs, large_string, binary
#   and large_binary columns, nulls, zero rows, zero row groups) gives the
#   shards of the JSON Lines file of the same documents (but for the provenance
#   records, which say where each came from), with 1 and 2
#   threads, under mpirun -np 1, 2, 3; with small --unit-bytes (row groups as
#   work units) the same bytes for 1 and 2 threads, mpirun -np 2 and 3, and
#   after a kill -9 at a unit's second shard and --resume (a file changed since
#   is refused, naming its row groups); the manifest names
#   the column, the row groups and the rows; train-tokenizer and
#   verify-tokenizer read Parquet too.
#   CASE bad: files that are not Parquet, damaged (footer length past the
#   file, a column chunk past the file, a page larger than declared, a CRC
#   mismatch, cut short) or without a text column (missing, INT64, struct,
#   list, two top-level columns of the name: ambiguous): exit 2 naming the
#   file (and the row group, or the column and the file's columns), nothing
#   published; --on-bad-input skip leaves out and
#   lists those refused at the footer; a Parquet file under another name is
#   refused, never read as text; --invalid-utf8 and NUL bytes of a binary
#   column follow the text policies, errors naming the file and the row.
# Reports skipped (77) in a build without Parquet support, after checking
# that a Parquet input is then refused with the instruction.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
W=$2
CASE=$3
TKS=$BIN/tokshard
T=$W/build/setup
W=$W/parquet-$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
[[ -d $T/pydoc ]] || { echo "no data at $T (build_setup)"; exit 2; }
mpi_env
PY=$HERE/../.venv-arrow/bin/python

if ! "$TKS" --version | grep -q "parquet input: Apache Arrow"; then
  # a build without Arrow: a Parquet input is refused with the way to get it
  printf 'PAR1' >x.parquet
  expect 2 "a Parquet input without Parquet support is refused" -- "$TKS" build --tokenizer "$T/bpe.model" --output o x.parquet
  expect_msg "built without Parquet support: run scripts/install-venv.sh"
  [[ $fails -eq 0 ]] || finish test_parquet
  echo "SKIPPED [$CASE]: this tokshard reads no Parquet (pyarrow not found at build time)"
  exit 77
fi
[[ -x $PY ]] || { fail "no $PY (scripts/install-venv.sh) to write the test files"; finish test_parquet; }
"$PY" "$HERE/parquet_write.py" pq "$T/pydoc" "$T/gcide.txt" >write.log 2>&1 ||
  { fail "parquet_write.py: $(tail -3 write.log)"; finish test_parquet; }
B=(--tokenizer "$T/bpe.model" --append-eos --shard-tokens 20K --chunk-bytes 4K)
same_shards() { # A B WHAT: the same shards but for where the documents came from
  # every byte but the provenance section and the header fields that place
  # and hash it (a record's file, place and length differ between a Parquet
  # row and a JSON Lines record; the text each document's hash covers is the same)
  local out
  if out=$(python3 - "$1" "$2" <<'PYEOF'
import glob, os, struct, sys
a, b = sys.argv[1], sys.argv[2]
fa, fb = sorted(glob.glob(a + "/shard-*.tks")), sorted(glob.glob(b + "/shard-*.tks"))
assert fa and [os.path.basename(f) for f in fa] == [os.path.basename(f) for f in fb], "shard files differ"
for x, y in zip(fa, fb):
    p, q = open(x, "rb").read(), open(y, "rb").read()
    po, pn = struct.unpack_from("<QQ", p, 160)
    qo, qn = struct.unpack_from("<QQ", q, 160)
    assert po and po == qo and pn == qn, "%s: provenance sections at %d/%d" % (x, po, qo)
    assert p[:160] == q[:160] and p[184:248] == q[184:248] and p[256:po] == q[256:qo], "%s differs" % x
    assert [p[po + i + 20:po + i + 24] for i in range(0, pn, 24)] == [q[qo + i + 20:qo + i + 24] for i in range(0, qn, 24)], \
        "%s: the documents' text hashes differ" % x
print(len(fa))
PYEOF
  ); then ok "$3: $out shards identical but for where the documents came from"; else fail "$3: $out"; fi
}
same_dataset() { # A B WHAT: every file byte-identical
  if diff -r "$1" "$2" >/dev/null; then ok "$3: byte-identical"; else
    fail "$3: $1 and $2 differ: $(diff -rq "$1" "$2" | head -3)"
  fi
}

case $CASE in
same)
  expect 0 "build from JSON Lines" -- "$TKS" build -q "${B[@]}" --output jsonl pq/same.jsonl
  expect 0 "build from the Parquet directory" -- "$TKS" build "${B[@]}" --output p1 pq/same
  grep -Eq "inputs +19 files" "$W/out" && ok "19 Parquet files read" || fail "inputs: $(grep inputs "$W/out")"
  same_shards jsonl p1 "Parquet vs JSON Lines"
  expect 0 "build with 2 threads" -- "$TKS" build -q "${B[@]}" --threads 2 --output p2 pq/same
  same_dataset p1 p2 "2 threads vs 1"
  for np in 1 2 3; do
    expect 0 "mpirun -np $np build" -- mpirun --oversubscribe -np $np "$TKS" build -q "${B[@]}" --output "m$np" pq/same
    same_dataset p1 "m$np" "mpirun -np $np vs one process"
  done
  python3 - p1/manifest.json <<'EOF' && ok "the manifest names each Parquet input's column, row groups and rows" || fail "manifest provenance"
import json, sys
m = json.load(open(sys.argv[1]))
ins = {i["path"].split("/")[-1]: i for i in m["provenance"]["inputs"]}
assert m["provenance"]["options"]["parquet_column"] == "text"
assert ins["15-nulls.parquet"]["parquet"]["column"] == "text"
assert ins["17-no-row-groups.parquet"]["parquet"]["row_groups"] == 0
assert ins["13-binary.parquet"]["parquet"]["row_groups"] == ins["13-binary.parquet"]["parquet"]["rows"] > 1
assert all("row_group_hashes" in i for n, i in ins.items() if i["parquet"]["row_groups"] > 0), ins
EOF
  # nulls are empty documents: counted, not written
  nulls=$("$PY" -c 'import pyarrow.parquet as pq; print(pq.read_table("pq/same/15-nulls.parquet").column("text").null_count)')
  expect 0 "build of the file with nulls" -- "$TKS" build "${B[@]}" --output pn pq/same/15-nulls.parquet
  grep -Eq "skipped +$nulls empty" "$W/out" && ok "the $nulls null rows are counted as empty documents" ||
    fail "null rows: expected $nulls empty, $(grep skipped "$W/out")"

  # row groups as work units: small units split every file at row groups
  U=(--unit-bytes 64K --batch-bytes 64K)
  expect 0 "build by 64K units" -- "$TKS" build "${B[@]}" "${U[@]}" --output u1 pq/same
  n=$(sed -n 's/^ *units *\([0-9]*\).*/\1/p' "$W/out")
  [[ ${n:-0} -ge 20 ]] && ok "$n work units of row groups" || fail "only ${n:-0} units"
  expect 0 "by units, 2 threads" -- "$TKS" build -q "${B[@]}" "${U[@]}" --threads 2 --output u2 pq/same
  same_dataset u1 u2 "units: 2 threads vs 1"
  for np in 2 3; do
    expect 0 "by units, mpirun -np $np" -- mpirun --oversubscribe -np $np "$TKS" build -q "${B[@]}" "${U[@]}" --output "um$np" pq/same
    same_dataset u1 "um$np" "units: mpirun -np $np vs one process"
  done
  # kill -9 at a unit's 2nd shard, then --resume under mpirun -np 2
  if [[ -n ${TKS_FAULT_LIB:-} && -r $TKS_FAULT_LIB ]]; then
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=shard:2 "$TKS" build -q "${B[@]}" "${U[@]}" --output k pq/same >/dev/null 2>&1
    code=$?
    [[ $code -eq 137 && ! -e k ]] && ok "killed at a unit's 2nd shard, nothing published" || fail "kill: exit $code"
    expect 0 "resume under mpirun -np 2" -- mpirun --oversubscribe -np 2 "$TKS" build -q "${B[@]}" "${U[@]}" --output k --resume pq/same
    same_dataset u1 k "killed and resumed vs uninterrupted"
  else
    fail "TKS_FAULT_LIB not set (run through ctest)"
  fi
  # a file rewritten between the kill and the resume (other row groups) is refused
  LD_PRELOAD=${TKS_FAULT_LIB:-} TKS_FAULT_KILL=shard:3 "$TKS" build -q "${B[@]}" "${U[@]}" --output e pq/same >/dev/null 2>&1
  first=$(ls pq/same/*.parquet | head -1)
  touch -r "$first" ref.stamp
  "$PY" - "$first" <<'EOF'
import sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
pq.write_table(t, sys.argv[1], row_group_size=7, use_dictionary=True, compression="snappy")
EOF
  touch -r ref.stamp "$first"
  "$TKS" build -q "${B[@]}" "${U[@]}" --output e --resume pq/same >e.out 2>&1
  code=$?
  [[ $code -eq 2 && ! -e e ]] && grep -q "cannot resume" e.out && ok "a Parquet file rewritten since the kill: resume refused (exit $code)" ||
    fail "rewritten file: exit $code: $(tail -c 300 e.out)"
  # a file whose bytes changed under the same size and time (one letter of an
  # uncompressed file): the unit's hash refuses it, naming the row groups
  # (not "bytes": a Parquet range is row groups)
  cp -r pq/same pq2
  LD_PRELOAD=${TKS_FAULT_LIB:-} TKS_FAULT_KILL=shard:3 "$TKS" build -q "${B[@]}" "${U[@]}" --output e2 pq2 >/dev/null 2>&1
  f=pq2/01-none-plain.parquet
  touch -r "$f" ref2.stamp
  "$PY" - "$f" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
i = b.find(b"ftp://ftp.gnu.org/gnu/dictionary")  # inside a plain, uncompressed data page
assert i > 0
b[i] = ord("F")
open(sys.argv[1], "wb").write(b)
EOF
  touch -r ref2.stamp "$f"
  expect 2 "resume after a letter of $f changed" -- "$TKS" build -q "${B[@]}" "${U[@]}" --output e2 --resume pq2
  expect_msg "cannot resume: pq2/01-none-plain.parquet changed since the interrupted build \\(row groups [0-9]+ to [0-9]+: XXH3-128 [0-9a-f]{32}, was [0-9a-f]{32}\\), so unit [0-9]+ kept in e2.partial came from other rows"
  grep -q "bytes" "$W/err" && fail "a Parquet range called bytes: $(cat "$W/err")" || ok "the message speaks of row groups only"

  # the other commands that read inputs as build does
  expect 0 "train-tokenizer on Parquet" -- "$TKS" train-tokenizer --output tok --vocab-size 600 pq/same
  expect 0 "verify-tokenizer on Parquet" -- "$TKS" verify-tokenizer "$T/bpe.model" pq/same
  docs=$(wc -l <pq/same.jsonl)
  grep -q "$docs documents" "$W/out" && ok "verify-tokenizer read the $docs Parquet documents" ||
    fail "verify-tokenizer: $(tail -c 300 "$W/out")"
  ;;
bad)
  for f in pq/bad/*.parquet; do
    name=$(basename "$f" .parquet)
    expect 2 "$name is refused" -- "$TKS" build -q "${B[@]}" --output "o-$name" "$f"
    grep -q "$f" "$W/err" && ok "$name: the message names the file" || fail "$name: file not named: $(tail -c 300 "$W/err")"
    [[ ! -e o-$name ]] && ok "$name: nothing published" || fail "$name: o-$name published"
    case $name in
      *-column) expect_msg "the file's columns: .*--parquet-column" ;;
      crc-mismatch) expect_msg "row group 1.*CRC" ;;
      page-larger-than-declared) expect_msg "row group 0" ;;
      chunk-past-file) expect_msg "past the end of the file" ;;
      int-column) expect_msg "INT64" ;;
      two-text-columns) expect_msg "column 'text' is ambiguous: 2 top-level columns have that name" ;;
    esac
  done
  # refused at the footer: --on-bad-input skip leaves them out and lists them
  expect 0 "--on-bad-input skip" -- "$TKS" build "${B[@]}" --on-bad-input skip --output skipped \
    pq/bad/no-column.parquet pq/bad/int-column.parquet pq/bad/footer-past-file.parquet \
    pq/bad/chunk-past-file.parquet pq/bad/text-named.parquet pq/good.parquet
  grep -Eq "bad inputs +5 files left out" "$W/out" && ok "5 files left out and listed" ||
    fail "skip: $(grep -A2 'bad inputs' "$W/out")"
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["provenance"]["skipped_inputs"]; assert len(s) == 5, s' \
    skipped/manifest.json && ok "the manifest lists the 5 files" || fail "skipped_inputs"
  # a Parquet file under another name is never read as text
  expect 2 "a Parquet file named .txt is refused" -- "$TKS" build -q "${B[@]}" --output named pq/named.txt
  expect_msg "named.txt: starts with PAR1"
  # a column name given twice in the file: the other columns are read, that one is refused
  expect 0 "text beside two 'body' columns" -- "$TKS" build -q "${B[@]}" --output twobody pq/two-body.parquet
  expect 2 "--parquet-column body, given twice in the file" -- "$TKS" build -q "${B[@]}" --parquet-column body \
    --output twobody2 pq/two-body.parquet
  expect_msg "two-body.parquet: column 'body' is ambiguous: 2 top-level columns have that name"
  [[ ! -e twobody2 && ! -e twobody2.partial ]] && ok "nothing written for the ambiguous column" || fail "twobody2 written"
  # a binary column: invalid UTF-8 (row 2) and a NUL byte (row 4) follow the text policies
  expect 0 "invalid UTF-8 replaced" -- "$TKS" build "${B[@]}" --output utf pq/utf8.parquet
  grep -Eq "invalid UTF-8 +1 documents" "$W/out" && grep -Eq "1 binary" "$W/out" &&
    ok "1 document with invalid UTF-8 replaced, 1 with a NUL skipped" || fail "utf8: $(grep -E 'invalid|skipped' "$W/out")"
  expect 2 "--invalid-utf8 fail" -- "$TKS" build -q "${B[@]}" --invalid-utf8 fail --output utf2 pq/utf8.parquet
  expect_msg "utf8.parquet:2: invalid UTF-8"
  expect 0 "--max-doc-bytes skips long rows" -- "$TKS" build "${B[@]}" --max-doc-bytes 5 --output long pq/utf8.parquet
  grep -Eq "[1-9][0-9]* too long" "$W/out" && ok "rows over --max-doc-bytes counted as too long" || fail "long: $(grep skipped "$W/out")"
  ;;
*)
  echo "unknown case $CASE"
  exit 2
  ;;
esac
finish test_parquet
