#!/usr/bin/env bash
# bench_ckpt_memory.sh - host memory of a checkpoint save under a mesh, this
# tree against an older revision (the peer: the save that gathered the whole
# model and both AdamW moments on every rank). A benchmark, not a test.
#
# Runs one training step and its checkpoint save of a ~27M-parameter LLaMA
# (dim 512, 8 layers) on 4 processes, tp 2 x dp_shard 2, with each build, and
# reports every rank's peak RSS (GNU time's %M) and that both saves hold the
# same tensors. The step itself costs the same in both; the difference is the save.
#
# usage: bench/bench_ckpt_memory.sh --old-rev REV [--dataset DIR] [--work DIR]
#   --old-rev REV   revision to compare with (required; docs/BENCHMARKS.md names
#                   the one its table compared)
#   --dataset DIR   tokshard dataset [runs/main/dataset; samples/main.sh makes it]
#   --work DIR      scratch space [/tmp/tks-ckmem]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
old_rev=
data=$root/runs/main/dataset
work=/tmp/tks-ckmem
while [[ $# -gt 0 ]]; do
  case $1 in
  --old-rev) old_rev=$2; shift 2 ;;
  --dataset) data=$2; shift 2 ;;
  --work) work=$2; shift 2 ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $old_rev ]] || { echo "bench_ckpt_memory.sh: --old-rev REV is required (the revision to compare with)" >&2; exit 2; }
[[ -d $data ]] || { echo "no dataset at $data: run samples/main.sh or give --dataset" >&2; exit 2; }
mkdir -p "$work"
mpi_env
# the two builds (Release)
rm -rf "$work/old-src" && mkdir -p "$work/old-src"
git archive "$old_rev" | tar -x -C "$work/old-src"
for t in old new; do
  src=$root
  [[ $t == old ]] && src=$work/old-src
  cmake -S "$src" -B "$work/build-$t" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$work/build-$t" -j2 --target tokshard-train >/dev/null
done
M=(--dim 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --seq-len 64 --global-batch 4 --micro-batch 1
  --steps 1 --eval-every 0 --val-tokens 4096 --threads 1 --quiet --no-plot --tp 2 --dp-shard 2)
echo "load before: $(uptime)"
"$work/build-new/bin/tokshard-train" --dataset "$data" --dry-run --world 4 "${M[@]}" | grep -E "parameters|memory estimate" -A1 | head -4
for t in old new; do
  rm -rf "$work/run-$t"
  mpirun --oversubscribe -np 4 /usr/bin/time -f "peak-rss-kib %M" "$work/build-$t/bin/tokshard-train" \
    --dataset "$data" --out "$work/run-$t" "${M[@]}" 2>"$work/err-$t" >/dev/null
  echo "$t: peak RSS per rank (MiB): $(grep -o 'peak-rss-kib [0-9]*' "$work/err-$t" | awk '{printf "%.0f ", $2/1024}')"
done
# the two revisions may train differently (other numerics), so compare what a
# save must keep: every tensor's name, dtype and shape (parallel_checkpoint
# checks the bytes across layouts within one revision)
for f in model.safetensors optimizer.safetensors; do
  python3 - "$work/run-old/checkpoints/step-00000001/$f" "$work/run-new/checkpoints/step-00000001/$f" <<'PY'
import json, struct, sys
def hdr(p):
    b = open(p, "rb").read()
    h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}, len(b)
(a, na), (b, nb) = hdr(sys.argv[1]), hdr(sys.argv[2])
print(f"{sys.argv[1].split('/')[-1]}: {len(a)} tensors, {na} bytes old, {nb} new:",
      "same names, dtypes and shapes" if a == b else "DIFFERENT tensors")
PY
done
echo "load after: $(uptime)"
