/* cpu_backend.c - the CPU reference backend (backend.h):
 * OpenBLAS sgemm, OpenMP elsewhere, fp32 arithmetic with fp32 or bf16
 * storage. Every reduction has a fixed order for a given thread count, so a
 * run is bit-reproducible on the same machine (resume relies on it). Ops run
 * before they return (the streams are trivially ordered) and never allocate:
 * scratch is the workspace, split into one slice per thread.
 * Formulas and sources are in backend.h; legend: N rows, C dim, HD head dim. */
#include <cblas.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

/* OpenBLAS extension (declared in Debian's openblas cblas.h as well). */
void openblas_set_num_threads(int num_threads);

/* ---- memory, sync, workspace, streams ------------------------------------- */

/* Every buffer is 64-byte aligned and zeroed, and carries its size in the
 * 64 bytes before it, so that free can count what is held (kind->memory):
 * the trainer's allocations are checked against its memory plan on the CPU. */
#define CPU_HDR 64
static void *cpu_alloc(tks_backend *be, size_t bytes) {
    cpu_ctx *c = CTX(be);
    if (bytes > SIZE_MAX - CPU_HDR - 64) return NULL;
    size_t n = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    unsigned char *p = aligned_alloc(64, CPU_HDR + n);
    if (!p) return NULL;
    memset(p + CPU_HDR, 0, n);
    memcpy(p, &n, sizeof n);
    c->held += n;
    if (c->held > c->peak) c->peak = c->held;
    return p + CPU_HDR;
}
static void cpu_free(tks_backend *be, void *ptr) {
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - CPU_HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    CTX(be)->held -= n;
    free(p);
}
static void cpu_memory(tks_backend *be, size_t *now, size_t *peak) {
    if (now) *now = CTX(be)->held;
    if (peak) *peak = CTX(be)->peak;
}
static int cpu_upload(tks_backend *be, void *dst, const void *src, size_t bytes) {
    STICKY(be);
    memcpy(dst, src, bytes);
    return 0;
}
static int cpu_download(tks_backend *be, void *dst, const void *src, size_t bytes) {
    STICKY(be);
    memcpy(dst, src, bytes);
    return 0;
}
static int cpu_memzero(tks_backend *be, void *p, size_t bytes) {
    STICKY(be);
    memset(p, 0, bytes);
    return 0;
}
static int cpu_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    STICKY(be);
    memmove(dst, src, bytes);
    return 0;
}
static int cpu_sync(tks_backend *be) {
    cpu_ctx *c = CTX(be);
    if (!c->err) return 0;
    return tks_fail(c->err, NULL, TKS_NONE, TKS_NONE, "cpu backend op %s failed: %s", c->err_op,
                    c->err_msg);
}

static size_t cpu_workspace_bytes(tks_backend *be, const tks_ws_shape *s) {
    size_t per = 0, x;
#define MAXW(v) do { x = (v); if (x > per) per = x; } while (0)
    int group = s->NKV > 0 ? s->NH / s->NKV : 1;
    MAXW(tks__cpu_attn_fwd_ws(s->HD));
    MAXW(tks__cpu_attn_bwd_ws(s->T, s->HD, group));
    MAXW((size_t)s->C * 4);                  /* rmsnorm_bwd dw columns */
    MAXW((size_t)s->T * s->HD * 4);          /* rope angle table (shared, counted per thread) */
    MAXW((size_t)(s->Tcache > s->T ? s->Tcache : s->T) * 4); /* attention_step scores */
    if (s->dt == TKS_BF16) {                 /* bf16 GEMM panels, K up to max(C, F, V) */
        int K = s->C;
        if (2 * s->F > K) K = 2 * s->F;
        if (s->V > K) K = s->V;
        if (s->NH * s->HD > K) K = s->NH * s->HD;
        if (s->B * s->T > K) K = s->B * s->T;
        MAXW(tks__cpu_gemm_ws(K));
    }
#undef MAXW
    return ((per + 63) & ~(size_t)63) * (size_t)NT(be);
}
static int cpu_set_workspace(tks_backend *be, void *ws, size_t bytes) {
    STICKY(be);
    CTX(be)->ws = ws;
    CTX(be)->ws_bytes = ws ? bytes : 0;
    return 0;
}

