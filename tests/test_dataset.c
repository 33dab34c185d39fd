/* test_dataset.c - the shard format: round trips, id range refusal, and every
 * corruption class (each single bit flip, each truncation, magic, version,
 * index monotonicity, manifest and tokenizer mismatches).
 * Usage: test_dataset WORKDIR   (exit 0 = all checks passed) */
#define _GNU_SOURCE
#include "tests/check.h"
#include <jansson.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dataset/dataset.h"
#include "tests/manifest_seal.h"


static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static char work[1024];

static void mkdirs(const char *d) {
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
    if (system(cmd) != 0) { perror(cmd); exit(2); }
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = aligned_alloc(64, ((size_t)sz + 64 + 63) & ~(size_t)63);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) { fclose(f); free(b); return NULL; }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

typedef struct docs { uint32_t **d; size_t *len; size_t n; } docs;

static docs random_docs(size_t n, uint32_t vocab, size_t maxlen) {
    docs D = {calloc(n, sizeof(uint32_t *)), calloc(n, sizeof(size_t)), n};
    for (size_t i = 0; i < n; i++) {
        D.len[i] = 1 + next_rand() % maxlen;
        D.d[i] = malloc(D.len[i] * 4);
        for (size_t j = 0; j < D.len[i]; j++) D.d[i][j] = (uint32_t)(next_rand() % vocab);
    }
    /* make sure the extremes appear */
    D.d[0][0] = vocab - 1;
    D.d[n - 1][0] = 0;
    return D;
}

static void free_docs(docs *D) {
    for (size_t i = 0; i < D->n; i++) free(D->d[i]);
    free(D->d);
    free(D->len);
}

/* manifest.json is exactly what jansson renders (JSON_INDENT(2),
 * JSON_ENSURE_ASCII) of its own content, seal aside: the shards written
 * directly (manifest.c) take the same bytes jansson would. */
static void check_manifest_rendering(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    FILE *f = fopen(path, "rb");
    char *t = NULL;
    long n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && (t = calloc(1, (size_t)n + 1))) {
        rewind(f);
        if (fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    }
    if (f) fclose(f);
    const char *seal = t ? strstr(t, ",\n  \"self_xxh3\"") : NULL;
    json_object_del(j, "self_xxh3");
    char *d = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
    size_t k = seal ? (size_t)(seal - t) : 0;
    CHECK(d && seal && strlen(d) == k + 2 && memcmp(d, t, k) == 0 && strcmp(d + k, "\n}") == 0,
          "%s is not jansson's rendering of itself", path);
    free(d);
    free(t);
    json_decref(j);
}

/* 1: datasets are written with a provenance record per document (version 2
 * shards), that of fake_prov; 0: without (version 1). */
static int with_prov;

static tks_doc_prov fake_prov(size_t i, uint64_t len) {
    return (tks_doc_prov){(uint32_t)(i % 3), (uint32_t)i, (uint64_t)i * 1000003u, (uint32_t)len,
                          (uint32_t)(i * 2654435761u)};
}

/* Writes docs into dir as a complete dataset (with a fake tokenizer file). */
static void write_dataset(const char *dir, const docs *D, uint32_t vocab, uint64_t shard_tokens,
                          uint32_t chunk) {
    mkdirs(dir);
    char tpath[PATH_MAX];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.model", dir);
    char fake[64];
    snprintf(fake, sizeof fake, "fake tokenizer for vocab %u", vocab);
    spit(tpath, fake, strlen(fake));
    tks_tokenizer_info tok = {.vocab_size = vocab, .bos_id = 1, .eos_id = 2, .pad_id = TKS_NO_ID,
                              .unk_id = 0};
    snprintf(tok.file, sizeof tok.file, "tokenizer.model");
    snprintf(tok.model_type, sizeof tok.model_type, "bpe");
    CHECK(tks_file_xxh3_128(tpath, tok.fingerprint, NULL) == 0, "hash tokenizer");
    if (vocab == 100000) { /* a byte-level tokenizer's tables digest; the others have none (older manifests) */
        tok.has_tables = 1;
        for (int i = 0; i < 16; i++) tok.tables_xxh3[i] = (uint8_t)(0xa0 + i);
    }
    tks_writer_opts o = {.dir = dir, .vocab_size = vocab, .bos_id = 1, .eos_id = 2,
                         .pad_id = TKS_NO_ID, .shard_tokens = shard_tokens, .chunk_bytes = chunk,
                         .provenance = with_prov};
    memcpy(o.tokenizer_fp, tok.fingerprint, 16);
    tks_writer *w;
    CHECK(tks_writer_create(&o, &w) == 0, "create: %s", tks_last_error()->message);
    for (size_t i = 0; i < D->n; i++) {
        tks_doc_prov p = fake_prov(i, D->len[i]);
        CHECK(tks_writer_add_prov(w, D->d[i], D->len[i], i, with_prov ? &p : NULL, NULL) == 0, "add %zu: %s", i,
              tks_last_error()->message);
    }
    /* a writer refuses a document without the provenance it was made for, or with it when not */
    tks_doc_prov p0 = fake_prov(0, 1);
    CHECK(tks_writer_add_prov(w, D->d[0], D->len[0], 0, with_prov ? NULL : &p0, NULL) == TKS_ERR_ARG,
          "a writer %s provenance took a document %s it", with_prov ? "with" : "without",
          with_prov ? "without" : "with");
    CHECK(tks_writer_flush(w) == 0, "flush");
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(w, &ns);
    CHECK(tks_manifest_write(dir, &tok, si, ns, vocab <= 65536 ? 2 : 4,
                             chunk ? chunk : TKS_DEFAULT_CHUNK_BYTES, "{\"test\": true}") == 0,
          "manifest: %s", tks_last_error()->message);
    check_manifest_rendering(dir);
    tks_writer_free(w);
}

