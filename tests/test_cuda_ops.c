/*
 * test_cuda_ops.c - every op of the CUDA backend against the CPU reference
 * backend on the same random inputs, the bf16 and fused ops of cuda.h against
 * compositions of CPU ops, and determinism (two runs, same bits). Exits 77
 * (ctest SKIP_RETURN_CODE: "skipped: no CUDA device") where no GPU is usable.
 *
 * Tolerance (fp32). Both backends compute each output as an fp32 sum of K
 * terms, in different orders (and the GPU contracts a*b+c into one FMA). By
 * the forward error bound of recursive summation (Higham, "Accuracy and
 * Stability of Numerical Algorithms", 2nd ed., eq. 4.4), each result lies
 * within gamma_K * S of the exact one, gamma_K = K u / (1 - K u), u = 2^-24,
 * S = sum of |terms|; so the two differ by at most 2 gamma_K S. S is bounded
 * from the ranges the inputs are drawn from (each check says how). Transcendentals (expf, cosf,
 * logf) differ by up to 2 ulp between glibc and CUDA (CUDA C Programming
 * Guide, table of single-precision function errors), which adds 4 u |out|
 * per evaluation chained in the output. A wrong index or a dropped term moves
 * an output by O(S) and fails by orders of magnitude.
 *
 * bf16: inputs are rounded to bf16 once and handed to both sides as the same
 * values, so GEMMs on bf16 inputs keep the fp32 bound; conversions are exact.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/backend.h"
#include "trainer/cuda/cuda.h"

static tks_backend *cpu, *gpu;
static int failures, checks;
static const double U = 5.9604644775390625e-8; /* 2^-24 */

static double gamma_k(double K) { return K * U / (1.0 - K * U); }

/* ---- random inputs (splitmix64) ----------------------------------------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}
static float *rnd(size_t n, float lo, float hi) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (float)(lo + (hi - lo) * urand());
    return h;
}

/* ---- a tensor on both backends --------------------------------------------------- */
typedef struct {
    float *c, *g; /* device pointers on cpu and gpu */
    size_t n;
} pair;
static pair put(const float *h, size_t n) {
    pair p = {cpu->alloc(cpu, n * 4 + 4), gpu->alloc(gpu, n * 4 + 4), n};
    cpu->upload(cpu, p.c, h, n * 4);
    gpu->upload(gpu, p.g, h, n * 4);
    return p;
}
static pair zeros(size_t n) {
    pair p = {cpu->alloc(cpu, n * 4 + 4), gpu->alloc(gpu, n * 4 + 4), n};
    return p;
}
static void drop(pair p) {
    cpu->free(cpu, p.c);
    gpu->free(gpu, p.g);
}
static float *host_of(tks_backend *be, const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    be->download(be, h, d, n * 4);
    return h;
}
static double maxabs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Compares gpu against cpu: |g - c| <= tol_abs + rel * |c| element-wise. */
static void cmp(const char *op, const char *what, pair p, double tol_abs, double rel) {
    float *c = host_of(cpu, p.c, p.n), *g = host_of(gpu, p.g, p.n);
    double worst = 0, worst_tol = tol_abs;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < p.n; i++) {
        double d = fabs((double)g[i] - c[i]), t = tol_abs + rel * fabs(c[i]);
        if (!(d <= t)) bad++, at = bad == 1 ? i : at;
        if (!(d / t <= worst / worst_tol)) worst = d, worst_tol = t;
    }
    checks++;
    int ok = bad == 0 && tks_cuda_backend_check(gpu) == 0;
    printf("%-22s %-44s max err %.2e (tol %.2e)  %s\n", op, what, worst, worst_tol, ok ? "ok" : "FAIL");
    if (!ok) {
        failures++;
        if (bad)
            printf("    %zu of %zu elements off; first at %zu: gpu %.9g cpu %.9g\n", bad, p.n, at,
                   g[at], c[at]);
        else
            printf("    %s\n", tks_last_error()->message);
    }
    free(c);
    free(g);
}
static void cmp_exact(const char *op, const char *what, pair p) { cmp(op, what, p, 0, 0); }

