/* manifest.c - manifest.json (docs/FORMAT.md) written with jansson, and
 * datasets opened with every shard checked against it. */
#define _GNU_SOURCE
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dataset/internal.h"

static json_t *id_or_null(uint32_t id) { return id == TKS_NO_ID ? json_null() : json_integer(id); }

/* The seal: the manifest's last key, "self_xxh3", holds the XXH3-64 (16 lower
 * hex digits) of every byte of the file before that key's opening quote, and
 * only `"<hex>"\n}\n` follows its value (docs/FORMAT.md). Whatever an edit
 * changes, provenance included, the seal no longer matches. */
#define SEAL_KEY "\"self_xxh3\": \""

/* The seal's offset in text[0..len) and its value: 0, or -1 when the text
 * does not end with a well-formed seal. */
static int find_seal(const char *text, size_t len, size_t *at, uint64_t *value) {
    const size_t kl = sizeof SEAL_KEY - 1, tail = 16 + 4; /* 16 hex, then "\n}\n */
    if (len < kl + tail) return -1;
    size_t p = len - tail - kl;
    if (memcmp(text + p, SEAL_KEY, kl) != 0 || memcmp(text + len - 4, "\"\n}\n", 4) != 0) return -1;
    uint8_t b[8];
    char hx[17];
    memcpy(hx, text + p + kl, 16);
    hx[16] = 0;
    if (tks_unhex(hx, b, 8)) return -1;
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v = v << 8 | b[k];
    *at = p;
    *value = v;
    return 0;
}

int tks_manifest_write(const char *dir, const tks_tokenizer_info *tok, const tks_shard_info *shards,
                       size_t n_shards, uint32_t token_bytes, uint32_t chunk_bytes,
                       const char *provenance_json) {
    json_t *prov = NULL;
    if (provenance_json) {
        json_error_t jerr;
        prov = json_loads(provenance_json, 0, &jerr);
        if (!json_is_object(prov)) {
            json_decref(prov);
            return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE,
                            "internal error: provenance is not a JSON object (%s)", jerr.text);
        }
    }
    int rc = tks_manifest_write_json(dir, tok, shards, n_shards, token_bytes, chunk_bytes, prov);
    json_decref(prov);
    return rc;
}

/* Appends the decimal digits of v at p; returns the end. */
static char *put_u64(char *p, uint64_t v) {
    char d[20];
    int n = 0;
    do d[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n) *p++ = d[--n];
    return p;
}

