"""bpe_peers.py - what bench_bpe.py, bench_bpe_train.py, bpe_contender.py and
llama3_json.py share about the peers and the tokenizers."""

# Llama 3's pre-tokenization pattern (Meta's llama_models/llama3/tokenizer.py, pat_str)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_unicode():
    """GPT-2's bytes_to_unicode: byte b -> one printable character; the printable
    Latin-1 bytes stand for themselves, the others take 256, 257, ... in order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tree_utf8(root, exts=None):
    """The files under root as a benchmark's documents: every regular file
    (symlinks left out; with exts, a tuple, only names ending so), depth
    first in sorted order, not empty. Yields each file's text, or None for a
    file that is not strict UTF-8 (left out; the caller may count it)."""
    import os
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            fp = os.path.join(d, f)
            if os.path.islink(fp) or not os.path.isfile(fp) or (exts and not f.endswith(exts)):
                continue
            with open(fp, "rb") as fh:
                raw = fh.read()
            if not raw:
                continue
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None


def tt_encoding(stem, path):
    """tiktoken's own definition of cl100k_base/o200k_base over a local ranks file."""
    import tiktoken
    import tiktoken.load as tload
    import tiktoken_ext.openai_public as op
    op.load_tiktoken_bpe = lambda url, expected_hash=None: tload.load_tiktoken_bpe(path, expected_hash)
    return tiktoken.Encoding(**getattr(op, stem + "_base")())


def write_flat(prefix, ids, offsets):
    """A peer's ids as two files: PREFIX.ids (little-endian uint32, every
    document's ids one after the other) and PREFIX.off (little-endian uint64,
    documents + 1 offsets into it, in ids). ids, offsets: numpy arrays, or
    buffers in those layouts (fastokens' encode_batch_flat returns bytes)."""
    import numpy as np
    for x, dt, ext in ((ids, "<u4", ".ids"), (offsets, "<u8", ".off")):
        x = np.asarray(x, dt) if isinstance(x, np.ndarray) else np.frombuffer(x, dt)
        x.tofile(prefix + ext)


def read_flat(prefix):
    """(ids, offsets) as write_flat wrote them; the ids memory-mapped."""
    import os
    import numpy as np
    ids = (np.memmap(prefix + ".ids", dtype="<u4", mode="r") if os.path.getsize(prefix + ".ids")
           else np.zeros(0, "<u4"))
    return ids, np.fromfile(prefix + ".off", dtype="<u8")
