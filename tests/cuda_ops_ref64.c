/*
 * cuda_ops_ref64.c - a second implementation of the backend's arithmetic ops
 * for test_cuda_ops's CPU-as-GPU harness (TKS_TEST_CPU_AS_GPU=1): every
 * output computed in fp64 from the stored inputs, straight from the
 * formulas of backend.h, and rounded once to its storage type (fp64 -> fp32
 * -> bf16 for bf16 storage: at most one bf16 ulp from the exact value).
 *
 * Why fp64 and not a second copy of the CPU backend: the test's tolerances
 * bound the difference of two fp32 implementations by twice the error bound
 * of one (2 gamma_K S, test_cuda_ops.c's header). The fp64 result is within
 * a few fp64 ulp of the exact one, so the CPU's difference from it is the
 * CPU's own rounding error, which the derived bound must cover with a
 * factor of two to spare. A bound derived too tight, a wrong index or
 * stride in the test, a buffer too short, a missing sync or an op called
 * with the wrong contract fails here, on a machine without a GPU. What it
 * cannot see: a bound that holds for the CPU's rounding but not for a GPU's
 * different order (the analysis covers any order; the check cannot).
 *
 * Ops whose check is bitwise (convert, add, scale, embedding_fwd/bwd: the
 * same fp32 operations in the same order by contract) and the memory,
 * stream and event ops are the CPU backend's own. Every op here ignores the
 * workspace: it allocates nothing on the device side and computes in host
 * scratch (malloc), which only a test may do.
 *
 * Shapes, dtypes and formulas: backend.h (the contract, version 4).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/backend/backend.h"
#include "tests/cuda_ops_ref64.h"

/* ---- storage --------------------------------------------------------------------- */

static double ld(const void *p, size_t i, tks_dtype dt) {
    return dt == TKS_BF16 ? (double)tks_bf16_to_f32(((const uint16_t *)p)[i]) : (double)((const float *)p)[i];
}
static void st(void *p, size_t i, double v, tks_dtype dt) {
    float f = (float)v;
    if (dt == TKS_BF16) ((uint16_t *)p)[i] = tks_bf16_from_f32(f);
    else ((float *)p)[i] = f;
}
static double *dzalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* ---- dense algebra and reductions -------------------------------------------------- */

/* C[M,N] = alpha op(A) op(B) (+ C) */
static int r_gemm(tks_backend *be, const tks_gemm_args *g) {
    (void)be;
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) {
            double s = 0;
            for (int k = 0; k < g->K; k++) {
                double a = g->trans_a ? ld(g->A, (size_t)k * g->lda + i, g->a_type)
                                      : ld(g->A, (size_t)i * g->lda + k, g->a_type);
                double b = g->trans_b ? ld(g->B, (size_t)j * g->ldb + k, g->b_type)
                                      : ld(g->B, (size_t)k * g->ldb + j, g->b_type);
                s += a * b;
            }
            s *= g->alpha;
            size_t c = (size_t)i * g->ldc + j;
            if (g->accumulate) s += ld(g->C, c, g->c_type);
            st(g->C, c, s, g->c_type);
        }
    return 0;
}

