/* tok.c - one handle over the tokenizer kinds the pipeline builds with:
 * a sentencepiece model (spm.cc, with the fast encoder) or a byte-level BPE
 * tokenizer (bpe*.c) from a tokenizer.json, a tiktoken ranks file or
 * tokshard's tiktoken descriptor. The kind is read from the file's content,
 * not its name: a tokenizer.json or a descriptor is a JSON object, a ranks
 * file starts with a "BASE64 RANK" line, a sentencepiece model is a
 * protobuf (whose first byte is a field tag, never '{' nor a base64
 * character followed by a space and digits). */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <limits.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"
#include "common/tks_bits.h"

struct tks_tok {
    tks_spm *spm;
    tks_bpe *bpe;
    uint32_t bos, eos, pad, unk; /* byte-level BPE: from tokenizer_config.json */
    char config[PATH_MAX];       /* the tokenizer_config.json read, "" when none */
};

/* 1 when the bytes start (after whitespace) with '{'. */
static int looks_like_json(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i < n && p[i] == '{';
}

/* The id of the special token whose text is `content` (added tokens only). */
static uint32_t special_id(const tks_bpe *b, const char *content) {
    size_t want = strlen(content);
    for (uint32_t id = 0, n = tks_bpe_vocab_size(b); id < n; id++) {
        size_t len = 0;
        const char *s = tks_bpe_is_special(b, id) ? tks_bpe_token_bytes(b, id, &len) : NULL;
        if (s && len == want && !memcmp(s, content, len)) return id;
    }
    return TKS_NO_ID;
}

/* BOS, EOS, pad and unk of a tokenizer.json from the tokenizer_config.json
 * beside it (transformers' file: "bos_token" etc. as a string or an object
 * with "content"); absent file or key: TKS_NO_ID. A token the config names
 * that is not one of the tokenizer's special tokens is refused. */
static int read_config(tks_tok *t, const char *path) {
    t->bos = t->eos = t->pad = t->unk = TKS_NO_ID;
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path) : 1;
    if (snprintf(t->config, sizeof t->config, "%.*s/tokenizer_config.json", dl, slash ? path : ".") >=
        (int)sizeof t->config)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "%s: path too long", path);
    if (access(t->config, F_OK) != 0) {
        t->config[0] = 0;
        return 0;
    }
    int fd = -1, orc = tks_open_regular(t->config, "tokenizer config", &fd, NULL); /* never waits on a FIFO */
    FILE *f = orc ? NULL : fdopen(fd, "rb");
    if (orc) return orc;
    if (!f) {
        close(fd);
        return tks_fail(TKS_ERR_IO, t->config, TKS_NONE, TKS_NONE, "cannot read %s", t->config);
    }
    json_error_t err;
    json_t *j = json_loadf(f, 0, &err);
    fclose(f);
    if (!json_is_object(j)) {
        json_decref(j);
        return tks_fail(TKS_ERR_TOKENIZER, t->config, TKS_NONE, TKS_NONE,
                        "%s: not a JSON object (line %d: %s): fix or remove it (it gives the tokenizer's "
                        "BOS and EOS)", t->config, err.line, err.text);
    }
    static const char *const keys[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    uint32_t *ids[] = {&t->bos, &t->eos, &t->pad, &t->unk};
    int rc = 0;
    for (int k = 0; k < 4 && !rc; k++) {
        json_t *v = json_object_get(j, keys[k]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!json_is_string(v)) continue;
        *ids[k] = special_id(t->bpe, json_string_value(v));
        if (*ids[k] == TKS_NO_ID)
            rc = tks_fail(TKS_ERR_TOKENIZER, t->config, TKS_NONE, TKS_NONE,
                          "%s: \"%s\" is \"%s\", which is not a special token of %s: the two files do "
                          "not belong together", t->config, keys[k], json_string_value(v), path);
    }
    json_decref(j);
    return rc;
}

int tks_tok_load(const char *path, tks_tok **out) { return tks_tok_load_opts(path, NULL, out); }

/* A tiktoken tokenizer with no tokenizer_config.json: <|endoftext|> ends
 * documents when it is one of its special tokens (OpenAI's encodings), else
 * <|end_of_text|>, with <|begin_of_text|> as BOS (Llama 3's). */
