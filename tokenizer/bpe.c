/*
 * bpe.c - the byte-level BPE encoder and decoder over a handle loaded from a
 * Hugging Face tokenizer.json (bpe_load.c) or a tiktoken ranks file
 * (bpe_tiktoken.c). With a tokenizer.json it gives the ids of Hugging Face
 * `tokenizers` reading the same file (tokenizers 0.20: added tokens, then
 * the normalizer, then the pre-tokenizer, then the BPE model on each
 * pre-token; no post-processor: no special token is added); with a tiktoken
 * file, those of tiktoken's encode_ordinary (tiktoken 0.14, src/lib.rs).
 *
 * Pipeline of tks_bpe_encode:
 *   1. added tokens (tokenizers' AddedVocabulary::extract_and_normalize):
 *      the tokens with normalized false are found in the raw text, leftmost
 *      then longest, and cut out; each piece between them is normalized and
 *      the tokens with normalized true are found in it the same way. A
 *      special token found is cut out only with tks_bpe_set_allow_special;
 *      otherwise it stays text (and is counted), and, as in tokenizers (its
 *      automaton moves past every match it finds), no other token is looked
 *      for inside it;
 *   2. normalizer: none, or NFC (utf8proc, the Unicode data of the library);
 *   3. pre-tokenizer: a chain of regex splitters (each Split of a Sequence,
 *      then ByteLevel's own GPT-2 regex when use_regex is true; tiktoken's
 *      pattern keeps its matches and drops the text between them, as
 *      find_iter does), each applied to every piece of the one before,
 *      compiled by PCRE2 (UTF + UCP, JIT when available). A piece is cut into
 *      matches and the gaps between them and regrouped by the Split's
 *      behavior, as tokenizers' NormalizedString::split does;
 *   4. ByteLevel: every byte of a piece stands for one character of GPT-2's
 *      byte-to-unicode table (openai/gpt-2 encoder.py, bytes_to_unicode), so
 *      the vocabulary is kept as raw bytes and pieces are never re-encoded;
 *   5. BPE: a piece that is itself a token is that one id (tokenizers'
 *      ignore_merges; always for tiktoken); otherwise its bytes start as one
 *      symbol each (a byte with no token of its own is dropped, as tokenizers
 *      does with no unk_token) and the pair of lowest rank is merged, the
 *      leftmost first among equal ranks, until no pair has a rank. A pair's
 *      rank is its merge's line (tokenizer.json) or the rank of the token
 *      its bytes make (tiktoken's byte_pair_merge). Done with a binary heap
 *      of candidates, stale ones skipped when popped (tokenizers'
 *      Word::merge_all): O(n log n) in the piece's length.
 * A piece's ids depend on its bytes alone, so BPE runs once a word: a piece
 * that is a token is looked up in the vocabulary (with merges, the token is
 * taken whole once BPE of its bytes is known to give it: a per-token memo),
 * and each thread keeps a word cache of the other pieces of up to 24 bytes.
 *
 * Thread safety: a loaded handle is immutable apart from per-thread scratch
 * (PCRE2 match data, JIT stack, symbol and heap arrays, the word cache)
 * created on a thread's first encode and owned by the handle, and the
 * per-token memo, which every thread fills with the same values through
 * relaxed atomics.
 */
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <utf8proc.h>
/* XXH3 inlined: a piece's hash is taken a few times per piece, a call into
 * libxxhash each time cost 6% of a build */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/heap.h"

/* ---- vocabulary lookups (the hash of the mergeable tokens) ---------------- */

uint64_t tks__bpe_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

uint64_t tks__bpe_hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

uint32_t tks__bpe_vocab_find_h(const tks_bpe *b, const char *s, size_t n, uint64_t h) {
    uint64_t head = tks__bpe_head8(s, n);
    for (size_t i = h & b->vmask;; i = (i + 1) & b->vmask) {
        const tks__bpe_vslot *v = &b->vslot[i];
        if (v->id == TKS_NO_ID) return TKS_NO_ID;
        if (v->len == n && v->head == head && (n <= 8 || !memcmp(b->bytes + b->off[v->id] + 8, s + 8, n - 8)))
            return v->id;
    }
}

uint32_t tks__bpe_vocab_find(const tks_bpe *b, const char *s, size_t n) {
    return tks__bpe_vocab_find_h(b, s, n, XXH3_64bits(s, n));
}

/* The word cache: per thread, 2-way set associative, one 64-byte line a
 * piece of up to 24 bytes with up to 9 ids, the piece's bytes in the line
 * (a hit reads one cache line: with the bytes elsewhere, the second load
 * missed as often as the first). CACHE_SETS x 2 lines: 8 MiB a thread. */
#define CACHE_KEY 24
#define CACHE_IDS 9
#define CACHE_SETS (1u << 16)
#define CACHE_BYTES (2 * (size_t)CACHE_SETS * 64)

/* The long-piece cache: per thread, direct-mapped, LCACHE entries, for the
 * pieces of up to LCACHE_MAX bytes the word cache cannot hold (over
 * CACHE_KEY bytes, or over CACHE_IDS ids): the underlines and indentation
 * runs of reStructuredText, long words of scripts the vocabulary knows
 * little of. An entry owns a copy of its piece's bytes and ids, so a hit is
 * checked byte for byte. */
