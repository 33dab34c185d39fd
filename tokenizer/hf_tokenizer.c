/* hf_tokenizer.c - a sentencepiece model as a Hugging Face fast tokenizer
 * (tokenizer.json for the `tokenizers` library, tokenizer_config.json for
 * transformers), written from the model proto in C.
 *
 * The pieces follow transformers' SpmConverter (transformers 4.45.2,
 * src/transformers/convert_slow_tokenizer.py): the model's pieces and scores,
 * BPE merges as its generate_merges derives them, byte fallback as
 * LlamaConverter enables it, user-defined and control pieces as added tokens.
 * Where SpmConverter's normalizer differs from what sentencepiece does
 * (sentencepiece's remove_extra_whitespaces also strips leading spaces,
 * normalizer.cc), this follows sentencepiece, since the point is the same ids
 * as spm_encode. docs/INTEROP.md lists every choice. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/pb.h"
#include "common/tks_json.h"

/* ---------------------------------------------------------------------------
 * The model proto (sentencepiece_model.proto, proto2), walked by hand over the
 * wire format (https://protobuf.dev/programming-guides/encoding/); every read
 * is bounds-checked. Field numbers: ModelProto.pieces = 1, trainer_spec = 2,
 * normalizer_spec = 3; SentencePiece.piece = 1, score = 2 (float), type = 3
 * (NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6);
 * TrainerSpec.model_type = 3 (UNIGRAM 1, BPE 2, WORD 3, CHAR 4),
 * byte_fallback = 35, unk_id = 40, bos_id = 41, eos_id = 42, pad_id = 43;
 * NormalizerSpec.name = 1, precompiled_charsmap = 2, add_dummy_prefix = 3,
 * remove_extra_whitespaces = 4, escape_whitespaces = 5.
 * ------------------------------------------------------------------------- */
enum { PIECE_NORMAL = 1, PIECE_UNKNOWN = 2, PIECE_CONTROL = 3, PIECE_USER = 4, PIECE_UNUSED = 5, PIECE_BYTE = 6 };

typedef struct piece {
    const char *s;     /* points into the model bytes; not NUL-terminated */
    size_t len;
    float score;
    int type;
} piece;

typedef struct spm_proto {
    piece *pieces;
    size_t n;
    int model_type;            /* 1 unigram, 2 bpe, 3 word, 4 char */
    int byte_fallback;
    int64_t unk_id, bos_id, eos_id, pad_id;
    const uint8_t *charsmap;
    size_t charsmap_len;
    int add_dummy_prefix, remove_extra_ws, escape_ws;
} spm_proto;


static int parse_piece(const uint8_t *p, const uint8_t *end, piece *out) {
    pb_field f;
    int r;
    out->s = "";
    out->len = 0;
    out->score = 0;
    out->type = PIECE_NORMAL;
    while ((r = pb_next(&p, end, &f)) == 1) {
        if (f.num == 1 && f.wt == 2) out->s = (const char *)f.data, out->len = f.len;
        else if (f.num == 2 && f.wt == 5) {
            uint32_t u = (uint32_t)f.v;
            memcpy(&out->score, &u, 4);
        } else if (f.num == 3 && f.wt == 0 && f.v >= 1 && f.v <= 6) out->type = (int)f.v;
    }
    return r;
}