static char *put_str(char *p, const char *s) {
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

/* A number's key (with what goes before it), then the number. */
static char *put_str_u64(char *p, const char *key, uint64_t v) { return put_u64(put_str(p, key), v); }

/* The shards array as jansson's JSON_INDENT(2) renders it one level deep
 * (the manifest's "shards" value), written directly: jansson, or even
 * snprintf, takes most of the time of a manifest of 100,000 shards. A part
 * of it: shards[0..n), the array's opening when `first`, its closing when
 * `last`. 0, or -1 when a file name would need escaping (jansson renders
 * the array then). test_dataset checks that the manifest is jansson's
 * rendering of itself. */
static int shards_text(const tks_shard_info *shards, size_t n, int first, int last, char **out, size_t *len) {
    char *t = malloc(8 + n * 288), *p = t; /* 2 x 32 of name and hex, 5 x 20 digits, 124 of keys */
    *out = NULL;
    *len = 0;
    if (!t) return -1;
    if (first) p = put_str(p, n || !last ? "[\n" : "[]");
    for (size_t i = 0; i < n; i++) {
        const tks_shard_info *s = &shards[i];
        size_t fl = strnlen(s->file, sizeof s->file);
        for (size_t c = 0; c < fl; c++)
            if (s->file[c] < 0x20 || s->file[c] > 0x7e || s->file[c] == '"' || s->file[c] == '\\' || fl > 31) {
                free(t);
                return -1;
            }
        char hx[17];
        for (int k = 0; k < 16; k++) hx[k] = "0123456789abcdef"[(s->header_xxh3 >> (60 - 4 * k)) & 15];
        hx[16] = 0;
        p = put_str(p, "    {\n      \"file\": \"");
        p = put_str(p, s->file);
        p = put_str_u64(p, "\",\n      \"bytes\": ", s->file_bytes);
        p = put_str_u64(p, ",\n      \"n_docs\": ", s->n_docs);
        p = put_str_u64(p, ",\n      \"n_tokens\": ", s->n_tokens);
        p = put_str_u64(p, ",\n      \"min_token_id\": ", s->min_token_id);
        p = put_str_u64(p, ",\n      \"max_token_id\": ", s->max_token_id);
        p = put_str(p, ",\n      \"header_xxh3\": \"");
        p = put_str(p, hx);
        p = put_str(p, i + 1 < n || !last ? "\"\n    },\n" : "\"\n    }\n");
    }
    if (last && !(first && n == 0)) p = put_str(p, "  ]");
    *out = t;
    *len = (size_t)(p - t);
    return 0;
}

/* Writes the manifest: jansson renders all but the shards (an empty array
 * stands for them), the shards go in its place, and the seal after; the
 * pieces are written back to back, never copied into one text. */
static int write_manifest(const char *dir, json_t *m, const tks_shard_info *shards, size_t n) {
    char *text = NULL, seal[64];
    /* the shards' text in parts, on every core: part k holds the shards
     * [k n / parts, (k + 1) n / parts), its last one followed by "," unless
     * it is the array's last */
    int parts = n >= 4096 ? omp_get_max_threads() : 1, bad = 0;
    if (parts < 1) parts = 1;
    char **arr = calloc((size_t)parts, sizeof *arr);
    size_t *alen = calloc((size_t)parts, sizeof *alen);
    if (!arr || !alen) {
        free(arr);
        free(alen);
        return tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "cannot serialize manifest");
    }
#pragma omp parallel for schedule(static, 1) num_threads(parts) reduction(| : bad) if (parts > 1)
    for (int k = 0; k < parts; k++) {
        size_t a = n * (size_t)k / (size_t)parts, b = n * (size_t)(k + 1) / (size_t)parts;
        bad |= shards_text(shards + a, b - a, a == 0, b == n, &arr[k], &alen[k]) != 0;
    }
    if (n && bad) { /* a name to escape: jansson does it all */
        for (int k = 0; k < parts; k++) free(arr[k]);
        parts = 0;
        json_t *real = json_array();
        for (size_t i = 0; i < n; i++) {
            char hx[17];
            snprintf(hx, sizeof hx, "%016llx", (unsigned long long)shards[i].header_xxh3);
            const tks_shard_info *s = &shards[i];
            json_array_append_new(
                real, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "file", s->file, "bytes",
                                (json_int_t)s->file_bytes, "n_docs", (json_int_t)s->n_docs, "n_tokens",
                                (json_int_t)s->n_tokens, "min_token_id", (json_int_t)s->min_token_id,
                                "max_token_id", (json_int_t)s->max_token_id, "header_xxh3", hx));
        }
        json_object_set_new(m, "shards", real);
    }
    text = json_dumps(m, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    static const char hole[] = "\n  \"shards\": [],\n"; /* before "totals" and the provenance */
    char *at = text && parts ? strstr(text, hole) : NULL;
    size_t tlen = text ? strlen(text) : 0;
    tks_piece *pc = calloc((size_t)parts + 3, sizeof *pc);
    int rc = 0;
    if (!text || tlen < 2 || (parts && !at) || !pc)
        rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "cannot serialize manifest");
    XXH3_state_t *st = rc ? NULL : XXH3_createState();
    if (!rc && !st) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) {
        /* text ends "\n}": the seal goes in as the last key */
        size_t pre = at ? (size_t)(at - text) + 13 : tlen - 2; /* up to `"shards": ` */
        const char *rest = at ? at + 15 : text + tlen - 2;     /* after `[]` */
        size_t np = 0;
        pc[np++] = (tks_piece){text, pre};
        for (int k = 0; k < parts; k++) pc[np++] = (tks_piece){arr[k], alen[k]};
        pc[np++] = (tks_piece){rest, (size_t)(text + tlen - 2 - rest)};
        XXH3_64bits_reset(st);
        for (size_t k = 0; k < np; k++) XXH3_64bits_update(st, pc[k].data, pc[k].size);
        XXH3_64bits_update(st, ",\n  ", 4);
        int sl = snprintf(seal, sizeof seal, ",\n  " SEAL_KEY "%016llx\"\n}\n",
                          (unsigned long long)XXH3_64bits_digest(st));
        pc[np++] = (tks_piece){seal, (size_t)sl};
        char path[PATH_MAX];
        rc = tks_path_join(path, sizeof path, dir, TKS_MANIFEST_NAME);
        if (!rc) rc = tks_write_file_pieces(path, pc, np);
    }
    XXH3_freeState(st);
    for (int k = 0; k < parts; k++) free(arr[k]);
    free(arr);
    free(alen);
    free(pc);
    free(text);
    return rc;
}

