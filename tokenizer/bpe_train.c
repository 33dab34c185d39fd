/*
 * bpe_train.c - byte-level BPE training from counted words, with the
 * merges of Hugging Face tokenizers' BpeTrainer (tokenizers 0.23.3,
 * tokenizers/src/models/bpe/trainer.rs, do_train; word.rs, Word::merge),
 * given ByteLevel.alphabet() as the initial alphabet and no
 * continuing_subword_prefix, end_of_word_suffix, limit_alphabet or
 * max_token_length. What the result depends on, and how it is kept:
 *
 *   - ids: the special tokens first, in order, a repeated one once; then
 *     the 256 byte tokens by code point (compute_alphabet sorts the
 *     alphabet's chars; a byte's char is GPT-2's bytes_to_unicode), one that
 *     a special token already spells taking that id; then each merge's
 *     token, unless its string is in the vocabulary already (then the merge
 *     records that id and the vocabulary does not grow);
 *   - counts: a pair's count is the sum of the counts of its occurrences;
 *     they start from every word's adjacent pairs (count_pairs) and move by
 *     the changes Word::merge reports: for each occurrence merged, -1 for
 *     (previous, left) and (right, next), +1 for (previous, new) and (new,
 *     next), where "previous" is the symbol already rewritten. The merged
 *     pair's own count is never lowered; it is read again only when a later
 *     merge recreates the pair, as there;
 *   - the queue: entries (count, pair, words) in a max-heap by count, then
 *     the lower pair; the first entries hold every word a pair occurs in;
 *     after each merge, one entry per pair that gained occurrences, holding
 *     the words where it did, when its count is positive. A popped entry
 *     whose count differs from the pair's is pushed back with that count
 *     (its words kept); one whose count is below 1 or min_frequency ends
 *     training, as does vocab_size ids;
 *   - a merge rewrites the words of the popped entry only (a pair recreated
 *     in other words waits for its own entry).
 * Entries of equal count and pair (only when two merges made one string)
 * pop in an order tokenizers leaves to its hash maps' iteration; here it is
 * the heap's, fixed by the order of pushes, which does not depend on the
 * thread count: the result is the same for every thread count, and so is
 * every byte of the files written from it.
 * Counts are 64-bit: tokenizers' i32 pair counts wrap past 2^31 (a
 * corpus of tens of gigabytes), where it then goes wrong.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_train.h"

static int nomem(const char *what) {
    return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory training byte-level BPE (%s)", what);
}

/* ---------------------------------------------------------------------------
 * The vocabulary: token bytes by id, and the map back
 * ------------------------------------------------------------------------- */
static uint32_t vmap_find(const tks_bpe_trainer *t, const char *s, size_t n, size_t *slot) {
    size_t i = XXH3_64bits(s, n) & t->vmask;
    for (;; i = (i + 1) & t->vmask) {
        uint32_t v = t->vmap[i];
        if (!v) break;
        uint32_t id = v - 1;
        if (t->toff[id + 1] - t->toff[id] == n && !memcmp(t->tb + t->toff[id], s, n)) {
            if (slot) *slot = i;
            return id;
        }
    }
    if (slot) *slot = i;
    return TKS_NO_ID;
}

/* Appends token s[0..n) as id n_tok (special: 0, 1 or 2 as tspec); mapped
 * from its bytes unless spec is 2. The caller knows it is not there. */
static int tok_push(tks_bpe_trainer *t, const char *s, size_t n, int spec) {
    if (t->n_tok + 1 >= t->tok_cap) {
        uint32_t cap = t->tok_cap ? 2 * t->tok_cap : 1024;
        if (tks_resize(&t->toff, (size_t)cap + 1, sizeof *t->toff) || tks_resize(&t->tspec, cap, 1))
            return nomem("vocabulary");
        t->tok_cap = cap;
    }
    if (t->tb_len + n > t->tb_cap) {
        uint64_t cap = t->tb_cap ? 2 * t->tb_cap : 65536;
        while (cap < t->tb_len + n) cap *= 2;
        if (tks_resize(&t->tb, cap, 1)) return nomem("vocabulary");
        t->tb_cap = cap;
    }
    if (((size_t)t->n_tok + 1) * 2 > t->vmask + 1) { /* the map at most half full */
        size_t m = (t->vmask + 1) * 2;
        uint32_t *v = calloc(m, sizeof *v);
        if (!v) return nomem("vocabulary");
        free(t->vmap);
        t->vmap = v;
        t->vmask = m - 1;
        for (uint32_t id = 0; id < t->n_tok; id++) {
            if (t->tspec[id] == 2) continue;
            size_t slot;
            vmap_find(t, t->tb + t->toff[id], t->toff[id + 1] - t->toff[id], &slot);
            t->vmap[slot] = id + 1;
        }
    }
    uint32_t id = t->n_tok++;
    memcpy(t->tb + t->tb_len, s, n);
    t->tb_len += n;
    t->toff[id] = t->tb_len - n;
    t->toff[id + 1] = t->tb_len;
    t->tspec[id] = (uint8_t)spec;
    if (spec != 2) {
        size_t slot;
        vmap_find(t, s, n, &slot);
        t->vmap[slot] = id + 1;
    }
    return 0;
}

