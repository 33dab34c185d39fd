/* cuda_backend.cu - backend.h on an NVIDIA GPU: memory and stream, the
 * element-wise and row kernels, the reference attention, AdamW, and the bf16
 * mixed-precision ops of cuda.h. GEMMs are in cuda_gemm.cu.
 *
 * Formulas and their sources are in backend.h; each kernel follows the CPU
 * reference's operation order where that order is part of a guarantee
 * (embedding and RMSNorm weight gradients sum rows in id order, so they are
 * deterministic; AdamW uses torch.optim.AdamW's order). Reductions inside a
 * row use a fixed tree, so two runs give the same bits (no atomics anywhere).
 *
 * Legend (backend.h): B batch, T sequence, N = B*T rows, C dim, NH query
 * heads, NKV kv heads, HD head dim, V vocab columns of a shard, VR real ones.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "common/tks.h"
#include "cuda_internal.h"

/* ---- errors ------------------------------------------------------------------ */

int tks_cuda_fail(tks_cuda_ctx *c, const char *op, const char *reason) {
    if (!c->err) {
        c->err = TKS_ERR_IO;
        snprintf(c->err_msg, sizeof c->err_msg,
                 "CUDA backend: %s failed on device %d: %s; later ops were skipped. Rerun with "
                 "CUDA_LAUNCH_BLOCKING=1 to find the failing kernel, or --device cpu",
                 op, c->device, reason);
    }
    return 1;
}

int tks_cuda_check_rt(tks_cuda_ctx *c, cudaError_t e, const char *op) {
    if (e == cudaSuccess) return 0;
    if (e == cudaErrorMemoryAllocation && !c->err) {
        c->err = TKS_ERR_NOMEM;
        snprintf(c->err_msg, sizeof c->err_msg, "CUDA backend: %s: out of device memory", op);
        return 1;
    }
    return tks_cuda_fail(c, op, cudaGetErrorString(e));
}

int tks_cuda_check_blas(tks_cuda_ctx *c, cublasStatus_t s, const char *op) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return tks_cuda_fail(c, op, cublasGetStatusString(s));
}

/* After each launch: a bad configuration is reported here, a fault at sync. */
#define LAUNCHED(c, op) tks_cuda_check_rt((c), cudaGetLastError(), (op))
#define CTX(be) tks_cuda_ctx *c = tks_cuda_ctx_of(be)
#define SKIP_IF_FAILED(c) \
    if ((c)->err) return

static unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g > 65535u * 16 ? 65535u * 16 : (g ? g : 1));
}

/* ---- block reductions (fixed tree: warp shuffles, then warp 0) -------------- */

template <typename T> __device__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* every thread of the block gets the sum; `sh` holds 32 values */
template <typename T> __device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    r = warp_sum(r);
    return r;
}
__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

/* ---- memory -------------------------------------------------------------------- */

static void *cu_alloc(tks_backend *be, size_t bytes) {
    CTX(be);
    if (c->err) return NULL;
    void *p = NULL;
    size_t n = (bytes + 255) & ~(size_t)255;
    cudaError_t e = cudaMalloc(&p, n ? n : 256);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky for CUDA */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        /* name the biggest buffers so the message says what to shrink */
        size_t big[3] = {0, 0, 0};
        for (int i = 0; i < c->nallocs; i++) {
            size_t b = c->allocs[i].bytes;
            for (int k = 0; k < 3; k++)
                if (b > big[k]) {
                    for (int j = 2; j > k; j--) big[j] = big[j - 1];
                    big[k] = b;
                    break;
                }
        }
        tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                 "CUDA backend: out of device memory allocating %.1f MiB on device %d (%.1f MiB "
                 "allocated by tokshard, largest buffers %.1f, %.1f, %.1f MiB; %.1f of %.1f MiB "
                 "free): lower --micro-batch or --seq-len, or use more GPUs with --dp-shard/--tp",
                 (double)bytes / 1048576.0, c->device, (double)c->bytes_now / 1048576.0,
                 (double)big[0] / 1048576.0, (double)big[1] / 1048576.0,
                 (double)big[2] / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0);
        return NULL;
    }
    if (tks_cuda_check_rt(c, cudaMemsetAsync(p, 0, n ? n : 256, c->stream), "alloc (zero fill)")) {
        cudaFree(p);
        return NULL;
    }
    if (c->nallocs < TKS_MAX_ALLOCS) {
        c->allocs[c->nallocs].p = p;
        c->allocs[c->nallocs].bytes = n;
        c->nallocs++;
    }
    c->bytes_now += n;
    if (c->bytes_now > c->bytes_peak) c->bytes_peak = c->bytes_now;
    return p;
}

static void cu_free(tks_backend *be, void *p) {
    CTX(be);
    if (!p) return;
    for (int i = 0; i < c->nallocs; i++)
        if (c->allocs[i].p == p) {
            c->bytes_now -= c->allocs[i].bytes;
            c->allocs[i] = c->allocs[--c->nallocs];
            break;
        }
    cudaStreamSynchronize(c->stream);
    cudaFree(p);
}

