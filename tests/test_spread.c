/*
 * test_spread.c - the build and the audit spread over a world of processes
 * (tks_build_spread, tokenize.h; tks_audit_spread, dataset.h) without MPI:
 * a fake world whose ranks are threads sharing memory. The dataset built by
 * 2 and 3 ranks must equal tks_build's byte for byte (every file), and the
 * audit of 3 ranks must report what tks_audit reports, on a clean dataset
 * and on one with damaged shards; a packed audit report reads back whole.
 *
 * Usage: test_spread WORK_DIR   (emptied and recreated)
 * Exit status 0 only when every check passed.
 */
#define _GNU_SOURCE

#include "tests/check.h"
#include "dataset/dataset.h"
#include "tokenize/tokenize.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define U(x) ((unsigned long long)(x))
#define MAX_RANKS 4

static const char *W; /* work dir */

static const char *wpath(char *out, const char *name) {
    snprintf(out, 4096, "%s/%s", W, name);
    return out;
}

/* ---- the inputs: a byte-level tokenizer and generated text ------------------ */

static void base64(const unsigned char *in, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        *out++ = a[v >> 18 & 63];
        *out++ = a[v >> 12 & 63];
        *out++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *out++ = i + 2 < n ? a[v & 63] : '=';
    }
    *out = 0;
}

/* A tiktoken ranks file of the 256 bytes (one token each). */
static int write_tokenizer(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < 256; i++) {
        unsigned char b = (unsigned char)i;
        char enc[8];
        base64(&b, 1, enc);
        fprintf(f, "%s %d\n", enc, i);
    }
    return fclose(f);
}

/* `bytes` of paragraphs of words (a fixed generator: the same text on every run). */
static int write_text(const char *path, size_t bytes, uint64_t seed) {
    static const char *words[] = {"the", "dataset", "shard", "token", "unit", "rank", "of", "a", "build",
                                  "and", "window", "über", "naïve", "données", "листинг", "合并"};
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t n = 0; n < bytes;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *w = words[x % (sizeof words / sizeof *words)];
        int sep = x >> 40 & 63;
        n += (size_t)fprintf(f, "%s%s", w, sep == 0 ? "\n\n" : sep < 6 ? "\n" : " ");
    }
    return fclose(f);
}

/* ---- a fake world: ranks as threads ---------------------------------------- */

typedef struct fake {
    int size;
    pthread_barrier_t bar;
    const void *part[MAX_RANKS]; /* each rank's contribution to the current collective */
    size_t len[MAX_RANKS];
    uint64_t *shared;
    int progress_calls;
    tks_build_world_progress last;
} fake;

typedef struct frank {
    fake *f;
    int rank;
} frank;

static void sync_all(fake *f) { pthread_barrier_wait(&f->bar); }

static int f_bcast(void *p, size_t n, void *ctx) {
    frank *r = ctx;
    r->f->part[r->rank] = p;
    sync_all(r->f);
    if (r->rank) memcpy(p, r->f->part[0], n);
    sync_all(r->f);
    return 0;
}

static int f_gather(const void *mine, size_t n, void **all, size_t *len, void *ctx) {
    frank *r = ctx;
    fake *f = r->f;
    f->part[r->rank] = mine;
    f->len[r->rank] = n;
    sync_all(f);
    *all = NULL;
    *len = 0;
    if (r->rank == 0) {
        size_t total = 0;
        for (int k = 0; k < f->size; k++) total += f->len[k];
        char *p = malloc(total ? total : 1);
        for (int k = 0; p && k < f->size; k++) {
            if (f->len[k]) memcpy(p + *len, f->part[k], f->len[k]);
            *len += f->len[k];
        }
        *all = p;
    }
    sync_all(f);
    return *all || r->rank ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
}

/* elementwise max (op 0) of ints or sum (op 1) of uint64_t, in place */
static int reduce(frank *r, void *v, size_t n, int op) {
    fake *f = r->f;
    f->part[r->rank] = v;
    sync_all(f);
    uint64_t *acc = calloc(n ? n : 1, sizeof *acc);
    int *imax = calloc(n ? n : 1, sizeof *imax);
    for (size_t i = 0; acc && imax && i < n; i++)
        for (int k = 0; k < f->size; k++) {
            if (op) acc[i] += ((const uint64_t *)f->part[k])[i];
            else imax[i] = k == 0 || ((const int *)f->part[k])[i] > imax[i] ? ((const int *)f->part[k])[i] : imax[i];
        }
    sync_all(f);
    if (acc && imax) memcpy(v, op ? (void *)acc : (void *)imax, n * (op ? sizeof *acc : sizeof *imax));
    int ok = acc && imax;
    free(acc);
    free(imax);
    sync_all(f);
    return ok ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
}

