/*
 * quad_spans.h - span lists by aligned quads, the iteration of the CUDA
 * backend's vectorized optimizer step (TKS_CUDA_VEC_OPTIM: sumsq, sum,
 * adamw). Plain C shared by the kernels (nvcc) and the tests that check the
 * index arithmetic on the CPU (test_cuda_ops: every element of every span
 * visited exactly once, nothing else).
 *
 * Span s (elements [off, off + n) of the flat buffer) covers the quads (4
 * elements, 16 bytes of fp32) floor(off/4) .. ceil((off+n)/4) - 1, so a quad
 * inside a span is one 16-byte access whatever the lengths of the spans
 * before it (a concatenation of element counts, as the scalar kernels use,
 * would shift every later span off 16-byte alignment). Quad Q of a batch
 * lies in span s with qend[s-1] <= Q < qend[s] and starts at flat element
 * 4 (off[s]/4 + Q - qend[s-1]); of its four elements those in
 * [off[s], stop[s]) are the span's. A quad shared by two spans (one ending
 * mid-quad, the next starting there) is visited once per span, each
 * touching only its own elements. Empty spans are left out. QUAD_BATCH
 * spans per launch keep the kernel parameter under CUDA's 4 KiB
 * (128 x 28 + 8 bytes).
 */
#ifndef TKS_QUAD_SPANS_H
#define TKS_QUAD_SPANS_H

#include <stddef.h>

#include "trainer/backend/backend.h"

#ifdef __CUDACC__
#define TKS_QS_FN static __host__ __device__ __forceinline__
#else
#define TKS_QS_FN static inline
#endif

enum { QUAD_BATCH = 128 };
typedef struct quad_batch {
    size_t off[QUAD_BATCH];  /* span s's first element */
    size_t stop[QUAD_BATCH]; /* one past its last */
    size_t qend[QUAD_BATCH]; /* quads of spans 0..s together */
    float f[QUAD_BATCH];     /* a factor per span: 1 - lr wd (AdamW's decay; lr 0: 1) */
    int n;
} quad_batch;

/* Fills b from spans[*k..] (at most QUAD_BATCH non-empty ones), advancing
 * *k; f[s] = 1 - lr wd as the CPU computes it (one fp32 product and
 * difference). Returns the batch's quads. */
TKS_QS_FN size_t quad_batch_fill(quad_batch *b, const tks_span *spans, size_t nspans, size_t *k, float lr) {
    size_t q = 0;
    b->n = 0;
    for (; *k < nspans && b->n < QUAD_BATCH; (*k)++) {
        const tks_span *s = &spans[*k];
        if (!s->n) continue;
        q += (s->off + s->n + 3) / 4 - s->off / 4;
        b->off[b->n] = s->off;
        b->stop[b->n] = s->off + s->n;
        b->qend[b->n] = q;
        b->f[b->n] = 1.0f - lr * s->wd;
        b->n++;
    }
    return q;
}

/* Quad Q's first flat element; *s is its span, found by stepping forward
 * from the caller's last one (a thread's Q only grows). */
TKS_QS_FN size_t quad_at(const size_t *qend, const size_t *off, int *s, size_t Q) {
    while (Q >= qend[*s]) (*s)++;
    return (off[*s] / 4 + (Q - (*s ? qend[*s - 1] : 0))) * 4;
}

/* 1 when quad i0 lies wholly inside [off, stop): the 16-byte path */
TKS_QS_FN int quad_whole(size_t i0, size_t off, size_t stop) { return i0 >= off && i0 + 4 <= stop; }

#endif /* TKS_QUAD_SPANS_H */
