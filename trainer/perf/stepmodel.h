/* stepmodel.h - the roofline cost of every backend op (stepmodel.c), which
 * the step model (tks_step_model, trainer.h) and the profile's "model ms"
 * column (profile.h) share, so that the prediction and the measurement count
 * the same calls. Sources of the numbers: docs/GPU.md, "The step model".
 * Private to trainer/. */
#ifndef TKS_STEPMODEL_H
#define TKS_STEPMODEL_H

#include <stddef.h>

#include "trainer/backend/backend.h"
#include "trainer/trainer.h"

/* The compute and transfer operations of backend.h, one row each. */
typedef enum tks_op {
    TKS_OP_UPLOAD,
    TKS_OP_DOWNLOAD,
    TKS_OP_MEMZERO,
    TKS_OP_COPY,
    TKS_OP_GEMM,
    TKS_OP_CONVERT,
    TKS_OP_ADD,
    TKS_OP_SCALE,
    TKS_OP_SUMSQ,
    TKS_OP_SUM,
    TKS_OP_EMBEDDING_FWD,
    TKS_OP_EMBEDDING_BWD,
    TKS_OP_RMSNORM_FWD,
    TKS_OP_RMSNORM_BWD,
    TKS_OP_ADD_RMSNORM_FWD,
    TKS_OP_ROPE,
    TKS_OP_ATTENTION_FWD,
    TKS_OP_ATTENTION_BWD,
    TKS_OP_ATTENTION_STEP,
    TKS_OP_SWIGLU_FWD,
    TKS_OP_SWIGLU_BWD,
    TKS_OP_XENT_FUSED,
    TKS_OP_XENT_MAX,
    TKS_OP_XENT_SUMEXP,
    TKS_OP_XENT_TARGET,
    TKS_OP_XENT_LOSS,
    TKS_OP_XENT_BWD,
    TKS_OP_ADAMW,
    TKS_N_OPS
} tks_op;
extern const char *const tks_op_names[TKS_N_OPS];

/* What one call of an op costs: tensor-core (or, in fp32, plain) FLOPs of
 * its matrix products, bytes it moves through device memory (each operand
 * read once and each result written once: the ideal of a fused kernel), and
 * bytes over the host link. Element-wise arithmetic is not counted: on the
 * GPUs modelled it is always memory-bound. */
typedef struct tks_cost {
    double flops;
    int flops_dt;      /* tks_dtype of the products' inputs (the peak that applies) */
    double bytes;      /* device memory */
    double link_bytes; /* host <-> device */
} tks_cost;

/* The costs (es = bytes per element of the op's dtype). Formulas: GEMM 2MNK
 * FLOPs; causal attention forward 2·B·NH·T²·HD FLOPs (half of the 4·B·NH·T²·HD
 * of QKᵀ and PV), backward 2.5 times that (FlashAttention-2's five products
 * against two: Dao, 2023); the rest in docs/GPU.md, "The step model". */
tks_cost tks_cost_gemm(const tks_gemm_args *g);
tks_cost tks_cost_link(double bytes);             /* upload, download */
/* The row-wise and element-wise ops on N rows of C elements (add, scale,
 * sum, sumsq: N elements, C 1; memzero, copy: N bytes, C 1; rope: N = B·T
 * rows of C = H·HD; swiglu: C = F; xent_*: C = the padded vocabulary;
 * add_rmsnorm_fwd: reads a, b and w, writes the sum, the normalized rows
 * and rstd). */
tks_cost tks_cost_rows(tks_op op, double N, double C, size_t es);
tks_cost tks_cost_attention(int B, int T, int NH, int NKV, int HD, size_t es, int backward);
tks_cost tks_cost_adamw(double n, size_t pc_es);  /* pc_es 0: no compute copy */
/* Seconds of one call on hw: max(FLOPs / peak, bytes / bandwidth) + link bytes / link
 * bandwidth (the roofline; launch latency not counted). */
double tks_cost_secs(const tks_cost *c, const tks_roofline *hw);

#endif /* TKS_STEPMODEL_H */
