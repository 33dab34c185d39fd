/* cpu_backend.c - the CPU reference backend: fp32, OpenBLAS sgemm, OpenMP
 * elsewhere. Every reduction has a fixed order for a given thread count, so
 * a run is bit-reproducible on the same machine (resume relies on it).
 * Formulas and sources are in backend.h; legend: N rows, C dim, HD head dim. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"

/* OpenBLAS extension (declared in Debian's openblas cblas.h as well). */
void openblas_set_num_threads(int num_threads);

typedef struct cpu_ctx {
    int threads;
} cpu_ctx;

#define NT(be) (((cpu_ctx *)(be)->ctx)->threads)

static void *cpu_alloc(tks_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}
static void cpu_free(tks_backend *be, void *p) { (void)be; free(p); }
static void cpu_upload(tks_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static void cpu_download(tks_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static void cpu_memzero(tks_backend *be, void *p, size_t bytes) { (void)be; memset(p, 0, bytes); }
static void cpu_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}
static void cpu_sync(tks_backend *be) { (void)be; }

static void cpu_gemm(tks_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)be;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_add(tks_backend *be, float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_scale(tks_backend *be, float *x, size_t n, float s) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static double cpu_sumsq(tks_backend *be, const float *x, size_t n) {
    /* fixed blocks summed in order: the result does not depend on the thread count */
    enum { BLK = 4096 };
    size_t nb = (n + BLK - 1) / BLK;
    double *part = malloc((nb ? nb : 1) * sizeof *part);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t b = 0; b < nb; b++) {
        double s = 0;
        size_t e = (b + 1) * BLK < n ? (b + 1) * BLK : n;
        for (size_t i = b * BLK; i < e; i++) s += (double)x[i] * x[i];
        part[b] = s;
    }
    double s = 0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    return s;
}

static void cpu_embedding_fwd(tks_backend *be, float *out, const int32_t *ids, const float *w,
                              int N, int C, int64_t v0, int V) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        float *o = out + (size_t)i * C;
        if (r >= 0 && r < V) memcpy(o, w + (size_t)r * C, (size_t)C * sizeof *o);
        else memset(o, 0, (size_t)C * sizeof *o);
    }
}

static void cpu_embedding_bwd(tks_backend *be, float *dw, const float *dout, const int32_t *ids,
                              int N, int C, int64_t v0, int V) {
    /* parallel over columns: rows hit by several ids accumulate in id order */
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int c = 0; c < C; c++)
        for (int i = 0; i < N; i++) {
            int64_t r = (int64_t)ids[i] - v0;
            if (r >= 0 && r < V) dw[(size_t)r * C + c] += dout[(size_t)i * C + c];
        }
}

static void cpu_rmsnorm_fwd(tks_backend *be, float *out, float *rstd, const float *x,
                            const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * C;
        float ss = 0;
        for (int c = 0; c < C; c++) ss += xi[c] * xi[c];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[i] = r;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = xi[c] * r * w[c];
    }
}

static void cpu_rmsnorm_bwd(tks_backend *be, float *dx, float *dw, const float *dout,
                            const float *x, const float *w, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
        float r = rstd[i], dot = 0;
        for (int c = 0; c < C; c++) dot += gi[c] * w[c] * xi[c];
        float k = dot * r * r * r / (float)C;
        float *d = dx + (size_t)i * C;
        for (int c = 0; c < C; c++) d[c] += gi[c] * w[c] * r - k * xi[c];
    }
    /* dw: each thread owns a contiguous block of columns and walks the rows in
     * order, so every column's sum has the same order as before (bitwise the
     * same result) but the inner loop is contiguous and vectorizes over c */
#pragma omp parallel num_threads(NT(be))
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        float *s = calloc((size_t)(c1 > c0 ? c1 - c0 : 1), sizeof *s);
        for (int i = 0; i < N; i++) {
            const float *gi = dout + (size_t)i * C, *xi = x + (size_t)i * C;
            float r = rstd[i];
            for (int c = c0; c < c1; c++) s[c - c0] += gi[c] * xi[c] * r;
        }
        for (int c = c0; c < c1; c++) dw[c] += s[c - c0];
        free(s);
    }
}

