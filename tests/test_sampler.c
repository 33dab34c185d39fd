/* test_sampler.c - the training-sample loader (docs/SAMPLING.md): the keyed
 * permutation is a bijection, matches an independent transliteration of the
 * spec and pinned values, and is not trivially structured; each window once
 * per epoch; the samples of a step are the same for every (dp, tp) layout;
 * resuming from a cursor continues exactly; windows across shard boundaries
 * read the right tokens; train/validation split; out-of-range ids; best-fit
 * packing places every document (or its pieces) exactly once per epoch as
 * the spec cuts them, the same on 1 and 3 threads, at most one bin per group
 * half empty, reads pieces then padding, and its statistics are the windows';
 * the batch loader hands out each step's micro-batches and training targets
 * as read directly, for any layout and from a resumed cursor.
 * Usage: test_sampler WORKDIR   (exit 0 = all checks passed) */
#define _GNU_SOURCE
#include "tests/check.h"
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset/dataset.h"
#include "sampler/sampler.h"


typedef unsigned long long ull;

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next_rand(void) { /* splitmix64, for test data only */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char work[1024];

static void plan_links(tks_dataset *ds, uint64_t b, uint64_t e, uint32_t L, const char *name);

static void mkdirs(const char *d) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
    if (system(cmd) != 0) { perror(cmd); exit(2); }
}

/* ---------------------------------------------------------------------------
 * Reference: docs/SAMPLING.md §4 transliterated, written separately from
 * sampler/sampler.c (bit loop instead of clz, explicit round-key table).
 * ------------------------------------------------------------------------- */
static uint64_t ref_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t ref_epoch_key(uint64_t seed, uint64_t e) {
    return ref_mix64(ref_mix64(seed) + 0x9E3779B97F4A7C15ull * (e + 1));
}
static uint64_t ref_perm(uint64_t i, uint64_t n, uint64_t key) {
    if (i >= n) return UINT64_MAX;
    if (n == 1) return 0;
    unsigned k = 2;
    while (k < 64 && (1ull << k) < n) k += 2;
    unsigned h = k / 2;
    uint64_t rk[6];
    for (unsigned r = 0; r < 6; r++) rk[r] = ref_mix64(key + 0x9E3779B97F4A7C15ull * (r + 1));
    uint64_t v = i;
    for (;;) {
        uint64_t l = v >> h, r = v & ((1ull << h) - 1);
        for (unsigned j = 0; j < 6; j++) {
            uint64_t nl = r, nr = l ^ (ref_mix64(r ^ rk[j]) >> (64 - h));
            l = nl;
            r = nr;
        }
        v = (l << h) | r;
        if (v < n) return v;
    }
}

/* ---------------------------------------------------------------------------
 * Permutation
 * ------------------------------------------------------------------------- */
static void test_perm_bijection(void) {
    uint64_t ns[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 100, 1000, 4096, 4097, 65536, 65537, 0, 0, 0};
    size_t nn = sizeof ns / sizeof *ns;
    for (size_t j = nn - 3; j < nn; j++) ns[j] = 2 + next_rand() % 1000000;
    uint64_t keys[] = {0, 1, 0xDEADBEEFull, tks_epoch_key(42, 0), tks_epoch_key(42, 1)};
    for (size_t a = 0; a < nn; a++) {
        uint64_t n = ns[a];
        unsigned char *hit = malloc(n);
        uint64_t *first = malloc(n * sizeof *first);
        for (size_t b = 0; b < sizeof keys / sizeof *keys; b++) {
            memset(hit, 0, n);
            uint64_t bad = 0, dup = 0, ref_diff = 0, same_as_first = 0;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t p = tks_perm_index(i, n, keys[b]);
                if (p >= n) { bad++; continue; }
                if (hit[p]++) dup++;
                if (i < 2000 && p != ref_perm(i, n, keys[b])) ref_diff++;
                if (p != tks_perm_index(i, n, keys[b])) ref_diff++; /* same key, same order */
                if (b == 0) first[i] = p;
                else if (first[i] == p) same_as_first++;
            }
            CHECK(bad == 0 && dup == 0, "n %llu key %llx: %llu out of range, %llu duplicates",
                  (ull)n, (ull)keys[b], (ull)bad, (ull)dup);
            CHECK(ref_diff == 0, "n %llu key %llx: %llu values differ from the spec reference",
                  (ull)n, (ull)keys[b], (ull)ref_diff);
            if (b > 0 && n >= 7)
                CHECK(same_as_first < n, "n %llu: key %llx gives the same order as key 0", (ull)n,
                      (ull)keys[b]);
        }
        free(hit);
        free(first);
    }
    /* out of domain */
    CHECK(tks_perm_index(5, 5, 1) == UINT64_MAX && tks_perm_index(0, 0, 1) == UINT64_MAX, "i >= n");
    /* huge domains: values in range, agree with the reference, distinct for distinct i */
    uint64_t big[] = {(1ull << 62) + 1, UINT64_MAX, 300000000000ull, (1ull << 32) + 7};
    for (size_t a = 0; a < sizeof big / sizeof *big; a++) {
        uint64_t prev[64];
        for (uint64_t i = 0; i < 64; i++) {
            uint64_t x = i * (big[a] / 64), p = tks_perm_index(x, big[a], 7);
            CHECK(p < big[a] && p == ref_perm(x, big[a], 7), "big n %llu i %llu -> %llu", (ull)big[a],
                  (ull)x, (ull)p);
            for (uint64_t j = 0; j < i; j++) CHECK(prev[j] != p, "big n: collision");
            prev[i] = p;
        }
    }
    /* Pinned values: the order is part of the format of a run (a checkpoint's
     * cursor means nothing under another order). If this fails, the
     * permutation changed: that breaks resuming every existing run. */
    CHECK(tks_epoch_key(0, 0) == 0xE220A8397B1DCDAFull, "epoch_key(0,0) = %llx",
          (ull)tks_epoch_key(0, 0));
    const uint64_t pin_n = 1000003, pin_key = tks_epoch_key(1234, 5);
    const uint64_t pinned[8] = {344026, 248114, 365095, 960693,
                                 645012, 974877, 391795, 961462};
    for (int i = 0; i < 8; i++) {
        uint64_t p = tks_perm_index((uint64_t)i * 100000, pin_n, pin_key);
        CHECK(p == pinned[i], "pinned perm(%d) = %llu, expected %llu", i * 100000, (ull)p,
              (ull)pinned[i]);
    }
}

/* Adjacent outputs should look independent: consecutive values, fixed points
 * and small steps occur about as often as for a random permutation. */
static void test_perm_statistics(void) {
    const uint64_t n = 200000;
    for (uint64_t key = 1; key <= 4; key++) {
        uint64_t consec = 0, fixed = 0, near = 0;
        double mean_first_half = 0;
        uint64_t prev = tks_perm_index(0, n, key);
        for (uint64_t i = 1; i < n; i++) {
            uint64_t p = tks_perm_index(i, n, key);
            if (p == prev + 1 || prev == p + 1) consec++; /* expected ~2 */
            if ((p > prev ? p - prev : prev - p) < 100) near++; /* expected ~200 */
            if (p == i) fixed++; /* expected ~1 */
            if (i < n / 2) mean_first_half += (double)p / (n / 2);
            prev = p;
        }
        CHECK(consec < 20, "key %llu: %llu adjacent pairs are consecutive (random: ~2)", (ull)key,
              (ull)consec);
        CHECK(fixed < 20, "key %llu: %llu fixed points (random: ~1)", (ull)key, (ull)fixed);
        CHECK(near > 100 && near < 350, "key %llu: %llu adjacent pairs closer than 100 (random: ~200)",
              (ull)key, (ull)near);
        CHECK(mean_first_half > 0.48 * n && mean_first_half < 0.52 * n,
              "key %llu: mean of the first half's outputs %.0f (random: ~%llu)", (ull)key,
              mean_first_half, (ull)(n / 2));
    }
    /* Small n, many keys: where position 0 goes should be near uniform, and
     * for n = 3 every one of the 6 orders should occur. */
    for (uint64_t n2 = 3; n2 <= 9; n2 += 2) {
        uint64_t cnt[16] = {0}, orders[6] = {0};
        const uint64_t K = 60000;
        for (uint64_t key = 0; key < K; key++) {
            uint64_t k = tks_epoch_key(key, 0);
            cnt[tks_perm_index(0, n2, k)]++;
            if (n2 == 3) {
                uint64_t a = tks_perm_index(0, 3, k), b = tks_perm_index(1, 3, k);
                orders[a * 2 + (b > a ? b - 1 : b)]++;
            }
        }
        for (uint64_t j = 0; j < n2; j++)
            CHECK(cnt[j] > 0.9 * K / n2 && cnt[j] < 1.1 * K / n2,
                  "n %llu: position 0 -> %llu for %llu of %llu keys (uniform: %llu)", (ull)n2, (ull)j,
                  (ull)cnt[j], (ull)K, (ull)(K / n2));
        if (n2 == 3)
            for (int j = 0; j < 6; j++)
                CHECK(orders[j] > 0.8 * K / 6 && orders[j] < 1.2 * K / 6,
                      "n 3: order %d occurs for %llu of %llu keys (uniform: %llu)", j, (ull)orders[j],
                      (ull)K, (ull)(K / 6));
    }
}

/* ---------------------------------------------------------------------------
 * Synthetic datasets
 * ------------------------------------------------------------------------- */
typedef struct stream {
    uint32_t *tok;  /* all tokens, concatenated in stream order */
    uint64_t n;
    uint64_t *starts; /* each document's first token in the stream, in order */
    size_t n_docs;
} stream;

static void stream_free(stream *S) {
    free(S->tok);
    free(S->starts);
}

/* Writes a dataset of random documents (lengths 1..maxlen, ids < vocab) and
 * returns the naive concatenation of all its tokens. With rare_high, ids are
 * below vocab / 2 except about one in 100. */
