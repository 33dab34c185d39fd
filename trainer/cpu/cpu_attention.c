/* cpu_attention.c - RoPE and flash attention (forward, backward, one decode step)
 * on the CPU backend (backend.h). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "trainer/cpu/cpu_internal.h"

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
                return tks__cpu_op_fail(be, op, TKS_ERR_ARG,
                               "%s[%d, %d] = %d breaks the contract (%s): a caller bug", docs ? "doc" : "pos",
                               b, t, (int)x, docs ? "doc[b,0] = 0, doc[b,t] = doc[b,t-1] or t"
                                                  : "0 <= pos < T");
        }
    return 0;
}

int tks__cpu_rope(tks_backend *be, void *x, size_t ldx, int B, int T, int H, int HD, int64_t p0,
                  const int32_t *pos, float theta, int inverse, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "rope", dt) || tks__cpu_need_ws(be, "rope", (size_t)T * HD * sizeof(float)) ||
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

int tks__cpu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                           size_t ldq, const void *k, const void *v, size_t ldkv,
                           const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                           tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "attention_fwd", dt) ||
        tks__cpu_need_ws(be, "attention_fwd", tks__cpu_attn_fwd_ws(HD)) ||
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
                attn_fwd_block(tks__cpu_scratch(be, tks__cpu_attn_fwd_ws(HD)),
                               atw(out, row * ldo + (size_t)h * HD, dt),
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

int tks__cpu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                           const void *out, size_t ldo, const float *lse, const void *q,
                           size_t ldq, const void *k, const void *v, size_t ldkv,
                           const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                           tks_dtype dt) {
    STICKY(be);
    int group = NH / NKV;
    if (tks__cpu_check_dt(be, "attention_bwd", dt) ||
        tks__cpu_need_ws(be, "attention_bwd", tks__cpu_attn_bwd_ws(T, HD, group)) ||
        (doc && check_rows(be, "attention_bwd", doc, B, T, 1)))
        return CTX(be)->err;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            size_t row = (size_t)b * T;
            size_t ko = row * ldkv + (size_t)g * HD;
            attn_bwd_task(tks__cpu_scratch(be, tks__cpu_attn_bwd_ws(T, HD, group)), atw(dq, row * ldq, dt),
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
int tks__cpu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
                            const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    STICKY(be);
    if (tks__cpu_check_dt(be, "attention_step", dt) ||
        tks__cpu_need_ws(be, "attention_step", (size_t)(t + 1) * sizeof(float)))
        return CTX(be)->err;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int h = 0; h < NH; h++)
        DT_CALL(dt, attn_step_head, tks__cpu_scratch(be, (size_t)(t + 1) * sizeof(float)), out, q, kc, vc, t,
                h, h / group, NKV, HD, scale);
    return 0;
}
