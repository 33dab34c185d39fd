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
#include "trainer/model/model.h"
#include "trainer/model/loss_head.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "common/tks_bits.h"

/* Activations are of the model's dtype dt (void *), statistics fp32. */
typedef struct layer {
    tks_param *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown;
    /* activations, kept for backward */
    void *x;              /* (N, C) input of the layer (residual stream) */
    void *h1;             /* (N, C) attention RMSNorm output */
    float *rstd1;         /* (N) */
    void *qkv;            /* (N, QKV) = q | k | v per row (fused GEMM), q and k after RoPE */
    float *lse;           /* (B, NH_l, T) attention log-sum-exp (flash attention) */
    void *att;            /* (N, NH_l*HD) attention output before o_proj */
    void *xm;             /* (N, C) residual after attention */
    void *h2;             /* (N, C) MLP RMSNorm output */
    float *rstd2;         /* (N) */
    void *gu;             /* (N, 2 F_l) = gate | up per row (fused GEMM) */
    void *act;            /* (N, F_l) */
    void *kc, *vc;        /* (max_seq_len, NKV_l, HD) KV cache for decoding */
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
    tks_dtype dt;            /* activations and compute weights */
    float *w, *g;            /* flat local master weights and grads, fp32 (n_flat elements) */
    void *wc;                /* compute copy of w in dt (bf16 only; fp32 computes on w) */
    size_t n_local, n_flat;
    int QKV;                 /* (NH_l + 2 NKV_l) * HD: a fused q|k|v row */
    layer *layers;
    void *xL, *hf;           /* (N, C) */
    float *rstdf;            /* (N) */
    void *logits;            /* (N, VP_l), or (loss_rows, VP_l) with the chunked loss head;
                              * overwritten in place by dlogits */
    int loss_rows;           /* > 0: lm_head and cross-entropy by chunks of this many rows
                              * (loss_head.h; tp = 1); 0: the whole [N, VP_l] logits */
    float *mx, *sum, *tgt, *loss; /* (N) */
    int32_t *ids, *targets;  /* (N) */
    int32_t *doc, *pos;      /* (N) document starts and positions of the packed documents
                              * (tks_model_set_documents); used when docs_on / pos_on */
    int docs_on, pos_on;
    /* backward scratch */
    void *dres, *dh;         /* (N, C) */
    void *dqkv, *datt;       /* like qkv, att */
    void *dgu, *dact;        /* (N, 2 F_l), (N, F_l) */
    float *host_loss;        /* host (N) */
    void *ws;                /* backend workspace */
    size_t ws_bytes;
    size_t act_bytes;        /* device bytes of activations and scratch (not weights) */
    int dlogits_ready;       /* 1: the last forward left dlogits in logits (fused); 2: it ran
                              * the chunked loss head, dh holds lm_head's input gradient */
    tks_model_grads_ready_fn ready; /* gradient-ready hook (NULL: none) and its context */
    void *ready_ctx;
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
                            uint64_t cols, uint64_t rows_real, tks_tp_split split, int decay) {
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
    p->lrows = split == TKS_TP_ROWS ? rows / tp : rows;
    p->lcols = split == TKS_TP_COLS ? p->cols / tp : p->cols;
    p->row0 = split == TKS_TP_ROWS ? r * p->lrows : 0;
    p->col0 = split == TKS_TP_COLS ? r * p->lcols : 0;
    return p;
}

static int build_params(tks_model *m) {
    const tks_model_config *c = &m->cfg;
    size_t cap = 0;
    uint64_t C = c->dim, HD = (uint64_t)m->HD;
    char nm[64];
    /* pointers into m->params are fixed up after the table is complete */
    if (!add_param(m, &cap, "model.embed_tokens.weight", m->VP, C, c->vocab_size, TKS_TP_ROWS, 1))
        return TKS_ERR_NOMEM;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        struct { const char *suffix; uint64_t rows, cols; tks_tp_split split; int decay; } t[] = {
            {"input_layernorm.weight", C, 0, TKS_TP_REPLICATED, 0},
            {"self_attn.q_proj.weight", c->n_heads * HD, C, TKS_TP_ROWS, 1},
            {"self_attn.k_proj.weight", c->n_kv_heads * HD, C, TKS_TP_ROWS, 1},
            {"self_attn.v_proj.weight", c->n_kv_heads * HD, C, TKS_TP_ROWS, 1},
            {"self_attn.o_proj.weight", C, c->n_heads * HD, TKS_TP_COLS, 1},
            {"post_attention_layernorm.weight", C, 0, TKS_TP_REPLICATED, 0},
            {"mlp.gate_proj.weight", c->ffn_dim, C, TKS_TP_ROWS, 1},
            {"mlp.up_proj.weight", c->ffn_dim, C, TKS_TP_ROWS, 1},
            {"mlp.down_proj.weight", C, c->ffn_dim, TKS_TP_COLS, 1},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(nm, sizeof nm, "model.layers.%u.%s", l, t[i].suffix);
            if (!add_param(m, &cap, nm, t[i].rows, t[i].cols, t[i].rows, t[i].split, t[i].decay))
                return TKS_ERR_NOMEM;
        }
    }
    if (!add_param(m, &cap, "model.norm.weight", C, 0, C, TKS_TP_REPLICATED, 0)) return TKS_ERR_NOMEM;
    if (!c->tie_embeddings &&
        !add_param(m, &cap, "lm_head.weight", m->VP, C, c->vocab_size, TKS_TP_ROWS, 1))
        return TKS_ERR_NOMEM;
    /* 64-byte aligned tensors, except that k and v follow q, and up follows
     * gate, with no gap: the fused q|k|v and gate|up GEMMs read each group
     * as one [rows, C] matrix (the checkpoint still holds the HF tensors) */
    size_t off = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const char *nm = m->params[i].name;
        size_t len = strlen(nm);
        int glue = i > 0 && len > 13 &&
                   (!strcmp(nm + len - 13, "k_proj.weight") || !strcmp(nm + len - 13, "v_proj.weight") ||
                    !strcmp(nm + len - 14, "up_proj.weight"));
        if (!glue) off = (off + 15) & ~(size_t)15;
        m->params[i].offset = off;
        off += m->params[i].lrows * m->params[i].lcols;
    }
    off = (off + 15) & ~(size_t)15;
    m->n_local = off;
    return 0;
}

