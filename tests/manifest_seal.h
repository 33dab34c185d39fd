/* manifest_seal.h - test side: recomputes manifest.json's "self_xxh3" seal
 * after a test edited the manifest on purpose, so that a check behind the
 * seal (totals, token_bytes, id ranges) is what has to catch the edit.
 * The rule is docs/FORMAT.md's: XXH3-64 of the bytes before the key. */
#ifndef TKS_TEST_MANIFEST_SEAL_H
#define TKS_TEST_MANIFEST_SEAL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* m[0..n): a manifest whose seal is the last key. 0, or -1 when there is none. */
static inline int reseal_manifest(char *m, size_t n) {
    static const char key[] = "\"self_xxh3\": \"";
    char *at = NULL;
    for (char *p = m; (p = memmem(p, n - (size_t)(p - m), key, sizeof key - 1)); p++) at = p;
    if (!at || (size_t)(at - m) + sizeof key - 1 + 16 > n) return -1;
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)XXH3_64bits(m, (size_t)(at - m)));
    memcpy(at + sizeof key - 1, hx, 16);
    return 0;
}
#endif
