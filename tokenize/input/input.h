/* input.h - private to tokenize/: the input room (tokenize/input/), what its
 * files share and what the build pipeline (tokenize/pipeline/) uses of it.
 * input.c (the file list), stream.c (libarchive, zlib), docs.c (documents,
 * JSON Lines records; jsonl_fast.cc their fast path), pq_input.c (Parquet
 * rows, through parquet.h, the Parquet reader's own header), policy.c (UTF-8,
 * lengths), ranges.c (byte ranges of input files: document boundaries, their
 * hashes), names.c and buf.c (helpers below all of them). The input room calls
 * nothing of the pipeline. Not an API: tokenize.h is the folder's only public
 * header. */
#ifndef TKS_TOKENIZE_INPUT_H
#define TKS_TOKENIZE_INPUT_H

#include <archive.h>
#include <jansson.h>
#include <signal.h>
#include <time.h>
#include <xxhash.h>
#define ZLIB_CONST
#include <zlib.h>

#include "common/tks.h"
#include "tokenize/input/parquet.h"
#include "tokenize/tokenize.h"


/* A byte range of an input file that a work unit reads (tokenize/pipeline/plan.c): whole 1,
 * the file read as usual from its start (archives and compressed files
 * included: start 0, end its size); whole 0, the bytes [start, end) of a
 * plain file, read as they are on disk; whole TKS__RANGE_PARQUET, the row
 * groups [start, end) of a Parquet file. */
typedef struct tks__range {
    uint64_t file, start, end;
    uint32_t whole, pad;
} tks__range;
/* tks__range.whole of a Parquet file's row groups [start, end) */
#define TKS__RANGE_PARQUET 2u

/* ---------------------------------------------------------------------------
 * The input (input.c: listing; stream.c: libarchive and zlib; docs.c:
 * UTF-8 and documents)
 * ------------------------------------------------------------------------- */
#define MAX_NEST 4 /* readers stacked over one entry: member.gz, gzip in xz, gzip in gzip */

/* A growable byte buffer; grows geometrically and is reused across documents. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

/*
 * The bytes under one libarchive reader opened with archive_read_open: the
 * input file (level -1), or the data of the current entry of the reader
 * below (level k >= 0 reads the entry of in->a when k == 0, else of
 * in->lv[k - 1]). Inflated with zlib when it starts with the gzip magic,
 * passed through otherwise. Buffers and the zlib state are kept for reuse.
 */
typedef struct stream {
    tks_input *in;
    int level;
    int fd;                    /* level -1: the open input file */
    int pipe;                  /* level -1: fd is a pipe or device, non-blocking (wait_fd) */
    uint64_t start;            /* level -1: the file offset reading started at */
    unsigned char *rbuf;       /* level -1: READ_BLOCK_BYTES read from fd */
    const unsigned char *pp;   /* bytes already pulled, handed out next */
    size_t pn;
    unsigned char head[2];     /* the first byte(s), when the first block was 1 byte */
    size_t head_len;
    int eof;                   /* the source has no more bytes */
    uint64_t consumed;         /* bytes pulled from the source (file: bytes read from disk) */
    uint64_t handed;           /* bytes handed on (to inflate, or passed through) */
    int gzip;
    int gz_state;              /* GZ_MEMBER, GZ_BETWEEN (after a member's trailer), GZ_DONE */
    int zeros;                 /* zero bytes seen after the last member */
    uint64_t member;           /* 1-based number of the gzip member being inflated */
    z_stream z;
    int z_live;                /* inflateInit2 done */
    unsigned char *out;        /* READ_BLOCK_BYTES of inflated data */
} stream;

struct tks_input {
    tks_input_opts opts;
    char *jsonl_key;
    uint64_t max_doc;      /* resolved max_doc_bytes */
    size_t line_cap;       /* longest raw text line kept: max_doc + 1 (for a "\r") */
    size_t jsonl_cap;      /* longest raw JSONL record kept (escapes make it longer than its text) */