static void cpu_rope(tks_backend *be, float *x, int B, int T, int H, int HD, int64_t p0,
                     float theta, int inverse) {
    int half = HD / 2;
    float *cs = malloc((size_t)T * half * 2 * sizeof *cs);
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
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                float *v = x + (((size_t)b * T + t) * H + h) * HD;
                const float *c = cs + (size_t)t * half * 2;
                for (int j = 0; j < half; j++) {
                    float x1 = v[j], x2 = v[j + half], co = c[2 * j], si = c[2 * j + 1];
                    v[j] = x1 * co - x2 * si;
                    v[j + half] = x2 * co + x1 * si;
                }
            }
    free(cs);
}

/* Attention per (batch, head) as two sgemm calls around a masked softmax:
 * S = scale Q K^T, P = softmax(S) (causal), O = P V. Strided views: a head's
 * rows in q are NH*HD apart, in k and v NKV*HD apart. Inside the parallel
 * loop OpenBLAS's OpenMP build runs each call on the calling thread. */
static void cpu_attention_fwd(tks_backend *be, float *out, float *probs, const float *q,
                              const float *k, const float *v, int B, int T, int NH, int NKV,
                              int HD) {
    int group = NH / NKV, qs = NH * HD, ks = NKV * HD;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(static) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / group;
            const float *Q = q + (size_t)b * T * qs + (size_t)h * HD;
            const float *K = k + (size_t)b * T * ks + (size_t)g * HD;
            const float *V = v + (size_t)b * T * ks + (size_t)g * HD;
            float *P = probs + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, scale, Q, qs, K, ks, 0.0f,
                        P, T);
            for (int t = 0; t < T; t++) {
                float *p = P + (size_t)t * T, mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) mx = p[u] > mx ? p[u] : mx;
                for (int u = 0; u <= t; u++) sum += (p[u] = expf(p[u] - mx));
                float inv = 1.0f / sum;
                for (int u = 0; u <= t; u++) p[u] *= inv;
                for (int u = t + 1; u < T; u++) p[u] = 0;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, P, T, V, ks, 0.0f,
                        out + (size_t)b * T * qs + (size_t)h * HD, qs);
        }
}

/* Backward per (batch, kv head), so that the dK and dV of a kv head are
 * written by one task: for each query head h of the group,
 *   dP = dO V^T, dS = P o (dP - rowsum(P o dP)) * scale,
 *   dQ = dS K,  dK += dS^T Q,  dV += P^T dO. */
static void cpu_attention_bwd(tks_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *probs, const float *q, const float *k, const float *v,
                              int B, int T, int NH, int NKV, int HD) {
    int group = NH / NKV, qs = NH * HD, ks = NKV * HD;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(static) num_threads(NT(be))
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            float *dS = malloc((size_t)T * T * sizeof *dS);
            const float *K = k + (size_t)b * T * ks + (size_t)g * HD;
            const float *V = v + (size_t)b * T * ks + (size_t)g * HD;
            float *dK = dk + (size_t)b * T * ks + (size_t)g * HD;
            float *dV = dv + (size_t)b * T * ks + (size_t)g * HD;
            for (int h = g * group; h < (g + 1) * group; h++) {
                const float *P = probs + ((size_t)b * NH + h) * T * T;
                const float *Q = q + (size_t)b * T * qs + (size_t)h * HD;
                const float *dO = dout + (size_t)b * T * qs + (size_t)h * HD;
                float beta = h == g * group ? 0.0f : 1.0f; /* the first head writes, the rest add */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, 1.0f, dO, qs, V, ks,
                            0.0f, dS, T);
                for (int t = 0; t < T; t++) {
                    const float *p = P + (size_t)t * T;
                    float *d = dS + (size_t)t * T, dot = 0;
                    for (int u = 0; u <= t; u++) dot += p[u] * d[u];
                    for (int u = 0; u <= t; u++) d[u] = p[u] * (d[u] - dot) * scale;
                    for (int u = t + 1; u < T; u++) d[u] = 0;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, dS, T, K, ks,
                            0.0f, dq + (size_t)b * T * qs + (size_t)h * HD, qs);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, 1.0f, dS, T, Q, qs, beta,
                            dK, ks);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, 1.0f, P, T, dO, qs, beta,
                            dV, ks);
            }
            free(dS);
        }
}

