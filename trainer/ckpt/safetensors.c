/*
 * safetensors.c - safetensors reader and writer. Format and API:
 * safetensors.h; the format is that of the huggingface/safetensors README,
 * with the choices its reference implementation (safetensors/src/tensor.rs)
 * makes where the README is silent: the 100 MB header limit, the writer's
 * tensor order and 8-byte header padding, and the coverage rule for offsets.
 *
 * The header is parsed and produced with jansson. jansson keeps object keys in
 * insertion order when dumping (since 2.8), which the writer relies on for a
 * deterministic header.
 */
#define _GNU_SOURCE
#include "trainer/ckpt/safetensors.h"
#include "common/tks_bits.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader hands out the bytes as they are"
#endif

#define NONE TKS_NONE
#define ULL(x) ((unsigned long long)(x))

/* ---------------------------------------------------------------------------
 * Dtypes
 * ------------------------------------------------------------------------- */

/* rank: position in the reference implementation's Dtype enum, which is in
 * increasing alignment order; the writer sorts by descending rank. */
static const struct {
    const char *name;
    unsigned size;
    unsigned rank;
} g_dtypes[TKS_ST_N_DTYPES] = {
    [TKS_ST_BOOL] = {"BOOL", 1, 0},       [TKS_ST_U8] = {"U8", 1, 1},
    [TKS_ST_I8] = {"I8", 1, 2},           [TKS_ST_F8_E5M2] = {"F8_E5M2", 1, 3},
    [TKS_ST_F8_E4M3] = {"F8_E4M3", 1, 4}, [TKS_ST_F8_E8M0] = {"F8_E8M0", 1, 5},
    [TKS_ST_I16] = {"I16", 2, 6},         [TKS_ST_U16] = {"U16", 2, 7},
    [TKS_ST_F16] = {"F16", 2, 8},         [TKS_ST_BF16] = {"BF16", 2, 9},
    [TKS_ST_I32] = {"I32", 4, 10},        [TKS_ST_U32] = {"U32", 4, 11},
    [TKS_ST_F32] = {"F32", 4, 12},        [TKS_ST_C64] = {"C64", 8, 13},
    [TKS_ST_F64] = {"F64", 8, 14},        [TKS_ST_I64] = {"I64", 8, 15},
    [TKS_ST_U64] = {"U64", 8, 16},
};

static int dtype_ok(tks_st_dtype d) { return d > TKS_ST_INVALID && d < TKS_ST_N_DTYPES; }

const char *tks_st_dtype_name(tks_st_dtype dtype) {
    return dtype_ok(dtype) ? g_dtypes[dtype].name : NULL;
}

size_t tks_st_dtype_size(tks_st_dtype dtype) {
    return dtype_ok(dtype) ? g_dtypes[dtype].size : 0;
}

static tks_st_dtype dtype_from_name(const char *s) {
    for (int d = 1; d < TKS_ST_N_DTYPES; d++)
        if (strcmp(s, g_dtypes[d].name) == 0) return (tks_st_dtype)d;
    return TKS_ST_INVALID;
}

/* Product of the shape times the element size; -1 on 64-bit overflow. The
 * product is taken left to right, as the reference does, so [2^40, 2^40, 0]
 * overflows although it has no elements. */
static int shape_bytes(const uint64_t *shape, size_t ndim, uint64_t elem, uint64_t *numel,
                       uint64_t *nbytes) {
    uint64_t p = 1;
    for (size_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(p, shape[i], &p)) return -1;
    *numel = p;
    if (__builtin_mul_overflow(p, elem, nbytes)) return -1;
    return 0;
}

