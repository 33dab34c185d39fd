/* cuda_gemm.cu - every GEMM of the CUDA backend through cuBLASLt: fp32 or
 * bf16 inputs, fp32 compute and fp32 output (CUBLAS_COMPUTE_32F: no TF32, so
 * fp32 mode stays the reference), beta = 1 accumulation, one workspace, and
 * the descriptors and the heuristic's algorithm cached per (shape, strides,
 * types, pointer alignment).
 *
 * Row-major to cuBLAS's column-major (the usual identity, e.g. llm.c's
 * matmul_cublaslt): a row-major X[r, c] with row stride ld is the
 * column-major X^T[c, r] with leading dimension ld, so
 *   C[M,N] = op(A) op(B)   <=>   C^T[N,M] = op(B)^T op(A)^T,
 * i.e. cuBLAS's A is our B (transposed iff trans_b), its B is our A
 * (transposed iff trans_a), m = N, n = M, k = K. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

/* Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
 * assumes 256-byte aligned buffers unless told otherwise, and model code
 * offsets into flat buffers. */
static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al)) al /= 2;
    return al;
}

static void plan_destroy(tks_gemm_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void tks_cuda_gemm_plans_free(tks_cuda_ctx *c) {
    for (int i = 0; i < c->nplans; i++) plan_destroy(&c->plans[i]);
    c->nplans = 0;
}

/* dtype 0: A, B fp32; 1: A, B bf16. C is fp32 in both. */
static tks_gemm_plan *plan_get(tks_cuda_ctx *c, int dtype, int ta, int tb, int M, int N, int K,
                               int lda, int ldb, int ldc, const void *A, const void *B,
                               const void *C) {
    int aa = align_of(A), ab = align_of(B), ac = align_of(C);
    for (int i = 0; i < c->nplans; i++) {
        tks_gemm_plan *p = &c->plans[i];
        if (p->dtype == dtype && p->ta == ta && p->tb == tb && p->M == M && p->N == N &&
            p->K == K && p->lda == lda && p->ldb == ldb && p->ldc == ldc && p->align_a == aa &&
            p->align_b == ab && p->align_c == ac)
            return p;
    }
    static int victim;
    tks_gemm_plan *p;
    if (c->nplans < TKS_GEMM_CACHE) p = &c->plans[c->nplans++];
    else {
        p = &c->plans[victim];
        victim = (victim + 1) % TKS_GEMM_CACHE;
        plan_destroy(p);
    }
    memset(p, 0, sizeof *p);
    p->dtype = dtype, p->ta = ta, p->tb = tb, p->M = M, p->N = N, p->K = K;
    p->lda = lda, p->ldb = ldb, p->ldc = ldc, p->align_a = aa, p->align_b = ab, p->align_c = ac;

    cudaDataType_t in = dtype ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A = our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B = our A */
    int in_bytes = dtype ? 2 : 4;
    if (tks_cuda_check_blas(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                            "gemm: cublasLtMatmulDescCreate"))
        return NULL;
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    /* stored shapes (before op), column-major: cuBLAS A is (tb ? K x N : N x K) */
    uint64_t ar = tb ? (uint64_t)K : (uint64_t)N, ac_ = tb ? (uint64_t)N : (uint64_t)K;
    uint64_t br = ta ? (uint64_t)M : (uint64_t)K, bc = ta ? (uint64_t)K : (uint64_t)M;
    if (tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->la, in, ar, ac_, ldb), "gemm: layout A") ||
        tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->lb, in, br, bc, lda), "gemm: layout B") ||
        tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, N, M, ldc), "gemm: layout C"))
        return NULL;

    cublasLtMatmulPreference_t pref;
    if (tks_cuda_check_blas(c, cublasLtMatmulPreferenceCreate(&pref), "gemm: preference")) return NULL;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &c->workspace_bytes, sizeof c->workspace_bytes);
    uint32_t a1 = (uint32_t)(ab < in_bytes ? in_bytes : ab), a2 = (uint32_t)(aa < in_bytes ? in_bytes : aa);
    uint32_t a3 = (uint32_t)(ac < 4 ? 4 : ac);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof a1);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof a2);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a3, sizeof a3);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a3, sizeof a3);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc,
                                                      pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
        p->algo = res.algo;
        p->have_algo = 1;
    }
    return p;
}

static void gemm_any(tks_backend *be, int dtype, int ta, int tb, int M, int N, int K, float alpha,
                     const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (c->err || M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C: cuBLAS would reject k = 0 */
        if (beta == 0.0f) {
            for (int i = 0; i < M; i++)
                tks_cuda_check_rt(c, cudaMemsetAsync(C + (size_t)i * ldc, 0, (size_t)N * 4, c->stream),
                                  "gemm (k = 0)");
        } else if (beta != 1.0f) {
            tks_cuda_fail(c, "gemm", "k = 0 with beta other than 0 or 1 is not supported");
        }
        return;
    }
    tks_gemm_plan *p = plan_get(c, dtype, ta, tb, M, N, K, lda, ldb, ldc, A, B, C);
    if (!p) return;
    if (p->have_algo) {
        tks_cuda_check_blas(c, cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C,
                                              p->lc, C, p->lc, &p->algo, c->workspace,
                                              c->workspace_bytes, c->stream),
                            dtype ? "gemm (bf16, cublasLtMatmul)" : "gemm (cublasLtMatmul)");
        return;
    }
    /* no cuBLASLt algorithm for this alignment/shape: cuBLAS's GemmEx */
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t in = dtype ? CUDA_R_16BF : CUDA_R_32F;
    tks_cuda_check_blas(c, cublasGemmEx(c->blas, opa, opb, N, M, K, &alpha, B, in, ldb, A, in, lda,
                                        &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                        "gemm (cublasGemmEx fallback)");
}

void tks_cuda_gemm_f32(tks_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc) {
    gemm_any(be, 0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" void tks_cuda_gemm_bf16(tks_backend *be, int ta, int tb, int M, int N, int K,
                                   float alpha, const uint16_t *A, int lda, const uint16_t *B,
                                   int ldb, float beta, float *C, int ldc) {
    gemm_any(be, 1, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
