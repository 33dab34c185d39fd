/*
 * bpe.c - byte-level BPE tokenizers read from a Hugging Face tokenizer.json
 * (GPT-2, Llama 3, Qwen 2 and the like), giving the ids of Hugging Face
 * `tokenizers` reading the same file (tokenizers 0.20: normalizer, then the
 * pre-tokenizer, then the BPE model on each pre-token; its post-processor is
 * not applied: no special token is added, and none is matched in the text).
 *
 * Pipeline of tks_bpe_encode:
 *   1. normalizer: none, or NFC (utf8proc, the Unicode data of the library);
 *   2. pre-tokenizer: a chain of regex splitters (each Split of a Sequence,
 *      then ByteLevel's own GPT-2 regex when use_regex is true), each applied
 *      to every piece of the one before, compiled by PCRE2 (UTF + UCP, JIT
 *      when available). A piece is cut into matches and the gaps between them
 *      and regrouped by the Split's behavior, as tokenizers'
 *      NormalizedString::split does;
 *   3. ByteLevel: every byte of a piece stands for one character of GPT-2's
 *      byte-to-unicode table (openai/gpt-2 encoder.py, bytes_to_unicode), so
 *      the vocabulary is kept as raw bytes and pieces are never re-encoded;
 *   4. BPE: with ignore_merges, a piece that is itself in the vocabulary is
 *      one id; otherwise its bytes start as one symbol each (a byte with no
 *      token of its own is dropped, as tokenizers does with no unk_token) and
 *      the pair of lowest merge rank is merged, the leftmost first among
 *      equal ranks, until no pair has a merge (tokenizers' Word::merge_all: a
 *      binary heap of candidate merges, stale ones skipped when popped:
 *      O(n log n) in the piece's length).
 *
 * Thread safety: a loaded handle is immutable apart from per-thread scratch
 * (PCRE2 match data, JIT stack, symbol and heap arrays) created on a
 * thread's first encode and owned by the handle.
 */
#define _POSIX_C_SOURCE 200809L /* strdup, strndup */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>
#include <xxhash.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

/* tokenizers' ByteLevel regex (pre_tokenizers/byte_level.rs), GPT-2's. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { MAX_SPLITS = 8 };

/* tokenizers' SplitDelimiterBehavior */
typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } behavior;

typedef struct splitter {
    pcre2_code *re;
    behavior how;
    int invert;
} splitter;

typedef struct merge_slot {
    uint64_t key; /* (left id << 32 | right id) + 1; 0: empty */
    uint32_t rank, new_id;
} merge_slot;

typedef struct scratch scratch;

struct tks_bpe {
    char *path;
    uint8_t fingerprint[16];
    uint32_t n_ids;       /* every id is < n_ids, and every id < n_ids exists */
    uint32_t n_model;     /* ids of the BPE model's vocab: [0, n_model) */
    /* per id: the bytes it decodes to, in `bytes` */
    uint64_t *off;        /* (n_ids + 1) */
    char *bytes;
    uint8_t *special;     /* (n_ids): 1 for an added token marked special */
    uint8_t *alpha;       /* (n_ids): 1 when every character is in the byte alphabet */
    uint32_t byte_id[256];/* the one-byte token of each byte, or TKS_NO_ID */
    uint32_t *vslot;      /* vocab hash over model ids with alpha: id or TKS_NO_ID */
    size_t vmask;
    merge_slot *mslot;
    size_t mmask;
    int ignore_merges;
    int nfc;
    splitter split[MAX_SPLITS];
    int n_split;
    pthread_key_t key;
    int have_key;         /* key and mu are initialized */
    pthread_mutex_t mu;
    scratch *all;         /* every thread's scratch */
};

/* ---------------------------------------------------------------------------
 * GPT-2's byte-to-unicode table
 * ------------------------------------------------------------------------- */
/* The code point standing for byte b: printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100.. in byte order. */
static uint32_t byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

/* ---------------------------------------------------------------------------
 * Hashing
 * ------------------------------------------------------------------------- */
