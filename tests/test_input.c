/*
 * test_input.c - the input reader (tokenize/input.c, stream.c, docs.c) on real text: python
 * documentation sources and the GCIDE dictionary, in every container and
 * compression the system tools make, plus synthetic bytes for the UTF-8,
 * JSONL, split and error edge cases.
 *
 * Usage: test_input WORK_DIR   (emptied and recreated)
 * Needs gzip, xz, zstd, bzip2, dictzip, tar, zip, mkfifo (scripts/install-deps.sh).
 * Exit status 0 only when every check passed.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/check.h"
#include "tokenize/tokenize.h"

#include <jansson.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

static const char *W; /* work dir */


#define U(x) ((unsigned long long)(x))

static const char *const PYDOC = "/usr/share/doc/python3.11/html/_sources";
static const char *const GCIDE = "/usr/share/dictd/gcide.dict.dz";
/* Real files used for the container/compression matrix (one is UTF-8 heavy). */
static const char *const SAMPLES[] = {"tutorial/introduction.rst.txt", "howto/unicode.rst.txt",
                                      "glossary.rst.txt", "library/functions.rst.txt"};
static const char *const NAMES[] = {"introduction.rst.txt", "unicode.rst.txt", "glossary.rst.txt",
                                    "functions.rst.txt"};
#define N_SAMPLES 4

/* W/name into a static ring of buffers (so a few can be alive at once). */
static const char *wpath(const char *fmt, ...) {
    static char ring[8][4096];
    static int k;
    char *out = ring[k++ & 7];
    int n = snprintf(out, 4096, "%s/", W);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, 4096 - (size_t)n, fmt, ap);
    va_end(ap);
    return out;
}

static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) {
        failures++;
        fprintf(stderr, "FAIL: command exited with %d: %s\n", rc, cmd);
    }
    return rc;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "FAIL: cannot write %s\n", path);
        exit(1);
    }
}

/* ------------------------------------------------------------------------- */
/* reading helpers                                                            */

typedef struct result {
    int rc;                /* 0 at the end, or the error */
    char err[512];         /* message when rc < 0 */
    uint64_t err_line, err_doc, err_offset;
    uint64_t docs, bytes;  /* documents yielded, their total size */
    uint64_t hash;         /* XXH3-64 over (len, bytes) of every doc, in order */
    tks_input_stats st;
    double seconds;
    /* the first documents, copied */
    int n_kept;
    char *text[64];
    size_t len[64];
    uint64_t line[64];
    char source[64][256];
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n_kept; i++) free(r->text[i]);
    r->n_kept = 0;
}

