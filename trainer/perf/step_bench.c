/* step_bench.c - the trainer's device-side step (forward, backward,
 * global-norm clip, AdamW) timed on random ids, one process, for the
 * benchmarks (tks_step_bench, trainer.h). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/perf/memplan.h"
#include "trainer/model/model.h"
#include "trainer/model/optim.h"
#include "trainer/perf/profile.h"
#include "trainer/trainer.h"

/* One step on the ids and targets given, `accum` micro-batches of n tokens
 * each (ids and tg hold accum x n; step: AdamW's 1-based count), the
 * gradients accumulated and the loss the mean over the step's tokens, as
 * train.c's step. */
static int one_step(tks_model *m, tks_optim *opt, const tks_adamw_opts *o, int step, const int32_t *ids,
                    const int32_t *tg, size_t n, int accum, tks_backend *be, float *dred) {
    tks_model_zero_grad(m);
    int rc = be->ops->memzero(be, dred, TKS_MEM_STEP_SCALARS * sizeof *dred);
    float scale = 1.0f / (float)(n * (size_t)accum);
    for (int k = 0; k < accum && !rc; k++) {
        rc = tks_model_forward_train(m, ids + (size_t)k * n, tg + (size_t)k * n, scale, dred + 1);
        if (!rc) rc = tks_model_backward(m, scale);
    }
    if (!rc) rc = tks_optim_grad_sumsq(opt, dred, 1);
    if (!rc) rc = tks_optim_step_dev(opt, step, tks_lr_at(o, (uint64_t)(step - 1)), dred);
    return rc;
}

/* in->profile more steps on the last ids, every op behind the profiler's
 * timing wrappers (priced on the roofline of the device's name, when one
 * is known), the table into out->profile. */
