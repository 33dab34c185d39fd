#!/usr/bin/python3
"""A Megatron-LM style preprocessing pipeline, as a baseline for tokshard build.

Modelled on the design of Megatron-LM's tools/preprocess_data.py (written
from a description of that design, not from its code):

  * the main process opens the input and hands the file object straight to
    multiprocessing.Pool(workers).imap(encode, lines, chunksize=32);
  * every worker loads the sentencepiece model once (Pool initializer) and
    encodes one line (one document) per call;
  * the main process receives the ids in input order and appends them to a
    .bin file as np.uint16 (vocab < 65500), collecting document lengths;
  * at the end it writes a .idx file: a small header, then the sequence
    lengths (int32), their byte offsets in .bin (int64) and the document
    boundaries (int64), like Megatron's mmap indexed dataset.

Documents are the lines of the input without the trailing newline. Documents
that tokenize to nothing are skipped (tokshard does the same), and counted.

Run with Debian's interpreter (/usr/bin/python3), which has the Debian
python3-sentencepiece and python3-numpy modules.

  megatron_style.py --model T.model --input TEXT --output-prefix P --workers N
  megatron_style.py --dump-ids P     # ids per document, like spm_encode --output_format=id
"""
import argparse
import multiprocessing
import struct
import sys
import time

import numpy as np
import sentencepiece as spm

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
               np.float64: 6, np.float32: 7, np.uint16: 8}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}

_sp = None


def _init_worker(model_path):
    global _sp
    _sp = spm.SentencePieceProcessor(model_file=model_path)


def encode(line):
    """Worker side: one line in, (ids, bytes of input consumed) out."""
    text = line[:-1] if line.endswith("\n") else line
    return _sp.encode(text), len(line)


class IndexedBuilder:
    """Appends documents to P.bin; writes P.idx on finalize."""

    def __init__(self, prefix, dtype):
        self.prefix = prefix
        self.dtype = dtype
        self.bin = open(prefix + ".bin", "wb")
        self.sizes = []

    def add_document(self, ids):
        arr = np.array(ids, dtype=self.dtype)
        self.bin.write(arr.tobytes(order="C"))
        self.sizes.append(arr.size)

    def finalize(self):
        self.bin.close()
        sizes = np.array(self.sizes, dtype=np.int32)
        itemsize = np.dtype(self.dtype).itemsize
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * itemsize, out=pointers[1:])
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)  # one sequence per document
        with open(self.prefix + ".idx", "wb") as f:
            f.write(IDX_MAGIC)
            f.write(struct.pack("<Q", IDX_VERSION))
            f.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(doc_idx)))
            f.write(sizes.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_idx.tobytes(order="C"))


def build(args):
    sp = spm.SentencePieceProcessor(model_file=args.model)
    dtype = np.uint16 if sp.get_piece_size() < 65500 else np.int32
    builder = IndexedBuilder(args.output_prefix, dtype)
    t0 = time.time()
    docs = empty = 0
    nbytes = 0
    with open(args.input, "r", encoding="utf-8") as fin:
        pool = multiprocessing.Pool(args.workers, initializer=_init_worker,
                                    initargs=(args.model,))
        for ids, n in pool.imap(encode, fin, args.chunksize):
            nbytes += n
            if not ids:
                empty += 1
                continue
            builder.add_document(ids)
            docs += 1
        pool.close()
        pool.join()
    builder.finalize()
    dt = time.time() - t0
    print(f"megatron_style: {docs} documents ({empty} empty skipped), {nbytes / 1e6:.1f} MB "
          f"(characters) in {dt:.2f} s, {args.workers} workers, chunksize {args.chunksize}",
          file=sys.stderr)


def dump_ids(prefix, out):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(len(IDX_MAGIC) + 8 + 1 + 8 + 8)
    if head[:len(IDX_MAGIC)] != IDX_MAGIC:
        sys.exit(f"{prefix}.idx: not an index file")
    off = len(IDX_MAGIC) + 8
    code = head[off]
    n_seq, n_doc = struct.unpack_from("<QQ", head, off + 1)
    pos = len(head)
    sizes = np.memmap(prefix + ".idx", dtype=np.int32, mode="r", offset=pos, shape=(n_seq,))
    pos += 4 * n_seq
    pointers = np.memmap(prefix + ".idx", dtype=np.int64, mode="r", offset=pos, shape=(n_seq,))
    dtype = CODE_DTYPES[code]
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    itemsize = np.dtype(dtype).itemsize
    w = out.write
    for i in range(n_seq):
        start = int(pointers[i]) // itemsize
        w(" ".join(map(str, tokens[start:start + int(sizes[i])].tolist())))
        w("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--input")
    p.add_argument("--output-prefix")
    p.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    p.add_argument("--chunksize", type=int, default=32)
    p.add_argument("--dump-ids", metavar="PREFIX")
    args = p.parse_args()
    if args.dump_ids:
        dump_ids(args.dump_ids, sys.stdout)
        return
    if not (args.model and args.input and args.output_prefix):
        p.error("--model, --input and --output-prefix are required")
    build(args)


if __name__ == "__main__":
    main()
