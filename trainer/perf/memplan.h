/*
 * memplan.h - the device memory of one rank of a training run, planned
 * without allocating (the --dry-run figure) and used to explain an
 * out-of-memory failure. Private to trainer/.
 *
 * Every figure is bytes on the backend's device for world rank 0 of the
 * layout (every rank of a layout holds the same sizes), from the same sizing
 * functions the allocations use: tks_model_flat_elems (the flat buffers),
 * tks_model_activation_bytes (activations, backward scratch and the model's
 * workspace), tks_mem_grad_stage_elems and TKS_MEM_STEP_SCALARS (the
 * trainer's gradient staging buffer and step scalars), and the
 * backend's own fixed buffers (the CUDA backend's cuBLASLt workspace and
 * reduction partials: tks_cuda_backend_reserved).
 */
#ifndef TKS_MEMPLAN_H
#define TKS_MEMPLAN_H

#include <stddef.h>

#include "trainer/backend/backend.h"
#include "trainer/comm/mesh.h"
#include "trainer/model/model.h"

enum { TKS_MEM_WEIGHTS = 0, TKS_MEM_COMPUTE, TKS_MEM_GRADS, TKS_MEM_MOMENTS, TKS_MEM_GRAD_STAGE,
       TKS_MEM_ACTIVATIONS, TKS_MEM_BACKEND, TKS_MEM_N };

typedef struct tks_mem_plan {
    double bytes[TKS_MEM_N];  /* per part, in the order above */
    double total;
    size_t n_flat, n_slice;   /* flat buffer elements (tp-local), this rank's ZeRO slice */
} tks_mem_plan;

/* Elements (fp32) of the trainer's gradient staging buffer for a flat
 * buffer of n_flat elements under layout s: the reduce-scatter's input, every
 * slice's bucket packed side by side (grad_sync.c), so the whole tp-local
 * flat buffer when dp_shard > 1, and 0 when dp_shard is 1 (the all-reduce
 * works in place). The trainer allocates this many; the plan counts them. */
size_t tks_mem_grad_stage_elems(const tks_mesh_shape *s, size_t n_flat);

/* fp32 scalars the trainer keeps on the device for a step (train.c: gradient
 * sum of squares, loss sum, stop flag, one spare). */
#define TKS_MEM_STEP_SCALARS 4

/* "fp32 master weights", "bf16 compute copy", ... (one per TKS_MEM_*) */
const char *tks_mem_part_name(int part);

/*
 * Plans one rank of a run: model `cfg` under layout `s`, micro-batches of
 * B x T in dtype dt, on backend `be` (its workspace sizes; NULL: without
 * the workspace and the backend's own buffers). Returns 0, or TKS_ERR_ARG
 * for a config the model refuses (the model's message).
 */
int tks_mem_plan_make(const tks_model_config *cfg, const tks_mesh_shape *s, int B, int T,
                      tks_dtype dt, tks_backend *be, tks_mem_plan *out);

/* One line: every part in MiB and the total (written into out, cap bytes). */
void tks_mem_plan_format(const tks_mem_plan *p, char *out, size_t cap);

/*
 * Rewrites an out-of-memory error (the current context, from the backend or
 * the model) into one that names the run's largest buffers and what to change
 * (--micro-batch and --seq-len scale the activations, --dtype bf16 halves
 * them, --dp-shard divides the AdamW moments and --tp the weights), keeping
 * the original message after it. Returns TKS_ERR_NOMEM.
 */
int tks_mem_explain_nomem(const tks_model_config *cfg, const tks_mesh_shape *s, int B, int T,
                          tks_dtype dt, tks_backend *be);

#endif
