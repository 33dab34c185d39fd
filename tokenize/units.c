/* units.c - the build by work units: tks_build (every unit in this
 * process) and tks_build_job_* (the units spread over processes by
 * tools/dist_mpi.c). The units come from the listing alone (plan.c).
 *
 * OUT.partial/build-state.json: {"build_id", "mode": "units", "units",
 *   "unit_bytes", "unit_rule"} (written by the coordinator, before any unit)
 * OUT.partial/unit-NNNNN/shard-LLLLL.tks: unit N's shards, numbered from 0
 * OUT.partial/unit-NNNNN/progress.json: rewritten each time the unit seals a
 *   shard, until the unit is complete (the resume grain inside a unit: see
 *   "A unit's progress" below)
 * OUT.partial/unit-NNNNN/unit.json: written last, when the unit is complete:
 *   its shards, its counters, and each input range it read with the range's
 *   XXH3-128 (a kept unit's ranges are hashed again on --resume)
 * placement, once every unit is complete: each shard's header gets its index
 *   in the dataset (256 bytes rewritten in place, fsync, on several threads)
 *   and the shard is renamed to OUT.partial/shard-GGGGG.tks. A resume finds
 *   a shard in either place: a unit's first global index is the sum of the
 *   shard counts its predecessors' records give.
 * The manifest is written from every unit's result (its shards, counters and
 * range hashes, gathered as bytes); then the records go, and
 * OUT.partial becomes OUT. */
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

#include "tokenize/internal.h"

#define UNIT_RECORD "unit.json"
#define UNIT_PROGRESS "progress.json"
#define BLOB_MAGIC "TKSJ1"

/* What this process knows of a unit it ran. */
typedef struct unit_state {
    json_t *rec;            /* its record (unit.json) */
    tks_shard_info *shards; /* as recorded: local names and indices */
    size_t n;
    int ran;
} unit_state;

struct tks_build_job {
    tks_build_opts o;
    int coordinator;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_tok *tk;
    uint32_t bos, eos;
    char build_id[17];
    uint64_t unit_bytes;
    tks_input *ls;            /* the listing (never read: units read views of it) */
    tks__plan plan;
    unit_state *us;           /* per unit */
    double t0, plan_t0, plan_seconds; /* plan_t0: once the tokenizer is loaded */
    tks_build_progress prog;  /* this job's totals, for opts.progress */
    uint64_t *bases;          /* each unit's first global shard index from the records on
                               * disk (TKS_NONE past a missing one), or NULL: not read yet */
    json_t *desc;             /* coordinator: the provenance */
    size_t n_shards;          /* coordinator: the dataset's, once the manifest is written */
};

static int job_paths(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    if (!o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    j->unit_bytes = o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES;
    int rc = tks_partial_paths(TKS_PARTIAL_BUILD, o->out_dir, j->out, j->partial, sizeof j->out);
    if (rc) return rc;
    if (snprintf(j->lock_path, sizeof j->lock_path, "%s.lock", j->out) >= (int)sizeof j->lock_path)
        return tks_fail(TKS_ERR_ARG, j->out, TKS_NONE, TKS_NONE, "--output path too long");
    rc = tks__check_output_apart(j->out, o);
    if (!rc) rc = tks_tokenizer_open(o, &j->tk);
    if (rc) return rc;
    j->bos = tks_tok_bos_id(j->tk);
    j->eos = tks_tok_eos_id(j->tk);
    return tks__check_specials(o, j->bos, j->eos);
}

/* The plan and the per-unit state, once the listing is there. */
static int job_plan(tks_build_job *j) {
    int rc = tks__plan_make(j->ls, j->unit_bytes, &j->plan);
    if (!rc && !(j->us = calloc(j->plan.n_units ? j->plan.n_units : 1, sizeof *j->us)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (units)");
    j->prog.total_bytes_in = tks_input_total_bytes(j->ls);
    return rc;
}

static int unit_dir(const tks_build_job *j, uint64_t k, char *out, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "unit-%05llu", (unsigned long long)k);
    return tks_path_join(out, cap, j->partial, name);
}

static int unit_file(const tks_build_job *j, uint64_t k, const char *name, char *out, size_t cap) {
    char dir[PATH_MAX];
    int rc = unit_dir(j, k, dir, sizeof dir);
    return rc ? rc : tks_path_join(out, cap, dir, name);
}

/* ---------------------------------------------------------------------------
 * OUT.partial: fresh or resumed, and the state
 * ------------------------------------------------------------------------- */

static int save_state(const tks_build_job *j) {
    json_t *js = json_pack("{s:s, s:s, s:I, s:I, s:s}", "build_id", j->build_id, "mode", "units",
                           "units", (json_int_t)j->plan.n_units, "unit_bytes", (json_int_t)j->unit_bytes,
                           "unit_rule", TKS_UNIT_RULE);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    char path[PATH_MAX];
    int rc = text ? tks_path_join(path, sizeof path, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD))
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* 1 when OUT.partial holds a unit's directory or a shard. */
static int has_work(const char *partial) {
    DIR *d = opendir(partial);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) found = !strncmp(e->d_name, "unit-", 5);
    if (d) closedir(d);
    return found || tks_partial_has_shards(partial);
}

/* An existing OUT.partial, under --resume: its state must be this build's. */
static int resume_partial(tks_build_job *j) {
    char state[PATH_MAX];
    int rc = tks_path_join(state, sizeof state, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
    if (rc) return rc;
    if (access(state, F_OK) != 0) { /* stopped before its state: nothing can be kept */
        if (has_work(j->partial))
            return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                            "cannot resume: %s has units or shards but no build-state.json; remove "
                            "it and build again", j->partial);
        return 0;
    }
    json_t *js = json_load_file(state, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    const char *mode = json_string_value(json_object_get(js, "mode"));
    if (!js || !id)
        rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                      "cannot resume: %s is not a tokshard build state; remove %s and build again",
                      state, j->partial);
    else if (strcmp(id, j->build_id) != 0 || !mode || strcmp(mode, "units") != 0)
        rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                      "cannot resume: %s was started with other inputs, tokenizer or options, or "
                      "by another version of tokshard (build id %.16s, now %s); re-run with the "
                      "original ones, or remove %s to start over",
                      j->partial, id, j->build_id, j->partial);
    json_decref(js);
    return rc;
}

