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
#define _GNU_SOURCE /* O_CLOEXEC */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/tks_bits.h"
#include "common/tks_first_error.h"
#include "sampler/internal.h"

typedef unsigned long long ull; /* for printf */

struct tks__pack {
    /* views into the plan image (below), owned or mapped */
    const uint64_t *first;  /* (n_groups + 1): group k's first window */
    const uint64_t *win;    /* (n_windows + 1): window w's items are [win[w], win[w+1]) */
    const uint64_t *begin;  /* per item, by window then stream order: its first global token */
    const uint32_t *len;    /* and its tokens */
    unsigned char *owned;   /* the image in memory (malloc), or NULL */
    const uint8_t *map;     /* the image mapped from the plan file, or NULL */
    size_t map_bytes;
    char path[PATH_MAX];    /* the plan file, or "" */
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
        if (tks_resize(&w->it, c, sizeof *w->it))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
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
static int pack_group(const tks_sampler *s, uint64_t G, uint64_t g, work *w) {
    uint64_t a = s->begin + g * G;
    uint64_t b = G > s->end - a ? s->end : a + G;
    int rc = group_items(s, a, b, w);
    return rc ? rc : best_fit(w, s->seq_len + 1);
}

static int by_bin(const void *x, const void *y) {
    const item *a = x, *b = y;
    if (a->bin != b->bin) return a->bin < b->bin ? -1 : 1;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

/* ---- the plan image ------------------------------------------------------
 * One byte layout in memory (malloc) and on disk (mmap), little-endian:
 *   [0, 256)  header (below), its XXH3-64 over [0, 248) at 248
 *   first     (n_groups + 1) u64: group k's windows are first[k] .. first[k+1]-1
 *   win       (n_windows + 1) u64: window w's items are win[w] .. win[w+1]-1
 *   begin     n_items u64: an item's first global token
 *   len       n_items u32: its tokens
 * Header: magic "TKSPACK\1"; u32 version at 8, seq_len 12, group windows 16;
 * u64 manifest XXH3 24, begin 32, end 40, n_groups 48, n_windows 56,
 * n_items 64, tokens 72, docs 80, docs_split 88, XXH3-64 of the bytes after
 * the header 96. The packing algorithm is part of the format: any change to
 * the windows it makes must raise PLAN_VERSION, so that no file made by
 * another rule is used. */
#define PLAN_MAGIC "TKSPACK\1"
#define PLAN_VERSION 1u
#define PLAN_HDR 256u

typedef struct plan_hdr {
    uint32_t version, seq_len, group_windows;
    uint64_t manifest, begin, end, n_groups, n_windows, n_items, tokens, docs, split, body_xxh3;
} plan_hdr;

/* G: the tokens of a group of windows of seq_len + 1 */
static uint64_t group_tokens(uint32_t seq_len) { return (uint64_t)TKS_PACK_GROUP_WINDOWS * (seq_len + 1); }

static uint64_t off_win(const plan_hdr *h) { return PLAN_HDR + 8 * (h->n_groups + 1); }
static uint64_t off_begin(const plan_hdr *h) { return off_win(h) + 8 * (h->n_windows + 1); }
static uint64_t off_len(const plan_hdr *h) { return off_begin(h) + 8 * h->n_items; }
static uint64_t plan_bytes(const plan_hdr *h) { return off_len(h) + 4 * h->n_items; }

static void hdr_encode(const plan_hdr *h, unsigned char *b) {
    memset(b, 0, PLAN_HDR);
    memcpy(b, PLAN_MAGIC, 8);
    tks_put_le32(b + 8, h->version);
    tks_put_le32(b + 12, h->seq_len);
    tks_put_le32(b + 16, h->group_windows);
    const uint64_t f[] = {h->manifest, h->begin,  h->end,  h->n_groups, h->n_windows,
                          h->n_items,  h->tokens, h->docs, h->split,    h->body_xxh3};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) tks_put_le64(b + 24 + 8 * i, f[i]);
    tks_put_le64(b + 248, XXH3_64bits(b, 248));
}

/* The plan's inputs: what its windows are a function of. */
static plan_hdr plan_inputs(const tks_sampler *s) {
    return (plan_hdr){.version = PLAN_VERSION, .seq_len = s->seq_len, .group_windows = TKS_PACK_GROUP_WINDOWS,
                      .manifest = tks_dataset_manifest_xxh3(s->ds), .begin = s->begin, .end = s->end};
}

/* Where a plan's bytes go: memory, or a file (pwrite, any thread). */
typedef struct sink {
    unsigned char *mem;
    int fd;
    const char *path;
} sink;

static int put(const sink *k, uint64_t at, const void *p, size_t n) {
    if (k->mem) {
        memcpy(k->mem + at, p, n);
        return 0;
    }
    return tks_pwrite_all(k->fd, p, n, at, k->path);
}

/* Per-group counts of a rank's groups [g0, g1): cnt[2k] windows, cnt[2k+1]
 * items; tot[] += documents, documents split, tokens. */
static int count_pass(const tks_sampler *s, uint64_t G, uint64_t g0, uint64_t g1, int threads, uint64_t *cnt,
                      uint64_t tot[3]) {
    tks_first_error ff = TKS_FIRST_ERROR_NONE; /* at: the first group whose packing failed */
    uint64_t docs = 0, split = 0, tokens = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads()) reduction(+ : docs, split, tokens)
    {
        work w = {0};
#pragma omp for schedule(dynamic, 1)
        for (uint64_t k = g0; k < g1; k++) {
            if (tks_first_error_before(&ff, k)) continue;
            if (pack_group(s, G, k, &w)) {
                tks_first_error_note(&ff, k);
                continue;
            }
            cnt[2 * k] = w.n_bins;
            cnt[2 * k + 1] = w.n;
            docs += w.docs;
            split += w.split;
            for (size_t j = 0; j < w.n; j++) tokens += w.it[j].len;
        }
        work_free(&w);
    }
    tot[0] += docs, tot[1] += split, tot[2] += tokens;
    return tks_first_error_result(&ff, TKS_ERR_IO);
}

