/*
 * The hand matchers of the named pre-tokenizer patterns (tokenizer/
 * bpe_pretok.c: GPT-2's, Llama 3's, Qwen 2's, cl100k's, o200k's) against
 * PCRE2 matching the same pattern, piece for piece: where every piece ends.
 * The matchers find runs 64 bytes at a time with bit masks; the texts are
 * made to cross those blocks everywhere: random strings over an alphabet of
 * every class the patterns tell apart (ASCII letters of both cases, digits,
 * each ASCII whitespace, apostrophes and the contractions' letters, '/',
 * punctuation, and BMP letters of each general category, marks, digits,
 * spaces and the code points that fold to s and k; every other text ASCII
 * only), at every length to 300 bytes, then the Python documentation's reST
 * sources (python3.11-doc) whole. Both the matchers alone and the bit-mask
 * windows with them (bpe_pretok_win.c) are compared.
 *
 * Usage: test_pretok [ITERATIONS] [DOC_DIR]
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/check.h"
#include "tokenizer/bpe_internal.h"

/* The piece ends PCRE2 gives t[0..n): each match starts where the last
 * ended (the patterns match at every position); -1 when one does not. */
static long pcre_ends(pcre2_code *re, pcre2_match_data *md, const char *t, size_t n, size_t *ends, size_t cap) {
    size_t pos = 0, m = 0;
    while (pos < n) {
        int r = pcre2_match(re, (PCRE2_SPTR)t, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] != pos || ov[1] <= pos || m == cap) return -1;
        ends[m++] = pos = ov[1];
    }
    return (long)m;
}

static int scalar_only; /* the matchers alone, or the windows with them */

/* The hand matcher's ends of t[0..n), in runs of `run` pieces (each run
 * resuming at the last end, as the encoder calls it). */
static size_t fast_ends(int prog, const char *t, size_t n, size_t *ends, size_t cap, size_t run) {
    size_t m = 0;
    for (size_t i = 0; i < n && m < cap;) {
        size_t r = cap - m < run ? cap - m : run;
        size_t k = scalar_only ? tks__bpe_fast_ends_scalar(prog, t, n, i, ends + m, r, n)
                               : tks__bpe_fast_ends(prog, t, n, i, ends + m, r);
        m += k;
        i = ends[m - 1];
    }
    return m;
}

static void show(const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
}

/* 1 when the two cut t alike; else says where, once per pattern. */
static int compare(const char *name, int prog, pcre2_code *re, pcre2_match_data *md, const char *t, size_t n,
                   size_t *a, size_t *b, size_t cap, int *shown) {
    long m = pcre_ends(re, md, t, n, a, cap);
    size_t f = fast_ends(prog, t, n, b, cap, 1 + (size_t)(n % 7) * 37);
    size_t g = 0;
    for (g = 0; m >= 0 && g < (size_t)m && g < f && a[g] == b[g]; g++) {}
    int same = m >= 0 && (size_t)m == f && g == f;
    if (!same && !(*shown)++) {
        fprintf(stderr, "%s: piece %zu differs (PCRE2 ends at %zu, the hand matcher at %zu) in \"", name, g,
                m >= 0 && g < (size_t)m ? a[g] : 0, g < f ? b[g] : 0);
        show(t, n);
        fprintf(stderr, "\"\n");
    }
    return same;
}

static const char *const alphabet[] = {
    "a", "b", "s", "t", "e", "r", "v", "m", "l", "d", "x", "A", "B", "S", "T", "R", "E", "L", "D", "Z",
    "0", "1", "9", " ", " ", " ", "\t", "\n", "\r", "\v", "\f", "'", "'", "/", ",", ".", "(", ")", "-", "_",
    "\"", "#", "\x01", "\x7f",
    "\xc3\xa9",         /* e acute, Ll */
    "\xc3\x89",         /* E acute, Lu */
    "\xc7\x85",         /* U+01C5, Lt */
    "\xca\xb0",         /* U+02B0, Lm */
    "\xe3\x82\xa2",     /* U+30A2 katakana, Lo */
    "\xcc\x81",         /* U+0301 combining acute, Mn */
    "\xd9\xa3",         /* U+0663 Arabic-Indic three, Nd */
    "\xc2\xbd",         /* U+00BD one half, No */
    "\xc2\xa0",         /* U+00A0 no-break space, Zs */
    "\xe2\x80\xa8",     /* U+2028 line separator */
    "\xc2\x85",         /* U+0085 next line */
    "\xc5\xbf",         /* U+017F long s: folds to s */
    "\xe2\x84\xaa",     /* U+212A Kelvin sign: folds to k */
    "\xc4\xb0",         /* U+0130, Lu */
    "\xe2\x80\x94",     /* U+2014 em dash, Pd */
    "\xef\xbf\xbd",     /* U+FFFD */
};

