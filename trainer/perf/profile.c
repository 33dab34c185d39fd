/* profile.c - per-op timing of a backend (tokshard-train --profile N):
 * every compute and transfer op of backend.h goes through a wrapper that
 * puts a pair of timer marks around it (backend.h, the kind's timer: on the
 * CPU the host clock, its ops having run when they return; on CUDA events
 * recorded on the stream, so the profiled steps run as unprofiled ones do,
 * nothing waiting between ops). The marks' times are read once per profiled
 * step (tks_profile_count(0) at the step's end), or when TIMER_PAIRS calls
 * are pending within a step. A kind without a timer is timed with the host
 * clock between two syncs (each op's time is then its own, but the profiled
 * steps run serialized). Each call is also priced by its op's cost function
 * (stepmodel.c: FLOPs, bytes, and with a roofline its predicted time). One
 * profiled backend per process at a time. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/perf/profile.h"
#include "trainer/perf/stepmodel.h"

enum { TIMER_PAIRS = 8192 }; /* timed calls read at once (3430 in a step of the 1B model) */

static struct {
    const tks_backend_ops *ops; /* the backend's own table */
    tks_backend_ops table;      /* the wrappers, and the backend's own ops for the rest */
    tks_backend *be;
    const tks_backend_kind *kind;
    tks_timer *timer;           /* the kind's timer; NULL: host clock between syncs */
    int pend[TIMER_PAIRS];      /* the op of each pending pair of marks */
    double pend_secs[TIMER_PAIRS];
    size_t npend;
    int device;                 /* not the CPU: sync around each op when there is no timer */
    int on;                     /* counting */
    int priced;                 /* hw is set: each call is priced on it */
    tks_roofline hw;
    uint64_t calls[TKS_N_OPS];
    double secs[TKS_N_OPS], flops[TKS_N_OPS], bytes[TKS_N_OPS], model[TKS_N_OPS];
} prof;

/* The pending pairs' times into their ops' totals (waits for the marks). */
static void flush(void) {
    if (!prof.timer || !prof.npend) return;
    if (prof.kind->timer_read(prof.be, prof.timer, 2 * prof.npend, prof.pend_secs) == 0)
        for (size_t k = 0; k < prof.npend; k++) prof.secs[prof.pend[k]] += prof.pend_secs[k];
    /* a failed read is the backend's sticky error: the run reports it */
    prof.npend = 0;
}

static double tic(tks_backend *be) {
    if (!prof.on) return 0;
    if (prof.timer) {
        prof.kind->timer_mark(be, prof.timer, 2 * prof.npend);
        return 0;
    }
    if (prof.device) prof.ops->sync(be);
    return omp_get_wtime();
}

/* the call of op that started at t0 (host clock) and cost c ended with rc */
static int toc(tks_backend *be, int op, double t0, tks_cost c, int rc) {
    if (!prof.on) return rc;
    if (prof.timer) {
        prof.kind->timer_mark(be, prof.timer, 2 * prof.npend + 1);
        prof.pend[prof.npend++] = op;
        if (prof.npend == TIMER_PAIRS) flush();
    } else {
        if (prof.device) prof.ops->sync(be);
        prof.secs[op] += omp_get_wtime() - t0;
    }
    prof.calls[op]++;
    prof.flops[op] += c.flops;
    prof.bytes[op] += c.bytes + c.link_bytes;
    if (prof.priced) prof.model[op] += tks_cost_secs(&c, &prof.hw);
    return rc;
}
static size_t span_elems(const tks_span *s, size_t n) {
    size_t e = 0;
    for (size_t i = 0; i < n; i++) e += s[i].n;
    return e;
}
#define ES(dt) tks_dtype_size(dt)
#define ROWS(op, n, c, es) tks_cost_rows(op, (double)(n), (double)(c), es)

static int p_upload(tks_backend *be, void *dst, const void *src_host, size_t bytes) {
    double t0 = tic(be);
    return toc(be, TKS_OP_UPLOAD, t0, tks_cost_link((double)bytes), prof.ops->upload(be, dst, src_host, bytes));
}

static int p_download(tks_backend *be, void *dst_host, const void *src, size_t bytes) {
    double t0 = tic(be);
    return toc(be, TKS_OP_DOWNLOAD, t0, tks_cost_link((double)bytes), prof.ops->download(be, dst_host, src, bytes));
}

