#!/usr/bin/env python3
"""The peers' own readers and writers for the interop tests (tests/interop.cmake).

Runs in the project venv (scripts/install-venv.sh): megatron-core 0.8.0 over
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
  llmc-write IDS PREFIX --eot ID [--model gpt-2|llama-3] [--shard-size N]
                                as llm.c's dev/data/fineweb.py: every document
                                gets the delimiter prepended (the EOS that ends
                                each IDS line is dropped first: it stands for the
                                text's end), shards of --shard-size tokens with a
                                document split across shards, written by
                                data_common.py's write_datafile layout
  llmc-read FILE... --ids IDS --eot ID
                                llm.c's llmc/dataloader.h checks (magic, version,
                                file size from the count) and the tokens: every
                                IDS document with ID prepended unless it starts
                                with it, back to back
  nanogpt-write IDS FILE        as nanoGPT's data/openwebtext/prepare.py: each
                                document's ids then the EOT (here the EOS that
                                ends each IDS line), uint16, no header
  datatrove-write IDS FILE.ds   as datatrove's DocumentTokenizer: "<H"-packed
                                tokens (the EOS is the tokenizer's post-processor
                                output), FILE.ds.index uint64 document ends,
                                FILE.ds.metadata "name|token size\ncount\n..."

References (read, not copied): karpathy/llm.c dev/data/data_common.py
(write_datafile, HEADERS_INFO), dev/data/fineweb.py (tokenize, the shard
loop), llmc/dataloader.h (dataloader_load_shard_); karpathy/nanoGPT
data/openwebtext/prepare.py; huggingface/datatrove
src/datatrove/pipeline/tokens/tokenizer.py (TokenizedFile).
"""
import struct
import sys

import numpy

LLMC_HEADERS = {"gpt-2": (20240520, 1, numpy.uint16), "llama-3": (20240801, 7, numpy.uint32)}


def llmc_write(ids_path, prefix, args):
    o = {"--model": "gpt-2", "--shard-size": "4000"}
    for k, v in zip(args[::2], args[1::2]):
        o[k] = v
    eot = int(o["--eot"])
    magic, version, dtype = LLMC_HEADERS[o["--model"]]
    shard_size = int(o["--shard-size"])
    docs = read_ids(ids_path)

    def write_datafile(name, toks):
        header = numpy.zeros(256, dtype=numpy.int32)
        header[0], header[1], header[2] = magic, version, len(toks)
        with open(name, "wb") as f:
            f.write(header.tobytes())
            f.write(numpy.array(toks, dtype=dtype).tobytes())

    # fineweb.py: fill a shard_size buffer; the document that does not fit is
    # split, its remainder starts the next shard; the last shard is partial
    buf = numpy.empty(shard_size, dtype=dtype)
    count, index = 0, 0
    for doc in docs:
        tokens = numpy.concatenate([[eot], doc[:-1]]).astype(dtype)
        if count + len(tokens) < shard_size:
            buf[count:count + len(tokens)] = tokens
            count += len(tokens)
        else:
            remainder = shard_size - count
            buf[count:count + remainder] = tokens[:remainder]
            write_datafile(f"{prefix}_{index:06d}.bin", buf)
            index += 1
            buf[0:len(tokens) - remainder] = tokens[remainder:]
            count = len(tokens) - remainder
    if count:
        write_datafile(f"{prefix}_{index:06d}.bin", buf[:count])
        index += 1
    print(f"ok: wrote {index} llm.c shards {prefix}_NNNNNN.bin ({o['--model']}, delimiter {eot})")


def llmc_read(args):
    files, ids_path, eot = [], None, None
    i = 0
    while i < len(args):
        if args[i] == "--ids":
            ids_path = args[i + 1]; i += 2
        elif args[i] == "--eot":
            eot = int(args[i + 1]); i += 2
        else:
            files.append(args[i]); i += 1
    got = []
    for name in files:
        with open(name, "rb") as f:
            header = numpy.frombuffer(f.read(1024), dtype=numpy.int32)
            data = f.read()
        # llmc/dataloader.h: magic, version, size = header + ntok * sizeof(uint16_t)
        if header[0] == 20240520:
            if header[1] != 1:
                sys.exit(f"FAIL: {name}: bad version {header[1]}")
            dtype = numpy.uint16
        elif header[0] == 20240801:
            if header[1] != 7:
                sys.exit(f"FAIL: {name}: bad version {header[1]}")
            dtype = numpy.uint32
        else:
            sys.exit(f"FAIL: {name}: bad magic {header[0]}")
        ntok = int(header[2])
        if ntok <= 0 or len(data) != ntok * numpy.dtype(dtype).itemsize:
            sys.exit(f"FAIL: {name}: {ntok} tokens in the header, {len(data)} bytes after it")
        got.append(numpy.frombuffer(data, dtype=dtype).astype(numpy.int64))
    got = numpy.concatenate(got)
    want = numpy.concatenate([d if eot is None or d[0] == eot else numpy.concatenate([[eot], d])
                              for d in read_ids(ids_path)])
    if not numpy.array_equal(got, want):
        sys.exit(f"FAIL: llm.c files hold {len(got)} tokens, expected {len(want)}; first difference at "
                 f"{int(numpy.argmax(got[:len(want)] != want[:len(got)]))}")
    print(f"ok: {len(files)} llm.c files pass llm.c's header checks and hold the {len(want)} expected tokens")


def nanogpt_write(ids_path, name):
    docs = read_ids(ids_path)
    ids = [numpy.concatenate([d[:-1], [d[-1]]]) for d in docs]  # text ids, then enc.eot_token
    arr = numpy.memmap(name, dtype=numpy.uint16, mode="w+", shape=(sum(len(x) for x in ids),))
    idx = 0
    for x in ids:
        arr[idx:idx + len(x)] = x
        idx += len(x)
    arr.flush()
    print(f"ok: wrote {name} as nanoGPT's prepare.py ({idx} tokens)")


def datatrove_write(ids_path, name):
    docs = read_ids(ids_path)
    ends, n = [], 0
    with open(name, "wb") as f:
        for d in docs:
            f.write(struct.pack("<%sH" % len(d), *[int(x) for x in d]))
            n += len(d)
            ends.append(n)
    with open(name + ".index", "wb") as f:
        f.write(struct.pack("<%sQ" % len(ends), *ends))
    with open(name + ".metadata", "wt") as f:
        f.write("\n".join(["tokshard-test-tokenizer|2", str(n), f"{n}T"]))
    print(f"ok: wrote {name} as datatrove's DocumentTokenizer ({len(docs)} documents, {n} tokens)")


def read_ids(path):
    with open(path) as f:
        return [numpy.array([int(x) for x in line.split()], dtype=numpy.int64) for line in f]


def megatron_read(ids_path, prefixes):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
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
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
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
    elif cmd == "llmc-write":
        llmc_write(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "llmc-read":
        llmc_read(sys.argv[2:])
    elif cmd == "nanogpt-write":
        nanogpt_write(sys.argv[2], sys.argv[3])
    elif cmd == "datatrove-write":
        datatrove_write(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
