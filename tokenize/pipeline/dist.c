/* dist.c - tks_build_spread: a build's work units spread over the ranks of
 * a world of processes, through the collectives the caller gives
 * (tks_build_world, tokenize.h; the library calls no MPI itself).
 *
 * Rank 0 opens the job (lock, listing, plan: no input is read) and
 * broadcasts its listing; each rank checks its share of the files named as
 * compressed, and every rank settles the listing with all the verdicts.
 * Every rank then takes units, heaviest first, by a fetch-and-add on a
 * counter in rank 0's shared memory (no rank answers any other), and
 * reports its progress into slots beside it, which rank 0 reads every 2 s
 * between its own batches. Once every unit is built, one sum of the units'
 * shard counts gives each unit its first global shard index (a prefix sum
 * every rank computes); each rank places its own units' shards and sends
 * their results to rank 0, which writes the manifest and publishes OUT.
 * Meanwhile OUT.partial/in-flight/rank-RRRRR says which unit each rank
 * builds (kept if the job is killed: tks_build_in_flight reads them). */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

#define IN_FLIGHT "in-flight" /* OUT.partial/in-flight/rank-RRRRR: the unit a rank builds */

/* The shared memory: element 0 the hand-out counter, then each rank's SLOTS
 * slots (tks_build_rank_progress, in its order). */
enum { SLOT_UNITS, SLOT_KEPT, SLOT_TEXT, SLOT_BYTES, SLOT_CUR, SLOTS };

/* What each rank sends rank 0 at the end: its hand-outs' cost, its kept
 * units' shards and its encoder's statistics (uint64_t counts only). */
typedef struct tally {
    double ho_sum, ho_max;
    uint64_t ho_n, kept, kept_shards;
    tks_encoder_stats enc;
} tally;

typedef struct dist {
    const tks_build_world *W;
    int rank, size;
    tks_build_job *job;
    const tks_build_unit *units;
    size_t n_units;
    const uint64_t *order;
    uint64_t total_bytes;         /* every unit's bytes on disk */
    uint64_t mine[SLOTS];         /* this rank's slots */
    uint64_t *ran;                /* units this rank ran */
    size_t n_ran;
    double t0, last_print;
    tally t;
    char partial[PATH_MAX], flight[PATH_MAX];
} dist;

/* This rank cannot go on: world->fail stops the job (unit: the unit that
 * failed, or -1 with `what`). Returns rc when fail returns. */
static int stop_job(const dist *d, int rc, const char *what, int64_t unit) {
    d->W->fail(unit, what, d->partial, d->W->ctx);
    return rc;
}

/* A collective's rc: 0, or the job stopped. */
static int coll(const dist *d, int rc) { return rc ? stop_job(d, rc, "exchanging with the other ranks", -1) : 0; }

/* 0 when every rank's rc is 0; else this rank's error, or one saying that
 * another rank stopped (`what`: what it could not do). */
static int all_ok(const dist *d, int rc, const char *what) {
    int any = rc ? 1 : 0, c = coll(d, d->W->max_int(&any, 1, d->W->ctx));
    if (c) return c;
    if (!any || rc) return rc;
    return tks_fail(TKS_ERR_IO, d->partial, TKS_NONE, TKS_NONE,
                    "rank %d stops: another rank could not %s (see its message)", d->rank, what);
}

/* Rank 0's rc, on every rank in *rc0. */
static int from_rank0(const dist *d, int rc, int *rc0) {
    *rc0 = rc;
    return coll(d, d->W->bcast(rc0, sizeof *rc0, d->W->ctx));
}

/* Bytes from rank 0 to every rank (*p malloc'd on the others, *n bytes). */
static int bcast_blob(const dist *d, void **p, size_t *n) {
    uint64_t len = *n;
    int rc = coll(d, d->W->bcast(&len, sizeof len, d->W->ctx));
    if (!rc && d->rank && !(*p = malloc(len ? len : 1)))
        rc = stop_job(d, tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory"),
                      "receiving rank 0's bytes", -1);
    *n = (size_t)len;
    return rc ? rc : coll(d, d->W->bcast(*p, *n, d->W->ctx));
}

