/* nccl_comm.c - comm.h on NCCL: the world communicator from
 * one ncclGetUniqueId broadcast over MPI, one communicator per mesh group with
 * ncclCommSplit, checked member by member against the MPI group mesh.c built
 * from the plan; collectives on the group's own stream, ordered against the
 * backend's stream by events: a started collective runs beside the backend's
 * later work until its wait makes the backend's stream wait for it (the
 * gradient buckets overlap the backward); asynchronous errors polled and
 * turned into TKS_ERR_IO; a communicator that failed on any member is
 * aborted, never destroyed (ncclCommDestroy would wait for peers that are
 * gone). MPI stays for launch and control (the group's MPI comm serves
 * gatherv_host, agree, broadcast_bytes and the host side of barrier). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tks.h"
#include "trainer/cuda/cuda.h"

struct tks_nccl_world {
    tks_backend *be;
    cudaStream_t compute; /* the backend's stream */
    ncclComm_t comm;
    int rank, size;
    int groups; /* groups split from it, for their names in messages */
};

/* A started collective: the event that marks its end on the group's stream
 * (kept on a free list, so starting one allocates only the first time). */
struct tks_comm_req {
    cudaEvent_t done;
    struct tks_comm_req *next;
};

typedef struct nccl_group {
    tks_comm c;
    tks_nccl_world *w;
    tks_comm *ctrl; /* the MPI comm of the same group (control collectives) */
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t before, after;
    struct tks_comm_req *free_reqs;
    int *members;
    int color, id;
    int err; /* sticky */
    char msg[400];
} nccl_group;

#define NG(c) ((nccl_group *)(c))

static int fail_nccl(ncclResult_t r, const char *what) {
    return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                    "NCCL %s failed: %s (%s); rerun with NCCL_DEBUG=WARN for NCCL's reason, or "
                    "use the MPI comm (--device cpu)",
                    what, ncclGetErrorString(r), ncclGetLastError(NULL));
}

static int fail_cuda(cudaError_t e, const char *what) {
    return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "NCCL comm: %s failed: %s", what,
                    cudaGetErrorString(e));
}

/* The group's sticky error, set again on this thread. */
static int group_error(nccl_group *g) {
    return tks_fail(g->err, NULL, TKS_NONE, TKS_NONE, "%s", g->msg);
}

/* Polls NCCL's asynchronous error; the first one aborts the communicator
 * (so no rank waits forever on it) and becomes sticky. */
static int poll(nccl_group *g, const char *op) {
    if (g->err) return group_error(g);
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(g->comm, &st);
    if (r == ncclSuccess && (st == ncclSuccess || st == ncclInProgress)) return 0;
    ncclResult_t bad = r != ncclSuccess ? r : st;
    g->err = TKS_ERR_IO;
    snprintf(g->msg, sizeof g->msg,
             "NCCL %s failed on group %d (color %d, %d members, this rank %d of it): %s; the "
             "communicator was aborted. Rerun with NCCL_DEBUG=WARN for NCCL's reason",
             op, g->id, g->color, g->c.size, g->c.rank, ncclGetErrorString(bad));
    ncclCommAbort(g->comm);
    g->comm = NULL;
    return group_error(g);
}

/* Orders the collective after the compute stream's work. */
static int enter(nccl_group *g, const char *op) {
    if (g->err) return group_error(g);
    cudaError_t e = cudaEventRecord(g->before, g->w->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->stream, g->before, 0);
    if (e != cudaSuccess) return fail_cuda(e, op);
    return 0;
}
/* The result of enqueueing a collective: an error is sticky. */
static int enqueued(nccl_group *g, ncclResult_t r, const char *op) {
    if (r == ncclSuccess || r == ncclInProgress) return 0;
    g->err = TKS_ERR_IO;
    snprintf(g->msg, sizeof g->msg, "NCCL %s failed on group %d (color %d): %s (%s)", op, g->id,
             g->color, ncclGetErrorString(r), ncclGetLastError(g->comm));
    return group_error(g);
}
/* After a collective whose caller gets no handle (barrier, the grouped
 * all-reduce): the compute stream's later work waits for it. */
static int leave(nccl_group *g, ncclResult_t r, const char *op) {
    int rc = enqueued(g, r, op);
    if (rc) return rc;
    cudaError_t e = cudaEventRecord(g->after, g->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->w->compute, g->after, 0);
    if (e != cudaSuccess) return fail_cuda(e, op);
    return poll(g, op);
}