static int parse_proto(const uint8_t *buf, size_t n, spm_proto *m) {
    memset(m, 0, sizeof *m);
    m->model_type = 1;
    m->unk_id = 0, m->bos_id = 1, m->eos_id = 2, m->pad_id = -1;
    m->add_dummy_prefix = m->remove_extra_ws = m->escape_ws = 1;
    const uint8_t *p = buf, *end = buf + n;
    pb_field f;
    int r;
    size_t cap = 0;
    while ((r = pb_next(&p, end, &f)) == 1) {
        if (f.num == 1 && f.wt == 2) {
            if (m->n == cap) {
                cap = cap ? 2 * cap : 1024;
                piece *np = realloc(m->pieces, cap * sizeof *np);
                if (!np) return -2;
                m->pieces = np;
            }
            if (parse_piece(f.data, f.data + f.len, &m->pieces[m->n++]) < 0) return -1;
        } else if (f.num == 2 && f.wt == 2) {
            const uint8_t *q = f.data, *qe = f.data + f.len;
            pb_field g;
            int r2;
            while ((r2 = pb_next(&q, qe, &g)) == 1) {
                if (g.wt != 0) continue;
                int64_t sv = (int64_t)(int32_t)(uint32_t)g.v; /* int32 fields, sign-extended varints */
                if (g.num == 3 && g.v >= 1 && g.v <= 4) m->model_type = (int)g.v;
                else if (g.num == 35) m->byte_fallback = g.v != 0;
                else if (g.num == 40) m->unk_id = sv;
                else if (g.num == 41) m->bos_id = sv;
                else if (g.num == 42) m->eos_id = sv;
                else if (g.num == 43) m->pad_id = sv;
            }
            if (r2 < 0) return -1;
        } else if (f.num == 3 && f.wt == 2) {
            const uint8_t *q = f.data, *qe = f.data + f.len;
            pb_field g;
            int r2;
            while ((r2 = pb_next(&q, qe, &g)) == 1) {
                if (g.num == 2 && g.wt == 2) m->charsmap = g.data, m->charsmap_len = g.len;
                else if (g.num == 3 && g.wt == 0) m->add_dummy_prefix = g.v != 0;
                else if (g.num == 4 && g.wt == 0) m->remove_extra_ws = g.v != 0;
                else if (g.num == 5 && g.wt == 0) m->escape_ws = g.v != 0;
            }
            if (r2 < 0) return -1;
        }
    }
    return r;
}

/* ---------------------------------------------------------------------------
 * Piece lookup (open addressing over FNV-1a) and BPE merges
 * ------------------------------------------------------------------------- */
typedef struct ptable {
    int64_t *slot;  /* piece id or -1 */
    size_t mask;
    const spm_proto *m;
} ptable;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int64_t ptable_get(const ptable *t, const char *s, size_t n) {
    for (size_t i = fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int64_t id = t->slot[i];
        if (id < 0) return -1;
        const piece *p = &t->m->pieces[id];
        if (p->len == n && memcmp(p->s, s, n) == 0) return id;
    }
}

static int ptable_init(ptable *t, const spm_proto *m) {
    size_t cap = 16;
    while (cap < 2 * m->n + 1) cap *= 2;
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->slot) return -1;
    for (size_t i = 0; i < cap; i++) t->slot[i] = -1;
    t->mask = cap - 1;
    t->m = m;
    for (size_t id = 0; id < m->n; id++) {
        /* the first id of a duplicated piece wins, as a Python dict built in
         * id order would keep the last: sentencepiece refuses duplicates */
        if (ptable_get(t, m->pieces[id].s, m->pieces[id].len) >= 0) continue;
        size_t i = fnv(m->pieces[id].s, m->pieces[id].len) & t->mask;
        while (t->slot[i] >= 0) i = (i + 1) & t->mask;
        t->slot[i] = (int64_t)id;
    }
    return 0;
}

typedef struct merge {
    uint32_t l, r;       /* piece ids */
    float score;         /* the merged piece's score */
    uint32_t len_l, len_r; /* code points */
    uint64_t seq;        /* order of discovery (the stable sort's tie-break) */
} merge;

static size_t utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((uint8_t)s[i] & 0xC0) != 0x80;
    return k;
}

/* generate_merges: for each piece in id order, every split into two pieces at
 * a code point boundary, ordered by (id(left), id(right)); then all of them
 * sorted by (score, len(left), len(right)) descending, stably. */
static int merge_cmp(const void *a, const void *b) {
    const merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->len_l != y->len_l) return x->len_l > y->len_l ? -1 : 1;
    if (x->len_r != y->len_r) return x->len_r > y->len_r ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}
static int local_cmp(const void *a, const void *b) {
    const merge *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->r < y->r ? -1 : x->r > y->r;
}