static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static const merge_slot *merge_find(const tks_bpe *b, uint32_t l, uint32_t r) {
    uint64_t key = ((uint64_t)l << 32 | r) + 1;
    for (size_t i = mix64(key) & b->mmask;; i = (i + 1) & b->mmask) {
        const merge_slot *s = &b->mslot[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

static uint32_t vocab_find(const tks_bpe *b, const char *s, size_t n) {
    for (size_t i = XXH3_64bits(s, n) & b->vmask;; i = (i + 1) & b->vmask) {
        uint32_t id = b->vslot[i];
        if (id == TKS_NO_ID) return TKS_NO_ID;
        if (b->off[id + 1] - b->off[id] == n && !memcmp(b->bytes + b->off[id], s, n)) return id;
    }
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */
static int refuse(const tks_bpe *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(const tks_bpe *b, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tks_fail(TKS_ERR_TOKENIZER, b->path, TKS_NONE, TKS_NONE, "%s: %s", b->path, msg);
}

static int nomem(const tks_bpe *b, const char *what) {
    return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "out of memory loading %s (%s)", b->path,
                    what);
}

/* Refuses a key of object `o` (at `where`) outside the NULL-terminated `known`. */
static int only_keys(const tks_bpe *b, json_t *o, const char *where, const char *const *known) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (const char *const *p = known; *p; p++) ok |= !strcmp(*p, k);
        if (!ok)
            return refuse(b, "%s.%s is not supported (tokshard reproduces only the keys it knows exactly)",
                          where, k);
    }
    return 0;
}

/* The string of o[key]; NULL with an error when absent or not a string. */
static const char *get_str(const tks_bpe *b, json_t *o, const char *where, const char *key, int *rc) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        *rc = refuse(b, "%s.%s is missing or not a string", where, key);
        return NULL;
    }
    return json_string_value(v);
}

/* o[key] as a boolean: absent or null gives `dflt`. */
static int get_bool(const tks_bpe *b, json_t *o, const char *where, const char *key, int dflt, int *val) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *val = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return refuse(b, "%s.%s is not a boolean", where, key);
    *val = json_is_true(v);
    return 0;
}

/* Oniguruma (the engine of tokenizers) reads a few escapes otherwise than
 * PCRE2: \h is a hexadecimal digit there, horizontal space here; POSIX
 * brackets follow other Unicode rules. A pattern using them is refused. */
static int compile_regex(tks_bpe *b, const char *pat, size_t n, int literal, const char *where) {
    if (b->n_split == MAX_SPLITS) return refuse(b, "%s: more than %d regex splits", where, MAX_SPLITS);
    if (!literal)
        for (size_t i = 0; i + 1 < n; i++) {
            if (pat[i] == '\\') {
                if (pat[i + 1] == 'h' || pat[i + 1] == 'H')
                    return refuse(b, "%s: \\%c means another class in Oniguruma than in PCRE2", where, pat[i + 1]);
                i++;
            } else if (pat[i] == '[' && pat[i + 1] == ':') {
                return refuse(b, "%s: POSIX bracket classes differ between Oniguruma and PCRE2", where);
            }
        }
    int err;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opts, &err, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return refuse(b, "%s: PCRE2 cannot compile the pattern at offset %zu: %s", where, (size_t)eoff,
                      (const char *)msg);
    }
    uint32_t minlen = 0;
    pcre2_pattern_info(re, PCRE2_INFO_MINLENGTH, &minlen);
    if (minlen == 0) {
        pcre2_code_free(re);
        return refuse(b, "%s: the pattern may match the empty string (not reproduced exactly)", where);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, the interpreter gives the same matches */
    b->split[b->n_split++] = (splitter){re, B_ISOLATED, 0};
    return 0;
}

static int load_normalizer(tks_bpe *b, json_t *n) {
    if (!n || json_is_null(n)) return 0;
    json_t *items = n, *one[1] = {n};
    json_t **list = one;
    size_t cnt = 1;
    const char *t = json_string_value(json_object_get(n, "type"));
    if (t && !strcmp(t, "Sequence")) {
        items = json_object_get(n, "normalizers");
        if (!json_is_array(items)) return refuse(b, "normalizer.normalizers is not an array");
        cnt = json_array_size(items);
        list = NULL;
    }
    for (size_t i = 0; i < cnt; i++) {
        json_t *c = list ? list[i] : json_array_get(items, i);
        const char *ct = json_string_value(json_object_get(c, "type"));
        if (!ct || strcmp(ct, "NFC"))
            return refuse(b, "normalizer%s type \"%s\" is not supported (tokshard reproduces none and NFC)",
                          list ? "" : ".normalizers[]", ct ? ct : "?");
        b->nfc = 1;
    }
    return 0;
}

