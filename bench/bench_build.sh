#!/usr/bin/env bash
# bench_build.sh - tokshard build and audit against the tools people use today,
# side by side in one run, on the same text, the same tokenizer, this machine.
#
# Compared (see docs/BENCHMARKS.md for the figures and how to read them):
#   build:   tokshard build --doc-split line --threads 1 and --threads N (N = nproc),
#            spm_encode --output_format=id (Debian's sentencepiece CLI, one thread),
#            bench/megatron_style.py, a Megatron-LM preprocess_data.py style pipeline
#            (Debian python3-sentencepiece + numpy, multiprocessing.Pool(N).imap, 32
#            lines per task); all on the same ~51 MB of text (GCIDE + Python docs, one
#            document per line) with the same tokenizer; then the ids of every
#            document are compared across the tools ("ids identical: yes/no")
#   audit:   tokshard audit --threads 1 and N against xxhsum -H3 (XXH3-64), one and
#            N processes, on the same ~260 MB of shards, page cache warm; the build
#            of those shards (7x the text) is the "7x the input" peak-RSS point
#   large:   tokshard build --doc-split file of /usr/src/linux-source-6.1.tar.xz
#            (1.36 GB of tar, read through libarchive), its audit, xz -dc alone
#   hugedoc: the tarball's largest file (24 MB) built as one document and as lines
#
# This is a benchmark, not a test: nothing is asserted about time. It prints a
# table and writes bench/results/<date>-<host>.{json,tsv,meta.tsv} (git-ignored).
# Ratios matter, absolute times on a shared machine do not: before each phase
# the script waits (up to --max-wait s) for the machine to be idle (1-minute
# load < 0.5), and every run records the CPU time other processes used meanwhile;
# a disturbed run is repeated and left out of the medians.
# Time on 2 idle cores: build+audit ~10 minutes, --large ~6 more.
#
# usage: bench/bench_build.sh [options]
#   --runs N         timed runs per build tool, median reported [3]
#   --audit-runs N   timed runs per audit tool, median reported [5]
#   --threads N      the "N threads" figure [nproc]
#   --phases LIST    which of build,audit,large,hugedoc to run [build,audit]
#   --large          add the phases large and hugedoc (installs the Debian package
#                    linux-source-6.1 if missing)
#   --append PREFIX  add the runs to bench/results/PREFIX.{tsv,meta.tsv} (to finish a
#                    run that stopped part way) instead of starting a new results file
#   --work DIR       scratch directory: corpus, tokenizer, datasets [/var/tmp/tokshard-bench]
#   --bin PATH       tokshard binary [default: (re)build build-bench/ in Release and use it]
#   --max-wait S     longest wait for an idle machine before a phase [900]
#   --no-wait        do not wait for an idle machine (runs are never marked disturbed)
#   --keep           keep the datasets in --work (the corpus and tokenizer are always kept)
#   --quick          smoke test of this script: 1 run each, 20000 lines; figures meaningless
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
RUNS=3
AUDIT_RUNS=5
THREADS="$(nproc)"
LARGE=0
WORK="/var/tmp/tokshard-bench"
BIN=""
MAX_WAIT=900
WAIT=1
KEEP=0
QUICK=0
PHASES="build,audit"
APPEND=""
while (($#)); do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --audit-runs) AUDIT_RUNS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --large) LARGE=1; shift ;;
    --append) APPEND="$2"; shift 2 ;;
    --phases) PHASES="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --max-wait) MAX_WAIT="$2"; shift 2 ;;
    --no-wait) WAIT=0; shift ;;
    --keep) KEEP=1; shift ;;
    --quick) QUICK=1; RUNS=1; AUDIT_RUNS=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_build.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done

[[ $LARGE == 1 ]] && PHASES="$PHASES,large,hugedoc"
PY=/usr/bin/python3   # Debian's interpreter: it has python3-sentencepiece and numpy
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------- prerequisites
"$ROOT/scripts/install-deps.sh" --bench >&2
if [[ ,$PHASES, == *,large,* || ,$PHASES, == *,hugedoc,* ]] && [[ ! -f /usr/src/linux-source-6.1.tar.xz ]]; then
  say "installing linux-source-6.1 (for --large)"
  "$ROOT/scripts/install-deps.sh" --linux-source >&2
