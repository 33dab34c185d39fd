/* build.c - what every build shares: the provenance and build id, the
 * manifest, the checks made before anything is written, the shard writer.
 * The build itself is units.c (tks_build, tks_build_job_*), its pipeline
 * batch.c:
 *
 *   a unit's ranges --(tks_input, sequential, on a reader thread)--> batch of documents
 *          --(OpenMP, dynamic, longest first)--> ids per document
 *          --(in document order)--> tks_writer --> the unit's shards
 *
 * Output depends only on the document sequence of each unit, so it is
 * byte-identical for any thread count and any spread of the units. */
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

#include "tokenize/pipeline/pipeline.h"
#include "common/tks_json.h"

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


/* The options that change the output, as JSON (part of the provenance and
 * of the build id). */
static json_t *describe_options(const tks_build_opts *o, const tks_tok *tk) {
    char fp[33];
    tks_hex(tks_tok_fingerprint(tk), 16, fp);
    json_t *opt = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:b, s:b, s:I, s:s, s:I, s:I}", "tokenizer_fingerprint", fp,
        "doc_split", split_name(o->input.split), "format", format_name(o->input.format), "jsonl_key",
        o->input.jsonl_key ? o->input.jsonl_key : "text", "invalid_utf8",
        policy_name(o->input.invalid_utf8), "max_doc_bytes",
        (json_int_t)(o->input.max_doc_bytes ? o->input.max_doc_bytes : (64u << 20)), "on_long_doc",
        policy_name(o->input.long_doc), "on_bad_record", policy_name(o->input.bad_record),
        "append_eos", o->append_eos, "prepend_bos", o->prepend_bos, "unit_bytes",
        (json_int_t)(o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES), "unit_rule", TKS_UNIT_RULE,
        "shard_tokens", (json_int_t)(o->shard_tokens ? o->shard_tokens : (16u << 20)), "chunk_bytes",
        (json_int_t)(o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES));
    if (opt && o->allow_special_in_text) /* absent by default, as on_bad_input */
        json_object_set_new(opt, "allow_special_in_text", json_true());
    if (opt && o->input.bad_input == TKS_POLICY_SKIP) /* absent by default: ids of earlier builds kept */
        json_object_set_new(opt, "on_bad_input", json_string("skip"));
    if (opt && o->input.no_follow_links) /* absent by default, as above */
        json_object_set_new(opt, "no_follow_links", json_true());
    return opt;
}

/* Inputs and every option that changes the output, as JSON (the manifest's
 * provenance). The inputs' XXH3-128 are added by whoever writes the
 * manifest, from the units' records. */
json_t *tks__describe(const tks_build_opts *o, const tks_input *in, const tks_tok *tk, int *rc) {
    *rc = 0;
    json_t *inputs = json_array();
    int parquet = 0;
    for (size_t i = 0; i < tks_input_n_files(in); i++) {
        json_t *f = json_pack("{s:o, s:I}", "path", tks_json_path(tks_input_file(in, i)), "bytes",
                              (json_int_t)tks_input_file_size(in, i));
        const struct file_meta *m = &in->meta[i];
        if (f && m->parquet) { /* the column read, its row groups and rows (the footer's) */
            uint64_t rows = 0;
            for (uint32_t g = 0; g < m->pq_n; g++) rows += m->pq[g].rows;
            json_object_set_new(f, "parquet", json_pack("{s:s, s:I, s:I}", "column",
                                                        o->input.parquet_column ? o->input.parquet_column : "text",
                                                        "row_groups", (json_int_t)m->pq_n, "rows", (json_int_t)rows));
            parquet = 1;
        }
        json_array_append_new(inputs, f);
    }
    json_t *opt = describe_options(o, tk);
    if (opt && parquet) /* absent without Parquet inputs: ids of earlier builds kept */
        json_object_set_new(opt, "parquet_column",
                            json_string(o->input.parquet_column ? o->input.parquet_column : "text"));
    json_t *d = json_pack("{s:s, s:o, s:o}", "tool", "tokshard " TKS_VERSION_STRING, "inputs", inputs,
                          "options", opt);
    /* inputs reached through links that leave the named paths (or left out
     * under --no-follow-links): provenance a reader of the manifest can see */
    const tks_input_stats *ls = tks_input_get_stats(in);
    if (d && ls->links_outside) json_object_set_new(d, "links_outside", json_integer((json_int_t)ls->links_outside));
    if (d && ls->links_skipped) json_object_set_new(d, "links_skipped", json_integer((json_int_t)ls->links_skipped));
    if (d && o->input.bad_input == TKS_POLICY_SKIP) {
        json_t *sk = json_array();
        for (size_t i = 0; tks_input_skipped_file(in, i); i++)
            json_array_append_new(sk, tks_json_path(tks_input_skipped_file(in, i)));
        json_object_set_new(d, "skipped_inputs", sk);
    }
    if (!d) *rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    return d;
}

