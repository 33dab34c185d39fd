/*
 * bpe_cache.c - the compact form of a loaded tokenizer.json or tiktoken
 * ranks file: the handle's tables (each id's bytes, the vocabulary and merge
 * hashes, the added tokens, the pre-tokenizer patterns) written once after a
 * parse and mapped on the next load instead of parsing again. A 128k-id
 * Llama 3 style tokenizer.json (9 MB, 280k merges) takes 0.2 s to parse and
 * build, o200k's ranks 35 ms; their cache files (mostly the hashes' empty
 * slots) map and check in a few milliseconds.
 *
 * Where: $TOKSHARD_CACHE_DIR, else $XDG_CACHE_HOME/tokshard, else
 * $HOME/.cache/tokshard; TOKSHARD_CACHE_DIR=off (or empty) turns it off, and
 * a load with tks_tok_opts.no_cache (the audit against the sources) neither
 * reads nor writes it.
 * One file per tokenizer, bpe-<key>.tkc: for a tokenizer.json the XXH3-128
 * of its bytes (its tks_bpe_fingerprint), for a ranks file the XXH3-128 of
 * the ranks file's XXH3-128, the pattern and the special tokens
 * (bpe_tiktoken.c), everything its tables are made from.
 *
 * Trust: a cache file is used only when it belongs to the user loading it
 * and no one else may write it, and every check passes; else it is ignored
 * and written again from the parse:
 *   - the header: magic, format, this build's identity (TKS_BPE_CACHE_ID:
 *     a hash CMake takes of the sources that make and read the tables, so
 *     another tokshard, or this one changed, never reads it), utf8proc's
 *     version (added tokens are stored NFC-normalized), the key and size
 *     of the file being loaded, and its own checksum;
 *   - the body: its XXH3-64;
 *   - the tables: every section inside the body, every id and offset in
 *     range, the byte offsets increasing.
 * The regexes are compiled again at every load (PCRE2 is not asked to
 * serialize its code); a cache is only ever written by the process that
 * parsed the file, whole (tks_write_file_atomic: a temporary name, then a
 * rename), so readers see an old file or a complete new one.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_pcache.h"

#ifndef TKS_BPE_CACHE_ID
#define TKS_BPE_CACHE_ID "unversioned"
#endif

enum { CACHE_FORMAT = 4, N_SEC = 13 };
static const char cache_magic[8] = {'T', 'K', 'S', 'B', 'P', 'E', 'C', 1};

/* The sections: per-id tables, the two hashes (no merges in rank mode), the
 * added tokens, the patterns, the ids that are no token (rank mode), the
 * seed table of the short tokens (bpe_pcache.h), the compact merge table and
 * its new ids by rank (empty without one). */
enum { S_OFF, S_BYTES, S_SPECIAL, S_VSLOT, S_MSLOT, S_RAW, S_NORM, S_TEXT, S_PAT, S_HOLE, S_SEED, S_MQ, S_R2N };

typedef struct cache_set {
    uint32_t n, one_first_plus1, max_len, pad;
    uint32_t first[257], pad2[3];
} cache_set;

typedef struct cache_split {
    uint32_t how, invert, opts, pad;
    uint64_t pat_off, pat_len; /* within section S_PAT */
} cache_split;

/* The header: the first sizeof(cache_header) bytes; the body follows. */
typedef struct cache_header {
    char magic[8];
    uint32_t format, header_size;
    char build_id[72];        /* TKS_BPE_CACHE_ID, NUL-padded */
    char utf8proc[16];        /* utf8proc_version() */
    uint8_t fingerprint[16];  /* the key (above) */
    uint64_t source_size;     /* the tokenizer.json's or the ranks file's bytes */
    uint64_t body_size, body_xxh3;
    uint32_t mode, n_ids, n_model, nfc, ignore_merges, n_split;
    uint64_t vmask, mmask;
    uint32_t seed_bits, n_merges;
    uint64_t mqmask;          /* 0: no compact merge table */
    uint32_t byte_id[256];
    struct {
        uint64_t off, len;
    } sec[N_SEC];              /* within the body, 64-byte aligned */
    cache_split split[TKS__BPE_MAX_SPLITS];
    cache_set raw, norm;
    uint64_t header_xxh3;      /* of every byte above */
} cache_header;

