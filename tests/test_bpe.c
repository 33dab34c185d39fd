/*
 * The byte-level BPE tokenizer (tokenizer/bpe*.c) against Hugging Face
 * `tokenizers` (tokenizer.json) and tiktoken (tiktoken files), id for id.
 *
 * Usage: test_bpe PEER_DIR MODEL...   (ids and decodes compared)
 *        test_bpe --refusals WORKDIR  (the loader's refusals)
 *        test_bpe --long PEER_DIR MODEL (a 1 MB single word, timed)
 * PEER_DIR holds what tests/bpe_peer.py wrote: docs.bin, MODEL.json (or
 * MODEL.tiktoken, MODEL.pattern, MODEL.specials), MODEL.ids, MODEL.ids-allow,
 * MODEL.dec, MODEL.special, peer-speed.txt. Exit 0 when every check passes,
 * 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include <omp.h>

#include "tokenizer/tokenizer.h"

static int fails;
#define CHECK(cond, ...)                                                                               \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
            fprintf(stderr, __VA_ARGS__);                                                              \
            fputc('\n', stderr);                                                                       \
            fails++;                                                                                   \
        }                                                                                              \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct docs {
    char *buf; /* the file, which p[] points into */
    char **p;
    size_t *len, n;
} docs;

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[sz] = 0, *n = (size_t)sz;
    return b;
}

