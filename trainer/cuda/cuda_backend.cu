/* cuda_backend.cu - backend.h on an NVIDIA GPU: the runtime
 * (memory, workspace, streams and events, creation, the operations table
 * and the registry entry; errors are cuda_util.cu). The kernels are one file per family, as
 * llm.c keeps them: cuda_elementwise.cu (element-wise, deterministic
 * reductions, SwiGLU), cuda_embedding.cu, cuda_norm.cu (RMSNorm, with the
 * residual add fused into the forward),
 * cuda_attention.cu (RoPE, flash-style attention that keeps only lse),
 * cuda_xent.cu (cross-entropy), cuda_adamw.cu (multi-tensor AdamW); GEMMs are
 * cuda_gemm.cu, cuDNN's fused attention cudnn_attention.cpp.
 *
 * Storage is fp32 or bf16 (the op's dt); arithmetic is fp32 in registers
 * (ld/st below convert). Formulas and sources are in backend.h; kernels keep
 * the CPU reference's operation order where that order is a guarantee
 * (embedding and RMSNorm weight gradients sum rows in id order, so they are
 * deterministic; AdamW uses torch.optim.AdamW's order). Reductions inside a
 * row use a fixed tree and no atomics anywhere, so two runs give the same
 * bits.
 *
 * Legend (backend.h): B batch, T sequence, N = B*T rows, C dim, NH query
 * heads, NKV kv heads, HD head dim, F SwiGLU hidden dim, V vocab columns of a
 * shard, VR its real ones.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

#include "common/tks.h"
#include "trainer/cuda/cuda_kernels.cuh"

/* ---- memory -------------------------------------------------------------------- */

static void *cu_alloc(tks_backend *be, size_t bytes) {
    CTX(be);
    void *p = NULL;
    size_t n = (bytes + 255) & ~(size_t)255;
    if (!n) n = 256;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        size_t big[3] = {0, 0, 0}; /* the biggest buffers: what to shrink */
        for (int i = 0; i < c->nallocs; i++) {
            size_t b = c->allocs[i].bytes;
            for (int k = 0; k < 3; k++)
                if (b > big[k]) {
                    for (int j = 2; j > k; j--) big[j] = big[j - 1];
                    big[k] = b;
                    break;
                }
        }
        tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                 "CUDA backend: out of device memory allocating %.1f MiB on device %d (%.1f MiB "
                 "allocated by tokshard, largest buffers %.1f, %.1f, %.1f MiB; %.1f of %.1f MiB "
                 "free): lower --micro-batch or --seq-len, use --dtype bf16, or spread the model "
                 "with --dp-shard/--tp",
                 (double)bytes / 1048576.0, c->device, (double)c->bytes_now / 1048576.0,
                 (double)big[0] / 1048576.0, (double)big[1] / 1048576.0,
                 (double)big[2] / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0);
        return NULL;
    }
    /* zero-filled before any stream can use it */
    if (cudaMemsetAsync(p, 0, n, c->stream) != cudaSuccess || cudaStreamSynchronize(c->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "CUDA backend: zero-filling a new buffer failed");
        return NULL;
    }
    if (c->nallocs < TKS_MAX_ALLOCS) {
        c->allocs[c->nallocs].p = p;
        c->allocs[c->nallocs].bytes = n;
        c->nallocs++;
    }
    c->bytes_now += n;
    if (c->bytes_now > c->bytes_peak) c->bytes_peak = c->bytes_now;
    return p;
}

static void cu_free(tks_backend *be, void *p) {
    CTX(be);
    if (!p) return;
    for (int i = 0; i < c->nallocs; i++)
        if (c->allocs[i].p == p) {
            c->bytes_now -= c->allocs[i].bytes;
            c->allocs[i] = c->allocs[--c->nallocs];
            break;
        }
    cudaDeviceSynchronize();
    cudaFree(p);
}

