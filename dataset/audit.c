/* audit.c - verify a dataset or a shard completely and report every problem.
 *
 * The small structural checks (header, size, padding, checksum table) run per
 * shard first. Everything that is O(bytes) then runs as tasks of one OpenMP
 * loop: each shard's document index (hash and monotonicity, one task per
 * shard, queued first because it is the longest) and every (shard, chunk)
 * pair (hash and id range). A task reads its bytes once, with pread into its
 * thread's 256 KiB buffer, and hashes and scans each 32 KiB block of it while
 * the block is in L1/L2. Results are gathered in order, so the report is the
 * same whatever the thread count; every problem carries an order key, so the
 * reports of the ranks of a distributed audit merge into that same report.
 *
 * XXH3 goes through libxxhash's runtime-dispatched entry points where the
 * library has them (x86-64: AVX2 or AVX-512 by CPU); its plain entry points
 * are the SSE2 build, 20% slower per pass here (docs/BENCHMARKS.md). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#ifdef TKS_XXH_DISPATCH
/* XXH3 calls go to libxxhash's runtime-dispatched entry points (AVX2 or
 * AVX-512 when the CPU has them); the plain ones are the SSE2 build. */
#include <xxh_x86dispatch.h>
#endif

#include "dataset/internal.h"

typedef struct ashard {
    char path[PATH_MAX];
    int fd;                 /* for pread of the O(bytes) sections, or -1: read the mapping */
    const uint8_t *base;
    size_t size;
    tks_shard_header h;
    int header_ok;          /* header decoded and canonical */
    int size_ok;            /* size matches: the index may be read */
    int body_ok;            /* size and table good: chunks may be read and compared */
    int table_ok;           /* checksum table matches table_xxh3 */
    int index_ok;           /* index monotonicity good (set after the parallel tasks) */
    uint64_t index_expect;  /* the table's checksum of the index (when table_ok) */
    uint64_t index_xxh3;    /* XXH3-64 of the index (index task) */
    uint64_t index_bad;     /* first bad index entry, or TKS_NONE (index task) */
    uint64_t index_bad_value; /* index[index_bad] (index task) */
    int index_read_errno;   /* the index task could not read the index: errno, or -1 */
    uint64_t prov_xxh3;     /* version 2: XXH3-64 of the provenance section (index task) */
    int prov_read_errno;    /* the index task could not read that section: errno, or -1 */
    size_t first_task;      /* task number of chunk 0 */
    atomic_size_t tasks_left; /* the task that brings it to 0 may unmap the shard */
    const uint64_t *index;
    const uint64_t *table;
    uint64_t shard_no;      /* position in the manifest, or 0 for a lone shard */
} ashard;

/* Where problems go. A problem's order key is (phase, shard position, number
 * in this report): 2, 32 and 30 bits. Phases: 0 dataset-level checks, 1 a
 * shard's structure, 2 its index, 3 its chunks. A whole audit emits problems
 * in key order, so the reports of a distributed audit merge by sorting. */
typedef struct sink {
    tks_audit_report *r;
    size_t cap;     /* < 2^30 */
    uint64_t base;  /* KEY(phase, shard) */
} sink;
#define KEY(phase, shard) ((uint64_t)(phase) << 62 | (uint64_t)(shard) << 30)
#define MAX_CAP (((size_t)1 << 30) - 1)

typedef struct task_result {
    int hash_bad;
    int read_errno;         /* pread failed: errno, or -1 for a short read */
    uint32_t min_id, max_id;
    uint64_t n_bad, first_bad;      /* ids >= vocab_size: count, token offset of first */
    uint32_t bad_id;
    uint64_t n_bad_model, first_bad_model;
    uint32_t bad_model_id;
    uint64_t n_inside, first_inside; /* ids no text produces, inside documents */
    uint32_t inside_id;
} task_result;

/* The ids no text produces (the manifest's reserved ranges), for the check
 * that none is inside a document: at a document's first token only the BOS,
 * at its last only the EOS, elsewhere none. */
typedef struct reserved_set {
    uint32_t lo, hi;        /* every reserved id is in [lo, hi] */
    int contiguous;         /* and every id of [lo, hi] is reserved */
    uint64_t *bits;         /* bit (id - lo): reserved */
    uint32_t bos, eos;
} reserved_set;

static int is_reserved(const reserved_set *rs, uint32_t id) {
    return id >= rs->lo && id <= rs->hi && (rs->bits[(id - rs->lo) >> 6] >> ((id - rs->lo) & 63) & 1);
}

