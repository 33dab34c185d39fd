/* import.c - audit a foreign dataset in place, and import it as a tokshard
 * dataset (crash-safe and resumable like tokshard build). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "interop/internal.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------------------
 * Audit
 * ------------------------------------------------------------------------- */
/* 1 when id is in one of tok's reserved ranges. */
static int reserved(const tks_tokenizer_info *tok, uint32_t id) {
    for (uint32_t k = 0; tok && k < tok->n_reserved; k++)
        if (id >= tok->reserved[k][0] && id <= tok->reserved[k][1]) return 1;
    return 0;
}

int tks_foreign_audit(const char *path, const tks_foreign_opts *opts, uint32_t model_vocab,
                      const tks_tokenizer_info *tok, size_t max_problems, tks_audit_report **out) {
    *out = NULL;
    if (!path || !opts || model_vocab == 0)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE,
                        "auditing a foreign dataset needs --model-vocab N (the embedding size its ids must fit)");
    double t0 = omp_get_wtime();
    size_t cap = max_problems ? max_problems : 1000;
    tks_audit_report *r = calloc(1, sizeof *r);
    if (r) r->problems = calloc(cap, sizeof *r->problems);
    if (!r || !r->problems) {
        tks_audit_report_free(r);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    }
    tks__plist pl = {r, cap, 0};
    tks__foreign f;
    int rc = tks__foreign_open(path, opts, &pl, &f);
    if (rc) {
        tks__foreign_close(&f);
        tks_audit_report_free(r);
        return rc;
    }
    r->n_shards = 1;
    r->vocab_size = model_vocab;
    r->min_token_id = UINT32_MAX;
    int check_eod = opts->eod_id != TKS_NO_ID &&
                    (opts->format == TKS_FOREIGN_MEGATRON || opts->format == TKS_FOREIGN_DATATROVE);
    if (f.readable) {
        r->n_docs = f.n_docs;
        r->n_tokens = f.n_tokens;
        r->bytes_hashed = f.n_tokens * f.token_bytes;
        const char *dp = f.data_path;
        for (uint64_t d = 0; d < f.n_docs; d++) {
            uint64_t a = f.doc_start[d], b = f.doc_start[d + 1];
            if (a == b) {
                tks__problem(&pl, TKS_ERR_INDEX, f.index_path[0] ? f.index_path : dp, a,
                             f.tokens_offset + a * f.token_bytes, d,
                             "document %llu is empty: a trainer that samples documents may return "
                             "nothing for it; drop it (tokshard import skips it)",
                             (unsigned long long)d);
                continue;
            }
            int inside = 0; /* an id no text produces was reported for this document */
            for (uint64_t i = a; i < b; i++) {
                int64_t v = tks__foreign_token(&f, i);
                if (v >= 0 && v <= UINT32_MAX && !inside && reserved(tok, (uint32_t)v) &&
                    !(i == a && (uint32_t)v == tok->bos_id) && !(i == b - 1 && (uint32_t)v == tok->eos_id)) {
                    inside = 1;
                    tks__problem(&pl, TKS_ERR_TOKEN_RANGE, dp, i, f.tokens_offset + i * f.token_bytes, d,
                                 "id %lld at position %llu of document %llu is a special token (or no "
                                 "token) of %s, which no text produces there: the ids were not made by "
                                 "tokenizing text with special tokens left as text",
                                 (long long)v, (unsigned long long)(i - a), (unsigned long long)d, tok->file);
                }
                if (v < 0 || (uint64_t)v >= model_vocab) {
                    tks__problem(&pl, TKS_ERR_TOKEN_RANGE, dp, i, f.tokens_offset + i * f.token_bytes, d,
                                 "token id %lld at position %llu of document %llu is outside the "
                                 "model's vocabulary [0, %u): an embedding lookup would read out of "
                                 "bounds; re-tokenize with the model's tokenizer or fix --model-vocab",
                                 (long long)v, (unsigned long long)(i - a), (unsigned long long)d,
                                 model_vocab);
                    continue;
                }
                if ((uint32_t)v < r->min_token_id) r->min_token_id = (uint32_t)v;
                if ((uint32_t)v > r->max_token_id) r->max_token_id = (uint32_t)v;
            }
            if (check_eod && tks__foreign_token(&f, b - 1) != (int64_t)opts->eod_id)
                tks__problem(&pl, TKS_ERR_INDEX, dp, b - 1, f.tokens_offset + (b - 1) * f.token_bytes, d,
                             "document %llu ends with id %lld, not the EOD %u (preprocess_data.py "
                             "--append-eod puts it at every document end): documents would run "
                             "into each other when packed",
                             (unsigned long long)d, (long long)tks__foreign_token(&f, b - 1), opts->eod_id);
        }
    }
    if (r->min_token_id == UINT32_MAX) r->min_token_id = 0;
    tks__foreign_close(&f);
    r->seconds = omp_get_wtime() - t0;
    *out = r;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Import
 * ------------------------------------------------------------------------- */

