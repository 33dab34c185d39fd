/* build.c - the dataset build pipeline.
 *
 *   inputs --(tks_input, sequential)--> batch of documents
 *          --(OpenMP, dynamic, longest first)--> ids per document
 *          --(in document order)--> tks_writer --> shards
 *
 * Output depends only on the document sequence, so it is byte-identical for
 * any thread count. Work happens in OUT.partial/: each shard is published
 * there by rename, then build-state.json records the shards and the ordinal
 * of the first document of the next shard. --resume re-reads the inputs,
 * skips (without tokenizing) the documents already in shards, and continues;
 * the result is byte-identical to an uninterrupted build. OUT.partial becomes
 * OUT by one rename after manifest.json is written. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../dataset/dataset.h"
#include "tokenize.h"

#define STATE_NAME "build-state.json"
#define TOKENIZER_NAME "tokenizer.model"

void tks_build_opts_default(tks_build_opts *o) {
    memset(o, 0, sizeof *o);
    tks_input_opts_default(&o->input);
}

static const char *split_name(tks_doc_split s) {
    return s == TKS_SPLIT_LINE ? "line" : s == TKS_SPLIT_BLANK ? "blank-line" : "file";
}
static const char *format_name(tks_input_format f) {
    return f == TKS_FMT_TEXT ? "text" : f == TKS_FMT_JSONL ? "jsonl" : "auto";
}
static const char *policy_name(tks_policy p) {
    return p == TKS_POLICY_SKIP ? "skip" : p == TKS_POLICY_FAIL ? "fail" : "replace";
}

typedef struct batch {
    char *arena;           /* document bytes, back to back */
    size_t arena_len, arena_cap;
    size_t *off, *len;     /* per document */
    uint64_t *ordinal;
    size_t *order;         /* documents sorted by length, longest first */
    tks_ids *ids;          /* per document, reused across batches */
    int *err;              /* per document: 0 or a TKS_ERR_* */
    size_t n, cap;
} batch;

static int batch_push(batch *b, const tks_doc *d) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        size_t *off = realloc(b->off, cap * sizeof *off);
        if (off) b->off = off;
        size_t *len = realloc(b->len, cap * sizeof *len);
        if (len) b->len = len;
        uint64_t *ord = realloc(b->ordinal, cap * sizeof *ord);
        if (ord) b->ordinal = ord;
        size_t *order = realloc(b->order, cap * sizeof *order);
        if (order) b->order = order;
        int *err = realloc(b->err, cap * sizeof *err);
        if (err) b->err = err;
        tks_ids *ids = realloc(b->ids, cap * sizeof *ids);
        if (ids) {
            memset(ids + b->cap, 0, (cap - b->cap) * sizeof *ids);
            b->ids = ids;
        }
        if (!off || !len || !ord || !order || !err || !ids)
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        b->cap = cap;
    }
    if (b->arena_len + d->len > b->arena_cap) {
        size_t cap = b->arena_cap ? b->arena_cap : (1u << 20);
        while (cap < b->arena_len + d->len) cap *= 2;
        char *a = realloc(b->arena, cap);
        if (!a) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        b->arena = a;
        b->arena_cap = cap;
    }
    memcpy(b->arena + b->arena_len, d->text, d->len);
    b->off[b->n] = b->arena_len;
    b->len[b->n] = d->len;
    b->ordinal[b->n] = d->ordinal;
    b->arena_len += d->len;
    b->n++;
    return 0;
}

static void batch_free(batch *b) {
    for (size_t i = 0; i < b->cap; i++) tks_ids_free(&b->ids[i]);
    free(b->arena);
    free(b->off);
    free(b->len);
    free(b->ordinal);
    free(b->order);
    free(b->ids);
    free(b->err);
}

