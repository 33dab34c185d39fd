/* partial.c - OUT.partial, a dataset being written by `tokshard build` or
 * `tokshard import`: its paths, its resume state (save, load, the shards it
 * records checked on disk), cleaning, the tokenizer copy, the manifest and
 * the rename that publishes OUT. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/internal.h"
#include "common/tks_json.h"

static const struct kind_names {
    const char *state;    /* the state file in OUT.partial */
    const char *id_key;   /* the run id's key */
    const char *next_key; /* the key of the first document not in a shard */
    const char *verb;     /* the command to run again, in messages */
} kinds[] = {
    [TKS_PARTIAL_BUILD] = {"build-state.json", "build_id", "next_ordinal", "build"},
    [TKS_PARTIAL_IMPORT] = {"import-state.json", "import_id", "next_doc", "import"},
};

const char *tks_partial_state_name(tks_partial_kind kind) { return kinds[kind].state; }

int tks_partial_paths(tks_partial_kind kind, const char *out_dir, char *out, char *partial,
                      size_t cap) {
    int n = snprintf(out, cap, "%s", out_dir);
    size_t ol = strlen(out);
    while (ol > 1 && out[ol - 1] == '/') out[--ol] = 0;
    if (n >= 0 && (size_t)n < cap && (size_t)snprintf(partial, cap, "%s.partial", out) < cap) return 0;
    if (kind == TKS_PARTIAL_BUILD)
        return tks_fail(TKS_ERR_ARG, out, TKS_NONE, TKS_NONE, "--output path too long");
    return tks_fail(TKS_ERR_ARG, out, TKS_NONE, TKS_NONE, "path too long: %s", out);
}

int tks_partial_check_out(const char *out) {
    struct stat sb;
    if (stat(out, &sb) == 0)
        return tks_fail(TKS_ERR_EXISTS, out, TKS_NONE, TKS_NONE,
                        "%s already exists: choose another --output or remove it", out);
    return 0;
}

int tks_partial_create(const char *partial) {
    if (mkdir(partial, 0755) != 0)
        return tks_fail(tks_write_errno_code(errno), partial, TKS_NONE, TKS_NONE,
                        "cannot create %s: %s", partial, strerror(errno));
    return 0;
}

int tks_partial_tokenizer(tks_partial_kind kind, const char *partial, const char *src,
                          const char *name, const uint8_t fp[16]) {
    char copy[PATH_MAX];
    uint8_t got[16];
    int rc = tks_path_join(copy, sizeof copy, partial, name);
    if (!rc && src && access(copy, F_OK) != 0) rc = tks_copy_file_atomic(src, copy);
    if (!rc) rc = tks_file_xxh3_128(copy, got, NULL);
    if (!rc && memcmp(got, fp, 16) != 0)
        rc = tks_fail(TKS_ERR_RESUME, copy, TKS_NONE, TKS_NONE,
                      "cannot resume: %s differs from --tokenizer; remove %s and %s again", copy,
                      partial, kinds[kind].verb);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Shard records
 * ------------------------------------------------------------------------- */
json_t *tks_shard_record(const tks_shard_info *s) {
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)s->header_xxh3);
    json_t *r = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "file", s->file, "bytes",
                          (json_int_t)s->file_bytes, "n_docs", (json_int_t)s->n_docs, "n_tokens",
                          (json_int_t)s->n_tokens, "min_token_id", (json_int_t)s->min_token_id,
                          "max_token_id", (json_int_t)s->max_token_id, "header_xxh3", hx);
    if (r && s->version == TKS_FORMAT_V2) json_object_set_new(r, "version", json_integer(TKS_FORMAT_V2));
    return r;
}

