"""XXH3-64 and XXH3-128 for checksum verification, through the system's libxxhash (Debian
libxxhash0) with ctypes: tokshard's checksums are XXH3 (xxHash 0.8, seed 0).
Only Dataset/Shard(..., verify=True) needs it."""
import ctypes
import ctypes.util

_lib = None


def _load():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise RuntimeError(f"checksum verification needs libxxhash (apt-get install libxxhash0): {e}")
        lib.XXH3_64bits.restype = ctypes.c_uint64
        lib.XXH3_64bits.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.XXH3_128bits.restype = _XXH128
        lib.XXH3_128bits.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _lib = lib
    return _lib


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]  # xxhash.h XXH128_hash_t


def _call(fn, buf):
    mv = memoryview(buf).cast("B")
    if mv.nbytes == 0:
        return fn(None, 0)
    if mv.readonly:
        import numpy
        arr = numpy.frombuffer(mv, dtype=numpy.uint8)
        return fn(arr.ctypes.data, arr.nbytes)
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return fn(ctypes.addressof(c), mv.nbytes)


def xxh3_64(buf) -> int:
    """XXH3-64 (seed 0) of a bytes-like object or a C-contiguous numpy array."""
    return _call(_load().XXH3_64bits, buf)


def xxh3_128_hex(buf) -> str:
    """XXH3-128 (seed 0) as 32 hex digits of its canonical (big-endian) form,
    as tokshard records tokenizer fingerprints."""
    h = _call(_load().XXH3_128bits, buf)
    return f"{h.high64:016x}{h.low64:016x}"
