/* wtrain.c - training a byte-level BPE tokenizer on the inputs
 * (tks_bpe_train, tokenize.h): the job's lock, listing, plan and id,
 * OUT.partial fresh or resumed, each work unit counted (wunit.c) and
 * recorded, the runs merged (wruns.c) into words.cnt, then the merge
 * phase (wmerge.c) and publishing (pipeline.h, "Counting words"). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

#define STATE_NAME "train-state.json"
#define WORDS_NAME "words.cnt"
#define WORDS_REC "words.json"
#define JOB_VERSION "tokshard bpe-train 1"

void tks_bpe_train_opts_default(tks_bpe_train_opts *o) {
    memset(o, 0, sizeof *o);
    tks_input_opts_default(&o->input);
    o->pattern = "gpt2";
    o->vocab_size = 32000;
}

/* ---------------------------------------------------------------------------
 * The job: paths, lock, listing, plan, id
 * ------------------------------------------------------------------------- */
static int job_paths(tks__bt_job *j) {
    const tks_bpe_train_opts *o = j->o;
    if (!o->out_dir || !*o->out_dir || !o->n_inputs || !o->inputs || !o->pattern || !o->vocab_size)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "training needs --output, a pattern, a vocabulary size and at least one input");
    size_t n = strlen(o->out_dir);
    while (n > 1 && o->out_dir[n - 1] == '/') n--;
    if (snprintf(j->out, sizeof j->out, "%.*s", (int)n, o->out_dir) >= (int)sizeof j->out ||
        snprintf(j->partial, sizeof j->partial, "%s.partial", j->out) >= (int)sizeof j->partial ||
        snprintf(j->lock_path, sizeof j->lock_path, "%s.lock", j->out) >= (int)sizeof j->lock_path)
        return tks_fail(TKS_ERR_ARG, o->out_dir, TKS_NONE, TKS_NONE, "--output path too long");
    struct stat sb;
    if (stat(j->out, &sb) == 0)
        return tks_fail(TKS_ERR_EXISTS, j->out, TKS_NONE, TKS_NONE,
                        "%s exists: remove it or choose another --output", j->out);
    tks_build_opts bo;
    tks_build_opts_default(&bo);
    bo.inputs = o->inputs;
    bo.n_inputs = o->n_inputs;
    return tks__check_output_apart(j->out, &bo);
}

/* The job id: what the counts depend on (the listing, the input options,
 * the pattern's regex, the unit size), XXH3-64 as 16 hex digits. */
static int job_id(tks__bt_job *j) {
    const tks_input_opts *io = &j->o->input;
    XXH3_state_t *st = XXH3_createState();
    if (!st) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, JOB_VERSION, sizeof JOB_VERSION);
    const char *rx = tks_pretok_regex(j->pt);
    XXH3_64bits_update(st, rx, strlen(rx) + 1);
    uint64_t v[] = {io->split, io->format, io->invalid_utf8, io->max_doc_bytes, io->long_doc, io->bad_record,
                    io->bad_input, (uint64_t)io->no_follow_links, j->unit_bytes};
    XXH3_64bits_update(st, v, sizeof v);
    const char *keys[] = {io->jsonl_key ? io->jsonl_key : "text", io->parquet_column ? io->parquet_column : "text"};
    for (int k = 0; k < 2; k++) XXH3_64bits_update(st, keys[k], strlen(keys[k]) + 1);
    const tks_input *in = j->ls;
    for (size_t i = 0; i < in->n_files; i++) {
        uint64_t f[3] = {in->sizes[i], (uint64_t)in->meta[i].mtime.tv_sec, (uint64_t)in->meta[i].mtime.tv_nsec};
        XXH3_64bits_update(st, in->files[i], strlen(in->files[i]) + 1);
        XXH3_64bits_update(st, f, sizeof f);
    }
    for (size_t i = 0; tks_input_skipped_file(in, i); i++)
        XXH3_64bits_update(st, tks_input_skipped_file(in, i), strlen(tks_input_skipped_file(in, i)) + 1);
    snprintf(j->id, sizeof j->id, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
    XXH3_freeState(st);
    return 0;
}

