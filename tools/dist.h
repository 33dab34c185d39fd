/* dist.h - tokshard commands across processes (mpirun, srun).
 *
 * `tokshard` itself does not link MPI, so that every single-process command
 * starts without loading it. Started by mpirun/srun with more than one process,
 * `tokshard audit` replaces itself with `tokshard-mpi` (the same program built
 * with dist_mpi.c, installed next to it), whose ranks split the work and merge
 * the results on rank 0. In `tokshard`, dist_none.c makes every call below the
 * single-process case. */
#ifndef TKS_TOOLS_DIST_H
#define TKS_TOOLS_DIST_H

#include "dataset/dataset.h"

/* 1 when the environment says an MPI launcher started this process as one of
 * several (OMPI_COMM_WORLD_SIZE, PMI_SIZE, or PMIX_RANK with SLURM_NTASKS). */
int tks_dist_launched_many(void);

/* In `tokshard`: execs tokshard-mpi from the same directory with the same
 * arguments. Returns only on failure, after printing why: EXIT_USAGE. */
int tks_dist_reexec(char **argv);

/* Audits path with this process's share of the shards and, on rank 0, returns
 * the merged report of all ranks in *out (NULL on the other ranks); *rank is
 * this process's rank (0 without MPI). Returns 0, or the library error code of
 * this rank (or TKS_ERR_IO when another rank failed), with the error recorded. */
int tks_dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank);

/* The exit code every process returns: the largest rc of all ranks. Ends MPI. */
int tks_dist_finish(int rc);

#endif
