/*
 * bpe_wcache.h - the byte-level BPE encoder's per-thread piece caches,
 * private to tokenizer/bpe*.c: the word cache (pieces of up to CACHE_KEY
 * bytes) and the long-piece cache (up to LCACHE_MAX bytes), both keyed by a
 * piece's bytes and holding its ids (bpe_encoder.h describes them). The
 * lookups run on every piece and are inline; making the caches and storing
 * a long piece are bpe_wcache.c's.
 */
#ifndef TKS_TOKENIZER_BPE_WCACHE_H
#define TKS_TOKENIZER_BPE_WCACHE_H

#include "tokenizer/bpe_encoder.h"
#include "tokenizer/bpe_vocab.h"

/* bpe_wcache.c: the thread's caches made on first use: 1 when e uses them,
 * 0 when not (off, or the reference path), or TKS_ERR_NOMEM. */
int tks__bpe_wcache_on(enc *e);
/* bpe_wcache.c: the piece t[0..n) with ids[0..k) into its long-piece cache
 * entry (the entry's previous piece goes); out of memory leaves the entry
 * empty. */
void tks__bpe_lcache_put(scratch *s, uint64_t h, const char *t, size_t n, const uint32_t *ids, size_t k);

/* The piece t[0..n) (n <= CACHE_KEY) zero-padded into key. */
static inline void cache_key(const char *t, size_t n, uint64_t key[CACHE_KEY / 8]) {
    for (size_t w = 0; w < CACHE_KEY / 8; w++) key[w] = n > 8 * w ? tks__bpe_head8(t + 8 * w, n - 8 * w) : 0;
}

static inline const cline *cache_get(const scratch *s, size_t set, const uint64_t key[CACHE_KEY / 8], size_t n) {
    const cline *l = &s->cache[2 * set];
    for (int w = 0; w < 2; w++, l++)
        if (l->len == n && l->key[0] == key[0] && l->key[1] == key[1] && l->key[2] == key[2]) return l;
    return NULL;
}

/* Caches the piece with ids[0..k) (k <= CACHE_IDS) as the set's first line,
 * the first moving to the second (the older of the two goes). */
static inline void cache_put(scratch *s, size_t set, const uint64_t key[CACHE_KEY / 8], size_t n, const uint32_t *ids,
                      size_t k) {
    cline *l = &s->cache[2 * set];
    l[1] = l[0];
    memcpy(l->key, key, CACHE_KEY);
    if (k) memcpy(l->ids, ids, k * sizeof *ids); /* an empty piece passes no ids */
    l->len = (uint8_t)n;
    l->n_ids = (uint8_t)k;
}


static inline const lent *lcache_get(const scratch *s, uint64_t h, const char *t, size_t n) {
    const lent *l = &s->lcache[(h >> 20) & (LCACHE - 1)];
    return l->blob && l->h == h && l->len == n && !memcmp(l->blob, t, n) ? l : NULL;
}

/* The piece's hash into *k, its vocabulary slot and word-cache set fetched
 * ahead. */
static inline void tks__bpe_piece_key(enc *e, const char *t, size_t n, ckey *k) {
    k->h = tks__bpe_hash(t, n);
    __builtin_prefetch(&e->b->vslot[k->h & e->b->vmask]);
    /* the piece's word-cache set (two lines; 8 MiB a thread does not stay
     * in L2), unless the piece is too long to be cached */
    if (n <= CACHE_KEY && e->s->cache) {
        const cline *l = &e->s->cache[2 * ((size_t)(k->h >> 32) & (CACHE_SETS - 1))];
        __builtin_prefetch(l);
        __builtin_prefetch(l + 1);
    }
}

/* Appends k cached ids: 0 or TKS_ERR_NOMEM. */
static inline int tks__bpe_append(enc *e, const uint32_t *ids, size_t k) {
    int rc = tks__bpe_out_reserve(e, k);
    if (rc) return rc;
    if (k) memcpy(e->out->ids + e->out->n, ids, k * sizeof *ids);
    e->out->n += k;
    return 0;
}

/* The piece t[0..n) (hash k) looked up in the caches: 1 with its ids
 * appended to e's output, 0 on a miss with *w set for tks__bpe_wcache_put,
 * or a negative error from growing the output. */
static inline int tks__bpe_wcache_get(enc *e, const char *t, size_t n, const ckey *k, wslot *w) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    w->line = b->word_cache && n <= CACHE_KEY;
    w->lng = b->word_cache && n > 0 && n <= LCACHE_MAX && s->lcache;
    w->set = (size_t)(k->h >> 32) & (CACHE_SETS - 1);
    if (w->line) {
        cache_key(t, n, w->key);
        const cline *l = cache_get(s, w->set, w->key, n);
        if (l) {
            s->st.word_hits++;
            s->st.hit_bytes += n;
            int rc = tks__bpe_append(e, l->ids, l->n_ids); /* a piece whose bytes have no token: none */
            return rc ? rc : 1;
        }
    }
    if (w->lng) {
        const lent *l = lcache_get(s, k->h, t, n);
        if (l) {
            s->st.word_hits++;
            s->st.hit_bytes += n;
            int rc = tks__bpe_append(e, (const uint32_t *)(l->blob + n), l->n_ids);
            return rc ? rc : 1;
        }
    }
    return 0;
}

/* The piece (hash k) with its ids[0..m) stored where *w says: the word
 * cache when it has at most CACHE_IDS ids, else the long-piece cache. */
static inline void tks__bpe_wcache_put(enc *e, const wslot *w, const char *t, size_t n, const ckey *k,
                                       const uint32_t *ids, size_t m) {
    if (w->line && m <= CACHE_IDS) cache_put(e->s, w->set, w->key, n, ids, m);
    else if (w->lng) tks__bpe_lcache_put(e->s, k->h, t, n, ids, m);
}

#endif
