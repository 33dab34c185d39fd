/*
 * test_cuda_model.c - the whole LLaMA trained end to end on the CUDA backend
 * against the CPU reference, with the trainer's device-side step: 20 AdamW
 * steps of a tiny model in fp32 (losses within a bound derived per step
 * from the sums' lengths, fp32_per_step below: 1.5e-5 at step 1, 3e-4 at
 * step 20) and in bf16 with tokshard's attention kernel (1e-2, why below);
 * bf16 with cuDNN's attention from the CPU's own weights of step 10 (one
 * forward within 2^-8, ten steps within 1e-2; its 20 steps from step 0 are
 * reported, why at the check); two GPU runs bit-identical in each dtype
 * (losses and final weights), a GPU checkpoint resumed on the CPU and a CPU
 * checkpoint resumed on the GPU continuing the other device's curve, and the
 * same 20 steps on packed documents (--doc-mask and --reset-positions: the
 * model's document starts, block-causal attention, restarted positions; on
 * cuDNN's bf16 path tokshard's kernel runs them) against the CPU. Exits 77
 * where no CUDA device is usable (ctest: skipped).
 *
 * Why the fp32 bound holds: both backends compute every op in fp32 and
 * differ only in summation order (test_cuda_ops bounds each op by
 * 2 gamma_K S, ~1e-6 relative at these sizes); AdamW's eps is 1e-6 (as in the CPU parity test)
 * so that parameters whose gradient is near zero, where m / sqrt(v) would
 * amplify those differences into O(lr) steps, stay well conditioned.
 *
 * Usage: test_cuda_model WORKDIR
 * TKS_TEST_CPU_AS_GPU=1 runs the "GPU" side on a second CPU backend: a check
 * of this test's own harness on machines without a GPU (not a GPU test).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/cuda/cuda.h"
#include "trainer/model/model.h"
#include "trainer/model/optim.h"

enum { STEPS = 20, SAVE_AT = 10, B = 2, T = 32, V = 300 };
static int failures;
static int docs_on; /* run() trains on packed documents (DOCS) */

/* Document starts of each row: documents of 3, 9, 1, 12 and 7 tokens, then
 * 11 and 21 (a row is whole documents: the model's contract). */
static int32_t DOCS[B * T];
static void make_docs(void) {
    static const int len[] = {3, 9, 1, 12, 7, 11, 21};
    for (int i = 0, t = 0; i < 7; i++)
        for (int j = 0, s0 = t % T; j < len[i]; j++, t++) DOCS[t] = s0;
}

static tks_model_config cfg(void) {
    tks_model_config c = {0};
    c.vocab_size = V;
    c.vocab_divisible_by = 64;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 128;
    c.max_seq_len = T;
    c.init_std = 0.05f;
    tks_model_config_defaults(&c);
    return c;
}

static tks_adamw_opts opts(void) {
    tks_adamw_opts o = {0};
    o.lr = 1e-2f, o.min_lr = 1e-3f, o.warmup = 3, o.total = STEPS;
    o.beta1 = 0.9f, o.beta2 = 0.95f, o.eps = 1e-6f, o.weight_decay = 0.1f, o.grad_clip = 1.0f;
    return o;
}

/* Learnable data: each sample repeats one of 4 fixed random motifs, so the
 * loss falls within 20 steps. */
static void batch(int step, int32_t *ids, int32_t *tg) {
    for (int b = 0; b < B; b++) {
        uint64_t s = 0x1234567ull + (uint64_t)((step * B + b) % 4) * 0x9E3779B97F4A7C15ull;
        int32_t motif[5];
        for (int k = 0; k < 5; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            motif[k] = (int32_t)((s >> 33) % V);
        }
        for (int t = 0; t <= T; t++) {
            int32_t x = motif[t % 5];
            if (t < T) ids[b * T + t] = x;
            if (t > 0) tg[b * T + t - 1] = x;
        }
    }
}

