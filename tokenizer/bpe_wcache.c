/* bpe_wcache.c - the byte-level BPE encoder's per-thread piece caches
 * (bpe_wcache.h): made on a thread's first encode, and a long piece's copy
 * stored. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_pcache.h"
#include "tokenizer/bpe_wcache.h"

int tks__bpe_wcache_on(enc *e) {
    scratch *s = e->s;
    if (!e->b->word_cache || e->ref) return 0;
    if (!s->cache) {
        _Static_assert(sizeof(cline) == 64, "a word-cache line is one 64-byte cache line");
        _Static_assert(sizeof(pslot) == 32, "two short-piece slots to a 64-byte line");
        s->cache = tks_alloc_table(CACHE_BYTES);
        s->pc = s->cache ? tks_alloc_table(PC_BYTES) : NULL;
        s->hot = s->pc ? s->pc + ((size_t)2 << PC_BITS) : NULL;
        s->lcache = s->pc ? calloc(LCACHE, sizeof *s->lcache) : NULL;
        if (!s->lcache) {
            tks_free_table(s->pc, PC_BYTES);
            tks_free_table(s->cache, CACHE_BYTES);
            s->cache = NULL;
            s->pc = NULL;
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the word cache");
        }
    }
    return 1;
}

/* Caches the piece t[0..n) with ids[0..k) in its entry (the entry's
 * previous piece goes); out of memory leaves the entry empty. */
void tks__bpe_lcache_put(scratch *s, uint64_t h, const char *t, size_t n, const uint32_t *ids, size_t k) {
    lent *l = &s->lcache[(h >> 20) & (LCACHE - 1)];
    char *p = realloc(l->blob, n + k * sizeof *ids);
    if (!p) {
        free(l->blob);
        *l = (lent){0, 0, 0, NULL};
        return;
    }
    memcpy(p, t, n);
    if (k) memcpy(p + n, ids, k * sizeof *ids);
    *l = (lent){h, (uint32_t)n, (uint32_t)k, p};
}