void tks_shard_totals_of(const tks_shard_info *shards, size_t n, tks_shard_totals *out) {
    out->docs = out->tokens = 0;
    out->min_token_id = UINT32_MAX;
    out->max_token_id = 0;
    for (size_t i = 0; i < n; i++) {
        out->docs += shards[i].n_docs;
        out->tokens += shards[i].n_tokens;
        if (shards[i].min_token_id < out->min_token_id) out->min_token_id = shards[i].min_token_id;
        if (shards[i].max_token_id > out->max_token_id) out->max_token_id = shards[i].max_token_id;
    }
}

int tks_manifest_write_json(const char *dir, const tks_tokenizer_info *tok, const tks_shard_info *shards,
                            size_t n_shards, uint32_t token_bytes, uint32_t chunk_bytes,
                            struct json_t *provenance) {
    if (provenance && !json_is_object(provenance))
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "internal error: provenance is not a JSON object");
    char fp[33];
    tks_hex(tok->fingerprint, 16, fp);
    json_t *t = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o, s:o}", "file", tok->file,
                          "fingerprint", fp, "vocab_size", (json_int_t)tok->vocab_size,
                          "model_type", tok->model_type, "bos_id", id_or_null(tok->bos_id),
                          "eos_id", id_or_null(tok->eos_id), "pad_id", id_or_null(tok->pad_id),
                          "unk_id", id_or_null(tok->unk_id));
    if (t && tok->n_reserved) {
        json_t *res = json_array();
        for (uint32_t i = 0; i < tok->n_reserved && i < TKS_MAX_RESERVED; i++)
            json_array_append_new(res, json_pack("[I,I]", (json_int_t)tok->reserved[i][0],
                                                 (json_int_t)tok->reserved[i][1]));
        json_object_set_new(t, "reserved_ids", res);
    }
    if (t && tok->special_from_text) json_object_set_new(t, "special_from_text", json_true());
    if (t && tok->unicode[0]) /* a byte-level build: what a newer Unicode may encode otherwise */
        json_object_set_new(t, "unicode", json_pack("{s:s, s:I, s:I}", "version", tok->unicode,
                                                    "unassigned_code_points", (json_int_t)tok->unassigned,
                                                    "unassigned_docs", (json_int_t)tok->unassigned_docs));
    if (t && tok->has_tables) { /* absent for sentencepiece models and in older manifests */
        char tx[33];
        tks_hex(tok->tables_xxh3, 16, tx);
        json_object_set_new(t, "tables_xxh3", json_string(tx));
    }
    /* a tokenizer_config.json in the dataset is covered too: its BOS, EOS and
     * pad are read by everything that reads the dataset */
    char cpath[PATH_MAX];
    uint8_t ch[16];
    if (t && tks_path_join(cpath, sizeof cpath, dir, TKS_TOKENIZER_CONFIG_NAME) == 0 && access(cpath, F_OK) == 0) {
        int hrc = tks_file_xxh3_128(cpath, ch, NULL);
        if (hrc) {
            json_decref(t);
            return hrc;
        }
        char hx[33];
        tks_hex(ch, 16, hx);
        json_object_set_new(t, "config_xxh3", json_string(hx));
    }
    tks_shard_totals st;
    tks_shard_totals_of(shards, n_shards, &st);
    json_t *tot = json_pack("{s:I, s:I, s:I, s:o, s:o}", "n_shards", (json_int_t)n_shards, "n_docs",
                            (json_int_t)st.docs, "n_tokens", (json_int_t)st.tokens, "min_token_id",
                            n_shards ? json_integer(st.min_token_id) : json_null(), "max_token_id",
                            n_shards ? json_integer(st.max_token_id) : json_null());
    /* the dataset's version is its shards': all of one (version 2 when they
     * carry provenance), version 1 for a dataset without a shard */
    uint32_t version = n_shards && shards[0].version == TKS_FORMAT_V2 ? TKS_FORMAT_V2 : TKS_FORMAT_V1;
    for (size_t i = 0; i < n_shards; i++)
        if ((shards[i].version == TKS_FORMAT_V2 ? TKS_FORMAT_V2 : TKS_FORMAT_V1) != version) {
            json_decref(t);
            json_decref(tot);
            return tks_fail(TKS_ERR_ARG, dir, i, TKS_NONE,
                            "internal error: shard %zu is format version %u, shard 0 version %u: one "
                            "dataset's shards are all of one version", i, shards[i].version, version);
        }
    json_t *m = json_pack("{s:s, s:i, s:o, s:i, s:I, s:o, s:o}", "format", TKS_MANIFEST_FORMAT,
                          "format_version", (int)version, "tokenizer", t, "token_bytes",
                          (int)token_bytes, "chunk_bytes", (json_int_t)chunk_bytes, "shards", json_array(),
                          "totals", tot);
    if (!m) return tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "cannot build manifest JSON");
    if (provenance) json_object_set(m, "provenance", provenance);
    int rc = write_manifest(dir, m, shards, n_shards);
    json_decref(m);
    return rc;
}