/* The coordinator's first step: OUT.lock and the listing (no file opened). */
static int coordinator_list(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    int rc = tks_partial_check_out(j->out);
    if (!rc) rc = tks_lock(j->lock_path, "tokshard build", &j->lock_fd);
    tks_input_opts io = o->input;
    if (!io.stop) io.stop = o->stop;
    return rc ? rc : tks__input_list(o->inputs, o->n_inputs, &io, &j->ls);
}

/* The coordinator's last step, once the listing is settled: OUT.partial. */
static int coordinator_prepare(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    int rc = 0;
    struct stat sb;
    int have = !rc && stat(j->partial, &sb) == 0;
    if (!rc && have && !o->resume)
        rc = tks_fail(TKS_ERR_EXISTS, j->partial, TKS_NONE, TKS_NONE,
                      "%s exists from an interrupted or failed build: re-run with --resume to "
                      "continue it, or remove it to start over",
                      j->partial);
    if (!rc && have) rc = resume_partial(j);
    else if (!rc) rc = tks_partial_create(j->partial);
    /* the tokenizer's files into the dataset, checked against the one in use */
    if (!rc) rc = tks_tok_save(j->tk, o->tokenizer_path, j->partial);
    if (!rc) rc = tks_partial_tokenizer(TKS_PARTIAL_BUILD, j->partial, NULL, tks_tok_file_name(j->tk),
                                        tks_tok_fingerprint(j->tk));
    if (!rc) rc = save_state(j);
    return rc;
}

static tks_build_job *job_new(const tks_build_opts *opts) {
    tks_build_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->o = *opts;
    j->lock_fd = -1;
    j->t0 = omp_get_wtime();
    return j;
}