static stream write_dataset_ex(const char *dir, size_t n_docs, size_t maxlen, uint32_t vocab,
                               uint64_t shard_tokens, int rare_high) {
    mkdirs(dir);
    char tpath[PATH_MAX];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.model", dir);
    FILE *f = fopen(tpath, "wb");
    if (!f || fprintf(f, "fake tokenizer for vocab %u", vocab) < 0 || fclose(f)) {
        perror(tpath);
        exit(2);
    }
    tks_tokenizer_info tok = {.vocab_size = vocab, .bos_id = 1, .eos_id = 2, .pad_id = TKS_NO_ID,
                              .unk_id = 0};
    snprintf(tok.file, sizeof tok.file, "tokenizer.model");
    snprintf(tok.model_type, sizeof tok.model_type, "bpe");
    CHECK(tks_file_xxh3_128(tpath, tok.fingerprint, NULL) == 0, "hash tokenizer");
    tks_writer_opts o = {.dir = dir, .vocab_size = vocab, .bos_id = 1, .eos_id = 2,
                         .pad_id = TKS_NO_ID, .shard_tokens = shard_tokens, .chunk_bytes = 256};
    memcpy(o.tokenizer_fp, tok.fingerprint, 16);
    tks_writer *w;
    if (tks_writer_create(&o, &w)) {
        fprintf(stderr, "writer: %s\n", tks_last_error()->message);
        exit(2);
    }
    stream S = {malloc(n_docs * maxlen * sizeof(uint32_t)), 0, malloc(n_docs * sizeof(uint64_t)), 0};
    for (size_t d = 0; d < n_docs; d++) {
        size_t len = 1 + next_rand() % maxlen;
        S.starts[S.n_docs++] = S.n;
        uint32_t *doc = S.tok + S.n;
        for (size_t j = 0; j < len; j++) {
            uint64_t r = next_rand();
            doc[j] = (uint32_t)(r % vocab);
            if (rare_high && (r >> 32) % 100 != 0) doc[j] %= vocab / 2;
        }
        CHECK(tks_writer_add(w, doc, len, d, NULL) == 0, "add: %s", tks_last_error()->message);
        S.n += len;
    }
    CHECK(tks_writer_flush(w) == 0, "flush: %s", tks_last_error()->message);
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(w, &ns);
    CHECK(tks_manifest_write(dir, &tok, si, ns, vocab <= 65536 ? 2 : 4, 256, NULL) == 0,
          "manifest: %s", tks_last_error()->message);
    tks_writer_free(w);
    return S;
}

static stream write_dataset(const char *dir, size_t n_docs, size_t maxlen, uint32_t vocab,
                            uint64_t shard_tokens) {
    return write_dataset_ex(dir, n_docs, maxlen, vocab, shard_tokens, 0);
}

static tks_dataset *open_ds(const char *dir) {
    tks_dataset *ds;
    if (tks_dataset_open(dir, &ds)) {
        fprintf(stderr, "open %s: %s\n", dir, tks_last_error()->message);
        exit(2);
    }
    return ds;
}

/* Every window of a sampler over [b, e) reads exactly the stream's tokens,
 * and its pieces describe them. */
static void check_windows(const tks_dataset *ds, const stream *S, uint64_t b, uint64_t e,
                          uint32_t L, const char *what) {
    tks_sampler *s;
    int rc = tks_sampler_create(ds, b, e, L, 7, &s);
    CHECK(rc == 0, "%s: create: %s", what, tks_last_error()->message);
    if (rc) return;
    const uint64_t n = tks_sampler_n_windows(s);
    CHECK(n == (e - b - 1) / L, "%s: n_windows %llu", what, (ull)n);
    /* cumulative shard offsets, from the dataset */
    size_t nsh = tks_dataset_n_shards(ds);
    uint64_t *cum = calloc(nsh + 1, sizeof *cum);
    for (size_t i = 0; i < nsh; i++) cum[i + 1] = cum[i] + tks_shard_hdr(tks_dataset_shard(ds, i))->n_tokens;
    uint32_t *buf = malloc(((size_t)L + 1) * sizeof *buf);
    int32_t *doc = malloc((size_t)L * sizeof *doc);
    uint64_t bad_read = 0, bad_loc = 0, spans = 0, cut = 0, bad_doc = 0, multi = 0;
    size_t di = 0; /* the stream's document holding the window's first token */
    for (uint64_t w = 0; w < n; w++) {
        uint64_t t0 = b + w * L;
        /* document starts against the stream's own list: the start of the
         * document of t0 + j (0 when before the window) */
        while (di + 1 < S->n_docs && S->starts[di + 1] <= t0) di++;
        if (tks_sampler_doc_starts(s, w, doc)) bad_doc++;
        else
            for (uint32_t j = 0, d = (uint32_t)di; j < L; j++) {
                while (d + 1 < S->n_docs && S->starts[d + 1] <= t0 + j) d++;
                int32_t want = S->starts[d] > t0 ? (int32_t)(S->starts[d] - t0) : 0;
                if (doc[j] != want) bad_doc++;
                if (j == L - 1 && doc[j] > 0) multi++;
            }
        memset(buf, 0xFF, ((size_t)L + 1) * sizeof *buf);
        if (tks_sampler_read(s, w, 0, buf) || memcmp(buf, S->tok + t0, ((size_t)L + 1) * 4)) bad_read++;
        CHECK(t0 + L + 1 <= e, "%s: window %llu ends past the range", what, (ull)w);
        tks_sample_loc loc;
        if (tks_sampler_locate(s, w, &loc)) { bad_loc++; continue; }
        uint64_t t = t0, sum = 0;
        for (uint32_t p = 0; p < loc.n_pieces; p++) {
            const tks_sample_piece *pc = &loc.pieces[p];
            if (pc->shard >= nsh || cum[pc->shard] + pc->offset != t || pc->n_tokens == 0 ||
                pc->offset + pc->n_tokens > cum[pc->shard + 1] - cum[pc->shard] ||
                (p + 1 < loc.n_pieces_total && pc->offset + pc->n_tokens != cum[pc->shard + 1] - cum[pc->shard]))
                bad_loc++;
            t += pc->n_tokens;
            sum += pc->n_tokens;
        }
        if (loc.window != w || loc.token_begin != t0 || loc.n_tokens != (uint64_t)L + 1) bad_loc++;
        if (loc.n_pieces_total == loc.n_pieces) {
            if (sum != (uint64_t)L + 1) bad_loc++;
        } else {
            cut++;
            if (loc.n_pieces != TKS_SAMPLE_MAX_PIECES || sum >= (uint64_t)L + 1) bad_loc++;
        }
        if (loc.n_pieces_total > 1) spans++;
    }
    CHECK(bad_read == 0, "%s: %llu windows read wrong tokens", what, (ull)bad_read);
    CHECK(bad_doc == 0, "%s: %llu document starts wrong", what, (ull)bad_doc);
    CHECK(multi > 0 || L == 1, "%s: no window holds two documents (test data too coarse)", what);
    CHECK(tks_sampler_doc_starts(s, n, doc) == TKS_ERR_ARG, "%s: doc_starts(n)", what);
    free(doc);
    CHECK(bad_loc == 0, "%s: %llu windows located wrongly", what, (ull)bad_loc);
    CHECK(spans > 0, "%s: no window spans a shard boundary (test data too coarse)", what);
    printf("%s: %llu windows of %u+1 tokens read correctly, %llu span shards, %llu over %d shards, "
           "%llu end in another document than they start\n",
           what, (ull)n, L, (ull)spans, (ull)cut, TKS_SAMPLE_MAX_PIECES, (ull)multi);
    /* out of range window */
    tks_sample_loc loc;
    CHECK(tks_sampler_locate(s, n, &loc) == TKS_ERR_ARG, "%s: locate(n)", what);
    CHECK(tks_sampler_read(s, n, 0, buf) == TKS_ERR_ARG, "%s: read(n)", what);
    free(buf);
    free(cum);
    tks_sampler_free(s);
}

static void test_windows(void) {
    char dir[1536];
    /* several shards of a few hundred tokens; windows of 64 + 1 */
    snprintf(dir, sizeof dir, "%s/win", work);
    stream S = write_dataset(dir, 400, 40, 1000, 700);
    tks_dataset *ds = open_ds(dir);
    CHECK(tks_dataset_n_shards(ds) > 5, "expected several shards, got %zu", tks_dataset_n_shards(ds));
    CHECK(tks_dataset_n_tokens(ds) == S.n, "token count");
    check_windows(ds, &S, 0, S.n, 64, "whole range L=64");
    check_windows(ds, &S, 0, S.n, 1, "whole range L=1");
    check_windows(ds, &S, 333, S.n - 17, 100, "inner range L=100");
    /* the +1 token: exactly L + 1 tokens make one window, L tokens none */
    tks_sampler *s;
    CHECK(tks_sampler_create(ds, 10, 10 + 65, 64, 0, &s) == 0 && tks_sampler_n_windows(s) == 1,
          "65 tokens, L 64: one window");
    tks_sampler_free(s);
    CHECK(tks_sampler_create(ds, 10, 10 + 64, 64, 0, &s) == TKS_ERR_ARG && s == NULL,
          "64 tokens, L 64: no window must fail");
    CHECK(strstr(tks_last_error()->message, "64 tokens") && strstr(tks_last_error()->message, "65"),
          "message gives the numbers: %s", tks_last_error()->message);
    CHECK(tks_sampler_create(ds, 0, 10 * 64 + 1, 64, 0, &s) == 0 && tks_sampler_n_windows(s) == 10,
          "641 tokens, L 64: 10 windows");
    tks_sampler_free(s);
    CHECK(tks_sampler_create(ds, 0, 10 * 64, 64, 0, &s) == 0 && tks_sampler_n_windows(s) == 9,
          "640 tokens, L 64: 9 windows (the last needs its +1 token)");
    tks_sampler_free(s);
    CHECK(tks_sampler_create(ds, 0, S.n + 1, 64, 0, &s) == TKS_ERR_ARG, "range past the end");
    CHECK(tks_sampler_create(ds, 50, 40, 64, 0, &s) == TKS_ERR_ARG, "begin > end");
    CHECK(tks_sampler_create(ds, 0, S.n, 0, 0, &s) == TKS_ERR_ARG, "seq_len 0");
    CHECK(tks_sampler_create(NULL, 0, S.n, 8, 0, &s) == TKS_ERR_ARG, "NULL dataset");
    tks_sampler_free(NULL);
    tks_dataset_close(ds);
    stream_free(&S);

    /* one document per shard, documents of 1..3 tokens: a window of 65
     * tokens spans more than TKS_SAMPLE_MAX_PIECES shards */
    snprintf(dir, sizeof dir, "%s/tiny", work);
    S = write_dataset(dir, 300, 3, 70000, 1); /* vocab > 65536: uint32 tokens */
    ds = open_ds(dir);
    CHECK(tks_dataset_n_shards(ds) == 300, "tiny shards: %zu", tks_dataset_n_shards(ds));
    check_windows(ds, &S, 0, S.n, 64, "one-document shards L=64");
    tks_dataset_close(ds);
    stream_free(&S);
}

