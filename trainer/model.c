/* model.c - LLaMA forward and backward through the backend interface.
 * Legend and padding rules: model.h. Every tensor pointer here is a device
 * pointer; host data crosses only through be->upload / be->download.
 *
 * Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): q, k, v, gate, up
 * are column-parallel (rows of W split), o and down row-parallel (columns of W
 * split), embedding and lm_head vocab-parallel (rows split). Collectives over
 * the tp group: forward all-reduce after the embedding, o and down;
 * backward all-reduce of the input gradients of q/k/v, gate/up and lm_head;
 * cross-entropy all-reduces max, sum of exps and target logit. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/tks.h"

typedef struct layer {
    tks_param *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown;
    /* activations, kept for backward */
    float *x;             /* (N, C) input of the layer (residual stream) */
    float *h1, *rstd1;    /* (N, C), (N) attention RMSNorm */
    float *q, *k, *v;     /* (N, NH_l*HD), (N, NKV_l*HD) x2; q, k after RoPE */
    float *probs;         /* (B, NH_l, T, T) attention probabilities */
    float *att;           /* (N, NH_l*HD) attention output before o_proj */
    float *xm;            /* (N, C) residual after attention */
    float *h2, *rstd2;    /* (N, C), (N) MLP RMSNorm */
    float *gate, *up, *act; /* (N, F_l) */
    float *kc, *vc;       /* (max_seq_len, NKV_l, HD) KV cache for decoding */
} layer;

struct tks_model {
    tks_model_config cfg;
    tks_backend *be;
    tks_comm *tp;
    int tp_size, tp_rank;
    int B, T, N, C, HD, NH_l, NKV_l, F_l;
    uint32_t VP, VP_l, VR_l; /* padded vocab, local rows, local real rows */
    int64_t v0;              /* global id of local vocab row 0 */
    tks_param *params;
    size_t n_params;
    tks_param *embed, *final_norm, *lm_head;
    float *w, *g;            /* flat local weights and grads (n_flat elements) */
    size_t n_local, n_flat;
    layer *layers;
    float *xL, *hf, *rstdf;  /* (N, C), (N, C), (N) */
    float *logits;           /* (N, VP_l) */
    float *mx, *sum, *tgt, *loss; /* (N) */
    int32_t *ids, *targets;  /* (N) */
    /* backward scratch */
    float *dres, *dh;        /* (N, C) */
    float *dq, *dk, *dv, *datt; /* like q, k, v, att */
    float *dgate, *dup, *dact;  /* (N, F_l) */
    float *dlogits;          /* (N, VP_l) */
    float *host_loss;        /* host (N) */
    int kv_ready;
};

void tks_model_config_defaults(tks_model_config *c) {
    if (!c->vocab_divisible_by) c->vocab_divisible_by = 64;
    if (!c->n_kv_heads) c->n_kv_heads = c->n_heads;
    if (!c->ffn_dim && c->dim) c->ffn_dim = (uint32_t)(((8 * (uint64_t)c->dim / 3) + 31) / 32 * 32);
    if (c->rope_theta == 0) c->rope_theta = 10000.0f;
    if (c->norm_eps == 0) c->norm_eps = 1e-5f;
    if (c->init_std == 0) c->init_std = 0.02f;
}

uint32_t tks_model_padded_vocab(const tks_model_config *c, int tp) {
    uint64_t q = (uint64_t)c->vocab_divisible_by * (uint64_t)(tp > 0 ? tp : 1);
    return (uint32_t)((c->vocab_size + q - 1) / q * q);
}