static int load_byte_level(tks_bpe *b, json_t *c, const char *where) {
    static const char *const known[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    int rc = only_keys(b, c, where, known), aps = 0, use_regex = 0;
    if (rc) return rc;
    if ((rc = get_bool(b, c, where, "add_prefix_space", 1, &aps))) return rc;
    if ((rc = get_bool(b, c, where, "use_regex", 1, &use_regex))) return rc;
    if (aps) return refuse(b, "%s.add_prefix_space true is not supported", where);
    if (use_regex) return compile_regex(b, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, where);
    return 0;
}

static int load_split(tks_bpe *b, json_t *c, const char *where) {
    static const char *const known[] = {"type", "pattern", "behavior", "invert", NULL};
    int rc = only_keys(b, c, where, known), invert = 0;
    if (rc) return rc;
    json_t *p = json_object_get(c, "pattern");
    json_t *re = json_object_get(p, "Regex"), *lit = json_object_get(p, "String");
    if (!json_is_object(p) || json_object_size(p) != 1 || (!json_is_string(re) && !json_is_string(lit)))
        return refuse(b, "%s.pattern is not {\"Regex\": ...} or {\"String\": ...}", where);
    json_t *s = re ? re : lit;
    const char *how = get_str(b, c, where, "behavior", &rc);
    if (!how) return rc;
    if ((rc = get_bool(b, c, where, "invert", 0, &invert))) return rc;
    static const struct { const char *name; behavior b; } B[] = {
        {"Removed", B_REMOVED}, {"Isolated", B_ISOLATED}, {"MergedWithPrevious", B_MERGED_PREV},
        {"MergedWithNext", B_MERGED_NEXT}, {"Contiguous", B_CONTIGUOUS}};
    int found = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(how, B[i].name)) found = i;
    if (found < 0) return refuse(b, "%s.behavior \"%s\" is not a Split behavior", where, how);
    if ((rc = compile_regex(b, json_string_value(s), json_string_length(s), !re, where))) return rc;
    b->split[b->n_split - 1].how = B[found].b;
    b->split[b->n_split - 1].invert = invert;
    return 0;
}

static int load_pre_tokenizer(tks_bpe *b, json_t *p) {
    const char *t = json_string_value(json_object_get(p, "type"));
    if (!t) return refuse(b, "pre_tokenizer is missing or has no type (a byte-level model needs ByteLevel)");
    if (!strcmp(t, "ByteLevel")) return load_byte_level(b, p, "pre_tokenizer");
    if (strcmp(t, "Sequence"))
        return refuse(b, "pre_tokenizer type \"%s\" is not supported (tokshard reproduces ByteLevel, "
                         "and Sequence of Split then ByteLevel)", t);
    json_t *items = json_object_get(p, "pretokenizers");
    if (!json_is_array(items) || !json_array_size(items))
        return refuse(b, "pre_tokenizer.pretokenizers is not a non-empty array");
    size_t n = json_array_size(items);
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i);
        json_t *c = json_array_get(items, i);
        const char *ct = json_string_value(json_object_get(c, "type"));
        int rc;
        if (ct && !strcmp(ct, "Split") && i + 1 < n) {
            rc = load_split(b, c, where);
        } else if (ct && !strcmp(ct, "ByteLevel") && i + 1 == n) {
            rc = load_byte_level(b, c, where);
        } else {
            rc = refuse(b, "%s type \"%s\" is not supported there (tokshard reproduces Split pre-tokenizers "
                           "followed by one ByteLevel, last)", where, ct ? ct : "?");
        }
        if (rc) return rc;
    }
    return 0;
}

