/*
 * fastenc_load.c - the fast encoder's model (see fastenc.h): reads a
 * sentencepiece ModelProto, builds the tables the encoder (fastenc.c) walks,
 * and decides what it may do with the model: whether it encodes it exactly
 * at all, where words may be cut (the word split argument is at the top of
 * fastenc.c), and where sentencepiece's own input may be cut
 * (tks_fast_next_cut).
 *
 * The proto is read with the bounds-checked wire-format walker of pb.h,
 * proto2 semantics: the last value of a field wins and enum values outside
 * the enum are ignored. Field numbers from sentencepiece_model.proto
 * (sentencepiece v0.1.97): ModelProto 1 pieces, 2 trainer_spec,
 * 3 normalizer_spec; SentencePiece 1 piece, 2 score, 3 type; TrainerSpec
 * 3 model_type, 24 treat_whitespace_as_suffix, 35 byte_fallback;
 * NormalizerSpec 2 precompiled_charsmap, 3 add_dummy_prefix,
 * 4 remove_extra_whitespaces, 5 escape_whitespaces.
 */
#include "tokenizer/fastenc_internal.h"
#include "tokenizer/pb.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_why(char *why, size_t why_len, const char *fmt, ...) {
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static void *xcalloc(size_t n, size_t sz) { return n ? calloc(n, sz) : calloc(1, 1); }

