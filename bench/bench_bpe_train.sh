#!/usr/bin/env bash
# The byte-level BPE training benchmark (bench/bench_bpe_train.py) with its
# peers pinned in .venv-bench: Hugging Face tokenizers 0.23.3 (BpeTrainer)
# and gigatoken 0.10.0 (train_bpe). Builds tokshard Release in build-release/
# first.
# Usage: bench/bench_bpe_train.sh [bench_bpe_train.py options]
#   a 40 MB slice of the Linux tree's text and the main job's corpus:
#     nice -n 15 bench/bench_bpe_train.sh --slice-mb 40
#   the whole tree (1.3 GB; hours of tokenizers' time):
#     bench/bench_bpe_train.sh --linux-jsonl linux-all.jsonl --out bpe_train.md
#     (or --linux /path/to/linux-source-6.1 to write that file first)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-bench
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('tokenizers') != '0.23.3' or m.version('gigatoken') != '0.10.0')" 2>/dev/null ||
  "$venv/bin/python" -m pip install -q --disable-pip-version-check tokenizers==0.23.3 gigatoken==0.10.0
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTKS_CUDA=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target tokshard tokshard_full >/dev/null
exec "$venv/bin/python" bench/bench_bpe_train.py --bin build-release/bin "$@"