static void cu_upload(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    SKIP_IF_FAILED(c);
    /* pageable source: the copy has read it when the call returns */
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
}
static void cu_download(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    if (c->err) {
        memset(dst, 0xff, bytes); /* NaN, never stale data that looks valid */
        return;
    }
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download");
    tks_cuda_check_rt(c, cudaStreamSynchronize(c->stream), "download (stream sync)");
}
static void cu_memzero(tks_backend *be, void *p, size_t bytes) {
    CTX(be);
    SKIP_IF_FAILED(c);
    tks_cuda_check_rt(c, cudaMemsetAsync(p, 0, bytes, c->stream), "memzero");
}
static void cu_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    SKIP_IF_FAILED(c);
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
}
static void cu_sync(tks_backend *be) {
    CTX(be);
    SKIP_IF_FAILED(c);
    tks_cuda_check_rt(c, cudaStreamSynchronize(c->stream), "sync");
}

static void cu_gemm(tks_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C,
                    int ldc) {
    tks_cuda_gemm_f32(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- element-wise ------------------------------------------------------------- */

__global__ void k_add(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}
__global__ void k_scale(float *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
static void cu_add(tks_backend *be, float *out, const float *a, const float *b, size_t n) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_add<<<grid_for(n, 256), 256, 0, c->stream>>>(out, a, b, n);
    LAUNCHED(c, "add");
}
static void cu_scale(tks_backend *be, float *x, size_t n, float s) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_scale<<<grid_for(n, 256), 256, 0, c->stream>>>(x, n, s);
    LAUNCHED(c, "scale");
}

/* ---- deterministic sum of squares: two stages, no atomics ------------------- */
/* Stage 1: TKS_NORM_BLOCKS blocks; block b owns the elements i with
 * (i / 256) % TKS_NORM_BLOCKS == b, walks them in order, reduces in a fixed
 * tree. Stage 2: one block adds the partials in a fixed tree. The partition
 * depends only on n, so the bits depend only on the data. Several tensors
 * accumulate into the same partials in call order (global norm). */
__global__ void k_sumsq_stage1(double *part, const float *x, size_t n, int accumulate) {
    __shared__ double sh[32];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = accumulate ? part[blockIdx.x] + s : s;
}
__global__ void k_sumsq_stage2(double *res, float *out, const double *part, int nb, float max_norm) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        if (res) *res = s;
        if (out) {
            float norm = (float)sqrt(s);
            out[0] = norm;
            out[1] = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
        }
    }
}
static double cu_sumsq(tks_backend *be, const float *x, size_t n) {
    CTX(be);
    if (c->err) return NAN;
    k_sumsq_stage1<<<TKS_NORM_BLOCKS, 256, 0, c->stream>>>(c->d_partial, x, n, 0);
    LAUNCHED(c, "sumsq (stage 1)");
    k_sumsq_stage2<<<1, 1024, 0, c->stream>>>(c->d_partial + TKS_NORM_BLOCKS, NULL, c->d_partial,
                                              TKS_NORM_BLOCKS, 0);
    LAUNCHED(c, "sumsq (stage 2)");
    tks_cuda_check_rt(c, cudaMemcpyAsync(c->h_result, c->d_partial + TKS_NORM_BLOCKS, sizeof(double),
                                         cudaMemcpyDeviceToHost, c->stream), "sumsq (download)");
    tks_cuda_check_rt(c, cudaStreamSynchronize(c->stream), "sumsq (sync)");
    return c->err ? NAN : *c->h_result;
}

extern "C" void tks_cuda_global_norm(tks_backend *be, float *out, const float *const *x,
                                     const size_t *n, int count, float max_norm) {
    CTX(be);
    SKIP_IF_FAILED(c);
    cudaMemsetAsync(c->d_partial, 0, TKS_NORM_BLOCKS * sizeof(double), c->stream);
    for (int k = 0; k < count; k++) {
        if (!n[k]) continue;
        k_sumsq_stage1<<<TKS_NORM_BLOCKS, 256, 0, c->stream>>>(c->d_partial, x[k], n[k], 1);
        LAUNCHED(c, "global_norm (stage 1)");
    }
    k_sumsq_stage2<<<1, 1024, 0, c->stream>>>(NULL, out, c->d_partial, TKS_NORM_BLOCKS, max_norm);
    LAUNCHED(c, "global_norm (stage 2)");
}

/* ---- embedding ----------------------------------------------------------------- */

__global__ void k_embedding_fwd(float *out, const int32_t *ids, const float *w, int C, int64_t v0,
                                int V) {
    int i = blockIdx.x;
    int64_t r = (int64_t)ids[i] - v0;
    float *o = out + (size_t)i * C;
    if (r >= 0 && r < V) {
        const float *src = w + (size_t)r * C;
        for (int j = threadIdx.x; j < C; j += blockDim.x) o[j] = src[j];
    } else {
        for (int j = threadIdx.x; j < C; j += blockDim.x) o[j] = 0.0f;
    }
}
/* Deterministic: one thread per column walks the rows in id order, the same
 * order as the CPU reference (so the result is bitwise the CPU's). Reads of
 * dout are coalesced across the warp (consecutive columns). */
