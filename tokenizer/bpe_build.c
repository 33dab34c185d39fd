/*
 * bpe_build.c - building a byte-level BPE handle, what both loaders call
 * (bpe_load.c reads tokenizer.json, bpe_tiktoken.c tiktoken files): a new
 * handle, its refusals, the byte-level alphabet, the pre-tokenizer regexes,
 * the added-token matchers and the final indexes.
 */
#define _POSIX_C_SOURCE 200809L /* strdup, strndup */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_vocab.h"

/* Printable Latin-1 bytes stand for themselves, the other 68 for U+0100..
 * in byte order. */
uint32_t tks__bpe_byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

size_t tks__bpe_pow2(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int tks__bpe_refuse(const tks_bpe *b, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tks_fail(TKS_ERR_TOKENIZER, b->path, TKS_NONE, TKS_NONE, "%s: %s", b->path, msg);
}

int tks__bpe_nomem(const tks_bpe *b, const char *what) {
    return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "out of memory loading %s (%s)", b->path,
                    what);
}

tks_bpe *tks__bpe_new(const char *path) {
    tks_bpe *b = calloc(1, sizeof *b);
    if (!b || !(b->path = strdup(path))) {
        free(b);
        return NULL;
    }
    b->word_cache = 1;
    b->added_raw.one_first = b->added_norm.one_first = -1;
    return b;
}

/* Oniguruma (the engine of tokenizers) reads a few things otherwise than
 * PCRE2: \h is a hexadecimal digit there, horizontal space here; POSIX
 * brackets follow other Unicode rules; {n,m}+ repeats {n,m} there, where
 * PCRE2 (and Rust) read a possessive {n,m}. A tokenizer.json pattern using
 * them is refused (extra 0); a tiktoken pattern (extra PCRE2_DOLLAR_ENDONLY)
 * is Rust's, which PCRE2 reads alike. */
int tks__bpe_compile(tks_bpe *b, const char *pat, size_t n, int literal, uint32_t extra, const char *where) {
    if (b->n_split == TKS__BPE_MAX_SPLITS)
        return tks__bpe_refuse(b, "%s: more than %d regex splits", where, TKS__BPE_MAX_SPLITS);
    /* Constructs PCRE2 10.42 reads otherwise than Oniguruma (tokenizer.json)
     * or Rust's regex (tiktoken), refused rather than matched differently:
     * \w, \W, \b, \B (PCRE2's word characters leave out the combining marks
     * that both count: Hindi splits otherwise), class intersection [..&&..]
     * (PCRE2 reads "&&" as two characters), and in a tokenizer.json ^ and $
     * outside a class (every line's start and end in Oniguruma, the
     * subject's in PCRE2). */
    int depth = 0; /* inside a character class (nested ones counted) */
    if (!literal)
        for (size_t i = 0; i < n; i++) {
            if (pat[i] == '\\' && i + 1 < n) {
                char c = pat[i + 1];
                if (c == 'w' || c == 'W' || c == 'b' || c == 'B')
                    return tks__bpe_refuse(b, "%s: \\%c (word characters and boundaries) differs between %s and "
                                           "PCRE2 (combining marks); spell the class out, e.g. [\\p{L}\\p{M}\\p{N}_]",
                                           where, c, extra ? "Rust's regex" : "Oniguruma");
                if (c == 'h' || c == 'H')
                    return tks__bpe_refuse(b, "%s: \\%c means another class in Oniguruma than in PCRE2", where, c);
                i++;
                continue;
            }
            if (pat[i] == '[' && !(i + 1 < n && pat[i + 1] == ':')) {
                depth++;
                if (i + 1 < n && pat[i + 1] == '^') i++; /* negation, not an anchor */
                if (i + 1 < n && pat[i + 1] == ']') i++; /* a first ']' is a character */
                continue;
            }
            if (pat[i] == ']' && depth > 0) {
                depth--;
                continue;
            }
            if (depth > 0 && pat[i] == '&' && i + 1 < n && pat[i + 1] == '&')
                return tks__bpe_refuse(b, "%s: a class intersection [..&&..] is read as the characters \"&&\" by "
                                       "PCRE2", where);
            if (depth == 0 && !extra && (pat[i] == '^' || pat[i] == '$'))
                return tks__bpe_refuse(b, "%s: %c matches at every line's %s in Oniguruma and at the text's in PCRE2",
                                       where, pat[i], pat[i] == '^' ? "start" : "end");
            if (i + 1 >= n) break;
            if (pat[i] == '[' && pat[i + 1] == ':') {
                return tks__bpe_refuse(b, "%s: POSIX bracket classes differ between Oniguruma and PCRE2", where);
            } else if (!extra && pat[i] == '}' && pat[i + 1] == '+') {
                size_t o = i;
                while (o > 0 && ((pat[o - 1] >= '0' && pat[o - 1] <= '9') || pat[o - 1] == ',')) o--;
                if (o < i && o > 0 && pat[o - 1] == '{')
                    return tks__bpe_refuse(b, "%s: {n,m}+ repeats {n,m} in Oniguruma but is possessive in PCRE2",
                                           where);
            }
        }
    return tks__bpe_compile_opts(b, pat, n, PCRE2_UTF | extra | (literal ? PCRE2_LITERAL : PCRE2_UCP), where);
}

