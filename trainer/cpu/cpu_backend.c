/* cpu_backend.c - the CPU reference backend of contract 4 (backend.h):
 * OpenBLAS sgemm, OpenMP elsewhere, fp32 arithmetic with fp32 or bf16
 * storage. Every reduction has a fixed order for a given thread count, so a
 * run is bit-reproducible on the same machine (resume relies on it). Ops run
 * before they return (the streams are trivially ordered) and never allocate:
 * scratch is the workspace, split into one slice per thread.
 * Formulas and sources are in backend.h; legend: N rows, C dim, HD head dim. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/model/backend.h"

/* OpenBLAS extension (declared in Debian's openblas cblas.h as well). */
void openblas_set_num_threads(int num_threads);

/* Flash-attention tiles: query rows x key rows per block. */
enum { BQ = 64, BK = 64 };
/* bf16 GEMM panels: rows of C per panel, columns of C per panel. */
enum { GM = 256, GN = 256 };

typedef struct cpu_ctx {
    int threads;
    int err;             /* sticky: the first failure */
    char err_op[32];
    char err_msg[256];
    unsigned char *ws;   /* workspace (set_workspace), ws_bytes long */
    size_t ws_bytes;
    size_t held, peak;   /* bytes held through cpu_alloc now, and at most so far */
} cpu_ctx;

struct tks_stream { int unused; };
struct tks_event { int unused; };

#define CTX(be) ((cpu_ctx *)(be)->ctx)
#define NT(be) (CTX(be)->threads)
/* Every op starts with this: a sticky failure makes the op a no-op. */
#define STICKY(be) do { if (CTX(be)->err) return CTX(be)->err; } while (0)

__attribute__((format(printf, 4, 5))) static int op_fail(tks_backend *be, const char *op, int code,
                                                         const char *fmt, ...) {
    cpu_ctx *c = CTX(be);
    if (!c->err) {
        c->err = code;
        snprintf(c->err_op, sizeof c->err_op, "%s", op);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
        va_end(ap);
    }
    return tks_fail(code, NULL, TKS_NONE, TKS_NONE, "cpu backend op %s: %s", c->err_op, c->err_msg);
}

/* ---- element access: fp32 arithmetic over fp32 or bf16 storage --------- */
/* Kernels take dt as an argument and are called as K(TKS_F32) or K(TKS_BF16)
 * from a branch outside their loops, so each is compiled once per dtype. */
