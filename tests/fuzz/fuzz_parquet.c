/*
 * fuzz_parquet.c - the Parquet input (tokenize/parquet.cc over Arrow's
 * reader, tokenize/pq_input.c, the footer check of the listing) on untrusted
 * bytes. The first byte picks the options, the rest is the file:
 *   bits 0-1: --invalid-utf8 replace, skip, fail, replace;
 *   bit 2:    --max-doc-bytes 16 (else the default), with bit 3: --on-long-doc fail;
 *   bit 4:    --parquet-column body (else text);
 *   bit 5:    --on-bad-input skip.
 * The file, written as NAME.parquet, is read twice: through the input reader
 * (tks_input_open, then tks_input_next to the end: every document must be
 * non-empty valid UTF-8 without NUL), and through tokenize/parquet.h directly
 * (every row group, every row; the rows read must be the footer's). Errors
 * must come back as TKS_ERR_* codes with a message, never as a crash.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenize/input/parquet.h"
#include "tokenize/tokenize.h"

static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n || c == 0) return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

static void drain(const char *path, const tks_input_opts *o) {
    tks_input *in = NULL;
    int rc = tks_input_open(&path, 1, o, &in);
    if (rc) {
        FUZZ_CHECK(rc < 0 && tks_last_error()->message[0]);
        tks_input_free(in);
        return;
    }
    tks_doc d;
    while ((rc = tks_input_next(in, &d)) == 1) {
        FUZZ_CHECK(d.len >= 1 && valid_utf8((const unsigned char *)d.text, d.len));
        FUZZ_CHECK(o->max_doc_bytes == 0 || d.len <= o->max_doc_bytes);
    }
    FUZZ_CHECK(rc == 0 || tks_last_error()->message[0]);
    tks_input_free(in);
}

static void direct(const char *path, const char *column) {
    tks_pq *p = NULL;
    int rc = tks_pq_open(path, column, &p);
    if (rc) {
        FUZZ_CHECK(rc < 0 && p == NULL && tks_last_error()->message[0]);
        return;
    }
    const tks_pq_group *g = tks_pq_groups(p);
    for (size_t k = 0; k < tks_pq_n_groups(p); k++) {
        FUZZ_CHECK(g[k].start <= g[k].end);
        if (tks_pq_start(p, k) != 0) break;
        uint64_t rows = 0;
        const char *s;
        size_t n;
        int null;
        while ((rc = tks_pq_next(p, &s, &n, &null)) == 1) {
            rows++;
            FUZZ_CHECK(!null || n == 0);
            if (n) FUZZ_CHECK(s[0] == s[0] && s[n - 1] == s[n - 1]); /* readable (ASan) */
        }
        if (rc < 0) break;
        FUZZ_CHECK(rows == g[k].rows);
    }
    tks_pq_close(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || !tks_pq_available()) return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    char path[64];
    snprintf(path, sizeof path, "/tmp/tks_fuzz_parquet_XXXXXX.parquet");
    int fd = mkstemps(path, 8);
    FUZZ_SETUP(fd >= 0);
    fuzz_write_fd(fd, data, size);
    close(fd);
    tks_input_opts o;
    tks_input_opts_default(&o);
    static const tks_policy utf8[4] = {TKS_POLICY_REPLACE, TKS_POLICY_SKIP, TKS_POLICY_FAIL, TKS_POLICY_REPLACE};
    o.invalid_utf8 = utf8[sel & 3];
    if (sel & 4) o.max_doc_bytes = 16;
    if ((sel & 4) && (sel & 8)) o.long_doc = TKS_POLICY_FAIL;
    o.parquet_column = (sel & 16) ? "body" : "text";
    if (sel & 32) o.bad_input = TKS_POLICY_SKIP;
    drain(path, &o);
    direct(path, o.parquet_column);
    unlink(path);
    tks_clear_error();
    return 0;
}
