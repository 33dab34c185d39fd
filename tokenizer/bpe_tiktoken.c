/*
 * bpe_tiktoken.c - byte-level BPE tokenizers from tiktoken files: a ranks
 * file (each line a token's bytes in base64, a space, its rank, as
 * tiktoken's load_tiktoken_bpe reads it), a pre-tokenizer pattern and the
 * special tokens, with tiktoken's encode_ordinary as the reference (tiktoken
 * 0.14, src/lib.rs: a piece that is a token is that token; otherwise
 * byte_pair_merge, the adjacent pair whose bytes make the lowest-ranked
 * token first, the leftmost among equals).
 *
 * The pattern and the special tokens are not in a ranks file, yet they
 * change the ids, so a tiktoken tokenizer is kept as two files: the ranks
 * file as it is ("tokenizer.tiktoken") and a descriptor ("tiktoken.json",
 * written by tks_bpe_tiktoken_json) naming the ranks file's XXH3-128, the
 * pattern and the special tokens. The tokenizer's fingerprint is the
 * XXH3-128 of the descriptor's canonical bytes, whichever way it was
 * loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/load.h"
#include "tokenizer/bpe_vocab.h"

#define RANKS_NAME "tokenizer.tiktoken"

/* ---------------------------------------------------------------------------
 * The ranks file
 * ------------------------------------------------------------------------- */
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard base64 (RFC 4648 section 4, padded) s[0..n) into out
 * (at least n * 3 / 4 bytes); -1 when it is not that. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
    if (!n || n % 4) return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long m = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = i + k >= n - pad ? 0 : b64_value((unsigned char)s[i + k]);
            if (v[k] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[m++] = (unsigned char)(w >> 16);
        if (i + 4 < n || pad < 2) out[m++] = (unsigned char)(w >> 8);
        if (i + 4 < n || pad < 1) out[m++] = (unsigned char)w;
    }
    return m;
}

int tks__tiktoken_sniff_bytes(const uint8_t *base, size_t size) {
    char line[512];
    size_t k = 0;
    while (k < size && k + 1 < sizeof line && base[k] != '\n') k++;
    memcpy(line, base, k);
    line[k] = 0;
    size_t i = 0;
    while (b64_value((unsigned char)line[i]) >= 0) i++;
    while (line[i] == '=') i++;
    if (!i || line[i] != ' ') return 0;
    size_t j = ++i;
    while (line[i] >= '0' && line[i] <= '9') i++;
    return i > j && (line[i] == '\r' || !line[i]);
}

/* 1 when the first line of the file looks like a ranks file ("BASE64 RANK"). */
int tks_tiktoken_sniff(const char *path) {
    /* only a regular file is looked into (a FIFO's open would wait for a
     * writer); the loader then names what else it is */
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint8_t head[512];
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    return tks__tiktoken_sniff_bytes(head, got);
}

typedef struct rank_line {
    uint32_t rank;
    uint32_t len;
    uint64_t off; /* the decoded bytes in the tokens buffer */
    size_t line;
} rank_line;

/* Reads every "BASE64 RANK" line (empty lines skipped, as tiktoken does)
 * into *lines and the decoded bytes into *bytes. */
