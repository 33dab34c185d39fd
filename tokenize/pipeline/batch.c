/* batch.c - the build's stages between the input and the writer: documents
 * read into batches on a reader thread (prefetch), encoded in parallel, and
 * BOS/EOS added; tks_build and the work units drive them (tokenize/internal.h). */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/tks_first_error.h"
#include "tokenize/pipeline/pipeline.h"

static int by_len_desc(const void *a, const void *b, void *len);

static int batch_push(batch *b, const tks_doc *d) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        if (tks_resize(&b->off, cap, sizeof *b->off) || tks_resize(&b->len, cap, sizeof *b->len) ||
            tks_resize(&b->ordinal, cap, sizeof *b->ordinal) ||
            tks_resize(&b->order, cap, sizeof *b->order) || tks_resize(&b->err, cap, sizeof *b->err) ||
            tks_resize(&b->ids, cap, sizeof *b->ids) || tks_resize(&b->json, cap, sizeof *b->json) ||
            tks_resize(&b->status, cap, sizeof *b->status) || tks_resize(&b->done, cap, sizeof *b->done) ||
            tks_resize(&b->line, cap, sizeof *b->line) || tks_resize(&b->unassigned, cap, sizeof *b->unassigned) ||
            tks_resize(&b->src, cap, sizeof *b->src) || tks_resize(&b->prov, cap, sizeof *b->prov))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        memset(b->ids + b->cap, 0, (cap - b->cap) * sizeof *b->ids);
        b->cap = cap;
    }
    if (b->arena_len + d->len > b->arena_cap) {
        size_t cap = b->arena_cap ? b->arena_cap : (1u << 20);
        while (cap < b->arena_len + d->len) cap *= 2;
        char *a = realloc(b->arena, cap);
        if (!a) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        b->arena = a;
        b->arena_cap = cap;
    }
    if (!b->n_srcs || strcmp(b->srcs[b->n_srcs - 1], d->source ? d->source : "")) {
        if (b->n_srcs == b->srcs_cap) {
            size_t cap = b->srcs_cap ? 2 * b->srcs_cap : 16;
            if (tks_resize(&b->srcs, cap, sizeof *b->srcs))
                return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
            b->srcs_cap = cap;
        }
        if (!(b->srcs[b->n_srcs] = strdup(d->source ? d->source : "")))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        b->n_srcs++;
    }
    memcpy(b->arena + b->arena_len, d->text, d->len);
    b->off[b->n] = b->arena_len;
    b->len[b->n] = d->len;
    b->ordinal[b->n] = d->ordinal;
    b->json[b->n] = (uint8_t)d->json;
    b->status[b->n] = TKS_JSONL_OK;
    b->unassigned[b->n] = 0;
    b->line[b->n] = d->line;
    b->src[b->n] = (uint32_t)(b->n_srcs - 1);
    b->prov[b->n] = (tks_doc_prov){(uint32_t)d->file, d->entry, d->offset,
                                   d->raw_len < UINT32_MAX ? (uint32_t)d->raw_len : UINT32_MAX, 0};
    b->arena_len += d->len;
    b->n++;
    return 0;
}

static void srcs_clear(batch *b) {
    for (size_t i = 0; i < b->n_srcs; i++) free(b->srcs[i]);
    b->n_srcs = 0;
}

static void batch_free(batch *b) {
    srcs_clear(b);
    free(b->srcs);
    free(b->json);
    free(b->status);
    free(b->done);
    free(b->line);
    free(b->unassigned);
    free(b->src);
    free(b->prov);
    for (size_t i = 0; i < b->cap; i++) tks_ids_free(&b->ids[i]);
    free(b->arena);
    free(b->off);
    free(b->len);
    free(b->ordinal);
    free(b->order);
    free(b->ids);
    free(b->err);
}

static int fill_batch(reader *r, batch *b);