static void expect(int cond, const char *op, const char *what) {
    checks++;
    printf("%-22s %-44s %s\n", op, what, cond ? "ok" : "FAIL");
    if (!cond) failures++;
}

/* ---- ops --------------------------------------------------------------------------- */

static void t_gemm(void) {
    const int M = 67, N = 45, K = 131;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
                size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
                size_t nc = (size_t)M * ldc;
                float *ha = rnd(na, -1, 1), *hb = rnd(nb, -1, 1), *hc = rnd(nc, -1, 1);
                pair A = put(ha, na), Bm = put(hb, nb), Cm = put(hc, nc);
                float beta = acc ? 1.0f : 0.0f;
                cpu->gemm(cpu, ta, tb, M, N, K, 0.5f, A.c, lda, Bm.c, ldb, beta, Cm.c, ldc);
                gpu->gemm(gpu, ta, tb, M, N, K, 0.5f, A.g, lda, Bm.g, ldb, beta, Cm.g, ldc);
                /* S = 0.5 |A||B| + beta |C| <= 0.5 K + 1 for entries in [-1, 1] */
                double S = 0.5 * K + beta;
                char what[64];
                snprintf(what, sizeof what, "%c%c M%d N%d K%d beta %g", ta ? 'T' : 'N',
                         tb ? 'T' : 'N', M, N, K, beta);
                cmp("gemm", what, Cm, 2 * gamma_k(K + 1) * S, 0);
                /* bf16 inputs: both sides see the same rounded values */
                if (!ta && !tb) {
                    uint16_t *a16 = gpu->alloc(gpu, na * 2 + 2), *b16 = gpu->alloc(gpu, nb * 2 + 2);
                    tks_cuda_to_bf16(gpu, a16, A.g, na);
                    tks_cuda_to_bf16(gpu, b16, Bm.g, nb);
                    tks_cuda_from_bf16(gpu, A.g, a16, na);
                    tks_cuda_from_bf16(gpu, Bm.g, b16, nb);
                    float *ra = host_of(gpu, A.g, na), *rb = host_of(gpu, Bm.g, nb);
                    cpu->upload(cpu, A.c, ra, na * 4);
                    cpu->upload(cpu, Bm.c, rb, nb * 4);
                    cpu->upload(cpu, Cm.c, hc, nc * 4);
                    gpu->upload(gpu, Cm.g, hc, nc * 4);
                    cpu->gemm(cpu, 0, 0, M, N, K, 0.5f, A.c, lda, Bm.c, ldb, beta, Cm.c, ldc);
                    tks_cuda_gemm_bf16(gpu, 0, 0, M, N, K, 0.5f, a16, lda, b16, ldb, beta, Cm.g, ldc);
                    cmp("gemm_bf16", what, Cm, 2 * gamma_k(K + 1) * S, 0);
                    gpu->free(gpu, a16);
                    gpu->free(gpu, b16);
                    free(ra);
                    free(rb);
                }
                drop(A), drop(Bm), drop(Cm);
                free(ha), free(hb), free(hc);
            }
}

