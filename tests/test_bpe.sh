#!/usr/bin/env bash
# Byte-level BPE against Hugging Face tokenizers (tests/bpe.cmake).
# Usage: test_bpe.sh peer|ids|long VENV_PYTHON TEST_BPE WORKDIR [MODEL]
#   peer: trains the tokenizers and writes tokenizers' ids (tests/bpe_peer.py)
#   ids MODEL: test_bpe compares tokshard's ids and decodes with them
#   long MODEL: a 1 MB single word and 1 MB of spaces, timed
# Exit 77 (skipped) when the venv has no `tokenizers`.
set -uo pipefail
STEP=$1 PY=$2 BIN=$3 W=$4 MODEL=${5:-}
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import tokenizers" 2>/dev/null; then
  echo "skip: $PY cannot import tokenizers: run tools/install-deps.sh (tools/install-venv.sh makes the venv)" >&2
  exit 77
fi
case $STEP in
peer)
  rm -rf "$W" && mkdir -p "$W" || exit 2
  "$PY" "$HERE/bpe_peer.py" "$W"
  ;;
ids | long)
  if [[ ! -f $W/$MODEL.ids ]]; then
    echo "FAIL: $W/$MODEL.ids missing: the bpe_peer test did not run or failed" >&2
    exit 1
  fi
  if [[ $STEP == ids ]]; then
    "$BIN" "$W" "$MODEL" && { [[ $MODEL != gpt2 && $MODEL != llama3-im ]] ||
      echo "tokenizers (same run): $(grep "^$MODEL " "$W/peer-speed.txt") MB/s one thread"; }
  else
    "$BIN" --long "$W" "$MODEL"
  fi
  ;;
*) echo "usage: $0 peer|ids|long VENV_PYTHON TEST_BPE WORKDIR [MODEL]" >&2; exit 2 ;;
esac
