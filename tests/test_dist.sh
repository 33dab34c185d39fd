#!/usr/bin/env bash
# Multi-process tokshard commands under mpirun (--oversubscribe: 2 cores).
# Usage: test_dist.sh BIN_DIR WORKDIR CASE   (needs the build_setup fixture)
#   CASE audit: `mpirun -np N tokshard audit` (N = 1, 2, 3, 7) reports exactly
#   what the single-process audit reports, with the same exit code, on a clean
#   dataset and on one corrupted in many ways at once (token bytes, an index, a
#   truncated shard, a stray shard, ids over --model-vocab, another tokenizer),
#   with a small --max-problems, and on a lone shard file.
#   CASE build: on inputs that mix plain files larger than --unit-bytes (cut
#   at document boundaries), a gzip file, a dictzip file, a .tar.gz archive
#   and a directory of small files, `tokshard build` gives byte-identical
#   datasets (every file) without mpirun (1 and 2 threads) and under
#   `mpirun -np 1, 2, 3, 5`; a rank killed (SIGKILL) at its 2nd shard ends the
#   job, the launcher naming the rank and OUT.partial/in-flight its unit, and
#   --resume with another rank count (and then without mpirun) completes it
#   to the same bytes (a kept unit whose shard was damaged since is built
#   again); a unit that cannot be written ends the job with the rank naming
#   itself and the unit, and the resume after the fix completes.
#   CASE modes: a build started without mpirun and killed (units complete, a
#   unit half built, shards half placed) is resumed under `mpirun -np 2, 3`
#   to the same bytes, keeping its complete units; 64 ranks on 2 cores
#   (more ranks than units) give the same bytes as well.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
BIN=$1
W=$2
CASE=$3
TKS=$BIN/tokshard
T=$W/build/setup
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
[[ -n ${ASAN_OPTIONS:-} ]] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" # see test_parallel.sh
W=$W/dist-$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
[[ -d $T/ref ]] || { echo "no dataset at $T/ref (build_setup)"; exit 2; }
MPI=(mpirun --oversubscribe)

# flip BYTE_OFFSET FILE: inverts one byte in place
flip() {
  local b
  b=$(od -An -tu1 -j "$1" -N1 "$2" | tr -d ' ')
  printf "$(printf '\\%03o' $((255 - b)))" | dd of="$2" bs=1 seek="$1" conv=notrunc status=none
}
# report LABEL NP ARGS...: audit --json (NP 0: without mpirun) into LABEL.json
# with the timing fields removed; the exit code into LABEL.rc
report() {
  local label=$1 np=$2
  shift 2
  if [[ $np -eq 0 ]]; then "$TKS" audit --json "$@" >"$label.raw" 2>"$label.err"
  else "${MPI[@]}" -np "$np" "$TKS" audit --json "$@" >"$label.raw" 2>"$label.err"; fi
  echo $? >"$label.rc"
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); r.pop("seconds"); r.pop("gb_per_s")
print(json.dumps(r, indent=1, sort_keys=True))' "$label.raw" >"$label.json" 2>>"$label.err"
}
# same_as_single LABEL ARGS...: np 1, 2, 3, 7 against no mpirun
same_as_single() {
  local label=$1
  shift
  report "$label-np0" 0 "$@"
  [[ -s $label-np0.json ]] || { fail "$label: single-process audit gave no JSON: $(tail -c 400 "$label-np0.err")"; return; }
  for np in 1 2 3 7; do
    report "$label-np$np" "$np" "$@"
    if ! cmp -s "$label-np0.json" "$label-np$np.json"; then
      fail "$label: np $np report differs: $(diff "$label-np0.json" "$label-np$np.json" | head -5) $(tail -c 300 "$label-np$np.err")"
    elif ! cmp -s "$label-np0.rc" "$label-np$np.rc"; then
      fail "$label: np $np exit $(cat "$label-np$np.rc"), single process $(cat "$label-np0.rc")"
    else
      ok "$label: np $np: same report and exit code ($(cat "$label-np0.rc")) as one process"
    fi
  done
}

