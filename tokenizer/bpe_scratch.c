/* bpe_scratch.c - the byte-level BPE encoder's per-thread scratch
 * (bpe_encoder.h): PCRE2 match data and JIT stack, the symbol and heap
 * arrays of the merge engines, the piece caches (bpe_wcache.c makes them),
 * the counters; one object per thread of the handle's tls_pool.h pool. And
 * the id output every part of the encoder appends to. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_encoder.h"

static void scratch_destroy(tks__tls_obj *o) {
    scratch *s = (scratch *)o;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    tks_free_table(s->cache, CACHE_BYTES);
    tks_free_table(s->pc, PC_BYTES);
    for (size_t i = 0; s->lcache && i < LCACHE; i++) free(s->lcache[i].blob);
    free(s->lcache);
    free(s);
}


int tks__bpe_scratch_init(tks_bpe *b) {
    if (tks__tls_pool_init(&b->scratch))
        return tks_fail(TKS_ERR_NOMEM, b->path, TKS_NONE, TKS_NONE, "no thread-specific key left (pthread_key_create)");
    return 0;
}

static tks__tls_obj *scratch_new(void *ctx) {
    (void)ctx;
    /* cache lines of its own: the counters in `st` change at every piece,
     * and a neighbouring thread's scratch on the same line would bounce it */
    size_t sz = (sizeof(scratch) + 127) & ~(size_t)127;
    scratch *s = aligned_alloc(128, sz);
    if (!s) return NULL;
    memset(s, 0, sz);
    s->md = pcre2_match_data_create(16, NULL);
    s->mc = pcre2_match_context_create(NULL);
    /* the JIT's backtracking stack grows up to 64 MiB (a long run of the
     * same class); the match limit is set per piece (split_level) */
    s->js = pcre2_jit_stack_create(32 << 10, 64 << 20, NULL);
    if (!s->md || !s->mc || !s->js) {
        scratch_destroy(&s->pool);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mc, NULL, s->js);
    pcre2_set_match_limit(s->mc, UINT32_MAX);
    pcre2_set_depth_limit(s->mc, UINT32_MAX);
    pcre2_set_heap_limit(s->mc, UINT32_MAX);
    return &s->pool;
}

scratch *tks__bpe_scratch_get(const tks_bpe *b) {
    return (scratch *)tks__tls_pool_get(&((tks_bpe *)b)->scratch, scratch_new, NULL);
}

void tks__bpe_scratch_free(tks_bpe *b) { tks__tls_pool_free(&b->scratch, scratch_destroy); }

int tks__bpe_out_reserve(enc *e, size_t k) {
    tks_ids *o = e->out;
    if (o->n + k <= o->cap) return 0;
    size_t cap = o->cap ? 2 * o->cap : 256;
    while (cap < o->n + k) cap *= 2;
    if (tks_resize(&o->ids, cap, sizeof *o->ids))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory growing the id buffer");
    o->cap = cap;
    return 0;
}

int tks__bpe_push_id(enc *e, uint32_t id) {
    int rc = tks__bpe_out_reserve(e, 1);
    if (!rc) e->out->ids[e->out->n++] = id;
    return rc;
}

int tks__bpe_grow_symbols(scratch *s, size_t n) {
    if (n <= s->sym_cap) return 0;
    size_t cap = n < 256 ? 256 : n;
    if (tks_resize(&s->sym, cap, sizeof *s->sym) || tks_resize(&s->prev, cap, sizeof *s->prev) ||
        tks_resize(&s->next, cap, sizeof *s->next) || tks_resize(&s->heap, 2 * cap, sizeof *s->heap))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for a %zu-byte pre-token", n);
    s->sym_cap = cap;
    return 0;
}

void tks_bpe_encoder_stats(const tks_bpe *b, tks_encoder_stats *st) {
    _Static_assert(sizeof *st % sizeof(uint64_t) == 0, "tks_encoder_stats holds uint64_t counts only");
    memset(st, 0, sizeof *st);
    tks__tls_pool_sum(&((tks_bpe *)b)->scratch, offsetof(scratch, st), (uint64_t *)st, sizeof *st / sizeof(uint64_t));
}

void tks_bpe_count_doc(const tks_bpe *b, uint64_t unassigned, size_t parts) {
    scratch *s = b ? tks__bpe_scratch_get(b) : NULL;
    if (!s) return;
    s->st.unassigned_docs += unassigned > 0;
    s->st.cut_docs++;
    s->st.cut_parts += parts;
}
