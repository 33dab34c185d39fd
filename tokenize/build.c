/* build.c - the dataset build pipeline (tks_build) and what the build by
 * work units shares with it.
 *
 *   inputs --(tks_input, sequential, on a reader thread)--> batch of documents
 *          --(OpenMP, dynamic, longest first)--> ids per document
 *          --(in document order)--> tks_writer --> shards
 *
 * The reader thread reads batch k+1 while batch k is encoded and committed
 * (batch.c), so decompression overlaps tokenization.
 *
 * Output depends only on the document sequence, so it is byte-identical for
 * any thread count. Work happens in OUT.partial/ (dataset layer,
 * tks_partial_*): each shard is published there by rename, then
 * build-state.json records the shards and the ordinal of the first document
 * of the next shard. --resume re-reads the inputs, skips (without
 * tokenizing) the documents already in shards, and continues; the result is
 * byte-identical to an uninterrupted build. OUT.partial becomes OUT by one
 * rename after manifest.json is written. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"

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


/* The resume state (dataset layer, TKS_PARTIAL_BUILD) and the input whose
 * finished files' hashes go into it. */
typedef struct build_state {
    tks_partial_state p;
    const tks_input *in;
    size_t n_checked;               /* inputs of p.was compared with the ones read again */
} build_state;

/* Saves the state with the inputs finished so far; after a resume, those the
 * interrupted build had finished count too until they are read again. */
static int save_state(const char *partial, const build_state *st) {
    size_t n = st->in ? tks_input_n_files(st->in) : 0;
    if (n < st->p.n_was) n = st->p.n_was;
    char (*hashes)[33] = calloc(n ? n : 1, sizeof *hashes);
    if (!hashes) return tks_fail(TKS_ERR_NOMEM, partial, TKS_NONE, TKS_NONE, "out of memory");
    uint8_t h[16];
    size_t k = 0;
    for (; k < n; k++) {
        if (st->in && tks_input_file_xxh3(st->in, k, h, NULL) == 0) tks_hex(h, 16, hashes[k]);
        else if (k < st->p.n_was) snprintf(hashes[k], sizeof hashes[k], "%s", st->p.was[k]);
        else break;
    }
    tks_clear_error(); /* the first unfinished input ends the list: not an error */
    int rc = tks_partial_state_save(TKS_PARTIAL_BUILD, partial, &st->p, (const char(*)[33])hashes, k);
    free(hashes);
    return rc;
}

/* A resumed build reads its inputs again: each input the interrupted build
 * had finished must hash as it did then, or the kept shards came from other
 * bytes. Compares the inputs finished since the last call. */
static int verify_inputs(build_state *st, const char *partial) {
    uint8_t h[16];
    char hx[33];
    for (; st->n_checked < st->p.n_was; st->n_checked++) {
        size_t i = st->n_checked;
        if (tks_input_file_xxh3(st->in, i, h, NULL) != 0) {
            tks_clear_error();
            return 0; /* not read to its end yet */
        }
        tks_hex(h, 16, hx);
        if (strcmp(hx, st->p.was[i]) != 0)
            return tks_fail(TKS_ERR_RESUME, tks_input_file(st->in, i), TKS_NONE, TKS_NONE,
                            "cannot resume: %s changed since the interrupted build (XXH3-128 %s, "
                            "was %s), so the shards kept in %s came from other bytes; remove %s "
                            "and build again",
                            tks_input_file(st->in, i), hx, st->p.was[i], partial, partial);
    }
    return 0;
}

/* Inputs and every option that changes the output, as JSON (the manifest's
 * provenance). The inputs' XXH3-128 are added when they have been read
 * (add_input_hashes): each input is read once. */
