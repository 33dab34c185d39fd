/* dist_none.c - the single-process side of dist.h, linked into `tokshard`. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dist.h"

static long env_long(const char *name) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : -1;
}

int tks_dist_launched_many(void) {
    long n = env_long("OMPI_COMM_WORLD_SIZE");
    if (n < 0) n = env_long("PMI_SIZE");
    if (n < 0 && getenv("PMIX_RANK")) n = env_long("SLURM_NTASKS");
    return n > 1;
}

int tks_dist_reexec(char **argv) {
    char self[PATH_MAX], mpi[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "tokshard: started by mpirun with several processes, but /proc/self/exe is "
                        "unreadable (%s): run tokshard-mpi instead of tokshard\n", strerror(errno));
        return EXIT_USAGE;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(mpi, sizeof mpi, "%s/tokshard-mpi", self);
    argv[0] = mpi;
    execv(mpi, argv);
    fprintf(stderr, "tokshard: started by mpirun with several processes, which needs %s (the MPI "
                    "build of tokshard, built and installed with it): %s. Build it (cmake --build), "
                    "or run the command without mpirun\n", mpi, strerror(errno));
    return EXIT_USAGE;
}

int tks_dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank) {
    *rank = 0;
    return tks_audit(path, opts, out);
}

int tks_dist_finish(int rc) { return rc; }