/* Writes groups [g0, g1)'s windows and items; wf[k] and itf[k] are group k's
 * first window and first item (prefix sums of the counts). */
static int write_pass(const tks_sampler *s, const plan_hdr *h, const uint64_t *wf, const uint64_t *itf, uint64_t g0,
                      uint64_t g1, int threads, const sink *k) {
    const uint64_t G = group_tokens(s->seq_len);
    tks_first_error ff = TKS_FIRST_ERROR_NONE; /* at: the first group whose packing failed */
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        work w = {0};
        uint64_t *wb = NULL, *bb = NULL;
        uint32_t *lb = NULL;
        size_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (uint64_t g = g0; g < g1; g++) {
            if (tks_first_error_before(&ff, g)) continue;
            int r = pack_group(s, G, g, &w);
            if (!r && (w.n_bins != wf[g + 1] - wf[g] || w.n != itf[g + 1] - itf[g]))
                r = tks_fail(TKS_ERR_ARG, tks_dataset_dir(s->ds), TKS_NONE, TKS_NONE,
                             "packing group %llu gave %u windows, %zu items, after %llu and %llu: the dataset "
                             "changed while the plan was made",
                             (ull)g, w.n_bins, w.n, (ull)(wf[g + 1] - wf[g]), (ull)(itf[g + 1] - itf[g]));
            if (!r && w.n > cap) {
                free(wb), free(bb), free(lb);
                cap = w.n;
                wb = malloc(cap * sizeof *wb), bb = malloc(cap * sizeof *bb), lb = malloc(cap * sizeof *lb);
                if (!wb || !bb || !lb) {
                    cap = 0;
                    r = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
                }
            }
            if (!r && w.n) {
                qsort(w.it, w.n, sizeof *w.it, by_bin);
                for (size_t j = 0; j < w.n; j++) {
                    if (j == 0 || w.it[j].bin != w.it[j - 1].bin) wb[w.it[j].bin] = itf[g] + j; /* no bin is empty */
                    bb[j] = w.it[j].begin;
                    lb[j] = w.it[j].len;
                }
                r = put(k, off_win(h) + 8 * wf[g], wb, w.n_bins * sizeof *wb);
                if (!r) r = put(k, off_begin(h) + 8 * itf[g], bb, w.n * sizeof *bb);
                if (!r) r = put(k, off_len(h) + 4 * itf[g], lb, w.n * sizeof *lb);
            }
            if (r) tks_first_error_note(&ff, g);
        }
        free(wb), free(bb), free(lb);
        work_free(&w);
    }
    return tks_first_error_result(&ff, TKS_ERR_IO);
}

static int plan_nomem(void) {
    return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory packing windows");
}

