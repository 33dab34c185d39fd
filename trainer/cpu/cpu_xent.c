/* cpu_xent.c - cross-entropy over (vocab-sharded) logits on the CPU backend
 * (backend.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

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
    if (targets[i] < 0) { /* ignored (a packed window's padding): no loss, no gradient */
        loss[i] = 0.0f;
        for (int j = 0; j < V; j++) st(logits, o + j, 0.0f, dt);
        return;
    }
    float mx = row_max(logits, o, VR, dt), sum = row_sumexp(logits, o, VR, mx, dt);
    int64_t r = targets[i];
    float tgt = r >= 0 && r < VR ? ld(logits, o + r, dt) : 0.0f;
    loss[i] = logf(sum) + mx - tgt;
    row_dlogits(logits, logits, o, V, VR, mx, sum, r, scale, dt);
}
int tks__cpu_xent_fused(tks_backend *be, float *loss, void *logits, const int32_t *targets,
                        int N, int V, int VR, float scale, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "xent_fused", dt)) return CTX(be)->err;
    /* a row chunk is one row here: read twice (max, sum of exp), then
     * overwritten by its gradient while it is in cache */
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) DT_CALL(dt, xent_fused_row, loss, logits, targets, i, V, VR, scale);
    return 0;
}

int tks__cpu_xent_max(tks_backend *be, float *mx, const void *logits, int N, int V, int VR,
                      tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "xent_max", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) mx[i] = DT_CALL(dt, row_max, logits, (size_t)i * V, VR);
    return 0;
}

int tks__cpu_xent_sumexp(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                         int V, int VR, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "xent_sumexp", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) sum[i] = DT_CALL(dt, row_sumexp, logits, (size_t)i * V, VR, mx[i]);
    return 0;
}

int tks__cpu_xent_target(tks_backend *be, float *tgt, const void *logits,
                         const int32_t *targets, int N, int V, int64_t v0, int VR, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "xent_target", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)targets[i] - v0;
        /* an ignored row (target < 0) is marked NaN, which the tp sum keeps
         * and xent_loss turns into a loss of 0 */
        tgt[i] = targets[i] < 0 ? NAN : (r >= 0 && r < VR) ? ld(logits, (size_t)i * V + (size_t)r, dt) : 0.0f;
    }
    return 0;
}

int tks__cpu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                       const float *tgt, int N) {
    STICKY(be);
    for (int i = 0; i < N; i++) loss[i] = isnan(tgt[i]) ? 0.0f : logf(sum[i]) + mx[i] - tgt[i];
    return 0;
}

int tks__cpu_xent_bwd(tks_backend *be, void *dlogits, const void *logits, const float *mx,
                      const float *sum, const int32_t *targets, int N, int V, int64_t v0,
                      int VR, float scale, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "xent_bwd", dt)) return CTX(be)->err;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0) { /* ignored: no gradient */
            for (int j = 0; j < V; j++) st(dlogits, (size_t)i * V + j, 0.0f, dt);
            continue;
        }
        DT_CALL(dt, row_dlogits, dlogits, logits, (size_t)i * V, V, VR, mx[i], sum[i],
                (int64_t)targets[i] - v0, scale);
    }
    return 0;
}
