/*
 * tks_cuda.h - the public header of the CUDA backend's library (tks_cuda,
 * libtks_cuda.so): its entry point, as each backend keeps its own. A
 * program that runs models registers the kind (tks_backend_register,
 * trainer.h); everything else of the backend is private (cuda.h).
 */
#ifndef TKS_CUDA_PUBLIC_H
#define TKS_CUDA_PUBLIC_H

#include "trainer/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend's kind: --device cuda. NULL in a build without CUDA
 * (cuda_stub.c), which registering accepts and ignores. */
const tks_backend_kind *tks_cuda_backend_kind(void);

#ifdef __cplusplus
}
#endif

#endif /* TKS_CUDA_PUBLIC_H */
