/*
 * attn_docs.c - tokshard-bench-attn: the CPU backend's attention (forward and
 * backward) on the documents of real training windows, with the block-causal
 * mask of --doc-mask and with the causal mask, alternately, REPS times each;
 * prints the fastest of each (the least disturbed by other load) and the
 * share of (query, key) pairs the mask keeps. A benchmark, not a test.
 *
 * usage: tokshard-bench-attn [--threads N] [--reps N] [--steps N] [--seq-len T]
 *            [--batch B] [--heads NH] [--kv-heads NKV] [--head-dim HD] NAME=DIR:W ...
 * The windows are a run's first --steps steps of --batch samples of the
 * mixture given (as tokshard-train --dataset NAME=DIR:W), at the trainer's
 * default seed and validation split. Defaults: the main job's shape
 * (samples/main.sh: T 128, B 16, 4 heads, 2 kv heads, head dim 32), 2 steps,
 * 20 repetitions, all cores.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks.h"
#include "trainer/backend.h"
#include "trainer/trainer.h"

static int die(const char *what) {
    fprintf(stderr, "tokshard-bench-attn: %s: %s\n", what, tks_last_error()->message);
    return 2;
}

/* fwd + bwd over every window, in batches of B, in seconds. */
static double time_once(tks_backend *be, float **t, const float *lse, const int32_t *doc, int B, int T,
                        int NH, int NKV, int HD, int nwin) {
    size_t lq = (size_t)NH * HD, lk = (size_t)NKV * HD;
    double t0 = omp_get_wtime();
    for (int w = 0; w + B <= nwin; w += B) {
        const int32_t *d = doc ? doc + (size_t)w * T : NULL;
        be->ops->attention_fwd(be, t[3], lq, (float *)lse, t[0], lq, t[1], t[2], lk, d, B, T, NH, NKV, HD, TKS_F32);
        be->ops->attention_bwd(be, t[4], t[5], t[6], t[7], t[3], lq, lse, t[0], lq, t[1], t[2], lk, d, B, T, NH,
                               NKV, HD, TKS_F32);
    }
    be->ops->sync(be);
    return omp_get_wtime() - t0;
}

int main(int argc, char **argv) {
    int threads = 0, reps = 20, steps = 2, T = 128, B = 16, NH = 4, NKV = 2, HD = 32;
    static tks_mix_spec mix;
    for (int i = 1; i < argc; i++) {
        int *v = !strcmp(argv[i], "--threads") ? &threads : !strcmp(argv[i], "--reps") ? &reps
               : !strcmp(argv[i], "--steps") ? &steps : !strcmp(argv[i], "--seq-len") ? &T
               : !strcmp(argv[i], "--batch") ? &B : !strcmp(argv[i], "--heads") ? &NH
               : !strcmp(argv[i], "--kv-heads") ? &NKV : !strcmp(argv[i], "--head-dim") ? &HD : NULL;
        if (v && i + 1 < argc) *v = atoi(argv[++i]);
        else if (tks_mix_add_dataset(&mix, argv[i])) return die(argv[i]);
    }
    if (!mix.named || T < 2 || B < 1 || NH < 1 || NKV < 1 || NH % NKV || HD < 2 || steps < 1 || reps < 1) {
        fprintf(stderr, "usage: tokshard-bench-attn [--threads N] [--reps N] [--steps N] [--seq-len T] "
                        "[--batch B] [--heads NH] [--kv-heads NKV] [--head-dim HD] NAME=DIR:W ...\n");
        return 2;
    }
    tks_blend bl;
    if (tks_mix_blend(&mix, (uint64_t)B, &bl)) return die("mixture");
    tks_dataset *ds[TKS_MIX_MAX_SOURCES] = {0};
    tks_sampler *sm[TKS_MIX_MAX_SOURCES] = {0};
    for (uint32_t k = 0; k < mix.n_sources; k++) {
        tks_token_range tr, va;
        if (tks_dataset_open(mix.sources[k].dir, &ds[k]) ||
            tks_split_tokens(tks_dataset_n_tokens(ds[k]), TKS_DEFAULT_VAL_TOKENS, (uint32_t)T, &tr, &va) ||
            tks_sampler_create(ds[k], tr.begin, tr.end, (uint32_t)T,
                               tks_source_seed(TKS_DEFAULT_SEED, mix.sources[k].name), &sm[k]))
            return die(mix.sources[k].dir);
    }
    int nwin = steps * B;
    int32_t *doc = malloc((size_t)nwin * T * sizeof *doc);
    tks_blend_state st = {0};
    double kept = 0, all = 0;
    for (int w = 0; w < nwin; w++) {
        tks_blend_pick pk = tks_blend_next(&bl, &st);
        if (tks_sampler_doc_starts(sm[pk.source], tks_sampler_window(sm[pk.source], pk.index),
                                   doc + (size_t)w * T))
            return die("document starts");
        for (int t = 0; t < T; t++) kept += t - doc[(size_t)w * T + t] + 1, all += t + 1;
    }
    tks_backend *be = tks_cpu_backend_create(threads);
    if (!be) return die("cpu backend");
    tks_ws_shape ws = {.B = B, .T = T, .C = NH * HD, .NH = NH, .NKV = NKV, .HD = HD, .F = 64, .V = 64,
                       .Tcache = T, .dt = TKS_F32};
    size_t wsb = be->ops->workspace_bytes(be, &ws);
    void *wsp = be->ops->alloc(be, wsb);
    be->ops->set_workspace(be, wsp, wsb);
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD;
    size_t n[8] = {nq, nk, nk, nq, nq, nk, nk, nq}; /* q k v out dq dk dv dout */
    float *t[8], *lse = be->ops->alloc(be, (size_t)B * NH * T * sizeof(float));
    uint64_t z = 12345;
    for (int i = 0; i < 8; i++) {
        float *h = malloc(n[i] * sizeof *h);
        for (size_t j = 0; j < n[i]; j++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            h[j] = (float)((double)(z >> 11) / 9007199254740992.0 - 0.5);
        }
        t[i] = be->ops->alloc(be, n[i] * sizeof(float));
        be->ops->upload(be, t[i], h, n[i] * sizeof(float));
        free(h);
    }
    double best[2] = {INFINITY, INFINITY};
    time_once(be, t, lse, NULL, B, T, NH, NKV, HD, nwin); /* warm up */
    for (int r = 0; r < reps; r++)
        for (int m = 0; m < 2; m++) {
            double s = time_once(be, t, lse, m ? doc : NULL, B, T, NH, NKV, HD, nwin);
            if (s < best[m]) best[m] = s;
        }
    if (be->ops->sync(be)) return die("attention");
    printf("attention fwd+bwd, %d windows of %d tokens (B %d, NH %d, NKV %d, HD %d), %d thread(s), best of %d:\n"
           "  causal        %.3f ms per batch of %d windows (one layer)\n  --doc-mask    %.3f ms (%.2fx "
           "faster); the mask keeps %.3f of the causal pairs\n", nwin, T, B, NH, NKV, HD,
           threads ? threads : omp_get_max_threads(), reps, 1e3 * best[0] / steps, B, 1e3 * best[1] / steps,
           best[0] / best[1], kept / all);
    for (int i = 0; i < 8; i++) be->ops->free(be, t[i]);
    be->ops->free(be, lse);
    be->ops->free(be, wsp);
    be->ops->destroy(be);
    for (uint32_t k = 0; k < mix.n_sources; k++) tks_sampler_free(sm[k]), tks_dataset_close(ds[k]);
    free(doc);
    return 0;
}
