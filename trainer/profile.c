/* profile.c - per-op timing of a backend (tokshard-train --profile N):
 * every compute and transfer op of backend.h goes through a wrapper that
 * times it with the host clock, between two syncs on a device backend (each
 * op's time is then its own, and the profiled steps run serialized: slower
 * than unprofiled ones; the CPU backend runs each op before returning). GEMMs also count their FLOPs
 * (2 M N K). One profiled backend per process at a time. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "../common/tks.h"
#include "backend.h"
#include "profile.h"

enum {
    OP_UPLOAD,
    OP_DOWNLOAD,
    OP_MEMZERO,
    OP_COPY,
    OP_GEMM,
    OP_CONVERT,
    OP_ADD,
    OP_SCALE,
    OP_SUMSQ,
    OP_SUM,
    OP_EMBEDDING_FWD,
    OP_EMBEDDING_BWD,
    OP_RMSNORM_FWD,
    OP_RMSNORM_BWD,
    OP_ROPE,
    OP_ATTENTION_FWD,
    OP_ATTENTION_BWD,
    OP_ATTENTION_STEP,
    OP_SWIGLU_FWD,
    OP_SWIGLU_BWD,
    OP_XENT_FUSED,
    OP_XENT_MAX,
    OP_XENT_SUMEXP,
    OP_XENT_TARGET,
    OP_XENT_LOSS,
    OP_XENT_BWD,
    OP_ADAMW,
    N_OPS
};

static const char *const op_names[N_OPS] = {
    "upload",
    "download",
    "memzero",
    "copy",
    "gemm",
    "convert",
    "add",
    "scale",
    "sumsq",
    "sum",
    "embedding_fwd",
    "embedding_bwd",
    "rmsnorm_fwd",
    "rmsnorm_bwd",
    "rope",
    "attention_fwd",
    "attention_bwd",
    "attention_step",
    "swiglu_fwd",
    "swiglu_bwd",
    "xent_fused",
    "xent_max",
    "xent_sumexp",
    "xent_target",
    "xent_loss",
    "xent_bwd",
    "adamw",
};

static struct {
    const tks_backend_ops *ops; /* the backend's own table */
    tks_backend_ops table;      /* the wrappers, and the backend's own ops for the rest */
    int device;                 /* not the CPU: sync around each op */
    int on;                     /* counting */
    uint64_t calls[N_OPS];
    double secs[N_OPS], flops[N_OPS];
} prof;

static double tic(tks_backend *be) {
    if (prof.on && prof.device) prof.ops->sync(be);
    return omp_get_wtime();
}

static int toc(tks_backend *be, int op, double t0, int rc) {
    if (!prof.on) return rc;
    if (prof.device) prof.ops->sync(be);
    prof.calls[op]++;
    prof.secs[op] += omp_get_wtime() - t0;
    return rc;
}

static int p_upload(tks_backend *be, void *dst, const void *src_host, size_t bytes) {
    double t0 = tic(be);
    return toc(be, OP_UPLOAD, t0, prof.ops->upload(be, dst, src_host, bytes));
}

static int p_download(tks_backend *be, void *dst_host, const void *src, size_t bytes) {
    double t0 = tic(be);
    return toc(be, OP_DOWNLOAD, t0, prof.ops->download(be, dst_host, src, bytes));
}

static int p_memzero(tks_backend *be, void *p, size_t bytes) {
    double t0 = tic(be);
    return toc(be, OP_MEMZERO, t0, prof.ops->memzero(be, p, bytes));
}

static int p_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    double t0 = tic(be);
    return toc(be, OP_COPY, t0, prof.ops->copy(be, dst, src, bytes));
}

static int p_gemm(tks_backend *be, const tks_gemm_args *g) {
    double t0 = tic(be);
    prof.flops[OP_GEMM] += 2.0 * g->M * g->N * g->K;
    return toc(be, OP_GEMM, t0, prof.ops->gemm(be, g));
}

static int p_convert(tks_backend *be, void *dst, tks_dtype dst_dt, const void *src, tks_dtype src_dt, size_t n) {
    double t0 = tic(be);
    return toc(be, OP_CONVERT, t0, prof.ops->convert(be, dst, dst_dt, src, src_dt, n));
}

static int p_add(tks_backend *be, void *out, const void *a, const void *b, size_t n, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_ADD, t0, prof.ops->add(be, out, a, b, n, dt));
}

static int p_scale(tks_backend *be, float *x, size_t n, float s) {
    double t0 = tic(be);
    return toc(be, OP_SCALE, t0, prof.ops->scale(be, x, n, s));
}

static int p_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans, size_t nspans, int accumulate) {
    double t0 = tic(be);
    return toc(be, OP_SUMSQ, t0, prof.ops->sumsq(be, out, x, spans, nspans, accumulate));
}

static int p_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    double t0 = tic(be);
    return toc(be, OP_SUM, t0, prof.ops->sum(be, out, x, n, accumulate));
}

static int p_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N, int C, int64_t v0, int V, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_EMBEDDING_FWD, t0, prof.ops->embedding_fwd(be, out, ids, w, N, C, v0, V, dt));
}

static int p_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N, int C, int64_t v0, int V, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_EMBEDDING_BWD, t0, prof.ops->embedding_bwd(be, dw, dout, ids, N, C, v0, V, dt));
}