int tks_model_config_check(const tks_model_config *c, int tp) {
#define BAD(...) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, __VA_ARGS__)
    if (tp < 1) BAD("--tp %d: must be at least 1", tp);
    if (c->vocab_size < 2) BAD("vocab_size %u: need at least 2 tokens", c->vocab_size);
    if (!c->dim || !c->n_layers || !c->n_heads || !c->ffn_dim || !c->max_seq_len)
        BAD("--dim, --n-layers, --n-heads, --ffn-dim and --max-seq-len must be positive");
    if (c->dim % c->n_heads)
        BAD("--dim %u is not divisible by --n-heads %u: the head dim must be an integer", c->dim,
            c->n_heads);
    if ((c->dim / c->n_heads) % 2)
        BAD("head dim %u (--dim %u / --n-heads %u) must be even for RoPE", c->dim / c->n_heads,
            c->dim, c->n_heads);
    if (!c->n_kv_heads || c->n_heads % c->n_kv_heads)
        BAD("--n-heads %u is not a multiple of --n-kv-heads %u (grouped-query attention needs "
            "whole groups)", c->n_heads, c->n_kv_heads);
    if (c->n_heads % (uint32_t)tp)
        BAD("--tp %d does not divide --n-heads %u: attention heads are split across tp ranks; "
            "choose a tp that divides %u", tp, c->n_heads, c->n_heads);
    if (c->n_kv_heads % (uint32_t)tp)
        BAD("--tp %d does not divide --n-kv-heads %u: choose a tp that divides it, or more kv "
            "heads", tp, c->n_kv_heads);
    if (c->ffn_dim % (uint32_t)tp)
        BAD("--tp %d does not divide --ffn-dim %u: the MLP is split across tp ranks", tp,
            c->ffn_dim);
    if (!c->vocab_divisible_by) BAD("--vocab-divisible-by must be at least 1");
    if (!(c->norm_eps > 0) || !(c->rope_theta > 0) || !(c->init_std >= 0))
        BAD("norm_eps and rope_theta must be > 0, init_std >= 0");
    return 0;
#undef BAD
}

uint64_t tks_model_n_params(const tks_model_config *c) {
    uint64_t C = c->dim, HD = c->dim / c->n_heads, F = c->ffn_dim, V = c->vocab_size;
    uint64_t per_layer = 2 * C + C * c->n_heads * HD + 2 * C * c->n_kv_heads * HD +
                         c->n_heads * HD * C + 3 * C * F;
    return V * C * (c->tie_embeddings ? 1 : 2) + c->n_layers * per_layer + C;
}

/* ---- parameter table ------------------------------------------------------- */

static tks_param *add_param(tks_model *m, size_t *cap, const char *name, uint64_t rows,
                            uint64_t cols, uint64_t rows_real, tks_split split, int decay) {
    if (m->n_params == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        tks_param *p = realloc(m->params, *cap * sizeof *p);
        if (!p) return NULL;
        m->params = p;
    }
    tks_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = cols == 0 ? 1 : 2;
    p->rows = rows;
    p->cols = cols ? cols : 1;
    p->rows_real = rows_real;
    p->split = split;
    p->decay = decay;
    uint64_t tp = (uint64_t)m->tp_size, r = (uint64_t)m->tp_rank;
    p->lrows = split == TKS_SPLIT_ROWS ? rows / tp : rows;
    p->lcols = split == TKS_SPLIT_COLS ? p->cols / tp : p->cols;
    p->row0 = split == TKS_SPLIT_ROWS ? r * p->lrows : 0;
    p->col0 = split == TKS_SPLIT_COLS ? r * p->lcols : 0;
    return p;
}

static int build_params(tks_model *m) {
    const tks_model_config *c = &m->cfg;
    size_t cap = 0;
    uint64_t C = c->dim, HD = (uint64_t)m->HD;
    char nm[64];
    /* pointers into m->params are fixed up after the table is complete */
    if (!add_param(m, &cap, "model.embed_tokens.weight", m->VP, C, c->vocab_size, TKS_SPLIT_ROWS, 1))
        return TKS_ERR_NOMEM;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        struct { const char *suffix; uint64_t rows, cols; tks_split split; int decay; } t[] = {
            {"input_layernorm.weight", C, 0, TKS_SPLIT_NONE, 0},
            {"self_attn.q_proj.weight", c->n_heads * HD, C, TKS_SPLIT_ROWS, 1},
            {"self_attn.k_proj.weight", c->n_kv_heads * HD, C, TKS_SPLIT_ROWS, 1},
            {"self_attn.v_proj.weight", c->n_kv_heads * HD, C, TKS_SPLIT_ROWS, 1},
            {"self_attn.o_proj.weight", C, c->n_heads * HD, TKS_SPLIT_COLS, 1},
            {"post_attention_layernorm.weight", C, 0, TKS_SPLIT_NONE, 0},
            {"mlp.gate_proj.weight", c->ffn_dim, C, TKS_SPLIT_ROWS, 1},
            {"mlp.up_proj.weight", c->ffn_dim, C, TKS_SPLIT_ROWS, 1},
            {"mlp.down_proj.weight", C, c->ffn_dim, TKS_SPLIT_COLS, 1},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(nm, sizeof nm, "model.layers.%u.%s", l, t[i].suffix);
            if (!add_param(m, &cap, nm, t[i].rows, t[i].cols, t[i].rows, t[i].split, t[i].decay))
                return TKS_ERR_NOMEM;
        }
    }
    if (!add_param(m, &cap, "model.norm.weight", C, 0, C, TKS_SPLIT_NONE, 0)) return TKS_ERR_NOMEM;
    if (!c->tie_embeddings &&
        !add_param(m, &cap, "lm_head.weight", m->VP, C, c->vocab_size, TKS_SPLIT_ROWS, 1))
        return TKS_ERR_NOMEM;
    size_t off = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        m->params[i].offset = off;
        off += (m->params[i].lrows * m->params[i].lcols + 15) & ~(size_t)15; /* 64-byte aligned */
    }
    m->n_local = off;
    return 0;
}

