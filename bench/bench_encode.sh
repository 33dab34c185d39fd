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
# --linux adds, --linux-only runs alone, the Linux tarball phase: tokshard build
# --doc-split file --format text --threads 2 of /usr/src/linux-source-6.1.tar.xz
# (1.36 GB of tar streamed through libarchive; Debian package linux-source-6.1,
# 140 MB: scripts/install-deps.sh --linux-source installs it) with the nfkc
# model, next to `xz -dc` of the same file alone (the decompression every build
# of it pays, on one thread); prints wall s, MB/s of tar and of text, CPU cores
# used (CPU s / wall s) and peak RSS. About 1 minute on 2 idle cores.
#
# usage: bench/bench_encode.sh [--mb N (24)] [--work DIR] [--bin TOKSHARD] [--no-fastokens]
#                              [--linux | --linux-only]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
MB=24
WORK=/var/tmp/tokshard-bench-encode
BIN="$ROOT/build/bin/tokshard"
FASTOKENS=1
LINUX=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --linux) LINUX=1; shift ;;
  --linux-only) LINUX=2; FASTOKENS=0; shift ;;
  --mb) MB=$2; shift 2 ;;
  --work) WORK=$2; shift 2 ;;
  --bin) BIN=$2; shift 2 ;;
  --no-fastokens) FASTOKENS=0; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
need_tokshard "$BIN"
mkdir -p "$WORK"
cd "$WORK"

text=corpus-$MB.txt
make_corpus "$MB" "$text"
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
MODELS="llama nfkc uni"
[[ $LINUX == 2 ]] && MODELS=""
for model in $MODELS; do
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

if [[ $LINUX -ge 1 ]]; then
  TAR=/usr/src/linux-source-6.1.tar.xz
  [[ -s $TAR ]] || { echo "bench_encode.sh: $TAR missing: run scripts/install-deps.sh --linux-source" >&2; exit 2; }
  cat "$TAR" >/dev/null
  tar_mb=$(xz -dc "$TAR" | wc -c | awk '{print $1 / 1e6}')
  echo "# Linux tarball: $TAR, $tar_mb MB of tar; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  l0=$(load)
  /usr/bin/time -f "%e %U %S %M" -o time.out xz -dc "$TAR" >/dev/null
  read -r xw xu xs xr <time.out
  rm -rf ds-linux ds-linux.partial
  l1=$(load)
  /usr/bin/time -f "%e %U %S %M" -o time.out "$BIN" build --threads 2 --tokenizer nfkc.model --output ds-linux \
    --doc-split file --format text "$TAR" >run.out 2>run.err || { cat run.err >&2; exit 1; }
  read -r bw bu bs br <time.out
  text_mb=$(sed -n 's/^ *inputs .*(\([0-9.]*\) MB of text).*/\1/p' run.out | head -1)
  grep -E "inputs|documents|tokens|encoder|elapsed|skipped" run.out | sed 's/^ */    /'
  printf '| run | wall s | MB/s of tar | MB/s of text | CPU cores used | peak RSS | load before |\n|---|---|---|---|---|---|---|\n'
  awk -v w="$bw" -v u="$bu" -v s="$bs" -v r="$br" -v t="$tar_mb" -v x="${text_mb:-0}" -v l="$l1" 'BEGIN {
    xs = (x > 0) ? sprintf("%.1f", x / w) : "?"
    printf "| tokshard build --threads 2 --doc-split file (nfkc model) | %.1f | %.1f | %s | %.2f | %.0f MiB (%d KB) | %s |\n",
      w, t / w, xs, (u + s) / w, r / 1024, r, l }'
  awk -v w="$xw" -v u="$xu" -v s="$xs" -v r="$xr" -v t="$tar_mb" -v l="$l0" 'BEGIN {
    printf "| xz -dc alone (one thread, for scale) | %.1f | %.1f | - | %.2f | %.0f MiB | %s |\n", w, t / w, (u + s) / w, r / 1024, l }'
  "$BIN" audit ds-linux >/dev/null && echo "    audit: OK" || echo "    audit: FAILED"
  rm -rf ds-linux
fi
