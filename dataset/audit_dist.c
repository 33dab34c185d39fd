/* audit_dist.c - the audit spread over the ranks of a world of processes
 * (tks_audit_spread, dataset.h): every rank runs tks_audit on its share of
 * the shards (contiguous ranges of about equal bytes, tks_audit_share);
 * rank 0 gathers the reports as bytes (tks_audit_report_pack: every rank
 * runs the same binary) and merges them with tks_audit_merge, which gives
 * exactly the report of a single process. */
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"

#define PACK_MAGIC "TKSAUDR1" /* 8 bytes, then the report struct, then its problems */
#define PACK_MAGIC_LEN 8

int tks_audit_report_pack(const tks_audit_report *r, void **bytes, size_t *len) {
    *bytes = NULL;
    *len = 0;
    size_t n = PACK_MAGIC_LEN + sizeof *r + r->n_problems * sizeof *r->problems;
    char *p = malloc(n);
    if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (an audit report)");
    tks_audit_report head = *r;
    head.problems = NULL;
    memcpy(p, PACK_MAGIC, PACK_MAGIC_LEN);
    memcpy(p + PACK_MAGIC_LEN, &head, sizeof head);
    if (r->n_problems) memcpy(p + PACK_MAGIC_LEN + sizeof head, r->problems, r->n_problems * sizeof *r->problems);
    *bytes = p;
    *len = n;
    return 0;
}

int tks_audit_report_unpack(const void *bytes, size_t len, size_t *used, tks_audit_report **out) {
    *out = NULL;
    *used = 0;
    const char *p = bytes;
    tks_audit_report head;
    size_t room = len >= PACK_MAGIC_LEN + sizeof head ? len - PACK_MAGIC_LEN - sizeof head : 0;
    if (!p || len < PACK_MAGIC_LEN + sizeof head || memcmp(p, PACK_MAGIC, PACK_MAGIC_LEN) != 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "not a packed audit report");
    memcpy(&head, p + PACK_MAGIC_LEN, sizeof head);
    if (head.n_problems > room / sizeof *head.problems)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "a packed audit report cut short");
    tks_audit_report *r = malloc(sizeof *r);
    if (r) {
        *r = head;
        r->problems = calloc(head.n_problems ? head.n_problems : 1, sizeof *r->problems);
    }
    if (!r || !r->problems) {
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (an audit report)");
    }
    memcpy(r->problems, p + PACK_MAGIC_LEN + sizeof head, head.n_problems * sizeof *r->problems);
    *used = PACK_MAGIC_LEN + sizeof head + head.n_problems * sizeof *r->problems;
    *out = r;
    return 0;
}

/* Rank 0: the ranks' packed reports (len bytes at all) merged into *out. */
static int merge_packed(const void *all, size_t len, size_t n_ranks, size_t max_problems,
                        tks_audit_report **out) {
    tks_audit_report **parts = calloc(n_ranks ? n_ranks : 1, sizeof *parts);
    if (!parts) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory merging audit reports");
    int rc = 0;
    size_t at = 0, n = 0, used = 0;
    for (; !rc && n < n_ranks; n++, at += used)
        rc = tks_audit_report_unpack((const char *)all + at, len - at, &used, &parts[n]);
    if (!rc && at != len)
        rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "the ranks' audit reports did not arrive whole");
    if (!rc) rc = tks_audit_merge(parts, n_ranks, max_problems, out);
    for (size_t i = 0; i < n_ranks; i++) tks_audit_report_free(parts[i]);
    free(parts);
    return rc;
}

int tks_audit_spread(const char *path, const tks_audit_opts *opts, const tks_audit_world *world,
                     tks_audit_report **out) {
    *out = NULL;
    if (!world || world->size <= 1) return tks_audit(path, opts, out);
    tks_audit_opts o = *opts;
    o.rank = (unsigned)world->rank;
    o.n_ranks = (unsigned)world->size;
    tks_audit_report *mine = NULL;
    void *bytes = NULL, *all = NULL;
    size_t len = 0, all_len = 0;
    int rc = tks_audit(path, &o, &mine);
    if (!rc) rc = tks_audit_report_pack(mine, &bytes, &len);
    tks_audit_report_free(mine);
    /* one rank's failure stops all of them, each with its own message */
    int any = rc ? 1 : 0, c = world->max_int(&any, 1, world->ctx);
    if (c || any) {
        free(bytes);
        if (c || rc) return c ? c : rc;
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "rank %d stops: another rank could not audit %s (see its message)", world->rank, path);
    }
    rc = world->gather(bytes, len, &all, &all_len, world->ctx);
    free(bytes);
    if (!rc && world->rank == 0) rc = merge_packed(all, all_len, (size_t)world->size, opts->max_problems, out);
    free(all);
    return rc;
}
