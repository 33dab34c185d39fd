/* pipeline.h - private to tokenize/: the build pipeline room
 * (tokenize/pipeline/). build.c (what every build shares: provenance,
 * build id, manifest, checks), plan.c (the work units), batch.c (the batches,
 * the reader thread, the encoding), and the build by work units: job.c (the
 * job, OUT.partial and its resume), unit.c (running one unit), place.c
 * (placement, the manifest, publishing), local.c (tks_build: every unit in
 * this process), dist.c (the units spread over processes). It uses the input
 * room (tokenize/input/input.h); nothing below calls up into it. Not an API:
 * tokenize.h is the folder's only public header. */
#ifndef TKS_TOKENIZE_PIPELINE_H
#define TKS_TOKENIZE_PIPELINE_H

#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <xxhash.h>

#include "dataset/dataset.h"
#include "tokenizer/tokenizer.h"
#include "tokenize/input/input.h"
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
    uint64_t *unassigned;  /* per document: its code points the byte-level encoder's Unicode
                            * leaves unassigned (tks_tok_encode_doc) */
    uint8_t *done;         /* per document: encoded (or decoding found it bad), set with
                            * release order once ids, err and status are final */
    uint64_t *line;        /* per document: its line in its source */
    tks_doc_prov *prov;    /* per document: where it is in the inputs (the reader's), and the hash
                            * of its text as encoded (text_xxh, set with its ids) */
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
/* tks__prefetch_take, then, unless the batch taken is the input's last,
 * tks__prefetch_start of the one after. */
int tks__prefetch_next(prefetch *p, batch **out);
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

/* Document i's text into *text, *len: a JSONL record decoded (on the
 * calling thread, its status set; *root to release with json_decref). 0 when
 * the record is bad, too long or empty (its status says which). */
int tks__doc_text(batch *b, size_t i, const char *key, uint64_t max_doc, json_t **root, const char **text,
                  size_t *len);
/* Tokenizes the batch's documents first..n-1 in parallel on `threads`
 * threads, decoding their JSONL records first (key, max_doc: the input's),
 * each one's `done` flag set as it is finished, and `drain` (may be NULL)
 * called as above: 0 or the first error (the encoder's or drain's).
 * Documents before `first` are left as they are, their flags set (a
 * resumed unit reads past what its sealed shards hold without encoding). */
int tks__encode_batch(tks_tok *tk, batch *b, size_t first, int threads, const char *key, uint64_t max_doc,
                      const tks__drain *drain);
/* JSONL records a decoding on the encoding threads left out, by cause. */
typedef struct deferred {
    uint64_t skipped, bad, too_long, empty;
} deferred;
/* The policy for record i of batch b, which decoding found bad, too long
 * or empty (its status): 0 (skipped and counted into *d) or the error the
 * reader would have given (TKS_ERR_JSONL, TKS_ERR_DOC_TOO_LONG: the
 * record's source and line named). */
int tks__deferred_skip(const tks_input *in, const batch *b, size_t i, deferred *d);
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
/* The dataset's totals into *stats and its manifest into `partial` (the
 * code points unassigned in the encoder's Unicode: stats->unassigned and
 * unassigned_docs, set by the caller). */
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

/* ---------------------------------------------------------------------------
 * The build job: the build by work units. tks_build (local.c) runs every
 * unit in this process; tks_build_job_* (job.c, unit.c, place.c) let the
 * units be spread over processes (dist.c). The units come from the listing
 * alone (plan.c). On disk:
 *
 * OUT.partial/build-state.json: {"build_id", "mode": "units", "units",
 *   "unit_bytes", "unit_rule"} (written by the coordinator, before any unit)
 * OUT.partial/unit-NNNNN/shard-LLLLL.tks: unit N's shards, numbered from 0
 * OUT.partial/unit-NNNNN/progress.json: rewritten each time the unit seals a
 *   shard, until the unit is complete (the resume grain inside a unit: see
 *   "A unit's progress" in unit.c)
 * OUT.partial/unit-NNNNN/unit.json: written last, when the unit is complete:
 *   its shards, its counters, and each input range it read with the range's
 *   XXH3-128 (a kept unit's ranges are hashed again on --resume)
 * placement, once every unit is complete: each shard's header gets its index
 *   in the dataset (256 bytes rewritten in place, fsync, on several threads)
 *   and the shard is renamed to OUT.partial/shard-GGGGG.tks. A resume finds
 *   a shard in either place: a unit's first global index is the sum of the
 *   shard counts its predecessors' records give.
 * The manifest is written from every unit's result (its shards, counters and
 * range hashes, gathered as bytes); then the records go, and
 * OUT.partial becomes OUT.
 * ------------------------------------------------------------------------- */
