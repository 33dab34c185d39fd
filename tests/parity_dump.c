/*
 * parity_dump.c - the C half of the PyTorch parity test (test_torch_parity.py
 * is the other half): runs the trainer on tiny LLaMA configs and writes what
 * an independent implementation must reproduce from the same checkpoint and
 * batch.
 *
 * Usage: parity_dump OUT_DIR [CONFIG...]   (CONFIG: gqa, tied, odd, docs, docpos, packed; default all)
 * Exit 0 when every file was written, 1 on any library error (message on stderr),
 * 2 on a usage error.
 *
 * Per config, under OUT_DIR/CONFIG/:
 *   ckpt/                 tks_checkpoint_save of the initial weights (opt NULL)
 *   batch.safetensors     "ids", "targets": I32 [B, T]; for docs and docpos also "doc"
 *                         I32 [B, T] (each token's document start in its row,
 *                         tks_model_set_documents) and metadata "doc_mask" and
 *                         "reset_positions" ("0" or "1")
 *   step0.safetensors     "loss" F32 scalar (mean token loss), "logits" F32 [N, V]
 *                         (real vocabulary columns only), "grad.<HF name>" F32 in
 *                         the checkpoint's unpadded shape (loss scale 1/N), and
 *                         "pad.grad.<name>" F32 [VP - V, C]: the padding rows'
 *                         gradient (must be exactly 0)
 *   steps.safetensors     per AdamW step s = 0, 1, 2 on the same batch:
 *                         "loss" F64 [3], "grad_norm" F64 [3] (before clipping),
 *                         "lr" F32 [3] (tks_lr_at), "clip_scale" F32 [3]
 *                         (tks_clip_scale), "step<s>.grad.<HF name>" F32 (the raw,
 *                         unclipped gradient of step s, unpadded), "pad.after3.<name>"
 *                         F32 [VP - V, C] (padding rows after 3 steps: must be 0);
 *                         metadata: the AdamW options as decimal strings
 *   step0_bf16.safetensors  (not for docs, docpos) the same as step0 (without padding) from a --dtype bf16
 *                         model loaded from ckpt/: "loss", "logits" (bf16, widened),
 *                         "grad.<HF name>" (fp32 gradients); test_torch_bf16.py
 *   after3/               tks_checkpoint_save after the 3 steps, with the optimizer
 *                         (AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq")
 *
 * Legend (model.h): B micro-batch, T sequence, N = B*T, C dim, NH heads, NKV kv
 * heads, F ffn dim, V vocab_size (real), VP padded vocab.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/model/model.h"
#include "trainer/model/optim.h"
#include "trainer/ckpt/safetensors.h"

enum { B = 2, T = 16, N = B * T, STEPS = 3 };

typedef struct variant {
    const char *name;
    tks_model_config cfg;
    tks_adamw_opts opt;
    uint64_t seed;
    const int32_t *doc;  /* packed documents of the batch ([B, T] starts) or NULL */
    int mask, reset;     /* --doc-mask, --reset-positions */
    const int *real;     /* packed windows: each row's real tokens of T + 1 (the rest padding), or NULL */
} variant;

/* The documents of docs and docpos: row 0 holds documents of 5, 1, 7 and 3
 * tokens (one of a single token), row 1 of 9 and 7. */
static const int32_t DOCS[B * T] = {0, 0, 0, 0, 0, 5, 6, 6, 6, 6, 6, 6, 6, 13, 13, 13,
                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9};

/* The windows of `packed`, as best-fit packing makes them (docs/SAMPLING.md
 * §10): row 0 holds documents of 5, 4 and 3 tokens and 5 of padding (12 real
 * of T + 1 = 17), row 1 documents of 9 and 4 and 4 of padding (13 real). The
 * padding is a block of its own after the documents; its ids are 0 and its
 * targets (and the last real token's) are -1, ignored. */
static const int32_t PACKED[B * T] = {0, 0, 0, 0, 0, 5, 5, 5, 5, 9, 9, 9, 12, 12, 12, 12,
                                      0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 13, 13, 13};
static const int PACKED_REAL[B] = {12, 13};

