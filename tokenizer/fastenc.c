/*
 * fastenc.c - tokshard's exact encoder for sentencepiece BPE and unigram
 * models (see fastenc.h). What it reproduces, from sentencepiece 0.1.97's
 * sources (github.com/google/sentencepiece, tag v0.1.97):
 *   - normalizer.cc Normalizer::Normalize / NormalizePrefix: leading and
 *     repeated whitespace removal, dummy prefix, U+2581 escaping, trailing
 *     whitespace removal, longest match in the precompiled charsmap (a
 *     darts-clone double array, third_party/darts_clone/darts.h), one byte
 *     consumed and U+FFFD output for malformed UTF-8 (util.cc DecodeUTF8);
 *   - bpe_model.cc Model::SampleEncode with alpha 0: characters as symbols,
 *     repeatedly merge the adjacent pair whose concatenation is a piece with
 *     the highest score, the leftmost on ties;
 *   - unigram_model.cc Model::EncodeOptimized: Viterbi over byte positions,
 *     piece scores added in double and stored as float, an unknown node of
 *     score min_score - 10 for a character no piece starts with;
 *   - sentencepiece_processor.cc PopulateSentencePieceText: an unknown piece
 *     becomes its <0xNN> byte pieces under byte_fallback, and consecutive
 *     unknown pieces are merged into one otherwise.
 * The model is read, and its tables built, by fastenc_load.c; this file
 * encodes with them.
 *
 * Word split. When no piece contains U+2581 after another character (checked
 * at load), no BPE merge and no unigram lattice node can span a point just
 * before a U+2581 that follows a non-U+2581 character. Cutting the
 * normalized text there is therefore exact: BPE merges are independent per
 * word (the merge order within a word is unchanged), and the Viterbi best
 * path passes through every cut, so unigram words are decoded one after the
 * other with the score at the cut carried over (it is a float sum of the
 * whole prefix, so the carried value is exactly sentencepiece's). The same
 * argument allows a cut between any two characters that no piece contains
 * side by side; the encoder also cuts between an ASCII letter or digit and
 * ASCII punctuation when the model has no piece with that pair (asc_cut), so
 * that "word," and "(word" share the cache entry of "word".
 *
 * Unigram word cache. A unigram word's best path depends on the carried
 * score X only through float rounding, so a cached path is reused only where
 * rounding cannot change a decision. With u = 2^-24 (float's unit roundoff),
 * a word of n bytes, and s the largest |score| of a piece (the unknown
 * node's included), every node score computed from X differs from its exact
 * real value X + (sum of its path's scores) by at most
 *     E(X) = 2 (n + 2) u (|X| + (n + 1) s).
 * A node m steps into the word is m sums, each exact in double or rounded
 * there (2^-53), then rounded to float (u), of a value at most
 * |X| + m s plus the error so far: its error is at most
 * m u' (|X| + m s) / (1 - m u'), u' = u + 2^-53; with m <= n + 1 <= 65, and
 * one more rounding for a stored best, E(X) is over twice that. Every
 * Viterbi decision compares two such
 * values; the exact difference does not depend on X. So if the smallest
 * computed difference over all decisions, at X1, is larger than
 * 2 E(X1) + 2 E(X2), every decision at X2 comes out the same, and so do the
 * path and the ids. The entry stores gap - 2 E(X1); a hit at X2 needs it
 * to exceed 2 E(X2), else the word is decoded again. The score after the
 * word is recomputed along the cached path exactly as the Viterbi computes
 * it, so the value carried on is sentencepiece's, bit for bit.
 */
#include "tokenizer/fastenc_internal.h"
#include "tokenizer/heap.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Words up to this many normalized bytes are cached. */
#define CACHE_MAX_WORD 64
/* Per-thread cache bounds: entries (power of two) and arena bytes; a full
 * cache is emptied and refilled. About 14 MiB per thread (2 MiB of slots). */
#define CACHE_SLOTS (1u << 18)
#define CACHE_ARENA (12u << 20)

/* ---------------------------------------------------------------------------
 * Lookups in the model's tables
 * ------------------------------------------------------------------------- */