#define LCACHE (1u << 12)
#define LCACHE_MAX 256

/* ---------------------------------------------------------------------------
 * Per-thread scratch
 * ------------------------------------------------------------------------- */
typedef struct hent {
    uint32_t rank, pos; /* the candidate pair starts at symbol pos */
    uint32_t span;      /* how many initial symbols the pair covers: a popped entry is current
                         * only while its pair still covers as many (a merge at pos or at its
                         * right neighbour makes the pair longer) */
    uint32_t new_id;
} hent;

typedef struct lent {
    uint64_t h;           /* the piece's hash (ckey) */
    uint32_t len, n_ids;
    char *blob;           /* len bytes, then n_ids ids (uint32_t); NULL: empty */
} lent;

typedef struct cline {
    uint64_t key[CACHE_KEY / 8]; /* the piece's bytes, zero after its end */
    uint32_t ids[CACHE_IDS];
    uint8_t len, n_ids;          /* len 0: empty */
    uint8_t pad[2];
} cline;

struct tks__bpe_scratch {
    tks__bpe_scratch *next_all; /* the handle's list */
    int in_use;                 /* owned by a live thread */
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    uint32_t *sym;              /* a piece's symbols: id, or TKS_NO_ID once merged away */
    int32_t *prev, *next;       /* their neighbours, -1 at the ends */
    size_t sym_cap;             /* elements */
    hent *heap;
    cline *cache;               /* CACHE_SETS x 2, or NULL before the first use */
    lent *lcache;               /* LCACHE, allocated with cache */
    tks_encoder_stats st;
};

typedef tks__bpe_scratch scratch;

static void scratch_destroy(scratch *s) {
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    if (s->cache) munmap(s->cache, CACHE_BYTES);
    for (size_t i = 0; s->lcache && i < LCACHE; i++) free(s->lcache[i].blob);
    free(s->lcache);
    free(s);
}

static void scratch_release(void *p) {
    scratch *s = p;
    /* the thread is gone: the scratch stays with the handle for another thread */
    __atomic_store_n(&s->in_use, 0, __ATOMIC_RELEASE);
}

int tks__bpe_scratch_init(tks_bpe *b) {
    if (pthread_key_create(&b->key, scratch_release))
        return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "no thread-specific key left (pthread_key_create)");
    pthread_mutex_init(&b->mu, NULL);
    b->have_key = 1;
    return 0;
}

