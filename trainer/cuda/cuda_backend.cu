/* cuda_backend.cu - backend.h (contract 2) on an NVIDIA GPU: memory, streams
 * and events, the element-wise and row kernels, flash-style attention that
 * keeps only lse, the multi-tensor AdamW, deterministic reductions. GEMMs are
 * in cuda_gemm.cu, cuDNN's fused attention in cudnn_attention.cpp.
 *
 * Storage is fp32 or bf16 (the op's dt); arithmetic is fp32 in registers
 * (ld/st below convert). Formulas and sources are in backend.h; kernels keep
 * the CPU reference's operation order where that order is a guarantee
 * (embedding and RMSNorm weight gradients sum rows in id order, so they are
 * deterministic; AdamW uses torch.optim.AdamW's order). Reductions inside a
 * row use a fixed tree and no atomics anywhere, so two runs give the same
 * bits.
 *
 * Legend (backend.h): B batch, T sequence, N = B*T rows, C dim, NH query
 * heads, NKV kv heads, HD head dim, F SwiGLU hidden dim, V vocab columns of a
 * shard, VR its real ones.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        snprintf(c->err_msg, sizeof c->err_msg,
                 "CUDA backend: %s: out of device memory: lower --micro-batch or --seq-len", op);
        return 1;
    }
    return tks_cuda_fail(c, op, cudaGetErrorString(e));
}

int tks_cuda_check_blas(tks_cuda_ctx *c, cublasStatus_t s, const char *op) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return tks_cuda_fail(c, op, cublasGetStatusString(s));
}

/* A caller error (bad dtype, workspace too small): sticky like the rest. */
static int arg_fail(tks_cuda_ctx *c, const char *op, const char *why) {
    if (!c->err) {
        c->err = TKS_ERR_ARG;
        snprintf(c->err_msg, sizeof c->err_msg, "CUDA backend: %s: %s", op, why);
    }
    return c->err;
}

#define CTX(be) tks_cuda_ctx *c = tks_cuda_ctx_of(be)
#define STICKY(c) \
    if ((c)->err) return (c)->err
#define LAUNCHED(c, op) (tks_cuda_check_rt((c), cudaGetLastError(), (op)), (c)->err)
#define CHECK_DT(c, op, dt)                                                          \
    if ((dt) != TKS_F32 && (dt) != TKS_BF16) return arg_fail((c), (op), "dtype is neither fp32 nor bf16")

/* row chunks of the RMSNorm weight gradient (rmsnorm_dw): fixed, so the
 * summation order depends only on the shape */
enum { RMS_DW_CHUNKS = 64 };

static unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g > 65535u * 16 ? 65535u * 16 : (g ? g : 1));
}

/* ---- storage types: load as fp32, store with round to nearest even --------- */

typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float ldv(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldv(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stv(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stv(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* ---- block reductions (fixed tree: warp shuffles, then warp 0) -------------- */

template <typename R> __device__ R warp_sum(R v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* every thread of the block gets the sum; `sh` holds 32 values */
template <typename R> __device__ R block_sum(R v, R *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    R r = lane < nw ? sh[lane] : (R)0;
    return warp_sum(r);
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
    void *p = NULL;
    size_t n = (bytes + 255) & ~(size_t)255;
    if (!n) n = 256;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        size_t big[3] = {0, 0, 0}; /* the biggest buffers: what to shrink */
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
                 "free): lower --micro-batch or --seq-len, use --dtype bf16, or spread the model "
                 "with --dp-shard/--tp",
                 (double)bytes / 1048576.0, c->device, (double)c->bytes_now / 1048576.0,
                 (double)big[0] / 1048576.0, (double)big[1] / 1048576.0,
                 (double)big[2] / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0);
        return NULL;
    }
    /* zero-filled before any stream can use it */
    if (cudaMemsetAsync(p, 0, n, c->stream) != cudaSuccess || cudaStreamSynchronize(c->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "CUDA backend: zero-filling a new buffer failed");
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
    cudaDeviceSynchronize();
    cudaFree(p);
}

static int cu_upload(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    STICKY(c);
    /* pageable source: the host buffer may be reused when the call returns */
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->cur), "upload");
    return c->err;
}
static int cu_download(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    if (c->err) {
        memset(dst, 0xff, bytes); /* NaN, never stale data that looks valid */
        return c->err;
    }
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur), "download");
    if (!c->err) tks_cuda_check_rt(c, cudaStreamSynchronize(c->cur), "download (stream sync)");
    return c->err;
}
static int cu_memzero(tks_backend *be, void *p, size_t bytes) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaMemsetAsync(p, 0, bytes, c->cur), "memzero");
    return c->err;
}
static int cu_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->cur), "copy");
    return c->err;
}
static int cu_sync(tks_backend *be) {
    CTX(be);
    if (!c->err) tks_cuda_check_rt(c, cudaDeviceSynchronize(), "sync");
    if (c->err) return tks_fail(c->err, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
    return 0;
}

/* ---- workspace: attention's backward keeps D[B,NH,T] (fp32) there ----------- */

/* cuDNN's graphs need their own scratch: built here for the model's layout
 * (q, k, v views into one fused row of (NH + 2 NKV) HD, out rows NH HD), so
 * the ops never allocate; the larger of the two needs is the workspace. */
static size_t cu_workspace_bytes(tks_backend *be, const tks_ws_shape *s) {
    CTX(be);
    size_t d = (size_t)(s->B > 0 ? s->B : 1) * (size_t)(s->NH > 0 ? s->NH : 1) *
               (size_t)(s->T > 0 ? s->T : 1) * sizeof(float);
    /* the RMSNorm weight gradient's chunk partials (rmsnorm_dw): an op at a
     * time uses the workspace, so the largest need sizes it */
    size_t rms = (size_t)RMS_DW_CHUNKS * (size_t)(s->C > 0 ? s->C : 1) * sizeof(float);
    if (rms > d) d = rms;
    if (c->flash && s->dt == TKS_BF16 && s->B > 0 && s->T > 0 && s->NH > 0 && s->NKV > 0) {
        size_t ld = (size_t)(s->NH + 2 * s->NKV) * s->HD, ldo = (size_t)s->NH * s->HD, w = 0;
        if (tks_cudnn_attention_ws(be, s->B, s->T, s->NH, s->NKV, s->HD, ld, ld, ldo, &w) == 0) {
            if (w > d) d = w;
        } else {
            snprintf(c->flash_why, sizeof c->flash_why, "%s", tks_last_error()->message);
            tks_clear_error();
        }
    }
    return (d + 255) & ~(size_t)255;
}
static int cu_set_workspace(tks_backend *be, void *ws, size_t bytes) {
    CTX(be);
    STICKY(c);
    c->ws = ws;
    c->ws_bytes = ws ? bytes : 0;
    return 0;
}

/* ---- streams and events: CUDA's own ----------------------------------------- */

static int cu_stream_create(tks_backend *be, tks_stream **out) {
    CTX(be);
    STICKY(c);
    cudaStream_t s = NULL;
    *out = NULL;
    if (tks_cuda_check_rt(c, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream_create"))
        return c->err;
    *out = (tks_stream *)s;
    return 0;
}
static void cu_stream_destroy(tks_backend *be, tks_stream *s) {
    CTX(be);
    if (!s) return;
    if (c->cur == (cudaStream_t)s) c->cur = c->stream;
    cudaStreamSynchronize((cudaStream_t)s);
    cudaStreamDestroy((cudaStream_t)s);
}
static int cu_set_stream(tks_backend *be, tks_stream *s) {
    CTX(be);
    STICKY(c);
    c->cur = s ? (cudaStream_t)s : c->stream;
    return 0;
}
static int cu_event_create(tks_backend *be, tks_event **out) {
    CTX(be);
    STICKY(c);
    cudaEvent_t e = NULL;
    *out = NULL;
    if (tks_cuda_check_rt(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event_create"))
        return c->err;
    *out = (tks_event *)e;
    return 0;
}
static void cu_event_destroy(tks_backend *be, tks_event *e) {
    (void)be;
    if (e) cudaEventDestroy((cudaEvent_t)e);
}
static int cu_event_record(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaEventRecord((cudaEvent_t)e, c->cur), "event_record");
    return c->err;
}
static int cu_stream_wait(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaStreamWaitEvent(c->cur, (cudaEvent_t)e, 0), "stream_wait");
    return c->err;
}
static int cu_event_sync(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaEventSynchronize((cudaEvent_t)e), "event_sync");
    return c->err;
}

/* ---- element-wise ------------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);   \
         i += (size_t)gridDim.x * blockDim.x)

template <typename D, typename S> __global__ void k_convert(D *dst, const S *src, size_t n) {
    GRID_STRIDE(i, n) stv(dst, i, ldv(src, i));
}
static int cu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
                      size_t n) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "convert", ddt);
    CHECK_DT(c, "convert", sdt);
    if (!n) return 0;
    if (ddt == sdt)
        return cu_copy(be, dst, src, n * tks_dtype_size(ddt));
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

static int cu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n, tks_dtype dt) {
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
static int cu_scale(tks_backend *be, float *x, size_t n, float s) {
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
static int cu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
                    size_t nspans, int accumulate) {
    CTX(be);
    STICKY(c);
    return reduce(c, out, x, spans, nspans, 1, accumulate, "sumsq");
}
static int cu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    CTX(be);
    STICKY(c);
    tks_span s = {0, n, 0.0f};
    return reduce(c, out, x, &s, 1, 0, accumulate, "sum");
}

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
static int cu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
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
static int cu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N,
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

/* ---- RMSNorm -------------------------------------------------------------------- */

template <typename T>
__global__ void k_rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int C, float eps) {
    __shared__ float sh[32];
    size_t o = (size_t)blockIdx.x * C;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float v = ldv(x, o + j);
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < C; j += blockDim.x) stv(out, o + j, ldv(x, o + j) * r * ldv(w, j));
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
static int cu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                          int N, int C, float eps, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rmsnorm_fwd", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16)
        k_rmsnorm_fwd<bf16><<<N, 256, 0, c->cur>>>((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)w, C, eps);
    else
        k_rmsnorm_fwd<float><<<N, 256, 0, c->cur>>>((float *)out, rstd, (const float *)x, (const float *)w, C, eps);
    return LAUNCHED(c, "rmsnorm_fwd");
}
static int cu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                          const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rmsnorm_bwd", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16) {
        k_rmsnorm_bwd_dx<bf16><<<N, 256, 0, c->cur>>>((bf16 *)dx, (const bf16 *)dout, (const bf16 *)x,
                                                      (const bf16 *)w, rstd, C);
        rmsnorm_dw<bf16>(c, dw, (const bf16 *)dout, (const bf16 *)x, rstd, N, C);
    } else {
        k_rmsnorm_bwd_dx<float><<<N, 256, 0, c->cur>>>((float *)dx, (const float *)dout, (const float *)x,
                                                       (const float *)w, rstd, C);
        rmsnorm_dw<float>(c, dw, (const float *)dout, (const float *)x, rstd, N, C);
    }
    return LAUNCHED(c, "rmsnorm_bwd");
}