/* tks_stats_compute against counts made here from the documents written. */
static void check_stats(const tks_dataset *ds, const docs *D, uint32_t vocab) {
    size_t ns = tks_dataset_n_shards(ds);
    const tks_shard **sh = malloc(ns * sizeof *sh);
    for (size_t i = 0; i < ns; i++) sh[i] = tks_dataset_shard(ds, i);
    tks_stats *st = NULL;
    int rc = tks_stats_compute(sh, ns, 5, &st);
    free(sh);
    CHECK(rc == 0, "stats: %s", tks_last_error()->message);
    if (rc) return;
    uint64_t *counts = calloc(vocab, sizeof *counts), hist[65] = {0}, toks = 0, lo = UINT64_MAX, hi = 0;
    for (size_t d = 0; d < D->n; d++) {
        uint64_t len = D->len[d];
        int b = 0;
        while ((UINT64_C(2) << b) <= len) b++;
        hist[b]++;
        lo = len < lo ? len : lo;
        hi = len > hi ? len : hi;
        toks += len;
        for (size_t j = 0; j < len; j++) counts[D->d[d][j]]++;
    }
    CHECK(st->n_docs == D->n && st->n_tokens == toks && st->vocab_size == vocab, "stats totals");
    CHECK(st->min_doc_tokens == lo && st->max_doc_tokens == hi, "stats lengths [%llu, %llu]",
          (unsigned long long)st->min_doc_tokens, (unsigned long long)st->max_doc_tokens);
    CHECK(memcmp(st->doc_hist, hist, sizeof hist) == 0, "stats histogram");
    CHECK(memcmp(st->counts, counts, vocab * sizeof *counts) == 0, "stats id counts");
    CHECK(st->n_top == 5, "n_top %zu", st->n_top);
    for (size_t k = 0; k < st->n_top; k++) {
        uint32_t id = st->top[k];
        /* every id ranked below holds fewer, or as many with a larger id */
        for (uint32_t x = 0; x < vocab; x++) {
            int ranked = 0;
            for (size_t j = 0; j <= k; j++) ranked |= st->top[j] == x;
            CHECK(ranked || counts[x] < counts[id] || (counts[x] == counts[id] && x > id),
                  "top %zu: id %u (%llu) outranks %u (%llu)", k, x,
                  (unsigned long long)counts[x], id, (unsigned long long)counts[id]);
            if (!(ranked || counts[x] < counts[id] || (counts[x] == counts[id] && x > id))) break;
        }
    }
    free(counts);
    tks_stats_free(st);
}

