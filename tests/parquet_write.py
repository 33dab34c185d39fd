#!/usr/bin/env python3
"""parquet_write.py OUT_DIR TEXT_DIR GCIDE: the Parquet inputs of
tests/test_parquet.sh, written with pyarrow from real text (the Python docs
in TEXT_DIR, one document per file, and the GCIDE dictionary in paragraphs),
each with the JSON Lines file of the same documents in the same order.

OUT_DIR/same/NN-*.parquet and OUT_DIR/same.jsonl: every codec pyarrow writes
(none, snappy, zstd, gzip, lz4, brotli), dictionary and plain encodings,
row groups of 1, 7, 64 and 1000 rows, page CRCs, a `large_string` column, a
`binary` and a `large_binary` column, nulls (left out of the JSONL: a null
row is an empty document), a file of zero rows and a file of zero row groups,
and other columns beside the text. OUT_DIR/bad/: files that must be refused
(see the names), OUT_DIR/utf8.parquet: a binary column with invalid UTF-8 and
a NUL byte, OUT_DIR/named.txt: a Parquet file under another name, and OUT_DIR/two-body.parquet:
two columns named "body" beside the text."""
import glob, json, os, sys

import pyarrow as pa
import pyarrow.parquet as pq

out, text_dir, gcide = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [open(f, encoding="utf-8").read() for f in sorted(glob.glob(os.path.join(text_dir, "*")))]
paras = [p.strip("\n") for p in open(gcide, encoding="utf-8", errors="replace").read().split("\n\n")]
paras = [p for p in paras if p.strip()][:3000]
os.makedirs(os.path.join(out, "same"), exist_ok=True)
os.makedirs(os.path.join(out, "bad"), exist_ok=True)

order = []  # the documents in the order the build reads them (file name order)


def write(name, texts, col_type=pa.string(), nulls=(), **kw):
    """texts into OUT/same/name as the column `text` (None where i in nulls)."""
    vals = [None if i in nulls else t for i, t in enumerate(texts)]
    if col_type in (pa.binary(), pa.large_binary()):
        vals = [None if v is None else v.encode("utf-8") for v in vals]
    table = pa.table({"id": pa.array(range(len(vals)), pa.int64()),
                      "text": pa.array(vals, col_type),
                      "lang": pa.array(["en"] * len(vals))})
    pq.write_table(table, os.path.join(out, "same", name), **kw)
    order.extend(t for i, t in enumerate(texts) if i not in nulls)


codecs = ["none", "snappy", "zstd", "gzip", "lz4", "brotli"]
k = 0
chunks = [docs[i::3] for i in range(3)] + [paras[i::8] for i in range(8)]
for i, codec in enumerate(codecs):
    part = chunks[i % len(chunks)]
    write(f"{k:02d}-{codec}-dict.parquet", part, compression=codec, use_dictionary=True, row_group_size=7)
    k += 1
    write(f"{k:02d}-{codec}-plain.parquet", chunks[(i + 5) % len(chunks)], compression=codec,
          use_dictionary=False, row_group_size=64, write_page_checksum=True)
    k += 1
write(f"{k:02d}-large-string.parquet", chunks[6], col_type=pa.large_string(), row_group_size=1000)
k += 1
write(f"{k:02d}-binary.parquet", chunks[7], col_type=pa.binary(), row_group_size=1, compression="zstd")
k += 1
write(f"{k:02d}-large-binary.parquet", chunks[8], col_type=pa.large_binary(), row_group_size=100)
k += 1
write(f"{k:02d}-nulls.parquet", chunks[9], nulls=set(range(0, len(chunks[9]), 5)), row_group_size=50)
k += 1
write(f"{k:02d}-empty.parquet", [])  # zero rows (one empty row group or none: pyarrow decides)
k += 1
# zero row groups: a writer closed before any row
w = pq.ParquetWriter(os.path.join(out, "same", f"{k:02d}-no-row-groups.parquet"),
                     pa.schema([("text", pa.string())]))
w.close()
k += 1
# the same text repeated: a dictionary page that holds most of the column
write(f"{k:02d}-repeats.parquet", [paras[j % 7] for j in range(400)], use_dictionary=True,
      row_group_size=128, compression="snappy")
with open(os.path.join(out, "same.jsonl"), "w", encoding="utf-8") as f:
    for t in order:
        f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")

# invalid UTF-8 and a NUL byte in a binary column: rows 2 and 4 (1-based)
pq.write_table(pa.table({"text": pa.array([b"good", b"bad \xff\xfe here", b"fine", b"nul\x00byte"],
                                          pa.binary())}), os.path.join(out, "utf8.parquet"))
