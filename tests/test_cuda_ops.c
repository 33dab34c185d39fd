/*
 * test_cuda_ops.c - every op of the CUDA backend (backend.h)
 * against the CPU reference backend on the same random inputs, in fp32 and
 * in bf16 storage; determinism (two runs, same bits); streams and events; the
 * sticky error. Exits 77 (ctest SKIP_RETURN_CODE: "skipped: no CUDA device")
 * where no GPU is usable.
 *
 * Tolerance, fp32. Both backends compute each output as an fp32 sum of K
 * terms, in different orders (and the GPU contracts a*b+c into one FMA). By
 * the forward error bound of recursive summation (Higham, "Accuracy and
 * Stability of Numerical Algorithms", 2nd ed., eq. 4.4) each result lies
 * within gamma_K * S of the exact one, gamma_K = K u / (1 - K u), u = 2^-24,
 * S = sum of |terms|; so the two differ by at most 2 gamma_K S. S is bounded
 * from the ranges the inputs are drawn from (each check says how).
 * Transcendentals (expf, cosf, logf, powf) differ by a few ulp between glibc
 * and CUDA (CUDA C Programming Guide, single-precision function error table:
 * at most 2 ulp for exp, log, sin, cos; 4 for pow), which adds 4-8 u |out|
 * per evaluation chained into an output.
 *
 * Tolerance, bf16. Inputs are rounded to bf16 once and both backends get the
 * same values; arithmetic is fp32 in both, and only the stored output is
 * rounded (nearest even). Two fp32 results within d of each other round to
 * bf16 values within d + one bf16 ulp (2^-7 relative), so the bf16 bound is
 * the fp32 one plus 2^-7 |out|.
 *
 * A wrong index or a dropped term moves an output by O(S) and fails by
 * orders of magnitude.
 *
 * The opt-in kernels (cuda.h's switches, README: unverified on a GPU) get
 * their ops' checks a second time with each on, and a bitwise check against
 * the default kernel where the arithmetic is the same; the chunked loss head
 * (trainer/model/loss_head.h) is checked against the whole logits, and the
 * vectorized optimizer step's quad iteration on the host.
 *
 * TKS_TEST_CPU_AS_GPU=1 runs the "GPU" side on a second implementation on
 * the CPU (tests/cuda_ops_ref64.c: the arithmetic ops in fp64 from the same
 * stored inputs, rounded once), so that every check, bound and buffer of
 * this test is exercised on a machine without a GPU: a bound that the CPU's
 * own rounding error does not fit in half of, or a test bug, fails there.
 * cuDNN's attention is skipped in that mode; the rest runs. Not a GPU test.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/cuda/cuda.h"
#include "trainer/cuda/quad_spans.h"
#include "trainer/model/loss_head.h"
#include "tests/cuda_ops_ref64.h"

static tks_backend *cpu, *gpu;
static int harness; /* TKS_TEST_CPU_AS_GPU=1: gpu is the fp64 second implementation */
/* tks_cuda_set_flash on the GPU; in the harness only tokshard's kernel (0) exists */
static int set_flash(int on) { return harness ? 0 : tks_cuda_set_flash(gpu, on); }
/* the opt-in kernels' switches (cuda.h) on the GPU; the harness has one
 * form of each op, so it runs the same checks again */
static int set_kernel(int (*set)(tks_backend *, int), int on) { return harness ? on : set(gpu, on); }
static int set_vec_optim(int on) { return set_kernel(tks_cuda_set_vec_optim, on); }
/* the CPU reference's workspace: its bf16 GEMM panels, RMSNorm's weight
 * gradient columns, RoPE's angle table and attention's tiles come from it
 * (backend.h); set for the whole test, sized for every shape below */
static void *cpu_ws;
static size_t cpu_ws_bytes;
static int failures, checks;
static const double U = 5.9604644775390625e-8; /* 2^-24 */
static const double UB = 0.0078125;            /* 2^-7: one bf16 ulp, relative */

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

/* ---- a tensor of dtype dt on both backends ---------------------------------------- */
typedef struct {
    void *c, *g; /* device pointers on cpu and gpu */
    size_t n;
    tks_dtype dt;
} pair;
static void *to_dt(const float *h, size_t n, tks_dtype dt) {
    void *b = malloc(n * tks_dtype_size(dt) + 4);
    for (size_t i = 0; i < n; i++) {
        if (dt == TKS_BF16) ((uint16_t *)b)[i] = tks_bf16_from_f32(h[i]);
        else ((float *)b)[i] = h[i];
    }
    return b;
}
static pair put(const float *h, size_t n, tks_dtype dt) {
    size_t bytes = n * tks_dtype_size(dt);
    pair p = {cpu->ops->alloc(cpu, bytes + 64), gpu->ops->alloc(gpu, bytes + 64), n, dt};
    void *b = to_dt(h, n, dt);
    cpu->ops->upload(cpu, p.c, b, bytes);
    gpu->ops->upload(gpu, p.g, b, bytes);
    free(b);
    return p;
}
static pair zeros(size_t n, tks_dtype dt) {
    size_t bytes = n * tks_dtype_size(dt);
    pair p = {cpu->ops->alloc(cpu, bytes + 64), gpu->ops->alloc(gpu, bytes + 64), n, dt};
    return p;
}
static void drop(pair p) {
    cpu->ops->free(cpu, p.c);
    gpu->ops->free(gpu, p.g);
}
/* host fp32 copy of n elements of dtype dt at device pointer d */
static float *host_of(tks_backend *be, const void *d, size_t n, tks_dtype dt) {
    size_t bytes = n * tks_dtype_size(dt);
    void *b = malloc(bytes + 4);
    be->ops->download(be, b, d, bytes);
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = dt == TKS_BF16 ? tks_bf16_to_f32(((uint16_t *)b)[i]) : ((float *)b)[i];
    free(b);
    return h;
}
/* host fp32 copy of h as dtype dt stores it (bf16: rounded to nearest even) */
static float *host_of_dt(const float *h, size_t n, tks_dtype dt) {
    float *o = malloc((n ? n : 1) * sizeof *o);
    for (size_t i = 0; i < n; i++) o[i] = dt == TKS_BF16 ? tks_bf16_to_f32(tks_bf16_from_f32(h[i])) : h[i];
    return o;
}
/* both sides get the CPU's values (for ops that read an earlier op's output) */
static void sync_to_cpu(pair p) {
    size_t bytes = p.n * tks_dtype_size(p.dt);
    void *b = malloc(bytes + 4);
    cpu->ops->download(cpu, b, p.c, bytes);
    gpu->ops->upload(gpu, p.g, b, bytes);
    free(b);
}

/* Row `row` (width w) of p holds `want` on both backends (NaN: NaN), exactly:
 * how an ignored target's row must look (a packed window's padding). */
static void exact_row(const char *op, pair p, size_t row, size_t w, float want) {
    float *c = host_of(cpu, p.c, p.n, p.dt), *g = host_of(gpu, p.g, p.n, p.dt);
    size_t bad = 0;
    for (size_t i = row * w; i < (row + 1) * w; i++)
        bad += isnan(want) ? !(isnan(c[i]) && isnan(g[i])) : !(c[i] == want && g[i] == want);
    checks++;
    printf("%-15s %-4s %-44s %s\n", op, tks_dtype_name(p.dt), "ignored target (-1): its row exact", bad ? "FAIL" : "ok");
    if (bad) {
        failures++;
        printf("    %zu of %zu elements of row %zu are not %g\n", bad, w, row, (double)want);
    }
    free(c);
    free(g);
}

/* Compares gpu against cpu: |g - c| <= tol_abs + rel |c| (+ UB |c| in bf16). */
static void cmp(const char *op, const char *what, pair p, double tol_abs, double rel) {
    float *c = host_of(cpu, p.c, p.n, p.dt), *g = host_of(gpu, p.g, p.n, p.dt);
    if (p.dt == TKS_BF16) rel += UB, tol_abs *= 1 + UB;
    double worst = 0, worst_tol = tol_abs > 0 ? tol_abs : 1e-300;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < p.n; i++) {
        double d = fabs((double)g[i] - c[i]), t = tol_abs + rel * fabs(c[i]);
        if (isnan(c[i]) && isnan(g[i])) continue; /* both mark the same ignored row (xent_target) */
        if (!(d <= t)) {
            if (!bad) at = i;
            bad++;
        }
        if (t > 0 && !(d / t <= worst / worst_tol)) worst = d, worst_tol = t;
    }
    checks++;
    /* the reference must have run too: a CPU op that failed (a sticky error)
     * leaves its output unwritten, which is no result to compare with */
    int cpu_ok = cpu->ops->sync(cpu) == 0;
    if (!cpu_ok) printf("    the CPU reference failed: %s\n", tks_last_error()->message);
    int ok = bad == 0 && cpu_ok && gpu->ops->sync(gpu) == 0;
    printf("%-15s %-4s %-44s max err %.2e (tol %.2e)  %s\n", op, tks_dtype_name(p.dt), what, worst,
           worst_tol, ok ? "ok" : "FAIL");
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
static void expect(int cond, const char *op, const char *what) {
    checks++;
    printf("%-15s %-49s %s\n", op, what, cond ? "ok" : "FAIL");
    if (!cond) failures++;
}