static int p_memzero(tks_backend *be, void *p, size_t bytes) {
    double t0 = tic(be);
    return toc(be, TKS_OP_MEMZERO, t0, ROWS(TKS_OP_MEMZERO, bytes, 1, 1), prof.ops->memzero(be, p, bytes));
}

static int p_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    double t0 = tic(be);
    return toc(be, TKS_OP_COPY, t0, ROWS(TKS_OP_COPY, bytes, 1, 1), prof.ops->copy(be, dst, src, bytes));
}

static int p_gemm(tks_backend *be, const tks_gemm_args *g) {
    double t0 = tic(be);
    return toc(be, TKS_OP_GEMM, t0, tks_cost_gemm(g), prof.ops->gemm(be, g));
}

static int p_convert(tks_backend *be, void *dst, tks_dtype dst_dt, const void *src, tks_dtype src_dt, size_t n) {
    double t0 = tic(be);
    return toc(be, TKS_OP_CONVERT, t0, (tks_cost){.bytes = (double)n * (double)(ES(dst_dt) + ES(src_dt))}, prof.ops->convert(be, dst, dst_dt, src, src_dt, n));
}

static int p_add(tks_backend *be, void *out, const void *a, const void *b, size_t n, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ADD, t0, ROWS(TKS_OP_ADD, n, 1, ES(dt)), prof.ops->add(be, out, a, b, n, dt));
}

static int p_scale(tks_backend *be, float *x, size_t n, float s) {
    double t0 = tic(be);
    return toc(be, TKS_OP_SCALE, t0, ROWS(TKS_OP_SCALE, n, 1, 4), prof.ops->scale(be, x, n, s));
}

static int p_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans, size_t nspans, int accumulate) {
    double t0 = tic(be);
    return toc(be, TKS_OP_SUMSQ, t0, ROWS(TKS_OP_SUMSQ, span_elems(spans, nspans), 1, 4), prof.ops->sumsq(be, out, x, spans, nspans, accumulate));
}

static int p_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    double t0 = tic(be);
    return toc(be, TKS_OP_SUM, t0, ROWS(TKS_OP_SUM, n, 1, 4), prof.ops->sum(be, out, x, n, accumulate));
}

static int p_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N, int C, int64_t v0, int V, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_EMBEDDING_FWD, t0, ROWS(TKS_OP_EMBEDDING_FWD, N, C, ES(dt)), prof.ops->embedding_fwd(be, out, ids, w, N, C, v0, V, dt));
}

static int p_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N, int C, int64_t v0, int V, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_EMBEDDING_BWD, t0, ROWS(TKS_OP_EMBEDDING_BWD, N, C, ES(dt)), prof.ops->embedding_bwd(be, dw, dout, ids, N, C, v0, V, dt));
}

static int p_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_RMSNORM_FWD, t0, ROWS(TKS_OP_RMSNORM_FWD, N, C, ES(dt)), prof.ops->rmsnorm_fwd(be, out, rstd, x, w, N, C, eps, dt));
}

static int p_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_RMSNORM_BWD, t0, ROWS(TKS_OP_RMSNORM_BWD, N, C, ES(dt)), prof.ops->rmsnorm_bwd(be, dx, dw, dout, x, w, rstd, N, C, dt));
}

static int p_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a, const void *b, const void *w, int N, int C, float eps, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ADD_RMSNORM_FWD, t0, ROWS(TKS_OP_ADD_RMSNORM_FWD, N, C, ES(dt)), prof.ops->add_rmsnorm_fwd(be, res, out, rstd, a, b, w, N, C, eps, dt));
}

static int p_rope(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0, const int32_t *pos, float theta, int inverse, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ROPE, t0, ROWS(TKS_OP_ROPE, (size_t)B * T, (size_t)H * HD, ES(dt)), prof.ops->rope(be, x, ld, B, T, H, HD, p0, pos, theta, inverse, dt));
}

static int p_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q, size_t ldq, const void *k, const void *v, size_t ldkv, const int32_t *doc, int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ATTENTION_FWD, t0, tks_cost_attention(B, T, NH, NKV, HD, ES(dt), 0), prof.ops->attention_fwd(be, out, ldo, lse, q, ldq, k, v, ldkv, doc, B, T, NH, NKV, HD, dt));
}

