#!/usr/bin/env python3
"""bpe_contender.py - one peer of bench/bench_bpe.py in a fresh process: loads
its tokenizer (timed apart), reads the documents of a JSON Lines file (not
timed: tokshard's figure includes its own reading, so the peers' encode-only
figures favour them), encodes them all (wall and CPU time of the encode
call), writes the ids, one document per line, and prints one JSON line.

Usage: bpe_contender.py PEER TOKENIZER JSONL IDS_OUT [--ranks STEM] [--threads N]
  PEER: tokenizers | fastokens | gigatoken | tiktoken | bpe-openai
  TOKENIZER: a tokenizer.json, or with --ranks cl100k|o200k a ranks file
  --threads: the peer's thread pool (RAYON_NUM_THREADS; 1 = one core)
Output: {"peer", "version", "load_s", "load_cpu_s", "encode_s", "encode_cpu_s", "docs", "tokens"}
"""
import argparse
import importlib.metadata as md
import json
import os
import sys
import time

from bpe_peers import tt_encoding  # bench/, this script's directory

p = argparse.ArgumentParser()
p.add_argument("peer")
p.add_argument("tokenizer")
p.add_argument("jsonl")
p.add_argument("ids")
p.add_argument("--ranks", default=None)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()
os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # before any Rust pool starts
os.environ["TOKENIZERS_PARALLELISM"] = "true" if a.threads > 1 else "false"


def clock():
    return time.perf_counter(), time.process_time()


def flat(ids, off):
    import numpy as np
    ids, off = np.frombuffer(ids, np.uint32), np.frombuffer(off, np.uint64)
    return [ids[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]


docs = [json.loads(line)["text"] for line in open(a.jsonl, encoding="utf-8")]
w0, c0 = clock()
if a.peer == "tokenizers":
    import tokenizers
    t = tokenizers.Tokenizer.from_file(a.tokenizer)
    t.encode_special_tokens = True
    enc = lambda: [e.ids for e in t.encode_batch(docs, add_special_tokens=False)]
elif a.peer == "fastokens":
    import fastokens
    f = (fastokens.Tokenizer.from_tiktoken(a.tokenizer, encoding=a.ranks + "_base") if a.ranks
         else fastokens.Tokenizer.from_file(a.tokenizer))
    enc = lambda: flat(*f.encode_batch_flat(docs, add_special_tokens=False, split_special_tokens=True))
elif a.peer == "gigatoken":
    import gigatoken
    g = (gigatoken.Tokenizer.from_tiktoken(a.tokenizer, pretokenizer=a.ranks, special_tokens={}) if a.ranks
         else gigatoken.Tokenizer(a.tokenizer))
    enc = lambda: g.encode_batch_list(docs, parallel=a.threads > 1)
elif a.peer == "tiktoken":
    e = tt_encoding(a.ranks, a.tokenizer)
    enc = lambda: [e.encode_ordinary(d) for d in docs]
elif a.peer == "bpe-openai":
    import bpe_openai
    e = bpe_openai.get_encoding(a.ranks + "_base")
    enc = lambda: [e.encode_ordinary(d) for d in docs]
else:
    sys.exit("unknown peer " + a.peer)
w1, c1 = clock()
out = enc()
w2, c2 = clock()
with open(a.ids, "w") as f:
    for ids in out:
        f.write(" ".join(map(str, ids)) + "\n")
try:
    version = md.version(a.peer)
except md.PackageNotFoundError:
    version = None
print(json.dumps({"peer": a.peer, "version": version, "load_s": w1 - w0, "load_cpu_s": c1 - c0,
                  "encode_s": w2 - w1, "encode_cpu_s": c2 - c1, "docs": len(out),
                  "tokens": sum(len(x) for x in out)}))
