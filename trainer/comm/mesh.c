/* mesh.c - layout planning, the MPI world, the groups of a layout and the
 * check that the groups built are the groups planned, agreement, and the
 * switch of the groups to the backend's transport. The transports are
 * beside it: comm_mpi.c (MPI), comm_staged.c (MPI through host memory),
 * comm_self.c (one process), cuda/nccl_comm.c (NCCL); the bucketed gradient
 * sync is grad_sync.c. */
#define _GNU_SOURCE
#include "trainer/comm/mesh.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "common/tks_mpi.h"
#include "trainer/trainer.h"

const char *tks_group_name(tks_group_kind k) {
    static const char *n[] = {"tp", "dp_shard", "dp_replicate", "dp", "world"};
    return k < TKS_N_GROUPS ? n[k] : "?";
}

int tks_mesh_resolve(int world, int tp, int dp_shard, int dp_replicate, tks_mesh_shape *out) {
#define BAD(...) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, __VA_ARGS__)
    if (world < 1) BAD("world size %d: need at least one process", world);
    if (tp < 0 || dp_shard < 0 || dp_replicate < 0)
        BAD("--tp, --dp-shard and --dp-replicate must be at least 1");
    int t = tp ? tp : 1, r = dp_replicate ? dp_replicate : 1;
    if (world % (t * r))
        BAD("the world has %d processes, which --tp %d x --dp-replicate %d = %d does not divide: "
            "launch a multiple of %d processes (mpirun -np N) or change the degrees",
            world, t, r, t * r, t * r);
    int s = dp_shard ? dp_shard : world / (t * r);
    if (r * s * t != world)
        BAD("--dp-replicate %d x --dp-shard %d x --tp %d = %d, but the world has %d processes: "
            "the product must equal the number of processes (omit --dp-shard to take what is "
            "left: %d)",
            r, s, t, r * s * t, world, world % (t * r) ? 0 : world / (t * r));
    out->dp_replicate = r;
    out->dp_shard = s;
    out->tp = t;
    return 0;
#undef BAD
}

void tks_mesh_coords(const tks_mesh_shape *s, int r, int *rep, int *shard, int *tp_rank) {
    *tp_rank = r % s->tp;
    *shard = (r / s->tp) % s->dp_shard;
    *rep = r / (s->tp * s->dp_shard);
}

static int rank_of(const tks_mesh_shape *s, int rep, int shard, int tpr) {
    return (rep * s->dp_shard + shard) * s->tp + tpr;
}

int tks_mesh_plan_group(const tks_mesh_shape *s, int r, tks_group_kind k, int *members) {
    int rep, shard, tpr, n = 0;
    tks_mesh_coords(s, r, &rep, &shard, &tpr);
    switch (k) {
    case TKS_GROUP_TP:
        for (int t = 0; t < s->tp; t++) members[n++] = rank_of(s, rep, shard, t);
        break;
    case TKS_GROUP_DP_SHARD:
        for (int d = 0; d < s->dp_shard; d++) members[n++] = rank_of(s, rep, d, tpr);
        break;
    case TKS_GROUP_DP_REPLICATE:
        for (int p = 0; p < s->dp_replicate; p++) members[n++] = rank_of(s, p, shard, tpr);
        break;
    case TKS_GROUP_DP:
        for (int p = 0; p < s->dp_replicate; p++)
            for (int d = 0; d < s->dp_shard; d++) members[n++] = rank_of(s, p, d, tpr);
        break;
    default:
        for (int i = 0; i < s->dp_replicate * s->dp_shard * s->tp; i++) members[n++] = i;
    }
    return n;
}

static void put_members(tks_text *b, const int *m, int n) {
    tks_text_printf(b, "[");
    for (int i = 0; i < n; i++) tks_text_printf(b, i ? " %d" : "%d", m[i]);
    tks_text_printf(b, "]");
}