#define UNIT_RECORD "unit.json"
#define UNIT_PROGRESS "progress.json"
#define BLOB_MAGIC "TKSJ1"

/* What this process knows of a unit it ran. */
typedef struct unit_state {
    json_t *rec;            /* its record (unit.json) */
    tks_shard_info *shards; /* as recorded: local names and indices */
    size_t n;
    int ran;
} unit_state;

struct tks_build_job {
    tks_build_opts o;
    int coordinator;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_tok *tk;
    uint32_t bos, eos;
    char build_id[17];
    uint64_t unit_bytes;
    tks_input *ls;            /* the listing (never read: units read views of it) */
    tks__plan plan;
    unit_state *us;           /* per unit */
    double t0, plan_t0, plan_seconds; /* plan_t0: once the tokenizer is loaded */
    tks_build_progress prog;  /* this job's totals, for opts.progress */
    uint64_t *bases;          /* each unit's first global shard index from the records on
                               * disk (TKS_NONE past a missing one), or NULL: not read yet */
    json_t *desc;             /* coordinator: the provenance */
    size_t n_shards;          /* coordinator: the dataset's, once the manifest is written */
    int complete;             /* coordinator, under --resume: OUT.partial holds this build's
                               * finished dataset (its manifest written), left unpublished by
                               * the interrupted run; nothing is built (tks__publish_complete) */
};
/* local.c: a job whose OUT.partial is complete (j->complete): the units'
 * records removed and OUT published, *stats from the dataset. Errors: as
 * tks_build_job_publish's. */
int tks__publish_complete(tks_build_job *j, tks_build_stats *stats);
/* records.c: unit k's directory OUT.partial/unit-NNNNN, and the file `name`
 * in it. 0 or TKS_ERR_ARG (path too long). */
int tks__unit_dir(const tks_build_job *j, uint64_t k, char *out, size_t cap);
int tks__unit_file(const tks_build_job *j, uint64_t k, const char *name, char *out, size_t cap);
/* records.c: 1 when the shard at `path` is the recorded one, numbered `local`
 * or `global` (its header rewritten or not yet), its header with index `as`
 * hashing to the record's; else 0. */
int tks__job_shard_recorded(const char *path, const tks_shard_info *rec, uint32_t local, uint64_t global, uint64_t as);
/* records.c: the shard name of dataset index g ("shard-GGGGG.tks"). */
void tks__job_shard_name(uint64_t g, char name[32]);
/* records.c: unit k's record on disk, when it is this build's and every shard
 * it lists is in place (in the unit's directory, or already placed): 1 with
 * *rec and *shards set (the caller owns them), else 0. */
int tks__unit_load_complete(tks_build_job *j, uint64_t k, json_t **rec, tks_shard_info **shards, size_t *n);
/* records.c: a kept unit's inputs: the ranges it would read now must be those
 * it read, and hash as they did. 0, or TKS_ERR_RESUME naming the file. */
int tks__unit_verify_ranges(const tks_build_job *j, uint64_t k, const json_t *rec);
/* records.c: empties (or creates) a directory. 0 or an I/O error. */
int tks__reset_dir(const char *dir);
/* records.c: unit k's record written (atomically) as its unit.json. */
int tks__unit_write_record(const tks_build_job *j, uint64_t k, const json_t *rec);
/* records.c: the input counters as a record's JSON object, and such an
 * object's counters added to *t. */