__global__ void k_embedding_bwd(float *dw, const float *dout, const int32_t *ids, int N, int C,
                                int64_t v0, int V) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < V) dw[(size_t)r * C + col] += dout[(size_t)i * C + col];
    }
}
static void cu_embedding_fwd(tks_backend *be, float *out, const int32_t *ids, const float *w,
                             int N, int C, int64_t v0, int V) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_embedding_fwd<<<N, 256, 0, c->stream>>>(out, ids, w, C, v0, V);
    LAUNCHED(c, "embedding_fwd");
}
static void cu_embedding_bwd(tks_backend *be, float *dw, const float *dout, const int32_t *ids,
                             int N, int C, int64_t v0, int V) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_embedding_bwd<<<(C + 127) / 128, 128, 0, c->stream>>>(dw, dout, ids, N, C, v0, V);
    LAUNCHED(c, "embedding_bwd");
}

/* ---- RMSNorm -------------------------------------------------------------------- */

__global__ void k_rmsnorm_fwd(float *out, uint16_t *out16, float *rstd, float *res, const float *x,
                              const float *w, int C, float eps) {
    __shared__ float sh[32];
    int i = blockIdx.x;
    float *xi = res + (size_t)i * C;
    const float *add = x ? x + (size_t)i * C : NULL;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float v = xi[j];
        if (add) xi[j] = v = v + add[j];
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[i] = r;
    float *o = out ? out + (size_t)i * C : NULL;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float y = xi[j] * r * w[j];
        if (o) o[j] = y;
        if (out16) {
            __nv_bfloat16 b = __float2bfloat16_rn(y);
            out16[(size_t)i * C + j] = *(uint16_t *)&b;
        }
    }
}
__global__ void k_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                                 const float *rstd, int C) {
    __shared__ float sh[32];
    int i = blockIdx.x;
    const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
    float r = rstd[i], dot = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) dot += gi[j] * w[j] * xi[j];
    dot = block_sum(dot, sh);
    float k = dot * r * r * r / (float)C;
    float *d = dx + (size_t)i * C;
    for (int j = threadIdx.x; j < C; j += blockDim.x) d[j] += gi[j] * w[j] * r - k * xi[j];
}
/* dw: one thread per column, rows in order (the CPU's order) into a local sum
 * added once: deterministic */
__global__ void k_rmsnorm_bwd_dw(float *dw, const float *dout, const float *x, const float *rstd,
                                 int N, int C) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    float s = 0;
    for (int i = 0; i < N; i++) s += dout[(size_t)i * C + col] * x[(size_t)i * C + col] * rstd[i];
    dw[col] += s;
}
static void cu_rmsnorm_fwd(tks_backend *be, float *out, float *rstd, const float *x, const float *w,
                           int N, int C, float eps) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    /* the fused kernel with no residual add reads x through `res` without writing it */
    k_rmsnorm_fwd<<<N, 256, 0, c->stream>>>(out, NULL, rstd, (float *)x, NULL, w, C, eps);
    LAUNCHED(c, "rmsnorm_fwd");
}
extern "C" void tks_cuda_residual_rmsnorm_fwd(tks_backend *be, float *res, float *out,
                                              uint16_t *out16, float *rstd, const float *x,
                                              const float *w, int N, int C, float eps) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_rmsnorm_fwd<<<N, 256, 0, c->stream>>>(out, out16, rstd, res, x, w, C, eps);
    LAUNCHED(c, "residual_rmsnorm_fwd");
}
static void cu_rmsnorm_bwd(tks_backend *be, float *dx, float *dw, const float *dout,
                           const float *x, const float *w, const float *rstd, int N, int C) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_rmsnorm_bwd_dx<<<N, 256, 0, c->stream>>>(dx, dout, x, w, rstd, C);
    LAUNCHED(c, "rmsnorm_bwd (dx)");
    k_rmsnorm_bwd_dw<<<(C + 127) / 128, 128, 0, c->stream>>>(dw, dout, x, rstd, N, C);
    LAUNCHED(c, "rmsnorm_bwd (dw)");
}

/* ---- RoPE (rotate_half; angles in fp32 as Hugging Face computes them) -------- */

__global__ void k_rope(float *x, int T, int H, int HD, int64_t p0, float theta, int inverse,
                       size_t pairs) {
    int half = HD / 2;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < pairs;
         idx += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(idx % half);
        size_t row = idx / half; /* (b, t, h) */
        int t = (int)((row / H) % T);
        float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)HD);
        float a = (float)(p0 + t) * inv_freq;
        float co = cosf(a), si = inverse ? -sinf(a) : sinf(a);
        float *v = x + row * HD;
        float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * co - x2 * si;
        v[j + half] = x2 * co + x1 * si;
    }
}
static void cu_rope(tks_backend *be, float *x, int B, int T, int H, int HD, int64_t p0,
                    float theta, int inverse) {
    CTX(be);
    SKIP_IF_FAILED(c);
    size_t pairs = (size_t)B * T * H * (HD / 2);
    if (!pairs) return;
    k_rope<<<grid_for(pairs, 256), 256, 0, c->stream>>>(x, T, H, HD, p0, theta, inverse, pairs);
    LAUNCHED(c, "rope");
}

