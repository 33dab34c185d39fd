/*
 * backend.h - the compute interface between the model code and a backend
 * (trainer/cpu, the reference, and trainer/cuda), contract version 4. Private to
 * trainer/ and its tests. docs/BACKENDS.md explains it for someone writing a
 * backend; this header is the reference.
 *
 * Pointers. Every tensor argument is a DEVICE pointer obtained from be->alloc:
 * the model code may offset it but never dereferences it. Data crosses to and
 * from the host only through upload and download. Row-major throughout.
 *
 * Dtypes. A tensor's element type is stated by the op: weight gradients,
 * master weights, AdamW moments and statistics (rstd, lse, loss, norms) are
 * always fp32; activations, activation gradients and the compute weights an
 * op reads are of the op's `dt` argument (fp32 or bf16). bf16 values are made
 * from fp32 by round-to-nearest-even (tks_bf16_from_f32); arithmetic inside
 * an op is fp32 whatever the storage type.
 *
 * Ordering. Ops are enqueued in call order on the backend's current stream
 * (set_stream; NULL = the default stream) and may run asynchronously;
 * upload and download are ordered on the same stream and return when the
 * host buffer may be reused / holds the data. Cross-stream order only through
 * events. A backend without asynchrony (cpu) runs each op before returning.
 *
 * Errors. Every op returns 0 or a negative TKS_ERR_* code. A failure is
 * sticky: the backend keeps the first one (code and op name), every later op
 * returns that code without running, and sync returns it, with the error
 * context (tks_last_error) naming the op, its shapes and what to do. An
 * asynchronous backend may return 0 from the op and report the failure at the
 * next sync: callers check sync at least once per step.
 *
 * Allocation. Only alloc allocates device memory. Ops never allocate: scratch
 * comes from the workspace the model sizes with workspace_bytes and hands
 * over with set_workspace before the first op.
 *
 * Dimension legend (as in llm.c's train_gpt2.c):
 *   B batch, T sequence, N = B*T rows, C model dim, NH query heads,
 *   NKV key/value heads (GQA: NH % NKV == 0), HD head dim, F SwiGLU hidden dim,
 *   V vocab rows held by this process (the tensor-parallel shard of the padded
 *   vocabulary), v0 the global id of local row 0, VR the local rows that are
 *   real (not padding).
 *
 * Packed documents: attention_fwd and attention_bwd take `doc` (block-causal
 * attention within each document; NULL: causal) and rope takes `pos`
 * (positions per token; NULL: p0 + t). add_rmsnorm_fwd is the residual add
 * fused with the RMSNorm that reads its result (add then rmsnorm_fwd, bit
 * for bit).
 */
#ifndef TKS_BACKEND_H
#define TKS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef enum tks_dtype {
    TKS_F32 = 0, /* IEEE binary32 */
    TKS_BF16 = 1 /* bfloat16: the upper 16 bits of a binary32 */
} tks_dtype;

static inline size_t tks_dtype_size(tks_dtype dt) { return dt == TKS_BF16 ? 2 : 4; }
static inline const char *tks_dtype_name(tks_dtype dt) { return dt == TKS_BF16 ? "bf16" : "fp32"; }

/* fp32 -> bf16, round to nearest, ties to even; NaN stays a (quiet) NaN;
 * and back (defined in comm_self.c, shared with the comm contract; a backend
 * may inline its own copy in its kernels). */
uint16_t tks_bf16_from_f32(float f);
float tks_bf16_to_f32(uint16_t h);

typedef struct tks_backend tks_backend;
typedef struct tks_backend_ops tks_backend_ops;
typedef struct tks_backend_kind tks_backend_kind;
typedef struct tks_comm tks_comm;
typedef struct tks_stream tks_stream; /* backend-defined; NULL = default stream */
typedef struct tks_event tks_event;
typedef struct tks_timer tks_timer;   /* backend-defined: marks for per-op timing */

/* The shapes a model will run, for workspace_bytes: the backend returns the
 * scratch the largest op needs at these shapes. */
typedef struct tks_ws_shape {
    int B, T, C, NH, NKV, HD, F, V; /* V: local vocab rows */
    int Tcache;                     /* longest KV cache attention_step reads */
    tks_dtype dt;                   /* activation dtype */
} tks_ws_shape;

/* C[M,N] = alpha * op(A) @ op(B)  (+ C when accumulate), op(X) = X or X^T.
 * lda/ldb/ldc are row strides in elements. A is [M,K] (trans_a: [K,M]), B is
 * [K,N] (trans_b: [N,K]). Products and sums in `compute` (fp32 is the only
 * compute type in contracts 2 and 3); C is read (accumulate) and written in c_type.
 * The weight-gradient GEMMs of mixed precision are a_type = b_type = bf16,
 * c_type = fp32, accumulate = 1. */
