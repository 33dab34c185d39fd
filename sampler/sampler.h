/*
 * sampler.h - the whole public API of tokshard's training-sample loader:
 * windows of seq_len + 1 tokens over a token range of a dataset, one keyed
 * O(1)-memory permutation per epoch, and the slice of each step that each
 * data-parallel rank reads. Specification: docs/SAMPLING.md.
 *
 * The data order rule (docs/MOTIVATION.md): the samples of global step s depend only
 * on the dataset and its token range, the seed, seq_len, the global batch
 * size B and s. Nothing here takes the tensor-parallel degree, and the
 * data-parallel degree only selects a contiguous slice of the step.
 *
 * Conventions: functions returning int return 0 or a negative TKS_ERR_* code
 * (common/tks.h) and record the context in tks_last_error(). Nothing here
 * prints or exits. Counts of samples and tokens are uint64_t.
 */
#ifndef TKS_SAMPLER_H
#define TKS_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "dataset/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pieces a tks_sample_loc stores; a window spanning more shards is still
 * read in full by tks_sampler_read. */
#define TKS_SAMPLE_MAX_PIECES 16

/* A half-open range [begin, end) of global token offsets in a dataset's
 * stream (shard 0's tokens, then shard 1's, ...). */
typedef struct tks_token_range {
    uint64_t begin, end;
} tks_token_range;

/* The part of a window that lies in one shard. */
typedef struct tks_sample_piece {
    uint32_t shard;          /* shard index in the dataset */
    uint64_t offset;         /* first token, as a token offset inside the shard */
    uint64_t n_tokens;       /* tokens taken from this shard, >= 1 */
} tks_sample_piece;

/* Where a window's seq_len + 1 tokens are. */
typedef struct tks_sample_loc {
    uint64_t window;         /* window index, < n_windows */
    uint64_t token_begin;    /* global token offset of the window's first token */
    uint64_t n_tokens;       /* seq_len + 1 */
    uint32_t n_pieces;       /* entries filled in pieces[], <= TKS_SAMPLE_MAX_PIECES */
    uint32_t n_pieces_total; /* shards the window spans; > n_pieces means pieces[] is cut */
    tks_sample_piece pieces[TKS_SAMPLE_MAX_PIECES]; /* in stream order */
} tks_sample_loc;

/* The data-order defaults of tokshard-train, shared with `tokshard
 * sample-plan` so that a plan without flags is what a default run reads. */
#define TKS_DEFAULT_SEED 1337
#define TKS_DEFAULT_VAL_TOKENS 65536

typedef struct tks_sampler tks_sampler;

/* ---------------------------------------------------------------------------
 * Permutation (docs/SAMPLING.md §4)
 * ------------------------------------------------------------------------- */

/*
 * The keyed bijection of [0, n): a 6-round balanced Feistel network over the
 * smallest even-bit power of two >= n, round function splitmix64's mix64,
 * plus cycle walking (Black & Rogaway 2002). Pure, O(1) memory, on average
 * fewer than 4 Feistel evaluations.
 * i: position, must be < n. n: domain size. key: any 64-bit key.
 * Returns perm(i) in [0, n), or UINT64_MAX when i >= n (so also for n == 0).
 */
uint64_t tks_perm_index(uint64_t i, uint64_t n, uint64_t key);

/* The permutation key of epoch `epoch` (0-based) under `seed`:
 * mix64(mix64(seed) + G * (epoch + 1)). Distinct epochs of one seed get
 * distinct keys. */
uint64_t tks_epoch_key(uint64_t seed, uint64_t epoch);

/* The seed of a mixture's source named `name` (docs/SAMPLING.md §9): the
 * run's seed XOR the 64-bit FNV-1a hash of the name's bytes (offset basis
 * 0xcbf29ce484222325, prime 0x100000001b3; G. Fowler, L. C. Noll, K.-P. Vo),
 * so that each source has its own permutations, whatever its place in the
 * list. A plain single dataset uses the run's seed itself. */
uint64_t tks_source_seed(uint64_t seed, const char *name);