/* The source files and every option that changes the output, as text: its
 * XXH3 is the import id a resume must match. Files are identified by path,
 * size and modification time (hashing a multi-GB .bin twice is what the
 * import is meant to avoid). */
static int import_id(const tks_import_opts *o, const tks__foreign *f, const uint8_t tok_fp[16],
                     uint32_t vocab, char id_hex[33]) {
    char text[3 * PATH_MAX + 512], fp[33];
    struct stat a = {0}, b = {0};
    stat(f->data_path, &a);
    if (f->index_path[0]) stat(f->index_path, &b);
    tks_hex(tok_fp, 16, fp);
    int n = snprintf(text, sizeof text,
                     "%s|%s|%lld|%lld|%s|%lld|%lld|%u|%u|%u|%s|%u|%llu|%u",
                     tks_foreign_format_name(o->foreign.format), f->data_path, (long long)a.st_size,
                     (long long)a.st_mtime, f->index_path, (long long)b.st_size, (long long)b.st_mtime,
                     f->token_bytes, o->foreign.eot_id, o->foreign.eod_id, fp, vocab,
                     (unsigned long long)(o->shard_tokens ? o->shard_tokens : (16u << 20)),
                     o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES);
    if (n < 0 || n >= (int)sizeof text)
        return tks_fail(TKS_ERR_ARG, o->src, TKS_NONE, TKS_NONE, "path too long: %s", o->src);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(text, (size_t)n));
    uint8_t h[16];
    memcpy(h, c.digest, 16);
    tks_hex(h, 16, id_hex);
    return 0;
}

/* The dataset's tokenizer record and file: a copy of the model, or a note
 * saying there is none. */
/* The ids below the vocabulary that are no token of tk (a tiktoken file's
 * gaps between its ranks and its special ids), as sorted inclusive ranges
 * into *gaps (malloc'd; NULL and 0 when there are none). */
static int no_token_ranges(const tks_tok *tk, uint32_t (**gaps)[2], size_t *n) {
    *gaps = NULL;
    *n = 0;
    size_t cap = 0;
    for (uint32_t id = 0, v = tks_tok_vocab_size(tk); id < v; id++) {
        if (tks_tok_is_token(tk, id)) continue;
        if (*n && (*gaps)[*n - 1][1] + 1 == id) {
            (*gaps)[*n - 1][1] = id;
            continue;
        }
        if (*n == cap && tks_resize(gaps, cap = cap ? 2 * cap : 8, sizeof **gaps))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        (*gaps)[*n][0] = (*gaps)[*n][1] = id;
        ++*n;
    }
    return 0;
}

