/*
 * fuzz_audit.c - the audit (dataset/audit.c) and the dataset opener
 * (dataset/manifest.c) on untrusted bytes. The first byte picks the mode and
 * options, the rest is the payload:
 *
 *   mode 0, 3 (byte & 3): the payload is a lone shard file: tks_audit in
 *        single-shard mode, checked against tks_shard_open_mem on the same
 *        bytes (the audit finds no problem iff the reader accepts the shard,
 *        every chunk verifies and the ids present span the header's range);
 *   mode 1: the payload is manifest.json of a dataset directory holding a
 *        valid shard and tokenizer: tks_audit and tks_dataset_open;
 *   mode 2: the payload is shard-00000.tks of a dataset directory with a valid
 *        manifest and tokenizer: tks_audit and tks_dataset_open.
 *   bit 2: --model-vocab 200 (below the shard's 300); bit 3: --tokenizer with
 *   the right file; bit 4: --tokenizer with a wrong one; bit 5: max_problems 1;
 *   bit 6: in modes 0, 2 and 3 the shard's checksums are recomputed first
 *   (fuzz_fix.h), so mutations reach the checks behind them.
 *
 * The two directories are made once per process (writer API, manifest
 * writer) and removed at exit; per input only one file is rewritten.
 * TKS_FUZZ_VERBOSE=1 in the environment prints what the opener and the audit
 * said about each dataset input (to read a reproducer).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_fix.h"

#define FUZZ_VOCAB 300u
#define FUZZ_MODEL_VOCAB 200u
#define FUZZ_TOKENIZER_NAME "tokenizer.model"

static char g_root[PATH_MAX];       /* mkdtemp */
static char g_mdir[PATH_MAX];       /* mode 1: manifest fuzzed */
static char g_sdir[PATH_MAX];       /* mode 2: shard fuzzed */
static char g_good_tok[PATH_MAX];   /* a tokenizer copy outside the datasets */
static char g_wrong_tok[PATH_MAX];  /* a file that is not the tokenizer */

static const char k_tokenizer_bytes[] = "tokshard fuzz: stands in for a sentencepiece model\n";

static void join(char *out, const char *dir, const char *name) {
    FUZZ_SETUP(tks_path_join(out, PATH_MAX, dir, name) == 0);
}

static void remove_tree(void) {
    const char *dirs[] = {g_mdir, g_sdir};
    const char *names[] = {TKS_MANIFEST_NAME, "shard-00000.tks", FUZZ_TOKENIZER_NAME};
    char p[PATH_MAX];
    for (size_t d = 0; d < 2; d++) {
        for (size_t i = 0; i < 3; i++) {
            join(p, dirs[d], names[i]);
            unlink(p);
        }
        rmdir(dirs[d]);
    }
    unlink(g_good_tok);
    unlink(g_wrong_tok);
    rmdir(g_root);
}

/* A valid one-shard dataset in `dir`: 3 documents, 80 tokens, 64-byte chunks
 * (3 chunks), ids in [1, 299], written by the library's own writer. */
static void make_dataset(const char *dir) {
    char tok_path[PATH_MAX];
    join(tok_path, dir, FUZZ_TOKENIZER_NAME);
    fuzz_write_file(tok_path, k_tokenizer_bytes, sizeof k_tokenizer_bytes - 1);
    tks_tokenizer_info ti;
    memset(&ti, 0, sizeof ti);
    snprintf(ti.file, sizeof ti.file, "%s", FUZZ_TOKENIZER_NAME);
    snprintf(ti.model_type, sizeof ti.model_type, "bpe");
    FUZZ_SETUP(tks_file_xxh3_128(tok_path, ti.fingerprint, NULL) == 0);
    ti.vocab_size = FUZZ_VOCAB;
    ti.bos_id = 1;
    ti.eos_id = 2;
    ti.pad_id = TKS_NO_ID;
    ti.unk_id = 0;

    tks_writer_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.dir = dir;
    wo.vocab_size = FUZZ_VOCAB;
    wo.bos_id = ti.bos_id;
    wo.eos_id = ti.eos_id;
    wo.pad_id = ti.pad_id;
    memcpy(wo.tokenizer_fp, ti.fingerprint, 16);
    wo.shard_tokens = 1u << 20;
    wo.chunk_bytes = TKS_MIN_CHUNK_BYTES;
    tks_writer *w = NULL;
    FUZZ_SETUP(tks_writer_create(&wo, &w) == 0);
    const size_t lens[3] = {5, 30, 45};
    uint32_t ids[45];
    uint32_t x = 12345;
    for (size_t d = 0; d < 3; d++) {
        for (size_t i = 0; i < lens[d]; i++) {
            x = x * 1103515245u + 12345u;
            ids[i] = 1 + (x >> 8) % (FUZZ_VOCAB - 1);
        }
        if (d == 2) ids[0] = FUZZ_VOCAB - 1;
        FUZZ_SETUP(tks_writer_add(w, ids, lens[d], d, NULL) == 0);
    }
    FUZZ_SETUP(tks_writer_flush(w) == 0);
    size_t n = 0;
    const tks_shard_info *si = tks_writer_shards(w, &n);
    FUZZ_SETUP(n == 1);
    FUZZ_SETUP(tks_manifest_write(dir, &ti, si, n, 2, TKS_MIN_CHUNK_BYTES,
                                  "{\"tool\": \"fuzz_audit\"}") == 0);
    tks_writer_free(w);
}