/* ---- create / free ----------------------------------------------------------- */

static float *dalloc(tks_model *m, size_t n, int *fail) {
    float *p = m->be->alloc(m->be, n * sizeof(float));
    if (!p) *fail = 1;
    return p;
}

int tks_model_create(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                     tks_model **out) {
    return tks_model_create_ex(cfg, be, tp, B, T, 1, out);
}

int tks_model_create_ex(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                        size_t flat_multiple, tks_model **out) {
    *out = NULL;
    tks_model_config c = *cfg;
    tks_model_config_defaults(&c);
    int tps = tp ? tp->size : 1;
    int rc = tks_model_config_check(&c, tps);
    if (rc) return rc;
    if (B < 1 || T < 1 || (uint32_t)T > c.max_seq_len)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "micro-batch %d x sequence %d: need B >= 1 and 1 <= T <= max_seq_len %u", B,
                        T, c.max_seq_len);
    tks_model *m = calloc(1, sizeof *m);
    if (!m) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    m->cfg = c;
    m->be = be;
    m->tp = tp;
    m->tp_size = tps;
    m->tp_rank = tp ? tp->rank : 0;
    m->B = B;
    m->T = T;
    m->N = B * T;
    m->C = (int)c.dim;
    m->HD = (int)(c.dim / c.n_heads);
    m->NH_l = (int)c.n_heads / tps;
    m->NKV_l = (int)c.n_kv_heads / tps;
    m->F_l = (int)c.ffn_dim / tps;
    m->VP = tks_model_padded_vocab(&c, tps);
    m->VP_l = m->VP / (uint32_t)tps;
    m->v0 = (int64_t)m->tp_rank * m->VP_l;
    int64_t real = (int64_t)c.vocab_size - m->v0;
    m->VR_l = (uint32_t)(real <= 0 ? 0 : real >= m->VP_l ? m->VP_l : real);
    m->layers = calloc(c.n_layers, sizeof *m->layers);
    if (!m->layers || build_params(m)) {
        tks_model_free(m);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    int fail = 0;
    size_t N = (size_t)m->N, C = (size_t)m->C, QD = (size_t)m->NH_l * m->HD,
           KD = (size_t)m->NKV_l * m->HD, F = (size_t)m->F_l;
    size_t fm = flat_multiple ? flat_multiple : 1;
    m->n_flat = (m->n_local + fm - 1) / fm * fm;
    m->w = dalloc(m, m->n_flat, &fail);
    m->g = dalloc(m, m->n_flat, &fail);
    for (size_t i = 0; i < m->n_params && !fail; i++) {
        m->params[i].w = m->w + m->params[i].offset;
        m->params[i].g = m->g + m->params[i].offset;
    }
    size_t pi = 0;
    m->embed = &m->params[pi++];
    for (uint32_t l = 0; l < c.n_layers && !fail; l++) {
        layer *L = &m->layers[l];
        L->attn_norm = &m->params[pi++];
        L->wq = &m->params[pi++];
        L->wk = &m->params[pi++];
        L->wv = &m->params[pi++];
        L->wo = &m->params[pi++];
        L->mlp_norm = &m->params[pi++];
        L->wgate = &m->params[pi++];
        L->wup = &m->params[pi++];
        L->wdown = &m->params[pi++];
        L->x = dalloc(m, N * C, &fail);
        L->h1 = dalloc(m, N * C, &fail);
        L->rstd1 = dalloc(m, N, &fail);
        L->q = dalloc(m, N * QD, &fail);
        L->k = dalloc(m, N * KD, &fail);
        L->v = dalloc(m, N * KD, &fail);
        L->probs = dalloc(m, (size_t)B * m->NH_l * T * T, &fail);
        L->att = dalloc(m, N * QD, &fail);
        L->xm = dalloc(m, N * C, &fail);
        L->h2 = dalloc(m, N * C, &fail);
        L->rstd2 = dalloc(m, N, &fail);
        L->gate = dalloc(m, N * F, &fail);
        L->up = dalloc(m, N * F, &fail);
        L->act = dalloc(m, N * F, &fail);
    }
    m->final_norm = &m->params[pi++];
    m->lm_head = c.tie_embeddings ? m->embed : &m->params[pi++];
    m->xL = dalloc(m, N * C, &fail);
    m->hf = dalloc(m, N * C, &fail);
    m->rstdf = dalloc(m, N, &fail);
    m->logits = dalloc(m, N * m->VP_l, &fail);
    m->dlogits = dalloc(m, N * m->VP_l, &fail);
    m->mx = dalloc(m, N, &fail);
    m->sum = dalloc(m, N, &fail);
    m->tgt = dalloc(m, N, &fail);
    m->loss = dalloc(m, N, &fail);
    m->ids = (int32_t *)dalloc(m, N, &fail);
    m->targets = (int32_t *)dalloc(m, N, &fail);
    m->dres = dalloc(m, N * C, &fail);
    m->dh = dalloc(m, N * C, &fail);
    m->dq = dalloc(m, N * QD, &fail);
    m->dk = dalloc(m, N * KD, &fail);
    m->dv = dalloc(m, N * KD, &fail);
    m->datt = dalloc(m, N * QD, &fail);
    m->dgate = dalloc(m, N * F, &fail);
    m->dup = dalloc(m, N * F, &fail);
    m->dact = dalloc(m, N * F, &fail);
    m->host_loss = malloc(N * sizeof(float));
    if (fail || !m->host_loss) {
        tks_model_free(m);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of memory allocating the model and activations for micro-batch %d x "
                        "%d: lower --micro-batch or --seq-len",
                        B, T);
    }
    *out = m;
    return 0;
}