static void problem(sink *pk, int code, uint64_t shard, uint64_t chunk,
                    uint64_t tok, uint64_t byte, uint64_t doc, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

static void problem(sink *pk, int code, uint64_t shard, uint64_t chunk,
                    uint64_t tok, uint64_t byte, uint64_t doc, const char *file, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tks_audit_report_vadd(pk->r, pk->cap, pk->base | pk->r->n_problems, code, file, shard, chunk,
                          tok, byte, doc, fmt, ap);
    va_end(ap);
}

/* Document holding token t (requires a good index). */
static uint64_t doc_of(const ashard *s, uint64_t t) {
    if (!s->index_ok) return TKS_NONE;
    uint64_t lo = 0, hi = s->h.n_docs;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (s->index[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
}

/* Structural checks of one shard; fills header_ok/body_ok/index_ok. */
static void check_structure(ashard *s, sink *pk) {
    uint64_t sn = s->shard_no;
    int rc = tks_header_decode(s->base, s->size, s->path, &s->h);
    if (rc) {
        problem(pk, rc, sn, TKS_NONE, TKS_NONE, tks_last_error()->offset, TKS_NONE, s->path,
                "%s", tks_last_error()->message);
        return;
    }
    s->header_ok = 1;
    if (s->size != s->h.file_size) {
        problem(pk, TKS_ERR_TRUNCATED, sn, TKS_NONE, TKS_NONE, s->size, TKS_NONE, s->path,
                "file is %zu bytes, header says %llu: %s", s->size,
                (unsigned long long)s->h.file_size,
                s->size < s->h.file_size ? "truncated" : "extra bytes at the end");
        return;
    }
    s->size_ok = 1;
    uint64_t pad = tks__padding_nonzero(s->base, &s->h);
    if (pad != TKS_NONE)
        problem(pk, TKS_ERR_PADDING, sn, TKS_NONE, TKS_NONE, pad, TKS_NONE, s->path,
                "padding byte at offset %llu is not zero", (unsigned long long)pad);
    s->index = (const uint64_t *)(s->base + s->h.index_offset);
    s->table = (const uint64_t *)(s->base + s->h.table_offset);
    uint64_t tx = XXH3_64bits(s->table, s->h.table_bytes);
    s->table_ok = tx == s->h.table_xxh3;
    if (!s->table_ok)
        problem(pk, TKS_ERR_CHECKSUM, sn, TKS_NONE, TKS_NONE, s->h.table_offset, TKS_NONE,
                s->path, "checksum table at offset %llu is corrupt (XXH3 %016llx, header says %016llx)",
                (unsigned long long)s->h.table_offset, (unsigned long long)tx,
                (unsigned long long)s->h.table_xxh3);
    /* chunk hashes cannot be trusted without a good table: don't compare them */
    s->body_ok = s->table_ok;
    if (s->table_ok) s->index_expect = s->table[s->h.n_chunks];
}

/* Smallest and largest id of n ids: plain loops that compilers vectorize
 * (clang at -O2; gcc at -O3 or with the attribute below). On x86-64 an
 * AVX2 clone is picked at load time when the CPU has it: the SSE2 baseline has
 * no unsigned 16- or 32-bit min/max instruction. */
#if defined(__GNUC__) && !defined(__clang__)
#define TKS_VECTORIZE __attribute__((optimize("tree-vectorize")))
#else
#define TKS_VECTORIZE
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define TKS_CLONES TKS_VECTORIZE __attribute__((target_clones("avx2", "default")))
#else
#define TKS_CLONES TKS_VECTORIZE
#endif

/* Bytes per block of a task: hashed, then scanned while still in L1 (half
 * of a 32 KiB L1, so that the hash's own lines do not push the block's first
 * lines out before the second pass reaches them). */
#ifndef BLOCK_BYTES
#define BLOCK_BYTES ((size_t)16 << 10)
#endif

/* 1 if q[0] < q[1] < ... < q[n - 1]. Compared as signed after checking that
 * no value has its top bit set (then signed and unsigned order agree): x86-64
 * has a signed 64-bit compare in AVX2 (and SSE4.2), no unsigned one. */
TKS_CLONES static int increasing(const uint64_t *q, size_t n) {
    uint64_t ok = 1, top = n ? q[0] : 0;
    for (size_t i = 1; i < n; i++) {
        ok &= (int64_t)q[i] > (int64_t)q[i - 1];
        top |= q[i];
    }
    if (top >> 63) { /* a value of 2^63 or more: the plain unsigned rule */
        ok = 1;
        for (size_t i = 1; i < n; i++) ok &= q[i] > q[i - 1];
    }
    return (int)ok;
}

/* Bytes a task reads at a time with pread into its thread's buffer: the
 * copy out of the page cache costs less than mapping and unmapping the pages
 * (bench/bench_audit.sh), and the block then stays in L2 for hash and scan. */
#ifndef READ_BYTES
#define READ_BYTES ((size_t)256 << 10)
#endif

/* The len bytes at file offset off of shard s: read into buf when the shard
 * has an fd and the task a buffer, else the mapping. NULL on a read error
 * (errno in *err, -1 for a short read: the file shrank during the audit). */
static const uint8_t *fetch(const ashard *s, uint8_t *buf, uint64_t off, size_t len, int *err) {
    /* len <= the buffer's size: the callers read at most READ_BYTES, and the
     * buffer holds the most any task reads at a time (tks_audit) */
    if (s->fd < 0 || !buf) return s->base + off;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(s->fd, buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *err = n < 0 ? errno : -1;
            return NULL;
        }
        got += (size_t)n;
    }
    return buf;
}

/* Index task: XXH3-64 of the index and the first entry that breaks the rules
 * (index[0] = 0, strictly increasing, index[n_docs] = n_tokens; the same rule
 * as tks__index_bad), in one pass. A read error leaves index_read_errno set. */
static void scan_index(ashard *s, uint8_t *buf) {
    const tks_shard_header *h = &s->h;
    uint64_t n = h->n_docs + 1, bad = TKS_NONE, prev = 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    const size_t per = READ_BYTES / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; i += per) {
        uint64_t m = n - i < per ? n - i : per;
        const uint64_t *rd = (const uint64_t *)fetch(s, buf, h->index_offset + 8 * i, m * 8, &s->index_read_errno);
        if (!rd) return;
        /* each block hashed, then checked while it is in L1 */
        for (uint64_t j = 0; j < m; j += BLOCK_BYTES / 8) {
            const uint64_t *ix = rd + j;
            uint64_t mb = m - j < BLOCK_BYTES / 8 ? m - j : BLOCK_BYTES / 8, at = i + j;
            XXH3_64bits_update(&st, ix, mb * sizeof *ix);
            if (bad != TKS_NONE) continue;
            if (at == 0 && ix[0] != 0) {
                bad = 0;
                continue;
            }
            /* entries d in [max(at,1), at + mb): index[d] > index[d - 1] */
            if ((at && ix[0] <= prev) || !increasing(ix, mb)) {
                if (at && ix[0] <= prev) bad = at;
                else
                    for (uint64_t d = 1; d < mb; d++)
                        if (ix[d] <= ix[d - 1]) { bad = at + d; break; }
            }
            prev = ix[mb - 1];
        }
    }
    if (bad == TKS_NONE && prev != h->n_tokens) bad = h->n_docs;
    s->index_xxh3 = XXH3_64bits_digest(&st);
    s->index_bad = bad;
    s->index_bad_value = bad != TKS_NONE ? s->index[bad] : 0;
    /* version 2: the provenance section, read and hashed the same way */
    XXH3_64bits_reset(&st);
    for (uint64_t at = 0; at < h->prov_bytes; at += READ_BYTES) {
        size_t m = h->prov_bytes - at < READ_BYTES ? (size_t)(h->prov_bytes - at) : READ_BYTES;
        const uint8_t *rd = fetch(s, buf, h->prov_offset + at, m, &s->prov_read_errno);
        if (!rd) return;
        XXH3_64bits_update(&st, rd, m);
    }
    s->prov_xxh3 = XXH3_64bits_digest(&st);
}

/* minmax16, minmax32: the smallest and largest of n ids of one width, folded
 * into *lo and *hi. One body for both widths, so that each compiles to a loop
 * of that width's min/max instructions. */
#define TKS_MINMAX(name, T, T_MAX)                                                   \
    TKS_CLONES static void name(const T *q, size_t n, uint32_t *lo, uint32_t *hi) { \
        T l = T_MAX, h = 0;                                                          \
        for (size_t i = 0; i < n; i++) {                                             \
            l = q[i] < l ? q[i] : l;                                                 \
            h = q[i] > h ? q[i] : h;                                                 \
        }                                                                            \
        if (l < *lo) *lo = l;                                                        \
        if (h > *hi) *hi = h;                                                        \
    }
TKS_MINMAX(minmax16, uint16_t, UINT16_MAX)
TKS_MINMAX(minmax32, uint32_t, UINT32_MAX)

/* in_span16, in_span32: how many of n ids lie in [lo, lo + span]. */
#define TKS_IN_SPAN(name, T)                                                          \
    TKS_CLONES static uint64_t name(const T *q, size_t n, uint32_t lo, uint32_t span) { \
        uint64_t c = 0;                                                               \
        for (size_t i = 0; i < n; i++) c += (uint32_t)q[i] - lo <= span;              \
        return c;                                                                     \
    }
TKS_IN_SPAN(in_span16, uint16_t)
TKS_IN_SPAN(in_span32, uint32_t)

/* A chunk's reserved ids against the documents' bounds: tokens [first,
 * first + n) of shard s, of which n_res are reserved (rs). Read from the
 * mapping through the document index, which is checked by another task:
 * the result counts only when that task finds the index good. Counts the
 * BOS at documents' starts and the EOS at their ends; when those are not
 * all n_res, scans the chunk for the first reserved id elsewhere. */
static void inside_docs(const ashard *s, uint64_t first, uint64_t n, uint64_t n_res, const reserved_set *rs,
                        task_result *t) {
    const tks_shard_header *h = &s->h;
    const uint8_t *tok = s->base + h->tokens_offset;
    const uint64_t *ix = (const uint64_t *)(s->base + h->index_offset);
    uint64_t lo = 0, hi = h->n_docs, end = first + n, legit = 0;
    while (hi - lo > 1) { /* the document holding token `first` */
        uint64_t mid = lo + (hi - lo) / 2;
        if (ix[mid] <= first) lo = mid; else hi = mid;
    }
    for (uint64_t d = lo; d < h->n_docs && ix[d] < end; d++) {
        uint64_t a = ix[d], b = ix[d + 1];
        if (b <= a || b > h->n_tokens) return; /* a broken index: reported by its task */
        int bos_ok = a >= first && tks_shard_token_at(tok, h->token_bytes, a) == rs->bos;
        legit += (uint64_t)bos_ok;
        legit += b - 1 >= first && b - 1 < end && (b - 1 != a || !bos_ok) &&
                 tks_shard_token_at(tok, h->token_bytes, b - 1) == rs->eos;
    }
    if (legit == n_res) return;
    /* the first reserved id that is no BOS at a start nor EOS at an end */
    uint64_t d = lo;
    for (uint64_t p = first; p < end; p++) {
        uint32_t id = tks_shard_token_at(tok, h->token_bytes, p);
        if (!is_reserved(rs, id)) continue;
        while (d + 1 < h->n_docs && ix[d + 1] <= p) d++;
        if ((p == ix[d] && id == rs->bos) || (p + 1 == ix[d + 1] && id == rs->eos)) continue;
        if (!t->n_inside++) {
            t->first_inside = p;
            t->inside_id = id;
        }
    }
}

static void scan_chunk(const ashard *s, uint64_t c, uint32_t model_vocab, const reserved_set *rs, uint8_t *buf,
                       task_result *t) {
    const tks_shard_header *h = &s->h;
    uint64_t off = c * h->chunk_bytes;
    uint64_t len = h->tokens_bytes - off < h->chunk_bytes ? h->tokens_bytes - off : h->chunk_bytes;
    uint64_t n = len / h->token_bytes, first = off / h->token_bytes;
    uint32_t lo = UINT32_MAX, hi = 0;
    uint64_t n_res = 0; /* ids in [rs->lo, rs->hi] */
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint64_t r = 0; r < len; r += READ_BYTES) {
        size_t rn = len - r < READ_BYTES ? (size_t)(len - r) : READ_BYTES;
        const uint8_t *q = fetch(s, buf, h->tokens_offset + off + r, rn, &t->read_errno);
        if (!q) {
            t->min_id = UINT32_MAX;
            t->max_id = 0;
            return;
        }
        for (size_t b = 0; b < rn; b += BLOCK_BYTES) {
            size_t m = rn - b < BLOCK_BYTES ? rn - b : BLOCK_BYTES;
            XXH3_64bits_update(&st, q + b, m);
            if (h->token_bytes == 2)
                minmax16((const uint16_t *)(q + b), m / 2, &lo, &hi);
            else
                minmax32((const uint32_t *)(q + b), m / 4, &lo, &hi);
            if (rs)
                n_res += h->token_bytes == 2 ? in_span16((const uint16_t *)(q + b), m / 2, rs->lo, rs->hi - rs->lo)
                                             : in_span32((const uint32_t *)(q + b), m / 4, rs->lo, rs->hi - rs->lo);
        }
    }
    if (n_res && !rs->contiguous) { /* only some of the span is reserved: count exactly */
        const uint8_t *p = s->base + h->tokens_offset + off;
        n_res = 0;
        for (uint64_t i = 0; i < n; i++) n_res += (uint64_t)is_reserved(rs, tks_shard_token_at(p, h->token_bytes, i));
    }
    if (n_res) inside_docs(s, first, n, n_res, rs, t);
    t->hash_bad = XXH3_64bits_digest(&st) != s->table[c];
    t->min_id = lo;
    t->max_id = hi;
    /* Slow path only when something is out of range: it reads the mapping. */
    uint32_t lim = model_vocab && model_vocab < h->vocab_size ? model_vocab : h->vocab_size;
    if (hi < lim) return;
    const uint8_t *p = s->base + h->tokens_offset + off;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = tks_shard_token_at(p, h->token_bytes, i);
        if (id >= h->vocab_size) {
            if (!t->n_bad++) { t->first_bad = first + i; t->bad_id = id; }
        }
        if (model_vocab && id >= model_vocab) {
            if (!t->n_bad_model++) { t->first_bad_model = first + i; t->bad_model_id = id; }
        }
    }
}

