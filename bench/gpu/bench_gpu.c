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
 * Usage: tokshard-bench-gpu [--profile N] [--accum K] CONFIG B T STEPS WARMUP [fp32|bf16] [DEVICE]
 *        (CONFIG: 1b | 124m | tiny; the step is the trainer's device-side one,
 *        tks_step_bench in trainer/trainer.h; DEVICE cuda by default, cpu
 *        for the test that runs this program without a GPU; --accum K: K
 *        micro-batches of B x T a step, gradients accumulated, tokens/s
 *        counting all K (default 1); --profile N:
 *        N more steps after the timed ones with every op timed, their
 *        per-op table on stderr, as tokshard-train --profile prints it)
 * Prints one JSON object on stdout.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/tks_cuda.h"
#include "trainer/trainer.h"

static int config(const char *name, tks_model_config *c) {
    memset(c, 0, sizeof *c);
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
    return 0;
}

int main(int argc, char **argv) {
    int profile = 0, accum = 1;
    while (argc >= 3 && (!strcmp(argv[1], "--profile") || !strcmp(argv[1], "--accum"))) {
        int v = atoi(argv[2]);
        if (v < 1) {
            fprintf(stderr, "tokshard-bench-gpu: %s needs a number >= 1, not '%s'\n", argv[1], argv[2]);
            return 2;
        }
        if (!strcmp(argv[1], "--profile")) profile = v;
        else accum = v;
        argv[2] = argv[0];
        argv += 2, argc -= 2;
    }
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: tokshard-bench-gpu [--profile N] [--accum K] CONFIG(1b|124m|tiny) B T STEPS WARMUP "
                        "[fp32|bf16] [DEVICE]\n");
        return 2;
    }
    tks_backend_register(tks_cuda_backend_kind()); /* NULL in a build without CUDA */
    tks_step_bench_opts o = {.device = argc == 8 ? argv[7] : "cuda", .B = atoi(argv[2]), .T = atoi(argv[3]),
                             .steps = atoi(argv[4]), .warmup = atoi(argv[5]),
                             .bf16 = argc >= 7 && !strcmp(argv[6], "bf16"), .profile = profile,
                             .accum = accum};
    if (config(argv[1], &o.model)) {
        fprintf(stderr, "tokshard-bench-gpu: unknown config %s (1b, 124m, tiny)\n", argv[1]);
        return 2;
    }
    tks_step_bench_result r;
    int rc = tks_step_bench(&o, &r);
    if (rc) {
        fprintf(stderr, "tokshard-bench-gpu: %s\n", tks_last_error()->message);
        return rc == TKS_ERR_ARG ? 2 : 1;
    }
    const tks_model_config *c = &o.model;
    /* torchtitan subtracts the token embedding's parameters (with tied weights
     * that removes the head's too, as torchtitan's count does) */
    uint64_t nonemb = r.params - (uint64_t)c->vocab_size * c->dim;
    double hd = (double)c->dim / c->n_heads;
    double flop_tok = 6.0 * (double)nonemb + 12.0 * c->n_layers * c->n_heads * hd * o.T;
    double tps = (double)o.B * o.T * accum / r.step_s;
    /* the opt-in kernels (README) in effect, for the record */
    const char *flags[] = {"TKS_LOSS_CHUNK_ROWS", "TKS_CUDA_VEC_OPTIM", "TKS_CUDA_NORM_ONEPASS", "TKS_CUDA_ROPE_ROWS",
                           "TKS_CUDA_XENT_VEC", "TKS_CUDA_SWIGLU_VEC"};
    char on[256] = "";
    for (size_t i = 0, o2 = 0; i < sizeof flags / sizeof *flags; i++) {
        const char *v = getenv(flags[i]);
        if (v && *v && strcmp(v, "0") && o2 < sizeof on)
            o2 += (size_t)snprintf(on + o2, sizeof on - o2, "%s%s=%s", o2 ? " " : "", flags[i], v);
    }
    double real_bytes = (double)r.peak_bytes + (double)r.reserved_bytes;
    printf("{\"impl\": \"tokshard\", \"dtype\": \"%s\", \"config\": \"%s\", \"B\": %d, \"T\": %d, \"accum\": %d, "
           "\"steps\": %d, \"step_s\": %.4f, \"tokens_per_s\": %.1f, \"flop_per_token\": %.4g, "
           "\"mfu\": %.4f, \"peak_bytes\": %zu, \"plan_vs_allocated\": %.4f, \"params\": %llu, \"loss\": %.4f, "
           "\"attention\": \"%s\", \"backend\": \"%s\", \"device\": \"%s\", \"opt_in\": \"%s\"}\n",
           o.bf16 ? "bf16" : "fp32", argv[1], o.B, o.T, accum, o.steps, r.step_s, tps, flop_tok,
           tps * flop_tok / 989e12, r.peak_bytes, real_bytes > 0 ? r.plan_bytes / real_bytes : 0.0,
           (unsigned long long)r.params, r.loss, r.attention, r.backend, r.device, on);
    if (r.profile) {
        fprintf(stderr, "per-op profile of %d step%s (%s %s, B %d, T %d):\n%s", profile, profile > 1 ? "s" : "",
                argv[1], o.bf16 ? "bf16" : "fp32", o.B, o.T, r.profile);
        free(r.profile);
    }
    return 0;
}
