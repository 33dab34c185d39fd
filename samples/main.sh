#!/usr/bin/env bash
# The main job, end to end on real text from Debian packages:
#   1. install dependencies (tools/install-deps.sh) and build (CMake, Release)
#   2. train a sentencepiece BPE tokenizer on the GNU Collaborative International
#      Dictionary of English (dict-gcide) and the Python 3.11 documentation
#      sources (python3.11-doc)
#   3. build a token dataset from the same text with all cores
#   4. audit it bit for bit and print what is in it
#   5. train a small LLaMA-style model (2.8 M parameters) on it for a few minutes
#      on the CPU, with a falling loss and a loss curve (runs/main/train/loss.svg)
#   6. generate text from the trained checkpoint
# Output goes to runs/main/ (replaced on every run). About 5 minutes on 2 cores.
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

echo "== 1/6 train a BPE tokenizer (vocab $TKS_VOCAB) on ${TKS_CORPUS[*]}"
"$tks" train-tokenizer --output "$out/tokenizer" --model-type bpe --vocab-size "$TKS_VOCAB" \
  --byte-fallback --doc-split blank-line --input-sentence-size 400000 "${TKS_CORPUS[@]}"

echo "== 2/6 build the dataset"
"$tks" build --tokenizer "$out/tokenizer.model" --output "$out/dataset" \
  --doc-split blank-line --append-eos --shard-tokens 4M "${TKS_CORPUS[@]}"

echo "== 3/6 audit every byte and every id"
"$tks" audit "$out/dataset" --tokenizer "$out/tokenizer.model" --model-vocab "$TKS_VOCAB"

echo "== 4/6 what is in it"
"$tks" inspect "$out/dataset" --top 12
echo "first document, decoded:"
"$tks" cat "$out/dataset" --doc 0

echo "== 5/6 train a small LLaMA-style model on it (CPU)"
"$root/build/bin/tokshard-train" --dataset "$out/dataset" --out "$out/train" \
  --dim 128 --n-layers 4 --n-heads 4 --n-kv-heads 2 --seq-len 128 --global-batch 16 \
  --steps 150 --warmup 15 --lr 3e-3 --min-lr 3e-4 --eval-every 25 --save-every 50

echo "== 6/6 generate from the last checkpoint"
"$root/build/bin/tokshard-generate" --checkpoint "$out/train" --prompt "Abandon, v. t." \
  --max-tokens 60 --temperature 0.7 --seed 1
echo
echo "main job done: dataset in $out/dataset, model in $out/train (loss curve $out/train/loss.svg)"
