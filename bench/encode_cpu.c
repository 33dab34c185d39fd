/*
 * encode_cpu.c - the fast encoder alone (tks_spm_encode_fast), one thread,
 * timed by CPU time (clock()), one document per line of a file: MB of text
 * per CPU-second, with and without the word cache. Used for the hit/miss
 * path figures in docs/BENCHMARKS.md. Build it against a configured build/:
 *   cc -O2 -I. bench/encode_cpu.c -o encode_cpu build/libtks_tokenizer.a \
 *      build/libtks_common.a -lsentencepiece_train -lsentencepiece -lstdc++ \
 *      -lxxhash -ljansson -fopenmp -lpthread -lm
 * usage: encode_cpu MODEL TEXT   (TEXT up to 256 MB)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double run(const tks_spm *s, const char *b, size_t n, size_t *ids) {
    tks_ids v = {0};
    *ids = 0;
    clock_t t0 = clock();
    for (const char *p = b, *e = b + n; p < e;) {
        const char *q = memchr(p, '\n', (size_t)(e - p));
        if (!q) q = e;
        if (tks_spm_encode_fast(s, p, (size_t)(q - p), &v)) exit(1);
        *ids += v.n;
        p = q + 1;
    }
    tks_ids_free(&v);
    return (double)(clock() - t0) / CLOCKS_PER_SEC;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: encode_cpu MODEL TEXT\n");
        return 2;
    }
    tks_spm *s;
    if (tks_spm_load(argv[1], &s)) {
        fprintf(stderr, "%s\n", tks_last_error()->message);
        return 2;
    }
    if (tks_spm_fast_unavailable(s)) {
        fprintf(stderr, "no fast encoder for %s: %s\n", argv[1], tks_spm_fast_unavailable(s));
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    size_t cap = 256u << 20;
    char *b = malloc(cap);
    if (!f || !b) return 2;
    size_t n = fread(b, 1, cap, f);
    fclose(f);
    size_t ids;
    double t = run(s, b, n, &ids);
    printf("%s: cache on:  %.2f MB per CPU-second (%zu ids)\n", argv[1], n / 1e6 / t, ids);
    tks_spm_set_word_cache(s, 0);
    t = run(s, b, n, &ids);
    printf("%s: cache off: %.2f MB per CPU-second (%zu ids)\n", argv[1], n / 1e6 / t, ids);
    tks_spm_free(s);
    free(b);
    return 0;
}
