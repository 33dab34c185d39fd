/*
 * fuzz_bpe_compare.c - the byte-level BPE encoder against its reference on
 * arbitrary text: tks_bpe_encode (the hand-matched pre-tokenizer patterns,
 * the word cache, the heap merge) and tks_bpe_encode_ref (PCRE2, the plain
 * merge loop) must give identical ids, for each pattern with a hand
 * matcher (gpt2, llama3, qwen2, cl100k, o200k, and Hugging Face's ByteLevel
 * regex, which the gpt2 matcher serves too); invalid UTF-8 is refused by
 * both alike. The tokenizers are made at start-up: every byte as a rank, then
 * the pairs and triples of a small alphabet of ASCII, Latin-1, Cyrillic and
 * CJK bytes, so that merges happen inside and across characters. The text
 * cut at every place tks_bpe_next_cut admits, its parts encoded one by one
 * (tks_bpe_encode_part), gives the ids of the whole.
 *
 * Input: text.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/tokenizer.h"

static const char *const PATTERNS[] = {
    "gpt2", "llama3", "qwen2", "cl100k", "o200k",
    /* tokenizers' ByteLevel regex (pre_tokenizers/byte_level.rs) */
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"};
#define N_PAT (sizeof PATTERNS / sizeof *PATTERNS)
static tks_bpe *g_tt[N_PAT];
static int g_ready;

static void b64(const unsigned char *s, size_t n, char *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = A[w >> 18 & 63];
        out[o++] = A[w >> 12 & 63];
        out[o++] = i + 1 < n ? A[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? A[w & 63] : '=';
    }
    out[o] = 0;
}

static void setup(void) {
    char dir[] = "/tmp/tks-fuzz-bpec-XXXXXX";
    FUZZ_SETUP(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/ranks.tiktoken", dir);
    FILE *f = fopen(path, "w");
    FUZZ_SETUP(f != NULL);
    static const unsigned char alpha[] = " etaoinsE'\n\t0123.,\xc3\xa9\xd0\xb0\xe4\xb8\x80";
    unsigned rank = 0;
    char line[64];
    for (unsigned x = 0; x < 256; x++) {
        unsigned char c = (unsigned char)x;
        b64(&c, 1, line);
        fprintf(f, "%s %u\n", line, rank++);
    }
    size_t na = sizeof alpha - 1;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < na; j++) {
            unsigned char p[2] = {alpha[i], alpha[j]};
            b64(p, 2, line);
            fprintf(f, "%s %u\n", line, rank++);
        }
    for (size_t i = 0; i < 12; i++)
        for (size_t j = 0; j < 12; j++)
            for (size_t k = 0; k < 6; k++) {
                unsigned char p[3] = {alpha[i], alpha[j], alpha[k]};
                b64(p, 3, line);
                fprintf(f, "%s %u\n", line, rank++);
            }
    fclose(f);
    for (size_t i = 0; i < N_PAT; i++) {
        tks_tiktoken_opts o = {PATTERNS[i], "<|endoftext|>=100000"};
        FUZZ_SETUP(tks_bpe_load_tiktoken(path, &o, &g_tt[i]) == 0);
    }
    g_ready = 1;
}

static void compare(const tks_bpe *b, const uint8_t *data, size_t size) {
    tks_ids fast = {0}, ref = {0};
    int rf = tks_bpe_encode(b, (const char *)data, size, &fast);
    int rr = tks_bpe_encode_ref(b, (const char *)data, size, &ref);
    FUZZ_CHECK(rf == rr);
    FUZZ_CHECK(rf == 0 || rf == TKS_ERR_UTF8 || rf == TKS_ERR_NOMEM);
    if (!rf && !rr) {
        FUZZ_CHECK(fast.n == ref.n);
        FUZZ_CHECK(fast.n == 0 || !memcmp(fast.ids, ref.ids, fast.n * sizeof *fast.ids));
        /* the long-document cut rule: every candidate at once */
        const char *t = (const char *)data;
        size_t at = 0, got = 0;
        for (;;) {
            size_t p = tks_bpe_next_cut(b, t, size, at + 1);
            size_t e = p ? p : size;
            FUZZ_CHECK(!p || (p > at && p < size));
            uint64_t un;
            FUZZ_CHECK(tks_bpe_encode_part(b, t + at, e - at, &ref, &un) == 0);
            FUZZ_CHECK(got + ref.n <= fast.n);
            FUZZ_CHECK(ref.n == 0 || !memcmp(fast.ids + got, ref.ids, ref.n * sizeof *ref.ids));
            got += ref.n;
            if (!p) break;
            at = p;
        }
        FUZZ_CHECK(got == fast.n);
    }
    tks_ids_free(&fast);
    tks_ids_free(&ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ready) setup();
    /* twice: the second pass meets the word cache the first one filled */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < N_PAT; i++) compare(g_tt[i], data, size);
    return 0;
}
