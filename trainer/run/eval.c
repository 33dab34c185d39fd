/* eval.c - evaluation on the validation windows of every source: during
 * training (tks__run_evaluate) and of a checkpoint alone (tks_train_eval). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/run/run.h"

/* The phase weights in force after `cursor` samples (the phase of the last
 * sample trained; the first phase before any), as fractions. */
static void weights_at(const run *r, uint64_t cursor, double *w) {
    uint32_t p = 0;
    while (p + 1 < r->blend.n_phases && r->blend.start[p + 1] < (cursor ? cursor : 1)) p++;
    for (uint32_t k = 0; k < r->n_src; k++) w[k] = (double)r->blend.W[p][k] / (double)r->blend.S[p];
}

/* Window j (< total) of the `total` an evaluation reads from a validation
 * split of nw >= total windows: floor(j nw / total), spread evenly over the
 * split (all of them, in order, when total == nw). Not its first `total`: a
 * best-fit plan numbers its windows in the order best-fit decreasing opened
 * them, so its first ones hold the longest documents alone (at seq_len 128
 * on the main job's data the first 64 are full windows of long entries,
 * whose loss is 0.3 nats above the split's; docs/BENCHMARKS.md, "Sampler:
 * best-fit packing"); a concat split's first windows are one stretch of
 * its text. */
static uint64_t spread(uint64_t j, uint64_t total, uint64_t nw) {
    return (uint64_t)((unsigned __int128)j * nw / total);
}

/*
 * Validation loss: per source, eval_batches global batches of windows spread
 * evenly over its validation sampler's (spread(); the same windows at every
 * evaluation), split over the
 * data-parallel ranks like training batches; by_source[k] its mean token
 * loss (NAN without a validation window). Returns a plain run's loss, or a
 * mixture's mean of the sources' losses weighted by the weights in force
 * after `cursor` samples. doc: document starts scratch ([micro, seq_len]) or
 * NULL without documents. Collective.
 */
double tks__run_evaluate(run *r, tks_model *m, tks_mesh *mesh, uint64_t cursor, uint32_t *tok,
                         int32_t *ids, int32_t *tg, int32_t *doc, double *by_source, uint64_t *counts,
                         int *rc) {
    float acc[2 * TKS_MIX_MAX_SOURCES] = {0}; /* per source: loss sum, tokens */
    const uint64_t per = r->micro * (uint64_t)mesh->dp, T = r->o.seq_len;
    for (uint32_t k = 0; k < r->n_src && !*rc; k++) {
        tks_sampler *val = r->src[k].val;
        uint64_t nw = val ? tks_sampler_n_windows(val) : 0, total = r->o.eval_batches * r->o.global_batch;
        if (total > nw) total = nw;
        total -= total % per; /* whole rounds of every dp rank's micro-batch */
        if (counts) counts[2 * k] = total;
        for (uint64_t g = 0; g < total && !*rc; g += per) {
            double ls = 0;
            uint64_t first = g + (uint64_t)mesh->dp_rank * r->micro;
            for (uint64_t i = 0; i < r->micro && !*rc; i++)
                *rc = tks_sampler_load_row(val, spread(first + i, total, nw), r->cfg.vocab_size, tok, ids, tg,
                                           doc, i);
            *rc = tks_mesh_agree(mesh, *rc);
            if (!*rc && doc) *rc = tks_model_set_documents(m, doc, r->o.doc_mask, r->o.reset_positions);
            if (!*rc) *rc = tks_model_forward(m, ids, tg, &ls);
            uint64_t n = 0; /* targets: a packed window's padding has none */
            for (uint64_t i = 0; i < r->micro * T; i++) n += tg[i] >= 0;
            acc[2 * k] += (float)ls;
            acc[2 * k + 1] += (float)n;
        }
    }
    if (!*rc && mesh->dp > 1) /* host data */
        *rc = tks_comm_host_sum(mesh->group[TKS_GROUP_DP], acc, 2 * (size_t)r->n_src);
    double w[TKS_MIX_MAX_SOURCES], num = 0, den = 0;
    weights_at(r, cursor, w);
    for (uint32_t k = 0; k < r->n_src; k++) {
        by_source[k] = acc[2 * k + 1] > 0 ? acc[2 * k] / acc[2 * k + 1] : NAN;
        if (counts) counts[2 * k + 1] = (uint64_t)acc[2 * k + 1];
        if (isfinite(by_source[k]) && w[k] > 0) num += w[k] * by_source[k], den += w[k];
    }
    if (!r->mixed) return by_source[0];
    return den > 0 ? num / den : NAN;
}