/* The cache directory into dir[cap]; 0 when caching is off or the path is
 * too long. */
static int cache_dir(char *dir, size_t cap) {
    const char *d = getenv("TOKSHARD_CACHE_DIR");
    int n;
    if (d) {
        if (!*d || !strcmp(d, "off")) return 0;
        n = snprintf(dir, cap, "%s", d);
    } else if ((d = getenv("XDG_CACHE_HOME")) && *d) {
        n = snprintf(dir, cap, "%s/tokshard", d);
    } else if ((d = getenv("HOME")) && *d) {
        n = snprintf(dir, cap, "%s/.cache/tokshard", d);
    } else {
        return 0;
    }
    return n > 0 && (size_t)n < cap;
}

/* The cache directory into dir[4096] and the file of fingerprint fp into
 * path[cap]; 0 when caching is off or a path is too long. */
static int cache_path(const uint8_t fp[16], char dir[4096], char *path, size_t cap) {
    char hex[33];
    if (!cache_dir(dir, 4096)) return 0;
    tks_hex(fp, 16, hex);
    int n = snprintf(path, cap, "%s/bpe-%s.tkc", dir, hex);
    return n > 0 && (size_t)n < cap;
}

static void header_ids(cache_header *h) {
    memcpy(h->magic, cache_magic, sizeof h->magic);
    h->format = CACHE_FORMAT;
    h->header_size = (uint32_t)sizeof *h;
    snprintf(h->build_id, sizeof h->build_id, "%s", TKS_BPE_CACHE_ID);
    snprintf(h->utf8proc, sizeof h->utf8proc, "%s", utf8proc_version());
}

static void set_out(cache_set *c, const tks__bpe_added_set *s) {
    c->n = (uint32_t)s->n;
    c->one_first_plus1 = (uint32_t)(s->one_first + 1);
    c->max_len = s->max_len;
    memcpy(c->first, s->first, sizeof c->first);
}

