/*
 * fuzz_encode.c - tokshard's fast encoder (tokenizer/fastenc.c) against
 * sentencepiece on arbitrary bytes: the ids must be identical.
 *
 * The first byte picks the model (bit 0: BPE with byte fallback, or unigram
 * without), the rest is the text, passed as is (invalid UTF-8, NUL and all:
 * both encoders accept any bytes). The models are trained once per process
 * by tks_spm_train on the first lines of GCIDE and a Japanese man page
 * (dict-gcide, manpages-ja), so CJK, Latin and unknown characters all occur,
 * in a temporary directory removed at exit.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/tokenizer.h"

static tks_spm *g_models[2];
static char g_dir[64];
static char *g_lines[4000];
static size_t g_n_lines, g_i;

static int next_line(void *ctx, const char **text, size_t *len) {
    (void)ctx;
    if (g_i >= g_n_lines) return 0;
    *text = g_lines[g_i];
    *len = strlen(g_lines[g_i]);
    g_i++;
    return 1;
}

static void cleanup(void) {
    char p[128];
    for (int m = 0; m < 2; m++) {
        tks_spm_free(g_models[m]);
        snprintf(p, sizeof p, "%s/m%d.model", g_dir, m);
        unlink(p);
        snprintf(p, sizeof p, "%s/m%d.vocab", g_dir, m);
        unlink(p);
    }
    rmdir(g_dir);
}

static void setup(void) {
    FILE *f = popen("(zcat /usr/share/dictd/gcide.dict.dz | head -3000; "
                    "zcat \"$(find /usr/share/man/ja -name '*.gz' | sort | head -1)\" | head -1000) "
                    "2>/dev/null", "r");
    FUZZ_SETUP(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (g_n_lines < 4000 && (n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] == '\n') line[--n] = 0;
        if (n > 0 && (size_t)n == strlen(line)) g_lines[g_n_lines++] = strdup(line);
    }
    free(line);
    pclose(f);
    FUZZ_SETUP(g_n_lines > 1000); /* needs dict-gcide (scripts/install-deps.sh) */
    snprintf(g_dir, sizeof g_dir, "/tmp/tks-fuzz-encode-XXXXXX");
    FUZZ_SETUP(mkdtemp(g_dir) != NULL);
    for (int m = 0; m < 2; m++) {
        char prefix[128], path[160];
        snprintf(prefix, sizeof prefix, "%s/m%d", g_dir, m);
        tks_spm_train_opts o = {.model_prefix = prefix, .model_type = m ? "unigram" : "bpe",
                                .vocab_size = 800, .byte_fallback = m == 0, .threads = 1,
                                .seed = 1};
        g_i = 0;
        FUZZ_SETUP(tks_spm_train(&o, next_line, NULL) == 0);
        snprintf(path, sizeof path, "%s.model", prefix);
        FUZZ_SETUP(tks_spm_load(path, &g_models[m]) == 0);
        FUZZ_SETUP(tks_spm_fast_unavailable(g_models[m]) == NULL);
    }
    for (size_t i = 0; i < g_n_lines; i++) free(g_lines[i]);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_models[0]) setup();
    if (size < 1) return 0;
    const tks_spm *spm = g_models[data[0] & 1];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    tks_ids a = {0}, b = {0};
    int ra = tks_spm_encode_ref(spm, text, len, &a);
    int rb = tks_spm_encode_fast(spm, text, len, &b);
    FUZZ_CHECK(ra == 0 && rb == 0);
    if (a.n != b.n || (a.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids))) {
        size_t k = 0;
        while (k < a.n && k < b.n && a.ids[k] == b.ids[k]) k++;
        fprintf(stderr, "ids differ at %zu: sentencepiece %zu ids, fast %zu ids\n", k, a.n, b.n);
        FUZZ_CHECK(!"fast encoder and sentencepiece disagree");
    }
    tks_ids_free(&a);
    tks_ids_free(&b);
    return 0;
}
