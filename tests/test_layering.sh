#!/usr/bin/env bash
# Layering of every library folder, and of the trainer: trainer.h is its one public header (backend.h,
# comm.h and the rest stay private), tools use only that, and the trainer
# does not depend on the build pipeline (decoding goes through the tokenizer
# library, tokenizer/tokenizer.h, without libarchive).
# Usage: test_layering.sh SOURCE_DIR BIN_DIR
set -uo pipefail
SRC=$1
BIN=$2
CASE=layering
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$SRC/tests/lib.sh"
cd "$SRC" || exit 2
priv='(backend|comm|mesh|model|optim|checkpoint)\.h'
hits=$(grep -nE "#include \"(trainer/|\.\./trainer/)?$priv\"" tools/*.c tools/*.h)
[[ -z $hits ]] && ok "tools include no private trainer header" || fail "private headers in tools: $hits"
# what trainer.h pulls in, transitively
inc=$(echo '#include "trainer/trainer.h"' | ${CC:-cc} -I"$SRC" -E -H -x c - -o /dev/null 2>&1 | grep '^\.' | awk '{print $2}')
bad=$(echo "$inc" | grep -E "trainer/$priv|tokenize/")
[[ -z $bad ]] && ok "trainer.h pulls in no private header ($(echo "$inc" | grep -c tokshard\\\|trainer\\\|dataset\\\|common) project headers)" ||
  fail "trainer.h pulls in: $bad"
tok=$(grep -nE '#include "\.\./tokenize/' trainer/*.c trainer/*.h)
[[ -z $tok ]] && ok "trainer/ includes nothing of tokenize/ (the build pipeline)" || fail "trainer/ includes: $tok"
# the tokenizer library: one public header; fastenc.h is private to it
fe=$(grep -rnE '#include "[^"]*fastenc\.h"' --include=*.c --include=*.h --include=*.cc . | grep -v '^\./tokenizer/')
[[ -z $fe ]] && ok "fastenc.h is included only inside tokenizer/" || fail "fastenc.h included from: $fe"
ip=$(grep -nE '#include "(\.\./)?trainer/' interop/*.c interop/*.h)
[[ -z $ip ]] && ok "interop/ includes nothing of the trainer (no MPI, no OpenBLAS)" || fail "interop/ includes: $ip"
up=$(grep -nE '#include "(\.\./)?(tokenize|trainer|dataset|interop|tools)/' tokenizer/*.c tokenizer/*.h tokenizer/*.cc)
[[ -z $up ]] && ok "tokenizer/ depends on common/ only" || fail "tokenizer/ includes: $up"
# every library folder: code outside it (tests excepted: they test the
# insides; the benchmarks' C programs are held to the rule) includes only
# its one public header, and no library
# includes a folder above its own (common < dataset, tokenizer < tokenize,
# trainer < interop < tools)
declare -A pub=([dataset]=dataset.h [tokenizer]=tokenizer.h [tokenize]=tokenize.h [trainer]=trainer.h [interop]=interop.h)
for d in "${!pub[@]}"; do
  out=$(grep -rnE "#include \"(\.\./)?$d/[A-Za-z0-9_/]+\.h\"" --include=*.c --include=*.h --include=*.cc --include=*.cu \
    common dataset tokenizer tokenize trainer interop tools bench | grep -v "^$d/" | grep -vE "\"(\.\./)?$d/${pub[$d]}\"")
  [[ -z $out ]] && ok "$d/ is used through ${pub[$d]} only" || fail "private headers of $d/ included: $out"
done
declare -A level=([common]=0 [dataset]=1 [tokenizer]=1 [tokenize]=2 [trainer]=2 [interop]=3 [tools]=4)
for d in common dataset tokenizer tokenize trainer interop; do
  bad=""
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    tgt=$(sed -E 's/.*#include "(\.\.\/)*([a-z]+)\/.*/\2/' <<<"$line")
    [[ -n ${level[$tgt]:-} && $tgt != "$d" && ${level[$tgt]} -ge ${level[$d]} ]] && bad+="$line "
  done < <(grep -rnE '#include "(\.\./)*[a-z]+/' --include=*.c --include=*.h --include=*.cc --include=*.cu "$d")
  [[ -z $bad ]] && ok "$d/ includes no folder at or above its own level" || fail "$d/ includes upward: $bad"
done
# ldd's output is captured first: under pipefail, `ldd | grep -q` fails
# whenever grep exits at its first match and ldd dies of SIGPIPE
for b in tokshard-train tokshard-generate; do
  libs=$(ldd "$BIN/$b") || { fail "ldd $BIN/$b failed"; continue; }
  if grep -q libarchive <<<"$libs"; then fail "$b links libarchive (the build pipeline)"; else
    ok "$b does not link libarchive"; fi
done
# the CUDA backend is its own library: the data tool (tokshard-full, for
# sample-plan --run and export-hf) links the trainer without it, so it never
# loads CUDA's libraries (tokshard-train registers it: trainer.h)
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