static int p_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_RMSNORM_FWD, t0, prof.ops->rmsnorm_fwd(be, out, rstd, x, w, N, C, eps, dt));
}

static int p_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_RMSNORM_BWD, t0, prof.ops->rmsnorm_bwd(be, dx, dw, dout, x, w, rstd, N, C, dt));
}

static int p_rope(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0, float theta, int inverse, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_ROPE, t0, prof.ops->rope(be, x, ld, B, T, H, HD, p0, theta, inverse, dt));
}

static int p_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q, size_t ldq, const void *k, const void *v, size_t ldkv, int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_ATTENTION_FWD, t0, prof.ops->attention_fwd(be, out, ldo, lse, q, ldq, k, v, ldkv, B, T, NH, NKV, HD, dt));
}

static int p_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout, const void *out, size_t ldo, const float *lse, const void *q, size_t ldq, const void *k, const void *v, size_t ldkv, int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_ATTENTION_BWD, t0, prof.ops->attention_bwd(be, dq, dk, dv, dout, out, ldo, lse, q, ldq, k, v, ldkv, B, T, NH, NKV, HD, dt));
}

static int p_attention_step(tks_backend *be, void *out, const void *q, const void *kc, const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_ATTENTION_STEP, t0, prof.ops->attention_step(be, out, q, kc, vc, t, NH, NKV, HD, dt));
}

static int p_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_SWIGLU_FWD, t0, prof.ops->swiglu_fwd(be, out, gu, M, F, dt));
}

static int p_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_SWIGLU_BWD, t0, prof.ops->swiglu_bwd(be, dgu, dout, gu, M, F, dt));
}

static int p_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N, int V, int VR, float scale, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_XENT_FUSED, t0, prof.ops->xent_fused(be, loss, logits, targets, N, V, VR, scale, dt));
}

static int p_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_XENT_MAX, t0, prof.ops->xent_max(be, mx, logits, N, V, VR, dt));
}

static int p_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N, int V, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_XENT_SUMEXP, t0, prof.ops->xent_sumexp(be, sum, logits, mx, N, V, VR, dt));
}

static int p_xent_target(tks_backend *be, float *tgt, const void *logits, const int32_t *targets, int N, int V, int64_t v0, int VR, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_XENT_TARGET, t0, prof.ops->xent_target(be, tgt, logits, targets, N, V, v0, VR, dt));
}

static int p_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum, const float *tgt, int N) {
    double t0 = tic(be);
    return toc(be, OP_XENT_LOSS, t0, prof.ops->xent_loss(be, loss, mx, sum, tgt, N));
}

static int p_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx, const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR, float scale, tks_dtype dt) {
    double t0 = tic(be);
    return toc(be, OP_XENT_BWD, t0, prof.ops->xent_bwd(be, dlogits, logits, mx, sum, targets, N, V, v0, VR, scale, dt));
}

static int p_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base, const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale, const float *gnorm_sq, void *pc, tks_dtype pc_dt) {
    double t0 = tic(be);
    return toc(be, OP_ADAMW, t0, prof.ops->adamw(be, p, grad, m, v, base, spans, nspans, hp, grad_scale, gnorm_sq, pc, pc_dt));
}

int tks_profile_attach(tks_backend *be) {
    if (prof.ops)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--profile: a backend is already profiled in this process");
    memset(&prof, 0, sizeof prof);
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
    be->ops = &prof.table;
    return 0;
}

void tks_profile_detach(tks_backend *be) {
    if (!be || be->ops != &prof.table) return;
    be->ops = prof.ops;
    prof.ops = NULL;
    prof.on = 0;
}

void tks_profile_count(int on) { prof.on = on; }

static int by_time_desc(const void *a, const void *b) {
    double x = prof.secs[*(const int *)a], y = prof.secs[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

char *tks_profile_report(uint64_t steps) {
    double total = 0;
    int order[N_OPS], n = 0;
    for (int i = 0; i < N_OPS; i++) {
        total += prof.secs[i];
        if (prof.calls[i]) order[n++] = i;
    }
    qsort(order, (size_t)n, sizeof *order, by_time_desc);
    size_t cap = 256 + (size_t)n * 128;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = (size_t)snprintf(out, cap, "%-16s %8s %10s %10s %7s %12s\n", "op", "calls", "total ms",
                                "ms/step", "share", "TFLOP/s");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        char tf[32] = "-";
        if (prof.flops[i] > 0 && prof.secs[i] > 0) snprintf(tf, sizeof tf, "%.4f", prof.flops[i] / prof.secs[i] / 1e12);
        o += (size_t)snprintf(out + o, cap - o, "%-16s %8llu %10.3f %10.3f %6.1f%% %12s\n", op_names[i],
                              (unsigned long long)prof.calls[i], 1e3 * prof.secs[i],
                              1e3 * prof.secs[i] / (double)(steps ? steps : 1),
                              total > 0 ? 100.0 * prof.secs[i] / total : 0.0, tf);
    }
    snprintf(out + o, cap - o, "%-16s %8s %10.3f %10.3f %6.1f%%\n", "all ops", "", 1e3 * total,
             1e3 * total / (double)(steps ? steps : 1), total > 0 ? 100.0 : 0.0);
    return out;
}