char *tks_mesh_describe(const tks_mesh_shape *s) {
    int world = s->dp_replicate * s->dp_shard * s->tp;
    int *m = malloc((size_t)world * sizeof *m);
    tks_text b = {0};
    if (!m) return NULL;
    tks_text_printf(&b, "mesh: world %d = dp_replicate %d x dp_shard %d x tp %d (tp varies fastest)\n", world,
        s->dp_replicate, s->dp_shard, s->tp);
    tks_text_printf(&b, "  data parallel: dp = %d ranks (gradients reduce-scattered in dp_shard, all-reduced "
        "in dp_replicate; AdamW state 1/%d per rank)\n", s->dp_replicate * s->dp_shard, s->dp_shard);
    tks_text_printf(&b, "  rank  (rep, shard, tp)  dp_rank\n");
    for (int r = 0; r < world; r++) {
        int rep, shard, tpr;
        tks_mesh_coords(s, r, &rep, &shard, &tpr);
        tks_text_printf(&b, "  %4d  (%d, %d, %d)  %7d\n", r, rep, shard, tpr, rep * s->dp_shard + shard);
    }
    for (tks_group_kind k = TKS_GROUP_TP; k <= TKS_GROUP_DP; k++) {
        /* each distinct group once: listed by its first member */
        int count = 0;
        tks_text g = {0};
        for (int r = 0; r < world; r++) {
            int n = tks_mesh_plan_group(s, r, k, m);
            if (m[0] != r) continue;
            tks_text_printf(&g, " ");
            put_members(&g, m, n);
            count++;
        }
        int n0 = tks_mesh_plan_group(s, 0, k, m);
        tks_text_printf(&b, "  %-13s %d group(s) of %d:%s\n", tks_group_name(k), count, n0, g.s ? g.s : "");
        free(g.s);
    }
    free(m);
    return b.s;
}

/* ---- MPI ------------------------------------------------------------------- */

static int g_mpi_inited_here = 0;

static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int tks_mesh_world(int *world, int *rank) {
    *world = 1;
    *rank = 0;
    if (!launched_by_mpirun()) return tks_launch_check();
    int rc = tks_mpi_start(&g_mpi_inited_here);
    if (rc) return rc;
    MPI_Comm_size(MPI_COMM_WORLD, world);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    return 0;
}

void tks_mesh_finalize(void) {
    int fin = 0;
    if (g_mpi_inited_here && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
}

/* Split colour and key of this rank for each group kind. The test hook
 * TOKSHARD_TEST_MESH_FAULT=merge-dp builds dp_shard groups that ignore the
 * replica coordinate (the torchtitan failure of docs/MOTIVATION.md) so that the
 * verification below can be shown to catch it. */
static void split_of(const tks_mesh *m, tks_group_kind k, int *color, int *key) {
    const tks_mesh_shape *s = &m->shape;
    const char *fault = getenv("TOKSHARD_TEST_MESH_FAULT");
    switch (k) {
    case TKS_GROUP_TP: *color = m->rep * s->dp_shard + m->shard; *key = m->tp_rank; break;
    case TKS_GROUP_DP_SHARD:
        *color = (fault && !strcmp(fault, "merge-dp")) ? m->tp_rank : m->rep * s->tp + m->tp_rank;
        *key = m->rank;
        break;
    case TKS_GROUP_DP_REPLICATE: *color = m->shard * s->tp + m->tp_rank; *key = m->rep; break;
    case TKS_GROUP_DP: *color = m->tp_rank; *key = m->dp_rank; break;
    default: *color = 0; *key = m->rank;
    }
}

void tks_mesh_free(tks_mesh *m) {
    if (!m) return;
    tks_mesh_device_free(m);
    if (m->mpi)
        for (int k = 0; k < TKS_N_GROUPS; k++) tks_comm_mpi_free(m->group[k]);
    free(m);
}

int tks_mesh_create(const tks_mesh_shape *s, tks_mesh **out) {
    *out = NULL;
    int world, rank, rc = tks_mesh_world(&world, &rank);
    if (rc) return rc;
    int planned = s->dp_replicate * s->dp_shard * s->tp;
    if (planned != world)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the layout dp_replicate %d x dp_shard %d x tp %d needs %d processes but "
                        "%d were started%s",
                        s->dp_replicate, s->dp_shard, s->tp, planned, world,
                        world == 1 ? ": launch with mpirun -np N" : "");
    tks_mesh *m = calloc(1, sizeof *m);
    if (!m) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    m->shape = *s;
    m->world = world;
    m->rank = rank;
    tks_mesh_coords(s, rank, &m->rep, &m->shard, &m->tp_rank);
    m->dp = s->dp_replicate * s->dp_shard;
    m->dp_rank = m->rep * s->dp_shard + m->shard;
    if (!launched_by_mpirun()) {
        for (int k = 0; k < TKS_N_GROUPS; k++) m->group[k] = tks_comm_self();
        *out = m;
        return 0;
    }
    m->mpi = 1;
    for (int k = 0; k < TKS_N_GROUPS && !rc; k++) {
        if (k != TKS_GROUP_WORLD) {
            int color, key;
            split_of(m, (tks_group_kind)k, &color, &key);
            rc = tks_comm_mpi_split(color, key, &m->group[k]);
        } else {
            rc = tks_comm_mpi_split(-1, 0, &m->group[k]);
        }
    }
    /* the groups that exist must be the groups planned, member for member */
    int *plan = malloc((size_t)world * sizeof *plan);
    int bad = 0;
    char why[1024] = "";
    for (int k = 0; k < TKS_N_GROUPS && !rc && plan; k++) {
        int n = tks_mesh_plan_group(s, rank, (tks_group_kind)k, plan);
        tks_comm *g = m->group[k];
        int same = g->size == n;
        for (int i = 0; same && i < n; i++) same = g->members[i] == plan[i];
        if (!same && !bad) {
            bad = 1;
            int o = snprintf(why, sizeof why,
                             "rank %d: the %s group that was built has %d members [", rank,
                             tks_group_name((tks_group_kind)k), g->size);
            for (int i = 0; i < g->size && o < 700; i++)
                o += snprintf(why + o, sizeof why - (size_t)o, i ? " %d" : "%d", g->members[i]);
            o += snprintf(why + o, sizeof why - (size_t)o, "] but the plan has %d [", n);
            for (int i = 0; i < n && o < 950; i++)
                o += snprintf(why + o, sizeof why - (size_t)o, i ? " %d" : "%d", plan[i]);
            snprintf(why + o, sizeof why - (size_t)o, "]");
        }
    }
    free(plan);
    if (!rc && bad)
        rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                      "%s: the communicators do not match the layout dp_replicate %d x dp_shard %d "
                      "x tp %d; refusing to run a layout other than the one asked for",
                      why, s->dp_replicate, s->dp_shard, s->tp);
    rc = tks_mesh_agree(m, rc);
    if (rc) tks_mesh_free(m);
    else *out = m;
    return rc;
}

