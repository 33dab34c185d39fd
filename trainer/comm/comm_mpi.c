/* comm_mpi.c - the MPI transport of comm.h: one MPI communicator per group,
 * typed collectives (fp32, and bf16 through user reduction ops that add in
 * fp32), size_t counts cut into int-sized pieces (tks_comm_chunks),
 * nonblocking starts, and the control collectives the mesh agrees over. */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "common/tks_mpi.h"
#include "trainer/comm/comm.h"

typedef struct mpi_comm {
    tks_comm c;
    MPI_Comm comm;
    int *members;
} mpi_comm;

#define MC(c) ((mpi_comm *)(c))

static int mpi_err(int e, const char *what) {
    if (e == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(e, msg, &len);
    return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "MPI %s failed: %s", what, msg);
}

/* bf16 reductions: fp32 arithmetic, rounded to nearest even (comm.h) */
static void bf16_reduce(void *in, void *inout, int *len, MPI_Datatype *dt, int is_max) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        float x = tks_bf16_to_f32(a[i]), y = tks_bf16_to_f32(b[i]);
        b[i] = tks_bf16_from_f32(is_max ? (x > y ? x : y) : x + y);
    }
}
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) { bf16_reduce(in, inout, len, dt, 0); }
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) { bf16_reduce(in, inout, len, dt, 1); }
static MPI_Op g_bf16_op[2] = {MPI_OP_NULL, MPI_OP_NULL};

static MPI_Datatype mpi_type(tks_dtype d) { return d == TKS_BF16 ? MPI_UINT16_T : MPI_FLOAT; }
static MPI_Op mpi_op(tks_dtype d, tks_comm_op op) {
    if (d == TKS_F32) return op == TKS_COMM_MAX ? MPI_MAX : MPI_SUM;
    int k = op == TKS_COMM_MAX;
    if (g_bf16_op[k] == MPI_OP_NULL) MPI_Op_create(k ? bf16_max : bf16_sum, 1, &g_bf16_op[k]);
    return g_bf16_op[k];
}

/* A started collective: one MPI request per piece (comm.h: counts are cut
 * into pieces of at most tks_comm_chunk_max() elements, never truncated). */
struct tks_comm_req {
    size_t n;
    MPI_Request r[];
};

static int m_start(tks_comm *c, const tks_coll *op, tks_comm_req **req) {
    *req = NULL;
    mpi_comm *mc = MC(c);
    size_t es = tks_dtype_size(op->dtype), n = op->n, max = tks_comm_chunk_max(), f, k;
    size_t S = (size_t)c->size, R = (size_t)c->rank, pieces = tks_comm_chunks(n, max, 0, &f, &k);
    int kind = op->kind;
    if (kind < 0 || kind > TKS_COLL_BROADCAST)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "comm: unknown collective %d", kind);
    c->calls[kind]++;
    c->bytes[kind] += n * es * (kind == TKS_COLL_REDUCE_SCATTER || kind == TKS_COLL_ALLGATHER ? S : 1);
    /* small calls use MPI's own collective (one piece); large ones per-root pieces */
    int whole = pieces <= 1;
    size_t nreq = (kind == TKS_COLL_REDUCE_SCATTER || kind == TKS_COLL_ALLGATHER) && !whole ? S * pieces
                                                                                          : (pieces ? pieces : 1);
    tks_comm_req *q = calloc(1, sizeof *q + nreq * sizeof(MPI_Request));
    if (!q) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory starting a collective");
    for (size_t i = 0; i < nreq; i++) q->r[i] = MPI_REQUEST_NULL;
    MPI_Datatype T = mpi_type(op->dtype);
    char *out = op->out;
    const char *in = op->in;
    int e = MPI_SUCCESS;
    if (c->size == 1) {
        if ((kind == TKS_COLL_REDUCE_SCATTER || kind == TKS_COLL_ALLGATHER) && out != in && n)
            memmove(out, in, n * es); /* host memory (CPU backend) */
    } else if (kind == TKS_COLL_ALLREDUCE) {
        for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
            tks_comm_chunks(n, max, p, &f, &k);
            e = MPI_Iallreduce(MPI_IN_PLACE, out + f * es, (int)k, T, mpi_op(op->dtype, op->op), mc->comm, &q->r[p]);
        }
    } else if (kind == TKS_COLL_BROADCAST) {
        for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
            tks_comm_chunks(n, max, p, &f, &k);
            e = MPI_Ibcast(out + f * es, (int)k, T, op->root, mc->comm, &q->r[p]);
        }
    } else if (kind == TKS_COLL_REDUCE_SCATTER && whole) {
        e = MPI_Ireduce_scatter_block(in, out, (int)n, T, mpi_op(op->dtype, TKS_COMM_SUM), mc->comm, &q->r[0]);
    } else if (kind == TKS_COLL_REDUCE_SCATTER) {
        /* member r's share, piece by piece, reduced to r */
        for (size_t r = 0; r < S && e == MPI_SUCCESS; r++)
            for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
                tks_comm_chunks(n, max, p, &f, &k);
                e = MPI_Ireduce(in + (r * n + f) * es, r == R ? out + f * es : NULL, (int)k, T,
                                mpi_op(op->dtype, TKS_COMM_SUM), (int)r, mc->comm, &q->r[r * pieces + p]);
            }
    } else { /* allgather */
        int in_place = in == out + R * n * es;
        if (whole)
            e = in_place ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, (int)n, T, mc->comm, &q->r[0])
                         : MPI_Iallgather(in, (int)n, T, out, (int)n, T, mc->comm, &q->r[0]);
        else {
            if (!in_place && n) memmove(out + R * n * es, in, n * es);
            for (size_t r = 0; r < S && e == MPI_SUCCESS; r++)
                for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
                    tks_comm_chunks(n, max, p, &f, &k);
                    e = MPI_Ibcast(out + (r * n + f) * es, (int)k, T, (int)r, mc->comm, &q->r[r * pieces + p]);
                }
        }
    }
    q->n = nreq;
    if (e != MPI_SUCCESS) {
        MPI_Waitall((int)nreq, q->r, MPI_STATUSES_IGNORE);
        free(q);
        return mpi_err(e, "collective start");
    }
    *req = q;
    return 0;
}

