/*
 * tks.h - what every tokshard library shares: pinned error codes, the
 * context of the last error, checksums and crash-safe file writing.
 *
 * Error model (after LMDB and zstd): every library function returns an int,
 * 0 on success or one of the negative TKS_ERR_* codes below. The values are
 * pinned: a code is never renumbered and never reused for another meaning.
 * The function that fails also records a human-readable message and where it
 * happened (file, shard, offset) in a per-thread slot read by
 * tks_last_error(). The library never prints and never exits.
 */
#ifndef TKS_H
#define TKS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TKS_VERSION_STRING "0.1.0"

/* Pinned error codes. Never renumber, never reuse. */
enum {
    TKS_OK = 0,
    TKS_ERR_IO = -1,           /* open/read/write/fsync/rename/mmap failed (errno in context) */
    TKS_ERR_NOMEM = -2,        /* allocation failed */
    TKS_ERR_ARG = -3,          /* invalid argument or option */
    TKS_ERR_MAGIC = -4,        /* not a tokshard file */
    TKS_ERR_VERSION = -5,      /* format version not supported */
    TKS_ERR_HEADER = -6,       /* header fields inconsistent or header checksum mismatch */
    TKS_ERR_TRUNCATED = -7,    /* file size differs from what the header says */
    TKS_ERR_BOUNDS = -8,       /* a section lies outside the file or overlaps another */
    TKS_ERR_INDEX = -9,        /* document index not monotonic / not matching n_tokens */
    TKS_ERR_CHECKSUM = -10,    /* a chunk, index or table checksum mismatch */
    TKS_ERR_TOKEN_RANGE = -11, /* a token id >= vocab_size (or < 0) */
    TKS_ERR_MANIFEST = -12,    /* manifest missing, unparsable or inconsistent with shards */
    TKS_ERR_TOKENIZER = -13,   /* tokenizer cannot be loaded, or fingerprint/vocab mismatch */
    TKS_ERR_INPUT = -14,       /* corrupt archive/compressed stream or unreadable input entry */
    TKS_ERR_UTF8 = -15,        /* invalid UTF-8 under --invalid-utf8 fail */
    TKS_ERR_JSONL = -16,       /* a JSONL line does not parse or lacks the key */
    TKS_ERR_DOC_TOO_LONG = -17,/* a document over --max-doc-bytes under policy fail */
    TKS_ERR_NOSPACE = -18,     /* disk full or file size limit reached while writing */
    TKS_ERR_RESUME = -19,      /* --resume state missing or made with other options */
    TKS_ERR_EXISTS = -20,      /* output exists and would be overwritten */
    TKS_ERR_INTERRUPTED = -21, /* stopped by a signal; the build can be resumed */
    TKS_ERR_PADDING = -22,     /* bytes that must be zero (alignment padding) are not */
    TKS_ERR_NONFINITE = -23,   /* training diverged: a loss, gradient norm or checkpoint value is inf or NaN */
    TKS_ERR_LOCKED = -24,      /* another process holds the directory's lock (a second writer) */
};

/* A special token id (bos/eos/pad/unk) the tokenizer does not have. */
#define TKS_NO_ID 0xFFFFFFFFu

/* Sentinel for "no such offset / index" in the error context. */
#define TKS_NONE UINT64_MAX

/*
 * The context of the last error on the calling thread. Strings are owned by
 * the library and stay valid until the next failing call on the same thread.
 * Fields that do not apply are "" (strings) or TKS_NONE (numbers).
 */
typedef struct tks_error {
    int code;              /* TKS_ERR_* or TKS_OK */
    char message[512];     /* full sentence: what is wrong and what to do */
    char file[512];        /* file (or input entry "archive:member") concerned */
    uint64_t shard;        /* shard index */
    uint64_t offset;       /* byte offset in the file, or token offset in a shard */
    uint64_t doc;          /* document index (in a shard) or document ordinal (input) */
    uint64_t line;         /* 1-based line number in an input file */
} tks_error;

/* Short, static description of an error code ("checksum mismatch"). Never NULL. */
const char *tks_strerror(int code);

/* The last error recorded on this thread. Never NULL; owned by the library. */
const tks_error *tks_last_error(void);

/* Clears the last error on this thread. */
void tks_clear_error(void);

/*
 * Records an error on this thread and returns `code`, so a caller can write
 * `return tks_fail(...)`. `file` may be NULL. printf-style message.
 */
