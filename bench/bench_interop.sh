#!/usr/bin/env bash
# bench_interop.sh - tokshard's interop commands against the peers' own readers,
# side by side in one run on the same data (docs/BENCHMARKS.md, "Interop").
#
#   audit:  tokshard audit --format megatron (structure, every id against the
#           vocabulary, --eod) vs megatron-core 0.8.0's IndexedDataset reading
#           every document and checking its ids (max < vocab, last == EOD) in
#           numpy: the check a Megatron user would write
#   import: tokshard import --format megatron vs the same megatron-core loop
#           (the import reads, checks and writes checksummed shards)
#   python: the tokshard Python package, Dataset(verify=True) (every XXH3 via
#           libxxhash) and a walk of every document, vs tokshard audit of the
#           same dataset
#
# Not a test: nothing is asserted about time. Ratios, medians of --runs runs,
# page cache warm (one untimed run first); the 1-minute load is printed before
# each phase because the machine may be running other work.
# usage: bench/bench_interop.sh [--mb 40] [--runs 3] [--work DIR]   (needs .venv and build/bin)
set -euo pipefail
cd "$(dirname "$0")/.."
mb=40 runs=3 work=runs/bench-interop
while (($#)); do
  case $1 in
  --mb) mb=$2; shift 2 ;; --runs) runs=$2; shift 2 ;; --work) work=$2; shift 2 ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
TKS=$PWD/build/bin/tokshard
PY=$PWD/.venv/bin/python
[[ -x $TKS && -x $PY ]] || { echo "build first (scripts/test.sh) and run scripts/install-venv.sh" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
{ zcat /usr/share/dictd/gcide.dict.dz || true; } | head -c $((mb * 1000000)) >text.txt
"$TKS" train-tokenizer --output tok --vocab-size 8000 --byte-fallback --doc-split blank-line \
  --input-sentence-size 200000 text.txt >/dev/null
"$TKS" build -q --tokenizer tok.model --output data --doc-split blank-line --append-eos text.txt
"$TKS" export --format megatron --copy data mg >/dev/null
prefixes=$(ls mg_*.idx | sed 's/\.idx$//' | tr '\n' ' ')
cat >peer.py <<'PYEOF'
import sys, time, numpy
from megatron.core.datasets.indexed_dataset import IndexedDataset
vocab, eod = int(sys.argv[1]), int(sys.argv[2])
bad = docs = toks = 0
for p in sys.argv[3:]:
    ds = IndexedDataset(p)
    di = ds.document_indices
    for d in range(len(di) - 1):
        x = numpy.concatenate([ds[i] for i in range(di[d], di[d + 1])])
        docs += 1; toks += len(x)
        bad += int(x.max() >= vocab) + int(x[-1] != eod)
print(docs, toks, bad)
PYEOF
cat >pkg.py <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import tokshard
ds = tokshard.Dataset(sys.argv[2], verify=True)
print(ds.n_docs, sum(int(d.max() < ds.vocab_size) for d in ds.docs()))
PYEOF
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
timeit() { # NAME CMD...: median wall seconds of $runs runs after one warm-up
  "${@:2}" >/dev/null 2>&1
  for ((i = 0; i < runs; i++)); do
    local t0=$(date +%s.%N); "${@:2}" >/dev/null 2>&1; local t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
  done | median
}
ntok=$("$TKS" inspect data --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['n_tokens'])")
echo "data: $mb MB of GCIDE, $ntok tokens, $(ls data/shard-*.tks | wc -l) shards; $(nproc) cores"
echo "load before audit: $(cut -d' ' -f1 /proc/loadavg)"
# tokshard audits one prefix per call: the sum over the prefixes
a_all=0; for p in $prefixes; do t=$(timeit audit "$TKS" audit --format megatron "$p" --model-vocab 8000 --eod 2); a_all=$(echo "$a_all + $t" | bc); done
m=$(timeit peer "$PY" peer.py 8000 2 $prefixes)
echo "audit   tokshard audit --format megatron ($(echo $prefixes | wc -w) prefixes): ${a_all}s; megatron-core loop: ${m}s; megatron-core / tokshard = $(echo "scale=1; $m / $a_all" | bc)x"
echo "load before import: $(cut -d' ' -f1 /proc/loadavg)"
imp=0; k=0
for p in $prefixes; do
  t=$(timeit import bash -c "rm -rf imp$k; '$TKS' import --format megatron $p --output imp$k --tokenizer tok.model")
  imp=$(echo "$imp + $t" | bc); k=$((k + 1))
done
echo "import  tokshard import --format megatron: ${imp}s; megatron-core loop (read and check only): ${m}s; ratio import / peer read = $(echo "scale=2; $imp / $m" | bc)"
echo "load before python: $(cut -d' ' -f1 /proc/loadavg)"
pk=$(timeit pkg "$PY" pkg.py "$OLDPWD/python" data)
au=$(timeit audit "$TKS" audit data --threads 1)
echo "python  tokshard package Dataset(verify=True) + every document: ${pk}s; tokshard audit --threads 1: ${au}s; ratio = $(echo "scale=1; $pk / $au" | bc)x"