/* Unmaps a shard whose tasks are all done if the report will not read it again
 * (no chunk problem to place in a document). */
static void release_if_clean(ashard *s, const task_result *res) {
    if (s->body_ok)
        for (uint64_t c = 0; c < s->h.n_chunks; c++) {
            const task_result *t = &res[s->first_task + c];
            if (t->hash_bad || t->read_errno || t->n_bad || t->n_bad_model || t->n_inside) return;
        }
    tks_unmap(s->base, s->size);
    s->base = NULL;
    s->index = NULL;
    s->table = NULL;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

static int is_shard_name(const char *n) {
    size_t l = strlen(n);
    return l == 15 && strncmp(n, "shard-", 6) == 0 && strcmp(n + 11, ".tks") == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One audit: its options, its report and the shards it reads, through the
 * phases of tks_audit. */
typedef struct audit {
    const char *path;
    tks_audit_opts opts;
    struct stat st;            /* of path: a directory or a lone shard */
    tks_audit_report *r;
    sink sk;
    ashard *sh;                /* every shard of the dataset, in order */
    size_t n_sh;
    size_t mine0, mine1;       /* this process's shards [mine0, mine1) */
    tks_shard_info *minfo;     /* the manifest's shard records (have_manifest) */
    size_t n_minfo;
    tks_tokenizer_info tok;    /* the manifest's tokenizer (have_manifest) */
    uint32_t m_token_bytes, m_chunk_bytes;
    int have_manifest;
    uint8_t user_fp[16];       /* --tokenizer's fingerprint (have_user_fp) */
    int have_user_fp;
    reserved_set rs;           /* the manifest's reserved ids (bits NULL: no check) */
    /* the parallel tasks: index tasks [0, n_idx), then chunk tasks; task j
     * reads shard t_shard[j], chunk t_chunk[j] (TKS_NONE: the index) */
    size_t n_idx, n_tasks;
    uint32_t *t_shard;
    uint64_t *t_chunk;
    task_result *res;
} audit;

static int audit_nomem(const audit *a) {
    return tks_fail(TKS_ERR_NOMEM, a->path, TKS_NONE, TKS_NONE, "out of memory");
}

static void audit_free(audit *a) {
    for (size_t i = 0; i < a->n_sh; i++) {
        tks_unmap(a->sh[i].base, a->sh[i].size);
        if (a->sh[i].fd >= 0) close(a->sh[i].fd);
    }
    free(a->rs.bits);
    free(a->t_shard);
    free(a->t_chunk);
    free(a->res);
    free(a->sh);
    free(a->minfo);
}

/* Parses dir/manifest.json into a->minfo and a->tok; a missing or unreadable
 * manifest is a problem of the report, and says whether the build is unfinished. */
static void read_manifest(audit *a) {
    sink *pk = &a->sk;
    char buf[PATH_MAX], *text = NULL;
    size_t len = 0;
    tks_path_join(buf, sizeof buf, a->path, TKS_MANIFEST_NAME);
    if (tks__read_small_file(buf, &text, &len) != 0) {
        char partial[PATH_MAX + 16];
        struct stat ps;
        snprintf(partial, sizeof partial, "%s.partial", a->path);
        if (stat(partial, &ps) == 0)
            problem(pk, TKS_ERR_MANIFEST, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, buf,
                    "no readable manifest.json: the dataset is unfinished (its build works in "
                    "%s; finish it with `tokshard build --resume`)", partial);
        else
            problem(pk, TKS_ERR_MANIFEST, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, buf,
                    "no readable manifest.json (%s): not a finished tokshard dataset; rebuild "
                    "it, or restore manifest.json", tks_last_error()->message);
    } else if (tks__manifest_parse(text, len, buf, &a->tok, &a->minfo, &a->n_minfo,
                                   &a->m_token_bytes, &a->m_chunk_bytes) != 0) {
        problem(pk, tks_last_error()->code, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                TKS_NONE, buf, "%s", tks_last_error()->message);
    } else {
        a->have_manifest = 1;
        a->r->manifest_checked = 1;
    }
    free(text);
}

/* The shard-NNNNN.tks names in dir, sorted (malloc'd, as is each name). */
static char **shard_names(const char *dir, size_t *n) {
    DIR *d = opendir(dir);
    char **names = NULL;
    size_t n_names = 0, cap_names = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!is_shard_name(e->d_name)) continue;
        if (n_names == cap_names) {
            cap_names = cap_names ? 2 * cap_names : 64;
            char **nn = realloc(names, cap_names * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n_names++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(names, n_names, sizeof *names, cmp_str);
    *n = n_names;
    return names;
}

/* The dataset's shards: the manifest's, or without one the shard files
 * present; files the manifest does not list are problems (stray shards). */
static void list_shards(audit *a) {
    size_t n_names = 0;
    char **names = shard_names(a->path, &n_names);
    size_t n_want = a->have_manifest ? a->n_minfo : n_names;
    a->sh = calloc(n_want ? n_want : 1, sizeof *a->sh);
    for (size_t i = 0; i < n_want && a->sh; i++) {
        ashard *s = &a->sh[a->n_sh++];
        const char *nm = a->have_manifest ? a->minfo[i].file : names[i];
        tks_path_join(s->path, sizeof s->path, a->path, nm);
        s->shard_no = a->have_manifest ? i : (uint64_t)atoll(nm + 6);
        s->fd = -1;
    }
    if (a->have_manifest)
        for (size_t i = 0; i < n_names; i++) {
            unsigned k = (unsigned)atoi(names[i] + 6);
            if (k >= a->n_minfo)
                problem(&a->sk, TKS_ERR_MANIFEST, k, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                        names[i], "%s is not listed in the manifest (a stray shard)", names[i]);
        }
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
}

/* The dataset's copy of its tokenizer against the manifest's fingerprint. */
static void check_tokenizer_copy(audit *a) {
    uint8_t fp[16];
    char buf[PATH_MAX];
    tks_path_join(buf, sizeof buf, a->path, a->tok.file);
    if (tks_file_xxh3_128(buf, fp, NULL) != 0)
        problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                buf, "tokenizer copy is missing or unreadable: %s", tks_last_error()->message);
    else if (memcmp(fp, a->tok.fingerprint, 16) != 0)
        problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                buf, "tokenizer copy does not match the manifest's fingerprint");
    /* its tokenizer_config.json (BOS, EOS, pad), when the manifest records one */
    if (a->tok.has_config) {
        tks_path_join(buf, sizeof buf, a->path, TKS_TOKENIZER_CONFIG_NAME);
        if (tks_file_xxh3_128(buf, fp, NULL) != 0)
            problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, buf,
                    "tokenizer_config.json is missing or unreadable: %s", tks_last_error()->message);
        else if (memcmp(fp, a->tok.config_xxh3, 16) != 0)
            problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, buf,
                    "tokenizer_config.json does not match the manifest's config_xxh3: it was edited or "
                    "replaced (its BOS, EOS and pad are the dataset's); restore it or rebuild the dataset");
    }
    a->r->vocab_size = a->tok.vocab_size;
    snprintf(a->r->unicode, sizeof a->r->unicode, "%s", a->tok.unicode);
    a->r->unassigned = a->tok.unassigned;
    a->r->unassigned_docs = a->tok.unassigned_docs;
}