/* "[a, b, c]" into buf (cap >= 2). */
static const char *fmt_shape(char *buf, size_t cap, const uint64_t *shape, size_t ndim) {
    size_t k = 0;
    buf[k++] = '[';
    for (size_t i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", i ? ", " : "", ULL(shape[i]));
    if (k < cap - 1) {
        buf[k++] = ']';
        buf[k] = 0;
    } else {
        buf[cap - 1] = 0;
    }
    return buf;
}

enum { SHAPE_STR = TKS_ST_MAX_DIMS * 22 + 4 };

/* ---------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------- */

static int cmp_name(const void *a, const void *b) {
    const tks_st_tensor *x = *(const tks_st_tensor *const *)a, *y = *(const tks_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* The reference order: descending alignment rank, then name. */
static int cmp_layout(const void *a, const void *b) {
    const tks_st_tensor *x = *(const tks_st_tensor *const *)a, *y = *(const tks_st_tensor *const *)b;
    unsigned rx = g_dtypes[x->dtype].rank, ry = g_dtypes[y->dtype].rank;
    if (rx != ry) return rx > ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_key(const void *a, const void *b) {
    const tks_st_kv *x = *(const tks_st_kv *const *)a, *y = *(const tks_st_kv *const *)b;
    return strcmp(x->key, y->key);
}

/* A prepared file: the header bytes (padded) and the tensors in file order. */
typedef struct st_plan {
    char *header;                  /* hlen bytes, malloc'd */
    size_t hlen;                   /* multiple of 8 */
    const tks_st_tensor **order;   /* n, file order */
    uint64_t data_size;            /* bytes of the data buffer */
} st_plan;

static void plan_free(st_plan *p) {
    free(p->header);
    free(p->order);
    memset(p, 0, sizeof *p);
}

static int check_tensor(const char *what, const tks_st_tensor *t, size_t i) {
    if (!t->name)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: tensor %zu has no name", what, i);
    if (strcmp(t->name, "__metadata__") == 0)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                        "%s: a tensor cannot be called __metadata__ (the key is reserved for "
                        "metadata)", what);
    if (!dtype_ok(t->dtype))
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: tensor %s has no valid dtype (%d)", what,
                        t->name, (int)t->dtype);
    if (t->ndim > TKS_ST_MAX_DIMS)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                        "%s: tensor %s has %zu dimensions, at most %d are supported", what, t->name,
                        t->ndim, TKS_ST_MAX_DIMS);
    char s[SHAPE_STR];
    for (size_t d = 0; d < t->ndim; d++)
        if (t->shape[d] > (uint64_t)INT64_MAX)
            return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                            "%s: tensor %s has shape %s: a dimension is over 2^63-1", what,
                            t->name, fmt_shape(s, sizeof s, t->shape, t->ndim));
    uint64_t numel, nbytes;
    if (shape_bytes(t->shape, t->ndim, g_dtypes[t->dtype].size, &numel, &nbytes) != 0)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                        "%s: tensor %s has shape %s: its size in bytes overflows 64 bits", what,
                        t->name, fmt_shape(s, sizeof s, t->shape, t->ndim));
    if (nbytes != (uint64_t)t->nbytes)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                        "%s: tensor %s of shape %s and dtype %s needs %llu bytes, %zu given", what,
                        t->name, fmt_shape(s, sizeof s, t->shape, t->ndim), g_dtypes[t->dtype].name,
                        ULL(nbytes), t->nbytes);
    if (t->nbytes > 0 && !t->data)
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: tensor %s has %zu bytes but no data",
                        what, t->name, t->nbytes);
    return 0;
}

/* Builds the JSON header. Returns 0 or an error; *out owned by the caller. */
static int build_header(const char *what, const tks_st_tensor **order, size_t n,
                        const tks_st_kv *md, size_t n_md, char **out) {
    *out = NULL;
    json_t *root = json_object();
    const tks_st_kv **keys = n_md ? malloc(n_md * sizeof *keys) : NULL;
    int rc = 0;
    if (!root || (n_md && !keys)) {
        rc = tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory building the header", what);
        goto done;
    }
    if (n_md) {
        for (size_t i = 0; i < n_md; i++) {
            if (!md[i].key || !md[i].value) {
                rc = tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: metadata entry %zu has a NULL %s",
                              what, i, md[i].key ? "value" : "key");
                goto done;
            }
            keys[i] = &md[i];
        }
        qsort(keys, n_md, sizeof *keys, cmp_key);
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0) {
            rc = tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory building the header",
                          what);
            goto done;
        }
        for (size_t i = 0; i < n_md; i++) {
            if (i > 0 && strcmp(keys[i - 1]->key, keys[i]->key) == 0) {
                rc = tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: metadata key %s is given twice",
                              what, keys[i]->key);
                goto done;
            }
            json_t *v = json_string(keys[i]->value);
            if (!v || json_object_set_new(m, keys[i]->key, v) != 0) {
                rc = tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                              "%s: metadata entry %s: key or value is not valid UTF-8", what,
                              keys[i]->key);
                goto done;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const tks_st_tensor *t = order[i];
        json_t *shape = json_array(), *offs = json_array();
        json_t *e = json_object();
        int bad = !shape || !offs || !e;
        for (size_t d = 0; !bad && d < t->ndim; d++)
            bad = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0;
        if (!bad)
            bad = json_array_append_new(offs, json_integer((json_int_t)off)) != 0 ||
                  json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes))) != 0 ||
                  json_object_set_new(e, "dtype", json_string(g_dtypes[t->dtype].name)) != 0;
        if (!bad) {
            bad = json_object_set_new(e, "shape", shape) != 0;
            shape = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(e, "data_offsets", offs) != 0;
            offs = NULL;
        }
        json_decref(shape);
        json_decref(offs);
        if (bad) {
            json_decref(e);
            rc = tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory building the header",
                          what);
            goto done;
        }
        if (json_object_set_new(root, t->name, e) != 0) {
            rc = tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: tensor name %s is not valid UTF-8",
                          what, t->name);
            goto done;
        }
        off += t->nbytes;
    }
    *out = json_dumps(root, JSON_COMPACT);
    if (!*out)
        rc = tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory building the header", what);