void tks__bpe_cache_store(const tks_bpe *b, const uint8_t key[16], size_t source_size) {
    char dir[4096], path[4200];
    if (b->cache_map || b->no_cache || !cache_path(key, dir, path, sizeof path)) return;
    cache_header *h = calloc(1, sizeof *h);
    if (!h) return;
    header_ids(h);
    memcpy(h->fingerprint, key, 16);
    h->source_size = source_size;
    h->mode = (uint32_t)b->mode;
    h->n_ids = b->n_ids;
    h->n_model = b->n_model;
    h->nfc = (uint32_t)b->nfc;
    h->ignore_merges = (uint32_t)b->ignore_merges;
    h->n_split = (uint32_t)b->n_split;
    h->vmask = b->vmask;
    h->seed_bits = b->seed_bits;
    h->n_merges = b->mq ? b->n_merges : 0;
    h->mqmask = b->mq ? b->mqmask : 0;
    memcpy(h->byte_id, b->byte_id, sizeof h->byte_id);
    set_out(&h->raw, &b->added_raw);
    set_out(&h->norm, &b->added_norm);
    size_t text_len = 0;
    for (size_t i = 0; i < b->added_raw.n; i++) text_len += b->added_raw.tok[i].len;
    for (size_t i = 0; i < b->added_norm.n; i++) text_len += b->added_norm.tok[i].len;
    size_t pat_len = 0;
    for (int i = 0; i < b->n_split; i++) {
        const tks__bpe_splitter *sp = &b->split[i];
        h->split[i] = (cache_split){(uint32_t)sp->how, (uint32_t)sp->invert, sp->opts, 0, pat_len, sp->pat_len};
        pat_len += sp->pat_len;
    }
    char *pats = malloc(pat_len ? pat_len : 1);
    if (!pats) {
        free(h);
        return;
    }
    for (int i = 0; i < b->n_split; i++) memcpy(pats + h->split[i].pat_off, b->split[i].pat, b->split[i].pat_len);
    int merges = b->mode == TKS__BPE_MERGES;
    const void *data[N_SEC] = {b->off, b->bytes, b->special, b->vslot, b->mslot, b->added_raw.tok,
                               b->added_norm.tok, b->added_text, pats, b->hole, b->seed, b->mq, b->r2n};
    size_t len[N_SEC] = {((size_t)b->n_ids + 1) * sizeof *b->off, b->off[b->n_ids], b->n_ids,
                         (b->vmask + 1) * sizeof *b->vslot, merges ? (b->mmask + 1) * sizeof *b->mslot : 0,
                         b->added_raw.n * sizeof *b->added_raw.tok, b->added_norm.n * sizeof *b->added_norm.tok,
                         text_len, pat_len, b->hole ? b->n_ids : 0, ((size_t)2 << b->seed_bits) * sizeof(pslot),
                         b->mq ? (b->mqmask + 1) * sizeof *b->mq : 0, b->mq ? (size_t)b->n_merges * sizeof *b->r2n : 0};
    h->mmask = merges ? b->mmask : 0;
    /* header, then each section at a 64-byte boundary (zero padding between) */
    static const char zeros[64];
    tks_piece pc[1 + 2 * N_SEC];
    size_t np = 0, at = 0;
    pc[np++] = (tks_piece){h, sizeof *h};
    XXH3_state_t *x = XXH3_createState();
    if (!x) {
        free(pats);
        free(h);
        return;
    }
    XXH3_64bits_reset(x);
    for (int s = 0; s < N_SEC; s++) {
        size_t pad = (64 - at % 64) % 64;
        if (pad) {
            pc[np++] = (tks_piece){zeros, pad};
            XXH3_64bits_update(x, zeros, pad);
            at += pad;
        }
        h->sec[s].off = at;
        h->sec[s].len = len[s];
        if (len[s]) {
            pc[np++] = (tks_piece){data[s], len[s]};
            XXH3_64bits_update(x, data[s], len[s]);
        }
        at += len[s];
    }
    h->body_size = at;
    h->body_xxh3 = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    h->header_xxh3 = XXH3_64bits(h, offsetof(cache_header, header_xxh3));
    /* a cache that cannot be written costs the next load a parse, nothing more */
    tks_error keep = *tks_last_error();
    if (tks_mkdir_p(dir) || tks_write_file_pieces(path, pc, np)) tks_error_restore(&keep);
    free(pats);
    free(h);
}

/* The checks of a mapped cache file against the tokenizer.json being
 * loaded; 1 when it may be used. */
