/* forge_token - test tool: writes an out-of-range token id into a dataset and
 * re-seals every checksum (chunk, table, header, manifest), so that only the
 * id range checks can catch it. Simulates a buggy importer, the failure of
 * the first failure of docs/MOTIVATION.md. Usage: forge_token DATASET SHARD TOKEN_OFFSET ID */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dataset/dataset.h"
#include "tests/manifest_seal.h"

static unsigned char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = aligned_alloc(64, (*n + 64 + 63) & ~(size_t)63);
    if (fread(b, 1, *n, f) != *n) exit(2);
    fclose(f);
    return b;
}
static void spit(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f)) { perror(p); exit(2); }
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: forge_token DATASET SHARD TOKEN_OFFSET ID\n"); return 2; }
    char path[4096], mpath[4096];
    snprintf(path, sizeof path, "%s/shard-%05d.tks", argv[1], atoi(argv[2]));
    snprintf(mpath, sizeof mpath, "%s/manifest.json", argv[1]);
    size_t n, mn;
    unsigned char *b = slurp(path, &n), *m = slurp(mpath, &mn);
    tks_shard_header h;
    if (!b || !m || tks_header_decode(b, n, path, &h)) { fprintf(stderr, "cannot read %s\n", path); return 2; }
    uint64_t off = strtoull(argv[3], NULL, 10), id = strtoull(argv[4], NULL, 10);
    if (off >= h.n_tokens) { fprintf(stderr, "offset past the shard\n"); return 2; }
    if (h.token_bytes == 2) ((uint16_t *)(b + h.tokens_offset))[off] = (uint16_t)id;
    else ((uint32_t *)(b + h.tokens_offset))[off] = (uint32_t)id;
    uint64_t *table = (uint64_t *)(b + h.table_offset);
    for (uint64_t c = 0; c < h.n_chunks; c++) {
        uint64_t o = c * h.chunk_bytes, len = h.tokens_bytes - o < h.chunk_bytes ? h.tokens_bytes - o : h.chunk_bytes;
        table[c] = XXH3_64bits(b + h.tokens_offset + o, len);
    }
    h.table_xxh3 = XXH3_64bits(table, h.table_bytes);
    char old_hx[17], new_hx[17];
    snprintf(old_hx, sizeof old_hx, "%016llx", (unsigned long long)h.header_xxh3);
    tks_header_encode(&h, b); /* the header keeps claiming max_token_id < vocab_size */
    snprintf(new_hx, sizeof new_hx, "%016llx", (unsigned long long)h.header_xxh3);
    spit(path, b, n);
    char *at = strstr((char *)m, old_hx);
    if (!at) { fprintf(stderr, "manifest does not hold %s\n", old_hx); return 2; }
    memcpy(at, new_hx, 16);
    if (reseal_manifest((char *)m, mn)) { fprintf(stderr, "manifest has no seal\n"); return 2; }
    spit(mpath, m, mn);
    printf("forged id %llu at %s token %llu\n", (unsigned long long)id, path, (unsigned long long)off);
    free(b);
    free(m);
    return 0;
}