#define INL static inline __attribute__((always_inline))
/* tks_bf16_from_f32 / tks_bf16_to_f32 inlined into the kernels */
INL uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}
INL float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
INL float ld(const void *p, size_t i, tks_dtype dt) {
    return dt == TKS_BF16 ? from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
INL void st(void *p, size_t i, float v, tks_dtype dt) {
    if (dt == TKS_BF16) ((uint16_t *)p)[i] = to_bf16(v);
    else ((float *)p)[i] = v;
}
INL const void *at(const void *p, size_t i, tks_dtype dt) {
    return (const char *)p + i * tks_dtype_size(dt);
}
INL void *atw(void *p, size_t i, tks_dtype dt) { return (char *)p + i * tks_dtype_size(dt); }
/* n elements of src (dt) into fp32 dst */
INL void load_row(float *dst, const void *src, size_t n, tks_dtype dt) {
    if (dt == TKS_F32) memcpy(dst, src, n * sizeof *dst);
    else for (size_t i = 0; i < n; i++) dst[i] = ld(src, i, TKS_BF16);
}
INL void store_row(void *dst, const float *src, size_t n, tks_dtype dt) {
    if (dt == TKS_F32) memcpy(dst, src, n * sizeof *src);
    else for (size_t i = 0; i < n; i++) st(dst, i, src[i], TKS_BF16);
}
#define DT_CALL(dt, f, ...) ((dt) == TKS_BF16 ? f(__VA_ARGS__, TKS_BF16) : f(__VA_ARGS__, TKS_F32))

static int check_dt(tks_backend *be, const char *op, tks_dtype dt) {
    if (dt == TKS_F32 || dt == TKS_BF16) return 0;
    return op_fail(be, op, TKS_ERR_ARG, "dtype %d is neither fp32 nor bf16 (a caller bug)", (int)dt);
}

/* This thread's slice of the workspace, `bytes` long; NULL when the
 * workspace is smaller than threads x bytes (the op fails, naming itself). */
static float *scratch(tks_backend *be, size_t bytes) {
    cpu_ctx *c = CTX(be);
    size_t per = (bytes + 63) & ~(size_t)63;
    if (per * (size_t)c->threads > c->ws_bytes) return NULL;
    return (float *)(c->ws + per * (size_t)omp_get_thread_num());
}
static int need_ws(tks_backend *be, const char *op, size_t per_thread) {
    size_t per = (per_thread + 63) & ~(size_t)63;
    if (per * (size_t)NT(be) <= CTX(be)->ws_bytes) return 0;
    return op_fail(be, op, TKS_ERR_ARG,
                   "needs %zu bytes of workspace (%d threads x %zu), has %zu: size it with "
                   "workspace_bytes for these shapes",
                   per * (size_t)NT(be), NT(be), per, CTX(be)->ws_bytes);
}

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

static size_t attn_fwd_ws(int HD) { return (size_t)(BQ * BK + 2 * BQ * HD + 2 * BK * HD + 2 * BQ) * 4; }
static size_t attn_bwd_ws(int T, int HD, int group) {
    return ((size_t)group * T * HD + (size_t)group * T + 2 * BQ * BK + 2 * BQ * HD + 4 * BK * HD +
            BQ * HD) * 4;
}
static size_t gemm_ws(int K) { return ((size_t)GM * K + (size_t)K * GN + (size_t)GM * GN) * 4; }

static size_t cpu_workspace_bytes(tks_backend *be, const tks_ws_shape *s) {
    size_t per = 0, x;
#define MAXW(v) do { x = (v); if (x > per) per = x; } while (0)
    int group = s->NKV > 0 ? s->NH / s->NKV : 1;
    MAXW(attn_fwd_ws(s->HD));
    MAXW(attn_bwd_ws(s->T, s->HD, group));
    MAXW((size_t)s->C * 4);                  /* rmsnorm_bwd dw columns */
    MAXW((size_t)s->T * s->HD * 4);          /* rope angle table (shared, counted per thread) */
    MAXW((size_t)(s->Tcache > s->T ? s->Tcache : s->T) * 4); /* attention_step scores */
    if (s->dt == TKS_BF16) {                 /* bf16 GEMM panels, K up to max(C, F, V) */
        int K = s->C;
        if (2 * s->F > K) K = 2 * s->F;
        if (s->V > K) K = s->V;
        if (s->NH * s->HD > K) K = s->NH * s->HD;
        if (s->B * s->T > K) K = s->B * s->T;
        MAXW(gemm_ws(K));
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

/* ---- GEMM ------------------------------------------------------------------ */

/* Generic path (any operand in bf16): C is cut into GM x GN panels, one
 * task each, in one parallel region. A task widens its slice of A and of B to
 * fp32 in its own workspace slice, in the operand's own layout (every copy
 * loop reads memory contiguously; sgemm gets the transpose flags), multiplies
 * them with sgemm on its thread (fp32 products and sums), and adds / stores
 * its fp32 panel into C in c_type. Panels are disjoint, so the result does
 * not depend on the schedule. */
static void gemm_panel(float *A, const tks_gemm_args *g, int i0, int mb, int j0, int nb) {
    int K = g->K;
    float *Bp = A + (size_t)GM * K, *Cp = Bp + (size_t)K * GN;
    int ldbp = g->trans_b ? K : nb, ldap = g->trans_a ? mb : K;
    if (g->trans_b) /* rows j0.. of B [N, K] -> Bp[nb, K] */
        for (int c = 0; c < nb; c++)
            for (int k = 0; k < K; k++)
                Bp[(size_t)c * K + k] = ld(g->B, (size_t)(j0 + c) * g->ldb + (size_t)k, g->b_type);
    else /* B [K, N] columns j0.. -> Bp[K, nb] */
        for (int k = 0; k < K; k++)
            for (int c = 0; c < nb; c++)
                Bp[(size_t)k * nb + c] = ld(g->B, (size_t)k * g->ldb + (size_t)(j0 + c), g->b_type);
    if (g->trans_a) /* A [K, M] columns i0.. -> A[K, mb] */
        for (int k = 0; k < K; k++)
            for (int r = 0; r < mb; r++)
                A[(size_t)k * mb + r] = ld(g->A, (size_t)k * g->lda + (size_t)(i0 + r), g->a_type);
    else
        for (int r = 0; r < mb; r++)
            for (int k = 0; k < K; k++)
                A[(size_t)r * K + k] = ld(g->A, (size_t)(i0 + r) * g->lda + (size_t)k, g->a_type);
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, mb, nb, K, g->alpha, A, ldap, Bp, ldbp, 0.0f,
                Cp, nb);
    for (int r = 0; r < mb; r++)
        for (int c = 0; c < nb; c++) {
            size_t idx = (size_t)(i0 + r) * g->ldc + (size_t)(j0 + c);
            float v = Cp[(size_t)r * nb + c];
            if (g->accumulate) v += ld(g->C, idx, g->c_type);
            st(g->C, idx, v, g->c_type);
        }
}

static int gemm_mixed(tks_backend *be, const tks_gemm_args *g) {
    int M = g->M, N = g->N, K = g->K;
    if (need_ws(be, "gemm", gemm_ws(K))) return CTX(be)->err;
    int pm = (M + GM - 1) / GM, pn = (N + GN - 1) / GN;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(NT(be))
    for (int pi = 0; pi < pm; pi++)
        for (int pj = 0; pj < pn; pj++) {
            int i0 = pi * GM, j0 = pj * GN;
            gemm_panel(scratch(be, gemm_ws(K)), g, i0, M - i0 < GM ? M - i0 : GM, j0,
                       N - j0 < GN ? N - j0 : GN);
        }
    return 0;
}

static int cpu_gemm(tks_backend *be, const tks_gemm_args *g) {
    STICKY(be);
    if (g->compute != TKS_F32)
        return op_fail(be, "gemm", TKS_ERR_ARG, "compute type %s: contract 2 computes in fp32",
                       tks_dtype_name(g->compute));
    if (g->M < 0 || g->N < 0 || g->K < 0)
        return op_fail(be, "gemm", TKS_ERR_ARG, "negative shape M %d N %d K %d", g->M, g->N, g->K);
    if (!g->M || !g->N) return 0;
    if (g->a_type == TKS_F32 && g->b_type == TKS_F32 && g->c_type == TKS_F32) {
        cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                    g->trans_b ? CblasTrans : CblasNoTrans, g->M, g->N, g->K, g->alpha, g->A,
                    (int)g->lda, g->B, (int)g->ldb, g->accumulate ? 1.0f : 0.0f, g->C, (int)g->ldc);
        return 0;
    }
    return gemm_mixed(be, g);
}

/* ---- element-wise and reductions ------------------------------------------ */

static int cpu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
                       size_t n) {
    STICKY(be);
    if (check_dt(be, "convert", ddt) || check_dt(be, "convert", sdt)) return CTX(be)->err;
    if (ddt == sdt) {
        memmove(dst, src, n * tks_dtype_size(ddt));
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) st(dst, i, ld(src, i, sdt), ddt);
    return 0;
}

