/* memplan.c - the per-rank device memory plan (memplan.h). */
#include "trainer/perf/memplan.h"

#include <stdio.h>
#include <string.h>

#include "common/tks.h"

const char *tks_mem_part_name(int part) {
    static const char *n[] = {"fp32 master weights", "bf16 compute copy", "gradients",
                              "AdamW moments", "gradient staging", "activations", "backend buffers"};
    return part >= 0 && part < TKS_MEM_N ? n[part] : "?";
}

size_t tks_mem_grad_stage_elems(const tks_mesh_shape *s, size_t n_flat) {
    return s->dp_shard > 1 ? n_flat : 0;
}

int tks_mem_plan_make(const tks_model_config *cfg, const tks_mesh_shape *s, int B, int T,
                      tks_dtype dt, tks_backend *be, tks_mem_plan *out) {
    memset(out, 0, sizeof *out);
    size_t S = (size_t)s->dp_shard, n = tks_model_flat_elems(cfg, s->tp, S);
    if (!n) {
        tks_model_config c = *cfg;
        tks_model_config_defaults(&c);
        int rc = tks_model_config_check(&c, s->tp);
        return rc ? rc : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    double e = (double)tks_dtype_size(dt), ns = (double)(n / S);
    out->n_flat = n;
    out->n_slice = n / S;
    /* tks_model_create_dt: w, g (fp32, n_flat), wc (dt, n_flat) when dt is not fp32 */
    out->bytes[TKS_MEM_WEIGHTS] = 4.0 * (double)n;
    out->bytes[TKS_MEM_COMPUTE] = dt == TKS_F32 ? 0.0 : e * (double)n;
    out->bytes[TKS_MEM_GRADS] = 4.0 * (double)n;
    /* tks_optim_create: mom1, mom2 over this rank's slice */
    out->bytes[TKS_MEM_MOMENTS] = 8.0 * ns;
    /* tks_train: the reduce-scatter's staging buffer and the step's scalars */
    out->bytes[TKS_MEM_GRAD_STAGE] =
        4.0 * (double)tks_mem_grad_stage_elems(s, n) + 4.0 * TKS_MEM_STEP_SCALARS;
    out->bytes[TKS_MEM_ACTIVATIONS] = (double)tks_model_activation_bytes(cfg, s->tp, B, T, dt, be);
    out->bytes[TKS_MEM_BACKEND] = be && be->kind && be->kind->reserved ? (double)be->kind->reserved(be) : 0.0;
    for (int k = 0; k < TKS_MEM_N; k++) out->total += out->bytes[k];
    return 0;
}

void tks_mem_plan_format(const tks_mem_plan *p, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (int k = 0; k < TKS_MEM_N && o < cap; k++) {
        if (p->bytes[k] <= 0) continue;
        int w = snprintf(out + o, cap - o, "%s%s %.1f MiB", o ? ", " : "", tks_mem_part_name(k),
                         p->bytes[k] / 1048576.0);
        if (w < 0) return;
        o += (size_t)w;
    }
    if (o < cap) snprintf(out + o, cap - o, "; total %.1f MiB", p->total / 1048576.0);
}

int tks_mem_explain_nomem(const tks_model_config *cfg, const tks_mesh_shape *s, int B, int T,
                          tks_dtype dt, tks_backend *be) {
    char orig[sizeof tks_last_error()->message];
    snprintf(orig, sizeof orig, "%s", tks_last_error()->message);
    tks_mem_plan p;
    if (tks_mem_plan_make(cfg, s, B, T, dt, be, &p))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "%s", orig);
    /* the two largest parts, each with what shrinks it */
    int big[2] = {-1, -1};
    for (int k = 0; k < TKS_MEM_N; k++) {
        if (big[0] < 0 || p.bytes[k] > p.bytes[big[0]]) big[1] = big[0], big[0] = k;
        else if (big[1] < 0 || p.bytes[k] > p.bytes[big[1]]) big[1] = k;
    }
    char fix[2][120];
    for (int i = 0; i < 2; i++) {
        switch (big[i]) {
        case TKS_MEM_ACTIVATIONS:
            snprintf(fix[i], sizeof fix[i], "lower --micro-batch %d or --seq-len %d%s", B, T,
                     dt == TKS_F32 ? ", or --dtype bf16" : "");
            break;
        case TKS_MEM_MOMENTS: snprintf(fix[i], sizeof fix[i], "raise --dp-shard %d", s->dp_shard); break;
        case TKS_MEM_GRAD_STAGE: /* the whole tp-local flat buffer: only tp divides it */
            snprintf(fix[i], sizeof fix[i], "raise --tp %d, or --dp-shard 1 with --dp-replicate", s->tp);
            break;
        default: snprintf(fix[i], sizeof fix[i], "raise --tp %d or use a smaller model", s->tp);
        }
    }
    /* the message holds 512 bytes: the plan first, the failing call's own words after */
    return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                    "out of device memory: a rank needs about %.0f MiB (--dry-run shows the plan); "
                    "largest: %s %.0f MiB (%s), %s %.0f MiB (%s). %s",
                    p.total / 1048576.0, tks_mem_part_name(big[0]), p.bytes[big[0]] / 1048576.0,
                    fix[0], tks_mem_part_name(big[1]), p.bytes[big[1]] / 1048576.0, fix[1], orig);
}