/* Memory, threads and the buffers they give. */
static void job_sizes(tks__bt_job *j) {
    const tks_bpe_train_opts *o = j->o;
    j->threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    if (j->threads < 1) j->threads = 1;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (8ull << 30);
    j->memory = o->memory ? o->memory : ram / 4;
    j->unit_bytes = o->unit_bytes ? o->unit_bytes : (256ull << 20);
    uint64_t bb = j->memory / 16;
    j->batch_bytes = bb < (256u << 10) ? (256u << 10) : bb > (8u << 20) ? (8u << 20) : (size_t)bb;
    uint64_t rb = j->memory / 256;
    j->run_buf = rb < (16u << 10) ? (16u << 10) : rb > (1u << 20) ? (1u << 20) : (size_t)rb;
    /* the reader's two batches (an arena of up to twice batch_bytes each) aside, five
     * eighths of the rest for the threads' tables */
    uint64_t rest = j->memory > 4 * (uint64_t)j->batch_bytes ? j->memory - 4 * (uint64_t)j->batch_bytes : 0;
    j->table_bytes = (size_t)(rest / 8 * 5 / (uint64_t)j->threads);
}

static int job_open(tks__bt_job *j) {
    int rc = job_paths(j);
    if (!rc) rc = tks_lock(j->lock_path, "tokshard train-tokenizer", &j->lock_fd);
    if (!rc) rc = tks_pretok_open(j->o->pattern, &j->pt);
    job_sizes(j);
    tks_input_opts io = j->o->input;
    if (!io.stop) io.stop = j->o->stop;
    if (!rc) rc = tks__input_list(j->o->inputs, j->o->n_inputs, &io, &j->ls);
    buf v = {0};
    if (!rc) rc = tks__input_check_promises(j->ls, 0, 1, &v);
    if (!rc) rc = tks__input_settle(j->ls, v.p ? v.p : "", v.len);
    free(v.p);
    if (!rc) rc = tks__plan_make(j->ls, j->unit_bytes, &j->plan);
    if (!rc) rc = job_id(j);
    if (!rc && !(j->rec = calloc(j->plan.n_units ? j->plan.n_units : 1, sizeof *j->rec)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    return rc;
}

/* ---------------------------------------------------------------------------
 * OUT.partial: created, or resumed and cleaned
 * ------------------------------------------------------------------------- */
static int write_json(const char *dir, const char *name, json_t *js) {
    char path[PATH_MAX];
    char *text = js ? json_dumps(js, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    int rc = text ? tks_path_join(path, sizeof path, dir, name)
                  : tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static json_t *read_json(const char *dir, const char *name) {
    char path[PATH_MAX];
    if (tks_path_join(path, sizeof path, dir, name)) return NULL;
    json_t *js = json_load_file(path, 0, NULL);
    tks_clear_error();
    return js;
}

/* 1 when rec is unit k's record of this job and (runs) each of its runs is
 * whole. */
static int unit_record_ok(const tks__bt_job *j, uint64_t k, const json_t *rec, int runs_too) {
    const char *id = json_string_value(json_object_get(rec, "job"));
    json_t *runs = json_object_get(rec, "runs");
    if (!id || strcmp(id, j->id) || (uint64_t)json_integer_value(json_object_get(rec, "unit")) != k ||
        !json_is_array(runs) || !json_is_object(json_object_get(rec, "stats")))
        return 0;
    for (size_t i = 0; runs_too && i < json_array_size(runs); i++) {
        char path[PATH_MAX];
        tks__run_head h;
        const char *name = json_string_value(json_array_get(runs, i));
        if (!name || strchr(name, '/') || tks_path_join(path, sizeof path, j->partial, name) ||
            tks__run_read_head(path, &h)) {
            tks_clear_error();
            return 0;
        }
    }
    return 1;
}

/* 1 when words.json records words.cnt of this job, whole. */
static int words_ok(const tks__bt_job *j) {
    json_t *w = read_json(j->partial, WORDS_REC);
    const char *id = json_string_value(json_object_get(w, "job"));
    char path[PATH_MAX];
    tks__run_head h;
    int ok = id && !strcmp(id, j->id) && !tks_path_join(path, sizeof path, j->partial, WORDS_NAME) &&
             !tks__run_read_head(path, &h) &&
             (uint64_t)json_integer_value(json_object_get(w, "words")) == h.words;
    json_decref(w);
    tks_clear_error();
    return ok;
}

/* Removes what the kept state does not name: runs of units without a
 * record, temporary files, an unfinished publish directory. */
static void clean_partial(tks__bt_job *j) {
    DIR *d = opendir(j->partial);
    struct dirent *e;
    char path[PATH_MAX];
    int words = j->have_words;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, STATE_NAME)) continue;
        int keep = words && (!strcmp(n, WORDS_NAME) || !strcmp(n, WORDS_REC));
        unsigned long long u;
        if (!keep && sscanf(n, "unit-%llu.json", &u) == 1 && u < j->plan.n_units) keep = j->rec[u] != NULL;
        for (uint64_t k = 0; !keep && !words && k < j->plan.n_units; k++) {
            json_t *runs = json_object_get(j->rec[k], "runs");
            for (size_t i = 0; !keep && i < json_array_size(runs); i++)
                keep = !strcmp(n, json_string_value(json_array_get(runs, i)));
        }
        if (keep || tks_path_join(path, sizeof path, j->partial, n)) continue;
        if (!strcmp(n, "publish")) tks__bt_remove_dir(path); /* a link at that name: itself */
        else unlink(path);
    }
    if (d) closedir(d);
}

/* A fresh OUT.partial: its parents made as needed, itself created anew (an
 * existing one, a link included, is refused by mkdir). */
static int partial_create(const tks__bt_job *j) {
    char parent[PATH_MAX];
    const char *slash = strrchr(j->partial, '/');
    if (slash && slash != j->partial) {
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - j->partial), j->partial);
        int rc = tks_mkdir_p(parent);
        if (rc) return rc;
    }
    if (mkdir(j->partial, 0755) != 0)
        return tks_fail(tks_write_errno_code(errno), j->partial, TKS_NONE, TKS_NONE, "cannot create %s: %s",
                        j->partial, strerror(errno));
    return 0;
}