static int r_sumsq(tks_backend *be, float *out, const float *x, const tks_span *sp, size_t ns, int acc) {
    (void)be;
    double s = acc ? out[0] : 0;
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < sp[k].n; i++) s += (double)x[sp[k].off + i] * x[sp[k].off + i];
    out[0] = (float)s;
    return 0;
}
static int r_sum(tks_backend *be, float *out, const float *x, size_t n, int acc) {
    (void)be;
    double s = acc ? out[0] : 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    out[0] = (float)s;
    return 0;
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

static void rms_row(void *out, float *rstd, const void *x, const void *w, int i, int C, float eps, tks_dtype dt) {
    size_t o = (size_t)i * C;
    double ss = 0;
    for (int c = 0; c < C; c++) ss += ld(x, o + c, dt) * ld(x, o + c, dt);
    double r = 1.0 / sqrt(ss / C + (double)eps);
    rstd[i] = (float)r;
    for (int c = 0; c < C; c++) st(out, o + c, ld(x, o + c, dt) * r * ld(w, c, dt), dt);
}
static int r_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C,
                         float eps, tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) rms_row(out, rstd, x, w, i, C, eps, dt);
    return 0;
}
/* dx += dout w r - x r^3 / C sum_c dout w x (the saved rstd r); dw[c] += sum_i dout x r */
static int r_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x, const void *w,
                         const float *rstd, int N, int C, tks_dtype dt) {
    (void)be;
    double *sw = dzalloc((size_t)C);
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * C;
        double r = rstd[i], dot = 0;
        for (int c = 0; c < C; c++) dot += ld(dout, o + c, dt) * ld(w, c, dt) * ld(x, o + c, dt);
        double k = dot * r * r * r / C;
        for (int c = 0; c < C; c++) {
            st(dx, o + c, ld(dx, o + c, dt) + ld(dout, o + c, dt) * ld(w, c, dt) * r - k * ld(x, o + c, dt), dt);
            sw[c] += ld(dout, o + c, dt) * ld(x, o + c, dt) * r;
        }
    }
    for (int c = 0; c < C; c++) dw[c] = (float)(dw[c] + sw[c]);
    free(sw);
    return 0;
}
/* the sum is add's: one fp32 add rounded to dt (the contract asks for add's bits) */
static int r_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a, const void *b,
                             const void *w, int N, int C, float eps, tks_dtype dt) {
    (void)be;
    for (size_t i = 0; i < (size_t)N * C; i++) st(res, i, (float)ld(a, i, dt) + (float)ld(b, i, dt), dt);
    for (int i = 0; i < N; i++) rms_row(out, rstd, res, w, i, C, eps, dt);
    return 0;
}

/* ---- RoPE: pairs (j, j + HD/2), angle p theta^(-2j/HD), exact in fp64 ------------------------ */

static int r_rope(tks_backend *be, void *x, size_t ld_, int B, int T, int H, int HD, int64_t p0,
                  const int32_t *pos, float theta, int inverse, tks_dtype dt) {
    (void)be;
    int half = HD / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double p = pos ? (double)pos[(size_t)b * T + t] : (double)(p0 + t);
            for (int h = 0; h < H; h++) {
                size_t o = ((size_t)b * T + t) * ld_ + (size_t)h * HD;
                for (int j = 0; j < half; j++) {
                    double a = p * pow((double)theta, -2.0 * j / HD), co = cos(a), si = inverse ? -sin(a) : sin(a);
                    double x1 = ld(x, o + j, dt), x2 = ld(x, o + j + half, dt);
                    st(x, o + j, x1 * co - x2 * si, dt);
                    st(x, o + j + half, x2 * co + x1 * si, dt);
                }
            }
        }
    return 0;
}

/* ---- attention: softmax(q k^T / sqrt(HD), mask) v, lse natural log ---------------------------- */