/* 1 when some source holds validation windows. */
int tks__run_has_validation(const run *r) {
    for (uint32_t k = 0; k < r->n_src; k++)
        if (r->src[k].val) return 1;
    return 0;
}

/* What tks_train_eval holds: the resolved run, mesh, backend, model and the
 * evaluation's scratch ([micro, seq_len]; doc NULL without documents). */
typedef struct evaluator {
    run r;
    tks_mesh *mesh;
    tks_backend *be;
    tks_model *m;
    uint32_t *tok;
    int32_t *ids, *tg, *doc;
} evaluator;

/* The mesh, the backend, the model with the checkpoint's weights (no
 * optimizer state) and the scratch, for the resolved run e->r. */
static int open_model(evaluator *e) {
    const tks_train_opts *o = &e->r.o;
    int rc = tks_mesh_create(&e->r.shape, &e->mesh);
    if (rc) return rc;
    rc = tks_backend_create(o->device, o->threads, &e->be);
    if (!rc) rc = tks__run_use_deterministic(o, e->be);
    rc = tks_mesh_use_backend(e->mesh, e->be, o->comm, rc);
    if (!rc)
        rc = tks_model_create_dt(&e->r.cfg, e->be, e->mesh->group[TKS_GROUP_TP], (int)e->r.micro, (int)o->seq_len,
                                 (size_t)e->mesh->shape.dp_shard, e->r.dtype, &e->m);
    if (!rc) rc = tks_checkpoint_load(o->resume, e->m, NULL);
    if (!rc) rc = tks_model_refresh_compute(e->m);
    size_t N = (size_t)(e->r.micro * o->seq_len);
    int docs = o->doc_mask || o->reset_positions;
    e->tok = malloc((o->seq_len + 1) * sizeof *e->tok);
    e->ids = malloc(N * sizeof *e->ids);
    e->tg = malloc(N * sizeof *e->tg);
    if (docs) e->doc = malloc(N * sizeof *e->doc);
    if (!rc && (!e->tok || !e->ids || !e->tg || (docs && !e->doc)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    return tks_mesh_agree(e->mesh, rc);
}

static void close_evaluator(evaluator *e) {
    free(e->tok);
    free(e->ids);
    free(e->tg);
    free(e->doc);
    tks_model_free(e->m);
    tks_mesh_free(e->mesh); /* its device groups before the backend they run on */
    if (e->be) e->be->ops->destroy(e->be);
    tks__run_free(&e->r);
}

int tks_train_eval(const tks_train_opts *o, tks_eval_result *out) {
    if (!o || !out) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_train_eval: NULL argument");
    memset(out, 0, sizeof *out);
    if (!o->resume)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--eval-only needs the checkpoint to evaluate: --resume CHECKPOINT (or latest with --out)");
    evaluator *e = calloc(1, sizeof *e);
    if (!e) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    /* as a training run opens: every rank resolves, then they agree */
    int rc = tks_mesh_world_agree(tks__run_resolve(o, 1, &e->r));
    if (!rc) rc = tks__run_same(&e->r);
    if (!rc) rc = tks_mesh_world_agree(tks__run_plans(&e->r));
    if (!rc) rc = open_model(e);
    run *r = &e->r;
    uint64_t counts[2 * TKS_MIX_MAX_SOURCES] = {0};
    if (!rc)
        out->val_loss = tks__run_evaluate(r, e->m, e->mesh, r->resumed.cursor, e->tok, e->ids, e->tg, e->doc,
                                          out->by_source, counts, &rc);
    if (!rc) {
        out->step = r->resumed.step;
        out->n_sources = r->n_src;
        out->packing = tks__run_packing(&r->o);
        out->seq_len = r->o.seq_len;
        for (uint32_t k = 0; k < r->n_src; k++) {
            snprintf(out->names[k], sizeof out->names[k], "%s", r->src[k].name);
            out->windows[k] = counts[2 * k];
            out->targets[k] = counts[2 * k + 1];
            out->val_windows[k] = r->src[k].val ? tks_sampler_n_windows(r->src[k].val) : 0;
        }
    }
    close_evaluator(e);
    free(e);
    return rc;
}
