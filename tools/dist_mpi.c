/* dist_mpi.c - dist.h: tokshard commands across MPI ranks.
 *
 * Audit: every rank runs tks_audit on its share of the shards (contiguous
 * ranges of about equal bytes, tks_audit_share); rank 0 gathers the reports
 * (counters, then the recorded problems as bytes: every rank runs the same
 * binary) and merges them with tks_audit_merge, which gives exactly the report
 * of a single process. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sigaction, PATH_MAX */
#include <limits.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/tks_mpi.h"
#include "cli.h"
#include "dist.h"

static int g_inited_here = 0;

static int world(int *rank, int *size) {
    int rc = tks_mpi_start(&g_inited_here);
    if (rc) return rc;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return 0;
}

int dist_rank(void) {
    int rank = 0, size = 1;
    if (dist_launched_many() && world(&rank, &size) != 0) return 0;
    return rank;
}

typedef struct wire {
    uint64_t n_problems, n_problems_total, n_shards, n_chunks, n_docs, n_tokens, bytes_hashed;
    uint32_t vocab_size, min_token_id, max_token_id;
    int32_t manifest_checked, tokenizer_checked, rc;
    double seconds;
} wire;

int dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank) {
    *out = NULL;
    int size = 1;
    *rank = 0;
    if (!dist_launched_many()) return tks_audit(path, opts, out);
    int rc = world(rank, &size);
    if (rc) return rc;
    tks_audit_opts o = *opts;
    o.rank = (unsigned)*rank;
    o.n_ranks = (unsigned)size;
    tks_audit_report *mine = NULL;
    rc = tks_audit(path, &o, &mine);
    wire w = {0};
    w.rc = rc;
    if (!rc) {
        w.n_problems = mine->n_problems;
        w.n_problems_total = mine->n_problems_total;
        w.n_shards = mine->n_shards;
        w.n_chunks = mine->n_chunks;
        w.n_docs = mine->n_docs;
        w.n_tokens = mine->n_tokens;
        w.bytes_hashed = mine->bytes_hashed;
        w.vocab_size = mine->vocab_size;
        w.min_token_id = mine->min_token_id;
        w.max_token_id = mine->max_token_id;
        w.manifest_checked = mine->manifest_checked;
        w.tokenizer_checked = mine->tokenizer_checked;
        w.seconds = mine->seconds;
    }
    wire *all = *rank == 0 ? calloc((size_t)size, sizeof *all) : NULL;
    if (*rank == 0 && !all) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Gather(&w, (int)sizeof w, MPI_BYTE, all, (int)sizeof w, MPI_BYTE, 0, MPI_COMM_WORLD);
    /* one rank's failure stops all of them, each with its own message */
    int worst = rc ? 1 : 0, any = 0;
    MPI_Allreduce(&worst, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        free(all);
        tks_audit_report_free(mine);
        if (rc) return rc;
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "rank %d stops: another rank could not audit %s (see its message)", *rank, path);
    }
    size_t pb = sizeof(tks_audit_problem);
    if ((uint64_t)mine->n_problems * pb > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    int *counts = NULL, *displs = NULL;
    tks_audit_problem *probs = NULL;
    tks_audit_report **parts = NULL;
    if (*rank == 0) {
        counts = calloc((size_t)size, sizeof *counts);
        displs = calloc((size_t)size, sizeof *displs);
        parts = calloc((size_t)size, sizeof *parts);
        uint64_t total = 0;
        for (int i = 0; i < size; i++) total += all[i].n_problems;
        if (total * pb > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        probs = calloc(total ? total : 1, pb);
        if (!counts || !displs || !parts || !probs) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        for (int i = 0, at = 0; i < size; i++) {
            counts[i] = (int)(all[i].n_problems * pb);
            displs[i] = at;
            at += counts[i];
        }
    }
    MPI_Gatherv(mine->problems, (int)(mine->n_problems * pb), MPI_BYTE, probs, counts, displs,
                MPI_BYTE, 0, MPI_COMM_WORLD);
    if (*rank == 0) {
        tks_audit_report *rep = calloc((size_t)size, sizeof *rep);
        if (!rep) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        for (int i = 0; i < size; i++) {
            const wire *x = &all[i];
            rep[i] = (tks_audit_report){
                .n_problems = x->n_problems, .n_problems_total = x->n_problems_total,
                .problems = probs + displs[i] / (int)pb, .n_shards = x->n_shards,
                .n_chunks = x->n_chunks, .n_docs = x->n_docs, .n_tokens = x->n_tokens,
                .bytes_hashed = x->bytes_hashed, .vocab_size = x->vocab_size,
                .min_token_id = x->min_token_id, .max_token_id = x->max_token_id,
                .manifest_checked = x->manifest_checked, .tokenizer_checked = x->tokenizer_checked,
                .seconds = x->seconds};
            parts[i] = &rep[i];
        }
        rc = tks_audit_merge(parts, (size_t)size, opts->max_problems, out);
        free(rep);
    }
    free(counts);
    free(displs);
    free(probs);
    free(parts);
    free(all);
    tks_audit_report_free(mine);
    return rc;
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

/* ------------------------------------------------------------------------- */
/* build: rank 0 holds the queue of work units                               */

enum { TAG_REQ = 71, TAG_ASSIGN = 72 };
#define IN_FLIGHT "in-flight.txt" /* OUT.partial/: which rank builds which unit */

typedef struct req { /* worker -> rank 0: "give me a unit", with the last one's result */
    int32_t rc, has_unit;
    uint64_t unit;
    tks_unit_stats us;
    char err[600];
} req;

typedef struct assign { /* rank 0 -> worker */
    int32_t stop, pad;
    tks_build_unit unit;
} assign;

/* What a rank says when the launcher stops the job (SIGTERM): written with
 * write(2), the message is prepared before each unit. */
static char g_sigmsg[4096];
static volatile size_t g_sigmsg_len;

/* Waits for a request without spinning: OpenMPI's blocking calls poll at
 * 100% CPU, which takes a core from the ranks still tokenizing (and from
 * rank 0 while it plans). */
static void wait_quietly(MPI_Request *rq) {
    int done = 0;
    struct timespec ts = {0, 1000000}; /* 1 ms */
    for (;;) {
        MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (done) return;
        nanosleep(&ts, NULL);
    }
}

static void bcast_int(int *v) {
    MPI_Request rq;
    MPI_Ibcast(v, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
}

static void on_term(int sig) {
    (void)sig;
    if (g_sigmsg_len && write(STDERR_FILENO, g_sigmsg, g_sigmsg_len) < 0) _exit(EXIT_INTERRUPTED);
    _exit(EXIT_INTERRUPTED);
}

typedef struct coord {
    int size;
    tks_build_unit *units;      /* planned so far */
    size_t n_units, cap_units, next, n_done, n_kept, stopped;
    int planning;
    int *waiting;               /* ranks that asked while no unit was planned */
    size_t n_waiting;
    uint64_t total_text, done_text;
    int64_t *inflight;          /* per rank: unit, or -1 */
    uint64_t *rank_units, *rank_text;
    double t0, last_print;
    int progress;
    const char *partial;
    tks_build_job *job;
} coord;

static void coord_sigmsg(coord *c) {
    size_t n = (size_t)snprintf(g_sigmsg, sizeof g_sigmsg,
                                "%s: build stopped by the launcher (a rank failed or was killed: "
                                "the launcher's message names it); units in flight:",
                                cli_prog);
    for (int r = 0; r < c->size && n < sizeof g_sigmsg - 200; r++)
        if (c->inflight[r] >= 0)
            n += (size_t)snprintf(g_sigmsg + n, sizeof g_sigmsg - n, " unit %lld on rank %d,",
                                  (long long)c->inflight[r], r);
    if (n < sizeof g_sigmsg - 200)
        n += (size_t)snprintf(g_sigmsg + n, sizeof g_sigmsg - n,
                              " %zu of %zu units complete and kept in %s: re-run the same command "
                              "with --resume (any number of ranks) to build the others\n",
                              c->n_done, c->n_units, c->partial);
    g_sigmsg_len = n < sizeof g_sigmsg ? n : sizeof g_sigmsg - 1;
    /* the launcher may drop what a rank prints while the job is torn down:
     * the same lines are kept in OUT.partial for the next --resume to show */
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", c->partial, IN_FLIGHT) < (int)sizeof path &&
        tks_write_file_atomic(path, g_sigmsg, g_sigmsg_len) != 0)
        tks_clear_error(); /* only a report */
}

static void coord_print(coord *c, int force) {
    double now = omp_get_wtime();
    if (!c->progress || (!force && now - c->last_print < 2.0)) return;
    c->last_print = now;
    double el = now - c->t0, rate = el > 0 ? c->done_text / el : 0;
    fprintf(stderr, "units %zu/%zu%s done (%zu kept), %.1f MB/s", c->n_done, c->n_units,
            c->planning ? "+ (planning)" : "", c->n_kept, rate / 1e6);
    if (rate > 0 && !c->planning)
        fprintf(stderr, ", ETA %.0fs", (double)(c->total_text - c->done_text) / rate);
    for (int r = 0; r < c->size; r++)
        fprintf(stderr, " | rank %d: %llu units %.1f MB/s", r, (unsigned long long)c->rank_units[r],
                el > 0 ? c->rank_text[r] / el / 1e6 : 0.0);
    fprintf(stderr, "\n");
}

/* The next planned unit not yet on disk, or -1. */
static int64_t coord_take(coord *c, int rank) {
    while (c->next < c->n_units && tks_build_job_unit_done(c->job, c->next)) c->next++;
    if (c->next == c->n_units) return -1;
    c->inflight[rank] = (int64_t)c->next;
    coord_sigmsg(c);
    return (int64_t)c->next++;
}

static void coord_done(coord *c, int rank, uint64_t unit, const tks_unit_stats *us) {
    c->n_done++;
    c->done_text += us->text_bytes;
    c->rank_units[rank]++;
    c->rank_text[rank] += us->text_bytes;
    c->inflight[rank] = -1;
    (void)unit;
    coord_sigmsg(c);
    coord_print(c, 0);
}

/* Hands rank `to` the next unit, or tells it to stop once every unit is
 * planned and handed out: 1, or 0 when it must wait for the plan. */
static int coord_answer(coord *c, int to) {
    assign a = {0};
    int64_t k = coord_take(c, to);
    if (k < 0 && c->planning) return 0;
    if (k < 0) {
        a.stop = 1;
        c->stopped++;
    } else {
        a.unit = c->units[k];
    }
    MPI_Send(&a, (int)sizeof a, MPI_BYTE, to, TAG_ASSIGN, MPI_COMM_WORLD);
    return 1;
}

/* Answers one request (blocking, or only if one is waiting). */
static void coord_serve(coord *c, int block) {
    MPI_Status st;
    int flag = 0;
    struct timespec ts = {0, 1000000}; /* 1 ms: no spinning while waiting */
    for (;;) {
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_REQ, MPI_COMM_WORLD, &flag, &st);
        if (flag || !block) break;
        nanosleep(&ts, NULL);
    }
    if (!flag) return;
    req q;
    int src = st.MPI_SOURCE;
    MPI_Recv(&q, (int)sizeof q, MPI_BYTE, src, TAG_REQ, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (q.rc) {
        fprintf(stderr,
                "%s: error: rank %d failed on unit %llu: %s\n%s: stopping the job; the complete "
                "units are kept in %s: fix the cause and re-run the same command with --resume\n",
                cli_prog, src, (unsigned long long)q.unit, q.err, cli_prog, c->partial);
        fflush(stderr);
        g_sigmsg_len = 0;
        MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    }
    if (q.has_unit) coord_done(c, src, q.unit, &q.us);
    if (!coord_answer(c, src)) c->waiting[c->n_waiting++] = src;
}

static coord *g_coord;
/* rank 0 answers the other ranks between the batches of its own unit */
static void coord_progress(const tks_build_progress *p, void *ctx) {
    (void)p;
    (void)ctx;
    coord_serve(g_coord, 0);
    coord_print(g_coord, 0);
}

/* A resumed build by work units: what the interrupted run was building. */
static void show_in_flight(const tks_build_opts *o) {
    char path[PATH_MAX], line[4096];
    if (!o->resume || snprintf(path, sizeof path, "%s.partial/%s", o->out_dir, IN_FLIGHT) >= (int)sizeof path)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(line, sizeof line, f))
        fprintf(stderr, "%s: resuming; when the interrupted run stopped: %s", cli_prog,
                strstr(line, "units in flight:") ? strstr(line, "units in flight:") : line);
    fclose(f);
}

/* Opens this rank's job: rank 0 first (it plans and prepares OUT.partial,
 * which the others need), then the workers; every rank learns whether all
 * could start. */
static int open_jobs(tks_build_opts *o, int rank, tks_build_job **job) {
    int rc = rank == 0 ? tks_build_job_open(o, 1, job) : 0;
    int rc0 = rc;
    bcast_int(&rc0);
    if (rc0) {
        if (rank) rc = tks_fail(rc0, NULL, TKS_NONE, TKS_NONE,
                                "rank %d stops: rank 0 could not start the build (see its message)", rank);
        tks_build_job_free(*job);
        *job = NULL;
        return rc;
    }
    if (rank) rc = tks_build_job_open(o, 0, job);
    int worst = rc ? 1 : 0, any = 0;
    MPI_Allreduce(&worst, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any) return 0;
    tks_build_job_free(*job);
    *job = NULL;
    if (rc) return rc;
    return tks_fail(TKS_ERR_IO, o->out_dir, TKS_NONE, TKS_NONE,
                    "rank %d stops: another rank could not start the build (see its message)", rank);
}

/* A worker: asks rank 0 for a unit, builds it, reports, until told to stop;
 * then learns whether rank 0 finished the build. */
static int worker(const tks_build_opts *o, int rank, tks_build_job *job) {
    req q = {0};
    for (;;) {
        MPI_Send(&q, (int)sizeof q, MPI_BYTE, 0, TAG_REQ, MPI_COMM_WORLD);
        assign a;
        MPI_Request rq;
        MPI_Irecv(&a, (int)sizeof a, MPI_BYTE, 0, TAG_ASSIGN, MPI_COMM_WORLD, &rq);
        wait_quietly(&rq);
        if (a.stop) break;
        g_sigmsg_len = (size_t)snprintf(g_sigmsg, sizeof g_sigmsg,
                                        "%s: rank %d stopped by the launcher while building unit %llu\n",
                                        cli_prog, rank, (unsigned long long)a.unit.index);
        memset(&q, 0, sizeof q);
        q.unit = a.unit.index;
        q.has_unit = 1;
        q.rc = tks_build_job_run(job, &a.unit, &q.us);
        if (q.rc) snprintf(q.err, sizeof q.err, "%s", tks_last_error()->message);
        g_sigmsg_len = 0;
    }
    tks_build_job_free(job);
    int rc = 0;
    bcast_int(&rc);
    if (rc) return tks_fail(rc, o->out_dir, TKS_NONE, TKS_NONE,
                            "rank %d: rank 0 could not finish the build (see its message)", rank);
    return 0;
}

/* Rank 0 plans unit by unit; the other ranks start on the first units
 * meanwhile. */
static void coord_plan(coord *c) {
    for (;;) {
        tks_build_unit u;
        int rc = tks_build_job_plan(c->job, &u);
        if (rc < 0) {
            fprintf(stderr, "%s: error: rank 0 could not plan the units: %s\n", cli_prog,
                    tks_last_error()->message);
            fflush(stderr);
            g_sigmsg_len = 0;
            MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        }
        if (rc == 0) c->planning = 0;
        if (rc == 1) {
            if (c->n_units == c->cap_units) {
                c->cap_units = c->cap_units ? 2 * c->cap_units : 64;
                c->units = realloc(c->units, c->cap_units * sizeof *c->units);
                if (!c->units) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
            }
            c->units[c->n_units++] = u;
            if (tks_build_job_unit_done(c->job, u.index)) {
                c->n_kept++;
                c->n_done++;
            } else {
                c->total_text += u.text_bytes;
            }
        }
        size_t w = 0; /* ranks waiting for a unit */
        for (size_t i = 0; i < c->n_waiting; i++)
            if (!coord_answer(c, c->waiting[i])) c->waiting[w++] = c->waiting[i];
        c->n_waiting = w;
        coord_serve(c, 0);
        coord_print(c, 0);
        if (!c->planning) break;
    }
}

/* What a resume took over from a build started without mpirun (its shards
 * are taken over as the units are planned). */
static void coord_plain_report(const coord *c) {
    const tks_build_plain *pl = tks_build_job_plain(c->job);
    if (pl->active && !pl->ends_recorded && pl->empty_after_tokenize)
        fprintf(stderr, "%s: resuming a build started without mpirun: none of its %llu shard(s) "
                        "kept, since it found %llu document(s) empty after tokenizing and its "
                        "shards cannot then be matched to work units; %zu of %zu units are built\n",
                cli_prog, (unsigned long long)pl->shards,
                (unsigned long long)pl->empty_after_tokenize, c->n_units - c->n_kept, c->n_units);
    else if (pl->active)
        fprintf(stderr, "%s: resuming a build started without mpirun: %zu of %zu units kept "
                        "(%llu of its %llu shard(s) taken over now as %llu units); the others "
                        "are built\n",
                cli_prog, c->n_kept, c->n_units, (unsigned long long)pl->shards_kept,
                (unsigned long long)pl->shards, (unsigned long long)pl->units_kept);
}

/* Rank 0 builds units too, answering the other ranks between its batches,
 * until none is left; then waits for every rank to be told to stop. */
static void coord_build(coord *c, const tks_build_opts *o) {
    /* the job's options are a copy: the callback is set on the unit runs below */
    tks_build_opts ro = *o;
    ro.progress = coord_progress;
    /* rank 0 answers the other ranks only between its batches: smaller
     * batches keep a rank that finished its unit from waiting for the next
     * one (8 MiB took ~0.4 s per core; the bytes written do not depend on it) */
    if (!ro.batch_bytes) ro.batch_bytes = 1u << 20;
    tks_build_job *job0 = NULL;
    if (tks_build_job_open(&ro, 0, &job0)) {
        fprintf(stderr, "%s: error: rank 0: %s\n", cli_prog, tks_last_error()->message);
        MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    }
    int64_t k;
    while ((k = coord_take(c, 0)) >= 0) {
        tks_unit_stats us;
        if (tks_build_job_run(job0, &c->units[k], &us)) {
            fprintf(stderr, "%s: error: rank 0 failed on unit %lld: %s\n%s: stopping the job; the "
                            "complete units are kept in %s: fix the cause and re-run the same "
                            "command with --resume\n",
                    cli_prog, (long long)k, tks_last_error()->message, cli_prog, c->partial);
            fflush(stderr);
            g_sigmsg_len = 0;
            MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        }
        coord_done(c, 0, (uint64_t)k, &us);
        coord_serve(c, 0);
    }
    while (c->stopped < (size_t)c->size - 1) coord_serve(c, 1);
    tks_build_job_free(job0);
}

int dist_build(tks_build_opts *o, int progress, tks_build_stats *stats, int *rank) {
    int size = 1;
    *rank = 0;
    if (!dist_launched_many()) {
        show_in_flight(o);
        return tks_build(o, stats);
    }
    int rc = world(rank, &size);
    if (rc) return rc;
    if (*rank == 0) show_in_flight(o);
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    o->progress = NULL;
    o->stop = NULL;
    tks_build_job *job = NULL;
    rc = open_jobs(o, *rank, &job);
    if (rc) return rc;
    if (*rank) return worker(o, *rank, job);
    coord c = {0};
    c.size = size;
    c.inflight = malloc((size_t)size * sizeof *c.inflight);
    c.waiting = malloc((size_t)size * sizeof *c.waiting);
    c.rank_units = calloc((size_t)size, sizeof *c.rank_units);
    c.rank_text = calloc((size_t)size, sizeof *c.rank_text);
    if (!c.inflight || !c.waiting || !c.rank_units || !c.rank_text) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    for (int r = 0; r < size; r++) c.inflight[r] = -1;
    c.t0 = omp_get_wtime();
    c.progress = progress;
    char partial[PATH_MAX];
    snprintf(partial, sizeof partial, "%s.partial", o->out_dir);
    c.partial = partial;
    c.job = job;
    c.planning = 1;
    g_coord = &c;
    coord_sigmsg(&c);
    coord_plan(&c);
    coord_plain_report(&c);
    coord_build(&c, o);
    coord_print(&c, 1);
    g_sigmsg_len = 0;
    rc = tks_build_job_finish(job, stats);
    int rcb = rc;
    bcast_int(&rcb);
    free(c.inflight);
    free(c.waiting);
    free(c.units);
    free(c.rank_units);
    free(c.rank_text);
    tks_build_job_free(job);
    return rc;
}