static result read_paths(const char *const *paths, size_t n, const tks_input_opts *o) {
    result r;
    memset(&r, 0, sizeof r);
    tks_input *in = NULL;
    r.rc = tks_input_open(paths, n, o, &in);
    if (r.rc) {
        snprintf(r.err, sizeof r.err, "%s", tks_last_error()->message);
        return r;
    }
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tks_doc d;
    int rc;
    uint64_t expect_ordinal = 0;
    while ((rc = tks_input_next(in, &d)) == 1) {
        if (d.len == 0 || d.ordinal != expect_ordinal++ || !d.source || d.line == 0) {
            fprintf(stderr, "FAIL: bad doc fields: len %zu ordinal %llu line %llu\n", d.len,
                    U(d.ordinal), U(d.line));
            failures++;
        }
        uint64_t len = d.len;
        XXH3_64bits_update(h, &len, sizeof len);
        XXH3_64bits_update(h, d.text, d.len);
        r.docs++;
        r.bytes += d.len;
        if (r.n_kept < 64) {
            int k = r.n_kept++;
            r.text[k] = malloc(d.len + 1);
            memcpy(r.text[k], d.text, d.len);
            r.text[k][d.len] = 0;
            r.len[k] = d.len;
            r.line[k] = d.line;
            snprintf(r.source[k], sizeof r.source[k], "%s", d.source);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    r.rc = rc;
    if (rc < 0) {
        const tks_error *e = tks_last_error();
        snprintf(r.err, sizeof r.err, "%s", e->message);
        r.err_line = e->line;
        r.err_doc = e->doc;
        r.err_offset = e->offset;
        tks_doc d2;
        int again = tks_input_next(in, &d2);
        CHECK(again == rc, "a failed input must keep failing: %d then %d", rc, again);
    }
    r.hash = XXH3_64bits_digest(h);
    r.st = *tks_input_get_stats(in);
    XXH3_freeState(h);
    tks_input_free(in);
    return r;
}

static result read1(const char *path, const tks_input_opts *o) {
    return read_paths(&path, 1, o);
}

static tks_input_opts opts_split(tks_doc_split s) {
    tks_input_opts o;
    tks_input_opts_default(&o);
    o.split = s;
    return o;
}

/* ------------------------------------------------------------------------- */
/* UTF-8                                                                      */

typedef struct utf8_case {
    const char *name;
    const char *in;
    size_t in_len;
    const char *out;
    size_t out_len;
    size_t bad;
} utf8_case;

#define S(x) x, sizeof(x) - 1
#define R "\xEF\xBF\xBD" /* U+FFFD */

static const utf8_case UTF8_CASES[] = {
    {"empty", S(""), S(""), 0},
    {"ascii", S("hello, world\n\t~"), S("hello, world\n\t~"), 0},
    {"ascii 17 bytes", S("0123456789abcdefg"), S("0123456789abcdefg"), 0},
    {"nul is valid utf-8", "a\0b", 3, "a\0b", 3, 0},
    {"2-byte min/max", S("\xC2\x80\xDF\xBF"), S("\xC2\x80\xDF\xBF"), 0},
    {"3-byte E0 A0 80, U+FFFF", S("\xE0\xA0\x80\xEF\xBF\xBF"), S("\xE0\xA0\x80\xEF\xBF\xBF"), 0},
    {"3-byte around surrogates", S("\xED\x9F\xBF\xEE\x80\x80"), S("\xED\x9F\xBF\xEE\x80\x80"), 0},
    {"4-byte U+10000, U+10FFFF", S("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"),
     S("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"), 0},
    {"text mixed", S("caf\xC3\xA9 \xE2\x82\xAC 10 \xF0\x9F\x98\x80!"),
     S("caf\xC3\xA9 \xE2\x82\xAC 10 \xF0\x9F\x98\x80!"), 0},
    {"overlong C0 80", S("\xC0\x80"), S(R R), 2},
    {"overlong C1 BF", S("a\xC1\xBF" "b"), S("a" R R "b"), 2},
    {"overlong E0 80 80", S("\xE0\x80\x80"), S(R R R), 3},
    {"overlong F0 8F BF BF", S("\xF0\x8F\xBF\xBF"), S(R R R R), 4},
    {"surrogate ED A0 80", S("\xED\xA0\x80"), S(R R R), 3},
    {"surrogate ED BF BF", S("x\xED\xBF\xBFy"), S("x" R R R "y"), 3},
    {"above U+10FFFF F4 90 80 80", S("\xF4\x90\x80\x80"), S(R R R R), 4},
    {"F5..FF", S("\xF5\xF8\xFC\xFE\xFF"), S(R R R R R), 5},
    {"lone continuation bytes", S("a\x80" "b\xBF\xBF" "c"), S("a" R "b" R R "c"), 3},
    {"truncated 2-byte at end", S("ab\xC3"), S("ab" R), 1},
    {"truncated 3-byte at end", S("ab\xE2\x82"), S("ab" R), 1},
    {"truncated 4-byte at end", S("\xF0\x9F\x98"), S(R), 1},
    {"truncated 3-byte then ascii", S("\xE2\x82" "a"), S(R "a"), 1},
    {"high bit after 15 ascii", S("0123456789abcde\xFF" "0123456789"), S("0123456789abcde" R "0123456789"), 1},
    /* Unicode Standard 15.0, ch. 3, "U+FFFD Substitution of Maximal Subparts" */
    {"ch3 Table 3-8 (non-shortest forms)", S("\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"),
     S(R R R R R R R R "\x41"), 8},
    {"ch3 Table 3-9 (surrogates)", S("\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41"),
     S(R R R R R R R R "\x41"), 8},
    {"ch3 Table 3-10 (other ill-formed)", S("\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42"),
     S(R R R R R "\x41" R R "\x42"), 7},
    {"ch3 Table 3-11 (truncated)", S("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"),
     S(R R R R "\x41"), 4},
    {"ch3 example 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64",
     S("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
     S("\x61" R R R "\x62" R "\x63" R R "\x64"), 6},
};

static void test_utf8_table(void) {
    for (size_t i = 0; i < sizeof UTF8_CASES / sizeof UTF8_CASES[0]; i++) {
        const utf8_case *c = &UTF8_CASES[i];
        char out[256];
        size_t out_len = 12345;
        size_t bad = tks_utf8_sanitize(c->in, c->in_len, out, &out_len);
        CHECK(bad == c->bad, "[%s] %zu invalid subsequences, expected %zu", c->name, bad, c->bad);
        CHECK(out_len == c->out_len && !memcmp(out, c->out, out_len),
              "[%s] output differs (%zu bytes, expected %zu)", c->name, out_len, c->out_len);
        size_t bad2 = tks_utf8_sanitize(c->in, c->in_len, NULL, NULL);
        CHECK(bad2 == c->bad, "[%s] validate-only count %zu, expected %zu", c->name, bad2, c->bad);
    }
    /* every single byte, and every pair, against a slow reference decoder */
    for (int b0 = 0; b0 < 256; b0++) {
        char in[1] = {(char)b0}, out[8];
        size_t ol;
        size_t bad = tks_utf8_sanitize(in, 1, out, &ol);
        size_t expect = b0 < 0x80 ? 0 : 1;
        CHECK(bad == expect, "single byte %02X: %zu", b0, bad);
    }
}

/* An independent reference for the maximal-subpart rule: a prefix of k bytes
 * of an n-byte sequence is "viable" when completing it with the smallest
 * (0x80) and largest (0xBF) continuation bytes spans code points that meet
 * the scalar values an n-byte sequence may encode (RFC 3629 section 4). */
static int ref_viable(const unsigned char *b, int k, int n) {
    static const uint32_t lead_mask[5] = {0, 0, 0x1F, 0x0F, 0x07};
    uint32_t lo = b[0] & lead_mask[n], hi = lo;
    for (int i = 1; i < n; i++) {
        uint32_t c = i < k ? (uint32_t)(b[i] & 0x3F) : 0;
        lo = lo << 6 | (i < k ? c : 0x00);
        hi = hi << 6 | (i < k ? c : 0x3F);
    }
    uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000, max = n == 2 ? 0x7FF : n == 3 ? 0xFFFF : 0x10FFFF;
    if (hi < min || lo > max) return 0;
    if (lo < min) lo = min;
    if (hi > max) hi = max;
    return !(lo >= 0xD800 && hi <= 0xDFFF); /* not only surrogates */
}

static size_t ref_sanitize(const unsigned char *s, size_t n, unsigned char *out, size_t *out_len) {
    size_t i = 0, o = 0, bad = 0;
    while (i < n) {
        unsigned c = s[i];
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 1) {
            out[o++] = s[i++];
            continue;
        }
        int k = 0; /* longest viable prefix */
        if (len) {
            for (int j = 1; j <= len && i + (size_t)j <= n; j++) {
                if (j > 1 && (s[i + (size_t)j - 1] & 0xC0) != 0x80) break;
                if (!ref_viable(s + i, j, len)) break;
                k = j;
            }
        }
        if (len && k == len) {
            memcpy(out + o, s + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(out + o, R, 3);
            o += 3;
            i += k ? (size_t)k : 1;
            bad++;
        }
    }
    *out_len = o;
    return bad;
}

static uint32_t g_rng = 2463534242u;
static uint32_t rnd(void) { /* xorshift32 */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}

/* Bytes that hit the edges of Table 3-7, plus ASCII, whitespace, NUL. */
static unsigned char rnd_byte(void) {
    static const unsigned char edge[] = {0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                         0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4,
                                         0xF5, 0xFF, '\n', '\r', ' ', '\t', 0};
    uint32_t r = rnd();
    if (r % 3 == 0) return edge[(r >> 8) % sizeof edge];
    if (r % 3 == 1) return (unsigned char)('a' + (r >> 8) % 26);
    return (unsigned char)(r >> 8);
}

static void test_utf8_random(void) {
    unsigned char in[40], a[160], b[160];
    for (int it = 0; it < 300000; it++) {
        size_t n = rnd() % sizeof in;
        for (size_t i = 0; i < n; i++) in[i] = rnd_byte();
        size_t la = 0, lb = 0;
        size_t ba = tks_utf8_sanitize((const char *)in, n, (char *)a, &la);
        size_t bb = ref_sanitize(in, n, b, &lb);
        if (ba != bb || la != lb || memcmp(a, b, la)) {
            failures++;
            fprintf(stderr, "FAIL: sanitize differs from the reference on:");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %02X", in[i]);
            fprintf(stderr, " (%zu vs %zu subsequences)\n", ba, bb);
            return;
        }
        size_t lc = 0;
        if (tks_utf8_sanitize((const char *)a, la, (char *)b, &lc) != 0 || lc != la) {
            failures++;
            fprintf(stderr, "FAIL: sanitized output is not valid UTF-8\n");
            return;
        }
    }
}

/* Reference line splitter over a whole buffer, hashing like read_paths. */
static void ref_line_docs(const char *d, size_t n, const tks_input_opts *o, result *r) {
    memset(r, 0, sizeof *r);
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    char *san = malloc(3 * n + 1);
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(d + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (d + i)) : n - i;
        const char *p = d + i;
        i += len + (nl ? 1 : 0);
        if (nl && len && p[len - 1] == '\r') len--;
        if (len > o->max_doc_bytes) {
            r->st.long_skipped++;
            continue;
        }
        if (len == 0) {
            r->st.empty_skipped++;
            continue;
        }
        if (memchr(p, 0, len)) {
            r->st.binary_skipped++;
            continue;
        }
        size_t sl = 0;
        size_t bad = tks_utf8_sanitize(p, len, san, &sl);
        if (bad) {
            r->st.utf8_invalid_docs++;
            if (o->invalid_utf8 == TKS_POLICY_SKIP) {
                r->st.utf8_skipped++;
                continue;
            }
            r->st.utf8_replaced += bad;
            p = san;
            len = sl;
        }
        uint64_t l64 = len;
        XXH3_64bits_update(h, &l64, sizeof l64);
        XXH3_64bits_update(h, p, len);
        r->docs++;
    }
    r->hash = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    free(san);
}

/* Random bytes (lines, CRs, NULs, broken UTF-8) against the reference, in
 * small files and in one 3 MB file read plain and through gzip (so lines
 * cross the 1 MiB and 64 KiB block boundaries at different places). */
static void test_lines_random(void) {
    size_t big = 3u << 20;
    char *d = malloc(big);
    const char *p = wpath("random.txt");
    for (int it = 0; it < 201; it++) {
        size_t n = it == 200 ? big : rnd() % 2000;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd() % 100;
            d[i] = r < 3 ? '\n' : r < 4 ? '\r' : r < 70 ? (char)('a' + r % 26) : (char)rnd_byte();
        }
        if (it == 200) /* mostly clean text, no NUL, a few long lines */
            for (size_t i = 0; i < n; i++)
                if (!d[i] || ((unsigned char)d[i] >= 0x80 && rnd() % 50)) d[i] = 'x';
        write_file(p, d, n);
        tks_input_opts o = opts_split(TKS_SPLIT_LINE);
        o.max_doc_bytes = it == 200 ? 300 : 1 + rnd() % 60;
        o.invalid_utf8 = rnd() % 2 ? TKS_POLICY_SKIP : TKS_POLICY_REPLACE;
        result want, got = read1(p, &o);
        ref_line_docs(d, n, &o, &want);
        int same = got.rc == 0 && got.docs == want.docs && got.hash == want.hash &&
                   !memcmp(&got.st.empty_skipped, &want.st.empty_skipped,
                           sizeof(uint64_t) * 7) && got.st.bytes_text == n;
        CHECK(same, "random lines #%d (%zu bytes, max %llu): rc %d docs %llu/%llu empty %llu/%llu "
              "long %llu/%llu binary %llu/%llu utf8 %llu/%llu", it, n, U(o.max_doc_bytes), got.rc,
              U(got.docs), U(want.docs), U(got.st.empty_skipped), U(want.st.empty_skipped),
              U(got.st.long_skipped), U(want.st.long_skipped), U(got.st.binary_skipped),
              U(want.st.binary_skipped), U(got.st.utf8_invalid_docs), U(want.st.utf8_invalid_docs));
        result_free(&got);
        if (it == 200) {
            sh("gzip -1 -c %s > %s.gz", p, p);
            got = read1(wpath("random.txt.gz"), &o);
            CHECK(got.rc == 0 && got.docs == want.docs && got.hash == want.hash,
                  "random 3 MB through gzip: rc %d docs %llu/%llu", got.rc, U(got.docs), U(want.docs));
            result_free(&got);
            /* paragraphs and whole file: plain and gzip agree */
            for (int m = 0; m < 2; m++) {
                tks_input_opts q = opts_split(m ? TKS_SPLIT_BLANK : TKS_SPLIT_FILE);
                q.max_doc_bytes = m ? 2000 : big;
                result a = read1(p, &q), b = read1(wpath("random.txt.gz"), &q);
                CHECK(a.rc == 0 && b.rc == 0 && a.docs == b.docs && a.hash == b.hash && a.docs > 0,
                      "random 3 MB mode %d: plain %llu docs, gzip %llu docs", m, U(a.docs), U(b.docs));
                result_free(&a);
                result_free(&b);
            }
        }
    }
    free(d);
}

/* ------------------------------------------------------------------------- */
/* split modes                                                                */

static void expect_docs(const char *what, const result *r, const char *const *texts,
                        const uint64_t *lines, int n) {
    CHECK(r->rc == 0, "[%s] rc %d (%s)", what, r->rc, r->err);
    CHECK(r->docs == (uint64_t)n, "[%s] %llu docs, expected %d", what, U(r->docs), n);
    for (int i = 0; i < n && i < r->n_kept; i++) {
        CHECK(r->len[i] == strlen(texts[i]) && !memcmp(r->text[i], texts[i], r->len[i]),
              "[%s] doc %d is \"%s\", expected \"%s\"", what, i, r->text[i], texts[i]);
        if (lines)
            CHECK(r->line[i] == lines[i], "[%s] doc %d starts at line %llu, expected %llu", what,
                  i, U(r->line[i]), U(lines[i]));
    }
}

static void test_split_modes(void) {
    static const char data[] = "first line\r\n"  /* 1 */
                               "second\n"        /* 2 */
                               "\n"              /* 3 */
                               "  \t \r\n"       /* 4: whitespace only */
                               "third para\n"    /* 5 */
                               "still third\r\n" /* 6 */
                               "\n\n"            /* 7, 8 */
                               "\r\n"            /* 9: "\r" then newline = empty line */
                               "last, no newline"; /* 10 */
    const char *p = wpath("split.txt");
    write_file(p, data, sizeof data - 1);

    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    result r = read1(p, &o);
    const char *lines[] = {"first line", "second", "  \t ", "third para", "still third",
                           "last, no newline"};
    const uint64_t ln[] = {1, 2, 4, 5, 6, 10};
    expect_docs("line", &r, lines, ln, 6);
    CHECK(r.st.empty_skipped == 4, "line: empty_skipped %llu, expected 4", U(r.st.empty_skipped));
    CHECK(r.st.bytes_text == sizeof data - 1, "line: bytes_text %llu", U(r.st.bytes_text));
    CHECK(r.st.entries == 1 && r.st.files == 1, "line: entries %llu files %llu", U(r.st.entries),
          U(r.st.files));
    CHECK(!strcmp(r.source[0], p), "line: source \"%s\"", r.source[0]);
    result_free(&r);

    o = opts_split(TKS_SPLIT_BLANK);
    r = read1(p, &o);
    const char *paras[] = {"first line\r\nsecond", "third para\nstill third", "last, no newline"};
    const uint64_t pl[] = {1, 5, 10};
    expect_docs("blank", &r, paras, pl, 3);
    result_free(&r);

    o = opts_split(TKS_SPLIT_FILE);
    r = read1(p, &o);
    const char *whole[] = {data};
    const uint64_t wl[] = {1};
    expect_docs("file", &r, whole, wl, 1);
    result_free(&r);

    /* a "\r" not followed by "\n" stays; a file of only blank lines gives nothing */
    const char *p2 = wpath("split2.txt");
    write_file(p2, "a\rb\n\n \n\t\n", 9);
    o = opts_split(TKS_SPLIT_LINE);
    r = read1(p2, &o);
    const char *l2[] = {"a\rb", " ", "\t"};
    expect_docs("line cr", &r, l2, NULL, 3);
    result_free(&r);
    o = opts_split(TKS_SPLIT_BLANK);
    const char *p3 = wpath("blank-only.txt");
    write_file(p3, "\n \n\t\r\n\n", 7);
    r = read1(p3, &o);
    expect_docs("blank only", &r, NULL, NULL, 0);
    result_free(&r);

    /* empty file and empty gzip: no documents, no error */
    const char *pe = wpath("empty.txt");
    write_file(pe, "", 0);
    sh("gzip -c < %s > %s.gz", pe, pe);
    const char *ep[] = {pe, wpath("empty.txt.gz")};
    o = opts_split(TKS_SPLIT_FILE);
    r = read_paths(ep, 2, &o);
    CHECK(r.rc == 0 && r.docs == 0, "empty inputs: rc %d docs %llu (%s)", r.rc, U(r.docs), r.err);
    result_free(&r);
}

/* ------------------------------------------------------------------------- */
/* containers and compressions                                                */

static void test_formats(void) {
    sh("mkdir -p %s/src", W);
    for (int i = 0; i < N_SAMPLES; i++) sh("cp %s/%s %s/src/%s", PYDOC, SAMPLES[i], W, NAMES[i]);

    const char *plain[N_SAMPLES];
    for (int i = 0; i < N_SAMPLES; i++) plain[i] = wpath("src/%s", NAMES[i]);
    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    result ref = read_paths(plain, N_SAMPLES, &o);
    CHECK(ref.rc == 0 && ref.docs > 2000, "plain reference: rc %d, %llu docs (%s)", ref.rc,
          U(ref.docs), ref.err);
    CHECK(ref.st.utf8_invalid_docs == 0, "python docs are valid UTF-8");
    CHECK(ref.st.files == N_SAMPLES && ref.st.entries == N_SAMPLES, "files %llu entries %llu",
          U(ref.st.files), U(ref.st.entries));
    result_free(&ref);

    /* single-file compressions: each file compressed on its own, read in order */
    static const struct {
        const char *ext, *cmd;
    } comp[] = {
        {"gz", "gzip -9 -c %s > %s"},     {"xz", "xz -c %s > %s"},
        {"zst", "zstd -q -c %s -o %s"},   {"bz2", "bzip2 -c %s > %s"},
        {"dz", "cp %s %s.tmp && dictzip %s.tmp && mv %s.tmp.dz %s"},
        {"GZ", "gzip -c %s > %s"}, /* suffixes are case-insensitive */
    };
    for (size_t c = 0; c < sizeof comp / sizeof comp[0]; c++) {
        const char *files[N_SAMPLES];
        char store[N_SAMPLES][4096];
        for (int i = 0; i < N_SAMPLES; i++) {
            snprintf(store[i], sizeof store[i], "%s/src/%s.%s", W, NAMES[i], comp[c].ext);
            files[i] = store[i];
            if (!strcmp(comp[c].ext, "dz"))
                sh(comp[c].cmd, plain[i], store[i], store[i], store[i], store[i]);
            else
                sh(comp[c].cmd, plain[i], store[i]);
        }
        result r = read_paths(files, N_SAMPLES, &o);
        CHECK(r.rc == 0, ".%s: rc %d (%s)", comp[c].ext, r.rc, r.err);
        CHECK(r.docs == ref.docs && r.hash == ref.hash && r.bytes == ref.bytes,
              ".%s: %llu docs hash %016llx, expected %llu docs hash %016llx", comp[c].ext,
              U(r.docs), U(r.hash), U(ref.docs), U(ref.hash));
        CHECK(r.st.bytes_text == ref.st.bytes_text, ".%s: bytes_text %llu, expected %llu",
              comp[c].ext, U(r.st.bytes_text), U(ref.st.bytes_text));
        uint64_t disk = 0;
        for (int i = 0; i < N_SAMPLES; i++) {
            struct stat st;
            if (stat(files[i], &st) == 0) disk += (uint64_t)st.st_size;
        }
        CHECK(r.st.bytes_in == disk, ".%s: bytes_in %llu, files on disk %llu", comp[c].ext,
              U(r.st.bytes_in), U(disk));
        CHECK(r.n_kept > 0 && !strcmp(r.source[0], files[0]), ".%s: source \"%s\"", comp[c].ext,
              r.n_kept ? r.source[0] : "");
        result_free(&r);
    }

    /* multi-member gzip (pigz, bgzip, cat a.gz b.gz) reads as the concatenation */
    sh("cd %s/src && cat %s.gz %s.gz %s.gz %s.gz > all.txt.gz", W, NAMES[0], NAMES[1], NAMES[2],
       NAMES[3]);
    {
        result r = read1(wpath("src/all.txt.gz"), &o);
        CHECK(r.rc == 0 && r.docs == ref.docs && r.hash == ref.hash,
              "multi-member gzip: rc %d, %llu docs hash %016llx (%s)", r.rc, U(r.docs), U(r.hash),
              r.err);
        result_free(&r);
    }

    /* archives: members in archive order, "archive:member" sources */
    static const struct {
        const char *name, *cmd;
    } arc[] = {
        {"a.tar", "tar -cf"},       {"a.tar.gz", "tar -czf"}, {"a.tgz", "tar -czf"},
        {"a.tar.xz", "tar -cJf"},   {"a.txz", "tar -cJf"},    {"a.tar.zst", "tar --zstd -cf"},
        {"a.tar.bz2", "tar -cjf"},  {"A.TAR.GZ", "tar -czf"}, {"a.zip", "zip -q -X"},
        {"a-posix.tar", "tar --format=posix -cf"},
    };
    for (size_t c = 0; c < sizeof arc / sizeof arc[0]; c++) {
        sh("cd %s/src && %s ../%s %s %s %s %s", W, arc[c].cmd, arc[c].name, NAMES[0], NAMES[1],
           NAMES[2], NAMES[3]);
        const char *ap = wpath("%s", arc[c].name);
        result r = read1(ap, &o);
        CHECK(r.rc == 0, "%s: rc %d (%s)", arc[c].name, r.rc, r.err);
        CHECK(r.docs == ref.docs && r.hash == ref.hash,
              "%s: %llu docs hash %016llx, expected %llu docs hash %016llx", arc[c].name,
              U(r.docs), U(r.hash), U(ref.docs), U(ref.hash));
        CHECK(r.st.entries == N_SAMPLES && r.st.files == 1, "%s: entries %llu files %llu",
              arc[c].name, U(r.st.entries), U(r.st.files));
        CHECK(r.st.bytes_text == ref.st.bytes_text, "%s: bytes_text %llu, expected %llu",
              arc[c].name, U(r.st.bytes_text), U(ref.st.bytes_text));
        char src0[4096];
        snprintf(src0, sizeof src0, "%s:%s", ap, NAMES[0]);
        CHECK(r.n_kept > 0 && !strcmp(r.source[0], src0), "%s: source \"%s\", expected \"%s\"",
              arc[c].name, r.n_kept ? r.source[0] : "", src0);
        result_free(&r);
    }

    /* tar: directories, symlinks and hard links are not documents; a
     * non-ASCII member name works in the C locale */
    sh("cd %s/src && mkdir -p sub && cp %s sub/caf\xC3\xA9.txt && ln -sf %s link.txt && "
       "ln -f %s hard.txt && tar --format=posix -czf ../mixed.tar.gz sub link.txt hard.txt %s",
       W, NAMES[2], NAMES[0], NAMES[1], NAMES[1]);
    {
        tks_input_opts of = opts_split(TKS_SPLIT_FILE);
        result r = read1(wpath("mixed.tar.gz"), &of);
        CHECK(r.rc == 0 && r.docs == 2 && r.st.entries == 2,
              "mixed tar: rc %d docs %llu entries %llu (%s)", r.rc, U(r.docs), U(r.st.entries),
              r.err);
        CHECK(r.n_kept >= 1 && strstr(r.source[0], ":sub/caf\xC3\xA9.txt"),
              "mixed tar: source \"%s\"", r.n_kept ? r.source[0] : "");
        result_free(&r);
    }

    /* sparse tar member: holes read as zeros, same documents as the plain file */
    sh("cd %s && printf 'hello\\n' > sparse.txt && truncate -s 1M sparse.txt && "
       "printf '\\nworld\\n' >> sparse.txt && tar -S -cf sparse.tar sparse.txt", W);
    {
        result a = read1(wpath("sparse.txt"), &o), b = read1(wpath("sparse.tar"), &o);
        CHECK(a.rc == 0 && b.rc == 0 && a.docs == 2 && b.docs == 2 && a.hash == b.hash &&
                  a.st.bytes_text == b.st.bytes_text && b.st.binary_skipped == 1,
              "sparse: plain %llu docs/%llu bytes, tar %llu docs/%llu bytes, binary %llu",
              U(a.docs), U(a.st.bytes_text), U(b.docs), U(b.st.bytes_text),
              U(b.st.binary_skipped));
        result_free(&a);
        result_free(&b);
    }
}

/* The GCIDE dictionary (dictzip): ~40 MB of text; also the throughput figure. */
static void test_gcide(void) {
    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    result r = read1(GCIDE, &o);
    CHECK(r.rc == 0, "gcide: rc %d (%s)", r.rc, r.err);
    CHECK(r.st.bytes_text == 39952321, "gcide: %llu bytes of text, expected 39952321 (dict-gcide "
          "0.48.5)", U(r.st.bytes_text));
    CHECK(r.docs > 900000, "gcide: only %llu lines", U(r.docs));
    struct stat st;
    CHECK(stat(GCIDE, &st) == 0 && r.st.bytes_in == (uint64_t)st.st_size,
          "gcide: bytes_in %llu, file %llu", U(r.st.bytes_in), U(st.st_size));
    printf("gcide.dict.dz, line mode: %llu docs, %llu bytes of text (%llu compressed), %.3f s, "
           "%.0f MB/s of text\n",
           U(r.docs), U(r.st.bytes_text), U(r.st.bytes_in), r.seconds,
           (double)r.st.bytes_text / r.seconds / 1e6);

    /* the same text decompressed by gzip: identical documents */
    const char *plain = wpath("gcide.txt");
    sh("gzip -dc < %s > %s", GCIDE, plain);
    result p = read1(plain, &o);
    CHECK(p.rc == 0 && p.docs == r.docs && p.hash == r.hash && p.st.bytes_text == r.st.bytes_text,
          "gcide plain vs .dz: %llu docs hash %016llx vs %llu docs hash %016llx", U(p.docs),
          U(p.hash), U(r.docs), U(r.hash));
    CHECK(r.st.utf8_invalid_docs == p.st.utf8_invalid_docs &&
              r.st.utf8_replaced == p.st.utf8_replaced,
          "gcide: utf8 counts differ");
    printf("gcide.txt (plain), line mode: %.3f s, %.0f MB/s of text\n", p.seconds,
           (double)p.st.bytes_text / p.seconds / 1e6);

    tks_input_opts b = opts_split(TKS_SPLIT_BLANK);
    result q = read1(plain, &b);
    CHECK(q.rc == 0 && q.docs > 100000 && q.docs < p.docs, "gcide paragraphs: rc %d, %llu docs",
          q.rc, U(q.docs));
    printf("gcide.txt (plain), blank mode: %llu docs, %.0f MB/s\n", U(q.docs),
           (double)q.st.bytes_text / q.seconds / 1e6);
    result_free(&q);

    tks_input_opts f = opts_split(TKS_SPLIT_FILE);
    q = read1(GCIDE, &f);
    CHECK(q.rc == 0 && q.docs == 1 && q.bytes >= r.st.bytes_text - 16,
          "gcide as one document: rc %d docs %llu bytes %llu", q.rc, U(q.docs), U(q.bytes));
    result_free(&q);
    f.max_doc_bytes = 1 << 20; /* 1 MiB: skipped, streaming to the end */
    q = read1(GCIDE, &f);
    CHECK(q.rc == 0 && q.docs == 0 && q.st.long_skipped == 1 &&
              q.st.bytes_text == r.st.bytes_text,
          "gcide over max_doc_bytes: rc %d docs %llu long %llu text %llu", q.rc, U(q.docs),
          U(q.st.long_skipped), U(q.st.bytes_text));
    result_free(&q);
    result_free(&p);
    result_free(&r);
}

/* ------------------------------------------------------------------------- */
/* directories                                                                */

static void test_directories(void) {
    sh("cd %s && mkdir -p tree/b/a tree/empty && printf 'z\\n' > tree/b/z.txt && "
       "printf 'a\\n' > tree/a.txt && printf 'B\\n' > tree/B.txt && printf 'y\\n' > tree/b/a/y.txt && "
       "printf 'h\\n' > tree/.hidden && printf 'c\\n' | gzip > tree/c.txt.gz && "
       "printf 'd\\n' > tree/b-d.txt && ln -s .. tree/b/loop && ln -s a.txt tree/link.txt",
       W);
    const char *expect[] = {"tree/.hidden", "tree/B.txt",   "tree/a.txt",  "tree/b/a/y.txt",
                            "tree/b/z.txt", "tree/b-d.txt", "tree/c.txt.gz", "tree/link.txt"};
    const char *texts[] = {"h", "B", "a", "y", "z", "d", "c", "a"};
    const int n = 8;
    char root_buf[4096]; /* wpath's ring is reused below */
    snprintf(root_buf, sizeof root_buf, "%s", wpath("tree/")); /* the "/" is not doubled */
    const char *root = root_buf;
    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    for (int round = 0; round < 2; round++) {
        tks_input *in = NULL;
        int rc = tks_input_open(&root, 1, &o, &in);
        CHECK(rc == 0, "open tree: %d %s", rc, tks_last_error()->message);
        if (rc) return;
        CHECK(tks_input_n_files(in) == (size_t)n, "tree: %zu files, expected %d",
              tks_input_n_files(in), n);
        uint64_t sum = 0;
        for (size_t i = 0; i < tks_input_n_files(in) && i < (size_t)n; i++) {
            const char *want = wpath("%s", expect[i]);
            CHECK(!strcmp(tks_input_file(in, i), want), "tree[%zu] = %s, expected %s", i,
                  tks_input_file(in, i), want);
            sum += tks_input_file_size(in, i);
        }
        CHECK(sum == tks_input_total_bytes(in) && sum > 0, "total_bytes %llu vs %llu",
              U(tks_input_total_bytes(in)), U(sum));
        CHECK(tks_input_file(in, 99) == NULL, "out of range file");
        tks_input_free(in);
    }
    result r = read1(root, &o);
    expect_docs("tree docs", &r, texts, NULL, n);
    result_free(&r);

    /* explicit paths keep the given order */
    const char *paths[] = {wpath("tree/b-d.txt"), wpath("tree/a.txt"), wpath("tree/b")};
    r = read_paths(paths, 3, &o);
    const char *t2[] = {"d", "a", "y", "z"};
    expect_docs("explicit order", &r, t2, NULL, 4);
    result_free(&r);
    /* a file named and also inside a named directory would be read twice: refused, both named */
    const char *twice[] = {wpath("tree/b/z.txt"), wpath("tree/a.txt"), wpath("tree/b")};
    {
        tks_input *in = NULL;
        int rc = tks_input_open(twice, 3, &o, &in);
        CHECK(rc == TKS_ERR_ARG && strstr(tks_last_error()->message, "is the same file as") &&
                  strstr(tks_last_error()->message, "tree/b/z.txt"),
              "a file given twice: rc %d %s", rc, tks_last_error()->message);
        tks_input_free(in);
    }
    /* a symlink to a directory is followed when named explicitly */
    const char *loop = wpath("tree/b/loop");
    r = read1(loop, &o);
    expect_docs("explicit dir symlink", &r, texts, NULL, n);
    result_free(&r);
}

/* ------------------------------------------------------------------------- */
/* JSONL                                                                      */

static void test_jsonl(void) {
    static const char good_bad[] =
        "{\"text\": \"hello\", \"id\": 1}\n"                   /* 1 */
        "{\"text\": \"multi\\nline \\u00e9\\ud83d\\ude00\"}\n" /* 2 */
        "{\"text\": \"broken\"\n"                              /* 3: unterminated */
        "\n"                                                   /* 4: blank, ignored */
        "{\"id\": 5}\n"                                        /* 5: no key */
        "{\"text\": 6}\n"                                      /* 6: not a string */
        "[\"text\", \"array\"]\n"                              /* 7: not an object */
        "{\"text\": \"\"}\r\n"                                 /* 8: empty doc */
        "{\"text\": \"a\\u0000b\"}\n"                          /* 9: NUL */
        "{\"text\": \"bad \xC3\x28 utf8\"}\n"                  /* 10: invalid UTF-8 */
        "{\"text\": \"last\"}";                                /* 11: no newline */
    const char *p = wpath("recs.jsonl");
    write_file(p, good_bad, sizeof good_bad - 1);

    tks_input_opts o;
    tks_input_opts_default(&o); /* AUTO, FAIL on bad records */
    result r = read1(p, &o);
    CHECK(r.rc == TKS_ERR_JSONL, "jsonl fail: rc %d", r.rc);
    char want[4200];
    snprintf(want, sizeof want, "%s:3:", p);
    CHECK(strstr(r.err, want) != NULL, "jsonl fail: message \"%s\" lacks \"%s\"", r.err, want);
    CHECK(r.err_line == 3 && r.err_doc == 2, "jsonl fail: line %llu doc %llu", U(r.err_line),
          U(r.err_doc));
    CHECK(r.docs == 2, "jsonl fail: %llu docs before the error", U(r.docs));
    const char *first[] = {"hello", "multi\nline \xC3\xA9\xF0\x9F\x98\x80"};
    const uint64_t fl[] = {1, 2};
    if (r.docs == 2) {
        r.rc = 0; /* compare the docs before the error */
        expect_docs("jsonl first two", &r, first, fl, 2);
    }
    result_free(&r);

    o.bad_record = TKS_POLICY_SKIP;
    r = read1(p, &o);
    const char *all[] = {"hello", "multi\nline \xC3\xA9\xF0\x9F\x98\x80", "last"};
    const uint64_t al[] = {1, 2, 11};
    expect_docs("jsonl skip", &r, all, al, 3);
    CHECK(r.st.bad_records_skipped == 6, "jsonl skip: %llu bad records, expected 6",
          U(r.st.bad_records_skipped));
    CHECK(r.st.empty_skipped == 1, "jsonl skip: %llu empty", U(r.st.empty_skipped));
    result_free(&r);

    /* a custom key; jansson's message names the problem */
    const char *pk = wpath("custom.jsonl");
    const char *ck = "{\"content\": \"x y\", \"text\": 1}\n{\"text\": \"t\"}\n";
    write_file(pk, ck, strlen(ck));
    o.jsonl_key = "content";
    o.bad_record = TKS_POLICY_FAIL;
    r = read1(pk, &o);
    CHECK(r.rc == TKS_ERR_JSONL && r.docs == 1 && r.n_kept == 1 && !strcmp(r.text[0], "x y"),
          "custom key: rc %d docs %llu", r.rc, U(r.docs));
    CHECK(strstr(r.err, ":2:") && strstr(r.err, "\"content\""), "custom key message: %s", r.err);
    result_free(&r);
    o.jsonl_key = NULL;

    /* compressed JSONL and JSONL inside an archive are detected by name */
    sh("cd %s && printf '{\"text\": \"one\"}\\n{\"text\": \"two\"}\\n' > j.jsonl && "
       "gzip -c j.jsonl > j.jsonl.gz && zstd -q -c j.jsonl -o j.JSONL.zst && "
       "tar -czf j.tar.gz j.jsonl split.txt",
       W);
    const char *jp[] = {wpath("j.jsonl.gz"), wpath("j.JSONL.zst")};
    tks_input_opts ol = opts_split(TKS_SPLIT_LINE);
    r = read_paths(jp, 2, &ol);
    const char *jt[] = {"one", "two", "one", "two"};
    expect_docs("jsonl compressed", &r, jt, NULL, 4);
    result_free(&r);
    r = read1(wpath("j.tar.gz"), &ol);
    CHECK(r.rc == 0 && r.docs == 8 && r.n_kept == 8 && !strcmp(r.text[0], "one") &&
              !strcmp(r.text[2], "first line"),
          "jsonl in tar: rc %d docs %llu (%s)", r.rc, U(r.docs), r.err);
    result_free(&r);

    /* auto: a *.json member of a source archive (a config file, not JSON
     * Lines) is text, counted; only *.jsonl is JSONL */
    sh("cd %s && printf '{\n  \"name\": \"cfg\"\n}\n' > conf.json && "
       "tar -cf src.tar conf.json j.jsonl", W);
    r = read1(wpath("src.tar"), &ol);
    CHECK(r.rc == 0 && r.docs == 5 && !strcmp(r.text[0], "{") && !strcmp(r.text[3], "one") &&
              r.st.json_as_text == 1 && r.st.bad_records_skipped == 0,
          "*.json in tar read as text: rc %d docs %llu json_as_text %llu (%s)", r.rc, U(r.docs),
          U(r.st.json_as_text), r.err);
    result_free(&r);
    ol.format = TKS_FMT_JSONL; /* asked for: a *.json that is not JSONL is a bad record */
    r = read1(wpath("conf.json"), &ol);
    CHECK(r.rc == TKS_ERR_JSONL && strstr(r.err, "conf.json:1"), "--format jsonl on conf.json: rc %d (%s)",
          r.rc, r.err);
    result_free(&r);
    ol.format = TKS_FMT_AUTO;

    /* compressed members of archives are decompressed too */
    sh("cd %s && cp src/%s.zst . && tar -cf nested.tar j.jsonl.gz %s.zst && "
       "zip -q -X nested.zip j.jsonl.gz %s.zst && cp trunc.txt.gz t.txt.gz && "
       "tar -cf nested-bad.tar j.jsonl.gz t.txt.gz",
       W, NAMES[0], NAMES[0], NAMES[0]);
    {
        const char *sep[] = {wpath("j.jsonl"), wpath("src/%s", NAMES[0])};
        result want = read_paths(sep, 2, &ol);
        for (int k = 0; k < 2; k++) {
            const char *np = wpath(k ? "nested.zip" : "nested.tar");
            result got = read1(np, &ol);
            char src0[4200];
            snprintf(src0, sizeof src0, "%s:j.jsonl.gz", np);
            CHECK(got.rc == 0 && got.docs == want.docs && got.hash == want.hash && want.docs > 100 &&
                      got.n_kept && !strcmp(got.source[0], src0) && !strcmp(got.text[0], "one"),
                  "%s: rc %d, %llu docs, expected %llu (%s)", np, got.rc, U(got.docs),
                  U(want.docs), got.err);
            CHECK(got.st.entries == 2 && got.st.bytes_text == want.st.bytes_text,
                  "%s: entries %llu bytes_text %llu/%llu", np, U(got.st.entries),
                  U(got.st.bytes_text), U(want.st.bytes_text));
            result_free(&got);
        }
        result_free(&want);
        const char *bp = wpath("nested-bad.tar");
        result bad = read1(bp, &ol);
        char where[4200];
        snprintf(where, sizeof where, "%s:t.txt.gz", bp);
        CHECK(bad.rc == TKS_ERR_INPUT && strstr(bad.err, where) && bad.docs == 2,
              "truncated member: rc %d docs %llu: %s", bad.rc, U(bad.docs), bad.err);
        result_free(&bad);
    }

    /* forced formats */
    ol.format = TKS_FMT_TEXT;
    r = read1(wpath("j.jsonl"), &ol);
    const char *raw[] = {"{\"text\": \"one\"}", "{\"text\": \"two\"}"};
    expect_docs("jsonl read as text", &r, raw, NULL, 2);
    result_free(&r);
    ol.format = TKS_FMT_JSONL;
    sh("cp %s/j.jsonl %s/j.data", W, W);
    r = read1(wpath("j.data"), &ol);
    expect_docs("forced jsonl", &r, jt, NULL, 2);
    result_free(&r);
}

/* ------------------------------------------------------------------------- */
/* invalid UTF-8, NUL bytes, long documents                                   */

static void test_policies(void) {
    static const char bad[] = "good line\n"
                              "caf\xE9 latin-1\n"          /* line 2: invalid at byte 3 */
                              "ok \xC3\xA9\n"
                              "two \xC0\xAF bad \xFF\n"    /* line 4: 3 subsequences */
                              "nul\0inside\n"              /* line 5: binary */
                              "end\n";
    const char *p = wpath("bad.txt");
    write_file(p, bad, sizeof bad - 1);

    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    o.invalid_utf8 = TKS_POLICY_REPLACE;
    result r = read1(p, &o);
    const char *rep[] = {"good line", "caf" R " latin-1", "ok \xC3\xA9", "two " R R " bad " R,
                         "end"};
    expect_docs("utf8 replace", &r, rep, NULL, 5);
    CHECK(r.st.utf8_invalid_docs == 2 && r.st.utf8_replaced == 4 && r.st.utf8_skipped == 0 &&
              r.st.binary_skipped == 1,
          "utf8 replace: invalid %llu replaced %llu skipped %llu binary %llu",
          U(r.st.utf8_invalid_docs), U(r.st.utf8_replaced), U(r.st.utf8_skipped),
          U(r.st.binary_skipped));
    result_free(&r);

    o.invalid_utf8 = TKS_POLICY_SKIP;
    r = read1(p, &o);
    const char *skp[] = {"good line", "ok \xC3\xA9", "end"};
    expect_docs("utf8 skip", &r, skp, NULL, 3);
    CHECK(r.st.utf8_invalid_docs == 2 && r.st.utf8_skipped == 2 && r.st.utf8_replaced == 0,
          "utf8 skip: invalid %llu skipped %llu", U(r.st.utf8_invalid_docs),
          U(r.st.utf8_skipped));
    result_free(&r);

    o.invalid_utf8 = TKS_POLICY_FAIL;
    r = read1(p, &o);
    char want[4200];
    snprintf(want, sizeof want, "%s:2:", p);
    CHECK(r.rc == TKS_ERR_UTF8 && strstr(r.err, want) && strstr(r.err, "byte 3") &&
              r.err_line == 2 && r.err_offset == 13 && r.docs == 1, /* offset in the file */
          "utf8 fail: rc %d line %llu offset %llu docs %llu: %s", r.rc, U(r.err_line),
          U(r.err_offset), U(r.docs), r.err);
    result_free(&r);

    /* file mode: the whole entry is replaced/skipped/binary */
    tks_input_opts f = opts_split(TKS_SPLIT_FILE);
    r = read1(p, &f);
    CHECK(r.rc == 0 && r.docs == 0 && r.st.binary_skipped == 1,
          "file with NUL: docs %llu binary %llu", U(r.docs), U(r.st.binary_skipped));
    result_free(&r);
    const char *p2 = wpath("latin1.txt");
    write_file(p2, "na\xEFve caf\xE9\n", 11);
    r = read1(p2, &f);
    CHECK(r.rc == 0 && r.docs == 1 && r.n_kept == 1 && !strcmp(r.text[0], "na" R "ve caf" R "\n"),
          "latin-1 file replaced: docs %llu", U(r.docs));
    result_free(&r);
    f.invalid_utf8 = TKS_POLICY_FAIL;
    r = read1(p2, &f);
    CHECK(r.rc == TKS_ERR_UTF8 && r.err_offset == 2 && r.err_line == 1 && strstr(r.err, "byte 2"),
          "latin-1 file fail: rc %d offset %llu: %s", r.rc, U(r.err_offset), r.err);
    result_free(&r);
    /* paragraph: the offset is counted from the start of the entry */
    tks_input_opts bl = opts_split(TKS_SPLIT_BLANK);
    bl.invalid_utf8 = TKS_POLICY_FAIL;
    const char *p4 = wpath("para-bad.txt");
    static const char pb[] = "ok\n\nline one\r\nline \xFF two\n";
    write_file(p4, pb, sizeof pb - 1);
    r = read1(p4, &bl);
    CHECK(r.rc == TKS_ERR_UTF8 && r.docs == 1 && r.err_line == 3 && r.err_offset == 19 &&
              strstr(r.err, "byte 15"),
          "paragraph utf8 fail: rc %d line %llu offset %llu: %s", r.rc, U(r.err_line),
          U(r.err_offset), r.err);
    result_free(&r);
    /* a real binary file */
    sh("head -c 5000 /bin/sh > %s/binary.bin", W);
    r = read1(wpath("binary.bin"), &f);
    CHECK(r.rc == 0 && r.docs == 0 && r.st.binary_skipped == 1, "ELF binary: docs %llu",
          U(r.docs));
    result_free(&r);

    /* long documents: line, paragraph, file, JSONL */
    static const char lines[] = "short\n0123456789abcdef\nok\n\nfits in ten\nend";
    const char *pl = wpath("long.txt");
    write_file(pl, lines, sizeof lines - 1);
    o = opts_split(TKS_SPLIT_LINE);
    o.max_doc_bytes = 10;
    r = read1(pl, &o);
    const char *ll[] = {"short", "ok", "end"};
    expect_docs("long line skip", &r, ll, NULL, 3);
    CHECK(r.st.long_skipped == 2, "long line skip: %llu", U(r.st.long_skipped));
    result_free(&r);
    o.max_doc_bytes = 11; /* exactly the limit fits */
    r = read1(pl, &o);
    CHECK(r.docs == 4 && r.st.long_skipped == 1, "limit 11: docs %llu long %llu", U(r.docs),
          U(r.st.long_skipped));
    result_free(&r);
    o.max_doc_bytes = 10;
    o.long_doc = TKS_POLICY_FAIL;
    r = read1(pl, &o);
    snprintf(want, sizeof want, "%s:2:", pl);
    CHECK(r.rc == TKS_ERR_DOC_TOO_LONG && strstr(r.err, want) && strstr(r.err, "--max-doc-bytes") &&
              strstr(r.err, "10 bytes") && r.err_line == 2,
          "long line fail: rc %d: %s", r.rc, r.err);
    result_free(&r);

    o = opts_split(TKS_SPLIT_BLANK);
    o.max_doc_bytes = 12;
    r = read1(pl, &o);
    const char *lp[] = {"fits in ten\nend"};
    o.max_doc_bytes = 15;
    result r2 = read1(pl, &o);
    CHECK(r.docs == 0 && r.st.long_skipped == 2, "long para (12): docs %llu long %llu",
          U(r.docs), U(r.st.long_skipped));
    expect_docs("long para (15)", &r2, lp, NULL, 1);
    result_free(&r);
    result_free(&r2);

    o = opts_split(TKS_SPLIT_FILE);
    o.max_doc_bytes = 20;
    o.long_doc = TKS_POLICY_FAIL;
    r = read1(pl, &o);
    CHECK(r.rc == TKS_ERR_DOC_TOO_LONG && r.err_line == 1, "long file fail: rc %d", r.rc);
    result_free(&r);

    tks_input_opts j;
    tks_input_opts_default(&j);
    j.max_doc_bytes = 4;
    r = read1(wpath("j.jsonl"), &j);
    CHECK(r.rc == 0 && r.docs == 2, "jsonl at limit: %llu docs", U(r.docs));
    result_free(&r);
    j.max_doc_bytes = 2;
    r = read1(wpath("j.jsonl"), &j);
    CHECK(r.rc == 0 && r.docs == 0 && r.st.long_skipped == 2, "jsonl over limit: %llu docs",
          U(r.docs));
    result_free(&r);
}

/* ------------------------------------------------------------------------- */
/* gzip integrity: every member's CRC32 and ISIZE trailer is checked          */

static uint64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Flips bit `bit` of the byte `from_end` bytes before the end of the file. */
static void flip_bit(const char *path, long from_end, int bit) {
    FILE *f = fopen(path, "r+b");
    int c = EOF;
    if (f && fseek(f, -from_end, SEEK_END) == 0) c = fgetc(f);
    if (c == EOF || fseek(f, -from_end, SEEK_END) != 0 || fputc(c ^ (1 << bit), f) == EOF) {
        fprintf(stderr, "FAIL: cannot change %s\n", path);
        exit(1);
    }
    fclose(f);
}

/* A damaged gzip trailer: TKS_ERR_INPUT naming `where`, saying what differs
 * (`what`: "CRC32", "ISIZE" or another part of the message) and what to do. */
static void expect_gzip_error(const char *label, const result *r, const char *where,
                              const char *what) {
    CHECK(r->rc == TKS_ERR_INPUT && strstr(r->err, where) && strstr(r->err, what) &&
              strstr(r->err, "corrupt") && strstr(r->err, "re-download or re-create"),
          "[%s] rc %d, expected TKS_ERR_INPUT naming %s and %s: %s", label, r->rc, where, what,
          r->err);
}

/*
 * libarchive 3.6.2's gzip filter never reads the trailer (RFC 1952 section
 * 2.3.1: CRC32 then ISIZE, the last 8 bytes of each member), so every damaged
 * file below used to read as altered text; input.c inflates gzip itself with
 * zlib. Needs test_formats (src/ *.gz, a.tar.gz, a.tgz) and test_corrupt.
 */
static void test_gzip_integrity(void) {
    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    char good[4096], bad[4096], want[4200];
    snprintf(good, sizeof good, "%s/src/%s.gz", W, NAMES[3]);
    result ref = read1(good, &o);
    CHECK(ref.rc == 0 && ref.docs > 100, "intact %s: rc %d (%s)", good, ref.rc, ref.err);

    /* (1) each of the 4 CRC32 and 4 ISIZE bytes of a .gz; a damaged file
     * under 1 MiB of text yields nothing (it is inflated whole first) */
    for (int k = 0; k < 8; k++) {
        snprintf(bad, sizeof bad, "%s/trailer-%d.txt.gz", W, k);
        sh("cp %s %s", good, bad);
        flip_bit(bad, 8 - k, k);
        result r = read1(bad, &o);
        expect_gzip_error(k < 4 ? "CRC32 byte" : "ISIZE byte", &r, bad, k < 4 ? "CRC32" : "ISIZE");
        CHECK(strstr(r.err, k < 4 ? "gzip checksum mismatch" : "gzip length mismatch") &&
                  strstr(r.err, "does not match") && r.docs == 0,
              "trailer byte %d: %llu docs: %s", k, U(r.docs), r.err);
        result_free(&r);
    }
    /* a dictzip file (gzip with an FEXTRA header) */
    sh("cd %s && cp src/%s gc.txt && dictzip gc.txt && cp gc.txt.dz gc-bad.txt.dz", W, NAMES[3]);
    snprintf(bad, sizeof bad, "%s/gc-bad.txt.dz", W);
    flip_bit(bad, 6, 3);
    {
        result r = read1(bad, &o), g = read1(wpath("gc.txt.dz"), &o);
        expect_gzip_error(".dz CRC32", &r, bad, "CRC32");
        CHECK(g.rc == 0 && g.hash == ref.hash, "intact .dz: rc %d (%s)", g.rc, g.err);
        result_free(&r);
        result_free(&g);
    }

    /* (2) .tar.gz and .tgz: the CRC32 and the ISIZE of the archive's stream */
    static const char *const tars[] = {"a.tar.gz", "a.tgz", "A.TAR.GZ"};
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 2; k++) {
            snprintf(bad, sizeof bad, "%s/bad-%d-%s", W, k, tars[t]);
            sh("cp %s/%s %s", W, tars[t], bad);
            flip_bit(bad, k ? 2 : 7, 5);
            result r = read1(bad, &o);
            expect_gzip_error(tars[t], &r, bad, k ? "ISIZE" : "CRC32");
            result_free(&r);
        }
    /* A tar whose end-of-archive blocks end exactly at 1 MiB, followed by
     * the zero padding of its last 10 KiB record: libarchive stops reading
     * at the end-of-archive mark, so the trailer is only checked because
     * input.c inflates the rest of the stream itself. */
    {
        size_t n = (1u << 20) - 512 - 1024; /* header, data, two empty blocks = 1 MiB */
        char *d = malloc(n);
        for (size_t i = 0; i < n; i++) d[i] = i % 64 == 63 ? '\n' : (char)('a' + (i / 64) % 26);
        write_file(wpath("mib.txt"), d, n);
        free(d);
        sh("cd %s && tar -b 20 -cf mib.tar mib.txt && gzip -c mib.tar > mib.tar.gz && "
           "cp mib.tar.gz mib-bad.tar.gz", W);
        CHECK(file_size(wpath("mib.tar")) == 103 * 10240, "mib.tar is %llu bytes",
              U(file_size(wpath("mib.tar"))));
        snprintf(bad, sizeof bad, "%s/mib-bad.tar.gz", W);
        flip_bit(bad, 8, 0);
        result g = read1(wpath("mib.tar.gz"), &o), r = read1(bad, &o);
        CHECK(g.rc == 0 && g.docs == n / 64 && g.st.bytes_in == file_size(wpath("mib.tar.gz")),
              "mib.tar.gz: rc %d docs %llu bytes_in %llu (%s)", g.rc, U(g.docs),
              U(g.st.bytes_in), g.err);
        expect_gzip_error("CRC32 after the end of a tar", &r, bad, "CRC32");
        result_free(&g);
        result_free(&r);
    }

    /* (3) multi-member gzip: every member is checked, zero padding after the
     * last is allowed, other trailing bytes are not */
    snprintf(bad, sizeof bad, "%s/multi-bad1.txt.gz", W);
    sh("cd %s && cat trailer-1.txt.gz src/%s.gz > multi-bad1.txt.gz && "
       "cat src/%s.gz trailer-6.txt.gz > multi-bad2.txt.gz && "
       "cat src/%s.gz src/%s.gz > multi.txt.gz && head -c 3000 /dev/zero >> multi.txt.gz && "
       "cat src/%s.gz > garbage-after.txt.gz && printf 'x' >> garbage-after.txt.gz && "
       "cat src/%s.gz > zero-garbage.txt.gz && printf '\\0\\0\\037\\213' >> zero-garbage.txt.gz",
       W, NAMES[0], NAMES[0], NAMES[0], NAMES[3], NAMES[3], NAMES[3]);
    {
        result r = read1(bad, &o);
        expect_gzip_error("member 1 of 2", &r, bad, "CRC32 in the trailer of gzip member 1");
        result_free(&r);
        snprintf(bad, sizeof bad, "%s/multi-bad2.txt.gz", W);
        r = read1(bad, &o);
        expect_gzip_error("member 2 of 2", &r, bad, "ISIZE) in the trailer of gzip member 2");
        result_free(&r);
        const char *two[] = {wpath("src/%s", NAMES[0]), wpath("src/%s", NAMES[3])};
        result want2 = read_paths(two, 2, &o);
        r = read1(wpath("multi.txt.gz"), &o);
        CHECK(r.rc == 0 && r.docs == want2.docs && r.hash == want2.hash &&
                  r.st.bytes_in == file_size(wpath("multi.txt.gz")),
              "two members and zero padding: rc %d docs %llu/%llu (%s)", r.rc, U(r.docs),
              U(want2.docs), r.err);
        result_free(&r);
        result_free(&want2);
        snprintf(bad, sizeof bad, "%s/garbage-after.txt.gz", W);
        r = read1(bad, &o);
        expect_gzip_error("garbage after the last member", &r, bad, "are not a gzip member");
        result_free(&r);
        snprintf(bad, sizeof bad, "%s/zero-garbage.txt.gz", W);
        r = read1(bad, &o);
        expect_gzip_error("a member after zero padding", &r, bad, "are not a gzip member");
        result_free(&r);
    }

    /* (4) truncated inside the trailer, or just after the header */
    static const int cut[] = {1, 4, 5, 8};
    for (int i = 0; i < 4; i++) {
        snprintf(bad, sizeof bad, "%s/cut-%d.txt.gz", W, cut[i]);
        sh("head -c %llu %s > %s", U(file_size(good) - (uint64_t)cut[i]), good, bad);
        result r = read1(bad, &o);
        expect_gzip_error("trailer cut", &r, bad, "before its CRC32 and length trailer");
        result_free(&r);
    }
    snprintf(bad, sizeof bad, "%s/cut-header.txt.gz", W);
    sh("head -c 12 %s > %s", good, bad);
    {
        result r = read1(bad, &o);
        expect_gzip_error("header only", &r, bad, "corrupt or truncated");
        result_free(&r);
    }

    /* (5) gzip members of archives: named "archive:member" */
    sh("cd %s && tar -cf nested-crc.tar j.jsonl.gz trailer-2.txt.gz && "
       "zip -q -X nested-crc.zip j.jsonl.gz trailer-2.txt.gz && "
       "tar -czf nested-crc.tar.gz j.jsonl.gz trailer-2.txt.gz",
       W);
    static const char *const nests[] = {"nested-crc.tar", "nested-crc.zip", "nested-crc.tar.gz"};
    for (int i = 0; i < 3; i++) {
        snprintf(want, sizeof want, "%s/%s:trailer-2.txt.gz", W, nests[i]);
        result r = read1(wpath("%s", nests[i]), &o);
        expect_gzip_error(nests[i], &r, want, "CRC32");
        CHECK(r.docs == 2, "%s: %llu docs before the damaged member", nests[i], U(r.docs));
        result_free(&r);
    }

    /* (6) gzip found by its magic, not by its name: a mis-named file or
     * member, gzip inside gzip or inside xz; nesting is bounded */
    sh("cd %s && cp %s misnamed.txt && cp trailer-3.txt.gz misnamed-bad.txt && "
       "mkdir -p mis && cp %s mis/inner.txt && tar -cf mis.tar -C mis inner.txt && "
       "gzip -c %s > double.gz.gz && gzip -c trailer-0.txt.gz > double-bad.gz.gz && "
       "xz -c %s > inner.gz.xz && xz -c trailer-5.txt.gz > inner-bad.gz.xz && "
       "cp %s deep5.gz && "
       "for i in 1 2 3 4; do gzip -c deep5.gz > d.tmp && mv d.tmp deep5.gz; done && "
       "gzip -c deep5.gz > deep6.gz",
       W, good, good, good, good, good);
    static const char *const same[] = {"misnamed.txt", "mis.tar", "double.gz.gz", "inner.gz.xz",
                                       "deep5.gz"};
    for (int i = 0; i < 5; i++) {
        result r = read1(wpath("%s", same[i]), &o);
        CHECK(r.rc == 0 && r.docs == ref.docs && r.hash == ref.hash,
              "%s: rc %d, %llu docs, expected %llu (%s)", same[i], r.rc, U(r.docs), U(ref.docs),
              r.err);
        result_free(&r);
    }
    static const struct {
        const char *name, *where, *what;
    } worse[] = {
        {"misnamed-bad.txt", "misnamed-bad.txt", "CRC32"},
        {"double-bad.gz.gz", "double-bad.gz.gz", "CRC32"},
        {"inner-bad.gz.xz", "inner-bad.gz.xz", "ISIZE"},
        {"deep6.gz", "deep6.gz", "nested too deeply"},
    };
    for (int i = 0; i < 4; i++) {
        snprintf(want, sizeof want, "%s/%s", W, worse[i].where);
        result r = read1(want, &o);
        CHECK(r.rc == TKS_ERR_INPUT && strstr(r.err, want) && strstr(r.err, worse[i].what),
              "%s: rc %d: %s", worse[i].name, r.rc, r.err);
        result_free(&r);
    }

    /* (7) a pipe: read once, gzip or not */
    sh("cd %s && mkfifo fifo-gz fifo-bad fifo-txt && "
       "(timeout 60 cat %s > fifo-gz &) && (timeout 60 cat trailer-0.txt.gz > fifo-bad &) && "
       "(timeout 60 cat src/%s > fifo-txt &)",
       W, good, NAMES[3]);
    {
        result r = read1(wpath("fifo-gz"), &o);
        CHECK(r.rc == 0 && r.docs == ref.docs && r.hash == ref.hash &&
                  r.st.bytes_in == file_size(good),
              "gzip through a pipe: rc %d docs %llu bytes_in %llu (%s)", r.rc, U(r.docs),
              U(r.st.bytes_in), r.err);
        result_free(&r);
        snprintf(bad, sizeof bad, "%s/fifo-bad", W);
        r = read1(bad, &o);
        expect_gzip_error("damaged gzip through a pipe", &r, bad, "CRC32");
        result_free(&r);
        r = read1(wpath("fifo-txt"), &o);
        CHECK(r.rc == 0 && r.docs == ref.docs && r.hash == ref.hash,
              "text through a pipe: rc %d docs %llu (%s)", r.rc, U(r.docs), r.err);
        result_free(&r);
    }
    result_free(&ref);
}