static int read_ranks(tks_bpe *b, const char *text, size_t size, rank_line **lines, size_t *n_lines,
                      unsigned char **bytes) {
    size_t cap = 0, n = 0, used = 0;
    *lines = NULL;
    *bytes = malloc(size ? size : 1);
    if (!*bytes) return tks__bpe_nomem(b, "ranks");
    size_t line = 0;
    for (size_t i = 0; i < size;) {
        size_t e = i;
        while (e < size && text[e] != '\n') e++;
        line++;
        size_t end = e > i && text[e - 1] == '\r' ? e - 1 : e;
        if (end > i) {
            const char *sp = memchr(text + i, ' ', end - i);
            char num[16];
            size_t nl = sp ? (size_t)(text + end - sp - 1) : 0;
            if (!sp || !nl || nl >= sizeof num)
                return tks__bpe_refuse(b, "line %zu is not \"BASE64 RANK\" (a tiktoken ranks file)", line);
            memcpy(num, sp + 1, nl);
            num[nl] = 0;
            char *stop;
            errno = 0;
            unsigned long long r = strtoull(num, &stop, 10);
            if (*stop || errno || num[0] < '0' || num[0] > '9' || r >= UINT32_MAX / 2)
                return tks__bpe_refuse(b, "line %zu: rank \"%s\" is not a number below %u", line, num,
                                       UINT32_MAX / 2);
            long k = b64_decode(text + i, (size_t)(sp - text - i), *bytes + used);
            if (k <= 0) return tks__bpe_refuse(b, "line %zu: the token is not base64", line);
            if (n == cap) {
                cap = cap ? 2 * cap : 1 << 16;
                if (tks_resize(lines, cap, sizeof **lines)) return tks__bpe_nomem(b, "ranks");
            }
            (*lines)[n++] = (rank_line){(uint32_t)r, (uint32_t)k, used, line};
            used += (size_t)k;
        }
        i = e + 1;
    }
    if (!n) return tks__bpe_refuse(b, "no ranks: not a tiktoken ranks file");
    *n_lines = n;
    return 0;
}

/* The mergeable tokens: ranks 0 .. n-1 without a gap or a repeat, every
 * single byte among them, no token twice. */
static int rank_tables(tks_bpe *b, const rank_line *lines, size_t n, const unsigned char *bytes,
                       uint32_t n_ids, size_t special_bytes) {
    const rank_line **by_rank = calloc(n, sizeof *by_rank);
    b->off = calloc((size_t)n_ids + 1, sizeof *b->off);
    b->special = calloc(n_ids, 1);
    b->hole = calloc(n_ids, 1);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += lines[i].len;
    b->bytes = malloc(total + special_bytes + 1);
    if (!by_rank || !b->off || !b->special || !b->hole || !b->bytes) {
        free(by_rank);
        return tks__bpe_nomem(b, "ranks");
    }
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (lines[i].rank >= n)
            rc = tks__bpe_refuse(b, "line %zu: rank %u leaves a gap (the file has %zu ranks: 0 .. %zu expected)",
                                 lines[i].line, lines[i].rank, n, n - 1);
        else if (by_rank[lines[i].rank])
            rc = tks__bpe_refuse(b, "line %zu repeats rank %u of line %zu", lines[i].line, lines[i].rank,
                                 by_rank[lines[i].rank]->line);
        else
            by_rank[lines[i].rank] = &lines[i];
    }
    for (unsigned x = 0; x < 256; x++) b->byte_id[x] = TKS_NO_ID;
    for (size_t r = 0; r < n && !rc; r++) {
        memcpy(b->bytes + b->off[r], bytes + by_rank[r]->off, by_rank[r]->len);
        b->off[r + 1] = b->off[r] + by_rank[r]->len;
        if (by_rank[r]->len == 1) b->byte_id[(unsigned char)b->bytes[b->off[r]]] = (uint32_t)r;
    }
    for (unsigned x = 0; x < 256 && !rc; x++)
        if (b->byte_id[x] == TKS_NO_ID)
            rc = tks__bpe_refuse(b, "byte 0x%02x has no rank of its own: tiktoken could not encode it", x);
    free(by_rank);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Special tokens and the pattern
 * ------------------------------------------------------------------------- */
typedef struct special {
    char *text;
    uint32_t id;
} special;

static int special_cmp(const void *a, const void *b) {
    const special *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* "TEXT=ID,TEXT=ID" into a list (the last '=' of an item separates). */
static int parse_specials(tks_bpe *b, const char *spec, special **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!spec || !*spec) return 0;
    size_t n = 0;
    const char *p = spec;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *eq = NULL;
        for (const char *q = p; q < p + len; q++)
            if (*q == '=') eq = q;
        char num[16];
        size_t nl = eq ? (size_t)(p + len - eq - 1) : 0;
        if (!eq || eq == p || !nl || nl >= sizeof num)
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE,
                            "%s: --special-tokens: \"%.*s\" is not TEXT=ID (a list like <|endoftext|>=100257,...)",
                            b->path, (int)len, p);
        memcpy(num, eq + 1, nl);
        num[nl] = 0;
        char *stop;
        unsigned long long id = strtoull(num, &stop, 10);
        if (*stop || num[0] < '0' || num[0] > '9' || id >= UINT32_MAX / 2)
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE, "%s: --special-tokens: \"%s\" is not an id",
                            b->path, num);
        if (tks_resize(out, n + 1, sizeof **out) || !((*out)[n].text = strndup(p, (size_t)(eq - p)))) {
            *n_out = n;
            return tks__bpe_nomem(b, "special tokens");
        }
        (*out)[n++].id = (uint32_t)id;
        *n_out = n;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