/* ---- RoPE (rotate_half; angles in fp32 as Hugging Face computes them) -------- */

template <typename T>
__global__ void k_rope(T *x, size_t ld, int T_, int H, int HD, int64_t p0, float theta, int inverse,
                       size_t pairs) {
    int half = HD / 2;
    GRID_STRIDE(idx, pairs) {
        int j = (int)(idx % half);
        size_t rh = idx / half; /* (b, t, h) */
        int h = (int)(rh % H);
        size_t row = rh / H; /* b * T + t */
        int t = (int)(row % T_);
        float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)HD);
        float a = (float)(p0 + t) * inv_freq;
        float co = cosf(a), si = inverse ? -sinf(a) : sinf(a);
        size_t o = row * ld + (size_t)h * HD;
        float x1 = ldv(x, o + j), x2 = ldv(x, o + j + half);
        stv(x, o + j, x1 * co - x2 * si);
        stv(x, o + j + half, x2 * co + x1 * si);
    }
}
static int cu_rope(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0,
                   float theta, int inverse, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rope", dt);
    size_t pairs = (size_t)B * T * H * (HD / 2);
    if (!pairs) return 0;
    if (dt == TKS_BF16)
        k_rope<bf16><<<grid_for(pairs, 256), 256, 0, c->cur>>>((bf16 *)x, ld, T, H, HD, p0, theta, inverse, pairs);
    else
        k_rope<float><<<grid_for(pairs, 256), 256, 0, c->cur>>>((float *)x, ld, T, H, HD, p0, theta, inverse, pairs);
    return LAUNCHED(c, "rope");
}

/* ---- attention: tokshard's own kernels (fallback, and the fp32 reference) -----
 * Flash-style in memory (Dao et al. 2022): nothing of size T x T is stored;
 * the forward keeps lse[B,NH,T], the backward recomputes the probabilities.
 * One block per query row (b, h, t) with the row's scores in shared memory
 * (T floats); warps split the keys, lanes the head dimension. Quadratic work
 * like any exact attention, without the tiling that makes cuDNN's fast. */

