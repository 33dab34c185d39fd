/*
 * bpe_pretok_win.c - the pieces of the named pre-tokenizer patterns of the
 * Llama 3 family (Llama 3, Qwen 2, cl100k) and o200k, about 60 bytes at a
 * time, from bit masks: where a window of ASCII text is cut follows from its
 * bytes' classes and their neighbours', with no branch a piece. What a
 * window cannot decide (a multi-byte code point, an apostrophe next to a
 * letter, a run that goes on past the window, the text's last bytes) the
 * matchers of bpe_pretok.c cut, a piece at a time; they are the reference,
 * and test_pretok compares both with PCRE2 piece for piece.
 *
 * A window holds the 64 bytes from two before the cursor c (a piece start)
 * as masks, bit k for byte c - 2 + k. With P the bytes that may prefix a
 * word ([^\r\n\p{L}\p{N}]: not CR, LF, a letter or a digit), O the
 * punctuation ([^\s\p{L}\p{N}]) and S the whitespace, a piece starts at:
 *   - a run of letters, or the byte before it when that byte is in P and a
 *     piece of its own would start there: whitespace, or punctuation that
 *     is neither inside a run of punctuation nor after a space (a space
 *     takes the run: ` ?[^\s\p{L}\p{N}]+`); with o200k also a capital after
 *     a small letter ([UP]*[LO]+ and [UP]+[LO]* cut camelCase there);
 *   - each third digit of a run, from its first (\p{N}{1,3}; every digit
 *     with Qwen 2's \p{N});
 *   - a run of punctuation, or the space before it; the CRs and LFs after the
 *     run belong to its piece ([\r\n]*, o200k's [\r\n/]*: a '/' after them
 *     is left to the matchers);
 *   - a run of whitespace; after its last CR or LF (\s*[\r\n]+ ends there);
 *     and at its last byte when the run has two or more, does not end with
 *     CR or LF, and the text goes on (\s+(?!\S) gives that byte back).
 * The cursor is always a piece start, so a window decides from there as
 * from the start of every run it is in.
 */
#include <string.h>

#include "tokenizer/bpe_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct win {
    uint64_t up, lo, d, s, nl, sp, ap, sl, hi, v; /* v: the bytes of the text */
} win;

#if defined(__SSE2__)
static inline uint64_t rng(__m128i x, unsigned char lo, unsigned char hi) {
    __m128i t = _mm_add_epi8(x, _mm_set1_epi8((char)(0x80 - lo)));
    return (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmplt_epi8(t, _mm_set1_epi8((char)(0x80 + (hi - lo) + 1))));
}
static inline uint64_t eqc(__m128i x, char c) {
    return (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(c)));
}
#endif

/* The classes of the 64 bytes t[c - 2 .. c + 62) (bytes outside t[0..n) in
 * none). */
static inline void classify(const unsigned char *t, size_t n, size_t c, win *w) {
    unsigned char buf[64];
    const unsigned char *p = t + c - 2;
    uint64_t v = ~0ull;
    if (c < 2 || c + 62 > n) {
        memset(buf, 0, sizeof buf);
        for (int k = 0; k < 64; k++) {
            size_t at = c + (size_t)k - 2; /* wraps below 0: then not < n */
            if (c + (size_t)k >= 2 && at < n) buf[k] = t[at];
            else v &= ~(1ull << k);
        }
        p = buf;
    }
    memset(w, 0, sizeof *w);
#if defined(__SSE2__)
    for (int q = 0; q < 4; q++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(p + 16 * q));
        int sh = 16 * q;
        w->up |= rng(x, 'A', 'Z') << sh;
        w->lo |= rng(x, 'a', 'z') << sh;
        w->d |= rng(x, '0', '9') << sh;
        w->s |= (rng(x, '\t', '\r') | eqc(x, ' ')) << sh;
        w->nl |= (eqc(x, '\n') | eqc(x, '\r')) << sh;
        w->sp |= eqc(x, ' ') << sh;
        w->ap |= eqc(x, '\'') << sh;
        w->sl |= eqc(x, '/') << sh;
        w->hi |= (uint64_t)(unsigned)_mm_movemask_epi8(x) << sh;
    }
#else
    for (int k = 0; k < 64; k++) {
        unsigned c8 = p[k];
        uint64_t b = 1ull << k;
        if (c8 >= 0x80) w->hi |= b;
        if (c8 >= 'A' && c8 <= 'Z') w->up |= b;
        if (c8 >= 'a' && c8 <= 'z') w->lo |= b;
        if (c8 >= '0' && c8 <= '9') w->d |= b;
        if (c8 == ' ' || (c8 >= '\t' && c8 <= '\r')) w->s |= b;
        if (c8 == '\n' || c8 == '\r') w->nl |= b;
        if (c8 == ' ') w->sp |= b;
        if (c8 == '\'') w->ap |= b;
        if (c8 == '/') w->sl |= b;
    }
#endif
    w->up &= v, w->lo &= v, w->d &= v, w->s &= v, w->nl &= v, w->sp &= v, w->ap &= v, w->sl &= v, w->hi &= v;
    w->v = v;
}

static inline int top_bit(uint64_t x) { return 63 - __builtin_clzll(x); }

