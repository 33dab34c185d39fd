/*
 * test_spm.c - the sentencepiece wrapper (tokenizer/tokenizer.h) on real text: the
 * first lines of GCIDE (/usr/share/dictd/gcide.dict.dz, package dict-gcide).
 * Trains BPE and unigram models through tks_spm_train and checks them
 * against Debian's own tools (spm_encode, spm_export_vocab), under OpenMP
 * threads, for exact retraining; then word/char models, non-model and
 * truncated files (the model_type walker), and training failures.
 *
 * Usage: test_spm WORKDIR (created if missing; models and scratch files go
 * there). Exit status 0 only when every check passed.
 */
#define _POSIX_C_SOURCE 200809L
#include "tests/check.h"
#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


#include "tokenizer/tokenizer.h"

#define GCIDE "/usr/share/dictd/gcide.dict.dz"
#define SPM_ENCODE "/usr/bin/spm_encode"
#define SPM_EXPORT_VOCAB "/usr/bin/spm_export_vocab"
#define N_TRAIN 20000 /* lines the models are trained on */
#define N_HELD 2000   /* following lines, never seen in training */
#define VOCAB 2000u



/* Checks a library call; prints its error context on failure. */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        CHECK(rc_ == 0, "returned %d (%s): %s", rc_, tks_strerror(rc_), tks_last_error()->message); \
    } while (0)

/* snprintf that exits rather than truncate (paths and commands). */
__attribute__((format(printf, 3, 4))) static void fmt(char *out, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "path too long: %s...\n", out);
        exit(1);
    }
}

typedef struct {
    char **v;
    size_t n, cap;
} lines;

static void lines_push(lines *l, const char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) abort();
    }
    l->v[l->n] = strdup(s);
    if (!l->v[l->n]) abort();
    l->n++;
}

static void lines_free(lines *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

/* The first n non-empty lines of GCIDE, without their '\n'. */
static int read_gcide(size_t n, lines *out) {
    FILE *f = popen("zcat " GCIDE, "r");
    if (!f) return -1;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    while (out->n < n && (len = getline(&buf, &cap, f)) > 0) {
        if (buf[len - 1] == '\n') buf[--len] = 0;
        if (len == 0 || strchr(buf, '\r') || strlen(buf) != (size_t)len) continue;
        lines_push(out, buf);
    }
    free(buf);
    pclose(f); /* zcat may die of SIGPIPE: we stop reading early */
    return out->n == n ? 0 : -1;
}

static int read_file(const char *path, char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    size_t r;
    while (p && (r = fread(p + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) p = realloc(p, cap *= 2);
    }
    fclose(f);
    if (!p) return -1;
    *data = p;
    *size = n;
    return 0;
}

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, size, f);
    return (fclose(f) == 0 && w == size) ? 0 : -1;
}

/* Training text callback over a `lines`. Optionally fails after fail_at
 * sentences with TKS_ERR_INPUT, as an input reader would. */
typedef struct {
    const lines *l;
    size_t i, end;
    size_t fail_at; /* 0 = never */
} feed;

static int feed_next(void *ctx, const char **text, size_t *len) {
    feed *f = ctx;
    if (f->fail_at && f->i == f->fail_at)
        return tks_fail(TKS_ERR_INPUT, "corpus.txt.gz", TKS_NONE, 1234, "corrupt gzip stream");
    if (f->i >= f->end) return 0;
    *text = f->l->v[f->i];
    *len = strlen(f->l->v[f->i]);
    f->i++;
    return 1;
}

static int train(const lines *l, size_t n, const char *prefix, const char *type, int byte_fallback,
                 uint64_t sample, uint32_t seed) {
    tks_spm_train_opts o = {0};
    o.model_prefix = prefix;
    o.model_type = type;
    o.vocab_size = VOCAB;
    o.byte_fallback = byte_fallback;
    o.input_sentence_size = sample;
    o.threads = 2;
    o.seed = seed;
    feed f = {l, 0, n, 0};
    return tks_spm_train(&o, feed_next, &f);
}