fi
if [[ -z "$BIN" ]]; then
  BIN="$ROOT/build-bench/bin/tokshard"
  say "building tokshard (Release) in build-bench/"
  cmake -S "$ROOT" -B "$ROOT/build-bench" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$ROOT/build-bench" -j"$(nproc)" --target tokshard >/dev/null
fi
for t in "$BIN" /usr/bin/time spm_encode xxhsum "$PY"; do
  command -v "$t" >/dev/null || { echo "bench_build.sh: missing $t" >&2; exit 2; }
done
"$PY" -c 'import sentencepiece, numpy' || { echo "bench_build.sh: $PY lacks sentencepiece/numpy" >&2; exit 2; }
# xxhsum 0.8.x: -H3 is XXH3-64; check it on the empty input (known value)
[[ "$(printf '' | xxhsum -H3 | grep -o '[0-9a-f]\{16\}')" == 2d06800538d394c2 ]] ||
  { echo "bench_build.sh: xxhsum -H3 is not XXH3-64 here" >&2; exit 2; }

mkdir -p "$WORK" "$HERE/results"
HOST="$(hostname -s)"
STAMP="$(date +%Y%m%d-%H%M%S)"
if [[ -n $APPEND ]]; then
  RES="$HERE/results/${APPEND%.tsv}"
  RAW="$RES.tsv"
  META="$RES.meta.tsv"
  [[ -f $RAW && -f $META ]] || { echo "bench_build.sh: --append: no $RAW or $META" >&2; exit 2; }
else
  RES="$HERE/results/$STAMP-$HOST"
  RAW="$RES.tsv"
  META="$RES.meta.tsv"
  printf 'name\trun\twall_s\trss_kb\tuser_s\tsys_s\tforeign_cpu_s\tbytes\tload1_before\tdisturbed\n' > "$RAW"
fi
HZ="$(getconf CLK_TCK)"

# ------------------------------------------------------------------ helpers
busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
load1() { cut -d' ' -f1 /proc/loadavg; }

# Waits until the machine is idle: 1-minute load < 0.5 and < 10% CPU busy over
# 5 s. Called before each phase.
wait_idle() {
  [[ $WAIT == 1 ]] || return 0
  local start=$SECONDS a b
  while :; do
    a=$(busy_jiffies); sleep 5; b=$(busy_jiffies)
    local busy=$(( (b - a) * 100 / (5 * HZ * $(nproc)) ))
    if awk -v l="$(load1)" 'BEGIN{exit !(l < 0.5)}' && ((busy < 10)); then return 0; fi
    if ((SECONDS - start > MAX_WAIT)); then
      say "machine still busy after ${MAX_WAIT}s (load $(load1), ${busy}% CPU): measuring anyway"
      echo "warning	phase started busy: load $(load1), ${busy}% CPU at $(date +%T)" >> "$META"
      return 0
    fi
    say "waiting for an idle machine (load $(load1), ${busy}% CPU busy)"
    sleep 20
  done
}

# Waits (up to 5 minutes) until other processes leave the CPUs alone for 2 s.
# Called before each run: the load average lags, our own previous run is in it.
wait_quiet() {
  [[ $WAIT == 1 ]] || return 0
  local start=$SECONDS a b
  while :; do
    a=$(busy_jiffies); sleep 2; b=$(busy_jiffies)
    (( (b - a) * 100 / (2 * HZ * $(nproc)) < 10 )) && return 0
    ((SECONDS - start > 300)) && return 0
    sleep 3
  done
}

