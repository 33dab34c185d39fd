/*
 * test_ops.c - every op of the backend interface (trainer/backend/backend.h) checked
 * against finite differences and against scalar references written from the
 * formulas in backend.h. Usage: test_ops (exit 0 = every check passed).
 *
 * The test touches tensors only through be->alloc/upload/download, so the
 * same checks can drive any backend; today that is the CPU reference.
 *
 * Legend (backend.h): B batch, T sequence, N rows, C dim, NH query heads,
 * NKV kv heads, HD head dim, V vocab columns of a shard, VR its real columns,
 * v0 the global id of its first column, n element count.
 *
 * Gradients. For an op out = f(x) the test takes the scalar loss
 * L = sum(out * R) with a fixed random R, so the backward op receives
 * dout = dL/dout = R, and the dx it returns must equal dL/dx. That is compared
 *   - element by element with the central difference
 *     (L(x + h e_i) - L(x - h e_i)) / (x_i+ - x_i-)  (the actual fp32 step), and
 *   - along a random direction d (entries uniform in [-1, 1]) with
 *     (L(x + h d) - L(x - h d)) / 2h  against  sum_i dL/dx_i * (x_i+ - x_i-) / 2h.
 * L is accumulated in double, so only the outputs a perturbation touches add
 * rounding noise.
 *
 * Tolerance: |analytic - numeric| <= 2e-3 * max(1, |numeric|). Inputs are
 * O(1) and h = 1e-2, so the truncation error of the central difference
 * (h^2/6 |L'''|, about 2e-5 for these smooth ops) and the fp32 rounding of the
 * touched outputs (about 1e-7 * |out| / 2h = 1e-5) lie two orders below it,
 * while a wrong term (a dropped factor, a flipped sign, a missing head) moves
 * the gradient by O(1) and fails it.
 *
 * Forward ops are compared with double-precision references at 1e-5 relative
 * (fp32 accumulation over at most a few dozen terms stays near 1e-6); ops that
 * only move or add data (embedding_fwd, add, scale, padding) must be exact.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "tests/tolerance.h"
#include "trainer/backend/backend.h"

static tks_backend *be;
static int failures;

/* ---- results: one line per check, the max error per op at the end -------- */

typedef struct {
    const char *op;
    double err, tol; /* worst err/tol ratio seen and its numbers */
    int checks, failed;
} opstat;
static opstat stats[64];
static int nstats;

static void note(const char *op, const char *what, double err, double tol) {
    int ok = err <= tol; /* NaN fails */
    printf("%-15s %-52s err %.2e  tol %.1e  %s\n", op, what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) failures++;
    int i = 0;
    while (i < nstats && strcmp(stats[i].op, op)) i++;
    if (i == nstats) {
        stats[nstats++] = (opstat){op, 0, tol, 0, 0};
    }
    opstat *s = &stats[i];
    s->checks++;
    s->failed += !ok;
    if (!ok || !(err / tol <= s->err / s->tol)) {
        s->err = err;
        s->tol = tol;
    }
}

/* exact checks: err is the number of differing elements */
static void note_exact(const char *op, const char *what, size_t ndiff) {
    note(op, what, (double)ndiff, 0.5);
}

/* ---- random numbers (splitmix64) ------------------------------------------ */

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

/* ---- tensors: a host copy and a device buffer ----------------------------- */

typedef struct {
    float *h, *d;
    size_t n;
} tens;

static tens tnew(size_t n) {
    tens t = {calloc(n ? n : 1, sizeof(float)), be->ops->alloc(be, (n ? n : 1) * sizeof(float)), n};
    if (!t.h || !t.d) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return t;
}
static void tfree(tens *t) {
    free(t->h);
    be->ops->free(be, t->d);
    t->h = t->d = NULL;
}
static void tup(tens *t) { be->ops->upload(be, t->d, t->h, t->n * sizeof(float)); }
static void tdown(tens *t) { be->ops->download(be, t->h, t->d, t->n * sizeof(float)); }
static tens trand(size_t n, double lo, double hi) {
    tens t = tnew(n);
    for (size_t i = 0; i < n; i++) t.h[i] = uni(lo, hi);
    tup(&t);
    return t;
}
static void tfill(tens *t, float v) {
    for (size_t i = 0; i < t->n; i++) t->h[i] = v;
    tup(t);
}
static int32_t *ids_dev(const int32_t *ids, size_t n) {
    int32_t *d = be->ops->alloc(be, n * sizeof *d);
    be->ops->upload(be, d, ids, n * sizeof *d);
    return d;
}

/* L = sum(out * R) in double; downloads out. */
static double dot_r(tens *out, const tens *R) {
    tdown(out);
    double s = 0;
    for (size_t i = 0; i < out->n; i++) s += (double)out->h[i] * R->h[i];
    return s;
}

/* the larger error; NaN sticks (fmax would drop it) */
static double worse(double e, double d) { return (e != e || d <= e) ? e : d; }

/* max_i |a_i - b_i| / max(1, |b_i|) */
static double max_rel(const float *a, const double *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        e = worse(e, fabs(a[i] - b[i]) / fmax(1.0, fabs(b[i])));
    }
    return e;
}
static double max_relf(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        e = worse(e, fabs((double)a[i] - b[i]) / fmax(1.0, fabs(b[i])));
    }
    return e;
}
static size_t ndiff_bits(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return k;
}

/* ---- the finite-difference check -------------------------------------------- */

#define GRAD_H 1e-2
#define GRAD_TOL 2e-3

typedef double (*loss_fn)(void *ctx);

/* Compares g = dL/dx (host, x->n) with central differences of loss(ctx) in
 * every element of x and along one random direction. loss() reads x from its
 * device buffer, which this function uploads (and restores at the end). */
static void gradcheck(const char *op, const char *what, tens *x, const float *g, loss_fn loss,
                      void *ctx) {
    size_t n = x->n;
    float *save = malloc(n * sizeof *save), *xm = malloc(n * sizeof *xm);
    memcpy(save, x->h, n * sizeof *save);
    double emax = 0;
    for (size_t i = 0; i < n; i++) {
        float p = (float)(save[i] + GRAD_H), m = (float)(save[i] - GRAD_H);
        x->h[i] = p;
        tup(x);
        double lp = loss(ctx);
        x->h[i] = m;
        tup(x);
        double lm = loss(ctx);
        x->h[i] = save[i];
        double num = (lp - lm) / ((double)p - (double)m);
        emax = worse(emax, fabs(g[i] - num) / fmax(1.0, fabs(num)));
    }
    double an = 0;
    for (size_t i = 0; i < n; i++) {
        double d = 2 * urand() - 1;
        x->h[i] = (float)(save[i] + GRAD_H * d);
        xm[i] = (float)(save[i] - GRAD_H * d);
        an += (double)g[i] * ((double)x->h[i] - (double)xm[i]);
    }
    tup(x);
    double lp = loss(ctx);
    memcpy(x->h, xm, n * sizeof *xm);
    tup(x);
    double lm = loss(ctx);
    an /= 2 * GRAD_H;
    double num = (lp - lm) / (2 * GRAD_H);
    double ed = fabs(an - num) / fmax(1.0, fabs(num));
    memcpy(x->h, save, n * sizeof *save);
    tup(x);
    free(save);
    free(xm);
    char buf[96];
    snprintf(buf, sizeof buf, "d%s vs finite differences (%zu elements)", what, n);
    note(op, buf, emax, GRAD_TOL);
    snprintf(buf, sizeof buf, "d%s directional derivative (%.3g vs %.3g)", what, an, num);
    note(op, buf, ed, GRAD_TOL);
}

/* ---- gemm -------------------------------------------------------------------- */

static void test_gemm(void) {
    const int M = 5, N = 7, K = 6, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) {
                /* op(A) is [M,K]: A stored [M,K] or [K,M]; op(B) [K,N]: B [K,N] or [N,K] */
                int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
                tens A = trand((size_t)ar * lda, -1, 1), Bm = trand((size_t)br * ldb, -1, 1);
                tens Cm = trand((size_t)M * ldc, -1, 1);
                float *c0 = malloc(Cm.n * sizeof *c0);
                memcpy(c0, Cm.h, Cm.n * sizeof *c0);
                float alpha = 0.7f;
                tks_gemm_args ga = {.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K,
                                    .alpha = alpha, .A = A.d, .a_type = TKS_F32, .lda = (size_t)lda,
                                    .B = Bm.d, .b_type = TKS_F32, .ldb = (size_t)ldb, .C = Cm.d,
                                    .c_type = TKS_F32, .ldc = (size_t)ldc, .compute = TKS_F32,
                                    .accumulate = beta};
                be->ops->gemm(be, &ga);
                tdown(&Cm);
                double e = 0;
                size_t gap = 0;
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        double s = 0, sa = 0;
                        for (int k = 0; k < K; k++) {
                            double a = ta ? A.h[k * lda + i] : A.h[i * lda + k];
                            double b = tb ? Bm.h[j * ldb + k] : Bm.h[k * ldb + j];
                            s += a * b;
                            sa += fabs(a * b);
                        }
                        double ref = alpha * s + beta * (double)c0[i * ldc + j];
                        double scale = 1 + alpha * sa + fabs(beta * (double)c0[i * ldc + j]);
                        e = worse(e, fabs(Cm.h[i * ldc + j] - ref) / scale);
                    }
                    /* the stride gap of C is not part of the matrix: untouched */
                    gap += ndiff_bits(Cm.h + i * ldc + N, c0 + i * ldc + N, (size_t)pad);
                }
                char what[96];
                snprintf(what, sizeof what, "trans_a=%d trans_b=%d beta=%d vs triple loop", ta, tb,
                         beta);
                /* K products, the alpha scaling and the beta term: gamma(K + 2)
                 * relative to the magnitudes summed (scale) */
                note("gemm", what, e, gamma_f32(K + 2));
                snprintf(what, sizeof what, "trans_a=%d trans_b=%d beta=%d ldc gap untouched", ta,
                         tb, beta);
                note_exact("gemm", what, gap);
                free(c0);
                tfree(&A);
                tfree(&Bm);
                tfree(&Cm);
            }
}

/* ---- add, scale, sumsq ----------------------------------------------------- */