static int cache_valid(const uint8_t *m, size_t size, const uint8_t fp[16], size_t source_size) {
    if (size < sizeof(cache_header)) return 0;
    const cache_header *h = (const cache_header *)m;
    cache_header want;
    memset(&want, 0, sizeof want);
    header_ids(&want);
    if (memcmp(h->magic, want.magic, 8) || h->format != want.format || h->header_size != want.header_size ||
        memcmp(h->build_id, want.build_id, sizeof want.build_id) ||
        memcmp(h->utf8proc, want.utf8proc, sizeof want.utf8proc) || memcmp(h->fingerprint, fp, 16) ||
        h->source_size != source_size || h->header_xxh3 != XXH3_64bits(h, offsetof(cache_header, header_xxh3)) ||
        h->body_size != size - sizeof *h)
        return 0;
    const uint8_t *body = m + sizeof *h;
    if (XXH3_64bits(body, h->body_size) != h->body_xxh3) return 0;
    /* the tables, as the encoder will read them */
    uint64_t n = h->n_ids;
    int merges = h->mode == TKS__BPE_MERGES;
    if ((!merges && h->mode != TKS__BPE_RANKS) || !n || h->n_model > n || h->n_split < 1 ||
        h->n_split > TKS__BPE_MAX_SPLITS || h->vmask > (1ull << 40) || (h->vmask & (h->vmask + 1)) ||
        h->mmask > (1ull << 40) || (h->mmask & (h->mmask + 1)) || (!merges && h->mmask) || h->seed_bits < 1 ||
        h->seed_bits > 40)
        return 0;
    uint64_t need[N_SEC] = {(n + 1) * 8, 0, n, (h->vmask + 1) * sizeof(tks__bpe_vslot),
                            merges ? (h->mmask + 1) * sizeof(tks__bpe_merge) : 0,
                            (uint64_t)h->raw.n * sizeof(tks__bpe_added), (uint64_t)h->norm.n * sizeof(tks__bpe_added),
                            0, 0, 0, ((uint64_t)2 << h->seed_bits) * sizeof(pslot),
                            h->mqmask ? (h->mqmask + 1) * 8 : 0, h->mqmask ? (uint64_t)h->n_merges * 4 : 0};
    for (int s = 0; s < N_SEC; s++) {
        if (h->sec[s].off % 64 || h->sec[s].off > h->body_size || h->sec[s].len > h->body_size - h->sec[s].off)
            return 0;
        if (s == S_HOLE ? h->sec[s].len != 0 && h->sec[s].len != n
                        : s != S_BYTES && s != S_TEXT && s != S_PAT && h->sec[s].len != need[s])
            return 0;
    }
    const uint64_t *off = (const uint64_t *)(body + h->sec[S_OFF].off);
    if (off[0] != 0 || off[n] != h->sec[S_BYTES].len) return 0;
    for (uint64_t i = 0; i < n; i++)
        if (off[i + 1] < off[i]) return 0;
    for (int c = 0; c < 256; c++)
        if (h->byte_id[c] != TKS_NO_ID && h->byte_id[c] >= n) return 0;
    const tks__bpe_vslot *vs = (const tks__bpe_vslot *)(body + h->sec[S_VSLOT].off);
    for (uint64_t i = 0; i <= h->vmask; i++)
        if (vs[i].id != TKS_NO_ID && (vs[i].id >= h->n_model || vs[i].len != off[vs[i].id + 1] - off[vs[i].id]))
            return 0;
    const tks__bpe_merge *ms = (const tks__bpe_merge *)(body + h->sec[S_MSLOT].off);
    for (uint64_t i = 0; merges && i <= h->mmask; i++)
        if (ms[i].key && (ms[i].new_id >= n || ((ms[i].key - 1) >> 32) >= n || ((ms[i].key - 1) & 0xffffffffu) >= n))
            return 0;
    if (h->mqmask && (!merges || (h->mqmask & (h->mqmask + 1)) || h->mqmask > (1ull << 40) || !h->n_merges ||
                      h->n_merges >= (1u << 24) - 1 || n > (1u << 20)))
        return 0;
    const uint64_t *mq = (const uint64_t *)(body + h->sec[S_MQ].off);
    const uint32_t *r2n = (const uint32_t *)(body + h->sec[S_R2N].off);
    for (uint64_t i = 0; h->mqmask && i <= h->mqmask; i++)
        if (mq[i] && ((mq[i] >> 44) >= n || ((mq[i] >> 24) & 0xfffffu) >= n || (mq[i] & 0xffffffu) > h->n_merges))
            return 0;
    for (uint32_t i = 0; h->mqmask && i < h->n_merges; i++)
        if (r2n[i] >= n) return 0;
    const pslot *sd = (const pslot *)(body + h->sec[S_SEED].off);
    for (uint64_t i = 0; i < (uint64_t)2 << h->seed_bits; i++) {
        unsigned len = (unsigned)(sd[i].hi >> 56);
        if (!sd[i].lo && !sd[i].hi) continue;
        if (len < 1 || len > PKEY_MAX || sd[i].n < 1 || sd[i].n > PSLOT_IDS) return 0;
        for (uint32_t j = 0; j < sd[i].n; j++)
            if (sd[i].id[j] >= n) return 0;
    }
    const cache_set *sets[2] = {&h->raw, &h->norm};
    for (int k = 0; k < 2; k++) {
        const cache_set *cs = sets[k];
        const tks__bpe_added *a = (const tks__bpe_added *)(body + h->sec[k ? S_NORM : S_RAW].off);
        if (cs->first[0] != 0 || cs->first[256] != cs->n || cs->one_first_plus1 > 256) return 0;
        for (int c = 0; c < 256; c++)
            if (cs->first[c + 1] < cs->first[c]) return 0;
        for (uint32_t i = 0; i < cs->n; i++)
            if (a[i].id >= n || !a[i].len || a[i].len > cs->max_len || a[i].off > h->sec[S_TEXT].len ||
                a[i].len > h->sec[S_TEXT].len - a[i].off)
                return 0;
    }
    for (uint32_t i = 0; i < h->n_split; i++)
        if (h->split[i].how > B_CONTIGUOUS || h->split[i].pat_off > h->sec[S_PAT].len ||
            h->split[i].pat_len > h->sec[S_PAT].len - h->split[i].pat_off)
            return 0;
    return 1;
}

