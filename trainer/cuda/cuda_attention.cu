/* cuda_attention.cu - the CUDA backend's RoPE and attention (tokshard's own kernels) kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- RoPE (rotate_half; angles in fp32 as Hugging Face computes them) -------- */

template <typename T>
__global__ void k_rope(T *x, size_t ld, int rows, int T_, int H, int HD, int64_t p0, const int32_t *pos,
                       float theta, int inverse) {
    /* the frequencies once per block (the same powf as the CPU's table) */
    extern __shared__ float s_inv_freq[];
    int half = HD / 2, per = H * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        s_inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)HD);
    __syncthreads();
    /* rows (b, t) over blockIdx.y, a row's (head, pair) over the x threads:
     * 32-bit index arithmetic, one division per element */
    for (size_t row = blockIdx.y; row < (size_t)rows; row += gridDim.y) {
        int t = (int)(row % (size_t)T_);
        /* positions restarted per document (pos) or p0 + t, as the CPU's table */
        float p = (float)(pos ? (int64_t)pos[row] : p0 + t);
        for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < per; e += gridDim.x * blockDim.x) {
            int h = e / half, j = e - h * half;
            float a = p * s_inv_freq[j];
            float co, si;
            sincosf(a, &si, &co);
            if (inverse) si = -si;
            size_t o = row * ld + (size_t)h * HD;
            float x1 = ldv(x, o + j), x2 = ldv(x, o + j + half);
            stv(x, o + j, x1 * co - x2 * si);
            stv(x, o + j + half, x2 * co + x1 * si);
        }
    }
}
/* Angles once per row (TKS_CUDA_ROPE_ROWS; unverified on a GPU): block per
 * row (b, t), the row's HD/2 cos and sin computed once into shared memory
 * (the same p * inv_freq and sincosf as k_rope, so the same bits) and every
 * head's pairs rotated from them: H times fewer sincosf (q and k together:
 * NH + NKV heads a row). */
template <typename T>
__global__ void k_rope_rows(T *x, size_t ld, int rows, int T_, int H, int HD, int64_t p0, const int32_t *pos,
                            float theta, int inverse) {
    extern __shared__ float s_tab[]; /* inv_freq, cos, sin: HD/2 each */
    int half = HD / 2, per = H * half;
    float *s_inv = s_tab, *s_co = s_tab + half, *s_si = s_tab + 2 * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) s_inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)HD);
    __syncthreads();
    for (size_t row = blockIdx.x; row < (size_t)rows; row += gridDim.x) {
        int t = (int)(row % (size_t)T_);
        float p = (float)(pos ? (int64_t)pos[row] : p0 + t);
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            float co, si;
            sincosf(p * s_inv[j], &si, &co);
            s_co[j] = co;
            s_si[j] = inverse ? -si : si;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < per; e += blockDim.x) {
            int h = e / half, j = e - h * half;
            float co = s_co[j], si = s_si[j];
            size_t o = row * ld + (size_t)h * HD;
            float x1 = ldv(x, o + j), x2 = ldv(x, o + j + half);
            stv(x, o + j, x1 * co - x2 * si);
            stv(x, o + j + half, x2 * co + x1 * si);
        }
        __syncthreads(); /* the table is the next row's */
    }
}
int tks_cu_rope(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0,
                const int32_t *pos, float theta, int inverse, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "rope", dt);
    size_t pairs = (size_t)B * T * H * (HD / 2);
    if (!pairs) return 0;
    size_t sh = (size_t)(HD / 2) * sizeof(float);
    int rows = B * T, per = H * (HD / 2);
    if (c->rope_rows) {
        unsigned g = (unsigned)(rows < 65535 ? rows : 65535);
        if (dt == TKS_BF16)
            k_rope_rows<bf16><<<g, 256, 3 * sh, c->cur>>>((bf16 *)x, ld, rows, T, H, HD, p0, pos, theta, inverse);
        else
            k_rope_rows<float><<<g, 256, 3 * sh, c->cur>>>((float *)x, ld, rows, T, H, HD, p0, pos, theta, inverse);
        return LAUNCHED(c, "rope");
    }
    dim3 grid((unsigned)((per + 255) / 256), (unsigned)(rows < 65535 ? rows : 65535));
    BY_DT(dt, E, k_rope<E><<<grid, 256, sh, c->cur>>>((E *)x, ld, rows, T, H, HD, p0, pos, theta, inverse));
    return LAUNCHED(c, "rope");
}

