/* wunit.c - counting the words of one work unit for byte-level BPE
 * training (pipeline.h, "Counting words"): the unit's ranges read in
 * batches on a reader thread (batch.c's prefetch), JSON Lines records
 * decoded and every document cut into pieces (tks_pretok) on all threads,
 * each thread counting into its own table (wtab.c), spilled as a run when
 * full and at the unit's end. Which thread counts what changes the runs,
 * never the sum of their counts. */
#define _GNU_SOURCE
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/pipeline/pipeline.h"

/* One thread's share of a batch. */
typedef struct tcount {
    tks__wcount *c;
    int tid;
    uint64_t pieces, short_pieces;
} tcount;

/* The next run's path for unit c->unit into path[cap]. */
static int run_path(tks__wcount *c, char *path, size_t cap) {
    unsigned s = __atomic_fetch_add(&c->next_run, 1, __ATOMIC_RELAXED);
    char name[48];
    snprintf(name, sizeof name, "run-%05llu-%04u.cnt", (unsigned long long)c->unit, s);
    return tks_path_join(path, cap, c->dir, name);
}

/* Thread tid's table written as a run, its name added to c's list. */
static int spill(tks__wcount *c, int tid) {
    char path[PATH_MAX];
    int rc = run_path(c, path, sizeof path);
    if (!rc) rc = tks__wtab_spill(&c->tabs[tid], path, c->run_buf);
    if (rc) return rc;
    const char *base = strrchr(path, '/');
    char *name = strdup(base ? base + 1 : path);
    if (!name) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    int nomem = 0;
#pragma omp critical(tks_wcount_runs)
    {
        if (c->n_runs == c->runs_cap) {
            size_t cap = c->runs_cap ? 2 * c->runs_cap : 16;
            if (tks_resize(&c->runs, cap, sizeof *c->runs)) nomem = 1;
            else c->runs_cap = cap;
        }
        if (!nomem) c->runs[c->n_runs++] = name;
    }
    if (nomem) {
        free(name);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    return 0;
}

/* tks_pretok_fn: each piece of two bytes or more into the thread's table
 * (single bytes hold no pair: counted, not kept). */
static int on_pieces(void *ctx, const char *t, size_t start, const size_t *ends, size_t n) {
    tcount *tc = ctx;
    tks__wtab *tab = &tc->c->tabs[tc->tid];
    size_t a = start;
    for (size_t k = 0; k < n; a = ends[k++]) {
        size_t len = ends[k] - a;
        if (len < 2) {
            tc->short_pieces++;
            continue;
        }
        uint64_t h = tks__wtab_hash(t + a, len);
        int rc = tks__wtab_add(tab, t + a, len, h);
        if (rc == 1 && !(rc = spill(tc->c, tc->tid))) rc = tks__wtab_add(tab, t + a, len, h);
        if (rc) return rc < 0 ? rc : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "word table full");
    }
    tc->pieces += n;
    return 0;
}

/* Document i of batch b: decoded when it is a JSONL record (its status set;
 * a bad, long or empty one is left to the policies), then counted. */
static int count_doc(tcount *tc, batch *b, size_t i, const tks_input *in) {
    const char *text;
    size_t len;
    json_t *root;
    if (!tks__doc_text(b, i, in->jsonl_key, in->max_doc, &root, &text, &len)) return 0;
    int rc = tks_pretok_pieces(tc->c->pt, text, len, on_pieces, tc);
    json_decref(root);
    return rc;
}

/* A document at least this long, when there are several threads and the
 * pattern admits cuts (tks_pretok_next_cut: the pieces of the parts are
 * the pieces of the whole), is cut into parts of at least PART_MIN bytes,
 * about 16 a thread, that every thread counts: Linux's tree as JSON Lines
 * has 87 records over 1 MB, a quarter of its text (register headers of up
 * to 24 MB), which one thread alone would count while the others wait. */
#define LONG_DOC (1u << 20)
#define PART_MIN (128u << 10)