/* ---- create / free ----------------------------------------------------------- */

/* Device bytes of one model's activations and backward scratch, and the list
 * of buffers behind them: the one place that sizes them, used both by
 * tks_model_create and by the plan (tks_model_activation_bytes), so the
 * dry-run figure is the allocation. Every entry is linear in N = B*T (the
 * flash attention saves lse [B, NH_l, T], never [T, T]). */
typedef struct act_plan {
    size_t N, C, QKV, QD, F, VP_l, NH_l, es; /* es: bytes per dt element */
    size_t LR;                               /* rows of the logits buffer (N, or a chunk's) */
    int n_layers;
} act_plan;

static act_plan plan_of(const tks_model_config *c, int tp, int B, int T, tks_dtype dt) {
    act_plan p;
    size_t HD = c->dim / c->n_heads;
    p.N = (size_t)B * T;
    p.C = c->dim;
    p.NH_l = c->n_heads / (uint32_t)tp;
    p.QD = p.NH_l * HD;
    p.QKV = p.QD + 2 * (size_t)(c->n_kv_heads / (uint32_t)tp) * HD;
    p.F = c->ffn_dim / (uint32_t)tp;
    p.VP_l = tks_model_padded_vocab(c, tp) / (uint32_t)tp;
    p.es = tks_dtype_size(dt);
    p.n_layers = (int)c->n_layers;
    /* the chunked loss head (TKS_LOSS_CHUNK_ROWS, tp = 1) holds one chunk's logits */
    size_t R = tp == 1 ? (size_t)tks_loss_chunk_rows() : 0;
    p.LR = R && R < p.N ? R : p.N;
    return p;
}

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

/* per layer: x, h1, qkv, att, xm, h2, gu, act (dt); rstd1, rstd2 (fp32, N); lse (fp32, B NH_l T = N NH_l) */
static size_t layer_bytes(const act_plan *p) {
    size_t N = p->N, e = p->es;
    return al64(N * p->C * e) * 4 + al64(N * p->QKV * e) + al64(N * p->QD * e) +
           al64(N * 2 * p->F * e) + al64(N * p->F * e) + al64(N * 4) * 2 + al64(N * p->NH_l * 4);
}
/* model-level: xL, hf, dres, dh (dt, N C); logits (dt, LR VP_l); rstdf, mx,
 * sum, tgt, loss (fp32, N); ids, targets, doc, pos (int32, N); dqkv, datt,
 * dgu, dact (dt) */
static size_t top_bytes(const act_plan *p) {
    size_t N = p->N, e = p->es;
    return al64(N * p->C * e) * 4 + al64(p->LR * p->VP_l * e) + al64(N * 4) * 5 + al64(N * 4) * 4 +
           al64(N * p->QKV * e) + al64(N * p->QD * e) + al64(N * 2 * p->F * e) + al64(N * p->F * e);
}

static tks_ws_shape ws_shape(const tks_model_config *c, int tp, int B, int T, tks_dtype dt) {
    tks_ws_shape s = {.B = B, .T = T, .C = (int)c->dim, .NH = (int)(c->n_heads / (uint32_t)tp),
                      .NKV = (int)(c->n_kv_heads / (uint32_t)tp), .HD = (int)(c->dim / c->n_heads),
                      .F = (int)(c->ffn_dim / (uint32_t)tp),
                      .V = (int)(tks_model_padded_vocab(c, tp) / (uint32_t)tp),
                      .Tcache = (int)c->max_seq_len, .dt = dt};
    return s;
}

size_t tks_model_activation_bytes(const tks_model_config *cfg, int tp, int B, int T, tks_dtype dt,
                                  tks_backend *be) {
    tks_model_config c = *cfg;
    tks_model_config_defaults(&c);
    act_plan p = plan_of(&c, tp, B, T, dt);
    size_t ws = 0;
    if (be) {
        tks_ws_shape s = ws_shape(&c, tp, B, T, dt);
        ws = be->ops->workspace_bytes(be, &s);
    }
    return layer_bytes(&p) * (size_t)p.n_layers + top_bytes(&p) + al64(ws);
}