static scratch *scratch_new(void) {
    /* cache lines of its own: the counters in `st` change at every piece,
     * and a neighbouring thread's scratch on the same line would bounce it */
    size_t sz = (sizeof(scratch) + 127) & ~(size_t)127;
    scratch *s = aligned_alloc(128, sz);
    if (!s) return NULL;
    memset(s, 0, sz);
    s->md = pcre2_match_data_create(16, NULL);
    s->mc = pcre2_match_context_create(NULL);
    /* the JIT's backtracking stack grows up to 64 MiB (a long run of the
     * same class); the match limit is set per piece (split_level) */
    s->js = pcre2_jit_stack_create(32 << 10, 64 << 20, NULL);
    if (!s->md || !s->mc || !s->js) {
        scratch_destroy(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mc, NULL, s->js);
    pcre2_set_match_limit(s->mc, UINT32_MAX);
    pcre2_set_depth_limit(s->mc, UINT32_MAX);
    pcre2_set_heap_limit(s->mc, UINT32_MAX);
    return s;
}

static scratch *get_scratch(tks_bpe *b) {
    scratch *s = pthread_getspecific(b->key);
    if (s) return s;
    pthread_mutex_lock(&b->mu);
    for (s = b->all; s; s = s->next_all)
        if (!__atomic_load_n(&s->in_use, __ATOMIC_ACQUIRE)) break;
    if (!s && (s = scratch_new())) {
        s->next_all = b->all;
        b->all = s;
    }
    if (s) {
        s->in_use = 1;
        if (pthread_setspecific(b->key, s)) s->in_use = 0, s = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    return s;
}

/* ---------------------------------------------------------------------------
 * The word cache
 * ------------------------------------------------------------------------- */
/* The piece t[0..n) (n <= CACHE_KEY) zero-padded into key. */
static void cache_key(const char *t, size_t n, uint64_t key[CACHE_KEY / 8]) {
    for (size_t w = 0; w < CACHE_KEY / 8; w++) key[w] = n > 8 * w ? tks__bpe_head8(t + 8 * w, n - 8 * w) : 0;
}

static const cline *cache_get(const scratch *s, size_t set, const uint64_t key[CACHE_KEY / 8], size_t n) {
    const cline *l = &s->cache[2 * set];
    for (int w = 0; w < 2; w++, l++)
        if (l->len == n && l->key[0] == key[0] && l->key[1] == key[1] && l->key[2] == key[2]) return l;
    return NULL;
}

/* Caches the piece with ids[0..k) (k <= CACHE_IDS) as the set's first line,
 * the first moving to the second (the older of the two goes). */
static void cache_put(scratch *s, size_t set, const uint64_t key[CACHE_KEY / 8], size_t n, const uint32_t *ids,
                      size_t k) {
    cline *l = &s->cache[2 * set];
    l[1] = l[0];
    memcpy(l->key, key, CACHE_KEY);
    if (k) memcpy(l->ids, ids, k * sizeof *ids); /* an empty piece passes no ids */
    l->len = (uint8_t)n;
    l->n_ids = (uint8_t)k;
}

static const lent *lcache_get(const scratch *s, uint64_t h, const char *t, size_t n) {
    const lent *l = &s->lcache[(h >> 20) & (LCACHE - 1)];
    return l->blob && l->h == h && l->len == n && !memcmp(l->blob, t, n) ? l : NULL;
}

/* Caches the piece t[0..n) with ids[0..k) in its entry (the entry's
 * previous piece goes); out of memory leaves the entry empty. */
static void lcache_put(scratch *s, uint64_t h, const char *t, size_t n, const uint32_t *ids, size_t k) {
    lent *l = &s->lcache[(h >> 20) & (LCACHE - 1)];
    char *p = realloc(l->blob, n + k * sizeof *ids);
    if (!p) {
        free(l->blob);
        *l = (lent){0, 0, 0, NULL};
        return;
    }
    memcpy(p, t, n);
    if (k) memcpy(p + n, ids, k * sizeof *ids);
    *l = (lent){h, (uint32_t)n, (uint32_t)k, p};
}

/* ---------------------------------------------------------------------------
 * BPE on one pre-token
 * ------------------------------------------------------------------------- */
typedef struct enc {
    const tks_bpe *b;
    scratch *s;
    tks_ids *out;
    int ref;    /* the reference path: no cache, the plain merge loop */
} enc;

static int out_reserve(enc *e, size_t k) {
    tks_ids *o = e->out;
    if (o->n + k <= o->cap) return 0;
    size_t cap = o->cap ? 2 * o->cap : 256;
    while (cap < o->n + k) cap *= 2;
    if (tks_resize(&o->ids, cap, sizeof *o->ids))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory growing the id buffer");
    o->cap = cap;
    return 0;
}

static int push_id(enc *e, uint32_t id) {
    int rc = out_reserve(e, 1);
    if (!rc) e->out->ids[e->out->n++] = id;
    return rc;
}

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
 * (merges: (l << 32 | r) + 1; ranks: the hash of the bytes), its slot
 * fetched now for pair_rank later. */
static inline uint64_t pair_key(const tks_bpe *b, const char *t, uint32_t l, uint32_t r, size_t s0, size_t s1) {
    uint64_t key;
    if (b->mode == TKS__BPE_RANKS) {
        key = XXH3_64bits(t + s0, s1 - s0);
        __builtin_prefetch(&b->vslot[key & b->vmask]);
    } else {
        key = ((uint64_t)l << 32 | r) + 1;
        __builtin_prefetch(&b->mslot[tks__bpe_mix64(key) & b->mmask]);
    }
    return key;
}

/* The pair of pair_key's key: rank << 32 | new id (in rank mode both are
 * the token's id of t[s0 .. s1)); UINT64_MAX when it merges into nothing. */
static inline uint64_t pair_rank(const tks_bpe *b, const char *t, uint64_t key, size_t s0, size_t s1) {
    if (b->mode == TKS__BPE_RANKS) {
        uint32_t id = tks__bpe_vocab_find_h(b, t + s0, s1 - s0, key);
        return id == TKS_NO_ID ? UINT64_MAX : (uint64_t)id << 32 | id;
    }
    for (size_t i = tks__bpe_mix64(key) & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mslot[i].key == key) return (uint64_t)b->mslot[i].rank << 32 | b->mslot[i].new_id;
        if (!b->mslot[i].key) return UINT64_MAX;
    }
}

/* 0 when pos has no right neighbour. `t` is the piece: in rank mode every
 * byte is a symbol, so positions are byte offsets and the pair's bytes are
 * t[pos .. end). */
static inline int pair_probe(const tks_bpe *b, const scratch *s, const char *t, int32_t m, int32_t pos, probe *p) {
    int32_t nx = s->next[pos];
    if (nx < 0) return 0;
    p->pos = pos;
    p->end = s->next[nx] >= 0 ? s->next[nx] : m;
    p->key = pair_key(b, t, s->sym[pos], s->sym[nx], (size_t)pos, (size_t)p->end);
    return 1;
}

/* The probed pair as a heap entry; 0 when it has no rank. */
static inline int pair_get(const tks_bpe *b, const char *t, const probe *p, hent *out) {
    uint64_t v = pair_rank(b, t, p->key, (size_t)p->pos, (size_t)p->end);
    if (v == UINT64_MAX) return 0;
    *out = (hent){(uint32_t)(v >> 32), (uint32_t)p->pos, (uint32_t)(p->end - p->pos), (uint32_t)v};
    return 1;
}

static int grow_symbols(scratch *s, size_t n) {
    if (n <= s->sym_cap) return 0;
    size_t cap = n < 256 ? 256 : n;
    if (tks_resize(&s->sym, cap, sizeof *s->sym) || tks_resize(&s->prev, cap, sizeof *s->prev) ||
        tks_resize(&s->next, cap, sizeof *s->next) || tks_resize(&s->heap, 2 * cap, sizeof *s->heap))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for a %zu-byte pre-token", n);
    s->sym_cap = cap;
    return 0;
}

/* BPE of the piece t[0..n) appended to the output. */
static int bpe_merge(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    if (n > INT32_MAX / 2)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "a pre-token of %zu bytes is over 1 GB", n);
    int rc = grow_symbols(s, n);
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
    for (; ahead < PROBES && ahead + 1 < m; ahead++) pair_probe(b, s, t, m, ahead, &pr[ahead]);
    for (int32_t i = 0; i + 1 < m; i++) {
        probe cur = pr[i % PROBES];
        if (ahead + 1 < m) pair_probe(b, s, t, m, ahead, &pr[ahead % PROBES]), ahead++;
        if (pair_get(b, t, &cur, &h)) heap_push(s->heap, &nh, h);
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
        int have_left = s->prev[pos] >= 0 && pair_probe(b, s, t, m, s->prev[pos], &left);
        int have_right = pair_probe(b, s, t, m, pos, &right);
        if (have_left && pair_get(b, t, &left, &h)) heap_push(s->heap, &nh, h);
        if (have_right && pair_get(b, t, &right, &h)) heap_push(s->heap, &nh, h);
    }
    rc = out_reserve(e, (size_t)m);
    for (int32_t i = 0; !rc && i >= 0; i = s->next[i]) e->out->ids[e->out->n++] = s->sym[i];
    return rc;
}