/*
 * What decode(encode(s)) must give for printable ASCII `s`: sentencepiece's
 * normalizer (nmt_nfkc, remove_extra_whitespaces) drops leading and trailing
 * spaces and collapses runs of spaces; ASCII is otherwise unchanged. Writes
 * it to out (strlen(s)+1 bytes) and returns 1, or returns 0 for other text.
 */
static int ascii_normalized(const char *s, char *out) {
    size_t o = 0;
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return 0;
        if (*p == ' ' && (o == 0 || out[o - 1] == ' ')) continue;
        out[o++] = *p;
    }
    if (o > 0 && out[o - 1] == ' ') o--;
    out[o] = 0;
    return 1;
}

static int ids_equal(const tks_ids *a, const tks_ids *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->ids, b->ids, a->n * sizeof *a->ids) == 0);
}

/* Checks one trained model: metadata, spm tools, round trips, threads. */
/* tks_spm_compare_docs: the two encoders agree on every line, and an error
 * of the document source comes back as it was. */
static void check_compare(const tks_spm *s, const lines *check) {
    if (tks_spm_fast_unavailable(s)) return;
    feed fd = {check, 0, check->n, 0};
    tks_spm_compare c;
    int rc = tks_spm_compare_docs(s, feed_next, &fd, &c);
    CHECK(rc == 0 && !c.differ && c.docs == check->n, "compare: rc %d, differ %d at id %zu, %llu docs",
          rc, c.differ, c.first_diff, (unsigned long long)c.docs);
    tks_spm_compare_free(&c);
    feed bad = {check, 0, check->n, 3};
    rc = tks_spm_compare_docs(s, feed_next, &bad, &c);
    CHECK(rc == TKS_ERR_INPUT && c.docs == 3, "compare with a failing source: rc %d, %llu docs", rc,
          (unsigned long long)c.docs);
    tks_spm_compare_free(&c);
}

