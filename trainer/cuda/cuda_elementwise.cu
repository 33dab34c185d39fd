/* cuda_elementwise.cu - the CUDA backend's element-wise (convert, add,
 * scale), deterministic reductions (sum, sum of squares) and SwiGLU kernels
 * (backend.h gives each op's contract; the CPU reference,
 * trainer/cpu/cpu_backend.c, is what they are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

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
    BY_DT(dt, E, k_add<E><<<grid_for(n, 256), 256, 0, c->cur>>>((E *)out, (const E *)a, (const E *)b, n));
    return LAUNCHED(c, "add");
}
int tks_cu_scale(tks_backend *be, float *x, size_t n, float s) {
    CTX(be);
    STICKY(c);
    if (!n) return 0;
    k_scale<<<grid_for(n, 256), 256, 0, c->cur>>>(x, n, s);
    return LAUNCHED(c, "scale");
}

/* ---- deterministic reductions into a device scalar: one launch, no float
 * atomics ------------------------------------------------------------------
 * TKS_NORM_BLOCKS blocks of 256 threads over the spans' concatenation
 * (span_batch): element e goes to thread e mod (256 TKS_NORM_BLOCKS), each
 * thread sums its elements in order (fp64, as the contract asks), each block
 * reduces in a fixed tree into part[block] (a list longer than SPAN_BATCH
 * spans takes one launch per batch, each adding into the same partials in
 * order). In the last batch's launch, the block that finishes last (a
 * ticket: an integer atomic, __threadfence before it, as CUDA's
 * threadFenceReduction sample does) adds the partials in a fixed tree
 * (thread t: partials t, t + 256, ..., then the block tree), writes out and
 * resets the ticket. The partition depends only on the sizes, never on the
 * GPU or on which block finished last, so the bits depend only on the data. */
/* The end of k_reduce and k_reduce_vec, each thread holding its sum s: the
 * block's partial, and in the last launch the last block's fixed tree over
 * the partials into out. */
__device__ __forceinline__ void reduce_finish(double s, double *part, unsigned *ticket, float *out, int first,
                                              int last, int accumulate, double *sh, int *am_last) {
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = first ? s : part[blockIdx.x] + s;
        *am_last = 0;
        if (last) {
            __threadfence(); /* this block's partial is visible before its ticket */
            *am_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        }
    }
    __syncthreads();
    if (!*am_last) return;
    __threadfence();
    const volatile double *vp = part; /* past L1: the other blocks' partials */
    double t = 0;
    for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) t += vp[k];
    t = block_sum(t, sh);
    if (threadIdx.x == 0) {
        out[0] = (float)((accumulate ? (double)out[0] : 0.0) + t);
        *ticket = 0;
    }
}
__global__ void k_reduce(double *part, unsigned *ticket, float *out, const float *x, span_batch b,
                         int square, int first, int last, int accumulate) {
    __shared__ double sh[32];
    __shared__ size_t s_off[SPAN_BATCH], s_end[SPAN_BATCH];
    __shared__ int am_last;
    for (int k = threadIdx.x; k < b.n; k += blockDim.x) s_off[k] = b.off[k], s_end[k] = b.end[k];
    __syncthreads();
    size_t total = b.n ? s_end[b.n - 1] : 0;
    double s = 0;
    int sp = 0;
    GRID_STRIDE(e, total) {
        sp = span_of(s_end, sp, e);
        double v = (double)x[s_off[sp] + (e - (sp ? s_end[sp - 1] : 0))];
        s += square ? v * v : v;
    }
    reduce_finish(s, part, ticket, out, first, last, accumulate, sh, &am_last);
}
/* The vectorized form (TKS_CUDA_VEC_OPTIM=1; unverified on a GPU): the same
 * blocks, partials and last-block tree, over quads of the spans
 * (quad_batch): quad Q goes to thread Q mod (256 TKS_NORM_BLOCKS), a quad
 * inside a span is one 16-byte load whose four squares the thread adds in
 * order (fp64), a quad at a span's edge (or every quad when x is not
 * 16-byte aligned) its span's elements one by one. The partition depends
 * only on the spans, so the bits depend only on the data (they differ from
 * the scalar form's, whose partition is by element). */