/* Pieces up to this many bytes are merged in flat arrays on the stack
 * (small_merge); longer ones through bpe_merge's heap. */
#define SMALL_PIECE 48

/* A pair of a small piece whose rank is to be looked up: pair_key's key
 * for the symbols at and after index i, their bytes t[s0 .. s1), computed
 * before the lookup itself, so that the lookups of a piece's pairs wait for
 * memory together. */
typedef struct spair {
    uint64_t key;
    uint32_t s0, s1;
} spair;

static inline void small_probe(const tks_bpe *b, const char *t, size_t n, const uint32_t *sym,
                               const uint8_t *start, int m, int i, spair *p) {
    p->s0 = start[i];
    p->s1 = i + 2 < m ? start[i + 2] : (uint32_t)n;
    p->key = pair_key(b, t, sym[i], sym[i + 1], p->s0, p->s1);
}

static inline uint64_t small_rank(const tks_bpe *b, const char *t, const spair *p) {
    return pair_rank(b, t, p->key, p->s0, p->s1);
}

/* BPE of a piece of at most SMALL_PIECE bytes, appended to the output: the
 * rule of ref_merge (the lowest rank, the leftmost of equal ranks, merged
 * first), with each pair's rank kept in an array and only the two pairs a
 * merge changes looked up again. A pair's rank depends on its two symbols
 * alone, so the kept ranks are the ones ref_merge would look up. For
 * pieces this short a scan for the least rank costs less than bpe_merge's
 * heap and linked list; the result is the same (test_bpe compares the
 * encoder with the reference on every test document). */
static int small_merge(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
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
            else small_probe(b, t, n, sym, start, m, i, &pr[k]), miss[k++] = (uint8_t)i;
        }
        for (int j = 0; j < k; j++) {
            int i = miss[j];
            rk[i] = small_rank(b, t, &pr[j]);
            __atomic_store_n(&b->pair1[(uint8_t)t[i] << 8 | (uint8_t)t[i + 1]], rk[i] + 2, __ATOMIC_RELAXED);
        }
    } else {
        for (int i = 0; i + 1 < m; i++) small_probe(b, t, n, sym, start, m, i, &pr[i]);
        for (int i = 0; i + 1 < m; i++) rk[i] = small_rank(b, t, &pr[i]);
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
        if (right) small_probe(b, t, n, sym, start, m, at, &pr[0]);
        if (left) small_probe(b, t, n, sym, start, m, at - 1, &pr[1]);
        if (right) rk[at] = small_rank(b, t, &pr[0]);
        if (left) rk[at - 1] = small_rank(b, t, &pr[1]);
    }
    int rc = out_reserve(e, (size_t)m);
    if (!rc && m) memcpy(e->out->ids + e->out->n, sym, (size_t)m * sizeof *sym), e->out->n += (size_t)m;
    return rc;
}

/* Pieces up to this many bytes go through the reference's plain loop;
 * longer ones (O(n^2) would take minutes) through bpe_merge. */
#define REF_MAX_PIECE 65536

/* The reference BPE of the piece t[0..n): after each merge every adjacent
 * pair is looked up again and the lowest rank, leftmost first, is merged
 * (tiktoken's byte_pair_merge; for merges, the rule tokenizers' heap
 * implements). O(n^2) in the piece, no heap, no cache: the plain statement
 * of the rule that bpe_merge and the cache must agree with. */
static int ref_merge(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    int rc = grow_symbols(s, n);
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
    rc = out_reserve(e, m);
    if (!rc && m) memcpy(e->out->ids + e->out->n, sym, m * sizeof *sym), e->out->n += m;
    return rc;
}

/* A piece's hash, computed ahead so that its vocab slot can be fetched
 * while the piece before it is encoded. */
typedef struct ckey {
    uint64_t h;
} ckey;

