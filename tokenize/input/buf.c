/* buf.c - the growable byte buffer of the input reader (buf, internal.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/input/input.h"

int tks__buf_reserve(buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                            "out of memory growing a %zu-byte input buffer", need);
    b->p = p;
    b->cap = cap;
    return 0;
}

int tks__buf_append(buf *b, const void *p, size_t n) {
    if (n > SIZE_MAX - b->len)
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "input buffer size overflow");
    int rc = tks__buf_reserve(b, b->len + n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}