static void specials_free(special *s, size_t n) {
    for (size_t i = 0; s && i < n; i++) free(s[i].text);
    free(s);
}

/* The pattern and special tokens of a tokenizer.json: its Split regex (or
 * GPT-2's when its ByteLevel splits), its added tokens. */
static int from_tokenizer_json(tks_bpe *b, const char *json_path, char **pattern, special **sp, size_t *n_sp) {
    json_error_t je;
    json_t *root = json_load_file(json_path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tks_fail(TKS_ERR_TOKENIZER, json_path, TKS_NONE, TKS_NONE,
                        "--pattern %s: not valid JSON (line %d: %s)", json_path, je.line, je.text);
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *type = json_string_value(json_object_get(pre, "type"));
    const char *pat = NULL;
    if (type && !strcmp(type, "ByteLevel") && json_is_true(json_object_get(pre, "use_regex")))
        pat = tks__bpe_gpt2_pattern;
    if (type && !strcmp(type, "Sequence")) {
        json_t *items = json_object_get(pre, "pretokenizers");
        json_t *first = json_array_get(items, 0);
        const char *ft = json_string_value(json_object_get(first, "type"));
        if (json_array_size(items) == 2 && ft && !strcmp(ft, "Split"))
            pat = json_string_value(json_object_get(json_object_get(first, "pattern"), "Regex"));
    }
    int rc = 0;
    if (!pat)
        rc = tks_fail(TKS_ERR_TOKENIZER, json_path, TKS_NONE, TKS_NONE,
                      "--pattern %s: its pre_tokenizer is not one Split regex then ByteLevel, nor a ByteLevel "
                      "with its regex: name the pattern instead", json_path);
    if (!rc && !(*pattern = strdup(pat))) rc = tks__bpe_nomem(b, "pattern");
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; !rc && sp && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(a, "content"));
        json_t *id = json_object_get(a, "id");
        if (!c || !json_is_integer(id)) continue;
        if (tks_resize(sp, *n_sp + 1, sizeof **sp) || !((*sp)[*n_sp].text = strdup(c))) {
            rc = tks__bpe_nomem(b, "special tokens");
            break;
        }
        (*sp)[(*n_sp)++].id = (uint32_t)json_integer_value(id);
    }
    json_decref(root);
    return rc;
}

/* The regex for `pattern` (a name, a tokenizer.json, or a regex) into
 * b->tt_pattern / tt_pattern_name, and the special tokens the pattern's
 * source gives when `spec` is NULL. */
/* Llama 3's 256 special tokens, ids 128000-128255, as "TEXT=ID,...": Meta's
 * llama3 repository (llama/tokenizer.py) for Llama 3, llama-models
 * (models/llama3/tokenizer.py) for Llama 3.1 and later, whose list renames
 * 128004, 128005, 128008 and 128010 and renumbers the reserved tokens after
 * them; 128000 <|begin_of_text|>, 128001 <|end_of_text|>, 128006-128007 the
 * header marks and 128009 <|eot_id|> are the same in both. malloc'd. */
static char *llama3_specials(int v31) {
    static const char *const v30[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                      "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                                      "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                                      "<|reserved_special_token_4|>", "<|eot_id|>"};
    static const char *const v31l[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                       "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                                       "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                       "<|python_tag|>"};
    const char *const *named = v31 ? v31l : v30;
    int n_named = v31 ? 11 : 10, next_reserved = v31 ? 2 : 5;
    size_t cap = 256 * 48, len = 0;
    char *out = malloc(cap);
    for (int i = 0; out && i < 256; i++) {
        char name[48];
        if (i < n_named) snprintf(name, sizeof name, "%s", named[i]);
        else snprintf(name, sizeof name, "<|reserved_special_token_%d|>", next_reserved++);
        len += (size_t)snprintf(out + len, cap - len, "%s%s=%d", i ? "," : "", name, 128000 + i);
    }
    return out;
}

