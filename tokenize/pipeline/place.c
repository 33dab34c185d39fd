/* place.c - once every unit is complete: each unit's shards given their
 * index in the dataset (tks_build_job_place), the manifest written from every
 * unit's result (tks_build_job_finish), the units' records removed and
 * OUT.partial published as OUT (tks_build_job_clean, _publish). */
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
 * Placing the shards, the manifest, publishing
 * ------------------------------------------------------------------------- */

/* The header of the shard at `path` when it is the recorded one (its
 * index `local` or `global`, its header hashing as recorded with index
 * `local`): 1 with *h and the open descriptor *fd (O_RDWR), else 0. */
static int open_recorded(const char *path, const tks_shard_info *rec, uint32_t local, uint32_t global,
                         tks_shard_header *h, int *fd) {
    uint8_t page[TKS_HEADER_SIZE];
    ssize_t got = -1;
    tks_open_own(path, O_RDWR, "shard", fd); /* never through a link: it is written in place */
    if (*fd >= 0) {
        do got = pread(*fd, page, sizeof page, 0);
        while (got < 0 && errno == EINTR);
    }
    int ok = got == (ssize_t)sizeof page && tks_header_decode(page, sizeof page, path, h) == 0 &&
             (h->shard_index == local || h->shard_index == global) && h->file_size == rec->file_bytes &&
             h->n_docs == rec->n_docs && h->n_tokens == rec->n_tokens;
    if (ok) {
        tks_shard_header x = *h;
        x.shard_index = local;
        tks_header_encode(&x, page);
        ok = x.header_xxh3 == rec->header_xxh3;
    }
    tks_clear_error();
    if (!ok && *fd >= 0) close(*fd);
    if (!ok) *fd = -1;
    return ok;
}

/* Gives a unit's shard its index in the dataset: the header's shard_index
 * and checksum rewritten in place and made durable, then the rename to its
 * final name; a shard found there already (placed by an interrupted run)
 * is taken as it is. si: the record, its header_xxh3 updated. */
static int place_shard(const char *from, const char *to, uint32_t local, uint32_t global, tks_shard_info *si) {
    tks_shard_header h;
    uint8_t page[TKS_HEADER_SIZE];
    int fd, rc = 0, there = 0;
    if (!open_recorded(from, si, local, global, &h, &fd)) {
        if (!open_recorded(to, si, local, global, &h, &fd))
            return tks_fail(TKS_ERR_RESUME, from, TKS_NONE, TKS_NONE,
                            "%s is missing or damaged: re-run the same command with --resume to "
                            "build its unit again", from);
        there = 1; /* placed by an interrupted run */
    }
    if (h.shard_index != global) {
        h.shard_index = global;
        tks_header_encode(&h, page);
        rc = tks_pwrite_all(fd, page, sizeof page, 0, there ? to : from);
    }
    /* durable before the manifest names it (also when an interrupted run
     * rewrote it: its write may not have reached the disk) */
    if (!rc && fsync(fd) != 0)
        rc = tks_fail(tks_write_errno_code(errno), from, global, TKS_NONE, "cannot fsync %s: %s",
                      there ? to : from, strerror(errno));
    close(fd);
    if (!rc && !there && rename(from, to) != 0)
        rc = tks_fail(TKS_ERR_IO, to, global, TKS_NONE, "cannot rename %s to %s: %s", from, to,
                      strerror(errno));
    si->header_xxh3 = h.header_xxh3;
    return rc;
}

/* A unit's result as tks_build_job_place hands it to the coordinator:
 * this header, then n_ranges of `result_range`, then n_shards of
 * tks_shard_info (global names), in native byte order (every process runs
 * the same binary). */
typedef struct result_hdr {
    uint64_t unit, empty_after_tokenize, n_ranges, n_shards;
    uint64_t unassigned, unassigned_docs; /* the unit's record's */
    tks_input_stats stats;
} result_hdr;
typedef struct result_range {
    tks__range r;
    uint8_t xxh3[16];
} result_range;

