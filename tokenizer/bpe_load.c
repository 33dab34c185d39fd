/*
 * bpe_load.c - loading a byte-level BPE tokenizer from a Hugging Face
 * tokenizer.json (tokenizers 0.20's serialization); a file that is tokshard's
 * descriptor of a tiktoken tokenizer goes to bpe_tiktoken.c. Both loaders
 * build the handle with bpe_build.c. What is reproduced, and what is
 * refused, is listed at tks_bpe_load in tokenizer.h; the encoder is bpe.c.
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
#include "tokenizer/load.h"
#include "tokenizer/bpe_vocab.h"


/* ---------------------------------------------------------------------------
 * tokenizer.json
 * ------------------------------------------------------------------------- */
/* Refuses a key of object `o` (at `where`) outside the NULL-terminated `known`. */
static int only_keys(const tks_bpe *b, json_t *o, const char *where, const char *const *known) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (const char *const *p = known; *p; p++) ok |= !strcmp(*p, k);
        if (!ok)
            return tks__bpe_refuse(b, "%s.%s is not supported (tokshard reproduces only the keys it knows exactly)",
                          where, k);
    }
    return 0;
}

/* The string of o[key]; NULL with an error when absent or not a string. */
static const char *get_str(const tks_bpe *b, json_t *o, const char *where, const char *key, int *rc) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        *rc = tks__bpe_refuse(b, "%s.%s is missing or not a string", where, key);
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
    if (!json_is_boolean(v)) return tks__bpe_refuse(b, "%s.%s is not a boolean", where, key);
    *val = json_is_true(v);
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
        if (!json_is_array(items)) return tks__bpe_refuse(b, "normalizer.normalizers is not an array");
        cnt = json_array_size(items);
        list = NULL;
    }
    for (size_t i = 0; i < cnt; i++) {
        json_t *c = list ? list[i] : json_array_get(items, i);
        const char *ct = json_string_value(json_object_get(c, "type"));
        if (!ct || strcmp(ct, "NFC"))
            return tks__bpe_refuse(b, "normalizer%s type \"%s\" is not supported (tokshard reproduces none and NFC)",
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
    if (aps) return tks__bpe_refuse(b, "%s.add_prefix_space true is not supported", where);
    if (use_regex) return tks__bpe_compile(b, tks__bpe_gpt2_pattern, strlen(tks__bpe_gpt2_pattern), 0, 0, where);
    return 0;
}

static int load_split(tks_bpe *b, json_t *c, const char *where) {
    static const char *const known[] = {"type", "pattern", "behavior", "invert", NULL};
    int rc = only_keys(b, c, where, known), invert = 0;
    if (rc) return rc;
    json_t *p = json_object_get(c, "pattern");
    json_t *re = json_object_get(p, "Regex"), *lit = json_object_get(p, "String");
    if (!json_is_object(p) || json_object_size(p) != 1 || (!json_is_string(re) && !json_is_string(lit)))
        return tks__bpe_refuse(b, "%s.pattern is not {\"Regex\": ...} or {\"String\": ...}", where);
    json_t *s = re ? re : lit;
    const char *how = get_str(b, c, where, "behavior", &rc);
    if (!how) return rc;
    if ((rc = get_bool(b, c, where, "invert", 0, &invert))) return rc;
    static const struct { const char *name; tks__bpe_behavior b; } B[] = {
        {"Removed", B_REMOVED}, {"Isolated", B_ISOLATED}, {"MergedWithPrevious", B_MERGED_PREV},
        {"MergedWithNext", B_MERGED_NEXT}, {"Contiguous", B_CONTIGUOUS}};
    int found = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(how, B[i].name)) found = i;
    if (found < 0) return tks__bpe_refuse(b, "%s.behavior \"%s\" is not a Split behavior", where, how);
    if ((rc = tks__bpe_compile(b, json_string_value(s), json_string_length(s), !re, 0, where))) return rc;
    b->split[b->n_split - 1].how = B[found].b;
    b->split[b->n_split - 1].invert = invert;
    return 0;
}

