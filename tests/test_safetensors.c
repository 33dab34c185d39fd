/*
 * test_safetensors.c - trainer/safetensors.{h,c}: round trips of every dtype
 * and of scalars and empty tensors, byte-identical output whatever the input
 * order, atomic writes, the writer's argument checks, and the reader on
 * untrusted bytes: every truncation, bad header sizes, bad JSON, gaps and
 * overlaps, wrong element counts, unknown dtypes, duplicate names, 64-bit
 * overflow, bad metadata (each refused with its code and message), and 10000
 * random mutations of a valid file that must never crash.
 *
 * Usage:
 *   test_safetensors WORKDIR          all checks (exit 0 = all passed)
 *   test_safetensors --replay PATH..  runs the fuzz check on every file (or
 *                                     directory of files) given: the corpus
 *   test_safetensors --write DIR      writes the files tests/test_safetensors.py reads
 *   test_safetensors --dump FILE      prints a file as JSON lines (for the Python test)
 *   test_safetensors --make-corpus DIR  writes the seed corpus (valid and corrupt files)
 *
 * Compiled with -DTKS_ST_LIBFUZZER the file is instead the libFuzzer target
 * (LLVMFuzzerTestOneInput, no main), running the same check as --replay.
 */
#define _GNU_SOURCE
#include "tests/check.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/ckpt/safetensors.h"

#define ULL(x) ((unsigned long long)(x))

/* A broken invariant in the fuzz check: a bug, whatever the input. */
#define FUZZ_CHECK(cond)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

/* ---------------------------------------------------------------------------
 * The fuzz check: whatever the bytes, opening either fails cleanly or gives a
 * file whose every answer is consistent, readable in full, and which the
 * writer re-serializes into a file that reads back the same.
 * ------------------------------------------------------------------------- */

static size_t g_accepted, g_refused;

/* Compares two open files tensor by tensor and entry by entry. */
static void check_same(const tks_st_file *a, const tks_st_file *b) {
    FUZZ_CHECK(tks_st_n_tensors(a) == tks_st_n_tensors(b));
    FUZZ_CHECK(tks_st_n_metadata(a) == tks_st_n_metadata(b));
    for (size_t i = 0; i < tks_st_n_tensors(a); i++) {
        tks_st_info x, y;
        FUZZ_CHECK(tks_st_tensor_at(a, i, &x) == 0 && tks_st_tensor_at(b, i, &y) == 0);
        FUZZ_CHECK(strcmp(x.name, y.name) == 0 && x.dtype == y.dtype && x.ndim == y.ndim);
        FUZZ_CHECK(memcmp(x.shape, y.shape, sizeof x.shape) == 0 && x.nbytes == y.nbytes);
        FUZZ_CHECK(x.nbytes == 0 || memcmp(x.data, y.data, x.nbytes) == 0);
    }
    for (size_t i = 0; i < tks_st_n_metadata(a); i++) {
        const char *ka, *va, *kb, *vb;
        FUZZ_CHECK(tks_st_metadata_at(a, i, &ka, &va) == 0 && tks_st_metadata_at(b, i, &kb, &vb) == 0);
        FUZZ_CHECK(strcmp(ka, kb) == 0 && strcmp(va, vb) == 0);
    }
}

static void check_input(const uint8_t *data, size_t size) {
    /* An exact-size heap copy, so reading one byte too far is an ASan error. */
    uint8_t *buf = calloc(1, size ? size : 1);
    FUZZ_CHECK(buf != NULL);
    if (size) memcpy(buf, data, size);
    tks_st_file *f = (tks_st_file *)buf; /* must be overwritten */
    int rc = tks_st_open_mem(buf, size, "fuzz.safetensors", &f);
    if (rc != 0) {
        const tks_error *e = tks_last_error();
        FUZZ_CHECK(rc < 0 && f == NULL && e->code == rc);
        FUZZ_CHECK(strncmp(e->message, "fuzz.safetensors: ", 18) == 0);
        FUZZ_CHECK(strcmp(e->file, "fuzz.safetensors") == 0);
        g_refused++;
        free(buf);
        return;
    }
    g_accepted++;
    FUZZ_CHECK(f != NULL && size >= 8);
    uint64_t data_start = 8 + le64(buf), covered = 0;
    FUZZ_CHECK(data_start <= size);
    size_t n = tks_st_n_tensors(f), n_md = tks_st_n_metadata(f);
    tks_st_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    tks_st_kv *kv = calloc(n_md ? n_md : 1, sizeof *kv);
    FUZZ_CHECK(ts && kv);
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) {
        tks_st_info t, u;
        FUZZ_CHECK(tks_st_tensor_at(f, i, &t) == 0);
        if (i > 0) FUZZ_CHECK(strcmp(ts[i - 1].name, t.name) < 0);
        size_t es = tks_st_dtype_size(t.dtype);
        FUZZ_CHECK(es > 0 && t.ndim <= TKS_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (size_t d = 0; d < t.ndim; d++) numel *= t.shape[d];
        for (size_t d = t.ndim; d < TKS_ST_MAX_DIMS; d++) FUZZ_CHECK(t.shape[d] == 0);
        FUZZ_CHECK(numel == t.numel && t.nbytes == numel * es);
        FUZZ_CHECK(t.offset >= data_start && t.offset <= size && t.nbytes <= size - t.offset);
        FUZZ_CHECK((const uint8_t *)t.data == buf + t.offset);
        for (uint64_t b = 0; b < t.nbytes; b++) sum += ((const uint8_t *)t.data)[b];
        covered += t.nbytes;
        FUZZ_CHECK(tks_st_find(f, t.name, &u) == 0);
        FUZZ_CHECK(memcmp(&t, &u, sizeof t) == 0);
        /* the finiteness scan stays inside the tensor and names an element of it */
        uint64_t bad = UINT64_MAX;
        if (tks_st_find_nonfinite(&t, &bad, NULL)) FUZZ_CHECK(bad < t.numel);
        if (t.dtype == TKS_ST_F32) {
            float *dst = malloc(t.nbytes ? (size_t)t.nbytes : 1);
            FUZZ_CHECK(dst != NULL);
            FUZZ_CHECK(tks_st_read_f32(f, t.name, t.shape, t.ndim, dst) == 0);
            FUZZ_CHECK(t.nbytes == 0 || memcmp(dst, t.data, t.nbytes) == 0);
            free(dst);
        } else {
            FUZZ_CHECK(tks_st_read_f32(f, t.name, t.shape, t.ndim, NULL) == TKS_ERR_ARG);
        }
        ts[i] = (tks_st_tensor){.name = t.name, .dtype = t.dtype, .ndim = t.ndim,
                                .data = t.data, .nbytes = (size_t)t.nbytes};
        memcpy(ts[i].shape, t.shape, sizeof t.shape);
    }
    (void)sum;
    /* The tensors tile the data buffer: inside it, disjoint, adding up to it. */
    FUZZ_CHECK(covered == size - data_start);
    for (size_t i = 0; i < n_md; i++) {
        FUZZ_CHECK(tks_st_metadata_at(f, i, &kv[i].key, &kv[i].value) == 0);
        if (i > 0) FUZZ_CHECK(strcmp(kv[i - 1].key, kv[i].key) < 0);
        FUZZ_CHECK(tks_st_metadata(f, kv[i].key) == kv[i].value);
    }
    /* What was accepted can be written, and reads back the same; writing the
     * copy again gives the same bytes. */
    void *out = NULL, *out2 = NULL;
    size_t out_size = 0, out2_size = 0;
    FUZZ_CHECK(tks_st_serialize(ts, n, kv, n_md, &out, &out_size) == 0);
    tks_st_file *g = NULL;
    FUZZ_CHECK(tks_st_open_mem(out, out_size, "copy", &g) == 0);
    check_same(f, g);
    FUZZ_CHECK(tks_st_serialize(ts, n, kv, n_md, &out2, &out2_size) == 0);
    FUZZ_CHECK(out_size == out2_size && memcmp(out, out2, out_size) == 0);
    tks_st_close(g);
    free(out);
    free(out2);
    free(ts);
    free(kv);
    tks_st_close(f);
    free(buf);
}

#ifdef TKS_ST_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_input(data, size);
    return 0;
}
#else