static int job_partial(tks__bt_job *j) {
    struct stat sb;
    int have = lstat(j->partial, &sb) == 0;
    if (have && j->o->resume) { /* a directory of the user's, never a link followed */
        int fd, rc = tks__bt_open_dir(j->partial, "the counts of an earlier run,", &fd);
        if (rc) return rc;
        close(fd);
    }
    if (have && !j->o->resume)
        return tks_fail(TKS_ERR_EXISTS, j->partial, TKS_NONE, TKS_NONE,
                        "%s exists from an interrupted or failed training: re-run with --resume to go on, "
                        "or remove it to start over",
                        j->partial);
    if (have) {
        json_t *st = read_json(j->partial, STATE_NAME);
        const char *id = json_string_value(json_object_get(st, "job"));
        int same = id && !strcmp(id, j->id);
        char was[17];
        snprintf(was, sizeof was, "%s", id ? id : "none");
        json_decref(st);
        if (!same && id)
            return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                            "cannot resume: %s was counted from other inputs, input options, pattern or "
                            "--unit-bytes (job %s, now %s); re-run with the original ones, or remove %s to "
                            "start over",
                            j->partial, was, j->id, j->partial);
        j->have_words = id && words_ok(j); /* then the units' runs are in words.cnt */
        for (uint64_t k = 0; k < j->plan.n_units && id; k++) {
            char name[32];
            snprintf(name, sizeof name, "unit-%05llu.json", (unsigned long long)k);
            json_t *rec = read_json(j->partial, name);
            if (rec && unit_record_ok(j, k, rec, !j->have_words)) j->rec[k] = rec;
            else json_decref(rec);
        }
        clean_partial(j);
    } else {
        int rc = partial_create(j);
        if (rc) return rc;
    }
    json_t *st = json_pack("{s:s, s:I, s:I}", "job", j->id, "units", (json_int_t)j->plan.n_units, "unit_bytes",
                           (json_int_t)j->unit_bytes);
    int rc = write_json(j->partial, STATE_NAME, st);
    json_decref(st);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Counting: every unit without a record
 * ------------------------------------------------------------------------- */
