/*
 * test_model.c - whole-model checks of trainer/model/model.c on the CPU backend, on
 * a tiny LLaMA: gradients of every parameter tensor against finite
 * differences (untied and tied embeddings), vocab padding, loss at init,
 * gradient accumulation, determinism, KV-cache decoding against the full
 * forward, a few AdamW steps, the initial weights pinned bit for bit, and
 * the chunked loss head (TKS_LOSS_CHUNK_ROWS) against the whole logits.
 * Usage: test_model (exit 0 = all passed).
 *
 * Legend (model.h): B micro-batch, T sequence, N = B*T, C dim, NH heads, NKV
 * kv heads, F ffn dim, V vocab_size (real), VP padded vocab.
 *
 * The loss differentiated is the mean token loss loss_sum / N, whose gradient
 * is what tks_model_backward(m, 1/N) accumulates.
 */
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "tests/tolerance.h"
#include "trainer/backend/backend.h"
#include "trainer/model/model.h"

static tks_backend *be;
static int failures;

#define FAILF(...)                                  \
    do {                                            \
        failures++;                                 \
        fprintf(stdout, "FAIL %s:%d: ", __FILE__, __LINE__); \
        fprintf(stdout, __VA_ARGS__);               \
        fprintf(stdout, "\n");                      \
    } while (0)

