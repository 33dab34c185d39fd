/* records.c - a work unit's directory and records on disk, what the job,
 * the unit and the placement share: OUT.partial/unit-NNNNN/, its unit.json
 * (written last, when the unit is complete), the check that a shard on disk
 * is the recorded one, and a resumed unit's inputs checked against the
 * hashes its record holds (the life cycle: pipeline.h, "The build job"). */
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

int tks__unit_dir(const tks_build_job *j, uint64_t k, char *out, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "unit-%05llu", (unsigned long long)k);
    return tks_path_join(out, cap, j->partial, name);
}

int tks__unit_file(const tks_build_job *j, uint64_t k, const char *name, char *out, size_t cap) {
    char dir[PATH_MAX];
    int rc = tks__unit_dir(j, k, dir, sizeof dir);
    return rc ? rc : tks_path_join(out, cap, dir, name);
}

/* ---------------------------------------------------------------------------
 * Records and shards
 * ------------------------------------------------------------------------- */

/* Is the shard at `path` the recorded one, numbered `local` or `global` (a
 * header rewritten or not yet)? Its header with index `as` (the index the
 * record was made with) must hash to the record's. 1, or 0. */
int tks__job_shard_recorded(const char *path, const tks_shard_info *rec, uint32_t local, uint64_t global,
                         uint64_t as) {
    tks_shard *sh = NULL;
    if (access(path, F_OK) != 0 || tks_shard_open(path, &sh) != 0) {
        tks_clear_error();
        tks_shard_close(sh);
        return 0;
    }
    tks_shard_header h = *tks_shard_hdr(sh);
    tks_shard_close(sh);
    if ((h.shard_index != local && h.shard_index != global) || h.file_size != rec->file_bytes ||
        h.n_docs != rec->n_docs || h.n_tokens != rec->n_tokens)
        return 0;
    uint8_t page[TKS_HEADER_SIZE];
    h.shard_index = (uint32_t)as;
    tks_header_encode(&h, page);
    return h.header_xxh3 == rec->header_xxh3;
}

/* The shard name of dataset index g. */
void tks__job_shard_name(uint64_t g, char name[32]) { snprintf(name, 32, "shard-%05llu.tks", (unsigned long long)g); }

static int read_record(const tks_build_job *j, uint64_t k, json_t **rec);

/* Unit k's first global shard index from the records on disk (the shards of
 * units 0..k-1), read once (only a resume after a crash while the shards
 * were placed needs it), or TKS_NONE when an earlier record is missing. */
static uint64_t base_of(tks_build_job *j, uint64_t k) {
    if (!j->bases && (j->bases = malloc((j->plan.n_units + 1) * sizeof *j->bases))) {
        uint64_t b = 0;
        for (size_t u = 0; u < j->plan.n_units; u++) {
            json_t *js = NULL;
            j->bases[u] = b;
            if (b != TKS_NONE && read_record(j, u, &js)) b += json_array_size(json_object_get(js, "shards"));
            else b = TKS_NONE;
            json_decref(js);
        }
    }
    return j->bases ? j->bases[k] : TKS_NONE;
}