/* The manifest's reserved ids as a set for the chunk tasks; none when the
 * manifest records none or says special tokens came from the text. */
static int reserved_setup(audit *a) {
    const tks_tokenizer_info *t = &a->tok;
    if (!a->have_manifest || !t->n_reserved || t->special_from_text) return 0;
    reserved_set *rs = &a->rs;
    rs->lo = t->reserved[0][0];
    rs->hi = t->reserved[t->n_reserved - 1][1];
    rs->contiguous = t->n_reserved == 1;
    rs->bos = t->bos_id;
    rs->eos = t->eos_id;
    rs->bits = calloc(((size_t)(rs->hi - rs->lo) >> 6) + 1, sizeof *rs->bits);
    if (!rs->bits) return audit_nomem(a);
    for (uint32_t i = 0; i < t->n_reserved; i++)
        for (uint32_t id = t->reserved[i][0]; id <= t->reserved[i][1]; id++)
            rs->bits[(id - rs->lo) >> 6] |= 1ull << ((id - rs->lo) & 63);
    return 0;
}

/* Phase 0, the dataset-level checks: manifest, stray shards, tokenizer copy,
 * and --tokenizer against the manifest. Errors: TKS_ERR_NOMEM. */
static int check_dataset(audit *a) {
    if (S_ISDIR(a->st.st_mode)) {
        read_manifest(a);
        list_shards(a);
        if (a->have_manifest) check_tokenizer_copy(a);
    } else {
        a->sh = calloc(1, sizeof *a->sh);
        if (a->sh) {
            snprintf(a->sh[0].path, sizeof a->sh[0].path, "%s", a->path);
            a->sh[0].fd = -1;
            a->n_sh = 1;
        }
    }
    if (!a->sh) return audit_nomem(a);
    /* --tokenizer: compare its fingerprint with the manifest, or with the shards' headers */
    const char *tp = a->opts.tokenizer_path;
    if (tp && a->opts.tokenizer_fp) {
        memcpy(a->user_fp, a->opts.tokenizer_fp, 16);
        a->have_user_fp = 1;
        a->r->tokenizer_checked = 1;
        if (a->have_manifest && memcmp(a->user_fp, a->tok.fingerprint, 16) != 0)
            problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, tp,
                    "%s is not the tokenizer this dataset was built with (fingerprints differ)", tp);
    } else if (tp) {
        if (tks_file_xxh3_128(tp, a->user_fp, NULL) != 0)
            problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    tp, "%s", tks_last_error()->message);
        else
            a->have_user_fp = 1;
        a->r->tokenizer_checked = 1;
        if (a->have_user_fp && a->have_manifest && memcmp(a->user_fp, a->tok.fingerprint, 16) != 0)
            problem(&a->sk, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, tp,
                    "%s is not the tokenizer this dataset was built with (fingerprints differ)", tp);
    }
    return 0;
}