static int load_post_processor(tks_bpe *b, json_t *p, const char *where) {
    if (!p || json_is_null(p)) return 0;
    const char *t = json_string_value(json_object_get(p, "type"));
    if (t && (!strcmp(t, "ByteLevel") || !strcmp(t, "TemplateProcessing"))) return 0;
    if (t && !strcmp(t, "Sequence")) {
        json_t *items = json_object_get(p, "processors");
        for (size_t i = 0; i < json_array_size(items); i++) {
            char w[64];
            snprintf(w, sizeof w, "%s.processors[%zu]", where, i);
            int rc = load_post_processor(b, json_array_get(items, i), w);
            if (rc) return rc;
        }
        return 0;
    }
    return refuse(b, "%s type \"%s\" is not supported", where, t ? t : "?");
}

/* The raw bytes a vocab string stands for, into out (at most strlen(s)
 * bytes); returns 1 when every character is in the byte alphabet, else 0
 * (out then holds the string's own UTF-8). */
static int unmap_token(const char *s, size_t n, const int32_t *char_byte, char *out, size_t *out_len) {
    size_t m = 0;
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (k <= 0 || cp >= 324 || char_byte[cp] < 0) {
            memcpy(out, s, n);
            *out_len = n;
            return 0;
        }
        out[m++] = (char)char_byte[cp];
        i += k;
    }
    *out_len = m;
    return 1;
}

/* model: a BPE model without the options tokshard does not reproduce */
static int check_model(tks_bpe *b, json_t *m) {
    static const char *const known[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                        "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                        "vocab", "merges", NULL};
    const char *t = json_string_value(json_object_get(m, "type"));
    if (!t) return refuse(b, "model is missing or has no type");
    if (strcmp(t, "BPE")) return refuse(b, "model type \"%s\" is not supported (tokshard reproduces BPE)", t);
    int rc = only_keys(b, m, "model", known), flag = 0;
    if (rc) return rc;
    static const char *const nulls[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(m, nulls[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && i >= 2 && !json_string_length(v)))
            return refuse(b, "model.%s is set: not supported (tokshard reproduces byte-level BPE without it)",
                          nulls[i]);
    }
    if ((rc = get_bool(b, m, "model", "byte_fallback", 0, &flag))) return rc;
    if (flag) return refuse(b, "model.byte_fallback is true: not supported (byte-level BPE needs no fallback)");
    return get_bool(b, m, "model", "ignore_merges", 0, &b->ignore_merges);
}

/* The ids: the model's [0, nv), then the added tokens that are not in it,
 * without holes. *n_ids: how many in all. */
static int count_ids(tks_bpe *b, json_t *vocab, json_t *added, size_t nv, size_t *n_ids_out) {
    size_t na = json_array_size(added), n_ids = nv;
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        const char *c = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || !c)
            return refuse(b, "added_tokens[%zu] has no integer id or no string content", i);
        json_int_t v = json_integer_value(id);
        json_t *in = json_object_get(vocab, c);
        if (in) {
            if (!json_is_integer(in) || json_integer_value(in) != v)
                return refuse(b, "added_tokens[%zu] \"%s\" has id %lld but model.vocab gives it another", i, c,
                              (long long)v);
        } else {
            if (v < (json_int_t)nv || v >= (json_int_t)(nv + na))
                return refuse(b, "added_tokens[%zu] \"%s\": id %lld is not after the model's %zu ids without "
                              "holes", i, c, (long long)v, nv);
            if ((size_t)v + 1 > n_ids) n_ids = (size_t)v + 1;
        }
    }
    *n_ids_out = n_ids;
    return 0;
}

/* str[id], slen[id]: every id's string (the vocab's keys, then the added
 * tokens' contents, borrowed from the JSON), and which ids are special;
 * *total: the strings' bytes. */
static int read_vocab(tks_bpe *b, json_t *vocab, json_t *added, size_t nv, size_t n_ids, const char **str,
                      size_t *slen, size_t *total_out) {
    size_t na = json_array_size(added);
    int rc = 0;
    const char *k;
    json_t *v;
    size_t total = 0;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)nv)
            return refuse(b, "model.vocab[\"%s\"]: id %lld is not in [0, %zu) (ids must have no holes)", k,
                          (long long)id, nv);
        if (str[id])
            return refuse(b, "model.vocab[\"%s\"]: id %lld is also \"%s\"", k, (long long)id, str[id]);
        str[id] = k;
        slen[id] = strlen(k);
        total += slen[id];
    }
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        json_t *c = json_object_get(a, "content");
        int special = 0;
        if ((rc = get_bool(b, a, "added_tokens[]", "special", 0, &special))) return rc;
        if (id >= (json_int_t)nv) {
            if (str[id])
                return refuse(b, "added_tokens[%zu]: id %lld is also \"%s\"", i, (long long)id, str[id]);
            str[id] = json_string_value(c);
            slen[id] = json_string_length(c);
            total += slen[id];
        }
        b->special[id] = (uint8_t)special;
    }
    for (size_t i = nv; i < n_ids; i++)
        if (!str[i])
            return refuse(b, "added_tokens: no token has id %zu (ids must have no holes below %zu)", i, n_ids);
    *total_out = total;
    return 0;
}

