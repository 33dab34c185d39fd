/* cudnn_attention.cpp - causal GQA flash attention through cuDNN's fused SDPA
 * (the cuDNN frontend's graph API, header-only C++), behind the C functions
 * of cuda_internal.h that the backend's bf16 attention ops call. The only
 * C++ in the backend.
 *
 * Layouts (backend.h): q [B,T,NH,HD] rows ldq apart, k, v [B,T,NKV,HD] rows
 * ldkv apart (views into the fused qkv row), out/dout rows ldo apart, bf16:
 * cuDNN's logical [B,H,T,HD] with strides (T*ld, HD, ld, 1); the softmax
 * statistics (natural log-sum-exp of the scaled scores, fp32) are lse[B,NH,T],
 * exactly the contract's. Graphs are built once per (direction, shape,
 * strides) and cached, and so is a refusal (the key, what failed and cuDNN's
 * reason), so that a shape cuDNN cannot run is validated and planned once,
 * not at every call before the fallback; cuDNN's scratch is the model's workspace (the backend
 * asks for the graphs' size in workspace_bytes), so no op allocates. The
 * backward is cuDNN's fast one (dQ added with atomics: not bitwise
 * reproducible), or with --deterministic its deterministic algorithm, which
 * on Hopper needs a dP workspace of T x T per head and runs slower.
 */
#include <cudnn_frontend.h>

#include <algorithm>
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
#include "trainer/cuda/cuda.h"
#include "trainer/cuda/cuda_internal.h"

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };

/* mode (0 forward, 1 fast backward, 2 deterministic backward), B, T, NH, NKV, HD, ldq, ldkv, ldo */
using Key = std::tuple<int, int, int, int, int, int, int64_t, int64_t, int64_t>;

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph; /* null: cuDNN refused the key */
    int64_t workspace = 0;
    std::string what, why;                   /* the refusal: the failed step, cuDNN's message */
};
struct Flash {
    cudnnHandle_t handle = nullptr;
    std::map<Key, Plan> graphs;
};

std::mutex g_lock;
std::map<tks_backend *, Flash> g_flash;

int fail(const char *what, const std::string &why) {
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                    "cuDNN flash attention: %s: %s; tokshard's own attention kernel runs instead "
                    "(CUDNN_FRONTEND_LOG_INFO=1 and CUDNN_FRONTEND_LOG_FILE=stderr show cuDNN's "
                    "reasons)",
                    what, why.c_str());
}

std::shared_ptr<fe::graph::Tensor_attributes> bthd(fe::graph::Graph &g, const char *name,
                                                   int64_t uid, int64_t B, int64_t T, int64_t H,
                                                   int64_t HD, int64_t ld) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, HD})
                        .set_stride({T * ld, HD, ld, 1}));
}

int build(Flash &f, const Key &key, Plan **out) {
    auto it = f.graphs.find(key);
    if (it != f.graphs.end()) {
        if (!it->second.graph) return fail(it->second.what.c_str(), it->second.why);
        *out = &it->second;
        return 0;
    }
    auto [mode, B, T, NH, NKV, HD, ldq, ldkv, ldo] = key;
    int bwd = mode != 0;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = bthd(*g, "q", Q_UID, B, T, NH, HD, ldq);
    auto k = bthd(*g, "k", K_UID, B, T, NKV, HD, ldkv);
    auto v = bthd(*g, "v", V_UID, B, T, NKV, HD, ldkv);
    float scale = 1.0f / std::sqrt((float)HD);
    if (!bwd) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("flash_fwd")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
        auto [o, stats] = g->sdpa(q, k, v, opt);
        o->set_output(true).set_uid(O_UID).set_dim({B, NH, T, HD}).set_stride({T * ldo, HD, ldo, 1});
        stats->set_output(true)
            .set_uid(STATS_UID)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({B, NH, T, 1})
            .set_stride({(int64_t)NH * T, T, 1, 1});
    } else {
        auto o = bthd(*g, "o", O_UID, B, T, NH, HD, ldo);
        auto dO = bthd(*g, "dO", DO_UID, B, T, NH, HD, ldo);
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
                       .set_deterministic_algorithm(mode == 2);
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats, opt);
        dq->set_output(true).set_uid(DQ_UID).set_dim({B, NH, T, HD}).set_stride({T * ldq, HD, ldq, 1});
        dk->set_output(true).set_uid(DK_UID).set_dim({B, NKV, T, HD}).set_stride({T * ldkv, HD, ldkv, 1});
        dv->set_output(true).set_uid(DV_UID).set_dim({B, NKV, T, HD}).set_stride({T * ldkv, HD, ldkv, 1});
    }
    auto st = g->validate();
    if (st.is_good()) st = g->build_operation_graph(f.handle);
    if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A});
    if (st.is_good()) st = g->check_support(f.handle);
    if (st.is_good()) st = g->build_plans(f.handle);
    const char *what = bwd ? "backward graph" : "forward graph";
    int64_t ws = 0;
    if (st.is_good()) {
        st = g->get_workspace_size(ws);
        if (!st.is_good()) what = "workspace size";
    }
    Plan &p = f.graphs[key];
    if (!st.is_good()) { /* kept: the next call with this key fails at once */
        p.what = what;
        p.why = st.get_message();
        return fail(what, p.why);
    }
    p.graph = g;
    p.workspace = ws;
    *out = &p;
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

