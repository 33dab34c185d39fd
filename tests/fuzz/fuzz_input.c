/*
 * fuzz_input.c - the input reader (tokenize/input.c, stream.c, docs.c: libarchive formats and
 * filters, line/paragraph/file splitting, JSONL records, UTF-8 policies) and
 * tks_utf8_sanitize on untrusted bytes.
 *
 * The first byte picks the options, the rest is the payload:
 *   bits 0-3: the temporary file's suffix (k_suffixes: decides plain text,
 *             JSONL, compressed stream or archive, as for real inputs); for
 *             ".tar" the header checksums are recomputed first (fix_tar), so
 *             mutated header fields (sizes, types, sparse maps) reach
 *             libarchive's entry handling instead of its checksum test;
 *   bits 4-5: --invalid-utf8 replace, skip, fail, replace;
 *   bit 6:    --max-doc-bytes 64 (else the 64 MiB default);
 *   bit 7:    --on-long-doc fail and --on-bad-record skip (else the defaults,
 *             skip and fail).
 * The file is read four times: --doc-split file, line and blank with the
 * format chosen by the name, then with --format jsonl, draining
 * tks_input_next and checking every document it yields. The payload is also
 * run through tks_utf8_sanitize and compared with an independent
 * implementation of RFC 3629 and Unicode's "U+FFFD substitution of maximal
 * subparts" (ch. 3), written here from the code point arithmetic rather than
 * from the byte tables that input.c uses.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenize/tokenize.h"

static const char *const k_suffixes[16] = {
    ".txt", ".jsonl", ".gz", ".tar", ".zip", ".tar.gz", ".jsonl.gz", ".bz2",
    ".xz",  ".zst",   ".Z",  ".tgz", ".lz4", ".json",   ".tar.xz",   "",
};

/* ------------------------------------------------------------------------- */
/* Independent UTF-8 oracle                                                   */

/* Lead byte -> sequence length and its payload bits; 0 when it cannot start
 * a multi-byte sequence of the 2..4 byte forms. */
static size_t lead_len(uint8_t b, uint32_t *bits) {
    if ((b & 0xE0) == 0xC0) { *bits = b & 0x1F; return 2; }
    if ((b & 0xF0) == 0xE0) { *bits = b & 0x0F; return 3; }
    if ((b & 0xF8) == 0xF0) { *bits = b & 0x07; return 4; }
    return 0;
}

static const uint32_t k_min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}; /* no overlongs */

/* Is [lo, hi] (code points) free of anything valid for that length? */
static int range_has_scalar(uint32_t lo, uint32_t hi, size_t len) {
    if (lo < k_min_cp[len]) lo = k_min_cp[len];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return 0;
    return !(lo >= 0xD800 && hi <= 0xDFFF); /* only surrogates */
}

/*
 * Do the k >= 1 bytes at s start some well-formed sequence? The code points
 * reachable by completing them span [bits:000..., bits:111...]; the prefix is
 * viable iff that span meets the scalar values encodable at that length.
 */
static int viable_prefix(const uint8_t *s, size_t k) {
    uint32_t cp;
    size_t len = lead_len(s[0], &cp);
    if (!len || k > len) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    unsigned rest = 6 * (unsigned)(len - k);
    uint32_t lo = cp << rest, hi = (cp << rest) | ((1u << rest) - 1);
    return range_has_scalar(lo, hi, len);
}