json_t *tks__describe(const tks_build_opts *o, tks_input *in, const tks_tok *tk, int *rc) {
    *rc = 0;
    json_t *inputs = json_array();
    for (size_t i = 0; i < tks_input_n_files(in); i++)
        json_array_append_new(inputs, json_pack("{s:s, s:I}", "path", tks_input_file(in, i),
                                                "bytes", (json_int_t)tks_input_file_size(in, i)));
    char fp[33];
    tks_hex(tks_tok_fingerprint(tk), 16, fp);
    json_t *opt = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:b, s:b, s:I, s:I, s:I}", "tokenizer_fingerprint", fp,
        "doc_split", split_name(o->input.split), "format", format_name(o->input.format), "jsonl_key",
        o->input.jsonl_key ? o->input.jsonl_key : "text", "invalid_utf8",
        policy_name(o->input.invalid_utf8), "max_doc_bytes",
        (json_int_t)(o->input.max_doc_bytes ? o->input.max_doc_bytes : (64u << 20)), "on_long_doc",
        policy_name(o->input.long_doc), "on_bad_record", policy_name(o->input.bad_record),
        "append_eos", o->append_eos, "prepend_bos", o->prepend_bos, "unit_bytes",
        (json_int_t)(o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES), "shard_tokens",
        (json_int_t)(o->shard_tokens ? o->shard_tokens : (16u << 20)), "chunk_bytes",
        (json_int_t)(o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES));
    json_t *d = json_pack("{s:s, s:o, s:o}", "tool", "tokshard " TKS_VERSION_STRING, "inputs", inputs,
                          "options", opt);
    if (d && o->allow_special_in_text) /* absent by default, as on_bad_input */
        json_object_set_new(opt, "allow_special_in_text", json_true());
    if (d && o->input.bad_input == TKS_POLICY_SKIP) { /* absent by default: ids of earlier builds kept */
        json_object_set_new(opt, "on_bad_input", json_string("skip"));
        json_t *sk = json_array();
        for (size_t i = 0; tks_input_skipped_file(in, i); i++)
            json_array_append_new(sk, json_string(tks_input_skipped_file(in, i)));
        json_object_set_new(d, "skipped_inputs", sk);
    }
    return d;
}

/* The build id: XXH3-64 of the description and each input's modification
 * time, so that a resume with edited inputs is refused at once (and one whose
 * edit kept size and time is caught by verify_inputs). */
