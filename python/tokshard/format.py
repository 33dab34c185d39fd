"""The tokshard shard and dataset format (docs/FORMAT.md, versions 1 and 2),
read with numpy: every array is a view into the memory-mapped file, no copy.
Version 2 adds each document's provenance (where it came from in the build's
inputs) after the checksum table."""
import bisect
import json
import os
import stat
import struct

import numpy

MAGIC = b"TKSHARD\x1a"
VERSION = 2  # the newest version this reader knows; it reads 1 and 2
VERSIONS = (1, 2)
HEADER_SIZE = 256
PROV_RECORD_BYTES = 24
# one document's provenance record (docs/FORMAT.md, "Provenance section")
PROV_DTYPE = numpy.dtype([("file", "<u4"), ("entry", "<u4"), ("offset", "<u8"), ("length", "<u4"),
                          ("text_xxh", "<u4")])
TOKEN_ALIGN = 4096
NO_ID = 0xFFFFFFFF
U16_MAX_VOCAB = 65536

# name, offset, struct code (docs/FORMAT.md, "Header (256 bytes)")
_FIELDS = [
    ("version", 8, "I"), ("header_size", 12, "I"), ("token_bytes", 16, "I"), ("vocab_size", 20, "I"),
    ("bos_id", 24, "I"), ("eos_id", 28, "I"), ("pad_id", 32, "I"), ("chunk_bytes", 36, "I"),
    ("n_docs", 56, "Q"), ("n_tokens", 64, "Q"), ("min_token_id", 72, "I"), ("max_token_id", 76, "I"),
    ("tokens_offset", 80, "Q"), ("tokens_bytes", 88, "Q"), ("index_offset", 96, "Q"),
    ("index_bytes", 104, "Q"), ("table_offset", 112, "Q"), ("table_bytes", 120, "Q"),
    ("n_chunks", 128, "Q"), ("file_size", 136, "Q"), ("shard_index", 144, "I"), ("flags", 148, "I"),
    ("table_xxh3", 152, "Q"), ("prov_offset", 160, "Q"), ("prov_bytes", 168, "Q"), ("prov_xxh3", 176, "Q"),
    ("header_xxh3", 248, "Q"),
]


class FormatError(Exception):
    """A file that is not a valid tokshard shard or dataset; the message names
    the file, the offset where it applies, and what to do."""


