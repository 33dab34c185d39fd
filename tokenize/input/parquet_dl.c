/* parquet_dl.c - tokenize/parquet.h in a build with Parquet support: the
 * reader itself (parquet.cc, over Apache Arrow's C++ libraries from the
 * pyarrow wheel) is built as a module of its own, tokshard-parquet.so, and
 * loaded at the first Parquet input. Linked into every program, Arrow and
 * Parquet cost each process 7 ms at start (their relocations and static
 * initializers), whatever it then read: a quarter of a small build's time.
 *
 * The module is looked for beside the running program (where the build puts
 * it, and where a copy of the programs must carry it), then at the path the
 * build wrote it to. It calls tks_fail of the program that loads it (the
 * programs export that one symbol), so its errors are the program's last
 * error like any other. A module that cannot be loaded makes every Parquet
 * input an error that says where it was looked for and why it failed. */
#define _GNU_SOURCE /* readlink, dlopen */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/tks.h"
#include "tokenize/input/parquet.h"

#ifndef TKS_PARQUET_MODULE
#error "TKS_PARQUET_MODULE (the module's path in the build) is set by cmake/parquet.cmake"
#endif
#define MODULE_NAME "tokshard-parquet.so"

static struct {
    const char *(*version)(void);
    int (*open)(const char *, const char *, tks_pq **);
    size_t (*n_groups)(const tks_pq *);
    const tks_pq_group *(*groups)(const tks_pq *);
    int (*start)(tks_pq *, size_t);
    int (*next)(tks_pq *, const char **, size_t *, int *);
    void (*close)(tks_pq *);
} g;
static int g_ok;
static char g_why[PATH_MAX * 2 + 512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *try_open(const char *path, char *why, size_t cap) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t n = strlen(why);
        snprintf(why + n, cap - n, "%s%s", n ? "; " : "", e ? e : path);
    }
    return h;
}

static void load(void) {
    char beside[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 1);
    void *h = NULL;
    const char *from = TKS_PARQUET_MODULE;
    g_why[0] = 0;
    if (n > 0) {
        beside[n] = 0;
        char *slash = strrchr(beside, '/');
        if (slash && (size_t)(slash + 1 - beside) + sizeof MODULE_NAME <= sizeof beside) {
            memcpy(slash + 1, MODULE_NAME, sizeof MODULE_NAME);
            if (access(beside, F_OK) == 0 && (h = try_open(beside, g_why, sizeof g_why))) from = beside;
        }
    }
    if (!h) h = try_open(TKS_PARQUET_MODULE, g_why, sizeof g_why);
    if (!h) return;
#define SYM(field, name)                                                                            \
    if (!(*(void **)&g.field = dlsym(h, name))) {                                                   \
        snprintf(g_why, sizeof g_why, "%s has no %s (a module from another tokshard?)", from, name);     \
        return;                                                                                     \
    }
    SYM(version, "tks_pq_version")
    SYM(open, "tks_pq_open")
    SYM(n_groups, "tks_pq_n_groups")
    SYM(groups, "tks_pq_groups")
    SYM(start, "tks_pq_start")
    SYM(next, "tks_pq_next")
    SYM(close, "tks_pq_close")
#undef SYM
    g_ok = 1;
}

static int loaded(void) {
    pthread_once(&g_once, load);
    return g_ok;
}

int tks_pq_available(void) { return loaded(); }

const char *tks_pq_version(void) { return loaded() ? g.version() : ""; }

int tks_pq_open(const char *path, const char *column, tks_pq **out) {
    *out = NULL;
    if (!loaded())
        return tks_fail(TKS_ERR_INPUT, path, TKS_NONE, TKS_NONE,
                        "%s is a Parquet file and tokshard's Parquet reader (%s, beside the tokshard "
                        "programs) could not be loaded: %s. Build again (cmake --build) so that it is "
                        "there, or copy it with the programs",
                        path, MODULE_NAME, g_why);
    return g.open(path, column, out);
}

/* The functions below take a handle, which only tks_pq_open (with the module
 * loaded) gives. */
size_t tks_pq_n_groups(const tks_pq *p) { return g.n_groups(p); }
const tks_pq_group *tks_pq_groups(const tks_pq *p) { return g.groups(p); }
int tks_pq_start(tks_pq *p, size_t gr) { return g.start(p, gr); }
int tks_pq_next(tks_pq *p, const char **s, size_t *n, int *is_null) { return g.next(p, s, n, is_null); }
void tks_pq_close(tks_pq *p) {
    if (p) g.close(p);
}
