/* fastenc_internal.h - private to the fast encoder: the loaded model, shared
 * by the loader (fastenc_load.c: protobuf, tables, charsmap, cut analysis)
 * and the encoder (fastenc.c: per-thread cache, BPE, unigram,
 * normalization). Not an API. The helpers below are on the encoder's hot
 * path and are static, not static inline, so that the compiler inlines them
 * by its own measure (fnv and tab_find stay out of line, which keeps the
 * encoding loops small); both files call every one of them. */
#ifndef TKS_TOKENIZER_FASTENC_INTERNAL_H
#define TKS_TOKENIZER_FASTENC_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer/fastenc.h"
#include "tokenizer/tls_pool.h"

/* sentencepiece_model.proto, ModelProto.SentencePiece.Type */
enum { PT_NORMAL = 1, PT_UNKNOWN = 2, PT_CONTROL = 3, PT_USER = 4, PT_UNUSED = 5, PT_BYTE = 6 };
enum { KIND_UNIGRAM = 1, KIND_BPE = 2 };

/* unigram_model.cc: kUnkPenalty */
#define UNK_PENALTY 10.0f

/* One string of the piece table: a piece, or a byte prefix of a piece. */
typedef struct hent {
    uint64_t hash;
    uint32_t off, len;  /* bytes in f->strs */
    int32_t norm_id;    /* id in sentencepiece's pieces_ (NORMAL, USER_DEFINED, UNUSED), or -1 */
    int32_t res_id;     /* id in reserved_id_map_ (UNKNOWN, CONTROL, BYTE), or -1 */
} hent;

typedef struct tls_cache tls_cache;

struct tks_fast {
    int kind;
    uint32_t n_pieces;
    float *score;        /* (V) */
    uint8_t *type;       /* (V) */
    uint32_t *plen;      /* (V) byte length of each piece */
    char *strs;          /* piece bytes, concatenated */
    size_t strs_len;
    hent *tab;           /* open addressing, n_tab slots (power of two), empty: len == UINT32_MAX */
    size_t n_tab;
    int32_t unk_id;
    int32_t byte_id[256];
    int byte_fallback;
    int no_cache;        /* benchmarks: encode every word (the miss path) */
    int seg_only;        /* user-defined symbols: only tks_fast_next_cut may be used */
    int cut_ok;          /* tks_fast_next_cut may cut this model's input */
    float min_score;     /* over NORMAL pieces (unigram) */
    double uni_smax;     /* largest |score| of a lattice node (unigram cache bound, fastenc.c) */
    /* normalizer */
    int add_dummy_prefix, remove_extra_ws, escape_ws;
    uint32_t *units;     /* darts-clone double array, NULL = no charsmap */
    size_t n_units;
    char *norm;          /* NUL-separated replacement strings */
    size_t norm_len;
    uint8_t asc_fixed[128];     /* non-zero: byte b alone decides its normalization
                                 * (1: b itself, 2: a charsmap rule) */
    const char *asc_out[128];   /* its replacement (NUL-terminated) */
    uint8_t asc_out_len[128];
    uint8_t asc_run[128];       /* 1: byte b, followed by an ASCII byte or the end, stays b */
    uint8_t asc_cut[128][128];  /* 1: words may also be cut between ASCII a and b */
    /* BPE: merges as (left id, right id) -> merged id, when every character
     * of every piece is itself a piece (else pairs are looked up as strings) */
    int use_pairs;
    uint64_t *pair_key;  /* ((uint64_t)l << 32 | r) + 1; 0 = empty */
    int32_t *pair_val;
    size_t pair_mask;
    int32_t *final_id;   /* (V) ModelInterface::PieceToId of piece i's string */
    int32_t ascii_id[128]; /* pieces_ id of each ASCII character, or -1 */
    /* unigram: a byte trie over the pieces, edges in a hash table */
    uint64_t *edge_key;  /* (parent << 8 | byte) + 1; 0 = empty slot */
    uint32_t *edge_child;
    size_t edge_mask;
    int32_t *node_id;    /* piece id ending at each node, or -1 */
    size_t n_nodes;
    tks__tls_pool caches; /* per-thread caches (fastenc.c), freed with the handle */
};

/* fastenc.c: the per-thread caches' pool, made with the handle (0, or
 * TKS_ERR_NOMEM with nothing to free), and freed with it together with
 * every cache made since. */
int tks__fast_caches_init(tks_fast *f);
void tks__fast_caches_free(tks_fast *f);

/* A hash of short strings, 8 bytes at a time (multipliers from splitmix64,
 * Steele et al., "Fast splittable pseudorandom number generators", 2014). */
static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        for (size_t i = 0; i < n; i++) w |= (uint64_t)(uint8_t)s[i] << (8 * i);
        h = (h ^ w) * 0x94d049bb133111ebull;
    }
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 29);
}

/* Slots of the unigram trie's edge table and of the BPE pair table. */
static size_t edge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}
static uint64_t pair_hash(uint64_t key) { return key * 0x9E3779B97F4A7C15ull >> 17; }

static hent *tab_find(const tks_fast *f, const char *s, size_t n, uint64_t h) {
    size_t mask = f->n_tab - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        hent *e = &f->tab[i];
        if (e->len == UINT32_MAX) return NULL;
        if (e->hash == h && e->len == n && !memcmp(f->strs + e->off, s, n)) return e;
    }
}

static int32_t norm_id_of(const tks_fast *f, const char *s, size_t n) {
    hent *e = tab_find(f, s, n, fnv(s, n));
    return e ? e->norm_id : -1;
}

/* string_util::OneCharLen */
static size_t one_char_len(uint8_t b) { return (size_t)"\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[b >> 4]; }

static int is_ws_sym(const char *s, size_t n) {
    return n >= 3 && (uint8_t)s[0] == 0xE2 && (uint8_t)s[1] == 0x96 && (uint8_t)s[2] == 0x81;
}

/* darts-clone unit accessors (darts.h DoubleArrayUnit) */
static uint32_t du_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t du_value(uint32_t u) { return u & 0x7fffffffu; }
static uint32_t du_label(uint32_t u) { return u & 0x800000ffu; }
static uint32_t du_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* The charsmap's replacement string at `value` (an offset in f->norm). */
static const char *norm_string(const tks_fast *f, uint32_t value, size_t *len) {
    if (value >= f->norm_len) {
        *len = 0;
        return "";
    }
    const char *s = f->norm + value;
    const char *z = memchr(s, 0, f->norm_len - value);
    *len = z ? (size_t)(z - s) : f->norm_len - value;
    return s;
}

#endif