/* Each window once per epoch; epochs in different orders; the sampler's
 * order is the spec's (epoch key + perm). */
static void test_epochs(void) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/epochs", work);
    stream S = write_dataset(dir, 300, 50, 1000, 2000);
    tks_dataset *ds = open_ds(dir);
    tks_sampler *s;
    CHECK(tks_sampler_create(ds, 0, S.n, 16, 99, &s) == 0, "create");
    const uint64_t n = tks_sampler_n_windows(s);
    uint64_t *ord = malloc(3 * n * sizeof *ord);
    unsigned char *seen = malloc(n);
    for (int e = 0; e < 3; e++) {
        memset(seen, 0, n);
        uint64_t dup = 0, off = 0;
        for (uint64_t p = 0; p < n; p++) {
            uint64_t g = e * n + p, w = tks_sampler_window(s, g);
            ord[g] = w;
            if (w >= n) { dup++; continue; }
            if (seen[w]++) dup++;
            if (w != ref_perm(p, n, ref_epoch_key(99, (uint64_t)e))) off++;
        }
        CHECK(dup == 0, "epoch %d: %llu windows repeated or out of range", e, (ull)dup);
        CHECK(off == 0, "epoch %d: %llu samples differ from the spec", e, (ull)off);
    }
    CHECK(memcmp(ord, ord + n, n * sizeof *ord) && memcmp(ord + n, ord + 2 * n, n * sizeof *ord),
          "epochs 0, 1, 2 must be in different orders");
    /* another seed, another order */
    tks_sampler *s2;
    CHECK(tks_sampler_create(ds, 0, S.n, 16, 100, &s2) == 0, "create seed 100");
    uint64_t same = 0;
    for (uint64_t g = 0; g < n; g++) same += tks_sampler_window(s2, g) == ord[g];
    CHECK(same < n / 10, "seed 100 agrees with seed 99 at %llu of %llu samples", (ull)same, (ull)n);
    printf("epochs: %llu windows, each once in each of 3 epochs, orders differ\n", (ull)n);
    tks_sampler_free(s2);
    tks_sampler_free(s);
    free(ord);
    free(seen);
    tks_dataset_close(ds);
    stream_free(&S);
}

/* ---------------------------------------------------------------------------
 * Layouts: the samples of a step are the same for every (dp, tp)
 * ------------------------------------------------------------------------- */
static void test_layouts(void) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/layout", work);
    stream S = write_dataset(dir, 200, 50, 1000, 1500);
    tks_dataset *ds = open_ds(dir);
    tks_sampler *s;
    CHECK(tks_sampler_create(ds, 0, S.n, 8, 5, &s) == 0, "create");
    const uint64_t B = 48, steps[] = {0, 1, 7, 1000, 123456789};
    int layouts = 0, refused = 0;
    for (uint32_t world = 1; world <= 16; world++) {
        for (uint32_t dp = 1; dp <= world; dp++) {
            if (world % dp) continue;
            const uint32_t tp = world / dp;
            uint64_t f, c;
            if (B % dp) {
                int rc = tks_sampler_rank_slice(0, B, dp, 0, &f, &c);
                char want[64];
                snprintf(want, sizeof want, "global batch 48 is not divisible by dp %u", dp);
                CHECK(rc == TKS_ERR_ARG && strstr(tks_last_error()->message, want),
                      "dp %u: expected a refusal naming the numbers, got %d: %s", dp, rc,
                      tks_last_error()->message);
                CHECK(strstr(tks_last_error()->message, "multiple of"), "the fix: %s",
                      tks_last_error()->message);
                refused++;
                continue;
            }
            layouts++;
            for (size_t si = 0; si < sizeof steps / sizeof *steps; si++) {
                const uint64_t st = steps[si];
                uint64_t next = st * B, got[48], k = 0;
                for (uint32_t d = 0; d < dp; d++) {
                    uint64_t f0 = 0, c0 = 0;
                    for (uint32_t t = 0; t < tp; t++) { /* tp ranks: identical calls, identical slices */
                        CHECK(tks_sampler_rank_slice(st, B, dp, d, &f, &c) == 0, "slice");
                        if (t == 0) { f0 = f; c0 = c; }
                        CHECK(f == f0 && c == c0, "tp rank %u differs", t);
                    }
                    /* contiguous, ordered, disjoint */
                    CHECK(f0 == next && c0 == B / dp, "world %u dp %u rank %u step %llu: [%llu,+%llu), "
                          "expected [%llu,+%llu)", world, dp, d, (ull)st, (ull)f0, (ull)c0,
                          (ull)next, (ull)(B / dp));
                    next = f0 + c0;
                    /* micro-batches of every size dividing the rank's share tile it in order */
                    for (uint64_t M = 1; M <= c0; M++) {
                        uint64_t nm;
                        if (c0 % M) {
                            CHECK(tks_batch_check(B, dp, M, NULL, &nm) == TKS_ERR_ARG, "M %llu", (ull)M);
                            continue;
                        }
                        CHECK(tks_batch_check(B, dp, M, NULL, &nm) == 0 && nm == c0 / M, "M ok");
                        uint64_t at = f0;
                        for (uint64_t m = 0; m < nm; m++) {
                            uint64_t mf, mc;
                            CHECK(tks_sampler_micro_slice(f0, c0, M, m, &mf, &mc) == 0 && mf == at &&
                                  mc == M, "micro %llu", (ull)m);
                            at = mf + mc;
                        }
                        CHECK(at == f0 + c0, "micro-batches cover the rank slice");
                    }
                    for (uint64_t g = f0; g < f0 + c0 && k < 48; g++) got[k++] = tks_sampler_window(s, g);
                }
                CHECK(k == B && next == (st + 1) * B, "union of ranks covers the step");
                /* the windows of the step equal those of dp = 1, tp = 1 */
                uint64_t diff = 0;
                for (uint64_t i = 0; i < B && i < k; i++) diff += got[i] != tks_sampler_window(s, st * B + i);
                CHECK(diff == 0, "world %u dp %u tp %u step %llu: %llu samples differ from dp 1",
                      world, dp, tp, (ull)st, (ull)diff);
            }
        }
    }
    printf("layouts: %d (dp, tp) splits of worlds 1..16 agree at every step; %d refused\n", layouts,
           refused);
    uint64_t f, c;
    CHECK(tks_sampler_rank_slice(0, B, 4, 4, &f, &c) == TKS_ERR_ARG, "dp_rank >= dp");
    CHECK(tks_sampler_rank_slice(0, 0, 1, 0, &f, &c) == TKS_ERR_ARG, "B 0");
    CHECK(tks_sampler_rank_slice(0, B, 0, 0, &f, &c) == TKS_ERR_ARG, "dp 0");
    CHECK(tks_sampler_rank_slice(UINT64_MAX / 2, B, 1, 0, &f, &c) == TKS_ERR_ARG, "overflow");
    CHECK(tks_batch_check(48, 4, 5, NULL, NULL) == TKS_ERR_ARG &&
              strstr(tks_last_error()->message, "12") && strstr(tks_last_error()->message, "(4 or 6)"),
          "micro-batch message: %s", tks_last_error()->message);
    CHECK(tks_batch_check(48, 4, 24, NULL, NULL) == TKS_ERR_ARG, "micro-batch > per-rank");
    CHECK(tks_sampler_micro_slice(0, 12, 4, 3, &f, &c) == TKS_ERR_ARG, "micro index");

    /* Resuming: a run with B = 48, dp 4 for 10 steps, stopped at cursor 480
     * and resumed with a fresh sampler under B = 40, dp 5, tp 2, serves the
     * tail of the sequence an uninterrupted run serves. */
    const uint64_t G = 480 + 40 * 30;
    uint64_t *full = malloc(G * sizeof *full), *run = malloc(G * sizeof *run), k = 0;
    for (uint64_t g = 0; g < G; g++) full[g] = tks_sampler_window(s, g);
    uint64_t cursor = 0;
    for (uint64_t st = 0; st < 10; st++, cursor += 48)
        for (uint32_t d = 0; d < 4; d++) {
            CHECK(tks_sampler_rank_slice_at(cursor, 48, 4, d, &f, &c) == 0, "slice");
            for (uint64_t g = f; g < f + c; g++) run[k++] = tks_sampler_window(s, g);
        }
    tks_sampler_free(s);
    tks_dataset_close(ds);
    ds = open_ds(dir); /* "restart": the state is the cursor and the seed */
    CHECK(tks_sampler_create(ds, 0, S.n, 8, 5, &s) == 0, "create after restart");
    for (uint64_t st = 0; st < 30; st++, cursor += 40)
        for (uint32_t d = 0; d < 5; d++) {
            CHECK(tks_sampler_rank_slice_at(cursor, 40, 5, d, &f, &c) == 0, "slice");
            for (uint32_t t = 0; t < 2; t++)
                for (uint64_t g = f; g < f + c; g++)
                    if (t == 0) run[k++] = tks_sampler_window(s, g);
                    else CHECK(tks_sampler_window(s, g) == run[k - c + (g - f)], "tp rank 1");
        }
    CHECK(k == G && memcmp(run, full, G * sizeof *run) == 0, "resumed run differs from the uninterrupted one");
    /* and from any cursor, the sequence is the tail of the one from 0 */
    for (uint64_t c0 = 0; c0 < G; c0 += 97) {
        uint64_t diff = 0;
        for (uint64_t g = c0; g < G; g++) diff += tks_sampler_window(s, g) != full[g];
        CHECK(diff == 0, "from cursor %llu: %llu differ", (ull)c0, (ull)diff);
    }
    printf("resume: cursor 480 under a new layout and batch continues exactly (%llu samples)\n", (ull)G);
    free(full);
    free(run);
    tks_sampler_free(s);
    tks_dataset_close(ds);
    stream_free(&S);
}