static int cache_on(enc *e) {
    scratch *s = e->s;
    if (!e->b->word_cache || e->ref) return 0;
    if (!s->cache) {
        _Static_assert(sizeof(cline) == 64, "a word-cache line is one 64-byte cache line");
        /* mapped rather than malloc'd: the kernel's pages come zeroed (no
         * second pass over 8 MiB), page-aligned (no line straddles two cache
         * lines) */
        void *p = mmap(NULL, CACHE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the word cache");
        s->cache = p;
        /* on 2 MiB pages where the kernel allows it: lookups at random over
         * 8 MiB that do not miss the TLB (advice only) */
        madvise(p, CACHE_BYTES, MADV_HUGEPAGE);
        /* every page written first, not read: a page of zeros that is read
         * first maps the shared zero page, and its first write then flushes
         * the TLB of every thread of the process (an interrupt each), 5% of a
         * build on 2 threads */
        for (size_t o = 0; o < CACHE_BYTES; o += 4096) ((volatile char *)p)[o] = 0;
        if (!(s->lcache = calloc(LCACHE, sizeof *s->lcache))) {
            munmap(p, CACHE_BYTES);
            s->cache = NULL;
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the word cache");
        }
    }
    return 1;
}

static void cache_lookup_key(enc *e, const char *t, size_t n, ckey *k) {
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

static int bpe_piece_k(enc *e, const char *t, size_t n, const ckey *k);

/* One pre-token (raw bytes) through the vocab, the cache and the BPE model. */
static int bpe_piece(enc *e, const char *t, size_t n) {
    ckey k = {0};
    int rc = e->ref ? 0 : cache_on(e);
    if (rc < 0) return rc;
    if (!e->ref) cache_lookup_key(e, t, n, &k);
    return bpe_piece_k(e, t, n, &k);
}

static int bpe_piece_k(enc *e, const char *t, size_t n, const ckey *k) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    if (e->ref) {
        uint32_t id = b->ignore_merges ? tks__bpe_vocab_find(b, t, n) : TKS_NO_ID;
        return id != TKS_NO_ID ? push_id(e, id) : n <= REF_MAX_PIECE ? ref_merge(e, t, n) : bpe_merge(e, t, n);
    }
    s->st.words++;
    s->st.bytes += n;
    /* a piece that is a token: that token (ignore_merges), or, with merges,
     * when BPE of the token's bytes is known to give it */
    uint32_t id = tks__bpe_vocab_find_h(b, t, n, k->h);
    if (id != TKS_NO_ID && (b->ignore_merges || __atomic_load_n(&b->self[id], __ATOMIC_RELAXED) == 1)) {
        s->st.word_hits++;
        s->st.hit_bytes += n;
        return push_id(e, id);
    }
    int cache = b->word_cache && n <= CACHE_KEY;
    uint64_t key[CACHE_KEY / 8];
    size_t set = (size_t)(k->h >> 32) & (CACHE_SETS - 1);
    if (cache) {
        cache_key(t, n, key);
        const cline *l = cache_get(s, set, key, n);
        if (l) {
            s->st.word_hits++;
            s->st.hit_bytes += n;
            if (!l->n_ids) return 0; /* a piece whose bytes have no token gives no id */
            int rc = out_reserve(e, l->n_ids);
            if (rc) return rc;
            memcpy(e->out->ids + e->out->n, l->ids, l->n_ids * sizeof(uint32_t));
            e->out->n += l->n_ids;
            return 0;
        }
    }
    int lcache = b->word_cache && n > 0 && n <= LCACHE_MAX && s->lcache;
    if (lcache) {
        const lent *l = lcache_get(s, k->h, t, n);
        if (l) {
            s->st.word_hits++;
            s->st.hit_bytes += n;
            int rc = out_reserve(e, l->n_ids);
            if (rc) return rc;
            if (l->n_ids) memcpy(e->out->ids + e->out->n, l->blob + n, l->n_ids * sizeof(uint32_t));
            e->out->n += l->n_ids;
            return 0;
        }
    }
    size_t first = e->out->n;
    int rc = n <= SMALL_PIECE ? small_merge(e, t, n) : bpe_merge(e, t, n);
    if (!rc && id != TKS_NO_ID)
        __atomic_store_n(&b->self[id], (uint8_t)(e->out->n - first == 1 && e->out->ids[first] == id ? 1 : 2),
                         __ATOMIC_RELAXED);
    /* a piece of bytes without a token gives no id (and out->ids may be NULL) */
    if (!rc && cache && e->out->n - first <= CACHE_IDS)
        cache_put(s, set, key, n, e->out->n > first ? e->out->ids + first : NULL, e->out->n - first);
    else if (!rc && lcache)
        lcache_put(s, k->h, t, n, e->out->n > first ? e->out->ids + first : NULL, e->out->n - first);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Pre-tokenizer
 * ------------------------------------------------------------------------- */
static int split_level(enc *e, int lv, const char *t, size_t n);

/* The pieces a splitter gives, regrouped by its behavior: the state of
 * tokenizers' NormalizedString::split folds, run forwards. */
typedef struct regroup {
    size_t ps, pe;   /* the pending piece */
    int have;        /* there is one */
    int prev_match;  /* the previous segment was a match */
} regroup;

static int segment(enc *e, int lv, const char *t, tks__bpe_behavior how, regroup *g, size_t ss, size_t se, int m) {
    int rc = 0;
    switch (how) {
    case B_ISOLATED:
        return split_level(e, lv + 1, t + ss, se - ss);
    case B_REMOVED:
        return m ? 0 : split_level(e, lv + 1, t + ss, se - ss);
    case B_CONTIGUOUS:
    case B_MERGED_PREV:
        if (g->have && (how == B_CONTIGUOUS ? m == g->prev_match : m && !g->prev_match)) {
            g->pe = se;
        } else {
            if (g->have) rc = split_level(e, lv + 1, t + g->ps, g->pe - g->ps);
            g->ps = ss, g->pe = se, g->have = 1;
        }
        g->prev_match = m;
        return rc;
    case B_MERGED_NEXT:
        /* a match joins the gap after it */
        if (g->have) {
            g->have = 0;
            if (!m) return split_level(e, lv + 1, t + g->ps, se - g->ps);
            if ((rc = split_level(e, lv + 1, t + g->ps, g->pe - g->ps))) return rc;
        }
        if (m) {
            g->ps = ss, g->pe = se, g->have = 1;
            return 0;
        }
        return split_level(e, lv + 1, t + ss, se - ss);
    }
    return 0;
}

static int split_level(enc *e, int lv, const char *t, size_t n) {
    if (!n) return 0;
    const tks_bpe *b = e->b;
    if (lv == b->n_split) return bpe_piece(e, t, n);
    if (b->fast && !e->ref && tks__bpe_fast_bmp(t, n)) {
        /* the hand matcher: pieces tile the text, each is kept; each piece's
         * vocabulary slot and word-cache set are fetched while the one
         * before it is encoded (fetching two or three ahead measured no
         * better) */
        int on = cache_on(e);
        if (on < 0) return on;
        ckey k[2] = {{0}, {0}};
        size_t i = 0, j = tks__bpe_fast_next(b->fast, t, n, 0);
        cache_lookup_key(e, t, j, &k[0]);
        int rc = 0, c = 0;
        while (!rc && i < n) {
            size_t m = j < n ? tks__bpe_fast_next(b->fast, t, n, j) : n;
            if (m > j) cache_lookup_key(e, t + j, m - j, &k[c ^ 1]);
            rc = bpe_piece_k(e, t + i, j - i, &k[c]);
            c ^= 1;
            i = j;
            j = m;
        }
        return rc;
    }
    const tks__bpe_splitter *sp = &b->split[lv];
    regroup g = {0, 0, 0, 0};
    size_t pos = 0;
    int rc = 0;
    /* PCRE2's match limit, per piece: 10^6 steps plus 256 a byte. A pattern
     * that matches in linear time (every named pattern, every tokenizer.json
     * of the field's models) takes a few steps a byte; one that backtracks
     * catastrophically, (a+)+b on 30 a's say, needs 2^30 and stops with an
     * error naming it instead of running for minutes (Hugging Face
     * tokenizers' Oniguruma gives up too). */
    uint64_t lim = 1000000 + 256 * (uint64_t)n;
    pcre2_set_match_limit(e->s->mc, lim > UINT32_MAX ? UINT32_MAX : (uint32_t)lim);
    while (pos < n && !rc) {
        int mr = pcre2_match(sp->re, (PCRE2_SPTR)t, n, pos, PCRE2_NO_UTF_CHECK, e->s->md, e->s->mc);
        size_t ms = n, me = n;
        if (mr >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->s->md);
            ms = ov[0], me = ov[1];
        } else if (mr == PCRE2_ERROR_MATCHLIMIT) {
            return tks_fail(TKS_ERR_TOKENIZER, b->path, TKS_NONE, TKS_NONE,
                            "the pre-tokenizer regex /%s/ backtracks without bound on a %zu-byte piece (PCRE2's "
                            "match limit of %llu steps reached at byte %zu of it): fix the pattern in %s (make "
                            "the nested repetition possessive or atomic)",
                            sp->text, n, (unsigned long long)lim, pos, b->path);
        } else if (mr != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(mr, msg, sizeof msg);
            return tks_fail(mr == PCRE2_ERROR_NOMEMORY || mr == PCRE2_ERROR_JIT_STACKLIMIT ? TKS_ERR_NOMEM
                                                                                           : TKS_ERR_TOKENIZER,
                            b->path, TKS_NONE, TKS_NONE, "the pre-tokenizer regex failed on a %zu-byte piece: %s",
                            n, (const char *)msg);
        }
        if (ms > pos) rc = segment(e, lv, t, sp->how, &g, pos, ms, sp->invert);
        if (!rc && me > ms) rc = segment(e, lv, t, sp->how, &g, ms, me, !sp->invert);
        pos = me;
    }
    if (!rc && g.have) rc = split_level(e, lv + 1, t + g.ps, g.pe - g.ps);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Added tokens and normalization
 * ------------------------------------------------------------------------- */
/* The first token of set `as` found in t[pos..n), leftmost then longest:
 * 1 with its start in *at, else 0. */
static int added_next(const tks_bpe *b, const tks__bpe_added_set *as, const char *t, size_t n, size_t pos,
                      size_t *at, const tks__bpe_added **tok) {
    for (size_t i = pos; i < n; i++) {
        if (as->one_first >= 0) {
            const char *p = memchr(t + i, as->one_first, n - i);
            if (!p) return 0;
            i = (size_t)(p - t);
        }
        unsigned c = (unsigned char)t[i];
        for (uint32_t k = as->first[c]; k < as->first[c + 1]; k++) {
            const tks__bpe_added *a = &as->tok[k];
            if (a->len <= n - i && !memcmp(b->added_text + a->off, t + i, a->len)) {
                *at = i;
                *tok = a;
                return 1;
            }
        }
    }
    return 0;
}

static int normalized_piece(enc *e, const char *t, size_t n);

/* Text between added tokens: pass 0 (raw text) normalizes it and looks
 * for the normalized tokens (pass 1), whose gaps are pre-tokenized. */
static int added_gap(enc *e, int pass, const char *t, size_t n) {
    if (!n) return 0;
    return pass == 0 ? normalized_piece(e, t, n) : split_level(e, 0, t, n);
}

static int added_pass(enc *e, int pass, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    const tks__bpe_added_set *as = pass == 0 ? &b->added_raw : &b->added_norm;
    if (!as->n) return added_gap(e, pass, t, n);
    size_t gap = 0, pos = 0, at;
    const tks__bpe_added *a;
    int rc = 0;
    while (!rc && pos < n && added_next(b, as, t, n, pos, &at, &a)) {
        pos = at + a->len;
        if (a->special && !b->allow_special) {
            e->s->st.special_in_text++;
            continue;
        }
        if (a->special) e->s->st.special_matched++;
        rc = added_gap(e, pass, t + gap, at - gap);
        if (!rc) rc = push_id(e, a->id);
        gap = pos;
    }
    if (!rc) rc = added_gap(e, pass, t + gap, n - gap);
    return rc;
}

static int normalized_piece(enc *e, const char *t, size_t n) {
    if (!e->b->nfc) return added_pass(e, 1, t, n);
    size_t i = 0;
    while (i < n && !((uint8_t)t[i] & 0x80)) i++;
    if (i == n) return added_pass(e, 1, t, n); /* ASCII is its own NFC */
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)t, (utf8proc_ssize_t)n, &norm,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0)
        return tks_fail(r == UTF8PROC_ERROR_NOMEM ? TKS_ERR_NOMEM : TKS_ERR_TOKENIZER, NULL, TKS_NONE, TKS_NONE,
                        "NFC normalization failed: %s", utf8proc_errmsg(r));
    int rc = added_pass(e, 1, (const char *)norm, (size_t)r);
    free(norm);
    return rc;
}

