/* internal.h - private to tokenize/: what its files share. The input:
 * input.c (the file list), stream.c (libarchive, zlib), docs.c (documents),
 * pq_input.c (Parquet rows, through parquet.h), policy.c (UTF-8, lengths).
 * The build: build.c (tks_build), batch.c (the batches, the reader thread,
 * the encoding), units.c (the build by work units). Not an API: tokenize.h
 * is the folder's only public header (parquet.h is the Parquet reader's). */
#ifndef TKS_TOKENIZE_INTERNAL_H
#define TKS_TOKENIZE_INTERNAL_H

#include <archive.h>
#include <jansson.h>
#include <pthread.h>
#include <time.h>
#include <xxhash.h>
#define ZLIB_CONST
#include <zlib.h>

#include "dataset/dataset.h"
#include "tokenizer/tokenizer.h"
#include "tokenize/parquet.h"
#include "tokenize/tokenize.h"

/* ---------------------------------------------------------------------------
 * batch.c: documents -> batches -> ids
 * ------------------------------------------------------------------------- */
typedef struct batch {
    char *arena;           /* document bytes, back to back */
    size_t arena_len, arena_cap;
    size_t *off, *len;     /* per document */
    uint64_t *ordinal;
    size_t *order;         /* documents sorted by length, longest first */
    tks_ids *ids;          /* per document, reused across batches */
    int *err;              /* per document: 0 or a TKS_ERR_* */
    /* JSONL records read undecoded (tks_input_opts.defer_json), decoded by
     * tks__encode_batch: per document whether it is one, and what decoding
     * found (tks_jsonl_status; TKS_JSONL_OK for a document that is not) */
    uint8_t *json, *status;
    uint8_t *done;         /* per document: encoded (or decoding found it bad), set with
                            * release order once ids, err and status are final */
    uint64_t *line;        /* per document: its line in its source */
    uint32_t *src;         /* per document: its source's index in srcs */
    char **srcs;           /* the sources' names, in order, owned by the batch */
    size_t n_srcs, srcs_cap;
    size_t n, cap;
    /* set by the reader with the batch */
    int end;               /* the input (the work unit's ranges) ends with this batch */
    uint64_t docs_seen;    /* documents read so far, this batch's included */
    uint64_t text_seen;    /* their text bytes */
    tks_input_stats input; /* the input's counters after this batch */
} batch;

/* Prefetch: reading (decompression, libarchive, the document split) is one
 * core's sequential work, a third of a build of the Linux tarball, so the
 * next batch is read on a thread of its own while the caller encodes and
 * commits the current one. One thread per batch (a few hundred per GiB of
 * text; their start is noise): between tks__prefetch_take and the next
 * tks__prefetch_start no reader runs, so the caller may use the input then and
 * the input is never used by two threads at once. The output is unchanged:
 * batches are taken in order. */
typedef struct reader reader;
typedef struct prefetch {
    batch slot[2];
    int next;      /* the slot the reader fills; the caller holds the other */
    int running;   /* a reader thread to join */
    pthread_t th;
    reader *r;
    int rc;        /* the reader's result, and its error (errors are per thread) */
    tks_error err;
} prefetch;

/* The reader: the input's documents in order, into one batch per call
 * (fill_batch), to the end of the input (a work unit's ranges). */
typedef struct reader {
    tks_input *in;
    size_t batch_bytes;
    size_t fill;   /* this batch's text: batch_bytes / 8 at first, doubled at each batch up to
                    * batch_bytes, so that the threads start encoding after the first
                    * eighth is read (a 13 MB build waited 8 ms for its first 8 MiB) */
    uint64_t docs_read, text;
    volatile sig_atomic_t *stop; /* an interrupt ends the batch early (it is not used) */
} reader;

/* Starts reading the next batch on a thread of its own (here, when no
 * thread can be created). */
void tks__prefetch_start(prefetch *p);
/* Waits for the batch tks__prefetch_start began: 0 and *out (the caller's
 * until the next take), or the reader's error, restored on this thread. */
int tks__prefetch_take(prefetch *p, batch **out);
/* Joins a reader still running (after an error or an interrupt) and frees
 * both batches. */
void tks__prefetch_free(prefetch *p);
/* Once a batch is committed: empties it, freeing what it grew beyond what
 * the next batch of batch_bytes needs. */
void tks__batch_trim(batch *b, size_t batch_bytes);
/* What the caller does with a batch's documents while the rest are being
 * encoded: fn(ctx, b) runs on the calling thread only (thread 0 of the
 * encoding team), between the documents it encodes itself, and may take
 * every document from its own cursor on whose `done` flag is set (read with
 * acquire order), in order, stopping at one whose err is set. Writing the
 * shards this way keeps the other threads encoding while this one writes
 * (a pass over the batch after the encoding left all but one thread idle,
 * a tenth of a 2-thread build). A nonzero return is the build's error; fn
 * is not called again in the batch. */
typedef struct tks__drain {
    int (*fn)(void *ctx, batch *b);
    void *ctx;
} tks__drain;

/* Tokenizes the batch's documents first..n-1 in parallel on `threads`
 * threads, decoding their JSONL records first (key, max_doc: the input's),
 * each one's `done` flag set as it is finished, and `drain` (may be NULL)
 * called as above: 0 or the first error (the encoder's or drain's).
 * Documents before `first` are left as they are, their flags set (a
 * resumed unit reads past what its sealed shards hold without encoding). */
