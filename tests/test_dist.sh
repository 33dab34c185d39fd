#!/usr/bin/env bash
# Multi-process tokshard commands under mpirun (--oversubscribe: 2 cores).
# Usage: test_dist.sh BIN_DIR WORKDIR CASE   (needs the build_setup fixture)
#   CASE audit: `mpirun -np N tokshard audit` (N = 1, 2, 3, 7) reports exactly
#   what the single-process audit reports, with the same exit code, on a clean
#   dataset and on one corrupted in many ways at once (token bytes, an index, a
#   truncated shard, a stray shard, ids over --model-vocab, another tokenizer),
#   with a small --max-problems, and on a lone shard file.
#   CASE build: `tokshard build` split into work units by a small --unit-bytes
#   gives byte-identical datasets (every file) without mpirun and under
#   `mpirun -np 1, 2, 3`, with 1 and 2 threads; a rank killed (SIGKILL) at its
#   2nd shard ends the job with a message naming the rank and its unit, and
#   --resume with another rank count (and then without mpirun) completes it
#   to the same bytes (a kept unit whose shard was damaged since is built
#   again); a unit that cannot be written ends the job with rank 0
#   naming the rank and the unit, and the resume after the fix completes.
#   CASE plain: a build started without mpirun and killed at several points
#   (and one stopped by SIGINT) is resumed under `mpirun -np 2, 3` to the same bytes, keeping the units its
#   shards provably hold; that resume killed while it moves the shards into
#   units is resumed again, with or without mpirun, to the same bytes; a unit
#   with a shard damaged since is built again; a document empty after
#   tokenizing does not stop units from being kept (the state records where
#   each shard ends), except from a state without those end ordinals, whose
#   units are then all built again.
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
build)
  # gcide (blank-line paragraphs) and 40 Python doc files: about 7 units
  B=(build -q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
     --chunk-bytes 4K --unit-bytes 700K "$T/gcide.txt" "$T/pydoc")
  expect 0 "build without mpirun, 1 thread" -- "$TKS" "${B[@]}" --threads 1 --output ref
  n=$(ls ref/shard-*.tks | wc -l)
  [[ $n -ge 10 ]] && ok "reference has $n shards" || fail "reference has only $n shards"
  expect 0 "build without mpirun, 2 threads" -- "$TKS" "${B[@]}" --threads 2 --output t2
  diff -r ref t2 >/dev/null && ok "2 threads: byte-identical" || fail "2 threads differ"
  for np in 1 2 3; do
    for t in 1 2; do
      expect 0 "mpirun -np $np, $t thread(s)" -- "${MPI[@]}" -np $np "$TKS" "${B[@]}" --threads $t \
        --output np$np-t$t
      if diff -r ref np$np-t$t >/dev/null; then ok "np $np, $t thread(s): byte-identical"
      else fail "np $np, $t thread(s): differs: $(diff -rq ref np$np-t$t | head -3)"; fi
    done
  done
  # the default unit size: one unit, the plain build
  expect 0 "one unit under mpirun -np 2" -- "${MPI[@]}" -np 2 "$TKS" "${B[@]:0:11}" \
    "$T/gcide.txt" "$T/pydoc" --output one2
  expect 0 "one unit without mpirun" -- "$TKS" "${B[@]:0:11}" "$T/gcide.txt" "$T/pydoc" --output one0
  diff -r one0 one2 >/dev/null && ok "default unit size: np 2 = no mpirun" || fail "default unit size differs"
  # kill -9 of rank 1 at its 2nd shard: the job ends, naming rank 1 and its unit
  expect 137 "rank 1 killed" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:2 -x TKS_FAULT_RANK=1 "$TKS" "${B[@]}" --threads 1 --output k
  expect_msg "process rank 1 .*signal 9"
  # rank 0 prints which rank builds which unit when the launcher stops the job,
  # but the launcher may drop that output: the same lines are in k.partial
  inflight="units in flight: (unit [0-9]+ on rank [02], )*unit [0-9]+ on rank 1,"
  if grep -Eq "$inflight" k.partial/in-flight.txt; then ok "k.partial/in-flight.txt names rank 1's unit"
  else fail "in-flight.txt: $(cat k.partial/in-flight.txt)"; fi
  [[ -d k.partial && ! -e k ]] && ok "k.partial kept, k not published" || fail "k.partial/k state wrong"
  expect 0 "resume with 2 ranks" -- "${MPI[@]}" -np 2 "$TKS" "${B[@]}" --threads 2 --output k --resume
  expect_msg "resuming; when the interrupted run stopped: $inflight"
  diff -r ref k >/dev/null && ok "resumed: byte-identical" || fail "resumed differs: $(diff -rq ref k | head -3)"
  # killed again, resumed without mpirun
  expect 137 "rank 2 killed" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:1 -x TKS_FAULT_RANK=2 "$TKS" "${B[@]}" --threads 1 --output k2
  # a kept unit whose shard was damaged since is built again, not kept
  for u in $(seq -f %05g 0 99); do [[ -e k2.partial/unit-$u/unit.json ]] && break; done
  if [[ -e k2.partial/unit-$u/shard-00000.tks ]]; then flip 100 "k2.partial/unit-$u/shard-00000.tks"
  else fail "no complete unit with a shard in k2.partial"; fi
  expect 0 "resume without mpirun" -- "$TKS" "${B[@]}" --threads 1 --output k2 --resume
  diff -r ref k2 >/dev/null && ok "resumed without mpirun: byte-identical" || fail "resumed k2 differs"
  # a rank whose unit fails (its directory is a file): rank 0 names rank and unit, the job ends
  expect 137 "rank 1 killed (k3)" -- timeout 60 "${MPI[@]}" -np 3 -x LD_PRELOAD="$TKS_FAULT_LIB" \
    -x TKS_FAULT_KILL=shards:2 -x TKS_FAULT_RANK=1 "$TKS" "${B[@]}" --threads 1 --output k3
  for u in $(seq -f %05g 0 99); do [[ -e k3.partial/unit-$u/unit.json ]] || break; done
  rm -rf "k3.partial/unit-$u" && echo "not a directory" >"k3.partial/unit-$u"
  expect 2 "a unit that cannot be written" -- timeout 60 "${MPI[@]}" -np 2 "$TKS" "${B[@]}" \
    --threads 1 --output k3 --resume
  expect_msg "rank [01] failed on unit $((10#$u)): .*unit-$u"
  [[ ! -e k3 ]] && ok "k3 not published" || fail "k3 published after a failed unit"
  rm -f "k3.partial/unit-$u"
  expect 0 "resume after the fix, 3 ranks" -- "${MPI[@]}" -np 3 "$TKS" "${B[@]}" --threads 1 --output k3 --resume
  diff -r ref k3 >/dev/null && ok "k3: byte-identical" || fail "k3 differs"
  ;;