/* ---------------------------------------------------------------------------
 * Test helpers
 * ------------------------------------------------------------------------- */


static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static char work[PATH_MAX / 2];

static void mkdirs(const char *d) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
    if (system(cmd) != 0) {
        perror(cmd);
        exit(2);
    }
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (!b || fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(b);
        return NULL;
    }
    fclose(f);
    b[sz] = 0; /* so the header can be searched as a string */
    *n = (size_t)sz;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Number of entries of dir whose name contains `part`. */
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

static const char *errmsg(void) { return tks_last_error()->message; }

/* ---------------------------------------------------------------------------
 * Test tensors. Element j of the tensor with seed k is built from the integer
 * v = (7j + 3k) mod 200 - 100, exactly representable in every dtype:
 * floats v/2, signed integers v, unsigned v+100, BOOL v&1, FP8 bytes v+100,
 * C64 (v/2, v/4). tests/test_safetensors.py computes the same values.
 * ------------------------------------------------------------------------- */

typedef struct spec {
    const char *name;
    tks_st_dtype dtype;
    size_t ndim;
    uint64_t shape[TKS_ST_MAX_DIMS];
} spec;

/* The "mixed" set: every dtype, a scalar, empty tensors, 8 dimensions. The
 * seed k of a tensor is its index here. */
static const spec g_mixed[] = {
    {"model.embed_tokens.weight", TKS_ST_F32, 2, {16, 8}},
    {"model.norm.weight", TKS_ST_F32, 1, {8}},
    {"lm_head.weight", TKS_ST_F32, 2, {16, 8}},
    {"scalar", TKS_ST_F32, 0, {0}},
    {"empty", TKS_ST_F32, 1, {0}},
    {"empty2d", TKS_ST_F32, 2, {3, 0}},
    {"bf16.w", TKS_ST_BF16, 2, {4, 3}},
    {"f16.w", TKS_ST_F16, 1, {5}},
    {"f64.w", TKS_ST_F64, 2, {2, 2}},
    {"i64.ids", TKS_ST_I64, 1, {6}},
    {"i32.x", TKS_ST_I32, 4, {1, 1, 1, 3}},
    {"u8.bytes", TKS_ST_U8, 1, {7}},
    {"bool.mask", TKS_ST_BOOL, 1, {3}},
    {"f8.e4m3", TKS_ST_F8_E4M3, 1, {5}},
    {"deep", TKS_ST_F32, 8, {1, 2, 1, 2, 1, 2, 1, 2}},
    {"c64.z", TKS_ST_C64, 1, {2}},
    {"i8.x", TKS_ST_I8, 1, {9}},
    {"u16.x", TKS_ST_U16, 1, {3}},
    {"u32.x", TKS_ST_U32, 1, {2}},
    {"u64.x", TKS_ST_U64, 1, {2}},
    {"i16.x", TKS_ST_I16, 1, {3}},
    {"f8.e5m2", TKS_ST_F8_E5M2, 0, {0}},
    {"f8.e8m0", TKS_ST_F8_E8M0, 1, {2}},
};
#define N_MIXED (sizeof g_mixed / sizeof g_mixed[0])

static const tks_st_kv g_mixed_md[] = {
    {"format", "pt"}, {"tokshard", "test"}, {"note", "\xc3\xbcnicode \xe2\x9c\x93 \"quoted\"\n"},
};

static int in_numpy(tks_st_dtype d) {
    return d != TKS_ST_BF16 && d != TKS_ST_F8_E4M3 && d != TKS_ST_F8_E5M2 && d != TKS_ST_F8_E8M0;
}

