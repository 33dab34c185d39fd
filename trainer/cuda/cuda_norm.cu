/* cuda_norm.cu - the CUDA backend's RMSNorm kernels, and the residual add
 * fused with the forward (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- RMSNorm -------------------------------------------------------------------- */

/* The end of a forward row o (x: its input) from its threads' partial sums
 * of squares ss: the block's sum, the row's rstd, and out = x * rstd * w. */
template <typename T>
__device__ void rmsnorm_row_out(T *out, float *rstd, const T *x, const T *w, size_t o, int C, float eps,
                                float ss, float *sh) {
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < C; j += blockDim.x) stv(out, o + j, ldv(x, o + j) * r * ldv(w, j));
}
template <typename T>
__global__ void k_rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int C, float eps) {
    __shared__ float sh[32];
    size_t o = (size_t)blockIdx.x * C;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float v = ldv(x, o + j);
        ss += v * v;
    }
    rmsnorm_row_out(out, rstd, x, w, o, C, eps, ss, sh);
}
/* add_rmsnorm_fwd: k_add's sum, rounded to T as k_add stores it, then
 * k_rmsnorm_fwd's row over those stored values, with the same thread
 * partition and tree; each thread reads back only the elements it wrote, so
 * res may alias a or b. */
template <typename T>
__global__ void k_add_rmsnorm_fwd(T *res, T *out, float *rstd, const T *a, const T *b, const T *w,
                                  int C, float eps) {
    __shared__ float sh[32];
    size_t o = (size_t)blockIdx.x * C;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float v = rounded(res, ldv(a, o + j) + ldv(b, o + j));
        stv(res, o + j, v);
        ss += v * v;
    }
    rmsnorm_row_out(out, rstd, (const T *)res, w, o, C, eps, ss, sh);
}
template <typename T>
__global__ void k_rmsnorm_bwd_dx(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                                 int C) {
    __shared__ float sh[32];
    size_t o = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x], dot = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) dot += ldv(dout, o + j) * ldv(w, j) * ldv(x, o + j);
    dot = block_sum(dot, sh);
    float k = dot * r * r * r / (float)C;
    for (int j = threadIdx.x; j < C; j += blockDim.x)
        stv(dx, o + j, ldv(dx, o + j) + ldv(dout, o + j) * ldv(w, j) * r - k * ldv(x, o + j));
}
/* dw: one thread per column, rows in order into a local sum added once (the
 * fallback when no workspace is set) */
template <typename T>
__global__ void k_rmsnorm_bwd_dw(float *dw, const T *dout, const T *x, const float *rstd, int N, int C) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    float s = 0;
    for (int i = 0; i < N; i++) s += ldv(dout, (size_t)i * C + col) * ldv(x, (size_t)i * C + col) * rstd[i];
    dw[col] += s;
}
/* dw in two stages over a partition that depends only on N (deterministic on
 * any GPU, no atomics): stage 1, block (column tile, chunk k) sums rows
 * [k*rows, min(N, (k+1)*rows)) of its columns in row order into
 * part[k][col]; stage 2 adds the chunks in chunk order to dw. One thread per
 * column walking all N rows left most of the GPU idle (C / 128 blocks, one
 * dependent load chain of N rows each). part: RMS_DW_CHUNKS x C floats of
 * the workspace (cu_workspace_bytes counts them). */
template <typename T>
__global__ void k_rmsnorm_bwd_dw_part(float *__restrict__ part, const T *__restrict__ dout,
                                      const T *__restrict__ x, const float *__restrict__ rstd,
                                      int N, int C, int rows) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    int r0 = (int)blockIdx.y * rows, r1 = r0 + rows < N ? r0 + rows : N;
    float s = 0;
#pragma unroll 4
    for (int i = r0; i < r1; i++) s += ldv(dout, (size_t)i * C + col) * ldv(x, (size_t)i * C + col) * rstd[i];
    part[(size_t)blockIdx.y * C + col] = s;
}
__global__ void k_rmsnorm_bwd_dw_sum(float *dw, const float *part, int chunks, int C) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    float s = 0;
    for (int k = 0; k < chunks; k++) s += part[(size_t)k * C + col];
    dw[col] += s;
}
/* One pass (TKS_CUDA_NORM_ONEPASS; unverified on a GPU): block k takes rows
 * [k rows, (k+1) rows) in order; per row, the dot (k_rmsnorm_bwd_dx's
 * partition and tree, so dx has its bits), then dx and the row's dw terms
 * from the same loads (the second read of the row's dout and x is from L1
 * or L2, not memory); each thread adds its columns' terms over the chunk's
 * rows in row order into acc (shared, C floats; a column is one thread's),
 * written to part[k] at the end, which k_rmsnorm_bwd_dw_sum adds in chunk
 * order. Memory traffic: dout, x, dx read once and dx written once (4 N C
 * elements) against the two-kernel form's 6 N C. */
