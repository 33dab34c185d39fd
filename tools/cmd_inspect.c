/* cmd_inspect.c - inspect: what a dataset or shard holds (tokshard inspect). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "interop/interop.h"
#include "tokenize/tokenize.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/dist.h"
#include "tools/peer.h"
#include "tools/cmds.h"

static void inspect_json(const char *path, const view *v, const tks_stats *st, const char *fp) {
    const tks_shard_header *h0 = tks_shard_hdr(view_shard(v, 0));
    const tks_tokenizer_info *ti = v->ds ? tks_dataset_tokenizer(v->ds) : NULL;
    json_t *shards = json_array();
    for (size_t s = 0; s < view_n(v); s++) {
        const tks_shard_header *h = tks_shard_hdr(view_shard(v, s));
        json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "file",
                                                tks_shard_path(view_shard(v, s)), "index",
                                                (json_int_t)h->shard_index, "bytes", (json_int_t)h->file_size,
                                                "n_docs", (json_int_t)h->n_docs, "n_tokens",
                                                (json_int_t)h->n_tokens, "min_token_id",
                                                (json_int_t)h->min_token_id, "max_token_id",
                                                (json_int_t)h->max_token_id, "chunks", (json_int_t)h->n_chunks));
    }
    json_t *hj = json_array();
    for (int b = 0; b < 64; b++)
        if (st->doc_hist[b])
            json_array_append_new(hj, json_pack("{s:I, s:I, s:I}", "min_len", (json_int_t)(UINT64_C(1) << b),
                                                "max_len", (json_int_t)((UINT64_C(2) << b) - 1), "docs",
                                                (json_int_t)st->doc_hist[b]));
    json_t *tj = json_array();
    char piece[256];
    for (size_t k = 0; k < st->n_top; k++)
        json_array_append_new(tj, json_pack("{s:I, s:I, s:s?}", "id", (json_int_t)st->top[k], "count",
                                            (json_int_t)st->counts[st->top[k]], "piece",
                                            v->tk ? tks_tok_piece(v->tk, st->top[k], piece, sizeof piece)
                                                  : NULL));
    json_t *j = json_pack("{s:s, s:i, s:I, s:i, s:s, s:s?, s:I, s:I, s:I, s:o, s:o, s:o}", "path", path,
                          "format_version", (int)h0->version, "vocab_size", (json_int_t)st->vocab_size,
                          "token_bytes", (int)h0->token_bytes, "tokenizer_fingerprint", fp,
                          "model_type", ti ? ti->model_type : NULL, "n_shards", (json_int_t)view_n(v),
                          "n_docs", (json_int_t)st->n_docs, "n_tokens", (json_int_t)st->n_tokens,
                          "shards", shards, "doc_length_histogram", hj, "top_tokens", tj);
    /* a byte-level build's count of code points unassigned in its encoder's Unicode (null: not recorded) */
    json_object_set_new(j, "unicode", ti && ti->unicode[0]
                                          ? json_pack("{s:s, s:I, s:I}", "version", ti->unicode,
                                                      "unassigned_code_points", (json_int_t)ti->unassigned,
                                                      "unassigned_docs", (json_int_t)ti->unassigned_docs)
                                          : json_null());
    cli_json_print(j);
}

