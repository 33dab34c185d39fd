/* audit_src.c - a dataset checked against its sources (tks_audit_source,
 * tokshard audit --against-source): documents chosen by a seeded sample
 * (or all of them) are read again from the inputs where the shards'
 * provenance records say the build found them (tks_source: the build's own
 * reader and decoding), encoded again with the tokenizer parsed from its
 * file (never the tokenizer cache), given the BOS and EOS the build added,
 * and compared id by id with the shard.
 *
 * Before a document is read, its input is compared with what the build
 * recorded of it (the manifest's provenance.inputs): its size, and the
 * XXH3-128 of the part of it that holds the document (the whole file, the
 * piece a work unit read, or the run of Parquet row groups); and the text
 * read must hash to the document's own record (tks_doc_prov.text_xxh). A
 * document whose source changed is reported as such and skipped: its ids
 * are not compared, since the text they were made of is gone.
 *
 * The chosen documents are read in the order of their places in the inputs
 * (file, member or row group, offset), so that a compressed file or an
 * archive is read once from its start for all of its documents; ranks of a
 * distributed audit take contiguous runs of that order. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

#include "tokenize/pipeline/pipeline.h"

#define BATCH_DOCS 512
#define BATCH_BYTES ((size_t)64 << 20)

typedef struct item {
    uint32_t shard;
    uint64_t doc;       /* in its shard */
    tks_doc_prov p;
    uint64_t order;     /* place in the sorted sample: the report's order */
} item;

/* One read document waiting to be encoded, and what the comparison found. */
typedef struct pending {
    const item *it;
    size_t text_off, text_len;   /* in the batch's arena */
    char where[200];             /* its source, for the report */
    int rc;                      /* an encoding or shard reading error (err says which) */
    char err[200];
    uint64_t n_shard, n_mine, pos;
    uint32_t id_shard, id_mine;  /* at pos (TKS_NO_ID past an end) */
    int differ, ref_differ;
    uint64_t ref_pos;
    uint32_t ref_shard, ref_mine;
} pending;

typedef struct audit {
    tks_dataset *ds;
    const tks_source_audit_opts *o;
    json_t *inputs;
    tks_input_opts io;
    tks_build_opts bo;           /* prepend_bos, append_eos: tks__add_specials */
    tks_tok *tk, *ref;           /* ref: the sentencepiece library's encoder, or NULL */
    tks_audit_report *r;
    size_t cap;
    tks_source_audit_stats *st;
    pending *pd;
    size_t n_pd;
    char *arena;
    size_t arena_len, arena_cap;
} audit;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->p.file != y->p.file) return x->p.file < y->p.file ? -1 : 1;
    if (x->p.entry != y->p.entry) return x->p.entry < y->p.entry ? -1 : 1;
    if (x->p.offset != y->p.offset) return x->p.offset < y->p.offset ? -1 : 1;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->doc < y->doc ? -1 : x->doc > y->doc;
}

static int policy_of(const char *s, tks_policy dflt) {
    if (!s) return dflt;
    return !strcmp(s, "skip") ? TKS_POLICY_SKIP : !strcmp(s, "fail") ? TKS_POLICY_FAIL : TKS_POLICY_REPLACE;
}

