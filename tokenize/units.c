/* units.c - the build by work units (tks_build_job_*), for many processes
 * (tokshard build under mpirun), and a --resume by work units of a build
 * started without them. */
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

#include "internal.h"

/* ---------------------------------------------------------------------------
 * Work units (tks_build_job_*)
 *
 * OUT.partial/build-state.json: {"build_id", "mode": "units", "units",
 *   "inputs_xxh3_128"} (written by the coordinator after planning)
 * OUT.partial/unit-NNNNN/shard-LLLLL.tks: unit N's shards, numbered from 0
 * OUT.partial/unit-NNNNN/unit.json: written last, when the unit is complete
 * finish: each unit's shards get their index in the dataset (the header's
 * shard_index and its checksum: 256 bytes rewritten in place, fsync) and
 * are renamed to OUT.partial/shard-GGGGG.tks; a header rewritten but not yet
 * renamed, or renamed, is recognized on --resume.
 * OUT.partial/plain-state.json: while a build started without work units is
 * resumed by them, the state it left (see plain_unit).
 * ------------------------------------------------------------------------- */
#define UNIT_RECORD "unit.json"

struct tks_build_job {
    tks_build_opts o;
    int coordinator;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_tok *tk;
    uint32_t bos, eos;
    /* coordinator */
    json_t *desc;
    char build_id[17];
    tks_build_unit *units;
    size_t n_units, cap_units;
    unsigned char *done;
    tks_input_stats input;
    double t0;
    /* planning, one unit per tks_build_job_plan call */
    tks_input *plan_in;
    tks_build_unit cur;
    int planning, resuming;
    char (*was)[33];        /* resumed: the inputs' hashes the state recorded */
    size_t n_was;
    uint64_t kept_base;     /* dataset index of the next kept unit's first shard, or TKS_NONE */
    /* resumed from a build started without mpirun (PLAIN_NAME): its shards,
     * moved unit by unit into the units' layout as each unit is planned */
    tks_build_plain plain;
    tks_shard_info *plain_shards; /* as its state recorded them: global index, file */
    uint64_t *plain_ends;         /* their end_ordinal; NULL when any is not recorded */
    uint64_t plain_next;          /* its next_ordinal: documents before it are in its shards */
    size_t plain_cur;             /* next plain shard to match to a unit */
    uint64_t plain_docs;          /* the ordinal where plain shard plain_cur starts */
};

static int job_paths(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    if (!o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
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

static int unit_dir(const tks_build_job *j, uint64_t k, char *out, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "unit-%05llu", (unsigned long long)k);
    return tks_path_join(out, cap, j->partial, name);
}

/* A unit's record: its shards (local numbering) and counters. 0 with *n set,
 * or TKS_ERR_RESUME when missing or not of this build. */
typedef struct unit_record {
    tks_shard_info *shards;
    size_t n;
    uint64_t empty_after_tokenize;
} unit_record;

static int load_record(const tks_build_job *j, uint64_t k, const char *build_id, unit_record *r) {
    char dir[PATH_MAX], path[PATH_MAX];
    memset(r, 0, sizeof *r);
    int rc = unit_dir(j, k, dir, sizeof dir);
    if (!rc) rc = tks_path_join(path, sizeof path, dir, UNIT_RECORD);
    if (rc) return rc;
    json_t *js = json_load_file(path, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    json_t *arr = json_object_get(js, "shards");
    if (!js || !id || strcmp(id, build_id) != 0 || !json_is_array(arr) ||
        (uint64_t)json_integer_value(json_object_get(js, "unit")) != k) {
        json_decref(js);
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "%s is missing or not a record of this build: unit %llu is not complete; "
                        "re-run with --resume to build it",
                        path, (unsigned long long)k);
    }
    r->empty_after_tokenize = (uint64_t)json_integer_value(json_object_get(js, "empty_after_tokenize"));
    r->n = json_array_size(arr);
    r->shards = calloc(r->n ? r->n : 1, sizeof *r->shards);
    if (!r->shards) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < r->n && !rc; i++) {
        if (tks_shard_record_read(json_array_get(arr, i), i, &r->shards[i]) != 0) {
            rc = tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE,
                          "%s: shard %zu malformed; remove %s and re-run with --resume", path, i, dir);
            break;
        }
    }
    json_decref(js);
    if (rc) {
        free(r->shards);
        r->shards = NULL;
    }
    return rc;
}

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

