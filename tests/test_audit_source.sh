#!/usr/bin/env bash
# tokshard audit --against-source: documents read again from the inputs where
# the shards' provenance says the build read them, encoded again with the
# tokenizer parsed from its file, compared id by id with the shards.
#   formats  clean on an honest dataset of each input kind (text cut into work
#            units, JSON Lines with a byte order mark, Parquet row groups, a .gz
#            file, a .tar.xz archive) and of all of them in one build, with
#            --all; a seeded sample is the same twice
#   tamper   shard ids altered and every checksum re-sealed (tests/forge_token.c):
#            the plain audit passes, --against-source names the shard, the
#            document, the token and the first differing id, exit 1
#   cache    a build through a forged tokenizer cache entry (tests/forge_cache.c,
#            written under the user's key): caught by its ids and by the manifest's
#            tables_xxh3 against the parsed file's; an honest dataset stays
#            clean with the forged entry in place (the audit parses the file)
#   changed  inputs edited after the build (same size, longer, removed):
#            "source changed", those documents skipped, no "ids differ"
#   old      a dataset without provenance (an import: format version 1): refused,
#            saying so
#   main     the main job's dataset (samples/main.sh: its corpus and build
#            flags, the setup's tokenizer), --all: clean
#   mpi      under mpirun -np 2 and 3 the ranks split the sample: the same
#            report as one process, clean and tampered
# Usage: test_audit_source.sh BIN_DIR WORKDIR CASE FORGE_TOKEN FORGE_CACHE
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
CASE=$3
FORGE_TOKEN=$4
FORGE_CACHE=$5
TKS=$BIN/tokshard
T=$2/build/setup
W=$2/audit-source-$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
[[ -r $T/bpe.model && -d $T/ref ]] || { fail "no $T/bpe.model (run through ctest: build_setup)"; finish test_audit_source; }
export TOKSHARD_CACHE_DIR=off

# the summary line's numbers: compared, differ, skipped
counts() { sed -n 's/.*: \([0-9]*\) compared, \([0-9]*\) with ids that differ, \([0-9]*\) skipped.*/\1 \2 \3/p' "$W/out"; }
# clean DATASET WHAT: --all finds every document identical
clean() {
  expect 0 "$2: --against-source --all" -- "$TKS" audit "$1" --against-source --all || return
  local n c
  n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["totals"]["n_docs"])' "$1/manifest.json")
  c=$(counts)
  [[ $c == "$n 0 0" ]] && ok "$2: all $n documents read again and identical" || fail "$2: counts '$c' of $n: $(tail -3 "$W/out")"
}
byte_level_tokenizer() { # a tokenizer.json made here: a token for every byte, a few merges
  python3 "$HERE/tiny_bytelevel.py" "$1" --eos "<|endoftext|>" "t h" "i n" "e r" "a n" "Ġ th" "o n"
}
S=(--tokenizer "$T/bpe.model" --append-eos --prepend-bos --shard-tokens 100K)

case $CASE in
formats)
  mkdir in
  head -c 1500000 "$T/gcide.txt" >in/dict.txt
  expect 0 "text, blank-line documents, cut into work units" -- "$TKS" build -q "${S[@]}" --doc-split blank-line \
    --unit-bytes 300K --output text "$W/in/dict.txt"
  grep -q '"pieces"' text/manifest.json && ok "the text input was read in pieces" || fail "no pieces in the manifest"
  clean text "text"
  head -c 700000 "$T/gcide.txt" | gzip -9 >in/lines.txt.gz
  expect 0 "a .gz file, line documents" -- "$TKS" build -q "${S[@]}" --doc-split line --output gz "$W/in/lines.txt.gz"
  clean gz ".gz"
  tar -cJf in/pydoc.tar.xz -C "$T" pydoc
  expect 0 "a .tar.xz archive, file documents" -- "$TKS" build -q "${S[@]}" --doc-split file --output txz "$W/in/pydoc.tar.xz"
  clean txz ".tar.xz"
  # JSON Lines: a byte order mark, escapes, non-ASCII text, another key beside
  python3 - "$T/pydoc" in/docs.jsonl <<'PYEOF'
import glob, json, os, sys
out = open(sys.argv[2], "w", encoding="utf-8")
out.write("\ufeff")
for i, f in enumerate(sorted(glob.glob(os.path.join(sys.argv[1], "*")))):
    text = open(f, encoding="utf-8").read()
    out.write(json.dumps({"id": i, "text": text + ("\u00e9t\u00e9 \u2014 caf\u00e9\t\"q\"" if i % 3 == 0 else "")},
                         ensure_ascii=i % 2 == 0) + "\n")