int tks__build_id(json_t *desc, tks_input *in, char out[17]) {
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
int tks__add_input_hashes(json_t *desc, const tks_input *in) {
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

/* The dataset's totals into *stats and the manifest (with the description,
 * its inputs' hashes already in, as provenance) into `partial`. */
int tks__write_manifest(const tks_build_opts *o, const char *partial, const tks_tok *tk,
                          json_t *desc, const tks_input_stats *input, const tks_shard_info *shards,
                          size_t n_shards, uint64_t empty_after_tokenize, tks_build_stats *stats) {
    tks_shard_totals t;
    tks_shard_totals_of(shards, n_shards, &t);
    stats->input = *input;
    stats->shards = n_shards;
    stats->docs_written = t.docs;
    stats->tokens_written = t.tokens;
    stats->min_token_id = t.min_token_id;
    stats->max_token_id = t.max_token_id;
    stats->empty_after_tokenize = empty_after_tokenize;
    stats->vocab_size = tks_tok_vocab_size(tk);
    json_t *sk = json_object_get(desc, "skipped_inputs");
    size_t nsk = json_array_size(sk), used = 0;
    stats->skipped_inputs[0] = 0;
    for (size_t i = 0; i < nsk; i++) {
        const char *s = json_string_value(json_array_get(sk, i));
        size_t room = sizeof stats->skipped_inputs - used;
        if (strlen(s) + 1 + 64 > room) {
            snprintf(stats->skipped_inputs + used, room, "... and %zu more (the manifest's "
                     "provenance.skipped_inputs lists every one)\n", nsk - i);
            break;
        }
        used += (size_t)snprintf(stats->skipped_inputs + used, room, "%s\n", s);
    }
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
    char *prov = json_dumps(desc, JSON_COMPACT);
    tks_tokenizer_info tok;
    tks_tokenizer_record(tk, &tok);
    tok.special_from_text = o->allow_special_in_text;
    int rc = prov ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_partial_write_manifest(partial, &tok, shards, n_shards, o->chunk_bytes, prov);
    free(prov);
    return rc;
}

void tks_tokenizer_record(const tks_tok *tk, tks_tokenizer_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->file, sizeof out->file, "%s", tks_tok_file_name(tk));
    memcpy(out->fingerprint, tks_tok_fingerprint(tk), 16);
    out->vocab_size = tks_tok_vocab_size(tk);
    snprintf(out->model_type, sizeof out->model_type, "%s", tks_tok_model_type(tk));
    out->bos_id = tks_tok_bos_id(tk);
    out->eos_id = tks_tok_eos_id(tk);
    out->pad_id = tks_tok_pad_id(tk);
    out->unk_id = tks_tok_unk_id(tk);
    /* the ids no text produces, as ranges; too many ranges: none recorded */
    uint32_t n = 0;
    for (uint32_t id = 0, v = out->vocab_size; id < v && n <= TKS_MAX_RESERVED; id++) {
        if (!tks_tok_is_special(tk, id) && tks_tok_is_token(tk, id)) continue;
        if (n && out->reserved[n - 1][1] + 1 == id) {
            out->reserved[n - 1][1] = id;
        } else if (n < TKS_MAX_RESERVED) {
            out->reserved[n][0] = out->reserved[n][1] = id;
            n++;
        } else {
            n = TKS_MAX_RESERVED + 1;
        }
    }
    out->n_reserved = n <= TKS_MAX_RESERVED ? n : 0;
}

int tks_tokenizer_keep(tks_partial_kind kind, const tks_tok *tk, const char *src, const char *partial) {
    char copy[PATH_MAX];
    int rc = tks_tok_save(tk, src, partial);
    if (!rc) rc = tks_path_join(copy, sizeof copy, partial, tks_tok_file_name(tk));
    return rc ? rc : tks_partial_tokenizer(kind, partial, copy, tks_tok_file_name(tk), tks_tok_fingerprint(tk));
}

int tks_tokenizer_open(const tks_build_opts *o, tks_tok **tk) {
    tks_tok_opts to = {o->pattern, o->special_tokens, o->allow_special_in_text};
    int rc = tks_tok_load_opts(o->tokenizer_path, &to, tk);
    if (!rc && o->encoder_sentencepiece) rc = tks_tok_set_encoder(*tk, 0);
    return rc;
}

/* The build's inputs, with the build's stop flag for waits on a pipe
 * (unless the input options bring their own). */
int tks__open_inputs(const tks_build_opts *o, tks_input **in) {
    tks_input_opts io = o->input;
    if (!io.stop) io.stop = o->stop;
    return tks_input_open(o->inputs, o->n_inputs, &io, in);
}

/* TKS_ERR_INPUT for inputs that gave no document with a token, saying what
 * was read and what each policy left out. */
int tks__no_text(const tks_input_stats *is) {
    return tks_fail(TKS_ERR_INPUT, NULL, TKS_NONE, TKS_NONE,
                    "the inputs hold no document with text: %llu files, %llu entries, %llu "
                    "documents kept; left out: %llu empty, %llu invalid UTF-8 (--invalid-utf8), "
                    "%llu too long (--max-doc-bytes), %llu bad JSONL records, %llu binary, %llu "
                    "bad inputs. Check the paths, --doc-split, --jsonl-key and those policies",
                    (unsigned long long)is->files, (unsigned long long)is->entries,
                    (unsigned long long)is->docs, (unsigned long long)is->empty_skipped,
                    (unsigned long long)is->utf8_skipped, (unsigned long long)is->long_skipped,
                    (unsigned long long)is->bad_records_skipped,
                    (unsigned long long)is->binary_skipped, (unsigned long long)is->bad_inputs_skipped);
}

/* 1 when `a` is `b` or lies under directory `b` (both canonical). */
static int path_within(const char *a, const char *b) {
    size_t n = strlen(b);
    if (n == 1 && b[0] == '/') return 1;
    return strncmp(a, b, n) == 0 && (a[n] == 0 || a[n] == '/');
}

/* Refuses an output (OUT, OUT.partial, OUT.lock) inside one of the inputs, or
 * an input inside them: the build would read its own lock file, state and
 * shards as text, and no two runs would give the same dataset. Checked before
 * anything is written. `out` has no trailing '/'. */
int tks__check_output_apart(const char *out, const tks_build_opts *o) {
    char parent[PATH_MAX], real_parent[PATH_MAX], dest[PATH_MAX];
    const char *slash = strrchr(out, '/'), *base = slash ? slash + 1 : out;
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == out) snprintf(parent, sizeof parent, "/");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash - out), out);
    if (!realpath(parent, real_parent)) return 0; /* no parent: creating OUT.partial fails, naming it */
    static const char *const suffix[] = {"", ".partial", ".lock"};
    for (size_t i = 0; i < o->n_inputs; i++) {
        char real_in[PATH_MAX];
        if (!realpath(o->inputs[i], real_in)) continue; /* reported when the inputs are listed */
        for (int k = 0; k < 3; k++) {
            if (snprintf(dest, sizeof dest, "%s%s%s%s", real_parent,
                         strcmp(real_parent, "/") ? "/" : "", base, suffix[k]) >= (int)sizeof dest)
                continue;
            if (path_within(dest, real_in) || path_within(real_in, dest))
                return tks_fail(TKS_ERR_ARG, o->inputs[i], TKS_NONE, TKS_NONE,
                                "--output %s would put %s%s %s input %s: the build would read "
                                "its own files; choose an --output outside every input",
                                out, out, suffix[k],
                                path_within(dest, real_in) ? "inside the" : "around the", o->inputs[i]);
        }
    }
    return 0;
}