int tks_fail(int code, const char *file, uint64_t shard, uint64_t offset,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Sets the doc and line fields of the last error (after tks_fail). */
void tks_error_set_doc(uint64_t doc, uint64_t line);

/* Copies another thread's error into this thread's slot (used after parallel regions). */
void tks_error_restore(const tks_error *e);

/* XXH3-128 of a whole file, as 16 bytes in XXH128 canonical (big-endian) form.
 * Errors: TKS_ERR_IO. */
int tks_file_xxh3_128(const char *path, uint8_t out[16], uint64_t *size_out);

/* Lowercase hex of n bytes into out (2n+1 bytes incl. NUL). */
void tks_hex(const uint8_t *bytes, size_t n, char *out);

/* Parses 2n hex digits into bytes. Returns 0 or TKS_ERR_ARG. */
int tks_unhex(const char *hex, uint8_t *bytes, size_t n);

/*
 * Crash-safe publishing (write to a temporary name, fsync, rename, fsync dir).
 * tks_write_file_atomic writes `size` bytes to `path` via a new temporary
 * file beside it, "path.tmp-XXXXXXXX" (tks_create_unique: a random name,
 * created exclusively, so a link planted at a predictable name is never
 * written through); on failure the temporary file is removed and an
 * existing `path` is untouched. The file gets mode 0644 less the umask.
 * Errors: TKS_ERR_IO, TKS_ERR_NOSPACE (ENOSPC/EFBIG/EDQUOT), TKS_ERR_ARG.
 */
int tks_write_file_atomic(const char *path, const void *data, size_t size);

/* One piece of a file written by tks_write_file_pieces (data may be NULL
 * when size is 0). */
typedef struct tks_piece {
    const void *data;
    size_t size;
} tks_piece;

/* As tks_write_file_atomic, writing pieces[0..n) back to back without
 * concatenating them in memory. */
int tks_write_file_pieces(const char *path, const tks_piece *pieces, size_t n);

/* As tks_write_file_pieces, for the file `name` (no '/') of the directory
 * open as `dirfd` (the temporary file, the rename and the fsync all go
 * through dirfd, so the directory checked by whoever opened it is the one
 * written, whatever its path becomes meanwhile), with permissions `mode`
 * less the umask. `dir` names the directory in messages. Errors: those of
 * tks_write_file_atomic; TKS_ERR_ARG for a name with '/'. */
int tks_write_file_at(int dirfd, const char *dir, const char *name, const tks_piece *pieces, size_t n,
                      unsigned mode);

/*
 * Creates a new file for reading and writing under a unique name beside
 * `name`: "NAME.tmp-XXXXXXXX" (8 random characters of [0-9a-z]), relative
 * to the directory descriptor dirfd (AT_FDCWD: NAME is a path), with
 * O_CREAT|O_EXCL|O_NOFOLLOW: nothing that already exists is opened, a
 * planted link included (up to 64 names are tried). Permissions `mode` less
 * the umask. The name (relative as NAME is) goes to tmp[cap], an O_CLOEXEC
 * descriptor to *fd_out (-1 on failure); the caller closes it and renames
 * or removes the file.
 * Errors: TKS_ERR_ARG (name too long for cap), TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_create_unique(int dirfd, const char *name, unsigned mode, char *tmp, size_t cap, int *fd_out);

/*
 * Opens the file `path` for writing, of tokshard's own making at a
 * predictable name (a lock file, a plan being written, metrics.jsonl),
 * without ever writing through a link it did not make: opened with
 * O_NOFOLLOW (a symbolic link is refused), then the open file must be a
 * regular file owned by the effective user with one link (st_nlink 1: no
 * planted hard link to another file), checked on the descriptor itself so
 * no rename in between can swap it. flags: O_WRONLY or O_RDWR, optionally
 * O_CREAT (a missing file is created, mode 0644 less the umask) and
 * O_APPEND; other bits are ignored (O_CLOEXEC is added). `what` names the
 * file's role in messages ("lock file"; NULL: "file"). *fd_out gets the
 * descriptor (-1 on failure), the caller's to close.
 * Errors: TKS_ERR_IO naming the file, what it is instead (a symbolic link,
 * a FIFO, another user's file, a file with several links) and what to do;
 * TKS_ERR_NOSPACE.
 */
int tks_open_own(const char *path, int flags, const char *what, int *fd_out);

/* Fills buf[0..n) with random bytes from the kernel (getrandom(2)).
 * Errors: TKS_ERR_IO (none to be had). */
int tks_random(void *buf, size_t n);

/* Copies file `src` to `dst` crash-safely (tks_write_file_atomic). The file
 * is mapped whole (tks_map_file: anything but a regular file is refused):
 * meant for small files (tokenizer models).
 * Errors: TKS_ERR_IO (names src), TKS_ERR_NOMEM, TKS_ERR_NOSPACE. */
int tks_copy_file_atomic(const char *src, const char *dst);

/*
 * Opens `path` for reading, refusing anything that is not a regular file (a
 * FIFO, socket or device in place of a shard, manifest, model or checkpoint
 * would block a reader for ever or feed it endless bytes). The open itself
 * never blocks (O_NONBLOCK, cleared again for a regular file). *fd_out gets
 * an O_CLOEXEC descriptor the caller closes; *st (may be NULL) its fstat.
 * `what` names the file's role in the message ("shard", "manifest"; NULL:
 * "file"). Errors: TKS_ERR_IO (names the file and what it is instead).
 */
struct stat;
int tks_open_regular(const char *path, const char *what, int *fd_out, struct stat *st);

/*
 * Maps the regular file `path` read-only (tks_open_regular, then mmap;
 * MAP_SHARED: the pages are the page cache's). An empty file maps to
 * (NULL, 0). Unmap with tks_unmap(*base, *size). `what` as for
 * tks_open_regular. Errors: TKS_ERR_IO (names the file).
 */
int tks_map_file(const char *path, const char *what, const uint8_t **base, size_t *size);

/* Unmaps what tks_map_file mapped; (NULL, 0) is a no-op. */
void tks_unmap(const uint8_t *base, size_t size);

/*
 * A zeroed table of `bytes` for lookups at random (hash tables, caches):
 * mapped rather than malloc'd (the kernel's pages come zeroed, page-aligned,
 * so no 64-byte line straddles two), on 2 MiB pages where the kernel allows
 * it (MADV_HUGEPAGE, advice only: lookups at random over megabytes that do
 * not miss the TLB; a processor may drop a prefetch that would), and every
 * page written before use: a page of zeros read first maps the shared zero
 * page, and its first write then flushes the TLB of every thread of the
 * process. NULL when out of memory (or bytes 0); free with tks_free_table
 * and the same size.
 */
void *tks_alloc_table(size_t bytes);
void tks_free_table(void *p, size_t bytes);

/* Creates directory d and its missing parents (mode 0755); an existing one
 * is fine. Errors: TKS_ERR_IO (names the directory). */
int tks_mkdir_p(const char *d);

/* fsync the directory containing `path` (so a rename is durable). */
int tks_fsync_dir(const char *dir);

/* Write all bytes at offset (pwrite loop). Errors: TKS_ERR_IO, TKS_ERR_NOSPACE. */
int tks_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path);

