/* cuda_embedding.cu - the CUDA backend's token embedding kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "cuda_kernels.cuh"

/* ---- embedding ----------------------------------------------------------------- */

template <typename T>
__global__ void k_embedding_fwd(T *out, const int32_t *ids, const T *w, int C, int64_t v0, int V) {
    int i = blockIdx.x;
    int64_t r = (int64_t)ids[i] - v0;
    size_t o = (size_t)i * C;
    if (r >= 0 && r < V) {
        for (int j = threadIdx.x; j < C; j += blockDim.x) out[o + j] = w[(size_t)r * C + j];
    } else {
        for (int j = threadIdx.x; j < C; j += blockDim.x) stv(out, o + j, 0.0f);
    }
}
/* Deterministic: one thread per column walks the rows in id order (the CPU
 * reference's order); reads of dout are coalesced across the warp. */
template <typename T>
__global__ void k_embedding_bwd(float *__restrict__ dw, const T *__restrict__ dout,
                                const int32_t *__restrict__ ids, int N, int C, int64_t v0, int V) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    /* unrolled so that the loads of later rows are in flight while a row's
     * read-modify-write of dw completes (the adds stay in row order) */
#pragma unroll 4
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < V) dw[(size_t)r * C + col] += ldv(dout, (size_t)i * C + col);
    }
}
int tks_cu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                            int C, int64_t v0, int V, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "embedding_fwd", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16)
        k_embedding_fwd<bf16><<<N, 256, 0, c->cur>>>((bf16 *)out, ids, (const bf16 *)w, C, v0, V);
    else
        k_embedding_fwd<float><<<N, 256, 0, c->cur>>>((float *)out, ids, (const float *)w, C, v0, V);
    return LAUNCHED(c, "embedding_fwd");
}
int tks_cu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N,
                            int C, int64_t v0, int V, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "embedding_bwd", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16)
        k_embedding_bwd<bf16><<<(C + 127) / 128, 128, 0, c->cur>>>(dw, (const bf16 *)dout, ids, N, C, v0, V);
    else
        k_embedding_bwd<float><<<(C + 127) / 128, 128, 0, c->cur>>>(dw, (const float *)dout, ids, N, C, v0, V);
    return LAUNCHED(c, "embedding_bwd");
}
