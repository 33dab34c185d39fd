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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_internal.h"

enum { C_L = 1, C_N = 2, C_S = 4, C_UP = 8, C_LO = 16, C_CRLF = 32 };

static uint8_t *g_cls;   /* (65536) class bits of each BMP code point */
static uint8_t *g_fold;  /* (65536) the ASCII letter of s t r e v m l d it matches caselessly, or 0 */
static int g_rc;
static int g_masks_ok = 1; /* the ASCII classes are the block masks' (build_tables checks) */
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
    /* the block masks' ASCII classes (fixed byte ranges) must be PCRE2's */
    for (unsigned c = 0; !rc && c < 128; c++) {
        unsigned want = (c >= 'A' && c <= 'Z' ? C_UP | C_L : 0) | (c >= 'a' && c <= 'z' ? C_LO | C_L : 0) |
                        (c >= '0' && c <= '9' ? C_N : 0) | (c == ' ' || (c >= '\t' && c <= '\r') ? C_S : 0) |
                        (c == '\n' || c == '\r' ? C_CRLF : 0);
        if (g_cls[c] != want) g_masks_ok = 0;
    }
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

int tks__bpe_masks_ok(void) { return g_masks_ok; }

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
    size_t i = 0;
#if defined(__SSE2__)
    /* 64 bytes a step: a lead byte of a 4-byte sequence is F0 or above */
    const __m128i f0 = _mm_set1_epi8((char)0xF0);
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), d = _mm_loadu_si128((const __m128i *)(s + i + 48));
        __m128i m = _mm_max_epu8(_mm_max_epu8(a, b), _mm_max_epu8(c, d));
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(m, f0), m))) return 0;
    }
#endif
    for (; i < n; i++)
        if (s[i] >= 0xF0) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------
 * Matching: every position is a code point boundary of valid UTF-8 without
 * 4-byte sequences.
 *
 * Runs of a class (letters, digits, whitespace, ...) are found 64 bytes at a
 * time: each block of the text gets bit masks of its ASCII bytes by class
 * (SSE2 compares), and a run's end is the first set bit of "not in the
 * class" from its start (a count of trailing zeros), not a decode of every
 * code point. A byte of a multi-byte character is in no ASCII mask: the run
 * stops there and the character's class is read from the table, the run
 * going on past it when it is in the class. What the matchers decide is the
 * same as stepping code point by code point (test_bpe compares both with
 * PCRE2's matches).
 * ------------------------------------------------------------------------- */
enum { M_UP, M_LO, M_N, M_S, M_CRLF, M_HI, M_END, NM }; /* M_END: the bytes past the text */

typedef struct text {
    const unsigned char *s;
    size_t n;
    size_t blk;     /* the block whose masks m[] holds (bytes 64 * blk ...), SIZE_MAX: none yet */
    uint64_t m[NM]; /* bit k: byte 64 * blk + k is of the class */
} text;

static inline int ctz64(uint64_t v) { return __builtin_ctzll(v); }

#if defined(__SSE2__)
/* Bytes of v in [lo, hi] (unsigned), as a 16-bit mask. */
static inline unsigned in_range(__m128i v, unsigned char lo, unsigned char hi) {
    __m128i t = _mm_add_epi8(v, _mm_set1_epi8((char)(0x80 - lo)));
    return (unsigned)_mm_movemask_epi8(_mm_cmplt_epi8(t, _mm_set1_epi8((char)(0x80 + (hi - lo) + 1))));
}
#endif

/* The masks of the block of byte i (i < n). */
static void load_block(text *x, size_t i) {
    size_t base = i & ~(size_t)63;
    x->blk = i >> 6;
    memset(x->m, 0, sizeof x->m);
    unsigned char b[64];
    const unsigned char *p = x->s + base;
    size_t have = x->n - base < 64 ? x->n - base : 64;
    if (have < 64) { /* the text's last block: copied, zeros past its end (in no ASCII class) */
        memset(b, 0, sizeof b);
        memcpy(b, p, have);
        p = b;
        x->m[M_END] = ~0ull << have;
    }
#if defined(__SSE2__)
    for (int q = 0; q < 4; q++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * q));
        int sh = 16 * q;
        x->m[M_UP] |= (uint64_t)in_range(v, 'A', 'Z') << sh;
        x->m[M_LO] |= (uint64_t)in_range(v, 'a', 'z') << sh;
        x->m[M_N] |= (uint64_t)in_range(v, '0', '9') << sh;
        x->m[M_S] |= (uint64_t)(in_range(v, '\t', '\r') | in_range(v, ' ', ' ')) << sh;
        x->m[M_CRLF] |= (uint64_t)(in_range(v, '\n', '\n') | in_range(v, '\r', '\r')) << sh;
        x->m[M_HI] |= (uint64_t)(unsigned)_mm_movemask_epi8(v) << sh;
    }
