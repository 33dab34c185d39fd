/* comm_self.c - the parts of comm.h every implementation shares (chunk
 * planning, agreement) and the group of one process, where every
 * collective is the identity. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/comm/comm.h"

size_t tks_comm_chunk_max(void) {
    static size_t max = 0;
    if (!max) {
        const char *t = getenv("TOKSHARD_TEST_COMM_CHUNK");
        long long v = t ? atoll(t) : 0;
        max = v > 0 && v < INT_MAX ? (size_t)v : (size_t)INT_MAX;
    }
    return max;
}

size_t tks_comm_chunks(size_t n, size_t max, size_t k, size_t *first, size_t *count) {
    size_t pieces = n / max + (n % max != 0);
    if (k < pieces) {
        *first = k * max;
        *count = n - *first < max ? n - *first : max;
    } else {
        *first = n;
        *count = 0;
    }
    return pieces;
}

int tks_comm_agree(tks_comm *c, int rc) { return c && c->size > 1 ? c->t->agree(c, rc) : rc; }

int tks_comm_host_sum(tks_comm *c, float *v, size_t n) {
    if (!c || c->size <= 1 || !n) return 0;
    size_t S = (size_t)c->size, *counts = malloc(S * sizeof *counts);
    float *all = c->rank == 0 ? malloc(S * n * sizeof *all) : NULL;
    int rc = counts && (c->rank != 0 || all)
                 ? 0
                 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (host sum of %zu x %zu)", S, n);
    rc = tks_comm_agree(c, rc);
    for (size_t i = 0; !rc && i < S; i++) counts[i] = n * sizeof *v;
    if (!rc) rc = c->t->gatherv_host(c, all, counts, v, 0);
    if (!rc && c->rank == 0)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t i = 0; i < S; i++) s += all[i * n + j];
            v[j] = (float)s;
        }
    if (!rc) rc = c->t->broadcast_bytes(c, v, n * sizeof *v, 0);
    free(counts);
    free(all);
    return rc;
}

/* ---- one process ------------------------------------------------------------ */

static void (*g_copy)(void *ctx, void *dst, const void *src, size_t bytes);
static void *g_copy_ctx;

void tks_comm_self_set_copy(void (*copy)(void *ctx, void *dst, const void *src, size_t bytes),
                            void *ctx) {
    g_copy = copy;
    g_copy_ctx = ctx;
}

static void dev_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || !bytes) return;
    if (g_copy) g_copy(g_copy_ctx, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

static int self_start(tks_comm *c, const tks_coll *op, tks_comm_req **req) {
    *req = NULL;
    size_t es = tks_dtype_size(op->dtype), n = op->n;
    if (op->kind >= 0 && op->kind < 4) {
        c->calls[op->kind]++;
        c->bytes[op->kind] += n * es;
    }
    if (op->kind == TKS_COLL_REDUCE_SCATTER || op->kind == TKS_COLL_ALLGATHER)
        dev_copy(op->out, op->in, n * es); /* size 1: in has n elements, out n */
    return 0;
}
static int self_wait(tks_comm *c, tks_comm_req *req) {
    (void)c, (void)req;
    return 0;
}
static int self_gatherv(tks_comm *c, void *out, const size_t *counts, const void *in, int root) {
    (void)c, (void)root;
    if (out && out != in && counts[0]) memmove(out, in, counts[0]); /* host memory */
    return 0;
}
static int self_barrier(tks_comm *c) {
    (void)c;
    return 0;
}
static int self_agree(tks_comm *c, int rc) {
    (void)c;
    return rc;
}
static int self_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    (void)c, (void)buf, (void)n, (void)root;
    return 0;
}

int tks_comm_run(tks_comm *c, const tks_coll *op) {
    tks_comm_req *q = NULL;
    int rc = c->t->start(c, op, &q);
    return rc ? rc : c->t->wait(c, q);
}

/* The blocking fp32 forms of any transport: start + wait on its calls. */
static int blk_run(tks_comm *c, int kind, tks_comm_op opk, float *out, const float *in, size_t n, int root) {
    tks_coll op = {.kind = kind, .dtype = TKS_F32, .op = opk, .out = out, .in = in, .n = n, .root = root};
    return tks_comm_run(c, &op);
}
int tks_comm_allreduce_sum(tks_comm *c, float *b, size_t n) { return blk_run(c, TKS_COLL_ALLREDUCE, TKS_COMM_SUM, b, NULL, n, 0); }
int tks_comm_allreduce_max(tks_comm *c, float *b, size_t n) { return blk_run(c, TKS_COLL_ALLREDUCE, TKS_COMM_MAX, b, NULL, n, 0); }
int tks_comm_reduce_scatter_sum(tks_comm *c, float *out, const float *in, size_t n) {
    return blk_run(c, TKS_COLL_REDUCE_SCATTER, TKS_COMM_SUM, out, in, n, 0);
}
int tks_comm_allgather(tks_comm *c, float *out, const float *in, size_t n) {
    return blk_run(c, TKS_COLL_ALLGATHER, TKS_COMM_SUM, out, in, n, 0);
}
int tks_comm_broadcast(tks_comm *c, float *b, size_t n, int root) {
    return blk_run(c, TKS_COLL_BROADCAST, TKS_COMM_SUM, b, NULL, n, root);
}

void tks_comm_init(tks_comm *c, const tks_comm_transport *t, const int *members, void *ctx) {
    c->members = members;
    c->ctx = ctx;
    c->t = t;
}

static const tks_comm_transport self_transport = {
    .start = self_start, .wait = self_wait, .gatherv_host = self_gatherv, .barrier = self_barrier,
    .agree = self_agree, .broadcast_bytes = self_bcast_bytes,
};
static const int self_members[1] = {0};
static tks_comm self = {.size = 1, .rank = 0, .members = self_members, .t = &self_transport};

tks_comm *tks_comm_self(void) { return &self; }