static int bpe_merges(const spm_proto *m, const ptable *t, merge **out, size_t *n_out) {
    size_t n = 0, cap = 4096;
    merge *mg = malloc(cap * sizeof *mg);
    if (!mg) return -1;
    for (size_t id = 0; id < m->n; id++) {
        const piece *p = &m->pieces[id];
        size_t first = n;
        for (size_t cut = 1; cut < p->len; cut++) {
            if (((uint8_t)p->s[cut] & 0xC0) == 0x80) continue; /* inside a code point */
            int64_t l = ptable_get(t, p->s, cut), r = ptable_get(t, p->s + cut, p->len - cut);
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                cap *= 2;
                merge *nm = realloc(mg, cap * sizeof *nm);
                if (!nm) {
                    free(mg);
                    return -1;
                }
                mg = nm;
            }
            mg[n++] = (merge){(uint32_t)l, (uint32_t)r, p->score, (uint32_t)utf8_len(p->s, cut),
                              (uint32_t)utf8_len(p->s + cut, p->len - cut), 0};
        }
        qsort(mg + first, n - first, sizeof *mg, local_cmp);
        for (size_t i = first; i < n; i++) mg[i].seq = i;
    }
    qsort(mg, n, sizeof *mg, merge_cmp);
    *out = mg;
    *n_out = n;
    return 0;
}

/* ---------------------------------------------------------------------------
 * JSON
 * ------------------------------------------------------------------------- */
static json_t *jstr(const piece *p) { return json_stringn(p->s, p->len); }

static char *base64(const uint8_t *b, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *q = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *q++ = tab[v >> 18 & 63];
        *q++ = tab[v >> 12 & 63];
        *q++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *q = 0;
    return o;
}

static json_t *added_token(const piece *p, size_t id) {
    return json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", jstr(p),
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                     p->type == PIECE_CONTROL);
}

/* tokenizer.json (the `tokenizers` serialization, version "1.0") */
static json_t *tokenizer_json(const spm_proto *m, const ptable *t, int *rc) {
    *rc = 0;
    json_t *added = json_array();
    for (size_t id = 0; id < m->n; id++)
        if (m->pieces[id].type == PIECE_CONTROL || m->pieces[id].type == PIECE_USER)
            json_array_append_new(added, added_token(&m->pieces[id], id));
    /* normalizer: sentencepiece's, in its order: the charsmap (NFKC and
     * control characters to spaces for nmt_nfkc), then remove_extra_whitespaces
     * (strip both ends, one space for a run) */
    json_t *norms = json_array();
    if (m->charsmap_len) {
        char *b64 = base64(m->charsmap, m->charsmap_len);
        if (!b64) {
            *rc = -1;
            return NULL;
        }
        json_array_append_new(norms, json_pack("{s:s, s:s}", "type", "Precompiled", "precompiled_charsmap", b64));
        free(b64);
    }
    if (m->remove_extra_ws) {
        json_array_append_new(norms, json_pack("{s:s, s:b, s:b}", "type", "Strip", "strip_left", 1, "strip_right", 1));
        json_array_append_new(norms, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "Regex",
                                               " {2,}", "content", " "));
    }
    json_t *normalizer = json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norms);
    /* pre-tokenizer: spaces become U+2581 and split words (split_by_whitespace),
     * with the dummy prefix when the model adds one */
    json_t *pre = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                            "prepend_scheme", m->add_dummy_prefix ? "always" : "never", "split", 1);
    /* post-processor: BOS first, as tokshard build --prepend-bos and
     * tokshard-generate do */
    json_t *post = json_null();
    if (m->bos_id >= 0 && (size_t)m->bos_id < m->n) {
        const piece *b = &m->pieces[m->bos_id];
        json_t *bs = jstr(b);
        const char *bos = json_string_value(bs);
        json_t *single = json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}]", "SpecialToken", "id", bos, "type_id", 0,
                                   "Sequence", "id", "A", "type_id", 0);
        json_t *pair = json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}]",
                                 "SpecialToken", "id", bos, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                                 "SpecialToken", "id", bos, "type_id", 1, "Sequence", "id", "B", "type_id", 1);
        json_t *special = json_object();
        json_object_set_new(special, bos, json_pack("{s:s, s:[I], s:[s]}", "id", bos, "ids",
                                                    (json_int_t)m->bos_id, "tokens", bos));
        post = json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                         "special_tokens", special);
        json_decref(bs);
    }
    /* decoder: LlamaConverter's (U+2581 to space, <0xNN> pieces to bytes,
     * one string, the dummy prefix's space removed) */
    json_t *decs = json_pack("[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}]", "type", "Replace", "pattern", "String",
                             "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
    if (m->add_dummy_prefix)
        json_array_append_new(decs, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1,
                                              "stop", 0));
    json_t *decoder = json_pack("{s:s, s:o}", "type", "Sequence", "decoders", decs);
    json_t *model;
    if (m->model_type == 2) {
        json_t *vocab = json_object();
        for (size_t id = 0; id < m->n; id++) {
            json_t *s = jstr(&m->pieces[id]);
            if (!json_object_get(vocab, json_string_value(s)))
                json_object_set_new(vocab, json_string_value(s), json_integer((json_int_t)id));
            json_decref(s);
        }
        merge *mg = NULL;
        size_t nm = 0;
        if (bpe_merges(m, t, &mg, &nm)) {
            *rc = -1;
            json_decref(vocab);
            return NULL;
        }
        json_t *merges = json_array();
        for (size_t i = 0; i < nm; i++)
            json_array_append_new(merges, json_pack("[o, o]", jstr(&m->pieces[mg[i].l]), jstr(&m->pieces[mg[i].r])));
        free(mg);
        json_t *unk = m->unk_id >= 0 && (size_t)m->unk_id < m->n ? jstr(&m->pieces[m->unk_id]) : json_null();
        model = json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                          unk, "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1, "byte_fallback",
                          m->byte_fallback, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    } else {
        json_t *vocab = json_array();
        for (size_t id = 0; id < m->n; id++)
            json_array_append_new(vocab, json_pack("[o, f]", jstr(&m->pieces[id]), (double)m->pieces[id].score));
        model = json_pack("{s:s, s:I, s:o, s:b}", "type", "Unigram", "unk_id", (json_int_t)m->unk_id, "vocab", vocab,
                          "byte_fallback", m->byte_fallback);
    }
    return json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                     "added_tokens", added, "normalizer", normalizer, "pre_tokenizer", pre, "post_processor", post,
                     "decoder", decoder, "model", model);
}