int tks_build_job_open_list(const tks_build_opts *opts, tks_build_job **out) {
    *out = NULL;
    if (!opts) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_build_job_open: NULL options");
    tks_build_job *j = job_new(opts);
    if (!j) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    j->coordinator = 1;
    int rc = job_paths(j);
    j->plan_t0 = omp_get_wtime();
    if (!rc) rc = coordinator_list(j);
    if (rc) {
        tks_build_job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

int tks_build_job_check(const tks_build_job *j, unsigned part, unsigned parts, void **verdicts, size_t *len) {
    buf b = {0};
    int rc = tks__input_check_promises(j->ls, part, parts, &b);
    *verdicts = b.p;
    *len = b.len;
    return rc;
}

int tks_build_job_settle(tks_build_job *j, const void *verdicts, size_t len) {
    int rc = tks__input_settle(j->ls, verdicts ? verdicts : "", verdicts ? len : 0);
    if (!rc) rc = job_plan(j);
    if (!rc) rc = tks__build_id(&j->o, j->ls, j->tk, j->build_id);
    if (!rc && j->coordinator) rc = coordinator_prepare(j);
    j->plan_seconds = omp_get_wtime() - j->plan_t0;
    return rc;
}

int tks_build_job_open(const tks_build_opts *opts, tks_build_job **out) {
    void *v = NULL;
    size_t len = 0;
    int rc = tks_build_job_open_list(opts, out);
    if (!rc) rc = tks_build_job_check(*out, 0, 1, &v, &len);
    if (!rc) rc = tks_build_job_settle(*out, v, len);
    free(v);
    if (rc) {
        tks_build_job_free(*out);
        *out = NULL;
    }
    return rc;
}

int tks_build_job_share(const tks_build_job *j, void **blob, size_t *len) {
    buf b = {0};
    int rc = tks__buf_append(&b, BLOB_MAGIC, 5);
    if (!rc) rc = tks__input_pack(j->ls, &b);
    if (rc) {
        free(b.p);
        return rc;
    }
    *blob = b.p;
    *len = b.len;
    return 0;
}

int tks_build_job_join(const tks_build_opts *opts, const void *blob, size_t len, tks_build_job **out) {
    *out = NULL;
    tks_build_job *j = opts ? job_new(opts) : NULL;
    if (!j) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    const char *b = blob;
    int rc = job_paths(j);
    if (!rc && (len < 5 || memcmp(b, BLOB_MAGIC, 5) != 0))
        rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_build_job_join: not a job's blob");
    if (!rc) rc = tks__input_unpack(b + 5, len - 5, &opts->input, &j->ls);
    if (rc) {
        tks_build_job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

const tks_build_unit *tks_build_job_units(const tks_build_job *j, size_t *n) {
    *n = j->plan.n_units;
    return j->plan.units;
}

const uint64_t *tks_build_job_order(const tks_build_job *j) { return j->plan.order; }

uint64_t tks_build_job_unit_shards(const tks_build_job *j, uint64_t k) {
    return k < j->plan.n_units && j->us[k].ran ? j->us[k].n : 0;
}

/* ---------------------------------------------------------------------------
 * Records and shards
 * ------------------------------------------------------------------------- */

/* Is the shard at `path` the recorded one, numbered `local` or `global` (a
 * header rewritten or not yet)? Its header with index `as` (the index the
 * record was made with) must hash to the record's. 1, or 0. */
static int shard_matches(const char *path, const tks_shard_info *rec, uint32_t local, uint64_t global,
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
static void global_name(uint64_t g, char name[32]) { snprintf(name, 32, "shard-%05llu.tks", (unsigned long long)g); }

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
    if (unit_file(j, k, UNIT_RECORD, path, sizeof path) || access(path, F_OK) != 0) return 0;
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
static int load_complete(tks_build_job *j, uint64_t k, json_t **rec, tks_shard_info **shards, size_t *n) {
    char dir[PATH_MAX], p[PATH_MAX], name[32];
    json_t *js = NULL;
    *rec = NULL;
    *shards = NULL;
    *n = 0;
    if (unit_dir(j, k, dir, sizeof dir) || !read_record(j, k, &js)) return 0;
    json_t *arr = json_object_get(js, "shards");
    size_t m = json_array_size(arr);
    tks_shard_info *s = calloc(m ? m : 1, sizeof *s);
    int ok = s != NULL;
    for (size_t i = 0; i < m && ok; i++) {
        ok = tks_shard_record_read(json_array_get(arr, i), i, &s[i]) == 0 &&
             tks_path_join(p, sizeof p, dir, s[i].file) == 0;
        if (ok && shard_matches(p, &s[i], (uint32_t)i, (uint32_t)i, i)) continue;
        uint64_t g = ok ? base_of(j, k) : TKS_NONE; /* placed already? */
        if (g != TKS_NONE) g += i;
        if (g != TKS_NONE && g <= UINT32_MAX) global_name(g, name);
        ok = ok && g != TKS_NONE && g <= UINT32_MAX && tks_path_join(p, sizeof p, j->partial, name) == 0 &&
             shard_matches(p, &s[i], (uint32_t)i, g, i);
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
static int verify_ranges(const tks_build_job *j, uint64_t k, const json_t *rec) {
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
        if (!rc && !same)
            rc = tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                          "cannot resume: %s changed since the interrupted build (bytes %llu to "
                          "%llu: XXH3-128 %s, was %.32s), so unit %llu kept in %s came from other "
                          "bytes; remove %s and build again",
                          path, (unsigned long long)r[i].start, (unsigned long long)r[i].end,
                          hx[0] ? hx : "?", was ? was : "?", (unsigned long long)k, j->partial, j->partial);
    }
    free(r);
    return rc;
}

/* Empties (or creates) a unit's directory. */
static int reset_dir(const char *dir) {
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

static int write_record(const tks_build_job *j, uint64_t k, const json_t *rec) {
    char path[PATH_MAX];
    char *text = json_dumps(rec, JSON_INDENT(1));
    int rc = text ? unit_file(j, k, UNIT_RECORD, path, sizeof path)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Running a unit
 * ------------------------------------------------------------------------- */

static json_t *stats_json(const tks_input_stats *s) {
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

static void stats_add(tks_input_stats *t, const json_t *s) {
#define ADD(f) t->f += (uint64_t)json_integer_value(json_object_get(s, #f))
    ADD(files); ADD(entries); ADD(bytes_in); ADD(bytes_text); ADD(docs); ADD(empty_skipped);
    ADD(utf8_invalid_docs); ADD(utf8_replaced); ADD(utf8_skipped); ADD(long_skipped);
    ADD(bad_records_skipped); ADD(binary_skipped); ADD(json_as_text);
#undef ADD
}

/* JSONL records the encoding threads decoded and the commit left out (the
 * reader counted them among its documents). */
typedef struct deferred {
    uint64_t skipped, bad, too_long, empty;
} deferred;

/* ---------------------------------------------------------------------------
 * A unit's progress: the resume grain inside a unit
 *
 * Each time the unit's writer seals a shard, unit-NNNNN/progress.json records
 * what the sealed shards hold: `next`, the records the reader had handed out
 * before the end of the last sealed document (ordinals below it); those
 * records' counters (skipped by cause, empty after tokenizing, documents and
 * tokens written); the sealed shards; and the XXH3-128 of those records'
 * bytes in order. A resume of an unfinished unit keeps the sealed shards
 * that still match their record, reads the unit's input again from its start
 * without encoding the records below `next` (reading and decompressing are
 * an order of magnitude faster than encoding), checks the hash of their
 * bytes against the record (an input rewritten in place with its size and
 * time is refused), and encodes from there into the next shard number. The
 * unit's shards are then the bytes an uninterrupted build writes, for any
 * thread and process count, and a kill loses at most the shard being filled.
 * ------------------------------------------------------------------------- */
typedef struct progress {
    uint64_t next;                       /* records below this ordinal are in sealed shards or skipped */
    uint64_t empty;                      /* among them: documents that gave no token */
    deferred dj;                         /* among them: records skipped by cause */
    uint64_t docs_written, tokens_written;
    tks_shard_info *shards;              /* the shards sealed by an earlier run (kept), local numbering */
    size_t n;
    uint8_t docs_h[16];                  /* XXH3-128 of the records below next */
} progress;

/* One record into the running hash of a unit's records: its length, then
 * its bytes (a JSONL record as read, before decoding). */
static void hash_record(XXH3_state_t *h, const batch *b, size_t i) {
    uint64_t len = b->len[i];
    XXH3_128bits_update(h, &len, sizeof len);
    XXH3_128bits_update(h, b->arena + b->off[i], b->len[i]);
}

static void hash_digest(XXH3_state_t *h, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
    memcpy(out, c.digest, 16);
}

/* progress.json for unit k: p's counters, p's kept shards then the ones w
 * sealed. Written atomically, after the shard it follows was published. */
static int write_progress(const tks_build_job *j, uint64_t k, const progress *p, tks_writer *w) {
    json_t *shards = json_array();
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(w, &ns);
    for (size_t i = 0; i < p->n; i++) json_array_append_new(shards, tks_shard_record(&p->shards[i]));
    for (size_t i = 0; i < ns; i++) json_array_append_new(shards, tks_shard_record(&si[i]));
    char hx[33], path[PATH_MAX];
    tks_hex(p->docs_h, 16, hx);
    json_t *js = json_pack("{s:s, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:s, s:o}", "build_id",
                           j->build_id, "unit", (json_int_t)k, "next", (json_int_t)p->next,
                           "empty_after_tokenize", (json_int_t)p->empty, "skipped", "all",
                           (json_int_t)p->dj.skipped, "bad", (json_int_t)p->dj.bad, "long",
                           (json_int_t)p->dj.too_long, "empty", (json_int_t)p->dj.empty, "docs_written",
                           (json_int_t)p->docs_written, "tokens_written", (json_int_t)p->tokens_written,
                           "docs_xxh3", hx, "shards", shards);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    int rc = text ? unit_file(j, k, UNIT_PROGRESS, path, sizeof path)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static uint64_t uint_at(const json_t *o, const char *key) {
    json_int_t v = json_integer_value(json_object_get(o, key));
    return v > 0 ? (uint64_t)v : 0;
}

/* Unit k's progress from an earlier run, when it is this build's and every
 * shard it lists is in the unit's directory as recorded: 1 with *p filled
 * (p->shards the caller's), else 0 (the unit is built from its start). */
static int read_progress(const tks_build_job *j, uint64_t k, progress *p) {
    char path[PATH_MAX], dir[PATH_MAX], sp[PATH_MAX];
    memset(p, 0, sizeof *p);
    if (unit_dir(j, k, dir, sizeof dir) || unit_file(j, k, UNIT_PROGRESS, path, sizeof path) ||
        access(path, F_OK) != 0)
        return 0;
    json_t *js = json_load_file(path, 0, NULL), *arr = json_object_get(js, "shards"),
           *sk = json_object_get(js, "skipped");
    const char *id = json_string_value(json_object_get(js, "build_id")),
               *hx = json_string_value(json_object_get(js, "docs_xxh3"));
    size_t m = json_array_size(arr);
    int ok = js && id && !strcmp(id, j->build_id) && uint_at(js, "unit") == k && json_is_array(arr) && m &&
             json_is_object(sk) && hx && strlen(hx) == 32 && tks_unhex(hx, p->docs_h, 16) == 0 &&
             (p->shards = calloc(m, sizeof *p->shards));
    for (size_t i = 0; ok && i < m; i++)
        ok = tks_shard_record_read(json_array_get(arr, i), i, &p->shards[i]) == 0 &&
             tks_path_join(sp, sizeof sp, dir, p->shards[i].file) == 0 &&
             shard_matches(sp, &p->shards[i], (uint32_t)i, (uint32_t)i, i);
    if (ok) {
        p->n = m;
        p->next = uint_at(js, "next");
        p->empty = uint_at(js, "empty_after_tokenize");
        p->dj = (deferred){uint_at(sk, "all"), uint_at(sk, "bad"), uint_at(sk, "long"), uint_at(sk, "empty")};
        p->docs_written = uint_at(js, "docs_written");
        p->tokens_written = uint_at(js, "tokens_written");
        ok = p->next > 0;
    }
    json_decref(js);
    tks_clear_error();
    if (!ok) {
        free(p->shards);
        memset(p, 0, sizeof *p);
    }
    return ok;
}

/* A resumed unit's directory: everything but its kept shards and
 * progress.json goes (the shard being filled when the run stopped, a shard
 * sealed after the last progress.json). */
static void keep_progress_only(const char *dir, const progress *p) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[PATH_MAX];
    while (d && (e = readdir(d))) {
        int keep = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, UNIT_PROGRESS);
        for (size_t i = 0; i < p->n && !keep; i++) keep = !strcmp(e->d_name, p->shards[i].file);
        if (!keep && tks_path_join(path, sizeof path, dir, e->d_name) == 0) unlink(path);
    }
    if (d) closedir(d);
}

/* The policy for record i of batch b, which decoding found bad, too long
 * or empty: 0 (skipped and counted) or the error the reader would have
 * given. */
static int deferred_skip(const tks_input *in, const batch *b, size_t i, deferred *d) {
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

/* The record of a unit just built: its ranges with their hashes, counters
 * and shards (local numbering). NULL when out of memory. */
static json_t *new_record(const tks_build_job *j, uint64_t k, const tks_input *in, const tks__range *r,
                          size_t nr, const tks_shard_info *si, size_t ns, uint64_t empty, const deferred *d) {
    json_t *ranges = json_array(), *shards = json_array();
    for (size_t i = 0; i < nr; i++) {
        char hx[33];
        tks_hex(tks__input_range_xxh3(in, i), 16, hx);
        json_t *g = json_pack("{s:I, s:I, s:I, s:b, s:s}", "file", (json_int_t)r[i].file, "start",
                              (json_int_t)r[i].start, "end", (json_int_t)r[i].end, "whole", (int)r[i].whole,
                              "xxh3_128", hx);
        if (g && r[i].whole == TKS__RANGE_PARQUET) /* start and end are row groups */
            json_object_set_new(g, "parquet", json_true());
        json_array_append_new(ranges, g);
    }
    for (size_t i = 0; i < ns; i++) json_array_append_new(shards, tks_shard_record(&si[i]));
    tks_input_stats st = *tks_input_get_stats(in);
    st.docs -= d->skipped;
    st.bad_records_skipped += d->bad;
    st.long_skipped += d->too_long;
    st.empty_skipped += d->empty;
    return json_pack("{s:s, s:I, s:I, s:o, s:o, s:o}", "build_id", j->build_id, "unit", (json_int_t)k,
                     "empty_after_tokenize", (json_int_t)empty, "stats", stats_json(&st), "ranges", ranges,
                     "shards", shards);
}

/* The records a resumed unit read again without encoding must be those the
 * sealed shards came from. */
static int check_skipped(const tks_build_job *j, uint64_t k, XXH3_state_t *dh, const progress *pg) {
    uint8_t h[16];
    hash_digest(dh, h);
    if (!memcmp(h, pg->docs_h, 16)) return 0;
    return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                    "cannot resume unit %llu: its first %llu records are not the ones its %zu kept shards "
                    "were made from (an input was changed in place since the interrupted build); "
                    "remove %s and build again",
                    (unsigned long long)k, (unsigned long long)pg->next, pg->n, j->partial);
}

/* What a unit's batches are written with: the writer, the counters, the
 * hash of the records read and the resume state (unit_batches). */
typedef struct sink {
    tks_build_job *j;
    uint64_t k;
    const tks_input *in;
    tks_writer *w;
    tks_unit_stats *us;
    uint64_t *empty;
    deferred *dj;
    progress *pg;
    XXH3_state_t *dh;
    uint64_t skip;  /* records the kept shards hold (0 once checked) */
    size_t first;   /* the batch's records before this one are skipped, not encoded */
    size_t next;    /* the batch's next record to write */
} sink;

/* Record i of the batch: hashed, then skipped (kept shards hold it, or a
 * bad record under a skip policy) or written. */
static int sink_one(sink *c, batch *b, size_t i) {
    const tks_build_opts *o = &c->j->o;
    hash_record(c->dh, b, i);
    if (i < c->first) {
        if (b->ordinal[i] + 1 != c->skip) return 0;
        c->skip = 0;
        return check_skipped(c->j, c->k, c->dh, c->pg);
    }
    if (b->status[i] != TKS_JSONL_OK) return deferred_skip(c->in, b, i, c->dj);
    tks_ids *v = &b->ids[i];
    if (v->n == 0) {
        ++*c->empty;
        return 0;
    }
    int sealed = 0;
    int rc = tks__add_specials(v, o, c->j->bos, c->j->eos);
    if (!rc) rc = tks_writer_add(c->w, v->ids, v->n, b->ordinal[i] - c->dj->skipped, &sealed);
    c->us->docs_written++;
    c->us->tokens_written += v->n;
    if (!rc && sealed) { /* a shard sealed: what it and the ones before hold */
        progress *pg = c->pg;
        pg->next = b->ordinal[i] + 1;
        pg->empty = *c->empty;
        pg->dj = *c->dj;
        pg->docs_written = c->us->docs_written;
        pg->tokens_written = c->us->tokens_written;
        hash_digest(c->dh, pg->docs_h);
        rc = write_progress(c->j, c->k, pg, c->w);
    }
    return rc;
}

/* tks__drain: the batch's records from the cursor on, in order, as far as
 * they are finished (a skipped one always is); a record whose encoding
 * failed stops it (the encoder's error is the batch's). */
static int sink_drain(void *ctx, batch *b) {
    sink *c = ctx;
    int rc = 0;
    while (!rc && c->next < b->n) {
        size_t i = c->next;
        if (i >= c->first && (!__atomic_load_n(&b->done[i], __ATOMIC_ACQUIRE) || b->err[i])) break;
        c->next++;
        rc = sink_one(c, b, i);
    }
    return rc;
}

/* Reads, encodes and writes the unit's documents (the batches of the
 * reader thread; each written while the rest of it is being encoded);
 * *empty: documents that gave no token. pg: on entry what the kept shards
 * hold (next 0: nothing), then the progress as of the last shard sealed,
 * progress.json rewritten at each. */
static int unit_batches(tks_build_job *j, uint64_t k, tks_input *in, tks_writer *w, tks_unit_stats *us,
                        uint64_t *empty, deferred *dj, progress *pg) {
    const tks_build_opts *o = &j->o;
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads(), rc = 0, done = 0;
    reader rd = {.in = in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20), .stop = o->stop};
    rd.fill = rd.batch_bytes / 8;
    prefetch pf = {.r = &rd};
    tks_build_progress base = j->prog;
    sink c = {.j = j, .k = k, .in = in, .w = w, .us = us, .empty = empty, .dj = dj, .pg = pg,
              .skip = pg->next, .dh = XXH3_createState()};
    if (!c.dh) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    XXH3_128bits_reset(c.dh);
    tks__drain drain = {sink_drain, &c};
    tks__prefetch_start(&pf);
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = tks__prefetch_take(&pf, &b))) break;
        done = b->end;
        if (!done) tks__prefetch_start(&pf);
        c.first = 0; /* records the kept shards hold: read, hashed, not encoded */
        while (c.first < b->n && b->ordinal[c.first] < c.skip) c.first++;
        c.next = 0;
        if (b->n > c.first) rc = tks__encode_batch(j->tk, b, c.first, threads, in->jsonl_key, in->max_doc, &drain);
        /* what is left of the batch: every record finished without error */
        if (!rc) rc = sink_drain(&c, b);
        tks__batch_trim(b, rd.batch_bytes);
        if (!rc && o->progress) {
            size_t ns;
            tks_writer_shards(w, &ns);
            tks_build_progress p = base;
            p.bytes_in += b->input.bytes_in;
            p.bytes_text += b->text_seen;
            p.docs_read += b->docs_seen;
            p.docs_written += us->docs_written;
            p.tokens_written += us->tokens_written;
            p.shards += ns;
            p.seconds = omp_get_wtime() - j->t0;
            o->progress(&p, o->progress_ctx);
        }
        if (!rc && o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, j->partial, TKS_NONE, TKS_NONE,
                          "interrupted in unit %llu: the complete units are kept in %s; run the "
                          "same command with --resume to finish",
                          (unsigned long long)k, j->partial);
    }
    tks__prefetch_free(&pf); /* a reader still running after an error is joined */
    XXH3_freeState(c.dh);
    if (!rc && c.skip)
        rc = tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                      "cannot resume unit %llu: its input ends before the %llu records its kept shards "
                      "were made from (an input was changed in place since the interrupted build); "
                      "remove %s and build again",
                      (unsigned long long)k, (unsigned long long)pg->next, j->partial);
    us->text_bytes = rd.text;
    return rc;
}

/* Builds unit k into its directory, from the shards an earlier run sealed
 * (progress.json) or from its start; its record written last. */
static int unit_build(tks_build_job *j, uint64_t k, tks_unit_stats *us) {
    char dir[PATH_MAX], path[PATH_MAX];
    tks__range *r = NULL;
    size_t nr = 0, ns = 0;
    tks_input *in = NULL;
    tks_writer *w = NULL;
    tks_shard_info *all = NULL;
    progress pg;
    int rc = unit_dir(j, k, dir, sizeof dir);
    int resumed = !rc && read_progress(j, k, &pg);
    if (!resumed) memset(&pg, 0, sizeof pg);
    uint64_t empty = pg.empty;
    deferred dj = pg.dj;
    us->docs_written = pg.docs_written;
    us->tokens_written = pg.tokens_written;
    us->resumed_shards = pg.n;
    if (!rc) {
        if (resumed) keep_progress_only(dir, &pg);
        else rc = reset_dir(dir);
    }
    if (!rc) rc = tks__unit_ranges(j->ls, &j->plan, k, j->unit_bytes, &r, &nr);
    if (!rc) rc = tks__input_view(j->ls, r, nr, j->o.stop, &in);
    if (!rc) rc = tks__open_writer(&j->o, j->tk, dir, (uint32_t)pg.n, &w);
    if (!rc) rc = unit_batches(j, k, in, w, us, &empty, &dj, &pg);
    if (!rc) rc = tks_writer_flush(w);
    if (!rc) { /* the kept shards, then this run's */
        size_t nw;
        const tks_shard_info *si = tks_writer_shards(w, &nw);
        ns = pg.n + nw;
        if (!(all = calloc(ns ? ns : 1, sizeof *all))) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
        else {
            if (pg.n) memcpy(all, pg.shards, pg.n * sizeof *all);
            if (nw) memcpy(all + pg.n, si, nw * sizeof *all);
        }
    }
    json_t *rec = NULL;
    if (!rc && !(rec = new_record(j, k, in, r, nr, all, ns, empty, &dj)))
        rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = write_record(j, k, rec);
    if (!rc && unit_file(j, k, UNIT_PROGRESS, path, sizeof path) == 0) unlink(path); /* unit.json says all */
    if (!rc) {
        unit_state *s = &j->us[k];
        s->shards = all;
        all = NULL;
        s->n = ns;
        s->rec = rec;
        rec = NULL;
        us->bytes_in = tks_input_get_stats(in)->bytes_in;
    }
    json_decref(rec);
    free(all);
    free(pg.shards);
    tks_writer_free(w);
    tks_input_free(in);
    free(r);
    return rc;
}

int tks_build_job_run(tks_build_job *j, uint64_t k, tks_unit_stats *us) {
    double t0 = omp_get_wtime();
    memset(us, 0, sizeof *us);
    if (k >= j->plan.n_units)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE, "no unit %llu", (unsigned long long)k);
    unit_state *s = &j->us[k];
    json_decref(s->rec);
    free(s->shards);
    memset(s, 0, sizeof *s);
    int rc = 0;
    if (load_complete(j, k, &s->rec, &s->shards, &s->n)) { /* complete from an earlier run */
        rc = verify_ranges(j, k, s->rec);
        us->kept = !rc;
        us->text_bytes = (uint64_t)json_integer_value(json_object_get(json_object_get(s->rec, "stats"), "bytes_text"));
        us->bytes_in = (uint64_t)json_integer_value(json_object_get(json_object_get(s->rec, "stats"), "bytes_in"));
        for (size_t i = 0; i < s->n; i++) {
            us->docs_written += s->shards[i].n_docs;
            us->tokens_written += s->shards[i].n_tokens;
        }
    } else {
        rc = unit_build(j, k, us);
    }
    if (!rc) {
        s->ran = 1;
        us->shards = s->n;
        j->prog.bytes_in += us->bytes_in;
        j->prog.bytes_text += us->text_bytes;
        j->prog.docs_written += us->docs_written;
        j->prog.tokens_written += us->tokens_written;
        j->prog.shards += s->n;
    }
    /* a failure names the unit: another process's error is read on its own */
    if (rc && tks_last_error()->code == rc) {
        tks_error e = *tks_last_error();
        char msg[sizeof e.message + 32];
        snprintf(msg, sizeof msg, "unit %llu: %s", (unsigned long long)k, e.message);
        snprintf(e.message, sizeof e.message, "%.*s", (int)sizeof e.message - 1, msg);
        tks_error_restore(&e);
    }
    us->seconds = omp_get_wtime() - t0;
    return rc;
}

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
    *fd = open(path, O_RDWR | O_CLOEXEC);
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
                    json_array_size(ranges), n, {0}};
    stats_add(&h.stats, st);
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
    int rc = unit_dir(j, k, dir, sizeof dir), any = 0;
    tks_error first = {0};
    tks_shard_info *si = calloc(s->n ? s->n : 1, sizeof *si);
    if (!rc && !si) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    int threads = j->o.threads > 0 ? j->o.threads : omp_get_max_threads();
    /* in parallel: on a shared filesystem each fsync is a round trip */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (!rc && s->n > 1)
    for (size_t i = 0; i < (rc ? 0 : s->n); i++) {
        char from[PATH_MAX], to[PATH_MAX], name[32];
        si[i] = s->shards[i];
        global_name(base + i, name);
        int e = tks_path_join(from, sizeof from, dir, si[i].file);
        if (!e) e = tks_path_join(to, sizeof to, j->partial, name);
        if (!e) e = place_shard(from, to, (uint32_t)i, (uint32_t)(base + i), &si[i]);
        snprintf(si[i].file, sizeof si[i].file, "%s", name);
        si[i].index = (uint32_t)(base + i);
        if (e) {
#pragma omp critical(tks_place_err)
            if (!any) {
                any = 1;
                first = *tks_last_error();
            }
        }
    }
    if (!rc && any) {
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
                global_name(*n_all, want);
            if (want[0])
                return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                                "unit %zu's shard %zu is not %s: the units were placed from other "
                                "shard counts; re-run the same command with --resume", k, i, want);
            (*all)[(*n_all)++] = si[i];
        }
    }
    return 0;
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
    for (size_t k = 0; k < nu && !rc; k++) {
        const tks_input_stats *s = &res[k]->stats;
#define ADD(f) input.f += s->f
        ADD(files); ADD(entries); ADD(bytes_in); ADD(bytes_text); ADD(docs); ADD(empty_skipped);
        ADD(utf8_invalid_docs); ADD(utf8_replaced); ADD(utf8_skipped); ADD(long_skipped);
        ADD(bad_records_skipped); ADD(binary_skipped); ADD(json_as_text);
#undef ADD
        empty += res[k]->empty_after_tokenize;
    }
    input.bad_inputs_skipped = tks_input_get_stats(j->ls)->bad_inputs_skipped;
    input.links_outside = tks_input_get_stats(j->ls)->links_outside; /* the listing's, as the skipped */
    input.links_skipped = tks_input_get_stats(j->ls)->links_skipped;
    if (!rc && n_all == 0) rc = tks__no_text(&input);
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