static int resolve_pattern(tks_bpe *b, const tks_tiktoken_opts *o, special **sp, size_t *n_sp) {
    const char *pat = o ? o->pattern : NULL;
    if (!pat || !*pat)
        return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE,
                        "%s is a tiktoken ranks file, which holds no pattern: give one with --pattern "
                        "gpt2|cl100k|o200k|llama3|llama3.1|qwen2, a regex, or a tokenizer.json", b->path);
    const char *named = tks_tiktoken_pattern(pat);
    size_t len = strlen(pat);
    int rc = 0;
    if (named) {
        b->tt_pattern_name = strdup(pat);
        b->tt_pattern = strdup(named);
        if (!b->tt_pattern_name || !b->tt_pattern) return tks__bpe_nomem(b, "pattern");
        const char *specials = tks__bpe_named_specials(pat);
        if (!o->special_tokens && specials) rc = parse_specials(b, specials, sp, n_sp);
        if (!rc && !o->special_tokens && !strncmp(pat, "llama3", 6)) { /* llama3, llama3.1 */
            char *l3 = llama3_specials(pat[6] == '.');
            rc = l3 ? parse_specials(b, l3, sp, n_sp) : tks__bpe_nomem(b, "specials");
            free(l3);
        }
    } else if (len > 5 && !strcmp(pat + len - 5, ".json")) {
        rc = from_tokenizer_json(b, pat, &b->tt_pattern, o->special_tokens ? NULL : sp, n_sp);
    } else if (!(b->tt_pattern = strdup(pat))) {
        rc = tks__bpe_nomem(b, "pattern");
    }
    if (!rc && o->special_tokens) rc = parse_specials(b, o->special_tokens, sp, n_sp);
    return rc;
}

/* Special ids: above the ranks, each once; the ids between are gaps. */
static int place_specials(tks_bpe *b, special *sp, size_t n_sp, uint32_t n_ranks, uint32_t *n_ids) {
    if (n_sp) qsort(sp, n_sp, sizeof *sp, special_cmp); /* sp may be NULL when there are none */
    *n_ids = n_ranks;
    for (size_t i = 0; i < n_sp; i++) {
        if (sp[i].id < n_ranks)
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE,
                            "special token \"%s\" has id %u, a rank of %s (special ids come after its %u ranks)",
                            sp[i].text, sp[i].id, b->path, n_ranks);
        if (i && sp[i].id == sp[i - 1].id)
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE, "%s: special tokens \"%s\" and \"%s\" share id %u",
                            b->path, sp[i - 1].text, sp[i].text, sp[i].id);
        if (!*sp[i].text)
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE, "%s: special token %u has no text", b->path,
                            sp[i].id);
        /* far: more than 2^20 ids past the ranks (every vocabulary in use puts
         * its specials right after them: cl100k's from 100257, Llama 3's from
         * 128000); the ids between are gaps the vocabulary would carry */
        if (sp[i].id - n_ranks > (1u << 20))
            return tks_fail(TKS_ERR_ARG, b->path, TKS_NONE, TKS_NONE,
                            "special token \"%s\" has id %u, more than 2^20 past %s's %u ranks (a typo? special "
                            "ids follow the ranks: cl100k's from 100257, Llama 3's from 128000)",
                            sp[i].text, sp[i].id, b->path, n_ranks);
        *n_ids = sp[i].id + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * The descriptor
 * ------------------------------------------------------------------------- */