/* Every rank's n bytes at mine, back to back in rank order, on every rank
 * (*all malloc'd, *len bytes): gathered to rank 0, which broadcasts them. */
static int allgather(const dist *d, const void *mine, size_t n, void **all, size_t *len) {
    int rc = coll(d, d->W->gather(mine, n, all, len, d->W->ctx));
    return rc ? rc : bcast_blob(d, all, len);
}

/* Rank 0: the progress from the ranks' slots, at most every 2 s. */
static void show_progress(dist *d, int force) {
    const tks_build_world *W = d->W;
    double now = omp_get_wtime();
    if (d->rank || !W->progress || (!force && now - d->last_print < 2.0)) return;
    d->last_print = now;
    size_t n = (size_t)SLOTS * (size_t)d->size;
    uint64_t *s = malloc(n * sizeof *s);
    tks_build_rank_progress *r = malloc((size_t)d->size * sizeof *r);
    tks_build_world_progress p = {.n_units = d->n_units, .total_bytes = d->total_bytes, .seconds = now - d->t0,
                                  .n_ranks = (size_t)d->size, .ranks = r, .units_min = UINT64_MAX};
    int rc = s && r ? W->get(1, s, n, W->ctx) : -1;
    if (rc == 0) {
        for (int k = 0; k < d->size; k++) {
            const uint64_t *x = s + SLOTS * k;
            r[k] = (tks_build_rank_progress){x[SLOT_UNITS], x[SLOT_KEPT], x[SLOT_TEXT], x[SLOT_BYTES], x[SLOT_CUR]};
            p.units += r[k].units, p.kept += r[k].kept, p.text_bytes += r[k].text_bytes, p.bytes += r[k].bytes;
            p.building += r[k].unit != 0;
            p.units_min = r[k].units < p.units_min ? r[k].units : p.units_min;
            p.units_max = r[k].units > p.units_max ? r[k].units : p.units_max;
        }
        W->progress(&p, W->ctx);
    } else if (s && r) {
        tks_clear_error(); /* only a report */
    }
    free(s);
    free(r);
}

/* Rank 0, between the batches of its own units: a turn of the transport's
 * progress engine (another rank's fetch-and-add may wait on it), and the
 * progress. */
static void on_batch(const tks_build_progress *p, void *ctx) {
    (void)p;
    dist *d = ctx;
    if (d->W->poll) d->W->poll(d->W->ctx);
    show_progress(d, 0);
}

static void on_wait(void *arg) { show_progress(arg, 0); }

/* OUT.partial/in-flight/rank-RRRRR says which unit the rank builds (-1:
 * none, the file goes). */
static void note_in_flight(const dist *d, int64_t unit) {
    if (unit < 0) {
        unlink(d->flight);
    } else {
        char line[96];
        int n = snprintf(line, sizeof line, "unit %lld on rank %d", (long long)unit, d->rank);
        if (tks_write_file_atomic(d->flight, line, (size_t)n) != 0) tks_clear_error(); /* only a report */
    }
    if (d->W->building) d->W->building(unit, d->partial, d->W->ctx);
}

/* Rank 0, once the job is open: the previous run's notes go (each rank
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

size_t tks_build_in_flight(const char *out_dir, void (*each)(const char *note, void *arg), void *arg) {
    char dir[PATH_MAX], path[PATH_MAX + 300], line[128];
    if (!out_dir || snprintf(dir, sizeof dir, "%s.partial/%s", out_dir, IN_FLIGHT) >= (int)sizeof dir) return 0;
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    size_t shown = 0;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        FILE *f = names[i]->d_name[0] == '.' ? NULL : fopen(path, "r");
        if (f && fgets(line, sizeof line, f)) {
            shown++;
            if (each) each(line, arg);
        }
        if (f) fclose(f);
        free(names[i]);
    }
    free(names);
    return shown;
}

/* Opens every rank's job: rank 0 takes the lock and lists the inputs, the
 * others join from its listing; each rank checks its share of the files
 * named as compressed; every rank settles the listing with all the
 * verdicts and plans the units (rank 0 prepares OUT.partial meanwhile). */
