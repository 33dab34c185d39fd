#!/usr/bin/env bash
# bench_parquet.sh - tokshard build from Parquet against the same documents as
# JSON Lines, and Arrow's own read rate of the column, in one run on this
# machine (docs/BENCHMARKS.md, "Parquet input").
#
# Text: the Python 3.11 docs (python3.11-doc, one document per file) and the
# GCIDE dictionary (dict-gcide, one document per blank-line paragraph),
# written with pyarrow (.venv-arrow) as one Parquet file (zstd, row groups of
# 16384 rows) and as one JSON Lines file, same documents in the same order.
# For --threads 1 and 2, each build runs in a fresh process, --reps times
# (median), timed by /usr/bin/time: MB of text per wall second and per
# CPU-second (user + sys). The shards of the two builds are compared byte for
# byte. Arrow's read: pyarrow reads the column of every row group, one CPU
# thread, best of 3 (the bound that reading puts on a build).
# gigatoken's ParquetFileSource, when --gigatoken PYTHON names a Python with
# gigatoken installed (python3 -m venv V && V/bin/pip install gigatoken), on
# the same file with the same sentencepiece model, 1 and 2 threads, timed
# the same way (its tokenizer load included), and its ids compared with the
# Parquet build's (documents, tokens, SHA-1 of the concatenated ids).
#
# This is a benchmark, not a test: nothing is asserted about time.
# usage: bench/bench_parquet.sh [--work DIR] [--reps N] [--tokenizer MODEL] [--gigatoken PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=/tmp/bench-parquet reps=3 tok="" gt=""
while (($#)); do
  case $1 in
    --work) work=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --tokenizer) tok=$2; shift 2 ;;
    --gigatoken) gt=$2; shift 2 ;;
    *) echo "bench_parquet: unknown option $1" >&2; exit 2 ;;
  esac
done
tks=$root/build/bin/tokshard
py=$root/.venv-arrow/bin/python
"$tks" --version | grep -q "parquet input: Apache Arrow" || { echo "bench_parquet: tokshard reads no Parquet" >&2; exit 2; }
mkdir -p "$work"
if [[ ! -f $work/docs.parquet ]]; then
  "$py" - "$work" <<'PY'
