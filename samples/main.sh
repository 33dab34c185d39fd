#!/usr/bin/env bash
# The main job, end to end on real text from Debian packages:
#   1. install dependencies (tools/install-deps.sh) and build (CMake, Release)
#   2. train a sentencepiece BPE tokenizer on the GNU Collaborative International
#      Dictionary of English (dict-gcide) and the Python 3.11 documentation
#      sources (python3.11-doc)
#   3. build a token dataset from the same text with all cores
#   4. audit it bit for bit and print what is in it
# Output goes to runs/main/ (replaced on every run). Takes a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
tks=$root/build/bin/tokshard

# shellcheck source=samples/corpus.sh
source samples/corpus.sh
out=runs/main
rm -rf "$out" "$out.partial"
mkdir -p "$out"

echo "== 1/4 train a BPE tokenizer (vocab $TKS_VOCAB) on ${TKS_CORPUS[*]}"
"$tks" train-tokenizer --output "$out/tokenizer" --model-type bpe --vocab-size "$TKS_VOCAB" \
  --byte-fallback --doc-split blank-line --input-sentence-size 400000 "${TKS_CORPUS[@]}"

echo "== 2/4 build the dataset"
"$tks" build --tokenizer "$out/tokenizer.model" --output "$out/dataset" \
  --doc-split blank-line --append-eos --shard-tokens 4M "${TKS_CORPUS[@]}"

echo "== 3/4 audit every byte and every id"
"$tks" audit "$out/dataset" --tokenizer "$out/tokenizer.model" --model-vocab "$TKS_VOCAB"

echo "== 4/4 what is in it"
"$tks" inspect "$out/dataset" --top 12
echo "first document, decoded:"
"$tks" cat "$out/dataset" --doc 0
echo
echo "main job done: dataset in $out/dataset (manifest: $out/dataset/manifest.json)"