static const size_t *g_sort_len;
static int by_len_desc(const void *a, const void *b) {
    size_t x = g_sort_len[*(const size_t *)a], y = g_sort_len[*(const size_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* What survives a crash: the published shards and where the next one starts. */
typedef struct build_state {
    char build_id[17];
    tks_shard_info *shards;
    size_t n_shards, cap;
    uint64_t next_ordinal;          /* first document not in a published shard */
    uint64_t empty_after_tokenize;  /* counted for documents before next_ordinal */
    const tks_input *in;            /* its finished files' hashes go into the state */
    char (*was)[33];                /* resumed: XXH3-128 (hex) of the inputs the interrupted */
    size_t n_was, n_checked;        /* build had read, and how many of them were compared */
} build_state;

static int save_state(const char *partial, const build_state *st) {
    json_t *hashes = json_array();
    uint8_t h[16];
    char hx[33];
    /* the inputs finished so far; after a resume, those the interrupted build
     * had finished count too until they are read again */
    for (size_t i = 0;; i++) {
        if (st->in && tks_input_file_xxh3(st->in, i, h, NULL) == 0) tks_hex(h, 16, hx);
        else if (i < st->n_was) snprintf(hx, sizeof hx, "%s", st->was[i]);
        else break;
        json_array_append_new(hashes, json_string(hx));
    }
    tks_clear_error(); /* the first unfinished input ends the list: not an error */
    json_t *arr = json_array();
    for (size_t i = 0; i < st->n_shards; i++) {
        const tks_shard_info *s = &st->shards[i];
        char hx[17];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)s->header_xxh3);
        json_array_append_new(arr, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "file", s->file,
                                             "bytes", (json_int_t)s->file_bytes, "n_docs",
                                             (json_int_t)s->n_docs, "n_tokens",
                                             (json_int_t)s->n_tokens, "min_token_id",
                                             (json_int_t)s->min_token_id, "max_token_id",
                                             (json_int_t)s->max_token_id, "header_xxh3", hx));
    }
    json_t *j = json_pack("{s:s, s:o, s:I, s:I, s:o}", "build_id", st->build_id, "shards", arr,
                          "next_ordinal", (json_int_t)st->next_ordinal, "empty_after_tokenize",
                          (json_int_t)st->empty_after_tokenize, "inputs_xxh3_128", hashes);
    char *text = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    if (!text) return tks_fail(TKS_ERR_NOMEM, partial, TKS_NONE, TKS_NONE, "out of memory");
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, partial, STATE_NAME);
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static int state_push(build_state *st, const tks_shard_info *s) {
    if (st->n_shards == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 16;
        tks_shard_info *p = realloc(st->shards, cap * sizeof *p);
        if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        st->shards = p;
        st->cap = cap;
    }
    st->shards[st->n_shards++] = *s;
    return 0;
}

static int load_state(const char *partial, build_state *st, const char *want_id) {
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, partial, STATE_NAME);
    if (rc) return rc;
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j)
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "cannot resume: %s is missing or unreadable (%s); remove %s and build again",
                        path, jerr.text, partial);
    const char *id = json_string_value(json_object_get(j, "build_id"));
    json_t *arr = json_object_get(j, "shards");
    json_t *next = json_object_get(j, "next_ordinal");
    json_t *empty = json_object_get(j, "empty_after_tokenize");
    if (!id || !json_is_array(arr) || !json_is_integer(next) || !json_is_integer(empty)) {
        json_decref(j);
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "cannot resume: %s is malformed; remove %s and build again", path, partial);
    }
    if (strcmp(id, want_id) != 0) {
        /* the message quotes `id`, which lives in j: format it before the free */
        tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                 "cannot resume: %s was started with other inputs, tokenizer or options "
                 "(build id %s, now %s); re-run with the original ones, or remove %s to "
                 "start over",
                 partial, id, want_id, partial);
        json_decref(j);
        return TKS_ERR_RESUME;
    }
    st->next_ordinal = (uint64_t)json_integer_value(next);
    st->empty_after_tokenize = (uint64_t)json_integer_value(empty);
    json_t *was = json_object_get(j, "inputs_xxh3_128");
    size_t nw = json_array_size(was);
    if (nw && !(st->was = calloc(nw, sizeof *st->was))) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < nw && !rc; i++)
        snprintf(st->was[st->n_was++], sizeof st->was[0], "%s",
                 json_string_value(json_array_get(was, i)) ? json_string_value(json_array_get(was, i)) : "");
    for (size_t i = 0; i < json_array_size(arr) && !rc; i++) {
        json_t *s = json_array_get(arr, i);
        tks_shard_info si = {0};
        const char *f = json_string_value(json_object_get(s, "file"));
        const char *hx = json_string_value(json_object_get(s, "header_xxh3"));
        if (!f || !hx || strlen(f) >= sizeof si.file) {
            rc = tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE, "cannot resume: %s shard %zu malformed",
                          path, i);
            break;
        }
        snprintf(si.file, sizeof si.file, "%s", f);
        si.index = (uint32_t)i;
        si.file_bytes = (uint64_t)json_integer_value(json_object_get(s, "bytes"));
        si.n_docs = (uint64_t)json_integer_value(json_object_get(s, "n_docs"));
        si.n_tokens = (uint64_t)json_integer_value(json_object_get(s, "n_tokens"));
        si.min_token_id = (uint32_t)json_integer_value(json_object_get(s, "min_token_id"));
        si.max_token_id = (uint32_t)json_integer_value(json_object_get(s, "max_token_id"));
        si.header_xxh3 = strtoull(hx, NULL, 16);
        /* the shard on disk must be exactly the one recorded */
        char sp[PATH_MAX];
        tks_shard *sh = NULL;
        rc = tks_path_join(sp, sizeof sp, partial, si.file);
        if (!rc && (tks_shard_open(sp, &sh) != 0 || tks_shard_hdr(sh)->header_xxh3 != si.header_xxh3))
            rc = tks_fail(TKS_ERR_RESUME, sp, i, TKS_NONE,
                          "cannot resume: %s is damaged or not the recorded shard; remove %s and "
                          "build again",
                          sp, partial);
        tks_shard_close(sh);
        if (!rc) rc = state_push(st, &si);
    }
    json_decref(j);
    return rc;
}