/* docs.bin's format: u64 little-endian length, then the bytes */
static int read_docs(const char *path, docs *d) {
    size_t n;
    char *b = slurp(path, &n);
    if (!b) return -1;
    memset(d, 0, sizeof *d);
    d->buf = b;
    size_t cap = 0;
    for (size_t i = 0; i + 8 <= n;) {
        uint64_t l = 0;
        for (int k = 7; k >= 0; k--) l = l << 8 | (uint8_t)b[i + (size_t)k];
        i += 8;
        if (l > n - i) return -1;
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            d->p = realloc(d->p, cap * sizeof *d->p);
            d->len = realloc(d->len, cap * sizeof *d->len);
        }
        d->p[d->n] = b + i;
        d->len[d->n++] = (size_t)l;
        i += (size_t)l;
    }
    return 0;
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        size_t k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (k == 9 || i + k >= n + (k == 0)) return k == 0;
        for (size_t j = 1; j <= k; j++)
            if (((uint8_t)s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* MODEL.json, or MODEL.tiktoken with MODEL.pattern (and MODEL.specials). */
static tks_bpe *load_model(const char *dir, const char *name) {
    char path[4096], pat[4096], sp[8192];
    tks_bpe *b = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/%s.tiktoken", dir, name);
    struct stat st;
    if (stat(path, &st) == 0) {
        size_t n;
        snprintf(pat, sizeof pat, "%s/%s.pattern", dir, name);
        char *p = slurp(pat, &n);
        snprintf(sp, sizeof sp, "%s/%s.specials", dir, name);
        char *s = slurp(sp, &n);
        if (p) p[strcspn(p, "\n")] = 0;
        if (s) s[strcspn(s, "\n")] = 0;
        tks_tiktoken_opts o = {p, s};
        rc = tks_bpe_load_tiktoken(path, &o, &b);
        free(p);
        free(s);
    } else {
        snprintf(path, sizeof path, "%s/%s.json", dir, name);
        rc = tks_bpe_load(path, &b);
    }
    if (rc) {
        fprintf(stderr, "FAIL %s: load: %s: %s\n", name, tks_strerror(rc), tks_last_error()->message);
        fails++;
        return NULL;
    }
    return b;
}

/* Every document, 2 threads at once on the one handle, into got[]. */
static void encode_all(const char *name, tks_bpe *b, const docs *d, tks_ids *got) {
    int bad_rc = 0;
#pragma omp parallel for schedule(dynamic, 16) num_threads(2)
    for (size_t i = 0; i < d->n; i++)
        if (tks_bpe_encode(b, d->p[i], d->len[i], &got[i])) {
#pragma omp atomic write
            bad_rc = 1;
        }
    CHECK(!bad_rc, "%s: an encode failed", name);
}

/* Documents made of code points Unicode 14 leaves unassigned (docs.newer:
 * bpe_peer.py), which PCRE2 10.42's Unicode 14 tables and tiktoken's Rust
 * regex (Unicode 16) classify differently: a tiktoken peer's ids may differ
 * there, and only there. */
static unsigned char *newer;
static char newer_unicode[32];
static size_t n_exempt; /* differing documents among them, in the last compare_ids */

static void read_newer(const char *dir, size_t n_docs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/docs.newer", dir);
    size_t n;
    char *t = slurp(path, &n);
    newer = calloc(n_docs, 1);
    if (!t || !newer) return;
    char *p = strchr(t, ':');
    snprintf(newer_unicode, sizeof newer_unicode, "%.*s", p ? (int)(p - t) : 0, t);
    for (p = p ? p + 1 : t; *p;) {
        char *q;
        unsigned long i = strtoul(p, &q, 10);
        if (q == p) break;
        if (i < n_docs) newer[i] = 1;
        p = q;
    }
    free(t);
}

/* got[] against the peer's ids in `want_path` (one line a document): the
 * number of documents that differ (the first three are shown), leaving out
 * the docs.newer documents when `exempt` (their count: n_exempt). */
static size_t compare_ids(const char *name, const char *want_path, const tks_ids *got, const docs *d,
                          size_t *ids_total, int exempt) {
    size_t n_text, diff = 0;
    char *want = slurp(want_path, &n_text);
    if (!want) {
        CHECK(0, "%s: cannot read %s", name, want_path);
        return d->n;
    }
    char *line = want;
    *ids_total = 0;
    n_exempt = 0;
    for (size_t i = 0; i < d->n; i++) {
        char *end = strchr(line, '\n');
        if (!end) {
            CHECK(0, "%s: %s has fewer lines than documents", name, want_path);
            diff += d->n - i;
            break;
        }
        *end = 0;
        size_t k = 0, first = SIZE_MAX;
        for (char *p = line; *p;) {
            char *q;
            unsigned long v = strtoul(p, &q, 10);
            if (q == p) break;
            if (first == SIZE_MAX && (k >= got[i].n || got[i].ids[k] != v)) first = k;
            k++;
            p = q;
        }
        if (first == SIZE_MAX && k != got[i].n) first = k;
        *ids_total += k;
        if (first != SIZE_MAX && exempt && newer && newer[i]) {
            n_exempt++;
            first = SIZE_MAX;
        }
        if (first != SIZE_MAX && diff++ < 3)
            fprintf(stderr, "FAIL %s: document %zu (%zu bytes: \"%.60s\") gives %zu ids, the peer %zu (%s); first "
                    "difference at id %zu (ours %d)\n", name, i, d->len[i], d->p[i], got[i].n, k, want_path, first,
                    first < got[i].n ? (int)got[i].ids[first] : -1);
        line = end + 1;
    }
    free(want);
    return diff;
}

/* The long-document cut rule (tks_bpe_next_cut) on every document: cut
 * at every candidate at once, and at each of up to 24 candidates alone
 * (spread over the document), the parts' ids (tks_bpe_encode_part) joined
 * equal `whole`, the ids of the whole (which compare_model has checked
 * against the peer). Returns the candidates found. */
static size_t check_cuts(const char *name, const tks_bpe *b, const docs *d, const tks_ids *whole) {
    size_t cands = 0, cut_docs = 0, bad_all = 0, bad_one = 0;
    size_t *cut = NULL, cap = 0;
    tks_ids part = {0}, joined = {0};
    for (size_t i = 0; i < d->n; i++) {
        const char *t = d->p[i];
        size_t n = d->len[i], k = 0;
        for (size_t p = tks_bpe_next_cut(b, t, n, 1); p; p = tks_bpe_next_cut(b, t, n, p + 1)) {
            if (k == cap) {
                cap = cap ? 2 * cap : 1024;
                cut = realloc(cut, cap * sizeof *cut);
            }
            CHECK(p > 0 && p < n && (!k || p > cut[k - 1]), "%s: document %zu: cut %zu out of order", name, i, p);
            cut[k++] = p;
        }
        if (!k) continue;
        cands += k, cut_docs++;
        /* every candidate at once */
        joined.n = 0;
        size_t prev = 0;
        for (size_t c = 0; c <= k; c++) {
            size_t e = c < k ? cut[c] : n;
            uint64_t un;
            int rc = tks_bpe_encode_part(b, t + prev, e - prev, &part, &un);
            CHECK(!rc, "%s: document %zu part [%zu, %zu): %s", name, i, prev, e, tks_last_error()->message);
            if (joined.cap < joined.n + part.n) {
                joined.cap = 2 * (joined.n + part.n) + 64;
                joined.ids = realloc(joined.ids, joined.cap * sizeof *joined.ids);
            }
            memcpy(joined.ids + joined.n, part.ids, part.n * sizeof *part.ids);
            joined.n += part.n;
            prev = e;
        }
        if (joined.n != whole[i].n || memcmp(joined.ids, whole[i].ids, joined.n * sizeof *joined.ids)) {
            if (!bad_all++) fprintf(stderr, "FAIL %s: document %zu cut at its %zu candidates gives other ids\n", name, i, k);
        }
        /* candidates alone */
        size_t step = k / 24 + 1;
        for (size_t c = 0; c < k; c += step) {
            uint64_t un;
            size_t p = cut[c];
            tks_bpe_encode_part(b, t, p, &joined, &un);
            tks_bpe_encode_part(b, t + p, n - p, &part, &un);
            int same = joined.n + part.n == whole[i].n &&
                       !memcmp(joined.ids, whole[i].ids, joined.n * sizeof *joined.ids) &&
                       !memcmp(part.ids, whole[i].ids + joined.n, part.n * sizeof *part.ids);
            if (!same && !bad_one++)
                fprintf(stderr, "FAIL %s: document %zu cut at byte %zu alone gives other ids\n", name, i, p);
        }
    }
    CHECK(bad_all == 0 && bad_one == 0, "%s: the cut rule changed the ids of %zu documents cut at every candidate, "
          "%zu cut at one", name, bad_all, bad_one);
    printf("%s: cut rule: %zu candidates in %zu of %zu documents checked\n", name, cands, cut_docs, d->n);
    free(cut);
    tks_ids_free(&part);
    tks_ids_free(&joined);
    return cands;
}

/* 1 when a and b hold the same tokens (each id's bytes, special flag) and
 * fingerprint, and encode every document to `want`. */
static int same_handle(const char *name, const char *what, const tks_bpe *a, const tks_bpe *b, const docs *d,
                       const tks_ids *want) {
    int ok = tks_bpe_vocab_size(a) == tks_bpe_vocab_size(b) && !memcmp(tks_bpe_fingerprint(a), tks_bpe_fingerprint(b), 16);
    for (uint32_t id = 0; ok && id < tks_bpe_vocab_size(a); id++) {
        size_t la = 0, lb = 0;
        const char *x = tks_bpe_token_bytes(a, id, &la), *y = tks_bpe_token_bytes(b, id, &lb);
        ok = la == lb && (!la || !memcmp(x, y, la)) && tks_bpe_is_special(a, id) == tks_bpe_is_special(b, id);
        if (!ok) fprintf(stderr, "%s: %s: token %u differs\n", name, what, id);
    }
    tks_ids one = {0};
    size_t diff = 0;
    for (size_t i = 0; ok && i < d->n; i++) {
        int rc = tks_bpe_encode(b, d->p[i], d->len[i], &one);
        diff += rc || one.n != want[i].n || (one.n && memcmp(one.ids, want[i].ids, one.n * sizeof *one.ids));
    }
    tks_ids_free(&one);
    CHECK(ok && diff == 0, "%s: %s: not the freshly parsed tokenizer (%zu documents differ)", name, what, diff);
    return ok && diff == 0;
}

/* MODEL as load_model loads it, through tks_tok_load_opts with no_cache. */
static tks_tok *load_tok_no_cache(const char *dir, const char *name) {
    char path[4096], pat[4096], sp[8192];
    size_t n;
    snprintf(path, sizeof path, "%s/%s.tiktoken", dir, name);
    snprintf(pat, sizeof pat, "%s/%s.pattern", dir, name);
    snprintf(sp, sizeof sp, "%s/%s.specials", dir, name);
    struct stat st;
    char *p = NULL, *s = NULL;
    if (stat(path, &st) == 0) {
        p = slurp(pat, &n);
        s = slurp(sp, &n);
        if (p) p[strcspn(p, "\n")] = 0;
        if (s) s[strcspn(s, "\n")] = 0;
    } else {
        snprintf(path, sizeof path, "%s/%s.json", dir, name);
    }
    tks_tok_opts o = {.pattern = p, .special_tokens = s, .no_cache = 1};
    tks_tok *t = NULL;
    if (tks_tok_load_opts(path, &o, &t)) fprintf(stderr, "%s: %s\n", name, tks_last_error()->message);
    free(p);
    free(s);
    return t;
}

/* The one cache file in directory cdir into file[cap]; 0 when there is
 * none, or more than one. */
static int cache_file(const char *cdir, char *file, size_t cap) {
    DIR *d = opendir(cdir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tkc")) n++, snprintf(file, cap, "%s/%s", cdir, e->d_name);
    }
    if (d) closedir(d);
    return n == 1;
}

/* The tokenizer cache (tokenizer/bpe_cache.c) of a tokenizer.json or a
 * ranks file, in a directory of its own: the first load parses and writes
 * it, the second maps it and is the parsed tokenizer (every token, every
 * document's ids); a cache file with a flipped byte, cut short, or of
 * another build is ignored (the load parses again, the same tokenizer) and
 * written anew. */
static void check_cache(const char *dir, const char *name, const docs *d, const tks_ids *want) {
    char cdir[4096], file[4400];
    struct stat st;
    snprintf(cdir, sizeof cdir, "%s/cache-%s", dir, name);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cdir);
    if (system(cmd) != 0) return;
    setenv("TOKSHARD_CACHE_DIR", cdir, 1);
    tks_bpe *parsed = load_model(dir, name), *cached = NULL;
    CHECK(parsed && !tks_bpe_from_cache(parsed), "%s: first load did not parse", name);
    if (!parsed) goto out;
    CHECK(cache_file(cdir, file, sizeof file) && stat(file, &st) == 0, "%s: no cache file in %s after a parse",
          name, cdir);
    double t0 = now();
    cached = load_model(dir, name);
    CHECK(cached && tks_bpe_from_cache(cached), "%s: second load not from the cache", name);
    double ms = 1e3 * (now() - t0);
    if (!cached) goto out;
    int ok = same_handle(name, "cached", parsed, cached, d, want);
    tks_bpe_free(cached);
    cached = NULL;
    /* no_cache: a cache entry there is not read, and none is written */
    tks_tok *nc = load_tok_no_cache(dir, name);
    CHECK(nc && !tks_bpe_from_cache(tks_tok_bpe(nc)), "%s: a load with no_cache used the cache", name);
    if (nc) ok &= same_handle(name, "no_cache", parsed, tks_tok_bpe(nc), d, want);
    tks_tok_free(nc);
    unlink(file);
    nc = load_tok_no_cache(dir, name);
    CHECK(nc && !cache_file(cdir, file, sizeof file), "%s: a load with no_cache wrote a cache file", name);
    tks_tok_free(nc);
    tks_bpe_free(load_model(dir, name)); /* parsed, its cache written again for what follows */
    CHECK(cache_file(cdir, file, sizeof file) && stat(file, &st) == 0, "%s: no cache file after a parse", name);
    /* damage: a flipped byte in the middle, in the header's build identity,
     * the file cut short; each time the load parses and rewrites the file */
    static const char *what[] = {"a flipped body byte", "another build's header", "a file cut short"};
    for (int k = 0; k < 3; k++) {
        FILE *f = fopen(file, "r+b");
        if (!f) break;
        if (k == 0) fseek(f, (long)st.st_size / 2, SEEK_SET);
        else if (k == 1) fseek(f, 20, SEEK_SET); /* inside build_id */
        int c = k < 2 ? fgetc(f) : 0;
        if (k < 2) {
            fseek(f, -1, SEEK_CUR);
            fputc(c ^ 0x01, f);
        }
        fclose(f);
        if (k == 2 && truncate(file, st.st_size / 3) != 0) break;
        tks_bpe *again = load_model(dir, name);
        CHECK(again && !tks_bpe_from_cache(again), "%s: %s was used", name, what[k]);
        if (again) ok &= same_handle(name, what[k], parsed, again, d, want);
        tks_bpe_free(again);
        again = load_model(dir, name);
        CHECK(again && tks_bpe_from_cache(again), "%s: after %s, no new cache file", name, what[k]);
        tks_bpe_free(again);
    }
    /* a ranks file's cache is keyed by the pattern and the special tokens
     * too: each load below differs from the one before it in the pattern
     * alone, a special token's text alone or its id alone (the first from
     * the model's own, whose pattern is none of these), and must be parsed,
     * never served the entry just written */
    char tt[4096];
    snprintf(tt, sizeof tt, "%s/%s.tiktoken", dir, name);
    if (stat(tt, &st) == 0) {
        static const tks_tiktoken_opts other[] = {{"gpt2", ""}, {"qwen2", ""}, {"gpt2", "<|x|>=300000"},
                                                  {"gpt2", "<|y|>=300000"}, {"gpt2", "<|y|>=300001"}};
        for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
            tks_bpe *again = NULL;
            CHECK(tks_bpe_load_tiktoken(tt, &other[i], &again) == 0 && !tks_bpe_from_cache(again),
                  "%s: a cache entry of another pattern or special tokens was used (pattern %s, specials \"%s\")",
                  name, other[i].pattern, other[i].special_tokens);
            tks_bpe_free(again);
        }
    }
    /* a file others may write is not trusted */
    if (chmod(file, 0666) == 0) {
        tks_bpe *again = load_model(dir, name);
        CHECK(again && !tks_bpe_from_cache(again), "%s: a world-writable cache file was used", name);
        tks_bpe_free(again);
    }
    if (ok) printf("%s: tokenizer cache: the cached tokenizer is the parsed one (every token, every document), "
                   "loaded in %.1f ms; a flipped byte, another build's file, a cut file and a world-writable "
                   "one are ignored and rewritten; a load with no_cache neither reads nor writes it\n", name, ms);
out:
    tks_bpe_free(parsed);
    setenv("TOKSHARD_CACHE_DIR", "off", 1);
}