static void hex16(const uint8_t d[16], char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int tks_bpe_tiktoken_json(const tks_bpe *b, char **text, size_t *len) {
    *text = NULL;
    if (!b || b->mode != TKS__BPE_RANKS)
        return tks_fail(TKS_ERR_ARG, b ? b->path : NULL, TKS_NONE, TKS_NONE, "not a tiktoken tokenizer");
    char hx[33];
    hex16(b->tt_ranks_xxh3, hx);
    json_t *sp = json_array();
    for (uint32_t id = 0; sp && id < b->n_ids; id++)
        if (b->special[id])
            json_array_append_new(sp, json_pack("[s%,I]", b->bytes + b->off[id], (size_t)(b->off[id + 1] - b->off[id]),
                                                (json_int_t)id));
    json_t *d = json_pack("{s:s, s:s, s:s, s:s?, s:s, s:o}", "type", "tiktoken", "ranks_file", RANKS_NAME,
                          "ranks_xxh3", hx, "pattern_name", b->tt_pattern_name, "pattern", b->tt_pattern,
                          "special_tokens", sp);
    char *s = d ? json_dumps(d, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(d);
    if (!s) return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "out of memory writing the descriptor");
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "out of memory writing the descriptor");
    }
    t[n] = '\n';
    t[n + 1] = 0;
    *text = t;
    if (len) *len = n + 1;
    return 0;
}

const char *tks_bpe_tiktoken_ranks(const tks_bpe *b) { return b && b->mode == TKS__BPE_RANKS ? b->tt_ranks : NULL; }

/* ---------------------------------------------------------------------------
 * As a Hugging Face tokenizer.json
 * ------------------------------------------------------------------------- */
/* A token's bytes as tokenizers' ByteLevel characters (GPT-2's table). */
static uint16_t g_bl[256]; /* GPT-2's table, filled by tks_bpe_tiktoken_hf_json */

static json_t *byte_level(const char *s, size_t n) {
    char *u = malloc(2 * n + 1);
    if (!u) return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = g_bl[(unsigned char)s[i]];
        if (c < 0x80) u[m++] = (char)c;
        else u[m++] = (char)(0xC0 | c >> 6), u[m++] = (char)(0x80 | (c & 0x3F));
    }
    json_t *j = json_stringn(u, m);
    free(u);
    return j;
}

static void fill_bl(void) {
    for (unsigned x = 0; x < 256; x++) g_bl[x] = (uint16_t)tks__bpe_byte_char(x);
}

typedef struct split_pair {
    uint32_t l, r;
} split_pair;

static int pair_cmp(const void *a, const void *b) {
    const split_pair *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->r < y->r ? -1 : x->r > y->r;
}

/* The merges transformers' TikTokenConverter derives from ranks: every
 * split of every token into two tokens, by the token's rank, then by the
 * two halves' ranks. */
static int hf_merges(const tks_bpe *b, json_t *merges) {
    split_pair *local = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint32_t id = 0; !rc && id < b->n_model; id++) {
        const char *s = b->bytes + b->off[id];
        size_t n = b->off[id + 1] - b->off[id], k = 0;
        if (n + 1 > cap && tks_resize(&local, cap = n + 1, sizeof *local)) rc = tks__bpe_nomem(b, "merges");
        for (size_t i = 1; !rc && i < n; i++) {
            uint32_t l = tks__bpe_vocab_find(b, s, i), r = tks__bpe_vocab_find(b, s + i, n - i);
            if (l != TKS_NO_ID && r != TKS_NO_ID) local[k++] = (split_pair){l, r};
        }
        if (k) qsort(local, k, sizeof *local, pair_cmp);
        for (size_t i = 0; !rc && i < k; i++) {
            json_t *l = byte_level(b->bytes + b->off[local[i].l], b->off[local[i].l + 1] - b->off[local[i].l]);
            json_t *r = byte_level(b->bytes + b->off[local[i].r], b->off[local[i].r + 1] - b->off[local[i].r]);
            json_t *p = l && r ? json_pack("[o,o]", l, r) : NULL;
            if (!p || json_array_append_new(merges, p)) rc = tks__bpe_nomem(b, "merges");
        }
    }
    free(local);
    return rc;
}

