/* cuda_xent.cu - the CUDA backend's cross-entropy kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- cross-entropy ------------------------------------------------------------------ */

/* x into a thread's running max m and sum s of exp(. - m) (online softmax) */
__device__ __forceinline__ void online_add(float x, float &m, float &s) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}
/* The fused kernels' merge of one row: the block's max *M and 1 / sum *inv from
 * each thread's (m, s), and the row's loss (thread 0 writes it) from the target
 * logit, read by every thread before any overwrites the row. A target outside
 * the real columns [0, VR) reads no logit and gets no one-hot, as in the CPU
 * reference (xent_fused_row). Returns whether the target is local. */
template <typename T>
__device__ __forceinline__ int xent_row_loss(float *loss, const T *row, int tg, int VR, float m, float s, float *red,
                                             float &M, float &inv) {
    M = block_max(m, red);
    __syncthreads();
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), red);
    int local = tg >= 0 && tg < VR;
    float lt = local ? ldv(row, (size_t)tg) : 0.0f;
    __syncthreads(); /* every thread has read the target logit before it is overwritten */
    if (threadIdx.x == 0) loss[blockIdx.x] = logf(S) + M - lt;
    inv = 1.0f / S;
    return local;
}
/* the gradient at column j of logit x: softmax times scale on the real
 * columns, 0 on padding, minus scale at a local target */
__device__ __forceinline__ float xent_grad(float x, int j, int VR, float M, float inv, float scale, int local, int tg) {
    float g = j < VR ? expf(x - M) * inv * scale : 0.0f;
    if (local && j == tg) g -= scale;
    return g;
}

/* Fused (tp = 1): one block per row. Pass 1: online softmax (Milakov &
 * Gimelshein 2018, "Online normalizer calculation for softmax") per thread,
 * merged over the block; pass 2 overwrites the row with the gradient. */
template <typename T>
__global__ void k_xent_fused(float *loss, T *logits, const int32_t *targets, int V, int VR, float scale) {
    __shared__ float red[32];
    size_t o = (size_t)blockIdx.x * V;
    if (targets[blockIdx.x] < 0) { /* ignored (a packed window's padding): no loss, no gradient */
        if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
        for (int j = threadIdx.x; j < V; j += blockDim.x) stv(logits, o + j, 0.0f);
        return; /* the whole block returns: no barrier below is reached by part of it */
    }
    float m = -INFINITY, s = 0;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) {
        online_add(ldv(logits, o + j), m, s);
    }
    float M, inv;
    int tg = targets[blockIdx.x];
    int local = xent_row_loss(loss, logits + o, tg, VR, m, s, red, M, inv);
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        stv(logits, o + j, xent_grad(ldv(logits, o + j), j, VR, M, inv, scale, local, tg));
}
/* k_xent_fused with 16-byte accesses: V a multiple of W and the rows
 * 16-byte aligned (the launch checks). Pass 1 takes the real columns a
 * vector at a time, the running sum rescaled once a vector (to the vector's
 * max when it is larger), the real columns past the last whole vector one
 * at a time; the block merges as k_xent_fused does. Pass 2 writes each
 * vector's gradient (0 on padding, minus scale at a local target) in one
 * store. Same loss and gradient formulas; another summation order. */
template <typename T>
__global__ void k_xent_fused_vec(float *loss, T *logits, const int32_t *targets, int V, int VR, float scale) {
    constexpr int W = 16 / (int)sizeof(T);
    __shared__ float red[32];
    T *row = logits + (size_t)blockIdx.x * V;
    int nv = V / W;
    if (targets[blockIdx.x] < 0) { /* ignored: no loss, no gradient */
        float z[W] = {};
        if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
        for (int q = threadIdx.x; q < nv; q += blockDim.x) st16(row + (size_t)q * W, z);
        return; /* the whole block returns */
    }
    float m = -INFINITY, s = 0;
    int nr = VR / W;
    for (int q = threadIdx.x; q < nr; q += blockDim.x) {
        float v[W];
        ld16(row + (size_t)q * W, v);
        float vm = v[0];
#pragma unroll
        for (int k = 1; k < W; k++) vm = fmaxf(vm, v[k]);
        if (vm > m) {
            s *= expf(m - vm);
            m = vm;
        }
#pragma unroll
        for (int k = 0; k < W; k++) s += expf(v[k] - m);
    }
    for (int j = nr * W + threadIdx.x; j < VR; j += blockDim.x) online_add(ldv(row, (size_t)j), m, s);
    float M, inv;
    int tg = targets[blockIdx.x];
    int local = xent_row_loss(loss, row, tg, VR, m, s, red, M, inv);
    for (int q = threadIdx.x; q < nv; q += blockDim.x) {
        float v[W];
        ld16(row + (size_t)q * W, v);
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = xent_grad(v[k], q * W + k, VR, M, inv, scale, local, tg);
        st16(row + (size_t)q * W, v);
    }
}
int tks_cu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N,
                         int V, int VR, float scale, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_fused", dt);
    if (N <= 0) return 0;
    if (c->xent_vec && ((size_t)V * tks_dtype_size(dt)) % 16 == 0 && aligned16(logits)) {
        if (dt == TKS_BF16)
            k_xent_fused_vec<bf16><<<N, 512, 0, c->cur>>>(loss, (bf16 *)logits, targets, V, VR, scale);
        else
            k_xent_fused_vec<float><<<N, 512, 0, c->cur>>>(loss, (float *)logits, targets, V, VR, scale);
        return LAUNCHED(c, "xent_fused");
    }
    if (dt == TKS_BF16)
        k_xent_fused<bf16><<<N, 512, 0, c->cur>>>(loss, (bf16 *)logits, targets, V, VR, scale);
    else
        k_xent_fused<float><<<N, 512, 0, c->cur>>>(loss, (float *)logits, targets, V, VR, scale);
    return LAUNCHED(c, "xent_fused");
}