static json_t *special_or_null(const spm_proto *m, int64_t id) {
    return id >= 0 && (size_t)id < m->n ? jstr(&m->pieces[id]) : json_null();
}

/* tokenizer_config.json: what AutoTokenizer reads to build the fast tokenizer
 * from tokenizer.json with the special tokens named */
static json_t *tokenizer_config(const spm_proto *m) {
    json_t *dec = json_object();
    for (size_t id = 0; id < m->n; id++) {
        const piece *p = &m->pieces[id];
        if (p->type != PIECE_CONTROL && p->type != PIECE_USER && p->type != PIECE_UNKNOWN) continue;
        char key[24];
        snprintf(key, sizeof key, "%zu", id);
        json_object_set_new(dec, key, json_pack("{s:o, s:b, s:b, s:b, s:b, s:b}", "content", jstr(p), "lstrip", 0,
                                                "normalized", 0, "rstrip", 0, "single_word", 0, "special",
                                                p->type != PIECE_USER));
    }
    /* LlamaTokenizer: AutoTokenizer builds LlamaTokenizerFast from
     * tokenizer.json, and with use_fast=False the slow LlamaTokenizer, which
     * (legacy: true) runs sentencepiece itself on tokenizer.model */
    return json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:b, s:b, s:b}", "tokenizer_class", "LlamaTokenizer",
                     "legacy", 1,
                     "bos_token", special_or_null(m, m->bos_id), "eos_token", special_or_null(m, m->eos_id),
                     "unk_token", special_or_null(m, m->unk_id), "pad_token", special_or_null(m, m->pad_id),
                     "added_tokens_decoder", dec, "clean_up_tokenization_spaces", 0, "add_bos_token",
                     m->bos_id >= 0, "add_eos_token", 0);
}

