/* pack.c - windows of whole documents: best-fit decreasing packing of a token
 * range's documents into bins of seq_len + 1 tokens (docs/SAMPLING.md §10).
 *
 * Groups. The range [begin, end) is cut into groups of G = TKS_PACK_GROUP_WINDOWS
 * x (seq_len + 1) tokens; group k holds the documents whose first token lies
 * in [begin + kG, begin + (k+1)G) (a document is all in the group where it
 * starts; the range's ends clip the documents they cut). Documents are the
 * shards' own (their indexes; a shard boundary is one too), never token ids.
 *
 * Items. A document of n <= C = seq_len + 1 tokens is one item. A longer one is
 * cut as concat cuts the stream: pieces of C tokens starting at 0, L, 2L, ...
 * (L = seq_len: consecutive pieces share one token, so every next-token pair
 * of the document is a target once) while they fit, then the rest from the
 * next multiple of L when it holds at least 2 tokens (one target), packed as
 * an item like any document.
 *
 * Best-fit decreasing (Johnson 1973; Ding et al., "Fewer Truncations Improve
 * Language Modeling", ICML 2024): the group's items by length, longest first
 * (ties: stream order), each into the open bin with the least room that still
 * holds it (ties: the bin that reached that room last), else into a new bin.
 * A bin's documents are read in stream order; the bin's unfilled positions
 * are padding.
 *
 * Windows. Group k's bins are windows first[k] .. first[k+1] - 1 in the
 * order they were opened; the epoch permutation (§4) runs over all windows as
 * for concat. The plan (every group packed once, on any number of threads:
 * a group's packing does not depend on the thread) keeps each window's items:
 * 12 bytes per item and 8 per window, so reading a window costs O(its items).
 * It is a pure function of the dataset, the range and seq_len: every rank
 * and thread gets the same windows. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/internal.h"

typedef unsigned long long ull; /* for printf */

struct tks__pack {
    uint64_t group_tokens;  /* G */
    uint64_t n_groups;
    uint64_t *first;        /* (n_groups + 1): group k's first window */
    uint64_t *win;          /* (n_windows + 1): window w's items are [win[w], win[w+1]) */
    uint64_t *begin;        /* per item, by window then stream order: its first global token */
    uint32_t *len;          /* and its tokens */
    tks_pack_stats stats;
};

/* One item: a document (or a piece of one), and the bin it went to. */
typedef struct item {
    uint64_t begin;         /* global token offset */
    uint32_t len;           /* tokens, 1..C */
    uint32_t bin;
} item;

/* The packing of one group (reused across groups by one thread). */
typedef struct work {
    item *it;
    size_t n, cap;
    uint32_t n_bins;
    uint64_t docs, split;   /* documents of the group, and those cut into pieces */
    /* best fit: bins by room, a stack per room (head[r], next[bin]), and a
     * segment tree counting the bins of each room, to find the least room
     * >= a length in O(log C) */
    int32_t *head, *next;
    size_t next_cap;
    uint32_t *tree;         /* 2P nodes over rooms 0..P-1, P >= C + 1 */
    uint32_t P;
} work;

static void work_free(work *w) {
    free(w->it);
    free(w->head);
    free(w->next);
    free(w->tree);
    memset(w, 0, sizeof *w);
}

static int push_item(work *w, uint64_t begin, uint64_t len) {
    if (w->n == w->cap) {
        size_t c = w->cap ? 2 * w->cap : 1024;
        item *p = realloc(w->it, c * sizeof *p);
        if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
        w->it = p;
        w->cap = c;
    }
    w->it[w->n++] = (item){begin, (uint32_t)len, 0};
    return 0;
}

/* The first document start at or after x (x < end): begin, a shard's first
 * token, or a document start from a shard's index; end when none is left. */
static uint64_t doc_start_from(const tks_sampler *s, uint64_t x) {
    if (x <= s->begin) return s->begin;
    if (x >= s->end) return s->end;
    size_t i = tks__shard_of(s, x);
    const tks_shard *sh = tks_dataset_shard(s->ds, i);
    const uint64_t *idx = tks_shard_doc_index(sh), nd = tks_shard_hdr(sh)->n_docs, o = x - s->cum[i];
    uint64_t lo = 0, hi = nd; /* the first idx[j] >= o, j in [0, nd]; idx[nd] = the shard's tokens */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < o) lo = mid + 1; else hi = mid;
    }
    uint64_t t = s->cum[i] + idx[lo];
    return t < s->end ? t : s->end;
}