static void check_model(const char *dir, const char *name, const char *type, int byte_fallback,
                        const lines *check) {
    char model[4096], vocab[4096], cmd[8192], path[4096];
    fmt(model, sizeof model, "%s/%s.model", dir, name);
    fmt(vocab, sizeof vocab, "%s/%s.vocab", dir, name);
    fprintf(stderr, "checking %s\n", model);

    tks_spm *s = NULL;
    int rc = tks_spm_load(model, &s);
    CHECK(rc == 0 && s, "load %s: %d %s", model, rc, tks_last_error()->message);
    if (!s) return;
    check_compare(s, check);
    CHECK(tks_spm_vocab_size(s) == VOCAB, "vocab size %u, asked %u", tks_spm_vocab_size(s), VOCAB);
    CHECK(strcmp(tks_spm_model_type(s), type) == 0, "model type \"%s\", want \"%s\"",
          tks_spm_model_type(s), type);
    CHECK(tks_spm_unk_id(s) == 0, "unk id %u", tks_spm_unk_id(s));
    CHECK(tks_spm_bos_id(s) == 1, "bos id %u", tks_spm_bos_id(s));
    CHECK(tks_spm_eos_id(s) == 2, "eos id %u", tks_spm_eos_id(s));
    CHECK(tks_spm_pad_id(s) == TKS_NO_ID, "pad id %u", tks_spm_pad_id(s));
    CHECK(tks_spm_piece(s, 0) && strcmp(tks_spm_piece(s, 0), "<unk>") == 0, "piece 0 \"%s\"",
          tks_spm_piece(s, 0));
    CHECK(tks_spm_piece(s, 1) && strcmp(tks_spm_piece(s, 1), "<s>") == 0, "piece 1 \"%s\"",
          tks_spm_piece(s, 1));
    CHECK(tks_spm_piece(s, 2) && strcmp(tks_spm_piece(s, 2), "</s>") == 0, "piece 2 \"%s\"",
          tks_spm_piece(s, 2));
    CHECK(tks_spm_piece(s, VOCAB) == NULL, "piece of id %u is not NULL", VOCAB);
    if (byte_fallback)
        CHECK(tks_spm_piece(s, 3) && strcmp(tks_spm_piece(s, 3), "<0x00>") == 0,
              "byte_fallback: piece 3 is \"%s\", want <0x00>", tks_spm_piece(s, 3));

    uint8_t fp[16];
    CHECK_OK(tks_file_xxh3_128(model, fp, NULL));
    CHECK(memcmp(fp, tks_spm_fingerprint(s), 16) == 0, "fingerprint differs from the file's XXH3-128");

    /* PREFIX.vocab (written by tks_spm_train) == spm_export_vocab's output. */
    fmt(path, sizeof path, "%s/%s.exported", dir, name);
    fmt(cmd, sizeof cmd, SPM_EXPORT_VOCAB " --model=%s --output=%s 2>/dev/null", model, path);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK(read_file(vocab, &a, &na) == 0, "cannot read %s", vocab);
    CHECK(read_file(path, &b, &nb) == 0, "cannot read %s", path);
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0, "%s (%zu bytes) differs from %s (%zu bytes)",
          vocab, na, path, nb);
    free(a);
    free(b);

    /* Encode every check line; all ids < vocab; exact round trips. */
    tks_ids *serial = calloc(check->n, sizeof *serial);
    if (!serial) abort();
    size_t n_tokens = 0, n_round = 0, n_exact = 0;
    uint32_t max_id = 0;
    for (size_t i = 0; i < check->n; i++) {
        const char *line = check->v[i];
        rc = tks_spm_encode(s, line, strlen(line), &serial[i]);
        CHECK(rc == 0, "encode line %zu: %d %s", i, rc, tks_last_error()->message);
        int has_unk = 0;
        for (size_t k = 0; k < serial[i].n; k++) {
            if (serial[i].ids[k] > max_id) max_id = serial[i].ids[k];
            if (serial[i].ids[k] == tks_spm_unk_id(s)) has_unk = 1;
        }
        n_tokens += serial[i].n;
        CHECK(serial[i].n > 0 || strspn(line, " ") == strlen(line), "line %zu \"%s\" encodes to no id",
              i, line);
        /* byte_fallback models never need <unk>; the others may for rare characters. */
        if (byte_fallback) CHECK(!has_unk, "line %zu \"%s\" has <unk> despite byte_fallback", i, line);
        char *want = malloc(strlen(line) + 1);
        if (!want) abort();
        if (ascii_normalized(line, want) && !has_unk) {
            char *text = NULL;
            size_t len = 0;
            rc = tks_spm_decode(s, serial[i].ids, serial[i].n, &text, &len);
            CHECK(rc == 0 && text && len == strlen(want) && strcmp(text, want) == 0,
                  "line %zu: decode(encode(\"%s\")) = \"%s\" (rc %d), want \"%s\"", i, line,
                  text ? text : "", rc, want);
            free(text);
            n_round++;
            if (strcmp(want, line) == 0) n_exact++;
        }
        free(want);
    }
    CHECK(max_id < VOCAB, "id %u >= vocab %u", max_id, VOCAB);
    CHECK(n_round >= 2000 && n_exact >= 400,
          "only %zu lines were round-trip checked, %zu of them without extra spaces", n_round,
          n_exact);
    fprintf(stderr, "  %zu lines, %zu tokens, max id %u; %zu round trips (%zu without extra spaces)\n",
            check->n, n_tokens, max_id, n_round, n_exact);

    /* Same ids as `spm_encode --output_format=id` on the same lines. */
    fmt(path, sizeof path, "%s/check-lines.txt", dir);
    fmt(cmd, sizeof cmd, SPM_ENCODE " --model=%s --output_format=id %s", model, path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run %s", cmd);
    size_t compared = 0, differing = 0;
    if (p) {
        char *buf = NULL;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&buf, &cap, p)) > 0 && compared < check->n) {
            const tks_ids *want = &serial[compared];
            size_t k = 0;
            int same = 1;
            for (char *q = buf, *e; ; q = e) {
                unsigned long v = strtoul(q, &e, 10);
                if (e == q) break;
                if (k >= want->n || want->ids[k] != v) same = 0;
                k++;
            }
            if (!same || k != want->n) {
                if (differing++ < 5)
                    CHECK(0, "line %zu \"%s\": spm_encode gives \"%.*s\", tks_spm_encode gives %zu ids",
                          compared, check->v[compared], (int)(len - 1), buf, want->n);
            }
            compared++;
        }
        free(buf);
        int st = pclose(p);
        CHECK(st == 0, "%s exited with status %d", cmd, st);
    }
    CHECK(compared == check->n, "spm_encode gave %zu lines for %zu", compared, check->n);
    CHECK(differing == 0, "%zu of %zu lines differ from spm_encode", differing, compared);
    fprintf(stderr, "  %zu lines identical to spm_encode\n", compared - differing);

    /* 4 OpenMP threads on one handle, 3 passes each: same ids as serial. */
    size_t mismatches = 0, errors = 0;