static void *dalloc(tks_model *m, size_t bytes, int *fail) {
    void *p = m->be->ops->alloc(m->be, bytes);
    if (!p) *fail = 1;
    m->act_bytes += al64(bytes);
    return p;
}

int tks_model_create(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                     tks_model **out) {
    return tks_model_create_dt(cfg, be, tp, B, T, 1, TKS_F32, out);
}

int tks_model_create_ex(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                        size_t flat_multiple, tks_model **out) {
    return tks_model_create_dt(cfg, be, tp, B, T, flat_multiple, TKS_F32, out);
}

int tks_model_create_dt(const tks_model_config *cfg, tks_backend *be, tks_comm *tp, int B, int T,
                        size_t flat_multiple, tks_dtype dt, tks_model **out) {
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
    if (dt != TKS_F32 && dt != TKS_BF16)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "dtype %d: use fp32 or bf16", (int)dt);
    tks_model *m = calloc(1, sizeof *m);
    if (!m) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    m->cfg = c;
    m->be = be;
    m->tp = tp;
    m->dt = dt;
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
    m->QKV = (m->NH_l + 2 * m->NKV_l) * m->HD;
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
    act_plan ap = plan_of(&c, tps, B, T, dt);
    size_t N = ap.N, C = ap.C, e = ap.es, F = ap.F;
    size_t fm = flat_multiple ? flat_multiple : 1;
    m->n_flat = (m->n_local + fm - 1) / fm * fm;
    m->w = be->ops->alloc(be, m->n_flat * sizeof(float));
    m->g = be->ops->alloc(be, m->n_flat * sizeof(float));
    if (!m->w || !m->g) fail = 1;
    if (dt != TKS_F32 && !fail && !(m->wc = be->ops->alloc(be, m->n_flat * e))) fail = 1;
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
        /* the same list as layer_bytes */
        L->x = dalloc(m, N * C * e, &fail);
        L->h1 = dalloc(m, N * C * e, &fail);
        L->xm = dalloc(m, N * C * e, &fail);
        L->h2 = dalloc(m, N * C * e, &fail);
        L->qkv = dalloc(m, N * ap.QKV * e, &fail);
        L->att = dalloc(m, N * ap.QD * e, &fail);
        L->gu = dalloc(m, N * 2 * F * e, &fail);
        L->act = dalloc(m, N * F * e, &fail);
        L->rstd1 = dalloc(m, N * 4, &fail);
        L->rstd2 = dalloc(m, N * 4, &fail);
        L->lse = dalloc(m, N * ap.NH_l * 4, &fail);
    }
    m->final_norm = &m->params[pi++];
    m->lm_head = c.tie_embeddings ? m->embed : &m->params[pi++];
    /* the same list as top_bytes */
    m->xL = dalloc(m, N * C * e, &fail);
    m->hf = dalloc(m, N * C * e, &fail);
    m->dres = dalloc(m, N * C * e, &fail);
    m->dh = dalloc(m, N * C * e, &fail);
    m->loss_rows = tps == 1 ? tks_loss_chunk_rows() : 0;
    m->logits = dalloc(m, ap.LR * m->VP_l * e, &fail);
    m->rstdf = dalloc(m, N * 4, &fail);
    m->mx = dalloc(m, N * 4, &fail);
    m->sum = dalloc(m, N * 4, &fail);
    m->tgt = dalloc(m, N * 4, &fail);
    m->loss = dalloc(m, N * 4, &fail);
    m->ids = dalloc(m, N * 4, &fail);
    m->targets = dalloc(m, N * 4, &fail);
    m->doc = dalloc(m, N * 4, &fail);
    m->pos = dalloc(m, N * 4, &fail);
    m->dqkv = dalloc(m, N * ap.QKV * e, &fail);
    m->datt = dalloc(m, N * ap.QD * e, &fail);
    m->dgu = dalloc(m, N * 2 * F * e, &fail);
    m->dact = dalloc(m, N * F * e, &fail);
    /* the workspace for the training shape and for decoding up to max_seq_len */
    tks_ws_shape s1 = ws_shape(&c, tps, B, T, dt);
    m->ws_bytes = be->ops->workspace_bytes(be, &s1);
    if (!fail) m->ws = dalloc(m, m->ws_bytes, &fail);
    if (!fail && be->ops->set_workspace(be, m->ws, m->ws_bytes)) fail = 1;
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
#define F(p) do { if (p) be->ops->free(be, (void *)(p)); } while (0)
    for (uint32_t l = 0; m->layers && l < m->cfg.n_layers; l++) {
        layer *L = &m->layers[l];
        F(L->x); F(L->h1); F(L->rstd1); F(L->qkv); F(L->lse); F(L->att); F(L->xm); F(L->h2);
        F(L->rstd2); F(L->gu); F(L->act); F(L->kc); F(L->vc);
    }
    F(m->w); F(m->g); F(m->wc); F(m->xL); F(m->hf); F(m->rstdf); F(m->logits); F(m->mx);
    F(m->sum); F(m->tgt); F(m->loss); F(m->ids); F(m->targets); F(m->doc); F(m->pos); F(m->dres); F(m->dh);
    F(m->dqkv); F(m->datt); F(m->dgu); F(m->dact);
    if (m->ws) {
        be->ops->set_workspace(be, NULL, 0);
        F(m->ws);
    }
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
void *tks_model_compute_weights(tks_model *m) { return m->wc; }
tks_dtype tks_model_dtype(const tks_model *m) { return m->dt; }
size_t tks_model_n_local(const tks_model *m) { return m->n_local; }
size_t tks_model_n_flat(const tks_model *m) { return m->n_flat; }