static void *prefetch_main(void *arg) {
    prefetch *p = arg;
    batch *b = &p->slot[p->next];
    b->n = 0;
    b->arena_len = 0;
    b->end = 0;
    p->rc = fill_batch(p->r, b);
    if (p->rc) p->err = *tks_last_error();
    return NULL;
}

/* Starts reading the next batch; without a thread (pthread_create failed)
 * it is read here. */
void tks__prefetch_start(prefetch *p) {
    p->rc = 0;
    if (pthread_create(&p->th, NULL, prefetch_main, p) == 0)
        p->running = 1;
    else
        prefetch_main(p);
}

/* Waits for the batch prefetch_start began: 0 and *out, or the reader's
 * error (restored on this thread). *out stays the caller's until the next
 * prefetch_take. */
int tks__prefetch_take(prefetch *p, batch **out) {
    if (p->running) pthread_join(p->th, NULL);
    p->running = 0;
    if (p->rc) {
        tks_error_restore(&p->err);
        return p->rc;
    }
    *out = &p->slot[p->next];
    p->next ^= 1;
    return 0;
}

int tks__prefetch_next(prefetch *p, batch **out) {
    int rc = tks__prefetch_take(p, out);
    if (!rc && !(*out)->end) tks__prefetch_start(p);
    return rc;
}

/* Called by the caller once a batch is committed, before the next
 * prefetch_take: what the batch grew is freed now, not when the slot is
 * refilled. A slot keeps, for its next batch, id buffers of up to 64 KiB
 * each and batch_bytes in all, and an arena of up to twice batch_bytes.
 * A bound per buffer alone is not enough: each of the thousands of
 * documents of a batch then keeps the largest buffer its index ever held,
 * and RSS grows through the whole build (to 513 MiB on the Linux tarball
 * with two slots; 548 MiB with no bound at all). */
void tks__batch_trim(batch *b, size_t batch_bytes) {
    size_t kept = 0;
    for (size_t i = 0; i < b->cap; i++) {
        size_t bytes = b->ids[i].cap * sizeof(uint32_t);
        if (!bytes) continue;
        if (bytes <= (64u << 10) && kept + bytes <= batch_bytes)
            kept += bytes;
        else
            tks_ids_free(&b->ids[i]);
    }
    if (b->arena_cap > 2 * batch_bytes) {
        free(b->arena);
        b->arena = NULL;
        b->arena_cap = 0;
    }
    b->n = 0;
    b->arena_len = 0;
    srcs_clear(b);
}

/* Joins a reader still running (after an error or an interrupt) and frees
 * both batches. */
void tks__prefetch_free(prefetch *p) {
    if (p->running) pthread_join(p->th, NULL);
    p->running = 0;
    batch_free(&p->slot[0]);
    batch_free(&p->slot[1]);
}

static int fill_batch(reader *r, batch *b) {
    tks_doc doc;
    int rc = 0;
    size_t want = r->fill && r->fill < r->batch_bytes ? r->fill : r->batch_bytes;
    r->fill = 2 * want;
    while (!rc && b->arena_len < want && !(r->stop && *r->stop)) {
        int got = tks_input_next(r->in, &doc);
        if (got < 0) return got;
        if (got == 0) {
            b->end = 1;
            break;
        }
        r->docs_read++;
        r->text += doc.len;
        rc = batch_push(b, &doc);
    }
    b->docs_seen = r->docs_read;
    b->text_seen = r->text;
    b->input = *tks_input_get_stats(r->in);
    return rc;
}

/* A document at least this long, when the build has several threads, is
 * cut where the tokenizer proves the cut changes no id (tks_tok_next_cut:
 * the rule and its argument are in tokenizer/tokenizer.h) into parts of at
 * least PART_MIN bytes, about 32 a thread (the last to finish decides the
 * time), that every thread encodes; one
 * huge document (a minified file, a dump without newlines) then does not
 * leave the other threads idle. */
#define LONG_DOC (1u << 20)
#define PART_MIN (128u << 10)