static void test_round_trip(uint32_t vocab, uint64_t shard_tokens, uint32_t chunk) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/rt-%u-v%d", work, vocab, with_prov ? 2 : 1);
    docs D = random_docs(3000, vocab, 200);
    write_dataset(dir, &D, vocab, shard_tokens, chunk);
    tks_dataset *ds;
    int rc = tks_dataset_open(dir, &ds);
    CHECK(rc == 0, "open dataset: %s", tks_last_error()->message);
    if (rc) { free_docs(&D); return; }
    size_t doc = 0;
    uint64_t toks = 0;
    CHECK(tks_dataset_n_shards(ds) > 1, "expected several shards, got %zu", tks_dataset_n_shards(ds));
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(ds);
    CHECK(ti->has_tables == (vocab == 100000) && (!ti->has_tables || (ti->tables_xxh3[0] == 0xa0 &&
                                                                      ti->tables_xxh3[15] == 0xaf)),
          "tables_xxh3 read back: has %d", ti->has_tables);
    for (size_t s = 0; s < tks_dataset_n_shards(ds); s++) {
        const tks_shard *sh = tks_dataset_shard(ds, s);
        const tks_shard_header *h = tks_shard_hdr(sh);
        CHECK(h->token_bytes == (vocab <= 65536 ? 2u : 4u), "dtype %u", h->token_bytes);
        const uint64_t *ix = tks_shard_doc_index(sh);
        for (uint64_t d = 0; d < h->n_docs; d++, doc++) {
            uint64_t len = ix[d + 1] - ix[d];
            uint32_t *buf = malloc(len * 4);
            CHECK(tks_shard_read(sh, ix[d], len, 0, buf) == 0, "read");
            CHECK(len == D.len[doc] && memcmp(buf, D.d[doc], len * 4) == 0,
                  "doc %zu differs after round trip (vocab %u)", doc, vocab);
            free(buf);
            tks_doc_prov p, want = fake_prov(doc, D.len[doc]);
            if (with_prov)
                CHECK(tks_shard_prov(sh, d, &p) == 0 && !memcmp(&p, &want, sizeof p),
                      "doc %zu's provenance differs after round trip", doc);
            else
                CHECK(tks_shard_prov(sh, d, &p) == TKS_ERR_ARG && strstr(tks_last_error()->message, "version 1"),
                      "a version 1 shard gave provenance: %s", tks_last_error()->message);
            toks += len;
        }
        for (uint64_t c = 0; c < h->n_chunks; c++) CHECK(tks_shard_verify_chunk(sh, c) == 0, "chunk");
        CHECK(h->version == (with_prov ? TKS_FORMAT_V2 : TKS_FORMAT_V1) && tks_shard_has_prov(sh) == with_prov,
              "shard version %u", h->version);
        if (with_prov) CHECK(tks_shard_verify_prov(sh) == 0, "provenance: %s", tks_last_error()->message);
    }
    CHECK(tks_dataset_format_version(ds) == (with_prov ? TKS_FORMAT_V2 : TKS_FORMAT_V1), "dataset version %u",
          tks_dataset_format_version(ds));
    CHECK(doc == D.n, "read %zu docs of %zu", doc, D.n);
    CHECK(toks == tks_dataset_n_tokens(ds), "token total");
    CHECK(tks_dataset_max_token_id(ds) == vocab - 1, "max id %u", tks_dataset_max_token_id(ds));
    /* the reader refuses ids at or above a smaller model vocabulary, naming shard and offset */
    const tks_shard *s0 = tks_dataset_shard(ds, 0);
    uint32_t *buf = malloc(D.len[0] * 4);
    rc = tks_shard_read(s0, 0, D.len[0], vocab - 1, buf);
    CHECK(rc == TKS_ERR_TOKEN_RANGE && tks_last_error()->shard == 0 && tks_last_error()->offset == 0,
          "model-vocab refusal rc=%d offset=%llu", rc, (unsigned long long)tks_last_error()->offset);
    CHECK(strstr(tks_last_error()->message, "token offset 0") != NULL, "message: %s",
          tks_last_error()->message);
    CHECK(tks_shard_read(s0, tks_shard_hdr(s0)->n_tokens, 1, 0, buf) == TKS_ERR_BOUNDS, "bounds");
    free(buf);
    tks_audit_report *r;
    CHECK(tks_audit(dir, NULL, &r) == 0 && r->n_problems_total == 0 && r->manifest_checked,
          "clean audit found %zu problems: %s", r ? r->n_problems_total : 0,
          r && r->n_problems ? r->problems[0].message : "");
    CHECK(r->n_tokens == toks && r->max_token_id == vocab - 1 && r->min_token_id == 0, "audit totals");
    tks_audit_report_free(r);
    tks_audit_opts ao = {.model_vocab = vocab - 1};
    CHECK(tks_audit(dir, &ao, &r) == 0 && r->n_problems_total >= 1 &&
              r->problems[0].code == TKS_ERR_TOKEN_RANGE && r->problems[0].token_offset == 0 &&
              r->problems[0].doc == 0 && r->problems[0].shard == 0,
          "audit --model-vocab should flag shard 0 token 0");
    tks_audit_report_free(r);
    check_stats(ds, &D, vocab);
    tks_dataset_close(ds);

    /* determinism: the same documents give byte-identical shards */
    char dir2[1536], a[PATH_MAX], b[PATH_MAX];
    snprintf(dir2, sizeof dir2, "%s/rt-%u-v%d-again", work, vocab, with_prov ? 2 : 1);
    write_dataset(dir2, &D, vocab, shard_tokens, chunk);
    snprintf(a, sizeof a, "diff -r '%s' '%s' >/dev/null", dir, dir2);
    CHECK(system(a) == 0, "two writes of the same docs differ");
    (void)b;
    free_docs(&D);
}