static void t_elementwise(void) {
    size_t n = 100003;
    float *ha = rnd(n, -3, 3), *hb = rnd(n, -3, 3), *hd = rnd(n, -1, 1);
    pair a = put(ha, n), b = put(hb, n), o = zeros(n);
    cpu->add(cpu, o.c, a.c, b.c, n);
    gpu->add(gpu, o.g, a.g, b.g, n);
    cmp_exact("add", "n 100003", o);
    cpu->scale(cpu, a.c, n, 0.37f);
    gpu->scale(gpu, a.g, n, 0.37f);
    cmp_exact("scale", "n 100003", a);
    /* SwiGLU: out = g sigma(g) u, one expf; backward chains the same expf */
    pair d = put(hd, n), dg = zeros(n), du = zeros(n);
    cpu->swiglu_fwd(cpu, o.c, a.c, b.c, n);
    gpu->swiglu_fwd(gpu, o.g, a.g, b.g, n);
    cmp("swiglu_fwd", "n 100003", o, 0, 16 * U);
    cpu->swiglu_bwd(cpu, dg.c, du.c, d.c, a.c, b.c, n);
    gpu->swiglu_bwd(gpu, dg.g, du.g, d.g, a.g, b.g, n);
    /* dgate = d u s (1 + g (1 - s)): the sum 1 + g(1-s) cancels by up to |g| */
    cmp("swiglu_bwd", "dup", du, 0, 16 * U);
    cmp("swiglu_bwd", "dgate", dg, 32 * U * 3 * 3 * 4, 16 * U);
    double sc = cpu->sumsq(cpu, b.c, n), sg = gpu->sumsq(gpu, b.g, n), sg2 = gpu->sumsq(gpu, b.g, n);
    /* both accumulate fp32 squares in double: error ~ n u_double S, far below */
    checks++;
    int ok = fabs(sg - sc) <= 1e-12 * sc && sg == sg2;
    printf("%-22s %-44s cpu %.15g gpu %.15g  %s\n", "sumsq", "n 100003, rerun identical", sc, sg,
           ok ? "ok" : "FAIL");
    failures += !ok;
    drop(a), drop(b), drop(o), drop(d), drop(dg), drop(du);
    free(ha), free(hb), free(hd);
}

static void t_embedding(void) {
    const int N = 300, C = 96, V = 50;
    const int64_t v0 = 20;
    int32_t ids[300];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(urand() * 90); /* some outside [v0, v0+V) */
    int32_t *idc = cpu->alloc(cpu, sizeof ids), *idg = gpu->alloc(gpu, sizeof ids);
    cpu->upload(cpu, idc, ids, sizeof ids);
    gpu->upload(gpu, idg, ids, sizeof ids);
    float *hw = rnd((size_t)V * C, -1, 1), *hd = rnd((size_t)N * C, -1, 1);
    pair w = put(hw, (size_t)V * C), o = zeros((size_t)N * C), d = put(hd, (size_t)N * C);
    cpu->embedding_fwd(cpu, o.c, idc, w.c, N, C, v0, V);
    gpu->embedding_fwd(gpu, o.g, idg, w.g, N, C, v0, V);
    cmp_exact("embedding_fwd", "N 300 C 96 shard [20, 70)", o);
    cpu->embedding_bwd(cpu, w.c, d.c, idc, N, C, v0, V);
    gpu->embedding_bwd(gpu, w.g, d.g, idg, N, C, v0, V);
    /* same summation order as the CPU (ids in order): bitwise equal */
    cmp_exact("embedding_bwd", "accumulates in id order: bitwise", w);
    cpu->free(cpu, idc);
    gpu->free(gpu, idg);
    drop(w), drop(o), drop(d);
    free(hw), free(hd);
}