static int p_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout, const void *out, size_t ldo, const float *lse, const void *q, size_t ldq, const void *k, const void *v, size_t ldkv, const int32_t *doc, int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ATTENTION_BWD, t0, tks_cost_attention(B, T, NH, NKV, HD, ES(dt), 1), prof.ops->attention_bwd(be, dq, dk, dv, dout, out, ldo, lse, q, ldq, k, v, ldkv, doc, B, T, NH, NKV, HD, dt));
}

static int p_attention_step(tks_backend *be, void *out, const void *q, const void *kc, const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ATTENTION_STEP, t0, (tks_cost){.bytes = (double)ES(dt) * HD * (2.0 * (t + 1) * NKV + 2.0 * NH)}, prof.ops->attention_step(be, out, q, kc, vc, t, NH, NKV, HD, dt));
}

static int p_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_SWIGLU_FWD, t0, ROWS(TKS_OP_SWIGLU_FWD, M, F, ES(dt)), prof.ops->swiglu_fwd(be, out, gu, M, F, dt));
}

static int p_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_SWIGLU_BWD, t0, ROWS(TKS_OP_SWIGLU_BWD, M, F, ES(dt)), prof.ops->swiglu_bwd(be, dgu, dout, gu, M, F, dt));
}

static int p_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N, int V, int VR, float scale, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_FUSED, t0, ROWS(TKS_OP_XENT_FUSED, N, V, ES(dt)), prof.ops->xent_fused(be, loss, logits, targets, N, V, VR, scale, dt));
}

static int p_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_MAX, t0, ROWS(TKS_OP_XENT_MAX, N, V, ES(dt)), prof.ops->xent_max(be, mx, logits, N, V, VR, dt));
}

static int p_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N, int V, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_SUMEXP, t0, ROWS(TKS_OP_XENT_SUMEXP, N, V, ES(dt)), prof.ops->xent_sumexp(be, sum, logits, mx, N, V, VR, dt));
}

static int p_xent_target(tks_backend *be, float *tgt, const void *logits, const int32_t *targets, int N, int V, int64_t v0, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_TARGET, t0, ROWS(TKS_OP_XENT_TARGET, N, V, ES(dt)), prof.ops->xent_target(be, tgt, logits, targets, N, V, v0, VR, dt));
}

static int p_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_LOSS, t0, ROWS(TKS_OP_XENT_LOSS, N, 1, 4), prof.ops->xent_loss(be, loss, mx, sum, tgt, N));
}

static int p_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx, const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR, float scale, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_XENT_BWD, t0, ROWS(TKS_OP_XENT_BWD, N, V, ES(dt)), prof.ops->xent_bwd(be, dlogits, logits, mx, sum, targets, N, V, v0, VR, scale, dt));
}

static int p_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base, const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale, const float *gnorm_sq, void *pc, tks_dtype pc_dt) {
    double t0 = tic(be);
    return toc(be, TKS_OP_ADAMW, t0, tks_cost_adamw((double)span_elems(spans, nspans), pc ? ES(pc_dt) : 0), prof.ops->adamw(be, p, grad, m, v, base, spans, nspans, hp, grad_scale, gnorm_sq, pc, pc_dt));
}