/* ------------------------------------------------------------------------- */

struct tks_dataset {
    char dir[PATH_MAX];
    char tokenizer_path[PATH_MAX];
    tks_tokenizer_info tok;
    tks_shard **shards;
    size_t n_shards;
    uint64_t n_tokens, n_docs;
    uint32_t max_id;
    uint64_t manifest_xxh3;
    uint32_t token_bytes, chunk_bytes;
    uint32_t version;        /* the manifest's format_version */
};

static int mbad(const char *path, const char *fmt, const char *what) {
    return tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, TKS_NONE, fmt, path, what);
}

static int get_u64(json_t *o, const char *key, uint64_t *v) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0) return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

static int get_id(json_t *o, const char *key, uint32_t *v) {
    json_t *x = json_object_get(o, key);
    if (json_is_null(x)) {
        *v = TKS_NO_ID;
        return 0;
    }
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= TKS_NO_ID)
        return -1;
    *v = (uint32_t)json_integer_value(x);
    return 0;
}


/* The tokenizer record's reserved_ids (absent: none recorded). -1 when
 * they are not sorted, disjoint ranges below vocab, or too many. */
static int get_reserved(json_t *t, uint32_t vocab, tks_tokenizer_info *tok) {
    json_t *res = json_object_get(t, "reserved_ids");
    tok->n_reserved = 0;
    if (!res) return 0;
    if (!json_is_array(res) || json_array_size(res) > TKS_MAX_RESERVED) return -1;
    for (size_t i = 0; i < json_array_size(res); i++) {
        json_t *r = json_array_get(res, i);
        json_t *a = json_array_get(r, 0), *b = json_array_get(r, 1);
        if (json_array_size(r) != 2 || !json_is_integer(a) || !json_is_integer(b)) return -1;
        json_int_t lo = json_integer_value(a), hi = json_integer_value(b);
        if (lo < 0 || hi < lo || hi >= (json_int_t)vocab ||
            (i && lo <= (json_int_t)tok->reserved[i - 1][1]))
            return -1;
        tok->reserved[i][0] = (uint32_t)lo;
        tok->reserved[i][1] = (uint32_t)hi;
        tok->n_reserved = (uint32_t)i + 1;
    }
    return 0;
}

/* The tokenizer record's "unicode" (absent: not recorded, an older
 * manifest or a sentencepiece build). -1 when it is malformed. */
static int get_unicode(json_t *t, tks_tokenizer_info *tok) {
    json_t *u = json_object_get(t, "unicode");
    tok->unicode[0] = 0;
    tok->unassigned = tok->unassigned_docs = 0;
    if (!u) return 0;
    const char *v = json_string_value(json_object_get(u, "version"));
    if (!json_is_object(u) || !v || !*v || strlen(v) >= sizeof tok->unicode ||
        get_u64(u, "unassigned_code_points", &tok->unassigned) || get_u64(u, "unassigned_docs", &tok->unassigned_docs) ||
        tok->unassigned_docs > tok->unassigned)
        return -1;
    snprintf(tok->unicode, sizeof tok->unicode, "%s", v);
    return 0;
}

/* The manifest's "tokenizer" object t into tok (vocab: its checked vocab_size). */
static int parse_tokenizer(const char *path, json_t *t, uint64_t vocab, tks_tokenizer_info *tok) {
    int rc = 0;
    const char *file = json_string_value(json_object_get(t, "file"));
    const char *fp = json_string_value(json_object_get(t, "fingerprint"));
    const char *mt = json_string_value(json_object_get(t, "model_type"));
    if (!file || !*file || strchr(file, '/') || strlen(file) >= sizeof tok->file || !fp ||
        tks_unhex(fp, tok->fingerprint, 16) || !mt || strlen(mt) >= sizeof tok->model_type ||
        get_id(t, "bos_id", &tok->bos_id) || get_id(t, "eos_id", &tok->eos_id) ||
        get_id(t, "pad_id", &tok->pad_id) || get_id(t, "unk_id", &tok->unk_id)) {
        rc = mbad(path, "%s: %s", "invalid tokenizer record");
    } else if (get_reserved(t, (uint32_t)vocab, tok)) {
        rc = mbad(path, "%s: %s", "invalid tokenizer record: reserved_ids are not sorted, disjoint "
                                  "[lo, hi] ranges below vocab_size");
    } else if (get_unicode(t, tok)) {
        rc = mbad(path, "%s: %s", "invalid tokenizer record: \"unicode\" needs a \"version\" and counts "
                                  "\"unassigned_code_points\" >= \"unassigned_docs\" >= 0");
    } else {
        snprintf(tok->file, sizeof tok->file, "%s", file);
        snprintf(tok->model_type, sizeof tok->model_type, "%s", mt);
        tok->vocab_size = (uint32_t)vocab;
        tok->special_from_text = json_is_true(json_object_get(t, "special_from_text"));
        const char *cx = json_string_value(json_object_get(t, "config_xxh3"));
        tok->has_config = cx && tks_unhex(cx, tok->config_xxh3, 16) == 0;
        const char *tx = json_string_value(json_object_get(t, "tables_xxh3"));
        tok->has_tables = tx && tks_unhex(tx, tok->tables_xxh3, 16) == 0;
    }
    return rc;
}