PYEOF
  byte_level_tokenizer tok.json
  expect 0 "JSON Lines with a byte-level tokenizer" -- "$TKS" build -q --tokenizer "$W/tok.json" --append-eos \
    --output jsonl "$W/in/docs.jsonl"
  clean jsonl "JSON Lines"
  if "$TKS" --version | grep -q "parquet input: Apache Arrow" && [[ -x $HERE/../.venv-arrow/bin/python ]]; then
    "$HERE/../.venv-arrow/bin/python" - "$T/gcide.txt" in/paras.parquet <<'PYEOF'
import sys
import pyarrow as pa, pyarrow.parquet as pq
paras = [p for p in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n\n") if p.strip()][:2500]
paras[5] = None  # a null row: no document, but a row of its group
pq.write_table(pa.table({"n": list(range(len(paras))), "text": paras}), sys.argv[2], row_group_size=700)
PYEOF
    expect 0 "Parquet, row groups of 700 rows, as work units" -- "$TKS" build -q "${S[@]}" --unit-bytes 200K \
      --output pq "$W/in/paras.parquet"
    clean pq "Parquet"
    PQ=("$W/in/paras.parquet")
  else
    ok "Parquet skipped: this tokshard reads no Parquet, or no .venv-arrow to write it"
    PQ=()
  fi
  expect 0 "every kind in one build" -- "$TKS" build -q "${S[@]}" --doc-split blank-line --unit-bytes 400K \
    --output mixed "$W/in/dict.txt" "$W/in/lines.txt.gz" "$W/in/pydoc.tar.xz" "${PQ[@]}"
  clean mixed "every kind in one build"
  expect 0 "a sample of 40, seed 7" -- "$TKS" audit mixed --against-source --sample 40 --seed 7 --json
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("seconds"); print(json.dumps(r, sort_keys=True))' \
    "$W/out" >s1.json
  "$TKS" audit mixed --against-source --sample 40 --seed 7 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); r.pop("seconds"); print(json.dumps(r, sort_keys=True))' >s2.json
  grep -q '"checked": 40' s1.json && cmp -s s1.json s2.json && ok "a seeded sample of 40: the same report twice" ||
    fail "seeded sample: $(head -c 300 s1.json) / $(head -c 300 s2.json)"
  expect 0 "the default sample" -- "$TKS" audit mixed --against-source
  grep -Eq "^OK: mixed: 300 \(seed [0-9]+\) of" "$W/out" && ok "300 documents by default, the seed printed" ||
    fail "default sample: $(tail -2 "$W/out")"
  ;;