/* Unit k is complete on disk: its record, and each shard in the unit's
 * directory or already renamed to its place in the dataset (base: the
 * dataset index of the unit's first shard, TKS_NONE when not known). */
static int unit_complete(const tks_build_job *j, uint64_t k, uint64_t base, unit_record *r) {
    if (load_record(j, k, j->build_id, r) != 0) {
        tks_clear_error();
        return 0;
    }
    char dir[PATH_MAX], p[PATH_MAX], name[32];
    unit_dir(j, k, dir, sizeof dir);
    for (size_t i = 0; i < r->n; i++) {
        uint64_t g = base == TKS_NONE ? TKS_NONE : base + i;
        if (tks_path_join(p, sizeof p, dir, r->shards[i].file) == 0 &&
            shard_matches(p, &r->shards[i], (uint32_t)i, g, i))
            continue;
        if (g != TKS_NONE && g <= UINT32_MAX) {
            snprintf(name, sizeof name, "shard-%05llu.tks", (unsigned long long)g);
            if (tks_path_join(p, sizeof p, j->partial, name) == 0 && shard_matches(p, &r->shards[i], (uint32_t)i, g, i))
                continue;
        }
        free(r->shards);
        r->shards = NULL;
        return 0;
    }
    return 1;
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
        if (e->d_name[0] != '.' || strcmp(e->d_name, ".") * strcmp(e->d_name, "..") != 0)
            if (tks_path_join(p, sizeof p, dir, e->d_name) == 0) unlink(p);
    closedir(d);
    return 0;
}

static int save_units_state(const tks_build_job *j, const char hashes[][33], size_t n_files) {
    json_t *hs = json_array();
    for (size_t i = 0; i < n_files; i++) json_array_append_new(hs, json_string(hashes[i]));
    json_t *js = json_pack("{s:s, s:s, s:I, s:I, s:o}", "build_id", j->build_id, "mode", "units",
                           "units", (json_int_t)j->n_units, "unit_bytes",
                           (json_int_t)(j->o.unit_bytes ? j->o.unit_bytes : TKS_DEFAULT_UNIT_BYTES),
                           "inputs_xxh3_128", hs);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    char path[PATH_MAX];
    int rc = text ? tks_path_join(path, sizeof path, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD))
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* Is OUT.partial's state that of a build by work units? */
int tks__partial_is_units(const char *out_dir) {
    char partial[PATH_MAX], path[PATH_MAX];
    snprintf(partial, sizeof partial, "%s", out_dir);
    size_t ol = strlen(partial);
    while (ol > 1 && partial[ol - 1] == '/') partial[--ol] = 0;
    if (strlen(partial) + 9 >= sizeof partial) return 0;
    strcat(partial, ".partial");
    if (tks_path_join(path, sizeof path, partial, tks_partial_state_name(TKS_PARTIAL_BUILD)) != 0) return 0;
    json_t *js = json_load_file(path, 0, NULL);
    const char *mode = json_string_value(json_object_get(js, "mode"));
    int units = mode && !strcmp(mode, "units");
    json_decref(js);
    return units;
}

/* ---- resuming a build started without work units ----
 * Its shards are OUT.partial/shard-GGGGG.tks (dataset index in the header)
 * and its state lists them with their document counts. A plain build closes
 * a shard at each unit's last document, so each shard lies in one unit. A
 * unit whose documents are exactly those of the next plain shards (their
 * counts add up to the unit's, which proves it only when the plain build
 * found no document empty after tokenizing: an empty one is in no shard) is
 * kept: each shard's header gets the unit-local index (in place, fsync), the
 * file is renamed to OUT.partial/unit-NNNNN/shard-LLLLL.tks, and unit.json is
 * written last, as if the unit had been built. Any step interrupted is
 * recognized by the next --resume: a shard is taken from either place, its
 * header compared (index aside) with the plain state's record, which
 * PLAIN_NAME keeps until the dataset is published. */