static int setup_tokenizer(const tks_import_opts *o, const char *partial, tks_tokenizer_info *tok,
                           uint32_t (**gaps)[2], size_t *n_gaps) {
    memset(tok, 0, sizeof *tok);
    char dst[PATH_MAX];
    int rc;
    if (o->tokenizer_path) {
        tks_tok *tk = NULL;
        tks_tok_opts to = {.pattern = o->pattern, .special_tokens = o->special_tokens};
        if ((rc = tks_tok_load_opts(o->tokenizer_path, &to, &tk))) return rc;
        tks_tokenizer_record(tk, tok);
        rc = no_token_ranges(tk, gaps, n_gaps);
        if (rc) {
            tks_tok_free(tk);
            return rc;
        }
        if (o->vocab_size && o->vocab_size != tok->vocab_size)
            rc = tks_fail(TKS_ERR_TOKENIZER, o->tokenizer_path, TKS_NONE, TKS_NONE,
                          "--vocab-size %u disagrees with %s (vocab %u): drop --vocab-size",
                          o->vocab_size, o->tokenizer_path, tok->vocab_size);
        /* the tokenizer's files into the dataset, checked against the one in use */
        if (!rc) rc = tks_tok_save(tk, o->tokenizer_path, partial);
        if (!rc) rc = tks_partial_tokenizer(TKS_PARTIAL_IMPORT, partial, NULL, tks_tok_file_name(tk),
                                            tks_tok_fingerprint(tk));
        tks_tok_free(tk);
        return rc;
    }
    char note[256];
    int n = snprintf(note, sizeof note,
                     "no tokenizer: this dataset was imported with --vocab-size %u; ids are checked "
                     "against that vocabulary but cannot be decoded\n", o->vocab_size);
    snprintf(tok->file, sizeof tok->file, TKS_NO_TOKENIZER_NAME);
    snprintf(tok->model_type, sizeof tok->model_type, "none");
    tok->vocab_size = o->vocab_size;
    tok->bos_id = tok->eos_id = tok->pad_id = tok->unk_id = TKS_NO_ID;
    if ((rc = tks_path_join(dst, sizeof dst, partial, tok->file))) return rc;
    if ((rc = tks_write_file_atomic(dst, note, (size_t)n))) return rc;
    return tks_file_xxh3_128(dst, tok->fingerprint, NULL);
}

/* One import: what it holds while it runs. */
typedef struct import_run {
    const tks_import_opts *o;
    tks_import_stats *stats;
    char out[PATH_MAX], partial[PATH_MAX];
    tks__foreign f;
    tks_tokenizer_info tok;
    tks_partial_state st;
    tks_writer *w;
    uint32_t (*gaps)[2]; /* ids that are no token of the tokenizer (no_token_ranges) */
    size_t n_gaps;
} import_run;

/* OUT.partial, fresh or resumed, with its tokenizer file, and the writer. */
static int import_open(import_run *r) {
    const tks_import_opts *o = r->o;
    const char *partial = r->partial;
    char state_path[PATH_MAX];
    struct stat sb;
    int have_partial = stat(partial, &sb) == 0, rc = 0;
    if (have_partial && !o->resume)
        rc = tks_fail(TKS_ERR_EXISTS, partial, TKS_NONE, TKS_NONE,
                      "%s exists (an interrupted import): add --resume to continue it, or remove it",
                      partial);
    if (!rc && !have_partial) rc = tks_partial_create(partial);
    if (!rc) rc = setup_tokenizer(o, partial, &r->tok, &r->gaps, &r->n_gaps);
    if (!rc) rc = import_id(o, &r->f, r->tok.fingerprint, r->tok.vocab_size, r->st.id);
    if (!rc)
        rc = tks_path_join(state_path, sizeof state_path, partial,
                           tks_partial_state_name(TKS_PARTIAL_IMPORT));
    if (!rc && have_partial && access(state_path, F_OK) == 0) {
        rc = tks_partial_state_load(TKS_PARTIAL_IMPORT, partial, r->st.id, &r->st);
        if (!rc) tks_partial_clean(partial, r->st.n_shards, NULL);
        r->stats->resumed_shards = r->st.n_shards;
    } else if (!rc) {
        tks_partial_clean(partial, 0, NULL);
        rc = tks_partial_state_save(TKS_PARTIAL_IMPORT, partial, &r->st, NULL, 0);
    }
    if (rc) return rc;
    tks_writer_opts wo = {.dir = partial, .vocab_size = r->tok.vocab_size, .bos_id = r->tok.bos_id,
                          .eos_id = r->tok.eos_id, .pad_id = r->tok.pad_id,
                          .shard_tokens = o->shard_tokens ? o->shard_tokens : (16u << 20),
                          .chunk_bytes = o->chunk_bytes, .first_shard = (uint32_t)r->st.n_shards};
    memcpy(wo.tokenizer_fp, r->tok.fingerprint, 16);
    return tks_writer_create(&wo, &r->w);
}

