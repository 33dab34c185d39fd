#!/usr/bin/env bash
# first_call.sh - everything a GPU machine should answer, in one command under
# one deadline, from a prebuilt bundle (bench/gpu/bundle.sh): nothing is
# compiled or installed there. Parts, in order, each with a cap and skipped
# when the deadline leaves too little for it:
#   unpack  the bundle (tar -xJf, or Python's tarfile where there is no xz)
#   probe   GPU, driver, kernel, glibc, the libraries libtks_cuda.so resolves,
#           torch / CUDA / cuDNN / NCCL versions, NVIDIA's wheels, a 2-rank
#           mpirun, the CUDA backend's first step on a tiny model
#   tests   the single-process GPU tests (ctest -L gpu, NCCL ones excluded:
#           the CUDA ops and model against the CPU reference, the memory plan,
#           tokshard-train --device cuda)
#   opt-in  cuda_ops, cuda_model and cuda_train again with the opt-in
#           kernels on (OPTIN below; README: unverified on a GPU until this
#           passes)
#   1b      the Llama-3.2-1B shape, bf16, B 2 x T 2048: tokshard with the
#           opt-in kernels at 1 and at 8 micro-batches a step (per-op
#           profile at 1), torch.compile at 1 and 8 in one process (one
#           compile), then tokshard without them at 1 and 8 (the baseline)
#   nccl    the NCCL / MPI tests (cuda_comm_*, cuda_parallel: several ranks on
#           the one GPU)
#   rerun   each failed test alone with CUDA_LAUNCH_BLOCKING=1 and
#           NCCL_DEBUG=INFO, while time allows
#   small   the benchmark's 124M-class config, bf16: tokshard (with a per-op
#           profile) against PyTorch eager and torch.compile
# Results, at most 8 files, written as they come (a run cut off still leaves
# what it did), under $OUT:
#   0-summary.md  one table per part, the tests and the benchmark: readable alone
#   1-probe.txt   2-tests.log   3-nccl.log   4-rerun.log
#   5-bench.jsonl 6-bench.log (with the per-op tables)   7-timeline.txt
#
# Usage: [OUT=DIR] [TKS_DEADLINE_S=450] bench/gpu/first_call.sh [BUNDLE.tar.xz | BUNDLE_DIR]
#   Without an argument: the newest tokshard-*.tar.xz in ./.gpu, then beside
#   this script; or the bundle this script sits in. OUT defaults to
#   ./first-call-out; the bundle is unpacked under TKS_WORK (default
#   /tmp/tks-first-call). TKS_DEADLINE_S (default 450) is the whole script's
#   budget in seconds, unpacking included: every part is cut to what is left.
# Exit: 0 when the script ran to its end (whatever the tests said: the
# summary says that), 2 when there is no bundle to run.
set -uo pipefail
T0=$(date +%s)
DEADLINE=${TKS_DEADLINE_S:-450}
OUT=${OUT:-$PWD/first-call-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=${TKS_WORK:-/tmp/tks-first-call}
HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
TL=$OUT/7-timeline.txt
PARTS=$(mktemp) # the parts table's rows (outside $OUT: only the 8 results go there)
trap 'rm -f "$PARTS"' EXIT
: >"$TL"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1

now() { echo $(($(date +%s) - T0)); }
# on_path NAME: the executable regular file NAME on the PATH, or nothing
# (bash's `command -v` also names a file it cannot run)
on_path() {
  local d IFS=:
  for d in $PATH; do [[ -f $d/$1 && -x $d/$1 ]] && { echo "$d/$1"; return 0; }; done
  return 1
}
left() { echo $((DEADLINE - $(now))); }
log() { echo "[$(now)s] $*" | tee -a "$TL"; }
# part NAME RESULT SECONDS NOTE: one row of the summary's parts table
part() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$PARTS"; }

# step NAME NEED CAP LOGFILE CMD...: runs CMD, output appended to LOGFILE, for at
# most CAP seconds and never past the deadline (less 5 s for the summary);
# skipped when fewer than NEED seconds are left. Returns CMD's status, 124
# when cut short, 99 when skipped.
step() {
  local name=$1 need=$2 cap=$3 logf=$4
  shift 4
  local l=$(($(left) - 5))
  if ((l < need)); then
    log "SKIP $name (${l}s left, needs ${need}s)"
    part "$name" skipped 0 "deadline: ${l}s left, needs ${need}s"
    return 99
  fi
  ((cap > l)) && cap=$l
  local s=$(date +%s)
  log "run $name (cap ${cap}s): $*"
  echo "===== [$(now)s] $name: $*" >>"$logf"
  timeout -k 5 "$cap" "$@" >>"$logf" 2>&1
  local rc=$? d=$(($(date +%s) - s))
  local res=ok
  ((rc == 124 || rc == 137)) && res="cut short at ${cap}s"
  ((rc != 0 && rc != 124 && rc != 137)) && res="exit $rc"
  log "$name: $res (${d}s)"
  part "$name" "$res" "$d" "$(basename "$logf")"
  return $rc
}

summary() { python3 -I - "$OUT" "$DEADLINE" "$(now)" "$PARTS" >"$OUT/0-summary.md.tmp" 2>>"$TL" <<'PY' && mv "$OUT/0-summary.md.tmp" "$OUT/0-summary.md"
import json, os, re, sys
out, deadline, took, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def read(name):
    p = os.path.join(out, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""
probe = read("1-probe.txt")
def pick(key):
    m = re.search(r"^%s: (.*)$" % re.escape(key), probe, re.M)
    return m.group(1).strip() if m else "?"
print("# tokshard on a GPU: first call\n")
print("%s; driver %s; %s; bundle %s; %ds of %ds used\n" % (
    pick("gpu"), pick("driver"), pick("torch"), pick("bundle"), took, deadline))
print("| part | result | seconds | where |\n|---|---|---:|---|")
for line in open(parts).read().splitlines():
    f = line.split("\t")
    if len(f) == 4:
        print("| %s | %s | %s | %s |" % tuple(f))
tests = {}
for log in ("2-tests.log", "3-nccl.log"):
    # the sections step() starts with "===== [Ns] NAME: ..."; the opt-in
    # kernels' run of the same tests is named apart
    for sec in re.split(r"^(?======)", read(log), flags=re.M):
        pre = "opt-in " if sec.startswith("=====") and "] opt-in tests:" in sec.split("\n", 1)[0] else ""
        for m in re.finditer(r"Test +#\d+: (\S+) \.+\** *([A-Za-z ]+?) +([\d.]+) sec", sec):
            tests[pre + m.group(1)] = (m.group(2).strip(), m.group(3), log)
if tests:
    print("\n| test | result | seconds | log |\n|---|---|---:|---|")
    for n, (r, s, l) in tests.items():
        print("| %s | %s | %s | %s |" % (n, r, s, l))
    cnt = {}
    for r, _, _ in tests.values():
        cnt[r] = cnt.get(r, 0) + 1
    print("\n%d tests: %s" % (len(tests), ", ".join("%d %s" % (v, k.lower()) for k, v in sorted(cnt.items()))))
fails = re.findall(r"^(?:FAIL|not ok).*$", read("2-tests.log") + read("3-nccl.log"), re.M)
if fails:
    print("\nFirst failing checks:\n")
    for f in fails[:12]:
        print("    " + f[:200])
rows = []
for line in read("5-bench.jsonl").splitlines():
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
if rows:
    print("\n| config | impl | dtype | B x T x accum | steps | step s | tokens/s | MFU | peak GiB | warm-up s | note |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    best = {}
    for r in rows:
        if "tokens_per_s" not in r:
            print("| %s | %s | | | | | | | | | %s |" % (r.get("config", "?"), r.get("impl", "?"), r.get("error", "")))
            continue
        impl = r["impl"] + (" (opt-in)" if r.get("opt_in") else "")
        print("| %s | %s | %s | %d x %d x %d | %d | %.4f | %.0f | %.1f%% | %.2f | %s | %s |" % (
            r["config"], impl, r["dtype"], r["B"], r["T"], r.get("accum", 1), r.get("steps", 0), r["step_s"],
            r["tokens_per_s"], 100 * r["mfu"], r.get("peak_bytes", 0) / 2**30, r.get("warmup_s", ""),
            " ".join(x for x in (r.get("attention", ""), r.get("opt_in", "")) if x)))
        k = (r["config"], r["dtype"], r.get("accum", 1), impl)
        best[k] = max(best.get(k, 0), r["tokens_per_s"])
    print()
    for (cfg, dt, acc, impl), v in sorted(best.items()):
        for mine in ("tokshard", "tokshard (opt-in)"):
            t = best.get((cfg, dt, acc, mine))
            if not impl.startswith("tokshard") and t:
                print("- %s %s, %d micro-batch(es) a step: %s / %s = %.3f" % (cfg, dt, acc, mine, impl, t / v))
    print("\nMFU: torchtitan's formula against 989 TFLOP/s dense bf16 (H100 SXM / H200).")
PY
}

# ---- unpack --------------------------------------------------------------------
src=${1:-}
if [[ -z $src ]]; then
  if [[ -x $HERE/env && -d $HERE/tests ]]; then
    src=$HERE
  else
    src=$(ls -t "$PWD"/.gpu/tokshard-*.tar.xz "$HERE"/tokshard-*.tar.xz 2>/dev/null | head -1)
  fi
fi
if [[ -z $src || ! -e $src ]]; then
  echo "first_call.sh: no bundle: give a tokshard-*.tar.xz (bench/gpu/bundle.sh makes one) or an unpacked bundle" >&2
  part unpack "no bundle" 0 "${src:-nothing given, none in ./.gpu}"
  exit 2
fi
s=$(date +%s)
if [[ -d $src ]]; then
  P=$(cd "$src" && pwd)
  part unpack "ok (a folder)" 0 "$P"
else
  rm -rf "$WORK" && mkdir -p "$WORK"
  if [[ -n $(on_path xz) ]]; then
    how="tar -xJf"
    tar -C "$WORK" -xJf "$src" 2>>"$TL"
  else
    how="Python tarfile (no xz here)"
    python3 -I - "$src" "$WORK" 2>>"$TL" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    if hasattr(tarfile, "tar_filter"):
        t.extractall(sys.argv[2], filter="tar")
    else:
        t.extractall(sys.argv[2])
PY
  fi
  rc=$?
  P=$(ls -d "$WORK"/tokshard-* 2>/dev/null | head -1)
  if ((rc != 0)) || [[ -z $P || ! -x $P/env ]]; then
    log "unpack failed ($how, exit $rc): $src"
    part unpack "failed ($how, exit $rc)" $(($(date +%s) - s)) "$src"
    summary
    exit 2
  fi
  part unpack ok $(($(date +%s) - s)) "$how, $(basename "$src")"
fi
E=$P/env
log "bundle $P"

# ---- probe ---------------------------------------------------------------------
probe() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "bundle: $(sed -n 's/^commit: //p' "$P/BUNDLE")"
  smi() { if command -v nvidia-smi >/dev/null; then nvidia-smi --format=csv,noheader --query-gpu="$1" 2>&1 | head -1
    else echo "none (no nvidia-smi)"; fi; }
  echo "gpu: $(smi name,memory.total)"
  echo "driver: $(smi driver_version)"
  echo "kernel: $(uname -r)"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cpu: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ssh/rsh: $(on_path ssh || echo none) $(on_path rsh || echo none); xz: $(on_path xz || echo none)"
  echo "torch: $(python3 -I -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
torch.backends.cudnn.version(), "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none)"
  echo "--- BUNDLE"
  sed -n '1,8p' "$P/BUNDLE"
  echo "--- nvidia-smi"
  nvidia-smi 2>&1 | head -20 || true
  echo "--- NVIDIA wheels"
  python3 -I - <<'PY' 2>&1
import importlib.metadata as m
for d in sorted(m.distributions(), key=lambda d: d.metadata["Name"].lower()):
    n = d.metadata["Name"]
    if n.lower().startswith(("nvidia-", "torch", "triton")):
        print(n, d.version)
PY
  echo "--- what libtks_cuda.so resolves (through ./env)"
  [[ -f $P/lib/libtks_cuda.so ]] && "$E" bash -c 'ldd "$0"' "$P/lib/libtks_cuda.so" 2>&1
  echo "--- what tokshard-train resolves"
  "$E" bash -c 'ldd "$(command -v tokshard-train)"' 2>&1 | grep -Fv "$P/" | head -20
  echo "--- 2-rank mpirun (OMPI_MCA_plm=$("$E" bash -c 'echo ${OMPI_MCA_plm:-default}'))"
  timeout -k 3 30 "$E" mpirun --oversubscribe -np 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"' 2>&1
  echo "mpirun exit $?"
  echo "--- first CUDA step (tokshard-bench-gpu tiny, bf16)"
  timeout -k 3 60 "$E" tokshard-bench-gpu tiny 2 64 2 1 bf16 2>&1
  echo "exit $?"
}
s=$(date +%s)
if (($(left) > 60)); then
  probe >"$OUT/1-probe.txt" 2>&1
  part probe ok $(($(date +%s) - s)) "1-probe.txt: $(grep -m1 '^gpu:' "$OUT/1-probe.txt" | cut -c6-60)"
else
  part probe skipped 0 "deadline"
fi
log "probe done: $(grep -m1 '^gpu:' "$OUT/1-probe.txt" 2>/dev/null)"
summary

# ---- tests -----------------------------------------------------------------------
CT=("$E" ctest --test-dir "$P/tests" --output-on-failure --timeout 240)
export TKS_BUNDLE_WORK=$WORK/test-work
# single-process tests side by side (one GPU, the CPU reference's threads shared)
OMP_NUM_THREADS=$(($(nproc) / 3 > 1 ? $(nproc) / 3 : 1)) \
  step tests 60 200 "$OUT/2-tests.log" "${CT[@]}" -L gpu -E '^cuda_(comm|parallel)' -j3
summary
# the opt-in kernels (README), each unverified on a GPU until these pass:
# the loss head in chunks of 24 rows in the tests (several chunks of their
# 64-row batches), of 2048 in the benchmark (half of a 2 x 2048 micro-batch)
OPTIN=(TKS_CUDA_VEC_OPTIM=1 TKS_CUDA_NORM_ONEPASS=1 TKS_CUDA_ROPE_ROWS=1 TKS_CUDA_XENT_VEC=1
  TKS_CUDA_SWIGLU_VEC=1)
OMP_NUM_THREADS=$(($(nproc) / 3 > 1 ? $(nproc) / 3 : 1)) \
  step "opt-in tests" 40 120 "$OUT/2-tests.log" env "${OPTIN[@]}" TKS_LOSS_CHUNK_ROWS=24 \
  "${CT[@]}" -R '^cuda_(ops|model|train)$' -j3
summary

# ---- benchmark ----------------------------------------------------------------------
J=$OUT/5-bench.jsonl BL=$OUT/6-bench.log
A=$P/bench/torch_anchor.py
# bench NAME NEED CAP CMD...: one benchmark run, its JSON line into 5-bench.jsonl
bench() {
  local name=$1 need=$2 cap=$3
  shift 3
  step "$name" "$need" "$cap" "$BL" bash -c 'set -o pipefail; "$@" | tee -a "$0"' "$J" "$@"
}
# the two configurations of the 1B shape: 1 and 8 micro-batches of 2 x 2048
# a step (4096 and 32768 tokens), the same accumulation on both sides
O1B=("${OPTIN[@]}" TKS_LOSS_CHUNK_ROWS=2048)
bench "1b tokshard opt-in" 60 100 env "${O1B[@]}" "$E" tokshard-bench-gpu --profile 1 1b 2 2048 6 2 bf16
summary
bench "1b tokshard opt-in accum 8" 40 90 env "${O1B[@]}" "$E" tokshard-bench-gpu --accum 8 1b 2 2048 3 1 bf16
summary
bench "1b torch.compile" 90 200 python3 "$A" --config 1b --batch 2 --mode compile --dtype bf16 --steps 6 \
  --warmup 2 --accum 1,8
summary
bench "1b tokshard" 40 90 "$E" tokshard-bench-gpu --profile 1 1b 2 2048 6 2 bf16
summary
bench "1b tokshard accum 8" 40 90 "$E" tokshard-bench-gpu --accum 8 1b 2 2048 3 1 bf16
summary

step nccl 40 170 "$OUT/3-nccl.log" "${CT[@]}" -L gpu -R '^cuda_(comm|parallel)'
summary

# ---- each failed test again, alone, with synchronous launches and NCCL's INFO ----
failed=$(cat "$OUT/2-tests.log" "$OUT/3-nccl.log" 2>/dev/null |
  sed -n 's/^[[:space:]]*[0-9]* - \(cuda_[A-Za-z0-9_]*\) (\(Failed\|Timeout\|Not Run\|Exception\).*/\1/p' | sort -u)
for t in $failed; do
  CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV \
    step "rerun $t" 40 90 "$OUT/4-rerun.log" "${CT[@]}" -R "^$t\$" -V
done
summary

bench "small tokshard" 30 60 "$E" tokshard-bench-gpu --profile 2 124m 8 1024 10 3 bf16
bench "small torch eager" 30 60 python3 "$A" --config 124m --batch 8 --mode eager --dtype bf16
summary
bench "small torch.compile" 60 90 python3 "$A" --config 124m --batch 8 --mode compile --dtype bf16
summary
log "done in $(now)s of ${DEADLINE}s"
summary
exit 0
