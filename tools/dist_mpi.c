/* dist_mpi.c - dist.h: tokshard commands across MPI ranks.
 *
 * Audit: every rank runs tks_audit on its share of the shards (contiguous
 * ranges of about equal bytes, tks_audit_share); rank 0 gathers the reports
 * (counters, then the recorded problems as bytes: every rank runs the same
 * binary) and merges them with tks_audit_merge, which gives exactly the report
 * of a single process.
 *
 * Build: rank 0 opens the job (lock, listing, plan: no input is read) and
 * broadcasts its listing; every rank then takes units, heaviest first, by
 * MPI_Fetch_and_op on a counter in rank 0's window (no rank answers any
 * other), and reports its progress into the same window, which rank 0 reads
 * every 2 s between its own batches. Once every unit is built, one
 * allreduce of the units' shard counts gives each unit its first global
 * shard index (a prefix sum every rank computes); each rank places its own
 * units' shards and sends their results to rank 0, which writes the manifest
 * and publishes OUT. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, sigaction, PATH_MAX */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks_mpi.h"
#include "tools/cli.h"
#include "tools/dist.h"

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
    if (!dist_launched_many()) {
        int rc = tks_launch_check();
        return rc ? rc : tks_audit(path, opts, out);
    }
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
/* build: units handed out by one-sided atomics                              */

#define IN_FLIGHT "in-flight" /* OUT.partial/in-flight/rank-RRRRR: the unit a rank builds */
enum { SLOT_UNITS, SLOT_KEPT, SLOT_TEXT, SLOT_BYTES, SLOT_CUR, SLOTS };

/* What a rank says when the launcher stops the job (SIGTERM): written with
 * write(2), the message is prepared before each unit. */
static char g_sigmsg[512];
static volatile size_t g_sigmsg_len;

static void on_term(int sig) {
    (void)sig;
    if (g_sigmsg_len && write(STDERR_FILENO, g_sigmsg, g_sigmsg_len) < 0) _exit(EXIT_INTERRUPTED);
    _exit(EXIT_INTERRUPTED);
}

/* Waits for a request without spinning: OpenMPI's blocking calls poll at
 * 100% CPU, which takes a core from the ranks still tokenizing. */
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

static void barrier_quietly(void) {
    MPI_Request rq;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
}