/* Length of the well-formed sequence at s (1..4), or 0. */
static size_t wf_len(const uint8_t *s, size_t n) {
    if (s[0] < 0x80) return 1;
    uint32_t cp;
    size_t len = lead_len(s[0], &cp);
    if (!len || n < len) return 0;
    return viable_prefix(s, len) ? len : 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = wf_len(s + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

/* Expected tks_utf8_sanitize output into out (3n bytes); returns the count. */
static size_t oracle_sanitize(const uint8_t *s, size_t n, uint8_t *out, size_t *out_len) {
    size_t i = 0, o = 0, bad = 0;
    while (i < n) {
        size_t l = wf_len(s + i, n - i);
        if (l) {
            memcpy(out + o, s + i, l);
            i += l;
            o += l;
            continue;
        }
        size_t k = 1; /* maximal subpart: longest viable prefix, at least one byte */
        while (i + k < n && viable_prefix(s + i, k + 1)) k++;
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k;
        bad++;
    }
    *out_len = o;
    return bad;
}

static void fuzz_sanitize(const uint8_t *data, size_t size) {
    const char *in = (const char *)data;
    size_t cap = 3 * size + 1;
    char *out = malloc(cap);
    uint8_t *want = malloc(cap);
    char *again = malloc(3 * cap + 1);
    FUZZ_SETUP(out && want && again);
    size_t len0 = SIZE_MAX, len = SIZE_MAX, wlen = 0;
    size_t n0 = tks_utf8_sanitize(in, size, NULL, &len0);
    size_t n = tks_utf8_sanitize(in, size, out, &len);
    FUZZ_CHECK(n0 == n && len0 == len);
    FUZZ_CHECK(len <= 3 * size && n <= size);
    FUZZ_CHECK(valid_utf8((const uint8_t *)out, len));
    FUZZ_CHECK((n == 0) == (len == size && memcmp(out, in, size) == 0));
    FUZZ_CHECK((n == 0) == valid_utf8(data, size));
    size_t wn = oracle_sanitize(data, size, want, &wlen);
    FUZZ_CHECK(wn == n && wlen == len && memcmp(want, out, len) == 0);
    size_t len2 = 0;
    FUZZ_CHECK(tks_utf8_sanitize(out, len, again, &len2) == 0); /* idempotent */
    FUZZ_CHECK(len2 == len && memcmp(again, out, len) == 0);
    FUZZ_CHECK(tks_utf8_sanitize(in, size, NULL, NULL) == n);
    free(out);
    free(want);
    free(again);
}

/* ------------------------------------------------------------------------- */
/* Input reader                                                               */

/* Recomputes the checksum of every 512-byte block that carries the ustar
 * magic (POSIX ustar, GNU tar "ustar  "): the unsigned sum of the block with
 * the checksum field read as spaces, as 6 octal digits, NUL, space. */
static void fix_tar(uint8_t *b, size_t n) {
    for (size_t off = 0; off + 512 <= n; off += 512) {
        uint8_t *h = b + off;
        if (memcmp(h + 257, "ustar", 5) != 0) continue;
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (size_t i = 0; i < 512; i++) sum += h[i];
        char tmp[9];
        snprintf(tmp, sizeof tmp, "%06o", sum & 0777777u);
        memcpy(h + 148, tmp, 6);
        h[154] = 0;
        h[155] = ' ';
    }
}

static void drain(const char *path, const tks_input_opts *o) {
    const char *paths[1] = {path};
    tks_input *in = NULL;
    int rc = tks_input_open(paths, 1, o, &in);
    /* a readable regular file opens, unless its name promises a compression
     * (x.gz, x.tar.zst) that its first bytes do not have: refused, named */
    if (rc == TKS_ERR_INPUT) {
        FUZZ_CHECK(in == NULL && strstr(tks_last_error()->message, path) &&
                   strstr(tks_last_error()->message, "is named"));
        return;
    }
    FUZZ_CHECK(rc == 0 && in != NULL);
    FUZZ_CHECK(tks_input_n_files(in) == 1 && strcmp(tks_input_file(in, 0), path) == 0);
    uint64_t max_doc = o->max_doc_bytes ? o->max_doc_bytes : (64ull << 20);
    uint64_t count = 0;
    tks_doc doc;
    for (;;) {
        memset(&doc, 0, sizeof doc);
        rc = tks_input_next(in, &doc);
        if (rc != 1) break;
        FUZZ_CHECK(doc.text != NULL && doc.len >= 1);
        FUZZ_CHECK(doc.ordinal == count);
        FUZZ_CHECK(doc.line >= 1);
        FUZZ_CHECK(doc.source != NULL && strncmp(doc.source, path, strlen(path)) == 0);
        /* the limit applies before U+FFFD replacement, which at most triples */
        FUZZ_CHECK(doc.len <= 3 * max_doc);
        FUZZ_CHECK(memchr(doc.text, 0, doc.len) == NULL);
        FUZZ_CHECK(valid_utf8((const uint8_t *)doc.text, doc.len));
        count++;
    }
    const tks_input_stats *st = tks_input_get_stats(in);
    FUZZ_CHECK(st->docs == count);
    FUZZ_CHECK(st->files == 1);
    FUZZ_CHECK(st->utf8_skipped <= st->utf8_invalid_docs);
    if (o->invalid_utf8 != TKS_POLICY_REPLACE) FUZZ_CHECK(st->utf8_replaced == 0);
    if (o->invalid_utf8 != TKS_POLICY_SKIP) FUZZ_CHECK(st->utf8_skipped == 0);
    if (o->long_doc != TKS_POLICY_SKIP) FUZZ_CHECK(st->long_skipped == 0);
    if (o->bad_record != TKS_POLICY_SKIP) FUZZ_CHECK(st->bad_records_skipped == 0);
    if (rc < 0) {
        FUZZ_CHECK(tks_last_error()->code == rc);
        switch (rc) {
        case TKS_ERR_INPUT: case TKS_ERR_IO: case TKS_ERR_NOMEM: break;
        case TKS_ERR_UTF8: FUZZ_CHECK(o->invalid_utf8 == TKS_POLICY_FAIL); break;
        case TKS_ERR_DOC_TOO_LONG: FUZZ_CHECK(o->long_doc == TKS_POLICY_FAIL); break;
        case TKS_ERR_JSONL: FUZZ_CHECK(o->bad_record == TKS_POLICY_FAIL); break;
        default:
            fprintf(stderr, "tks_input_next returned %d (%s): %s\n", rc, tks_strerror(rc),
                    tks_last_error()->message);
            FUZZ_CHECK(!"unexpected error code");
        }
        FUZZ_CHECK(tks_input_next(in, &doc) == rc); /* errors are sticky */
    } else {
        FUZZ_CHECK(rc == 0);
        FUZZ_CHECK(tks_input_next(in, &doc) == 0); /* the end stays the end */
    }
    tks_input_free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    fuzz_sanitize(data, size);

    const char *suffix = k_suffixes[sel & 15];
    char path[64];
    snprintf(path, sizeof path, "/tmp/tks_fuzz_input_XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    FUZZ_SETUP(fd >= 0);
    if (strcmp(suffix, ".tar") == 0) {
        uint8_t *t = calloc(size ? size : 1, 1);
        FUZZ_SETUP(t != NULL);
        if (size) memcpy(t, data, size);
        fix_tar(t, size);
        fuzz_write_fd(fd, t, size);
        free(t);
    } else {
        fuzz_write_fd(fd, data, size);
    }
    close(fd);

    tks_input_opts o;
    tks_input_opts_default(&o);
    static const tks_policy utf8[4] = {TKS_POLICY_REPLACE, TKS_POLICY_SKIP, TKS_POLICY_FAIL,
                                       TKS_POLICY_REPLACE};
    o.invalid_utf8 = utf8[(sel >> 4) & 3];
    if (sel & 64) o.max_doc_bytes = 64;
    if (sel & 128) {
        o.long_doc = TKS_POLICY_FAIL;
        o.bad_record = TKS_POLICY_SKIP;
    }
    static const tks_doc_split splits[3] = {TKS_SPLIT_FILE, TKS_SPLIT_LINE, TKS_SPLIT_BLANK};
    for (size_t i = 0; i < 3; i++) {
        o.split = splits[i];
        o.format = TKS_FMT_AUTO;
        drain(path, &o);
    }
    o.split = TKS_SPLIT_FILE;
    o.format = TKS_FMT_JSONL;
    drain(path, &o);
    unlink(path);
    return 0;
}