static int load_pre_tokenizer(tks_bpe *b, json_t *p) {
    const char *t = json_string_value(json_object_get(p, "type"));
    if (!t) return tks__bpe_refuse(b, "pre_tokenizer is missing or has no type (a byte-level model needs ByteLevel)");
    if (!strcmp(t, "ByteLevel")) return load_byte_level(b, p, "pre_tokenizer");
    if (strcmp(t, "Sequence"))
        return tks__bpe_refuse(b, "pre_tokenizer type \"%s\" is not supported (tokshard reproduces ByteLevel, "
                         "and Sequence of Split then ByteLevel)", t);
    json_t *items = json_object_get(p, "pretokenizers");
    if (!json_is_array(items) || !json_array_size(items))
        return tks__bpe_refuse(b, "pre_tokenizer.pretokenizers is not a non-empty array");
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
            rc = tks__bpe_refuse(b, "%s type \"%s\" is not supported there (tokshard reproduces Split pre-tokenizers "
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
    return tks__bpe_refuse(b, "%s type \"%s\" is not supported", where, t ? t : "?");
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
    if (!t) return tks__bpe_refuse(b, "model is missing or has no type");
    if (strcmp(t, "BPE")) return tks__bpe_refuse(b, "model type \"%s\" is not supported (tokshard reproduces BPE)", t);
    int rc = only_keys(b, m, "model", known), flag = 0;
    if (rc) return rc;
    static const char *const nulls[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(m, nulls[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && i >= 2 && !json_string_length(v)))
            return tks__bpe_refuse(b, "model.%s is set: not supported (tokshard reproduces byte-level BPE without it)",
                          nulls[i]);
    }
    if ((rc = get_bool(b, m, "model", "byte_fallback", 0, &flag))) return rc;
    if (flag) return tks__bpe_refuse(b, "model.byte_fallback is true: not supported (byte-level BPE needs no fallback)");
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
            return tks__bpe_refuse(b, "added_tokens[%zu] has no integer id or no string content", i);
        json_int_t v = json_integer_value(id);
        json_t *in = json_object_get(vocab, c);
        if (in) {
            if (!json_is_integer(in) || json_integer_value(in) != v)
                return tks__bpe_refuse(b, "added_tokens[%zu] \"%s\" has id %lld but model.vocab gives it another", i, c,
                              (long long)v);
        } else {
            if (v < (json_int_t)nv || v >= (json_int_t)(nv + na))
                return tks__bpe_refuse(b, "added_tokens[%zu] \"%s\": id %lld is not after the model's %zu ids without "
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
        if (!json_is_integer(v)) {
            char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            int r = tks__bpe_refuse(b, "model.vocab[\"%s\"]: %s is not an integer id", k, t ? t : "the value");
            free(t);
            return r;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= (json_int_t)nv)
            return tks__bpe_refuse(b, "model.vocab[\"%s\"]: id %lld is not in [0, %zu) (ids must have no holes)", k,
                          (long long)id, nv);
        if (str[id])
            return tks__bpe_refuse(b, "model.vocab[\"%s\"]: id %lld is also \"%s\"", k, (long long)id, str[id]);
        str[id] = k;
        slen[id] = strlen(k);
        total += slen[id];
    }
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        json_t *c = json_object_get(a, "content");
        int special = 0, normalized = 1, single_word = 0, lstrip = 0, rstrip = 0;
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if ((rc = get_bool(b, a, where, "special", 0, &special)) ||
            (rc = get_bool(b, a, where, "normalized", 1, &normalized)) ||
            (rc = get_bool(b, a, where, "single_word", 0, &single_word)) ||
            (rc = get_bool(b, a, where, "lstrip", 0, &lstrip)) || (rc = get_bool(b, a, where, "rstrip", 0, &rstrip)))
            return rc;
        if (!json_string_length(c)) return tks__bpe_refuse(b, "%s has an empty content", where);
        rc = tks__bpe_add_token(b, json_string_value(c), json_string_length(c), (uint32_t)id, special, normalized,
                                single_word || lstrip || rstrip);
        if (rc) return rc;
        if (id >= (json_int_t)nv) {
            if (str[id])
                return tks__bpe_refuse(b, "added_tokens[%zu]: id %lld is also \"%s\"", i, (long long)id, str[id]);
            str[id] = json_string_value(c);
            slen[id] = json_string_length(c);
            total += slen[id];
        }
        b->special[id] = (uint8_t)special;
    }
    for (size_t i = nv; i < n_ids; i++)
        if (!str[i])
            return tks__bpe_refuse(b, "added_tokens: no token has id %zu (ids must have no holes below %zu)", i, n_ids);
    *total_out = total;
    return 0;
}

/* Each id's bytes (the byte-level alphabet mapped back to bytes), whether
 * every character of it is in that alphabet (alpha), and the single-byte ids. */
static int vocab_tables(tks_bpe *b, const char **str, const size_t *slen, size_t nv, size_t n_ids,
                        size_t total, uint8_t *alpha) {
    int32_t char_byte[324];
    for (int c = 0; c < 324; c++) char_byte[c] = -1;
    for (unsigned x = 0; x < 256; x++) char_byte[tks__bpe_byte_char(x)] = (int32_t)x;
    b->bytes = malloc(total ? total : 1);
    if (!b->bytes) return tks__bpe_nomem(b, "vocab");
    for (unsigned x = 0; x < 256; x++) b->byte_id[x] = TKS_NO_ID;
    for (size_t id = 0; id < n_ids; id++) {
        size_t n;
        alpha[id] = (uint8_t)unmap_token(str[id], slen[id], char_byte, b->bytes + b->off[id], &n);
        b->off[id + 1] = b->off[id] + n;
        if (id < nv && alpha[id] && n == 1) b->byte_id[(uint8_t)b->bytes[b->off[id]]] = (uint32_t)id;
    }
    return 0;
}

/* model.merges ("a b" strings or [a, b] pairs, one form): each pair's rank
 * and result in the merge hash. */
static int read_merges(tks_bpe *b, json_t *m, json_t *vocab) {
    int rc = 0;
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges))
        return tks__bpe_refuse(b, "model.merges is missing or not an array");
    size_t nm = json_array_size(merges);
    b->mmask = tks__bpe_pow2(nm * 2 + 1) - 1;
    b->mslot = calloc(b->mmask + 1, sizeof *b->mslot);
    if (!b->mslot)
        return tks__bpe_nomem(b, "merges");
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
                rc = tks__bpe_refuse(b, "model.merges[%zu] \"%s\" is not two tokens separated by one space", i, l);
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
            rc = tks__bpe_refuse(b, "model.merges[%zu] is not a \"a b\" string or an [a, b] pair (or mixes the forms)", i);
            break;
        }
        if (ll + rl + 1 > cat_cap) {
            cat_cap = 2 * (ll + rl + 1);
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                rc = tks__bpe_nomem(b, "merges");
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
                rc = tks__bpe_nomem(b, "merges");
                break;
            }
            lk = lcopy;
        }
        lid = json_object_get(vocab, lk);
        rid = json_object_get(vocab, rk);
        nid = json_object_get(vocab, cat);
        if (!lid || !rid || !nid) {
            rc = tks__bpe_refuse(b, "model.merges[%zu]: \"%s\" is not in model.vocab", i,
                        !lid ? lk : !rid ? rk : cat);
            free(lcopy);
            break;
        }
        free(lcopy);
        uint64_t key = ((uint64_t)json_integer_value(lid) << 32 | (uint64_t)json_integer_value(rid)) + 1;
        size_t h = tks__bpe_mix64(key) & b->mmask;
        while (b->mslot[h].key && b->mslot[h].key != key) h = (h + 1) & b->mmask;
        /* a repeated merge takes the later rank, as tokenizers' HashMap does */
        b->mslot[h] = (tks__bpe_merge){key, (uint32_t)i, (uint32_t)json_integer_value(nid)};
    }
    free(cat);
    return rc;
}

