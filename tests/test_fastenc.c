/*
 * test_fastenc.c - tokshard's fast encoder (tokenizer/fastenc.c) against
 * sentencepiece (tks_spm_encode_ref: the Debian library spm_encode uses),
 * document for document, ids compared exactly.
 *
 * Models: trained here by Debian's spm_train on a sample of real text (GCIDE,
 * the Python docs, Japanese, Chinese, Russian and German man pages), seven
 * that the fast path takes (BPE and unigram; nmt_nfkc, nmt_nfkc_cf and
 * identity normalization; byte fallback on and off; split_digits;
 * whitespace-only pieces; remove_extra_whitespaces and add_dummy_prefix off)
 * and three that must fall back to sentencepiece (user-defined symbols,
 * treat_whitespace_as_suffix, pieces spanning words).
 * Texts: held-out lines of each corpus, whole multi-line documents (long
 * unigram paths, where the running score's float rounding matters), and
 * generated adversarial documents (random code points from every plane,
 * whitespace and control runs, NUL, U+FFFD, invalid bytes, combining marks,
 * emoji, full-width forms, literal U+2581, 1 MB words).
 *
 * Usage: test_fastenc WORKDIR. Exit status 0 only when every check passed.
 */
#define _POSIX_C_SOURCE 200809L
#include "tests/check.h"
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tokenizer.h"

#define SPM_TRAIN "/usr/bin/spm_train"

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void buf_add(buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 1 << 16;
        while (c < b->n + n + 1) c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p) abort();
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Text documents: offsets into one buffer. */
typedef struct {
    buf text;
    size_t *off, *len, n, cap;
    const char *what; /* corpus name for messages */
} docs;

static void docs_add(docs *d, const char *s, size_t n) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 1024;
        d->off = realloc(d->off, d->cap * sizeof *d->off);
        d->len = realloc(d->len, d->cap * sizeof *d->len);
        if (!d->off || !d->len) abort();
    }
    d->off[d->n] = d->text.n;
    d->len[d->n] = n;
    d->n++;
    buf_add(&d->text, s, n);
}

static void docs_free(docs *d) {
    free(d->text.p);
    free(d->off);
    free(d->len);
}

/* Reads the output of a shell command (text from Debian packages). */
static int read_cmd(const char *cmd, size_t max, buf *out) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char tmp[1 << 16];
    size_t r;
    while (out->n < max && (r = fread(tmp, 1, sizeof tmp, f)) > 0) buf_add(out, tmp, r);
    pclose(f); /* the producer may die of SIGPIPE when we stop early */
    return out->n ? 0 : -1;
}

/* Splits text into lines (non-empty ones), keeping every `step`-th from
 * line `first` on, into d. */
static void split_lines(const buf *t, size_t first, size_t step, size_t max_docs, docs *d) {
    size_t i = 0, pos = 0;
    while (pos < t->n && d->n < max_docs) {
        const char *s = t->p + pos;
        const char *nl = memchr(s, '\n', t->n - pos);
        size_t n = nl ? (size_t)(nl - s) : t->n - pos;
        pos += n + 1;
        if (!n) continue;
        if (i >= first && (i - first) % step == 0) docs_add(d, s, n);
        i++;
    }
}

/* ---------------------------------------------------------------------------
 * Adversarial text (xorshift64*, fixed seed: the same documents every run)
 * ------------------------------------------------------------------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static size_t put_cp(char *o, uint32_t c) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)),
               o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* One random "character" of an adversarial class. */