case $CASE in
audit)
  cp -r "$T/ref" clean
  same_as_single clean clean
  grep -q '"ok": true' clean-np0.json && ok "clean dataset audits clean" || fail "clean dataset: $(head -c 300 clean-np0.json)"

  cp -r "$T/ref" bad
  n=$(ls bad/shard-*.tks | wc -l)
  flip 4200 bad/shard-00001.tks                                  # token bytes, chunk 0
  flip $(($(stat -c %s bad/shard-00002.tks) - 60)) bad/shard-00002.tks   # the checksum table
  io=$(od -An -tu8 -j 96 -N8 bad/shard-00003.tks | tr -d ' ')    # index_offset
  flip $((io + 8 * 5 + 1)) bad/shard-00003.tks                   # index entry 5
  truncate -s -3 "bad/shard-$(printf %05d $((n - 1))).tks"       # last shard
  cp bad/shard-00000.tks bad/shard-00099.tks                     # stray
  same_as_single bad bad --model-vocab 1000 --tokenizer "$T/uni.model"
  total=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["problems_total"])' bad-np0.json)
  [[ $(cat bad-np0.rc) == 1 && $total -ge 6 ]] && ok "corrupted dataset: $total problems, exit 1" ||
    fail "corrupted dataset: exit $(cat bad-np0.rc), $total problems"
  for kind in "checksum mismatch" "document index" "file size does not match header" "manifest" \
              "token id out of range" "tokenizer"; do
    grep -qi "$kind" bad-np0.json && ok "found: $kind" || fail "not reported: $kind"
  done
  same_as_single capped bad --model-vocab 1000 --tokenizer "$T/uni.model" --max-problems 3
  same_as_single lone bad/shard-00001.tks --model-vocab 1000
  # text output and exit code of a failing path are the same as well
  expect 2 "single process: missing path" -- "$TKS" audit nowhere
  expect 2 "np 2: missing path" -- "${MPI[@]}" -np 2 "$TKS" audit nowhere
  "$TKS" audit bad >single.txt 2>&1
  "${MPI[@]}" -np 3 "$TKS" audit bad >np3.txt 2>/dev/null
  if diff <(sed 's/ hashed in .*//' single.txt) <(sed 's/ hashed in .*//' np3.txt) >/dev/null; then
    ok "text report: np 3 same as one process"
  else fail "text report differs: $(diff single.txt np3.txt | head -5)"; fi
  ;;