/* ------------------------------------------------------------------------- */
/* corrupt inputs, bad arguments                                              */

static void test_corrupt(void) {
    const char *gz = wpath("src/%s.gz", NAMES[3]);
    sh("cd %s && head -c $(( $(stat -c %%s %s) / 2 )) %s > trunc.txt.gz", W, gz, gz);
    tks_input_opts o = opts_split(TKS_SPLIT_LINE);
    const char *tp = wpath("trunc.txt.gz");
    result r = read1(tp, &o);
    CHECK(r.rc == TKS_ERR_INPUT && strstr(r.err, tp) && strstr(r.err, "corrupt or truncated"),
          "truncated gz: rc %d: %s", r.rc, r.err);
    result_free(&r);

    /* garbage in the middle of a .tar.gz (fixed pseudo-random bytes) */
    sh("cp %s/a.tar.gz %s/garbage.tar.gz", W, W);
    const char *gp = wpath("garbage.tar.gz");
    FILE *g = fopen(gp, "r+b");
    CHECK(g && fseek(g, 30000, SEEK_SET) == 0, "cannot open %s", gp);
    if (g) {
        uint32_t x = 12345;
        for (int i = 0; i < 4096; i++) {
            x = x * 1103515245u + 12345u;
            fputc((int)(x >> 24), g);
        }
        fclose(g);
    }
    r = read1(gp, &o);
    CHECK(r.rc == TKS_ERR_INPUT && strstr(r.err, gp), "garbage tar.gz: rc %d: %s", r.rc, r.err);
    result_free(&r);

    /* zip member whose stored bytes were changed: CRC mismatch names the member */
    sh("cd %s/src && zip -q -0 -X ../stored.zip %s %s", W, NAMES[0], NAMES[2]);
    sh("cd %s && printf 'XXXX' | dd of=stored.zip bs=1 seek=5000 conv=notrunc status=none", W);
    const char *zp = wpath("stored.zip");
    r = read1(zp, &o);
    char want[4200];
    snprintf(want, sizeof want, "%s:%s", zp, NAMES[0]);
    CHECK(r.rc == TKS_ERR_INPUT && strstr(r.err, want), "bad zip CRC: rc %d: %s", r.rc, r.err);
    result_free(&r);

    /* an archive name on something that is not an archive */
    sh("cp %s/src/%s %s/notreally.tar", W, NAMES[0], W);
    r = read1(wpath("notreally.tar"), &o);
    CHECK(r.rc == TKS_ERR_INPUT, "text named .tar: rc %d: %s", r.rc, r.err);
    result_free(&r);

    /* missing paths fail at open, naming the path */
    const char *miss = wpath("does/not/exist.txt");
    const char *mp[] = {wpath("split.txt"), miss};
    tks_input *in = (tks_input *)1;
    int rc = tks_input_open(mp, 2, &o, &in);
    CHECK(rc == TKS_ERR_IO && in == NULL && strstr(tks_last_error()->message, miss),
          "missing path: rc %d: %s", rc, tks_last_error()->message);
    r = read1(miss, &o);
    CHECK(r.rc == TKS_ERR_IO, "missing path via read1: %d", r.rc);
    result_free(&r);
    sh("ln -sf nowhere %s/dangling.txt", W);
    r = read1(wpath("dangling.txt"), &o);
    CHECK(r.rc == TKS_ERR_IO, "dangling symlink: %d", r.rc);
    result_free(&r);

    /* bad arguments */
    CHECK(tks_input_open(mp, 0, &o, &in) == TKS_ERR_ARG, "no paths");
    tks_input_opts bad = o;
    bad.long_doc = TKS_POLICY_REPLACE;
    CHECK(tks_input_open(mp, 1, &bad, &in) == TKS_ERR_ARG, "long_doc replace");
    bad = o;
    bad.split = (tks_doc_split)7;
    CHECK(tks_input_open(mp, 1, &bad, &in) == TKS_ERR_ARG, "bad split");
    tks_input_free(NULL);
}

