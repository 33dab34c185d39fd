#!/usr/bin/env bash
# bench_docmask.sh - what --doc-mask costs and changes on the main job's data
# (samples/main.sh: the dictionary and the Python docs as a 0.6 / 0.4 mixture,
# documents of about 40-45 tokens in windows of 128).
#
#   1. CPU attention time: tokshard-train --profile over the main job's model
#      and batches, with and without --doc-mask, alternating the two ROUNDS
#      times (so both see the same machine load); the median per round of
#      attention_fwd + attention_bwd ms per step, and of the whole step.
#   2. The fraction of (query, key) pairs the block-causal mask keeps, over the
#      windows those steps read (from the shards' document index, with the
#      Python package: what the attention has left to compute).
#   3. With --full: the main job's training both ways (150 steps, as main.sh),
#      its validation loss per source and weighted mean at the end.
#
# A benchmark, not a test: nothing about time is asserted. Prints its figures;
# give them to docs/BENCHMARKS.md with the machine's conditions and the commit.
#
# The pair count needs numpy: the project venv's python, or $PYTHON.
#
# usage: bench/bench_docmask.sh [--build DIR] [--main DIR] [--rounds N] [--steps N] [--full]
#   --build DIR   a build with bin/tokshard-train [build]
#   --main DIR    samples/main.sh's output [runs/main]
#   --rounds N    alternations of the two profiled runs [3]
#   --steps N     profiled steps per run [6]
#   --threads N   CPU threads [nproc]
#   --work DIR    scratch [/var/tmp/tokshard-docmask-bench]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build main=$root/runs/main rounds=3 steps=6 full=0 threads=$(nproc)
work=/var/tmp/tokshard-docmask-bench
while [[ $# -gt 0 ]]; do
  case $1 in
  --build) build=$2; shift 2 ;;
  --main) main=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --threads) threads=$2; shift 2 ;;
  --work) work=$2; shift 2 ;;
  --full) full=1; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
TRAIN=$build/bin/tokshard-train
[[ -x $TRAIN ]] || { echo "no $TRAIN: build first" >&2; exit 2; }
[[ -d $main/gcide && -d $main/python ]] || { echo "no $main/gcide, $main/python: run samples/main.sh" >&2; exit 2; }
mkdir -p "$work"
X=(--dataset gcide="$main/gcide":0.6 --dataset python="$main/python":0.4)
MODEL=(--dim 128 --n-layers 4 --n-heads 4 --n-kv-heads 2 --seq-len 128 --global-batch 16
  --warmup 15 --lr 3e-3 --min-lr 3e-4 --threads "$threads")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git -C "$root" rev-parse --short HEAD)"

# attention ms/step and step ms/step from a --profile table
profile_ms() {
  awk '/^attention_fwd|^attention_bwd/ {a += $4} /^all ops/ {s = $4} END {printf "%.3f %.3f\n", a, s}' "$1"
}
for r in $(seq "$rounds"); do
  for mode in mask nomask; do
    flag=()
    [[ $mode == mask ]] && flag=(--doc-mask)
    rm -rf "$work/p-$mode"
    "$TRAIN" "${X[@]}" "${MODEL[@]}" "${flag[@]}" --out "$work/p-$mode" --steps "$steps" --profile "$steps" \
      --eval-every 0 --quiet --no-plot >"$work/prof-$mode-$r.txt"
    read -r att step < <(profile_ms "$work/prof-$mode-$r.txt")
    echo "$mode $att $step" >>"$work/rounds.txt"
    echo "round $r $mode: attention fwd+bwd $att ms/step, all ops $step ms/step (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
python3 - "$work/rounds.txt" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {m: (statistics.median(float(r[1]) for r in rows if r[0] == m),
           statistics.median(float(r[2]) for r in rows if r[0] == m)) for m in ("mask", "nomask")}
print("median attention fwd+bwd ms/step: causal %.1f, --doc-mask %.1f (%.2fx); all ops ms/step: %.1f, %.1f"
      % (med["nomask"][0], med["mask"][0], med["nomask"][0] / med["mask"][0], med["nomask"][1], med["mask"][1]))
EOF
rm -f "$work/rounds.txt"

# the pairs the mask keeps over the profiled steps' windows
PY=${PYTHON:-$root/.venv/bin/python}
[[ -x $PY ]] || PY=python3
PYTHONPATH=$root/python "$PY" - "$main" "$steps" <<'EOF'
import sys, numpy, tokshard
main, steps = sys.argv[1], int(sys.argv[2])
L, B = 128, 16
ds = {n: tokshard.Dataset(f"{main}/{n}") for n in ("gcide", "python")}
m = tokshard.Mixture([("gcide", ds["gcide"], 0.6), ("python", ds["python"], 0.4)], L, B)
starts_of = {}
kept = total = 0
for g in range(steps * B):
    name, _, _, w = m.sample(g)
    s = m.samplers[m.names.index(name)]
    b, _ = s.window_tokens(w)
    # document starts: the shards' index, over the stream
    d = ds[name]
    if name not in starts_of:
        starts_of[name] = numpy.concatenate([numpy.asarray(sh.index[:-1], dtype=numpy.int64) + d.token_cum[i]
                                             for i, sh in enumerate(d.shards)])
    starts = starts_of[name]
    t = numpy.arange(b, b + L)
    first = numpy.maximum(starts[numpy.searchsorted(starts, t, side="right") - 1], b) - b
    kept += int((numpy.arange(L) - first + 1).sum())
    total += L * (L + 1) // 2
print(f"pairs the block-causal mask keeps: {kept / total:.3f} of the causal mask's "
      f"({steps * B} windows of {L} tokens)")
EOF

if [[ $full -eq 1 ]]; then
  for mode in mask nomask; do
    flag=()
    [[ $mode == mask ]] && flag=(--doc-mask)
    rm -rf "$work/full-$mode"
    start=$(date +%s)
    "$TRAIN" "${X[@]}" "${MODEL[@]}" "${flag[@]}" --out "$work/full-$mode" --steps 150 --eval-every 25 \
      --save-every 50 --quiet --no-plot >/dev/null
    echo "main job, $mode: $(($(date +%s) - start)) s; final $(grep val_loss "$work/full-$mode/metrics.jsonl" | tail -1)"
  done
fi