size_t tks_model_flat_elems(const tks_model_config *cfg, int tp, size_t flat_multiple) {
    tks_model m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    tks_model_config_defaults(&m.cfg);
    if (tp < 1 || tks_model_config_check(&m.cfg, tp)) return 0;
    m.tp_size = tp; /* every tp rank's block has rank 0's size */
    m.HD = (int)(m.cfg.dim / m.cfg.n_heads);
    m.VP = tks_model_padded_vocab(&m.cfg, tp);
    size_t fm = flat_multiple ? flat_multiple : 1, n = 0;
    if (build_params(&m) == 0) n = (m.n_local + fm - 1) / fm * fm;
    free(m.params);
    return n;
}
const void *tks_model_logits(const tks_model *m) { return m->logits; }
size_t tks_model_act_bytes(const tks_model *m) { return m->act_bytes; }

int tks_model_refresh_compute(tks_model *m) {
    if (m->dt == TKS_F32) return 0;
    int rc = m->be->ops->convert(m->be, m->wc, m->dt, m->w, TKS_F32, m->n_flat);
    return rc ? rc : m->be->ops->sync(m->be);
}

/* ---- initialization ------------------------------------------------------------ */


static uint64_t name_hash(const char *s) { /* FNV-1a 64 */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* N(0,1) for element `i` of the tensor keyed `key` (Box-Muller on two hashes). */
static float gauss(uint64_t key, uint64_t i) {
    uint64_t a = tks_mix64(key ^ tks_mix64(2 * i + 1)), b = tks_mix64(key ^ tks_mix64(2 * i + 2));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double u2 = (b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void tks_model_init(tks_model *m, uint64_t seed) {
    for (size_t i = 0; i < m->n_params; i++) {
        tks_param *p = &m->params[i];
        size_t n = p->lrows * p->lcols;
        float *h = malloc(n * sizeof *h);
        uint64_t key = tks_mix64(seed ^ name_hash(p->name));
        /* every value is hashed from its global index alone, so the rows
         * split over threads give the same bits as one thread */
        int64_t rows = (int64_t)p->lrows;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < p->lcols; c++) {
                uint64_t gr = p->row0 + (uint64_t)r, gc = p->col0 + c;
                float v;
                if (p->ndim == 1) v = 1.0f;                      /* RMSNorm weights */
                else if (gr >= p->rows_real) v = 0.0f;           /* vocab padding */
                else v = m->cfg.init_std * gauss(key, gr * p->cols + gc);
                h[(size_t)r * p->lcols + c] = v;
            }
        m->be->ops->upload(m->be, p->w, h, n * sizeof *h);
        free(h);
    }
    tks_model_refresh_compute(m); /* a failure is sticky: the next sync reports it */
}

/* ---- helpers ------------------------------------------------------------------- */

/* The compute weights of a parameter: the fp32 master in fp32, its dt copy otherwise. */
static const void *cw(const tks_model *m, const tks_param *p) {
    return m->dt == TKS_F32 ? (const void *)p->w
                            : (const void *)((const char *)m->wc + p->offset * tks_dtype_size(m->dt));
}
static void *off(const tks_model *m, void *p, size_t elems) {
    return (char *)p + elems * tks_dtype_size(m->dt);
}

/* y[M,out] (= or += when acc) x[M,in] @ W[out,in]^T; x, W, y in dt */
static int linear(tks_model *m, void *y, const void *x, const void *W, int M, int out, int in,
                  int acc) {
    tks_gemm_args g = {.trans_b = 1, .M = M, .N = out, .K = in, .alpha = 1.0f,
                       .A = x, .a_type = m->dt, .lda = (size_t)in,
                       .B = W, .b_type = m->dt, .ldb = (size_t)in,
                       .C = y, .c_type = m->dt, .ldc = (size_t)out,
                       .compute = TKS_F32, .accumulate = acc};
    return m->be->ops->gemm(m->be, &g);
}
/* dW[out,in] (fp32) += dy[M,out]^T @ x[M,in] (dt): the weight gradient
 * accumulates in fp32 (beta = 1) */
static int linear_dw(tks_model *m, float *dW, const void *dy, const void *x, int M, int out, int in) {
    tks_gemm_args g = {.trans_a = 1, .M = out, .N = in, .K = M, .alpha = 1.0f,
                       .A = dy, .a_type = m->dt, .lda = (size_t)out,
                       .B = x, .b_type = m->dt, .ldb = (size_t)in,
                       .C = dW, .c_type = TKS_F32, .ldc = (size_t)in,
                       .compute = TKS_F32, .accumulate = 1};
    return m->be->ops->gemm(m->be, &g);
}
/* dx[M,in] (= or +=) dy[M,out] @ W[out,in]; all dt */
static int linear_dx(tks_model *m, void *dx, const void *dy, const void *W, int M, int out, int in,
                     int acc) {
    tks_gemm_args g = {.M = M, .N = in, .K = out, .alpha = 1.0f,
                       .A = dy, .a_type = m->dt, .lda = (size_t)out,
                       .B = W, .b_type = m->dt, .ldb = (size_t)in,
                       .C = dx, .c_type = m->dt, .ldc = (size_t)in,
                       .compute = TKS_F32, .accumulate = acc};
    return m->be->ops->gemm(m->be, &g);
}

/* Tensor-parallel all-reduce of an activation or activation gradient in the
 * compute dtype (buf: n elements of m->dt). In bf16 each member's partial sum
 * was rounded to bf16 by its GEMM and the comm adds them in fp32 and rounds
 * once (comm.h), as Megatron-LM's bf16 tp all-reduce does; so bf16 with tp > 1
 * adds one bf16 rounding per all-reduce over tp = 1. */
static int tp_sum(tks_model *m, void *buf, size_t n) {
    tks_coll op = {.kind = TKS_COLL_ALLREDUCE, .dtype = m->dt, .op = TKS_COMM_SUM, .out = buf, .n = n};
    return m->tp_size > 1 ? tks_comm_run(m->tp, &op) : 0;
}
/* fp32 all-reduces of the staged cross-entropy's per-token statistics */
static int tp_sum_f32(tks_model *m, float *buf, size_t n) {
    return m->tp_size > 1 ? tks_comm_allreduce_sum(m->tp, buf, n) : 0;
}
static int tp_max(tks_model *m, float *buf, size_t n) {
    return m->tp_size > 1 ? tks_comm_allreduce_max(m->tp, buf, n) : 0;
}

#define TRY(x) do { if ((rc = (x))) return rc; } while (0)

/* ---- forward ---------------------------------------------------------------------- */

/* The norm after a layer's output: the next layer's attention norm, or the
 * final norm after the last layer. */
typedef struct next_norm {
    void *h;          /* (N, C) normalized output */
    float *rstd;      /* (N) */
    const void *w;    /* (C) weight, compute dtype */
} next_norm;

/* One transformer layer on rows [0, M) with B x T shape; decode uses the KV
 * cache at position `pos` (M = 1) instead of full attention. L->h1 and
 * L->rstd1 already hold the attention norm of L->x (the previous layer's
 * fused add, or trunk_forward's norm of the embedding); the layer's output
 * x_out = its residual sum, and, fused with that add, nx = its norm. */
static int layer_forward(tks_model *m, layer *L, void *x_out, const next_norm *nx, int B, int T,
                         int decode, int pos) {
    tks_backend *be = m->be;
    const tks_model_config *c = &m->cfg;
    tks_dtype dt = m->dt;
    int M = B * T, C = m->C, HD = m->HD, QD = m->NH_l * HD, KD = m->NKV_l * HD, F = m->F_l;
    int QKV = m->QKV, rc;
    void *q = L->qkv, *k = off(m, L->qkv, (size_t)QD), *v = off(m, L->qkv, (size_t)(QD + KD));
    /* q|k|v = h1 @ [Wq; Wk; Wv]^T: one GEMM over the three adjacent tensors */
    TRY(linear(m, L->qkv, L->h1, cw(m, L->wq), M, QKV, C, 0));
    const int32_t *P = !decode && m->pos_on ? m->pos : NULL, *D = m->docs_on ? m->doc : NULL;
    /* q and k in one call: their heads are adjacent in the row (q's NH_l,
     * then k's NKV_l) and each head rotates alone, by the same angles */
    TRY(be->ops->rope(be, q, (size_t)QKV, B, T, m->NH_l + m->NKV_l, HD, decode ? pos : 0, P, c->rope_theta,
                      0, dt));
    if (decode) {
        size_t es = tks_dtype_size(dt);
        TRY(be->ops->copy(be, off(m, L->kc, (size_t)pos * KD), k, (size_t)KD * es));
        TRY(be->ops->copy(be, off(m, L->vc, (size_t)pos * KD), v, (size_t)KD * es));
        TRY(be->ops->attention_step(be, L->att, q, L->kc, L->vc, pos, m->NH_l, m->NKV_l, HD, dt));
    } else {
        TRY(be->ops->attention_fwd(be, L->att, (size_t)QD, L->lse, q, (size_t)QKV, k, v, (size_t)QKV, D,
                                   B, T, m->NH_l, m->NKV_l, HD, dt));
    }
    TRY(linear(m, L->xm, L->att, cw(m, L->wo), M, C, QD, 0));
    TRY(tp_sum(m, L->xm, (size_t)M * C));
    /* xm += x, and h2 = its MLP norm */
    TRY(be->ops->add_rmsnorm_fwd(be, L->xm, L->h2, L->rstd2, L->xm, L->x, cw(m, L->mlp_norm), M, C,
                                 c->norm_eps, dt));
    /* gate|up = h2 @ [Wgate; Wup]^T: one GEMM */
    TRY(linear(m, L->gu, L->h2, cw(m, L->wgate), M, 2 * F, C, 0));
    TRY(be->ops->swiglu_fwd(be, L->act, L->gu, M, F, dt));
    TRY(linear(m, x_out, L->act, cw(m, L->wdown), M, C, F, 0));
    TRY(tp_sum(m, x_out, (size_t)M * C));
    /* x_out += xm, and the next norm of it */
    return be->ops->add_rmsnorm_fwd(be, x_out, nx->h, nx->rstd, x_out, L->xm, nx->w, M, C, c->norm_eps, dt);
}

static int trunk_forward(tks_model *m, int B, int T, int decode, int pos) {
    tks_backend *be = m->be;
    int M = B * T, C = m->C, rc;
    void *x0 = m->layers[0].x;
    TRY(be->ops->embedding_fwd(be, x0, m->ids, cw(m, m->embed), M, C, m->v0, (int)m->VP_l, m->dt));
    TRY(tp_sum(m, x0, (size_t)M * C));
    layer *L0 = &m->layers[0];
    TRY(be->ops->rmsnorm_fwd(be, L0->h1, L0->rstd1, x0, cw(m, L0->attn_norm), M, C, m->cfg.norm_eps,
                             m->dt));
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        layer *next = l + 1 < m->cfg.n_layers ? &m->layers[l + 1] : NULL;
        next_norm nx = {m->hf, m->rstdf, cw(m, m->final_norm)};
        if (next) nx = (next_norm){next->h1, next->rstd1, cw(m, next->attn_norm)};
        TRY(layer_forward(m, &m->layers[l], next ? next->x : m->xL, &nx, B, T, decode, pos));
    }
    /* the chunked loss head makes its logits itself, a chunk at a time */
    if (!m->loss_rows || decode) TRY(linear(m, m->logits, m->hf, cw(m, m->lm_head), M, (int)m->VP_l, C, 0));
    return 0;
}

/* The chunked loss head over the final norm's output (loss_head.h): the
 * loss into m->loss and, with grads, lm_head's weight gradient accumulated
 * and its input gradient into m->dh. */
static int loss_head(tks_model *m, int grads, float loss_scale) {
    tks_loss_head_args a = {.h = m->hf, .W = cw(m, m->lm_head), .targets = m->targets, .loss = m->loss,
                            .dh = grads ? m->dh : NULL, .dW = m->lm_head->g, .buf = m->logits,
                            .mx = m->mx, .sum = m->sum, .tgt = m->tgt, .N = m->N, .C = m->C,
                            .VP = (int)m->VP_l, .VR = (int)m->VR_l, .rows = m->loss_rows,
                            .scale = loss_scale, .dt = m->dt};
    return tks_loss_head(m->be, &a);
}

/* The staged cross-entropy: per-token losses into m->loss, mx and sum kept
 * for xent_bwd; the logits stay. */
static int xent_staged(tks_model *m) {
    tks_backend *be = m->be;
    int N = m->N, V = (int)m->VP_l, VR = (int)m->VR_l, rc;
    TRY(be->ops->xent_max(be, m->mx, m->logits, N, V, VR, m->dt));
    TRY(tp_max(m, m->mx, (size_t)N));
    TRY(be->ops->xent_sumexp(be, m->sum, m->logits, m->mx, N, V, VR, m->dt));
    TRY(tp_sum_f32(m, m->sum, (size_t)N));
    TRY(be->ops->xent_target(be, m->tgt, m->logits, m->targets, N, V, m->v0, VR, m->dt));
    TRY(tp_sum_f32(m, m->tgt, (size_t)N));
    return be->ops->xent_loss(be, m->loss, m->mx, m->sum, m->tgt, N);
}

static int upload_batch(tks_model *m, const int32_t *ids, const int32_t *targets) {
    int rc;
    TRY(m->be->ops->upload(m->be, m->ids, ids, (size_t)m->N * sizeof(int32_t)));
    return m->be->ops->upload(m->be, m->targets, targets, (size_t)m->N * sizeof(int32_t));
}

int tks_model_set_documents(tks_model *m, const int32_t *doc, int mask, int reset_positions) {
    int rc;
    m->docs_on = m->pos_on = 0;
    if (!doc || (!mask && !reset_positions)) return 0;
    for (int b = 0; b < m->B; b++)
        for (int t = 0; t < m->T; t++) {
            int32_t d = doc[(size_t)b * m->T + t];
            if (t == 0 ? d != 0 : d != doc[(size_t)b * m->T + t - 1] && d != t)
                return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                                "document starts of row %d: position %d gives %d, neither the "
                                "previous start nor %d (a caller bug)", b, t, (int)d, t);
        }
    TRY(m->be->ops->upload(m->be, m->doc, doc, (size_t)m->N * sizeof(int32_t)));
    if (reset_positions) {
        /* the row's positions restart at each document: t - doc[t] (host
         * scratch: the loss buffer's bytes, free until the forward) */
        int32_t *p = (int32_t *)m->host_loss;
        for (int i = 0; i < m->N; i++) p[i] = i % m->T - doc[i];
        TRY(m->be->ops->upload(m->be, m->pos, p, (size_t)m->N * sizeof(int32_t)));
        /* the upload is done when it returns (backend.h): the scratch is free again */
    }
    m->docs_on = mask != 0;
    m->pos_on = reset_positions != 0;
    return 0;
}