/* The manifest's n shard records (arr) into sh[n], each id range inside the
 * vocabulary. */
static int parse_shards(const char *path, json_t *arr, size_t n, uint32_t vocab, tks_shard_info *sh) {
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *s = json_array_get(arr, i);
        const char *file = json_string_value(json_object_get(s, "file"));
        const char *hx = json_string_value(json_object_get(s, "header_xxh3"));
        uint64_t mn = 0, mx = 0;
        uint8_t hb[8];
        char want[32];
        tks__shard_name(want, (uint32_t)i);
        if (!json_is_object(s) || !file || strcmp(file, want) != 0 ||
            get_u64(s, "bytes", &sh[i].file_bytes) || get_u64(s, "n_docs", &sh[i].n_docs) ||
            get_u64(s, "n_tokens", &sh[i].n_tokens) || get_u64(s, "min_token_id", &mn) ||
            get_u64(s, "max_token_id", &mx) || mn > UINT32_MAX || mx > UINT32_MAX || !hx ||
            tks_unhex(hx, hb, 8)) {
            rc = tks_fail(TKS_ERR_MANIFEST, path, i, TKS_NONE,
                          "%s: shard entry %zu is invalid (expected file \"%s\" with bytes, "
                          "n_docs, n_tokens, min/max_token_id, header_xxh3)",
                          path, i, want);
            break;
        }
        snprintf(sh[i].file, sizeof sh[i].file, "%s", file);
        sh[i].index = (uint32_t)i;
        sh[i].min_token_id = (uint32_t)mn;
        sh[i].max_token_id = (uint32_t)mx;
        for (int k = 0; k < 8; k++) sh[i].header_xxh3 = sh[i].header_xxh3 << 8 | hb[k];
    }
    /* every recorded id range inside the vocabulary */
    for (size_t i = 0; i < n && !rc; i++)
        if (sh[i].min_token_id > sh[i].max_token_id || sh[i].max_token_id >= vocab)
            rc = tks_fail(TKS_ERR_MANIFEST, path, i, TKS_NONE,
                          "%s: shard entry %zu records ids in [%u, %u], outside the vocabulary of "
                          "%u: the manifest was edited or is corrupt; rebuild the dataset",
                          path, i, sh[i].min_token_id, sh[i].max_token_id, vocab);
    return rc;
}

/* The manifest's "totals" (tot) against the shard records sh[n]. */
static int check_totals(const char *path, json_t *tot, const tks_shard_info *sh, size_t n, uint32_t vocab) {
    /* the totals must be the sums (and the id range the union) of the shard records */
    int rc = 0;
    uint64_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = sh[i].min_token_id < lo ? sh[i].min_token_id : lo;
        hi = sh[i].max_token_id > hi ? sh[i].max_token_id : hi;
    }
    json_t *tlo = json_object_get(tot, "min_token_id"), *thi = json_object_get(tot, "max_token_id");
    int ok = n ? json_is_integer(tlo) && json_is_integer(thi) &&
                     json_integer_value(tlo) == (json_int_t)lo && json_integer_value(thi) == (json_int_t)hi
               : json_is_null(tlo) && json_is_null(thi);
    if (!ok)
        rc = tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, TKS_NONE,
                      "%s: \"totals\" id range [%s, %s] disagrees with the shard list "
                      "[%llu, %llu] (vocabulary %u): the manifest was edited or is corrupt; "
                      "rebuild the dataset",
                      path, json_is_integer(tlo) ? "set" : "missing", json_is_integer(thi) ? "set" : "missing",
                      n ? (unsigned long long)lo : 0ull, (unsigned long long)hi, vocab);
    if (!rc) {
        uint64_t docs = 0, toks = 0, tn = 0, td = 0, tt = 0;
        for (size_t i = 0; i < n; i++) docs += sh[i].n_docs, toks += sh[i].n_tokens;
        if (!json_is_object(tot) || get_u64(tot, "n_shards", &tn) || get_u64(tot, "n_docs", &td) ||
            get_u64(tot, "n_tokens", &tt) || tn != n || td != docs || tt != toks)
            rc = tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, TKS_NONE,
                          "%s: \"totals\" (%llu shards, %llu documents, %llu tokens) disagree with "
                          "the shard list (%zu, %llu, %llu): the manifest was edited or is corrupt; "
                          "rebuild the dataset",
                          path, (unsigned long long)tn, (unsigned long long)td,
                          (unsigned long long)tt, n, (unsigned long long)docs,
                          (unsigned long long)toks);
    }
    return rc;
}