/* TKS_ERR_ARG when the options ask for a BOS or EOS the tokenizer lacks. */
int tks__check_specials(const tks_build_opts *o, uint32_t bos, uint32_t eos) {
    if ((o->prepend_bos && bos == TKS_NO_ID) || (o->append_eos && eos == TKS_NO_ID))
        return tks_fail(TKS_ERR_ARG, o->tokenizer_path, TKS_NONE, TKS_NONE,
                        "%s has no %s id: drop %s or use a tokenizer that defines it (a "
                        "tokenizer.json takes it from the tokenizer_config.json beside it: "
                        "\"bos_token\", \"eos_token\")",
                        o->tokenizer_path, o->prepend_bos && bos == TKS_NO_ID ? "BOS" : "EOS",
                        o->prepend_bos && bos == TKS_NO_ID ? "--prepend-bos" : "--append-eos");
    return 0;
}

/* A shard writer into `dir` for the tokenizer tk, numbering shards from
 * first_shard. */
int tks__open_writer(const tks_build_opts *o, const tks_tok *tk, const char *dir,
                       uint32_t first_shard, tks_writer **w) {
    tks_writer_opts wo = {.dir = dir, .vocab_size = tks_tok_vocab_size(tk),
                          .bos_id = tks_tok_bos_id(tk), .eos_id = tks_tok_eos_id(tk),
                          .pad_id = tks_tok_pad_id(tk),
                          .shard_tokens = o->shard_tokens ? o->shard_tokens : (16u << 20),
                          .chunk_bytes = o->chunk_bytes, .first_shard = first_shard};
    memcpy(wo.tokenizer_fp, tks_tok_fingerprint(tk), 16);
    return tks_writer_create(&wo, w);
}

/* The encoder a build took, and why, into *stats. */
void tks__encoder_report(const tks_tok *tk, const tks_build_opts *o, tks_build_stats *stats) {
    const char *why = tks_tok_fast_unavailable(tk);
    snprintf(stats->encoder, sizeof stats->encoder, "%s", tks_tok_encoder(tk));
    snprintf(stats->encoder_why, sizeof stats->encoder_why, "%s",
             why ? why : o->encoder_sentencepiece ? "--encoder sentencepiece" : "");
    tks_tok_encoder_stats(tk, &stats->encoder_stats);
}

/* One build in this process (tks_build): what it holds while it runs. */
typedef struct run {
    const tks_build_opts *o;
    tks_build_stats *stats;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_tok *tk;
    uint32_t bos, eos;
    tks_input *in;
    tks_writer *w;
    json_t *desc;                    /* provenance, and the build id's source */
    build_state st;
    uint64_t docs_committed, tokens_committed; /* by this run (resumed shards aside) */
    double t0;
} run;

/* The paths, the output checks and OUT.lock (one build or resume of OUT at a
 * time). */
static int run_lock(run *r) {
    const tks_build_opts *o = r->o;
    int rc = tks_partial_paths(TKS_PARTIAL_BUILD, o->out_dir, r->out, r->partial, sizeof r->out);
    if (!rc) rc = tks__check_output_apart(r->out, o);
    if (!rc) rc = tks_partial_check_out(r->out);
    if (rc) return rc;
    if (snprintf(r->lock_path, sizeof r->lock_path, "%s.lock", r->out) >= (int)sizeof r->lock_path)
        return tks_fail(TKS_ERR_ARG, r->out, TKS_NONE, TKS_NONE, "--output path too long");
    return tks_lock(r->lock_path, "tokshard build", &r->lock_fd);
}

