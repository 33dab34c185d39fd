/* local.c - tks_build: every work unit of a build in this process, in
 * order, then placed, the manifest written and OUT published (the same job
 * tokshard's MPI build spreads over processes). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

/* ---------------------------------------------------------------------------
 * tks_build: every unit here, in order
 * ------------------------------------------------------------------------- */

/* Every unit placed, its result appended to one buffer, and the manifest
 * written from them. */
static int build_finish(tks_build_job *j, tks_build_stats *stats) {
    size_t nu = j->plan.n_units;
    buf all = {0};
    int rc = 0;
    double t0 = omp_get_wtime();
    uint64_t base = 0;
    for (size_t k = 0; k < nu && !rc; k++) {
        void *r = NULL;
        size_t len = 0;
        rc = tks_build_job_place(j, k, base, &r, &len);
        if (!rc) rc = tks__buf_append(&all, r, len);
        free(r);
        base += j->us[k].n;
    }
    if (!rc) rc = tks_build_job_sync(j);
    double placed = omp_get_wtime() - t0;
    if (!rc) rc = tks_build_job_finish(j, all.p, all.len, stats);
    stats->place_seconds = placed;
    free(all.p);
    for (size_t k = 0; k < nu && !rc; k++) tks_build_job_clean(j, k);
    return rc ? rc : tks_build_job_publish(j);
}

int tks__publish_complete(tks_build_job *j, tks_build_stats *stats) {
    tks_dataset *ds = NULL;
    int rc = tks_dataset_open(j->partial, &ds);
    stats->published_complete = 1;
    stats->units = j->plan.n_units;
    stats->min_token_id = UINT32_MAX;
    for (size_t i = 0; !rc && i < tks_dataset_n_shards(ds); i++) {
        const tks_shard_header *h = tks_shard_hdr(tks_dataset_shard(ds, i));
        if (h->min_token_id < stats->min_token_id) stats->min_token_id = h->min_token_id;
        if (h->max_token_id > stats->max_token_id) stats->max_token_id = h->max_token_id;
    }
    if (!rc) {
        stats->shards = tks_dataset_n_shards(ds);
        stats->docs_written = tks_dataset_n_docs(ds);
        stats->tokens_written = tks_dataset_n_tokens(ds);
        stats->vocab_size = tks_dataset_tokenizer(ds)->vocab_size;
        stats->unassigned = tks_dataset_tokenizer(ds)->unassigned;
        stats->unassigned_docs = tks_dataset_tokenizer(ds)->unassigned_docs;
    }
    tks_dataset_close(ds);
    for (size_t k = 0; !rc && k < j->plan.n_units; k++) tks_build_job_clean(j, k);
    return rc ? rc : tks_build_job_publish(j);
}

int tks_build(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    tks_build_job *j = NULL;
    int rc = tks_build_job_open(o, &j);
    uint64_t kept = 0, kept_shards = 0;
    if (!rc && j->complete) { /* the interrupted run finished it: publishing was left */
        rc = tks__publish_complete(j, stats);
        stats->seconds = omp_get_wtime() - j->t0;
        tks_build_job_free(j);
        return rc;
    }
    for (size_t k = 0; !rc && k < j->plan.n_units; k++) {
        tks_unit_stats us;
        rc = tks_build_job_run(j, k, &us);
        kept += us.kept;
        kept_shards += us.kept ? us.shards : us.resumed_shards;
    }
    if (!rc) rc = build_finish(j, stats);
    stats->units_kept = kept;
    stats->resumed_shards = kept_shards;
    if (j) {
        stats->seconds = omp_get_wtime() - j->t0;
        tks__encoder_report(j->tk, o, stats);
        if (rc && j->ls) stats->input.files = tks_input_n_files(j->ls);
    }
    tks_build_job_free(j);
    return rc;
}