/* Each id's bytes (the byte-level alphabet mapped back to bytes), the
 * single-byte ids and the hash of the model's byte strings. */
static int vocab_tables(tks_bpe *b, const char **str, const size_t *slen, size_t nv, size_t n_ids,
                        size_t total) {
    int32_t char_byte[324];
    for (int c = 0; c < 324; c++) char_byte[c] = -1;
    for (unsigned x = 0; x < 256; x++) char_byte[byte_char(x)] = (int32_t)x;
    b->bytes = malloc(total ? total : 1);
    b->vmask = pow2_at_least(nv * 2) - 1;
    b->vslot = malloc((b->vmask + 1) * sizeof *b->vslot);
    if (!b->bytes || !b->vslot)
        return nomem(b, "vocab");
    memset(b->vslot, 0xff, (b->vmask + 1) * sizeof *b->vslot);
    for (unsigned x = 0; x < 256; x++) b->byte_id[x] = TKS_NO_ID;
    for (size_t id = 0; id < n_ids; id++) {
        size_t n;
        b->alpha[id] = (uint8_t)unmap_token(str[id], slen[id], char_byte, b->bytes + b->off[id], &n);
        b->off[id + 1] = b->off[id] + n;
        if (id < nv && b->alpha[id]) {
            const char *s = b->bytes + b->off[id];
            if (n == 1) b->byte_id[(uint8_t)s[0]] = (uint32_t)id;
            size_t h = XXH3_64bits(s, n) & b->vmask;
            while (b->vslot[h] != TKS_NO_ID) h = (h + 1) & b->vmask;
            b->vslot[h] = (uint32_t)id;
        }
    }

    return 0;
}

/* model.merges ("a b" strings or [a, b] pairs, one form): each pair's rank
 * and result in the merge hash. */
static int read_merges(tks_bpe *b, json_t *m, json_t *vocab) {
    int rc = 0;
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges))
        return refuse(b, "model.merges is missing or not an array");
    size_t nm = json_array_size(merges);
    b->mmask = pow2_at_least(nm * 2 + 1) - 1;
    b->mslot = calloc(b->mmask + 1, sizeof *b->mslot);
    if (!b->mslot)
        return nomem(b, "merges");
    int form = 0; /* 1: "a b" strings, 2: [a, b] pairs (tokenizers takes one or the other) */
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        const char *l, *r;
        size_t ll, rl;
        if (json_is_string(e) && form != 2) {
            form = 1;
            l = json_string_value(e);
            const char *sp = strchr(l, ' ');
            if (!sp || strchr(sp + 1, ' ') || json_string_length(e) != strlen(l)) {
                rc = refuse(b, "model.merges[%zu] \"%s\" is not two tokens separated by one space", i, l);
                break;
            }
            ll = (size_t)(sp - l);
            r = sp + 1;
            rl = strlen(r);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1)) && form != 1) {
            form = 2;
            l = json_string_value(json_array_get(e, 0));
            ll = json_string_length(json_array_get(e, 0));
            r = json_string_value(json_array_get(e, 1));
            rl = json_string_length(json_array_get(e, 1));
        } else {
            rc = refuse(b, "model.merges[%zu] is not a \"a b\" string or an [a, b] pair (or mixes the forms)", i);
            break;
        }
        if (ll + rl + 1 > cat_cap) {
            cat_cap = 2 * (ll + rl + 1);
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                rc = nomem(b, "merges");
                break;
            }
            cat = nc;
        }
        memcpy(cat, l, ll);
        memcpy(cat + ll, r, rl);
        cat[ll + rl] = 0;
        json_t *lid, *rid, *nid;
        const char *lk = l, *rk = r;
        /* a pair's sides are their own strings; a line's left side is cut out */
        char *lcopy = NULL;
        if (form == 1) {
            lcopy = strndup(l, ll);
            if (!lcopy) {
                rc = nomem(b, "merges");
                break;
            }
            lk = lcopy;
        }
        lid = json_object_get(vocab, lk);
        rid = json_object_get(vocab, rk);
        nid = json_object_get(vocab, cat);
        if (!lid || !rid || !nid) {
            rc = refuse(b, "model.merges[%zu]: \"%s\" is not in model.vocab", i,
                        !lid ? lk : !rid ? rk : cat);
            free(lcopy);
            break;
        }
        free(lcopy);
        uint64_t key = ((uint64_t)json_integer_value(lid) << 32 | (uint64_t)json_integer_value(rid)) + 1;
        size_t h = mix64(key) & b->mmask;
        while (b->mslot[h].key && b->mslot[h].key != key) h = (h + 1) & b->mmask;
        /* a repeated merge takes the later rank, as tokenizers' HashMap does */
        b->mslot[h] = (merge_slot){key, (uint32_t)i, (uint32_t)json_integer_value(nid)};
    }
    free(cat);
    return rc;
}