static void adv_char(buf *b, int cls) {
    static const uint32_t special[] = {
        ' ',    '\t',   '\n',   '\r',   0,      0xFFFD, 0x2581, 0x3000, 0x00A0, 0x200B, 0xFEFF,
        0x0301, 0x0308, 0x0323, 0x1F600, 0x1F468, 0x200D, 0x1F469, 0xFE0F, 0xFF21, 0xFF41,
        0xFF10, 0xFF61, 0x2460, 0x00BD, 0x2163, 0xFB01, 0x1E9E, 0x0130, 0x212B, 0x3099, 0x304B,
        0xAC00, 0x1100, 0x1161, 0x0E01, 0x0627, 0x05D0, 0x0915, 0x093F, 0x1D400, 0x10FFFF, 0xE000};
    char o[8];
    uint32_t c;
    switch (cls) {
    case 0: /* any scalar value, any plane */
        do c = (uint32_t)(rnd() % 0x110000);
        while (c >= 0xD800 && c < 0xE000);
        buf_add(b, o, put_cp(o, c));
        break;
    case 1: /* special characters */
        buf_add(b, o, put_cp(o, special[rnd() % (sizeof special / sizeof *special)]));
        break;
    case 2: { /* invalid bytes: lone continuation, truncated sequences, overlongs, surrogates */
        static const char *bad[] = {"\x80", "\xBF", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80",
                                    "\xF4\x90\x80\x80", "\xF8\x88\x80\x80\x80", "\xFF", "\xE2\x96",
                                    "\xC3", "\xF0\x9F\x98"};
        const char *s = bad[rnd() % (sizeof bad / sizeof *bad)];
        buf_add(b, s, strlen(s));
        break;
    }
    case 3: /* ASCII letters, digits, punctuation */
        o[0] = (char)(0x21 + rnd() % 94);
        buf_add(b, o, 1);
        break;
    default: /* a run of spaces */
        for (uint64_t k = 1 + rnd() % 20; k; k--) buf_add(b, " ", 1);
    }
}

static void make_adversarial(docs *d) {
    buf b = {0};
    for (int i = 0; i < 1000; i++) {
        b.n = 0;
        size_t n = 1 + rnd() % 200;
        int mix = (int)(rnd() % 4);
        for (size_t k = 0; k < n; k++) {
            int cls = mix == 0 ? (int)(rnd() % 5) : mix == 1 ? (rnd() % 3 ? 3 : (int)(rnd() % 5))
                      : mix == 2 ? (rnd() % 2 ? 1 : 4) : (int)(rnd() % 2) * 3;
            adv_char(&b, cls);
        }
        docs_add(d, b.p, b.n);
    }
    /* long words: 1 MB of ASCII letters and punctuation, 256 KB of CJK
     * without spaces, 64 KB of a character no model knows (sentencepiece
     * merges a run of unknown pieces by string concatenation, quadratic: 1 MB
     * takes it 15-30 s) */
    b.n = 0;
    while (b.n < (1u << 20)) adv_char(&b, 3);
    docs_add(d, b.p, b.n);
    b.n = 0;
    char o[4];
    while (b.n < (256u << 10)) buf_add(&b, o, put_cp(o, 0x4E00 + (uint32_t)(rnd() % 0x5000)));
    docs_add(d, b.p, b.n);
    b.n = 0;
    while (b.n < (64u << 10)) buf_add(&b, o, put_cp(o, 0x10400 + (uint32_t)(rnd() % 16)));
    docs_add(d, b.p, b.n);
    /* 256 KB of spaces and tabs, and 256 KB of U+2581 */
    b.n = 0;
    while (b.n < (256u << 10)) buf_add(&b, rnd() % 8 ? " " : "\t", 1);
    docs_add(d, b.p, b.n);
    b.n = 0;
    while (b.n < (256u << 10)) buf_add(&b, "\xe2\x96\x81", 3);
    docs_add(d, b.p, b.n);
    free(b.p);
}

/* ---------------------------------------------------------------------------
 * Comparison
 * ------------------------------------------------------------------------- */
static void show_doc(const char *s, size_t n) {
    fprintf(stderr, "  document (%zu bytes, first 120 as hex):", n);
    for (size_t i = 0; i < n && i < 120; i++) fprintf(stderr, " %02x", (unsigned char)s[i]);
    fprintf(stderr, "\n");
}

/* Every document of d through both encoders; returns the number that differ
 * (reports the first three). */