static int isalnum_ascii(int c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

/* Pieces sentencepiece keeps in pieces_ (the others are in reserved_id_map_). */
static int is_normal_type(uint8_t ty) { return ty == PT_NORMAL || ty == PT_USER || ty == PT_UNUSED; }

/* ---------------------------------------------------------------------------
 * The proto
 * ------------------------------------------------------------------------- */

/* What the first pass over the ModelProto finds: the pieces' count and
 * bytes, and the spec fields the encoder follows. */
typedef struct model_spec {
    size_t n_pieces, str_bytes;
    int model_type, byte_fallback, ws_suffix;
    int dummy, rews, esc;  /* add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces */
    const uint8_t *cmap;   /* precompiled_charsmap, inside the proto */
    size_t cmap_len;
} model_spec;

/* Reads one SentencePiece message: its bytes (pointing into the message),
 * score and type, NORMAL unless the message says otherwise. Returns 0, or
 * -1 when the message is malformed. */
static int parse_piece(const uint8_t *p, const uint8_t *end, const uint8_t **str, size_t *slen,
                       float *score, uint8_t *type) {
    pb_field fl;
    int r;
    *str = (const uint8_t *)"";
    *slen = 0;
    *score = 0.0f;
    *type = PT_NORMAL;
    while ((r = pb_next(&p, end, &fl)) > 0) {
        if (fl.num == 1 && fl.wt == 2) {
            *str = fl.data;
            *slen = fl.len;
        } else if (fl.num == 2 && fl.wt == 5) {
            memcpy(score, fl.data, 4); /* little-endian hosts only (sentencepiece too) */
        } else if (fl.num == 3 && fl.wt == 0 && fl.v >= 1 && fl.v <= 6) {
            *type = (uint8_t)fl.v;
        }
    }
    return r;
}

/* TrainerSpec into m; 0, or -1 when malformed. */
static int read_trainer_spec(const uint8_t *p, const uint8_t *end, model_spec *m) {
    pb_field g;
    int r;
    while ((r = pb_next(&p, end, &g)) > 0) {
        if (g.wt != 0) continue;
        if (g.num == 3 && g.v >= 1 && g.v <= 4) m->model_type = (int)g.v;
        else if (g.num == 24) m->ws_suffix = g.v != 0;
        else if (g.num == 35) m->byte_fallback = g.v != 0;
    }
    return r;
}

/* NormalizerSpec into m; 0, or -1 when malformed. */
static int read_normalizer_spec(const uint8_t *p, const uint8_t *end, model_spec *m) {
    pb_field g;
    int r;
    while ((r = pb_next(&p, end, &g)) > 0) {
        if (g.num == 2 && g.wt == 2) {
            m->cmap = g.data;
            m->cmap_len = g.len;
        } else if (g.wt == 0 && g.num == 3) m->dummy = g.v != 0;
        else if (g.wt == 0 && g.num == 4) m->rews = g.v != 0;
        else if (g.wt == 0 && g.num == 5) m->esc = g.v != 0;
    }
    return r;
}

/* The first pass: counts the pieces and their bytes and reads the specs.
 * Returns 0, or 1 with the reason in `why` when the proto does not parse or
 * the model is outside what the fast path reproduces. */
static int scan_model(const uint8_t *buf, size_t n, model_spec *m, char *why, size_t why_len) {
    *m = (model_spec){.model_type = KIND_UNIGRAM, .dummy = 1, .rews = 1, .esc = 1};
    const uint8_t *p = buf, *end = buf + n;
    pb_field fl;
    int r;
    while ((r = pb_next(&p, end, &fl)) > 0) {
        if (fl.wt != 2) continue;
        const uint8_t *q = fl.data, *qe = fl.data + fl.len;
        if (fl.num == 1) {
            const uint8_t *s;
            size_t sl;
            float sc;
            uint8_t ty;
            if (parse_piece(q, qe, &s, &sl, &sc, &ty) < 0) r = -1;
            m->n_pieces++;
            m->str_bytes += sl;
        } else if (fl.num == 2) {
            if (read_trainer_spec(q, qe, m) < 0) r = -1;
        } else if (fl.num == 3) {
            if (read_normalizer_spec(q, qe, m) < 0) r = -1;
        }
        if (r < 0) break;
    }
    if (r < 0) return set_why(why, why_len, "the model proto does not parse");
    if (m->model_type != KIND_BPE && m->model_type != KIND_UNIGRAM)
        return set_why(why, why_len, "model type %s is not bpe or unigram",
                       m->model_type == 3 ? "word" : "char");
    if (m->ws_suffix) return set_why(why, why_len, "treat_whitespace_as_suffix is on");
    if (m->n_pieces == 0 || m->n_pieces > INT32_MAX || m->str_bytes > UINT32_MAX / 2)
        return set_why(why, why_len, "unsupported piece count or size");
    return 0;
}

/* ---------------------------------------------------------------------------
 * The piece tables
 * ------------------------------------------------------------------------- */

/* An empty handle sized for the model m describes, or NULL when out of
 * memory. */
static tks_fast *fast_alloc(const model_spec *m) {
    tks_fast *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    if (tks__fast_caches_init(f)) {
        free(f);
        return NULL;
    }
    size_t n_pieces = m->n_pieces, str_bytes = m->str_bytes;
    f->kind = m->model_type;
    f->byte_fallback = m->byte_fallback;
    f->add_dummy_prefix = m->dummy;
    f->remove_extra_ws = m->rews;
    f->escape_ws = m->esc;
    f->n_pieces = (uint32_t)n_pieces;
    f->score = xcalloc(n_pieces, sizeof *f->score);
    f->type = xcalloc(n_pieces, 1);
    f->plen = xcalloc(n_pieces, sizeof *f->plen);
    f->strs = xcalloc(str_bytes + 1, 1);
    /* every piece and every byte prefix of it: at most str_bytes + n entries */
    size_t want = 2 * (str_bytes + n_pieces) + 16, nt = 16;
    while (nt < want) nt *= 2;
    f->n_tab = nt;
    f->tab = malloc(nt * sizeof *f->tab);
    if (f->kind == KIND_UNIGRAM) {
        size_t ne = 16;
        while (ne < 2 * (str_bytes + 1)) ne *= 2;
        f->edge_mask = ne - 1;
        f->edge_key = calloc(ne, sizeof *f->edge_key);
        f->edge_child = calloc(ne, sizeof *f->edge_child);
        f->node_id = malloc((str_bytes + 1) * sizeof *f->node_id);
        if (f->node_id) f->node_id[f->n_nodes++] = -1; /* the root */
    }
    if (!f->score || !f->type || !f->plen || !f->strs || !f->tab ||
        (f->kind == KIND_UNIGRAM && (!f->edge_key || !f->edge_child || !f->node_id))) {
        tks_fast_free(f);
        return NULL;
    }
    for (size_t i = 0; i < nt; i++) f->tab[i].len = UINT32_MAX;
    for (int b = 0; b < 256; b++) f->byte_id[b] = -1;
    f->unk_id = -1;
    f->min_score = FLT_MAX;
    return f;
}

/* Finds or inserts; the table never fills (sized at twice the strings). */
static hent *tab_get(tks_fast *f, uint32_t off, uint32_t n) {
    const char *s = f->strs + off;
    uint64_t h = fnv(s, n);
    size_t mask = f->n_tab - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        hent *e = &f->tab[i];
        if (e->len == UINT32_MAX) {
            e->hash = h;
            e->off = off;
            e->len = n;
            e->norm_id = e->res_id = -1;
            return e;
        }
        if (e->hash == h && e->len == n && !memcmp(f->strs + e->off, s, n)) return e;
    }
}