static int load_model(tks_bpe *b, json_t *m, json_t *added) {
    int rc = check_model(b, m);
    if (rc) return rc;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return refuse(b, "model.vocab is missing or not an object");
    size_t nv = json_object_size(vocab), n_ids = 0, total = 0;
    if (nv == 0 || nv > UINT32_MAX / 2) return refuse(b, "model.vocab has %zu entries", nv);
    b->n_model = (uint32_t)nv;
    if ((rc = count_ids(b, vocab, added, nv, &n_ids))) return rc;
    b->n_ids = (uint32_t)n_ids;
    const char **str = calloc(n_ids, sizeof *str);
    size_t *slen = calloc(n_ids, sizeof *slen);
    b->special = calloc(n_ids, 1);
    b->alpha = calloc(n_ids, 1);
    b->off = calloc(n_ids + 1, sizeof *b->off);
    if (!str || !slen || !b->special || !b->alpha || !b->off) rc = nomem(b, "vocab");
    if (!rc) rc = read_vocab(b, vocab, added, nv, n_ids, str, slen, &total);
    if (!rc) rc = vocab_tables(b, str, slen, nv, n_ids, total);
    if (!rc) rc = read_merges(b, m, vocab);
    free(str);
    free(slen);
    return rc;
}

static int scratch_keys_init(tks_bpe *b);