static int m_wait(tks_comm *c, tks_comm_req *q) {
    (void)c;
    if (!q) return 0;
    int e = MPI_SUCCESS;
    for (size_t i = 0; i < q->n && e == MPI_SUCCESS; i += (size_t)INT_MAX)
        e = MPI_Waitall((int)(q->n - i < (size_t)INT_MAX ? q->n - i : (size_t)INT_MAX), q->r + i,
                        MPI_STATUSES_IGNORE);
    free(q);
    return mpi_err(e, "collective");
}


/* Host bytes to root, in rank order, point to point in pieces (size_t
 * offsets: no int displacement can overflow). */
static int m_gatherv(tks_comm *c, void *out, const size_t *counts, const void *in, int root) {
    size_t max = tks_comm_chunk_max(), f, k, at = 0;
    int e = MPI_SUCCESS;
    if (c->size == 1) return out && out != in && counts[0] ? (memmove(out, in, counts[0]), 0) : 0;
    if (c->rank != root) {
        size_t pieces = tks_comm_chunks(counts[c->rank], max, 0, &f, &k);
        for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
            tks_comm_chunks(counts[c->rank], max, p, &f, &k);
            e = MPI_Send((const char *)in + f, (int)k, MPI_BYTE, root, 7, MC(c)->comm);
        }
        return mpi_err(e, "gather (send)");
    }
    for (int r = 0; r < c->size; r++) {
        size_t pieces = tks_comm_chunks(counts[r], max, 0, &f, &k);
        if (r == root) {
            if (counts[r] && (char *)out + at != in) memmove((char *)out + at, in, counts[r]);
        } else
            for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
                tks_comm_chunks(counts[r], max, p, &f, &k);
                e = MPI_Recv((char *)out + at + f, (int)k, MPI_BYTE, r, 7, MC(c)->comm, MPI_STATUS_IGNORE);
            }
        at += counts[r];
    }
    return mpi_err(e, "gather (receive)");
}

static int m_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    if (c->size == 1) return 0;
    size_t max = tks_comm_chunk_max(), f, k, pieces = tks_comm_chunks(n, max, 0, &f, &k);
    int e = MPI_SUCCESS;
    for (size_t p = 0; p < pieces && e == MPI_SUCCESS; p++) {
        tks_comm_chunks(n, max, p, &f, &k);
        e = MPI_Bcast((char *)buf + f, (int)k, MPI_BYTE, root, MC(c)->comm);
    }
    return mpi_err(e, "broadcast");
}

static int m_barrier(tks_comm *c) {
    return c->size == 1 ? 0 : mpi_err(MPI_Barrier(MC(c)->comm), "barrier");
}

/* lowest failing member's error, to every member (host control data) */
static int m_agree(tks_comm *c, int rc) {
    if (c->size == 1) return rc;
    int mine = rc ? c->rank : c->size, first = c->size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MC(c)->comm);
    if (first == c->size) return 0;
    tks_error e = *tks_last_error();
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, MC(c)->comm);
    tks_error_restore(&e);
    return e.code ? e.code : TKS_ERR_ARG;
}

static const tks_comm_transport mpi_transport = {
    .start = m_start,
    .wait = m_wait,
    .gatherv_host = m_gatherv,
    .barrier = m_barrier,
    .agree = m_agree,
    .broadcast_bytes = m_bcast_bytes,
};

static tks_comm *mpi_comm_new(MPI_Comm comm) {
    mpi_comm *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->comm = comm;
    MPI_Comm_size(comm, &m->c.size);
    MPI_Comm_rank(comm, &m->c.rank);
    m->members = calloc((size_t)m->c.size, sizeof *m->members);
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (m->members) MPI_Allgather(&me, 1, MPI_INT, m->members, 1, MPI_INT, comm);
    tks_comm_init(&m->c, &mpi_transport, m->members, m);
    return &m->c;
}

void tks_comm_mpi_free(tks_comm *c) {
    if (!c) return;
    mpi_comm *m = MC(c);
    if (m->comm != MPI_COMM_WORLD && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m->members);
    free(m);
}

int tks_comm_mpi_split(int color, int key, tks_comm **out) {
    *out = NULL;
    MPI_Comm c = MPI_COMM_WORLD;
    if (color >= 0) {
        int rc = mpi_err(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), "comm_split");
        if (rc) return rc;
    }
    if (!(*out = mpi_comm_new(c))) {
        if (c != MPI_COMM_WORLD) MPI_Comm_free(&c);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    return 0;
}
