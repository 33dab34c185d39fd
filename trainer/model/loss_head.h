/*
 * loss_head.h - the lm_head GEMM and the cross-entropy over row chunks, so
 * that the [N, VP] logits are never held whole (tp = 1). Private to trainer/
 * and its tests.
 *
 * The idea is Liger-Kernel's fused linear cross-entropy and Apple's Cut
 * Cross-Entropy (Wijmans et al. 2024): the logits of a row block are made,
 * reduced to the loss and turned into their gradient, which is consumed at
 * once by the two backward GEMMs; only [rows, VP] exists at a time. Written
 * here from the formulas of backend.h (xent_fused) and the chain rule, on
 * the backend's own ops, so it is the same algorithm on every backend (the
 * CPU reference included) and its arithmetic per element is the unchunked
 * path's: a row's logits, loss and dh are the same sums; only dW's sum over
 * the N rows is split into per-chunk partial sums added in fp32.
 *
 * Off by default. TKS_LOSS_CHUNK_ROWS=R (R > 0) turns it on for models
 * created after it is set, with tp = 1 (a vocab-parallel model keeps the
 * staged cross-entropy); unverified on a GPU.
 */
#ifndef TKS_LOSS_HEAD_H
#define TKS_LOSS_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/backend/backend.h"

/* Rows per chunk from TKS_LOSS_CHUNK_ROWS (0: off, the default, also when
 * the value is not a positive integer). */
int tks_loss_chunk_rows(void);

typedef struct tks_loss_head_args {
    const void *h;          /* [N, C] (dt): the final norm's output */
    const void *W;          /* [VP, C] (dt): lm_head's compute weights */
    const int32_t *targets; /* device int32 [N]; negative: ignored row */
    float *loss;            /* [N] fp32, written: per-token loss (0 when ignored) */
    void *dh;               /* [N, C] (dt), overwritten: scale * dloss/dh; NULL: forward only */
    float *dW;              /* [VP, C] fp32, accumulated: scale * dloss/dW */
    void *buf;              /* [rows, VP] (dt) scratch: one chunk's logits, then dlogits */
    float *mx, *sum, *tgt;  /* [N] fp32 scratch of the forward-only form */
    int N, C, VP, VR;       /* VR: real vocabulary columns (the rest is padding) */
    int rows;               /* rows per chunk, >= 1 */
    float scale;            /* d(objective)/d(token loss) */
    tks_dtype dt;
} tks_loss_head_args;

/*
 * For each chunk of a->rows rows [r0, r0 + n):
 *   buf = h[r0:] @ W^T                       (gemm, [n, VP])
 *   loss[r0:], buf = xent_fused(buf)         (dlogits = scale (softmax - onehot))
 *   dW += buf^T @ h[r0:]                     (gemm, fp32 accumulate)
 *   dh[r0:] = buf @ W                        (gemm)
 * With dh NULL (evaluation) the loss only: buf = h W^T, then xent_max,
 * xent_sumexp, xent_target and xent_loss on the chunk (mx, sum, tgt used).
 * Errors: the backend's (sticky), TKS_ERR_ARG for rows < 1.
 */
int tks_loss_head(tks_backend *be, const tks_loss_head_args *a);

#endif /* TKS_LOSS_HEAD_H */