/* Adds piece `id` (bytes s[0..n)) to the unigram trie. */
static void trie_add(tks_fast *f, const uint8_t *s, size_t n, int32_t id) {
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t key = (((uint64_t)node << 8) | s[k]) + 1;
        size_t i = edge_slot(key, f->edge_mask);
        while (f->edge_key[i] && f->edge_key[i] != key) i = (i + 1) & f->edge_mask;
        if (!f->edge_key[i]) {
            f->edge_key[i] = key;
            f->edge_child[i] = (uint32_t)f->n_nodes;
            f->node_id[f->n_nodes++] = -1;
        }
        node = f->edge_child[i];
    }
    if (f->node_id[node] < 0) f->node_id[node] = id;
}

/* 1 when s[0..n) has U+2581 after another character: such a piece would let
 * a word span a cut. */
static int ws_after_other(const uint8_t *s, size_t n) {
    int prev_other = 0;
    for (size_t k = 0; k < n;) {
        size_t m = one_char_len(s[k]);
        if (m > n - k) m = n - k;
        int ws = is_ws_sym((const char *)s + k, m);
        if (ws && prev_other) return 1;
        prev_other = !ws;
        k += m;
    }
    return 0;
}

/* What the pieces hold of user-defined symbols: whether there is one (the
 * reason names the first), and whether one contains a space. */
typedef struct user_syms {
    int seen, space;
    char why[160];
} user_syms;

/* The second pass: every piece into f's arrays, its string and byte prefixes
 * into the table, and (unigram) into the trie. Returns 0, or 1 with the
 * reason in `why` at the first piece the fast path cannot encode exactly. */
static int read_pieces(tks_fast *f, const uint8_t *buf, size_t n, user_syms *u, char *why,
                       size_t why_len) {
    const uint8_t *p = buf, *end = buf + n;
    pb_field fl;
    size_t i = 0, off = 0;
    int bad = 0;
    while (!bad && pb_next(&p, end, &fl) > 0) {
        if (fl.num != 1 || fl.wt != 2) continue;
        const uint8_t *s;
        size_t sl;
        float sc;
        uint8_t ty;
        parse_piece(fl.data, fl.data + fl.len, &s, &sl, &sc, &ty);
        memcpy(f->strs + off, s, sl);
        f->score[i] = sc;
        f->type[i] = ty;
        f->plen[i] = (uint32_t)sl;
        if (sl == 0) bad = set_why(why, why_len, "piece %zu is empty", i);
        if (ty == PT_UNUSED)
            bad = set_why(why, why_len, "piece %zu (\"%.*s\") is unused", i, (int)sl,
                          (const char *)s);
        if (ty == PT_USER && !u->seen++)
            snprintf(u->why, sizeof u->why, "piece %zu (\"%.*s\") is user-defined", i, (int)sl,
                     (const char *)s);
        if (ty == PT_USER && memchr(s, ' ', sl)) u->space = 1;
        if (ty == PT_NORMAL && sc < f->min_score) f->min_score = sc;
        if (ty == PT_UNKNOWN && f->unk_id < 0) f->unk_id = (int32_t)i;
        hent *e = tab_get(f, (uint32_t)off, (uint32_t)sl);
        if (is_normal_type(ty)) {
            if (e->norm_id < 0) e->norm_id = (int32_t)i;
            if (!bad && ws_after_other(s, sl))
                bad = set_why(why, why_len,
                              "piece %zu (\"%.*s\") has U+2581 after another character, so "
                              "words cannot be encoded one by one",
                              i, (int)sl, (const char *)s);
            /* unigram walks byte prefixes (as darts-clone's traverse does) */
            if (f->kind == KIND_UNIGRAM) trie_add(f, s, sl, (int32_t)i);
        } else if (e->res_id < 0) {
            e->res_id = (int32_t)i;
        }
        off += sl;
        i++;
    }
    f->strs_len = off;
    return bad;
}

