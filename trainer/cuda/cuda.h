/*
 * cuda.h - the CUDA backend (backend.h on an NVIDIA GPU) and the NCCL
 * implementation of comm.h. Private to trainer/ and its tests.
 *
 * Built when CMake finds nvcc (TKS_CUDA=AUTO|ON, cmake/cuda.cmake); without
 * it trainer/cuda/cuda_stub.c provides the same functions, which refuse with a
 * message saying how to build with CUDA. Every function returns 0 or a
 * negative TKS_ERR_* code with the error context set (common/tks.h).
 *
 * Streams and errors. Every op of the backend is enqueued on one stream of
 * the backend; upload is ordered on it, download and sync wait for it. A
 * failing CUDA or cuBLAS call makes the backend's error STICKY: the first
 * failure (op name, CUDA's message, the fix) is kept, later ops become no-ops
 * and tks_cuda_backend_check returns it. The NCCL comm runs collectives on its
 * own stream, ordered after the compute stream's work by an event and before
 * later compute work by another, so model code sees the same order as with
 * the blocking MPI comm.
 */
#ifndef TKS_CUDA_H
#define TKS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "../comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this binary was built with the CUDA backend. */
int tks_cuda_built(void);

/* Visible CUDA devices (0 when not built, no driver or no device). */
int tks_cuda_device_count(void);

/*
 * Creates the CUDA backend on `device` (-1: the value of TKS_CUDA_DEVICE if
 * set, else the MPI local rank (OMPI_COMM_WORLD_LOCAL_RANK) modulo the device
 * count, else 0). Allocates the stream, the cuBLASLt handle and its one
 * workspace. Errors: TKS_ERR_ARG (not built, no device, device out of range:
 * the message says which and what to do), TKS_ERR_NOMEM, TKS_ERR_IO (driver).
 */
int tks_cuda_backend_create(int device, tks_backend **out);

/* The backend's sticky error: 0, or the first failure since creation with its
 * context (op, CUDA's message, what to do) set again on this thread. Waits
 * for the stream. */
int tks_cuda_backend_check(tks_backend *be);

/* Bytes allocated now and at most so far through be->alloc on this backend
 * (the --dry-run estimate is checked against these). */
void tks_cuda_backend_memory(tks_backend *be, size_t *now, size_t *peak);

/* The backend's cudaStream_t, as a pointer (for the NCCL comm). */
void *tks_cuda_backend_stream(tks_backend *be);

/* Device name, compute capability, driver/runtime/cuBLAS/cuDNN/NCCL versions,
 * one line (for logs and the benchmark). */
void tks_cuda_describe(tks_backend *be, char *out, size_t cap);

/* ---- bf16 mixed precision (the contract v2 ops; tested by test_cuda_ops) ---
 * bf16 values are uint16_t bit patterns (the upper half of an fp32, rounded
 * to nearest even). */

/* dst[i] = bf16(src[i]), round to nearest even; NaN stays NaN. */
void tks_cuda_to_bf16(tks_backend *be, uint16_t *dst, const float *src, size_t n);
/* dst[i] = float(src[i]) (exact). */
void tks_cuda_from_bf16(tks_backend *be, float *dst, const uint16_t *src, size_t n);

/* C[M,N] (fp32) = alpha op(A) op(B) + beta C with A, B bf16, fp32 compute and
 * accumulation (cuBLASLt, CUBLAS_COMPUTE_32F); row-major like be->gemm.
 * beta = 1 accumulates weight gradients into fp32. */
void tks_cuda_gemm_bf16(tks_backend *be, int trans_a, int trans_b, int M, int N, int K,
                        float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                        float beta, float *C, int ldc);

/* Multi-tensor AdamW over the flat buffer (one launch): fp32 master weights p,
 * fp32 moments m, v, fp32 gradients; the update reads grad_scale from DEVICE
 * memory (the clip factor computed on the device) and writes the bf16 copy
 * p16 (may be NULL). Formula as be->adamw. */
void tks_cuda_adamw_flat(tks_backend *be, float *p, uint16_t *p16, const float *grad, float *m,
                         float *v, size_t n, float lr, float b1, float b2, float eps, float wd,
                         int64_t t, const float *grad_scale_dev);

/* Deterministic global norm without atomics: out[0] (device, fp32) =
 * sqrt(sum over k of sumsq(x_k[0..n_k))) for `count` tensors. Stage 1: a fixed
 * grid of blocks writes partial sums (double) in a fixed order; stage 2: one
 * block adds them in that order. Same bits on every run and every GPU model.
 * Also writes out[1] = min(1, max_norm / (norm + 1e-6)) (the clip factor;
 * max_norm <= 0: 1). */