done:
    free(keys);
    json_decref(root);
    return rc;
}

/* Validates the arguments and lays the file out. */
static int plan(const char *what, const tks_st_tensor *tensors, size_t n, const tks_st_kv *md,
                size_t n_md, st_plan *p) {
    memset(p, 0, sizeof *p);
    if ((n && !tensors) || (n_md && !md))
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: NULL tensor or metadata array", what);
    p->order = malloc((n ? n : 1) * sizeof *p->order);
    if (!p->order) return tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory", what);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = check_tensor(what, &tensors[i], i);
        if (rc) {
            plan_free(p);
            return rc;
        }
        if (__builtin_add_overflow(total, (uint64_t)tensors[i].nbytes, &total) ||
            total > (uint64_t)INT64_MAX) {
            plan_free(p);
            return tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: the tensors add up to over 2^63 bytes",
                            what);
        }
        p->order[i] = &tensors[i];
    }
    qsort(p->order, n, sizeof *p->order, cmp_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(p->order[i - 1]->name, p->order[i]->name) == 0) {
            int rc = tks_fail(TKS_ERR_ARG, what, NONE, NONE, "%s: tensor %s is given twice", what,
                              p->order[i]->name);
            plan_free(p);
            return rc;
        }
    qsort(p->order, n, sizeof *p->order, cmp_layout);
    p->data_size = total;

    char *json;
    int rc = build_header(what, p->order, n, md, n_md, &json);
    if (rc) {
        plan_free(p);
        return rc;
    }
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    if (padded > TKS_ST_MAX_HEADER) {
        free(json);
        plan_free(p);
        return tks_fail(TKS_ERR_ARG, what, NONE, NONE,
                        "%s: the header would be %zu bytes, over the %u-byte limit of readers", what,
                        padded, TKS_ST_MAX_HEADER);
    }
    p->header = malloc(padded ? padded : 1);
    if (!p->header) {
        free(json);
        plan_free(p);
        return tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory", what);
    }
    memcpy(p->header, json, len);
    memset(p->header + len, ' ', padded - len);
    p->hlen = padded;
    free(json);
    return 0;
}


int tks_st_serialize(const tks_st_tensor *tensors, size_t n, const tks_st_kv *metadata,
                     size_t n_metadata, void **out, size_t *out_size) {
    if (!out || !out_size) return tks_fail(TKS_ERR_ARG, NULL, NONE, NONE, "tks_st_serialize: NULL output");
    *out = NULL;
    *out_size = 0;
    const char *what = "safetensors (memory)";
    st_plan p;
    int rc = plan(what, tensors, n, metadata, n_metadata, &p);
    if (rc) return rc;
    uint64_t size = 8 + (uint64_t)p.hlen + p.data_size;
    uint8_t *b = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
    if (!b) {
        plan_free(&p);
        return tks_fail(TKS_ERR_NOMEM, what, NONE, NONE, "%s: out of memory for %llu bytes", what,
                        ULL(size));
    }
    tks_put_le64(b, p.hlen);
    memcpy(b + 8, p.header, p.hlen);
    size_t at = 8 + p.hlen;
    for (size_t i = 0; i < n; i++) {
        if (p.order[i]->nbytes) memcpy(b + at, p.order[i]->data, p.order[i]->nbytes);
        at += p.order[i]->nbytes;
    }
    plan_free(&p);
    *out = b;
    *out_size = (size_t)size;
    return 0;
}

int tks_st_write(const char *path, const tks_st_tensor *tensors, size_t n,
                 const tks_st_kv *metadata, size_t n_metadata) {
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, NONE, NONE, "tks_st_write: NULL path");
    st_plan p;
    int rc = plan(path, tensors, n, metadata, n_metadata, &p);
    if (rc) return rc;

    /* [8-byte header size][header][tensors in file order], written crash-safely */
    uint8_t len[8];
    tks_put_le64(len, p.hlen);
    tks_piece *pc = malloc((n + 2) * sizeof *pc);
    if (!pc) {
        plan_free(&p);
        return tks_fail(TKS_ERR_NOMEM, path, NONE, NONE, "out of memory writing %s", path);
    }
    pc[0] = (tks_piece){len, 8};
    pc[1] = (tks_piece){p.header, p.hlen};
    for (size_t i = 0; i < n; i++) pc[2 + i] = (tks_piece){p.order[i]->data, p.order[i]->nbytes};
    rc = tks_write_file_pieces(path, pc, n + 2);
    free(pc);
    plan_free(&p);
    return rc;
}