/* Offset of the first byte that is not valid UTF-8 (as Rust's str: no
 * surrogates, no overlong forms, nothing above U+10FFFF), or len; and, in
 * the same pass, how many code points before it the regex engine's Unicode
 * leaves unassigned (*unassigned; tks__bpe_unassigned_table). */
static size_t utf8_invalid_at(const uint8_t *s, size_t len, size_t *unassigned) {
    size_t i = 0;
    uint8_t *cn = NULL;
    *unassigned = 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return i;
        if (i + k >= len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        if (cn || (cn = tks__bpe_unassigned_table())) {
            uint32_t cp = c & (0x7F >> (k + 1));
            for (size_t j = 1; j <= k; j++) cp = cp << 6 | (s[i + j] & 0x3F);
            int v = __atomic_load_n(&cn[cp], __ATOMIC_RELAXED);
            if (!v) v = tks__bpe_unassigned_learn(cp, (const char *)s + i, k + 1);
            *unassigned += v == 2;
        }
        i += k + 1;
    }
    return len;
}

/* part: 1 when text is a part of a document (tks_bpe_encode_part): the
 * document is not counted into unassigned_docs here, and the code points
 * the regex engine leaves unassigned are returned in *unassigned. */
static int encode(const tks_bpe *b, const char *text, size_t len, tks_ids *out, int ref, int part,
                  uint64_t *unassigned) {
    if (!b || !out || (!text && len))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_encode: NULL argument");
    out->n = 0;
    size_t un, bad = utf8_invalid_at((const uint8_t *)text, len, &un);
    if (bad < len)
        return tks_fail(TKS_ERR_UTF8, NULL, TKS_NONE, (uint64_t)bad,
                        "the text is not valid UTF-8 at byte %zu (clean it first: --invalid-utf8)", bad);
    enc e = {b, get_scratch((tks_bpe *)b), out, ref};
    if (!e.s) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the encoder's scratch");
    e.s->st.unassigned += un;
    if (!part) e.s->st.unassigned_docs += un > 0;
    if (unassigned) *unassigned = un;
    int rc = len ? added_pass(&e, 0, text, len) : 0;
    if (rc) out->n = 0;
    return rc;
}