/* ---- attention: tokshard's own kernels (fallback, and the fp32 reference) -----
 * Flash-style in memory (Dao et al. 2022): nothing of size T x T is stored;
 * the forward keeps lse[B,NH,T], the backward recomputes the probabilities.
 * One block per query row (b, h, t) with the row's scores in shared memory
 * (T floats); warps split the keys, lanes the head dimension. Quadratic work
 * like any exact attention, without the tiling that makes cuDNN's fast.
 * With packed documents (doc, backend.h) row t reads only the keys
 * lo = doc[b,t] .. t: the masked keys are never computed, so the work is the
 * rows' own documents', as in the CPU's block skipping. */

enum { ATT_THREADS = 128 };

/* s[u] = scale * q . k_u for lo <= u <= t; k rows `ks` elements apart */
template <typename T>
__device__ void att_scores(float *s, const T *q, const T *k, size_t ks, int lo, int t, int HD,
                           float scale) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int u = lo + w; u <= t; u += nw) {
        float d = 0;
        for (int e = lane; e < HD; e += 32) d += ldv(q, e) * ldv(k, (size_t)u * ks + e);
        d = warp_sum(d);
        if (lane == 0) s[u] = d * scale;
    }
    __syncthreads();
}

template <typename T>
__global__ void k_attention_fwd(T *out, size_t ldo, float *lse, const T *q, size_t ldq, const T *k,
                                const T *v, size_t ldkv, const int32_t *doc, int T_, int NH, int NKV,
                                int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    int lo = doc ? doc[(size_t)b * T_ + t] : 0;
    const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    const T *K = k + (size_t)b * T_ * ldkv + (size_t)g * HD;
    const T *Vv = v + (size_t)b * T_ * ldkv + (size_t)g * HD;
    att_scores(s, Q, K, ldkv, lo, t, HD, 1.0f / sqrtf((float)HD));
    float mx = -INFINITY;
    for (int u = lo + threadIdx.x; u <= t; u += blockDim.x) mx = fmaxf(mx, s[u]);
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0;
    for (int u = lo + threadIdx.x; u <= t; u += blockDim.x) sum += (s[u] = expf(s[u] - mx));
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    if (threadIdx.x == 0) lse[((size_t)b * NH + h) * T_ + t] = mx + logf(sum);
    __syncthreads();
    T *O = out + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = lo; u <= t; u++) o += s[u] * ldv(Vv, (size_t)u * ldkv + e);
        stv(O, e, o * inv);
    }
}

/* Backward, stage 1 per query row: p = exp(scale q.k - lse), dP = dO V^T,
 * D = dO . O (= rowsum(P o dP)), dS = p (dP - D) scale, dQ = dS K; D saved in
 * the workspace for stage 2. */
template <typename T>
__global__ void k_attention_bwd_q(T *dq, float *Dsave, const T *dout, const T *out, size_t ldo,
                                  const float *lse, const T *q, size_t ldq, const T *k, const T *v,
                                  size_t ldkv, const int32_t *doc, int T_, int NH, int NKV, int HD) {
    extern __shared__ float s[]; /* [2][T]: scores, then dP */
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    int lo = doc ? doc[(size_t)b * T_ + t] : 0;
    const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    const T *dO = dout + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    const T *O = out + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
    const T *K = k + (size_t)b * T_ * ldkv + (size_t)g * HD;
    const T *Vv = v + (size_t)b * T_ * ldkv + (size_t)g * HD;
    float scale = 1.0f / sqrtf((float)HD);
    float *sc = s, *dp = s + T_;
    att_scores(sc, Q, K, ldkv, lo, t, HD, scale);
    att_scores(dp, dO, Vv, ldkv, lo, t, HD, 1.0f);
    float D = 0;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) D += ldv(dO, e) * ldv(O, e);
    D = block_sum(D, red);
    float L = lse[((size_t)b * NH + h) * T_ + t];
    for (int u = lo + threadIdx.x; u <= t; u += blockDim.x) {
        float p = expf(sc[u] - L);
        sc[u] = p * (dp[u] - D) * scale;
    }
    if (threadIdx.x == 0) Dsave[((size_t)b * NH + h) * T_ + t] = D;
    __syncthreads();
    T *dQ = dq + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float a = 0;
        for (int u = lo; u <= t; u++) a += sc[u] * ldv(K, (size_t)u * ldkv + e);
        stv(dQ, e, a);
    }
}

/* Backward, stage 2 per key row (b, g, u): over the group's query heads and
 * t >= u that see u (doc[b,t] <= u: doc never decreases, so a warp stops at
 * its first t past u's document), with p = exp(scale q_t.k_u - lse_t) and dS = p (dO_t.V_u - D_t) scale:
 * dV[u] = sum p dO_t, dK[u] = sum dS q_t. Warp w takes t = u + w (mod nw),
 * lanes the head dims; per-warp partials in shared memory are added in warp
 * order at the end (deterministic). Shared: 2 * nw * HD floats. */