int tks_shard_record_read(const json_t *s, size_t i, tks_shard_info *si) {
    const char *f = json_string_value(json_object_get(s, "file"));
    const char *hx = json_string_value(json_object_get(s, "header_xxh3"));
    memset(si, 0, sizeof *si);
    if (!f || !hx || strlen(f) >= sizeof si->file) return -1;
    snprintf(si->file, sizeof si->file, "%s", f);
    si->index = (uint32_t)i;
    si->file_bytes = (uint64_t)json_integer_value(json_object_get(s, "bytes"));
    si->n_docs = (uint64_t)json_integer_value(json_object_get(s, "n_docs"));
    si->n_tokens = (uint64_t)json_integer_value(json_object_get(s, "n_tokens"));
    si->min_token_id = (uint32_t)json_integer_value(json_object_get(s, "min_token_id"));
    si->max_token_id = (uint32_t)json_integer_value(json_object_get(s, "max_token_id"));
    si->header_xxh3 = strtoull(hx, NULL, 16);
    si->version = json_integer_value(json_object_get(s, "version")) == TKS_FORMAT_V2 ? TKS_FORMAT_V2 : TKS_FORMAT_V1;
    return 0;
}

/* ---------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------- */
int tks_partial_state_push(tks_partial_state *st, const tks_shard_info *s, uint64_t end) {
    if (st->n_shards == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 16;
        if (tks_resize(&st->shards, cap, sizeof *st->shards) || tks_resize(&st->ends, cap, sizeof *st->ends))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        st->cap = cap;
    }
    st->ends[st->n_shards] = end;
    st->shards[st->n_shards++] = *s;
    return 0;
}

void tks_partial_state_free(tks_partial_state *st) {
    free(st->shards);
    free(st->ends);
    free(st->was);
    st->shards = NULL;
    st->ends = NULL;
    st->was = NULL;
    st->n_shards = st->cap = st->n_was = 0;
}

/* The state's shard list: a build records each shard whole, with where its
 * documents end in the input (so that a resume under mpirun can tell exactly
 * which work units the shards hold); an import records file and header hash. */
static json_t *shard_list(tks_partial_kind kind, const tks_partial_state *st) {
    json_t *arr = json_array();
    for (size_t i = 0; i < st->n_shards; i++) {
        const tks_shard_info *s = &st->shards[i];
        json_t *sj;
        if (kind == TKS_PARTIAL_BUILD) {
            sj = tks_shard_record(s);
            if (st->ends[i] != TKS_NONE)
                json_object_set_new(sj, "end_ordinal", json_integer((json_int_t)st->ends[i]));
        } else {
            char hx[17];
            snprintf(hx, sizeof hx, "%016llx", (unsigned long long)s->header_xxh3);
            sj = json_pack("{s:s, s:s}", "file", s->file, "header_xxh3", hx);
        }
        json_array_append_new(arr, sj);
    }
    return arr;
}

int tks_partial_state_save(tks_partial_kind kind, const char *partial, const tks_partial_state *st,
                           const char (*inputs)[33], size_t n_inputs) {
    const struct kind_names *k = &kinds[kind];
    json_t *j = json_pack("{s:s, s:o, s:I}", k->id_key, st->id, "shards", shard_list(kind, st),
                          k->next_key, (json_int_t)st->next);
    if (j && kind == TKS_PARTIAL_BUILD) {
        json_t *hashes = json_array();
        for (size_t i = 0; i < n_inputs; i++) json_array_append_new(hashes, json_string(inputs[i]));
        json_object_set_new(j, "empty_after_tokenize", json_integer((json_int_t)st->empty_after_tokenize));
        json_object_set_new(j, "inputs_xxh3_128", hashes);
    }
    char *text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
    json_decref(j);
    if (!text) return tks_fail(TKS_ERR_NOMEM, partial, TKS_NONE, TKS_NONE, "out of memory");
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, partial, k->state);
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* Recorded shard i (entry s) of the state at `path`: checked on disk, then
 * pushed with its header's counts. */
