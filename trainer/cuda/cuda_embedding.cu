/* cuda_embedding.cu - the CUDA backend's token embedding kernels (backend.h gives each
 * op's contract; the CPU reference, trainer/cpu/cpu_backend.c, is what they
 * are tested against). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- embedding ----------------------------------------------------------------- */

template <typename T>
__global__ void k_embedding_fwd(T *out, const int32_t *ids, const T *w, int C, int64_t v0, int V) {
    int i = blockIdx.x;
    int64_t r = (int64_t)ids[i] - v0;
    size_t o = (size_t)i * C;
    if (r >= 0 && r < V) {
        for (int j = threadIdx.x; j < C; j += blockDim.x) out[o + j] = w[(size_t)r * C + j];
    } else {
        for (int j = threadIdx.x; j < C; j += blockDim.x) stv(out, o + j, 0.0f);
    }
}
/* The fallback when the workspace cannot hold the sort (no workspace set):
 * one thread per column walks the rows in position order (the CPU
 * reference's order); reads of dout are coalesced across the warp, but only
 * C / 128 blocks run, each a dependent chain of N loads and stores. */
template <typename T>
__global__ void k_embedding_bwd(float *__restrict__ dw, const T *__restrict__ dout,
                                const int32_t *__restrict__ ids, int N, int C, int64_t v0, int V) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    /* unrolled so that the loads of later rows are in flight while a row's
     * read-modify-write of dw completes (the adds stay in row order) */
#pragma unroll 4
    for (int i = 0; i < N; i++) {
        int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < V) dw[(size_t)r * C + col] += ldv(dout, (size_t)i * C + col);
    }
}
/* ---- the embedding backward as a sort by id ------------------------------------
 * 1. key[i] = the local row of ids[i] (V when the id is outside this shard),
 *    pos[i] = i;
 * 2. the (key, pos) pairs sorted by key with CUB's DeviceRadixSort: an LSD
 *    radix sort, i.e. stable counting sorts digit by digit, so positions
 *    with the same key stay in increasing order;
 * 3. one warp per run of equal keys (the run's first sorted index finds it)
 *    and per EMB_COLS columns: each lane keeps its columns' sums in
 *    registers, starting from dw's values, adds the run's rows of dout in
 *    sorted order, and stores once.
 * Same bits as the CPU: there, dw[r][c] += dout[i][c] for i = 0 .. N-1 in
 * increasing order, each add rounded to fp32. Here the run of key r holds
 * exactly the positions i with ids[i] - v0 = r, in increasing order
 * (stability), and the lane owning (r, c) adds dout[i][c] to dw[r][c]'s
 * value in that order, each add rounded to fp32 (a plain add: nothing to
 * contract into an FMA). Same operands, same order, same roundings: the
 * same fp32 result, and no other thread writes dw[r][c] (one warp per run,
 * one lane per column). The sort's scratch: emb_sort_layout. */

enum { EMB_WARPS = 4, EMB_COLS = 256 }; /* warps per block; columns per warp (8 per lane) */