static uint64_t numel_of(const spec *s) {
    uint64_t n = 1;
    for (size_t d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

static uint16_t f32_to_f16(float x) { /* exact for the normal, representable values used here */
    uint32_t b;
    memcpy(&b, &x, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
    if ((b & 0x7fffffff) == 0) return sign;
    int e = (int)((b >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)((b >> 13) & 0x3ff));
}

/* Fills a malloc'd buffer with the values of tensor `s` with seed k. */
static void *make_data(const spec *s, unsigned k, size_t *nbytes) {
    uint64_t n = numel_of(s);
    size_t es = tks_st_dtype_size(s->dtype);
    *nbytes = (size_t)(n * es);
    uint8_t *b = malloc(*nbytes ? *nbytes : 1);
    for (uint64_t j = 0; j < n; j++) {
        int v = (int)((7 * j + 3 * k) % 200) - 100;
        uint8_t *p = b + j * es;
        float f = (float)v * 0.5f;
        double dv = v * 0.5;
        uint32_t fb;
        memcpy(&fb, &f, 4);
        switch (s->dtype) {
        case TKS_ST_F32: memcpy(p, &f, 4); break;
        case TKS_ST_F64: memcpy(p, &dv, 8); break;
        case TKS_ST_F16: { uint16_t h = f32_to_f16(f); memcpy(p, &h, 2); } break;
        case TKS_ST_BF16: { uint16_t h = (uint16_t)(fb >> 16); memcpy(p, &h, 2); } break;
        case TKS_ST_I8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); } break;
        case TKS_ST_I16: { int16_t x = (int16_t)v; memcpy(p, &x, 2); } break;
        case TKS_ST_I32: { int32_t x = v; memcpy(p, &x, 4); } break;
        case TKS_ST_I64: { int64_t x = v; memcpy(p, &x, 8); } break;
        case TKS_ST_U8: case TKS_ST_F8_E4M3: case TKS_ST_F8_E5M2: case TKS_ST_F8_E8M0:
            p[0] = (uint8_t)(v + 100); break;
        case TKS_ST_U16: { uint16_t x = (uint16_t)(v + 100); memcpy(p, &x, 2); } break;
        case TKS_ST_U32: { uint32_t x = (uint32_t)(v + 100); memcpy(p, &x, 4); } break;
        case TKS_ST_U64: { uint64_t x = (uint64_t)(v + 100); memcpy(p, &x, 8); } break;
        case TKS_ST_BOOL: p[0] = (uint8_t)(v & 1); break;
        case TKS_ST_C64: { float c[2] = {f, (float)v * 0.25f}; memcpy(p, c, 8); } break;
        default: abort();
        }
    }
    return b;
}

/* Tensors for specs[0..n) (seed = index in g_mixed when from it, else i). */
static tks_st_tensor *make_tensors(const spec *specs, size_t n, unsigned seed0) {
    tks_st_tensor *t = calloc(n ? n : 1, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        t[i].name = specs[i].name;
        t[i].dtype = specs[i].dtype;
        t[i].ndim = specs[i].ndim;
        memcpy(t[i].shape, specs[i].shape, sizeof t[i].shape);
        t[i].data = make_data(&specs[i], seed0 + (unsigned)i, &t[i].nbytes);
    }
    return t;
}

static void free_tensors(tks_st_tensor *t, size_t n) {
    for (size_t i = 0; i < n; i++) free((void *)t[i].data);
    free(t);
}

/* The numpy subset of g_mixed, keeping each tensor's seed. */
static tks_st_tensor *numpy_subset(const tks_st_tensor *all, size_t *n_out) {
    tks_st_tensor *t = calloc(N_MIXED, sizeof *t);
    size_t n = 0;
    for (size_t i = 0; i < N_MIXED; i++)
        if (in_numpy(all[i].dtype)) t[n++] = all[i];
    *n_out = n;
    return t;
}

/* ---------------------------------------------------------------------------
 * Round trip
 * ------------------------------------------------------------------------- */

static void check_tensor_read(const tks_st_file *f, const tks_st_tensor *w, const char *path) {
    tks_st_info t;
    int rc = tks_st_find(f, w->name, &t);
    CHECK(rc == 0, "%s: find %s: %s", path, w->name, errmsg());
    if (rc) return;
    CHECK(strcmp(t.name, w->name) == 0 && t.dtype == w->dtype && t.ndim == w->ndim,
          "%s: %s: dtype %d ndim %zu", path, w->name, (int)t.dtype, t.ndim);
    CHECK(memcmp(t.shape, w->shape, w->ndim * sizeof(uint64_t)) == 0, "%s: %s shape", path, w->name);
    CHECK(t.nbytes == w->nbytes, "%s: %s: %llu bytes, wrote %zu", path, w->name, ULL(t.nbytes),
          w->nbytes);
    CHECK(w->nbytes == 0 || memcmp(t.data, w->data, w->nbytes) == 0, "%s: %s data differ", path,
          w->name);
    /* Our writer aligns every tensor to its element size. */
    CHECK((uintptr_t)t.data % tks_st_dtype_size(t.dtype) == 0, "%s: %s misaligned", path, w->name);
    CHECK(t.offset % tks_st_dtype_size(t.dtype) == 0, "%s: %s at unaligned offset %llu", path,
          w->name, ULL(t.offset));
}

static void test_round_trip(void) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/mixed.safetensors", work);
    tks_st_tensor *t = make_tensors(g_mixed, N_MIXED, 0);
    size_t n_md = sizeof g_mixed_md / sizeof g_mixed_md[0];
    int rc = tks_st_write(path, t, N_MIXED, g_mixed_md, n_md);
    CHECK(rc == 0, "write: %s", errmsg());
    CHECK(count_entries(work, ".tmp-") == 0, "temporary file left behind");

    tks_st_file *f = NULL;
    rc = tks_st_open(path, &f);
    CHECK(rc == 0, "open: %s", errmsg());
    if (rc) {
        free_tensors(t, N_MIXED);
        return;
    }
    CHECK(tks_st_n_tensors(f) == N_MIXED, "%zu tensors", tks_st_n_tensors(f));
    for (size_t i = 0; i < N_MIXED; i++) check_tensor_read(f, &t[i], path);
    /* Iteration is in name order. */
    const char *prev = NULL;
    for (size_t i = 0; i < tks_st_n_tensors(f); i++) {
        tks_st_info a;
        CHECK(tks_st_tensor_at(f, i, &a) == 0, "tensor_at %zu", i);
        if (prev) CHECK(strcmp(prev, a.name) < 0, "order %s then %s", prev, a.name);
        prev = a.name;
    }
    tks_st_info a;
    CHECK(tks_st_tensor_at(f, N_MIXED, &a) == TKS_ERR_ARG, "tensor_at past the end");
    /* Scalars and empty tensors. */
    CHECK(tks_st_find(f, "scalar", &a) == 0 && a.ndim == 0 && a.numel == 1 && a.nbytes == 4,
          "scalar");
    CHECK(tks_st_find(f, "empty2d", &a) == 0 && a.ndim == 2 && a.numel == 0 && a.nbytes == 0,
          "empty2d");
    /* Metadata. */
    CHECK(tks_st_n_metadata(f) == n_md, "%zu metadata entries", tks_st_n_metadata(f));
    for (size_t i = 0; i < n_md; i++) {
        const char *v = tks_st_metadata(f, g_mixed_md[i].key);
        CHECK(v && strcmp(v, g_mixed_md[i].value) == 0, "metadata %s", g_mixed_md[i].key);
    }
    CHECK(tks_st_metadata(f, "absent") == NULL, "absent metadata key");
    const char *k0, *v0, *k1, *v1;
    CHECK(tks_st_metadata_at(f, 0, &k0, &v0) == 0 && tks_st_metadata_at(f, 1, &k1, &v1) == 0 &&
              strcmp(k0, k1) < 0, "metadata order");
    CHECK(tks_st_metadata_at(f, n_md, &k0, &v0) == TKS_ERR_ARG, "metadata_at past the end");

    /* tks_st_read_f32 */
    float emb[16 * 8], s;
    uint64_t shp[2] = {16, 8};
    rc = tks_st_read_f32(f, "model.embed_tokens.weight", shp, 2, emb);
    CHECK(rc == 0 && memcmp(emb, t[0].data, sizeof emb) == 0, "read_f32: %s", errmsg());
    CHECK(tks_st_read_f32(f, "scalar", NULL, 0, &s) == 0 && memcmp(&s, t[3].data, 4) == 0,
          "read_f32 scalar: %s", errmsg());
    CHECK(tks_st_read_f32(f, "empty", (uint64_t[]){0}, 1, NULL) == 0, "read_f32 empty: %s",
          errmsg());
    float guard = 12345.f;
    uint64_t wrong[2] = {128256, 8};
    rc = tks_st_read_f32(f, "model.embed_tokens.weight", wrong, 2, &guard);
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "%s: model.embed_tokens.weight has shape [16, 8], expected "
             "[128256, 8]", path);
    CHECK(rc == TKS_ERR_ARG && strcmp(errmsg(), want) == 0 && guard == 12345.f,
          "shape mismatch: %d %s", rc, errmsg());
    rc = tks_st_read_f32(f, "model.embed_tokens.weight", shp, 1, &guard);
    CHECK(rc == TKS_ERR_ARG && strstr(errmsg(), "has shape [16, 8], expected [16]"),
          "rank mismatch: %s", errmsg());
    rc = tks_st_read_f32(f, "scalar", (uint64_t[]){1}, 1, &guard);
    CHECK(rc == TKS_ERR_ARG && strstr(errmsg(), "scalar has shape [], expected [1]"),
          "scalar vs [1]: %s", errmsg());
    rc = tks_st_read_f32(f, "bf16.w", (uint64_t[]){4, 3}, 2, &guard);
    CHECK(rc == TKS_ERR_ARG && strstr(errmsg(), "bf16.w has dtype BF16, expected F32"),
          "dtype mismatch: %s", errmsg());
    rc = tks_st_read_f32(f, "model.layers.0.nope", shp, 2, &guard);
    CHECK(rc == TKS_ERR_ARG && strstr(errmsg(), "no tensor named model.layers.0.nope") &&
              strstr(errmsg(), path), "missing tensor: %s", errmsg());
    CHECK(tks_st_find(f, "nope", &a) == TKS_ERR_ARG && tks_last_error()->code == TKS_ERR_ARG,
          "find missing");
    CHECK(guard == 12345.f, "dst touched on failure");

    /* The file is exactly what tks_st_serialize produces, and the header is
     * compact JSON padded with spaces to a multiple of 8. */
    size_t fsz = 0;
    uint8_t *bytes = slurp(path, &fsz);
    void *mem = NULL;
    size_t msz = 0;
    CHECK(tks_st_serialize(t, N_MIXED, g_mixed_md, n_md, &mem, &msz) == 0, "serialize: %s",
          errmsg());
    CHECK(bytes && fsz == msz && memcmp(bytes, mem, msz) == 0, "file differs from serialize()");
    if (bytes && fsz >= 8) {
        uint64_t hn = le64(bytes);
        CHECK(hn % 8 == 0 && 8 + hn <= fsz, "header size %llu", ULL(hn));
        CHECK(memcmp(bytes + 8, "{\"__metadata__\":{\"format\":\"pt\",\"note\":", 38) == 0,
              "header starts %.60s", (const char *)bytes + 8);
        CHECK(memchr(bytes + 8, '\n', hn) == NULL, "raw newline in the header");
        size_t end = (size_t)(8 + hn);
        while (end > 8 && bytes[end - 1] == ' ') end--;
        CHECK(bytes[end - 1] == '}' && 8 + hn - end < 8, "padding");
        /* Largest alignment first: the U64 tensor, then I64, F64, C64, F32... */
        CHECK(strstr((const char *)bytes + 8,
                     "\"u64.x\":{\"dtype\":\"U64\",\"shape\":[2],\"data_offsets\":[0,16]}"),
              "first tensor is u64.x at [0,16]");
    }
    free(bytes);
    free(mem);
    tks_st_close(f);
    tks_st_close(NULL);
    free_tensors(t, N_MIXED);
}

