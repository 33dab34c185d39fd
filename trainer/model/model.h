/*
 * model.h - the LLaMA model: parameters, activations, forward and backward,
 * driven through a backend (backend.h) and, for tensor parallelism, a tp
 * group (comm.h). Private to trainer/ and its tests.
 *
 * Architecture (Touvron et al. 2023, "LLaMA"; Hugging Face LlamaForCausalLM
 * names and layouts): token embedding; n_layers x (RMSNorm -> causal
 * self-attention with RoPE and GQA -> residual; RMSNorm -> SwiGLU MLP ->
 * residual); final RMSNorm; lm_head (untied unless tie_embeddings).
 *
 * Legend: B micro-batch, T sequence, N = B*T, C dim, NH heads, NKV kv heads,
 * HD = C/NH head dim, F ffn dim, V vocab_size (real), VP padded vocab,
 * suffix _l for this tp rank's share (NH_l = NH/tp, F_l = F/tp, VP_l = VP/tp).
 *
 * Vocab padding: VP = round_up(V, vocab_divisible_by * tp). Rows [V, VP) of the
 * embedding and lm_head exist only inside the process: they start at zero,
 * are masked out of the softmax (never predicted, no gradient, no loss), and
 * are never saved (checkpoints hold [V, C]).
 */
#ifndef TKS_MODEL_H
#define TKS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/backend/backend.h"
#include "trainer/comm/comm.h"
#include "trainer/trainer.h"

/* tks_model_config is part of the public API: trainer.h */

/* Fills LLaMA-style defaults for the fields left 0 (ffn_dim by the LLaMA rule
 * round_up(8/3 C, 32), n_kv_heads = n_heads, theta 10000, eps 1e-5, std 0.02). */
void tks_model_config_defaults(tks_model_config *c);

/* Checks the config for one tp degree; the message names the numbers and the
 * fix. Errors: TKS_ERR_ARG. */
int tks_model_config_check(const tks_model_config *c, int tp);

/* Padded vocabulary for a tp degree. */
uint32_t tks_model_padded_vocab(const tks_model_config *c, int tp);

/* How a tensor is split over the tp group. */
typedef enum {
    TKS_TP_REPLICATED = 0, /* replicated (RMSNorm weights) */
    TKS_TP_ROWS,     /* dim 0 split: column-parallel linears (q,k,v,gate,up), vocab rows */
    TKS_TP_COLS,     /* dim 1 split: row-parallel linears (o, down) */
} tks_tp_split;

/* One parameter tensor. Global shape is the Hugging Face one; `rows` may
 * include vocab padding (rows_real excludes it). */
typedef struct tks_param {
    char name[64];            /* e.g. "model.layers.3.self_attn.q_proj.weight" */
    int ndim;                 /* 1 or 2 */
    uint64_t rows, cols;      /* global padded shape (cols = 1 for 1-d) */
    uint64_t rows_real;       /* global rows without vocab padding */
    tks_tp_split split;
    uint64_t row0, col0;      /* where the local block starts in the global tensor */
    uint64_t lrows, lcols;    /* local block shape */
    size_t offset;            /* of the local block in the flat parameter buffer, elements */
    int decay;                /* AdamW weight decay applies (matrices yes, norms no) */
    float *w, *g;             /* device pointers to the local block and its gradient */
} tks_param;

typedef struct tks_model tks_model;

/*
 * Creates a model for micro-batches of B x T tokens on backend `be`, as rank
 * tp_rank of a tp group `tp` (NULL = no tensor parallelism). Allocates the
 * flat parameter and gradient buffers and every activation. Weights are zero
 * until tks_model_init or a checkpoint load.
 * Errors: TKS_ERR_ARG (config), TKS_ERR_NOMEM.
 */
int tks_model_create(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                     tks_model **out);
/* As tks_model_create, with the flat buffers padded (with zeros that never
 * change) to a multiple of `flat_multiple` elements, so they split evenly
 * over a dp_shard group (ZeRO-style sharding of gradients and AdamW state). */
int tks_model_create_ex(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                        size_t flat_multiple, tks_model **out);
/* As tks_model_create_ex with activations and compute weights in `dt`:
 * TKS_BF16 keeps fp32 master weights and gradients and a bf16 copy of the
 * weights that every op reads (refreshed by tks_model_refresh_compute and by
 * the optimizer). Errors: TKS_ERR_ARG (bf16 with tp > 1), TKS_ERR_NOMEM. */
int tks_model_create_dt(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                        size_t flat_multiple, tks_dtype dt, tks_model **out);
void tks_model_free(tks_model *m);

/* Device bytes of activations, backward scratch and the backend workspace
 * for micro-batches B x T: the figure the dry run prints, equal to
 * tks_model_act_bytes of a model created with the same arguments (be NULL:
 * without the workspace). Linear in T. */
size_t tks_model_activation_bytes(const tks_model_config *c, int tp, int B, int T, tks_dtype dt,
                                  tks_backend *be);
size_t tks_model_act_bytes(const tks_model *m);
tks_dtype tks_model_dtype(const tks_model *m);
/* The compute copy of the flat weights (dt, n_flat elements); NULL in fp32. */
void *tks_model_compute_weights(tks_model *m);
/* Rewrites the compute copy from the fp32 master weights (after a load). */
int tks_model_refresh_compute(tks_model *m);