static int f_max_int(int *v, size_t n, void *ctx) { return reduce(ctx, v, n, 0); }
static int f_sum_u64(uint64_t *v, size_t n, void *ctx) { return reduce(ctx, v, n, 1); }

static int f_barrier(void (*wait)(void *arg), void *arg, void *ctx) {
    frank *r = ctx;
    if (wait) wait(arg);
    sync_all(r->f);
    return 0;
}

static int f_shared_open(size_t n, void *ctx) {
    frank *r = ctx;
    if (r->rank == 0) r->f->shared = calloc(n, sizeof *r->f->shared);
    sync_all(r->f);
    return r->f->shared ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
}

static int f_fetch_add(size_t i, uint64_t v, uint64_t *old, void *ctx) {
    frank *r = ctx;
    *old = __atomic_fetch_add(&r->f->shared[i], v, __ATOMIC_SEQ_CST);
    return 0;
}

static int f_put(size_t i, const uint64_t *v, size_t n, void *ctx) {
    frank *r = ctx;
    for (size_t k = 0; k < n; k++) __atomic_store_n(&r->f->shared[i + k], v[k], __ATOMIC_SEQ_CST);
    return 0;
}

static int f_get(size_t i, uint64_t *v, size_t n, void *ctx) {
    frank *r = ctx;
    for (size_t k = 0; k < n; k++) v[k] = __atomic_load_n(&r->f->shared[i + k], __ATOMIC_SEQ_CST);
    return 0;
}

static void f_shared_close(void *ctx) {
    frank *r = ctx;
    sync_all(r->f);
    if (r->rank == 0) {
        free(r->f->shared);
        r->f->shared = NULL;
    }
    sync_all(r->f);
}

static void f_progress(const tks_build_world_progress *p, void *ctx) {
    frank *r = ctx;
    r->f->progress_calls++;
    r->f->last = *p;
    r->f->last.ranks = NULL;
}

static void f_fail(int64_t unit, const char *what, const char *partial, void *ctx) {
    frank *r = ctx;
    fprintf(stderr, "FAIL rank %d: unit %lld, %s, %s: %s\n", r->rank, (long long)unit, what ? what : "-", partial,
            tks_last_error()->message);
    abort(); /* the other ranks wait for this one */
}

typedef struct job {
    frank r;
    const tks_build_opts *o;
    tks_build_stats st;
    const char *audit_path;
    tks_audit_report *rep;
    int rc;
} job;

static void *build_main(void *arg) {
    job *j = arg;
    tks_build_world w = {.rank = j->r.rank, .size = j->r.f->size, .bcast = f_bcast, .gather = f_gather,
                         .max_int = f_max_int, .sum_u64 = f_sum_u64, .barrier = f_barrier,
                         .shared_open = f_shared_open, .fetch_add = f_fetch_add, .put = f_put, .get = f_get,
                         .shared_close = f_shared_close, .progress = f_progress, .fail = f_fail, .ctx = &j->r};
    j->rc = tks_build_spread(j->o, &w, &j->st);
    return NULL;
}

static void *audit_main(void *arg) {
    job *j = arg;
    tks_audit_world w = {.rank = j->r.rank, .size = j->r.f->size, .max_int = f_max_int, .gather = f_gather,
                         .ctx = &j->r};
    tks_audit_opts ao = {.threads = 1, .max_problems = 7};
    j->rc = tks_audit_spread(j->audit_path, &ao, &w, &j->rep);
    return NULL;
}

/* Runs main on `size` ranks; rank 0's job in *out (the others' rc must agree). */
static int run_world(int size, void *(*main)(void *), const tks_build_opts *o, const char *audit_path, job *out) {
    fake f = {.size = size};
    pthread_barrier_init(&f.bar, NULL, (unsigned)size);
    job j[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int k = 0; k < size; k++) {
        j[k] = (job){.r = {&f, k}, .o = o, .audit_path = audit_path};
        pthread_create(&th[k], NULL, main, &j[k]);
    }
    for (int k = 0; k < size; k++) pthread_join(th[k], NULL);
    for (int k = 1; k < size; k++) {
        CHECK(j[k].rc == j[0].rc, "rank %d rc %d, rank 0 rc %d", k, j[k].rc, j[0].rc);
        CHECK(!j[k].rep, "rank %d has a report", k);
        tks_audit_report_free(j[k].rep);
    }
    if (main == build_main && j[0].rc == 0) {
        CHECK(f.progress_calls > 0 && f.last.units == f.last.n_units && f.last.n_units > 3 && f.last.building == 0 &&
                  f.last.n_ranks == (size_t)size && f.last.bytes == f.last.total_bytes,
              "%d ranks: %d progress reports, the last %llu/%llu units, %llu building", size, f.progress_calls,
              U(f.last.units), U(f.last.n_units), U(f.last.building));
    }
    pthread_barrier_destroy(&f.bar);
    *out = j[0];
    return j[0].rc;
}

