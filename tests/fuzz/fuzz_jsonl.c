/*
 * fuzz_jsonl.c - the JSON Lines decoder's fast path (tokenize/jsonl_fast.cc,
 * RapidJSON's reader) against jansson, its reference, on untrusted records:
 * tks_jsonl_decode and tks__jsonl_decode_jansson must give the same status,
 * the same string for a record they accept and the same reason for one they
 * refuse. The first byte picks the key ("text" or "t") and --max-doc-bytes
 * (8 or 64 MiB); the rest is the record.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "tests/fuzz/fuzz_common.h"
#include "tokenize/tokenize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *key = data[0] & 1 ? "t" : "text";
    uint64_t max_doc = data[0] & 2 ? 8 : (64u << 20);
    const char *line = (const char *)data + 1;
    size_t len = size - 1;
    char w1[400], w2[400];
    json_t *r1 = NULL, *r2 = NULL;
    const char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    tks_jsonl_status s1 = tks_jsonl_decode(line, len, key, max_doc, &r1, &t1, &n1, w1, sizeof w1);
    tks_jsonl_status s2 = tks__jsonl_decode_jansson(line, len, key, max_doc, &r2, &t2, &n2, w2, sizeof w2);
    FUZZ_CHECK(s1 == s2);
    if (s1 == TKS_JSONL_OK) FUZZ_CHECK(n1 == n2 && memcmp(t1, t2, n1) == 0);
    if (s1 == TKS_JSONL_BAD) FUZZ_CHECK(strcmp(w1, w2) == 0);
    json_decref(r1);
    json_decref(r2);
    return 0;
}