/* tks_input_tell / tks_input_seek: from a position taken after any document,
 * a fresh input sought there yields exactly the documents that followed, with
 * the same ordinals, in every container, compression and split mode. */
typedef struct doc_rec {
    uint64_t hash, ordinal;
    tks_input_pos after;
} doc_rec;

static void check_seek(const char *label, const char *const *paths, size_t n, const tks_input_opts *o,
                       int want_plain) {
    tks_input *in = NULL;
    CHECK(tks_input_open(paths, n, o, &in) == 0, "%s: open: %s", label, tks_last_error()->message);
    if (!in) return;
    size_t cap = 1024, nd = 0;
    doc_rec *d = malloc(cap * sizeof *d);
    tks_input_pos start;
    tks_input_tell(in, &start);
    tks_doc doc;
    int r, plain = 0;
    while ((r = tks_input_next(in, &doc)) == 1) {
        if (nd == cap) d = realloc(d, (cap *= 2) * sizeof *d);
        d[nd].hash = XXH3_64bits(doc.text, doc.len);
        d[nd].ordinal = doc.ordinal;
        tks_input_tell(in, &d[nd].after);
        plain |= d[nd].after.plain;
        nd++;
    }
    CHECK(r == 0 && nd > 0, "%s: read: rc %d, %zu docs", label, r, nd);
    tks_input_free(in);
    if (want_plain) CHECK(plain, "%s: plain files are entered by lseek (pos.plain set)", label);
    /* about 12 positions spread over the documents, plus the start and the last */
    size_t step = nd / 12 ? nd / 12 : 1;
    for (size_t k = 0; k <= nd; k += (k + step > nd && k != nd) ? nd - k : step) {
        const tks_input_pos *pos = k == 0 ? &start : &d[k - 1].after;
        tks_input *s = NULL;
        int rc = tks_input_open(paths, n, o, &s);
        if (!rc) rc = tks_input_seek(s, pos);
        size_t i = k, bad = 0;
        while (!rc && (r = tks_input_next(s, &doc)) == 1) {
            if (i >= nd || d[i].hash != XXH3_64bits(doc.text, doc.len) || d[i].ordinal != doc.ordinal)
                bad++;
            i++;
        }
        CHECK(rc == 0 && r == 0 && bad == 0 && i == nd,
              "%s: seek after document %zu (file %llu entry %llu offset %llu): rc %d, %zu docs "
              "read, %zu differ, expected %zu (%s)",
              label, k, U(pos->file), U(pos->entry), U(pos->offset), rc, i - k, bad, nd - k,
              tks_last_error()->message);
        tks_input_free(s);
        if (k == nd) break;
    }
    free(d);
}

