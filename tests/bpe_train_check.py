"""Compares tokshard's trained tokenizer.json with Hugging Face's
(test_bpe_train.sh hf): the vocabulary (every token, with its id, in id
order), the merges (in order), the added tokens, and the pre-tokenizer's
regex. Any python3: JSON only.

Usage: bpe_train_check.py MINE.json REF.json ARGS.json
Exit 0 when equal; 1 with the first difference.
"""
import json
import sys

mine, ref, args = (json.load(open(p, encoding="utf-8")) for p in sys.argv[1:4])
fails = []
mv, rv = mine["model"]["vocab"], ref["model"]["vocab"]
if list(mv.items()) != list(rv.items()):
    diff = next((i for i, (a, b) in enumerate(zip(mv.items(), rv.items())) if a != b), min(len(mv), len(rv)))
    fails.append(f"vocab: {len(mv)} tokens, tokenizers {len(rv)}; first difference at position {diff}: "
                 f"{list(mv.items())[diff:diff + 1]} vs {list(rv.items())[diff:diff + 1]}")
mm = [list(m) if isinstance(m, list) else m.split(" ", 1) for m in mine["model"]["merges"]]
rm = [list(m) if isinstance(m, list) else m.split(" ", 1) for m in ref["model"]["merges"]]
if mm != rm:
    diff = next((i for i, (a, b) in enumerate(zip(mm, rm)) if a != b), min(len(mm), len(rm)))
    fails.append(f"merges: {len(mm)}, tokenizers {len(rm)}; first difference at rank {diff}: "
                 f"{mm[diff:diff + 1]} vs {rm[diff:diff + 1]}")
strip = lambda ts: [(t["id"], t["content"], t["special"]) for t in ts]
if strip(mine["added_tokens"]) != strip(ref["added_tokens"]):
    fails.append(f"added tokens: {strip(mine['added_tokens'])} vs {strip(ref['added_tokens'])}")
pt = mine["pre_tokenizer"]
if args["pattern"] == "gpt2":
    ok = pt["type"] == "ByteLevel" and pt["use_regex"] and not pt["add_prefix_space"]
else:
    seq = pt.get("pretokenizers", [{}, {}])
    ok = (pt["type"] == "Sequence" and seq[0].get("pattern", {}).get("Regex") == args["regex"] and
          seq[0].get("behavior") == "Isolated" and seq[1].get("type") == "ByteLevel" and not seq[1]["use_regex"])
if not ok:
    fails.append(f"pre_tokenizer {json.dumps(pt)[:300]} is not the peer's for {args['pattern']}")
if mine["model"].get("ignore_merges") is not False or mine["model"].get("byte_fallback") is not False:
    fails.append("model flags: ignore_merges and byte_fallback must be false by default")
for f in fails:
    print("FAIL:", f, file=sys.stderr)
if not fails:
    print(f"ok: {len(mv)} tokens and {len(mm)} merges equal tokenizers' in order")
sys.exit(1 if fails else 0)
