/*
 * comm.h - collectives on a group of processes (a tp, dp_shard or
 * dp_replicate group of the mesh). Private to trainer/. Transports:
 * tks_comm_self (one process, comm_self.c), MPI (comm_mpi.c), staged through
 * host memory (comm_staged.c) and NCCL (trainer/cuda/nccl_comm.c); they
 * implement one table of calls, so model and optimizer code never change.
 * docs/PARALLELISM.md, "The comm contract".
 *
 * Rules every implementation keeps and every caller may rely on:
 *
 *  - Buffers are DEVICE pointers of the backend in use (backend.h); only
 *    broadcast_bytes and gatherv_host take host memory. An implementation
 *    never dereferences a device pointer on the host (tks_comm_self copies
 *    through the `copy` hook it is given, never with memmove).
 *  - Counts are size_t elements of the call's dtype (fp32 or bf16: bf16 is
 *    the upper 16 bits of an fp32). A sum of bf16 adds two members' values
 *    at a time in fp32 and rounds each partial sum to bf16 (nearest even), in
 *    an order the transport picks: over p members an element is rounded up
 *    to p - 1 times (once for p = 2), not once at the end. The MPI transport
 *    does so in its user reduction op at every step of MPI's reduction; NCCL
 *    does so at every hop of its ring or tree. fp32 sums likewise round at
 *    every addition, in the transport's order. A transport whose counts are
 *    int (MPI) splits a call into pieces of at most tks_comm_chunk_max()
 *    elements; a count is never truncated or cast (tks_comm_chunks plans the
 *    pieces).
 *  - In place: allreduce and broadcast work in place on `buf`. allgather is
 *    in place when in == out + rank * n (this member's block already sits in
 *    the output); any other overlap of in and out is not allowed.
 *    reduce_scatter's out must not overlap its in.
 *  - Asynchronous: every data collective is started by `start` and returns a
 *    handle; the buffers belong to the collective until `wait` on that handle
 *    returns; every handle is waited on exactly once (that frees it), in any
 *    order. Every member starts the same collectives in the same order. A
 *    stream-ordered transport (NCCL) may return from start at once and
 *    complete in wait (the backend's later work runs beside it until then);
 *    the MPI one uses MPI's nonblocking collectives, so the reduction runs
 *    while the caller computes (overlap). The MPI
 *    implementation serves the CPU backend, whose device memory is host
 *    memory.
 *  - The blocking forms (tks_comm_allreduce_sum ... tks_comm_broadcast) are
 *    start + wait on fp32 data, for the model's few tp collectives.
 *  - Errors: 0 or a negative TKS_ERR_* code with context; after an error the
 *    group must not be used for data again except through tks_comm_agree's
 *    control collective, which every member reaches on every path.
 */
#ifndef TKS_COMM_H
#define TKS_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/backend/backend.h" /* tks_dtype, bf16 conversions */

typedef struct tks_comm tks_comm;
typedef struct tks_comm_req tks_comm_req;
typedef struct tks_coll tks_coll;

enum { TKS_COLL_ALLREDUCE = 0, TKS_COLL_REDUCE_SCATTER, TKS_COLL_ALLGATHER, TKS_COLL_BROADCAST };

typedef enum tks_comm_op { TKS_COMM_SUM = 0, TKS_COMM_MAX = 1 } tks_comm_op;

/* One collective to start. */
struct tks_coll {
    int kind;             /* TKS_COLL_* */
    tks_dtype dtype;
    tks_comm_op op;       /* allreduce only (reduce_scatter always sums) */
    void *out;            /* allreduce, broadcast: the buffer (in place); reduce_scatter: n
                           * elements; allgather: size * n elements */
    const void *in;       /* reduce_scatter: size * n elements (member r's share is
                           * in[r*n .. r*n+n)); allgather: n elements; else unused */
    size_t n;             /* elements per member (see above) */
    int root;             /* broadcast only */
};

/* What a transport implements (the contracts above): one static const table
 * per transport, as the backends have theirs (backend.h). */
typedef struct tks_comm_transport {
    /* starts one collective; its handle goes to wait */
    int (*start)(tks_comm *c, const tks_coll *op, tks_comm_req **req);
    /* completes (and frees) a handle from start; NULL is a no-op */
    int (*wait)(tks_comm *c, tks_comm_req *req);
    /* host memory, blocking: root receives counts[i] bytes from member i,
     * concatenated in rank order into out (sum of counts bytes; other members
     * pass out NULL). Every member passes the same counts. Chunked like the
     * rest. For checkpoints: one tensor at a time to the writer. */
    int (*gatherv_host)(tks_comm *c, void *out, const size_t *counts, const void *in, int root);
    int (*barrier)(tks_comm *c);
    /* tks_comm_agree's transport: host control data only */
    int (*agree)(tks_comm *c, int rc);
    /* host bytes from root to every member (control data: error contexts, flags) */
    int (*broadcast_bytes)(tks_comm *c, void *buf, size_t bytes, int root);
} tks_comm_transport;