/* The bytes whose GPT-2 characters spell the UTF-8 text s[0..n), into
 * out[0..*m) (out has n bytes): 1, or 0 when a character is not one of
 * them (or s is not valid UTF-8). */
static int text_bytes(const char *s, size_t n, char *out, size_t *m) {
    uint16_t back[0x144] = {0}; /* code point -> byte + 1 */
    for (unsigned b = 0; b < 256; b++) back[tks__bpe_byte_char(b)] = (uint16_t)(b + 1);
    *m = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i], cp;
        if (c < 0x80) cp = c, i += 1;
        else if ((c & 0xE0) == 0xC0 && i + 1 < n) cp = (c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F), i += 2;
        else return 0;
        if (cp >= sizeof back / sizeof *back || !back[cp]) return 0;
        out[(*m)++] = (char)(back[cp] - 1);
    }
    return 1;
}

/* Valid UTF-8 (as Rust's str). */
static int utf8_ok(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (k == 9 || i + k >= n + (k == 0)) return 0;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (k && (u[i + 1] < lo || u[i + 1] > hi)) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* add_special_tokens then compute_alphabet (every byte's character). */
static int vocab_init(tks_bpe_trainer *t, const tks_bpe_train_cfg *c) {
    for (size_t i = 0; i < c->n_specials; i++) {
        const char *s = c->specials[i];
        size_t n = s ? strlen(s) : 0, m;
        if (!n || !utf8_ok(s, n))
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "special token %zu is %s: give each as non-empty UTF-8 text", i + 1,
                            n ? "not valid UTF-8" : "empty");
        int dup = 0;
        for (uint32_t id = 0; id < t->n_tok && !dup; id++)
            dup = t->toff[id + 1] - t->toff[id] == n && !memcmp(t->tb + t->toff[id], s, n);
        if (dup) continue;
        char *b = malloc(n);
        if (!b) return nomem("special tokens");
        int mapped = text_bytes(s, n, b, &m);
        /* a text of byte characters is the token of those bytes */
        int rc = mapped && vmap_find(t, b, m, NULL) == TKS_NO_ID ? tok_push(t, b, m, 1)
                 : mapped                                          ? 0
                                                                   : tok_push(t, s, n, 2);
        free(b);
        if (rc) return rc;
    }
    t->n_specials = t->n_tok;
    unsigned order[256];
    for (unsigned b = 0; b < 256; b++) order[b] = b;
    for (unsigned i = 1; i < 256; i++) /* by code point (insertion sort of 256) */
        for (unsigned j = i; j > 0 && tks__bpe_byte_char(order[j]) < tks__bpe_byte_char(order[j - 1]); j--) {
            unsigned x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (unsigned i = 0; i < 256; i++) {
        char ch = (char)order[i];
        uint32_t id = vmap_find(t, &ch, 1, NULL);
        if (id == TKS_NO_ID) {
            int rc = tok_push(t, &ch, 1, 0);
            if (rc) return rc;
            id = t->n_tok - 1;
        }
        t->byte_id[order[i]] = id;
    }
    return 0;
}

void tks_bpe_trainer_free(tks_bpe_trainer *t) {
    if (!t) return;
    for (size_t i = 0; t->heap && i < t->hn; i++)
        if (t->heap[i].cap > 1) free(t->heap[i].w.p);
    free(t->csr);
    free(t->heap);
    free(t->pc);
    free(t->sym);
    free(t->woff);
    free(t->wcnt);
    free(t->wlen);
    free(t->tb);
    free(t->toff);
    free(t->tspec);
    free(t->vmap);
    free(t->mg);
    free(t->keep);
    free(t);
}

int tks_bpe_trainer_create(const tks_bpe_train_cfg *c, tks_bpe_trainer **out) {
    if (!c || !out) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_trainer_create: NULL argument");
    *out = NULL;
    if (!c->vocab_size || c->vocab_size > (1u << 31) || (c->n_specials && !c->specials))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "vocabulary size %u: expected 1 .. 2^31",
                        c->vocab_size);
    tks_bpe_trainer *t = calloc(1, sizeof *t);
    if (!t) return nomem("trainer");
    t->vocab_size = c->vocab_size;
    t->min_frequency = c->min_frequency;
    t->threads = c->threads > 0 ? c->threads : 1;
    t->vmask = 1023;
    int rc = (t->vmap = calloc(t->vmask + 1, sizeof *t->vmap)) ? vocab_init(t, c) : nomem("vocabulary");
    if (rc) tks_bpe_trainer_free(t);
    else *out = t;
    return rc;
}

uint64_t tks_bpe_trainer_memory(uint64_t words, uint64_t bytes, uint32_t vocab_size, int threads) {
    /* Per byte: its symbol (4) and its place in the first index (4); the
     * pairs and the entries of the heap grow with the symbols too. Measured
     * (tks_bpe_trainer_peak, 2 threads) on Linux's Documentation/ (165,352
     * words, 2.3 MB: 68 MB at 32,000 ids, 77 at 128,000) and net/ (158,117
     * words, 1.1 MB: 34 and 43 MB), where the heap and the pair counts,
     * doubled as they grow, are half of it: 32 bytes a byte and 96 a word
     * hold both with a third to spare. Per id: its bytes, map slot and
     * merge (48) and each thread's step tables (32). */
    uint64_t t = threads > 0 ? (uint64_t)threads : 1;
    return 32 * bytes + 96 * words + (uint64_t)vocab_size * (48 + 32 * t) + (4ull << 20);
}

int tks_bpe_trainer_reserve(tks_bpe_trainer *t, uint64_t words, uint64_t bytes) {
    if (words > t->words_cap) {
        if (tks_resize(&t->woff, words, sizeof *t->woff) || tks_resize(&t->wcnt, words, sizeof *t->wcnt) ||
            tks_resize(&t->wlen, words, sizeof *t->wlen))
            return nomem("words");
        t->words_cap = words;
    }
    if (bytes > t->sym_cap) {
        if (tks_resize(&t->sym, bytes, sizeof *t->sym)) return nomem("words");
        t->sym_cap = bytes;
    }
    return 0;
}

int tks_bpe_trainer_add(tks_bpe_trainer *t, const char *w, size_t len, uint64_t count) {
    if (!count || t->ran) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                                          count ? "tks_bpe_trainer_add after training" : "a word with count 0");
    if (len < 2) {
        t->short_words++;
        return 0;
    }
    if (len > UINT32_MAX || t->n_words >= UINT32_MAX)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "more than 2^32 - 1 distinct words, or one of 4 GiB: prune rare words (--min-word-count)");
    if (t->n_words == t->words_cap) {
        uint64_t cap = t->words_cap ? 2 * t->words_cap : 65536;
        if (tks_resize(&t->woff, cap, sizeof *t->woff) || tks_resize(&t->wcnt, cap, sizeof *t->wcnt) ||
            tks_resize(&t->wlen, cap, sizeof *t->wlen))
            return nomem("words");
        t->words_cap = cap;
    }
    if (t->n_sym + len > t->sym_cap) {
        uint64_t cap = t->sym_cap ? 2 * t->sym_cap : (1u << 20);
        while (cap < t->n_sym + len) cap *= 2;
        if (tks_resize(&t->sym, cap, sizeof *t->sym)) return nomem("words");
        t->sym_cap = cap;
    }
    uint32_t *s = t->sym + t->n_sym;
    for (size_t i = 0; i < len; i++) s[i] = t->byte_id[(unsigned char)w[i]];
    t->woff[t->n_words] = t->n_sym;
    t->wlen[t->n_words] = (uint32_t)len;
    t->wcnt[t->n_words] = count;
    t->n_words++;
    t->n_sym += len;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Pair counts
 * ------------------------------------------------------------------------- */
