/* test_cuda_comm.c - the NCCL comm (trainer/cuda/nccl_comm.c) under mpirun,
 * several ranks sharing the one GPU of a single-GPU machine: each rank gets its own
 * NCCL_HOSTID, so NCCL 2.28 treats the ranks as separate hosts talking over
 * sockets instead of refusing a duplicate GPU. That checks the collectives'
 * results, the group splits and their member check, stream ordering and the
 * agreement on errors; it does not exercise NVLink, P2P or SHM transports or
 * their performance (docs/GPU.md).
 *
 * Usage: mpirun -np N test_cuda_comm DP_REPLICATE DP_SHARD TP
 * For every group of the mesh: every collective in fp32 and bf16 on the NCCL
 * group against the same collective on the MPI group mesh.c built (integer
 * valued data: sums are exact in any order, so the results must be equal),
 * in-place allgather, handles waited out of order, work on the backend's
 * stream between a start and its wait, one grouped all-reduce, and an error
 * on one rank agreed by all. Exits 77 on every rank when no CUDA
 * device is usable. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "common/tks.h"
#include "trainer/cuda/cuda.h"
#include "trainer/comm/mesh.h"

static tks_backend *gpu;

/* v[i] = integer in [-16, 16] from (seed, world rank, i): every partial sum
 * over up to 16 ranks is an integer of magnitude <= 256, exact in bf16 (8
 * significant bits) and fp32, whatever order NCCL and MPI add in */
static float val(int seed, int wr, size_t i) {
    return (float)((int)((i * 2654435761u + (unsigned)wr * 40503u + (unsigned)seed * 977u) % 33u) - 16);
}

static void fill(float *h, size_t n, int seed, int wr) {
    for (size_t i = 0; i < n; i++) h[i] = val(seed, wr, i);
}

/* Runs one collective on the NCCL group (device) and the MPI group (host
 * memory, the reference) and compares the outputs bit for bit. */