/* ---- attention: the fp32 reference kernels ------------------------------------
 * One block per query row (b, h, t); the row's scores live in shared memory
 * (T floats), warps split the keys, lanes the head dimension. Quadratic in
 * work like the CPU reference, and like it materializes probs[B,NH,T,T] (the
 * v1 contract); the fast path is cuDNN's flash attention (cuda.h). */

enum { ATT_THREADS = 128 };

/* s[u] = scale * q . k_u for u <= t, by warps; k rows `ks` floats apart */
__device__ void att_scores(float *s, const float *q, const float *k, size_t ks, int t, int HD,
                           float scale) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int u = w; u <= t; u += nw) {
        const float *ku = k + (size_t)u * ks;
        float d = 0;
        for (int e = lane; e < HD; e += 32) d += q[e] * ku[e];
        d = warp_sum(d);
        if (lane == 0) s[u] = d * scale;
    }
    __syncthreads();
}
/* softmax of s[0..t] in place; returns nothing, s holds probabilities */
__device__ void att_softmax(float *s, int t, float *red) {
    float mx = -INFINITY;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) mx = fmaxf(mx, s[u]);
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) sum += (s[u] = expf(s[u] - mx));
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) s[u] *= inv;
    __syncthreads();
}

__global__ void k_attention_fwd(float *out, float *probs, const float *q, const float *k,
                                const float *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const float *Q = q + ((size_t)b * T + t) * qs + (size_t)h * HD;
    const float *K = k + (size_t)b * T * ks + (size_t)g * HD;
    const float *Vv = v + (size_t)b * T * ks + (size_t)g * HD;
    att_scores(s, Q, K, ks, t, HD, 1.0f / sqrtf((float)HD));
    att_softmax(s, t, red);
    float *P = probs + (((size_t)b * NH + h) * T + t) * T;
    for (int u = threadIdx.x; u < T; u += blockDim.x) P[u] = u <= t ? s[u] : 0.0f;
    float *O = out + ((size_t)b * T + t) * qs + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += s[u] * Vv[(size_t)u * ks + e];
        O[e] = o;
    }
}

/* Backward, stage 1 per query row: dP = dO V^T, D = rowsum(P o dP),
 * dS = P o (dP - D) * scale, dQ = dS K; D saved for stage 2. */
__global__ void k_attention_bwd_q(float *dq, float *Dsave, const float *dout, const float *probs,
                                  const float *k, const float *v, int T, int NH, int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const float *dO = dout + ((size_t)b * T + t) * qs + (size_t)h * HD;
    const float *K = k + (size_t)b * T * ks + (size_t)g * HD;
    const float *Vv = v + (size_t)b * T * ks + (size_t)g * HD;
    const float *P = probs + (((size_t)b * NH + h) * T + t) * T;
    att_scores(s, dO, Vv, ks, t, HD, 1.0f); /* s = dP */
    float dot = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) dot += P[u] * s[u];
    dot = block_sum(dot, red);
    float scale = 1.0f / sqrtf((float)HD);
    for (int u = threadIdx.x; u <= t; u += blockDim.x) s[u] = P[u] * (s[u] - dot) * scale;
    if (threadIdx.x == 0) Dsave[((size_t)b * NH + h) * T + t] = dot;
    __syncthreads();
    float *dQ = dq + ((size_t)b * T + t) * qs + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float a = 0;
        for (int u = 0; u <= t; u++) a += s[u] * K[(size_t)u * ks + e];
        dQ[e] = a;
    }
}

/* Backward, stage 2 per key row (b, g, u): over the group's query heads and
 * t >= u, dV[u] = sum P[t,u] dO[t], dK[u] = sum dS[t,u] Q[t] with
 * dS[t,u] = P[t,u] (dO[t].V[u] - D[t]) scale. Warp w takes t = u + w (mod nw),
 * its lane the head dims; per-warp partials in shared memory are added in warp
 * order at the end (deterministic). Shared: 2 * nw * HD floats. */