template <typename T>
__global__ void k_attention_bwd_kv(T *dk, T *dv, const T *dout, size_t ldo, const float *lse,
                                   const float *Dsave, const T *q, size_t ldq, const T *k,
                                   const T *v, size_t ldkv, const int32_t *doc, int T_, int NH,
                                   int NKV, int HD) {
    extern __shared__ float acc[]; /* [nw][HD] dK, then [nw][HD] dV */
    int u = blockIdx.x, g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *aK = acc + (size_t)w * HD, *aV = acc + (size_t)(nw + w) * HD;
    for (int e = lane; e < HD; e += 32) aK[e] = aV[e] = 0;
    const T *Ku = k + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    const T *Vu = v + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    float scale = 1.0f / sqrtf((float)HD);
    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *Lh = lse + ((size_t)b * NH + h) * T_, *Dh = Dsave + ((size_t)b * NH + h) * T_;
        for (int t = u + w; t < T_; t += nw) {
            if (doc && doc[(size_t)b * T_ + t] > u) break; /* warp-uniform: t is the warp's */
            const T *dO = dout + ((size_t)b * T_ + t) * ldo + (size_t)h * HD;
            const T *Q = q + ((size_t)b * T_ + t) * ldq + (size_t)h * HD;
            float qk = 0, dp = 0;
            for (int e = lane; e < HD; e += 32) {
                qk += ldv(Q, e) * ldv(Ku, e);
                dp += ldv(dO, e) * ldv(Vu, e);
            }
            qk = warp_sum(qk);
            dp = warp_sum(dp);
            float p = expf(qk * scale - Lh[t]);
            float ds = p * (dp - Dh[t]) * scale;
            for (int e = lane; e < HD; e += 32) {
                aV[e] += p * ldv(dO, e);
                aK[e] += ds * ldv(Q, e);
            }
        }
    }
    __syncthreads();
    T *dK = dk + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    T *dV = dv + ((size_t)b * T_ + u) * ldkv + (size_t)g * HD;
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float sk = 0, sv = 0;
        for (int i = 0; i < nw; i++) {
            sk += acc[(size_t)i * HD + e];
            sv += acc[(size_t)(nw + i) * HD + e];
        }
        stv(dK, e, sk);
        stv(dV, e, sv);
    }
}

/* decode: one block per head, scores over the cache rows 0..t */
template <typename T>
__global__ void k_attention_step(T *out, const T *q, const T *kc, const T *vc, int t, int NH,
                                 int NKV, int HD) {
    extern __shared__ float s[];
    __shared__ float red[32];
    int h = blockIdx.x, g = h / (NH / NKV);
    size_t ks = (size_t)NKV * HD;
    att_scores(s, q + (size_t)h * HD, kc + (size_t)g * HD, ks, 0, t, HD, 1.0f / sqrtf((float)HD));
    float mx = -INFINITY;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) mx = fmaxf(mx, s[u]);
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) sum += (s[u] = expf(s[u] - mx));
    sum = block_sum(sum, red);
    __syncthreads();
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float o = 0;
        for (int u = 0; u <= t; u++) o += s[u] * ldv(vc, (size_t)u * ks + (size_t)g * HD + e);
        stv(out, (size_t)h * HD + e, o / sum);
    }
}

/* Raises a kernel's dynamic shared memory limit when a row needs more than
 * the default 48 KiB (T above 12288 in fp32 scores). */
static int att_smem(tks_cuda_ctx *c, const void *fn, size_t bytes, const char *op) {
    if (bytes <= 48 * 1024) return 0;
    if (bytes > (size_t)c->prop.sharedMemPerBlockOptin) {
        char why[200];
        snprintf(why, sizeof why,
                 "sequence too long for tokshard's attention kernel (%zu bytes of shared memory "
                 "per row, the device allows %zu): use a shorter --seq-len",
                 bytes, (size_t)c->prop.sharedMemPerBlockOptin);
        return arg_fail(c, op, why);
    }
    return tks_cuda_check_rt(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)bytes), op);
}

/* cuDNN's SDPA graphs here are causal over whole rows: packed documents
 * (doc) run tokshard's own kernel, and tks_cuda_flash_status says so. */
static const char NO_CUDNN_DOCS[] =
    "document masking (--doc-mask): the cuDNN graphs are causal over whole rows, so tokshard's "
    "own kernel runs the block-causal mask";

/* 1 when cuDNN is to be tried (bf16, flash on, no documents); with
 * documents, flash_why says why it is not. */
