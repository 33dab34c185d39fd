#!/usr/bin/env bash
# Interop tests: other projects' datasets audited, imported and exported,
# each checked against the peer's own reader or writer (tests/interop_peer.py).
# Usage: test_interop.sh TOKSHARD VENV_PYTHON WORKDIR CASE   (WORKDIR shared)
#   CASE: setup | megatron | flat | python | hf
# `setup` builds the dataset the other cases share (a ctest fixture) from real
# text (dict-gcide). The peers run in the project venv (scripts/install-venv.sh);
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
    echo "FAIL [$CASE]: $PY cannot import $1: run scripts/install-deps.sh (it calls scripts/install-venv.sh); $(tail -1 "$W/venv-err")" >&2
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
  # llm.c's convention: the delimiter (here BOS) starts every document
  expect 0 "build dataset with BOS" -- "$TKS" build -q --tokenizer "$T/tok.model" --output "$T/data-bos" \
    --doc-split blank-line --prepend-bos --shard-tokens 40K "$T/text.txt"
  "$TKS" cat "$T/data-bos" --ids >"$T/bos-ids.txt" || fail "cat --ids"
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
  # kill -9 injected from outside (tests/fault_inject.c): after a shard is
  # published, and after the state records a shard (its 3rd write: the first
  # precedes any shard)
  [[ -n ${TKS_FAULT_LIB:-} && -r $TKS_FAULT_LIB ]] || { fail "TKS_FAULT_LIB not set (run through ctest)"; finish test_interop; }
  for point in shard:0 shard:3 rename:import-state.json:3; do
    rm -rf r r.partial
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=$point "$TKS" "${args[@]}" --output r >/dev/null 2>&1
    code=$?
    [[ $code -eq 137 ]] && ok "killed at $point (exit 137)" || fail "kill at $point: exit $code"
    [[ ! -e r ]] && ok "nothing under the final name" || fail "r exists after kill at $point"
    expect 2 "import again without --resume refuses" -- "$TKS" "${args[@]}" --output r
    expect_msg "add --resume"
    expect 0 "resume after kill at $point" -- "$TKS" "${args[@]}" --output r --resume
    grep -q "kept from the interrupted run" out || [[ $point == shard:0 ]] &&
      ok "kept shards reported" || fail "no kept shards: $(cat out)"
    diff -r r ref >/dev/null && ok "resumed import byte-identical" || fail "r differs from ref: $(diff -rq r ref | head -3)"
  done
  rm -rf r r.partial
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:import-state.json:2 "$TKS" "${args[@]}" --output r >/dev/null 2>&1
  expect 2 "resume with other options refuses" -- "$TKS" "${args[@]}" --output r --resume --shard-tokens 9K
  expect_msg "another source, tokenizer or options"
  ;;

flat)
  # these peers' writers need numpy only; the venv has it
  need_venv numpy
  eos=$(head -1 "$T/ids.txt" | awk '{print $NF}')
  bos=$(head -1 "$T/bos-ids.txt" | awk '{print $1}')

  # llm.c: shards written as fineweb.py writes them (a document split across
  # two shards), audited and imported one file at a time
  expect 0 "llm.c writer" -- "$PY" "$PEER" llmc-write "$T/ids.txt" lw --eot "$eos" --shard-size 30000
  : >lw-all.ids
  for f in lw_*.bin; do
    expect 0 "audit --format llmc $f" -- "$TKS" audit --format llmc "$f" --eot "$eos" --model-vocab 1000
    expect 0 "import --format llmc $f" -- "$TKS" import --format llmc "$f" --eot "$eos" --output "imp-$f" --tokenizer "$T/tok.model"
    "$TKS" cat "imp-$f" --ids >>lw-all.ids
  done
  "$PY" - "$T/ids.txt" lw-all.ids "$eos" lw_*.bin <<'PYEOF' && ok "llm.c import: every token, one document per delimiter, split document kept as two" || fail "llm.c import does not match its files"