    char **files;
    uint64_t *sizes;
    struct file_meta {      /* what the listing saw: a regular file is re-checked against it */
        struct timespec mtime;
        int regular;
        dev_t dev;
        ino_t ino;
        int named;          /* given by the caller, not found in a directory */
        uint32_t root;      /* which of the caller's paths it was reached from */
        int parquet;        /* named .parquet: its row groups below, from its footer (settle) */
        uint32_t pq_n;      /* its row groups (may be 0) */
        tks_pq_group *pq;   /* malloc'd, owned by the listing (NULL when pq_n is 0) */
    } *meta;
    uint32_t cur_root;      /* listing: the caller's path being walked */
    char **root_real;       /* listing: each named path's realpath (NULL where none), for links_outside */
    size_t n_roots;
    char **skipped;         /* "path: why" of files left out under bad_input SKIP */
    size_t n_skipped;
    struct file_hash {      /* XXH3-128 of the file's bytes on disk, taken as they are read */
        uint8_t h[16];
        uint64_t bytes;
        int done;
    } *fh;
    size_t n_files, cap_files;
    int borrowed;           /* files, sizes, meta, skipped belong to another input (tks__input_view) */
    const tks__range *ranges; /* tks__input_view: the ranges read, in order, instead of the files */
    size_t n_ranges, next_range;
    struct file_hash *rh;   /* per range: the XXH3-128 of its bytes on disk */
    struct file_hash *cur_fh; /* where the current file's hash goes (NULL: not hashed) */
    uint64_t limit;         /* the current file is read up to this offset (a range); 0: to its end */
    uint64_t from;          /* the current file is read from this offset (a range; 0 otherwise) */
    int plain_open;         /* the current file was opened as plain text at fs.start */
    XXH3_state_t *hst;      /* the current file's hash, fed by pull_raw (level -1) */
    uint64_t total_bytes;

    tks_input_stats st;
    int failed;            /* sticky: the error code of a failed tks_input_next */

    /* current file */
    size_t next_file;
    const char *path;
    struct archive *a;
    stream fs;             /* the bytes under `a` when it is fed by stream_read */
    int fs_on;             /* `a` reads fs (gzip, or not a regular file) */
    int src_rc;            /* an error raised inside a read callback (tks_fail done) */
    int is_archive;
    uint64_t entry_no;     /* regular entries of the current file started so far */
    int no_hash;           /* seeked (tks_input_seek): files are read in part, not hashed */
    int plain_seek;        /* the next file is opened at seek_off, as plain text */
    uint64_t seek_off;
    uint64_t bytes_in_done; /* compressed bytes of the files already closed */

    /* readers stacked over the current entry: lv[k] reads ns[k] */
    struct archive *lv[MAX_NEST];
    stream ns[MAX_NEST];
    int depth;

    /* current entry */
    int in_entry, entry_eof, entry_jsonl;
    int entry_by_name;     /* an archive member whose name has a compression suffix */
    int probed;            /* the first block of the top reader's entry was looked at */
    buf source;            /* "path" or "path:member", NUL-terminated */
    const char *cur, *end; /* unread part of the current block */
    uint64_t entry_off;    /* decompressed bytes of the entry delivered so far */
    uint64_t hole;         /* zeros of a sparse hole still to deliver before `pend` */
    const char *pend;
    size_t pend_len;
    uint64_t line_no;      /* lines started so far in the entry */

    buf line;              /* a line that spans blocks */
    buf para;              /* a paragraph or a whole entry */
    buf san;               /* UTF-8 sanitized copy of a document */
    json_t *json;          /* the record the last JSONL document points into */

    /* current Parquet file (tks__pq_next_doc): row groups [pq_g, pq_end) to read */
    tks_pq *pqr;
    size_t pq_g, pq_end;
    int pq_in_group;
    uint64_t pq_row;       /* rows of the file before the next one (1-based row numbers) */
    uint64_t pq_row0;      /* rows of the file before the current row group */
};

/* buf.c: grows b to hold `need` bytes (geometrically); appends n bytes.
 * 0 or TKS_ERR_NOMEM. */