/* Hand-computed files: the exact bytes for one small tensor, and for none. */
static void test_golden(void) {
    const float v[6] = {0, 1, 2, 3, 4, 5};
    tks_st_tensor t = {.name = "attn.0", .dtype = TKS_ST_F32, .ndim = 3, .shape = {1, 2, 3},
                       .data = v, .nbytes = sizeof v};
    const char *hdr = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    uint8_t want[256] = {0};
    want[0] = (uint8_t)padded;
    memcpy(want + 8, hdr, hl);
    memset(want + 8 + hl, ' ', padded - hl);
    memcpy(want + 8 + padded, v, sizeof v);
    size_t wn = 8 + padded + sizeof v;
    void *out = NULL;
    size_t on = 0;
    CHECK(tks_st_serialize(&t, 1, NULL, 0, &out, &on) == 0, "serialize: %s", errmsg());
    CHECK(on == wn && memcmp(out, want, wn) == 0, "golden file differs (%zu vs %zu bytes)", on, wn);
    free(out);

    const uint8_t empty[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    CHECK(tks_st_serialize(NULL, 0, NULL, 0, &out, &on) == 0 && on == 16 &&
              memcmp(out, empty, 16) == 0, "empty file");
    tks_st_file *f = NULL;
    CHECK(tks_st_open_mem(out, on, "empty", &f) == 0 && tks_st_n_tensors(f) == 0 &&
              tks_st_n_metadata(f) == 0, "open empty: %s", errmsg());
    tks_st_info a;
    CHECK(tks_st_find(f, "x", &a) == TKS_ERR_ARG, "find in empty file");
    CHECK(tks_st_metadata(f, "x") == NULL, "metadata in empty file");
    tks_st_close(f);
    free(out);

    /* Only metadata. */
    tks_st_kv md = {"k", "v"};
    CHECK(tks_st_serialize(NULL, 0, &md, 1, &out, &on) == 0, "serialize metadata only");
    CHECK(on >= 8 && memcmp((char *)out + 8, "{\"__metadata__\":{\"k\":\"v\"}}", 26) == 0,
          "metadata-only header");
    CHECK(tks_st_open_mem(out, on, "md", &f) == 0 && strcmp(tks_st_metadata(f, "k"), "v") == 0,
          "open metadata only: %s", errmsg());
    tks_st_close(f);
    free(out);
}

/* ---------------------------------------------------------------------------
 * Determinism
 * ------------------------------------------------------------------------- */

static void test_deterministic(void) {
    tks_st_tensor *t = make_tensors(g_mixed, N_MIXED, 0);
    size_t n_md = sizeof g_mixed_md / sizeof g_mixed_md[0];
    void *ref = NULL;
    size_t ref_n = 0;
    CHECK(tks_st_serialize(t, N_MIXED, g_mixed_md, n_md, &ref, &ref_n) == 0, "serialize");
    tks_st_tensor perm[N_MIXED];
    tks_st_kv mdp[3];
    char p1[PATH_MAX], p2[PATH_MAX];
    snprintf(p1, sizeof p1, "%s/det-a.safetensors", work);
    snprintf(p2, sizeof p2, "%s/det-b.safetensors", work);
    for (int r = 0; r < 50; r++) {
        memcpy(perm, t, sizeof perm);
        memcpy(mdp, g_mixed_md, sizeof mdp);
        for (size_t i = N_MIXED - 1; i > 0; i--) { /* Fisher-Yates */
            size_t j = (size_t)(next_rand() % (i + 1));
            tks_st_tensor x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        for (size_t i = n_md - 1; i > 0; i--) {
            size_t j = (size_t)(next_rand() % (i + 1));
            tks_st_kv x = mdp[i];
            mdp[i] = mdp[j];
            mdp[j] = x;
        }
        void *out = NULL;
        size_t on = 0;
        CHECK(tks_st_serialize(perm, N_MIXED, mdp, n_md, &out, &on) == 0, "serialize perm %d", r);
        CHECK(on == ref_n && memcmp(out, ref, on) == 0, "permutation %d gives other bytes", r);
        free(out);
        if (r < 3) {
            CHECK(tks_st_write(r % 2 ? p2 : p1, perm, N_MIXED, mdp, n_md) == 0, "write: %s",
                  errmsg());
        }
    }
    size_t a_n = 0, b_n = 0;
    uint8_t *a = slurp(p1, &a_n), *b = slurp(p2, &b_n);
    CHECK(a && b && a_n == ref_n && b_n == ref_n && memcmp(a, ref, ref_n) == 0 &&
              memcmp(b, ref, ref_n) == 0, "written files differ");
    free(a);
    free(b);
    free(ref);

    /* All-F32 files are in plain name order. */
    const spec f32s[] = {{"b", TKS_ST_F32, 1, {2}}, {"a", TKS_ST_F32, 1, {1}},
                         {"B", TKS_ST_F32, 0, {0}}, {"a.b", TKS_ST_F32, 1, {0}}};
    tks_st_tensor *u = make_tensors(f32s, 4, 0);
    void *out = NULL;
    size_t on = 0;
    CHECK(tks_st_serialize(u, 4, NULL, 0, &out, &on) == 0 && on >= 8, "serialize f32s");
    char h[512] = {0};
    memcpy(h, (const char *)out + 8, le64(out) < sizeof h ? (size_t)le64(out) : sizeof h - 1);
    const char *pB = strstr(h, "\"B\":"), *pa = strstr(h, "\"a\":"), *pab = strstr(h, "\"a.b\":"),
               *pb = strstr(h, "\"b\":");
    CHECK(pB && pa && pab && pb && pB < pa && pa < pab && pab < pb, "name order: %.120s", h);
    free(out);
    free_tensors(u, 4);
    free_tensors(t, N_MIXED);
}

/* ---------------------------------------------------------------------------
 * Writer: argument checks and atomicity
 * ------------------------------------------------------------------------- */

static void expect_write_fail(const char *label, const tks_st_tensor *t, size_t n,
                              const tks_st_kv *md, size_t n_md, const char *substr) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/bad-write.safetensors", work);
    int rc = tks_st_write(path, t, n, md, n_md);
    CHECK(rc == TKS_ERR_ARG, "%s: rc %d (%s)", label, rc, errmsg());
    CHECK(strstr(errmsg(), substr) != NULL, "%s: message \"%s\" lacks \"%s\"", label, errmsg(),
          substr);
    CHECK(!file_exists(path) && count_entries(work, ".tmp-") == 0, "%s: left a file behind", label);
}

static void test_writer_errors(void) {
    float x[6] = {0};
    tks_st_tensor ok = {.name = "w", .dtype = TKS_ST_F32, .ndim = 2, .shape = {2, 3}, .data = x,
                        .nbytes = sizeof x};
    tks_st_tensor t[2] = {ok, ok};
    expect_write_fail("duplicate", t, 2, NULL, 0, "tensor w is given twice");
    t[1].dtype = TKS_ST_I32; /* same name, other dtype: still a duplicate */
    expect_write_fail("duplicate dtypes", t, 2, NULL, 0, "tensor w is given twice");
    t[0] = ok;
    t[0].name = "__metadata__";
    expect_write_fail("reserved", t, 1, NULL, 0, "cannot be called __metadata__");
    t[0] = ok;
    t[0].name = NULL;
    expect_write_fail("no name", t, 1, NULL, 0, "tensor 0 has no name");
    t[0] = ok;
    t[0].nbytes = 20;
    expect_write_fail("nbytes", t, 1, NULL, 0,
                      "tensor w of shape [2, 3] and dtype F32 needs 24 bytes, 20 given");
    t[0] = ok;
    t[0].dtype = TKS_ST_INVALID;
    expect_write_fail("dtype 0", t, 1, NULL, 0, "has no valid dtype");
    t[0].dtype = TKS_ST_N_DTYPES;
    expect_write_fail("dtype N", t, 1, NULL, 0, "has no valid dtype");
    t[0] = ok;
    t[0].ndim = 9;
    expect_write_fail("ndim", t, 1, NULL, 0, "has 9 dimensions, at most 8");
    t[0] = ok;
    t[0].data = NULL;
    expect_write_fail("no data", t, 1, NULL, 0, "has 24 bytes but no data");
    t[0] = ok;
    t[0].shape[0] = (uint64_t)1 << 63;
    t[0].shape[1] = 0;
    t[0].nbytes = 0;
    expect_write_fail("dim too big", t, 1, NULL, 0, "a dimension is over 2^63-1");
    t[0].shape[0] = (uint64_t)1 << 62;
    t[0].shape[1] = 8;
    expect_write_fail("overflow", t, 1, NULL, 0, "overflows 64 bits");
    t[0] = ok;
    t[0].name = "bad\xff utf8";
    expect_write_fail("utf8 name", t, 1, NULL, 0, "is not valid UTF-8");
    tks_st_kv md[2] = {{"k", "v"}, {"k", "w"}};
    expect_write_fail("dup key", &ok, 1, md, 2, "metadata key k is given twice");
    md[1].key = NULL;
    expect_write_fail("null key", &ok, 1, md, 2, "metadata entry 1 has a NULL key");
    md[1] = (tks_st_kv){"v", NULL};
    expect_write_fail("null value", &ok, 1, md, 2, "metadata entry 1 has a NULL value");
    md[1] = (tks_st_kv){"v", "\xc3("};
    expect_write_fail("utf8 value", &ok, 1, md, 2, "not valid UTF-8");
    CHECK(tks_st_write(NULL, &ok, 1, NULL, 0) == TKS_ERR_ARG, "NULL path");
    CHECK(tks_st_write("/x", NULL, 1, NULL, 0) == TKS_ERR_ARG, "NULL tensors");
    void *out = (void *)1;
    size_t on = 1;
    CHECK(tks_st_serialize(t, 1, md, 2, &out, &on) == TKS_ERR_ARG && out == NULL && on == 0,
          "serialize failure output");

    /* A directory that does not exist: I/O error, nothing created. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", work);
    int rc = tks_st_write(path, &ok, 1, NULL, 0);
    CHECK(rc == TKS_ERR_IO && strstr(errmsg(), "cannot create"), "missing dir: %d %s", rc, errmsg());

    /* Overwriting replaces the file as a whole and leaves no temporary. */
    snprintf(path, sizeof path, "%s/over.safetensors", work);
    spit(path, "old contents", 12);
    CHECK(tks_st_write(path, &ok, 1, NULL, 0) == 0, "overwrite: %s", errmsg());
    tks_st_file *f = NULL;
    CHECK(tks_st_open(path, &f) == 0 && tks_st_n_tensors(f) == 1, "reopen: %s", errmsg());
    tks_st_close(f);
    CHECK(count_entries(work, ".tmp-") == 0, "temporary left after overwrite");
    /* A failed write leaves the old file as it was. */
    t[0] = ok;
    t[0].nbytes = 1;
    CHECK(tks_st_write(path, t, 1, NULL, 0) == TKS_ERR_ARG, "bad write over a file");
    CHECK(tks_st_open(path, &f) == 0 && tks_st_n_tensors(f) == 1, "old file kept: %s", errmsg());
    tks_st_close(f);
}

/* ---------------------------------------------------------------------------
 * Reader: corrupt files
 * ------------------------------------------------------------------------- */

/* A corrupt (or odd but valid) file: le64(N) + header + `buf` zero bytes,
 * N = strlen(header) unless `n_override` is set. */
typedef struct bad_case {
    const char *label;
    const char *header;
    uint64_t buf;
    int code;              /* expected result: 0 or TKS_ERR_* */
    const char *substr;    /* expected in the message */
    const char *tensor;    /* the message must name it (or NULL) */
    int n_override;        /* use n_value as N */
    uint64_t n_value;
} bad_case;

#define T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
static const bad_case g_cases[] = {
    /* valid but unusual (other writers) */
    {"ok", "{" T1 "}", 8, 0, NULL, NULL, 0, 0},
    {"ok unpadded, leading space", " {" T1 "}\t\n ", 8, 0, NULL, NULL, 0, 0},
    {"ok empty", "{}", 0, 0, NULL, NULL, 0, 0},
    {"ok zero-length tensors anywhere",
     "{\"z\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[8,8]}," T1
     ",\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 8, 0, NULL, NULL, 0, 0},
    {"ok escaped name", "{\"a\\u00e9\\n\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
     1, 0, NULL, NULL, 0, 0},
    /* header size */
    {"header size 0", "", 8, TKS_ERR_HEADER, "is not valid JSON", NULL, 1, 0},
    {"header size past EOF", "{" T1 "}", 8, TKS_ERR_TRUNCATED, "runs past the end", NULL, 1, 10000},
    {"header size 2^64-1", "{" T1 "}", 8, TKS_ERR_HEADER, "over the 100000000-byte limit", NULL, 1,
     UINT64_MAX},
    {"header size 100000001", "{" T1 "}", 8, TKS_ERR_HEADER, "header size 100000001 is over", NULL,
     1, 100000001},
    {"header size one short", "{" T1 "}", 8, TKS_ERR_HEADER, "not valid JSON", NULL, 1,
     sizeof("{" T1 "}") - 2},
    /* not JSON / not an object */
    {"not json", "not json at all!", 0, TKS_ERR_HEADER, "is not valid JSON", NULL, 0, 0},
    {"json array", "[1,2,3]", 0, TKS_ERR_HEADER, "is not a JSON object", NULL, 0, 0},
    {"json string", "\"{}\"", 0, TKS_ERR_HEADER, "not valid JSON", NULL, 0, 0},
    {"nul padding", "{" T1 "}\0\0", 8, TKS_ERR_HEADER, "not valid JSON", NULL, 1,
     sizeof("{" T1 "}") + 1},
    {"invalid utf8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "not valid JSON", NULL, 0, 0},
    {"nul in name", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "not valid JSON", NULL, 0, 0},
    {"two objects", "{" T1 "}{}", 8, TKS_ERR_HEADER, "not valid JSON", NULL, 0, 0},
    {"duplicate names", "{" T1 "," T1 "}", 8, TKS_ERR_HEADER,
     "appears twice in the header (byte 57 of it: duplicate object key near '\"a\"')", NULL, 0, 0},
    {"duplicate names (escaped)",
     "{" T1 ",\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
     TKS_ERR_HEADER, "appears twice", NULL, 0, 0},
    /* offsets */
    {"overlap", "{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
     TKS_ERR_BOUNDS, "overlap tensor a, which ends at 8", "b", 0, 0},
    {"same range", "{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_BOUNDS, "overlap", NULL, 0, 0},
    {"gap", "{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
     TKS_ERR_BOUNDS, "bytes [8, 12) of the data buffer belong to no tensor", "b", 0, 0},
    {"gap at start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
     TKS_ERR_BOUNDS, "bytes [0, 4) of the data buffer belong to no tensor", "a", 0, 0},
    {"trailing bytes", "{" T1 "}", 9, TKS_ERR_TRUNCATED, "the last 1 bytes of the file belong to no",
     NULL, 0, 0},
    {"bytes but no tensors", "{}", 4, TKS_ERR_TRUNCATED, "belong to no tensor", NULL, 0, 0},
    {"past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
     TKS_ERR_TRUNCATED, "run past the end of the 8-byte data buffer", "a", 0, 0},
    {"begin > end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
     TKS_ERR_HEADER, "end before they begin", "a", 0, 0},
    {"offsets len 3", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8,
     TKS_ERR_HEADER, "data_offsets is not [BEGIN, END]", "a", 0, 0},
    {"negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
     TKS_ERR_HEADER, "data_offsets is not", "a", 0, 0},
    {"float offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8,
     TKS_ERR_HEADER, "data_offsets is not", "a", 0, 0},
    {"offset over int64", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
     "18446744073709551624]}}", 8, TKS_ERR_HEADER, "not valid JSON", NULL, 0, 0},
    /* element count, shape, overflow */
    {"wrong count", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
     TKS_ERR_HEADER, "shape [2, 3] of F32 is 24 bytes but data_offsets [0, 20] span 20", "w", 0, 0},
    {"count for dtype", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape [2] of BF16 is 4 bytes", "w", 0, 0},
    {"scalar needs one element", "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}",
     0, TKS_ERR_HEADER, "shape [] of F32 is 4 bytes but data_offsets [0, 0] span 0", "s", 0, 0},
    {"overflow 2^32*2^32", "{\"h\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
     "\"data_offsets\":[0,0]}}", 0, TKS_ERR_HEADER, "overflows 64 bits", "h", 0, 0},
    {"overflow times dtype", "{\"h\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
     "\"data_offsets\":[0,0]}}", 0, TKS_ERR_HEADER, "overflows 64 bits", "h", 0, 0},
    {"overflow int64 max", "{\"h\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,3],"
     "\"data_offsets\":[0,0]}}", 0, TKS_ERR_HEADER, "overflows 64 bits", "h", 0, 0},
    {"overflow before a zero", "{\"h\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],"
     "\"data_offsets\":[0,0]}}", 0, TKS_ERR_HEADER, "overflows 64 bits", "h", 0, 0},
    {"huge but no overflow", "{\"h\":{\"dtype\":\"F32\",\"shape\":[2305843009213693951],"
     "\"data_offsets\":[0,9223372036854775804]}}", 0, TKS_ERR_TRUNCATED, "run past the end", "h",
     0, 0},
    {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape[0] is not a non-negative integer", "a", 0, 0},
    {"float dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape[0] is not a non-negative integer", "a", 0, 0},
    {"string dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape[1] is not", "a", 0, 0},
    {"shape not array", "{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape is not an array", "a", 0, 0},
    {"9 dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "shape has 9 dimensions, at most 8", "a", 0, 0},
    /* dtype and fields */
    {"unknown dtype", "{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "unknown or unsupported dtype \"F31\"", "a", 0, 0},
    {"sub-byte dtype", "{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
     TKS_ERR_HEADER, "unknown or unsupported dtype \"F4\"", "a", 0, 0},
    {"lowercase dtype", "{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "unsupported dtype \"f32\"", "a", 0, 0},
    {"dtype not string", "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TKS_ERR_HEADER, "dtype is not a string", "a", 0, 0},
    {"missing dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TKS_ERR_HEADER,
     "the entry has no dtype", "a", 0, 0},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, TKS_ERR_HEADER,
     "the entry has no shape", "a", 0, 0},
    {"missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, TKS_ERR_HEADER,
     "the entry has no data_offsets", "a", 0, 0},
    {"unknown field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
     TKS_ERR_HEADER, "unknown field \"x\"", "a", 0, 0},
    {"entry not object", "{\"a\":[1,2]}", 0, TKS_ERR_HEADER, "entry is not a JSON object", "a", 0,
     0},
    /* metadata */
    {"metadata not object", "{\"__metadata__\":\"x\"," T1 "}", 8, TKS_ERR_HEADER,
     "__metadata__ is not a JSON object of strings", NULL, 0, 0},
    {"metadata null", "{\"__metadata__\":null}", 0, TKS_ERR_HEADER, "__metadata__ is not", NULL, 0,
     0},
    {"metadata int value", "{\"__metadata__\":{\"k\":1}," T1 "}", 8, TKS_ERR_HEADER,
     "__metadata__ entry k is not a string", NULL, 0, 0},
    {"metadata nested", "{\"__metadata__\":{\"k\":{}}}", 0, TKS_ERR_HEADER,
     "__metadata__ entry k is not a string", NULL, 0, 0},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, TKS_ERR_HEADER,
     "appears twice", NULL, 0, 0},
    {"metadata key twice", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, TKS_ERR_HEADER,
     "appears twice", NULL, 0, 0},
};
#define N_CASES (sizeof g_cases / sizeof g_cases[0])

/* The bytes of a case into a malloc'd buffer. */
static uint8_t *case_bytes(const bad_case *c, size_t *n) {
    size_t hl = strlen(c->header);
    if (c->n_override && c->n_value > hl && c->n_value <= hl + 8)
        hl = (size_t)c->n_value; /* N reaches into zero bytes after the text */
    *n = 8 + hl + (size_t)c->buf;
    uint8_t *b = calloc(1, *n);
    uint64_t N = c->n_override ? c->n_value : hl;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(N >> (8 * i));
    memcpy(b + 8, c->header, strlen(c->header));
    return b;
}

static void test_corrupt_cases(void) {
    for (size_t i = 0; i < N_CASES; i++) {
        const bad_case *c = &g_cases[i];
        size_t n;
        uint8_t *b = case_bytes(c, &n);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/case-%02zu.safetensors", work, i);
        spit(path, b, n);
        tks_st_file *f = (tks_st_file *)b;
        int rc = tks_st_open(path, &f);
        CHECK(rc == c->code, "%s: rc %d, expected %d (%s)", c->label, rc, c->code,
              rc ? errmsg() : "accepted");
        if (rc) {
            const char *m = errmsg();
            CHECK(f == NULL && tks_last_error()->code == rc, "%s: output or code", c->label);
            CHECK(strncmp(m, path, strlen(path)) == 0 && strcmp(tks_last_error()->file, path) == 0,
                  "%s: message does not name the file: %s", c->label, m);
            CHECK(!c->substr || strstr(m, c->substr), "%s: message \"%s\" lacks \"%s\"", c->label,
                  m, c->substr);
            if (c->tensor) {
                char t[64];
                snprintf(t, sizeof t, "tensor %s", c->tensor);
                CHECK(strstr(m, t) != NULL, "%s: message \"%s\" does not name %s", c->label, m, t);
            }
        } else {
            CHECK(f != NULL, "%s: no handle", c->label);
        }
        tks_st_close(f);
        /* The in-memory opener agrees, and the fuzz check holds. */
        rc = tks_st_open_mem(b, n, "mem", &f);
        CHECK(rc == c->code, "%s (mem): rc %d", c->label, rc);
        tks_st_close(f);
        check_input(b, n);
        free(b);
    }
    /* The file side: missing, a directory, empty. */
    tks_st_file *f = NULL;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/missing.safetensors", work);
    CHECK(tks_st_open(path, &f) == TKS_ERR_IO && strstr(errmsg(), "cannot open") && !f, "missing");
    CHECK(tks_st_open(work, &f) == TKS_ERR_IO && strstr(errmsg(), "not a regular file"), "dir");
    CHECK(tks_st_open(NULL, &f) == TKS_ERR_ARG && tks_st_open(path, NULL) == TKS_ERR_ARG, "NULL");
    CHECK(tks_st_open_mem(NULL, 8, NULL, &f) == TKS_ERR_ARG, "NULL data");
}

/* Every truncation of a valid file is refused, by file and in memory. */
static void test_truncations(void) {
    const spec s[] = {{"w", TKS_ST_F32, 2, {2, 3}}, {"b", TKS_ST_BF16, 1, {3}},
                      {"s", TKS_ST_F32, 0, {0}}, {"e", TKS_ST_F32, 1, {0}}};
    tks_st_tensor *t = make_tensors(s, 4, 0);
    tks_st_kv md = {"format", "pt"};
    void *full = NULL;
    size_t n = 0;
    CHECK(tks_st_serialize(t, 4, &md, 1, &full, &n) == 0, "serialize");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/trunc.safetensors", work);
    uint64_t hn = le64(full);
    size_t refused = 0;
    for (size_t len = 0; len < n; len++) {
        spit(path, full, len);
        tks_st_file *f = NULL;
        int rc = tks_st_open(path, &f);
        int want = len < 8 || len < 8 + hn ? -1 : TKS_ERR_TRUNCATED;
        CHECK(rc < 0 && f == NULL, "truncated to %zu accepted", len);
        if (want == TKS_ERR_TRUNCATED)
            CHECK(rc == TKS_ERR_TRUNCATED && strstr(errmsg(), "truncated?"),
                  "truncated to %zu: %d %s", len, rc, errmsg());
        if (len < 8)
            CHECK(rc == TKS_ERR_TRUNCATED && strstr(errmsg(), "too short"), "len %zu: %s", len,
                  errmsg());
        if (len >= 8 && len < 8 + hn)
            CHECK(rc == TKS_ERR_TRUNCATED && strstr(errmsg(), "the header"), "len %zu: %s", len,
                  errmsg());
        refused += rc < 0;
        check_input(full, len);
    }
    CHECK(refused == n, "%zu of %zu truncations refused", refused, n);
    spit(path, full, n);
    tks_st_file *f = NULL;
    CHECK(tks_st_open(path, &f) == 0, "full file: %s", errmsg());
    tks_st_close(f);
    free(full);
    free_tensors(t, 4);
}

/* ---------------------------------------------------------------------------
 * Random mutations
 * ------------------------------------------------------------------------- */

/* Applies one random mutation to b (n bytes, capacity cap), updating *n.
 * (One next_rand() per full expression: the sequence must not depend on the
 * compiler's order of evaluation.) */
static void mutate(uint8_t *b, size_t *n, size_t cap) {
    static const uint8_t interesting[] = {'{', '}', '[', ']', '"', ',', ':', '0', '1', '9', '-',
                                          ' ', '\\', 'e', '.', 0, 0xff, 0x80};
    uint64_t hn = *n >= 8 ? le64(b) : 0;
    size_t hend = (size_t)(8 + hn <= *n ? 8 + hn : *n); /* end of the header region */
    switch (next_rand() % 8) {
    case 0: /* flip a bit anywhere */
        if (*n) {
            size_t at = (size_t)(next_rand() % *n);
            b[at] ^= (uint8_t)(1u << (next_rand() % 8));
        }
        break;
    case 1: /* an interesting byte in the header */
        if (hend > 8) {
            size_t at = 8 + (size_t)(next_rand() % (hend - 8));
            b[at] = interesting[next_rand() % sizeof interesting];
        }
        break;
    case 2: /* change a digit of a number in the header */
        if (hend > 8) {
            size_t at = 8 + (size_t)(next_rand() % (hend - 8));
            for (size_t k = at; k < hend; k++)
                if (b[k] >= '0' && b[k] <= '9') {
                    b[k] = (uint8_t)('0' + next_rand() % 10);
                    break;
                }
        }
        break;
    case 3: /* truncate */
        if (*n) *n = (size_t)(next_rand() % *n);
        break;
    case 4: /* insert or delete a header byte, keeping N right */
        if (hend > 8 && *n >= 8) {
            size_t at = 8 + (size_t)(next_rand() % (hend - 8));
            if (next_rand() % 2 && *n < cap) {
                memmove(b + at + 1, b + at, *n - at);
                b[at] = interesting[next_rand() % sizeof interesting];
                (*n)++;
                hn++;
            } else {
                memmove(b + at, b + at + 1, *n - at - 1);
                (*n)--;
                hn--;
            }
            for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hn >> (8 * i));
        }
        break;
    case 5: /* a new header size */
        if (*n >= 8) {
            uint64_t v[] = {0, hn - 1, hn + 1, hn + 8, *n - 8, *n - 7, UINT64_MAX, 100000000,
                            (uint64_t)1 << 63, next_rand()};
            uint64_t x = v[next_rand() % (sizeof v / sizeof v[0])];
            for (int i = 0; i < 8; i++) b[i] = (uint8_t)(x >> (8 * i));
        }
        break;
    case 6: /* copy a run of header bytes over another place in it */
        if (hend > 9) {
            size_t len = 1 + (size_t)(next_rand() % 16);
            size_t from = 8 + (size_t)(next_rand() % (hend - 8)), to = 8 + (size_t)(next_rand() % (hend - 8));
            if (from + len > hend) len = hend - from;
            if (to + len > hend) len = hend - to;
            memmove(b + to, b + from, len);
        }
        break;
    default: /* grow or shrink the data buffer */
        if (next_rand() % 2 && *n < cap) b[(*n)++] = (uint8_t)next_rand();
        else if (*n > hend) (*n)--;
        break;
    }
}

static void test_mutations(int iterations) {
    tks_st_tensor *t = make_tensors(g_mixed, N_MIXED, 0);
    void *ref = NULL;
    size_t ref_n = 0;
    CHECK(tks_st_serialize(t, N_MIXED, g_mixed_md, 3, &ref, &ref_n) == 0, "serialize");
    const spec small[] = {{"w", TKS_ST_F32, 2, {2, 3}}, {"s", TKS_ST_BF16, 0, {0}}};
    tks_st_tensor *u = make_tensors(small, 2, 0);
    void *ref2 = NULL;
    size_t ref2_n = 0;
    CHECK(tks_st_serialize(u, 2, NULL, 0, &ref2, &ref2_n) == 0, "serialize small");
    size_t cap = ref_n + 64;
    uint8_t *b = malloc(cap);
    g_accepted = g_refused = 0;
    for (int it = 0; it < iterations; it++) {
        const void *src = it % 2 ? ref : ref2;
        size_t n = it % 2 ? ref_n : ref2_n;
        memcpy(b, src, n);
        int k = 1 + (int)(next_rand() % 4);
        for (int m = 0; m < k; m++) mutate(b, &n, cap);
        check_input(b, n);
    }
    printf("mutations: %d inputs, %zu accepted, %zu refused\n", iterations, g_accepted, g_refused);
    CHECK(g_accepted + g_refused == (size_t)iterations, "count");
    CHECK(g_accepted > (size_t)iterations / 100 && g_refused > (size_t)iterations / 2,
          "mutations should be mostly refused, some accepted: %zu/%zu", g_accepted, g_refused);
    free(b);
    free(ref);
    free(ref2);
    free_tensors(t, N_MIXED);
    free_tensors(u, 2);
}

/* Random headers that are nearly right: tensors laid out end to end, then
 * some offsets, counts or the buffer size nudged, so that the checks behind
 * the JSON parse (counts, gaps, overlaps, the end of the buffer) are reached
 * far more often than byte mutations reach them. */
static void test_random_headers(int iterations) {
    static const struct { const char *name; unsigned size; } dt[] = {
        {"F32", 4}, {"BF16", 2}, {"U8", 1}, {"I64", 8}, {"BOOL", 1}, {"C64", 8}, {"F33", 4}};
    size_t seen[4] = {0}; /* accepted, TKS_ERR_HEADER, _TRUNCATED, _BOUNDS */
    char *h = malloc(8192);
    for (int it = 0; it < iterations; it++) {
        size_t k = (size_t)snprintf(h, 8192, "{");
        int nt = (int)(next_rand() % 6);
        int64_t off = 0;
        for (int i = 0; i < nt; i++) {
            size_t n_dt = sizeof dt / sizeof dt[0] - (next_rand() % 8 != 0); /* F33 rarely */
            unsigned d = (unsigned)(next_rand() % n_dt);
            int nd = (int)(next_rand() % 4);
            int64_t numel = 1;
            k += (size_t)snprintf(h + k, 8192 - k, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[",
                                  i ? "," : "", (int)(next_rand() % 8), dt[d].name);
            for (int j = 0; j < nd; j++) {
                int x = (int)(next_rand() % 4);
                numel *= x;
                k += (size_t)snprintf(h + k, 8192 - k, "%s%d", j ? "," : "", x);
            }
            int64_t b = off, e = off + numel * dt[d].size;
            off = e;
            if (next_rand() % 5 == 0) { /* moved: a gap or an overlap */
                int64_t s = (int64_t)(next_rand() % 9) - 4;
                b += s;
                e += s;
            }
            if (next_rand() % 8 == 0) e += (int64_t)(next_rand() % 9) - 4; /* wrong count */
            if (next_rand() % 10 == 0) off = b; /* next tensor overlaps this one */
            k += (size_t)snprintf(h + k, 8192 - k, "],\"data_offsets\":[%lld,%lld]}",
                                  (long long)b, (long long)e);
        }
        k += (size_t)snprintf(h + k, 8192 - k, "}");
        int64_t buf = off;
        if (next_rand() % 6 == 0) buf += (int64_t)(next_rand() % 9) - 4;
        if (buf < 0) buf = 0;
        size_t n = 8 + k + (size_t)buf;
        uint8_t *bytes = calloc(1, n);
        for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)((uint64_t)k >> (8 * i));
        memcpy(bytes + 8, h, k);
        size_t before = g_accepted;
        check_input(bytes, n);
        int code = tks_last_error()->code;
        if (g_accepted > before) seen[0]++;
        else if (code == TKS_ERR_HEADER) seen[1]++;
        else if (code == TKS_ERR_TRUNCATED) seen[2]++;
        else if (code == TKS_ERR_BOUNDS) seen[3]++;
        free(bytes);
    }
    free(h);
    printf("random headers: %d inputs, %zu accepted, refused: %zu header, %zu truncated, "
           "%zu bounds\n", iterations, seen[0], seen[1], seen[2], seen[3]);
    for (int i = 0; i < 4; i++)
        CHECK(seen[i] > (size_t)iterations / 50, "outcome %d reached only %zu times", i, seen[i]);
}

/* ---------------------------------------------------------------------------
 * Modes for the Python test and the corpus
 * ------------------------------------------------------------------------- */

/* tks_st_find_nonfinite on every floating dtype: the first NaN or infinity
 * by its element index and value, finite extremes passed over, integers
 * never looked at; the data unaligned, as a mapping may give it. */
static tks_st_info nonfinite_info(tks_st_dtype d, const void *bytes, size_t nbytes, unsigned char *buf) {
    memcpy(buf + 1, bytes, nbytes); /* one byte off: unaligned on purpose */
    size_t esz = tks_st_dtype_size(d);
    return (tks_st_info){.name = "t", .dtype = d, .ndim = 1, .shape = {nbytes / esz}, .numel = nbytes / esz,
                       .nbytes = nbytes, .data = buf + 1};
}
static void test_nonfinite(void) {
    unsigned char buf[128];
    uint64_t at = 99;
    double v = 0;
    float f32[] = {1.0f, -0.0f, 3.4028235e38f, 1e-45f, -5.0f, NAN, INFINITY};
    tks_st_info t = nonfinite_info(TKS_ST_F32, f32, sizeof f32, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 5 && isnan(v), "F32 NaN at 5: %llu %g", ULL(at), v);
    f32[5] = 2.0f, f32[6] = -INFINITY;
    t = nonfinite_info(TKS_ST_F32, f32, sizeof f32, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 6 && v < 0 && isinf(v), "F32 -inf at 6: %llu %g",
          ULL(at), v);
    t = nonfinite_info(TKS_ST_F32, f32, 6 * sizeof *f32, buf);
    CHECK(tks_st_find_nonfinite(&t, NULL, NULL) == 0, "F32: the largest and smallest finite values pass");
    const uint16_t bf16[] = {0x3F80, 0x7F7F, 0xFF80, 0x7FC1}, f16[] = {0x7BFF, 0xFBFF, 0x7E01, 0x7C00};
    t = nonfinite_info(TKS_ST_BF16, bf16, sizeof bf16, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && isinf(v) && v < 0, "BF16 -inf at 2: %llu %g",
          ULL(at), v);
    t = nonfinite_info(TKS_ST_F16, f16, sizeof f16, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && isnan(v), "F16 NaN at 2: %llu %g", ULL(at), v);
    const double f64[] = {1e308, -1e-308, INFINITY};
    t = nonfinite_info(TKS_ST_F64, f64, sizeof f64, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && v > 0 && isinf(v), "F64 inf at 2: %llu %g",
          ULL(at), v);
    const float c64[] = {1, 2, 3, NAN}; /* the imaginary part of complex element 1 */
    t = nonfinite_info(TKS_ST_C64, c64, sizeof c64, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 1 && isnan(v), "C64 NaN in element 1: %llu", ULL(at));
    const uint8_t e5m2[] = {0x7B, 0xFB, 0x7C}, e4m3[] = {0x7E, 0xFE, 0xFF}, e8m0[] = {0xFE, 0x00, 0xFF};
    t = nonfinite_info(TKS_ST_F8_E5M2, e5m2, sizeof e5m2, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && isinf(v), "F8_E5M2 inf at 2: %llu", ULL(at));
    t = nonfinite_info(TKS_ST_F8_E4M3, e4m3, sizeof e4m3, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && isnan(v), "F8_E4M3 NaN at 2: %llu", ULL(at));
    t = nonfinite_info(TKS_ST_F8_E8M0, e8m0, sizeof e8m0, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 1 && at == 2 && isnan(v), "F8_E8M0 NaN at 2: %llu", ULL(at));
    const uint32_t i32[] = {0x7F800000u, 0xFFFFFFFFu};
    t = nonfinite_info(TKS_ST_I32, i32, sizeof i32, buf);
    CHECK(tks_st_find_nonfinite(&t, &at, &v) == 0, "integers are never NaN");
    CHECK(tks_st_find_nonfinite(NULL, &at, &v) == 0, "NULL");
}

static int write_files(const char *dir) {
    char path[PATH_MAX];
    tks_st_tensor *t = make_tensors(g_mixed, N_MIXED, 0);
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    int rc = tks_st_write(path, t, N_MIXED, g_mixed_md, 3);
    size_t nn = 0;
    tks_st_tensor *np = numpy_subset(t, &nn);
    tks_st_kv md = {"format", "pt"};
    snprintf(path, sizeof path, "%s/numpy.safetensors", dir);
    if (!rc) rc = tks_st_write(path, np, nn, &md, 1);
    if (rc) fprintf(stderr, "test_safetensors --write: %s\n", errmsg());
    free(np);
    free_tensors(t, N_MIXED);
    return rc ? 1 : 0;
}

static void print_json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

/* One JSON line per tensor ({"name", "dtype", "shape", "offset", "hex"}),
 * then one with the metadata. */
static int dump(const char *path) {
    tks_st_file *f = NULL;
    if (tks_st_open(path, &f) != 0) {
        fprintf(stderr, "%s\n", errmsg());
        return 1;
    }
    for (size_t i = 0; i < tks_st_n_tensors(f); i++) {
        tks_st_info t;
        tks_st_tensor_at(f, i, &t);
        printf("{\"name\":");
        print_json_string(t.name);
        printf(",\"dtype\":\"%s\",\"shape\":[", tks_st_dtype_name(t.dtype));
        for (size_t d = 0; d < t.ndim; d++) printf("%s%llu", d ? "," : "", ULL(t.shape[d]));
        printf("],\"offset\":%llu,\"hex\":\"", ULL(t.offset));
        for (uint64_t b = 0; b < t.nbytes; b++) printf("%02x", ((const uint8_t *)t.data)[b]);
        printf("\"}\n");
    }
    printf("{\"__metadata__\":{");
    for (size_t i = 0; i < tks_st_n_metadata(f); i++) {
        const char *k, *v;
        tks_st_metadata_at(f, i, &k, &v);
        if (i) putchar(',');
        print_json_string(k);
        putchar(':');
        print_json_string(v);
    }
    printf("}}\n");
    tks_st_close(f);
    return 0;
}

static int make_corpus(const char *dir) {
    char path[PATH_MAX];
    tks_st_tensor *t = make_tensors(g_mixed, N_MIXED, 0);
    void *b = NULL;
    size_t n = 0;
    int rc = tks_st_serialize(t, N_MIXED, g_mixed_md, 3, &b, &n);
    snprintf(path, sizeof path, "%s/valid-mixed", dir);
    if (!rc) spit(path, b, n);
    free(b);
    free_tensors(t, N_MIXED);
    for (size_t i = 0; i < N_CASES && !rc; i++) {
        uint8_t *c = case_bytes(&g_cases[i], &n);
        snprintf(path, sizeof path, "%s/case-%02zu", dir, i);
        spit(path, c, n);
        free(c);
    }
    return rc ? 1 : 0;
}

static size_t g_replayed;

static int replay(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        struct dirent **names;
        int k = scandir(path, &names, NULL, alphasort);
        if (k < 0) return -1;
        int rc = 0;
        for (int i = 0; i < k; i++) {
            char sub[PATH_MAX];
            if (names[i]->d_name[0] != '.' &&
                snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name) < (int)sizeof sub)
                rc |= replay(sub);
            free(names[i]);
        }
        free(names);
        return rc;
    }
    size_t n = 0;
    uint8_t *b = slurp(path, &n);
    if (!b) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return -1;
    }
    check_input(b, n);
    free(b);
    g_replayed++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--replay") == 0) {
        int rc = 0;
        for (int i = 2; i < argc; i++) rc |= replay(argv[i]);
        printf("replayed %zu inputs: %zu accepted, %zu refused\n", g_replayed, g_accepted, g_refused);
        return rc || g_replayed == 0 ? 1 : 0;
    }
    if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_files(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) return dump(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--make-corpus") == 0) return make_corpus(argv[2]);
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: test_safetensors WORKDIR | --replay PATH... | --write DIR | "
                        "--dump FILE | --make-corpus DIR\n");
        return 2;
    }
    snprintf(work, sizeof work, "%s", argv[1]);
    mkdirs(work);

    test_golden();
    test_round_trip();
    test_deterministic();
    test_writer_errors();
    test_corrupt_cases();
    test_truncations();
    test_nonfinite();
    test_mutations(10000);
    test_random_headers(5000);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all safetensors checks passed\n");
    return 0;
}
#endif /* TKS_ST_LIBFUZZER */