static int open_jobs(const tks_build_opts *o, dist *d) {
    int rc = d->rank == 0 ? tks_build_job_open_list(o, &d->job) : 0, rc0 = 0, c = from_rank0(d, rc, &rc0);
    if (c) return c;
    if (rc0) {
        if (d->rank) rc = tks_fail(rc0, NULL, TKS_NONE, TKS_NONE,
                                   "rank %d stops: rank 0 could not start the build (see its message)", d->rank);
        return rc;
    }
    void *blob = NULL, *mine = NULL, *all = NULL;
    size_t len = 0;
    if (d->rank == 0 && (rc = tks_build_job_share(d->job, &blob, &len)) != 0)
        return stop_job(d, rc, "sharing the listing", -1);
    if ((c = bcast_blob(d, &blob, &len))) {
        free(blob);
        return c;
    }
    if (d->rank) rc = tks_build_job_join(o, blob, len, &d->job);
    free(blob);
    if ((rc = all_ok(d, rc, "start the build"))) return rc;
    rc = tks_build_job_check(d->job, (unsigned)d->rank, (unsigned)d->size, &mine, &len);
    if ((rc = all_ok(d, rc, "check the inputs"))) {
        free(mine);
        return rc;
    }
    c = allgather(d, mine, len, &all, &len);
    if (!c) rc = tks_build_job_settle(d->job, all, len); /* the same verdicts: the same error on every rank */
    free(mine);
    free(all);
    return c ? c : all_ok(d, rc, "start the build");
}

/* This rank's slots into rank 0's shared memory. */
static int put_slots(const dist *d) {
    return coll(d, d->W->put(1 + (size_t)SLOTS * (size_t)d->rank, d->mine, SLOTS, d->W->ctx));
}