static int first_error(int *any, tks_error *first) {
    int rc = 0;
#pragma omp critical(tks_wcount_err)
    if (!*any) {
        *any = 1;
        *first = *tks_last_error();
        rc = first->code ? first->code : TKS_ERR_TOKENIZER;
    }
    return rc;
}

/* Document i of batch b (decoded here when a record) counted in parts on
 * every thread. */
static int count_long(tks__wcount *c, batch *b, size_t i, const tks_input *in) {
    const char *text;
    size_t len, *cut = NULL, n = 0, cap = 0, want = b->len[i] / ((size_t)c->threads * 16);
    json_t *root;
    if (!tks__doc_text(b, i, in->jsonl_key, in->max_doc, &root, &text, &len)) return 0;
    if (want < PART_MIN) want = PART_MIN;
    int rc = 0;
    for (size_t at = 0;;) { /* the parts' starts, then len */
        if (n + 2 > cap) {
            cap = cap ? 2 * cap : 64;
            if (tks_resize(&cut, cap, sizeof *cut)) {
                rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
                break;
            }
        }
        cut[n++] = at;
        size_t next = len - at > want + want / 2 ? tks_pretok_next_cut(c->pt, text, len, at + want) : 0;
        if (!next) break;
        at = next;
    }
    if (rc) {
        json_decref(root);
        free(cut);
        return rc;
    }
    cut[n] = len;
    int any = 0;
    tks_error first = {0};
    uint64_t pieces = 0, shorts = 0;
#pragma omp parallel num_threads(c->threads) reduction(+ : pieces, shorts)
    {
        tcount tc = {c, omp_get_thread_num(), 0, 0};
        int e = 0;
#pragma omp for schedule(dynamic, 1)
        for (size_t k = 0; k < n; k++)
            if (!e && (e = tks_pretok_pieces(c->pt, text + cut[k], cut[k + 1] - cut[k], on_pieces, &tc))) first_error(&any, &first);
        pieces += tc.pieces;
        shorts += tc.short_pieces;
    }
    c->pieces += pieces;
    c->short_pieces += shorts;
    json_decref(root);
    free(cut);
    if (!any) return 0;
    tks_error_restore(&first);
    return first.code ? first.code : TKS_ERR_TOKENIZER;
}

/* A batch's documents counted on every thread: the long ones first,
 * longest first (from LONG_DOC bytes on, each in parts on every thread),
 * then the others in runs. 0 or the first error. */
static int count_batch(tks__wcount *c, batch *b, const tks_input *in) {
    size_t nl = 0;
    for (size_t i = 0; i < b->n; i++)
        if (b->len[i] > (64u << 10)) b->order[nl++] = i;
    for (size_t i = 0, k = nl; i < b->n; i++)
        if (b->len[i] <= (64u << 10)) b->order[k++] = i;
    for (size_t i = 1; i < nl; i++) /* few: insertion sort, longest first */
        for (size_t j = i; j > 0 && b->len[b->order[j]] > b->len[b->order[j - 1]]; j--) {
            size_t x = b->order[j];
            b->order[j] = b->order[j - 1];
            b->order[j - 1] = x;
        }
    size_t lead = 0;
    int rc = 0;
    if (c->threads > 1 && tks_pretok_hand_matched(c->pt))
        for (; !rc && lead < nl && b->len[b->order[lead]] >= LONG_DOC; lead++) rc = count_long(c, b, b->order[lead], in);
    if (rc) return rc;
    int any = 0;
    tks_error first = {0};
    size_t per = b->n / ((size_t)c->threads * 64) + 1;
    uint64_t pieces = 0, shorts = 0;
#pragma omp parallel num_threads(c->threads) reduction(+ : pieces, shorts)
    {
        tcount tc = {c, omp_get_thread_num(), 0, 0};
        int e = 0;
#pragma omp for schedule(dynamic, 1) nowait
        for (size_t k = lead; k < nl; k++)
            if (!e && (e = count_doc(&tc, b, b->order[k], in))) first_error(&any, &first);
#pragma omp for schedule(dynamic, per)
        for (size_t k = nl; k < b->n; k++)
            if (!e && (e = count_doc(&tc, b, b->order[k], in))) first_error(&any, &first);
        pieces += tc.pieces;
        shorts += tc.short_pieces;
    }
    c->pieces += pieces;
    c->short_pieces += shorts;
    if (!any) return 0;
    tks_error_restore(&first);
    return first.code ? first.code : TKS_ERR_TOKENIZER;
}

