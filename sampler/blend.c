/* blend.c - the blended sample sequence of a mixture: which source each
 * global sample comes from (docs/SAMPLING.md §9). Pure integer arithmetic
 * on a few numbers per source, so every rank, every layout, a resumed run
 * and python/tokshard/sampler.py compute the same picks. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sampler/sampler.h"

typedef unsigned long long ull;

static const char *src_name(const char *const *names, uint32_t k, char *buf, size_t cap) {
    if (names && names[k]) return names[k];
    snprintf(buf, cap, "source %u", k);
    return buf;
}

int tks_blend_init(tks_blend *b, uint32_t n_sources, uint32_t n_phases, const uint64_t *start,
                   const double *weights, const char *const *names) {
    char nb[32];
    if (!b || !start || !weights || n_sources == 0 || n_sources > TKS_BLEND_MAX_SOURCES ||
        n_phases == 0 || n_phases > TKS_BLEND_MAX_PHASES)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "a blend of %u sources in %u phases: give 1..%d sources and 1..%d phases",
                        n_sources, n_phases, TKS_BLEND_MAX_SOURCES, TKS_BLEND_MAX_PHASES);
    memset(b, 0, sizeof *b);
    b->n_sources = n_sources;
    b->n_phases = n_phases;
    for (uint32_t p = 0; p < n_phases; p++) {
        if (p == 0 ? start[0] != 0 : start[p] <= start[p - 1])
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "blend phase %u starts at sample %llu: phases must start at 0 and "
                            "increase", p, (ull)start[p]);
        b->start[p] = start[p];
        const double *w = weights + (size_t)p * n_sources;
        double total = 0;
        for (uint32_t k = 0; k < n_sources; k++) {
            if (!isfinite(w[k]) || w[k] < 0)
                return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                                "%s: weight %g in blend phase %u is not a finite number >= 0",
                                src_name(names, k, nb, sizeof nb), w[k], p);
            total += w[k]; /* in source order: the sum the spec fixes */
        }
        if (!(total > 0) || !isfinite(total))
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "blend phase %u draws from no source (its weights sum to %g): give "
                            "at least one source a positive weight", p, total);
        for (uint32_t k = 0; k < n_sources; k++) {
            if (w[k] == 0) continue;
            double f = floor(ldexp(w[k] / total, 32));
            if (f < 1)
                return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                                "%s: weight %g is below 2^-32 of the phase's total %g (phase %u): "
                                "it would never be drawn; raise it or leave the source out",
                                src_name(names, k, nb, sizeof nb), w[k], total, p);
            b->W[p][k] = (uint64_t)f;
            b->S[p] += b->W[p][k];
        }
    }
    return 0;
}

/* The phase holding global sample n: the last p with start[p] <= n. */
static uint32_t phase_of(const tks_blend *b, uint64_t n) {
    uint32_t lo = 0, hi = b->n_phases;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (b->start[mid] <= n) lo = mid; else hi = mid;
    }
    return lo;
}

tks_blend_pick tks_blend_next(const tks_blend *b, tks_blend_state *st) {
    const uint64_t n = st->sample;
    const uint32_t p = phase_of(b, n);
    if (n == b->start[p]) memset(st->phase_count, 0, sizeof st->phase_count); /* the phase begins */
    const unsigned __int128 j1 = (unsigned __int128)(n - b->start[p]) + 1;
    uint32_t best = 0;
    __int128 best_d = 0;
    int have = 0;
    for (uint32_t k = 0; k < b->n_sources; k++) {
        if (!b->W[p][k]) continue;
        /* W (j + 1) - S c: W < 2^33, j + 1 <= 2^64, S c <= 2^33 * 2^64: fits in 128 bits */
        __int128 d = (__int128)(b->W[p][k] * j1) - (__int128)((unsigned __int128)b->S[p] * st->phase_count[k]);
        if (!have || d > best_d) best = k, best_d = d, have = 1;
    }
    tks_blend_pick pk = {best, st->count[best]};
    st->count[best]++;
    st->phase_count[best]++;
    st->sample++;
    return pk;
}

void tks_blend_seek(const tks_blend *b, tks_blend_state *st, uint64_t sample) {
    while (st->sample < sample) (void)tks_blend_next(b, st);
}

int tks_blend_picks(const tks_blend *b, const tks_blend_state *from, uint64_t first, uint64_t n,
                    tks_blend_pick *out) {
    if (first < from->sample)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "blend: samples from %llu asked of a state at %llu (a state can only go "
                        "forward)", (ull)first, (ull)from->sample);
    tks_blend_state st = *from;
    tks_blend_seek(b, &st, first);
    for (uint64_t i = 0; i < n; i++) out[i] = tks_blend_next(b, &st);
    return 0;
}
