#!/usr/bin/env bash
# Multi-process tokshard commands under mpirun (--oversubscribe: 2 cores).
# Usage: test_dist.sh BIN_DIR WORKDIR CASE   (needs the build_setup fixture)
#   CASE audit: `mpirun -np N tokshard audit` (N = 1, 2, 3, 7) reports exactly
#   what the single-process audit reports, with the same exit code, on a clean
#   dataset and on one corrupted in many ways at once (token bytes, an index, a
#   truncated shard, a stray shard, ids over --model-vocab, another tokenizer),
#   with a small --max-problems, and on a lone shard file.
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
*) echo "unknown case $CASE"; exit 2 ;;
esac
finish test_dist