static void test_elementwise(void) {
    const size_t n = 1000;
    tens a = trand(n, -2, 2), b = trand(n, -2, 2), o = trand(n, -9, 9);
    float *ref = malloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++) ref[i] = a.h[i] + b.h[i];
    be->ops->add(be, o.d, a.d, b.d, n, TKS_F32);
    tdown(&o);
    note_exact("add", "out = a + b (elements that differ)", ndiff_bits(o.h, ref, n));
    be->ops->add(be, a.d, a.d, b.d, n, TKS_F32); /* out aliases a */
    tdown(&a);
    note_exact("add", "out aliasing a", ndiff_bits(a.h, ref, n));
    for (size_t i = 0; i < n; i++) ref[i] = a.h[i] + b.h[i];
    be->ops->add(be, b.d, a.d, b.d, n, TKS_F32); /* out aliases b */
    tdown(&b);
    note_exact("add", "out aliasing b", ndiff_bits(b.h, ref, n));

    for (size_t i = 0; i < n; i++) ref[i] = o.h[i] * -0.37f;
    be->ops->scale(be, o.d, n, -0.37f);
    tdown(&o);
    note_exact("scale", "x *= s (elements that differ)", ndiff_bits(o.h, ref, n));
    free(ref);
    tfree(&a);
    tfree(&b);
    tfree(&o);

    /* sumsq: fixed-block summation crosses 4096-element blocks */
    const size_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 12289};
    double e = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        tens x = trand(sizes[s], -3, 3);
        double r = 0;
        for (size_t i = 0; i < x.n; i++) r += (double)x.h[i] * x.h[i];
        /* the spans cover x in three pieces (sizes permitting) */
        tks_span sp[3] = {{0, x.n / 3, 0}, {x.n / 3, x.n / 2 - x.n / 3, 0}, {x.n / 2, x.n - x.n / 2, 0}};
        float *dsc = be->ops->alloc(be, sizeof(float)), got1;
        be->ops->sumsq(be, dsc, x.d, sp, 3, 0);
        be->ops->download(be, &got1, dsc, sizeof got1);
        be->ops->free(be, dsc);
        double got = got1;
        double d = fabs(got - r) / fmax(1e-300, r);
        if (sizes[s] == 0) d = got == 0 ? 0 : 1;
        e = worse(e, d);
        tfree(&x);
    }
    /* products of two floats are exact in double and all terms are positive, so
     * two double sums of them in any order differ by at most 2 gamma(n); the
     * result is one fp32 value: one more rounding, at most 2^-24 relative */
    note("sumsq", "vs double sum, n = 0..12289 (relative)", e, 2 * gamma_f64(12289) + 0x1p-24);
}

/* ---- embedding ------------------------------------------------------------------ */

typedef struct {
    int N, C, V;
    int64_t v0;
    int32_t *ids;
    tens w, out, R;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    be->ops->embedding_fwd(be, c->out.d, c->ids, c->w.d, c->N, c->C, c->v0, c->V, TKS_F32);
    return dot_r(&c->out, &c->R);
}

static void test_embedding(int64_t v0) {
    /* ids below v0, at and past v0+V, repeated ids, one row never hit */
    const int V = 6, C = 5;
    int32_t ids[] = {0, 1, 2, 5, 2, 2, -1, 6, 0, 3, 100, 5, 9};
    const int N = (int)(sizeof ids / sizeof ids[0]);
    for (int i = 0; i < N; i++)
        if (ids[i] >= 0) ids[i] += (int32_t)v0;
    ids[N - 1] = (int32_t)v0 - 1; /* just below the shard */
    emb_ctx c = {N, C, V, v0, ids_dev(ids, (size_t)N), trand((size_t)V * C, -1, 1),
                 trand((size_t)N * C, 5, 9) /* garbage that must be overwritten */,
                 trand((size_t)N * C, -1, 1)};
    char what[96];

    be->ops->embedding_fwd(be, c.out.d, c.ids, c.w.d, N, C, v0, V, TKS_F32);
    tdown(&c.out);
    float *ref = calloc((size_t)N * C, sizeof *ref);
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < V) memcpy(ref + i * C, c.w.h + r * C, (size_t)C * sizeof *ref);
    }
    snprintf(what, sizeof what, "fwd v0=%lld: rows copied, out-of-shard ids give 0",
             (long long)v0);
    note_exact("embedding_fwd", what, ndiff_bits(c.out.h, ref, (size_t)N * C));
    free(ref);

    /* backward accumulates into dw: start from random values */
    tens dw = trand((size_t)V * C, -1, 1);
    double *dref = malloc(dw.n * sizeof *dref);
    for (size_t i = 0; i < dw.n; i++) dref[i] = dw.h[i];
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < V)
            for (int k = 0; k < C; k++) dref[r * C + k] += c.R.h[i * C + k];
    }
    float *dw0 = malloc(dw.n * sizeof *dw0);
    memcpy(dw0, dw.h, dw.n * sizeof *dw0);
    be->ops->embedding_bwd(be, dw.d, c.R.d, c.ids, N, C, v0, V, TKS_F32);
    tdown(&dw);
    snprintf(what, sizeof what, "bwd v0=%lld: dw += scatter, repeated ids sum", (long long)v0);
    note("embedding_bwd", what, max_rel(dw.h, dref, dw.n), 1e-6);
    snprintf(what, sizeof what, "bwd v0=%lld: row hit by no id untouched", (long long)v0);
    note_exact("embedding_bwd", what, ndiff_bits(dw.h + 4 * C, dw0 + 4 * C, (size_t)C));

    /* gradient from zero vs finite differences of the forward */
    be->ops->memzero(be, dw.d, dw.n * sizeof(float));
    be->ops->embedding_bwd(be, dw.d, c.R.d, c.ids, N, C, v0, V, TKS_F32);
    tdown(&dw);
    snprintf(what, sizeof what, "w (v0=%lld)", (long long)v0);
    gradcheck("embedding_bwd", what, &c.w, dw.h, emb_loss, &c);
    free(dref);
    free(dw0);
    tfree(&dw);
    tfree(&c.w);
    tfree(&c.out);
    tfree(&c.R);
    be->ops->free(be, c.ids);
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

typedef struct {
    int N, C;
    float eps;
    tens x, w, out, rstd, R;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    be->ops->rmsnorm_fwd(be, c->out.d, c->rstd.d, c->x.d, c->w.d, c->N, c->C, c->eps, TKS_F32);
    return dot_r(&c->out, &c->R);
}

static void test_rmsnorm(void) {
    const int N = 6, C = 16;
    rms_ctx c = {N, C, 1e-5f, trand((size_t)N * C, -1.5, 1.5), trand((size_t)C, -1.5, 1.5),
                 tnew((size_t)N * C), tnew((size_t)N), trand((size_t)N * C, -1, 1)};
    for (int k = 0; k < C; k++) c.x.h[k] *= 0.3f; /* a row of small norm: eps matters more */
    tup(&c.x);
    rms_loss(&c);
    tdown(&c.rstd);
    double *ref = malloc((size_t)N * C * sizeof *ref), *rr = malloc((size_t)N * sizeof *rr);
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int k = 0; k < C; k++) ss += (double)c.x.h[i * C + k] * c.x.h[i * C + k];
        rr[i] = 1 / sqrt(ss / C + c.eps);
        for (int k = 0; k < C; k++) ref[i * C + k] = c.x.h[i * C + k] * rr[i] * c.w.h[k];
    }
    double e = max_rel(c.out.h, ref, (size_t)N * C), er = 0;
    for (int i = 0; i < N; i++) er = worse(er, fabs(c.rstd.h[i] - rr[i]) / rr[i]);
    note("rmsnorm_fwd", "out vs double reference", e, 1e-5);
    note("rmsnorm_fwd", "rstd vs double reference (relative)", er, 1e-5);
    free(ref);
    free(rr);

    /* analytic gradients from zero, then the += contract from random values */
    tens dx = tnew((size_t)N * C), dw = tnew((size_t)C);
    be->ops->rmsnorm_bwd(be, dx.d, dw.d, c.R.d, c.x.d, c.w.d, c.rstd.d, N, C, TKS_F32);
    tdown(&dx);
    tdown(&dw);
    tens ax = trand(dx.n, -1, 1), aw = trand(dw.n, -1, 1);
    double *sx = malloc(dx.n * sizeof *sx), *sw = malloc(dw.n * sizeof *sw);
    for (size_t i = 0; i < dx.n; i++) sx[i] = (double)ax.h[i] + dx.h[i];
    for (size_t i = 0; i < dw.n; i++) sw[i] = (double)aw.h[i] + dw.h[i];
    be->ops->rmsnorm_bwd(be, ax.d, aw.d, c.R.d, c.x.d, c.w.d, c.rstd.d, N, C, TKS_F32);
    tdown(&ax);
    tdown(&aw);
    note("rmsnorm_bwd", "dx accumulates (+=)", max_rel(ax.h, sx, dx.n), 1e-6);
    note("rmsnorm_bwd", "dw accumulates (+=)", max_rel(aw.h, sw, dw.n), 1e-6);
    gradcheck("rmsnorm_bwd", "x", &c.x, dx.h, rms_loss, &c);
    gradcheck("rmsnorm_bwd", "w", &c.w, dw.h, rms_loss, &c);
    free(sx);
    free(sw);
    tfree(&dx);
    tfree(&dw);
    tfree(&ax);
    tfree(&aw);
    tfree(&c.x);
    tfree(&c.w);
    tfree(&c.out);
    tfree(&c.rstd);
    tfree(&c.R);
}

/* ---- the residual add fused with the RMSNorm after it ------------------------------------
 * add_rmsnorm_fwd is add followed by rmsnorm_fwd (backend.h): the same bits
 * in the sum, the normalized rows and rstd, in fp32 and in bf16 (where the
 * sum is rounded before the norm reads it), also with the sum written over
 * either input as the model writes it. */
static uint16_t *bf_dev(const float *h, size_t n);
static void *dev_dt(const float *h, size_t n, tks_dtype dt) {
    if (dt == TKS_BF16) return bf_dev(h, n);
    float *d = be->ops->alloc(be, n * sizeof *d);
    be->ops->upload(be, d, h, n * sizeof *d);
    return d;
}
static size_t ndiff_dev(const void *x, const void *y, size_t bytes) {
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    be->ops->download(be, a, x, bytes);
    be->ops->download(be, b, y, bytes);
    size_t d = 0;
    for (size_t i = 0; i < bytes; i++) d += a[i] != b[i];
    free(a);
    free(b);
    return d;
}
static void test_add_rmsnorm(tks_dtype dt) {
    const int N = 9, C = 70; /* rows not a multiple of any vector width */
    size_t n = (size_t)N * C, es = tks_dtype_size(dt);
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb), *hw = malloc(C * sizeof *hw);
    for (size_t i = 0; i < n; i++) ha[i] = uni(-2, 2), hb[i] = uni(-2, 2);
    for (int k = 0; k < C; k++) hw[k] = uni(0.5, 1.5);
    for (int k = 0; k < C; k++) hb[k] = -ha[k] + uni(-1e-3, 1e-3); /* a row that cancels: eps matters */
    void *a = dev_dt(ha, n, dt), *b = dev_dt(hb, n, dt), *w = dev_dt(hw, C, dt);
    void *sum = be->ops->alloc(be, n * es), *out = be->ops->alloc(be, n * es);
    void *res = be->ops->alloc(be, n * es), *out2 = be->ops->alloc(be, n * es);
    float *rstd = be->ops->alloc(be, N * sizeof *rstd), *rstd2 = be->ops->alloc(be, N * sizeof *rstd2);
    be->ops->add(be, sum, a, b, n, dt);
    be->ops->rmsnorm_fwd(be, out, rstd, sum, w, N, C, 1e-5f, dt);
    char what[80];
    for (int alias = 0; alias < 3; alias++) { /* res apart, res = a, res = b */
        void *ac = dev_dt(ha, n, dt), *bc = dev_dt(hb, n, dt), *r = alias == 1 ? ac : alias == 2 ? bc : res;
        be->ops->add_rmsnorm_fwd(be, r, out2, rstd2, ac, bc, w, N, C, 1e-5f, dt);
        size_t d = ndiff_dev(r, sum, n * es) + ndiff_dev(out2, out, n * es) +
                   ndiff_dev(rstd2, rstd, N * sizeof *rstd);
        snprintf(what, sizeof what, "%s: add + rmsnorm_fwd bit for bit (%s)", tks_dtype_name(dt),
                 alias == 1 ? "sum over a" : alias == 2 ? "sum over b" : "sum apart");
        note_exact("add_rmsnorm_fwd", what, d);
        be->ops->free(be, ac);
        be->ops->free(be, bc);
    }
    void *fr[] = {a, b, w, sum, out, res, out2, rstd, rstd2};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) be->ops->free(be, fr[i]);
    free(ha);
    free(hb);
    free(hw);
}