/* The child of `node` by byte b, or 0 (the root is never a child). */
static uint32_t trie_child(const tks_fast *f, uint32_t node, uint8_t b) {
    uint64_t key = (((uint64_t)node << 8) | b) + 1;
    for (size_t i = edge_slot(key, f->edge_mask);; i = (i + 1) & f->edge_mask) {
        if (f->edge_key[i] == key) return f->edge_child[i];
        if (!f->edge_key[i]) return 0;
    }
}

/* The merged piece of pieces l and r, or -1. */
static int32_t pair_get(const tks_fast *f, int32_t l, int32_t r) {
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    for (size_t i = pair_hash(key) & f->pair_mask;; i = (i + 1) & f->pair_mask) {
        if (f->pair_key[i] == key) return f->pair_val[i];
        if (!f->pair_key[i]) return -1;
    }
}

/* util.cc DecodeUTF8 + IsValidDecodeUTF8: the length of a valid character at
 * s, or 0 when malformed (sentencepiece then consumes one byte). */
static size_t valid_utf8_len(const uint8_t *s, size_t n) {
    uint32_t cp;
    if (s[0] < 0x80) return 1;
    if (n >= 2 && (s[0] & 0xE0) == 0xC0) {
        cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && cp >= 0x80) return 2;
    } else if (n >= 3 && (s[0] & 0xF0) == 0xE0) {
        cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && cp >= 0x800 &&
            (cp < 0xD800 || cp >= 0xE000))
            return 3;
    } else if (n >= 4 && (s[0] & 0xF8) == 0xF0) {
        cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
             ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 &&
            cp >= 0x10000 && cp <= 0x10FFFF)
            return 4;
    }
    return 0;
}


/*
 * darts-clone commonPrefixSearch, keeping the last (longest) match: sets
 * *value and returns its length, or 0 when no key is a prefix of s. An index
 * outside the array (a corrupt charsmap) ends the search.
 */
static size_t charsmap_longest(const tks_fast *f, const uint8_t *s, size_t n, uint32_t *value) {
    size_t best = 0;
    size_t pos = du_offset(f->units[0]);
    for (size_t i = 0; i < n; i++) {
        pos ^= s[i];
        if (pos >= f->n_units) break;
        uint32_t u = f->units[pos];
        if (du_label(u) != s[i]) break;
        pos ^= du_offset(u);
        if (pos >= f->n_units) break;
        if (du_has_leaf(u)) {
            *value = du_value(f->units[pos]);
            best = i + 1;
        }
    }
    return best;
}

/* Normalizer::NormalizePrefix: the replacement of the longest rule matching
 * at s (or the character itself), and the bytes it consumes. */
static size_t normalize_prefix(const tks_fast *f, const uint8_t *s, size_t n, const char **out,
                               size_t *out_len) {
    if (s[0] < 0x80 && f->asc_fixed[s[0]]) {
        *out = f->asc_out[s[0]];
        *out_len = f->asc_out_len[s[0]];
        return 1;
    }
    if (f->units) {
        uint32_t value = 0;
        size_t m = charsmap_longest(f, s, n, &value);
        if (m) {
            *out = norm_string(f, value, out_len);
            /* the word split needs valid UTF-8 (sentencepiece's own charsmaps
             * always are); anything else is left to sentencepiece */
            for (size_t k = 0; k < *out_len;) {
                size_t c = valid_utf8_len((const uint8_t *)*out + k, *out_len - k);
                if (!c) return 0;
                k += c;
            }
            return m;
        }
    }
    size_t m = valid_utf8_len(s, n);
    if (!m) {
        *out = "\xEF\xBF\xBD";
        *out_len = 3;
        return 1;
    }
    *out = (const char *)s;
    *out_len = m;
    return m;
}

/* ---------------------------------------------------------------------------
 * Per-thread state: the word cache and scratch buffers
 * ------------------------------------------------------------------------- */
/* A cached word, in the arena (8-aligned): this header, the word's bytes
 * (padded to 4), its ids, then for unigram its best path (piece ids). The
 * slots hold only a tag and an offset, 8 bytes each, so that the table
 * (2 MiB) mostly stays in the CPU's caches: with the whole entry in a 48-byte
 * slot, the slot load was 40% of a unigram build's encode time. */
typedef struct centry {
    double room;               /* unigram: smallest decision gap - 2 E(X1) (see the top) */
    uint32_t key_len, n_ids, n_path;
    uint8_t first_unk, last_unk;
} centry;