static int plain_load(tks_build_job *j, json_t *js, const char *path) {
    json_t *arr = json_object_get(js, "shards");
    size_t n = json_array_size(arr);
    j->plain_shards = calloc(n ? n : 1, sizeof *j->plain_shards);
    if (!j->plain_shards) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (tks_shard_record_read(json_array_get(arr, i), i, &j->plain_shards[i]) != 0)
            return tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE,
                            "cannot resume: %s shard %zu malformed; remove %s and build again",
                            path, i, j->partial);
    /* the shards' end ordinals, when the state has them all (a state written
     * before they were recorded has none) */
    j->plain_ends = malloc((n ? n : 1) * sizeof *j->plain_ends);
    if (!j->plain_ends) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n && j->plain_ends; i++) {
        json_t *end = json_object_get(json_array_get(arr, i), "end_ordinal");
        if (json_is_integer(end)) {
            j->plain_ends[i] = (uint64_t)json_integer_value(end);
        } else {
            free(j->plain_ends);
            j->plain_ends = NULL;
        }
    }
    j->plain.active = 1;
    j->plain.shards = n;
    j->plain.empty_after_tokenize = (uint64_t)json_integer_value(json_object_get(js, "empty_after_tokenize"));
    j->plain.ends_recorded = j->plain_ends != NULL;
    j->plain_next = (uint64_t)json_integer_value(json_object_get(js, "next_ordinal"));
    return 0;
}