typedef struct tks_gemm_args {
    int trans_a, trans_b;
    int M, N, K;
    float alpha;
    const void *A;
    tks_dtype a_type;
    size_t lda;
    const void *B;
    tks_dtype b_type;
    size_t ldb;
    void *C;
    tks_dtype c_type;
    size_t ldc;
    tks_dtype compute;
    int accumulate;
} tks_gemm_args;

/* A run of the flat parameter buffer for the multi-tensor ops: elements
 * [off, off + n) with weight decay wd (0 for RMSNorm weights). */
typedef struct tks_span {
    size_t off, n;
    float wd;
} tks_span;

/* AdamW (Loshchilov & Hutter 2019, decoupled weight decay) hyperparameters
 * of one step; t counts steps from 1. */
typedef struct tks_adamw_hp {
    float lr, b1, b2, eps;
    int64_t t;
    float clip; /* global-norm clip threshold, <= 0: no clipping */
} tks_adamw_hp;

/*
 * The operations of a backend: one `static const` table per backend
 * (cpu_backend.c, cuda_backend.cu), reached from an instance as be->ops.
 */
struct tks_backend_ops {

    /* ---- memory ---------------------------------------------------------- */
    /* Zero-filled device allocation of `bytes`, aligned to 64 bytes; NULL when
     * out of memory (not sticky: the caller reports it). */
    void *(*alloc)(tks_backend *be, size_t bytes);
    void (*free)(tks_backend *be, void *p);
    int (*upload)(tks_backend *be, void *dst, const void *src_host, size_t bytes);
    int (*download)(tks_backend *be, void *dst_host, const void *src, size_t bytes);
    int (*memzero)(tks_backend *be, void *p, size_t bytes);
    int (*copy)(tks_backend *be, void *dst, const void *src, size_t bytes);
    /* Waits for every op enqueued on every stream; returns the sticky error
     * (0 when none). The only call that surfaces an asynchronous failure. */
    int (*sync)(tks_backend *be);
    /* Scratch for the ops: bytes needed at shapes `s` (the caller takes the
     * max over every shape it will run), then the buffer (from alloc) that ops
     * use until the next set_workspace. An op whose scratch does not fit fails
     * with TKS_ERR_ARG naming the op. */
    size_t (*workspace_bytes)(tks_backend *be, const tks_ws_shape *s);
    int (*set_workspace)(tks_backend *be, void *ws, size_t bytes);

    /* ---- streams and events ----------------------------------------------- */
    int (*stream_create)(tks_backend *be, tks_stream **out);
    void (*stream_destroy)(tks_backend *be, tks_stream *s);
    /* Ops and copies after this call go to stream s (NULL = default). */
    int (*set_stream)(tks_backend *be, tks_stream *s);
    int (*event_create)(tks_backend *be, tks_event **out);
    void (*event_destroy)(tks_backend *be, tks_event *e);
    /* Marks the point of the current stream reached so far. */
    int (*event_record)(tks_backend *be, tks_event *e);
    /* The current stream waits (on the device) for the work before e. */
    int (*stream_wait)(tks_backend *be, tks_event *e);
    /* The host waits for the work before e. */
    int (*event_sync)(tks_backend *be, tks_event *e);

    /* ---- dense algebra and element-wise ----------------------------------- */
    int (*gemm)(tks_backend *be, const tks_gemm_args *g);
    /* dst[n] (dst_dt) = src[n] (src_dt), rounding to nearest even into bf16 */
    int (*convert)(tks_backend *be, void *dst, tks_dtype dst_dt, const void *src,
                   tks_dtype src_dt, size_t n);
    /* out[i] = a[i] + b[i], i < n, all of dt (out may alias a or b) */
    int (*add)(tks_backend *be, void *out, const void *a, const void *b, size_t n, tks_dtype dt);
    /* x[i] *= s, fp32 */
    int (*scale)(tks_backend *be, float *x, size_t n, float s);
    /* out[0] (fp32, device) (= or += when accumulate) sum over the spans of
     * x[off..off+n)^2, x fp32; summed in fp64 inside the op. */
    int (*sumsq)(tks_backend *be, float *out, const float *x, const tks_span *spans,
                 size_t nspans, int accumulate);
    /* out[0] (fp32, device) (= or +=) sum of x[n] (fp32) */
    int (*sum)(tks_backend *be, float *out, const float *x, size_t n, int accumulate);

