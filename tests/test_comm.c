/* test_comm.c - the comm contract (trainer/comm/comm.h) and the bucketed
 * gradient synchronisation (mesh.h). Without mpirun: chunk planning for
 * counts above 2^31 (the pieces are planned, not allocated), bf16 rounding,
 * the one-process group. Under mpirun (tests/mesh.cmake runs it on 4
 * processes, with MPI's own collectives and with TOKSHARD_TEST_COMM_CHUNK=7
 * so that every call goes through the piece-by-piece path): every collective
 * in fp32 and bf16 against values computed here, in-place rules, handles
 * waited out of order, host gathers, agreement on an error of one rank, and
 * the bucketed reduce-scatter against the blocking one. Exit 0 = all passed. */
#include "tests/check.h"
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/comm/mesh.h"

static void test_chunks(void) {
    /* counts above 2^31: every piece fits an int, the pieces tile the count */
    const size_t ns[] = {0, 1, (size_t)INT_MAX, (size_t)INT_MAX + 1, ((size_t)1 << 31) + 5,
                         3 * ((size_t)1 << 31) + 7, ((size_t)1 << 40) + 3};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i], f, k, pieces = tks_comm_chunks(n, (size_t)INT_MAX, 0, &f, &k), next = 0;
        size_t want = n / INT_MAX + (n % INT_MAX != 0);
        CHECK(pieces == want, "n %zu: %zu pieces, expected %zu", n, pieces, want);
        for (size_t p = 0; p < pieces; p++) {
            tks_comm_chunks(n, (size_t)INT_MAX, p, &f, &k);
            CHECK(f == next && k >= 1 && k <= (size_t)INT_MAX, "n %zu piece %zu: first %zu count %zu", n, p, f, k);
            next = f + k;
        }
        CHECK(next == n, "n %zu: pieces cover %zu", n, next);
    }
    CHECK(tks_comm_chunk_max() >= 1 && tks_comm_chunk_max() <= (size_t)INT_MAX, "chunk max %zu",
          tks_comm_chunk_max());
}

static void test_bf16(void) {
    /* bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
     * and goes to the even one (1); 1 + 3*2^-9 rounds up */
    CHECK(tks_bf16_to_f32(tks_bf16_from_f32(1.0f + 0x1p-8f)) == 1.0f, "tie to even (down)");
    CHECK(tks_bf16_to_f32(tks_bf16_from_f32(1.0f + 0x1p-7f + 0x1p-8f)) == 1.0f + 0x1p-6f, "tie to even (up)");
    CHECK(tks_bf16_to_f32(tks_bf16_from_f32(1.0f + 3 * 0x1p-9f)) == 1.0f + 0x1p-7f, "above the tie");
    CHECK(isnan(tks_bf16_to_f32(tks_bf16_from_f32(NAN))), "NaN stays NaN");
    CHECK(isinf(tks_bf16_to_f32(tks_bf16_from_f32(INFINITY))), "inf stays inf");
    for (int i = -1000; i <= 1000; i++) { /* small integers are exact in bf16 up to 256 */
        float x = (float)i / 4;
        if (fabsf(x) <= 64) CHECK(tks_bf16_to_f32(tks_bf16_from_f32(x)) == x, "%g not exact", (double)x);
    }
}

static void test_self(void) {
    tks_comm *c = tks_comm_self();
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    CHECK(tks_comm_reduce_scatter_sum(c, b, a, 4) == 0 && !memcmp(a, b, sizeof a), "self reduce_scatter copies");
    CHECK(tks_comm_allreduce_sum(c, a, 4) == 0 && a[3] == 4, "self allreduce is the identity");
    CHECK(tks_comm_agree(c, TKS_ERR_IO) == TKS_ERR_IO && tks_comm_agree(c, 0) == 0, "self agree");
}

/* the value member r contributes at element i (exact in bf16: small integers) */
static float val(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 3) % 17) - 8); }