/* Takes units until none is left: one fetch-and-add each. */
static int take_units(dist *d) {
    const tks_build_world *W = d->W;
    d->ran = malloc((d->n_units ? d->n_units : 1) * sizeof *d->ran);
    if (!d->ran) return stop_job(d, tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory"), "units", -1);
    for (;;) {
        uint64_t pos = 0;
        double t = omp_get_wtime();
        int rc = coll(d, W->fetch_add(0, 1, &pos, W->ctx));
        if (rc) return rc;
        t = omp_get_wtime() - t;
        d->t.ho_sum += t;
        d->t.ho_max = t > d->t.ho_max ? t : d->t.ho_max;
        d->t.ho_n++;
        if (pos >= d->n_units) break;
        uint64_t k = d->order[pos];
        note_in_flight(d, (int64_t)k);
        d->mine[SLOT_CUR] = k + 1;
        if ((rc = put_slots(d))) return rc;
        tks_unit_stats us;
        if ((rc = tks_build_job_run(d->job, k, &us)) != 0) return stop_job(d, rc, NULL, (int64_t)k);
        d->ran[d->n_ran++] = k;
        d->mine[SLOT_UNITS]++;
        d->mine[SLOT_KEPT] += (uint64_t)us.kept;
        d->t.kept_shards += us.kept ? us.shards : us.resumed_shards;
        d->mine[SLOT_TEXT] += us.text_bytes;
        d->mine[SLOT_BYTES] += d->units[k].bytes;
        d->mine[SLOT_CUR] = 0;
        if ((rc = put_slots(d))) return rc;
        show_progress(d, 0);
    }
    note_in_flight(d, -1);
    return 0;
}

/* Every unit built: the global shard indices by a prefix sum over the units'
 * shard counts (one sum over the ranks), each rank's units placed, their
 * results sent to rank 0 (*all there, *len bytes). */
static int place_units(dist *d, void **all, size_t *len) {
    uint64_t *base = calloc(d->n_units ? d->n_units : 1, sizeof *base);
    buf mine = {0};
    int rc = base ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (rc) return stop_job(d, rc, "placing shards", -1);
    for (size_t i = 0; i < d->n_ran; i++) base[d->ran[i]] = tks_build_job_unit_shards(d->job, d->ran[i]);
    rc = coll(d, d->W->sum_u64(base, d->n_units, d->W->ctx));
    uint64_t at = 0; /* exclusive prefix sum, in place */
    for (size_t k = 0; !rc && k < d->n_units; k++) {
        uint64_t c = base[k];
        base[k] = at;
        at += c;
    }
    for (size_t i = 0; !rc && i < d->n_ran; i++) {
        void *r = NULL;
        size_t n = 0;
        rc = tks_build_job_place(d->job, d->ran[i], base[d->ran[i]], &r, &n);
        if (!rc) rc = tks__buf_append(&mine, r, n);
        free(r);
        if (rc) rc = stop_job(d, rc, "placing shards", (int64_t)d->ran[i]);
    }
    if (!rc && d->n_ran && (rc = tks_build_job_sync(d->job)) != 0) rc = stop_job(d, rc, "placing shards", -1);
    free(base);
    if (!rc) rc = coll(d, d->W->gather(mine.p, mine.len, all, len, d->W->ctx));
    free(mine.p);
    return rc;
}

/* The ranks' tallies, summed into rank 0's stats (hand-outs, kept units)
 * and *enc (the encoder statistics of every rank). */
static int gather_tallies(dist *d, tks_build_stats *st, tks_encoder_stats *enc) {
    _Static_assert(sizeof(tks_encoder_stats) % sizeof(uint64_t) == 0, "tks_encoder_stats holds uint64_t counts only");
    tally t = d->t, x;
    t.kept = d->mine[SLOT_KEPT];
    tks_build_job_encoder_stats(d->job, &t.enc);
    void *all = NULL;
    size_t len = 0;
    int rc = coll(d, d->W->gather(&t, sizeof t, &all, &len, d->W->ctx));
    if (rc || d->rank) {
        free(all);
        return rc;
    }
    memset(&t, 0, sizeof t);
    for (size_t at = 0; at + sizeof x <= len; at += sizeof x) {
        memcpy(&x, (const char *)all + at, sizeof x);
        t.ho_sum += x.ho_sum;
        t.ho_max = x.ho_max > t.ho_max ? x.ho_max : t.ho_max;
        t.ho_n += x.ho_n, t.kept += x.kept, t.kept_shards += x.kept_shards;
        uint64_t *e = (uint64_t *)&t.enc;
        const uint64_t *xe = (const uint64_t *)&x.enc;
        for (size_t i = 0; i < sizeof t.enc / sizeof *e; i++) e[i] += xe[i];
    }
    free(all);
    st->handouts = t.ho_n;
    st->handout_seconds_mean = t.ho_n ? t.ho_sum / (double)t.ho_n : 0;
    st->handout_seconds_max = t.ho_max;
    st->units_kept = t.kept;
    st->resumed_shards = t.kept_shards;
    *enc = t.enc;
    return 0;
}

/* Every unit built, placed and recorded: rank 0 writes the manifest, the
 * ranks remove their units' records, rank 0 publishes. */
static int finish_build(dist *d, tks_build_stats *stats) {
    double t = omp_get_wtime();
    void *all = NULL;
    size_t len = 0;
    tks_encoder_stats enc;
    int rc = place_units(d, &all, &len), rc0 = 0;
    double placed = omp_get_wtime() - t;
    if (!rc) rc = gather_tallies(d, stats, &enc);
    if (rc) {
        free(all);
        return rc;
    }
    rc = d->rank ? 0 : tks_build_job_finish(d->job, all, len, stats);
    if (!d->rank) stats->encoder_stats = enc; /* every rank's, not rank 0's tokenizer's alone */
    free(all);
    int c = from_rank0(d, rc, &rc0);
    if (c) return c;
    if (rc0) return rc ? rc : tks_fail(rc0, d->partial, TKS_NONE, TKS_NONE,
                                       "rank %d: rank 0 could not finish the build (see its message)", d->rank);
    for (size_t i = 0; i < d->n_ran; i++) tks_build_job_clean(d->job, d->ran[i]);
    if ((c = coll(d, d->W->barrier(NULL, NULL, d->W->ctx)))) return c;
    if (!d->rank) {
        rc = tks_build_job_publish(d->job);
        stats->place_seconds = placed;
    }
    if ((c = from_rank0(d, rc, &rc0))) return c;
    if (rc0 && !rc)
        rc = tks_fail(rc0, d->partial, TKS_NONE, TKS_NONE,
                      "rank %d: rank 0 could not publish the build (see its message)", d->rank);
    return rc;
}

/* The units, taken until none is left, then (every rank done: rank 0
 * prints the progress while it waits) placed and published. */
static int run_units(dist *d, tks_build_stats *stats) {
    d->units = tks_build_job_units(d->job, &d->n_units);
    d->order = tks_build_job_order(d->job);
    for (size_t k = 0; k < d->n_units; k++) d->total_bytes += d->units[k].bytes;
    const tks_build_world *W = d->W;
    int rc = coll(d, W->shared_open(1 + (size_t)SLOTS * (size_t)d->size, W->ctx));
    if (rc) return rc;
    rc = take_units(d);
    if (!rc) rc = coll(d, W->barrier(on_wait, d, W->ctx));
    if (!rc) show_progress(d, 1);
    W->shared_close(W->ctx);
    return rc ? rc : finish_build(d, stats);
}

/* Rank 0 found OUT.partial complete (the interrupted run wrote the manifest
 * but did not publish): it publishes, the others wait for its result. */
static int publish_complete(dist *d, tks_build_stats *stats) {
    int rc = d->rank ? 0 : tks__publish_complete(d->job, stats), rc0 = 0, c = from_rank0(d, rc, &rc0);
    if (c) return c;
    if (rc0 && !rc)
        rc = tks_fail(rc0, d->partial, TKS_NONE, TKS_NONE,
                      "rank %d: rank 0 could not publish the build (see its message)", d->rank);
    return rc;
}

int tks_build_spread(const tks_build_opts *opts, const tks_build_world *world, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    if (!world || world->size <= 1) return tks_build(opts, stats);
    memset(stats, 0, sizeof *stats);
    dist d = {.W = world, .rank = world->rank, .size = world->size, .t0 = omp_get_wtime()};
    d.last_print = d.t0; /* the first line 2 s after the start */
    tks_build_opts o = *opts;
    o.progress = d.rank == 0 ? on_batch : NULL;
    o.progress_ctx = &d;
    o.stop = NULL;
    const char *out = o.out_dir ? o.out_dir : "";
    char dir[PATH_MAX];
    if (snprintf(d.partial, sizeof d.partial, "%s.partial", out) >= (int)sizeof d.partial ||
        snprintf(dir, sizeof dir, "%s/%s", d.partial, IN_FLIGHT) >= (int)sizeof dir ||
        snprintf(d.flight, sizeof d.flight, "%s/rank-%05d", dir, d.rank) >= (int)sizeof d.flight)
        return tks_fail(TKS_ERR_ARG, out, TKS_NONE, TKS_NONE, "--output path too long");
    int rc = open_jobs(&o, &d), done = 0;
    if (!rc) { /* a partial already complete: nothing to build */
        done = d.rank == 0 && d.job->complete;
        rc = coll(&d, world->bcast(&done, sizeof done, world->ctx));
        if (!rc && done) rc = publish_complete(&d, stats);
    }
    if (!rc && !done) {
        if (d.rank == 0) clear_in_flight(dir);
        (void)mkdir(dir, 0755); /* only a report: EEXIST, or none */
        rc = run_units(&d, stats);
        if (d.rank == 0) stats->seconds = omp_get_wtime() - d.t0;
    }
    free(d.ran);
    tks_build_job_free(d.job);
    return rc;
}