/* ---- ops --------------------------------------------------------------------------- */

static void t_gemm(void) {
    const int M = 67, N = 45, K = 131;
    tks_dtype io[3][2] = {{TKS_F32, TKS_F32}, {TKS_BF16, TKS_F32}, {TKS_BF16, TKS_BF16}};
    for (int ty = 0; ty < 3; ty++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    tks_dtype in = io[ty][0], out = io[ty][1];
                    size_t lda = (size_t)(ta ? M : K) + 3, ldb = (size_t)(tb ? K : N) + 1, ldc = (size_t)N + 2;
                    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
                    float *ha = rnd(na, -1, 1), *hb = rnd(nb, -1, 1), *hc = rnd(nc, -1, 1);
                    pair A = put(ha, na, in), Bm = put(hb, nb, in), Cm = put(hc, nc, out);
                    tks_gemm_args g = {ta, tb, M, N, K, 0.5f, NULL, in, lda, NULL, in, ldb,
                                       NULL, out, ldc, TKS_F32, acc};
                    g.A = A.c, g.B = Bm.c, g.C = Cm.c;
                    cpu->ops->gemm(cpu, &g);
                    g.A = A.g, g.B = Bm.g, g.C = Cm.g;
                    int rc = gpu->ops->gemm(gpu, &g);
                    /* S = 0.5 |A||B| + acc |C| <= 0.5 K + 1 for entries in [-1, 1] */
                    char what[80];
                    snprintf(what, sizeof what, "%c%c M%d N%d K%d in %s acc %d rc %d", ta ? 'T' : 'N',
                             tb ? 'T' : 'N', M, N, K, tks_dtype_name(in), acc, rc);
                    cmp("gemm", what, Cm, 2 * gamma_k(K + 1) * (0.5 * K + acc), 0);
                    drop(A), drop(Bm), drop(Cm);
                    free(ha), free(hb), free(hc);
                }
}

static void t_elementwise(tks_dtype dt) {
    size_t n = 100003;
    float *ha = rnd(n, -3, 3), *hb = rnd(n, -3, 3);
    pair a = put(ha, n, dt), b = put(hb, n, dt), o = zeros(n, dt);
    cpu->ops->add(cpu, o.c, a.c, b.c, n, dt);
    gpu->ops->add(gpu, o.g, a.g, b.g, n, dt);
    cmp("add", "n 100003", o, 0, 0); /* one correctly rounded fp32 add */
    /* convert both ways: exact to fp32, round to nearest even to bf16 */
    pair f = zeros(n, TKS_F32), h16 = zeros(n, TKS_BF16);
    cpu->ops->convert(cpu, f.c, TKS_F32, a.c, dt, n);
    gpu->ops->convert(gpu, f.g, TKS_F32, a.g, dt, n);
    cmp("convert", "to fp32", f, 0, 0);
    cpu->ops->convert(cpu, h16.c, TKS_BF16, f.c, TKS_F32, n);
    gpu->ops->convert(gpu, h16.g, TKS_BF16, f.g, TKS_F32, n);
    float *x = host_of(cpu, h16.c, n, TKS_BF16), *y = host_of(gpu, h16.g, n, TKS_BF16);
    expect(!memcmp(x, y, n * 4), "convert", "fp32 -> bf16 bitwise equal");
    free(x), free(y);
    drop(f), drop(h16);
    drop(a), drop(b), drop(o);
    free(ha), free(hb);
}

static void t_reductions(void) {
    size_t n = 300007;
    float *hx = rnd(n, -1, 1);
    pair x = put(hx, n, TKS_F32), s1 = zeros(1, TKS_F32);
    cpu->ops->scale(cpu, x.c, n, 0.37f);
    gpu->ops->scale(gpu, x.g, n, 0.37f);
    cmp("scale", "n 300007", x, 0, 0);
    tks_span sp[3] = {{0, 1000, 0}, {5000, 77777, 0}, {n - 3, 3, 0}};
    cpu->ops->sumsq(cpu, s1.c, x.c, sp, 3, 0);
    gpu->ops->sumsq(gpu, s1.g, x.g, sp, 3, 0);
    /* both sum in fp64 and round once to fp32 */
    cmp("sumsq", "3 spans into a device scalar", s1, 0, 2 * U);
    cpu->ops->sumsq(cpu, s1.c, x.c, sp, 1, 1);
    gpu->ops->sumsq(gpu, s1.g, x.g, sp, 1, 1);
    cmp("sumsq", "accumulate", s1, 0, 4 * U);
    float a1[1], a2[1];
    gpu->ops->sumsq(gpu, s1.g, x.g, sp, 3, 0);
    gpu->ops->download(gpu, a1, s1.g, 4);
    gpu->ops->sumsq(gpu, s1.g, x.g, sp, 3, 0);
    gpu->ops->download(gpu, a2, s1.g, 4);
    expect(!memcmp(a1, a2, 4), "sumsq", "two runs: same bits");
    cpu->ops->sum(cpu, s1.c, x.c, n, 0);
    gpu->ops->sum(gpu, s1.g, x.g, n, 0);
    /* fp64 sums of terms <= 0.37: the difference is far below one fp32 ulp of the
     * terms' magnitude (0.37 n u), not of the (cancelling) result */
    cmp("sum", "n 300007", s1, 0.37 * n * U, 2 * U);
    drop(x), drop(s1);
    free(hx);
}

/* ws = 0: no workspace, the fallback (one thread per column over the rows
 * in order); ws = 1: the workspace the backend sizes for these rows, the sort
 * by id and one warp per run of equal ids. Either way the same fp32 adds in
 * the same order as the CPU (position order per row): bitwise equal. The
 * larger case has a hot id (every third position), columns over several
 * 256-column chunks with a partial last one, and ids outside the shard. */
static void t_embedding(tks_dtype dt, int ws) {
    for (int shape = 0; shape < (ws ? 2 : 1); shape++) {
        const int N = shape ? 1000 : 300, C = shape ? 600 : 96, V = 50;
        const int64_t v0 = 20;
        int32_t *ids = malloc((size_t)N * sizeof *ids);
        for (int i = 0; i < N; i++) /* some outside [v0, v0+V) */
            ids[i] = shape && i % 3 == 0 ? 25 : (int32_t)(urand() * 90);
        int32_t *idc = cpu->ops->alloc(cpu, (size_t)N * 4), *idg = gpu->ops->alloc(gpu, (size_t)N * 4);
        cpu->ops->upload(cpu, idc, ids, (size_t)N * 4);
        gpu->ops->upload(gpu, idg, ids, (size_t)N * 4);
        void *wsg = NULL;
        if (ws) {
            tks_ws_shape sh = {.B = 1, .T = N, .C = C, .V = V, .Tcache = 1, .dt = dt};
            size_t wb = gpu->ops->workspace_bytes(gpu, &sh);
            wsg = gpu->ops->alloc(gpu, wb);
            gpu->ops->set_workspace(gpu, wsg, wb);
        }
        float *hw = rnd((size_t)V * C, -1, 1), *hd = rnd((size_t)N * C, -1, 1);
        pair w = put(hw, (size_t)V * C, dt), o = zeros((size_t)N * C, dt), d = put(hd, (size_t)N * C, dt);
        pair dw = put(hw, (size_t)V * C, TKS_F32);
        char what[80];
        if (!shape) {
            cpu->ops->embedding_fwd(cpu, o.c, idc, w.c, N, C, v0, V, dt);
            gpu->ops->embedding_fwd(gpu, o.g, idg, w.g, N, C, v0, V, dt);
            cmp("embedding_fwd", "N 300 C 96 shard [20, 70)", o, 0, 0);
        }
        cpu->ops->embedding_bwd(cpu, dw.c, d.c, idc, N, C, v0, V, dt);
        gpu->ops->embedding_bwd(gpu, dw.g, d.g, idg, N, C, v0, V, dt);
        snprintf(what, sizeof what, "N %d C %d%s, %s: bitwise", N, C, shape ? " hot id" : "",
                 ws ? "sorted by id" : "no workspace");
        cmp("embedding_bwd", what, dw, 0, 0);
        if (ws) {
            gpu->ops->set_workspace(gpu, NULL, 0);
            gpu->ops->free(gpu, wsg);
        }
        cpu->ops->free(cpu, idc);
        gpu->ops->free(gpu, idg);
        drop(w), drop(o), drop(d), drop(dw);
        free(hw), free(hd), free(ids);
    }
}