/* Maps an errno from a failed write to TKS_ERR_NOSPACE or TKS_ERR_IO. */
int tks_write_errno_code(int err);

/* The shortest "%g" text of x (6 to 9 significant digits) that reads back
 * (strtod, then rounded to float) as x, into out[cap] (cap >= 32). */
void tks_float_text(char *out, size_t cap, float x);

/* A growing NUL-terminated text: s is NULL until the first append, n its
 * length, cap its buffer; the caller frees s. */
typedef struct tks_text {
    char *s;
    size_t n, cap;
} tks_text;

/* Appends printf-formatted text to t. Out of memory leaves t as it was: a
 * report comes out shorter, never wrong (the callers build summaries). */
void tks_text_printf(tks_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Joins dir and name into out (PATH_MAX). Returns 0 or TKS_ERR_ARG when too long. */
int tks_path_join(char *out, size_t cap, const char *dir, const char *name);

/* The encoders' word caches and special-token counts (tokenizer/tokenizer.h,
 * tks_tok_encoder_stats),
 * also reported by a build (tokenize/tokenize.h, tks_build_stats), which does
 * not re-export the tokenizer's API. */
typedef struct tks_encoder_stats {
    uint64_t words, word_hits;   /* words encoded, found in the cache */
    uint64_t bytes, hit_bytes;   /* their normalized bytes */
    uint64_t bound_misses;       /* unigram: found, but decoded again (float rounding, fastenc.c) */
    uint64_t special_in_text;    /* byte-level BPE: special tokens' text found in documents and
                                  * encoded as text */
    uint64_t special_matched;    /* ... and encoded as the special id (allowed in text) */
    uint64_t unassigned;         /* byte-level BPE: code points the regex engine's Unicode leaves
                                  * unassigned (a newer Unicode may split them otherwise) */
    uint64_t unassigned_docs;    /* ... and the documents holding them */
    uint64_t cut_docs, cut_parts; /* long documents encoded in parts on several threads (tokenize/
                                  * batch.c, tks_tok_next_cut), and their parts */
} tks_encoder_stats;

/* Resizes an array to n elements of `size` bytes, as realloc does. `array`
 * is the address of the array's pointer (a T ** for any element type T; a
 * NULL pointer is allocated). Returns 0, or -1 (out of memory, or n * size
 * overflowing) with the array unchanged; records no error, so that the
 * caller names what it was growing. */
int tks_resize(void *array, size_t n, size_t size);

/*
 * One writer at a time: an exclusive flock(2) on the lock file `path`
 * (created if needed), held until tks_unlock or the process's death (the
 * kernel releases it, so a crash never leaves a stale lock). The file records
 * the holder ("pid PID: WHAT") for the message a second writer gets:
 * TKS_ERR_LOCKED naming the file, the holder's pid and what to do. Non-blocking.
 * The file is opened as tks_open_own opens it: a symbolic link, another
 * user's file or one with several links at `path` is refused (TKS_ERR_IO,
 * naming it and what to do), never truncated or written.
 * *fd_out receives the descriptor to pass to tks_unlock (-1 on failure).
 * Errors: TKS_ERR_LOCKED, TKS_ERR_IO.
 */
int tks_lock(const char *path, const char *what, int *fd_out);

/* Releases a lock taken by tks_lock; removes `path` first when it is not NULL
 * and still names the locked file (a later tks_lock on the same path then
 * takes a fresh file). fd -1: no-op. */
void tks_unlock(int fd, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* TKS_H */
