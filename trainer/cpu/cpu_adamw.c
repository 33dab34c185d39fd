/* cpu_adamw.c - AdamW over spans of a flat parameter buffer on the CPU backend
 * (backend.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

/* ---- AdamW over spans ------------------------------------------------------------------ */

int tks__cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                   const tks_span *spans, size_t nspans, const tks_adamw_hp *hp,
                   float grad_scale, const float *gnorm_sq, void *pc, tks_dtype pc_dt) {
    STICKY(be);
    if (pc && tks__cpu_check_dt(be, "adamw", pc_dt)) return CTX(be)->err;
    float clipf = 1.0f;
    if (gnorm_sq) {
        double nsq = *gnorm_sq; /* read on the device: no host round trip on a GPU */
        if (!isfinite(nsq)) return 0; /* the caller sees the norm and reports it */
        double norm = sqrt(nsq);
        if (hp->clip > 0 && norm > hp->clip) clipf = (float)(hp->clip / norm);
    }
    float gs = grad_scale * clipf;
    /* same operation order as torch.optim.AdamW (single-tensor path) */
    float b1 = hp->b1, b2 = hp->b2, lr = hp->lr, eps = hp->eps;
    float bc1 = 1.0f - powf(b1, (float)hp->t), bc2 = 1.0f - powf(b2, (float)hp->t);
    float step = lr / bc1, bc2s = sqrtf(bc2);
    for (size_t s = 0; s < nspans; s++) {
        size_t off = spans[s].off, n = spans[s].n;
        if (off < base) {
            return tks__cpu_op_fail(be, "adamw", TKS_ERR_ARG,
                           "span at %zu starts before the optimizer slice at %zu (a caller bug)",
                           off, base);
        }
        float decay = 1.0f - lr * spans[s].wd;
        float *P = p + off, *M = m + (off - base), *Vv = v + (off - base);
        const float *G = grad + off;
#pragma omp parallel for schedule(static) num_threads(NT(be))
        for (size_t i = 0; i < n; i++) {
            float g = G[i] * gs;
            M[i] = M[i] * b1 + g * (1.0f - b1);
            Vv[i] = Vv[i] * b2 + g * g * (1.0f - b2);
            float denom = sqrtf(Vv[i]) / bc2s + eps;
            P[i] = P[i] * decay - step * M[i] / denom;
            if (pc) st(pc, off + i, P[i], pc_dt);
        }
    }
    return 0;
}