int tks_mesh_agree(tks_mesh *m, int rc) {
    return m->mpi ? tks_comm_agree(m->group[TKS_GROUP_WORLD], rc) : rc;
}

int tks_mesh_world_agree(int rc) {
    int world = 1, rank = 0;
    if (!launched_by_mpirun()) return rc;
    int r0 = tks_mesh_world(&world, &rank);
    if (r0) return rc ? rc : r0;
    if (world == 1) return rc;
    int mine = rc ? rank : world, first = world;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == world) return 0;
    tks_error e = *tks_last_error();
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, MPI_COMM_WORLD);
    tks_error_restore(&e);
    return e.code ? e.code : TKS_ERR_ARG;
}

int tks_mesh_world_same(const uint64_t *h, size_t n, size_t *field, int *rank, int *others) {
    int world = 1, me = 0;
    *field = 0, *rank = 0, *others = 0;
    if (!launched_by_mpirun() || tks_mesh_world(&world, &me) || world == 1 || n == 0) return 0;
    uint64_t *all = malloc((size_t)world * n * sizeof *all);
    if (!all) MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Allgather(h, (int)n, MPI_UINT64_T, all, (int)n, MPI_UINT64_T, MPI_COMM_WORLD);
    int differ = 0;
    for (size_t f = 0; f < n && !differ; f++)
        for (int r = 1; r < world; r++)
            if (all[(size_t)r * n + f] != all[f]) {
                if (!differ) *field = f, *rank = r;
                else (*others)++;
                differ = 1;
            }
    free(all);
    return differ;
}

int tks_mesh_world_sum_u64(uint64_t *v, size_t n) {
    int world = 1, me = 0;
    if (!launched_by_mpirun() || tks_mesh_world(&world, &me) || world == 1) return 0;
    for (size_t at = 0; at < n;) {
        size_t c = n - at < ((size_t)1 << 30) ? n - at : (size_t)1 << 30;
        MPI_Allreduce(MPI_IN_PLACE, v + at, (int)c, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        at += c;
    }
    return 0;
}

void tks_mesh_world_gather(const void *mine, size_t len, void *all) {
    int world = 1, me = 0;
    if (!launched_by_mpirun() || tks_mesh_world(&world, &me) || world == 1) {
        memcpy(all, mine, len);
        return;
    }
    MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, MPI_COMM_WORLD);
}

