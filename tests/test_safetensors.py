#!/usr/bin/env python3
"""test_safetensors.py - trainer/ckpt/safetensors.c against independent implementations.

1. The files that `test_safetensors --write DIR` makes are rebuilt here byte for
   byte from the format as the huggingface/safetensors README states it (u64
   little-endian header size, compact JSON header padded with spaces to 8
   bytes, row-major little-endian data) plus the reference writer's order
   (descending dtype alignment, then name), using only the standard library
   and numpy, and parsed here the same way (np.frombuffer) to compare values.
2. The other way round: files written here (unpadded header, leading space,
   newlines, any tensor order) are read by the C reader (`test_safetensors
   --dump FILE`), and a corrupt one is refused.
3. When the official `safetensors` package is importable (it is not packaged
   in Debian bookworm; a venv with `pip install safetensors numpy` has it), it
   reads our files, its writer must produce the same bytes as ours, and our
   reader reads its files. Without it these checks are reported as skipped.

Usage: test_safetensors.py TEST_BINARY WORKDIR
Exit status: 0 passed, 1 failed, 77 skipped (numpy missing).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped")
    sys.exit(77)

# dtype -> (element size, rank in the reference implementation's Dtype enum,
# which is in increasing alignment order; the writer puts higher ranks first)
DTYPES = {
    "BOOL": (1, 0), "U8": (1, 1), "I8": (1, 2), "F8_E5M2": (1, 3), "F8_E4M3": (1, 4),
    "F8_E8M0": (1, 5), "I16": (2, 6), "U16": (2, 7), "F16": (2, 8), "BF16": (2, 9),
    "I32": (4, 10), "U32": (4, 11), "F32": (4, 12), "C64": (8, 13), "F64": (8, 14),
    "I64": (8, 15), "U64": (8, 16),
}
NUMPY = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
         "I32": "<i4", "U32": "<u4", "F32": "<f4", "C64": "<c8", "F64": "<f8", "I64": "<i8",
         "U64": "<u8"}

# The "mixed" set of test_safetensors.c (g_mixed); the seed of a tensor is its index.
MIXED = [
    ("model.embed_tokens.weight", "F32", [16, 8]), ("model.norm.weight", "F32", [8]),
    ("lm_head.weight", "F32", [16, 8]), ("scalar", "F32", []), ("empty", "F32", [0]),
    ("empty2d", "F32", [3, 0]), ("bf16.w", "BF16", [4, 3]), ("f16.w", "F16", [5]),
    ("f64.w", "F64", [2, 2]), ("i64.ids", "I64", [6]), ("i32.x", "I32", [1, 1, 1, 3]),
    ("u8.bytes", "U8", [7]), ("bool.mask", "BOOL", [3]), ("f8.e4m3", "F8_E4M3", [5]),
    ("deep", "F32", [1, 2, 1, 2, 1, 2, 1, 2]), ("c64.z", "C64", [2]), ("i8.x", "I8", [9]),
    ("u16.x", "U16", [3]), ("u32.x", "U32", [2]), ("u64.x", "U64", [2]), ("i16.x", "I16", [3]),
    ("f8.e5m2", "F8_E5M2", []), ("f8.e8m0", "F8_E8M0", [2]),
]
MIXED_MD = {"format": "pt", "tokshard": "test", "note": "\u00fcnicode \u2713 \"quoted\"\n"}
NUMPY_MD = {"format": "pt"}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def values(seed, dtype, shape):
    """The bytes of the tensor with this seed (same rule as make_data in the C test)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    v = (7 * np.arange(n, dtype=np.int64) + 3 * seed) % 200 - 100
    if dtype in ("F32", "F64", "F16"):
        a = (v * 0.5).astype(NUMPY[dtype])
    elif dtype == "BF16":
        a = ((v * 0.5).astype("<f4").view("<u4") >> 16).astype("<u2")
    elif dtype == "C64":
        a = (v * 0.5 + 1j * (v * 0.25)).astype("<c8")
    elif dtype == "BOOL":
        a = (v & 1).astype("?")
    elif dtype.startswith("U") or dtype.startswith("F8"):
        a = (v + 100).astype(NUMPY.get(dtype, "u1"))
    else:
        a = v.astype(NUMPY[dtype])
    return a.reshape(shape).tobytes()