static int plain_save(const tks_build_job *j, json_t *js) {
    char path[PATH_MAX];
    char *text = json_dumps(js, JSON_INDENT(1));
    int rc = text ? tks_path_join(path, sizeof path, j->partial, PLAIN_NAME)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* A units state with PLAIN_NAME beside it: an earlier resume under mpirun
 * was converting a plain build. A PLAIN_NAME of another build is ignored
 * (its shards are then built again, never kept). */
static int plain_reload(tks_build_job *j) {
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, j->partial, PLAIN_NAME);
    if (rc || access(path, F_OK) != 0) return rc;
    json_t *js = json_load_file(path, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    if (js && id && strcmp(id, j->build_id) == 0 && json_is_array(json_object_get(js, "shards")) &&
        json_is_integer(json_object_get(js, "next_ordinal")) &&
        json_is_integer(json_object_get(js, "empty_after_tokenize")))
        rc = plain_load(j, js, path);
    json_decref(js);
    return rc;
}

static int place_shard(const char *from, const char *to, uint32_t global, tks_shard_info *si);

/* Unit u (planned, not complete on disk) from the plain shards: 1 when kept
 * (its record written; *n its shards), 0 when it must be built, or an I/O
 * error. */
/* Where plain shard i's documents end in the input, given where they start
 * (pos): its recorded end_ordinal, or, from a state without them, pos plus
 * its document count (exact only when no document was empty after
 * tokenizing: an empty one is in no shard). */
static uint64_t plain_end(const tks_build_job *j, size_t i, uint64_t pos) {
    return j->plain_ends ? j->plain_ends[i] : pos + j->plain_shards[i].n_docs;
}

static int plain_unit(tks_build_job *j, const tks_build_unit *u, size_t *n) {
    *n = 0;
    if (!j->plain.active || (!j->plain_ends && j->plain.empty_after_tokenize)) return 0;
    uint64_t s = u->start.ordinal, e = s + u->n_docs, written = 0;
    while (j->plain_cur < j->plain.shards && j->plain_docs < s)
        j->plain_docs = plain_end(j, j->plain_cur++, j->plain_docs);
    if (j->plain_docs != s || e > j->plain_next) return 0;
    size_t a = j->plain_cur;
    while (j->plain_cur < j->plain.shards && j->plain_docs < e) {
        written += j->plain_shards[j->plain_cur].n_docs;
        j->plain_docs = plain_end(j, j->plain_cur++, j->plain_docs);
    }
    size_t b = j->plain_cur;
    if (j->plain_docs != e || b == a || written > u->n_docs || b - a > UINT32_MAX || b - 1 > UINT32_MAX)
        return 0;
    char dir[PATH_MAX], from[PATH_MAX], to[PATH_MAX], name[32];
    int rc = unit_dir(j, u->index, dir, sizeof dir);
    if (!rc && mkdir(dir, 0755) != 0 && errno != EEXIST)
        rc = tks_fail(tks_write_errno_code(errno), dir, TKS_NONE, TKS_NONE, "cannot create %s: %s",
                      dir, strerror(errno));
    json_t *arr = json_array();
    for (size_t i = a; i < b && !rc; i++) {
        uint32_t local = (uint32_t)(i - a), g = (uint32_t)i;
        tks_shard_info si = j->plain_shards[i];
        snprintf(name, sizeof name, "shard-%05u.tks", local);
        rc = tks_path_join(from, sizeof from, j->partial, si.file);
        if (!rc) rc = tks_path_join(to, sizeof to, dir, name);
        if (rc) break;
        /* the plain state recorded it with its dataset index g */
        if (shard_matches(from, &si, local, g, g)) {
            rc = place_shard(from, to, local, &si);
        } else if (shard_matches(to, &si, local, g, g)) { /* moved by an interrupted resume */
            tks_shard *sh = NULL;
            rc = tks_shard_open(to, &sh);
            if (!rc) si.header_xxh3 = tks_shard_hdr(sh)->header_xxh3;
            tks_shard_close(sh);
        } else { /* missing or not the recorded shard: the unit is built again */
            json_decref(arr);
            return 0;
        }
        snprintf(si.file, sizeof si.file, "%s", name);
        si.index = local;
        if (!rc) json_array_append_new(arr, tks_shard_record(&si));
    }
    if (!rc) rc = tks_fsync_dir(j->partial);
    if (!rc) rc = tks_fsync_dir(dir);
    char rec[PATH_MAX];
    if (!rc) rc = tks_path_join(rec, sizeof rec, dir, UNIT_RECORD);
    json_t *js = rc ? NULL
                    : json_pack("{s:s, s:I, s:I, s:I, s:O}", "build_id", j->build_id, "unit",
                                (json_int_t)u->index, "n_docs", (json_int_t)u->n_docs,
                                "empty_after_tokenize", (json_int_t)(u->n_docs - written), "shards", arr);
    json_decref(arr);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    if (!rc && !text) rc = tks_fail(TKS_ERR_NOMEM, rec, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(rec, text, strlen(text));
    free(text);
    if (rc) return rc;
    *n = b - a;
    j->plain.units_kept++;
    j->plain.shards_kept += b - a;
    return 1;
}

const tks_build_plain *tks_build_job_plain(const tks_build_job *j) { return &j->plain; }

static int coordinator_open(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    int rc = tks_partial_check_out(j->out);
    if (!rc) rc = tks_lock(j->lock_path, "tokshard build", &j->lock_fd);
    if (rc) return rc;
    rc = tks__open_inputs(o, &j->plan_in);
    if (!rc) j->desc = tks__describe(o, j->plan_in, j->tk, &rc);
    if (!rc) rc = tks__build_id(j->desc, j->plan_in, j->build_id);
    char state[PATH_MAX];
    if (!rc) rc = tks_path_join(state, sizeof state, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
    struct stat sb;
    int have = !rc && stat(j->partial, &sb) == 0;
    if (!rc && have && !o->resume)
        rc = tks_fail(TKS_ERR_EXISTS, j->partial, TKS_NONE, TKS_NONE,
                      "%s exists from an interrupted or failed build: re-run with --resume to "
                      "continue it, or remove it to start over",
                      j->partial);
    if (!rc && have) {
        json_t *js = json_load_file(state, 0, NULL);
        const char *id = json_string_value(json_object_get(js, "build_id"));
        const char *mode = json_string_value(json_object_get(js, "mode"));
        json_t *was = json_object_get(js, "inputs_xxh3_128");
        int plain = js && id && !mode && json_is_array(json_object_get(js, "shards")) &&
                    json_is_integer(json_object_get(js, "next_ordinal")) &&
                    json_is_integer(json_object_get(js, "empty_after_tokenize"));
        if (!js || !id || (!plain && (!mode || strcmp(mode, "units") != 0)))
            rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                          "cannot resume: %s is missing or not a tokshard build state; remove %s "
                          "and build again",
                          state, j->partial);
        else if (strcmp(id, j->build_id) != 0)
            rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                          "cannot resume: %s was started with other inputs, tokenizer or options "
                          "(build id %.16s, now %s); re-run with the original ones, or remove %s "
                          "to start over",
                          j->partial, id, j->build_id, j->partial);
        size_t nw = json_array_size(was);
        if (!rc && nw && !(j->was = calloc(nw, sizeof *j->was)))
            rc = tks_fail(TKS_ERR_NOMEM, state, TKS_NONE, TKS_NONE, "out of memory");
        for (size_t i = 0; i < nw && !rc; i++) {
            const char *h = json_string_value(json_array_get(was, i));
            snprintf(j->was[j->n_was++], sizeof j->was[0], "%s", h ? h : "");
        }
        /* a build started without work units: its state goes to PLAIN_NAME
         * before build-state.json becomes a units state, so a crash at any
         * point leaves one of the two for the next --resume */
        if (!rc && plain) rc = plain_load(j, js, state);
        if (!rc && plain) rc = plain_save(j, js);
        if (!rc && !plain) rc = plain_reload(j);
        json_decref(js);
        j->resuming = 1;
    } else if (!rc) {
        rc = tks_partial_create(j->partial);
    }
    if (!rc) rc = tks_tokenizer_keep(TKS_PARTIAL_BUILD, j->tk, o->tokenizer_path, j->partial);
    /* the workers read the build id from here; a resumed state keeps the
     * hashes of the interrupted build until the plan has read every input */
    if (!rc) rc = save_units_state(j, (const char(*)[33])j->was, j->n_was);
    if (!rc) {
        j->planning = 1;
        tks_input_tell(j->plan_in, &j->cur.start);
    }
    return rc;
}

/* The plan has read every input: their hashes go into the description and
 * the state, and a resumed build's inputs must hash as they did. */
static int plan_end(tks_build_job *j) {
    tks_input *in = j->plan_in;
    j->input = *tks_input_get_stats(in);
    int rc = tks__add_input_hashes(j->desc, in);
    size_t nf = tks_input_n_files(in);
    char (*hashes)[33] = rc ? NULL : calloc(nf ? nf : 1, sizeof *hashes);
    if (!rc && !hashes) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < nf && !rc; i++) {
        uint8_t h[16];
        rc = tks_input_file_xxh3(in, i, h, NULL);
        if (!rc) tks_hex(h, 16, hashes[i]);
        if (!rc && j->resuming && i < j->n_was && strcmp(j->was[i], hashes[i]) != 0)
            rc = tks_fail(TKS_ERR_RESUME, tks_input_file(in, i), TKS_NONE, TKS_NONE,
                          "cannot resume: %s changed since the interrupted build (XXH3-128 %s, "
                          "was %.32s), so the units kept in %s came from other bytes; remove %s "
                          "and build again",
                          tks_input_file(in, i), hashes[i], i < j->n_was ? j->was[i] : "?",
                          j->partial, j->partial);
    }
    if (!rc) rc = save_units_state(j, (const char(*)[33])hashes, nf);
    free(hashes);
    tks_input_free(in);
    j->plan_in = NULL;
    j->planning = 0;
    return rc;
}

