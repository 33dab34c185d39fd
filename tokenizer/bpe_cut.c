/* bpe_cut.c - where a long document may be cut for byte-level BPE
 * (tks_bpe_next_cut, tokenizer.h, which gives the argument). */
#include <string.h>

#include "tokenizer/bpe_internal.h"

static inline int ascii_letter(uint8_t c) { return (uint8_t)((c | 0x20) - 'a') < 26; }

/* 1 when an added token of `as` occurs in t[0..len) starting before p and
 * ending after it. */
static int added_spans(const tks_bpe *b, const tks__bpe_added_set *as, const char *t, size_t len, size_t p) {
    if (!as->n) return 0;
    size_t s0 = p + 1 > as->max_len ? p + 1 - as->max_len : 0;
    for (size_t s = s0; s < p; s++) {
        unsigned c = (unsigned char)t[s];
        for (uint32_t k = as->first[c]; k < as->first[c + 1]; k++) {
            const tks__bpe_added *a = &as->tok[k];
            if (s + a->len > p && s + a->len <= len && !memcmp(b->added_text + a->off, t + s, a->len)) return 1;
        }
    }
    return 0;
}

/* 1 when t[a..e) (clipped to the text) is all ASCII. */
static int ascii_window(const char *t, size_t len, size_t a, size_t e) {
    if (e > len) e = len;
    for (size_t i = a; i < e; i++)
        if ((uint8_t)t[i] & 0x80) return 0;
    return 1;
}

size_t tks_bpe_next_cut(const tks_bpe *b, const char *t, size_t len, size_t from) {
    if (!b || !t || !b->fast) return 0;
    size_t wn = b->nfc ? b->added_norm.max_len : 0;
    for (size_t p = from ? from : 1; p < len; p++) {
        uint8_t c = (uint8_t)t[p];
        if (c >= 0x80 || ascii_letter(c) || c == '\'' || !ascii_letter((uint8_t)t[p - 1])) continue;
        if (added_spans(b, &b->added_raw, t, len, p) || added_spans(b, &b->added_norm, t, len, p)) continue;
        if (wn && !ascii_window(t, len, p > wn ? p - wn : 0, p + wn)) continue;
        return p;
    }
    return 0;
}