int tks_bpe_load(const char *path, tks_bpe **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "tks_bpe_load: out is NULL");
    *out = NULL;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_load: path is NULL");
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "tokenizer", &base, &size);
    if (rc) return rc;
    tks_bpe *b = calloc(1, sizeof *b);
    if (!b || !(b->path = strdup(path))) {
        free(b);
        tks_unmap(base, size);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory loading %s", path);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(base, size));
    memcpy(b->fingerprint, c.digest, 16);
    json_error_t je;
    json_t *root = json_loadb((const char *)base, size, JSON_REJECT_DUPLICATES, &je);
    tks_unmap(base, size);
    if (!root) {
        rc = tks_fail(TKS_ERR_TOKENIZER, path, TKS_NONE, (uint64_t)je.position,
                      "%s is not valid JSON (line %d, column %d: %s)", path, je.line, je.column, je.text);
        tks_error_set_doc(TKS_NONE, (uint64_t)je.line);
        free(b->path);
        free(b);
        return rc;
    }
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if (!json_is_object(root)) rc = refuse(b, "the top level is not a JSON object");
    if (!rc) rc = only_keys(b, root, "(top level)", top);
    if (!rc && json_object_get(root, "truncation") && !json_is_null(json_object_get(root, "truncation")))
        rc = refuse(b, "truncation is set: not supported (it would cut documents)");
    if (!rc && json_object_get(root, "padding") && !json_is_null(json_object_get(root, "padding")))
        rc = refuse(b, "padding is set: not supported");
    json_t *added = json_object_get(root, "added_tokens");
    if (!rc && added && !json_is_array(added)) rc = refuse(b, "added_tokens is not an array");
    if (!rc) rc = load_normalizer(b, json_object_get(root, "normalizer"));
    if (!rc) rc = load_pre_tokenizer(b, json_object_get(root, "pre_tokenizer"));
    if (!rc) rc = load_post_processor(b, json_object_get(root, "post_processor"), "post_processor");
    if (!rc) {
        json_t *d = json_object_get(root, "decoder");
        const char *t = json_string_value(json_object_get(d, "type"));
        if (!t || strcmp(t, "ByteLevel"))
            rc = refuse(b, "decoder type \"%s\" is not supported (tokshard decodes ByteLevel)", t ? t : "null");
    }
    if (!rc) rc = load_model(b, json_object_get(root, "model"), added);
    json_decref(root);
    if (!rc) rc = scratch_keys_init(b);
    if (rc) {
        tks_bpe_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Per-thread scratch
 * ------------------------------------------------------------------------- */
typedef struct hent {
    uint32_t rank, pos, new_id;
} hent;

struct scratch {
    scratch *next_all;     /* the handle's list */
    int in_use;            /* owned by a live thread */
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    uint32_t *sym;         /* a piece's symbols: id, or TKS_NO_ID once merged away */
    int32_t *prev, *next;  /* their neighbours, -1 at the ends */
    size_t sym_cap;        /* elements */
    hent *heap;
    size_t heap_cap;       /* elements */
};

static void scratch_destroy(scratch *s) {
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s);
}

static void scratch_release(void *p) {
    scratch *s = p;
    /* the thread is gone: the scratch stays with the handle for another thread */
    __atomic_store_n(&s->in_use, 0, __ATOMIC_RELEASE);
}

static int scratch_keys_init(tks_bpe *b) {
    if (pthread_key_create(&b->key, scratch_release))
        return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "no thread-specific key left (pthread_key_create)");
    pthread_mutex_init(&b->mu, NULL);
    b->have_key = 1;
    return 0;
}