/* The items of the documents of the token interval [a, b): each document
 * whose first token lies there, cut as the header says. */
static int group_items(const tks_sampler *s, uint64_t a, uint64_t b, work *w) {
    const uint64_t C = (uint64_t)s->seq_len + 1, L = s->seq_len;
    w->n = 0;
    w->docs = w->split = 0;
    for (uint64_t t = doc_start_from(s, a); t < b && t < s->end;) {
        uint64_t e = doc_start_from(s, t + 1), n = e - t;
        w->docs++;
        int rc = 0;
        if (n <= C) {
            rc = push_item(w, t, n);
        } else {
            w->split++;
            uint64_t k = 0;
            for (; k * L + C <= n && !rc; k++) rc = push_item(w, t + k * L, C);
            if (!rc && n - k * L >= 2) rc = push_item(w, t + k * L, n - k * L);
        }
        if (rc) return rc;
        t = e;
    }
    return 0;
}

static int by_length(const void *x, const void *y) {
    const item *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

/* Segment tree: add d to the count of room r. */
static void tree_add(work *w, uint32_t r, int d) {
    for (uint32_t i = r + w->P; i >= 1; i /= 2) w->tree[i] = (uint32_t)((int)w->tree[i] + d);
}

/* The least room >= len with a bin, or UINT32_MAX. */
static uint32_t tree_find(const work *w, uint32_t len) {
    /* walk up from leaf len to a node whose right part (after the path)
     * holds a count, then down to its leftmost counted leaf */
    uint32_t i = len + w->P;
    if (w->tree[i]) return len;
    while (i > 1) {
        if (!(i & 1) && w->tree[i + 1]) {
            i++;
            while (i < w->P) i = w->tree[2 * i] ? 2 * i : 2 * i + 1;
            return i - w->P;
        }
        i /= 2;
    }
    return UINT32_MAX;
}

/* Best-fit decreasing of the group's items into bins of C tokens. */
static int best_fit(work *w, uint32_t C) {
    if (w->P < C + 1) {
        uint32_t P = 1;
        while (P < C + 1) P *= 2;
        free(w->head);
        free(w->tree);
        w->head = malloc(P * sizeof *w->head);
        w->tree = malloc(2 * (size_t)P * sizeof *w->tree);
        if (!w->head || !w->tree) {
            w->P = 0;
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
        }
        w->P = P;
    }
    if (w->next_cap < w->n) {
        int32_t *nx = realloc(w->next, w->n * sizeof *nx);
        if (!nx) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
        w->next = nx;
        w->next_cap = w->n;
    }
    memset(w->tree, 0, 2 * (size_t)w->P * sizeof *w->tree);
    for (uint32_t r = 0; r < w->P; r++) w->head[r] = -1;
    qsort(w->it, w->n, sizeof *w->it, by_length);
    uint32_t bins = 0;
    for (size_t k = 0; k < w->n; k++) {
        uint32_t len = w->it[k].len, r = tree_find(w, len), b;
        if (r == UINT32_MAX) { /* a new bin */
            b = bins++;
            r = C;
        } else { /* take the bin on top of room r's stack */
            b = (uint32_t)w->head[r];
            w->head[r] = w->next[b];
            tree_add(w, r, -1);
        }
        w->it[k].bin = b;
        uint32_t left = r - len;
        if (left > 0) {
            w->next[b] = w->head[left];
            w->head[left] = (int32_t)b;
            tree_add(w, left, +1);
        }
    }
    w->n_bins = bins;
    return 0;
}

/* Packs group g into w. */
static int pack_group(const tks_sampler *s, const tks__pack *p, uint64_t g, work *w) {
    uint64_t a = s->begin + g * p->group_tokens;
    uint64_t b = p->group_tokens > s->end - a ? s->end : a + p->group_tokens;
    int rc = group_items(s, a, b, w);
    return rc ? rc : best_fit(w, s->seq_len + 1);
}

static int by_bin(const void *x, const void *y) {
    const item *a = x, *b = y;
    if (a->bin != b->bin) return a->bin < b->bin ? -1 : 1;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

/* One group's packing, kept until the plan is assembled. */
typedef struct packed {
    item *it;               /* by bin, then stream order */
    size_t n;
    uint32_t n_bins;
} packed;

/* Window offsets and items from the groups' packings, in group order. */
static int assemble(tks__pack *p, packed *g) {
    uint64_t items = 0;
    for (uint64_t k = 0; k < p->n_groups; k++) {
        p->first[k + 1] = p->first[k] + g[k].n_bins;
        items += g[k].n;
    }
    const uint64_t nw = p->first[p->n_groups];
    p->win = malloc((nw + 1) * sizeof *p->win);
    p->begin = malloc((items ? items : 1) * sizeof *p->begin);
    p->len = malloc((items ? items : 1) * sizeof *p->len);
    if (!p->win || !p->begin || !p->len)
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "out of memory for the packing plan (%llu items, %llu windows)", (ull)items, (ull)nw);
    uint64_t at = 0, w = 0;
    for (uint64_t k = 0; k < p->n_groups; k++)
        for (size_t j = 0; j < g[k].n; j++) {
            const item *it = &g[k].it[j];
            while (w <= p->first[k] + it->bin) p->win[w++] = at; /* window starts (no window is empty) */
            p->begin[at] = it->begin;
            p->len[at++] = it->len;
        }
    while (w <= nw) p->win[w++] = at;
    return 0;
}

int tks__pack_plan(tks_sampler *s, int threads) {
    double t0 = omp_get_wtime();
    tks__pack *p = calloc(1, sizeof *p);
    if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
    const uint64_t C = (uint64_t)s->seq_len + 1, N = s->end - s->begin;
    p->group_tokens = TKS_PACK_GROUP_WINDOWS * C;
    p->n_groups = (N + p->group_tokens - 1) / p->group_tokens;
    p->first = calloc(p->n_groups + 1, sizeof *p->first);
    packed *g = calloc(p->n_groups ? p->n_groups : 1, sizeof *g);
    if (!p->first || !g) {
        free(g);
        tks__pack_free(p);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
    }
    int rc = 0;
    uint64_t docs = 0, split = 0, items = 0, tokens = 0;
    /* every group once, on any number of threads: a group's packing does not
     * depend on which thread packed it */
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) reduction(+ : docs, split, items, tokens)
    {
        work w = {0};
#pragma omp for schedule(dynamic, 1)
        for (uint64_t k = 0; k < p->n_groups; k++) {
            int r;
#pragma omp atomic read
            r = rc;
            if (r) continue;
            r = pack_group(s, p, k, &w);
            if (!r && w.n && !(g[k].it = malloc(w.n * sizeof *g[k].it)))
                r = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
            if (r) {
#pragma omp critical
                if (!rc) rc = r;
                continue;
            }
            memcpy(g[k].it, w.it, w.n * sizeof *w.it);
            qsort(g[k].it, w.n, sizeof *g[k].it, by_bin);
            g[k].n = w.n;
            g[k].n_bins = w.n_bins;
            docs += w.docs;
            split += w.split;
            items += w.n;
            for (size_t j = 0; j < w.n; j++) tokens += w.it[j].len;
        }
        work_free(&w);
    }
    if (!rc) rc = assemble(p, g);
    for (uint64_t k = 0; k < p->n_groups; k++) free(g[k].it);
    free(g);
    const uint64_t n = rc ? 0 : p->first[p->n_groups];
    if (!rc && n == 0)
        rc = tks_fail(TKS_ERR_ARG, tks_dataset_dir(s->ds), TKS_NONE, TKS_NONE,
                      "%s: token range [%llu, %llu) packs into no window", tks_dataset_dir(s->ds),
                      (ull)s->begin, (ull)s->end);
    if (rc) {
        tks__pack_free(p);
        return rc;
    }
    p->stats = (tks_pack_stats){.windows = n, .tokens = tokens, .capacity = n * C,
                                .pad_tokens = n * C - tokens, .docs = docs, .docs_split = split,
                                .pieces = items, .groups = p->n_groups,
                                .seconds = omp_get_wtime() - t0};
    s->pack = p;
    s->n_windows = n;
    return 0;
}