/* ---------------------------------------------------------------------------
 * Train / validation split
 * ------------------------------------------------------------------------- */
static void test_split(void) {
    tks_token_range tr, va;
    CHECK(tks_split_tokens(10000, 0, 64, &tr, &va) == 0 && tr.begin == 0 && tr.end == 10000 &&
              va.begin == 10000 && va.end == 10000, "no validation");
    /* 1000 requested with L = 64: (999 / 64) = 15 windows = 961 tokens */
    CHECK(tks_split_tokens(10000, 1000, 64, &tr, &va) == 0 && va.end == 10000 &&
              va.begin == 10000 - 961 && tr.end == va.begin && tr.begin == 0, "val 1000 -> 961: [%llu, %llu)",
          (ull)va.begin, (ull)va.end);
    CHECK(tks_split_tokens(10000, 65, 64, &tr, &va) == 0 && va.end - va.begin == 65, "one val window");
    CHECK(tks_split_tokens(10000, 64, 64, &tr, &va) == TKS_ERR_ARG &&
              strstr(tks_last_error()->message, "at least 65"), "val 64 < one window: %s",
          tks_last_error()->message);
    CHECK(tks_split_tokens(10000, 9990, 64, &tr, &va) == TKS_ERR_ARG &&
              strstr(tks_last_error()->message, "at most 9935"), "val leaves no train window: %s",
          tks_last_error()->message);
    CHECK(tks_split_tokens(10000, 9935, 64, &tr, &va) == 0 && tr.end - tr.begin >= 65, "val 9935 fits");
    CHECK(tks_split_tokens(100, 0, 128, &tr, &va) == TKS_ERR_ARG &&
              strstr(tks_last_error()->message, "100 tokens"), "tiny dataset: %s", tks_last_error()->message);
    CHECK(tks_split_tokens(100, 70, 64, &tr, &va) == TKS_ERR_ARG &&
              strstr(tks_last_error()->message, "separate validation"), "no room for both: %s",
          tks_last_error()->message);
    CHECK(tks_split_tokens(100, 0, 0, &tr, &va) == TKS_ERR_ARG, "seq_len 0");

    /* samplers over the two ranges: windows stay inside their range, share no
     * token, and the last validation window ends at the last token */
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/split", work);
    stream S = write_dataset(dir, 300, 40, 1000, 900);
    tks_dataset *ds = open_ds(dir);
    for (uint32_t L = 7; L <= 200; L += 31) {
        uint64_t vt = 500 + L;
        CHECK(tks_split_tokens(S.n, vt, L, &tr, &va) == 0, "split L %u: %s", L, tks_last_error()->message);
        tks_sampler *st, *sv;
        CHECK(tks_sampler_create(ds, tr.begin, tr.end, L, 1, &st) == 0, "train sampler");
        CHECK(tks_sampler_create(ds, va.begin, va.end, L, 1, &sv) == 0, "val sampler");
        uint64_t max_train = 0, min_val = UINT64_MAX, max_val = 0;
        tks_sample_loc loc;
        for (uint64_t w = 0; w < tks_sampler_n_windows(st); w++) {
            tks_sampler_locate(st, w, &loc);
            if (loc.token_begin + loc.n_tokens > max_train) max_train = loc.token_begin + loc.n_tokens;
        }
        for (uint64_t w = 0; w < tks_sampler_n_windows(sv); w++) {
            tks_sampler_locate(sv, w, &loc);
            if (loc.token_begin < min_val) min_val = loc.token_begin;
            if (loc.token_begin + loc.n_tokens > max_val) max_val = loc.token_begin + loc.n_tokens;
        }
        CHECK(max_train <= tr.end && tr.end <= min_val, "L %u: train windows end at %llu, val starts at %llu",
              L, (ull)max_train, (ull)min_val);
        CHECK(min_val == va.begin && max_val == S.n, "L %u: val windows cover [%llu, %llu) exactly", L,
              (ull)va.begin, (ull)S.n);
        CHECK(tks_sampler_n_windows(sv) == (vt - 1) / L, "L %u: val windows", L);
        CHECK(tr.end - max_train < L, "L %u: fewer than L train tokens unused", L);
        tks_sampler_free(st);
        tks_sampler_free(sv);
    }
    printf("split: train and validation windows never share a token\n");
    tks_dataset_close(ds);
    stream_free(&S);
}

/* ---------------------------------------------------------------------------
 * Out-of-range ids: vocab 1000 data read by a model with 500 embedding rows
 * ------------------------------------------------------------------------- */
static void test_token_range(void) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/range", work);
    stream S = write_dataset_ex(dir, 300, 30, 1000, 100, 1);
    tks_dataset *ds = open_ds(dir);
    size_t nsh = tks_dataset_n_shards(ds);
    uint64_t *cum = calloc(nsh + 1, sizeof *cum);
    for (size_t i = 0; i < nsh; i++) cum[i + 1] = cum[i] + tks_shard_hdr(tks_dataset_shard(ds, i))->n_tokens;
    tks_sampler *s;
    const uint32_t L = 64;
    CHECK(tks_sampler_create(ds, 0, S.n, L, 3, &s) == 0, "create");
    uint32_t buf[L + 1];
    uint64_t checked = 0, spanning_bad = 0;
    for (uint64_t w = 0; w < tks_sampler_n_windows(s); w++) {
        CHECK(tks_sampler_read(s, w, 1000, buf) == 0, "vocab 1000 reads: %s", tks_last_error()->message);
        /* first id >= 500 in this window, in stream order */
        uint64_t t0 = w * L, bad = UINT64_MAX;
        for (uint64_t j = 0; j <= L; j++)
            if (S.tok[t0 + j] >= 500) { bad = t0 + j; break; }
        int rc = tks_sampler_read(s, w, 500, buf);
        if (bad == UINT64_MAX) {
            CHECK(rc == 0, "window %llu has no bad id but failed", (ull)w);
            continue;
        }
        size_t sh = 0;
        while (cum[sh + 1] <= bad) sh++;
        const tks_error *e = tks_last_error();
        CHECK(rc == TKS_ERR_TOKEN_RANGE && e->shard == sh && e->offset == bad - cum[sh],
              "window %llu: rc %d shard %llu offset %llu, expected shard %zu offset %llu: %s", (ull)w, rc,
              (ull)e->shard, (ull)e->offset, sh, (ull)(bad - cum[sh]), e->message);
        char want[64];
        snprintf(want, sizeof want, "training window %llu", (ull)w);
        CHECK(strstr(e->message, want) && strstr(e->message, "shard-") && strstr(e->message, "500"),
              "message names the file, the window and the limit: %s", e->message);
        CHECK(e->doc != TKS_NONE, "the document is kept");
        if (t0 < cum[sh]) spanning_bad++; /* the window starts in an earlier shard */
        checked++;
    }
    CHECK(checked > 10 && spanning_bad > 0, "only %llu windows had a bad id, %llu past a shard boundary",
          (ull)checked, (ull)spanning_bad);
    printf("token range: %llu windows with an id >= 500 fail naming shard and offset (%llu in a later shard "
           "than the window's start)\n", (ull)checked, (ull)spanning_bad);
    tks_sampler_free(s);
    free(cum);
    tks_dataset_close(ds);
    stream_free(&S);
}

/* ---------------------------------------------------------------------------
 * Cost: tks_sampler_window must be cheap (docs/SAMPLING.md §7)
 * ------------------------------------------------------------------------- */
/* The madvise advice on the shard mappings under `dir`, from the kernel's own
 * record (/proc/self/smaps VmFlags: "sr" sequential, "rr" random): counts of
 * mappings with each flag. Returns the number of mappings found. */
static int advice_of(const char *dir, int *seq, int *rnd) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[4096];
    int in = 0, n = 0;
    *seq = *rnd = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strstr(line, " r") && !strncmp(line + strspn(line, "0123456789abcdef"), "-", 1))
            in = strstr(line, dir) && strstr(line, ".tks"), n += in;
        else if (in && !strncmp(line, "VmFlags:", 8))
            *seq += strstr(line, " sr") != NULL, *rnd += strstr(line, " rr") != NULL;
    }
    if (f) fclose(f);
    return n;
}

/* The sampler reads windows in permuted order, so it advises random access
 * (no sequential read-ahead); an opened dataset carries no advice. */
static void test_advice(void) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/advice", work);
    stream S = write_dataset(dir, 400, 40, 1000, 700);
    stream_free(&S);
    tks_dataset *ds = open_ds(dir);
    int seq, rnd, n = advice_of(dir, &seq, &rnd);
    CHECK(n == (int)tks_dataset_n_shards(ds) && seq == 0 && rnd == 0,
          "after open: %d mappings of %zu shards, %d sequential, %d random", n,
          tks_dataset_n_shards(ds), seq, rnd);
    tks_sampler *s = NULL;
    CHECK(tks_sampler_create(ds, 0, tks_dataset_n_tokens(ds), 64, 1, &s) == 0, "sampler");
    n = advice_of(dir, &seq, &rnd);
    CHECK(n > 0 && rnd == n && seq == 0, "with a sampler: %d mappings, %d random, %d sequential", n,
          rnd, seq);
    tks_dataset_advise(ds, TKS_ACCESS_SEQUENTIAL);
    n = advice_of(dir, &seq, &rnd);
    CHECK(n > 0 && seq == n && rnd == 0, "advised sequential: %d mappings, %d sequential", n, seq);
    tks_sampler_free(s);
    tks_dataset_close(ds);
}

static void test_speed(void) {
    volatile uint64_t sink = 0;
    const uint64_t reps = 2000000;
    uint64_t ns[] = {1000003, 300000000000ull, 5000, (1ull << 40) + 1};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        double t = now();
        for (uint64_t g = 0; g < reps; g++) {
            uint64_t n = ns[a];
            sink += tks_perm_index(g % n, n, tks_epoch_key(11, g / n));
        }
        double per = (now() - t) / reps * 1e9;
        /* a figure for the log, not a check: speed is never asserted in a test */
        printf("speed: window (epoch key + perm) for n = %llu: %.0f ns\n", (ull)ns[a], per);
    }
    (void)sink;
}

