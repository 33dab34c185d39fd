/*
 * bpe_train_out.c - a trained byte-level BPE tokenizer's files
 * (tks_bpe_trainer_write): tokenizer.json as Hugging Face tokenizers 0.23
 * saves a BPE model (its serialization.rs: the vocabulary by id, the merges
 * by rank, a pair merged twice at its last rank; GPT-2's bytes_to_unicode
 * characters for the bytes), tokenizer_config.json for transformers, and a
 * tiktoken ranks file with tokshard's descriptor (tks_bpe_tiktoken_json's
 * format). Reads the trainer's state (bpe_train.h), calls none of its
 * functions.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_train.h"

/* cl100k's pattern as a tokenizer.json's Split can hold it: tokenizers'
 * Oniguruma reads $ as any line's end and {1,3}+ as a repeated {1,3}, so
 * the end of the text is \z and the possessive {1,3}+ (nothing follows it
 * in its alternative, so possessive changes nothing) a plain {1,3}. PCRE2
 * and Oniguruma cut the same pieces with it as tiktoken with the original. */
static const char CL100K_JSON[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++\\z|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s";

typedef struct jbuf {
    char *p;
    size_t n, cap;
    int oom;
} jbuf;

static void put(jbuf *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->n + n + 1 > j->cap) {
        size_t cap = j->cap ? 2 * j->cap : (1u << 20);
        while (cap < j->n + n + 1) cap *= 2;
        char *q = realloc(j->p, cap);
        if (!q) {
            j->oom = 1;
            return;
        }
        j->p = q;
        j->cap = cap;
    }
    memcpy(j->p + j->n, s, n);
    j->n += n;
    j->p[j->n] = 0;
}

static void puts_(jbuf *j, const char *s) { put(j, s, strlen(s)); }

/* A JSON string of UTF-8 text s[0..n) (escapes as serde_json writes them). */
static void put_text(jbuf *j, const char *s, size_t n) {
    put(j, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(j, s + run, i - run);
        run = i + 1;
        char e[8];
        const char *m = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (!m) snprintf(e, sizeof e, "\\u%04x", c), m = e;
        puts_(j, m);
    }
    put(j, s + run, n - run);
    put(j, "\"", 1);
}

/* Each byte's GPT-2 character as JSON string text, made once. */
static char esc[256][4];
static uint8_t esc_len[256];
static pthread_once_t esc_once = PTHREAD_ONCE_INIT;

static void esc_init(void) {
    for (unsigned x = 0; x < 256; x++) {
        uint32_t cp = tks__bpe_byte_char(x);
        char *e = esc[x];
        if (cp == '"' || cp == '\\') e[0] = '\\', e[1] = (char)cp, esc_len[x] = 2;
        else if (cp < 0x80) e[0] = (char)cp, esc_len[x] = 1;
        else e[0] = (char)(0xC0 | cp >> 6), e[1] = (char)(0x80 | (cp & 0x3F)), esc_len[x] = 2;
    }
}

/* Token id's string: a special token's text, else its bytes as GPT-2's
 * characters. */
static void put_token(jbuf *j, const tks_bpe_trainer *t, uint32_t id) {
    const char *s = t->tb + t->toff[id];
    size_t n = t->toff[id + 1] - t->toff[id];
    if (t->tspec[id] == 2) {
        put_text(j, s, n);
        return;
    }
    pthread_once(&esc_once, esc_init);
    put(j, "\"", 1);
    for (size_t i = 0; i < n; i++) put(j, esc[(unsigned char)s[i]], esc_len[(unsigned char)s[i]]);
    put(j, "\"", 1);
}

/* 1 for the names tks_pretok_open takes (the others are regexes). */
static int is_named(const char *p) {
    return !strcmp(p, "gpt2") || !strcmp(p, "llama3") || !strcmp(p, "cl100k") || !strcmp(p, "o200k") ||
           !strcmp(p, "qwen2");
}

/* The regex of the tokenizer.json's Split: the pattern's, cl100k's rewritten. */
static const char *json_regex(const char *pattern) {
    if (!strcmp(pattern, "cl100k")) return CL100K_JSON;
    if (!strcmp(pattern, "gpt2")) return tks__bpe_gpt2_pattern;
    return is_named(pattern) ? tks_tiktoken_pattern(pattern) : pattern;
}

