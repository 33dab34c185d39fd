/* cudnn_attention.cpp - causal GQA flash attention through cuDNN's fused SDPA
 * (the cuDNN frontend's graph API, header-only C++), behind the C interface
 * of cuda.h (tks_cuda_flash_fwd/bwd). The only C++ in the backend.
 *
 * Layouts: q, out, dout [B,T,NH,HD], k, v [B,T,NKV,HD], bf16, i.e. cuDNN's
 * logical [B,H,T,HD] with strides (T*H*HD, HD, H*HD, 1); the softmax
 * statistics (natural log-sum-exp of the scaled scores, fp32) are [B,NH,T].
 * Graphs are built once per (direction, B, T, NH, NKV, HD) and cached with
 * their workspace size; one cuDNN workspace per backend, grown when a new
 * graph needs more (so not inside a timed step after the first one). The
 * backward asks cuDNN for its deterministic algorithm (no atomics in dQ).
 */
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

extern "C" {
#include "common/tks.h"
}
#include "cuda.h"

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };

using Key = std::tuple<int, int, int, int, int, int>; /* bwd, B, T, NH, NKV, HD */

struct Flash {
    cudnnHandle_t handle = nullptr;
    void *workspace = nullptr;
    int64_t workspace_bytes = 0;
    std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
};

std::mutex g_lock;
std::map<tks_backend *, Flash> g_flash;

int fail(const char *what, const std::string &why) {
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "cuDNN flash attention: %s: %s; the trainer falls back to tokshard's own "
                    "attention kernel (set CUDNN_FRONTEND_LOG_INFO=1 for cuDNN's reasons)",
                    what, why.c_str());
}

std::shared_ptr<fe::graph::Tensor_attributes> bthd(fe::graph::Graph &g, const char *name,
                                                   int64_t uid, int64_t B, int64_t T, int64_t H,
                                                   int64_t HD) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, HD})
                        .set_stride({T * H * HD, HD, H * HD, 1}));
}

int build(Flash &f, const Key &key, std::shared_ptr<fe::graph::Graph> &out) {
    auto it = f.graphs.find(key);
    if (it != f.graphs.end()) {
        out = it->second;
        return 0;
    }
    auto [bwd, B, T, NH, NKV, HD] = key;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = bthd(*g, "q", Q_UID, B, T, NH, HD);
    auto k = bthd(*g, "k", K_UID, B, T, NKV, HD);
    auto v = bthd(*g, "v", V_UID, B, T, NKV, HD);
    float scale = 1.0f / std::sqrt((float)HD);
    if (!bwd) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("flash_fwd")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
        auto [o, stats] = g->sdpa(q, k, v, opt);
        o->set_output(true).set_uid(O_UID).set_dim({B, NH, T, HD}).set_stride(
            {(int64_t)T * NH * HD, HD, (int64_t)NH * HD, 1});
        stats->set_output(true).set_uid(STATS_UID).set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto o = bthd(*g, "o", O_UID, B, T, NH, HD);
        auto dO = bthd(*g, "dO", DO_UID, B, T, NH, HD);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(STATS_UID)
                                   .set_dim({B, NH, T, 1})
                                   .set_stride({(int64_t)NH * T, T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes()
                       .set_name("flash_bwd")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(true);
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats, opt);
        dq->set_output(true).set_uid(DQ_UID).set_dim({B, NH, T, HD}).set_stride(
            {(int64_t)T * NH * HD, HD, (int64_t)NH * HD, 1});
        dk->set_output(true).set_uid(DK_UID).set_dim({B, NKV, T, HD}).set_stride(
            {(int64_t)T * NKV * HD, HD, (int64_t)NKV * HD, 1});
        dv->set_output(true).set_uid(DV_UID).set_dim({B, NKV, T, HD}).set_stride(
            {(int64_t)T * NKV * HD, HD, (int64_t)NKV * HD, 1});
    }
    auto st = g->validate();
    if (st.is_good()) st = g->build_operation_graph(f.handle);
    if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
    if (st.is_good()) st = g->check_support(f.handle);
    if (st.is_good()) st = g->build_plans(f.handle);
    if (!st.is_good()) return fail(bwd ? "backward graph" : "forward graph", st.get_message());
    int64_t ws = 0;
    st = g->get_workspace_size(ws);
    if (!st.is_good()) return fail("workspace size", st.get_message());
    if (ws > f.workspace_bytes) {
        cudaFree(f.workspace);
        f.workspace = nullptr;
        f.workspace_bytes = 0;
        if (cudaMalloc(&f.workspace, (size_t)ws) != cudaSuccess) {
            cudaGetLastError();
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                            "cuDNN flash attention: out of device memory for a %.1f MiB workspace",
                            (double)ws / 1048576.0);
        }
        f.workspace_bytes = ws;
    }
    f.graphs[key] = g;
    out = g;
    return 0;
}

int flash_for(tks_backend *be, Flash **out) {
    Flash &f = g_flash[be];
    if (!f.handle) {
        cudnnStatus_t s = cudnnCreate(&f.handle);
        if (s != CUDNN_STATUS_SUCCESS) return fail("cudnnCreate", cudnnGetErrorString(s));
    }
    cudnnSetStream(f.handle, (cudaStream_t)tks_cuda_backend_stream(be));
    *out = &f;
    return 0;
}

int run(tks_backend *be, const Key &key, std::unordered_map<int64_t, void *> &ptrs) {
    std::lock_guard<std::mutex> lock(g_lock);
    Flash *f = nullptr;
    int rc = flash_for(be, &f);
    std::shared_ptr<fe::graph::Graph> g;
    if (!rc) rc = build(*f, key, g);
    if (rc) return rc;
    auto st = g->execute(f->handle, ptrs, f->workspace);
    if (!st.is_good()) return fail("execute", st.get_message());
    return 0;
}

} // namespace

extern "C" int tks_cuda_flash_fwd(tks_backend *be, uint16_t *out, float *lse, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, int B, int T, int NH,
                                  int NKV, int HD) {
    std::unordered_map<int64_t, void *> p = {{Q_UID, (void *)q},   {K_UID, (void *)k},
                                             {V_UID, (void *)v},   {O_UID, (void *)out},
                                             {STATS_UID, (void *)lse}};
    return run(be, Key{0, B, T, NH, NKV, HD}, p);
}

extern "C" int tks_cuda_flash_bwd(tks_backend *be, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  const uint16_t *dout, const uint16_t *out, const float *lse,
                                  const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                                  int T, int NH, int NKV, int HD) {
    std::unordered_map<int64_t, void *> p = {
        {Q_UID, (void *)q},     {K_UID, (void *)k},       {V_UID, (void *)v},
        {O_UID, (void *)out},   {DO_UID, (void *)dout},   {STATS_UID, (void *)lse},
        {DQ_UID, (void *)dq},   {DK_UID, (void *)dk},     {DV_UID, (void *)dv}};
    return run(be, Key{1, B, T, NH, NKV, HD}, p);
}

/* Releases the cuDNN handle, graphs and workspace of a backend (its destroy
 * calls this). */
extern "C" void tks_cuda_flash_release(tks_backend *be) {
    std::lock_guard<std::mutex> lock(g_lock);
    auto it = g_flash.find(be);
    if (it == g_flash.end()) return;
    it->second.graphs.clear();
    cudaFree(it->second.workspace);
    if (it->second.handle) cudnnDestroy(it->second.handle);
    g_flash.erase(it);
}