/* ---------------------------------------------------------------------------
 * Train / validation split (docs/SAMPLING.md §2)
 * ------------------------------------------------------------------------- */

/*
 * Splits a stream of n_tokens tokens into a train range and a validation
 * range holding the last val_tokens tokens, rounded down to whole windows
 * (V = ((val_tokens - 1) / seq_len) * seq_len + 1 tokens): val = [n - V, n),
 * train = [0, n - V). val_tokens = 0: train = [0, n), val = [n, n).
 * The ranges are disjoint, so train and validation windows share no token.
 * train, val: out, not NULL.
 * Errors: TKS_ERR_ARG with the numbers and the fix, when seq_len == 0, when
 * 0 < val_tokens <= seq_len (no validation window fits), or when fewer than
 * seq_len + 1 tokens are left for training.
 */
int tks_split_tokens(uint64_t n_tokens, uint64_t val_tokens, uint32_t seq_len,
                     tks_token_range *train, tks_token_range *val);

/* ---------------------------------------------------------------------------
 * Sampler: windows of one token range, served in permuted order
 * ------------------------------------------------------------------------- */

/*
 * Creates a sampler over global tokens [token_begin, token_end) of ds with
 * windows of seq_len + 1 tokens at stride seq_len:
 * n_windows = (token_end - token_begin - 1) / seq_len.
 * ds is borrowed: it must stay open until tks_sampler_free. The sampler
 * copies the shards' cumulative token counts (8 bytes per shard) and is
 * never written afterwards, so every other function may be called from
 * several threads at once. *out is owned by the caller (tks_sampler_free).
 * Errors: TKS_ERR_ARG (ds or out NULL, seq_len 0, token_begin > token_end,
 * token_end beyond the dataset's tokens, or a range too small for one window:
 * the message gives the numbers and the fix), TKS_ERR_NOMEM.
 */
int tks_sampler_create(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                       uint32_t seq_len, uint64_t seed, tks_sampler **out);

/* Frees the sampler (not the dataset). Accepts NULL. */
void tks_sampler_free(tks_sampler *s);

/* Windows per epoch, >= 1. */
uint64_t tks_sampler_n_windows(const tks_sampler *s);
uint32_t tks_sampler_seq_len(const tks_sampler *s);
uint64_t tks_sampler_seed(const tks_sampler *s);
/* The token range the sampler was created over. */
tks_token_range tks_sampler_range(const tks_sampler *s);
const tks_dataset *tks_sampler_dataset(const tks_sampler *s);

/*
 * The window served as global sample `global_sample` (0-based, counted over
 * the whole run): epoch e = g / n_windows, window =
 * tks_perm_index(g % n_windows, n_windows, tks_epoch_key(seed, e)).
 * Pure, O(1) memory, no allocation; about 100 ns.
 */
uint64_t tks_sampler_window(const tks_sampler *s, uint64_t global_sample);

/*
 * Where window `window` lies: its global token offset and the (shard, token
 * offset, n_tokens) pieces it spans, in stream order. loc: out, not NULL.
 * At most TKS_SAMPLE_MAX_PIECES pieces are stored; loc->n_pieces_total says
 * how many there are. O(log n_shards).
 * Errors: TKS_ERR_ARG (window >= n_windows).
 */
int tks_sampler_locate(const tks_sampler *s, uint64_t window, tks_sample_loc *loc);

/*
 * Copies window `window`'s seq_len + 1 token ids into tokens (caller-owned,
 * seq_len + 1 elements): tokens[0 .. seq_len) are the inputs,
 * tokens[1 .. seq_len] the targets. Every id is checked against model_vocab
 * (the model's embedding rows; 0 = the dataset's vocab_size) and against the
 * shard's own vocab_size.
 * Errors: TKS_ERR_ARG (window >= n_windows, tokens NULL),
 * TKS_ERR_TOKEN_RANGE (an id >= the limit: the error context names the shard
 * file, shard index, token offset in the shard and document; the message
 * also names the window), TKS_ERR_BOUNDS (cannot happen for a valid sampler).
 */