static void tiktoken_defaults(tks_tok *t) {
    if (t->config[0] || !tks_bpe_tiktoken_ranks(t->bpe)) return;
    t->eos = special_id(t->bpe, "<|endoftext|>");
    if (t->eos == TKS_NO_ID) { /* Llama 3's: the base models' BOS and EOS */
        t->eos = special_id(t->bpe, "<|end_of_text|>");
        t->bos = special_id(t->bpe, "<|begin_of_text|>");
    }
}

void tks_tok_free(tks_tok *t) {
    if (!t) return;
    tks_spm_free(t->spm);
    tks_bpe_free(t->bpe);
    free(t);
}

int tks_tok_load_opts(const char *path, const tks_tok_opts *o, tks_tok **out) {
    *out = NULL;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "no tokenizer path");
    /* opened once, as a regular file or refused at once (a FIFO without a
     * writer would block the first read, deaf to SIGTERM; a device would
     * never end): the kind is told from the bytes the loader then reads */
    const uint8_t *base = NULL;
    size_t size = 0;
    int rc = tks_map_file(path, "tokenizer", &base, &size);
    int is_json = !rc && looks_like_json(base, size);
    int tiktoken = !rc && !is_json && tks__tiktoken_sniff_bytes(base, size);
    int tt_opts = o && ((o->pattern && *o->pattern) || o->special_tokens);
    tks_tok *t = rc ? NULL : calloc(1, sizeof *t);
    if (!rc && !t) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && tt_opts && !tiktoken)
        rc = tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE,
                      "--pattern and --special-tokens go with a tiktoken ranks file, and %s is not one (its "
                      "own file says how it splits text): leave them out", path);
    if (!rc && tiktoken) {
        tks_tiktoken_opts to = {o ? o->pattern : NULL, o ? o->special_tokens : NULL};
        rc = tks__bpe_load_tiktoken_bytes(path, base, size, &to, o && o->no_cache, &t->bpe);
    } else if (!rc && is_json) {
        rc = tks__bpe_load_bytes(path, base, size, o && o->no_cache, &t->bpe);
    } else if (!rc) {
        rc = tks__spm_load_bytes(path, base, size, &t->spm);
    }
    tks_unmap(base, size);
    if (!rc && t->bpe) rc = read_config(t, path);
    if (!rc && t->bpe) tiktoken_defaults(t);
    if (!rc && o && o->allow_special) {
        if (t->spm)
            rc = tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE,
                          "--allow-special-in-text: %s is a sentencepiece model, whose control tokens never "
                          "come from text; leave the flag out", path);
        else
            rc = tks_bpe_set_allow_special(t->bpe, 1);
    }
    if (rc) tks_tok_free(t);
    else *out = t;
    return rc;
}

tks_spm *tks_tok_spm(const tks_tok *t) { return t->spm; }
tks_bpe *tks_tok_bpe(const tks_tok *t) { return t->bpe; }

uint32_t tks_tok_vocab_size(const tks_tok *t) {
    return t->spm ? tks_spm_vocab_size(t->spm) : tks_bpe_vocab_size(t->bpe);
}
uint32_t tks_tok_bos_id(const tks_tok *t) { return t->spm ? tks_spm_bos_id(t->spm) : t->bos; }
uint32_t tks_tok_eos_id(const tks_tok *t) { return t->spm ? tks_spm_eos_id(t->spm) : t->eos; }
uint32_t tks_tok_pad_id(const tks_tok *t) { return t->spm ? tks_spm_pad_id(t->spm) : t->pad; }
uint32_t tks_tok_unk_id(const tks_tok *t) { return t->spm ? tks_spm_unk_id(t->spm) : t->unk; }
const char *tks_tok_model_type(const tks_tok *t) {
    return t->spm ? tks_spm_model_type(t->spm) : TKS_TOK_BYTE_LEVEL_BPE;
}
const uint8_t *tks_tok_fingerprint(const tks_tok *t) {
    return t->spm ? tks_spm_fingerprint(t->spm) : tks_bpe_fingerprint(t->bpe);
}
const char *tks_tok_file_name(const tks_tok *t) {
    return t->spm ? "tokenizer.model" : tks_bpe_tiktoken_ranks(t->bpe) ? "tiktoken.json" : "tokenizer.json";
}
const char *tks_tok_config_path(const tks_tok *t) { return t->spm || !t->config[0] ? NULL : t->config; }

