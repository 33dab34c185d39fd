/* cuda_util.cu - what every kernel family of the CUDA backend calls: the
 * sticky error from a CUDA runtime or cuBLAS status, the device-to-device
 * copy, and the backend's stream for cuDNN and NCCL (cuda_internal.h,
 * cuda.h). */
#include <stdio.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- errors ------------------------------------------------------------------ */

int tks_cuda_fail(tks_cuda_ctx *c, const char *op, const char *reason) {
    if (!c->err) {
        c->err = TKS_ERR_IO;
        snprintf(c->err_msg, sizeof c->err_msg,
                 "CUDA backend: %s failed on device %d: %s; later ops were skipped. Rerun with "
                 "CUDA_LAUNCH_BLOCKING=1 to find the failing kernel, or --device cpu",
                 op, c->device, reason);
    }
    return 1;
}

int tks_cuda_check_rt(tks_cuda_ctx *c, cudaError_t e, const char *op) {
    if (e == cudaSuccess) return 0;
    if (e == cudaErrorMemoryAllocation && !c->err) {
        c->err = TKS_ERR_NOMEM;
        snprintf(c->err_msg, sizeof c->err_msg,
                 "CUDA backend: %s: out of device memory: lower --micro-batch or --seq-len", op);
        return 1;
    }
    return tks_cuda_fail(c, op, cudaGetErrorString(e));
}

int tks_cuda_check_blas(tks_cuda_ctx *c, cublasStatus_t s, const char *op) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return tks_cuda_fail(c, op, cublasGetStatusString(s));
}

/* ---- the copy and the stream ------------------------------------------------- */

int tks_cu_copy(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->cur), "copy");
    return c->err;
}

extern "C" void *tks_cuda_backend_stream(tks_backend *be) {
    return (void *)tks_cuda_ctx_of(be)->stream;
}
