/*
 * test_memplan.c - the per-rank memory plan (trainer/perf/memplan.h) against the
 * model the CPU backend really creates: the flat buffer size for tp 1, 2, 4
 * and dp_shard 1, 2, 3 (tks_model_flat_elems vs tks_model_n_flat), the
 * activation bytes (vs tks_model_act_bytes), the AdamW slice, in fp32 and
 * bf16, tied and untied; and the out-of-memory explanation naming the right
 * buffers. The GPU test cuda_memory checks the total against the CUDA
 * backend's allocation count; this one runs everywhere.
 */
#include <stdio.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/perf/memplan.h"
#include "trainer/model/model.h"

static int failures;
#define CHECK(cond, ...)                        \
    do {                                        \
        if (!(cond)) {                          \
            printf("FAIL: " __VA_ARGS__);       \
            printf("\n");                       \
            failures++;                         \
        }                                       \
    } while (0)

static tks_model_config cfg(int tied) {
    tks_model_config c = {0};
    c.vocab_size = 1000, c.dim = 64, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 4;
    c.ffn_dim = 96, c.max_seq_len = 32, c.tie_embeddings = tied;
    tks_model_config_defaults(&c);
    return c;
}

int main(void) {
    tks_backend *be = tks_cpu_backend_create(1);
    if (!be) return 1;
    int cases = 0;
    for (int tied = 0; tied <= 1; tied++)
        for (int tp = 1; tp <= 4; tp *= 2)
            for (int S = 1; S <= 3; S++)
                for (int d = 0; d < 2; d++) {
                    tks_dtype dt = d ? TKS_BF16 : TKS_F32;
                    if (dt == TKS_BF16 && tp > 1) continue; /* refused by the model */
                    tks_model_config c = cfg(tied);
                    tks_mesh_shape sh = {1, S, tp};
                    tks_mem_plan p;
                    int rc = tks_mem_plan_make(&c, &sh, 2, 16, dt, be, &p);
                    /* rank 0 of a tp group: only size and rank are read at creation */
                    tks_comm tpc;
                    memset(&tpc, 0, sizeof tpc);
                    tpc.size = tp;
                    tks_model *m = NULL;
                    if (!rc) rc = tks_model_create_dt(&c, be, tp > 1 ? &tpc : NULL, 2, 16, (size_t)S, dt, &m);
                    CHECK(rc == 0, "tied %d tp %d S %d %s: %s", tied, tp, S, tks_dtype_name(dt),
                          tks_last_error()->message);
                    if (rc) continue;
                    cases++;
                    size_t n = tks_model_n_flat(m);
                    CHECK(p.n_flat == n, "tp %d S %d: plan n_flat %zu, model %zu", tp, S, p.n_flat, n);
                    CHECK(p.n_slice * (size_t)S == n, "slice %zu x %d != %zu", p.n_slice, S, n);
                    CHECK(p.bytes[TKS_MEM_ACTIVATIONS] == (double)tks_model_act_bytes(m),
                          "tp %d S %d %s: activations plan %.0f, model %zu", tp, S, tks_dtype_name(dt),
                          p.bytes[TKS_MEM_ACTIVATIONS], tks_model_act_bytes(m));
                    CHECK(p.bytes[TKS_MEM_WEIGHTS] == 4.0 * (double)n && p.bytes[TKS_MEM_GRADS] == 4.0 * (double)n,
                          "weights/grads");
                    CHECK(p.bytes[TKS_MEM_COMPUTE] == (dt == TKS_F32 ? 0.0 : 2.0 * (double)n), "compute copy");
                    CHECK(p.bytes[TKS_MEM_MOMENTS] == 8.0 * (double)(n / (size_t)S), "moments");
                    /* the reduce-scatter packs every slice's bucket: the whole flat buffer */
                    CHECK(p.bytes[TKS_MEM_GRAD_STAGE] == (S > 1 ? 4.0 * (double)n : 0.0) + 16.0,
                          "S %d: gradient staging %.0f for n_flat %zu", S, p.bytes[TKS_MEM_GRAD_STAGE], n);
                    CHECK(p.bytes[TKS_MEM_BACKEND] == 0.0, "the CPU backend has no own buffers");
                    tks_model_free(m);
                }
    printf("plan vs model: %d cases\n", cases);
    /* out of memory with a huge micro-batch: activations first, the flags named */
    tks_model_config c = cfg(0);
    c.max_seq_len = 4096;
    tks_mesh_shape sh = {1, 2, 1};
    tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "the backend's own words");
    int rc = tks_mem_explain_nomem(&c, &sh, 512, 4096, TKS_F32, be);
    const char *msg = tks_last_error()->message;
    printf("%s\n", msg);
    CHECK(rc == TKS_ERR_NOMEM, "code %d", rc);
    CHECK(strstr(msg, "largest: activations") && strstr(msg, "lower --micro-batch 512 or --seq-len 4096, or --dtype bf16"),
          "activations and their flags named");
    CHECK(strstr(msg, "the backend's own words") != NULL, "the original message kept");
    /* a large model with a tiny batch: the weights and moments come first */
    c = cfg(0);
    c.vocab_size = 128000, c.dim = 2048;
    tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "x");
    rc = tks_mem_explain_nomem(&c, &sh, 1, 16, TKS_F32, be);
    msg = tks_last_error()->message;
    printf("%s\n", msg);
    /* at dp_shard 2 the staging buffer (n_flat) ties the master weights, and the
     * moments (2 x n_flat / 2) are as large: any of the three is first */
    CHECK(strstr(msg, "largest: AdamW moments") || strstr(msg, "largest: fp32 master weights") ||
              strstr(msg, "largest: gradient staging"),
          "parameters first");
    CHECK(strstr(msg, "raise --tp 1") != NULL, "tp named for the parameters");
    be->ops->destroy(be);
    printf("test_memplan: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