typedef struct cslot {
    uint32_t tag; /* 0: empty; else the hash's high 32 bits, bit 0 set */
    uint32_t off; /* the centry's offset in the arena */
} cslot;

static const char *ce_key(const centry *e) { return (const char *)(e + 1); }
static const uint32_t *ce_ids(const centry *e) {
    return (const uint32_t *)(ce_key(e) + ((e->key_len + 3u) & ~3u));
}

struct tls_cache {
    tks__tls_obj pool;   /* first: the handle's pool (tls_pool.h) */
    cslot *slots;        /* CACHE_SLOTS */
    char *arena;         /* CACHE_ARENA */
    size_t arena_len, n_used;
    tks_fast_stats st;
    /* scratch */
    char *wbuf;          /* normalized bytes pending */
    size_t wlen, wcap;
    uint32_t *tmp_ids;   /* one word's ids */
    size_t n_tmp, cap_tmp; /* cap_tmp in bytes */
    size_t n_raw;        /* raw model pieces of the current word */
    int first_unk;       /* the first of them was unknown */
    int32_t *path;       /* unigram: the current word's best path (piece ids) */
    size_t n_path, path_cap; /* path_cap in bytes */
    double gap;          /* unigram: the current word's smallest decision gap */
    void *sym;           /* BPE symbols / unigram best paths */
    size_t sym_cap;      /* bytes */
    void *heap;
    size_t heap_cap;     /* bytes */
};

static void cache_destroy(tks__tls_obj *o) {
    tls_cache *c = (tls_cache *)o;
    free(c->slots);
    free(c->arena);
    free(c->wbuf);
    free(c->tmp_ids);
    free(c->path);
    free(c->sym);
    free(c->heap);
    free(c);
}

int tks__fast_caches_init(tks_fast *f) { return tks__tls_pool_init(&f->caches) ? TKS_ERR_NOMEM : 0; }

void tks__fast_caches_free(tks_fast *f) { tks__tls_pool_free(&f->caches, cache_destroy); }

static tks__tls_obj *cache_new(void *ctx) {
    (void)ctx;
    tls_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
    c->arena = malloc(CACHE_ARENA);
    if (!c->slots || !c->arena) {
        cache_destroy(&c->pool);
        return NULL;
    }
    return &c->pool;
}

static tls_cache *get_cache(tks_fast *f) { return (tls_cache *)tks__tls_pool_get(&f->caches, cache_new, NULL); }

void tks_fast_get_stats(const tks_fast *f, tks_fast_stats *st) {
    _Static_assert(sizeof *st % sizeof(uint64_t) == 0, "tks_fast_stats holds uint64_t counts only");
    memset(st, 0, sizeof *st);
    tks__tls_pool_sum(&((tks_fast *)f)->caches, offsetof(tls_cache, st), (uint64_t *)st, sizeof *st / sizeof(uint64_t));
}

static int grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c);
    if (!q) return TKS_ERR_NOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Encoding one word
 * ------------------------------------------------------------------------- */

/* The encoder's running state over one text. */
typedef struct enc {
    tks_fast *f;
    tls_cache *c;
    tks_ids *out;
    int prev_unk;      /* the last piece emitted was unknown (merging) */
    float uni_score;   /* unigram: best path score at the current cut */
} enc;

/*
 * Appends one raw model piece (id, bytes s[0..n)) to the word's ids
 * (c->tmp_ids), as PopulateSentencePieceText does; *prev_unk carries its
 * state. Returns 0 or TKS_ERR_NOMEM.
 */
static int word_emit(tks_fast *f, tls_cache *c, int32_t id, const char *s, size_t n, int *prev_unk) {
    uint8_t ty = f->type[id];
    int is_unk = ty == PT_UNKNOWN;
    if (c->n_raw++ == 0) c->first_unk = is_unk;
    size_t need = c->n_tmp + (is_unk && f->byte_fallback ? n : 1);
    if (grow((void **)&c->tmp_ids, &c->cap_tmp, need * sizeof(uint32_t))) return TKS_ERR_NOMEM;
    if (ty == PT_CONTROL) {
        c->tmp_ids[c->n_tmp++] = (uint32_t)id;
    } else if (is_unk && f->byte_fallback) {
        for (size_t i = 0; i < n; i++) c->tmp_ids[c->n_tmp++] = (uint32_t)f->byte_id[(uint8_t)s[i]];
    } else if (!(is_unk && *prev_unk)) {
        c->tmp_ids[c->n_tmp++] = (uint32_t)id;
    }
    *prev_unk = is_unk;
    return 0;
}

