#!/usr/bin/env python3
"""tiny_bytelevel.py - a small byte-level BPE tokenizer.json for tests: a
token for every byte (GPT-2's bytes_to_unicode, id = byte), then one token per
merge, in order, and optionally an end-of-text special token (written also as
eos_token in a tokenizer_config.json beside OUT).

Usage: tiny_bytelevel.py OUT.json [--eos TOKEN] MERGE...   (a MERGE is "a b")
"""
import json
import os
import sys

args = sys.argv[1:]
out, eos = args.pop(0), None
if args[:1] == ["--eos"]:
    eos = args[1]
    args = args[2:]
merges = [m.split(" ") for m in args]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte = dict(zip(bs, map(chr, cs)))  # GPT-2's bytes_to_unicode
vocab = {byte[b]: b for b in range(256)}
for a, b in merges:
    vocab[a + b] = len(vocab)
added = []
if eos:
    vocab[eos] = len(vocab)
    added = [{"id": len(vocab) - 1, "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]}},
          open(out, "w"))
if eos:
    json.dump({"eos_token": eos}, open(os.path.join(os.path.dirname(out), "tokenizer_config.json"), "w"))