int tks_build_job_plan(tks_build_job *j, tks_build_unit *out) {
    if (!j->coordinator)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_plan: only the coordinator plans");
    if (!j->planning) return 0;
    uint64_t unit_bytes = j->o.unit_bytes ? j->o.unit_bytes : TKS_DEFAULT_UNIT_BYTES;
    tks_build_unit *cur = &j->cur;
    tks_doc doc;
    int got;
    while ((got = tks_input_next(j->plan_in, &doc)) > 0) {
        cur->n_docs++;
        cur->text_bytes += doc.len;
        if (cur->text_bytes >= unit_bytes) break;
    }
    if (got < 0) return got;
    if (got == 0 && cur->n_docs == 0) {
        int rc = plan_end(j);
        return rc ? rc : 0;
    }
    if (j->n_units == j->cap_units) {
        size_t cap = j->cap_units ? 2 * j->cap_units : 64;
        if (tks_resize(&j->units, cap, sizeof *j->units) || tks_resize(&j->done, cap, sizeof *j->done))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (units)");
        j->cap_units = cap;
    }
    size_t k = j->n_units++;
    j->units[k] = *cur;
    j->done[k] = 0;
    if (j->resuming) { /* kept from the interrupted run? */
        unit_record r;
        size_t n = 0;
        j->done[k] = (unsigned char)unit_complete(j, k, j->kept_base, &r);
        if (j->done[k]) n = r.n;
        free(r.shards);
        if (!j->done[k]) { /* or from a build started without work units */
            int kept = plain_unit(j, cur, &n);
            if (kept < 0) return kept;
            j->done[k] = (unsigned char)kept;
        }
        j->kept_base = j->done[k] && j->kept_base != TKS_NONE ? j->kept_base + n : TKS_NONE;
    }
    *out = *cur;
    memset(cur, 0, sizeof *cur);
    cur->index = j->n_units;
    tks_input_tell(j->plan_in, &cur->start);
    return 1;
}