enum { ATT_THREADS = 128 };

/* s[u] = scale * q . k_u for u <= t; k rows `ks` elements apart */
template <typename T>
__device__ void att_scores(float *s, const T *q, const T *k, size_t ks, int t, int HD, float scale) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int u = w; u <= t; u += nw) {
        float d = 0;
        for (int e = lane; e < HD; e += 32) d += ldv(q, e) * ldv(k, (size_t)u * ks + e);
        d = warp_sum(d);
        if (lane == 0) s[u] = d * scale;
    }
    __syncthreads();
}

template <typename T>
__global__ void k_attention_fwd(T *out, size_t ldo, float *lse, const T *q, size_t ldq, const T *k,
                                const T *v, size_t ldkv, int T_, int NH, int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    const T *K = k + (size_t)b * T_ * ldkv + (size_t)g * HD;
    const T *Vv = v + (size_t)b * T_ * ldkv + (size_t)g * HD;
    att_scores(s, Q, K, ldkv, t, HD, 1.0f / sqrtf((float)HD));
    float mx = -INFINITY;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) mx = fmaxf(mx, s[u]);
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) sum += (s[u] = expf(s[u] - mx));
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    if (threadIdx.x == 0) lse[((size_t)b * NH + h) * T_ + t] = mx + logf(sum);
    __syncthreads();
    T *O = out + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += s[u] * ldv(Vv, (size_t)u * ldkv + e);
        stv(O, e, o * inv);
    }
}

/* Backward, stage 1 per query row: p = exp(scale q.k - lse), dP = dO V^T,
 * D = dO . O (= rowsum(P o dP)), dS = p (dP - D) scale, dQ = dS K; D saved in
 * the workspace for stage 2. */
template <typename T>
__global__ void k_attention_bwd_q(T *dq, float *Dsave, const T *dout, const T *out, size_t ldo,
                                  const float *lse, const T *q, size_t ldq, const T *k, const T *v,
                                  size_t ldkv, int T_, int NH, int NKV, int HD) {
    extern __shared__ float s[]; /* [2][T]: scores, then dP */
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    const T *dO = dout + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    const T *O = out + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    const T *K = k + (size_t)b * T_ * ldkv + (size_t)g * HD;
    const T *Vv = v + (size_t)b * T_ * ldkv + (size_t)g * HD;
    float scale = 1.0f / sqrtf((float)HD);
    float *sc = s, *dp = s + T_;
    att_scores(sc, Q, K, ldkv, t, HD, scale);
    att_scores(dp, dO, Vv, ldkv, t, HD, 1.0f);
    float D = 0;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) D += ldv(dO, e) * ldv(O, e);
    D = block_sum(D, red);
    float L = lse[((size_t)b * NH + h) * T_ + t];
    for (int u = threadIdx.x; u <= t; u += blockDim.x) {
        float p = expf(sc[u] - L);
        sc[u] = p * (dp[u] - D) * scale;
    }
    if (threadIdx.x == 0) Dsave[((size_t)b * NH + h) * T_ + t] = D;
    __syncthreads();
    T *dQ = dq + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float a = 0;
        for (int u = 0; u <= t; u++) a += sc[u] * ldv(K, (size_t)u * ldkv + e);
        stv(dQ, e, a);
    }
}

/* Backward, stage 2 per key row (b, g, u): over the group's query heads and
 * t >= u, with p = exp(scale q_t.k_u - lse_t) and dS = p (dO_t.V_u - D_t) scale:
 * dV[u] = sum p dO_t, dK[u] = sum dS q_t. Warp w takes t = u + w (mod nw),
 * lanes the head dims; per-warp partials in shared memory are added in warp
 * order at the end (deterministic). Shared: 2 * nw * HD floats. */
