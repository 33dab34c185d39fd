#!/usr/bin/env bash
# The main job, end to end on real text from Debian packages:
#   1. install dependencies (scripts/install-deps.sh) and build (CMake, Release)
#   2. train a sentencepiece BPE tokenizer on the GNU Collaborative International
#      Dictionary of English (dict-gcide) and the Python 3.11 documentation
#      sources (python3.11-doc)
#   3. build token datasets with it, with all cores: each corpus on its own
#      (the two sources of the training mixture) and both together
#   4. audit them bit for bit, check every document of the combined one against
#      its source text (audit --against-source --all), and print what is in them
#   5. train a small LLaMA-style model (2.8 M parameters) for a few minutes on
#      the CPU on a mixture of the two sources (60% dictionary, 40% Python
#      docs), attention kept inside each document (--doc-mask): a falling loss,
#      a validation loss per source, and a loss curve (runs/main/train/loss.svg)
#   6. generate text from the trained checkpoint: one prompt per source
# Output goes to runs/main/ (replaced on every run). About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
tks=$root/build/bin/tokshard

# shellcheck source=samples/corpus.sh
source samples/corpus.sh
gcide=${TKS_CORPUS[0]} pydocs=${TKS_CORPUS[1]}
out=runs/main
rm -rf "$out" "$out.partial"
mkdir -p "$out"

echo "== 1/6 train a BPE tokenizer (vocab $TKS_VOCAB) on ${TKS_CORPUS[*]}"
"$tks" train-tokenizer --output "$out/tokenizer" --model-type bpe --vocab-size "$TKS_VOCAB" \
  --byte-fallback --doc-split blank-line --input-sentence-size 400000 "${TKS_CORPUS[@]}"

echo "== 2/6 build the datasets: the dictionary, the Python docs, and both in one"
B=(--tokenizer "$out/tokenizer.model" --doc-split blank-line --append-eos --shard-tokens 4M)
"$tks" build "${B[@]}" --output "$out/gcide" "$gcide"
"$tks" build "${B[@]}" --output "$out/python" "$pydocs"
"$tks" build -q "${B[@]}" --output "$out/dataset" "${TKS_CORPUS[@]}"

echo "== 3/6 audit every byte and every id, and the ids against the source text"
for d in gcide python dataset; do
  "$tks" audit "$out/$d" --tokenizer "$out/tokenizer.model" --model-vocab "$TKS_VOCAB"
done
echo "-- every document of the combined dataset read again from its source and encoded again"
"$tks" audit "$out/dataset" --against-source --all

echo "== 4/6 what is in them"
for d in gcide python; do
  "$tks" inspect "$out/$d" --top 8
  echo "first document of $d, decoded:"
  "$tks" cat "$out/$d" --doc 0
done

echo "== 5/6 train a small LLaMA-style model on the mixture, attention inside each document (CPU)"
"$root/build/bin/tokshard-train" --dataset gcide="$out/gcide":0.6 --dataset python="$out/python":0.4 \
  --doc-mask --out "$out/train" \
  --dim 128 --n-layers 4 --n-heads 4 --n-kv-heads 2 --seq-len 128 --global-batch 16 \
  --steps 150 --warmup 15 --lr 3e-3 --min-lr 3e-4 --eval-every 25 --save-every 50

echo "== 6/6 generate from the last checkpoint: one prompt per source (at least 48 tokens each)"
for prompt in 'Garden \Gar"den\, n.' 'Abandon \A*ban"don\, v. t.' \
  'The :func:`open` function' 'Return a new list'; do
  echo "--- prompt: $prompt"
  # the tokenizer keeps no newlines (sentencepiece normalizes them to spaces):
  # the continuation is folded to lines of 100 characters for reading
  "$root/build/bin/tokshard-generate" --checkpoint "$out/train" --prompt "$prompt" \
    --min-tokens 48 --max-tokens 80 --temperature 0.7 --seed 1 | fold -s -w 100
done
echo
echo "main job done: datasets in $out/{gcide,python,dataset}, model in $out/train" \
  "(loss curves, one validation curve per source: $out/train/loss.svg)"