template <typename T> __global__ void k_xent_max(float *mx, const T *logits, int V, int VR) {
    __shared__ float red[32];
    size_t o = (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) m = fmaxf(m, ldv(logits, o + j));
    m = block_max(m, red);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}
template <typename T>
__global__ void k_xent_sumexp(float *sum, const T *logits, const float *mx, int V, int VR) {
    __shared__ float red[32];
    size_t o = (size_t)blockIdx.x * V;
    float m = mx[blockIdx.x], s = 0;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) s += expf(ldv(logits, o + j) - m);
    s = block_sum(s, red);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}
template <typename T>
__global__ void k_xent_target(float *tgt, const T *logits, const int32_t *targets, int N, int V,
                              int64_t v0, int VR) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int64_t r = (int64_t)targets[i] - v0;
    /* an ignored row is NaN: the tp sum keeps it, k_xent_loss makes it 0 */
    tgt[i] = targets[i] < 0 ? __int_as_float(0x7fc00000) : (r >= 0 && r < VR) ? ldv(logits, (size_t)i * V + r) : 0.0f;
}
__global__ void k_xent_loss(float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) loss[i] = isnan(tgt[i]) ? 0.0f : logf(sum[i]) + mx[i] - tgt[i];
}
template <typename T>
__global__ void k_xent_bwd(T *dlogits, const T *logits, const float *mx, const float *sum,
                           const int32_t *targets, int V, int64_t v0, int VR, float scale) {
    int i = blockIdx.x;
    size_t o = (size_t)i * V;
    float m = mx[i], inv = 1.0f / sum[i];
    int64_t r = (int64_t)targets[i] - v0;
    int ignored = targets[i] < 0; /* no gradient */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = !ignored && j < VR ? expf(ldv(logits, o + j) - m) * inv * scale : 0.0f;
        if (j == r && r < VR) g -= scale;
        stv(dlogits, o + j, g);
    }
}
int tks_cu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_max", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16) k_xent_max<bf16><<<N, 256, 0, c->cur>>>(mx, (const bf16 *)logits, V, VR);
    else k_xent_max<float><<<N, 256, 0, c->cur>>>(mx, (const float *)logits, V, VR);
    return LAUNCHED(c, "xent_max");
}
int tks_cu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                          int V, int VR, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_sumexp", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16) k_xent_sumexp<bf16><<<N, 256, 0, c->cur>>>(sum, (const bf16 *)logits, mx, V, VR);
    else k_xent_sumexp<float><<<N, 256, 0, c->cur>>>(sum, (const float *)logits, mx, V, VR);
    return LAUNCHED(c, "xent_sumexp");
}
int tks_cu_xent_target(tks_backend *be, float *tgt, const void *logits, const int32_t *targets,
                          int N, int V, int64_t v0, int VR, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_target", dt);
    if (N <= 0) return 0;
    unsigned g = (unsigned)((N + 255) / 256);
    if (dt == TKS_BF16) k_xent_target<bf16><<<g, 256, 0, c->cur>>>(tgt, (const bf16 *)logits, targets, N, V, v0, VR);
    else k_xent_target<float><<<g, 256, 0, c->cur>>>(tgt, (const float *)logits, targets, N, V, v0, VR);
    return LAUNCHED(c, "xent_target");
}
int tks_cu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                        const float *tgt, int N) {
    CTX(be);
    STICKY(c);
    if (N <= 0) return 0;
    k_xent_loss<<<(N + 255) / 256, 256, 0, c->cur>>>(loss, mx, sum, tgt, N);
    return LAUNCHED(c, "xent_loss");
}
int tks_cu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
                       const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR,
                       float scale, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_bwd", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16)
        k_xent_bwd<bf16><<<N, 256, 0, c->cur>>>((bf16 *)dlogits, (const bf16 *)logits, mx, sum, targets, V, v0, VR, scale);
    else
        k_xent_bwd<float><<<N, 256, 0, c->cur>>>((float *)dlogits, (const float *)logits, mx, sum, targets, V, v0, VR, scale);
    return LAUNCHED(c, "xent_bwd");
}