static void test_writer_refuses(void) {
    char dir[1536];
    snprintf(dir, sizeof dir, "%s/refuse", work);
    mkdirs(dir);
    tks_writer_opts o = {.dir = dir, .vocab_size = 100, .shard_tokens = 1000, .bos_id = TKS_NO_ID,
                         .eos_id = TKS_NO_ID, .pad_id = TKS_NO_ID};
    tks_writer *w;
    CHECK(tks_writer_create(&o, &w) == 0, "create");
    uint32_t good[3] = {1, 2, 99}, badv[4] = {1, 2, 100, 3}, neg[2] = {5, (uint32_t)-1};
    CHECK(tks_writer_add(w, good, 3, 0, NULL) == 0, "good doc");
    int rc = tks_writer_add(w, badv, 4, 1, NULL);
    CHECK(rc == TKS_ERR_TOKEN_RANGE, "id == vocab accepted (rc %d)", rc);
    CHECK(strstr(tks_last_error()->message, "document 1, position 2") != NULL, "message: %s",
          tks_last_error()->message);
    CHECK(tks_last_error()->doc == 1, "doc in context");
    CHECK(tks_writer_add(w, neg, 2, 2, NULL) == TKS_ERR_TOKEN_RANGE, "negative id accepted");
    CHECK(tks_writer_add(w, good, 0, 3, NULL) == TKS_ERR_ARG, "empty doc accepted");
    CHECK(tks_writer_add(w, good, 3, 4, NULL) == 0, "good doc after refusal");
    CHECK(tks_writer_flush(w) == 0, "flush");
    tks_writer_free(w);
    tks_shard *s;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/shard-00000.tks", dir);
    CHECK(tks_shard_open(p, &s) == 0, "open: %s", tks_last_error()->message);
    CHECK(tks_shard_hdr(s)->n_docs == 2 && tks_shard_hdr(s)->n_tokens == 6,
          "refused documents must leave no trace");
    tks_shard_close(s);
    /* a temp file is never left under the final name */
    CHECK(tks_writer_create(&o, &w) == 0, "create 2");
    o.first_shard = 0;
    CHECK(tks_writer_add(w, good, 3, 0, NULL) == 0, "add");
    snprintf(p, sizeof p, "%s/shard-00000.tks.tmp", dir);
    CHECK(access(p, F_OK) == 0, "temp file expected while the shard is open");
    tks_writer_free(w);
    CHECK(access(p, F_OK) != 0, "temp file left behind after free");
}

/* Re-seals a modified shard image: recomputes chunk hashes, index hash, table
 * hash and header checksum, so only the semantic check can catch the change. */
static void reseal(unsigned char *b, tks_shard_header *h) {
    uint64_t *table = (uint64_t *)(b + h->table_offset);
    for (uint64_t c = 0; c < h->n_chunks; c++) {
        uint64_t off = c * h->chunk_bytes;
        uint64_t len = h->tokens_bytes - off < h->chunk_bytes ? h->tokens_bytes - off : h->chunk_bytes;
        table[c] = XXH3_64bits(b + h->tokens_offset + off, len);
    }
    table[h->n_chunks] = XXH3_64bits(b + h->index_offset, h->index_bytes);
    h->table_xxh3 = XXH3_64bits(table, h->table_bytes);
    tks_header_encode(h, b);
}

static int audit_problems(const char *path, int *first_code) {
    tks_audit_report *r = NULL;
    if (tks_audit(path, NULL, &r) != 0) return -1;
    int n = (int)r->n_problems_total;
    if (first_code) *first_code = n ? r->problems[0].code : 0;
    tks_audit_report_free(r);
    return n;
}