static int push_cut(size_t **cut, size_t *n, size_t *cap, size_t at) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        if (tks_resize(cut, c, sizeof **cut)) return -1;
        *cap = c;
    }
    (*cut)[(*n)++] = at;
    return 0;
}

/* tks_tok_encode_doc of text[0..len) with its parts on `threads` threads:
 * the same ids and count of unassigned code points (*unassigned), and on
 * any error the whole document encoded again on this thread, so that the
 * error and its offset are the ones of the document. */
static int encode_long(const tks_tok *tk, const char *text, size_t len, int threads, tks_ids *out,
                       uint64_t *unassigned) {
    size_t want = len / ((size_t)threads * 32);
    if (want < PART_MIN) want = PART_MIN;
    size_t *cut = NULL, n = 0, cap = 0;
    int rc = push_cut(&cut, &n, &cap, 0);
    for (size_t at = 0; !rc && len - at > want + want / 2;) {
        size_t c = tks_tok_next_cut(tk, text, len, at + want);
        if (!c) break;
        rc = push_cut(&cut, &n, &cap, c);
        at = c;
    }
    if (!rc) rc = push_cut(&cut, &n, &cap, len);
    size_t parts = n - 1;
    tks_ids *part = NULL;
    uint64_t *un = NULL;
    int done = 0;
    if (!rc && parts > 1 && (part = calloc(parts, sizeof *part)) && (un = calloc(parts, sizeof *un))) {
        int bad = 0, grown = 1;
        size_t total = 0;
        uint64_t un_sum = 0;
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(dynamic, 1) reduction(| : bad)
            for (size_t k = 0; k < parts; k++) {
                /* room for a token every 2 bytes up front: a part's ids are
                 * not moved (and its pages not unmapped, which interrupts
                 * every thread) while it grows */
                size_t guess = (cut[k + 1] - cut[k]) / 2 + 64;
                if (part[k].cap < guess && !tks_resize(&part[k].ids, guess, sizeof *part[k].ids)) part[k].cap = guess;
                bad |= tks_tok_encode_part(tk, text + cut[k], cut[k + 1] - cut[k], &part[k], &un[k]) != 0;
            }
#pragma omp single
            {
                for (size_t k = 0; k < parts; k++) total += part[k].n, un_sum += un[k];
                if (!bad && out->cap < total) {
                    uint32_t *p = realloc(out->ids, total * sizeof *p);
                    if (p) out->ids = p, out->cap = total;
                }
                grown = !bad && out->cap >= total;
            }
            /* the parts copied into place on every thread */
#pragma omp for schedule(dynamic, 1)
            for (size_t k = 0; k < parts; k++) {
                if (!grown || !part[k].n) continue;
                size_t at = 0;
                for (size_t j = 0; j < k; j++) at += part[j].n;
                memcpy(out->ids + at, part[k].ids, part[k].n * sizeof *out->ids);
            }
        }
        if (grown) {
            out->n = total;
            tks_tok_count_doc(tk, un_sum, parts);
            *unassigned = un_sum;
            done = 1;
        }
        for (size_t k = 0; k < parts; k++) tks_ids_free(&part[k]);
    }
    free(part);
    free(un);
    free(cut);
    /* no cut, no memory for the parts, or a part failed: the whole, here */
    return done ? 0 : tks_tok_encode_doc(tk, text, len, out, unassigned);
}

int tks__doc_text(batch *b, size_t i, const char *key, uint64_t max_doc, json_t **root, const char **text,
                  size_t *len) {
    *text = b->arena + b->off[i];
    *len = b->len[i];
    *root = NULL;
    if (!b->json[i]) return 1;
    char why[8];
    b->status[i] = (uint8_t)tks_jsonl_decode(*text, *len, key, max_doc, root, text, len, why, sizeof why);
    return b->status[i] == TKS_JSONL_OK;
}

/* Document i finished: its ids, err and status are final (release order,
 * for the drain on thread 0). */
static void mark_done(batch *b, size_t i) { __atomic_store_n(&b->done[i], 1, __ATOMIC_RELEASE); }