#pragma omp parallel num_threads(4) reduction(+ : mismatches, errors)
    {
        tks_ids mine = {0};
        for (int pass = 0; pass < 3; pass++) {
#pragma omp for schedule(dynamic, 16)
            for (size_t i = 0; i < check->n; i++) {
                if (tks_spm_encode(s, check->v[i], strlen(check->v[i]), &mine) != 0) errors++;
                else if (!ids_equal(&mine, &serial[i])) mismatches++;
            }
        }
        tks_ids_free(&mine);
    }
    CHECK(errors == 0 && mismatches == 0, "threads: %zu errors, %zu lines differ from serial", errors,
          mismatches);

    /* Decode refuses ids >= vocab and names the position. */
    uint32_t bad[3] = {5, 7, VOCAB};
    char *text = (char *)"untouched";
    rc = tks_spm_decode(s, bad, 3, &text, NULL);
    CHECK(rc == TKS_ERR_TOKEN_RANGE, "decode of id %u: rc %d", VOCAB, rc);
    CHECK(text == NULL, "decode failure left *text non-NULL");
    CHECK(tks_last_error()->offset == 2 && strstr(tks_last_error()->message, "position 2"),
          "error context: offset %llu, \"%s\"", (unsigned long long)tks_last_error()->offset,
          tks_last_error()->message);
    uint32_t huge = UINT32_MAX;
    CHECK(tks_spm_decode(s, &huge, 1, &text, NULL) == TKS_ERR_TOKEN_RANGE, "decode of UINT32_MAX");

    /* Empty text and empty id list. */
    tks_ids e = {0};
    CHECK_OK(tks_spm_encode(s, "", 0, &e));
    CHECK(e.n == 0, "empty text gives %zu ids", e.n);
    CHECK_OK(tks_spm_encode(s, NULL, 0, &e));
    size_t len = 1;
    CHECK_OK(tks_spm_decode(s, NULL, 0, &text, &len));
    CHECK(text && text[0] == 0 && len == 0, "decode of no ids");
    free(text);
    tks_ids_free(&e);

    for (size_t i = 0; i < check->n; i++) tks_ids_free(&serial[i]);
    free(serial);
    tks_spm_free(s);
}

/* Truncated and non-model files are refused with TKS_ERR_TOKENIZER, naming
 * the file; cuts around the TrainerSpec exercise the model_type walker. */