/* The build's reading options and BOS/EOS from the manifest's provenance.options. */
static void read_options(audit *a, json_t *opt) {
    tks_input_opts_default(&a->io);
    const char *split = json_string_value(json_object_get(opt, "doc_split"));
    const char *fmt = json_string_value(json_object_get(opt, "format"));
    a->io.split = split && !strcmp(split, "line") ? TKS_SPLIT_LINE
                  : split && !strcmp(split, "blank-line") ? TKS_SPLIT_BLANK : TKS_SPLIT_FILE;
    a->io.format = fmt && !strcmp(fmt, "text") ? TKS_FMT_TEXT : fmt && !strcmp(fmt, "jsonl") ? TKS_FMT_JSONL : TKS_FMT_AUTO;
    a->io.jsonl_key = json_string_value(json_object_get(opt, "jsonl_key"));
    a->io.invalid_utf8 = policy_of(json_string_value(json_object_get(opt, "invalid_utf8")), TKS_POLICY_REPLACE);
    a->io.long_doc = policy_of(json_string_value(json_object_get(opt, "on_long_doc")), TKS_POLICY_SKIP);
    a->io.bad_record = policy_of(json_string_value(json_object_get(opt, "on_bad_record")), TKS_POLICY_FAIL);
    a->io.max_doc_bytes = (uint64_t)json_integer_value(json_object_get(opt, "max_doc_bytes"));
    a->io.parquet_column = json_string_value(json_object_get(opt, "parquet_column"));
    a->bo.prepend_bos = json_is_true(json_object_get(opt, "prepend_bos"));
    a->bo.append_eos = json_is_true(json_object_get(opt, "append_eos"));
    a->bo.allow_special_in_text = json_is_true(json_object_get(opt, "allow_special_in_text"));
}

/* The tokenizer, parsed from its file (no cache), and for a sentencepiece
 * model a second handle on the sentencepiece library's encoder. */
static int load_tokenizer(audit *a, const char *path) {
    tks_tok_opts to = {.pattern = a->o->pattern, .special_tokens = a->o->special_tokens,
                       .allow_special = a->bo.allow_special_in_text, .no_cache = 1};
    int rc = tks_tok_load_opts(path, &to, &a->tk);
    if (rc) return rc;
    snprintf(a->st->tokenizer, sizeof a->st->tokenizer, "%s", path);
    if (!strcmp(tks_tok_model_type(a->tk), TKS_TOK_BYTE_LEVEL_BPE)) return 0;
    a->st->spm_library = -1;
    if (tks_tok_load_opts(path, &to, &a->ref) == 0 && tks_tok_set_encoder(a->ref, 0) == 0) {
        a->st->spm_library = 1;
        if (!strcmp(tks_tok_encoder(a->tk), "sentencepiece")) { /* no fast encoder: both are the library */
            tks_tok_free(a->ref);
            a->ref = NULL;
        }
    } else {
        tks_tok_free(a->ref);
        a->ref = NULL;
    }
    tks_clear_error();
    return 0;
}

/* The manifest's tables_xxh3 (the tables the build encoded with) against
 * those of the tokenizer parsed from its file: another value means the
 * build encoded with tables that are not the file's (a tokenizer cache entry
 * edited or made elsewhere), whichever documents the sample holds. Only for
 * a byte-level tokenizer and a manifest of this tokshard (the compact form
 * may change between versions). */
static void check_tables(audit *a, json_t *prov) {
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(a->ds);
    const char *tool = json_string_value(json_object_get(prov, "tool"));
    uint8_t mine[16];
    if (!ti->has_tables || !tks_tok_bpe(a->tk) || !tool || strcmp(tool, "tokshard " TKS_VERSION_STRING) ||
        !tks_bpe_tables_xxh3(tks_tok_bpe(a->tk), mine)) /* 1 when computed */
        return;
    a->st->tables = 1;
    if (!memcmp(mine, ti->tables_xxh3, 16)) return;
    char want[33], got[33];
    tks_hex(ti->tables_xxh3, 16, want);
    tks_hex(mine, 16, got);
    a->st->tables = -1;
    tks_audit_report_add(a->r, a->cap, 0, TKS_ERR_TOKENIZER, a->st->tokenizer, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                         TKS_NONE, "tables differ: the manifest records that the build encoded with tables of "
                         "XXH3-128 %s, and %s parsed from its file has %s: the build used other tables than the "
                         "file's (a tokenizer cache entry edited or made elsewhere); build again with "
                         "TOKSHARD_CACHE_DIR=off", want, a->st->tokenizer, got);
}