/* Document i of the batch encoded from this thread (in parts on `threads`
 * threads when more than one: encode_long), its flag set: 0 or its error
 * (its context in this thread's last error). */
static int encode_one(tks_tok *tk, batch *b, size_t i, const char *key, uint64_t max_doc, int threads) {
    const char *text;
    size_t len;
    json_t *root;
    int e = 0;
    if (tks__doc_text(b, i, key, max_doc, &root, &text, &len)) { /* decoded on this thread */
        uint64_t *un = &b->unassigned[i];
        b->prov[i].text_xxh = (uint32_t)XXH3_64bits(text, len); /* the text as encoded */
        e = threads > 1 ? encode_long(tk, text, len, threads, &b->ids[i], un)
                        : tks_tok_encode_doc(tk, text, len, &b->ids[i], un);
        json_decref(root);
        b->err[i] = e;
    } else { /* a bad, too long or empty record: nothing to encode */
        b->ids[i].n = 0;
        b->err[i] = 0;
    }
    mark_done(b, i);
    return e;
}

/* A document longer than this, when a batch has one, is encoded before the
 * others, longest first: one such document started last would keep its
 * thread busy after the others finish. */
#define LONGISH (64u << 10)

/* The first error of a batch is kept in input order (tks_first_error, at
 * the document's index); the drain's errors come first: the drain writes a
 * document only when every document before it was encoded without error. */
#define DRAIN_ERR 0 /* the place of a drain's error: before every document's */

/* Document i encoded on this thread (encode_one) unless an error is recorded
 * before it; its error recorded. 1: encoded without error. */
static int encode_unless_past(tks_first_error *f, tks_tok *tk, batch *b, size_t i, const char *key, uint64_t max_doc,
                              int threads) {
    if (tks_first_error_before(f, i)) return 0;
    if (encode_one(tk, b, i, key, max_doc, threads)) {
        tks_first_error_note(f, i);
        return 0;
    }
    return 1;
}

/* Tokenizes the batch in parallel: documents of over LONGISH bytes first,
 * longest first (each one of LONG_DOC bytes or more on every thread, in
 * parts), then the others in input order, in runs (a sort of them all, the
 * scattered reads it causes and a hand-off per document cost 5-8% of a
 * build of short lines; and in input order the caller's drain, on thread 0,
 * writes the finished documents while the others are encoded). 0 or the
 * first error in input order (its context restored). */
int tks__encode_batch(tks_tok *tk, batch *b, size_t first, int threads, const char *key, uint64_t max_doc,
                      const tks__drain *drain) {
    size_t m = first < b->n ? b->n - first : 0, nl = 0;
    for (size_t i = 0; i < b->n; i++) b->done[i] = i < first;
    for (size_t i = first; i < b->n; i++)
        if (b->len[i] > LONGISH) b->order[nl++] = i;
    for (size_t i = first, k = nl; i < b->n; i++)
        if (b->len[i] <= LONGISH) b->order[k++] = i;
    if (nl > 1) {
        qsort_r(b->order, nl, sizeof *b->order, by_len_desc, b->len);
    }
    size_t per = (m - nl) / ((size_t)threads * 64) + 1;
    tks_first_error fe = TKS_FIRST_ERROR_NONE;
    /* the documents of LONG_DOC bytes or more lead, each on every thread */
    size_t lead = 0;
    for (; threads > 1 && lead < nl && b->len[b->order[lead]] >= LONG_DOC; lead++) {
        if (encode_unless_past(&fe, tk, b, b->order[lead], key, max_doc, threads) && drain &&
            drain->fn(drain->ctx, b))
            tks_first_error_note(&fe, DRAIN_ERR);
    }
    /* thread 0's: drain not failed yet. With one thread the caller writes
     * after the encoding: the writer's pass interleaved with the documents
     * cost a 1-thread build 3-4% (the two working sets evicting each other). */
    int drain_on = drain && threads > 1 && fe.at == UINT64_MAX;
#pragma omp parallel num_threads(threads) firstprivate(drain_on)
    {
        size_t mine = 0;
#pragma omp for schedule(dynamic, 1) nowait
        for (size_t k = lead; k < nl; k++) {
            if (!encode_unless_past(&fe, tk, b, b->order[k], key, max_doc, 1)) continue;
            /* drain after each of thread 0's long documents */
            if (drain_on && omp_get_thread_num() == 0 && drain->fn(drain->ctx, b)) {
                tks_first_error_note(&fe, DRAIN_ERR);
                drain_on = 0;
            }
        }
#pragma omp for schedule(dynamic, per)
        for (size_t k = nl; k < m; k++) {
            if (!encode_unless_past(&fe, tk, b, b->order[k], key, max_doc, 1)) continue;
            /* at the end of each of thread 0's runs (per documents each) */
            if (drain_on && ++mine % per == 0 && omp_get_thread_num() == 0 && drain->fn(drain->ctx, b)) {
                tks_first_error_note(&fe, DRAIN_ERR);
                drain_on = 0;
            }
        }
    }
    return tks_first_error_result(&fe, TKS_ERR_TOKENIZER);
}

