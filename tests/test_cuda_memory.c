/*
 * test_cuda_memory.c - the --dry-run memory plan (trainer/perf/memplan.h) against
 * what the CUDA backend really allocates for one rank of a run, allocated as
 * tks_train does (model, AdamW slice, gradient staging buffer, step scalars): within 5%
 * (the GPU issue's bound) in fp32 and bf16, for one process and for rank 0 of
 * dp_shard 2; and the out-of-memory message of a run far too large for the
 * GPU names its largest buffers and what to change. Exits 77 where no CUDA
 * device is usable (ctest: skipped).
 *
 * What is compared: tks_cuda_backend_memory's peak (every be->alloc, rounded
 * to 256 bytes as cudaMalloc is asked) plus tks_cuda_backend_reserved (the
 * backend's own cuBLASLt workspace and partials) against the plan's total.
 * Not compared: the CUDA context and the libraries' handles, which no
 * setting of tokshard changes.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/cuda/cuda.h"
#include "trainer/perf/memplan.h"
#include "trainer/model/model.h"
#include "trainer/model/optim.h"

static int failures;

static tks_model_config gpt2_small(void) { /* the 124M-class shape of bench/gpu */
    tks_model_config c = {0};
    c.vocab_size = 50257, c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12;
    c.ffn_dim = 2048, c.max_seq_len = 1024, c.tie_embeddings = 1;
    tks_model_config_defaults(&c);
    return c;
}

/* allocates one rank of (1, S, 1) as tks_train does and compares */
static void check(const char *what, tks_dtype dt, int S, int B, int T) {
    tks_model_config c = gpt2_small();
    tks_mesh_shape sh = {1, S, 1};
    tks_backend *be = NULL;
    tks_model *m = NULL;
    tks_optim *opt = NULL;
    float *gstage = NULL, *dred = NULL;
    int rc = tks_cuda_backend_create(-1, &be);
    tks_mem_plan p;
    if (!rc) rc = tks_mem_plan_make(&c, &sh, B, T, dt, be, &p);
    if (!rc) rc = tks_model_create_dt(&c, be, NULL, B, T, (size_t)S, dt, &m);
    tks_adamw_opts o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .total = 1};
    size_t ns = m ? tks_model_n_flat(m) / (size_t)S : 0;
    if (!rc) rc = tks_optim_create(m, &o, 0, ns, &opt);
    size_t n_stage = m ? tks_mem_grad_stage_elems(&sh, tks_model_n_flat(m)) : 0;
    if (!rc && n_stage && !(gstage = be->ops->alloc(be, n_stage * sizeof *gstage))) rc = TKS_ERR_NOMEM;
    if (!rc && !(dred = be->ops->alloc(be, TKS_MEM_STEP_SCALARS * sizeof *dred))) rc = TKS_ERR_NOMEM;
    if (rc) {
        printf("FAIL %s: %s (%s)\n", what, tks_strerror(rc), tks_last_error()->message);
        failures++;
    } else {
        size_t now = 0, peak = 0;
        tks_cuda_backend_memory(be, &now, &peak);
        double real = (double)peak + (double)tks_cuda_backend_reserved(be);
        double rel = fabs(p.total - real) / real;
        char line[600];
        tks_mem_plan_format(&p, line, sizeof line);
        int ok = rel <= 0.05 && p.n_flat == tks_model_n_flat(m);
        printf("%-40s plan %.1f MiB, allocated %.1f MiB (%+.3f%%)  %s\n    plan: %s\n", what,
               p.total / 1048576.0, real / 1048576.0, 100.0 * (p.total - real) / real,
               ok ? "ok" : "FAIL", line);
        failures += !ok;
    }
    if (gstage) be->ops->free(be, gstage);
    if (dred) be->ops->free(be, dred);
    tks_optim_free(opt);
    tks_model_free(m);
    if (be) be->ops->destroy(be);
}

/* a micro-batch far beyond any GPU: the message names the activations and the flags */
static void out_of_memory(void) {
    tks_model_config c = gpt2_small();
    tks_mesh_shape sh = {1, 1, 1};
    int B = 4096, T = 1024;
    tks_backend *be = NULL;
    tks_model *m = NULL;
    int rc = tks_cuda_backend_create(-1, &be);
    if (!rc) rc = tks_model_create_dt(&c, be, NULL, B, T, 1, TKS_BF16, &m);
    if (rc == TKS_ERR_NOMEM) rc = tks_mem_explain_nomem(&c, &sh, B, T, TKS_BF16, be);
    const char *msg = tks_last_error()->message;
    int ok = rc == TKS_ERR_NOMEM && strstr(msg, "largest: activations") &&
             strstr(msg, "--micro-batch 4096") && strstr(msg, "--seq-len 1024");
    printf("%-40s %s\n    %s\n", "out of memory names the buffers", ok ? "ok" : "FAIL", msg);
    failures += !ok;
    tks_model_free(m);
    if (be) {
        /* the backend stays usable after a failed allocation */
        void *x = be->ops->alloc(be, 1 << 20);
        int usable = x != NULL && be->ops->sync(be) == 0;
        printf("%-40s %s\n", "the backend is usable after it", usable ? "ok" : "FAIL");
        failures += !usable;
        be->ops->free(be, x);
        be->ops->destroy(be);
    }
}

int main(void) {
    if (tks_cuda_device_count() == 0) {
        printf("skipped: no CUDA device (%s)\n",
               tks_cuda_built() ? "built with CUDA, none visible" : "built without CUDA");
        return 77;
    }
    check("fp32, one process, B 4 x T 1024", TKS_F32, 1, 4, 1024);
    check("bf16, one process, B 8 x T 1024", TKS_BF16, 1, 8, 1024);
    check("bf16, rank 0 of dp_shard 2, B 2 x T 512", TKS_BF16, 2, 2, 512);
    out_of_memory();
    printf("test_cuda_memory: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
