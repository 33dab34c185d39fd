/*
 * bpe_pretok.c - the pre-tokenizer regexes of the common byte-level BPE
 * tokenizers, matched by hand: the same pieces as PCRE2 gives for the same
 * pattern (which remains the reference, and the engine for every other
 * pattern), several times faster.
 *
 * Patterns (their text must be exactly one of these; bpe_tiktoken.c and
 * bpe_load.c name their sources):
 *   GPT2    tokenizers' ByteLevel regex, and tiktoken's r50k_pat_str, which
 *           reads the same way: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *           ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   QWEN2   LLAMA3 with \p{N} in place of \p{N}{1,3}
 *   CL100K  LLAMA3 with \s++$ before \s*[\r\n] (a whitespace run that ends
 *           the text is one piece); its possessive quantifiers change nothing
 *           here (what follows each cannot match what it gave back)
 *   O200K   [^\r\n\p{L}\p{N}]?[UP]*[LO]+(?i:'s|...)?|[^\r\n\p{L}\p{N}]?[UP]+
 *           [LO]*(?i:'s|...)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
 *           \s*[\r\n]+|\s+(?!\S)|\s+   (UP = Lu Lt Lm Lo M, LO = Ll Lm Lo M)
 * Every one of them matches at every position (letters, numbers, other
 * characters and whitespace each have an alternative), so the pieces tile
 * the text and the matcher only has to find where each ends, following the
 * regex's alternatives in order and its backtracking where it matters.
 *
 * Character classes come from PCRE2 itself: at first use, every code point
 * of the Basic Multilingual Plane is matched against \p{L}, \p{N}, \s, the
 * two o200k classes and the caseless letters of the contractions, so the
 * hand matcher classifies exactly as the PCRE2 build at hand does (Unicode
 * tables are PCRE2's, never tokshard's). Text with a code point above U+FFFF
 * goes to PCRE2 (the caller checks: tks__bpe_fast_bmp).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_internal.h"

enum { C_L = 1, C_N = 2, C_S = 4, C_UP = 8, C_LO = 16, C_CRLF = 32 };

static uint8_t *g_cls;   /* (65536) class bits of each BMP code point */
static uint8_t *g_fold;  /* (65536) the ASCII letter of s t r e v m l d it matches caselessly, or 0 */
static int g_rc;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Marks, in tab, every code point of the UTF-8 text `all` that `pat`
 * matches (one code point at a time, in runs). */
static int mark(const char *pat, const char *all, size_t n, uint8_t *tab, uint8_t value, int or_bits) {
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    if (!re) return TKS_ERR_TOKENIZER;
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) {
        pcre2_code_free(re);
        return TKS_ERR_NOMEM;
    }
    size_t pos = 0;
    while (pos < n && pcre2_match(re, (PCRE2_SPTR)all, n, pos, PCRE2_NO_UTF_CHECK, md, NULL) >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        for (size_t i = ov[0]; i < ov[1];) {
            unsigned c = (unsigned char)all[i], cp, k;
            if (c < 0x80) cp = c, k = 1;
            else if (c < 0xE0) cp = (c & 0x1F) << 6 | ((unsigned char)all[i + 1] & 0x3F), k = 2;
            else if (c < 0xF0)
                cp = (c & 0x0F) << 12 | ((unsigned char)all[i + 1] & 0x3F) << 6 | ((unsigned char)all[i + 2] & 0x3F),
                k = 3;
            else
                cp = (c & 0x07) << 18 | ((unsigned char)all[i + 1] & 0x3F) << 12 |
                         ((unsigned char)all[i + 2] & 0x3F) << 6 | ((unsigned char)all[i + 3] & 0x3F),
                k = 4;
            tab[cp] = (uint8_t)(or_bits ? tab[cp] | value : value);
            i += k;
        }
        pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return 0;
}