int tks_model_forward(tks_model *m, const int32_t *ids, const int32_t *targets, double *loss_sum) {
    tks_backend *be = m->be;
    int N = m->N, rc;
    m->dlogits_ready = 0;
    TRY(upload_batch(m, ids, targets));
    TRY(trunk_forward(m, m->B, m->T, 0, 0));
    TRY(m->loss_rows ? loss_head(m, 0, 0.0f) : xent_staged(m));
    TRY(be->ops->download(be, m->host_loss, m->loss, (size_t)N * sizeof(float)));
    TRY(be->ops->sync(be));
    double s = 0;
    for (int i = 0; i < N; i++) s += m->host_loss[i];
    *loss_sum = s;
    return 0;
}

int tks_model_forward_train(tks_model *m, const int32_t *ids, const int32_t *targets,
                            float loss_scale, float *loss_acc) {
    tks_backend *be = m->be;
    int N = m->N, rc;
    m->dlogits_ready = 0;
    TRY(upload_batch(m, ids, targets));
    TRY(trunk_forward(m, m->B, m->T, 0, 0));
    if (m->loss_rows) {
        /* chunked: loss, lm_head's gradients and dh now, no [N, VP] logits */
        TRY(loss_head(m, 1, loss_scale));
        m->dlogits_ready = 2;
        return be->ops->sum(be, loss_acc, m->loss, (size_t)N, 1);
    }
    if (m->tp_size == 1) {
        /* fused: loss and dlogits (in place of the logits) in one pass */
        TRY(be->ops->xent_fused(be, m->loss, m->logits, m->targets, N, (int)m->VP_l, (int)m->VR_l,
                           loss_scale, m->dt));
    } else {
        /* vocab-parallel: staged with tp all-reduces, then dlogits in place */
        TRY(xent_staged(m));
        TRY(be->ops->xent_bwd(be, m->logits, m->logits, m->mx, m->sum, m->targets, N, (int)m->VP_l,
                         m->v0, (int)m->VR_l, loss_scale, m->dt));
    }
    m->dlogits_ready = 1;
    return be->ops->sum(be, loss_acc, m->loss, (size_t)N, 1);
}