__global__ void k_attention_bwd_kv(float *dk, float *dv, const float *dout, const float *probs,
                                   const float *Dsave, const float *q, const float *v, int T,
                                   int NH, int NKV, int HD) {
    extern __shared__ float acc[]; /* [nw][HD] dK, then [nw][HD] dV */
    int u = blockIdx.x, g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    float *aK = acc + (size_t)w * HD, *aV = acc + (size_t)(nw + w) * HD;
    for (int e = lane; e < HD; e += 32) aK[e] = aV[e] = 0;
    const float *Vu = v + ((size_t)b * T + u) * ks + (size_t)g * HD;
    float scale = 1.0f / sqrtf((float)HD);
    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *Pbase = probs + ((size_t)b * NH + h) * T * (size_t)T;
        const float *Db = Dsave + ((size_t)b * NH + h) * T;
        for (int t = u + w; t < T; t += nw) {
            const float *dO = dout + ((size_t)b * T + t) * qs + (size_t)h * HD;
            const float *Q = q + ((size_t)b * T + t) * qs + (size_t)h * HD;
            float p = Pbase[(size_t)t * T + u];
            float d = 0;
            for (int e = lane; e < HD; e += 32) d += dO[e] * Vu[e];
            d = warp_sum(d);
            float ds = p * (d - Db[t]) * scale;
            for (int e = lane; e < HD; e += 32) {
                aV[e] += p * dO[e];
                aK[e] += ds * Q[e];
            }
        }
    }
    __syncthreads();
    float *dK = dk + ((size_t)b * T + u) * ks + (size_t)g * HD;
    float *dV = dv + ((size_t)b * T + u) * ks + (size_t)g * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float sk = 0, sv = 0;
        for (int i = 0; i < nw; i++) {
            sk += acc[(size_t)i * HD + e];
            sv += acc[(size_t)(nw + i) * HD + e];
        }
        dK[e] = sk;
        dV[e] = sv;
    }
}

/* decode: one block per head, scores over the cache rows 0..t */
__global__ void k_attention_step(float *out, const float *q, const float *kc, const float *vc,
                                 int t, int NH, int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int h = blockIdx.x, g = h / (NH / NKV);
    size_t ks = (size_t)NKV * HD;
    att_scores(s, q + (size_t)h * HD, kc + (size_t)g * HD, ks, t, HD, 1.0f / sqrtf((float)HD));
    att_softmax(s, t, red);
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += s[u] * vc[(size_t)u * ks + (size_t)g * HD + e];
        out[(size_t)h * HD + e] = o;
    }
}

static int att_smem(tks_cuda_ctx *c, const void *fn, size_t bytes, const char *op) {
    if (bytes <= 48 * 1024) return 0;
    if (bytes > (size_t)c->prop.sharedMemPerBlockOptin) {
        char why[200];
        snprintf(why, sizeof why,
                 "sequence too long for the reference attention kernel (%zu bytes of shared "
                 "memory per row, device allows %zu): use a shorter --seq-len",
                 bytes, (size_t)c->prop.sharedMemPerBlockOptin);
        return tks_cuda_fail(c, op, why);
    }
    return tks_cuda_check_rt(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)bytes), op);
}

static int scratch_reserve(tks_cuda_ctx *c, size_t bytes, const char *op) {
    if (c->scratch_bytes >= bytes) return 0;
    cudaStreamSynchronize(c->stream);
    cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (tks_cuda_check_rt(c, cudaMalloc(&c->scratch, bytes), op)) return 1;
    c->scratch_bytes = bytes;
    return 0;
}

static void cu_attention_fwd(tks_backend *be, float *out, float *probs, const float *q,
                             const float *k, const float *v, int B, int T, int NH, int NKV,
                             int HD) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (B <= 0 || T <= 0) return;
    size_t sm = (size_t)T * sizeof(float);
    if (att_smem(c, (const void *)k_attention_fwd, sm, "attention_fwd")) return;
    k_attention_fwd<<<dim3(T, NH, B), ATT_THREADS, sm, c->stream>>>(out, probs, q, k, v, T, NH, NKV, HD);
    LAUNCHED(c, "attention_fwd");
}

static void cu_attention_bwd(tks_backend *be, float *dq, float *dk, float *dv, const float *dout,
                             const float *probs, const float *q, const float *k, const float *v,
                             int B, int T, int NH, int NKV, int HD) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (B <= 0 || T <= 0) return;
    if (scratch_reserve(c, (size_t)B * NH * T * sizeof(float), "attention_bwd (scratch)")) return;
    float *D = (float *)c->scratch;
    size_t sm = (size_t)T * sizeof(float);
    if (att_smem(c, (const void *)k_attention_bwd_q, sm, "attention_bwd")) return;
    k_attention_bwd_q<<<dim3(T, NH, B), ATT_THREADS, sm, c->stream>>>(dq, D, dout, probs, k, v, T,
                                                                      NH, NKV, HD);
    LAUNCHED(c, "attention_bwd (dq)");
    size_t sm2 = 2 * (ATT_THREADS / 32) * (size_t)HD * sizeof(float);
    if (att_smem(c, (const void *)k_attention_bwd_kv, sm2, "attention_bwd")) return;
    k_attention_bwd_kv<<<dim3(T, NKV, B), ATT_THREADS, sm2, c->stream>>>(dk, dv, dout, probs, D, q,
                                                                         v, T, NH, NKV, HD);
    LAUNCHED(c, "attention_bwd (dk, dv)");
}

