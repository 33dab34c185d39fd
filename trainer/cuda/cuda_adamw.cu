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
/* *clipf: the clip factor, clip / norm when the global norm (the square root
 * of *gnorm_sq; none: no clip) is above clip > 0, else 1. False when the norm
 * is not finite. */
__device__ __forceinline__ bool clip_factor(const float *gnorm_sq, float clip, float *clipf) {
    *clipf = 1.0f;
    if (!gnorm_sq) return true;
    double nsq = (double)gnorm_sq[0];
    if (!isfinite(nsq)) return false;
    double norm = sqrt(nsq);
    if (clip > 0 && norm > clip) *clipf = (float)((double)clip / norm);
    return true;
}
template <typename PC>
__global__ void k_adamw(float *p, const float *grad, float *m, float *v, PC *pc, size_t base,
                        span_batch b, float b1, float b2, float eps, float step, float bc2s,
                        float grad_scale, const float *gnorm_sq, float clip) {
    __shared__ size_t s_off[SPAN_BATCH], s_end[SPAN_BATCH];
    __shared__ float s_decay[SPAN_BATCH];
    float clipf;
    if (!clip_factor(gnorm_sq, clip, &clipf)) return; /* the caller sees the norm and reports it */
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
/* ---- the vectorized form (TKS_CUDA_VEC_OPTIM=1; unverified on a GPU) -----------
 * Phase 2 of the optimizer step (phase 1 is sumsq, which reads each gradient
 * once for the global sum of squares; the clip needs the whole norm before
 * any update, so the two cannot be one pass): one pass over p, grad, m, v
 * (and the compute copy) by quads of the spans (quad_batch): a quad inside a
 * span is four 16-byte loads and three or four 16-byte stores (8 bytes for a
 * bf16 copy), the 4 * 4 + 4 * 3 + 2 = 30 bytes a parameter (bf16 copy) that
 * set the step's roofline, against the scalar kernel's 4-byte accesses and
 * per-element span lookup. A quad at a span's edge, or every quad when a
 * pointer is not 16-byte aligned or base is not a multiple of 4 (m and v
 * would be off by a part of a quad), takes the element path. Each element's
 * arithmetic is adam_elem, the operation order of the scalar kernel and of
 * the CPU (torch.optim.AdamW's). */
__device__ __forceinline__ void adam_elem(float &p, float g, float &m, float &v, float decay, float gs, float b1,
                                          float b2, float eps, float step, float bc2s) {
    g *= gs;
    m = m * b1 + g * (1.0f - b1);
    v = v * b2 + g * g * (1.0f - b2);
    float denom = sqrtf(v) / bc2s + eps;
    p = p * decay - step * m / denom;
}
__device__ __forceinline__ void st4(float *pc, size_t i, float4 P) { *(float4 *)(pc + i) = P; }
__device__ __forceinline__ void st4(bf16 *pc, size_t i, float4 P) {
    __nv_bfloat162 *q = (__nv_bfloat162 *)(pc + i); /* i % 4 == 0: 8-byte aligned */
    q[0] = __floats2bfloat162_rn(P.x, P.y);
    q[1] = __floats2bfloat162_rn(P.z, P.w);
}
template <typename PC>
__global__ void k_adamw_vec(float *p, const float *grad, float *m, float *v, PC *pc, size_t base, quad_batch b,
                            int vec, float b1, float b2, float eps, float step, float bc2s, float grad_scale,
                            const float *gnorm_sq, float clip) {
    __shared__ size_t s_off[QUAD_BATCH], s_stop[QUAD_BATCH], s_qend[QUAD_BATCH];
    __shared__ float s_decay[QUAD_BATCH];
    float clipf;
    if (!clip_factor(gnorm_sq, clip, &clipf)) return; /* the caller sees the norm and reports it */
    for (int k = threadIdx.x; k < b.n; k += blockDim.x)
        s_off[k] = b.off[k], s_stop[k] = b.stop[k], s_qend[k] = b.qend[k], s_decay[k] = b.f[k];
    __syncthreads();
    float gs = grad_scale * clipf;
    size_t total = b.n ? s_qend[b.n - 1] : 0;
    int sp = 0;
    GRID_STRIDE(Q, total) {
        size_t i0 = quad_at(s_qend, s_off, &sp, Q);
        float decay = s_decay[sp];
        if (vec && quad_whole(i0, s_off[sp], s_stop[sp])) {
            float4 P = *(const float4 *)(p + i0), G = *(const float4 *)(grad + i0);
            float4 M = *(const float4 *)(m + (i0 - base)), V = *(const float4 *)(v + (i0 - base));
            adam_elem(P.x, G.x, M.x, V.x, decay, gs, b1, b2, eps, step, bc2s);
            adam_elem(P.y, G.y, M.y, V.y, decay, gs, b1, b2, eps, step, bc2s);
            adam_elem(P.z, G.z, M.z, V.z, decay, gs, b1, b2, eps, step, bc2s);
            adam_elem(P.w, G.w, M.w, V.w, decay, gs, b1, b2, eps, step, bc2s);
            *(float4 *)(p + i0) = P;
            *(float4 *)(m + (i0 - base)) = M;
            *(float4 *)(v + (i0 - base)) = V;
            if (pc) st4(pc, i0, P);
            continue;
        }
        size_t lo = i0 > s_off[sp] ? i0 : s_off[sp], hi = i0 + 4 < s_stop[sp] ? i0 + 4 : s_stop[sp];
        for (size_t i = lo; i < hi; i++) {
            float pi = p[i], mi = m[i - base], vi = v[i - base];
            adam_elem(pi, grad[i], mi, vi, decay, gs, b1, b2, eps, step, bc2s);
            p[i] = pi, m[i - base] = mi, v[i - base] = vi;
            if (pc) stv(pc, i, pi);
        }
    }
}
static int adamw_vec(tks_cuda_ctx *c, float *p, const float *grad, float *m, float *v, size_t base,
                     const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale,
                     const float *gnorm_sq, void *pc, tks_dtype pc_dt, float b1, float b2, float eps, float step,
                     float bc2s) {
    float lr = hp->lr;
    int vec = (base & 3) == 0 && aligned16(p) && aligned16(grad) && aligned16(m) && aligned16(v) &&
              (!pc || (pc_dt == TKS_BF16 ? ((uintptr_t)pc & 7u) == 0 : aligned16(pc)));
    for (size_t k = 0; k < nspans;) {
        quad_batch b;
        size_t nq = quad_batch_fill(&b, spans, nspans, &k, lr);
        if (!nq) continue;
        unsigned g = grid_for(nq, 256), wave = 8u * (unsigned)c->prop.multiProcessorCount;
        if (wave && g > wave) g = wave;
        if (pc && pc_dt == TKS_BF16)
            k_adamw_vec<bf16><<<g, 256, 0, c->cur>>>(p, grad, m, v, (bf16 *)pc, base, b, vec, b1, b2, eps, step,
                                                     bc2s, grad_scale, gnorm_sq, hp->clip);
        else
            k_adamw_vec<float><<<g, 256, 0, c->cur>>>(p, grad, m, v, (float *)pc, base, b, vec, b1, b2, eps, step,
                                                      bc2s, grad_scale, gnorm_sq, hp->clip);
        if (LAUNCHED(c, "adamw")) return c->err;
    }
    return 0;
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
    if (c->vec_optim)
        return adamw_vec(c, p, grad, m, v, base, spans, nspans, hp, grad_scale, gnorm_sq, pc, pc_dt, b1, b2, eps,
                         step, bc2s);
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