/* The unigram cache bound's s (fastenc.c): the largest |score| of a lattice
 * node, the unknown node's included. */
static void unigram_bound(tks_fast *f) {
    if (f->kind != KIND_UNIGRAM) return;
    f->uni_smax = fabs((double)(f->min_score - UNK_PENALTY));
    for (size_t k = 0; k < f->n_pieces; k++)
        if ((f->type[k] == PT_NORMAL || f->type[k] == PT_USER) && fabs((double)f->score[k]) > f->uni_smax)
            f->uni_smax = fabs((double)f->score[k]);
}

/* Extra cuts between an ASCII letter or digit and ASCII punctuation (either
 * order): exact when no piece contains the two characters side by side,
 * since then no BPE merge and no unigram node spans the point. */
static void ascii_cuts(tks_fast *f) {
    for (int a = 0x21; a < 0x7f; a++)
        for (int b = 0x21; b < 0x7f; b++) {
            int an = isalnum_ascii(a), bn = isalnum_ascii(b);
            f->asc_cut[a][b] = an != bn;
        }
    for (size_t k = 0, o = 0; k < f->n_pieces; o += f->plen[k], k++) {
        if (!is_normal_type(f->type[k])) continue;
        const uint8_t *ps = (const uint8_t *)f->strs + o;
        for (size_t j = 1; j < f->plen[k]; j++)
            if (ps[j - 1] < 0x80 && ps[j] < 0x80) f->asc_cut[ps[j - 1]][ps[j]] = 0;
    }
}

/*
 * The BPE merge table: for every piece m and every split of it at a
 * character boundary into two pieces l and r, (l, r) -> m. Used only when
 * every character of every piece is itself a piece: then a character that is
 * not a piece never merges (no piece contains it) and every merge joins two
 * pieces, so the table answers exactly what "is the concatenation a piece"
 * answers. Returns 0, or TKS_ERR_NOMEM.
 */
static int build_pairs(tks_fast *f) {
    f->final_id = malloc(f->n_pieces * sizeof *f->final_id);
    if (!f->final_id) return TKS_ERR_NOMEM;
    size_t off = 0, splits = 0;
    int all_chars = 1;
    for (uint32_t i = 0; i < f->n_pieces; off += f->plen[i], i++) {
        const char *s = f->strs + off;
        hent *e = tab_find(f, s, f->plen[i], fnv(s, f->plen[i]));
        f->final_id[i] = e && e->res_id >= 0 ? e->res_id : (int32_t)i;
        if (!is_normal_type(f->type[i])) continue;
        for (size_t k = 0; k < f->plen[i];) {
            size_t m = one_char_len((uint8_t)s[k]);
            if (m > f->plen[i] - k) m = f->plen[i] - k;
            if (norm_id_of(f, s + k, m) < 0) all_chars = 0;
            k += m;
            splits++;
        }
    }
    for (int b = 0; b < 128; b++) {
        char ch = (char)b;
        f->ascii_id[b] = norm_id_of(f, &ch, 1);
    }
    if (!all_chars) return 0;
    size_t cap = 16;
    while (cap < 2 * splits + 16) cap *= 2;
    f->pair_key = calloc(cap, sizeof *f->pair_key);
    f->pair_val = malloc(cap * sizeof *f->pair_val);
    if (!f->pair_key || !f->pair_val) return TKS_ERR_NOMEM;
    f->pair_mask = cap - 1;
    off = 0;
    for (uint32_t i = 0; i < f->n_pieces; off += f->plen[i], i++) {
        if (!is_normal_type(f->type[i])) continue;
        const char *s = f->strs + off;
        hent *self = tab_find(f, s, f->plen[i], fnv(s, f->plen[i]));
        if (!self || self->norm_id != (int32_t)i) continue; /* a duplicate string */
        size_t k = one_char_len((uint8_t)s[0]);
        while (k < f->plen[i]) {
            int32_t l = norm_id_of(f, s, k), r = norm_id_of(f, s + k, f->plen[i] - k);
            if (l >= 0 && r >= 0) {
                uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
                size_t j = pair_hash(key) & f->pair_mask;
                while (f->pair_key[j] && f->pair_key[j] != key) j = (j + 1) & f->pair_mask;
                f->pair_key[j] = key;
                f->pair_val[j] = (int32_t)i;
            }
            size_t m = one_char_len((uint8_t)s[k]);
            k += m;
        }
    }
    f->use_pairs = 1;
    return 0;
}