# measure NAME RUN BYTES [--stdin FILE] [--clean DIR] -- CMD...
# Runs CMD (stdout to /dev/null) under /usr/bin/time and records wall s, peak
# RSS KB, user/sys s, and the CPU seconds other processes used meanwhile
# (system busy time minus the command's own). A run that other processes
# disturbed (foreign CPU > 5% of the machine for its duration) is recorded as
# such and repeated (--tries N attempts in all, default 4); summarize.py uses
# the undisturbed runs. --clean DIR: rm -rf DIR and DIR.partial before each attempt.
measure() {
  local name=$1 run=$2 bytes=$3; shift 3
  local in=/dev/null clean="" tries=4
  while [[ $1 != -- ]]; do
    case "$1" in --stdin) in=$2 ;; --clean) clean=$2 ;; --tries) tries=$2 ;; esac; shift 2
  done
  shift
  local tf="$WORK/time.out" l0 j0 j1 wall rss u s foreign disturbed attempt
  for ((attempt = 1; attempt <= tries; attempt++)); do
    [[ -n $clean ]] && rm -rf "$clean" "$clean.partial"
    wait_quiet
    l0=$(load1); j0=$(busy_jiffies)
    [[ $1 == repeat ]] && set -- "$HERE/repeat.sh" "${@:2}"
    if ! /usr/bin/time -o "$tf" -f '%e %M %U %S' "$@" < "$in" > /dev/null 2> "$WORK/last.err"; then
      cat "$WORK/last.err" >&2
      echo "bench_build.sh: $name failed: $*" >&2
      exit 1
    fi
    j1=$(busy_jiffies)
    read -r wall rss u s < <(tail -n 1 "$tf")
    foreign=$(awk -v j=$((j1 - j0)) -v hz="$HZ" -v u="$u" -v s="$s" 'BEGIN{f=j/hz-u-s; if(f<0)f=0; printf "%.2f", f}')
    disturbed=$(awk -v f="$foreign" -v w="$wall" -v n="$(nproc)" 'BEGIN{m=0.05*w*n; if(m<0.05)m=0.05; print (f>m)?1:0}')
    [[ $WAIT == 1 ]] || disturbed=0
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$run" "$wall" "$rss" "$u" "$s" "$foreign" "$bytes" "$l0" "$disturbed" >> "$RAW"
    say "$(printf '%-24s run %s: %7.2f s  %8d KB  foreign CPU %5s s%s' "$name" "$run" "$wall" "$rss" "$foreign" "$( ((disturbed)) && echo ' (disturbed, again)')")"
    ((disturbed)) || break
  done
}

# An audit of a few hundred MB takes well under 0.1 s, below what /usr/bin/time
# resolves: each timed audit run is REPS passes over the shards (~8 GB in all),
# process start included, for every tool alike.
reps_for() { awk -v b="$1" 'BEGIN{r=int(8e9/b+0.999); print (r<1)?1:(r>100)?100:r}'; }

filesize() { stat -c %s "$@" | awk '{s+=$1} END{print s}'; }

# audit_round SUFFIX RUN REPS BYTES DS SHARDS...: run RUN of tokshard audit DS
# with 1 and THREADS threads and of xxhsum -H3 over its SHARDS (BYTES in all),
# each timed run REPS passes; the figures' names end in SUFFIX.
audit_round() {
  local sfx=$1 r=$2 reps=$3 bytes=$4 ds=$5; shift 5
  measure "tokshard_audit_t1$sfx" "$r" $((reps * bytes)) -- repeat "$reps" "$BIN" audit "$ds" --threads 1
  measure "tokshard_audit_tN$sfx" "$r" $((reps * bytes)) -- repeat "$reps" "$BIN" audit "$ds" --threads "$THREADS"
  measure "xxhsum_H3_1$sfx" "$r" $((reps * bytes)) -- repeat "$reps" xxhsum -H3 "$@"
}

# ------------------------------------------------------------ environment
if [[ -n $APPEND ]]; then
  printf 'appended\t%s phases %s, tokshard %s, git %s\n' "$(date -Iseconds)" "$PHASES" "$("$BIN" --version)" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+dirty')" >> "$META"
else {
  printf 'date\t%s\n' "$(date -Iseconds)"
  printf 'host\t%s\n' "$HOST"
  printf 'cpu\t%s\n' "$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  printf 'nproc\t%s\n' "$(nproc)"
  printf 'threads\t%s\n' "$THREADS"
  printf 'mem_total\t%s\n' "$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  printf 'kernel\t%s\n' "$(uname -r)"
  printf 'os\t%s\n' "$(. /etc/os-release; echo "$PRETTY_NAME") ($(cat /etc/debian_version 2>/dev/null))"
  for p in sentencepiece libsentencepiece0 python3-sentencepiece python3-numpy xxhash libxxhash0 \
           libarchive13 gcc python3; do
    printf 'pkg_%s\t%s\n' "$p" "$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo none)"
  done
  printf 'gcc\t%s\n' "$(gcc --version | head -1)"
  printf 'tokshard\t%s\n' "$("$BIN" --version)"
  printf 'git\t%s\n' "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+dirty')"
  printf 'runs\t%s\n' "$RUNS"
  printf 'audit_runs\t%s\n' "$AUDIT_RUNS"
} > "$META"; fi

