/*
 * bpe_internal.h - private to the byte-level BPE tokenizer: the loaded
 * handle shared by its two loaders (bpe_load.c: a Hugging Face
 * tokenizer.json; bpe_tiktoken.c: a tiktoken ranks file with a pattern) and
 * the encoder (bpe.c). Nothing outside tokenizer/bpe*.c includes it.
 */
#ifndef TKS_BPE_INTERNAL_H
#define TKS_BPE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tls_pool.h"
#include "tokenizer/tokenizer.h"

enum { TKS__BPE_MAX_SPLITS = 8 };

/* tokenizers' SplitDelimiterBehavior */
typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } tks__bpe_behavior;

typedef struct tks__bpe_splitter {
    pcre2_code *re;
    tks__bpe_behavior how;
    int invert;
    int fast;  /* the hand matcher of this pattern (bpe_pretok.c), or TKS__FAST_NONE */
    char text[120]; /* the pattern's first bytes, for messages */
    char *pat;      /* the whole pattern (pat_len bytes) and PCRE2's compile options, for the cache */
    size_t pat_len;
    uint32_t opts;
} tks__bpe_splitter;

/* The patterns bpe_pretok.c matches by hand. */
enum { TKS__FAST_NONE, TKS__FAST_GPT2, TKS__FAST_LLAMA3, TKS__FAST_QWEN2, TKS__FAST_CL100K, TKS__FAST_O200K };

typedef struct tks__bpe_merge {
    uint64_t key; /* (left id << 32 | right id) + 1; 0: empty */
    uint32_t rank, new_id;
} tks__bpe_merge;

/* How two adjacent symbols merge. */
typedef enum {
    TKS__BPE_MERGES, /* tokenizer.json: a listed merge (left, right) -> new id, by its rank */
    TKS__BPE_RANKS   /* tiktoken: whenever the concatenated bytes are a token, by that token's
                      * rank (its id); a piece that is a token is that token */
} tks__bpe_mode;

/* An added token as the text matcher sees it. */
typedef struct tks__bpe_added {
    uint64_t off;     /* its bytes in tks_bpe.added_text (normalized when matched normalized) */
    uint32_t len, id;
    uint8_t special;  /* matched only with tks_bpe_set_allow_special */
    uint8_t unsupported; /* lstrip, rstrip or single_word: matching it is refused */
} tks__bpe_added;

/* Added tokens matched in the text, leftmost-longest (tokenizers'
 * AddedVocabulary: a daachorse automaton with MatchKind::LeftmostLongest). */
typedef struct tks__bpe_added_set {
    tks__bpe_added *tok; /* (n): by first byte, longest first */
    size_t n;
    uint32_t first[257]; /* tok[first[c] .. first[c + 1]) start with byte c */
    int one_first;       /* the first byte every token shares, or -1 */
    uint32_t max_len;    /* the longest token's bytes (0: none) */
} tks__bpe_added_set;

typedef struct tks__bpe_scratch tks__bpe_scratch;
typedef struct tks__bpe_pslot tks__bpe_pslot; /* bpe_pcache.h */

/* A slot of the vocab hash: the token's first 8 bytes (zero after its
 * end), so that a token of up to 8 bytes is found with one cache line. */
typedef struct tks__bpe_vslot {
    uint64_t head;
    uint32_t id;   /* TKS_NO_ID: empty */
    uint32_t len;
} tks__bpe_vslot;