static int load_shard(tks_partial_kind kind, const char *partial, const char *path, const json_t *s,
                      size_t i, tks_partial_state *st) {
    const char *verb = kinds[kind].verb;
    tks_shard_info si;
    if (tks_shard_record_read(s, i, &si) != 0) {
        if (kind == TKS_PARTIAL_BUILD)
            return tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE, "cannot resume: %s shard %zu malformed",
                            path, i);
        return tks_fail(TKS_ERR_RESUME, partial, i, TKS_NONE,
                        "cannot resume: shard %zu in %s is damaged or not the recorded one; "
                        "remove %s and %s again", i, partial, partial, verb);
    }
    /* the shard on disk must be exactly the one recorded */
    char sp[PATH_MAX];
    tks_shard *sh = NULL;
    int rc = tks_path_join(sp, sizeof sp, partial, si.file);
    if (!rc && (tks_shard_open(sp, &sh) != 0 || tks_shard_hdr(sh)->header_xxh3 != si.header_xxh3 ||
                tks_shard_hdr(sh)->shard_index != i)) {
        if (kind == TKS_PARTIAL_BUILD)
            rc = tks_fail(TKS_ERR_RESUME, sp, i, TKS_NONE,
                          "cannot resume: %s is damaged or not the recorded shard; remove %s and "
                          "%s again", sp, partial, verb);
        else
            rc = tks_fail(TKS_ERR_RESUME, partial, i, TKS_NONE,
                          "cannot resume: shard %zu in %s is damaged or not the recorded one; "
                          "remove %s and %s again", i, partial, partial, verb);
    }
    if (!rc) {
        const tks_shard_header *h = tks_shard_hdr(sh);
        si.file_bytes = h->file_size;
        si.n_docs = h->n_docs;
        si.n_tokens = h->n_tokens;
        si.version = h->version;
        si.min_token_id = h->min_token_id;
        si.max_token_id = h->max_token_id;
    }
    tks_shard_close(sh);
    json_t *end = json_object_get(s, "end_ordinal");
    if (!rc) rc = tks_partial_state_push(st, &si, json_is_integer(end) ? (uint64_t)json_integer_value(end) : TKS_NONE);
    return rc;
}

/* The id mismatch, in the words of each kind (`id` is the state's). */
static int other_run(tks_partial_kind kind, const char *partial, const char *path, const char *id,
                     const char *want_id) {
    if (kind == TKS_PARTIAL_BUILD)
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "cannot resume: %s was started with other inputs, tokenizer or options "
                        "(build id %s, now %s); re-run with the original ones, or remove %s to "
                        "start over",
                        partial, id, want_id, partial);
    return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                    "cannot resume: %s was started from another source, tokenizer or options "
                    "(or the source changed since); re-run with the original ones, or remove "
                    "%s to start over", partial, partial);
}

int tks_partial_state_load(tks_partial_kind kind, const char *partial, const char *want_id,
                           tks_partial_state *st) {
    const struct kind_names *k = &kinds[kind];
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, partial, k->state);
    if (rc) return rc;
    json_error_t jerr;
    json_t *j = tks_json_load_regular(path, 0, &jerr);
    if (!j)
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "cannot resume: %s is missing or unreadable (%s); remove %s and %s again",
                        path, jerr.text, partial, k->verb);
    const char *id = json_string_value(json_object_get(j, k->id_key));
    json_t *arr = json_object_get(j, "shards");
    json_t *next = json_object_get(j, k->next_key);
    json_t *empty = json_object_get(j, "empty_after_tokenize");
    if (!id || !json_is_array(arr) || !json_is_integer(next) ||
        (kind == TKS_PARTIAL_BUILD && !json_is_integer(empty)))
        rc = tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                      "cannot resume: %s is malformed; remove %s and %s again", path, partial, k->verb);
    else if (strcmp(id, want_id) != 0)
        rc = other_run(kind, partial, path, id, want_id); /* before the free: id lives in j */
    if (rc) {
        json_decref(j);
        return rc;
    }
    st->next = (uint64_t)json_integer_value(next);
    st->empty_after_tokenize = (uint64_t)json_integer_value(empty);
    json_t *was = json_object_get(j, "inputs_xxh3_128");
    size_t nw = json_array_size(was);
    if (nw && !(st->was = calloc(nw, sizeof *st->was)))
        rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < nw && !rc; i++) {
        const char *h = json_string_value(json_array_get(was, i));
        snprintf(st->was[st->n_was++], sizeof st->was[0], "%s", h ? h : "");
    }
    for (size_t i = 0; i < json_array_size(arr) && !rc; i++)
        rc = load_shard(kind, partial, path, json_array_get(arr, i), i, st);
    json_decref(j);
    return rc;
}

