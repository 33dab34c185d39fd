/*
 * safetensors.h - the whole public API for reading and writing safetensors
 * files, the checkpoint format of Hugging Face (source: the format section of
 * the huggingface/safetensors README, and its reference implementation
 * safetensors/src/tensor.rs, which decides what the README leaves open):
 *
 *   bytes [0, 8)        N, the header size, u64 little-endian
 *   bytes [8, 8+N)      header: a UTF-8 JSON object
 *                         {"__metadata__": {"key": "value", ...},          (optional)
 *                          "NAME": {"dtype": "F32", "shape": [d0, d1, ...],
 *                                   "data_offsets": [BEGIN, END]}, ...}
 *                       possibly followed by spaces (writers pad it to 8 bytes)
 *   bytes [8+N, EOF)    the data buffer; each tensor is the bytes [BEGIN, END)
 *                       of it, row-major ('C' order), little-endian, unstrided
 *
 * Every dtype here is a whole number of bytes per element; END - BEGIN equals
 * (product of the shape) * (element size). A 0-d tensor (shape []) holds one
 * element; a tensor with a 0 in its shape holds none (BEGIN == END). The
 * tensors, sorted by offset, cover the data buffer exactly: no gap, no
 * overlap, nothing after the last one. Names are unique.
 *
 * Conventions (common/tks.h): every function returns 0 or a negative
 * TKS_ERR_* code and records a message naming the file (and the tensor) in
 * tks_last_error(); nothing here prints or exits. The host must be
 * little-endian (checked at compile time).
 */
#ifndef TKS_SAFETENSORS_H
#define TKS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions a tensor may have here (the format itself has no limit;
 * files with more are refused with TKS_ERR_HEADER). */
#define TKS_ST_MAX_DIMS 8

/* The reference implementation refuses headers above this many bytes (it
 * guards against parsing huge JSON); so do the reader and the writer here. */
#define TKS_ST_MAX_HEADER 100000000u

/*
 * Element types, spelled in the header as the name after TKS_ST_ ("F32",
 * "BF16", "F8_E4M3", ...). The values are pinned: never renumbered or reused;
 * new dtypes get new values. 0 is never a dtype, so a zero-initialised
 * tks_st_tensor is refused rather than silently written as some type.
 * Sub-byte dtypes of newer reference versions (F4, F6_*) are not supported.
 */
typedef enum tks_st_dtype {
    TKS_ST_INVALID = 0,
    TKS_ST_F32 = 1,      /* IEEE binary32 */
    TKS_ST_F16 = 2,      /* IEEE binary16 */
    TKS_ST_BF16 = 3,     /* bfloat16: the upper 16 bits of a binary32 */
    TKS_ST_F64 = 4,      /* IEEE binary64 */
    TKS_ST_I8 = 5,
    TKS_ST_I16 = 6,
    TKS_ST_I32 = 7,
    TKS_ST_I64 = 8,
    TKS_ST_U8 = 9,
    TKS_ST_U16 = 10,
    TKS_ST_U32 = 11,
    TKS_ST_U64 = 12,
    TKS_ST_BOOL = 13,    /* one byte per element */
    TKS_ST_F8_E4M3 = 14, /* FP8 (arXiv:2209.05433) */
    TKS_ST_F8_E5M2 = 15, /* FP8 (arXiv:2209.05433) */
    TKS_ST_F8_E8M0 = 16, /* 8-bit power-of-two scale (OCP MX) */
    TKS_ST_C64 = 17,     /* complex: two binary32, real then imaginary */
    TKS_ST_N_DTYPES      /* not a dtype; grows when dtypes are added */
} tks_st_dtype;

/* The header spelling of a dtype ("F32"), or NULL when `dtype` is not one. */
const char *tks_st_dtype_name(tks_st_dtype dtype);

/* Bytes per element of a dtype (1, 2, 4 or 8), or 0 when `dtype` is not one. */
size_t tks_st_dtype_size(tks_st_dtype dtype);

/* ---------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------- */

/* One tensor to write. Nothing is copied or kept after the call returns. */
typedef struct tks_st_tensor {
    const char *name;     /* UTF-8, unique in the file, not "__metadata__" */
    tks_st_dtype dtype;
    size_t ndim;          /* 0 (a scalar) .. TKS_ST_MAX_DIMS */
    uint64_t shape[TKS_ST_MAX_DIMS]; /* shape[0..ndim), outermost first; each <= INT64_MAX */
    const void *data;     /* nbytes bytes, row-major, little-endian; may be NULL when nbytes is 0 */
    size_t nbytes;        /* must equal (product of shape) * tks_st_dtype_size(dtype) */
} tks_st_tensor;

/* One metadata entry: the header's "__metadata__" maps strings to strings. */
typedef struct tks_st_kv {
    const char *key;      /* UTF-8, unique among the entries */
    const char *value;    /* UTF-8 */
} tks_st_kv;