class Shard:
    """One shard file, memory-mapped. Opening checks the header fields, the
    canonical layout, the real file size, the zero padding and the document
    index (O(header + index)); verify=True also checks every checksum (header,
    table, index and each token chunk: O(file)), as `tokshard audit` does.

    tokens: numpy array (uint16 or uint32, little-endian) of n_tokens ids,
            a view into the file.
    index:  numpy uint64 array of n_docs + 1 document offsets.
    provenance: version 2: a numpy structured array (PROV_DTYPE) of n_docs
            records, where each document came from in the build's inputs;
            None for a version 1 shard.
    """

    def __init__(self, path, verify=False):
        self.path = str(path)
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise FormatError(f"{self.path}: cannot open the shard ({e.strerror})")
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block numpy.memmap for ever
            raise FormatError(f"{self.path} is not a regular file: put the real shard in its place")
        if st.st_size < HEADER_SIZE:  # numpy.memmap refuses an empty file with ValueError
            raise FormatError(f"{self.path}: {st.st_size} bytes, less than the 256-byte header: truncated; "
                              f"rebuild the dataset")
        self._mm = numpy.memmap(self.path, dtype=numpy.uint8, mode="r")
        size = self._mm.shape[0]
        if size < HEADER_SIZE:
            raise FormatError(f"{self.path}: {size} bytes, less than the 256-byte header: truncated; rebuild the dataset")
        raw = bytes(self._mm[:HEADER_SIZE])
        if raw[:8] != MAGIC:
            raise FormatError(f"{self.path}: not a tokshard shard (magic {raw[:8]!r} at offset 0)")
        h = {name: struct.unpack_from("<" + code, raw, off)[0] for name, off, code in _FIELDS}
        h["tokenizer_fp"] = raw[40:56].hex()
        self.header = h
        if h["version"] not in VERSIONS:
            raise FormatError(f"{self.path}: format version {h['version']}, this reader knows {VERSIONS}: "
                              f"update the tokshard Python package")
        v2 = h["version"] == 2
        tb = h["token_bytes"]
        n_chunks = -(-h["n_tokens"] * tb // h["chunk_bytes"]) if h["chunk_bytes"] else -1
        idx_off = TOKEN_ALIGN + h["n_tokens"] * tb
        idx_off += (-idx_off) % 8
        want = {
            "header_size": HEADER_SIZE, "token_bytes": 2 if h["vocab_size"] <= U16_MAX_VOCAB else 4,
            "tokens_offset": TOKEN_ALIGN, "tokens_bytes": h["n_tokens"] * tb, "index_offset": idx_off,
            "index_bytes": (h["n_docs"] + 1) * 8, "table_offset": idx_off + (h["n_docs"] + 1) * 8,
            "n_chunks": n_chunks, "table_bytes": (n_chunks + 1) * 8, "flags": 0,
        }
        want["file_size"] = want["table_offset"] + want["table_bytes"]
        want["prov_offset"] = want["file_size"] if v2 else 0
        want["prov_bytes"] = h["n_docs"] * PROV_RECORD_BYTES if v2 else 0
        want["file_size"] += want["prov_bytes"]
        for k, v in want.items():
            if h[k] != v:
                raise FormatError(f"{self.path}: header field {k} is {h[k]}, the layout needs {v}: "
                                  f"corrupt header; run `tokshard audit {self.path}`")
        if h["n_docs"] < 1 or h["n_tokens"] < h["n_docs"] or not (h["min_token_id"] <= h["max_token_id"] < h["vocab_size"]):
            raise FormatError(f"{self.path}: inconsistent counts or id range in the header; run `tokshard audit`")
        if h["file_size"] != size:
            raise FormatError(f"{self.path}: {size} bytes but the header says {h['file_size']}: "
                              f"truncated or extended; rebuild (tokshard build --resume) or restore it")
        pad = numpy.concatenate([self._mm[HEADER_SIZE:TOKEN_ALIGN], self._mm[TOKEN_ALIGN + h["tokens_bytes"]:idx_off]])
        if pad.any():
            raise FormatError(f"{self.path}: non-zero padding bytes; run `tokshard audit {self.path}`")
        reserved = raw[184:248] if v2 else raw[160:248]
        if reserved.count(0) != len(reserved):
            raise FormatError(f"{self.path}: reserved header bytes are not zero")
        dt = numpy.dtype("<u2") if tb == 2 else numpy.dtype("<u4")
        self.tokens = numpy.frombuffer(self._mm, dtype=dt, count=h["n_tokens"], offset=TOKEN_ALIGN)
        self.index = numpy.frombuffer(self._mm, dtype="<u8", count=h["n_docs"] + 1, offset=idx_off)
        self.table = numpy.frombuffer(self._mm, dtype="<u8", count=n_chunks + 1, offset=want["table_offset"])
        self.provenance = numpy.frombuffer(self._mm, dtype=PROV_DTYPE, count=h["n_docs"],
                                           offset=h["prov_offset"]) if v2 else None
        ix = self.index
        if ix[0] != 0 or ix[-1] != h["n_tokens"] or not (ix[1:] > ix[:-1]).all():
            raise FormatError(f"{self.path}: document index not strictly increasing from 0 to n_tokens; "
                              f"run `tokshard audit {self.path}`")
        if verify:
            self.verify()

    def verify(self):
        """Checks the header, table, index and every chunk checksum (XXH3-64);
        raises FormatError naming the chunk and its byte offset."""
        from .xxh3 import xxh3_64
        h = self.header
        if xxh3_64(self._mm[:248]) != h["header_xxh3"]:
            raise FormatError(f"{self.path}: header checksum mismatch (bytes 0..248): the header is corrupt")
        if xxh3_64(self.table) != h["table_xxh3"]:
            raise FormatError(f"{self.path}: checksum table mismatch at byte {h['table_offset']}")
        if xxh3_64(self.index) != int(self.table[-1]):
            raise FormatError(f"{self.path}: document index checksum mismatch at byte {h['index_offset']}")
        if self.provenance is not None and xxh3_64(self._mm[h["prov_offset"]:h["prov_offset"] + h["prov_bytes"]]) \
                != h["prov_xxh3"]:
            raise FormatError(f"{self.path}: provenance section checksum mismatch at byte {h['prov_offset']}: "
                              f"rebuild the shard")
        cb, tb = h["chunk_bytes"], h["tokens_bytes"]
        for c in range(h["n_chunks"]):
            a = TOKEN_ALIGN + c * cb
            b = min(a + cb, TOKEN_ALIGN + tb)
            if xxh3_64(self._mm[a:b]) != int(self.table[c]):
                raise FormatError(f"{self.path}: chunk {c} (bytes {a}..{b}) checksum mismatch: the tokens "
                                  f"are corrupt; restore the shard or rebuild the dataset")

    @property
    def n_docs(self):
        return self.header["n_docs"]

    @property
    def n_tokens(self):
        return self.header["n_tokens"]

    def doc(self, d):
        """Document d as a numpy view."""
        return self.tokens[int(self.index[d]):int(self.index[d + 1])]

    def docs(self):
        for d in range(self.n_docs):
            yield self.doc(d)


SEAL_KEY = b'"self_xxh3": "'


def _is_uint(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_manifest(m, mpath):
    """The manifest's structure and totals, as tokshard's C reader checks
    them; raises FormatError naming the file."""
    def bad(what):
        raise FormatError(f"{mpath}: {what}: the manifest was edited or is corrupt; rebuild the dataset")
    if not isinstance(m, dict) or m.get("format") != "tokshard-dataset":
        raise FormatError(f"{mpath}: \"format\" is not \"tokshard-dataset\": not a tokshard manifest")
    if m.get("format_version") not in VERSIONS or isinstance(m.get("format_version"), bool):
        raise FormatError(f"{mpath}: format_version {m.get('format_version')}, this reader knows {VERSIONS}: "
                          f"update the tokshard Python package")
    t, shards, tot = m.get("tokenizer"), m.get("shards"), m.get("totals")
    if not isinstance(t, dict) or not isinstance(shards, list) or not isinstance(tot, dict):
        bad("missing or invalid tokenizer/shards/totals")
    vocab = t.get("vocab_size")
    if not _is_uint(vocab) or vocab == 0 or not isinstance(t.get("file"), str) or "/" in t["file"] or \
            not t["file"] or not isinstance(t.get("fingerprint"), str) or len(t["fingerprint"]) != 32:
        bad("invalid tokenizer record")
    keys = ("bytes", "n_docs", "n_tokens", "min_token_id", "max_token_id")
    for i, rec in enumerate(shards):
        if not isinstance(rec, dict) or rec.get("file") != f"shard-{i:05d}.tks" or \
                not all(_is_uint(rec.get(k)) for k in keys) or not isinstance(rec.get("header_xxh3"), str):
            bad(f"shard entry {i} is invalid")
        if not rec["min_token_id"] <= rec["max_token_id"] < vocab:
            bad(f"shard entry {i} records ids in [{rec['min_token_id']}, {rec['max_token_id']}], "
                f"outside the vocabulary of {vocab}")
    want = {"n_shards": len(shards), "n_docs": sum(r["n_docs"] for r in shards),
            "n_tokens": sum(r["n_tokens"] for r in shards),
            "min_token_id": min((r["min_token_id"] for r in shards), default=None),
            "max_token_id": max((r["max_token_id"] for r in shards), default=None)}
    for k, v in want.items():
        if tot.get(k) != v or isinstance(tot.get(k), bool):
            bad(f"totals.{k} is {tot.get(k)!r} but the shard list gives {v!r}")


def _check_seal(raw, mpath):
    """The manifest's last key, self_xxh3, is the XXH3-64 of every byte
    before it (docs/FORMAT.md)."""
    from .xxh3 import xxh3_64
    at = len(raw) - 20 - len(SEAL_KEY)
    if at < 0 or raw[at:at + len(SEAL_KEY)] != SEAL_KEY or raw[-4:] != b'"\n}\n':
        raise FormatError(f"{mpath}: the manifest does not end with its \"self_xxh3\" seal: it was edited, "
                          f"cut or written by another tool; rebuild the dataset")
    seal, got = raw[at + len(SEAL_KEY):at + len(SEAL_KEY) + 16].decode("ascii", "replace"), xxh3_64(raw[:at])
    if seal != f"{got:016x}":
        raise FormatError(f"{mpath}: the manifest's bytes before its \"self_xxh3\" seal (offset {at}) hash to "
                          f"{got:016x}, the seal says {seal}: it was edited or is corrupt; rebuild the dataset")


class Dataset:
    """A dataset directory: manifest.json and its shards, each checked against
    its manifest record (structure, totals, id ranges against the vocabulary).
    verify=True also checks every checksum, as `tokshard audit` does: the
    manifest's self_xxh3 seal, the tokenizer copy against its fingerprint
    (XXH3-128), and each shard's chunks. Any problem raises FormatError naming
    the file."""

    def __init__(self, path, verify=False):
        self.path = str(path)
        mpath = os.path.join(self.path, "manifest.json")
        if not os.path.exists(mpath):
            partial = os.path.exists(self.path + ".partial")
            raise FormatError(f"{mpath} is missing: " + ("the build was interrupted; re-run it with --resume"
                                                         if partial else "not a tokshard dataset directory"))
        if not os.path.isfile(mpath):
            raise FormatError(f"{mpath} is not a regular file: put the dataset's manifest in its place")
        with open(mpath, "rb") as f:
            raw = f.read()
        try:
            self.manifest = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise FormatError(f"{mpath}: not UTF-8 at byte {e.start}: the manifest is corrupt; rebuild the dataset")
        except json.JSONDecodeError as e:
            raise FormatError(f"{mpath}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg}): "
                              f"the manifest is corrupt; rebuild the dataset")
        m = self.manifest
        _check_manifest(m, mpath)
        if verify:
            _check_seal(raw, mpath)
        self.tokenizer = m["tokenizer"]
        self.vocab_size = self.tokenizer["vocab_size"]
        self.tokenizer_path = os.path.join(self.path, self.tokenizer["file"])
        if verify:
            from .xxh3 import xxh3_128_hex

            def digest(path, what):
                # a regular file only: opening a FIFO would wait for a writer
                try:
                    if not stat.S_ISREG(os.stat(path).st_mode):
                        raise FormatError(f"{path}: the {what} is not a regular file: put the real file in its "
                                          f"place, or rebuild the dataset")
                    with open(path, "rb") as f:
                        return xxh3_128_hex(f.read())
                except OSError as e:
                    raise FormatError(f"{path}: cannot read the {what} ({e.strerror}): restore it or rebuild "
                                      f"the dataset")

            fp = digest(self.tokenizer_path, "tokenizer copy")
            if fp != self.tokenizer["fingerprint"].lower():
                raise FormatError(f"{self.tokenizer_path}: the tokenizer copy does not match the manifest's "
                                  f"fingerprint (XXH3-128 {fp}, manifest {self.tokenizer['fingerprint']}): it "
                                  f"was replaced or corrupted; restore it or rebuild the dataset")
            if isinstance(self.tokenizer.get("config_xxh3"), str):  # the tokenizer_config.json (BOS, EOS, pad)
                cpath = os.path.join(self.path, "tokenizer_config.json")
                if digest(cpath, "tokenizer config") != self.tokenizer["config_xxh3"].lower():
                    raise FormatError(f"{cpath} does not match the manifest's config_xxh3: it was edited or "
                                      f"replaced; restore it or rebuild the dataset")
        self.shards = []
        for i, rec in enumerate(m["shards"]):
            s = Shard(os.path.join(self.path, rec["file"]), verify=verify)
            h = s.header
            for key, hk in (("n_docs", "n_docs"), ("n_tokens", "n_tokens"), ("bytes", "file_size"),
                            ("max_token_id", "max_token_id")):
                if rec[key] != h[hk]:
                    raise FormatError(f"{s.path}: {hk} {h[hk]} but the manifest says {rec[key]}: "
                                      f"the shard was replaced; rebuild or restore it")
            if h["shard_index"] != i or h["vocab_size"] != self.vocab_size or \
                    h["tokenizer_fp"] != self.tokenizer["fingerprint"] or h["version"] != m["format_version"]:
                raise FormatError(f"{s.path}: shard index, vocabulary, tokenizer or format version differs "
                                  f"from the manifest")
            if verify and int(rec["header_xxh3"], 16) != h["header_xxh3"]:
                raise FormatError(f"{s.path}: header checksum differs from the manifest's record")
            self.shards.append(s)
        self.doc_cum = [0]
        self.token_cum = [0]
        for s in self.shards:
            self.doc_cum.append(self.doc_cum[-1] + s.n_docs)
            self.token_cum.append(self.token_cum[-1] + s.n_tokens)

    @property
    def n_docs(self):
        return self.doc_cum[-1]

    @property
    def n_tokens(self):
        return self.token_cum[-1]

    def doc(self, g):
        """Global document g (documents numbered across shards, as `tokshard
        cat --doc`) as a numpy view."""
        if not 0 <= g < self.n_docs:
            raise IndexError(f"document {g}: the dataset has {self.n_docs}")
        i = bisect.bisect_right(self.doc_cum, g) - 1
        return self.shards[i].doc(g - self.doc_cum[i])

    def docs(self):
        for s in self.shards:
            yield from s.docs()

    def tokens(self, begin, end):
        """Global tokens [begin, end) of the stream (shard 0's tokens, then shard
        1's, ...): a view when inside one shard, else a uint32 copy. Raises
        IndexError unless 0 <= begin <= end <= the dataset's token count."""
        n = self.token_cum[-1]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= n):
            raise IndexError(f"tokens({begin!r}, {end!r}): the dataset has tokens 0..{n}; give "
                             f"0 <= begin <= end <= {n}")
        if begin == end:
            return numpy.zeros(0, dtype=numpy.uint32)
        i = bisect.bisect_right(self.token_cum, begin) - 1
        parts = []
        while begin < end:
            s, off = self.shards[i], begin - self.token_cum[i]
            take = min(end - begin, s.n_tokens - off)
            parts.append(s.tokens[off:off + take])
            begin += take
            i += 1
        if len(parts) == 1:
            return parts[0]
        return numpy.concatenate([p.astype(numpy.uint32) for p in parts])
