/* mesh_device.c - the mesh's groups on the backend in use (--comm): the MPI
 * groups mesh.c builds and checks serve the CPU backend as they are; under
 * the CUDA backend they become NCCL communicators (tks_nccl_comm_create: one
 * per group, split from one world communicator and checked member by member
 * against the MPI group, which mesh.c checked against the plan), or, with
 * --comm mpi, MPI through host memory (the staged comm below). The MPI groups
 * stay underneath for launch and control (agree, gatherv_host,
 * broadcast_bytes). docs/GPU.md, "Several processes". */
#include <stdlib.h>
#include <string.h>

#include "../common/tks.h"
#include "cuda/cuda.h"
#include "mesh.h"

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
        rc = be->download(be, s->host, op->in, main);
        h.in = s->host;
        h.out = s->host + main;
        break;
    case TKS_COLL_ALLGATHER:
        rc = be->download(be, s->host + R * n * es, op->in, n * es);
        h.out = s->host;
        h.in = s->host + R * n * es;
        break;
    default:
        rc = be->download(be, s->host, op->out, main);
        h.out = s->host;
    }
    tks_comm_req *q = NULL;
    if (!rc) rc = s->ctrl->start(s->ctrl, &h, &q);
    if (!rc) rc = s->ctrl->wait(s->ctrl, q);
    if (!rc) rc = be->upload(be, op->out, h.out, kind == TKS_COLL_REDUCE_SCATTER ? n * es : main);
    if (!rc) *req = &g_done;
    return rc;
}

static int s_wait(tks_comm *c, tks_comm_req *q) {
    (void)c, (void)q;
    return 0;
}

/* control collectives: host data, the MPI group's own */
static int s_gatherv(tks_comm *c, void *out, const size_t *counts, const void *in, int root) {
    return SG(c)->ctrl->gatherv_host(SG(c)->ctrl, out, counts, in, root);
}
static int s_agree(tks_comm *c, int rc) { return SG(c)->ctrl->agree(SG(c)->ctrl, rc); }
static int s_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    return SG(c)->ctrl->broadcast_bytes(SG(c)->ctrl, buf, n, root);
}
static int s_barrier(tks_comm *c) {
    int rc = SG(c)->be->sync(SG(c)->be);
    int rc2 = SG(c)->ctrl->barrier(SG(c)->ctrl);
    return rc ? rc : rc2;
}

static tks_comm *staged_new(tks_comm *ctrl, tks_backend *be) {
    staged *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctrl = ctrl;
    s->be = be;
    s->c.size = ctrl->size;
    s->c.rank = ctrl->rank;
    s->c.members = ctrl->members;
    s->c.ctx = s;
    s->c.start = s_start;
    s->c.wait = s_wait;
    s->c.gatherv_host = s_gatherv;
    s->c.barrier = s_barrier;
    s->c.agree = s_agree;
    s->c.broadcast_bytes = s_bcast_bytes;
    tks_comm_set_blocking(&s->c);
    return &s->c;
}

static void staged_free(tks_comm *c) {
    if (!c) return;
    free(SG(c)->host);
    free(SG(c));
}

/* ---- the switch ---------------------------------------------------------------- */

const char *tks_mesh_comm_name(const tks_mesh *m) {
    switch (m->dev_kind) {
    case TKS_MESH_DEV_NCCL: return "nccl";
    case TKS_MESH_DEV_STAGED: return "mpi (staged through host memory)";
    default: return m->mpi ? "mpi" : "none (one process)";
    }
}

int tks_mesh_comm_resolve(const char *comm, const char *backend, int world, int *kind) {
    *kind = TKS_MESH_DEV_NONE;
    if (!comm) comm = "auto";
    int is_auto = !strcmp(comm, "auto"), is_mpi = !strcmp(comm, "mpi"), is_nccl = !strcmp(comm, "nccl");
    if (!is_auto && !is_mpi && !is_nccl)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--comm %s: use auto (NCCL under --device cuda, else MPI), mpi or nccl", comm);
    int cuda = backend && !strcmp(backend, "cuda");
    if (is_nccl && !cuda)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--comm nccl needs the CUDA backend (NCCL moves GPU memory) but this run "
                        "uses the %s backend%s: use --device cuda on a GPU machine, or --comm mpi",
                        backend ? backend : "cpu",
                        tks_cuda_built() ? "" : " (and this tokshard was built without CUDA and "
                                                "NCCL: rebuild with cmake -DTKS_CUDA=ON)");
    if (world <= 1) return 0; /* one process: no collective moves data */
    if (cuda) *kind = is_mpi ? TKS_MESH_DEV_STAGED : TKS_MESH_DEV_NCCL;
#ifdef TKS_TEST_HOOKS
    /* the staged path on the CPU backend, so CPU-only tests cover it */
    const char *t = getenv("TOKSHARD_TEST_STAGED_COMM");
    if (!cuda && t && !strcmp(t, "1")) *kind = TKS_MESH_DEV_STAGED;
#endif
    return 0;
}

void tks_mesh_device_free(tks_mesh *m) {
    if (!m || !m->dev_kind) return;
    for (int k = 0; k < TKS_N_GROUPS; k++) {
        if (!m->ctrl[k]) continue;
        if (m->group[k] != m->ctrl[k]) {
            if (m->dev_kind == TKS_MESH_DEV_NCCL) tks_nccl_comm_free(m->group[k]);
            else staged_free(m->group[k]);
        }
        m->group[k] = m->ctrl[k];
        m->ctrl[k] = NULL;
    }
    tks_nccl_world_free((tks_nccl_world *)m->nccl);
    m->nccl = NULL;
    m->dev_kind = TKS_MESH_DEV_NONE;
}

int tks_mesh_use_backend(tks_mesh *m, tks_backend *be, const char *comm, int rc) {
    /* the world agrees on what came before: every rank switches, or none */
    rc = tks_mesh_agree(m, rc);
    int kind = TKS_MESH_DEV_NONE;
    if (!rc) rc = tks_mesh_comm_resolve(comm, be->name, m->world, &kind);
    if (rc || !m->mpi || kind == TKS_MESH_DEV_NONE) return rc;
    m->dev_kind = kind;
    for (int k = 0; k < TKS_N_GROUPS; k++) m->ctrl[k] = m->group[k];
    if (kind == TKS_MESH_DEV_NCCL) {
        tks_nccl_world *w = NULL;
        /* collective over the world; a failure on any rank is every rank's */
        rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], tks_nccl_world_create(be, &w));
        m->nccl = w;
        /* every rank splits every group, in the same order (ncclCommSplit is
         * collective over the world communicator): after each group the world
         * agrees, so no rank goes on to the next split while another stopped */
        for (int k = 0; k < TKS_N_GROUPS && !rc; k++) {
            tks_comm *g = NULL;
            rc = tks_nccl_comm_create(w, m->ctrl[k], &g);
            if (!rc) m->group[k] = g;
            rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], rc);
        }
    } else {
        for (int k = 0; k < TKS_N_GROUPS && !rc; k++) {
            tks_comm *g = staged_new(m->ctrl[k], be);
            if (!g) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
            else m->group[k] = g;
        }
    }
    /* agreed over the MPI world (the NCCL comms may be the failure) */
    rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], rc);
    if (rc) tks_mesh_device_free(m);
    return rc;
}
