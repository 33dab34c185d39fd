/* cuda_stub.c - cuda.h in a build without CUDA (TKS_CUDA=OFF or no nvcc):
 * every constructor refuses with how to get a CUDA build. */
#include <stdio.h>

#include "common/tks.h"
#include "trainer/cuda/cuda.h"
#include "trainer/trainer.h"

#define NOT_BUILT                                                                              \
    tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,                                            \
             "this tokshard was built without CUDA: rebuild with the CUDA toolkit installed "    \
             "(cmake -DTKS_CUDA=ON, nvcc on PATH or CUDACXX set) or use --device cpu")

const tks_backend_kind *tks_cuda_backend_kind(void) { return NULL; }
int tks_cuda_built(void) { return 0; }
int tks_cuda_device_count(void) { return 0; }
int tks_cuda_backend_create(int device, tks_backend **out) {
    (void)device;
    *out = NULL;
    return NOT_BUILT;
}
int tks_cuda_backend_check(tks_backend *be) {
    (void)be;
    return NOT_BUILT;
}
size_t tks_cuda_backend_reserved(tks_backend *be) {
    (void)be;
    return 0;
}
int tks_nccl_world_create(tks_backend *be, tks_nccl_world **out) {
    (void)be;
    *out = NULL;
    return NOT_BUILT;
}
void tks_nccl_world_free(tks_nccl_world *w) { (void)w; }
int tks_nccl_comm_create(tks_nccl_world *w, tks_comm *ctrl, tks_comm **out) {
    (void)w, (void)ctrl;
    *out = NULL;
    return NOT_BUILT;
}
void tks_nccl_comm_free(tks_comm *c) { (void)c; }
int tks_nccl_allreduce_many(tks_comm *c, float *const *bufs, const size_t *n, int count) {
    (void)c, (void)bufs, (void)n, (void)count;
    return NOT_BUILT;
}
/* the functions below take a CUDA backend, which this build cannot create */
void tks_cuda_backend_memory(tks_backend *be, size_t *now, size_t *peak) {
    (void)be;
    if (now) *now = 0;
    if (peak) *peak = 0;
}
void *tks_cuda_backend_stream(tks_backend *be) {
    (void)be;
    return NULL;
}
void tks_cuda_describe(tks_backend *be, char *out, size_t cap) {
    (void)be;
    if (cap) snprintf(out, cap, "built without CUDA");
}
/* tks_cuda_set_NAME: a switch of that backend's kernels, nothing to switch here */
#define SWITCH_NOOP(name)                                \
    int tks_cuda_set_##name(tks_backend *be, int on) { \
        (void)be, (void)on;                              \
        return 0;                                        \
    }
SWITCH_NOOP(flash)
const char *tks_cuda_flash_status(tks_backend *be) {
    (void)be;
    return "built without CUDA";
}
SWITCH_NOOP(vec_optim)
SWITCH_NOOP(norm_onepass)
SWITCH_NOOP(rope_rows)
SWITCH_NOOP(xent_vec)
SWITCH_NOOP(swiglu_vec)