static void check_bad_files(const char *dir, const char *model) {
    char path[4096];
    tks_spm *s = NULL;

    /* Missing file: I/O error. */
    fmt(path, sizeof path, "%s/no-such.model", dir);
    CHECK(tks_spm_load(path, &s) == TKS_ERR_IO && s == NULL, "missing file: rc %d",
          tks_last_error()->code);

    /* Random bytes, an empty file, a text file. */
    uint8_t rnd[4096];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof rnd; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        rnd[i] = (uint8_t)x;
    }
    const char *hostname = "/etc/hostname";
    struct stat st;
    for (int k = 0; k < 3; k++) {
        const char *p = path;
        if (k == 0) {
            fmt(path, sizeof path, "%s/random.bin", dir);
            CHECK(write_file(path, rnd, sizeof rnd) == 0, "write %s", path);
        } else if (k == 1) {
            fmt(path, sizeof path, "%s/empty.model", dir);
            CHECK(write_file(path, "", 0) == 0, "write %s", path);
        } else {
            if (stat(hostname, &st) != 0) continue;
            p = hostname;
        }
        int rc = tks_spm_load(p, &s);
        CHECK(rc == TKS_ERR_TOKENIZER && s == NULL, "%s: rc %d", p, rc);
        CHECK(strstr(tks_last_error()->message, p) && strcmp(tks_last_error()->file, p) == 0,
              "%s not named: file \"%s\", message \"%s\"", p, tks_last_error()->file,
              tks_last_error()->message);
        tks_spm_free(s);
        s = NULL;
    }

    char *data = NULL;
    size_t size = 0;
    CHECK(read_file(model, &data, &size) == 0, "cannot read %s", model);
    if (!data) return;
    fmt(path, sizeof path, "%s/truncated.model", dir);

    /* Half a model. */
    CHECK(write_file(path, data, size / 2) == 0, "write %s", path);
    int rc = tks_spm_load(path, &s);
    CHECK(rc == TKS_ERR_TOKENIZER && s == NULL, "half a model: rc %d", rc);
    CHECK(strstr(tks_last_error()->message, path), "message does not name %s: \"%s\"", path,
          tks_last_error()->message);

    /* Cuts at every byte over the TrainerSpec (ModelProto field 2: after
     * the pieces, just before the NormalizerSpec, which starts with its name
     * "nmt_nfkc"), plus 64 cuts spread over the file. A cut on a field
     * boundary may leave a loadable model: it must still say something sane. */
    const char *needle = "nmt_nfkc";
    size_t at = 0;
    for (size_t i = 0; i + strlen(needle) <= size; i++)
        if (memcmp(data + i, needle, strlen(needle)) == 0) {
            at = i;
            break;
        }
    CHECK(at > 512, "normalizer name not found in %s", model);
    size_t cuts = 0, loaded = 0;
    for (size_t c = 0; c < 64 + 512; c++) {
        size_t cut = c < 64 ? size * c / 64 : at + c - 64 - 500;
        if (cut >= size) continue;
        CHECK(write_file(path, data, cut) == 0, "write %s", path);
        rc = tks_spm_load(path, &s);
        CHECK(rc == 0 || rc == TKS_ERR_TOKENIZER, "cut at %zu: rc %d", cut, rc);
        if (rc == 0) {
            const char *t = tks_spm_model_type(s);
            CHECK(!strcmp(t, "bpe") || !strcmp(t, "unigram") || !strcmp(t, "unknown"),
                  "cut at %zu: model type \"%s\"", cut, t);
            loaded++;
        }
        tks_spm_free(s);
        s = NULL;
        cuts++;
    }
    fprintf(stderr, "  %zu truncations tried, %zu still loadable\n", cuts, loaded);
    free(data);
}