/* Damaged or stale plan file: the error says what to do. */
static int plan_bad(const char *path, int code, const char *what) {
    return tks_fail(code, path, TKS_NONE, TKS_NONE,
                    "packing plan %s: %s; it is made again from the dataset when it is missing: delete it and "
                    "rerun", path, what);
}

/* Points p at a plan image (header checked by the caller). */
static void adopt(tks__pack *p, const plan_hdr *h, const unsigned char *b) {
    p->first = (const uint64_t *)(b + PLAN_HDR);
    p->win = (const uint64_t *)(b + off_win(h));
    p->begin = (const uint64_t *)(b + off_begin(h));
    p->len = (const uint32_t *)(b + off_len(h));
    const uint64_t C = (uint64_t)h->seq_len + 1;
    p->stats = (tks_pack_stats){.windows = h->n_windows, .tokens = h->tokens, .capacity = h->n_windows * C,
                                .pad_tokens = h->n_windows * C - h->tokens, .docs = h->docs,
                                .docs_split = h->split, .pieces = h->n_items, .groups = h->n_groups};
}

/* Opens and checks the plan file `path` for s: header, inputs, size, body
 * checksum, then every offset and length (a plan that passes cannot make a
 * read leave the range). O(file). */
static int plan_open(const tks_sampler *s, const char *path, tks__pack *p) {
    const uint8_t *b;
    size_t size;
    int rc = tks_map_file(path, "packing plan", &b, &size);
    if (rc) return rc;
    plan_hdr h = {0}, want = plan_inputs(s);
    const char *bad = NULL;
    int code = TKS_ERR_HEADER;
    if (size < PLAN_HDR || memcmp(b, PLAN_MAGIC, 8)) bad = "not a packing plan (magic)", code = TKS_ERR_MAGIC;
    else if (tks_le64(b + 248) != XXH3_64bits(b, 248)) bad = "header checksum mismatch", code = TKS_ERR_CHECKSUM;
    if (!bad) {
        h = (plan_hdr){tks_le32(b + 8),  tks_le32(b + 12), tks_le32(b + 16), tks_le64(b + 24), tks_le64(b + 32),
                       tks_le64(b + 40), tks_le64(b + 48), tks_le64(b + 56), tks_le64(b + 64), tks_le64(b + 72),
                       tks_le64(b + 80), tks_le64(b + 88), tks_le64(b + 96)};
        const uint64_t G = group_tokens(s->seq_len);
        if (h.version != PLAN_VERSION) bad = "made by another version of the packing", code = TKS_ERR_VERSION;
        else if (h.seq_len != want.seq_len || h.group_windows != want.group_windows || h.manifest != want.manifest ||
                 h.begin != want.begin || h.end != want.end)
            bad = "made for another dataset, token range or seq_len (stale)";
        else if (h.n_groups != (h.end - h.begin + G - 1) / G || h.n_windows == 0 || h.n_items < h.n_windows ||
                 h.n_items > h.end - h.begin || h.n_windows > h.end - h.begin || plan_bytes(&h) != size)
            bad = "its size or counts do not match its header", code = TKS_ERR_TRUNCATED;
        else if (XXH3_64bits(b + PLAN_HDR, size - PLAN_HDR) != h.body_xxh3)
            bad = "checksum mismatch (damaged)", code = TKS_ERR_CHECKSUM;
    }
    if (!bad) {
        adopt(p, &h, b);
        const uint64_t C = (uint64_t)h.seq_len + 1, nw = h.n_windows, ni = h.n_items;
        uint64_t tokens = 0;
        if (p->first[0] != 0 || p->first[h.n_groups] != nw || p->win[0] != 0 || p->win[nw] != ni) bad = "bad offsets";
        for (uint64_t k = 0; k < h.n_groups && !bad; k++)
            if (p->first[k + 1] < p->first[k]) bad = "group offsets decrease";
        for (uint64_t w = 0; w < nw && !bad; w++) {
            uint64_t fill = 0;
            if (p->win[w + 1] <= p->win[w] || p->win[w + 1] > ni) {
                bad = "a window without items, or past the items";
                break;
            }
            for (uint64_t j = p->win[w]; j < p->win[w + 1]; j++) {
                uint64_t a = p->begin[j], n = p->len[j];
                if (n == 0 || n > C || a < h.begin || a > h.end || n > h.end - a) bad = "an item outside the range";
                fill += n;
            }
            if (fill > C) bad = "a window over seq_len + 1 tokens";
            tokens += fill;
        }
        if (!bad && tokens != h.tokens) bad = "its items do not add up to its tokens";
        if (bad) code = TKS_ERR_INDEX;
    }
    if (bad) {
        tks_unmap(b, size);
        return plan_bad(path, code, bad);
    }
    p->map = b;
    p->map_bytes = size;
    snprintf(p->path, sizeof p->path, "%s", path);
    return 0;
}

