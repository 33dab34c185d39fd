/*
 * tks_mpi.h - MPI start-up shared by the trainer (trainer/comm/mesh.c) and the
 * distributed tools (tools/dist_mpi.c). Include only where MPI is linked.
 */
#ifndef TKS_MPI_H
#define TKS_MPI_H

#include <mpi.h>

#include "common/tks.h"
#include "common/tks_launch.h"

/*
 * Initializes MPI unless it already is, asking for MPI_THREAD_FUNNELED: the
 * OpenMP workers, the build's reader thread and the trainer's batch
 * prefetch thread make no MPI call, only the thread that initialized MPI
 * does (the thread levels of MPI_Init_thread in the MPI standard). Sets
 * *inited_here to 1 when this call initialized MPI (the caller then
 * finalizes it).
 * The thread level is checked on every call, not only the first: a first
 * caller may drop the error, and MPI may have been initialized elsewhere.
 * Returns 0, or TKS_ERR_IO with a message that says what to do.
 */
static inline int tks_mpi_start(int *inited_here) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                            "MPI_Init_thread failed: check the mpirun/srun command and the MPI "
                            "installation");
        *inited_here = 1;
    }
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_FUNNELED)
        return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                        "this MPI library does not support MPI_THREAD_FUNNELED (threads that "
                        "make no MPI calls beside the one that does): use an MPI built with "
                        "thread support, such as Debian's OpenMPI");
    return 0;
}

#endif
