/* cuda_ops_ref64.h - test_cuda_ops's CPU-as-GPU harness: the CPU backend
 * `cpu` with its arithmetic ops replaced by fp64 ones (cuda_ops_ref64.c says
 * which and why). The result shares cpu's state; its destroy destroys cpu.
 * One at a time (static storage). */
#ifndef TKS_TEST_CUDA_OPS_REF64_H
#define TKS_TEST_CUDA_OPS_REF64_H
#include "trainer/backend/backend.h"
tks_backend *tks_test_ref64_wrap(tks_backend *cpu);
#endif
