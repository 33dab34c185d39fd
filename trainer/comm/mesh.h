/*
 * mesh.h - the parallel layout: world = dp_replicate x dp_shard x tp, tp
 * varying fastest (a tp group is contiguous ranks, so it fits in one node).
 * Private to trainer/ (tools reach it through trainer.h: tks_train_check_mesh). docs/PARALLELISM.md.
 *
 *   world rank r:  tp_rank = r % tp
 *                  shard   = (r / tp) % dp_shard
 *                  rep     = r / (tp * dp_shard)
 *   data-parallel rank = rep * dp_shard + shard, of dp = dp_replicate * dp_shard
 *
 * Groups (each a tks_comm): tp (same rep, shard), dp_shard (same rep, tp_rank),
 * dp_replicate (same shard, tp_rank), dp (same tp_rank), world.
 * Planning is pure (no MPI); tks_mesh_create builds the communicators and then
 * checks every group's real size and members against the plan (docs/MOTIVATION.md,
 * failure 3: a layout silently replaced by another).
 */
#ifndef TKS_MESH_H
#define TKS_MESH_H

#include <stddef.h>

#include "trainer/comm/comm.h"

typedef struct tks_mesh_shape {
    int dp_replicate, dp_shard, tp;
} tks_mesh_shape;

typedef enum {
    TKS_GROUP_TP = 0, TKS_GROUP_DP_SHARD, TKS_GROUP_DP_REPLICATE, TKS_GROUP_DP, TKS_GROUP_WORLD,
    TKS_N_GROUPS
} tks_group_kind;

/* "tp", "dp_shard", "dp_replicate", "dp", "world" */
const char *tks_group_name(tks_group_kind k);

/*
 * Resolves and validates a layout for `world` processes. tp, dp_shard,
 * dp_replicate: 0 = not given (tp 1, dp_replicate 1, dp_shard = what is left
 * of the world). Errors (TKS_ERR_ARG) name the numbers and the fix: a degree
 * below 1, a product different from the world size, a world that the given
 * degrees do not divide.
 */
int tks_mesh_resolve(int world, int tp, int dp_shard, int dp_replicate, tks_mesh_shape *out);

/* Coordinates of world rank r. */
void tks_mesh_coords(const tks_mesh_shape *s, int r, int *rep, int *shard, int *tp_rank);

/* The planned members (world ranks, in group order) of rank r's group of kind
 * k; returns the group size. members needs room for the world size. */
int tks_mesh_plan_group(const tks_mesh_shape *s, int r, tks_group_kind k, int *members);

/* Human-readable plan: the shape, every rank's coordinates and every group's
 * members (malloc'd; the caller frees). */
char *tks_mesh_describe(const tks_mesh_shape *s);

typedef struct tks_mesh {
    tks_mesh_shape shape;
    int world, rank;
    int rep, shard, tp_rank;
    int dp, dp_rank;
    tks_comm *group[TKS_N_GROUPS];
    int mpi;                 /* 1 when the groups are MPI communicators */
    /* after tks_mesh_use_backend (mesh.c): what group[] now holds, and
     * the MPI groups underneath it (control collectives; NULL before) */
    int dev_kind;            /* TKS_MESH_DEV_* */
    tks_comm *ctrl[TKS_N_GROUPS];
    const tks_backend_kind *dev_comm; /* whose collectives group[] holds (DEV_BACKEND) */
    void *dev_world;         /* that kind's world communicator */
} tks_mesh;

/* What a mesh's groups are on its backend: the MPI groups themselves, the
 * backend kind's own collectives (NCCL for cuda), or MPI staged through host
 * memory. */
enum { TKS_MESH_DEV_NONE = 0, TKS_MESH_DEV_BACKEND = 1, TKS_MESH_DEV_STAGED = 2 };

/*
 * Creates the mesh for this process: with MPI when the process was started by
 * mpirun (MPI is initialized here if needed), else the one-process mesh (the
 * shape must then be 1 x 1 x 1). Then verifies every group against the plan:
 * size and members, in order; a difference is TKS_ERR_ARG with both lists.
 * Collective over the world. The mesh is owned by the caller (tks_mesh_free).
 */
int tks_mesh_create(const tks_mesh_shape *s, tks_mesh **out);
void tks_mesh_free(tks_mesh *m);

/*
 * The mesh's groups on the backend `be` (mesh.c; comm_staged.c), chosen by `comm`
 * (--comm: "auto" or NULL, "mpi", "nccl"):
 *   - CPU backend: the MPI groups as they are (auto, mpi); nccl is refused.
 *   - CUDA backend under mpirun: auto and nccl make every group an NCCL
 *     communicator (the kind's comm_world_create, then comm_group_create per
 *     group, each checked member by member against the MPI group, itself checked
 *     against the plan); mpi keeps MPI and moves device buffers through host
 *     memory (blocking, no overlap; for machines where NCCL cannot run).
 *   - One process: nothing changes (no collective moves data).
 * The MPI groups stay as ctrl[] for agreement, gathers and launch. Collective
 * over the world: every rank calls it with its rc so far (the ranks agree on
 * it first, so a backend that failed on one rank stops all). Returns the
 * agreed rc: TKS_ERR_ARG (a --comm value, nccl without CUDA, a group that is
 * not the planned one), TKS_ERR_IO (NCCL), TKS_ERR_NOMEM. On error the mesh
 * keeps its MPI groups. Undone by tks_mesh_free (call it before destroying be).
 */
int tks_mesh_use_backend(tks_mesh *m, tks_backend *be, const char *comm, int rc);