int tks_bpe_encode(const tks_bpe *b, const char *text, size_t len, tks_ids *out) {
    return encode(b, text, len, out, 0, 0, NULL);
}

int tks_bpe_encode_ref(const tks_bpe *b, const char *text, size_t len, tks_ids *out) {
    return encode(b, text, len, out, 1, 0, NULL);
}

int tks_bpe_encode_part(const tks_bpe *b, const char *text, size_t len, tks_ids *out, uint64_t *unassigned) {
    if (unassigned) *unassigned = 0;
    return encode(b, text, len, out, 0, 1, unassigned);
}

void tks_bpe_count_doc(const tks_bpe *b, uint64_t unassigned, size_t parts) {
    scratch *s = b ? get_scratch((tks_bpe *)b) : NULL;
    if (!s) return;
    s->st.unassigned_docs += unassigned > 0;
    s->st.cut_docs++;
    s->st.cut_parts += parts;
}

/* ---------------------------------------------------------------------------
 * Where a long document may be cut (tks_bpe_next_cut, tokenizer.h)
 * ------------------------------------------------------------------------- */
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

/* ---------------------------------------------------------------------------
 * Decoding, accessors, free
 * ------------------------------------------------------------------------- */
int tks_bpe_decode(const tks_bpe *b, const uint32_t *ids, size_t n, char **text, size_t *len) {
    if (!b || !text || (!ids && n))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_decode: NULL argument");
    *text = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= b->n_ids || (b->hole && b->hole[ids[i]]))
            return tks_fail(TKS_ERR_TOKEN_RANGE, b->path, TKS_NONE, (uint64_t)i,
                            ids[i] >= b->n_ids ? "id %u at position %zu is not below the vocabulary size %u"
                                               : "id %u at position %zu is no token of the tokenizer (a gap "
                                                 "below its vocabulary size %u)",
                            ids[i], i, b->n_ids);
        total += b->off[ids[i] + 1] - b->off[ids[i]];
    }
    char *t = malloc(total + 1);
    if (!t) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory decoding %zu ids", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = b->off[ids[i] + 1] - b->off[ids[i]];
        memcpy(t + m, b->bytes + b->off[ids[i]], k);
        m += k;
    }
    t[m] = 0;
    *text = t;
    if (len) *len = m;
    return 0;
}