/* ws: with a GPU workspace set, the weight gradient takes the two-stage
 * chunked path (64 row chunks, then chunk order); without, one pass per column */
static void t_rmsnorm(tks_dtype dt, int ws) {
    const int N = 70, C = 1000;
    void *gws = NULL;
    if (ws) {
        gws = gpu->ops->alloc(gpu, 64 * (size_t)C * sizeof(float));
        gpu->ops->set_workspace(gpu, gws, 64 * (size_t)C * sizeof(float));
    }
    size_t n = (size_t)N * C;
    float *hx = rnd(n, -2, 2), *hw = rnd(C, 0.5f, 1.5f), *hd = rnd(n, -1, 1), *hr = rnd(n, -1, 1);
    pair x = put(hx, n, dt), w = put(hw, C, dt), o = zeros(n, dt), r = zeros(N, TKS_F32);
    pair d = put(hd, n, dt), dx = put(hr, n, dt), dw = put(hw, C, TKS_F32);
    cpu->ops->rmsnorm_fwd(cpu, o.c, r.c, x.c, w.c, N, C, 1e-5f, dt);
    gpu->ops->rmsnorm_fwd(gpu, o.g, r.g, x.g, w.g, N, C, 1e-5f, dt);
    /* rstd from a sum of C positive squares: relative gamma_C (halved by the sqrt) */
    cmp("rmsnorm_fwd", "rstd", r, 0, gamma_k(C) + 4 * U);
    cmp("rmsnorm_fwd", "out", o, 0, gamma_k(C) + 8 * U);
    sync_to_cpu(r);
    cpu->ops->rmsnorm_bwd(cpu, dx.c, dw.c, d.c, x.c, w.c, r.c, N, C, dt);
    gpu->ops->rmsnorm_bwd(gpu, dx.g, dw.g, d.g, x.g, w.g, r.g, N, C, dt);
    /* dx = dx0 + g w r - k x, k = r^3/C sum_C g w x: |g w x| <= 3 per term, r <= 2
     * (rms of U(-2,2) rows ~1.15), so |k x| error <= 2 gamma_C 3 r^3 |x| <= 96 gamma_C;
     * the three-term update adds 4 u (1 + 3 + 2 * 8) */
    cmp("rmsnorm_bwd", "dx (accumulated)", dx, 96 * gamma_k(C) + 80 * U, 0);
    /* dw[c] += sum over N rows of g x r: |terms| <= 4, S <= 4 N + 1.5 */
    cmp("rmsnorm_bwd", ws ? "dw (accumulated, chunked)" : "dw (accumulated)", dw,
        2 * gamma_k(N + 1) * (4.0 * N + 1.5), 0);
    if (ws) {
        gpu->ops->set_workspace(gpu, NULL, 0);
        gpu->ops->free(gpu, gws);
    }
    drop(x), drop(w), drop(o), drop(r), drop(d), drop(dx), drop(dw);
    free(hx), free(hw), free(hd), free(hr);
}

/* the residual add fused with the RMSNorm: the sum is one correctly rounded
 * add (bitwise, as add's check), the norm of the stored sum has rmsnorm_fwd's
 * bounds (|sum| <= 4 instead of 2 changes no relative bound); the sum written
 * over its first input, as the model does */
static void t_add_rmsnorm(tks_dtype dt) {
    const int N = 70, C = 1000;
    size_t n = (size_t)N * C;
    float *ha = rnd(n, -2, 2), *hb = rnd(n, -2, 2), *hw = rnd(C, 0.5f, 1.5f);
    pair a = put(ha, n, dt), b = put(hb, n, dt), w = put(hw, C, dt), o = zeros(n, dt), r = zeros(N, TKS_F32);
    cpu->ops->add_rmsnorm_fwd(cpu, a.c, o.c, r.c, a.c, b.c, w.c, N, C, 1e-5f, dt);
    gpu->ops->add_rmsnorm_fwd(gpu, a.g, o.g, r.g, a.g, b.g, w.g, N, C, 1e-5f, dt);
    cmp("add_rmsnorm_fwd", "sum (over a)", a, 0, 0);
    cmp("add_rmsnorm_fwd", "rstd", r, 0, gamma_k(C) + 4 * U);
    cmp("add_rmsnorm_fwd", "out", o, 0, gamma_k(C) + 8 * U);
    drop(a), drop(b), drop(w), drop(o), drop(r);
    free(ha), free(hb), free(hw);
}

static void t_rope(tks_dtype dt) {
    const int B = 2, T = 37, H = 3, HD = 64;
    size_t ld = (size_t)H * HD + 128; /* a view into a wider (fused) row */
    size_t n = (size_t)B * T * ld;
    float *hx = rnd(n, -1, 1);
    for (int inv = 0; inv < 2; inv++) {
        pair x = put(hx, n, dt);
        cpu->ops->rope(cpu, x.c, ld, B, T, H, HD, 1000, NULL, 10000.0f, inv, dt);
        gpu->ops->rope(gpu, x.g, ld, B, T, H, HD, 1000, NULL, 10000.0f, inv, dt);
        /* angle p * inv_freq with p <= 1037: powf (4 ulp), the division and the
         * product give a relative error <= 6 u, an absolute one <= 6 u 1037; cos
         * and sin add 2 ulp each; out = x1 c - x2 s with |x| <= 1 */
        cmp("rope", inv ? "inverse, p0 1000, ld > H*HD" : "p0 1000, ld > H*HD", x,
            2 * (6 * U * 1037 + 8 * U), 0);
        drop(x);
    }
    /* positions per token (restarting at packed documents: t - doc); each < T */
    int32_t *hp = malloc((size_t)B * T * sizeof *hp);
    for (int i = 0; i < B * T; i++) hp[i] = (i % T) % 11;
    int32_t *pc = cpu->ops->alloc(cpu, (size_t)B * T * 4), *pg = gpu->ops->alloc(gpu, (size_t)B * T * 4);
    cpu->ops->upload(cpu, pc, hp, (size_t)B * T * 4);
    gpu->ops->upload(gpu, pg, hp, (size_t)B * T * 4);
    for (int inv = 0; inv < 2; inv++) {
        pair x = put(hx, n, dt);
        cpu->ops->rope(cpu, x.c, ld, B, T, H, HD, 0, pc, 10000.0f, inv, dt);
        gpu->ops->rope(gpu, x.g, ld, B, T, H, HD, 0, pg, 10000.0f, inv, dt);
        /* positions below T = 37: the bound above with 37 for 1037 */
        cmp("rope", inv ? "inverse, pos per token" : "pos per token", x, 2 * (6 * U * 37 + 8 * U), 0);
        drop(x);
    }
    cpu->ops->free(cpu, pc);
    gpu->ops->free(gpu, pg);
    free(hp);
    free(hx);
}

/* RoPE with its angles once per row (tks_cuda_set_rope_rows): the same
 * angles and arithmetic as the per-element kernel, so the same bits, over
 * q and k's heads of a fused row (NH 4 + NKV 2 of HD 64, ld wider), with
 * p0 and with positions per token, forward and inverse. */
static void t_rope_rows_bits(tks_dtype dt) {
    const int B = 2, T = 37, H = 6, HD = 64;
    size_t ld = (size_t)H * HD + 128, n = (size_t)B * T * ld;
    float *hx = rnd(n, -1, 1);
    int32_t *hp = malloc((size_t)B * T * sizeof *hp);
    for (int i = 0; i < B * T; i++) hp[i] = (i % T) % 13;
    int32_t *pg = gpu->ops->alloc(gpu, (size_t)B * T * 4);
    gpu->ops->upload(gpu, pg, hp, (size_t)B * T * 4);
    size_t bad = 0;
    for (int k = 0; k < 4; k++) {
        int inv = k & 1;
        const int32_t *pos = k & 2 ? pg : NULL;
        float *out[2];
        for (int rows = 0; rows < 2; rows++) {
            pair x = put(hx, n, dt);
            set_kernel(tks_cuda_set_rope_rows, rows);
            gpu->ops->rope(gpu, x.g, ld, B, T, H, HD, pos ? 0 : 1000, pos, 10000.0f, inv, dt);
            out[rows] = host_of(gpu, x.g, n, dt);
            drop(x);
        }
        set_kernel(tks_cuda_set_rope_rows, 0);
        bad += memcmp(out[0], out[1], n * sizeof(float)) != 0;
        free(out[0]), free(out[1]);
    }
    char what[80];
    snprintf(what, sizeof what, "%s: angles per row == per element, bitwise", tks_dtype_name(dt));
    expect(bad == 0 && gpu->ops->sync(gpu) == 0, "rope", what);
    gpu->ops->free(gpu, pg);
    free(hx), free(hp);
}