int tks__bpe_compile_opts(tks_bpe *b, const char *pat, size_t n, uint32_t opts, const char *where) {
    if (b->n_split == TKS__BPE_MAX_SPLITS)
        return tks__bpe_refuse(b, "%s: more than %d regex splits", where, TKS__BPE_MAX_SPLITS);
    int literal = (opts & PCRE2_LITERAL) != 0;
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opts, &err, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tks__bpe_refuse(b, "%s: PCRE2 cannot compile the pattern at offset %zu: %s", where, (size_t)eoff,
                               (const char *)msg);
    }
    uint32_t minlen = 0;
    pcre2_pattern_info(re, PCRE2_INFO_MINLENGTH, &minlen);
    if (minlen == 0) {
        pcre2_code_free(re);
        return tks__bpe_refuse(b, "%s: the pattern may match the empty string (not reproduced exactly)", where);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, the interpreter gives the same matches */
    char *text = malloc(n + 1);
    if (!text) {
        pcre2_code_free(re);
        return tks__bpe_nomem(b, "pattern");
    }
    memcpy(text, pat, n);
    text[n] = 0;
    int fast = literal ? TKS__FAST_NONE : tks__bpe_fast_program(text);
    tks__bpe_splitter *sp = &b->split[b->n_split++];
    *sp = (tks__bpe_splitter){re, B_ISOLATED, 0, fast, "", text, n, opts};
    snprintf(sp->text, sizeof sp->text, "%.*s%s", (int)(n < sizeof sp->text - 4 ? n : sizeof sp->text - 4), pat,
             n < sizeof sp->text - 4 ? "" : "...");
    return 0;
}

/* Added tokens before sorting: their bytes are appended to added_text, the
 * entries to the set's array (capacity kept in the set's `first[256]` slot
 * until tks__bpe_finish sorts it). */
int tks__bpe_add_token(tks_bpe *b, const char *content, size_t len, uint32_t id, int special, int normalized,
                       int unsupported) {
    if (unsupported && !special)
        return tks__bpe_refuse(b, "added token %u \"%.*s\" sets lstrip, rstrip or single_word: not supported "
                               "(tokshard matches added tokens without them)", id, (int)(len > 60 ? 60 : len),
                               content);
    utf8proc_uint8_t *nfc = NULL;
    if (normalized && b->nfc) {
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)content, (utf8proc_ssize_t)len, &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) return tks__bpe_refuse(b, "added token %u: NFC failed: %s", id, utf8proc_errmsg(r));
        content = (const char *)nfc;
        len = (size_t)r;
    }
    tks__bpe_added_set *set = normalized ? &b->added_norm : &b->added_raw;
    size_t used = 0;
    for (size_t i = 0; i < b->added_raw.n; i++) used += b->added_raw.tok[i].len;
    for (size_t i = 0; i < b->added_norm.n; i++) used += b->added_norm.tok[i].len;
    int rc = tks_resize(&b->added_text, used + len, 1) || tks_resize(&set->tok, set->n + 1, sizeof *set->tok)
                 ? tks__bpe_nomem(b, "added tokens")
                 : 0;
    if (!rc) {
        memcpy(b->added_text + used, content, len);
        /* whole, padding included: the entries are hashed into the cache's
         * checks and the manifest's tables_xxh3 (tks_bpe_tables_xxh3) */
        tks__bpe_added *a = &set->tok[set->n++];
        memset(a, 0, sizeof *a);
        a->off = used, a->len = (uint32_t)len, a->id = id;
        a->special = (uint8_t)special, a->unsupported = (uint8_t)unsupported;
    }
    free(nfc);
    return rc;
}

