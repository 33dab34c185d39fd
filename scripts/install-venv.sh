#!/usr/bin/env bash
# Creates the project-local venv (.venv, ignored by git) with the Python peers
# the interop tests check tokshard against, over Debian's python3-torch and
# numpy (--system-site-packages):
#   megatron-core 0.8.0 (--no-deps: newer versions need PyTorch 2; its indexed
#   dataset code needs only torch and numpy), transformers 4.45.2 (with its
#   dependencies: tokenizers, huggingface_hub, safetensors, ...), tiktoken
#   0.14.0 (the reference of tiktoken files), bpe-openai 0.1.4 (for the real
#   cl100k_base and o200k_base ranks files its wheel carries), and tokshard's
#   own Python package from python/; .venv-arrow with the pyarrow wheel
#   (the Parquet input's Arrow C++, below); and .venv-train with the peers of
#   byte-level BPE training (below).
# Idempotent: packages already at the pinned versions are left alone.
# Usage: scripts/install-venv.sh   (needs python3-venv and network access to PyPI)
#        scripts/install-venv.sh --train-peers   (.venv-train alone)
set -euo pipefail
cd "$(dirname "$0")/.."

# .venv-train: Hugging Face tokenizers 0.23.3 (its BpeTrainer is the
# reference of train-tokenizer --model-type byte-bpe) and gigatoken 0.10.0
# (train_bpe, the benchmark's other peer). A venv of its own: .venv pins
# transformers 4.45.2, which needs tokenizers 0.20.
train_peers() {
  local v=.venv-train
  [[ -x $v/bin/python ]] || /usr/bin/python3 -m venv "$v"
  "$v/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('tokenizers') != '0.23.3' or m.version('gigatoken') != '0.10.0')" 2>/dev/null ||
    "$v/bin/python" -m pip install -q --disable-pip-version-check tokenizers==0.23.3 gigatoken==0.10.0
  "$v/bin/python" -c "import tokenizers, gigatoken" ||
    { echo "install-venv: $v cannot import tokenizers and gigatoken" >&2; return 1; }
}
if [[ ${1:-} == --train-peers ]]; then
  train_peers
  echo "install-venv: .venv-train ready (tokenizers 0.23.3, gigatoken 0.10.0)"
  exit 0
fi
venv=.venv
py=$venv/bin/python
if [[ ! -x $py ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
have() { "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
pip=("$py" -m pip install -q --disable-pip-version-check)
have megatron-core 0.8.0 || "${pip[@]}" --no-deps megatron-core==0.8.0
have transformers 4.45.2 || "${pip[@]}" transformers==4.45.2
have tiktoken 0.14.0 || "${pip[@]}" tiktoken==0.14.0
have bpe-openai 0.1.4 || "${pip[@]}" --no-deps bpe-openai==0.1.4
if [[ -f python/pyproject.toml ]]; then
  "${pip[@]}" --no-deps --no-build-isolation ./python
fi
"$py" -c "import torch, numpy, transformers, tiktoken, bpe_openai, megatron.core.datasets.indexed_dataset" ||
  { echo "install-venv: $venv cannot import its peers" >&2; exit 1; }
# .venv-arrow: the pyarrow wheel, whose Arrow C++ libraries and headers
# (libarrow, libparquet) the Parquet input is built against
# (cmake/parquet.cmake) and whose Python side writes the tests' Parquet
# files. A venv of its own, without Debian's packages: pyarrow 26 needs NumPy
# 2, and Debian's PyTorch needs its NumPy 1.24.
arrow=.venv-arrow
PYARROW_VERSION=26.0.1
[[ -x $arrow/bin/python ]] || /usr/bin/python3 -m venv "$arrow"
"$arrow/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('pyarrow') != '$PYARROW_VERSION')" 2>/dev/null ||
  "$arrow/bin/python" -m pip install -q --disable-pip-version-check "pyarrow==$PYARROW_VERSION"
"$arrow/bin/python" -c "import pyarrow.parquet" ||
  { echo "install-venv: $arrow cannot import pyarrow.parquet" >&2; exit 1; }
train_peers
echo "install-venv: .venv-train ready (tokenizers 0.23.3, gigatoken 0.10.0)"
echo "install-venv: $venv ready (torch $("$py" -c 'import torch; print(torch.__version__)'), transformers 4.45.2, tiktoken 0.14.0, megatron-core 0.8.0); $arrow ready (pyarrow $PYARROW_VERSION)"
