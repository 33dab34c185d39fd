/* internal.h - private to sampler/: the sampler's state, shared by
 * sampler.c (windows of the concatenated stream) and pack.c (windows packed
 * with whole documents). Not an API: sampler.h is the folder's public header. */
#ifndef TKS_SAMPLER_INTERNAL_H
#define TKS_SAMPLER_INTERNAL_H

#include "sampler/sampler.h"

typedef struct tks__pack tks__pack;

struct tks_sampler {
    const tks_dataset *ds;   /* borrowed */
    uint64_t begin, end;     /* token range */
    uint32_t seq_len;        /* L */
    uint64_t seed;
    uint64_t n_windows;      /* concat: (end - begin - 1) / L, >= 1; best-fit: the bins */
    size_t n_shards;
    uint64_t *cum;           /* (n_shards + 1): cum[i] = global offset of shard i's first token */
    tks__pack *pack;         /* best-fit packing (pack.c), or NULL: concat */
};

/* The shard holding global token t (< cum[n_shards]): largest i with cum[i] <= t. */
static inline size_t tks__shard_of(const tks_sampler *s, uint64_t t) {
    size_t lo = 0, hi = s->n_shards; /* cum[lo] <= t < cum[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->cum[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
}

/* pack.c: plans the best-fit windows of s (sets s->pack and s->n_windows) on
 * `threads` threads (0: all): in memory (dir NULL), or in the plan file of
 * its inputs in dir, made by W's ranks when missing (W NULL: one process).
 * Errors: TKS_ERR_NOMEM, TKS_ERR_ARG (no window), TKS_ERR_IO, the plan
 * file's (damaged or stale: named, with what to do). */
int tks__pack_plan(tks_sampler *s, int threads, const char *dir, const tks_pack_world *W);
void tks__pack_free(tks__pack *p);
const char *tks__pack_path(const tks__pack *p);
/* pack.c: locate, read and doc_starts of a best-fit window (w < n_windows). */
int tks__pack_locate(const tks_sampler *s, uint64_t w, tks_sample_loc *loc);
int tks__pack_read(const tks_sampler *s, uint64_t w, uint32_t model_vocab, uint32_t *tokens, uint64_t *n_real);
int tks__pack_doc_starts(const tks_sampler *s, uint64_t w, int32_t *doc);
uint64_t tks__pack_real(const tks_sampler *s, uint64_t w);
int tks__pack_pieces(const tks_sampler *s, uint64_t w, tks_sample_piece *out, size_t cap, size_t *n);

#endif
