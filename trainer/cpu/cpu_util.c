/* cpu_util.c - what every kernel family of the CPU backend calls: the
 * sticky error, the dtype check, the workspace slices and their sizes
 * (cpu_internal.h). */
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>

#include "trainer/cpu/cpu_internal.h"

int tks__cpu_op_fail(tks_backend *be, const char *op, int code, const char *fmt, ...) {
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

int tks__cpu_check_dt(tks_backend *be, const char *op, tks_dtype dt) {
    if (dt == TKS_F32 || dt == TKS_BF16) return 0;
    return tks__cpu_op_fail(be, op, TKS_ERR_ARG, "dtype %d is neither fp32 nor bf16 (a caller bug)", (int)dt);
}

/* This thread's slice of the workspace, `bytes` long; NULL when the
 * workspace is smaller than threads x bytes (the op fails, naming itself). */
float *tks__cpu_scratch(tks_backend *be, size_t bytes) {
    cpu_ctx *c = CTX(be);
    size_t per = (bytes + 63) & ~(size_t)63;
    if (per * (size_t)c->threads > c->ws_bytes) return NULL;
    return (float *)(c->ws + per * (size_t)omp_get_thread_num());
}
int tks__cpu_need_ws(tks_backend *be, const char *op, size_t per_thread) {
    size_t per = (per_thread + 63) & ~(size_t)63;
    if (per * (size_t)NT(be) <= CTX(be)->ws_bytes) return 0;
    return tks__cpu_op_fail(be, op, TKS_ERR_ARG,
                   "needs %zu bytes of workspace (%d threads x %zu), has %zu: size it with "
                   "workspace_bytes for these shapes",
                   per * (size_t)NT(be), NT(be), per, CTX(be)->ws_bytes);
}

size_t tks__cpu_attn_fwd_ws(int HD) { return (size_t)(BQ * BK + 2 * BQ * HD + 2 * BK * HD + 2 * BQ) * 4; }
size_t tks__cpu_attn_bwd_ws(int T, int HD, int group) {
    return ((size_t)group * T * HD + (size_t)group * T + 2 * BQ * BK + 2 * BQ * HD + 4 * BK * HD +
            BQ * HD) * 4;
}
size_t tks__cpu_gemm_ws(int K) { return ((size_t)GM * K + (size_t)K * GN + (size_t)GM * GN) * 4; }
