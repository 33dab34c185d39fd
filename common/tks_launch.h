/*
 * tks_launch.h - what a launcher told this process, read from the
 * environment alone (no MPI call, so the programs that do not link MPI use
 * it too).
 */
#ifndef TKS_LAUNCH_H
#define TKS_LAUNCH_H

#include <stdlib.h>

#include "common/tks.h"

/*
 * A Slurm step of several tasks whose processes MPI does not join:
 * `srun -n N` without a PMI plugin (`--mpi=none`, or a slurm.conf without
 * MpiDefault=pmix) starts N processes that each see no launcher variable
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK), so each would run the whole
 * job alone: N builds racing for one output, N trainers each with the full
 * global batch. SLURM_STEP_NUM_TASKS is set by srun for the tasks of a step
 * (not in a batch script's own shell, not by mpirun).
 * Returns N, the step's task count, when this process is one of N > 1 such
 * tasks; else 0.
 */
static inline long tks_launch_unconnected(void) {
    const char *n = getenv("SLURM_STEP_NUM_TASKS");
    long tasks = n ? strtol(n, NULL, 10) : 0;
    if (tasks <= 1) return 0;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) return 0;
    return tasks;
}

/* tks_launch_unconnected() as an error: returns 0, or TKS_ERR_ARG with a
 * message naming the fix. */
static inline int tks_launch_check(void) {
    long tasks = tks_launch_unconnected();
    if (!tasks) return 0;
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "srun started %ld tasks (SLURM_STEP_NUM_TASKS) but MPI does not connect "
                    "them: each would run the whole job alone. Launch with `srun --mpi=pmix` "
                    "(or set MpiDefault=pmix in slurm.conf), or with one task (srun -n 1)",
                    tasks);
}

#endif