/* added_text of the handle being sorted (qsort takes no context) */
static __thread const char *sort_base;

static int added_cmp(const void *pa, const void *pb) {
    const tks__bpe_added *x = pa, *y = pb;
    unsigned char cx = (unsigned char)sort_base[x->off], cy = (unsigned char)sort_base[y->off];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    int c = memcmp(sort_base + x->off, sort_base + y->off, x->len);
    return c ? c : (x->id < y->id ? -1 : x->id > y->id);
}

/* Sorts a set by first byte, longest first, and indexes it; two tokens with
 * the same text are refused (which one tokenizers matches is not defined). */
static int added_index(tks_bpe *b, tks__bpe_added_set *s) {
    sort_base = b->added_text;
    if (s->n) qsort(s->tok, s->n, sizeof *s->tok, added_cmp);
    memset(s->first, 0, sizeof s->first);
    s->max_len = 0;
    for (size_t i = 0; i < s->n; i++) {
        const tks__bpe_added *t = &s->tok[i];
        if (t->len > s->max_len) s->max_len = t->len;
        if (i && t->len == s->tok[i - 1].len && !memcmp(b->added_text + t->off, b->added_text + s->tok[i - 1].off, t->len))
            return tks__bpe_refuse(b, "added tokens %u and %u have the same text \"%.*s\"", s->tok[i - 1].id, t->id,
                                   (int)(t->len > 60 ? 60 : t->len), b->added_text + t->off);
        s->first[(unsigned char)b->added_text[t->off] + 1]++;
    }
    for (int c = 0; c < 256; c++) s->first[c + 1] += s->first[c];
    s->one_first = -1;
    if (s->n && s->first[(unsigned char)b->added_text[s->tok[0].off] + 1] == s->n)
        s->one_first = (unsigned char)b->added_text[s->tok[0].off];
    return 0;
}

static int finish_common(tks_bpe *b);

int tks__bpe_finish(tks_bpe *b, uint32_t n, const uint8_t *usable) {
    b->vmask = tks__bpe_pow2((size_t)n * 2) - 1;
    b->vslot = malloc((b->vmask + 1) * sizeof *b->vslot);
    b->self = b->mode == TKS__BPE_MERGES ? calloc(n ? n : 1, 1) : NULL;
    if (!b->vslot || (b->mode == TKS__BPE_MERGES && !b->self)) return tks__bpe_nomem(b, "vocab");
    for (size_t i = 0; i <= b->vmask; i++) b->vslot[i] = (tks__bpe_vslot){0, TKS_NO_ID, 0};
    for (uint32_t id = 0; id < n; id++) {
        if (usable && !usable[id]) continue;
        const char *s = b->bytes + b->off[id];
        size_t len = b->off[id + 1] - b->off[id];
        size_t h = tks__bpe_hash(s, len) & b->vmask;
        while (b->vslot[h].id != TKS_NO_ID) h = (h + 1) & b->vmask;
        b->vslot[h] = (tks__bpe_vslot){tks__bpe_head8(s, len), id, (uint32_t)len};
    }
    int rc = added_index(b, &b->added_raw);
    if (!rc) rc = added_index(b, &b->added_norm);
    if (!rc) rc = tks__bpe_mq_build(b);
    if (!rc) rc = tks__bpe_seed_build(b);
    return rc ? rc : finish_common(b);
}

static int by_rank(const void *a, const void *b) {
    uint32_t x = ((const tks__bpe_merge *)a)->rank, y = ((const tks__bpe_merge *)b)->rank;
    return x < y ? -1 : x > y;
}