/* ---- streaming ------------------------------------------------------------- */

struct tks_st_stream {
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    int fd;
    size_t n;
    uint64_t *off;            /* file offset of tensor i's bytes */
    size_t *nbytes;
    unsigned char *done;
};

int tks_st_stream_open(const char *path, const tks_st_tensor *tensors, size_t n,
                       const tks_st_kv *metadata, size_t n_metadata, tks_st_stream **out) {
    *out = NULL;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, NONE, NONE, "tks_st_stream_open: NULL path");
    static const char dummy = 0;
    tks_st_tensor *t = calloc(n ? n : 1, sizeof *t);
    tks_st_stream *s = calloc(1, sizeof *s);
    if (s) {
        s->fd = -1;
        s->off = calloc(n ? n : 1, sizeof *s->off);
        s->nbytes = calloc(n ? n : 1, sizeof *s->nbytes);
        s->done = calloc(n ? n : 1, 1);
    }
    if (!t || !s || !s->off || !s->nbytes || !s->done) {
        free(t);
        tks_st_stream_abort(s);
        return tks_fail(TKS_ERR_NOMEM, path, NONE, NONE, "out of memory writing %s", path);
    }
    for (size_t i = 0; i < n; i++) {
        t[i] = tensors[i];
        t[i].data = &dummy; /* the plan only needs the layout */
    }
    st_plan p;
    int rc = plan(path, t, n, metadata, n_metadata, &p);
    if (rc) {
        free(t);
        tks_st_stream_abort(s);
        return rc;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    s->n = n;
    uint64_t at = 8 + p.hlen;
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)(p.order[k] - t);
        s->off[i] = at;
        s->nbytes[i] = t[i].nbytes;
        at += t[i].nbytes;
    }
    uint8_t len[8];
    tks_put_le64(len, p.hlen);
    rc = tks_create_unique(AT_FDCWD, path, 0644, s->tmp, sizeof s->tmp, &s->fd);
    if (rc) s->tmp[0] = 0; /* nothing made: nothing to remove */
    if (!rc) rc = tks_pwrite_all(s->fd, len, 8, 0, s->tmp);
    if (!rc) rc = tks_pwrite_all(s->fd, p.header, p.hlen, 8, s->tmp);
    plan_free(&p);
    free(t);
    if (rc) {
        tks_st_stream_abort(s);
        return rc;
    }
    *out = s;
    return 0;
}

int tks_st_stream_put(tks_st_stream *s, size_t i, const void *data) {
    if (i >= s->n || s->done[i])
        return tks_fail(TKS_ERR_ARG, s->path, NONE, NONE, "%s: tensor %zu put twice or unknown", s->path, i);
    int rc = s->nbytes[i] ? tks_pwrite_all(s->fd, data, s->nbytes[i], s->off[i], s->tmp) : 0;
    s->done[i] = !rc;
    return rc;
}

int tks_st_stream_commit(tks_st_stream *s) {
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++)
        if (!s->done[i]) rc = tks_fail(TKS_ERR_ARG, s->path, NONE, NONE, "%s: tensor %zu was never written", s->path, i);
    if (!rc && fsync(s->fd) != 0)
        rc = tks_fail(tks_write_errno_code(errno), s->tmp, NONE, NONE, "cannot fsync %s: %s", s->tmp, strerror(errno));
    if (close(s->fd) != 0 && !rc)
        rc = tks_fail(tks_write_errno_code(errno), s->tmp, NONE, NONE, "cannot close %s: %s", s->tmp, strerror(errno));
    s->fd = -1;
    if (!rc && rename(s->tmp, s->path) != 0)
        rc = tks_fail(TKS_ERR_IO, s->path, NONE, NONE, "cannot rename %s to %s: %s", s->tmp, s->path, strerror(errno));
    if (!rc) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s", s->path);
        char *sl = strrchr(d, '/');
        rc = tks_fsync_dir(sl ? (sl == d ? "/" : (*sl = 0, d)) : ".");
        s->tmp[0] = 0; /* published: nothing to remove */
    }
    tks_st_stream_abort(s);
    return rc;
}

void tks_st_stream_abort(tks_st_stream *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->tmp[0]) unlink(s->tmp);
    free(s->off);
    free(s->nbytes);
    free(s->done);
    free(s);
}

/* ---------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------- */

typedef struct st_entry {
    const char *name;              /* key in root */
    tks_st_dtype dtype;
    size_t ndim;
    uint64_t shape[TKS_ST_MAX_DIMS];
    uint64_t numel, begin, end;    /* offsets relative to the data buffer */
} st_entry;