/* Byte fallback: the id of each byte's <0xNN> piece, the unknown piece's
 * where there is none. */
static void byte_ids(tks_fast *f) {
    if (!f->byte_fallback) return;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        hent *e = tab_find(f, name, 6, fnv(name, 6));
        /* ModelInterface::PieceToId: reserved map first, then pieces_ */
        f->byte_id[b] = e ? (e->res_id >= 0 ? e->res_id : e->norm_id) : f->unk_id;
    }
}

/* ---------------------------------------------------------------------------
 * The charsmap
 * ------------------------------------------------------------------------- */

/* The precompiled charsmap: <u32 trie bytes><double array><strings>, copied
 * out of the proto. Returns 0 (also when the model has none), 1 with the
 * reason in `why` when it is malformed, or TKS_ERR_NOMEM. */
static int load_charsmap(tks_fast *f, const uint8_t *cmap, size_t cmap_len, char *why,
                         size_t why_len) {
    if (!cmap_len) return 0;
    uint32_t tb = 0;
    if (cmap_len > 4) memcpy(&tb, cmap, 4);
    if (cmap_len <= 4 || tb >= cmap_len - 4 || tb < 4 || tb % 4)
        return set_why(why, why_len, "the precompiled charsmap is malformed");
    f->n_units = tb / 4;
    f->units = malloc(tb);
    f->norm_len = cmap_len - 4 - tb;
    f->norm = malloc(f->norm_len + 1);
    if (!f->units || !f->norm) return TKS_ERR_NOMEM;
    memcpy(f->units, cmap + 4, tb);
    memcpy(f->norm, cmap + 4 + tb, f->norm_len);
    f->norm[f->norm_len] = 0;
    return 0;
}

/*
 * The double array seen as a trie (darts.h): a node is the index its
 * children are found from, the root's being du_offset(units[0]); its edge by
 * byte c is unit node ^ c when that unit is labelled c, and leads to node
 * edge ^ du_offset(units[edge]). A rule (a key) ends with an edge whose unit
 * has a leaf; the value is in the unit of the node the edge leads to.
 */
#define CM_NONE SIZE_MAX

/* The unit of node's edge by byte c, or CM_NONE. */
static size_t cm_edge(const tks_fast *f, size_t node, unsigned c) {
    size_t id = node ^ (size_t)c;
    return id < f->n_units && du_label(f->units[id]) == (uint32_t)c ? id : CM_NONE;
}

static size_t cm_target(const tks_fast *f, size_t edge) { return edge ^ du_offset(f->units[edge]); }

/* Whether node has an edge by some byte in [1, lim). */
static int cm_has_child(const tks_fast *f, size_t node, unsigned lim) {
    for (unsigned c = 1; c < lim; c++)
        if (cm_edge(f, node, c) != CM_NONE) return 1;
    return 0;
}

/* The rule that ends with `edge`: 1 and its replacement, 0 when none ends
 * there, -1 when its value lies outside the array (a corrupt charsmap). */
