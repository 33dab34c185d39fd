#!/usr/bin/env bash
# run.sh - the GPU runbook, run from an unpacked bundle (bench/gpu/bundle.sh
# makes it; docs/GPU.md): nothing is compiled or installed on the GPU machine.
#
# Usage: ./run.sh OUTDIR [test] [bench] [quick]
#   test   every GPU test of the bundle (ctest -L gpu: the CUDA ops and model
#          against the CPU reference, the memory plan, NCCL in three layouts
#          under mpirun, tokshard-train on the GPU and its layouts), with the
#          train fixture they need; OUTDIR/test.log and OUTDIR/test-summary.md
#   bench  tokshard-bench-gpu (bf16 and fp32, a 124M-class config and the
#          Llama-3.2-1B shape) against PyTorch eager and torch.compile
#          (bench/torch_anchor.py, the machine's python3 with torch) on the
#          same shapes; OUTDIR/bench.log, bench.jsonl and bench-summary.md
#   quick  the benchmark's small configs only
# Default: test bench. Each phase stops itself at TKS_GPU_PHASE_S seconds
# (default 470) so that one phase fits one 8-minute slot; a step cut short is
# named in the log. OUTDIR/env.txt records the GPU, driver, libraries and
# torch. The batch of the 1B runs is TKS_GPU_BATCH_1B (default 2).
set -uo pipefail
P=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
[[ -x $P/env && -d $P/tests ]] || {
  echo "run.sh: run it from an unpacked bundle (bench/gpu/bundle.sh makes one); $P has no env or tests/" >&2
  exit 2
}
(($#)) || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
OUT=$1
shift
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
phases=${*:-test bench}
quick=0
[[ " $phases " == *" quick "* ]] && quick=1 && phases=${phases//quick/}
[[ -z ${phases// /} ]] && phases="test bench"
for p in $phases; do
  case $p in test | bench) ;;
  *) echo "run.sh: unknown phase '$p' (test bench quick)" >&2; exit 2 ;;
  esac
done
PHASE_S=${TKS_GPU_PHASE_S:-470}
E=$P/env
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/run.log"; }

{
  echo "date: $(date -u)"
  echo "bundle: $(head -1 "$P/BUNDLE")"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())' 2>&1
  "$E" bash -c 'ldd "$0" | grep -E "cudart|cublas|cudnn|nccl|nvrtc"' "$P/lib/libtks_cuda.so" 2>&1
  echo "cpu: $(nproc) cores; load $(cut -d" " -f1-3 /proc/loadavg)"
} >"$OUT/env.txt"
log "env: $(sed -n 3,4p "$OUT/env.txt" | tr '\n' ' ')"

# phase_left START: seconds this phase has left
phase_left() { echo $((PHASE_S - ($(date +%s) - $1))); }
# step START NEED LOG CMD...: runs CMD with the time the phase has left, unless that is under NEED
step() {
  local start=$1 need=$2 logf=$3
  shift 3
  local l
  l=$(phase_left "$start")
  if ((l < need)); then
    log "SKIP (phase has ${l}s left, needs ${need}s): $*"
    return 99
  fi
  log "run: $*"
  timeout $((l - 3)) "$@" >>"$logf" 2>&1
  local rc=$?
  ((rc == 124)) && log "CUT SHORT at the phase's ${PHASE_S}s: $*"
  log "rc=$rc: $*"
  return $rc
}

if [[ " $phases " == *" test "* ]]; then
  s=$(date +%s)
  # the fixture (train_setup) comes with the tests that need it
  step "$s" 60 "$OUT/test.log" "$E" ctest --test-dir "$P/tests" -L gpu --output-on-failure --timeout 300
  python3 - "$OUT/test.log" >"$OUT/test-summary.md" <<'PY'
import re, sys
rows = re.findall(r"Test +#\d+: (\S+) \.+\** *(Passed|Failed|Skipped|Not Run|Timeout|\w+)[^\d]*([\d.]+) sec",
                  open(sys.argv[1]).read())
print("| test | result | seconds |\n|---|---|---|")
for name, res, sec in rows:
    print("| %s | %s | %s |" % (name, res, sec))
n = {r: sum(1 for x in rows if x[1] == r) for r in ("Passed", "Failed", "Skipped")}
print("\n%d tests: %d passed, %d failed, %d skipped" % (len(rows), n["Passed"], n["Failed"], n["Skipped"]))
PY
  cat "$OUT/test-summary.md" | tee -a "$OUT/run.log"
fi

if [[ " $phases " == *" bench "* ]]; then
  s=$(date +%s)
  # tokshard's side through the bundle's environment; PyTorch's without it
  # (its own libraries, none of the bundle's)
  G=("$E" tokshard-bench-gpu)
  A=$P/bench/torch_anchor.py
  B1=${TKS_GPU_BATCH_1B:-2}
  J=$OUT/bench.jsonl
  export PYTHONUNBUFFERED=1
  bench() { step "$s" "$1" "$OUT/bench.log" bash -c 'out=$0; shift; "$@" | tee -a "$out"' "$J" "${@:2}"; }
  bench 40 "${G[@]}" 124m 8 1024 10 2 bf16
  bench 40 python3 "$A" --config 124m --batch 8 --mode eager --dtype bf16
  bench 40 "${G[@]}" 124m 8 1024 10 2 fp32
  bench 40 python3 "$A" --config 124m --batch 8 --mode eager --dtype fp32
  if ((!quick)); then
    bench 60 "${G[@]}" 1b "$B1" 2048 6 2 bf16
    bench 60 python3 "$A" --config 1b --batch "$B1" --mode eager --dtype bf16
    bench 150 python3 "$A" --config 1b --batch "$B1" --mode compile --dtype bf16
    bench 60 "${G[@]}" 1b "$B1" 2048 4 1 fp32
    # tokshard's own attention kernel in bf16, for the cuDNN speed-up
    TKS_CUDNN_ATTENTION=0 bench 60 "${G[@]}" 1b "$B1" 2048 3 1 bf16
  fi
  bench 90 python3 "$A" --config 124m --batch 8 --mode compile --dtype bf16
  python3 - "$J" >"$OUT/bench-summary.md" <<'PY'
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
  cat "$OUT/bench-summary.md" | tee -a "$OUT/run.log"
fi
log "done in $(($(date +%s) - T0))s"
