/* bpe_seed.c - the seed table of the short pieces (bpe_pcache.h): every
 * mergeable token of at most PKEY_MAX bytes with the ids BPE gives its
 * bytes, made once when a tokenizer is parsed and kept in its cache file
 * (bpe_cache.c), so that a whole word that is a token is found with one
 * lookup from the first piece of the first document on.
 *
 * With a ranks file (tiktoken's encode: a piece that is a token is that
 * token) and with ignore_merges (tokenizers' BPE model: the same rule) a
 * token's ids are itself. With merges alone they are what the merge engine
 * gives the token's bytes: a token that its own merges do not make (a
 * tokenizer.json may list such tokens) is cut into the ids the reference
 * gives it, never taken whole. A token whose bytes give more than
 * PSLOT_IDS ids stays out (its pieces are merged when met). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_encoder.h"
#include "tokenizer/bpe_pcache.h"

int tks__bpe_seed_build(tks_bpe *b) {
    size_t n = 0;
    for (size_t i = 0; i <= b->vmask; i++) n += b->vslot[i].id != TKS_NO_ID && b->vslot[i].len <= PKEY_MAX;
    unsigned bits = 4; /* 2^bits lines >= n: at most half of their 2 slots each full */
    while (((size_t)1 << bits) < n) bits++;
    size_t lines = (size_t)1 << bits;
    pslot *seed = tks_alloc_table(2 * lines * sizeof *seed);
    if (!seed) return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "out of memory for the seed table");
    tks_ids out = {0};
    enc e = {b, NULL, &out, 0, NULL};
    int own = b->mode == TKS__BPE_RANKS || b->ignore_merges, rc = 0;
    for (size_t i = 0; i <= b->vmask && !rc; i++) {
        const tks__bpe_vslot *v = &b->vslot[i];
        if (v->id == TKS_NO_ID || v->len > PKEY_MAX || !v->len) continue;
        const char *t = b->bytes + b->off[v->id];
        out.n = 0;
        if (own) rc = tks__bpe_push_id(&e, v->id);
        else rc = tks__bpe_merge_small(&e, t, v->len);
        if (rc || out.n == 0 || out.n > PSLOT_IDS) continue;
        pkey k = pkey_of(t, v->len, t + v->len);
        size_t l = pkey_line(k, bits);
        while (seed[2 * l + 1].hi) l = (l + 1) & (lines - 1);
        pslot *s = &seed[2 * l + (seed[2 * l].hi != 0)];
        *s = (pslot){k.lo, k.hi, {0, 0, 0}, (uint32_t)out.n};
        memcpy(s->id, out.ids, out.n * sizeof *out.ids);
    }
    tks_ids_free(&out);
    if (rc) {
        tks_free_table(seed, 2 * lines * sizeof *seed);
        return rc;
    }
    b->seed = seed;
    b->seed_bits = bits;
    return 0;
}