#else
    for (int k = 0; k < 64; k++) {
        unsigned c = p[k];
        uint64_t bit = 1ull << k;
        if (c >= 0x80) {
            x->m[M_HI] |= bit;
            continue;
        }
        unsigned cl = g_cls[c];
        if (cl & C_UP) x->m[M_UP] |= bit;
        if (cl & C_LO) x->m[M_LO] |= bit;
        if (cl & C_N) x->m[M_N] |= bit;
        if (cl & C_S) x->m[M_S] |= bit;
        if (cl & C_CRLF) x->m[M_CRLF] |= bit;
    }
#endif
}

/* The ASCII bytes of the block in any of the classes `bits`. */
static inline uint64_t ascii_in(const text *x, unsigned bits) {
    uint64_t m = 0;
    if (bits & (C_L | C_UP)) m |= x->m[M_UP];
    if (bits & (C_L | C_LO)) m |= x->m[M_LO];
    if (bits & C_N) m |= x->m[M_N];
    if (bits & C_S) m |= x->m[M_S];
    if (bits & C_CRLF) m |= x->m[M_CRLF];
    return m;
}

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
    if (i < x->n && x->s[i] < 0x80) {
        *len = 1;
        return g_cls[x->s[i]];
    }
    unsigned cp = cp_at(x, i, len);
    return *len ? g_cls[cp] : 0;
}

/* The letter of the contractions the code point at i matches caselessly. */
static inline unsigned fold_at(const text *x, size_t i, size_t *len) {
    unsigned cp = cp_at(x, i, len);
    return *len ? g_fold[cp] : 0;
}

/* The end of the run of code points from i whose class has any of `bits`
 * (in = 1), or none of them (in = 0). */
static inline size_t run_of(text *x, size_t i, unsigned bits, int in) {
    size_t k;
    if (!g_masks_ok) { /* code point by code point */
        while (i < x->n && ((cls_at(x, i, &k) & bits) != 0) == in) i += k;
        return i;
    }
    while (i < x->n) {
        if ((i >> 6) != x->blk) load_block(x, i);
        unsigned o = (unsigned)(i & 63);
        uint64_t cls = ascii_in(x, bits);
        /* the bytes that end the run here, or may (multi-byte: its class decides) */
        uint64_t stop = (in ? ~cls : cls | x->m[M_HI]) | x->m[M_END]; /* ~cls: the multi-byte ones too */
        stop >>= o;
        if (!stop) {
            i += 64 - o;
            continue;
        }
        i += (size_t)ctz64(stop);
        if (i >= x->n || x->s[i] < 0x80) return i < x->n ? i : x->n;
        if (((cls_at(x, i, &k) & bits) != 0) != in) return i;
        i += k;
    }
    return x->n;
}

static inline size_t run(text *x, size_t i, unsigned bits) { return run_of(x, i, bits, 1); }
static inline size_t run_not(text *x, size_t i, unsigned bits) { return run_of(x, i, bits, 0); }

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
 * CR or LF (0: none; a CR or LF is one byte, and no byte of a multi-byte
 * whitespace character is one); \s+(?!\S) leaves the run's last character
 * to what follows unless the run ends the text. */
