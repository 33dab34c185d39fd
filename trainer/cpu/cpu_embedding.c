/* cpu_embedding.c - the embedding lookup and its gradient on the CPU backend
 * (backend.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

/* ---- embedding ---------------------------------------------------------------- */

int tks__cpu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                           int C, int64_t v0, int V, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "embedding_fwd", dt)) return CTX(be)->err;
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
int tks__cpu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids,
                           int N, int C, int64_t v0, int V, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "embedding_bwd", dt)) return CTX(be)->err;
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