/*
 * gqa:  V 100 -> VP 128 (28 padded rows), NH 4 / NKV 2, untied; warmup 2 of 3
 *       steps (lr/2, lr, then the cosine at its start: lr).
 * tied: tie_embeddings with NKV = NH; warmup 1 of 3 (lr, lr, cosine midpoint).
 * odd:  V 97 (prime), NKV 1 (multi-query), vocab_divisible_by 8 -> VP 104,
 *       rope_theta 500000 and norm_eps 1e-6 (LLaMA 3 values, so the Python side
 *       must really read them from config.json), max_seq_len 32 > T; no warmup,
 *       total 2 (lr, cosine midpoint, min_lr past the end).
 * AdamW eps is 1e-6, not the trainer's default 1e-8: Adam's first update is
 * g / (|g| + eps), so an element whose clipped gradient is near eps turns the
 * float32 rounding of that gradient (~1e-6 relative, everywhere) into a much
 * larger weight difference (with 1e-8, one element of `odd` reached 1.3e-4
 * after attention moved to sgemm: a different, equally valid summation order).
 * 1e-6 keeps the end-to-end check well conditioned; the update formula itself
 * is pinned at 1e-5 by the Python side feeding torch's AdamW our own
 * gradients, and by test_ops against the documented algorithm.
 * init_std 0.3 keeps attention far from uniform. The gradient norms (printed
 * by this program) fall from ~6 to ~3 over the three steps, so grad_clip 1
 * clips every step of gqa, 5 only the first step of tied, 3 the first two of odd.
 * docs:   gqa's model on packed documents (DOCS) with the block-causal mask
 *         and positions restarting per document (--doc-mask --reset-positions).
 * docpos: gqa's model with positions restarting per document and no mask
 *         (--reset-positions alone: with the mask, RoPE's relative positions
 *         make the restart invisible, so only here can a reference tell).
 * packed: gqa's model on best-fit windows with padding (PACKED), --doc-mask
 *         --reset-positions: the loss is the mean over the real targets and the
 *         padding gets no loss and no gradient (--packing best-fit).
 */
static const variant VARIANTS[] = {
    {"gqa",
     {.vocab_size = 100, .vocab_divisible_by = 64, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 2, .ffn_dim = 96, .max_seq_len = 16, .rope_theta = 10000.0f,
      .norm_eps = 1e-5f, .init_std = 0.3f, .tie_embeddings = 0},
     {.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 2, .total = 3, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 1.0f},
     1234, NULL, 0, 0, NULL},
    {"tied",
     {.vocab_size = 100, .vocab_divisible_by = 64, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 4, .ffn_dim = 96, .max_seq_len = 16, .rope_theta = 10000.0f,
      .norm_eps = 1e-5f, .init_std = 0.3f, .tie_embeddings = 1},
     {.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 1, .total = 3, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 5.0f},
     99, NULL, 0, 0, NULL},
    {"odd",
     {.vocab_size = 97, .vocab_divisible_by = 8, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 1, .ffn_dim = 64, .max_seq_len = 32, .rope_theta = 500000.0f,
      .norm_eps = 1e-6f, .init_std = 0.3f, .tie_embeddings = 0},
     {.lr = 2e-2f, .min_lr = 1e-3f, .warmup = 0, .total = 2, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 3.0f},
     7, NULL, 0, 0, NULL},
    {"docs",
     {.vocab_size = 100, .vocab_divisible_by = 64, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 2, .ffn_dim = 96, .max_seq_len = 16, .rope_theta = 10000.0f,
      .norm_eps = 1e-5f, .init_std = 0.3f, .tie_embeddings = 0},
     {.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 2, .total = 3, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 1.0f},
     1234, DOCS, 1, 1, NULL},
    {"docpos",
     {.vocab_size = 100, .vocab_divisible_by = 64, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 2, .ffn_dim = 96, .max_seq_len = 16, .rope_theta = 10000.0f,
      .norm_eps = 1e-5f, .init_std = 0.3f, .tie_embeddings = 0},
     {.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 2, .total = 3, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 1.0f},
     1234, DOCS, 0, 1, NULL},
    {"packed",
     {.vocab_size = 100, .vocab_divisible_by = 64, .dim = 32, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 2, .ffn_dim = 96, .max_seq_len = 16, .rope_theta = 10000.0f,
      .norm_eps = 1e-5f, .init_std = 0.3f, .tie_embeddings = 0},
     {.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 2, .total = 3, .beta1 = 0.9f, .beta2 = 0.95f,
      .eps = 1e-6f, .weight_decay = 0.1f, .grad_clip = 1.0f},
     1234, PACKED, 1, 1, PACKED_REAL},
};
#define N_VARIANTS (sizeof VARIANTS / sizeof VARIANTS[0])

