/*
 * heap.h - the binary heap of the encoders' merge queues (bpe.c's ranked
 * pairs, fastenc.c's scored sentencepiece BPE pairs), private to
 * tokenizer/. TKS_HEAP_DEFINE(name, T, before) defines
 *   static inline void name_push(T *h, size_t *n, T x);
 *   static inline T name_pop(T *h, size_t *n);     (*n > 0)
 * over h[0 .. *n), the first entry by `before(const T *a, const T *b)` (a
 * strict order: 1 when a comes first) on top. The caller sizes h. Ties go
 * as a textbook sift (the left child first), the same on every machine.
 */
#ifndef TKS_TOKENIZER_HEAP_H
#define TKS_TOKENIZER_HEAP_H

#include <stddef.h>

#define TKS_HEAP_DEFINE(name, T, before)                                   \
    static inline void name##_push(T *h, size_t *n, T x) {                 \
        size_t i = (*n)++;                                                 \
        while (i) {                                                        \
            size_t p = (i - 1) / 2;                                        \
            if (!before(&x, &h[p])) break;                                 \
            h[i] = h[p];                                                   \
            i = p;                                                         \
        }                                                                  \
        h[i] = x;                                                          \
    }                                                                      \
    static inline T name##_pop(T *h, size_t *n) {                          \
        T top = h[0], x = h[--*n];                                         \
        size_t i = 0, m = *n;                                              \
        for (;;) {                                                         \
            size_t c = 2 * i + 1;                                          \
            if (c >= m) break;                                             \
            if (c + 1 < m && before(&h[c + 1], &h[c])) c++;                \
            if (!before(&h[c], &x)) break;                                 \
            h[i] = h[c];                                                   \
            i = c;                                                         \
        }                                                                  \
        h[i] = x;                                                          \
        return top;                                                        \
    }

#endif /* TKS_TOKENIZER_HEAP_H */