int tks_sampler_read(const tks_sampler *s, uint64_t window, uint32_t model_vocab,
                     uint32_t *tokens);

/*
 * The documents of window `window` as the model's attention mask takes them
 * (docs/SAMPLING.md §3, "Documents in a window"): for each input position
 * t < seq_len, doc[t] = the position in the window where token t's document
 * starts, or 0 when it started before the window. Boundaries come from the
 * shards' document indexes (a shard boundary is one too), never from token
 * ids. doc: caller-owned, seq_len elements; doc[0] = 0 and each doc[t] is
 * doc[t-1] or t. O(log docs per shard + seq_len).
 * Errors: TKS_ERR_ARG (window >= n_windows, doc NULL).
 */
int tks_sampler_doc_starts(const tks_sampler *s, uint64_t window, int32_t *doc);

/* ---------------------------------------------------------------------------
 * Packing: windows of whole documents (docs/SAMPLING.md §10)
 * ------------------------------------------------------------------------- */

/* How a sampler makes its windows: CONCAT, the stream cut every seq_len
 * tokens (§3, documents run across windows); BEST_FIT, whole documents packed
 * into windows of seq_len + 1 tokens by best-fit decreasing, a document
 * longer than a window cut into window-sized pieces, the rest padding. */
typedef enum tks_packing { TKS_PACK_CONCAT = 0, TKS_PACK_BEST_FIT = 1 } tks_packing;

/* Tokens per packing group, in windows of seq_len + 1: best-fit packs the
 * documents that start in each run of this many windows' tokens of the range
 * together (§10). Part of the data order: changing it changes the windows. */
#define TKS_PACK_GROUP_WINDOWS 1024

/* A sampler's windows over one epoch (§10). Under CONCAT pad_tokens is 0 and
 * docs_split counts the documents that lie in more than one window. */
typedef struct tks_pack_stats {
    uint64_t windows;     /* n_windows */
    uint64_t tokens;      /* real tokens in the windows (CONCAT: the stream's, windows overlap by one) */
    uint64_t capacity;    /* windows x (seq_len + 1) */
    uint64_t pad_tokens;  /* capacity - tokens (BEST_FIT) */
    uint64_t docs;        /* documents of the range (the parts the range's ends cut included) */
    uint64_t docs_split;  /* documents cut into pieces across windows */
    uint64_t docs_split_short; /* of those, documents of at most seq_len + 1 tokens, which one
                                * window could hold (0 under BEST_FIT: it cuts only longer ones) */
    uint64_t pieces;      /* documents and pieces placed in windows */
    uint64_t groups;      /* packing groups (BEST_FIT) */
    double seconds;       /* time to plan (BEST_FIT) or count (CONCAT) */
} tks_pack_stats;

/* "concat" or "best-fit". */
const char *tks_packing_name(tks_packing p);

/*
 * tks_sampler_create with windows made by `packing`. BEST_FIT packs every
 * group once, on `threads` OpenMP threads (0: all), and keeps each window's
 * documents and pieces in memory: 12 bytes per item and 8 per window (for
 * large ranges, tks_sampler_create_planned keeps them in a file; the same windows
 * for any thread count, rank and run). The windows depend only on the
 * dataset, the token range and seq_len; the order in which they are served
 * (tks_sampler_window) on the seed, as for CONCAT.
 * Errors: as tks_sampler_create; TKS_ERR_ARG (unknown packing); TKS_ERR_NOMEM.
 */
int tks_sampler_create_packed(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                              uint32_t seq_len, uint64_t seed, tks_packing packing, int threads,
                              tks_sampler **out);
tks_packing tks_sampler_packing(const tks_sampler *s);

/* The processes that plan together (tks_sampler_create_planned): each packs
 * its share of the groups. Both calls are collective: every rank makes the
 * same calls in the same order. The library stays free of MPI; the trainer
 * passes MPI's world (trainer/comm/mesh.h). */
