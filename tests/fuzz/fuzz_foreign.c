/*
 * fuzz_foreign.c - the interop parsers on arbitrary bytes: the foreign
 * dataset reader behind `tokshard audit --format` and `import` (Megatron
 * .idx/.bin, llm.c, raw, datatrove .ds/.ds.index/.ds.metadata) and the
 * sentencepiece model proto walker behind tokenizer.json
 * (tks_hf_tokenizer_write). Neither may read outside the files, and the
 * audit must account for every problem it reports.
 *
 * Input: byte 0 picks the target (0 megatron, 1 llmc, 2 raw, 3 datatrove,
 * 4 tokenizer model; modulo 5), byte 1 the options (token size, a delimiter
 * or EOD id from byte 2), bytes 3..6 a little-endian split point; the rest is
 * the first file up to the split and the second file after it (the .bin, the
 * .ds.index), with datatrove's metadata made from byte 1.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_common.h"
#include "interop/interop.h"
#include "tokenizer/tokenizer.h"

static char g_dir[64];

static void path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/tks-fuzz-foreign-XXXXXX");
        FUZZ_SETUP(mkdtemp(g_dir) != NULL);
    }
    if (size < 7) return 0;
    int target = data[0] % 5;
    uint8_t opt = data[1];
    uint32_t split = (uint32_t)data[3] | (uint32_t)data[4] << 8 | (uint32_t)data[5] << 16 | (uint32_t)data[6] << 24;
    const uint8_t *body = data + 7;
    size_t n = size - 7, cut = split % (n + 1);
    char a[128], b[128], c[128];
    if (target == 4) {
        path(a, sizeof a, "tok.model");
        fuzz_write_file(a, body, n);
        path(b, sizeof b, "hf");
        mkdir(b, 0755);
        int rc = tks_hf_tokenizer_write(a, b);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_TOKENIZER || rc == TKS_ERR_NOMEM);
        if (rc) FUZZ_CHECK(tks_last_error()->code == rc);
        return 0;
    }
    tks_foreign_opts o;
    tks_foreign_opts_default(&o);
    o.format = target == 0 ? TKS_FOREIGN_MEGATRON : target == 1 ? TKS_FOREIGN_LLMC
             : target == 2 ? TKS_FOREIGN_RAW : TKS_FOREIGN_DATATROVE;
    o.token_bytes = opt & 1 ? 4 : 2;
    if (opt & 2) o.eot_id = data[2];
    if (opt & 4) o.eod_id = data[2];
    const char *src;
    if (target == 0) {
        path(a, sizeof a, "m.idx");
        path(b, sizeof b, "m.bin");
        fuzz_write_file(a, body, cut);
        fuzz_write_file(b, body + cut, n - cut);
        path(c, sizeof c, "m");
        src = c;
    } else if (target == 3) {
        path(a, sizeof a, "d.ds");
        path(b, sizeof b, "d.ds.index");
        path(c, sizeof c, "d.ds.metadata");
        fuzz_write_file(a, body, cut);
        fuzz_write_file(b, body + cut, n - cut);
        if (opt & 8) {
            const char *meta = opt & 1 ? "fuzz|4\n1\n" : "fuzz|2\n1\n";
            fuzz_write_file(c, meta, strlen(meta));
            o.token_bytes = 0;
        } else {
            unlink(c);
        }
        src = a;
    } else {
        path(a, sizeof a, "f.bin");
        fuzz_write_file(a, body, n);
        src = a;
    }
    uint32_t vocab = 1 + (uint32_t)(opt >> 4) * 4099;
    tks_audit_report *r = NULL;
    int rc = tks_foreign_audit(src, &o, vocab, NULL, 8, &r);
    if (rc) {
        FUZZ_CHECK(r == NULL && rc < 0 && tks_last_error()->code == rc);
        return 0;
    }
    FUZZ_CHECK(r != NULL && r->n_problems <= r->n_problems_total && r->n_problems <= 8);
    FUZZ_CHECK(r->n_problems_total > 0 || r->n_tokens == 0 || r->max_token_id < vocab);
    for (size_t i = 0; i < r->n_problems; i++) FUZZ_CHECK(r->problems[i].code < 0 && r->problems[i].message[0]);
    tks_audit_report_free(r);
    return 0;
}
