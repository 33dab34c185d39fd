/* stepmodel.c - the roofline cost of every backend op and a model of one
 * training step built from them (tokshard-train --step-model; docs/GPU.md,
 * "The step model"). The profile (profile.c) prices each call it times with
 * the same functions, so the model's calls and FLOPs are checked against a
 * real run's (tests/test_train.sh, case stepmodel). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/model/loss_head.h"
#include "trainer/model/model.h"
#include "trainer/perf/stepmodel.h"

const char *const tks_op_names[TKS_N_OPS] = {
    "upload",        "download",      "memzero",       "copy",          "gemm",
    "convert",       "add",           "scale",         "sumsq",         "sum",
    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd",   "rmsnorm_bwd",   "add_rmsnorm_fwd", "rope",
    "attention_fwd", "attention_bwd", "attention_step", "swiglu_fwd",   "swiglu_bwd",
    "xent_fused",    "xent_max",      "xent_sumexp",   "xent_target",   "xent_loss",
    "xent_bwd",      "adamw",
};

/* ---- costs ---------------------------------------------------------------- */

tks_cost tks_cost_gemm(const tks_gemm_args *g) {
    double M = g->M, N = g->N, K = g->K;
    tks_cost c = {.flops = 2.0 * M * N * K, .flops_dt = g->a_type};
    c.bytes = M * K * (double)tks_dtype_size(g->a_type) + K * N * (double)tks_dtype_size(g->b_type) +
              M * N * (double)tks_dtype_size(g->c_type) * (g->accumulate ? 2 : 1);
    return c;
}

tks_cost tks_cost_link(double bytes) { return (tks_cost){.link_bytes = bytes}; }

tks_cost tks_cost_rows(tks_op op, double N, double C, size_t es) {
    double e = (double)es, NC = N * C, b = 0;
    switch (op) {
    case TKS_OP_MEMZERO: b = N; break;
    case TKS_OP_COPY: b = 2 * N; break;
    case TKS_OP_ADD: b = 3 * N * e; break;
    case TKS_OP_SCALE: b = 8 * N; break;
    case TKS_OP_SUM:
    case TKS_OP_SUMSQ: b = 4 * N; break;
    case TKS_OP_EMBEDDING_FWD: b = 2 * NC * e + 4 * N; break;          /* ids, rows in, rows out */
    case TKS_OP_EMBEDDING_BWD: b = NC * e + 4 * N + 8 * NC; break;     /* fp32 rows read and written */
    case TKS_OP_RMSNORM_FWD: b = 2 * NC * e + C * e + 4 * N; break;    /* x in, y and rstd out */
    case TKS_OP_RMSNORM_BWD: b = 4 * NC * e + C * e + 4 * N + 8 * C; break; /* dy, x, dx (+=) */
    case TKS_OP_ADD_RMSNORM_FWD: b = 4 * NC * e + C * e + 4 * N; break; /* a, b in; sum, y, rstd out */
    case TKS_OP_ROPE: b = 2 * NC * e; break;
    case TKS_OP_SWIGLU_FWD: b = 3 * NC * e; break;                     /* gate|up in, act out */
    case TKS_OP_SWIGLU_BWD: b = 5 * NC * e; break;                     /* dact, gate|up in, dgate|dup out */
    case TKS_OP_XENT_FUSED: b = 2 * NC * e + 8 * N; break;             /* logits in, dlogits out */
    case TKS_OP_XENT_MAX: b = NC * e + 4 * N; break;
    case TKS_OP_XENT_SUMEXP: b = NC * e + 8 * N; break;
    case TKS_OP_XENT_TARGET: b = N * e + 8 * N; break;
    case TKS_OP_XENT_LOSS: b = 16 * N; break;
    case TKS_OP_XENT_BWD: b = 2 * NC * e + 12 * N; break;
    default: break;
    }
    return (tks_cost){.bytes = b};
}