/* ---- backward ------------------------------------------------------------------------ */

void tks_model_set_grads_ready(tks_model *m, tks_model_grads_ready_fn ready, void *ctx) {
    m->ready = ready;
    m->ready_ctx = ctx;
}

/* g[begin, end) is final: tell the hook, if any */
static int grads_ready(tks_model *m, size_t begin, size_t end) {
    return m->ready && end > begin ? m->ready(m->ready_ctx, begin, end) : 0;
}

int tks_model_backward(tks_model *m, float loss_scale) {
    tks_backend *be = m->be;
    tks_dtype dt = m->dt;
    int N = m->N, C = m->C, HD = m->HD, QD = m->NH_l * HD, KD = m->NKV_l * HD, F = m->F_l;
    int V = (int)m->VP_l, QKV = m->QKV, rc;
    if (m->loss_rows) {
        /* chunked: forward_train did lm_head's backward; after tks_model_forward
         * the loss head runs again, now with its gradients */
        if (m->dlogits_ready != 2) TRY(loss_head(m, 1, loss_scale));
    } else {
        if (!m->dlogits_ready) /* after tks_model_forward: dlogits in place of the logits */
            TRY(be->ops->xent_bwd(be, m->logits, m->logits, m->mx, m->sum, m->targets, N, V, m->v0,
                                  (int)m->VR_l, loss_scale, dt));
        void *dl = m->logits;
        TRY(linear_dw(m, m->lm_head->g, dl, m->hf, N, V, C));
        TRY(linear_dx(m, m->dh, dl, cw(m, m->lm_head), N, V, C, 0));
    }
    m->dlogits_ready = 0;
    TRY(tp_sum(m, m->dh, (size_t)N * C));
    TRY(be->ops->memzero(be, m->dres, (size_t)N * C * tks_dtype_size(dt)));
    TRY(be->ops->rmsnorm_bwd(be, m->dres, m->final_norm->g, m->dh, m->xL, cw(m, m->final_norm),
                        m->rstdf, N, C, dt));
    /* final norm and lm_head (with tied embeddings the embedding, below the
     * layers, is reported last) up to the end of the padded flat buffer */
    TRY(grads_ready(m, m->final_norm->offset, m->n_flat));
    void *dq = m->dqkv, *dk = off(m, m->dqkv, (size_t)QD), *dv = off(m, m->dqkv, (size_t)(QD + KD));
    for (int l = (int)m->cfg.n_layers - 1; l >= 0; l--) {
        layer *L = &m->layers[l];
        void *q = L->qkv, *k = off(m, L->qkv, (size_t)QD), *v = off(m, L->qkv, (size_t)(QD + KD));
        /* MLP: x_out = xm + down(silu(gate(h2)) * up(h2)); dres = d x_out */
        TRY(linear_dw(m, L->wdown->g, m->dres, L->act, N, C, F));
        TRY(linear_dx(m, m->dact, m->dres, cw(m, L->wdown), N, C, F, 0));
        TRY(be->ops->swiglu_bwd(be, m->dgu, m->dact, L->gu, N, F, dt));
        /* gate and up grads are adjacent in the flat buffer: one GEMM each way */
        TRY(linear_dw(m, L->wgate->g, m->dgu, L->h2, N, 2 * F, C));
        TRY(linear_dx(m, m->dh, m->dgu, cw(m, L->wgate), N, 2 * F, C, 0));
        TRY(tp_sum(m, m->dh, (size_t)N * C));
        TRY(be->ops->rmsnorm_bwd(be, m->dres, L->mlp_norm->g, m->dh, L->xm, cw(m, L->mlp_norm), L->rstd2,
                            N, C, dt));
        /* attention: xm = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))); dres = d xm */
        TRY(linear_dw(m, L->wo->g, m->dres, L->att, N, C, QD));
        TRY(linear_dx(m, m->datt, m->dres, cw(m, L->wo), N, C, QD, 0));
        TRY(be->ops->attention_bwd(be, dq, dk, dv, m->datt, L->att, (size_t)QD, L->lse, q, (size_t)QKV,
                                   k, v, (size_t)QKV, m->docs_on ? m->doc : NULL, m->B, m->T,
                                   m->NH_l, m->NKV_l, HD, dt));
        const int32_t *P = m->pos_on ? m->pos : NULL;
        /* dq and dk, adjacent like q and k: one inverse rotation */
        TRY(be->ops->rope(be, dq, (size_t)QKV, m->B, m->T, m->NH_l + m->NKV_l, HD, 0, P, m->cfg.rope_theta, 1,
                          dt));
        TRY(linear_dw(m, L->wq->g, m->dqkv, L->h1, N, QKV, C));
        TRY(linear_dx(m, m->dh, m->dqkv, cw(m, L->wq), N, QKV, C, 0));
        TRY(tp_sum(m, m->dh, (size_t)N * C));
        TRY(be->ops->rmsnorm_bwd(be, m->dres, L->attn_norm->g, m->dh, L->x, cw(m, L->attn_norm),
                            L->rstd1, N, C, dt));
        /* layer l's tensors are complete: [its first tensor, the next layer's) */
        size_t end = l + 1 < (int)m->cfg.n_layers ? m->layers[l + 1].attn_norm->offset
                                                  : m->final_norm->offset;
        TRY(grads_ready(m, L->attn_norm->offset, end));
    }
    TRY(be->ops->embedding_bwd(be, m->embed->g, m->dres, m->ids, N, C, m->v0, (int)m->VP_l, dt));
    return grads_ready(m, 0, m->layers[0].attn_norm->offset);
}