import json, pathlib, subprocess, sys
import pyarrow as pa, pyarrow.parquet as pq
w = pathlib.Path(sys.argv[1])
src = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
docs = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(src.rglob("*.txt"))]
g = subprocess.run(["zcat", "/usr/share/dictd/gcide.dict.dz"], capture_output=True).stdout.decode("utf-8", "replace")
docs += [p for p in g.split("\n\n") if p.strip()]
pq.write_table(pa.table({"text": docs}), w / "docs.parquet", compression="zstd", row_group_size=16384)
with open(w / "docs.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
(w / "text_bytes").write_text(str(sum(len(d.encode()) for d in docs)))
print(f"{len(docs)} documents, {sum(len(d.encode()) for d in docs) / 1e6:.1f} MB of text")
PY
fi
if [[ -z $tok ]]; then
  [[ -f $work/tok.model ]] || "$tks" train-tokenizer --output "$work/tok" --vocab-size 8000 \
    --input-sentence-size 200000 "$work/docs.jsonl" >/dev/null
  tok=$work/tok.model
fi
mb=$(awk '{printf "%.2f", $1 / 1e6}' "$work/text_bytes")
echo "# $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
echo "# text: $mb MB in $(ls -l "$work/docs.parquet" | awk '{printf "%.1f", $5 / 1e6}') MB of Parquet, $(ls -l "$work/docs.jsonl" | awk '{printf "%.1f", $5 / 1e6}') MB of JSON Lines; tokenizer $tok"
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
# run LABEL CMD...: reps fresh processes; prints wall and CPU medians
run() {
  local label=$1 walls=() cpus=() load
  shift
  load=$(cut -d' ' -f1 /proc/loadavg)
  for _ in $(seq "$reps"); do
    rm -rf "$work/out" "$work/out.partial"
    /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >/dev/null 2>&1
    read -r e u s <"$work/time"
    walls+=("$e")
    cpus+=("$(awk -v u="$u" -v s="$s" 'BEGIN {print u + s}')")
  done
  local w c
  w=$(printf '%s\n' "${walls[@]}" | median)
  c=$(printf '%s\n' "${cpus[@]}" | median)
  printf '| %s | %.2f | %.2f | %.1f | %.1f | %s |\n' "$label" "$w" "$c" \
    "$(awk -v m="$mb" -v w="$w" 'BEGIN {print m / w}')" "$(awk -v m="$mb" -v c="$c" 'BEGIN {print m / c}')" "$load"
}
echo "| run | wall s | CPU s | MB/s wall | MB per CPU-s | load before |"
echo "|---|---:|---:|---:|---:|---:|"
for t in 1 2; do
  run "tokshard build, Parquet, $t thread(s)" "$tks" build -q --threads "$t" --tokenizer "$tok" --output "$work/out" "$work/docs.parquet"
  run "tokshard build, JSON Lines, $t thread(s)" "$tks" build -q --threads "$t" --tokenizer "$tok" --output "$work/out" "$work/docs.jsonl"
done
rm -rf "$work/p" "$work/j"
"$tks" build -q --tokenizer "$tok" --output "$work/p" "$work/docs.parquet"
"$tks" build -q --tokenizer "$tok" --output "$work/j" "$work/docs.jsonl"
same=yes
for f in "$work"/j/shard-*.tks; do cmp -s "$f" "$work/p/$(basename "$f")" || same=no; done
echo "# shards of the Parquet and JSON Lines builds byte-identical: $same"
"$py" - "$work/docs.parquet" "$mb" <<'PY'
import sys, time
import pyarrow as pa, pyarrow.parquet as pq
pa.set_cpu_count(1)
pa.set_io_thread_count(1)
best = 1e9
for _ in range(3):
    t = time.perf_counter()
    f = pq.ParquetFile(sys.argv[1])
    for g in range(f.num_row_groups):
        f.read_row_group(g, columns=["text"], use_threads=False)
    best = min(best, time.perf_counter() - t)
print(f"# Arrow (pyarrow {pa.__version__}) reads the column on 1 thread: {float(sys.argv[2]) / best:.0f} MB/s of text (best of 3)")
PY
if [[ -n $gt ]]; then
  # gigatoken: the sentencepiece model through Tokenizer.from_sentencepiece,
  # the file through ParquetFileSource; RAYON_NUM_THREADS sets its threads
  cat >"$work/gt.py" <<'PY'
import hashlib, sys
import numpy as np
import gigatoken
tok = gigatoken.Tokenizer.from_sentencepiece(sys.argv[2])
ids = tok.encode_files(gigatoken.ParquetFileSource([sys.argv[1]], column="text"), parallel=sys.argv[3] != "1")
if len(sys.argv) < 5:  # timed: load and encode only
    print(len(ids))
    sys.exit(0)
h, n, docs = hashlib.sha1(), 0, 0
for d in ids:
    a = np.asarray(d, dtype=np.uint32)
    if len(a):
        h.update(a.tobytes()); n += len(a); docs += 1
print(docs, n, h.hexdigest())
PY
  for t in 1 2; do
    RAYON_NUM_THREADS=$t run "gigatoken $("$gt" -c 'import importlib.metadata as m; print(m.version("gigatoken"))') ParquetFileSource, $t thread(s)" \
      "$gt" "$work/gt.py" "$work/docs.parquet" "$tok" "$t"
  done
  "$gt" "$work/gt.py" "$work/docs.parquet" "$tok" 2 ids >"$work/gt.ids"
  "$root/.venv/bin/python" - "$work/p" <<'PY' >"$work/tks.ids"
import hashlib, sys
import numpy as np
import tokshard
ds = tokshard.Dataset(sys.argv[1])
h, n, docs = hashlib.sha1(), 0, 0
for d in ds.docs():
    a = np.asarray(d, dtype=np.uint32)
    h.update(a.tobytes()); n += len(a); docs += 1
print(docs, n, h.hexdigest())
PY
  echo "# ids (documents, tokens, SHA-1 of the ids): gigatoken $(cat "$work/gt.ids"); tokshard $(cat "$work/tks.ids")"
fi
