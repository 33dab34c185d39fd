/* cuda_internal.h - what the CUDA backend's translation units share: the
 * context behind tks_backend.ctx, the sticky-error helpers, the GEMM cache.
 * Private to trainer/cuda. */
#ifndef TKS_CUDA_INTERNAL_H
#define TKS_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/cuda/cuda.h"

/* One cached cuBLASLt plan: the shape, types and pointer alignments it was
 * chosen for, its descriptors and the heuristic's algorithm. */
typedef struct tks_gemm_plan {
    int ta, tb, M, N, K, in_dt, c_dt, align_a, align_b, align_c;
    size_t lda, ldb, ldc;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int have_algo;
} tks_gemm_plan;

enum { TKS_GEMM_CACHE = 256, TKS_MAX_ALLOCS = 4096, TKS_PIN_SLOTS = 4, TKS_PIN_BYTES = 1 << 20 };

typedef struct tks_cuda_ctx {
    int device;
    cudaStream_t stream; /* the default stream of the backend */
    cudaStream_t cur;    /* the current one (set_stream) */
    void *ws;            /* the model's workspace (set_workspace) */
    size_t ws_bytes;
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* fallback when cuBLASLt finds no algorithm */
    void *workspace;     /* the one cuBLASLt workspace */
    size_t workspace_bytes;
    tks_gemm_plan plans[TKS_GEMM_CACHE];
    int nplans, victim;
    double *d_partial;   /* [TKS_NORM_BLOCKS + 1]: the reductions' block partials, then
                          * (as an unsigned) the ticket of their last block, 0 between ops */
    /* sticky error */
    int err;
    char err_msg[512];
    /* cuDNN attention: in use, and the last reason it was not */
    int flash;
    char flash_why[512];
    int deterministic;   /* cuDNN's deterministic attention backward (--deterministic) */
    int vec_optim;       /* TKS_CUDA_VEC_OPTIM: sumsq, sum and adamw over aligned quads
                          * (16-byte accesses; unverified on a GPU) */
    int norm_onepass;    /* TKS_CUDA_NORM_ONEPASS: rmsnorm_bwd's dx and dw partials in one
                          * pass over the rows (unverified on a GPU) */
    int rope_rows;       /* TKS_CUDA_ROPE_ROWS: RoPE's angles once per row, not per head
                          * (unverified on a GPU) */
    int xent_vec;        /* TKS_CUDA_XENT_VEC: xent_fused with 16-byte accesses
                          * (unverified on a GPU) */
    int swiglu_vec;      /* TKS_CUDA_SWIGLU_VEC: SwiGLU with 16-byte accesses
                          * (unverified on a GPU) */
    /* memory accounting */
    size_t bytes_now, bytes_peak;
    struct {
        void *p;
        size_t bytes;
    } allocs[TKS_MAX_ALLOCS];
    int nallocs;
    /* pinned host staging for uploads of at most TKS_PIN_BYTES (a batch's
     * ids and targets): a copy from pageable memory makes the host wait for
     * the stream's earlier work, one from pinned memory is queued behind it.
     * TKS_PIN_SLOTS slots used in turn, each reused once its event says its
     * last copy is done. NULL when cudaHostAlloc failed: uploads then copy
     * from the caller's memory. */
    unsigned char *pin;
    cudaEvent_t pin_done[TKS_PIN_SLOTS];
    int pin_next;
    struct cudaDeviceProp prop;
} tks_cuda_ctx;

#define TKS_NORM_BLOCKS 1024 /* fixed: the reduction order must not depend on the GPU */

static inline tks_cuda_ctx *tks_cuda_ctx_of(tks_backend *be) { return (tks_cuda_ctx *)be->ctx; }

/* Records the first failure (op and reason) and returns 1 when `e` is an error. */
int tks_cuda_fail(tks_cuda_ctx *c, const char *op, const char *reason);
int tks_cuda_check_rt(tks_cuda_ctx *c, cudaError_t e, const char *op);
int tks_cuda_check_blas(tks_cuda_ctx *c, cublasStatus_t s, const char *op);

/* cuda_gemm.cu: be->gemm */
int tks_cuda_gemm(tks_backend *be, const tks_gemm_args *g);
void tks_cuda_gemm_plans_free(tks_cuda_ctx *c);

/* cudnn_attention.cpp (when built with the cuDNN frontend): frees the
 * backend's cuDNN handle, cached graphs and workspace. */
extern "C" void tks_cuda_flash_release(tks_backend *be);
/* 0, or an error code with tks_last_error set (then the caller runs its own
 * kernel): the graphs' workspace at a shape; the two directions on `stream`
 * with cuDNN's scratch in ws. */
extern "C" int tks_cudnn_attention_ws(tks_backend *be, int B, int T, int NH, int NKV, int HD,
                                      size_t ldq, size_t ldkv, size_t ldo, int deterministic,
                                      size_t *bytes);
extern "C" int tks_cudnn_attention_fwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                                       const void *k, const void *v, size_t ldkv, int B, int T,
                                       int NH, int NKV, int HD);
extern "C" int tks_cudnn_attention_bwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *dq, void *dk, void *dv, const void *dout,
                                       const void *out, size_t ldo, const float *lse, const void *q,
                                       size_t ldq, const void *k, const void *v, size_t ldkv, int B,
                                       int T, int NH, int NKV, int HD, int deterministic);

#endif /* TKS_CUDA_INTERNAL_H */
