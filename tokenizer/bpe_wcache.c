/* bpe_wcache.c - the byte-level BPE encoder's per-thread piece caches
 * (bpe_wcache.h): made on a thread's first encode, and a long piece's copy
 * stored. */
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tokenizer/bpe_wcache.h"

int tks__bpe_wcache_on(enc *e) {
    scratch *s = e->s;
    if (!e->b->word_cache || e->ref) return 0;
    if (!s->cache) {
        _Static_assert(sizeof(cline) == 64, "a word-cache line is one 64-byte cache line");
        /* mapped rather than malloc'd: the kernel's pages come zeroed (no
         * second pass over 8 MiB), page-aligned (no line straddles two cache
         * lines) */
        void *p = mmap(NULL, CACHE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for the word cache");
        s->cache = p;
        /* on 2 MiB pages where the kernel allows it: lookups at random over
         * 8 MiB that do not miss the TLB (advice only) */
        madvise(p, CACHE_BYTES, MADV_HUGEPAGE);
        /* every page written first, not read: a page of zeros that is read
         * first maps the shared zero page, and its first write then flushes
         * the TLB of every thread of the process (an interrupt each), 5% of a
         * build on 2 threads */
        for (size_t o = 0; o < CACHE_BYTES; o += 4096) ((volatile char *)p)[o] = 0;
        if (!(s->lcache = calloc(LCACHE, sizeof *s->lcache))) {
            munmap(p, CACHE_BYTES);
            s->cache = NULL;
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