static void build_tables(void) {
    g_cls = calloc(65536, 1);
    g_fold = calloc(65536, 1);
    char *all = malloc(65536 * 3);
    if (!g_cls || !g_fold || !all) {
        g_rc = TKS_ERR_NOMEM;
        free(all);
        return;
    }
    size_t n = 0;
    for (unsigned cp = 1; cp < 0x10000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (cp < 0x80) {
            all[n++] = (char)cp;
        } else if (cp < 0x800) {
            all[n++] = (char)(0xC0 | cp >> 6);
            all[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            all[n++] = (char)(0xE0 | cp >> 12);
            all[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            all[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    static const struct { const char *pat; uint8_t bit; } C[] = {
        {"\\p{L}+", C_L}, {"\\p{N}+", C_N}, {"\\s+", C_S},
        {"[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+", C_UP}, {"[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+", C_LO},
        {"[\\r\\n]+", C_CRLF}};
    int rc = 0;
    for (size_t i = 0; !rc && i < sizeof C / sizeof *C; i++) rc = mark(C[i].pat, all, n, g_cls, C[i].bit, 1);
    static const char letters[] = "strevmld";
    for (const char *l = letters; !rc && *l; l++) {
        char pat[8] = {'(', '?', 'i', ')', *l, 0};
        rc = mark(pat, all, n, g_fold, (uint8_t)*l, 0);
    }
    free(all);
    g_rc = rc;
}

/* ---------------------------------------------------------------------------
 * Code points PCRE2's Unicode tables leave unassigned (\p{Cn}, less the
 * noncharacters, which no version assigns): a later Unicode may make them
 * letters or numbers, and a reference built on it (tokenizers, tiktoken)
 * then splits the text around them otherwise. Counted, not changed: the
 * build reports them. Learnt per code point as the text shows it (a table
 * of every code point, built at start, cost each process 8 ms).
 * ------------------------------------------------------------------------- */
static uint8_t *g_cn;    /* (0x110000) 0: not known yet, 1: assigned, 2: unassigned */
static pcre2_code *g_cn_re;
static pthread_once_t g_cn_once = PTHREAD_ONCE_INIT;

static void cn_init(void) {
    int err;
    PCRE2_SIZE eoff;
    g_cn_re = pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED,
                            &err, &eoff, NULL);
    /* zero pages until a code point of theirs is learnt */
    if (g_cn_re && !(g_cn = calloc(0x110000, 1))) {
        pcre2_code_free(g_cn_re);
        g_cn_re = NULL;
    }
}

uint8_t *tks__bpe_unassigned_table(void) {
    pthread_once(&g_cn_once, cn_init);
    return g_cn;
}

int tks__bpe_unassigned_learn(uint32_t cp, const char *utf8, size_t k) {
    int v = 1;
    int nonchar = (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFE) == 0xFFFE;
    pcre2_match_data *md = nonchar ? NULL : pcre2_match_data_create(1, NULL);
    if (md) {
        v = pcre2_match(g_cn_re, (PCRE2_SPTR)utf8, k, 0, PCRE2_NO_UTF_CHECK, md, NULL) >= 0 ? 2 : 1;
        pcre2_match_data_free(md);
    } else if (!nonchar) {
        return 1; /* out of memory: not counted, not remembered */
    }
    __atomic_store_n(&g_cn[cp], (uint8_t)v, __ATOMIC_RELAXED);
    return v;
}

static char g_ucd[24];
static pthread_once_t g_ucd_once = PTHREAD_ONCE_INIT;
static void read_unicode_version(void) {
    if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, g_ucd) < 0) snprintf(g_ucd, sizeof g_ucd, "unknown");
}

const char *tks_bpe_unicode_version(void) {
    pthread_once(&g_ucd_once, read_unicode_version);
    return g_ucd;
}

int tks__bpe_fast_init(void) {
    pthread_once(&g_once, build_tables);
    return g_rc;
}

int tks__bpe_fast_program(const char *pattern) {
    static const struct { int prog; const char *name; } P[] = {
        {TKS__FAST_LLAMA3, "llama3"}, {TKS__FAST_QWEN2, "qwen2"}, {TKS__FAST_CL100K, "cl100k"},
        {TKS__FAST_O200K, "o200k"}, {TKS__FAST_GPT2, "gpt2"}};
    if (!pattern) return TKS__FAST_NONE;
    if (!strcmp(pattern, tks__bpe_gpt2_pattern)) return TKS__FAST_GPT2;
    for (size_t i = 0; i < sizeof P / sizeof *P; i++)
        if (!strcmp(pattern, tks_tiktoken_pattern(P[i].name))) return P[i].prog;
    return TKS__FAST_NONE;
}

size_t tks__bpe_fast_bmp(const char *t, size_t n) {
    const unsigned char *s = (const unsigned char *)t;
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0xF0) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------
 * Matching: every position is a code point boundary of valid UTF-8 without
 * 4-byte sequences.
 * ------------------------------------------------------------------------- */
typedef struct text {
    const unsigned char *s;
    size_t n;
} text;

/* The code point at i (within the BMP) and its length; the end gives 0
 * with length 0. */
static inline unsigned cp_at(const text *x, size_t i, size_t *len) {
    if (i >= x->n) {
        *len = 0;
        return 0;
    }
    unsigned c = x->s[i];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return (c & 0x1F) << 6 | (x->s[i + 1] & 0x3F);
    }
    *len = 3;
    return (c & 0x0F) << 12 | (x->s[i + 1] & 0x3F) << 6 | (x->s[i + 2] & 0x3F);
}

/* The class bits of the code point at i (0 at the end) and its length. */
static inline unsigned cls_at(const text *x, size_t i, size_t *len) {
    unsigned cp = cp_at(x, i, len);
    return *len ? g_cls[cp] : 0;
}

/* The letter of the contractions the code point at i matches caselessly. */
static inline unsigned fold_at(const text *x, size_t i, size_t *len) {
    unsigned cp = cp_at(x, i, len);
    return *len ? g_fold[cp] : 0;
}

/* The end of the run of code points from i whose class has any of `bits`. */
static inline size_t run(const text *x, size_t i, unsigned bits) {
    size_t k;
    while (cls_at(x, i, &k) & bits) i += k;
    return i;
}

static inline size_t run_not(const text *x, size_t i, unsigned bits) {
    size_t k;
    while (i < x->n && !(cls_at(x, i, &k) & bits)) i += k;
    return i;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (caseless: PCRE2's folding), or GPT-2's
 * case-sensitive form: the end, or 0. */
static size_t contraction(const text *x, size_t i, int caseless) {
    if (i >= x->n || x->s[i] != '\'') return 0;
    size_t k1, k2;
    unsigned a = caseless ? fold_at(x, i + 1, &k1) : (i + 1 < x->n ? (k1 = 1, x->s[i + 1]) : (k1 = 0, 0u));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 1 + k1;
    if (a != 'r' && a != 'v' && a != 'l') return 0;
    unsigned b = caseless ? fold_at(x, i + 1 + k1, &k2) : (i + 2 < x->n ? (k2 = 1, x->s[i + 2]) : (k2 = 0, 0u));
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 1 + k1 + k2;
    return 0;
}

/* Whitespace at i (the run [i, k)): \s*[\r\n]+ ends after the run's last
 * CR or LF (0: none); \s+(?!\S) leaves the run's last character to what
 * follows unless the run ends the text. */
static size_t ws_newline(const text *x, size_t i, size_t k) {
    size_t last = 0, len;
    for (size_t p = i; p < k; p += len)
        if (cls_at(x, p, &len) & C_CRLF) last = p + len;
    return last;
}

static size_t ws_tail(const text *x, size_t i, size_t k) {
    if (k == x->n) return k;
    /* the run's last character: back one code point (1 to 3 bytes) */
    size_t p = k - 1;
    while (p > i && (x->s[p] & 0xC0) == 0x80) p--;
    return p > i ? p : k; /* a run of one: \s+ takes it */
}

static size_t gpt2(const text *x, size_t i) {
    size_t e = contraction(x, i, 0), k;
    if (e) return e;
    size_t j = x->s[i] == ' ' ? i + 1 : i;
    unsigned c = cls_at(x, j, &k);
    if (c & C_L) return run(x, j + k, C_L);
    if (c & C_N) return run(x, j + k, C_N);
    if (k && !(c & (C_S | C_L | C_N))) return run_not(x, j + k, C_S | C_L | C_N);
    size_t r = run(x, i, C_S); /* i is whitespace */
    return ws_tail(x, i, r);
}

/* LLAMA3, QWEN2 (max_digits 1) and CL100K (end_run: \s++$ first). */
static size_t llama3(const text *x, size_t i, size_t max_digits, int end_run) {
    size_t e = contraction(x, i, 1), k, k2;
    if (e) return e;
    unsigned c = cls_at(x, i, &k);
    if (c & C_L) return run(x, i + k, C_L);
    if (!(c & (C_CRLF | C_L | C_N)) && (cls_at(x, i + k, &k2) & C_L)) return run(x, i + k + k2, C_L);
    if (c & C_N) {
        e = i + k;
        for (size_t d = 1; d < max_digits && (cls_at(x, e, &k2) & C_N); d++) e += k2;
        return e;
    }
    size_t j = x->s[i] == ' ' ? i + 1 : i;
    unsigned cj = j == i ? c : cls_at(x, j, &k2);
    if (j == i) k2 = k;
    if (k2 && !(cj & (C_S | C_L | C_N))) return run(x, run_not(x, j + k2, C_S | C_L | C_N), C_CRLF);
    size_t r = run(x, i, C_S); /* i is whitespace */
    if (end_run && r == x->n) return r;
    e = ws_newline(x, i, r);
    return e ? e : ws_tail(x, i, r);
}

/* o200k's first two alternatives from j (after the optional prefix):
 * [UP]*[LO]+ and [UP]+[LO]*, then the optional contraction; 0 when neither
 * matches from j. */
static size_t o200k_word(const text *x, size_t j, int alt) {
    size_t u = j, last_lo = 0, k;
    unsigned c;
    while ((c = cls_at(x, u, &k)) & C_UP) {
        if (c & C_LO) last_lo = u + k;
        u += k;
    }
    size_t e;
    if (alt == 1) {
        /* [UP]* gives back until [LO]+ can start: at u when it is LO (then
         * the whole LO run), else at the last LO of the UP run (one char) */
        if (cls_at(x, u, &k) & C_LO) e = run(x, u, C_LO);
        else if (last_lo) e = last_lo;
        else return 0;
    } else {
        if (u == j) return 0;
        e = run(x, u, C_LO);
    }
    size_t ce = contraction(x, e, 1);
    return ce ? ce : e;
}

static size_t o200k(const text *x, size_t i) {
    size_t k, k2, e;
    unsigned c = cls_at(x, i, &k);
    int prefix = !(c & (C_CRLF | C_L | C_N));
    for (int alt = 1; alt <= 2; alt++) {
        if (prefix && (e = o200k_word(x, i + k, alt))) return e;
        if ((e = o200k_word(x, i, alt))) return e;
    }
    if (c & C_N) {
        e = i + k;
        for (int d = 1; d < 3 && (cls_at(x, e, &k2) & C_N); d++) e += k2;
        return e;
    }
    size_t j = x->s[i] == ' ' ? i + 1 : i;
    unsigned cj = j == i ? c : cls_at(x, j, &k2);
    if (j == i) k2 = k;
    if (k2 && !(cj & (C_S | C_L | C_N))) {
        e = run_not(x, j + k2, C_S | C_L | C_N);
        while (e < x->n && ((cls_at(x, e, &k2) & C_CRLF) || x->s[e] == '/')) e += k2;
        return e;
    }
    size_t r = run(x, i, C_S);
    e = ws_newline(x, i, r);
    return e ? e : ws_tail(x, i, r);
}

size_t tks__bpe_fast_next(int prog, const char *t, size_t n, size_t i) {
    text x = {(const unsigned char *)t, n};
    switch (prog) {
    case TKS__FAST_GPT2: return gpt2(&x, i);
    case TKS__FAST_LLAMA3: return llama3(&x, i, 3, 0);
    case TKS__FAST_QWEN2: return llama3(&x, i, 1, 0);
    case TKS__FAST_CL100K: return llama3(&x, i, 3, 1);
    case TKS__FAST_O200K: return o200k(&x, i);
    }
    return n;
}

size_t tks__bpe_fast_ends(int prog, const char *t, size_t n, size_t i, size_t *ends, size_t cap) {
    text x = {(const unsigned char *)t, n};
    size_t m = 0;
    /* a loop per pattern: the matcher inlined into it, no call a piece */
#define CUT(step)                                                                                                 \
    do {                                                                                                          \
        while (i < n && m < cap) ends[m++] = i = (step);                                                          \
    } while (0)
    switch (prog) {
    case TKS__FAST_GPT2: CUT(gpt2(&x, i)); break;
    case TKS__FAST_LLAMA3: CUT(llama3(&x, i, 3, 0)); break;
    case TKS__FAST_QWEN2: CUT(llama3(&x, i, 1, 0)); break;
    case TKS__FAST_CL100K: CUT(llama3(&x, i, 3, 1)); break;
    case TKS__FAST_O200K: CUT(o200k(&x, i)); break;
    default: ends[m++] = n;
    }
#undef CUT
    return m;
}