/* ---- RoPE ------------------------------------------------------------------------------ */

typedef struct {
    int B, T, H, HD;
    int64_t p0;
    float theta;
    tens x, work, R;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    be->ops->copy(be, c->work.d, c->x.d, c->x.n * sizeof(float));
    be->ops->rope(be, c->work.d, (size_t)(c->H) * (c->HD), c->B, c->T, c->H, c->HD, c->p0, NULL, c->theta, 0, TKS_F32);
    return dot_r(&c->work, &c->R);
}

static void test_rope(void) {
    const int B = 2, T = 5, H = 3, HD = 8, half = HD / 2;
    const int64_t p0s[] = {0, 7, 1000};
    const size_t n = (size_t)B * T * H * HD;
    for (size_t pi = 0; pi < sizeof p0s / sizeof p0s[0]; pi++) {
        rope_ctx c = {B, T, H, HD, p0s[pi], 10000.0f, trand(n, -1.5, 1.5), tnew(n),
                      trand(n, -1, 1)};
        char what[96];
        /* forward vs the Hugging Face formula: float32 inv_freq and angle
         * (LlamaRotaryEmbedding), out_j = x_j cos - x_{j+HD/2} sin,
         * out_{j+HD/2} = x_{j+HD/2} cos + x_j sin (rotate_half) */
        rope_loss(&c);
        double *ref = malloc(n * sizeof *ref);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++)
                    for (int j = 0; j < half; j++) {
                        float inv = 1.0f / powf(c.theta, (float)(2 * j) / (float)HD);
                        float a = (float)(c.p0 + t) * inv;
                        size_t o = (((size_t)b * T + t) * H + h) * HD;
                        double x1 = c.x.h[o + j], x2 = c.x.h[o + j + half];
                        ref[o + j] = x1 * cos(a) - x2 * sin(a);
                        ref[o + j + half] = x2 * cos(a) + x1 * sin(a);
                    }
        snprintf(what, sizeof what, "p0=%lld: fwd vs HF rotate_half formula", (long long)c.p0);
        note("rope", what, max_rel(c.work.h, ref, n), 1e-5);
        free(ref);

        /* inverse(forward(x)) == x */
        be->ops->rope(be, c.work.d, (size_t)(H) * (HD), B, T, H, HD, c.p0, NULL, c.theta, 1, TKS_F32);
        tdown(&c.work);
        snprintf(what, sizeof what, "p0=%lld: inverse(forward(x)) == x", (long long)c.p0);
        note("rope", what, max_relf(c.work.h, c.x.h, n), 1e-6);

        /* Jacobian transpose: <R x, y> == <x, R^T y> with R^T the inverse rotation */
        tens y = trand(n, -1, 1), ry = tnew(n);
        be->ops->copy(be, ry.d, y.d, n * sizeof(float));
        be->ops->rope(be, ry.d, (size_t)(H) * (HD), B, T, H, HD, c.p0, NULL, c.theta, 1, TKS_F32);
        tdown(&ry);
        rope_loss(&c); /* c.work = R x */
        double d1 = 0, d2 = 0, sc = 0, sy = 0;
        for (size_t i = 0; i < n; i++) {
            d1 += (double)c.work.h[i] * y.h[i];
            d2 += (double)c.x.h[i] * ry.h[i];
            sc += (double)c.x.h[i] * c.x.h[i];
            sy += (double)y.h[i] * y.h[i];
        }
        snprintf(what, sizeof what, "p0=%lld: <R x, y> == <x, R^T y> (/|x||y|)", (long long)c.p0);
        note("rope", what, fabs(d1 - d2) / sqrt(sc * sy), 1e-6);

        /* the backward (inverse rotation of R) vs finite differences */
        be->ops->copy(be, ry.d, c.R.d, n * sizeof(float));
        be->ops->rope(be, ry.d, (size_t)(H) * (HD), B, T, H, HD, c.p0, NULL, c.theta, 1, TKS_F32);
        tdown(&ry);
        snprintf(what, sizeof what, "x (p0=%lld)", (long long)c.p0);
        gradcheck("rope", what, &c.x, ry.h, rope_loss, &c);
        tfree(&y);
        tfree(&ry);
        tfree(&c.x);
        tfree(&c.work);
        tfree(&c.R);
    }
}

/* Positions per token (the pos argument, what --reset-positions passes): row
 * (b, t) must be rotated exactly as rope with p0 = pos[b, t] rotates a lone
 * row (the same float32 angle), and the inverse must undo it. The positions
 * restart at document starts as the model computes them (t - doc). */
