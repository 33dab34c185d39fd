/* grad_sync.c - the bucketed gradient synchronisation of mesh.h
 * (tks_grad_sync_*): reduce-scatter over dp_shard, all-reduce over
 * dp_replicate, started bucket by bucket during the backward. */
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/comm/mesh.h"

/* ---- bucketed gradient synchronisation -------------------------------------------- */

struct tks_grad_sync {
    tks_comm *shard, *rep;
    float *g, *stage;
    size_t n_flat, ns, B, nb, early;
    size_t *count;             /* per bucket: elements reported final (of S * len) */
    tks_comm_req **rs, **ar;   /* per bucket: reduce-scatter, all-reduce in flight */
    unsigned char *started;
    int own_stage;             /* stage was malloc'd here */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    void *copy_ctx;
};

static void gs_copy(tks_grad_sync *s, float *dst, const float *src, size_t n) {
    if (s->copy) s->copy(s->copy_ctx, dst, src, n * sizeof *dst);
    else memcpy(dst, src, n * sizeof *dst);
}

int tks_grad_sync_create(tks_mesh *m, float *grads, size_t n_flat, size_t bucket_elems,
                         float *stage, void (*copy)(void *ctx, void *dst, const void *src, size_t bytes),
                         void *copy_ctx, tks_grad_sync **out) {
    *out = NULL;
    tks_comm *sh = m->group[TKS_GROUP_DP_SHARD];
    size_t S = (size_t)sh->size;
    if (n_flat % S)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "gradient buffer of %zu elements does not split into %zu dp_shard slices",
                        n_flat, S);
    tks_grad_sync *s = calloc(1, sizeof *s);
    if (!s) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    s->shard = sh;
    s->rep = m->group[TKS_GROUP_DP_REPLICATE];
    s->g = grads;
    s->n_flat = n_flat;
    s->ns = n_flat / S;
    s->B = bucket_elems ? bucket_elems : 1;
    s->nb = s->ns / s->B + (s->ns % s->B != 0);
    s->copy = copy;
    s->copy_ctx = copy_ctx;
    size_t nb = s->nb ? s->nb : 1;
    s->count = calloc(nb, sizeof *s->count);
    s->rs = calloc(nb, sizeof *s->rs);
    s->ar = calloc(nb, sizeof *s->ar);
    s->started = calloc(nb, 1);
    s->stage = stage;
    if (S > 1 && !stage) {
        s->stage = malloc((n_flat ? n_flat : 1) * sizeof *s->stage);
        s->own_stage = 1;
    }
    if (!s->count || !s->rs || !s->ar || !s->started || (S > 1 && !s->stage)) {
        tks_grad_sync_free(s);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of memory for the gradient buckets (%zu elements staged)", n_flat);
    }
    *out = s;
    return 0;
}

void tks_grad_sync_free(tks_grad_sync *s) {
    if (!s) return;
    for (size_t b = 0; b < s->nb; b++) {
        if (s->rs && s->rs[b]) s->shard->t->wait(s->shard, s->rs[b]);
        if (s->ar && s->ar[b]) s->rep->t->wait(s->rep, s->ar[b]);
    }
    free(s->count);
    free(s->rs);
    free(s->ar);
    free(s->started);
    if (s->own_stage) free(s->stage);
    free(s);
}

void tks_grad_sync_begin(tks_grad_sync *s) {
    memset(s->count, 0, s->nb * sizeof *s->count);
    memset(s->started, 0, s->nb);
    s->early = 0;
}

static size_t bucket_len(const tks_grad_sync *s, size_t b) {
    size_t a = b * s->B;
    return s->ns - a < s->B ? s->ns - a : s->B;
}

/* Packs bucket b of every slice (rank-major) and starts its reduce-scatter
 * into this member's slice of g; with dp_shard 1 the all-reduce starts. */
static int start_bucket(tks_grad_sync *s, size_t b) {
    size_t S = (size_t)s->shard->size, R = (size_t)s->shard->rank, len = bucket_len(s, b), a = b * s->B;
    s->started[b] = 1;
    if (S == 1) {
        if (s->rep->size == 1) return 0;
        tks_coll op = {.kind = TKS_COLL_ALLREDUCE, .dtype = TKS_F32, .op = TKS_COMM_SUM, .out = s->g + a, .n = len};
        return s->rep->t->start(s->rep, &op, &s->ar[b]);
    }
    float *st = s->stage + S * a;
    for (size_t d = 0; d < S; d++) gs_copy(s, st + d * len, s->g + d * s->ns + a, len);
    tks_coll op = {.kind = TKS_COLL_REDUCE_SCATTER, .dtype = TKS_F32, .op = TKS_COMM_SUM,
                   .out = s->g + R * s->ns + a, .in = st, .n = len};
    return s->shard->t->start(s->shard, &op, &s->rs[b]);
}

int tks_grad_sync_ready(tks_grad_sync *s, size_t begin, size_t end) {
    if (end > s->n_flat) end = s->n_flat;
    int rc = 0;
    for (size_t d = begin / (s->ns ? s->ns : 1); s->ns && d * s->ns < end && !rc; d++) {
        size_t lo = begin > d * s->ns ? begin - d * s->ns : 0, hi = end - d * s->ns;
        if (hi > s->ns) hi = s->ns;
        for (size_t b = lo / s->B; b * s->B < hi && !rc; b++) {
            size_t bl = b * s->B, bh = bl + bucket_len(s, b);
            size_t x = lo > bl ? lo : bl, y = hi < bh ? hi : bh;
            s->count[b] += y - x;
            if (!s->started[b] && s->count[b] >= (size_t)s->shard->size * bucket_len(s, b)) {
                rc = start_bucket(s, b);
                s->early++;
            }
        }
    }
    return rc;
}

int tks_grad_sync_hook(void *ctx, size_t begin, size_t end) {
    return tks_grad_sync_ready((tks_grad_sync *)ctx, begin, end);
}

int tks_grad_sync_end(tks_grad_sync *s) {
    int rc = 0;
    size_t S = (size_t)s->shard->size, R = (size_t)s->shard->rank;
    /* every member starts the same buckets in the same order: the early ones
     * (same reports on every member), then the rest in bucket order */
    for (size_t b = 0; b < s->nb; b++) {
        int r = s->started[b] ? 0 : start_bucket(s, b);
        if (!rc) rc = r;
    }
    for (size_t b = 0; b < s->nb; b++) {
        if (S > 1) {
            int r = s->shard->t->wait(s->shard, s->rs[b]);
            s->rs[b] = NULL;
            if (!rc) rc = r;
            if (s->rep->size > 1) {
                tks_coll op = {.kind = TKS_COLL_ALLREDUCE, .dtype = TKS_F32, .op = TKS_COMM_SUM,
                               .out = s->g + R * s->ns + b * s->B, .n = bucket_len(s, b)};
                r = s->rep->t->start(s->rep, &op, &s->ar[b]);
                if (!rc) rc = r;
            }
        }
    }
    for (size_t b = 0; b < s->nb; b++) {
        int r = s->rep->t->wait(s->rep, s->ar[b]);
        s->ar[b] = NULL;
        if (!rc) rc = r;
    }
    return rc;
}

size_t tks_grad_sync_started_early(const tks_grad_sync *s) { return s->early; }