static inline size_t pc_hash(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17); }

static int pc_grow(tks_bpe_trainer *t) {
    size_t m = t->pc ? 2 * (t->pcmask + 1) : 65536 * 2;
    tks__bt_pc *n = calloc(m, sizeof *n);
    if (!n) return nomem("pair counts");
    for (size_t i = 0; t->pc && i <= t->pcmask; i++) {
        if (!t->pc[i].key) continue;
        size_t j = pc_hash(t->pc[i].key) & (m - 1);
        while (n[j].key) j = (j + 1) & (m - 1);
        n[j] = t->pc[i];
    }
    free(t->pc);
    t->pc = n;
    t->pcmask = m - 1;
    return 0;
}

/* The slot of pair p, inserted (count 0) when absent; NULL out of memory. */
static tks__bt_pc *pc_slot(tks_bpe_trainer *t, uint64_t p) {
    if ((t->pcn + 1) * 2 > t->pcmask + 1 && pc_grow(t)) return NULL;
    uint64_t key = p + 1;
    size_t i = pc_hash(key) & t->pcmask;
    while (t->pc[i].key && t->pc[i].key != key) i = (i + 1) & t->pcmask;
    if (!t->pc[i].key) {
        t->pc[i] = (tks__bt_pc){key, 0};
        t->pcn++;
    }
    return &t->pc[i];
}