int tks_bpe_tiktoken_hf_json(const tks_bpe *b, char **text) {
    *text = NULL;
    if (!b || b->mode != TKS__BPE_RANKS)
        return tks_fail(TKS_ERR_ARG, b ? b->path : NULL, TKS_NONE, TKS_NONE, "not a tiktoken tokenizer");
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    int rc = vocab && merges && added ? 0 : tks__bpe_nomem(b, "tokenizer.json");
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_bl);
    for (uint32_t id = 0; !rc && id < b->n_ids; id++) {
        const char *s = b->bytes + b->off[id];
        size_t n = b->off[id + 1] - b->off[id];
        if (b->hole[id]) continue;
        if (b->special[id]) {
            json_t *a = json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", s, n,
                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
            if (!a || json_array_append_new(added, a)) rc = tks__bpe_nomem(b, "tokenizer.json");
            continue;
        }
        json_t *k = byte_level(s, n);
        if (!k || json_object_set_new(vocab, json_string_value(k), json_integer(id))) rc = tks__bpe_nomem(b, "vocab");
        json_decref(k);
    }
    if (!rc) rc = hf_merges(b, merges);
    /* tokenizers' Oniguruma reads {n,m}+ as a repetition of {n,m}, not as
     * PCRE2's and Rust's possessive {n,m}: cl100k's \p{N}{1,3}+ would take
     * every digit. A named pattern's possessive {n,m} gives nothing back
     * that what follows could take, so it is written plain; another
     * pattern with one is refused. */
    char *pat = strdup(b->tt_pattern ? b->tt_pattern : "");
    if (!rc && !pat) rc = tks__bpe_nomem(b, "pattern");
    for (char *q = pat; !rc && q && (q = strstr(q, "}+")); q++) {
        char *o = q; /* a quantifier {n}, {n,} or {n,m}, not a property \p{L} */
        while (o > pat && ((o[-1] >= '0' && o[-1] <= '9') || o[-1] == ',')) o--;
        if (o == q || o == pat || o[-1] != '{') continue;
        if (!b->tt_pattern_name)
            rc = tks_fail(TKS_ERR_TOKENIZER, b->path, TKS_NONE, TKS_NONE,
                          "%s: the pattern has a possessive {n,m}+, which Hugging Face tokenizers' regex engine "
                          "reads otherwise: no tokenizer.json gives the same ids", b->path);
        else
            memmove(q + 1, q + 2, strlen(q + 2) + 1);
    }
    json_t *bl = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                           "use_regex", 0);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type",
                            "Split", "pattern", "Regex", pat ? pat : "", "behavior", "Isolated", "invert", 0, bl);
    free(pat);
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges", merges);
    vocab = merges = NULL;
    json_t *root = pre && model ? json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:{s:s, s:b, s:b, s:b}, "
                                           "s:{s:s, s:b, s:b, s:b}, s:o}",
                                           "version", "1.0", "truncation", "padding", "added_tokens", added,
                                           "normalizer", "pre_tokenizer", pre, "post_processor", "type",
                                           "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0, "use_regex", 1,
                                           "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                                           "use_regex", 1, "model", model)
                                : NULL;
    if (!root) {
        json_decref(pre);
        json_decref(model);
        json_decref(added);
    }
    json_decref(vocab);
    json_decref(merges);
    if (!rc && !root) rc = tks__bpe_nomem(b, "tokenizer.json");
    if (!rc && !(*text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER))) rc = tks__bpe_nomem(b, "tokenizer.json");
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */
static int build(tks_bpe *b, const char *text, size_t size, special *sp, size_t n_sp) {
    rank_line *lines = NULL;
    unsigned char *bytes = NULL;
    size_t n = 0, sbytes = 0;
    uint32_t n_ids = 0;
    int rc = read_ranks(b, text, size, &lines, &n, &bytes);
    if (!rc && n >= UINT32_MAX / 2) rc = tks__bpe_refuse(b, "%zu ranks", n);
    if (!rc) rc = place_specials(b, sp, n_sp, (uint32_t)n, &n_ids);
    for (size_t i = 0; i < n_sp; i++) sbytes += strlen(sp[i].text);
    if (!rc) rc = rank_tables(b, lines, n, bytes, n_ids, sbytes);
    free(lines);
    free(bytes);
    if (rc) return rc;
    b->n_ids = n_ids;
    b->n_model = (uint32_t)n;
    size_t k = 0;
    for (uint32_t id = (uint32_t)n; id < n_ids; id++) {
        size_t len = 0;
        if (k < n_sp && sp[k].id == id) {
            len = strlen(sp[k].text);
            memcpy(b->bytes + b->off[id], sp[k].text, len);
            b->special[id] = 1;
            if ((rc = tks__bpe_add_token(b, sp[k].text, len, id, 1, 0, 0))) return rc;
            k++;
        } else {
            b->hole[id] = 1;
        }
        b->off[id + 1] = b->off[id] + len;
    }
    b->mode = TKS__BPE_RANKS;
    b->ignore_merges = 1;
    /* tiktoken keeps what the pattern matches and drops the text between */
    rc = tks__bpe_compile(b, b->tt_pattern, strlen(b->tt_pattern), 0, PCRE2_DOLLAR_ENDONLY, "pattern");
    if (rc) return rc;
    b->split[0].how = B_REMOVED;
    b->split[0].invert = 1;
    return tks__bpe_finish(b, (uint32_t)n, NULL);
}