/* The sample: every document, or n of them chosen by selection sampling
 * (Knuth's algorithm S) from the seed, with their provenance records,
 * sorted by place in the inputs. Checks each shard's provenance section. */
static int choose(audit *a, item **out, size_t *n_out) {
    size_t ns = tks_dataset_n_shards(a->ds);
    uint64_t total = tks_dataset_n_docs(a->ds);
    uint64_t want = a->o->all ? total : a->o->sample ? a->o->sample : TKS_SOURCE_SAMPLE_DEFAULT;
    if (want > total) want = total;
    a->st->dataset_docs = total;
    a->st->sampled = want;
    item *v = calloc(want ? want : 1, sizeof *v);
    if (!v) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (sample of %llu documents)",
                            (unsigned long long)want);
    uint64_t seed = a->o->seed, t = 0, m = 0;
    for (size_t s = 0; s < ns && m < want; s++) {
        const tks_shard *sh = tks_dataset_shard(a->ds, s);
        int rc = tks_shard_has_prov(sh) ? tks_shard_verify_prov(sh)
                                         : tks_fail(TKS_ERR_VERSION, tks_shard_path(sh), s, TKS_NONE,
                                                    "%s records no provenance", tks_shard_path(sh));
        if (rc) {
            free(v);
            return rc;
        }
        uint64_t nd = tks_shard_hdr(sh)->n_docs;
        for (uint64_t d = 0; d < nd && m < want; d++, t++) {
            /* take with probability (want - m) / (total - t) */
            if (!a->o->all && (double)(splitmix(&seed) >> 11) * 0x1p-53 * (double)(total - t) >= (double)(want - m))
                continue;
            v[m].shard = (uint32_t)s;
            v[m].doc = d;
            tks_shard_prov(sh, d, &v[m].p);
            m++;
        }
    }
    qsort(v, m, sizeof *v, cmp_item);
    for (size_t i = 0; i < m; i++) v[i].order = i;
    *out = v;
    *n_out = m;
    return 0;
}

/* Path of input f as the manifest names it (a name that is not UTF-8 is
 * stored with \xNN escapes and doubled backslashes: tks_json_path). */
static void input_path(json_t *in, char *out, size_t cap) {
    const char *p = json_string_value(json_object_get(in, "path"));
    snprintf(out, cap, "%s", p ? p : "");
    struct stat st;
    if (!p || !strchr(p, '\\') || stat(p, &st) == 0) return;
    size_t o = 0;
    for (size_t i = 0; p[i] && o + 1 < cap; i++) {
        unsigned v;
        if (p[i] == '\\' && p[i + 1] == '\\') out[o++] = '\\', i++;
        else if (p[i] == '\\' && p[i + 1] == 'x' && sscanf(p + i + 2, "%2x", &v) == 1) out[o++] = (char)v, i += 3;
        else out[o++] = p[i];
    }
    out[o] = 0;
}

/* The part of input `in` the build hashed that holds place (entry, offset):
 * *whole, or [*start, *end) (bytes, or row groups), and its recorded hash
 * hx (32 hex digits); 0 when the manifest records none. */
static int recorded_part(json_t *in, const tks_doc_prov *p, int *whole, uint64_t *start, uint64_t *end,
                         const char **hx) {
    *whole = 0;
    *start = *end = 0;
    if ((*hx = json_string_value(json_object_get(in, "xxh3_128")))) return *whole = 1;
    json_t *parts = json_object_get(in, "pieces"), *g;
    int rows = !parts;
    if (rows) parts = json_object_get(in, "row_group_hashes");
    size_t i;
    json_array_foreach(parts, i, g) {
        uint64_t a = (uint64_t)json_integer_value(json_object_get(g, rows ? "first" : "start"));
        uint64_t b = (uint64_t)json_integer_value(json_object_get(g, "end"));
        uint64_t at = rows ? p->entry : p->offset;
        if (at >= a && at < b && (*hx = json_string_value(json_object_get(g, "xxh3_128")))) {
            *start = a, *end = b;
            return 1;
        }
    }
    return 0;
}

