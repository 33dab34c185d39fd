/*
 * bpe_encoder.h - private to the byte-level BPE encoder (tokenizer/): what
 * its files share. bpe.c runs an encode (added tokens, normalization, the
 * pre-tokenizer, each piece through the vocabulary, the caches and a merge
 * engine); bpe_merge.c holds the merge engines, bpe_wcache.h/.c the
 * per-thread piece caches, bpe_scratch.c the per-thread scratch (a tls_pool.h object)
 * and the id output, bpe_vocab.h the vocabulary lookups, bpe_cut.c where a
 * long document may be cut. Calls run one way: bpe.c -> bpe_wcache.c,
 * bpe_merge.c -> bpe_scratch.c -> tls_pool.c.
 */
#ifndef TKS_TOKENIZER_BPE_ENCODER_H
#define TKS_TOKENIZER_BPE_ENCODER_H

#include "tokenizer/bpe_internal.h"
#include "tokenizer/tls_pool.h"

/* The word cache: per thread, 2-way set associative, one 64-byte line a
 * piece of up to 24 bytes with up to 9 ids, the piece's bytes in the line
 * (a hit reads one cache line: with the bytes elsewhere, the second load
 * missed as often as the first). CACHE_SETS x 2 lines: 2 MiB a thread. Its
 * pieces are those the short pieces' tables (bpe_pcache.h) do not hold:
 * over PKEY_MAX bytes, or over PSLOT_IDS ids. */
#define CACHE_KEY 24
#define CACHE_IDS 9
#define CACHE_SETS (1u << 14)
#define CACHE_BYTES (2 * (size_t)CACHE_SETS * 64)

/* The long-piece cache: per thread, direct-mapped, LCACHE entries, for the
 * pieces of up to LCACHE_MAX bytes the word cache cannot hold (over
 * CACHE_KEY bytes, or over CACHE_IDS ids): the underlines and indentation
 * runs of reStructuredText, long words of scripts the vocabulary knows
 * little of. An entry owns a copy of its piece's bytes and ids, so a hit is
 * checked byte for byte. */
#define LCACHE (1u << 16)
#define LCACHE_MAX 256

/* The thread's cache of short pieces (bpe_pcache.h): 2^PC_BITS lines of two
 * 32-byte slots, 8 MiB; and in front of the seed and that cache, the hot
 * pieces: 2^HOT_BITS lines, 256 KiB, so that the pieces met most (a few
 * thousand make nine in ten of a text's) stay in the processor's caches, two
 * to a line, and the big tables' lines are fetched only for the others. */
#define PC_BITS 17
#define HOT_BITS 12
#define PC_BYTES ((((size_t)2 << PC_BITS) + ((size_t)2 << HOT_BITS)) * 32)

/* Pieces up to this many bytes are merged in flat arrays on the stack
 * (tks__bpe_merge_small); longer ones through tks__bpe_merge_heap. */
#define SMALL_PIECE 48
/* Pieces up to this many bytes go through the reference's plain loop;
 * longer ones (O(n^2) would take minutes) through tks__bpe_merge_heap. */
#define REF_MAX_PIECE 65536

/* A candidate pair of the heap merge. */
typedef struct hent {
    uint32_t rank, pos; /* the candidate pair starts at symbol pos */
    uint32_t span;      /* how many initial symbols the pair covers: a popped entry is current
                         * only while its pair still covers as many (a merge at pos or at its
                         * right neighbour makes the pair longer) */
    uint32_t new_id;
} hent;

/* An entry of the long-piece cache. */
typedef struct lent {
    uint64_t h;           /* the piece's hash (ckey) */
    uint32_t len, n_ids;
    char *blob;           /* len bytes, then n_ids ids (uint32_t); NULL: empty */
} lent;

/* A line of the word cache. */
typedef struct cline {
    uint64_t key[CACHE_KEY / 8]; /* the piece's bytes, zero after its end */
    uint32_t ids[CACHE_IDS];
    uint8_t len, n_ids;          /* len 0: empty */
    uint8_t pad[2];
} cline;

/* A thread's scratch (bpe_scratch.c), an object of the handle's pool. */
struct tks__bpe_scratch {
    tks__tls_obj pool;          /* first: the pool's link */
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    uint32_t *sym;              /* a piece's symbols: id, or TKS_NO_ID once merged away */
    int32_t *prev, *next;       /* their neighbours, -1 at the ends */
    size_t sym_cap;             /* elements */
    hent *heap;
    cline *cache;               /* CACHE_SETS x 2, or NULL before the first use */
    lent *lcache;               /* LCACHE, allocated with cache */
    tks__bpe_pslot *pc;         /* 2 << PC_BITS: the short pieces' cache (bpe_pcache.h), with cache */
    tks__bpe_pslot *hot;        /* 2 << HOT_BITS: the hot pieces, after pc in its table */
    tks_encoder_stats st;
};
typedef tks__bpe_scratch scratch;

/* One encode: the handle, the thread's scratch, the ids appended to. */
typedef struct enc {
    const tks_bpe *b;
    scratch *s;
    tks_ids *out;
    int ref;    /* the reference path: no cache, the plain merge loop */
    const char *tend; /* or NULL: where the text the pieces lie in ends (the merge engines may read
                       * a short piece's neighbourhood up to there, never past) */
} enc;

/* A piece's hash, computed ahead so that its vocab slot and word-cache set
 * can be fetched while the piece before it is encoded. */
typedef struct ckey {
    uint64_t h;
} ckey;

/* Where a piece goes in the caches once merged (tks__bpe_wcache_get fills
 * it on a miss, tks__bpe_wcache_put stores there). */
typedef struct wslot {
    int line;                   /* the word cache holds pieces this long */
    int lng;                    /* the long-piece cache does */
    size_t set;                 /* the word cache's set */
    uint64_t key[CACHE_KEY / 8];
} wslot;

/* bpe_scratch.c: the calling thread's scratch of handle b (made on its first
 * call), or NULL when out of memory. */
scratch *tks__bpe_scratch_get(const tks_bpe *b);
/* bpe_scratch.c: frees every thread's scratch of b (tks_bpe_free). */
void tks__bpe_scratch_free(tks_bpe *b);
/* bpe_scratch.c: room for k more ids in e's output; one id appended. 0 or
 * TKS_ERR_NOMEM. */
int tks__bpe_out_reserve(enc *e, size_t k);
int tks__bpe_push_id(enc *e, uint32_t id);
/* bpe_scratch.c: the symbol arrays (and heap) sized for a piece of n bytes.
 * 0 or TKS_ERR_NOMEM. */
int tks__bpe_grow_symbols(scratch *s, size_t n);

/* bpe_merge.c: BPE of the piece t[0..n) appended to e's output: _heap, any
 * length (a binary heap of candidate pairs, O(n log n)); _small, n <=
 * SMALL_PIECE (flat arrays, a scan for the least rank); _ref, the reference
 * (every pair looked up again after each merge, O(n^2): the plain statement
 * of the rule the others must agree with). The same ids for the same piece.
 * 0, or TKS_ERR_NOMEM, TKS_ERR_ARG (a piece over 1 GB). */
int tks__bpe_merge_heap(enc *e, const char *t, size_t n);
int tks__bpe_merge_small(enc *e, const char *t, size_t n);
int tks__bpe_merge_ref(enc *e, const char *t, size_t n);

#endif