plain)
  # a build started without mpirun and interrupted, resumed under mpirun
  B=(build -q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
     --chunk-bytes 4K --unit-bytes 700K "$T/gcide.txt" "$T/pydoc")
  expect 0 "reference without mpirun" -- "$TKS" "${B[@]}" --threads 1 --output ref
  kept_msg="resuming a build started without mpirun: ([0-9]+) of [0-9]+ units kept \(([0-9]+) of its ([0-9]+) shard"
  # killed KILLPOINT OUT: the plain build of OUT killed at KILLPOINT, its state a plain one
  killed() {
    expect 137 "plain build killed at $1" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_KILL="$1" \
      "$TKS" "${B[@]}" --threads 1 --output "$2"
    grep -q '"next_ordinal"' "$2.partial/build-state.json" && ok "$2.partial holds a plain state" ||
      fail "$2.partial: no plain state"
  }
  # a shard recorded, a shard published but not recorded, a state being written, one unit's shards
  for run in state:1:2 shard:5:3 fsync:12:2 state:8:3; do
    pt=${run%:*} np=${run##*:} out=p${run//:/-}
    killed "$pt" "$out"
    expect 0 "$out: resumed under mpirun -np $np" -- "${MPI[@]}" -np "$np" "$TKS" "${B[@]}" \
      --threads 1 --output "$out" --resume
    expect_msg "$kept_msg"
    diff -r ref "$out" >/dev/null && ok "$out: byte-identical" || fail "$out differs: $(diff -rq ref "$out" | head -3)"
  done
  [[ $(grep -Eo "$kept_msg" "$W/err" | sed -E "s/.*: ([0-9]+) of .*/\1/") -ge 2 ]] &&
    ok "state:8: two units or more kept" || fail "state:8: $(cat "$W/err")"
  # Ctrl-C (SIGINT) at an arbitrary moment, small batches so that it stops soon
  "$TKS" "${B[@]}" --threads 1 --batch-bytes 64K --output i >/dev/null 2>&1 &
  pid=$!
  sleep 0.3
  kill -s INT $pid 2>/dev/null
  wait $pid
  code=$?
  if [[ -e i ]]; then
    ok "SIGINT came after the build finished; nothing to resume"
  else
    [[ $code -eq 130 ]] && ok "SIGINT: exit 130" || fail "SIGINT: exit $code, expected 130"
    expect 0 "resumed after SIGINT under mpirun -np 3" -- "${MPI[@]}" -np 3 "$TKS" "${B[@]}" \
      --threads 1 --output i --resume
  fi
  diff -r ref i >/dev/null && ok "i: byte-identical" || fail "i differs: $(diff -rq ref i | head -3)"
  # the resume under mpirun killed while it moves the plain shards into units
  # (a shard moved, a unit's record written, the plain state set aside), then
  # resumed under mpirun or without it
  for run in shards:2:3 rename:unit.json:1:0 rename:build-state.json:1:2 shards:4:0; do
    pt=${run%:*} np=${run##*:} out=c${run//[:.]/-}
    killed state:8 "$out"
    expect 137 "$out: resume under mpirun killed at $pt" -- timeout 60 "${MPI[@]}" -np 2 \
      -x LD_PRELOAD="$TKS_FAULT_LIB" -x TKS_FAULT_KILL="$pt" -x TKS_FAULT_RANK=0 "$TKS" "${B[@]}" \
      --threads 1 --output "$out" --resume
    if [[ $np -eq 0 ]]; then
      expect 0 "$out: resumed again without mpirun" -- "$TKS" "${B[@]}" --threads 1 --output "$out" --resume
    else
      expect 0 "$out: resumed again with -np $np" -- "${MPI[@]}" -np "$np" "$TKS" "${B[@]}" \
        --threads 1 --output "$out" --resume
    fi
    diff -r ref "$out" >/dev/null && ok "$out: byte-identical" || fail "$out differs: $(diff -rq ref "$out" | head -3)"
  done
  # set aside, then resumed without mpirun as a plain build
  killed state:8 s
  expect 137 "resume under mpirun killed once the plain state is set aside" -- timeout 60 \
    "${MPI[@]}" -np 2 -x LD_PRELOAD="$TKS_FAULT_LIB" -x TKS_FAULT_KILL=rename:plain-state.json:1 \
    -x TKS_FAULT_RANK=0 "$TKS" "${B[@]}" --threads 1 --output s --resume
  expect 0 "s: resumed without mpirun" -- "$TKS" "${B[@]}" --threads 1 --output s --resume
  diff -r ref s >/dev/null && ok "s: byte-identical" || fail "s differs: $(diff -rq ref s | head -3)"
  # a plain shard damaged since: its unit cannot be proven and is built again
  killed state:8 d0
  cp -r d0.partial d.partial
  expect 0 "undamaged, resumed with -np 2" -- "${MPI[@]}" -np 2 "$TKS" "${B[@]}" --threads 1 --output d0 --resume
  k0=$(grep -Eo "$kept_msg" "$W/err" | sed -E "s/.*: ([0-9]+) of .*/\1/")
  flip 100 d.partial/shard-00000.tks
  expect 0 "damaged shard, resumed with -np 3" -- "${MPI[@]}" -np 3 "$TKS" "${B[@]}" --threads 1 --output d --resume
  expect_msg "$kept_msg"
  k1=$(grep -Eo "$kept_msg" "$W/err" | sed -E "s/.*: ([0-9]+) of .*/\1/")
  [[ -n $k0 && -n $k1 && $k1 -eq $((k0 - 1)) ]] && ok "the damaged shard's unit is built again ($k1 of $k0 kept)" ||
    fail "kept $k1 units with a damaged shard, $k0 without"
  for o in d0 d; do
    diff -r ref $o >/dev/null && ok "$o: byte-identical" || fail "$o differs: $(diff -rq ref $o | head -3)"
  done
  # a document empty after tokenizing (a zero-width space) is in no shard:
  # the shards' end ordinals in the state still place them exactly (the unit
  # holding it is kept, its record counting the empty document); a state
  # without them (written before they were recorded) proves no unit, and
  # none is kept
  printf 'A first paragraph of plain text.\n\n\u200b\n\nAnd a last one.\n' >zw.txt
  E=(build -q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
     --chunk-bytes 4K --unit-bytes 700K zw.txt "$T/gcide.txt" "$T/pydoc")
  expect 0 "reference with an empty document" -- "$TKS" "${E[@]}" --threads 1 --output eref
  grep -Eq '"empty_after_tokenize": ?1\b' eref/manifest.json && ok "one document empty after tokenizing" ||
    fail "eref: $(grep -Eo '"empty_after_tokenize": ?[0-9]*' eref/manifest.json)"
  expect 137 "plain build with an empty document killed" -- env LD_PRELOAD="$TKS_FAULT_LIB" \
    TKS_FAULT_KILL=state:5 "$TKS" "${E[@]}" --threads 1 --output e
  cp -r e.partial o.partial
  expect 0 "resumed under mpirun -np 3" -- "${MPI[@]}" -np 3 "$TKS" "${E[@]}" --threads 1 --output e --resume
  expect_msg "$kept_msg"
  ke=$(grep -Eo "$kept_msg" "$W/err" | sed -E "s/.*: ([0-9]+) of .*/\1/")
  [[ -n $ke && $ke -ge 1 ]] && ok "units kept despite the empty document ($ke)" || fail "e: $(cat "$W/err")"
  diff -r eref e >/dev/null && ok "e: byte-identical" || fail "e differs: $(diff -rq eref e | head -3)"
  python3 - o.partial/build-state.json <<'PY'
import json, sys
p = sys.argv[1]
j = json.load(open(p))
for s in j["shards"]:
    del s["end_ordinal"]
json.dump(j, open(p, "w"), indent=1)
PY
  n=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["shards"]))' o.partial/build-state.json)
  expect 0 "a state without end ordinals, resumed under mpirun -np 2" -- "${MPI[@]}" -np 2 "$TKS" \
    "${E[@]}" --threads 1 --output o --resume
  expect_msg "none of its $n shard\(s\) kept, since it found 1 document\(s\) empty after tokenizing"
  diff -r eref o >/dev/null && ok "o: byte-identical" || fail "o differs: $(diff -rq eref o | head -3)"
  ;;
*) echo "unknown case $CASE"; exit 2 ;;
esac
finish test_dist
