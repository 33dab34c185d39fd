#!/usr/bin/env bash
# Interop tests: other projects' datasets audited, imported and exported,
# each checked against the peer's own reader or writer (tests/interop_peer.py).
# Usage: test_interop.sh TOKSHARD VENV_PYTHON WORKDIR CASE   (WORKDIR shared)
#   CASE: setup | megatron | flat
# `setup` builds the dataset the other cases share (a ctest fixture) from real
# text (dict-gcide). The peers run in the project venv (tools/install-venv.sh);
# a missing venv FAILS the peer cases: it is part of the install.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
TKS=$1
PY=$2
W=$3
CASE=$4
PEER=$(cd "$(dirname "$0")" && pwd)/interop_peer.py
GCIDE=/usr/share/dictd/gcide.dict.dz
T=$W/setup
W=$W/$CASE-run
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2

need_venv() { # MODULE...: the venv imports them, or the case fails
  if ! "$PY" -c "import $1" 2>"$W/venv-err"; then
    echo "FAIL [$CASE]: $PY cannot import $1: run tools/install-deps.sh (it calls tools/install-venv.sh); $(tail -1 "$W/venv-err")" >&2
    exit 1
  fi
}
same_ids() { # A B WHAT
  if cmp -s "$1" "$2"; then ok "$3: $(wc -l <"$1") documents identical"; else
    fail "$3: $1 and $2 differ: $(diff "$1" "$2" | head -c 300)"
  fi
}

case $CASE in
setup)
  rm -rf "$T" && mkdir -p "$T"
  zcat "$GCIDE" | head -c 600000 >"$T/text.txt"
  expect 0 "train tokenizer" -- "$TKS" train-tokenizer --output "$T/tok" --vocab-size 1000 \
    --byte-fallback --doc-split blank-line "$T/text.txt"
  expect 0 "build dataset" -- "$TKS" build -q --tokenizer "$T/tok.model" --output "$T/data" \
    --doc-split blank-line --append-eos --shard-tokens 40K --chunk-bytes 4K "$T/text.txt"
  "$TKS" cat "$T/data" --ids >"$T/ids.txt" || fail "cat --ids"
  n=$(ls "$T/data"/shard-*.tks | wc -l)
  [[ $n -ge 3 ]] && ok "dataset has $n shards" || fail "dataset has only $n shards"
  ;;

megatron)
  need_venv megatron.core.datasets.indexed_dataset
  # export: zero copy (the .bin is the shard) and --copy, read by megatron-core
  expect 0 "export megatron (zero copy)" -- "$TKS" export --format megatron "$T/data" mz
  [[ -L mz_00000.bin ]] && ok "mz_00000.bin is a link" || fail "mz_00000.bin is not a link"
  expect 0 "megatron-core reads the zero-copy export" -- "$PY" "$PEER" megatron-read "$T/ids.txt" $(ls mz_*.idx | sed 's/\.idx$//')
  expect 0 "export megatron --copy" -- "$TKS" export --format megatron --copy "$T/data" mc
  [[ -f mc_00000.bin && ! -L mc_00000.bin ]] && ok "mc_00000.bin is a file" || fail "mc_00000.bin is not a plain file"
  expect 0 "megatron-core reads the copied export" -- "$PY" "$PEER" megatron-read "$T/ids.txt" $(ls mc_*.idx | sed 's/\.idx$//')
  expect 2 "export refuses to overwrite" -- "$TKS" export --format megatron "$T/data" mz
  expect_msg "mz_00000.bin already exists"

  # import what megatron-core's builder writes: uint16 and int32, documents of
  # two sequences, EOD at every end
  eod=$(head -1 "$T/ids.txt" | awk '{print $NF}')
  for dt in uint16 int32; do
    expect 0 "IndexedDatasetBuilder writes $dt" -- "$PY" "$PEER" megatron-write "$T/ids.txt" mw-$dt --dtype $dt --split
    expect 0 "audit --format megatron ($dt) is clean" -- "$TKS" audit --format megatron mw-$dt --model-vocab 1000 --eod "$eod"
    expect 0 "import --format megatron ($dt)" -- "$TKS" import --format megatron mw-$dt --output imp-$dt --tokenizer "$T/tok.model" --shard-tokens 30K
    expect 0 "imported dataset audits clean" -- "$TKS" audit imp-$dt --tokenizer "$T/tok.model" --model-vocab 1000
    "$TKS" cat imp-$dt --ids >imp-$dt.ids
    same_ids "$T/ids.txt" imp-$dt.ids "import of megatron $dt"
  done
  # --eod: an export of a dataset built with --append-eos ends every document with EOS
  expect 0 "audit --eod on the zero-copy export" -- "$TKS" audit --format megatron mz_00000 --model-vocab 1000 --eod "$eod"
  expect 1 "audit --eod with the wrong id" -- "$TKS" audit --format megatron mz_00000 --model-vocab 1000 --eod 5
  grep -q "not the EOD 5" out && ok "names the missing EOD" || fail "no EOD problem: $(head -3 out)"

  # an empty document is reported; import skips it
  expect 0 "builder with an empty document" -- "$PY" "$PEER" megatron-write "$T/ids.txt" mempty --empty-after 3
  expect 1 "audit finds the empty document" -- "$TKS" audit --format megatron mempty --model-vocab 1000
  grep -q "doc 4: document 4 is empty" out && ok "names document 4" || fail "empty document not named: $(head -3 out)"
  expect 0 "import skips it" -- "$TKS" import --format megatron mempty --output imp-empty --tokenizer "$T/tok.model"
  grep -q "1 empty skipped" out && ok "counted" || fail "not counted: $(cat out)"
  "$TKS" cat imp-empty --ids >imp-empty.ids
  same_ids "$T/ids.txt" imp-empty.ids "import without the empty document"

  # the failure tokshard exists for: an id past the vocabulary, found with its
  # document and offset, in the audit and in the import
  doc=7 pos=2
  off=$(head -$doc "$T/ids.txt" | awk '{n += NF} END {print n}')
  off=$((off + pos))
  expect 0 "builder with a forged id" -- "$PY" "$PEER" megatron-write "$T/ids.txt" mforged --forge $doc:$pos:1000
  expect 1 "audit catches the forged id" -- "$TKS" audit --format megatron mforged --model-vocab 1000 --json
  "$PY" - "$off" "$doc" <<'PYEOF' && ok "audit JSON names doc $doc, token $off, byte $((2 * off))" || fail "audit JSON: $(head -c 600 out)"