/* ---------------------------------------------------------------------------
 * Blend (docs/SAMPLING.md §9)
 * ------------------------------------------------------------------------- */

/* The spec's assignment written separately: per sample the phase by a
 * linear scan, the deficits W (j + 1) - S c as 128-bit integers, ties to
 * the first source. */
static void ref_blend(const tks_blend *b, uint64_t n, uint32_t *src, uint64_t *idx) {
    uint64_t total[TKS_BLEND_MAX_SOURCES] = {0}, inphase[TKS_BLEND_MAX_SOURCES] = {0};
    uint32_t p = 0;
    for (uint64_t i = 0; i < n; i++) {
        while (p + 1 < b->n_phases && b->start[p + 1] <= i) {
            p++;
            memset(inphase, 0, sizeof inphase);
        }
        __int128 best = 0;
        int k_best = -1;
        for (uint32_t k = 0; k < b->n_sources; k++) {
            if (b->W[p][k] == 0) continue;
            __int128 d = (__int128)b->W[p][k] * (__int128)(i - b->start[p] + 1) -
                         (__int128)b->S[p] * (__int128)inphase[k];
            if (k_best < 0 || d > best) best = d, k_best = (int)k;
        }
        src[i] = (uint32_t)k_best;
        idx[i] = total[k_best]++;
        inphase[k_best]++;
    }
}

/* Over every prefix of a phase: a source never holds a whole sample more
 * than its share (c S - W n <= (1 - 1/K) S, proved in §9), nor falls behind
 * by more than the others' excess, (K - 1)^2 / K samples; returns the worst
 * lag in samples. */
static double check_prefixes(const tks_blend *b, uint32_t p, const uint32_t *src, uint64_t n,
                             const char *what) {
    uint64_t c[TKS_BLEND_MAX_SOURCES] = {0};
    uint32_t K = 0;
    for (uint32_t k = 0; k < b->n_sources; k++) K += b->W[p][k] > 0;
    const __int128 S = (__int128)b->S[p];
    double worst = 0;
    uint64_t bad = 0;
    for (uint64_t i = b->start[p]; i < n; i++) {
        c[src[i]]++;
        uint64_t m = i + 1 - b->start[p];
        for (uint32_t k = 0; k < b->n_sources; k++) {
            __int128 e = (__int128)c[k] * S - (__int128)b->W[p][k] * m; /* excess, in 1/S samples */
            if ((__int128)K * e > (__int128)(K - 1) * S) bad++;
            if (-(__int128)K * e > (__int128)(K - 1) * (K - 1) * S) bad++;
            if (-(double)e / (double)S > worst) worst = -(double)e / (double)S;
        }
    }
    CHECK(bad == 0, "%s: %llu prefix counts outside the bounds", what, (ull)bad);
    return worst;
}

static void test_blend(void) {
    /* integer weights by hand: 1 : 3 is exactly 2^30 : 3 * 2^30 */
    tks_blend b;
    uint64_t st0[3] = {0, 0, 0};
    double w13[2] = {1, 3};
    CHECK(tks_blend_init(&b, 2, 1, st0, w13, NULL) == 0, "init 1:3: %s", tks_last_error()->message);
    CHECK(b.W[0][0] == 1ull << 30 && b.W[0][1] == 3ull << 30 && b.S[0] == 1ull << 32, "W of 1:3");
    /* 1:3 repeats every 4 samples: within each four, one of source 0 */
    uint32_t src[20000];
    uint64_t idx[20000];
    tks_blend_state s = {0};
    int per4 = 1;
    for (int i = 0; i < 400; i++) {
        tks_blend_pick pk = tks_blend_next(&b, &s);
        src[i] = pk.source;
        if (i % 4 == 3) {
            int zeros = (src[i] == 0) + (src[i - 1] == 0) + (src[i - 2] == 0) + (src[i - 3] == 0);
            per4 &= zeros == 1;
        }
    }
    CHECK(per4, "1:3: not one sample of source 0 in every 4");
    /* ties go to the first listed: 1:1 alternates 0, 1, 0, 1 ... */
    double w11[2] = {1, 1};
    CHECK(tks_blend_init(&b, 2, 1, st0, w11, NULL) == 0, "init 1:1");
    memset(&s, 0, sizeof s);
    int alt = 1;
    for (int i = 0; i < 100; i++) alt &= tks_blend_next(&b, &s).source == (uint32_t)(i % 2);
    CHECK(alt, "1:1: not 0, 1, 0, 1, ... (ties to the first)");
    /* one source: the pick of sample g is (0, g), the order of a plain run */
    double one = 2.5;
    CHECK(tks_blend_init(&b, 1, 1, st0, &one, NULL) == 0, "init one source");
    memset(&s, 0, sizeof s);
    int plain = 1;
    for (uint64_t g = 0; g < 1000; g++) {
        tks_blend_pick pk = tks_blend_next(&b, &s);
        plain &= pk.source == 0 && pk.index == g;
    }
    CHECK(plain, "one source: pick g is (0, g)");

    /* random weights, 2..8 sources, two schedules: the reference's picks,
     * the prefix bounds, every restart point */
    double worst_lag[9] = {0};
    for (int trial = 0; trial < 60; trial++) {
        uint32_t K = 2 + (uint32_t)(trial % 7), P = 1 + (uint32_t)(trial % 3);
        uint64_t start[3] = {0, 3000 + next_rand() % 5000, 12000 + next_rand() % 5000};
        double w[3 * 8];
        for (uint32_t i = 0; i < P * K; i++) {
            double u = (double)(next_rand() >> 11) / 9007199254740992.0;
            w[i] = u * u * u * 10;
            if (i >= K && next_rand() % 4 == 0) w[i] = 0; /* a source left out of a later phase */
        }
        for (uint32_t p = 0; p < P; p++) w[p * K + p % K] += 0.01; /* at least one positive */
        int rc = tks_blend_init(&b, K, P, start, w, NULL);
        CHECK(rc == 0, "trial %d: init: %s", trial, tks_last_error()->message);
        if (rc) continue;
        const uint64_t n = 20000;
        uint32_t rs[20000];
        uint64_t ri[20000];
        ref_blend(&b, n, rs, ri);
        memset(&s, 0, sizeof s);
        uint64_t diff = 0;
        for (uint64_t i = 0; i < n; i++) {
            tks_blend_pick pk = tks_blend_next(&b, &s);
            src[i] = pk.source, idx[i] = pk.index;
            diff += pk.source != rs[i] || pk.index != ri[i];
        }
        CHECK(diff == 0, "trial %d (K %u, %u phases): %llu picks differ from the reference", trial, K, P,
              (ull)diff);
        char what[64];
        for (uint32_t p = 0; p < P; p++) {
            uint64_t end = p + 1 < P ? start[p + 1] : n;
            snprintf(what, sizeof what, "trial %d phase %u", trial, p);
            double lag = check_prefixes(&b, p, src, end, what);
            if (lag > worst_lag[K]) worst_lag[K] = lag;
        }
        /* picks from any earlier state equal the sequential ones (what every
         * rank does at every step, and a resumed run from its cursor) */
        for (int r = 0; r < 20; r++) {
            uint64_t at = next_rand() % n, first = at + next_rand() % (n - at), cnt = (n - first) % 97;
            tks_blend_state from = {0};
            tks_blend_seek(&b, &from, at);
            tks_blend_pick out[97];
            CHECK(tks_blend_picks(&b, &from, first, cnt, out) == 0, "picks");
            for (uint64_t i = 0; i < cnt; i++)
                diff += out[i].source != src[first + i] || out[i].index != idx[first + i];
            CHECK(from.sample == at, "picks changed the state");
        }
        CHECK(diff == 0, "trial %d: picks from restart points differ", trial);
    }
    for (int K = 2; K <= 8; K++) printf("blend: %d sources: worst lag behind the share %.3f samples\n", K, worst_lag[K]);
    CHECK(worst_lag[2] <= 0.5, "two sources: lag %.3f > 1/2 sample", worst_lag[2]);
    tks_blend_state later = {0}, early = {0};
    tks_blend_seek(&b, &later, 10);
    CHECK(tks_blend_picks(&b, &later, 5, 1, (tks_blend_pick[1]){{0, 0}}) == TKS_ERR_ARG, "picks before the state");
    (void)early;

    /* refusals, each naming the source */
    const char *names[2] = {"web", "code"};
    double bad[][2] = {{1, -1}, {1, NAN}, {INFINITY, 1}, {0, 0}, {1, 1e-12}};
    const char *why[] = {"code: weight -1", "code: weight nan", "web: weight inf", "draws from no source",
                         "code: weight 1e-12 is below 2^-32"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(tks_blend_init(&b, 2, 1, st0, bad[i], names) == TKS_ERR_ARG, "bad weights %zu accepted", i);
        CHECK(strstr(tks_last_error()->message, why[i]) != NULL, "message '%s' lacks '%s'",
              tks_last_error()->message, why[i]);
    }
    uint64_t badstart[2] = {0, 0};
    double ww[4] = {1, 1, 1, 1};
    CHECK(tks_blend_init(&b, 2, 2, badstart, ww, names) == TKS_ERR_ARG, "phases not increasing");
}


/* ---------------------------------------------------------------------------
 * Best-fit packing (docs/SAMPLING.md §10)
 * ------------------------------------------------------------------------- */