build|modes)
  # a plain text cut in ~14 pieces, a .gz and a .dz (never cut: one unit
  # each), a .tar.gz of 10 documentation files, a JSON Lines file cut at
  # record ends, and 30 documentation files grouped into units
  mkdir -p in/docs && head -c 700000 "$T/gcide.txt" | gzip -9 >in/a-gcide.txt.gz
  head -c 500000 "$T/gcide.txt" >in/b-slice.txt && dictzip in/b-slice.txt
  ls "$T"/pydoc/*.rst.txt | head -10 | xargs tar -czf in/c-docs.tar.gz -C "$T/pydoc" --transform 's,.*/,,'
  ls "$T"/pydoc/*.rst.txt | tail -30 | xargs -I{} cp {} in/docs/
  python3 -c 'import json, sys
for p in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n\n")[:3000]:
    print(json.dumps({"text": p}))' "$T/gcide.txt" >in/d-records.jsonl
  cp "$T/gcide.txt" in/e-gcide.txt
  B=(build -q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 50K
     --chunk-bytes 4K --unit-bytes 300K in)
  V=(build "${B[@]:2}") # with the summary
  expect 0 "build without mpirun, 1 thread" -- "$TKS" "${B[@]}" --threads 1 --output ref
  n=$(ls ref/shard-*.tks | wc -l)
  units=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["provenance"]["options"]["unit_rule"])' ref/manifest.json 2>/dev/null)
  [[ $n -ge 20 && $units == listing-cuts/1 ]] && ok "reference has $n shards, unit rule $units in the provenance" ||
    fail "reference: $n shards, unit rule '$units'"
  grep -q '"pieces"' ref/manifest.json && ok "the cut files' pieces are hashed in the provenance" || fail "no pieces"
;;&
build)
  expect 0 "build without mpirun, 2 threads" -- "$TKS" "${V[@]}" --threads 2 --output t2
  diff -r ref t2 >/dev/null && ok "2 threads: byte-identical" || fail "2 threads differ"
  # the summary's encoder statistics count every word once, whoever encoded it
  words=$(grep -Eo "word cache hits [0-9.]+% of [0-9]+ words" "$W/out" | grep -Eo "of [0-9]+ words")
  [[ -n $words ]] && ok "2 threads: the encoder's summary counts $words" ||
    fail "no word count in the summary: $(grep encoder "$W/out")"
  for np in 1 2 3 5; do
    t=$((np % 2 + 1))
    expect 0 "mpirun -np $np, $t thread(s)" -- "${MPI[@]}" -np $np "$TKS" "${V[@]}" --threads $t \
      --output np$np
    if diff -r ref np$np >/dev/null; then ok "np $np, $t thread(s): byte-identical"
    else fail "np $np, $t thread(s): differs: $(diff -rq ref np$np | head -3)"; fi
    got=$(grep -Eo "word cache hits [0-9.]+% of [0-9]+ words" "$W/out" | grep -Eo "of [0-9]+ words")
    [[ -n $words && $got == "$words" ]] && ok "np $np: the summary counts the words of every rank ($got)" ||
      fail "np $np: the summary's encoder counts '$got', the single process '$words'"
    [[ $np -eq 1 ]] && continue # one process: no MPI, no hand-out
    grep -Eq "hand-outs of [0-9]+ us" "$W/out" && ok "np $np: the summary gives the hand-out cost" ||
      fail "np $np summary: $(grep coordination "$W/out")"
  done
  # kill -9 of rank 1 at its 2nd shard: the job ends, naming rank 1
  expect 137 "rank 1 killed" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:2 -x TKS_FAULT_RANK=1 "$TKS" "${B[@]}" --threads 1 --output k
  expect_msg "process rank 1 .*signal 9"
  # the launcher may drop what the ranks print while it stops the job:
  # OUT.partial/in-flight keeps which unit each rank was building
  if grep -Eq "^unit [0-9]+ on rank 1$" k.partial/in-flight/rank-00001; then ok "k.partial/in-flight names rank 1's unit"
  else fail "in-flight: $(cat k.partial/in-flight/* 2>&1)"; fi
  [[ -d k.partial && ! -e k ]] && ok "k.partial kept, k not published" || fail "k.partial/k state wrong"
  expect 0 "resume with 2 ranks" -- "${MPI[@]}" -np 2 "$TKS" "${B[@]}" --threads 2 --output k --resume
  expect_msg "resuming; when the interrupted run stopped: units in flight: .*unit [0-9]+ on rank 1,"
  diff -r ref k >/dev/null && ok "resumed: byte-identical" || fail "resumed differs: $(diff -rq ref k | head -3)"
  # killed again, resumed without mpirun
  expect 137 "rank 2 killed" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:3 -x TKS_FAULT_RANK=2 "$TKS" "${B[@]}" --threads 1 --output k2
  # a kept unit whose shard was damaged since is built again, not kept
  for u in $(seq -f %05g 0 99); do [[ -e k2.partial/unit-$u/unit.json ]] && break; done
  if [[ -e k2.partial/unit-$u/shard-00000.tks ]]; then flip 100 "k2.partial/unit-$u/shard-00000.tks"
  else fail "no complete unit with a shard in k2.partial"; fi
  kept=$(ls k2.partial/unit-*/unit.json | wc -l)
  expect 0 "resume without mpirun" -- "$TKS" "${V[@]}" --threads 1 --output k2 --resume
  grep -Eq "units +[0-9]+ \($((kept - 1)) kept" "$W/out" && ok "$((kept - 1)) of $kept complete units kept, the damaged one built again" ||
    fail "kept units: $(grep units "$W/out") (of $kept complete)"
  diff -r ref k2 >/dev/null && ok "resumed without mpirun: byte-identical" || fail "resumed k2 differs"
  # a rank whose unit fails (its directory is a file): the rank names itself and the unit, the job ends
  expect 137 "rank 1 killed (k3)" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:2 -x TKS_FAULT_RANK=1 "$TKS" "${B[@]}" --threads 1 --output k3
  for u in $(seq -f %05g 0 99); do [[ -e k3.partial/unit-$u/unit.json ]] || break; done
  rm -rf "k3.partial/unit-$u" && echo "not a directory" >"k3.partial/unit-$u"
  expect 2 "a unit that cannot be written" -- timeout 60 "${MPI[@]}" -np 2 "$TKS" "${B[@]}" \
    --threads 1 --output k3 --resume
  expect_msg "rank [01] failed on unit $((10#$u)): .*unit-$u"
  [[ ! -e k3 ]] && ok "k3 not published" || fail "k3 published after a failed unit"
  rm -f "k3.partial/unit-$u"
  expect 0 "resume after the fix, 5 ranks" -- "${MPI[@]}" -np 5 "$TKS" "${B[@]}" --threads 1 --output k3 --resume
  diff -r ref k3 >/dev/null && ok "k3: byte-identical" || fail "k3 differs"
  # a file named as compressed whose bytes are text: each rank checks its
  # share of such files; the job stops before anything is written, or,
  # under --on-bad-input skip, leaves it out as one process does
  mkdir -p bad && cp -r in/docs bad/ && printf 'plain text\n' >bad/docs/z-fake.txt.gz
  expect 2 "a .gz that is text, 3 ranks" -- "${MPI[@]}" -np 3 "$TKS" build -q --tokenizer "$T/bpe.model" \
    --unit-bytes 300K --output f bad
  expect_msg "z-fake.txt.gz is named .gz \(gzip\) but starts with text"
  [[ ! -e f && ! -e f.partial ]] && ok "nothing written" || fail "f or f.partial written"
  S=(build -q --tokenizer "$T/bpe.model" --unit-bytes 300K --on-bad-input skip bad)
  expect 0 "skipped without mpirun" -- "$TKS" "${S[@]}" --output s0
  expect 0 "skipped by 3 ranks" -- "${MPI[@]}" -np 3 "$TKS" "${S[@]}" --output s3
  diff -r s0 s3 >/dev/null && grep -q "z-fake.txt.gz: named .gz" s3/manifest.json && ok "skipped: byte-identical, listed" ||
    fail "skip under mpirun: $(diff -rq s0 s3 | head -3)"
  ;;
