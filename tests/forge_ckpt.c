/* forge_ckpt - test tool: writes VALUE (a number, nan, inf or -inf) over
 * element ELEMENT of the F32 tensor TENSOR in FILE (model.safetensors or
 * optimizer.safetensors) of checkpoint CHECKPOINT, then records the file's
 * new XXH3-128 in trainer_state.json (the checkpoint's own checksum,
 * tks_file_xxh3_128), so that only a check of the values can catch it: a
 * checkpoint rewritten by another tool.
 * Usage: forge_ckpt CHECKPOINT FILE TENSOR ELEMENT VALUE */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/ckpt/safetensors.h"

static char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (!b || fread(b, 1, *n, f) != *n) exit(2);
    b[*n] = 0;
    fclose(f);
    return b;
}

static int hash_hex(const char *path, char hx[33]) {
    uint8_t h[16];
    if (tks_file_xxh3_128(path, h, NULL)) return -1;
    tks_hex(h, 16, hx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: forge_ckpt CHECKPOINT FILE TENSOR ELEMENT VALUE\n");
        return 2;
    }
    char path[4096], spath[4096], before[33], after[33];
    snprintf(path, sizeof path, "%s/%s", argv[1], argv[2]);
    snprintf(spath, sizeof spath, "%s/trainer_state.json", argv[1]);
    uint64_t elem = strtoull(argv[4], NULL, 10);
    float v = strtof(argv[5], NULL);
    tks_st_file *f = NULL;
    tks_st_info t;
    if (tks_st_open(path, &f) || tks_st_find(f, argv[3], &t) || t.dtype != TKS_ST_F32 || elem >= t.numel) {
        fprintf(stderr, "forge_ckpt: %s: no F32 tensor %s with an element %s (%s)\n", path, argv[3], argv[4],
                tks_last_error()->message);
        return 2;
    }
    uint64_t off = t.offset + elem * sizeof v;
    tks_st_close(f);
    if (hash_hex(path, before)) return 2;
    FILE *w = fopen(path, "r+b");
    if (!w || fseek(w, (long)off, SEEK_SET) || fwrite(&v, sizeof v, 1, w) != 1 || fclose(w)) {
        perror(path);
        return 2;
    }
    if (hash_hex(path, after)) return 2;
    size_t n;
    char *s = slurp(spath, &n), *at = s ? strstr(s, before) : NULL;
    if (!at) {
        fprintf(stderr, "forge_ckpt: %s does not record %s's checksum %s\n", spath, argv[2], before);
        return 2;
    }
    memcpy(at, after, 32);
    FILE *o = fopen(spath, "wb");
    if (!o || fwrite(s, 1, n, o) != n || fclose(o)) {
        perror(spath);
        return 2;
    }
    free(s);
    return 0;
}