static int cm_rule(const tks_fast *f, size_t edge, const char **out, size_t *len) {
    if (!du_has_leaf(f->units[edge])) return 0;
    size_t node = cm_target(f, edge);
    if (node >= f->n_units) return -1;
    *out = norm_string(f, du_value(f->units[node]), len);
    return 1;
}

/* The root's edge by byte b, or CM_NONE (also when there is no charsmap). */
static size_t cm_first(const tks_fast *f, uint8_t b) {
    return f->units ? cm_edge(f, du_offset(f->units[0]), b) : CM_NONE;
}

/* Whether byte b normalizes to itself when what follows it starts with a
 * byte below lim (or nothing follows): no rule continues b with such a byte,
 * and a rule for b alone, if any, gives b. */
static int cm_keeps(const tks_fast *f, uint8_t b, unsigned lim) {
    size_t e = cm_first(f, b);
    if (e == CM_NONE) return 1;
    if (cm_has_child(f, cm_target(f, e), lim)) return 0;
    const char *r = "";
    size_t len = 0;
    int k = cm_rule(f, e, &r, &len);
    return k == 0 || (k == 1 && len == 1 && r[0] == (char)b);
}

/*
 * Whether some charsmap key has a space after its first byte: a depth-first
 * walk of the double array (each node's children probed over all 255
 * labels). darts-clone shares common suffixes between keys (its builder
 * makes a DAWG), so nodes are marked when visited; a node position outside
 * the array (a corrupt one) answers yes.
 */
static int charsmap_space_inside(const tks_fast *f) {
    size_t cap = 1024, n = 0;
    size_t *stack = malloc(cap * sizeof *stack);
    uint8_t *seen = calloc(f->n_units, 1);
    int found = !stack || !seen;
    for (int c = 1; c < 256 && !found; c++) { /* first bytes: any label */
        size_t e = cm_first(f, (uint8_t)c);
        if (e != CM_NONE) stack[n++] = cm_target(f, e);
    }
    while (n && !found) {
        size_t node = stack[--n];
        if (node >= f->n_units) {
            found = 1;
            break;
        }
        if (seen[node]) continue;
        seen[node] = 1;
        for (unsigned c = 1; c < 256; c++) {
            size_t e = cm_edge(f, node, c);
            if (e == CM_NONE) continue;
            if (c == ' ') {
                found = 1;
                break;
            }
            if (n == cap) {
                size_t *q = realloc(stack, 2 * cap * sizeof *stack);
                if (!q) {
                    found = 1;
                    break;
                }
                stack = q;
                cap *= 2;
            }
            stack[n++] = cm_target(f, e);
        }
    }
    free(stack);
    free(seen);
    return found;
}

/* every ASCII byte as a NUL-terminated one-byte string (asc_out of a byte
 * that stays itself); read-only, so loads on several threads share it */
static const char ascii_self[128][2] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
    {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31},
    {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47},
    {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63},
    {64}, {65}, {66}, {67}, {68}, {69}, {70}, {71}, {72}, {73}, {74}, {75}, {76}, {77}, {78}, {79},
    {80}, {81}, {82}, {83}, {84}, {85}, {86}, {87}, {88}, {89}, {90}, {91}, {92}, {93}, {94}, {95},
    {96}, {97}, {98}, {99}, {100}, {101}, {102}, {103}, {104}, {105}, {106}, {107}, {108}, {109}, {110}, {111},
    {112}, {113}, {114}, {115}, {116}, {117}, {118}, {119}, {120}, {121}, {122}, {123}, {124}, {125}, {126}, {127},
};

/* The ASCII fast paths of normalization: asc_fixed and asc_out (a byte whose
 * normalization no following byte changes), asc_run (a byte that stays
 * itself before ASCII). */