/* cudnn: 0 = tokshard's kernel; 1 = cuDNN's fused attention (bf16 only),
 * which rounds the probabilities P (and dS in the backward) to bf16 before
 * their products: a relative 2^-9 on each term, so 2^-9 times the sum of
 * |terms| more: out sums P |v| <= 1; dq sums |dS| |k| with sum_u |dS| <= 8
 * (|dP|, |D| <= 16, scale 1/4, sum P = 1); dk, dv sum over T G rows. Its
 * exp2/log2 approximations add a few 1e-7 to lse.
 * docs = 1: packed documents (the doc argument: row 0 holds documents of 1,
 * 15, 16 and 1 tokens, row 1 of 20 and 13), block-causal on both backends;
 * cuDNN's graphs do not express it, so with cudnn = 1 tokshard's kernel
 * must run (and tks_cuda_flash_status say so): the bounds are the kernel's.
 * Each output sums fewer terms than the causal row's, so the causal bounds
 * hold. */
static void t_attention(tks_dtype dt, int cudnn, int docs) {
    const int B = 2, T = 33, NH = 4, NKV = 2, HD = 16;
    if (set_flash(cudnn) != cudnn) return;
    const double P9 = cudnn && !docs ? 0.001953125 : 0; /* 2^-9 */
    int32_t hdoc[2 * 33], *dc = NULL, *dgp = NULL;
    static const int len[] = {1, 15, 16, 1, 20, 13};
    for (int i = 0, t = 0; i < 6; i++)
        for (int j = 0, s0 = t % T; j < len[i]; j++, t++) hdoc[t] = s0;
    if (docs) {
        dc = cpu->ops->alloc(cpu, sizeof hdoc), dgp = gpu->ops->alloc(gpu, sizeof hdoc);
        cpu->ops->upload(cpu, dc, hdoc, sizeof hdoc);
        gpu->ops->upload(gpu, dgp, hdoc, sizeof hdoc);
    }
    /* q, k, v as views into one fused row [q | k | v] as the model lays them out */
    size_t ld = (size_t)(NH + 2 * NKV) * HD, n = (size_t)B * T * ld, ldo = (size_t)NH * HD;
    size_t no = (size_t)B * T * ldo, nl = (size_t)B * NH * T;
    float *hqkv = rnd(n, -1, 1), *hd = rnd(no, -1, 1);
    pair qkv = put(hqkv, n, dt), o = zeros(no, dt), lse = zeros(nl, TKS_F32), d = put(hd, no, dt);
    pair dqkv = zeros(n, dt);
    size_t koff = (size_t)NH * HD * tks_dtype_size(dt), voff = (size_t)(NH + NKV) * HD * tks_dtype_size(dt);
    tks_ws_shape ws = {B, T, NH * HD, NH, NKV, HD, 64, 64, T, dt};
    size_t wb = gpu->ops->workspace_bytes(gpu, &ws), wc = cpu->ops->workspace_bytes(cpu, &ws);
    void *wgpu = gpu->ops->alloc(gpu, wb), *wcpu = cpu->ops->alloc(cpu, wc);
    gpu->ops->set_workspace(gpu, wgpu, wb);
    cpu->ops->set_workspace(cpu, wcpu, wc);
#define AT(p, off) ((char *)(p) + (off))
    cpu->ops->attention_fwd(cpu, o.c, ldo, lse.c, qkv.c, ld, AT(qkv.c, koff), AT(qkv.c, voff), ld, dc, B, T, NH, NKV, HD, dt);
    gpu->ops->attention_fwd(gpu, o.g, ldo, lse.g, qkv.g, ld, AT(qkv.g, koff), AT(qkv.g, voff), ld, dgp, B, T, NH, NKV, HD, dt);
    /* scores: HD-term dots of size <= HD / sqrt(HD) = 4; lse = max + log(sum of
     * T exps): its absolute error is the scores' plus gamma_T; P = exp(s - lse)
     * has a relative error of both; out sums T terms P |v| <= 1 */
    double es = 2 * gamma_k(HD) * 4 + 4 * U * 4, eP = 2 * es + gamma_k(T) + 8 * U;
    const char *who = docs ? (cudnn ? "docs, cuDNN asked (falls back)" : "docs, tokshard kernel")
                           : cudnn ? "cuDNN" : "tokshard kernel";
    char what[96];
    snprintf(what, sizeof what, "%s: lse B2 T33 NH4 NKV2 HD16 (fused qkv)", who);
    cmp("attention_fwd", what, lse, 2 * es + gamma_k(T) + 8 * U + (cudnn ? 4e-6 : 0), 0);
    snprintf(what, sizeof what, "%s: out", who);
    cmp("attention_fwd", what, o, 2 * (eP + gamma_k(T)) + P9, 0);
    sync_to_cpu(o);
    sync_to_cpu(lse);
    char *dq = dqkv.c, *dg = dqkv.g;
    cpu->ops->attention_bwd(cpu, dq, AT(dq, koff), AT(dq, voff), d.c, o.c, ldo, lse.c, qkv.c, ld, AT(qkv.c, koff),
                       AT(qkv.c, voff), ld, dc, B, T, NH, NKV, HD, dt);
    gpu->ops->attention_bwd(gpu, dg, AT(dg, koff), AT(dg, voff), d.g, o.g, ldo, lse.g, qkv.g, ld, AT(qkv.g, koff),
                       AT(qkv.g, voff), ld, dgp, B, T, NH, NKV, HD, dt);
    /* dP dots of HD terms (<= 16), D = dO.O (<= 16), dS = P (dP - D) / 4 with
     * P's relative error eP: |dS error| <= (2 gamma_HD 32 + eP 32) / 4; dq, dk
     * sum T (times the group for dk) terms dS k, dv terms P dO (each <= 1) */
    double G = NH / NKV, edS = (2 * gamma_k(HD) * 32 + eP * 32) / 4;
    snprintf(what, sizeof what, "%s: dq, dk, dv (fused layout)", who);
    cmp("attention_bwd", what, dqkv,
        2 * (edS * T * G + gamma_k(T * G) * T * G * 8 + eP * T * G) + P9 * 8 * T * G, 0);
    /* decode step: the last row of batch 0 from caches [T, NKV, HD] */
    size_t nc = (size_t)T * NKV * HD;
    float *hk = rnd(nc, -1, 1), *hv = rnd(nc, -1, 1), *hq = rnd((size_t)NH * HD, -1, 1);
    pair kc = put(hk, nc, dt), vc = put(hv, nc, dt), q1 = put(hq, (size_t)NH * HD, dt), os = zeros((size_t)NH * HD, dt);
    cpu->ops->attention_step(cpu, os.c, q1.c, kc.c, vc.c, T - 1, NH, NKV, HD, dt);
    gpu->ops->attention_step(gpu, os.g, q1.g, kc.g, vc.g, T - 1, NH, NKV, HD, dt);
    cmp("attention_step", "t 32", os, 2 * (eP + gamma_k(T)), 0);
#undef AT
    if (cudnn) printf("    cuDNN status: %s\n", *tks_cuda_flash_status(gpu) ? tks_cuda_flash_status(gpu) : "ran");
    if (cudnn && docs) {
        checks++;
        if (!strstr(tks_cuda_flash_status(gpu), "document masking")) {
            failures++;
            printf("FAIL attention: with docs, tks_cuda_flash_status does not name the fallback: '%s'\n",
                   tks_cuda_flash_status(gpu));
        }
    }
    if (docs) cpu->ops->free(cpu, dc), gpu->ops->free(gpu, dgp);
    set_flash(1);
    gpu->ops->set_workspace(gpu, NULL, 0);
    cpu->ops->set_workspace(cpu, cpu_ws, cpu_ws_bytes);
    gpu->ops->free(gpu, wgpu);
    cpu->ops->free(cpu, wcpu);
    drop(qkv), drop(o), drop(lse), drop(d), drop(dqkv), drop(kc), drop(vc), drop(q1), drop(os);
    free(hqkv), free(hd), free(hk), free(hv), free(hq);
}

