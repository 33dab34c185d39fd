/* audit_report.c - prints an audit report (text or JSON) for both tokshard
 * executables: the full one (tools/tokshard.c) and the lean front end
 * (tools/tokshard_lean.c), so that the two print byte-identical reports. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "dataset/dataset.h"
#include "tools/cli.h"

static json_t *num_or_null(uint64_t v) { return v == TKS_NONE ? json_null() : json_integer((json_int_t)v); }

/* The manifest's count of code points unassigned in the encoder's Unicode,
 * as JSON (null when not recorded). */
static json_t *unicode_json(const tks_audit_report *r) {
    if (!r->unicode[0]) return json_null();
    return json_pack("{s:s, s:I, s:I}", "version", r->unicode, "unassigned_code_points", (json_int_t)r->unassigned,
                     "unassigned_docs", (json_int_t)r->unassigned_docs);
}

void cli_unassigned_note(FILE *f, const char *lead, const char *unicode, uint64_t code_points, uint64_t docs) {
    if (!code_points) return;
    fprintf(f, "%s: %llu code point%s in %llu document%s of the dataset %s unassigned in Unicode %s, the "
            "Unicode of the byte-level encoder that built it: Hugging Face tokenizers and tiktoken on a newer "
            "Unicode may split the text around them otherwise and give %s other ids\n",
            lead, (unsigned long long)code_points, code_points == 1 ? "" : "s", (unsigned long long)docs,
            docs == 1 ? "" : "s", code_points == 1 ? "is" : "are", unicode, docs == 1 ? "that document" : "those documents");
}

int cli_audit_print(const char *path, const tks_audit_report *r, int as_json, const char *foreign) {
    double gbs = r->seconds > 0 ? r->bytes_hashed / 1e9 / r->seconds : 0;
    if (as_json) {
        json_t *probs = json_array();
        for (size_t i = 0; i < r->n_problems; i++) {
            const tks_audit_problem *p = &r->problems[i];
            json_array_append_new(
                probs, json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:s}", "kind", tks_strerror(p->code),
                                 "file", p->file, "shard", num_or_null(p->shard), "chunk",
                                 num_or_null(p->chunk), "token_offset", num_or_null(p->token_offset),
                                 "byte_offset", num_or_null(p->byte_offset), "doc",
                                 num_or_null(p->doc), "message", p->message));
        }
        json_t *j = json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:f, s:f, s:o}",
                              "path", path, "ok", r->n_problems_total == 0, "problems_total",
                              (json_int_t)r->n_problems_total, "shards", (json_int_t)r->n_shards,
                              "chunks", (json_int_t)r->n_chunks, "documents", (json_int_t)r->n_docs,
                              "tokens", (json_int_t)r->n_tokens, "vocab_size", (json_int_t)r->vocab_size,
                              "min_token_id", (json_int_t)r->min_token_id, "max_token_id",
                              (json_int_t)r->max_token_id, "manifest_checked", r->manifest_checked,
                              "tokenizer_checked", r->tokenizer_checked, "seconds", r->seconds,
                              "gb_per_s", gbs, "problems", probs);
        json_object_set_new(j, "unicode", unicode_json(r));
        cli_json_print(j);
    } else {
        for (size_t i = 0; i < r->n_problems; i++) {
            const tks_audit_problem *p = &r->problems[i];
            printf("PROBLEM %s: %s", tks_strerror(p->code), p->file);
            if (p->shard != TKS_NONE) printf(" shard %llu", (unsigned long long)p->shard);
            if (p->chunk != TKS_NONE) printf(" chunk %llu", (unsigned long long)p->chunk);
            if (p->token_offset != TKS_NONE) printf(" token %llu", (unsigned long long)p->token_offset);
            if (p->byte_offset != TKS_NONE) printf(" byte %llu", (unsigned long long)p->byte_offset);
            if (p->doc != TKS_NONE) printf(" doc %llu", (unsigned long long)p->doc);
            printf(": %s\n", p->message);
        }
        if (r->n_problems < r->n_problems_total)
            printf("... and %zu more problems\n", r->n_problems_total - r->n_problems);
        if (foreign)
            printf("%s: %s (%s): %llu documents, %llu tokens, ids in [%u, %u] of model vocab %u; "
                   "%.1f MB scanned in %.1f ms\n", r->n_problems_total ? "FAILED" : "OK", path,
                   foreign, (unsigned long long)r->n_docs,
                   (unsigned long long)r->n_tokens, r->min_token_id, r->max_token_id, r->vocab_size,
                   r->bytes_hashed / 1e6, r->seconds * 1e3);
        else
            printf("%s: %s: %llu shards, %llu chunks, %llu documents, %llu tokens, ids in [%u, %u] of "
                   "vocab %u%s%s; %.1f MB hashed in %.1f ms (%.2f GB/s)\n",
                   r->n_problems_total ? "FAILED" : "OK", path, (unsigned long long)r->n_shards,
                   (unsigned long long)r->n_chunks, (unsigned long long)r->n_docs,
                   (unsigned long long)r->n_tokens, r->min_token_id, r->max_token_id, r->vocab_size,
                   r->manifest_checked ? ", manifest checked" : "",
                   r->tokenizer_checked ? ", tokenizer checked" : "", r->bytes_hashed / 1e6, r->seconds * 1e3, gbs);
        if (r->n_problems_total) printf("%zu problem(s) found\n", r->n_problems_total);
        cli_unassigned_note(stdout, "note", r->unicode, r->unassigned, r->unassigned_docs);
    }
    return r->n_problems_total ? EXIT_PROBLEMS : 0;
}