import json, sys
r = json.load(open("out"))
off, doc = int(sys.argv[1]), int(sys.argv[2])
p = r["problems"]
assert not r["ok"] and r["problems_total"] == 1, r
assert p[0]["kind"] == "token id out of vocabulary range" or "range" in p[0]["kind"], p[0]
assert p[0]["doc"] == doc and p[0]["token_offset"] == off and p[0]["byte_offset"] == 2 * off, p[0]
assert p[0]["file"].endswith("mforged.bin"), p[0]
PYEOF
  expect 2 "import refuses the forged id" -- "$TKS" import --format megatron mforged --output imp-forged --tokenizer "$T/tok.model"
  expect_msg "token id 1000 at token offset $off .*document $doc\) is outside the vocabulary \[0, 1000\)"
  [[ ! -e imp-forged ]] && ok "no dataset published" || fail "imp-forged exists"

  # structure: a truncated .bin, a pointer that does not match, a bad magic
  cp mw-uint16.idx mtrunc.idx && head -c -6 mw-uint16.bin >mtrunc.bin
  expect 1 "audit finds the truncated .bin" -- "$TKS" audit --format megatron mtrunc --model-vocab 1000
  grep -q "mtrunc.bin has .* bytes but .* describes .*truncated" out && ok "says truncated" || fail "$(head -3 out)"
  expect 2 "import refuses it" -- "$TKS" import --format megatron mtrunc --output imp-trunc --vocab-size 1000
  expect_msg "truncated"
  cp mw-uint16.bin mbad.bin && cp mw-uint16.idx mbad.idx && printf 'X' | dd of=mbad.idx bs=1 seek=0 conv=notrunc 2>/dev/null
  expect 1 "audit finds the bad magic" -- "$TKS" audit --format megatron mbad --model-vocab 1000
  grep -q "does not start with MMIDIDX" out && ok "says not Megatron" || fail "$(head -3 out)"
  expect 2 "audit --format needs --model-vocab" -- "$TKS" audit --format megatron mw-uint16
  expect_msg "--model-vocab N is required"

  # resume: an import interrupted after its first shards finishes byte-identical
  args=(import --format megatron mw-uint16 --tokenizer "$T/tok.model" --shard-tokens 8K)
  expect 0 "import (reference)" -- "$TKS" "${args[@]}" --output ref
  for point in import-shard:0 import-shard:3 import-state:2; do
    rm -rf r r.partial
    TOKSHARD_TEST_KILL=$point "$TKS" "${args[@]}" --output r >/dev/null 2>&1
    code=$?
    [[ $code -eq 137 ]] && ok "killed at $point (exit 137)" || fail "kill at $point: exit $code"
    [[ ! -e r ]] && ok "nothing under the final name" || fail "r exists after kill at $point"
    expect 2 "import again without --resume refuses" -- "$TKS" "${args[@]}" --output r
    expect_msg "add --resume"
    expect 0 "resume after kill at $point" -- "$TKS" "${args[@]}" --output r --resume
    grep -q "kept from the interrupted run" out || [[ $point == import-shard:0 ]] &&
      ok "kept shards reported" || fail "no kept shards: $(cat out)"
    diff -r r ref >/dev/null && ok "resumed import byte-identical" || fail "r differs from ref: $(diff -rq r ref | head -3)"
  done
  rm -rf r r.partial
  TOKSHARD_TEST_KILL=import-state:1 "$TKS" "${args[@]}" --output r >/dev/null 2>&1
  expect 2 "resume with other options refuses" -- "$TKS" "${args[@]}" --output r --resume --shard-tokens 9K
  expect_msg "another source, tokenizer or options"
  ;;

*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac
finish test_interop
