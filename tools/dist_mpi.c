/* dist_mpi.c - dist.h: tokshard commands across MPI ranks.
 *
 * Audit: every rank runs tks_audit on its share of the shards (contiguous
 * ranges of about equal bytes, tks_audit_share); rank 0 gathers the reports
 * (counters, then the recorded problems as bytes: every rank runs the same
 * binary) and merges them with tks_audit_merge, which gives exactly the report
 * of a single process. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dist.h"

static int g_inited_here = 0;

static int world(int *rank, int *size) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS)
            return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                            "MPI_Init failed: check the mpirun/srun command and the MPI installation");
        g_inited_here = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return 0;
}

int tks_dist_rank(void) {
    int rank = 0, size = 1;
    if (tks_dist_launched_many() && world(&rank, &size) != 0) return 0;
    return rank;
}

typedef struct wire {
    uint64_t n_problems, n_problems_total, n_shards, n_chunks, n_docs, n_tokens, bytes_hashed;
    uint32_t vocab_size, min_token_id, max_token_id;
    int32_t manifest_checked, tokenizer_checked, rc;
    double seconds;
} wire;

int tks_dist_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out, int *rank) {
    *out = NULL;
    int size = 1;
    *rank = 0;
    if (!tks_dist_launched_many()) return tks_audit(path, opts, out);
    int rc = world(rank, &size);
    if (rc) return rc;
    tks_audit_opts o = *opts;
    o.rank = (unsigned)*rank;
    o.n_ranks = (unsigned)size;
    tks_audit_report *mine = NULL;
    rc = tks_audit(path, &o, &mine);
    wire w = {0};
    w.rc = rc;
    if (!rc) {
        w.n_problems = mine->n_problems;
        w.n_problems_total = mine->n_problems_total;
        w.n_shards = mine->n_shards;
        w.n_chunks = mine->n_chunks;
        w.n_docs = mine->n_docs;
        w.n_tokens = mine->n_tokens;
        w.bytes_hashed = mine->bytes_hashed;
        w.vocab_size = mine->vocab_size;
        w.min_token_id = mine->min_token_id;
        w.max_token_id = mine->max_token_id;
        w.manifest_checked = mine->manifest_checked;
        w.tokenizer_checked = mine->tokenizer_checked;
        w.seconds = mine->seconds;
    }
    wire *all = *rank == 0 ? calloc((size_t)size, sizeof *all) : NULL;
    if (*rank == 0 && !all) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    MPI_Gather(&w, (int)sizeof w, MPI_BYTE, all, (int)sizeof w, MPI_BYTE, 0, MPI_COMM_WORLD);
    /* one rank's failure stops all of them, each with its own message */
    int worst = rc ? 1 : 0, any = 0;
    MPI_Allreduce(&worst, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        free(all);
        tks_audit_report_free(mine);
        if (rc) return rc;
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "rank %d stops: another rank could not audit %s (see its message)", *rank, path);
    }
    size_t pb = sizeof(tks_audit_problem);
    if ((uint64_t)mine->n_problems * pb > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
    int *counts = NULL, *displs = NULL;
    tks_audit_problem *probs = NULL;
    tks_audit_report **parts = NULL;
    if (*rank == 0) {
        counts = calloc((size_t)size, sizeof *counts);
        displs = calloc((size_t)size, sizeof *displs);
        parts = calloc((size_t)size, sizeof *parts);
        uint64_t total = 0;
        for (int i = 0; i < size; i++) total += all[i].n_problems;
        if (total * pb > INT_MAX) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        probs = calloc(total ? total : 1, pb);
        if (!counts || !displs || !parts || !probs) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        for (int i = 0, at = 0; i < size; i++) {
            counts[i] = (int)(all[i].n_problems * pb);
            displs[i] = at;
            at += counts[i];
        }
    }
    MPI_Gatherv(mine->problems, (int)(mine->n_problems * pb), MPI_BYTE, probs, counts, displs,
                MPI_BYTE, 0, MPI_COMM_WORLD);
    if (*rank == 0) {
        tks_audit_report *rep = calloc((size_t)size, sizeof *rep);
        if (!rep) MPI_Abort(MPI_COMM_WORLD, EXIT_USAGE);
        for (int i = 0; i < size; i++) {
            const wire *x = &all[i];
            rep[i] = (tks_audit_report){
                .n_problems = x->n_problems, .n_problems_total = x->n_problems_total,
                .problems = probs + displs[i] / (int)pb, .n_shards = x->n_shards,
                .n_chunks = x->n_chunks, .n_docs = x->n_docs, .n_tokens = x->n_tokens,
                .bytes_hashed = x->bytes_hashed, .vocab_size = x->vocab_size,
                .min_token_id = x->min_token_id, .max_token_id = x->max_token_id,
                .manifest_checked = x->manifest_checked, .tokenizer_checked = x->tokenizer_checked,
                .seconds = x->seconds};
            parts[i] = &rep[i];
        }
        rc = tks_audit_merge(parts, (size_t)size, opts->max_problems, out);
        free(rep);
    }
    free(counts);
    free(displs);
    free(probs);
    free(parts);
    free(all);
    tks_audit_report_free(mine);
    return rc;
}

int tks_dist_finish(int rc) {
    int inited = 0, fin = 0, out = rc;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) {
        MPI_Allreduce(&rc, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (g_inited_here) MPI_Finalize();
    }
    return out;
}