static scratch *scratch_new(void) {
    scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->md = pcre2_match_data_create(16, NULL);
    s->mc = pcre2_match_context_create(NULL);
    /* the JIT's backtracking stack grows up to 64 MiB (a long run of the
     * same class); the limits keep PCRE2 from giving up on long pieces */
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
 * Encoding
 * ------------------------------------------------------------------------- */
typedef struct enc {
    const tks_bpe *b;
    scratch *s;
    tks_ids *out;
} enc;

static int push_id(enc *e, uint32_t id) {
    tks_ids *o = e->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        if (tks_resize(&o->ids, cap, sizeof *o->ids))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory growing the id buffer");
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

static void heap_push(hent *h, size_t *n, hent x) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < x.rank || (h[p].rank == x.rank && h[p].pos < x.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static hent heap_pop(hent *h, size_t *n) {
    hent top = h[0], x = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (x.rank < h[c].rank || (x.rank == h[c].rank && x.pos < h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static int candidate(const tks_bpe *b, scratch *s, size_t *nh, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0) return 0;
    const merge_slot *m = merge_find(b, s->sym[pos], s->sym[nx]);
    if (m) heap_push(s->heap, nh, (hent){m->rank, (uint32_t)pos, m->new_id});
    return 0;
}

/* One pre-token (raw bytes) through the BPE model. */
static int bpe_piece(enc *e, const char *t, size_t n) {
    const tks_bpe *b = e->b;
    scratch *s = e->s;
    if (b->ignore_merges) {
        uint32_t id = vocab_find(b, t, n);
        if (id != TKS_NO_ID) return push_id(e, id);
    }
    if (n > INT32_MAX / 3)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "a pre-token of %zu bytes is over 700 MB", n);
    if (n > s->sym_cap) {
        size_t cap = n < 256 ? 256 : n;
        if (tks_resize(&s->sym, cap, sizeof *s->sym) || tks_resize(&s->prev, cap, sizeof *s->prev) ||
            tks_resize(&s->next, cap, sizeof *s->next) || tks_resize(&s->heap, 3 * cap, sizeof *s->heap))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for a %zu-byte pre-token", n);
        s->sym_cap = cap;
        s->heap_cap = 3 * cap;
    }
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
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < m; i++) candidate(b, s, &nh, i);
    while (nh) {
        hent top = heap_pop(s->heap, &nh);
        int32_t pos = (int32_t)top.pos, nx = s->next[pos];
        if (s->sym[pos] == TKS_NO_ID || nx < 0) continue;
        const merge_slot *cur = merge_find(b, s->sym[pos], s->sym[nx]);
        if (!cur || cur->new_id != top.new_id) continue;
        s->sym[pos] = top.new_id;
        s->sym[nx] = TKS_NO_ID;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = pos;
        if (s->prev[pos] >= 0) candidate(b, s, &nh, s->prev[pos]);
        candidate(b, s, &nh, pos);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        int rc = push_id(e, s->sym[i]);
        if (rc) return rc;
    }
    return 0;
}

static int split_level(enc *e, int lv, const char *t, size_t n);

/* The pieces a splitter gives, regrouped by its behavior: the state of
 * tokenizers' NormalizedString::split folds, run forwards. */
typedef struct regroup {
    size_t ps, pe;   /* the pending piece */
    int have;        /* there is one */
    int prev_match;  /* the previous segment was a match */
} regroup;

static int segment(enc *e, int lv, const char *t, behavior how, regroup *g, size_t ss, size_t se, int m) {
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
    const splitter *sp = &b->split[lv];
    regroup g = {0, 0, 0, 0};
    size_t pos = 0;
    int rc = 0;
    while (pos < n && !rc) {
        int mr = pcre2_match(sp->re, (PCRE2_SPTR)t, n, pos, PCRE2_NO_UTF_CHECK, e->s->md, e->s->mc);
        size_t ms = n, me = n;
        if (mr >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->s->md);
            ms = ov[0], me = ov[1];
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

/* Offset of the first byte that is not valid UTF-8 (as Rust's str: no
 * surrogates, no overlong forms, nothing above U+10FFFF), or len. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
    size_t i = 0;
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
        i += k + 1;
    }
    return len;
}

int tks_bpe_encode(const tks_bpe *b, const char *text, size_t len, tks_ids *out) {
    if (!b || !out || (!text && len))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_encode: NULL argument");
    out->n = 0;
    size_t bad = utf8_invalid_at((const uint8_t *)text, len);
    if (bad < len)
        return tks_fail(TKS_ERR_UTF8, NULL, TKS_NONE, (uint64_t)bad,
                        "the text is not valid UTF-8 at byte %zu (clean it first: --invalid-utf8)", bad);
    enc e = {b, get_scratch((tks_bpe *)b), out};
    if (!e.s) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the encoder's scratch");
    utf8proc_uint8_t *norm = NULL;
    if (b->nfc) {
        size_t i = 0;
        while (i < len && !((uint8_t)text[i] & 0x80)) i++;
        if (i < len) { /* ASCII is its own NFC */
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &norm,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0)
                return tks_fail(r == UTF8PROC_ERROR_NOMEM ? TKS_ERR_NOMEM : TKS_ERR_TOKENIZER, NULL, TKS_NONE,
                                TKS_NONE, "NFC normalization failed: %s", utf8proc_errmsg(r));
            text = (const char *)norm;
            len = (size_t)r;
        }
    }
    int rc = split_level(&e, 0, text, len);
    free(norm);
    if (rc) out->n = 0;
    return rc;
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
        if (ids[i] >= b->n_ids)
            return tks_fail(TKS_ERR_TOKEN_RANGE, b->path, TKS_NONE, (uint64_t)i,
                            "id %u at position %zu is not below the vocabulary size %u", ids[i], i, b->n_ids);
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

const uint8_t *tks_bpe_fingerprint(const tks_bpe *b) { return b->fingerprint; }

int tks_bpe_is_special(const tks_bpe *b, uint32_t id) { return id < b->n_ids && b->special[id]; }

const char *tks_bpe_token_bytes(const tks_bpe *b, uint32_t id, size_t *len) {
    if (id >= b->n_ids) return NULL;
    if (len) *len = b->off[id + 1] - b->off[id];
    return b->bytes + b->off[id];
}

void tks_bpe_free(tks_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_split; i++) pcre2_code_free(b->split[i].re);
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
    free(b->off);
    free(b->bytes);
    free(b->special);
    free(b->alpha);
    free(b->vslot);
    free(b->mslot);
    free(b->path);
    free(b);
}