/* F 333 (no whole 16-byte vectors in a row: the scalar kernels) and 336
 * (the vectorized ones when on) */
static void t_swiglu(tks_dtype dt, int F) {
    const int M = 301;
    size_t n = (size_t)M * F;
    float *hgu = rnd(2 * n, -3, 3), *hd = rnd(n, -1, 1);
    pair gu = put(hgu, 2 * n, dt), o = zeros(n, dt), d = put(hd, n, dt), dgu = zeros(2 * n, dt);
    cpu->ops->swiglu_fwd(cpu, o.c, gu.c, M, F, dt);
    gpu->ops->swiglu_fwd(gpu, o.g, gu.g, M, F, dt);
    /* out = g sigma(g) u: one expf (2 ulp) and four roundings */
    cmp("swiglu_fwd", F == 333 ? "M 301 F 333 (fused gate|up)" : "M 301 F 336 (fused gate|up)", o, 0, 16 * U);
    cpu->ops->swiglu_bwd(cpu, dgu.c, d.c, gu.c, M, F, dt);
    gpu->ops->swiglu_bwd(gpu, dgu.g, d.g, gu.g, M, F, dt);
    /* dgate = d u s (1 + g (1 - s)): the sum 1 + g(1-s) cancels, so bound by its
     * terms (|g| <= 3): 16 u |d u| (1 + 3) <= 16 u 3 4 */
    cmp("swiglu_bwd", "dgate | dup", dgu, 16 * U * 3 * 4, 16 * U);
    drop(gu), drop(o), drop(d), drop(dgu);
    free(hgu), free(hd);
}

/* SwiGLU with 16-byte accesses (tks_cuda_set_swiglu_vec): each element's
 * arithmetic is the scalar kernels', so the same bits, forward and
 * backward, at F 336 (42 vectors of bf16, 84 of fp32 a row). */
static void t_swiglu_vec_bits(tks_dtype dt) {
    const int M = 301, F = 336;
    size_t n = (size_t)M * F;
    float *hgu = rnd(2 * n, -3, 3), *hd = rnd(n, -1, 1);
    pair gu = put(hgu, 2 * n, dt), d = put(hd, n, dt), o[2], dgu[2];
    for (int v = 0; v < 2; v++) {
        o[v] = zeros(n, dt), dgu[v] = zeros(2 * n, dt);
        set_kernel(tks_cuda_set_swiglu_vec, v);
        gpu->ops->swiglu_fwd(gpu, o[v].g, gu.g, M, F, dt);
        gpu->ops->swiglu_bwd(gpu, dgu[v].g, d.g, gu.g, M, F, dt);
    }
    set_kernel(tks_cuda_set_swiglu_vec, 0);
    float *a = host_of(gpu, o[0].g, n, dt), *b = host_of(gpu, o[1].g, n, dt);
    float *c = host_of(gpu, dgu[0].g, 2 * n, dt), *e = host_of(gpu, dgu[1].g, 2 * n, dt);
    char what[80];
    snprintf(what, sizeof what, "%s: 16-byte form == scalar, fwd and bwd bitwise", tks_dtype_name(dt));
    expect(!memcmp(a, b, n * 4) && !memcmp(c, e, 2 * n * 4) && gpu->ops->sync(gpu) == 0, "swiglu", what);
    free(a), free(b), free(c), free(e);
    drop(gu), drop(d), drop(o[0]), drop(o[1]), drop(dgu[0]), drop(dgu[1]);
    free(hgu), free(hd);
}

/* VR 1000 and 997: with 997 the real columns end mid-vector (16 bytes),
 * which the vectorized xent_fused takes one at a time */
static void t_xent(tks_dtype dt, int VR) {
    const int N = 40, V = 1088;
    size_t n = (size_t)N * V;
    float *hl = rnd(n, -4, 4);
    int32_t tg[40];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(urand() * VR);
    /* targets outside the real columns (a padding column, past the row)
     * read no logit and get no one-hot, on either backend; a negative one
     * (-1: padding of a packed window) is ignored: no loss, no gradient */
    tg[3] = VR, tg[7] = V + 100, tg[11] = -1, tg[13] = INT32_MAX;
    int32_t *tc = cpu->ops->alloc(cpu, sizeof tg), *tgp = gpu->ops->alloc(gpu, sizeof tg);
    cpu->ops->upload(cpu, tc, tg, sizeof tg);
    gpu->ops->upload(gpu, tgp, tg, sizeof tg);
    pair l = put(hl, n, dt), mx = zeros(N, TKS_F32), sm = zeros(N, TKS_F32), t = zeros(N, TKS_F32);
    pair loss = zeros(N, TKS_F32), dl = zeros(n, dt);
    cpu->ops->xent_max(cpu, mx.c, l.c, N, V, VR, dt);
    gpu->ops->xent_max(gpu, mx.g, l.g, N, V, VR, dt);
    cmp("xent_max", VR == 1000 ? "N 40 V 1088 VR 1000" : "N 40 V 1088 VR 997", mx, 0, 0);
    cpu->ops->xent_sumexp(cpu, sm.c, l.c, mx.c, N, V, VR, dt);
    gpu->ops->xent_sumexp(gpu, sm.g, l.g, mx.g, N, V, VR, dt);
    cmp("xent_sumexp", "", sm, 0, 2 * gamma_k(VR) + 8 * U);
    sync_to_cpu(sm);
    cpu->ops->xent_target(cpu, t.c, l.c, tc, N, V, 0, VR, dt);
    gpu->ops->xent_target(gpu, t.g, l.g, tgp, N, V, 0, VR, dt);
    cmp("xent_target", "", t, 0, 0);
    /* target -1 (row 11) is a packed window's padding: ignored, no loss and
     * no gradient (backend.h); xent_target marks it NaN for xent_loss */
    exact_row("xent_target", t, 11, 1, NAN);
    cpu->ops->xent_loss(cpu, loss.c, mx.c, sm.c, t.c, N);
    gpu->ops->xent_loss(gpu, loss.g, mx.g, sm.g, t.g, N);
    /* log (2 ulp) and two roundings of terms <= |log 1000| + 8 */
    double el = 8 * U * 16;
    cmp("xent_loss", "", loss, el, 0);
    exact_row("xent_loss", loss, 11, 1, 0.0f);
    cpu->ops->xent_bwd(cpu, dl.c, l.c, mx.c, sm.c, tc, N, V, 0, VR, 0.25f, dt);
    gpu->ops->xent_bwd(gpu, dl.g, l.g, mx.g, sm.g, tgp, N, V, 0, VR, 0.25f, dt);
    cmp("xent_bwd", "scale 0.25", dl, 0.25 * 16 * U, 16 * U);
    exact_row("xent_bwd", dl, 11, (size_t)V, 0.0f);
    /* fused: loss and dlogits in place; the sum is computed here, so its
     * rounding (gamma_VR) enters the loss and every probability */
    pair lf = put(hl, n, dt), lossf = zeros(N, TKS_F32);
    cpu->ops->xent_fused(cpu, lossf.c, lf.c, tc, N, V, VR, 0.25f, dt);
    gpu->ops->xent_fused(gpu, lossf.g, lf.g, tgp, N, V, VR, 0.25f, dt);
    cmp("xent_fused", "loss", lossf, el + 2 * gamma_k(VR), 0);
    cmp("xent_fused", "dlogits in place", lf, 0.25 * (2 * gamma_k(VR) + 16 * U), 2 * gamma_k(VR) + 16 * U);
    exact_row("xent_fused", lossf, 11, 1, 0.0f);
    exact_row("xent_fused", lf, 11, (size_t)V, 0.0f);
    cpu->ops->free(cpu, tc);
    gpu->ops->free(gpu, tgp);
    drop(l), drop(mx), drop(sm), drop(t), drop(loss), drop(dl), drop(lf), drop(lossf);
    free(hl);
}