INL void add_k(void *out, const void *a, const void *b, size_t i0, size_t i1, tks_dtype dt) {
    for (size_t i = i0; i < i1; i++) st(out, i, ld(a, i, dt) + ld(b, i, dt), dt);
}
static int cpu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n,
                   tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "add", dt)) return CTX(be)->err;
    enum { BLK = 16384 };
    size_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t k = 0; k < nb; k++) {
        size_t e = (k + 1) * BLK < n ? (k + 1) * BLK : n;
        DT_CALL(dt, add_k, out, a, b, k * BLK, e);
    }
    return 0;
}

static int cpu_scale(tks_backend *be, float *x, size_t n, float s) {
    STICKY(be);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}

/* The spans' concatenation cut into NCH fixed chunks (independent of the
 * thread count), each summed in fp64, the chunk sums added in order: the
 * result is the same for every thread count. */
enum { NCH = 64 };
static int cpu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
                     size_t nspans, int accumulate) {
    STICKY(be);
    size_t total = 0;
    for (size_t s = 0; s < nspans; s++) total += spans[s].n;
    double part[NCH];
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int ch = 0; ch < NCH; ch++) {
        size_t lo = total * (size_t)ch / NCH, hi = total * (size_t)(ch + 1) / NCH, base = 0;
        double acc = 0;
        for (size_t s = 0; s < nspans && base < hi; base += spans[s].n, s++) {
            size_t a = lo > base ? lo - base : 0, b = hi - base < spans[s].n ? hi - base : spans[s].n;
            const float *p = x + spans[s].off;
            for (size_t i = a; i < b; i++) acc += (double)p[i] * p[i];
        }
        part[ch] = acc;
    }
    double s = 0;
    for (int ch = 0; ch < NCH; ch++) s += part[ch];
    out[0] = (float)((accumulate ? (double)out[0] : 0.0) + s);
    return 0;
}

static int cpu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    STICKY(be);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    out[0] = (float)((accumulate ? (double)out[0] : 0.0) + s);
    return 0;
}

/* ---- embedding ---------------------------------------------------------------- */

static int cpu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                             int C, int64_t v0, int V, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "embedding_fwd", dt)) return CTX(be)->err;
    size_t es = tks_dtype_size(dt);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        void *o = atw(out, (size_t)i * C, dt);
        if (r >= 0 && r < V) memcpy(o, at(w, (size_t)r * C, dt), (size_t)C * es);
        else memset(o, 0, (size_t)C * es);
    }
    return 0;
}

INL void emb_bwd_k(float *dw, const void *dout, const int32_t *ids, int N, int C, int64_t v0,
                   int V, int c0, int c1, tks_dtype dt) {
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r < 0 || r >= V) continue;
        float *d = dw + (size_t)r * C;
        for (int c = c0; c < c1; c++) d[c] += ld(dout, (size_t)i * C + c, dt);
    }
}
static int cpu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids,
                             int N, int C, int64_t v0, int V, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "embedding_bwd", dt)) return CTX(be)->err;
    /* each thread owns a block of columns: rows hit by several ids
     * accumulate in id order, whatever the thread count */
#pragma omp parallel num_threads(NT(be))
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        DT_CALL(dt, emb_bwd_k, dw, dout, ids, N, C, v0, V, c0, c1);
    }
    return 0;
}

/* ---- RMSNorm ---------------------------------------------------------------------- */

INL void rms_fwd_row(void *out, float *rstd, const void *x, const void *w, int i, int C, float eps,
                     tks_dtype dt) {
    size_t o = (size_t)i * C;
    float ss = 0;
    for (int c = 0; c < C; c++) {
        float v = ld(x, o + c, dt);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    rstd[i] = r;
    for (int c = 0; c < C; c++) st(out, o + c, ld(x, o + c, dt) * r * ld(w, c, dt), dt);
}
static int cpu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                           int N, int C, float eps, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "rmsnorm_fwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, rms_fwd_row, out, rstd, x, w, i, C, eps);
    return 0;
}

