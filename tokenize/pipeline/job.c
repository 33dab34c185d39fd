/* job.c - a build job (tks_build_job_*, tokenize.h): the output's lock and
 * paths, the listing and the plan of the work units, OUT.partial created or
 * resumed with its build-state.json, the listing shared between processes
 * (the life cycle: pipeline.h, "The build job"). */
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

static int job_paths(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    if (!o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    j->unit_bytes = o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES;
    if (j->unit_bytes < TKS_MIN_UNIT_BYTES)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--unit-bytes %llu is below the least work unit, 64K (%llu bytes): each unit "
                        "costs a directory, a record and a look at its file's first 64 KiB, and units "
                        "smaller than a document are empty; give 64K or more (the default, 1G, suits "
                        "most inputs)", (unsigned long long)j->unit_bytes, TKS_MIN_UNIT_BYTES);
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

/* 1 when OUT.partial holds manifest.json: the run that left it wrote the
 * manifest, the last step before publishing (every unit placed). */
static int has_manifest(const char *partial) {
    char p[PATH_MAX];
    return tks_path_join(p, sizeof p, partial, TKS_MANIFEST_NAME) == 0 && access(p, F_OK) == 0;
}

/* This build's OUT.partial with its manifest: the dataset, complete, which
 * the interrupted run did not get to publish (stopped before the rename, or
 * the rename refused). It must open as a dataset; the job then builds
 * nothing (j->complete) and its shards are counted for publishing. */
static int take_complete(tks_build_job *j) {
    tks_dataset *ds = NULL;
    if (tks_dataset_open(j->partial, &ds) != 0) {
        char why[sizeof tks_last_error()->message];
        snprintf(why, sizeof why, "%s", tks_last_error()->message);
        return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                        "cannot resume: %s holds the manifest of a finished build but does not open as a "
                        "dataset (%s); remove it and build again", j->partial, why);
    }
    j->complete = 1;
    j->n_shards = tks_dataset_n_shards(ds);
    tks_dataset_close(ds);
    return 0;
}

/* An existing OUT.partial, under --resume: its state must be this build's. */
static int resume_partial(tks_build_job *j) {
    char state[PATH_MAX];
    int rc = tks_path_join(state, sizeof state, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
    if (rc) return rc;
    if (access(state, F_OK) != 0) { /* stopped before its state: nothing can be kept */
        if (has_manifest(j->partial)) /* a dataset whose state an older tokshard removed before publishing */
            return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                            "cannot resume: %s holds a finished dataset (manifest.json) without its "
                            "build-state.json, so nothing shows that it is this build's: check it with "
                            "`tokshard audit %s` and rename it to %s yourself, or remove it and build "
                            "again", j->partial, j->partial, j->out);
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
    return !rc && has_manifest(j->partial) ? take_complete(j) : rc;
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
    struct stat sb;
    int have = stat(j->partial, &sb) == 0, rc;
    if (have && !o->resume)
        return tks_fail(TKS_ERR_EXISTS, j->partial, TKS_NONE, TKS_NONE,
                        "%s exists from an interrupted or failed build: re-run with --resume to "
                        "continue it, or remove it to start over",
                        j->partial);
    rc = have ? resume_partial(j) : tks_partial_create(j->partial);
    if (!rc && j->complete) return 0; /* nothing to build: publishing is left */
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

int tks_build_job_sync(tks_build_job *j) { return tks_fsync_dir(j->partial); }

void tks_build_job_encoder_stats(const tks_build_job *j, tks_encoder_stats *st) { tks_tok_encoder_stats(j->tk, st); }
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

