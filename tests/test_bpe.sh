#!/usr/bin/env bash
# Byte-level BPE against Hugging Face tokenizers (tests/bpe.cmake).
# Usage: test_bpe.sh peer|ids|long VENV_PYTHON TEST_BPE WORKDIR [MODEL]
#   peer: trains the tokenizers and writes tokenizers' ids (tests/bpe_peer.py)
#   ids MODEL: test_bpe compares tokshard's ids and decodes with them
#   long MODEL: a 1 MB single word and 1 MB of spaces, timed
#   build MODEL: tokshard build, audit, inspect and cat with the tokenizer.json
#   tiktoken MODEL: the same and more with a tiktoken ranks file
# Exit 77 (skipped) when the venv has no `tokenizers`.
set -uo pipefail
STEP=$1 PY=$2 BIN=$3 W=$4 MODEL=${5:-}
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import tokenizers" 2>/dev/null; then
  echo "skip: $PY cannot import tokenizers: run scripts/install-deps.sh (scripts/install-venv.sh makes the venv)" >&2
  exit 77
fi
case $STEP in
peer)
  rm -rf "$W" && mkdir -p "$W" || exit 2
  "$PY" "$HERE/bpe_peer.py" "$W"
  ;;
ids | long)
  if [[ -f $W/$MODEL.skip ]]; then
    echo "skip: $(cat "$W/$MODEL.skip")" >&2
    exit 77
  fi
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
build)
  # tokshard build with the tokenizer.json (and a tokenizer_config.json
  # naming its BOS and EOS): every document's ids in the dataset are
  # tokenizers' ids with the EOS appended (and the BOS for llama3), the
  # dataset audits clean, inspect and cat show the byte-level tokenizer and
  # cat decodes each document back to tokenizers' decode
  TKS=$(dirname "$BIN")/tokshard
  D=$W/build-$MODEL
  rm -rf "$D" && mkdir -p "$D/tok" || exit 2
  cp "$W/$MODEL.json" "$D/tok/tokenizer.json"
  fails=0
  fail() { echo "FAIL [build $MODEL]: $*" >&2; fails=$((fails + 1)); }
  ok() { echo "ok   [build $MODEL]: $*"; }
  bos_flag=()
  [[ $MODEL == llama3 ]] && bos_flag=(--prepend-bos)
  "$PY" - "$W" "$MODEL" "$D" ${bos_flag[@]+"${bos_flag[@]}"} <<'PY' || exit 1
import json, os, struct, sys
W, model, D = sys.argv[1:4]
bos = len(sys.argv) > 4
def docs(path):
    b, o, out = open(path, "rb").read(), 0, []
    while o < len(b):
        (n,) = struct.unpack_from("<Q", b, o)
        out.append(b[o + 8:o + 8 + n])
        o += 8 + n
    return out
