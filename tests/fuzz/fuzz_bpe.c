/*
 * fuzz_bpe.c - the tokenizer.json loader of byte-level BPE (tks_bpe_load) on
 * arbitrary bytes, and, for a file it accepts, the encoder and decoder.
 * A load either succeeds or fails with TKS_ERR_TOKENIZER (TKS_ERR_NOMEM
 * tolerated); an accepted model encodes a fixed text and the input's own
 * bytes (refusing invalid UTF-8 with TKS_ERR_UTF8) into ids below its
 * vocabulary size, which decode without error.
 *
 * Input: the bytes of a tokenizer.json.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

static char g_dir[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/tks-fuzz-bpe-XXXXXX");
        FUZZ_SETUP(mkdtemp(g_dir) != NULL);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    fuzz_write_file(path, data, size);
    tks_bpe *b = NULL;
    int rc = tks_bpe_load(path, &b);
    FUZZ_CHECK(rc == 0 || rc == TKS_ERR_TOKENIZER || rc == TKS_ERR_NOMEM);
    FUZZ_CHECK((rc == 0) == (b != NULL));
    if (!b) return 0;
    static const char text[] = "Hello, world! It's 2024: \xc3\xa9t\xc3\xa9  \n\n\t x12345 <|endoftext|>";
    tks_ids ids = {0};
    const char *in[2] = {text, (const char *)data};
    size_t len[2] = {sizeof text - 1, size};
    for (int k = 0; k < 2; k++) {
        rc = tks_bpe_encode(b, in[k], len[k], &ids);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_UTF8 || rc == TKS_ERR_NOMEM);
        if (rc) continue;
        for (size_t i = 0; i < ids.n; i++) FUZZ_CHECK(ids.ids[i] < tks_bpe_vocab_size(b));
        char *t = NULL;
        size_t tl = 0;
        FUZZ_CHECK(tks_bpe_decode(b, ids.ids, ids.n, &t, &tl) == 0);
        free(t);
    }
    tks_ids_free(&ids);
    tks_bpe_free(b);
    return 0;
}
