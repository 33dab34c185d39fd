/* audit.c - verify a dataset or a shard completely and report every problem.
 *
 * Structure (header, size, padding, table, index) is checked per shard first;
 * then every (shard, chunk) pair is one task of an OpenMP loop that hashes the
 * chunk and scans its ids against vocab_size (and --model-vocab); results are
 * gathered in order so the report is the same whatever the thread count. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "internal.h"

typedef struct ashard {
    char path[PATH_MAX];
    const uint8_t *base;
    size_t size;
    tks_shard_header h;
    int header_ok;          /* header decoded and canonical */
    int body_ok;            /* size matches: chunks and index may be read */
    int index_ok;           /* index checksum and monotonicity good */
    const uint64_t *index;
    const uint64_t *table;
    uint64_t shard_no;      /* position in the manifest, or 0 for a lone shard */
} ashard;

typedef struct task_result {
    int hash_bad;
    uint32_t min_id, max_id;
    uint64_t n_bad, first_bad;      /* ids >= vocab_size: count, token offset of first */
    uint32_t bad_id;
    uint64_t n_bad_model, first_bad_model;
    uint32_t bad_model_id;
} task_result;

static void problem(tks_audit_report *r, size_t cap, int code, uint64_t shard, uint64_t chunk,
                    uint64_t tok, uint64_t byte, uint64_t doc, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));