int tks_tok_encode(const tks_tok *t, const char *text, size_t len, tks_ids *out) {
    return t->spm ? tks_spm_encode(t->spm, text, len, out) : tks_bpe_encode(t->bpe, text, len, out);
}

size_t tks_tok_next_cut(const tks_tok *t, const char *text, size_t len, size_t from) {
    return t->spm ? tks_spm_next_cut(t->spm, text, len, from) : tks_bpe_next_cut(t->bpe, text, len, from);
}

int tks_tok_encode_part(const tks_tok *t, const char *text, size_t len, tks_ids *out, uint64_t *unassigned) {
    if (t->spm) {
        if (unassigned) *unassigned = 0;
        return tks_spm_encode(t->spm, text, len, out);
    }
    return tks_bpe_encode_part(t->bpe, text, len, out, unassigned);
}

int tks_tok_encode_doc(const tks_tok *t, const char *text, size_t len, tks_ids *out, uint64_t *unassigned) {
    if (t->spm) {
        if (unassigned) *unassigned = 0;
        return tks_spm_encode(t->spm, text, len, out);
    }
    return tks_bpe_encode_doc(t->bpe, text, len, out, unassigned);
}

void tks_tok_count_doc(const tks_tok *t, uint64_t unassigned, size_t parts) {
    if (t->spm) tks_spm_count_doc(t->spm, parts);
    else tks_bpe_count_doc(t->bpe, unassigned, parts);
}

int tks_tok_decode(const tks_tok *t, const uint32_t *ids, size_t n, char **text, size_t *len) {
    return t->spm ? tks_spm_decode(t->spm, ids, n, text, len) : tks_bpe_decode(t->bpe, ids, n, text, len);
}

const char *tks_tok_piece(const tks_tok *t, uint32_t id, char *buf, size_t cap) {
    if (!cap) return NULL;
    if (t->spm) {
        const char *p = tks_spm_piece(t->spm, id);
        if (!p) return NULL;
        snprintf(buf, cap, "%s", p);
        return buf;
    }
    size_t len = 0;
    const char *s = tks_bpe_token_bytes(t->bpe, id, &len);
    if (!s) return NULL;
    /* bytes as text; a control byte or a byte of an incomplete UTF-8
     * sequence stays visible as \xNN */
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len && o + 5 < cap;) {
        /* a whole UTF-8 sequence stays text; a byte of an incomplete or
         * invalid one (a byte-level token's part of a character) is \xNN */
        int k = u[i] < 0x80 ? 1 : tks_utf8_seq(u + i, len - i);
        if (k < 0 || u[i] < 0x20 || u[i] == 0x7f) {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", u[i]);
            i++;
        } else if (o + (size_t)k < cap) {
            memcpy(buf + o, u + i, (size_t)k);
            o += (size_t)k, i += (size_t)k;
        } else {
            break;
        }
    }
    buf[o] = 0;
    return buf;
}

int tks_tok_set_encoder(tks_tok *t, int fast) {
    if (t->spm) return tks_spm_set_encoder(t->spm, fast);
    if (!fast)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--encoder sentencepiece: the tokenizer is a byte-level BPE tokenizer.json, "
                        "which tokshard encodes itself (exact Hugging Face tokenizers ids); leave the "
                        "flag out");
    return 0;
}

const char *tks_tok_encoder(const tks_tok *t) {
    return t->spm ? tks_spm_encoder(t->spm) : TKS_TOK_BYTE_LEVEL_BPE;
}
const char *tks_tok_fast_unavailable(const tks_tok *t) { return t->spm ? tks_spm_fast_unavailable(t->spm) : NULL; }
void tks_tok_encoder_stats(const tks_tok *t, tks_encoder_stats *st) {
    if (t->spm) tks_spm_encoder_stats(t->spm, st);
    else tks_bpe_encoder_stats(t->bpe, st);
}