static void test_corruption(void) {
    char dir[1536], path[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/corrupt-v%d", work, with_prov ? 2 : 1);
    docs D = random_docs(7, 500, 12);
    write_dataset(dir, &D, 500, 1u << 20, 64);
    free_docs(&D);
    snprintf(path, sizeof path, "%s/shard-00000.tks", dir);
    size_t n;
    unsigned char *orig = slurp(path, &n);
    CHECK(orig != NULL, "read shard");
    if (!orig) return;
    tks_shard *s;
    CHECK(tks_shard_open_mem(orig, n, "mem", &s) == 0, "open clean image: %s", tks_last_error()->message);
    tks_shard_header h0 = *tks_shard_hdr(s);
    tks_shard_close(s);
    CHECK(audit_problems(path, NULL) == 0, "clean shard has problems");

    /* every single bit flip is caught by audit; outside the token section, by open too */
    int fd = open(path, O_RDWR);
    size_t missed = 0, open_missed = 0;
    unsigned char *img = aligned_alloc(64, (n + 64 + 63) & ~(size_t)63);
    memcpy(img, orig, n);
    for (size_t byte = 0; byte < n; byte++) {
        for (int bit = 0; bit < 8; bit++) {
            unsigned char v = orig[byte] ^ (unsigned char)(1u << bit);
            if (pwrite(fd, &v, 1, (off_t)byte) != 1) { perror("pwrite"); exit(2); }
            if (audit_problems(path, NULL) <= 0) {
                if (missed++ < 5) fprintf(stderr, "  audit missed bit %d of byte %zu\n", bit, byte);
            }
            /* the tokens and the provenance section are hashed by the audit, not at open */
            int in_tokens = (byte >= h0.tokens_offset && byte < h0.tokens_offset + h0.tokens_bytes) ||
                            (h0.prov_bytes && byte >= h0.prov_offset);
            if (!in_tokens) {
                img[byte] = v;
                if (tks_shard_open_mem(img, n, "mem", &s) == 0) {
                    tks_shard_close(s);
                    if (open_missed++ < 5) fprintf(stderr, "  open missed bit %d of byte %zu\n", bit, byte);
                }
                img[byte] = orig[byte];
            }
        }
        if (pwrite(fd, &orig[byte], 1, (off_t)byte) != 1) { perror("pwrite"); exit(2); }
    }
    close(fd);
    CHECK(missed == 0, "%zu of %zu single-bit flips not detected by audit", missed, n * 8);
    CHECK(open_missed == 0, "%zu flips outside the token section not detected by open", open_missed);
    printf("bit flips: %zu bits of a %zu-byte version %u shard, all detected\n", n * 8, n, h0.version);

    /* every truncation (and one extra byte) is caught by open and audit */
    size_t tmiss = 0;
    for (size_t len = 0; len < n; len++) {
        spit(path, orig, len);
        int code = 0;
        int rc = tks_shard_open(path, &s);
        if (rc == 0) tks_shard_close(s);
        if (rc == 0 || audit_problems(path, &code) <= 0) tmiss++;
        if (len >= TKS_HEADER_SIZE && rc != TKS_ERR_TRUNCATED && tmiss < 3) {
            tmiss++;
            fprintf(stderr, "  truncation to %zu gave rc %d\n", len, rc);
        }
    }
    memcpy(img, orig, n);
    img[n] = 0;
    spit(path, img, n + 1);
    CHECK(tks_shard_open(path, &s) == TKS_ERR_TRUNCATED, "extra byte not detected");
    CHECK(tmiss == 0, "%zu truncations not detected as such", tmiss);
    printf("truncations: all %zu lengths detected\n", n);

    /* wrong magic / version */
    memcpy(img, orig, n);
    img[0] = 'X';
    CHECK(tks_shard_open_mem(img, n, "mem", &s) == TKS_ERR_MAGIC, "bad magic");
    tks_shard_header h = h0;
    memcpy(img, orig, n);
    h.version = 3;
    tks_header_encode(&h, img);
    CHECK(tks_shard_open_mem(img, n, "mem", &s) == TKS_ERR_VERSION, "version 3 accepted");
    CHECK(strstr(tks_last_error()->message, "version 3") != NULL, "version message: %s",
          tks_last_error()->message);
    /* a version 1 shard claiming version 2 (or the reverse) breaks the layout */
    memcpy(img, orig, n);
    h = h0;
    h.version = h0.version == TKS_FORMAT_V2 ? TKS_FORMAT_V1 : TKS_FORMAT_V2;
    tks_header_encode(&h, img);
    CHECK(tks_shard_open_mem(img, n, "mem", &s) == TKS_ERR_HEADER, "a shard of the other version's layout accepted");

    /* a non-monotonic index, resealed so only the monotonicity rule can catch it */
    memcpy(img, orig, n);
    h = h0;
    uint64_t *ix = (uint64_t *)(img + h.index_offset);
    uint64_t t = ix[2];
    ix[2] = ix[1];
    reseal(img, &h);
    int rc = tks_shard_open_mem(img, n, "mem", &s);
    CHECK(rc == TKS_ERR_INDEX && tks_last_error()->doc == 2, "non-monotonic index: rc %d doc %llu", rc,
          (unsigned long long)tks_last_error()->doc);
    spit(path, img, n);
    int code = 0;
    CHECK(audit_problems(path, &code) >= 1 && code == TKS_ERR_INDEX, "audit: index code %d", code);
    ix[2] = t;

    /* an out-of-range id smuggled in with valid checksums and a lying header */
    memcpy(img, orig, n);
    h = h0;
    ((uint16_t *)(img + h.tokens_offset))[5] = 500; /* vocab is 500 */
    reseal(img, &h);
    CHECK(tks_shard_open_mem(img, n, "mem", &s) == 0, "resealed image should open (O(index) checks)");
    uint32_t out[64];
    rc = tks_shard_read(s, 0, h.n_tokens < 64 ? h.n_tokens : 64, 0, out);
    CHECK(rc == TKS_ERR_TOKEN_RANGE && tks_last_error()->offset == 5, "read: rc %d off %llu", rc,
          (unsigned long long)tks_last_error()->offset);
    tks_shard_close(s);
    spit(path, img, n);
    tks_audit_report *r;
    tks_audit_opts ao = {0};
    CHECK(tks_audit(path, &ao, &r) == 0, "audit runs");
    uint64_t want_doc = 0;
    const uint64_t *ix5 = (const uint64_t *)(img + h.index_offset);
    while (ix5[want_doc + 1] <= 5) want_doc++;
    int found = 0;
    for (size_t i = 0; i < r->n_problems; i++)
        found |= r->problems[i].code == TKS_ERR_TOKEN_RANGE && r->problems[i].token_offset == 5 &&
                 r->problems[i].doc == want_doc;
    CHECK(found, "audit did not report the bad id at token 5 of doc %llu", (unsigned long long)want_doc);
    tks_audit_report_free(r);
    /* a header claiming max_token_id >= vocab_size is refused on open */
    memcpy(img, orig, n);
    h = h0;
    h.max_token_id = 500;
    reseal(img, &h);
    CHECK(tks_shard_open_mem(img, n, "mem", &s) == TKS_ERR_TOKEN_RANGE, "header max id >= vocab");
    spit(path, orig, n);

    /* dataset level: manifest edits, stray shards, tokenizer swaps, missing manifest */
    tks_dataset *ds;
    CHECK(tks_dataset_open(dir, &ds) == 0, "dataset opens again");
    tks_dataset_close(ds);
    char mp[PATH_MAX], cmd[3 * PATH_MAX];
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    size_t mlen;
    unsigned char *man = slurp(mp, &mlen);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"n_docs\": 7,/\"n_docs\": 8,/' '%s'", mp);
    CHECK(system(cmd) == 0, "sed");
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST, "manifest n_docs edit not caught");
    CHECK(audit_problems(dir, &code) >= 1 && code == TKS_ERR_MANIFEST, "audit: manifest edit");
    spit(mp, man, mlen);
    /* token_bytes contradicting the shards: the seal first, then (resealed,
     * as a tool that edits and re-seals would) the shard comparison */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"token_bytes\": 2,/\"token_bytes\": 4,/' '%s'", mp);
    CHECK(system(cmd) == 0, "sed");
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST && strstr(tks_last_error()->message, "self_xxh3"),
          "manifest token_bytes edit: seal not checked: %s", tks_last_error()->message);
    {
        size_t n;
        char *m = (char *)slurp(mp, &n);
        CHECK(reseal_manifest(m, n) == 0, "no seal in %s", mp);
        spit(mp, m, n);
        free(m);
    }
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST && strstr(tks_last_error()->message, "token_bytes"),
          "manifest token_bytes edit not caught: %s", tks_last_error()->message);
    spit(mp, man, mlen);
    /* the totals' id range against the shard list and the vocabulary, sealed
     * or not; and an edit that changes no number (provenance) breaks the seal */
    static const struct { const char *sed, *msg; int reseal; } edits[] = {
        {"s/\"max_token_id\": \\([0-9]*\\)\\(\\s*\\)}/\"max_token_id\": 9000\\2}/", "id range", 1},
        {"s/\"min_token_id\": \\([0-9]*\\),\\(\\s*\\)\"max_token_id\": \\([0-9]*\\)\\(\\s*\\)}/\"min_token_id\": -3,\\2\"max_token_id\": \\3\\4}/", "id range", 1},
        {"s/\"max_token_id\": \\([0-9]*\\)\\(\\s*\\)}/\"max_token_id\": 9000\\2}/", "was edited", 0},
        {"s/\"test\": true/\"test\": false/", "self_xxh3", 0},
        {"s/\\(\"self_xxh3\": \"\\)[0-9a-f]*/\\10123456789abcdef/", "self_xxh3", 0},
        {"s/\"self_xxh3\"/\"self_xxh4\"/", "does not end with its", 0},
    };
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        snprintf(cmd, sizeof cmd, "sed -i -z '%s' '%s'", edits[e].sed, mp);
        tks_clear_error();
        CHECK(system(cmd) == 0, "sed %s", edits[e].sed);
        size_t n;
        char *m = (char *)slurp(mp, &n);
        CHECK(n != mlen || memcmp(m, man, n) != 0, "edit %zu changed nothing", e);
        if (edits[e].reseal) {
            CHECK(reseal_manifest(m, n) == 0, "no seal");
            spit(mp, m, n);
        }
        free(m);
        CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST && strstr(tks_last_error()->message, edits[e].msg),
              "manifest edit %zu (%s) not caught as %s: %s", e, edits[e].sed, edits[e].msg,
              tks_last_error()->message);
        CHECK(audit_problems(dir, &code) >= 1 && code == TKS_ERR_MANIFEST, "audit: manifest edit %zu", e);
        spit(mp, man, mlen);
    }
    snprintf(cmd, sizeof cmd, "sed -i 's/\"n_shards\": 1,/\"n_shards\": 2,/' '%s'", mp);
    CHECK(system(cmd) == 0, "sed");
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST && strstr(tks_last_error()->message, "totals"),
          "manifest totals edit not caught: %s", tks_last_error()->message);
    CHECK(audit_problems(dir, &code) >= 1 && code == TKS_ERR_MANIFEST, "audit: totals edit");
    spit(mp, man, mlen);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/shard-00001.tks'", path, dir);
    CHECK(system(cmd) == 0, "cp");
    CHECK(audit_problems(dir, &code) >= 1 && code == TKS_ERR_MANIFEST, "stray shard");
    snprintf(cmd, sizeof cmd, "rm '%s/shard-00001.tks' && echo x >> '%s/tokenizer.model'", dir, dir);
    CHECK(system(cmd) == 0, "rm");
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_TOKENIZER, "tokenizer swap not caught");
    CHECK(audit_problems(dir, &code) >= 1 && code == TKS_ERR_TOKENIZER, "audit: tokenizer swap");
    unlink(mp);
    /* a missing manifest: a build to resume is named only when DIR.partial exists */
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST &&
              strstr(tks_last_error()->message, "not a tokshard dataset") &&
              !strstr(tks_last_error()->message, ".partial"),
          "missing manifest message: %s", tks_last_error()->message);
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", dir);
    mkdirs(partial);
    CHECK(tks_dataset_open(dir, &ds) == TKS_ERR_MANIFEST &&
              strstr(tks_last_error()->message, "--resume") && strstr(tks_last_error()->message, partial),
          "missing manifest message with a build in progress: %s", tks_last_error()->message);
    rmdir(partial);
    snprintf(partial, sizeof partial, "%s-nowhere", dir);
    CHECK(tks_dataset_open(partial, &ds) == TKS_ERR_MANIFEST &&
              strstr(tks_last_error()->message, "does not exist"),
          "missing dataset message: %s", tks_last_error()->message);
    free(man);
    free(img);
    free(orig);
}