/* The policy for record i of batch b, which decoding found bad, too long
 * or empty: 0 (skipped and counted) or the error the reader would have
 * given. */
int tks__deferred_skip(const tks_input *in, const batch *b, size_t i, deferred *d) {
    const char *src = b->srcs[b->src[i]];
    uint64_t line = b->line[i];
    if (b->status[i] == TKS_JSONL_BAD && in->opts.bad_record == TKS_POLICY_FAIL) {
        char why[400];
        json_t *root = NULL;
        const char *t;
        size_t n;
        tks_jsonl_decode(b->arena + b->off[i], b->len[i], in->jsonl_key, in->max_doc, &root, &t, &n, why, sizeof why);
        json_decref(root);
        int rc = tks_fail(TKS_ERR_JSONL, src, TKS_NONE, TKS_NONE, "%s:%llu: %s; fix the record or use "
                          "--on-bad-record skip", src, (unsigned long long)line, why);
        tks_error_set_doc(b->ordinal[i] - d->skipped, line);
        return rc;
    }
    if (b->status[i] == TKS_JSONL_LONG && in->opts.long_doc == TKS_POLICY_FAIL) {
        int rc = tks_fail(TKS_ERR_DOC_TOO_LONG, src, TKS_NONE, TKS_NONE,
                          "%s:%llu: document longer than the limit of %llu bytes; raise --max-doc-bytes or use "
                          "--on-long-doc skip", src, (unsigned long long)line, (unsigned long long)in->max_doc);
        tks_error_set_doc(b->ordinal[i] - d->skipped, line);
        return rc;
    }
    d->skipped++;
    if (b->status[i] == TKS_JSONL_BAD) d->bad++;
    else if (b->status[i] == TKS_JSONL_LONG) d->too_long++;
    else d->empty++;
    return 0;
}

/* Adds BOS/EOS as asked. 0 or TKS_ERR_NOMEM. */
int tks__add_specials(tks_ids *v, const tks_build_opts *o, uint32_t bos, uint32_t eos) {
    if (!o->prepend_bos && !o->append_eos) return 0;
    size_t need = v->n + 2;
    if (v->cap < need) {
        uint32_t *p = realloc(v->ids, need * sizeof *p);
        if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        v->ids = p;
        v->cap = need;
    }
    if (o->prepend_bos) {
        memmove(v->ids + 1, v->ids, v->n * sizeof *v->ids);
        v->ids[0] = bos;
        v->n++;
    }
    if (o->append_eos) v->ids[v->n++] = eos;
    return 0;
}

/* qsort_r's order of document indices by their lengths len[], longest first
 * (no global: two builds may sort on two threads of one process). */
static int by_len_desc(const void *a, const void *b, void *len) {
    const size_t *l = len;
    size_t x = l[*(const size_t *)a], y = l[*(const size_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}