/* The chunked loss head (trainer/model/loss_head.h: lm_head GEMM, fused
 * cross-entropy and the two backward GEMMs by chunks of rows) on the GPU,
 * chunks of 24 rows (24, 24, 22), against the CPU's whole logits (one chunk
 * of N rows: the model's path without TKS_LOSS_CHUNK_ROWS). An ignored row
 * (-1) and a target on a padding column are among the targets; lm_head's
 * gradient accumulates onto a random start.
 *
 * Bounds. h in [-1, 1], W in [-1/16, 1/16], C = 64: |logit| <= 4 and each is
 * an fp32 sum of C terms with S <= 4, so the two sides' logits differ by
 * d = 2 gamma_C 4 (bf16 storage: + one bf16 ulp, 2^-7 4). The loss is
 * logsumexp - the target's logit: 2 d, plus xent_fused's own rounding
 * (t_xent's bound). Each probability p moves relatively by exp(2 d) - 1
 * and the fused op's rounding (2 gamma_VR + 16 u), and in bf16 each side
 * rounds dlogits once (2^-8 of scale (p + onehot) each, the CPU's target
 * column twice): E relative to scale (p + onehot). dh sums VP terms dlogit
 * W with sum_j scale (p + onehot) = 2 scale: 2 |W| scale (E + 2 gamma_VP).
 * dW sums N terms dlogit h onto the start value: |h| scale (E + 2
 * gamma_{N+1}) P_j + 2 gamma_{N+1} |dW0|, P_j = sum_r (p + onehot) over
 * the rows, bounded by its largest column (from fp64 logits on the host, by
 * (1 + E) for the computed p). */
static void t_loss_head(tks_dtype dt) {
    enum { N = 70, C = 64, VP = 1088, VR = 1000, ROWS = 24 };
    const double hm = 1, wm = 1.0 / 16, scale = 1.0 / N;
    float *hh = rnd((size_t)N * C, -1, 1), *hw = rnd((size_t)VP * C, -1.0f / 16, 1.0f / 16);
    float *hg = rnd((size_t)VP * C, -1, 1);
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(urand() * VR);
    tg[5] = -1, tg[9] = VR;
    /* what the GEMMs read: the inputs as stored */
    float *h2 = host_of_dt(hh, (size_t)N * C, dt), *w2 = host_of_dt(hw, (size_t)VP * C, dt);
    double pmax = 0;
    {
        double *P = calloc(VR, sizeof *P), *l = malloc(VR * sizeof *l);
        for (int r = 0; r < N; r++) {
            if (tg[r] < 0) continue;
            double mx = -INFINITY, sm = 0;
            for (int j = 0; j < VR; j++) {
                double d = 0;
                for (int c = 0; c < C; c++) d += (double)h2[r * C + c] * w2[(size_t)j * C + c];
                l[j] = d;
                mx = d > mx ? d : mx;
            }
            for (int j = 0; j < VR; j++) sm += exp(l[j] - mx);
            for (int j = 0; j < VR; j++) P[j] += exp(l[j] - mx) / sm + (j == tg[r]);
        }
        for (int j = 0; j < VR; j++) pmax = P[j] > pmax ? P[j] : pmax;
        free(P), free(l);
    }
    int32_t *tc = cpu->ops->alloc(cpu, sizeof tg), *tgp = gpu->ops->alloc(gpu, sizeof tg);
    cpu->ops->upload(cpu, tc, tg, sizeof tg);
    gpu->ops->upload(gpu, tgp, tg, sizeof tg);
    pair h = put(hh, (size_t)N * C, dt), w = put(hw, (size_t)VP * C, dt), dW = put(hg, (size_t)VP * C, TKS_F32);
    pair loss = zeros(N, TKS_F32), dh = zeros((size_t)N * C, dt);
    pair buf = zeros((size_t)N * VP, dt), st = zeros(3 * (size_t)N, TKS_F32);
    tks_loss_head_args a = {.N = N, .C = C, .VP = VP, .VR = VR, .scale = (float)scale, .dt = dt};
    a.h = h.c, a.W = w.c, a.targets = tc, a.loss = loss.c, a.dh = dh.c, a.dW = dW.c, a.buf = buf.c, a.rows = N;
    int rc1 = tks_loss_head(cpu, &a);
    a.h = h.g, a.W = w.g, a.targets = tgp, a.loss = loss.g, a.dh = dh.g, a.dW = dW.g, a.buf = buf.g, a.rows = ROWS;
    int rc2 = tks_loss_head(gpu, &a);
    expect(rc1 == 0 && rc2 == 0, "loss_head", "chunks of 24 rows (GPU) and one of 70 (CPU) ran");
    double d = 2 * gamma_k(C) * 4 + (dt == TKS_BF16 ? UB * 4 : 0);
    double E = 2 * d * exp(2 * d) + 2 * gamma_k(VR) + 16 * U + (dt == TKS_BF16 ? UB : 0);
    cmp("loss_head", dt == TKS_BF16 ? "loss, bf16 inputs" : "loss N 70 C 64 VP 1088 VR 1000", loss, 2 * d + 8 * U * 16 + 2 * gamma_k(VR), 0);
    exact_row("loss_head", loss, 5, 1, 0.0f);
    cmp("loss_head", "dh (chunk rows)", dh, 2 * wm * scale * (E + 2 * gamma_k(VP)), 0);
    cmp("loss_head", dt == TKS_BF16 ? "dW over 3 chunks, bf16 inputs" : "dW accumulated over 3 chunks", dW,
        hm * scale * (E + 2 * gamma_k(N + 1)) * pmax * (1 + E) + 2 * gamma_k(N + 1), 0);
    /* the forward-only form (evaluation): the staged ops on each chunk */
    pair l2 = zeros(N, TKS_F32);
    a.h = h.c, a.W = w.c, a.targets = tc, a.loss = l2.c, a.dh = NULL, a.buf = buf.c, a.rows = N;
    a.mx = st.c, a.sum = (float *)st.c + N, a.tgt = (float *)st.c + 2 * N;
    rc1 = tks_loss_head(cpu, &a);
    a.h = h.g, a.W = w.g, a.targets = tgp, a.loss = l2.g, a.buf = buf.g, a.rows = ROWS;
    a.mx = st.g, a.sum = (float *)st.g + N, a.tgt = (float *)st.g + 2 * N;
    rc2 = tks_loss_head(gpu, &a);
    expect(rc1 == 0 && rc2 == 0, "loss_head", "forward only: ran");
    /* the staged ops' rounding: the sum of exps (2 gamma_VR) and xent_loss's (t_xent) */
    cmp("loss_head", dt == TKS_BF16 ? "forward only: loss, bf16 inputs" : "forward only: loss", l2, 2 * d + 8 * U * 16 + 2 * gamma_k(VR), 0);
    exact_row("loss_head", l2, 5, 1, 0.0f);
    cpu->ops->free(cpu, tc);
    gpu->ops->free(gpu, tgp);
    drop(h), drop(w), drop(dW), drop(loss), drop(dh), drop(buf), drop(st), drop(l2);
    free(hh), free(hw), free(hg), free(h2), free(w2);
}

/* base 1000 and 1003: with base not a multiple of 4, m and v sit a part of
 * a quad off p and grad, and the vectorized step takes its element path */
static void t_adamw(tks_dtype pcdt, size_t base) {
    size_t n = 50001;
    float *hp = rnd(n, -1, 1), *hg = rnd(n, -1, 1), *hm = rnd(n, -0.1f, 0.1f), *hv = rnd(n, 0, 0.01f);
    pair p = put(hp, n, TKS_F32), g = put(hg, n, TKS_F32), m = put(hm, n - base, TKS_F32);
    pair v = put(hv, n - base, TKS_F32), pc = zeros(n, pcdt), nsq = zeros(1, TKS_F32);
    float gn = 400.0f; /* norm 20 > clip 1: clip factor 1/20 */
    cpu->ops->upload(cpu, nsq.c, &gn, 4);
    gpu->ops->upload(gpu, nsq.g, &gn, 4);
    tks_span sp[2] = {{base, 30000, 0.1f}, {base + 30000, n - base - 30000, 0.0f}};
    tks_adamw_hp hp_ = {1e-3f, 0.9f, 0.95f, 1e-8f, 7, 1.0f};
    cpu->ops->adamw(cpu, p.c, g.c, m.c, v.c, base, sp, 2, &hp_, 0.5f, nsq.c, pc.c, pcdt);
    gpu->ops->adamw(gpu, p.g, g.g, m.g, v.g, base, sp, 2, &hp_, 0.5f, nsq.g, pc.g, pcdt);
    /* m = b1 m + (1-b1) g can cancel: bound by its terms (|m| <= 0.1, |g| <= 0.5);
     * v has positive terms; p = p decay - step m / denom with |p| <= 1 and the
     * step term <= lr / (1 - b1^7) */
    cmp("adamw", base == 1000 ? "m (2 spans, base 1000, device clip)" : "m (2 spans, base 1003, device clip)", m,
        4 * U * (0.9 * 0.1 + 0.1 * 0.5), 0);
    cmp("adamw", "v", v, 0, 8 * U);
    cmp("adamw", "p (fp32 master)", p, 4 * U + 16 * U * 1e-3 / (1 - 0.478), 0);
    cmp("adamw", "compute copy", pc, 4 * U + 16 * U * 1e-3 / (1 - 0.478), 0);
    /* a non-finite norm leaves everything unchanged */
    float inf = INFINITY, *before = host_of(gpu, p.g, n, TKS_F32);
    gpu->ops->upload(gpu, nsq.g, &inf, 4);
    gpu->ops->adamw(gpu, p.g, g.g, m.g, v.g, base, sp, 2, &hp_, 0.5f, nsq.g, pc.g, pcdt);
    float *after = host_of(gpu, p.g, n, TKS_F32);
    expect(!memcmp(before, after, n * 4), "adamw", "non-finite norm: weights unchanged");
    free(before), free(after);
    drop(p), drop(g), drop(m), drop(v), drop(pc), drop(nsq);
    free(hp), free(hg), free(hm), free(hv);
}