/* The result of unit k (its record rec, its placed shards si[0..n)). */
static int pack_result(const json_t *rec, const tks_shard_info *si, size_t n, void **out, size_t *len) {
    json_t *ranges = json_object_get(rec, "ranges"), *st = json_object_get(rec, "stats");
    result_hdr h = {(uint64_t)json_integer_value(json_object_get(rec, "unit")),
                    (uint64_t)json_integer_value(json_object_get(rec, "empty_after_tokenize")),
                    json_array_size(ranges), n,
                    (uint64_t)json_integer_value(json_object_get(rec, "unassigned")),
                    (uint64_t)json_integer_value(json_object_get(rec, "unassigned_docs")), {0}};
    tks__stats_add(&h.stats, st);
    *len = sizeof h + h.n_ranges * sizeof(result_range) + n * sizeof *si;
    char *b = *out = calloc(1, *len);
    if (!b) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    memcpy(b, &h, sizeof h);
    result_range *rr = (result_range *)(b + sizeof h);
    for (size_t i = 0; i < h.n_ranges; i++) {
        json_t *g = json_array_get(ranges, i);
        rr[i].r = (tks__range){(uint64_t)json_integer_value(json_object_get(g, "file")),
                               (uint64_t)json_integer_value(json_object_get(g, "start")),
                               (uint64_t)json_integer_value(json_object_get(g, "end")),
                               json_is_true(json_object_get(g, "parquet"))
                                   ? TKS__RANGE_PARQUET
                                   : (uint32_t)json_is_true(json_object_get(g, "whole")),
                               0};
        const char *hx = json_string_value(json_object_get(g, "xxh3_128"));
        if (!hx || tks_unhex(hx, rr[i].xxh3, 16) != 0)
            return tks_fail(TKS_ERR_RESUME, NULL, TKS_NONE, TKS_NONE, "unit %llu's record has a bad range hash",
                            (unsigned long long)h.unit);
    }
    if (n) memcpy(b + sizeof h + h.n_ranges * sizeof(result_range), si, n * sizeof *si);
    return 0;
}

int tks_build_job_place(tks_build_job *j, uint64_t k, uint64_t base, void **result, size_t *len) {
    *result = NULL;
    *len = 0;
    unit_state *s = k < j->plan.n_units ? &j->us[k] : NULL;
    if (!s || !s->ran)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_place: unit %llu was not run here", (unsigned long long)k);
    if (base + s->n > (uint64_t)UINT32_MAX + 1)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE, "more than 2^32 shards: raise --shard-tokens");
    char dir[PATH_MAX];
    int rc = tks__unit_dir(j, k, dir, sizeof dir);
    size_t bad = SIZE_MAX; /* the first shard that failed, whichever thread placed it */
    tks_error first = {0};
    tks_shard_info *si = calloc(s->n ? s->n : 1, sizeof *si);
    if (!rc && !si) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    int threads = j->o.threads > 0 ? j->o.threads : omp_get_max_threads();
    /* in parallel: on a shared filesystem each fsync is a round trip */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (!rc && s->n > 1)
    for (size_t i = 0; i < (rc ? 0 : s->n); i++) {
        char from[PATH_MAX], to[PATH_MAX], name[32];
        si[i] = s->shards[i];
        tks__job_shard_name(base + i, name);
        int e = tks_path_join(from, sizeof from, dir, si[i].file);
        if (!e) e = tks_path_join(to, sizeof to, j->partial, name);
        if (!e) e = place_shard(from, to, (uint32_t)i, (uint32_t)(base + i), &si[i]);
        snprintf(si[i].file, sizeof si[i].file, "%s", name);
        si[i].index = (uint32_t)(base + i);
        if (e) {
#pragma omp critical(tks_place_err)
            if (i < bad) {
                bad = i;
                first = *tks_last_error();
            }
        }
    }
    if (!rc && bad != SIZE_MAX) {
        tks_error_restore(&first);
        rc = first.code ? first.code : TKS_ERR_IO;
    }
    if (!rc) rc = pack_result(s->rec, si, s->n, result, len);
    free(si);
    if (rc) {
        free(*result);
        *result = NULL;
    }
    return rc;
}

/* Each input's XXH3-128 into the provenance: "xxh3_128" for a file read
 * whole by one unit, "pieces" [{start, end, xxh3_128}] for one cut into
 * ranges (no process reads it whole), "row_group_hashes" [{first, end,
 * xxh3_128}] for a Parquet file: per run of row groups a unit read, the hash
 * of the file bytes their column chunks span. res: the results by unit. */