INL void rms_bwd_row(void *dx, const void *dout, const void *x, const void *w, const float *rstd,
                     int i, int C, tks_dtype dt) {
    size_t o = (size_t)i * C;
    float r = rstd[i], dot = 0;
    for (int c = 0; c < C; c++) dot += ld(dout, o + c, dt) * ld(w, c, dt) * ld(x, o + c, dt);
    float k = dot * r * r * r / (float)C;
    for (int c = 0; c < C; c++)
        st(dx, o + c,
           ld(dx, o + c, dt) + ld(dout, o + c, dt) * ld(w, c, dt) * r - k * ld(x, o + c, dt), dt);
}
INL void rms_dw_cols(float *s, const void *dout, const void *x, const float *rstd, int N, int C,
                     int c0, int c1, tks_dtype dt) {
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * C;
        float r = rstd[i];
        for (int c = c0; c < c1; c++) s[c - c0] += ld(dout, o + c, dt) * ld(x, o + c, dt) * r;
    }
}
static int cpu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                           const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "rmsnorm_bwd", dt) || need_ws(be, "rmsnorm_bwd", (size_t)C * sizeof(float)))
        return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, rms_bwd_row, dx, dout, x, w, rstd, i, C);
    /* dw: each thread owns a contiguous block of columns and walks the rows in
     * order, so every column's sum has one order whatever the thread count,
     * and the inner loop is contiguous */
#pragma omp parallel num_threads(NT(be))
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        float *s = scratch(be, (size_t)C * sizeof(float));
        memset(s, 0, (size_t)(c1 - c0) * sizeof *s);
        DT_CALL(dt, rms_dw_cols, s, dout, x, rstd, N, C, c0, c1);
        for (int c = c0; c < c1; c++) dw[c] += s[c - c0];
    }
    return 0;
}

/* add then rmsnorm_fwd, row by row: the row's sum is stored (rounded to dt)
 * by add's kernel and normalized by rmsnorm_fwd's from what was stored, so
 * the bits are the two ops' */
INL void add_rms_row(void *res, void *out, float *rstd, const void *a, const void *b, const void *w,
                     int i, int C, float eps, tks_dtype dt) {
    size_t o = (size_t)i * C;
    add_k(res, a, b, o, o + (size_t)C, dt);
    rms_fwd_row(out, rstd, res, w, i, C, eps, dt);
}
static int cpu_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a,
                               const void *b, const void *w, int N, int C, float eps, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "add_rmsnorm_fwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, add_rms_row, res, out, rstd, a, b, w, i, C, eps);
    return 0;
}

/* ---- RoPE --------------------------------------------------------------------------- */

INL void rope_row(void *x, size_t o, const float *cs, int half, tks_dtype dt) {
    for (int j = 0; j < half; j++) {
        float x1 = ld(x, o + j, dt), x2 = ld(x, o + j + half, dt), co = cs[2 * j], si = cs[2 * j + 1];
        st(x, o + j, x1 * co - x2 * si, dt);
        st(x, o + j + half, x2 * co + x1 * si, dt);
    }
}
/* A device int32 array of positions or document starts (host memory here)
 * against its contract: every value in [0, T), and for documents doc[0] = 0
 * and doc[t] either doc[t-1] or t per row. Returns 0 or the op's failure. */
static int check_rows(tks_backend *be, const char *op, const int32_t *a, int B, int T, int docs) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t x = a[(size_t)b * T + t];
            int ok = docs ? (t == 0 ? x == 0 : x == a[(size_t)b * T + t - 1] || x == t)
                          : x >= 0 && x < T;
            if (!ok)
                return op_fail(be, op, TKS_ERR_ARG,
                               "%s[%d, %d] = %d breaks the contract (%s): a caller bug", docs ? "doc" : "pos",
                               b, t, (int)x, docs ? "doc[b,0] = 0, doc[b,t] = doc[b,t-1] or t"
                                                  : "0 <= pos < T");
        }
    return 0;
}

static int cpu_rope(tks_backend *be, void *x, size_t ldx, int B, int T, int H, int HD, int64_t p0,
                    const int32_t *pos, float theta, int inverse, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "rope", dt) || need_ws(be, "rope", (size_t)T * HD * sizeof(float)) ||
        (pos && check_rows(be, "rope", pos, B, T, 0)))
        return CTX(be)->err;
    int half = HD / 2;
    if (pos) p0 = 0; /* the table holds positions 0 .. T-1, indexed by pos */
    /* the angle table lives in thread 0's slice; built before the loop */
    float *cs = (float *)CTX(be)->ws;
    /* angles as Hugging Face computes them: float32 inv_freq, float32 products */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)HD);
            float a = (float)(p0 + t) * inv_freq;
            cs[((size_t)t * half + j) * 2] = cosf(a);
            cs[((size_t)t * half + j) * 2 + 1] = inverse ? -sinf(a) : sinf(a);
        }
#pragma omp parallel for collapse(2) schedule(static) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int p = pos ? pos[(size_t)b * T + t] : t;
            for (int h = 0; h < H; h++)
                DT_CALL(dt, rope_row, x, ((size_t)b * T + t) * ldx + (size_t)h * HD,
                        cs + (size_t)p * half * 2, half);
        }
    return 0;
}

/* ---- flash attention (Dao et al. 2022, "FlashAttention", Algorithm 1 and
 * its backward), tiled BQ query rows x BK key rows --------------------------- */

/* rows [r0, r0+n) of a head's [T, HD] view (row stride ld) into fp32 dst[n, HD] */
static void load_tile(float *dst, const void *src, size_t ld, int r0, int n, int HD, tks_dtype dt) {
    for (int r = 0; r < n; r++)
        DT_CALL(dt, load_row, dst + (size_t)r * HD, at(src, (size_t)(r0 + r) * ld, dt), (size_t)HD);
}