static void setup_once(void) {
    if (g_root[0]) return;
    snprintf(g_root, sizeof g_root, "/tmp/tks_fuzz_audit_XXXXXX");
    FUZZ_SETUP(mkdtemp(g_root) != NULL);
    join(g_mdir, g_root, "m");
    join(g_sdir, g_root, "s");
    join(g_good_tok, g_root, FUZZ_TOKENIZER_NAME);
    join(g_wrong_tok, g_root, "wrong.model");
    FUZZ_SETUP(mkdir(g_mdir, 0755) == 0);
    FUZZ_SETUP(mkdir(g_sdir, 0755) == 0);
    make_dataset(g_mdir);
    make_dataset(g_sdir);
    fuzz_write_file(g_good_tok, k_tokenizer_bytes, sizeof k_tokenizer_bytes - 1);
    fuzz_write_file(g_wrong_tok, "not the tokenizer\n", 18);
    atexit(remove_tree);
}

/* What every report must satisfy, whatever it found. */
static void check_report(const tks_audit_report *r, const tks_audit_opts *o) {
    size_t cap = o->max_problems ? o->max_problems : 1000;
    FUZZ_CHECK(r->n_problems <= r->n_problems_total);
    FUZZ_CHECK(r->n_problems <= cap);
    FUZZ_CHECK(r->n_problems == r->n_problems_total || r->n_problems == cap);
    for (size_t i = 0; i < r->n_problems; i++) {
        const tks_audit_problem *p = &r->problems[i];
        FUZZ_CHECK(p->code < 0);
        FUZZ_CHECK(memchr(p->file, 0, sizeof p->file) != NULL);
        FUZZ_CHECK(memchr(p->message, 0, sizeof p->message) != NULL);
    }
    FUZZ_CHECK(r->n_tokens >= r->n_docs);
    if (r->n_chunks) FUZZ_CHECK(r->min_token_id <= r->max_token_id);
}

static void audit_opts(uint8_t sel, tks_audit_opts *o) {
    memset(o, 0, sizeof *o);
    o->threads = 1; /* the machine is shared; the report does not depend on it */
    if (sel & 4) o->model_vocab = FUZZ_MODEL_VOCAB;
    if (sel & 8) o->tokenizer_path = g_good_tok;
    else if (sel & 16) o->tokenizer_path = g_wrong_tok;
    if (sel & 32) o->max_problems = 1;
}

/* The reader's verdict on a lone shard, in the audit's terms: 1 when the
 * audit must find nothing (opens, chunks verify, ids below vocab_size, ids
 * present span exactly [min_token_id, max_token_id]). */
static int reader_says_clean(const uint8_t *data, size_t size) {
    uint8_t *buf = calloc(size ? size : 1, 1);
    FUZZ_SETUP(buf != NULL);
    if (size) memcpy(buf, data, size);
    tks_shard *s = NULL;
    int clean = tks_shard_open_mem(buf, size, "fuzz.tks", &s) == 0;
    if (clean) {
        const tks_shard_header *h = tks_shard_hdr(s);
        for (uint64_t c = 0; c < h->n_chunks && clean; c++)
            clean = tks_shard_verify_chunk(s, c) == 0;
        uint32_t lo = UINT32_MAX, hi = 0;
        const void *t = tks_shard_tokens(s);
        for (uint64_t i = 0; i < h->n_tokens; i++) {
            uint32_t id = tks_shard_token_at(t, h->token_bytes, i);
            lo = id < lo ? id : lo;
            hi = id > hi ? id : hi;
        }
        if (hi >= h->vocab_size || lo != h->min_token_id || hi != h->max_token_id) clean = 0;
    }
    tks_shard_close(s);
    free(buf);
    return clean;
}