import sys, numpy
ids, got, eot, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
docs = [numpy.array(l.split(), dtype=numpy.int64) for l in open(ids)]
lines = [numpy.array(l.split(), dtype=numpy.int64) for l in open(got)]
want = numpy.concatenate([numpy.concatenate([[eot], d[:-1]]) for d in docs])
assert numpy.array_equal(numpy.concatenate(lines), want), "tokens differ"
starts = [int(numpy.fromfile(f, dtype=numpy.uint16, offset=1024)[0]) for f in files]
cont = sum(s != eot for s in starts)
assert len(files) >= 2 and cont >= 1, (len(files), starts)
assert len(lines) == len(docs) + cont, (len(lines), len(docs), cont)
assert sum(l[0] != eot for l in lines) == cont
PYEOF
  expect 0 "continued document reported" -- "$TKS" import --format llmc lw_000001.bin --eot "$eos" --output imp-cont --vocab-size 1000
  grep -q "continues a document from the previous file" out && ok "says so" || fail "$(cat out)"
  # a forged id in an llm.c file: named with its token and byte offset
  cp lw_000000.bin lforged.bin
  printf '\xe8\x03' | dd of=lforged.bin bs=1 seek=$((1024 + 2 * 100)) conv=notrunc 2>/dev/null
  expect 1 "audit catches the forged id" -- "$TKS" audit --format llmc lforged.bin --eot "$eos" --model-vocab 1000
  grep -q "token 100 byte 1224 doc [0-9]*: token id 1000" out && ok "named at token 100, byte 1224" || fail "$(head -3 out)"
  head -c -2 lw_000000.bin >ltrunc.bin
  expect 1 "audit finds a truncated llm.c file" -- "$TKS" audit --format llmc ltrunc.bin --model-vocab 1000
  grep -q "header counts .* tokens .* truncated" out && ok "says truncated" || fail "$(head -3 out)"

  # export --format llmc: files that pass llm.c's own header checks and hold
  # the documents with the delimiter first
  expect 0 "export llmc (BOS-first documents)" -- "$TKS" export --format llmc "$T/data-bos" le
  expect 0 "llm.c reads them" -- "$PY" "$PEER" llmc-read le_*.bin --ids "$T/bos-ids.txt" --eot "$bos"
  expect 0 "export llmc --eot BOS inserts nothing" -- "$TKS" export --format llmc --eot "$bos" "$T/data-bos" le2
  cmp -s le_00000.bin le2_00000.bin && ok "identical" || fail "le2 differs from le"
  expect 0 "export llmc --eot EOS (EOS-ended documents)" -- "$TKS" export --format llmc --eot "$eos" "$T/data" le3
  expect 0 "llm.c reads them, delimiter prepended" -- "$PY" "$PEER" llmc-read le3_*.bin --ids "$T/ids.txt" --eot "$eos"
  expect 0 "round trip: import the export" -- "$TKS" import --format llmc le_00000.bin --eot "$bos" --output rt --tokenizer "$T/tok.model"
  "$TKS" cat "$T/data-bos/shard-00000.tks" --ids >bos0.ids
  "$TKS" cat rt --ids >rt.ids
  same_ids bos0.ids rt.ids "llm.c round trip"

  # nanoGPT: headerless uint16, EOT appended
  expect 0 "nanoGPT writer" -- "$PY" "$PEER" nanogpt-write "$T/ids.txt" train.bin
  expect 0 "audit --format raw" -- "$TKS" audit --format raw --dtype u16 --eot "$eos" train.bin --model-vocab 1000
  expect 0 "import --format raw" -- "$TKS" import --format raw --dtype u16 --eot "$eos" train.bin --output imp-raw --tokenizer "$T/tok.model"
  "$TKS" cat imp-raw --ids >raw.ids
  same_ids "$T/ids.txt" raw.ids "nanoGPT import"
  head -c -4 train.bin >rtrunc.bin
  expect 1 "audit: raw file cut inside a document" -- "$TKS" audit --format raw --dtype u16 --eot "$eos" rtrunc.bin --model-vocab 1000
  grep -q "does not end with the EOT" out && ok "says so" || fail "$(head -3 out)"
  expect 2 "raw needs --dtype" -- "$TKS" audit --format raw train.bin --model-vocab 1000
  expect_msg "--dtype u16"

  # datatrove: .ds + .ds.index (+ .ds.metadata for the token size)
  expect 0 "datatrove writer" -- "$PY" "$PEER" datatrove-write "$T/ids.txt" dt.ds
  expect 0 "audit --format datatrove --eod" -- "$TKS" audit --format datatrove dt.ds --model-vocab 1000 --eod "$eos"
  expect 0 "import --format datatrove" -- "$TKS" import --format datatrove dt.ds --output imp-dt --tokenizer "$T/tok.model"
  "$TKS" cat imp-dt --ids >dt.ids
  same_ids "$T/ids.txt" dt.ids "datatrove import"
  cp dt.ds bad.ds && head -c -8 dt.ds.index >bad.ds.index && cp dt.ds.metadata bad.ds.metadata
  expect 1 "audit: datatrove index missing its last end" -- "$TKS" audit --format datatrove bad.ds --model-vocab 1000
  grep -q "the last document ends at token" out && ok "says so" || fail "$(head -3 out)"
  ;;