/* Forward for one (batch, head, query block): the online softmax over the
 * key blocks the block can see. S = scale Q K^T; m running max, l running
 * sum of exp(S - m), O running sum of exp(S - m) V; at the end O / l and
 * lse = m + log l. doc (NULL: causal) is this batch row's document starts:
 * row r sees keys doc[q0 + r] .. q0 + r. doc never decreases, so of each key
 * block only a sub-block is computed: the rows whose document starts before
 * the block's end (a prefix, r_end of them) and the keys from the first
 * row's document start on (u0 ..): key blocks before doc[q0] are skipped
 * whole, and a row without a visible key in a block leaves its running
 * values as they are. */
static void attn_fwd_block(float *ws, void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                           const void *k, const void *v, size_t ldkv, const int32_t *doc, int HD,
                           int q0, int nq, float scale, tks_dtype dt) {
    float *S = ws, *Q = S + BQ * BK, *O = Q + BQ * HD, *K = O + BQ * HD, *V = K + BK * HD,
          *m = V + BK * HD, *l = m + BQ;
    load_tile(Q, q, ldq, q0, nq, HD, dt);
    memset(O, 0, (size_t)nq * HD * sizeof *O);
    for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
    for (int k0 = doc ? doc[q0] / BK * BK : 0; k0 < q0 + nq; k0 += BK) {
        int nk = q0 + nq - k0 < BK ? q0 + nq - k0 : BK, r_end = nq, u0 = 0;
        if (doc) {
            u0 = doc[q0] > k0 ? doc[q0] - k0 : 0;
            while (r_end > 0 && doc[q0 + r_end - 1] >= k0 + nk) r_end--;
        }
        if (r_end == 0 || u0 >= nk) continue;
        load_tile(K, k, ldkv, k0 + u0, nk - u0, HD, dt);
        load_tile(V, v, ldkv, k0 + u0, nk - u0, HD, dt);
        /* S[r, u] for u in [u0, nk) at column u (the first u0 columns unused) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r_end, nk - u0, HD, scale, Q, HD, K, HD,
                    0.0f, S + u0, BK);
        for (int r = 0; r < r_end; r++) {
            float *s = S + (size_t)r * BK, mx = m[r];
            int lim = q0 + r - k0 + 1; /* causal: keys k0 + u <= q0 + r */
            int first = doc && doc[q0 + r] > k0 ? doc[q0 + r] - k0 : 0; /* keys of its document */
            if (lim > nk) lim = nk;
            if (first >= lim) { /* no key of this block is visible to the row */
                for (int u = u0; u < nk; u++) s[u] = 0;
                continue;
            }
            for (int u = first; u < lim; u++) mx = s[u] > mx ? s[u] : mx;
            float corr = expf(m[r] - mx), sum = 0; /* exp(-inf) = 0 on the first block */
            for (int u = u0; u < first; u++) s[u] = 0;
            for (int u = first; u < lim; u++) sum += (s[u] = expf(s[u] - mx));
            for (int u = lim; u < nk; u++) s[u] = 0;
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            float *o = O + (size_t)r * HD;
            for (int d = 0; d < HD; d++) o[d] *= corr;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r_end, HD, nk - u0, 1.0f, S + u0, BK, V,
                    HD, 1.0f, O, HD);
    }
    for (int r = 0; r < nq; r++) {
        float inv = 1.0f / l[r], *o = O + (size_t)r * HD;
        for (int d = 0; d < HD; d++) o[d] *= inv;
        DT_CALL(dt, store_row, atw(out, (size_t)(q0 + r) * ldo, dt), o, (size_t)HD);
        lse[q0 + r] = m[r] + logf(l[r]);
    }
}

static int cpu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                             size_t ldq, const void *k, const void *v, size_t ldkv,
                             const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                             tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "attention_fwd", dt) || need_ws(be, "attention_fwd", attn_fwd_ws(HD)) ||
        (doc && check_rows(be, "attention_fwd", doc, B, T, 1)))
        return CTX(be)->err;
    int group = NH / NKV, nqb = (T + BQ - 1) / BQ;
    float scale = 1.0f / sqrtf((float)HD);
    /* independent tasks (b, h, query block): the result does not depend on
     * the schedule; inside the loop OpenBLAS runs on the calling thread */
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int qb = 0; qb < nqb; qb++) {
                int g = h / group, q0 = qb * BQ, nq = T - q0 < BQ ? T - q0 : BQ;
                size_t row = (size_t)b * T;
                attn_fwd_block(scratch(be, attn_fwd_ws(HD)), atw(out, row * ldo + (size_t)h * HD, dt),
                               ldo, lse + ((size_t)b * NH + h) * T,
                               at(q, row * ldq + (size_t)h * HD, dt), ldq,
                               at(k, row * ldkv + (size_t)g * HD, dt),
                               at(v, row * ldkv + (size_t)g * HD, dt), ldkv, doc ? doc + row : NULL,
                               HD, q0, nq, scale, dt);
            }
    return 0;
}