static int count_unit(tks__bt_job *j, tks__wcount *c, uint64_t k) {
    tks_input_stats st;
    for (size_t i = 0; i < c->n_runs; i++) free(c->runs[i]);
    c->n_runs = 0;
    c->unit = k;
    int rc = tks__wunit_count(j->ls, &j->plan, j->unit_bytes, c, &st);
    if (!rc) rc = tks_fsync_dir(j->partial); /* the runs' names durable before the record */
    if (rc) return rc;
    json_t *runs = json_array();
    for (size_t i = 0; runs && i < c->n_runs; i++) json_array_append_new(runs, json_string(c->runs[i]));
    json_t *rec = json_pack("{s:s, s:I, s:o, s:o, s:I, s:I}", "job", j->id, "unit", (json_int_t)k, "runs", runs,
                            "stats", tks__stats_json(&st), "pieces", (json_int_t)(c->pieces + c->short_pieces),
                            "text_bytes", (json_int_t)c->text_bytes);
    char name[32];
    snprintf(name, sizeof name, "unit-%05llu.json", (unsigned long long)k);
    rc = write_json(j->partial, name, rec);
    if (!rc) j->rec[k] = rec;
    else json_decref(rec);
    return rc;
}

static void unit_totals(tks__bt_job *j, uint64_t k, tks_bpe_train_progress *base) {
    const json_t *rec = j->rec[k], *s = json_object_get(rec, "stats");
    tks__stats_add(&j->st.input, s);
    j->st.pieces += (uint64_t)json_integer_value(json_object_get(rec, "pieces"));
    j->st.runs += json_array_size(json_object_get(rec, "runs"));
    base->bytes_in += (uint64_t)json_integer_value(json_object_get(s, "bytes_in"));
    base->bytes_text += (uint64_t)json_integer_value(json_object_get(rec, "text_bytes"));
    base->docs += (uint64_t)json_integer_value(json_object_get(s, "docs"));
    base->pieces += (uint64_t)json_integer_value(json_object_get(rec, "pieces"));
    base->units++;
    base->runs = j->st.runs;
}

static int count_all(tks__bt_job *j) {
    const tks_bpe_train_opts *o = j->o;
    tks__wcount c = {.pt = j->pt, .threads = j->threads, .dir = j->partial, .run_buf = j->run_buf,
                     .batch_bytes = j->batch_bytes, .stop = o->stop, .progress = o->progress,
                     .progress_ctx = o->progress_ctx};
    c.base.total_bytes_in = tks_input_total_bytes(j->ls);
    c.base.n_units = j->plan.n_units;
    if (!(c.tabs = calloc((size_t)j->threads, sizeof *c.tabs)))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (int t = 0; t < j->threads; t++) tks__wtab_init(&c.tabs[t], j->table_bytes);
    int rc = 0;
    for (uint64_t k = 0; !rc && k < j->plan.n_units; k++) {
        if (j->rec[k]) {
            j->st.units_kept++;
        } else if (!j->have_words) {
            c.prog = c.base;
            rc = count_unit(j, &c, k);
        }
        if (!rc && j->rec[k]) unit_totals(j, k, &c.base);
        c.base.seconds = omp_get_wtime() - j->t0;
        if (!rc && o->progress && j->rec[k]) {
            c.base.runs = j->st.runs;
            o->progress(&c.base, o->progress_ctx);
        }
    }
    j->st.units = j->plan.n_units;
    for (int t = 0; t < j->threads; t++) tks__wtab_free(&c.tabs[t]);
    for (size_t i = 0; i < c.n_runs; i++) free(c.runs[i]);
    free(c.runs);
    free(c.tabs);
    if (!rc && !j->have_words && !j->st.pieces) rc = tks__no_text(&j->st.input);
    return rc;
}

/* ---------------------------------------------------------------------------
 * The runs merged into words.cnt, at most `fan` at a time
 * ------------------------------------------------------------------------- */
static int merge_pass(tks__bt_job *j, char ***names, size_t *n, int pass, size_t fan, int *owned) {
    size_t groups = (*n + fan - 1) / fan;
    char **out = calloc(groups, sizeof *out);
    int rc = out ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t g = 0; !rc && g < groups; g++) {
        size_t a = g * fan, m = *n - a < fan ? *n - a : fan;
        char name[48], path[PATH_MAX];
        snprintf(name, sizeof name, "merge-%02d-%05zu.cnt", pass, g);
        rc = tks_path_join(path, sizeof path, j->partial, name);
        if (!rc && !(out[g] = strdup(path))) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        if (!rc) rc = tks__runs_merge((const char *const *)*names + a, m, path, j->run_buf, j->o->stop);
    }
    for (size_t i = 0; i < *n; i++) {
        if (*owned) unlink((*names)[i]); /* a pass's own runs go once merged */
        free((*names)[i]);
    }
    free(*names);
    *names = out;
    *n = groups;
    *owned = 1;
    return rc;
}