__global__ void k_reduce_vec(double *part, unsigned *ticket, float *out, const float *x, quad_batch b, int vec,
                             int square, int first, int last, int accumulate) {
    __shared__ double sh[32];
    __shared__ size_t s_off[QUAD_BATCH], s_stop[QUAD_BATCH], s_qend[QUAD_BATCH];
    __shared__ int am_last;
    for (int k = threadIdx.x; k < b.n; k += blockDim.x)
        s_off[k] = b.off[k], s_stop[k] = b.stop[k], s_qend[k] = b.qend[k];
    __syncthreads();
    size_t total = b.n ? s_qend[b.n - 1] : 0;
    double s = 0;
    int sp = 0;
    GRID_STRIDE(Q, total) {
        size_t i0 = quad_at(s_qend, s_off, &sp, Q);
        if (vec && quad_whole(i0, s_off[sp], s_stop[sp])) {
            float4 q = *(const float4 *)(x + i0);
            double a = q.x, bb = q.y, cc = q.z, d = q.w;
            s += square ? a * a : a;
            s += square ? bb * bb : bb;
            s += square ? cc * cc : cc;
            s += square ? d * d : d;
            continue;
        }
        size_t lo = i0 > s_off[sp] ? i0 : s_off[sp], hi = i0 + 4 < s_stop[sp] ? i0 + 4 : s_stop[sp];
        for (size_t i = lo; i < hi; i++) {
            double v = (double)x[i];
            s += square ? v * v : v;
        }
    }
    reduce_finish(s, part, ticket, out, first, last, accumulate, sh, &am_last);
}
static int reduce_vec(tks_cuda_ctx *c, float *out, const float *x, const tks_span *spans, size_t nspans,
                      int square, int accumulate, const char *op) {
    size_t k = 0;
    int first = 1, vec = aligned16(x);
    unsigned *ticket = (unsigned *)(c->d_partial + TKS_NORM_BLOCKS);
    do { /* at least one launch: an empty list writes 0 (or leaves out as it was) */
        quad_batch b;
        quad_batch_fill(&b, spans, nspans, &k, 0.0f);
        k_reduce_vec<<<TKS_NORM_BLOCKS, 256, 0, c->cur>>>(c->d_partial, ticket, out, x, b, vec, square, first,
                                                           k == nspans, accumulate);
        first = 0;
        if (LAUNCHED(c, op)) return c->err;
    } while (k < nspans);
    return 0;
}
static int reduce(tks_cuda_ctx *c, float *out, const float *x, const tks_span *spans, size_t nspans,
                  int square, int accumulate, const char *op) {
    if (c->vec_optim) return reduce_vec(c, out, x, spans, nspans, square, accumulate, op);
    size_t k = 0;
    int first = 1;
    unsigned *ticket = (unsigned *)(c->d_partial + TKS_NORM_BLOCKS);
    do { /* at least one launch: an empty list writes 0 (or leaves out as it was) */
        span_batch b;
        span_batch_fill(&b, spans, nspans, &k, [](const tks_span &) { return 0.0f; });
        k_reduce<<<TKS_NORM_BLOCKS, 256, 0, c->cur>>>(c->d_partial, ticket, out, x, b, square, first,
                                                       k == nspans, accumulate);
        first = 0;
        if (LAUNCHED(c, op)) return c->err;
    } while (k < nspans);
    return 0;
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

/* rows over blockIdx.y (striding by gridDim.y), the F columns of a row over
 * the x threads: no 64-bit division per element (n / F and n % F cost more
 * than the arithmetic). The arithmetic is the CPU's, element by element. */
#define ROWS_COLS(r, j, M, F)                                                           \
    for (size_t r = blockIdx.y; r < (size_t)(M); r += gridDim.y)                      \
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (F); j += gridDim.x * blockDim.x)
static inline dim3 rows_cols_grid(int M, int F) {
    unsigned gx = (unsigned)((F + 255) / 256), gy = (unsigned)(M < 65535 ? M : 65535);
    return dim3(gx ? gx : 1, gy ? gy : 1);
}
template <typename T> __global__ void k_swiglu_fwd(T *out, const T *gu, int M, int F) {
    ROWS_COLS(r, j, M, F) {
        float g = ldv(gu, r * 2 * F + j), u = ldv(gu, r * 2 * F + F + j);
        stv(out, r * F + j, g / (1.0f + expf(-g)) * u);
    }
}
template <typename T> __global__ void k_swiglu_bwd(T *dgu, const T *dout, const T *gu, int M, int F) {
    ROWS_COLS(r, j, M, F) {
        float g = ldv(gu, r * 2 * F + j), u = ldv(gu, r * 2 * F + F + j), d = ldv(dout, r * F + j);
        float s = 1.0f / (1.0f + expf(-g));
        stv(dgu, r * 2 * F + F + j, d * g * s);
        stv(dgu, r * 2 * F + j, d * u * s * (1.0f + g * (1.0f - s)));
    }
}
/* With 16-byte accesses (TKS_CUDA_SWIGLU_VEC; unverified on a GPU): a
 * thread takes W = 16 / sizeof(T) adjacent columns of a row (gate, up,
 * dout and the outputs each one 16-byte load or store), F a multiple of W
 * and the buffers 16-byte aligned (the launch checks); each element's
 * arithmetic is the scalar kernels', so the bits are theirs. */