static double t_ref, t_fast;
static size_t compare(const tks_spm *spm, const char *model, const docs *d) {
    tks_ids a = {0}, b = {0};
    size_t bad = 0;
    for (size_t i = 0; i < d->n; i++) {
        const char *s = d->text.p + d->off[i];
        double t0 = omp_get_wtime();
        int ra = tks_spm_encode_ref(spm, s, d->len[i], &a);
        double t1 = omp_get_wtime();
        int rb = tks_spm_encode_fast(spm, s, d->len[i], &b);
        t_ref += t1 - t0;
        t_fast += omp_get_wtime() - t1;
        if (getenv("TKS_TEST_VERBOSE") && t1 - t0 > 0.2)
            printf("  slow in sentencepiece: %s document %zu (%zu bytes): %.2f s\n", d->what, i,
                   d->len[i], t1 - t0);
        CHECK(ra == 0 && rb == 0, "%s on %s document %zu: encode failed (%d, %d): %s", model,
              d->what, i, ra, rb, tks_last_error()->message);
        if (ra || rb) return bad + 1;
        size_t k = 0;
        while (k < a.n && k < b.n && a.ids[k] == b.ids[k]) k++;
        if (k == a.n && k == b.n) continue;
        if (++bad <= 3) {
            CHECK(0, "%s on %s document %zu: ids differ at %zu (sentencepiece %zu ids: %u, fast %zu ids: %u)",
                  model, d->what, i, k, a.n, k < a.n ? a.ids[k] : 0u, b.n, k < b.n ? b.ids[k] : 0u);
            show_doc(s, d->len[i]);
        }
    }
    tks_ids_free(&a);
    tks_ids_free(&b);
    return bad;
}

/* tks_spm_encode from several OpenMP threads (one word cache each) gives
 * the sequential sentencepiece ids. */
static void compare_threads(const tks_spm *spm, const char *model, const docs *d) {
    size_t n = d->n < 20000 ? d->n : 20000;
    tks_ids *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
    if (!want || !got) abort();
    for (size_t i = 0; i < n; i++)
        tks_spm_encode_ref(spm, d->text.p + d->off[i], d->len[i], &want[i]);
    int errs = 0;
#pragma omp parallel for schedule(dynamic, 16) num_threads(3) reduction(+ : errs)
    for (size_t i = 0; i < n; i++)
        errs += tks_spm_encode(spm, d->text.p + d->off[i], d->len[i], &got[i]) != 0;
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        diff += !(want[i].n == got[i].n &&
                  (!want[i].n || !memcmp(want[i].ids, got[i].ids, want[i].n * sizeof(uint32_t))));
        tks_ids_free(&want[i]);
        tks_ids_free(&got[i]);
    }
    free(want);
    free(got);
    CHECK(errs == 0 && diff == 0, "%s: %d errors, %zu of %zu documents differ under 3 threads", model,
          errs, diff, n);
}

/* A document over 2 MiB goes to sentencepiece in segments where the model
 * allows exact cuts (spm.cc, tks_fast_next_cut): same ids as whole. */
static void check_segmented(tks_spm *spm, const char *model, const buf *big) {
    tks_ids a = {0}, b = {0};
    int ra = tks_spm_encode(spm, big->p, big->n, &a);
    int rb = tks_spm_encode_ref(spm, big->p, big->n, &b);
    CHECK(ra == 0 && rb == 0, "%s: encoding %zu bytes failed: %s", model, big->n,
          tks_last_error()->message);
    size_t k = 0;
    while (k < a.n && k < b.n && a.ids[k] == b.ids[k]) k++;
    CHECK(k == a.n && k == b.n, "%s: %zu-byte document through %s differs from sentencepiece at id %zu of %zu/%zu",
          model, big->n, tks_spm_encoder(spm), k, a.n, b.n);
    tks_ids_free(&a);
    tks_ids_free(&b);
}

typedef struct {
    const char *name, *flags;
    int fast;            /* the fast path must take it */
    const char *why;     /* else: a word of the reason it gives */
} model_spec;