/* The records decoding left out, under their policies, in order. */
static int batch_policies(const tks_input *in, const batch *b, deferred *d) {
    for (size_t i = 0; i < b->n; i++) {
        if (!b->json[i] || b->status[i] == TKS_JSONL_OK) continue;
        int rc = tks__deferred_skip(in, b, i, d);
        if (rc) return rc;
    }
    return 0;
}

/* Test hook (builds with TKS_TEST_HOOKS): TOKSHARD_TEST_TRAIN_STOP=N stops
 * the process (SIGSTOP) once it has counted N batches, in whatever unit,
 * with the runs spilled so far on disk, so that a test can kill -9 it there
 * (the kill comes from the test, never from here). */
static void stop_point(void) {
#ifdef TKS_TEST_HOOKS
    static long batches = 0;
    const char *p = getenv("TOKSHARD_TEST_TRAIN_STOP");
    if (p && ++batches == atol(p)) raise(SIGSTOP);
#endif
}

/* Reads and counts the unit's batches. */
static int unit_batches(tks__wcount *c, tks_input *in, deferred *d) {
    int rc = 0, done = 0;
    reader rd = {.in = in, .batch_bytes = c->batch_bytes, .stop = c->stop};
    rd.fill = rd.batch_bytes / 8;
    prefetch pf = {.r = &rd};
    tks__prefetch_start(&pf);
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = tks__prefetch_next(&pf, &b))) break;
        done = b->end;
        rc = count_batch(c, b, in);
        if (!rc) rc = batch_policies(in, b, d);
        if (!rc) stop_point();
        if (!rc && c->progress) {
            c->prog.bytes_in = c->base.bytes_in + b->input.bytes_in;
            c->prog.bytes_text = c->base.bytes_text + b->text_seen;
            c->prog.docs = c->base.docs + b->docs_seen;
            c->prog.pieces = c->base.pieces + c->pieces;
            c->progress(&c->prog, c->progress_ctx);
        }
        tks__batch_trim(b, rd.batch_bytes);
        if (!rc && c->stop && *c->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, c->dir, TKS_NONE, TKS_NONE,
                          "interrupted while counting unit %llu: the units counted are kept in %s; run the "
                          "same command with --resume to go on",
                          (unsigned long long)c->unit, c->dir);
    }
    tks__prefetch_free(&pf);
    c->text_bytes = rd.text;
    return rc;
}

int tks__wunit_count(const tks_input *ls, const tks__plan *plan, uint64_t unit_bytes, tks__wcount *c,
                     tks_input_stats *st) {
    tks__range *r = NULL;
    size_t nr = 0;
    tks_input *in = NULL;
    deferred d = {0};
    c->next_run = 0;
    c->pieces = c->short_pieces = 0;
    int rc = tks__unit_ranges(ls, plan, c->unit, unit_bytes, &r, &nr);
    if (!rc) rc = tks__input_view(ls, r, nr, c->stop, &in);
    if (!rc) rc = unit_batches(c, in, &d);
    if (!rc) { /* every table's last run, each sorted and written on a thread of its own */
        int any = 0;
        tks_error first = {0};
#pragma omp parallel for num_threads(c->threads) schedule(dynamic, 1)
        for (int k = 0; k < c->threads; k++)
            if (c->tabs[k].used && spill(c, k)) first_error(&any, &first);
        if (any) tks_error_restore(&first), rc = first.code ? first.code : TKS_ERR_IO;
    }
    if (!rc) {
        *st = *tks_input_get_stats(in);
        st->docs -= d.skipped;
        st->bad_records_skipped += d.bad;
        st->long_skipped += d.too_long;
        st->empty_skipped += d.empty;
    }
    tks_input_free(in);
    free(r);
    return rc;
}