/* Span lists longer than one launch's batch (160 spans): 300 spans of 0 to
 * 2000 elements with gaps between them (never touched), decay on every
 * other one; sumsq over them (and over no span: 0) and AdamW against the
 * CPU with t_adamw's bounds, the gaps unchanged. */
static void t_many_spans(void) {
    enum { NS = 300 };
    tks_span sp[NS];
    size_t off = 0;
    for (int k = 0; k < NS; k++) {
        off += (size_t)(urand() * 40); /* a gap */
        sp[k] = (tks_span){off, k % 37 == 5 ? 0 : (size_t)(urand() * 2000), k % 2 ? 0.1f : 0.0f};
        off += sp[k].n;
    }
    size_t n = off + 7;
    float *hp = rnd(n, -1, 1), *hg = rnd(n, -1, 1), *hm = rnd(n, -0.1f, 0.1f), *hv = rnd(n, 0, 0.01f);
    pair p = put(hp, n, TKS_F32), g = put(hg, n, TKS_F32), m = put(hm, n, TKS_F32), v = put(hv, n, TKS_F32);
    pair nsq = zeros(1, TKS_F32), pc = zeros(n, TKS_BF16);
    cpu->ops->sumsq(cpu, nsq.c, g.c, sp, NS, 0);
    gpu->ops->sumsq(gpu, nsq.g, g.g, sp, NS, 0);
    cmp("sumsq", "300 spans (2 launches), gaps", nsq, 0, 2 * U);
    cpu->ops->sumsq(cpu, nsq.c, g.c, sp, NS, 1);
    gpu->ops->sumsq(gpu, nsq.g, g.g, sp, NS, 1);
    cmp("sumsq", "300 spans, accumulate", nsq, 0, 4 * U);
    pair z = put(hp, 1, TKS_F32); /* no span: = 0 */
    cpu->ops->sumsq(cpu, z.c, g.c, sp, 0, 0);
    gpu->ops->sumsq(gpu, z.g, g.g, sp, 0, 0);
    cmp("sumsq", "no span", z, 0, 0);
    drop(z);
    tks_adamw_hp hp_ = {1e-3f, 0.9f, 0.95f, 1e-8f, 3, 1.0f};
    cpu->ops->adamw(cpu, p.c, g.c, m.c, v.c, 0, sp, NS, &hp_, 0.5f, nsq.c, pc.c, TKS_BF16);
    gpu->ops->adamw(gpu, p.g, g.g, m.g, v.g, 0, sp, NS, &hp_, 0.5f, nsq.g, pc.g, TKS_BF16);
    /* as t_adamw, with the step term <= lr / (1 - b1^3) */
    cmp("adamw", "300 spans: m", m, 4 * U * (0.9 * 0.1 + 0.1 * 0.5), 0);
    cmp("adamw", "300 spans: v", v, 0, 8 * U);
    cmp("adamw", "300 spans: p (gaps unchanged)", p, 4 * U + 16 * U * 1e-3 / (1 - 0.729), 0);
    cmp("adamw", "300 spans: compute copy", pc, 4 * U + 16 * U * 1e-3 / (1 - 0.729), 0);
    drop(p), drop(g), drop(m), drop(v), drop(nsq), drop(pc);
    free(hp), free(hg), free(hm), free(hv);
}

/* The vectorized optimizer step's iteration (trainer/cuda/quad_spans.h) run
 * on the host as the kernels run it (threads striding over the quads, each
 * stepping its span forward; a whole quad as one 16-byte access, an edge
 * quad element by element): every element of every span is visited exactly
 * once and nothing else, over span lists with misaligned offsets, lengths
 * not a multiple of 4, spans sharing a quad, empty spans and more spans than
 * one launch takes (QUAD_BATCH); and the decay factor is each span's. A
 * check of index arithmetic, exact, with or without a GPU. */
static void t_quad_cover(void) {
    enum { NS = 300, THREADS = 37 };
    for (int shape = 0; shape < 3; shape++) {
        tks_span sp[NS];
        size_t off = 3, ns = shape == 0 ? 5 : NS;
        for (size_t k = 0; k < ns; k++) {
            off += shape == 1 ? (size_t)(urand() * 9) : 0; /* gaps; shape 2: back to back */
            size_t len = k % 29 == 7 ? 0 : (size_t)(urand() * (shape == 2 ? 11 : 700));
            sp[k] = (tks_span){off, len, (float)(k % 3) * 0.1f};
            off += len;
        }
        size_t n = off + 8, bad = 0, whole = 0, quads = 0, k = 0;
        unsigned char *seen = calloc(n, 1), *want = calloc(n, 1);
        float *decay = calloc(n, sizeof *decay);
        for (size_t j = 0; j < ns; j++)
            for (size_t i = sp[j].off; i < sp[j].off + sp[j].n; i++) want[i] = 1, decay[i] = 1.0f - 1e-3f * sp[j].wd;
        while (k < ns) {
            quad_batch b;
            size_t total = quad_batch_fill(&b, sp, ns, &k, 1e-3f);
            quads += total;
            for (size_t t = 0; t < THREADS; t++) {
                int s = 0;
                for (size_t Q = t; Q < total; Q += THREADS) {
                    size_t i0 = quad_at(b.qend, b.off, &s, Q);
                    int w = quad_whole(i0, b.off[s], b.stop[s]);
                    size_t lo = w ? i0 : i0 > b.off[s] ? i0 : b.off[s];
                    size_t hi = w ? i0 + 4 : i0 + 4 < b.stop[s] ? i0 + 4 : b.stop[s];
                    whole += w;
                    if (w && i0 % 4) bad++; /* a 16-byte access must be aligned */
                    for (size_t i = lo; i < hi; i++) {
                        if (i >= n || !want[i] || b.f[s] != decay[i]) bad++;
                        else seen[i]++;
                    }
                }
            }
        }
        for (size_t i = 0; i < n; i++) bad += want[i] && seen[i] != 1;
        char what[96];
        snprintf(what, sizeof what, "%zu spans%s: each element once (%zu of %zu quads whole)", ns,
                 shape == 1 ? ", gaps" : shape == 2 ? ", short, back to back" : "", whole, quads);
        expect(bad == 0, "quad_spans", what);
        free(seen), free(want), free(decay);
    }
}

/* Streams and events: work on a second stream waits for the first through
 * an event, and the sticky error stops a backend until it is recreated. */