static int cu_upload(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    STICKY(c);
    if (c->pin && bytes <= TKS_PIN_BYTES) { /* through a pinned slot: the host does not wait */
        int s = c->pin_next;
        c->pin_next = (s + 1) % TKS_PIN_SLOTS;
        unsigned char *slot = c->pin + (size_t)s * TKS_PIN_BYTES;
        if (tks_cuda_check_rt(c, cudaEventSynchronize(c->pin_done[s]), "upload (staging slot)")) return c->err;
        memcpy(slot, src, bytes);
        if (!tks_cuda_check_rt(c, cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, c->cur), "upload"))
            tks_cuda_check_rt(c, cudaEventRecord(c->pin_done[s], c->cur), "upload (staging slot)");
        return c->err;
    }
    /* pageable source: the host buffer may be reused when the call returns */
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->cur), "upload");
    return c->err;
}
static int cu_download(tks_backend *be, void *dst, const void *src, size_t bytes) {
    CTX(be);
    if (c->err) {
        memset(dst, 0xff, bytes); /* NaN, never stale data that looks valid */
        return c->err;
    }
    tks_cuda_check_rt(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur), "download");
    if (!c->err) tks_cuda_check_rt(c, cudaStreamSynchronize(c->cur), "download (stream sync)");
    return c->err;
}
static int cu_memzero(tks_backend *be, void *p, size_t bytes) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaMemsetAsync(p, 0, bytes, c->cur), "memzero");
    return c->err;
}
static int cu_sync(tks_backend *be) {
    CTX(be);
    if (!c->err) tks_cuda_check_rt(c, cudaDeviceSynchronize(), "sync");
    if (c->err) return tks_fail(c->err, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
    return 0;
}

/* ---- workspace: attention's backward keeps D[B,NH,T] (fp32) there, the
 * RMSNorm weight gradient its chunk sums, the embedding backward its sort -- */

/* cuDNN's graphs need their own scratch: built here for the model's layout
 * (q, k, v views into one fused row of (NH + 2 NKV) HD, out rows NH HD), so
 * the ops never allocate; the larger of the two needs is the workspace. */
static size_t cu_workspace_bytes(tks_backend *be, const tks_ws_shape *s) {
    CTX(be);
    size_t d = (size_t)(s->B > 0 ? s->B : 1) * (size_t)(s->NH > 0 ? s->NH : 1) *
               (size_t)(s->T > 0 ? s->T : 1) * sizeof(float);
    /* the RMSNorm weight gradient's chunk partials (rmsnorm_dw): an op at a
     * time uses the workspace, so the largest need sizes it */
    size_t rms = (c->norm_onepass ? (size_t)RMS_ONEPASS_CHUNKS : (size_t)RMS_DW_CHUNKS) * (size_t)(s->C > 0 ? s->C : 1) *
                 sizeof(float);
    if (rms > d) d = rms;
    /* the embedding backward's sort by id over the B T rows */
    size_t emb = s->B > 0 && s->T > 0 ? tks_cu_embedding_bwd_ws(s->B * s->T) : 0;
    if (emb > d) d = emb;
    if (c->flash && s->dt == TKS_BF16 && s->B > 0 && s->T > 0 && s->NH > 0 && s->NKV > 0) {
        size_t ld = (size_t)(s->NH + 2 * s->NKV) * s->HD, ldo = (size_t)s->NH * s->HD, w = 0;
        if (tks_cudnn_attention_ws(be, s->B, s->T, s->NH, s->NKV, s->HD, ld, ld, ldo, c->deterministic,
                                   &w) == 0) {
            if (w > d) d = w;
        } else {
            snprintf(c->flash_why, sizeof c->flash_why, "%s", tks_last_error()->message);
            tks_clear_error();
        }
    }
    return (d + 255) & ~(size_t)255;
}
static int cu_set_workspace(tks_backend *be, void *ws, size_t bytes) {
    CTX(be);
    STICKY(c);
    c->ws = ws;
    c->ws_bytes = ws ? bytes : 0;
    return 0;
}

/* ---- streams and events: CUDA's own ----------------------------------------- */

static int cu_stream_create(tks_backend *be, tks_stream **out) {
    CTX(be);
    STICKY(c);
    cudaStream_t s = NULL;
    *out = NULL;
    if (tks_cuda_check_rt(c, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream_create"))
        return c->err;
    *out = (tks_stream *)s;
    return 0;
}
static void cu_stream_destroy(tks_backend *be, tks_stream *s) {
    CTX(be);
    if (!s) return;
    if (c->cur == (cudaStream_t)s) c->cur = c->stream;
    cudaStreamSynchronize((cudaStream_t)s);
    cudaStreamDestroy((cudaStream_t)s);
}
static int cu_set_stream(tks_backend *be, tks_stream *s) {
    CTX(be);
    STICKY(c);
    c->cur = s ? (cudaStream_t)s : c->stream;
    return 0;
}
static int cu_event_create(tks_backend *be, tks_event **out) {
    CTX(be);
    STICKY(c);
    cudaEvent_t e = NULL;
    *out = NULL;
    if (tks_cuda_check_rt(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event_create"))
        return c->err;
    *out = (tks_event *)e;
    return 0;
}
static void cu_event_destroy(tks_backend *be, tks_event *e) {
    (void)be;
    if (e) cudaEventDestroy((cudaEvent_t)e);
}
static int cu_event_record(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaEventRecord((cudaEvent_t)e, c->cur), "event_record");
    return c->err;
}
static int cu_stream_wait(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaStreamWaitEvent(c->cur, (cudaEvent_t)e, 0), "stream_wait");
    return c->err;
}
static int cu_event_sync(tks_backend *be, tks_event *e) {
    CTX(be);
    STICKY(c);
    tks_cuda_check_rt(c, cudaEventSynchronize((cudaEvent_t)e), "event_sync");
    return c->err;
}

/* ---- the --profile timer: CUDA events on the current stream ------------------
 * A pair of events around each op, recorded where the op is enqueued; the
 * host waits only in cu_timer_read, once per profiled step, and reads each
 * pair's elapsed time (the GPU's clock, about 0.5 us resolution). */
struct tks_timer {
    size_t cap;
    cudaEvent_t *ev;
};
static void cu_timer_destroy(tks_backend *be, tks_timer *t) {
    (void)be;
    if (!t) return;
    for (size_t i = 0; i < t->cap && t->ev; i++)
        if (t->ev[i]) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t);
}
static int cu_timer_create(tks_backend *be, size_t marks, tks_timer **out) {
    *out = NULL;
    tks_timer *t = (tks_timer *)calloc(1, sizeof *t);
    if (t) t->ev = (cudaEvent_t *)calloc(marks ? marks : 1, sizeof *t->ev);
    if (!t || !t->ev) {
        free(t);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory for %zu timer marks", marks);
    }
    t->cap = marks;
    for (size_t i = 0; i < marks; i++) {
        cudaError_t e = cudaEventCreate(&t->ev[i]); /* with timing */
        if (e != cudaSuccess) {
            cudaGetLastError();
            t->ev[i] = NULL;
            cu_timer_destroy(be, t);
            return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE,
                            "--profile: creating CUDA event %zu of %zu for the op timer failed: %s", i, marks,
                            cudaGetErrorString(e));
        }
    }
    *out = t;
    return 0;
}
static int cu_timer_mark(tks_backend *be, tks_timer *t, size_t i) {
    CTX(be);
    STICKY(c);
    if (i >= t->cap) return arg_fail(c, "profile timer", "mark past the timer's capacity (a caller bug)");
    tks_cuda_check_rt(c, cudaEventRecord(t->ev[i], c->cur), "profile timer (event record)");
    return c->err;
}
static int cu_timer_read(tks_backend *be, tks_timer *t, size_t n, double *secs) {
    CTX(be);
    STICKY(c);
    for (size_t k = 0; 2 * k + 1 < n && 2 * k + 1 < t->cap; k++) {
        float ms = 0;
        if (tks_cuda_check_rt(c, cudaEventSynchronize(t->ev[2 * k + 1]), "profile timer (event sync)") ||
            tks_cuda_check_rt(c, cudaEventElapsedTime(&ms, t->ev[2 * k], t->ev[2 * k + 1]),
                              "profile timer (elapsed time)"))
            return c->err;
        secs[k] = ms / 1e3;
    }
    return 0;
}

/* ---- creation -------------------------------------------------------------------- */

static void cu_destroy(tks_backend *be) {
    if (!be) return;
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (c) {
        cudaDeviceSynchronize();
#ifdef TKS_HAVE_CUDNN_FE
        tks_cuda_flash_release(be);
#endif
        tks_cuda_gemm_plans_free(c);
        if (c->pin) {
            cudaFreeHost(c->pin);
            for (int s = 0; s < TKS_PIN_SLOTS; s++) cudaEventDestroy(c->pin_done[s]);
        }
        for (int i = 0; i < c->nallocs; i++) cudaFree(c->allocs[i].p);
        cudaFree(c->workspace);
        cudaFree(c->d_partial);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int tks_cuda_built(void) { return 1; }

/* Without an NVIDIA driver on the machine (neither its control device nor its
 * /proc entry) there is no device: answered without loading the CUDA runtime,
 * so CPU-only runs of a CUDA build (--device auto, the tests) never start it. */
extern "C" int tks_cuda_device_count(void) {
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        return 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int pick_device(int device, int count) {
    if (device >= 0) return device;
    const char *e = getenv("TKS_CUDA_DEVICE");
    if (e && *e) return atoi(e);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr && *lr) return atoi(lr) % count;
    return 0;
}

/* The operations table (backend.h). Filled by a function because C++17 has
 * no designated initializers; the result is constant after static
 * initialization. */
static tks_backend_ops make_cuda_ops(void) {
    tks_backend_ops o;
    memset(&o, 0, sizeof o);
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.upload = cu_upload;
    o.download = cu_download;
    o.memzero = cu_memzero;
    o.copy = tks_cu_copy;
    o.sync = cu_sync;
    o.workspace_bytes = cu_workspace_bytes;
    o.set_workspace = cu_set_workspace;
    o.stream_create = cu_stream_create;
    o.stream_destroy = cu_stream_destroy;
    o.set_stream = cu_set_stream;
    o.event_create = cu_event_create;
    o.event_destroy = cu_event_destroy;
    o.event_record = cu_event_record;
    o.stream_wait = cu_stream_wait;
    o.event_sync = cu_event_sync;
    o.gemm = tks_cuda_gemm;
    o.convert = tks_cu_convert;
    o.add = tks_cu_add;
    o.scale = tks_cu_scale;
    o.sumsq = tks_cu_sumsq;
    o.sum = tks_cu_sum;
    o.embedding_fwd = tks_cu_embedding_fwd;
    o.embedding_bwd = tks_cu_embedding_bwd;
    o.rmsnorm_fwd = tks_cu_rmsnorm_fwd;
    o.rmsnorm_bwd = tks_cu_rmsnorm_bwd;
    o.add_rmsnorm_fwd = tks_cu_add_rmsnorm_fwd;
    o.rope = tks_cu_rope;
    o.attention_fwd = tks_cu_attention_fwd;
    o.attention_bwd = tks_cu_attention_bwd;
    o.attention_step = tks_cu_attention_step;
    o.swiglu_fwd = tks_cu_swiglu_fwd;
    o.swiglu_bwd = tks_cu_swiglu_bwd;
    o.xent_fused = tks_cu_xent_fused;
    o.xent_max = tks_cu_xent_max;
    o.xent_sumexp = tks_cu_xent_sumexp;
    o.xent_target = tks_cu_xent_target;
    o.xent_loss = tks_cu_xent_loss;
    o.xent_bwd = tks_cu_xent_bwd;
    o.adamw = tks_cu_adamw;
    o.destroy = cu_destroy;
    return o;
}
static const tks_backend_ops cuda_ops = make_cuda_ops();

static int cuda_kind_create(int threads, tks_backend **out) {
    (void)threads;
    return tks_cuda_backend_create(-1, out);
}
static int cuda_comm_world_create(tks_backend *be, void **world) {
    tks_nccl_world *w = NULL;
    int rc = tks_nccl_world_create(be, &w);
    *world = w;
    return rc;
}
static void cuda_comm_world_free(void *world) { tks_nccl_world_free((tks_nccl_world *)world); }
static int cuda_comm_group_create(void *world, tks_comm *ctrl, tks_comm **out) {
    return tks_nccl_comm_create((tks_nccl_world *)world, ctrl, out);
}

static void cuda_attention_name(tks_backend *be, tks_dtype dt, char *out, size_t cap) {
    const char *why = tks_cuda_flash_status(be);
    snprintf(out, cap, "%s", dt != TKS_BF16 ? "tokshard kernel"
                             : *why         ? "tokshard kernel (cuDNN not used)"
                             : tks_cuda_ctx_of(be)->deterministic
                                 ? "cuDNN, deterministic backward (--deterministic)"
                                 : "cuDNN, fast backward (dQ by atomics: --deterministic for identical bits)");
}

static int cuda_set_deterministic(tks_backend *be, int on) {
    tks_cuda_ctx_of(be)->deterministic = on != 0;
    return 0;
}

static tks_backend_kind make_cuda_kind(void) {
    tks_backend_kind k;
    memset(&k, 0, sizeof k);
    k.name = "cuda";
    k.ops = &cuda_ops;
    k.device_count = tks_cuda_device_count;
    k.create = cuda_kind_create;
    k.reserved = tks_cuda_backend_reserved;
    k.memory = tks_cuda_backend_memory;
    k.describe = tks_cuda_describe;
    k.attention_name = cuda_attention_name;
    k.set_deterministic = cuda_set_deterministic;
    k.timer_create = cu_timer_create;
    k.timer_mark = cu_timer_mark;
    k.timer_read = cu_timer_read;
    k.timer_destroy = cu_timer_destroy;
    k.comm_name = "nccl";
    k.comm_world_create = cuda_comm_world_create;
    k.comm_world_free = cuda_comm_world_free;
    k.comm_group_create = cuda_comm_group_create;
    k.comm_group_free = tks_nccl_comm_free;
    return k;
}
static const tks_backend_kind cuda_kind = make_cuda_kind();

extern "C" const tks_backend_kind *tks_cuda_backend_kind(void) { return &cuda_kind; }

/* The pinned upload slots; without them (cudaHostAlloc refused, e.g. a
 * locked-memory limit) uploads copy from pageable memory, slower, not wrong. */
static void pin_staging(tks_cuda_ctx *c) {
    void *p = NULL;
    if (cudaHostAlloc(&p, (size_t)TKS_PIN_SLOTS * TKS_PIN_BYTES, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    int s = 0;
    while (s < TKS_PIN_SLOTS && cudaEventCreateWithFlags(&c->pin_done[s], cudaEventDisableTiming) == cudaSuccess) s++;
    if (s < TKS_PIN_SLOTS) {
        cudaGetLastError();
        while (s > 0) cudaEventDestroy(c->pin_done[--s]);
        cudaFreeHost(p);
        return;
    }
    c->pin = (unsigned char *)p;
}

extern "C" int tks_cuda_backend_create(int device, tks_backend **out) {
    *out = NULL;
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--device cuda: no CUDA device is usable here (no NVIDIA driver: neither "
                        "/dev/nvidiactl nor /proc/driver/nvidia exists); check nvidia-smi, or use "
                        "--device cpu");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--device cuda: no CUDA device is usable here (%s); check nvidia-smi and "
                        "CUDA_VISIBLE_DEVICES, or use --device cpu",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    int dev = pick_device(device, count);
    if (dev < 0 || dev >= count)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "CUDA device %d does not exist (%d visible): set TKS_CUDA_DEVICE to 0..%d",
                        dev, count, count - 1);
    tks_backend *be = (tks_backend *)calloc(1, sizeof *be);
    tks_cuda_ctx *c = (tks_cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of host memory");
    }
    be->ctx = c;
    c->device = dev;
    c->workspace_bytes = 32u << 20; /* cuBLAS's recommendation for Hopper */
    int bad = tks_cuda_check_rt(c, cudaSetDevice(dev), "cudaSetDevice") ||
              tks_cuda_check_rt(c, cudaGetDeviceProperties(&c->prop, dev), "cudaGetDeviceProperties") ||
              tks_cuda_check_rt(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                                "cudaStreamCreate") ||
              tks_cuda_check_blas(c, cublasLtCreate(&c->lt), "cublasLtCreate") ||
              tks_cuda_check_blas(c, cublasCreate(&c->blas), "cublasCreate") ||
              tks_cuda_check_blas(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode") ||
              tks_cuda_check_rt(c, cudaMalloc(&c->workspace, c->workspace_bytes), "cuBLASLt workspace") ||
              tks_cuda_check_rt(c, cudaMalloc((void **)&c->d_partial, (TKS_NORM_BLOCKS + 1) * sizeof(double)),
                                "reduction partials") ||
              /* on the backend's own non-blocking stream: the legacy stream's
               * cudaMemset is not ordered with it */
              tks_cuda_check_rt(c, cudaMemsetAsync(c->d_partial, 0, (TKS_NORM_BLOCKS + 1) * sizeof(double),
                                                   c->stream),
                                "reduction partials") ||
              tks_cuda_check_rt(c, cudaStreamSynchronize(c->stream), "reduction partials");
    if (bad) {
        int code = tks_fail(c->err ? c->err : TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "%s", c->err_msg);
        cu_destroy(be);
        return code;
    }
    pin_staging(c);
    c->cur = c->stream;
    {
        const char *fa = getenv("TKS_CUDNN_ATTENTION");
        tks_cuda_set_flash(be, !(fa && !strcmp(fa, "0")));
        if (!c->flash)
            snprintf(c->flash_why, sizeof c->flash_why, "%s",
#ifdef TKS_HAVE_CUDNN_FE
                     "cuDNN attention turned off (TKS_CUDNN_ATTENTION=0)"
#else
                     "built without the cuDNN frontend (scripts/install-deps.sh --cuda, then reconfigure)"
#endif
            );
    }
    {
        const char *vo = getenv("TKS_CUDA_VEC_OPTIM"), *no = getenv("TKS_CUDA_NORM_ONEPASS"),
                   *ro = getenv("TKS_CUDA_ROPE_ROWS"), *xv = getenv("TKS_CUDA_XENT_VEC"),
                   *sv = getenv("TKS_CUDA_SWIGLU_VEC");
        tks_cuda_set_vec_optim(be, vo && !strcmp(vo, "1"));
        tks_cuda_set_norm_onepass(be, no && !strcmp(no, "1"));
        tks_cuda_set_rope_rows(be, ro && !strcmp(ro, "1"));
        tks_cuda_set_xent_vec(be, xv && !strcmp(xv, "1"));
        tks_cuda_set_swiglu_vec(be, sv && !strcmp(sv, "1"));
    }
    be->ops = &cuda_ops;
    be->kind = &cuda_kind;
    *out = be;
    return 0;
}

extern "C" int tks_cuda_backend_check(tks_backend *be) { return cu_sync(be); }

extern "C" void tks_cuda_backend_memory(tks_backend *be, size_t *now, size_t *peak) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    if (now) *now = c->bytes_now;
    if (peak) *peak = c->bytes_peak;
}

extern "C" size_t tks_cuda_backend_reserved(tks_backend *be) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    return c->workspace_bytes + (TKS_NORM_BLOCKS + 1) * sizeof(double);
}

extern "C" void tks_cuda_describe(tks_backend *be, char *out, size_t cap) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
    int drv = 0, rt = 0, nccl = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nccl);
    size_t lt = cublasLtGetVersion();
    snprintf(out, cap,
             "%s (sm_%d%d, %d SMs, %.1f GiB), CUDA driver %d.%d, runtime %d.%d, cuBLASLt %zu, "
             "NCCL %d.%d.%d",
             c->prop.name, c->prop.major, c->prop.minor, c->prop.multiProcessorCount,
             (double)c->prop.totalGlobalMem / 1073741824.0, drv / 1000, (drv % 1000) / 10,
             rt / 1000, (rt % 1000) / 10, lt, nccl / 10000, (nccl % 10000) / 100, nccl % 100);
}

extern "C" int tks_cuda_set_flash(tks_backend *be, int on) {
    tks_cuda_ctx *c = tks_cuda_ctx_of(be);
#ifdef TKS_HAVE_CUDNN_FE
    c->flash = on != 0;
#else
    (void)on;
    c->flash = 0;
#endif
    return c->flash;
}

/* a switch of the backend's kernels set: on or off (0), as set */
static int set_switch(int *sw, int on) {
    *sw = on != 0;
    return *sw;
}

extern "C" int tks_cuda_set_vec_optim(tks_backend *be, int on) {
    return set_switch(&tks_cuda_ctx_of(be)->vec_optim, on);
}

extern "C" int tks_cuda_set_norm_onepass(tks_backend *be, int on) {
    return set_switch(&tks_cuda_ctx_of(be)->norm_onepass, on);
}

extern "C" int tks_cuda_set_rope_rows(tks_backend *be, int on) {
    return set_switch(&tks_cuda_ctx_of(be)->rope_rows, on);
}

extern "C" int tks_cuda_set_xent_vec(tks_backend *be, int on) {
    return set_switch(&tks_cuda_ctx_of(be)->xent_vec, on);
}

extern "C" int tks_cuda_set_swiglu_vec(tks_backend *be, int on) {
    return set_switch(&tks_cuda_ctx_of(be)->swiglu_vec, on);
}

extern "C" const char *tks_cuda_flash_status(tks_backend *be) {
    return tks_cuda_ctx_of(be)->flash_why;
}

#ifndef TKS_HAVE_CUDNN_FE
extern "C" int tks_cudnn_attention_ws(tks_backend *be, int B, int T, int NH, int NKV, int HD,
                                      size_t ldq, size_t ldkv, size_t ldo, int deterministic,
                                      size_t *bytes) {
    (void)be, (void)B, (void)T, (void)NH, (void)NKV, (void)HD, (void)ldq, (void)ldkv, (void)ldo,
        (void)deterministic;
    *bytes = 0;
    return TKS_ERR_ARG;
}
extern "C" int tks_cudnn_attention_fwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                                       const void *k, const void *v, size_t ldkv, int B, int T,
                                       int NH, int NKV, int HD) {
    (void)be, (void)stream, (void)ws, (void)ws_bytes, (void)out, (void)ldo, (void)lse, (void)q,
        (void)ldq, (void)k, (void)v, (void)ldkv, (void)B, (void)T, (void)NH, (void)NKV, (void)HD;
    return TKS_ERR_ARG;
}
extern "C" int tks_cudnn_attention_bwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *dq, void *dk, void *dv, const void *dout,
                                       const void *out, size_t ldo, const float *lse, const void *q,
                                       size_t ldq, const void *k, const void *v, size_t ldkv, int B,
                                       int T, int NH, int NKV, int HD, int deterministic) {
    (void)be, (void)stream, (void)ws, (void)ws_bytes, (void)dq, (void)dk, (void)dv, (void)dout,
        (void)out, (void)ldo, (void)lse, (void)q, (void)ldq, (void)k, (void)v, (void)ldkv, (void)B,
        (void)T, (void)NH, (void)NKV, (void)HD, (void)deterministic;
    return TKS_ERR_ARG;
}
#endif
