#!/usr/bin/env bash
# run.sh - the one script for a GPU machine without our Debian packages and
# without network (docs/GPU.md): unpacks the
# carried Debian packages, builds tokshard with -DTKS_CUDA=ON, runs the GPU
# tests, then the benchmark (tokshard fp32 against PyTorch eager and
# torch.compile, bf16 and fp32, on the Llama-3.2-1B shape and a 124M-class
# config), and writes everything under $OUT (eight files):
#   run.log      what ran, with times        env.txt    GPU, driver, CUDA, cuDNN, NCCL, torch
#   build.log    cmake + build               ctest.log  the GPU test subset (label gpu) + CPU ops
#   bench.jsonl  one JSON object per run     summary.md the table for docs/BENCHMARKS.md
#
# Prepare first, on a Debian machine with network: bench/gpu/fetch-debs.sh
# (fills .debs/ and third_party/cudnn-frontend); copy the working tree with
# those two folders to the GPU machine and run bench/gpu/run.sh PHASES there.
# Phases, in this order, each skipped when the time left (TKS_GPU_BUDGET_S,
# default 570 s from the start) is too short:
#   build           configure and build build-gpu/ (-j TKS_GPU_JOBS, default all cores)
#   test            the fast GPU tests: cuda_ops, cuda_model, cuda_memory,
#                   cuda_comm_* (and the CPU ops/model tests they compare with)
#   test-train      tokshard-train on the GPU: cuda_train, cuda_parallel
#   bench-tokshard  tokshard-bench-gpu, small configs first
#   bench-torch     the PyTorch anchors
# Arguments choose phases (default: all); "quick" runs only the small configs
# of the benchmark. A phase that needs the binaries builds them first when
# the machine has no build-gpu/ yet (about 3 minutes). As three commands of
# at most 10 minutes each:
#   1. bench/gpu/run.sh build test test-train
#   2. bench/gpu/run.sh bench-tokshard
#   3. bench/gpu/run.sh bench-torch
# (read each summary before the next; where build-gpu/ is kept, 2 and 3 skip
# the build).
set -uo pipefail
T0=$(date +%s)
BUDGET=${TKS_GPU_BUDGET_S:-570}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
phases=${*:-build test test-train bench-tokshard bench-torch}
quick=0
if [[ " $phases " == *" quick "* ]]; then
  quick=1
  phases=${phases//quick/}
  [[ -z ${phases// /} ]] && phases="build test test-train bench-tokshard bench-torch"
fi
for p in $phases; do
  case $p in build | test | test-train | bench-tokshard | bench-torch) ;;
  *) echo "run.sh: unknown phase '$p' (build test test-train bench-tokshard bench-torch quick)" >&2; exit 2 ;;
  esac
done

log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/run.log"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
want() { [[ " $phases " == *" $1 "* ]]; }
# runs "$@" with a timeout that keeps the rest of the budget, appending to a log
timed() {
  local need=$1 logf=$2
  shift 2
  local l
  l=$(left)
  if ((l < need)); then
    log "SKIP (only ${l}s left, need ${need}s): $*"
    return 99
  fi
  log "run: $*"
  timeout $((l - 5)) "$@" >>"$logf" 2>&1
  local rc=$?
  log "rc=$rc: $*"
  return $rc
}

# ---- Debian packages, unpacked into a private root (never into /) -----------
ROOT=/tmp/tksroot
ARCH=x86_64-linux-gnu
if [[ ! -d $ROOT/usr ]]; then
  if ! ls .debs/*.deb >/dev/null 2>&1; then
    log "no .debs/: run bench/gpu/fetch-debs.sh where apt works and carry .debs"
    exit 1
  fi
  for f in .debs/*.deb; do dpkg -x "$f" "$ROOT"; done
  log "unpacked $(ls .debs/*.deb | wc -l) packages into $ROOT"
fi
# alternatives that dpkg -x does not create
ln -sf mpirun.openmpi "$ROOT/usr/bin/mpirun"
ln -sf mpicc.openmpi "$ROOT/usr/bin/mpicc" 2>/dev/null
[[ -e $ROOT/usr/bin/pkg-config ]] || ln -sf pkgconf "$ROOT/usr/bin/pkg-config"
ln -sf openblas-openmp/libopenblas.so.0 "$ROOT/usr/lib/$ARCH/libopenblas.so.0" 2>/dev/null
export PATH=$ROOT/usr/bin:$PATH
export PKG_CONFIG_SYSROOT_DIR=$ROOT
export PKG_CONFIG_LIBDIR=$ROOT/usr/lib/$ARCH/pkgconfig:$ROOT/usr/share/pkgconfig:$ROOT/usr/lib/pkgconfig
export OPAL_PREFIX=$ROOT/usr # relocates Open MPI (its components, help files, orted)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false
LIBS=$ROOT/usr/lib/$ARCH:$ROOT/usr/lib/$ARCH/openblas-openmp:$ROOT/usr/lib/$ARCH/openmpi/lib
# NCCL and cuDNN: the Python wheels of the image (nvidia-nccl-cu13, nvidia-cudnn-cu13)
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
if [[ -n $NV ]]; then
  export TKS_CUDA_EXTRA_ROOT=$NV
  for d in "$NV"/*/lib; do LIBS=$LIBS:$d; done
fi
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
export LIBRARY_PATH=$LIBS:${LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
# the train tests' text (fetch-debs.sh carries it; the image has no dict-gcide)
[[ -f .debs/gcide-head.gz ]] && export TKS_TEST_GCIDE=$REPO/.debs/gcide-head.gz

{
  echo "date: $(date -u)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())' 2>&1
  ls "$NV"/cudnn/lib "$NV"/nccl/lib 2>&1 | tr '\n' ' '
  echo
  echo "cpu: $(nproc) cores; uptime: $(uptime)"
} >"$OUT/env.txt"
log "env: $(head -3 "$OUT/env.txt" | tail -2 | tr '\n' ' ')"

BUILD=build-gpu
# every phase after build needs these; a bare machine builds first
built() { [[ -x $BUILD/bin/tokshard-train && -x $BUILD/bin/test_cuda_ops && -x $BUILD/bin/tokshard-bench-gpu ]]; }
needs_bins=0
for p in $phases; do [[ $p != bench-torch ]] && needs_bins=1; done
if want build || { ! built && ((needs_bins)); }; then
  gen=""
  command -v ninja >/dev/null && gen="-G Ninja"
  timed 60 "$OUT/build.log" cmake -S . -B $BUILD $gen -DCMAKE_BUILD_TYPE=Release -DTKS_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTKS_WERROR=OFF \
    -DTKS_OPENBLAS_OMP=$ROOT/usr/lib/$ARCH/openblas-openmp/libopenblas.so \
    -DTKS_OPENBLAS_OMP_INC=$ROOT/usr/include/$ARCH/openblas-openmp
  timed 60 "$OUT/build.log" cmake --build $BUILD -j"${TKS_GPU_JOBS:-$(nproc)}" || { log "build failed: see build.log"; tail -30 "$OUT/build.log"; }
fi

if want test && built; then
  timed 60 "$OUT/ctest.log" ctest --test-dir $BUILD -L gpu -E '^cuda_(train|parallel)$' --output-on-failure --timeout 240
  timed 30 "$OUT/ctest.log" ctest --test-dir $BUILD -R '^(ops|model|comm_unit)$' --output-on-failure
fi
if want test-train && built; then
  # train_setup (the fixture) runs first: the dataset both tests train on
  timed 90 "$OUT/ctest.log" ctest --test-dir $BUILD -R '^cuda_(train|parallel)$' --output-on-failure --timeout 400
fi
if want test || want test-train; then
  grep -E "tests passed|Passed|Failed|Skipped|FAIL|^ok|^not ok" "$OUT/ctest.log" | tail -40
fi

B1=${TKS_GPU_BATCH_1B:-2}
if want bench-tokshard && [[ -x $BUILD/bin/tokshard-bench-gpu ]]; then
  G=$BUILD/bin/tokshard-bench-gpu
  timed 40 "$OUT/bench.jsonl" $G 124m 8 1024 10 2 bf16
  timed 40 "$OUT/bench.jsonl" $G 124m 8 1024 10 2 fp32
  if ((!quick)); then
    timed 90 "$OUT/bench.jsonl" $G 1b "$B1" 2048 6 2 bf16
    timed 90 "$OUT/bench.jsonl" $G 1b "$B1" 2048 4 1 fp32
    # tokshard's own attention kernel in bf16, for the cuDNN speed-up
    TKS_CUDNN_ATTENTION=0 timed 90 "$OUT/bench.jsonl" $G 1b "$B1" 2048 3 1 bf16
  fi
fi

if want bench-torch; then
  A=bench/gpu/torch_anchor.py
  export PYTHONUNBUFFERED=1
  timed 40 "$OUT/bench.jsonl" python3 $A --config 124m --batch 8 --mode eager --dtype bf16
  timed 40 "$OUT/bench.jsonl" python3 $A --config 124m --batch 8 --mode eager --dtype fp32
  if ((!quick)); then
    timed 60 "$OUT/bench.jsonl" python3 $A --config 1b --batch "$B1" --mode eager --dtype bf16
    timed 150 "$OUT/bench.jsonl" python3 $A --config 1b --batch "$B1" --mode compile --dtype bf16
    timed 60 "$OUT/bench.jsonl" python3 $A --config 1b --batch "$B1" --mode eager --dtype fp32 --steps 6 --warmup 2
  fi
  timed 90 "$OUT/bench.jsonl" python3 $A --config 124m --batch 8 --mode compile --dtype bf16
fi

# ---- summary table ------------------------------------------------------------
[[ -f $OUT/bench.jsonl ]] && python3 - "$OUT/bench.jsonl" >"$OUT/summary.md" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
print("| config | impl | dtype | B x T | step s | tokens/s | MFU (torchtitan, 989 TF) | peak GiB | dry-run plan / allocated |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if "tokens_per_s" not in r:
        continue
    print("| %s | %s | %s | %d x %d | %.4f | %.0f | %.1f%% | %.1f | %s |" % (
        r["config"], r["impl"], r["dtype"], r["B"], r["T"], r["step_s"], r["tokens_per_s"],
        100 * r["mfu"], r["peak_bytes"] / 2**30,
        "%.3f" % r["plan_vs_allocated"] if "plan_vs_allocated" in r else "-"))
best = {}
for r in rows:
    if "tokens_per_s" in r:
        k = (r["config"], r["impl"], r["dtype"])
        best[k] = max(best.get(k, 0), r["tokens_per_s"])
print()
for cfg in ("124m", "1b"):
    for dt in ("bf16", "fp32"):
        t = best.get((cfg, "tokshard", dt))
        for other in ("pytorch-eager", "pytorch-compile"):
            o = best.get((cfg, other, dt))
            if t and o:
                print("- %s %s: tokshard / %s = %.3f" % (cfg, dt, other, t / o))
PY
[[ -f $OUT/summary.md ]] && cat "$OUT/summary.md"
log "done in $(($(date +%s) - T0))s"
