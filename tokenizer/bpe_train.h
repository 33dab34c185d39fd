/*
 * bpe_train.h - private to the byte-level BPE trainer (tokenizer/): the
 * trainer's state, which bpe_train.c fills (the words, the pair counts and
 * the merge loop) and bpe_train_out.c reads to write the tokenizer. Calls
 * run one way: bpe_train_out.c reads the fields and calls nothing of
 * bpe_train.c. Nothing outside tokenizer/bpe_train*.c includes it.
 *
 * Legend: W distinct words of 2 bytes or more, S their symbols (bytes at
 * first, fewer as merges join them), V ids, P distinct pairs ever counted.
 */
#ifndef TKS_TOKENIZER_BPE_TRAIN_H
#define TKS_TOKENIZER_BPE_TRAIN_H

#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* A heap entry: (count, pair) ordered as BpeTrainer's Merge (count
 * descending, then pair ascending), with the words the pair was found in
 * (its Merge.pos: ascending, no repeats): w.p[0..n), owned (cap >= 2), a
 * slice of the first index (cap 0), or the one word itself (cap 1). */
typedef struct tks__bt_ent {
    int64_t count;
    uint64_t pair;  /* left id << 32 | right id */
    union {
        uint32_t *p;
        uint32_t one;
    } w;
    uint32_t n, cap;
} tks__bt_ent;

/* A slot of the pair counts (open addressing): key pair + 1 (0: empty). */
typedef struct tks__bt_pc {
    uint64_t key;
    int64_t count;
} tks__bt_pc;

struct tks_bpe_trainer {
    uint32_t vocab_size;
    uint64_t min_frequency;
    int threads;
    /* the vocabulary, by id: token i is tb[toff[i] .. toff[i + 1]), its bytes; tspec[i] 1 for a
     * special token (its bytes are its text), 2 for a special token whose text is not a string
     * of GPT-2's byte characters (so that no byte string is it) */
    char *tb;
    uint64_t tb_len, tb_cap;
    uint64_t *toff;       /* (V + 1) */
    uint8_t *tspec;       /* (V) */
    uint32_t n_tok, tok_cap, n_specials;
    uint32_t *vmap;       /* token bytes -> id + 1 (0 empty), vmask + 1 slots */
    size_t vmask;
    uint32_t byte_id[256];
    /* the words: word w's symbols sym[woff[w] .. woff[w] + wlen[w]) and its count */
    uint32_t *sym;        /* (S) */
    uint64_t n_sym, sym_cap;
    uint64_t *woff, *wcnt; /* (W) */
    uint32_t *wlen;       /* (W) */
    uint64_t n_words, words_cap, short_words;
    /* the pair counts (a pair at count 0 is not kept: absent reads 0) and the heap */
    tks__bt_pc *pc;       /* pcmask + 1 slots, pcn used */
    size_t pcmask, pcn;
    tks__bt_ent *heap;
    size_t hn, hcap;
    uint32_t *csr;        /* the first index: every pair's words, back to back */
    /* the merges as learnt: (left, right, new id) each; keep[i] 1 for the ones tokenizers
     * saves (a pair merged twice: its last) */
    uint32_t *mg;
    uint64_t n_mg, mg_cap, n_saved;
    uint8_t *keep;
    int ran;
    /* bytes held by the entries' own word lists, and the most the trainer's tables held */
    uint64_t list_bytes, peak, csr_n;
};

#endif
