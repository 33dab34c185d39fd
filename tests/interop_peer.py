#!/usr/bin/env python3
"""The peers' own readers and writers for the interop tests (tests/interop.cmake).

Runs in the project venv (tools/install-venv.sh): megatron-core 0.8.0 over
Debian's python3-torch. Every subcommand exits non-zero on a mismatch.

  megatron-read IDS PREFIX...   megatron-core's IndexedDataset reads the prefixes
                                in order; every document must equal the lines of
                                IDS (`tokshard cat --ids`)
  megatron-write IDS PREFIX [--dtype uint16|int32] [--split] [--empty-after N]
                 [--eod ID] [--forge DOC:POS:ID]
                                megatron-core's IndexedDatasetBuilder writes the
                                documents of IDS (--split: documents of 3+ tokens
                                as two sequences; --empty-after N: an empty
                                document after document N; --eod: appended to each
                                document; --forge: id at DOC:POS replaced)
"""
import sys

import numpy
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def read_ids(path):
    with open(path) as f:
        return [numpy.array([int(x) for x in line.split()], dtype=numpy.int64) for line in f]


def megatron_read(ids_path, prefixes):
    want = read_ids(ids_path)
    got = []
    for p in prefixes:
        ds = IndexedDataset(p)
        di = ds.document_indices
        assert di[0] == 0 and di[-1] == len(ds), f"{p}: document indices {di[:3]}...{di[-1]}"
        for d in range(len(di) - 1):
            seqs = [ds[i] for i in range(di[d], di[d + 1])]
            got.append(numpy.concatenate(seqs).astype(numpy.int64) if seqs else numpy.zeros(0, numpy.int64))
    if len(got) != len(want):
        sys.exit(f"FAIL: megatron-core reads {len(got)} documents, tokshard cat --ids printed {len(want)}")
    for d, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or not numpy.array_equal(g, w):
            sys.exit(f"FAIL: document {d} differs: megatron-core {g[:8]}... ({len(g)}) vs tokshard {w[:8]}... ({len(w)})")
    print(f"ok: megatron-core IndexedDataset reads {len(got)} documents, "
          f"{sum(len(g) for g in got)} tokens, identical to tokshard cat --ids")


def megatron_write(ids_path, prefix, args):
    dtype = numpy.uint16
    split = False
    empty_after = None
    eod = None
    forge = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--dtype":
            dtype = {"uint16": numpy.uint16, "int32": numpy.int32}[args[i + 1]]; i += 1
        elif a == "--split":
            split = True
        elif a == "--empty-after":
            empty_after = int(args[i + 1]); i += 1
        elif a == "--eod":
            eod = int(args[i + 1]); i += 1
        elif a == "--forge":
            forge = tuple(int(x) for x in args[i + 1].split(":")); i += 1
        else:
            sys.exit(f"unknown option {a}")
        i += 1
    docs = read_ids(ids_path)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d, doc in enumerate(docs):
        doc = doc.copy()
        if eod is not None:
            doc = numpy.append(doc, eod)
        if forge and forge[0] == d:
            doc[forge[1]] = forge[2]
        # as preprocess_data.py: one add_document per document, with the
        # lengths of its sequences (sentences with --split-sentences)
        if split and len(doc) >= 3:
            lengths = [len(doc) // 2, len(doc) - len(doc) // 2]
        else:
            lengths = [len(doc)]
        builder.add_document(torch.from_numpy(doc), lengths)
        if empty_after is not None and d == empty_after:
            builder.add_document(torch.zeros(0, dtype=torch.int64), [])
    builder.finalize(prefix + ".idx")
    print(f"ok: megatron-core IndexedDatasetBuilder wrote {prefix} ({len(docs)} documents, {dtype.__name__})")


def main():
    cmd = sys.argv[1]
    if cmd == "megatron-read":
        megatron_read(sys.argv[2], sys.argv[3:])
    elif cmd == "megatron-write":
        megatron_write(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