typedef struct seg {
    uint64_t begin, len;
} seg;
static int cmp_seg(const void *a, const void *b) {
    const seg *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* The items §10 cuts the documents of [b, e) into, written from the spec:
 * a document of n <= C tokens whole, a longer one as C-token pieces at
 * multiples of L while they fit, then the rest from the next multiple if it
 * holds >= 2 tokens. Returns the count; *split gets the documents cut. */
static size_t ref_items(const stream *S, uint64_t b, uint64_t e, uint32_t L, seg *out, uint64_t *docs,
                        uint64_t *split) {
    size_t k = 0;
    *docs = *split = 0;
    for (size_t d = 0; d < S->n_docs; d++) {
        uint64_t a = S->starts[d], z = d + 1 < S->n_docs ? S->starts[d + 1] : S->n;
        if (z <= b || a >= e) continue;
        if (a < b) a = b;
        if (z > e) z = e;
        uint64_t n = z - a, C = (uint64_t)L + 1;
        (*docs)++;
        if (n <= C) {
            out[k++] = (seg){a, n};
            continue;
        }
        (*split)++;
        uint64_t j = 0;
        for (; j * L + C <= n; j++) out[k++] = (seg){a + j * L, C};
        if (n - j * L >= 2) out[k++] = (seg){a + j * L, n - j * L};
    }
    return k;
}

/* Every window's pieces over a sampler, as global segments, and its loads. */
static size_t all_segments(const tks_dataset *ds, const tks_sampler *s, seg *out, uint64_t *load) {
    const uint64_t nw = tks_sampler_n_windows(s);
    const uint32_t L = tks_sampler_seq_len(s);
    size_t ns = tks_dataset_n_shards(ds), k = 0;
    uint64_t *cum = calloc(ns + 1, sizeof *cum);
    for (size_t i = 0; i < ns; i++) cum[i + 1] = cum[i] + tks_shard_hdr(tks_dataset_shard(ds, i))->n_tokens;
    tks_sample_piece pc[512];
    for (uint64_t w = 0; w < nw; w++) {
        size_t n = 0;
        CHECK(tks_sampler_pieces(s, w, pc, 512, &n) == 0 && n <= 512, "pieces of window %llu", (ull)w);
        load[w] = 0;
        for (size_t j = 0; j < n && j < 512; j++) {
            out[k++] = (seg){cum[pc[j].shard] + pc[j].offset, pc[j].n_tokens};
            load[w] += pc[j].n_tokens;
        }
        CHECK(load[w] >= 1 && load[w] <= (uint64_t)L + 1, "window %llu holds %llu tokens", (ull)w, (ull)load[w]);
    }
    free(cum);
    return k;
}

static void test_packing(void) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/pack", work);
    /* documents of 1..300 tokens, many longer than a window, in small shards */
    stream S = write_dataset(dir, 4000, 300, 1000, 7000);
    tks_dataset *ds = open_ds(dir);
    const uint32_t Ls[2] = {64, 127};
    const uint64_t ranges[2][2] = {{0, S.n}, {137, S.n - 211}};
    seg *ref = malloc(S.n * sizeof *ref), *got = malloc(S.n * sizeof *got), *got3 = malloc(S.n * sizeof *got3);
    uint64_t *load = malloc(S.n * sizeof *load), *load3 = malloc(S.n * sizeof *load3);
    uint32_t *tok = malloc(200 * sizeof *tok);
    int32_t *doc = malloc(200 * sizeof *doc);
    for (int li = 0; li < 2; li++)
        for (int ri = 0; ri < 2; ri++) {
            const uint32_t L = Ls[li], C = L + 1;
            const uint64_t b = ranges[ri][0], e = ranges[ri][1];
            tks_sampler *s1, *s3;
            CHECK(tks_sampler_create_packed(ds, b, e, L, 5, TKS_PACK_BEST_FIT, 1, &s1) == 0, "create: %s",
                  tks_last_error()->message);
            CHECK(tks_sampler_create_packed(ds, b, e, L, 5, TKS_PACK_BEST_FIT, 3, &s3) == 0, "create 3: %s",
                  tks_last_error()->message);
            CHECK(tks_sampler_packing(s1) == TKS_PACK_BEST_FIT, "packing");
            uint64_t nw = tks_sampler_n_windows(s1);
            CHECK(nw == tks_sampler_n_windows(s3), "L %u: %llu windows on 1 thread, %llu on 3", L, (ull)nw,
                  (ull)tks_sampler_n_windows(s3));
            size_t n = all_segments(ds, s1, got, load), n3 = all_segments(ds, s3, got3, load3);
            CHECK(n == n3 && !memcmp(got, got3, n * sizeof *got), "L %u: windows differ between 1 and 3 threads", L);
            /* every document, or its pieces, exactly once in the epoch */
            uint64_t docs, split;
            size_t nr = ref_items(&S, b, e, L, ref, &docs, &split);
            qsort(got3, n3, sizeof *got3, cmp_seg);
            CHECK(nr == n3 && !memcmp(ref, got3, nr * sizeof *ref),
                  "L %u range %d: %zu items placed, the spec gives %zu (or they differ)", L, ri, n3, nr);
            /* the statistics are the windows' */
            tks_pack_stats st;
            CHECK(tks_sampler_pack_stats(s1, &st) == 0, "stats");
            uint64_t real = 0, half = 0;
            for (uint64_t w = 0; w < nw; w++) {
                real += load[w];
                half += 2 * load[w] <= C;
            }
            CHECK(st.windows == nw && st.tokens == real && st.pad_tokens == nw * C - real && st.docs == docs &&
                      st.docs_split == split && st.pieces == nr,
                  "L %u: stats %llu windows %llu tokens %llu pad %llu docs %llu split, counted %llu %llu %llu %llu",
                  L, (ull)st.windows, (ull)st.tokens, (ull)st.pad_tokens, (ull)st.docs, (ull)st.docs_split,
                  (ull)nw, (ull)real, (ull)docs, (ull)split);
            /* best fit (any fit): at most one bin per group is at most half full */
            CHECK(half <= st.groups, "L %u: %llu windows at most half full, %llu groups", L, (ull)half,
                  (ull)st.groups);
            /* reading: the stream's tokens of each piece, then padding 0; documents start at
             * each piece, the padding is a block of its own */
            for (uint64_t w = 0; w < nw; w += 7) {
                uint64_t nreal = 0;
                CHECK(tks_sampler_read_window(s1, w, 0, tok, &nreal) == 0 && nreal == load[w], "read %llu", (ull)w);
                CHECK(tks_sampler_doc_starts(s1, w, doc) == 0, "doc starts %llu", (ull)w);
                tks_sample_piece pc[512];
                size_t np = 0;
                tks_sampler_pieces(s1, w, pc, 512, &np);
                uint64_t at = 0;
                size_t ns = tks_dataset_n_shards(ds);
                for (size_t j = 0; j < np; j++) {
                    uint64_t g = pc[j].offset;
                    for (size_t i = 0; i < pc[j].shard && i < ns; i++) g += tks_shard_hdr(tks_dataset_shard(ds, i))->n_tokens;
                    CHECK(!memcmp(tok + at, S.tok + g, pc[j].n_tokens * sizeof *tok), "window %llu piece %zu tokens", (ull)w, j);
                    for (uint64_t t = at; t < at + pc[j].n_tokens && t < L; t++)
                        CHECK(doc[t] == (int32_t)at, "window %llu: doc[%llu] = %d, piece starts at %llu", (ull)w, (ull)t, doc[t], (ull)at);
                    at += pc[j].n_tokens;
                }
                for (uint64_t t = at; t <= L; t++) CHECK(tok[t] == 0, "window %llu: padding %llu", (ull)w, (ull)t);
                for (uint64_t t = at; t < L; t++) CHECK(doc[t] == (int32_t)at, "window %llu: padding's doc", (ull)w);
            }
            /* concat on the same range splits more documents; best fit pads under 10% here */
            tks_sampler *c;
            tks_pack_stats cs;
            CHECK(tks_sampler_create_packed(ds, b, e, L, 5, TKS_PACK_CONCAT, 1, &c) == 0 &&
                      tks_sampler_pack_stats(c, &cs) == 0, "concat");
            CHECK(st.docs_split_short == 0 && cs.docs_split_short > 0 && cs.docs_split_short <= cs.docs_split,
                  "L %u: documents that fit but were split: best-fit %llu, concat %llu of %llu", L,
                  (ull)st.docs_split_short, (ull)cs.docs_split_short, (ull)cs.docs_split);
            CHECK(cs.docs == docs && cs.pad_tokens == 0 && cs.docs_split > split,
                  "L %u: concat %llu docs, %llu split; best-fit %llu split", L, (ull)cs.docs, (ull)cs.docs_split,
                  (ull)split);
            CHECK(st.pad_tokens * 10 < st.capacity, "L %u: padding %llu of %llu", L, (ull)st.pad_tokens, (ull)st.capacity);
            printf("packing L %u range %d: %llu windows, padding %.2f%%, %llu of %llu documents split (concat %llu)\n",
                   L, ri, (ull)nw, 100.0 * (double)st.pad_tokens / (double)st.capacity, (ull)split, (ull)docs,
                   (ull)cs.docs_split);
            tks_sampler_free(c);
            tks_sampler_free(s1);
            tks_sampler_free(s3);
        }
    free(ref);
    free(got);
    free(got3);
    free(load);
    free(load3);
    free(tok);
    free(doc);
    tks_dataset_close(ds);
    stream_free(&S);
}

/* ---- plan files: a world of ranks as threads --------------------------------- */

#define FAKE_RANKS 3
typedef struct fake_world {
    pthread_barrier_t bar;
    pthread_mutex_t mu;
    uint64_t *acc;
    size_t n;
    int rc[FAKE_RANKS];
    tks_error err[FAKE_RANKS];
} fake_world;

typedef struct fake_rank {
    fake_world *fw;
    tks_pack_world W;
    const tks_dataset *ds;
    uint64_t b, e;
    uint32_t L;
    const char *dir;
    tks_sampler *s;
    int rc;
} fake_rank;

static int fake_sum(uint64_t *v, size_t n, void *ctx) {
    fake_rank *r = ctx;
    fake_world *f = r->fw;
    pthread_barrier_wait(&f->bar);
    if (r->W.rank == 0) {
        free(f->acc);
        f->acc = calloc(n ? n : 1, sizeof *f->acc);
        f->n = n;
    }
    pthread_barrier_wait(&f->bar);
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < n; i++) f->acc[i] += v[i];
    pthread_mutex_unlock(&f->mu);
    pthread_barrier_wait(&f->bar);
    memcpy(v, f->acc, n * sizeof *v);
    pthread_barrier_wait(&f->bar);
    return 0;
}

static int fake_agree(int rc, void *ctx) {
    fake_rank *r = ctx;
    fake_world *f = r->fw;
    f->rc[r->W.rank] = rc;
    f->err[r->W.rank] = *tks_last_error();
    pthread_barrier_wait(&f->bar);
    int first = -1;
    for (int k = 0; k < FAKE_RANKS && first < 0; k++)
        if (f->rc[k]) first = k;
    int out = first < 0 ? 0 : f->rc[first];
    if (first >= 0) tks_error_restore(&f->err[first]);
    pthread_barrier_wait(&f->bar);
    return out;
}