/*
 * Writes tensors[0..n) and metadata[0..n_metadata) to `path` as a
 * safetensors file, crash-safely: the bytes go to a new file "path.tmp-XXXXXXXX"
 * (a random name, created exclusively: tks_create_unique), which is
 * fsynced and renamed over `path`, then the directory is fsynced. A failed
 * call leaves no file behind (an existing `path` is untouched).
 *
 * The output depends only on the set of tensors and entries, not on their
 * order in the arrays, and is byte-identical to what the reference
 * implementation writes for the same tensors (checked by
 * tests/test_safetensors.py): tensors in the order of the reference
 * (descending dtype alignment, then name in byte order, so every tensor
 * starts aligned to its element size; for an all-F32 file that is simply
 * name order), the header as compact JSON with "__metadata__" first (its
 * keys sorted in byte order; the reference does not sort them) and each
 * tensor's fields as dtype, shape, data_offsets, padded with spaces to a
 * multiple of 8 bytes. With n_metadata == 0 there is no "__metadata__" key.
 * (One difference remains: control characters other than \b \f \n \r \t in
 * a name or metadata string are escaped as \u001F by jansson, \u001f by the
 * reference. Both are valid JSON for the same string.)
 *
 * tensors may be NULL when n is 0 (an empty but valid file); metadata may be
 * NULL when n_metadata is 0.
 * Errors: TKS_ERR_ARG (NULL path, a name that is NULL, not UTF-8, duplicated
 * or "__metadata__", an invalid dtype, ndim > TKS_ST_MAX_DIMS, a dimension
 * over INT64_MAX, nbytes not matching the shape, data NULL with nbytes > 0, a
 * metadata key or value NULL or not UTF-8, a duplicated key, a header over
 * TKS_ST_MAX_HEADER), TKS_ERR_NOMEM, TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_st_write(const char *path, const tks_st_tensor *tensors, size_t n,
                 const tks_st_kv *metadata, size_t n_metadata);

/*
 * Streaming form of tks_st_write, for files larger than what one wants in
 * memory at once (checkpoints gathered one tensor at a time): open with the
 * tensors' names, dtypes and shapes (data is ignored and may be NULL), put
 * each tensor's bytes once, in any order, then commit. The bytes on disk are
 * those tks_st_write writes for the same tensors, and the file appears under
 * `path` only at commit (written as a new "path.tmp-XXXXXXXX", fsynced, renamed, the
 * directory fsynced). abort (or a failed put/commit) removes the temporary
 * file. Errors: those of tks_st_write; commit refuses a tensor never put.
 */
typedef struct tks_st_stream tks_st_stream;
int tks_st_stream_open(const char *path, const tks_st_tensor *tensors, size_t n,
                       const tks_st_kv *metadata, size_t n_metadata, tks_st_stream **out);
/* Writes tensor i's (index into the array given to open) nbytes bytes. */
int tks_st_stream_put(tks_st_stream *s, size_t i, const void *data);
int tks_st_stream_commit(tks_st_stream *s);
void tks_st_stream_abort(tks_st_stream *s);

/*
 * The same bytes tks_st_write would write, in memory: on success *out is a
 * malloc'd buffer of *out_size bytes, owned by the caller (free()). On failure
 * *out is NULL and *out_size 0.
 * Errors: those of tks_st_write except TKS_ERR_IO and TKS_ERR_NOSPACE.
 */
int tks_st_serialize(const tks_st_tensor *tensors, size_t n, const tks_st_kv *metadata,
                     size_t n_metadata, void **out, size_t *out_size);

/* ---------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------- */

/* An open, fully validated safetensors file. */
typedef struct tks_st_file tks_st_file;

/* What the reader knows about one tensor. Pointers stay valid until
 * tks_st_close of the file they came from. */
typedef struct tks_st_info {
    const char *name;     /* owned by the file */
    tks_st_dtype dtype;
    size_t ndim;
    uint64_t shape[TKS_ST_MAX_DIMS]; /* shape[0..ndim); the rest are 0 */
    uint64_t numel;       /* product of shape (1 for a scalar) */
    uint64_t nbytes;      /* numel * element size = END - BEGIN */
    uint64_t offset;      /* where the bytes start, from the start of the file (8 + N + BEGIN) */
    const void *data;     /* the bytes, zero copy (in the mapping). Aligned to the
                             element size in files from tks_st_write and the reference
                             writer; a file whose N is not a multiple of 8 may give
                             unaligned data: copy with memcpy or tks_st_read_f32 */
} tks_st_info;

