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
 * and each thread keeps caches of the other pieces (bpe_wcache.h). The merge
 * engines are bpe_merge.c's, the per-thread scratch bpe_scratch.c's, the cut
 * rule of long documents bpe_cut.c's (bpe_encoder.h maps the files).
 *
 * Thread safety: a loaded handle is immutable apart from per-thread scratch
 * (PCRE2 match data, JIT stack, symbol and heap arrays, the word cache)
 * created on a thread's first encode and owned by the handle, and the
 * per-token memo, which every thread fills with the same values through
 * relaxed atomics.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "tokenizer/bpe_pcache.h"
#include "tokenizer/bpe_wcache.h"

static int bpe_piece_k(enc *e, const char *t, size_t n, const ckey *k);

/* One pre-token (raw bytes) through the vocab, the cache and the BPE model. */
static int bpe_piece(enc *e, const char *t, size_t n) {
    ckey k = {0};
    int rc = e->ref ? 0 : tks__bpe_wcache_on(e);
    if (rc < 0) return rc;
    if (!e->ref) tks__bpe_piece_key(e, t, n, &k);
    return bpe_piece_k(e, t, n, &k);
}

static int bpe_piece_k(enc *e, const char *t, size_t n, const ckey *k) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    if (e->ref) {
        uint32_t id = b->ignore_merges ? tks__bpe_vocab_find(b, t, n) : TKS_NO_ID;
        return id != TKS_NO_ID      ? tks__bpe_push_id(e, id)
               : n <= REF_MAX_PIECE ? tks__bpe_merge_ref(e, t, n)
                                    : tks__bpe_merge_heap(e, t, n);
    }
    s->st.words++;
    s->st.bytes += n;
    /* a piece that is a token: that token (ignore_merges), or, with merges,
     * when BPE of the token's bytes is known to give it */
    uint32_t id = tks__bpe_vocab_find_h(b, t, n, k->h);
    if (id != TKS_NO_ID && (b->ignore_merges || __atomic_load_n(&b->self[id], __ATOMIC_RELAXED) == 1)) {
        s->st.word_hits++;
        s->st.hit_bytes += n;
        return tks__bpe_push_id(e, id);
    }
    wslot w;
    int hit = tks__bpe_wcache_get(e, t, n, k, &w);
    if (hit) return hit < 0 ? hit : 0;
    size_t first = e->out->n;
    int rc = n <= SMALL_PIECE ? tks__bpe_merge_small(e, t, n) : tks__bpe_merge_heap(e, t, n);
    if (!rc && id != TKS_NO_ID)
        __atomic_store_n(&b->self[id], (uint8_t)(e->out->n - first == 1 && e->out->ids[first] == id ? 1 : 2),
                         __ATOMIC_RELAXED);
    /* a piece of bytes without a token gives no id (and out->ids may be NULL) */
    if (!rc) tks__bpe_wcache_put(e, &w, t, n, k, e->out->n > first ? e->out->ids + first : NULL, e->out->n - first);
    return rc;
}

/* ---------------------------------------------------------------------------
 * The hand matcher's pieces, in runs
 * ------------------------------------------------------------------------- */
/* Pieces a run: their ends from the hand matcher, then their keys, and the
 * seed lines fetched, before any is looked up, so that the lookups of a run
 * wait for memory together. */
#define RUN 128

/* A short piece neither table holds: merged, then cached in the thread's
 * table when its ids fit a slot (else the long-piece path's caches take it). */
static int short_miss(enc *e, const char *t, size_t n, pkey k, uint64_t h) {
    size_t first = e->out->n;
    int rc = tks__bpe_merge_small(e, t, n);
    size_t m = e->out->n - first;
    if (!rc && m >= 1 && m <= PSLOT_IDS) pc_put(e->s->pc, PC_BITS, k, h, e->out->ids + first, m);
    else if (!rc && m > PSLOT_IDS) { /* rare: kept by the longer pieces' word cache */
        ckey ck;
        wslot w;
        size_t after = e->out->n;
        tks__bpe_piece_key(e, t, n, &ck);
        int hit = tks__bpe_wcache_get(e, t, n, &ck, &w);
        if (hit < 0) return hit;
        if (hit) e->out->n = after; /* its ids were appended again */
        else tks__bpe_wcache_put(e, &w, t, n, &ck, e->out->ids + first, m);
    }
    return rc;
}

/* The text t[0..n) (within the BMP) cut by the hand matcher, each piece
 * through the tables: a short piece (up to PKEY_MAX bytes) the seed or the
 * thread's cache, else merged; a longer one bpe_piece's path. */