typedef struct st_kv {
    const char *key, *value;       /* strings in root */
} st_kv;

struct tks_st_file {
    char *path;                    /* for messages */
    const uint8_t *base;           /* the whole file */
    size_t size;
    int mapped;                    /* base is our mapping */
    uint64_t data_start;           /* 8 + N */
    json_t *root;                  /* owns every name, key and value */
    st_entry *t;                   /* n, sorted by name */
    size_t n;
    st_kv *md;                     /* n_md, sorted by key */
    size_t n_md;
};


static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int cmp_entry_off(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const st_kv *)a)->key, ((const st_kv *)b)->key);
}

/* A non-negative JSON integer into *v; -1 otherwise. */
static int get_uint(const json_t *x, uint64_t *v) {
    if (!json_is_integer(x) || json_integer_value(x) < 0) return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

/* Validates one tensor entry (not yet its place among the others). */
static int parse_entry(const tks_st_file *f, const char *name, json_t *v, uint64_t buf_size,
                       st_entry *e) {
    const char *p = f->path;
    memset(e, 0, sizeof *e);
    e->name = name;
    if (!json_is_object(v))
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: tensor %s: the header entry is not a JSON object", p, name);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0)
            return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                            "%s: tensor %s: unknown field \"%s\" (expected dtype, shape, "
                            "data_offsets)", p, name, k);
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *of = json_object_get(v, "data_offsets");
    if (!dt || !sh || !of)
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE, "%s: tensor %s: the entry has no %s", p, name,
                        !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!json_is_string(dt))
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE, "%s: tensor %s: dtype is not a string", p,
                        name);
    e->dtype = dtype_from_name(json_string_value(dt));
    if (!e->dtype)
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: tensor %s: unknown or unsupported dtype \"%.40s\"", p, name,
                        json_string_value(dt));
    if (!json_is_array(sh))
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE, "%s: tensor %s: shape is not an array", p,
                        name);
    e->ndim = json_array_size(sh);
    if (e->ndim > TKS_ST_MAX_DIMS)
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: tensor %s: shape has %zu dimensions, at most %d are supported", p, name,
                        e->ndim, TKS_ST_MAX_DIMS);
    for (size_t d = 0; d < e->ndim; d++)
        if (get_uint(json_array_get(sh, d), &e->shape[d]) != 0)
            return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                            "%s: tensor %s: shape[%zu] is not a non-negative integer", p, name, d);
    if (!json_is_array(of) || json_array_size(of) != 2 ||
        get_uint(json_array_get(of, 0), &e->begin) != 0 ||
        get_uint(json_array_get(of, 1), &e->end) != 0)
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: tensor %s: data_offsets is not [BEGIN, END] with two non-negative "
                        "integers", p, name);
    if (e->begin > e->end)
        return tks_fail(TKS_ERR_HEADER, p, NONE, f->data_start + e->begin,
                        "%s: tensor %s: data_offsets [%llu, %llu] end before they begin", p, name,
                        ULL(e->begin), ULL(e->end));
    char s[SHAPE_STR];
    uint64_t nbytes;
    if (shape_bytes(e->shape, e->ndim, g_dtypes[e->dtype].size, &e->numel, &nbytes) != 0)
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: tensor %s: shape %s of %s overflows 64 bits (element count times "
                        "element size)", p, name, fmt_shape(s, sizeof s, e->shape, e->ndim),
                        g_dtypes[e->dtype].name);
    if (nbytes != e->end - e->begin)
        return tks_fail(TKS_ERR_HEADER, p, NONE, f->data_start + e->begin,
                        "%s: tensor %s: shape %s of %s is %llu bytes but data_offsets [%llu, %llu] "
                        "span %llu", p, name, fmt_shape(s, sizeof s, e->shape, e->ndim),
                        g_dtypes[e->dtype].name, ULL(nbytes), ULL(e->begin), ULL(e->end),
                        ULL(e->end - e->begin));
    if (e->end > buf_size)
        return tks_fail(TKS_ERR_TRUNCATED, p, NONE, f->data_start + e->begin,
                        "%s: tensor %s: data_offsets [%llu, %llu] run past the end of the "
                        "%llu-byte data buffer (the file has %zu bytes, the tensor needs %llu; "
                        "truncated?)", p, name, ULL(e->begin), ULL(e->end), ULL(buf_size), f->size,
                        ULL(f->data_start + e->end));
    return 0;
}