/* j's text (2-space indent), owned by the caller; NULL when out of memory */
static char *dump_json(json_t *j) {
    return j ? json_dumps(j, JSON_INDENT(2)) : NULL;
}

/* text as dir/name, crash-safely */
static int write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    int rc = tks_path_join(path, sizeof path, dir, name);
    if (!rc && !text) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory writing %s", path);
    return rc ? rc : tks_write_file_atomic(path, text, strlen(text));
}

static int write_json(const char *dir, const char *name, json_t *j) {
    char *text = dump_json(j);
    int rc = write_text(dir, name, text);
    free(text);
    return rc;
}

/* Adds bos/eos/pad ids (ids[k] outside [0, n): null) to DIR/config.json
 * when it exists (a checkpoint). */
static int patch_config(const char *dir, const int64_t ids[3], size_t n) {
    char path[4096];
    int rc = tks_path_join(path, sizeof path, dir, "config.json");
    struct stat sb;
    if (rc || stat(path, &sb) != 0) return rc;
    json_error_t e;
    json_t *j = tks_json_load_regular(path, 0, &e);
    if (!json_is_object(j)) {
        json_decref(j);
        return tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, TKS_NONE, "%s is not a JSON object (%s)", path, e.text);
    }
    const char *keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int k = 0; k < 3; k++)
        json_object_set_new(j, keys[k], ids[k] >= 0 && (size_t)ids[k] < n ? json_integer(ids[k]) : json_null());
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!text) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

struct tks_hf_spm {
    char *tokenizer_json, *config_json; /* the two files' text */
    int64_t ids[3];                     /* bos, eos, pad: -1 when absent */
    size_t n;                           /* pieces */
};

void tks_hf_spm_free(tks_hf_spm *c) {
    if (!c) return;
    free(c->tokenizer_json);
    free(c->config_json);
    free(c);
}

int tks_hf_spm_convert(const char *model_path, tks_hf_spm **out) {
    *out = NULL;
    const uint8_t *buf = NULL; /* the pieces point into the mapping */
    size_t n = 0;
    int rc = tks_map_file(model_path, "tokenizer model", &buf, &n);
    if (rc) return rc;
    spm_proto m;
    ptable t = {0};
    tks_hf_spm *c = NULL;
    int pr = parse_proto(buf, n, &m);
    if (pr == -2) rc = tks_fail(TKS_ERR_NOMEM, model_path, TKS_NONE, TKS_NONE, "out of memory");
    else if (pr < 0 || m.n == 0)
        rc = tks_fail(TKS_ERR_TOKENIZER, model_path, TKS_NONE, TKS_NONE,
                      "%s is not a sentencepiece model (its protobuf does not parse, or it has no "
                      "pieces): pass the .model file written by `tokshard train-tokenizer` or spm_train",
                      model_path);
    else if (m.model_type != 1 && m.model_type != 2)
        rc = tks_fail(TKS_ERR_TOKENIZER, model_path, TKS_NONE, TKS_NONE,
                      "%s is a sentencepiece %s model: Hugging Face tokenizers have BPE and Unigram "
                      "models only; load it with the slow tokenizer from tokenizer.model",
                      model_path, m.model_type == 3 ? "word" : "char");
    else if (!m.escape_ws)
        rc = tks_fail(TKS_ERR_TOKENIZER, model_path, TKS_NONE, TKS_NONE,
                      "%s was trained without whitespace escaping, which the Metaspace pre-tokenizer "
                      "cannot reproduce; load it with the slow tokenizer from tokenizer.model", model_path);
    else if (ptable_init(&t, &m) || !(c = calloc(1, sizeof *c)))
        rc = tks_fail(TKS_ERR_NOMEM, model_path, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) {
        json_t *tj = tokenizer_json(&m, &t, &pr);
        json_t *cj = tokenizer_config(&m);
        c->tokenizer_json = pr ? NULL : dump_json(tj);
        c->config_json = dump_json(cj);
        json_decref(tj);
        json_decref(cj);
        if (!c->tokenizer_json || !c->config_json)
            rc = tks_fail(TKS_ERR_NOMEM, model_path, TKS_NONE, TKS_NONE, "out of memory");
        c->ids[0] = m.bos_id, c->ids[1] = m.eos_id, c->ids[2] = m.pad_id;
        c->n = m.n;
    }
    free(t.slot);
    free(m.pieces);
    tks_unmap(buf, n);
    if (rc) tks_hf_spm_free(c);
    else *out = c;
    return rc;
}

