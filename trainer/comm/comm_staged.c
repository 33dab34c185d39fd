/* comm_staged.c - the staged transport of comm.h: collectives on device
 * memory through host buffers and an MPI group (--comm mpi under a GPU
 * backend, where no CUDA-aware MPI is assumed). Beside comm_self.c (one
 * process), mesh.c's MPI groups and cuda/nccl_comm.c. docs/GPU.md,
 * "Several processes". */
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/comm/comm.h"

/* ---- the staged comm: a device-memory collective through host buffers ---------
 * start downloads the inputs (be->download waits for the backend's stream, so
 * every earlier kernel has written them), runs the MPI collective on the host
 * copy to completion and uploads the result (ordered before the backend's later
 * work). Blocking, so without overlap: the MPI comm of comm.h needs host
 * memory, and no CUDA-aware MPI is assumed. */
typedef struct staged {
    tks_comm c;
    tks_comm *ctrl; /* the MPI group (host memory) */
    tks_backend *be;
    char *host;     /* scratch, grown to the largest call */
    size_t cap;
} staged;

#define SG(c) ((staged *)(c))

/* A started collective is complete when start returns: wait has nothing to do.
 * Every start hands out this one object; wait ignores it. */
struct tks_comm_req {
    int done;
};
static struct tks_comm_req g_done = {1};

static int grow(staged *s, size_t bytes) {
    if (bytes <= s->cap) return 0;
    char *h = realloc(s->host, bytes);
    if (!h)
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of host memory staging a collective of %zu bytes (--comm mpi under "
                        "--device cuda): use --comm nccl, or a smaller model per rank",
                        bytes);
    s->host = h;
    s->cap = bytes;
    return 0;
}

static int s_start(tks_comm *c, const tks_coll *op, tks_comm_req **req) {
    staged *s = SG(c);
    *req = NULL;
    int kind = op->kind;
    if (kind < 0 || kind > TKS_COLL_BROADCAST)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "comm: unknown collective %d", kind);
    size_t es = tks_dtype_size(op->dtype), S = (size_t)c->size, R = (size_t)c->rank, n = op->n;
    int spread = kind == TKS_COLL_REDUCE_SCATTER || kind == TKS_COLL_ALLGATHER;
    c->calls[kind]++;
    c->bytes[kind] += n * es * (spread ? S : 1);
    /* host layout: reduce_scatter [in: S n][out: n]; allgather [out: S n] with
     * this member's block at R n (MPI's in-place form); else [buf: n] */
    size_t main = (spread ? S : 1) * n * es, extra = kind == TKS_COLL_REDUCE_SCATTER ? n * es : 0;
    int rc = grow(s, main + extra ? main + extra : 1);
    if (rc) return rc;
    tks_backend *be = s->be;
    tks_coll h = *op;
    switch (kind) {
    case TKS_COLL_REDUCE_SCATTER:
        rc = be->ops->download(be, s->host, op->in, main);
        h.in = s->host;
        h.out = s->host + main;
        break;
    case TKS_COLL_ALLGATHER:
        rc = be->ops->download(be, s->host + R * n * es, op->in, n * es);
        h.out = s->host;
        h.in = s->host + R * n * es;
        break;
    default:
        rc = be->ops->download(be, s->host, op->out, main);
        h.out = s->host;
    }
    tks_comm_req *q = NULL;
    if (!rc) rc = s->ctrl->t->start(s->ctrl, &h, &q);
    if (!rc) rc = s->ctrl->t->wait(s->ctrl, q);
    if (!rc) rc = be->ops->upload(be, op->out, h.out, kind == TKS_COLL_REDUCE_SCATTER ? n * es : main);
    if (!rc) *req = &g_done;
    return rc;
}

static int s_wait(tks_comm *c, tks_comm_req *q) {
    (void)c, (void)q;
    return 0;
}

/* control collectives: host data, the MPI group's own */
static int s_gatherv(tks_comm *c, void *out, const size_t *counts, const void *in, int root) {
    return SG(c)->ctrl->t->gatherv_host(SG(c)->ctrl, out, counts, in, root);
}
static int s_agree(tks_comm *c, int rc) { return SG(c)->ctrl->t->agree(SG(c)->ctrl, rc); }
static int s_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    return SG(c)->ctrl->t->broadcast_bytes(SG(c)->ctrl, buf, n, root);
}
static int s_barrier(tks_comm *c) {
    int rc = SG(c)->be->ops->sync(SG(c)->be);
    int rc2 = SG(c)->ctrl->t->barrier(SG(c)->ctrl);
    return rc ? rc : rc2;
}

static const tks_comm_transport staged_transport = {
    .start = s_start,
    .wait = s_wait,
    .gatherv_host = s_gatherv,
    .barrier = s_barrier,
    .agree = s_agree,
    .broadcast_bytes = s_bcast_bytes,
};

tks_comm *tks_comm_staged_new(tks_comm *ctrl, tks_backend *be) {
    staged *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctrl = ctrl;
    s->be = be;
    s->c.size = ctrl->size;
    s->c.rank = ctrl->rank;
    tks_comm_init(&s->c, &staged_transport, s->ctrl->members, s);
    return &s->c;
}

void tks_comm_staged_free(tks_comm *c) {
    if (!c) return;
    free(SG(c)->host);
    free(SG(c));
}