void tks_train_finalize(void) { tks_mesh_finalize(); }

int tks_train_check_mesh(int tp, int dp_shard, int dp_replicate, char **report) {
    *report = NULL;
    int world, rank;
    tks_mesh_shape shape;
    tks_mesh *mesh = NULL;
    int rc = tks_mesh_world(&world, &rank);
    if (!rc) rc = tks_mesh_resolve(world, tp, dp_shard, dp_replicate, &shape);
    if (!rc) rc = tks_mesh_create(&shape, &mesh);
    if (rc) return rc;
    tks_comm *w = mesh->group[TKS_GROUP_WORLD];
    int *mine = malloc((size_t)world * sizeof *mine),
        *all = malloc((size_t)world * (size_t)world * sizeof *all);
    tks_text b = {0};
    rc = tks_comm_agree(w,
                        mine && all ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory"));
    if (!rc && rank == 0) {
        char *d = tks_mesh_describe(&shape);
        tks_text_printf(&b, "plan\n%sgroups as built (gathered from every rank's communicators):\n",
                        d ? d : "");
        free(d);
    }
    for (int k = TKS_GROUP_TP; k <= TKS_GROUP_DP && !rc; k++) {
        tks_comm *g = mesh->group[k];
        for (int i = 0; i < world; i++) mine[i] = i < g->size ? g->members[i] : -1;
        size_t counts[4096];
        for (int r = 0; r < world && r < 4096; r++) counts[r] = (size_t)world * sizeof *mine;
        if (world > 4096)
            rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "--check-mesh: over 4096 processes");
        if (!rc) rc = w->t->gatherv_host(w, rank == 0 ? all : NULL, counts, mine, 0);
        if (rc || rank != 0) continue;
        int count = 0;
        tks_text_printf(&b, "  %-13s", tks_group_name((tks_group_kind)k));
        for (int r = 0; r < world; r++) {
            const int *m = all + (size_t)r * (size_t)world;
            if (m[0] != r) continue; /* listed by its first member */
            tks_text_printf(&b, " ");
            int n = 0;
            while (n < world && m[n] >= 0) n++;
            put_members(&b, m, n);
            count++;
        }
        tks_text_printf(&b, "  -> %d group(s) of %d\n", count, g->size);
    }
    if (!rc && rank == 0) tks_text_printf(&b, "mesh verified: every rank's groups match the plan\n");
    free(mine);
    free(all);
    tks_mesh_free(mesh);
    if (rc) free(b.s);
    else *report = b.s;
    return rc;
}

/* ---- the groups on the backend in use (--comm) ----------------------------------
 * The MPI groups built and checked above serve the CPU backend as they are;
 * under a device backend with collectives of its own (cuda: NCCL) they become
 * that kind's communicators (one per group, split from one world communicator
 * and checked member by member against the MPI group), or, with --comm mpi,
 * the staged transport (comm_staged.c). The MPI groups stay underneath for
 * launch and control (agree, gatherv_host, broadcast_bytes). docs/GPU.md,
 * "Several processes".
 * ---- the switch ---------------------------------------------------------------- */

static const char *comm_kind_name(int kind, const tks_backend_kind *bk, int mpi) {
    switch (kind) {
    case TKS_MESH_DEV_BACKEND: return bk && bk->comm_name ? bk->comm_name : "backend";
    case TKS_MESH_DEV_STAGED: return "mpi (staged through host memory)";
    default: return mpi ? "mpi" : "none (one process)";
    }
}

const char *tks_mesh_comm_name(const tks_mesh *m) { return comm_kind_name(m->dev_kind, m->dev_comm, m->mpi); }

const char *tks_mesh_comm_kind_name(int kind, const tks_backend_kind *backend, int world) {
    return comm_kind_name(kind, backend, world > 1);
}