void tks_model_free(tks_model *m) {
    if (!m) return;
    tks_backend *be = m->be;
#define F(p) do { if (p) be->free(be, (void *)(p)); } while (0)
    for (uint32_t l = 0; m->layers && l < m->cfg.n_layers; l++) {
        layer *L = &m->layers[l];
        F(L->x); F(L->h1); F(L->rstd1); F(L->q); F(L->k); F(L->v); F(L->probs); F(L->att);
        F(L->xm); F(L->h2); F(L->rstd2); F(L->gate); F(L->up); F(L->act); F(L->kc); F(L->vc);
    }
    F(m->w); F(m->g); F(m->xL); F(m->hf); F(m->rstdf); F(m->logits); F(m->dlogits); F(m->mx);
    F(m->sum); F(m->tgt); F(m->loss); F(m->ids); F(m->targets); F(m->dres); F(m->dh); F(m->dq);
    F(m->dk); F(m->dv); F(m->datt); F(m->dgate); F(m->dup); F(m->dact);
#undef F
    free(m->host_loss);
    free(m->layers);
    free(m->params);
    free(m);
}

const tks_model_config *tks_model_config_of(const tks_model *m) { return &m->cfg; }
tks_backend *tks_model_backend(const tks_model *m) { return m->be; }
tks_comm *tks_model_tp(const tks_model *m) { return m->tp; }
const tks_param *tks_model_params(const tks_model *m, size_t *n) {
    *n = m->n_params;
    return m->params;
}
float *tks_model_weights(tks_model *m) { return m->w; }
float *tks_model_grads(tks_model *m) { return m->g; }
size_t tks_model_n_local(const tks_model *m) { return m->n_local; }
size_t tks_model_n_flat(const tks_model *m) { return m->n_flat; }
const float *tks_model_logits(const tks_model *m) { return m->logits; }

