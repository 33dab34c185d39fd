/* cuda_adamw.cu - the CUDA backend's AdamW kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "cuda_kernels.cuh"

/* ---- AdamW over the flat buffer -------------------------------------------------------
 * Same operation order as the CPU backend (torch.optim.AdamW's single-tensor
 * path); bias corrections computed on the host exactly as there; the clip
 * factor read on the device from the global sum of squares. One launch per
 * span (the spans are few: one per tensor group with the same decay). */
template <typename PC>
__global__ void k_adamw(float *p, const float *grad, float *m, float *v, PC *pc, size_t n,
                        float b1, float b2, float eps, float step, float bc2s, float decay,
                        float grad_scale, const float *gnorm_sq, float clip) {
    float clipf = 1.0f;
    if (gnorm_sq) {
        double nsq = (double)gnorm_sq[0];
        if (!isfinite(nsq)) return; /* the caller sees the norm and reports it */
        double norm = sqrt(nsq);
        if (clip > 0 && norm > clip) clipf = (float)((double)clip / norm);
    }
    float gs = grad_scale * clipf;
    GRID_STRIDE(i, n) {
        float g = grad[i] * gs;
        float mi = m[i] * b1 + g * (1.0f - b1);
        float vi = v[i] * b2 + g * g * (1.0f - b2);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2s + eps;
        float pi = p[i] * decay - step * mi / denom;
        p[i] = pi;
        if (pc) stv(pc, i, pi);
    }
}
int tks_cu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                    const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale,
                    const float *gnorm_sq, void *pc, tks_dtype pc_dt) {
    CTX(be);
    STICKY(c);
    if (pc) CHECK_DT(c, "adamw", pc_dt);
    float b1 = hp->b1, b2 = hp->b2, lr = hp->lr, eps = hp->eps;
    float bc1 = 1.0f - powf(b1, (float)hp->t), bc2 = 1.0f - powf(b2, (float)hp->t);
    float step = lr / bc1, bc2s = sqrtf(bc2);
    for (size_t s = 0; s < nspans; s++) {
        size_t off = spans[s].off, n = spans[s].n;
        if (off < base) return arg_fail(c, "adamw", "a span starts before the optimizer slice (a caller bug)");
        if (!n) continue;
        float decay = 1.0f - lr * spans[s].wd;
        unsigned g = grid_for(n, 256);
        if (pc && pc_dt == TKS_BF16)
            k_adamw<bf16><<<g, 256, 0, c->cur>>>(p + off, grad + off, m + (off - base), v + (off - base),
                                                 (bf16 *)pc + off, n, b1, b2, eps, step, bc2s, decay,
                                                 grad_scale, gnorm_sq, hp->clip);
        else
            k_adamw<float><<<g, 256, 0, c->cur>>>(p + off, grad + off, m + (off - base), v + (off - base),
                                                  pc ? (float *)pc + off : NULL, n, b1, b2, eps, step,
                                                  bc2s, decay, grad_scale, gnorm_sq, hp->clip);
        if (LAUNCHED(c, "adamw")) return c->err;
    }
    return 0;
}