# --------------------------------------------------------------- corpus
# One document per line, no empty lines: the non-empty lines of GCIDE (the
# dictionary) followed by those of the Python 3.11 documentation sources.
# GCIDE has 3 stray cp1252 bytes (0x92); iconv -c drops them so that every tool
# sees the same valid UTF-8 (tokshard would write U+FFFD, Python would stop).
CORPUS="$WORK/corpus.txt"
if [[ ! -s "$CORPUS" ]]; then
  say "writing $CORPUS"
  {
    zcat /usr/share/dictd/gcide.dict.dz
    find /usr/share/doc/python3.11/html/_sources -name '*.rst.txt' -print0 | LC_ALL=C sort -z | xargs -0 cat
  } | { iconv -c -f UTF-8 -t UTF-8 || true; } | grep -av '^[[:space:]]*$' > "$CORPUS.tmp"
  iconv -f UTF-8 -t UTF-8 "$CORPUS.tmp" > /dev/null
  mv "$CORPUS.tmp" "$CORPUS"
fi
CORPUS_BYTES=$(filesize "$CORPUS")
# ------------------------------------------------------------- tokenizer
# trained once on the full corpus, reused by later runs
TOK="$WORK/tok"
if [[ ! -s "$TOK.model" ]]; then
  wait_idle
  say "training the tokenizer (bpe, 8000, byte fallback)"
  measure train_tokenizer 1 "$CORPUS_BYTES" -- "$BIN" train-tokenizer --output "$TOK" --vocab-size 8000 \
    --model-type bpe --byte-fallback --input-sentence-size 300000 "$CORPUS"
fi
[[ -n $APPEND ]] || printf 'tokenizer_xxh3\t%s\n' "$(xxhsum -H3 "$TOK.model" 2>/dev/null | grep -o '[0-9a-f]\{16\}')" >> "$META"

if [[ $QUICK == 1 ]]; then
  head -n 20000 "$CORPUS" > "$WORK/corpus-quick.txt"
  CORPUS="$WORK/corpus-quick.txt"
  CORPUS_BYTES=$(filesize "$CORPUS")
fi
if [[ -z $APPEND ]]; then
  printf 'corpus\t%s\n' "$CORPUS" >> "$META"
  printf 'corpus_bytes\t%s\n' "$CORPUS_BYTES" >> "$META"
  printf 'corpus_lines\t%s\n' "$(wc -l < "$CORPUS")" >> "$META"
  printf 'corpus_xxh3\t%s\n' "$(xxhsum -H3 "$CORPUS" 2>/dev/null | grep -o '[0-9a-f]\{16\}')" >> "$META"
fi

# ------------------------------------------------- build: tokshard vs the rest
if [[ ,$PHASES, == *,build,* ]]; then
DS="$WORK/ds"
PYOUT="$WORK/megatron"

wait_idle
say "build phase: $RUNS rounds of 4 tools on $(awk -v b="$CORPUS_BYTES" 'BEGIN{printf "%.1f MB", b/1e6}') of text"
for ((r = 1; r <= RUNS; r++)); do
  measure tokshard_build_t1 "$r" "$CORPUS_BYTES" --clean "$DS-t1" -- \
    "$BIN" build --quiet --tokenizer "$TOK.model" --output "$DS-t1" --doc-split line --threads 1 "$CORPUS"
  if [[ $THREADS != 1 ]]; then
    measure tokshard_build_tN "$r" "$CORPUS_BYTES" --clean "$DS-t$THREADS" -- \
      "$BIN" build --quiet --tokenizer "$TOK.model" --output "$DS-t$THREADS" --doc-split line --threads "$THREADS" "$CORPUS"
  fi
  measure spm_encode_1 "$r" "$CORPUS_BYTES" --stdin "$CORPUS" -- spm_encode --model "$TOK.model" --output_format=id
  measure megatron_py_wN "$r" "$CORPUS_BYTES" -- \
    "$PY" "$HERE/megatron_style.py" --model "$TOK.model" --input "$CORPUS" --output-prefix "$PYOUT" --workers "$THREADS"