static int compare_model(const char *dir, const char *name, const docs *d, size_t n_held) {
    char path[4096];
    tks_bpe *b = load_model(dir, name);
    if (!b) return fails;
    snprintf(path, sizeof path, "%s/%s.dec", dir, name);
    docs dec;
    if (read_docs(path, &dec) || dec.n != d->n) {
        fprintf(stderr, "FAIL %s: cannot read %s\n", name, path);
        return ++fails;
    }
    tks_ids *got = calloc(d->n, sizeof *got), *again = calloc(d->n, sizeof *again);
    encode_all(name, b, d, got);
    size_t ids_total = 0, dec_same = 0, dec_lossy = 0;
    snprintf(path, sizeof path, "%s/%s.ids", dir, name);
    struct stat tst;
    char tt[4096];
    snprintf(tt, sizeof tt, "%s/%s.tiktoken", dir, name);
    int tiktoken = stat(tt, &tst) == 0;
    size_t diff = compare_ids(name, path, got, d, &ids_total, tiktoken), exempt = n_exempt;
    CHECK(diff == 0, "%s: %zu of %zu documents give other ids than the peer", name, diff, d->n);
    if (n_exempt)
        printf("%s: %zu documents of code points %s does not assign give other ids than tiktoken, whose "
               "regex reads a later Unicode (PCRE2's tables here are %s's)\n", name, n_exempt, newer_unicode,
               newer_unicode);
    for (size_t i = 0; i < d->n; i++) {
        /* decode: the peer's text, where ours is valid UTF-8 (tokenizers
         * replaces bad sequences with U+FFFD) */
        char *t;
        size_t tl;
        int rc = tks_bpe_decode(b, got[i].ids, got[i].n, &t, &tl);
        CHECK(!rc, "%s: decode of document %zu: %s", name, i, tks_last_error()->message);
        if (!rc) {
            if (!valid_utf8(t, tl)) dec_lossy++;
            else if (tl == dec.len[i] && !memcmp(t, dec.p[i], tl)) dec_same++;
            else CHECK(0, "%s: decode of document %zu differs from the peer's (%zu vs %zu bytes)", name, i, tl,
                       dec.len[i]);
            free(t);
        }
    }
    printf("%s: %zu of %zu documents identical to the peer's ids (%zu ids); decode identical on %zu, %zu not "
           "UTF-8 (bytes without a token dropped, or a token that ends inside a character)\n", name,
           d->n - diff - exempt, d->n, ids_total, dec_same, dec_lossy);
    tks_encoder_stats st;
    tks_bpe_encoder_stats(b, &st);
    CHECK(st.words > 0 && st.word_hits > 0, "%s: the word cache was not used", name);
    printf("%s: word cache hits %.1f%% of %llu pieces; %llu special tokens' text encoded as text\n", name,
           st.words ? 100.0 * (double)st.word_hits / (double)st.words : 0.0, (unsigned long long)st.words,
           (unsigned long long)st.special_in_text);

    check_cache(dir, name, d, got);

    /* a tokenizer whose pre-tokenizer is one of the hand-matched patterns
     * (bpe_pretok.c) admits cuts; the real documents hold many */
    size_t cands = check_cuts(name, b, d, got);
    if (strcmp(name, "behaviors")) /* its splitters are not a hand-matched pattern */
        CHECK(cands > 0, "%s: the cut rule found no candidate in %zu real documents", name, d->n);

    /* the same ids without the word cache */
    tks_bpe_set_word_cache(b, 0);
    encode_all(name, b, d, again);
    size_t same = 0;
    for (size_t i = 0; i < d->n; i++)
        same += again[i].n == got[i].n &&
                (got[i].n == 0 || !memcmp(again[i].ids, got[i].ids, got[i].n * sizeof *got[i].ids));
    CHECK(same == d->n, "%s: %zu of %zu documents give other ids without the word cache", name, d->n - same, d->n);
    tks_bpe_set_word_cache(b, 1);

    /* special tokens matched in the text, where the peer gave those ids */
    snprintf(path, sizeof path, "%s/%s.ids-allow", dir, name);
    struct stat sst;
    if (stat(path, &sst) == 0) {
        CHECK(tks_bpe_set_allow_special(b, 1) == 0, "%s: allow special: %s", name, tks_last_error()->message);
        encode_all(name, b, d, again);
        size_t n_allow = 0;
        diff = compare_ids(name, path, again, d, &n_allow, tiktoken);
        CHECK(diff == 0, "%s: with special tokens allowed in the text, %zu of %zu documents give other ids", name,
              diff, d->n);
        printf("%s: special tokens allowed in the text: %zu of %zu documents identical (%zu ids; %zu of code "
               "points %s does not assign differ)\n", name, d->n - diff - n_exempt, d->n, n_allow, n_exempt,
               newer_unicode);
        tks_bpe_set_allow_special(b, 0);
    }

    /* special tokens decode to their content */
    snprintf(path, sizeof path, "%s/%s.special", dir, name);
    size_t sn;
    char *sp = slurp(path, &sn);
    for (char *l = sp; l && *l;) {
        char *e = strchr(l, '\n');
        if (!e) break;
        *e = 0;
        uint32_t id = (uint32_t)strtoul(l, NULL, 10);
        const char *content = strchr(l, ' ') + 1;
        char *t;
        size_t tl;
        CHECK(tks_bpe_is_special(b, id), "%s: id %u not special", name, id);
        if (!tks_bpe_decode(b, &id, 1, &t, &tl)) {
            CHECK(tl == strlen(content) && !memcmp(t, content, tl), "%s: special %u decodes to \"%s\"", name, id, t);
            free(t);
        }
        l = e + 1;
    }
    free(sp);
    /* a gap between a tiktoken file's ranks and its specials is no token */
    for (uint32_t id = 0; id < tks_bpe_vocab_size(b); id++)
        if (!tks_bpe_is_token(b, id)) {
            char *t = NULL;
            CHECK(tks_bpe_decode(b, &id, 1, &t, NULL) == TKS_ERR_TOKEN_RANGE, "%s: gap %u decodes", name, id);
            free(t);
        }

    /* one thread, the held-out real documents */
    size_t bytes = 0;
    tks_ids one = {0};
    double t0 = now();
    for (size_t i = 0; i < n_held; i++) {
        tks_bpe_encode(b, d->p[i], d->len[i], &one);
        bytes += d->len[i];
    }
    double dt = now() - t0;
    printf("%s: one thread %.2f MB/s on %zu real documents (%.1f MB)\n", name, bytes / dt / 1e6, n_held,
           bytes / 1e6);
    tks_ids_free(&one);
    for (size_t i = 0; i < d->n; i++) {
        tks_ids_free(&got[i]);
        tks_ids_free(&again[i]);
    }
    free(got);
    free(again);
    free(dec.buf);
    free(dec.p);
    free(dec.len);
    tks_bpe_free(b);
    return 0;
}