/* Bytes from rank 0 to every rank (*p malloc'd on the others). */
static void bcast_bytes(int rank, void **p, size_t *n) {
    uint64_t len = *n;
    MPI_Request rq;
    MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    if (rank && !(*p = malloc(len ? len : 1))) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    *n = (size_t)len;
    for (uint64_t at = 0; at < len;) {
        int chunk = len - at > (1u << 30) ? 1 << 30 : (int)(len - at);
        MPI_Ibcast((char *)*p + at, chunk, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
        wait_quietly(&rq);
        at += (uint64_t)chunk;
    }
}

typedef struct dist {
    int rank, size, progress;
    MPI_Win win;
    uint64_t *wmem;               /* rank 0: the window's memory */
    tks_build_job *job;
    const tks_build_unit *units;
    size_t n_units;
    const uint64_t *order;
    uint64_t total_bytes;         /* every unit's bytes on disk */
    uint64_t mine[SLOTS];         /* this rank's slots */
    uint64_t *ran;                /* units this rank ran */
    size_t n_ran;
    double t0, last_print, ho_sum, ho_max;
    uint64_t ho_n, kept_shards;
    tks_encoder_stats enc;        /* rank 0: the encoder statistics summed over the ranks */
    char partial[PATH_MAX], flight[PATH_MAX];
} dist;

static dist *g_dist;

/* This rank's slots into rank 0's window. */
static void put_slots(dist *d) {
    MPI_Accumulate(d->mine, SLOTS, MPI_UINT64_T, 0, (MPI_Aint)(1 + SLOTS * d->rank), SLOTS, MPI_UINT64_T,
                   MPI_REPLACE, d->win);
    MPI_Win_flush(0, d->win);
}

/* Rank 0: one progress line from the window, at most every 2 s. */
static void dist_print(dist *d, int force) {
    double now = MPI_Wtime();
    if (d->rank || !d->progress || (!force && now - d->last_print < 2.0)) return;
    d->last_print = now;
    size_t n = 1 + (size_t)SLOTS * (size_t)d->size;
    uint64_t *w = malloc(n * sizeof *w);
    if (!w) return;
    MPI_Get_accumulate(NULL, 0, MPI_UINT64_T, w, (int)n, MPI_UINT64_T, 0, 0, (int)n, MPI_UINT64_T,
                       MPI_NO_OP, d->win);
    MPI_Win_flush(0, d->win);
    uint64_t units = 0, kept = 0, text = 0, bytes = 0;
    for (int r = 0; r < d->size; r++) {
        const uint64_t *s = w + 1 + SLOTS * r;
        units += s[SLOT_UNITS], kept += s[SLOT_KEPT], text += s[SLOT_TEXT], bytes += s[SLOT_BYTES];
    }
    double el = now - d->t0, rate = el > 0 ? (double)text / el : 0;
    fprintf(stderr, "units %llu/%zu done (%llu kept), %.1f MB/s", (unsigned long long)units, d->n_units,
            (unsigned long long)kept, rate / 1e6);
    if (bytes && bytes < d->total_bytes)
        fprintf(stderr, ", ETA %.0fs", el * (double)(d->total_bytes - bytes) / (double)bytes);
    for (int r = 0; r < d->size && d->size <= 8; r++) {
        const uint64_t *s = w + 1 + SLOTS * r;
        fprintf(stderr, " | rank %d: %llu units %.1f MB/s", r, (unsigned long long)s[SLOT_UNITS],
                el > 0 ? (double)s[SLOT_TEXT] / el / 1e6 : 0.0);
        if (s[SLOT_CUR]) fprintf(stderr, " (unit %llu)", (unsigned long long)s[SLOT_CUR] - 1);
    }
    if (d->size > 8) {
        uint64_t lo = UINT64_MAX, hi = 0, busy = 0;
        for (int r = 0; r < d->size; r++) {
            const uint64_t *s = w + 1 + SLOTS * r;
            lo = s[SLOT_UNITS] < lo ? s[SLOT_UNITS] : lo;
            hi = s[SLOT_UNITS] > hi ? s[SLOT_UNITS] : hi;
            busy += s[SLOT_CUR] != 0;
        }
        fprintf(stderr, " | %d ranks, %llu building, %llu-%llu units each", d->size,
                (unsigned long long)busy, (unsigned long long)lo, (unsigned long long)hi);
    }
    fprintf(stderr, "\n");
    free(w);
}

/* rank 0, between the batches of its own units: the progress line, and a
 * turn of MPI's progress engine (a transport that cannot serve another
 * rank's MPI_Fetch_and_op on its own, TCP without RDMA, serves it then) */
static void dist_progress(const tks_build_progress *p, void *ctx) {
    (void)p;
    (void)ctx;
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    dist_print(g_dist, 0);
}

/* OUT.partial/in-flight/rank-RRRRR says which unit the rank builds (kept if
 * the job is killed: the next --resume prints it). */
static void note_in_flight(dist *d, int64_t unit) {
    if (unit < 0) {
        unlink(d->flight);
        return;
    }
    char line[96];
    int n = snprintf(line, sizeof line, "unit %lld on rank %d", (long long)unit, d->rank);
    if (tks_write_file_atomic(d->flight, line, (size_t)n) != 0) tks_clear_error(); /* only a report */
    g_sigmsg_len = (size_t)snprintf(g_sigmsg, sizeof g_sigmsg,
                                    "%s: rank %d stopped by the launcher while building unit %lld; the "
                                    "complete units are kept in %s: re-run the same command with "
                                    "--resume (any number of ranks)\n",
                                    cli_prog, d->rank, (long long)unit, d->partial);
}

/* A resumed build: which unit each rank was building when it stopped. */
static void show_in_flight(const tks_build_opts *o) {
    char dir[PATH_MAX], path[PATH_MAX + 300], line[128];
    if (!o->resume || snprintf(dir, sizeof dir, "%s.partial/%s", o->out_dir, IN_FLIGHT) >= (int)sizeof dir)
        return;
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort), shown = 0;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        FILE *f = names[i]->d_name[0] == '.' ? NULL : fopen(path, "r");
        if (f && fgets(line, sizeof line, f)) {
            if (!shown++) fprintf(stderr, "%s: resuming; when the interrupted run stopped: units in flight:", cli_prog);
            fprintf(stderr, " %s,", line);
        }
        if (f) fclose(f);
        free(names[i]);
    }
    free(names);
    if (shown) fprintf(stderr, "\n");
}

/* Rank 0, once the job is open: the previous run's lines go (each rank
 * writes its own again before the first hand-out). */
static void clear_in_flight(const char *dir) {
    struct dirent **names = NULL;
    char path[PATH_MAX + 300];
    int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' && snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name) < (int)sizeof path)
            unlink(path);
        free(names[i]);
    }
    free(names);
}

/* A failed unit stops the job: the rank says so itself (no rank waits for
 * another's answer), and MPI_Abort ends every rank. */