static int die(const char *what, int rc) {
    fprintf(stderr, "parity_dump: %s: %s (%s)\n", what, tks_strerror(rc), tks_last_error()->message);
    return 1;
}

/* ---- tensors to write -------------------------------------------------------- */

/* A growing list of tensors whose names and data the list owns. */
typedef struct tlist {
    tks_st_tensor *t;
    size_t n, cap;
} tlist;

static int tl_add(tlist *l, const char *name, tks_st_dtype dt, size_t ndim, uint64_t d0,
                  uint64_t d1, const void *data, size_t nbytes) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        tks_st_tensor *t = realloc(l->t, cap * sizeof *t);
        if (!t) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        l->t = t;
        l->cap = cap;
    }
    void *copy = malloc(nbytes ? nbytes : 1);
    char *nm = strdup(name);
    if (!copy || !nm) {
        free(copy);
        free(nm);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    if (nbytes) memcpy(copy, data, nbytes);
    l->t[l->n++] = (tks_st_tensor){.name = nm, .dtype = dt, .ndim = ndim, .shape = {d0, d1},
                                   .data = copy, .nbytes = nbytes};
    return 0;
}

static void tl_free(tlist *l) {
    for (size_t i = 0; i < l->n; i++) {
        free((void *)l->t[i].name);
        free((void *)l->t[i].data);
    }
    free(l->t);
    memset(l, 0, sizeof *l);
}

/* Adds rows [r0, r1) of a parameter's buffer (weights or grads, device), all
 * columns, as F32 [r1 - r0, cols] (or [r1 - r0] for a 1-d tensor). */
static int add_rows(tlist *l, tks_backend *be, const char *name, const tks_param *p,
                    const float *dev, uint64_t r0, uint64_t r1) {
    size_t n = (size_t)((r1 - r0) * p->cols);
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (n) be->ops->download(be, h, dev + r0 * p->cols, n * sizeof *h);
    int rc = tl_add(l, name, TKS_ST_F32, (size_t)p->ndim, r1 - r0, p->cols, h, n * sizeof *h);
    free(h);
    return rc;
}

/* ---- the batch ------------------------------------------------------------------ */

/* Rows of a deterministic token stream (splitmix64); targets are the ids
 * shifted by one, as in language-model training. Token 0 and V-1 (the last
 * real row, next to the padding) are both read and predicted. */