/* ---- initialization ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z) { /* splitmix64 finalizer (Steele et al. 2014) */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) { /* FNV-1a 64 */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* N(0,1) for element `i` of the tensor keyed `key` (Box-Muller on two hashes). */
static float gauss(uint64_t key, uint64_t i) {
    uint64_t a = mix64(key ^ mix64(2 * i + 1)), b = mix64(key ^ mix64(2 * i + 2));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double u2 = (b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void tks_model_init(tks_model *m, uint64_t seed) {
    for (size_t i = 0; i < m->n_params; i++) {
        tks_param *p = &m->params[i];
        size_t n = p->lrows * p->lcols;
        float *h = malloc(n * sizeof *h);
        uint64_t key = mix64(seed ^ name_hash(p->name));
        for (uint64_t r = 0; r < p->lrows; r++)
            for (uint64_t c = 0; c < p->lcols; c++) {
                uint64_t gr = p->row0 + r, gc = p->col0 + c;
                float v;
                if (p->ndim == 1) v = 1.0f;                      /* RMSNorm weights */
                else if (gr >= p->rows_real) v = 0.0f;           /* vocab padding */
                else v = m->cfg.init_std * gauss(key, gr * p->cols + gc);
                h[r * p->lcols + c] = v;
            }
        m->be->upload(m->be, p->w, h, n * sizeof *h);
        free(h);
    }
}

/* ---- helpers ------------------------------------------------------------------- */

/* y[M,out] (beta=0: =, beta=1: +=) x[M,in] @ W[out,in]^T */
static void linear(tks_model *m, float *y, const float *x, const float *W, int M, int out, int in,
                   float beta) {
    m->be->gemm(m->be, 0, 1, M, out, in, 1.0f, x, in, W, in, beta, y, out);
}
/* dW[out,in] += dy[M,out]^T @ x[M,in] */
static void linear_dw(tks_model *m, float *dW, const float *dy, const float *x, int M, int out,
                      int in) {
    m->be->gemm(m->be, 1, 0, out, in, M, 1.0f, dy, out, x, in, 1.0f, dW, in);
}
/* dx[M,in] (beta) dy[M,out] @ W[out,in] */
static void linear_dx(tks_model *m, float *dx, const float *dy, const float *W, int M, int out,
                      int in, float beta) {
    m->be->gemm(m->be, 0, 0, M, in, out, 1.0f, dy, out, W, in, beta, dx, in);
}

static int tp_sum(tks_model *m, float *buf, size_t n) {
    return m->tp_size > 1 ? m->tp->allreduce_sum(m->tp, buf, n) : 0;
}
static int tp_max(tks_model *m, float *buf, size_t n) {
    return m->tp_size > 1 ? m->tp->allreduce_max(m->tp, buf, n) : 0;
}

/* ---- forward ---------------------------------------------------------------------- */

/* One transformer layer on rows [0, M) with B x T shape; decode uses the KV
 * cache at position `pos` (M = 1) instead of full attention. */
static int layer_forward(tks_model *m, layer *L, float *x_out, int B, int T, int decode, int pos) {
    tks_backend *be = m->be;
    const tks_model_config *c = &m->cfg;
    int M = B * T, C = m->C, HD = m->HD, QD = m->NH_l * HD, KD = m->NKV_l * HD, F = m->F_l;
    int rc;
    be->rmsnorm_fwd(be, L->h1, L->rstd1, L->x, L->attn_norm->w, M, C, c->norm_eps);
    linear(m, L->q, L->h1, L->wq->w, M, QD, C, 0);
    linear(m, L->k, L->h1, L->wk->w, M, KD, C, 0);
    linear(m, L->v, L->h1, L->wv->w, M, KD, C, 0);
    be->rope(be, L->q, B, T, m->NH_l, HD, decode ? pos : 0, c->rope_theta, 0);
    be->rope(be, L->k, B, T, m->NKV_l, HD, decode ? pos : 0, c->rope_theta, 0);
    if (decode) {
        be->copy(be, L->kc + (size_t)pos * KD, L->k, (size_t)KD * sizeof(float));
        be->copy(be, L->vc + (size_t)pos * KD, L->v, (size_t)KD * sizeof(float));
        be->attention_step(be, L->att, L->q, L->kc, L->vc, pos, m->NH_l, m->NKV_l, HD);
    } else {
        be->attention_fwd(be, L->att, L->probs, L->q, L->k, L->v, B, T, m->NH_l, m->NKV_l, HD);
    }
    linear(m, L->xm, L->att, L->wo->w, M, C, QD, 0);
    if ((rc = tp_sum(m, L->xm, (size_t)M * C))) return rc;
    be->add(be, L->xm, L->xm, L->x, (size_t)M * C);
    be->rmsnorm_fwd(be, L->h2, L->rstd2, L->xm, L->mlp_norm->w, M, C, c->norm_eps);
    linear(m, L->gate, L->h2, L->wgate->w, M, F, C, 0);
    linear(m, L->up, L->h2, L->wup->w, M, F, C, 0);
    be->swiglu_fwd(be, L->act, L->gate, L->up, (size_t)M * F);
    linear(m, x_out, L->act, L->wdown->w, M, C, F, 0);
    if ((rc = tp_sum(m, x_out, (size_t)M * C))) return rc;
    be->add(be, x_out, x_out, L->xm, (size_t)M * C);
    return 0;
}

static int trunk_forward(tks_model *m, int B, int T, int decode, int pos) {
    tks_backend *be = m->be;
    int M = B * T, C = m->C, rc;
    float *x0 = m->layers[0].x;
    be->embedding_fwd(be, x0, m->ids, m->embed->w, M, C, m->v0, (int)m->VP_l);
    if ((rc = tp_sum(m, x0, (size_t)M * C))) return rc;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        float *next = l + 1 < m->cfg.n_layers ? m->layers[l + 1].x : m->xL;
        if ((rc = layer_forward(m, &m->layers[l], next, B, T, decode, pos))) return rc;
    }
    be->rmsnorm_fwd(be, m->hf, m->rstdf, m->xL, m->final_norm->w, M, C, m->cfg.norm_eps);
    linear(m, m->logits, m->hf, m->lm_head->w, M, (int)m->VP_l, C, 0);
    return 0;
}

int tks_model_forward(tks_model *m, const int32_t *ids, const int32_t *targets, double *loss_sum) {
    tks_backend *be = m->be;
    int N = m->N, rc;
    be->upload(be, m->ids, ids, (size_t)N * sizeof(int32_t));
    be->upload(be, m->targets, targets, (size_t)N * sizeof(int32_t));
    if ((rc = trunk_forward(m, m->B, m->T, 0, 0))) return rc;
    int V = (int)m->VP_l, VR = (int)m->VR_l;
    be->xent_max(be, m->mx, m->logits, N, V, VR);
    if ((rc = tp_max(m, m->mx, (size_t)N))) return rc;
    be->xent_sumexp(be, m->sum, m->logits, m->mx, N, V, VR);
    if ((rc = tp_sum(m, m->sum, (size_t)N))) return rc;
    be->xent_target(be, m->tgt, m->logits, m->targets, N, V, m->v0, VR);
    if ((rc = tp_sum(m, m->tgt, (size_t)N))) return rc;
    be->xent_loss(be, m->loss, m->mx, m->sum, m->tgt, N);
    be->download(be, m->host_loss, m->loss, (size_t)N * sizeof(float));
    double s = 0;
    for (int i = 0; i < N; i++) s += m->host_loss[i];
    *loss_sum = s;
    return 0;
}

/* ---- backward ------------------------------------------------------------------------ */

int tks_model_backward(tks_model *m, float loss_scale) {
    tks_backend *be = m->be;
    int N = m->N, C = m->C, HD = m->HD, QD = m->NH_l * HD, KD = m->NKV_l * HD, F = m->F_l;
    int V = (int)m->VP_l, rc;
    be->xent_bwd(be, m->dlogits, m->logits, m->mx, m->sum, m->targets, N, V, m->v0, (int)m->VR_l,
                 loss_scale);
    linear_dw(m, m->lm_head->g, m->dlogits, m->hf, N, V, C);
    linear_dx(m, m->dh, m->dlogits, m->lm_head->w, N, V, C, 0);
    if ((rc = tp_sum(m, m->dh, (size_t)N * C))) return rc;
    be->memzero(be, m->dres, (size_t)N * C * sizeof(float));
    be->rmsnorm_bwd(be, m->dres, m->final_norm->g, m->dh, m->xL, m->final_norm->w, m->rstdf, N, C);
    for (int l = (int)m->cfg.n_layers - 1; l >= 0; l--) {
        layer *L = &m->layers[l];
        /* MLP: x_out = xm + down(silu(gate(h2)) * up(h2)); dres = d x_out */
        linear_dw(m, L->wdown->g, m->dres, L->act, N, C, F);
        linear_dx(m, m->dact, m->dres, L->wdown->w, N, C, F, 0);
        be->swiglu_bwd(be, m->dgate, m->dup, m->dact, L->gate, L->up, (size_t)N * F);
        linear_dw(m, L->wgate->g, m->dgate, L->h2, N, F, C);
        linear_dw(m, L->wup->g, m->dup, L->h2, N, F, C);
        linear_dx(m, m->dh, m->dgate, L->wgate->w, N, F, C, 0);
        linear_dx(m, m->dh, m->dup, L->wup->w, N, F, C, 1);
        if ((rc = tp_sum(m, m->dh, (size_t)N * C))) return rc;
        be->rmsnorm_bwd(be, m->dres, L->mlp_norm->g, m->dh, L->xm, L->mlp_norm->w, L->rstd2, N, C);
        /* attention: xm = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))); dres = d xm */
        linear_dw(m, L->wo->g, m->dres, L->att, N, C, QD);
        linear_dx(m, m->datt, m->dres, L->wo->w, N, C, QD, 0);
        be->attention_bwd(be, m->dq, m->dk, m->dv, m->datt, L->probs, L->q, L->k, L->v, m->B, m->T,
                          m->NH_l, m->NKV_l, HD);
        be->rope(be, m->dq, m->B, m->T, m->NH_l, HD, 0, m->cfg.rope_theta, 1);
        be->rope(be, m->dk, m->B, m->T, m->NKV_l, HD, 0, m->cfg.rope_theta, 1);
        linear_dw(m, L->wq->g, m->dq, L->h1, N, QD, C);
        linear_dw(m, L->wk->g, m->dk, L->h1, N, KD, C);
        linear_dw(m, L->wv->g, m->dv, L->h1, N, KD, C);
        linear_dx(m, m->dh, m->dq, L->wq->w, N, QD, C, 0);
        linear_dx(m, m->dh, m->dk, L->wk->w, N, KD, C, 1);
        linear_dx(m, m->dh, m->dv, L->wv->w, N, KD, C, 1);
        if ((rc = tp_sum(m, m->dh, (size_t)N * C))) return rc;
        be->rmsnorm_bwd(be, m->dres, L->attn_norm->g, m->dh, L->x, L->attn_norm->w, L->rstd1, N, C);
    }
    be->embedding_bwd(be, m->embed->g, m->dres, m->ids, N, C, m->v0, (int)m->VP_l);
    return 0;
}

void tks_model_zero_grad(tks_model *m) { m->be->memzero(m->be, m->g, m->n_flat * sizeof(float)); }

/* ---- decoding with a KV cache ---------------------------------------------------------- */

int tks_model_kv_reset(tks_model *m) {
    if (m->tp_size != 1)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "decoding runs with tp = 1");
    size_t n = (size_t)m->cfg.max_seq_len * m->NKV_l * m->HD;
    int fail = 0;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        layer *L = &m->layers[l];
        if (!L->kc) L->kc = dalloc(m, n, &fail);
        if (!L->vc) L->vc = dalloc(m, n, &fail);
        if (fail) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (KV cache)");
        m->be->memzero(m->be, L->kc, n * sizeof(float));
        m->be->memzero(m->be, L->vc, n * sizeof(float));
    }
    m->kv_ready = 1;
    return 0;
}

int tks_model_decode_step(tks_model *m, int32_t token, int pos, float *logits) {
    if (!m->kv_ready) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "call tks_model_kv_reset first");
    if (pos < 0 || (uint32_t)pos >= m->cfg.max_seq_len)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "position %d is past max_seq_len %u: the context is full", pos,
                        m->cfg.max_seq_len);
    if (token < 0 || (uint32_t)token >= m->cfg.vocab_size)
        return tks_fail(TKS_ERR_TOKEN_RANGE, NULL, TKS_NONE, (uint64_t)pos,
                        "token id %d at position %d is not below the vocabulary size %u", token, pos,
                        m->cfg.vocab_size);
    m->be->upload(m->be, m->ids, &token, sizeof token);
    int rc = trunk_forward(m, 1, 1, 1, pos);
    if (rc) return rc;
    m->be->download(m->be, logits, m->logits, (size_t)m->cfg.vocab_size * sizeof(float));
    return 0;
}