static void set_in(tks__bpe_added_set *s, const cache_set *c, const uint8_t *p) {
    s->tok = (tks__bpe_added *)p;
    s->n = c->n;
    s->one_first = (int)c->one_first_plus1 - 1;
    s->max_len = c->max_len;
    memcpy(s->first, c->first, sizeof s->first);
}

int tks__bpe_cache_load(tks_bpe *b, const uint8_t fp[16], size_t source_size) {
    char dir[4096], path[4200];
    if (b->no_cache || !cache_path(fp, dir, path, sizeof path)) return 1;
    /* only a file of this user's that no one else may write: the tables
     * decide every id, and another user's file would be trusted otherwise */
    struct stat st;
    if (stat(path, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) return 1;
    const uint8_t *m;
    size_t size;
    tks_error keep = *tks_last_error();
    if (tks_map_file(path, "tokenizer cache", &m, &size)) {
        tks_error_restore(&keep); /* no cache file: not an error */
        return 1;
    }
    if (!cache_valid(m, size, fp, source_size)) {
        tks_unmap(m, size);
        return 1;
    }
    const cache_header *h = (const cache_header *)m;
    uint8_t *body = (uint8_t *)m + sizeof *h;
    memcpy(b->fingerprint, fp, 16);
    b->mode = (tks__bpe_mode)h->mode;
    b->n_ids = h->n_ids;
    b->n_model = h->n_model;
    b->nfc = (int)h->nfc;
    b->ignore_merges = (int)h->ignore_merges;
    b->vmask = h->vmask;
    b->mmask = h->mmask;
    memcpy(b->byte_id, h->byte_id, sizeof b->byte_id);
    b->off = (uint64_t *)(body + h->sec[S_OFF].off);
    b->bytes = (char *)(body + h->sec[S_BYTES].off);
    b->special = body + h->sec[S_SPECIAL].off;
    b->vslot = (tks__bpe_vslot *)(body + h->sec[S_VSLOT].off);
    b->mslot = h->mode == TKS__BPE_MERGES ? (tks__bpe_merge *)(body + h->sec[S_MSLOT].off) : NULL;
    b->seed = (pslot *)(body + h->sec[S_SEED].off); /* (copied onto 2 MiB pages: no faster) */
    b->seed_bits = h->seed_bits;
    b->mq = h->mqmask ? (uint64_t *)(body + h->sec[S_MQ].off) : NULL;
    b->mqmask = h->mqmask;
    b->r2n = h->mqmask ? (uint32_t *)(body + h->sec[S_R2N].off) : NULL;
    b->n_merges = h->mqmask ? h->n_merges : 0;
    set_in(&b->added_raw, &h->raw, body + h->sec[S_RAW].off);
    set_in(&b->added_norm, &h->norm, body + h->sec[S_NORM].off);
    b->added_text = (char *)(body + h->sec[S_TEXT].off);
    b->cache_map = m;
    b->cache_len = size;
    /* the holes are the handle's own (tks_bpe_free frees them either way) */
    if (h->sec[S_HOLE].len && !(b->hole = malloc(h->sec[S_HOLE].len))) return tks__bpe_nomem(b, "holes");
    if (h->sec[S_HOLE].len) memcpy(b->hole, body + h->sec[S_HOLE].off, h->sec[S_HOLE].len);
    const char *pats = (const char *)(body + h->sec[S_PAT].off);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < h->n_split; i++) {
        const cache_split *cs = &h->split[i];
        rc = tks__bpe_compile_opts(b, pats + cs->pat_off, cs->pat_len, cs->opts, "cached pre-tokenizer");
        if (!rc) b->split[i].how = (tks__bpe_behavior)cs->how, b->split[i].invert = (int)cs->invert;
    }
    if (!rc) rc = tks__bpe_finish_cached(b);
    return rc;
}