static void pre_tokenizer(jbuf *j, const char *pattern) {
    if (!strcmp(pattern, "gpt2")) {
        puts_(j, "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                 "\"use_regex\": true},\n");
        return;
    }
    puts_(j, "  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n"
             "      {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
    const char *r = json_regex(pattern);
    put_text(j, r, strlen(r));
    puts_(j, "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
             "      {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": "
             "false}\n    ]\n  },\n");
}

static void tokenizer_json(jbuf *j, const tks_bpe_trainer *t, const tks_bpe_write_opts *o) {
    puts_(j, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (uint32_t id = 0; id < t->n_tok; id++) {
        if (!t->tspec[id]) continue;
        char head[64];
        snprintf(head, sizeof head, "%s\n    {\"id\": %u, \"content\": ", id ? "," : "", id);
        puts_(j, head);
        put_token(j, t, id);
        puts_(j, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                 "\"special\": true}");
    }
    puts_(j, t->n_specials ? "\n  ],\n" : "],\n");
    puts_(j, "  \"normalizer\": null,\n");
    pre_tokenizer(j, o->pattern);
    puts_(j, "  \"post_processor\": null,\n  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
             "\"trim_offsets\": true, \"use_regex\": true},\n  \"model\": {\n    \"type\": \"BPE\",\n"
             "    \"dropout\": null,\n    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
             "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n");
    puts_(j, o->ignore_merges ? "    \"ignore_merges\": true,\n" : "    \"ignore_merges\": false,\n");
    puts_(j, "    \"vocab\": {");
    for (uint32_t id = 0; id < t->n_tok; id++) {
        puts_(j, id ? ",\n      " : "\n      ");
        put_token(j, t, id);
        char v[24];
        snprintf(v, sizeof v, ": %u", id);
        puts_(j, v);
    }
    puts_(j, "\n    },\n    \"merges\": [");
    int first = 1;
    for (uint64_t i = 0; i < t->n_mg; i++) {
        if (!t->keep[i]) continue;
        puts_(j, first ? "\n      [" : ",\n      [");
        first = 0;
        put_token(j, t, t->mg[3 * i]);
        puts_(j, ", ");
        put_token(j, t, t->mg[3 * i + 1]);
        puts_(j, "]");
    }
    puts_(j, first ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n");
}

/* The file `name` of the output directory, crash-safely through its
 * descriptor (tks_write_file_at: a new random temporary name created with
 * O_EXCL|O_NOFOLLOW, renamed through the descriptor). */
typedef struct outdir {
    int fd;          /* the directory, open */
    const char *dir; /* its name, for messages */
} outdir;

static int write_buf(const outdir *d, const char *name, const char *p, size_t n) {
    tks_piece piece = {p, n};
    return tks_write_file_at(d->fd, d->dir, name, &piece, 1, 0644);
}

/* The id of special token `text` (NULL: none; TKS_NO_ID with an error when
 * it is not one of them). */
static int special_id(const tks_bpe_trainer *t, const char *text, const char *what, uint32_t *id) {
    *id = TKS_NO_ID;
    if (!text) return 0;
    for (uint32_t i = 0; i < t->n_tok; i++) {
        if (!t->tspec[i]) continue;
        jbuf a = {0};
        put_token(&a, t, i);
        jbuf b = {0};
        put_text(&b, text, strlen(text));
        int same = !a.oom && !b.oom && !strcmp(a.p, b.p);
        free(a.p);
        free(b.p);
        if (same) {
            *id = i;
            return 0;
        }
    }
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "the %s \"%s\" is not one of the special tokens: add it to --special-tokens", what, text);
}

static int tokenizer_config(const tks_bpe_trainer *t, const tks_bpe_write_opts *o, const outdir *od) {
    const char *dir = od->dir;
    const char *names[3] = {o->bos_token, o->eos_token, o->pad_token};
    static const char *const keys[3] = {"bos_token", "eos_token", "pad_token"}, *const what[3] = {
        "BOS token", "EOS token", "pad token"};
    json_t *cfg = json_object(), *dec = json_object();
    int rc = cfg && dec ? 0 : tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    for (int k = 0; k < 3 && !rc; k++) {
        uint32_t id;
        rc = special_id(t, names[k], what[k], &id);
    }
    for (uint32_t id = 0; id < t->n_tok && !rc; id++) {
        if (!t->tspec[id]) continue;
        jbuf b = {0};
        put_token(&b, t, id);
        json_t *s = b.oom ? NULL : json_loads(b.p, JSON_DECODE_ANY, NULL);
        free(b.p);
        char key[16];
        snprintf(key, sizeof key, "%u", id);
        json_object_set_new(dec, key, json_pack("{s:o, s:b, s:b, s:b, s:b, s:b}", "content", s ? s : json_null(),
                                                "lstrip", 0, "normalized", 0, "rstrip", 0, "single_word", 0,
                                                "special", 1));
    }
    if (!rc) {
        json_object_set_new(cfg, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
        for (int k = 0; k < 3; k++)
            json_object_set_new(cfg, keys[k], names[k] ? json_string(names[k]) : json_null());
        json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
        json_object_set(cfg, "added_tokens_decoder", dec);
    }
    char *text = rc ? NULL : json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!rc && !text) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = write_buf(od, "tokenizer_config.json", text, strlen(text));
    free(text);
    json_decref(cfg);
    json_decref(dec);
    return rc;
}

/* RFC 4648 base64, padded, of s[0..n) into out (4 * ((n + 2) / 3) + 1 bytes). */
static void base64(const unsigned char *s, size_t n, char *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = A[v >> 18];
        out[o++] = A[(v >> 12) & 63];
        out[o++] = i + 1 < n ? A[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? A[v & 63] : '=';
    }
    out[o] = 0;
}

/* tokenizer.tiktoken (ranks: the ids after the special tokens, in order)
 * and tiktoken.json, tks_bpe_tiktoken_json's descriptor of it. */
static int tiktoken_files(const tks_bpe_trainer *t, const tks_bpe_write_opts *o, const outdir *od) {
    const char *dir = od->dir;
    /* a special token the merges make, or a byte's token, would be a rank too */
    int clash = 0;
    for (uint64_t i = 0; i < t->n_mg && !clash; i++) clash = t->mg[3 * i + 2] < t->n_specials;
    for (unsigned x = 0; x < 256 && !clash; x++) clash = t->byte_id[x] < t->n_specials;
    if (clash)
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE,
                        "a special token is also a token the merges or a byte make: a tiktoken file cannot hold "
                        "it apart from its ranks; leave out --tiktoken or that special token");
    jbuf j = {0};
    char *b64 = NULL;
    size_t b64_cap = 0;
    for (uint32_t id = t->n_specials; id < t->n_tok && !j.oom; id++) {
        size_t n = t->toff[id + 1] - t->toff[id];
        if (4 * ((n + 2) / 3) + 1 > b64_cap) {
            b64_cap = 4 * ((n + 2) / 3) + 64;
            char *q = realloc(b64, b64_cap);
            if (!q) {
                j.oom = 1;
                break;
            }
            b64 = q;
        }
        base64((const unsigned char *)t->tb + t->toff[id], n, b64);
        char r[24];
        snprintf(r, sizeof r, " %u\n", id - t->n_specials);
        puts_(&j, b64);
        puts_(&j, r);
    }
    free(b64);
    char hx[33];
    int rc = j.oom ? tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory") : 0;
    if (!rc) rc = write_buf(od, "tokenizer.tiktoken", j.p ? j.p : "", j.n);
    if (!rc) { /* the ranks' XXH3-128 as tks_file_xxh3_128 gives it, from the bytes written */
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(j.p ? j.p : "", j.n));
        tks_hex(c.digest, 16, hx);
    }
    free(j.p);
    if (rc) return rc;
    uint32_t n_ranks = t->n_tok - t->n_specials;
    json_t *sp = json_array();
    for (uint32_t id = 0; sp && id < t->n_specials; id++) { /* the token's text, as tokenizer.json has it */
        jbuf q = {0};
        put_token(&q, t, id);
        json_t *text = q.oom ? NULL : json_loads(q.p, JSON_DECODE_ANY, NULL);
        free(q.p);
        json_array_append_new(sp, json_pack("[o,I]", text ? text : json_string(""), (json_int_t)(n_ranks + id)));
    }
    int named = is_named(o->pattern);
    json_t *d = json_pack("{s:s, s:s, s:s, s:s?, s:s, s:o}", "type", "tiktoken", "ranks_file", "tokenizer.tiktoken",
                          "ranks_xxh3", hx, "pattern_name", named ? o->pattern : NULL, "pattern",
                          named ? tks_tiktoken_pattern(o->pattern) : o->pattern, "special_tokens", sp);
    char *s = d ? json_dumps(d, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(d);
    jbuf out = {0};
    if (s) puts_(&out, s), puts_(&out, "\n");
    free(s);
    rc = !s || out.oom ? tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory")
                       : write_buf(od, "tiktoken.json", out.p, out.n);
    free(out.p);
    return rc;
}

int tks_bpe_trainer_write(const tks_bpe_trainer *t, const tks_bpe_write_opts *o, int dirfd, const char *dir) {
    if (!t || !o || !o->pattern || !dir || dirfd < 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_trainer_write: NULL argument");
    if (!t->ran || !t->keep)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_trainer_write: the trainer has not run");
    jbuf j = {0};
    tokenizer_json(&j, t, o);
    int rc = j.oom ? tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory writing tokenizer.json") : 0;
    outdir od = {dirfd, dir};
    if (!rc) rc = write_buf(&od, "tokenizer.json", j.p, j.n);
    free(j.p);
    if (!rc) rc = tokenizer_config(t, o, &od);
    if (!rc && o->tiktoken) rc = tiktoken_files(t, o, &od);
    return rc;
}
