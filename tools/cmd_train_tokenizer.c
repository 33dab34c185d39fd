/* cmd_train_tokenizer.c - train-tokenizer: a sentencepiece model trained on the inputs
 * (tokshard train-tokenizer). */
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

typedef struct sentence_src {
    tks_input *in;
    tks_doc doc;
    size_t pos;       /* next byte of doc to split */
    int have_doc;
    uint64_t lines;
} sentence_src;

/* Yields the non-empty lines of every document. */
static int next_sentence(void *ctx, const char **text, size_t *len) {
    sentence_src *s = ctx;
    for (;;) {
        if (!s->have_doc) {
            int r = tks_input_next(s->in, &s->doc);
            if (r <= 0) return r;
            s->have_doc = 1;
            s->pos = 0;
        }
        if (s->pos >= s->doc.len) {
            s->have_doc = 0;
            continue;
        }
        const char *p = s->doc.text + s->pos;
        size_t rest = s->doc.len - s->pos;
        const char *nl = memchr(p, '\n', rest);
        size_t n = nl ? (size_t)(nl - p) : rest;
        s->pos += n + 1;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k == n) continue;
        *text = p;
        *len = n && p[n - 1] == '\r' ? n - 1 : n;
        s->lines++;
        return 1;
    }
}

static int set_model_type(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    if (strcmp(v, "bpe") && strcmp(v, "unigram") && strcmp(v, "word") && strcmp(v, "char"))
        return cli_usage_error("--model-type %s: expected bpe, unigram, word or char", v);
    *(const char **)f->ptr = v;
    return 0;
}

static int set_spm_vocab(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    if (x < 8 || x > 1000000) return cli_usage_error("--vocab-size %llu: expected 8..1000000", (unsigned long long)x);
    *(uint32_t *)f->ptr = (uint32_t)x;
    return 0;
}

static int set_coverage(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    double *c = f->ptr;
    char *e;
    *c = strtod(v, &e);
    if (*e || *c <= 0 || *c > 1)
        return cli_usage_error("--character-coverage %s: expected a number in (0, 1]", v);
    return 0;
}

int cli_train_tokenizer(int argc, char **argv) {
    tks_spm_train_opts t = {.model_type = "bpe", .vocab_size = 8000, .input_sentence_size = 2000000,
                            .seed = 1234};
    tks_input_opts io;
    tks_input_opts_default(&io);
    io.split = TKS_SPLIT_FILE;
    const cli_flag input[] = INPUT_FLAGS(&io);
    const cli_flag flags[] = {
        {.name = "--output", .alias = "-o", .type = CLI_STR, .ptr = &t.model_prefix},
        {.name = "--model-type", .ptr = &t.model_type, .set = set_model_type},
        {.name = "--vocab-size", .ptr = &t.vocab_size, .set = set_spm_vocab},
        {.name = "--byte-fallback", .type = CLI_BOOL, .ptr = &t.byte_fallback},
        {.name = "--character-coverage", .ptr = &t.character_coverage, .set = set_coverage},
        {.name = "--input-sentence-size", .type = CLI_SIZE, .ptr = &t.input_sentence_size},
        {.name = "--threads", .ptr = &t.threads, .set = set_int},
        {0},
    };
    /* INPUT arguments are collected in place at the front of argv */
    cli_list in = {(const char **)argv, 0};
    cli_command cmd = {.shared = input, .flags = flags, .unknown = UNKNOWN("train-tokenizer"),
                       .positional = cli_take_all, .ctx = &in};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (!t.model_prefix) return cli_usage_error("train-tokenizer: --output PREFIX is required (writes PREFIX.model)");
    if (!in.n) return cli_usage_error("train-tokenizer: give at least one INPUT");
    if (!t.threads) t.threads = 1; /* the model depends on (and records) it: same default everywhere */
    sentence_src src = {0};
    int rc = tks_input_open(in.items, in.n, &io, &src.in);
    double t0 = omp_get_wtime();
    if (!rc) rc = tks_spm_train(&t, next_sentence, &src);
    if (rc == TKS_ERR_INPUT && src.lines == 0) { /* what was read, and what was left out */
        const tks_input_stats *is = tks_input_get_stats(src.in);
        tks_fail(rc, NULL, TKS_NONE, TKS_NONE,
                 "the inputs hold no non-empty line to train on: %llu files, %llu documents read; "
                 "left out: %llu empty, %llu invalid UTF-8 (--invalid-utf8), %llu too long, %llu "
                 "binary. Check the paths, --doc-split and those policies",
                 (unsigned long long)is->files, (unsigned long long)is->docs,
                 (unsigned long long)is->empty_skipped, (unsigned long long)is->utf8_skipped,
                 (unsigned long long)is->long_skipped, (unsigned long long)is->binary_skipped);
    }
    tks_input_free(src.in);
    if (rc) return cli_lib_error();
    printf("trained %s.model (%s, vocab %u) from %llu lines in %.1f s\n", t.model_prefix,
           t.model_type, t.vocab_size, (unsigned long long)src.lines, omp_get_wtime() - t0);
    return 0;
}