tamper)
  cp -r "$T/ref" forged
  expect 0 "honest dataset: clean" -- "$TKS" audit "$T/ref" --against-source --all
  expect 0 "ids altered and re-sealed" -- "$FORGE_TOKEN" forged 1 10 1999
  expect 0 "the plain audit finds nothing (every checksum re-sealed)" -- "$TKS" audit forged
  expect 1 "--against-source --all" -- "$TKS" audit forged --against-source --all
  c=$(counts)
  [[ ${c#* } == "1 0" ]] && ok "one document's ids differ, none skipped" || fail "counts '$c': $(tail -3 "$W/out")"
  grep -Eq "^PROBLEM .*shard-00001.tks token 10: ids differ: document 0 of shard 1, from .*byte [0-9]+: first difference at id 10 of [0-9]+: the shard has 1999, the tokenizer parsed from its file gives [0-9]+" "$W/out" &&
    ok "the report names the shard, document, token, source and first differing id" ||
    fail "report: $(grep PROBLEM "$W/out" | head -3)"
  grep -Eq "^FAILED: forged: " "$W/out" && ok "summary FAILED" || fail "summary: $(tail -2 "$W/out")"
  expect 1 "--json" -- "$TKS" audit forged --against-source --all --json
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); p=r["problems"][0]
assert r["ids_differ"] == 1 and p["kind"] == "ids differ" and p["shard"] == 1 and p["doc"] == 0 and p["token_offset"] == 10, r' \
    "$W/out" && ok "--json: the problem's kind, shard, doc and token" || fail "--json: $(head -c 600 "$W/out")"
  ;;

cache)
  byte_level_tokenizer tok.json
  head -c 300000 "$T/gcide.txt" >text.txt
  export TOKSHARD_CACHE_DIR=$W/cache
  B=(--tokenizer "$W/tok.json" --doc-split blank-line --append-eos --shard-tokens 100K)
  expect 0 "honest build (parses, writes the cache entry)" -- "$TKS" build -q "${B[@]}" --output honest "$W/text.txt"
  expect 0 "forge the entry: bytes x and z swapped" -- "$FORGE_CACHE" "$W/tok.json" x z
  expect 0 "build through the forged entry" -- "$TKS" build -q "${B[@]}" --output forged "$W/text.txt"
  cmp -s honest/shard-00000.tks forged/shard-00000.tks && fail "the forged entry was not used (same shards)" ||
    ok "the forged entry gave other ids"
  expect 0 "the plain audit of the forged build passes" -- "$TKS" audit forged
  expect 1 "--against-source --all catches it" -- "$TKS" audit forged --against-source --all
  grep -q "ids differ: document" "$W/out" && [[ $(counts | cut -d' ' -f2) -gt 0 ]] &&
    ok "$(counts | cut -d' ' -f2) documents' ids differ" || fail "not caught: $(tail -3 "$W/out")"
  # whatever the sample: the manifest's tables_xxh3 is not the parsed file's
  expect 1 "--against-source --sample 1" -- "$TKS" audit forged --against-source --sample 1 --seed 3
  grep -Eq "^PROBLEM forged/tokenizer.json: tables differ: the manifest records that the build encoded with tables of XXH3-128 [0-9a-f]{32}, and forged/tokenizer.json parsed from its file has [0-9a-f]{32}" "$W/out" &&
    ok "the tables' digest differs from the manifest's" || fail "tables: $(head -3 "$W/out")"
  # the forged entry stays in the cache: the audit of the honest build parses the file
  clean honest "honest build, forged entry still cached"
  grep -q "tables: the manifest's tables_xxh3 is that of the tokenizer parsed from its file" "$W/out" &&
    ok "honest build: the same tables" || fail "honest tables: $(tail -3 "$W/out")"
  [[ -z $(find cache -newer forged/manifest.json -name 'bpe-*.tkc') ]] && ok "the audit wrote no cache entry" ||
    fail "a cache entry written by the audit"
  # the tables' digest is of the tables alone, never of what the heap held
  # before (glibc fills new blocks with MALLOC_PERTURB_'s byte)
  for p in 1 2 3 165; do
    MALLOC_PERTURB_=$p "$TKS" audit honest --against-source --sample 1 --seed 1 >"$W/out" 2>&1
    grep -q "tables: the manifest's tables_xxh3 is that of the tokenizer parsed from its file" "$W/out" &&
      ok "MALLOC_PERTURB_=$p: the same tables' digest" || fail "MALLOC_PERTURB_=$p: $(tail -2 "$W/out")"
  done
  ;;

changed)
  mkdir -p in/pydoc
  head -c 600000 "$T/gcide.txt" >in/dict.txt
  cp "$T"/pydoc/* in/pydoc/
  expect 0 "build" -- "$TKS" build -q "${S[@]}" --doc-split blank-line --unit-bytes 200K --output d "$W/in/dict.txt" \
    "$W/in/pydoc"
  clean d "before any edit"
  # the same size: one word's case in the first piece of dict.txt
  python3 - in/dict.txt <<'PYEOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); i = b.index(b" the ", 1000); b[i + 1:i + 4] = b"THE"
open(sys.argv[1], "wb").write(b)
PYEOF
  first=$(ls in/pydoc | head -1) last=$(ls in/pydoc | tail -1)
  echo "one more line" >>"in/pydoc/$first"
  rm "in/pydoc/$last"
  expect 1 "--against-source --all after the edits" -- "$TKS" audit d --against-source --all
  read -r cmpd dif skip <<<"$(counts)"
  [[ $dif == 0 && $skip -gt 0 && $cmpd -gt 0 ]] && ok "$skip documents skipped as changed, $cmpd compared, no ids differ" ||
    fail "counts '$cmpd $dif $skip': $(tail -3 "$W/out")"
  grep -q "^SOURCE CHANGED: d: " "$W/out" && ! grep -q "ids differ:" "$W/out" && ok "summary SOURCE CHANGED, no ids differ" ||
    fail "summary: $(tail -2 "$W/out")"
  grep -Eq "source changed: the XXH3-128 of $W/in/dict.txt \(bytes 0 to [0-9]+\) is [0-9a-f]{32}, the build recorded [0-9a-f]{32}; the [0-9]+ sampled documents it holds skipped \(the first: document 0 of shard 0\)" "$W/out" &&
    ok "same-size edit: the piece's hash" || fail "dict.txt: $(grep dict.txt "$W/out" | head -2)"
  grep -q "source changed: $W/in/pydoc/$first holds [0-9]* bytes, the build read [0-9]*" "$W/out" &&
    ok "longer file: its size" || fail "$first: $(grep "$first" "$W/out" | head -2)"
  grep -q "source changed: $W/in/pydoc/$last cannot be read now" "$W/out" && ok "removed file: named" ||
    fail "$last: $(grep "$last" "$W/out" | head -2)"
  grep -q "restore the inputs the build read" "$W/out" && ok "says what to do" || fail "no advice: $(tail -2 "$W/out")"
  ;;

old)
  python3 -c "import struct, sys; sys.stdout.buffer.write(struct.pack('<9H', 104, 105, 3, 104, 270, 3, 5, 6, 3))" >raw.bin
  expect 0 "import (format version 1, no provenance)" -- "$TKS" import --format raw --dtype u16 --eot 3 raw.bin \
    --output imp --tokenizer "$T/bpe.model"
  expect 0 "the plain audit" -- "$TKS" audit imp
  expect 2 "--against-source is refused" -- "$TKS" audit imp --against-source
  expect_msg "imp has no provenance: its shards are format version 1 .* build it again, or audit it without --against-source"
  expect 2 "--sample without --against-source" -- "$TKS" audit imp --sample 5
  expect_msg "--sample, --all and --seed go with --against-source"
  expect 2 "--sample with --all" -- "$TKS" audit imp --against-source --sample 5 --all
  expect_msg "give --sample N or --all, not both"
  ;;

main)
  # samples/main.sh's datasets: its corpus, its build flags
  source "$HERE/../samples/corpus.sh"
  expect 0 "build the main job's dataset" -- "$TKS" build -q --tokenizer "$T/bpe.model" --doc-split blank-line \
    --append-eos --shard-tokens 4M --output dataset "${TKS_CORPUS[@]}"
  clean dataset "the main job's dataset"
  grep -q "sentencepiece library: [0-9]* documents compared, 0 with ids that differ" "$W/out" &&
    ok "the sentencepiece library agrees" || fail "sentencepiece: $(tail -2 "$W/out")"
  ;;

mpi)
  mpi_env
  MPI=(mpirun --oversubscribe)
  cp -r "$T/ref" forged
  "$FORGE_TOKEN" forged 2 5 1999 >/dev/null && "$FORGE_TOKEN" forged 0 700 1998 >/dev/null || fail "forge_token"
  for d in "$T/ref" forged; do
    name=$(basename "$d")
    "$TKS" audit "$d" --against-source --all --json >"$name-np0.raw"
    echo $? >"$name-np0.rc"
    for np in 2 3; do
      "${MPI[@]}" -np $np "$TKS" audit "$d" --against-source --all --json >"$name-np$np.raw" 2>"$name-np$np.err"
      echo $? >"$name-np$np.rc"
    done
    for np in 0 2 3; do
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("seconds"); r.pop("seed"); print(json.dumps(r, indent=1, sort_keys=True))' \
        "$name-np$np.raw" >"$name-np$np.json" 2>/dev/null
    done
    for np in 2 3; do
      cmp -s "$name-np0.json" "$name-np$np.json" && cmp -s "$name-np0.rc" "$name-np$np.rc" &&
        ok "$name: np $np: the same report and exit code ($(cat "$name-np0.rc")) as one process" ||
        fail "$name: np $np differs: $(diff "$name-np0.json" "$name-np$np.json" | head -6) $(tail -c 300 "$name-np$np.err")"
    done
  done
  grep -q '"ids_differ": 2' forged-np0.json && ok "the two altered documents found" || fail "forged: $(head -c 400 forged-np0.json)"
  # a seeded sample: the same documents whatever the ranks
  for np in 0 2; do
    if [[ $np -eq 0 ]]; then "$TKS" audit forged --against-source --sample 200 --seed 5 --json >smp-np0.raw 2>&1
    else "${MPI[@]}" -np 2 "$TKS" audit forged --against-source --sample 200 --seed 5 --json >smp-np2.raw 2>/dev/null; fi
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("seconds"); print(json.dumps(r, indent=1, sort_keys=True))' \
      "smp-np$np.raw" >"smp-np$np.json" 2>/dev/null
  done
  grep -q '"seed": 5' smp-np0.json && cmp -s smp-np0.json smp-np2.json && ok "a seeded sample: the same report under np 2" ||
    fail "seeded sample under np 2: $(diff smp-np0.json smp-np2.json | head -6)"
  ;;
*)
  fail "unknown case $CASE"
  ;;
esac
finish test_audit_source
