/*
 * bpe_vocab.h - the byte-level BPE handle's vocabulary table, private to
 * tokenizer/bpe*.c: the hash a mergeable token's slot is found by (the
 * table is built with it, bpe_build.c, and kept in the tokenizer cache,
 * bpe_cache.c, whose key covers this file) and the lookups the encoder makes
 * on every piece. Inline: a call into libxxhash per piece cost 6% of a build.
 */
#ifndef TKS_TOKENIZER_BPE_VOCAB_H
#define TKS_TOKENIZER_BPE_VOCAB_H

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"

/* A 64-bit mixer (MurmurHash3's fmix64 finalizer): the merge table's slot
 * of a pair key. */
static inline uint64_t tks__bpe_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* The hash of a piece's bytes s[0..n): XXH3-64; its low bits are the
 * vocabulary slot, its high 32 the word-cache set. */
static inline uint64_t tks__bpe_hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

/* The mergeable token with bytes s[0..n), or TKS_NO_ID; h is
 * tks__bpe_hash(s, n). */
static inline uint32_t tks__bpe_vocab_find_h(const tks_bpe *b, const char *s, size_t n, uint64_t h) {
    uint64_t head = tks__bpe_head8(s, n);
    for (size_t i = h & b->vmask;; i = (i + 1) & b->vmask) {
        const tks__bpe_vslot *v = &b->vslot[i];
        if (v->id == TKS_NO_ID) return TKS_NO_ID;
        if (v->len == n && v->head == head && (n <= 8 || !memcmp(b->bytes + b->off[v->id] + 8, s + 8, n - 8)))
            return v->id;
    }
}

static inline uint32_t tks__bpe_vocab_find(const tks_bpe *b, const char *s, size_t n) {
    return tks__bpe_vocab_find_h(b, s, n, tks__bpe_hash(s, n));
}

#endif