static int parse_metadata(tks_st_file *f, json_t *m) {
    const char *p = f->path;
    if (!json_is_object(m))
        return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                        "%s: __metadata__ is not a JSON object of strings", p);
    f->n_md = json_object_size(m);
    f->md = malloc((f->n_md ? f->n_md : 1) * sizeof *f->md);
    if (!f->md) return tks_fail(TKS_ERR_NOMEM, p, NONE, NONE, "%s: out of memory", p);
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return tks_fail(TKS_ERR_HEADER, p, NONE, NONE,
                            "%s: __metadata__ entry %s is not a string", p, k);
        f->md[i].key = k;
        f->md[i].value = json_string_value(v);
        i++;
    }
    qsort(f->md, f->n_md, sizeof *f->md, cmp_kv);
    return 0;
}

/* Checks that the tensors, by offset, tile the data buffer [0, buf_size). */
static int check_coverage(const tks_st_file *f, uint64_t buf_size) {
    const char *p = f->path;
    const st_entry **by = malloc((f->n ? f->n : 1) * sizeof *by);
    if (!by) return tks_fail(TKS_ERR_NOMEM, p, NONE, NONE, "%s: out of memory", p);
    for (size_t i = 0; i < f->n; i++) by[i] = &f->t[i];
    qsort(by, f->n, sizeof *by, cmp_entry_off);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < f->n && !rc; i++) {
        const st_entry *e = by[i];
        if (e->begin > at)
            rc = tks_fail(TKS_ERR_BOUNDS, p, NONE, f->data_start + at,
                          "%s: bytes [%llu, %llu) of the data buffer belong to no tensor (a gap "
                          "before tensor %s, which starts at %llu)", p, ULL(at), ULL(e->begin),
                          e->name, ULL(e->begin));
        else if (e->begin < at)
            rc = tks_fail(TKS_ERR_BOUNDS, p, NONE, f->data_start + e->begin,
                          "%s: tensor %s: data_offsets [%llu, %llu] overlap tensor %s, which ends "
                          "at %llu", p, e->name, ULL(e->begin), ULL(e->end), by[i - 1]->name,
                          ULL(at));
        at = e->end;
    }
    if (!rc && at != buf_size)
        rc = tks_fail(TKS_ERR_TRUNCATED, p, NONE, f->data_start + at,
                      "%s: the tensors end at byte %llu of the %llu-byte data buffer: the last "
                      "%llu bytes of the file belong to no tensor", p, ULL(at), ULL(buf_size),
                      ULL(buf_size - at));
    free(by);
    return rc;
}

static int parse(tks_st_file *f) {
    const char *p = f->path;
    if (f->size < 8)
        return tks_fail(TKS_ERR_TRUNCATED, p, NONE, 0,
                        "%s: %zu bytes is too short for a safetensors file (the first 8 bytes hold "
                        "the header size)", p, f->size);
    uint64_t n = tks_le64(f->base);
    if (n > TKS_ST_MAX_HEADER)
        return tks_fail(TKS_ERR_HEADER, p, NONE, 0,
                        "%s: header size %llu is over the %u-byte limit; not a safetensors file?",
                        p, ULL(n), TKS_ST_MAX_HEADER);
    if (n > f->size - 8)
        return tks_fail(TKS_ERR_TRUNCATED, p, NONE, 0,
                        "%s: the header (%llu bytes) runs past the end of the %zu-byte file "
                        "(truncated?)", p, ULL(n), f->size);
    f->data_start = 8 + n;
    uint64_t buf_size = f->size - f->data_start;

    json_error_t jerr;
    f->root = json_loadb((const char *)f->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root) {
        uint64_t at = 8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0);
#if JANSSON_VERSION_HEX >= 0x020b00
        if (json_error_code(&jerr) == json_error_duplicate_key)
            return tks_fail(TKS_ERR_HEADER, p, NONE, at,
                            "%s: a tensor name, metadata key or __metadata__ appears twice in the "
                            "header (byte %d of it: %s)", p, jerr.position, jerr.text);
#endif
        return tks_fail(TKS_ERR_HEADER, p, NONE, at,
                        "%s: the header is not valid JSON (byte %d of it: %s)", p, jerr.position,
                        jerr.text);
    }
    if (!json_is_object(f->root))
        return tks_fail(TKS_ERR_HEADER, p, NONE, 8, "%s: the header is not a JSON object", p);

    size_t total = json_object_size(f->root);
    f->t = malloc((total ? total : 1) * sizeof *f->t);
    if (!f->t) return tks_fail(TKS_ERR_NOMEM, p, NONE, NONE, "%s: out of memory", p);
    const char *k;
    json_t *v;
    json_object_foreach(f->root, k, v) {
        int rc = strcmp(k, "__metadata__") == 0 ? parse_metadata(f, v)
                                                : parse_entry(f, k, v, buf_size, &f->t[f->n++]);
        if (rc) return rc;
    }
    qsort(f->t, f->n, sizeof *f->t, cmp_entry_name);
    return check_coverage(f, buf_size);
}