static void cu_attention_step(tks_backend *be, float *out, const float *q, const float *kc,
                              const float *vc, int t, int NH, int NKV, int HD) {
    CTX(be);
    SKIP_IF_FAILED(c);
    size_t sm = (size_t)(t + 1) * sizeof(float);
    if (att_smem(c, (const void *)k_attention_step, sm, "attention_step")) return;
    k_attention_step<<<NH, ATT_THREADS, sm, c->stream>>>(out, q, kc, vc, t, NH, NKV, HD);
    LAUNCHED(c, "attention_step");
}

/* ---- SwiGLU -------------------------------------------------------------------- */

__global__ void k_swiglu_fwd(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
__global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dout[i];
        float u = up[i];
        dup[i] = d * g * s;
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    }
}
static void cu_swiglu_fwd(tks_backend *be, float *out, const float *gate, const float *up, size_t n) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_swiglu_fwd<<<grid_for(n, 256), 256, 0, c->stream>>>(out, gate, up, n);
    LAUNCHED(c, "swiglu_fwd");
}
static void cu_swiglu_bwd(tks_backend *be, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_swiglu_bwd<<<grid_for(n, 256), 256, 0, c->stream>>>(dgate, dup, dout, gate, up, n);
    LAUNCHED(c, "swiglu_bwd");
}

/* ---- cross-entropy (staged, vocab-parallel) --------------------------------- */

__global__ void k_xent_max(float *mx, const float *logits, int V, int VR) {
    __shared__ float red[32];
    const float *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_max(m, red);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}
__global__ void k_xent_sumexp(float *sum, const float *logits, const float *mx, int V, int VR) {
    __shared__ float red[32];
    const float *l = logits + (size_t)blockIdx.x * V;
    float m = mx[blockIdx.x], s = 0;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) s += expf(l[j] - m);
    s = block_sum(s, red);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}
__global__ void k_xent_target(float *tgt, const float *logits, const int32_t *targets, int N, int V,
                              int64_t v0, int VR) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int64_t r = (int64_t)targets[i] - v0;
    tgt[i] = (r >= 0 && r < VR) ? logits[(size_t)i * V + r] : 0.0f;
}
__global__ void k_xent_loss(float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) loss[i] = logf(sum[i]) + mx[i] - tgt[i];
}
__global__ void k_xent_bwd(float *dlogits, const float *logits, const float *mx, const float *sum,
                           const int32_t *targets, int V, int64_t v0, int VR, float scale) {
    int i = blockIdx.x;
    const float *l = logits + (size_t)i * V;
    float *d = dlogits + (size_t)i * V;
    float m = mx[i], inv = 1.0f / sum[i];
    int64_t r = (int64_t)targets[i] - v0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = j < VR ? expf(l[j] - m) * inv * scale : 0.0f;
        if (j == r && r < VR) g -= scale;
        d[j] = g;
    }
}
static void cu_xent_max(tks_backend *be, float *mx, const float *logits, int N, int V, int VR) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_max<<<N, 256, 0, c->stream>>>(mx, logits, V, VR);
    LAUNCHED(c, "xent_max");
}
static void cu_xent_sumexp(tks_backend *be, float *sum, const float *logits, const float *mx, int N,
                           int V, int VR) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_sumexp<<<N, 256, 0, c->stream>>>(sum, logits, mx, V, VR);
    LAUNCHED(c, "xent_sumexp");
}
static void cu_xent_target(tks_backend *be, float *tgt, const float *logits, const int32_t *targets,
                           int N, int V, int64_t v0, int VR) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_target<<<(N + 255) / 256, 256, 0, c->stream>>>(tgt, logits, targets, N, V, v0, VR);
    LAUNCHED(c, "xent_target");
}
static void cu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                         const float *tgt, int N) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_loss<<<(N + 255) / 256, 256, 0, c->stream>>>(loss, mx, sum, tgt, N);
    LAUNCHED(c, "xent_loss");
}
static void cu_xent_bwd(tks_backend *be, float *dlogits, const float *logits, const float *mx,
                        const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR,
                        float scale) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_bwd<<<N, 256, 0, c->stream>>>(dlogits, logits, mx, sum, targets, V, v0, VR, scale);
    LAUNCHED(c, "xent_bwd");
}

/* Fused: one block per row. Pass 1: online softmax (Milakov & Gimelshein 2018)
 * per thread, merged over the block; pass 2 overwrites the row with the
 * gradient. The row's logits are read twice and written once. */
__global__ void k_xent_fused(float *logits, float *loss, const int32_t *targets, int V, int VR,
                             float scale) {
    __shared__ float red[32];
    float *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY, s = 0;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) {
        float x = l[j];
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    float M = block_max(m, red);
    __syncthreads();
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), red);
    int tg = targets[blockIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) loss[blockIdx.x] = logf(S) + M - l[tg];
    __syncthreads();
    float inv = 1.0f / S;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = j < VR ? expf(l[j] - M) * inv * scale : 0.0f;
        if (j == tg) g -= scale;
        l[j] = g;
    }
}
extern "C" void tks_cuda_xent_fused(tks_backend *be, float *logits, float *loss,
                                    const int32_t *targets, int N, int V, int VR, float scale) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (N <= 0) return;
    k_xent_fused<<<N, 512, 0, c->stream>>>(logits, loss, targets, V, VR, scale);
    LAUNCHED(c, "xent_fused");
}

