#!/usr/bin/env bash
# test_cuda_parallel.sh - tokshard-train --device cuda under mpirun, every rank
# on the one GPU of a single-GPU machine: the layouts (1,1,2), (1,2,1) and (2,1,2) give the
# losses of one GPU process within the derived layout tolerance
# (tests/layout_losses.py), with the NCCL comm (each rank its own NCCL_HOSTID:
# NCCL 2.28 refuses two ranks on one GPU otherwise, and with distinct host ids
# connects them over sockets) and with --comm mpi (device buffers staged
# through host memory). Exits 77 where no CUDA device is usable (ctest:
# skipped). What this does not cover: NVLink, P2P and shared-memory
# transports, nor their speed (docs/GPU.md).
# Usage: test_cuda_parallel.sh BIN_DIR WORKDIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
CASE=cuda-parallel
S=$2/setup
W=$2/cuda-parallel
TRAIN=$BIN/tokshard-train
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
# 4 heads / 2 kv heads: tp 2 splits both
M=(--dim 32 --n-layers 2 --n-heads 4 --n-kv-heads 2 --seq-len 32 --global-batch 8 --micro-batch 2
  --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 6 --threads 1 --quiet --no-plot --device cuda)

"$TRAIN" --dataset "$S/data" --out probe --steps 1 "${M[@]}" >out 2>err
if grep -Eq "no CUDA device|no CUDA backend" err; then
  echo "skipped: no CUDA device ($(head -c 300 err))"
  exit 77
fi

# run LABEL NP [flags...]: trains into run-LABEL (NP 0: without mpirun); under
# mpirun through cuda_mpirun.sh (each rank its own NCCL_HOSTID, the NCCL
# settings for ranks sharing one GPU, stopped after 120 s with a message)
run() {
  local label=$1 np=$2
  shift 2
  if [[ $np -eq 0 ]]; then
    "$TRAIN" --dataset "$S/data" --out "run-$label" "$@" >"log-$label" 2>&1
  else
    bash "$HERE/cuda_mpirun.sh" "$np" 120 "$TRAIN" --dataset "$S/data" --out "run-$label" "$@" \
      >"log-$label" 2>&1
  fi
  local rc=$?
  [[ $rc -eq 0 ]] || fail "$label: exit $rc (124: hung): $(grep -v '^ ' "log-$label" | tail -3)"
  return $rc
}
same() { python3 "$HERE/layout_losses.py" "run-$1/metrics.jsonl" \
  "run-$2/metrics.jsonl" 1 12 "run-$1/checkpoints" 32; }

run ref 0 "${M[@]}" --steps 12 || exit 1
for comm in nccl mpi; do
  for L in "1 1 2" "1 2 1" "2 1 2"; do
    read -r rep sh tp <<<"$L"
    label="$comm-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${M[@]}" --steps 12 --comm "$comm" --dp-replicate "$rep" \
      --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same ref "$label"); then ok "$comm ($rep,$sh,$tp): $out"; else fail "$comm ($rep,$sh,$tp): $out"; fi
  done
done
# the checkpoint a 2-process NCCL run saves is the one-process run's, byte for byte
for f in model.safetensors config.json; do
  cmp -s run-ref/checkpoints/step-00000012/$f run-nccl-r1s2t1/checkpoints/step-00000012/$f &&
    ok "(1,2,1) nccl: $f equals one process's" || echo "note: (1,2,1) $f differs from one process's (rounding)"
done
# --dry-run names the comm the run would use
"$TRAIN" --dataset "$S/data" --dry-run --world 4 --tp 2 "${M[@]}" >out 2>err
grep -q "comm: nccl" out && ok "dry run under --device cuda: comm nccl" || fail "dry run: $(grep comm out) $(cat err)"
finish test_cuda_parallel
