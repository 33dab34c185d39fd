#!/usr/bin/env bash
# bench_scale.sh - tokshard build by work units: 1 MPI rank against 2 ranks of
# 1 thread each, on the same text as bench/bench_encode.sh (GCIDE + the Python
# docs, one document per line), the same tokenizer (BPE, nmt_nfkc, vocab 8000,
# trained here by tokshard train-tokenizer), in the same run.
#
# Runs, each --runs times (median wall time reported):
#   plain    tokshard build --threads 1, no mpirun (the single-process command)
#   np1      mpirun -np 1 tokshard build --threads 1
#   np2      mpirun -np 2 tokshard build --threads 1 (both ranks take units from
#            the listing's plan at once)
# all with --unit-bytes (default: the file / 8, so 8 units; the text is at most
# --mb MB, about 51 MB when all of GCIDE and the Python docs fit). Every dataset is
# compared, file by file, with the first plain one ("identical: yes/no").
# Not a test: nothing is asserted. Prints a table (MB/s of text, ratio to
# plain) and the 1-minute load before each run: the machine may be shared,
# compare ratios within one run only.
# Time on 2 idle cores with the defaults: about 4 minutes (the first run also
# makes the corpus and trains the tokenizer: 1-2 minutes more).
#
# usage: bench/bench_scale.sh [--mb N (64)] [--runs N (3)] [--unit-mb N (text/8)]
#                             [--work DIR] [--bin TOKSHARD]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
MB=64
RUNS=3
UNIT_MB=
WORK=/var/tmp/tokshard-bench-scale
BIN="$ROOT/build/bin/tokshard"
while [[ $# -gt 0 ]]; do
  case $1 in
  --mb) MB=$2; shift 2 ;;
  --runs) RUNS=$2; shift 2 ;;
  --unit-mb) UNIT_MB=$2; shift 2 ;;
  --work) WORK=$2; shift 2 ;;
  --bin) BIN=$2; shift 2 ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
need_tokshard "$BIN"
need_mpirun bench_scale.sh
mpi_env
mkdir -p "$WORK"
cd "$WORK"

text=corpus-$MB.txt
make_corpus "$MB" "$text"
if [[ ! -s nfkc.model ]]; then
  head -c 20000000 "$text" | sed '$d' >train.txt
  "$BIN" train-tokenizer --output nfkc --vocab-size 8000 --doc-split line train.txt >/dev/null
fi
bytes=$(stat -c %s "$text")
if [[ -n $UNIT_MB ]]; then unit_bytes=$(awk -v m="$UNIT_MB" 'BEGIN { printf "%d", m * 1000000 }')
else unit_bytes=$(((bytes + 7) / 8)); fi
B=(build -q --threads 1 --tokenizer nfkc.model --doc-split line --unit-bytes "$unit_bytes" "$text")

echo "bench_scale: $(nproc) cores, $(awk '{print $1}' /proc/loadavg) load, text $bytes bytes, unit $unit_bytes bytes, $RUNS runs"
printf '%-8s %4s %9s %9s %7s %10s %s\n' run n wall_s MB/s ratio load1 identical
declare -A med
rm -rf ref
for cfg in plain np1 np2; do
  walls=()
  loads=()
  same=yes
  for r in $(seq 1 "$RUNS"); do
    rm -rf out
    loads+=("$(awk '{print $1}' /proc/loadavg)")
    t0=$(date +%s.%N)
    case $cfg in
    plain) "$BIN" "${B[@]}" --output out ;;
    np1) mpirun --oversubscribe -np 1 "$BIN" "${B[@]}" --output out ;;
    np2) mpirun --oversubscribe -np 2 "$BIN" "${B[@]}" --output out ;;
    esac
    t1=$(date +%s.%N)
    walls+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
    if [[ ! -d ref ]]; then mv out ref; elif ! diff -r ref out >/dev/null; then same=no; fi
  done
  m=$(printf '%s\n' "${walls[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  med[$cfg]=$m
  ratio=$(awk -v p="${med[plain]}" -v x="$m" 'BEGIN { printf "%.2f", p / x }')
  printf '%-8s %4s %9s %9.2f %7s %10s %s\n' "$cfg" "$RUNS" "$m" "$(awk -v b="$bytes" -v w="$m" 'BEGIN { print b / 1e6 / w }')" \
    "$ratio" "$(IFS=,; echo "${loads[*]}")" "$same"
done
n_units=$(awk -v b="$bytes" -v u="$unit_bytes" 'BEGIN { printf "%d", (b + u - 1) / u }')
echo "np2 / np1: $(awk -v a="${med[np1]}" -v b="${med[np2]}" 'BEGIN { printf "%.2fx", a / b }') (about $n_units units; rank 0 plans them ahead of the ranks, then builds units too)"
rm -rf ref out