/* Source document d, tokens [a, a + n), into buf as uint32 ids, each checked
 * against the vocabulary. */
static int import_doc(const import_run *r, uint64_t d, uint64_t a, uint64_t n, uint32_t *buf) {
    const tks__foreign *f = &r->f;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = tks__foreign_token(f, a + i);
        if (v < 0 || (uint64_t)v >= r->tok.vocab_size) {
            tks_fail(TKS_ERR_TOKEN_RANGE, f->data_path, TKS_NONE,
                     f->tokens_offset + (a + i) * f->token_bytes,
                     "%s: token id %lld at token offset %llu (byte %llu, position %llu of "
                     "document %llu) is outside the vocabulary [0, %u) of %s: the data was "
                     "tokenized with another tokenizer; nothing was imported past it "
                     "(`tokshard audit --format %s` lists every such id)",
                     f->data_path, (long long)v, (unsigned long long)(a + i),
                     (unsigned long long)(f->tokens_offset + (a + i) * f->token_bytes),
                     (unsigned long long)i, (unsigned long long)d, r->tok.vocab_size,
                     r->o->tokenizer_path ? r->o->tokenizer_path : "--vocab-size",
                     tks_foreign_format_name(r->o->foreign.format));
            tks_error_set_doc(d, 0);
            return TKS_ERR_TOKEN_RANGE;
        }
        size_t lo = 0, hi = r->n_gaps; /* the gap range holding v, if any */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (r->gaps[mid][1] < (uint64_t)v) lo = mid + 1;
            else hi = mid;
        }
        if (lo < r->n_gaps && r->gaps[lo][0] <= (uint64_t)v) {
            tks_fail(TKS_ERR_TOKEN_RANGE, f->data_path, TKS_NONE, f->tokens_offset + (a + i) * f->token_bytes,
                     "%s: token id %lld at token offset %llu (position %llu of document %llu) is no token of %s "
                     "(ids %u-%u lie between its ranks and its special tokens): the data was tokenized with "
                     "another tokenizer; nothing was imported past it (`tokshard audit --format %s` with "
                     "--tokenizer lists every such id)",
                     f->data_path, (long long)v, (unsigned long long)(a + i), (unsigned long long)i,
                     (unsigned long long)d, r->o->tokenizer_path, r->gaps[lo][0], r->gaps[lo][1],
                     tks_foreign_format_name(r->o->foreign.format));
            tks_error_set_doc(d, 0);
            return TKS_ERR_TOKEN_RANGE;
        }
        buf[i] = (uint32_t)v;
    }
    return 0;
}

/* Every source document not in a kept shard, in order, into shards; the
 * state is saved after each shard. */
static int import_docs(import_run *r) {
    const tks__foreign *f = &r->f;
    uint32_t *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint64_t d = 0; !rc && d < f->n_docs; d++) {
        uint64_t a = f->doc_start[d], n = f->doc_start[d + 1] - a;
        if (n == 0) {
            r->stats->empty_skipped++;
            continue;
        }
        if (d < r->st.next) continue;
        if (r->o->stop && *r->o->stop) {
            rc = tks_fail(TKS_ERR_INTERRUPTED, r->partial, TKS_NONE, TKS_NONE,
                          "interrupted: %s keeps the shards published so far; run the same "
                          "command with --resume to continue", r->partial);
            break;
        }
        if (n > cap) {
            free(buf);
            cap = n;
            buf = malloc(cap * sizeof *buf);
            if (!buf) {
                rc = tks_fail(TKS_ERR_NOMEM, f->data_path, TKS_NONE, TKS_NONE,
                              "out of memory for document %llu (%llu tokens)", (unsigned long long)d,
                              (unsigned long long)n);
                break;
            }
        }
        int published = 0;
        rc = import_doc(r, d, a, n, buf);
        if (!rc) rc = tks_writer_add(r->w, buf, n, d, &published);
        if (!rc && published) { /* this writer's shards follow the kept ones */
            size_t ns;
            const tks_shard_info *si = tks_writer_shards(r->w, &ns);
            r->st.next = d + 1;
            rc = tks_partial_state_push(&r->st, &si[ns - 1], r->st.next);
            if (!rc) rc = tks_partial_state_save(TKS_PARTIAL_IMPORT, r->partial, &r->st, NULL, 0);
        }
    }
    free(buf);
    return rc;
}