def build_file(tensors, metadata):
    """A safetensors file from [(name, dtype, shape, data bytes)], per the README
    and the reference writer's order, with the standard library only."""
    order = sorted(tensors, key=lambda t: (-DTYPES[t[1]][1], t[0].encode()))
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata, key=str.encode)}
    for name, dtype, shape, data in order:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in order)


def parse_file(blob):
    """Parses and validates a safetensors file; returns (metadata, {name: (dtype,
    shape, bytes)}). Raises ValueError on anything the README forbids."""
    if len(blob) < 8:
        raise ValueError("short file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > 100_000_000 or 8 + n > len(blob):
        raise ValueError("bad header size")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=no_dups)
    buf = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("metadata values must be strings")
    out, spans = {}, []
    for name, e in header.items():
        if set(e) != {"dtype", "shape", "data_offsets"} or e["dtype"] not in DTYPES:
            raise ValueError("bad entry " + name)
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
        if not 0 <= begin <= end <= len(buf) or end - begin != count * DTYPES[e["dtype"]][0]:
            raise ValueError("bad offsets " + name)
        spans.append((begin, end))
        out[name] = (e["dtype"], list(e["shape"]), buf[begin:end])
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise ValueError("gap or overlap")
        at = end
    if at != len(buf):
        raise ValueError("buffer not covered")
    return metadata, out


