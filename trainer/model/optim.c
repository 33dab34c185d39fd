/* optim.c - AdamW over a slice of the flat parameter buffer; schedule; clipping. */
#include "trainer/model/optim.h"

#include <math.h>
#include <stdlib.h>

#include "common/tks.h"

struct tks_optim {
    tks_model *m;
    tks_adamw_opts o;
    size_t begin, end;
    float *mom1, *mom2; /* device, end - begin elements */
    /* each parameter tensor's intersection with the slice, with its decay;
     * alignment gaps between tensors hold zeros and are left alone */
    tks_span *spans, *norm_spans; /* norm_spans: without the tp-replicated tensors */
    size_t n_spans, n_norm_spans;
};

int tks_optim_create(tks_model *m, const tks_adamw_opts *o, size_t begin, size_t end,
                     tks_optim **out) {
    *out = NULL;
    if (begin > end || end > tks_model_n_flat(m))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "optimizer slice [%zu, %zu) of %zu",
                        begin, end, tks_model_n_flat(m));
    tks_optim *op = calloc(1, sizeof *op);
    if (!op) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    op->m = m;
    op->o = *o;
    op->begin = begin;
    op->end = end;
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    op->spans = calloc(np ? np : 1, sizeof *op->spans);
    op->norm_spans = calloc(np ? np : 1, sizeof *op->norm_spans);
    if (!op->spans || !op->norm_spans) {
        tks_optim_free(op);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    for (size_t i = 0; i < np; i++) {
        size_t a = P[i].offset, b = a + P[i].lrows * P[i].lcols;
        if (a < begin) a = begin;
        if (b > end) b = end;
        if (a >= b) continue;
        tks_span sp = {a, b - a, P[i].decay ? o->weight_decay : 0.0f};
        op->spans[op->n_spans++] = sp;
        if (P[i].split != TKS_TP_REPLICATED) op->norm_spans[op->n_norm_spans++] = sp;
    }
    tks_backend *be = tks_model_backend(m);
    size_t n = end - begin ? end - begin : 1;
    op->mom1 = be->ops->alloc(be, n * sizeof(float));
    op->mom2 = be->ops->alloc(be, n * sizeof(float));
    if (!op->mom1 || !op->mom2) {
        tks_optim_free(op);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (AdamW moments)");
    }
    *out = op;
    return 0;
}

void tks_optim_free(tks_optim *op) {
    if (!op) return;
    tks_backend *be = tks_model_backend(op->m);
    if (op->mom1) be->ops->free(be, op->mom1);
    if (op->mom2) be->ops->free(be, op->mom2);
    free(op->spans);
    free(op->norm_spans);
    free(op);
}

float tks_lr_at(const tks_adamw_opts *o, uint64_t s) {
    if (o->warmup && s < o->warmup) return o->lr * (float)(s + 1) / (float)o->warmup;
    if (s >= o->total || o->total <= o->warmup) return o->min_lr;
    double p = (double)(s - o->warmup) / (double)(o->total - o->warmup);
    return (float)(o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(3.14159265358979323846 * p)));
}

float tks_clip_scale(const tks_adamw_opts *o, double norm) {
    if (o->grad_clip <= 0 || !(norm > o->grad_clip)) return 1.0f;
    return (float)(o->grad_clip / norm);
}

static int step(tks_optim *op, int64_t t, float lr, float grad_scale, const float *gnorm_sq) {
    tks_model *m = op->m;
    tks_backend *be = tks_model_backend(m);
    tks_adamw_hp hp = {.lr = lr, .b1 = op->o.beta1, .b2 = op->o.beta2, .eps = op->o.eps, .t = t,
                       .clip = op->o.grad_clip};
    return be->ops->adamw(be, tks_model_weights(m), tks_model_grads(m), op->mom1, op->mom2, op->begin,
                     op->spans, op->n_spans, &hp, grad_scale, gnorm_sq,
                     tks_model_compute_weights(m), tks_model_dtype(m));
}

int tks_optim_step(tks_optim *op, int64_t t, float lr, float grad_scale) {
    return step(op, t, lr, grad_scale, NULL);
}

int tks_optim_step_dev(tks_optim *op, int64_t t, float lr, const float *gnorm_sq) {
    return step(op, t, lr, 1.0f, gnorm_sq);
}

int tks_optim_grad_sumsq(tks_optim *op, float *out, int count_replicated) {
    tks_backend *be = tks_model_backend(op->m);
    return count_replicated
               ? be->ops->sumsq(be, out, tks_model_grads(op->m), op->spans, op->n_spans, 0)
               : be->ops->sumsq(be, out, tks_model_grads(op->m), op->norm_spans, op->n_norm_spans, 0);
}

float *tks_optim_m(tks_optim *op) { return op->mom1; }
float *tks_optim_v(tks_optim *op) { return op->mom2; }
size_t tks_optim_begin(const tks_optim *op) { return op->begin; }
size_t tks_optim_end(const tks_optim *op) { return op->end; }