/* ---------------------------------------------------------------------------
 * The directory
 * ------------------------------------------------------------------------- */

/* A shard file's name: "shard-" five or more digits ".tks", 15 bytes for the
 * first 100000 shards (the writer's names); its number into *index. */
static int shard_file(const char *n, size_t *index) {
    if (strncmp(n, "shard-", 6) != 0 || strlen(n) != 15) return 0;
    *index = (size_t)atol(n + 6);
    return 1;
}

void tks_partial_clean(const char *partial, size_t keep, const char *also) {
    DIR *d = opendir(partial);
    struct dirent *e;
    char p[PATH_MAX];
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        size_t index;
        int stray = strstr(n, ".tmp") != NULL || (also && strcmp(n, also) == 0) ||
                    (shard_file(n, &index) && index >= keep);
        if (stray && tks_path_join(p, sizeof p, partial, n) == 0) unlink(p);
    }
    if (d) closedir(d);
}

int tks_partial_has_shards(const char *partial) {
    DIR *d = opendir(partial);
    struct dirent *e;
    size_t index;
    int found = 0;
    while (d && !found && (e = readdir(d))) found = shard_file(e->d_name, &index);
    if (d) closedir(d);
    return found;
}

int tks_partial_write_manifest(const char *partial, const tks_tokenizer_info *tok,
                               const tks_shard_info *shards, size_t n, uint32_t chunk_bytes,
                               const char *provenance_json) {
    return tks_manifest_write(partial, tok, shards, n, tok->vocab_size <= TKS_U16_MAX_VOCAB ? 2 : 4,
                              chunk_bytes ? chunk_bytes : TKS_DEFAULT_CHUNK_BYTES, provenance_json);
}

/* The directory that holds `path` (a copy in dir, cap bytes). */
static const char *parent_of(const char *path, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    return slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
}

int tks_partial_publish(tks_partial_kind kind, const char *partial, const char *out) {
    char p[PATH_MAX];
    const struct kind_names *k = &kinds[kind];
    /* the state stays until OUT exists: a run stopped before the rename, or
     * a rename refused, leaves a partial that --resume publishes */
    if (rename(partial, out) != 0) {
        int err = errno;
        struct stat sb;
        if (err == EEXIST || err == ENOTEMPTY || err == ENOTDIR || err == EISDIR || stat(out, &sb) == 0)
            return tks_fail(TKS_ERR_EXISTS, out, TKS_NONE, TKS_NONE,
                            "cannot publish %s: %s appeared while the %s ran (%s); the complete dataset "
                            "is kept in %s: move %s away, then run the same command with --resume to "
                            "publish it", out, out, k->verb, strerror(err), partial, out);
        return tks_fail(TKS_ERR_IO, out, TKS_NONE, TKS_NONE,
                        "cannot rename %s to %s: %s; the complete dataset is kept in %s: run the same "
                        "command with --resume to publish it", partial, out, strerror(err), partial);
    }
    int rc = tks_fsync_dir(parent_of(out, p, sizeof p));
    /* the state inside OUT is no part of the dataset: readers and the audit
     * look only at the manifest and the files it names */
    if (!rc && tks_path_join(p, sizeof p, out, k->state) == 0 && unlink(p) == 0) rc = tks_fsync_dir(out);
    return rc;
}