#define PREV(x) ((x) << 1) /* bit k: byte k - 1 is */
#define NEXT(x) ((x) >> 1) /* bit k: byte k + 1 is */

/* The piece starts a window decides, bits 3 .. *last (the cursor's bit 2
 * not among them), or 0 when it decides none (the matchers then cut).
 * max_digits: 3, or 1 (Qwen 2); o200k: its case split, its contractions
 * after a word, its '/' after the punctuation's line ends. */
static inline uint64_t starts(const win *w, int max_digits, int o200k, int *last) {
    const uint64_t one = 1ull << 2, L = w->up | w->lo;
    const uint64_t O = w->v & ~(L | w->d | w->s), P = w->v & ~(w->nl | L | w->d);
    /* an apostrophe by a letter may begin or end a contraction: the matchers */
    if (w->ap & (o200k ? PREV(L) : NEXT(L))) return 0;
    /* letters, and the prefix that joins them */
    uint64_t runL = (L & ~PREV(L)) | (L & one);
    /* (the byte before the cursor is the last piece's: no run goes on across the cursor) */
    uint64_t pre = P & NEXT(runL) & ~(O & (PREV(O) | PREV(w->sp)) & ~one);
    uint64_t st = pre | (runL & ~PREV(pre)) | (o200k ? w->up & PREV(w->lo) : 0);
    /* punctuation, with the space before it */
    uint64_t runO = (O & ~PREV(O)) | (O & one);
    uint64_t ost = (runO & ~PREV(w->sp)) | (w->sp & NEXT(runO));
    st |= ost;
    /* the CRs and LFs after a run of punctuation are its piece's */
    uint64_t a0 = PREV(O & ~NEXT(O)) & w->nl;
    uint64_t absorbed = w->nl & ~(w->nl + a0);
    if (o200k && (w->sl & PREV(absorbed))) return 0;
    /* digits, a piece each max_digits from the start of their run */
    if (max_digits == 1) {
        st |= w->d;
    } else {
        /* (a run going on from before the cursor: from the cursor) */
        for (uint64_t r = (w->d & ~PREV(w->d) & ~3ull) | (w->d & one); r; r &= r - 1) {
            int a = __builtin_ctzll(r);
            uint64_t rest = ~(w->d >> a);
            int len = rest ? __builtin_ctzll(rest) : 64 - a;
            for (int k = a; k < a + len; k += 3) st |= 1ull << k;
        }
    }
    /* whitespace: each run's start, after its last CR or LF, its last byte */
    uint64_t S = w->s & ~absorbed, T = S & ~w->nl, NS = S & w->nl;
    uint64_t wsA = (S & ~PREV(S)) | (S & one);
    st |= wsA | (S & ~NEXT(S) & ~w->nl & PREV(S) & NEXT(w->v));
    for (uint64_t g = NS & ~NEXT(NS); g; g &= g - 1) {
        int q = __builtin_ctzll(g);
        if (q >= 62) break;
        uint64_t after = ~(T >> (q + 1));
        int len = after ? __builtin_ctzll(after) : 63 - q;
        if (len && q + 1 + len < 64 && !((NS >> (q + 1 + len)) & 1)) st |= 1ull << (q + 1);
    }
    /* what the window decides: to bit 62, and not past the start of a
     * whitespace run or a punctuation piece that goes on past it */
    int x = 62;
    if (S >> 63) {
        uint64_t a = wsA & ((1ull << 63) | ((1ull << 63) - 1));
        if (a) x = top_bit(a) < x ? top_bit(a) : x;
    }
    if (absorbed >> 63) {
        uint64_t a = st & ((1ull << 63) - 1) & ~absorbed;
        if (a) x = top_bit(a) < x ? top_bit(a) : x;
    }
    *last = x;
    return st & ~((2ull << 2) - 1) & ((x >= 63 ? ~0ull : (2ull << x) - 1));
}

size_t tks__bpe_fast_ends(int prog, const char *t, size_t n, size_t i, size_t *ends, size_t cap) {
    const unsigned char *s = (const unsigned char *)t;
    int max_digits = prog == TKS__FAST_QWEN2 ? 1 : 3, o200k = prog == TKS__FAST_O200K;
    int windows = tks__bpe_masks_ok() && (prog == TKS__FAST_LLAMA3 || prog == TKS__FAST_QWEN2 ||
                                          prog == TKS__FAST_CL100K || prog == TKS__FAST_O200K);
    size_t m = 0;
    while (i < n && m < cap) {
        if (windows && i + 62 <= n) {
            win w;
            int last;
            classify(s, n, i, &w);
            uint64_t st = w.hi ? 0 : starts(&w, max_digits, o200k, &last);
            if (st) {
                size_t base = i - 2;
                for (; st && m < cap; st &= st - 1) ends[m++] = base + (size_t)__builtin_ctzll(st);
                i = ends[m - 1];
                continue;
            }
        }
        /* the matchers: to the window's end (or the text's) */
        size_t k = tks__bpe_fast_ends_scalar(prog, t, n, i, ends + m, cap - m, windows ? i + 60 : n);
        m += k;
        i = ends[m - 1];
    }
    return m;
}
