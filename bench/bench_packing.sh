#!/usr/bin/env bash
# bench_packing.sh - concat against best-fit packing in training, on the main
# job's data (samples/main.sh: the dictionary and the Python docs as a
# 0.6 / 0.4 mixture, --doc-mask), and both checkpoints evaluated on the SAME
# validation windows (tokshard-train --eval-only):
#
#   1. one training run per packing, the main job's settings (2.8 M
#      parameters, seq_len 128, global batch 16, --steps, one thread by
#      default); the mean training loss of the last 10 steps and the
#      training's own final validation loss (each run on its own packing's
#      windows);
#   2. each final checkpoint evaluated under concat and best-fit windows,
#      with and without --doc-mask, on the windows a training evaluation
#      reads (--eval-batches 4: the first 64 of each source) and on every
#      window of the validation split (--eval-batches 1000).
#
# A benchmark, not a test: nothing is asserted. Prints its figures; give
# them to docs/BENCHMARKS.md with the machine's conditions and the commit.
#
# usage: bench/bench_packing.sh [--build DIR] [--main DIR] [--steps N] [--threads N] [--work DIR] [--reuse]
#   --build DIR   a build with bin/tokshard-train [build]
#   --main DIR    samples/main.sh's output (gcide/, python/) [runs/main]
#   --steps N     training steps of each run (main.sh: 150) [150]
#   --threads N   CPU threads per run [1]
#   --work DIR    scratch [/var/tmp/tokshard-packing-bench]
#   --reuse       keep the runs of an earlier call with the same --steps (evaluate again only)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
build=$root/build main=$root/runs/main steps=150 threads=1 work=/var/tmp/tokshard-packing-bench reuse=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --build) build=$2; shift 2 ;;
  --main) main=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --threads) threads=$2; shift 2 ;;
  --work) work=$2; shift 2 ;;
  --reuse) reuse=1; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
train=$build/bin/tokshard-train
[[ -x $train ]] || { echo "no $train: build first" >&2; exit 2; }
[[ -d $main/gcide && -d $main/python ]] || { echo "no $main/gcide, $main/python: run samples/main.sh" >&2; exit 2; }
X=(--dataset gcide="$main/gcide":0.6 --dataset python="$main/python":0.4)
MODEL=(--dim 128 --n-layers 4 --n-heads 4 --n-kv-heads 2 --seq-len 128 --global-batch 16 --warmup 15
  --lr 3e-3 --min-lr 3e-4 --threads "$threads")
echo "$(machine_line "$root"); $steps steps"
mkdir -p "$work"
for pk in concat best-fit; do
  if [[ $reuse -eq 1 && -d $work/$pk/checkpoints/step-$(printf %08d "$steps") ]]; then
    echo "trained $pk: kept from an earlier run ($work/$pk)"
    continue
  fi
  rm -rf "$work/$pk"
  start=$(date +%s)
  "$train" "${X[@]}" --doc-mask --packing "$pk" --out "$work/$pk" "${MODEL[@]}" --steps "$steps" \
    --eval-every 25 --save-every 0 --quiet --no-plot >/dev/null
  python3 - "$work/$pk/metrics.jsonl" "$pk" "$(($(date +%s) - start))" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
tr = [l["loss"] for l in lines if "loss" in l][-10:]
v = [l for l in lines if "val_loss" in l][-1]
by = ", ".join(f"{k} {x:.3f}" for k, x in v["val_loss_by_source"].items())
print(f"trained {sys.argv[2]}: {sys.argv[3]} s; train loss, mean of the last 10 steps {sum(tr) / len(tr):.3f}; "
      f"its own validation at step {v['step']}: {v['val_loss']:.3f} ({by})")
EOF
done
echo "checkpoint   | windows  | --doc-mask | batches | mean  | gcide (windows, targets) | python (windows, targets)"
for pk in concat best-fit; do
  ck=$(ls -d "$work/$pk"/checkpoints/step-* | tail -1)
  for win in concat best-fit; do
    for dm in on off; do
      flag=()
      [[ $dm == on ]] && flag=(--doc-mask)
      for eb in 4 1000; do
        "$train" "${X[@]}" --eval-only --resume "$ck" --packing "$win" "${flag[@]}" --eval-batches "$eb" \
          --threads "$threads" | grep '^{' | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
a = sys.argv[1:]
by, w, t = j["val_loss_by_source"], j["windows"], j["targets"]
src = ["%.3f (%d, %d)" % (by[k], w[k], t[k]) for k in ("gcide", "python")]
print("%-12s | %-8s | %-10s | %-7s | %.3f | %-24s | %s" % (a[0], a[1], a[2], a[3], j["val_loss"], src[0], src[1]))
' "$pk" "$win" "$dm" "$eb"
      done
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