int tks__buf_reserve(buf *b, size_t need);
int tks__buf_append(buf *b, const void *p, size_t n);
/* 1 when the last n bytes of s end with suf, ASCII case folded (names.c). */
int tks__name_ends_with(const char *s, size_t n, const char *suf);
/* names.c: names (case-insensitive): an archive (".tar", ".tar.gz", ...,
 * ".zip"); a compressed file (".gz", ".xz", ...); `ext` (".jsonl") before at
 * most one compression suffix. */
int tks__is_archive_name(const char *name);
int tks__is_compressed_name(const char *name);
int tks__has_ext(const char *name, const char *ext);

/* input.c: a reader over the ranges r[0..n) of the listing ls's files (not
 * copied: ls must outlive it, and r too), with ls's options and the stop
 * flag `stop` (may be NULL), yielding JSONL records undecoded (defer_json:
 * the build decodes them on its encoding threads); each range's XXH3-128 is
 * taken as it is read (tks__input_range_xxh3). 0 or TKS_ERR_NOMEM. */
int tks__input_view(const tks_input *ls, const tks__range *r, size_t n, volatile sig_atomic_t *stop,
                    tks_input **out);
/* input.c: range i's XXH3-128 (16 bytes) once it was read to its end, else NULL. */
const uint8_t *tks__input_range_xxh3(const tks_input *in, size_t i);
/* input.c: the listing (paths, sizes, times, identities) as bytes, for
 * another process of the same binary (MPI): appended to *out. 0 or
 * TKS_ERR_NOMEM. tks__input_unpack makes an input of it with the options o
 * (TKS_ERR_ARG when the bytes are not a listing). */
int tks__input_pack(const tks_input *in, buf *out);
int tks__input_unpack(const void *p, size_t n, const tks_input_opts *o, tks_input **out);
/* input.c: tks_input_open without the check of the files' first bytes and
 * Parquet footers (tks_input_open's last step: it opens each regular file),
 * which tks__input_check_promises makes for the files i = part, part +
 * parts, ... (appending to *out "i\twhy\n" for each file whose bytes break
 * its name's promise, "i\t!message\n" for a Parquet file under another name
 * or a *.parquet file refused at its footer, "i\t=PQ ..." for a good one's
 * row groups) and tks__input_settle applies, from every part's lines: under
 * bad_input FAIL, TKS_ERR_INPUT naming the first such file; under SKIP,
 * the files dropped from the listing and recorded. Errors: as
 * tks_input_open's. */
int tks__input_list(const char *const *paths, size_t n, const tks_input_opts *opts, tks_input **out);
int tks__input_check_promises(const tks_input *in, size_t part, size_t parts, buf *out);
int tks__input_settle(tks_input *in, const char *verdicts, size_t len);
/* input.c: 1 when file i (or an archive member) named `name` is read as JSON Lines. */
int tks__input_is_jsonl(const tks_input *in, const char *name);
/* stream.c: registers the decompressors libarchive may run on an input
 * (gzip excluded: stream.c inflates it with zlib). */
void tks__add_filters(struct archive *a);
/* docs.c: the bytes that make a line blank (a paragraph break) when it holds
 * nothing else. */