json_t *tks__stats_json(const tks_input_stats *s);
void tks__stats_add(tks_input_stats *t, const json_t *s);

/* ---------------------------------------------------------------------------
 * Counting words for byte-level BPE training (tks_bpe_train): wtrain.c
 * runs the job (OUT.partial, its records and resume, the merge of the
 * runs, the trainer, publishing), wunit.c counts one work unit of the
 * inputs on every thread (batches of batch.c), wtab.c keeps each thread's
 * table of words and spills it as a sorted run, wruns.c writes, reads and
 * merges runs. Calls run wtrain.c -> wunit.c -> wtab.c -> wruns.c.
 *
 * On disk, OUT.partial/ holds train-state.json {"job", "units", "unit_bytes"}
 * (the job id covers the inputs' listing, the input options, the pattern
 * and the unit size: what the counts depend on), per counted unit
 * unit-NNNNN.json {"job", "unit", "runs", "stats"} written once its runs
 * are durable, the runs run-NNNNN-SSSS.cnt, and, once every unit is
 * counted, words.cnt (every run merged) with words.json. Everything else
 * (a run of a unit without its record, *.tmp) is what a kill left and is
 * removed on --resume.
 * ------------------------------------------------------------------------- */
/* A run's header: distinct words, their bytes, the sum of their counts,
 * the body's size and XXH3-64. */
typedef struct tks__run_head {
    uint64_t words, bytes, total, body, body_h;
} tks__run_head;

typedef struct tks__run_writer {
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    int fd;
    char *buf;
    size_t n, cap;
    uint64_t body;
    XXH3_state_t *h;
    tks__run_head head;
} tks__run_writer;

/* wruns.c: a run written to a new temporary file beside path
 * (path.tmp-XXXXXXXX, tks_create_unique) through a buffer of buf_bytes,
 * words put in ascending order (the caller's duty), made durable and renamed
 * to path by _finish; _free drops an unfinished one (and its file). Errors:
 * TKS_ERR_IO, TKS_ERR_NOSPACE, TKS_ERR_NOMEM, TKS_ERR_ARG (path too long). */
int tks__run_create(tks__run_writer *w, const char *path, size_t buf_bytes);
int tks__run_put(tks__run_writer *w, const char *word, size_t len, uint64_t count);
int tks__run_finish(tks__run_writer *w);
void tks__run_writer_free(tks__run_writer *w);

typedef struct tks__run_reader {
    char path[PATH_MAX];
    int fd, done;
    tks__run_head head;
    char *buf;
    size_t pos, end, cap;
    uint64_t left, off, count_seen;
    XXH3_state_t *h;
    char *word, *prev;  /* the current word (len bytes) and the one before */
    size_t len, wcap, plen, pcap;
    uint64_t count;
} tks__run_reader;

/* wruns.c: a run's header, checked (magic, version, checksum, the file's
 * size). Errors: TKS_ERR_IO, TKS_ERR_CHECKSUM (not a whole run). */
int tks__run_read_head(const char *path, tks__run_head *out);
/* wruns.c: reads the run at path: _next gives 1 with word, len and count
 * set (valid until the next call), 0 at the end once the body's checksum
 * and the word count are checked, or an error (TKS_ERR_CHECKSUM naming the
 * file and offset, TKS_ERR_IO, TKS_ERR_NOMEM). _free accepts a reader
 * whose open failed. */
int tks__run_open(tks__run_reader *r, const char *path, size_t buf_bytes);
int tks__run_next(tks__run_reader *r);
void tks__run_reader_free(tks__run_reader *r);
/* wruns.c: the runs in[0..n) merged into the run `out` (a word's counts
 * summed), each read through a buffer of buf_bytes. Errors: the reader's
 * and the writer's, TKS_ERR_INTERRUPTED (*stop set). */
int tks__runs_merge(const char *const *in, size_t n, const char *out, size_t buf_bytes,
                    volatile sig_atomic_t *stop);

/* One thread's table of words (wtab.c): open addressing over an arena of
 * entries (count, length, bytes), slots and arena within `budget` bytes. */