static void test_rope_positions(void) {
    const int B = 2, T = 9, H = 2, HD = 8, ld = H * HD;
    const int32_t doc[2 * 9] = {0, 0, 0, 3, 3, 5, 6, 6, 6, /* documents of 3, 2, 1, 3 tokens */
                                0, 0, 0, 0, 0, 0, 0, 0, 0};
    int32_t pos[2 * 9];
    for (int i = 0; i < B * T; i++) pos[i] = i % T - doc[i];
    const size_t n = (size_t)B * T * ld;
    tens x = trand(n, -1.5, 1.5), y = tnew(n), one = tnew((size_t)ld);
    int32_t *pd = be->ops->alloc(be, sizeof pos);
    be->ops->upload(be, pd, pos, sizeof pos);
    be->ops->copy(be, y.d, x.d, n * sizeof(float));
    be->ops->rope(be, y.d, (size_t)ld, B, T, H, HD, 1234, pd, 10000.0f, 0, TKS_F32); /* p0 unused */
    tdown(&y);
    size_t ndiff = 0;
    for (int r = 0; r < B * T; r++) {
        memcpy(one.h, x.h + (size_t)r * ld, (size_t)ld * sizeof(float));
        tup(&one);
        be->ops->rope(be, one.d, (size_t)ld, 1, 1, H, HD, pos[r], NULL, 10000.0f, 0, TKS_F32);
        tdown(&one);
        ndiff += memcmp(one.h, y.h + (size_t)r * ld, (size_t)ld * sizeof(float)) != 0;
    }
    note_exact("rope", "pos: row (b,t) == rope at p0 = pos[b,t], bit for bit", ndiff);
    be->ops->rope(be, y.d, (size_t)ld, B, T, H, HD, 0, pd, 10000.0f, 1, TKS_F32);
    tdown(&y);
    note("rope", "pos: inverse(forward(x)) == x", max_relf(y.h, x.h, n), 1e-6);
    be->ops->free(be, pd);
    tfree(&x);
    tfree(&y);
    tfree(&one);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* Flash attention. The forward saves only lse[B,NH,T]; the
 * backward recomputes the probabilities from q, k and lse. The tests use
 * contiguous [B,T,H,HD] tensors except where a stride is the point. */
typedef struct {
    int B, T, NH, NKV, HD;
    tens q, k, v, out, lse, R;
    const int32_t *doc;  /* host [B, T] document starts (the doc argument), NULL: causal */
    int32_t *docd;       /* its device copy */
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    size_t ldq = (size_t)c->NH * c->HD, ldkv = (size_t)c->NKV * c->HD;
    be->ops->attention_fwd(be, c->out.d, ldq, c->lse.d, c->q.d, ldq, c->k.d, c->v.d, ldkv, c->docd, c->B, c->T,
                      c->NH, c->NKV, c->HD, TKS_F32);
    return dot_r(&c->out, &c->R);
}

/* Double-precision attention: out[B,T,NH,HD], lse[B,NH,T], and with R given
 * (dout) the gradients dq, dk, dv. Also the per-element magnitude scale of
 * out, sum_u p_u |v_u|, and of the gradients, for relative errors. With
 * c->doc, the explicit block-causal mask: query t sees keys doc[b,t]..t. */
static void att_ref(const att_ctx *c, double *out, double *oscale, double *lse, double *dq,
                    double *dk, double *dv) {
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, HD = c->HD, group = NH / NKV;
    double *s = malloc((size_t)T * sizeof *s), *dp = malloc((size_t)T * sizeof *dp);
    double isq = 1.0 / sqrt((double)HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int g = h / group, lo = c->doc ? c->doc[(size_t)b * T + t] : 0;
                double mx = -INFINITY, sum = 0;
                const float *qr = c->q.h + ((size_t)(b * T + t) * NH + h) * HD;
                for (int u = lo; u <= t; u++) {
                    const float *kr = c->k.h + ((size_t)(b * T + u) * NKV + g) * HD;
                    s[u] = 0;
                    for (int d = 0; d < HD; d++) s[u] += (double)qr[d] * kr[d];
                    s[u] *= isq;
                    mx = fmax(mx, s[u]);
                }
                for (int u = lo; u <= t; u++) sum += (s[u] = exp(s[u] - mx));
                for (int u = lo; u <= t; u++) s[u] /= sum; /* now P */
                lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                size_t o = ((size_t)(b * T + t) * NH + h) * HD;
                for (int d = 0; d < HD; d++) {
                    double acc = 0, sc = 0;
                    for (int u = lo; u <= t; u++) {
                        double vv = c->v.h[((size_t)(b * T + u) * NKV + g) * HD + d];
                        acc += s[u] * vv;
                        sc += s[u] * fabs(vv);
                    }
                    out[o + d] = acc;
                    if (oscale) oscale[o + d] = sc;
                }
                if (!dq) continue;
                /* dP = dO V^T, dS = P (dP - sum P dP), dq = dS K / sqrt(HD), ... */
                const float *dO = c->R.h + o;
                double dot = 0;
                for (int u = lo; u <= t; u++) {
                    dp[u] = 0;
                    for (int d = 0; d < HD; d++)
                        dp[u] += (double)dO[d] * c->v.h[((size_t)(b * T + u) * NKV + g) * HD + d];
                    dot += s[u] * dp[u];
                }
                for (int u = lo; u <= t; u++) {
                    double ds = s[u] * (dp[u] - dot) * isq;
                    size_t ko = ((size_t)(b * T + u) * NKV + g) * HD;
                    for (int d = 0; d < HD; d++) {
                        dq[o + d] += ds * c->k.h[ko + d];
                        dk[ko + d] += ds * qr[d];
                        dv[ko + d] += s[u] * dO[d];
                    }
                }
            }
    free(s);
    free(dp);
}

/* doc: NULL (causal) or host [2, 5] document starts: the forward against the
 * double reference with the explicit mask, the backward by finite
 * differences of that forward. */
static void test_attention(int NH, int NKV, const int32_t *doc) {
    const int B = 2, T = 5, HD = 4;
    const size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD;
    att_ctx c = {B, T, NH, NKV, HD, trand(nq, -1.5, 1.5), trand(nk, -1.5, 1.5),
                 trand(nk, -1.5, 1.5), tnew(nq), tnew((size_t)B * NH * T), trand(nq, -1, 1),
                 doc, NULL};
    if (doc) {
        c.docd = be->ops->alloc(be, (size_t)B * T * sizeof(int32_t));
        be->ops->upload(be, c.docd, doc, (size_t)B * T * sizeof(int32_t));
    }
    const char *dm = doc ? " docs" : "";
    char what[96];
    att_loss(&c);
    tdown(&c.lse);

    /* forward vs double reference; query head h reads kv head h / (NH/NKV) */
    double *ref = calloc(nq, sizeof *ref), *lref = calloc(c.lse.n, sizeof *lref);
    att_ref(&c, ref, NULL, lref, NULL, NULL, NULL);
    snprintf(what, sizeof what, "NH=%d NKV=%d%s: out vs double reference", NH, NKV, dm);
    note("attention_fwd", what, max_rel(c.out.h, ref, nq), 1e-5);
    snprintf(what, sizeof what, "NH=%d NKV=%d%s: lse vs double reference", NH, NKV, dm);
    note("attention_fwd", what, max_rel(c.lse.h, lref, c.lse.n), 1e-5);
    free(ref);
    free(lref);

    /* backward: dq, dk, dv are overwritten, so fill them with garbage first */
    tens dq = tnew(nq), dk = tnew(nk), dv = tnew(nk);
    tfill(&dq, 777.0f);
    tfill(&dk, -777.0f);
    tfill(&dv, 777.0f);
    size_t ldq = (size_t)NH * HD, ldkv = (size_t)NKV * HD;
    be->ops->attention_bwd(be, dq.d, dk.d, dv.d, c.R.d, c.out.d, ldq, c.lse.d, c.q.d, ldq, c.k.d, c.v.d,
                      ldkv, c.docd, B, T, NH, NKV, HD, TKS_F32);
    tdown(&dq);
    tdown(&dk);
    tdown(&dv);
    snprintf(what, sizeof what, "q (NH=%d NKV=%d%s)", NH, NKV, dm);
    gradcheck("attention_bwd", what, &c.q, dq.h, att_loss, &c);
    snprintf(what, sizeof what, "k (NH=%d NKV=%d%s)", NH, NKV, dm);
    gradcheck("attention_bwd", what, &c.k, dk.h, att_loss, &c);
    snprintf(what, sizeof what, "v (NH=%d NKV=%d%s)", NH, NKV, dm);
    gradcheck("attention_bwd", what, &c.v, dv.h, att_loss, &c);

    /* attention_step: query t of batch b against caches [Tmax=T, NKV, HD] that
     * also hold the future positions t+1.. (which must be ignored); decoding
     * is one document, so only without doc */
    if (!doc) att_loss(&c);
    tens o1 = tnew((size_t)NH * HD);
    double e = 0;
    for (int b = 0; b < B && !doc; b++)
        for (int t = 0; t < T; t++) {
            tfill(&o1, 55.0f);
            be->ops->attention_step(be, o1.d, c.q.d + (size_t)(b * T + t) * NH * HD,
                               c.k.d + (size_t)b * T * NKV * HD, c.v.d + (size_t)b * T * NKV * HD,
                               t, NH, NKV, HD, TKS_F32);
            tdown(&o1);
            e = worse(e, max_relf(o1.h, c.out.h + (size_t)(b * T + t) * NH * HD, o1.n));
        }
    snprintf(what, sizeof what, "NH=%d NKV=%d: == row t of attention_fwd, all b, t", NH, NKV);
    if (!doc) note("attention_step", what, e, 1e-5);
    if (c.docd) be->ops->free(be, c.docd);
    tfree(&o1);
    tfree(&dq);
    tfree(&dk);
    tfree(&dv);
    tfree(&c.q);
    tfree(&c.k);
    tfree(&c.v);
    tfree(&c.out);
    tfree(&c.lse);
    tfree(&c.R);
}

/* The exact attention, with the T x T probabilities (kept here as the reference the flash
 * version replaced): per (batch, head) S = scale Q K^T as one sgemm-shaped
 * loop into a T x T buffer, masked softmax, O = P V; fp32 throughout. */
static void exact_attention_fwd(const att_ctx *c, float *out) {
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, HD = c->HD, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD), *P = malloc((size_t)T * T * sizeof *P);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / group;
            for (int t = 0; t < T; t++) {
                float *p = P + (size_t)t * T, mx = -INFINITY, sum = 0;
                int lo = c->doc ? c->doc[(size_t)b * T + t] : 0;
                for (int u = lo; u <= t; u++) {
                    float s = 0;
                    for (int d = 0; d < HD; d++)
                        s += c->q.h[((size_t)(b * T + t) * NH + h) * HD + d] *
                             c->k.h[((size_t)(b * T + u) * NKV + g) * HD + d];
                    p[u] = s * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = lo; u <= t; u++) sum += (p[u] = expf(p[u] - mx));
                for (int u = lo; u <= t; u++) p[u] /= sum;
                for (int d = 0; d < HD; d++) {
                    float o = 0;
                    for (int u = lo; u <= t; u++) o += p[u] * c->v.h[((size_t)(b * T + u) * NKV + g) * HD + d];
                    out[((size_t)(b * T + t) * NH + h) * HD + d] = o;
                }
            }
        }
    free(P);
}

/*
 * Flash attention against the exact attention and the double reference at a
 * length that crosses the 64-row tiles (T = 150: two full tiles and a partial
 * one, the causal diagonal inside each), with q, k, v as views into one fused
 * q|k|v row (the strides the model uses).
 *
 * Tolerances (tests/tolerance.h): an output element is sum_u p_u v_u over
 * at most T terms, each p_u carrying a dot product of HD terms, the exp, the
 * division by l and at most T/64 online rescalings; so the flash result is
 * within gamma(T + HD + T/64 + 4) of the exact value relative to its own
 * scale sum_u p_u |v_u| (the exp's argument is O(1) here: q, k in
 * [-1.5, 1.5], HD = 16), and the exact fp32 attention within the same
 * bound, so the two within twice it. lse = m + log(l) is a sum of T exps
 * after a dot of HD terms: gamma(T + HD + 4) relative to max(1, |lse|).
 * Gradients chain two such sums (dP = dO V^T, then dS K or dS^T Q over T
 * rows): gamma(2 (T + HD) + 8) relative to the tensor's max. Measured on the
 * development machine: out 2.2e-7, gradients 4.4e-7 (bounds 1.3e-5 and
 * 2.0e-5). A wrong tile boundary, a lost rescale or a mask off by one moves
 * an element by O(1e-2) or more.
 */
static void test_flash_vs_exact(int NH, int NKV, const int32_t *doc) {
    const int B = 2, T = 150, HD = 16;
    const int QD = NH * HD, KD = NKV * HD, QKV = QD + 2 * KD;
    const size_t nq = (size_t)B * T * QD, nk = (size_t)B * T * KD, nrow = (size_t)B * T;
    att_ctx c = {B, T, NH, NKV, HD, trand(nq, -1.5, 1.5), trand(nk, -1.5, 1.5),
                 trand(nk, -1.5, 1.5), tnew(nq), tnew((size_t)B * NH * T), trand(nq, -1, 1),
                 doc, NULL};
    if (doc) {
        c.docd = be->ops->alloc(be, nrow * sizeof(int32_t));
        be->ops->upload(be, c.docd, doc, nrow * sizeof(int32_t));
    }
    const char *dm = doc ? " docs" : "";
    /* the fused layout: row r = q_r | k_r | v_r */
    tens qkv = tnew(nrow * QKV);
    for (size_t r = 0; r < nrow; r++) {
        memcpy(qkv.h + r * QKV, c.q.h + r * QD, (size_t)QD * sizeof(float));
        memcpy(qkv.h + r * QKV + QD, c.k.h + r * KD, (size_t)KD * sizeof(float));
        memcpy(qkv.h + r * QKV + QD + KD, c.v.h + r * KD, (size_t)KD * sizeof(float));
    }
    tup(&qkv);
    be->ops->attention_fwd(be, c.out.d, (size_t)QD, c.lse.d, qkv.d, (size_t)QKV, qkv.d + QD,
                      qkv.d + QD + KD, (size_t)QKV, c.docd, B, T, NH, NKV, HD, TKS_F32);
    tdown(&c.out);
    tdown(&c.lse);
    double *ref = calloc(nq, sizeof *ref), *osc = calloc(nq, sizeof *osc),
           *lref = calloc(c.lse.n, sizeof *lref), *dqr = calloc(nq, sizeof *dqr),
           *dkr = calloc(nk, sizeof *dkr), *dvr = calloc(nk, sizeof *dvr);
    att_ref(&c, ref, osc, lref, dqr, dkr, dvr);
    float *ex = malloc(nq * sizeof *ex);
    exact_attention_fwd(&c, ex);
    double e_ref = 0, e_ex = 0, e_l = 0;
    for (size_t i = 0; i < nq; i++) {
        e_ref = worse(e_ref, fabs(c.out.h[i] - ref[i]) / osc[i]);
        e_ex = worse(e_ex, fabs((double)c.out.h[i] - ex[i]) / osc[i]);
    }
    for (size_t i = 0; i < c.lse.n; i++) e_l = worse(e_l, fabs(c.lse.h[i] - lref[i]) / fmax(1, fabs(lref[i])));
    char what[128];
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s fused strides: out vs double", T, NH, NKV, dm);
    const double tol_o = gamma_f32(T + HD + T / 64 + 4);
    note("flash_fwd", what, e_ref, tol_o);
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s: out vs exact fp32 attention", T, NH, NKV, dm);
    note("flash_fwd", what, e_ex, 2 * tol_o);
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s: lse vs double", T, NH, NKV, dm);
    note("flash_fwd", what, e_l, gamma_f32(T + HD + 4));

    /* backward into the fused layout; the garbage between views must stay */
    tens dqkv = tnew(nrow * QKV);
    tfill(&dqkv, 777.0f);
    be->ops->attention_bwd(be, dqkv.d, dqkv.d + QD, dqkv.d + QD + KD, c.R.d, c.out.d, (size_t)QD, c.lse.d,
                      qkv.d, (size_t)QKV, qkv.d + QD, qkv.d + QD + KD, (size_t)QKV, c.docd, B, T, NH, NKV, HD,
                      TKS_F32);
    tdown(&dqkv);
    double mq = 0, mk = 0, mv = 0, eq = 0, ek = 0, ev = 0;
    for (size_t i = 0; i < nq; i++) mq = fmax(mq, fabs(dqr[i]));
    for (size_t i = 0; i < nk; i++) mk = fmax(mk, fabs(dkr[i])), mv = fmax(mv, fabs(dvr[i]));
    for (size_t r = 0; r < nrow; r++) {
        for (int d = 0; d < QD; d++) eq = worse(eq, fabs(dqkv.h[r * QKV + d] - dqr[r * QD + d]) / mq);
        for (int d = 0; d < KD; d++) {
            ek = worse(ek, fabs(dqkv.h[r * QKV + QD + d] - dkr[r * KD + d]) / mk);
            ev = worse(ev, fabs(dqkv.h[r * QKV + QD + KD + d] - dvr[r * KD + d]) / mv);
        }
    }
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s: dq vs double (/max|dq|)", T, NH, NKV, dm);
    note("flash_bwd", what, eq, gamma_f32(2 * (T + HD) + 8));
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s: dk vs double (/max|dk|)", T, NH, NKV, dm);
    note("flash_bwd", what, ek, gamma_f32(2 * (T + HD) + 8));
    snprintf(what, sizeof what, "T=%d NH=%d NKV=%d%s: dv vs double (/max|dv|)", T, NH, NKV, dm);
    note("flash_bwd", what, ev, gamma_f32(2 * (T + HD) + 8));
    free(ref);
    free(osc);
    free(lref);
    free(dqr);
    free(dkr);
    free(dvr);
    free(ex);
    tfree(&qkv);
    tfree(&dqkv);
    tfree(&c.q);
    tfree(&c.k);
    tfree(&c.v);
    tfree(&c.out);
    tfree(&c.lse);
    tfree(&c.R);
    if (c.docd) be->ops->free(be, c.docd);
}