static int64_t pc_get(const tks_bpe_trainer *t, uint64_t p) {
    uint64_t key = p + 1;
    for (size_t i = pc_hash(key) & t->pcmask; t->pc[i].key; i = (i + 1) & t->pcmask)
        if (t->pc[i].key == key) return t->pc[i].count;
    return 0;
}

/* Adds d to pair p's count; a count back at 0 leaves the table (linear
 * probing's backward-shift deletion), as a pair never seen reads 0. 0 or
 * TKS_ERR_NOMEM. */
static int pc_add(tks_bpe_trainer *t, uint64_t p, int64_t d) {
    tks__bt_pc *e = pc_slot(t, p);
    if (!e) return nomem("pair counts");
    if ((e->count += d) != 0) return 0;
    size_t i = (size_t)(e - t->pc), j = i;
    for (;;) {
        j = (j + 1) & t->pcmask;
        if (!t->pc[j].key) break;
        size_t k = pc_hash(t->pc[j].key) & t->pcmask; /* its home: it stays when home lies in (i, j] */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        t->pc[i] = t->pc[j];
        i = j;
    }
    t->pc[i] = (tks__bt_pc){0, 0};
    t->pcn--;
    return 0;
}

/* ---------------------------------------------------------------------------
 * The heap (BpeTrainer's OctonaryHeap of Merge: a max-heap by count, then
 * by the lower pair) and the entries' word lists
 * ------------------------------------------------------------------------- */
static inline int above(const tks__bt_ent *a, const tks__bt_ent *b) {
    return a->count != b->count ? a->count > b->count : a->pair < b->pair;
}

/* A 4-ary heap: a node's children in one or two cache lines, half the
 * levels of a binary heap (its pops were mostly waits for memory). */
static int heap_push(tks_bpe_trainer *t, tks__bt_ent e) {
    if (t->hn == t->hcap) {
        size_t cap = t->hcap ? 2 * t->hcap : 65536;
        if (tks_resize(&t->heap, cap, sizeof *t->heap)) return nomem("queue");
        t->hcap = cap;
    }
    size_t i = t->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!above(&e, &t->heap[p])) break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = e;
    return 0;
}

static tks__bt_ent heap_pop(tks_bpe_trainer *t) {
    tks__bt_ent top = t->heap[0], e = t->heap[--t->hn];
    size_t i = 0, n = t->hn;
    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= n) break;
        __builtin_prefetch(&t->heap[16 * i + 5]); /* the grandchildren */
        for (size_t k = c + 1; k < c + 4 && k < n; k++)
            if (above(&t->heap[k], &t->heap[best])) best = k;
        if (!above(&t->heap[best], &e)) break;
        t->heap[i] = t->heap[best];
        i = best;
    }
    if (n) t->heap[i] = e;
    return top;
}

static inline const uint32_t *ent_words(const tks__bt_ent *e) { return e->cap == 1 ? &e->w.one : e->w.p; }

static void ent_free(tks_bpe_trainer *t, tks__bt_ent *e) {
    if (e->cap > 1) {
        t->list_bytes -= (uint64_t)e->cap * sizeof *e->w.p + 16;
        free(e->w.p);
    }
    e->w.p = NULL;
    e->n = e->cap = 0;
}

/* count_pairs: every adjacent pair's count and the words it occurs in (the
 * words hold byte tokens only yet: pairs indexed by their two bytes, their
 * words back to back in csr), and the first entries of the heap. */