static int profile_steps(tks_backend *be, tks_model *m, tks_optim *opt, const tks_adamw_opts *o,
                         const tks_step_bench_opts *in, float *dred, const int32_t *ids, const int32_t *tg,
                         size_t n, tks_step_bench_result *out) {
    tks_roofline hw, *use = NULL;
    char desc[512] = "";
    if (be->kind->describe) be->kind->describe(be, desc, sizeof desc);
    if (tks_roofline_for_device(desc, &hw)) use = &hw;
    int rc = tks_profile_attach(be, use);
    for (int p = 0; p < in->profile && !rc; p++) {
        tks_profile_count(1);
        rc = one_step(m, opt, o, in->warmup + in->steps + p + 1, ids, tg, n, in->accum > 1 ? in->accum : 1, be, dred);
        tks_profile_count(0);
    }
    if (!rc) rc = be->ops->sync(be);
    if (!rc && !(out->profile = tks_profile_report((uint64_t)in->profile)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    tks_profile_detach(be);
    return rc;
}

/* warm + steps steps; uniform random ids and targets from a fixed LCG (the
 * PyTorch anchor of bench/gpu draws the same way); the loss and the norm
 * stay on the device and are read once, after the last step */
static int run_steps(tks_backend *be, tks_model *m, tks_optim *opt, const tks_adamw_opts *o,
                     const tks_step_bench_opts *in, float *dred, tks_step_bench_result *out) {
    size_t n = (size_t)in->B * (size_t)in->T;
    int accum = in->accum > 1 ? in->accum : 1;
    size_t all = n * (size_t)accum; /* the step's tokens */
    int32_t *ids = malloc(all * sizeof *ids), *tg = malloc(all * sizeof *tg);
    int rc = ids && tg ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    uint32_t V = tks_model_config_of(m)->vocab_size;
    uint64_t s = 42;
    double t0 = omp_get_wtime();
    for (int it = 0; it < in->warmup + in->steps && !rc; it++) {
        for (size_t i = 0; i < all; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % V);
            tg[i] = (int32_t)((s >> 13) % V);
        }
        if (it == in->warmup) {
            rc = be->ops->sync(be);
            t0 = omp_get_wtime();
        }
        if (!rc) rc = one_step(m, opt, o, it + 1, ids, tg, n, accum, be, dred);
    }
    float red[2] = {0, 0};
    if (!rc) rc = be->ops->download(be, red, dred, sizeof red);
    if (!rc) rc = be->ops->sync(be);
    out->step_s = (omp_get_wtime() - t0) / in->steps;
    out->loss = red[1] / (double)all;
    if (!rc && in->profile > 0) rc = profile_steps(be, m, opt, o, in, dred, ids, tg, n, out);
    free(ids);
    free(tg);
    return rc;
}

int tks_step_bench(const tks_step_bench_opts *in, tks_step_bench_result *out) {
    memset(out, 0, sizeof *out);
    tks_model_config cfg = in->model;
    tks_model_config_defaults(&cfg);
    const tks_model_config *c = &cfg;
    if (in->B < 1 || in->T < 2 || (uint32_t)in->T > c->max_seq_len || in->steps < 1 || in->warmup < 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "need B >= 1, 2 <= T <= %u, STEPS >= 1, WARMUP >= 0", c->max_seq_len);
    tks_dtype dt = in->bf16 ? TKS_BF16 : TKS_F32;
    tks_backend *be = NULL;
    tks_model *m = NULL;
    tks_optim *opt = NULL;
    float *dred = NULL;
    tks_adamw_opts o = {.lr = 3e-4f, .min_lr = 3e-5f, .warmup = 10, .total = 1000, .beta1 = 0.9f,
                        .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    int rc = tks_backend_create(in->device, in->threads, &be);
    if (!rc) rc = tks_model_create_dt(c, be, NULL, in->B, in->T, 1, dt, &m);
    if (!rc) rc = tks_optim_create(m, &o, 0, tks_model_n_flat(m), &opt);
    if (!rc && !(dred = be->ops->alloc(be, TKS_MEM_STEP_SCALARS * sizeof *dred)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of device memory");
    if (!rc) {
        tks_model_init(m, 1);
        rc = run_steps(be, m, opt, &o, in, dred, out);
    }
    if (!rc) {
        const tks_backend_kind *k = be->kind;
        out->params = tks_model_n_params(c);
        snprintf(out->backend, sizeof out->backend, "%s", be->kind->name);
        if (k->describe) k->describe(be, out->device, sizeof out->device);
        if (k->attention_name) k->attention_name(be, dt, out->attention, sizeof out->attention);
        else snprintf(out->attention, sizeof out->attention, "tokshard kernel");
        size_t now_b = 0;
        if (k->memory) k->memory(be, &now_b, &out->peak_bytes);
        out->reserved_bytes = k->reserved ? k->reserved(be) : 0;
        /* the --dry-run plan of this run (one process) */
        tks_mem_plan plan;
        tks_mesh_shape one = {1, 1, 1};
        out->plan_bytes = tks_mem_plan_make(c, &one, in->B, in->T, dt, be, &plan) ? 0.0 : plan.total;
    }
    if (dred) be->ops->free(be, dred);
    tks_optim_free(opt);
    tks_model_free(m);
    if (be) be->ops->destroy(be);
    return rc;
}

/* fwd + bwd over every window, in batches of B, in seconds. t: q k v out dq
 * dk dv dout on the backend. */
static double attention_once(tks_backend *be, void *const *t, float *lse, const int32_t *doc,
                             const tks_attention_bench_opts *o) {
    size_t lq = (size_t)o->NH * o->HD, lk = (size_t)o->NKV * o->HD;
    double t0 = omp_get_wtime();
    for (int w = 0; w + o->B <= o->n_windows; w += o->B) {
        const int32_t *d = doc ? doc + (size_t)w * o->T : NULL;
        be->ops->attention_fwd(be, t[3], lq, lse, t[0], lq, t[1], t[2], lk, d, o->B, o->T, o->NH, o->NKV,
                               o->HD, TKS_F32);
        be->ops->attention_bwd(be, t[4], t[5], t[6], t[7], t[3], lq, lse, t[0], lq, t[1], t[2], lk, d,
                               o->B, o->T, o->NH, o->NKV, o->HD, TKS_F32);
    }
    be->ops->sync(be);
    return omp_get_wtime() - t0;
}

int tks_attention_bench(const tks_attention_bench_opts *o, tks_attention_bench_result *out) {
    memset(out, 0, sizeof *out);
    if (o->B < 1 || o->T < 2 || o->NH < 1 || o->NKV < 1 || o->NH % o->NKV || o->HD < 2 || o->reps < 1 ||
        o->n_windows < o->B || !o->doc)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "attention bench: B %d, T %d, NH %d, NKV %d, HD %d, reps %d, %d windows: give "
                        "positive sizes, NKV dividing NH, at least B windows and their documents",
                        o->B, o->T, o->NH, o->NKV, o->HD, o->reps, o->n_windows);
    tks_backend *be = NULL;
    int rc = tks_backend_create("cpu", o->threads, &be);
    if (rc) return rc;
    tks_ws_shape ws = {.B = o->B, .T = o->T, .C = o->NH * o->HD, .NH = o->NH, .NKV = o->NKV, .HD = o->HD,
                       .F = 64, .V = 64, .Tcache = o->T, .dt = TKS_F32};
    size_t wsb = be->ops->workspace_bytes(be, &ws), nq = (size_t)o->B * o->T * o->NH * o->HD,
           nk = (size_t)o->B * o->T * o->NKV * o->HD, ndoc = (size_t)o->n_windows * o->T;
    size_t n[8] = {nq, nk, nk, nq, nq, nk, nk, nq}; /* q k v out dq dk dv dout */
    void *t[8] = {0}, *wsp = be->ops->alloc(be, wsb);
    float *lse = be->ops->alloc(be, (size_t)o->B * o->NH * o->T * sizeof(float));
    int32_t *doc = be->ops->alloc(be, ndoc * sizeof *doc);
    float *h = malloc(nq * sizeof *h);
    uint64_t z = 12345;
    rc = wsp && lse && doc && h ? be->ops->set_workspace(be, wsp, wsb)
                                : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = be->ops->upload(be, doc, o->doc, ndoc * sizeof *doc);
    for (int i = 0; i < 8 && !rc; i++) { /* values in [-0.5, 0.5): the time does not depend on them */
        for (size_t j = 0; j < n[i]; j++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            h[j] = (float)((double)(z >> 11) / 9007199254740992.0 - 0.5);
        }
        if (!(t[i] = be->ops->alloc(be, n[i] * sizeof(float))))
            rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        else rc = be->ops->upload(be, t[i], h, n[i] * sizeof(float));
    }
    out->causal_s = out->doc_mask_s = INFINITY;
    if (!rc) attention_once(be, t, lse, NULL, o); /* warm up */
    for (int r = 0; r < o->reps && !rc; r++) { /* alternating: both see the same machine */
        double a = attention_once(be, t, lse, NULL, o), b = attention_once(be, t, lse, doc, o);
        if (a < out->causal_s) out->causal_s = a;
        if (b < out->doc_mask_s) out->doc_mask_s = b;
    }
    if (!rc) rc = be->ops->sync(be);
    int64_t kept = 0, all = 0;
    for (size_t i = 0; i < ndoc; i++) {
        int tt = (int)(i % (size_t)o->T);
        kept += tt - o->doc[i] + 1, all += tt + 1;
    }
    out->pairs_kept = all ? (double)kept / (double)all : 0;
    for (int i = 0; i < 8; i++) if (t[i]) be->ops->free(be, t[i]);
    if (lse) be->ops->free(be, lse);
    if (doc) be->ops->free(be, doc);
    if (wsp) be->ops->set_workspace(be, NULL, 0), be->ops->free(be, wsp);
    be->ops->destroy(be);
    free(h);
    return rc;
}