/* In-place world collectives, or none for one process. */
static int w_agree(const tks_pack_world *W, int rc) { return W && W->size > 1 ? W->agree(rc, W->ctx) : rc; }
static int w_sum(const tks_pack_world *W, uint64_t *v, size_t n) {
    return W && W->size > 1 ? W->sum_u64(v, n, W->ctx) : 0;
}

/* Packs the range into p: in memory (dir NULL), or into the file `path` made
 * by the world's ranks, each packing its share of the groups (twice: once to
 * count, once to write at the counted offsets). Every rank runs the same
 * collectives whatever fails; the error is every rank's. */
static int plan_make(const tks_sampler *s, int threads, const char *path, const tks_pack_world *W, tks__pack *p) {
    plan_hdr h = plan_inputs(s);
    const uint64_t G = group_tokens(s->seq_len);
    h.n_groups = (s->end - s->begin + G - 1) / G;
    const int rank = path && W ? W->rank : 0, size = path && W ? W->size : 1;
    if (!path) W = NULL; /* in memory: every process plans alone */
    const uint64_t g0 = h.n_groups * (uint64_t)rank / (uint64_t)size, g1 = h.n_groups * (uint64_t)(rank + 1) / (uint64_t)size;
    /* counts: 2 per group, then documents, splits, tokens */
    uint64_t *cnt = calloc(2 * h.n_groups + 3, sizeof *cnt);
    uint64_t *wf = calloc(h.n_groups + 1, sizeof *wf), *itf = calloc(h.n_groups + 1, sizeof *itf);
    int rc = cnt && wf && itf ? count_pass(s, G, g0, g1, threads, cnt, cnt + 2 * h.n_groups) : plan_nomem();
    if (!(rc = w_agree(W, rc))) rc = w_sum(W, cnt, 2 * h.n_groups + 3);
    if (!rc) {
        for (uint64_t k = 0; k < h.n_groups; k++) {
            wf[k + 1] = wf[k] + cnt[2 * k];
            itf[k + 1] = itf[k] + cnt[2 * k + 1];
        }
        h.n_windows = wf[h.n_groups];
        h.n_items = itf[h.n_groups];
        h.docs = cnt[2 * h.n_groups], h.split = cnt[2 * h.n_groups + 1], h.tokens = cnt[2 * h.n_groups + 2];
        if (h.n_windows == 0)
            rc = tks_fail(TKS_ERR_ARG, tks_dataset_dir(s->ds), TKS_NONE, TKS_NONE,
                          "%s: token range [%llu, %llu) packs into no window", tks_dataset_dir(s->ds),
                          (ull)s->begin, (ull)s->end);
    }
    free(cnt);
    const uint64_t bytes = rc ? 0 : plan_bytes(&h);
    sink k = {.fd = -1, .path = path};
    char tmp[PATH_MAX + 16];
    if (!rc && !path) {
        if (!(k.mem = malloc(bytes))) rc = plan_nomem();
    } else if (!rc) { /* rank 0 makes the file; then every rank opens it */
        snprintf(tmp, sizeof tmp, "%s.partial", path);
        k.path = tmp;
        if (rank == 0) { /* (under the plan's lock) a leftover goes; the file is made anew, never
                          * opened through a link planted at its predictable name */
            unlink(tmp);
            int fd = open(tmp, O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_CLOEXEC, 0644);
            if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
                rc = tks_fail(TKS_ERR_IO, tmp, TKS_NONE, TKS_NONE, "cannot create the packing plan %s: %s", tmp,
                              strerror(errno));
            if (fd >= 0) close(fd);
        }
    }
    if (path && (rc = w_agree(W, rc)) == 0) rc = tks_open_own(tmp, O_WRONLY, "packing plan", &k.fd);
    if (path) rc = w_agree(W, rc);
    if (!rc) rc = write_pass(s, &h, wf, itf, g0, g1, threads, &k);
    if (!rc && rank == 0) { /* the group offsets and the end of the window offsets */
        rc = put(&k, PLAN_HDR, wf, (h.n_groups + 1) * sizeof *wf);
        if (!rc) rc = put(&k, off_win(&h) + 8 * h.n_windows, &h.n_items, sizeof h.n_items);
    }
    free(wf), free(itf);
    if (k.fd >= 0) {
        if (!rc && fsync(k.fd) != 0)
            rc = tks_fail(TKS_ERR_IO, tmp, TKS_NONE, TKS_NONE, "cannot fsync %s: %s", tmp, strerror(errno));
        close(k.fd);
    }
    if (!path) {
        if (!rc) { /* no checksum: nothing reads this image back */
            hdr_encode(&h, k.mem);
            adopt(p, &h, k.mem);
            p->owned = k.mem;
        } else free(k.mem);
        return rc;
    }
    /* rank 0 seals it (checksum, header) and publishes it under its name */
    if (!(rc = w_agree(W, rc)) && rank == 0) {
        const uint8_t *b;
        size_t n;
        unsigned char hb[PLAN_HDR];
        if (!(rc = tks_map_file(tmp, "packing plan", &b, &n))) {
            h.body_xxh3 = XXH3_64bits(b + PLAN_HDR, n - PLAN_HDR);
            tks_unmap(b, n);
            hdr_encode(&h, hb);
            int fd;
            if (!(rc = tks_open_own(tmp, O_WRONLY, "packing plan", &fd))) {
                rc = tks_pwrite_all(fd, hb, PLAN_HDR, 0, tmp);
                if (!rc && fsync(fd) != 0)
                    rc = tks_fail(TKS_ERR_IO, tmp, TKS_NONE, TKS_NONE, "cannot fsync %s: %s", tmp, strerror(errno));
                close(fd);
            }
            if (!rc && rename(tmp, path) != 0)
                rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", tmp, path,
                              strerror(errno));
            if (!rc) {
                char d[PATH_MAX];
                snprintf(d, sizeof d, "%s", path);
                char *slash = strrchr(d, '/');
                if (slash) *slash = 0;
                rc = tks_fsync_dir(slash ? d : ".");
            }
        }
        if (rc) unlink(tmp);
    }
    return w_agree(W, rc);
}