/* OUT.partial, fresh or resumed (its state loaded, what it does not record
 * removed). */
static int run_partial(run *r) {
    const char *partial = r->partial;
    char state_path[PATH_MAX];
    struct stat sb;
    int have_partial = stat(partial, &sb) == 0, resume = r->o->resume;
    int rc = tks_path_join(state_path, sizeof state_path, partial,
                           tks_partial_state_name(TKS_PARTIAL_BUILD));
    if (rc) return rc;
    if (resume && have_partial && access(state_path, F_OK) == 0) {
        rc = tks_partial_state_load(TKS_PARTIAL_BUILD, partial, r->st.p.id, &r->st.p);
        if (!rc) tks_partial_clean(partial, r->st.p.n_shards, PLAIN_NAME);
        r->stats->resumed_shards = r->st.p.n_shards;
        return rc;
    }
    if (resume && have_partial && !tks_partial_has_shards(partial)) {
        /* stopped before its first shard and its state: nothing to keep */
        tks_partial_clean(partial, 0, PLAIN_NAME);
        return save_state(partial, &r->st);
    }
    if (have_partial)
        return tks_fail(resume ? TKS_ERR_RESUME : TKS_ERR_EXISTS, partial, TKS_NONE, TKS_NONE,
                        resume ? "cannot resume: %s has shards but no build-state.json; remove it "
                                 "and build again"
                               : "%s exists from an interrupted or failed build: re-run with "
                                 "--resume to continue it, or remove it to start over",
                        partial);
    /* --resume with nothing to resume starts a fresh build */
    rc = tks_partial_create(partial);
    return rc ? rc : save_state(partial, &r->st);
}

/* The tokenizer, the inputs, the build id, OUT.partial and the writer. */
static int run_open(run *r) {
    const tks_build_opts *o = r->o;
    int rc = tks_tokenizer_open(o, &r->tk);
    /* options the tokenizer cannot serve are refused before OUT.partial exists */
    if (!rc) {
        r->bos = tks_tok_bos_id(r->tk);
        r->eos = tks_tok_eos_id(r->tk);
        rc = tks__check_specials(o, r->bos, r->eos);
    }
    if (!rc) rc = tks__open_inputs(o, &r->in);
    if (!rc) r->desc = tks__describe(o, r->in, r->tk, &rc);
    if (!rc) rc = tks__build_id(r->desc, r->in, r->st.p.id);
    r->st.in = r->in;
    if (!rc) rc = run_partial(r);
    if (!rc) rc = tks_tokenizer_keep(TKS_PARTIAL_BUILD, r->tk, o->tokenizer_path, r->partial);
    return rc ? rc : tks__open_writer(o, r->tk, r->partial, (uint32_t)r->st.p.n_shards, &r->w);
}

/* Records a shard just published, ending before document `end`, in the state. */
static int run_published(run *r, uint64_t end) {
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(r->w, &ns);
    r->st.p.next = end;
    int rc = tks_partial_state_push(&r->st.p, &si[ns - 1], end);
    return rc ? rc : save_state(r->partial, &r->st);
}

/* Commits an encoded batch in document order; a work unit's last document
 * closes its shard. */
static int run_commit(run *r, batch *b) {
    int rc = 0;
    for (size_t i = 0; i < b->n && !rc; i++) {
        tks_ids *v = &b->ids[i];
        int published = 0;
        if (v->n == 0) {
            r->stats->empty_after_tokenize++;
            r->st.p.empty_after_tokenize++;
        } else {
            rc = tks__add_specials(v, r->o, r->bos, r->eos);
            if (!rc) rc = tks_writer_add(r->w, v->ids, v->n, b->ordinal[i], &published);
            r->docs_committed++;
            r->tokens_committed += v->n;
        }
        if (!rc && b->uend[i]) {
            size_t before, after;
            tks_writer_shards(r->w, &before);
            rc = tks_writer_flush(r->w);
            tks_writer_shards(r->w, &after);
            published |= after > before;
        }
        if (!rc && published) rc = run_published(r, b->ordinal[i] + 1);
    }
    return rc;
}