modes)
  # without mpirun, killed once 3 units are complete, resumed under mpirun -np 3
  expect 137 "killed after 3 units" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_KILL=rename:unit.json:3 \
    "$TKS" "${B[@]}" --threads 1 --output m1
  expect 0 "m1 resumed under mpirun -np 3" -- "${MPI[@]}" -np 3 "$TKS" "${V[@]}" --threads 1 --output m1 --resume
  grep -Eq "units +[0-9]+ \(3 kept" "$W/out" && ok "m1: the 3 complete units kept" || fail "m1: $(grep units "$W/out")"
  diff -r ref m1 >/dev/null && ok "m1: byte-identical" || fail "m1 differs: $(diff -rq ref m1 | head -3)"
  # killed in the middle of a unit (its 5th shard), resumed with -np 2
  expect 137 "killed at the 5th shard" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_KILL=shards:5 \
    "$TKS" "${B[@]}" --threads 1 --output m2
  expect 0 "m2 resumed under mpirun -np 2" -- "${MPI[@]}" -np 2 "$TKS" "${B[@]}" --threads 1 --output m2 --resume
  diff -r ref m2 >/dev/null && ok "m2: byte-identical" || fail "m2 differs: $(diff -rq ref m2 | head -3)"
  # killed while the shards get their global index (3 of them placed: headers
  # rewritten and renamed), resumed with -np 3, then again without mpirun
  expect 137 "killed after 3 shards placed" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_KILL=shards:$((n + 3)) \
    "$TKS" "${B[@]}" --threads 1 --output m3
  [[ $(ls m3.partial/shard-*.tks 2>/dev/null | wc -l) -eq 3 ]] && ok "m3: 3 shards placed when killed" ||
    fail "m3: $(ls m3.partial | head)"
  expect 0 "m3 resumed under mpirun -np 3" -- "${MPI[@]}" -np 3 "$TKS" "${B[@]}" --threads 1 --output m3 --resume
  diff -r ref m3 >/dev/null && ok "m3: byte-identical" || fail "m3 differs: $(diff -rq ref m3 | head -3)"
  # more ranks than units, 64 processes on 2 cores
  expect 0 "mpirun -np 64" -- timeout 300 "${MPI[@]}" -np 64 "$TKS" "${B[@]}" --threads 1 --output np64
  diff -r ref np64 >/dev/null && ok "np 64: byte-identical" || fail "np 64 differs: $(diff -rq ref np64 | head -3)"
  ;;
*) echo "unknown case $CASE"; exit 2 ;;
esac
finish test_dist