/* Backward for one (batch, kv head): the task owns dK and dV of its kv head
 * and dQ of the query heads of its group, so no two tasks write the same
 * row. For each key block j and each query block i >= j of each head:
 *   P = exp(scale Q_i K_j^T - lse_i) (causal), dV_j += P^T dO_i,
 *   dP = dO_i V_j^T, dS = P o (dP - Dl_i), Dl = rowsum(dO o O),
 *   dK_j += scale dS^T Q_i, dQ_i += scale dS K_j.
 * dQ is accumulated in fp32 in the workspace and stored at the end. With
 * doc (this batch row's document starts; NULL: causal) query t sees keys
 * doc[t] .. t: the other P and dS entries are 0. doc never decreases, so
 * of each (key block, query block) only the sub-block of the query rows
 * whose documents start before the key block's end and of the keys from
 * the first row's document start on is computed, and once a query block
 * starts past the key block's last key every later query block is masked
 * too and the loop over them stops. */
static void attn_bwd_task(float *ws, void *dq, void *dk, void *dv, const void *dout,
                          const void *out, size_t ldo, const float *lse, const void *q, size_t ldq,
                          const void *k, const void *v, size_t ldkv, const int32_t *doc, int T,
                          int HD, int group, int h0, float scale, tks_dtype dt) {
    float *dQ = ws, *Dl = dQ + (size_t)group * T * HD, *P = Dl + (size_t)group * T,
          *dP = P + BQ * BK, *Q = dP + BQ * BK, *dO = Q + BQ * HD, *K = dO + BQ * HD,
          *V = K + BK * HD, *dK = V + BK * HD, *dV = dK + BK * HD, *Ot = dV + BK * HD;
    memset(dQ, 0, (size_t)group * T * HD * sizeof *dQ);
    for (int j = 0; j < group; j++) { /* Dl = rowsum(dO o O) per head */
        int h = h0 + j;
        for (int t = 0; t < T; t += BQ) {
            int n = T - t < BQ ? T - t : BQ;
            load_tile(dO, at(dout, (size_t)h * HD, dt), ldo, t, n, HD, dt);
            load_tile(Ot, at(out, (size_t)h * HD, dt), ldo, t, n, HD, dt);
            for (int r = 0; r < n; r++) {
                float s = 0;
                for (int d = 0; d < HD; d++) s += dO[(size_t)r * HD + d] * Ot[(size_t)r * HD + d];
                Dl[(size_t)j * T + t + r] = s;
            }
        }
    }
    for (int k0 = 0; k0 < T; k0 += BK) {
        int nk = T - k0 < BK ? T - k0 : BK;
        load_tile(K, k, ldkv, k0, nk, HD, dt);
        load_tile(V, v, ldkv, k0, nk, HD, dt);
        memset(dK, 0, (size_t)nk * HD * sizeof *dK);
        memset(dV, 0, (size_t)nk * HD * sizeof *dV);
        for (int j = 0; j < group; j++) {
            int h = h0 + j;
            const float *L = lse + (size_t)h * T;
            for (int q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) {
                int nq = T - q0 < BQ ? T - q0 : BQ;
                if (doc && doc[q0] >= k0 + nk) break; /* this and later query blocks see none */
                /* the sub-block that sees keys of this block: the first r_end rows (their
                 * documents start before the block's end), keys u0 .. nk */
                int r_end = nq, u0 = 0, w;
                if (doc) {
                    u0 = doc[q0] > k0 ? doc[q0] - k0 : 0;
                    while (r_end > 0 && doc[q0 + r_end - 1] >= k0 + nk) r_end--;
                }
                w = nk - u0;
                load_tile(Q, at(q, (size_t)h * HD, dt), ldq, q0, r_end, HD, dt);
                load_tile(dO, at(dout, (size_t)h * HD, dt), ldo, q0, r_end, HD, dt);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r_end, w, HD, scale, Q, HD,
                            K + (size_t)u0 * HD, HD, 0.0f, P + u0, BK);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r_end, w, HD, 1.0f, dO, HD,
                            V + (size_t)u0 * HD, HD, 0.0f, dP + u0, BK);
                for (int r = 0; r < r_end; r++) {
                    float *p = P + (size_t)r * BK, *d = dP + (size_t)r * BK;
                    int lim = q0 + r - k0 + 1;
                    int first = doc && doc[q0 + r] > k0 ? doc[q0 + r] - k0 : 0;
                    if (lim > nk) lim = nk;
                    if (lim < 0) lim = 0;
                    if (first > lim) first = lim;
                    float lr = L[q0 + r], dl = Dl[(size_t)j * T + q0 + r];
                    for (int u = u0; u < first; u++) p[u] = 0, d[u] = 0;
                    for (int u = first; u < lim; u++) {
                        p[u] = expf(p[u] - lr);
                        d[u] = p[u] * (d[u] - dl);
                    }
                    for (int u = lim; u < nk; u++) p[u] = 0, d[u] = 0;
                }
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w, HD, r_end, 1.0f, P + u0, BK,
                            dO, HD, 1.0f, dV + (size_t)u0 * HD, HD);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w, HD, r_end, scale, dP + u0, BK,
                            Q, HD, 1.0f, dK + (size_t)u0 * HD, HD);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r_end, HD, w, scale, dP + u0,
                            BK, K + (size_t)u0 * HD, HD, 1.0f, dQ + ((size_t)j * T + q0) * HD, HD);
            }
        }
        for (int r = 0; r < nk; r++) {
            DT_CALL(dt, store_row, atw(dk, (size_t)(k0 + r) * ldkv, dt), dK + (size_t)r * HD, (size_t)HD);
            DT_CALL(dt, store_row, atw(dv, (size_t)(k0 + r) * ldkv, dt), dV + (size_t)r * HD, (size_t)HD);
        }
    }
    for (int j = 0; j < group; j++)
        for (int t = 0; t < T; t++)
            DT_CALL(dt, store_row, atw(dq, (size_t)t * ldq + (size_t)(h0 + j) * HD, dt),
                    dQ + ((size_t)j * T + t) * HD, (size_t)HD);
}