void tks_st_close(tks_st_file *f) {
    if (!f) return;
    if (f->mapped) tks_unmap(f->base, f->size);
    json_decref(f->root);
    free(f->t);
    free(f->md);
    free(f->path);
    free(f);
}

static int open_common(tks_st_file *f, tks_st_file **out) {
    int rc = parse(f);
    if (rc) {
        tks_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

static tks_st_file *new_file(const char *name) {
    tks_st_file *f = calloc(1, sizeof *f);
    if (f && !(f->path = strdup(name))) {
        free(f);
        f = NULL;
    }
    return f;
}

int tks_st_open_mem(const void *data, size_t size, const char *name, tks_st_file **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, name, NONE, NONE, "tks_st_open_mem: NULL output");
    *out = NULL;
    if (!name) name = "<memory>";
    if (!data && size)
        return tks_fail(TKS_ERR_ARG, name, NONE, NONE, "%s: NULL data of %zu bytes", name, size);
    tks_st_file *f = new_file(name);
    if (!f) return tks_fail(TKS_ERR_NOMEM, name, NONE, NONE, "%s: out of memory", name);
    f->base = data;
    f->size = size;
    return open_common(f, out);
}

int tks_st_open(const char *path, tks_st_file **out) {
    if (!out || !path) return tks_fail(TKS_ERR_ARG, path, NONE, NONE, "tks_st_open: NULL argument");
    *out = NULL;
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "safetensors file", &base, &size);
    if (rc) return rc;
    tks_st_file *f = new_file(path);
    if (!f) {
        tks_unmap(base, size);
        return tks_fail(TKS_ERR_NOMEM, path, NONE, NONE, "%s: out of memory", path);
    }
    f->size = size;
    if (size) {
        f->base = base;
        f->mapped = 1;
    } else { /* refused by parse(), with the reason */
        static const uint8_t none[8];
        f->base = none;
    }
    return open_common(f, out);
}

size_t tks_st_n_tensors(const tks_st_file *f) { return f ? f->n : 0; }

static void fill_info(const tks_st_file *f, const st_entry *e, tks_st_info *info) {
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->dtype = e->dtype;
    info->ndim = e->ndim;
    memcpy(info->shape, e->shape, sizeof info->shape);
    info->numel = e->numel;
    info->nbytes = e->end - e->begin;
    info->offset = f->data_start + e->begin;
    info->data = f->base + info->offset;
}

int tks_st_tensor_at(const tks_st_file *f, size_t i, tks_st_info *info) {
    if (!f || !info) return tks_fail(TKS_ERR_ARG, NULL, NONE, NONE, "tks_st_tensor_at: NULL argument");
    if (i >= f->n)
        return tks_fail(TKS_ERR_ARG, f->path, NONE, NONE, "%s: no tensor %zu (the file has %zu)",
                        f->path, i, f->n);
    fill_info(f, &f->t[i], info);
    return 0;
}

int tks_st_find(const tks_st_file *f, const char *name, tks_st_info *info) {
    if (!f || !name || !info)
        return tks_fail(TKS_ERR_ARG, f ? f->path : NULL, NONE, NONE, "tks_st_find: NULL argument");
    st_entry key = {.name = name};
    const st_entry *e = bsearch(&key, f->t, f->n, sizeof *f->t, cmp_entry_name);
    if (!e)
        return tks_fail(TKS_ERR_ARG, f->path, NONE, NONE, "%s: no tensor named %s", f->path, name);
    fill_info(f, e, info);
    return 0;
}

int tks_st_read_f32(const tks_st_file *f, const char *name, const uint64_t *expected_shape,
                    size_t ndim, float *dst) {
    if (!f || !name || (ndim && !expected_shape))
        return tks_fail(TKS_ERR_ARG, f ? f->path : NULL, NONE, NONE,
                        "tks_st_read_f32: NULL argument");
    tks_st_info t;
    int rc = tks_st_find(f, name, &t);
    if (rc) return rc;
    if (t.dtype != TKS_ST_F32)
        return tks_fail(TKS_ERR_ARG, f->path, NONE, t.offset, "%s: %s has dtype %s, expected F32",
                        f->path, name, g_dtypes[t.dtype].name);
    int same = ndim == t.ndim;
    for (size_t d = 0; same && d < ndim; d++) same = expected_shape[d] == t.shape[d];
    if (!same) {
        char a[SHAPE_STR], b[SHAPE_STR];
        if (ndim > TKS_ST_MAX_DIMS) ndim = TKS_ST_MAX_DIMS; /* for the message only */
        return tks_fail(TKS_ERR_ARG, f->path, NONE, t.offset, "%s: %s has shape %s, expected %s",
                        f->path, name, fmt_shape(a, sizeof a, t.shape, t.ndim),
                        fmt_shape(b, sizeof b, expected_shape, ndim));
    }
    if (t.nbytes && !dst)
        return tks_fail(TKS_ERR_ARG, f->path, NONE, NONE, "tks_st_read_f32: NULL destination");
    if (t.nbytes) memcpy(dst, t.data, (size_t)t.nbytes);
    return 0;
}