int tks_profile_attach(tks_backend *be, const tks_roofline *hw) {
    if (prof.ops)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--profile: a backend is already profiled in this process");
    memset(&prof, 0, sizeof prof);
    const tks_backend_kind *k = be->kind;
    if (k->timer_create && k->timer_mark && k->timer_read && k->timer_destroy) {
        int rc = k->timer_create(be, 2 * (size_t)TIMER_PAIRS, &prof.timer);
        if (rc) return rc;
    }
    prof.be = be;
    prof.kind = k;
    prof.ops = be->ops;
    prof.table = *be->ops;
    prof.table.upload = p_upload;
    prof.table.download = p_download;
    prof.table.memzero = p_memzero;
    prof.table.copy = p_copy;
    prof.table.gemm = p_gemm;
    prof.table.convert = p_convert;
    prof.table.add = p_add;
    prof.table.scale = p_scale;
    prof.table.sumsq = p_sumsq;
    prof.table.sum = p_sum;
    prof.table.embedding_fwd = p_embedding_fwd;
    prof.table.embedding_bwd = p_embedding_bwd;
    prof.table.rmsnorm_fwd = p_rmsnorm_fwd;
    prof.table.rmsnorm_bwd = p_rmsnorm_bwd;
    prof.table.add_rmsnorm_fwd = p_add_rmsnorm_fwd;
    prof.table.rope = p_rope;
    prof.table.attention_fwd = p_attention_fwd;
    prof.table.attention_bwd = p_attention_bwd;
    prof.table.attention_step = p_attention_step;
    prof.table.swiglu_fwd = p_swiglu_fwd;
    prof.table.swiglu_bwd = p_swiglu_bwd;
    prof.table.xent_fused = p_xent_fused;
    prof.table.xent_max = p_xent_max;
    prof.table.xent_sumexp = p_xent_sumexp;
    prof.table.xent_target = p_xent_target;
    prof.table.xent_loss = p_xent_loss;
    prof.table.xent_bwd = p_xent_bwd;
    prof.table.adamw = p_adamw;
    prof.device = be->kind != &tks_cpu_backend_kind;
    if (hw) prof.priced = 1, prof.hw = *hw;
    be->ops = &prof.table;
    return 0;
}

void tks_profile_detach(tks_backend *be) {
    if (!be || be->ops != &prof.table) return;
    prof.npend = 0; /* not reported: only a report reads them */
    if (prof.timer) prof.kind->timer_destroy(be, prof.timer);
    prof.timer = NULL;
    be->ops = prof.ops;
    prof.ops = NULL;
    prof.on = 0;
}

void tks_profile_count(int on) {
    if (!on && prof.on) flush(); /* the end of a profiled step */
    prof.on = on;
}

static int by_time_desc(const void *a, const void *b) {
    double x = prof.secs[*(const int *)a], y = prof.secs[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

char *tks_profile_report(uint64_t steps) {
    flush();
    double total = 0, model = 0, per = 1.0 / (double)(steps ? steps : 1);
    int order[TKS_N_OPS], n = 0;
    for (int i = 0; i < TKS_N_OPS; i++) {
        total += prof.secs[i], model += prof.model[i];
        if (prof.calls[i]) order[n++] = i;
    }
    qsort(order, (size_t)n, sizeof *order, by_time_desc);
    size_t cap = 1024 + (size_t)n * 160;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = (size_t)snprintf(out, cap, "%-16s %8s %10s %10s %7s %14s", "op", "calls", "total ms",
                                "ms/step", "share", "achieved");
    if (prof.priced) o += (size_t)snprintf(out + o, cap - o, " %10s %9s", "model ms", "measured/model");
    o += (size_t)snprintf(out + o, cap - o, "\n");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        char rate[32] = "-";
        double s = prof.secs[i];
        if (s > 0 && prof.flops[i] > 0) snprintf(rate, sizeof rate, "%.4g TFLOP/s", prof.flops[i] / s / 1e12);
        else if (s > 0 && prof.bytes[i] > 0) snprintf(rate, sizeof rate, "%.4g GB/s", prof.bytes[i] / s / 1e9);
        o += (size_t)snprintf(out + o, cap - o, "%-16s %8llu %10.3f %10.3f %6.1f%% %14s", tks_op_names[i],
                              (unsigned long long)prof.calls[i], 1e3 * s, 1e3 * s * per,
                              total > 0 ? 100.0 * s / total : 0.0, rate);
        if (prof.priced)
            o += (size_t)snprintf(out + o, cap - o, " %10.3f %9.2f", 1e3 * prof.model[i],
                                  prof.model[i] > 0 ? s / prof.model[i] : 0.0);
        o += (size_t)snprintf(out + o, cap - o, "\n");
    }
    o += (size_t)snprintf(out + o, cap - o, "%-16s %8s %10.3f %10.3f %6.1f%% %14s", "all ops", "", 1e3 * total,
                          1e3 * total * per, total > 0 ? 100.0 : 0.0, "");
    if (prof.priced)
        o += (size_t)snprintf(out + o, cap - o, " %10.3f %9.2f", 1e3 * model, model > 0 ? total / model : 0.0);
    o += (size_t)snprintf(out + o, cap - o, "\n");
    if (prof.priced)
        snprintf(out + o, cap - o, "model: roofline %s (docs/GPU.md, \"The step model\")\n", prof.hw.name);
    return out;
}