void tks_cuda_global_norm(tks_backend *be, float *out, const float *const *x, const size_t *n,
                          int count, float max_norm);

/* Fused residual add + RMSNorm forward: res[N,C] += x (x may be NULL: no add),
 * out = rmsnorm(res) * w, rstd[N] saved; out is written as fp32 and, when
 * out16 != NULL, as bf16. */
void tks_cuda_residual_rmsnorm_fwd(tks_backend *be, float *res, float *out, uint16_t *out16,
                                   float *rstd, const float *x, const float *w, int N, int C,
                                   float eps);

/* Fused chunked classifier: for rows [0, N) of logits[N,V] (fp32; VR real
 * columns), writes loss[i] and overwrites the row IN PLACE with
 * dlogits = scale (softmax - onehot) (no second [N,V] buffer): one pass for the
 * max and sum (online softmax), one to write the gradient. targets global
 * ids, v0 = 0 (tp = 1). */
void tks_cuda_xent_fused(tks_backend *be, float *logits, float *loss, const int32_t *targets,
                         int N, int V, int VR, float scale);

/* Attention through cuDNN's fused flash attention (bf16 q, k, v [B,T,H,HD],
 * causal, GQA; forward saves lse[B,NH,T] fp32; deterministic backward), graphs
 * cached per shape. Errors: TKS_ERR_ARG when built without the cuDNN frontend
 * or the shape is not supported (the caller falls back to be->attention_*). */
int tks_cuda_flash_fwd(tks_backend *be, uint16_t *out, float *lse, const uint16_t *q,
                       const uint16_t *k, const uint16_t *v, int B, int T, int NH, int NKV, int HD);
int tks_cuda_flash_bwd(tks_backend *be, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                       const uint16_t *dout, const uint16_t *out, const float *lse,
                       const uint16_t *q, const uint16_t *k, const uint16_t *v, int B, int T,
                       int NH, int NKV, int HD);

/* ---- NCCL -------------------------------------------------------------------- */

typedef struct tks_nccl_world tks_nccl_world;

/*
 * The world communicator: rank 0 calls ncclGetUniqueId, MPI_COMM_WORLD
 * broadcasts it, every rank calls ncclCommInitRank on the backend's device.
 * Collective over MPI_COMM_WORLD (MPI must be initialized). Errors:
 * TKS_ERR_ARG (not built, backend not cuda), TKS_ERR_IO (NCCL, with its
 * message and NCCL_DEBUG=WARN as the next step).
 */
int tks_nccl_world_create(tks_backend *be, tks_nccl_world **out);
void tks_nccl_world_free(tks_nccl_world *w);

/*
 * The NCCL form of one mesh group: `ctrl` is the MPI comm of the same group
 * (mesh.c builds and checks it against the plan); the NCCL communicator is
 * split from the world with ncclCommSplit(color = the lowest world rank of
 * ctrl's members, key = ctrl->rank), then checked member by member: every
 * member's world rank, gathered over the NEW communicator, must equal
 * ctrl->members, else TKS_ERR_ARG naming both lists. Collective over the
 * world: every rank calls it for every group kind, in the same order.
 *
 * Contract v2 (comm.h): start enqueues the collective (fp32 or bf16, size_t
 * counts: NCCL's counts are size_t, nothing is cut) on the group's own stream
 * after an event recorded on the backend's stream; wait makes the backend's
 * stream wait for it (stream-ordered completion: the host does not block).
 * The blocking forms are start + wait. Control collectives (gatherv_host,
 * agree, broadcast_bytes) go to ctrl; barrier completes the device work, then
 * ctrl's barrier. NCCL's asynchronous errors are polled at every call and
 * while waiting; the first aborts the communicator and is returned as
 * TKS_ERR_IO ("NCCL <op> failed on the <group> group ...") by that and every
 * later call, so tks_comm_agree on ctrl spreads it.
 */
int tks_nccl_comm_create(tks_nccl_world *w, tks_comm *ctrl, tks_comm **out);
void tks_nccl_comm_free(tks_comm *c);

/* Several fp32 sum all-reduces as one NCCL group call (ncclGroupStart/End),
 * completed in stream order like wait. */
int tks_nccl_allreduce_many(tks_comm *c, float *const *bufs, const size_t *n, int count);

#ifdef __cplusplus
}
#endif

#endif /* TKS_CUDA_H */