static void problem(tks_audit_report *r, size_t cap, int code, uint64_t shard, uint64_t chunk,
                    uint64_t tok, uint64_t byte, uint64_t doc, const char *file, const char *fmt, ...) {
    r->n_problems_total++;
    if (r->n_problems >= cap) return;
    tks_audit_problem *p = &r->problems[r->n_problems++];
    p->code = code;
    p->shard = shard;
    p->chunk = chunk;
    p->token_offset = tok;
    p->byte_offset = byte;
    p->doc = doc;
    snprintf(p->file, sizeof p->file, "%s", file ? file : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
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
static void check_structure(ashard *s, tks_audit_report *r, size_t cap) {
    uint64_t sn = s->shard_no;
    int rc = tks_header_decode(s->base, s->size, s->path, &s->h);
    if (rc) {
        problem(r, cap, rc, sn, TKS_NONE, TKS_NONE, tks_last_error()->offset, TKS_NONE, s->path,
                "%s", tks_last_error()->message);
        return;
    }
    s->header_ok = 1;
    if (s->size != s->h.file_size) {
        problem(r, cap, TKS_ERR_TRUNCATED, sn, TKS_NONE, TKS_NONE, s->size, TKS_NONE, s->path,
                "file is %zu bytes, header says %llu: %s", s->size,
                (unsigned long long)s->h.file_size,
                s->size < s->h.file_size ? "truncated" : "extra bytes at the end");
        return;
    }
    s->body_ok = 1;
    uint64_t pad = tks__padding_nonzero(s->base, &s->h);
    if (pad != TKS_NONE)
        problem(r, cap, TKS_ERR_PADDING, sn, TKS_NONE, TKS_NONE, pad, TKS_NONE, s->path,
                "padding byte at offset %llu is not zero", (unsigned long long)pad);
    s->index = (const uint64_t *)(s->base + s->h.index_offset);
    s->table = (const uint64_t *)(s->base + s->h.table_offset);
    uint64_t tx = XXH3_64bits(s->table, s->h.table_bytes);
    int table_ok = tx == s->h.table_xxh3;
    if (!table_ok)
        problem(r, cap, TKS_ERR_CHECKSUM, sn, TKS_NONE, TKS_NONE, s->h.table_offset, TKS_NONE,
                s->path, "checksum table at offset %llu is corrupt (XXH3 %016llx, header says %016llx)",
                (unsigned long long)s->h.table_offset, (unsigned long long)tx,
                (unsigned long long)s->h.table_xxh3);
    uint64_t ix = XXH3_64bits(s->index, s->h.index_bytes);
    if (table_ok && ix != s->table[s->h.n_chunks])
        problem(r, cap, TKS_ERR_CHECKSUM, sn, TKS_NONE, TKS_NONE, s->h.index_offset, TKS_NONE,
                s->path, "document index at offset %llu is corrupt (checksum mismatch)",
                (unsigned long long)s->h.index_offset);
    uint64_t d = tks__index_bad(s->index, &s->h);
    if (d != TKS_NONE)
        problem(r, cap, TKS_ERR_INDEX, sn, TKS_NONE, TKS_NONE, s->h.index_offset + 8 * d, d,
                s->path, "document index entry %llu (%llu) is not monotonic or does not end at "
                "n_tokens %llu", (unsigned long long)d, (unsigned long long)s->index[d],
                (unsigned long long)s->h.n_tokens);
    else
        s->index_ok = 1;
    if (!table_ok) s->body_ok = 0; /* chunk hashes cannot be trusted: don't compare them */
}

static void scan_chunk(const ashard *s, uint64_t c, uint32_t model_vocab, task_result *t) {
    const tks_shard_header *h = &s->h;
    uint64_t off = c * h->chunk_bytes;
    uint64_t len = h->tokens_bytes - off < h->chunk_bytes ? h->tokens_bytes - off : h->chunk_bytes;
    const uint8_t *p = s->base + h->tokens_offset + off;
    t->hash_bad = XXH3_64bits(p, len) != s->table[c];
    uint64_t n = len / h->token_bytes, first = off / h->token_bytes;
    uint32_t lo = UINT32_MAX, hi = 0;
    if (h->token_bytes == 2) {
        const uint16_t *q = (const uint16_t *)p;
        uint16_t l16 = UINT16_MAX, h16 = 0;
        for (uint64_t i = 0; i < n; i++) {
            l16 = q[i] < l16 ? q[i] : l16;
            h16 = q[i] > h16 ? q[i] : h16;
        }
        lo = l16;
        hi = h16;
    } else {
        const uint32_t *q = (const uint32_t *)p;
        for (uint64_t i = 0; i < n; i++) {
            lo = q[i] < lo ? q[i] : lo;
            hi = q[i] > hi ? q[i] : hi;
        }
    }
    t->min_id = lo;
    t->max_id = hi;
    /* Slow path only when something is out of range. */
    uint32_t lim = model_vocab && model_vocab < h->vocab_size ? model_vocab : h->vocab_size;
    if (hi < lim) return;
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

static int is_shard_name(const char *n) {
    size_t l = strlen(n);
    return l == 15 && strncmp(n, "shard-", 6) == 0 && strcmp(n + 11, ".tks") == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}


int tks_audit(const char *path, const tks_audit_opts *opts_in, tks_audit_report **out) {
    *out = NULL;
    tks_audit_opts opts = {0};
    if (opts_in) opts = *opts_in;
    size_t cap = opts.max_problems ? opts.max_problems : 1000;
    double t0 = omp_get_wtime();
    struct stat st;
    if (stat(path, &st) != 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot audit %s: %s", path,
                        strerror(errno));
    tks_audit_report *r = calloc(1, sizeof *r);
    if (r) r->problems = calloc(cap, sizeof *r->problems);
    if (!r || !r->problems) {
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    }
    r->min_token_id = UINT32_MAX;

    ashard *sh = NULL;
    size_t n_sh = 0;
    tks_shard_info *minfo = NULL;
    size_t n_minfo = 0;
    tks_tokenizer_info tok;
    uint32_t m_token_bytes = 0, m_chunk_bytes = 0;
    int have_manifest = 0;
    char buf[PATH_MAX];

    if (S_ISDIR(st.st_mode)) {
        char *text = NULL;
        size_t len = 0;
        tks_path_join(buf, sizeof buf, path, TKS_MANIFEST_NAME);
        if (tks__read_small_file(buf, &text, &len) != 0) {
            problem(r, cap, TKS_ERR_MANIFEST, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, buf,
                    "no readable manifest.json: the dataset is unfinished (finish the build with "
                    "`tokshard build --resume`)");
        } else if (tks__manifest_parse(text, len, buf, &tok, &minfo, &n_minfo, &m_token_bytes,
                                       &m_chunk_bytes) != 0) {
            problem(r, cap, tks_last_error()->code, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    TKS_NONE, buf, "%s", tks_last_error()->message);
        } else {
            have_manifest = 1;
            r->manifest_checked = 1;
        }
        free(text);
        /* shard files present on disk */
        DIR *d = opendir(path);
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
        size_t n_want = have_manifest ? n_minfo : n_names;
        sh = calloc(n_want ? n_want : 1, sizeof *sh);
        for (size_t i = 0; i < n_want && sh; i++) {
            const char *nm = have_manifest ? minfo[i].file : names[i];
            tks_path_join(sh[n_sh].path, sizeof sh[n_sh].path, path, nm);
            sh[n_sh].shard_no = have_manifest ? i : (uint64_t)atoll(nm + 6);
            n_sh++;
        }
        if (have_manifest)
            for (size_t i = 0; i < n_names; i++) {
                unsigned k = (unsigned)atoi(names[i] + 6);
                if (k >= n_minfo)
                    problem(r, cap, TKS_ERR_MANIFEST, k, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                            names[i], "%s is not listed in the manifest (a stray shard)", names[i]);
            }
        for (size_t i = 0; i < n_names; i++) free(names[i]);
        free(names);
        /* tokenizer copy */
        if (have_manifest) {
            uint8_t fp[16];
            tks_path_join(buf, sizeof buf, path, tok.file);
            if (tks_file_xxh3_128(buf, fp, NULL) != 0)
                problem(r, cap, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                        buf, "tokenizer copy is missing or unreadable: %s", tks_last_error()->message);
            else if (memcmp(fp, tok.fingerprint, 16) != 0)
                problem(r, cap, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                        buf, "tokenizer copy does not match the manifest's fingerprint");
            r->vocab_size = tok.vocab_size;
        }
    } else {
        sh = calloc(1, sizeof *sh);
        if (sh) {
            snprintf(sh[0].path, sizeof sh[0].path, "%s", path);
            n_sh = 1;
        }
    }
    if (!sh) {
        free(minfo);
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    }

    /* --tokenizer: compare its fingerprint with the manifest, or with the shards' headers */
    uint8_t user_fp[16];
    int have_user_fp = 0;
    if (opts.tokenizer_path) {
        if (tks_file_xxh3_128(opts.tokenizer_path, user_fp, NULL) != 0)
            problem(r, cap, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    opts.tokenizer_path, "%s", tks_last_error()->message);
        else
            have_user_fp = 1;
        r->tokenizer_checked = 1;
        if (have_user_fp && have_manifest && memcmp(user_fp, tok.fingerprint, 16) != 0)
            problem(r, cap, TKS_ERR_TOKENIZER, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    opts.tokenizer_path,
                    "%s is not the tokenizer this dataset was built with (fingerprints differ)",
                    opts.tokenizer_path);
    }

    /* structure */
    for (size_t i = 0; i < n_sh; i++) {
        ashard *s = &sh[i];
        if (tks__map_file(s->path, &s->base, &s->size) != 0) {
            problem(r, cap, TKS_ERR_IO, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "%s", tks_last_error()->message);
            continue;
        }
        check_structure(s, r, cap);
        if (!s->header_ok) continue;
        r->n_docs += s->h.n_docs;
        r->n_tokens += s->h.n_tokens;
        if (!r->vocab_size) r->vocab_size = s->h.vocab_size;
        if (have_manifest) {
            tks_shard fake = {.base = s->base, .size = s->size, .h = s->h};
            snprintf(fake.path, sizeof fake.path, "%s", s->path);
            if (tks__shard_matches(&fake, &minfo[i], &tok, m_token_bytes, m_chunk_bytes) != 0)
                problem(r, cap, tks_last_error()->code, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE,
                        TKS_NONE, s->path, "%s", tks_last_error()->message);
        } else if (s->h.shard_index != s->shard_no && S_ISDIR(st.st_mode)) {
            problem(r, cap, TKS_ERR_HEADER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "header says shard %u", s->h.shard_index);
        }
        if (have_user_fp && memcmp(user_fp, s->h.tokenizer_fp, 16) != 0)
            problem(r, cap, TKS_ERR_TOKENIZER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "built with another tokenizer than %s", opts.tokenizer_path);
    }

    /* chunks, in parallel */
    size_t n_tasks = 0;
    for (size_t i = 0; i < n_sh; i++)
        if (sh[i].body_ok) n_tasks += sh[i].h.n_chunks;
    uint32_t *t_shard = malloc((n_tasks ? n_tasks : 1) * sizeof *t_shard);
    uint64_t *t_chunk = malloc((n_tasks ? n_tasks : 1) * sizeof *t_chunk);
    task_result *res = calloc(n_tasks ? n_tasks : 1, sizeof *res);
    if (!t_shard || !t_chunk || !res) {
        free(t_shard);
        free(t_chunk);
        free(res);
        for (size_t i = 0; i < n_sh; i++) tks__unmap(sh[i].base, sh[i].size);
        free(sh);
        free(minfo);
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < n_sh; i++)
        if (sh[i].body_ok)
            for (uint64_t c = 0; c < sh[i].h.n_chunks; c++, k++) {
                t_shard[k] = (uint32_t)i;
                t_chunk[k] = c;
            }
    int threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t j = 0; j < n_tasks; j++) scan_chunk(&sh[t_shard[j]], t_chunk[j], opts.model_vocab, &res[j]);

    k = 0;
    for (size_t i = 0; i < n_sh; i++) {
        ashard *s = &sh[i];
        if (!s->body_ok) continue;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint64_t c = 0; c < s->h.n_chunks; c++, k++) {
            task_result *t = &res[k];
            uint64_t off = c * s->h.chunk_bytes;
            uint64_t tok0 = off / s->h.token_bytes;
            r->n_chunks++;
            r->bytes_hashed += s->h.tokens_bytes - off < s->h.chunk_bytes ? s->h.tokens_bytes - off
                                                                          : s->h.chunk_bytes;
            if (t->hash_bad)
                problem(r, cap, TKS_ERR_CHECKSUM, s->shard_no, c, tok0, s->h.tokens_offset + off,
                        doc_of(s, tok0), s->path,
                        "chunk %llu (bytes %llu.., tokens %llu..) checksum mismatch: token data "
                        "corrupt", (unsigned long long)c,
                        (unsigned long long)(s->h.tokens_offset + off), (unsigned long long)tok0);
            if (t->n_bad)
                problem(r, cap, TKS_ERR_TOKEN_RANGE, s->shard_no, c, t->first_bad,
                        s->h.tokens_offset + t->first_bad * s->h.token_bytes, doc_of(s, t->first_bad),
                        s->path, "%llu token id(s) >= vocab_size %u in chunk %llu; first: id %u at "
                        "token offset %llu", (unsigned long long)t->n_bad, s->h.vocab_size,
                        (unsigned long long)c, t->bad_id, (unsigned long long)t->first_bad);
            if (t->n_bad_model)
                problem(r, cap, TKS_ERR_TOKEN_RANGE, s->shard_no, c, t->first_bad_model,
                        s->h.tokens_offset + t->first_bad_model * s->h.token_bytes,
                        doc_of(s, t->first_bad_model), s->path,
                        "%llu token id(s) >= --model-vocab %u in chunk %llu; first: id %u at token "
                        "offset %llu: a model with this embedding size cannot train on it",
                        (unsigned long long)t->n_bad_model, opts.model_vocab,
                        (unsigned long long)c, t->bad_model_id,
                        (unsigned long long)t->first_bad_model);
            lo = t->min_id < lo ? t->min_id : lo;
            hi = t->max_id > hi ? t->max_id : hi;
        }
        if (s->h.n_chunks && (lo != s->h.min_token_id || hi != s->h.max_token_id))
            problem(r, cap, TKS_ERR_HEADER, s->shard_no, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                    s->path, "ids present span [%u, %u] but the header says [%u, %u]", lo, hi,
                    s->h.min_token_id, s->h.max_token_id);
        r->min_token_id = lo < r->min_token_id ? lo : r->min_token_id;
        r->max_token_id = hi > r->max_token_id ? hi : r->max_token_id;
    }
    if (r->min_token_id == UINT32_MAX) r->min_token_id = 0;
    r->n_shards = n_sh;
    for (size_t i = 0; i < n_sh; i++) tks__unmap(sh[i].base, sh[i].size);
    free(t_shard);
    free(t_chunk);
    free(res);
    free(sh);
    free(minfo);
    r->seconds = omp_get_wtime() - t0;
    *out = r;
    return 0;
}

void tks_audit_report_free(tks_audit_report *r) {
    if (!r) return;
    free(r->problems);
    free(r);
}