static int add_input_hashes(json_t *desc, const result_hdr *const *res, size_t n_units) {
    json_t *inputs = json_object_get(desc, "inputs");
    for (size_t k = 0; k < n_units; k++) {
        const result_range *rr = (const result_range *)(res[k] + 1);
        for (size_t i = 0; i < res[k]->n_ranges; i++) {
            json_t *f = json_array_get(inputs, (size_t)rr[i].r.file);
            char hx[33];
            tks_hex(rr[i].xxh3, 16, hx);
            if (!f)
                return tks_fail(TKS_ERR_RESUME, NULL, TKS_NONE, TKS_NONE,
                                "unit %zu's record names an input the listing lacks", k);
            if (rr[i].r.whole == TKS__RANGE_PARQUET) { /* row groups [start, end) */
                json_t *groups = json_object_get(f, "row_group_hashes");
                if (!groups) json_object_set_new(f, "row_group_hashes", groups = json_array());
                json_array_append_new(groups, json_pack("{s:I, s:I, s:s}", "first", (json_int_t)rr[i].r.start,
                                                        "end", (json_int_t)rr[i].r.end, "xxh3_128", hx));
                continue;
            }
            if (rr[i].r.whole) {
                json_object_set_new(f, "xxh3_128", json_string(hx));
                continue;
            }
            json_t *pieces = json_object_get(f, "pieces");
            if (!pieces) json_object_set_new(f, "pieces", pieces = json_array());
            json_array_append_new(pieces, json_pack("{s:I, s:I, s:s}", "start", (json_int_t)rr[i].r.start,
                                                    "end", (json_int_t)rr[i].r.end, "xxh3_128", hx));
        }
    }
    return 0;
}

/* The results by unit index (res[k] points into blob), each unit once. */
static int sort_results(const tks_build_job *j, const char *blob, size_t len, const result_hdr **res) {
    for (size_t at = 0; at < len;) {
        result_hdr h;
        if (len - at < sizeof h) break;
        memcpy(&h, blob + at, sizeof h);
        size_t size = sizeof h + h.n_ranges * sizeof(result_range) + h.n_shards * sizeof(tks_shard_info);
        if (h.unit >= j->plan.n_units || res[h.unit] || size > len - at || ((uintptr_t)(blob + at) & 7))
            return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                            "tks_build_job_finish: a unit's result is malformed or given twice");
        res[h.unit] = (const result_hdr *)(blob + at);
        at += size;
    }
    for (size_t k = 0; k < j->plan.n_units; k++)
        if (!res[k])
            return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                            "unit %zu in %s is missing or damaged: re-run the same command with "
                            "--resume to build it again", k, j->partial);
    return 0;
}

/* The dataset's shards, in unit order, each with its place checked. */
static int gather_shards(const tks_build_job *j, const result_hdr *const *res, tks_shard_info **all, size_t *n_all) {
    size_t n = 0;
    for (size_t k = 0; k < j->plan.n_units; k++) n += res[k]->n_shards;
    *all = malloc((n ? n : 1) * sizeof **all);
    if (!*all) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    *n_all = 0;
    for (size_t k = 0; k < j->plan.n_units; k++) {
        const tks_shard_info *si =
            (const tks_shard_info *)((const char *)(res[k] + 1) + res[k]->n_ranges * sizeof(result_range));
        for (size_t i = 0; i < res[k]->n_shards; i++) {
            char want[32] = "";
            if (si[i].index != *n_all || strncmp(si[i].file, "shard-", 6) != 0 ||
                strtoull(si[i].file + 6, NULL, 10) != *n_all)
                tks__job_shard_name(*n_all, want);
            if (want[0])
                return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                                "unit %zu's shard %zu is not %s: the units were placed from other "
                                "shard counts; re-run the same command with --resume", k, i, want);
            (*all)[(*n_all)++] = si[i];
        }
    }
    return 0;
}

/* A build that found no document with text: OUT.partial goes whole (its
 * units' records, the state, the tokenizer copy; it holds no shard), so
 * that the next run starts afresh instead of being told to resume. What
 * cannot be removed (a file of someone else's) stays, with the directory. */