static void *fake_main(void *arg) {
    fake_rank *r = arg;
    r->rc = tks_sampler_create_planned(r->ds, r->b, r->e, r->L, 5, 1, r->dir, &r->W, &r->s);
    return NULL;
}

/* The plan file of FAKE_RANKS ranks planning together: rank 0's sampler
 * (the others are freed); their rc must agree. */
static int plan_by_ranks(const tks_dataset *ds, uint64_t b, uint64_t e, uint32_t L, const char *dir,
                         tks_sampler **out) {
    fake_world f = {0};
    pthread_barrier_init(&f.bar, NULL, FAKE_RANKS);
    pthread_mutex_init(&f.mu, NULL);
    fake_rank r[FAKE_RANKS];
    pthread_t th[FAKE_RANKS];
    for (int k = 0; k < FAKE_RANKS; k++) {
        r[k] = (fake_rank){.fw = &f, .W = {k, FAKE_RANKS, fake_sum, fake_agree, &r[k]}, .ds = ds, .b = b, .e = e,
                           .L = L, .dir = dir};
        pthread_create(&th[k], NULL, fake_main, &r[k]);
    }
    for (int k = 0; k < FAKE_RANKS; k++) pthread_join(th[k], NULL);
    for (int k = 1; k < FAKE_RANKS; k++) {
        CHECK(r[k].rc == r[0].rc, "rank %d returned %d, rank 0 %d", k, r[k].rc, r[0].rc);
        tks_sampler_free(r[k].s);
    }
    if (r[0].rc) tks_error_restore(&f.err[0]);
    *out = r[0].s;
    free(f.acc);
    pthread_barrier_destroy(&f.bar);
    pthread_mutex_destroy(&f.mu);
    return r[0].rc;
}

static int same_file(const char *a, const char *b) {
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    int same = x && y;
    while (same) {
        int c = fgetc(x), d = fgetc(y);
        if (c != d) same = 0;
        if (c == EOF) break;
    }
    if (x) fclose(x);
    if (y) fclose(y);
    return same;
}

static void copy_file(const char *from, const char *to) {
    FILE *x = fopen(from, "rb"), *y = fopen(to, "wb");
    int c;
    while (x && y && (c = fgetc(x)) != EOF) fputc(c, y);
    if (x) fclose(x);
    if (y) fclose(y);
}

/* A byte of file p at offset at, xor'ed with m. */
static void flip(const char *p, long at, int m) {
    FILE *f = fopen(p, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ m, f);
    fclose(f);
}

/* Plan files (tks_sampler_create_planned): the same windows as the in-memory
 * plan, the same bytes from one process and from FAKE_RANKS ranks planning
 * their shares, reused when present, refused when damaged or stale, never
 * left half-written under the final name. */