/* Document starts of two rows of T = 150 (the doc argument): row 0 holds
 * documents of 1, 62, 1, 1, 64 and 21 tokens, so that documents start on
 * and next to the 64-row tile boundaries and a query tile starts after a
 * whole key tile it cannot see; row 1 holds 70 + 80 tokens. */
static void make_docs150(int32_t *doc) {
    static const int len0[] = {1, 62, 1, 1, 64, 21}, len1[] = {70, 80};
    int t = 0;
    for (size_t i = 0; i < 6; i++)
        for (int j = 0, s = t; j < len0[i]; j++) doc[t++] = s;
    for (size_t i = 0; i < 2; i++)
        for (int j = 0, s = t - 150; j < len1[i]; j++, t++) doc[t] = s;
}

/* The mask reduces to the causal one when a row is one document (doc all 0:
 * the same bits as doc NULL, forward and backward), and it matters: every
 * query of a later document gets another output without it (the negative
 * control: the unmasked result differs by far more than the rounding). */
static void test_flash_docs(int NH, int NKV) {
    const int B = 2, T = 150, HD = 16;
    const size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, nrow = (size_t)B * T;
    int32_t doc[2 * 150], zero[2 * 150] = {0};
    make_docs150(doc);
    int32_t *dd = be->ops->alloc(be, sizeof doc), *dz = be->ops->alloc(be, sizeof zero);
    be->ops->upload(be, dd, doc, sizeof doc);
    be->ops->upload(be, dz, zero, sizeof zero);
    tens q = trand(nq, -1.5, 1.5), k = trand(nk, -1.5, 1.5), v = trand(nk, -1.5, 1.5), R = trand(nq, -1, 1);
    tens o[3], l[3], g[3][3]; /* [NULL, zeros, docs] */
    int32_t *docs[3] = {NULL, dz, dd};
    size_t ldq = (size_t)NH * HD, ldkv = (size_t)NKV * HD;
    for (int i = 0; i < 3; i++) {
        o[i] = tnew(nq), l[i] = tnew((size_t)B * NH * T);
        g[i][0] = tnew(nq), g[i][1] = tnew(nk), g[i][2] = tnew(nk);
        be->ops->attention_fwd(be, o[i].d, ldq, l[i].d, q.d, ldq, k.d, v.d, ldkv, docs[i], B, T, NH, NKV,
                               HD, TKS_F32);
        be->ops->attention_bwd(be, g[i][0].d, g[i][1].d, g[i][2].d, R.d, o[i].d, ldq, l[i].d, q.d, ldq,
                               k.d, v.d, ldkv, docs[i], B, T, NH, NKV, HD, TKS_F32);
        tdown(&o[i]), tdown(&l[i]);
        for (int j = 0; j < 3; j++) tdown(&g[i][j]);
    }
    char what[128];
    size_t nd = 0;
    nd += memcmp(o[0].h, o[1].h, nq * sizeof(float)) != 0;
    nd += memcmp(l[0].h, l[1].h, l[0].n * sizeof(float)) != 0;
    for (int j = 0; j < 3; j++) nd += memcmp(g[0][j].h, g[1][j].h, g[0][j].n * sizeof(float)) != 0;
    snprintf(what, sizeof what, "NH=%d NKV=%d: one document per row == causal, bit for bit", NH, NKV);
    note_exact("flash_docs", what, nd);
    /* negative control: each query row of a second or later document, with
     * and without the mask, differs by more than 100 times the forward's
     * bound gamma(T + HD + T/64 + 4) relative to the row's largest |out| */
    const double bound = gamma_f32(T + HD + T / 64 + 4);
    size_t same = 0, rows = 0;
    for (size_t r = 0; r < nrow; r++) {
        if (doc[r] == 0) continue;
        for (int h = 0; h < NH; h++, rows++) {
            double d = 0, mx = 0;
            for (int e = 0; e < HD; e++) {
                size_t i = (r * NH + h) * HD + e;
                d = fmax(d, fabs((double)o[2].h[i] - o[0].h[i]));
                mx = fmax(mx, fabs((double)o[0].h[i]));
            }
            same += !(d > 100 * bound * fmax(mx, 1e-3));
        }
    }
    snprintf(what, sizeof what, "NH=%d NKV=%d: unmasked differs on all %zu later-document rows", NH,
             NKV, rows);
    note_exact("flash_docs", what, same);
    be->ops->free(be, dd);
    be->ops->free(be, dz);
    tfree(&q), tfree(&k), tfree(&v), tfree(&R);
    for (int i = 0; i < 3; i++) {
        tfree(&o[i]), tfree(&l[i]);
        for (int j = 0; j < 3; j++) tfree(&g[i][j]);
    }
}

/* The rules on doc and pos, checked by the CPU reference: a doc that
 * is not whole documents back to back, or a position outside [0, T), fails
 * the op with TKS_ERR_ARG naming it (a fresh backend each: the error is
 * sticky). */
static void test_doc_contract(void) {
    const int T = 4, H = 1, HD = 4;
    const int32_t bad_doc[4] = {0, 0, 1, 3}, bad_pos[4] = {0, 1, 4, 3};
    for (int which = 0; which < 2; which++) {
        tks_backend *b2 = tks_cpu_backend_create(1);
        tks_ws_shape ws = {.B = 1, .T = T, .C = H * HD, .NH = H, .NKV = H, .HD = HD, .F = 4, .V = 4,
                           .Tcache = T, .dt = TKS_F32};
        size_t wb = b2->ops->workspace_bytes(b2, &ws);
        void *w = b2->ops->alloc(b2, wb);
        float *x = b2->ops->alloc(b2, (size_t)T * H * HD * 3 * sizeof(float)), *lse = x + 2 * T * HD;
        int32_t *a = b2->ops->alloc(b2, sizeof bad_doc);
        b2->ops->set_workspace(b2, w, wb);
        b2->ops->upload(b2, a, which ? bad_pos : bad_doc, sizeof bad_doc);
        int rc = which ? b2->ops->rope(b2, x, (size_t)HD, 1, T, H, HD, 0, a, 10000.0f, 0, TKS_F32)
                       : b2->ops->attention_fwd(b2, x + T * HD, (size_t)HD, lse, x, (size_t)HD, x, x,
                                                (size_t)HD, a, 1, T, H, H, HD, TKS_F32);
        const char *msg = tks_last_error()->message;
        int named = strstr(msg, which ? "pos[0, 2] = 4" : "doc[0, 2] = 1") != NULL;
        note_exact(which ? "rope" : "flash_docs",
                   which ? "pos 4 with T 4: TKS_ERR_ARG naming it" : "doc 0,0,1,3: TKS_ERR_ARG naming it",
                   !(rc == TKS_ERR_ARG && named));
        tks_clear_error();
        b2->ops->free(b2, a);
        b2->ops->free(b2, x);
        b2->ops->free(b2, w);
        b2->ops->destroy(b2);
    }
}

/* ---- SwiGLU ------------------------------------------------------------------------------------ */

/* gate and up are the halves of each row of gu[M, 2F] (the fused GEMM's output) */
typedef struct {
    int M, F;
    tens gu, out, R;
} swi_ctx;

static double swi_loss(void *p) {
    swi_ctx *c = p;
    be->ops->swiglu_fwd(be, c->out.d, c->gu.d, c->M, c->F, TKS_F32);
    return dot_r(&c->out, &c->R);
}

static void test_swiglu(void) {
    const int M = 4, F = 16;
    const size_t n = (size_t)M * F;
    swi_ctx c = {M, F, trand(2 * n, -4, 4), tnew(n), trand(n, -1, 1)};
    for (size_t i = 0; i < (size_t)M; i++) /* up half in [-2, 2] */
        for (int j = F; j < 2 * F; j++) c.gu.h[i * 2 * F + j] *= 0.5f;
    tup(&c.gu);
    swi_loss(&c);
    double *ref = malloc(n * sizeof *ref);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < F; j++) {
            double g = c.gu.h[(size_t)i * 2 * F + j], u = c.gu.h[(size_t)i * 2 * F + F + j];
            ref[(size_t)i * F + j] = g / (1 + exp(-g)) * u;
        }
    note("swiglu_fwd", "silu(gate) * up vs double reference", max_rel(c.out.h, ref, n), 1e-5);
    free(ref);
    tens dgu = tnew(2 * n);
    tfill(&dgu, 777.0f); /* overwritten, not accumulated */
    be->ops->swiglu_bwd(be, dgu.d, c.R.d, c.gu.d, M, F, TKS_F32);
    tdown(&dgu);
    gradcheck("swiglu_bwd", "gate|up", &c.gu, dgu.h, swi_loss, &c);
    tfree(&dgu);
    tfree(&c.gu);
    tfree(&c.out);
    tfree(&c.R);
}

/* ---- cross-entropy ---------------------------------------------------------------------------------- */

/* One shard's device buffers for the staged cross-entropy. */
typedef struct {
    int N, V, VR;
    int64_t v0;
    tens logits, mx, sum, tgt, loss, dl;
    int32_t *targets;
} xshard;

static xshard xs_new(int N, int V, int VR, int64_t v0, const int32_t *targets) {
    xshard s = {N, V, VR, v0, tnew((size_t)N * V), tnew((size_t)N), tnew((size_t)N),
                tnew((size_t)N), tnew((size_t)N), tnew((size_t)N * V),
                ids_dev(targets, (size_t)N)};
    return s;
}
static void xs_free(xshard *s) {
    tfree(&s->logits);
    tfree(&s->mx);
    tfree(&s->sum);
    tfree(&s->tgt);
    tfree(&s->loss);
    tfree(&s->dl);
    be->ops->free(be, s->targets);
}