int tks_tok_is_token(const tks_tok *t, uint32_t id) {
    return t->spm ? id < tks_spm_vocab_size(t->spm) : tks_bpe_is_token(t->bpe, id);
}

int tks_tok_is_special(const tks_tok *t, uint32_t id) {
    if (t->bpe) return tks_bpe_is_special(t->bpe, id);
    return id != TKS_NO_ID && (id == tks_spm_bos_id(t->spm) || id == tks_spm_eos_id(t->spm) ||
                               id == tks_spm_pad_id(t->spm));
}

/* Writes the bytes [0..n) as dir/name unless that file exists. */
static int save_bytes(const char *dir, const char *name, const char *bytes, size_t n) {
    char dst[PATH_MAX];
    int rc = tks_path_join(dst, sizeof dst, dir, name);
    if (rc || access(dst, F_OK) == 0) return rc;
    return tks_write_file_atomic(dst, bytes, n);
}

static int save_copy(const char *dir, const char *name, const char *src) {
    char dst[PATH_MAX];
    int rc = tks_path_join(dst, sizeof dst, dir, name);
    if (rc || access(dst, F_OK) == 0) return rc;
    return tks_copy_file_atomic(src, dst);
}

int tks_tok_save(const tks_tok *t, const char *src, const char *dir) {
    int rc;
    if (t->spm) return save_copy(dir, "tokenizer.model", src);
    const char *ranks = tks_bpe_tiktoken_ranks(t->bpe);
    if (ranks) {
        char *d = NULL;
        size_t n = 0;
        rc = tks_bpe_tiktoken_json(t->bpe, &d, &n);
        if (!rc) rc = save_copy(dir, "tokenizer.tiktoken", ranks);
        if (!rc) rc = save_bytes(dir, "tiktoken.json", d, n);
        free(d);
    } else {
        rc = save_copy(dir, "tokenizer.json", src);
    }
    if (!rc && t->config[0]) rc = save_copy(dir, "tokenizer_config.json", t->config);
    return rc;
}

int tks_tok_find(const char *dir, char *path, size_t cap) {
    static const char *const names[] = {"tokenizer.model", "tokenizer.json", "tiktoken.json"};
    for (int i = 0; i < 3; i++) {
        int rc = tks_path_join(path, cap, dir, names[i]);
        if (rc) return rc;
        if (access(path, F_OK) == 0) return 0;
    }
    return tks_fail(TKS_ERR_TOKENIZER, dir, TKS_NONE, TKS_NONE,
                    "%s keeps no tokenizer (tokenizer.model, tokenizer.json or tiktoken.json)", dir);
}

void tks_tokenizer_record(const tks_tok *tk, tks_tokenizer_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->file, sizeof out->file, "%s", tks_tok_file_name(tk));
    memcpy(out->fingerprint, tks_tok_fingerprint(tk), 16);
    out->vocab_size = tks_tok_vocab_size(tk);
    snprintf(out->model_type, sizeof out->model_type, "%s", tks_tok_model_type(tk));
    out->bos_id = tks_tok_bos_id(tk);
    out->eos_id = tks_tok_eos_id(tk);
    out->pad_id = tks_tok_pad_id(tk);
    out->unk_id = tks_tok_unk_id(tk);
    /* the ids no text produces, as ranges; too many ranges: none recorded */
    uint32_t n = 0;
    for (uint32_t id = 0, v = out->vocab_size; id < v && n <= TKS_MAX_RESERVED; id++) {
        if (!tks_tok_is_special(tk, id) && tks_tok_is_token(tk, id)) continue;
        if (n && out->reserved[n - 1][1] + 1 == id) {
            out->reserved[n - 1][1] = id;
        } else if (n < TKS_MAX_RESERVED) {
            out->reserved[n][0] = out->reserved[n][1] = id;
            n++;
        } else {
            n = TKS_MAX_RESERVED + 1;
        }
    }
    out->n_reserved = n <= TKS_MAX_RESERVED ? n : 0;
    out->has_tables = tk->bpe && tks_bpe_tables_xxh3(tk->bpe, out->tables_xxh3);
}

const char *tks_tok_cache_note(const tks_tok *t) { return t->bpe ? tks_bpe_cache_note(t->bpe) : ""; }