static int flash_wanted(tks_cuda_ctx *c, tks_dtype dt, const int32_t *doc) {
    if (dt != TKS_BF16 || !c->flash) return 0;
    if (doc) snprintf(c->flash_why, sizeof c->flash_why, "%s", NO_CUDNN_DOCS);
    return !doc;
}

/* After a cuDNN call that returned rc: 1 when it ran; else 0, its error
 * kept in flash_why and cleared (tokshard's own kernel runs instead). */
static int flash_ran(tks_cuda_ctx *c, int rc) {
    if (!rc) {
        c->flash_why[0] = 0;
        return 1;
    }
    snprintf(c->flash_why, sizeof c->flash_why, "%s", tks_last_error()->message);
    tks_clear_error();
    return 0;
}

int tks_cu_attention_fwd(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                         size_t ldq, const void *k, const void *v, size_t ldkv, const int32_t *doc,
                         int B, int T, int NH, int NKV, int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_fwd", dt);
    if (B <= 0 || T <= 0) return 0;
    if (flash_wanted(c, dt, doc) &&
        flash_ran(c, tks_cudnn_attention_fwd(be, c->cur, c->ws, c->ws_bytes, out, ldo, lse, q, ldq, k, v, ldkv, B,
                                             T, NH, NKV, HD)))
        return 0;
    size_t sm = (size_t)T * sizeof(float);
    dim3 grid(T, NH, B);
    BY_DT(dt, E, {
        if (att_smem(c, (const void *)k_attention_fwd<E>, sm, "attention_fwd")) return c->err;
        k_attention_fwd<E><<<grid, ATT_THREADS, sm, c->cur>>>((E *)out, ldo, lse, (const E *)q, ldq, (const E *)k,
                                                              (const E *)v, ldkv, doc, T, NH, NKV, HD);
    });
    return LAUNCHED(c, "attention_fwd");
}

int tks_cu_attention_bwd(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                         const void *out, size_t ldo, const float *lse, const void *q, size_t ldq,
                         const void *k, const void *v, size_t ldkv, const int32_t *doc, int B, int T,
                         int NH, int NKV, int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_bwd", dt);
    if (B <= 0 || T <= 0) return 0;
    if (flash_wanted(c, dt, doc) &&
        flash_ran(c, tks_cudnn_attention_bwd(be, c->cur, c->ws, c->ws_bytes, dq, dk, dv, dout, out, ldo, lse, q,
                                             ldq, k, v, ldkv, B, T, NH, NKV, HD, c->deterministic)))
        return 0;
    size_t need = (size_t)B * NH * T * sizeof(float);
    if (!c->ws || c->ws_bytes < need) {
        char why[160];
        snprintf(why, sizeof why, "needs %zu bytes of workspace, %zu were set (size it with "
                 "workspace_bytes at these shapes)", need, c->ws_bytes);
        return arg_fail(c, "attention_bwd", why);
    }
    float *D = (float *)c->ws;
    size_t sm = 2 * (size_t)T * sizeof(float), sm2 = 2 * (ATT_THREADS / 32) * (size_t)HD * sizeof(float);
    dim3 gq(T, NH, B), gkv(T, NKV, B);
    BY_DT(dt, E, {
        if (att_smem(c, (const void *)k_attention_bwd_q<E>, sm, "attention_bwd") ||
            att_smem(c, (const void *)k_attention_bwd_kv<E>, sm2, "attention_bwd"))
            return c->err;
        k_attention_bwd_q<E><<<gq, ATT_THREADS, sm, c->cur>>>((E *)dq, D, (const E *)dout, (const E *)out, ldo,
                                                              lse, (const E *)q, ldq, (const E *)k, (const E *)v,
                                                              ldkv, doc, T, NH, NKV, HD);
        if (LAUNCHED(c, "attention_bwd (dq)")) return c->err;
        k_attention_bwd_kv<E><<<gkv, ATT_THREADS, sm2, c->cur>>>((E *)dk, (E *)dv, (const E *)dout, ldo, lse, D,
                                                                 (const E *)q, ldq, (const E *)k, (const E *)v,
                                                                 ldkv, doc, T, NH, NKV, HD);
    });
    return LAUNCHED(c, "attention_bwd (dk, dv)");
}

int tks_cu_attention_step(tks_backend *be, void *out, const void *q, const void *kc,
                             const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "attention_step", dt);
    size_t sm = (size_t)(t + 1) * sizeof(float);
    BY_DT(dt, E, {
        if (att_smem(c, (const void *)k_attention_step<E>, sm, "attention_step")) return c->err;
        k_attention_step<E><<<NH, ATT_THREADS, sm, c->cur>>>((E *)out, (const E *)q, (const E *)kc, (const E *)vc,
                                                             t, NH, NKV, HD);
    });
    return LAUNCHED(c, "attention_step");
}