int tks__pack_plan(tks_sampler *s, int threads, const char *dir, const tks_pack_world *W) {
    double t0 = omp_get_wtime();
    tks__pack *p = calloc(1, sizeof *p);
    if (!p) return w_agree(dir ? W : NULL, plan_nomem());
    int rc = 0;
    if (!dir) {
        rc = plan_make(s, threads, NULL, NULL, p);
    } else {
        /* named by its inputs' fingerprint: another dataset, range or seq_len
         * gives another file */
        plan_hdr in = plan_inputs(s);
        unsigned char key[PLAN_HDR];
        hdr_encode(&in, key);
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/best-fit-%016llx.plan", dir, (ull)XXH3_64bits(key, 248)) >=
            (int)sizeof path)
            rc = tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "packing plan directory %s: path too long", dir);
        uint64_t have = 0; /* rank 0 looks; every rank follows */
        int lock = -1;     /* rank 0 holds path.lock while the file is made: one maker per file */
        char lock_path[PATH_MAX + 8];
        snprintf(lock_path, sizeof lock_path, "%s.lock", path);
        /* A plan is published whole under its name (made as path.partial, then
         * renamed), so one that is there is read, and checked by plan_open,
         * without a lock: a plan shared in a read-only folder works. The lock is
         * only for making one, and the name is looked at again under it. */
        if (!rc && (!W || W->rank == 0) && !(have = access(path, F_OK) == 0)) {
            rc = tks_mkdir_p(dir);
            if (!rc) rc = tks_lock(lock_path, "tokshard, making this packing plan", &lock);
            have = !rc && access(path, F_OK) == 0;
            if (have) tks_unlock(lock, lock_path), lock = -1;
        }
        if (!(rc = w_agree(W, rc))) rc = w_sum(W, &have, 1);
        if (!rc && !have) rc = plan_make(s, threads, path, W, p);
        if (lock >= 0) tks_unlock(lock, lock_path);
        if (!rc) rc = w_agree(W, plan_open(s, path, p));
    }
    if (rc) {
        tks__pack_free(p);
        return rc;
    }
    p->stats.seconds = omp_get_wtime() - t0;
    s->pack = p;
    s->n_windows = p->stats.windows;
    return 0;
}

void tks__pack_free(tks__pack *p) {
    if (!p) return;
    free(p->owned);
    tks_unmap(p->map, p->map_bytes);
    free(p);
}

const char *tks__pack_path(const tks__pack *p) { return p && p->path[0] ? p->path : NULL; }

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
