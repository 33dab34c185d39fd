/* cuda_adamw.cu - the CUDA backend's AdamW kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- AdamW over the flat buffer -------------------------------------------------------
 * Same operation order as the CPU backend (torch.optim.AdamW's single-tensor
 * path); bias corrections and each span's decay 1 - lr wd computed on the
 * host exactly as there; the clip factor read on the device from the global
 * sum of squares. One launch per SPAN_BATCH spans (span_batch): every
 * parameter tensor of a model up to 17 layers in one launch. */
template <typename PC>
__global__ void k_adamw(float *p, const float *grad, float *m, float *v, PC *pc, size_t base,
                        span_batch b, float b1, float b2, float eps, float step, float bc2s,
                        float grad_scale, const float *gnorm_sq, float clip) {
    __shared__ size_t s_off[SPAN_BATCH], s_end[SPAN_BATCH];
    __shared__ float s_decay[SPAN_BATCH];
    float clipf = 1.0f;
    if (gnorm_sq) {
        double nsq = (double)gnorm_sq[0];
        if (!isfinite(nsq)) return; /* the caller sees the norm and reports it */
        double norm = sqrt(nsq);
        if (clip > 0 && norm > clip) clipf = (float)((double)clip / norm);
    }
    for (int k = threadIdx.x; k < b.n; k += blockDim.x)
        s_off[k] = b.off[k], s_end[k] = b.end[k], s_decay[k] = b.f[k];
    __syncthreads();
    float gs = grad_scale * clipf;
    size_t total = b.n ? s_end[b.n - 1] : 0;
    int sp = 0;
    GRID_STRIDE(e, total) {
        sp = span_of(s_end, sp, e);
        size_t i = s_off[sp] + (e - (sp ? s_end[sp - 1] : 0)), j = i - base;
        float g = grad[i] * gs;
        float mi = m[j] * b1 + g * (1.0f - b1);
        float vi = v[j] * b2 + g * g * (1.0f - b2);
        m[j] = mi;
        v[j] = vi;
        float denom = sqrtf(vi) / bc2s + eps;
        float pi = p[i] * s_decay[sp] - step * mi / denom;
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
    for (size_t s = 0; s < nspans; s++)
        if (spans[s].off < base) return arg_fail(c, "adamw", "a span starts before the optimizer slice (a caller bug)");
    for (size_t k = 0; k < nspans;) {
        span_batch b;
        /* the decay as the CPU computes it: one fp32 product and difference */
        size_t n = span_batch_fill(&b, spans, nspans, &k, [lr](const tks_span &sp) { return 1.0f - lr * sp.wd; });
        if (!n) continue;
        /* one wave of resident blocks (8 of 256 threads per SM), each thread
         * striding over the batch: every block reads the span table into
         * shared memory once, so a grid of a block per 256 elements (a
         * million blocks for 1.5e9 parameters) spends its time on that */
        unsigned g = grid_for(n, 256), wave = 8u * (unsigned)c->prop.multiProcessorCount;
        if (wave && g > wave) g = wave;
        if (pc && pc_dt == TKS_BF16)
            k_adamw<bf16><<<g, 256, 0, c->cur>>>(p, grad, m, v, (bf16 *)pc, base, b, b1, b2, eps, step, bc2s,
                                                 grad_scale, gnorm_sq, hp->clip);
        else
            k_adamw<float><<<g, 256, 0, c->cur>>>(p, grad, m, v, (float *)pc, base, b, b1, b2, eps, step, bc2s,
                                                  grad_scale, gnorm_sq, hp->clip);
        if (LAUNCHED(c, "adamw")) return c->err;
    }
    return 0;
}