static void test_mpi(tks_mesh *m) {
    tks_comm *w = m->group[TKS_GROUP_WORLD];
    int S = w->size, R = w->rank;
    const size_t n = 45; /* 7 pieces of 7 and one of 3 under TOKSHARD_TEST_COMM_CHUNK=7 */
    float *buf = malloc(S * n * sizeof *buf), *out = malloc(S * n * sizeof *out);
    uint16_t *h = malloc(S * n * sizeof *h), *ho = malloc(S * n * sizeof *ho);
    /* allreduce sum and max, fp32 and bf16 (sums of small integers: exact) */
    for (int dt = 0; dt < 2; dt++)
        for (int opk = 0; opk < 2; opk++) {
            for (size_t i = 0; i < n; i++) {
                buf[i] = val(R, i);
                h[i] = tks_bf16_from_f32(val(R, i));
            }
            tks_coll op = {.kind = TKS_COLL_ALLREDUCE, .dtype = dt ? TKS_BF16 : TKS_F32,
                           .op = opk ? TKS_COMM_MAX : TKS_COMM_SUM, .out = dt ? (void *)h : (void *)buf, .n = n};
            tks_comm_req *q;
            CHECK(w->t->start(w, &op, &q) == 0 && w->t->wait(w, q) == 0, "allreduce dt %d op %d", dt, opk);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = opk ? -1e9f : 0;
                for (int r = 0; r < S; r++) want = opk ? fmaxf(want, val(r, i)) : want + val(r, i);
                float got = dt ? tks_bf16_to_f32(h[i]) : buf[i];
                bad += got != want;
            }
            CHECK(!bad, "allreduce dtype %d op %d: %d wrong elements", dt, opk, bad);
        }
    /* reduce_scatter (in[S*n] -> out[n]) in both dtypes */
    for (int dt = 0; dt < 2; dt++) {
        for (size_t i = 0; i < S * n; i++) {
            buf[i] = val(R, i);
            h[i] = tks_bf16_from_f32(val(R, i));
        }
        tks_coll op = {.kind = TKS_COLL_REDUCE_SCATTER, .dtype = dt ? TKS_BF16 : TKS_F32,
                       .out = dt ? (void *)ho : (void *)out, .in = dt ? (void *)h : (void *)buf, .n = n};
        tks_comm_req *q;
        CHECK(w->t->start(w, &op, &q) == 0 && w->t->wait(w, q) == 0, "reduce_scatter dt %d", dt);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < S; r++) want += val(r, (size_t)R * n + i);
            bad += (dt ? tks_bf16_to_f32(ho[i]) : out[i]) != want;
        }
        CHECK(!bad, "reduce_scatter dtype %d: %d wrong elements", dt, bad);
    }
    /* allgather, out of place and in place (in == out + rank*n); two handles
     * in flight, waited in the reverse order */
    for (size_t i = 0; i < n; i++) buf[i] = val(R, i), out[R * n + i] = val(R, i), h[R * n + i] = tks_bf16_from_f32(val(R, i));
    float *o2 = malloc(S * n * sizeof *o2);
    tks_coll a1 = {.kind = TKS_COLL_ALLGATHER, .dtype = TKS_F32, .out = o2, .in = buf, .n = n};
    tks_coll a2 = {.kind = TKS_COLL_ALLGATHER, .dtype = TKS_BF16, .out = h, .in = h + R * n, .n = n};
    tks_coll a3 = {.kind = TKS_COLL_ALLGATHER, .dtype = TKS_F32, .out = out, .in = out + R * n, .n = n};
    tks_comm_req *q1 = NULL, *q2 = NULL, *q3 = NULL;
    CHECK(w->t->start(w, &a1, &q1) == 0 && w->t->start(w, &a2, &q2) == 0 && w->t->start(w, &a3, &q3) == 0, "allgather start");
    CHECK(w->t->wait(w, q3) == 0 && w->t->wait(w, q2) == 0 && w->t->wait(w, q1) == 0, "allgather wait (reverse order)");
    int bad = 0;
    for (int r = 0; r < S; r++)
        for (size_t i = 0; i < n; i++)
            bad += o2[r * n + i] != val(r, i) || out[r * n + i] != val(r, i) || tks_bf16_to_f32(h[r * n + i]) != val(r, i);
    CHECK(!bad, "allgather: %d wrong elements", bad);
    /* broadcast from the last member */
    for (size_t i = 0; i < n; i++) buf[i] = val(R, i);
    CHECK(tks_comm_broadcast(w, buf, n, S - 1) == 0, "broadcast");
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += buf[i] != val(S - 1, i);
    CHECK(!bad, "broadcast: %d wrong elements", bad);
    /* host gather with unequal counts (member r sends r*5+1 bytes) to member 1 */
    size_t counts[64], total = 0;
    for (int r = 0; r < S; r++) total += counts[r] = (size_t)r * 5 + 1;
    unsigned char mine[64], all[64 * 64];
    for (size_t i = 0; i < counts[R]; i++) mine[i] = (unsigned char)(R * 16 + (int)i);
    CHECK(w->t->gatherv_host(w, R == 1 ? all : NULL, counts, mine, 1) == 0, "gatherv_host");
    if (R == 1) {
        size_t at = 0;
        bad = 0;
        for (int r = 0; r < S; r++)
            for (size_t i = 0; i < counts[r]; i++) bad += all[at++] != (unsigned char)(r * 16 + (int)i);
        CHECK(!bad && at == total, "gatherv_host: %d wrong bytes", bad);
    }
    /* an error on member 2 only: every member gets it, with member 2's message */
    int rc = R == 2 ? tks_fail(TKS_ERR_NOMEM, "x", TKS_NONE, TKS_NONE, "injected on rank 2") : 0;
    rc = tks_comm_agree(w, rc);
    CHECK(rc == TKS_ERR_NOMEM && strstr(tks_last_error()->message, "injected on rank 2"),
          "agree: rc %d message '%s'", rc, tks_last_error()->message);
    CHECK(tks_comm_agree(w, 0) == 0, "agree without error");
    free(o2);
    free(buf);
    free(out);
    free(h);
    free(ho);
}

