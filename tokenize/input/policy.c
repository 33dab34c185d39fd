/*
 * policy.c - what every document goes through, whatever it was read from
 * (docs.c: text and JSON Lines; pq_input.c: Parquet rows): UTF-8 validation
 * and repair (--invalid-utf8), NUL bytes (a binary entry is skipped), and the
 * length limit (--max-doc-bytes, --on-long-doc).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/input/input.h"
#include "common/tks_bits.h"

/* ------------------------------------------------------------------------- */
/* UTF-8: tks_utf8_seq (common/tks_bits.h) gives each sequence's length or
 * the maximal subpart one U+FFFD replaces.                                   */

#define HIGH_BITS 0x8080808080808080ull

/* Length of the pure-ASCII run at s (8 bytes per step). */
static size_t ascii_run(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (n - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & HIGH_BITS) break;
        i += 8;
    }
    while (i < n && s[i] < 0x80) i++;
    return i;
}

/* Offset of the first ill-formed byte in [s, s+n), or n when all is valid. */
static size_t utf8_first_invalid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        i += ascii_run(s + i, n - i);
        if (i == n) break;
        int k = tks_utf8_seq(s + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

size_t tks_utf8_sanitize(const char *str, size_t n, char *out, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, o = 0, bad = 0;
    while (i < n) {
        size_t run = ascii_run(s + i, n - i);
        if (out && run) memcpy(out + o, s + i, run);
        i += run;
        o += run;
        if (i == n) break;
        int k = tks_utf8_seq(s + i, n - i);
        if (k > 0) {
            if (out) memcpy(out + o, s + i, (size_t)k);
            i += (size_t)k;
            o += (size_t)k;
        } else {
            if (out) memcpy(out + o, "\xEF\xBF\xBD", 3);
            i += (size_t)-k;
            o += 3;
            bad++;
        }
    }
    if (out_len) *out_len = o;
    return bad;
}

int tks__too_long(tks_input *in, uint64_t line_no) {
    if (in->opts.long_doc == TKS_POLICY_FAIL) {
        int rc = tks_fail(TKS_ERR_DOC_TOO_LONG, in->source.p, TKS_NONE, TKS_NONE,
                          "%s:%llu: document longer than the limit of %llu bytes; raise "
                          "--max-doc-bytes or use --on-long-doc skip",
                          in->source.p, (unsigned long long)line_no,
                          (unsigned long long)in->max_doc);
        tks_error_set_doc(in->st.docs, line_no);
        return rc;
    }
    in->st.long_skipped++;
    return 0;
}

/* Applies the NUL and UTF-8 policies and fills *doc: 1 yielded, 0 skipped, or
 * an error. `off`: where the text starts in the decompressed entry (TKS_NONE
 * when it is not a slice of it, as for JSONL: the caller then sets the
 * document's offset and raw_len, here the text's). */
int tks__emit(tks_input *in, const char *p, size_t len, uint64_t line_no, uint64_t off,
                tks_doc *doc) {
    size_t raw_len = len;
    if (memchr(p, 0, len)) {
        in->st.binary_skipped++;
        return 0;
    }
    size_t bad = utf8_first_invalid(p, len);
    if (bad < len) {
        in->st.utf8_invalid_docs++;
        if (in->opts.invalid_utf8 == TKS_POLICY_FAIL) {
            int rc = tks_fail(TKS_ERR_UTF8, in->source.p, TKS_NONE,
                              off == TKS_NONE ? TKS_NONE : off + bad,
                              "%s:%llu: invalid UTF-8 at byte %zu of the document; fix the input "
                              "or use --invalid-utf8 replace (or skip)",
                              in->source.p, (unsigned long long)line_no, bad);
            tks_error_set_doc(in->st.docs, line_no);
            return rc;
        }
        if (in->opts.invalid_utf8 == TKS_POLICY_SKIP) {
            in->st.utf8_skipped++;
            return 0;
        }
        size_t out_len = 0;
        tks_utf8_sanitize(p + bad, len - bad, NULL, &out_len);
        if (out_len > SIZE_MAX - bad)
            return tks_fail(TKS_ERR_NOMEM, in->source.p, TKS_NONE, TKS_NONE, "document too large");
        int rc = tks__buf_reserve(&in->san, bad + out_len);
        if (rc) return rc;
        memcpy(in->san.p, p, bad);
        in->st.utf8_replaced += tks_utf8_sanitize(p + bad, len - bad, in->san.p + bad, &out_len);
        p = in->san.p;
        len = bad + out_len;
    }
    return tks__doc_fill(in, p, len, line_no, 0, off, raw_len, doc);
}

int tks__doc_fill(tks_input *in, const char *p, size_t len, uint64_t line_no, int json, uint64_t off,
                  uint64_t raw_len, tks_doc *doc) {
    doc->text = p;
    doc->len = len;
    doc->ordinal = in->st.docs++;
    doc->line = line_no;
    doc->source = in->source.p;
    doc->json = json;
    doc->file = in->next_file - 1;
    doc->entry = in->is_archive ? (uint32_t)in->entry_no : 0;
    doc->offset = off;
    doc->raw_len = raw_len;
    return 1;
}