python)
  need_venv "numpy, torch"
  expect 0 "Python package against cat --ids and sample-plan --json" -- "$PY" "$(dirname "$PEER")/test_python.py" "$TKS" "$T/data" "$W/py"
  cat out
  # the package installs with pip (offline here: numpy and setuptools come from
  # the system) and works from outside the source tree
  expect 0 "pip install ./python into a fresh venv" -- bash -c "/usr/bin/python3 -m venv --system-site-packages '$W/venv' && '$W/venv/bin/pip' install -q --no-deps --no-build-isolation '$(dirname "$PEER")/../python'"
  cd /
  expect 0 "the installed package reads the dataset" -- "$W/venv/bin/python" -c "import tokshard; d = tokshard.Dataset('$T/data', verify=True); print(d.n_docs, tokshard.__file__)"
  grep -q "$W/venv/.*site-packages/tokshard" "$W/out" && ok "imported from the venv" || fail "imported from $(cat "$W/out")"
  cd "$W"
  ;;

hf)
  need_venv "transformers, torch"
  TRAIN=$(dirname "$TKS")/tokshard-train
  DUMP=$(dirname "$TKS")/hf_logits_dump
  expect 0 "train a small model" -- "$TRAIN" --dataset "$T/data" --out run --steps 6 --save-every 6 \
    --dim 32 --n-layers 2 --n-heads 4 --n-kv-heads 2 --seq-len 32 --global-batch 8 --threads 1
  ck=$(ls -d run/checkpoints/step-* | tail -1)
  for f in tokenizer.json tokenizer_config.json; do
    [[ -s $ck/$f ]] && ok "checkpoint has $f" || fail "$ck has no $f"
  done
  grep -q '"bos_token_id": 1' "$ck/config.json" && ok "checkpoint config.json has bos_token_id" || fail "$(cat "$ck/config.json")"
  expect 0 "export-hf" -- "$TKS" export-hf run hf
  ls hf | sort | tr '\n' ' ' >files
  [[ $(cat files) == "config.json model.safetensors tokenizer.json tokenizer.model tokenizer_config.json " ]] &&
    ok "hf/ holds the model and tokenizer, no optimizer state" || fail "hf/ holds $(cat files)"
  expect 2 "export-hf refuses an existing DIR" -- "$TKS" export-hf run hf
  expect_msg "already exists"
  cp -r "$ck" bad-ck && printf 'x' | dd of=bad-ck/model.safetensors bs=1 seek=200 conv=notrunc 2>/dev/null
  expect 2 "export-hf refuses a corrupt checkpoint" -- "$TKS" export-hf bad-ck hf-bad
  [[ ! -e hf-bad ]] && ok "nothing written" || fail "hf-bad exists"
  expect 0 "unigram tokenizer" -- "$TKS" train-tokenizer --output uni --model-type unigram --vocab-size 1000 \
    --doc-split blank-line "$T/text.txt"
  expect 0 "export-hf --tokenizer" -- "$TKS" export-hf --tokenizer uni.model uni-hf
  cp uni.model uni-hf/tokenizer.model
  expect 0 "transformers against tokshard and spm_encode" -- "$PY" "$(dirname "$PEER")/test_hf.py" hf "$ck" "$DUMP" \
    "$T/tok.model" uni-hf uni.model "$W/py"
  cat out
  ;;

*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac
finish test_interop