/* This process's shards: all, or its share of a distributed audit, whose
 * rank 0 alone reports the dataset-level problems. Errors: TKS_ERR_NOMEM. */
static int take_share(audit *a) {
    a->mine0 = 0;
    a->mine1 = a->n_sh;
    if (a->opts.n_ranks <= 1) return 0;
    uint64_t *sizes = calloc(a->n_sh ? a->n_sh : 1, sizeof *sizes);
    if (!sizes) return audit_nomem(a);
    struct stat ss;
    for (size_t i = 0; i < a->n_sh; i++)
        sizes[i] = stat(a->sh[i].path, &ss) == 0 ? (uint64_t)ss.st_size : 0;
    tks_audit_share(sizes, a->n_sh, a->opts.rank, a->opts.n_ranks, &a->mine0, &a->mine1);
    free(sizes);
    if (a->opts.rank != 0) a->r->n_problems = a->r->n_problems_total = 0;
    return 0;
}

/* Phase 1: maps each of this process's shards and checks its structure, its
 * manifest record and its tokenizer; adds its header's counts to the report. */
static void check_shards(audit *a) {
    sink *pk = &a->sk;
    tks_audit_report *r = a->r;
    for (size_t i = a->mine0; i < a->mine1; i++) {
        ashard *s = &a->sh[i];
        pk->base = KEY(1, i);
        if (tks_map_file(s->path, "shard", &s->base, &s->size) != 0) {
            problem(pk, TKS_ERR_IO, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "%s", tks_last_error()->message);
            continue;
        }
        check_structure(s, pk);
        if (s->size_ok && tks_open_regular(s->path, "shard", &s->fd, NULL)) s->fd = -1; /* use the mapping */
        if (!s->header_ok) continue;
        r->n_docs += s->h.n_docs;
        r->n_tokens += s->h.n_tokens;
        if (!r->vocab_size) r->vocab_size = s->h.vocab_size;
        if (a->have_manifest) {
            tks_shard fake = {.base = s->base, .size = s->size, .h = s->h};
            snprintf(fake.path, sizeof fake.path, "%s", s->path);
            if (tks__shard_matches(&fake, &a->minfo[i], &a->tok, a->m_token_bytes, a->m_chunk_bytes) != 0)
                problem(pk, tks_last_error()->code, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE,
                        TKS_NONE, s->path, "%s", tks_last_error()->message);
        } else if (s->h.shard_index != s->shard_no && S_ISDIR(a->st.st_mode)) {
            problem(pk, TKS_ERR_HEADER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "header says shard %u", s->h.shard_index);
        }
        if (a->have_user_fp && memcmp(a->user_fp, s->h.tokenizer_fp, 16) != 0)
            problem(pk, TKS_ERR_TOKENIZER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "built with another tokenizer than %s", a->opts.tokenizer_path);
    }
}