static void test_header_fuzz_small(void) {
    /* random bytes never open, and never crash the decoder */
    unsigned char *b = aligned_alloc(64, 8192);
    for (int i = 0; i < 20000; i++) {
        size_t n = next_rand() % 8192;
        for (size_t j = 0; j < n; j++) b[j] = (unsigned char)next_rand();
        if (n >= 8 && (i & 1)) memcpy(b, TKS_MAGIC, 8);
        tks_shard *s;
        CHECK(tks_shard_open_mem(b, n, "rand", &s) != 0, "random bytes opened");
    }
    free(b);
}

/* tks_audit_report_add records up to cap problems and counts every one. */
static void test_report_add(void) {
    tks_audit_problem ps[2];
    tks_audit_report r = {.problems = ps};
    for (int i = 0; i < 3; i++)
        CHECK(tks_audit_report_add(&r, 2, 7, TKS_ERR_INDEX, i ? "f" : NULL, 1, TKS_NONE, 3, 4, 5,
                                   "problem %d", i) == (i < 2), "add %d", i);
    CHECK(r.n_problems == 2 && r.n_problems_total == 3, "counts %zu %zu", r.n_problems,
          r.n_problems_total);
    CHECK(ps[0].code == TKS_ERR_INDEX && ps[0].order == 7 && ps[0].shard == 1 &&
              ps[0].chunk == TKS_NONE && ps[0].token_offset == 3 && ps[0].byte_offset == 4 &&
              ps[0].doc == 5 && !strcmp(ps[0].file, "") && !strcmp(ps[1].file, "f") &&
              !strcmp(ps[1].message, "problem 1"),
          "recorded fields");
}

