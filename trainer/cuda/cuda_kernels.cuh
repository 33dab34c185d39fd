/* cuda_kernels.cuh - what the CUDA backend's kernel files share: the
 * sticky-error helpers of an op, launch geometry, fp32/bf16 loads and stores,
 * fixed-tree block reductions, and the ops each kernel family defines for
 * the operations table in cuda_backend.cu. Private to trainer/cuda; CUDA C++
 * only (included by the .cu files).
 *
 * Legend (backend.h): B batch, T sequence, N = B*T rows, C dim, NH query
 * heads, NKV kv heads, HD head dim, F SwiGLU hidden dim, V vocab columns of a
 * shard, VR its real ones.
 */
#ifndef TKS_CUDA_KERNELS_CUH
#define TKS_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>

#include "trainer/cuda/cuda_internal.h"

/* A caller error (bad dtype, workspace too small): sticky like the rest. */
static inline int arg_fail(tks_cuda_ctx *c, const char *op, const char *why) {
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
/* The statements with E the element type of dt: bf16 for TKS_BF16, float
 * for TKS_F32 (CHECK_DT has refused any other dtype). */
#define BY_DT(dt, E, ...)       \
    do {                        \
        if ((dt) == TKS_BF16) { \
            typedef bf16 E;     \
            __VA_ARGS__;        \
        } else {                \
            typedef float E;    \
            __VA_ARGS__;        \
        }                       \
    } while (0)

/* row chunks of the RMSNorm weight gradient (cuda_norm.cu; the workspace
 * holds their partial sums): fixed, so the summation order depends only on
 * the shape */
enum { RMS_DW_CHUNKS = 64 };
/* the one-pass RMSNorm backward (TKS_CUDA_NORM_ONEPASS): at most this many
 * row chunks, one block each (enough blocks to fill an H100's 132 SMs
 * several times at N = 4096); fewer when the workspace holds fewer */
enum { RMS_ONEPASS_CHUNKS = 512 };

static inline unsigned grid_for(size_t n, unsigned block) {
    size_t g = (n + block - 1) / block;
    return (unsigned)(g > 65535u * 16 ? 65535u * 16 : (g ? g : 1));
}

#define GRID_STRIDE(i, n)                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);   \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- span lists (sumsq, sum, adamw): SPAN_BATCH spans per launch ----------
 * Passed by value as a kernel parameter (3.2 KiB, under the 4 KiB limit of
 * kernel parameters), so a launch needs no upload and a list of up to
 * SPAN_BATCH spans (one per parameter tensor: 147 for 16 layers) is one
 * launch. Element e of the batch's concatenation lies in span s with
 * end[s-1] <= e < end[s] (end[-1] = 0), at flat index off[s] + e - end[s-1];
 * a thread whose e only grows finds s by stepping forward (span_of). */
enum { SPAN_BATCH = 160 };
struct span_batch {
    size_t off[SPAN_BATCH]; /* span s's first element in the flat buffer */
    size_t end[SPAN_BATCH]; /* elements of spans 0..s together */
    float f[SPAN_BATCH];    /* a factor per span (AdamW: the decay 1 - lr wd) */
    int n;
};
/* Fills b from spans[*k..] (at most SPAN_BATCH, up to nspans), advancing
 * *k; f_of(span) gives each span's factor. Returns the batch's elements. */
template <typename F>
static size_t span_batch_fill(span_batch *b, const tks_span *spans, size_t nspans, size_t *k, F f_of) {
    size_t e = 0;
    b->n = 0;
    for (; *k < nspans && b->n < SPAN_BATCH; (*k)++, b->n++) {
        e += spans[*k].n;
        b->off[b->n] = spans[*k].off;
        b->end[b->n] = e;
        b->f[b->n] = f_of(spans[*k]);
    }
    return e;
}
/* the span of element e, from the span s of an earlier e (end in shared memory) */
__device__ __forceinline__ int span_of(const size_t *end, int s, size_t e) {
    while (e >= end[s]) s++;
    return s;
}

/* ---- span lists by aligned quads (TKS_CUDA_VEC_OPTIM): quad_spans.h ---- */
#include "trainer/cuda/quad_spans.h"
/* 16-byte alignment of a device pointer (the vector paths need it) */
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- storage types: load as fp32, store with round to nearest even --------- */

typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float ldv(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldv(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stv(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stv(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
/* v as stv stores it into a T and ldv reads it back (identity for fp32) */
__device__ __forceinline__ float rounded(const float *, float v) { return v; }
__device__ __forceinline__ float rounded(const bf16 *, float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* 16-byte vectors (the opt-in vectorized kernels): 8 bf16 or 4 fp32
 * elements a load or store, as fp32; the address 16-byte aligned */
__device__ __forceinline__ void ld16(const float *p, float *v) {
    float4 q = *(const float4 *)p;
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void ld16(const bf16 *p, float *v) {
    uint4 q = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
}
__device__ __forceinline__ void st16(float *p, const float *v) { *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]); }
__device__ __forceinline__ void st16(bf16 *p, const float *v) {
    uint4 q;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&q;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    *(uint4 *)p = q;
}
/* ---- block reductions (fixed tree: warp shuffles, then warp 0) -------------- */

template <typename R> __device__ R warp_sum(R v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
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
static __device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

/* ---- the ops of each kernel family (backend.h gives their contracts) ------- */

/* cuda_backend.cu: a device-to-device copy on the current stream */
int tks_cu_copy(tks_backend *be, void *dst, const void *src, size_t bytes);

/* cuda_elementwise.cu: element-wise (convert, add, scale), deterministic reductions (sum, sum of squares), SwiGLU */
int tks_cu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
    size_t n);
int tks_cu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n,
    tks_dtype dt);
int tks_cu_scale(tks_backend *be, float *x, size_t n, float s);
int tks_cu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
    size_t nspans, int accumulate);
int tks_cu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate);
int tks_cu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt);
int tks_cu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F,
    tks_dtype dt);