/* Lists the parallel tasks: the indexes first (one task each, the longest
 * tasks), then every chunk. Errors: TKS_ERR_NOMEM. */
static int plan_tasks(audit *a) {
    ashard *sh = a->sh;
    for (size_t i = 0; i < a->n_sh; i++) {
        if (sh[i].size_ok) a->n_idx++;
        if (sh[i].body_ok) a->n_tasks += sh[i].h.n_chunks;
    }
    a->n_tasks += a->n_idx;
    size_t n = a->n_tasks ? a->n_tasks : 1;
    a->t_shard = malloc(n * sizeof *a->t_shard);
    a->t_chunk = malloc(n * sizeof *a->t_chunk);
    a->res = calloc(n, sizeof *a->res);
    if (!a->t_shard || !a->t_chunk || !a->res) return audit_nomem(a);
    size_t k = 0;
    for (size_t i = 0; i < a->n_sh; i++)
        if (sh[i].size_ok) {
            a->t_shard[k] = (uint32_t)i;
            a->t_chunk[k++] = TKS_NONE;
        }
    for (size_t i = 0; i < a->n_sh; i++) {
        size_t left = sh[i].size_ok ? 1 : 0;
        sh[i].first_task = k;
        if (sh[i].body_ok)
            for (uint64_t c = 0; c < sh[i].h.n_chunks; c++, k++, left++) {
                a->t_shard[k] = (uint32_t)i;
                a->t_chunk[k] = c;
            }
        atomic_init(&sh[i].tasks_left, left);
    }
    return 0;
}

