#!/usr/bin/env python3
"""bpe_contender.py - one peer of bench/bench_bpe.py in a fresh process, through
its fastest public path: loads its tokenizer (timed apart), encodes every
document of a JSON Lines file ({"text": ...} records), writes the ids as flat
binary files and prints one JSON line.

Usage: bpe_contender.py PEER TOKENIZER JSONL IDS_PREFIX [--ranks STEM] [--threads N]
  PEER: tokenizers | fastokens | gigatoken | tiktoken | bpe-openai
  TOKENIZER: a tokenizer.json, or with --ranks cl100k|o200k a ranks file
  --threads: the peer's thread pool (RAYON_NUM_THREADS; 1 = one thread, no
           pool); the caller pins the process to as many cores (taskset)
What the clock covers, per peer:
  gigatoken   encode_files(JsonlFileSource([JSONL]), parallel=N>1): it reads
              and parses the file itself, as tokshard's build does
  fastokens   encode_batch_flat over the documents, read into a list before
              the clock (two buffers back: ids and offsets)
  tokenizers  encode_batch, the ids of each Encoding taken as lists
  tiktoken, bpe-openai  encode_ordinary per document (1 thread) or
              encode_ordinary_batch(num_threads=N)
CPU time: resource.getrusage(RUSAGE_SELF) before and after, user + system,
every thread of the process. Peak RSS: ru_maxrss right after the encode
(before the ids are converted and written); Linux carries ru_maxrss over
exec, so the caller starts this script from a small process
(/usr/bin/time), not straight from a large one.
Ids: IDS_PREFIX.ids (uint32) and IDS_PREFIX.off (uint64 document offsets),
little-endian (bpe_peers.write_flat).
Output: {"peer", "version", "threads", "load_s", "load_cpu_s", "encode_s",
"encode_cpu_s", "max_rss_mb", "docs", "tokens"}
"""
import argparse
import importlib.metadata as md
import json
import os
import resource
import sys
import time

from bpe_peers import tt_encoding, write_flat  # bench/, this script's directory

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
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime


def read_docs():
    with open(a.jsonl, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def lists_flat(out):
    """A list of id lists as (ids, offsets) arrays."""
    import itertools
    import numpy as np
    lens = np.fromiter((len(x) for x in out), np.uint64, len(out))
    ids = np.fromiter(itertools.chain.from_iterable(out), np.uint32, int(lens.sum()))
    return ids, np.concatenate([np.zeros(1, np.uint64), np.cumsum(lens, dtype=np.uint64)])


def awkward_flat(out):
    import awkward as ak
    import numpy as np
    lens = ak.to_numpy(ak.num(out)).astype(np.uint64)
    return ak.to_numpy(ak.flatten(out)), np.concatenate([np.zeros(1, np.uint64), np.cumsum(lens, dtype=np.uint64)])


docs = None if a.peer == "gigatoken" else read_docs()
w0, c0 = clock()
if a.peer == "tokenizers":
    import tokenizers
    t = tokenizers.Tokenizer.from_file(a.tokenizer)
    t.encode_special_tokens = True
    enc = lambda: [e.ids for e in t.encode_batch(docs, add_special_tokens=False)]
    flat = lists_flat
elif a.peer == "fastokens":
    import fastokens
    f = (fastokens.Tokenizer.from_tiktoken(a.tokenizer, encoding=a.ranks + "_base") if a.ranks
         else fastokens.Tokenizer.from_file(a.tokenizer))
    enc = lambda: f.encode_batch_flat(docs, add_special_tokens=False, split_special_tokens=True)
    flat = lambda out: out  # (ids bytes, offsets bytes), little-endian uint32 and uint64
elif a.peer == "gigatoken":
    import gigatoken
    if a.ranks:
        g = gigatoken.Tokenizer.from_tiktoken(a.tokenizer, pretokenizer=a.ranks, special_tokens={})
    else:
        with open(a.tokenizer, "rb") as fh:
            g = gigatoken.Tokenizer.from_json(fh.read())
    enc = lambda: g.encode_files(gigatoken.JsonlFileSource([a.jsonl]), parallel=a.threads > 1)
    flat = awkward_flat
elif a.peer in ("tiktoken", "bpe-openai"):
    if a.peer == "tiktoken":
        e = tt_encoding(a.ranks, a.tokenizer)
    else:
        import bpe_openai
        e = bpe_openai.get_encoding(a.ranks + "_base")
    enc = ((lambda: [e.encode_ordinary(d) for d in docs]) if a.threads == 1
           else (lambda: e.encode_ordinary_batch(docs, num_threads=a.threads)))
    flat = lists_flat
else:
    sys.exit("unknown peer " + a.peer)
w1, c1 = clock()
out = enc()
w2, c2 = clock()
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ids, off = flat(out)
write_flat(a.ids, ids, off)
n_docs = os.path.getsize(a.ids + ".off") // 8 - 1
try:
    version = md.version(a.peer)
except md.PackageNotFoundError:
    version = None
print(json.dumps({"peer": a.peer, "version": version, "threads": a.threads, "load_s": w1 - w0, "load_cpu_s": c1 - c0,
                  "encode_s": w2 - w1, "encode_cpu_s": c2 - c1, "max_rss_mb": rss_mb, "docs": n_docs,
                  "tokens": os.path.getsize(a.ids + ".ids") // 4}))