void tks__pack_free(tks__pack *p) {
    if (!p) return;
    free(p->first);
    free(p->win);
    free(p->begin);
    free(p->len);
    free(p);
}

/* Window w's items, in stream order: [*first, *first + *n) of the plan's arrays. */
static void items_of(const tks_sampler *s, uint64_t w, uint64_t *first, size_t *n) {
    *first = s->pack->win[w];
    *n = (size_t)(s->pack->win[w + 1] - *first);
}

uint64_t tks__pack_real(const tks_sampler *s, uint64_t w) {
    uint64_t f, real = 0;
    size_t n;
    items_of(s, w, &f, &n);
    for (size_t k = 0; k < n; k++) real += s->pack->len[f + k];
    return real;
}

int tks__pack_pieces(const tks_sampler *s, uint64_t w, tks_sample_piece *out, size_t cap, size_t *n) {
    uint64_t f;
    items_of(s, w, &f, n);
    for (size_t k = 0; k < *n && k < cap; k++) {
        uint64_t b = s->pack->begin[f + k];
        size_t i = tks__shard_of(s, b);
        out[k] = (tks_sample_piece){(uint32_t)i, b - s->cum[i], s->pack->len[f + k]};
    }
    return 0;
}

int tks__pack_locate(const tks_sampler *s, uint64_t w, tks_sample_loc *loc) {
    uint64_t f;
    size_t n;
    items_of(s, w, &f, &n);
    memset(loc, 0, sizeof *loc);
    loc->window = w;
    loc->token_begin = s->pack->begin[f];
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->pack->begin[f + k];
        size_t i = tks__shard_of(s, b);
        if (loc->n_pieces < TKS_SAMPLE_MAX_PIECES)
            loc->pieces[loc->n_pieces++] = (tks_sample_piece){(uint32_t)i, b - s->cum[i], s->pack->len[f + k]};
        loc->n_pieces_total++;
        loc->n_tokens += s->pack->len[f + k];
    }
    return 0;
}