    /* ---- embedding (vocab-parallel: rows [v0, v0 + V) live here) ----------- */
    /* out[N,C] (dt) = ids[i] in [v0, v0+V) ? w[ids[i]-v0, :] : 0; w[V,C] (dt),
     * ids int32[N] */
    int (*embedding_fwd)(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                         int C, int64_t v0, int V, tks_dtype dt);
    /* dw[ids[i]-v0, :] (fp32) += dout[i, :] (dt) for ids in range */
    int (*embedding_bwd)(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N,
                         int C, int64_t v0, int V, tks_dtype dt);

    /* ---- RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w ---- */
    /* out[N,C] (dt), rstd[N] (fp32) saved for backward; x[N,C], w[C] (dt) */
    int (*rmsnorm_fwd)(tks_backend *be, void *out, float *rstd, const void *x, const void *w,
                       int N, int C, float eps, tks_dtype dt);
    /* dx[N,C] (dt) += ..., dw[C] (fp32) += ... */
    int (*rmsnorm_bwd)(tks_backend *be, void *dx, float *dw, const void *dout, const void *x,
                       const void *w, const float *rstd, int N, int C, tks_dtype dt);
    /* The residual add and the RMSNorm after it in one pass:
     * res[N,C] (dt) = a + b, rounded to dt as add rounds it, then out[N,C]
     * (dt) and rstd[N] (fp32) = rmsnorm_fwd of res with w[C] (dt). The same
     * bits as add(res, a, b) followed by rmsnorm_fwd(out, rstd, res, w) on the
     * same backend; res may alias a or b (not out). */
    int (*add_rmsnorm_fwd)(tks_backend *be, void *res, void *out, float *rstd, const void *a,
                           const void *b, const void *w, int N, int C, float eps, tks_dtype dt);

    /* ---- RoPE (Su et al. 2021, "RoFormer"), Hugging Face LLaMA layout: the
     * pairs rotated together are (j, j + HD/2) ("rotate_half"). -------------- */
    /* Rotates x[B,T,H,HD] (dt) in place by position p, angle
     * p * theta^(-2j/HD); inverse != 0 rotates by -angle (the backward).
     * p = p0 + t when pos is NULL; else p = pos[b*T + t], pos a device
     * int32[B,T] with every value in [0, T) (positions that restart at each
     * packed document: t - doc[b,t], see attention_fwd); an out-of-range
     * value fails the op (TKS_ERR_ARG) where the backend can check it.
     * Rows of x are `ld` elements apart (ld >= H*HD: a view into a fused
     * q|k|v row). */
    int (*rope)(tks_backend *be, void *x, size_t ld, int B, int T, int H, int HD, int64_t p0,
                const int32_t *pos, float theta, int inverse, tks_dtype dt);

    /* ---- causal self-attention with GQA, flash style (Dao et al. 2022) ----
     * q[B,T,NH,HD] rows ldq apart, k,v[B,T,NKV,HD] rows ldkv apart (views into
     * a fused qkv row are allowed), out[B,T,NH,HD] rows ldo apart, all dt.
     * out = softmax(q k^T / sqrt(HD), mask) v; query head h uses kv head
     * h / (NH/NKV). Saves only lse[B,NH,T] (fp32, natural log of the row's
     * sum of exp of the scaled scores). No T x T buffer.
     * Mask: doc NULL: causal, query t sees keys u <= t. Otherwise doc is a
     * device int32[B,T] of packed documents: doc[b,t] is the position in row
     * b where token t's document starts, and query t sees keys
     * doc[b,t] <= u <= t only (block-causal: a document never sees another).
     * A row is whole documents back to back: doc[b,0] = 0 and doc[b,t] is
     * doc[b,t-1] or t. Key blocks that a query block cannot see are skipped,
     * so short documents cost less than the causal mask. */
    int (*attention_fwd)(tks_backend *be, void *out, size_t ldo, float *lse, const void *q,
                         size_t ldq, const void *k, const void *v, size_t ldkv,
                         const int32_t *doc, int B, int T, int NH, int NKV, int HD, tks_dtype dt);
    /* Recomputes the probabilities from q, k and lse under the same mask
     * (doc as in the forward). dq (ldq), dk, dv (ldkv) are overwritten (not
     * accumulated); dout, out rows ldo apart. */
    int (*attention_bwd)(tks_backend *be, void *dq, void *dk, void *dv, const void *dout,
                         const void *out, size_t ldo, const float *lse, const void *q, size_t ldq,
                         const void *k, const void *v, size_t ldkv, const int32_t *doc, int B,
                         int T, int NH, int NKV, int HD, tks_dtype dt);
    /* One query position t (decoding with a KV cache): q[NH,HD] attends to
     * kc, vc[0..t] (caches laid out [Tmax, NKV, HD]) -> out[NH,HD]; all dt. */
    int (*attention_step)(tks_backend *be, void *out, const void *q, const void *kc,
                          const void *vc, int t, int NH, int NKV, int HD, tks_dtype dt);

