/*
 * fuzz_bpe.c - the loaders of byte-level BPE on arbitrary bytes: as a
 * tokenizer.json or tiktoken descriptor (tks_bpe_load) and as a tiktoken
 * ranks file with GPT-2's pattern (tks_bpe_load_tiktoken); for a file one
 * accepts, the encoder and decoder. A load either succeeds or fails with
 * TKS_ERR_TOKENIZER (TKS_ERR_NOMEM tolerated; TKS_ERR_ARG for a ranks file
 * whose ranks reach the pattern's special id, or a descriptor's ranks file
 * that is absent: TKS_ERR_IO); an accepted model encodes a fixed text and
 * the input's own bytes (refusing invalid UTF-8 with TKS_ERR_UTF8) into ids
 * below its vocabulary size, which decode without error. An accepted
 * tokenizer.json is loaded again from the tokenizer cache it left
 * (tokenizer/bpe_cache.c, in the fuzzer's directory) and must encode both
 * texts to the same ids.
 *
 * Input: the bytes of a tokenizer.json, a descriptor or a ranks file.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/tokenizer.h"

static char g_dir[64];

/* An accepted tokenizer encodes a fixed text and the input's own bytes;
 * with `same` (the same tokenizer loaded otherwise), to the same ids. */
static void exercise(const tks_bpe *b, const tks_bpe *same, const uint8_t *data, size_t size) {
    static const char text[] = "Hello, world! It's 2024: \xc3\xa9t\xc3\xa9  \n\n\t x12345 <|endoftext|>";
    tks_ids ids = {0}, other = {0};
    const char *in[2] = {text, (const char *)data};
    size_t len[2] = {sizeof text - 1, size};
    for (int k = 0; k < 2; k++) {
        int rc = tks_bpe_encode(b, in[k], len[k], &ids);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_UTF8 || rc == TKS_ERR_NOMEM);
        if (rc) continue;
        for (size_t i = 0; i < ids.n; i++) FUZZ_CHECK(ids.ids[i] < tks_bpe_vocab_size(b));
        if (same) {
            FUZZ_CHECK(tks_bpe_encode(same, in[k], len[k], &other) == 0);
            FUZZ_CHECK(other.n == ids.n && (!ids.n || !memcmp(other.ids, ids.ids, ids.n * sizeof *ids.ids)));
        }
        char *t = NULL;
        size_t tl = 0;
        FUZZ_CHECK(tks_bpe_decode(b, ids.ids, ids.n, &t, &tl) == 0);
        free(t);
    }
    tks_ids_free(&ids);
    tks_ids_free(&other);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/tks-fuzz-bpe-XXXXXX");
        FUZZ_SETUP(mkdtemp(g_dir) != NULL);
        char cache[96];
        snprintf(cache, sizeof cache, "%s/cache", g_dir);
        setenv("TOKSHARD_CACHE_DIR", cache, 1);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    fuzz_write_file(path, data, size);
    for (int kind = 0; kind < 2; kind++) {
        tks_bpe *b = NULL;
        tks_tiktoken_opts o = {"gpt2", NULL};
        int rc = kind ? tks_bpe_load_tiktoken(path, &o, &b) : tks_bpe_load(path, &b);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_TOKENIZER || rc == TKS_ERR_NOMEM || rc == (kind ? TKS_ERR_ARG : TKS_ERR_IO));
        FUZZ_CHECK((rc == 0) == (b != NULL));
        tks_bpe *again = NULL;
        if (b && !kind) {
            FUZZ_CHECK(tks_bpe_load(path, &again) == 0);
            if (tks_bpe_from_cache(b)) FUZZ_CHECK(tks_bpe_from_cache(again));
        }
        if (b) exercise(b, again, data, size);
        tks_bpe_free(again);
        tks_bpe_free(b);
    }
    return 0;
}
