/* report.c - an audit's report: problems recorded in it (by every
 * check of a tokshard audit, and by the audits of other projects' datasets),
 * the shares of a distributed audit and the merge of their reports into the
 * report one process makes. Nothing here reads a shard. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"

#define MAX_CAP (((size_t)1 << 30) - 1) /* as audit.c's: problem numbers take 30 bits of the order key */

void tks_audit_share(const uint64_t *sizes, size_t n_shards, unsigned rank, unsigned n_ranks,
                     size_t *first, size_t *end) {
    if (n_ranks <= 1) {
        *first = 0;
        *end = n_shards;
        return;
    }
    /* shard i belongs to the rank whose byte range [r T / N, (r + 1) T / N)
     * holds the shard's first byte (T: all bytes, N: ranks) */
    long double total = 0, at = 0;
    for (size_t i = 0; i < n_shards; i++) total += sizes[i];
    *first = *end = n_shards;
    int started = 0;
    for (size_t i = 0; i < n_shards; i++) {
        unsigned owner = total > 0 ? (unsigned)(at * n_ranks / total) : (unsigned)(i * n_ranks / n_shards);
        if (owner >= n_ranks) owner = n_ranks - 1;
        if (owner == rank && !started) { *first = i; started = 1; }
        if (owner > rank) { if (!started) *first = i; *end = i; return; }
        at += sizes[i];
    }
    if (!started) *first = n_shards;
}

static int cmp_order(const void *a, const void *b) {
    uint64_t x = ((const tks_audit_problem *)a)->order, y = ((const tks_audit_problem *)b)->order;
    return x < y ? -1 : x > y;
}

int tks_audit_merge(tks_audit_report *const *parts, size_t n, size_t max_problems,
                    tks_audit_report **out) {
    *out = NULL;
    size_t cap = max_problems ? max_problems : 1000, all = 0;
    if (cap > MAX_CAP) cap = MAX_CAP;
    for (size_t i = 0; i < n; i++) all += parts[i]->n_problems;
    tks_audit_report *r = calloc(1, sizeof *r);
    if (r) r->problems = calloc(all > cap ? all : cap, sizeof *r->problems);
    if (!r || !r->problems) {
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory merging audit reports");
    }
    int have_ids = 0;
    for (size_t i = 0; i < n; i++) {
        const tks_audit_report *p = parts[i];
        memcpy(r->problems + r->n_problems, p->problems, p->n_problems * sizeof *p->problems);
        r->n_problems += p->n_problems;
        r->n_problems_total += p->n_problems_total;
        r->n_chunks += p->n_chunks;
        r->n_docs += p->n_docs;
        r->n_tokens += p->n_tokens;
        r->bytes_hashed += p->bytes_hashed;
        if (i == 0) {
            r->n_shards = p->n_shards;
            r->manifest_checked = p->manifest_checked;
            r->tokenizer_checked = p->tokenizer_checked;
            memcpy(r->unicode, p->unicode, sizeof r->unicode); /* the manifest's, read by rank 0 */
            r->unassigned = p->unassigned;
            r->unassigned_docs = p->unassigned_docs;
        }
        /* the manifest's vocabulary (same on every rank), else the first shard's:
         * ranks hold shards in order */
        if (!r->vocab_size) r->vocab_size = p->vocab_size;
        if (p->n_chunks) { /* ids were seen */
            if (!have_ids || p->min_token_id < r->min_token_id) r->min_token_id = p->min_token_id;
            if (!have_ids || p->max_token_id > r->max_token_id) r->max_token_id = p->max_token_id;
            have_ids = 1;
        }
        if (p->seconds > r->seconds) r->seconds = p->seconds;
    }
    /* each rank's problems are its first ones in key order; the first cap of
     * all of them, sorted, are the first cap of a whole audit */
    qsort(r->problems, r->n_problems, sizeof *r->problems, cmp_order);
    if (r->n_problems > cap) r->n_problems = cap;
    *out = r;
    return 0;
}

int tks_audit_report_vadd(tks_audit_report *r, size_t cap, uint64_t order, int code,
                          const char *file, uint64_t shard, uint64_t chunk, uint64_t token_offset,
                          uint64_t byte_offset, uint64_t doc, const char *fmt, va_list ap) {
    r->n_problems_total++;
    if (r->n_problems >= cap) return 0;
    tks_audit_problem *p = &r->problems[r->n_problems++];
    memset(p, 0, sizeof *p);
    p->order = order;
    p->code = code;
    p->shard = shard;
    p->chunk = chunk;
    p->token_offset = token_offset;
    p->byte_offset = byte_offset;
    p->doc = doc;
    snprintf(p->file, sizeof p->file, "%s", file ? file : "");
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    return 1;
}

int tks_audit_report_add(tks_audit_report *r, size_t cap, uint64_t order, int code,
                         const char *file, uint64_t shard, uint64_t chunk, uint64_t token_offset,
                         uint64_t byte_offset, uint64_t doc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = tks_audit_report_vadd(r, cap, order, code, file, shard, chunk, token_offset,
                                   byte_offset, doc, fmt, ap);
    va_end(ap);
    return rc;
}

void tks_audit_report_free(tks_audit_report *r) {
    if (!r) return;
    free(r->problems);
    free(r);
}