int tks_mesh_comm_resolve(const char *comm, const tks_backend_kind *backend, int world, int *kind) {
    *kind = TKS_MESH_DEV_NONE;
    if (!comm) comm = "auto";
    int is_auto = !strcmp(comm, "auto"), is_mpi = !strcmp(comm, "mpi"), is_nccl = !strcmp(comm, "nccl");
    if (!is_auto && !is_mpi && !is_nccl)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--comm %s: use auto (NCCL under --device cuda, else MPI), mpi or nccl", comm);
    /* a device backend: its memory is not the host's */
    int device = backend && backend != &tks_cpu_backend_kind;
    int native = device && backend->comm_world_create && backend->comm_name;
    if (is_nccl && !(native && !strcmp(backend->comm_name, "nccl")))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--comm nccl needs the CUDA backend (NCCL moves GPU memory) but this run "
                        "uses the %s backend%s: use --device cuda on a GPU machine, or --comm mpi",
                        backend ? backend->name : "cpu",
                        tks_backend_find("cuda") ? "" : " (and this tokshard was built without CUDA and "
                                                        "NCCL: rebuild with cmake -DTKS_CUDA=ON)");
    if (world <= 1) return 0; /* one process: no collective moves data */
    if (device) *kind = is_mpi || !native ? TKS_MESH_DEV_STAGED : TKS_MESH_DEV_BACKEND;
#ifdef TKS_TEST_HOOKS
    /* the staged path on the CPU backend, so CPU-only tests cover it */
    const char *t = getenv("TOKSHARD_TEST_STAGED_COMM");
    if (!device && t && !strcmp(t, "1")) *kind = TKS_MESH_DEV_STAGED;
#endif
    return 0;
}

void tks_mesh_device_free(tks_mesh *m) {
    if (!m || !m->dev_kind) return;
    for (int k = 0; k < TKS_N_GROUPS; k++) {
        if (!m->ctrl[k]) continue;
        if (m->group[k] != m->ctrl[k]) {
            if (m->dev_kind == TKS_MESH_DEV_BACKEND) m->dev_comm->comm_group_free(m->group[k]);
            else tks_comm_staged_free(m->group[k]);
        }
        m->group[k] = m->ctrl[k];
        m->ctrl[k] = NULL;
    }
    if (m->dev_world) m->dev_comm->comm_world_free(m->dev_world);
    m->dev_world = NULL;
    m->dev_comm = NULL;
    m->dev_kind = TKS_MESH_DEV_NONE;
}

/* The backend kind's own communicators for every group (NCCL under cuda). */
static int use_backend_comms(tks_mesh *m, tks_backend *be) {
    const tks_backend_kind *bk = be->kind;
    /* collective over the world; a failure on any rank is every rank's */
    int rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], bk->comm_world_create(be, &m->dev_world));
    /* every rank splits every group, in the same order (ncclCommSplit is
     * collective over the world communicator): after each group the world
     * agrees, so no rank goes on to the next split while another stopped */
    for (int k = 0; k < TKS_N_GROUPS && !rc; k++) {
        tks_comm *g = NULL;
        rc = bk->comm_group_create(m->dev_world, m->ctrl[k], &g);
        if (!rc) m->group[k] = g;
        rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], rc);
    }
    return rc;
}

int tks_mesh_use_backend(tks_mesh *m, tks_backend *be, const char *comm, int rc) {
    /* the world agrees on what came before: every rank switches, or none */
    rc = tks_mesh_agree(m, rc);
    int kind = TKS_MESH_DEV_NONE;
    if (!rc) rc = tks_mesh_comm_resolve(comm, be->kind, m->world, &kind);
    if (rc || !m->mpi || kind == TKS_MESH_DEV_NONE) return rc;
    m->dev_kind = kind;
    m->dev_comm = be->kind;
    for (int k = 0; k < TKS_N_GROUPS; k++) m->ctrl[k] = m->group[k];
    if (kind == TKS_MESH_DEV_BACKEND) {
        rc = use_backend_comms(m, be);
    } else {
        for (int k = 0; k < TKS_N_GROUPS && !rc; k++) {
            tks_comm *g = tks_comm_staged_new(m->ctrl[k], be);
            if (!g) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
            else m->group[k] = g;
        }
    }
    /* agreed over the MPI world (the device comms may be the failure) */
    rc = tks_comm_agree(m->ctrl[TKS_GROUP_WORLD], rc);
    if (rc) tks_mesh_device_free(m);
    return rc;
}
