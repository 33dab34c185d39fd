/* mesh.c - layout planning, MPI communicators behind comm.h, and the check
 * that the groups built are the groups planned. */
#define _GNU_SOURCE
#include "mesh.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/tks.h"

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

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;
static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = (b->n + (size_t)k + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) return;
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static void put_members(sbuf *b, const int *m, int n) {
    put(b, "[");
    for (int i = 0; i < n; i++) put(b, i ? " %d" : "%d", m[i]);
    put(b, "]");
}

char *tks_mesh_describe(const tks_mesh_shape *s) {
    int world = s->dp_replicate * s->dp_shard * s->tp;
    int *m = malloc((size_t)world * sizeof *m);
    sbuf b = {0};
    if (!m) return NULL;
    put(&b, "mesh: world %d = dp_replicate %d x dp_shard %d x tp %d (tp varies fastest)\n", world,
        s->dp_replicate, s->dp_shard, s->tp);
    put(&b, "  data parallel: dp = %d ranks (gradients reduce-scattered in dp_shard, all-reduced "
        "in dp_replicate; AdamW state 1/%d per rank)\n", s->dp_replicate * s->dp_shard, s->dp_shard);
    put(&b, "  rank  (rep, shard, tp)  dp_rank\n");
    for (int r = 0; r < world; r++) {
        int rep, shard, tpr;
        tks_mesh_coords(s, r, &rep, &shard, &tpr);
        put(&b, "  %4d  (%d, %d, %d)  %7d\n", r, rep, shard, tpr, rep * s->dp_shard + shard);
    }
    for (tks_group_kind k = TKS_GROUP_TP; k <= TKS_GROUP_DP; k++) {
        /* each distinct group once: listed by its first member */
        int count = 0;
        sbuf g = {0};
        for (int r = 0; r < world; r++) {
            int n = tks_mesh_plan_group(s, r, k, m);
            if (m[0] != r) continue;
            put(&g, " ");
            put_members(&g, m, n);
            count++;
        }
        int n0 = tks_mesh_plan_group(s, 0, k, m);
        put(&b, "  %-13s %d group(s) of %d:%s\n", tks_group_name(k), count, n0, g.s ? g.s : "");
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
    if (!launched_by_mpirun()) return 0;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS)
            return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "MPI_Init failed");
        g_mpi_inited_here = 1;
    }
    MPI_Comm_size(MPI_COMM_WORLD, world);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    return 0;
}

void tks_mesh_finalize(void) {
    int fin = 0;
    if (g_mpi_inited_here && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
}

typedef struct mpi_comm {
    tks_comm c;
    MPI_Comm comm;
    int *members;
} mpi_comm;

#define MC(c) ((mpi_comm *)(c))

static int mpi_err(int e, const char *what) {
    if (e == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(e, msg, &len);
    return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "MPI %s failed: %s", what, msg);
}

static int m_allreduce(tks_comm *c, float *buf, size_t n, MPI_Op op) {
    c->bytes[TKS_COLL_ALLREDUCE] += n * sizeof(float);
    c->calls[TKS_COLL_ALLREDUCE]++;
    if (c->size == 1) return 0;
    return mpi_err(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op, MC(c)->comm), "allreduce");
}
static int m_sum(tks_comm *c, float *buf, size_t n) { return m_allreduce(c, buf, n, MPI_SUM); }
static int m_max(tks_comm *c, float *buf, size_t n) { return m_allreduce(c, buf, n, MPI_MAX); }

static int m_reduce_scatter(tks_comm *c, float *out, const float *in, size_t n) {
    c->bytes[TKS_COLL_REDUCE_SCATTER] += n * (size_t)c->size * sizeof(float);
    c->calls[TKS_COLL_REDUCE_SCATTER]++;
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof *out);
        return 0;
    }
    return mpi_err(MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, MC(c)->comm),
                   "reduce_scatter");
}

static int m_allgather(tks_comm *c, float *out, const float *in, size_t n) {
    c->bytes[TKS_COLL_ALLGATHER] += n * (size_t)c->size * sizeof(float);
    c->calls[TKS_COLL_ALLGATHER]++;
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof *out);
        return 0;
    }
    if (in == out + (size_t)c->rank * n) /* in place */
        return mpi_err(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, (int)n, MPI_FLOAT,
                                     MC(c)->comm), "allgather");
    return mpi_err(MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, MC(c)->comm),
                   "allgather");
}

static int m_bcast(tks_comm *c, float *buf, size_t n, int root) {
    c->bytes[TKS_COLL_BROADCAST] += n * sizeof(float);
    c->calls[TKS_COLL_BROADCAST]++;
    if (c->size == 1) return 0;
    return mpi_err(MPI_Bcast(buf, (int)n, MPI_FLOAT, root, MC(c)->comm), "broadcast");
}

static int m_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    if (c->size == 1) return 0;
    return mpi_err(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MC(c)->comm), "broadcast");
}

static int m_barrier(tks_comm *c) {
    return c->size == 1 ? 0 : mpi_err(MPI_Barrier(MC(c)->comm), "barrier");
}

static tks_comm *mpi_comm_new(MPI_Comm comm) {
    mpi_comm *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->comm = comm;
    MPI_Comm_size(comm, &m->c.size);
    MPI_Comm_rank(comm, &m->c.rank);
    m->members = calloc((size_t)m->c.size, sizeof *m->members);
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (m->members) MPI_Allgather(&me, 1, MPI_INT, m->members, 1, MPI_INT, comm);
    m->c.members = m->members;
    m->c.ctx = m;
    m->c.allreduce_sum = m_sum;
    m->c.allreduce_max = m_max;
    m->c.reduce_scatter_sum = m_reduce_scatter;
    m->c.allgather = m_allgather;
    m->c.broadcast = m_bcast;
    m->c.broadcast_bytes = m_bcast_bytes;
    m->c.barrier = m_barrier;
    return &m->c;
}

static void mpi_comm_free(tks_comm *c) {
    if (!c) return;
    mpi_comm *m = MC(c);
    if (m->comm != MPI_COMM_WORLD && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m->members);
    free(m);
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
        MPI_Comm c = MPI_COMM_WORLD;
        if (k != TKS_GROUP_WORLD) {
            int color, key;
            split_of(m, (tks_group_kind)k, &color, &key);
            rc = mpi_err(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), "comm_split");
        }
        if (!rc && !(m->group[k] = mpi_comm_new(c)))
            rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
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
    if (rc) {
        tks_mesh_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void tks_mesh_free(tks_mesh *m) {
    if (!m) return;
    if (m->mpi)
        for (int k = 0; k < TKS_N_GROUPS; k++) mpi_comm_free(m->group[k]);
    free(m);
}

int tks_mesh_agree(tks_mesh *m, int rc) {
    tks_comm *w = m->group[TKS_GROUP_WORLD];
    if (!m->mpi || w->size == 1) return rc;
    /* lowest failing rank: min over (rc ? rank : world) */
    int mine = rc ? m->rank : m->world, first = m->world;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MC(w)->comm);
    if (first == m->world) return 0;
    tks_error e = *tks_last_error();
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, MC(w)->comm);
    tks_error_restore(&e);
    return e.code ? e.code : TKS_ERR_ARG;
}