static int first_index(tks_bpe_trainer *t) {
    uint16_t *byte_of = malloc((size_t)t->n_tok * sizeof *byte_of);
    int64_t *count = calloc(65536, sizeof *count);
    uint32_t *nw = calloc(65536, sizeof *nw), *last = calloc(65536, sizeof *last);
    uint64_t *at = malloc(65537 * sizeof *at);
    int rc = byte_of && count && nw && last && at ? 0 : nomem("pair index");
    for (unsigned x = 0; !rc && x < 256; x++) byte_of[t->byte_id[x]] = (uint16_t)x;
    uint64_t total = 0;
    for (uint64_t w = 0; !rc && w < t->n_words; w++) {
        const uint32_t *s = t->sym + t->woff[w];
        for (uint32_t r = 0; r + 1 < t->wlen[w]; r++) {
            unsigned k = (unsigned)byte_of[s[r]] << 8 | byte_of[s[r + 1]];
            count[k] += (int64_t)t->wcnt[w];
            if (last[k] != w + 1) last[k] = (uint32_t)(w + 1), nw[k]++, total++;
        }
    }
    if (!rc && !(t->csr = malloc((total + 1) * sizeof *t->csr))) rc = nomem("pair index");
    t->csr_n = total + 1;
    uint64_t sum = 0;
    for (unsigned k = 0; !rc && k < 65536; k++) at[k] = sum, sum += nw[k], last[k] = 0;
    for (uint64_t w = 0; !rc && w < t->n_words; w++) {
        const uint32_t *s = t->sym + t->woff[w];
        for (uint32_t r = 0; r + 1 < t->wlen[w]; r++) {
            unsigned k = (unsigned)byte_of[s[r]] << 8 | byte_of[s[r + 1]];
            if (last[k] != w + 1) last[k] = (uint32_t)(w + 1), t->csr[at[k]++] = (uint32_t)w;
        }
    }
    for (unsigned k = 0; !rc && k < 65536; k++) { /* at[k] is now the end of pair k's words */
        if (!nw[k]) continue;
        uint64_t pair = (uint64_t)t->byte_id[k >> 8] << 32 | t->byte_id[k & 255];
        rc = pc_add(t, pair, count[k]);
        tks__bt_ent e = {count[k], pair, {.p = t->csr + at[k] - nw[k]}, nw[k], 0};
        if (!rc) rc = heap_push(t, e);
    }
    free(byte_of);
    free(count);
    free(nw);
    free(last);
    free(at);
    return rc;
}

/* ---------------------------------------------------------------------------
 * A merge step: the popped entry's words rewritten (Word::merge), on
 * several threads when they are many, each thread's changes in a sink of
 * its own, then put together in the order of the words
 * ------------------------------------------------------------------------- */
/* The words a pair with the new token gained, with the count it gained
 * there (BpeTrainer's where_to_update and the +1 changes). */
typedef struct bucket {
    uint64_t pair;
    int64_t delta;
    uint32_t *w, n, cap;
} bucket;

/* per id x: an index at[x], valid when stamp[x] is the step's */
typedef struct stamped {
    uint32_t *stamp, *at;
} stamped;

typedef struct sink {
    /* [0] and [1]: per id x, the bucket of (x, new) and of (new, x) this step;
     * (new, new) is always on the right */
    stamped side[2];
    /* [0] and [1]: per id x, the -1 changes of (x, left) and of (right, x), summed this step
     * (a pair met on both sides is taken off twice, once for each side's sum, as it should) */
    stamped neg[2];
    uint32_t stamp;
    bucket *bk;
    size_t nbk, bkcap;
    uint64_t *dp;   /* the -1 changes: pairs, and the counts to take off, summed by pair */
    int64_t *dc;
    size_t nd, dcap;
    int oom;
} sink;

static void sink_free(sink *s) {
    for (int k = 0; k < 2; k++) {
        free(s->side[k].stamp);
        free(s->side[k].at);
        free(s->neg[k].stamp);
        free(s->neg[k].at);
    }
    for (size_t i = 0; i < s->nbk; i++) free(s->bk[i].w);
    free(s->bk);
    free(s->dp);
    free(s->dc);
}

static int stamped_init(stamped *m, uint32_t ids) {
    m->stamp = calloc(ids, sizeof *m->stamp);
    m->at = malloc(ids * sizeof *m->at);
    return m->stamp && m->at ? 0 : -1;
}

static int sink_init(sink *s, uint32_t ids) {
    memset(s, 0, sizeof *s);
    int rc = 0;
    for (int k = 0; k < 2; k++) rc |= stamped_init(&s->side[k], ids) | stamped_init(&s->neg[k], ids);
    return rc;
}

/* The sink's bucket of (x, new) (right = 0) or (new, x) (right = 1) this
 * step; a new one, *fresh set and left for the caller to fill, when there is
 * none yet. NULL: out of memory. */
static inline bucket *side_bucket(sink *s, uint32_t x, int right, int *fresh) {
    stamped *m = &s->side[right];
    *fresh = m->stamp[x] != s->stamp;
    if (!*fresh) return &s->bk[m->at[x]];
    if (s->nbk == s->bkcap) {
        size_t cap = s->bkcap ? 2 * s->bkcap : 256;
        if (tks_resize(&s->bk, cap, sizeof *s->bk)) return NULL;
        s->bkcap = cap;
    }
    m->stamp[x] = s->stamp;
    m->at[x] = (uint32_t)s->nbk;
    return &s->bk[s->nbk++];
}

/* -c for pair (a, b); x is the id that varies: a on the left side (b the
 * merged pair's left), b on the right side (a its right). */