static int cpu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                             const void *out, size_t ldo, const float *lse, const void *q,
                             size_t ldq, const void *k, const void *v, size_t ldkv,
                             const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                             tks_dtype dt) {
    STICKY(be);
    int group = NH / NKV;
    if (check_dt(be, "attention_bwd", dt) ||
        need_ws(be, "attention_bwd", attn_bwd_ws(T, HD, group)) ||
        (doc && check_rows(be, "attention_bwd", doc, B, T, 1)))
        return CTX(be)->err;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            size_t row = (size_t)b * T;
            size_t ko = row * ldkv + (size_t)g * HD;
            attn_bwd_task(scratch(be, attn_bwd_ws(T, HD, group)), atw(dq, row * ldq, dt),
                          atw(dk, ko, dt), atw(dv, ko, dt), at(dout, row * ldo, dt),
                          at(out, row * ldo, dt), ldo, lse + (size_t)b * NH * T,
                          at(q, row * ldq, dt), ldq, at(k, ko, dt), at(v, ko, dt), ldkv,
                          doc ? doc + row : NULL, T, HD, group, g * group, scale, dt);
        }
    return 0;
}

INL void attn_step_head(float *p, void *out, const void *q, const void *kc, const void *vc, int t,
                        int h, int g, int NKV, int HD, float scale, tks_dtype dt) {
    float mx = -INFINITY, sum = 0;
    for (int u = 0; u <= t; u++) {
        size_t ko = ((size_t)u * NKV + g) * HD;
        float s = 0;
        for (int d = 0; d < HD; d++) s += ld(q, (size_t)h * HD + d, dt) * ld(kc, ko + d, dt);
        p[u] = s * scale;
        if (p[u] > mx) mx = p[u];
    }
    for (int u = 0; u <= t; u++) sum += (p[u] = expf(p[u] - mx));
    for (int d = 0; d < HD; d++) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += p[u] / sum * ld(vc, ((size_t)u * NKV + g) * HD + d, dt);
        st(out, (size_t)h * HD + d, o, dt);
    }
}
static int cpu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
                              const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "attention_step", dt) ||
        need_ws(be, "attention_step", (size_t)(t + 1) * sizeof(float)))
        return CTX(be)->err;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int h = 0; h < NH; h++)
        DT_CALL(dt, attn_step_head, scratch(be, (size_t)(t + 1) * sizeof(float)), out, q, kc, vc, t,
                h, h / group, NKV, HD, scale);
    return 0;
}

/* ---- SwiGLU ------------------------------------------------------------------------- */

INL void swiglu_fwd_row(void *out, const void *gu, int i, int F, tks_dtype dt) {
    size_t o = (size_t)i * F, gi = (size_t)i * 2 * F;
    for (int j = 0; j < F; j++) {
        float g = ld(gu, gi + j, dt);
        st(out, o + j, g / (1.0f + expf(-g)) * ld(gu, gi + F + j, dt), dt);
    }
}
static int cpu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "swiglu_fwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < M; i++) DT_CALL(dt, swiglu_fwd_row, out, gu, i, F);
    return 0;
}

INL void swiglu_bwd_row(void *dgu, const void *dout, const void *gu, int i, int F, tks_dtype dt) {
    size_t o = (size_t)i * F, gi = (size_t)i * 2 * F;
    for (int j = 0; j < F; j++) {
        float g = ld(gu, gi + j, dt), u = ld(gu, gi + F + j, dt), d = ld(dout, o + j, dt);
        float s = 1.0f / (1.0f + expf(-g));
        st(dgu, gi + F + j, d * g * s, dt);
        st(dgu, gi + j, d * u * s * (1.0f + g * (1.0f - s)), dt);
    }
}
static int cpu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M,
                          int F, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "swiglu_bwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < M; i++) DT_CALL(dt, swiglu_bwd_row, dgu, dout, gu, i, F);
    return 0;
}

/* ---- cross-entropy ------------------------------------------------------------------ */

