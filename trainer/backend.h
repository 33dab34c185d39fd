/*
 * backend.h - the compute interface between the model code and a backend
 * (trainer/cpu now, trainer/cuda later). Private to trainer/ and its tests.
 *
 * Every tensor argument is a DEVICE pointer obtained from be->alloc: the model
 * code may offset it but never dereferences it, so the same model code drives
 * a GPU backend. Data crosses to and from the host only through upload and
 * download. All tensors are fp32 and row-major unless said otherwise. Ops are
 * enqueued in order on the backend's stream; download and sync wait for them.
 *
 * Dimension legend (as in llm.c's train_gpt2.c):
 *   B batch, T sequence, N = B*T rows, C model dim, NH query heads,
 *   NKV key/value heads (GQA: NH % NKV == 0), HD head dim, F SwiGLU hidden dim,
 *   V vocab rows held by this process (the tensor-parallel shard of the padded
 *   vocabulary), v0 the global id of local row 0, VR the local rows that are
 *   real (not padding), Vmax the largest position handled by RoPE.
 */
#ifndef TKS_BACKEND_H
#define TKS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct tks_backend tks_backend;

struct tks_backend {
    const char *name; /* "cpu", "cuda" */
    void *ctx;

    /* ---- memory ---------------------------------------------------------- */
    /* Zero-filled device allocation of `bytes`; NULL when out of memory. */
    void *(*alloc)(tks_backend *be, size_t bytes);
    void (*free)(tks_backend *be, void *p);
    void (*upload)(tks_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(tks_backend *be, void *dst_host, const void *src, size_t bytes);
    void (*memzero)(tks_backend *be, void *p, size_t bytes);
    void (*copy)(tks_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(tks_backend *be);

    /* ---- dense algebra ---------------------------------------------------- */
    /* C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T (BLAS sgemm
     * semantics, row-major, lda/ldb/ldc are row strides in elements). */
    void (*gemm)(tks_backend *be, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
    /* out[i] = a[i] + b[i], i < n (out may alias a or b) */
    void (*add)(tks_backend *be, float *out, const float *a, const float *b, size_t n);
    /* x[i] *= s */
    void (*scale)(tks_backend *be, float *x, size_t n, float s);
    /* sum of x[i]^2 over n elements, accumulated in double; synchronous */
    double (*sumsq)(tks_backend *be, const float *x, size_t n);

    /* ---- embedding (vocab-parallel: rows [v0, v0 + V) live here) ----------- */
    /* out[N,C] = ids[i] in [v0, v0+V) ? w[ids[i]-v0, :] : 0   (ids: int32[N]) */
    void (*embedding_fwd)(tks_backend *be, float *out, const int32_t *ids, const float *w, int N,
                          int C, int64_t v0, int V);
    /* dw[ids[i]-v0, :] += dout[i, :] for ids in range */
    void (*embedding_bwd)(tks_backend *be, float *dw, const float *dout, const int32_t *ids, int N,
                          int C, int64_t v0, int V);

    /* ---- RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w ---- */
    /* out[N,C], rstd[N] saved for backward */
    void (*rmsnorm_fwd)(tks_backend *be, float *out, float *rstd, const float *x, const float *w,
                        int N, int C, float eps);
    /* dx[N,C] += ..., dw[C] += ... */
    void (*rmsnorm_bwd)(tks_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C);

    /* ---- RoPE (Su et al. 2021, "RoFormer"), Hugging Face LLaMA layout: the
     * pairs rotated together are (j, j + HD/2) ("rotate_half"). -------------- */
    /* Rotates x[B,T,H,HD] in place by position p0 + t, angle p * theta^(-2j/HD);
     * inverse != 0 rotates by -angle (the backward of the forward rotation). */
    void (*rope)(tks_backend *be, float *x, int B, int T, int H, int HD, int64_t p0, float theta,
                 int inverse);

    /* ---- causal self-attention with GQA ------------------------------------ */
    /* q[B,T,NH,HD], k,v[B,T,NKV,HD] -> out[B,T,NH,HD]; probs[B,NH,T,T] saved
     * (softmax(q k^T / sqrt(HD)) with the causal mask; query head h uses kv
     * head h / (NH/NKV)). */
    void (*attention_fwd)(tks_backend *be, float *out, float *probs, const float *q, const float *k,
                          const float *v, int B, int T, int NH, int NKV, int HD);
    /* dq, dk, dv are overwritten (not accumulated). */
    void (*attention_bwd)(tks_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *probs, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int HD);

    /* One query position t (decoding with a KV cache): q[NH,HD] attends to
     * kc, vc[0..t] (caches laid out [Tmax, NKV, HD]) -> out[NH,HD]. */
    void (*attention_step)(tks_backend *be, float *out, const float *q, const float *kc,
                           const float *vc, int t, int NH, int NKV, int HD);

    /* ---- SwiGLU (Shazeer 2020): out = silu(gate) * up, over n elements ------ */
    void (*swiglu_fwd)(tks_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* dgate, dup overwritten */
    void (*swiglu_bwd)(tks_backend *be, float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, size_t n);

    /* ---- cross-entropy over a (possibly vocab-parallel, padded) logits shard --
     * logits[N,V]; only the first VR columns are real vocabulary, the rest is
     * padding and is masked out (never predicted, no gradient). With tensor
     * parallelism the model all-reduces mx (max), sum and tgt (sum) over the
     * tp group between these stages (Megatron's vocab-parallel cross-entropy). */
    void (*xent_max)(tks_backend *be, float *mx, const float *logits, int N, int V, int VR);
    /* sum[i] = sum_j<VR exp(logits[i,j] - mx[i]) */
    void (*xent_sumexp)(tks_backend *be, float *sum, const float *logits, const float *mx, int N,
                        int V, int VR);
    /* tgt[i] = logits[i, targets[i]-v0] when the target is local, else 0 */
    void (*xent_target)(tks_backend *be, float *tgt, const float *logits, const int32_t *targets,
                        int N, int V, int64_t v0, int VR);
    /* loss[i] = log(sum[i]) + mx[i] - tgt[i] */
    void (*xent_loss)(tks_backend *be, float *loss, const float *mx, const float *sum,
                      const float *tgt, int N);
    /* dlogits[N,V] = scale * (softmax - onehot(target)) on real columns, 0 on padding */
    void (*xent_bwd)(tks_backend *be, float *dlogits, const float *logits, const float *mx,
                     const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR,
                     float scale);

    /* ---- AdamW (Loshchilov & Hutter 2019, decoupled weight decay) ----------
     * For i < n: g = grad[i] * grad_scale; m = b1 m + (1-b1) g;
     * v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p) */
    void (*adamw)(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, int64_t t, float grad_scale);

    void (*destroy)(tks_backend *be);
};

/* The CPU reference backend (OpenBLAS sgemm, OpenMP elsewhere). `threads`
 * 0 = OpenMP default. Returns NULL when out of memory. */
tks_backend *tks_cpu_backend_create(int threads);

#endif /* TKS_BACKEND_H */