static void fuzz_lone_shard(uint8_t sel, const uint8_t *data, size_t size) {
    char path[] = "/tmp/tks_fuzz_shard_XXXXXX";
    int fd = mkstemp(path);
    FUZZ_SETUP(fd >= 0);
    fuzz_write_fd(fd, data, size);
    close(fd);
    tks_audit_opts o;
    audit_opts(sel, &o);
    tks_audit_report *r = NULL;
    int rc = tks_audit(path, &o, &r);
    unlink(path);
    FUZZ_CHECK(rc == 0 && r != NULL); /* the file exists: the audit runs */
    check_report(r, &o);
    FUZZ_CHECK(r->n_shards == 1 && !r->manifest_checked);
    if (!o.model_vocab && !o.tokenizer_path) {
        int clean = reader_says_clean(data, size);
        if (clean != (r->n_problems_total == 0)) {
            fprintf(stderr, "audit found %zu problem(s), the reader says the shard is %s\n",
                    r->n_problems_total, clean ? "clean" : "bad");
            for (size_t i = 0; i < r->n_problems; i++)
                fprintf(stderr, "  %s: %s\n", tks_strerror(r->problems[i].code),
                        r->problems[i].message);
            FUZZ_CHECK(clean == (r->n_problems_total == 0));
        }
    }
    tks_audit_report_free(r);
}

static void fuzz_dataset(uint8_t sel, const char *dir) {
    tks_audit_opts o;
    audit_opts(sel, &o);
    tks_audit_report *r = NULL;
    int rc = tks_audit(dir, &o, &r);
    FUZZ_CHECK(rc == 0 && r != NULL);
    check_report(r, &o);
    FUZZ_CHECK(r->n_shards <= 1 || r->manifest_checked);

    tks_dataset *ds = NULL;
    int orc = tks_dataset_open(dir, &ds);
    FUZZ_CHECK((orc == 0) == (ds != NULL));
    if (orc == 0) {
        size_t n = tks_dataset_n_shards(ds);
        FUZZ_CHECK(n <= 1);
        uint64_t toks = 0, docs = 0;
        for (size_t i = 0; i < n; i++) {
            const tks_shard_header *h = tks_shard_hdr(tks_dataset_shard(ds, i));
            toks += h->n_tokens;
            docs += h->n_docs;
            FUZZ_CHECK(h->max_token_id <= tks_dataset_max_token_id(ds));
            FUZZ_CHECK(h->vocab_size == tks_dataset_tokenizer(ds)->vocab_size);
        }
        FUZZ_CHECK(toks == tks_dataset_n_tokens(ds) && docs == tks_dataset_n_docs(ds));
        FUZZ_CHECK(strlen(tks_dataset_tokenizer_path(ds)) > strlen(dir));
        tks_dataset_close(ds);
    } else {
        FUZZ_CHECK(orc < 0 && tks_last_error()->code == orc);
    }
    if (getenv("TKS_FUZZ_VERBOSE")) { /* to read what a reproducer does */
        fprintf(stderr, "fuzz_audit: %s: dataset_open %d (%s), audit %zu problem(s)\n", dir, orc,
                orc ? tks_last_error()->message : "ok", r->n_problems_total);
        for (size_t i = 0; i < r->n_problems; i++)
            fprintf(stderr, "  %s: %s\n", tks_strerror(r->problems[i].code),
                    r->problems[i].message);
    }
    /* The audit checks everything the opener checks (and the chunks): a clean
     * audit means the dataset opens. */
    if (r->n_problems_total == 0) FUZZ_CHECK(orc == 0);
    tks_audit_report_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    setup_once();
    uint8_t sel = data[0];
    data++;
    size--;
    uint8_t *fixed = NULL;
    if ((sel & 64) && (sel & 3) != 1) {
        fixed = calloc(size ? size : 1, 1);
        FUZZ_SETUP(fixed != NULL);
        if (size) memcpy(fixed, data, size);
        fuzz_fix_checksums(fixed, size);
        data = fixed;
    }
    char path[PATH_MAX];
    switch (sel & 3) {
    case 1:
        join(path, g_mdir, TKS_MANIFEST_NAME);
        fuzz_write_file(path, data, size);
        fuzz_dataset(sel, g_mdir);
        break;
    case 2:
        join(path, g_sdir, "shard-00000.tks");
        fuzz_write_file(path, data, size);
        fuzz_dataset(sel, g_sdir);
        break;
    default:
        fuzz_lone_shard(sel, data, size);
        break;
    }
    free(fixed);
    return 0;
}