/* The build id: XXH3-64 of the tool, the options and each input's path, size
 * and modification time as listed (no file is opened), so that a resume
 * with other options or edited inputs is refused at once (and one whose
 * edit kept size and time is caught when a kept unit's ranges are hashed
 * again). */
int tks__build_id(const tks_build_opts *o, const tks_input *in, const tks_tok *tk, char out[17]) {
    json_t *opt = describe_options(o, tk);
    char *text = opt ? json_dumps(opt, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(opt);
    XXH3_state_t *st = text ? XXH3_createState() : NULL;
    if (!st) {
        free(text);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, "tokshard " TKS_VERSION_STRING, sizeof("tokshard " TKS_VERSION_STRING));
    XXH3_64bits_update(st, text, strlen(text) + 1);
    for (size_t i = 0; i < in->n_files; i++) {
        uint64_t v[3] = {in->sizes[i], (uint64_t)in->meta[i].mtime.tv_sec, (uint64_t)in->meta[i].mtime.tv_nsec};
        XXH3_64bits_update(st, in->files[i], strlen(in->files[i]) + 1);
        XXH3_64bits_update(st, v, sizeof v);
        if (in->meta[i].parquet) { /* the column read */
            const char *col = o->input.parquet_column ? o->input.parquet_column : "text";
            XXH3_64bits_update(st, col, strlen(col) + 1);
        }
    }
    for (size_t i = 0; tks_input_skipped_file(in, i); i++)
        XXH3_64bits_update(st, tks_input_skipped_file(in, i), strlen(tks_input_skipped_file(in, i)) + 1);
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(st));
    XXH3_freeState(st);
    free(text);
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
    tks_tokenizer_info tok;
    tks_tokenizer_record(tk, &tok);
    tok.special_from_text = o->allow_special_in_text;
    if (tks_tok_bpe(tk)) { /* what a reference on a newer Unicode may encode otherwise */
        snprintf(tok.unicode, sizeof tok.unicode, "%s", tks_bpe_unicode_version());
        tok.unassigned = stats->unassigned;
        tok.unassigned_docs = stats->unassigned_docs;
    }
    return tks_manifest_write_json(partial, &tok, shards, n_shards,
                                   tok.vocab_size <= TKS_U16_MAX_VOCAB ? 2 : 4,
                                   o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES, desc);
}

int tks_tokenizer_open(const tks_build_opts *o, tks_tok **tk) {
    tks_tok_opts to = {.pattern = o->pattern, .special_tokens = o->special_tokens, .allow_special = o->allow_special_in_text};
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
                          .chunk_bytes = o->chunk_bytes, .first_shard = first_shard,
                          .provenance = 1}; /* each document's source (tokshard audit --against-source) */
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
    snprintf(stats->tokenizer_cache, sizeof stats->tokenizer_cache, "%s", tks_tok_cache_note(tk));
}
