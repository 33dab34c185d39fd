/* cpu_gemm.c - GEMM of the CPU backend: OpenBLAS sgemm for fp32, bf16 operands widened
 * panel by panel (backend.h, gemm). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

/* ---- GEMM ------------------------------------------------------------------ */

/* Generic path (any operand in bf16): C is cut into GM x GN panels, one
 * task each, in one parallel region. A task widens its slice of A and of B to
 * fp32 in its own workspace slice, in the operand's own layout (every copy
 * loop reads memory contiguously; sgemm gets the transpose flags), multiplies
 * them with sgemm on its thread (fp32 products and sums), and adds / stores
 * its fp32 panel into C in c_type. Panels are disjoint, so the result does
 * not depend on the schedule. */
static void gemm_panel(float *A, const tks_gemm_args *g, int i0, int mb, int j0, int nb) {
    int K = g->K;
    float *Bp = A + (size_t)GM * K, *Cp = Bp + (size_t)K * GN;
    int ldbp = g->trans_b ? K : nb, ldap = g->trans_a ? mb : K;
    if (g->trans_b) /* rows j0.. of B [N, K] -> Bp[nb, K] */
        for (int c = 0; c < nb; c++)
            for (int k = 0; k < K; k++)
                Bp[(size_t)c * K + k] = ld(g->B, (size_t)(j0 + c) * g->ldb + (size_t)k, g->b_type);
    else /* B [K, N] columns j0.. -> Bp[K, nb] */
        for (int k = 0; k < K; k++)
            for (int c = 0; c < nb; c++)
                Bp[(size_t)k * nb + c] = ld(g->B, (size_t)k * g->ldb + (size_t)(j0 + c), g->b_type);
    if (g->trans_a) /* A [K, M] columns i0.. -> A[K, mb] */
        for (int k = 0; k < K; k++)
            for (int r = 0; r < mb; r++)
                A[(size_t)k * mb + r] = ld(g->A, (size_t)k * g->lda + (size_t)(i0 + r), g->a_type);
    else
        for (int r = 0; r < mb; r++)
            for (int k = 0; k < K; k++)
                A[(size_t)r * K + k] = ld(g->A, (size_t)(i0 + r) * g->lda + (size_t)k, g->a_type);
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, mb, nb, K, g->alpha, A, ldap, Bp, ldbp, 0.0f,
                Cp, nb);
    for (int r = 0; r < mb; r++)
        for (int c = 0; c < nb; c++) {
            size_t idx = (size_t)(i0 + r) * g->ldc + (size_t)(j0 + c);
            float v = Cp[(size_t)r * nb + c];
            if (g->accumulate) v += ld(g->C, idx, g->c_type);
            st(g->C, idx, v, g->c_type);
        }
}

static int gemm_mixed(tks_backend *be, const tks_gemm_args *g) {
    int M = g->M, N = g->N, K = g->K;
    if (tks__cpu_need_ws(be, "gemm", tks__cpu_gemm_ws(K))) return CTX(be)->err;
    int pm = (M + GM - 1) / GM, pn = (N + GN - 1) / GN;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(NT(be))
    for (int pi = 0; pi < pm; pi++)
        for (int pj = 0; pj < pn; pj++) {
            int i0 = pi * GM, j0 = pj * GN;
            gemm_panel(tks__cpu_scratch(be, tks__cpu_gemm_ws(K)), g, i0, M - i0 < GM ? M - i0 : GM, j0,
                       N - j0 < GN ? N - j0 : GN);
        }
    return 0;
}

int tks__cpu_gemm(tks_backend *be, const tks_gemm_args *g) {
    STICKY(be);
    if (g->compute != TKS_F32)
        return tks__cpu_op_fail(be, "gemm", TKS_ERR_ARG, "compute type %s: the backend computes in fp32",
                       tks_dtype_name(g->compute));
    if (g->M < 0 || g->N < 0 || g->K < 0)
        return tks__cpu_op_fail(be, "gemm", TKS_ERR_ARG, "negative shape M %d N %d K %d", g->M, g->N, g->K);
    if (!g->M || !g->N) return 0;
    if (g->a_type == TKS_F32 && g->b_type == TKS_F32 && g->c_type == TKS_F32) {
        cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                    g->trans_b ? CblasTrans : CblasNoTrans, g->M, g->N, g->K, g->alpha, g->A,
                    (int)g->lda, g->B, (int)g->ldb, g->accumulate ? 1.0f : 0.0f, g->C, (int)g->ldc);
        return 0;
    }
    return gemm_mixed(be, g);
}
