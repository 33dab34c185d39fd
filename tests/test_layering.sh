#!/usr/bin/env bash
# The layering of the source tree (docs/ARCHITECTURE.md), each rule run on
# the tree and then shown to fail on a copy with one violation planted:
#   - each library folder is used through its one public header (the CUDA
#     backend's library, trainer/cuda, through tks_cuda.h);
#   - no folder includes one at or above its own level: common < dataset,
#     tokenizer < sampler, tokenize < trainer < interop < tools;
#   - the trainer's rooms call down only: backend < cpu, comm < model, cuda <
#     perf, ckpt < run; so do the two rooms of tokenize/: input < pipeline;
#   - no two files of one folder call each other (directly or round a loop);
#   - no function outside tests is over 120 lines, no library or tool source
#     file over 1,000;
# and what the programs link: the trainer's programs no libarchive, the data
# tool no CUDA library, the audit front end no heavy library.
# Usage: test_layering.sh SOURCE_DIR BIN_DIR
set -uo pipefail
SRC=$1
BIN=$2
CASE=layering
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/lib.sh"
cd "$SRC" || exit 2
PY=${PYTHON:-python3}
CALLS="$SRC/tests/layering_calls.py"
LIBS=(common dataset tokenizer tokenize sampler trainer interop)
CODE=(--include=*.c --include=*.h --include=*.cc --include=*.cu --include=*.cuh --include=*.cpp)

# Each rule: rule_NAME ROOT prints one line per violation under ROOT.

# Code outside a library folder (tests excepted: they test the insides; the
# benchmarks' C programs are held to the rule) includes only its public header.
declare -A pub=([dataset]=dataset.h [tokenizer]=tokenizer.h [tokenize]=tokenize.h [sampler]=sampler.h
                [trainer]='trainer.h|cuda/tks_cuda.h' [interop]=interop.h)
rule_public() {
  local d
  for d in "${!pub[@]}"; do
    (cd "$1" && grep -rnE "#include \"$d/[A-Za-z0-9_/]+\.h\"" "${CODE[@]}" common dataset tokenizer tokenize \
      sampler trainer interop tools bench 2>/dev/null | grep -v "^$d/" | grep -vE "\"$d/(${pub[$d]})\"")
  done
}
# Includes go to lower levels only (and every include is written from the
# repository root: "dataset/dataset.h", never "../dataset/dataset.h").
declare -A level=([common]=0 [dataset]=1 [tokenizer]=1 [sampler]=2 [tokenize]=2 [trainer]=3 [interop]=4 [tools]=5)
rule_levels() {
  local d line tgt
  for d in "${LIBS[@]}" tools; do
    while IFS= read -r line; do
      [[ -z $line ]] && continue
      tgt=$(sed -E 's/^[^"]*#include "([a-z_]+)\/.*/\1/' <<<"$line")
      [[ -n ${level[$tgt]:-} && $tgt != "$d" && ${level[$tgt]} -ge ${level[$d]} ]] && echo "upward: $line"
    done < <(cd "$1" && grep -rnE '#include "[a-z_]+/' "${CODE[@]}" "$d")
  done
  (cd "$1" && grep -rnE '#include "\.\./' "${CODE[@]}" "${LIBS[@]}" tools bench tests | sed 's/^/relative: /')
}
# The trainer's rooms, by level; a room's files name no function of a room
# at or above their level.
ROOMS=(trainer/backend=0 trainer/cpu=1 trainer/comm=1 trainer/model=2 trainer/cuda=2 trainer/perf=3
       trainer/ckpt=3 trainer/run=4)