static int merge_runs(tks__bt_job *j) {
    size_t n = 0, fan;
    char **names = NULL, path[PATH_MAX];
    for (uint64_t k = 0; k < j->plan.n_units; k++) n += json_array_size(json_object_get(j->rec[k], "runs"));
    if (!(names = calloc(n ? n : 1, sizeof *names))) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    int rc = 0, owned = 0;
    n = 0;
    for (uint64_t k = 0; !rc && k < j->plan.n_units; k++) {
        json_t *runs = json_object_get(j->rec[k], "runs");
        for (size_t i = 0; !rc && i < json_array_size(runs); i++) {
            rc = tks_path_join(path, sizeof path, j->partial, json_string_value(json_array_get(runs, i)));
            if (!rc && !(names[n++] = strdup(path))) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        }
    }
    /* as many runs at once as the memory's buffers and the open files allow */
    struct rlimit rl;
    fan = (size_t)(j->memory / 2 / j->run_buf);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && fan > rl.rlim_cur / 2)
        fan = (size_t)rl.rlim_cur / 2;
    if (fan > 512) fan = 512;
    if (fan < 2) fan = 2;
    for (int pass = 0; !rc && n > fan; pass++) rc = merge_pass(j, &names, &n, pass, fan, &owned);
    if (!rc) rc = tks_path_join(path, sizeof path, j->partial, WORDS_NAME);
    if (!rc) rc = tks__runs_merge((const char *const *)names, n, path, j->run_buf, j->o->stop);
    for (size_t i = 0; i < n; i++) {
        if (owned) unlink(names[i]);
        free(names[i]);
    }
    free(names);
    tks__run_head h;
    if (!rc) rc = tks__run_read_head(path, &h);
    json_t *w = rc ? NULL : json_pack("{s:s, s:I, s:I}", "job", j->id, "words", (json_int_t)h.words, "bytes",
                                      (json_int_t)h.bytes);
    if (!rc) rc = write_json(j->partial, WORDS_REC, w);
    json_decref(w);
    if (!rc) j->have_words = 1, clean_partial(j); /* the units' runs are in words.cnt now */
    return rc;
}

/* ---------------------------------------------------------------------------
 * tks_bpe_train
 * ------------------------------------------------------------------------- */
static void job_free(tks__bt_job *j) {
    for (uint64_t k = 0; j->rec && k < j->plan.n_units; k++) json_decref(j->rec[k]);
    free(j->rec);
    tks__plan_free(&j->plan);
    tks_input_free(j->ls);
    tks_pretok_free(j->pt);
    tks_unlock(j->lock_fd, j->lock_fd >= 0 ? j->lock_path : NULL);
}

int tks_bpe_train(const tks_bpe_train_opts *o, tks_bpe_train_stats *st) {
    if (!o) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_train: NULL options");
    tks__bt_job j = {.o = o, .lock_fd = -1, .t0 = omp_get_wtime()};
    int rc = job_open(&j);
    if (!rc) rc = job_partial(&j);
    double t = omp_get_wtime();
    if (!rc) rc = count_all(&j);
    j.st.count_seconds = omp_get_wtime() - t;
    t = omp_get_wtime();
    if (!rc && !j.have_words) {
        if (o->progress) {
            tks_bpe_train_progress p = {.phase = 1, .units = j.plan.n_units, .n_units = j.plan.n_units,
                                        .runs = j.st.runs, .seconds = omp_get_wtime() - j.t0};
            o->progress(&p, o->progress_ctx);
        }
        rc = merge_runs(&j);
    }
    j.st.runs_seconds = omp_get_wtime() - t;
    if (!rc) rc = tks__wtrain_finish(&j);
    j.st.seconds = omp_get_wtime() - j.t0;
    if (st) *st = j.st;
    job_free(&j);
    return rc;
}