/* Trains steps [first, STEPS) on `be` in dtype dt, from a checkpoint when
 * `from` is set, saving after step SAVE_AT when `save` is set; the step is
 * the trainer's device-side one (loss and gradient norm on the device, clip
 * factor read there by AdamW). losses[s] = mean token loss. weights
 * (optional): the final flat fp32 weights on the host. */
static int run(tks_backend *be, tks_dtype dt, const char *from, const char *save, double *losses,
               float **weights, size_t *nw) {
    tks_model_config c = cfg();
    tks_adamw_opts o = opts();
    tks_model *m = NULL;
    tks_optim *opt = NULL;
    float *dred = NULL;
    int rc = tks_model_create_dt(&c, be, NULL, B, T, 1, dt, &m);
    if (!rc) tks_model_init(m, 7);
    if (!rc && docs_on) rc = tks_model_set_documents(m, DOCS, 1, 1);
    if (!rc) rc = tks_optim_create(m, &o, 0, tks_model_n_flat(m), &opt);
    if (!rc && !(dred = be->ops->alloc(be, 4 * sizeof *dred)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of device memory");
    uint64_t first = 0;
    if (!rc && from) {
        tks_train_state st = {0};
        tks_model_config cc;
        rc = tks_checkpoint_peek(from, &cc, &st);
        if (!rc) rc = tks_checkpoint_load(from, m, opt);
        if (!rc) rc = tks_model_refresh_compute(m);
        first = st.step;
    }
    int32_t ids[B * T], tg[B * T];
    const float scale = 1.0f / (B * T);
    for (uint64_t s = first; !rc && s < STEPS; s++) {
        batch((int)s, ids, tg);
        tks_model_zero_grad(m);
        float red[2];
        rc = be->ops->memzero(be, dred, 4 * sizeof *dred);
        if (!rc) rc = tks_model_forward_train(m, ids, tg, scale, dred + 1);
        if (!rc) rc = tks_model_backward(m, scale);
        if (!rc) rc = tks_optim_grad_sumsq(opt, dred, 1);
        if (!rc) rc = tks_optim_step_dev(opt, (int64_t)s + 1, tks_lr_at(&o, s), dred);
        if (!rc) rc = be->ops->download(be, red, dred, sizeof red);
        if (!rc) rc = be->ops->sync(be);
        if (rc) break;
        losses[s] = red[1] / (B * T);
        if (save && s + 1 == SAVE_AT) {
            tks_train_state st;
            memset(&st, 0, sizeof st);
            st.step = s + 1, st.seed = 7, st.seq_len = T, st.global_batch = B;
            strcpy(st.options_json, "{}");
            rc = tks_checkpoint_save(save, m, opt, &st, NULL, NULL);
        }
    }
    if (!rc && weights) {
        size_t nl = tks_model_n_local(m);
        *nw = nl;
        *weights = malloc(nl * sizeof **weights);
        rc = be->ops->download(be, *weights, tks_model_weights(m), nl * sizeof **weights);
    }
    if (rc) printf("FAIL run on %s (%s): %s (%s)\n", be->kind->name, tks_dtype_name(dt), tks_strerror(rc),
                   tks_last_error()->message);
    if (dred) be->ops->free(be, dred);
    tks_optim_free(opt);
    tks_model_free(m);
    return rc;
}

/* Prints the largest relative difference of a against b: a figure, no check. */
static void report(const char *what, const double *a, const double *b) {
    double worst = 0;
    int at = 0;
    for (int s = 0; s < STEPS; s++) {
        double d = fabs(a[s] - b[s]) / fabs(b[s]);
        if (d > worst) worst = d, at = s + 1;
    }
    printf("%-58s max rel diff %.2e (step %d)\n", what, worst, at);
}

/* The fp32 bound per step, derived as tests/layout_losses.py derives it for
 * layouts: both backends compute every op in fp32 and differ only in the
 * order of their sums (cuBLAS's split of K and its fused multiply-adds
 * against OpenBLAS's, the GPU's reduction trees against the CPU's loops). A
 * sum of K fp32 terms is within lam sqrt(K) u of the exact sum (relative to
 * its terms' magnitudes) with probability >= 1 - 2 exp(-lam^2 / 2) (Higham
 * and Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm. 2.4; lam = 6: 3e-8 a
 * sum), K the longest chain of sums of one forward, and each earlier step
 * passes its rounding on to first order at most 1:1 (AdamW's update is
 * relative to the gradient's scale), so step s (0-based) is within
 * (s + 1) lam sqrt(K) u. A fused multiply-add rounds once where a multiply
 * and an add round twice, so it stays inside the same bound. */
static double fp32_per_step(void) {
    tks_model_config c = cfg();
    double C = c.dim, L = c.n_layers, NH = c.n_heads, F = c.ffn_dim;
    double VP = tks_model_padded_vocab(&c, 1);
    double K = L * (4 * C + C / NH + 2 * T + C + F) + 2 * C + VP + 8 * T;
    return 6 * sqrt(K) * ldexp(1.0, -24);
}

/* compare: steps [from, STEPS) of a and b within tol relative, or, with
 * per_step > 0, within (s + 1) per_step at step s (the fp32 bound above). */
static void compare(const char *what, const double *a, const double *b, int from, double tol, double per_step) {
    double worst = 0, ratio = 0;
    for (int s = from; s < STEPS; s++) {
        double d = fabs(a[s] - b[s]) / fabs(b[s]);
        double t = per_step > 0 ? (s + 1) * per_step : tol;
        if (!(d <= worst)) worst = d;
        if (!(d / t <= ratio)) ratio = d / t;
    }
    int ok = ratio <= 1;
    if (per_step > 0)
        printf("%-58s max rel diff %.2e (%.2f of the bound, %.1e a step)  %s\n", what, worst, ratio, per_step,
               ok ? "ok" : "FAIL");
    else
        printf("%-58s max rel diff %.2e (tol %.0e)  %s\n", what, worst, tol, ok ? "ok" : "FAIL");
    failures += !ok;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_cuda_model WORKDIR\n");
        return 2;
    }
    const char *self = getenv("TKS_TEST_CPU_AS_GPU");
    int harness = self && !strcmp(self, "1");
    if (!harness && tks_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n",
               tks_cuda_built() ? "built with CUDA, none visible" : "built without CUDA");
        return 77;
    }
    tks_backend *cpu = tks_cpu_backend_create(0), *gpu = NULL;
    if (harness) gpu = tks_cpu_backend_create(0);
    if (!cpu || (harness ? !gpu : tks_cuda_backend_create(-1, &gpu) != 0)) {
        fprintf(stderr, "test_cuda_model: %s\n", tks_last_error()->message);
        return 1;
    }
    char dg[4096], dc[4096];
    snprintf(dg, sizeof dg, "%s/from-gpu", argv[1]);
    snprintf(dc, sizeof dc, "%s/from-cpu", argv[1]);
    double lc[STEPS], lg[STEPS], lg2[STEPS], lcg[STEPS], lgc[STEPS];
    double bc[STEPS], bg[STEPS], bg2[STEPS], bf[STEPS];
    float *w1 = NULL, *w2 = NULL, *v1 = NULL, *v2 = NULL;
    size_t n1 = 0, n2 = 0, m1 = 0, m2 = 0;
    if (run(cpu, TKS_F32, NULL, dc, lc, NULL, NULL) || run(gpu, TKS_F32, NULL, dg, lg, &w1, &n1) ||
        run(gpu, TKS_F32, NULL, NULL, lg2, &w2, &n2) || run(cpu, TKS_F32, dg, NULL, lgc, NULL, NULL) ||
        run(gpu, TKS_F32, dc, NULL, lcg, NULL, NULL) || run(cpu, TKS_BF16, NULL, NULL, bc, NULL, NULL) ||
        run(gpu, TKS_BF16, NULL, NULL, bf, NULL, NULL))
        return 1;
    /* bf16's bitwise check with --deterministic's algorithms: cuDNN's fast
     * attention backward adds dQ with atomics (the run above, checked against
     * the CPU within the bf16 bound) */
    if (gpu->kind->set_deterministic && gpu->kind->set_deterministic(gpu, 1)) return 1;
    if (run(gpu, TKS_BF16, NULL, NULL, bg, &v1, &m1) || run(gpu, TKS_BF16, NULL, NULL, bg2, &v2, &m2))
        return 1;
    /* bf16 with tokshard's own attention kernel instead of cuDNN's (which
     * rounds the probabilities to bf16 before P V): the same bound against
     * the CPU, so that a difference found above is placed in cuDNN's path */
    double bk[STEPS];
    if (!harness) tks_cuda_set_flash(gpu, 0);
    if (gpu->kind->set_deterministic && gpu->kind->set_deterministic(gpu, 0)) return 1;
    if (run(gpu, TKS_BF16, NULL, NULL, bk, NULL, NULL)) return 1;
    if (!harness) tks_cuda_set_flash(gpu, 1); /* back to cuDNN's, where built with it */
    /* the same weights on both: the CPU's bf16 run saved after step 10, then
     * steps 11.. from it on the CPU, on the GPU with cuDNN's attention and
     * with tokshard's; step 11's loss is one forward on identical weights,
     * so a difference there is the forward's alone, not the training's */
    char d16[4096];
    snprintf(d16, sizeof d16, "%s/from-cpu-bf16", argv[1]);
    double tmp[STEPS], fc[STEPS], fg[STEPS], fk[STEPS];
    if (run(cpu, TKS_BF16, NULL, d16, tmp, NULL, NULL) || run(cpu, TKS_BF16, d16, NULL, fc, NULL, NULL) ||
        run(gpu, TKS_BF16, d16, NULL, fg, NULL, NULL))
        return 1;
    if (!harness) tks_cuda_set_flash(gpu, 0);
    if (run(gpu, TKS_BF16, d16, NULL, fk, NULL, NULL)) return 1;
    if (!harness) tks_cuda_set_flash(gpu, 1);
    /* packed documents: the same 20 steps, mask and restarted positions */
    double dc32[STEPS], dg32[STEPS], dc16[STEPS], dg16[STEPS];
    make_docs();
    docs_on = 1;
    if (gpu->kind->set_deterministic && gpu->kind->set_deterministic(gpu, 0)) return 1;
    if (run(cpu, TKS_F32, NULL, NULL, dc32, NULL, NULL) || run(gpu, TKS_F32, NULL, NULL, dg32, NULL, NULL) ||
        run(cpu, TKS_BF16, NULL, NULL, dc16, NULL, NULL) || run(gpu, TKS_BF16, NULL, NULL, dg16, NULL, NULL))
        return 1;
    docs_on = 0;
    if (!harness && !strstr(tks_cuda_flash_status(gpu), "document masking")) {
        printf("FAIL bf16 with documents: tks_cuda_flash_status does not name the fallback: '%s'\n",
               tks_cuda_flash_status(gpu));
        failures++;
    }
    for (int s = 0; s < STEPS; s++)
        printf("step %2d  fp32: cpu %.7f gpu %.7f   bf16: cpu %.7f gpu %.7f (det %.7f, own attention %.7f)"
               "   docs fp32: cpu %.7f gpu %.7f  bf16: cpu %.7f gpu %.7f\n",
               s + 1, lc[s], lg[s], bc[s], bf[s], bg[s], bk[s], dc32[s], dg32[s], dc16[s], dg16[s]);
    for (int s = SAVE_AT; s < STEPS; s++)
        printf("from the CPU's bf16 weights of step %d, step %2d: cpu %.7f gpu %.7f own attention %.7f\n",
               SAVE_AT, s + 1, fc[s], fg[s], fk[s]);
    int fell = lg[STEPS - 1] < lg[0] - 0.1 && bg[STEPS - 1] < bg[0] - 0.1;
    printf("%-58s %s\n", "the GPU loss falls (fp32 and bf16)", fell ? "ok" : "FAIL");
    failures += !fell;
    const double f32 = fp32_per_step();
    compare("fp32, 20 steps: GPU losses vs CPU", lg, lc, 0, 0, f32);
    /* bf16: both round the same fp32 values to bf16, but fp32 results that
     * differ in the last bits can round to neighbouring bf16 values (2^-8
     * relative) wherever an activation is stored; the loss is a mean over 64
     * tokens of smooth functions of them, so it moves by a fraction of that:
     * 1e-2 relative over 20 steps (tokshard's kernel: every rounding is the
     * CPU's, only the fp32 sums' order differs) */
    /* bf16 with cuDNN's attention, 20 steps from the same initial weights:
     * reported, not checked. cuDNN rounds the probabilities to bf16 before
     * P V (and dS before dQ, dK), so its first forward differs from the
     * CPU's by several times what tokshard's kernel does (7.7e-5 against
     * 1.8e-6 on an H200), and the warm-up steps, lr rising to 1e-2, carry
     * that into weights that fit the four motifs in another order: on an
     * H200 the run's loss left the CPU's by 8.6% at step 11 on one batch and
     * not on the other. From identical weights (the checks below) cuDNN's
     * steps follow the CPU's to 6e-4 over 10 steps, so that is the
     * trajectory's sensitivity, not a wrong gradient; cuda_ops checks
     * cuDNN's forward and backward op by op with the bf16 bound. */
    report("bf16 with cuDNN, 20 steps from step 0 (reported)", bf, bc);
    report("bf16 --deterministic with cuDNN, 20 steps (reported)", bg, bc);
    compare("bf16, tokshard's attention kernel: GPU losses vs CPU", bk, bc, 0, 1e-2, 0);
    /* from identical weights: step 11 is one forward, where the loss moves
     * by less than one bf16 rounding of it (2^-8 relative: every stored
     * activation is within half an ulp of the CPU's or one ulp away, and
     * the loss is a mean over the batch of smooth functions of them); the
     * 10 steps from there within the 20-step bound above */
    {
        double fw = ldexp(1.0, -8), dg = fabs(fg[SAVE_AT] - fc[SAVE_AT]) / fc[SAVE_AT],
               dk = fabs(fk[SAVE_AT] - fc[SAVE_AT]) / fc[SAVE_AT];
        int ok = dg <= fw && dk <= fw;
        printf("%-58s cuDNN %.2e, own %.2e (tol %.1e)  %s\n", "bf16 forward on the CPU's weights: GPU vs CPU",
               dg, dk, fw, ok ? "ok" : "FAIL");
        failures += !ok;
    }
    compare("bf16 from the CPU's weights of step 10, cuDNN", fg, fc, SAVE_AT, 1e-2, 0);
    compare("bf16 from the CPU's weights of step 10, own kernel", fk, fc, SAVE_AT, 1e-2, 0);
    int same = !memcmp(lg, lg2, sizeof lg) && n1 == n2 && !memcmp(w1, w2, n1 * sizeof *w1);
    printf("%-58s %s\n", "fp32: two GPU runs, same loss and weight bits", same ? "ok" : "FAIL");
    failures += !same;
    same = !memcmp(bg, bg2, sizeof bg) && m1 == m2 && !memcmp(v1, v2, m1 * sizeof *v1);
    printf("%-58s %s\n", "bf16 --deterministic: two GPU runs, same loss and weight bits", same ? "ok" : "FAIL");
    failures += !same;
    compare("documents, fp32, 20 steps: GPU losses vs CPU", dg32, dc32, 0, 0, f32);
    compare("documents, bf16, 20 steps: GPU losses vs CPU", dg16, dc16, 0, 1e-2, 0);
    compare("GPU checkpoint at step 10 resumed on the CPU vs GPU run", lgc, lg, SAVE_AT, 0, f32);
    compare("CPU checkpoint at step 10 resumed on the GPU vs CPU run", lcg, lc, SAVE_AT, 0, f32);
    free(w1), free(w2), free(v1), free(v2);
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
    printf("test_cuda_model: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