int tks_build_job_open(const tks_build_opts *opts, int coordinator, tks_build_job **out) {
    *out = NULL;
    if (!opts) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_build_job_open: NULL options");
    tks_build_job *j = calloc(1, sizeof *j);
    if (!j) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    j->o = *opts;
    j->coordinator = coordinator;
    j->lock_fd = -1;
    j->t0 = omp_get_wtime();
    int rc = job_paths(j);
    if (!rc && coordinator) rc = coordinator_open(j);
    if (!rc && !coordinator) { /* the coordinator's build id goes into each unit's record */
        char path[PATH_MAX];
        rc = tks_path_join(path, sizeof path, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
        json_t *js = rc ? NULL : json_load_file(path, 0, NULL);
        const char *id = json_string_value(json_object_get(js, "build_id"));
        if (!rc && (!id || strlen(id) != 16))
            rc = tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                          "%s is missing or unreadable: this process cannot join the build of %s "
                          "(is %s on a filesystem every rank shares?)",
                          path, j->out, j->partial);
        else if (!rc)
            memcpy(j->build_id, id, 17);
        json_decref(js);
    }
    if (rc) {
        tks_build_job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

const tks_build_unit *tks_build_job_units(const tks_build_job *j, size_t *n) {
    *n = j->n_units;
    return j->units;
}

int tks_build_job_unit_done(const tks_build_job *j, size_t i) { return i < j->n_units && j->done[i]; }

int tks_build_job_planning(const tks_build_job *j) { return j->planning; }

int tks_build_job_run(tks_build_job *j, const tks_build_unit *u, tks_unit_stats *us) {
    const tks_build_opts *o = &j->o;
    double t0 = omp_get_wtime();
    memset(us, 0, sizeof *us);
    char dir[PATH_MAX], rec[PATH_MAX];
    int rc = unit_dir(j, u->index, dir, sizeof dir);
    if (!rc) rc = tks_path_join(rec, sizeof rec, dir, UNIT_RECORD);
    if (!rc) rc = reset_dir(dir);
    tks_input *in = NULL;
    tks_writer *w = NULL;
    if (!rc) rc = tks__open_inputs(o, &in);
    if (!rc) rc = tks_input_seek(in, &u->start);
    if (!rc) rc = tks__open_writer(o, j->tk, dir, 0, &w);
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    uint64_t empty = 0;
    reader rd = {.in = in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20),
                 .want = u->n_docs, .stop = o->stop};
    prefetch pf = {.r = &rd};
    if (!rc && u->n_docs > 0) tks__prefetch_start(&pf);
    int done = u->n_docs == 0;
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = tks__prefetch_take(&pf, &b))) break;
        done = b->end;
        if (!done) tks__prefetch_start(&pf);
        if (b->n) rc = tks__encode_batch(j->tk, b, threads);
        for (size_t i = 0; i < b->n && !rc; i++) {
            tks_ids *v = &b->ids[i];
            if (v->n == 0) {
                empty++;
                continue;
            }
            rc = tks__add_specials(v, o, j->bos, j->eos);
            if (!rc) rc = tks_writer_add(w, v->ids, v->n, b->ordinal[i], NULL);
            us->docs_written++;
            us->tokens_written += v->n;
        }
        tks__batch_trim(b, rd.batch_bytes);
        if (!rc && o->progress) {
            tks_build_progress p = {.bytes_text = b->text_seen, .docs_read = b->docs_seen,
                                    .docs_written = us->docs_written,
                                    .tokens_written = us->tokens_written,
                                    .seconds = omp_get_wtime() - t0};
            o->progress(&p, o->progress_ctx);
        }
        if (!rc && o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, j->partial, TKS_NONE, TKS_NONE,
                          "interrupted in unit %llu: the complete units are kept in %s; run the "
                          "same command with --resume to finish",
                          (unsigned long long)u->index, j->partial);
    }
    tks__prefetch_free(&pf); /* a reader still running after an error is joined */
    uint64_t got_docs = rd.docs_read;
    us->text_bytes = rd.text;
    if (!rc && got_docs != u->n_docs)
        rc = tks_fail(TKS_ERR_INPUT, tks_input_n_files(in) > u->start.file ? tks_input_file(in, u->start.file) : NULL,
                      TKS_NONE, u->start.offset,
                      "unit %llu: %llu documents planned from input file %llu (entry %llu, byte "
                      "%llu), %llu found: the inputs changed during the build; build again",
                      (unsigned long long)u->index, (unsigned long long)u->n_docs,
                      (unsigned long long)u->start.file, (unsigned long long)u->start.entry,
                      (unsigned long long)u->start.offset, (unsigned long long)got_docs);
    if (!rc) rc = tks_writer_flush(w);
    if (!rc) { /* the record, last: the unit is complete */
        size_t ns;
        const tks_shard_info *si = tks_writer_shards(w, &ns);
        json_t *arr = json_array();
        for (size_t i = 0; i < ns; i++) json_array_append_new(arr, tks_shard_record(&si[i]));
        json_t *js = json_pack("{s:s, s:I, s:I, s:I, s:o}", "build_id", j->build_id, "unit",
                               (json_int_t)u->index, "n_docs", (json_int_t)u->n_docs,
                               "empty_after_tokenize", (json_int_t)empty, "shards", arr);
        char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
        json_decref(js);
        rc = text ? tks_write_file_atomic(rec, text, strlen(text))
                  : tks_fail(TKS_ERR_NOMEM, rec, TKS_NONE, TKS_NONE, "out of memory");
        free(text);
        us->shards = ns;
    }
    /* a failure names the unit: a rank's error is read on rank 0 */
    if (rc && tks_last_error()->code == rc) {
        tks_error e = *tks_last_error();
        char msg[sizeof e.message + 32];
        snprintf(msg, sizeof msg, "unit %llu: %s", (unsigned long long)u->index, e.message);
        snprintf(e.message, sizeof e.message, "%.*s", (int)sizeof e.message - 1, msg);
        tks_error_restore(&e);
    }
    us->seconds = omp_get_wtime() - t0;
    tks_writer_free(w);
    tks_input_free(in);
    return rc;
}