static void t_rmsnorm(void) {
    const int N = 70, C = 1000;
    size_t n = (size_t)N * C;
    float *hx = rnd(n, -2, 2), *hw = rnd(C, 0.5f, 1.5f), *hd = rnd(n, -1, 1), *hr = rnd(n, -1, 1);
    pair x = put(hx, n), w = put(hw, C), o = zeros(n), r = zeros(N), d = put(hd, n);
    pair dx = put(hr, n), dw = put(hw, C);
    cpu->rmsnorm_fwd(cpu, o.c, r.c, x.c, w.c, N, C, 1e-5f);
    gpu->rmsnorm_fwd(gpu, o.g, r.g, x.g, w.g, N, C, 1e-5f);
    /* rstd from a sum of C squares (relative gamma_C, halved by the sqrt) */
    cmp("rmsnorm_fwd", "rstd", r, 0, gamma_k(C) + 4 * U);
    cmp("rmsnorm_fwd", "out", o, 0, gamma_k(C) + 8 * U);
    cpu->rmsnorm_bwd(cpu, dx.c, dw.c, d.c, x.c, w.c, r.c, N, C);
    gpu->rmsnorm_bwd(gpu, dx.g, dw.g, d.g, x.g, w.g, r.g, N, C);
    /* dx = g w r - k x with k from a C-term dot: |terms| <= (|g w| r + |k x|) */
    double S = 1.5 * maxabs(hx, n) + 2 * maxabs(hx, n);
    cmp("rmsnorm_bwd", "dx (accumulated)", dx, 4 * gamma_k(C) * S * 2, 0);
    /* dw[c] = sum over N rows of g x r: S <= N * 1 * 2 * 1/rms */
    cmp("rmsnorm_bwd", "dw (accumulated)", dw, 2 * gamma_k(N + 4) * (N * 2.0 * 2 + 1.5), 0);
    drop(x), drop(w), drop(o), drop(r), drop(d), drop(dx), drop(dw);
    free(hx), free(hw), free(hd), free(hr);
}

static void t_rope(void) {
    const int B = 2, T = 37, H = 3, HD = 64;
    size_t n = (size_t)B * T * H * HD;
    float *hx = rnd(n, -1, 1);
    for (int inv = 0; inv < 2; inv++) {
        pair x = put(hx, n);
        cpu->rope(cpu, x.c, B, T, H, HD, 1000, 10000.0f, inv);
        gpu->rope(gpu, x.g, B, T, H, HD, 1000, 10000.0f, inv);
        /* angle p * inv_freq: powf and the product differ by ~2 ulp, so the
         * angle by 4 u p (p <= 1037); cos/sin by 2 ulp each; out = x1 c - x2 s */
        double dang = 8 * U * 1037;
        cmp("rope", inv ? "inverse, p0 1000" : "p0 1000", x, 2 * (dang + 8 * U), 0);
        drop(x);
    }
    free(hx);
}

static void t_attention(void) {
    const int B = 2, T = 33, NH = 4, NKV = 2, HD = 16;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, np = (size_t)B * NH * T * T;
    float *hq = rnd(nq, -1, 1), *hk = rnd(nk, -1, 1), *hv = rnd(nk, -1, 1), *hd = rnd(nq, -1, 1);
    pair q = put(hq, nq), k = put(hk, nk), v = put(hv, nk), o = zeros(nq), P = zeros(np);
    pair d = put(hd, nq), dq = zeros(nq), dk = zeros(nk), dv = zeros(nk);
    cpu->attention_fwd(cpu, o.c, P.c, q.c, k.c, v.c, B, T, NH, NKV, HD);
    gpu->attention_fwd(gpu, o.g, P.g, q.g, k.g, v.g, B, T, NH, NKV, HD);
    /* scores: HD-term dots of size <= HD/sqrt(HD) = 4; exp turns an absolute
     * score error e into a relative one; the softmax sums T terms */
    double escore = 2 * gamma_k(HD) * 4 + 4 * U * 4, eP = escore * 2 + gamma_k(T) + 8 * U;
    cmp("attention_fwd", "probs B2 T33 NH4 NKV2 HD16", P, 0, eP);
    cmp("attention_fwd", "out", o, 2 * (eP + gamma_k(T)), 0);
    cpu->attention_bwd(cpu, dq.c, dk.c, dv.c, d.c, P.c, q.c, k.c, v.c, B, T, NH, NKV, HD);
    gpu->attention_bwd(gpu, dq.g, dk.g, dv.g, d.g, P.g, q.g, k.g, v.g, B, T, NH, NKV, HD);
    /* dP dots HD terms (<= 16), dS = P (dP - D) / 4, sums over T and the group */
    double G = NH / NKV, edS = (2 * gamma_k(HD) * 16 * 2 + eP * 32) / 4;
    cmp("attention_bwd", "dq", dq, 2 * (edS * T + gamma_k(T) * T * 8), 0);
    cmp("attention_bwd", "dk", dk, 2 * (edS * T * G + gamma_k(T * G) * T * G * 8), 0);
    cmp("attention_bwd", "dv", dv, 2 * (eP * T * G + gamma_k(T * G) * T * G), 0);
    /* decode step: the last row of the forward, from caches [T, NKV, HD] of batch 0 */
    pair os = zeros((size_t)NH * HD);
    int t = T - 1;
    cpu->attention_step(cpu, os.c, q.c + (size_t)t * NH * HD, k.c, v.c, t, NH, NKV, HD);
    gpu->attention_step(gpu, os.g, q.g + (size_t)t * NH * HD, k.g, v.g, t, NH, NKV, HD);
    cmp("attention_step", "t 32", os, 2 * (eP + gamma_k(T)), 0);
    drop(q), drop(k), drop(v), drop(o), drop(P), drop(d), drop(dq), drop(dk), drop(dv), drop(os);
    free(hq), free(hk), free(hv), free(hd);
}