/*
 * Maps the file at `path` read-only and validates all of it before returning:
 * the file has at least 8 bytes; N <= TKS_ST_MAX_HEADER and 8 + N <= file
 * size; the header parses as a JSON object (jansson, duplicate keys refused);
 * "__metadata__", if present, is an object of strings; every other key is a
 * tensor whose entry has exactly the fields dtype (a known dtype), shape (an
 * array of at most TKS_ST_MAX_DIMS non-negative integers whose product, times
 * the element size, fits in 64 bits) and data_offsets (two integers
 * 0 <= BEGIN <= END); END - BEGIN matches the shape; the tensors cover the
 * data buffer exactly. Tensor data bytes are not examined (NaN and Inf are
 * allowed, as in the reference).
 *
 * On success *out is a handle owned by the caller (tks_st_close); on failure
 * *out is NULL and the message names the file, the tensor and the problem.
 * As with any mapping, the file must not be truncated while it is open (the
 * process would get SIGBUS); tks_st_write replaces files by rename, which is
 * safe for readers that have the old one open.
 * Errors: TKS_ERR_ARG (NULL argument), TKS_ERR_IO (open/stat/mmap, not a
 * regular file), TKS_ERR_NOMEM, TKS_ERR_TRUNCATED (file under 8 bytes, header
 * or a tensor running past the end of the file, or bytes after the last
 * tensor), TKS_ERR_HEADER (header too large, not JSON, not an object,
 * duplicate names, a bad entry, unknown dtype, element count not matching the
 * offsets, 64-bit overflow, bad metadata), TKS_ERR_BOUNDS (a gap or an overlap
 * between tensors, or a gap before the first).
 */
int tks_st_open(const char *path, tks_st_file **out);

/*
 * As tks_st_open, on `size` bytes at `data` that the caller keeps valid and
 * unchanged until tks_st_close (nothing is copied). `name` (may be NULL:
 * "<memory>") is used in messages.
 * Errors: as tks_st_open, less TKS_ERR_IO.
 */
int tks_st_open_mem(const void *data, size_t size, const char *name, tks_st_file **out);

/* Unmaps and frees. Accepts NULL. Every pointer obtained from `f` dies here. */
void tks_st_close(tks_st_file *f);

/* Number of tensors in the file (0 for a file holding only metadata). */
size_t tks_st_n_tensors(const tks_st_file *f);

/*
 * The i-th tensor, tensors being ordered by name (byte order), into *info.
 * Errors: TKS_ERR_ARG (NULL argument, i >= tks_st_n_tensors).
 */
int tks_st_tensor_at(const tks_st_file *f, size_t i, tks_st_info *info);

/*
 * The tensor called `name`, into *info (binary search).
 * Errors: TKS_ERR_ARG (NULL argument, no such tensor: the message names the
 * file and the tensor).
 */
int tks_st_find(const tks_st_file *f, const char *name, tks_st_info *info);

/*
 * Copies the F32 tensor `name` into dst after checking that it exists, that
 * its dtype is F32 and that its shape is exactly expected_shape[0..ndim)
 * (ndim 0 for a scalar; expected_shape may then be NULL). dst must hold the
 * product of expected_shape floats (not touched on failure). The message
 * names both shapes: "m.safetensors: model.embed_tokens.weight has shape
 * [16064, 8192], expected [128256, 8192]".
 * Errors: TKS_ERR_ARG (NULL argument, no such tensor, another dtype, another
 * shape).
 */
int tks_st_read_f32(const tks_st_file *f, const char *name, const uint64_t *expected_shape,
                    size_t ndim, float *dst);

/*
 * Whether tensor `info` (from tks_st_tensor_at or tks_st_find; its data
 * stays valid until the file is closed) holds a value that is not a finite
 * number: a NaN or an infinity of F64, F32, F16, BF16 or C64 (either part),
 * F8_E5M2's NaN and infinities, F8_E4M3's NaN (0x7F, 0xFF) or F8_E8M0's
 * (0xFF). Returns 1 and sets *index (the row-major element index of the
 * first such value; for C64 the complex element's) and *value (NAN, INFINITY
 * or -INFINITY; either may be NULL), else 0 (also for the integer and BOOL
 * dtypes, and for info NULL). Reads every element once: O(numel).
 */
int tks_st_find_nonfinite(const tks_st_info *info, uint64_t *index, double *value);

/* Number of "__metadata__" entries (0 when the header has none). */
size_t tks_st_n_metadata(const tks_st_file *f);

/*
 * The value of metadata `key`, or NULL when absent (or f or key is NULL).
 * Owned by the file; valid until tks_st_close.
 */
const char *tks_st_metadata(const tks_st_file *f, const char *key);

/*
 * The i-th metadata entry, entries being ordered by key (byte order). *key and
 * *value are owned by the file; valid until tks_st_close.
 * Errors: TKS_ERR_ARG (NULL argument, i >= tks_st_n_metadata).
 */
int tks_st_metadata_at(const tks_st_file *f, size_t i, const char **key, const char **value);

#ifdef __cplusplus
}
#endif
#endif /* TKS_SAFETENSORS_H */