void tks_model_zero_grad(tks_model *m) { m->be->ops->memzero(m->be, m->g, m->n_flat * sizeof(float)); }

/* ---- decoding with a KV cache ---------------------------------------------------------- */

int tks_model_kv_reset(tks_model *m) {
    if (m->tp_size != 1)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "decoding runs with tp = 1");
    size_t n = (size_t)m->cfg.max_seq_len * m->NKV_l * m->HD * tks_dtype_size(m->dt);
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        layer *L = &m->layers[l];
        if (!L->kc) L->kc = m->be->ops->alloc(m->be, n);
        if (!L->vc) L->vc = m->be->ops->alloc(m->be, n);
        if (!L->kc || !L->vc)
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                            "out of memory allocating the KV cache (%u positions): lower "
                            "max_seq_len", m->cfg.max_seq_len);
        m->be->ops->memzero(m->be, L->kc, n);
        m->be->ops->memzero(m->be, L->vc, n);
    }
    m->kv_ready = 1;
    return m->be->ops->sync(m->be);
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
    int rc;
    TRY(m->be->ops->upload(m->be, m->ids, &token, sizeof token));
    TRY(trunk_forward(m, 1, 1, 1, pos));
    size_t V = m->cfg.vocab_size;
    if (m->dt == TKS_F32) {
        TRY(m->be->ops->download(m->be, logits, m->logits, V * sizeof(float)));
    } else { /* the row is in dt: read it into the first half of the host buffer and widen */
        TRY(m->be->ops->download(m->be, logits, m->logits, V * tks_dtype_size(m->dt)));
        const uint16_t *h = (const uint16_t *)logits;
        for (size_t i = V; i-- > 0;) logits[i] = tks_bf16_to_f32(h[i]);
    }
    return m->be->ops->sync(m->be);
}
