/* test_mesh.c - layout planning without MPI: resolution and its error
 * messages, coordinates, group membership for every shape up to 16
 * processes, and the model's tp divisibility checks. Exit 0 = all passed. */
#include "tests/check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/comm/mesh.h"
#include "trainer/model/model.h"


static void expect_refused(int world, int tp, int sh, int rep, const char *needle) {
    tks_mesh_shape s;
    int rc = tks_mesh_resolve(world, tp, sh, rep, &s);
    CHECK(rc == TKS_ERR_ARG, "world %d tp %d shard %d rep %d accepted", world, tp, sh, rep);
    CHECK(strstr(tks_last_error()->message, needle) != NULL, "message '%s' lacks '%s'",
          tks_last_error()->message, needle);
}

static void test_resolve(void) {
    tks_mesh_shape s;
    CHECK(tks_mesh_resolve(16, 0, 8, 2, &s) == 0 && s.tp == 1 && s.dp_shard == 8 && s.dp_replicate == 2, "2x8x1");
    CHECK(tks_mesh_resolve(16, 2, 0, 2, &s) == 0 && s.dp_shard == 4, "omitted dp_shard takes the rest");
    CHECK(tks_mesh_resolve(8, 2, 0, 0, &s) == 0 && s.dp_shard == 4 && s.dp_replicate == 1, "defaults");
    CHECK(tks_mesh_resolve(1, 0, 0, 0, &s) == 0 && s.dp_shard == 1 && s.tp == 1, "one process");
    expect_refused(16, 1, 4, 2, "must equal the number of processes");
    expect_refused(16, 1, 4, 2, "16");
    expect_refused(6, 4, 0, 0, "does not divide");
    expect_refused(4, 3, 0, 0, "launch a multiple of 3");
    expect_refused(8, -1, 0, 0, "at least 1");
    expect_refused(0, 1, 1, 1, "at least one process");
}

static void test_groups(void) {
    /* every shape of every world size 1..16 */
    for (int world = 1; world <= 16; world++)
        for (int tp = 1; tp <= world; tp++)
            for (int rep = 1; rep <= world; rep++) {
                if (world % (tp * rep)) continue;
                tks_mesh_shape s;
                if (tks_mesh_resolve(world, tp, 0, rep, &s)) {
                    CHECK(0, "valid shape refused: %s", tks_last_error()->message);
                    continue;
                }
                int *m = malloc((size_t)world * sizeof *m), *m2 = malloc((size_t)world * sizeof *m2);
                int seen[16][16] = {{0}};
                for (int r = 0; r < world; r++) {
                    int a, b, c;
                    tks_mesh_coords(&s, r, &a, &b, &c);
                    CHECK(!seen[a * s.dp_shard + b][c]++, "coords of rank %d repeat", r);
                    CHECK(c == r % tp, "tp varies fastest");
                    for (tks_group_kind k = TKS_GROUP_TP; k < TKS_N_GROUPS; k++) {
                        int n = tks_mesh_plan_group(&s, r, k, m);
                        int want = k == TKS_GROUP_TP ? tp : k == TKS_GROUP_DP_SHARD ? s.dp_shard
                                 : k == TKS_GROUP_DP_REPLICATE ? rep : k == TKS_GROUP_DP ? rep * s.dp_shard : world;
                        CHECK(n == want, "group %s of rank %d has %d members, want %d", tks_group_name(k), r, n, want);
                        int in = 0;
                        for (int i = 0; i < n; i++) in |= m[i] == r;
                        CHECK(in, "rank %d not in its own %s group", r, tks_group_name(k));
                        /* every member sees the same group */
                        for (int i = 0; i < n; i++) {
                            int n2 = tks_mesh_plan_group(&s, m[i], k, m2);
                            CHECK(n2 == n && !memcmp(m, m2, (size_t)n * sizeof *m), "group %s differs between ranks %d and %d",
                                  tks_group_name(k), r, m[i]);
                        }
                    }
                }
                free(m);
                free(m2);
            }
    /* the shape of the third failure of docs/MOTIVATION.md: 2 groups of 8 and 8 groups of 2 */
    tks_mesh_shape s = {2, 8, 1};
    int m[16];
    CHECK(tks_mesh_plan_group(&s, 3, TKS_GROUP_DP_SHARD, m) == 8 && m[0] == 0 && m[7] == 7, "shard group of 3");
    CHECK(tks_mesh_plan_group(&s, 11, TKS_GROUP_DP_SHARD, m) == 8 && m[0] == 8 && m[7] == 15, "shard group of 11");
    CHECK(tks_mesh_plan_group(&s, 3, TKS_GROUP_DP_REPLICATE, m) == 2 && m[0] == 3 && m[1] == 11, "replicate group of 3");
    char *d = tks_mesh_describe(&s);
    CHECK(d && strstr(d, "dp_shard      2 group(s) of 8") && strstr(d, "dp_replicate  8 group(s) of 2"),
          "describe:\n%s", d ? d : "(null)");
    free(d);
    /* tp = 2 x dp_shard 2 x dp_replicate 2: tp groups are contiguous ranks */
    tks_mesh_shape t = {2, 2, 2};
    CHECK(tks_mesh_plan_group(&t, 5, TKS_GROUP_TP, m) == 2 && m[0] == 4 && m[1] == 5, "tp group of 5");
    CHECK(tks_mesh_plan_group(&t, 5, TKS_GROUP_DP_SHARD, m) == 2 && m[0] == 5 && m[1] == 7, "shard group of 5");
    CHECK(tks_mesh_plan_group(&t, 5, TKS_GROUP_DP_REPLICATE, m) == 2 && m[0] == 1 && m[1] == 5, "replicate group of 5");
}

static void test_model_tp_checks(void) {
    tks_model_config c = {.vocab_size = 1000, .dim = 48, .n_layers = 1, .n_heads = 6, .n_kv_heads = 3,
                          .ffn_dim = 96, .max_seq_len = 16};
    tks_model_config_defaults(&c);
    CHECK(tks_model_config_check(&c, 3) == 0, "tp 3 valid: %s", tks_last_error()->message);
    CHECK(tks_model_padded_vocab(&c, 3) == 1152, "padded vocab for tp 3: %u", tks_model_padded_vocab(&c, 3));
    CHECK(tks_model_padded_vocab(&c, 1) == 1024, "padded vocab for tp 1");
    CHECK(tks_model_config_check(&c, 4) == TKS_ERR_ARG && strstr(tks_last_error()->message, "--tp 4 does not divide --n-heads 6"),
          "tp 4: %s", tks_last_error()->message);
    c.n_kv_heads = 2;
    CHECK(tks_model_config_check(&c, 3) == TKS_ERR_ARG && strstr(tks_last_error()->message, "--n-kv-heads 2"),
          "kv heads: %s", tks_last_error()->message);
    c.n_kv_heads = 3;
    c.ffn_dim = 100;
    CHECK(tks_model_config_check(&c, 3) == TKS_ERR_ARG && strstr(tks_last_error()->message, "--ffn-dim 100"),
          "ffn: %s", tks_last_error()->message);
}

int main(void) {
    test_resolve();
    test_groups();
    test_model_tp_checks();
    if (failures) {
        fprintf(stderr, "test_mesh: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_mesh: all checks passed\n");
    return 0;
}