/* Waits for the comm stream while polling for asynchronous errors (a peer
 * that died makes NCCL report instead of hanging the wait). */
static int wait_stream(nccl_group *g, const char *op) {
    for (;;) {
        cudaError_t e = cudaEventQuery(g->after);
        if (e == cudaSuccess) return poll(g, op);
        if (e != cudaErrorNotReady) return fail_cuda(e, op);
        int rc = poll(g, op);
        if (rc) return rc;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static ncclDataType_t nccl_type(tks_dtype d) {
    return d == TKS_BF16 ? ncclBfloat16 : ncclFloat32;
}
static const char *coll_name(int kind) {
    static const char *n[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
    return kind >= 0 && kind <= TKS_COLL_BROADCAST ? n[kind] : "collective";
}

static int g_start(tks_comm *c, const tks_coll *op, tks_comm_req **req) {
    nccl_group *g = NG(c);
    *req = NULL;
    int kind = op->kind;
    if (kind < 0 || kind > TKS_COLL_BROADCAST)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "comm: unknown collective %d", kind);
    const char *name = coll_name(kind);
    size_t es = tks_dtype_size(op->dtype), S = (size_t)c->size;
    c->calls[kind]++;
    c->bytes[kind] += op->n * es * (kind == TKS_COLL_REDUCE_SCATTER || kind == TKS_COLL_ALLGATHER ? S : 1);
    int rc = enter(g, name);
    if (rc) return rc;
    ncclDataType_t T = nccl_type(op->dtype);
    ncclResult_t r;
    switch (kind) {
    case TKS_COLL_ALLREDUCE:
        r = ncclAllReduce(op->out, op->out, op->n, T, op->op == TKS_COMM_MAX ? ncclMax : ncclSum,
                          g->comm, g->stream);
        break;
    case TKS_COLL_REDUCE_SCATTER:
        r = ncclReduceScatter(op->in, op->out, op->n, T, ncclSum, g->comm, g->stream);
        break;
    case TKS_COLL_ALLGATHER: /* in == out + rank * n is NCCL's in-place form too */
        r = ncclAllGather(op->in, op->out, op->n, T, g->comm, g->stream);
        break;
    default: r = ncclBroadcast(op->out, op->out, op->n, T, op->root, g->comm, g->stream); break;
    }
    /* the compute stream goes on; g_wait orders its later work after q->done */
    rc = enqueued(g, r, name);
    if (rc) return rc;
    struct tks_comm_req *q = g->free_reqs;
    if (q) g->free_reqs = q->next;
    else {
        q = calloc(1, sizeof *q);
        if (!q) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory starting a collective");
        cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(q);
            return fail_cuda(e, "event creation");
        }
    }
    cudaError_t e = cudaEventRecord(q->done, g->stream);
    rc = e != cudaSuccess ? fail_cuda(e, name) : poll(g, name);
    if (rc) {
        q->next = g->free_reqs, g->free_reqs = q;
        return rc;
    }
    *req = q;
    return 0;
}

/* Stream-ordered completion: the backend's later work waits for the event
 * recorded after the collective (the host does not block). */
static int g_wait(tks_comm *c, tks_comm_req *q) {
    nccl_group *g = NG(c);
    if (!q) return 0;
    cudaError_t e = cudaStreamWaitEvent(g->w->compute, q->done, 0);
    q->next = g->free_reqs, g->free_reqs = q;
    if (e != cudaSuccess) return fail_cuda(e, "wait");
    return poll(g, "wait");
}


/* control collectives: host data, through the group's MPI comm */
static int n_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    tks_comm *k = NG(c)->ctrl;
    return k->t->broadcast_bytes(k, buf, n, root);
}
static int n_gatherv(tks_comm *c, void *out, const size_t *counts, const void *in, int root) {
    tks_comm *k = NG(c)->ctrl;
    return k->t->gatherv_host(k, out, counts, in, root);
}
/* A member whose NCCL communicator failed joins the agreement with that error. */
static int n_agree(tks_comm *c, int rc) {
    nccl_group *g = NG(c);
    if (!rc && g->err) rc = group_error(g);
    return g->ctrl->t->agree(g->ctrl, rc);
}
/* Device work before the barrier is complete on every member after it. */
static int n_barrier(tks_comm *c) {
    nccl_group *g = NG(c);
    int rc = enter(g, "barrier");
    if (!rc) rc = leave(g, ncclSuccess, "barrier");
    if (!rc) rc = wait_stream(g, "barrier");
    cudaError_t e = cudaStreamSynchronize(g->w->compute);
    if (!rc && e != cudaSuccess) rc = fail_cuda(e, "barrier (compute stream)");
    int rc2 = g->ctrl->t->barrier(g->ctrl);
    return rc ? rc : rc2;
}

