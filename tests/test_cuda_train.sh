#!/usr/bin/env bash
# test_cuda_train.sh - tokshard-train with --device cuda on real text (the
# train_setup fixture's dataset): the same losses as --device cpu over 8 steps
# (within the per-step fp32 bound tests/layout_losses.py derives from the
# model's sums: the GPU and the CPU differ in the order of their sums as two
# layouts do), a bf16 run, a GPU
# checkpoint resumed on the CPU continuing the curve, --profile timed with
# CUDA events (as train_profile on the CPU), and the vocab safety:
# an id >= vocab_size stops training before any kernel sees it (no step runs,
# the message names the shard and offset). Exits 77 where no CUDA device is
# usable (ctest: skipped).
# Usage: test_cuda_train.sh BIN_DIR WORKDIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
CASE=cuda
S=$2/setup
W=$2/cuda-run
TKS=$BIN/tokshard
TRAIN=$BIN/tokshard-train
FORGE=$BIN/forge_token
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
M=(--dim 32 --n-layers 2 --n-heads 4 --n-kv-heads 2 --seq-len 32 --global-batch 8 --micro-batch 4
  --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 0 --threads 2 --quiet --no-plot)

"$TRAIN" --dataset "$S/data" --out probe --steps 1 "${M[@]}" --device cuda >"$W/out" 2>"$W/err"
if grep -Eq "no CUDA device|no CUDA backend" "$W/err"; then
  echo "skipped: no CUDA device ($(head -c 300 "$W/err"))"
  exit 77
fi

losses() { grep '"loss"' "$1" | sed 's/.*"loss": \([0-9.eE+-]*\).*/\1/'; }
# same_curve A B FROM TO: steps FROM..TO of run A's and run B's metrics.jsonl agree
# within the fp32 bound derived per step (tests/layout_losses.py; the model's
# shape from the GPU run's checkpoints)
same_curve() { python3 "$HERE/layout_losses.py" "$1" "$2" "$3" "$4" gpu/checkpoints 32; }

expect 0 "8 steps on the CPU" -- "$TRAIN" --dataset "$S/data" --out cpu --steps 8 "${M[@]}" --device cpu
expect 0 "8 steps on the GPU, saving at 4" -- "$TRAIN" --dataset "$S/data" --out gpu --steps 8 --save-every 4 \
  "${M[@]}" --device cuda
r=$(same_curve gpu/metrics.jsonl cpu/metrics.jsonl 1 8) && ok "GPU vs CPU losses: $r" || fail "GPU vs CPU losses: $r"
expect 0 "8 steps on the GPU in bf16" -- "$TRAIN" --dataset "$S/data" --out gpu16 --steps 8 "${M[@]}" \
  --device cuda --dtype bf16
[[ $(losses gpu16/metrics.jsonl | wc -l) -eq 8 ]] && ok "bf16: 8 losses" || fail "bf16: $(cat gpu16/metrics.jsonl)"
expect 0 "the GPU checkpoint of step 4 resumed on the CPU" -- "$TRAIN" --dataset "$S/data" --out back --steps 8 \
  "${M[@]}" --device cpu --resume gpu/checkpoints/step-00000004
r=$(same_curve back/metrics.jsonl gpu/metrics.jsonl 5 8) &&
  ok "resumed on the CPU continues the GPU curve: $r" || fail "resume on the CPU: $r"

# --profile on the GPU: every op timed by a pair of CUDA events, read once per
# profiled step (no sync between ops); as train_profile on the CPU: 2 profiled
# steps count exactly twice the calls of 1, the shares sum to 100%, the
# events measured something, and profiling changes no result (the losses of
# a profiled run are an unprofiled GPU run's bits)
expect 0 "GPU: 3 steps, profile 1" -- "$TRAIN" --dataset "$S/data" --out gp1 --steps 3 --profile 1 "${M[@]}" \
  --device cuda
cp "$W/out" gp1.txt
expect 0 "GPU: 3 steps, profile 2" -- "$TRAIN" --dataset "$S/data" --out gp2 --steps 3 --profile 2 "${M[@]}" \
  --device cuda
cp "$W/out" gp2.txt
expect 0 "GPU: 3 steps unprofiled" -- "$TRAIN" --dataset "$S/data" --out gp0 --steps 3 "${M[@]}" --device cuda
python3 - gp1.txt gp2.txt <<'PY' && ok "GPU profile: the ops listed; 2 steps count twice the calls of 1; shares sum to 100%" ||
import sys
def table(path):
    rows, total, on = {}, None, False
    for line in open(path):
        if line.startswith("backend ops over the profiled steps"): on = True; continue
        if on and line.startswith("op "): continue
        if on and line.strip():
            f = line.split()
            if f[0] == "all": total = float(f[2]); break
            rows[f[0]] = (int(f[1]), float(f[2]), float(f[4].rstrip("%")))
    return rows, total
(a, ta), (b, tb) = table(sys.argv[1]), table(sys.argv[2])
for op in ("gemm", "attention_fwd", "attention_bwd", "add_rmsnorm_fwd", "xent_fused", "adamw", "embedding_bwd"):
    assert op in a and op in b, (op, sorted(a))
assert set(a) == set(b), (sorted(a), sorted(b))
for op in a:
    assert b[op][0] == 2 * a[op][0], (op, a[op], b[op])
assert ta > 0 and tb > 0, (ta, tb)  # the events measured the kernels
for t in (a, b):
    assert abs(sum(r[2] for r in t.values()) - 100.0) <= 0.05 * len(t) + 1e-9, t
PY
  fail "GPU profile tables: $(cat gp1.txt gp2.txt | tail -c 1500)"
if [[ "$(grep -o '"loss": [^,]*' gp2/metrics.jsonl)" == "$(grep -o '"loss": [^,]*' gp0/metrics.jsonl)" ]]; then
  ok "GPU: the profiled run's losses are the unprofiled run's"
else
  fail "GPU: losses differ: $(grep -o '"loss": [^,]*' gp2/metrics.jsonl gp0/metrics.jsonl | tr '\n' ' ')"
fi

# vocab safety on the GPU: the forged id is found while the batch is loaded
read -r sh off < <("$TKS" sample-plan "$S/data" --seq-len 32 --global-batch 8 --steps 1 \
  --val-tokens 4096 --seed 1337 | awk '/ sample 1 / {print $(NF-3), $(NF-1)}')
bad_at=$((off + 10))
cp -r "$S/data" bad
expect 0 "forge id 1000 at shard $sh token $bad_at" -- "$FORGE" bad "$sh" "$bad_at" 1000
expect 2 "GPU training stops at the forged id" -- "$TRAIN" --dataset bad --out r5 --steps 4 "${M[@]}" --device cuda
expect_msg "token id 1000 at token offset $bad_at .*not below the vocabulary size 1000"
grep -q '"loss"' r5/metrics.jsonl 2>/dev/null && fail "a step ran on the bad batch" || ok "no step ran"
finish test_cuda_train