static void ascii_tables(tks_fast *f) {
    for (int b = 0; b < 128; b++) {
        f->asc_run[b] = b != ' ' && cm_keeps(f, (uint8_t)b, 128);
        size_t e = cm_first(f, (uint8_t)b);
        if (e != CM_NONE && cm_has_child(f, cm_target(f, e), 256))
            continue; /* a longer rule may match: what follows b decides */
        const char *r = "";
        size_t len = 0;
        if (e != CM_NONE && cm_rule(f, e, &r, &len) == 1) {
            f->asc_fixed[b] = len > 255 ? 0 : 2;
            f->asc_out[b] = r;
            f->asc_out_len[b] = (uint8_t)(len > 255 ? 0 : len);
        } else { /* no rule for b: b itself */
            f->asc_fixed[b] = 1;
            f->asc_out[b] = ascii_self[b];
            f->asc_out_len[b] = 1;
        }
    }
}

/* Cuts sentencepiece's input may take (see tks_fast_next_cut): BPE, the
 * default whitespace handling, U+2581 a normal piece, no user-defined
 * symbol with a space, a space that normalizes to itself whatever follows,
 * and no rule with a space after its first byte (a rule spanning the cut). */
static int input_cuts_ok(const tks_fast *f, int user_space) {
    hent *ws = tab_find(f, "\xe2\x96\x81", 3, fnv("\xe2\x96\x81", 3));
    if (!(f->kind == KIND_BPE && f->add_dummy_prefix && f->remove_extra_ws && f->escape_ws &&
          !user_space && ws && ws->norm_id >= 0 && f->type[ws->norm_id] == PT_NORMAL))
        return 0;
    return !f->units || (cm_keeps(f, ' ', 256) && !charsmap_space_inside(f));
}

/* ---------------------------------------------------------------------------
 * The handle
 * ------------------------------------------------------------------------- */

void tks_fast_free(tks_fast *f) {
    if (!f) return;
    tks__fast_caches_free(f);
    free(f->score);
    free(f->type);
    free(f->plen);
    free(f->strs);
    free(f->tab);
    free(f->units);
    free(f->norm);
    free(f->pair_key);
    free(f->pair_val);
    free(f->final_id);
    free(f->edge_key);
    free(f->edge_child);
    free(f->node_id);
    free(f);
}

int tks_fast_load(const uint8_t *buf, size_t n, tks_fast **out, char *why, size_t why_len) {
    *out = NULL;
    if (why && why_len) why[0] = 0;
    model_spec m;
    if (scan_model(buf, n, &m, why, why_len)) return 1;
    tks_fast *f = fast_alloc(&m);
    if (!f) return TKS_ERR_NOMEM;
    user_syms u = {0, 0, ""};
    int rc = read_pieces(f, buf, n, &u, why, why_len);
    if (!rc && f->unk_id < 0) rc = set_why(why, why_len, "the model has no unknown piece");
    if (!rc) {
        unigram_bound(f);
        ascii_cuts(f);
        if (f->kind == KIND_BPE) rc = build_pairs(f);
    }
    if (!rc) {
        byte_ids(f);
        rc = load_charsmap(f, m.cmap, m.cmap_len, why, why_len);
    }
    if (rc) {
        tks_fast_free(f);
        return rc;
    }
    ascii_tables(f);
    f->cut_ok = input_cuts_ok(f, u.space);
    *out = f;
    if (u.seen) {
        /* not exact (the normalizer matches user-defined symbols first), but
         * its cut analysis serves sentencepiece */
        f->seg_only = 1;
        set_why(why, why_len, "%s", u.why);
        return 2;
    }
    return 0;
}

int tks_fast_seg_only(const tks_fast *f) { return f->seg_only; }

size_t tks_fast_next_cut(const tks_fast *f, const char *t, size_t len, size_t from) {
    if (!f->cut_ok) return 0;
    if (from == 0) from = 1;
    for (size_t p = from; p < len; p++) {
        const char *q = memchr(t + p, ' ', len - p);
        if (!q) return 0;
        p = (size_t)(q - t);
        uint8_t b = (uint8_t)t[p - 1];
        if (isalnum_ascii(b) && f->asc_run[b]) return p;
    }
    return 0;
}

uint32_t tks_fast_n_pieces(const tks_fast *f) { return f->n_pieces; }
void tks_fast_set_cache(tks_fast *f, int on) { f->no_cache = !on; }
const char *tks_fast_kind(const tks_fast *f) { return f->kind == KIND_BPE ? "bpe" : "unigram"; }
