/* dist_mpi.c - dist.h: tokshard commands across MPI ranks. The libraries
 * spread the work (tks_audit_spread, dataset.h; tks_build_spread,
 * tokenize.h); this file gives them MPI's world as their collectives, and
 * the shared hand-out counter and progress slots as an MPI window in rank
 * 0's memory (MPI_Fetch_and_op, MPI_Accumulate, MPI_Get_accumulate: no rank
 * answers another), and prints what the ranks report. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sigaction */
#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks_mpi.h"
#include "tools/cli.h"
#include "tools/dist.h"

/* MPI's world as the libraries' ctx. */
typedef struct mpi_world {
    int rank, size;
    MPI_Win win;
    uint64_t *wmem; /* rank 0: the window's memory */
} mpi_world;

static int g_inited_here = 0;
static mpi_world g_w;

static int world(int *rank, int *size) {
    int rc = tks_mpi_start(&g_inited_here);
    if (rc) return rc;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    g_w.rank = *rank, g_w.size = *size;
    return 0;
}

int dist_rank(void) {
    int rank = 0, size = 1;
    return dist_launched_many() && world(&rank, &size) != 0 ? 0 : rank;
}

/* Waits for a request without spinning: OpenMPI's blocking calls poll at
 * 100% CPU, which takes a core from the ranks still tokenizing. wait(arg),
 * when set, is called at each look. Returns 0. */
static int wait_quietly(MPI_Request *rq, void (*wait)(void *arg), void *arg) {
    struct timespec ts = {0, 1000000}; /* 1 ms */
    for (int done = 0;; nanosleep(&ts, NULL)) {
        MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (done) return 0;
        if (wait) wait(arg);
    }
}

/* What MPI cannot carry (counts are int) or memory that is missing ends the job. */
static void need(int ok) {
    if (!ok) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
}