static int load_model(tks_bpe *b, json_t *m, json_t *added) {
    int rc = check_model(b, m);
    if (rc) return rc;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return tks__bpe_refuse(b, "model.vocab is missing or not an object");
    size_t nv = json_object_size(vocab), n_ids = 0, total = 0;
    if (nv == 0 || nv > UINT32_MAX / 2) return tks__bpe_refuse(b, "model.vocab has %zu entries", nv);
    b->n_model = (uint32_t)nv;
    if ((rc = count_ids(b, vocab, added, nv, &n_ids))) return rc;
    b->n_ids = (uint32_t)n_ids;
    const char **str = calloc(n_ids, sizeof *str);
    size_t *slen = calloc(n_ids, sizeof *slen);
    uint8_t *alpha = calloc(n_ids, 1);
    b->special = calloc(n_ids, 1);
    b->off = calloc(n_ids + 1, sizeof *b->off);
    if (!str || !slen || !alpha || !b->special || !b->off) rc = tks__bpe_nomem(b, "vocab");
    if (!rc) rc = read_vocab(b, vocab, added, nv, n_ids, str, slen, &total);
    if (!rc) rc = vocab_tables(b, str, slen, nv, n_ids, total, alpha);
    if (!rc) rc = read_merges(b, m, vocab);
    /* the model's tokens made of byte-level characters are the ones a piece can be */
    if (!rc) rc = tks__bpe_finish(b, (uint32_t)nv, alpha);
    free(str);
    free(slen);
    free(alpha);
    return rc;
}