/* cuda_embedding.cu: token embedding */
int tks_cu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
    int C, int64_t v0, int V, tks_dtype dt);
int tks_cu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N,
    int C, int64_t v0, int V, tks_dtype dt);
/* the workspace bytes embedding_bwd's sort by id needs for N rows (0: CUB
 * could not size it; the op then runs its fallback) */
size_t tks_cu_embedding_bwd_ws(int N);

/* cuda_norm.cu: RMSNorm, and the residual add fused with it */
int tks_cu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
    int N, int C, float eps, tks_dtype dt);
int tks_cu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C, tks_dtype dt);
int tks_cu_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a,
    const void *b, const void *w, int N, int C, float eps, tks_dtype dt);

/* cuda_attention.cu: RoPE and attention (tokshard's own kernels) */
int tks_cu_rope(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0,
    const int32_t *pos, float theta, int inverse, tks_dtype dt);
int tks_cu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
    size_t ldq, const void *k, const void *v, size_t ldkv, const int32_t *doc, int B, int T,
    int NH, int NKV, int HD, tks_dtype dt);
int tks_cu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
    const void *out, size_t ldo, const float *lse, const void *q, size_t ldq, const void *k,
    const void *v, size_t ldkv, const int32_t *doc, int B, int T, int NH, int NKV, int HD,
    tks_dtype dt);
int tks_cu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
    const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt);

/* cuda_xent.cu: cross-entropy */
int tks_cu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N,
    int V, int VR, float scale, tks_dtype dt);
int tks_cu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR,
    tks_dtype dt);
int tks_cu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
    int V, int VR, tks_dtype dt);
int tks_cu_xent_target(tks_backend *be, float *tgt, const void *logits, const int32_t *targets,
    int N, int V, int64_t v0, int VR, tks_dtype dt);
int tks_cu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
    const float *tgt, int N);
int tks_cu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
    const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR, float scale,
    tks_dtype dt);

/* cuda_adamw.cu: AdamW */
int tks_cu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
    const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale,
    const float *gnorm_sq, void *pc, tks_dtype pc_dt);

#endif /* TKS_CUDA_KERNELS_CUH */