/* The last shard, the manifest (with the source as provenance), the totals
 * and OUT published. */
static int import_finish(import_run *r) {
    const tks_import_opts *o = r->o;
    const tks__foreign *f = &r->f;
    int rc = tks_writer_flush(r->w);
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(r->w, &ns);
    if (!rc && ns && (size_t)si[ns - 1].index + 1 > r->st.n_shards) { /* the last one, by the flush */
        r->st.next = f->n_docs;
        rc = tks_partial_state_push(&r->st, &si[ns - 1], f->n_docs);
        /* recorded: a run stopped from here on (or a publish refused) resumes to publishing */
        if (!rc) rc = tks_partial_state_save(TKS_PARTIAL_IMPORT, r->partial, &r->st, NULL, 0);
    }
    if (!rc && r->st.n_shards == 0)
        rc = tks_fail(TKS_ERR_ARG, o->src, TKS_NONE, TKS_NONE, "%s holds no tokens: nothing to import",
                      o->src);
    if (rc) return rc;
    json_t *prov = json_pack("{s:s, s:s, s:s, s:s?, s:I, s:I, s:I}", "tool",
                             "tokshard " TKS_VERSION_STRING, "imported_from",
                             tks_foreign_format_name(o->foreign.format), "data", f->data_path,
                             "index", f->index_path[0] ? f->index_path : NULL, "source_docs",
                             (json_int_t)f->n_docs, "empty_skipped", (json_int_t)f->empty_docs,
                             "source_tokens", (json_int_t)f->n_tokens);
    char *pj = json_dumps(prov, JSON_COMPACT);
    json_decref(prov);
    rc = tks_partial_write_manifest(r->partial, &r->tok, r->st.shards, r->st.n_shards, o->chunk_bytes, pj);
    free(pj);
    tks_shard_totals t;
    tks_shard_totals_of(r->st.shards, r->st.n_shards, &t);
    r->stats->vocab_size = r->tok.vocab_size;
    r->stats->docs_written = t.docs;
    r->stats->tokens_written = t.tokens;
    r->stats->min_token_id = t.min_token_id;
    r->stats->max_token_id = t.max_token_id;
    r->stats->shards = r->st.n_shards;
    return rc ? rc : tks_partial_publish(TKS_PARTIAL_IMPORT, r->partial, r->out);
}

int tks_import(const tks_import_opts *o, tks_import_stats *stats) {
    double t0 = omp_get_wtime();
    tks_import_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!o || !o->src || !o->out_dir || !*o->out_dir || (!o->tokenizer_path && !o->vocab_size))
        return tks_fail(TKS_ERR_ARG, o ? o->src : NULL, TKS_NONE, TKS_NONE,
                        "import needs a source, --output DIR and --tokenizer MODEL or --vocab-size N");
    import_run *r = calloc(1, sizeof *r);
    if (!r) return tks_fail(TKS_ERR_NOMEM, o->src, TKS_NONE, TKS_NONE, "out of memory");
    r->o = o;
    r->stats = stats;
    int rc = tks_partial_paths(TKS_PARTIAL_IMPORT, o->out_dir, r->out, r->partial, sizeof r->out);
    if (!rc) rc = tks_partial_check_out(r->out);
    if (rc) {
        free(r);
        return rc;
    }
    tks__plist pl = {NULL, 0, 1};
    rc = tks__foreign_open(o->src, &o->foreign, &pl, &r->f);
    if (!rc) rc = import_open(r);
    stats->docs_read = r->f.n_docs;
    stats->continued_first = r->f.continued_first;
    if (!rc) rc = import_docs(r);
    if (!rc) rc = import_finish(r);
    tks_writer_free(r->w);
    free(r->gaps);
    tks_partial_state_free(&r->st);
    tks__foreign_close(&r->f);
    free(r);
    stats->seconds = omp_get_wtime() - t0;
    return rc;
}
