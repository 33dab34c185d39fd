#!/usr/bin/env bash
# bench_core.sh - trainer-core benchmarks: tokens/s of the code at a
# revision and of the current source against PyTorch eager (fp32 and bf16),
# peak memory at T = 2048 and 4096, and the host's wait on the backend, all in
# one run so the ratios share the machine's load (bench/core_bench.py says
# what each part measures). A benchmark: nothing is asserted.
#
# usage: bench/bench_core.sh --before REV [--work DIR] [--threads N] [--rounds R] [--parts LIST]
#   --before REV   the code to compare against (required: a commit, tag or branch;
#                  docs/BENCHMARKS.md names the revisions its tables compared)
#   --work DIR     scratch [/var/tmp/tokshard-core-bench]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BEFORE=
WORK=/var/tmp/tokshard-core-bench
ARGS=()
while (($#)); do
  case "$1" in
    --before) BEFORE="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --threads|--rounds|--parts|--timed-steps|--warmup-steps) ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_core.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
[[ -n $BEFORE ]] || { echo "bench_core.sh: --before REV is required (the code to compare against)" >&2; exit 2; }
mkdir -p "$WORK" "$ROOT/bench/results"
echo "building the current source (Release) in $ROOT/build-tbench"
cmake -S "$ROOT" -B "$ROOT/build-tbench" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$ROOT/build-tbench" -j2 --target tokshard tokshard-train >/dev/null
echo "building $BEFORE (Release) in $WORK/before"
rm -rf "$WORK/before-src" && mkdir -p "$WORK/before-src"
git -C "$ROOT" archive "$BEFORE" | tar -x -C "$WORK/before-src"
cmake -S "$WORK/before-src" -B "$WORK/before" -DCMAKE_BUILD_TYPE=Release -DTKS_WERROR=OFF >/dev/null
cmake --build "$WORK/before" -j2 --target tokshard-train >/dev/null 2>&1
DATA="$WORK/gcide-8000"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "building a dataset from the first 8 MB of gcide (vocab 8000)"
  (zcat /usr/share/dictd/gcide.dict.dz || true) | head -c 8M > "$WORK/gcide-8M.txt" # zcat: SIGPIPE
  "$ROOT/build-tbench/bin/tokshard" train-tokenizer --output "$WORK/gcide-8000" --vocab-size 8000 \
    --doc-split blank-line "$WORK/gcide-8M.txt" >/dev/null
  "$ROOT/build-tbench/bin/tokshard" build --tokenizer "$WORK/gcide-8000.model" --output "$DATA" \
    --doc-split blank-line --quiet "$WORK/gcide-8M.txt" >/dev/null
fi
TAG="$(date +%Y%m%d-%H%M%S)"
echo "uptime: $(uptime)"
python3 "$HERE/core_bench.py" --before-bin "$WORK/before/bin" --after-bin "$ROOT/build-tbench/bin" \
  --dataset "$DATA" --work "$WORK" "${ARGS[@]}" | tee "$WORK/core-$TAG.log"
tail -1 "$WORK/core-$TAG.log" > "$ROOT/bench/results/core-$TAG.json"
echo "uptime: $(uptime)"
echo "results: bench/results/core-$TAG.json"
