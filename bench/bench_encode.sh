#!/usr/bin/env bash
# bench_encode.sh - tokshard's encoder against its peers, same text, same run.
#
# Text: GCIDE + the Python docs, one document per line (--mb MB), and CJK text
# (Japanese and Chinese man pages, lines). Models (vocab 8000, trained here):
#   llama  BPE, identity normalizer, byte fallback, split_digits,
#          whitespace-only pieces, remove_extra_whitespaces off (LLaMA-style)
#   nfkc   BPE, nmt_nfkc, trained by tokshard train-tokenizer
#   uni    unigram, nmt_nfkc
# Peers: Debian spm_encode --output_format=id (sentencepiece 0.1.97, one
# thread); fastokens (PyPI, in a venv under --work) at 1 and 2 threads on
# the llama model through bench/sp2hf.py's tokenizer.json, its ids checked
# against spm_encode's. tokshard: build --threads 1 and 2 (whole pipeline:
# read, encode, write shards), and verify-tokenizer, which checks every
# document against sentencepiece and gives the word cache hit rate, and with
# --no-cache the miss path's speed.
#
# Not a test: nothing is asserted. Prints one line per run: tool, model,
# text, MB, wall s, CPU s, MB/s (wall), and the load average before it (the
# machine is shared: compare ratios within one run, never across runs).
#
# usage: bench/bench_encode.sh [--mb N (24)] [--work DIR] [--bin TOKSHARD] [--no-fastokens]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
MB=24
WORK=/var/tmp/tokshard-bench-encode
BIN="$ROOT/build/bin/tokshard"
FASTOKENS=1
while [[ $# -gt 0 ]]; do
  case $1 in
  --mb) MB=$2; shift 2 ;;
  --work) WORK=$2; shift 2 ;;
  --bin) BIN=$2; shift 2 ;;
  --no-fastokens) FASTOKENS=0; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $BIN ]] || { echo "no tokshard at $BIN: build first (cmake --build build) or pass --bin" >&2; exit 2; }
mkdir -p "$WORK"
cd "$WORK"

text=corpus-$MB.txt
# (head ends the producers early: SIGPIPE is expected there, hence +o pipefail)
if [[ ! -s $text ]]; then
  set +o pipefail
  { zcat /usr/share/dictd/gcide.dict.dz; find /usr/share/doc/python3.11/html/_sources -type f | sort | xargs cat; } 2>/dev/null |
    tr -d '\r' | grep '[^[:space:]]' | head -c $((MB * 1000000)) | sed '$d' >"$text.tmp"
  set -o pipefail
  mv "$text.tmp" "$text"
fi
if [[ ! -s cjk.txt ]]; then
  set +o pipefail
  find /usr/share/man/ja /usr/share/man/zh_CN /usr/share/man/zh_TW -name '*.gz' | sort | xargs zcat 2>/dev/null |
    tr -d '\r' | grep '[^[:space:]]' | head -c 8000000 | sed '$d' >cjk.txt.tmp
  set -o pipefail
  mv cjk.txt.tmp cjk.txt
fi
head -c 2000000 cjk.txt | sed '$d' >train-cjk.txt || true
if [[ ! -s llama.model ]]; then
  spm_train --input="$text",train-cjk.txt --model_prefix=llama --model_type=bpe --vocab_size=8000 \
    --normalization_rule_name=identity --remove_extra_whitespaces=false --byte_fallback=true \
    --split_digits=true --allow_whitespace_only_pieces=true --input_sentence_size=300000 \
    --shuffle_input_sentence=true --num_threads=2 --minloglevel=2 >/dev/null 2>&1
fi
[[ -s nfkc.model ]] || "$BIN" train-tokenizer --output nfkc --vocab-size 8000 --doc-split line \
  --input-sentence-size 300000 --threads 2 "$text" train-cjk.txt >/dev/null
if [[ ! -s uni.model ]]; then
  spm_train --input="$text",train-cjk.txt --model_prefix=uni --model_type=unigram --vocab_size=8000 \
    --input_sentence_size=300000 --shuffle_input_sentence=true --num_threads=2 --minloglevel=2 >/dev/null 2>&1
fi
if [[ $FASTOKENS == 1 && ! -x venv/bin/python ]]; then
  python3 -m venv venv && venv/bin/pip install -q fastokens || FASTOKENS=0
fi

load() { cut -d' ' -f1 /proc/loadavg; }
# timed NAME MODEL TEXT CMD...: one result line
timed() {
  local name=$1 model=$2 t=$3
  shift 3
  local l0; l0=$(load)
  /usr/bin/time -f "%e %U %S %M" -o time.out "$@" >run.out 2>run.err
  read -r wall usr sys rss <time.out
  local mb; mb=$(stat -c %s "$t" | awk '{print $1 / 1e6}')
  awk -v n="$name" -v m="$model" -v t="$t" -v mb="$mb" -v w="$wall" -v u="$usr" -v s="$sys" -v r="$rss" -v l="$l0" \
    'BEGIN { printf "%-28s %-6s %-18s %6.1f MB %7.2f s wall %7.2f s cpu %7.2f MB/s  rss %5.0f MB  load %s\n", n, m, t, mb, w, u + s, mb / w, r / 1024, l }'
}

echo "# bench_encode $(date -u +%FT%TZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# tokshard $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
for model in llama nfkc uni; do
  for t in "$text" cjk.txt; do
    timed "spm_encode (1 thread)" $model "$t" sh -c "spm_encode --model=$model.model --output_format=id <$t >$model-$t.ids"
    for th in 1 2; do
      rm -rf ds
      timed "tokshard build --threads $th" $model "$t" "$BIN" build --threads $th --tokenizer $model.model \
        --output ds --doc-split line "$t"
      grep -E "encoder" run.out | sed 's/^ */    /'
    done
    rm -rf ds
    "$BIN" verify-tokenizer $model.model "$t" | sed 's/^ */    verify: /'
    [[ $model == uni ]] || "$BIN" verify-tokenizer --no-cache $model.model "$t" | sed -n 2p |
      sed 's/^ */    verify --no-cache (miss path): /'
    if [[ $FASTOKENS == 1 && $model == llama ]]; then
      [[ -s llama.json ]] || python3 "$HERE/sp2hf.py" llama.model llama.json
      for th in 1 2; do
        RAYON_NUM_THREADS=$th timed "fastokens ($th threads)" $model "$t" venv/bin/python \
          "$HERE/fastokens_encode.py" llama.json "$t" "$model-$t.ids"
        awk -F'\t' '{ printf "    fastokens encode_batch alone: %.2f MB/s, %d lines differ from spm_encode\n", $2 / 1e6 / $3, $4 }' run.out
      done
    fi
  done
done