static void make_batch(uint32_t V, int32_t *ids, int32_t *targets) {
    uint64_t s = 0x9E3779B97F4A7C15ull * V;
    int32_t stream[T + 1];
    for (int b = 0; b < B; b++) {
        for (int t = 0; t <= T; t++) {
            uint64_t z = (s += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            stream[t] = (int32_t)((z ^ (z >> 31)) % V);
        }
        if (b == 0) stream[3] = (int32_t)V - 1, stream[7] = 0;
        if (b == 1) stream[10] = (int32_t)V - 1, stream[1] = stream[2]; /* a repeated token */
        for (int t = 0; t < T; t++) {
            ids[b * T + t] = stream[t];
            targets[b * T + t] = stream[t + 1];
        }
    }
}

/* ---- one config -------------------------------------------------------------------- */

/* Global gradient norm over the whole flat buffer (gaps hold zeros). */
static double grad_norm(tks_backend *be, tks_model *m) {
    tks_span sp = {0, tks_model_n_local(m), 0};
    float *d = be->ops->alloc(be, sizeof(float)), h = NAN;
    if (d && !be->ops->sumsq(be, d, tks_model_grads(m), &sp, 1, 0)) be->ops->download(be, &h, d, sizeof h);
    be->ops->free(be, d);
    return sqrt((double)h);
}

/* The mixed-precision path at the checkpoint's weights: a --dtype bf16 model
 * (bf16 compute weights and activations, fp32 master weights and gradients)
 * loads ckpt/ and runs one forward and backward on the batch; writes
 * step0_bf16.safetensors: "loss" F32, "logits" F32 [N, V] (the bf16 logits,
 * widened exactly), "grad.<HF name>" F32 (the fp32 gradients, loss scale 1/N). */
static int dump_bf16(const char *dir, const variant *vr, const int32_t *ids,
                     const int32_t *targets) {
    char path[4096];
    /* its own backend: a backend holds one model's workspace */
    tks_backend *be = tks_cpu_backend_create(0);
    if (!be) return die("tks_cpu_backend_create", TKS_ERR_NOMEM);
    tks_model *m = NULL;
    tlist l = {0};
    int rc = tks_model_create_dt(&vr->cfg, be, NULL, B, T, 1, TKS_BF16, &m);
    if (rc) return die("tks_model_create_dt (bf16)", rc);
    const tks_model_config *c = tks_model_config_of(m);
    uint32_t V = c->vocab_size, VP = tks_model_padded_vocab(c, 1);
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    tks_path_join(path, sizeof path, dir, "ckpt"); /* fits: main limits OUT_DIR */
    if ((rc = tks_checkpoint_load(path, m, NULL)) || (rc = tks_model_refresh_compute(m)))
        return die("bf16: load ckpt", rc);
    double loss_sum = 0;
    tks_model_zero_grad(m);
    if ((rc = tks_model_forward(m, ids, targets, &loss_sum))) return die("bf16 forward", rc);
    uint16_t *lg = malloc((size_t)N * VP * sizeof *lg);
    float *real = malloc((size_t)N * V * sizeof *real);
    if (!lg || !real) return die("bf16 logits", TKS_ERR_NOMEM);
    be->ops->download(be, lg, tks_model_logits(m), (size_t)N * VP * sizeof *lg);
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < V; j++) real[i * V + j] = tks_bf16_to_f32(lg[i * VP + j]);
    if ((rc = tks_model_backward(m, 1.0f / N))) return die("bf16 backward", rc);
    float loss = (float)(loss_sum / N);
    rc = tl_add(&l, "loss", TKS_ST_F32, 0, 0, 0, &loss, sizeof loss);
    if (!rc) rc = tl_add(&l, "logits", TKS_ST_F32, 2, N, V, real, (size_t)N * V * sizeof *real);
    free(lg);
    free(real);
    for (size_t i = 0; i < np && !rc; i++) {
        snprintf(path, sizeof path, "grad.%s", P[i].name);
        rc = add_rows(&l, be, path, &P[i], P[i].g, 0, P[i].rows_real);
    }
    tks_path_join(path, sizeof path, dir, "step0_bf16.safetensors"); /* fits: main limits OUT_DIR */
    if (rc || (rc = tks_st_write(path, l.t, l.n, NULL, 0))) return die(path, rc);
    tl_free(&l);
    printf("%-5s bf16: loss %.6f\n", vr->name, (double)loss);
    tks_model_free(m);
    be->ops->destroy(be);
    return 0;
}

