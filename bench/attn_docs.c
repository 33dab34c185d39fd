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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer.h"

static int die(const char *what) {
    fprintf(stderr, "tokshard-bench-attn: %s: %s\n", what, tks_last_error()->message);
    return 2;
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
    if (!mix.named || T < 2 || B < 1 || steps < 1) {
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
    /* the documents of the run's first steps' windows, as the trainer reads them */
    int nwin = steps * B;
    int32_t *doc = malloc((size_t)nwin * T * sizeof *doc);
    tks_blend_state st = {0};
    for (int w = 0; doc && w < nwin; w++) {
        tks_blend_pick pk = tks_blend_next(&bl, &st);
        if (tks_sampler_doc_starts(sm[pk.source], tks_sampler_window(sm[pk.source], pk.index),
                                   doc + (size_t)w * T))
            return die("document starts");
    }
    tks_attention_bench_opts o = {threads, B, T, NH, NKV, HD, reps, nwin, doc};
    tks_attention_bench_result r;
    if (!doc || tks_attention_bench(&o, &r)) return die("attention");
    char th[16] = "all";
    if (threads) snprintf(th, sizeof th, "%d", threads);
    printf("attention fwd+bwd, %d windows of %d tokens (B %d, NH %d, NKV %d, HD %d), %s threads, best of %d:\n"
           "  causal        %.3f ms per batch of %d windows (one layer)\n  --doc-mask    %.3f ms (%.2fx "
           "faster); the mask keeps %.3f of the causal pairs\n", nwin, T, B, NH, NKV, HD,
           th, reps, 1e3 * r.causal_s / steps, B,
           1e3 * r.doc_mask_s / steps, r.causal_s / r.doc_mask_s, r.pairs_kept);
    for (uint32_t k = 0; k < mix.n_sources; k++) tks_sampler_free(sm[k]), tks_dataset_close(ds[k]);
    free(doc);
    return 0;
}