/* "word" and "char" models: the model_type walker's other two values. */
static void check_word_char(const char *dir, const lines *l) {
    static const char *const types[] = {"word", "char"};
    for (int t = 0; t < 2; t++) {
        char prefix[4096], model[4096];
        fmt(prefix, sizeof prefix, "%s/%s", dir, types[t]);
        fmt(model, sizeof model, "%s/%s.model", dir, types[t]);
        tks_spm_train_opts o = {0};
        o.model_prefix = prefix;
        o.model_type = types[t];
        o.vocab_size = VOCAB;
        feed f = {l, 0, 5000, 0};
        int rc = tks_spm_train(&o, feed_next, &f);
        CHECK(rc == 0, "training %s: %d %s", types[t], rc, tks_last_error()->message);
        tks_spm *s = NULL;
        rc = tks_spm_load(model, &s);
        CHECK(rc == 0, "load %s: %d %s", model, rc, tks_last_error()->message);
        if (!s) continue;
        CHECK(strcmp(tks_spm_model_type(s), types[t]) == 0, "model type \"%s\", want \"%s\"",
              tks_spm_model_type(s), types[t]);
        /* char models keep only the characters seen (fewer than asked). */
        CHECK(tks_spm_vocab_size(s) <= VOCAB && tks_spm_vocab_size(s) > 50, "%s: vocab size %u",
              types[t], tks_spm_vocab_size(s));
        tks_ids ids = {0};
        const char *line = "of the"; /* words the word model surely keeps */
        char *text = NULL;
        CHECK_OK(tks_spm_encode(s, line, strlen(line), &ids));
        CHECK_OK(tks_spm_decode(s, ids.ids, ids.n, &text, NULL));
        CHECK(text && strcmp(text, line) == 0, "%s: \"%s\" decodes to \"%s\"", types[t], line,
              text ? text : "");
        free(text);
        tks_ids_free(&ids);
        tks_spm_free(s);
    }
}

