/* cuda_elementwise.cu - the CUDA backend's element-wise (convert, add, scale), deterministic reductions (sum, sum of squares), SwiGLU kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "cuda_kernels.cuh"

/* ---- element-wise ------------------------------------------------------------- */


template <typename D, typename S> __global__ void k_convert(D *dst, const S *src, size_t n) {
    GRID_STRIDE(i, n) stv(dst, i, ldv(src, i));
}
int tks_cu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
                      size_t n) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "convert", ddt);
    CHECK_DT(c, "convert", sdt);
    if (!n) return 0;
    if (ddt == sdt)
        return tks_cu_copy(be, dst, src, n * tks_dtype_size(ddt));
    if (ddt == TKS_BF16)
        k_convert<bf16, float><<<grid_for(n, 256), 256, 0, c->cur>>>((bf16 *)dst, (const float *)src, n);
    else
        k_convert<float, bf16><<<grid_for(n, 256), 256, 0, c->cur>>>((float *)dst, (const bf16 *)src, n);
    return LAUNCHED(c, "convert");
}

template <typename T> __global__ void k_add(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) stv(out, i, ldv(a, i) + ldv(b, i));
}
__global__ void k_scale(float *x, size_t n, float s) { GRID_STRIDE(i, n) x[i] *= s; }

int tks_cu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "add", dt);
    if (!n) return 0;
    if (dt == TKS_BF16)
        k_add<bf16><<<grid_for(n, 256), 256, 0, c->cur>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    else
        k_add<float><<<grid_for(n, 256), 256, 0, c->cur>>>((float *)out, (const float *)a, (const float *)b, n);
    return LAUNCHED(c, "add");
}
int tks_cu_scale(tks_backend *be, float *x, size_t n, float s) {
    CTX(be);
    STICKY(c);
    if (!n) return 0;
    k_scale<<<grid_for(n, 256), 256, 0, c->cur>>>(x, n, s);
    return LAUNCHED(c, "scale");
}

/* ---- deterministic reductions into a device scalar: two stages, no atomics --
 * Stage 1: TKS_NORM_BLOCKS blocks of 256 threads; element i of a span goes to
 * thread (i mod 256*blocks), each thread sums its elements in order, each
 * block reduces in a fixed tree, and the spans add into the same partials in
 * call order. Stage 2: one block adds the partials in a fixed tree. The
 * partition depends only on the sizes, never on the GPU, so the bits depend
 * only on the data. fp64 accumulation, as the contract asks. */
__global__ void k_reduce_stage1(double *part, const float *x, size_t n, int square, int first) {
    __shared__ double sh[32];
    double s = 0;
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        s += square ? v * v : v;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = first ? s : part[blockIdx.x] + s;
}
__global__ void k_reduce_stage2(float *out, const double *part, int nb, int accumulate) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)((accumulate ? (double)out[0] : 0.0) + s);
}
static int reduce(tks_cuda_ctx *c, float *out, const float *x, const tks_span *spans, size_t nspans,
                  int square, int accumulate, const char *op) {
    int first = 1;
    for (size_t k = 0; k < nspans; k++) {
        if (!spans[k].n) continue;
        k_reduce_stage1<<<TKS_NORM_BLOCKS, 256, 0, c->cur>>>(c->d_partial, x + spans[k].off,
                                                            spans[k].n, square, first);
        first = 0;
        if (LAUNCHED(c, op)) return c->err;
    }
    if (first) tks_cuda_check_rt(c, cudaMemsetAsync(c->d_partial, 0, TKS_NORM_BLOCKS * sizeof(double), c->cur), op);
    k_reduce_stage2<<<1, 1024, 0, c->cur>>>(out, c->d_partial, TKS_NORM_BLOCKS, accumulate);
    return LAUNCHED(c, op);
}
int tks_cu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
                    size_t nspans, int accumulate) {
    CTX(be);
    STICKY(c);
    return reduce(c, out, x, spans, nspans, 1, accumulate, "sumsq");
}
int tks_cu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    CTX(be);
    STICKY(c);
    tks_span s = {0, n, 0.0f};
    return reduce(c, out, x, &s, 1, 0, accumulate, "sum");
}

/* ---- SwiGLU over the fused gate|up rows ----------------------------------------- */

template <typename T> __global__ void k_swiglu_fwd(T *out, const T *gu, int F, size_t n) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float g = ldv(gu, r * 2 * F + j), u = ldv(gu, r * 2 * F + F + j);
        stv(out, i, g / (1.0f + expf(-g)) * u);
    }
}
template <typename T> __global__ void k_swiglu_bwd(T *dgu, const T *dout, const T *gu, int F, size_t n) {
    GRID_STRIDE(i, n) {
        size_t r = i / F, j = i % F;
        float g = ldv(gu, r * 2 * F + j), u = ldv(gu, r * 2 * F + F + j), d = ldv(dout, i);
        float s = 1.0f / (1.0f + expf(-g));
        stv(dgu, r * 2 * F + F + j, d * g * s);
        stv(dgu, r * 2 * F + j, d * u * s * (1.0f + g * (1.0f - s)));
    }
}
int tks_cu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "swiglu_fwd", dt);
    size_t n = (size_t)M * F;
    if (!n) return 0;
    if (dt == TKS_BF16)
        k_swiglu_fwd<bf16><<<grid_for(n, 256), 256, 0, c->cur>>>((bf16 *)out, (const bf16 *)gu, F, n);
    else
        k_swiglu_fwd<float><<<grid_for(n, 256), 256, 0, c->cur>>>((float *)out, (const float *)gu, F, n);
    return LAUNCHED(c, "swiglu_fwd");
}
int tks_cu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F,
                         tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "swiglu_bwd", dt);
    size_t n = (size_t)M * F;
    if (!n) return 0;
    if (dt == TKS_BF16)
        k_swiglu_bwd<bf16><<<grid_for(n, 256), 256, 0, c->cur>>>((bf16 *)dgu, (const bf16 *)dout, (const bf16 *)gu, F, n);
    else
        k_swiglu_bwd<float><<<grid_for(n, 256), 256, 0, c->cur>>>((float *)dgu, (const float *)dout, (const float *)gu, F, n);
    return LAUNCHED(c, "swiglu_bwd");
}