done

# ---------------------------------------------------- the ids must be the same
say "comparing ids: tokshard cat --ids, spm_encode, megatron_style .bin/.idx (all documents)"
"$BIN" cat "$DS-t1" --ids > "$WORK/ids.tokshard_t1"
"$BIN" cat "$DS-t$THREADS" --ids > "$WORK/ids.tokshard_tN"
spm_encode --model "$TOK.model" --output_format=id < "$CORPUS" | grep -v '^$' > "$WORK/ids.spm_encode" || true
"$PY" "$HERE/megatron_style.py" --dump-ids "$PYOUT" > "$WORK/ids.megatron_py"
same=yes
ref=$(xxhsum -H3 < "$WORK/ids.spm_encode" | cut -c1-30)
for f in tokshard_t1 tokshard_tN megatron_py; do
  h=$(xxhsum -H3 < "$WORK/ids.$f" | cut -c1-30)
  [[ "$h" == "$ref" ]] || { same=no; say "ids differ: $f vs spm_encode"; cmp "$WORK/ids.$f" "$WORK/ids.spm_encode" | head -1 >&2 || true; }
done
printf 'ids_identical\t%s\n' "$same" >> "$META"
printf 'ids_documents\t%s\n' "$(wc -l < "$WORK/ids.spm_encode")" >> "$META"
printf 'ids_tokens\t%s\n' "$(wc -w < "$WORK/ids.spm_encode")" >> "$META"
printf 'ids_shards_identical_t1_tN\t%s\n' "$(cmp -s "$DS-t1/shard-00000.tks" "$DS-t$THREADS/shard-00000.tks" && echo yes || echo no)" >> "$META"
[[ $KEEP == 1 ]] || rm -rf "$DS-t1" "$DS-t$THREADS" "$PYOUT.bin" "$PYOUT.idx"
echo "ids identical: $same ($(wc -l < "$WORK/ids.spm_encode") documents, $(wc -w < "$WORK/ids.spm_encode") tokens; tokshard t1 + tN, spm_encode, megatron_style)"
rm -f "$WORK"/ids.*

fi  # build

# -------------------------------------------------------------------- audit
if [[ ,$PHASES, == *,audit,* ]]; then
# A dataset of >= 200 MB of shards: the corpus 7 times over (~350 MB of text).
# Its build is also the "same build, 7x the input" point for peak RSS.
BIG="${CORPUS%.txt}-x7.txt"
if [[ ! -s "$BIG" ]]; then for _ in 1 2 3 4 5 6 7; do cat "$CORPUS"; done > "$BIG"; fi
AUD="$WORK/ds-x7"
wait_idle
measure tokshard_build_tN_x7 1 "$(filesize "$BIG")" --clean "$AUD" --tries 2 -- \
  "$BIN" build --quiet --tokenizer "$TOK.model" --output "$AUD" --doc-split line --threads "$THREADS" "$BIG"
SHARDS=("$AUD"/shard-*.tks)
SHARD_BYTES=$(filesize "${SHARDS[@]}")
printf 'audit_shards\t%s\n' "${#SHARDS[@]}" >> "$META"
printf 'audit_shard_bytes\t%s\n' "$SHARD_BYTES" >> "$META"
cat "${SHARDS[@]}" > /dev/null   # page cache warm
"$BIN" audit "$AUD" --threads 1 > /dev/null
wait_idle
say "audit phase: $AUDIT_RUNS rounds over ${#SHARDS[@]} shards, $(awk -v b="$SHARD_BYTES" 'BEGIN{printf "%.0f MB", b/1e6}'), each timed run $(reps_for "$SHARD_BYTES") passes"
REPS=$(reps_for "$SHARD_BYTES")
printf 'audit_reps\t%s\n' "$REPS" >> "$META"
for ((r = 1; r <= AUDIT_RUNS; r++)); do
  audit_round "" "$r" "$REPS" "$SHARD_BYTES" "$AUD" "${SHARDS[@]}"
  measure xxhsum_H3_pN "$r" $((REPS * SHARD_BYTES)) -- repeat "$REPS" \
    sh -c 'printf "%s\0" "$@" | xargs -0 -P "$0" -n 1 xxhsum -H3' "$THREADS" "${SHARDS[@]}"