/* Unsplit: the four stages on one shard; returns sum_i loss_i * scale. */
static float xent_scale = 0.37f;
static double xent_loss_all(void *p) {
    xshard *s = p;
    be->ops->xent_max(be, s->mx.d, s->logits.d, s->N, s->V, s->VR, TKS_F32);
    be->ops->xent_sumexp(be, s->sum.d, s->logits.d, s->mx.d, s->N, s->V, s->VR, TKS_F32);
    be->ops->xent_target(be, s->tgt.d, s->logits.d, s->targets, s->N, s->V, s->v0, s->VR, TKS_F32);
    be->ops->xent_loss(be, s->loss.d, s->mx.d, s->sum.d, s->tgt.d, s->N);
    tdown(&s->loss);
    double L = 0;
    for (int i = 0; i < s->N; i++) L += s->loss.h[i];
    return L * xent_scale;
}

/* Splits full logits [N, sum widths] into column shards and runs the stages as
 * the model does with tp ranks: max all-reduced by max, sum and tgt by sum. */
static void xent_split(const xshard *full, int nsh, const int *widths, int VRfull,
                       const int32_t *targets) {
    const int N = full->N;
    xshard sh[4];
    int64_t v0 = 0;
    float mx[16], sum[16], tgt[16];
    for (int i = 0; i < N; i++) mx[i] = -INFINITY, sum[i] = 0, tgt[i] = 0;
    char desc[64] = "";
    for (int k = 0; k < nsh; k++) {
        int VR = (int)(VRfull - v0 < 0 ? 0 : VRfull - v0 > widths[k] ? widths[k] : VRfull - v0);
        sh[k] = xs_new(N, widths[k], VR, v0, targets);
        for (int i = 0; i < N; i++)
            memcpy(sh[k].logits.h + (size_t)i * widths[k], full->logits.h + (size_t)i * full->V + v0,
                   (size_t)widths[k] * sizeof(float));
        tup(&sh[k].logits);
        size_t L = strlen(desc);
        snprintf(desc + L, sizeof desc - L, "%s%d/%d@%lld", k ? "," : "", widths[k], VR,
                 (long long)v0);
        v0 += widths[k];
    }
    /* stage 1: max, all-reduced by max */
    for (int k = 0; k < nsh; k++) {
        be->ops->xent_max(be, sh[k].mx.d, sh[k].logits.d, N, sh[k].V, sh[k].VR, TKS_F32);
        tdown(&sh[k].mx);
        for (int i = 0; i < N; i++) mx[i] = fmaxf(mx[i], sh[k].mx.h[i]);
    }
    /* stages 2 and 3: sum of exps and target logit, all-reduced by sum */
    for (int k = 0; k < nsh; k++) {
        memcpy(sh[k].mx.h, mx, (size_t)N * sizeof(float));
        tup(&sh[k].mx);
        be->ops->xent_sumexp(be, sh[k].sum.d, sh[k].logits.d, sh[k].mx.d, N, sh[k].V, sh[k].VR, TKS_F32);
        be->ops->xent_target(be, sh[k].tgt.d, sh[k].logits.d, sh[k].targets, N, sh[k].V, sh[k].v0,
                        sh[k].VR, TKS_F32);
        tdown(&sh[k].sum);
        tdown(&sh[k].tgt);
        for (int i = 0; i < N; i++) sum[i] += sh[k].sum.h[i], tgt[i] += sh[k].tgt.h[i];
    }
    double eloss = 0, edl = 0;
    size_t padnz = 0;
    for (int k = 0; k < nsh; k++) {
        memcpy(sh[k].sum.h, sum, (size_t)N * sizeof(float));
        memcpy(sh[k].tgt.h, tgt, (size_t)N * sizeof(float));
        tup(&sh[k].sum);
        tup(&sh[k].tgt);
        be->ops->xent_loss(be, sh[k].loss.d, sh[k].mx.d, sh[k].sum.d, sh[k].tgt.d, N);
        tdown(&sh[k].loss);
        eloss = worse(eloss, max_relf(sh[k].loss.h, full->loss.h, (size_t)N));
        tfill(&sh[k].dl, 777.0f);
        be->ops->xent_bwd(be, sh[k].dl.d, sh[k].logits.d, sh[k].mx.d, sh[k].sum.d, sh[k].targets, N,
                     sh[k].V, sh[k].v0, sh[k].VR, xent_scale, TKS_F32);
        tdown(&sh[k].dl);
        for (int i = 0; i < N; i++) {
            const float *a = sh[k].dl.h + (size_t)i * sh[k].V;
            edl = worse(edl, max_relf(a, full->dl.h + (size_t)i * full->V + sh[k].v0,
                                     (size_t)sh[k].V));
            for (int j = sh[k].VR; j < sh[k].V; j++) padnz += a[j] != 0.0f || signbit(a[j]);
        }
    }
    /* split and unsplit sum the same V exps in another order; with the exp, the
     * division, the log and the scale each side is within gamma(V + 4) */
    const double tol = 2 * gamma_f32(full->V + 4);
    char what[128];
    snprintf(what, sizeof what, "split V/VR@v0 %s: loss == unsplit", desc);
    note("xent (tp)", what, eloss, tol);
    snprintf(what, sizeof what, "split V/VR@v0 %s: dlogits == unsplit", desc);
    note("xent (tp)", what, edl, tol);
    snprintf(what, sizeof what, "split V/VR@v0 %s: padding dlogits exactly +0", desc);
    note_exact("xent (tp)", what, padnz);
    for (int k = 0; k < nsh; k++) xs_free(&sh[k]);
}

static void fill_xent(xshard *s, int nreal_total, float pad) {
    for (int i = 0; i < s->N; i++)
        for (int j = 0; j < s->V; j++)
            s->logits.h[(size_t)i * s->V + j] = j < nreal_total ? uni(-3, 3) : pad;
    tup(&s->logits);
}

static void test_xent(void) {
    /* unsplit: N rows, V = 16 columns of which VR = 13 real; the padding holds
     * values that would dominate the softmax if they were read */
    const int N = 6, V = 16, VR = 13;
    int32_t targets[6] = {0, 12, 5, 7, 12, 3};
    xshard s = xs_new(N, V, VR, 0, targets);
    fill_xent(&s, VR, 40.0f);
    double L = xent_loss_all(&s);
    double lref = 0;
    double e = 0;
    for (int i = 0; i < N; i++) {
        const float *l = s.logits.h + (size_t)i * V;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < VR; j++) mx = fmax(mx, l[j]);
        for (int j = 0; j < VR; j++) sum += exp(l[j] - mx);
        double li = log(sum) + mx - l[targets[i]];
        lref += li;
        e = worse(e, fabs(s.loss.h[i] - li) / fmax(1, li));
    }
    note("xent_loss", "per-token loss vs double log-softmax", e, 1e-5);
    note("xent_loss", "scaled loss sum vs double", fabs(L - lref * xent_scale) / lref, 1e-5);

    tfill(&s.dl, 777.0f);
    xent_loss_all(&s);
    be->ops->xent_bwd(be, s.dl.d, s.logits.d, s.mx.d, s.sum.d, s.targets, N, V, 0, VR, xent_scale, TKS_F32);
    tdown(&s.dl);
    float *dl0 = malloc(s.dl.n * sizeof *dl0);
    memcpy(dl0, s.dl.h, s.dl.n * sizeof *dl0);
    size_t padnz = 0;
    for (int i = 0; i < N; i++)
        for (int j = VR; j < V; j++) padnz += s.dl.h[(size_t)i * V + j] != 0.0f || signbit(s.dl.h[(size_t)i * V + j]);
    note_exact("xent_bwd", "padded columns get exactly +0", padnz);
    gradcheck("xent_bwd", "logits", &s.logits, s.dl.h, xent_loss_all, &s);

    /* padding never affects the loss or the real gradient: other padding values */
    xent_loss_all(&s); /* gradcheck left the loss of a perturbed input */
    float *loss0 = malloc((size_t)N * sizeof *loss0);
    memcpy(loss0, s.loss.h, (size_t)N * sizeof *loss0);
    const float pads[] = {-1e30f, 1e30f, 0.0f, INFINITY};
    size_t nd = 0, ndl = 0;
    for (size_t p = 0; p < sizeof pads / sizeof pads[0]; p++) {
        for (int i = 0; i < N; i++)
            for (int j = VR; j < V; j++) s.logits.h[(size_t)i * V + j] = pads[p];
        tup(&s.logits);
        xent_loss_all(&s);
        nd += ndiff_bits(s.loss.h, loss0, (size_t)N);
        be->ops->xent_bwd(be, s.dl.d, s.logits.d, s.mx.d, s.sum.d, s.targets, N, V, 0, VR, xent_scale, TKS_F32);
        tdown(&s.dl);
        ndl += ndiff_bits(s.dl.h, dl0, s.dl.n);
    }
    note_exact("xent_bwd", "padding = -1e30, 1e30, 0, inf: loss bit-identical", nd);
    note_exact("xent_bwd", "padding = -1e30, 1e30, 0, inf: dlogits bit-identical", ndl);

    /* fused (tp = 1): loss and dlogits in place of the logits in one pass,
     * the same operations per row as the staged path: bit-identical */
    fill_xent(&s, VR, 40.0f);
    xent_loss_all(&s);
    be->ops->xent_bwd(be, s.dl.d, s.logits.d, s.mx.d, s.sum.d, s.targets, N, V, 0, VR, xent_scale, TKS_F32);
    tdown(&s.dl);
    tens fl = tnew((size_t)N);
    be->ops->xent_fused(be, fl.d, s.logits.d, s.targets, N, V, VR, xent_scale, TKS_F32);
    tdown(&fl);
    tdown(&s.logits);
    note_exact("xent_fused", "loss == staged (elements that differ)", ndiff_bits(fl.h, s.loss.h, (size_t)N));
    note_exact("xent_fused", "dlogits in place == staged xent_bwd", ndiff_bits(s.logits.h, s.dl.h, s.dl.n));
    tfree(&fl);
    free(loss0);
    free(dl0);
    xs_free(&s);

    /* ignored rows (target -1: a packed window's padding): loss exactly 0 and
     * no gradient, staged and fused; the other rows exactly as without them */
    {
        int32_t tg_ign[6] = {0, -1, 5, -1, 12, 3};
        xshard a = xs_new(N, V, VR, 0, targets), b = xs_new(N, V, VR, 0, tg_ign);
        fill_xent(&a, VR, 40.0f);
        memcpy(b.logits.h, a.logits.h, a.logits.n * sizeof *a.logits.h);
        tup(&b.logits);
        xent_loss_all(&a);
        xent_loss_all(&b);
        be->ops->xent_bwd(be, a.dl.d, a.logits.d, a.mx.d, a.sum.d, a.targets, N, V, 0, VR, xent_scale, TKS_F32);
        be->ops->xent_bwd(be, b.dl.d, b.logits.d, b.mx.d, b.sum.d, b.targets, N, V, 0, VR, xent_scale, TKS_F32);
        tdown(&a.dl);
        tdown(&b.dl);
        size_t bad = 0, other = 0;
        for (int i = 0; i < N; i++) {
            const float *da = a.dl.h + (size_t)i * V, *db = b.dl.h + (size_t)i * V;
            if (tg_ign[i] < 0) {
                bad += b.loss.h[i] != 0.0f;
                for (int j = 0; j < V; j++) bad += db[j] != 0.0f;
            } else {
                other += ndiff_bits(&b.loss.h[i], &a.loss.h[i], 1) + ndiff_bits(db, da, (size_t)V);
            }
        }
        note_exact("xent ignore", "staged: ignored rows have loss 0 and zero dlogits (nonzero values)", bad);
        note_exact("xent ignore", "staged: the other rows bit-identical", other);
        tens fl2 = tnew((size_t)N);
        be->ops->xent_fused(be, fl2.d, b.logits.d, b.targets, N, V, VR, xent_scale, TKS_F32);
        tdown(&fl2);
        tdown(&b.logits);
        note_exact("xent ignore", "fused: loss == staged", ndiff_bits(fl2.h, b.loss.h, (size_t)N));
        note_exact("xent ignore", "fused: dlogits == staged", ndiff_bits(b.logits.h, b.dl.h, b.dl.n));
        tfree(&fl2);
        xs_free(&a);
        xs_free(&b);
    }

    /* vocab-parallel staging vs the unsplit computation. Each layout: total
     * columns, real columns, shard widths; targets reach into every shard
     * holding real columns, including the last real column. */
    struct {
        int Vt, VRt, nsh, w[4];
    } lay[] = {
        {24, 21, 2, {12, 12}},    /* 2 shards, padding in the last */
        {24, 21, 3, {8, 8, 8}},   /* 3 shards */
        {48, 17, 3, {16, 16, 16}},/* the last shard is all padding (VR = 0) */
        {24, 21, 3, {5, 9, 10}},  /* uneven widths */
    };
    for (size_t li = 0; li < sizeof lay / sizeof lay[0]; li++) {
        int32_t tg[6];
        for (int i = 0; i < N; i++) tg[i] = (int32_t)(next_u64() % (uint64_t)lay[li].VRt);
        tg[0] = lay[li].VRt - 1;
        tg[1] = 0;
        xshard f = xs_new(N, lay[li].Vt, lay[li].VRt, 0, tg);
        fill_xent(&f, lay[li].VRt, 0.0f);
        xent_loss_all(&f);
        be->ops->xent_bwd(be, f.dl.d, f.logits.d, f.mx.d, f.sum.d, f.targets, N, f.V, 0, f.VR,
                     xent_scale, TKS_F32);
        tdown(&f.dl);
        xent_split(&f, lay[li].nsh, lay[li].w, lay[li].VRt, tg);
        xs_free(&f);
    }
}