int tks_build_job_sync(tks_build_job *j) { return tks_fsync_dir(j->partial); }

void tks_build_job_encoder_stats(const tks_build_job *j, tks_encoder_stats *st) { tks_tok_encoder_stats(j->tk, st); }

void tks_build_job_clean(tks_build_job *j, uint64_t k) {
    char dir[PATH_MAX], path[PATH_MAX];
    if (unit_dir(j, k, dir, sizeof dir) || tks_path_join(path, sizeof path, dir, UNIT_RECORD)) return;
    unlink(path);
    if (tks_path_join(path, sizeof path, dir, UNIT_PROGRESS) == 0) unlink(path);
    rmdir(dir);
}

int tks_build_job_publish(tks_build_job *j) {
    char p[PATH_MAX];
    if (tks_path_join(p, sizeof p, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD)) == 0) unlink(p);
    if (tks_path_join(p, sizeof p, j->partial, "in-flight") == 0 && access(p, F_OK) == 0) { /* tokshard's report under mpirun */
        reset_dir(p);
        rmdir(p);
    }
    tks_partial_clean(j->partial, j->n_shards, NULL); /* temporary files, shards of no unit */
    int rc = tks_fsync_dir(j->partial);
    return rc ? rc : tks_partial_publish(TKS_PARTIAL_BUILD, j->partial, j->out);
}

void tks_build_job_free(tks_build_job *j) {
    if (!j) return;
    for (size_t k = 0; j->us && k < j->plan.n_units; k++) {
        json_decref(j->us[k].rec);
        free(j->us[k].shards);
    }
    free(j->us);
    free(j->bases);
    tks__plan_free(&j->plan);
    json_decref(j->desc);
    tks_input_free(j->ls);
    tks_tok_free(j->tk);
    tks_unlock(j->lock_fd, j->lock_path);
    free(j);
}

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

int tks_build(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    tks_build_job *j = NULL;
    int rc = tks_build_job_open(o, &j);
    uint64_t kept = 0, kept_shards = 0;
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