/* Runs the index and chunk tasks, in parallel, each thread reading through
 * its own buffer. */
static void run_tasks(audit *a) {
    /* read buffer: READ_BYTES, or less when no task reads that much at a time */
    size_t buf_bytes = 4096;
    for (size_t i = 0; i < a->n_sh; i++)
        if (a->sh[i].size_ok) {
            const tks_shard_header *h = &a->sh[i].h;
            uint64_t most = h->index_bytes > h->chunk_bytes ? h->index_bytes : h->chunk_bytes;
            if (h->prov_bytes > most) most = h->prov_bytes;
            if (most > buf_bytes) buf_bytes = most < READ_BYTES ? (size_t)most : READ_BYTES;
        }
    buf_bytes = (buf_bytes + 4095) & ~(size_t)4095;
    size_t n_tasks = a->n_tasks;
    int threads = a->opts.threads > 0 ? a->opts.threads : omp_get_max_threads();
    if ((size_t)threads > n_tasks) threads = n_tasks ? (int)n_tasks : 1;
#pragma omp parallel num_threads(threads)
    {
    uint8_t *buf = aligned_alloc(4096, buf_bytes); /* NULL: this thread reads the mappings */
#pragma omp for schedule(dynamic, 1)
    for (size_t j = 0; j < n_tasks; j++) {
        ashard *s = &a->sh[a->t_shard[j]];
        if (a->t_chunk[j] == TKS_NONE)
            scan_index(s, buf);
        else
            scan_chunk(s, a->t_chunk[j], a->opts.model_vocab, a->rs.bits ? &a->rs : NULL, buf, &a->res[j]);
        /* The shard's last task unmaps it when no chunk problem needs the index
         * for the report: munmap then overlaps with other shards' work instead
         * of running serially at the end. */
        if (atomic_fetch_sub_explicit(&s->tasks_left, 1, memory_order_acq_rel) == 1)
            release_if_clean(s, a->res);
    }
    free(buf);
    }
}

/* Phase 2: the index problems of every shard, in shard order; sets index_ok. */
static void report_indexes(audit *a) {
    sink *pk = &a->sk;
    for (size_t i = 0; i < a->n_sh; i++) {
        ashard *s = &a->sh[i];
        if (!s->size_ok) continue;
        pk->base = KEY(2, i);
        if (s->index_read_errno) {
            problem(pk, TKS_ERR_IO, s->shard_no, TKS_NONE, TKS_NONE, s->h.index_offset, TKS_NONE,
                    s->path, "cannot read the document index at offset %llu: %s (check the disk "
                    "and the file system, then audit again)", (unsigned long long)s->h.index_offset,
                    s->index_read_errno > 0 ? strerror(s->index_read_errno) : "the file shrank");
            continue;
        }
        if (s->table_ok && s->index_xxh3 != s->index_expect)
            problem(pk, TKS_ERR_CHECKSUM, s->shard_no, TKS_NONE, TKS_NONE, s->h.index_offset,
                    TKS_NONE, s->path, "document index at offset %llu is corrupt (checksum mismatch)",
                    (unsigned long long)s->h.index_offset);
        uint64_t d = s->index_bad;
        if (d != TKS_NONE)
            problem(pk, TKS_ERR_INDEX, s->shard_no, TKS_NONE, TKS_NONE, s->h.index_offset + 8 * d,
                    d, s->path, "document index entry %llu (%llu) is not monotonic or does not end "
                    "at n_tokens %llu", (unsigned long long)d, (unsigned long long)s->index_bad_value,
                    (unsigned long long)s->h.n_tokens);
        else
            s->index_ok = 1;
        if (s->h.version != TKS_FORMAT_V2) continue;
        if (s->prov_read_errno)
            problem(pk, TKS_ERR_IO, s->shard_no, TKS_NONE, TKS_NONE, s->h.prov_offset, TKS_NONE, s->path,
                    "cannot read the provenance section at offset %llu: %s (check the disk and the file "
                    "system, then audit again)", (unsigned long long)s->h.prov_offset,
                    s->prov_read_errno > 0 ? strerror(s->prov_read_errno) : "the file shrank");
        else if (s->prov_xxh3 != s->h.prov_xxh3)
            problem(pk, TKS_ERR_CHECKSUM, s->shard_no, TKS_NONE, TKS_NONE, s->h.prov_offset, TKS_NONE,
                    s->path, "provenance section at offset %llu is corrupt (checksum mismatch): where its "
                    "documents came from is lost; rebuild this shard", (unsigned long long)s->h.prov_offset);
        else
            a->r->bytes_hashed += s->h.prov_bytes;
    }
}

