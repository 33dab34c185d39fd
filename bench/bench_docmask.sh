#!/usr/bin/env bash
# bench_docmask.sh - what --doc-mask costs and changes on the main job's data
# (samples/main.sh: the dictionary and the Python docs as a 0.6 / 0.4 mixture,
# documents of about 40-45 tokens).
#
#   1. CPU attention time, forward + backward, causal and block-causal
#      (tokshard-bench-attn: the CPU backend's ops on the documents of the
#      mixture's first training windows, the two masks alternating, the
#      fastest of --reps each), at the main job's shape (T 128, B 16, 4 heads,
#      2 kv heads, head dim 32) and at T 512 and 1024 with the same tokens per
#      step; with the share of (query, key) pairs the mask keeps.
#   2. With --full: the main job's training both ways (150 steps, as main.sh),
#      wall time and the final validation loss per source and weighted mean.
#
# A benchmark, not a test: nothing about time is asserted. Prints its figures;
# give them to docs/BENCHMARKS.md with the machine's conditions and the commit.
#
# usage: bench/bench_docmask.sh [--build DIR] [--main DIR] [--reps N] [--threads N] [--full]
#   --build DIR   a build with bin/tokshard-bench-attn and bin/tokshard-train [build]
#   --main DIR    samples/main.sh's output (gcide/, python/) [runs/main]
#   --reps N      repetitions of each mask (the fastest is kept) [20]
#   --threads N   CPU threads [nproc]
#   --work DIR    scratch for --full [/var/tmp/tokshard-docmask-bench]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
build=$root/build main=$root/runs/main reps=20 full=0 threads=$(nproc)
work=/var/tmp/tokshard-docmask-bench
while [[ $# -gt 0 ]]; do
  case $1 in
  --build) build=$2; shift 2 ;;
  --main) main=$2; shift 2 ;;
  --reps) reps=$2; shift 2 ;;
  --threads) threads=$2; shift 2 ;;
  --work) work=$2; shift 2 ;;
  --full) full=1; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $build/bin/tokshard-bench-attn ]] || { echo "no $build/bin/tokshard-bench-attn: build first" >&2; exit 2; }
[[ -d $main/gcide && -d $main/python ]] || { echo "no $main/gcide, $main/python: run samples/main.sh" >&2; exit 2; }
X=(gcide="$main/gcide":0.6 python="$main/python":0.4)
machine_line "$root"
for TB in "128 16 2" "512 4 4" "1024 2 4"; do
  read -r T B steps <<<"$TB"
  "$build/bin/tokshard-bench-attn" --threads "$threads" --reps "$reps" --seq-len "$T" --batch "$B" \
    --steps "$steps" "${X[@]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ $full -eq 1 ]]; then
  mkdir -p "$work"
  for mode in mask nomask; do
    flag=()
    [[ $mode == mask ]] && flag=(--doc-mask)
    rm -rf "$work/full-$mode"
    start=$(date +%s)
    "$build/bin/tokshard-train" --dataset "${X[0]}" --dataset "${X[1]}" "${flag[@]}" --out "$work/full-$mode" \
      --dim 128 --n-layers 4 --n-heads 4 --n-kv-heads 2 --seq-len 128 --global-batch 16 --steps 150 \
      --warmup 15 --lr 3e-3 --min-lr 3e-4 --eval-every 25 --save-every 50 --threads "$threads" \
      --quiet --no-plot >/dev/null
    echo "main job, $mode: $(($(date +%s) - start)) s (load $(cut -d' ' -f1 /proc/loadavg));" \
      "final $(grep val_loss "$work/full-$mode/metrics.jsonl" | tail -1)"
  done
fi
