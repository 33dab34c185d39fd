/*
 * cuda.h - the CUDA backend (backend.h on an NVIDIA GPU) and the NCCL
 * implementation of comm.h. Private to trainer/ and its tests.
 *
 * Built when CMake finds nvcc (TKS_CUDA=AUTO|ON, cmake/cuda.cmake); without
 * it trainer/cuda/cuda_stub.c provides the same functions, which refuse with a
 * message saying how to build with CUDA. Every function returns 0 or a
 * negative TKS_ERR_* code with the error context set (common/tks.h).
 *
 * The backend implements backend.h (docs/BACKENDS.md): fp32
 * and bf16 storage with fp32 arithmetic, cuBLASLt GEMMs, flash-style
 * attention that saves only lse, streams and events mapped to CUDA's, and a
 * sticky error: the first failing CUDA/cuBLAS call (op name, CUDA's message,
 * the fix) is kept, later ops return it without running, and be->sync and
 * tks_cuda_backend_check report it. The NCCL comm runs collectives on its
 * own stream, ordered after the compute stream's work by an event and before
 * later compute work by another, so model code sees the same order as with
 * the blocking MPI comm.
 */
#ifndef TKS_CUDA_H
#define TKS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/backend/backend.h"
#include "trainer/comm/comm.h"
#include "trainer/cuda/tks_cuda.h"

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

/* Device bytes the backend holds outside be->alloc: the cuBLASLt workspace
 * and the reductions' partials (fixed at creation; the memory plan adds them;
 * 0 in a build without CUDA). */
size_t tks_cuda_backend_reserved(tks_backend *be);

/* The backend's cudaStream_t, as a pointer (for the NCCL comm). */
void *tks_cuda_backend_stream(tks_backend *be);

/* Device name, compute capability, driver/runtime/cuBLAS/cuDNN/NCCL versions,
 * one line (for logs and the benchmark). */
void tks_cuda_describe(tks_backend *be, char *out, size_t cap);

/* cuDNN's fused flash attention for the bf16 attention ops (when built with
 * the cuDNN frontend): on by default, off with TKS_CUDNN_ATTENTION=0 or
 * on = 0 here. Returns 1 when it is in use after the call. A shape or stride
 * cuDNN does not support, and packed documents (the block-causal mask of
 * --doc-mask, which these graphs do not express), fall back to tokshard's
 * own kernel; tks_cuda_flash_status says which runs and why ("" when cuDNN
 * ran). */
int tks_cuda_set_flash(tks_backend *be, int on);
const char *tks_cuda_flash_status(tks_backend *be);

/* The vectorized optimizer step (unverified on a GPU, off by default): on = 1
 * runs sumsq, sum and adamw over 16-byte quads of the spans (phase 1, the
 * gradient's sum of squares reading each gradient once; phase 2, the clip
 * read on the device and the update in one pass over p, grad, m, v and the
 * compute copy), the same contract and operation order per element as the
 * scalar kernels. TKS_CUDA_VEC_OPTIM=1 turns it on at creation. Returns the
 * state after the call (0 in a build without CUDA). */
int tks_cuda_set_vec_optim(tks_backend *be, int on);

/* The one-pass RMSNorm backward (unverified on a GPU, off by default): on = 1
 * computes rmsnorm_bwd's dx and its rows' share of dw in one pass over each
 * row chunk (dout and x read once from memory, not twice), the chunks' dw
 * partials then added in chunk order; dx has the two-kernel form's bits, dw
 * a fixed order that depends on the shape and the workspace. Call before the
 * model is created (it sizes the workspace for RMS_ONEPASS_CHUNKS chunks).
 * TKS_CUDA_NORM_ONEPASS=1 turns it on at creation. Returns the state. */
int tks_cuda_set_norm_onepass(tks_backend *be, int on);

/* RoPE's angles once per row (unverified on a GPU, off by default): on = 1
 * computes cos and sin of a row's HD/2 angles once into shared memory and
 * rotates every head of q and k (one call: backend.h's rope over H heads)
 * from them, instead of one sincosf per element; the same angles and
 * arithmetic, so the same bits. TKS_CUDA_ROPE_ROWS=1 turns it on at
 * creation. Returns the state. */
int tks_cuda_set_rope_rows(tks_backend *be, int on);

/* xent_fused with 16-byte accesses (unverified on a GPU, off by default):
 * on = 1 reads and writes each row in 16-byte vectors (8 bf16 or 4 fp32
 * logits a load, one rescale of the running sum a vector in the online
 * softmax) where the row length allows (V a multiple of the vector, the
 * buffer 16-byte aligned), else the scalar kernel runs; the same contract,
 * another summation order. TKS_CUDA_XENT_VEC=1 turns it on at creation.
 * Returns the state. */
int tks_cuda_set_xent_vec(tks_backend *be, int on);

/* SwiGLU forward and backward with 16-byte accesses (unverified on a GPU,
 * off by default): on = 1 takes 8 bf16 or 4 fp32 adjacent columns a thread
 * where F and the alignment allow, else the scalar kernels; each element's
 * arithmetic is theirs, so the same bits. TKS_CUDA_SWIGLU_VEC=1 turns it on
 * at creation. Returns the state. */
int tks_cuda_set_swiglu_vec(tks_backend *be, int on);

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
 * The comm contract (comm.h): start enqueues the collective (fp32 or bf16, size_t
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