/* The key of a ranks file's cache entry: the XXH3-128 of what its tables
 * are made from, the ranks (their XXH3-128, ranks_xxh3), the pattern and
 * the special tokens. */
static int ranks_cache_key(tks_bpe *b, const uint8_t ranks_xxh3[16], const special *sp, size_t n_sp,
                           uint8_t key[16]) {
    XXH3_state_t *x = XXH3_createState();
    if (!x) return tks__bpe_nomem(b, "cache key");
    static const char domain[] = "tokshard tiktoken ranks";
    uint64_t pl = strlen(b->tt_pattern);
    XXH3_128bits_reset(x);
    XXH3_128bits_update(x, domain, sizeof domain);
    XXH3_128bits_update(x, ranks_xxh3, 16);
    XXH3_128bits_update(x, &pl, sizeof pl);
    XXH3_128bits_update(x, b->tt_pattern, pl);
    for (size_t i = 0; i < n_sp; i++) {
        uint64_t sl = strlen(sp[i].text);
        XXH3_128bits_update(x, &sp[i].id, sizeof sp[i].id);
        XXH3_128bits_update(x, &sl, sizeof sl);
        XXH3_128bits_update(x, sp[i].text, sl);
    }
    XXH128_canonical_t kc;
    XXH128_canonicalFromHash(&kc, XXH3_128bits_digest(x));
    memcpy(key, kc.digest, 16);
    XXH3_freeState(x);
    return 0;
}

/* Loads the ranks base[0..size) of the file `path` with the pattern and
 * specials already in b. */
static int load_ranks_bytes(tks_bpe *b, const char *path, const uint8_t *base, size_t size, special *sp,
                            size_t n_sp, const uint8_t *want_xxh3) {
    int rc = 0;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(base, size));
    memcpy(b->tt_ranks_xxh3, c.digest, 16);
    if (want_xxh3 && memcmp(want_xxh3, c.digest, 16))
        rc = tks__bpe_refuse(b, "%s is not the ranks file the descriptor names (its XXH3-128 differs)", path);
    if (!rc && !(b->tt_ranks = strdup(path))) rc = tks__bpe_nomem(b, "path");
    /* the compact form an earlier load left (bpe_cache.c) */
    uint8_t key[16];
    if (!rc) rc = ranks_cache_key(b, c.digest, sp, n_sp, key);
    int cached = 0;
    if (!rc) {
        rc = tks__bpe_cache_load(b, key, size);
        cached = rc == 0;
        if (rc == 1) rc = 0;
    }
    if (!rc && !cached) rc = build(b, (const char *)base, size, sp, n_sp);
    if (rc) return rc;
    if (!cached) tks__bpe_cache_store(b, key, size);
    char *d;
    size_t dl;
    if ((rc = tks_bpe_tiktoken_json(b, &d, &dl))) return rc;
    XXH128_canonicalFromHash(&c, XXH3_128bits(d, dl));
    memcpy(b->fingerprint, c.digest, 16);
    free(d);
    return 0;
}

/* Loads the ranks file at `path` (mapped for the call). */
static int load_ranks(tks_bpe *b, const char *path, special *sp, size_t n_sp, const uint8_t *want_xxh3) {
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "tiktoken ranks", &base, &size);
    if (rc) return rc;
    rc = load_ranks_bytes(b, path, base, size, sp, n_sp, want_xxh3);
    tks_unmap(base, size);
    return rc;
}

