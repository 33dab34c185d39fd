/*
 * bench_gpu.c - tokens/s, MFU and peak device memory of tokshard's trainer
 * step (forward, backward, global-norm clip, AdamW) on the CUDA backend, for
 * the configs the GPU benchmark compares with PyTorch (bench/gpu/run.sh).
 *
 * MFU uses torchtitan's formula (torchtitan/tools/utils.py,
 * get_num_flop_per_token): flops per token = 6 N + 12 L H Q T, N = parameters
 * without the token embedding, L layers, H heads, Q head dim, T sequence;
 * peak 989e12 FLOP/s (H100 SXM / H200 dense bf16), so fp32 runs are measured
 * against the same peak (their MFU is low by construction). Attention in
 * bf16 is cuDNN's fused kernel when built with it (TKS_CUDNN_ATTENTION=0:
 * tokshard's own), in fp32 always tokshard's.
 *
 * Usage: tokshard-bench-gpu CONFIG B T STEPS WARMUP [fp32|bf16]
 *        (CONFIG: 1b | 124m | tiny; the step is the trainer's device-side one)
 * Prints one JSON object on stdout.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tks.h"
#include "trainer/cuda/cuda.h"
#include "trainer/memplan.h"
#include "trainer/model.h"
#include "trainer/optim.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int config(const char *name, tks_model_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_divisible_by = 64;
    if (!strcmp(name, "1b")) { /* Llama-3.2-1B shape, untied head */
        c->vocab_size = 128256, c->dim = 2048, c->n_layers = 16, c->n_heads = 32;
        c->n_kv_heads = 8, c->ffn_dim = 8192, c->max_seq_len = 2048, c->rope_theta = 500000.0f;
    } else if (!strcmp(name, "124m")) { /* GPT-2-small class, LLaMA blocks, tied as in llm.c */
        c->vocab_size = 50257, c->dim = 768, c->n_layers = 12, c->n_heads = 12;
        c->n_kv_heads = 12, c->ffn_dim = 2048, c->max_seq_len = 1024, c->tie_embeddings = 1;
    } else if (!strcmp(name, "tiny")) { /* smoke test of this program */
        c->vocab_size = 1000, c->dim = 128, c->n_layers = 2, c->n_heads = 4;
        c->n_kv_heads = 2, c->ffn_dim = 256, c->max_seq_len = 256;
    } else {
        return -1;
    }
    tks_model_config_defaults(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: tokshard-bench-gpu CONFIG(1b|124m|tiny) B T STEPS WARMUP [fp32|bf16]\n");
        return 2;
    }
    tks_model_config c;
    if (config(argv[1], &c)) {
        fprintf(stderr, "tokshard-bench-gpu: unknown config %s (1b, 124m, tiny)\n", argv[1]);
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]), warm = atoi(argv[5]);
    tks_dtype dt = argc == 7 && !strcmp(argv[6], "bf16") ? TKS_BF16 : TKS_F32;
    if (B < 1 || T < 2 || T > (int)c.max_seq_len || steps < 1 || warm < 0) {
        fprintf(stderr, "tokshard-bench-gpu: need B >= 1, 2 <= T <= %u, STEPS >= 1, WARMUP >= 0\n",
                c.max_seq_len);
        return 2;
    }
    tks_backend *be = NULL;
    if (tks_cuda_backend_create(-1, &be)) {
        fprintf(stderr, "tokshard-bench-gpu: %s\n", tks_last_error()->message);
        return 1;
    }
    char desc[512];
    tks_cuda_describe(be, desc, sizeof desc);
    tks_model *m = NULL;
    tks_optim *opt = NULL;
    tks_adamw_opts o = {.lr = 3e-4f, .min_lr = 3e-5f, .warmup = 10, .total = 1000, .beta1 = 0.9f,
                        .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    float *dred = NULL;
    int rc = tks_model_create_dt(&c, be, NULL, B, T, 1, dt, &m);
    if (!rc) rc = tks_optim_create(m, &o, 0, tks_model_n_flat(m), &opt);
    if (!rc && !(dred = be->alloc(be, 4 * sizeof *dred)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of device memory");
    if (rc) {
        fprintf(stderr, "tokshard-bench-gpu: %s\n", tks_last_error()->message);
        return 1;
    }
    tks_model_init(m, 1);
    size_t n = (size_t)B * T;
    int32_t *ids = malloc(n * sizeof *ids), *tg = malloc(n * sizeof *tg);
    uint64_t s = 42;
    double t0 = 0, loss = 0;
    for (int it = 0; it < warm + steps && !rc; it++) {
        for (size_t i = 0; i < n; i++) { /* uniform random ids, as the PyTorch anchor */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % c.vocab_size);
            tg[i] = (int32_t)((s >> 13) % c.vocab_size);
        }
        if (it == warm) {
            be->sync(be);
            t0 = now();
        }
        /* the trainer's step: loss and norm stay on the device; read after the last */
        tks_model_zero_grad(m);
        rc = be->memzero(be, dred, 4 * sizeof *dred);
        if (!rc) rc = tks_model_forward_train(m, ids, tg, 1.0f / (float)n, dred + 1);
        if (!rc) rc = tks_model_backward(m, 1.0f / (float)n);
        if (!rc) rc = tks_optim_grad_sumsq(opt, dred, 1);
        if (!rc) rc = tks_optim_step_dev(opt, it + 1, tks_lr_at(&o, (uint64_t)it), dred);
    }
    float red[2] = {0, 0};
    if (!rc) rc = be->download(be, red, dred, sizeof red);
    if (!rc) rc = be->sync(be);
    loss = red[1] / (double)n;
    double secs = now() - t0;
    if (!rc) rc = tks_cuda_backend_check(be);
    if (rc) {
        fprintf(stderr, "tokshard-bench-gpu: %s\n", tks_last_error()->message);
        return 1;
    }
    size_t mem_now = 0, mem_peak = 0;
    tks_cuda_backend_memory(be, &mem_now, &mem_peak);
    /* the --dry-run plan of this run (one process) against what was allocated */
    tks_mem_plan plan;
    tks_mesh_shape one = {1, 1, 1};
    double plan_bytes = tks_mem_plan_make(&c, &one, B, T, dt, be, &plan) ? 0.0 : plan.total;
    double real_bytes = (double)mem_peak + (double)tks_cuda_backend_reserved(be);
    uint64_t nparams = tks_model_n_params(&c);
    /* torchtitan subtracts the token embedding's parameters (with tied weights
     * that removes the head's too, as torchtitan's count does) */
    uint64_t nonemb = nparams - (uint64_t)c.vocab_size * c.dim;
    double hd = (double)c.dim / c.n_heads;
    double flop_tok = 6.0 * (double)nonemb + 12.0 * c.n_layers * c.n_heads * hd * T;
    double tps = (double)n * steps / secs;
    printf("{\"impl\": \"tokshard\", \"dtype\": \"%s\", \"config\": \"%s\", \"B\": %d, \"T\": %d, "
           "\"steps\": %d, \"step_s\": %.4f, \"tokens_per_s\": %.1f, \"flop_per_token\": %.4g, "
           "\"mfu\": %.4f, \"peak_bytes\": %zu, \"plan_vs_allocated\": %.4f, \"params\": %llu, \"loss\": %.4f, "
           "\"attention\": \"%s%s\", \"device\": \"%s\"}\n",
           tks_dtype_name(dt), argv[1], B, T, steps, secs / steps, tps, flop_tok, tps * flop_tok / 989e12, mem_peak,
           plan_bytes / real_bytes,
           (unsigned long long)nparams, loss,
           dt == TKS_BF16 && !*tks_cuda_flash_status(be) ? "cuDNN" : "tokshard kernel",
           dt == TKS_BF16 && *tks_cuda_flash_status(be) ? " (cuDNN not used)" : "", desc);
    be->free(be, dred);
    tks_optim_free(opt);
    tks_model_free(m);
    be->destroy(be);
    free(ids), free(tg);
    return 0;
}
