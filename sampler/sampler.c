/* sampler.c - training windows, the per-epoch keyed permutation and the
 * rank slices of each step. Specification: docs/SAMPLING.md. */
#include "sampler/internal.h"
#include "common/tks_bits.h"

#include <stdlib.h>
#include <string.h>

#define PERM_ROUNDS 6

typedef unsigned long long ull; /* for printf */



uint64_t tks_epoch_key(uint64_t seed, uint64_t epoch) {
    return tks_mix64(tks_mix64(seed) + TKS_GOLDEN64 * (epoch + 1));
}

uint64_t tks_source_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, 64 bits */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return seed ^ h;
}

uint64_t tks_perm_index(uint64_t i, uint64_t n, uint64_t key) {
    if (i >= n) return UINT64_MAX;
    if (n == 1) return 0;
    /* k = smallest even number >= 2 with 2^k >= n; bits(n - 1) = ceil(log2 n) */
    unsigned k = 64u - (unsigned)__builtin_clzll(n - 1);
    k += k & 1u;
    if (k < 2) k = 2;
    const unsigned h = k / 2; /* 1..32 */
    const uint64_t mask = (UINT64_C(1) << h) - 1;
    uint64_t rk[PERM_ROUNDS];
    for (int r = 0; r < PERM_ROUNDS; r++) rk[r] = tks_mix64(key + TKS_GOLDEN64 * (uint64_t)(r + 1));
    /* Cycle walking (Black & Rogaway 2002): the Feistel network permutes
     * [0, 2^k); following i's cycle to the first value < n permutes [0, n).
     * 2^k < 4n, so fewer than 4 evaluations on average. */
    uint64_t v = i;
    do {
        uint64_t l = v >> h, r = v & mask;
        for (int j = 0; j < PERM_ROUNDS; j++) {
            uint64_t t = l ^ (tks_mix64(r ^ rk[j]) >> (64 - h));
            l = r;
            r = t;
        }
        v = (l << h) | r;
    } while (v >= n);
    return v;
}

int tks_split_tokens(uint64_t n_tokens, uint64_t val_tokens, uint32_t seq_len,
                     tks_token_range *train, tks_token_range *val) {
    if (!train || !val) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "split: NULL output");
    if (seq_len == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "seq_len is 0: a window needs seq_len >= 1 (seq_len + 1 tokens)");
    const uint64_t win = (uint64_t)seq_len + 1;
    uint64_t v = 0;
    if (val_tokens > 0) {
        if (val_tokens < win)
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "val_tokens %llu holds no validation window of seq_len + 1 = %llu tokens: "
                            "ask for at least %llu validation tokens, or 0 for none",
                            (ull)val_tokens, (ull)win, (ull)win);
        v = (val_tokens - 1) / seq_len * seq_len + 1; /* whole windows, rounded down */
    }
    if (v > n_tokens || n_tokens - v < win) {
        if (v == 0)
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "the dataset has %llu tokens, fewer than one window of seq_len + 1 = %llu: "
                            "use a seq_len below %llu or more data",
                            (ull)n_tokens, (ull)win, (ull)(n_tokens ? n_tokens : 1));
        const uint64_t left = v > n_tokens ? 0 : n_tokens - v;
        if (n_tokens >= 2 * win)
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "the dataset has %llu tokens; holding out %llu validation tokens "
                            "(val_tokens %llu rounded down to whole windows of seq_len %u) leaves "
                            "%llu for training, fewer than one window of %llu: lower val_tokens to "
                            "at most %llu, use a smaller seq_len, or use a separate validation dataset",
                            (ull)n_tokens, (ull)v, (ull)val_tokens, seq_len, (ull)left, (ull)win,
                            (ull)(n_tokens - win));
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the dataset has %llu tokens, too few for one training and one validation "
                        "window of seq_len + 1 = %llu tokens each: set val_tokens to 0 and use a "
                        "separate validation dataset, use a smaller seq_len, or use more data",
                        (ull)n_tokens, (ull)win);
    }
    train->begin = 0;
    train->end = n_tokens - v;
    val->begin = n_tokens - v;
    val->end = n_tokens;
    return 0;
}