typedef struct tks_pack_world {
    int rank, size;
    /* elementwise sum of n values over the ranks, in place on every rank */
    int (*sum_u64)(uint64_t *v, size_t n, void *ctx);
    /* the first rank's nonzero rc (its error set on every rank), else 0 */
    int (*agree)(int rc, void *ctx);
    void *ctx;
} tks_pack_world;

/*
 * A BEST_FIT sampler whose plan lives in a file in `plan_dir` (created with
 * its parents if missing) named best-fit-<XXH3-64 of its inputs>.plan: the
 * dataset's manifest hash, the token range, seq_len, the group size and the
 * plan format version. When the file is missing it is made: every rank of
 * `world` (NULL: this process alone) packs its share of the groups on
 * `threads` threads, writes them at their offsets into <name>.partial, and
 * rank 0 adds the checksummed header and renames it into place, so a killed
 * planning never leaves a file under the final name; rank 0 holds
 * <name>.lock meanwhile, so a second run making the same file at the same
 * time is refused (TKS_ERR_LOCKED, naming the holder) instead of writing
 * into the first one's. When it exists it is
 * mapped read-only and checked whole (header, inputs, size, XXH3-64 of the
 * body, every offset and length) before use: O(file), about 12 bytes per
 * document and 8 per window (docs/SAMPLING.md §10, "The plan file"). The
 * windows equal those of tks_sampler_create_packed's in-memory plan, for any
 * number of ranks and threads. Collective over `world`.
 * Errors: as tks_sampler_create_packed; TKS_ERR_IO (the directory or file);
 * TKS_ERR_NOSPACE; a damaged or stale file (TKS_ERR_MAGIC, _VERSION,
 * _HEADER, _TRUNCATED, _CHECKSUM, _INDEX) names it and says to delete it.
 */
int tks_sampler_create_planned(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                               uint32_t seq_len, uint64_t seed, int threads, const char *plan_dir,
                               const tks_pack_world *world, tks_sampler **out);

/* The plan file a BEST_FIT sampler maps (owned by s), or NULL (in memory,
 * or CONCAT). */
const char *tks_sampler_plan_path(const tks_sampler *s);

/*
 * tks_sampler_read that also gives the window's real tokens: *n_real (may
 * be NULL) = seq_len + 1 under CONCAT; under BEST_FIT the tokens of its
 * documents, tokens[n_real .. seq_len] being padding (id 0), which the caller
 * keeps out of the loss and of every document's attention (the padding's
 * doc starts make it a block of its own). Errors: as tks_sampler_read.
 */
int tks_sampler_read_window(const tks_sampler *s, uint64_t window, uint32_t model_vocab,
                            uint32_t *tokens, uint64_t *n_real);

/*
 * All the pieces of window `window` (tks_sampler_locate's, without its limit
 * of TKS_SAMPLE_MAX_PIECES): at most cap into out (caller-owned), *n = how
 * many the window has. Under CONCAT the window's shard pieces; under BEST_FIT
 * its documents and pieces of documents, in stream order, each in one shard.
 * Errors: TKS_ERR_ARG (window >= n_windows, NULL pointers), TKS_ERR_NOMEM.
 */
int tks_sampler_pieces(const tks_sampler *s, uint64_t window, tks_sample_piece *out, size_t cap, size_t *n);

/* The real tokens of window `window` (< n_windows): seq_len + 1 under CONCAT,
 * its documents' tokens under BEST_FIT; the window gives real - 1 training
 * targets (tks_sampler_load_row marks the rest ignored). O(1). */
uint64_t tks_sampler_window_real(const tks_sampler *s, uint64_t window);

/* The packing statistics of the sampler's windows (CONCAT: counted over the
 * range's documents now, O(documents)). Errors: TKS_ERR_ARG. */
int tks_sampler_pack_stats(const tks_sampler *s, tks_pack_stats *st);

/* ---------------------------------------------------------------------------
 * Steps, data-parallel ranks, micro-batches (docs/SAMPLING.md §5, §6)
 * ------------------------------------------------------------------------- */

