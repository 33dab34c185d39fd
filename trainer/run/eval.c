/* eval.c - evaluation on the validation windows of every source. */
#include <math.h>

#include "trainer/run/run.h"

/* The phase weights in force after `cursor` samples (the phase of the last
 * sample trained; the first phase before any), as fractions. */
static void weights_at(const run *r, uint64_t cursor, double *w) {
    uint32_t p = 0;
    while (p + 1 < r->blend.n_phases && r->blend.start[p + 1] < (cursor ? cursor : 1)) p++;
    for (uint32_t k = 0; k < r->n_src; k++) w[k] = (double)r->blend.W[p][k] / (double)r->blend.S[p];
}

/*
 * Validation loss: per source, the first eval_batches global batches of its
 * validation sampler (the same windows at every evaluation), split over the
 * data-parallel ranks like training batches; by_source[k] its mean token
 * loss (NAN without a validation window). Returns a plain run's loss, or a
 * mixture's mean of the sources' losses weighted by the weights in force
 * after `cursor` samples. doc: document starts scratch ([micro, seq_len]) or
 * NULL without documents. Collective.
 */
double tks__run_evaluate(run *r, tks_model *m, tks_mesh *mesh, uint64_t cursor, uint32_t *tok,
                         int32_t *ids, int32_t *tg, int32_t *doc, double *by_source, int *rc) {
    float acc[2 * TKS_MIX_MAX_SOURCES] = {0}; /* per source: loss sum, tokens */
    const uint64_t per = r->micro * (uint64_t)mesh->dp, T = r->o.seq_len;
    for (uint32_t k = 0; k < r->n_src && !*rc; k++) {
        tks_sampler *val = r->src[k].val;
        uint64_t nw = val ? tks_sampler_n_windows(val) : 0, total = r->o.eval_batches * r->o.global_batch;
        if (total > nw) total = nw;
        total -= total % per; /* whole rounds of every dp rank's micro-batch */
        for (uint64_t g = 0; g < total && !*rc; g += per) {
            double ls = 0;
            uint64_t first = g + (uint64_t)mesh->dp_rank * r->micro;
            for (uint64_t i = 0; i < r->micro && !*rc; i++)
                *rc = tks_sampler_load_row(val, first + i, r->cfg.vocab_size, tok, ids, tg, doc, i);
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