static void inspect_text(const char *path, const view *v, const tks_stats *st, const char *fp) {
    const tks_shard_header *h0 = tks_shard_hdr(view_shard(v, 0));
    const tks_tokenizer_info *ti = v->ds ? tks_dataset_tokenizer(v->ds) : NULL;
    printf("%s: tokshard format v%u, %zu shard(s)\n", path, h0->version, view_n(v));
    printf("  tokenizer     %s%s%s, fingerprint %s\n", ti ? ti->file : "(shard only)",
           ti ? ", " : "", ti ? ti->model_type : "", fp);
    if (ti && ti->unicode[0])
        printf("  unicode       %llu code points in %llu documents unassigned in Unicode %s, the encoder's\n",
               (unsigned long long)ti->unassigned, (unsigned long long)ti->unassigned_docs, ti->unicode);
    char sp[3][16];
    const uint32_t ids3[3] = {h0->bos_id, h0->eos_id, h0->pad_id};
    for (int k = 0; k < 3; k++)
        if (ids3[k] == TKS_NO_ID) snprintf(sp[k], sizeof sp[k], "none");
        else snprintf(sp[k], sizeof sp[k], "%u", ids3[k]);
    printf("  vocab_size    %u (uint%u ids), bos %s, eos %s, pad %s\n", st->vocab_size,
           8 * h0->token_bytes, sp[0], sp[1], sp[2]);
    printf("  documents     %llu\n  tokens        %llu (%.1f per document, min %llu, max %llu)\n",
           (unsigned long long)st->n_docs, (unsigned long long)st->n_tokens,
           st->n_docs ? (double)st->n_tokens / (double)st->n_docs : 0.0,
           (unsigned long long)st->min_doc_tokens, (unsigned long long)st->max_doc_tokens);
    printf("  chunk bytes   %u\n", h0->chunk_bytes);
    printf("  shards:\n");
    for (size_t s = 0; s < view_n(v); s++) {
        const tks_shard_header *h = tks_shard_hdr(view_shard(v, s));
        printf("    %-28s %10llu docs %12llu tokens  ids [%u, %u]  %llu bytes\n",
               tks_shard_path(view_shard(v, s)), (unsigned long long)h->n_docs,
               (unsigned long long)h->n_tokens, h->min_token_id, h->max_token_id,
               (unsigned long long)h->file_size);
    }
    printf("  document length (tokens):\n");
    uint64_t hmax = 1;
    for (int b = 0; b < 64; b++) if (st->doc_hist[b] > hmax) hmax = st->doc_hist[b];
    for (int b = 0; b < 64; b++)
        if (st->doc_hist[b]) {
            char range[48];
            snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)(UINT64_C(1) << b),
                     (unsigned long long)((UINT64_C(2) << b) - 1));
            int bar = (int)(40.0 * (double)st->doc_hist[b] / (double)hmax + 0.5);
            printf("    %-16s %10llu  %.*s\n", range, (unsigned long long)st->doc_hist[b], bar,
                   "########################################");
        }
    printf("  most frequent tokens:\n");
    char piece[256];
    for (size_t k = 0; k < st->n_top; k++) {
        uint64_t c = st->counts[st->top[k]];
        printf("    %8u %12llu  %5.2f%%  %s\n", st->top[k], (unsigned long long)c,
               st->n_tokens ? 100.0 * (double)c / (double)st->n_tokens : 0.0,
               v->tk ? tks_tok_piece(v->tk, st->top[k], piece, sizeof piece) : "");
    }
    if (ti) cli_unassigned_note(stdout, "note", ti->unicode, ti->unassigned, ti->unassigned_docs);
}

int cli_inspect(int argc, char **argv) {
    int as_json = 0;
    uint64_t top = 20;
    const cli_flag flags[] = {
        {.name = "--json", .type = CLI_BOOL, .ptr = &as_json},
        {.name = "--top", .type = CLI_SIZE, .ptr = &top},
        {0},
    };
    const char *path;
    int rc = parse_view_args("inspect", flags, argc, argv, &path);
    if (rc != CLI_PARSED) return rc;
    view v;
    rc = open_view(path, &v, 2);
    if (rc) return rc;
    const tks_shard **shards = malloc(view_n(&v) * sizeof *shards);
    tks_stats *st = NULL;
    for (size_t s = 0; shards && s < view_n(&v); s++) shards[s] = view_shard(&v, s);
    if (!shards) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    else rc = tks_stats_compute(shards, view_n(&v), top > SIZE_MAX ? SIZE_MAX : (size_t)top, &st);
    free(shards);
    if (rc) {
        close_view(&v);
        return cli_lib_error();
    }
    char fp[33];
    tks_hex(tks_shard_hdr(view_shard(&v, 0))->tokenizer_fp, 16, fp);
    if (as_json) inspect_json(path, &v, st, fp);
    else inspect_text(path, &v, st, fp);
    tks_stats_free(st);
    close_view(&v);
    return 0;
}

/* --text: decode (the default; undoes --ids). */