int tks_hf_spm_write(const tks_hf_spm *c, const char *dir) {
    int rc = write_text(dir, "tokenizer.json", c->tokenizer_json);
    if (!rc) rc = write_text(dir, "tokenizer_config.json", c->config_json);
    return rc ? rc : patch_config(dir, c->ids, c->n);
}

int tks_hf_tokenizer_write(const char *model_path, const char *dir) {
    tks_hf_spm *c;
    int rc = tks_hf_spm_convert(model_path, &c);
    if (!rc) rc = tks_hf_spm_write(c, dir);
    tks_hf_spm_free(c);
    return rc;
}

/* a copy of src as dir/name, unless it is that file already */
static int copy_into(const char *src, const char *dir, const char *name) {
    char dst[4096];
    int rc = tks_path_join(dst, sizeof dst, dir, name);
    struct stat a, b;
    if (!rc && stat(src, &a) == 0 && stat(dst, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return 0;
    return rc ? rc : tks_copy_file_atomic(src, dst);
}

/* A tiktoken tokenizer: its files, and a tokenizer.json made from them. */
static int tiktoken_files(const tks_tok *t, const char *src, const char *dir) {
    char *text = NULL, path[4096];
    int rc = tks_bpe_tiktoken_hf_json(tks_tok_bpe(t), &text);
    if (!rc) rc = tks_path_join(path, sizeof path, dir, "tokenizer.json");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc ? rc : tks_tok_save(t, src, dir);
}

int tks_hf_bpe_write(const tks_tok *t, const char *json_path, const char *dir) {
    int tiktoken = tks_bpe_tiktoken_ranks(tks_tok_bpe(t)) != NULL;
    int rc = tiktoken ? tiktoken_files(t, json_path, dir) : copy_into(json_path, dir, "tokenizer.json");
    /* the tokenizer's tokenizer_config.json, with the class AutoTokenizer
     * needs for a byte-level tokenizer.json when it names none (else it would
     * take the model's, e.g. LlamaTokenizerFast, which is sentencepiece's) */
    const char *cfg = tks_tok_config_path(t);
    json_error_t e;
    json_t *cj = cfg ? tks_json_load_regular(cfg, 0, &e) : json_object();
    if (!rc && !json_is_object(cj))
        rc = cfg ? tks_fail(TKS_ERR_TOKENIZER, cfg, TKS_NONE, TKS_NONE, "%s is not a JSON object (%s)", cfg, e.text)
                 : tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && !json_object_get(cj, "tokenizer_class"))
        json_object_set_new(cj, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    /* a tiktoken tokenizer without a config: its BOS and EOS by their text */
    static const char *const keys[] = {"bos_token", "eos_token", "pad_token"};
    uint32_t sid[3] = {tks_tok_bos_id(t), tks_tok_eos_id(t), tks_tok_pad_id(t)};
    for (int k = 0; !rc && tiktoken && k < 3; k++) {
        size_t len = 0;
        const char *s = sid[k] == TKS_NO_ID ? NULL : tks_bpe_token_bytes(tks_tok_bpe(t), sid[k], &len);
        if (s && !json_object_get(cj, keys[k])) json_object_set_new(cj, keys[k], json_stringn(s, len));
    }
    if (!rc) rc = write_json(dir, "tokenizer_config.json", cj);
    json_decref(cj);
    if (!rc) {
        uint32_t id[3] = {tks_tok_bos_id(t), tks_tok_eos_id(t), tks_tok_pad_id(t)};
        const int64_t ids[3] = {id[0] == TKS_NO_ID ? -1 : (int64_t)id[0], id[1] == TKS_NO_ID ? -1 : (int64_t)id[1],
                                id[2] == TKS_NO_ID ? -1 : (int64_t)id[2]};
        rc = patch_config(dir, ids, tks_tok_vocab_size(t));
    }
    return rc;
}