template <typename T>
__global__ void k_attention_bwd_kv(T *dk, T *dv, const T *dout, size_t ldo, const float *lse,
                                   const float *Dsave, const T *q, size_t ldq, const T *k,
                                   const T *v, size_t ldkv, int T_, int NH, int NKV, int HD) {
    extern __shared__ float acc[]; /* [nw][HD] dK, then [nw][HD] dV */
    int u = blockIdx.x, g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *aK = acc + (size_t)w * HD, *aV = acc + (size_t)(nw + w) * HD;
    for (int e = lane; e < HD; e += 32) aK[e] = aV[e] = 0;
    const T *Ku = k + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    const T *Vu = v + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    float scale = 1.0f / sqrtf((float)HD);
    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *Lh = lse + ((size_t)b * NH + h) * T_, *Dh = Dsave + ((size_t)b * NH + h) * T_;
        for (int t = u + w; t < T_; t += nw) {
            const T *dO = dout + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
            const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
            float qk = 0, dp = 0;
            for (int e = lane; e < HD; e += 32) {
                qk += ldv(Q, e) * ldv(Ku, e);
                dp += ldv(dO, e) * ldv(Vu, e);
            }
            qk = warp_sum(qk);
            dp = warp_sum(dp);
            float p = expf(qk * scale - Lh[t]);
            float ds = p * (dp - Dh[t]) * scale;
            for (int e = lane; e < HD; e += 32) {
                aV[e] += p * ldv(dO, e);
                aK[e] += ds * ldv(Q, e);
            }
        }
    }
    __syncthreads();
    T *dK = dk + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    T *dV = dv + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float sk = 0, sv = 0;
        for (int i = 0; i < nw; i++) {
            sk += acc[(size_t)i * HD + e];
            sv += acc[(size_t)(nw + i) * HD + e];
        }
        stv(dK, e, sk);
        stv(dV, e, sv);
    }
}

/* decode: one block per head, scores over the cache rows 0..t */
template <typename T>
__global__ void k_attention_step(T *out, const T *q, const T *kc, const T *vc, int t, int NH,
                                 int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int h = blockIdx.x, g = h / (NH / NKV);
    size_t ks = (size_t)NKV * HD;
    att_scores(s, q + (size_t)h * HD, kc + (size_t)g * HD, ks, t, HD, 1.0f / sqrtf((float)HD));
    float mx = -INFINITY;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) mx = fmaxf(mx, s[u]);
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) sum += (s[u] = expf(s[u] - mx));
    sum = block_sum(sum, red);
    __syncthreads();
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += s[u] * ldv(vc, (size_t)u * ks + (size_t)g * HD + e);
        stv(out, (size_t)h * HD + e, o / sum);
    }
}

/* Raises a kernel's dynamic shared memory limit when a row needs more than
 * the default 48 KiB (T above 12288 in fp32 scores). */
static int att_smem(tks_cuda_ctx *c, const void *fn, size_t bytes, const char *op) {
    if (bytes <= 48 * 1024) return 0;
    if (bytes > (size_t)c->prop.sharedMemPerBlockOptin) {
        char why[200];
        snprintf(why, sizeof why,
                 "sequence too long for tokshard's attention kernel (%zu bytes of shared memory "
                 "per row, the device allows %zu): use a shorter --seq-len",
                 bytes, (size_t)c->prop.sharedMemPerBlockOptin);
        return arg_fail(c, op, why);
    }
    return tks_cuda_check_rt(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)bytes), op);
}

static int cu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                            size_t ldq, const void *k, const void *v, size_t ldkv, int B, int T,
                            int NH, int NKV, int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_fwd", dt);
    if (B <= 0 || T <= 0) return 0;
    if (dt == TKS_BF16 && c->flash) {
        if (!tks_cudnn_attention_fwd(be, c->cur, c->ws, c->ws_bytes, out, ldo, lse, q, ldq, k, v,
                                     ldkv, B, T, NH, NKV, HD)) {
            c->flash_why[0] = 0;
            return 0;
        }
        snprintf(c->flash_why, sizeof c->flash_why, "%s", tks_last_error()->message);
        tks_clear_error();
    }
    size_t sm = (size_t)T * sizeof(float);
    dim3 grid(T, NH, B);
    if (dt == TKS_BF16) {
        if (att_smem(c, (const void *)k_attention_fwd<bf16>, sm, "attention_fwd")) return c->err;
        k_attention_fwd<bf16><<<grid, ATT_THREADS, sm, c->cur>>>((bf16 *)out, ldo, lse, (const bf16 *)q,
                                                                 ldq, (const bf16 *)k, (const bf16 *)v,
                                                                 ldkv, T, NH, NKV, HD);
    } else {
        if (att_smem(c, (const void *)k_attention_fwd<float>, sm, "attention_fwd")) return c->err;
        k_attention_fwd<float><<<grid, ATT_THREADS, sm, c->cur>>>((float *)out, ldo, lse, (const float *)q,
                                                                  ldq, (const float *)k, (const float *)v,
                                                                  ldkv, T, NH, NKV, HD);
    }
    return LAUNCHED(c, "attention_fwd");
}