static int run_variant(tks_backend *be, const char *out, const variant *vr) {
    char dir[4096], path[4096];
    int rc = tks_path_join(dir, sizeof dir, out, vr->name);
    if (rc) return die(out, rc);
    if (mkdir(dir, 0755) != 0) {
        fprintf(stderr, "parity_dump: cannot create %s: %s (remove it first)\n", dir, strerror(errno));
        return 1;
    }
    tks_model *m = NULL;
    tks_optim *op = NULL;
    tlist l = {0}, tr = {0}; /* step0.safetensors, steps.safetensors */
    rc = tks_model_create(&vr->cfg, be, NULL, B, T, &m);
    if (rc) return die("tks_model_create", rc);
    if (vr->doc && (rc = tks_model_set_documents(m, vr->doc, vr->mask, vr->reset)))
        return die("tks_model_set_documents", rc);
    const tks_model_config *c = tks_model_config_of(m);
    uint32_t V = c->vocab_size, VP = tks_model_padded_vocab(c, 1);
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    tks_model_init(m, vr->seed);
    tks_train_state st = {.seed = vr->seed, .seq_len = T, .global_batch = B};
    tks_path_join(path, sizeof path, dir, "ckpt"); /* fits: main limits OUT_DIR */
    if ((rc = tks_checkpoint_save(path, m, NULL, &st, NULL, NULL))) return die("tks_checkpoint_save", rc);

    int32_t ids[N], targets[N];
    make_batch(V, ids, targets);
    int n_real = N; /* targets that count */
    if (vr->real) { /* packed windows: padding ids 0, ignored targets -1, as tks_sampler_load_row */
        n_real = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                if (t >= vr->real[b]) ids[b * T + t] = 0;
                if (t + 1 >= vr->real[b]) targets[b * T + t] = -1;
                else n_real++;
            }
    }
    tks_path_join(path, sizeof path, dir, "batch.safetensors"); /* fits: main limits OUT_DIR */
    tks_st_kv dmeta[] = {{"doc_mask", vr->mask ? "1" : "0"}, {"reset_positions", vr->reset ? "1" : "0"}};
    if ((rc = tl_add(&l, "ids", TKS_ST_I32, 2, B, T, ids, sizeof ids)) ||
        (rc = tl_add(&l, "targets", TKS_ST_I32, 2, B, T, targets, sizeof targets)) ||
        (vr->doc && (rc = tl_add(&l, "doc", TKS_ST_I32, 2, B, T, vr->doc, sizeof DOCS))) ||
        (rc = tks_st_write(path, l.t, l.n, vr->doc ? dmeta : NULL, vr->doc ? 2 : 0)))
        return die(path, rc);
    tl_free(&l);

    if (!vr->doc && dump_bf16(dir, vr, ids, targets)) return 1;

    /* STEPS AdamW steps on the same batch, as the trainer runs them (gradient
     * norm over the whole flat buffer, clip factor, schedule); step 0 also
     * dumps the loss, logits and every gradient at the initial weights */
    if ((rc = tks_optim_create(m, &vr->opt, 0, tks_model_n_local(m), &op)))
        return die("tks_optim_create", rc);
    double loss_sum = 0, losses[STEPS], norms[STEPS];
    float lrs[STEPS], scales[STEPS];
    for (int s = 0; s < STEPS; s++) {
        tks_model_zero_grad(m);
        if ((rc = tks_model_forward(m, ids, targets, &loss_sum))) return die("forward", rc);
        float *lg = NULL; /* step 0's logits, read before backward overwrites them with dlogits */
        if (s == 0) {
            if (!(lg = malloc((size_t)N * VP * sizeof *lg))) return die("logits", TKS_ERR_NOMEM);
            be->ops->download(be, lg, tks_model_logits(m), (size_t)N * VP * sizeof *lg);
        }
        if ((rc = tks_model_backward(m, 1.0f / (float)n_real))) return die("backward", rc);
        losses[s] = loss_sum / n_real;
        norms[s] = grad_norm(be, m);
        lrs[s] = tks_lr_at(&vr->opt, (uint64_t)s);
        scales[s] = tks_clip_scale(&vr->opt, norms[s]);
        if (s == 0) {
            float loss = (float)losses[0];
            float *real = malloc((size_t)N * V * sizeof *real);
            if (!real) return die("logits", TKS_ERR_NOMEM);
            for (size_t i = 0; i < N; i++) memcpy(real + i * V, lg + i * VP, V * sizeof *real);
            rc = tl_add(&l, "loss", TKS_ST_F32, 0, 0, 0, &loss, sizeof loss);
            if (!rc) rc = tl_add(&l, "logits", TKS_ST_F32, 2, N, V, real, (size_t)N * V * sizeof *real);
            free(lg);
            free(real);
            for (size_t i = 0; i < np && !rc; i++) {
                snprintf(path, sizeof path, "grad.%s", P[i].name);
                rc = add_rows(&l, be, path, &P[i], P[i].g, 0, P[i].rows_real);
                if (!rc && P[i].rows_real < P[i].rows) {
                    snprintf(path, sizeof path, "pad.grad.%s", P[i].name);
                    rc = add_rows(&l, be, path, &P[i], P[i].g, P[i].rows_real, P[i].rows);
                }
            }
            tks_path_join(path, sizeof path, dir, "step0.safetensors"); /* fits: main limits OUT_DIR */
            if (rc || (rc = tks_st_write(path, l.t, l.n, NULL, 0))) return die(path, rc);
            tl_free(&l);
        }
        for (size_t i = 0; i < np && !rc; i++) {
            snprintf(path, sizeof path, "step%d.grad.%s", s, P[i].name);
            rc = add_rows(&tr, be, path, &P[i], P[i].g, 0, P[i].rows_real);
        }
        if (rc) return die("gradients", rc);
        tks_optim_step(op, s + 1, lrs[s], scales[s]);
        printf("%-5s step %d  loss %.6f  grad_norm %.6f  lr %.6g  clip_scale %.6f%s\n", vr->name, s,
               losses[s], norms[s], (double)lrs[s], (double)scales[s],
               scales[s] < 1.0f ? "  (clipped)" : "");
    }

    /* the trace and the options the Python side recomputes the schedule from */
    char kv[9][32];
    snprintf(kv[0], 32, "%.9g", (double)vr->opt.lr);
    snprintf(kv[1], 32, "%.9g", (double)vr->opt.min_lr);
    snprintf(kv[2], 32, "%llu", (unsigned long long)vr->opt.warmup);
    snprintf(kv[3], 32, "%llu", (unsigned long long)vr->opt.total);
    snprintf(kv[4], 32, "%.9g", (double)vr->opt.beta1);
    snprintf(kv[5], 32, "%.9g", (double)vr->opt.beta2);
    snprintf(kv[6], 32, "%.9g", (double)vr->opt.eps);
    snprintf(kv[7], 32, "%.9g", (double)vr->opt.weight_decay);
    snprintf(kv[8], 32, "%.9g", (double)vr->opt.grad_clip);
    tks_st_kv meta[] = {{"lr", kv[0]},    {"min_lr", kv[1]}, {"warmup", kv[2]},
                        {"total", kv[3]}, {"beta1", kv[4]},  {"beta2", kv[5]},
                        {"eps", kv[6]},   {"weight_decay", kv[7]}, {"grad_clip", kv[8]}};
    rc = tl_add(&tr, "loss", TKS_ST_F64, 1, STEPS, 0, losses, sizeof losses);
    if (!rc) rc = tl_add(&tr, "grad_norm", TKS_ST_F64, 1, STEPS, 0, norms, sizeof norms);
    if (!rc) rc = tl_add(&tr, "lr", TKS_ST_F32, 1, STEPS, 0, lrs, sizeof lrs);
    if (!rc) rc = tl_add(&tr, "clip_scale", TKS_ST_F32, 1, STEPS, 0, scales, sizeof scales);
    for (size_t i = 0; i < np && !rc; i++)
        if (P[i].rows_real < P[i].rows) {
            snprintf(path, sizeof path, "pad.after3.%s", P[i].name);
            rc = add_rows(&tr, be, path, &P[i], P[i].w, P[i].rows_real, P[i].rows);
        }
    tks_path_join(path, sizeof path, dir, "steps.safetensors"); /* fits: main limits OUT_DIR */
    if (rc || (rc = tks_st_write(path, tr.t, tr.n, meta, sizeof meta / sizeof meta[0])))
        return die(path, rc);
    tl_free(&tr);
    st.step = STEPS;
    tks_path_join(path, sizeof path, dir, "after3"); /* fits: main limits OUT_DIR */
    if ((rc = tks_checkpoint_save(path, m, op, &st, NULL, NULL))) return die("tks_checkpoint_save", rc);
    tks_optim_free(op);
    tks_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: parity_dump OUT_DIR [gqa|tied|odd|docs|docpos|packed ...]\n");
        return 2;
    }
    if (strlen(argv[1]) > 1024) {
        fprintf(stderr, "parity_dump: OUT_DIR is longer than 1024 bytes\n");
        return 2;
    }
    for (int a = 2; a < argc; a++) {
        int known = 0;
        for (size_t i = 0; i < N_VARIANTS; i++) known |= strcmp(argv[a], VARIANTS[i].name) == 0;
        if (!known) {
            fprintf(stderr, "parity_dump: unknown config %s (gqa, tied, odd, docs, docpos, packed)\n", argv[a]);
            return 2;
        }
    }
    if (mkdir(argv[1], 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "parity_dump: cannot create %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    tks_backend *be = tks_cpu_backend_create(0);
    if (!be) return die("tks_cpu_backend_create", TKS_ERR_NOMEM);
    int bad = 0;
    for (size_t i = 0; i < N_VARIANTS && !bad; i++) {
        int want = argc == 2;
        for (int a = 2; a < argc; a++) want |= strcmp(argv[a], VARIANTS[i].name) == 0;
        if (want) bad = run_variant(be, argv[1], &VARIANTS[i]);
    }
    be->ops->destroy(be);
    return bad;
}
