/*
 * comm.h - collectives on a group of processes (a tp, dp_shard or
 * dp_replicate group of the mesh). Private to trainer/. Implementations:
 * tks_comm_self (one process, the identity) now; MPI and NCCL later, behind
 * this same interface, so model and optimizer code never change.
 *
 * Buffers are DEVICE pointers of the backend in use (backend.h); counts are in
 * elements (fp32). Every member of the group must call each collective in the
 * same order. All return 0 or a negative TKS_ERR_* code.
 */
#ifndef TKS_COMM_H
#define TKS_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct tks_comm tks_comm;

enum { TKS_COLL_ALLREDUCE = 0, TKS_COLL_REDUCE_SCATTER, TKS_COLL_ALLGATHER, TKS_COLL_BROADCAST };

struct tks_comm {
    int size;          /* members in the group */
    int rank;          /* this process's position in the group, 0..size-1 */
    const int *members;/* world ranks of the members, in group order (size entries) */
    void *ctx;
    int (*allreduce_sum)(tks_comm *c, float *buf, size_t n);
    int (*allreduce_max)(tks_comm *c, float *buf, size_t n);
    /* out[n] = sum over members of their in[rank*n .. rank*n + n) (in has size*n) */
    int (*reduce_scatter_sum)(tks_comm *c, float *out, const float *in, size_t n);
    /* out[size*n] = concatenation of every member's in[n], in rank order */
    int (*allgather)(tks_comm *c, float *out, const float *in, size_t n);
    int (*broadcast)(tks_comm *c, float *buf, size_t n, int root);
    int (*barrier)(tks_comm *c);
    /* host bytes from root to every member (control data: error contexts, flags) */
    int (*broadcast_bytes)(tks_comm *c, void *buf, size_t bytes, int root);
    /* payload bytes handed to each kind of collective so far (for the benchmark):
     * TKS_COLL_ALLREDUCE, _REDUCE_SCATTER (input bytes), _ALLGATHER (output
     * bytes), _BROADCAST */
    uint64_t bytes[4];
    uint64_t calls[4];
};

/* The group of one process: every collective is the identity. Static storage. */
tks_comm *tks_comm_self(void);

#endif /* TKS_COMM_H */