int tks__pack_read(const tks_sampler *s, uint64_t w, uint32_t model_vocab, uint32_t *tokens, uint64_t *n_real) {
    uint64_t f, at = 0;
    size_t n;
    items_of(s, w, &f, &n);
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->pack->begin[f + k];
        size_t i = tks__shard_of(s, b);
        int rc = tks_shard_read(tks_dataset_shard(s->ds, i), b - s->cum[i], s->pack->len[f + k], model_vocab,
                                tokens + at);
        if (rc) {
            tks_error e = *tks_last_error();
            tks_fail(e.code, e.file, e.shard, e.offset, "%s (in packed training window %llu)", e.message, (ull)w);
            tks_error_set_doc(e.doc, e.line);
            return rc;
        }
        at += s->pack->len[f + k];
    }
    if (n_real) *n_real = at;
    for (uint64_t t = at; t <= s->seq_len; t++) tokens[t] = 0; /* padding */
    return 0;
}

int tks__pack_doc_starts(const tks_sampler *s, uint64_t w, int32_t *doc) {
    uint64_t f, at = 0;
    size_t n;
    items_of(s, w, &f, &n);
    for (size_t k = 0; k < n; k++) {
        for (uint64_t t = at; t < at + s->pack->len[f + k] && t < s->seq_len; t++) doc[t] = (int32_t)at;
        at += s->pack->len[f + k];
    }
    for (uint64_t t = at; t < s->seq_len; t++) doc[t] = (int32_t)at; /* padding: a block of its own */
    return 0;
}

/* CONCAT: the documents of the range against windows [wL, wL + L + 1). A
 * document [a, e) has its next-token pairs (a, a+1) ... (e-2, e-1) in the
 * windows wL <= x < (w+1)L of their first tokens x; it is split when those
 * lie in more than one window (or past the last one, in the unused tail). */
static void concat_stats(const tks_sampler *s, tks_pack_stats *st) {
    double t0 = omp_get_wtime();
    const uint64_t L = s->seq_len, n = s->n_windows;
    memset(st, 0, sizeof *st);
    st->windows = n;
    st->capacity = st->tokens = n * (L + 1);
    for (uint64_t t = s->begin; t < s->end;) {
        uint64_t e = doc_start_from(s, t + 1);
        st->docs++;
        uint64_t w0 = (t - s->begin) / L, w1 = e - t >= 2 ? (e - 2 - s->begin) / L : w0;
        uint64_t in = w1 < n ? w1 - w0 + 1 : (w0 < n ? n - w0 : 0);
        st->pieces += in;
        if (w1 != w0 || w1 >= n) {
            st->docs_split++;
            st->docs_split_short += e - t <= L + 1;
        }
        t = e;
    }
    st->seconds = omp_get_wtime() - t0;
}

int tks_sampler_pack_stats(const tks_sampler *s, tks_pack_stats *st) {
    if (!s || !st) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "pack stats: NULL argument");
    if (s->pack) *st = s->pack->stats;
    else concat_stats(s, st);
    return 0;
}