tks_cost tks_cost_attention(int B, int T, int NH, int NKV, int HD, size_t es, int backward) {
    double b = B, t = T, qd = (double)NH * HD, kd = (double)NKV * HD, e = (double)es;
    double fwd = 2.0 * b * NH * t * t * HD;
    tks_cost c = {.flops = backward ? 2.5 * fwd : fwd, .flops_dt = es == 2 ? TKS_BF16 : TKS_F32};
    /* forward: q, k, v in, out and the log-sum-exp out; backward: q, k, v,
     * out, dout and lse in, dq, dk, dv out (no T x T buffer either way) */
    c.bytes = backward ? b * t * e * (2 * (qd + 2 * kd) + 2 * qd) + 4.0 * b * NH * t
                       : b * t * e * (qd + 2 * kd + qd) + 4.0 * b * NH * t;
    return c;
}

tks_cost tks_cost_adamw(double n, size_t pc_es) {
    /* reads p, g, m, v (fp32), writes p, m, v and the compute copy */
    return (tks_cost){.bytes = n * (4 * 4 + 3 * 4 + (double)pc_es)};
}

double tks_cost_secs(const tks_cost *c, const tks_roofline *hw) {
    double peak = (c->flops_dt == TKS_BF16 ? hw->bf16_tflops : hw->fp32_tflops) * 1e12 * hw->flops_eff;
    double tf = c->flops > 0 && peak > 0 ? c->flops / peak : 0;
    double tm = c->bytes > 0 && hw->mem_gbs > 0 ? c->bytes / (hw->mem_gbs * 1e9 * hw->mem_eff) : 0;
    double tl = c->link_bytes > 0 && hw->link_gbs > 0 ? c->link_bytes / (hw->link_gbs * 1e9) : 0;
    return (tf > tm ? tf : tm) + tl;
}

/* ---- rooflines ------------------------------------------------------------- */

/* Vendor peaks (dense, no sparsity): NVIDIA H100 SXM5 and H200 SXM datasheets
 * (989 TFLOP/s bf16 tensor, 67 TFLOP/s fp32, HBM3 3.35 TB/s, HBM3e 4.8 TB/s),
 * A100 SXM4 80GB (312, 19.5, 2.039 TB/s); host link: PCIe 5.0 / 4.0 x16,
 * about 50 / 25 GB/s achieved from pinned memory. Achievable fractions (what
 * the model predicts with): 0.8 of the tensor peak for large cuBLAS products,
 * 0.85 of the memory bandwidth for streaming kernels; both assumptions for the
 * first GPU measurement to replace. */
static const tks_roofline PRESETS[] = {
    {"h100", 989.0, 67.0, 3350.0, 50.0, 0.8, 0.85, 4.0},
    {"h200", 989.0, 67.0, 4800.0, 50.0, 0.8, 0.85, 4.0},
    {"a100", 312.0, 19.5, 2039.0, 25.0, 0.8, 0.85, 4.0},
};

int tks_roofline_parse(const char *spec, tks_roofline *out) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (spec && !strcmp(spec, PRESETS[i].name)) return *out = PRESETS[i], 0;
    tks_roofline r = {"custom", 0, 0, 0, 0, 1.0, 1.0, 0};
    char tail;
    if (!spec || sscanf(spec, "%lf,%lf,%lf,%lf%c", &r.bf16_tflops, &r.fp32_tflops, &r.mem_gbs,
                        &r.link_gbs, &tail) != 4 ||
        !(r.bf16_tflops > 0) || !(r.fp32_tflops > 0) || !(r.mem_gbs > 0) || !(r.link_gbs > 0) ||
        !isfinite(r.bf16_tflops + r.fp32_tflops + r.mem_gbs + r.link_gbs))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--roofline %s: use h100, h200, a100, or four positive numbers "
                        "BF16_TFLOPS,FP32_TFLOPS,MEMORY_GBS,LINK_GBS (e.g. 989,67,3350,50)",
                        spec ? spec : "(none)");
    *out = r;
    return 0;
}

int tks_roofline_for_device(const char *description, tks_roofline *out) {
    static const char *const names[] = {"H100", "H200", "A100"};
    for (size_t i = 0; description && i < sizeof names / sizeof *names; i++)
        if (strstr(description, names[i])) return *out = PRESETS[i], 1;
    return 0;
}

