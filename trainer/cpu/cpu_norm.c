/* cpu_norm.c - RMSNorm forward, backward and the fused residual add on the CPU
 * backend (backend.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

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
int tks__cpu_rmsnorm_fwd(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                         int N, int C, float eps, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "rmsnorm_fwd", dt)) return CTX(be)->err;
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
int tks__cpu_rmsnorm_bwd(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int N, int C, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "rmsnorm_bwd", dt) ||
        tks__cpu_need_ws(be, "rmsnorm_bwd", (size_t)C * sizeof(float)))
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
        float *s = tks__cpu_scratch(be, (size_t)C * sizeof(float));
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
int tks__cpu_add_rmsnorm_fwd(tks_backend *be, void *res, void *out, float *rstd, const void *a,
                             const void *b, const void *w, int N, int C, float eps, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "add_rmsnorm_fwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, add_rms_row, res, out, rstd, a, b, w, i, C, eps);
    return 0;
}