/*
 * Validates a batch layout: global_batch >= 1 samples, dp >= 1,
 * global_batch % dp == 0, and micro_batch (0 = the whole per-rank batch)
 * dividing global_batch / dp. per_rank, n_micro: out (may be NULL): samples
 * per data-parallel rank per step, micro-batches per rank per step.
 * Errors: TKS_ERR_ARG, naming the numbers and the nearest valid choices.
 */
int tks_batch_check(uint64_t global_batch, uint32_t dp, uint64_t micro_batch, uint64_t *per_rank,
                    uint64_t *n_micro);

/*
 * The global samples data-parallel rank dp_rank of dp reads at the step that
 * starts at `cursor` (global samples consumed before it):
 * [cursor + dp_rank * B/dp, cursor + (dp_rank + 1) * B/dp). Tensor-parallel
 * ranks of one data-parallel group call it with the same arguments and get
 * the same slice. first, count: out, not NULL.
 * Errors: TKS_ERR_ARG (global_batch 0, dp 0, dp_rank >= dp, global_batch not
 * divisible by dp, or the slice overflows 64 bits).
 */
int tks_sampler_rank_slice_at(uint64_t cursor, uint64_t global_batch, uint32_t dp,
                              uint32_t dp_rank, uint64_t *first_global_sample, uint64_t *count);

/* tks_sampler_rank_slice_at with cursor = step * global_batch (a run whose
 * global batch never changed). Errors: as above. */
int tks_sampler_rank_slice(uint64_t step, uint64_t global_batch, uint32_t dp, uint32_t dp_rank,
                           uint64_t *first_global_sample, uint64_t *count);

/*
 * Micro-batch `micro` of a rank slice [rank_first, rank_first + rank_count):
 * [rank_first + micro * micro_batch, ... + micro_batch). first, count: out.
 * Errors: TKS_ERR_ARG (micro_batch 0, rank_count not divisible by
 * micro_batch, micro >= rank_count / micro_batch).
 */
int tks_sampler_micro_slice(uint64_t rank_first, uint64_t rank_count, uint64_t micro_batch,
                            uint64_t micro, uint64_t *first_global_sample, uint64_t *count);

/* ---------------------------------------------------------------------------
 * Blending sources (docs/SAMPLING.md §9): which source each global sample
 * comes from, and its index in that source's own sample sequence
 * ------------------------------------------------------------------------- */

#define TKS_BLEND_MAX_SOURCES 32
#define TKS_BLEND_MAX_PHASES 64

/*
 * A blend: phases of constant weights over the global sample sequence.
 * Phase p covers global samples [start[p], start[p+1]) (the last one: to the
 * end), start[0] = 0, strictly increasing. W[p][k] is source k's weight in
 * phase p as an integer fraction of 2^32 (0: not drawn in that phase),
 * S[p] = sum_k W[p][k] > 0. A plain struct, filled by tks_blend_init.
 */
typedef struct tks_blend {
    uint32_t n_sources, n_phases;
    uint64_t start[TKS_BLEND_MAX_PHASES];
    uint64_t W[TKS_BLEND_MAX_PHASES][TKS_BLEND_MAX_SOURCES];
    uint64_t S[TKS_BLEND_MAX_PHASES];
} tks_blend;

/*
 * Where a blend stands after `sample` global samples: count[k] samples of
 * source k over the run (source k's next sample is its own sample
 * count[k]), phase_count[k] of them since the start of the phase holding
 * sample - 1. All zero at the start of a run. This is the cursor a
 * checkpoint keeps.
 */
typedef struct tks_blend_state {
    uint64_t sample;
    uint64_t count[TKS_BLEND_MAX_SOURCES];
    uint64_t phase_count[TKS_BLEND_MAX_SOURCES];
} tks_blend_state;

/* One blended sample: its source and the index in that source's samples. */
typedef struct tks_blend_pick {
    uint32_t source;
    uint64_t index;
} tks_blend_pick;

