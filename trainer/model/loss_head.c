/* loss_head.c - the lm_head GEMM and the cross-entropy over row chunks
 * (loss_head.h says what and why). */
#include <stdlib.h>

#include "common/tks.h"
#include "trainer/model/loss_head.h"

int tks_loss_chunk_rows(void) {
    const char *e = getenv("TKS_LOSS_CHUNK_ROWS");
    if (!e || !*e) return 0;
    char *end;
    long r = strtol(e, &end, 10);
    return *end || r < 1 || r > (1L << 30) ? 0 : (int)r;
}

/* an element offset into a dt buffer */
static const void *at(const void *p, size_t i, tks_dtype dt) { return (const char *)p + i * tks_dtype_size(dt); }

int tks_loss_head(tks_backend *be, const tks_loss_head_args *a) {
    if (a->rows < 1)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "loss head: %d rows per chunk (need >= 1)", a->rows);
    const tks_backend_ops *o = be->ops;
    size_t C = (size_t)a->C;
    int rc = 0;
    for (int r0 = 0; r0 < a->N && !rc; r0 += a->rows) {
        int n = a->N - r0 < a->rows ? a->N - r0 : a->rows;
        const void *h = at(a->h, (size_t)r0 * C, a->dt);
        /* logits [n, VP] = h W^T */
        tks_gemm_args g = {.trans_b = 1, .M = n, .N = a->VP, .K = a->C, .alpha = 1.0f,
                           .A = h, .a_type = a->dt, .lda = C,
                           .B = a->W, .b_type = a->dt, .ldb = C,
                           .C = a->buf, .c_type = a->dt, .ldc = (size_t)a->VP,
                           .compute = TKS_F32, .accumulate = 0};
        rc = o->gemm(be, &g);
        if (!a->dh) { /* evaluation: the staged cross-entropy on the chunk */
            if (!rc) rc = o->xent_max(be, a->mx + r0, a->buf, n, a->VP, a->VR, a->dt);
            if (!rc) rc = o->xent_sumexp(be, a->sum + r0, a->buf, a->mx + r0, n, a->VP, a->VR, a->dt);
            if (!rc) rc = o->xent_target(be, a->tgt + r0, a->buf, a->targets + r0, n, a->VP, 0, a->VR, a->dt);
            if (!rc) rc = o->xent_loss(be, a->loss + r0, a->mx + r0, a->sum + r0, a->tgt + r0, n);
            continue;
        }
        /* loss and dlogits in place */
        if (!rc) rc = o->xent_fused(be, a->loss + r0, a->buf, a->targets + r0, n, a->VP, a->VR, a->scale, a->dt);
        /* dW [VP, C] += dlogits^T h */
        tks_gemm_args gw = {.trans_a = 1, .M = a->VP, .N = a->C, .K = n, .alpha = 1.0f,
                            .A = a->buf, .a_type = a->dt, .lda = (size_t)a->VP,
                            .B = h, .b_type = a->dt, .ldb = C,
                            .C = a->dW, .c_type = TKS_F32, .ldc = C,
                            .compute = TKS_F32, .accumulate = 1};
        if (!rc) rc = o->gemm(be, &gw);
        /* dh [n, C] = dlogits W */
        tks_gemm_args gx = {.M = n, .N = a->C, .K = a->VP, .alpha = 1.0f,
                            .A = a->buf, .a_type = a->dt, .lda = (size_t)a->VP,
                            .B = a->W, .b_type = a->dt, .ldb = C,
                            .C = (void *)at(a->dh, (size_t)r0 * C, a->dt), .c_type = a->dt, .ldc = C,
                            .compute = TKS_F32, .accumulate = 0};
        if (!rc) rc = o->gemm(be, &gx);
    }
    return rc;
}