int tks__manifest_parse(const char *text, size_t len, const char *path, tks_tokenizer_info *tok,
                        tks_shard_info **shards_out, size_t *n_out, uint32_t *token_bytes,
                        uint32_t *chunk_bytes) {
    *shards_out = NULL;
    *n_out = 0;
    json_error_t jerr;
    json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!m)
        return tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, (uint64_t)jerr.position,
                        "%s: not valid JSON at line %d column %d (%s): the manifest is corrupt; "
                        "rebuild the dataset",
                        path, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    const char *fmt = json_string_value(json_object_get(m, "format"));
    json_t *ver = json_object_get(m, "format_version");
    json_t *t = json_object_get(m, "tokenizer");
    json_t *arr = json_object_get(m, "shards");
    uint64_t tb = 0, cb = 0, vocab = 0;
    memset(tok, 0, sizeof *tok);
    if (!fmt || strcmp(fmt, TKS_MANIFEST_FORMAT) != 0) {
        rc = mbad(path, "%s: \"format\" is not \"%s\": not a tokshard manifest", TKS_MANIFEST_FORMAT);
    } else if (!json_is_integer(ver) ||
               (json_integer_value(ver) != TKS_FORMAT_V1 && json_integer_value(ver) != TKS_FORMAT_V2)) {
        rc = tks_fail(TKS_ERR_VERSION, path, TKS_NONE, TKS_NONE,
                      "%s: format_version %lld, this tokshard reads versions %u and %u: use a matching "
                      "tokshard", path, (long long)json_integer_value(ver), TKS_FORMAT_V1, TKS_FORMAT_V2);
    } else if (!json_is_object(t) || !json_is_array(arr) || get_u64(m, "token_bytes", &tb) ||
               get_u64(m, "chunk_bytes", &cb) || get_u64(t, "vocab_size", &vocab) ||
               vocab == 0 || vocab > UINT32_MAX || (tb != 2 && tb != 4) || cb > UINT32_MAX) {
        rc = mbad(path, "%s: %s", "missing or invalid tokenizer/shards/token_bytes/chunk_bytes");
    } else {
        rc = parse_tokenizer(path, t, vocab, tok);
        *token_bytes = (uint32_t)tb;
        *chunk_bytes = (uint32_t)cb;
    }
    size_t n = rc ? 0 : json_array_size(arr);
    tks_shard_info *sh = n ? calloc(n, sizeof *sh) : NULL;
    if (n && !sh) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = parse_shards(path, arr, n, tok->vocab_size, sh);
    for (size_t i = 0; !rc && i < n; i++) sh[i].version = (uint32_t)json_integer_value(ver);
    if (!rc) rc = check_totals(path, json_object_get(m, "totals"), sh, n, tok->vocab_size);
    json_decref(m);
    /* last, so that an inconsistency above gets its own message: any other
     * edit (provenance, a consistent set of numbers) breaks the seal */
    size_t at;
    uint64_t seal;
    if (!rc && find_seal(text, len, &at, &seal))
        rc = tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, TKS_NONE,
                      "%s: the manifest does not end with its \"self_xxh3\" seal: it was edited, "
                      "cut or written by another tool; rebuild the dataset",
                      path);
    else if (!rc && XXH3_64bits(text, at) != seal)
        rc = tks_fail(TKS_ERR_MANIFEST, path, TKS_NONE, at,
                      "%s: the manifest's bytes before its \"self_xxh3\" seal (offset %zu) hash to "
                      "%016llx, the seal says %016llx: it was edited or is corrupt; rebuild the "
                      "dataset, or restore manifest.json from a copy",
                      path, at, (unsigned long long)XXH3_64bits(text, at), (unsigned long long)seal);
    if (rc) {
        free(sh);
        return rc;
    }
    *shards_out = sh;
    *n_out = n;
    return 0;
}