/* Unit k's record, when it is this build's: 1 with *rec set, else 0. */
static int read_record(const tks_build_job *j, uint64_t k, json_t **rec) {
    char path[PATH_MAX];
    *rec = NULL;
    if (tks__unit_file(j, k, UNIT_RECORD, path, sizeof path) || access(path, F_OK) != 0) return 0;
    json_t *js = json_load_file(path, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    if (!js || !id || strcmp(id, j->build_id) != 0 || !json_is_array(json_object_get(js, "shards")) ||
        !json_is_array(json_object_get(js, "ranges")) ||
        (uint64_t)json_integer_value(json_object_get(js, "unit")) != k) {
        json_decref(js);
        return 0;
    }
    *rec = js;
    return 1;
}

/* Unit k's record on disk, when it is this build's and every shard it lists
 * is in place (in the unit's directory, or already placed in the dataset):
 * 1 with *rec and *shards set (the caller owns them), else 0. */
int tks__unit_load_complete(tks_build_job *j, uint64_t k, json_t **rec, tks_shard_info **shards, size_t *n) {
    char dir[PATH_MAX], p[PATH_MAX], name[32];
    json_t *js = NULL;
    *rec = NULL;
    *shards = NULL;
    *n = 0;
    if (tks__unit_dir(j, k, dir, sizeof dir) || !read_record(j, k, &js)) return 0;
    json_t *arr = json_object_get(js, "shards");
    size_t m = json_array_size(arr);
    tks_shard_info *s = calloc(m ? m : 1, sizeof *s);
    int ok = s != NULL;
    for (size_t i = 0; i < m && ok; i++) {
        ok = tks_shard_record_read(json_array_get(arr, i), i, &s[i]) == 0 &&
             tks_path_join(p, sizeof p, dir, s[i].file) == 0;
        if (ok && tks__job_shard_recorded(p, &s[i], (uint32_t)i, (uint32_t)i, i)) continue;
        uint64_t g = ok ? base_of(j, k) : TKS_NONE; /* placed already? */
        if (g != TKS_NONE) g += i;
        if (g != TKS_NONE && g <= UINT32_MAX) tks__job_shard_name(g, name);
        ok = ok && g != TKS_NONE && g <= UINT32_MAX && tks_path_join(p, sizeof p, j->partial, name) == 0 &&
             tks__job_shard_recorded(p, &s[i], (uint32_t)i, g, i);
    }
    if (!ok) {
        free(s);
        json_decref(js);
        return 0;
    }
    *rec = js;
    *shards = s;
    *n = m;
    return 1;
}

/* A kept unit's inputs: the ranges it would read now must be those it read,
 * and hash as they did. 0, or TKS_ERR_RESUME naming the file. */
int tks__unit_verify_ranges(const tks_build_job *j, uint64_t k, const json_t *rec) {
    tks__range *r = NULL;
    size_t n = 0;
    int rc = tks__unit_ranges(j->ls, &j->plan, k, j->unit_bytes, &r, &n);
    json_t *arr = json_object_get(rec, "ranges");
    if (!rc && n != json_array_size(arr))
        rc = tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                      "cannot resume: unit %llu's inputs are not cut as they were: they changed "
                      "since the interrupted build; remove %s and build again",
                      (unsigned long long)k, j->partial);
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *g = json_array_get(arr, i);
        const char *was = json_string_value(json_object_get(g, "xxh3_128")), *path = j->ls->files[r[i].file];
        uint8_t h[16];
        char hx[33] = "";
        int same = (uint64_t)json_integer_value(json_object_get(g, "file")) == r[i].file &&
                   (uint64_t)json_integer_value(json_object_get(g, "start")) == r[i].start &&
                   (uint64_t)json_integer_value(json_object_get(g, "end")) == r[i].end && was;
        if (same) {
            rc = tks__range_hash(j->ls, &r[i], h);
            if (!rc) tks_hex(h, 16, hx);
            same = !rc && !strcmp(hx, was);
        }
        /* a Parquet range is row groups [start, end), a plain file's bytes */
        char what[96];
        if (r[i].whole == TKS__RANGE_PARQUET && r[i].end > r[i].start)
            snprintf(what, sizeof what, "row groups %llu to %llu", (unsigned long long)r[i].start,
                     (unsigned long long)r[i].end - 1);
        else if (r[i].whole == TKS__RANGE_PARQUET)
            snprintf(what, sizeof what, "no row groups");
        else
            snprintf(what, sizeof what, "bytes %llu to %llu", (unsigned long long)r[i].start,
                     (unsigned long long)r[i].end);
        if (!rc && !same)
            rc = tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                          "cannot resume: %s changed since the interrupted build (%s: XXH3-128 %s, "
                          "was %.32s), so unit %llu kept in %s came from other %s; remove %s and "
                          "build again",
                          path, what, hx[0] ? hx : "?", was ? was : "?", (unsigned long long)k, j->partial,
                          r[i].whole == TKS__RANGE_PARQUET ? "rows" : "bytes", j->partial);
    }
    free(r);
    return rc;
}

/* Empties (or creates) a unit's directory. */
int tks__reset_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return tks_fail(tks_write_errno_code(errno), dir, TKS_NONE, TKS_NONE, "cannot create %s: %s",
                            dir, strerror(errno));
        return 0;
    }
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            if (tks_path_join(p, sizeof p, dir, e->d_name) == 0) unlink(p);
    closedir(d);
    return 0;
}

int tks__unit_write_record(const tks_build_job *j, uint64_t k, const json_t *rec) {
    char path[PATH_MAX];
    char *text = json_dumps(rec, JSON_INDENT(1));
    int rc = text ? tks__unit_file(j, k, UNIT_RECORD, path, sizeof path)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Running a unit
 * ------------------------------------------------------------------------- */

json_t *tks__stats_json(const tks_input_stats *s) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "files",
                     (json_int_t)s->files, "entries", (json_int_t)s->entries, "bytes_in",
                     (json_int_t)s->bytes_in, "bytes_text", (json_int_t)s->bytes_text, "docs",
                     (json_int_t)s->docs, "empty_skipped", (json_int_t)s->empty_skipped,
                     "utf8_invalid_docs", (json_int_t)s->utf8_invalid_docs, "utf8_replaced",
                     (json_int_t)s->utf8_replaced, "utf8_skipped", (json_int_t)s->utf8_skipped,
                     "long_skipped", (json_int_t)s->long_skipped, "bad_records_skipped",
                     (json_int_t)s->bad_records_skipped, "binary_skipped", (json_int_t)s->binary_skipped,
                     "json_as_text", (json_int_t)s->json_as_text);
}

void tks__stats_add(tks_input_stats *t, const json_t *s) {
#define ADD(f) t->f += (uint64_t)json_integer_value(json_object_get(s, #f))
    ADD(files); ADD(entries); ADD(bytes_in); ADD(bytes_text); ADD(docs); ADD(empty_skipped);
    ADD(utf8_invalid_docs); ADD(utf8_replaced); ADD(utf8_skipped); ADD(long_skipped);
    ADD(bad_records_skipped); ADD(binary_skipped); ADD(json_as_text);
#undef ADD
}

/* JSONL records the encoding threads decoded and the commit left out (the
 * reader counted them among its documents). */