template <typename T>
__global__ void k_rmsnorm_bwd_onepass(T *dx, float *__restrict__ part, const T *dout, const T *x, const T *w,
                                      const float *rstd, int N, int C, int rows) {
    extern __shared__ float acc[];
    __shared__ float sh[32];
    for (int j = threadIdx.x; j < C; j += blockDim.x) acc[j] = 0.0f;
    int r0 = (int)blockIdx.x * rows, r1 = r0 + rows < N ? r0 + rows : N;
    for (int i = r0; i < r1; i++) {
        size_t o = (size_t)i * C;
        float r = rstd[i], dot = 0;
        for (int j = threadIdx.x; j < C; j += blockDim.x) dot += ldv(dout, o + j) * ldv(w, j) * ldv(x, o + j);
        dot = block_sum(dot, sh);
        float k = dot * r * r * r / (float)C;
        for (int j = threadIdx.x; j < C; j += blockDim.x) {
            float d = ldv(dout, o + j), xv = ldv(x, o + j);
            stv(dx, o + j, ldv(dx, o + j) + d * ldv(w, j) * r - k * xv);
            acc[j] += d * xv * r;
        }
    }
    for (int j = threadIdx.x; j < C; j += blockDim.x) part[(size_t)blockIdx.x * C + j] = acc[j];
}
/* 1 when it ran; 0 when the workspace or shared memory cannot hold it (the
 * two-kernel form runs instead) */
template <typename T>
static int rmsnorm_bwd_onepass(tks_cuda_ctx *c, T *dx, float *dw, const T *dout, const T *x, const T *w,
                               const float *rstd, int N, int C) {
    size_t row_bytes = (size_t)C * sizeof(float), fit = c->ws ? c->ws_bytes / row_bytes : 0;
    if (row_bytes > 48 * 1024 || fit < 1) return 0;
    size_t most = fit < (size_t)RMS_ONEPASS_CHUNKS ? fit : (size_t)RMS_ONEPASS_CHUNKS;
    int rows = (int)(((size_t)N + most - 1) / most), chunks = (N + rows - 1) / rows;
    float *part = (float *)c->ws;
    k_rmsnorm_bwd_onepass<T><<<(unsigned)chunks, 256, row_bytes, c->cur>>>(dx, part, dout, x, w, rstd, N, C, rows);
    k_rmsnorm_bwd_dw_sum<<<(unsigned)((C + 127) / 128), 128, 0, c->cur>>>(dw, part, chunks, C);
    return 1;
}
template <typename T>
static void rmsnorm_dw(tks_cuda_ctx *c, float *dw, const T *dout, const T *x, const float *rstd,
                       int N, int C) {
    int rows = (N + RMS_DW_CHUNKS - 1) / RMS_DW_CHUNKS, chunks = (N + rows - 1) / rows;
    size_t need = (size_t)chunks * (size_t)C * sizeof(float);
    unsigned tiles = (unsigned)((C + 127) / 128);
    if (!c->ws || c->ws_bytes < need) {
        k_rmsnorm_bwd_dw<T><<<tiles, 128, 0, c->cur>>>(dw, dout, x, rstd, N, C);
        return;
    }
    float *part = (float *)c->ws;
    k_rmsnorm_bwd_dw_part<T><<<dim3(tiles, (unsigned)chunks), 128, 0, c->cur>>>(part, dout, x, rstd, N, C, rows);
    k_rmsnorm_bwd_dw_sum<<<tiles, 128, 0, c->cur>>>(dw, part, chunks, C);
}
int tks_cu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                          int N, int C, float eps, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rmsnorm_fwd", dt);
    if (N <= 0) return 0;
    BY_DT(dt, E, k_rmsnorm_fwd<E><<<N, 256, 0, c->cur>>>((E *)out, rstd, (const E *)x, (const E *)w, C, eps));
    return LAUNCHED(c, "rmsnorm_fwd");
}
int tks_cu_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a,
                           const void *b, const void *w, int N, int C, float eps, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "add_rmsnorm_fwd", dt);
    if (N <= 0) return 0;
    BY_DT(dt, E, k_add_rmsnorm_fwd<E><<<N, 256, 0, c->cur>>>((E *)res, (E *)out, rstd, (const E *)a, (const E *)b,
                                                             (const E *)w, C, eps));
    return LAUNCHED(c, "add_rmsnorm_fwd");
}
int tks_cu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                          const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rmsnorm_bwd", dt);
    if (N <= 0) return 0;
    if (c->norm_onepass &&
        (dt == TKS_BF16 ? rmsnorm_bwd_onepass<bf16>(c, (bf16 *)dx, dw, (const bf16 *)dout, (const bf16 *)x,
                                                    (const bf16 *)w, rstd, N, C)
                        : rmsnorm_bwd_onepass<float>(c, (float *)dx, dw, (const float *)dout, (const float *)x,
                                                     (const float *)w, rstd, N, C)))
        return LAUNCHED(c, "rmsnorm_bwd");
    BY_DT(dt, E, {
        k_rmsnorm_bwd_dx<E><<<N, 256, 0, c->cur>>>((E *)dx, (const E *)dout, (const E *)x, (const E *)w, rstd, C);
        rmsnorm_dw<E>(c, dw, (const E *)dout, (const E *)x, rstd, N, C);
    });
    return LAUNCHED(c, "rmsnorm_bwd");
}