static int c_bcast(void *p, size_t n, void *ctx) {
    (void)ctx;
    MPI_Request rq;
    for (size_t at = 0, chunk; at < n; at += chunk) {
        chunk = n - at > (1u << 30) ? 1u << 30 : n - at;
        MPI_Ibcast((char *)p + at, (int)chunk, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
        wait_quietly(&rq, NULL, NULL);
    }
    return 0;
}

/* Every rank's bytes, back to back, on rank 0. */
static int c_gather(const void *mine, size_t n, void **all, size_t *len, void *ctx) {
    const mpi_world *m = ctx;
    int my = (int)n, *lens = calloc((size_t)m->size, sizeof *lens), *displs = calloc((size_t)m->size, sizeof *displs);
    need(n <= INT_MAX && lens && displs);
    MPI_Request rq;
    MPI_Igather(&my, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq, NULL, NULL);
    size_t total = 0;
    for (int r = 0; m->rank == 0 && r < m->size; r++) {
        displs[r] = (int)total;
        total += (size_t)lens[r];
    }
    *all = m->rank == 0 ? malloc(total ? total : 1) : NULL;
    need(total <= INT_MAX && (m->rank || *all));
    MPI_Igatherv(mine, my, MPI_BYTE, *all, lens, displs, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq, NULL, NULL);
    *len = total;
    free(lens);
    free(displs);
    return 0;
}

static int allreduce(void *v, size_t n, MPI_Datatype t, MPI_Op op) {
    MPI_Request rq;
    need(n <= INT_MAX);
    MPI_Iallreduce(MPI_IN_PLACE, v, (int)n, t, op, MPI_COMM_WORLD, &rq);
    return wait_quietly(&rq, NULL, NULL);
}

static int c_max_int(int *v, size_t n, void *ctx) { (void)ctx; return allreduce(v, n, MPI_INT, MPI_MAX); }
static int c_sum_u64(uint64_t *v, size_t n, void *ctx) { (void)ctx; return allreduce(v, n, MPI_UINT64_T, MPI_SUM); }

static int c_barrier(void (*wait)(void *arg), void *arg, void *ctx) {
    (void)ctx;
    MPI_Request rq;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    return wait_quietly(&rq, wait, arg);
}

/* The shared memory: a window in rank 0's memory, a passive epoch on every
 * rank from open to close. */
static int c_shared_open(size_t n, void *ctx) {
    mpi_world *m = ctx;
    MPI_Aint bytes = m->rank ? 0 : (MPI_Aint)(n * sizeof(uint64_t));
    need(MPI_Win_allocate(bytes, sizeof(uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &m->wmem, &m->win) == MPI_SUCCESS);
    MPI_Win_lock_all(0, m->win);
    if (!m->rank) {
        memset(m->wmem, 0, (size_t)bytes);
        MPI_Win_sync(m->win);
    }
    return c_barrier(NULL, NULL, ctx);
}

/* ctx's one-sided calls, completed. */
static int flushed(const mpi_world *m) {
    MPI_Win_flush(0, m->win);
    return 0;
}

static int c_fetch_add(size_t i, uint64_t v, uint64_t *old, void *ctx) {
    const mpi_world *m = ctx;
    MPI_Fetch_and_op(&v, old, MPI_UINT64_T, 0, (MPI_Aint)i, MPI_SUM, m->win);
    return flushed(m);
}

static int c_put(size_t i, const uint64_t *v, size_t n, void *ctx) {
    const mpi_world *m = ctx;
    MPI_Accumulate(v, (int)n, MPI_UINT64_T, 0, (MPI_Aint)i, (int)n, MPI_UINT64_T, MPI_REPLACE, m->win);
    return flushed(m);
}

static int c_get(size_t i, uint64_t *v, size_t n, void *ctx) {
    const mpi_world *m = ctx;
    MPI_Get_accumulate(NULL, 0, MPI_UINT64_T, v, (int)n, MPI_UINT64_T, 0, (MPI_Aint)i, (int)n, MPI_UINT64_T,
                       MPI_NO_OP, m->win);
    return flushed(m);
}

static void c_shared_close(void *ctx) {
    mpi_world *m = ctx;
    MPI_Win_unlock_all(m->win);
    MPI_Win_free(&m->win);
}

/* A transport that cannot serve another rank's MPI_Fetch_and_op on its own
 * (TCP without RDMA) serves it in a turn of MPI's progress engine. */
static void c_poll(void *ctx) {
    (void)ctx;
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

/* What a rank says when the launcher stops the job (SIGTERM): written with
 * write(2), the message is prepared before each unit. */
static char g_sigmsg[512];
static volatile size_t g_sigmsg_len;

static void on_term(int sig) {
    (void)sig;
    if (g_sigmsg_len && write(STDERR_FILENO, g_sigmsg, g_sigmsg_len) < 0) _exit(EXIT_INTERRUPTED);
    _exit(EXIT_INTERRUPTED);
}

static void c_building(int64_t unit, const char *partial, void *ctx) {
    const mpi_world *m = ctx;
    int n = unit < 0 ? 0 : snprintf(g_sigmsg, sizeof g_sigmsg,
                                    "%s: rank %d stopped by the launcher while building unit %lld; the "
                                    "complete units are kept in %s: re-run the same command with "
                                    "--resume (any number of ranks)\n",
                                    cli_prog, m->rank, (long long)unit, partial);
    g_sigmsg_len = n < 0 ? 0 : (size_t)n < sizeof g_sigmsg ? (size_t)n : sizeof g_sigmsg - 1;
}

/* A failed unit stops the job: the rank says so itself (no rank waits for
 * another's answer), and MPI_Abort ends every rank. */
static void c_fail(int64_t unit, const char *what, const char *partial, void *ctx) {
    const mpi_world *m = ctx;
    if (unit >= 0)
        fprintf(stderr, "%s: error: rank %d failed on unit %lld: %s\n", cli_prog, m->rank, (long long)unit,
                tks_last_error()->message);
    else
        fprintf(stderr, "%s: error: rank %d: %s: %s\n", cli_prog, m->rank, what, tks_last_error()->message);
    fprintf(stderr, "%s: stopping the job; the complete units are kept in %s: fix the cause and "
                    "re-run the same command with --resume\n", cli_prog, partial);
    fflush(stderr);
    g_sigmsg_len = 0;
    MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
}

/* A resumed build: which unit each rank was building when it stopped. */
static void show_note(const char *note, void *arg) {
    if (!(*(int *)arg)++) fprintf(stderr, "%s: resuming; when the interrupted run stopped: units in flight:", cli_prog);
    fprintf(stderr, " %s,", note);
}

static void show_in_flight(const tks_build_opts *o) {
    int shown = 0;
    if (o->resume && tks_build_in_flight(o->out_dir, show_note, &shown)) fprintf(stderr, "\n");
}

int dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank) {
    *out = NULL;
    *rank = 0;
    int size = 1, many = dist_launched_many(), rc = many ? world(rank, &size) : tks_launch_check();
    tks_audit_world w = {.rank = *rank, .size = size, .max_int = c_max_int, .gather = c_gather, .ctx = &g_w};
    return rc ? rc : tks_audit_spread(path, opts, many ? &w : NULL, out);
}

int dist_build(const tks_build_opts *o, void (*progress)(const tks_build_world_progress *p, void *ctx),
               tks_build_stats *stats, int *rank) {
    *rank = 0;
    memset(stats, 0, sizeof *stats);
    int size = 1, many = dist_launched_many(), rc = many ? world(rank, &size) : tks_launch_check();
    if (rc) return rc;
    if (*rank == 0) show_in_flight(o);
    struct sigaction sa = {.sa_handler = on_term};
    if (many) sigaction(SIGTERM, &sa, NULL);
    tks_build_world w = {.rank = *rank, .size = size, .bcast = c_bcast, .gather = c_gather, .max_int = c_max_int,
                         .sum_u64 = c_sum_u64, .barrier = c_barrier, .shared_open = c_shared_open,
                         .fetch_add = c_fetch_add, .put = c_put, .get = c_get, .shared_close = c_shared_close,
                         .poll = c_poll, .progress = progress, .building = c_building, .fail = c_fail, .ctx = &g_w};
    return tks_build_spread(o, many ? &w : NULL, stats);
}

int dist_finish(int rc) {
    int inited = 0, fin = 0, out = rc;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) {
        MPI_Allreduce(&rc, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (g_inited_here) MPI_Finalize();
    }
    return out;
}

/* One rank's part of an audit against the sources, as bytes: its counts,
 * then its report (tks_audit_report_pack). */
static void add_stats(tks_source_audit_stats *a, const tks_source_audit_stats *b) {
    a->checked += b->checked, a->ids_differ += b->ids_differ, a->changed += b->changed;
    a->spm_checked += b->spm_checked, a->spm_differ += b->spm_differ, a->tokens += b->tokens;
    a->bytes += b->bytes, a->inputs += b->inputs, a->parts_hashed += b->parts_hashed;
    if (b->seconds > a->seconds) a->seconds = b->seconds;
    if (b->seconds_read > a->seconds_read) a->seconds_read = b->seconds_read;
    if (b->seconds_hash > a->seconds_hash) a->seconds_hash = b->seconds_hash;
    if (b->seconds_encode > a->seconds_encode) a->seconds_encode = b->seconds_encode;
}

int dist_audit_source(const char *path, tks_source_audit_opts *o, tks_audit_report **out,
                      tks_source_audit_stats *st, int *rank) {
    *out = NULL;
    *rank = 0;
    int size = 1, many = dist_launched_many(), rc = many ? world(rank, &size) : tks_launch_check();
    if (rc) return rc;
    if (!many) return tks_audit_source(path, o, out, st);
    c_bcast(&o->seed, sizeof o->seed, &g_w); /* rank 0's seed: one sample for all */
    o->rank = (unsigned)*rank;
    o->n_ranks = (unsigned)size;
    tks_audit_report *mine = NULL;
    rc = tks_audit_source(path, o, &mine, st);
    void *packed = NULL, *all = NULL;
    size_t plen = 0, len = 0;
    if (!rc) rc = tks_audit_report_pack(mine, &packed, &plen);
    int bad = rc != 0;
    c_max_int(&bad, 1, NULL);
    if (bad) {
        tks_audit_report_free(mine);
        free(packed);
        return rc ? rc : tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                                  "another rank could not audit %s against its sources (its error is above)", path);
    }
    char *buf = malloc(sizeof *st + plen);
    need(buf != NULL);
    memcpy(buf, st, sizeof *st);
    memcpy(buf + sizeof *st, packed, plen);
    c_gather(buf, sizeof *st + plen, &all, &len, &g_w);
    free(buf);
    free(packed);
    tks_audit_report_free(mine);
    if (*rank != 0) return 0;
    tks_audit_report **parts = calloc((size_t)size, sizeof *parts);
    need(parts != NULL);
    size_t at = 0;
    int n = 0;
    tks_source_audit_stats sum = {.dataset_docs = st->dataset_docs, .sampled = st->sampled,
                                  .spm_library = st->spm_library, .tables = st->tables}; /* rank 0's */
    memcpy(sum.tokenizer, st->tokenizer, sizeof sum.tokenizer);
    for (; n < size && !rc; n++) {
        tks_source_audit_stats s;
        size_t used = 0;
        if (len - at < sizeof s) rc = tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "a rank's report was cut short");
        if (!rc) memcpy(&s, (char *)all + at, sizeof s), at += sizeof s;
        if (!rc) rc = tks_audit_report_unpack((char *)all + at, len - at, &used, &parts[n]);
        if (!rc) add_stats(&sum, &s), at += used;
    }
    if (!rc) rc = tks_audit_merge(parts, (size_t)size, o->max_problems, out);
    for (int i = 0; i < size; i++) tks_audit_report_free(parts[i]);
    free(parts);
    free(all);
    *st = sum;
    return rc;
}