static const model_spec MODELS[] = {
    {"bpe_nfkc", "--model_type=bpe", 1, NULL},
    {"bpe_llama", "--model_type=bpe --normalization_rule_name=identity --byte_fallback=true "
                  "--split_digits=true --allow_whitespace_only_pieces=true "
                  "--remove_extra_whitespaces=false", 1, NULL},
    {"bpe_nfkc_cf_nodummy", "--model_type=bpe --normalization_rule_name=nmt_nfkc_cf "
                            "--add_dummy_prefix=false --byte_fallback=true", 1, NULL},
    {"uni_nfkc", "--model_type=unigram", 1, NULL},
    {"uni_identity_bf", "--model_type=unigram --normalization_rule_name=identity "
                        "--byte_fallback=true --split_digits=true", 1, NULL},
    {"uni_nfkc_ws", "--model_type=unigram --allow_whitespace_only_pieces=true "
                    "--remove_extra_whitespaces=false", 1, NULL},
    {"bpe_nfkc_bf_digits", "--model_type=bpe --byte_fallback=true --split_digits=true "
                           "--character_coverage=0.98", 1, NULL},
    {"bpe_user", "--model_type=bpe --user_defined_symbols='<tag>,foo'", 0, "user-defined"},
    {"bpe_suffix", "--model_type=bpe --treat_whitespace_as_suffix=true", 0, "suffix"},
    {"bpe_nosplit", "--model_type=bpe --split_by_whitespace=false", 0, "U+2581"},
};
#define N_MODELS (sizeof MODELS / sizeof *MODELS)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_fastenc WORKDIR\n");
        return 2;
    }
    const char *dir = argv[1];
    mkdir(dir, 0755);
    char path[4096], cmd[8192];

    /* real text: GCIDE, the Python docs, man pages in four languages */
    static const struct {
        const char *name, *cmd;
        size_t max;
    } SRC[] = {
        {"gcide", "zcat /usr/share/dictd/gcide.dict.dz 2>/dev/null", 3u << 20},
        {"python-docs", "find /usr/share/doc/python3.11/html/_sources -type f | sort | xargs cat 2>/dev/null",
         3u << 20},
        {"man-ja", "find /usr/share/man/ja -name '*.gz' | sort | xargs zcat 2>/dev/null", 2u << 20},
        {"man-zh", "find /usr/share/man/zh_CN /usr/share/man/zh_TW -name '*.gz' | sort | xargs zcat 2>/dev/null",
         2u << 20},
        {"man-ru", "find /usr/share/man/ru -name '*.gz' | sort | xargs zcat 2>/dev/null", 2u << 20},
        {"man-de", "find /usr/share/man/de -name '*.gz' | sort | xargs zcat 2>/dev/null", 2u << 20},
    };
    enum { N_SRC = sizeof SRC / sizeof *SRC };
    static buf raw[N_SRC];
    static docs held[N_SRC], whole, adv;
    buf train = {0};
    for (int s = 0; s < N_SRC; s++) {
        if (read_cmd(SRC[s].cmd, SRC[s].max, &raw[s])) {
            fprintf(stderr, "cannot read %s text (`%s`): run scripts/install-deps.sh (dict-gcide, "
                            "python3.11-doc, manpages-ja/zh/ru/de)\n",
                    SRC[s].name, SRC[s].cmd);
            return 1;
        }
        /* training sample: every 4th line; compared: every 24th from the second */
        docs t;
        memset(&t, 0, sizeof t);
        split_lines(&raw[s], 0, 4, 1500, &t);
        for (size_t i = 0; i < t.n; i++) {
            buf_add(&train, t.text.p + t.off[i], t.len[i]);
            buf_add(&train, "\n", 1);
        }
        docs_free(&t);
        held[s].what = SRC[s].name;
        split_lines(&raw[s], 1, 24, 1000000, &held[s]);
        /* whole documents: a 128 KB block of each corpus, newlines and all */
        for (size_t off = 0; off + 1 < raw[s].n && off < (128u << 10); off += 128u << 10) {
            size_t n = raw[s].n - off < (128u << 10) ? raw[s].n - off : (128u << 10);
            docs_add(&whole, raw[s].p + off, n);
        }
    }
    /* one 2.1 MiB document (just over spm.cc's 2 MiB): GCIDE, newlines,
     * runs of spaces and all */
    static buf big;
    buf_add(&big, raw[0].p, raw[0].n < (2150u << 10) ? raw[0].n : (2150u << 10));
    whole.what = "whole-documents";
    adv.what = "adversarial";
    make_adversarial(&adv);
    snprintf(path, sizeof path, "%s/train.txt", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(train.p, 1, train.n, f) == train.n && fclose(f) == 0, "cannot write %s", path);

    /* train the models, two at a time */
    for (size_t m = 0; m < N_MODELS; m += 2) {
        size_t w = 0;
        for (size_t k = m; k < m + 2 && k < N_MODELS; k++)
            w += (size_t)snprintf(cmd + w, sizeof cmd - w,
                                  "%s --input=%s/train.txt --model_prefix=%s/%s --vocab_size=2000 "
                                  "--num_threads=1 --minloglevel=2 %s >%s/%s.log 2>&1 & ",
                                  SPM_TRAIN, dir, dir, MODELS[k].name, MODELS[k].flags, dir,
                                  MODELS[k].name);
        snprintf(cmd + w, sizeof cmd - w, "wait");
        CHECK(system(cmd) == 0, "spm_train failed: %s", cmd);
    }

    for (size_t m = 0; m < N_MODELS; m++) {
        const model_spec *ms = &MODELS[m];
        snprintf(path, sizeof path, "%s/%s.model", dir, ms->name);
        tks_spm *spm = NULL;
        int rc = tks_spm_load(path, &spm);
        CHECK(rc == 0, "%s: cannot load (spm_train log: %s/%s.log): %s", path, dir, ms->name,
              tks_last_error()->message);
        if (rc) continue;
        const char *why = tks_spm_fast_unavailable(spm);
        if (!ms->fast) {
            CHECK(why && strstr(why, ms->why), "%s: expected a fallback mentioning \"%s\", got %s",
                  ms->name, ms->why, why ? why : "the fast encoder");
            CHECK(!strcmp(tks_spm_encoder(spm), "sentencepiece"), "%s: encoder is %s", ms->name,
                  tks_spm_encoder(spm));
            CHECK(tks_spm_set_encoder(spm, 1) == TKS_ERR_TOKENIZER, "%s: forcing the fast path worked",
                  ms->name);
            /* tks_spm_encode is then sentencepiece: same ids */
            tks_ids a = {0}, b = {0};
            for (size_t i = 0; i < 200 && i < held[0].n; i++) {
                const char *s = held[0].text.p + held[0].off[i];
                tks_spm_encode(spm, s, held[0].len[i], &a);
                tks_spm_encode_ref(spm, s, held[0].len[i], &b);
                CHECK(a.n == b.n && !memcmp(a.ids, b.ids, a.n * 4), "%s: fallback differs", ms->name);
            }
            tks_ids_free(&a);
            tks_ids_free(&b);
            check_segmented(spm, ms->name, &big);
            printf("%-22s falls back to sentencepiece: %s\n", ms->name, why ? why : "?");
            tks_spm_free(spm);
            continue;
        }
        CHECK(!why, "%s: the fast encoder refused it: %s", ms->name, why);
        CHECK(!strcmp(tks_spm_encoder(spm), "fast"), "%s: encoder is %s", ms->name,
              tks_spm_encoder(spm));
        if (why) {
            tks_spm_free(spm);
            continue;
        }
        double t0 = omp_get_wtime();
        t_ref = t_fast = 0;
        size_t bad = 0, nd = 0;
        for (int s = 0; s < N_SRC; s++) bad += compare(spm, ms->name, &held[s]), nd += held[s].n;
        bad += compare(spm, ms->name, &whole);
        bad += compare(spm, ms->name, &adv);
        nd += whole.n + adv.n;
        compare_threads(spm, ms->name, &held[0]);
        printf("%-22s %s: %zu documents, %zu differ (%.1f s: sentencepiece %.1f s, fast %.1f s)\n",
               ms->name, tks_spm_model_type(spm), nd, bad, omp_get_wtime() - t0, t_ref, t_fast);
        /* switching to sentencepiece (segmented for a long BPE document) and back */
        CHECK(tks_spm_set_encoder(spm, 0) == 0 && !strcmp(tks_spm_encoder(spm), "sentencepiece"),
              "%s: cannot select sentencepiece", ms->name);
        if (!strcmp(tks_spm_model_type(spm), "bpe")) check_segmented(spm, ms->name, &big);
        CHECK(tks_spm_set_encoder(spm, 1) == 0 && !strcmp(tks_spm_encoder(spm), "fast"),
              "%s: cannot select the fast encoder", ms->name);
        tks_spm_free(spm);
    }
    for (int s = 0; s < N_SRC; s++) {
        free(raw[s].p);
        docs_free(&held[s]);
    }
    docs_free(&whole);
    docs_free(&adv);
    free(train.p);
    free(big.p);
    return check_exit("test_fastenc");
}
