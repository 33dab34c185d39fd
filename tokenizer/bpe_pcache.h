/*
 * bpe_pcache.h - the byte-level BPE encoder's tables of short pieces, private
 * to tokenizer/bpe*.c: the ids of a piece of at most PKEY_MAX bytes found
 * with its bytes as the key, no hash of a string and no compare of bytes
 * elsewhere in memory.
 *
 * The key: the piece's bytes in the first 15 bytes of two little-endian
 * words (zero after its end), its length in the last byte, so that two keys
 * are equal exactly when the pieces are. A slot holds a key and up to
 * PSLOT_IDS ids, 32 bytes, two to a 64-byte line; a key's line is the top
 * bits of a multiply of its words (pkey_line).
 *
 * Two tables of slots:
 *   - the seed (tks_bpe.seed, shared, read-only): every mergeable token of at
 *     most PKEY_MAX bytes with the ids BPE gives its bytes (the token itself
 *     with a ranks file or ignore_merges; with merges, what the merge engine
 *     gives, checked once when the tokenizer is parsed, bpe_seed.c, and kept
 *     in the tokenizer cache); at most half full, a key's line then the next
 *     ones until a line with an empty slot (open addressing by lines);
 *   - a thread's cache (scratch.pc): the other pieces as they are merged, the
 *     key's line only (two ways, the older one goes).
 * A piece is looked up in the seed, then in the thread's cache; a miss is
 * merged (bpe_merge.c) and cached.
 */
#ifndef TKS_TOKENIZER_BPE_PCACHE_H
#define TKS_TOKENIZER_BPE_PCACHE_H

#include <stdint.h>
#include <string.h>

#include "tokenizer/bpe_internal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the piece keys are little-endian words"
#endif

#define PKEY_MAX 15  /* the longest piece a key holds */
#define PSLOT_IDS 3  /* ids a slot holds */

typedef struct pkey {
    uint64_t lo, hi; /* bytes 0-7, bytes 8-14 and the length in the top byte */
} pkey;

/* A slot; lo == 0 && hi == 0: empty (a key's length byte is never 0). */
struct tks__bpe_pslot {
    uint64_t lo, hi;
    uint32_t id[PSLOT_IDS];
    uint32_t n; /* ids in id[] (1 .. PSLOT_IDS) */
};
typedef tks__bpe_pslot pslot;

/* The low n bytes of a word (n <= 8). */
static inline uint64_t pkey_low(uint64_t w, size_t n) { return n >= 8 ? w : w & ((1ull << (8 * n)) - 1); }

/* The key of the piece t[0..n), 1 <= n <= PKEY_MAX, whose text goes on to
 * `end` (at least 16 bytes readable from t: two unaligned loads; else the
 * piece is copied first). */
static inline pkey pkey_of(const char *t, size_t n, const char *end) {
    uint64_t w0, w1;
    if (end - t >= 16) {
        memcpy(&w0, t, 8);
        memcpy(&w1, t + 8, 8);
    } else {
        char b[16] = {0};
        memcpy(b, t, n);
        memcpy(&w0, b, 8);
        memcpy(&w1, b + 8, 8);
    }
    pkey k;
    k.lo = pkey_low(w0, n);
    k.hi = (n > 8 ? pkey_low(w1, n - 8) : 0) | (uint64_t)n << 56;
    return k;
}

/* The key's hash: its line in a table of 2^bits lines is the top `bits`. */
static inline uint64_t pkey_hash(pkey k) { return (k.lo ^ (k.hi * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull; }

/* The key's line of a table of 2^bits lines, 1 <= bits < 64. */
static inline size_t pkey_line(pkey k, unsigned bits) { return (size_t)(pkey_hash(k) >> (64 - bits)); }

static inline int pslot_is(const pslot *s, pkey k) { return s->lo == k.lo && s->hi == k.hi; }

/* The seed's slot of key k (hash h), or NULL. */
static inline const pslot *seed_find(const tks_bpe *b, pkey k, uint64_t h) {
    size_t mask = ((size_t)1 << b->seed_bits) - 1;
    for (size_t l = (size_t)(h >> (64 - b->seed_bits));; l = (l + 1) & mask) {
        const pslot *s = &b->seed[2 * l];
        if (pslot_is(&s[0], k)) return &s[0];
        if (pslot_is(&s[1], k)) return &s[1];
        if (!s[1].hi) return NULL; /* a line with room ends the chain */
    }
}

/* A thread's cache of 2^bits lines: the slot of key k (hash h), or NULL. */
static inline const pslot *pc_find(const pslot *pc, unsigned bits, pkey k, uint64_t h) {
    const pslot *s = &pc[2 * (h >> (64 - bits))];
    return pslot_is(&s[0], k) ? &s[0] : pslot_is(&s[1], k) ? &s[1] : NULL;
}

/* Caches key k (hash h) with ids[0..n), 1 <= n <= PSLOT_IDS, as its line's
 * first slot, the first moving to the second (the older of the two goes). */
static inline void pc_put(pslot *pc, unsigned bits, pkey k, uint64_t h, const uint32_t *ids, size_t n) {
    pslot *s = &pc[2 * (h >> (64 - bits))];
    s[1] = s[0];
    s[0] = (pslot){k.lo, k.hi, {0, 0, 0}, (uint32_t)n};
    memcpy(s[0].id, ids, n * sizeof *ids);
}

#endif