/* scores of query (b, t, h) against its visible keys u in [lo, t]: s[u - lo] */
static int scores(double *s, const void *q, size_t ldq, const void *k, size_t ldkv, const int32_t *doc, int b,
                  int t, int h, int T, int NH, int NKV, int HD, tks_dtype dt) {
    int kvh = h / (NH / NKV), lo = doc ? doc[(size_t)b * T + t] : 0;
    double scale = 1.0 / sqrt((double)HD);
    for (int u = lo; u <= t; u++) {
        double d = 0;
        for (int e = 0; e < HD; e++)
            d += ld(q, ((size_t)b * T + t) * ldq + (size_t)h * HD + e, dt) *
                 ld(k, ((size_t)b * T + u) * ldkv + (size_t)kvh * HD + e, dt);
        s[u - lo] = d * scale;
    }
    return lo;
}
static int r_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                           const void *k, const void *v, size_t ldkv, const int32_t *doc, int B, int T, int NH,
                           int NKV, int HD, tks_dtype dt) {
    (void)be;
    double *s = dzalloc((size_t)T), *o = dzalloc((size_t)HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int lo = scores(s, q, ldq, k, ldkv, doc, b, t, h, T, NH, NKV, HD, dt), n = t - lo + 1;
                int kvh = h / (NH / NKV);
                double m = -INFINITY, l = 0;
                for (int u = 0; u < n; u++) m = s[u] > m ? s[u] : m;
                memset(o, 0, (size_t)HD * sizeof *o);
                for (int u = 0; u < n; u++) {
                    double p = exp(s[u] - m);
                    l += p;
                    for (int e = 0; e < HD; e++) o[e] += p * ld(v, ((size_t)b * T + lo + u) * ldkv + (size_t)kvh * HD + e, dt);
                }
                for (int e = 0; e < HD; e++) st(out, ((size_t)b * T + t) * ldo + (size_t)h * HD + e, o[e] / l, dt);
                lse[((size_t)b * NH + h) * T + t] = (float)(m + log(l));
            }
    free(s), free(o);
    return 0;
}
/* P = exp(s - lse) from the saved lse, D = dO . O from the saved out,
 * dS = P (dO . v - D); dq = scale sum dS k, dk = scale sum dS q, dv = sum P dO */
static int r_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout, const void *out,
                           size_t ldo, const float *lse, const void *q, size_t ldq, const void *k, const void *v,
                           size_t ldkv, const int32_t *doc, int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    (void)be;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD;
    double *gq = dzalloc(nq), *gk = dzalloc(nk), *gv = dzalloc(nk), *s = dzalloc((size_t)T);
    double scale = 1.0 / sqrt((double)HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int lo = scores(s, q, ldq, k, ldkv, doc, b, t, h, T, NH, NKV, HD, dt), kvh = h / (NH / NKV);
                size_t ro = ((size_t)b * T + t) * ldo + (size_t)h * HD, rq = ((size_t)b * T + t) * ldq + (size_t)h * HD;
                double D = 0, L = lse[((size_t)b * NH + h) * T + t];
                for (int e = 0; e < HD; e++) D += ld(dout, ro + e, dt) * ld(out, ro + e, dt);
                for (int u = lo; u <= t; u++) {
                    size_t rk = ((size_t)b * T + u) * ldkv + (size_t)kvh * HD;
                    size_t ik = (((size_t)b * T + u) * NKV + kvh) * HD, iq = (((size_t)b * T + t) * NH + h) * HD;
                    double P = exp(s[u - lo] - L), dP = 0;
                    for (int e = 0; e < HD; e++) dP += ld(dout, ro + e, dt) * ld(v, rk + e, dt);
                    double dS = P * (dP - D);
                    for (int e = 0; e < HD; e++) {
                        gq[iq + e] += scale * dS * ld(k, rk + e, dt);
                        gk[ik + e] += scale * dS * ld(q, rq + e, dt);
                        gv[ik + e] += P * ld(dout, ro + e, dt);
                    }
                }
            }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++)
                for (int e = 0; e < HD; e++)
                    st(dq, ((size_t)b * T + t) * ldq + (size_t)h * HD + e, gq[(((size_t)b * T + t) * NH + h) * HD + e], dt);
            for (int h = 0; h < NKV; h++)
                for (int e = 0; e < HD; e++) {
                    size_t i = (((size_t)b * T + t) * NKV + h) * HD + e, r = ((size_t)b * T + t) * ldkv + (size_t)h * HD + e;
                    st(dk, r, gk[i], dt);
                    st(dv, r, gv[i], dt);
                }
        }
    free(gq), free(gk), free(gv), free(s);
    return 0;
}
/* q[NH,HD] against kc, vc[0..t] laid out [Tmax, NKV, HD] */
static int r_attention_step(tks_backend *be, void *out, const void *q, const void *kc, const void *vc, int t,
                            int NH, int NKV, int HD, tks_dtype dt) {
    (void)be;
    double *s = dzalloc((size_t)t + 1), scale = 1.0 / sqrt((double)HD);
    for (int h = 0; h < NH; h++) {
        int kvh = h / (NH / NKV);
        double m = -INFINITY, l = 0;
        for (int u = 0; u <= t; u++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += ld(q, (size_t)h * HD + e, dt) * ld(kc, ((size_t)u * NKV + kvh) * HD + e, dt);
            s[u] = d * scale;
            m = s[u] > m ? s[u] : m;
        }
        for (int u = 0; u <= t; u++) l += (s[u] = exp(s[u] - m));
        for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int u = 0; u <= t; u++) o += s[u] * ld(vc, ((size_t)u * NKV + kvh) * HD + e, dt);
            st(out, (size_t)h * HD + e, o / l, dt);
        }
    }
    free(s);
    return 0;
}

