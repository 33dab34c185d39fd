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

#include "common/tks.h"
#include "trainer/cuda/cuda_internal.h"

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

static cudaDataType_t cuda_type(int dt) { return dt == TKS_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* A and B of type in_dt, C of type c_dt, fp32 compute. */
static tks_gemm_plan *plan_get(tks_cuda_ctx *c, int in_dt, int c_dt, int ta, int tb, int M, int N,
                               int K, size_t lda, size_t ldb, size_t ldc, const void *A,
                               const void *B, const void *C) {
    int aa = align_of(A), ab = align_of(B), ac = align_of(C);
    for (int i = 0; i < c->nplans; i++) {
        tks_gemm_plan *p = &c->plans[i];
        if (p->in_dt == in_dt && p->c_dt == c_dt && p->ta == ta && p->tb == tb && p->M == M &&
            p->N == N && p->K == K && p->lda == lda && p->ldb == ldb && p->ldc == ldc &&
            p->align_a == aa && p->align_b == ab && p->align_c == ac)
            return p;
    }
    tks_gemm_plan *p;
    if (c->nplans < TKS_GEMM_CACHE) p = &c->plans[c->nplans++];
    else {
        p = &c->plans[c->victim];
        c->victim = (c->victim + 1) % TKS_GEMM_CACHE;
        plan_destroy(p);
    }
    memset(p, 0, sizeof *p);
    p->in_dt = in_dt, p->c_dt = c_dt, p->ta = ta, p->tb = tb, p->M = M, p->N = N, p->K = K;
    p->lda = lda, p->ldb = ldb, p->ldc = ldc, p->align_a = aa, p->align_b = ab, p->align_c = ac;

    cudaDataType_t in = cuda_type(in_dt), ct = cuda_type(c_dt);
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A = our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B = our A */
    int in_bytes = in_dt == TKS_BF16 ? 2 : 4, c_bytes = c_dt == TKS_BF16 ? 2 : 4;
    if (tks_cuda_check_blas(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                            "gemm: cublasLtMatmulDescCreate"))
        return NULL;
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    /* stored shapes (before op), column-major: cuBLAS A is (tb ? K x N : N x K) */
    uint64_t ar = tb ? (uint64_t)K : (uint64_t)N, acn = tb ? (uint64_t)N : (uint64_t)K;
    uint64_t br = ta ? (uint64_t)M : (uint64_t)K, bc = ta ? (uint64_t)K : (uint64_t)M;
    if (tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->la, in, ar, acn, (int64_t)ldb), "gemm: layout A") ||
        tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->lb, in, br, bc, (int64_t)lda), "gemm: layout B") ||
        tks_cuda_check_blas(c, cublasLtMatrixLayoutCreate(&p->lc, ct, N, M, (int64_t)ldc), "gemm: layout C"))
        return NULL;

    cublasLtMatmulPreference_t pref;
    if (tks_cuda_check_blas(c, cublasLtMatmulPreferenceCreate(&pref), "gemm: preference")) return NULL;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &c->workspace_bytes, sizeof c->workspace_bytes);
    uint32_t a1 = (uint32_t)(ab < in_bytes ? in_bytes : ab), a2 = (uint32_t)(aa < in_bytes ? in_bytes : aa);
    uint32_t a3 = (uint32_t)(ac < c_bytes ? c_bytes : ac);
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

/* be->gemm: C = alpha op(A) op(B) (+ C when accumulate), fp32 compute. */
int tks_cuda_gemm(tks_backend *be, const tks_gemm_args *g) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (c->err) return c->err;
    if (g->a_type != g->b_type || g->compute != TKS_F32 ||
        (g->a_type != TKS_F32 && g->a_type != TKS_BF16) || (g->c_type != TKS_F32 && g->c_type != TKS_BF16)) {
        char why[160];
        snprintf(why, sizeof why, "types A %d, B %d, C %d, compute %d are not supported (A and B "
                 "of one type, fp32 compute)", (int)g->a_type, (int)g->b_type, (int)g->c_type,
                 (int)g->compute);
        tks_cuda_fail(c, "gemm", why);
        c->err = TKS_ERR_ARG;
        return c->err;
    }
    int M = g->M, N = g->N, K = g->K;
    if (M <= 0 || N <= 0) return 0;
    size_t cs = g->c_type == TKS_BF16 ? 2 : 4;
    if (K <= 0) { /* C = 0 or C unchanged: cuBLAS would reject k = 0 */
        if (!g->accumulate)
            tks_cuda_check_rt(c, cudaMemset2DAsync(g->C, g->ldc * cs, 0, (size_t)N * cs, (size_t)M, c->cur),
                              "gemm (k = 0)");
        return c->err;
    }
    float alpha = g->alpha, beta = g->accumulate ? 1.0f : 0.0f;
    tks_gemm_plan *p = plan_get(c, g->a_type, g->c_type, g->trans_a, g->trans_b, M, N, K, g->lda,
                                g->ldb, g->ldc, g->A, g->B, g->C);
    if (!p) return c->err;
    if (p->have_algo) {
        tks_cuda_check_blas(c, cublasLtMatmul(c->lt, p->op, &alpha, g->B, p->la, g->A, p->lb, &beta,
                                              g->C, p->lc, g->C, p->lc, &p->algo, c->workspace,
                                              c->workspace_bytes, c->cur),
                            "gemm (cublasLtMatmul)");
        return c->err;
    }
    /* no cuBLASLt algorithm for this alignment/shape: cuBLAS's GemmEx */
    cublasOperation_t opa = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasSetStream(c->blas, c->cur);
    tks_cuda_check_blas(c, cublasGemmEx(c->blas, opa, opb, N, M, K, &alpha, g->B, cuda_type(g->b_type),
                                        (int)g->ldb, g->A, cuda_type(g->a_type), (int)g->lda, &beta,
                                        g->C, cuda_type(g->c_type), (int)g->ldc, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                        "gemm (cublasGemmEx fallback)");
    return c->err;
}