/* ---- AdamW --------------------------------------------------------------------------------------------- */

/* torch.optim.AdamW as documented (amsgrad=False, maximize=False), in double:
 *   theta <- theta - lr * wd * theta
 *   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
 *   m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t)
 *   theta <- theta - lr * m_hat / (sqrt(v_hat) + eps) */
static void adamw_ref(double *p, const double *g, double *m, double *v, size_t n, double lr,
                      double b1, double b2, double eps, double wd, int64_t t) {
    for (size_t i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mh = m[i] / (1 - pow(b1, (double)t)), vh = v[i] / (1 - pow(b2, (double)t));
        p[i] -= lr * mh / (sqrt(vh) + eps);
    }
}

static void test_adamw(void) {
    const size_t n = 41;
    const int steps = 6;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (int wdon = 0; wdon < 2; wdon++) {
        float wd = wdon ? 0.1f : 0.0f, gs = wdon ? 0.5f : 1.0f;
        tens p = trand(n, -1, 1), g = tnew(n), m = tnew(n), v = tnew(n);
        p.h[0] = 0.0f; /* a padding-like element: zero weight, always zero grad */
        tup(&p);
        double *rp = malloc(n * sizeof *rp), *rg = malloc(n * sizeof *rg),
               *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
        for (size_t i = 0; i < n; i++) rp[i] = p.h[i];
        double ep = 0, em = 0, ev = 0;
        for (int t = 1; t <= steps; t++) {
            for (size_t i = 0; i < n; i++) {
                g.h[i] = i == 0 ? 0.0f : i == 1 ? 1e-6f : uni(-2, 2);
                rg[i] = (double)g.h[i] * gs;
            }
            tup(&g);
            /* two spans, the first element alone, as the multi-tensor call sees
             * tensors of the flat buffer */
            tks_span sp[2] = {{0, 1, wd}, {1, n - 1, wd}};
            tks_adamw_hp hp = {.lr = lr, .b1 = b1, .b2 = b2, .eps = eps, .t = t, .clip = 0};
            be->ops->adamw(be, p.d, g.d, m.d, v.d, 0, sp, 2, &hp, gs, NULL, NULL, TKS_F32);
            adamw_ref(rp, rg, rm, rv, n, lr, b1, b2, eps, wd, t);
            tdown(&p);
            tdown(&m);
            tdown(&v);
            for (size_t i = 0; i < n; i++) {
                /* fp32 state vs double: p relative to the per-step update size
                 * lr; m and v absolutely (averages of |g| <= 2 and g^2 <= 4, so
                 * fp32 rounding stays near 1e-7) */
                ep = worse(ep, fabs(p.h[i] - rp[i]) / lr);
                em = worse(em, fabs(m.h[i] - rm[i]));
                ev = worse(ev, fabs(v.h[i] - rv[i]));
            }
        }
        char what[96];
        snprintf(what, sizeof what, "wd=%g grad_scale=%g, %d steps: p vs torch doc (/lr)", wd, gs,
                 steps);
        note("adamw", what, ep, 1e-4);
        snprintf(what, sizeof what, "wd=%g grad_scale=%g, %d steps: m (absolute)", wd, gs, steps);
        note("adamw", what, em, 1e-6);
        snprintf(what, sizeof what, "wd=%g grad_scale=%g, %d steps: v (absolute)", wd, gs, steps);
        note("adamw", what, ev, 1e-6);
        snprintf(what, sizeof what, "wd=%g: zero weight with zero grads stays +0", wd);
        note_exact("adamw", what, p.h[0] != 0.0f || signbit(p.h[0]));
        free(rp);
        free(rg);
        free(rm);
        free(rv);
        tfree(&p);
        tfree(&g);
        tfree(&m);
        tfree(&v);
    }
}

/* ---- bf16 storage ---------------------------------------------------------------------- */

/* Device buffer of n bf16 values made from host floats (RNE). */
static uint16_t *bf_dev(const float *h, size_t n) {
    uint16_t *t = malloc(n * sizeof *t), *d = be->ops->alloc(be, n * sizeof *d);
    for (size_t i = 0; i < n; i++) t[i] = tks_bf16_from_f32(h[i]);
    be->ops->upload(be, d, t, n * sizeof *t);
    free(t);
    return d;
}
/* Rounds a host tensor to bf16-representable values and re-uploads it, so
 * the fp32 and the bf16 runs of an op read the very same numbers. */
static void round_bf16(tens *t) {
    for (size_t i = 0; i < t->n; i++) t->h[i] = tks_bf16_to_f32(tks_bf16_from_f32(t->h[i]));
    tup(t);
}
/* Elements of a bf16 device result that are not RNE(fp32 result). */
static size_t ndiff_rne(const uint16_t *dev, const float *ref, size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    be->ops->download(be, h, dev, n * sizeof *h);
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += h[i] != tks_bf16_from_f32(ref[i]);
    free(h);
    return d;
}

/*
 * The ops in bf16 against the same ops in fp32 on bf16-representable inputs.
 * bf16 is storage only, arithmetic is fp32; an op that reads its
 * inputs, computes and writes once therefore returns exactly RNE(its fp32
 * result) - checked bit for bit (rmsnorm_fwd, swiglu_fwd, rope, embedding,
 * flash attention with fused strides, convert). The GEMM's panels change the
 * fp32 summation order: within gamma(K + 2) of the double reference relative
 * to sum |a b| plus, for a bf16 C, one rounding (2^-8 relative).
 */