    /* ---- SwiGLU (Shazeer 2020): out = silu(gate) * up --------------------- */
    /* gate and up are the two halves of each row of gu[M, 2F] (gate first:
     * the fused gate|up GEMM's output); out[M,F]; all dt. */
    int (*swiglu_fwd)(tks_backend *be, void *out, const void *gu, int M, int F, tks_dtype dt);
    /* dgu[M,2F] overwritten from dout[M,F] and gu */
    int (*swiglu_bwd)(tks_backend *be, void *dgu, const void *dout, const void *gu, int M, int F,
                      tks_dtype dt);

    /* ---- cross-entropy over a (possibly vocab-parallel, padded) logits shard --
     * logits[N,V] (dt); only the first VR columns are real vocabulary, the rest
     * is padding and is masked out (never predicted, no gradient).
     *
     * A row whose target is negative is ignored (a packed window's padding): its
 * loss is 0 and its dlogits row 0, in every variant below.
 *
 * Fused (one process holds the whole vocabulary, tp = 1): loss[i] (fp32) =
     * logsumexp_j<VR logits[i,j] - logits[i,target], and logits is overwritten
     * IN PLACE by dlogits = scale * (softmax - onehot(target)) (0 on padding),
     * row chunk by row chunk, so [N,V] is never held twice. */
    int (*xent_fused)(tks_backend *be, float *loss, void *logits, const int32_t *targets, int N,
                      int V, int VR, float scale, tks_dtype dt);
    /* Staged (vocab-parallel, tp > 1): the model all-reduces mx (max), sum and
     * tgt (sum) over the tp group between these stages (Megatron's
     * vocab-parallel cross-entropy). mx, sum, tgt, loss fp32 [N]. */
    int (*xent_max)(tks_backend *be, float *mx, const void *logits, int N, int V, int VR,
                    tks_dtype dt);
    /* sum[i] = sum_j<VR exp(logits[i,j] - mx[i]) */
    int (*xent_sumexp)(tks_backend *be, float *sum, const void *logits, const float *mx, int N,
                       int V, int VR, tks_dtype dt);
    /* tgt[i] = logits[i, targets[i]-v0] when the target is local, else 0;
     * NaN for an ignored row (target < 0), which the tp sum keeps */
    int (*xent_target)(tks_backend *be, float *tgt, const void *logits, const int32_t *targets,
                       int N, int V, int64_t v0, int VR, tks_dtype dt);
    /* loss[i] = log(sum[i]) + mx[i] - tgt[i]; 0 where tgt[i] is NaN (ignored) */
    int (*xent_loss)(tks_backend *be, float *loss, const float *mx, const float *sum,
                     const float *tgt, int N);
    /* dlogits[N,V] (dt) = scale * (softmax - onehot(target)) on real columns, 0
     * on padding; dlogits may be logits (in place). */
    int (*xent_bwd)(tks_backend *be, void *dlogits, const void *logits, const float *mx,
                    const float *sum, const int32_t *targets, int N, int V, int64_t v0, int VR,
                    float scale, tks_dtype dt);

    /* ---- the optimizer step, one call over the flat buffer ----------------
     * For each span and i in it, with g = grad[i] * grad_scale * clip_factor,
     * clip_factor = min(1, clip / sqrt(*gnorm_sq)) read ON THE DEVICE from
     * gnorm_sq (fp32 [1], the global sum of squares; NULL or clip <= 0: 1):
     *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
     *   p = p (1 - lr wd) - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
     * (the operation order of torch.optim.AdamW). p, grad fp32 are indexed by
     * span offsets; m, v fp32 by offset - base (the optimizer's slice starts
     * at element `base` of the flat buffer). When pc is not NULL it is the
     * compute copy of the weights (pc_dt, indexed like p) and pc[i] is
     * refreshed from the new p[i] (round to nearest even into bf16).
     * A non-finite *gnorm_sq skips the update (the caller reports it). */
    int (*adamw)(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t base,
                 const tks_span *spans, size_t nspans, const tks_adamw_hp *hp, float grad_scale,
                 const float *gnorm_sq, void *pc, tks_dtype pc_dt);

    /* Frees the backend and everything it allocated (after a sync). */
    void (*destroy)(tks_backend *be);
};

