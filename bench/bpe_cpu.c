/*
 * bpe_cpu.c - MB of text per CPU-second of the byte-level BPE encoder on one
 * thread, with each of its parts switched off in turn: the whole encoder,
 * without the word cache, and the reference (PCRE2 pieces, the plain merge
 * loop). CPU time (CLOCK_THREAD_CPUTIME_ID) rather than wall time, so that
 * a busy machine shifts the figures less; the ratios are what to read.
 *
 * Usage: bpe_cpu TOKENIZER [--pattern P] [--special-tokens S] [--only-full] FILE.jsonl...
 *        bpe_cpu TOKENIZER [--pattern P] [--special-tokens S] --load-only
 *   --only-full: the whole encoder only, five times (for a profiler)
 *   --load-only: the tokenizer's load (tks_tok_load_opts, wall time) five
 *     times in this process; the first is what a fresh process pays
 *   (each line a JSON object whose "text" is a document)
 * Build: part of the CMake build (bench target tokshard-bpe-cpu).
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct docs {
    char **p;
    size_t *len, n, bytes;
} docs;

static int read_jsonl(const char *path, docs *d) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)got, 0, NULL);
        json_t *t = json_object_get(j, "text");
        if (json_is_string(t)) {
            d->p = realloc(d->p, (d->n + 1) * sizeof *d->p);
            d->len = realloc(d->len, (d->n + 1) * sizeof *d->len);
            d->len[d->n] = json_string_length(t);
            d->p[d->n] = malloc(d->len[d->n] + 1);
            memcpy(d->p[d->n], json_string_value(t), d->len[d->n]);
            d->bytes += d->len[d->n++];
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    return 0;
}

static double run(tks_bpe *b, const docs *d, int ref, uint64_t *ids) {
    tks_ids out = {0};
    double t0 = cpu_s();
    *ids = 0;
    for (size_t i = 0; i < d->n; i++) {
        int rc = ref ? tks_bpe_encode_ref(b, d->p[i], d->len[i], &out) : tks_bpe_encode(b, d->p[i], d->len[i], &out);
        if (rc) {
            fprintf(stderr, "encode failed: %s\n", tks_last_error()->message);
            exit(1);
        }
        *ids += out.n;
    }
    tks_ids_free(&out);
    return cpu_s() - t0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bpe_cpu TOKENIZER [--pattern P] [--special-tokens S] FILE.jsonl...\n");
        return 2;
    }
    tks_tok_opts o = {0};
    docs d = {0};
    int only_full = 0, load_only = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--only-full")) only_full = 1;
        else if (!strcmp(argv[i], "--load-only")) load_only = 1;
        else if (!strcmp(argv[i], "--pattern") && i + 1 < argc) o.pattern = argv[++i];
        else if (!strcmp(argv[i], "--special-tokens") && i + 1 < argc) o.special_tokens = argv[++i];
        else if (read_jsonl(argv[i], &d)) return fprintf(stderr, "cannot read %s\n", argv[i]), 2;
    }
    tks_tok *t;
    if (load_only) {
        printf("load_ms");
        for (int k = 0; k < 5; k++) {
            double t0 = wall_s();
            if (tks_tok_load_opts(argv[1], &o, &t)) {
                fprintf(stderr, "%s: %s\n", argv[1], tks_last_error()->message);
                return 2;
            }
            printf(" %.1f", 1e3 * (wall_s() - t0));
            tks_tok_free(t);
        }
        printf("\n");
        return 0;
    }
    if (tks_tok_load_opts(argv[1], &o, &t) || !tks_tok_bpe(t)) {
        fprintf(stderr, "%s: not a byte-level BPE tokenizer: %s\n", argv[1], tks_last_error()->message);
        return 2;
    }
    tks_bpe *b = tks_tok_bpe(t);
    double mb = (double)d.bytes / 1e6;
    uint64_t n_ids, n2;
    double cold = run(b, &d, 0, &n_ids); /* the first pass meets empty caches */
    double full = run(b, &d, 0, &n_ids);
    if (only_full) { /* for a profiler: the encoder as the build runs it */
        for (int k = 0; k < 4; k++) full += run(b, &d, 0, &n_ids);
        tks_encoder_stats st;
        tks_bpe_encoder_stats(b, &st);
        printf("%.2f MB/s per CPU-second; word cache hits %.1f%% of %llu pieces\n", 5 * mb / full,
               100.0 * (double)st.word_hits / (double)(st.words ? st.words : 1), (unsigned long long)st.words);
        return 0;
    }
    tks_bpe_set_word_cache(b, 0);
    double nocache = run(b, &d, 0, &n2);
    double ref = run(b, &d, 1, &n2);
    printf("{\"tokenizer\": \"%s\", \"documents\": %zu, \"mb\": %.2f, \"ids\": %llu, "
           "\"first_pass_mb_per_cpu_s\": %.2f, \"mb_per_cpu_s\": %.2f, \"no_cache_mb_per_cpu_s\": %.2f, "
           "\"reference_mb_per_cpu_s\": %.2f}\n",
           argv[1], d.n, mb, (unsigned long long)n_ids, mb / cold, mb / full, mb / nocache, mb / ref);
    tks_tok_free(t);
    return 0;
}