/* Creates dir/name for writing (its path into path[cap]); NULL, counted as
 * a failure, when it cannot. */
static FILE *create_case(const char *dir, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    return f;
}

/* Writes `json` to dir/name and loads it: the load must fail with `code` and
 * a message naming the file and containing `key`. */
static void refused(const char *dir, const char *name, const char *json, int code, const char *key) {
    char path[4096];
    FILE *f = create_case(dir, name, path, sizeof path);
    if (!f) return;
    fputs(json, f);
    fclose(f);
    tks_bpe *b = (tks_bpe *)1;
    int rc = tks_bpe_load(path, &b);
    const tks_error *e = tks_last_error();
    CHECK(rc == code && !b, "%s: load gave %d, expected %d", name, rc, code);
    CHECK(strstr(e->message, path) && strcmp(e->file, path) == 0, "%s: the error does not name the file: %s", name,
          e->message);
    CHECK(strstr(e->message, key), "%s: the error does not name \"%s\": %s", name, key, e->message);
    if (rc == code) printf("refused %s: %s\n", name, e->message);
    tks_bpe_free(b == (tks_bpe *)1 ? NULL : b);
}

/* A tiktoken ranks file: every byte as rank 0..255 (base64 of each), then
 * `extra` lines; loaded with `pattern` and `specials`, refused with `code`,
 * the message naming the file and `key`; code 0: it must load. */
static void tiktoken_case(const char *dir, const char *name, const char *extra, const char *pattern,
                          const char *specials, int code, const char *key, int skip_byte) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char path[4096];
    FILE *f = create_case(dir, name, path, sizeof path);
    if (!f) return;
    for (unsigned x = 0, r = 0; x < 256; x++) {
        if ((int)x == skip_byte) continue;
        fprintf(f, "%c%c== %u\n", A[x >> 2], A[(x & 3) << 4], r++);
    }
    fputs(extra, f);
    fclose(f);
    tks_bpe *b = (tks_bpe *)1;
    tks_tiktoken_opts o = {pattern, specials};
    int rc = tks_bpe_load_tiktoken(path, &o, &b);
    const tks_error *e = tks_last_error();
    if (!code) {
        CHECK(rc == 0 && b, "%s: a valid ranks file is refused: %s", name, e->message);
        if (!rc) {
            tks_ids ids = {0};
            CHECK(tks_bpe_encode(b, "aab", 3, &ids) == 0 && ids.n == 2 && ids.ids[0] == 256 && ids.ids[1] == 'b',
                  "%s: \"aa\" (rank 256) then \"b\"", name);
            tks_ids_free(&ids);
            tks_bpe_free(b);
        }
        return;
    }
    CHECK(rc == code && !b, "%s: load gave %d, expected %d", name, rc, code);
    CHECK(strstr(e->message, path) != NULL, "%s: the error does not name the file: %s", name, e->message);
    CHECK(strstr(e->message, key), "%s: the error does not name \"%s\": %s", name, key, e->message);
    if (rc == code) printf("refused %s: %s\n", name, e->message);
    tks_bpe_free(b == (tks_bpe *)1 ? NULL : b);
}

/* --pattern llama3 and llama3.1 bring Llama 3's 256 special tokens (Meta's
 * tokenizer.model is a ranks file without them), BOS <|begin_of_text|> and
 * EOS <|end_of_text|>; the two lists differ from 128004 on. */