/* ---- AdamW ------------------------------------------------------------------------
 * Same operation order as the CPU backend (torch.optim.AdamW's single-tensor
 * path); the bias corrections are computed on the host exactly as there. */

__global__ void k_adamw(float *p, uint16_t *p16, const float *grad, float *m, float *v, size_t n,
                        float b1, float b2, float eps, float step, float bc2s, float decay,
                        float grad_scale, const float *grad_scale_dev) {
    float gs = grad_scale_dev ? grad_scale_dev[1] : grad_scale;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * gs;
        float mi = m[i] * b1 + g * (1.0f - b1);
        float vi = v[i] * b2 + g * g * (1.0f - b2);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2s + eps;
        float pi = p[i] * decay - step * mi / denom;
        p[i] = pi;
        if (p16) {
            __nv_bfloat16 b = __float2bfloat16_rn(pi);
            p16[i] = *(uint16_t *)&b;
        }
    }
}
static void adamw_launch(tks_backend *be, float *p, uint16_t *p16, const float *grad, float *m,
                         float *v, size_t n, float lr, float b1, float b2, float eps, float wd,
                         int64_t t, float grad_scale, const float *gs_dev) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    float step = lr / bc1, bc2s = sqrtf(bc2), decay = 1.0f - lr * wd;
    k_adamw<<<grid_for(n, 256), 256, 0, c->stream>>>(p, p16, grad, m, v, n, b1, b2, eps, step, bc2s,
                                                     decay, grad_scale, gs_dev);
    LAUNCHED(c, "adamw");
}
static void cu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, int64_t t, float grad_scale) {
    adamw_launch(be, p, NULL, grad, m, v, n, lr, b1, b2, eps, wd, t, grad_scale, NULL);
}
extern "C" void tks_cuda_adamw_flat(tks_backend *be, float *p, uint16_t *p16, const float *grad,
                                    float *m, float *v, size_t n, float lr, float b1, float b2,
                                    float eps, float wd, int64_t t, const float *grad_scale_dev) {
    adamw_launch(be, p, p16, grad, m, v, n, lr, b1, b2, eps, wd, t, 1.0f, grad_scale_dev);
}

/* ---- bf16 conversions ------------------------------------------------------------ */

__global__ void k_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        __nv_bfloat16 b = __float2bfloat16_rn(src[i]);
        dst[i] = *(uint16_t *)&b;
    }
}
__global__ void k_from_bf16(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}
extern "C" void tks_cuda_to_bf16(tks_backend *be, uint16_t *dst, const float *src, size_t n) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_to_bf16<<<grid_for(n, 256), 256, 0, c->stream>>>(dst, src, n);
    LAUNCHED(c, "to_bf16");
}
extern "C" void tks_cuda_from_bf16(tks_backend *be, float *dst, const uint16_t *src, size_t n) {
    CTX(be);
    SKIP_IF_FAILED(c);
    if (!n) return;
    k_from_bf16<<<grid_for(n, 256), 256, 0, c->stream>>>(dst, src, n);
    LAUNCHED(c, "from_bf16");
}

/* ---- creation -------------------------------------------------------------------- */