int tks__shard_matches(const tks_shard *s, const tks_shard_info *si, const tks_tokenizer_info *tok,
                       uint32_t token_bytes, uint32_t chunk_bytes) {
    const tks_shard_header *h = tks_shard_hdr(s);
    const char *p = tks_shard_path(s);
    const struct { const char *what; uint64_t got, want; } f[] = {
        {"file size", h->file_size, si->file_bytes},
        {"n_docs", h->n_docs, si->n_docs},
        {"n_tokens", h->n_tokens, si->n_tokens},
        {"min_token_id", h->min_token_id, si->min_token_id},
        {"max_token_id", h->max_token_id, si->max_token_id},
        {"header checksum", h->header_xxh3, si->header_xxh3},
        {"shard_index", h->shard_index, si->index},
        {"vocab_size", h->vocab_size, tok->vocab_size},
        {"chunk_bytes", h->chunk_bytes, chunk_bytes},
        {"token_bytes", h->token_bytes, token_bytes},
        {"bos_id", h->bos_id, tok->bos_id},
        {"eos_id", h->eos_id, tok->eos_id},
        {"pad_id", h->pad_id, tok->pad_id},
        {"format version", h->version, si->version},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].got != f[i].want)
            return tks_fail(TKS_ERR_MANIFEST, p, si->index, TKS_NONE,
                            "%s (shard %u): %s is %llu in the shard but %llu in the manifest: the "
                            "shard was replaced or the manifest edited; rebuild the dataset",
                            p, si->index, f[i].what, (unsigned long long)f[i].got,
                            (unsigned long long)f[i].want);
    if (memcmp(h->tokenizer_fp, tok->fingerprint, 16) != 0) {
        char a[33], b[33];
        tks_hex(h->tokenizer_fp, 16, a);
        tks_hex(tok->fingerprint, 16, b);
        return tks_fail(TKS_ERR_TOKENIZER, p, si->index, TKS_NONE,
                        "%s (shard %u): built with tokenizer %s but the manifest names %s: shards "
                        "from different tokenizers cannot be mixed",
                        p, si->index, a, b);
    }
    return 0;
}


int tks__read_small_file(const char *path, char **text, size_t *len) {
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, NULL, &base, &size);
    if (rc) return rc;
    char *t = malloc(size + 1);
    if (!t) {
        tks_unmap(base, size);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory reading %s", path);
    }
    if (size) memcpy(t, base, size);
    t[size] = 0;
    tks_unmap(base, size);
    *text = t;
    *len = size;
    return 0;
}

void tks_dataset_close(tks_dataset *ds) {
    if (!ds) return;
    for (size_t i = 0; i < ds->n_shards; i++) tks_shard_close(ds->shards[i]);
    free(ds->shards);
    free(ds);
}