struct tks_bpe {
    char *path;
    uint8_t fingerprint[16];
    tks__bpe_mode mode;
    uint32_t n_ids;       /* every id is < n_ids */
    uint32_t n_model;     /* ids of the BPE model's vocab (tokenizer.json) */
    /* per id: the bytes it decodes to, in `bytes` */
    uint64_t *off;        /* (n_ids + 1) */
    char *bytes;
    uint8_t *special;     /* (n_ids): 1 for an added token marked special */
    uint8_t *hole;        /* (n_ids) or NULL: 1 for an id that is no token (tiktoken's gaps
                           * between the ranks and the special tokens) */
    uint32_t byte_id[256];/* the one-byte token of each byte, or TKS_NO_ID */
    tks__bpe_vslot *vslot;/* hash of the mergeable tokens' bytes (vmask + 1 slots) */
    size_t vmask;
    uint8_t *self;        /* (n_model), merges mode: 1 when BPE of a token's own bytes gives
                           * that token, 2 when not, 0 not known yet; learnt while encoding,
                           * written and read with relaxed atomics (every writer writes the
                           * same value) */
    uint64_t *pair1;      /* (65536) or NULL (a byte without a token of its own): the rank
                           * and new id of the pair of the one-byte tokens of bytes x, y at
                           * [x << 8 | y], as the pair lookup gives them, plus 2 (so 1: no
                           * merge; 0: not known yet); learnt while encoding, with relaxed
                           * atomics like self */
    tks__bpe_pslot *seed; /* 2 << seed_bits slots, or NULL: the short tokens with the ids BPE gives
                           * their bytes (bpe_pcache.h, bpe_seed.c) */
    unsigned seed_bits;
    tks__bpe_merge *mslot;/* TKS__BPE_MERGES: the merges */
    size_t mmask;
    uint64_t *mq;         /* or NULL: the merges again, one 8-byte slot each, for the encoder
                           * (bpe_build.c: tks__bpe_mq_build): (left id << mq_id | right id) <<
                           * mq_p | (priority + 1), 0 empty; the priority, new id << mq_sub | the
                           * merge's place among those of its new id, orders the merges as
                           * their ranks do */
    size_t mqmask;
    unsigned mq_id, mq_sub, mq_p;
    int ignore_merges;    /* a piece that is a token is that token (always for tiktoken) */
    int nfc;
    tks__bpe_splitter split[TKS__BPE_MAX_SPLITS];
    int n_split;
    /* added tokens: matched on the raw text, then on the normalized pieces */
    tks__bpe_added_set added_raw, added_norm;
    char *added_text;
    int allow_special;    /* tks_bpe_set_allow_special */
    /* tiktoken: what the descriptor records (bpe_tiktoken.c) */
    char *tt_pattern;     /* the regex */
    char *tt_pattern_name;/* a named pattern, or NULL */
    char *tt_ranks;       /* the ranks file's path */
    uint8_t tt_ranks_xxh3[16];
    char *tt_bos, *tt_eos, *tt_pad; /* special tokens' contents, or NULL */
    int word_cache;       /* tks_bpe_set_word_cache (on by default) */
    int fast;             /* the one splitter's hand matcher, used for text within the BMP; or
                           * TKS__FAST_NONE: PCRE2 for everything */
    tks__tls_pool scratch;/* every thread's scratch (bpe_scratch.c) */
    /* loaded from the cache (bpe_cache.c): off, bytes, special, vslot, mslot,
     * the added sets' tok and added_text point into this read-only mapping */
    const uint8_t *cache_map;
    size_t cache_len;
    int no_cache;         /* parsed from its file: the tokenizer cache neither read nor written
                           * (tks_tok_opts.no_cache) */
    char cache_note[1408]; /* why the cache directory was left unused, or "" (tks_bpe_cache_note) */
};

/* bpe_patterns.c: tokenizers' ByteLevel regex (pre_tokenizers/byte_level.rs),
 * GPT-2's; the special tokens ("TEXT=ID,...") of a named tiktoken encoding
 * (tks_tiktoken_pattern, tokenizer.h, gives its pattern), or NULL. */
extern const char tks__bpe_gpt2_pattern[];
const char *tks__bpe_named_specials(const char *name);

/* bpe_build.c, what both loaders call. The code point GPT-2's byte-to-unicode table gives byte b (openai/gpt-2
 * encoder.py, bytes_to_unicode). */
uint32_t tks__bpe_byte_char(unsigned b);
size_t tks__bpe_pow2(size_t n); /* the least power of two >= n, at least 16 */

/* The first min(n, 8) bytes of s, zero-padded, as memcpy into a zeroed
 * uint64_t gives them: a vocabulary slot's check, a word-cache key's
 * words. Read with at most two loads of fixed size: bytes stored one by one
 * into a stack word and read back as one word stall the load (the store
 * cannot be forwarded), which cost a third of every vocabulary lookup. */
static inline uint64_t tks__bpe_head8(const char *s, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    uint32_t a, b;
    uint16_t c, d;
    if (n >= 8) return memcpy(&v, s, 8), v;
    if (n >= 4) { /* bytes 0-3 and n-4 .. n-1: they overlap with equal values */
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        return a | (uint64_t)b << (8 * (n - 4));
    }
    if (n >= 2) {
        memcpy(&c, s, 2);
        memcpy(&d, s + n - 2, 2);
        return c | (uint64_t)d << (8 * (n - 2));
    }
    return n ? (uint8_t)s[0] : 0;
#else
    uint64_t h = 0;
    memcpy(&h, s, n < 8 ? n : 8);
    return h;
#endif
}


