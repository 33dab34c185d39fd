/*
 * mesh.h - the parallel layout: world = dp_replicate x dp_shard x tp, tp
 * varying fastest (a tp group is contiguous ranks, so it fits in one node).
 * Part of the trainer's API (trainer.h includes it). docs/PARALLELISM.md.
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

#include "comm.h"

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
} tks_mesh;

/*
 * Creates the mesh for this process: with MPI when the process was started by
 * mpirun (MPI is initialized here if needed), else the one-process mesh (the
 * shape must then be 1 x 1 x 1). Then verifies every group against the plan:
 * size and members, in order; a difference is TKS_ERR_ARG with both lists.
 * Collective over the world. The mesh is owned by the caller (tks_mesh_free).
 */
int tks_mesh_create(const tks_mesh_shape *s, tks_mesh **out);
void tks_mesh_free(tks_mesh *m);

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

#endif