/* Removes shard files beyond the recorded ones and leftover temporary files. */
static void clean_partial(const char *partial, size_t keep) {
    DIR *d = opendir(partial);
    struct dirent *e;
    char p[PATH_MAX];
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        int stray = strstr(n, ".tmp") != NULL;
        if (strncmp(n, "shard-", 6) == 0 && strlen(n) == 15 && (size_t)atol(n + 6) >= keep) stray = 1;
        if (stray && tks_path_join(p, sizeof p, partial, n) == 0) unlink(p);
    }
    if (d) closedir(d);
}

static int has_shards(const char *partial) {
    DIR *d = opendir(partial);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        found = strncmp(e->d_name, "shard-", 6) == 0 && strlen(e->d_name) == 15;
    if (d) closedir(d);
    return found;
}

/* A resumed build reads its inputs again: each input the interrupted build
 * had finished must hash as it did then, or the kept shards came from other
 * bytes. Compares the inputs finished since the last call. */
static int verify_inputs(build_state *st, const char *partial) {
    uint8_t h[16];
    char hx[33];
    for (; st->n_checked < st->n_was; st->n_checked++) {
        size_t i = st->n_checked;
        if (tks_input_file_xxh3(st->in, i, h, NULL) != 0) {
            tks_clear_error();
            return 0; /* not read to its end yet */
        }
        tks_hex(h, 16, hx);
        if (strcmp(hx, st->was[i]) != 0)
            return tks_fail(TKS_ERR_RESUME, tks_input_file(st->in, i), TKS_NONE, TKS_NONE,
                            "cannot resume: %s changed since the interrupted build (XXH3-128 %s, "
                            "was %s), so the shards kept in %s came from other bytes; remove %s "
                            "and build again",
                            tks_input_file(st->in, i), hx, st->was[i], partial, partial);
    }
    return 0;
}

/* Inputs and every option that changes the output, as JSON (the manifest's
 * provenance). The inputs' XXH3-128 are added when they have been read
 * (add_input_hashes): each input is read once. */
static json_t *describe(const tks_build_opts *o, tks_input *in, const tks_spm *spm, int *rc) {
    *rc = 0;
    json_t *inputs = json_array();
    for (size_t i = 0; i < tks_input_n_files(in); i++)
        json_array_append_new(inputs, json_pack("{s:s, s:I}", "path", tks_input_file(in, i),
                                                "bytes", (json_int_t)tks_input_file_size(in, i)));
    char fp[33];
    tks_hex(tks_spm_fingerprint(spm), 16, fp);
    json_t *opt = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:b, s:b, s:I, s:I}", "tokenizer_fingerprint", fp,
        "doc_split", split_name(o->input.split), "format", format_name(o->input.format), "jsonl_key",
        o->input.jsonl_key ? o->input.jsonl_key : "text", "invalid_utf8",
        policy_name(o->input.invalid_utf8), "max_doc_bytes",
        (json_int_t)(o->input.max_doc_bytes ? o->input.max_doc_bytes : (64u << 20)), "on_long_doc",
        policy_name(o->input.long_doc), "on_bad_record", policy_name(o->input.bad_record),
        "append_eos", o->append_eos, "prepend_bos", o->prepend_bos, "shard_tokens",
        (json_int_t)(o->shard_tokens ? o->shard_tokens : (16u << 20)), "chunk_bytes",
        (json_int_t)(o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES));
    return json_pack("{s:s, s:o, s:o}", "tool", "tokshard " TKS_VERSION_STRING, "inputs", inputs,
                     "options", opt);
}

