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
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = first ? s : part[blockIdx.x] + s;
        am_last = 0;
        if (last) {
            __threadfence(); /* this block's partial is visible before its ticket */
            am_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        }
    }
    __syncthreads();
    if (!am_last) return;
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
static int reduce(tks_cuda_ctx *c, float *out, const float *x, const tks_span *spans, size_t nspans,
                  int square, int accumulate, const char *op) {
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
int tks_cu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "swiglu_fwd", dt);
    size_t n = (size_t)M * F;
    if (!n) return 0;
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
    BY_DT(dt, E,
          k_swiglu_bwd<E><<<rows_cols_grid(M, F), 256, 0, c->cur>>>((E *)dgu, (const E *)dout, (const E *)gu, M, F));
    return LAUNCHED(c, "swiglu_bwd");
}