static void t_streams_and_errors(void) {
    size_t n = 1 << 20;
    float *h = rnd(n, -1, 1);
    pair a = put(h, n, TKS_F32), b = zeros(n, TKS_F32);
    tks_stream *s2 = NULL;
    tks_event *ev = NULL;
    int rc = gpu->ops->stream_create(gpu, &s2);
    if (!rc) rc = gpu->ops->event_create(gpu, &ev);
    if (!rc) rc = gpu->ops->scale(gpu, a.g, n, 2.0f); /* default stream */
    if (!rc) rc = gpu->ops->event_record(gpu, ev);
    if (!rc) rc = gpu->ops->set_stream(gpu, s2);
    if (!rc) rc = gpu->ops->stream_wait(gpu, ev);
    if (!rc) rc = gpu->ops->copy(gpu, b.g, a.g, n * 4); /* on s2, after the scale */
    if (!rc) rc = gpu->ops->set_stream(gpu, NULL);
    if (!rc) rc = gpu->ops->sync(gpu);
    float *got = host_of(gpu, b.g, n, TKS_F32);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != 2.0f * h[i];
    expect(rc == 0 && bad == 0, "streams", "copy on stream 2 waits for stream 1 (event)");
    free(got);
    gpu->ops->event_destroy(gpu, ev);
    gpu->ops->stream_destroy(gpu, s2);
    drop(a), drop(b);
    free(h);

    /* uploads: the host buffer may be reused as soon as upload returns, also
     * when more small uploads than the backend has staging slots are queued
     * behind long work (the scale of 1 Mi floats), and a large one after them */
    {
        enum { K = 11, M = 4096 };
        float *d = gpu->ops->alloc(gpu, (size_t)K * M * 4), *big = gpu->ops->alloc(gpu, n * 4);
        float *hb = malloc(n * 4), *hk = malloc((size_t)M * 4), *back = malloc((size_t)K * M * 4);
        for (size_t i = 0; i < n; i++) hb[i] = (float)i;
        int r = gpu->ops->scale(gpu, big, n, 2.0f);
        for (int k = 0; k < K && !r; k++) {
            for (int i = 0; i < M; i++) hk[i] = (float)(k * M + i);
            r = gpu->ops->upload(gpu, d + (size_t)k * M, hk, (size_t)M * 4);
            memset(hk, 0xff, (size_t)M * 4); /* reused at once */
        }
        if (!r) r = gpu->ops->upload(gpu, big, hb, n * 4);
        if (!r) r = gpu->ops->download(gpu, back, d, (size_t)K * M * 4);
        size_t wrong = 0;
        for (size_t i = 0; i < (size_t)K * M; i++) wrong += back[i] != (float)i;
        float *hbig = host_of(gpu, big, n, TKS_F32);
        for (size_t i = 0; i < n; i++) wrong += hbig[i] != (float)i;
        expect(r == 0 && wrong == 0, "uploads", "small uploads through the staging slots, host buffer reused at once");
        free(hbig), free(hb), free(hk), free(back);
        gpu->ops->free(gpu, d);
        gpu->ops->free(gpu, big);
    }

    /* sticky: a bad dtype fails, every later op returns the same code, sync names the op */
    tks_backend *e = NULL;
    if (harness ? !(e = tks_cpu_backend_create(0)) : tks_cuda_backend_create(-1, &e) != 0) {
        expect(0, "sticky", tks_last_error()->message);
        return;
    }
    float *x = e->ops->alloc(e, 64);
    int r1 = e->ops->add(e, x, x, x, 4, (tks_dtype)7);
    int r2 = e->ops->scale(e, x, 4, 1.0f);
    int r3 = e->ops->sync(e);
    expect(r1 == TKS_ERR_ARG && r2 == r1 && r3 == r1 && strstr(tks_last_error()->message, "add"),
           "sticky", "bad dtype: later ops and sync return it, naming the op");
    e->ops->free(e, x);
    e->ops->destroy(e);
}

int main(void) {
    const char *self = getenv("TKS_TEST_CPU_AS_GPU");
    harness = self && !strcmp(self, "1");
    if (!harness && tks_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n",
               tks_cuda_built() ? "built with CUDA, none visible" : "built without CUDA");
        return 77;
    }
    cpu = tks_cpu_backend_create(0);
    int rc = 0;
    if (harness) {
        tks_backend *second = tks_cpu_backend_create(0);
        gpu = second ? tks_test_ref64_wrap(second) : NULL;
        rc = gpu ? 0 : TKS_ERR_NOMEM;
    } else {
        rc = tks_cuda_backend_create(-1, &gpu);
    }
    if (rc || !cpu) {
        fprintf(stderr, "test_cuda_ops: %s\n", tks_last_error()->message);
        return 1;
    }
    /* covers the GEMMs' K (131), RMSNorm's C (1000), RoPE's T x HD (37 x 64)
     * and attention's tiles (T 33, HD 16) in fp32 and bf16 */
    tks_ws_shape all = {.B = 2, .T = 64, .C = 1024, .NH = 4, .NKV = 2, .HD = 64, .F = 1024, .V = 2048,
                        .Tcache = 64, .dt = TKS_BF16};
    cpu_ws_bytes = cpu->ops->workspace_bytes(cpu, &all);
    if (!(cpu_ws = cpu->ops->alloc(cpu, cpu_ws_bytes)) || cpu->ops->set_workspace(cpu, cpu_ws, cpu_ws_bytes)) {
        fprintf(stderr, "test_cuda_ops: no CPU workspace: %s\n", tks_last_error()->message);
        return 1;
    }
    char desc[512] = "the CPU as the GPU: fp64 second implementation (TKS_TEST_CPU_AS_GPU=1)";
    if (!harness) tks_cuda_describe(gpu, desc, sizeof desc);
    printf("device: %s\n", desc);
    t_gemm();
    t_reductions();
    for (int d = 0; d < 2; d++) {
        tks_dtype dt = d ? TKS_BF16 : TKS_F32;
        t_elementwise(dt);
        t_embedding(dt, 0);
        t_embedding(dt, 1);
        t_rmsnorm(dt, 0);
        t_rmsnorm(dt, 1);
        t_add_rmsnorm(dt);
        t_rope(dt);
        t_attention(dt, 0, 0);
        t_attention(dt, 0, 1);
        if (dt == TKS_BF16) t_attention(dt, 1, 0), t_attention(dt, 1, 1);
        t_swiglu(dt, 333);
        t_swiglu(dt, 336);
        t_xent(dt, 1000);
        t_xent(dt, 997);
        t_loss_head(dt);
        t_adamw(dt, 1000);
        t_adamw(dt, 1003);
    }
    t_many_spans();
    t_quad_cover();
    /* the vectorized optimizer step (TKS_CUDA_VEC_OPTIM): the same checks
     * (the reductions' bits differ from the scalar form's, each form is
     * deterministic: t_reductions checks two runs) */
    if (set_vec_optim(1)) {
        printf("-- vectorized sumsq, sum and adamw (tks_cuda_set_vec_optim)\n");
        t_reductions();
        for (int d = 0; d < 2; d++) t_adamw(d ? TKS_BF16 : TKS_F32, 1000), t_adamw(d ? TKS_BF16 : TKS_F32, 1003);
        t_many_spans();
        set_vec_optim(0);
    }
    /* the one-pass RMSNorm backward and RoPE's angles per row: the same
     * checks with each on (rmsnorm_bwd with the workspace: one pass over 35
     * chunks of 2 rows; without: the two-kernel fallback) */
    for (int d = 0; d < 2; d++) {
        tks_dtype dt = d ? TKS_BF16 : TKS_F32;
        if (set_kernel(tks_cuda_set_norm_onepass, 1)) {
            printf("-- one-pass rmsnorm_bwd (tks_cuda_set_norm_onepass), %s\n", tks_dtype_name(dt));
            t_rmsnorm(dt, 1);
            t_rmsnorm(dt, 0);
            set_kernel(tks_cuda_set_norm_onepass, 0);
        }
        if (set_kernel(tks_cuda_set_rope_rows, 1)) {
            printf("-- rope, angles per row (tks_cuda_set_rope_rows), %s\n", tks_dtype_name(dt));
            t_rope(dt);
            set_kernel(tks_cuda_set_rope_rows, 0);
        }
        t_rope_rows_bits(dt);
        if (set_kernel(tks_cuda_set_swiglu_vec, 1)) {
            printf("-- swiglu with 16-byte accesses (tks_cuda_set_swiglu_vec), %s\n", tks_dtype_name(dt));
            t_swiglu(dt, 336);
            set_kernel(tks_cuda_set_swiglu_vec, 0);
        }
        t_swiglu_vec_bits(dt);
        if (set_kernel(tks_cuda_set_xent_vec, 1)) {
            printf("-- xent_fused with 16-byte accesses (tks_cuda_set_xent_vec), %s\n", tks_dtype_name(dt));
            t_xent(dt, 1000);
            t_xent(dt, 997);
            t_loss_head(dt);
            set_kernel(tks_cuda_set_xent_vec, 0);
        }
    }
    t_streams_and_errors();
    if (gpu->ops->sync(gpu)) {
        printf("backend error: %s\n", tks_last_error()->message);
        failures++;
    }
    if (cpu->ops->sync(cpu)) {
        printf("CPU reference error: %s\n", tks_last_error()->message);
        failures++;
    }
    gpu->ops->destroy(gpu);
    cpu->ops->set_workspace(cpu, NULL, 0);
    cpu->ops->free(cpu, cpu_ws);
    cpu->ops->destroy(cpu);
    printf("test_cuda_ops: %d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