# a Parquet file under a name that is not *.parquet
pq.write_table(pa.table({"text": ["hidden"]}), os.path.join(out, "named.txt"))
# two top-level columns named "body" beside one "text": the text column is
# read, --parquet-column body is ambiguous (pyarrow refuses it too)
pq.write_table(pa.Table.from_arrays([pa.array(["one", "two"]), pa.array(["a", "b"]), pa.array(["c", "d"])],
                                    names=["text", "body", "body"]), os.path.join(out, "two-body.parquet"))

# --- files to refuse ---------------------------------------------------------
bad = os.path.join(out, "bad")
good = os.path.join(out, "good.parquet")
pq.write_table(pa.table({"text": paras[:300]}), good, row_group_size=100, compression="zstd",
               use_dictionary=False)
raw = open(good, "rb").read()
meta = pq.ParquetFile(good).metadata


def put(name, data):
    with open(os.path.join(bad, name), "wb") as f:
        f.write(data)


# column of another type, missing, nested, repeated
pq.write_table(pa.table({"text": pa.array([1, 2, 3], pa.int64()), "body": ["a", "b", "c"]}),
               os.path.join(bad, "int-column.parquet"))
pq.write_table(pa.table({"body": ["a", "b"]}), os.path.join(bad, "no-column.parquet"))
# two top-level columns of the name read: ambiguous, never the first of them
pq.write_table(pa.Table.from_arrays([pa.array(["first", "text"]), pa.array(["second", "text"])], names=["text", "text"]),
               os.path.join(bad, "two-text-columns.parquet"))
pq.write_table(pa.table({"text": pa.array([{"a": "x"}, {"a": "y"}])}), os.path.join(bad, "struct-column.parquet"))
pq.write_table(pa.table({"text": pa.array([["x", "y"], ["z"]])}), os.path.join(bad, "list-column.parquet"))
# not Parquet at all, and empty
put("text-named.parquet", b"just some text, not a Parquet file\n")
put("zero-bytes.parquet", b"")
# the footer length (the 4 bytes before the closing PAR1) past the file's start
put("footer-past-file.parquet", raw[:-8] + (len(raw) * 4).to_bytes(4, "little") + b"PAR1")
# cut short: the last magic gone
put("truncated.parquet", raw[: len(raw) // 2])
# the data before the footer shortened: the last column chunks lie past the end
flen = int.from_bytes(raw[-8:-4], "little")
cut = flen + 8 + 4096
put("chunk-past-file.parquet", raw[: len(raw) - flen - 8 - cut] + raw[len(raw) - flen - 8:])


def varint_at(b, i):
    """(value, end) of the ULEB128 varint at b[i]."""
    v = s = 0
    while True:
        c = b[i]
        v |= (c & 0x7F) << s
        s += 7
        i += 1
        if c < 0x80:
            return v, i


def varint(v, n):
    """v as a ULEB128 varint of exactly n bytes (padded with continuation bytes)."""
    o = bytearray()
    for j in range(n):
        c = v & 0x7F
        v >>= 7
        o.append(c | (0x80 if j < n - 1 else 0))
    return bytes(o)


# a page that decompresses to more than its header declares: the first data
# page's uncompressed_page_size (Thrift compact field 2, i32 zigzag) lowered
col = meta.row_group(0).column(0)
p = col.data_page_offset
assert raw[p] == 0x15  # field 1 (type), i32
_, q = varint_at(raw, p + 1)
assert raw[q] == 0x15  # field 2 (uncompressed_page_size), i32
size, e = varint_at(raw, q + 1)
n = e - (q + 1)
smaller = varint(((size // 2) // 2) << 1, n)  # zigzag of half the size
put("page-larger-than-declared.parquet", raw[: q + 1] + smaller + raw[e:])
# a flipped byte inside a page that carries a CRC
pq.write_table(pa.table({"text": paras[:300]}), os.path.join(out, "crc.parquet"), row_group_size=100,
               compression="none", use_dictionary=False, write_page_checksum=True)
craw = bytearray(open(os.path.join(out, "crc.parquet"), "rb").read())
os.remove(os.path.join(out, "crc.parquet"))
ccol = pq.ParquetFile(io := __import__("io").BytesIO(bytes(craw))).metadata.row_group(1).column(0)
at = ccol.data_page_offset + ccol.total_compressed_size // 2
craw[at] ^= 0x20
put("crc-mismatch.parquet", bytes(craw))
print(f"parquet_write: {k + 1} files of {len(order)} documents, {len(os.listdir(bad))} files to refuse")