static void llama3_specials(const char *dir) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char path[4096];
    FILE *f = create_case(dir, "llama3.tiktoken", path, sizeof path);
    if (!f) return;
    for (unsigned x = 0; x < 256; x++) fprintf(f, "%c%c== %u\n", A[x >> 2], A[(x & 3) << 4], x);
    fclose(f);
    static const struct { const char *pattern; uint32_t id; const char *text; } want[] = {
        {"llama3", 128000, "<|begin_of_text|>"}, {"llama3", 128009, "<|eot_id|>"},
        {"llama3", 128008, "<|reserved_special_token_4|>"}, {"llama3", 128255, "<|reserved_special_token_250|>"},
        {"llama3.1", 128008, "<|eom_id|>"}, {"llama3.1", 128010, "<|python_tag|>"},
        {"llama3.1", 128255, "<|reserved_special_token_246|>"}, {"llama3.1", 128001, "<|end_of_text|>"}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        tks_tok_opts o = {.pattern = want[k].pattern};
        tks_tok *t = NULL;
        int rc = tks_tok_load_opts(path, &o, &t);
        CHECK(rc == 0, "--pattern %s: %s", want[k].pattern, tks_last_error()->message);
        if (rc) continue;
        size_t len = 0;
        const char *s = tks_bpe_token_bytes(tks_tok_bpe(t), want[k].id, &len);
        CHECK(s && len == strlen(want[k].text) && !memcmp(s, want[k].text, len), "--pattern %s: id %u is %.*s, not %s",
              want[k].pattern, want[k].id, s ? (int)len : 4, s ? s : "none", want[k].text);
        CHECK(tks_tok_vocab_size(t) == 128256 && tks_tok_bos_id(t) == 128000 && tks_tok_eos_id(t) == 128001,
              "--pattern %s: vocab %u, bos %u, eos %u", want[k].pattern, tks_tok_vocab_size(t), tks_tok_bos_id(t),
              tks_tok_eos_id(t));
        tks_tok_free(t);
    }
}

static void tiktoken_refusals(const char *dir) {
    llama3_specials(dir);
    tiktoken_case(dir, "ok.tiktoken", "YWE= 256\n", "gpt2", NULL, 0, "", -1);
    tiktoken_case(dir, "b64.tiktoken", "YW!= 256\n", "gpt2", NULL, TKS_ERR_TOKENIZER, "line 257: the token is not base64", -1);
    tiktoken_case(dir, "norank.tiktoken", "YWE=\n", "gpt2", NULL, TKS_ERR_TOKENIZER, "line 257 is not \"BASE64 RANK\"", -1);
    tiktoken_case(dir, "repeat.tiktoken", "YWE= 255\n", "gpt2", NULL, TKS_ERR_TOKENIZER, "line 257 repeats rank 255 of line 256", -1);
    tiktoken_case(dir, "gap.tiktoken", "YWE= 300\n", "gpt2", NULL, TKS_ERR_TOKENIZER, "line 257: rank 300 leaves a gap", -1);
    tiktoken_case(dir, "nobyte.tiktoken", "", "gpt2", NULL, TKS_ERR_TOKENIZER, "byte 0x41 has no rank", 'A');
    tiktoken_case(dir, "nopattern.tiktoken", "", NULL, NULL, TKS_ERR_ARG, "give one with --pattern", -1);
    tiktoken_case(dir, "badregex.tiktoken", "", "a(b", NULL, TKS_ERR_TOKENIZER, "PCRE2 cannot compile", -1);
    tiktoken_case(dir, "emptyregex.tiktoken", "", "a*", NULL, TKS_ERR_TOKENIZER, "may match the empty string", -1);
    tiktoken_case(dir, "specialrank.tiktoken", "", "gpt2", "<|x|>=10", TKS_ERR_ARG, "a rank of", -1);
    tiktoken_case(dir, "specialtwice.tiktoken", "", "gpt2", "<|x|>=300,<|y|>=300", TKS_ERR_ARG, "share id 300", -1);
    tiktoken_case(dir, "specialfar.tiktoken", "", "gpt2", "<|endoftext|>=1280000", TKS_ERR_ARG,
                  "has id 1280000, more than 2^20 past", -1);
    tiktoken_case(dir, "specialform.tiktoken", "", "gpt2", "<|x|>", TKS_ERR_ARG, "is not TEXT=ID", -1);
}

#define MODEL(extra_model, merges)                                                                     \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"                   \
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"        \
    "\"trim_offsets\":true,\"use_regex\":true},\"post_processor\":null,"                               \
    "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\"" extra_model                     \
    ",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":" merges "}}"

/* A minimal tokenizer.json (vocabulary "a", "b") whose pre-tokenizer is a
 * Split on `regex` (JSON-escaped) then ByteLevel, into out[cap]. */
static void split_model(char *out, size_t cap, const char *regex) {
    snprintf(out, cap,
             "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
             "{\"Regex\":\"%s\"},\"behavior\":\"Isolated\",\"invert\":false},"
             "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
             "\"decoder\":{\"type\":\"ByteLevel\"},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
             regex);
}