/*
 * Fills b from real weights: weights[p * n_sources + k] >= 0 is source k's
 * weight in phase p (0: not drawn), each phase with at least one positive
 * weight; start[p] as above. Integer weights (docs/SAMPLING.md §9):
 * total_p = the sum of phase p's weights in source order (double),
 * W[p][k] = floor(ldexp(w / total_p, 32)); exactly reproducible in any
 * language with IEEE doubles. names (may be NULL) name the sources in
 * messages. Errors: TKS_ERR_ARG (a count out of range, a weight not finite
 * or negative, a phase without a positive weight, a positive weight below
 * 2^-32 of its phase's total, phases not increasing from 0: the message
 * names the source and the phase).
 */
int tks_blend_init(tks_blend *b, uint32_t n_sources, uint32_t n_phases, const uint64_t *start,
                   const double *weights, const char *const *names);

/*
 * Assigns global sample st->sample and advances st: with p its phase and
 * j = st->sample - start[p] (phase counts restart at start[p]), the source
 * is the k with W[p][k] > 0 that maximizes the deficit
 * W[p][k] * (j + 1) - S[p] * phase_count[k] (exact integers, 128-bit),
 * ties to the smallest k: Megatron-LM's blending index (BlendedDataset,
 * helpers.cpp build_blending_indices) in exact arithmetic. Returns the
 * pick (source, count[source] before the increment). O(n_sources).
 */
tks_blend_pick tks_blend_next(const tks_blend *b, tks_blend_state *st);

/* Advances st to `sample` global samples (sample >= st->sample) by
 * assigning each one in turn: O((sample - st->sample) n_sources). */
void tks_blend_seek(const tks_blend *b, tks_blend_state *st, uint64_t sample);

/*
 * The picks of global samples [first, first + n) into out[n], starting
 * from `from` (a state at or before first; not changed): every rank of
 * every layout computes the same picks from the state at the step's start.
 * Errors: TKS_ERR_ARG (first before from->sample).
 */
int tks_blend_picks(const tks_blend *b, const tks_blend_state *from, uint64_t first, uint64_t n,
                    tks_blend_pick *out);

/* ---- mixtures of datasets (docs/SAMPLING.md §9) -------------------------- */

#define TKS_MIX_MAX_SOURCES TKS_BLEND_MAX_SOURCES
#define TKS_MIX_MAX_CHANGES (TKS_BLEND_MAX_PHASES - 1)
#define TKS_MIX_NAME_MAX 64       /* bytes of a source name, with its NUL */
#define TKS_MIX_JSON_MAX 32768    /* bytes of a mixture's record in a checkpoint */

/* One source of a mixture: a name (letters, digits, '_', '-', '.'), a
 * dataset directory and its weight in the first phase. */
typedef struct tks_mix_source {
    char name[TKS_MIX_NAME_MAX];
    char dir[4096];
    double weight;
} tks_mix_source;

/* A schedule change: from 1-based step `step` on the weights are the ones
 * in `text` ("NAME=W,NAME=W"; a source not named has weight 0 from then
 * on), kept as given and read by tks_mix_check. */
typedef struct tks_mix_change {
    uint64_t step;
    char text[1024];
} tks_mix_change;

/* What the user asked for: sources in order (source k of the blend is
 * sources[k]) and the schedule in the order given. named = 0: one plain
 * dataset (`--dataset DIR`, weight 1), the trainer's order of a single
 * dataset; a named source, even alone, is a mixture. */
typedef struct tks_mix_spec {
    uint32_t n_sources;
    int named;
    tks_mix_source sources[TKS_MIX_MAX_SOURCES];
    uint32_t n_changes;
    tks_mix_change changes[TKS_MIX_MAX_CHANGES];
} tks_mix_spec;

/* Adds one --dataset value: "DIR" (a plain dataset, weight 1) or
 * "NAME=DIR[:WEIGHT]" (weight 1 when left out; the weight is the text after
 * the last ':' when that parses as a number). Errors: TKS_ERR_ARG naming the
 * value (a bad name, plain and named sources mixed, too many sources, an
 * empty directory). */
int tks_mix_add_dataset(tks_mix_spec *m, const char *arg);

/* Adds one --mix-at value "STEP:NAME=W[,NAME=W...]" (read fully by
 * tks_mix_check). Errors: TKS_ERR_ARG (no STEP: prefix, too many changes). */