/* Gives a unit's shard its index in the dataset: the header's shard_index
 * and checksum (in place, fsync), then the rename to its final name. */
static int place_shard(const char *from, const char *to, uint32_t global, tks_shard_info *si) {
    tks_shard *sh = NULL;
    int rc = tks_shard_open(from, &sh);
    if (rc) return rc;
    tks_shard_header h = *tks_shard_hdr(sh);
    tks_shard_close(sh);
    uint8_t page[TKS_HEADER_SIZE];
    h.shard_index = global;
    tks_header_encode(&h, page);
    si->header_xxh3 = h.header_xxh3;
    int fd = open(from, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return tks_fail(tks_write_errno_code(errno), from, global, TKS_NONE, "cannot open %s: %s",
                        from, strerror(errno));
    rc = tks_pwrite_all(fd, page, sizeof page, 0, from);
    if (!rc && fsync(fd) != 0)
        rc = tks_fail(tks_write_errno_code(errno), from, global, TKS_NONE, "cannot fsync %s: %s",
                      from, strerror(errno));
    close(fd);
    if (!rc && rename(from, to) != 0)
        rc = tks_fail(TKS_ERR_IO, to, global, TKS_NONE, "cannot rename %s to %s: %s", from, to,
                      strerror(errno));
    return rc;
}

int tks_build_job_finish(tks_build_job *j, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!j->coordinator)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_finish: only the coordinator finishes a build");
    if (j->planning)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_finish: the units are not all planned");
    tks_shard_info *all = NULL;
    size_t n_all = 0, cap = 0;
    uint64_t empty = 0;
    int rc = 0;
    char dir[PATH_MAX], from[PATH_MAX], to[PATH_MAX], name[32];
    for (size_t k = 0; k < j->n_units && !rc; k++) {
        unit_record r;
        if (!unit_complete(j, k, n_all, &r)) {
            rc = tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                          "unit %zu in %s is missing or damaged: re-run the same command with "
                          "--resume to build it again",
                          k, j->partial);
            break;
        }
        empty += r.empty_after_tokenize;
        if (j->done[k]) stats->resumed_shards += r.n;
        unit_dir(j, k, dir, sizeof dir);
        for (size_t i = 0; i < r.n && !rc; i++) {
            uint64_t g = n_all;
            if (g > UINT32_MAX) {
                rc = tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                              "more than 2^32 shards: raise --shard-tokens");
                break;
            }
            tks_shard_info si = r.shards[i];
            snprintf(name, sizeof name, "shard-%05llu.tks", (unsigned long long)g);
            rc = tks_path_join(from, sizeof from, dir, si.file);
            if (!rc) rc = tks_path_join(to, sizeof to, j->partial, name);
            if (rc) break;
            if (access(from, F_OK) == 0) {
                rc = place_shard(from, to, (uint32_t)g, &si);
            } else { /* placed by an earlier finish */
                tks_shard *sh = NULL;
                rc = tks_shard_open(to, &sh);
                if (!rc) si.header_xxh3 = tks_shard_hdr(sh)->header_xxh3;
                tks_shard_close(sh);
            }
            snprintf(si.file, sizeof si.file, "%s", name);
            si.index = (uint32_t)g;
            if (!rc && n_all == cap) {
                size_t c = cap ? 2 * cap : 64;
                if (tks_resize(&all, c, sizeof *all))
                    rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
                else cap = c;
            }
            if (!rc) all[n_all++] = si;
        }
        free(r.shards);
    }
    if (!rc) { /* a plain build's shards not kept, beyond the dataset's, and its state */
        tks_partial_clean(j->partial, n_all, PLAIN_NAME);
        rc = tks_fsync_dir(j->partial);
    }
    if (!rc && n_all == 0)
        rc = tks__no_text(&j->input);
    if (!rc)
        rc = tks__write_manifest(&j->o, j->partial, j->tk, j->desc, &j->input, all, n_all, empty, stats);
    if (!rc) {
        tks_path_join(to, sizeof to, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
        unlink(to);
        tks_path_join(to, sizeof to, j->partial, "in-flight.txt"); /* tokshard's report, if any */
        unlink(to);
        for (size_t k = 0; k < j->n_units; k++) {
            unit_dir(j, k, dir, sizeof dir);
            if (tks_path_join(from, sizeof from, dir, UNIT_RECORD) == 0) unlink(from);
            rmdir(dir);
        }
        rc = tks_partial_publish(TKS_PARTIAL_BUILD, j->partial, j->out);
    }
    stats->seconds = omp_get_wtime() - j->t0;
    tks__encoder_report(j->tk, &j->o, stats);
    free(all);
    return rc;
}

void tks_build_job_free(tks_build_job *j) {
    if (!j) return;
    json_decref(j->desc);
    tks_input_free(j->plan_in);
    free(j->was);
    free(j->plain_shards);
    free(j->plain_ends);
    free(j->units);
    free(j->done);
    tks_tok_free(j->tk);
    tks_unlock(j->lock_fd, j->lock_path);
    free(j);
}

/* tks_build on a partial build by work units: its missing units, in order, here. */
int tks__build_units_here(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_job *j = NULL;
    int rc = tks_build_job_open(o, 1, &j);
    tks_build_unit u;
    while (!rc && (rc = tks_build_job_plan(j, &u)) == 1) {
        tks_unit_stats us;
        rc = tks_build_job_unit_done(j, u.index) ? 0 : tks_build_job_run(j, &u, &us);
    }
    if (!rc) rc = tks_build_job_finish(j, stats);
    tks_build_job_free(j);
    return rc;
}