static int refusals(const char *dir) {
    mkdir(dir, 0755);
    /* the minimal model loads and encodes */
    char path[4096];
    snprintf(path, sizeof path, "%s/ok.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return fails;
    }
    fputs(MODEL("", "[\"a b\"]"), f);
    fclose(f);
    tks_bpe *b = NULL;
    int rc = tks_bpe_load(path, &b);
    CHECK(rc == 0, "minimal model: %s", tks_last_error()->message);
    if (!rc) {
        tks_ids ids = {0};
        CHECK(tks_bpe_encode(b, "abab", 4, &ids) == 0 && ids.n == 2 && ids.ids[0] == 2 && ids.ids[1] == 2,
              "minimal model: abab");
        CHECK(tks_bpe_encode(b, "a\xff", 2, &ids) == TKS_ERR_UTF8 && tks_last_error()->offset == 1,
              "invalid UTF-8 is refused at its offset");
        uint32_t big = 3;
        char *t = NULL;
        CHECK(tks_bpe_decode(b, &big, 1, &t, NULL) == TKS_ERR_TOKEN_RANGE, "id 3 of 3 refused");
        tks_ids_free(&ids);
        tks_bpe_free(b);
    }
    refused(dir, "badjson.json", "{\"model\": [1, 2,", TKS_ERR_TOKENIZER, "not valid JSON");
    refused(dir, "badmerge.json", MODEL("", "[\"a c\"]"), TKS_ERR_TOKENIZER, "model.merges[0]: \"c\"");
    refused(dir, "badmerge2.json", MODEL("", "[\"b a\"]"), TKS_ERR_TOKENIZER, "model.merges[0]: \"ba\"");
    refused(dir, "merge3.json", MODEL("", "[\"a b c\"]"), TKS_ERR_TOKENIZER, "model.merges[0]");
    refused(dir, "mixed.json", MODEL("", "[\"a b\", [\"a\", \"b\"]]"), TKS_ERR_TOKENIZER, "model.merges[1]");
    refused(dir, "fallback.json", MODEL(",\"byte_fallback\":true", "[]"), TKS_ERR_TOKENIZER, "model.byte_fallback");
    refused(dir, "dropout.json", MODEL(",\"dropout\":0.1", "[]"), TKS_ERR_TOKENIZER, "model.dropout");
    refused(dir, "unk.json", MODEL(",\"unk_token\":\"a\"", "[]"), TKS_ERR_TOKENIZER, "model.unk_token");
    refused(dir, "prefix.json", MODEL(",\"continuing_subword_prefix\":\"##\"", "[]"), TKS_ERR_TOKENIZER,
            "model.continuing_subword_prefix");
    refused(dir, "unknownkey.json", MODEL(",\"frobnicate\":1", "[]"), TKS_ERR_TOKENIZER, "model.frobnicate");
    refused(dir, "wordpiece.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}",
            TKS_ERR_TOKENIZER, "model type \"WordPiece\"");
    refused(dir, "metaspace.json",
            "{\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "pre_tokenizer type \"Metaspace\"");
    refused(dir, "seq.json",
            "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},"
            "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "pre_tokenizer.pretokenizers[0] type \"Digits\"");
    refused(dir, "emptyre.json",
            "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
            "{\"Regex\":\"a*\"},\"behavior\":\"Isolated\",\"invert\":false},"
            "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "pre_tokenizer.pretokenizers[0]: the pattern may match the empty string");
    refused(dir, "possessive.json",
            "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
            "{\"Regex\":\"\\\\p{N}{1,3}+|\\\\p{L}++|.\"},\"behavior\":\"Isolated\",\"invert\":false},"
            "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "{n,m}+ repeats {n,m} in Oniguruma");
    refused(dir, "nfkc.json",
            "{\"normalizer\":{\"type\":\"NFKC\"},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "normalizer type \"NFKC\"");
    refused(dir, "prefixspace.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "pre_tokenizer.add_prefix_space");
    refused(dir, "decoder.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"Metaspace\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "decoder type \"Metaspace\"");
    refused(dir, "hole.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "model.vocab[\"b\"]: id 2");
    refused(dir, "floatid.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1.5},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "model.vocab[\"b\"]: 1.5 is not an integer id");
    refused(dir, "dupid.json",
            "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "id 0 is also");
    refused(dir, "addedhole.json",
            "{\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true}],"
            "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "added_tokens[0] \"<s>\": id 5");
    refused(dir, "addedclash.json",
            "{\"added_tokens\":[{\"id\":1,\"content\":\"a\",\"special\":true}],"
            "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "added_tokens[0] \"a\" has id 1");
    refused(dir, "truncation.json",
            "{\"truncation\":{\"max_length\":5},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "truncation");
    refused(dir, "dupadded.json",
            "{\"added_tokens\":[{\"id\":2,\"content\":\"<s>\",\"special\":true},{\"id\":3,\"content\":\"<s>\","
            "\"special\":true}],\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "have the same text");
    refused(dir, "lstrip.json",
            "{\"added_tokens\":[{\"id\":2,\"content\":\"<x>\",\"special\":false,\"lstrip\":true}],"
            "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
            TKS_ERR_TOKENIZER, "sets lstrip, rstrip or single_word");
    /* constructs PCRE2 reads otherwise than Oniguruma: refused, named */
    {
        static const struct { const char *name, *re, *key; } odd[] = {
            {"re-w.json", "\\\\w+|.", "\\w (word characters and boundaries) differs"},
            {"re-W.json", "[\\\\W]+|.", "\\W (word characters"},
            {"re-b.json", "\\\\b\\\\p{L}+|.", "\\b (word characters"},
            {"re-caret.json", "^\\\\p{L}+|.", "^ matches at every line's start in Oniguruma"},
            {"re-dollar.json", "\\\\p{L}+$|.", "$ matches at every line's end"},
            {"re-and.json", "[\\\\p{L}&&[^a]]+|.", "class intersection"},
        };
        for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) {
            char json[1024];
            split_model(json, sizeof json, odd[k].re);
            refused(dir, odd[k].name, json, TKS_ERR_TOKENIZER, odd[k].key);
        }
    }
    /* a Split regex that backtracks catastrophically loads (it is valid) but
     * stops at PCRE2's match limit, naming the pattern, instead of running
     * 2^n steps on n a's (the ctest TIMEOUT catches a limit that is gone) */
    {
        char cpath[4096];
        FILE *cf = create_case(dir, "catastrophic.json", cpath, sizeof cpath);
        if (cf) {
            char json[1024];
            split_model(json, sizeof json, "(a+)+b|.");
            fputs(json, cf);
            fclose(cf);
            tks_bpe *cb = NULL;
            int crc = tks_bpe_load(cpath, &cb);
            CHECK(crc == 0, "catastrophic.json loads: %s", tks_last_error()->message);
            if (!crc) {
                tks_ids ids = {0};
                CHECK(tks_bpe_encode(cb, "ab", 2, &ids) == 0 && ids.n == 2, "catastrophic.json encodes ab");
                char as[61];
                memset(as, 'a', 60);
                as[60] = 0;
                double t0 = now();
                crc = tks_bpe_encode(cb, as, 60, &ids);
                CHECK(crc == TKS_ERR_TOKENIZER && strstr(tks_last_error()->message, "/(a+)+b|./ backtracks") &&
                          strstr(tks_last_error()->message, "match limit"),
                      "60 a's under (a+)+b: rc %d, %s", crc, tks_last_error()->message);
                if (crc) printf("refused at encoding after %.3f s: %s\n", now() - t0, tks_last_error()->message);
                tks_ids_free(&ids);
                tks_bpe_free(cb);
            }
        }
    }
    /* code points the regex engine's Unicode leaves unassigned are counted
     * per document (a newer Unicode may split them otherwise): U+E0080 and
     * U+50000 are unassigned in every Unicode to date, U+00E9 and U+4E2D
     * assigned in every one, U+FFFE a noncharacter (never assigned) */
    {
        char opath[4096];
        snprintf(opath, sizeof opath, "%s/ok.json", dir);
        tks_bpe *ub = NULL;
        int urc = tks_bpe_load(opath, &ub);
        CHECK(urc == 0, "ok.json loads again: %s", tks_last_error()->message);
        if (!urc) {
            static const char *const docs[] = {"ab \xc3\xa9 \xe4\xb8\xad \xef\xbf\xbe",
                                               "a\xf3\xa0\x82\x80\x62\xf1\x90\x80\x80 ab", "plain ascii ab"};
            tks_ids ids = {0};
            for (size_t k = 0; k < 3; k++)
                CHECK(tks_bpe_encode(ub, docs[k], strlen(docs[k]), &ids) == 0, "unassigned doc %zu encodes", k);
            tks_encoder_stats st;
            tks_bpe_encoder_stats(ub, &st);
            CHECK(st.unassigned == 2 && st.unassigned_docs == 1,
                  "2 unassigned code points in 1 document, counted %llu in %llu (Unicode %s)",
                  (unsigned long long)st.unassigned, (unsigned long long)st.unassigned_docs,
                  tks_bpe_unicode_version());
            tks_ids_free(&ids);
            tks_bpe_free(ub);
        }
    }
    tiktoken_refusals(dir);
    b = (tks_bpe *)1;
    snprintf(path, sizeof path, "%s/absent.json", dir);
    CHECK(tks_bpe_load(path, &b) == TKS_ERR_IO && !b, "a missing file is TKS_ERR_IO");
    tks_bpe_free(NULL);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The tokenizer cache against someone else (bpe_cache.c's promise): links
 * planted at an entry's predictable names are never written or read
 * through, a directory others may write (or another user's) is left unused
 * with a reason, and an entry is bound to the user's key, so one copied
 * from another cache directory (another user, another machine) is rebuilt.
 * ------------------------------------------------------------------------- */

static const char cache_victim[] = "the victim's own file\n";

static void spit_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0, "cannot write %s", path);
    if (f) fclose(f);
}

/* Copies `from` to a new file `to` of mode 0600 (the cache's). */
static void copy_private(const char *from, const char *to) {
    size_t n = 0;
    char *b = slurp(from, &n);
    FILE *f = fopen(to, "wb");
    CHECK(b && f && fwrite(b, 1, n, f) == n && chmod(to, 0600) == 0, "copy %s to %s", from, to);
    if (f) fclose(f);
    free(b);
}

/* 1 when `path` (not followed) is a regular file. */
static int is_regular(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int victim_ok(const char *path) {
    size_t n = 0;
    char *t = slurp(path, &n);
    int ok = t && n == strlen(cache_victim) && !memcmp(t, cache_victim, n);
    free(t);
    return ok;
}

/* Loads `json` with the cache in cdir: the handle (NULL, counted as a
 * failure, when the load fails), *from 1 when it came from the cache. */
static tks_bpe *cached_load(const char *json, const char *cdir, int *from) {
    setenv("TOKSHARD_CACHE_DIR", cdir, 1);
    tks_bpe *b = NULL;
    CHECK(tks_bpe_load(json, &b) == 0, "load %s: %s", json, tks_last_error()->message);
    *from = b && tks_bpe_from_cache(b);
    return b;
}

/* One load of `json` with the cache in cdir: 1 when it came from the cache;
 * the handle's note into note[cap] ("" when none). */
static int load_once(const char *json, const char *cdir, char *note, size_t cap) {
    int from;
    tks_bpe *b = cached_load(json, cdir, &from);
    if (note) snprintf(note, cap, "%s", b ? tks_bpe_cache_note(b) : "");
    tks_bpe_free(b);
    return from;
}

/* The entry of tokenizer file `json` in cdir into entry[cap]. */
static void entry_of(const char *json, const char *cdir, char *entry, size_t cap) {
    uint8_t fp[16];
    char hex[33];
    CHECK(tks_file_xxh3_128(json, fp, NULL) == 0, "hash %s", json);
    tks_hex(fp, 16, hex);
    snprintf(entry, cap, "%s/bpe-%s.tkc", cdir, hex);
}

/* Links at the entry's old temporary name (ENTRY.tmp-PID: this process's
 * pid) to the victim and to nowhere, and the entry itself a link to a good
 * entry elsewhere: the victim unchanged, nothing created through a link,
 * the linked entry not used, and a regular entry written in its place. */
static void cache_links(const char *dir, const char *t1, const char *cdir, const char *victim) {
    char entry[4400], tmp[4500], nowhere[4200], copy[4200];
    entry_of(t1, cdir, entry, sizeof entry);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", entry, (long)getpid());
    snprintf(nowhere, sizeof nowhere, "%s/created-through-a-link", dir);
    for (int dangling = 0; dangling < 2; dangling++) {
        unlink(entry);
        CHECK(symlink(dangling ? nowhere : victim, tmp) == 0, "plant %s", tmp);
        CHECK(!load_once(t1, cdir, NULL, 0), "no entry, yet the load came from the cache");
        CHECK(victim_ok(victim), "the entry was written through the link %s into %s", tmp, victim);
        CHECK(access(nowhere, F_OK) != 0, "the entry was created through the dangling link %s", tmp);
        spit_text(victim, cache_victim); /* each case from an intact victim */
        unlink(nowhere);
        CHECK(is_regular(entry), "no regular entry %s written", entry);
        CHECK(load_once(t1, cdir, NULL, 0), "the entry written beside the planted link is not used");
        unlink(tmp);
    }
    /* the entry a link to a sound entry elsewhere: not read through it */
    snprintf(copy, sizeof copy, "%s/elsewhere.tkc", dir);
    copy_private(entry, copy);
    size_t n0 = 0, n1 = 0;
    char *before = slurp(copy, &n0);
    CHECK(unlink(entry) == 0 && symlink(copy, entry) == 0, "link %s -> %s", entry, copy);
    CHECK(!load_once(t1, cdir, NULL, 0), "an entry reached through a symbolic link was used");
    char *after = slurp(copy, &n1);
    CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "the linked file %s changed", copy);
    CHECK(is_regular(entry), "the link %s was not replaced by a regular entry", entry);
    free(before);
    free(after);
}

/* A directory others may write, or another user's: not used (a sound entry
 * in it included), nothing written in it, the reason said; then the key
 * file: not private, or a link, is refused the same way. */
static void cache_refused_dirs(const char *t1, const char *cdir, const char *victim) {
    char entry[4400], tmp[4500], note[1024], key[4200];
    entry_of(t1, cdir, entry, sizeof entry);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", entry, (long)getpid());
    CHECK(load_once(t1, cdir, note, sizeof note) && !note[0], "a sound cache not used: %s", note);
    struct stat e0, e1;
    stat(entry, &e0);
    static const unsigned modes[] = {0777, 0770, 0702};
    for (int k = 0; k < 3; k++) {
        CHECK(chmod(cdir, modes[k]) == 0, "chmod %s", cdir);
        CHECK(symlink(victim, tmp) == 0, "plant %s", tmp);
        CHECK(!load_once(t1, cdir, note, sizeof note), "a cache directory of mode %04o was used", modes[k]);
        CHECK(strstr(note, cdir) && strstr(note, "others may write") && strstr(note, "chmod go-w"),
              "mode %04o: the note does not say why: \"%s\"", modes[k], note);
        CHECK(victim_ok(victim), "mode %04o: %s was written through %s", modes[k], victim, tmp);
        spit_text(victim, cache_victim);
        unlink(tmp);
    }
    stat(entry, &e1);
    CHECK(e0.st_ino == e1.st_ino && e0.st_mtime == e1.st_mtime, "an entry was written into a refused directory");
    if (geteuid() == 0 && chown(cdir, 65534, 65534) == 0) { /* another user's (root can make one) */
        chmod(cdir, 0700);
        CHECK(!load_once(t1, cdir, note, sizeof note) && strstr(note, "belongs to user 65534"),
              "another user's cache directory: \"%s\"", note);
        CHECK(chown(cdir, 0, 0) == 0, "chown back");
    }
    CHECK(chmod(cdir, 0700) == 0, "chmod");
    CHECK(load_once(t1, cdir, note, sizeof note) && !note[0], "mode 0700 again: not used: %s", note);
    /* the key: readable by others, or a link to a copy: refused, named */
    snprintf(key, sizeof key, "%s/cache.key", cdir);
    CHECK(chmod(key, 0644) == 0, "chmod %s", key);
    CHECK(!load_once(t1, cdir, note, sizeof note) && strstr(note, "cache.key"), "a readable key was used: \"%s\"",
          note);
    CHECK(chmod(key, 0600) == 0, "chmod %s", key);
    char copy[4300];
    snprintf(copy, sizeof copy, "%s.copy", cdir);
    copy_private(key, copy);
    CHECK(unlink(key) == 0 && symlink(copy, key) == 0, "link %s -> %s", key, copy);
    CHECK(!load_once(t1, cdir, note, sizeof note) && strstr(note, "cache.key"), "a linked key was used: \"%s\"",
          note);
    CHECK(unlink(key) == 0 && rename(copy, key) == 0, "put %s back", key);
    CHECK(load_once(t1, cdir, note, sizeof note) && !note[0], "the key restored: not used: %s", note);
}

static int cache_safety(const char *dir) {
    char cmd[4200], t1[4096], t2[4096], t3[4096], victim[4096], cdir[4096], cdir2[4096], m3[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) {
        CHECK(0, "%s", cmd);
        return fails;
    }
    snprintf(t1, sizeof t1, "%s/t1.json", dir);
    snprintf(t2, sizeof t2, "%s/t2.json", dir); /* other bytes, the same tables */
    snprintf(t3, sizeof t3, "%s/t3.json", dir); /* other tables */
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(cdir, sizeof cdir, "%s/made/by/the/load", dir);
    snprintf(cdir2, sizeof cdir2, "%s/another-machine", dir);
    spit_text(t1, MODEL("", "[\"a b\"]"));
    spit_text(t2, MODEL("", "[\"a b\"]") "\n");
    split_model(m3, sizeof m3, "a|b");
    spit_text(t3, m3);
    spit_text(victim, cache_victim);
    /* a missing directory is made, private; the key once, private */
    int from;
    uint8_t d1[16], d2[16], d3[16];
    tks_bpe *b = cached_load(t1, cdir, &from);
    CHECK(b && !from && !tks_bpe_cache_note(b)[0], "first load: from the cache %d, note \"%s\"", from,
          b ? tks_bpe_cache_note(b) : "");
    CHECK(b && tks_bpe_tables_xxh3(b, d1), "no tables digest");
    tks_bpe_free(b);
    struct stat st;
    char key[4200], entry[4400];
    snprintf(key, sizeof key, "%s/cache.key", cdir);
    entry_of(t1, cdir, entry, sizeof entry);
    CHECK(stat(cdir, &st) == 0 && (st.st_mode & 077) == 0, "the cache directory was made mode %04o",
          (unsigned)(st.st_mode & 07777));
    CHECK(lstat(key, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0 && st.st_size == 32,
          "the key %s: not a private 32-byte file", key);
    CHECK(lstat(entry, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 022), "no entry %s", entry);
    b = cached_load(t1, cdir, &from);
    CHECK(b && from && tks_bpe_tables_xxh3(b, d2) && !memcmp(d1, d2, 16),
          "the cached tables' digest is not the parsed tables'");
    tks_bpe_free(b);
    b = cached_load(t2, cdir, &from);
    CHECK(b && !from && tks_bpe_tables_xxh3(b, d2) && !memcmp(d1, d2, 16), "same tables, another digest");
    tks_bpe_free(b);
    b = cached_load(t3, cdir, &from);
    CHECK(b && tks_bpe_tables_xxh3(b, d3) && memcmp(d1, d3, 16), "other tables, the same digest");
    tks_bpe_free(b);
    cache_links(dir, t1, cdir, victim);
    cache_refused_dirs(t1, cdir, victim);
    /* an entry from another cache directory (another user, another machine:
     * another key) fails the check and is rebuilt; so is every entry of a
     * directory whose key is gone */
    CHECK(!load_once(t3, cdir2, NULL, 0), "a new directory served an entry");
    char entry2[4400];
    entry_of(t1, cdir2, entry2, sizeof entry2);
    copy_private(entry, entry2);
    CHECK(!load_once(t1, cdir2, NULL, 0), "an entry made under another key was used");
    CHECK(load_once(t1, cdir2, NULL, 0), "the rebuilt entry is not used");
    snprintf(key, sizeof key, "%s/cache.key", cdir2);
    CHECK(unlink(key) == 0, "rm %s", key);
    CHECK(!load_once(t1, cdir2, NULL, 0), "an entry was used without its key");
    CHECK(is_regular(key), "no new key made");
    CHECK(load_once(t1, cdir2, NULL, 0), "the entry under the new key is not used");
    CHECK(victim_ok(victim), "%s changed", victim);
    if (!fails) printf("tokenizer cache: no planted link written or read through, refused directories and keys "
                       "named, entries of another key rebuilt, one tables digest parsed or cached\n");
    setenv("TOKSHARD_CACHE_DIR", "off", 1);
    return fails;
}

/* A 1 MB document that is one pre-token, and 1 MB of spaces: encoded and
 * decoded back (O(n log n): a fraction of a second; the ctest TIMEOUT stops
 * anything quadratic). */
static int long_word(const char *dir, const char *name) {
    tks_bpe *b = load_model(dir, name);
    if (!b) return fails;
    size_t n = 1u << 20;
    char *t = malloc(n);
    uint64_t x = 42;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = "etaoinshrdlucmfwypvbgkqjxz"[(x >> 33) % 26];
    }
    tks_ids ids = {0};
    double t0 = now();
    int rc = tks_bpe_encode(b, t, n, &ids);
    double dt = now() - t0;
    CHECK(rc == 0, "%s: 1 MB word: %s", name, tks_last_error()->message);
    /* no bound on the time here (a busy machine would fail it): an encoder
     * quadratic in the piece would need hours for this word and the test's
     * ctest TIMEOUT ends it; the figures are in docs/BENCHMARKS.md */
    CHECK(ids.n > 0 && ids.n < n, "%s: 1 MB word: %zu ids", name, ids.n);
    printf("%s: a 1 MB single word: %zu ids in %.3f s\n", name, ids.n, dt);
    memset(t, ' ', n); /* one whitespace run */
    t0 = now();
    rc = tks_bpe_encode(b, t, n, &ids);
    dt = now() - t0;
    CHECK(rc == 0 && ids.n > 0, "%s: 1 MB of spaces: rc %d", name, rc);
    printf("%s: 1 MB of spaces: %zu ids in %.3f s\n", name, ids.n, dt);
    char *back;
    size_t bl;
    CHECK(!tks_bpe_decode(b, ids.ids, ids.n, &back, &bl) && bl == n && !memcmp(back, t, n), "round trip");
    free(back);
    free(t);
    tks_ids_free(&ids);
    tks_bpe_free(b);
    return 0;
}

int main(int argc, char **argv) {
    /* every load parses, except where check_cache points the cache elsewhere */
    setenv("TOKSHARD_CACHE_DIR", "off", 1);
    if (argc >= 3 && !strcmp(argv[1], "--refusals")) {
        refusals(argv[2]);
    } else if (argc == 3 && !strcmp(argv[1], "--cache-safety")) {
        cache_safety(argv[2]);
    } else if (argc == 4 && !strcmp(argv[1], "--long")) {
        long_word(argv[2], argv[3]);
    } else if (argc >= 3) {
        docs d;
        char path[4096];
        snprintf(path, sizeof path, "%s/docs.bin", argv[1]);
        if (read_docs(path, &d)) {
            fprintf(stderr, "cannot read %s\n", path);
            return 1;
        }
        snprintf(path, sizeof path, "%s/docs.count", argv[1]);
        size_t cn;
        char *c = slurp(path, &cn);
        size_t n_held = c ? strtoul(strchr(c, ' ') + 1, NULL, 10) : 0;
        free(c);
        read_newer(argv[1], d.n);
        for (int i = 2; i < argc; i++) compare_model(argv[1], argv[i], &d, n_held);
        free(newer);
        free(d.buf);
        free(d.p);
        free(d.len);
    } else {
        fprintf(stderr, "usage: test_bpe PEER_DIR MODEL... | --refusals DIR | --cache-safety DIR | --long PEER_DIR "
                "MODEL\n");
        return 2;
    }
    if (fails) fprintf(stderr, "test_bpe: %d check(s) failed\n", fails);
    return fails ? 1 : 0;
}