/* ---- checks ------------------------------------------------------------------ */

static long file_bytes(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(n > 0 ? (size_t)n : 1);
    if (!*out || fread(*out, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

/* Every file of dataset a equals b's of the same name, and b has no other. */
static void same_dataset(const char *a, const char *b, const char *what) {
    DIR *d = opendir(a);
    int files = 0, extra = -1;
    CHECK(d, "%s: cannot open %s", what, a);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char pa[4400], pb[4400], *x = NULL, *y = NULL;
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        long na = file_bytes(pa, &x), nb = file_bytes(pb, &y);
        CHECK(na >= 0 && na == nb && !memcmp(x, y, (size_t)na), "%s: %s differs (%ld and %ld bytes)", what,
              e->d_name, na, nb);
        free(x);
        free(y);
        files++;
    }
    if (d) closedir(d);
    if ((d = opendir(b))) {
        for (struct dirent *e; (e = readdir(d));) extra += e->d_name[0] != '.';
        closedir(d);
    }
    CHECK(files > 3 && extra + 1 == files, "%s: %d files in %s, %d in %s", what, files, a, extra + 1, b);
}

static void same_report(const tks_audit_report *a, const tks_audit_report *b, const char *what) {
    CHECK(a && b, "%s: no report", what);
    if (!a || !b) return;
    CHECK(a->n_problems == b->n_problems && a->n_problems_total == b->n_problems_total && a->n_shards == b->n_shards &&
              a->n_chunks == b->n_chunks && a->n_docs == b->n_docs && a->n_tokens == b->n_tokens &&
              a->bytes_hashed == b->bytes_hashed && a->vocab_size == b->vocab_size &&
              a->min_token_id == b->min_token_id && a->max_token_id == b->max_token_id &&
              a->manifest_checked == b->manifest_checked && a->tokenizer_checked == b->tokenizer_checked,
          "%s: counters differ (%llu/%llu problems, %llu/%llu tokens)", what, U(a->n_problems_total),
          U(b->n_problems_total), U(a->n_tokens), U(b->n_tokens));
    for (size_t i = 0; i < a->n_problems && i < b->n_problems; i++)
        CHECK(a->problems[i].code == b->problems[i].code && a->problems[i].shard == b->problems[i].shard &&
                  a->problems[i].byte_offset == b->problems[i].byte_offset &&
                  !strcmp(a->problems[i].message, b->problems[i].message),
              "%s: problem %zu: '%s' and '%s'", what, i, a->problems[i].message, b->problems[i].message);
}

static void pack_round_trip(const tks_audit_report *r) {
    void *bytes = NULL, *two = NULL;
    size_t len = 0, used = 0;
    tks_audit_report *back = NULL, *second = NULL;
    CHECK(tks_audit_report_pack(r, &bytes, &len) == 0, "pack: %s", tks_last_error()->message);
    two = malloc(2 * len);
    if (two) {
        memcpy(two, bytes, len);
        memcpy((char *)two + len, bytes, len);
    }
    CHECK(two && tks_audit_report_unpack(two, 2 * len, &used, &back) == 0 && used == len, "unpack: used %zu of %zu",
          used, len);
    CHECK(two && tks_audit_report_unpack((char *)two + used, 2 * len - used, &used, &second) == 0 && used == len,
          "unpack the second report");
    same_report(r, back, "packed and unpacked");
    same_report(r, second, "the second packed report");
    tks_audit_report *none = NULL;
    CHECK(tks_audit_report_unpack(bytes, len - 1, &used, &none) == TKS_ERR_ARG && !none, "a cut report refused");
    CHECK(tks_audit_report_unpack("TKSAUDR0", 8, &used, &none) == TKS_ERR_ARG && !none, "not a report refused");
    tks_clear_error();
    tks_audit_report_free(back);
    tks_audit_report_free(second);
    free(bytes);
    free(two);
}

/* Flips the byte at `at` of the file at path. */
static void flip(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    CHECK(f, "open %s", path);
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(255 - c, f);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_spread WORK_DIR\n");
        return 2;
    }
    W = argv[1];
    char cmd[4200], p[8][4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/in/docs'", W, W);
    if (system(cmd) != 0) return 2;
    CHECK(write_tokenizer(wpath(p[0], "bytes.tiktoken")) == 0, "tokenizer");
    CHECK(write_text(wpath(p[1], "in/a-big.txt"), 300000, 1) == 0, "text");
    CHECK(write_text(wpath(p[1], "in/b-mid.txt"), 90000, 2) == 0, "text");
    for (int i = 0; i < 12; i++) {
        char name[64];
        snprintf(name, sizeof name, "in/docs/d%02d.txt", i);
        CHECK(write_text(wpath(p[1], name), 2000 + 700 * (size_t)i, 10 + (uint64_t)i) == 0, "text %d", i);
    }
    const char *inputs[] = {wpath(p[2], "in")};
    tks_build_opts o;
    tks_build_opts_default(&o);
    o.tokenizer_path = p[0];
    o.pattern = "gpt2";
    o.inputs = inputs;
    o.n_inputs = 1;
    o.input.split = TKS_SPLIT_BLANK;
    o.threads = 1;
    o.shard_tokens = 20000;
    o.chunk_bytes = 4096;
    o.unit_bytes = 65536; /* the least (TKS_MIN_UNIT_BYTES): several units of the 300 KB file */
    o.out_dir = wpath(p[3], "ref");
    tks_build_stats st;
    CHECK(tks_build(&o, &st) == 0, "single process: %s", tks_last_error()->message);
    CHECK(st.units > 3 && st.shards > 10, "reference: %llu units, %llu shards", U(st.units), U(st.shards));

    job j;
    const char *names[] = {NULL, NULL, "two", "three"};
    for (int size = 2; size <= 3; size++) {
        o.out_dir = wpath(p[4], names[size]);
        CHECK(run_world(size, build_main, &o, NULL, &j) == 0, "%d ranks: %s", size, tks_last_error()->message);
        CHECK(j.st.shards == st.shards && j.st.tokens_written == st.tokens_written && j.st.units_kept == 0 &&
                  j.st.handouts == st.units + (uint64_t)size,
              "%d ranks: %llu shards, %llu tokens, %llu hand-outs (units %llu)", size, U(j.st.shards),
              U(j.st.tokens_written), U(j.st.handouts), U(st.units));
        same_dataset(p[3], p[4], names[size]);
    }

    /* a world of 1 is the single process */
    tks_audit_report *one = NULL;
    CHECK(tks_audit(p[3], &(tks_audit_opts){.threads = 1, .max_problems = 7}, &one) == 0, "audit");
    CHECK(one && one->n_problems_total == 0 && one->manifest_checked, "the reference audits clean");
    CHECK(run_world(3, audit_main, NULL, p[3], &j) == 0, "audit, 3 ranks: %s", tks_last_error()->message);
    same_report(one, j.rep, "clean, 3 ranks");
    tks_audit_report_free(j.rep);
    tks_audit_report_free(one);

    /* damaged shards: the first and the last of "three", a byte in each */
    char shard[4200];
    snprintf(shard, sizeof shard, "%s/shard-00000.tks", p[4]);
    flip(shard, 300);
    snprintf(shard, sizeof shard, "%s/shard-%05llu.tks", p[4], U(st.shards - 1));
    flip(shard, 400);
    CHECK(tks_audit(p[4], &(tks_audit_opts){.threads = 1, .max_problems = 7}, &one) == 0, "audit");
    CHECK(one && one->n_problems_total >= 2, "the damage is found: %llu problems", U(one ? one->n_problems_total : 0));
    CHECK(run_world(3, audit_main, NULL, p[4], &j) == 0, "audit, 3 ranks: %s", tks_last_error()->message);
    same_report(one, j.rep, "damaged, 3 ranks");
    pack_round_trip(one);
    tks_audit_report_free(j.rep);
    tks_audit_report_free(one);

    /* a path that does not exist: every rank fails */
    CHECK(run_world(2, audit_main, NULL, wpath(p[5], "nowhere"), &j) == TKS_ERR_IO && !j.rep, "missing path");
    return check_exit("test_spread");
}