static int cu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                            const void *out, size_t ldo, const float *lse, const void *q, size_t ldq,
                            const void *k, const void *v, size_t ldkv, int B, int T, int NH, int NKV,
                            int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_bwd", dt);
    if (B <= 0 || T <= 0) return 0;
    if (dt == TKS_BF16 && c->flash) {
        if (!tks_cudnn_attention_bwd(be, c->cur, c->ws, c->ws_bytes, dq, dk, dv, dout, out, ldo, lse,
                                     q, ldq, k, v, ldkv, B, T, NH, NKV, HD)) {
            c->flash_why[0] = 0;
            return 0;
        }
        snprintf(c->flash_why, sizeof c->flash_why, "%s", tks_last_error()->message);
        tks_clear_error();
    }
    size_t need = (size_t)B * NH * T * sizeof(float);
    if (!c->ws || c->ws_bytes < need) {
        char why[160];
        snprintf(why, sizeof why, "needs %zu bytes of workspace, %zu were set (size it with "
                 "workspace_bytes at these shapes)", need, c->ws_bytes);
        return arg_fail(c, "attention_bwd", why);
    }
    float *D = (float *)c->ws;
    size_t sm = 2 * (size_t)T * sizeof(float), sm2 = 2 * (ATT_THREADS / 32) * (size_t)HD * sizeof(float);
    dim3 gq(T, NH, B), gkv(T, NKV, B);
    if (dt == TKS_BF16) {
        if (att_smem(c, (const void *)k_attention_bwd_q<bf16>, sm, "attention_bwd") ||
            att_smem(c, (const void *)k_attention_bwd_kv<bf16>, sm2, "attention_bwd"))
            return c->err;
        k_attention_bwd_q<bf16><<<gq, ATT_THREADS, sm, c->cur>>>(
            (bf16 *)dq, D, (const bf16 *)dout, (const bf16 *)out, ldo, lse, (const bf16 *)q, ldq,
            (const bf16 *)k, (const bf16 *)v, ldkv, T, NH, NKV, HD);
        if (LAUNCHED(c, "attention_bwd (dq)")) return c->err;
        k_attention_bwd_kv<bf16><<<gkv, ATT_THREADS, sm2, c->cur>>>(
            (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, ldo, lse, D, (const bf16 *)q, ldq,
            (const bf16 *)k, (const bf16 *)v, ldkv, T, NH, NKV, HD);
    } else {
        if (att_smem(c, (const void *)k_attention_bwd_q<float>, sm, "attention_bwd") ||
            att_smem(c, (const void *)k_attention_bwd_kv<float>, sm2, "attention_bwd"))
            return c->err;
        k_attention_bwd_q<float><<<gq, ATT_THREADS, sm, c->cur>>>(
            (float *)dq, D, (const float *)dout, (const float *)out, ldo, lse, (const float *)q, ldq,
            (const float *)k, (const float *)v, ldkv, T, NH, NKV, HD);
        if (LAUNCHED(c, "attention_bwd (dq)")) return c->err;
        k_attention_bwd_kv<float><<<gkv, ATT_THREADS, sm2, c->cur>>>(
            (float *)dk, (float *)dv, (const float *)dout, ldo, lse, D, (const float *)q, ldq,
            (const float *)k, (const float *)v, ldkv, T, NH, NKV, HD);
    }
    return LAUNCHED(c, "attention_bwd (dk, dv)");
}

static int cu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
                             const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_step", dt);
    size_t sm = (size_t)(t + 1) * sizeof(float);
    if (dt == TKS_BF16) {
        if (att_smem(c, (const void *)k_attention_step<bf16>, sm, "attention_step")) return c->err;
        k_attention_step<bf16><<<NH, ATT_THREADS, sm, c->cur>>>((bf16 *)out, (const bf16 *)q,
                                                                (const bf16 *)kc, (const bf16 *)vc, t, NH, NKV, HD);
    } else {
        if (att_smem(c, (const void *)k_attention_step<float>, sm, "attention_step")) return c->err;
        k_attention_step<float><<<NH, ATT_THREADS, sm, c->cur>>>((float *)out, (const float *)q,
                                                                 (const float *)kc, (const float *)vc, t, NH, NKV, HD);
    }
    return LAUNCHED(c, "attention_step");
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
static int cu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
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
static int cu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F,
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

/* ---- cross-entropy ------------------------------------------------------------------ */