static void test_plan_files(void) {
    char dir[PATH_MAX], d1[PATH_MAX], d3[PATH_MAX], d4[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/pack", work); /* test_packing's dataset */
    snprintf(d1, sizeof d1, "%s/plans1/sub", work);
    snprintf(d3, sizeof d3, "%s/plans3", work);
    snprintf(d4, sizeof d4, "%s/plans4", work);
    tks_dataset *ds = open_ds(dir);
    const uint64_t n = tks_dataset_n_tokens(ds), b = 101, e = n - 57;
    const uint32_t L = 16; /* groups of 17,408 tokens: many groups, so every rank packs some */
    seg *sm = malloc(n * sizeof *sm), *sf = malloc(n * sizeof *sf);
    uint64_t *lm = malloc(n * sizeof *lm), *lf = malloc(n * sizeof *lf);
    tks_sampler *m, *p1, *p3, *again;
    CHECK(tks_sampler_create_packed(ds, b, e, L, 5, TKS_PACK_BEST_FIT, 2, &m) == 0, "in memory");
    CHECK(tks_sampler_plan_path(m) == NULL, "an in-memory plan has no file");
    CHECK(tks_sampler_create_planned(ds, b, e, L, 5, 2, d1, NULL, &p1) == 0, "planned: %s", tks_last_error()->message);
    CHECK(plan_by_ranks(ds, b, e, L, d3, &p3) == 0, "planned by %d ranks: %s", FAKE_RANKS, tks_last_error()->message);
    if (!p1 || !p3) return;
    tks_pack_stats st, s1, s3;
    tks_sampler_pack_stats(m, &st), tks_sampler_pack_stats(p1, &s1), tks_sampler_pack_stats(p3, &s3);
    CHECK(st.groups >= 2 * FAKE_RANKS, "only %llu groups", (ull)st.groups);
    st.seconds = s1.seconds = s3.seconds = 0;
    CHECK(!memcmp(&st, &s1, sizeof st) && !memcmp(&st, &s3, sizeof st), "plan file stats differ from memory's");
    const char *f1 = tks_sampler_plan_path(p1), *f3 = tks_sampler_plan_path(p3);
    CHECK(f1 && f3 && !strncmp(f1, d1, strlen(d1)) && !strcmp(strrchr(f1, '/'), strrchr(f3, '/')),
          "plan paths %s, %s", f1 ? f1 : "(none)", f3 ? f3 : "(none)");
    CHECK(same_file(f1, f3), "the plan of 1 process and of %d ranks differ: %s %s", FAKE_RANKS, f1, f3);
    size_t km = all_segments(ds, m, sm, lm), k1 = all_segments(ds, p1, sf, lf);
    CHECK(km == k1 && !memcmp(sm, sf, km * sizeof *sm) && !memcmp(lm, lf, st.windows * sizeof *lm),
          "windows from the plan file differ from the in-memory plan's");
    for (uint64_t g = 0; g < 3 * st.windows; g += 13)
        CHECK(tks_sampler_window(m, g) == tks_sampler_window(p1, g), "order differs at %llu", (ull)g);
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", f3);
    CHECK(access(partial, F_OK) != 0, "%s left behind", partial);
    /* present: mapped and checked, not made again */
    struct stat st0, st1;
    stat(f1, &st0);
    CHECK(tks_sampler_create_planned(ds, b, e, L, 5, 2, d1, NULL, &again) == 0, "reopen: %s", tks_last_error()->message);
    stat(f1, &st1);
    CHECK(st0.st_ino == st1.st_ino && st0.st_mtime == st1.st_mtime, "the plan file was rewritten on reuse");
    tks_sampler_free(again);
    char keep[PATH_MAX + 8];
    snprintf(keep, sizeof keep, "%s.keep", f1);
    copy_file(f1, keep);
    /* damaged: a body byte, a header byte, a cut file */
    const struct { long at; const char *why; int code; } dmg[] = {
        {(long)st0.st_size - 3, "checksum mismatch", TKS_ERR_CHECKSUM},
        {60, "header checksum", TKS_ERR_CHECKSUM},
        {-1, "size or counts", TKS_ERR_TRUNCATED}};
    for (int i = 0; i < 3; i++) {
        copy_file(keep, f1);
        if (dmg[i].at >= 0) flip(f1, dmg[i].at, 0x10);
        else CHECK(truncate(f1, st0.st_size - 4) == 0, "truncate");
        tks_sampler *x = NULL;
        int rc = tks_sampler_create_planned(ds, b, e, L, 5, 2, d1, NULL, &x);
        const char *msg = tks_last_error()->message;
        CHECK(rc == dmg[i].code && x == NULL && strstr(msg, f1) && strstr(msg, dmg[i].why) && strstr(msg, "delete it"),
              "damaged plan (%s): rc %d: %s", dmg[i].why, rc, msg);
    }
    /* stale: a plan of another seq_len under this one's name */
    tks_sampler *o = NULL;
    CHECK(tks_sampler_create_planned(ds, b, e, L + 8, 5, 2, d4, NULL, &o) == 0, "L %u", L + 8);
    if (o) {
        char other[PATH_MAX];
        snprintf(other, sizeof other, "%s", tks_sampler_plan_path(o));
        tks_sampler_free(o);
        copy_file(keep, other);
        int rc = tks_sampler_create_planned(ds, b, e, L + 8, 5, 2, d4, NULL, &o);
        CHECK(rc == TKS_ERR_HEADER && strstr(tks_last_error()->message, "stale"), "stale plan: rc %d: %s", rc,
              tks_last_error()->message);
        /* deleted: made again, the same bytes */
        unlink(other);
        CHECK(tks_sampler_create_planned(ds, b, e, L + 8, 5, 2, d4, NULL, &o) == 0, "remade");
        tks_sampler_free(o);
    }
    /* another run making the same plan file holds <name>.lock: refused, named */
    {
        char d5[PATH_MAX], lockp[PATH_MAX + 64];
        snprintf(d5, sizeof d5, "%s/plans5", work);
        mkdirs(d5);
        snprintf(lockp, sizeof lockp, "%s%s.lock", d5, strrchr(f1, '/'));
        int fd = -1;
        CHECK(tks_lock(lockp, "a test holding the plan", &fd) == 0, "lock %s", lockp);
        tks_sampler *x = NULL;
        int rc = tks_sampler_create_planned(ds, b, e, L, 5, 2, d5, NULL, &x);
        CHECK(rc == TKS_ERR_LOCKED && x == NULL && strstr(tks_last_error()->message, "a test holding the plan"),
              "plan locked by another maker: rc %d: %s", rc, tks_last_error()->message);
        tks_unlock(fd, lockp);
        CHECK(tks_sampler_create_planned(ds, b, e, L, 5, 2, d5, NULL, &x) == 0, "after the lock: %s",
              tks_last_error()->message);
        tks_sampler_free(x);
    }
    plan_links(ds, b, e, L, strrchr(f1, '/') + 1);
    copy_file(keep, f1);
    unlink(keep);
    printf("plan files: %llu groups, %llu windows, %lld bytes; 1 process and %d ranks wrote the same file\n",
           (ull)st.groups, (ull)st.windows, (long long)st0.st_size, FAKE_RANKS);
    tks_sampler_free(m);
    tks_sampler_free(p1);
    tks_sampler_free(p3);
    free(sm), free(sf), free(lm), free(lf);
    tks_dataset_close(ds);
}

/* Links planted at a plan's predictable names in a --pack-plans directory
 * others share (name: the plan file's name): at <name>.partial the plan is
 * made anyway, never through the link; at <name>.lock the making is
 * refused, naming the lock; the file they point at is unchanged either way. */
static void plan_links(tks_dataset *ds, uint64_t b, uint64_t e, uint32_t L, const char *name) {
    static const char victim_text[] = "the victim's own file\n";
    char d[PATH_MAX], victim[PATH_MAX + 16], nowhere[PATH_MAX + 32];
    snprintf(d, sizeof d, "%s/plans-links", work);
    mkdirs(d);
    snprintf(victim, sizeof victim, "%s/victim", d);
    snprintf(nowhere, sizeof nowhere, "%s/created-through-a-link", d);
    FILE *f = fopen(victim, "w");
    CHECK(f && fputs(victim_text, f) >= 0, "write %s", victim);
    if (f) fclose(f);
    static const char *const kind[] = {"a symbolic link", "a dangling symbolic link", "a hard link"};
    for (int at_lock = 0; at_lock < 2; at_lock++) {
        for (int k = 0; k < 3; k++) {
            char plan[PATH_MAX * 2], planted[PATH_MAX * 2 + 16];
            snprintf(plan, sizeof plan, "%s/%s", d, name);
            snprintf(planted, sizeof planted, "%s%s", plan, at_lock ? ".lock" : ".partial");
            unlink(plan);
            int made = k == 0 ? symlink(victim, planted) : k == 1 ? symlink(nowhere, planted) : link(victim, planted);
            CHECK(made == 0, "plant %s", planted);
            tks_sampler *x = NULL;
            int rc = tks_sampler_create_planned(ds, b, e, L, 5, 2, d, NULL, &x);
            const char *m = tks_last_error()->message;
            if (at_lock)
                CHECK(rc == TKS_ERR_IO && !x && strstr(m, planted) && strstr(m, k == 2 ? "links" : "symbolic link"),
                      "%s at %s: rc %d: %s", kind[k], planted, rc, m);
            else
                CHECK(rc == 0 && x, "%s at %s: rc %d: %s", kind[k], planted, rc, m);
            tks_sampler_free(x);
            char got[64] = "";
            FILE *v = fopen(victim, "rb");
            size_t n = v ? fread(got, 1, sizeof got, v) : 0;
            if (v) fclose(v);
            CHECK(n == sizeof victim_text - 1 && !memcmp(got, victim_text, n), "%s at %s: %s was written through",
                  kind[k], planted, victim);
            CHECK(access(nowhere, F_OK) != 0, "%s at %s: %s was created through it", kind[k], planted, nowhere);
            unlink(planted);
            unlink(nowhere); /* each case from an intact victim */
            if ((f = fopen(victim, "w"))) fputs(victim_text, f), fclose(f);
        }
    }
}

/* ---------------------------------------------------------------------------
 * The batch loader: a step's micro-batches and training targets from the
 * blend, the cursor moved in one place, any layout and a resume the same
 * ------------------------------------------------------------------------- */

enum { LD_B = 12, LD_L = 16, LD_STEPS = 5 };

/* The rows of global samples [first, first + n) read directly: the blend's
 * picks from the start of the run, then each source's window. */
static void loader_ref_rows(const tks_blend *bl, tks_sampler *const *src, uint64_t first, uint64_t n,
                            int32_t *ids, int32_t *tg, int32_t *doc) {
    tks_blend_pick pk[LD_B];
    tks_blend_state zero = {0};
    uint32_t tok[LD_L + 1];
    CHECK(tks_blend_picks(bl, &zero, first, n, pk) == 0, "reference picks");
    for (uint64_t i = 0; i < n; i++) {
        tks_sampler *s = src[pk[i].source];
        CHECK(tks_sampler_load_row(s, tks_sampler_window(s, pk[i].index), 0, tok, ids, tg, doc, i) == 0,
              "reference row: %s", tks_last_error()->message);
    }
}

/* The training targets of step `step` counted directly. */
static uint64_t loader_ref_targets(const tks_blend *bl, tks_sampler *const *src, uint64_t step) {
    tks_blend_pick pk[LD_B];
    tks_blend_state zero = {0};
    CHECK(tks_blend_picks(bl, &zero, step * LD_B, LD_B, pk) == 0, "reference picks");
    uint64_t n = 0;
    for (int i = 0; i < LD_B; i++) {
        tks_sampler *s = src[pk[i].source];
        n += tks_sampler_packing(s) == TKS_PACK_CONCAT
                 ? LD_L : tks_sampler_window_real(s, tks_sampler_window(s, pk[i].index)) - 1;
    }
    return n;
}

/* One rank of one layout over steps [from, LD_STEPS): every micro-batch,
 * the targets and the cursor against the direct reading. */
static void loader_run(const tks_blend *bl, tks_sampler *const *src, uint32_t dp, uint32_t rank, uint64_t micro,
                       uint64_t from) {
    tks_loader_config c = {.blend = bl, .vocab = 0, .seq_len = LD_L, .global_batch = LD_B, .micro = micro,
                           .dp = dp, .dp_rank = rank, .documents = 1, .steps = LD_STEPS - from};
    c.train[0] = src[0], c.train[1] = src[1];
    tks_blend_seek(bl, &c.start, from * LD_B); /* a resume: the state a checkpoint keeps */
    tks_batch_loader *l;
    CHECK(tks_loader_open(&c, &l) == 0, "open dp %u rank %u micro %llu: %s", dp, rank, (ull)micro,
          tks_last_error()->message);
    int32_t ids[LD_B * LD_L], tg[LD_B * LD_L], doc[LD_B * LD_L];
    uint64_t per = LD_B / dp, bad = 0;
    for (uint64_t st = from; st < LD_STEPS; st++) {
        tks_blend_state want = {0};
        tks_blend_seek(bl, &want, st * LD_B);
        CHECK(!memcmp(tks_loader_at(l), &want, sizeof want), "dp %u micro %llu step %llu: the blend at the "
              "step's start", dp, (ull)micro, (ull)st);
        CHECK(tks_loader_step_targets(l) == loader_ref_targets(bl, src, st), "dp %u micro %llu step %llu: "
              "targets %llu", dp, (ull)micro, (ull)st, (ull)tks_loader_step_targets(l));
        for (uint64_t k = 0; k < per / micro; k++) {
            tks_loaded_batch b;
            CHECK(tks_loader_next(l, &b) == 0, "next: %s", tks_last_error()->message);
            size_t N = (size_t)micro * LD_L;
            loader_ref_rows(bl, src, st * LD_B + rank * per + k * micro, micro, ids, tg, doc);
            bad += memcmp(b.ids, ids, N * 4) || memcmp(b.targets, tg, N * 4) || memcmp(b.doc, doc, N * 4);
        }
        tks_loaded_batch b;
        CHECK(tks_loader_next(l, &b) == TKS_ERR_ARG, "a micro-batch past the step's");
        tks_loader_advance(l);
    }
    CHECK(bad == 0, "dp %u rank %u micro %llu from step %llu: %llu micro-batches differ from the direct "
          "reading", dp, rank, (ull)micro, (ull)from, (ull)bad);
    CHECK(tks_loader_at(l)->sample == LD_STEPS * LD_B, "the cursor after the last step");
    tks_loaded_batch b;
    CHECK(tks_loader_next(l, &b) == TKS_ERR_ARG && b.ids == NULL, "a step past the last");
    tks_loader_close(l);
}

static void test_loader(void) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/loader", work);
    stream S = write_dataset(dir, 300, 40, 500, 1500);
    tks_dataset *ds = open_ds(dir);
    tks_sampler *src[2];
    CHECK(tks_sampler_create(ds, 0, S.n, LD_L, 3, &src[0]) == 0, "concat source");
    CHECK(tks_sampler_create_packed(ds, 0, S.n, LD_L, 4, TKS_PACK_BEST_FIT, 1, &src[1]) == 0, "best-fit source");
    /* two phases: the change inside step 2 */
    tks_blend bl;
    uint64_t start[2] = {0, 2 * LD_B + 5};
    double w[4] = {0.6, 0.4, 0.1, 0.9};
    CHECK(tks_blend_init(&bl, 2, 2, start, w, NULL) == 0, "blend");
    static const struct { uint32_t dp; uint64_t micro; } lay[] = {{1, 12}, {1, 4}, {2, 3}, {3, 2}, {4, 1}};
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++)
        for (uint32_t r = 0; r < lay[i].dp; r++) loader_run(&bl, src, lay[i].dp, r, lay[i].micro, 0);
    loader_run(&bl, src, 2, 1, 2, 2); /* resumed at step 2 */
    /* refusals */
    tks_loader_config c = {.blend = &bl, .seq_len = LD_L, .global_batch = LD_B, .micro = 3, .dp = 2, .dp_rank = 2,
                           .steps = 1};
    c.train[0] = src[0], c.train[1] = src[1];
    tks_batch_loader *l = (tks_batch_loader *)&c; /* not NULL: a refusal sets it to NULL */
    CHECK(tks_loader_open(&c, &l) == TKS_ERR_ARG && l == NULL, "dp_rank >= dp");
    c.dp_rank = 0, c.micro = 5;
    CHECK(tks_loader_open(&c, &l) == TKS_ERR_ARG && strstr(tks_last_error()->message, "micro-batch 5"),
          "micro-batch 5 of 6: %s", tks_last_error()->message);
    c.micro = 3, c.train[1] = NULL;
    CHECK(tks_loader_open(&c, &l) == TKS_ERR_ARG, "a source without a sampler");
    tks_loader_close(NULL);
    tks_sampler_free(src[0]);
    tks_sampler_free(src[1]);
    tks_dataset_close(ds);
    stream_free(&S);
}

int main(int argc, char **argv) {
    snprintf(work, sizeof work, "%s", argc > 1 ? argv[1] : "/tmp/tks-test-sampler");
    mkdirs(work);
    test_perm_bijection();
    test_perm_statistics();
    test_windows();
    test_epochs();
    test_layouts();
    test_split();
    test_token_range();
    test_advice();
    test_blend();
    test_packing();
    test_plan_files();
    test_loader();
    test_speed();
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("all sampler checks passed\n");
    return 0;
}