/* Training failures: a callback error comes back as is, bad options. */
static void check_train_errors(const char *dir, const lines *l) {
    char prefix[4096], model[4096];
    fmt(prefix, sizeof prefix, "%s/failed", dir);
    fmt(model, sizeof model, "%s/failed.model", dir);
    remove(model); /* from an earlier run */

    tks_spm_train_opts o = {0};
    o.model_prefix = prefix;
    o.model_type = "unigram";
    o.vocab_size = VOCAB;
    feed f = {l, 0, 1000, 100};
    tks_clear_error();
    int rc = tks_spm_train(&o, feed_next, &f);
    CHECK(rc == TKS_ERR_INPUT, "callback error: rc %d (%s)", rc, tks_last_error()->message);
    CHECK(strcmp(tks_last_error()->file, "corpus.txt.gz") == 0 && tks_last_error()->offset == 1234,
          "callback's error context lost: file \"%s\"", tks_last_error()->file);
    struct stat st;
    CHECK(stat(model, &st) != 0, "%s exists after a failed training", model);

    o.model_type = "wordpiece";
    f = (feed){l, 0, 1000, 0};
    CHECK(tks_spm_train(&o, feed_next, &f) == TKS_ERR_ARG, "model type wordpiece accepted");
    o.model_type = "unigram";
    o.seed = UINT32_MAX;
    CHECK(tks_spm_train(&o, feed_next, &f) == TKS_ERR_ARG, "reserved seed accepted");
    o.seed = 1;
    CHECK(tks_spm_train(&o, NULL, &f) == TKS_ERR_ARG, "NULL callback accepted");

    /* 5 sentences cannot give 2000 pieces: sentencepiece's refusal. */
    f = (feed){l, 0, 5, 0};
    rc = tks_spm_train(&o, feed_next, &f);
    CHECK(rc == TKS_ERR_TOKENIZER && tks_last_error()->message[0], "tiny corpus: rc %d", rc);
    CHECK(stat(model, &st) != 0, "%s exists after a failed training", model);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s WORKDIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }

    lines all = {0};
    if (read_gcide(N_TRAIN + N_HELD, &all) != 0) {
        fprintf(stderr, "cannot read %zu lines of %s (package dict-gcide)\n",
                (size_t)(N_TRAIN + N_HELD), GCIDE);
        return 1;
    }
    /* Check set: 1000 training lines, every held-out line, and some
     * non-ASCII text (GCIDE is plain ASCII) for byte fallback and <unk>. */
    lines check = {0};
    for (size_t i = 0; i < 1000; i++) lines_push(&check, all.v[i]);
    for (size_t i = N_TRAIN; i < all.n; i++) lines_push(&check, all.v[i]);
    static const char *const extra[] = {
        "na\xc3\xafve caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu",
        "\xce\xb1\xce\xb2\xce\xb3 \xce\xb4\xce\xb5\xce\xbb\xcf\x84\xce\xb1",
        "\xe6\x9d\xb1\xe4\xba\xac means eastern capital",
        "smile \xf0\x9f\x99\x82 and tabs\there",
        "   leading, trailing and   double   spaces   ",
        "x",
    };
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) lines_push(&check, extra[i]);
    char path[4096];
    fmt(path, sizeof path, "%s/check-lines.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    for (size_t i = 0; i < check.n; i++) fprintf(f, "%s\n", check.v[i]);
    if (fclose(f) != 0) return 1;

    /* Train. BPE samples 15000 of the 20000 lines (input_sentence_size). */
    char bpe[4096], uni[4096], bpe_model[4096];
    fmt(bpe, sizeof bpe, "%s/bpe", dir);
    fmt(uni, sizeof uni, "%s/unigram", dir);
    fmt(bpe_model, sizeof bpe_model, "%s.model", bpe);
    double t0 = omp_get_wtime();
    int rc = train(&all, N_TRAIN, bpe, "bpe", 1, 15000, 42);
    CHECK(rc == 0, "training bpe: %d %s", rc, tks_last_error()->message);
    double t1 = omp_get_wtime();
    rc = train(&all, N_TRAIN, uni, "unigram", 0, 0, 42);
    CHECK(rc == 0, "training unigram: %d %s", rc, tks_last_error()->message);
    double t2 = omp_get_wtime();
    fprintf(stderr, "trained bpe in %.1f s, unigram in %.1f s\n", t1 - t0, t2 - t1);
    if (failures) return 1;

    /* Reproducibility: same inputs and seed -> same bytes, even under
     * another prefix (the model does not record its path). The BPE runs
     * sample 15000 of the 20000 lines. */
    char again_prefix[4096], again_model[4096], uni_model[4096];
    fmt(again_prefix, sizeof again_prefix, "%s/again", dir);
    fmt(again_model, sizeof again_model, "%s/again.model", dir);
    fmt(uni_model, sizeof uni_model, "%s.model", uni);
    const struct {
        const char *model, *type;
        int byte_fallback;
        uint64_t sample;
        uint32_t seed;
    } runs[] = {
        {bpe_model, "bpe", 1, 15000, 42},
        {uni_model, "unigram", 0, 0, 42},
    };
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK_OK(train(&all, N_TRAIN, again_prefix, runs[r].type, runs[r].byte_fallback,
                       runs[r].sample, runs[r].seed));
        CHECK(read_file(runs[r].model, &a, &na) == 0, "read %s", runs[r].model);
        CHECK(read_file(again_model, &b, &nb) == 0, "read %s", again_model);
        int same = a && b && na == nb && memcmp(a, b, na) == 0;
        CHECK(same, "%s: training again gave another model (%zu and %zu bytes)", runs[r].type, na,
              nb);
        free(a);
        free(b);
    }

    check_model(dir, "bpe", "bpe", 1, &check);
    check_model(dir, "unigram", "unigram", 0, &check);
    check_bad_files(dir, bpe_model);
    check_word_char(dir, &all);
    check_train_errors(dir, &all);

    lines_free(&check);
    lines_free(&all);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    fprintf(stderr, "all checks passed\n");
    return 0;
}
