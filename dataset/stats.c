/* stats.c - what a dataset holds: documents and tokens, the document length
 * histogram and the most frequent token ids (tokshard inspect). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/internal.h"

void tks_stats_free(tks_stats *st) {
    if (!st) return;
    free(st->counts);
    free(st->top);
    free(st);
}

/* Document lengths of shard s into st's histogram and extremes. */
static void doc_lengths(const tks_shard *s, tks_stats *st) {
    const uint64_t *ix = tks_shard_doc_index(s);
    for (uint64_t d = 0; d < s->h.n_docs; d++) {
        uint64_t len = ix[d + 1] - ix[d];
        int b = 0;
        while ((UINT64_C(2) << b) <= len) b++;
        st->doc_hist[b]++;
        if (len < st->min_doc_tokens) st->min_doc_tokens = len;
        if (len > st->max_doc_tokens) st->max_doc_tokens = len;
    }
}

/* Adds the occurrences of each id < st->vocab_size in shard s to st->counts,
 * in parallel over token ranges. Errors: TKS_ERR_NOMEM. */
static int count_ids(const tks_shard *s, tks_stats *st) {
    const tks_shard_header *h = &s->h;
    const void *t = tks_shard_tokens(s);
    uint32_t vocab = st->vocab_size;
    int oom = 0;
#pragma omp parallel
    {
        uint64_t *loc = calloc(vocab, sizeof *loc);
        if (!loc) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(static)
        for (uint64_t i = 0; i < h->n_tokens; i++) {
            uint32_t id = tks_shard_token_at(t, h->token_bytes, i);
            if (loc && id < vocab) loc[id]++;
        }
        if (loc) {
#pragma omp critical(tks_stats)
            for (uint32_t k = 0; k < vocab; k++) st->counts[k] += loc[k];
        }
        free(loc);
    }
    if (oom) return tks_fail(TKS_ERR_NOMEM, s->path, TKS_NONE, TKS_NONE, "out of memory counting token ids");
    return 0;
}

/* The n_top most frequent ids, most first; equal counts: the smaller id first. */
static int pick_top(tks_stats *st) {
    uint32_t vocab = st->vocab_size;
    st->top = calloc(st->n_top ? st->n_top : 1, sizeof *st->top);
    uint8_t *taken = calloc(vocab ? vocab : 1, 1);
    if (!st->top || !taken) {
        free(taken);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    for (size_t k = 0; k < st->n_top; k++) {
        uint32_t arg = 0;
        uint64_t bc = 0;
        int found = 0;
        for (uint32_t id = 0; id < vocab; id++)
            if (!taken[id] && (!found || st->counts[id] > bc)) arg = id, bc = st->counts[id], found = 1;
        st->top[k] = arg;
        taken[arg] = 1;
    }
    free(taken);
    return 0;
}

int tks_stats_compute(const tks_shard *const *shards, size_t n_shards, size_t top,
                      tks_stats **out) {
    *out = NULL;
    if (!n_shards) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "no shard to count");
    tks_stats *st = calloc(1, sizeof *st);
    if (!st) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    st->vocab_size = shards[0]->h.vocab_size;
    st->min_doc_tokens = UINT64_MAX;
    st->counts = calloc(st->vocab_size, sizeof *st->counts);
    int rc = st->counts ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n_shards && !rc; i++) {
        doc_lengths(shards[i], st);
        st->n_docs += shards[i]->h.n_docs;
        st->n_tokens += shards[i]->h.n_tokens;
        rc = count_ids(shards[i], st);
    }
    st->n_top = top < st->vocab_size ? top : st->vocab_size;
    if (!rc) rc = pick_top(st);
    if (rc) {
        tks_stats_free(st);
        return rc;
    }
    *out = st;
    return 0;
}