static unsigned bits_for(uint64_t n) { /* the bits that hold 0 .. n - 1 (at least 1) */
    unsigned k = 1;
    while (k < 64 && (1ull << k) < n) k++;
    return k;
}

int tks__bpe_mq_build(tks_bpe *b) {
    if (b->mode != TKS__BPE_MERGES) return 0;
    size_t nm = 0;
    for (size_t i = 0; i <= b->mmask; i++) nm += b->mslot[i].key != 0;
    tks__bpe_merge *m = malloc((nm ? nm : 1) * sizeof *m);
    if (!m) return tks__bpe_nomem(b, "the merge table");
    for (size_t i = 0, k = 0; i <= b->mmask; i++)
        if (b->mslot[i].key) m[k++] = b->mslot[i];
    qsort(m, nm, sizeof *m, by_rank);
    /* the priority (new id, place among the merges of that id) must rise
     * with the rank: true of merges listed as their tokens were made */
    uint32_t *place = calloc(b->n_ids ? b->n_ids : 1, sizeof *place), most = 0;
    int ok = place != NULL;
    uint64_t last = 0;
    for (size_t k = 0; ok && k < nm; k++) {
        uint32_t q = place[m[k].new_id]++;
        most = q + 1 > most ? q + 1 : most;
        uint64_t pr = (uint64_t)m[k].new_id << 32 | q;
        ok = k == 0 || pr > last;
        last = pr;
    }
    unsigned id = bits_for(b->n_ids), sub = bits_for(most), pb = id + sub + 1;
    ok = ok && 2 * id + pb <= 64;
    size_t slots = tks__bpe_pow2(nm + nm / 2 + 1); /* about half full: most probes in one 64-byte line */
    if (ok && !(b->mq = calloc(slots, sizeof *b->mq))) ok = -1;
    if (ok == 1) {
        b->mqmask = slots - 1;
        b->mq_id = id, b->mq_sub = sub, b->mq_p = pb;
        memset(place, 0, (b->n_ids ? b->n_ids : 1) * sizeof *place);
        for (size_t k = 0; k < nm; k++) {
            uint64_t l = (m[k].key - 1) >> 32, r = (m[k].key - 1) & 0xffffffffu, key = l << id | r;
            uint64_t pr = (uint64_t)m[k].new_id << sub | place[m[k].new_id]++;
            size_t h = tks__bpe_mix64(key) & b->mqmask;
            while (b->mq[h]) h = (h + 1) & b->mqmask; /* each pair once */
            b->mq[h] = key << pb | (pr + 1);
        }
    }
    free(place);
    free(m);
    return ok < 0 || (!place && nm) ? tks__bpe_nomem(b, "the merge table") : 0;
}

int tks__bpe_finish_cached(tks_bpe *b) {
    b->self = b->mode == TKS__BPE_MERGES ? calloc(b->n_model ? b->n_model : 1, 1) : NULL;
    if (b->mode == TKS__BPE_MERGES && !b->self) return tks__bpe_nomem(b, "vocab");
    return finish_common(b);
}

/* The scratch and the hand matcher, the last steps either way. */
static int finish_common(tks_bpe *b) {
    int all = 1;
    for (int x = 0; x < 256; x++) all &= b->byte_id[x] != TKS_NO_ID;
    if (all) {
        /* written through now: calloc's lazily zeroed pages, read first,
         * would cost a TLB flush of every thread at their first write */
        if (!(b->pair1 = malloc(65536 * sizeof *b->pair1))) return tks__bpe_nomem(b, "the byte-pair table");
        memset(b->pair1, 0, 65536 * sizeof *b->pair1);
    }
    int rc = tks__bpe_scratch_init(b);
    /* one splitter whose pieces tile the text (isolated matches, or only the
     * matches kept): its hand matcher, when it has one and the tables build */
    const tks__bpe_splitter *sp = &b->split[0];
    if (!rc && b->n_split == 1 && sp->fast &&
        ((sp->how == B_ISOLATED && !sp->invert) || (sp->how == B_REMOVED && sp->invert)) &&
        tks__bpe_fast_init() == 0)
        b->fast = sp->fast;
    return rc;
}