/* The build id: XXH3-64 of the description and each input's modification
 * time, so that a resume with edited inputs is refused at once (and one whose
 * edit kept size and time is caught by verify_inputs). */
static int build_id(json_t *desc, tks_input *in, char out[17]) {
    json_t *mt = json_array();
    for (size_t i = 0; i < tks_input_n_files(in); i++) {
        struct stat sb;
        if (stat(tks_input_file(in, i), &sb) != 0) {
            json_decref(mt);
            return tks_fail(TKS_ERR_IO, tks_input_file(in, i), TKS_NONE, TKS_NONE,
                            "cannot stat %s: %s", tks_input_file(in, i), strerror(errno));
        }
        json_array_append_new(mt, json_integer((json_int_t)sb.st_mtim.tv_sec * 1000000000 +
                                               sb.st_mtim.tv_nsec));
    }
    json_t *idm = json_pack("{s:O, s:o}", "description", desc, "mtime_ns", mt);
    char *text = idm ? json_dumps(idm, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(idm);
    if (!text) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits(text, strlen(text)));
    free(text);
    return 0;
}

/* Each input's XXH3-128 into the description, once all are read. */
static int add_input_hashes(json_t *desc, const tks_input *in) {
    json_t *inputs = json_object_get(desc, "inputs");
    for (size_t i = 0; i < tks_input_n_files(in); i++) {
        uint8_t h[16];
        char hx[33];
        int rc = tks_input_file_xxh3(in, i, h, NULL);
        if (rc) return rc;
        tks_hex(h, 16, hx);
        json_object_set_new(json_array_get(inputs, i), "xxh3_128", json_string(hx));
    }
    return 0;
}