static void t_xent(void) {
    const int N = 40, V = 1088, VR = 1000;
    const int64_t v0 = 0;
    size_t n = (size_t)N * V;
    float *hl = rnd(n, -4, 4);
    int32_t tg[40];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(urand() * VR);
    int32_t *tc = cpu->alloc(cpu, sizeof tg), *tgp = gpu->alloc(gpu, sizeof tg);
    cpu->upload(cpu, tc, tg, sizeof tg);
    gpu->upload(gpu, tgp, tg, sizeof tg);
    pair l = put(hl, n), mx = zeros(N), sm = zeros(N), t = zeros(N), loss = zeros(N), dl = zeros(n);
    cpu->xent_max(cpu, mx.c, l.c, N, V, VR);
    gpu->xent_max(gpu, mx.g, l.g, N, V, VR);
    cmp_exact("xent_max", "N 40 V 1088 VR 1000", mx);
    cpu->xent_sumexp(cpu, sm.c, l.c, mx.c, N, V, VR);
    gpu->xent_sumexp(gpu, sm.g, l.g, mx.g, N, V, VR);
    cmp("xent_sumexp", "", sm, 0, 2 * gamma_k(VR) + 8 * U);
    cpu->xent_target(cpu, t.c, l.c, tc, N, V, v0, VR);
    gpu->xent_target(gpu, t.g, l.g, tgp, N, V, v0, VR);
    cmp_exact("xent_target", "", t);
    cpu->xent_loss(cpu, loss.c, mx.c, sm.c, t.c, N);
    gpu->xent_loss(gpu, loss.g, mx.g, sm.g, t.g, N);
    /* log of a sum with relative error e: absolute e; plus |mx|+|tgt| <= 8 */
    double el = 2 * gamma_k(VR) + 8 * U + 8 * 4 * U;
    cmp("xent_loss", "", loss, el, 0);
    cpu->xent_bwd(cpu, dl.c, l.c, mx.c, sm.c, tc, N, V, v0, VR, 0.25f);
    gpu->xent_bwd(gpu, dl.g, l.g, mx.g, sm.g, tgp, N, V, v0, VR, 0.25f);
    cmp("xent_bwd", "scale 0.25", dl, 0.25 * (2 * gamma_k(VR) + 16 * U), 0);
    /* fused: loss and dlogits in place, against the staged CPU result */
    pair lf = put(hl, n), lossf = zeros(N);
    tks_cuda_xent_fused(gpu, lf.g, lossf.g, tgp, N, V, VR, 0.25f);
    float *hloss = host_of(gpu, lossf.g, N);
    gpu->upload(gpu, loss.g, hloss, N * 4);
    cmp("xent_fused", "loss", loss, el, 0);
    float *hdl = host_of(gpu, lf.g, n);
    gpu->upload(gpu, dl.g, hdl, n * 4);
    cmp("xent_fused", "dlogits in place", dl, 0.25 * (2 * gamma_k(VR) + 16 * U), 0);
    free(hloss), free(hdl);
    cpu->free(cpu, tc);
    gpu->free(gpu, tgp);
    drop(l), drop(mx), drop(sm), drop(t), drop(loss), drop(dl), drop(lf), drop(lossf);
    free(hl);
}