done
[[ $KEEP == 1 ]] || rm -rf "$AUD"

fi  # audit

# ------------------------------------------------------------ large (--large)
if [[ ,$PHASES, == *,large,* ]]; then
  TAR=/usr/src/linux-source-6.1.tar.xz
  LDS="$WORK/ds-linux"
  printf 'large_input\t%s\n' "$TAR" >> "$META"
  printf 'large_input_bytes_xz\t%s\n' "$(filesize "$TAR")" >> "$META"
  cat "$TAR" > /dev/null
  wait_idle
  # sequential cost that every build of this archive pays: xz decompression alone
  UNX=$(xz -dc "$TAR" | wc -c)
  printf 'large_input_bytes_tar\t%s\n' "$UNX" >> "$META"
  measure xz_decompress 1 "$UNX" -- xz -dc "$TAR"
  say "large build: $TAR with $THREADS threads (several minutes)"
  measure tokshard_build_tN_linux 1 "$UNX" --clean "$LDS" --tries 2 -- \
    "$BIN" build --quiet --tokenizer "$TOK.model" --output "$LDS" --doc-split file --format text --threads "$THREADS" "$TAR"
  "$PY" - "$LDS/manifest.json" >> "$META" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, k)
            if r is not None: return r
st = find(m, "stats") or {}
for k, v in st.items():
    print(f"large_stats_{k}\t{v}")
EOF
  LSH=("$LDS"/shard-*.tks)
  printf 'large_shard_bytes\t%s\n' "$(filesize "${LSH[@]}")" >> "$META"
  "$BIN" audit "$LDS" > /dev/null
  LB=$(filesize "${LSH[@]}")
  LREPS=$(reps_for "$LB")
  for ((r = 1; r <= 3; r++)); do
    audit_round _linux "$r" "$LREPS" "$LB" "$LDS" "${LSH[@]}"
  done
  [[ $KEEP == 1 ]] || rm -rf "$LDS"
fi  # large

# ------------------------------------------------ huge document (--large)
if [[ ,$PHASES, == *,hugedoc,* ]]; then
  TAR=/usr/src/linux-source-6.1.tar.xz
  # One huge document: the largest file of the archive (a 24 MB generated header).
  # Memory of encoding one document grows with its size, in sentencepiece itself.
  HUGE_DIR="$WORK/huge"
  rm -rf "$HUGE_DIR"; mkdir -p "$HUGE_DIR"
  HUGE_NAME=$(tar -tvJf "$TAR" | sort -k3,3nr | awk 'NR == 1 {n = $NF} END {print n}')
  tar -xJf "$TAR" -C "$HUGE_DIR" "$HUGE_NAME"
  HUGE="$HUGE_DIR/$HUGE_NAME"
  HB=$(filesize "$HUGE")
  printf 'huge_doc\t%s\n' "$HUGE_NAME" >> "$META"
  printf 'huge_doc_bytes\t%s\n' "$HB" >> "$META"
  wait_idle
  measure tokshard_build_t1_hugedoc 1 "$HB" --clean "$HUGE_DIR/ds" -- \
    "$BIN" build --quiet --tokenizer "$TOK.model" --output "$HUGE_DIR/ds" --doc-split file --threads 1 "$HUGE"
  measure spm_python_hugedoc 1 "$HB" -- "$PY" -c '
import sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
print(len(sp.encode(open(sys.argv[2], encoding="utf-8").read())))' "$TOK.model" "$HUGE"
  # the same bytes as one document per line: no huge document
  measure tokshard_build_t1_hugedoc_lines 1 "$HB" --clean "$HUGE_DIR/ds-lines" -- \
    "$BIN" build --quiet --tokenizer "$TOK.model" --output "$HUGE_DIR/ds-lines" --doc-split line --threads 1 "$HUGE"
  rm -rf "$HUGE_DIR"
fi

printf 'load1_end\t%s\n' "$(load1)" >> "$META"
"$PY" "$HERE/summarize.py" "$RAW" "$META" "$RES.json"
say "results: $RES.json (raw: $RAW, $META)"
