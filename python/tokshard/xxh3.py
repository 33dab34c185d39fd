"""XXH3-64 for checksum verification, through the system's libxxhash (Debian
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
        _lib = lib
    return _lib


def xxh3_64(buf) -> int:
    """XXH3-64 (seed 0) of a bytes-like object or a C-contiguous numpy array."""
    lib = _load()
    mv = memoryview(buf).cast("B")
    if mv.nbytes == 0:
        return lib.XXH3_64bits(None, 0)
    if mv.readonly:
        import numpy
        arr = numpy.frombuffer(mv, dtype=numpy.uint8)
        return lib.XXH3_64bits(arr.ctypes.data, arr.nbytes)
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return lib.XXH3_64bits(ctypes.addressof(c), mv.nbytes)