/* ---- the step model ----------------------------------------------------------- */

typedef struct {
    const tks_roofline *hw;
    double calls[TKS_N_OPS], flops[TKS_N_OPS], bytes[TKS_N_OPS], link[TKS_N_OPS], secs[TKS_N_OPS];
} step_acc;

static void put(step_acc *a, tks_op op, tks_cost c, double times) {
    a->calls[op] += times;
    a->flops[op] += times * c.flops;
    a->bytes[op] += times * c.bytes;
    a->link[op] += times * c.link_bytes;
    a->secs[op] += times * tks_cost_secs(&c, a->hw);
}

static void gemm(step_acc *a, int M, int N, int K, tks_dtype in, tks_dtype out, int acc, double times) {
    tks_gemm_args g = {.M = M, .N = N, .K = K, .a_type = in, .b_type = in, .c_type = out, .accumulate = acc};
    put(a, TKS_OP_GEMM, tks_cost_gemm(&g), times);
}

/* One optimizer step with `accum` micro-batches of B x T on one process
 * (tp 1), op for op as model.c and train.c issue them. */
static void model_step(step_acc *a, const tks_model_config *c, int B, int T, int accum, tks_dtype dt) {
    size_t es = tks_dtype_size(dt);
    double L = c->n_layers, mb = accum;
    int N = B * T, C = (int)c->dim, HD = C / (int)c->n_heads, NH = (int)c->n_heads, NKV = (int)c->n_kv_heads;
    int QD = NH * HD, KD = NKV * HD, QKV = QD + 2 * KD, F = (int)c->ffn_dim;
    int V = (int)tks_model_padded_vocab(c, 1);
    /* the flat fp32 buffers hold the padded vocabulary's rows */
    double NC = (double)N * C, P = (double)tks_model_flat_elems(c, 1, 1);
    /* per micro-batch: the batch up, the forward */
    put(a, TKS_OP_UPLOAD, tks_cost_link(4.0 * N), 2 * mb);
    put(a, TKS_OP_EMBEDDING_FWD, tks_cost_rows(TKS_OP_EMBEDDING_FWD, N, C, es), mb);
    /* the first layer's attention norm; every residual add with the norm
     * that reads it (the next layer's, the MLP's, the final one) */
    put(a, TKS_OP_RMSNORM_FWD, tks_cost_rows(TKS_OP_RMSNORM_FWD, N, C, es), mb);
    put(a, TKS_OP_ADD_RMSNORM_FWD, tks_cost_rows(TKS_OP_ADD_RMSNORM_FWD, N, C, es), 2 * L * mb);
    gemm(a, N, QKV, C, dt, dt, 0, L * mb);
    /* q|k in one call, and dq|dk in the backward */
    put(a, TKS_OP_ROPE, tks_cost_rows(TKS_OP_ROPE, N, QD + KD, es), 2 * L * mb);
    put(a, TKS_OP_ATTENTION_FWD, tks_cost_attention(B, T, NH, NKV, HD, es, 0), L * mb);
    gemm(a, N, C, QD, dt, dt, 0, L * mb);
    gemm(a, N, 2 * F, C, dt, dt, 0, L * mb);
    put(a, TKS_OP_SWIGLU_FWD, tks_cost_rows(TKS_OP_SWIGLU_FWD, N, F, es), L * mb);
    gemm(a, N, C, F, dt, dt, 0, L * mb);
    /* lm_head and the cross-entropy, then lm_head's two backward GEMMs:
     * over the whole N rows, or (TKS_LOSS_CHUNK_ROWS, loss_head.h) chunk by
     * chunk inside the forward, the same bytes and FLOPs in more calls */
    int R = tks_loss_chunk_rows();
    if (R < 1 || R > N) R = N;
    for (int r0 = 0; r0 < N; r0 += R) {
        int n = N - r0 < R ? N - r0 : R;
        gemm(a, n, V, C, dt, dt, 0, mb);
        put(a, TKS_OP_XENT_FUSED, tks_cost_rows(TKS_OP_XENT_FUSED, n, V, es), mb);
        /* the backward: for each linear the weight gradient (fp32,
         * accumulated) and the input gradient */
        gemm(a, V, C, n, dt, TKS_F32, 1, mb);
        gemm(a, n, C, V, dt, dt, 0, mb);
    }
    put(a, TKS_OP_SUM, tks_cost_rows(TKS_OP_SUM, N, 1, es), mb);
    put(a, TKS_OP_MEMZERO, tks_cost_rows(TKS_OP_MEMZERO, NC * es, 1, es), mb);
    put(a, TKS_OP_RMSNORM_BWD, tks_cost_rows(TKS_OP_RMSNORM_BWD, N, C, es), (2 * L + 1) * mb);
    gemm(a, C, F, N, dt, TKS_F32, 1, L * mb);
    gemm(a, N, F, C, dt, dt, 0, L * mb);
    put(a, TKS_OP_SWIGLU_BWD, tks_cost_rows(TKS_OP_SWIGLU_BWD, N, F, es), L * mb);
    gemm(a, 2 * F, C, N, dt, TKS_F32, 1, L * mb);
    gemm(a, N, C, 2 * F, dt, dt, 0, L * mb);
    gemm(a, C, QD, N, dt, TKS_F32, 1, L * mb);
    gemm(a, N, QD, C, dt, dt, 0, L * mb);
    put(a, TKS_OP_ATTENTION_BWD, tks_cost_attention(B, T, NH, NKV, HD, es, 1), L * mb);
    gemm(a, QKV, C, N, dt, TKS_F32, 1, L * mb);
    gemm(a, N, C, QKV, dt, dt, 0, L * mb);
    put(a, TKS_OP_EMBEDDING_BWD, tks_cost_rows(TKS_OP_EMBEDDING_BWD, N, C, es), mb);
    /* once per step: the gradients zeroed, the step's reductions (train.c),
     * the norm for clipping, AdamW writing the compute copy */
    put(a, TKS_OP_MEMZERO, tks_cost_rows(TKS_OP_MEMZERO, 4 * P, 1, es), 1);
    put(a, TKS_OP_MEMZERO, tks_cost_rows(TKS_OP_MEMZERO, 16, 1, es), 1);
    put(a, TKS_OP_UPLOAD, tks_cost_link(4), 1);
    put(a, TKS_OP_DOWNLOAD, tks_cost_link(12), 1);
    put(a, TKS_OP_SUMSQ, tks_cost_rows(TKS_OP_SUMSQ, P, 1, es), 1);
    put(a, TKS_OP_ADAMW, tks_cost_adamw(P, dt == TKS_BF16 ? 2 : 0), 1);
}