INL float row_max(const void *l, size_t o, int VR, tks_dtype dt) {
    float m = -INFINITY;
    for (int j = 0; j < VR; j++) {
        float x = ld(l, o + j, dt);
        m = x > m ? x : m;
    }
    return m;
}
INL float row_sumexp(const void *l, size_t o, int VR, float mx, tks_dtype dt) {
    float s = 0;
    for (int j = 0; j < VR; j++) s += expf(ld(l, o + j, dt) - mx);
    return s;
}
/* d[j] = scale * exp(l[j] - mx) / sum, 0 on padding, minus scale at the target */
INL void row_dlogits(void *d, const void *l, size_t o, int V, int VR, float mx, float sum,
                     int64_t r, float scale, tks_dtype dt) {
    float inv = 1.0f / sum;
    for (int j = 0; j < VR; j++) st(d, o + j, expf(ld(l, o + j, dt) - mx) * inv * scale, dt);
    for (int j = VR; j < V; j++) st(d, o + j, 0.0f, dt);
    if (r >= 0 && r < VR) st(d, o + r, ld(d, o + r, dt) - scale, dt);
}
INL void xent_fused_row(float *loss, void *logits, const int32_t *targets, int i, int V, int VR,
                        float scale, tks_dtype dt) {
    size_t o = (size_t)i * V;
    float mx = row_max(logits, o, VR, dt), sum = row_sumexp(logits, o, VR, mx, dt);
    int64_t r = targets[i];
    float tgt = r >= 0 && r < VR ? ld(logits, o + r, dt) : 0.0f;
    loss[i] = logf(sum) + mx - tgt;
    row_dlogits(logits, logits, o, V, VR, mx, sum, r, scale, dt);
}
static int cpu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets,
                          int N, int V, int VR, float scale, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "xent_fused", dt)) return CTX(be)->err;
    /* a row chunk is one row here: read twice (max, sum of exp), then
     * overwritten by its gradient while it is in cache */
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, xent_fused_row, loss, logits, targets, i, V, VR, scale);
    return 0;
}

static int cpu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR,
                        tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "xent_max", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) mx[i] = DT_CALL(dt, row_max, logits, (size_t)i * V, VR);
    return 0;
}

static int cpu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                           int V, int VR, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "xent_sumexp", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) sum[i] = DT_CALL(dt, row_sumexp, logits, (size_t)i * V, VR, mx[i]);
    return 0;
}

static int cpu_xent_target(tks_backend *be, float *tgt, const void *logits,
                           const int32_t *targets, int N, int V, int64_t v0, int VR, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "xent_target", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)targets[i] - v0;
        tgt[i] = (r >= 0 && r < VR) ? ld(logits, (size_t)i * V + (size_t)r, dt) : 0.0f;
    }
    return 0;
}

static int cpu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                         const float *tgt, int N) {
    STICKY(be);
    for (int i = 0; i < N; i++) loss[i] = logf(sum[i]) + mx[i] - tgt[i];
    return 0;
}

static int cpu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
                        const float *sum, const int32_t *targets, int N, int V, int64_t v0,
                        int VR, float scale, tks_dtype dt) {
    STICKY(be);
    if (check_dt(be, "xent_bwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++)
        DT_CALL(dt, row_dlogits, dlogits, logits, (size_t)i * V, V, VR, mx[i], sum[i],
                (int64_t)targets[i] - v0, scale);
    return 0;
}

/* ---- AdamW over spans ------------------------------------------------------------------ */

static int cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                     const tks_span *spans, size_t nspans, const tks_adamw_hp *hp,
                     float grad_scale, const float *gnorm_sq, void *pc, tks_dtype pc_dt) {
    STICKY(be);
    if (pc && check_dt(be, "adamw", pc_dt)) return CTX(be)->err;
    float clipf = 1.0f;
    if (gnorm_sq) {
        double nsq = *gnorm_sq; /* read on the device: no host round trip on a GPU */
        if (!isfinite(nsq)) return 0; /* the caller sees the norm and reports it */
        double norm = sqrt(nsq);
        if (hp->clip > 0 && norm > hp->clip) clipf = (float)(hp->clip / norm);
    }
    float gs = grad_scale * clipf;
    /* same operation order as torch.optim.AdamW (single-tensor path) */
    float b1 = hp->b1, b2 = hp->b2, lr = hp->lr, eps = hp->eps;
    float bc1 = 1.0f - powf(b1, (float)hp->t), bc2 = 1.0f - powf(b2, (float)hp->t);
    float step = lr / bc1, bc2s = sqrtf(bc2);
    for (size_t s = 0; s < nspans; s++) {
        size_t off = spans[s].off, n = spans[s].n;
        if (off < base) {
            return op_fail(be, "adamw", TKS_ERR_ARG,
                           "span at %zu starts before the optimizer slice at %zu (a caller bug)",
                           off, base);
        }
        float decay = 1.0f - lr * spans[s].wd;
        float *P = p + off, *M = m + (off - base), *Vv = v + (off - base);
        const float *G = grad + off;
#pragma omp parallel for schedule(static) num_threads(NT(be))
        for (size_t i = 0; i < n; i++) {
            float g = G[i] * gs;
            M[i] = M[i] * b1 + g * (1.0f - b1);
            Vv[i] = Vv[i] * b2 + g * g * (1.0f - b2);
            float denom = sqrtf(Vv[i]) / bc2s + eps;
            P[i] = P[i] * decay - step * M[i] / denom;
            if (pc) st(pc, off + i, P[i], pc_dt);
        }
    }
    return 0;
}

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
    .gemm = cpu_gemm,
    .convert = cpu_convert,
    .add = cpu_add,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .sum = cpu_sum,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .add_rmsnorm_fwd = cpu_add_rmsnorm_fwd,
    .rope = cpu_rope,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .attention_step = cpu_attention_step,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .xent_fused = cpu_xent_fused,
    .xent_max = cpu_xent_max,
    .xent_sumexp = cpu_xent_sumexp,
    .xent_target = cpu_xent_target,
    .xent_loss = cpu_xent_loss,
    .xent_bwd = cpu_xent_bwd,
    .adamw = cpu_adamw,
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
