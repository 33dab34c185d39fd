/* cpu_internal.h - what the files of the CPU reference backend share: its
 * context, the sticky error, fp32/bf16 element access, the workspace, and
 * each kernel family's ops (cpu_<family>.c, paired with the CUDA backend's
 * cuda_<family>.cu). Private to trainer/cpu/. */
#ifndef TKS_CPU_INTERNAL_H
#define TKS_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"

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
/* out[i] = a[i] + b[i] for i in [i0, i1) */
INL void add_k(void *out, const void *a, const void *b, size_t i0, size_t i1, tks_dtype dt) {
    for (size_t i = i0; i < i1; i++) st(out, i, ld(a, i, dt) + ld(b, i, dt), dt);
}

int tks__cpu_op_fail(tks_backend *be, const char *op, int code, const char *fmt, ...)
                     __attribute__((format(printf, 4, 5)));
int tks__cpu_check_dt(tks_backend *be, const char *op, tks_dtype dt);
/* This thread's slice of the workspace, `bytes` long; NULL when the
 * workspace is smaller than threads x bytes (the op fails, naming itself). */
float *tks__cpu_scratch(tks_backend *be, size_t bytes);
/* 0 when the workspace holds per_thread bytes for every thread; else the op fails. */
int tks__cpu_need_ws(tks_backend *be, const char *op, size_t per_thread);

/* Workspace bytes per thread of the attention forward and backward
 * (group: query heads per KV head) and of a bf16 GEMM with inner size K. */
size_t tks__cpu_attn_fwd_ws(int HD);
size_t tks__cpu_attn_bwd_ws(int T, int HD, int group);
size_t tks__cpu_gemm_ws(int K);

/* The ops of each kernel family (contracts and formulas: backend.h). */
int tks__cpu_gemm(tks_backend *be, const tks_gemm_args *g);
int tks__cpu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
                     size_t n);
int tks__cpu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n,
                 tks_dtype dt);
int tks__cpu_scale(tks_backend *be, float *x, size_t n, float s);
int tks__cpu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
                   size_t nspans, int accumulate);
int tks__cpu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate);
int tks__cpu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt);
int tks__cpu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M,
                        int F, tks_dtype dt);
int tks__cpu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                           int C, int64_t v0, int V, tks_dtype dt);
int tks__cpu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids,
                           int N, int C, int64_t v0, int V, tks_dtype dt);
int tks__cpu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                         int N, int C, float eps, tks_dtype dt);
int tks__cpu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int N, int C, tks_dtype dt);
int tks__cpu_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a,
                             const void *b, const void *w, int N, int C, float eps, tks_dtype dt);
int tks__cpu_rope(tks_backend *be, void *x, size_t ldx, int B, int T, int H, int HD, int64_t p0,
                  const int32_t *pos, float theta, int inverse, tks_dtype dt);
int tks__cpu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                           size_t ldq, const void *k, const void *v, size_t ldkv,
                           const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                           tks_dtype dt);
int tks__cpu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                           const void *out, size_t ldo, const float *lse, const void *q,
                           size_t ldq, const void *k, const void *v, size_t ldkv,
                           const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                           tks_dtype dt);
int tks__cpu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
                            const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt);
int tks__cpu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets,
                        int N, int V, int VR, float scale, tks_dtype dt);
int tks__cpu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR,
                      tks_dtype dt);
int tks__cpu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                         int V, int VR, tks_dtype dt);
int tks__cpu_xent_target(tks_backend *be, float *tgt, const void *logits,
                         const int32_t *targets, int N, int V, int64_t v0, int VR, tks_dtype dt);
int tks__cpu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                       const float *tgt, int N);
int tks__cpu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
                      const float *sum, const int32_t *targets, int N, int V, int64_t v0,
                      int VR, float scale, tks_dtype dt);
int tks__cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                   const tks_span *spans, size_t nspans, const tks_adamw_hp *hp,
                   float grad_scale, const float *gnorm_sq, void *pc, tks_dtype pc_dt);

#endif /* TKS_CPU_INTERNAL_H */