struct tks_comm {
    int size;          /* members in the group */
    int rank;          /* this process's position in the group, 0..size-1 */
    const int *members;/* world ranks of the members, in group order (size entries) */
    void *ctx;
    const tks_comm_transport *t; /* the transport's calls: c->t->start(c, ...) */
    /* payload bytes handed to each kind of collective so far (for the benchmark):
     * TKS_COLL_ALLREDUCE, _REDUCE_SCATTER (input bytes), _ALLGATHER (output
     * bytes), _BROADCAST */
    uint64_t bytes[4];
    uint64_t calls[4];
};

/* One collective, blocking: c->t->start, then c->t->wait on its handle. */
int tks_comm_run(tks_comm *c, const tks_coll *op);

/* The blocking fp32 forms (tks_comm_run), for the model's few tp
 * collectives: allreduce (sum or max) in place on buf[n];
 * out[n] = sum over members of their in[rank*n .. rank*n + n) (in has
 * size*n); out[size*n] = every member's in[n] in rank order; buf[n] from
 * root to every member. */
int tks_comm_allreduce_sum(tks_comm *c, float *buf, size_t n);
int tks_comm_allreduce_max(tks_comm *c, float *buf, size_t n);
int tks_comm_reduce_scatter_sum(tks_comm *c, float *out, const float *in, size_t n);
int tks_comm_allgather(tks_comm *c, float *out, const float *in, size_t n);
int tks_comm_broadcast(tks_comm *c, float *buf, size_t n, int root);

/* Makes c a group of transport t, with `members` (size entries, borrowed:
 * the transport keeps them alive) and `ctx`. The caller sets size and
 * rank. */
void tks_comm_init(tks_comm *c, const tks_comm_transport *t, const int *members, void *ctx);

/* The MPI transport (comm_mpi.c): MPI_COMM_WORLD when color < 0, else the
 * group of this rank's color in MPI_Comm_split(MPI_COMM_WORLD, color, key).
 * Collective over the world (MPI initialized). members[] are world ranks,
 * gathered over the new communicator. Errors: TKS_ERR_IO (MPI, with its
 * message), TKS_ERR_NOMEM. Freed by tks_comm_mpi_free (frees the split
 * communicator; NULL is a no-op). */
int tks_comm_mpi_split(int color, int key, tks_comm **out);
void tks_comm_mpi_free(tks_comm *c);

/* The staged transport (comm_staged.c): the group of `ctrl` (an MPI group,
 * host memory; borrowed, outlives the result) moving device buffers of `be`
 * through host memory: start downloads, runs the collective on ctrl to
 * completion and uploads (blocking). NULL when out of memory. Freed by
 * tks_comm_staged_free (NULL is a no-op). */
tks_comm *tks_comm_staged_new(tks_comm *ctrl, tks_backend *be);
void tks_comm_staged_free(tks_comm *c);

/* The group of one process: every collective is the identity (reduce_scatter
 * and out-of-place allgather copy in to out with `copy`, the backend's
 * device-to-device copy; NULL = memcpy, for host buffers). Static storage:
 * tks_comm_self_set_copy changes it for every user. */
tks_comm *tks_comm_self(void);
void tks_comm_self_set_copy(void (*copy)(void *ctx, void *dst, const void *src, size_t bytes),
                            void *ctx);

/* Chunking of size_t counts for a transport with int counts: the largest
 * piece, INT_MAX unless lowered for tests (TOKSHARD_TEST_COMM_CHUNK=N, read
 * once). */
size_t tks_comm_chunk_max(void);

/* Piece k of n elements cut into pieces of at most max: its first element
 * and count; returns the number of pieces (ceil(n / max), 0 for n == 0).
 * Pure: counts above 2^31 are tested without allocating them. */
size_t tks_comm_chunks(size_t n, size_t max, size_t k, size_t *first, size_t *count);

/* Makes an error on any member an error on every member: each passes its rc;
 * the error context of the lowest failing member is copied to all (so every
 * rank reports the same message). A control collective that never touches
 * device buffers: call it on every path, before any data collective that
 * depends on a member-local check. Returns that rc (0 when none failed). */
int tks_comm_agree(tks_comm *c, int rc);

/* Sums n HOST floats over the group (control data such as validation loss
 * sums, which no implementation may treat as device memory): gathered to
 * member 0 in rank order, added there in double in that order, rounded and
 * sent back to every member, so the result is the same bits on every member
 * and every run. Collective over the group. */
int tks_comm_host_sum(tks_comm *c, float *v, size_t n);

#endif /* TKS_COMM_H */
