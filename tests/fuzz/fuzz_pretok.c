/*
 * fuzz_pretok.c - the pre-tokenizer's fast paths against PCRE2 on arbitrary
 * text: for each named pattern with a hand matcher (gpt2, llama3, qwen2,
 * cl100k, o200k), the piece ends of the bit-mask windows with the matchers
 * (tks__bpe_fast_ends, tokenizer/bpe_pretok_win.c) and of the matchers alone
 * (tks__bpe_fast_ends_scalar, tokenizer/bpe_pretok.c) must be PCRE2's for
 * the same pattern, piece for piece. The encoder calls them in runs that
 * resume at the last end; the run length comes from the input's first byte,
 * so runs end anywhere. The matchers serve the Basic Multilingual Plane: the
 * input's bytes from 0xF0 up are left out, and text that is then not valid
 * UTF-8 (PCRE2's check) is not compared (the encoder refuses it first).
 *
 * Input: a byte (the run length), then text.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/bpe_internal.h"

static const char *const NAMES[] = {"gpt2", "llama3", "qwen2", "cl100k", "o200k"};
enum { N_PAT = sizeof NAMES / sizeof *NAMES, CAP = 1 << 16 };
static int g_prog[N_PAT];
static pcre2_code *g_re[N_PAT];
static pcre2_match_data *g_md[N_PAT];
static int g_ready;

static void setup(void) {
    FUZZ_SETUP(tks__bpe_fast_init() == 0);
    for (int k = 0; k < N_PAT; k++) {
        const char *pat = k == 0 ? tks__bpe_gpt2_pattern : tks_tiktoken_pattern(NAMES[k]);
        g_prog[k] = tks__bpe_fast_program(pat);
        FUZZ_SETUP(g_prog[k] != TKS__FAST_NONE);
        int err;
        PCRE2_SIZE eoff;
        g_re[k] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY,
                                &err, &eoff, NULL);
        FUZZ_SETUP(g_re[k] != NULL);
        pcre2_jit_compile(g_re[k], PCRE2_JIT_COMPLETE);
        FUZZ_SETUP((g_md[k] = pcre2_match_data_create_from_pattern(g_re[k], NULL)) != NULL);
    }
    g_ready = 1;
}

/* PCRE2's piece ends of t[0..n) (each match starts where the last ended);
 * -1 when the text is not valid UTF-8 (then nothing is compared). */
static long pcre_ends(int k, const char *t, size_t n, size_t *ends) {
    size_t pos = 0, m = 0;
    while (pos < n) {
        int r = pcre2_match(g_re[k], (PCRE2_SPTR)t, n, pos, pos ? PCRE2_NO_UTF_CHECK : 0, g_md[k], NULL);
        if (r < 0 && pos == 0 && r != PCRE2_ERROR_NOMATCH) return -1; /* the UTF-8 check */
        FUZZ_CHECK(r >= 0); /* the patterns match at every position */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(g_md[k]);
        FUZZ_CHECK(ov[0] == pos && ov[1] > pos && m < CAP);
        ends[m++] = pos = ov[1];
    }
    return (long)m;
}

/* The fast path's ends in runs of `run` pieces, each resuming at the last end. */
static size_t fast_ends(int k, int scalar, const char *t, size_t n, size_t *ends, size_t run) {
    size_t m = 0;
    for (size_t i = 0; i < n && m < CAP;) {
        size_t r = CAP - m < run ? CAP - m : run;
        size_t got = scalar ? tks__bpe_fast_ends_scalar(g_prog[k], t, n, i, ends + m, r, n)
                            : tks__bpe_fast_ends(g_prog[k], t, n, i, ends + m, r);
        FUZZ_CHECK(got > 0 && got <= r);
        m += got;
        FUZZ_CHECK(ends[m - 1] > i && ends[m - 1] <= n);
        i = ends[m - 1];
    }
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ready) setup();
    if (size < 2 || size > CAP) return 0;
    static char t[CAP];
    static size_t want[CAP], got[CAP];
    size_t run = 1 + data[0] % 160, n = 0;
    for (size_t i = 1; i < size; i++)
        if (data[i] < 0xF0) t[n++] = (char)data[i];
    for (int k = 0; k < N_PAT; k++) {
        long m = pcre_ends(k, t, n, want);
        if (m < 0) return 0;
        for (int scalar = 0; scalar < 2; scalar++) {
            size_t f = fast_ends(k, scalar, t, n, got, run);
            if (f != (size_t)m || memcmp(want, got, f * sizeof *got)) {
                size_t g = 0;
                while (g < f && g < (size_t)m && want[g] == got[g]) g++;
                fprintf(stderr, "%s (%s, runs of %zu): piece %zu ends at %zu, PCRE2's at %zu\n", NAMES[k],
                        scalar ? "matchers" : "windows", run, g, g < f ? got[g] : 0, g < (size_t)m ? want[g] : 0);
                FUZZ_CHECK(!"the fast path cut the text otherwise than PCRE2");
            }
        }
    }
    return 0;
}