const tks_model_config *tks_model_config_of(const tks_model *m);
tks_backend *tks_model_backend(const tks_model *m);
tks_comm *tks_model_tp(const tks_model *m);
/* Parameter table (owned by the model). */
const tks_param *tks_model_params(const tks_model *m, size_t *n);
/* Flat local buffers (device pointers): the parameters use n_local elements,
 * the buffers have n_flat >= n_local (padding). */
float *tks_model_weights(tks_model *m);
float *tks_model_grads(tks_model *m);
size_t tks_model_n_local(const tks_model *m);
size_t tks_model_n_flat(const tks_model *m);
/* n_flat of a model created with (cfg, a tp group of tp, flat_multiple),
 * without creating it (the memory plan); 0 for a config tks_model_config_check
 * refuses or when out of host memory. */
size_t tks_model_flat_elems(const tks_model_config *cfg, int tp, size_t flat_multiple);
/* Parameters of the whole (unpadded) model. */
uint64_t tks_model_n_params(const tks_model_config *c);

/*
 * Initializes weights: every element of the GLOBAL tensor gets a value from a
 * counter-based generator keyed by (seed, tensor name, element index), and
 * each rank keeps its block, so the weights are identical for every tp.
 * Linear and embedding weights ~ N(0, init_std) (real vocab rows only),
 * RMSNorm weights 1, padding rows 0.
 */
void tks_model_init(tks_model *m, uint64_t seed);

/*
 * Packed documents of the next micro-batches (until the next call): doc is
 * host int32[B*T], doc[b*T + t] the position in row b where token t's
 * document starts (doc[b*T] = 0; each value the previous one or t:
 * tks_sampler_doc_starts gives it). mask != 0: attention is block-causal,
 * a token sees only the earlier tokens of its own document (backend.h,
 * attention_fwd). reset_positions != 0: RoPE positions restart at 0 at each
 * document (t - doc). doc NULL, or both flags 0: plain causal attention over
 * positions 0..T-1 (the default). Decoding (tks_model_decode_step) ignores
 * both. Errors: TKS_ERR_ARG (doc breaks the rule above, naming the row and
 * position), the backend's upload errors.
 */
int tks_model_set_documents(tks_model *m, const int32_t *doc, int mask, int reset_positions);

/*
 * Forward pass of one micro-batch. ids and targets: host int32[B*T], every id
 * < vocab_size (the caller range-checks; see tks_sampler_read). Keeps every
 * activation for backward. Returns the SUM of per-token losses in *loss_sum.
 * Errors: TKS_ERR_* from collectives.
 */
int tks_model_forward(tks_model *m, const int32_t *ids, const int32_t *targets, double *loss_sum);

/* Training forward: as tks_model_forward, but the per-token losses are
 * summed ON THE DEVICE into loss_acc[0] (fp32 device scalar, +=), and the
 * cross-entropy gradient (scale loss_scale per token) is computed at once,
 * in place of the logits: fused for tp = 1, staged over the tp group
 * otherwise. Follow with tks_model_backward. */
int tks_model_forward_train(tks_model *m, const int32_t *ids, const int32_t *targets,
                            float loss_scale, float *loss_acc);

/* Backward of the last forward; gradients ACCUMULATE into the grad buffer
 * (call tks_model_zero_grad once per optimizer step). d(loss)/d(token loss) =
 * loss_scale for every token: pass 1 / (tokens in the global batch). */
int tks_model_backward(tks_model *m, float loss_scale);
void tks_model_zero_grad(tks_model *m);

/* The gradient-ready hook (overlap of the gradient collectives with the
 * backward): when set, tks_model_backward calls ready(ctx, begin, end) as soon
 * as g[begin, end) of the flat gradient buffer holds its final value for this
 * backward: the final norm and lm_head first, then each layer as its weight
 * gradients complete (last layer first), the embedding last. The ranges
 * cover [0, n_flat) exactly once per backward (padding included). Set it for
 * the last micro-batch of a step only (earlier ones are not final); NULL
 * clears it. A non-zero return stops the backward with that code. The model
 * knows nothing of what the hook does (mesh.h: tks_grad_sync_hook). */
typedef int (*tks_model_grads_ready_fn)(void *ctx, size_t begin, size_t end);
void tks_model_set_grads_ready(tks_model *m, tks_model_grads_ready_fn ready, void *ctx);

/* Logits of the last tks_model_forward: device [N, VP_l] in the model's
 * dtype (tests read them); backward overwrites them with dlogits. With the
 * chunked loss head (TKS_LOSS_CHUNK_ROWS at creation, tp = 1: loss_head.h)
 * the buffer holds only the last chunk's rows, [min(rows, N), VP_l]. */
const void *tks_model_logits(const tks_model *m);

/* ---- inference with a KV cache (batch 1) ---------------------------------- */
/* Allocates the KV cache for up to max_seq_len positions and clears it. */
int tks_model_kv_reset(tks_model *m);
/* Runs one token at position `pos` (= number of tokens already in the cache)
 * and writes the logits of the next token, host float[vocab_size] (padding
 * excluded). Errors: TKS_ERR_ARG when pos >= max_seq_len. */
int tks_model_decode_step(tks_model *m, int32_t token, int pos, float *logits);

#endif /* TKS_MODEL_H */
