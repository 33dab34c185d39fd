#!/usr/bin/env bash
# bench_dist.sh - the coordination costs of a distributed `tokshard build`,
# measured on one machine, and the scaling they project (docs/SCALE.md).
#
# Measures, each --runs times (median and min reported, with the 1-minute load):
#   plan      `tokshard build` of a generated tree of --files files (default
#             100,000 files of one short line): the summary's "plan" (lock,
#             listing, units, build id, OUT.partial), and its "manifest"
#             (every input in the provenance)
#   np        `mpirun --oversubscribe -np --np (64) tokshard build --threads 1`
#             of 4 MB of GCIDE in 64 KiB units (~62 units) and 2,000-token
#             shards (~700 shards), output on --out-dir: the hand-outs
#             (MPI_Fetch_and_op on rank 0's window, every rank's mean and the
#             job's max), the placing of the shards (allreduce of the shard
#             counts, each rank's header rewrites, fsyncs and renames, the
#             records gathered on rank 0) and the manifest
#   manifest  `tokshard build` of the same text into --shm (tmpfs: no disk
#             wait) with 2,000- and 100-token shards (~540 and ~10,800
#             shards): the manifest's cost per shard, from the difference;
#             and `dd conv=fsync` of 40 MB into --out-dir: the cost of
#             writing a manifest's bytes durably
#   encode    `tokshard build --threads 1` of the same text, one unit: text
#             MB/s of one encoding thread, and text bytes per token
# then prints the projection of docs/SCALE.md (bench/scale_model.py) from them.
# Not a test: nothing is asserted. The machine may be shared: the load is
# printed with each figure.
#
# usage: bench/bench_dist.sh [--files N] [--np N] [--runs N] [--work DIR]
#                            [--out-dir DIR (default: WORK)] [--shm DIR (/dev/shm)]
#                            [--bin TOKSHARD]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
FILES=100000
NP=64
RUNS=3
WORK=/var/tmp/tokshard-bench-dist
OUT=
SHM=/dev/shm
BIN="$ROOT/build/bin/tokshard"
while [[ $# -gt 0 ]]; do
  case $1 in
  --files) FILES=$2; shift 2 ;;
  --np) NP=$2; shift 2 ;;
  --runs) RUNS=$2; shift 2 ;;
  --work) WORK=$2; shift 2 ;;
  --out-dir) OUT=$2; shift 2 ;;
  --shm) SHM=$2; shift 2 ;;
  --bin) BIN=$2; shift 2 ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
need_tokshard "$BIN"
need_mpirun bench_dist.sh
mpi_env
mkdir -p "$WORK"
cd "$WORK"
OUT=${OUT:-$WORK}
mkdir -p "$OUT"

# text and tokenizer (BPE, vocab 8000, on GCIDE)
if [[ ! -s gcide.txt ]]; then
  set +o pipefail
  zcat /usr/share/dictd/gcide.dict.dz | head -c 4000000 >gcide.txt.tmp
  set -o pipefail
  mv gcide.txt.tmp gcide.txt
fi
[[ -s tok.model ]] || "$BIN" train-tokenizer --output tok --vocab-size 8000 --doc-split blank-line gcide.txt >/dev/null
# the tree: FILES files of one line each, 1,000 per directory
if [[ ! -d tree-$FILES ]]; then
  python3 - "$FILES" <<'EOF'
