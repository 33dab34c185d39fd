/* cpu_elementwise.c - element-wise ops and reductions of the CPU backend: convert,
 * add, scale, sum of squares, sum, SwiGLU (backend.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

/* ---- element-wise and reductions ------------------------------------------ */

int tks__cpu_convert(tks_backend *be, void *dst, tks_dtype ddt, const void *src, tks_dtype sdt,
                     size_t n) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "convert", ddt) || tks__cpu_check_dt(be, "convert", sdt)) return CTX(be)->err;
    if (ddt == sdt) {
        memmove(dst, src, n * tks_dtype_size(ddt));
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) st(dst, i, ld(src, i, sdt), ddt);
    return 0;
}

int tks__cpu_add(tks_backend *be, void *out, const void *a, const void *b, size_t n,
                 tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "add", dt)) return CTX(be)->err;
    enum { BLK = 16384 };
    size_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t k = 0; k < nb; k++) {
        size_t e = (k + 1) * BLK < n ? (k + 1) * BLK : n;
        DT_CALL(dt, add_k, out, a, b, k * BLK, e);
    }
    return 0;
}

int tks__cpu_scale(tks_backend *be, float *x, size_t n, float s) {
    STICKY(be);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}

/* The spans' concatenation cut into NCH fixed chunks (independent of the
 * thread count), each summed in fp64, the chunk sums added in order: the
 * result is the same for every thread count. */
enum { NCH = 64 };
int tks__cpu_sumsq(tks_backend *be, float *out, const float *x, const tks_span *spans,
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

int tks__cpu_sum(tks_backend *be, float *out, const float *x, size_t n, int accumulate) {
    STICKY(be);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    out[0] = (float)((accumulate ? (double)out[0] : 0.0) + s);
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
int tks__cpu_swiglu_fwd(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "swiglu_fwd", dt)) return CTX(be)->err;
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
int tks__cpu_swiglu_bwd(tks_backend *be, void *dgu, const void *dout, const void *gu, int M,
                        int F, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "swiglu_bwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < M; i++) DT_CALL(dt, swiglu_bwd_row, dgu, dout, gu, i, F);
    return 0;
}