int tks_sampler_create(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                       uint32_t seq_len, uint64_t seed, tks_sampler **out) {
    if (!out || !ds) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "sampler: NULL argument");
    *out = NULL;
    const char *dir = tks_dataset_dir(ds);
    const uint64_t total = tks_dataset_n_tokens(ds);
    if (seq_len == 0)
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE,
                        "seq_len is 0: a window needs seq_len >= 1 (seq_len + 1 tokens)");
    if (token_begin > token_end || token_end > total)
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE,
                        "%s: token range [%llu, %llu) is not inside the dataset's %llu tokens",
                        dir, (ull)token_begin, (ull)token_end, (ull)total);
    const uint64_t n_tok = token_end - token_begin, win = (uint64_t)seq_len + 1;
    if (n_tok < win)
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE,
                        "%s: token range [%llu, %llu) holds %llu tokens, fewer than one window of "
                        "seq_len + 1 = %llu: use a seq_len below %llu, a larger range (less "
                        "validation data) or a larger dataset",
                        dir, (ull)token_begin, (ull)token_end, (ull)n_tok, (ull)win,
                        (ull)(n_tok ? n_tok : 1));
    tks_sampler *s = calloc(1, sizeof *s);
    size_t ns = tks_dataset_n_shards(ds);
    if (s) s->cum = malloc((ns + 1) * sizeof *s->cum);
    if (!s || !s->cum) {
        free(s);
        return tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory creating a sampler");
    }
    /* windows are read in permuted order: no read-ahead past them */
    tks_dataset_advise(ds, TKS_ACCESS_RANDOM);
    s->ds = ds;
    s->begin = token_begin;
    s->end = token_end;
    s->seq_len = seq_len;
    s->seed = seed;
    s->n_windows = (n_tok - 1) / seq_len;
    s->n_shards = ns;
    s->cum[0] = 0;
    for (size_t i = 0; i < ns; i++)
        s->cum[i + 1] = s->cum[i] + tks_shard_hdr(tks_dataset_shard(ds, i))->n_tokens;
    if (s->cum[ns] != total) { /* the dataset's total disagrees with its shards */
        uint64_t sum = s->cum[ns];
        tks_sampler_free(s);
        return tks_fail(TKS_ERR_MANIFEST, dir, TKS_NONE, TKS_NONE,
                        "%s: shards hold %llu tokens but the dataset reports %llu", dir,
                        (ull)sum, (ull)total);
    }
    *out = s;
    return 0;
}

void tks_sampler_free(tks_sampler *s) {
    if (!s) return;
    tks__pack_free(s->pack);
    free(s->cum);
    free(s);
}

int tks_sampler_create_packed(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                              uint32_t seq_len, uint64_t seed, tks_packing packing, int threads,
                              tks_sampler **out) {
    if (packing != TKS_PACK_CONCAT && packing != TKS_PACK_BEST_FIT)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "unknown packing %d", (int)packing);
    int rc = tks_sampler_create(ds, token_begin, token_end, seq_len, seed, out);
    if (rc || packing == TKS_PACK_CONCAT) return rc;
    if ((rc = tks__pack_plan(*out, threads, NULL, NULL))) {
        tks_sampler_free(*out);
        *out = NULL;
    }
    return rc;
}

int tks_sampler_create_planned(const tks_dataset *ds, uint64_t token_begin, uint64_t token_end,
                               uint32_t seq_len, uint64_t seed, int threads, const char *plan_dir,
                               const tks_pack_world *world, tks_sampler **out) {
    const tks_pack_world *W = world && world->size > 1 ? world : NULL;
    if (!plan_dir) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "planned sampler: no plan directory");
    int rc = tks_sampler_create(ds, token_begin, token_end, seq_len, seed, out);
    /* the ranks learn of a failure here before the planning's collectives */
    if (W) rc = W->agree(rc, W->ctx);
    if (rc) {
        tks_sampler_free(*out);
        *out = NULL;
        return rc;
    }
    if ((rc = tks__pack_plan(*out, threads, plan_dir, W))) {
        tks_sampler_free(*out);
        *out = NULL;
    }
    return rc;
}

