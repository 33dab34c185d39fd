#!/usr/bin/env bash
# Parquet in: the Python 3.11 documentation sources (python3.11-doc), one
# document per file, written with pyarrow as Parquet (zstd, row groups of 64
# documents) and as JSON Lines; tokshard builds a dataset from each and shows
# that their shards are byte-identical, then audits the Parquet one. Uses the
# tokenizer of samples/main.sh (runs/main/tokenizer.model) when it exists,
# else trains a small one. Needs the Parquet support (scripts/install-venv.sh
# installs the pyarrow wheel in .venv-arrow; `tokshard --version` says).
# Output goes to runs/parquet/ (replaced on every run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[[ -x build/bin/tokshard ]] || { scripts/install-deps.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build build -j"$(nproc)" >/dev/null; }
tks=$root/build/bin/tokshard
if ! "$tks" --version | grep -q "parquet input: Apache Arrow"; then
  "$tks" --version >&2
  echo "parquet: this tokshard reads no Parquet: run scripts/install-venv.sh, then build again" >&2
  exit 2
fi
# shellcheck source=samples/corpus.sh
source samples/corpus.sh
out=runs/parquet
rm -rf "$out" && mkdir -p "$out"
tok=runs/main/tokenizer.model
if [[ ! -f $tok ]]; then
  "$tks" train-tokenizer --output "$out/tokenizer" --vocab-size 4000 --input-sentence-size 100000 "${TKS_CORPUS[1]}"
  tok=$out/tokenizer.model
fi

echo "== write the Python docs as Parquet and as JSON Lines (pyarrow)"
.venv-arrow/bin/python - "${TKS_CORPUS[1]}" "$out" <<'PY'
import json, pathlib, sys
import pyarrow as pa, pyarrow.parquet as pq
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
files = sorted(p for p in src.rglob("*") if p.is_file())
docs = [p.read_text(encoding="utf-8", errors="replace") for p in files]
table = pa.table({"path": [str(p.relative_to(src)) for p in files], "text": docs})
pq.write_table(table, out / "pydocs.parquet", compression="zstd", row_group_size=64)
with open(out / "pydocs.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
m = pq.ParquetFile(out / "pydocs.parquet").metadata
print(f"{len(docs)} documents, {sum(len(d.encode()) for d in docs) / 1e6:.1f} MB of text; "
      f"pydocs.parquet: {m.num_row_groups} row groups, "
      f"{(out / 'pydocs.parquet').stat().st_size / 1e6:.1f} MB on disk")
PY

echo "== build from Parquet (row groups as work units of about 2 MB of text) and from JSON Lines"
B=(--tokenizer "$tok" --append-eos --shard-tokens 1M --unit-bytes 2M)
"$tks" build "${B[@]}" --output "$out/from-parquet" "$out/pydocs.parquet"
"$tks" build -q "${B[@]}" --unit-bytes 1G --output "$out/from-jsonl-one-unit" "$out/pydocs.jsonl"
"$tks" build -q "${B[@]}" --unit-bytes 1G --output "$out/from-parquet-one-unit" "$out/pydocs.parquet"
same=1
for f in "$out"/from-jsonl-one-unit/shard-*.tks; do
  cmp -s "$f" "$out/from-parquet-one-unit/$(basename "$f")" || same=0
done
((same)) && echo "parquet: one unit each: the Parquet and JSON Lines shards are byte-identical" ||
  { echo "parquet: the Parquet and JSON Lines shards differ" >&2; exit 1; }

echo "== audit, and the first document"
"$tks" audit "$out/from-parquet" --tokenizer "$tok"
"$tks" cat "$out/from-parquet" --doc 0 | head -5