/* ---------------------------------------------------------------------------
 * No file of tokshard's is written through a link it did not make: links
 * planted at the predictable names of the shared write helpers (the old
 * temporary name PATH.tmp-PID, a lock file) leave the file they point at
 * unchanged, and the operation either succeeds without following them or
 * fails naming the file and what to do.
 * ------------------------------------------------------------------------- */

static const char victim_text[] = "the victim's own file\n";

/* 1 when `path` holds exactly victim_text. */
static int victim_intact(const char *path) {
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    int ok = b && n == sizeof victim_text - 1 && !memcmp(b, victim_text, n);
    free(b);
    return ok;
}

/* Each helper that publishes by temporary name, with a link to the victim
 * and a dangling link (which O_CREAT would follow and create) planted at
 * the temporary name the helpers used to take. */
static void links_at_temporary_names(const char *d, const char *victim) {
    static const char *const helper[] = {"tks_write_file_atomic", "tks_write_file_pieces", "tks_copy_file_atomic"};
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s/source", d);
    spit(src, "new contents\n", 13);
    for (int k = 0; k < 3; k++) {
        for (int dangling = 0; dangling < 2; dangling++) {
            char out[PATH_MAX], tmp[PATH_MAX + 64], nowhere[PATH_MAX];
            snprintf(out, sizeof out, "%s/out-%d-%d", d, k, dangling);
            snprintf(nowhere, sizeof nowhere, "%s/created-through-a-link-%d-%d", d, k, dangling);
            snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
            CHECK(symlink(dangling ? nowhere : victim, tmp) == 0, "plant %s", tmp);
            tks_piece pc[2] = {{"new ", 4}, {"contents\n", 9}};
            int rc = k == 0 ? tks_write_file_atomic(out, "new contents\n", 13)
                   : k == 1 ? tks_write_file_pieces(out, pc, 2)
                            : tks_copy_file_atomic(src, out);
            size_t n = 0;
            unsigned char *got = slurp(out, &n);
            CHECK(rc == 0 && got && n == 13 && !memcmp(got, "new contents\n", 13), "%s with a link at %s: rc %d: %s",
                  helper[k], tmp, rc, tks_last_error()->message);
            free(got);
            CHECK(victim_intact(victim), "%s wrote through the link %s into %s", helper[k], tmp, victim);
            CHECK(access(nowhere, F_OK) != 0, "%s created %s through the dangling link %s", helper[k], nowhere, tmp);
            spit(victim, victim_text, sizeof victim_text - 1); /* each case from an intact victim */
            struct stat st;
            CHECK(lstat(out, &st) == 0 && S_ISREG(st.st_mode), "%s: %s is not a regular file", helper[k], out);
        }
    }
    /* two temporary names are never the same */
    char a[PATH_MAX + 32], b[PATH_MAX + 32], base[PATH_MAX];
    snprintf(base, sizeof base, "%s/twice", d);
    int fa = -1, fb = -1;
    CHECK(tks_create_unique(AT_FDCWD, base, 0644, a, sizeof a, &fa) == 0 &&
              tks_create_unique(AT_FDCWD, base, 0644, b, sizeof b, &fb) == 0 && strcmp(a, b) != 0 &&
              !strncmp(a, base, strlen(base)),
          "tks_create_unique: %s, %s", a, b);
    if (fa >= 0) close(fa), unlink(a);
    if (fb >= 0) close(fb), unlink(b);
}