template <typename T> __global__ void k_swiglu_fwd_vec(T *out, const T *gu, int M, int F) {
    constexpr int W = 16 / (int)sizeof(T);
    int FV = F / W;
    ROWS_COLS(r, q, M, FV) {
        float g[W], u[W];
        ld16(gu + r * 2 * F + (size_t)q * W, g);
        ld16(gu + r * 2 * F + F + (size_t)q * W, u);
#pragma unroll
        for (int k = 0; k < W; k++) g[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
        st16(out + r * F + (size_t)q * W, g);
    }
}
template <typename T> __global__ void k_swiglu_bwd_vec(T *dgu, const T *dout, const T *gu, int M, int F) {
    constexpr int W = 16 / (int)sizeof(T);
    int FV = F / W;
    ROWS_COLS(r, q, M, FV) {
        float g[W], u[W], d[W], dg[W], du[W];
        ld16(gu + r * 2 * F + (size_t)q * W, g);
        ld16(gu + r * 2 * F + F + (size_t)q * W, u);
        ld16(dout + r * F + (size_t)q * W, d);
#pragma unroll
        for (int k = 0; k < W; k++) {
            float s = 1.0f / (1.0f + expf(-g[k]));
            du[k] = d[k] * g[k] * s;
            dg[k] = d[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
        }
        st16(dgu + r * 2 * F + F + (size_t)q * W, du);
        st16(dgu + r * 2 * F + (size_t)q * W, dg);
    }
}
/* 1 when the vectorized SwiGLU applies: on, F a multiple of the vector, the buffers aligned */
static int swiglu_vec_ok(const tks_cuda_ctx *c, int F, tks_dtype dt, const void *a, const void *b, const void *d) {
    return c->swiglu_vec && ((size_t)F * tks_dtype_size(dt)) % 16 == 0 && aligned16(a) && aligned16(b) &&
           (!d || aligned16(d));
}
int tks_cu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "swiglu_fwd", dt);
    size_t n = (size_t)M * F;
    if (!n) return 0;
    if (swiglu_vec_ok(c, F, dt, out, gu, NULL)) {
        int FV = F / (int)(16 / tks_dtype_size(dt));
        BY_DT(dt, E, k_swiglu_fwd_vec<E><<<rows_cols_grid(M, FV), 256, 0, c->cur>>>((E *)out, (const E *)gu, M, F));
        return LAUNCHED(c, "swiglu_fwd");
    }
    BY_DT(dt, E, k_swiglu_fwd<E><<<rows_cols_grid(M, F), 256, 0, c->cur>>>((E *)out, (const E *)gu, M, F));
    return LAUNCHED(c, "swiglu_fwd");
}
int tks_cu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F,
                         tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "swiglu_bwd", dt);
    size_t n = (size_t)M * F;
    if (!n) return 0;
    if (swiglu_vec_ok(c, F, dt, dgu, gu, dout)) {
        int FV = F / (int)(16 / tks_dtype_size(dt));
        BY_DT(dt, E,
              k_swiglu_bwd_vec<E><<<rows_cols_grid(M, FV), 256, 0, c->cur>>>((E *)dgu, (const E *)dout,
                                                                           (const E *)gu, M, F));
        return LAUNCHED(c, "swiglu_bwd");
    }
    BY_DT(dt, E,
          k_swiglu_bwd<E><<<rows_cols_grid(M, F), 256, 0, c->cur>>>((E *)dgu, (const E *)dout, (const E *)gu, M, F));
    return LAUNCHED(c, "swiglu_bwd");
}