static void test_seek(void) {
    sh("mkdir -p %s/seek && cp %s/library/functions.rst.txt %s/library/stdtypes.rst.txt %s/seek/", W,
       PYDOC, PYDOC, W);
    sh("cd %s/seek && printf '{\"text\": \"one\"}\\n\\n{\"text\": \"two\\\\nlines\"}\\n{\"text\": \"three\"}\\n' > d.jsonl", W);
    sh("cd %s/seek && gzip -c functions.rst.txt > f.txt.gz && tar czf t.tar.gz functions.rst.txt d.jsonl "
       "stdtypes.rst.txt && tar cf t.tar stdtypes.rst.txt functions.rst.txt", W);
    const char *plain[] = {wpath("seek/functions.rst.txt"), wpath("seek/d.jsonl"), wpath("seek/stdtypes.rst.txt")};
    const char *mixed[] = {wpath("seek/f.txt.gz"), wpath("seek/t.tar.gz"), wpath("seek/t.tar"),
                           wpath("seek/stdtypes.rst.txt")};
    static const tks_doc_split splits[] = {TKS_SPLIT_LINE, TKS_SPLIT_BLANK, TKS_SPLIT_FILE};
    static const char *names[] = {"line", "blank-line", "file"};
    for (int k = 0; k < 3; k++) {
        tks_input_opts o = opts_split(splits[k]);
        char label[64];
        snprintf(label, sizeof label, "seek plain %s", names[k]);
        check_seek(label, plain, 3, &o, splits[k] != TKS_SPLIT_FILE);
        snprintf(label, sizeof label, "seek archives %s", names[k]);
        check_seek(label, mixed, 4, &o, 0);
    }
}