const char *tks_sampler_plan_path(const tks_sampler *s) { return s->pack ? tks__pack_path(s->pack) : NULL; }

tks_packing tks_sampler_packing(const tks_sampler *s) { return s->pack ? TKS_PACK_BEST_FIT : TKS_PACK_CONCAT; }

const char *tks_packing_name(tks_packing p) { return p == TKS_PACK_BEST_FIT ? "best-fit" : "concat"; }

uint64_t tks_sampler_n_windows(const tks_sampler *s) { return s->n_windows; }
uint32_t tks_sampler_seq_len(const tks_sampler *s) { return s->seq_len; }
uint64_t tks_sampler_seed(const tks_sampler *s) { return s->seed; }
tks_token_range tks_sampler_range(const tks_sampler *s) { return (tks_token_range){s->begin, s->end}; }
const tks_dataset *tks_sampler_dataset(const tks_sampler *s) { return s->ds; }

uint64_t tks_sampler_window(const tks_sampler *s, uint64_t g) {
    const uint64_t n = s->n_windows;
    return tks_perm_index(g % n, n, tks_epoch_key(s->seed, g / n));
}


static int bad_window(const tks_sampler *s, uint64_t window) {
    return tks_fail(TKS_ERR_ARG, tks_dataset_dir(s->ds), TKS_NONE, TKS_NONE,
                    "window %llu is out of range: the sampler has %llu windows", (ull)window,
                    (ull)s->n_windows);
}

int tks_sampler_locate(const tks_sampler *s, uint64_t window, tks_sample_loc *loc) {
    if (window >= s->n_windows) return bad_window(s, window);
    if (s->pack) return tks__pack_locate(s, window, loc);
    memset(loc, 0, sizeof *loc);
    loc->window = window;
    loc->token_begin = s->begin + window * s->seq_len;
    loc->n_tokens = (uint64_t)s->seq_len + 1;
    uint64_t t = loc->token_begin, left = loc->n_tokens;
    for (size_t i = tks__shard_of(s, t); left > 0; i++) {
        uint64_t take = s->cum[i + 1] - t < left ? s->cum[i + 1] - t : left;
        if (take == 0) continue; /* an empty shard (not produced by the writer) */
        if (loc->n_pieces < TKS_SAMPLE_MAX_PIECES)
            loc->pieces[loc->n_pieces++] = (tks_sample_piece){(uint32_t)i, t - s->cum[i], take};
        loc->n_pieces_total++;
        t += take;
        left -= take;
    }
    return 0;
}

uint64_t tks_sampler_window_real(const tks_sampler *s, uint64_t window) {
    return s->pack ? tks__pack_real(s, window) : (uint64_t)s->seq_len + 1;
}

int tks_sampler_pieces(const tks_sampler *s, uint64_t window, tks_sample_piece *out, size_t cap, size_t *n) {
    if (window >= s->n_windows) return bad_window(s, window);
    if (!out || !n) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "sampler pieces: NULL argument");
    if (s->pack) return tks__pack_pieces(s, window, out, cap, n);
    uint64_t t = s->begin + window * s->seq_len, left = (uint64_t)s->seq_len + 1;
    *n = 0;
    for (size_t i = tks__shard_of(s, t); left > 0; i++) {
        uint64_t take = s->cum[i + 1] - t < left ? s->cum[i + 1] - t : left;
        if (take == 0) continue;
        if (*n < cap) out[*n] = (tks_sample_piece){(uint32_t)i, t - s->cum[i], take};
        (*n)++;
        t += take;
        left -= take;
    }
    return 0;
}