int tks__encode_batch(tks_tok *tk, batch *b, size_t first, int threads, const char *key, uint64_t max_doc,
                      const tks__drain *drain);
/* Adds BOS/EOS as the options ask. 0 or TKS_ERR_NOMEM. */
int tks__add_specials(tks_ids *v, const tks_build_opts *o, uint32_t bos, uint32_t eos);

/* ---------------------------------------------------------------------------
 * build.c: what tks_build and the work units share
 * ------------------------------------------------------------------------- */
/* The inputs and every option that changes the output, as JSON (the
 * manifest's provenance; a new reference). *rc: 0, or an error. */
json_t *tks__describe(const tks_build_opts *o, const tks_input *in, const tks_tok *tk, int *rc);
/* The build id (16 hex digits): XXH3-64 of the options, the tokenizer and
 * every input's path, size and modification time, from the listing. */
int tks__build_id(const tks_build_opts *o, const tks_input *in, const tks_tok *tk, char out[17]);
/* The dataset's totals into *stats and its manifest into `partial`. */
int tks__write_manifest(const tks_build_opts *o, const char *partial, const tks_tok *tk,
                        json_t *desc, const tks_input_stats *input, const tks_shard_info *shards,
                        size_t n_shards, uint64_t empty_after_tokenize, tks_build_stats *stats);
/* The build's inputs, opened with the build's stop flag. */
int tks__open_inputs(const tks_build_opts *o, tks_input **in);
/* TKS_ERR_INPUT for inputs that gave no document with a token. */
int tks__no_text(const tks_input_stats *is);
/* TKS_ERR_ARG for an output inside an input, or an input inside it. */
int tks__check_output_apart(const char *out, const tks_build_opts *o);
/* TKS_ERR_ARG when the options ask for a BOS or EOS the tokenizer lacks. */
int tks__check_specials(const tks_build_opts *o, uint32_t bos, uint32_t eos);
/* A shard writer into `dir` for the tokenizer tk, from shard first_shard. */
int tks__open_writer(const tks_build_opts *o, const tks_tok *tk, const char *dir,
                     uint32_t first_shard, tks_writer **w);
/* The encoder a build took, and why, into *stats. */
void tks__encoder_report(const tks_tok *tk, const tks_build_opts *o, tks_build_stats *stats);

/* A byte range of an input file that a work unit reads (plan.c): whole 1,
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
 * plan.c: the work units, from the listing alone, and the cuts in plain files
 * ------------------------------------------------------------------------- */
/* A piece of the inputs: file `file`'s bytes [start, end), nominal when
 * `cut` (a plain file cut into pieces: tks__unit_ranges moves both bounds
 * to document boundaries), else the whole file (start 0, end its size); a
 * Parquet file's row groups [start, end) when cut is TKS__RANGE_PARQUET. */
typedef struct tks__piece {
    uint64_t file, start, end;
    uint32_t cut, pad;
    uint64_t bytes; /* its size for the units: end - start, or a Parquet piece's column bytes */
} tks__piece;

/* The plan: pieces in input order, units over runs of them (unit k's
 * pieces are pieces[first_piece .. first_piece + n_pieces)), and the
 * hand-out order (unit indices, heaviest first). */
typedef struct tks__plan {
    tks__piece *pieces;
    size_t n_pieces;
    tks_build_unit *units;
    size_t n_units;
    uint64_t *order;
} tks__plan;

/* The plan of the listing ls for unit_bytes (> 0): O(files), reads nothing.
 * 0 or TKS_ERR_NOMEM (*p then empty). tks__plan_free releases it. */
int tks__plan_make(const tks_input *ls, uint64_t unit_bytes, tks__plan *p);
void tks__plan_free(tks__plan *p);
/* The ranges unit `unit` reads (*out, malloc'd, *n of them; the caller frees
 * *out even on failure): whole files as they are, and each cut piece moved to
 * its document boundaries (empty ones left out). Reads a window around each
 * cut and a plain file's first 64 KiB. Errors: TKS_ERR_IO, TKS_ERR_INPUT (a
 * file changed since it was listed), TKS_ERR_NOMEM. */
int tks__unit_ranges(const tks_input *ls, const tks__plan *p, uint64_t unit, uint64_t unit_bytes,
                     tks__range **out, size_t *n);
/* The cut for the nominal offset x of the plain file fd (path, size bytes):
 * the smallest document boundary p with x <= p < size, else size; x == 0
 * gives 0. A boundary is the offset after a "\n" (blank_lines 0: --doc-split
 * line, JSON Lines), or after the "\n" that ends a line of blank bytes only
 * (blank_lines 1: --doc-split blank-line). Errors: TKS_ERR_IO, TKS_ERR_NOMEM. */
int tks__find_cut(int fd, const char *path, uint64_t size, uint64_t x, int blank_lines, uint64_t *out);
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
/* input.c: tks_input_open without the check of the files whose names promise
 * compression (tks_input_open's last step: it opens each one), which
 * tks__input_check_promises makes for the files i = part, part + parts, ...
 * (appending "i\twhy\n" for each file whose bytes break the promise to
 * *out) and tks__input_settle applies, from every part's lines: under
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
int tks__next_entry(tks_input *in);
int tks__entry_fill(tks_input *in);
/* stream.c: closes the current file (its hash taken when read to the end);
 * frees a stream's buffers. */
void tks__close_file(tks_input *in);
void tks__stream_free(stream *s);

#endif