__global__ void k_emb_keys(unsigned *key, int *pos, const int32_t *ids, int N, int64_t v0, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int64_t r = (int64_t)ids[i] - v0;
    key[i] = r >= 0 && r < V ? (unsigned)r : (unsigned)V;
    pos[i] = i;
}
template <typename T>
__global__ void k_embedding_bwd_sorted(float *__restrict__ dw, const T *__restrict__ dout,
                                       const unsigned *__restrict__ key, const int *__restrict__ pos,
                                       int N, int C, unsigned V) {
    int s = (int)blockIdx.x * EMB_WARPS + (int)(threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (s >= N) return;
    unsigned r = key[s];
    if (r >= V || (s > 0 && key[s - 1] == r)) return; /* outside the shard, or not a run's first */
    int c0 = (int)blockIdx.y * EMB_COLS;
    float *row = dw + (size_t)r * C, acc[EMB_COLS / 32];
#pragma unroll
    for (int k = 0; k < EMB_COLS / 32; k++) {
        int c = c0 + k * 32 + lane;
        acc[k] = c < C ? row[c] : 0.0f;
    }
    for (int e = s; e < N && key[e] == r; e++) {
        const T *src = dout + (size_t)pos[e] * C;
#pragma unroll
        for (int k = 0; k < EMB_COLS / 32; k++) {
            int c = c0 + k * 32 + lane;
            if (c < C) acc[k] += ldv(src, c);
        }
    }
#pragma unroll
    for (int k = 0; k < EMB_COLS / 32; k++) {
        int c = c0 + k * 32 + lane;
        if (c < C) row[c] = acc[k];
    }
}

/* Bits of a key in [0, V] (V itself marks an id outside the shard). */
static int key_bits(int V) {
    int b = 1;
    while (b < 32 && ((unsigned)V >> b) != 0) b++;
    return b;
}
static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The sort's scratch at the start of the workspace: keys and positions
 * before and after the sort (N each), then CUB's temporary storage. Returns
 * the bytes (0 when CUB cannot size it); bits = 0 sizes for any V. */
typedef struct emb_sort_layout {
    unsigned *key_in, *key_out;
    int *pos_in, *pos_out;
    void *temp;
    size_t temp_bytes, bytes;
} emb_sort_layout;
static size_t emb_sort_plan(emb_sort_layout *l, void *ws, int N, int bits) {
    size_t temp = 0;
    /* bits = 0: the largest need over every key width (a host-side query) */
    for (int b = bits ? bits : 1; b <= (bits ? bits : 32); b++) {
        size_t t = 0;
        if (cub::DeviceRadixSort::SortPairs(NULL, t, (const unsigned *)NULL, (unsigned *)NULL,
                                            (const int *)NULL, (int *)NULL, N, 0, b) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        if (t > temp) temp = t;
    }
    size_t a = al256((size_t)N * 4);
    memset(l, 0, sizeof *l);
    if (ws) {
        char *p = (char *)ws;
        l->key_in = (unsigned *)p, l->key_out = (unsigned *)(p + a);
        l->pos_in = (int *)(p + 2 * a), l->pos_out = (int *)(p + 3 * a);
        l->temp = p + 4 * a;
    }
    l->temp_bytes = temp;
    l->bytes = 4 * a + al256(temp);
    return l->bytes;
}

size_t tks_cu_embedding_bwd_ws(int N) {
    emb_sort_layout l;
    return N > 0 ? emb_sort_plan(&l, NULL, N, 0) : 0;
}

/* 0: sorted and summed; 1: the workspace cannot hold the sort (the caller
 * runs the fallback); an error code: a CUDA failure (sticky). */
template <typename T>
static int embedding_bwd_sorted(tks_cuda_ctx *c, float *dw, const T *dout, const int32_t *ids, int N,
                                int C, int64_t v0, int V) {
    emb_sort_layout l;
    if (!c->ws || !emb_sort_plan(&l, c->ws, N, key_bits(V)) || l.bytes > c->ws_bytes) return 1;
    k_emb_keys<<<(N + 255) / 256, 256, 0, c->cur>>>(l.key_in, l.pos_in, ids, N, v0, V);
    if (LAUNCHED(c, "embedding_bwd")) return c->err;
    if (tks_cuda_check_rt(c, cub::DeviceRadixSort::SortPairs(l.temp, l.temp_bytes, l.key_in, l.key_out,
                                                             l.pos_in, l.pos_out, N, 0, key_bits(V), c->cur),
                          "embedding_bwd (sort by id)"))
        return c->err;
    dim3 grid((unsigned)((N + EMB_WARPS - 1) / EMB_WARPS), (unsigned)((C + EMB_COLS - 1) / EMB_COLS));
    k_embedding_bwd_sorted<T><<<grid, 32 * EMB_WARPS, 0, c->cur>>>(dw, dout, l.key_out, l.pos_out, N, C,
                                                                   (unsigned)V);
    return LAUNCHED(c, "embedding_bwd");
}

int tks_cu_embedding_fwd(tks_backend *be, void *out, const int32_t *ids, const void *w, int N,
                            int C, int64_t v0, int V, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "embedding_fwd", dt);
    if (N <= 0) return 0;
    BY_DT(dt, E, k_embedding_fwd<E><<<N, 256, 0, c->cur>>>((E *)out, ids, (const E *)w, C, v0, V));
    return LAUNCHED(c, "embedding_fwd");
}
int tks_cu_embedding_bwd(tks_backend *be, float *dw, const void *dout, const int32_t *ids, int N,
                            int C, int64_t v0, int V, tks_dtype dt) {
    CTX(be);
    STICKY(c);
    CHECK_DT(c, "embedding_bwd", dt);
    if (N <= 0 || V <= 0) return 0;
    if (C > EMB_COLS * 65535) return arg_fail(c, "embedding_bwd", "C is above 256 x 65535 columns");
    BY_DT(dt, E, {
        int rc = embedding_bwd_sorted<E>(c, dw, (const E *)dout, ids, N, C, v0, V);
        if (rc <= 0) return rc;
        k_embedding_bwd<E><<<(C + 127) / 128, 128, 0, c->cur>>>(dw, (const E *)dout, ids, N, C, v0, V);
    });
    return LAUNCHED(c, "embedding_bwd");
}