static void test_bf16(void) {
    /* convert: RNE including ties and NaN */
    const float probe[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, -3.14159f, 1e-40f, 65504.0f,
                           INFINITY, -0.0f};
    const size_t np = sizeof probe / sizeof probe[0];
    float *pd = be->ops->alloc(be, np * sizeof *pd);
    uint16_t *bd = be->ops->alloc(be, np * sizeof *bd), hb[8];
    be->ops->upload(be, pd, probe, sizeof probe);
    be->ops->convert(be, bd, TKS_BF16, pd, TKS_F32, np);
    be->ops->download(be, hb, bd, sizeof hb);
    size_t nd = 0;
    for (size_t i = 0; i < np; i++) nd += hb[i] != tks_bf16_from_f32(probe[i]);
    nd += hb[1] != 0x3f80; /* 1 + 2^-8 is a tie: to even (down) */
    nd += hb[2] != 0x3f82; /* 1 + 3 2^-8 is a tie: to even (up) */
    note_exact("bf16 convert", "fp32 -> bf16 RNE, ties to even (elements that differ)", nd);
    be->ops->free(be, pd);
    be->ops->free(be, bd);

    /* gemm: every transpose, bf16 A and B, C fp32 (the weight-gradient form,
     * accumulate) or bf16 */
    const int M = 37, N = 300, K = 70;
    double eg = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int cb = 0; cb < 2; cb++)
                for (int acc = 0; acc < 2; acc++) {
                    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                    tens A = trand((size_t)ar * ac, -1, 1), Bm = trand((size_t)br * bc, -1, 1),
                         C0 = trand((size_t)M * N, -1, 1);
                    round_bf16(&A);
                    round_bf16(&Bm);
                    round_bf16(&C0);
                    uint16_t *Ab = bf_dev(A.h, A.n), *Bb = bf_dev(Bm.h, Bm.n), *Cb = bf_dev(C0.h, C0.n);
                    tks_gemm_args ga = {.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K,
                                        .alpha = 1.0f, .A = Ab, .a_type = TKS_BF16, .lda = (size_t)ac,
                                        .B = Bb, .b_type = TKS_BF16, .ldb = (size_t)bc,
                                        .C = cb ? (void *)Cb : (void *)C0.d,
                                        .c_type = cb ? TKS_BF16 : TKS_F32, .ldc = (size_t)N,
                                        .compute = TKS_F32, .accumulate = acc};
                    be->ops->gemm(be, &ga);
                    float *got = malloc((size_t)M * N * sizeof *got);
                    if (cb) {
                        uint16_t *h = malloc((size_t)M * N * sizeof *h);
                        be->ops->download(be, h, Cb, (size_t)M * N * sizeof *h);
                        for (size_t i = 0; i < (size_t)M * N; i++) got[i] = tks_bf16_to_f32(h[i]);
                        free(h);
                    } else {
                        be->ops->download(be, got, C0.d, (size_t)M * N * sizeof *got);
                    }
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            double sm = 0, sa = 0;
                            for (int k = 0; k < K; k++) {
                                double x = ta ? A.h[(size_t)k * ac + i] : A.h[(size_t)i * ac + k];
                                double y = tb ? Bm.h[(size_t)j * bc + k] : Bm.h[(size_t)k * bc + j];
                                sm += x * y;
                                sa += fabs(x * y);
                            }
                            double c0 = acc ? C0.h[(size_t)i * N + j] : 0, ref = sm + c0;
                            /* |fl(y) - ref| <= u |y| + |y - ref| with |y - ref| <= g, so
                             * <= u |ref| + (1 + u) g (u = 2^-8 for a bf16 C, else 0) */
                            double ub = cb ? 0x1p-8 : 0, g = gamma_f32(K + 2) * (sa + fabs(c0));
                            double tol = ub * fabs(ref) + (1 + ub) * g;
                            eg = worse(eg, fabs(got[(size_t)i * N + j] - ref) / fmax(tol, 1e-30));
                        }
                    free(got);
                    be->ops->free(be, Ab);
                    be->ops->free(be, Bb);
                    be->ops->free(be, Cb);
                    tfree(&A);
                    tfree(&Bm);
                    tfree(&C0);
                }
    /* err is |got - ref| / bound: must not exceed 1 */
    note("bf16 gemm", "bf16 A, B; fp32/bf16 C; all transposes, accumulate (err / bound)", eg, 1.0);

    /* element-wise ops: bf16 == RNE(fp32) bit for bit */
    {
        const int Nr = 7, C = 24;
        tens x = trand((size_t)Nr * C, -2, 2), w = trand((size_t)C, 0.5, 1.5), out = tnew((size_t)Nr * C),
             rstd = tnew((size_t)Nr);
        round_bf16(&x);
        round_bf16(&w);
        be->ops->rmsnorm_fwd(be, out.d, rstd.d, x.d, w.d, Nr, C, 1e-5f, TKS_F32);
        tdown(&out);
        uint16_t *xb = bf_dev(x.h, x.n), *wb = bf_dev(w.h, w.n), *ob = bf_dev(out.h, out.n);
        be->ops->rmsnorm_fwd(be, ob, rstd.d, xb, wb, Nr, C, 1e-5f, TKS_BF16);
        note_exact("bf16 rmsnorm", "out == RNE(fp32 out) (elements that differ)", ndiff_rne(ob, out.h, out.n));
        /* SwiGLU on gu[Nr, 2 (C/2)] */
        be->ops->swiglu_fwd(be, out.d, x.d, Nr, C / 2, TKS_F32);
        tdown(&out);
        be->ops->swiglu_fwd(be, ob, xb, Nr, C / 2, TKS_BF16);
        note_exact("bf16 swiglu", "out == RNE(fp32 out)", ndiff_rne(ob, out.h, (size_t)Nr * (C / 2)));
        /* RoPE in place on x viewed as [1, Nr, 3, 8] */
        tens xr = tnew(x.n);
        memcpy(xr.h, x.h, x.n * sizeof *x.h);
        tup(&xr);
        be->ops->rope(be, xr.d, (size_t)C, 1, Nr, 3, 8, 5, NULL, 10000.0f, 0, TKS_F32);
        tdown(&xr);
        be->ops->rope(be, xb, (size_t)C, 1, Nr, 3, 8, 5, NULL, 10000.0f, 0, TKS_BF16);
        note_exact("bf16 rope", "x == RNE(fp32 x)", ndiff_rne(xb, xr.h, xr.n));
        tfree(&xr);
        be->ops->free(be, xb);
        be->ops->free(be, wb);
        be->ops->free(be, ob);
        tfree(&x);
        tfree(&w);
        tfree(&out);
        tfree(&rstd);
    }
    /* flash attention, fused q|k|v rows, T = 150 */
    {
        const int B = 1, T = 150, NH = 4, NKV = 2, HD = 16, QD = NH * HD, QKV = QD + 2 * NKV * HD;
        tens qkv = trand((size_t)B * T * QKV, -1.5, 1.5), out = tnew((size_t)B * T * QD),
             lse = tnew((size_t)B * NH * T), lse2 = tnew((size_t)B * NH * T);
        round_bf16(&qkv);
        be->ops->attention_fwd(be, out.d, (size_t)QD, lse.d, qkv.d, (size_t)QKV, qkv.d + QD,
                          qkv.d + QD + NKV * HD, (size_t)QKV, NULL, B, T, NH, NKV, HD, TKS_F32);
        tdown(&out);
        tdown(&lse);
        uint16_t *qb = bf_dev(qkv.h, qkv.n), *ob = be->ops->alloc(be, out.n * sizeof *ob);
        be->ops->attention_fwd(be, ob, (size_t)QD, lse2.d, qb, (size_t)QKV, qb + QD, qb + QD + NKV * HD,
                          (size_t)QKV, NULL, B, T, NH, NKV, HD, TKS_BF16);
        tdown(&lse2);
        note_exact("bf16 attention", "out == RNE(fp32 out), T=150 fused strides", ndiff_rne(ob, out.h, out.n));
        note_exact("bf16 attention", "lse (fp32) == fp32 run's lse", ndiff_bits(lse2.h, lse.h, lse.n));
        be->ops->free(be, qb);
        be->ops->free(be, ob);
        tfree(&qkv);
        tfree(&out);
        tfree(&lse);
        tfree(&lse2);
    }
    /* fused cross-entropy: loss (fp32) identical; dlogits within one bf16
     * rounding of the fp32 ones (the target column is rounded twice: its
     * softmax term, then minus scale) */
    {
        const int N = 6, V = 16, VR = 13;
        int32_t tg[6] = {0, 12, 5, 7, 12, 3};
        int32_t *td = ids_dev(tg, 6);
        tens lg = trand((size_t)N * V, -3, 3), loss = tnew((size_t)N), loss2 = tnew((size_t)N);
        round_bf16(&lg);
        uint16_t *lb = bf_dev(lg.h, lg.n), *hb2 = malloc(lg.n * sizeof *hb2);
        be->ops->xent_fused(be, loss.d, lg.d, td, N, V, VR, 0.37f, TKS_F32);
        be->ops->xent_fused(be, loss2.d, lb, td, N, V, VR, 0.37f, TKS_BF16);
        tdown(&lg);
        tdown(&loss);
        tdown(&loss2);
        be->ops->download(be, hb2, lb, lg.n * sizeof *hb2);
        double e = 0;
        for (size_t i = 0; i < lg.n; i++)
            e = worse(e, fabs(tks_bf16_to_f32(hb2[i]) - lg.h[i]) / fmax(fabs(lg.h[i]), 1e-30));
        note_exact("bf16 xent_fused", "loss == fp32 run's loss", ndiff_bits(loss2.h, loss.h, loss.n));
        note("bf16 xent_fused", "dlogits vs fp32 (relative; two roundings 2^-8)", e, 2 * 0x1p-8);
        be->ops->free(be, td);
        be->ops->free(be, lb);
        free(hb2);
        tfree(&lg);
        tfree(&loss);
        tfree(&loss2);
    }
}

/* A failing op makes every later op a no-op returning the same code, and
 * sync reports it with the op's name. On a backend of its own (the error
 * is permanent for the backend). */
static void test_sticky(void) {
    tks_backend *b2 = tks_cpu_backend_create(1);
    float *x = b2->ops->alloc(b2, 16 * sizeof(float)), one = 1.0f, got = 0.0f;
    b2->ops->upload(b2, x, &one, sizeof one);
    tks_gemm_args g = {.M = 1, .N = 1, .K = 1, .alpha = 1, .A = x, .lda = 1, .B = x, .ldb = 1,
                       .C = x, .ldc = 1, .compute = TKS_BF16};
    int rc1 = b2->ops->gemm(b2, &g); /* compute bf16 is not in the contract: fails */
    int rc2 = b2->ops->scale(b2, x, 1, 5.0f);
    int rc3 = b2->ops->sync(b2);
    const tks_error *e = tks_last_error();
    b2->ops->free(b2, x); /* alloc/free stay usable to release memory */
    (void)got;
    note_exact("sticky", "failing op returns an error", rc1 == 0);
    note_exact("sticky", "a later op returns the same error without running", rc2 != rc1);
    note_exact("sticky", "sync returns the first error", rc3 != rc1);
    note_exact("sticky", "the message names the op (gemm)", !strstr(e->message, "gemm"));
    b2->ops->destroy(b2);
}

int main(void) {
    be = tks_cpu_backend_create(0);
    if (!be) {
        fprintf(stderr, "cannot create the cpu backend\n");
        return 2;
    }
    printf("backend %s\n", be->kind->name);
    /* the workspace for the largest shapes below (flash test: B 2, T 150) */
    tks_ws_shape ws = {.B = 2, .T = 150, .C = 64, .NH = 4, .NKV = 1, .HD = 16, .F = 64, .V = 64,
                       .Tcache = 150, .dt = TKS_BF16}; /* bf16: with the GEMM panels */
    size_t wsb = be->ops->workspace_bytes(be, &ws);
    void *wsp = be->ops->alloc(be, wsb);
    if (!wsp || be->ops->set_workspace(be, wsp, wsb)) {
        fprintf(stderr, "cannot allocate the workspace\n");
        return 2;
    }
    test_gemm();
    test_elementwise();
    test_embedding(0);
    test_embedding(10);
    test_rmsnorm();
    test_add_rmsnorm(TKS_F32);
    test_add_rmsnorm(TKS_BF16);
    test_rope();
    test_rope_positions();
    /* documents of 2, 1 and 2 tokens; of 1 and 4 */
    static const int32_t doc5[10] = {0, 0, 2, 3, 3, 0, 1, 1, 1, 1};
    test_attention(4, 2, NULL);
    test_attention(4, 1, NULL);
    test_attention(4, 4, NULL);
    test_attention(4, 2, doc5);
    test_attention(4, 1, doc5);
    test_flash_vs_exact(4, 2, NULL);
    test_flash_vs_exact(4, 1, NULL);
    test_flash_vs_exact(2, 2, NULL);
    int32_t doc150[2 * 150];
    make_docs150(doc150);
    test_flash_vs_exact(4, 2, doc150);
    test_flash_vs_exact(4, 1, doc150);
    test_flash_docs(4, 2);
    test_swiglu();
    test_xent();
    test_adamw();
    test_bf16();
    printf("\n%-15s %6s %10s %8s  %s\n", "op", "checks", "max err", "tol", "result");
    for (int i = 0; i < nstats; i++)
        printf("%-15s %6d %10.2e %8.0e  %s\n", stats[i].op, stats[i].checks, stats[i].err,
               stats[i].tol, stats[i].failed ? "FAIL" : "ok");
    note_exact("sync", "no op failed during the checks (sticky error clear)", be->ops->sync(be) != 0);
    be->ops->set_workspace(be, NULL, 0);
    be->ops->free(be, wsp);
    be->ops->destroy(be);
    test_sticky();
    test_doc_contract();
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("all op checks passed\n");
    return 0;
}