/* Fused (tp = 1): one block per row. Pass 1: online softmax (Milakov &
 * Gimelshein 2018, "Online normalizer calculation for softmax") per thread,
 * merged over the block; pass 2 overwrites the row with the gradient. */
template <typename T>
__global__ void k_xent_fused(float *loss, T *logits, const int32_t *targets, int V, int VR, float scale) {
    __shared__ float red[32];
    size_t o = (size_t)blockIdx.x * V;
    float m = -INFINITY, s = 0;
    for (int j = threadIdx.x; j < VR; j += blockDim.x) {
        float x = ldv(logits, o + j);
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
    float lt = ldv(logits, o + tg);
    __syncthreads(); /* every thread has read the target logit before it is overwritten */
    if (threadIdx.x == 0) loss[blockIdx.x] = logf(S) + M - lt;
    float inv = 1.0f / S;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = j < VR ? expf(ldv(logits, o + j) - M) * inv * scale : 0.0f;
        if (j == tg) g -= scale;
        stv(logits, o + j, g);
    }
}
static int cu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N,
                         int V, int VR, float scale, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_fused", dt);
    if (N <= 0) return 0;
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
    tgt[i] = (r >= 0 && r < VR) ? ldv(logits, (size_t)i * V + r) : 0.0f;
}
__global__ void k_xent_loss(float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) loss[i] = logf(sum[i]) + mx[i] - tgt[i];
}
template <typename T>
__global__ void k_xent_bwd(T *dlogits, const T *logits, const float *mx, const float *sum,
                           const int32_t *targets, int V, int64_t v0, int VR, float scale) {
    int i = blockIdx.x;
    size_t o = (size_t)i * V;
    float m = mx[i], inv = 1.0f / sum[i];
    int64_t r = (int64_t)targets[i] - v0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = j < VR ? expf(ldv(logits, o + j) - m) * inv * scale : 0.0f;
        if (j == r && r < VR) g -= scale;
        stv(dlogits, o + j, g);
    }
}
static int cu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_max", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16) k_xent_max<bf16><<<N, 256, 0, c->cur>>>(mx, (const bf16 *)logits, V, VR);
    else k_xent_max<float><<<N, 256, 0, c->cur>>>(mx, (const float *)logits, V, VR);
    return LAUNCHED(c, "xent_max");
}
static int cu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                          int V, int VR, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "xent_sumexp", dt);
    if (N <= 0) return 0;
    if (dt == TKS_BF16) k_xent_sumexp<bf16><<<N, 256, 0, c->cur>>>(sum, (const bf16 *)logits, mx, V, VR);
    else k_xent_sumexp<float><<<N, 256, 0, c->cur>>>(sum, (const float *)logits, mx, V, VR);
    return LAUNCHED(c, "xent_sumexp");
}
static int cu_xent_target(tks_backend *be, float *tgt, const void *logits, const int32_t *targets,
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
static int cu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                        const float *tgt, int N) {
    CTX(be);
    STICKY(c);
    if (N <= 0) return 0;
    k_xent_loss<<<(N + 255) / 256, 256, 0, c->cur>>>(loss, mx, sum, tgt, N);
    return LAUNCHED(c, "xent_loss");
}
static int cu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
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
static int cu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
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

/* ---- creation -------------------------------------------------------------------- */