/* ---- JSON Lines: the RapidJSON path against jansson ----------------------- */

int tks__jsonl_fast(const char *line, size_t len, const char *key, const char **text, size_t *n);

/* One record through tks_jsonl_decode (RapidJSON where it can decide) and
 * through jansson alone: the same status, string and reason. */
static void same_decode(const char *what, const char *rec, size_t len, uint64_t max_doc) {
    char w1[400], w2[400];
    json_t *r1 = NULL, *r2 = NULL;
    const char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    tks_jsonl_status s1 = tks_jsonl_decode(rec, len, "text", max_doc, &r1, &t1, &n1, w1, sizeof w1);
    tks_jsonl_status s2 = tks__jsonl_decode_jansson(rec, len, "text", max_doc, &r2, &t2, &n2, w2, sizeof w2);
    CHECK(s1 == s2, "%s: status %d, jansson %d (%.80s)", what, s1, s2, rec);
    if (s1 == s2 && s1 == TKS_JSONL_OK)
        CHECK(n1 == n2 && !memcmp(t1, t2, n1), "%s: strings differ (%.80s)", what, rec);
    if (s1 == s2 && s1 == TKS_JSONL_BAD) CHECK(!strcmp(w1, w2), "%s: \"%s\" vs \"%s\"", what, w1, w2);
    json_decref(r1);
    json_decref(r2);
}