static void cu_destroy(tks_backend *be) {
    if (!be) return;
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (c) {
        cudaStreamSynchronize(c->stream);
#ifdef TKS_HAVE_CUDNN_FE
        tks_cuda_flash_release(be);
#endif
        tks_cuda_gemm_plans_free(c);
        for (int i = 0; i < c->nallocs; i++) cudaFree(c->allocs[i].p);
        cudaFree(c->workspace);
        cudaFree(c->scratch);
        cudaFree(c->d_partial);
        cudaFreeHost(c->h_result);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int tks_cuda_built(void) { return 1; }

extern "C" int tks_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int pick_device(int device, int count) {
    if (device >= 0) return device;
    const char *e = getenv("TKS_CUDA_DEVICE");
    if (e && *e) return atoi(e);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr && *lr) return atoi(lr) % count;
    return 0;
}

extern "C" int tks_cuda_backend_create(int device, tks_backend **out) {
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "CUDA backend: no CUDA device is usable here (%s); check nvidia-smi and "
                        "CUDA_VISIBLE_DEVICES, or train with --device cpu",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    int dev = pick_device(device, count);
    if (dev < 0 || dev >= count)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "CUDA device %d does not exist (%d visible): set TKS_CUDA_DEVICE to 0..%d",
                        dev, count, count - 1);
    tks_backend *be = (tks_backend *)calloc(1, sizeof *be);
    tks_cuda_ctx *c = (tks_cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of host memory");
    }
    be->ctx = c;
    c->device = dev;
    c->workspace_bytes = 32u << 20; /* cuBLAS's recommendation for Hopper */
    int bad = tks_cuda_check_rt(c, cudaSetDevice(dev), "cudaSetDevice") ||
              tks_cuda_check_rt(c, cudaGetDeviceProperties(&c->prop, dev), "cudaGetDeviceProperties") ||
              tks_cuda_check_rt(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                                "cudaStreamCreate") ||
              tks_cuda_check_blas(c, cublasLtCreate(&c->lt), "cublasLtCreate") ||
              tks_cuda_check_blas(c, cublasCreate(&c->blas), "cublasCreate") ||
              tks_cuda_check_blas(c, cublasSetStream(c->blas, c->stream), "cublasSetStream") ||
              tks_cuda_check_blas(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode") ||
              tks_cuda_check_rt(c, cudaMalloc(&c->workspace, c->workspace_bytes), "workspace") ||
              tks_cuda_check_rt(c, cudaMalloc((void **)&c->d_partial,
                                              (TKS_NORM_BLOCKS + 1) * sizeof(double)), "norm partials") ||
              tks_cuda_check_rt(c, cudaMallocHost((void **)&c->h_result, sizeof(double)), "pinned result");
    if (bad) {
        int code = tks_fail(c->err ? c->err : TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
        cu_destroy(be);
        return code;
    }
    be->name = "cuda";
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->memzero = cu_memzero;
    be->copy = cu_copy;
    be->sync = cu_sync;
    be->gemm = cu_gemm;
    be->add = cu_add;
    be->scale = cu_scale;
    be->sumsq = cu_sumsq;
    be->embedding_fwd = cu_embedding_fwd;
    be->embedding_bwd = cu_embedding_bwd;
    be->rmsnorm_fwd = cu_rmsnorm_fwd;
    be->rmsnorm_bwd = cu_rmsnorm_bwd;
    be->rope = cu_rope;
    be->attention_fwd = cu_attention_fwd;
    be->attention_bwd = cu_attention_bwd;
    be->attention_step = cu_attention_step;
    be->swiglu_fwd = cu_swiglu_fwd;
    be->swiglu_bwd = cu_swiglu_bwd;
    be->xent_max = cu_xent_max;
    be->xent_sumexp = cu_xent_sumexp;
    be->xent_target = cu_xent_target;
    be->xent_loss = cu_xent_loss;
    be->xent_bwd = cu_xent_bwd;
    be->adamw = cu_adamw;
    be->destroy = cu_destroy;
    *out = be;
    return 0;
}

extern "C" int tks_cuda_backend_check(tks_backend *be) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (!c->err) tks_cuda_check_rt(c, cudaStreamSynchronize(c->stream), "stream");
    if (!c->err) return 0;
    return tks_fail(c->err, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
}

extern "C" void tks_cuda_backend_memory(tks_backend *be, size_t *now, size_t *peak) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (now) *now = c->bytes_now;
    if (peak) *peak = c->bytes_peak;
}

extern "C" void *tks_cuda_backend_stream(tks_backend *be) {
    return (void *)tks_cuda_ctx_of(be)->stream;
}

extern "C" void tks_cuda_describe(tks_backend *be, char *out, size_t cap) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    int drv = 0, rt = 0, nccl = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nccl);
    size_t lt = cublasLtGetVersion();
    snprintf(out, cap,
             "%s (sm_%d%d, %d SMs, %.1f GiB), CUDA driver %d.%d, runtime %d.%d, cuBLASLt %zu, "
             "NCCL %d.%d.%d",
             c->prop.name, c->prop.major, c->prop.minor, c->prop.multiProcessorCount,
             (double)c->prop.totalGlobalMem / 1073741824.0, drv / 1000, (drv % 1000) / 10,
             rt / 1000, (rt % 1000) / 10, lt, nccl / 10000, (nccl % 10000) / 100, nccl % 100);
}

#ifndef TKS_HAVE_CUDNN_FE
extern "C" int tks_cuda_flash_fwd(tks_backend *be, uint16_t *out, float *lse, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, int B, int T, int NH,
                                  int NKV, int HD) {
    (void)be, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)NH,
        (void)NKV, (void)HD;
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "built without the cuDNN frontend: run tools/install-deps.sh --cuda and "
                    "reconfigure; attention uses tokshard's own kernel meanwhile");
}
extern "C" int tks_cuda_flash_bwd(tks_backend *be, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  const uint16_t *dout, const uint16_t *out, const float *lse,
                                  const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                                  int T, int NH, int NKV, int HD) {
    (void)be, (void)dq, (void)dk, (void)dv, (void)dout, (void)out, (void)lse, (void)q, (void)k,
        (void)v, (void)B, (void)T, (void)NH, (void)NKV, (void)HD;
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "built without the cuDNN frontend: run tools/install-deps.sh --cuda and "
                    "reconfigure; attention uses tokshard's own kernel meanwhile");
}
#endif