static const step_acc *g_sort; /* qsort has no context argument in C11 */
static int cmp_secs(const void *x, const void *y) {
    double p = g_sort->secs[*(const int *)x], q = g_sort->secs[*(const int *)y];
    return p < q ? 1 : p > q ? -1 : 0;
}

int tks_step_model(const tks_model_config *cfg_in, int B, int T, int accum, const char *dtype,
                   const tks_roofline *hw, char **report) {
    *report = NULL;
    tks_model_config c = *cfg_in;
    if (!c.max_seq_len) c.max_seq_len = (uint32_t)T;
    tks_model_config_defaults(&c);
    if (tks_model_config_check(&c, 1)) return -1;
    tks_dtype dt = TKS_F32;
    if (dtype && !strcmp(dtype, "bf16")) dt = TKS_BF16;
    else if (dtype && strcmp(dtype, "fp32"))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "--dtype %s: use fp32 or bf16", dtype);
    if (B < 1 || T < 1 || accum < 1)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "step model: micro-batch %d, seq-len %d and %d micro-batches must be positive", B, T, accum);
    step_acc a = {.hw = hw};
    model_step(&a, &c, B, T, accum, dt);
    int order[TKS_N_OPS], n = 0;
    double secs = 0, flops = 0, bytes = 0, calls = 0, gemm_secs = 0;
    for (int i = 0; i < TKS_N_OPS; i++) {
        if (a.calls[i] > 0) order[n++] = i;
        secs += a.secs[i], flops += a.flops[i], bytes += a.bytes[i], calls += a.calls[i];
    }
    gemm_secs = a.secs[TKS_OP_GEMM] + a.secs[TKS_OP_ATTENTION_FWD] + a.secs[TKS_OP_ATTENTION_BWD];
    g_sort = &a;
    qsort(order, (size_t)n, sizeof *order, cmp_secs);
    /* MFU as torchtitan counts it: 6 x (parameters - token embedding) + 12 x
     * layers x heads x head_dim x seq FLOPs per token, against the bf16 peak */
    double HD = (double)c.dim / c.n_heads, tokens = (double)B * T * accum;
    double fpt = 6.0 * ((double)tks_model_n_params(&c) - (double)c.vocab_size * c.dim) +
                 12.0 * c.n_layers * c.n_heads * HD * T;
    double mfu = secs > 0 ? fpt * tokens / secs / (hw->bf16_tflops * 1e12) : 0;
    char loss_note[96] = "";
    int R = tks_loss_chunk_rows();
    if (R > 0 && R < B * T)
        snprintf(loss_note, sizeof loss_note, "; loss head by chunks of %d rows (TKS_LOSS_CHUNK_ROWS)", R);
    size_t cap = 4096 + (size_t)n * 160;
    char *out = malloc(cap);
    if (!out) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    size_t o = (size_t)snprintf(
        out, cap,
        "step model: dim %u, %u layers, %u heads (%u kv), ffn %u, vocab %u (padded %u), %s; "
        "%d micro-batch(es) of %d x %d per step on one device%s\n"
        "roofline %s: %g TFLOP/s bf16, %g fp32 (x %.2f achievable), memory %g GB/s (x %.2f), "
        "host link %g GB/s\n\n"
        "%-16s %9s %12s %10s %10s %7s %8s\n",
        c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim, c.vocab_size, tks_model_padded_vocab(&c, 1),
        tks_dtype_name(dt), accum, B, T, loss_note, hw->name, hw->bf16_tflops, hw->fp32_tflops, hw->flops_eff,
        hw->mem_gbs, hw->mem_eff, hw->link_gbs, "op", "calls", "GFLOP", "GB", "model ms", "share", "bound");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        double tf = tks_cost_secs(&(tks_cost){.flops = a.flops[i], .flops_dt = dt}, hw);
        double tm = tks_cost_secs(&(tks_cost){.bytes = a.bytes[i]}, hw);
        const char *bound = a.link[i] > 0 ? "link" : tf >= tm ? "compute" : "memory";
        o += (size_t)snprintf(out + o, cap - o, "%-16s %9.0f %12.1f %10.3f %10.3f %6.1f%% %8s\n",
                              tks_op_names[i], a.calls[i], a.flops[i] / 1e9, a.bytes[i] / 1e9,
                              1e3 * a.secs[i], secs > 0 ? 100 * a.secs[i] / secs : 0, bound);
    }
    o += (size_t)snprintf(
        out + o, cap - o,
        "%-16s %9.0f %12.1f %10.3f %10.3f %6.1f%%\n\n"
        "predicted step: %.3f ms for %.0f tokens (%.0f tokens/s); model FLOPs %.3g per token "
        "(torchtitan)\n"
        "predicted MFU: %.1f%% of %g TFLOP/s (matrix products %.1f%% of the step's time, the rest "
        "memory-bound ops)\n"
        "launch floor: %.0f op calls x %g us = %.3f ms when the host cannot run ahead of the GPU "
        "(a CUDA graph removes it)\n",
        "all ops", calls, flops / 1e9, bytes / 1e9, 1e3 * secs, 100.0, 1e3 * secs, tokens,
        secs > 0 ? tokens / secs : 0, fpt, 100 * mfu, hw->bf16_tflops, secs > 0 ? 100 * gemm_secs / secs : 0,
        calls, hw->launch_us, calls * hw->launch_us / 1e3);
    *report = out;
    return 0;
}