typedef struct tks__wtab {
    uint64_t *slot;
    size_t mask, used;
    uint8_t *arena;
    size_t alen, acap, budget;
    uint64_t spills;
} tks__wtab;

/* wtab.c: an empty table of at most budget bytes (at least 256 KiB; one
 * word longer than that is held alone). _add counts word w[0..n), whose
 * tks__wtab_hash is h: 0, 1 when the table is full (spill it, then add
 * again), or TKS_ERR_NOMEM.
 * _spill writes the table as the run `path` (sorted, through a buffer of
 * buf_bytes) and empties it: wruns.c's errors. */
void tks__wtab_init(tks__wtab *t, size_t budget);
uint64_t tks__wtab_hash(const char *w, size_t n);
int tks__wtab_add(tks__wtab *t, const char *w, size_t n, uint64_t h);
int tks__wtab_spill(tks__wtab *t, const char *path, size_t buf_bytes);
void tks__wtab_free(tks__wtab *t);

/* Counting one unit (wunit.c): what the job gives it and what it gathers. */
typedef struct tks__wcount {
    const tks_pretok *pt;
    tks__wtab *tabs;              /* (threads), kept from unit to unit */
    int threads;
    const char *dir;              /* OUT.partial, where runs go */
    uint64_t unit;
    unsigned next_run;            /* the unit's runs are run-UNIT-SEQ.cnt */
    char **runs;                  /* the runs' names (malloc'd), n_runs of them */
    size_t n_runs, runs_cap;
    size_t run_buf, batch_bytes;  /* a run writer's buffer; the reader's batches */
    volatile sig_atomic_t *stop;
    uint64_t pieces, short_pieces, text_bytes; /* this unit's */
    void (*progress)(const tks_bpe_train_progress *p, void *ctx);
    void *progress_ctx;
    tks_bpe_train_progress prog, base; /* base: the units before this one */
} tks__wcount;

/* wunit.c: counts unit c->unit of the plan (its ranges of the listing ls)
 * into c's tables, spilling them as runs (their names appended to c->runs)
 * when full and every non-empty one at the end; *st the unit's input
 * statistics (the records the policies left out counted). Errors: every
 * input error, the pre-tokenizer's, wruns.c's, TKS_ERR_INTERRUPTED. */
int tks__wunit_count(const tks_input *ls, const tks__plan *plan, uint64_t unit_bytes, tks__wcount *c,
                     tks_input_stats *st);

/* The training job (wtrain.c), which wmerge.c finishes. */
typedef struct tks__bt_job {
    const tks_bpe_train_opts *o;
    char out[PATH_MAX], partial[PATH_MAX + 16], lock_path[PATH_MAX + 16];
    int lock_fd;
    tks_pretok *pt;
    tks_input *ls;                /* the listing (units read views of it) */
    tks__plan plan;
    json_t **rec;                 /* per unit: its record once counted, else NULL */
    int have_words, threads;      /* have_words: words.cnt is whole and recorded */
    uint64_t memory, unit_bytes;
    size_t batch_bytes, run_buf, table_bytes;
    char id[17];                  /* the job id (what the counts depend on) */
    double t0;
    tks_bpe_train_stats st;
} tks__bt_job;

/* wmerge.c: the merge phase from OUT.partial/words.cnt (its size checked
 * against the memory limit first), the files written in
 * OUT.partial/publish, which becomes OUT; OUT.partial and the lock go.
 * Errors: tks_bpe_train's from the merge phase on. */
int tks__wtrain_finish(tks__bt_job *j);

/* wmerge.c: opens the directory `path` for use by its descriptor, refusing
 * a symbolic link (O_NOFOLLOW), anything but a directory and another
 * user's directory, naming it (`what`: its role) and what to do.
 * Errors: TKS_ERR_IO. */
int tks__bt_open_dir(const char *path, const char *what, int *fd_out);

/* wmerge.c: removes the training's own directory `path` and the files in
 * it through its descriptor; a symbolic link or other file at that name is
 * unlinked itself, never followed. Best effort: what cannot be removed
 * stays. */
void tks__bt_remove_dir(const char *path);

#endif
