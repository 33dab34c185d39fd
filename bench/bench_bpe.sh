#!/usr/bin/env bash
# The byte-level BPE benchmark (bench/bench_bpe.py) with its peers pinned in
# .venv-bench: Hugging Face tokenizers 0.23.3, tiktoken 0.14.0, fastokens
# 0.3.5, gigatoken 0.10.0, bpe-openai 0.1.4 (whose wheel carries OpenAI's
# cl100k_base and o200k_base ranks), and llama-models 0.3.0 without its
# dependencies (only its Llama 3 tiktoken model is used, for --production).
# Builds tokshard Release in build-release/ first.
# Usage: bench/bench_bpe.sh [bench_bpe.py options, e.g. --mb 40 --memory]
#   the production tokenizers on the whole Linux tree (1.3 GB):
#   bench/bench_bpe.sh --linux /path/to/linux-source-6.1 --texts linux-all --production
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-bench
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check tokenizers==0.23.3 tiktoken==0.14.0 \
  fastokens==0.3.5 gigatoken==0.10.0 bpe-openai==0.1.4 numpy
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps llama-models==0.3.0
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTKS_CUDA=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target tokshard tokshard_full tokshard-bpe-cpu >/dev/null
exec "$venv/bin/python" bench/bench_bpe.py --bin build-release/bin "$@"