/* Whether the RapidJSON path decides rec itself (1) or hands it to jansson. */
static int fast_decides(const char *rec) {
    const char *t;
    size_t n;
    return tks__jsonl_fast(rec, strlen(rec), "text", &t, &n);
}

static void test_jsonl_fast(void) {
    static const struct { const char *rec; int fast; } cases[] = {
        {"{\"text\": \"plain\"}", 1},
        {"{\"text\": \"\\u00e9 \\ud83d\\ude00 \\/ \\b\\f\\n\\r\\t \\\"q\\\" \\\\\"}", 1},
        {"{\"text\":\"x\",\"text\":\"last wins\"}", 1},
        {"{\"a\":9223372036854775807,\"b\":-9223372036854775808,\"c\":1e-400,\"text\":\"x\"}", 1},
        {"{\"a\":[1,2.5,{\"b\":null,\"c\":[true,false]}],\"text\":\"x\"}  \r", 1},
        {"{\"text\":\"\"}", 1},
        {"{\"te\\u0078t\":\"escaped key\"}", 1},
        /* jansson decides these: RapidJSON would accept them, jansson does not */
        {"{\"a\":18446744073709551615,\"text\":\"x\"}", 0},
        {"{\"a\":123456789012345678901234567890,\"text\":\"x\"}", 0},
        {"{\"a\":-9223372036854775809,\"text\":\"x\"}", 0},
        {"{\"a\":1e400,\"text\":\"x\"}", 0},
        {"{\"text\":\"a\\udc00\"}", 0},
        {"{\"\\udc00\":1,\"text\":\"x\"}", 0},
        {"{\"te\\u0000xt\":\"x\",\"text\":\"y\"}", 0},
        {"{\"a\":{\"b\\u0000\":1},\"text\":\"x\"}", 0},
        /* bad either way: jansson words the reason */
        {"{\"text\":\"a\\ud800b\"}", 0},
        {"{\"text\":\"a\\udc00\"}", 0},
        {"{\"text\":\"x\"} x", 0},
        {"{\"text\":\"a\tb\"}", 0},
        {"{\"text\":\"a\\u0000b\"}", 1}, /* the reader accepts; the NUL rule sends it to jansson */
        {"{\"text\":1}", 0},
        {"{\"other\":\"x\"}", 0},
        {"[\"text\"]", 0},
        {"\"text\"", 0},
        {"{\"text\":\"\xff\"}", 0},
        {"{\"text\":\"x\",}", 0},
        {"{'text':'x'}", 0},
        {"{\"text\":\"x\", \"n\": NaN}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "case %zu", i);
        same_decode(what, cases[i].rec, strlen(cases[i].rec), 1 << 20);
        CHECK(fast_decides(cases[i].rec) == cases[i].fast, "case %zu: the fast path %s it: %s", i,
              cases[i].fast ? "should decide" : "should hand jansson", cases[i].rec);
    }
    same_decode("too long", "{\"text\":\"0123456789\"}", 21, 5);
    /* nesting: 1,500 levels (the fast path stops at 1,000, jansson accepts) and
     * 2,100 (both refuse) */
    for (int depth = 1500; depth <= 2100; depth += 600) {
        char *deep = malloc(2 * (size_t)depth + 64);
        int k = sprintf(deep, "{\"text\":\"x\",\"a\":");
        for (int d = 0; d < depth; d++) deep[k++] = '[';
        for (int d = 0; d < depth; d++) deep[k++] = ']';
        deep[k++] = '}';
        same_decode(depth == 1500 ? "1,500 levels" : "2,100 levels", deep, (size_t)k, 1 << 20);
        free(deep);
    }
    /* mutations of real records: a GCIDE-like text with escapes, bytes
     * replaced, inserted or removed at random, JSON's own bytes favoured */
    const char base[] = "{\"id\": 12, \"text\": \"Ab\\u00e9c, d\\n\\\"e\\\" \\ud83d\\ude00 f\", \"x\": [1.5, -2, null]}";
    const char alphabet[] = "{}[]\":,\\u0123456789abcdefeE+-. \t\n\xc3\xa9\xff";
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int agree = 0, fast = 0;
    for (int it = 0; it < 20000; it++) {
        char rec[256];
        size_t n = sizeof base - 1;
        memcpy(rec, base, n);
        int edits = 1 + it % 3;
        for (int e = 0; e < edits; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(seed >> 33) % n;
            char c = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
            switch ((seed >> 8) % 3) {
            case 0: rec[at] = c; break;
            case 1: if (n < sizeof rec - 1) { memmove(rec + at + 1, rec + at, n - at); rec[at] = c; n++; } break;
            default: memmove(rec + at, rec + at + 1, n - at - 1); n--; break;
            }
        }
        int before = failures;
        const char *t;
        size_t tn;
        fast += tks__jsonl_fast(rec, n, "text", &t, &tn);
        same_decode("mutation", rec, n, 1 << 20);
        agree += failures == before;
        if (failures > before + 5) break;
    }
    /* both kinds must occur, or the comparison shows little */
    CHECK(fast > 1000 && fast < 19000, "mutations: the fast path decided %d of 20000", fast);
    printf("jsonl: RapidJSON's path and jansson agree on %zu edge cases and %d mutated records (%d decided "
           "by the fast path, the rest by jansson)\n", sizeof cases / sizeof cases[0] + 3, agree, fast);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
        return 2;
    }
    W = argv[1];
    if (sh("rm -rf '%s' && mkdir -p '%s'", W, W)) return 1;

    test_utf8_table();
    test_utf8_random();
    test_lines_random();
    test_split_modes();
    test_formats();
    test_directories();
    test_corrupt();
    test_jsonl();
    test_jsonl_fast();
    test_gzip_integrity();
    test_policies();
    test_gcide();
    test_seek();

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all input checks passed\n");
    return 0;
}
