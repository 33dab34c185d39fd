/* forge_cache - test tool: writes the tokenizer cache entry of a
 * tokenizer.json the way the library writes it (tks__bpe_cache_store, under
 * this user's key in $TOKSHARD_CACHE_DIR), from tables altered on purpose:
 * the one-byte tokens of two bytes swapped, wherever the encoder looks them
 * up. A build that maps the entry
 * gives other ids for text holding those bytes, and every checksum of its
 * dataset is valid: what only an audit against the sources, which parses
 * the tokenizer file, can catch. Usage: forge_cache TOKENIZER.json A B (A
 * and B: one character each) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_pcache.h"

int main(int argc, char **argv) {
    if (argc != 4 || strlen(argv[2]) != 1 || strlen(argv[3]) != 1) {
        fprintf(stderr, "usage: forge_cache TOKENIZER.json A B\n");
        return 2;
    }
    const char *dir = getenv("TOKSHARD_CACHE_DIR");
    if (!dir || !*dir || !strcmp(dir, "off")) {
        fprintf(stderr, "forge_cache: set TOKSHARD_CACHE_DIR to the cache directory to forge in\n");
        return 2;
    }
    char *keep = strdup(dir);
    setenv("TOKSHARD_CACHE_DIR", "off", 1); /* parsed from the file */
    tks_bpe *b = NULL;
    if (tks_bpe_load(argv[1], &b)) {
        fprintf(stderr, "forge_cache: %s\n", tks_last_error()->message);
        return 2;
    }
    setenv("TOKSHARD_CACHE_DIR", keep, 1);
    unsigned char x = (unsigned char)argv[2][0], y = (unsigned char)argv[3][0];
    uint32_t ix = b->byte_id[x], iy = b->byte_id[y];
    if (ix == TKS_NO_ID || iy == TKS_NO_ID) {
        fprintf(stderr, "forge_cache: a byte without a token of its own\n");
        return 2;
    }
    /* every table the encoder reads the two ids from: the bytes' table, the
     * vocabulary hash and the short pieces' table (bpe_pcache.h) */
#define SWAP(v) ((v) == ix ? iy : (v) == iy ? ix : (v))
    b->byte_id[x] = iy;
    b->byte_id[y] = ix;
    for (size_t i = 0; i <= b->vmask; i++) b->vslot[i].id = SWAP(b->vslot[i].id);
    for (size_t i = 0; b->seed && i < ((size_t)2 << b->seed_bits); i++)
        for (uint32_t k = 0; k < b->seed[i].n; k++) b->seed[i].id[k] = SWAP(b->seed[i].id[k]);
    struct stat st;
    if (stat(argv[1], &st)) return 2;
    tks__bpe_cache_store(b, b->fingerprint, (size_t)st.st_size);
    printf("forged the cache entry of %s in %s: bytes '%c' and '%c' swapped\n", argv[1], keep, x, y);
    tks_bpe_free(b);
    free(keep);
    return 0;
}