/* ---- SwiGLU ---------------------------------------------------------------------------------- */

static int r_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    (void)be;
    for (size_t r = 0; r < (size_t)M; r++)
        for (int j = 0; j < F; j++) {
            double g = ld(gu, r * 2 * F + j, dt), u = ld(gu, r * 2 * F + F + j, dt);
            st(out, r * F + j, g / (1.0 + exp(-g)) * u, dt);
        }
    return 0;
}
static int r_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F, tks_dtype dt) {
    (void)be;
    for (size_t r = 0; r < (size_t)M; r++)
        for (int j = 0; j < F; j++) {
            double g = ld(gu, r * 2 * F + j, dt), u = ld(gu, r * 2 * F + F + j, dt), d = ld(dout, r * F + j, dt);
            double s = 1.0 / (1.0 + exp(-g));
            st(dgu, r * 2 * F + F + j, d * g * s, dt);
            st(dgu, r * 2 * F + j, d * u * s * (1.0 + g * (1.0 - s)), dt);
        }
    return 0;
}

/* ---- cross-entropy ------------------------------------------------------------------------------ */

static double row_max(const void *l, size_t o, int VR, tks_dtype dt) {
    double m = -INFINITY;
    for (int j = 0; j < VR; j++) m = ld(l, o + j, dt) > m ? ld(l, o + j, dt) : m;
    return m;
}
static double row_sumexp(const void *l, size_t o, int VR, double mx, tks_dtype dt) {
    double s = 0;
    for (int j = 0; j < VR; j++) s += exp(ld(l, o + j, dt) - mx);
    return s;
}
/* d = scale (softmax - onehot(r)) on the VR real columns, 0 on padding; r local or out of range */
static void row_grad(void *d, const void *l, size_t o, int V, int VR, double mx, double sum, int64_t r,
                     double scale, tks_dtype dt) {
    double *p = dzalloc((size_t)V);
    for (int j = 0; j < VR; j++) p[j] = exp(ld(l, o + j, dt) - mx) / sum * scale;
    if (r >= 0 && r < VR) p[r] -= scale;
    for (int j = 0; j < V; j++) st(d, o + j, p[j], dt);
    free(p);
}
static int r_xent_max(tks_backend *be, float *mx, const void *l, int N, int V, int VR, tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) mx[i] = (float)row_max(l, (size_t)i * V, VR, dt);
    return 0;
}
static int r_xent_sumexp(tks_backend *be, float *sum, const void *l, const float *mx, int N, int V, int VR,
                         tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) sum[i] = (float)row_sumexp(l, (size_t)i * V, VR, mx[i], dt);
    return 0;
}
static int r_xent_target(tks_backend *be, float *tgt, const void *l, const int32_t *tg, int N, int V, int64_t v0,
                         int VR, tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)tg[i] - v0;
        tgt[i] = tg[i] < 0 ? NAN : r >= 0 && r < VR ? (float)ld(l, (size_t)i * V + (size_t)r, dt) : 0.0f;
    }
    return 0;
}
static int r_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    (void)be;
    for (int i = 0; i < N; i++) loss[i] = isnan(tgt[i]) ? 0.0f : (float)(log((double)sum[i]) + mx[i] - tgt[i]);
    return 0;
}
static int r_xent_bwd(tks_backend *be, void *dl, const void *l, const float *mx, const float *sum,
                      const int32_t *tg, int N, int V, int64_t v0, int VR, float scale, tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * V;
        if (tg[i] < 0) {
            for (int j = 0; j < V; j++) st(dl, o + j, 0, dt);
            continue;
        }
        row_grad(dl, l, o, V, VR, mx[i], sum[i], (int64_t)tg[i] - v0, scale, dt);
    }
    return 0;
}
static int r_xent_fused(tks_backend *be, float *loss, void *l, const int32_t *tg, int N, int V, int VR,
                        float scale, tks_dtype dt) {
    (void)be;
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * V;
        if (tg[i] < 0) {
            loss[i] = 0;
            for (int j = 0; j < V; j++) st(l, o + j, 0, dt);
            continue;
        }
        double mx = row_max(l, o, VR, dt), sum = row_sumexp(l, o, VR, mx, dt);
        int64_t r = tg[i];
        loss[i] = (float)(log(sum) + mx - (r < VR ? ld(l, o + (size_t)r, dt) : 0));
        row_grad(l, l, o, V, VR, mx, sum, r, scale, dt);
    }
    return 0;
}

