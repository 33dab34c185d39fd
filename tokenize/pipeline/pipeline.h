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

#endif