/* One line per check; err <= tol passes (NaN fails). */
static void note(const char *group, const char *what, double err, double tol) {
    int ok = err <= tol;
    printf("%-14s %-58s err %.2e  tol %.1e  %s\n", group, what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

static double worse(double e, double d) { return (e != e || d <= e) ? e : d; }

/* ---- random numbers (splitmix64) ------------------------------------------ */

static uint64_t rng = 0x452821E638D01377ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(void) {
    double u1 = urand() + 1e-300, u2 = urand();
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- the tiny model --------------------------------------------------------------- */

enum { VOCAB = 50, BATCH = 2, SEQ = 8 };

static tks_model_config tiny(int tie, float init_std, uint32_t divisible_by) {
    tks_model_config c = {0};
    c.vocab_size = VOCAB;
    c.vocab_divisible_by = divisible_by; /* 8 -> VP = 56: 6 padded rows */
    c.dim = 16;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 32;
    c.max_seq_len = 16;
    c.init_std = init_std; /* 0.3: attention far from uniform, gradients not tiny */
    c.tie_embeddings = tie;
    return c;
}

/* Tolerance for two fp32 evaluations of one model quantity that differ only
 * in the order of their sums (micro-batch accumulation against one batch,
 * OpenBLAS blocking that depends on M, a padded against an unpadded vocab, the
 * KV-cache path against the full forward). K counts the terms of the sums on
 * the longest dependency path through the forward (and, with `backward`, the
 * backward again, which mirrors it): per layer the RMSNorm mean (C), the QKV
 * projections (C), the scores (HD), the softmax sum and the probs @ V product
 * (T each), the output projection (NH*HD), the FFN RMSNorm, gate/up and down
 * projections (C, C, F); then the final RMSNorm and head (C, C), the softmax
 * over the padded vocab (VP) and the sum of the loss or weight gradients over
 * the N rows. Each result is within gamma(K) of the exact value relative to the
 * magnitudes it is made of (tolerance.h), so two of them differ by at most
 * 2 gamma(K). That is 1e-5..1e-4 for the tiny configs here, while every
 * accumulation, padding or cache bug these checks exist for moves the
 * compared quantity by O(1e-2) or more. */
static double chain_tol(const tks_model_config *c, int T, int N, int backward) {
    double C = c->dim, HD = (double)c->dim / c->n_heads;
    double layer = C + C + HD + 2.0 * T + c->n_heads * HD + C + C + c->ffn_dim;
    double K = c->n_layers * layer + 2 * C + tks_model_padded_vocab(c, 1) + N;
    if (backward) K *= 2;
    return 2 * gamma_f32(K);
}

static tks_model *make(const tks_model_config *c, int B, int T, uint64_t seed) {
    tks_model *m = NULL;
    int rc = tks_model_create(c, be, NULL, B, T, &m);
    if (rc) {
        printf("FAIL tks_model_create: %s (%s)\n", tks_strerror(rc), tks_last_error()->message);
        exit(1);
    }
    tks_model_init(m, seed);
    return m;
}

/* host copies of the flat buffers */
static float *get_flat(tks_model *m, const float *dev) {
    size_t n = tks_model_n_local(m);
    float *h = malloc(n * sizeof *h);
    be->ops->download(be, h, dev, n * sizeof *h);
    return h;
}
static void put_weights(tks_model *m, const float *h) {
    be->ops->upload(be, tks_model_weights(m), h, tks_model_n_local(m) * sizeof *h);
}

static double fwd(tks_model *m, const int32_t *ids, const int32_t *tg) {
    double ls = 0;
    int rc = tks_model_forward(m, ids, tg, &ls);
    if (rc) FAILF("tks_model_forward: %s (%s)", tks_strerror(rc), tks_last_error()->message);
    return ls;
}
static void bwd(tks_model *m, float scale) {
    int rc = tks_model_backward(m, scale);
    if (rc) FAILF("tks_model_backward: %s (%s)", tks_strerror(rc), tks_last_error()->message);
}

static int32_t ids[BATCH * SEQ], tgts[BATCH * SEQ];

static void make_batch(void) {
    for (int i = 0; i < BATCH * SEQ; i++) ids[i] = (int32_t)(next_u64() % VOCAB);
    for (int i = 0; i < BATCH * SEQ; i++) tgts[i] = (int32_t)(next_u64() % VOCAB);
    ids[3] = VOCAB - 1; /* the last real row is read and predicted */
    tgts[5] = VOCAB - 1;
}

/* mean loss and its gradient (host, n_local) at the model's current weights */
static double loss_and_grad(tks_model *m, float **grad) {
    const int N = BATCH * SEQ;
    tks_model_zero_grad(m);
    double L = fwd(m, ids, tgts) / N;
    bwd(m, 1.0f / N);
    if (grad) *grad = get_flat(m, tks_model_grads(m));
    return L;
}

/* ---- (a), (b), (c-grad): gradients vs finite differences ------------------------------ */

/* Directional derivatives along DIRS random unit directions d (Gaussian,
 * normalized) per tensor: (L(w + h d) - L(w - h d)) / 2h against <g, d>.
 * For a random unit d, |<g, d>| is about |g| / sqrt(n) (n elements), and an
 * error e in the analytic gradient shows up as about |e| / sqrt(n), so
 *   err = |analytic - numeric| / max(|numeric|, |g| / sqrt(n))
 * measures the error of the whole gradient vector relative to its norm (a
 * direction that happens to be nearly orthogonal to g does not inflate it).
 * Tolerance 1e-2: with a step h = 1e-2 in norm (the tensor's norm is
 * 0.3 sqrt(n), so that is under 1% of it) the central-difference truncation
 * is ~1e-4 relative, and the fp32 forward's rounding noise (~1e-6 of the
 * mean loss) over 2h is ~5e-5 absolute, against |g| / sqrt(n) of order
 * 1e-2..1e-1 here (measured errors stay below 1e-3). */
#define DIR_H 1e-2
#define DIR_TOL 1e-2
#define DIRS 3
/* Element-wise: only elements whose |g| is at least 5% of the tensor's max
 * (and above 1e-4 absolute; here that means |g| >= 3e-3), where that rounding
 * noise (~5e-5 with h = 1e-2) stays under 2% of |g|; tolerance 2e-2 relative
 * (measured errors stay below 3e-3). */
#define ELEM_H 1e-2
#define ELEM_TOL 2e-2
#define ELEM_SAMPLES 6

static void check_grads(int tie) {
    const int N = BATCH * SEQ;
    tks_model_config c = tiny(tie, 0.3f, 8);
    tks_model *m = make(&c, BATCH, SEQ, 1234);
    size_t np, n = tks_model_n_local(m);
    const tks_param *ps = tks_model_params(m, &np);
    float *g, *w0 = get_flat(m, tks_model_weights(m)), *w = malloc(n * sizeof *w);
    double L0 = loss_and_grad(m, &g);
    char grp[32], what[128];
    snprintf(grp, sizeof grp, "grad tie=%d", tie);
    printf("tie_embeddings=%d: %zu tensors, %zu local elements, mean loss %.6f\n", tie, np, n, L0);
    double worst_dir = 0, worst_el = 0;
    for (size_t pi = 0; pi < np; pi++) {
        const tks_param *p = &ps[pi];
        size_t cnt = p->lrows * p->lcols, off = p->offset;
        const float *gp = g + off;
        double gn = 0, gmax = 0;
        for (size_t i = 0; i < cnt; i++) {
            gn += (double)gp[i] * gp[i];
            gmax = fmax(gmax, fabs(gp[i]));
        }
        gn = sqrt(gn);
        /* directional */
        float *wm = malloc(cnt * sizeof *wm);
        double *r = malloc(cnt * sizeof *r), ed = 0, an = 0, num = 0;
        for (int k = 0; k < DIRS; k++) {
            double rn = 0;
            for (size_t i = 0; i < cnt; i++) {
                r[i] = gauss();
                rn += r[i] * r[i];
            }
            rn = sqrt(rn);
            memcpy(w, w0, n * sizeof *w);
            an = 0;
            for (size_t i = 0; i < cnt; i++) {
                w[off + i] = (float)(w0[off + i] + DIR_H * r[i] / rn);
                wm[i] = (float)(w0[off + i] - DIR_H * r[i] / rn);
                an += (double)gp[i] * ((double)w[off + i] - wm[i]);
            }
            put_weights(m, w);
            double lp = fwd(m, ids, tgts) / N;
            memcpy(w + off, wm, cnt * sizeof *wm);
            put_weights(m, w);
            double lm = fwd(m, ids, tgts) / N;
            num = (lp - lm) / (2 * DIR_H);
            an /= 2 * DIR_H;
            ed = worse(ed, fabs(an - num) / fmax(fabs(num), gn / sqrt((double)cnt)));
        }
        worst_dir = worse(worst_dir, ed);
        snprintf(what, sizeof what, "%s: %d directions (last %.3g vs %.3g)", p->name, DIRS, an,
                 num);
        note(grp, what, ed, DIR_TOL);
        /* element-wise on a sample of the elements with non-tiny gradients */
        memcpy(w, w0, n * sizeof *w);
        size_t *cand = malloc(cnt * sizeof *cand), nc = 0;
        for (size_t i = 0; i < cnt; i++)
            if (fabs(gp[i]) >= 0.05 * gmax && fabs(gp[i]) >= 1e-4) cand[nc++] = i;
        double ee = 0;
        int ns = 0;
        for (; ns < ELEM_SAMPLES && nc > 0; ns++) {
            size_t k = next_u64() % nc, i = cand[k];
            cand[k] = cand[--nc];
            float pw = (float)(w0[off + i] + ELEM_H), mw = (float)(w0[off + i] - ELEM_H);
            w[off + i] = pw;
            put_weights(m, w);
            double a = fwd(m, ids, tgts) / N;
            w[off + i] = mw;
            put_weights(m, w);
            double b = fwd(m, ids, tgts) / N;
            w[off + i] = w0[off + i];
            double nm = (a - b) / ((double)pw - mw);
            ee = worse(ee, fabs(gp[i] - nm) / fabs(gp[i]));
        }
        worst_el = worse(worst_el, ee);
        snprintf(what, sizeof what, "%s: %d elements (|g| max %.2g)", p->name, ns, gmax);
        if (ns == 0) FAILF("%s: no element with a non-tiny gradient", p->name);
        note(grp, what, ee, ELEM_TOL);
        free(cand);
        free(wm);
        free(r);
    }
    printf("%s: worst directional err %.2e, worst element err %.2e\n", grp, worst_dir, worst_el);

    /* (c) padded vocab rows [V, VP) of the embedding and lm_head: zero weights,
     * exactly zero gradient */
    size_t bad = 0;
    for (size_t pi = 0; pi < np; pi++) {
        const tks_param *p = &ps[pi];
        for (uint64_t r = p->rows_real; r < p->lrows; r++)
            for (uint64_t k = 0; k < p->lcols; k++) {
                size_t i = p->offset + r * p->lcols + k;
                bad += g[i] != 0.0f || w0[i] != 0.0f;
            }
    }
    snprintf(what, sizeof what, "padded vocab rows: weight and gradient == 0 (count)");
    note(grp, what, (double)bad, 0.5);

    put_weights(m, w0);
    free(g);
    free(w);
    free(w0);
    tks_model_free(m);
}

/* ---- (c) padding does not change the loss: same weights without padding ----------------- */

static void check_padding_equivalence(int tie) {
    const int N = BATCH * SEQ;
    tks_model_config cp = tiny(tie, 0.3f, 8), cu = tiny(tie, 0.3f, 1);
    tks_model *mp = make(&cp, BATCH, SEQ, 99), *mu = make(&cu, BATCH, SEQ, 0);
    size_t np, nu;
    const tks_param *pp = tks_model_params(mp, &np), *pu = tks_model_params(mu, &nu);
    char grp[32], what[128];
    snprintf(grp, sizeof grp, "padding tie=%d", tie);
    if (np != nu || tks_model_padded_vocab(tks_model_config_of(mu), 1) != VOCAB ||
        tks_model_padded_vocab(tks_model_config_of(mp), 1) != 56) {
        FAILF("unexpected parameter tables or padded vocab");
        tks_model_free(mp);
        tks_model_free(mu);
        return;
    }
    /* copy tensor by tensor: the real rows only */
    float *wp = get_flat(mp, tks_model_weights(mp)), *wu = get_flat(mu, tks_model_weights(mu));
    for (size_t i = 0; i < np; i++) {
        size_t rows = pu[i].lrows < pp[i].rows_real ? pu[i].lrows : pp[i].rows_real;
        memcpy(wu + pu[i].offset, wp + pp[i].offset, rows * pp[i].lcols * sizeof *wu);
    }
    put_weights(mu, wu);
    tks_model_zero_grad(mp);
    tks_model_zero_grad(mu);
    double lp = fwd(mp, ids, tgts), lu = fwd(mu, ids, tgts);
    bwd(mp, 1.0f / N);
    bwd(mu, 1.0f / N);
    snprintf(what, sizeof what, "loss VP=56 == loss VP=50 (%.9g vs %.9g%s)", lp, lu,
             lp == lu ? ", bit-identical" : "");
    note(grp, what, fabs(lp - lu) / fabs(lu), chain_tol(&cp, SEQ, N, 0));
    float *gp = get_flat(mp, tks_model_grads(mp)), *gu = get_flat(mu, tks_model_grads(mu));
    double e = 0;
    for (size_t i = 0; i < np; i++) {
        size_t cnt = pu[i].lrows * pu[i].lcols;
        double mx = 0, d = 0;
        for (size_t k = 0; k < cnt; k++) {
            mx = fmax(mx, fabs(gu[pu[i].offset + k]));
            d = worse(d, fabs(gp[pp[i].offset + k] - gu[pu[i].offset + k]));
        }
        e = worse(e, d / fmax(mx, 1e-30));
    }
    note(grp, "real-row gradients VP=56 == VP=50 (max err / tensor max)", e,
         chain_tol(&cp, SEQ, N, 1));
    free(gp);
    free(gu);
    free(wp);
    free(wu);
    tks_model_free(mp);
    tks_model_free(mu);
}

/* ---- (d) loss at init ------------------------------------------------------------------------------ */

static void check_init_loss(void) {
    /* 64 tokens of their own: the mean over them has a spread of ~0.08/8 = 0.01 */
    enum { B = 4, T = 16 };
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (int32_t)(next_u64() % VOCAB);
    for (int i = 0; i < B * T; i++) tg[i] = (int32_t)(next_u64() % VOCAB);
    tks_model_config c = tiny(0, 0.02f, 8);
    tks_model *m = make(&c, B, T, 7);
    double L = fwd(m, in, tg) / (B * T);
    /* logits ~ N(0, s^2) with s ~ 0.02 * sqrt(C) = 0.08 give E[loss] ~ ln V + s^2/2
     * = ln V + 0.003. Tolerance 0.05 (5 spreads); padding wrongly counted in the
     * softmax would give ln 56 - ln 50 = 0.11 and fail it. */
    char what[96];
    snprintf(what, sizeof what, "init_std 0.02: mean loss %.5f vs ln(50) = %.5f", L, log(VOCAB));
    note("init", what, fabs(L - log(VOCAB)), 0.05);
    tks_model_free(m);
}

/* ---- (e) gradient accumulation ---------------------------------------------------------------------- */

static void check_accumulation(void) {
    tks_model_config c = tiny(0, 0.3f, 8);
    tks_model *m2 = make(&c, 2, SEQ, 5), *m1 = make(&c, 1, SEQ, 5);
    const float s = 1.0f / (2 * SEQ);
    tks_model_zero_grad(m2);
    double l2 = fwd(m2, ids, tgts);
    bwd(m2, s);
    tks_model_zero_grad(m1);
    double l1 = fwd(m1, ids, tgts);
    bwd(m1, s);
    l1 += fwd(m1, ids + SEQ, tgts + SEQ);
    bwd(m1, s);
    note("accumulate", "loss: 2 micro-batches of B=1 vs one B=2 (relative)", fabs(l1 - l2) / l2,
         chain_tol(&c, SEQ, 2 * SEQ, 0));
    size_t np;
    const tks_param *ps = tks_model_params(m2, &np);
    float *g1 = get_flat(m1, tks_model_grads(m1)), *g2 = get_flat(m2, tks_model_grads(m2));
    double e = 0;
    const char *worst = "";
    for (size_t i = 0; i < np; i++) {
        size_t cnt = ps[i].lrows * ps[i].lcols;
        double mx = 0, d = 0;
        for (size_t k = 0; k < cnt; k++) {
            mx = fmax(mx, fabs(g2[ps[i].offset + k]));
            d = worse(d, fabs(g1[ps[i].offset + k] - g2[ps[i].offset + k]));
        }
        double r = d / fmax(mx, 1e-30);
        if (!(r <= e)) worst = ps[i].name;
        e = worse(e, r);
    }
    /* the two orders of summing the rows differ in fp32 rounding only */
    char what[128];
    snprintf(what, sizeof what, "grads: max err / tensor max (worst %s)", worst);
    note("accumulate", what, e, chain_tol(&c, SEQ, 2 * SEQ, 1));
    free(g1);
    free(g2);
    tks_model_free(m1);
    tks_model_free(m2);
}

/* ---- (f) determinism ----------------------------------------------------------------------------------- */

static void check_determinism(void) {
    tks_model_config c = tiny(0, 0.3f, 8);
    double L[3];
    float *g[3];
    size_t n = 0;
    tks_model *m = NULL;
    for (int run = 0; run < 3; run++) {
        if (run < 2) { /* runs 0, 1: fresh models; run 2: model of run 1 again */
            tks_model_free(m);
            m = make(&c, BATCH, SEQ, 42);
        }
        n = tks_model_n_local(m);
        tks_model_zero_grad(m);
        L[run] = fwd(m, ids, tgts);
        bwd(m, 1.0f / (BATCH * SEQ));
        g[run] = get_flat(m, tks_model_grads(m));
    }
    tks_model_free(m);
    for (int run = 1; run < 3; run++) {
        size_t nd = memcmp(&L[0], &L[run], sizeof L[0]) != 0;
        for (size_t i = 0; i < n; i++) nd += memcmp(&g[0][i], &g[run][i], sizeof(float)) != 0;
        note("determinism", run == 1 ? "two fresh models: loss and grads bit-identical (diffs)"
                                     : "same model again: loss and grads bit-identical (diffs)",
             (double)nd, 0.5);
    }
    for (int run = 0; run < 3; run++) free(g[run]);
}

/* ---- initial weights, bit for bit -------------------------------------------------------- */

/* FNV-1a (64-bit) over the bytes of the n_local initial weights */
static uint64_t weights_fnv(tks_model *m) {
    float *w = get_flat(m, tks_model_weights(m));
    const unsigned char *b = (const unsigned char *)w;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < tks_model_n_local(m) * sizeof *w; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    free(w);
    return h;
}

/* tks_model_init hashes every value from (seed, parameter name, global
 * index): the weights are the same bits whatever the number of threads that
 * compute them, and the same as the serial loop that first defined them,
 * whose checksums are pinned here (untied and tied, padded vocab; rank 1 of
 * tp 2, whose slices start at row0 or col0 > 0). */
static void check_init_values(void) {
    static const struct { int tie, tp_rank; uint64_t fnv; } want[] = {
        {0, -1, 0x6d51e45de3931333ull}, {1, -1, 0xe5375fcc8c6fe9c5ull}, {0, 1, 0x9450d0aae0198a19ull}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        tks_model_config c = tiny(want[k].tie, 0.02f, 64);
        c.vocab_size = 1000, c.dim = 64, c.ffn_dim = 96, c.n_heads = 8, c.n_kv_heads = 4;
        tks_comm tpc;
        memset(&tpc, 0, sizeof tpc);
        tpc.size = 2, tpc.rank = want[k].tp_rank;
        for (int threads = 1; threads <= 3; threads++) {
            tks_model *m = NULL;
            int rc = tks_model_create(&c, be, want[k].tp_rank >= 0 ? &tpc : NULL, 1, 4, &m);
            if (rc) {
                printf("FAIL tks_model_create: %s (%s)\n", tks_strerror(rc), tks_last_error()->message);
                failures++;
                return;
            }
            int saved = omp_get_max_threads();
            omp_set_num_threads(threads);
            tks_model_init(m, 1337);
            omp_set_num_threads(saved);
            uint64_t h = weights_fnv(m);
            printf("init tie %d tp rank %d, %d threads: %016llx\n", want[k].tie, want[k].tp_rank,
                   threads, (unsigned long long)h);
            note("init", "weights' checksum differs from the pinned one (0 = same)", h != want[k].fnv, 0.5);
            tks_model_free(m);
        }
    }
}

/* ---- (g) KV-cache decoding vs the full forward --------------------------------------------------------- */

static void check_decode(int tie) {
    tks_model_config c = tiny(tie, 0.3f, 8);
    tks_model *m = make(&c, 1, SEQ, 77);
    uint32_t VP = tks_model_padded_vocab(&c, 1);
    fwd(m, ids, tgts);
    float *full = malloc((size_t)SEQ * VP * sizeof *full), logits[VOCAB];
    be->ops->download(be, full, tks_model_logits(m), (size_t)SEQ * VP * sizeof *full);
    int rc = tks_model_kv_reset(m);
    if (rc) FAILF("tks_model_kv_reset: %s", tks_last_error()->message);
    double e = 0;
    for (int t = 0; t < SEQ && !rc; t++) {
        for (int j = 0; j < VOCAB; j++) logits[j] = NAN;
        rc = tks_model_decode_step(m, ids[t], t, logits);
        if (rc) FAILF("tks_model_decode_step(pos %d): %s", t, tks_last_error()->message);
        for (int j = 0; j < VOCAB; j++)
            e = worse(e, fabs(logits[j] - full[(size_t)t * VP + j]) /
                             fmax(1.0, fabs(full[(size_t)t * VP + j])));
    }
    char what[96];
    snprintf(what, sizeof what, "tie=%d: decode_step logits == full forward, %d positions", tie,
             SEQ);
    note("kv-cache", what, e, chain_tol(&c, SEQ, 1, 0));
    /* and again after a reset: the cache is cleared, not appended to */
    rc = tks_model_kv_reset(m);
    double e2 = 0;
    for (int t = 0; t < 3 && !rc; t++) {
        rc = tks_model_decode_step(m, ids[t], t, logits);
        for (int j = 0; j < VOCAB; j++)
            e2 = worse(e2, fabs(logits[j] - full[(size_t)t * VP + j]) /
                               fmax(1.0, fabs(full[(size_t)t * VP + j])));
    }
    if (rc) FAILF("decode after reset: %s", tks_last_error()->message);
    snprintf(what, sizeof what, "tie=%d: after kv_reset, positions 0..2 again", tie);
    note("kv-cache", what, e2, chain_tol(&c, SEQ, 1, 0));
    /* the context limit is an error, not a write past the cache */
    rc = tks_model_decode_step(m, ids[0], (int)c.max_seq_len, logits);
    note("kv-cache", "pos == max_seq_len refused with TKS_ERR_ARG", rc == TKS_ERR_ARG ? 0 : 1, 0.5);
    free(full);
    tks_model_free(m);
}

/* ---- (h) AdamW on one fixed batch --------------------------------------------------------------------- */

static void check_training(int tie) {
    const int N = BATCH * SEQ, steps = 30;
    tks_model_config c = tiny(tie, 0.3f, 8);
    tks_model *m = make(&c, BATCH, SEQ, 3);
    size_t np, n = tks_model_n_local(m);
    const tks_param *ps = tks_model_params(m, &np);
    float *mo = be->ops->alloc(be, n * sizeof(float)), *vo = be->ops->alloc(be, n * sizeof(float));
    double first = 0, last = 0;
    size_t padbad = 0;
    for (int t = 1; t <= steps; t++) {
        tks_model_zero_grad(m);
        double L = fwd(m, ids, tgts) / N;
        bwd(m, 1.0f / N);
        if (t == 1) first = L;
        last = L;
        /* one multi-tensor call over every tensor of the flat buffer */
        tks_span sp[64];
        for (size_t i = 0; i < np && i < 64; i++)
            sp[i] = (tks_span){ps[i].offset, ps[i].lrows * ps[i].lcols, ps[i].decay ? 0.1f : 0.0f};
        tks_adamw_hp hp = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .t = t};
        be->ops->adamw(be, tks_model_weights(m), tks_model_grads(m), mo, vo, 0, sp, np < 64 ? np : 64,
                  &hp, 1.0f, NULL, NULL, TKS_F32);
        /* padded rows: gradient and weight stay exactly 0 */
        float *w = get_flat(m, tks_model_weights(m)), *g = get_flat(m, tks_model_grads(m));
        for (size_t i = 0; i < np; i++)
            for (uint64_t r = ps[i].rows_real; r < ps[i].lrows; r++)
                for (uint64_t k = 0; k < ps[i].lcols; k++) {
                    size_t j = ps[i].offset + r * ps[i].lcols + k;
                    padbad += w[j] != 0.0f || g[j] != 0.0f;
                }
        free(w);
        free(g);
    }
    char what[128];
    snprintf(what, sizeof what, "tie=%d: %d AdamW steps, loss %.4f -> %.4f (last/first)", tie,
             steps, first, last);
    note("adamw", what, last / first, 0.5);
    snprintf(what, sizeof what, "tie=%d: padded rows stay 0 through the steps (count)", tie);
    note("adamw", what, (double)padbad, 0.5);
    be->ops->free(be, mo);
    be->ops->free(be, vo);
    tks_model_free(m);
}

/* ---- (i) activation memory: linear in T, the plan equals the allocation ------------------- */

/* The measurement config (2 layers, 8 heads, dim 64, batch 1), at
 * T = 512 .. 4096. tks_model_activation_bytes (the --dry-run figure) must
 * equal what tks_model_create allocates for activations, scratch and the
 * workspace, and it must grow at most linearly: f(2T) <= 2 f(T) for every
 * doubling. Saving the [B, NH, T, T] probabilities (exact attention) made the
 * per-doubling factor 3.8 here; a T x T buffer anywhere breaks the bound. */
static void check_activation_memory(tks_dtype dt) {
    tks_model_config c = {0};
    c.vocab_size = 512;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 8;
    c.max_seq_len = 4096;
    tks_model_config_defaults(&c);
    size_t prev = 0;
    for (int T = 512; T <= 4096; T *= 2) {
        size_t plan = tks_model_activation_bytes(&c, 1, 1, T, dt, be);
        tks_model *m = NULL;
        int rc = tks_model_create_dt(&c, be, NULL, 1, T, 1, dt, &m);
        if (rc) FAILF("tks_model_create_dt T=%d: %s", T, tks_last_error()->message);
        size_t got = tks_model_act_bytes(m);
        tks_model_free(m);
        char what[128];
        snprintf(what, sizeof what, "%s T=%d: planned %zu bytes == allocated %zu (differ by)",
                 tks_dtype_name(dt), T, plan, got);
        note("act-memory", what, fabs((double)plan - (double)got), 0.5);
        if (prev) {
            snprintf(what, sizeof what, "%s T=%d: bytes(T) / bytes(T/2) = %.3f <= 2 (linear)",
                     tks_dtype_name(dt), T, (double)got / (double)prev);
            note("act-memory", what, (double)got / (double)prev, 2.0);
        }
        prev = got;
    }
}

/* ---- (j) mixed precision: bf16 compute against fp32 ------------------------------------------ */

/* max over tensors of max |a - b| / the tensor's max |b| */
static double grads_diff(const tks_param *ps, size_t np, const float *a, const float *b, const char **worst) {
    double e = 0;
    for (size_t i = 0; i < np; i++) {
        double mx = 0, d = 0;
        for (size_t k = 0; k < ps[i].lrows * ps[i].lcols; k++) {
            mx = fmax(mx, fabs(b[ps[i].offset + k]));
            d = worse(d, fabs(a[ps[i].offset + k] - b[ps[i].offset + k]));
        }
        double r = d / fmax(mx, 1e-30);
        if (!(r <= e)) *worst = ps[i].name;
        e = worse(e, r);
    }
    return e;
}

/* The same weights (fp32 masters) run in fp32 and in bf16 (bf16 compute
 * weights and activations, fp32 arithmetic inside each op, fp32 gradients).
 * Exact: the compute copy is the round-to-nearest-even of every master
 * weight, before and after an optimizer step. Bounded: to first order each
 * stored bf16 value adds a relative error of at most u = 2^-8; along the
 * longest chain a value crosses R stored roundings (per layer: h1, q|k|v,
 * RoPE of q and k, the attention output, o_proj + residual, h2, gate|up, the
 * SwiGLU output, down + residual = 10; plus the embedding, the final norm and
 * the logits = 3) and the weights' own rounding (1 per GEMM it meets), so
 * the mean loss is within 2 R u of fp32 relative, and each gradient (which
 * goes through the mirror chain again) within 4 R u of the tensor's max. A
 * dtype mix-up (bf16 bits read as fp32, a missing conversion) gives O(1). */
static void check_bf16(void) {
    tks_model_config c = tiny(0, 0.3f, 8);
    tks_model *m32 = make(&c, BATCH, SEQ, 21), *m16 = NULL;
    int rc = tks_model_create_dt(&c, be, NULL, BATCH, SEQ, 1, TKS_BF16, &m16);
    if (rc) FAILF("tks_model_create_dt bf16: %s", tks_last_error()->message);
    tks_model_init(m16, 21);
    size_t n = tks_model_n_local(m16), np;
    const tks_param *ps = tks_model_params(m16, &np);
    float *w = get_flat(m16, tks_model_weights(m16));
    uint16_t *wc = malloc(n * sizeof *wc);
    be->ops->download(be, wc, tks_model_compute_weights(m16), n * sizeof *wc);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += wc[i] != tks_bf16_from_f32(w[i]);
    note("bf16", "compute copy == RNE(master) after init (count)", (double)bad, 0.5);

    const double R = c.n_layers * 10.0 + 3 + 4, u = 0x1p-8;
    float *g32 = NULL, *g16 = NULL;
    double L32 = loss_and_grad(m32, &g32), L16 = loss_and_grad(m16, &g16);
    char what[160];
    snprintf(what, sizeof what, "mean loss bf16 %.6f vs fp32 %.6f (relative)", L16, L32);
    note("bf16", what, fabs(L16 - L32) / L32, 2 * R * u);
    const char *worst = "";
    double e = grads_diff(ps, np, g16, g32, &worst);
    snprintf(what, sizeof what, "fp32 grads of the bf16 model vs fp32 (worst %s)", worst);
    note("bf16", what, e, 4 * R * u);

    /* an optimizer step updates the fp32 masters and re-rounds the copy */
    tks_span sp[64];
    for (size_t i = 0; i < np && i < 64; i++)
        sp[i] = (tks_span){ps[i].offset, ps[i].lrows * ps[i].lcols, ps[i].decay ? 0.1f : 0.0f};
    float *mo = be->ops->alloc(be, n * sizeof(float)), *vo = be->ops->alloc(be, n * sizeof(float));
    tks_adamw_hp hp = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .t = 1};
    rc = be->ops->adamw(be, tks_model_weights(m16), tks_model_grads(m16), mo, vo, 0, sp, np < 64 ? np : 64,
                   &hp, 1.0f, NULL, tks_model_compute_weights(m16), TKS_BF16);
    if (rc) FAILF("adamw: %s", tks_last_error()->message);
    free(w);
    w = get_flat(m16, tks_model_weights(m16));
    be->ops->download(be, wc, tks_model_compute_weights(m16), n * sizeof *wc);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += wc[i] != tks_bf16_from_f32(w[i]);
    note("bf16", "compute copy == RNE(master) after an AdamW step (count)", (double)bad, 0.5);
    be->ops->free(be, mo);
    be->ops->free(be, vo);
    free(w);
    free(wc);
    free(g32);
    free(g16);
    tks_model_free(m32);
    tks_model_free(m16);
}

/* ---- (k) the chunked loss head (TKS_LOSS_CHUNK_ROWS, trainer/model/loss_head.h) ------------------- */


/* The same model with the lm_head and cross-entropy by chunks of 5 rows (N =
 * 16: chunks 5, 5, 5, 1) against the whole logits, fp32 and bf16, untied and
 * tied: the loss and every gradient after tks_model_forward + backward (the
 * loss head run again with its gradients) and after forward_train +
 * backward (the trainer's path, lm_head's backward inside forward_train).
 * A row's logits, loss and input gradient are the same sums either way;
 * lm_head's weight gradient sums the N rows as four partial sums, a
 * different fp32 order: the chain bound (chain_tol) covers it. A dropped
 * chunk, a wrong row offset or a gradient not accumulated moves a loss or a
 * gradient by O(1 / chunks). The activation plan must still be the
 * allocation, and smaller by the (N - 5) rows of logits not held. */
static void check_loss_chunks(int tie, tks_dtype dt) {
    enum { R = 5 };
    const int N = BATCH * SEQ;
    tks_model_config c = tiny(tie, 0.3f, 8);
    tks_model *mw = NULL, *mc = NULL;
    int rc = tks_model_create_dt(&c, be, NULL, BATCH, SEQ, 1, dt, &mw);
    setenv("TKS_LOSS_CHUNK_ROWS", "5", 1);
    size_t plan = tks_model_activation_bytes(&c, 1, BATCH, SEQ, dt, be);
    if (!rc) rc = tks_model_create_dt(&c, be, NULL, BATCH, SEQ, 1, dt, &mc);
    unsetenv("TKS_LOSS_CHUNK_ROWS");
    if (rc) {
        FAILF("tks_model_create_dt: %s", tks_last_error()->message);
        return;
    }
    tks_model_init(mw, 31);
    tks_model_init(mc, 31);
    char grp[40], what[160];
    snprintf(grp, sizeof grp, "chunks %s t=%d", tks_dtype_name(dt), tie);
    size_t VP = tks_model_padded_vocab(&c, 1), es = tks_dtype_size(dt);
    size_t saved = (size_t)tks_model_act_bytes(mw) - (size_t)tks_model_act_bytes(mc);
    snprintf(what, sizeof what, "plan %zu == allocated %zu; %zu bytes fewer (>= (N - 5) VP es = %zu less 64 of alignment)", plan,
             tks_model_act_bytes(mc), saved, (size_t)(N - R) * VP * es);
    note(grp, what, fabs((double)plan - (double)tks_model_act_bytes(mc)) + (saved + 64 < (N - R) * VP * es), 0.5);
    size_t np;
    const tks_param *ps = tks_model_params(mw, &np);
    const char *worst = "";
    for (int path = 0; path < 2; path++) {
        double L[2];
        float *g[2];
        for (int k = 0; k < 2; k++) {
            tks_model *m = k ? mc : mw;
            tks_model_zero_grad(m);
            if (path == 0) {
                L[k] = fwd(m, ids, tgts);
            } else {
                float *acc = be->ops->alloc(be, sizeof(float));
                rc = tks_model_forward_train(m, ids, tgts, 1.0f / N, acc);
                if (rc) FAILF("tks_model_forward_train: %s", tks_last_error()->message);
                float h = 0;
                be->ops->download(be, &h, acc, sizeof h);
                be->ops->free(be, acc);
                L[k] = h;
            }
            bwd(m, 1.0f / N);
            g[k] = get_flat(m, tks_model_grads(m));
        }
        const char *how = path ? "forward_train" : "forward + backward";
        snprintf(what, sizeof what, "%s: loss chunked %.9g vs whole %.9g (relative)", how, L[1], L[0]);
        note(grp, what, fabs(L[1] - L[0]) / fabs(L[0]), chain_tol(&c, SEQ, N, 0));
        double e = grads_diff(ps, np, g[1], g[0], &worst);
        snprintf(what, sizeof what, "%s: grads max err / tensor max (worst %s)", how, worst);
        note(grp, what, e, chain_tol(&c, SEQ, N, 1));
        free(g[0]);
        free(g[1]);
    }
    tks_model_free(mw);
    tks_model_free(mc);
}

int main(void) {
    be = tks_cpu_backend_create(0);
    if (!be) {
        fprintf(stderr, "cannot create the cpu backend\n");
        return 2;
    }
    make_batch();
    check_grads(0);
    check_grads(1);
    check_padding_equivalence(0);
    check_padding_equivalence(1);
    check_init_loss();
    check_accumulation();
    check_determinism();
    check_init_values();
    check_decode(0);
    check_decode(1);
    check_training(0);
    check_training(1);
    check_activation_memory(TKS_F32);
    check_activation_memory(TKS_BF16);
    check_bf16();
    for (int tie = 0; tie < 2; tie++) {
        check_loss_chunks(tie, TKS_F32);
        check_loss_chunks(tie, TKS_BF16);
    }
    be->ops->destroy(be);
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("all model checks passed\n");
    return 0;
}