int tks_nccl_allreduce_many(tks_comm *c, float *const *bufs, const size_t *n, int count) {
    nccl_group *g = NG(c);
    int rc = enter(g, "allreduce (grouped)");
    if (rc) return rc;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < count && r == ncclSuccess; i++) {
        c->calls[TKS_COLL_ALLREDUCE]++;
        c->bytes[TKS_COLL_ALLREDUCE] += n[i] * sizeof(float);
        r = ncclAllReduce(bufs[i], bufs[i], n[i], ncclFloat32, ncclSum, g->comm, g->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    return leave(g, r != ncclSuccess ? r : r2, "allreduce (grouped)");
}

/* ---- creation ------------------------------------------------------------------ */

int tks_nccl_world_create(tks_backend *be, tks_nccl_world **out) {
    *out = NULL;
    if (!be || strcmp(be->kind->name, "cuda") != 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the NCCL comm needs the CUDA backend (this one is %s)",
                        be ? be->kind->name : "none");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the NCCL comm needs MPI for its setup: launch with mpirun");
    tks_nccl_world *w = calloc(1, sizeof *w);
    if (!w) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    w->be = be;
    w->compute = (cudaStream_t)tks_cuda_backend_stream(be);
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (w->rank == 0) r = ncclGetUniqueId(&id);
    /* every rank learns whether rank 0 got an id before anyone waits in init */
    int ok = r == ncclSuccess;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        free(w);
        return fail_nccl(r, "ncclGetUniqueId (on rank 0)");
    }
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    r = ncclCommInitRank(&w->comm, w->size, id, w->rank);
    /* agree: no rank goes on with a world that failed somewhere */
    int mine = r == ncclSuccess, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        int rc = r != ncclSuccess
                     ? fail_nccl(r, "ncclCommInitRank")
                     : tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                                "NCCL ncclCommInitRank failed on another rank (its message is "
                                "in its log); on one GPU shared by several ranks give each rank "
                                "its own NCCL_HOSTID (docs/GPU.md)");
        if (w->comm) ncclCommAbort(w->comm); /* another rank failed: destroy would wait for it */
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

void tks_nccl_world_free(tks_nccl_world *w) {
    if (!w) return;
    if (w->comm) ncclCommDestroy(w->comm);
    free(w);
}

/* abort: the group failed on some member; its communicator is aborted first,
 * which ends its pending work, so that the stream can drain. */
static void group_destroy(nccl_group *g, int abort) {
    if (!g) return;
    if (g->comm && (abort || g->err)) {
        ncclCommAbort(g->comm);
        g->comm = NULL;
    }
    if (g->stream) cudaStreamSynchronize(g->stream);
    if (g->comm) ncclCommDestroy(g->comm);
    if (g->before) cudaEventDestroy(g->before);
    if (g->after) cudaEventDestroy(g->after);
    if (g->stream) cudaStreamDestroy(g->stream);
    while (g->free_reqs) {
        struct tks_comm_req *q = g->free_reqs;
        g->free_reqs = q->next;
        cudaEventDestroy(q->done);
        free(q);
    }
    free(g->members);
    free(g);
}

void tks_nccl_comm_free(tks_comm *c) {
    if (c) group_destroy(NG(c), 0);
}

static const tks_comm_transport nccl_transport = {
    .start = g_start,
    .wait = g_wait,
    .gatherv_host = n_gatherv,
    .barrier = n_barrier,
    .agree = n_agree,
    .broadcast_bytes = n_bcast_bytes,
};

/* The group NCCL built (g->members, gathered over it) against the planned
 * one (ctrl's members): TKS_ERR_ARG naming both lists when they differ. */
static int check_members(nccl_group *g, const tks_comm *ctrl) {
    if (g->c.size == ctrl->size && g->c.rank == ctrl->rank &&
        !memcmp(g->members, ctrl->members, (size_t)ctrl->size * sizeof *g->members))
        return 0;
    char why[600];
    int o = snprintf(why, sizeof why, "rank %d: the NCCL group (color %d) has %d members [",
                     g->w->rank, g->color, g->c.size);
    for (int i = 0; i < g->c.size && o < 400; i++)
        o += snprintf(why + o, sizeof why - (size_t)o, i ? " %d" : "%d", g->members[i]);
    o += snprintf(why + o, sizeof why - (size_t)o, "] but the planned group has %d [", ctrl->size);
    for (int i = 0; i < ctrl->size && o < 560; i++)
        o += snprintf(why + o, sizeof why - (size_t)o, i ? " %d" : "%d", ctrl->members[i]);
    snprintf(why + o, sizeof why - (size_t)o, "]");
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "%s: refusing to train on a group that is not the planned one", why);
}