/* tks_lock and tks_open_own on a planted symbolic link, a dangling one, a
 * hard link and a FIFO: refused, naming the file; the victim unchanged. */
static void links_at_lock_names(const char *d, const char *victim) {
    static const char *const kind[] = {"a symbolic link", "a dangling symbolic link", "a hard link", "a FIFO"};
    static const char *const says[] = {"symbolic link", "symbolic link", "links", "not a regular file"};
    for (int k = 0; k < 4; k++) {
        char lock[PATH_MAX], nowhere[PATH_MAX];
        snprintf(lock, sizeof lock, "%s/out-%d.lock", d, k);
        snprintf(nowhere, sizeof nowhere, "%s/lock-created-through-a-link", d);
        int made = k == 0 ? symlink(victim, lock) : k == 1 ? symlink(nowhere, lock)
                 : k == 2 ? link(victim, lock) : mkfifo(lock, 0644);
        CHECK(made == 0, "plant %s", lock);
        for (int how = 0; how < 2; how++) { /* the lock, and the helper under it (with O_APPEND) */
            int fd = -1;
            int rc = how ? tks_open_own(lock, O_WRONLY | O_CREAT | O_APPEND, "metrics file", &fd)
                         : tks_lock(lock, "a test", &fd);
            const char *m = tks_last_error()->message;
            CHECK(rc == TKS_ERR_IO && fd == -1 && strstr(m, lock) && strstr(m, says[k]) && strstr(m, "remove"),
                  "%s at %s: rc %d: %s", kind[k], lock, rc, m);
            if (fd >= 0) tks_unlock(fd, NULL);
        }
        CHECK(victim_intact(victim), "the lock through %s changed %s", kind[k], victim);
        CHECK(access(nowhere, F_OK) != 0, "the lock created %s through %s", nowhere, kind[k]);
        unlink(lock);
        unlink(nowhere);
        spit(victim, victim_text, sizeof victim_text - 1);
    }
    /* another user's file (root can make one; anyone else skips this) */
    char lock[PATH_MAX];
    snprintf(lock, sizeof lock, "%s/theirs.lock", d);
    spit(lock, "", 0);
    if (geteuid() == 0 && chown(lock, 65534, 65534) == 0) {
        int fd = -1, rc = tks_lock(lock, "a test", &fd);
        CHECK(rc == TKS_ERR_IO && strstr(tks_last_error()->message, "belongs to user 65534"),
              "another user's lock file: rc %d: %s", rc, tks_last_error()->message);
        if (fd >= 0) tks_unlock(fd, NULL);
    }
    /* a stale lock file of one's own is taken as before, and released by name
     * only while the name is still that file */
    snprintf(lock, sizeof lock, "%s/own.lock", d);
    spit(lock, "pid 1: old\n", 11);
    int fd = -1;
    CHECK(tks_lock(lock, "a test", &fd) == 0, "own stale lock: %s", tks_last_error()->message);
    char other[PATH_MAX];
    snprintf(other, sizeof other, "%s/other", d);
    spit(other, "x", 1);
    CHECK(rename(other, lock) == 0, "replace %s", lock);
    tks_unlock(fd, lock);
    CHECK(access(lock, F_OK) == 0, "tks_unlock removed a file that took the lock's name");
}

static void test_no_write_through_links(void) {
    char d[1536], victim[PATH_MAX];
    snprintf(d, sizeof d, "%s/links", work);
    mkdirs(d);
    snprintf(victim, sizeof victim, "%s/victim", d);
    spit(victim, victim_text, sizeof victim_text - 1);
    alarm(60); /* a FIFO opened for writing without a reader would block: killed, the test fails */
    links_at_temporary_names(d, victim);
    links_at_lock_names(d, victim);
    alarm(0);
}

int main(int argc, char **argv) {
    snprintf(work, sizeof work, "%s", argc > 1 ? argv[1] : "/tmp/tks-test-dataset");
    mkdirs(work);
    for (with_prov = 0; with_prov < 2; with_prov++) { /* version 1 shards, then version 2 */
        test_round_trip(1000, 20000, 256);      /* uint16 */
        test_round_trip(100000, 20000, 4096);   /* uint32 */
        test_round_trip(65536, 50000, 0);       /* largest uint16 vocab, default chunk */
        test_corruption();
    }
    with_prov = 0;
    test_writer_refuses();
    test_header_fuzz_small();
    test_report_add();
    test_no_write_through_links();
    if (failures) {
        fprintf(stderr, "test_dataset: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_dataset: all checks passed\n");
    return 0;
}