static inline void dec(sink *s, uint32_t a, uint32_t b, int right, int64_t c) {
    uint32_t x = right ? b : a, *stamp = s->neg[right].stamp, *at = s->neg[right].at;
    if (stamp[x] == s->stamp) {
        s->dc[at[x]] += c;
        return;
    }
    if (s->nd == s->dcap) {
        size_t cap = s->dcap ? 2 * s->dcap : 4096;
        if (tks_resize(&s->dp, cap, sizeof *s->dp) || tks_resize(&s->dc, cap, sizeof *s->dc)) {
            s->oom = 1;
            return;
        }
        s->dcap = cap;
    }
    stamp[x] = s->stamp;
    at[x] = (uint32_t)s->nd;
    s->dp[s->nd] = (uint64_t)a << 32 | b;
    s->dc[s->nd++] = c;
}

/* +c for pair (x, nw) (right = 0) or (nw, x) (right = 1) in word w */
static inline void inc(sink *s, uint32_t x, uint32_t nw, int right, uint32_t w, int64_t c) {
    if (!right && x == nw) right = 1;
    int fresh;
    bucket *b = side_bucket(s, x, right, &fresh);
    if (!b) {
        s->oom = 1;
        return;
    }
    if (fresh) *b = (bucket){right ? (uint64_t)nw << 32 | x : (uint64_t)x << 32 | nw, 0, NULL, 0, 0};
    b->delta += c;
    if (b->n && b->w[b->n - 1] == w) return;
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 4;
        if (tks_resize(&b->w, cap, sizeof *b->w)) {
            s->oom = 1;
            return;
        }
        b->cap = cap;
    }
    b->w[b->n++] = w;
}

/* Word::merge of (a, b) into nw in word w, its changes into s. */
static void merge_word(tks_bpe_trainer *t, sink *s, uint32_t w, uint32_t a, uint32_t b, uint32_t nw) {
    uint32_t *x = t->sym + t->woff[w];
    uint32_t n = t->wlen[w], r = 0, o = 0;
    int64_t c = (int64_t)t->wcnt[w];
    while (r + 1 < n && !(x[r] == a && x[r + 1] == b)) r++; /* nothing changes before the first */
    o = r;
    while (r + 1 < n) {
        if (x[r] == a && x[r + 1] == b) {
            if (o > 0) {
                dec(s, x[o - 1], a, 0, c);
                inc(s, x[o - 1], nw, 0, w, c);
            }
            if (r + 2 < n) {
                dec(s, b, x[r + 2], 1, c);
                inc(s, x[r + 2], nw, 1, w, c);
            }
            x[o++] = nw;
            r += 2;
        } else {
            x[o++] = x[r++];
        }
    }
    if (r < n) x[o++] = x[r];
    t->wlen[w] = o;
}

/* Sink k's buckets joined into the first sink's, found by its stamps. */
static int join_sink(sink *z, sink *s, uint32_t nw) {
    for (size_t i = 0; i < s->nbk; i++) {
        bucket *b = &s->bk[i];
        uint32_t hi = (uint32_t)(b->pair >> 32), lo = (uint32_t)b->pair;
        int right = hi == nw; /* (nw, lo); else (hi, nw) */
        int fresh;
        bucket *to = side_bucket(z, right ? lo : hi, right, &fresh);
        if (!to) return nomem("merge step");
        if (fresh) {
            *to = *b;
            *b = (bucket){0, 0, NULL, 0, 0};
            continue;
        }
        to->delta += b->delta;
        if (to->n + b->n > to->cap) {
            uint32_t cap = to->n + b->n;
            uint32_t *w = realloc(to->w, cap * sizeof *w);
            if (!w) return nomem("merge step");
            to->w = w;
            to->cap = cap;
        }
        memcpy(to->w + to->n, b->w, b->n * sizeof *b->w);
        to->n += b->n;
    }
    for (size_t i = 0; i < s->nbk; i++) free(s->bk[i].w);
    s->nbk = 0;
    return 0;
}

/* The sinks' changes into the counts, in thread order, and an entry for
 * each pair that gained words and has a positive count (the buckets of all
 * sinks joined by pair, in the order the pairs appear in the words, each
 * one's words ascending). */