static int fast_pieces(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    int rc = tks__bpe_wcache_on(e);
    if (rc <= 0) { /* no caches: the vocabulary and the merges, a piece at a time */
        for (size_t i = 0, j; rc == 0 && i < n; i = j) {
            j = tks__bpe_fast_next(b->fast, t, n, i);
            rc = bpe_piece(e, t + i, j - i);
        }
        return rc;
    }
    rc = 0;
    size_t ends[RUN];
    pkey key[RUN];
    uint64_t hash[RUN];
    const pslot *hit[RUN];
    const char *end = t + n;
    e->tend = end;
    for (size_t i = 0; i < n && !rc;) {
        size_t m = tks__bpe_fast_ends(b->fast, t, n, i, ends, RUN);
        /* the short pieces' keys, their hot lines fetched */
        for (size_t j = 0, a = i; j < m; a = ends[j++]) {
            size_t len = ends[j] - a;
            if (len > PKEY_MAX) continue;
            key[j] = pkey_of(t + a, len, end);
            hash[j] = pkey_hash(key[j]);
            __builtin_prefetch(&s->hot[2 * (hash[j] >> (64 - HOT_BITS))]);
        }
        /* looked up among the hot pieces; the others' lines in the seed and
         * the thread's cache fetched */
        for (size_t j = 0, a = i; j < m; a = ends[j++]) {
            if (ends[j] - a > PKEY_MAX) continue;
            hit[j] = pc_find(s->hot, HOT_BITS, key[j], hash[j]);
            if (hit[j]) continue;
            __builtin_prefetch(&b->seed[2 * (hash[j] >> (64 - b->seed_bits))]);
            __builtin_prefetch(&s->pc[2 * (hash[j] >> (64 - PC_BITS))]);
        }
        if ((rc = tks__bpe_out_reserve(e, m * PSLOT_IDS))) break;
        uint64_t shorts = 0, short_bytes = 0, hits = 0, hit_bytes = 0;
        for (size_t j = 0, a = i; j < m && !rc; a = ends[j++]) {
            size_t len = ends[j] - a;
            if (len > PKEY_MAX) { /* counted by bpe_piece_k */
                rc = bpe_piece(e, t + a, len);
                if (!rc) rc = tks__bpe_out_reserve(e, (m - j) * PSLOT_IDS);
                continue;
            }
            shorts++;
            short_bytes += len;
            /* a hot slot found above holds this piece still unless a piece
             * since was put in its line */
            const pslot *p = hit[j] && pslot_is(hit[j], key[j]) ? hit[j] : pc_find(s->hot, HOT_BITS, key[j], hash[j]);
            if (!p && ((p = seed_find(b, key[j], hash[j])) || (p = pc_find(s->pc, PC_BITS, key[j], hash[j]))))
                pc_put(s->hot, HOT_BITS, key[j], hash[j], p->id, p->n);
            if (p) { /* a slot's ids stored whole, counted by n */
                memcpy(e->out->ids + e->out->n, p->id, sizeof p->id);
                e->out->n += p->n;
                hits++;
                hit_bytes += len;
            } else {
                rc = short_miss(e, t + a, len, key[j], hash[j]);
                if (!rc) rc = tks__bpe_out_reserve(e, (m - j) * PSLOT_IDS);
            }
        }
        s->st.words += shorts;
        s->st.bytes += short_bytes;
        s->st.word_hits += hits;
        s->st.hit_bytes += hit_bytes;
        i = ends[m - 1];
    }
    e->tend = NULL;
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
    if (b->fast && !e->ref && tks__bpe_fast_bmp(t, n)) return fast_pieces(e, t, n);
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
        if (!rc) rc = tks__bpe_push_id(e, a->id);
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
#if defined(__SSE2__)
        if (i + 32 <= len) { /* ASCII 32 bytes at a time */
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            if (!_mm_movemask_epi8(_mm_or_si128(a, b))) {
                i += 32;
                continue;
            }
        }
#endif
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
    enc e = {b, tks__bpe_scratch_get(b), out, ref, NULL};
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

int tks_bpe_encode_doc(const tks_bpe *b, const char *text, size_t len, tks_ids *out, uint64_t *unassigned) {
    if (unassigned) *unassigned = 0;
    return encode(b, text, len, out, 0, 0, unassigned);
}

int tks_bpe_encode_part(const tks_bpe *b, const char *text, size_t len, tks_ids *out, uint64_t *unassigned) {
    if (unassigned) *unassigned = 0;
    return encode(b, text, len, out, 0, 1, unassigned);
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

void tks_bpe_free(tks_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_split; i++) {
        pcre2_code_free(b->split[i].re);
        free(b->split[i].pat);
    }
    tks__bpe_scratch_free(b);
    if (b->cache_map) {
        tks_unmap(b->cache_map, b->cache_len);
    } else {
        free(b->off);
        free(b->bytes);
        free(b->special);
        free(b->vslot);
        free(b->mslot);
        free(b->mq);
        free(b->added_raw.tok);
        free(b->added_norm.tok);
        free(b->added_text);
    }
    if (!b->cache_map) tks_free_table(b->seed, b->seed ? ((size_t)2 << b->seed_bits) * sizeof(pslot) : 0);
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