static void one(tks_comm *nc, tks_comm *mc, const char *gname, int kind, tks_dtype dt,
                tks_comm_op opk, int inplace, int wr) {
    size_t n = 1001, S = (size_t)nc->size, R = (size_t)nc->rank;
    size_t es = tks_dtype_size(dt);
    size_t nin = kind == TKS_COLL_REDUCE_SCATTER ? S * n : n;
    size_t nout = kind == TKS_COLL_ALLGATHER ? S * n : n;
    float *hin = malloc(nin * 4), *hout = malloc(nout * 4);
    fill(hin, nin, kind * 10 + (int)dt, wr);
    fill(hout, nout, kind * 10 + (int)dt + 5, wr);
    /* host copies in the collective's dtype */
    uint16_t *bin = malloc(nin * 2), *bout = malloc(nout * 2);
    for (size_t i = 0; i < nin; i++) bin[i] = tks_bf16_from_f32(hin[i]);
    for (size_t i = 0; i < nout; i++) bout[i] = tks_bf16_from_f32(hout[i]);
    void *rin = dt == TKS_BF16 ? (void *)bin : (void *)hin;
    void *rout = dt == TKS_BF16 ? (void *)bout : (void *)hout;
    char *din = gpu->ops->alloc(gpu, nin * es), *dout = gpu->ops->alloc(gpu, nout * es);
    gpu->ops->upload(gpu, din, rin, nin * es);
    gpu->ops->upload(gpu, dout, rout, nout * es);
    tks_coll op = {.kind = kind, .dtype = dt, .op = opk, .out = dout, .in = din, .n = n, .root = 1 % nc->size};
    tks_coll ref = op;
    ref.out = rout;
    ref.in = rin;
    if (kind == TKS_COLL_ALLGATHER && inplace) {
        op.in = dout + R * n * es; /* this member's block already in the output */
        ref.in = (char *)rout + R * n * es;
    }
    if (kind == TKS_COLL_ALLREDUCE || kind == TKS_COLL_BROADCAST) op.in = ref.in = NULL;
    tks_comm_req *q1 = NULL, *q2 = NULL;
    int rc1 = nc->t->start(nc, &op, &q1), rc2 = mc->t->start(mc, &ref, &q2);
    if (!rc2) rc2 = mc->t->wait(mc, q2);
    if (!rc1) rc1 = nc->t->wait(nc, q1);
    char *got = malloc(nout * es);
    gpu->ops->download(gpu, got, dout, nout * es);
    static const char *kn[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
    CHECK(rc1 == 0 && rc2 == 0, "%s %s: rc nccl %d mpi %d (%s)", gname, kn[kind], rc1, rc2,
          tks_last_error()->message);
    CHECK(!memcmp(got, rout, nout * es), "%s %s %s%s%s: NCCL result differs from MPI's", gname,
          kn[kind], dt == TKS_BF16 ? "bf16" : "fp32", opk == TKS_COMM_MAX ? " max" : "",
          inplace ? " in place" : "");
    gpu->ops->free(gpu, din);
    gpu->ops->free(gpu, dout);
    free(hin), free(hout), free(bin), free(bout), free(got);
}

/* Two handles started, waited in reverse order; then a grouped all-reduce. */
static void async_and_grouped(tks_comm *nc, const char *gname, int wr) {
    size_t n = 4096;
    float *h = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        h[i] = val(3, wr, i);
        want[i] = 0;
        for (int m = 0; m < nc->size; m++) want[i] += val(3, nc->members[m], i);
    }
    float *a = gpu->ops->alloc(gpu, n * 4), *b = gpu->ops->alloc(gpu, n * 4);
    gpu->ops->upload(gpu, a, h, n * 4);
    gpu->ops->upload(gpu, b, h, n * 4);
    tks_coll oa = {.kind = TKS_COLL_ALLREDUCE, .dtype = TKS_F32, .out = a, .n = n};
    tks_coll ob = oa;
    ob.out = b;
    tks_comm_req *qa = NULL, *qb = NULL;
    int rc = nc->t->start(nc, &oa, &qa);
    if (!rc) rc = nc->t->start(nc, &ob, &qb);
    if (!rc) rc = nc->t->wait(nc, qb);
    if (!rc) rc = nc->t->wait(nc, qa);
    CHECK(rc == 0, "%s: async handles: %s", gname, tks_last_error()->message);
    gpu->ops->download(gpu, got, a, n * 4);
    CHECK(!memcmp(got, want, n * 4), "%s: first handle's result wrong", gname);
    gpu->ops->download(gpu, got, b, n * 4);
    CHECK(!memcmp(got, want, n * 4), "%s: second handle's result wrong", gname);
    /* overlap: the backend's stream runs other work between start and wait
     * (the collective is not waited for at start), and stream order holds
     * on both sides: a halved on the backend's stream before the start, b
     * scaled meanwhile, a doubled after the wait (integers: exact) */
    gpu->ops->upload(gpu, a, h, n * 4);
    gpu->ops->upload(gpu, b, h, n * 4);
    rc = gpu->ops->scale(gpu, a, n, 0.5f);
    if (!rc) rc = nc->t->start(nc, &oa, &qa);
    if (!rc) rc = gpu->ops->scale(gpu, b, n, 3.0f);
    if (!rc) rc = nc->t->wait(nc, qa);
    if (!rc) rc = gpu->ops->scale(gpu, a, n, 2.0f);
    CHECK(rc == 0, "%s: overlap: %s", gname, tks_last_error()->message);
    gpu->ops->download(gpu, got, a, n * 4);
    CHECK(!memcmp(got, want, n * 4), "%s: overlap: the collective's result out of stream order", gname);
    gpu->ops->download(gpu, got, b, n * 4);
    int tripled = 1;
    for (size_t i = 0; i < n; i++) tripled &= got[i] == 3.0f * h[i];
    CHECK(tripled, "%s: overlap: the work beside the collective wrong", gname);
    gpu->ops->upload(gpu, a, h, n * 4);
    gpu->ops->upload(gpu, b, h, n * 4);
    float *bufs[2] = {a, b};
    size_t ns[2] = {n, n / 2};
    rc = tks_nccl_allreduce_many(nc, bufs, ns, 2);
    CHECK(rc == 0, "%s: grouped all-reduce: %s", gname, tks_last_error()->message);
    gpu->ops->download(gpu, got, b, n * 4);
    CHECK(!memcmp(got, want, n / 2 * 4) && !memcmp(got + n / 2, h + n / 2, n / 2 * 4),
          "%s: grouped all-reduce: second buffer wrong (or touched past its count)", gname);
    CHECK(nc->t->barrier(nc) == 0, "%s: barrier: %s", gname, tks_last_error()->message);
    gpu->ops->free(gpu, a);
    gpu->ops->free(gpu, b);
    free(h), free(want), free(got);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mpirun -np N test_cuda_comm DP_REPLICATE DP_SHARD TP\n");
        return 2;
    }
    /* before any NCCL call: one host id per rank (several ranks, one GPU) */
    const char *wr_env = getenv("OMPI_COMM_WORLD_RANK");
    if (wr_env && !getenv("NCCL_HOSTID")) {
        char id[64];
        snprintf(id, sizeof id, "tokshard-test-rank-%s", wr_env);
        setenv("NCCL_HOSTID", id, 1);
    }
    /* the "hosts" are one machine: sockets over loopback, whatever else it has */
    if (!getenv("NCCL_SOCKET_IFNAME")) setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    int world = 1, rank = 0;
    if (tks_mesh_world(&world, &rank)) {
        fprintf(stderr, "test_cuda_comm: %s\n", tks_last_error()->message);
        return 1;
    }
    if (tks_cuda_device_count() == 0) {
        if (rank == 0)
            printf("skipped: no CUDA device (%s)\n", tks_cuda_built() ? "none visible" : "built without CUDA");
        tks_mesh_finalize();
        return 77;
    }
    tks_mesh_shape s;
    tks_mesh *mesh = NULL;
    tks_nccl_world *w = NULL;
    int rc = tks_mesh_resolve(world, atoi(argv[3]), atoi(argv[2]), atoi(argv[1]), &s);
    if (!rc) rc = tks_mesh_create(&s, &mesh);
    if (!rc) rc = tks_cuda_backend_create(0, &gpu); /* every rank on device 0: the shared GPU */
    if (!rc) rc = tks_nccl_world_create(gpu, &w);
    if (rc) {
        fprintf(stderr, "rank %d: setup: %s\n", rank, tks_last_error()->message);
        return 1;
    }
    for (int k = 0; k < TKS_N_GROUPS; k++) {
        tks_comm *mc = mesh->group[k], *nc = NULL;
        const char *gname = tks_group_name((tks_group_kind)k);
        rc = tks_nccl_comm_create(w, mc, &nc);
        CHECK(rc == 0, "rank %d: %s group: %s", rank, gname, tks_last_error()->message);
        if (rc) continue;
        for (int kind = 0; kind <= TKS_COLL_BROADCAST; kind++)
            for (int dt = 0; dt < 2; dt++) {
                one(nc, mc, gname, kind, (tks_dtype)dt, TKS_COMM_SUM, 0, rank);
                if (kind == TKS_COLL_ALLREDUCE) one(nc, mc, gname, kind, (tks_dtype)dt, TKS_COMM_MAX, 0, rank);
                if (kind == TKS_COLL_ALLGATHER) one(nc, mc, gname, kind, (tks_dtype)dt, TKS_COMM_SUM, 1, rank);
            }
        async_and_grouped(nc, gname, rank);
        /* an error on the group's last member reaches every member */
        int mine = nc->rank == nc->size - 1 && nc->size > 1
                       ? tks_fail(TKS_ERR_IO, "x.shard", 3, 7, "planted error on rank %d", rank)
                       : 0;
        int agreed = tks_comm_agree(nc, mine);
        CHECK(nc->size == 1 || (agreed == TKS_ERR_IO && strstr(tks_last_error()->message, "planted")),
              "%s: agreement on a planted error: rc %d", gname, agreed);
        tks_nccl_comm_free(nc);
    }
    rc = tks_cuda_backend_check(gpu);
    CHECK(rc == 0, "rank %d: backend: %s", rank, tks_last_error()->message);
    tks_nccl_world_free(w);
    gpu->ops->destroy(gpu);
    tks_mesh_free(mesh);
    tks_mesh_finalize();
    if (rank == 0 || failures) return check_exit("test_cuda_comm");
    return 0;
}