import os, random, sys
n = int(sys.argv[1]); random.seed(1)
words = open("gcide.txt", encoding="utf-8", errors="replace").read().split()[:20000]
for i in range(n):
    d = "tree-%d.tmp/d%04d" % (n, i // 1000)
    if i % 1000 == 0: os.makedirs(d)
    with open("%s/f%04d.txt" % (d, i % 1000), "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(12)) + "\n")
EOF
  mv "tree-$FILES.tmp" "tree-$FILES"
fi
load() { awk '{print $1}' /proc/loadavg; }
# field LABEL: the seconds after LABEL in the last summary (out.txt)
field() { grep -oE "$1 [0-9][0-9.]*" out.txt | head -1 | awk '{print $NF}'; }
stats() { sort -g | awk '{a[NR]=$1} END {printf "%s %s", a[int((NR+1)/2)], a[1]}'; } # median min

echo "bench_dist: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
plan=() manifest=() loads=()
for r in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/p"
  loads+=("$(load)")
  "$BIN" build --threads 2 --tokenizer tok.model --doc-split line --output "$OUT/p" "tree-$FILES" >out.txt
  plan+=("$(field plan)") manifest+=("$(field manifest)")
done
echo "plan, $FILES files: median/min $(printf '%s\n' "${plan[@]}" | stats) s; manifest $(printf '%s\n' "${manifest[@]}" | stats) s; load ${loads[*]}"
PLAN=$(printf '%s\n' "${plan[@]}" | stats | cut -d' ' -f1)
MFILE=$(printf '%s\n' "${manifest[@]}" | stats | cut -d' ' -f1)

ho=() homax=() place=() man=() loads=()
for r in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/n"
  loads+=("$(load)")
  mpirun --oversubscribe -np "$NP" "$BIN" build --threads 1 --tokenizer tok.model --doc-split blank-line \
    --unit-bytes 64K --shard-tokens 2000 --chunk-bytes 4K --output "$OUT/n" gcide.txt >out.txt 2>err.txt
  h=$(grep -o "hand-outs of [0-9]* us (at most [0-9]* us)" out.txt)
  ho+=("$(echo "$h" | awk '{print $3}')") homax+=("$(echo "$h" | awk '{print $7}')")
  place+=("$(field placed)") man+=("$(field manifest)")
done
SHARDS=$(ls "$OUT"/n/shard-*.tks | wc -l)
UNITS=$(grep -o "units  *[0-9]*" out.txt | awk '{print $2}')
HANDOUTS=$(grep -o "[0-9]* hand-outs" out.txt | awk '{print $1}')
echo "np $NP: $UNITS units, $SHARDS shards, $HANDOUTS hand-outs: mean $(printf '%s\n' "${ho[@]}" | stats) us," \
  "max $(printf '%s\n' "${homax[@]}" | stats) us; shards placed $(printf '%s\n' "${place[@]}" | stats) s;" \
  "manifest $(printf '%s\n' "${man[@]}" | stats) s; load ${loads[*]}"
HO=$(printf '%s\n' "${ho[@]}" | stats | cut -d' ' -f1)
HOMAX=$(printf '%s\n' "${homax[@]}" | stats | cut -d' ' -f1)
PLACE=$(printf '%s\n' "${place[@]}" | stats | cut -d' ' -f1)
MSHARD=$(printf '%s\n' "${man[@]}" | stats | cut -d' ' -f1)

m1=() m2=() loads=()
for r in $(seq 1 "$RUNS"); do
  loads+=("$(load)")
  for st in 2000 100; do
    rm -rf "$SHM/tks-bench-m"
    "$BIN" build --threads 2 --tokenizer tok.model --doc-split blank-line --shard-tokens $st --chunk-bytes 4K \
      --output "$SHM/tks-bench-m" gcide.txt >out.txt
    n=$(ls "$SHM"/tks-bench-m/shard-*.tks | wc -l)
    [[ $st == 2000 ]] && { m1+=("$(field manifest)"); n1=$n; } || { m2+=("$(field manifest)"); n2=$n; }
  done
done
MANIFEST_BYTES=$(stat -c %s "$SHM/tks-bench-m/manifest.json")
rm -rf "$SHM/tks-bench-m"
M1=$(printf '%s\n' "${m1[@]}" | stats | cut -d' ' -f1)
M2=$(printf '%s\n' "${m2[@]}" | stats | cut -d' ' -f1)
MSLOPE=$(awk -v a="$M1" -v b="$M2" -v x="$n1" -v y="$n2" 'BEGIN { printf "%.9f", (b - a) / (y - x) }')
t0=$(date +%s.%N)
dd if=/dev/zero of="$OUT/tks-bench-dd" bs=1M count=40 conv=fsync status=none
WRITE=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.4f", (b - a) / 40e6 * 1e6 }') # s per MB
rm -f "$OUT/tks-bench-dd"
echo "manifest: $n1 shards $M1 s, $n2 shards $M2 s (median): $(awk -v s="$MSLOPE" 'BEGIN { printf "%.2f", s * 1e6 }') us a" \
  "shard ($MANIFEST_BYTES bytes for $n2); 40 MB written and fsynced: $WRITE s per MB; load ${loads[*]}"

rates=() loads=()
for r in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/e"
  loads+=("$(load)")
  "$BIN" build --threads 1 --tokenizer tok.model --doc-split blank-line --output "$OUT/e" gcide.txt >out.txt
  rates+=("$(grep -o "[0-9.]* MB/s of text" out.txt | awk '{print $1}')")
done
TOKENS=$(grep -o "tokens  *[0-9]*" out.txt | awk '{print $2}')
BPT=$(awk -v b="$(stat -c %s gcide.txt)" -v t="$TOKENS" 'BEGIN { printf "%.2f", b / t }')
RATE=$(printf '%s\n' "${rates[@]}" | sort -g | tail -1)
echo "encode, 1 thread: $(printf '%s\n' "${rates[@]}" | stats) MB/s (median min; best $RATE), $BPT bytes per token; load ${loads[*]}"
rm -rf "$OUT/p" "$OUT/n" "$OUT/e"

python3 "$HERE/scale_model.py" --plan "$PLAN" --plan-files "$FILES" --manifest-files "$MFILE" \
  --handout-us "$HO" --handout-max-us "$HOMAX" --place "$PLACE" --place-shards "$SHARDS" \
  --manifest-per-shard "$MSLOPE" --manifest-bytes-per-shard $((MANIFEST_BYTES / n2)) --write-per-mb "$WRITE" \
  --rate "$RATE" --bytes-per-token "$BPT"
