/* bpe_merge.c - the byte-level BPE merge engines (bpe_encoder.h): the ids of
 * one piece by the rule both references state (tokenizers' BPE model with
 * merges, tiktoken's byte_pair_merge with ranks): the pair of lowest rank
 * merged first, the leftmost among equal ranks, until no pair has a rank.
 * A pair's rank is its merge's line (tokenizer.json) or the rank of the
 * token its bytes make (a ranks file). Three engines for three sizes, the
 * same ids: a heap for long pieces, flat arrays for short ones, and the
 * plain O(n^2) loop as the reference. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_encoder.h"
#include "tokenizer/bpe_pcache.h"
#include "tokenizer/bpe_vocab.h"
#include "tokenizer/heap.h"

static inline int hent_before(const hent *a, const hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}
TKS_HEAP_DEFINE(heap, hent, hent_before)

/* The lookup of the pair starting at symbol pos: where its rank is to be
 * found, computed (and that memory fetched) ahead of the lookup itself, so
 * that the lookups of several pairs wait for memory together. */
typedef struct probe {
    uint64_t key;  /* merges: (left << 32 | right) + 1; ranks: the hash of the pair's bytes */
    int32_t pos, end;
} probe;

/* The lookup key of the pair of symbols l, r whose bytes are t[s0 .. s1)
 * (merges: l << mq_id | r in the compact table, else (l << 32 | r) + 1; ranks:
 * the hash of the bytes, their packed key's
 * (bpe_pcache.h) when they are short: the seed holds every short token, its
 * id its rank), its slot fetched now for pair_rank later. Bytes up to lim
 * may be read. */
static inline uint64_t pair_key(const tks_bpe *b, const char *t, const char *lim, uint32_t l, uint32_t r, size_t s0,
                                size_t s1) {
    uint64_t key;
    if (b->mode == TKS__BPE_RANKS && s1 - s0 <= PKEY_MAX) {
        key = pkey_hash(pkey_of(t + s0, s1 - s0, lim));
        __builtin_prefetch(&b->seed[2 * (key >> (64 - b->seed_bits))]);
    } else if (b->mode == TKS__BPE_RANKS) {
        key = XXH3_64bits(t + s0, s1 - s0);
        __builtin_prefetch(&b->vslot[key & b->vmask]);
    } else if (b->mq) {
        key = (uint64_t)l << b->mq_id | r;
        __builtin_prefetch(&b->mq[tks__bpe_mix64(key) & b->mqmask]);
    } else {
        key = ((uint64_t)l << 32 | r) + 1;
        __builtin_prefetch(&b->mslot[tks__bpe_mix64(key) & b->mmask]);
    }
    return key;
}

/* The pair of pair_key's key: rank << 32 | new id (in rank mode both are
 * the token's id of t[s0 .. s1); with the compact table the priority in
 * place of the rank, which orders alike); UINT64_MAX when it merges into
 * nothing. */
static inline uint64_t pair_rank(const tks_bpe *b, const char *t, const char *lim, uint64_t key, size_t s0,
                                 size_t s1) {
    if (b->mode == TKS__BPE_RANKS && s1 - s0 <= PKEY_MAX) {
        const pslot *p = seed_find(b, pkey_of(t + s0, s1 - s0, lim), key);
        return p ? (uint64_t)p->id[0] << 32 | p->id[0] : UINT64_MAX;
    }
    if (b->mode == TKS__BPE_RANKS) {
        uint32_t id = tks__bpe_vocab_find_h(b, t + s0, s1 - s0, key);
        return id == TKS_NO_ID ? UINT64_MAX : (uint64_t)id << 32 | id;
    }
    if (b->mq) { /* one slot: the priority orders as the rank, and holds the new id */
        for (size_t i = tks__bpe_mix64(key) & b->mqmask;; i = (i + 1) & b->mqmask) {
            uint64_t v = b->mq[i];
            if (!v) return UINT64_MAX;
            if (v >> b->mq_p == key) {
                uint64_t pr = (v & ((1ull << b->mq_p) - 1)) - 1;
                return pr << 32 | (uint32_t)(pr >> b->mq_sub);
            }
        }
    }
    for (size_t i = tks__bpe_mix64(key) & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mslot[i].key == key) return (uint64_t)b->mslot[i].rank << 32 | b->mslot[i].new_id;
        if (!b->mslot[i].key) return UINT64_MAX;
    }
}

/* 0 when pos has no right neighbour. `t` is the piece: in rank mode every
 * byte is a symbol, so positions are byte offsets and the pair's bytes are
 * t[pos .. end). */
static inline int pair_probe(const tks_bpe *b, const scratch *s, const char *t, const char *lim, int32_t m,
                              int32_t pos, probe *p) {
    int32_t nx = s->next[pos];
    if (nx < 0) return 0;
    p->pos = pos;
    p->end = s->next[nx] >= 0 ? s->next[nx] : m;
    p->key = pair_key(b, t, lim, s->sym[pos], s->sym[nx], (size_t)pos, (size_t)p->end);
    return 1;
}

