/*
 * bpe_pieces.c - a pre-tokenizer without a vocabulary (tks_pretok,
 * tokenizer.h): the pieces byte-level BPE cuts a text into before any merge,
 * for training. The same cuts as the encoder's (bpe.c): the hand matchers of
 * bpe_pretok.c and the bit-mask windows of bpe_pretok_win.c for text within
 * the Basic Multilingual Plane under one of the named patterns, PCRE2 for
 * everything else, with the splitter compiled and checked by bpe_build.c as
 * a tokenizer.json's Split is. A piece is a match or the text between two
 * matches (Hugging Face tokenizers' Split with behavior Isolated).
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_encoder.h"

struct tks_pretok {
    tks_bpe *b;      /* one splitter, no vocabulary: its regex, hand matcher and scratch */
    char *name;      /* the pattern's name, or NULL for a regex */
    char *regex;     /* the regex the pieces follow */
};

/* The named patterns: gpt2 is tokenizers' ByteLevel regex (GPT-2's, which
 * the hand matcher reads as tiktoken's r50k); the others tiktoken's and
 * Meta's (bpe_patterns.c). */
static const char *named_regex(const char *name) {
    if (!strcmp(name, "gpt2")) return tks__bpe_gpt2_pattern;
    static const char *const other[] = {"llama3", "cl100k", "o200k", "qwen2"};
    for (size_t i = 0; i < sizeof other / sizeof *other; i++)
        if (!strcmp(name, other[i])) return tks_tiktoken_pattern(name);
    return NULL;
}

void tks_pretok_free(tks_pretok *p) {
    if (!p) return;
    tks_bpe_free(p->b);
    free(p->name);
    free(p->regex);
    free(p);
}

int tks_pretok_open(const char *pattern, tks_pretok **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_pretok_open: NULL argument");
    *out = NULL;
    if (!pattern || !*pattern)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "no pre-tokenizer pattern: name one (gpt2, llama3, cl100k, o200k, qwen2) or give a regex");
    tks_pretok *p = calloc(1, sizeof *p);
    const char *rx = named_regex(pattern);
    if (!p || !(p->regex = strdup(rx ? rx : pattern)) || (rx && !(p->name = strdup(pattern))) ||
        !(p->b = tks__bpe_new("--pattern"))) {
        tks_pretok_free(p);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (pre-tokenizer)");
    }
    /* cl100k's \s++$ is the end of the text, as tiktoken's Rust regex reads it */
    uint32_t extra = p->name && !strcmp(p->name, "cl100k") ? PCRE2_DOLLAR_ENDONLY : 0;
    int rc = tks__bpe_compile(p->b, p->regex, strlen(p->regex), 0, extra, "--pattern");
    if (!rc) rc = tks__bpe_scratch_init(p->b);
    if (!rc && p->b->split[0].fast && tks__bpe_fast_init() == 0) p->b->fast = p->b->split[0].fast;
    if (rc) {
        tks_pretok_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

const char *tks_pretok_name(const tks_pretok *p) { return p->name; }
const char *tks_pretok_regex(const tks_pretok *p) { return p->regex; }
int tks_pretok_hand_matched(const tks_pretok *p) { return p->b->fast != TKS__FAST_NONE; }

size_t tks_pretok_next_cut(const tks_pretok *p, const char *t, size_t len, size_t from) {
    return tks_bpe_next_cut(p->b, t, len, from);
}

enum { RUN = 256 };

/* t[0..n) through PCRE2: matches and the gaps between them, in runs. */
static int regex_pieces(const tks_pretok *p, const char *t, size_t n, tks_pretok_fn fn, void *ctx) {
    scratch *s = tks__bpe_scratch_get(p->b);
    if (!s) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the pre-tokenizer's scratch");
    const tks__bpe_splitter *sp = &p->b->split[0];
    /* PCRE2's match limit as the encoder's (bpe.c): 10^6 steps plus 256 a byte */
    uint64_t lim = 1000000 + 256 * (uint64_t)n;
    pcre2_set_match_limit(s->mc, lim > UINT32_MAX ? UINT32_MAX : (uint32_t)lim);
    size_t ends[RUN], m = 0, start = 0, pos = 0;
    int rc = 0;
    while (pos < n && !rc) {
        int mr = pcre2_match(sp->re, (PCRE2_SPTR)t, n, pos, PCRE2_NO_UTF_CHECK, s->md, s->mc);
        size_t ms = n, me = n;
        if (mr >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            ms = ov[0], me = ov[1];
        } else if (mr == PCRE2_ERROR_MATCHLIMIT) {
            return tks_fail(TKS_ERR_TOKENIZER, NULL, TKS_NONE, TKS_NONE,
                            "the pre-tokenizer regex /%s/ backtracks without bound on a %zu-byte text (PCRE2's "
                            "match limit of %llu steps reached at byte %zu): make the nested repetition "
                            "possessive or atomic",
                            sp->text, n, (unsigned long long)lim, pos);
        } else if (mr != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(mr, msg, sizeof msg);
            return tks_fail(mr == PCRE2_ERROR_NOMEMORY || mr == PCRE2_ERROR_JIT_STACKLIMIT ? TKS_ERR_NOMEM
                                                                                           : TKS_ERR_TOKENIZER,
                            NULL, TKS_NONE, TKS_NONE, "the pre-tokenizer regex failed on a %zu-byte text: %s", n,
                            (const char *)msg);
        }
        if (ms > pos) ends[m++] = ms; /* the gap before the match */
        if (me > ms) ends[m++] = me;
        pos = me;
        if (m >= RUN - 1) {
            rc = fn(ctx, t, start, ends, m);
            start = ends[m - 1];
            m = 0;
        }
    }
    return !rc && m ? fn(ctx, t, start, ends, m) : rc;
}

int tks_pretok_pieces(const tks_pretok *p, const char *t, size_t n, tks_pretok_fn fn, void *ctx) {
    if (!n) return 0;
    if (p->b->fast == TKS__FAST_NONE || !tks__bpe_fast_bmp(t, n)) return regex_pieces(p, t, n, fn, ctx);
    size_t ends[RUN];
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        size_t m = tks__bpe_fast_ends(p->b->fast, t, n, i, ends, RUN);
        rc = fn(ctx, t, i, ends, m);
        i = ends[m - 1];
    }
    return rc;
}