/* The first element of n, each `sz` bytes at p (little-endian, maybe
 * unaligned), whose bits under `expo` are all ones; n when there is none.
 * One loop per size, so that each load is a fixed-size one. */
#define FIRST_ALL_ONES(T)                                                                          \
    for (uint64_t i = 0; i < n; i++) {                                                             \
        T b;                                                                                       \
        memcpy(&b, p + i * sizeof b, sizeof b);                                                    \
        if ((b & (T)expo) == (T)expo) return i;                                                    \
    }                                                                                              \
    return n
static uint64_t first_all_ones(const unsigned char *p, uint64_t n, size_t sz, uint64_t expo) {
    switch (sz) {
    case 8: FIRST_ALL_ONES(uint64_t);
    case 4: FIRST_ALL_ONES(uint32_t);
    case 2: FIRST_ALL_ONES(uint16_t);
    default: FIRST_ALL_ONES(uint8_t);
    }
}
#undef FIRST_ALL_ONES

/* The value a non-finite element stands for: NAN, INFINITY or -INFINITY
 * (sign = the element's top bit, mant = its mantissa bits are nonzero). */
static double nonfinite_value(int sign, int mant) {
    return mant ? (double)NAN : sign ? -(double)INFINITY : (double)INFINITY;
}

int tks_st_find_nonfinite(const tks_st_info *info, uint64_t *index, double *value) {
    if (!info || !info->data) return 0;
    /* per dtype: element bytes, the exponent field's mask (all ones: not
     * finite) and the mantissa's (nonzero: NaN, else an infinity); F8_E4M3
     * and F8_E8M0 have no infinity, only the NaN patterns */
    uint64_t expo, mant;
    size_t sz;
    switch (info->dtype) {
    case TKS_ST_F64: sz = 8, expo = 0x7FF0000000000000ull, mant = 0x000FFFFFFFFFFFFFull; break;
    case TKS_ST_F32: case TKS_ST_C64: sz = 4, expo = 0x7F800000u, mant = 0x007FFFFFu; break;
    case TKS_ST_F16: sz = 2, expo = 0x7C00u, mant = 0x03FFu; break;
    case TKS_ST_BF16: sz = 2, expo = 0x7F80u, mant = 0x007Fu; break;
    case TKS_ST_F8_E5M2: sz = 1, expo = 0x7Cu, mant = 0x03u; break;
    case TKS_ST_F8_E4M3: sz = 1, expo = 0x7Fu, mant = 0x7Fu; break; /* S.1111.111 is NaN */
    case TKS_ST_F8_E8M0: sz = 1, expo = 0xFFu, mant = 0xFFu; break;  /* 0xFF is NaN */
    default: return 0;
    }
    const unsigned char *p = info->data;
    uint64_t n = info->nbytes / sz, i = first_all_ones(p, n, sz, expo);
    if (i == n) return 0;
    uint64_t b = 0;
    memcpy(&b, p + i * sz, sz); /* the host is little-endian (checked at compile time) */
    if (index) *index = info->dtype == TKS_ST_C64 ? i / 2 : i;
    if (value) *value = nonfinite_value((int)(b >> (8 * sz - 1)) & 1, (b & mant) != 0);
    return 1;
    return 0;
}

size_t tks_st_n_metadata(const tks_st_file *f) { return f ? f->n_md : 0; }

const char *tks_st_metadata(const tks_st_file *f, const char *key) {
    if (!f || !key || !f->n_md) return NULL; /* f->md is NULL without metadata */
    st_kv k = {.key = key};
    const st_kv *e = bsearch(&k, f->md, f->n_md, sizeof *f->md, cmp_kv);
    return e ? e->value : NULL;
}

int tks_st_metadata_at(const tks_st_file *f, size_t i, const char **key, const char **value) {
    if (!f || !key || !value)
        return tks_fail(TKS_ERR_ARG, NULL, NONE, NONE, "tks_st_metadata_at: NULL argument");
    if (i >= f->n_md)
        return tks_fail(TKS_ERR_ARG, f->path, NONE, NONE,
                        "%s: no metadata entry %zu (the file has %zu)", f->path, i, f->n_md);
    *key = f->md[i].key;
    *value = f->md[i].value;
    return 0;
}