int tks_bpe_load_tiktoken(const char *path, const tks_tiktoken_opts *o, tks_bpe **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "tks_bpe_load_tiktoken: out is NULL");
    *out = NULL;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_bpe_load_tiktoken: path is NULL");
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "tiktoken ranks", &base, &size);
    if (rc) return rc;
    rc = tks__bpe_load_tiktoken_bytes(path, base, size, o, 0, out);
    tks_unmap(base, size);
    return rc;
}

int tks__bpe_load_tiktoken_bytes(const char *path, const uint8_t *base, size_t size, const tks_tiktoken_opts *o,
                                 int no_cache, tks_bpe **out) {
    *out = NULL;
    tks_bpe *b = tks__bpe_new(path);
    if (!b) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory loading %s", path);
    b->no_cache = no_cache;
    special *sp = NULL;
    size_t n_sp = 0;
    int rc = resolve_pattern(b, o, &sp, &n_sp);
    if (!rc) rc = load_ranks_bytes(b, path, base, size, sp, n_sp, NULL);
    specials_free(sp, n_sp);
    if (rc) {
        tks_bpe_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* A descriptor (tks_bpe_tiktoken_json's format) at `path`, parsed: its
 * ranks file beside it, checked against the recorded XXH3-128. */
int tks__bpe_load_descriptor(const char *path, json_t *d, int no_cache, tks_bpe **out) {
    *out = NULL;
    tks_bpe *b = tks__bpe_new(path);
    if (!b) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory loading %s", path);
    b->no_cache = no_cache;
    const char *rf = json_string_value(json_object_get(d, "ranks_file"));
    const char *hx = json_string_value(json_object_get(d, "ranks_xxh3"));
    const char *pat = json_string_value(json_object_get(d, "pattern"));
    const char *name = json_string_value(json_object_get(d, "pattern_name"));
    json_t *spj = json_object_get(d, "special_tokens");
    int rc = 0;
    uint8_t want[16];
    if (!rf || strchr(rf, '/') || !hx || strlen(hx) != 32 || !pat || !json_is_array(spj))
        rc = tks__bpe_refuse(b, "not a tiktoken descriptor (ranks_file, ranks_xxh3, pattern and special_tokens "
                                "expected)");
    for (int i = 0; !rc && i < 16; i++) {
        unsigned v;
        if (sscanf(hx + 2 * i, "%2x", &v) != 1) rc = tks__bpe_refuse(b, "ranks_xxh3 is not 32 hex digits");
        want[i] = (uint8_t)v;
    }
    if (!rc && name && (!tks_tiktoken_pattern(name) || strcmp(tks_tiktoken_pattern(name), pat)))
        rc = tks__bpe_refuse(b, "pattern_name \"%s\" does not name the pattern given", name);
    if (!rc && (!(b->tt_pattern = strdup(pat)) || (name && !(b->tt_pattern_name = strdup(name)))))
        rc = tks__bpe_nomem(b, "pattern");
    special *sp = NULL;
    size_t n_sp = json_array_size(spj);
    if (!rc && n_sp && !(sp = calloc(n_sp, sizeof *sp))) rc = tks__bpe_nomem(b, "special tokens");
    for (size_t i = 0; !rc && i < n_sp; i++) {
        json_t *e = json_array_get(spj, i);
        const char *t = json_string_value(json_array_get(e, 0));
        json_t *id = json_array_get(e, 1);
        if (!t || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= UINT32_MAX / 2)
            rc = tks__bpe_refuse(b, "special_tokens[%zu] is not [TEXT, ID]", i);
        else if (!(sp[i].text = strdup(t)))
            rc = tks__bpe_nomem(b, "special tokens");
        else
            sp[i].id = (uint32_t)json_integer_value(id);
    }
    char ranks[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!rc && snprintf(ranks, sizeof ranks, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, rf) >=
                   (int)sizeof ranks)
        rc = tks__bpe_refuse(b, "path too long");
    if (!rc) rc = load_ranks(b, ranks, sp, n_sp, want);
    specials_free(sp, n_sp);
    if (rc) {
        tks_bpe_free(b);
        return rc;
    }
    *out = b;
    return 0;
}