/* ---- AdamW (backend.h's formula, bias corrections and clip in fp64) --------------------------------- */

static int r_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                   const tks_span *sp, size_t ns, const tks_adamw_hp *hp, float grad_scale, const float *gnorm_sq,
                   void *pc, tks_dtype pc_dt) {
    (void)be;
    double clipf = 1;
    if (gnorm_sq) {
        double nsq = gnorm_sq[0];
        if (!isfinite(nsq)) return 0;
        if (hp->clip > 0 && sqrt(nsq) > hp->clip) clipf = hp->clip / sqrt(nsq);
    }
    double b1 = hp->b1, b2 = hp->b2, lr = hp->lr, eps = hp->eps;
    double bc1 = 1 - pow(b1, (double)hp->t), bc2 = 1 - pow(b2, (double)hp->t);
    for (size_t k = 0; k < ns; k++)
        for (size_t i = sp[k].off; i < sp[k].off + sp[k].n; i++) {
            size_t j = i - base;
            double g = grad[i] * (double)grad_scale * clipf;
            double mi = b1 * m[j] + (1 - b1) * g, vi = b2 * v[j] + (1 - b2) * g * g;
            double pi = p[i] * (1 - lr * sp[k].wd) - lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps);
            m[j] = (float)mi, v[j] = (float)vi, p[i] = (float)pi;
            if (pc) st(pc, i, pi, pc_dt);
        }
    return 0;
}

/* ---- the wrapped backend ------------------------------------------------------------------------------ */

static tks_backend_ops ops;
static tks_backend wrapped;
static tks_backend *inner;

static void r_destroy(tks_backend *be) {
    (void)be;
    inner->ops->destroy(inner);
    inner = NULL;
}

tks_backend *tks_test_ref64_wrap(tks_backend *cpu) {
    inner = cpu;
    ops = *cpu->ops;
    ops.gemm = r_gemm;
    ops.sumsq = r_sumsq;
    ops.sum = r_sum;
    ops.rmsnorm_fwd = r_rmsnorm_fwd;
    ops.rmsnorm_bwd = r_rmsnorm_bwd;
    ops.add_rmsnorm_fwd = r_add_rmsnorm_fwd;
    ops.rope = r_rope;
    ops.attention_fwd = r_attention_fwd;
    ops.attention_bwd = r_attention_bwd;
    ops.attention_step = r_attention_step;
    ops.swiglu_fwd = r_swiglu_fwd;
    ops.swiglu_bwd = r_swiglu_bwd;
    ops.xent_fused = r_xent_fused;
    ops.xent_max = r_xent_max;
    ops.xent_sumexp = r_xent_sumexp;
    ops.xent_target = r_xent_target;
    ops.xent_loss = r_xent_loss;
    ops.xent_bwd = r_xent_bwd;
    ops.adamw = r_adamw;
    ops.destroy = r_destroy;
    wrapped = *cpu;
    wrapped.ops = &ops;
    return &wrapped;
}