int tks_nccl_comm_create(tks_nccl_world *w, tks_comm *ctrl, tks_comm **out) {
    *out = NULL;
    nccl_group *g = calloc(1, sizeof *g);
    int color = 0x7fffffff;
    for (int i = 0; i < ctrl->size; i++) color = ctrl->members[i] < color ? ctrl->members[i] : color;
    /* the split is collective over the world: every rank makes it, even after
     * a local failure (NCCL_SPLIT_NOCOLOR keeps it out of every group) */
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(w->comm, g ? color : NCCL_SPLIT_NOCOLOR, ctrl->rank, &nc, NULL);
    if (!g) { /* the others learn it in the first agreement below */
        if (nc) ncclCommAbort(nc);
        return ctrl->t->agree(ctrl, tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory"));
    }
    g->w = w;
    g->ctrl = ctrl;
    g->comm = nc;
    g->color = color;
    g->id = w->groups++;
    int rc = r != ncclSuccess ? fail_nccl(r, "ncclCommSplit") : 0;
    cudaError_t e = cudaSuccess;
    if (!rc) {
        e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->before, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->after, cudaEventDisableTiming);
        if (e != cudaSuccess) rc = fail_cuda(e, "stream/event creation");
    }
    int *d = NULL;
    if (!rc) {
        ncclCommCount(g->comm, &g->c.size);
        ncclCommUserRank(g->comm, &g->c.rank);
        g->members = calloc((size_t)g->c.size, sizeof *g->members);
        if (!g->members) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    if (!rc && (e = cudaMalloc((void **)&d, (size_t)g->c.size * sizeof *d)) != cudaSuccess)
        rc = fail_cuda(e, "member check");
    /* every member can take part in the member check before any starts it:
     * one that cannot would leave the others waiting in the all-gather. The
     * members agree once more after enqueueing it and once at the end, all
     * of them on every path (a failure in one agreement skips the next ones
     * on every member alike). */
    rc = ctrl->t->agree(ctrl, rc);
    /* members: every member's world rank, gathered over the NEW communicator,
     * so what is checked is what NCCL built */
    if (!rc) {
        e = cudaMemcpyAsync(d + g->c.rank, &w->rank, sizeof *d, cudaMemcpyHostToDevice, g->stream);
        if (e == cudaSuccess)
            rc = enqueued(g, ncclAllGather(d + g->c.rank, d, 1, ncclInt32, g->comm, g->stream),
                          "allgather of the group's members");
        if (!rc && e == cudaSuccess) e = cudaEventRecord(g->after, g->stream);
        if (!rc && e != cudaSuccess) rc = fail_cuda(e, "member check");
        /* every member enqueued the all-gather before any waits for it (a
         * failure aborts the communicator everywhere, ending the wait). The
         * copy of the result into g->members (pageable host memory) comes
         * after the wait: such a copy blocks the host until the all-gather
         * is done, which before the agreement could wait for a member that
         * failed to enqueue it. */
        rc = ctrl->t->agree(ctrl, rc);
        if (!rc) {
            rc = wait_stream(g, "allgather of the group's members");
            if (!rc && (e = cudaMemcpy(g->members, d, (size_t)g->c.size * sizeof *d, cudaMemcpyDeviceToHost)) !=
                           cudaSuccess)
                rc = fail_cuda(e, "member check");
            if (!rc) rc = check_members(g, ctrl);
            /* every member learns whether the group is usable before anyone uses it */
            rc = ctrl->t->agree(ctrl, rc);
        }
    }
    if (d) {
        if (rc && g->comm) { /* abort first: the all-gather may still hold d */
            ncclCommAbort(g->comm);
            g->comm = NULL;
            cudaStreamSynchronize(g->stream);
        }
        cudaFree(d);
    }
    if (rc) {
        group_destroy(g, 1);
        return rc;
    }
    tks_comm_init(&g->c, &nccl_transport, g->members, g);
    *out = &g->c;
    return 0;
}
