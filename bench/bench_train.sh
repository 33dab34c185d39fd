#!/usr/bin/env bash
# bench_train.sh - the trainer benchmarks of the "trainer part 1" and "trainer
# part 2" issues, in one run on this machine (CPU only).
#
#   part 1   training tokens/s of tokshard-train (CPU backend) against a PyTorch
#            LLaMA with the same configuration (bench/torch_llama_bench.py: RMSNorm,
#            RoPE rotate_half, GQA, SwiGLU, untied lm_head, fp32, eager, AdamW with
#            the same hyperparameters, clip, same batch and sequence length, same
#            threads, same real data): configs "main" (dim 128, 4 layers, seq 128,
#            batch 16) and "large" (dim 256, 6 layers, seq 256, batch 8), at
#            --threads N (all cores) and 1, and N again with OMP_WAIT_POLICY=passive
#            for both (see docs/BENCHMARKS.md: idle libgomp threads spinning against
#            OpenBLAS's pthreads). Median of --timed-steps steps after --warmup-steps
#            untimed ones; ratio ours / PyTorch.
#   part 2a  tokens/s at 1 and 2 processes (main config): --threads 1, --threads 2,
#            mpirun -np 2 --dp-shard 2 --threads 1, mpirun -np 2 --tp 2 --threads 1.
#   part 2b  bytes per step per collective kind (metrics.jsonl "comm_bytes", rank 0)
#            against bench/comm_expected.py for layouts (dp_replicate, dp_shard, tp)
#            (1,1,2) (1,2,1) (2,1,1) (1,2,2) (2,2,1) (2,2,2) and (1,2,2) with
#            micro-batches, on a tiny model (oversubscribed), plus ring wire bytes.
#   part 2c  optimizer state per rank from --dry-run for dp_shard 1, 2, 4, 8.
#
# A benchmark, not a test: nothing about time is asserted (part 2b's byte counts
# are exact and reported as MATCH / MISMATCH). Prints a table and writes
# bench/results/train-<date>.json (and train-latest.json, train-latest.md).
# Takes about 3 minutes on 2 idle cores (4 with --profile).
#
# usage: bench/bench_train.sh [options]
#   --build DIR        build directory [build-tbench; configured and rebuilt on every run]
#   --dataset DIR      tokshard dataset, vocab 8000 [runs/main/dataset if present, else
#                      built into --work from the first 8 MB of /usr/share/dictd/gcide.dict.dz]
#   --work DIR         scratch directory [/var/tmp/tokshard-train-bench]
#   --threads N        the "all cores" thread count [nproc]
#   --warmup-steps N   untimed steps per run [3]
#   --timed-steps N    timed steps per run, median reported [10]
#   --max-wait S       before each part, wait up to S seconds for other processes to
#                      use less than --quiet-load CPUs (measured over 5 s) [0: do not wait]
#   --quiet-load X     [0.3]
#   --parts LIST       any of 1,2a,2b,2c,prof [1,2a,2b,2c]
#   --profile          add part "prof": where a step's time goes, per component (GEMM,
#                      attention, cross-entropy, RMSNorm, RoPE, SwiGLU, clip, AdamW): ours
#                      from op timers in a scratch build (bench/train_op_profile.py),
#                      PyTorch's from each component timed alone (bench/torch_train_ops.py);
#                      both configs, threads N, 1, N + OMP_WAIT_POLICY=passive (+1-2 min)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="$ROOT/build-tbench"
DATA=""
WORK="/var/tmp/tokshard-train-bench"
THREADS="$(nproc)"
WARM=3
TIMED=10
MAX_WAIT=0
QUIET_LOAD=0.3
PARTS="1,2a,2b,2c"
while (($#)); do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --dataset) DATA="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --warmup-steps) WARM="$2"; shift 2 ;;
    --timed-steps) TIMED="$2"; shift 2 ;;
    --max-wait) MAX_WAIT="$2"; shift 2 ;;
    --quiet-load) QUIET_LOAD="$2"; shift 2 ;;
    --parts) PARTS="$2"; shift 2 ;;
    --profile) PARTS="$PARTS,prof"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_train.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RES="$ROOT/bench/results"
TAG="$(date +%Y%m%d-%H%M%S)"
mkdir -p "$WORK" "$RES"
T0=$(date +%s)

# torch: Debian's python3-torch is installed for /usr/bin/python3, not for a
# pyenv python3 that may come first on PATH
TORCH_PY=/usr/bin/python3
"$TORCH_PY" -c 'import torch, numpy' 2>/dev/null || {
  echo "bench_train.sh: $TORCH_PY cannot import torch and numpy (apt-get install python3-torch python3-numpy)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench_train.sh: mpirun not found (openmpi-bin)" >&2; exit 2; }

# always (re)build: the figures must be those of the current source (incremental, quick when
# nothing changed)
echo "building $BUILD (Release)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target tokshard tokshard-train >/dev/null

if [[ -z "$DATA" ]]; then
  if [[ -f "$ROOT/runs/main/dataset/manifest.json" ]]; then
    DATA="$ROOT/runs/main/dataset"
  else
    DATA="$WORK/gcide-8000"
    if [[ ! -f "$DATA/manifest.json" ]]; then
      echo "building a dataset from the first 8 MB of gcide (vocab 8000) in $WORK"
      [[ -f /usr/share/dictd/gcide.dict.dz ]] || { echo "bench_train.sh: /usr/share/dictd/gcide.dict.dz missing (apt-get install dict-gcide) or pass --dataset" >&2; exit 2; }
      zcat /usr/share/dictd/gcide.dict.dz | head -c 8M > "$WORK/gcide-8M.txt"
      "$BUILD/bin/tokshard" train-tokenizer --output "$WORK/gcide-8000" --vocab-size 8000 \
        --doc-split blank-line "$WORK/gcide-8M.txt" >/dev/null
      rm -rf "$DATA"
      "$BUILD/bin/tokshard" build --tokenizer "$WORK/gcide-8000.model" --output "$DATA" \
        --doc-split blank-line --quiet "$WORK/gcide-8M.txt" >/dev/null
    fi
  fi
fi
echo "dataset: $DATA"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 "$HERE/train_bench.py" --bin "$BUILD/bin" --dataset "$DATA" --work "$WORK" \
  --results "$RES" --torch-python "$TORCH_PY" --threads "$THREADS" --warmup-steps "$WARM" \
  --timed-steps "$TIMED" --quiet-load "$QUIET_LOAD" --max-wait "$MAX_WAIT" --parts "$PARTS" \
  --tag "$TAG"

python3 "$HERE/train_report.py" "$RES/train-$TAG.json" > "$RES/train-$TAG.md"
cp "$RES/train-$TAG.md" "$RES/train-latest.md"
echo
cat "$RES/train-$TAG.md"
echo
echo "total $(( $(date +%s) - T0 )) s; results: $RES/train-$TAG.json, $RES/train-$TAG.md"