int tks_bpe_load(const char *path, tks_bpe **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "tks_bpe_load: out is NULL");
    *out = NULL;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_load: path is NULL");
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "tokenizer", &base, &size);
    if (rc) return rc;
    rc = tks__bpe_load_bytes(path, base, size, 0, out);
    tks_unmap(base, size);
    return rc;
}

int tks__bpe_load_bytes(const char *path, const uint8_t *base, size_t size, int no_cache, tks_bpe **out) {
    *out = NULL;
    int rc;
    tks_bpe *b = tks__bpe_new(path);
    if (!b) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory loading %s", path);
    b->no_cache = no_cache;
    /* the fingerprint names the compact form a earlier load left
     * (bpe_cache.c): when it is there and sound, no JSON is parsed */
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(base, size));
    rc = tks__bpe_cache_load(b, c.digest, size);
    if (rc == 0) {
        *out = b;
        return 0;
    }
    if (rc != 1 || b->cache_map) { /* a cache that mapped but did not build: parse instead */
        tks_bpe_free(b);
        if (!(b = tks__bpe_new(path)))
            return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory loading %s", path);
    }
    rc = 0;
    json_error_t je;
    json_t *root = json_loadb((const char *)base, size, JSON_REJECT_DUPLICATES, &je);
    if (root) memcpy(b->fingerprint, c.digest, 16);
    if (!root) {
        rc = tks_fail(TKS_ERR_TOKENIZER, path, TKS_NONE, (uint64_t)je.position,
                      "%s is not valid JSON (line %d, column %d: %s)", path, je.line, je.column, je.text);
        tks_error_set_doc(TKS_NONE, (uint64_t)je.line);
        tks_bpe_free(b);
        return rc;
    }
    if (json_is_object(root) && json_is_string(json_object_get(root, "type")) &&
        !strcmp(json_string_value(json_object_get(root, "type")), "tiktoken")) {
        /* tokshard's descriptor of a tiktoken tokenizer (bpe_tiktoken.c) */
        tks_bpe_free(b);
        rc = tks__bpe_load_descriptor(path, root, no_cache, out);
        json_decref(root);
        return rc;
    }
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if (!json_is_object(root)) rc = tks__bpe_refuse(b, "the top level is not a JSON object");
    if (!rc) rc = only_keys(b, root, "(top level)", top);
    if (!rc && json_object_get(root, "truncation") && !json_is_null(json_object_get(root, "truncation")))
        rc = tks__bpe_refuse(b, "truncation is set: not supported (it would cut documents)");
    if (!rc && json_object_get(root, "padding") && !json_is_null(json_object_get(root, "padding")))
        rc = tks__bpe_refuse(b, "padding is set: not supported");
    json_t *added = json_object_get(root, "added_tokens");
    if (!rc && added && !json_is_array(added)) rc = tks__bpe_refuse(b, "added_tokens is not an array");
    if (!rc) rc = load_normalizer(b, json_object_get(root, "normalizer"));
    if (!rc) rc = load_pre_tokenizer(b, json_object_get(root, "pre_tokenizer"));
    if (!rc) rc = load_post_processor(b, json_object_get(root, "post_processor"), "post_processor");
    if (!rc) {
        json_t *d = json_object_get(root, "decoder");
        const char *t = json_string_value(json_object_get(d, "type"));
        if (!t || strcmp(t, "ByteLevel"))
            rc = tks__bpe_refuse(b, "decoder type \"%s\" is not supported (tokshard decodes ByteLevel)", t ? t : "null");
    }
    if (!rc) rc = load_model(b, json_object_get(root, "model"), added);
    json_decref(root);
    if (rc) {
        tks_bpe_free(b);
        return rc;
    }
    tks__bpe_cache_store(b, b->fingerprint, size);
    *out = b;
    return 0;
}