/* The probed pair as a heap entry; 0 when it has no rank. */
static inline int pair_get(const tks_bpe *b, const char *t, const char *lim, const probe *p, hent *out) {
    uint64_t v = pair_rank(b, t, lim, p->key, (size_t)p->pos, (size_t)p->end);
    if (v == UINT64_MAX) return 0;
    *out = (hent){(uint32_t)(v >> 32), (uint32_t)p->pos, (uint32_t)(p->end - p->pos), (uint32_t)v};
    return 1;
}

/* BPE of the piece t[0..n) appended to the output, with a heap of candidate
 * pairs, stale ones skipped when popped (tokenizers' Word::merge_all). */
int tks__bpe_merge_heap(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    const char *lim = e->tend && e->tend >= t + n ? e->tend : t + n;
    if (n > INT32_MAX / 2)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "a pre-token of %zu bytes is over 1 GB", n);
    int rc = tks__bpe_grow_symbols(s, n);
    if (rc) return rc;
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = b->byte_id[(uint8_t)t[i]];
        if (id == TKS_NO_ID) continue;
        s->sym[m] = id;
        s->prev[m] = m - 1;
        s->next[m] = m + 1;
        m++;
    }
    if (!m) return 0;
    s->next[m - 1] = -1;
    /* m - 1 entries at first; a merge pops one and pushes at most two, and
     * there are at most m - 1 merges: the heap holds under 2 m entries */
    size_t nh = 0;
    hent h;
    /* the first pairs' lookups, PROBES ahead of their use */
    enum { PROBES = 8 };
    probe pr[PROBES];
    int32_t ahead = 0;
    for (; ahead < PROBES && ahead + 1 < m; ahead++) pair_probe(b, s, t, lim, m, ahead, &pr[ahead]);
    for (int32_t i = 0; i + 1 < m; i++) {
        probe cur = pr[i % PROBES];
        if (ahead + 1 < m) pair_probe(b, s, t, lim, m, ahead, &pr[ahead % PROBES]), ahead++;
        if (pair_get(b, t, lim, &cur, &h)) heap_push(s->heap, &nh, h);
    }
    while (nh) {
        hent top = heap_pop(s->heap, &nh);
        int32_t pos = (int32_t)top.pos, nx = s->next[pos];
        if (s->sym[pos] == TKS_NO_ID || nx < 0) continue;
        int32_t end = s->next[nx] >= 0 ? s->next[nx] : m;
        if ((uint32_t)(end - pos) != top.span) continue; /* stale: the pair has grown */
        s->sym[pos] = top.new_id;
        s->sym[nx] = TKS_NO_ID;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = pos;
        /* the entries of the pairs left and right of the merge are stale
         * now (their spans grew); their successors: */
        probe left = {0}, right = {0}; /* set when have_*: zeroed for the compiler */
        int have_left = s->prev[pos] >= 0 && pair_probe(b, s, t, lim, m, s->prev[pos], &left);
        int have_right = pair_probe(b, s, t, lim, m, pos, &right);
        if (have_left && pair_get(b, t, lim, &left, &h)) heap_push(s->heap, &nh, h);
        if (have_right && pair_get(b, t, lim, &right, &h)) heap_push(s->heap, &nh, h);
    }
    rc = tks__bpe_out_reserve(e, (size_t)m);
    for (int32_t i = 0; !rc && i >= 0; i = s->next[i]) e->out->ids[e->out->n++] = s->sym[i];
    return rc;
}

/* A pair of a small piece whose rank is to be looked up: pair_key's key
 * for the symbols at and after index i, their bytes t[s0 .. s1), computed
 * before the lookup itself, so that the lookups of a piece's pairs wait for
 * memory together. */
typedef struct spair {
    uint64_t key;
    uint32_t s0, s1;
} spair;

static inline void small_probe(const tks_bpe *b, const char *t, const char *lim, size_t n, const uint32_t *sym,
                               const uint8_t *start, int m, int i, spair *p) {
    p->s0 = start[i];
    p->s1 = i + 2 < m ? start[i + 2] : (uint32_t)n;
    p->key = pair_key(b, t, lim, sym[i], sym[i + 1], p->s0, p->s1);
}

static inline uint64_t small_rank(const tks_bpe *b, const char *t, const char *lim, const spair *p) {
    return pair_rank(b, t, lim, p->key, p->s0, p->s1);
}

/* BPE of a piece of at most SMALL_PIECE bytes, appended to the output: the
 * rule of tks__bpe_merge_ref (the lowest rank, the leftmost of equal ranks, merged
 * first), with each pair's rank kept in an array and only the two pairs a
 * merge changes looked up again. A pair's rank depends on its two symbols
 * alone, so the kept ranks are the ones ref_merge would look up. For
 * pieces this short a scan for the least rank costs less than tks__bpe_merge_heap's
 * heap and linked list; the result is the same (test_bpe compares the
 * encoder with the reference on every test document). */
