/* dist.h - tokshard commands across processes (mpirun, srun).
 *
 * MPI is used only when an MPI launcher started this process as one of
 * several (OMPI_COMM_WORLD_SIZE, PMI_SIZE, or PMIX_RANK with SLURM_NTASKS above
 * 1); otherwise every call below is the single-process case and MPI is never
 * initialized. */
#ifndef TKS_TOOLS_DIST_H
#define TKS_TOOLS_DIST_H

#include <stdlib.h>

#include "dataset/dataset.h"
#include "tokenize/tokenize.h"

/* 1 when an MPI launcher started this process as one of several (the
 * environment variables above); needs no MPI library. */
static inline int dist_launched_many(void) {
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v || !*v) v = getenv("PMI_SIZE");
    if ((!v || !*v) && getenv("PMIX_RANK")) v = getenv("SLURM_NTASKS");
    return v && *v && strtol(v, NULL, 10) > 1;
}

/* Audits path with this process's share of the shards and, on rank 0, returns
 * the merged report of all ranks in *out (NULL on the other ranks); *rank is
 * this process's rank (0 without MPI). Returns 0, or the library error code of
 * this rank (or TKS_ERR_IO when another rank failed), with the error recorded. */
int dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank);

/* tks_audit_source of path: without a launcher in this process; under
 * mpirun/srun every rank takes its run of the sample (rank 0's seed, sent to
 * all), and rank 0 gets the merged report in *out (NULL on the other ranks)
 * and the summed counts in *st. Returns as dist_audit. */
int dist_audit_source(const char *path, tks_source_audit_opts *o, tks_audit_report **out,
                      tks_source_audit_stats *st, int *rank);

/* Builds a dataset: tks_build without a launcher; under mpirun/srun,
 * tks_build_spread over MPI's world: rank 0 lists the inputs and every rank
 * plans the same work units from the listing, takes them one by one from a
 * counter in rank 0's MPI window (MPI_Fetch_and_op: no rank answers
 * another), places its own units' shards once a prefix sum of the units'
 * shard counts gives their indices, and rank 0 writes the manifest and
 * publishes OUT (docs/SCALE.md). A failed rank prints its error, naming
 * itself and the unit, and aborts the job; a killed rank makes the launcher
 * stop the job, every rank prints the unit it was building, and
 * OUT.partial/in-flight/ keeps those lines (a --resume prints them).
 * progress: NULL, or rank 0's report under mpirun, every 2 s (opts->progress
 * and opts->stop serve the single process only). Returns as dist_audit;
 * *stats is filled on rank 0. */
int dist_build(const tks_build_opts *opts, void (*progress)(const tks_build_world_progress *p, void *ctx),
               tks_build_stats *stats, int *rank);

/* This process's rank (MPI started if needed), or 0 without a launcher. */
int dist_rank(void);

/* The exit code every process returns: the largest rc of all ranks. Ends MPI
 * if dist_audit, dist_build or dist_rank started it. */
int dist_finish(int rc);

#endif