def c_dump(binary, path):
    """The C reader's view of a file: (metadata, {name: (dtype, shape, bytes)})."""
    p = subprocess.run([binary, "--dump", path], capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    tensors = {d["name"]: (d["dtype"], d["shape"], bytes.fromhex(d["hex"])) for d in lines[:-1]}
    return lines[-1]["__metadata__"], tensors


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    r = subprocess.run([binary, "--write", work])
    check(r.returncode == 0, "test_safetensors --write failed")
    if r.returncode:
        return 1

    mixed = [(n, d, s, values(k, d, s)) for k, (n, d, s) in enumerate(MIXED)]
    in_numpy = [t for t in mixed if t[1] in NUMPY]
    files = {"mixed": (mixed, MIXED_MD), "numpy": (in_numpy, NUMPY_MD)}

    # 1. Byte for byte, and parsed back with numpy.
    for stem, (tensors, md) in files.items():
        path = os.path.join(work, stem + ".safetensors")
        blob = open(path, "rb").read()
        want = build_file(tensors, md)
        check(blob == want, f"{stem}: C output differs from the independent writer "
                            f"({len(blob)} vs {len(want)} bytes)")
        meta, got = parse_file(blob)
        check(meta == md, f"{stem}: metadata {meta!r}")
        check(set(got) == {t[0] for t in tensors}, f"{stem}: tensor names")
        for name, dtype, shape, data in tensors:
            gd, gs, gb = got[name]
            check((gd, gs, gb) == (dtype, shape, data), f"{stem}: {name} differs")
            if dtype in NUMPY:
                a = np.frombuffer(gb, dtype=NUMPY[dtype]).reshape(shape)
                e = np.frombuffer(data, dtype=NUMPY[dtype]).reshape(shape)
                check(a.shape == tuple(shape) and np.array_equal(a, e), f"{stem}: {name} values")
        print(f"{stem}.safetensors: {len(tensors)} tensors match the independent reader/writer")

    # 2. Files written here, read by the C reader.
    odd = [("zeta", "F32", [3], values(50, "F32", [3])),
           ("alpha", "I64", [2, 1], values(51, "I64", [2, 1])),
           ("mid", "BF16", [], values(52, "BF16", [])),
           ("nothing", "U8", [0, 4], b"")]
    header, off = {"__metadata__": {"b": "2", "a": "1"}}, 0
    for name, dtype, shape, data in odd:  # file order = list order, not sorted
        header[name] = {"shape": shape, "data_offsets": [off, off + len(data)], "dtype": dtype}
        off += len(data)
    text = b" " + json.dumps(header, indent=1).encode()  # newlines, unpadded, leading space
    if len(text) % 8 == 0:
        text += b"\n"
    path = os.path.join(work, "python-written.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in odd))
    meta, got = c_dump(binary, path)
    check(meta == {"a": "1", "b": "2"}, f"C reader: metadata of a Python file: {meta!r}")
    for name, dtype, shape, data in odd:
        check(got is not None and got.get(name) == (dtype, shape, data),
              f"C reader: {name} of a Python file")
    print("python-written.safetensors: read by the C reader")

    header["mid"]["data_offsets"] = [header["alpha"]["data_offsets"][1] - 2,
                                     header["alpha"]["data_offsets"][1] + 0]
    text = json.dumps(header).encode()
    bad = os.path.join(work, "python-overlap.safetensors")
    with open(bad, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in odd))
    meta, err = c_dump(binary, bad)
    check(meta is None and "overlap" in err, f"C reader accepted an overlap: {err!r}")

    # 3. The official package, when there is one.
    try:
        import safetensors
        from safetensors import safe_open
        from safetensors.numpy import save
    except ImportError:
        print("official safetensors package not importable here: skipped "
              "(pip install safetensors numpy in a venv to run these checks)")
        return 1 if failures else 0
    print(f"official safetensors {safetensors.__version__}:")
    for stem, (tensors, md) in files.items():
        path = os.path.join(work, stem + ".safetensors")
        blob = open(path, "rb").read()
        got = {name: (d["dtype"].upper(), list(d["shape"]), bytes(d["data"]))
               for name, d in safetensors.deserialize(blob)}
        for name, dtype, shape, data in tensors:
            check(got.get(name) == (dtype, shape, data), f"official deserialize: {stem}: {name}")
        with safe_open(path, framework="numpy") as f:
            check(f.metadata() == md, f"official safe_open: {stem}: metadata {f.metadata()!r}")
            check(sorted(f.keys()) == sorted(t[0] for t in tensors), f"official: {stem}: keys")
            for name, dtype, shape, data in tensors:
                if dtype in NUMPY:
                    a = f.get_tensor(name)
                    check(a.dtype == np.dtype(NUMPY[dtype]) and list(a.shape) == shape and
                          a.tobytes() == data, f"official get_tensor: {stem}: {name}")
        print(f"  reads {stem}.safetensors: {len(tensors)} tensors and metadata match")

    arrays = {name: np.frombuffer(data, dtype=NUMPY[dtype]).reshape(shape)
              for name, dtype, shape, data in in_numpy}
    theirs = save(arrays, metadata=NUMPY_MD)
    ours = open(os.path.join(work, "numpy.safetensors"), "rb").read()
    check(theirs == ours, f"official writer's bytes differ from ours ({len(theirs)} vs {len(ours)})")
    print(f"  its writer gives the same {len(ours)} bytes as ours for numpy.safetensors")

    path = os.path.join(work, "official.safetensors")
    with open(path, "wb") as f:
        f.write(save(arrays, metadata={"format": "pt", "source": "official"}))
    meta, got = c_dump(binary, path)
    check(meta == {"format": "pt", "source": "official"}, f"C reader: official metadata {meta!r}")
    for name, dtype, shape, data in in_numpy:
        check(got is not None and got.get(name) == (dtype, shape, data),
              f"C reader: official file: {name}")
    print("  official.safetensors (written by it) is read by the C reader")
    return 1 if failures else 0


if __name__ == "__main__":
    rc = main()
    print("FAILED: %d check(s)" % len(failures) if rc else "all checks passed")
    sys.exit(rc)