/* TKS_ERR_TOKENIZER naming b->path and the formatted reason. */
int tks__bpe_refuse(const tks_bpe *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tks__bpe_nomem(const tks_bpe *b, const char *what);

/* A new handle for `path` (its fingerprint unset), or NULL (out of memory). */
tks_bpe *tks__bpe_new(const char *path);
/* Compiles a pre-tokenizer regex (literal: a plain string) as the next
 * splitter, isolated; `extra` adds PCRE2 options (PCRE2_DOLLAR_ENDONLY for
 * tiktoken's Rust regexes). Refuses patterns that may match the empty
 * string and escapes Oniguruma reads otherwise. */
int tks__bpe_compile(tks_bpe *b, const char *pat, size_t n, int literal, uint32_t extra, const char *where);
/* The compile step of tks__bpe_compile, with PCRE2 options `opts` (what it
 * chose), no refusal checks: for a pattern the cache kept. */
int tks__bpe_compile_opts(tks_bpe *b, const char *pat, size_t n, uint32_t opts, const char *where);
/* Adds an added token (content[0..len), id) to the matcher of raw or
 * normalized text; the sets are sorted by tks__bpe_finish. */
int tks__bpe_add_token(tks_bpe *b, const char *content, size_t len, uint32_t id, int special, int normalized,
                       int unsupported);
/* The hash of the mergeable tokens (ids [0, n) with usable[id], or all when
 * usable is NULL), the added-token matchers and the per-thread scratch:
 * the last step of either loader. */
int tks__bpe_finish(tks_bpe *b, uint32_t n, const uint8_t *usable);
/* bpe_build.c: the compact merge table of a handle with merges (b->mq), when
 * its merges' ranks order them as (new id, place among the merges of that
 * id) does and the fields fit 64 bits. 0, or TKS_ERR_NOMEM. */
int tks__bpe_mq_build(tks_bpe *b);
/* bpe_seed.c: the seed table of a handle whose vocabulary and merge tables
 * are built (bpe_pcache.h): 0, or TKS_ERR_NOMEM. */
int tks__bpe_seed_build(tks_bpe *b);
/* The last steps of tks__bpe_finish for a handle whose tables came from the
 * cache: the learnt-merge flags, the scratch, the hand matcher. */
int tks__bpe_finish_cached(tks_bpe *b);

/* bpe_cache.c: the compact form of a loaded handle (a tokenizer.json's or
 * a ranks file's), named by a key of 16 bytes that covers everything its
 * tables are made from. _load fills the new handle b from the cache file of
 * that key (the file being loaded has source_size bytes): 0 when it did (b
 * is complete but for what the caller sets itself: a ranks file's tt_*
 * fields and the fingerprint), 1 when there is no usable cache file (b
 * untouched but for b->cache_note), or an error (b must be freed). _store
 * writes b's cache file under the key; failures leave no file and no error.
 * Either sets b->cache_note when the cache directory or its key is refused. */
int tks__bpe_cache_load(tks_bpe *b, const uint8_t key[16], size_t source_size);
void tks__bpe_cache_store(tks_bpe *b, const uint8_t key[16], size_t source_size);

/* bpe_pretok.c: the hand matchers. tks__bpe_fast_program: the matcher of a
 * pattern text (TKS__FAST_NONE for any other); tks__bpe_fast_init: builds
 * the class tables from PCRE2 once per process (0, or TKS_ERR_NOMEM /
 * TKS_ERR_TOKENIZER: then PCRE2 is used); tks__bpe_fast_bmp: 1 when the
 * UTF-8 text has no code point above U+FFFF (the tables' range);
 * tks__bpe_fast_next: where the piece that starts at byte i of t[0..n)
 * ends (> i), as PCRE2 would match the pattern there. */
int tks__bpe_fast_program(const char *pattern);
/* bpe_pretok.c: whether the Unicode of PCRE2's tables leaves a code point
 * unassigned (\p{Cn}, noncharacters left out; its version:
 * tks_bpe_unicode_version, tokenizer.h). _table: per code point (0 to
 * U+10FFFF) 2 unassigned, 1 assigned, 0 not known yet (read it with a
 * relaxed atomic load); NULL when out of memory. _learn: the value of code
 * point cp, whose UTF-8 is utf8[0..k), found with PCRE2 and written into
 * the table (called when the table has 0 there). */
uint8_t *tks__bpe_unassigned_table(void);
int tks__bpe_unassigned_learn(uint32_t cp, const char *utf8, size_t k);
int tks__bpe_fast_init(void);
/* bpe_pretok.c: 1 when PCRE2's classes of the ASCII bytes are those the bit
 * masks take (built by tks__bpe_fast_init). */
int tks__bpe_masks_ok(void);
size_t tks__bpe_fast_bmp(const char *t, size_t n);
size_t tks__bpe_fast_next(int prog, const char *t, size_t n, size_t i);
/* bpe_pretok_win.c: the ends of the pieces from byte i of t[0..n) (i < n)
 * into ends[0..cap), cap >= 1, as tks__bpe_fast_next gives them one by one:
 * how many were written (the last is where to go on; n once the text is
 * cut). Whole windows of ASCII text are cut with bit masks;
 * tks__bpe_fast_ends_scalar (bpe_pretok.c) cuts the rest, a piece at a time
 * from i while i < until, and is the windows' reference. */
size_t tks__bpe_fast_ends(int prog, const char *t, size_t n, size_t i, size_t *ends, size_t cap);
size_t tks__bpe_fast_ends_scalar(int prog, const char *t, size_t n, size_t i, size_t *ends, size_t cap,
                                 size_t until);

/* The per-thread scratch's pool (bpe_scratch.c), made by tks__bpe_finish.
 * 0 or TKS_ERR_NOMEM. */
int tks__bpe_scratch_init(tks_bpe *b);
/* Loads tokshard's descriptor of a tiktoken tokenizer (bpe_tiktoken.c),
 * `d` its parsed JSON (borrowed), `path` its file. */
struct json_t;
int tks__bpe_load_descriptor(const char *path, struct json_t *d, int no_cache, tks_bpe **out);

#endif
