/*
 * optim.h - AdamW over the model's flat parameter buffer, global-norm
 * gradient clipping and the learning-rate schedule. Private to trainer/.
 *
 * The optimizer owns a contiguous slice [begin, end) of the flat buffer (all
 * of it with one process; 1/dp_shard of it under ZeRO-style sharding, issue
 * 4), and keeps the AdamW moments for that slice only. Weight decay applies
 * to matrices (tks_param.decay), never to RMSNorm weights.
 */
#ifndef TKS_OPTIM_H
#define TKS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/model/model.h"

typedef struct tks_adamw_opts {
    float lr;            /* peak learning rate */
    float min_lr;        /* floor of the cosine decay */
    uint64_t warmup;     /* linear warmup steps */
    uint64_t total;      /* steps of the schedule (cosine reaches min_lr here) */
    float beta1, beta2, eps, weight_decay;
    float grad_clip;     /* max global L2 norm; 0 = no clipping */
} tks_adamw_opts;

typedef struct tks_optim tks_optim;

/* Moments for the slice [begin, end) of the flat buffer, zero-initialized.
 * Errors: TKS_ERR_NOMEM, TKS_ERR_ARG. */
int tks_optim_create(tks_model *m, const tks_adamw_opts *o, size_t begin, size_t end,
                     tks_optim **out);
void tks_optim_free(tks_optim *op);

/* Learning rate at 0-based step s: lr * (s+1)/warmup during warmup, then a
 * cosine from lr to min_lr over [warmup, total) (Loshchilov & Hutter 2017,
 * SGDR), min_lr afterwards. */
float tks_lr_at(const tks_adamw_opts *o, uint64_t step);

/* Applies one AdamW step (step t = 1, 2, ...) to the slice with the given
 * learning rate; grads are multiplied by grad_scale first (clipping decided
 * by the caller). One multi-tensor backend call over the slice. */
int tks_optim_step(tks_optim *op, int64_t t, float lr, float grad_scale);

/* The device-side step: as tks_optim_step, with the clip factor
 * min(1, grad_clip / sqrt(gnorm_sq[0])) computed on the device from the
 * global sum of squares gnorm_sq (fp32 device scalar, from
 * tks_optim_grad_sumsq summed over the mesh); no host round trip. A
 * non-finite gnorm_sq leaves the weights unchanged. */
int tks_optim_step_dev(tks_optim *op, int64_t t, float lr, const float *gnorm_sq);

/* out[0] (fp32 device scalar) = sum of squares of the slice's gradients,
 * counting tensors replicated over tp (RMSNorm weights) only when
 * count_replicated (tp rank 0), so that the sum over the tp and dp_shard
 * groups counts every element once. */
int tks_optim_grad_sumsq(tks_optim *op, float *out, int count_replicated);

/* Clip factor for a global gradient norm: min(1, clip / norm). */
float tks_clip_scale(const tks_adamw_opts *o, double norm);

/* Device pointers to the slice's moments (n = end - begin elements each). */
float *tks_optim_m(tks_optim *op);
float *tks_optim_v(tks_optim *op);
size_t tks_optim_begin(const tks_optim *op);
size_t tks_optim_end(const tks_optim *op);

#endif