/* ModelInterface::PieceToId for a final BPE symbol */
static int32_t piece_to_id(const tks_fast *f, const char *s, size_t n) {
    hent *e = tab_find(f, s, n, fnv(s, n));
    if (!e) return f->unk_id;
    if (e->res_id >= 0) return e->res_id;
    if (e->norm_id >= 0) return e->norm_id;
    return f->unk_id;
}

typedef struct bsym {
    uint32_t start, len;
    int32_t prev, next;
    int32_t id; /* pieces_ id of the symbol, or -1 (with use_pairs) */
} bsym;

typedef struct bpair {
    float score;
    int32_t left, right;
    uint32_t size;
    int32_t merged; /* the merged piece (with use_pairs) */
} bpair;

/* heap order: higher score first, then smaller left */
static inline int pair_before(const bpair *a, const bpair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

TKS_HEAP_DEFINE(heap, bpair, pair_before)

/* Pushes the pair (l, r) when their concatenation is a piece
 * (bpe_model.cc MaybeAddNewSymbolPair). */
static void bpe_try_pair(const tks_fast *f, const char *w, const bsym *sym, int32_t l, int32_t r,
                         bpair *heap, size_t *nh) {
    if (l < 0 || r < 0) return;
    uint32_t size = sym[l].len + sym[r].len;
    int32_t m;
    if (f->use_pairs) {
        if (sym[l].id < 0 || sym[r].id < 0) return;
        m = pair_get(f, sym[l].id, sym[r].id);
    } else {
        const char *s = w + sym[l].start;
        hent *e = tab_find(f, s, size, fnv(s, size));
        m = e ? e->norm_id : -1;
    }
    if (m < 0) return;
    bpair p = {f->score[m], l, r, size, m};
    heap_push(heap, nh, p);
}

/* BPE on one word w[0..n): raw pieces into c->tmp_ids through word_emit. */
static int bpe_word(tks_fast *f, tls_cache *c, const char *w, size_t n, int *prev_unk) {
    if (grow(&c->sym, &c->sym_cap, n * sizeof(bsym))) return TKS_ERR_NOMEM;
    /* at most one live pair per symbol plus stale ones: each merge pushes two */
    if (grow(&c->heap, &c->heap_cap, 3 * n * sizeof(bpair) + sizeof(bpair))) return TKS_ERR_NOMEM;
    bsym *sym = c->sym;
    bpair *heap = c->heap;
    size_t ns = 0, nh = 0;
    for (size_t k = 0; k < n;) {
        size_t m = one_char_len((uint8_t)w[k]);
        if (m > n - k) m = n - k;
        sym[ns].start = (uint32_t)k;
        sym[ns].len = (uint32_t)m;
        sym[ns].prev = (int32_t)ns - 1;
        sym[ns].next = k + m < n ? (int32_t)ns + 1 : -1;
        sym[ns].id = !f->use_pairs ? -1
                     : (uint8_t)w[k] < 0x80 ? f->ascii_id[(uint8_t)w[k]]
                                            : norm_id_of(f, w + k, m);
        ns++;
        k += m;
    }
    for (size_t k = 1; k < ns; k++) bpe_try_pair(f, w, sym, (int32_t)k - 1, (int32_t)k, heap, &nh);
    while (nh) {
        bpair top = heap_pop(heap, &nh);
        bsym *L = &sym[top.left], *R = &sym[top.right];
        if (L->len == 0 || R->len == 0 || L->len + R->len != top.size) continue;
        L->len += R->len;
        L->id = top.merged;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = top.left;
        R->len = 0;
        /* the heap has room: pushes per merge <= 2, pops >= 1 */
        bpe_try_pair(f, w, sym, L->prev, top.left, heap, &nh);
        bpe_try_pair(f, w, sym, top.left, L->next, heap, &nh);
    }
    for (int32_t k = ns ? 0 : -1; k >= 0; k = sym[k].next) {
        const char *s = w + sym[k].start;
        int32_t id = f->use_pairs && sym[k].id >= 0 ? f->final_id[sym[k].id] : piece_to_id(f, s, sym[k].len);
        if (word_emit(f, c, id, s, sym[k].len, prev_unk)) return TKS_ERR_NOMEM;
    }
    return 0;
}

typedef struct upath {
    float score;
    int32_t id;
    int32_t start; /* -1: unreached */
} upath;

/* Unigram Viterbi on one word, starting from the path score *base. */
static int unigram_word(tks_fast *f, tls_cache *c, const char *w, size_t n, float *base,
                        int *prev_unk) {
    if (n > INT32_MAX - 1) return TKS_ERR_NOMEM;
    if (grow(&c->sym, &c->sym_cap, (n + 1) * sizeof(upath))) return TKS_ERR_NOMEM;
    upath *bp = c->sym;
    for (size_t k = 0; k <= n; k++) bp[k].start = -1, bp[k].id = -1, bp[k].score = 0;
    bp[0].score = *base;
    bp[0].start = 0;
    const float unk_score = f->min_score - UNK_PENALTY;
    double gap = INFINITY; /* smallest |difference| a decision was made on */
    for (size_t st = 0; st < n;) {
        const float till = bp[st].score;
        size_t mblen = one_char_len((uint8_t)w[st]);
        if (mblen > n - st) mblen = n - st;
        int single = 0;
        uint32_t node = 0;
        for (size_t k = st; k < n; k++) {
            node = trie_child(f, node, (uint8_t)w[k]);
            if (!node) break;
            int32_t id = f->node_id[node];
            if (id < 0 || f->type[id] == PT_UNUSED) continue;
            upath *t = &bp[k + 1];
            size_t length = k + 1 - st;
            /* double, as in EncodeOptimized (its score expression is double) */
            double cand = (double)f->score[id] + (double)till;
            if (t->start != -1 && fabs(cand - (double)t->score) < gap) gap = fabs(cand - (double)t->score);
            if (t->start == -1 || cand > (double)t->score) {
                t->score = (float)cand;
                t->start = (int32_t)st;
                t->id = id;
            }
            if (length == mblen) single = 1;
        }
        if (!single) {
            upath *t = &bp[st + mblen];
            float cand = unk_score + till;
            if (t->start != -1 && fabs((double)cand - (double)t->score) < gap)
                gap = fabs((double)cand - (double)t->score);
            if (t->start == -1 || cand > t->score) {
                t->score = cand;
                t->start = (int32_t)st;
                t->id = f->unk_id;
            }
        }
        st += mblen;
    }
    *base = bp[n].score;
    c->gap = gap;
    /* backtrack, collecting the piece ends, then emit them in order */
    if (grow(&c->heap, &c->heap_cap, (n + 1) * sizeof(uint32_t)) ||
        grow((void **)&c->path, &c->path_cap, (n + 1) * sizeof(int32_t)))
        return TKS_ERR_NOMEM;
    uint32_t *ends = c->heap;
    size_t np = 0;
    for (int32_t k = (int32_t)n; k > 0; k = bp[k].start) ends[np++] = (uint32_t)k;
    c->n_path = 0;
    while (np) {
        uint32_t e = ends[--np];
        const char *s = w + bp[e].start;
        c->path[c->n_path++] = bp[e].id;
        if (word_emit(f, c, bp[e].id, s, e - (uint32_t)bp[e].start, prev_unk)) return TKS_ERR_NOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Words: cache, then the model
 * ------------------------------------------------------------------------- */
static void cache_clear(tls_cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->arena_len = 0;
    c->n_used = 0;
}

/* Caches the word's ids (c->tmp_ids) and, for unigram (path != NULL), its
 * best path and room (see the top). */
static void cache_put(tls_cache *c, uint64_t h, const char *w, size_t n, int first_unk,
                      int last_unk, const int32_t *path, size_t n_path, double room) {
    if (!path) n_path = 0;
    size_t bytes = sizeof(centry) + ((n + 3) & ~(size_t)3) + (c->n_tmp + n_path) * sizeof(uint32_t);
    size_t off = (c->arena_len + 7) & ~(size_t)7;
    if (c->n_used >= CACHE_SLOTS / 2 || off + bytes > CACHE_ARENA) {
        cache_clear(c);
        off = 0;
        if (bytes > CACHE_ARENA) return;
    }
    size_t mask = CACHE_SLOTS - 1;
    size_t i = (size_t)h & mask;
    while (c->slots[i].tag) i = (i + 1) & mask;
    centry *e = (centry *)(c->arena + off);
    e->room = room;
    e->key_len = (uint32_t)n;
    e->n_ids = (uint32_t)c->n_tmp;
    e->n_path = (uint32_t)n_path;
    e->first_unk = (uint8_t)first_unk;
    e->last_unk = (uint8_t)last_unk;
    memcpy((char *)ce_key(e), w, n);
    uint32_t *ids = (uint32_t *)ce_ids(e);
    memcpy(ids, c->tmp_ids, c->n_tmp * sizeof *ids);
    if (n_path) memcpy(ids + c->n_tmp, path, n_path * sizeof *path);
    c->slots[i].tag = (uint32_t)(h >> 32) | 1u;
    c->slots[i].off = (uint32_t)off;
    c->arena_len = off + bytes;
    c->n_used++;
}

static const centry *cache_get(const tls_cache *c, uint64_t h, const char *w, size_t n) {
    size_t mask = CACHE_SLOTS - 1;
    uint32_t tag = (uint32_t)(h >> 32) | 1u;
    for (size_t i = (size_t)h & mask; c->slots[i].tag; i = (i + 1) & mask) {
        if (c->slots[i].tag != tag) continue;
        const centry *e = (const centry *)(c->arena + c->slots[i].off);
        if (e->key_len == n && !memcmp(ce_key(e), w, n)) return e;
    }
    return NULL;
}

/* Appends a word's ids to the output, merging an unknown piece that starts
 * it into one that ended the previous word (byte fallback off). */
static int out_append(enc *e, const uint32_t *ids, size_t n, int first_unk, int last_unk) {
    tks_ids *o = e->out;
    size_t skip = first_unk && e->prev_unk && !e->f->byte_fallback ? 1 : 0;
    if (o->n + n > o->cap) {
        size_t cap = o->cap < 64 ? 64 : o->cap;
        while (cap < o->n + n) cap *= 2;
        uint32_t *q = realloc(o->ids, cap * sizeof *q);
        if (!q) return TKS_ERR_NOMEM;
        o->ids = q;
        o->cap = cap;
    }
    memcpy(o->ids + o->n, ids + skip, (n - skip) * sizeof *ids);
    o->n += n - skip;
    e->prev_unk = last_unk;
    return 0;
}

/* E(X) of the unigram cache bound (see the top) for a word of n bytes. */
static double uni_err(const tks_fast *f, size_t n, double x) {
    return 2.0 * (double)(n + 2) * 0x1p-24 * (fabs(x) + (double)(n + 1) * f->uni_smax);
}

/* The score after a cached unigram path from score x, computed node by node
 * exactly as unigram_word computes it. */
static float uni_replay(const tks_fast *f, const int32_t *path, size_t n, float x) {
    const float unk_score = f->min_score - UNK_PENALTY;
    for (size_t i = 0; i < n; i++)
        x = path[i] == f->unk_id ? unk_score + x : (float)((double)f->score[path[i]] + (double)x);
    return x;
}

/* Encodes one word; h is fnv(w, n) when the caller has it, else 0. */
static int encode_word(enc *e, const char *w, size_t n, uint64_t h) {
    tks_fast *f = e->f;
    tls_cache *c = e->c;
    c->st.words++;
    c->st.bytes += n;
    int uni = f->kind == KIND_UNIGRAM;
    int cacheable = n <= CACHE_MAX_WORD && !f->no_cache;
    if (cacheable) {
        if (!h) h = fnv(w, n);
        const centry *ce = cache_get(c, h, w, n);
        if (ce && (!uni || ce->room > 2.0 * uni_err(f, n, e->uni_score))) {
            c->st.word_hits++;
            c->st.hit_bytes += n;
            const uint32_t *ids = ce_ids(ce);
            if (uni)
                e->uni_score = uni_replay(f, (const int32_t *)(ids + ce->n_ids), ce->n_path,
                                          e->uni_score);
            return out_append(e, ids, ce->n_ids, ce->first_unk, ce->last_unk);
        }
        if (ce) { /* rounding could change a decision at this score: decode */
            c->st.bound_misses++;
            cacheable = 0;
        }
    }
    const float x1 = e->uni_score;
    c->n_tmp = 0;
    c->n_raw = 0;
    int pu = 0, rc;
    if (f->kind == KIND_BPE) rc = bpe_word(f, c, w, n, &pu);
    else rc = unigram_word(f, c, w, n, &e->uni_score, &pu);
    if (rc) return rc;
    /* the first raw piece was unknown iff the word's first id is unk (no
     * byte fallback) or a byte piece produced from an unknown piece */
    int first_unk = c->first_unk;
    rc = out_append(e, c->tmp_ids, c->n_tmp, first_unk, pu);
    if (!rc && cacheable)
        cache_put(c, h, w, n, first_unk, pu, uni ? c->path : NULL, c->n_path,
                  uni ? c->gap - 2.0 * uni_err(f, n, x1) : 0.0);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Normalization, streamed into words
 * ------------------------------------------------------------------------- */
typedef struct nstream {
    size_t word_start, scan;
} nstream;

static int wappend(enc *e, nstream *ns, const char *s, size_t n) {
    tls_cache *c = e->c;
    if (c->wlen + n > c->wcap && ns->word_start > 0) {
        memmove(c->wbuf, c->wbuf + ns->word_start, c->wlen - ns->word_start);
        c->wlen -= ns->word_start;
        ns->scan -= ns->word_start;
        ns->word_start = 0;
    }
    if (grow((void **)&c->wbuf, &c->wcap, c->wlen + n)) return TKS_ERR_NOMEM;
    memcpy(c->wbuf + c->wlen, s, n);
    c->wlen += n;
    return 0;
}

/* Encodes the words found by wscan, in order. Their cache slots, then the
 * entries those point to, are prefetched first for all of them at once, so
 * that the memory latency of the lookups overlaps instead of adding up (on
 * a cache hit, the two loads were most of a word's time). */
#define WORD_BATCH 64
static int encode_words(enc *e, const size_t *start, const size_t *len, size_t k) {
    tls_cache *c = e->c;
    uint64_t h[WORD_BATCH];
    size_t mask = CACHE_SLOTS - 1;
    int cache = !e->f->no_cache;
    for (size_t j = 0; j < k; j++) {
        h[j] = 0;
        if (cache && len[j] <= CACHE_MAX_WORD) {
            h[j] = fnv(c->wbuf + start[j], len[j]);
            __builtin_prefetch(&c->slots[h[j] & mask]);
        }
    }
    for (size_t j = 0; j < k; j++)
        if (h[j]) {
            const cslot *sl = &c->slots[h[j] & mask];
            if (sl->tag == ((uint32_t)(h[j] >> 32) | 1u)) __builtin_prefetch(c->arena + sl->off);
        }
    for (size_t j = 0; j < k; j++) {
        int rc = encode_word(e, c->wbuf + start[j], len[j], h[j]);
        if (rc) return rc;
    }
    return 0;
}

/*
 * Encodes every word completed by the bytes appended so far. The normalized
 * text is valid UTF-8, so E2 is always a lead byte: a U+2581 is found by
 * searching for E2 96 81, and the character before it is U+2581 exactly when
 * the three bytes before it are. Position 0 of the buffer is the start of
 * the text or an already-processed cut, never a new cut.
 */
static int wscan(enc *e, nstream *ns) {
    tls_cache *c = e->c;
    const tks_fast *f = e->f;
    const uint8_t *b = (const uint8_t *)c->wbuf;
    size_t n = c->wlen, i = ns->scan;
    size_t start[WORD_BATCH], len[WORD_BATCH], k = 0;
    for (; i < n; i++) {
        uint8_t ch = b[i];
        size_t cut = 0;
        if (ch == 0xE2) {
            if (i + 3 > n) break; /* wait for the rest of the character */
            if (!is_ws_sym((const char *)b + i, 3)) continue;
            if (i > 0 && !(i >= 3 && is_ws_sym((const char *)b + i - 3, 3))) cut = 1;
        } else if (ch < 0x80 && i > 0 && b[i - 1] < 0x80 && f->asc_cut[b[i - 1]][ch]) {
            cut = 1;
        }
        if (cut && i > ns->word_start) {
            start[k] = ns->word_start;
            len[k++] = i - ns->word_start;
            ns->word_start = i;
            if (k == WORD_BATCH) {
                int rc = encode_words(e, start, len, k);
                if (rc) return rc;
                k = 0;
            }
        }
        if (ch == 0xE2) i += 2;
    }
    ns->scan = i;
    return k ? encode_words(e, start, len, k) : 0;
}

int tks_fast_encode(const tks_fast *cf, const char *text, size_t len, tks_ids *out) {
    /* the per-thread caches are the only mutable part (behind a mutex and a key) */
    tks_fast *f = (tks_fast *)cf;
    if (!f || !out || (!text && len))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_fast_encode: NULL argument");
    out->n = 0;
    if (!len) return 0;
    tls_cache *c = get_cache(f);
    if (!c)
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of memory for the encoder's per-thread cache");
    enc e = {f, c, out, 0, 0.0f};
    nstream ns = {0, 0};
    c->wlen = 0;
    const uint8_t *s = (const uint8_t *)text, *end = s + len;
    const char *sp;
    size_t spn;
    int rc = 0;
    /* Normalizer::Normalize: leading whitespace */
    if (f->remove_extra_ws) {
        while (s < end) {
            size_t m = normalize_prefix(f, s, (size_t)(end - s), &sp, &spn);
            if (!(spn == 1 && sp[0] == ' ')) break;
            s += m;
        }
    }
    if (s == end) return 0;
    static const char ws_sym[] = "\xe2\x96\x81";
    if (f->add_dummy_prefix) rc = f->escape_ws ? wappend(&e, &ns, ws_sym, 3) : wappend(&e, &ns, " ", 1);
    int prev_space = f->remove_extra_ws;
    while (!rc && s < end) {
        if (*s < 0x80 && f->asc_run[*s]) {
            /* a run of ASCII bytes that normalize to themselves; the last one
             * goes through the charsmap when a non-ASCII byte follows */
            const uint8_t *r = s + 1;
            while (r < end && *r < 0x80 && f->asc_run[*r]) r++;
            if (r < end && *r >= 0x80 && f->units) r--;
            if (r > s) {
                rc = wappend(&e, &ns, (const char *)s, (size_t)(r - s));
                prev_space = 0;
                s = r;
                if (!rc && c->wlen - ns.scan >= 4096) rc = wscan(&e, &ns);
                continue;
            }
        }
        size_t m = normalize_prefix(f, s, (size_t)(end - s), &sp, &spn);
        if (!m) {
            rc = 1; /* a charsmap output that is not valid UTF-8 */
            break;
        }
        while (prev_space && spn && sp[0] == ' ') sp++, spn--;
        if (spn) {
            if (f->escape_ws && memchr(sp, ' ', spn)) {
                for (size_t k = 0; k < spn && !rc; k++)
                    rc = sp[k] == ' ' ? wappend(&e, &ns, ws_sym, 3) : wappend(&e, &ns, sp + k, 1);
            } else {
                rc = wappend(&e, &ns, sp, spn);
            }
            prev_space = sp[spn - 1] == ' ';
        }
        s += m;
        if (!f->remove_extra_ws) prev_space = 0;
        if (!rc && c->wlen - ns.scan >= 4096) rc = wscan(&e, &ns);
    }
    if (!rc) rc = wscan(&e, &ns);
    if (!rc) {
        /* trailing whitespace: all of it lies in the last word */
        size_t end_w = c->wlen;
        if (f->remove_extra_ws) {
            const char *sym = f->escape_ws ? ws_sym : " ";
            size_t sl = f->escape_ws ? 3 : 1;
            while (end_w - ns.word_start >= sl && !memcmp(c->wbuf + end_w - sl, sym, sl)) end_w -= sl;
        }
        if (end_w > ns.word_start) rc = encode_word(&e, c->wbuf + ns.word_start, end_w - ns.word_start, 0);
    }
    /* keep at most a few MiB of scratch after a long word */
    if (c->wcap > (4u << 20)) free(c->wbuf), c->wbuf = NULL, c->wcap = 0;
    if (c->sym_cap > (4u << 20)) free(c->sym), c->sym = NULL, c->sym_cap = 0;
    if (c->heap_cap > (4u << 20)) free(c->heap), c->heap = NULL, c->heap_cap = 0;
    if (c->cap_tmp > (4u << 20)) free(c->tmp_ids), c->tmp_ids = NULL, c->cap_tmp = 0;
    c->wlen = 0;
    if (rc == 1) {
        out->n = 0;
        return 1;
    }
    if (rc) {
        out->n = 0;
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of memory encoding a text of %zu bytes", len);
    }
    return 0;
}