static void cu_destroy(tks_backend *be) {
    if (!be) return;
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (c) {
        cudaDeviceSynchronize();
#ifdef TKS_HAVE_CUDNN_FE
        tks_cuda_flash_release(be);
#endif
        tks_cuda_gemm_plans_free(c);
        for (int i = 0; i < c->nallocs; i++) cudaFree(c->allocs[i].p);
        cudaFree(c->workspace);
        cudaFree(c->d_partial);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int tks_cuda_built(void) { return 1; }

/* Without an NVIDIA driver on the machine (neither its control device nor its
 * /proc entry) there is no device: answered without loading the CUDA runtime,
 * so CPU-only runs of a CUDA build (--device auto, the tests) never start it. */
extern "C" int tks_cuda_device_count(void) {
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        return 0;
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
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--device cuda: no CUDA device is usable here (no NVIDIA driver: neither "
                        "/dev/nvidiactl nor /proc/driver/nvidia exists); check nvidia-smi, or use "
                        "--device cpu");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--device cuda: no CUDA device is usable here (%s); check nvidia-smi and "
                        "CUDA_VISIBLE_DEVICES, or use --device cpu",
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
              tks_cuda_check_blas(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode") ||
              tks_cuda_check_rt(c, cudaMalloc(&c->workspace, c->workspace_bytes), "cuBLASLt workspace") ||
              tks_cuda_check_rt(c, cudaMalloc((void **)&c->d_partial, TKS_NORM_BLOCKS * sizeof(double)),
                                "reduction partials");
    if (bad) {
        int code = tks_fail(c->err ? c->err : TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
        cu_destroy(be);
        return code;
    }
    c->cur = c->stream;
    {
        const char *fa = getenv("TKS_CUDNN_ATTENTION");
        tks_cuda_set_flash(be, !(fa && !strcmp(fa, "0")));
        if (!c->flash)
            snprintf(c->flash_why, sizeof c->flash_why, "%s",
#ifdef TKS_HAVE_CUDNN_FE
                     "cuDNN attention turned off (TKS_CUDNN_ATTENTION=0)"
#else
                     "built without the cuDNN frontend (tools/install-deps.sh --cuda, then reconfigure)"
#endif
            );
    }
    be->name = "cuda";
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->memzero = cu_memzero;
    be->copy = cu_copy;
    be->sync = cu_sync;
    be->workspace_bytes = cu_workspace_bytes;
    be->set_workspace = cu_set_workspace;
    be->stream_create = cu_stream_create;
    be->stream_destroy = cu_stream_destroy;
    be->set_stream = cu_set_stream;
    be->event_create = cu_event_create;
    be->event_destroy = cu_event_destroy;
    be->event_record = cu_event_record;
    be->stream_wait = cu_stream_wait;
    be->event_sync = cu_event_sync;
    be->gemm = tks_cuda_gemm;
    be->convert = cu_convert;
    be->add = cu_add;
    be->scale = cu_scale;
    be->sumsq = cu_sumsq;
    be->sum = cu_sum;
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
    be->xent_fused = cu_xent_fused;
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

extern "C" int tks_cuda_backend_check(tks_backend *be) { return cu_sync(be); }

extern "C" void tks_cuda_backend_memory(tks_backend *be, size_t *now, size_t *peak) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (now) *now = c->bytes_now;
    if (peak) *peak = c->bytes_peak;
}

extern "C" size_t tks_cuda_backend_reserved(tks_backend *be) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    return c->workspace_bytes + TKS_NORM_BLOCKS * sizeof(double);
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

extern "C" int tks_cuda_set_flash(tks_backend *be, int on) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
#ifdef TKS_HAVE_CUDNN_FE
    c->flash = on != 0;
#else
    (void)on;
    c->flash = 0;
#endif
    return c->flash;
}

extern "C" const char *tks_cuda_flash_status(tks_backend *be) {
    return tks_cuda_ctx_of(be)->flash_why;
}

#ifndef TKS_HAVE_CUDNN_FE
extern "C" int tks_cudnn_attention_ws(tks_backend *be, int B, int T, int NH, int NKV, int HD,
                                      size_t ldq, size_t ldkv, size_t ldo, size_t *bytes) {
    (void)be, (void)B, (void)T, (void)NH, (void)NKV, (void)HD, (void)ldq, (void)ldkv, (void)ldo;
    *bytes = 0;
    return TKS_ERR_ARG;
}
extern "C" int tks_cudnn_attention_fwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                                       const void *k, const void *v, size_t ldkv, int B, int T,
                                       int NH, int NKV, int HD) {
    (void)be, (void)stream, (void)ws, (void)ws_bytes, (void)out, (void)ldo, (void)lse, (void)q,
        (void)ldq, (void)k, (void)v, (void)ldkv, (void)B, (void)T, (void)NH, (void)NKV, (void)HD;
    return TKS_ERR_ARG;
}
extern "C" int tks_cudnn_attention_bwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *dq, void *dk, void *dv, const void *dout,
                                       const void *out, size_t ldo, const float *lse, const void *q,
                                       size_t ldq, const void *k, const void *v, size_t ldkv, int B,
                                       int T, int NH, int NKV, int HD) {
    (void)be, (void)stream, (void)ws, (void)ws_bytes, (void)dq, (void)dk, (void)dv, (void)dout,
        (void)out, (void)ldo, (void)lse, (void)q, (void)ldq, (void)k, (void)v, (void)ldkv, (void)B,
        (void)T, (void)NH, (void)NKV, (void)HD;
    return TKS_ERR_ARG;
}
#endif