/* Documents it[0..n) whose source no longer holds them: one problem (at the
 * first of them), n counted and skipped. */
static void changed_n(audit *a, const item *it, size_t n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void changed_n(audit *a, const item *it, size_t n, const char *path, const char *fmt, ...) {
    char msg[300], which[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    a->st->changed += n;
    if (n == 1)
        snprintf(which, sizeof which, "document %llu of shard %u skipped", (unsigned long long)it->doc, it->shard);
    else
        snprintf(which, sizeof which, "the %zu sampled documents it holds skipped (the first: document %llu of shard %u)",
                 n, (unsigned long long)it->doc, it->shard);
    tks_audit_report_add(a->r, a->cap, it->order, TKS_ERR_INPUT, path, it->shard, TKS_NONE, TKS_NONE, TKS_NONE,
                         it->doc, "source changed: %s; %s", msg, which);
}
#define changed(a, it, path, ...) changed_n(a, it, 1, path, __VA_ARGS__)

/* The first position where the shard's ids a[0..na) and the encoder's
 * b[0..nb) differ into *pos and the ids there (TKS_NO_ID past an end): 1, or
 * 0 when they are the same. */
static int first_diff(const uint32_t *a, uint64_t na, const uint32_t *b, uint64_t nb, uint64_t *pos, uint32_t *ia,
                      uint32_t *ib) {
    uint64_t i = 0, m = na < nb ? na : nb;
    while (i < m && a[i] == b[i]) i++;
    if (i == m && na == nb) return 0;
    *pos = i;
    *ia = i < na ? a[i] : TKS_NO_ID;
    *ib = i < nb ? b[i] : TKS_NO_ID;
    return 1;
}

/* Encodes t with BOS and EOS as the build added them. */
static int encode(const audit *a, const tks_tok *t, const char *text, size_t len, tks_ids *v) {
    uint64_t un = 0;
    int rc = tks_tok_encode_doc(t, text, len, v, &un);
    if (!rc) rc = tks__add_specials(v, &a->bo, tks_tok_bos_id(t), tks_tok_eos_id(t));
    return rc;
}

/* Pending document q encoded and compared with its shard's ids (any thread). */
static void encode_cmp(const audit *a, pending *q) {
    const tks_shard *sh = tks_dataset_shard(a->ds, q->it->shard);
    const uint64_t *idx = tks_shard_doc_index(sh);
    uint64_t d = q->it->doc, n = idx[d + 1] - idx[d];
    const char *text = a->arena + q->text_off;
    uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    tks_ids v = {0}, w = {0};
    int rc = ids ? tks_shard_read(sh, idx[d], n, UINT32_MAX, ids)
                 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = encode(a, a->tk, text, q->text_len, &v);
    if (!rc) q->differ = first_diff(ids, n, v.ids, v.n, &q->pos, &q->id_shard, &q->id_mine);
    if (!rc && a->ref && !(rc = encode(a, a->ref, text, q->text_len, &w)))
        q->ref_differ = first_diff(ids, n, w.ids, w.n, &q->ref_pos, &q->ref_shard, &q->ref_mine);
    q->n_shard = n;
    q->n_mine = v.n;
    q->rc = rc;
    if (rc) snprintf(q->err, sizeof q->err, "%.199s", tks_last_error()->message);
    free(ids);
    tks_ids_free(&v);
    tks_ids_free(&w);
}

static const char *id_text(uint32_t id, char *buf, size_t cap) {
    if (id == TKS_NO_ID) snprintf(buf, cap, "nothing (the document ends)");
    else snprintf(buf, cap, "%u", id);
    return buf;
}

/* A tokenizer problem of document it (in shard sh) at global token `token`
 * into the report, in the document's order. */
static void doc_problem(audit *a, const item *it, const tks_shard *sh, uint64_t token, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void doc_problem(audit *a, const item *it, const tks_shard *sh, uint64_t token, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tks_audit_report_vadd(a->r, a->cap, it->order, TKS_ERR_TOKENIZER, tks_shard_path(sh), it->shard, TKS_NONE, token,
                          TKS_NONE, it->doc, fmt, ap);
    va_end(ap);
}

/* The pending documents encoded (on every thread), compared and reported. */
static int flush(audit *a) {
    if (!a->n_pd) return 0;
    double t0 = now_s();
    long n = (long)a->n_pd;
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < n; i++) encode_cmp(a, &a->pd[i]);
    a->st->seconds_encode += now_s() - t0;
    for (size_t i = 0; i < a->n_pd; i++) {
        const pending *q = &a->pd[i];
        const item *it = q->it;
        const tks_shard *sh = tks_dataset_shard(a->ds, it->shard);
        uint64_t base = tks_shard_doc_index(sh)[it->doc];
        char x[40], y[40];
        if (q->rc) {
            a->st->ids_differ++;
            doc_problem(a, it, sh, base, "document %llu of shard %u, from %s: not compared: %s",
                        (unsigned long long)it->doc, it->shard, q->where, q->err);
            continue;
        }
        a->st->checked++;
        a->st->tokens += q->n_shard;
        if (q->differ) {
            a->st->ids_differ++;
            doc_problem(a, it, sh, base + q->pos,
                        "ids differ: document %llu of shard %u, from %s: first difference at id %llu of "
                        "%llu: the shard has %s, the tokenizer parsed from its file gives %s (%llu ids)",
                        (unsigned long long)it->doc, it->shard, q->where, (unsigned long long)q->pos,
                        (unsigned long long)q->n_shard, id_text(q->id_shard, x, sizeof x),
                        id_text(q->id_mine, y, sizeof y), (unsigned long long)q->n_mine);
        }
        if (a->ref) a->st->spm_checked++;
        if (a->ref && q->ref_differ) {
            a->st->spm_differ++;
            doc_problem(a, it, sh, base + q->ref_pos,
                        "ids differ from the sentencepiece library's: document %llu of shard %u, from %s: "
                        "first difference at id %llu: the shard has %s, sentencepiece gives %s",
                        (unsigned long long)it->doc, it->shard, q->where, (unsigned long long)q->ref_pos,
                        id_text(q->ref_shard, x, sizeof x), id_text(q->ref_mine, y, sizeof y));
        }
    }
    a->n_pd = 0;
    a->arena_len = 0;
    return 0;
}

/* Where the document is, for the report. */
static void describe(const tks_source *src, const char *source, const tks_doc_prov *p, char *out, size_t cap) {
    if (tks_source_kind(src) == TKS_SOURCE_PARQUET)
        snprintf(out, cap, "%.150s row group %u row %llu", source, p->entry, (unsigned long long)p->offset);
    else if (p->entry)
        snprintf(out, cap, "%.150s (member %u) byte %llu", source, p->entry, (unsigned long long)p->offset);
    else
        snprintf(out, cap, "%.150s byte %llu", source, (unsigned long long)p->offset);
}

/* Document x read from src, checked against its record and queued. */
static int read_one(audit *a, tks_source *src, const item *x, const char *path) {
    tks_doc doc;
    char why[300], where[200];
    double t0 = now_s();
    int r = tks_source_read(src, x->p.entry, x->p.offset, &doc, why, sizeof why);
    a->st->seconds_read += now_s() - t0;
    /* an archive's member by its name ("archive.tar.xz:member"), else the file */
    int member = r == 1 && x->p.entry && tks_source_kind(src) == TKS_SOURCE_STREAM;
    describe(src, member ? doc.source : path, &x->p, where, sizeof where);
    if (r < 0) {
        changed(a, x, path, "%s cannot be read at %s now (%s)", path, where, tks_last_error()->message);
        tks_clear_error();
        return 0;
    }
    if (r == 0) {
        changed(a, x, path, "%s: %s", where, why);
        return 0;
    }
    if ((uint32_t)XXH3_64bits(doc.text, doc.len) != x->p.text_xxh ||
        (x->p.length != UINT32_MAX && doc.raw_len != x->p.length)) {
        changed(a, x, path, "%s: the document there is not the text the build encoded (its length or XXH3 differs)",
                where);
        return 0;
    }
    if (a->arena_len + doc.len > a->arena_cap) {
        size_t cap = a->arena_len + doc.len > 2 * a->arena_cap ? a->arena_len + doc.len : 2 * a->arena_cap;
        char *p = realloc(a->arena, cap);
        if (!p) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory (%zu bytes of text)", cap);
        a->arena = p;
        a->arena_cap = cap;
    }
    if (!a->pd && !(a->pd = calloc(BATCH_DOCS, sizeof *a->pd)))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    pending *q = &a->pd[a->n_pd++];
    memset(q, 0, sizeof *q);
    q->it = x;
    q->text_off = a->arena_len;
    q->text_len = doc.len;
    snprintf(q->where, sizeof q->where, "%s", where);
    memcpy(a->arena + a->arena_len, doc.text, doc.len);
    a->arena_len += doc.len;
    a->st->bytes += doc.len;
    return a->n_pd == BATCH_DOCS || a->arena_len >= BATCH_BYTES ? flush(a) : 0;
}

/* Items it[i..) that lie in the same recorded part of their input as it[i]
 * (whole, [s0, s1)): the end of their run. */
static size_t part_end(json_t *in, const item *it, size_t i, size_t n, int whole, uint64_t s0, uint64_t s1) {
    size_t j = i + 1;
    for (int w; j < n; j++) {
        uint64_t a, b;
        const char *hx;
        if (!recorded_part(in, &it[j].p, &w, &a, &b, &hx) || w != whole || a != s0 || b != s1) break;
    }
    return j;
}

/* The documents it[0..n) of one input (this rank's, sorted by place): the
 * input compared with what the build recorded, part by part, then each
 * document read, checked and queued. */
static int audit_input(audit *a, const item *it, size_t n) {
    char path[4096];
    json_t *in = json_array_get(a->inputs, it[0].p.file);
    if (!in) {
        changed_n(a, it, n, "", "their provenance names input %u, which the manifest's provenance.inputs lacks",
                  it[0].p.file);
        return 0;
    }
    input_path(in, path, sizeof path);
    tks_source *src = NULL;
    uint64_t want = (uint64_t)json_integer_value(json_object_get(in, "bytes"));
    if (tks_source_open(path, &a->io, &src)) {
        changed_n(a, it, n, path, "%s cannot be read now (%s)%s", path, tks_last_error()->message,
                  path[0] == '/' ? "" : "; a relative path is taken from the directory the audit runs in: run it "
                                        "where the build ran");
        tks_clear_error();
        return 0;
    }
    a->st->inputs++;
    int rc = 0;
    uint64_t size = tks_source_size(src);
    if (size != want) {
        changed_n(a, it, n, path, "%s holds %llu bytes, the build read %llu", path, (unsigned long long)size,
                  (unsigned long long)want);
        tks_source_free(src);
        return 0;
    }
    for (size_t i = 0, j; i < n && !rc; i = j) {
        int whole;
        uint64_t s0, s1;
        const char *hx;
        j = i + 1;
        if (recorded_part(in, &it[i].p, &whole, &s0, &s1, &hx)) { /* hashed again before it is read */
            j = part_end(in, it, i, n, whole, s0, s1);
            uint8_t h[16];
            char now[33] = "", part[80] = "";
            double t0 = now_s();
            int hr = tks_source_hash(src, s0, s1, whole, h);
            a->st->seconds_hash += now_s() - t0;
            a->st->parts_hashed++;
            if (!whole)
                snprintf(part, sizeof part, tks_source_kind(src) == TKS_SOURCE_PARQUET ? " (row groups %llu to %llu)"
                                                                                        : " (bytes %llu to %llu)",
                         (unsigned long long)s0, (unsigned long long)s1);
            if (hr) {
                changed_n(a, it + i, j - i, path, "%s%s cannot be hashed now (%s)", path, part,
                          tks_last_error()->message);
                tks_clear_error();
                continue;
            }
            tks_hex(h, 16, now);
            if (strcmp(now, hx)) {
                changed_n(a, it + i, j - i, path, "the XXH3-128 of %s%s is %s, the build recorded %s", path, part,
                          now, hx);
                continue;
            }
        }
        for (size_t k = i; k < j && !rc; k++) rc = read_one(a, src, &it[k], path);
    }
    tks_source_free(src);
    return rc;
}

int tks_audit_source(const char *dir, const tks_source_audit_opts *o, tks_audit_report **report,
                     tks_source_audit_stats *st) {
    *report = NULL;
    memset(st, 0, sizeof *st);
    double t0 = now_s();
    audit a = {.o = o, .st = st, .cap = o->max_problems ? o->max_problems : 1000};
    int rc = tks_dataset_open(dir, &a.ds);
    if (rc) return rc;
    json_t *prov = NULL;
    item *v = NULL;
    size_t n = 0;
    if (tks_dataset_format_version(a.ds) < TKS_FORMAT_V2)
        rc = tks_fail(TKS_ERR_VERSION, dir, TKS_NONE, TKS_NONE,
                      "%s has no provenance: its shards are format version %u (an import, or a build by a "
                      "tokshard before format version 2), which do not record where each document came from. "
                      "--against-source needs a dataset built by this tokshard: build it again, or audit it "
                      "without --against-source", dir, tks_dataset_format_version(a.ds));
    if (!rc) rc = tks_dataset_provenance(a.ds, &prov);
    a.inputs = json_object_get(prov, "inputs");
    if (!rc && !json_is_array(a.inputs))
        rc = tks_fail(TKS_ERR_MANIFEST, dir, TKS_NONE, TKS_NONE,
                      "%s/manifest.json records no provenance.inputs: the inputs of its build are unknown, and "
                      "--against-source cannot read them", dir);
    if (!rc) read_options(&a, json_object_get(prov, "options"));
    if (!rc) rc = load_tokenizer(&a, o->tokenizer_path ? o->tokenizer_path : tks_dataset_tokenizer_path(a.ds));
    if (!rc) rc = choose(&a, &v, &n);
    if (!rc && !(a.r = calloc(1, sizeof *a.r))) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && !(a.r->problems = calloc(a.cap, sizeof *a.r->problems)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && o->rank == 0) check_tables(&a, prov); /* once, by rank 0 */
    if (!rc && o->threads > 0) omp_set_num_threads(o->threads);
    /* this rank's run of the sorted sample */
    unsigned parts = o->n_ranks ? o->n_ranks : 1;
    size_t lo = n * o->rank / parts, hi = n * (o->rank + 1) / parts;
    for (size_t i = lo; !rc && i < hi;) {
        size_t j = i;
        while (j < hi && v[j].p.file == v[i].p.file) j++;
        rc = audit_input(&a, v + i, j - i);
        i = j;
    }
    if (!rc) rc = flush(&a);
    if (!rc) {
        a.r->n_shards = tks_dataset_n_shards(a.ds);
        a.r->n_docs = st->checked;
        a.r->n_tokens = st->tokens;
        a.r->manifest_checked = 1;
        a.r->tokenizer_checked = 1;
    }
    st->seconds = now_s() - t0;
    if (a.r) a.r->seconds = st->seconds;
    free(v);
    free(a.pd);
    free(a.arena);
    json_decref(prov);
    tks_tok_free(a.tk);
    tks_tok_free(a.ref);
    tks_dataset_close(a.ds);
    if (rc) {
        tks_audit_report_free(a.r);
        return rc;
    }
    *report = a.r;
    return 0;
}