texts, decs = docs(os.path.join(W, "docs.bin")), docs(os.path.join(W, model + ".dec"))
ids = open(os.path.join(W, model + ".ids")).read().split("\n")
other = open(os.path.join(W, ("gpt2" if model != "gpt2" else "llama3") + ".ids")).read().split("\n")
kept = differ = 0
special = dict(l.split(" ", 1)[::-1] for l in open(os.path.join(W, model + ".special")).read().splitlines())
eos = next(c for c in special if "end" in c)
# transformers' own form of a special token (an AddedToken dict) for the EOS, a string for the BOS
cfg = {"eos_token": {"__type": "AddedToken", "content": eos, "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False, "special": True}}
start = next((c for c in special if "begin" in c), None)
if start: cfg["bos_token"] = start
json.dump(cfg, open(os.path.join(D, "tok", "tokenizer_config.json"), "w"))
with open(os.path.join(D, "docs.jsonl"), "w") as j, open(os.path.join(D, "want.ids"), "w") as w, \
        open(os.path.join(D, "want.txt"), "wb") as t:
    for text, dec, line, oline in zip(texts, decs, ids, other):
        s = text.decode("utf-8")
        if not s or "\0" in s:  # the build skips empty documents; JSON Lines refuse NUL
            continue
        kept += 1
        differ += line != oline
        j.write(json.dumps({"text": s}) + "\n")
        w.write(" ".join(([special[start]] if bos else []) + line.split() + [special[eos]]) + "\n")
        t.write(struct.pack("<Q", len(dec) + len(eos.encode())) + dec + eos.encode())
open(os.path.join(D, "differ"), "w").write("%d %d\n" % (differ, kept))
PY
  if "$TKS" build --tokenizer "$D/tok/tokenizer.json" --output "$D/data" --append-eos ${bos_flag[@]+"${bos_flag[@]}"} \
    --threads 2 "$D/docs.jsonl" >"$D/out" 2>"$D/err"; then
    grep -q "encoder       byte-level BPE" "$D/out" && ok "built: $(grep documents "$D/out" | xargs)" ||
      fail "summary: $(cat "$D/out")"
  else
    fail "build: $(cat "$D/err")"
  fi
  "$TKS" cat "$D/data" --ids >"$D/got.ids" 2>"$D/err" || fail "cat --ids: $(cat "$D/err")"
  if cmp -s "$D/got.ids" "$D/want.ids"; then
    ok "$(wc -l <"$D/want.ids") documents: ids identical to tokenizers'"
  else
    fail "ids differ from tokenizers' (first differing document: $(diff <(cat "$D/got.ids") "$D/want.ids" | head -c 300))"
  fi
  "$TKS" audit "$D/data" --tokenizer "$D/tok/tokenizer.json" >"$D/out" 2>&1 &&
    grep -q "tokenizer checked" "$D/out" && ok "audit: $(cut -c1-80 "$D/out")" || fail "audit: $(cat "$D/out")"
  # one long document (the first 4 MB of the real documents joined): with 2
  # threads the build cuts it (tks_tok_next_cut) and encodes the parts on
  # both; its ids are tokenizers' ids of the whole text
  "$PY" - "$W" "$D" <<'PY' || exit 1
import json, os, struct, sys
from tokenizers import Tokenizer
W, D = sys.argv[1:3]
b, o, parts, size = open(os.path.join(W, "docs.bin"), "rb").read(), 0, [], 0
while o < len(b) and size < 4 << 20:
    (n,) = struct.unpack_from("<Q", b, o)
    s = b[o + 8:o + 8 + n].decode("utf-8")
    o += 8 + n
    if s and "\0" not in s:
        parts.append(s)
        size += n
text = "\n".join(parts)
open(os.path.join(D, "long.jsonl"), "w").write(json.dumps({"text": text}) + "\n")
ids = Tokenizer.from_file(os.path.join(D, "tok", "tokenizer.json")).encode(text, add_special_tokens=False).ids
open(os.path.join(D, "long.want"), "w").write(" ".join(map(str, ids)) + "\n")
PY
  if "$TKS" build --tokenizer "$D/tok/tokenizer.json" --output "$D/long" --threads 2 "$D/long.jsonl" \
    >"$D/out" 2>"$D/err"; then
    grep -Eq "long docs +1 documents cut into [0-9]+ parts" "$D/out" &&
      ok "one $(stat -c %s "$D/long.jsonl")-byte document: $(grep "long docs" "$D/out" | cut -c17-60)" ||
      fail "the long document was not cut: $(cat "$D/out")"
    "$TKS" cat "$D/long" --ids >"$D/long.got" 2>"$D/err" || fail "cat --ids: $(cat "$D/err")"
    cmp -s "$D/long.got" "$D/long.want" && ok "its ids, encoded in parts, are tokenizers' ids of the whole" ||
      fail "the long document's ids differ from tokenizers' ($(wc -w <"$D/long.got") vs $(wc -w <"$D/long.want") ids)"
  else
    fail "build of the long document: $(cat "$D/err")"
  fi
  # the dataset's tokenizer_config.json (its BOS, EOS, pad) is covered by the
  # manifest: edited, every reader refuses the dataset
  if [[ -f $D/data/tokenizer_config.json ]]; then
    cp -p "$D/data/tokenizer_config.json" "$D/config.bak"
    python3 - "$D/data/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["x_edited"] = 1; json.dump(c, open(sys.argv[1], "w"))
PY
    "$TKS" audit "$D/data" >"$D/out" 2>&1
    [[ $? -ne 0 ]] && grep -q "tokenizer_config.json does not match the manifest's config_xxh3" "$D/out" &&
      ok "an edited tokenizer_config.json fails the audit" || fail "edited config: $(tail -2 "$D/out")"
    cp -p "$D/config.bak" "$D/data/tokenizer_config.json"
    grep -q '"config_xxh3"' "$D/data/manifest.json" && ok "the manifest records config_xxh3" ||
      fail "no config_xxh3 in the manifest"
  fi
  "$TKS" inspect "$D/data" >"$D/out" 2>&1 && grep -q "tokenizer.json, byte-level-bpe" "$D/out" &&
    grep -Eq "eos [0-9]+" "$D/out" && ok "inspect: $(grep -E 'tokenizer |vocab_size' "$D/out" | xargs)" ||
    fail "inspect: $(head -5 "$D/out")"
  # cat decodes each document (the BOS and EOS as their text) as tokenizers decodes it
  "$TKS" cat "$D/data" --raw >"$D/got.txt" 2>"$D/err" || fail "cat: $(cat "$D/err")"
  "$PY" - "$D" ${bos_flag[@]+"${bos_flag[@]}"} <<'PY' && ok "cat: every document decodes as tokenizers decodes it" || fail "cat's text differs"
import struct, sys
D = sys.argv[1]
b, o, want = open(D + "/want.txt", "rb").read(), 0, []
while o < len(b):
    (n,) = struct.unpack_from("<Q", b, o); want.append(b[o + 8:o + 8 + n]); o += 8 + n
got = open(D + "/got.txt", "rb").read()
bos = b"<|begin_of_text|>" if len(sys.argv) > 2 else b""
exp = b"".join(bos + w + b"\n" for w in want)
if got != exp:
    i = next(k for k in range(min(len(got), len(exp))) if got[k] != exp[k]) if got[:len(exp)] != exp[:len(got)] else min(len(got), len(exp))
    print("differs at byte %d: got %r, want %r" % (i, got[i - 40:i + 40], exp[i - 40:i + 40]), file=sys.stderr)
    sys.exit(1)
PY
  # refusals: sentencepiece's encoder, a config naming a token that is not special, no EOS
  "$TKS" build --tokenizer "$D/tok/tokenizer.json" --output "$D/x" --encoder sentencepiece "$D/docs.jsonl" \
    >/dev/null 2>"$D/err"
  [[ $? -eq 2 ]] && grep -q "is a byte-level BPE tokenizer.json" "$D/err" && ok "--encoder sentencepiece refused" ||
    fail "--encoder sentencepiece: $(cat "$D/err")"
  mkdir -p "$D/bad" && cp "$D/tok/tokenizer.json" "$D/bad/" && echo '{"eos_token": "the"}' >"$D/bad/tokenizer_config.json"
  "$TKS" build --tokenizer "$D/bad/tokenizer.json" --output "$D/x" "$D/docs.jsonl" >/dev/null 2>"$D/err"
  [[ $? -ne 0 ]] && grep -q 'tokenizer_config.json: "eos_token" is "the", which is not a special token' "$D/err" &&
    ok "a tokenizer_config.json naming a non-special token is refused" || fail "bad config: $(cat "$D/err")"
  rm "$D/bad/tokenizer_config.json"
  "$TKS" build --tokenizer "$D/bad/tokenizer.json" --output "$D/x" --append-eos "$D/docs.jsonl" >/dev/null 2>"$D/err"
  [[ $? -eq 2 ]] && grep -q "has no EOS id.*tokenizer_config.json beside it" "$D/err" &&
    ok "--append-eos without an EOS is refused, naming tokenizer_config.json" || fail "no EOS: $(cat "$D/err")"
  [[ ! -e $D/x && ! -e $D/x.partial ]] && ok "nothing written for the refused builds" || fail "refused builds left $(ls -d "$D"/x*)"
  # verify-tokenizer A B: the documents on which two tokenizers disagree, as
  # many as tokenizers' own ids of the two disagree on; none for A A
  O=$([[ $MODEL == gpt2 ]] && echo llama3 || echo gpt2)
  read -r nd nk <"$D/differ"
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" "$W/$O.json" --format jsonl "$D/docs.jsonl" >"$D/out" 2>&1
  code=$?
  [[ $code -eq 1 ]] && grep -q "DIFFERENT ids on $nd of $nk documents" "$D/out" &&
    ok "verify-tokenizer against $O: $nd of $nk documents differ, as tokenizers' ids say" ||
    fail "verify-tokenizer A B (exit $code, want 1 and $nd of $nk): $(tail -2 "$D/out")"
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" "$D/tok/tokenizer.json" --format jsonl "$D/docs.jsonl" >"$D/out" 2>&1 &&
    grep -q "identical ids on all $nk documents" "$D/out" && ok "verify-tokenizer A A: identical on all $nk" ||
    fail "verify-tokenizer A A: $(tail -2 "$D/out")"
  # verify-tokenizer MODEL: the fast encoder against tokenizers itself, run by
  # the venv's Python; and, as its negative control, against tokenizers given
  # the other tokenizer (a --python that swaps the path): as many documents
  # differ as tokenizers' own ids of the two say
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" --python "$PY" --format jsonl "$D/docs.jsonl" >"$D/out" 2>&1 &&
    grep -q "identical ids from the fast encoder and tokenizers [0-9.]* ($PY) on $nk documents" "$D/out" &&
    ok "verify-tokenizer --python: $(head -1 "$D/out" | sed 's/.*(byte-level-bpe): //' | cut -c1-90)" ||
    fail "verify-tokenizer --python: $(tail -3 "$D/out")"
  # the reference runs isolated (python -I): a tokenizers.py or json.py in the
  # caller's directory is never imported (it would answer for the reference,
  # or run its code)
  mkdir -p "$D/hostile"
  printf 'open("%s", "w").write("imported")\n' "$D/hostile/ran" >"$D/hostile/tokenizers.py"
  cp "$D/hostile/tokenizers.py" "$D/hostile/json.py"
  (cd "$D/hostile" && "$TKS" verify-tokenizer "$D/tok/tokenizer.json" --python "$PY" --format jsonl \
    "$D/docs.jsonl") >"$D/out" 2>&1 && [[ ! -e $D/hostile/ran ]] &&
    grep -q "identical ids from the fast encoder and tokenizers [0-9.]*" "$D/out" &&
    ok "verify-tokenizer from a directory holding tokenizers.py and json.py: neither imported" ||
    fail "verify-tokenizer imported the caller's directory: $(ls "$D/hostile") $(tail -2 "$D/out")"
  # a --python path of any length is run as given (a 300-byte one was cut at 255)
  long=$D/$(printf 'p%.0s' {1..150})/$(printf 'q%.0s' {1..150})
  mkdir -p "$long" && printf '#!/bin/sh\nexec %q "$@"\n' "$PY" >"$long/python" && chmod +x "$long/python"
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" --python "$long/python" --format jsonl "$D/docs.jsonl" \
    >"$D/out" 2>&1 && grep -q "identical ids from the fast encoder and tokenizers" "$D/out" &&
    ok "verify-tokenizer --python with a ${#long}-byte folder" || fail "a long --python: $(tail -2 "$D/out")"
  printf '#!/bin/bash\n# argv: -I -c SCRIPT tokenizers PATH\na=("$@"); a[4]=%q\nexec %q "${a[@]}"\n' "$W/$O.json" "$PY" >"$D/swap-python"
  chmod +x "$D/swap-python"
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" --python "$D/swap-python" --format jsonl "$D/docs.jsonl" >"$D/out" 2>&1
  code=$?
  [[ $code -eq 1 ]] && grep -q "DIFFERENT ids from the fast encoder and tokenizers .* on $nd of $nk documents" "$D/out" &&
    grep -Eq "docs.jsonl line [0-9]+ \(document [0-9]+, [0-9]+ bytes\): first difference at id" "$D/out" &&
    ok "verify-tokenizer against tokenizers with $O.json: $nd of $nk documents differ" ||
    fail "verify-tokenizer, swapped peer (exit $code, want 1 and $nd of $nk): $(tail -2 "$D/out")"
  "$TKS" verify-tokenizer "$D/tok/tokenizer.json" --python "$D/nosuch" --format jsonl "$D/docs.jsonl" >"$D/out" 2>&1
  [[ $? -eq 2 ]] && grep -q "the Python reference through $D/nosuch: cannot be run" "$D/out" &&
    ok "verify-tokenizer --python NOSUCH: exit 2, naming it" || fail "--python NOSUCH: $(cat "$D/out")"
  if [[ $MODEL == llama3 ]]; then
    # the trainer on the byte-level dataset: its checkpoints carry tokenizer.json and
    # tokenizer_config.json, export-hf gives a directory AutoTokenizer reads with
    # tokenizers' ids, generation decodes bytes
    B=$(dirname "$BIN")
    "$B/tokshard-train" --dataset "$D/data" --out "$D/run" --steps 2 --dim 32 --n-layers 1 --n-heads 2 --n-kv-heads 1 \
      --seq-len 32 --global-batch 4 --val-tokens 0 --eval-every 0 --threads 2 --quiet --no-plot \
      >"$D/out" 2>&1 || fail "train: $(tail -5 "$D/out")"
    C=$D/run/checkpoints/step-00000002
    [[ -f $C/tokenizer.json && -f $C/tokenizer_config.json && ! -e $C/tokenizer.model ]] &&
      ok "the checkpoint carries tokenizer.json and tokenizer_config.json" || fail "checkpoint: $(ls "$C")"
    "$TKS" export-hf "$D/run" "$D/hf" >"$D/out" 2>&1 || fail "export-hf: $(cat "$D/out")"
    "$PY" - "$D/hf" "$D/docs.jsonl" "$D/want.ids" <<'PY' && ok "export-hf: AutoTokenizer gives tokenizers' ids; config.json has the EOS" ||
import json, sys
from transformers import AutoTokenizer
hf, docs, want = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(hf)
cfg = json.load(open(hf + "/config.json"))
ws = [l.split() for l in open(want)]
assert cfg["eos_token_id"] == int(ws[0][-1]) and cfg["bos_token_id"] == int(ws[0][0]), cfg
for k, line in enumerate(open(docs)):
    if k >= 300: break
    got = tok.encode(json.loads(line)["text"], add_special_tokens=False)
    assert [str(i) for i in got] == ws[k][1:-1], (k, got[:10], ws[k][1:11])
PY
      fail "export-hf's tokenizer"
    "$B/tokshard-generate" --checkpoint "$D/run" --prompt "The value of" --max-tokens 8 --seed 1 >"$D/out" 2>&1 &&
      grep -q "The value of" "$D/out" && ok "generate: $(head -c 80 "$D/out" | tr '\n' ' ')" ||
      fail "generate: $(cat "$D/out")"
  fi
  ((fails == 0)) || exit 1
  ;;
tiktoken)
  # tokshard with a tiktoken ranks file (MODEL: cl100k, OpenAI's real one):
  # build with --pattern, ids identical to tiktoken's with the EOS appended;
  # the dataset keeps tiktoken.json + tokenizer.tiktoken and audits clean; a
  # wrong --pattern is another tokenizer; verify-tokenizer; special tokens'
  # text counted, or encoded as the ids with --allow-special-in-text; the
  # audit reports special ids inside documents (in a Megatron export of that
  # dataset and in its import, not in the plain one); the trainer, export-hf
  # (AutoTokenizer with tiktoken's ids) and generate
  if [[ -f $W/$MODEL.skip ]]; then
    echo "skip: $(cat "$W/$MODEL.skip")" >&2
    exit 77
  fi
  TKS=$(dirname "$BIN")/tokshard B=$(dirname "$BIN")
  D=$W/tt-$MODEL
  P=$(cat "$W/$MODEL.pattern")
  rm -rf "$D" && mkdir -p "$D" || exit 2
  fails=0
  fail() { echo "FAIL [tiktoken $MODEL]: $*" >&2; fails=$((fails + 1)); }
  ok() { echo "ok   [tiktoken $MODEL]: $*"; }
  "$PY" - "$W" "$MODEL" "$D" <<'PY' || exit 1
import json, os, struct, sys
W, model, D = sys.argv[1:4]
b, o, texts = open(os.path.join(W, "docs.bin"), "rb").read(), 0, []
while o < len(b):
    (n,) = struct.unpack_from("<Q", b, o); texts.append(b[o + 8:o + 8 + n]); o += 8 + n
ids = open(os.path.join(W, model + ".ids")).read().split("\n")
allow = open(os.path.join(W, model + ".ids-allow")).read().split("\n")
eos = [l.split(" ", 1) for l in open(os.path.join(W, model + ".special")) if l.split(" ", 1)[1].strip() == "<|endoftext|>"][0][0]
# the documents of code points Unicode 14 does not assign are left out: tiktoken
# reads a later Unicode there (test_bpe compares them apart)
newer = set(int(x) for x in open(os.path.join(W, "docs.newer")).read().split(":", 1)[1].split())
with open(D + "/docs.jsonl", "w") as j, open(D + "/want.ids", "w") as w, open(D + "/want-allow.ids", "w") as wa, \
        open(D + "/want.txt", "wb") as t:
    for k, (text, line, aline) in enumerate(zip(texts, ids, allow)):
        s = text.decode("utf-8")
        if not s or "\0" in s or k in newer:
            continue
        j.write(json.dumps({"text": s}) + "\n")
        w.write(" ".join(line.split() + [eos]) + "\n")
        wa.write(" ".join(aline.split() + [eos]) + "\n")
        t.write(text + b"<|endoftext|>\n")
PY
  T=(--tokenizer "$W/$MODEL.tiktoken" --pattern "$P")
  if "$TKS" build "${T[@]}" --output "$D/data" --append-eos --threads 2 "$D/docs.jsonl" >"$D/out" 2>"$D/err"; then
    grep -q "special tokens' text" "$D/out" && ok "built; $(grep -E "special text" "$D/out" | cut -c1-90)" ||
      fail "the summary counts no special tokens' text: $(cat "$D/out")"
  else
    fail "build: $(cat "$D/err")"
  fi
  [[ -f $D/data/tiktoken.json && -f $D/data/tokenizer.tiktoken ]] && cmp -s "$D/data/tokenizer.tiktoken" "$W/$MODEL.tiktoken" &&
    ok "the dataset keeps tiktoken.json and the ranks file" || fail "dataset files: $(ls "$D/data")"
  "$TKS" cat "$D/data" --ids >"$D/got.ids" 2>"$D/err" || fail "cat --ids: $(cat "$D/err")"
  cmp -s "$D/got.ids" "$D/want.ids" && ok "$(wc -l <"$D/want.ids") documents: ids identical to tiktoken's" ||
    fail "ids differ from tiktoken's: $(diff "$D/got.ids" "$D/want.ids" | head -c 300)"
  "$TKS" cat "$D/data" --raw >"$D/got.txt" 2>"$D/err" && cmp -s "$D/got.txt" "$D/want.txt" &&
    ok "cat decodes every document to its text" || fail "cat --raw: $(cat "$D/err") $(cmp "$D/got.txt" "$D/want.txt")"
  "$TKS" audit "$D/data" >"$D/out" 2>&1 && ok "audit: $(cut -c1-70 "$D/out")" || fail "audit: $(cat "$D/out")"
  "$TKS" audit "$D/data" "${T[@]}" >"$D/out" 2>&1 && grep -q "tokenizer checked" "$D/out" &&
    ok "audit --tokenizer RANKS --pattern $P: the same tokenizer" || fail "audit --tokenizer: $(cat "$D/out")"
  "$TKS" audit "$D/data" --tokenizer "$W/$MODEL.tiktoken" --pattern llama3 >"$D/out" 2>&1
  [[ $? -eq 1 ]] && grep -q "not the tokenizer this dataset was built with" "$D/out" &&
    ok "the same ranks with another pattern are another tokenizer" || fail "audit --pattern llama3: $(cat "$D/out")"
  "$TKS" inspect "$D/data" >"$D/out" 2>&1 && grep -q "tiktoken.json, byte-level-bpe" "$D/out" &&
    ok "inspect: $(grep -E 'tokenizer ' "$D/out" | xargs | cut -c1-80)" || fail "inspect: $(head -5 "$D/out")"
  "$TKS" verify-tokenizer "$W/$MODEL.tiktoken" --pattern "$P" --reference own --format jsonl "$D/docs.jsonl" \
    >"$D/out" 2>&1 && grep -q "identical ids from the fast encoder and the reference" "$D/out" &&
    ok "verify-tokenizer --reference own: $(head -1 "$D/out" | cut -c1-100)" || fail "verify-tokenizer: $(cat "$D/out")"
  "$TKS" verify-tokenizer "$W/$MODEL.tiktoken" --pattern "$P" --python "$PY" --format jsonl "$D/docs.jsonl" \
    >"$D/out" 2>&1 && grep -q "identical ids from the fast encoder and tiktoken [0-9.]* ($PY)" "$D/out" &&
    ok "verify-tokenizer --python: $(head -1 "$D/out" | sed 's/.*(byte-level-bpe): //' | cut -c1-100)" ||
    fail "verify-tokenizer --python (tiktoken): $(tail -3 "$D/out")"
  "$TKS" build --tokenizer "$W/$MODEL.tiktoken" --output "$D/x" "$D/docs.jsonl" >/dev/null 2>"$D/err"
  [[ $? -eq 2 ]] && grep -q "give one with --pattern" "$D/err" && [[ ! -e $D/x.partial ]] &&
    ok "a ranks file without --pattern is refused" || fail "no --pattern: $(cat "$D/err")"
  # special tokens' text as the special ids
  "$TKS" build "${T[@]}" --output "$D/allow" --append-eos --allow-special-in-text "$D/docs.jsonl" >"$D/out" 2>&1 ||
    fail "build --allow-special-in-text: $(cat "$D/out")"
  "$TKS" cat "$D/allow" --ids >"$D/got.ids" 2>&1
  cmp -s "$D/got.ids" "$D/want-allow.ids" && grep -q '"special_from_text": true' "$D/allow/manifest.json" &&
    ok "--allow-special-in-text: tiktoken's ids with allowed_special=\"all\", recorded in the manifest" ||
    fail "--allow-special-in-text: $(diff "$D/got.ids" "$D/want-allow.ids" | head -c 300)"
  "$TKS" audit "$D/allow" >"$D/out" 2>&1 && ok "its audit expects the special ids" || fail "audit allow: $(cat "$D/out")"
  # special ids inside documents: a Megatron export of each, audited with the tokenizer
  "$TKS" export --format megatron --copy "$D/data" "$D/mg" >/dev/null 2>&1 &&
    "$TKS" export --format megatron --copy "$D/allow" "$D/mga" >/dev/null 2>&1 || fail "export megatron"
  "$TKS" audit --format megatron "$D/mg_00000" --tokenizer "$D/data/tiktoken.json" >"$D/out" 2>&1 &&
    ok "Megatron export of the plain dataset: no special id inside a document" || fail "audit mg: $(tail -3 "$D/out")"
  "$TKS" audit --format megatron "$D/mga_00000" --tokenizer "$D/data/tiktoken.json" >"$D/out" 2>&1
  [[ $? -eq 1 ]] && grep -q "which no text produces there" "$D/out" &&
    ok "Megatron export with special ids inside documents: $(grep -c 'no text produces' "$D/out") reported" ||
    fail "audit mga: $(tail -3 "$D/out")"
  "$TKS" import --format megatron "$D/mga_00000" --tokenizer "$D/data/tiktoken.json" --output "$D/imp" -q >/dev/null 2>&1 ||
    fail "import"
  "$TKS" audit "$D/imp" >"$D/out" 2>&1
  [[ $? -eq 1 ]] && grep -q "no text produces inside documents" "$D/out" &&
    ok "its import audits with the special ids reported" || fail "audit imp: $(tail -3 "$D/out")"
  # the trainer: the checkpoint carries the tokenizer; export-hf; generate
  "$B/tokshard-train" --dataset "$D/data" --out "$D/run" --steps 2 --dim 32 --n-layers 1 --n-heads 2 --n-kv-heads 1 \
    --seq-len 32 --global-batch 4 --val-tokens 0 --eval-every 0 --threads 2 --quiet --no-plot \
    >"$D/out" 2>&1 || fail "train: $(tail -5 "$D/out")"
  C=$D/run/checkpoints/step-00000002
  [[ -f $C/tiktoken.json && -f $C/tokenizer.tiktoken ]] && ok "the checkpoint carries tiktoken.json and the ranks" ||
    fail "checkpoint: $(ls "$C")"
  "$TKS" export-hf "$D/run" "$D/hf" >"$D/out" 2>&1 || fail "export-hf: $(cat "$D/out")"
  "$PY" - "$D/hf" "$D/docs.jsonl" "$D/want.ids" <<'PY' && ok "export-hf: AutoTokenizer gives tiktoken's ids on 300 documents" ||
import json, sys
from transformers import AutoTokenizer
hf, docs, want = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(hf)
ws = [l.split() for l in open(want)]
assert json.load(open(hf + "/config.json"))["eos_token_id"] == int(ws[0][-1])
for k, line in enumerate(open(docs)):
    if k >= 300: break
    got = tok.encode(json.loads(line)["text"], add_special_tokens=False)
    assert [str(i) for i in got] == ws[k][:-1], (k, got[:10], ws[k][:10])
PY
    fail "export-hf's tokenizer"
  "$B/tokshard-generate" --checkpoint "$D/run" --prompt "The value of" --max-tokens 8 --seed 1 >"$D/out" 2>&1 &&
    grep -q "The value of" "$D/out" && ok "generate: $(head -c 80 "$D/out" | tr '\n' ' ')" ||
    fail "generate: $(cat "$D/out")"
  ((fails == 0)) || exit 1
  ;;
*) echo "usage: $0 peer|ids|long|build|tiktoken VENV_PYTHON TEST_BPE WORKDIR [MODEL]" >&2; exit 2 ;;
esac
