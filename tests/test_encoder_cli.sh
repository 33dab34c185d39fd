#!/usr/bin/env bash
# The encoder choice end to end: `tokshard build` with the fast encoder and
# with --encoder sentencepiece writes byte-identical datasets and says which
# path it took; a model outside the fast path falls back and says why;
# `tokshard verify-tokenizer` finds no difference on real text.
# Usage: test_encoder_cli.sh TOKSHARD WORKDIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
TKS=$1
W=$2
CASE=encoder
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
zcat /usr/share/dictd/gcide.dict.dz 2>/dev/null | head -c 1500000 >gcide.txt
find /usr/share/man/ja -name '*.gz' | sort | head -30 | xargs zcat >ja.txt 2>/dev/null

expect 0 "train a BPE tokenizer" -- "$TKS" train-tokenizer --output bpe --vocab-size 1000 \
  --byte-fallback gcide.txt ja.txt
expect 0 "build with the default encoder" -- "$TKS" build --tokenizer bpe.model --output fast \
  --doc-split blank-line --shard-tokens 50K gcide.txt ja.txt
grep -q "encoder       fast (exact sentencepiece ids" "$W/out" && ok "summary says fast" ||
  fail "summary does not name the fast encoder: $(grep encoder "$W/out")"
expect 0 "build with --encoder sentencepiece" -- "$TKS" build --tokenizer bpe.model --output ref \
  --doc-split blank-line --shard-tokens 50K --encoder sentencepiece gcide.txt ja.txt
grep -q "encoder       sentencepiece (--encoder sentencepiece)" "$W/out" && ok "summary says sentencepiece" ||
  fail "summary does not name sentencepiece: $(grep encoder "$W/out")"
if diff -r fast ref >/dev/null; then ok "datasets byte-identical"; else
  fail "fast and sentencepiece datasets differ: $(diff -rq fast ref | head -3)"
fi
expect 0 "verify-tokenizer on real text" -- "$TKS" verify-tokenizer bpe.model gcide.txt ja.txt
grep -q "identical ids" "$W/out" && ok "verify-tokenizer reports identical ids" ||
  fail "verify-tokenizer output: $(cat "$W/out")"

# one long document (the 1.5 MB of GCIDE, one file): with 2 threads the
# build cuts it where the model proves the ids unchanged (tks_spm_next_cut)
# and encodes the parts on both threads; the dataset is the one of 1 thread
# and of sentencepiece encoding the whole text
for t in 1 2; do
  expect 0 "one long document, $t thread(s)" -- "$TKS" build --tokenizer bpe.model --output long$t \
    --threads $t gcide.txt
done
grep -Eq "long docs +1 documents cut into [0-9]+ parts" "$W/out" &&
  ok "2 threads: $(grep "long docs" "$W/out" | cut -c17-60)" || fail "the long document was not cut: $(cat "$W/out")"
expect 0 "one long document, sentencepiece" -- "$TKS" build --tokenizer bpe.model --output long-ref \
  --threads 1 --encoder sentencepiece gcide.txt
for d in long2 long-ref; do
  diff -r long1 $d >/dev/null && ok "$d: byte-identical to 1 thread" || fail "$d differs: $(diff -rq long1 $d | head -3)"
done

# a model the fast path refuses: user-defined symbols
expect 0 "train a model with user-defined symbols" -- /usr/bin/spm_train --input=gcide.txt \
  --model_prefix=user --vocab_size=800 --model_type=bpe --user_defined_symbols=foo,bar \
  --num_threads=1 --minloglevel=2
expect 0 "build falls back" -- "$TKS" build --tokenizer user.model --output user-ds gcide.txt
grep -q "encoder       sentencepiece (piece .* is user-defined)" "$W/out" && ok "fallback reason shown" ||
  fail "no fallback reason: $(grep encoder "$W/out")"
expect 0 "verify-tokenizer on a fallback model" -- "$TKS" verify-tokenizer user.model gcide.txt
grep -q "no fast encoder" "$W/out" && ok "verify-tokenizer says there is no fast encoder" ||
  fail "verify-tokenizer output: $(cat "$W/out")"

# usage errors
expect 2 "--encoder with a bad value" -- "$TKS" build --tokenizer bpe.model --output x --encoder fastest gcide.txt
expect_msg "--encoder fastest: expected auto or sentencepiece"
expect 2 "verify-tokenizer without text" -- "$TKS" verify-tokenizer bpe.model
expect_msg "give MODEL and at least one TEXT"
expect 2 "verify-tokenizer with a missing model" -- "$TKS" verify-tokenizer nosuch.model gcide.txt
expect_msg "nosuch.model"
finish test_encoder_cli