/* The rule of tks_mesh_use_backend without building anything (--dry-run):
 * *kind = TKS_MESH_DEV_* for `world` processes on a backend of kind
 * `backend` (NULL: cpu). Errors as above (TKS_ERR_ARG). */
int tks_mesh_comm_resolve(const char *comm, const tks_backend_kind *backend, int world, int *kind);

/* tks_mesh_comm_name for a resolved kind, before any mesh exists. */
const char *tks_mesh_comm_kind_name(int kind, const tks_backend_kind *backend, int world);

/* "nccl", "mpi (staged through host memory)", "mpi" or "none (one process)". */
const char *tks_mesh_comm_name(const tks_mesh *m);

/* Frees what tks_mesh_use_backend built and puts the MPI groups back
 * (tks_mesh_free calls it). */
void tks_mesh_device_free(tks_mesh *m);

/* The world size and rank of this process as the launcher started it
 * (1 and 0 without mpirun). Initializes MPI when launched by mpirun. */
int tks_mesh_world(int *world, int *rank);

/* Finalizes MPI if tks_mesh_world initialized it. Call once at exit. */
void tks_mesh_finalize(void);

/* After a step, makes an error on any rank an error on every rank: every rank
 * passes its own rc (0 or a TKS_ERR_*); the error context of the lowest
 * failing world rank is copied to all, so every rank reports the same message.
 * Returns that rc (0 when no rank failed). */
int tks_mesh_agree(tks_mesh *m, int rc);

/* The same over every process mpirun started, before a mesh exists (a
 * dataset or checkpoint that fails to open on one rank only must not leave
 * the others building communicators). The identity without mpirun. */
int tks_mesh_world_agree(int rc);

/* Do all processes mpirun started hold the same n values h[0..n)? Collective
 * over the world, before a mesh exists; every rank passes the same n. Returns
 * 0 when they agree (and without mpirun); otherwise 1 with *field the first
 * index where some rank differs from rank 0, *rank the lowest such rank and
 * *others how many more differ there. Errors: none (MPI aborts on failure). */
int tks_mesh_world_same(const uint64_t *h, size_t n, size_t *field, int *rank, int *others);

/* Sums n values elementwise over every process mpirun started, in place on
 * every rank (in chunks of at most 2^30 values). Collective over the world;
 * the identity without mpirun. Errors: none (MPI aborts on failure). */
int tks_mesh_world_sum_u64(uint64_t *v, size_t n);

/* Gathers `len` bytes from every process mpirun started into all[rank * len]
 * (all: world * len bytes, caller-owned). Collective over the world; a copy
 * without mpirun. */
void tks_mesh_world_gather(const void *mine, size_t len, void *all);

/*
 * Gradient synchronisation in buckets that starts during the backward
 * (overlap of communication with computation). The tp-local flat gradient
 * buffer g[n_flat] ends reduce-scattered over dp_shard (member d keeps the
 * sum of slice [d*ns, (d+1)*ns), ns = n_flat / dp_shard, in place in g) and
 * all-reduced over dp_replicate (the sums of a blocking reduce_scatter_sum
 * and allreduce_sum; tks_train's step uses this). Buckets cut every slice alike: bucket b is slice-relative
 * [b*B, min((b+1)*B, ns)) of each of the dp_shard slices, and its
 * reduce-scatter starts as soon as all of those elements are reported final.
 *
 * The hook for the model: tks_grad_sync_ready(s, begin, end) when
 * g[begin, end) holds this step's final gradient (in the backward, after a
 * layer's weight gradients are complete, in the last micro-batch only); each
 * element at most once per step. Buckets not reported by then start in
 * tks_grad_sync_end, so a backward without the hook is still correct.
 * Memory: a staging buffer of n_flat elements when dp_shard > 1 (the
 * reduce-scatter input of each bucket is packed there): `stage`, a device
 * buffer the caller owns, or NULL to have one malloc'd (host buffers). `copy`
 * is the backend's device copy (NULL: memcpy, host buffers).
 *
 * Every member must start the same buckets in the same order: the members
 * report the same ranges in the same order (the same model code), and a step
 * that failed before its backward still calls tks_grad_sync_end, which then
 * starts every bucket in bucket order on every member.
 */
typedef struct tks_grad_sync tks_grad_sync;

int tks_grad_sync_create(tks_mesh *m, float *grads, size_t n_flat, size_t bucket_elems,
                         float *stage, void (*copy)(void *ctx, void *dst, const void *src, size_t bytes),
                         void *copy_ctx, tks_grad_sync **out);
void tks_grad_sync_free(tks_grad_sync *s);
/* Arms a step: nothing reported yet. */
void tks_grad_sync_begin(tks_grad_sync *s);
/* g[begin, end) is final: starts every bucket this completes. */
int tks_grad_sync_ready(tks_grad_sync *s, size_t begin, size_t end);
/* The same as a callback for the model's backward: ctx is the tks_grad_sync.
 * Matches tks_grads_ready_fn, the type a model takes for its hook. */
typedef int (*tks_grads_ready_fn)(void *ctx, size_t begin, size_t end);
int tks_grad_sync_hook(void *ctx, size_t begin, size_t end);
/* Starts what is left, waits for every bucket and the dp_replicate
 * all-reduce; then g[dp_shard_rank*ns, +ns) holds the synchronised slice. */
int tks_grad_sync_end(tks_grad_sync *s);
/* Buckets whose reduce-scatter was started from tks_grad_sync_ready (before
 * tks_grad_sync_end) in the last step: the overlap actually obtained. */
size_t tks_grad_sync_started_early(const tks_grad_sync *s);

#endif