/* The problems of chunk c of shard s, whose task found t. */
static void report_chunk(sink *pk, const ashard *s, uint64_t c, const task_result *t,
                         uint32_t model_vocab) {
    const tks_shard_header *h = &s->h;
    uint64_t off = c * h->chunk_bytes, at = h->tokens_offset + off;
    uint64_t tok0 = off / h->token_bytes;
    if (t->read_errno)
        problem(pk, TKS_ERR_IO, s->shard_no, c, tok0, at, doc_of(s, tok0), s->path,
                "cannot read chunk %llu (bytes %llu..): %s (check the disk and the file system, "
                "then audit again)", (unsigned long long)c, (unsigned long long)at,
                t->read_errno > 0 ? strerror(t->read_errno) : "the file shrank");
    else if (t->hash_bad)
        problem(pk, TKS_ERR_CHECKSUM, s->shard_no, c, tok0, at, doc_of(s, tok0), s->path,
                "chunk %llu (bytes %llu.., tokens %llu..) checksum mismatch: token data corrupt",
                (unsigned long long)c, (unsigned long long)at, (unsigned long long)tok0);
    if (t->n_bad)
        problem(pk, TKS_ERR_TOKEN_RANGE, s->shard_no, c, t->first_bad,
                h->tokens_offset + t->first_bad * h->token_bytes, doc_of(s, t->first_bad),
                s->path, "%llu token id(s) >= vocab_size %u in chunk %llu; first: id %u at "
                "token offset %llu", (unsigned long long)t->n_bad, h->vocab_size,
                (unsigned long long)c, t->bad_id, (unsigned long long)t->first_bad);
    if (t->n_inside && s->index_ok) {
        uint64_t d = doc_of(s, t->first_inside);
        problem(pk, TKS_ERR_TOKEN_RANGE, s->shard_no, c, t->first_inside,
                h->tokens_offset + t->first_inside * h->token_bytes, d, s->path,
                "%llu id(s) that no text produces inside documents in chunk %llu; first: id %u at token "
                "offset %llu, token %llu of document %llu. A special token (or an id that is no token) "
                "there did not come from tokenizing text without special tokens: the data was "
                "tokenized elsewhere, or with their text allowed (build --allow-special-in-text)",
                (unsigned long long)t->n_inside, (unsigned long long)c, t->inside_id,
                (unsigned long long)t->first_inside, (unsigned long long)(t->first_inside - s->index[d]),
                (unsigned long long)d);
    }
    if (t->n_bad_model)
        problem(pk, TKS_ERR_TOKEN_RANGE, s->shard_no, c, t->first_bad_model,
                h->tokens_offset + t->first_bad_model * h->token_bytes,
                doc_of(s, t->first_bad_model), s->path,
                "%llu token id(s) >= --model-vocab %u in chunk %llu; first: id %u at token "
                "offset %llu: a model with this embedding size cannot train on it",
                (unsigned long long)t->n_bad_model, model_vocab, (unsigned long long)c,
                t->bad_model_id, (unsigned long long)t->first_bad_model);
}

/* Phase 3: the chunk problems of every shard, in shard order, and the ids
 * present against each header; adds the chunk counts and id range to the report. */
static void report_chunks(audit *a) {
    tks_audit_report *r = a->r;
    size_t k = a->n_idx;
    for (size_t i = 0; i < a->n_sh; i++) {
        ashard *s = &a->sh[i];
        if (!s->body_ok) continue;
        a->sk.base = KEY(3, i);
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint64_t c = 0; c < s->h.n_chunks; c++, k++) {
            const task_result *t = &a->res[k];
            uint64_t off = c * s->h.chunk_bytes;
            r->n_chunks++;
            r->bytes_hashed += s->h.tokens_bytes - off < s->h.chunk_bytes ? s->h.tokens_bytes - off
                                                                          : s->h.chunk_bytes;
            report_chunk(&a->sk, s, c, t, a->opts.model_vocab);
            lo = t->min_id < lo ? t->min_id : lo;
            hi = t->max_id > hi ? t->max_id : hi;
        }
        if (s->h.n_chunks && (lo != s->h.min_token_id || hi != s->h.max_token_id))
            problem(&a->sk, TKS_ERR_HEADER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "ids present span [%u, %u] but the header says [%u, %u]", lo, hi,
                    s->h.min_token_id, s->h.max_token_id);
        r->min_token_id = lo < r->min_token_id ? lo : r->min_token_id;
        r->max_token_id = hi > r->max_token_id ? hi : r->max_token_id;
    }
    if (r->min_token_id == UINT32_MAX) r->min_token_id = 0;
    r->n_shards = a->n_sh;
}

int tks_audit(const char *path, const tks_audit_opts *opts_in, tks_audit_report **out) {
    *out = NULL;
    audit a = {.path = path};
    if (opts_in) a.opts = *opts_in;
    size_t cap = a.opts.max_problems ? a.opts.max_problems : 1000;
    if (cap > MAX_CAP) cap = MAX_CAP;
    double t0 = omp_get_wtime();
    if (stat(path, &a.st) != 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot audit %s: %s", path,
                        strerror(errno));
    tks_audit_report *r = calloc(1, sizeof *r);
    if (r) r->problems = calloc(cap, sizeof *r->problems);
    if (!r || !r->problems) {
        tks_audit_report_free(r);
        return audit_nomem(&a);
    }
    r->min_token_id = UINT32_MAX;
    a.r = r;
    a.sk = (sink){r, cap, KEY(0, 0)};
    int rc = check_dataset(&a);
    if (!rc) rc = reserved_setup(&a);
    if (!rc) rc = take_share(&a);
    if (!rc) {
        check_shards(&a);
        rc = plan_tasks(&a);
    }
    if (!rc) {
        run_tasks(&a);
        report_indexes(&a);
        report_chunks(&a);
    }
    audit_free(&a);
    if (rc) {
        tks_audit_report_free(r);
        return rc;
    }
    r->seconds = omp_get_wtime() - t0;
    *out = r;
    return 0;
}