static void cpu_attention_step(tks_backend *be, float *out, const float *q, const float *kc,
                               const float *vc, int t, int NH, int NKV, int HD) {
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int h = 0; h < NH; h++) {
        int g = h / group;
        const float *qh = q + (size_t)h * HD;
        float *p = malloc((size_t)(t + 1) * sizeof *p);
        float mx = -INFINITY, sum = 0;
        for (int u = 0; u <= t; u++) {
            const float *ku = kc + ((size_t)u * NKV + g) * HD;
            float s = 0;
            for (int d = 0; d < HD; d++) s += qh[d] * ku[d];
            p[u] = s * scale;
            if (p[u] > mx) mx = p[u];
        }
        for (int u = 0; u <= t; u++) sum += (p[u] = expf(p[u] - mx));
        float *o = out + (size_t)h * HD;
        memset(o, 0, (size_t)HD * sizeof *o);
        for (int u = 0; u <= t; u++) {
            const float *vu = vc + ((size_t)u * NKV + g) * HD;
            for (int d = 0; d < HD; d++) o[d] += p[u] / sum * vu[d];
        }
        free(p);
    }
}

static void cpu_swiglu_fwd(tks_backend *be, float *out, const float *gate, const float *up,
                           size_t n) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_swiglu_bwd(tks_backend *be, float *dgate, float *dup, const float *dout,
                           const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dup[i] = dout[i] * g * s;
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    }
}

static void cpu_xent_max(tks_backend *be, float *mx, const float *logits, int N, int V, int VR) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float m = -INFINITY;
        for (int j = 0; j < VR; j++) m = l[j] > m ? l[j] : m;
        mx[i] = m;
    }
}

static void cpu_xent_sumexp(tks_backend *be, float *sum, const float *logits, const float *mx,
                            int N, int V, int VR) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float s = 0;
        for (int j = 0; j < VR; j++) s += expf(l[j] - mx[i]);
        sum[i] = s;
    }
}

static void cpu_xent_target(tks_backend *be, float *tgt, const float *logits,
                            const int32_t *targets, int N, int V, int64_t v0, int VR) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)targets[i] - v0;
        tgt[i] = (r >= 0 && r < VR) ? logits[(size_t)i * V + r] : 0.0f;
    }
}

static void cpu_xent_loss(tks_backend *be, float *loss, const float *mx, const float *sum,
                          const float *tgt, int N) {
    (void)be;
    for (int i = 0; i < N; i++) loss[i] = logf(sum[i]) + mx[i] - tgt[i];
}

static void cpu_xent_bwd(tks_backend *be, float *dlogits, const float *logits, const float *mx,
                         const float *sum, const int32_t *targets, int N, int V, int64_t v0,
                         int VR, float scale) {
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float *d = dlogits + (size_t)i * V;
        float inv = 1.0f / sum[i];
        for (int j = 0; j < VR; j++) d[j] = expf(l[j] - mx[i]) * inv * scale;
        for (int j = VR; j < V; j++) d[j] = 0;
        int64_t r = (int64_t)targets[i] - v0;
        if (r >= 0 && r < VR) d[r] -= scale;
    }
}

static void cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                      float lr, float b1, float b2, float eps, float wd, int64_t t,
                      float grad_scale) {
    /* same operation order as torch.optim.AdamW (single-tensor path) */
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    float step = lr / bc1, bc2s = sqrtf(bc2), decay = 1.0f - lr * wd;
#pragma omp parallel for schedule(static) num_threads(NT(be))
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        m[i] = m[i] * b1 + g * (1.0f - b1);
        v[i] = v[i] * b2 + g * g * (1.0f - b2);
        float denom = sqrtf(v[i]) / bc2s + eps;
        p[i] = p[i] * decay - step * m[i] / denom;
    }
}

static void cpu_destroy(tks_backend *be) {
    if (!be) return;
    free(be->ctx);
    free(be);
}

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
    be->name = "cpu";
    be->ctx = c;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_upload;
    be->download = cpu_download;
    be->memzero = cpu_memzero;
    be->copy = cpu_copy;
    be->sync = cpu_sync;
    be->gemm = cpu_gemm;
    be->add = cpu_add;
    be->scale = cpu_scale;
    be->sumsq = cpu_sumsq;
    be->embedding_fwd = cpu_embedding_fwd;
    be->embedding_bwd = cpu_embedding_bwd;
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->rope = cpu_rope;
    be->attention_fwd = cpu_attention_fwd;
    be->attention_bwd = cpu_attention_bwd;
    be->attention_step = cpu_attention_step;
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
    be->xent_max = cpu_xent_max;
    be->xent_sumexp = cpu_xent_sumexp;
    be->xent_target = cpu_xent_target;
    be->xent_loss = cpu_xent_loss;
    be->xent_bwd = cpu_xent_bwd;
    be->adamw = cpu_adamw;
    be->destroy = cpu_destroy;
    return be;
}