static size_t ws_newline(const text *x, size_t i, size_t k) {
    for (size_t p = k; p > i; p--)
        if (x->s[p - 1] == '\n' || x->s[p - 1] == '\r') return p;
    return 0;
}

static size_t ws_tail(const text *x, size_t i, size_t k) {
    if (k == x->n) return k;
    /* the run's last character: back one code point (1 to 3 bytes) */
    size_t p = k - 1;
    while (p > i && (x->s[p] & 0xC0) == 0x80) p--;
    return p > i ? p : k; /* a run of one: \s+ takes it */
}

static size_t gpt2(text *x, size_t i) {
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
static size_t llama3(text *x, size_t i, size_t max_digits, int end_run) {
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

/* The [UP]* run from j: its end, and in *last_lo the end of its last code
 * point that is also LO (one of Lm, Lo, M: never an ASCII letter), or 0. */
static inline size_t run_up(text *x, size_t j, size_t *last_lo) {
    size_t u = run(x, j, C_UP), k;
    *last_lo = 0;
    for (size_t p = j; p < u; p += k) {
        if (x->s[p] < 0x80) {
            k = 1;
            continue;
        }
        if (cls_at(x, p, &k) & C_LO) *last_lo = p + k;
    }
    return u;
}

/* o200k's [UP]*[LO]+ (alt 1: the UP run gives back until [LO]+ can start:
 * at its end when that is LO, then the whole LO run; else at its last LO
 * code point, one character) or [UP]+[LO]* (alt 2) from j, then the
 * optional contraction: the end, or 0 when it does not match. */
static size_t o200k_alt(text *x, size_t j, int alt) {
    size_t last_lo, k, e;
    size_t u = run_up(x, j, &last_lo);
    if (alt == 1) {
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

/* Both alternatives from one start j, the first that matches: the UP run
 * found once (alt 2 is tried only where alt 1 failed, its [LO]* then
 * empty). */
static size_t o200k_word(text *x, size_t j) {
    size_t last_lo, k, e;
    size_t u = run_up(x, j, &last_lo);
    if (cls_at(x, u, &k) & C_LO) e = run(x, u, C_LO);
    else if (last_lo) e = last_lo;
    else if (u > j) e = u;
    else return 0;
    size_t ce = contraction(x, e, 1);
    return ce ? ce : e;
}

static size_t o200k(text *x, size_t i) {
    size_t k, k2, e;
    unsigned c = cls_at(x, i, &k);
    int prefix = !(c & (C_CRLF | C_L | C_N));
    /* the alternatives in the pattern's order: [UP]*[LO]+ with the prefix,
     * without it, then [UP]+[LO]* with and without; with the prefix taken,
     * o200k_word(j) is the first two at one start. At a prefix code point
     * that is itself UP or LO (a mark) both starts are tried, in that order */
    if (prefix && !(c & (C_UP | C_LO))) {
        if ((e = o200k_word(x, i + k))) return e;
    } else if (prefix) {
        if ((e = o200k_alt(x, i + k, 1)) || (e = o200k_alt(x, i, 1)) || (e = o200k_alt(x, i + k, 2)) ||
            (e = o200k_alt(x, i, 2)))
            return e;
    } else if ((e = o200k_word(x, i))) {
        return e;
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

/* ---------------------------------------------------------------------------
 * The ASCII cases from the masks alone
 *
 * Most pieces are ASCII and short: a word with its one-character prefix,
 * up to three digits, a run of punctuation. Each matcher first tries to
 * decide the piece at i from the masks of i's block with a few bit
 * operations and no loop: the end, or 0 when it cannot (a multi-byte
 * character may take part, a run reaches the block's end, whitespace, a
 * contraction starts there), and then the matcher above decides. What the
 * fast cases give is what the matcher would (test_pretok).
 * ------------------------------------------------------------------------- */

/* The first set bit of m at or after bit b (b < 64), or 64. */
static inline unsigned first_from(uint64_t m, unsigned b) {
    m &= ~0ull << b;
    return m ? (unsigned)ctz64(m) : 64;
}

#define BIT(m, b) (((m) >> (b)) & 1)

/* The end of the run of the mask `run` from bit b when it stops, in the
 * block, at an ASCII byte or the text's end (0: it does not). */
static inline unsigned ascii_run(const text *x, uint64_t run, unsigned b) {
    unsigned e = first_from(~run, b);
    return e < 64 && !BIT(x->m[M_HI], e) ? e : 0;
}

/* [^\r\n\p{L}\p{N}]?\p{L}+ (Llama 3, cl100k, Qwen 2; any_prefix) or ` ?\p{L}+`
 * (gpt2: a space the only prefix) at bit b: the word's end bit; 0 when the
 * word is there but not decided here; -1 when there is none (an ASCII
 * byte that is neither a letter nor a prefix of one). */
static inline int ascii_word(const text *x, unsigned b, int any_prefix) {
    uint64_t L = x->m[M_UP] | x->m[M_LO];
    unsigned j = b;
    if (!BIT(L, b)) {
        int pre = any_prefix ? !BIT(L | x->m[M_N] | x->m[M_CRLF] | x->m[M_HI] | x->m[M_END], b)
                             : x->s[64 * x->blk + b] == ' ';
        if (!pre) return -1;
        if (b == 63 || BIT(x->m[M_HI], b + 1)) return 0; /* the next code point decides */
        if (!BIT(L, b + 1)) return -1;
        j = b + 1;
    }
    return (int)ascii_run(x, L, j);
}

static inline unsigned ascii_punct(const text *x, unsigned b, int space) {
    uint64_t O = ~(x->m[M_UP] | x->m[M_LO] | x->m[M_N] | x->m[M_S] | x->m[M_HI] | x->m[M_END]);
    unsigned j = space && b < 63 && BIT(O, b + 1) ? b + 1 : b;
    return BIT(O, j) ? ascii_run(x, O, j) : 0;
}

/* \p{N}{1,max}: up to `max` ASCII digits from bit b; 0 when a multi-byte
 * code point (a digit, maybe) or the block's end comes before. */
static inline unsigned ascii_digits(const text *x, unsigned b, unsigned max) {
    unsigned e = b + 1;
    while (e < 64 && e < b + max && BIT(x->m[M_N], e)) e++;
    return e < 64 && !BIT(x->m[M_HI], e) ? e : 0;
}

static inline size_t absorb_newlines(const text *x, size_t e, int slash) {
    while (e < x->n && (x->s[e] == '\r' || x->s[e] == '\n' || (slash && x->s[e] == '/'))) e++;
    return e;
}

static inline size_t o200k_fast(text *x, size_t i) {
    if ((i >> 6) != x->blk) load_block(x, i);
    size_t base = i & ~(size_t)63, end;
    unsigned b = (unsigned)(i & 63), e;
    uint64_t up = x->m[M_UP], lo = x->m[M_LO], L = up | lo;
    unsigned j = b;
    if (!BIT(L, b)) { /* a prefix (not CR, LF, a letter or a digit) before an ASCII letter */
        uint64_t pre = ~(L | x->m[M_N] | x->m[M_CRLF] | x->m[M_HI] | x->m[M_END]);
        if (!BIT(pre, b)) goto other;
        if (b == 63 || BIT(x->m[M_HI], b + 1)) return 0; /* the next code point decides */
        if (!BIT(L, b + 1)) goto other;
        j = b + 1;
    }
    /* [UP]*[LO]+ or [UP]+[LO]*: the capitals, then the small letters */
    e = first_from(~up, j);
    if (e == 64 || BIT(x->m[M_HI], e)) return 0;
    if (BIT(lo, e) && ((e = first_from(~lo, e)) == 64 || BIT(x->m[M_HI], e))) return 0;
    end = base + e;
    if (end < x->n && x->s[end] == '\'') {
        size_t ce = contraction(x, end, 1);
        if (ce) end = ce;
    }
    return end;
other:
    if (BIT(x->m[M_N], b)) return (e = ascii_digits(x, b, 3)) ? base + e : 0;
    if ((e = ascii_punct(x, b, x->s[i] == ' '))) return absorb_newlines(x, base + e, 1);
    return 0;
}

/* Llama 3, Qwen 2 (max_digits 1), cl100k: the contractions come first. */
static inline size_t llama3_fast(text *x, size_t i, unsigned max_digits) {
    if ((i >> 6) != x->blk) load_block(x, i);
    if (x->s[i] == '\'') return 0;
    size_t base = i & ~(size_t)63;
    unsigned b = (unsigned)(i & 63), e;
    int w = ascii_word(x, b, 1);
    if (w >= 0) return w ? base + (unsigned)w : 0;
    if (BIT(x->m[M_N], b)) return (e = ascii_digits(x, b, max_digits)) ? base + e : 0;
    if ((e = ascii_punct(x, b, x->s[i] == ' '))) return absorb_newlines(x, base + e, 0);
    return 0;
}

static inline size_t gpt2_fast(text *x, size_t i) {
    if ((i >> 6) != x->blk) load_block(x, i);
    if (x->s[i] == '\'') return 0;
    size_t base = i & ~(size_t)63;
    unsigned b = (unsigned)(i & 63), e;
    int space = x->s[i] == ' ', w = ascii_word(x, b, 0);
    if (w >= 0) return w ? base + (unsigned)w : 0;
    unsigned j = space && b < 63 ? b + 1 : b;
    if (BIT(x->m[M_N], j)) return (e = ascii_run(x, x->m[M_N], j)) ? base + e : 0;
    if ((e = ascii_punct(x, b, space))) return base + e;
    return 0;
}

size_t tks__bpe_fast_next(int prog, const char *t, size_t n, size_t i) {
    text x = {(const unsigned char *)t, n, SIZE_MAX, {0}};
    switch (prog) {
    case TKS__FAST_GPT2: return gpt2(&x, i);
    case TKS__FAST_LLAMA3: return llama3(&x, i, 3, 0);
    case TKS__FAST_QWEN2: return llama3(&x, i, 1, 0);
    case TKS__FAST_CL100K: return llama3(&x, i, 3, 1);
    case TKS__FAST_O200K: return o200k(&x, i);
    }
    return n;
}

size_t tks__bpe_fast_ends_scalar(int prog, const char *t, size_t n, size_t i, size_t *ends, size_t cap,
                                 size_t until) {
    text x = {(const unsigned char *)t, n, SIZE_MAX, {0}};
    size_t m = 0;
    if (until > n) until = n;
    /* a loop per pattern: the matcher inlined into it, no call a piece */
#define CUT(step)                                                                                                 \
    do {                                                                                                          \
        while (i < until && m < cap) ends[m++] = i = (step);                                                      \
    } while (0)
    size_t e;
    switch (g_masks_ok ? prog : -prog) { /* without masks, the matchers alone */
    case -TKS__FAST_GPT2: CUT(gpt2(&x, i)); break;
    case -TKS__FAST_LLAMA3: CUT(llama3(&x, i, 3, 0)); break;
    case -TKS__FAST_QWEN2: CUT(llama3(&x, i, 1, 0)); break;
    case -TKS__FAST_CL100K: CUT(llama3(&x, i, 3, 1)); break;
    case -TKS__FAST_O200K: CUT(o200k(&x, i)); break;
    case TKS__FAST_GPT2: CUT((e = gpt2_fast(&x, i)) ? e : gpt2(&x, i)); break;
    case TKS__FAST_LLAMA3: CUT((e = llama3_fast(&x, i, 3)) ? e : llama3(&x, i, 3, 0)); break;
    case TKS__FAST_QWEN2: CUT((e = llama3_fast(&x, i, 1)) ? e : llama3(&x, i, 1, 0)); break;
    case TKS__FAST_CL100K: CUT((e = llama3_fast(&x, i, 3)) ? e : llama3(&x, i, 3, 1)); break;
    case TKS__FAST_O200K: CUT((e = o200k_fast(&x, i)) ? e : o200k(&x, i)); break;
    default: ends[m++] = n;
    }
#undef CUT
    return m;
}