/* One stream: everything runs in call order on the calling thread. */
static struct tks_stream the_stream;
static struct tks_event the_event;
static int cpu_stream_create(tks_backend *be, tks_stream **out) {
    (void)be;
    *out = &the_stream;
    return 0;
}
static void cpu_stream_destroy(tks_backend *be, tks_stream *s) { (void)be; (void)s; }
static int cpu_set_stream(tks_backend *be, tks_stream *s) { (void)s; STICKY(be); return 0; }
static int cpu_event_create(tks_backend *be, tks_event **out) {
    (void)be;
    *out = &the_event;
    return 0;
}
static void cpu_event_destroy(tks_backend *be, tks_event *e) { (void)be; (void)e; }
static int cpu_event_record(tks_backend *be, tks_event *e) { (void)e; STICKY(be); return 0; }
static int cpu_stream_wait(tks_backend *be, tks_event *e) { (void)e; STICKY(be); return 0; }
static int cpu_event_sync(tks_backend *be, tks_event *e) { (void)e; STICKY(be); return 0; }

static void cpu_destroy(tks_backend *be) {
    if (!be) return;
    free(be->ctx);
    free(be);
}

static const tks_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .memzero = cpu_memzero,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .workspace_bytes = cpu_workspace_bytes,
    .set_workspace = cpu_set_workspace,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .set_stream = cpu_set_stream,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .gemm = tks__cpu_gemm,
    .convert = tks__cpu_convert,
    .add = tks__cpu_add,
    .scale = tks__cpu_scale,
    .sumsq = tks__cpu_sumsq,
    .sum = tks__cpu_sum,
    .embedding_fwd = tks__cpu_embedding_fwd,
    .embedding_bwd = tks__cpu_embedding_bwd,
    .rmsnorm_fwd = tks__cpu_rmsnorm_fwd,
    .rmsnorm_bwd = tks__cpu_rmsnorm_bwd,
    .add_rmsnorm_fwd = tks__cpu_add_rmsnorm_fwd,
    .rope = tks__cpu_rope,
    .attention_fwd = tks__cpu_attention_fwd,
    .attention_bwd = tks__cpu_attention_bwd,
    .attention_step = tks__cpu_attention_step,
    .swiglu_fwd = tks__cpu_swiglu_fwd,
    .swiglu_bwd = tks__cpu_swiglu_bwd,
    .xent_fused = tks__cpu_xent_fused,
    .xent_max = tks__cpu_xent_max,
    .xent_sumexp = tks__cpu_xent_sumexp,
    .xent_target = tks__cpu_xent_target,
    .xent_loss = tks__cpu_xent_loss,
    .xent_bwd = tks__cpu_xent_bwd,
    .adamw = tks__cpu_adamw,
    .destroy = cpu_destroy,
};

tks_backend *tks_cpu_backend_create(int threads) {
    tks_backend *be = calloc(1, sizeof *be);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    c->threads = threads > 0 ? threads : omp_get_max_threads();
    openblas_set_num_threads(c->threads);
    be->ops = &cpu_ops;
    be->kind = &tks_cpu_backend_kind;
    be->ctx = c;
    return be;
}

/* The timer: the host clock when a mark is taken (the ops before it have
 * run when they returned). */
struct tks_timer {
    size_t cap;
    double t[];
};
static int cpu_timer_create(tks_backend *be, size_t marks, tks_timer **out) {
    (void)be;
    *out = malloc(sizeof **out + (marks ? marks : 1) * sizeof(double));
    if (!*out) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for %zu timer marks", marks);
    (*out)->cap = marks;
    return 0;
}
static int cpu_timer_mark(tks_backend *be, tks_timer *t, size_t i) {
    STICKY(be);
    if (i < t->cap) t->t[i] = omp_get_wtime();
    return 0;
}
static int cpu_timer_read(tks_backend *be, tks_timer *t, size_t n, double *secs) {
    STICKY(be);
    for (size_t k = 0; 2 * k + 1 < n && 2 * k + 1 < t->cap; k++) secs[k] = t->t[2 * k + 1] - t->t[2 * k];
    return 0;
}
static void cpu_timer_destroy(tks_backend *be, tks_timer *t) {
    (void)be;
    free(t);
}

static int cpu_device_count(void) { return 1; }

static int cpu_create(int threads, tks_backend **out) {
    if (!(*out = tks_cpu_backend_create(threads)))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory creating the cpu backend");
    return 0;
}

const tks_backend_kind tks_cpu_backend_kind = {
    .name = "cpu",
    .ops = &cpu_ops,
    .device_count = cpu_device_count,
    .create = cpu_create,
    .memory = cpu_memory,
    .timer_create = cpu_timer_create,
    .timer_mark = cpu_timer_mark,
    .timer_read = cpu_timer_read,
    .timer_destroy = cpu_timer_destroy,
};