static void t_adamw(void) {
    size_t n = 50001;
    float *hp = rnd(n, -1, 1), *hg = rnd(n, -1, 1), *hm = rnd(n, -0.1f, 0.1f), *hv = rnd(n, 0, 0.01f);
    pair p = put(hp, n), g = put(hg, n), m = put(hm, n), v = put(hv, n);
    cpu->adamw(cpu, p.c, g.c, m.c, v.c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f);
    gpu->adamw(gpu, p.g, g.g, m.g, v.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f);
    /* a handful of roundings per element (FMA contraction on the GPU) */
    /* m = b1 m + (1-b1) g can cancel: bound by its terms (|m| <= 0.1, |g| <= 0.5);
     * v has positive terms only; p = p decay - step m / denom, |p| <= 1 */
    cmp("adamw", "m", m, 4 * U * (0.9 * 0.1 + 0.1 * 0.5), 0);
    cmp("adamw", "v", v, 0, 8 * U);
    cmp("adamw", "p", p, 4 * U * 1.0 + 8 * U * 1e-3 / (1 - 0.478), 0);
    /* flat variant: grad scale read on the device, bf16 copy written */
    pair p2 = put(hp, n), m2 = put(hm, n), v2 = put(hv, n);
    float gsh[2] = {0, 0.5f};
    float *gs = gpu->alloc(gpu, sizeof gsh);
    gpu->upload(gpu, gs, gsh, sizeof gsh);
    uint16_t *p16 = gpu->alloc(gpu, n * 2 + 2);
    tks_cuda_adamw_flat(gpu, p2.g, p16, g.g, m2.g, v2.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, gs);
    float *a = host_of(gpu, p.g, n), *b = host_of(gpu, p2.g, n);
    uint16_t *c16 = malloc(n * 2);
    gpu->download(gpu, c16, p16, n * 2);
    size_t diff = 0, diff16 = 0;
    for (size_t i = 0; i < n; i++) {
        diff += memcmp(&a[i], &b[i], 4) != 0;
        uint32_t bits;
        memcpy(&bits, &b[i], 4);
        uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16; /* RNE, finite values */
        diff16 += c16[i] != (uint16_t)r;
    }
    expect(diff == 0, "adamw_flat", "same bits as be->adamw (device grad scale)");
    expect(diff16 == 0, "adamw_flat", "bf16 copy = RNE of the fp32 master");
    free(a), free(b), free(c16);
    gpu->free(gpu, gs);
    gpu->free(gpu, p16);
    drop(p), drop(g), drop(m), drop(v), drop(p2), drop(m2), drop(v2);
    free(hp), free(hg), free(hm), free(hv);
}