TOKENIZE_ROOMS=(tokenize/input=0 tokenize/pipeline=1)
rule_rooms() {
  "$PY" "$CALLS" rooms "$1" "${ROOMS[@]}"
  "$PY" "$CALLS" rooms "$1" "${TOKENIZE_ROOMS[@]}"
  # and no file of tokenize/ outside the rooms (the public header stays above them)
  (cd "$1" && find tokenize -maxdepth 1 -type f \( -name '*.c' -o -name '*.cc' \) | sed 's/^/outside the rooms: /')
}
rule_circles() { "$PY" "$CALLS" circles "$1" "${LIBS[@]}" tools; }
rule_long() {
  "$PY" "$CALLS" long "$1" 120 "${LIBS[@]}" tools bench
  (cd "$1" && find "${LIBS[@]}" tools -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' \
     -o -name '*.cuh' \) -exec awk 'END { if (NR > 1000) printf "%s: a file of %d lines (limit 1000)\n", FILENAME, NR }' {} \;)
}
# Narrower rules of single folders.
rule_narrow() {
  (cd "$1" &&
    grep -rnE '#include "trainer/(backend|comm|model|ckpt|perf|run|cpu)/|#include "trainer/cuda/cuda\.h"' \
      "${CODE[@]}" tools bench | sed 's/^/private trainer header: /'
    grep -rnE '#include "tokenize/' "${CODE[@]}" trainer sampler | sed 's/^/the build pipeline: /'
    grep -rnE '#include "tokenize/pipeline/' "${CODE[@]}" tokenize/input | sed 's/^/the input room including the pipeline: /'
    grep -rnE '#include "(trainer|tokenize)/' "${CODE[@]}" interop | sed 's/^/interop: /'
    grep -rnE '#include "[^"]*fastenc\.h"' "${CODE[@]}" . | grep -v '^\./tokenizer/' | sed 's/^/fastenc.h: /')
}
RULES=(public levels rooms circles long narrow)
for r in "${RULES[@]}"; do
  out=$("rule_$r" "$SRC")
  [[ -z $out ]] && ok "rule $r holds on the tree" || fail "rule $r: $(head -c 1500 <<<"$out")"
done

# what trainer.h pulls in, transitively: no private header, nothing of the
# build pipeline
inc=$(echo '#include "trainer/trainer.h"' | ${CC:-cc} -I"$SRC" -E -H -x c - -o /dev/null 2>&1 | grep '^\.' | awk '{print $2}')
# (each path taken inside the tree: the tree's own folder may be named like one of its parts)
bad=$(while IFS= read -r f; do [[ $f == "$SRC"/* ]] && echo "${f#"$SRC"/}"; done <<<"$inc" |
  grep -E "^(trainer/[a-z]+/|tokenize/)")
[[ -z $bad ]] && ok "trainer.h pulls in no private header ($(echo "$inc" | grep -c "$SRC") project headers)" ||
  fail "trainer.h pulls in: $bad"

# Every rule fails on a planted violation: a copy of the tree, one file
# added to or appended to.
copy_tree() { # the sources (git's files in a checkout, else the folders as they are)
  rm -rf "$W/tree" && mkdir -p "$W/tree"
  if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$SRC" ls-files -z -- "${LIBS[@]}" tools bench tests | (cd "$SRC" && xargs -0 cp --parents -t "$W/tree")
  else
    (cd "$SRC" && cp -a "${LIBS[@]}" tools bench tests "$W/tree")
  fi
}
planted() { # planted RULE WHAT PATTERN: the rule reports a line matching PATTERN on the copy
  local out hit
  out=$("rule_$1" "$W/tree")
  hit=$(grep -E -- "$3" <<<"$out" | head -1)
  [[ -n $hit ]] && ok "rule $1 fails on $2: $(cut -c1-160 <<<"$hit")" || fail "rule $1 does not see $2: $out"
}
plant() { # plant RULE WHAT FILE TEXT: TEXT appended to FILE in a fresh copy
  copy_tree
  printf '%s\n' "$4" >>"$W/tree/$3"
  planted "$1" "$2" "^[a-z ]*:? ?$3"
}
plant public "tools including a private header" tools/cli.c '#include "trainer/model/model.h"'
plant levels "dataset/ including the trainer" dataset/stats.c '#include "trainer/trainer.h"'
plant levels "sampler/ including the build pipeline" sampler/blend.c '#include "tokenize/tokenize.h"'
plant levels "a relative include" trainer/run/eval.c '#include "../../common/tks.h"'
plant rooms "the backend calling the model" trainer/backend/dtype.c \
  'size_t tks__planted(void); size_t tks__planted(void) { return tks_model_n_flat(0); }'
plant rooms "the input room calling the build pipeline" tokenize/input/names.c \
  'void tks__planted(void *p); void tks__planted(void *p) { tks__plan_free(p); }'
plant narrow "the input room including the pipeline's header" tokenize/input/docs.c \
  '#include "tokenize/pipeline/pipeline.h"'
plant long "a function of 121 lines" trainer/run/eval.c \
  "$(printf 'int tks__planted(int x);\nint tks__planted(int x) {\n'; for i in $(seq 118); do echo '    x += 1;'; done
     printf '    return x;\n}\n')"
copy_tree
seq 1001 | sed 's@^@/* filler @; s@$@ */@' >>"$W/tree/dataset/stats.c"
planted long "a file of 1,001 lines" "^dataset/stats.c: a file of"
plant narrow "tools including cuda.h" tools/tokshard_train.c '#include "trainer/cuda/cuda.h"'
copy_tree
printf '%s\n' 'int tks__planted_b(void);' 'int tks__planted_a(void) { return tks__planted_b(); }' >"$W/tree/dataset/planted_a.c"
printf '%s\n' 'int tks__planted_a(void);' 'int tks__planted_b(void) { return tks__planted_a(); }' >"$W/tree/dataset/planted_b.c"
planted circles "two files of dataset/ calling each other" "planted_a.c dataset/planted_b.c;"
printf '%s\n' 'int tks__planted_c(void);' 'int tks__planted_b(void) { return tks__planted_c(); }' >"$W/tree/dataset/planted_b.c"
printf '%s\n' 'int tks__planted_a(void);' 'int tks__planted_c(void) { return tks__planted_a(); }' >"$W/tree/dataset/planted_c.c"
planted circles "three files of dataset/ calling round a loop" "planted_a.c dataset/planted_b.c dataset/planted_c.c;"

# ldd's output is captured first: under pipefail, `ldd | grep -q` fails
# whenever grep exits at its first match and ldd dies of SIGPIPE
for b in tokshard-train tokshard-generate; do
  libs=$(ldd "$BIN/$b") || { fail "ldd $BIN/$b failed"; continue; }
  if grep -q libarchive <<<"$libs"; then fail "$b links libarchive (the build pipeline)"; else
    ok "$b does not link libarchive"; fi
done
# the CUDA backend is its own library: the data tool (tokshard-full, for
# sample-plan --run and export-hf) links the trainer without it, so it never
# loads CUDA's libraries (tokshard-train registers it: tks_cuda.h)
if libs=$(ldd "$BIN/tokshard-full"); then
  cu=$(grep -oE "lib(cudart|cublas|cublasLt|nccl|cudnn)[^ ]*" <<<"$libs" | sort -u | tr '\n' ' ')
  [[ -z $cu ]] && ok "tokshard-full links no CUDA library" || fail "tokshard-full links: $cu"
else
  fail "ldd $BIN/tokshard-full failed"
fi
nm -A "$BIN"/../libtks_trainer.a >"$W/nm" || fail "nm $BIN/../libtks_trainer.a failed"
grep -E " U tks_(cuda|nccl)_" "$W/nm" >"$W/cu_refs"
grep -q " U tks_fail" "$W/nm" && [[ ! -s $W/cu_refs ]] && ok "the trainer library refers to nothing of the CUDA library (it is compiled once)" ||
  fail "libtks_trainer.a refers to: $(head -3 "$W/cu_refs")"
# tokshard, the front end, audits a dataset linking only what an audit needs
# (tools/tokshard_lean.c); every other command runs in tokshard-full
# (libstdc++ counts only without a sanitizer: libasan and libubsan need it)
cxx='|stdc\+\+'
if libs=$(ldd "$BIN/tokshard"); then
  grep -qE 'lib(asan|ubsan)' <<<"$libs" && cxx=''
  heavy=$(grep -oE "lib(archive|sentencepiece|mpi|openblas$cxx)[^ ]*" <<<"$libs" | sort -u | tr '\n' ' ')
  [[ -z $heavy ]] && ok "tokshard (the audit front end) links no heavy library" || fail "tokshard links: $heavy"
else
  fail "ldd $BIN/tokshard failed"
fi
finish test_layering