int tks__bpe_merge_small(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    const char *lim = e->tend && e->tend >= t + n ? e->tend : t + n;
    uint32_t sym[SMALL_PIECE];
    uint8_t start[SMALL_PIECE];
    uint64_t rk[SMALL_PIECE];
    spair pr[SMALL_PIECE];
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = b->byte_id[(uint8_t)t[i]];
        if (id == TKS_NO_ID) continue;
        sym[m] = id;
        start[m++] = (uint8_t)i;
    }
    /* the first pairs are of one-byte tokens: their ranks from b->pair1,
     * those not known yet looked up (together) and remembered. With every
     * byte a token, symbol i is byte i. */
    if (b->pair1) {
        int k = 0;
        uint8_t miss[SMALL_PIECE];
        for (int i = 0; i + 1 < m; i++) {
            uint64_t v = __atomic_load_n(&b->pair1[(uint8_t)t[i] << 8 | (uint8_t)t[i + 1]], __ATOMIC_RELAXED);
            if (v) rk[i] = v - 2;
            else small_probe(b, t, lim, n, sym, start, m, i, &pr[k]), miss[k++] = (uint8_t)i;
        }
        for (int j = 0; j < k; j++) {
            int i = miss[j];
            rk[i] = small_rank(b, t, lim, &pr[j]);
            __atomic_store_n(&b->pair1[(uint8_t)t[i] << 8 | (uint8_t)t[i + 1]], rk[i] + 2, __ATOMIC_RELAXED);
        }
    } else {
        for (int i = 0; i + 1 < m; i++) small_probe(b, t, lim, n, sym, start, m, i, &pr[i]);
        for (int i = 0; i + 1 < m; i++) rk[i] = small_rank(b, t, lim, &pr[i]);
    }
    while (m > 1) {
        uint64_t best = rk[0];
        int at = 0;
        for (int i = 1; i + 1 < m; i++) { /* without branches: which pair wins is not predictable */
            int lt = rk[i] < best;
            best = lt ? rk[i] : best;
            at = lt ? i : at;
        }
        if (best == UINT64_MAX) break;
        sym[at] = (uint32_t)best;
        m--;
        for (int i = at + 1; i < m; i++) sym[i] = sym[i + 1], start[i] = start[i + 1], rk[i] = rk[i + 1];
        /* the pairs left and right of the merged symbol, looked up together */
        int right = at + 1 < m, left = at > 0;
        if (right) small_probe(b, t, lim, n, sym, start, m, at, &pr[0]);
        if (left) small_probe(b, t, lim, n, sym, start, m, at - 1, &pr[1]);
        if (right) rk[at] = small_rank(b, t, lim, &pr[0]);
        if (left) rk[at - 1] = small_rank(b, t, lim, &pr[1]);
    }
    int rc = tks__bpe_out_reserve(e, (size_t)m);
    if (!rc && m) memcpy(e->out->ids + e->out->n, sym, (size_t)m * sizeof *sym), e->out->n += (size_t)m;
    return rc;
}

/* The reference BPE of the piece t[0..n): after each merge every adjacent
 * pair is looked up again and the lowest rank, leftmost first, is merged
 * (tiktoken's byte_pair_merge; for merges, the rule tokenizers' heap
 * implements). O(n^2) in the piece, no heap, no cache: the plain statement
 * of the rule that the other engines and the caches must agree with. */
int tks__bpe_merge_ref(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    int rc = tks__bpe_grow_symbols(s, n);
    if (rc) return rc;
    uint32_t *sym = s->sym;
    int32_t *start = s->prev; /* rank mode: the byte each symbol starts at */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = b->byte_id[(uint8_t)t[i]];
        if (id == TKS_NO_ID) continue;
        sym[m] = id;
        start[m++] = (int32_t)i;
    }
    for (;;) {
        uint32_t best = UINT32_MAX, best_id = 0;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            uint32_t rank = UINT32_MAX, id = 0;
            if (b->mode == TKS__BPE_RANKS) {
                size_t end = i + 2 < m ? (size_t)start[i + 2] : n;
                id = rank = tks__bpe_vocab_find(b, t + start[i], end - (size_t)start[i]);
            } else {
                uint64_t key = ((uint64_t)sym[i] << 32 | sym[i + 1]) + 1;
                for (size_t k = tks__bpe_mix64(key) & b->mmask; b->mslot[k].key; k = (k + 1) & b->mmask)
                    if (b->mslot[k].key == key) {
                        rank = b->mslot[k].rank;
                        id = b->mslot[k].new_id;
                        break;
                    }
            }
            if (rank < best) best = rank, best_id = id, at = i;
        }
        if (best == UINT32_MAX) break;
        sym[at] = best_id;
        memmove(sym + at + 1, sym + at + 2, (m - at - 2) * sizeof *sym);
        memmove(start + at + 1, start + at + 2, (m - at - 2) * sizeof *start);
        m--;
    }
    rc = tks__bpe_out_reserve(e, m);
    if (!rc && m) memcpy(e->out->ids + e->out->n, sym, m * sizeof *sym), e->out->n += m;
    return rc;
}