static void drop_partial(tks_build_job *j) {
    tks_error why = *tks_last_error(); /* the build's error, whatever removing meets */
    char dir[PATH_MAX];
    for (uint64_t k = 0; k < j->plan.n_units; k++)
        if (tks__unit_dir(j, k, dir, sizeof dir) == 0 && access(dir, F_OK) == 0 && tks__reset_dir(dir) == 0)
            rmdir(dir);
    if (tks_path_join(dir, sizeof dir, j->partial, "in-flight") == 0 && access(dir, F_OK) == 0 &&
        tks__reset_dir(dir) == 0)
        rmdir(dir);
    if (tks__reset_dir(j->partial) == 0) rmdir(j->partial);
    tks_error_restore(&why);
}

int tks_build_job_finish(tks_build_job *j, const void *results, size_t len, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    double t0 = omp_get_wtime();
    if (!j->coordinator)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_finish: only the coordinator finishes a build");
    size_t nu = j->plan.n_units, n_all = 0;
    const result_hdr **res = calloc(nu ? nu : 1, sizeof *res);
    tks_shard_info *all = NULL;
    tks_input_stats input = {0};
    uint64_t empty = 0;
    int rc = res ? sort_results(j, results, len, res) : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = gather_shards(j, res, &all, &n_all);
    stats->unassigned = stats->unassigned_docs = 0;
    for (size_t k = 0; k < nu && !rc; k++) {
        const tks_input_stats *s = &res[k]->stats;
#define ADD(f) input.f += s->f
        ADD(files); ADD(entries); ADD(bytes_in); ADD(bytes_text); ADD(docs); ADD(empty_skipped);
        ADD(utf8_invalid_docs); ADD(utf8_replaced); ADD(utf8_skipped); ADD(long_skipped);
        ADD(bad_records_skipped); ADD(binary_skipped); ADD(json_as_text);
#undef ADD
        empty += res[k]->empty_after_tokenize;
        stats->unassigned += res[k]->unassigned;
        stats->unassigned_docs += res[k]->unassigned_docs;
    }
    input.bad_inputs_skipped = tks_input_get_stats(j->ls)->bad_inputs_skipped;
    input.links_outside = tks_input_get_stats(j->ls)->links_outside; /* the listing's, as the skipped */
    input.links_skipped = tks_input_get_stats(j->ls)->links_skipped;
    if (!rc && n_all == 0) {
        rc = tks__no_text(&input);
        drop_partial(j); /* nothing to keep: no run can resume a build that found no text */
    }
    if (!rc) j->desc = tks__describe(&j->o, j->ls, j->tk, &rc);
    if (!rc) rc = add_input_hashes(j->desc, res, nu);
    if (!rc) rc = tks__write_manifest(&j->o, j->partial, j->tk, j->desc, &input, all, n_all, empty, stats);
    if (!rc) j->n_shards = n_all;
    free(res);
    free(all);
    stats->units = nu;
    stats->plan_seconds = j->plan_seconds;
    stats->manifest_seconds = omp_get_wtime() - t0;
    tks__encoder_report(j->tk, &j->o, stats);
    return rc;
}

void tks_build_job_clean(tks_build_job *j, uint64_t k) {
    char dir[PATH_MAX], path[PATH_MAX];
    if (tks__unit_dir(j, k, dir, sizeof dir) || tks_path_join(path, sizeof path, dir, UNIT_RECORD)) return;
    unlink(path);
    if (tks_path_join(path, sizeof path, dir, UNIT_PROGRESS) == 0) unlink(path);
    rmdir(dir);
}

int tks_build_job_publish(tks_build_job *j) {
    char p[PATH_MAX];
    if (tks_path_join(p, sizeof p, j->partial, "in-flight") == 0 && access(p, F_OK) == 0) { /* tokshard's report under mpirun */
        tks__reset_dir(p);
        rmdir(p);
    }
    tks_partial_clean(j->partial, j->n_shards, NULL); /* temporary files, shards of no unit */
    int rc = tks_fsync_dir(j->partial);
    return rc ? rc : tks_partial_publish(TKS_PARTIAL_BUILD, j->partial, j->out);
}