static inline int tks__blank_byte(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* The stop flag of the options (SIGINT, SIGTERM) is set: the readers look
 * at it for every block they hand on (stream.c), every Parquet row
 * (pq_input.c) and every window read to find a cut (ranges.c), so that a
 * build stops within a block's time wherever its reader is, also inside one
 * document (a sparse or binary file of gigabytes, /dev/zero). The error
 * they return is TKS_ERR_INTERRUPTED naming what was being read. */
static inline int tks__stopped(volatile sig_atomic_t *stop) { return stop && *stop; }

/* stream.c: opens the next file of the list; moves to the next regular
 * entry of the current file (1, 0 at its end); makes the entry's next
 * decompressed bytes available in [in->cur, in->end) (1, 0 at its end).
 * Errors: TKS_ERR_INPUT, TKS_ERR_IO, TKS_ERR_NOMEM (named in the context). */
int tks__open_file(tks_input *in);
/* pq_input.c: opens Parquet file in->next_file (and moves past it) to read
 * its row groups [g0, g1) (g1 past the last: to its end), checking that its
 * footer is still the listed one; the next document of it (1, or 0 once its
 * row groups are read and the file closed with its hash taken, or an error).
 * A file left before its end is closed by tks__close_file. Errors: as
 * tks_pq_open, TKS_ERR_INPUT (the file changed). */
int tks__pq_open_file(tks_input *in, uint64_t g0, uint64_t g1);
int tks__pq_next_doc(tks_input *in, tks_doc *doc);
/* policy.c: a document too long for max_doc (line_no: its line or row): the
 * error under long_doc FAIL, else counted (0). */
int tks__too_long(tks_input *in, uint64_t line_no);
/* policy.c: applies the NUL and UTF-8 policies to the document p[0..len) and
 * fills *doc: 1 yielded, 0 skipped, or an error. `off`: where the text starts
 * in the decompressed entry (TKS_NONE when it is not a slice of it). */
int tks__emit(tks_input *in, const char *p, size_t len, uint64_t line_no, uint64_t off, tks_doc *doc);
/* policy.c: *doc filled as the input's next document: text p[0..len) of line
 * line_no, json (a JSONL record left for the caller to decode) or not, raw_len
 * bytes at `off` in the decompressed entry. Returns 1. */
int tks__doc_fill(tks_input *in, const char *p, size_t len, uint64_t line_no, int json, uint64_t off,
                  uint64_t raw_len, tks_doc *doc);
int tks__next_entry(tks_input *in);
int tks__entry_fill(tks_input *in);
/* stream.c: closes the current file (its hash taken when read to the end);
 * frees a stream's buffers. */
void tks__close_file(tks_input *in);
void tks__stream_free(stream *s);


/* ---------------------------------------------------------------------------
 * ranges.c: byte ranges of input files, their document boundaries and hashes
 * ------------------------------------------------------------------------- */
/* The range of file `file` of the listing ls (a regular plain file listed
 * with its size and time) between the nominal offsets start and end, each
 * moved to its cut, the smallest document boundary at or after it (kind 1:
 * after any line end, 2: after a blank line; docs/SCALE.md, rule 3),
 * appended to r[*n] (nothing when it is empty). A file whose first bytes
 * are compressed under a plain name is read whole by the piece that starts
 * at 0. Reads the file's first 64 KiB and windows from each nominal offset
 * on: from `start` no further than `end`, from `end` to its cut. Errors:
 * TKS_ERR_IO, TKS_ERR_INPUT (the file changed since it was listed),
 * TKS_ERR_NOMEM, TKS_ERR_INTERRUPTED (ls's stop flag). */
int tks__cut_range(const tks_input *ls, uint64_t file, uint64_t start, uint64_t end, int kind, tks__range *r,
                   size_t *n);
/* *plain = 1 when file `file` of the listing ls is read as it is on disk
 * (its first bytes neither gzip nor another compressed format), so that a
 * document's offset in it is a file offset (the test tks__cut_range makes).
 * Errors: TKS_ERR_IO, TKS_ERR_NOMEM. */
int tks__file_plain(const tks_input *ls, uint64_t file, int *plain);
/* The XXH3-128 of the bytes [start, end) of the file path (a kept unit's
 * range checked on --resume). Errors: TKS_ERR_IO, TKS_ERR_INPUT (shorter). */
int tks__range_xxh3(const char *path, uint64_t start, uint64_t end, uint8_t out[16]);
/* The XXH3-128 a unit records for range r of the listing ls: the whole file's,
 * the bytes [start, end) of a plain range, or the bytes from the first to
 * the end of the last column chunk of a Parquet range's row groups. */
int tks__range_hash(const tks_input *ls, const tks__range *r, uint8_t out[16]);
/* The file bytes [*a, *b) that Parquet file i's row groups [g0, g1) span
 * (*a == *b when there are none). */
void tks__pq_span(const tks_input *ls, uint64_t i, uint64_t g0, uint64_t g1, uint64_t *a, uint64_t *b);


#endif