int tks_sampler_read(const tks_sampler *s, uint64_t window, uint32_t model_vocab,
                     uint32_t *tokens) {
    return tks_sampler_read_window(s, window, model_vocab, tokens, NULL);
}

int tks_sampler_read_window(const tks_sampler *s, uint64_t window, uint32_t model_vocab,
                            uint32_t *tokens, uint64_t *n_real) {
    if (window >= s->n_windows) return bad_window(s, window);
    if (!tokens) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "sampler read: NULL tokens");
    if (s->pack) return tks__pack_read(s, window, model_vocab, tokens, n_real);
    if (n_real) *n_real = (uint64_t)s->seq_len + 1;
    const uint64_t first = s->begin + window * s->seq_len;
    uint64_t t = first, left = (uint64_t)s->seq_len + 1;
    uint32_t *out = tokens;
    for (size_t i = tks__shard_of(s, t); left > 0; i++) {
        uint64_t take = s->cum[i + 1] - t < left ? s->cum[i + 1] - t : left;
        if (take == 0) continue;
        int rc = tks_shard_read(tks_dataset_shard(s->ds, i), t - s->cum[i], take, model_vocab, out);
        if (rc) {
            /* Keep the reader's context (file, shard, offset, document) and
             * add the window, at the end so the fix in the message survives. */
            tks_error e = *tks_last_error();
            tks_fail(e.code, e.file, e.shard, e.offset, "%s (in training window %llu: global tokens "
                     "[%llu, %llu))", e.message, (ull)window, (ull)first,
                     (ull)(first + s->seq_len + 1));
            tks_error_set_doc(e.doc, e.line);
            return rc;
        }
        out += take;
        t += take;
        left -= take;
    }
    return 0;
}

int tks_sampler_doc_starts(const tks_sampler *s, uint64_t window, int32_t *doc) {
    if (window >= s->n_windows) return bad_window(s, window);
    if (!doc) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "sampler doc starts: NULL doc");
    if (s->pack) return tks__pack_doc_starts(s, window, doc);
    const uint64_t first = s->begin + window * s->seq_len;
    uint64_t t = first, left = s->seq_len; /* the inputs: the last token is a target only */
    for (size_t i = tks__shard_of(s, t); left > 0; i++) {
        uint64_t take = s->cum[i + 1] - t < left ? s->cum[i + 1] - t : left;
        if (take == 0) continue;
        const tks_shard *sh = tks_dataset_shard(s->ds, i);
        const uint64_t *idx = tks_shard_doc_index(sh), nd = tks_shard_hdr(sh)->n_docs;
        uint64_t o = t - s->cum[i], lo = 0, hi = nd; /* the document holding o: idx[lo] <= o < idx[lo + 1] */
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (idx[mid] <= o) lo = mid; else hi = mid;
        }
        for (uint64_t e = o + take; o < e; o++, t++) {
            while (lo + 1 < nd && idx[lo + 1] <= o) lo++;
            uint64_t start = s->cum[i] + idx[lo]; /* global offset of the document's first token */
            doc[t - first] = start > first ? (int32_t)(start - first) : 0;
        }
        left -= take;
    }
    return 0;
}

/* Largest divisor of x below d and smallest above d, searched a bounded
 * distance; 0 when none was found. */
static void near_divisors(uint64_t x, uint64_t d, uint64_t *below, uint64_t *above) {
    *below = *above = 0;
    for (uint64_t c = d - 1, k = 0; c >= 1 && k < 100000; c--, k++)
        if (x % c == 0) { *below = c; break; }
    for (uint64_t c = d + 1, k = 0; c <= x && k < 100000; c++, k++)
        if (x % c == 0) { *above = c; break; }
}