static int apply_step(tks_bpe_trainer *t, sink *s, int ns, uint32_t nw) {
    for (int k = 0; k < ns; k++) {
        if (s[k].oom) return nomem("merge step");
        for (size_t i = 0; i < s[k].nd; i++) {
            int rc = pc_add(t, s[k].dp[i], -s[k].dc[i]);
            if (rc) return rc;
        }
        s[k].nd = 0;
    }
    sink *z = &s[0];
    for (int k = 1; k < ns; k++) {
        int rc = join_sink(z, &s[k], nw);
        if (rc) return rc;
    }
    int rc = 0;
    for (size_t i = 0; i < z->nbk && !rc; i++) rc = pc_add(t, z->bk[i].pair, z->bk[i].delta);
    for (size_t i = 0; i < z->nbk && !rc; i++) {
        bucket *b = &z->bk[i];
        int64_t c = pc_get(t, b->pair);
        if (c <= 0) continue;
        tks__bt_ent e = {c, b->pair, {.p = b->w}, b->n, b->cap};
        if (b->n == 1) { /* one word: kept in the entry */
            e.w.one = b->w[0];
            e.cap = 1;
        } else {
            t->list_bytes += (uint64_t)b->cap * sizeof *b->w + 16; /* and malloc's header */
            b->w = NULL;
        }
        rc = heap_push(t, e);
        if (rc && e.cap > 1) ent_free(t, &e);
    }
    for (size_t i = 0; i < z->nbk; i++) free(z->bk[i].w);
    z->nbk = 0;
    return rc;
}

/* A step rewrites its words on several threads from this many words on:
 * the first merges of a large corpus (up to millions of words each), whose
 * work dwarfs waking the threads. Not below: thousands of steps of a few
 * thousand words gained nothing on 2 threads, and on a machine whose cores
 * other jobs share each parallel step can wait a scheduler slice for a
 * descheduled thread (Linux's Documentation/ at vocabulary 8,000 beside
 * other jobs: merges 0.7 s on one thread, 5.3 s on two with 2,048). */
#define PARALLEL_WORDS 16384

/* The merge of (a, b) into nw over the words w[0..n): on the calling
 * thread, or split in ns parts of consecutive words on ns threads. */
static int merge_words(tks_bpe_trainer *t, sink *s, int ns, const uint32_t *w, uint32_t n, uint32_t a, uint32_t b,
                       uint32_t nw) {
    if (ns > 1 && n >= PARALLEL_WORDS) {
#pragma omp parallel num_threads(ns)
        {
            int k = omp_get_thread_num(), m = omp_get_num_threads();
            size_t lo = (size_t)n * (size_t)k / (size_t)m, hi = (size_t)n * (size_t)(k + 1) / (size_t)m;
            for (size_t i = lo; i < hi; i++) merge_word(t, &s[k], w[i], a, b, nw);
        }
    } else {
        ns = 1;
        for (uint32_t i = 0; i < n; i++) merge_word(t, &s[0], w[i], a, b, nw);
    }
    return apply_step(t, s, ns, nw);
}

/* The id of the token a's bytes then b's, made when it is not one yet. */
static int merged_id(tks_bpe_trainer *t, uint32_t a, uint32_t b, uint32_t *id) {
    size_t la = t->toff[a + 1] - t->toff[a], lb = t->toff[b + 1] - t->toff[b];
    char stack[256], *buf = la + lb <= sizeof stack ? stack : malloc(la + lb);
    if (!buf) return nomem("vocabulary");
    memcpy(buf, t->tb + t->toff[a], la);
    memcpy(buf + la, t->tb + t->toff[b], lb);
    int rc = 0;
    *id = vmap_find(t, buf, la + lb, NULL);
    if (*id == TKS_NO_ID && !(rc = tok_push(t, buf, la + lb, 0))) *id = t->n_tok - 1;
    if (buf != stack) free(buf);
    return rc;
}

static int record_merge(tks_bpe_trainer *t, uint32_t a, uint32_t b, uint32_t id) {
    if (t->n_mg == t->mg_cap) {
        uint64_t cap = t->mg_cap ? 2 * t->mg_cap : 4096;
        if (tks_resize(&t->mg, 3 * cap, sizeof *t->mg)) return nomem("merges");
        t->mg_cap = cap;
    }
    uint32_t *m = t->mg + 3 * t->n_mg++;
    m[0] = a, m[1] = b, m[2] = id;
    return 0;
}

/* The merges tokenizers saves: its merge map keeps a pair's last rank. */
static int mark_saved(tks_bpe_trainer *t) {
    size_t cap = tks__bpe_pow2(2 * (size_t)t->n_mg + 2);
    uint64_t *set = calloc(cap, sizeof *set);
    t->keep = malloc(t->n_mg + 1);
    if (!set || !t->keep) return free(set), nomem("merges");
    t->n_saved = 0;
    for (uint64_t i = t->n_mg; i-- > 0;) {
        uint64_t key = ((uint64_t)t->mg[3 * i] << 32 | t->mg[3 * i + 1]) + 1;
        size_t j = pc_hash(key) & (cap - 1);
        while (set[j] && set[j] != key) j = (j + 1) & (cap - 1);
        t->keep[i] = !set[j];
        t->n_saved += !set[j];
        set[j] = key;
    }
    free(set);
    return 0;
}