int tks_build(const tks_build_opts *o, tks_build_stats *stats) {
    double t0 = omp_get_wtime();
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!o || !o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    char out[PATH_MAX], partial[PATH_MAX];
    snprintf(out, sizeof out, "%s", o->out_dir);
    size_t ol = strlen(out);
    while (ol > 1 && out[ol - 1] == '/') out[--ol] = 0;
    if (snprintf(partial, sizeof partial, "%s.partial", out) >= (int)sizeof partial)
        return tks_fail(TKS_ERR_ARG, out, TKS_NONE, TKS_NONE, "--output path too long");
    struct stat sb;
    if (stat(out, &sb) == 0)
        return tks_fail(TKS_ERR_EXISTS, out, TKS_NONE, TKS_NONE,
                        "%s already exists: choose another --output or remove it", out);
    char lock_path[PATH_MAX]; /* OUT.lock: one build or resume of OUT at a time */
    int lock_fd = -1, lock_rc = snprintf(lock_path, sizeof lock_path, "%s.lock", out) >= (int)sizeof lock_path
                                    ? tks_fail(TKS_ERR_ARG, out, TKS_NONE, TKS_NONE, "--output path too long")
                                    : tks_lock(lock_path, "tokshard build", &lock_fd);
    if (lock_rc) return lock_rc;

    tks_spm *spm = NULL;
    tks_input *in = NULL;
    tks_writer *w = NULL;
    json_t *desc = NULL;
    build_state st = {0};
    batch b = {0};
    int rc = tks_spm_load(o->tokenizer_path, &spm);
    if (!rc && o->encoder_sentencepiece) rc = tks_spm_set_encoder(spm, 0);
    if (!rc) rc = tks_input_open(o->inputs, o->n_inputs, &o->input, &in);
    if (!rc) desc = describe(o, in, spm, &rc);
    if (!rc) rc = build_id(desc, in, st.build_id);
    st.in = in;
    int have_partial = !rc && stat(partial, &sb) == 0;
    char state_path[PATH_MAX], tok_copy[PATH_MAX];
    if (!rc) rc = tks_path_join(state_path, sizeof state_path, partial, STATE_NAME);
    if (!rc) rc = tks_path_join(tok_copy, sizeof tok_copy, partial, TOKENIZER_NAME);
    if (!rc && o->resume && have_partial && access(state_path, F_OK) == 0) {
        rc = load_state(partial, &st, st.build_id);
        if (!rc) clean_partial(partial, st.n_shards);
        stats->resumed_shards = st.n_shards;
    } else if (!rc && o->resume && have_partial && !has_shards(partial)) {
        /* stopped before its first shard and its state: nothing to keep */
        clean_partial(partial, 0);
        rc = save_state(partial, &st);
    } else if (!rc && have_partial) {
        rc = tks_fail(o->resume ? TKS_ERR_RESUME : TKS_ERR_EXISTS, partial, TKS_NONE, TKS_NONE,
                      o->resume ? "cannot resume: %s has shards but no build-state.json; remove it "
                                  "and build again"
                                : "%s exists from an interrupted or failed build: re-run with "
                                  "--resume to continue it, or remove it to start over",
                      partial);
    } else if (!rc) {
        /* --resume with nothing to resume starts a fresh build */
        if (mkdir(partial, 0755) != 0)
            rc = tks_fail(tks_write_errno_code(errno), partial, TKS_NONE, TKS_NONE,
                          "cannot create %s: %s", partial, strerror(errno));
        if (!rc) rc = save_state(partial, &st);
    }
    if (!rc && access(tok_copy, F_OK) != 0) rc = tks_copy_file_atomic(o->tokenizer_path, tok_copy);
    if (!rc) {
        /* the tokenizer copy must be the tokenizer we are using */
        uint8_t fp[16];
        rc = tks_file_xxh3_128(tok_copy, fp, NULL);
        if (!rc && memcmp(fp, tks_spm_fingerprint(spm), 16) != 0)
            rc = tks_fail(TKS_ERR_RESUME, tok_copy, TKS_NONE, TKS_NONE,
                          "cannot resume: %s differs from --tokenizer; remove %s and build again",
                          tok_copy, partial);
    }
    uint32_t vocab = spm ? tks_spm_vocab_size(spm) : 0;
    uint32_t bos = spm ? tks_spm_bos_id(spm) : TKS_NO_ID, eos = spm ? tks_spm_eos_id(spm) : TKS_NO_ID;
    if (!rc && ((o->prepend_bos && bos == TKS_NO_ID) || (o->append_eos && eos == TKS_NO_ID)))
        rc = tks_fail(TKS_ERR_ARG, o->tokenizer_path, TKS_NONE, TKS_NONE,
                      "%s has no %s id: drop %s or use a tokenizer that defines it",
                      o->tokenizer_path, o->prepend_bos && bos == TKS_NO_ID ? "BOS" : "EOS",
                      o->prepend_bos && bos == TKS_NO_ID ? "--prepend-bos" : "--append-eos");
    if (!rc) {
        tks_writer_opts wo = {.dir = partial, .vocab_size = vocab, .bos_id = bos, .eos_id = eos,
                              .pad_id = tks_spm_pad_id(spm),
                              .shard_tokens = o->shard_tokens ? o->shard_tokens : (16u << 20),
                              .chunk_bytes = o->chunk_bytes, .first_shard = (uint32_t)st.n_shards};
        memcpy(wo.tokenizer_fp, tks_spm_fingerprint(spm), 16);
        rc = tks_writer_create(&wo, &w);
    }

    int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    size_t batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20);
    uint64_t docs_read = 0, docs_committed = 0, tokens_committed = 0;
    int done = 0;
    tks_doc doc;
    while (!rc && !done) {
        /* a slot keeps its id buffer for the next batch unless a large
         * document grew it past 256 KiB: else each of the thousands of slots
         * keeps the largest buffer it ever held (548 MiB peak on the Linux
         * tarball with 4 MiB) */
        for (size_t i = 0; i < b.n; i++)
            if (b.ids[i].cap > (64u << 10)) tks_ids_free(&b.ids[i]);
        /* 1. read a batch (documents already in resumed shards are skipped unread) */
        b.n = 0;
        b.arena_len = 0;
        while (!rc && b.arena_len < batch_bytes) {
            int got = tks_input_next(in, &doc);
            if (got < 0) rc = got;
            if (got <= 0) {
                done = 1;
                break;
            }
            docs_read++;
            if (doc.ordinal < st.next_ordinal) continue;
            rc = batch_push(&b, &doc);
        }
        if (!rc) rc = verify_inputs(&st, partial);
        if (rc) break;
        /* 2. tokenize in parallel: longest documents first when one could
         * keep a thread busy after the others finish, else in order and in
         * runs of documents (the sort, the scattered reads it causes and one
         * hand-off per document cost 5-8% of a build of short lines) */
        size_t longest = 0, per = 1;
        for (size_t i = 0; i < b.n; i++) {
            b.order[i] = i;
            longest = b.len[i] > longest ? b.len[i] : longest;
        }
        if (longest > (64u << 10)) {
            g_sort_len = b.len;
            qsort(b.order, b.n, sizeof *b.order, by_len_desc);
        } else {
            per = b.n / ((size_t)threads * 64) + 1;
        }
        tks_error first_err = {0};
        int any_err = 0;
#pragma omp parallel for schedule(dynamic, per) num_threads(threads)
        for (size_t k = 0; k < b.n; k++) {
            size_t i = b.order[k];
            int e = tks_spm_encode(spm, b.arena + b.off[i], b.len[i], &b.ids[i]);
            b.err[i] = e;
            if (e) {
#pragma omp critical(tks_build_err)
                if (!any_err) {
                    any_err = 1;
                    first_err = *tks_last_error();
                }
            }
        }
        if (any_err) {
            tks_error_restore(&first_err);
            rc = first_err.code ? first_err.code : TKS_ERR_TOKENIZER;
            break;
        }
        /* 3. commit in document order */
        for (size_t i = 0; i < b.n && !rc; i++) {
            tks_ids *v = &b.ids[i];
            if (v->n == 0) {
                stats->empty_after_tokenize++;
                st.empty_after_tokenize++;
                continue;
            }
            if (o->prepend_bos || o->append_eos) {
                size_t need = v->n + 2;
                if (v->cap < need) {
                    uint32_t *p = realloc(v->ids, need * sizeof *p);
                    if (!p) {
                        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
                        break;
                    }
                    v->ids = p;
                    v->cap = need;
                }
                if (o->prepend_bos) {
                    memmove(v->ids + 1, v->ids, v->n * sizeof *v->ids);
                    v->ids[0] = bos;
                    v->n++;
                }
                if (o->append_eos) v->ids[v->n++] = eos;
            }
            int published = 0;
            rc = tks_writer_add(w, v->ids, v->n, b.ordinal[i], &published);
            docs_committed++;
            tokens_committed += v->n;
            if (!rc && published) {
                size_t ns;
                const tks_shard_info *si = tks_writer_shards(w, &ns);
                rc = state_push(&st, &si[ns - 1]);
                st.next_ordinal = b.ordinal[i] + 1;
                if (!rc) rc = save_state(partial, &st);
            }
        }
        if (rc) break;
        if (o->progress) {
            const tks_input_stats *is = tks_input_get_stats(in);
            tks_build_progress p = {.bytes_in = is->bytes_in, .total_bytes_in = tks_input_total_bytes(in),
                                    .bytes_text = is->bytes_text, .docs_read = docs_read,
                                    .shards = st.n_shards, .seconds = omp_get_wtime() - t0,
                                    .docs_written = docs_committed, .tokens_written = tokens_committed};
            for (size_t i = 0; i < stats->resumed_shards; i++) { /* kept from before a resume */
                p.docs_written += st.shards[i].n_docs;
                p.tokens_written += st.shards[i].n_tokens;
            }
            o->progress(&p, o->progress_ctx);
        }
        if (o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, partial, TKS_NONE, TKS_NONE,
                          "interrupted: %zu shard(s) are kept in %s; run the same command with "
                          "--resume to finish",
                          st.n_shards, partial);
    }
    /* 4. last shard, manifest, publish */
    if (!rc) {
        rc = tks_writer_flush(w);
        size_t ns;
        const tks_shard_info *si = tks_writer_shards(w, &ns);
        if (!rc && ns && (size_t)si[ns - 1].index + 1 > st.n_shards) {
            rc = state_push(&st, &si[ns - 1]);
            st.next_ordinal = docs_read;
            if (!rc) rc = save_state(partial, &st);
        }
    }
    if (!rc && st.n_shards == 0)
        rc = tks_fail(TKS_ERR_INPUT, NULL, TKS_NONE, TKS_NONE,
                      "the inputs hold no document with text (%llu read): check the paths, "
                      "--doc-split and --jsonl-key",
                      (unsigned long long)docs_read);
    if (!rc) {
        stats->input = *tks_input_get_stats(in);
        stats->shards = st.n_shards;
        stats->min_token_id = UINT32_MAX;
        for (size_t i = 0; i < st.n_shards; i++) {
            stats->docs_written += st.shards[i].n_docs;
            stats->tokens_written += st.shards[i].n_tokens;
            if (st.shards[i].min_token_id < stats->min_token_id) stats->min_token_id = st.shards[i].min_token_id;
            if (st.shards[i].max_token_id > stats->max_token_id) stats->max_token_id = st.shards[i].max_token_id;
        }
        stats->empty_after_tokenize = st.empty_after_tokenize;
        stats->vocab_size = vocab;
        const tks_input_stats *is = &stats->input;
        json_object_set_new(desc, "stats",
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                                      "documents", (json_int_t)stats->docs_written, "tokens",
                                      (json_int_t)stats->tokens_written, "bytes_text",
                                      (json_int_t)is->bytes_text, "empty_skipped",
                                      (json_int_t)is->empty_skipped, "empty_after_tokenize",
                                      (json_int_t)stats->empty_after_tokenize, "utf8_invalid_docs",
                                      (json_int_t)is->utf8_invalid_docs, "utf8_replaced",
                                      (json_int_t)is->utf8_replaced, "utf8_skipped",
                                      (json_int_t)is->utf8_skipped, "long_skipped",
                                      (json_int_t)is->long_skipped, "bad_records_skipped",
                                      (json_int_t)is->bad_records_skipped, "binary_skipped",
                                      (json_int_t)is->binary_skipped));
        rc = add_input_hashes(desc, in);
        char *prov = rc ? NULL : json_dumps(desc, JSON_COMPACT);
        tks_tokenizer_info tok = {.vocab_size = vocab, .bos_id = bos, .eos_id = eos,
                                  .pad_id = tks_spm_pad_id(spm), .unk_id = tks_spm_unk_id(spm)};
        snprintf(tok.file, sizeof tok.file, "%s", TOKENIZER_NAME);
        snprintf(tok.model_type, sizeof tok.model_type, "%s", tks_spm_model_type(spm));
        memcpy(tok.fingerprint, tks_spm_fingerprint(spm), 16);
        if (!rc && !prov) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        if (!rc)
            rc = tks_manifest_write(partial, &tok, st.shards, st.n_shards, vocab <= TKS_U16_MAX_VOCAB ? 2 : 4,
                                    o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES, prov);
        free(prov);
    }
    if (!rc) {
        char sp[PATH_MAX];
        tks_path_join(sp, sizeof sp, partial, STATE_NAME);
        unlink(sp);
        if (rename(partial, out) != 0)
            rc = tks_fail(TKS_ERR_IO, out, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", partial,
                          out, strerror(errno));
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", out);
        char *slash = strrchr(parent, '/');
        if (!rc) rc = tks_fsync_dir(slash ? (slash == parent ? "/" : (*slash = 0, parent)) : ".");
    }
    stats->seconds = omp_get_wtime() - t0;
    if (spm) {
        const char *why = tks_spm_fast_unavailable(spm);
        snprintf(stats->encoder, sizeof stats->encoder, "%s", tks_spm_encoder(spm));
        snprintf(stats->encoder_why, sizeof stats->encoder_why, "%s",
                 why ? why : o->encoder_sentencepiece ? "--encoder sentencepiece" : "");
        tks_spm_encoder_stats(spm, &stats->encoder_stats);
    }
    if (stats->input.files == 0 && in) stats->input = *tks_input_get_stats(in);
    tks_writer_free(w);
    json_decref(desc);
    batch_free(&b);
    free(st.shards);
    free(st.was);
    tks_input_free(in);
    tks_spm_free(spm);
    tks_unlock(lock_fd, lock_path);
    return rc;
}