/* the bucketed reduce-scatter + all-reduce against the blocking calls, with
 * the layers reported last to first as a backward does */
static void test_grad_sync(tks_mesh *m) {
    tks_comm *sh = m->group[TKS_GROUP_DP_SHARD], *rp = m->group[TKS_GROUP_DP_REPLICATE];
    size_t S = (size_t)sh->size, n = 6 * 40 * S, ns = n / S;
    float *g = malloc(n * sizeof *g), *ref = malloc(n * sizeof *ref), *sl = malloc(ns * sizeof *sl);
    for (size_t i = 0; i < n; i++) g[i] = ref[i] = sinf((float)(i + 1) * 0.37f + (float)m->rank) * 10;
    /* reference: the two blocking calls the step makes */
    CHECK(tks_comm_reduce_scatter_sum(sh, sl, ref, ns) == 0 && tks_comm_allreduce_sum(rp, sl, ns) == 0, "reference");
    tks_grad_sync *s = NULL;
    CHECK(tks_grad_sync_create(m, g, n, 17, NULL, NULL, NULL, &s) == 0, "create");
    if (!s) return;
    tks_grad_sync_begin(s);
    size_t layer = n / 6; /* six "layers", reported from the last */
    tks_grads_ready_fn hook = tks_grad_sync_hook; /* what a backward is given */
    for (int l = 5; l >= 0; l--) CHECK(hook(s, (size_t)l * layer, (size_t)(l + 1) * layer) == 0, "ready");
    CHECK(tks_grad_sync_end(s) == 0, "end");
    /* the same sums, in an order MPI may choose differently per message size:
     * |a - b| <= (world - 1) * eps * sum |x| per element (Higham, 2002, 4.2) */
    double worst = 0;
    int bad = 0;
    size_t world = (size_t)m->world;
    for (size_t i = 0; i < ns; i++) {
        double bound = (double)(world - 1) * 0x1p-23 * 10.0 * (double)world + 1e-30;
        double d = fabs((double)g[(size_t)sh->rank * ns + i] - (double)sl[i]);
        if (d > worst) worst = d;
        bad += d > bound;
    }
    CHECK(!bad, "bucketed sync differs from the blocking one: %d elements, worst %g", bad, worst);
    CHECK(tks_grad_sync_started_early(s) > 0 || S == 1, "no bucket started during the backward");
    printf("rank %d: grad sync: %zu buckets, %zu started during the backward, worst difference %g\n",
           m->rank, (ns + 16) / 17, tks_grad_sync_started_early(s), worst);
    tks_grad_sync_free(s);
    free(g);
    free(ref);
    free(sl);
}

int main(void) {
    test_chunks();
    test_bf16();
    test_self();
    int world = 1, rank = 0;
    if (tks_mesh_world(&world, &rank) == 0 && world > 1) {
        tks_mesh_shape shape;
        tks_mesh *m = NULL;
        int rc = tks_mesh_resolve(world, 1, 0, world % 2 == 0 ? 2 : 1, &shape);
        if (!rc) rc = tks_mesh_create(&shape, &m);
        CHECK(rc == 0, "mesh: %s", tks_last_error()->message);
        if (m) {
            test_mpi(m);
            test_grad_sync(m);
            tks_mesh_free(m);
        }
        printf("rank %d of %d, chunk %zu elements: ", rank, world, tks_comm_chunk_max());
    }
    int rc = check_exit("test_comm");
    tks_mesh_finalize();
    return rc;
}
