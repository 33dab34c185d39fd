/* internal.h - private to tokenize/: what its files share. The input:
 * input.c (the file list), stream.c (libarchive, zlib), docs.c (UTF-8,
 * documents). The build: build.c (tks_build), batch.c (the batches, the
 * reader thread, the encoding), units.c (the build by work units). Not an
 * API: tokenize.h is the folder's only public header. */
#ifndef TKS_TOKENIZE_INTERNAL_H
#define TKS_TOKENIZE_INTERNAL_H

#include <archive.h>
#include <jansson.h>
#include <pthread.h>
#include <time.h>
#include <xxhash.h>
#define ZLIB_CONST
#include <zlib.h>

#include "../dataset/dataset.h"
#include "../tokenizer/tokenizer.h"
#include "tokenize.h"

#define PLAIN_NAME "plain-state.json"     /* a plain state being resumed by work units */

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
    unsigned char *uend;   /* per document: 1 when it is the last of its work unit */
    size_t n, cap;
    /* set by the reader with the batch */
    int end;               /* the input (or the work unit) ends with this batch */
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

/* The reader: documents in order, into one batch per call (fill_batch).
 * A whole build reads to the end, marks the last document of each work unit
 * (unit_bytes) and skips, unbatched, the documents already in resumed shards
 * (ordinal below skip_below; they still count towards their unit). A work
 * unit reads its `want` documents from where it starts. */
typedef struct reader {
    tks_input *in;
    size_t batch_bytes;
    uint64_t want;               /* documents to read, or UINT64_MAX: to the end */
    uint64_t unit_bytes;         /* > 0: mark each work unit's last document */
    uint64_t skip_below;
    uint64_t unit_acc, docs_read, text;
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
/* Tokenizes the batch in parallel on `threads` threads: 0 or the first error. */
int tks__encode_batch(tks_tok *tk, batch *b, int threads);
/* Adds BOS/EOS as the options ask. 0 or TKS_ERR_NOMEM. */
int tks__add_specials(tks_ids *v, const tks_build_opts *o, uint32_t bos, uint32_t eos);

/* ---------------------------------------------------------------------------
 * build.c: what tks_build and the work units share
 * ------------------------------------------------------------------------- */
/* The inputs and every option that changes the output, as JSON (the
 * manifest's provenance; a new reference). *rc: 0, or an error. */
json_t *tks__describe(const tks_build_opts *o, tks_input *in, const tks_tok *tk, int *rc);
/* The build id (16 hex digits) of a description and the inputs' times. */
int tks__build_id(json_t *desc, tks_input *in, char out[17]);
/* Each input's XXH3-128 into the description, once all are read. */
int tks__add_input_hashes(json_t *desc, const tks_input *in);
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

/* ---------------------------------------------------------------------------
 * units.c: a partial build by work units, resumed by tks_build
 * ------------------------------------------------------------------------- */
/* 1 when OUT.partial's state is that of a build by work units. */
int tks__partial_is_units(const char *out_dir);
/* Builds a partial build by work units' missing units, in order, here. */
int tks__build_units_here(const tks_build_opts *o, tks_build_stats *stats);

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
    } *meta;
    char **skipped;         /* "path: why" of files left out under bad_input SKIP */
    size_t n_skipped;
    struct file_hash {      /* XXH3-128 of the file's bytes on disk, taken as they are read */
        uint8_t h[16];
        uint64_t bytes;
        int done;
    } *fh;
    size_t n_files, cap_files;
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
};

/* input.c: grows b to hold `need` bytes (geometrically); appends n bytes.
 * 0 or TKS_ERR_NOMEM. */
int tks__buf_reserve(buf *b, size_t need);
int tks__buf_append(buf *b, const void *p, size_t n);
/* input.c: names (case-insensitive): an archive (".tar", ".tar.gz", ...,
 * ".zip"); a compressed file (".gz", ".xz", ...); `ext` (".jsonl") before at
 * most one compression suffix. */
int tks__is_archive_name(const char *name);
int tks__is_compressed_name(const char *name);
int tks__has_ext(const char *name, const char *ext);

/* stream.c: opens the next file of the list; moves to the next regular
 * entry of the current file (1, 0 at its end); makes the entry's next
 * decompressed bytes available in [in->cur, in->end) (1, 0 at its end).
 * Errors: TKS_ERR_INPUT, TKS_ERR_IO, TKS_ERR_NOMEM (named in the context). */
int tks__open_file(tks_input *in);
int tks__next_entry(tks_input *in);
int tks__entry_fill(tks_input *in);
/* stream.c: closes the current file (its hash taken when read to the end);
 * frees a stream's buffers. */
void tks__close_file(tks_input *in);
void tks__stream_free(stream *s);

#endif