int flash_plan(tks_backend *be, const Key &key, Plan **p, Flash **f) {
    int rc = flash_for(be, f);
    return rc ? rc : build(**f, key, p);
}

} // namespace

/* cuda_internal.h: the graphs' workspace (both directions) at a shape, built now */
extern "C" int tks_cudnn_attention_ws(tks_backend *be, int B, int T, int NH, int NKV, int HD,
                                      size_t ldq, size_t ldkv, size_t ldo, int deterministic,
                                      size_t *bytes) {
    std::lock_guard<std::mutex> lock(g_lock);
    Plan *pf = nullptr, *pb = nullptr;
    Flash *f = nullptr;
    int rc = flash_plan(be, Key{0, B, T, NH, NKV, HD, (int64_t)ldq, (int64_t)ldkv, (int64_t)ldo}, &pf, &f);
    if (!rc)
        rc = flash_plan(be, Key{1 + (deterministic != 0), B, T, NH, NKV, HD, (int64_t)ldq, (int64_t)ldkv,
                                (int64_t)ldo},
                        &pb, &f);
    if (rc) return rc;
    *bytes = (size_t)std::max(pf->workspace, pb->workspace);
    return 0;
}

static int run(tks_backend *be, const Key &key, std::unordered_map<int64_t, void *> &ptrs,
               void *stream, void *ws, size_t ws_bytes) {
    std::lock_guard<std::mutex> lock(g_lock);
    Plan *p = nullptr;
    Flash *f = nullptr;
    int rc = flash_plan(be, key, &p, &f);
    if (rc) return rc;
    if ((size_t)p->workspace > ws_bytes || (p->workspace > 0 && !ws))
        return fail("workspace", "the graph needs " + std::to_string(p->workspace) +
                                     " bytes, the model set " + std::to_string(ws_bytes));
    cudnnSetStream(f->handle, (cudaStream_t)stream);
    auto st = p->graph->execute(f->handle, ptrs, ws);
    if (!st.is_good()) return fail("execute", st.get_message());
    return 0;
}

extern "C" int tks_cudnn_attention_fwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *out, size_t ldo, float *lse, const void *q, size_t ldq,
                                       const void *k, const void *v, size_t ldkv, int B, int T,
                                       int NH, int NKV, int HD) {
    std::unordered_map<int64_t, void *> p = {{Q_UID, (void *)q},   {K_UID, (void *)k},
                                             {V_UID, (void *)v},   {O_UID, out},
                                             {STATS_UID, (void *)lse}};
    return run(be, Key{0, B, T, NH, NKV, HD, (int64_t)ldq, (int64_t)ldkv, (int64_t)ldo}, p, stream,
               ws, ws_bytes);
}

extern "C" int tks_cudnn_attention_bwd(tks_backend *be, void *stream, void *ws, size_t ws_bytes,
                                       void *dq, void *dk, void *dv, const void *dout,
                                       const void *out, size_t ldo, const float *lse, const void *q,
                                       size_t ldq, const void *k, const void *v, size_t ldkv, int B,
                                       int T, int NH, int NKV, int HD, int deterministic) {
    std::unordered_map<int64_t, void *> p = {
        {Q_UID, (void *)q},   {K_UID, (void *)k},     {V_UID, (void *)v},
        {O_UID, (void *)out}, {DO_UID, (void *)dout}, {STATS_UID, (void *)lse},
        {DQ_UID, dq},         {DK_UID, dk},           {DV_UID, dv}};
    return run(be, Key{1 + (deterministic != 0), B, T, NH, NKV, HD, (int64_t)ldq, (int64_t)ldkv, (int64_t)ldo},
               p, stream, ws, ws_bytes);
}

/* Releases the cuDNN handle and graphs of a backend (its destroy calls this). */
extern "C" void tks_cuda_flash_release(tks_backend *be) {
    std::lock_guard<std::mutex> lock(g_lock);
    auto it = g_flash.find(be);
    if (it == g_flash.end()) return;
    it->second.graphs.clear();
    if (it->second.handle) cudnnDestroy(it->second.handle);
    g_flash.erase(it);
}