/* One backend: its kind (kind->name is "cpu", "cuda") and its state. */
struct tks_backend {
    const tks_backend_ops *ops;   /* kind->ops, or the --profile wrappers of them (profile.c) */
    const tks_backend_kind *kind;
    void *ctx;                    /* the backend's own state */
};

/*
 * A kind of backend as the registry holds it (trainer.h declares the
 * registry; backend_registry.c keeps it). The CPU reference is always
 * registered; another kind registers itself through tks_backend_register
 * before the first run, so that a program that does not link it (the data
 * tool) never loads its libraries. Members a kind does not have are NULL.
 */
struct tks_backend_kind {
    const char *name;             /* --device NAME */
    const tks_backend_ops *ops;
    /* Devices usable now (0: none; the CPU reports 1). */
    int (*device_count)(void);
    /* A new backend: threads is the CPU's (0 = OpenMP's default), other
     * kinds pick their device themselves (cuda.h). 0 or TKS_ERR_*, with the
     * error context set. */
    int (*create)(int threads, tks_backend **out);
    /* Device bytes held outside ops->alloc (workspaces fixed at creation),
     * for the memory plan; NULL: none. */
    size_t (*reserved)(tks_backend *be);
    /* Bytes held through ops->alloc now and at most so far; NULL: not counted. */
    void (*memory)(tks_backend *be, size_t *now, size_t *peak);
    /* One line: device, driver and library versions; NULL: none. */
    void (*describe)(tks_backend *be, char *out, size_t cap);
    /* on = 1: run-to-run identical bits where the fast path is not (cuDNN's
     * attention backward, whose fast algorithm adds dQ with atomics), at the
     * deterministic algorithm's cost in speed and workspace (a T x T buffer
     * per head on Hopper); call before the model is created, which sizes the
     * workspace. NULL: the kind is deterministic always (the CPU). */
    int (*set_deterministic)(tks_backend *be, int on);
    /* Per-op timing (--profile, profile.c) without waiting between ops:
     * timer_create makes room for `marks` marks (0 or TKS_ERR_*, with the
     * error context set); timer_mark records mark i (< marks) at the point
     * the current stream has reached (CPU: the host clock now, its ops having
     * run; CUDA: an event recorded on the stream) and never waits;
     * timer_read waits for marks [0, n) and writes secs[k] = seconds from
     * mark 2k to mark 2k + 1, k < n / 2 (the two marks of a pair on the same
     * stream); a sticky error makes mark and read return it. NULL: the kind
     * has no timer, and the profile syncs around each op and reads the host
     * clock. */
    int (*timer_create)(tks_backend *be, size_t marks, tks_timer **out);
    int (*timer_mark)(tks_backend *be, tks_timer *t, size_t i);
    int (*timer_read)(tks_backend *be, tks_timer *t, size_t n, double *secs);
    void (*timer_destroy)(tks_backend *be, tks_timer *t);
    /* Which attention kernel runs for dtype dt ("cuDNN", "tokshard kernel
     * (cuDNN not used)"); NULL: tokshard's own. */
    void (*attention_name)(tks_backend *be, tks_dtype dt, char *out, size_t cap);
    /* Collectives that move this backend's device memory between processes
     * (NCCL for cuda), used by the mesh for its groups (mesh.c); NULL when
     * the kind has none (the groups then are MPI's, staged through host
     * memory for a device backend). comm_name names it for --comm and logs.
     * world_create is collective over MPI_COMM_WORLD; group_create over the
     * world, once per group kind in the same order on every rank, ctrl being
     * the MPI comm of the same group (borrowed, outlives the result). */
    const char *comm_name;
    int (*comm_world_create)(tks_backend *be, void **world);
    void (*comm_world_free)(void *world);
    int (*comm_group_create)(void *world, tks_comm *ctrl, tks_comm **out);
    void (*comm_group_free)(tks_comm *c);
};

/* The CPU reference backend (OpenBLAS sgemm, OpenMP elsewhere). `threads`
 * 0 = OpenMP default. Returns NULL when out of memory. */
tks_backend *tks_cpu_backend_create(int threads);
extern const tks_backend_kind tks_cpu_backend_kind;

/* A registered kind by name, or NULL (backend_registry.c). */
const tks_backend_kind *tks_backend_find(const char *name);

/* The one factory: `device` a registered kind's name ("cpu", "cuda") or
 * "auto" (the first registered kind other than cpu with a device, else cpu).
 * Errors: TKS_ERR_ARG (unknown name, a kind this program was not built with,
 * no device: the message says which and what to do), TKS_ERR_NOMEM. */
int tks_backend_create(const char *device, int threads, tks_backend **out);

#endif /* TKS_BACKEND_H */
