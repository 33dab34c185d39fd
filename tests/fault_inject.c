/*
 * fault_inject.c - a test-side fault injector, loaded with LD_PRELOAD into an
 * unmodified tokshard process: it wraps rename(), renameat() and fsync() and raises
 * SIGKILL at the point TKS_FAULT_KILL names, so the library itself carries no
 * test hook. Points:
 *   shard:K  right after shard-K.tks is renamed into place (published, not yet
 *            recorded in the build state)
 *   fsync:K  at the K-th fsync() of the process, before it runs (a temporary
 *            file written but neither durable nor renamed)
 *   shards:K right after the K-th shard rename of this process (any shard-*.tks,
 *            a work unit's own numbering included)
 *   rename:NAME:K  right after the K-th rename() whose destination's base name
 *            is NAME (a checkpoint's step directory, a file inside it, ...)
 *   unlink:NAME:K  right after the K-th unlink() of a path whose base name is
 *            NAME (a state file removed, a unit's record cleaned)
 * With TKS_FAULT_RANK=R set, only the MPI rank R (OMPI_COMM_WORLD_RANK or
 * PMI_RANK) of a job is killed.
 * And TKS_COUNT_OPEN=NAME counts the open() calls of paths ending in NAME and
 * prints "fault_inject: N open(s) of NAME" to stderr at exit (an input must be
 * read once).
 * And TKS_FAULT_OCCUPY=NAME makes, just before the first rename() whose
 * destination's base name is NAME, a directory there holding one file: the
 * rename fails as it does when someone created that path meanwhile (an OUT
 * made while its build ran).
 * And TKS_FAULT_TRUNCATE=NAME:BYTES cuts the first file whose path ends in
 * NAME to BYTES when it is opened for reading (after the build listed its
 * size): an input truncated while a build reads it.
 * Under AddressSanitizer, set ASAN_OPTIONS=verify_asan_link_order=0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long n_fsync;
static long n_named;
static long n_shards;

/* TKS_FAULT_RANK, when set, names the one MPI rank to kill */
static int rank_wanted(void) {
    const char *want = getenv("TKS_FAULT_RANK");
    if (!want) return 1;
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMI_RANK");
    return r && strtol(r, NULL, 10) == strtol(want, NULL, 10);
}

/* Does TKS_FAULT_KILL equal "kind:k"? */
static int wants(const char *kind, long k) {
    const char *v = getenv("TKS_FAULT_KILL");
    size_t n = strlen(kind);
    return v && strncmp(v, kind, n) == 0 && v[n] == ':' && strtol(v + n + 1, NULL, 10) == k;
}

/* The base name of a path. */
static const char *base_of(const char *path) {
    const char *base = strrchr(path, '/');
    return base ? base + 1 : path;
}

/* TKS_FAULT_OCCUPY: the destination `to` made a non-empty directory, once. */
static void occupy(const char *to) {
    static int done;
    const char *want = getenv("TKS_FAULT_OCCUPY");
    if (done || !want || strcmp(base_of(to), want) != 0) return;
    done = 1;
    char file[4200];
    snprintf(file, sizeof file, "%s/someone-else.txt", to);
    int fd = mkdir(to, 0755) == 0 ? open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    if (fd < 0) perror("fault_inject: occupy");
    else close(fd);
}

int unlink(const char *path) {
    int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    int rc = real(path);
    const char *v = getenv("TKS_FAULT_KILL");
    if (rc != 0 || !v || strncmp(v, "unlink:", 7) != 0 || !rank_wanted()) return rc;
    static long n_unlinked;
    const char *name = v + 7, *colon = strrchr(name, ':'), *base = base_of(path);
    if (colon && (size_t)(colon - name) == strlen(base) && !strncmp(name, base, strlen(base)) &&
        ++n_unlinked == strtol(colon + 1, NULL, 10))
        raise(SIGKILL);
    return rc;
}

/* After a rename to `to` that returned rc: the kill, when it is due. */
static int renamed(int rc, const char *to) {
    const char *v = getenv("TKS_FAULT_KILL");
    if (rc != 0 || !v || !rank_wanted()) return rc;
    const char *base = strrchr(to, '/');
    base = base ? base + 1 : to;
    unsigned idx;
    char tail[8];
    if (sscanf(base, "shard-%5u.tks%7s", &idx, tail) == 1) {
        if (wants("shard", idx) || wants("shards", ++n_shards)) raise(SIGKILL);
    } else if (!strncmp(v, "rename:", 7)) {
        const char *name = v + 7, *colon = strrchr(name, ':');
        if (colon && (size_t)(colon - name) == strlen(base) && !strncmp(name, base, strlen(base)) &&
            ++n_named == strtol(colon + 1, NULL, 10))
            raise(SIGKILL);
    }
    return rc;
}

int rename(const char *from, const char *to) {
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    occupy(to);
    return renamed(real(from, to), to);
}

/* (the crash-safe writes rename relative to a directory: tks_write_file_at) */
int renameat(int from_dir, const char *from, int to_dir, const char *to) {
    int (*real)(int, const char *, int, const char *) =
        (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
    return renamed(real(from_dir, from, to_dir, to), to);
}

int fsync(int fd) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (wants("fsync", ++n_fsync)) raise(SIGKILL);
    return real(fd);
}

static long n_opens;
static void report_opens(void) {
    fprintf(stderr, "fault_inject: %ld open(s) of %s\n", n_opens, getenv("TKS_COUNT_OPEN"));
}

int open(const char *path, int flags, ...) {
    int (*real)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    const char *cut = getenv("TKS_FAULT_TRUNCATE"), *colon = cut ? strrchr(cut, ':') : NULL;
    static int cut_done;
    if (colon && !cut_done && (flags & O_ACCMODE) == O_RDONLY) {
        size_t cn = (size_t)(colon - cut), pl = strlen(path);
        if (pl >= cn && !strncmp(path + pl - cn, cut, cn)) {
            cut_done = 1;
            if (truncate(path, (off_t)strtoll(colon + 1, NULL, 10)) != 0) perror("fault_inject: truncate");
        }
    }
    const char *want = getenv("TKS_COUNT_OPEN");
    size_t n = want ? strlen(want) : 0, l = strlen(path);
    if (want && l >= n && !strcmp(path + l - n, want) && n_opens++ == 0) atexit(report_opens);
    return real(path, flags, mode);
}