static void fail_job(const dist *d, const char *what, int64_t unit) {
    if (unit >= 0)
        fprintf(stderr, "%s: error: rank %d failed on unit %lld: %s\n", cli_prog, d->rank, (long long)unit,
                tks_last_error()->message);
    else
        fprintf(stderr, "%s: error: rank %d: %s: %s\n", cli_prog, d->rank, what, tks_last_error()->message);
    fprintf(stderr, "%s: stopping the job; the complete units are kept in %s: fix the cause and "
                    "re-run the same command with --resume\n", cli_prog, d->partial);
    fflush(stderr);
    g_sigmsg_len = 0;
    MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
}

/* Every rank's verdicts on the files it checked, put together on every rank. */
static void allgather_bytes(const dist *d, const void *mine, size_t n, char **all, size_t *len) {
    if (n > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    int my = (int)n, *lens = calloc((size_t)d->size, sizeof *lens), *displs = calloc((size_t)d->size, sizeof *displs);
    if (!lens || !displs) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Request rq;
    MPI_Iallgather(&my, 1, MPI_INT, lens, 1, MPI_INT, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    size_t total = 0;
    for (int r = 0; r < d->size; r++) {
        displs[r] = (int)total;
        total += (size_t)lens[r];
    }
    if (total > INT_MAX || !(*all = malloc(total ? total : 1))) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Iallgatherv(mine, my, MPI_BYTE, *all, lens, displs, MPI_BYTE, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    *len = total;
    free(lens);
    free(displs);
}

/* 0 when every rank's rc is 0; else this rank's error, or one saying that
 * another rank stopped (`what`: what it could not do). */
static int all_ok(const dist *d, int rc, const char *what) {
    int worst = rc ? 1 : 0, any = 0;
    MPI_Request rq;
    MPI_Iallreduce(&worst, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    if (!any || rc) return rc;
    return tks_fail(TKS_ERR_IO, d->partial, TKS_NONE, TKS_NONE,
                    "rank %d stops: another rank could not %s (see its message)", d->rank, what);
}

/* Opens every rank's job: rank 0 takes the lock and lists the inputs, the
 * others join from its listing; each rank checks its share of the files
 * named as compressed; every rank settles the listing with all the
 * verdicts and plans the units (rank 0 prepares OUT.partial meanwhile). */
static int open_jobs(tks_build_opts *o, dist *d) {
    int rc = d->rank == 0 ? tks_build_job_open_list(o, &d->job) : 0, rc0 = rc;
    bcast_int(&rc0);
    if (rc0) {
        if (d->rank) rc = tks_fail(rc0, NULL, TKS_NONE, TKS_NONE,
                                   "rank %d stops: rank 0 could not start the build (see its message)", d->rank);
        return rc;
    }
    void *blob = NULL;
    size_t len = 0;
    if (d->rank == 0 && tks_build_job_share(d->job, &blob, &len) != 0) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    bcast_bytes(d->rank, &blob, &len);
    if (d->rank) rc = tks_build_job_join(o, blob, len, &d->job);
    free(blob);
    if ((rc = all_ok(d, rc, "start the build"))) return rc;
    void *mine = NULL;
    char *all = NULL;
    rc = tks_build_job_check(d->job, (unsigned)d->rank, (unsigned)d->size, &mine, &len);
    if ((rc = all_ok(d, rc, "check the inputs"))) {
        free(mine);
        return rc;
    }
    allgather_bytes(d, mine, len, &all, &len);
    free(mine);
    rc = tks_build_job_settle(d->job, all, len); /* the same verdicts: the same error on every rank */
    free(all);
    return all_ok(d, rc, "start the build");
}

/* Takes units until none is left: one MPI_Fetch_and_op each. */
static void take_units(dist *d) {
    const uint64_t one = 1;
    d->ran = malloc((d->n_units ? d->n_units : 1) * sizeof *d->ran);
    if (!d->ran) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    for (;;) {
        uint64_t pos = 0;
        double t = MPI_Wtime();
        MPI_Fetch_and_op(&one, &pos, MPI_UINT64_T, 0, 0, MPI_SUM, d->win);
        MPI_Win_flush(0, d->win);
        t = MPI_Wtime() - t;
        d->ho_sum += t;
        d->ho_max = t > d->ho_max ? t : d->ho_max;
        d->ho_n++;
        if (pos >= d->n_units) break;
        uint64_t k = d->order[pos];
        note_in_flight(d, (int64_t)k);
        d->mine[SLOT_CUR] = k + 1;
        put_slots(d);
        tks_unit_stats us;
        if (tks_build_job_run(d->job, k, &us) != 0) fail_job(d, NULL, (int64_t)k);
        d->ran[d->n_ran++] = k;
        d->mine[SLOT_UNITS]++;
        d->mine[SLOT_KEPT] += (uint64_t)us.kept;
        d->kept_shards += us.kept ? us.shards : us.resumed_shards;
        d->mine[SLOT_TEXT] += us.text_bytes;
        d->mine[SLOT_BYTES] += d->units[k].bytes;
        d->mine[SLOT_CUR] = 0;
        put_slots(d);
        dist_print(d, 0);
    }
    note_in_flight(d, -1);
    g_sigmsg_len = 0;
}

/* Every unit built: the global shard indices by a prefix sum over the units'
 * shard counts (one allreduce), each rank's units placed, their results sent
 * to rank 0 (*all there, *len bytes). */
static void place_units(dist *d, char **all, size_t *len) {
    uint64_t *count = calloc(d->n_units ? d->n_units : 1, sizeof *count);
    uint64_t *sum = calloc(d->n_units ? d->n_units : 1, sizeof *sum);
    if (!count || !sum) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    for (size_t i = 0; i < d->n_ran; i++) count[d->ran[i]] = tks_build_job_unit_shards(d->job, d->ran[i]);
    MPI_Request rq;
    MPI_Iallreduce(count, sum, (int)d->n_units, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    uint64_t base = 0; /* exclusive prefix sum, in place */
    for (size_t k = 0; k < d->n_units; k++) {
        uint64_t c = sum[k];
        sum[k] = base;
        base += c;
    }
    size_t mine_len = 0, cap = 4096;
    char *mine = malloc(cap);
    if (!mine) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    for (size_t i = 0; i < d->n_ran; i++) {
        void *r = NULL;
        size_t n = 0;
        if (tks_build_job_place(d->job, d->ran[i], sum[d->ran[i]], &r, &n) != 0)
            fail_job(d, "placing shards", (int64_t)d->ran[i]);
        while (mine_len + n > cap) mine = realloc(mine, cap *= 2);
        if (!mine) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        memcpy(mine + mine_len, r, n);
        mine_len += n;
        free(r);
    }
    if (d->n_ran && tks_build_job_sync(d->job) != 0) fail_job(d, "placing shards", -1);
    free(count);
    free(sum);
    if (mine_len > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    int mylen = (int)mine_len, *lens = d->rank ? NULL : calloc((size_t)d->size, sizeof *lens);
    int *displs = d->rank ? NULL : calloc((size_t)d->size, sizeof *displs);
    if (!d->rank && (!lens || !displs)) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Igather(&mylen, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    size_t total = 0;
    for (int r = 0; !d->rank && r < d->size; r++) {
        displs[r] = (int)total;
        total += (size_t)lens[r];
    }
    *all = d->rank ? NULL : malloc(total ? total : 1);
    if (!d->rank && (!*all || total > INT_MAX)) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Igatherv(mine, mylen, MPI_BYTE, *all, lens, displs, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    wait_quietly(&rq);
    *len = total;
    free(mine);
    free(lens);
    free(displs);
}

/* The job's hand-out timings and kept units, gathered to rank 0's stats;
 * the encoder statistics summed into rank 0's d->enc (every field is a
 * uint64_t count). */
static void gather_timings(dist *d, tks_build_stats *st) {
    double mx[2] = {d->ho_max, 0}, gmx[2] = {0, 0};
    double sm[4] = {d->ho_sum, (double)d->ho_n, (double)d->mine[SLOT_KEPT], (double)d->kept_shards};
    double gsm[4] = {0, 0, 0, 0};
    tks_encoder_stats enc;
    tks_build_job_encoder_stats(d->job, &enc);
    _Static_assert(sizeof enc % sizeof(uint64_t) == 0, "tks_encoder_stats holds uint64_t counts only");
    MPI_Request rq[3];
    MPI_Ireduce(mx, gmx, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD, &rq[0]);
    MPI_Ireduce(sm, gsm, 4, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD, &rq[1]);
    MPI_Ireduce(&enc, &d->enc, (int)(sizeof enc / sizeof(uint64_t)), MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD,
                &rq[2]);
    for (int i = 0; i < 3; i++) wait_quietly(&rq[i]);
    if (d->rank) return;
    st->handouts = (uint64_t)gsm[1];
    st->handout_seconds_mean = gsm[1] > 0 ? gsm[0] / gsm[1] : 0;
    st->handout_seconds_max = gmx[0];
    st->units_kept = (uint64_t)gsm[2];
    st->resumed_shards = (uint64_t)gsm[3];
}

/* Every rank done with its units: rank 0 keeps printing the progress while
 * it waits (the window stays open until all are done). */
static void wait_for_all(dist *d) {
    MPI_Request rq;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    struct timespec ts = {0, 1000000}; /* 1 ms */
    for (int done = 0;;) {
        MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (done) break;
        dist_print(d, 0);
        nanosleep(&ts, NULL);
    }
    dist_print(d, 1);
}

/* The window: the hand-out counter and every rank's progress slots, in rank
 * 0's memory; a passive epoch on every rank for the whole build. */
static void open_window(dist *d) {
    MPI_Aint bytes = d->rank ? 0 : (MPI_Aint)((1 + (size_t)SLOTS * (size_t)d->size) * sizeof(uint64_t));
    if (MPI_Win_allocate(bytes, sizeof(uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &d->wmem, &d->win) != MPI_SUCCESS)
        MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Win_lock_all(0, d->win);
    if (!d->rank) {
        memset(d->wmem, 0, (size_t)bytes);
        MPI_Win_sync(d->win);
    }
    barrier_quietly();
}

/* Every unit built, placed and recorded: rank 0 writes the manifest, the
 * ranks remove their units' records, rank 0 publishes. */
static int finish_build(dist *d, tks_build_stats *stats) {
    double t = MPI_Wtime();
    char *all = NULL;
    size_t len = 0;
    place_units(d, &all, &len);
    double placed = MPI_Wtime() - t;
    gather_timings(d, stats);
    int rc = d->rank ? 0 : tks_build_job_finish(d->job, all, len, stats);
    if (!d->rank) stats->encoder_stats = d->enc; /* every rank's, not rank 0's tokenizer's alone */
    free(all);
    int rc0 = rc;
    bcast_int(&rc0);
    if (rc0) return rc ? rc : tks_fail(rc0, d->partial, TKS_NONE, TKS_NONE,
                                       "rank %d: rank 0 could not finish the build (see its message)", d->rank);
    for (size_t i = 0; i < d->n_ran; i++) tks_build_job_clean(d->job, d->ran[i]);
    barrier_quietly();
    if (!d->rank) {
        rc = tks_build_job_publish(d->job);
        stats->place_seconds = placed;
    }
    rc0 = rc;
    bcast_int(&rc0);
    if (rc0 && !rc)
        rc = tks_fail(rc0, d->partial, TKS_NONE, TKS_NONE,
                      "rank %d: rank 0 could not publish the build (see its message)", d->rank);
    return rc;
}

int dist_build(tks_build_opts *o, int progress, tks_build_stats *stats, int *rank) {
    int size = 1;
    *rank = 0;
    memset(stats, 0, sizeof *stats);
    if (!dist_launched_many()) {
        int rc = tks_launch_check();
        if (rc) return rc;
        show_in_flight(o);
        return tks_build(o, stats);
    }
    int rc = world(rank, &size);
    if (rc) return rc;
    if (*rank == 0) show_in_flight(o);
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    dist d = {.rank = *rank, .size = size, .progress = progress, .t0 = MPI_Wtime()};
    g_dist = &d;
    o->progress = *rank == 0 ? dist_progress : NULL;
    o->stop = NULL;
    char dir[PATH_MAX];
    if (snprintf(d.partial, sizeof d.partial, "%s.partial", o->out_dir) >= (int)sizeof d.partial ||
        snprintf(dir, sizeof dir, "%s/%s", d.partial, IN_FLIGHT) >= (int)sizeof dir ||
        snprintf(d.flight, sizeof d.flight, "%s/rank-%05d", dir, *rank) >= (int)sizeof d.flight)
        return tks_fail(TKS_ERR_ARG, o->out_dir, TKS_NONE, TKS_NONE, "--output path too long");
    rc = open_jobs(o, &d);
    if (rc) {
        tks_build_job_free(d.job);
        return rc;
    }
    if (*rank == 0) clear_in_flight(dir);
    (void)mkdir(dir, 0755); /* only a report: EEXIST, or none */
    d.units = tks_build_job_units(d.job, &d.n_units);
    d.order = tks_build_job_order(d.job);
    for (size_t k = 0; k < d.n_units; k++) d.total_bytes += d.units[k].bytes;
    open_window(&d);
    take_units(&d);
    wait_for_all(&d);
    MPI_Win_unlock_all(d.win);
    rc = finish_build(&d, stats);
    if (*rank == 0) stats->seconds = MPI_Wtime() - d.t0;
    MPI_Win_free(&d.win);
    free(d.ran);
    tks_build_job_free(d.job);
    return rc;
}
