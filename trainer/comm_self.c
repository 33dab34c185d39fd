/* comm_self.c - the group of one process: every collective is the identity. */
#include <string.h>

#include "comm.h"

static int self_noop(tks_comm *c, float *buf, size_t n) {
    (void)c, (void)buf, (void)n;
    return 0;
}
static int self_copy(tks_comm *c, float *out, const float *in, size_t n) {
    (void)c;
    if (out != in) memmove(out, in, n * sizeof *out);
    return 0;
}
static int self_bcast(tks_comm *c, float *buf, size_t n, int root) {
    (void)c, (void)buf, (void)n, (void)root;
    return 0;
}
static int self_barrier(tks_comm *c) {
    (void)c;
    return 0;
}

static int self_bcast_bytes(tks_comm *c, void *buf, size_t n, int root) {
    (void)c, (void)buf, (void)n, (void)root;
    return 0;
}

static const int self_members[1] = {0};
static tks_comm self = {
    .size = 1, .rank = 0, .members = self_members, .allreduce_sum = self_noop,
    .allreduce_max = self_noop, .reduce_scatter_sum = self_copy, .allgather = self_copy,
    .broadcast = self_bcast, .barrier = self_barrier, .broadcast_bytes = self_bcast_bytes,
};

tks_comm *tks_comm_self(void) { return &self; }