int tks_batch_check(uint64_t global_batch, uint32_t dp, uint64_t micro_batch, uint64_t *per_rank,
                    uint64_t *n_micro) {
    if (global_batch == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "global batch is 0 samples: give a global batch >= 1");
    if (dp == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "data-parallel degree is 0: give dp >= 1");
    if (global_batch % dp) {
        uint64_t lo = global_batch / dp * dp, hi = lo + dp;
        if (lo == 0)
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "global batch %llu is not divisible by dp %u (each data-parallel rank "
                            "must read the same number of samples): use a global batch of %llu "
                            "(a multiple of %u) or a dp that divides %llu",
                            (ull)global_batch, dp, (ull)hi, dp, (ull)global_batch);
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "global batch %llu is not divisible by dp %u (each data-parallel rank must "
                        "read the same number of samples): use a global batch that is a multiple "
                        "of %u (%llu or %llu) or a dp that divides %llu",
                        (ull)global_batch, dp, dp, (ull)lo, (ull)hi, (ull)global_batch);
    }
    const uint64_t pr = global_batch / dp;
    const uint64_t m = micro_batch ? micro_batch : pr;
    if (m > pr)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "micro-batch %llu is larger than the per-rank batch %llu (global batch %llu "
                        "/ dp %u): use a micro-batch that divides %llu",
                        (ull)m, (ull)pr, (ull)global_batch, dp, (ull)pr);
    if (pr % m) {
        uint64_t lo, hi;
        near_divisors(pr, m, &lo, &hi);
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the per-rank batch %llu (global batch %llu / dp %u) is not divisible by "
                        "micro-batch %llu: use a micro-batch that divides %llu (%llu or %llu)",
                        (ull)pr, (ull)global_batch, dp, (ull)m, (ull)pr, (ull)(lo ? lo : 1),
                        (ull)(hi ? hi : pr));
    }
    if (per_rank) *per_rank = pr;
    if (n_micro) *n_micro = pr / m;
    return 0;
}

int tks_sampler_rank_slice_at(uint64_t cursor, uint64_t global_batch, uint32_t dp,
                              uint32_t dp_rank, uint64_t *first_global_sample, uint64_t *count) {
    uint64_t pr = 0; /* set by tks_batch_check when it returns 0 */
    int rc = tks_batch_check(global_batch, dp, 0, &pr, NULL);
    if (rc) return rc;
    if (dp_rank >= dp)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "data-parallel rank %u is out of range: dp is %u (ranks 0..%u)", dp_rank,
                        dp, dp - 1);
    if (cursor > UINT64_MAX - global_batch)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "cursor %llu plus a global batch of %llu overflows 64 bits", (ull)cursor,
                        (ull)global_batch);
    *first_global_sample = cursor + (uint64_t)dp_rank * pr;
    *count = pr;
    return 0;
}

int tks_sampler_rank_slice(uint64_t step, uint64_t global_batch, uint32_t dp, uint32_t dp_rank,
                           uint64_t *first_global_sample, uint64_t *count) {
    if (global_batch && step > UINT64_MAX / global_batch)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "step %llu times a global batch of %llu overflows 64 bits", (ull)step,
                        (ull)global_batch);
    return tks_sampler_rank_slice_at(step * global_batch, global_batch, dp, dp_rank,
                                     first_global_sample, count);
}

int tks_sampler_micro_slice(uint64_t rank_first, uint64_t rank_count, uint64_t micro_batch,
                            uint64_t micro, uint64_t *first_global_sample, uint64_t *count) {
    if (micro_batch == 0 || rank_count % micro_batch)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "a rank's %llu samples cannot be split into micro-batches of %llu: use a "
                        "micro-batch that divides %llu",
                        (ull)rank_count, (ull)micro_batch, (ull)rank_count);
    if (micro >= rank_count / micro_batch)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "micro-batch %llu is out of range: a rank has %llu micro-batches per step",
                        (ull)micro, (ull)(rank_count / micro_batch));
    *first_global_sample = rank_first + micro * micro_batch;
    *count = micro_batch;
    return 0;
}