/* A random BMP text of about `len` bytes, skewed towards runs (a class
 * repeated) so that runs cross the 64-byte blocks. */
#define N_ASCII 44 /* the alphabet's ASCII entries come first */

static size_t random_text(char *out, size_t cap, size_t len, uint64_t *st, int ascii) {
    size_t n = 0;
    size_t na = ascii ? N_ASCII : sizeof alphabet / sizeof *alphabet;
    while (n < len) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = *st >> 33;
        const char *a = alphabet[r % na];
        size_t reps = (r >> 8) % 4 == 0 ? 1 + (r >> 12) % 70 : 1;
        for (size_t k = 0; k < reps && n + strlen(a) < cap; k++) {
            memcpy(out + n, a, strlen(a));
            n += strlen(a);
        }
        if (n + 4 >= cap) break;
    }
    return n;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) *n = (size_t)sz;
    return b;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    const char *docdir = argc > 2 ? argv[2] : "/usr/share/doc/python3.11/html/_sources/library";
    CHECK(tks__bpe_fast_init() == 0, "the hand matchers' tables did not build");
    static const char *const names[] = {"gpt2", "llama3", "qwen2", "cl100k", "o200k"};
    const size_t cap = 1 << 22;
    size_t *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    char *t = malloc(4096);
    /* the documentation, concatenated (BMP only: the matchers' range) */
    DIR *d = opendir(docdir);
    char *docs = malloc(1);
    size_t nd = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && nd < 3000000) {
        char p[4096];
        size_t len = 0;
        snprintf(p, sizeof p, "%s/%s", docdir, e->d_name);
        char *f = e->d_name[0] == '.' ? NULL : slurp(p, &len);
        int bmp = f != NULL;
        for (size_t i = 0; bmp && i < len; i++) bmp = (unsigned char)f[i] < 0xF0;
        if (bmp && (docs = realloc(docs, nd + len + 1))) memcpy(docs + nd, f, len), nd += len;
        free(f);
    }
    if (d) closedir(d);
    CHECK(nd > 100000, "no documentation text read from %s (python3.11-doc)", docdir);
    for (scalar_only = 0; scalar_only < 2; scalar_only++)
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *pat = k == 0 ? tks__bpe_gpt2_pattern : tks_tiktoken_pattern(names[k]);
        int prog = tks__bpe_fast_program(pat);
        CHECK(prog != TKS__FAST_NONE, "%s: no hand matcher", names[k]);
        int err;
        PCRE2_SIZE eoff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &eoff, NULL);
        pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
        CHECK(re && md, "%s: the pattern does not compile", names[k]);
        if (!re || !md || prog == TKS__FAST_NONE) continue;
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        int shown = 0;
        long bad = 0;
        uint64_t st = 0x9E3779B97F4A7C15ull * (k + 1);
        for (long it = 0; it < iters; it++) {
            /* every other text ASCII only: the bit masks' windows take those */
            size_t n = random_text(t, 4096, 1 + (size_t)(it % 300), &st, it & 1);
            bad += !compare(names[k], prog, re, md, t, n, a, b, cap, &shown);
        }
        CHECK(bad == 0, "%s (%s): %ld of %ld random texts cut otherwise than PCRE2 cuts them", names[k],
              scalar_only ? "matchers" : "windows", bad, iters);
        if (nd) CHECK(compare(names[k], prog, re, md, docs, nd, a, b, cap, &shown),
                      "%s: the documentation (%zu bytes) is cut otherwise than PCRE2 cuts it", names[k], nd);
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
    free(docs);
    free(t);
    free(a);
    free(b);
    return check_exit("test_pretok");
}