int tks_mix_add_change(tks_mix_spec *m, const char *arg);

/* Reads a mixture file (--mix FILE.json):
 *   {"sources": [{"name": "web", "path": "DIR", "weight": 0.7}, ...],
 *    "schedule": [{"step": 9000, "weights": {"web": 0.5, "books": 0.5}}]}
 * "schedule" is optional; a relative path is taken from the file's
 * directory. Errors: TKS_ERR_IO (unreadable), TKS_ERR_ARG (not this shape,
 * naming the file and the entry). */
int tks_mix_load(tks_mix_spec *m, const char *path);

/*
 * Everything about a mixture that can be checked without its data, each
 * refusal naming the sources: a name used twice, a weight that is not
 * finite and positive, a schedule step below 2 or beyond `steps` (0: not
 * checked), two changes at one step, a change naming an unknown source or
 * none, a plain dataset with a schedule. Errors: TKS_ERR_ARG.
 */
int tks_mix_check(const tks_mix_spec *m, uint64_t steps);

/* The blend of a checked mixture for a global batch of `global_batch`
 * samples: phase 0 the sources' weights from sample 0, each change (in step
 * order) a phase from sample (step - 1) * global_batch. Errors: those of
 * tks_mix_check and tks_blend_init. */
int tks_mix_blend(const tks_mix_spec *m, uint64_t global_batch, tks_blend *out);

/* The mixture of a checkpoint's record (its "mix" object, as
 * tks_run_sampling.mix_json holds it) into m and, when not NULL, the blend
 * position saved with it (cursor) and each source's dataset identity
 * (manifest_xxh3[n_sources]). Errors: TKS_ERR_MANIFEST (a record that is
 * not a mixture's, or a cursor whose counts do not add up, naming what). */
int tks_mix_from_json(const char *json, tks_mix_spec *m, tks_blend_state *cursor,
                      uint64_t *manifest_xxh3);

/* A checkpoint's record of a mixture (JSON, into out[cap]): the sources with
 * their absolute directories (abs_dirs[k]) and manifest XXH3s, the
 * schedule, and the blend position `cursor`; tks_mix_from_json reads it.
 * Errors: TKS_ERR_ARG (a schedule tks_mix_check refuses, or longer than cap). */
int tks_mix_record(const tks_mix_spec *m, const char *const *abs_dirs, const uint64_t *manifest_xxh3,
                   const tks_blend_state *cursor, char *out, size_t cap);

/* ---- the batch loader ------------------------------------------------------
 * A host thread loads, range-checks and stages the next micro-batch of one
 * data-parallel rank while the current one computes. The caller agrees on a
 * batch's result across ranks before any compute on it. */

/*
 * Reads window w of sampler s into row i of ids and targets ([B, T], T the
 * sampler's seq_len: ids the window's first T tokens, targets its last T;
 * under BEST_FIT a target past the window's real tokens is -1: ignored by
 * the loss, backend.h) and, when doc is not NULL, its document starts into
 * row i of doc. tok:
 * scratch of seq_len + 1 ids. Errors: those of tks_sampler_read (an id at
 * or above vocab, a checksum) and tks_sampler_doc_starts.
 */
int tks_sampler_load_row(tks_sampler *s, uint64_t w, uint32_t vocab, uint32_t *tok, int32_t *ids,
                         int32_t *targets, int32_t *doc, uint64_t i);

/* What a loader reads. blend and train[] are borrowed and must outlive the
 * loader; the rest is copied. */
typedef struct tks_loader_config {
    const tks_blend *blend;                        /* which source each global sample comes from */
    tks_sampler *train[TKS_BLEND_MAX_SOURCES];     /* source k's training sampler, k < n_sources */
    uint32_t vocab;                                /* ids at or above it are refused */
    uint32_t seq_len;                              /* T, the samplers' */
    uint64_t global_batch, micro;                  /* samples per step; per micro-batch (B; 0: the
                                                    * per-rank batch) */
    uint32_t dp, dp_rank;                          /* this rank's slice of each step */
    int documents;                                 /* also stage document starts */
    tks_blend_state start;                         /* the blend at the first step's start: all zero
                                                    * for a new run, a checkpoint's cursor to resume */
    uint64_t steps;                                /* steps to load from there (0: none) */
} tks_loader_config;