static void t_bf16_and_fused(void) {
    /* conversions: exact round to nearest even, incl. ties and specials */
    float special[] = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie: 1 + 2^-8 */, 1.01171875f,
                       3.3895314e38f, INFINITY, -INFINITY, 1e-40f /* subnormal */};
    size_t ns = sizeof special / sizeof *special, n = 4096 + ns;
    float *h = rnd(n, -1000, 1000);
    memcpy(h, special, sizeof special);
    float *d = gpu->alloc(gpu, n * 4);
    uint16_t *d16 = gpu->alloc(gpu, n * 2);
    gpu->upload(gpu, d, h, n * 4);
    tks_cuda_to_bf16(gpu, d16, d, n);
    uint16_t *h16 = malloc(n * 2);
    gpu->download(gpu, h16, d16, n * 2);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &h[i], 4);
        uint16_t r = (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
        if (isinf(h[i])) r = (uint16_t)(bits >> 16);
        bad += h16[i] != r;
    }
    expect(bad == 0, "to_bf16", "round to nearest even, ties, inf, subnormal");
    tks_cuda_from_bf16(gpu, d, d16, n);
    float *back = host_of(gpu, d, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h16[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        bad += memcmp(&f, &back[i], 4) != 0;
    }
    expect(bad == 0, "from_bf16", "exact");
    free(h), free(h16), free(back);
    gpu->free(gpu, d);
    gpu->free(gpu, d16);

    /* fused residual + RMSNorm = add then rmsnorm on the CPU */
    const int N = 33, C = 512;
    size_t nn = (size_t)N * C;
    float *hr = rnd(nn, -2, 2), *hx = rnd(nn, -2, 2), *hw = rnd(C, 0.5f, 1.5f);
    pair res = put(hr, nn), x = put(hx, nn), w = put(hw, C), o = zeros(nn), r = zeros(N);
    uint16_t *o16 = gpu->alloc(gpu, nn * 2);
    cpu->add(cpu, res.c, res.c, x.c, nn);
    cpu->rmsnorm_fwd(cpu, o.c, r.c, res.c, w.c, N, C, 1e-5f);
    tks_cuda_residual_rmsnorm_fwd(gpu, res.g, o.g, o16, r.g, x.g, w.g, N, C, 1e-5f);
    cmp_exact("residual_rmsnorm_fwd", "residual", res);
    cmp("residual_rmsnorm_fwd", "out", o, 0, gamma_k(C) + 8 * U);
    gpu->free(gpu, o16);
    drop(res), drop(x), drop(w), drop(o), drop(r);
    free(hr), free(hx), free(hw);

    /* global norm over several tensors = sqrt of the sum of CPU sumsq; twice
     * the same bits; clip factor */
    size_t sz[3] = {1000, 77777, 3};
    float *hs[3];
    pair ps[3];
    double ref = 0;
    for (int i = 0; i < 3; i++) {
        hs[i] = rnd(sz[i], -1, 1);
        ps[i] = put(hs[i], sz[i]);
        ref += cpu->sumsq(cpu, ps[i].c, sz[i]);
    }
    const float *xs[3] = {ps[0].g, ps[1].g, ps[2].g};
    float *out = gpu->alloc(gpu, 8), o1[2], o2[2];
    tks_cuda_global_norm(gpu, out, xs, sz, 3, 1.0f);
    gpu->download(gpu, o1, out, 8);
    tks_cuda_global_norm(gpu, out, xs, sz, 3, 1.0f);
    gpu->download(gpu, o2, out, 8);
    double nr = sqrt(ref);
    expect(fabs(o1[0] - nr) <= 2 * U * nr, "global_norm", "3 tensors vs CPU sumsq (fp32 result)");
    expect(!memcmp(o1, o2, sizeof o1), "global_norm", "rerun: same bits");
    expect(fabs(o1[1] - 1.0 / (nr + 1e-6)) <= 4 * U, "global_norm", "clip factor 1/norm");
    gpu->free(gpu, out);
    for (int i = 0; i < 3; i++) drop(ps[i]), free(hs[i]);
}

int main(void) {
    if (tks_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n",
               tks_cuda_built() ? "built with CUDA, none visible" : "built without CUDA");
        return 77;
    }
    cpu = tks_cpu_backend_create(0);
    int rc = tks_cuda_backend_create(-1, &gpu);
    if (rc || !cpu) {
        fprintf(stderr, "test_cuda_ops: %s\n", tks_last_error()->message);
        return 1;
    }
    char desc[512];
    tks_cuda_describe(gpu, desc, sizeof desc);
    printf("device: %s\n", desc);
    t_gemm();
    t_elementwise();
    t_embedding();
    t_rmsnorm();
    t_rope();
    t_attention();
    t_xent();
    t_adamw();
    t_bf16_and_fused();
    if (tks_cuda_backend_check(gpu)) {
        printf("backend error: %s\n", tks_last_error()->message);
        failures++;
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("test_cuda_ops: %d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