uint32_t tks_bpe_vocab_size(const tks_bpe *b) { return b->n_ids; }

int tks_bpe_from_cache(const tks_bpe *b) { return b->cache_map != NULL; }

const uint8_t *tks_bpe_fingerprint(const tks_bpe *b) { return b->fingerprint; }

int tks_bpe_is_special(const tks_bpe *b, uint32_t id) { return id < b->n_ids && b->special[id]; }

int tks_bpe_is_token(const tks_bpe *b, uint32_t id) { return id < b->n_ids && !(b->hole && b->hole[id]); }

const char *tks_bpe_token_bytes(const tks_bpe *b, uint32_t id, size_t *len) {
    if (!tks_bpe_is_token(b, id)) return NULL;
    if (len) *len = b->off[id + 1] - b->off[id];
    return b->bytes + b->off[id];
}

int tks_bpe_set_allow_special(tks_bpe *b, int on) {
    const tks__bpe_added_set *sets[] = {&b->added_raw, &b->added_norm};
    for (int k = 0; on && k < 2; k++)
        for (size_t i = 0; i < sets[k]->n; i++) {
            const tks__bpe_added *a = &sets[k]->tok[i];
            if (a->special && a->unsupported)
                return tks_fail(TKS_ERR_TOKENIZER, b->path, TKS_NONE, TKS_NONE,
                                "%s: special token %u \"%.*s\" sets lstrip, rstrip or single_word, which tokshard "
                                "does not reproduce: --allow-special-in-text is refused for this tokenizer",
                                b->path, a->id, (int)(a->len > 60 ? 60 : a->len), b->added_text + a->off);
        }
    b->allow_special = on != 0;
    return 0;
}

void tks_bpe_set_word_cache(tks_bpe *b, int on) { b->word_cache = on != 0; }

void tks_bpe_encoder_stats(const tks_bpe *cb, tks_encoder_stats *st) {
    tks_bpe *b = (tks_bpe *)cb;
    memset(st, 0, sizeof *st);
    if (!b->have_key) return;
    pthread_mutex_lock(&b->mu);
    for (scratch *s = b->all; s; s = s->next_all) {
        st->words += s->st.words;
        st->word_hits += s->st.word_hits;
        st->bytes += s->st.bytes;
        st->hit_bytes += s->st.hit_bytes;
        st->special_in_text += s->st.special_in_text;
        st->special_matched += s->st.special_matched;
        st->unassigned += s->st.unassigned;
        st->unassigned_docs += s->st.unassigned_docs;
        st->cut_docs += s->st.cut_docs;
        st->cut_parts += s->st.cut_parts;
    }
    pthread_mutex_unlock(&b->mu);
}

void tks_bpe_free(tks_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_split; i++) {
        pcre2_code_free(b->split[i].re);
        free(b->split[i].pat);
    }
    scratch *s = b->all;
    while (s) {
        scratch *n = s->next_all;
        scratch_destroy(s);
        s = n;
    }
    if (b->have_key) {
        pthread_key_delete(b->key);
        pthread_mutex_destroy(&b->mu);
    }
    if (b->cache_map) {
        tks_unmap(b->cache_map, b->cache_len);
    } else {
        free(b->off);
        free(b->bytes);
        free(b->special);
        free(b->vslot);
        free(b->mslot);
        free(b->added_raw.tok);
        free(b->added_norm.tok);
        free(b->added_text);
    }
    free(b->hole);
    free(b->self);
    free(b->pair1);
    free(b->tt_pattern);
    free(b->tt_pattern_name);
    free(b->tt_ranks);
    free(b->tt_bos);
    free(b->tt_eos);
    free(b->tt_pad);
    free(b->path);
    free(b);
}