static void run_progress(run *r, const batch *b) {
    tks_build_progress p = {.bytes_in = b->input.bytes_in,
                            .total_bytes_in = tks_input_total_bytes(r->in),
                            .bytes_text = b->input.bytes_text, .docs_read = b->docs_seen,
                            .shards = r->st.p.n_shards, .seconds = omp_get_wtime() - r->t0,
                            .docs_written = r->docs_committed, .tokens_written = r->tokens_committed};
    for (size_t i = 0; i < r->stats->resumed_shards; i++) { /* kept from before a resume */
        p.docs_written += r->st.p.shards[i].n_docs;
        p.tokens_written += r->st.p.shards[i].n_tokens;
    }
    r->o->progress(&p, r->o->progress_ctx);
}

/* Reads (on the reader thread), encodes and commits every batch; *docs_read:
 * the documents read, skipped ones included. */
static int run_batches(run *r, uint64_t *docs_read) {
    const tks_build_opts *o = r->o;
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads(), rc = 0, done = 0;
    reader rd = {.in = r->in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20),
                 .want = UINT64_MAX,
                 .unit_bytes = o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES,
                 .skip_below = r->st.p.next, .stop = o->stop};
    prefetch pf = {.r = &rd};
    tks__prefetch_start(&pf);
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = tks__prefetch_take(&pf, &b))) break;
        done = b->end;
        /* no reader runs now: the input may be looked at */
        if ((rc = verify_inputs(&r->st, r->partial))) break;
        if (!done) tks__prefetch_start(&pf);
        /* tokenize in parallel (encode_batch says in which order), commit in order */
        rc = tks__encode_batch(r->tk, b, threads);
        if (!rc) rc = run_commit(r, b);
        tks__batch_trim(b, rd.batch_bytes);
        if (rc) break;
        if (o->progress) run_progress(r, b);
        if (o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, r->partial, TKS_NONE, TKS_NONE,
                          "interrupted: %zu shard(s) are kept in %s; run the same command with "
                          "--resume to finish",
                          r->st.p.n_shards, r->partial);
    }
    tks__prefetch_free(&pf); /* a reader still running after an error is joined */
    *docs_read = rd.docs_read;
    return rc;
}

/* The last shard, the manifest, and OUT published. */
static int run_finish(run *r, uint64_t docs_read) {
    int rc = tks_writer_flush(r->w);
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(r->w, &ns);
    if (!rc && ns && (size_t)si[ns - 1].index + 1 > r->st.p.n_shards) rc = run_published(r, docs_read);
    if (!rc && r->st.p.n_shards == 0) rc = tks__no_text(tks_input_get_stats(r->in));
    if (!rc) rc = tks__add_input_hashes(r->desc, r->in);
    if (!rc)
        rc = tks__write_manifest(r->o, r->partial, r->tk, r->desc, tks_input_get_stats(r->in),
                            r->st.p.shards, r->st.p.n_shards, r->st.p.empty_after_tokenize, r->stats);
    return rc ? rc : tks_partial_publish(TKS_PARTIAL_BUILD, r->partial, r->out);
}

int tks_build(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    /* a build by work units (mpirun) is resumed as one */
    if (o && o->resume && o->out_dir && tks__partial_is_units(o->out_dir)) return tks__build_units_here(o, stats);
    if (!o || !o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    run *r = calloc(1, sizeof *r);
    if (!r) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    r->o = o;
    r->stats = stats;
    r->lock_fd = -1;
    r->t0 = omp_get_wtime();
    int rc = run_lock(r);
    if (rc) {
        free(r);
        return rc;
    }
    uint64_t docs_read = 0;
    rc = run_open(r);
    if (!rc) rc = run_batches(r, &docs_read);
    if (!rc) rc = run_finish(r, docs_read);
    stats->seconds = omp_get_wtime() - r->t0;
    if (r->tk) tks__encoder_report(r->tk, o, stats);
    if (stats->input.files == 0 && r->in) stats->input = *tks_input_get_stats(r->in);
    tks_writer_free(r->w);
    json_decref(r->desc);
    tks_partial_state_free(&r->st.p);
    tks_input_free(r->in);
    tks_tok_free(r->tk);
    tks_unlock(r->lock_fd, r->lock_path);
    free(r);
    return rc;
}