int tks_dataset_open(const char *dir, tks_dataset **out) {
    *out = NULL;
    tks_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    snprintf(ds->dir, sizeof ds->dir, "%s", dir);
    char mpath[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    tks_shard_info *si = NULL;
    size_t n = 0;
    int rc = tks_path_join(mpath, sizeof mpath, dir, TKS_MANIFEST_NAME);
    if (!rc && (rc = tks__read_small_file(mpath, &text, &len))) {
        char partial[PATH_MAX], why[PATH_MAX + 512];
        struct stat sb;
        snprintf(why, sizeof why, "%s", tks_last_error()->message);
        snprintf(partial, sizeof partial, "%s.partial", dir);
        if (stat(dir, &sb) != 0 && stat(partial, &sb) != 0)
            rc = tks_fail(TKS_ERR_MANIFEST, mpath, TKS_NONE, TKS_NONE,
                          "dataset %s does not exist: check the path, or build it with `tokshard build`",
                          dir);
        else if (stat(partial, &sb) == 0)
            rc = tks_fail(TKS_ERR_MANIFEST, mpath, TKS_NONE, TKS_NONE,
                          "%s has no readable manifest.json: it is not a finished tokshard dataset "
                          "(a build in progress works in %s; finish it with `tokshard build --resume`)",
                          dir, partial);
        else
            rc = tks_fail(TKS_ERR_MANIFEST, mpath, TKS_NONE, TKS_NONE,
                          "%s is not a tokshard dataset: %s", dir, why);
    }
    if (!rc) {
        ds->manifest_xxh3 = XXH3_64bits(text, len);
        rc = tks__manifest_parse(text, len, mpath, &ds->tok, &si, &n, &ds->token_bytes,
                                 &ds->chunk_bytes);
    }
    free(text);
    if (!rc) rc = tks_path_join(ds->tokenizer_path, sizeof ds->tokenizer_path, dir, ds->tok.file);
    if (!rc) {
        uint8_t fp[16];
        rc = tks_file_xxh3_128(ds->tokenizer_path, fp, NULL);
        if (!rc && memcmp(fp, ds->tok.fingerprint, 16) != 0)
            rc = tks_fail(TKS_ERR_TOKENIZER, ds->tokenizer_path, TKS_NONE, TKS_NONE,
                          "%s: the tokenizer copy does not match the manifest's fingerprint: it "
                          "was replaced or corrupted; restore it or rebuild the dataset",
                          ds->tokenizer_path);
    }
    if (!rc && ds->tok.has_config) {
        char cpath[PATH_MAX];
        uint8_t ch[16];
        rc = tks_path_join(cpath, sizeof cpath, dir, TKS_TOKENIZER_CONFIG_NAME);
        if (!rc && access(cpath, F_OK) != 0)
            rc = tks_fail(TKS_ERR_TOKENIZER, cpath, TKS_NONE, TKS_NONE,
                          "%s is missing: the manifest records the dataset's tokenizer_config.json (its BOS, EOS "
                          "and pad); restore it or rebuild the dataset", cpath);
        if (!rc) rc = tks_file_xxh3_128(cpath, ch, NULL);
        if (!rc && memcmp(ch, ds->tok.config_xxh3, 16) != 0)
            rc = tks_fail(TKS_ERR_TOKENIZER, cpath, TKS_NONE, TKS_NONE,
                          "%s does not match the manifest's config_xxh3: it was edited or replaced (its BOS, "
                          "EOS and pad are what the dataset was built with); restore it or rebuild the dataset",
                          cpath);
    }
    if (!rc && n) {
        ds->shards = calloc(n, sizeof *ds->shards);
        if (!ds->shards) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    }
    for (size_t i = 0; i < n && !rc; i++) {
        char sp[PATH_MAX];
        rc = tks_path_join(sp, sizeof sp, dir, si[i].file);
        if (!rc) rc = tks_shard_open(sp, &ds->shards[i]);
        if (rc) break;
        ds->n_shards = i + 1;
        rc = tks__shard_matches(ds->shards[i], &si[i], &ds->tok, ds->token_bytes, ds->chunk_bytes);
        const tks_shard_header *h = tks_shard_hdr(ds->shards[i]);
        ds->n_tokens += h->n_tokens;
        ds->n_docs += h->n_docs;
        if (h->max_token_id > ds->max_id) ds->max_id = h->max_token_id;
    }
    ds->version = n ? si[0].version : TKS_FORMAT_V1;
    free(si);
    if (rc) tks_dataset_close(ds);
    else *out = ds;
    return rc;
}

const char *tks_dataset_dir(const tks_dataset *ds) { return ds->dir; }
const tks_tokenizer_info *tks_dataset_tokenizer(const tks_dataset *ds) { return &ds->tok; }
size_t tks_dataset_n_shards(const tks_dataset *ds) { return ds->n_shards; }
const tks_shard *tks_dataset_shard(const tks_dataset *ds, size_t i) { return ds->shards[i]; }
uint64_t tks_dataset_n_tokens(const tks_dataset *ds) { return ds->n_tokens; }
uint64_t tks_dataset_n_docs(const tks_dataset *ds) { return ds->n_docs; }
uint32_t tks_dataset_max_token_id(const tks_dataset *ds) { return ds->max_id; }
uint64_t tks_dataset_manifest_xxh3(const tks_dataset *ds) { return ds->manifest_xxh3; }
const char *tks_dataset_tokenizer_path(const tks_dataset *ds) { return ds->tokenizer_path; }
uint32_t tks_dataset_format_version(const tks_dataset *ds) { return ds->version; }

int tks_dataset_provenance(const tks_dataset *ds, struct json_t **out) {
    *out = NULL;
    char mpath[PATH_MAX], *text = NULL;
    size_t len = 0;
    int rc = tks_path_join(mpath, sizeof mpath, ds->dir, TKS_MANIFEST_NAME);
    if (!rc) rc = tks__read_small_file(mpath, &text, &len);
    if (!rc && XXH3_64bits(text, len) != ds->manifest_xxh3)
        rc = tks_fail(TKS_ERR_MANIFEST, mpath, TKS_NONE, TKS_NONE,
                      "%s changed since the dataset was opened: audit it again", mpath);
    json_error_t jerr;
    json_t *m = rc ? NULL : json_loadb(text, len, 0, &jerr);
    if (!rc && !m)
        rc = tks_fail(TKS_ERR_MANIFEST, mpath, TKS_NONE, TKS_NONE, "%s: not valid JSON (%s)", mpath, jerr.text);
    free(text);
    json_t *p = json_object_get(m, "provenance");
    if (json_is_object(p)) *out = json_incref(p);
    json_decref(m);
    return rc;
}

void tks_dataset_advise(const tks_dataset *ds, tks_access how) {
    for (size_t i = 0; ds && i < ds->n_shards; i++) tks_shard_advise(ds->shards[i], how);
}