/* The bytes the trainer's tables hold now (the sinks' own included), kept
 * as the peak: what tks_bpe_trainer_memory's estimate is checked against. */
static void note_held(tks_bpe_trainer *t, const sink *s, int ns, uint32_t ids) {
    uint64_t b = t->sym_cap * 4 + t->words_cap * 20 + t->csr_n * 4 + t->list_bytes + t->hcap * sizeof *t->heap +
                 (t->pc ? (t->pcmask + 1) * sizeof *t->pc : 0) + t->tb_cap + (uint64_t)t->tok_cap * 9 +
                 (t->vmask + 1) * 4 + t->mg_cap * 12;
    for (int k = 0; s && k < ns; k++) {
        b += (uint64_t)ids * 32 + s[k].bkcap * sizeof(bucket) + s[k].dcap * 16;
        for (size_t i = 0; i < s[k].nbk; i++) b += (uint64_t)s[k].bk[i].cap * 4;
    }
    if (b > t->peak) t->peak = b;
}

/* BpeTrainer::do_train's loop, step 5. */
static int merge_loop(tks_bpe_trainer *t, sink *s, int ns, uint32_t ids, tks_bpe_train_progress_fn progress,
                      void *ctx, volatile sig_atomic_t *stop) {
    uint32_t step = 0;
    uint64_t target = t->vocab_size > t->n_tok ? t->vocab_size - t->n_tok : 0;
    int rc = 0;
    while (!rc && t->n_tok < t->vocab_size && t->hn) {
        tks__bt_ent top = heap_pop(t);
        int64_t cur = pc_get(t, top.pair);
        if (top.count != cur) { /* stale: back with the pair's count, same words */
            top.count = cur;
            rc = heap_push(t, top);
            continue;
        }
        if (top.count < 1 || (uint64_t)top.count < t->min_frequency) {
            ent_free(t, &top);
            break;
        }
        uint32_t a = (uint32_t)(top.pair >> 32), b = (uint32_t)top.pair, id = 0;
        rc = merged_id(t, a, b, &id);
        if (!rc) rc = record_merge(t, a, b, id);
        step++;
        for (int k = 0; k < ns; k++) s[k].stamp = step;
        if (!rc) rc = merge_words(t, s, ns, ent_words(&top), top.n, a, b, id);
        if (t->n_mg % 64 == 0) note_held(t, s, ns, ids);
        ent_free(t, &top);
        if (!rc && t->n_mg % 1000 == 0) {
            if (progress) progress(ctx, t->n_mg, target);
            if (stop && *stop)
                rc = tks_fail(TKS_ERR_INTERRUPTED, NULL, TKS_NONE, TKS_NONE,
                              "interrupted after %llu merges", (unsigned long long)t->n_mg);
        }
    }
    if (!rc && progress) progress(ctx, t->n_mg, target);
    return rc;
}

int tks_bpe_trainer_run(tks_bpe_trainer *t, tks_bpe_train_progress_fn progress, void *ctx,
                        volatile sig_atomic_t *stop) {
    if (!t || t->ran) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_trainer_run: %s",
                                      t ? "already trained" : "NULL trainer");
    t->ran = 1;
    int ns = t->threads, rc = first_index(t);
    uint32_t ids = t->vocab_size > t->n_tok ? t->vocab_size : t->n_tok;
    sink *s = rc ? NULL : calloc((size_t)ns, sizeof *s);
    if (!rc && !s) rc = nomem("merge step");
    for (int k = 0; !rc && k < ns; k++)
        if (sink_init(&s[k], ids)) rc = nomem("merge step");
    if (!rc) note_held(t, s, ns, ids);
    if (!rc) rc = merge_loop(t, s, ns, ids, progress, ctx, stop);
    for (int k = 0; s && k < ns; k++) sink_free(&s[k]);
    free(s);
    /* what training alone needed goes */
    for (size_t i = 0; t->heap && i < t->hn; i++) ent_free(t, &t->heap[i]);
    free(t->csr);
    free(t->heap);
    free(t->pc);
    free(t->sym);
    t->csr = NULL, t->heap = NULL, t->pc = NULL, t->sym = NULL;
    t->hn = t->hcap = 0;
    if (!rc) rc = mark_saved(t);
    return rc;
}

uint32_t tks_bpe_trainer_vocab_size(const tks_bpe_trainer *t) { return t->n_tok; }
uint64_t tks_bpe_trainer_merges(const tks_bpe_trainer *t) { return t->n_saved; }
uint64_t tks_bpe_trainer_peak(const tks_bpe_trainer *t) { return t->peak; }