/* One staged micro-batch: ids and targets [B, T]; doc [B, T] document
 * starts, NULL without documents. Owned by the loader, valid until the next
 * tks_loader_next or tks_loader_close. */
typedef struct tks_loaded_batch {
    const int32_t *ids, *targets, *doc;
} tks_loaded_batch;

/*
 * The batch loader owns a run's data cursor: the step it is at, starting at
 * c->start (step 0) and moved only by tks_loader_advance. For each step it
 * hands out this rank's micro-batches in order (tks_loader_next) and counts
 * the step's training targets over the whole global batch
 * (tks_loader_step_targets); its blend state (tks_loader_at) is what a
 * checkpoint between steps keeps. Every rank of every layout computes the
 * same cursor, blend and counts from the same start.
 * Thread safety: one thread calls the functions of a loader; the loader's
 * own thread is internal to it.
 */
typedef struct tks_batch_loader tks_batch_loader;

/*
 * Checks c, allocates two stages of [micro, seq_len] (and the document
 * starts) and starts the loading thread, which begins with step 0's first
 * micro-batch when c->steps > 0. *out is owned by the caller
 * (tks_loader_close).
 * Errors: TKS_ERR_ARG (out or c NULL, no blend or a source without a
 * sampler, seq_len 0, dp_rank >= dp, a batch layout tks_batch_check
 * refuses: its message), TKS_ERR_NOMEM (also when the thread cannot start).
 */
int tks_loader_open(const tks_loader_config *c, tks_batch_loader **out);

/* The blend at the start of the step the loader is at: ->sample is its data
 * cursor (global samples consumed before it), ->count each source's samples
 * so far. Owned by l; changed by tks_loader_advance. */
const tks_blend_state *tks_loader_at(const tks_batch_loader *l);

/*
 * The training targets of the step the loader is at, over its whole global
 * batch (every rank's samples): global_batch x seq_len under CONCAT; under
 * BEST_FIT each window's real tokens - 1 (tks_sampler_window_real; padding
 * predicts nothing), at least 1. The same number on every rank whatever dp
 * and micro: the step's loss is the mean over these targets. The first call
 * of a step walks its global batch through the blend (O(global_batch x
 * n_sources)); later ones reuse it.
 */
uint64_t tks_loader_step_targets(tks_batch_loader *l);

/*
 * Hands out the step's next micro-batch (0, 1, ... n_micro - 1 in turn),
 * loaded and range-checked, into *out (not NULL; see tks_loaded_batch for how
 * long it stays valid), and starts loading the one after it: the step's
 * next, or after its last the next step's first (when one is left of
 * c->steps). Returns that micro-batch's result with its error context
 * restored on this thread; on a load error *out is the stage as it was
 * left, not to be computed on. Errors: those of tks_sampler_load_row (an id
 * at or above vocab, a checksum, naming shard and window), TKS_ERR_ARG
 * (every micro-batch of the step was handed out, or c->steps are done;
 * *out all NULL).
 */
int tks_loader_next(tks_batch_loader *l, tks_loaded_batch *out);

/* Moves the loader to the next step: the cursor by global_batch, the blend
 * over the step's samples. Called past c->steps it still moves the cursor
 * (nothing is loaded). */
void tks_loader_advance(tks_batch_loader *l);

/* Waits for the micro-batch being loaded, if any, and returns its result
 * (0 when none is pending) with its error context restored; the batch is
 * kept for tks_loader_next. For a caller that reads the same datasets
 * itself meanwhile (evaluation). */
int tks_loader_wait(tks_batch_loader *l);

/* Stops the thread (after the micro-batch in flight) and frees the stages;
 * NULL is a no-op. */
void tks_loader_close(tks_batch_loader *l);

#ifdef __cplusplus
}
#endif
#endif /* TKS_SAMPLER_H */
