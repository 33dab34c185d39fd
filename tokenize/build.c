/* build.c - the dataset build pipeline.
 *
 *   inputs --(tks_input, sequential, on a reader thread)--> batch of documents
 *          --(OpenMP, dynamic, longest first)--> ids per document
 *          --(in document order)--> tks_writer --> shards
 *
 * The reader thread reads batch k+1 while batch k is encoded and committed
 * (prefetch below), so decompression overlaps tokenization.
 *
 * Output depends only on the document sequence, so it is byte-identical for
 * any thread count. Work happens in OUT.partial/: each shard is published
 * there by rename, then build-state.json records the shards and the ordinal
 * of the first document of the next shard. --resume re-reads the inputs,
 * skips (without tokenizing) the documents already in shards, and continues;
 * the result is byte-identical to an uninterrupted build. OUT.partial becomes
 * OUT by one rename after manifest.json is written. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../dataset/dataset.h"
#include "tokenize.h"

#define TOKENIZER_NAME "tokenizer.model"
#define PLAIN_NAME "plain-state.json" /* a plain state being resumed by work units */

void tks_build_opts_default(tks_build_opts *o) {
    memset(o, 0, sizeof *o);
    tks_input_opts_default(&o->input);
}

static const char *split_name(tks_doc_split s) {
    return s == TKS_SPLIT_LINE ? "line" : s == TKS_SPLIT_BLANK ? "blank-line" : "file";
}
static const char *format_name(tks_input_format f) {
    return f == TKS_FMT_TEXT ? "text" : f == TKS_FMT_JSONL ? "jsonl" : "auto";
}
static const char *policy_name(tks_policy p) {
    return p == TKS_POLICY_SKIP ? "skip" : p == TKS_POLICY_FAIL ? "fail" : "replace";
}

static const size_t *g_sort_len;
static int by_len_desc(const void *a, const void *b);

typedef struct batch {
    char *arena;           /* document bytes, back to back */
    size_t arena_len, arena_cap;
    size_t *off, *len;     /* per document */
    uint64_t *ordinal;
    size_t *order;         /* documents sorted by length, longest first */
    tks_ids *ids;          /* per document, reused across batches */
    int *err;              /* per document: 0 or a TKS_ERR_* */
    unsigned char *uend;   /* per document: 1 when it is the last of its work unit */
    size_t n, cap;
    /* set by the reader with the batch */
    int end;               /* the input (or the work unit) ends with this batch */
    uint64_t docs_seen;    /* documents read so far, this batch's included */
    uint64_t text_seen;    /* their text bytes */
    tks_input_stats input; /* the input's counters after this batch */
} batch;

static int batch_push(batch *b, const tks_doc *d, int unit_end) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        if (tks_resize(&b->off, cap, sizeof *b->off) || tks_resize(&b->len, cap, sizeof *b->len) ||
            tks_resize(&b->ordinal, cap, sizeof *b->ordinal) ||
            tks_resize(&b->order, cap, sizeof *b->order) || tks_resize(&b->err, cap, sizeof *b->err) ||
            tks_resize(&b->uend, cap, sizeof *b->uend) || tks_resize(&b->ids, cap, sizeof *b->ids))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        memset(b->ids + b->cap, 0, (cap - b->cap) * sizeof *b->ids);
        b->cap = cap;
    }
    if (b->arena_len + d->len > b->arena_cap) {
        size_t cap = b->arena_cap ? b->arena_cap : (1u << 20);
        while (cap < b->arena_len + d->len) cap *= 2;
        char *a = realloc(b->arena, cap);
        if (!a) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch)");
        b->arena = a;
        b->arena_cap = cap;
    }
    memcpy(b->arena + b->arena_len, d->text, d->len);
    b->off[b->n] = b->arena_len;
    b->len[b->n] = d->len;
    b->ordinal[b->n] = d->ordinal;
    b->uend[b->n] = (unsigned char)unit_end;
    b->arena_len += d->len;
    b->n++;
    return 0;
}

static void batch_free(batch *b) {
    for (size_t i = 0; i < b->cap; i++) tks_ids_free(&b->ids[i]);
    free(b->arena);
    free(b->off);
    free(b->len);
    free(b->ordinal);
    free(b->order);
    free(b->ids);
    free(b->err);
    free(b->uend);
}

/* Prefetch: reading (decompression, libarchive, the document split) is one
 * core's sequential work, a third of a build of the Linux tarball, so the
 * next batch is read on a thread of its own while the caller encodes and
 * commits the current one. One thread per batch (a few hundred per GiB of
 * text; their start is noise): between prefetch_take and the next
 * prefetch_start no reader runs, so the caller may use the input then and
 * the input is never used by two threads at once. The output is unchanged:
 * batches are taken in order. */
typedef struct reader reader;
static int fill_batch(reader *r, batch *b);
typedef struct prefetch {
    batch slot[2];
    int next;      /* the slot the reader fills; the caller holds the other */
    int running;   /* a reader thread to join */
    pthread_t th;
    reader *r;
    int rc;        /* the reader's result, and its error (errors are per thread) */
    tks_error err;
} prefetch;

static void *prefetch_main(void *arg) {
    prefetch *p = arg;
    batch *b = &p->slot[p->next];
    b->n = 0;
    b->arena_len = 0;
    b->end = 0;
    p->rc = fill_batch(p->r, b);
    if (p->rc) p->err = *tks_last_error();
    return NULL;
}

/* Starts reading the next batch; without a thread (pthread_create failed)
 * it is read here. */
static void prefetch_start(prefetch *p) {
    p->rc = 0;
    if (pthread_create(&p->th, NULL, prefetch_main, p) == 0)
        p->running = 1;
    else
        prefetch_main(p);
}

/* Waits for the batch prefetch_start began: 0 and *out, or the reader's
 * error (restored on this thread). *out stays the caller's until the next
 * prefetch_take. */
static int prefetch_take(prefetch *p, batch **out) {
    if (p->running) pthread_join(p->th, NULL);
    p->running = 0;
    if (p->rc) {
        tks_error_restore(&p->err);
        return p->rc;
    }
    *out = &p->slot[p->next];
    p->next ^= 1;
    return 0;
}

/* Called by the caller once a batch is committed, before the next
 * prefetch_take: what the batch grew is freed now, not when the slot is
 * refilled. A slot keeps, for its next batch, id buffers of up to 64 KiB
 * each and batch_bytes in all, and an arena of up to twice batch_bytes.
 * A bound per buffer alone is not enough: each of the thousands of
 * documents of a batch then keeps the largest buffer its index ever held,
 * and RSS grows through the whole build (to 513 MiB on the Linux tarball
 * with two slots; 548 MiB with no bound at all). */
static void batch_trim(batch *b, size_t batch_bytes) {
    size_t kept = 0;
    for (size_t i = 0; i < b->cap; i++) {
        size_t bytes = b->ids[i].cap * sizeof(uint32_t);
        if (!bytes) continue;
        if (bytes <= (64u << 10) && kept + bytes <= batch_bytes)
            kept += bytes;
        else
            tks_ids_free(&b->ids[i]);
    }
    if (b->arena_cap > 2 * batch_bytes) {
        free(b->arena);
        b->arena = NULL;
        b->arena_cap = 0;
    }
    b->n = 0;
    b->arena_len = 0;
}

/* Joins a reader still running (after an error or an interrupt) and frees
 * both batches. */
static void prefetch_free(prefetch *p) {
    if (p->running) pthread_join(p->th, NULL);
    p->running = 0;
    batch_free(&p->slot[0]);
    batch_free(&p->slot[1]);
}

/* The reader: documents in order, into one batch per call (fill_batch).
 * A whole build reads to the end, marks the last document of each work unit
 * (unit_bytes) and skips, unbatched, the documents already in resumed shards
 * (ordinal below skip_below; they still count towards their unit). A work
 * unit reads its `want` documents from where it starts. */
typedef struct reader {
    tks_input *in;
    size_t batch_bytes;
    uint64_t want;               /* documents to read, or UINT64_MAX: to the end */
    uint64_t unit_bytes;         /* > 0: mark each work unit's last document */
    uint64_t skip_below;
    uint64_t unit_acc, docs_read, text;
    volatile sig_atomic_t *stop; /* an interrupt ends the batch early (it is not used) */
} reader;

static int fill_batch(reader *r, batch *b) {
    tks_doc doc;
    int rc = 0;
    while (!rc && b->arena_len < r->batch_bytes && r->docs_read < r->want && !(r->stop && *r->stop)) {
        int got = tks_input_next(r->in, &doc);
        if (got < 0) return got;
        if (got == 0) {
            b->end = 1; /* a unit that ends early: the caller names the missing documents */
            break;
        }
        r->docs_read++;
        r->text += doc.len;
        int unit_end = 0;
        if (r->unit_bytes) {
            r->unit_acc += doc.len;
            unit_end = r->unit_acc >= r->unit_bytes;
            if (unit_end) r->unit_acc = 0;
        }
        if (doc.ordinal < r->skip_below) continue;
        rc = batch_push(b, &doc, unit_end);
    }
    if (r->docs_read >= r->want) b->end = 1;
    b->docs_seen = r->docs_read;
    b->text_seen = r->text;
    b->input = *tks_input_get_stats(r->in);
    return rc;
}

/* Tokenizes the batch in parallel, longest documents first. 0 or the first
 * error (its context restored). */
static int encode_batch(tks_spm *spm, batch *b, int threads) {
    /* longest documents first when one could keep a thread busy after the
     * others finish, else in order and in runs of documents (the sort, the
     * scattered reads it causes and one hand-off per document cost 5-8% of a
     * build of short lines) */
    size_t longest = 0, per = 1;
    for (size_t i = 0; i < b->n; i++) {
        b->order[i] = i;
        longest = b->len[i] > longest ? b->len[i] : longest;
    }
    if (longest > (64u << 10)) {
        g_sort_len = b->len;
        qsort(b->order, b->n, sizeof *b->order, by_len_desc);
    } else {
        per = b->n / ((size_t)threads * 64) + 1;
    }
    tks_error first_err = {0};
    int any_err = 0;
#pragma omp parallel for schedule(dynamic, per) num_threads(threads)
    for (size_t k = 0; k < b->n; k++) {
        size_t i = b->order[k];
        int e = tks_spm_encode(spm, b->arena + b->off[i], b->len[i], &b->ids[i]);
        b->err[i] = e;
        if (e) {
#pragma omp critical(tks_build_err)
            if (!any_err) {
                any_err = 1;
                first_err = *tks_last_error();
            }
        }
    }
    if (!any_err) return 0;
    tks_error_restore(&first_err);
    return first_err.code ? first_err.code : TKS_ERR_TOKENIZER;
}

/* Adds BOS/EOS as asked. 0 or TKS_ERR_NOMEM. */
static int add_specials(tks_ids *v, const tks_build_opts *o, uint32_t bos, uint32_t eos) {
    if (!o->prepend_bos && !o->append_eos) return 0;
    size_t need = v->n + 2;
    if (v->cap < need) {
        uint32_t *p = realloc(v->ids, need * sizeof *p);
        if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        v->ids = p;
        v->cap = need;
    }
    if (o->prepend_bos) {
        memmove(v->ids + 1, v->ids, v->n * sizeof *v->ids);
        v->ids[0] = bos;
        v->n++;
    }
    if (o->append_eos) v->ids[v->n++] = eos;
    return 0;
}

static int by_len_desc(const void *a, const void *b) {
    size_t x = g_sort_len[*(const size_t *)a], y = g_sort_len[*(const size_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The resume state (dataset layer, TKS_PARTIAL_BUILD) and the input whose
 * finished files' hashes go into it. */
typedef struct build_state {
    tks_partial_state p;
    const tks_input *in;
    size_t n_checked;               /* inputs of p.was compared with the ones read again */
} build_state;

/* Saves the state with the inputs finished so far; after a resume, those the
 * interrupted build had finished count too until they are read again. */
static int save_state(const char *partial, const build_state *st) {
    size_t n = st->in ? tks_input_n_files(st->in) : 0;
    if (n < st->p.n_was) n = st->p.n_was;
    char (*hashes)[33] = calloc(n ? n : 1, sizeof *hashes);
    if (!hashes) return tks_fail(TKS_ERR_NOMEM, partial, TKS_NONE, TKS_NONE, "out of memory");
    uint8_t h[16];
    size_t k = 0;
    for (; k < n; k++) {
        if (st->in && tks_input_file_xxh3(st->in, k, h, NULL) == 0) tks_hex(h, 16, hashes[k]);
        else if (k < st->p.n_was) snprintf(hashes[k], sizeof hashes[k], "%s", st->p.was[k]);
        else break;
    }
    tks_clear_error(); /* the first unfinished input ends the list: not an error */
    int rc = tks_partial_state_save(TKS_PARTIAL_BUILD, partial, &st->p, (const char(*)[33])hashes, k);
    free(hashes);
    return rc;
}

/* A resumed build reads its inputs again: each input the interrupted build
 * had finished must hash as it did then, or the kept shards came from other
 * bytes. Compares the inputs finished since the last call. */
static int verify_inputs(build_state *st, const char *partial) {
    uint8_t h[16];
    char hx[33];
    for (; st->n_checked < st->p.n_was; st->n_checked++) {
        size_t i = st->n_checked;
        if (tks_input_file_xxh3(st->in, i, h, NULL) != 0) {
            tks_clear_error();
            return 0; /* not read to its end yet */
        }
        tks_hex(h, 16, hx);
        if (strcmp(hx, st->p.was[i]) != 0)
            return tks_fail(TKS_ERR_RESUME, tks_input_file(st->in, i), TKS_NONE, TKS_NONE,
                            "cannot resume: %s changed since the interrupted build (XXH3-128 %s, "
                            "was %s), so the shards kept in %s came from other bytes; remove %s "
                            "and build again",
                            tks_input_file(st->in, i), hx, st->p.was[i], partial, partial);
    }
    return 0;
}

/* Inputs and every option that changes the output, as JSON (the manifest's
 * provenance). The inputs' XXH3-128 are added when they have been read
 * (add_input_hashes): each input is read once. */
static json_t *describe(const tks_build_opts *o, tks_input *in, const tks_spm *spm, int *rc) {
    *rc = 0;
    json_t *inputs = json_array();
    for (size_t i = 0; i < tks_input_n_files(in); i++)
        json_array_append_new(inputs, json_pack("{s:s, s:I}", "path", tks_input_file(in, i),
                                                "bytes", (json_int_t)tks_input_file_size(in, i)));
    char fp[33];
    tks_hex(tks_spm_fingerprint(spm), 16, fp);
    json_t *opt = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:b, s:b, s:I, s:I, s:I}", "tokenizer_fingerprint", fp,
        "doc_split", split_name(o->input.split), "format", format_name(o->input.format), "jsonl_key",
        o->input.jsonl_key ? o->input.jsonl_key : "text", "invalid_utf8",
        policy_name(o->input.invalid_utf8), "max_doc_bytes",
        (json_int_t)(o->input.max_doc_bytes ? o->input.max_doc_bytes : (64u << 20)), "on_long_doc",
        policy_name(o->input.long_doc), "on_bad_record", policy_name(o->input.bad_record),
        "append_eos", o->append_eos, "prepend_bos", o->prepend_bos, "unit_bytes",
        (json_int_t)(o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES), "shard_tokens",
        (json_int_t)(o->shard_tokens ? o->shard_tokens : (16u << 20)), "chunk_bytes",
        (json_int_t)(o->chunk_bytes ? o->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES));
    json_t *d = json_pack("{s:s, s:o, s:o}", "tool", "tokshard " TKS_VERSION_STRING, "inputs", inputs,
                          "options", opt);
    if (d && o->input.bad_input == TKS_POLICY_SKIP) { /* absent by default: ids of earlier builds kept */
        json_object_set_new(opt, "on_bad_input", json_string("skip"));
        json_t *sk = json_array();
        for (size_t i = 0; tks_input_skipped_file(in, i); i++)
            json_array_append_new(sk, json_string(tks_input_skipped_file(in, i)));
        json_object_set_new(d, "skipped_inputs", sk);
    }
    return d;
}

/* The build id: XXH3-64 of the description and each input's modification
 * time, so that a resume with edited inputs is refused at once (and one whose
 * edit kept size and time is caught by verify_inputs). */
static int build_id(json_t *desc, tks_input *in, char out[17]) {
    json_t *mt = json_array();
    for (size_t i = 0; i < tks_input_n_files(in); i++) {
        struct stat sb;
        if (stat(tks_input_file(in, i), &sb) != 0) {
            json_decref(mt);
            return tks_fail(TKS_ERR_IO, tks_input_file(in, i), TKS_NONE, TKS_NONE,
                            "cannot stat %s: %s", tks_input_file(in, i), strerror(errno));
        }
        json_array_append_new(mt, json_integer((json_int_t)sb.st_mtim.tv_sec * 1000000000 +
                                               sb.st_mtim.tv_nsec));
    }
    json_t *idm = json_pack("{s:O, s:o}", "description", desc, "mtime_ns", mt);
    char *text = idm ? json_dumps(idm, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(idm);
    if (!text) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits(text, strlen(text)));
    free(text);
    return 0;
}

/* Each input's XXH3-128 into the description, once all are read. */
static int add_input_hashes(json_t *desc, const tks_input *in) {
    json_t *inputs = json_object_get(desc, "inputs");
    for (size_t i = 0; i < tks_input_n_files(in); i++) {
        uint8_t h[16];
        char hx[33];
        int rc = tks_input_file_xxh3(in, i, h, NULL);
        if (rc) return rc;
        tks_hex(h, 16, hx);
        json_object_set_new(json_array_get(inputs, i), "xxh3_128", json_string(hx));
    }
    return 0;
}

/* The dataset's totals into *stats and the manifest (with the description,
 * its inputs' hashes already in, as provenance) into `partial`. */
static int write_manifest(const tks_build_opts *o, const char *partial, const tks_spm *spm,
                          json_t *desc, const tks_input_stats *input, const tks_shard_info *shards,
                          size_t n_shards, uint64_t empty_after_tokenize, tks_build_stats *stats) {
    tks_shard_totals t;
    tks_shard_totals_of(shards, n_shards, &t);
    stats->input = *input;
    stats->shards = n_shards;
    stats->docs_written = t.docs;
    stats->tokens_written = t.tokens;
    stats->min_token_id = t.min_token_id;
    stats->max_token_id = t.max_token_id;
    stats->empty_after_tokenize = empty_after_tokenize;
    stats->vocab_size = tks_spm_vocab_size(spm);
    json_t *sk = json_object_get(desc, "skipped_inputs");
    size_t nsk = json_array_size(sk), used = 0;
    stats->skipped_inputs[0] = 0;
    for (size_t i = 0; i < nsk; i++) {
        const char *s = json_string_value(json_array_get(sk, i));
        size_t room = sizeof stats->skipped_inputs - used;
        if (strlen(s) + 1 + 64 > room) {
            snprintf(stats->skipped_inputs + used, room, "... and %zu more (the manifest's "
                     "provenance.skipped_inputs lists every one)\n", nsk - i);
            break;
        }
        used += (size_t)snprintf(stats->skipped_inputs + used, room, "%s\n", s);
    }
    const tks_input_stats *is = &stats->input;
    json_object_set_new(desc, "stats",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                                  "documents", (json_int_t)stats->docs_written, "tokens",
                                  (json_int_t)stats->tokens_written, "bytes_text",
                                  (json_int_t)is->bytes_text, "empty_skipped",
                                  (json_int_t)is->empty_skipped, "empty_after_tokenize",
                                  (json_int_t)stats->empty_after_tokenize, "utf8_invalid_docs",
                                  (json_int_t)is->utf8_invalid_docs, "utf8_replaced",
                                  (json_int_t)is->utf8_replaced, "utf8_skipped",
                                  (json_int_t)is->utf8_skipped, "long_skipped",
                                  (json_int_t)is->long_skipped, "bad_records_skipped",
                                  (json_int_t)is->bad_records_skipped, "binary_skipped",
                                  (json_int_t)is->binary_skipped));
    char *prov = json_dumps(desc, JSON_COMPACT);
    tks_tokenizer_info tok;
    tks_tokenizer_record(spm, &tok);
    int rc = prov ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_partial_write_manifest(partial, &tok, shards, n_shards, o->chunk_bytes, prov);
    free(prov);
    return rc;
}

void tks_tokenizer_record(const tks_spm *spm, tks_tokenizer_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->file, sizeof out->file, "%s", TOKENIZER_NAME);
    memcpy(out->fingerprint, tks_spm_fingerprint(spm), 16);
    out->vocab_size = tks_spm_vocab_size(spm);
    snprintf(out->model_type, sizeof out->model_type, "%s", tks_spm_model_type(spm));
    out->bos_id = tks_spm_bos_id(spm);
    out->eos_id = tks_spm_eos_id(spm);
    out->pad_id = tks_spm_pad_id(spm);
    out->unk_id = tks_spm_unk_id(spm);
}

static int build_units_here(const tks_build_opts *o, tks_build_stats *stats);
static int partial_is_units(const char *out_dir);

/* The build's inputs, with the build's stop flag for waits on a pipe
 * (unless the input options bring their own). */
static int open_inputs(const tks_build_opts *o, tks_input **in) {
    tks_input_opts io = o->input;
    if (!io.stop) io.stop = o->stop;
    return tks_input_open(o->inputs, o->n_inputs, &io, in);
}

/* TKS_ERR_INPUT for inputs that gave no document with a token, saying what
 * was read and what each policy left out. */
static int no_text(const tks_input_stats *is) {
    return tks_fail(TKS_ERR_INPUT, NULL, TKS_NONE, TKS_NONE,
                    "the inputs hold no document with text: %llu files, %llu entries, %llu "
                    "documents kept; left out: %llu empty, %llu invalid UTF-8 (--invalid-utf8), "
                    "%llu too long (--max-doc-bytes), %llu bad JSONL records, %llu binary, %llu "
                    "bad inputs. Check the paths, --doc-split, --jsonl-key and those policies",
                    (unsigned long long)is->files, (unsigned long long)is->entries,
                    (unsigned long long)is->docs, (unsigned long long)is->empty_skipped,
                    (unsigned long long)is->utf8_skipped, (unsigned long long)is->long_skipped,
                    (unsigned long long)is->bad_records_skipped,
                    (unsigned long long)is->binary_skipped, (unsigned long long)is->bad_inputs_skipped);
}

/* 1 when `a` is `b` or lies under directory `b` (both canonical). */
static int path_within(const char *a, const char *b) {
    size_t n = strlen(b);
    if (n == 1 && b[0] == '/') return 1;
    return strncmp(a, b, n) == 0 && (a[n] == 0 || a[n] == '/');
}

/* Refuses an output (OUT, OUT.partial, OUT.lock) inside one of the inputs, or
 * an input inside them: the build would read its own lock file, state and
 * shards as text, and no two runs would give the same dataset. Checked before
 * anything is written. `out` has no trailing '/'. */
static int check_output_apart(const char *out, const tks_build_opts *o) {
    char parent[PATH_MAX], real_parent[PATH_MAX], dest[PATH_MAX];
    const char *slash = strrchr(out, '/'), *base = slash ? slash + 1 : out;
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == out) snprintf(parent, sizeof parent, "/");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash - out), out);
    if (!realpath(parent, real_parent)) return 0; /* no parent: creating OUT.partial fails, naming it */
    static const char *const suffix[] = {"", ".partial", ".lock"};
    for (size_t i = 0; i < o->n_inputs; i++) {
        char real_in[PATH_MAX];
        if (!realpath(o->inputs[i], real_in)) continue; /* reported when the inputs are listed */
        for (int k = 0; k < 3; k++) {
            if (snprintf(dest, sizeof dest, "%s%s%s%s", real_parent,
                         strcmp(real_parent, "/") ? "/" : "", base, suffix[k]) >= (int)sizeof dest)
                continue;
            if (path_within(dest, real_in) || path_within(real_in, dest))
                return tks_fail(TKS_ERR_ARG, o->inputs[i], TKS_NONE, TKS_NONE,
                                "--output %s would put %s%s %s input %s: the build would read "
                                "its own files; choose an --output outside every input",
                                out, out, suffix[k],
                                path_within(dest, real_in) ? "inside the" : "around the", o->inputs[i]);
        }
    }
    return 0;
}

/* TKS_ERR_ARG when the options ask for a BOS or EOS the tokenizer lacks. */
static int check_specials(const tks_build_opts *o, uint32_t bos, uint32_t eos) {
    if ((o->prepend_bos && bos == TKS_NO_ID) || (o->append_eos && eos == TKS_NO_ID))
        return tks_fail(TKS_ERR_ARG, o->tokenizer_path, TKS_NONE, TKS_NONE,
                        "%s has no %s id: drop %s or use a tokenizer that defines it",
                        o->tokenizer_path, o->prepend_bos && bos == TKS_NO_ID ? "BOS" : "EOS",
                        o->prepend_bos && bos == TKS_NO_ID ? "--prepend-bos" : "--append-eos");
    return 0;
}

/* A shard writer into `dir` for the tokenizer spm, numbering shards from
 * first_shard. */
static int open_writer(const tks_build_opts *o, const tks_spm *spm, const char *dir,
                       uint32_t first_shard, tks_writer **w) {
    tks_writer_opts wo = {.dir = dir, .vocab_size = tks_spm_vocab_size(spm),
                          .bos_id = tks_spm_bos_id(spm), .eos_id = tks_spm_eos_id(spm),
                          .pad_id = tks_spm_pad_id(spm),
                          .shard_tokens = o->shard_tokens ? o->shard_tokens : (16u << 20),
                          .chunk_bytes = o->chunk_bytes, .first_shard = first_shard};
    memcpy(wo.tokenizer_fp, tks_spm_fingerprint(spm), 16);
    return tks_writer_create(&wo, w);
}

/* The encoder a build took, and why, into *stats. */
static void encoder_report(const tks_spm *spm, const tks_build_opts *o, tks_build_stats *stats) {
    const char *why = tks_spm_fast_unavailable(spm);
    snprintf(stats->encoder, sizeof stats->encoder, "%s", tks_spm_encoder(spm));
    snprintf(stats->encoder_why, sizeof stats->encoder_why, "%s",
             why ? why : o->encoder_sentencepiece ? "--encoder sentencepiece" : "");
    tks_spm_encoder_stats(spm, &stats->encoder_stats);
}

/* One build in this process (tks_build): what it holds while it runs. */
typedef struct run {
    const tks_build_opts *o;
    tks_build_stats *stats;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_spm *spm;
    uint32_t bos, eos;
    tks_input *in;
    tks_writer *w;
    json_t *desc;                    /* provenance, and the build id's source */
    build_state st;
    uint64_t docs_committed, tokens_committed; /* by this run (resumed shards aside) */
    double t0;
} run;

/* The paths, the output checks and OUT.lock (one build or resume of OUT at a
 * time). */
static int run_lock(run *r) {
    const tks_build_opts *o = r->o;
    int rc = tks_partial_paths(TKS_PARTIAL_BUILD, o->out_dir, r->out, r->partial, sizeof r->out);
    if (!rc) rc = check_output_apart(r->out, o);
    if (!rc) rc = tks_partial_check_out(r->out);
    if (rc) return rc;
    if (snprintf(r->lock_path, sizeof r->lock_path, "%s.lock", r->out) >= (int)sizeof r->lock_path)
        return tks_fail(TKS_ERR_ARG, r->out, TKS_NONE, TKS_NONE, "--output path too long");
    return tks_lock(r->lock_path, "tokshard build", &r->lock_fd);
}

/* OUT.partial, fresh or resumed (its state loaded, what it does not record
 * removed). */
static int run_partial(run *r) {
    const char *partial = r->partial;
    char state_path[PATH_MAX];
    struct stat sb;
    int have_partial = stat(partial, &sb) == 0, resume = r->o->resume;
    int rc = tks_path_join(state_path, sizeof state_path, partial,
                           tks_partial_state_name(TKS_PARTIAL_BUILD));
    if (rc) return rc;
    if (resume && have_partial && access(state_path, F_OK) == 0) {
        rc = tks_partial_state_load(TKS_PARTIAL_BUILD, partial, r->st.p.id, &r->st.p);
        if (!rc) tks_partial_clean(partial, r->st.p.n_shards, PLAIN_NAME);
        r->stats->resumed_shards = r->st.p.n_shards;
        return rc;
    }
    if (resume && have_partial && !tks_partial_has_shards(partial)) {
        /* stopped before its first shard and its state: nothing to keep */
        tks_partial_clean(partial, 0, PLAIN_NAME);
        return save_state(partial, &r->st);
    }
    if (have_partial)
        return tks_fail(resume ? TKS_ERR_RESUME : TKS_ERR_EXISTS, partial, TKS_NONE, TKS_NONE,
                        resume ? "cannot resume: %s has shards but no build-state.json; remove it "
                                 "and build again"
                               : "%s exists from an interrupted or failed build: re-run with "
                                 "--resume to continue it, or remove it to start over",
                        partial);
    /* --resume with nothing to resume starts a fresh build */
    rc = tks_partial_create(partial);
    return rc ? rc : save_state(partial, &r->st);
}

/* The tokenizer, the inputs, the build id, OUT.partial and the writer. */
static int run_open(run *r) {
    const tks_build_opts *o = r->o;
    int rc = tks_spm_load(o->tokenizer_path, &r->spm);
    if (!rc && o->encoder_sentencepiece) rc = tks_spm_set_encoder(r->spm, 0);
    if (!rc) rc = open_inputs(o, &r->in);
    if (!rc) r->desc = describe(o, r->in, r->spm, &rc);
    if (!rc) rc = build_id(r->desc, r->in, r->st.p.id);
    r->st.in = r->in;
    if (!rc) rc = run_partial(r);
    if (!rc)
        rc = tks_partial_tokenizer(TKS_PARTIAL_BUILD, r->partial, o->tokenizer_path, TOKENIZER_NAME,
                                   tks_spm_fingerprint(r->spm));
    if (rc) return rc;
    r->bos = tks_spm_bos_id(r->spm);
    r->eos = tks_spm_eos_id(r->spm);
    rc = check_specials(o, r->bos, r->eos);
    return rc ? rc : open_writer(o, r->spm, r->partial, (uint32_t)r->st.p.n_shards, &r->w);
}

/* Records a shard just published, ending before document `end`, in the state. */
static int run_published(run *r, uint64_t end) {
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(r->w, &ns);
    r->st.p.next = end;
    int rc = tks_partial_state_push(&r->st.p, &si[ns - 1], end);
    return rc ? rc : save_state(r->partial, &r->st);
}

/* Commits an encoded batch in document order; a work unit's last document
 * closes its shard. */
static int run_commit(run *r, batch *b) {
    int rc = 0;
    for (size_t i = 0; i < b->n && !rc; i++) {
        tks_ids *v = &b->ids[i];
        int published = 0;
        if (v->n == 0) {
            r->stats->empty_after_tokenize++;
            r->st.p.empty_after_tokenize++;
        } else {
            rc = add_specials(v, r->o, r->bos, r->eos);
            if (!rc) rc = tks_writer_add(r->w, v->ids, v->n, b->ordinal[i], &published);
            r->docs_committed++;
            r->tokens_committed += v->n;
        }
        if (!rc && b->uend[i]) {
            size_t before, after;
            tks_writer_shards(r->w, &before);
            rc = tks_writer_flush(r->w);
            tks_writer_shards(r->w, &after);
            published |= after > before;
        }
        if (!rc && published) rc = run_published(r, b->ordinal[i] + 1);
    }
    return rc;
}

static void run_progress(run *r, const batch *b) {
    tks_build_progress p = {.bytes_in = b->input.bytes_in,
                            .total_bytes_in = tks_input_total_bytes(r->in),
                            .bytes_text = b->input.bytes_text, .docs_read = b->docs_seen,
                            .shards = r->st.p.n_shards, .seconds = omp_get_wtime() - r->t0,
                            .docs_written = r->docs_committed, .tokens_written = r->tokens_committed};
    for (size_t i = 0; i < r->stats->resumed_shards; i++) { /* kept from before a resume */
        p.docs_written += r->st.p.shards[i].n_docs;
        p.tokens_written += r->st.p.shards[i].n_tokens;
    }
    r->o->progress(&p, r->o->progress_ctx);
}

/* Reads (on the reader thread), encodes and commits every batch; *docs_read:
 * the documents read, skipped ones included. */
static int run_batches(run *r, uint64_t *docs_read) {
    const tks_build_opts *o = r->o;
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads(), rc = 0, done = 0;
    reader rd = {.in = r->in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20),
                 .want = UINT64_MAX,
                 .unit_bytes = o->unit_bytes ? o->unit_bytes : TKS_DEFAULT_UNIT_BYTES,
                 .skip_below = r->st.p.next, .stop = o->stop};
    prefetch pf = {.r = &rd};
    prefetch_start(&pf);
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = prefetch_take(&pf, &b))) break;
        done = b->end;
        /* no reader runs now: the input may be looked at */
        if ((rc = verify_inputs(&r->st, r->partial))) break;
        if (!done) prefetch_start(&pf);
        /* tokenize in parallel (encode_batch says in which order), commit in order */
        rc = encode_batch(r->spm, b, threads);
        if (!rc) rc = run_commit(r, b);
        batch_trim(b, rd.batch_bytes);
        if (rc) break;
        if (o->progress) run_progress(r, b);
        if (o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, r->partial, TKS_NONE, TKS_NONE,
                          "interrupted: %zu shard(s) are kept in %s; run the same command with "
                          "--resume to finish",
                          r->st.p.n_shards, r->partial);
    }
    prefetch_free(&pf); /* a reader still running after an error is joined */
    *docs_read = rd.docs_read;
    return rc;
}

/* The last shard, the manifest, and OUT published. */
static int run_finish(run *r, uint64_t docs_read) {
    int rc = tks_writer_flush(r->w);
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(r->w, &ns);
    if (!rc && ns && (size_t)si[ns - 1].index + 1 > r->st.p.n_shards) rc = run_published(r, docs_read);
    if (!rc && r->st.p.n_shards == 0) rc = no_text(tks_input_get_stats(r->in));
    if (!rc) rc = add_input_hashes(r->desc, r->in);
    if (!rc)
        rc = write_manifest(r->o, r->partial, r->spm, r->desc, tks_input_get_stats(r->in),
                            r->st.p.shards, r->st.p.n_shards, r->st.p.empty_after_tokenize, r->stats);
    return rc ? rc : tks_partial_publish(TKS_PARTIAL_BUILD, r->partial, r->out);
}

int tks_build(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    /* a build by work units (mpirun) is resumed as one */
    if (o && o->resume && o->out_dir && partial_is_units(o->out_dir)) return build_units_here(o, stats);
    if (!o || !o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    run *r = calloc(1, sizeof *r);
    if (!r) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    r->o = o;
    r->stats = stats;
    r->lock_fd = -1;
    r->t0 = omp_get_wtime();
    int rc = run_lock(r);
    if (rc) {
        free(r);
        return rc;
    }
    uint64_t docs_read = 0;
    rc = run_open(r);
    if (!rc) rc = run_batches(r, &docs_read);
    if (!rc) rc = run_finish(r, docs_read);
    stats->seconds = omp_get_wtime() - r->t0;
    if (r->spm) encoder_report(r->spm, o, stats);
    if (stats->input.files == 0 && r->in) stats->input = *tks_input_get_stats(r->in);
    tks_writer_free(r->w);
    json_decref(r->desc);
    tks_partial_state_free(&r->st.p);
    tks_input_free(r->in);
    tks_spm_free(r->spm);
    tks_unlock(r->lock_fd, r->lock_path);
    free(r);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Work units (tks_build_job_*)
 *
 * OUT.partial/build-state.json: {"build_id", "mode": "units", "units",
 *   "inputs_xxh3_128"} (written by the coordinator after planning)
 * OUT.partial/unit-NNNNN/shard-LLLLL.tks: unit N's shards, numbered from 0
 * OUT.partial/unit-NNNNN/unit.json: written last, when the unit is complete
 * finish: each unit's shards get their index in the dataset (the header's
 * shard_index and its checksum: 256 bytes rewritten in place, fsync) and
 * are renamed to OUT.partial/shard-GGGGG.tks; a header rewritten but not yet
 * renamed, or renamed, is recognized on --resume.
 * OUT.partial/plain-state.json: while a build started without work units is
 * resumed by them, the state it left (see plain_unit).
 * ------------------------------------------------------------------------- */
#define UNIT_RECORD "unit.json"

struct tks_build_job {
    tks_build_opts o;
    int coordinator;
    char out[PATH_MAX], partial[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd;
    tks_spm *spm;
    uint32_t bos, eos;
    /* coordinator */
    json_t *desc;
    char build_id[17];
    tks_build_unit *units;
    size_t n_units, cap_units;
    unsigned char *done;
    tks_input_stats input;
    double t0;
    /* planning, one unit per tks_build_job_plan call */
    tks_input *plan_in;
    tks_build_unit cur;
    int planning, resuming;
    char (*was)[33];        /* resumed: the inputs' hashes the state recorded */
    size_t n_was;
    uint64_t kept_base;     /* dataset index of the next kept unit's first shard, or TKS_NONE */
    /* resumed from a build started without mpirun (PLAIN_NAME): its shards,
     * moved unit by unit into the units' layout as each unit is planned */
    tks_build_plain plain;
    tks_shard_info *plain_shards; /* as its state recorded them: global index, file */
    uint64_t *plain_ends;         /* their end_ordinal; NULL when any is not recorded */
    uint64_t plain_next;          /* its next_ordinal: documents before it are in its shards */
    size_t plain_cur;             /* next plain shard to match to a unit */
    uint64_t plain_docs;          /* the ordinal where plain shard plain_cur starts */
};

static int job_paths(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    if (!o->out_dir || !*o->out_dir || !o->tokenizer_path || o->n_inputs == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "build needs --tokenizer, --output and at least one input");
    int rc = tks_partial_paths(TKS_PARTIAL_BUILD, o->out_dir, j->out, j->partial, sizeof j->out);
    if (rc) return rc;
    if (snprintf(j->lock_path, sizeof j->lock_path, "%s.lock", j->out) >= (int)sizeof j->lock_path)
        return tks_fail(TKS_ERR_ARG, j->out, TKS_NONE, TKS_NONE, "--output path too long");
    rc = check_output_apart(j->out, o);
    if (!rc) rc = tks_spm_load(o->tokenizer_path, &j->spm);
    if (!rc && o->encoder_sentencepiece) rc = tks_spm_set_encoder(j->spm, 0);
    if (rc) return rc;
    j->bos = tks_spm_bos_id(j->spm);
    j->eos = tks_spm_eos_id(j->spm);
    return check_specials(o, j->bos, j->eos);
}

static int unit_dir(const tks_build_job *j, uint64_t k, char *out, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "unit-%05llu", (unsigned long long)k);
    return tks_path_join(out, cap, j->partial, name);
}

/* A unit's record: its shards (local numbering) and counters. 0 with *n set,
 * or TKS_ERR_RESUME when missing or not of this build. */
typedef struct unit_record {
    tks_shard_info *shards;
    size_t n;
    uint64_t empty_after_tokenize;
} unit_record;

static int load_record(const tks_build_job *j, uint64_t k, const char *build_id, unit_record *r) {
    char dir[PATH_MAX], path[PATH_MAX];
    memset(r, 0, sizeof *r);
    int rc = unit_dir(j, k, dir, sizeof dir);
    if (!rc) rc = tks_path_join(path, sizeof path, dir, UNIT_RECORD);
    if (rc) return rc;
    json_t *js = json_load_file(path, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    json_t *arr = json_object_get(js, "shards");
    if (!js || !id || strcmp(id, build_id) != 0 || !json_is_array(arr) ||
        (uint64_t)json_integer_value(json_object_get(js, "unit")) != k) {
        json_decref(js);
        return tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                        "%s is missing or not a record of this build: unit %llu is not complete; "
                        "re-run with --resume to build it",
                        path, (unsigned long long)k);
    }
    r->empty_after_tokenize = (uint64_t)json_integer_value(json_object_get(js, "empty_after_tokenize"));
    r->n = json_array_size(arr);
    r->shards = calloc(r->n ? r->n : 1, sizeof *r->shards);
    if (!r->shards) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < r->n && !rc; i++) {
        if (tks_shard_record_read(json_array_get(arr, i), i, &r->shards[i]) != 0) {
            rc = tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE,
                          "%s: shard %zu malformed; remove %s and re-run with --resume", path, i, dir);
            break;
        }
    }
    json_decref(js);
    if (rc) {
        free(r->shards);
        r->shards = NULL;
    }
    return rc;
}

/* Is the shard at `path` the recorded one, numbered `local` or `global` (a
 * header rewritten or not yet)? Its header with index `as` (the index the
 * record was made with) must hash to the record's. 1, or 0. */
static int shard_matches(const char *path, const tks_shard_info *rec, uint32_t local, uint64_t global,
                         uint64_t as) {
    tks_shard *sh = NULL;
    if (access(path, F_OK) != 0 || tks_shard_open(path, &sh) != 0) {
        tks_clear_error();
        tks_shard_close(sh);
        return 0;
    }
    tks_shard_header h = *tks_shard_hdr(sh);
    tks_shard_close(sh);
    if ((h.shard_index != local && h.shard_index != global) || h.file_size != rec->file_bytes ||
        h.n_docs != rec->n_docs || h.n_tokens != rec->n_tokens)
        return 0;
    uint8_t page[TKS_HEADER_SIZE];
    h.shard_index = (uint32_t)as;
    tks_header_encode(&h, page);
    return h.header_xxh3 == rec->header_xxh3;
}

/* Unit k is complete on disk: its record, and each shard in the unit's
 * directory or already renamed to its place in the dataset (base: the
 * dataset index of the unit's first shard, TKS_NONE when not known). */
static int unit_complete(const tks_build_job *j, uint64_t k, uint64_t base, unit_record *r) {
    if (load_record(j, k, j->build_id, r) != 0) {
        tks_clear_error();
        return 0;
    }
    char dir[PATH_MAX], p[PATH_MAX], name[32];
    unit_dir(j, k, dir, sizeof dir);
    for (size_t i = 0; i < r->n; i++) {
        uint64_t g = base == TKS_NONE ? TKS_NONE : base + i;
        if (tks_path_join(p, sizeof p, dir, r->shards[i].file) == 0 &&
            shard_matches(p, &r->shards[i], (uint32_t)i, g, i))
            continue;
        if (g != TKS_NONE && g <= UINT32_MAX) {
            snprintf(name, sizeof name, "shard-%05llu.tks", (unsigned long long)g);
            if (tks_path_join(p, sizeof p, j->partial, name) == 0 && shard_matches(p, &r->shards[i], (uint32_t)i, g, i))
                continue;
        }
        free(r->shards);
        r->shards = NULL;
        return 0;
    }
    return 1;
}

/* Empties (or creates) a unit's directory. */
static int reset_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return tks_fail(tks_write_errno_code(errno), dir, TKS_NONE, TKS_NONE, "cannot create %s: %s",
                            dir, strerror(errno));
        return 0;
    }
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || strcmp(e->d_name, ".") * strcmp(e->d_name, "..") != 0)
            if (tks_path_join(p, sizeof p, dir, e->d_name) == 0) unlink(p);
    closedir(d);
    return 0;
}

static int save_units_state(const tks_build_job *j, const char hashes[][33], size_t n_files) {
    json_t *hs = json_array();
    for (size_t i = 0; i < n_files; i++) json_array_append_new(hs, json_string(hashes[i]));
    json_t *js = json_pack("{s:s, s:s, s:I, s:I, s:o}", "build_id", j->build_id, "mode", "units",
                           "units", (json_int_t)j->n_units, "unit_bytes",
                           (json_int_t)(j->o.unit_bytes ? j->o.unit_bytes : TKS_DEFAULT_UNIT_BYTES),
                           "inputs_xxh3_128", hs);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    char path[PATH_MAX];
    int rc = text ? tks_path_join(path, sizeof path, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD))
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* Is OUT.partial's state that of a build by work units? */
static int partial_is_units(const char *out_dir) {
    char partial[PATH_MAX], path[PATH_MAX];
    snprintf(partial, sizeof partial, "%s", out_dir);
    size_t ol = strlen(partial);
    while (ol > 1 && partial[ol - 1] == '/') partial[--ol] = 0;
    if (strlen(partial) + 9 >= sizeof partial) return 0;
    strcat(partial, ".partial");
    if (tks_path_join(path, sizeof path, partial, tks_partial_state_name(TKS_PARTIAL_BUILD)) != 0) return 0;
    json_t *js = json_load_file(path, 0, NULL);
    const char *mode = json_string_value(json_object_get(js, "mode"));
    int units = mode && !strcmp(mode, "units");
    json_decref(js);
    return units;
}

/* ---- resuming a build started without work units ----
 * Its shards are OUT.partial/shard-GGGGG.tks (dataset index in the header)
 * and its state lists them with their document counts. A plain build closes
 * a shard at each unit's last document, so each shard lies in one unit. A
 * unit whose documents are exactly those of the next plain shards (their
 * counts add up to the unit's, which proves it only when the plain build
 * found no document empty after tokenizing: an empty one is in no shard) is
 * kept: each shard's header gets the unit-local index (in place, fsync), the
 * file is renamed to OUT.partial/unit-NNNNN/shard-LLLLL.tks, and unit.json is
 * written last, as if the unit had been built. Any step interrupted is
 * recognized by the next --resume: a shard is taken from either place, its
 * header compared (index aside) with the plain state's record, which
 * PLAIN_NAME keeps until the dataset is published. */

static int plain_load(tks_build_job *j, json_t *js, const char *path) {
    json_t *arr = json_object_get(js, "shards");
    size_t n = json_array_size(arr);
    j->plain_shards = calloc(n ? n : 1, sizeof *j->plain_shards);
    if (!j->plain_shards) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (tks_shard_record_read(json_array_get(arr, i), i, &j->plain_shards[i]) != 0)
            return tks_fail(TKS_ERR_RESUME, path, i, TKS_NONE,
                            "cannot resume: %s shard %zu malformed; remove %s and build again",
                            path, i, j->partial);
    /* the shards' end ordinals, when the state has them all (a state written
     * before they were recorded has none) */
    j->plain_ends = malloc((n ? n : 1) * sizeof *j->plain_ends);
    if (!j->plain_ends) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n && j->plain_ends; i++) {
        json_t *end = json_object_get(json_array_get(arr, i), "end_ordinal");
        if (json_is_integer(end)) {
            j->plain_ends[i] = (uint64_t)json_integer_value(end);
        } else {
            free(j->plain_ends);
            j->plain_ends = NULL;
        }
    }
    j->plain.active = 1;
    j->plain.shards = n;
    j->plain.empty_after_tokenize = (uint64_t)json_integer_value(json_object_get(js, "empty_after_tokenize"));
    j->plain.ends_recorded = j->plain_ends != NULL;
    j->plain_next = (uint64_t)json_integer_value(json_object_get(js, "next_ordinal"));
    return 0;
}

static int plain_save(const tks_build_job *j, json_t *js) {
    char path[PATH_MAX];
    char *text = json_dumps(js, JSON_INDENT(1));
    int rc = text ? tks_path_join(path, sizeof path, j->partial, PLAIN_NAME)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* A units state with PLAIN_NAME beside it: an earlier resume under mpirun
 * was converting a plain build. A PLAIN_NAME of another build is ignored
 * (its shards are then built again, never kept). */
static int plain_reload(tks_build_job *j) {
    char path[PATH_MAX];
    int rc = tks_path_join(path, sizeof path, j->partial, PLAIN_NAME);
    if (rc || access(path, F_OK) != 0) return rc;
    json_t *js = json_load_file(path, 0, NULL);
    const char *id = json_string_value(json_object_get(js, "build_id"));
    if (js && id && strcmp(id, j->build_id) == 0 && json_is_array(json_object_get(js, "shards")) &&
        json_is_integer(json_object_get(js, "next_ordinal")) &&
        json_is_integer(json_object_get(js, "empty_after_tokenize")))
        rc = plain_load(j, js, path);
    json_decref(js);
    return rc;
}

static int place_shard(const char *from, const char *to, uint32_t global, tks_shard_info *si);

/* Unit u (planned, not complete on disk) from the plain shards: 1 when kept
 * (its record written; *n its shards), 0 when it must be built, or an I/O
 * error. */
/* Where plain shard i's documents end in the input, given where they start
 * (pos): its recorded end_ordinal, or, from a state without them, pos plus
 * its document count (exact only when no document was empty after
 * tokenizing: an empty one is in no shard). */
static uint64_t plain_end(const tks_build_job *j, size_t i, uint64_t pos) {
    return j->plain_ends ? j->plain_ends[i] : pos + j->plain_shards[i].n_docs;
}

static int plain_unit(tks_build_job *j, const tks_build_unit *u, size_t *n) {
    *n = 0;
    if (!j->plain.active || (!j->plain_ends && j->plain.empty_after_tokenize)) return 0;
    uint64_t s = u->start.ordinal, e = s + u->n_docs, written = 0;
    while (j->plain_cur < j->plain.shards && j->plain_docs < s)
        j->plain_docs = plain_end(j, j->plain_cur++, j->plain_docs);
    if (j->plain_docs != s || e > j->plain_next) return 0;
    size_t a = j->plain_cur;
    while (j->plain_cur < j->plain.shards && j->plain_docs < e) {
        written += j->plain_shards[j->plain_cur].n_docs;
        j->plain_docs = plain_end(j, j->plain_cur++, j->plain_docs);
    }
    size_t b = j->plain_cur;
    if (j->plain_docs != e || b == a || written > u->n_docs || b - a > UINT32_MAX || b - 1 > UINT32_MAX)
        return 0;
    char dir[PATH_MAX], from[PATH_MAX], to[PATH_MAX], name[32];
    int rc = unit_dir(j, u->index, dir, sizeof dir);
    if (!rc && mkdir(dir, 0755) != 0 && errno != EEXIST)
        rc = tks_fail(tks_write_errno_code(errno), dir, TKS_NONE, TKS_NONE, "cannot create %s: %s",
                      dir, strerror(errno));
    json_t *arr = json_array();
    for (size_t i = a; i < b && !rc; i++) {
        uint32_t local = (uint32_t)(i - a), g = (uint32_t)i;
        tks_shard_info si = j->plain_shards[i];
        snprintf(name, sizeof name, "shard-%05u.tks", local);
        rc = tks_path_join(from, sizeof from, j->partial, si.file);
        if (!rc) rc = tks_path_join(to, sizeof to, dir, name);
        if (rc) break;
        /* the plain state recorded it with its dataset index g */
        if (shard_matches(from, &si, local, g, g)) {
            rc = place_shard(from, to, local, &si);
        } else if (shard_matches(to, &si, local, g, g)) { /* moved by an interrupted resume */
            tks_shard *sh = NULL;
            rc = tks_shard_open(to, &sh);
            if (!rc) si.header_xxh3 = tks_shard_hdr(sh)->header_xxh3;
            tks_shard_close(sh);
        } else { /* missing or not the recorded shard: the unit is built again */
            json_decref(arr);
            return 0;
        }
        snprintf(si.file, sizeof si.file, "%s", name);
        si.index = local;
        if (!rc) json_array_append_new(arr, tks_shard_record(&si));
    }
    if (!rc) rc = tks_fsync_dir(j->partial);
    if (!rc) rc = tks_fsync_dir(dir);
    char rec[PATH_MAX];
    if (!rc) rc = tks_path_join(rec, sizeof rec, dir, UNIT_RECORD);
    json_t *js = rc ? NULL
                    : json_pack("{s:s, s:I, s:I, s:I, s:O}", "build_id", j->build_id, "unit",
                                (json_int_t)u->index, "n_docs", (json_int_t)u->n_docs,
                                "empty_after_tokenize", (json_int_t)(u->n_docs - written), "shards", arr);
    json_decref(arr);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    if (!rc && !text) rc = tks_fail(TKS_ERR_NOMEM, rec, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(rec, text, strlen(text));
    free(text);
    if (rc) return rc;
    *n = b - a;
    j->plain.units_kept++;
    j->plain.shards_kept += b - a;
    return 1;
}

const tks_build_plain *tks_build_job_plain(const tks_build_job *j) { return &j->plain; }

static int coordinator_open(tks_build_job *j) {
    const tks_build_opts *o = &j->o;
    int rc = tks_partial_check_out(j->out);
    if (!rc) rc = tks_lock(j->lock_path, "tokshard build", &j->lock_fd);
    if (rc) return rc;
    rc = open_inputs(o, &j->plan_in);
    if (!rc) j->desc = describe(o, j->plan_in, j->spm, &rc);
    if (!rc) rc = build_id(j->desc, j->plan_in, j->build_id);
    char state[PATH_MAX];
    if (!rc) rc = tks_path_join(state, sizeof state, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
    struct stat sb;
    int have = !rc && stat(j->partial, &sb) == 0;
    if (!rc && have && !o->resume)
        rc = tks_fail(TKS_ERR_EXISTS, j->partial, TKS_NONE, TKS_NONE,
                      "%s exists from an interrupted or failed build: re-run with --resume to "
                      "continue it, or remove it to start over",
                      j->partial);
    if (!rc && have) {
        json_t *js = json_load_file(state, 0, NULL);
        const char *id = json_string_value(json_object_get(js, "build_id"));
        const char *mode = json_string_value(json_object_get(js, "mode"));
        json_t *was = json_object_get(js, "inputs_xxh3_128");
        int plain = js && id && !mode && json_is_array(json_object_get(js, "shards")) &&
                    json_is_integer(json_object_get(js, "next_ordinal")) &&
                    json_is_integer(json_object_get(js, "empty_after_tokenize"));
        if (!js || !id || (!plain && (!mode || strcmp(mode, "units") != 0)))
            rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                          "cannot resume: %s is missing or not a tokshard build state; remove %s "
                          "and build again",
                          state, j->partial);
        else if (strcmp(id, j->build_id) != 0)
            rc = tks_fail(TKS_ERR_RESUME, state, TKS_NONE, TKS_NONE,
                          "cannot resume: %s was started with other inputs, tokenizer or options "
                          "(build id %.16s, now %s); re-run with the original ones, or remove %s "
                          "to start over",
                          j->partial, id, j->build_id, j->partial);
        size_t nw = json_array_size(was);
        if (!rc && nw && !(j->was = calloc(nw, sizeof *j->was)))
            rc = tks_fail(TKS_ERR_NOMEM, state, TKS_NONE, TKS_NONE, "out of memory");
        for (size_t i = 0; i < nw && !rc; i++) {
            const char *h = json_string_value(json_array_get(was, i));
            snprintf(j->was[j->n_was++], sizeof j->was[0], "%s", h ? h : "");
        }
        /* a build started without work units: its state goes to PLAIN_NAME
         * before build-state.json becomes a units state, so a crash at any
         * point leaves one of the two for the next --resume */
        if (!rc && plain) rc = plain_load(j, js, state);
        if (!rc && plain) rc = plain_save(j, js);
        if (!rc && !plain) rc = plain_reload(j);
        json_decref(js);
        j->resuming = 1;
    } else if (!rc) {
        rc = tks_partial_create(j->partial);
    }
    if (!rc)
        rc = tks_partial_tokenizer(TKS_PARTIAL_BUILD, j->partial, o->tokenizer_path, TOKENIZER_NAME,
                                   tks_spm_fingerprint(j->spm));
    /* the workers read the build id from here; a resumed state keeps the
     * hashes of the interrupted build until the plan has read every input */
    if (!rc) rc = save_units_state(j, (const char(*)[33])j->was, j->n_was);
    if (!rc) {
        j->planning = 1;
        tks_input_tell(j->plan_in, &j->cur.start);
    }
    return rc;
}

/* The plan has read every input: their hashes go into the description and
 * the state, and a resumed build's inputs must hash as they did. */
static int plan_end(tks_build_job *j) {
    tks_input *in = j->plan_in;
    j->input = *tks_input_get_stats(in);
    int rc = add_input_hashes(j->desc, in);
    size_t nf = tks_input_n_files(in);
    char (*hashes)[33] = rc ? NULL : calloc(nf ? nf : 1, sizeof *hashes);
    if (!rc && !hashes) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < nf && !rc; i++) {
        uint8_t h[16];
        rc = tks_input_file_xxh3(in, i, h, NULL);
        if (!rc) tks_hex(h, 16, hashes[i]);
        if (!rc && j->resuming && i < j->n_was && strcmp(j->was[i], hashes[i]) != 0)
            rc = tks_fail(TKS_ERR_RESUME, tks_input_file(in, i), TKS_NONE, TKS_NONE,
                          "cannot resume: %s changed since the interrupted build (XXH3-128 %s, "
                          "was %.32s), so the units kept in %s came from other bytes; remove %s "
                          "and build again",
                          tks_input_file(in, i), hashes[i], i < j->n_was ? j->was[i] : "?",
                          j->partial, j->partial);
    }
    if (!rc) rc = save_units_state(j, (const char(*)[33])hashes, nf);
    free(hashes);
    tks_input_free(in);
    j->plan_in = NULL;
    j->planning = 0;
    return rc;
}

int tks_build_job_plan(tks_build_job *j, tks_build_unit *out) {
    if (!j->coordinator)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_plan: only the coordinator plans");
    if (!j->planning) return 0;
    uint64_t unit_bytes = j->o.unit_bytes ? j->o.unit_bytes : TKS_DEFAULT_UNIT_BYTES;
    tks_build_unit *cur = &j->cur;
    tks_doc doc;
    int got;
    while ((got = tks_input_next(j->plan_in, &doc)) > 0) {
        cur->n_docs++;
        cur->text_bytes += doc.len;
        if (cur->text_bytes >= unit_bytes) break;
    }
    if (got < 0) return got;
    if (got == 0 && cur->n_docs == 0) {
        int rc = plan_end(j);
        return rc ? rc : 0;
    }
    if (j->n_units == j->cap_units) {
        size_t cap = j->cap_units ? 2 * j->cap_units : 64;
        if (tks_resize(&j->units, cap, sizeof *j->units) || tks_resize(&j->done, cap, sizeof *j->done))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (units)");
        j->cap_units = cap;
    }
    size_t k = j->n_units++;
    j->units[k] = *cur;
    j->done[k] = 0;
    if (j->resuming) { /* kept from the interrupted run? */
        unit_record r;
        size_t n = 0;
        j->done[k] = (unsigned char)unit_complete(j, k, j->kept_base, &r);
        if (j->done[k]) n = r.n;
        free(r.shards);
        if (!j->done[k]) { /* or from a build started without work units */
            int kept = plain_unit(j, cur, &n);
            if (kept < 0) return kept;
            j->done[k] = (unsigned char)kept;
        }
        j->kept_base = j->done[k] && j->kept_base != TKS_NONE ? j->kept_base + n : TKS_NONE;
    }
    *out = *cur;
    memset(cur, 0, sizeof *cur);
    cur->index = j->n_units;
    tks_input_tell(j->plan_in, &cur->start);
    return 1;
}

int tks_build_job_open(const tks_build_opts *opts, int coordinator, tks_build_job **out) {
    *out = NULL;
    if (!opts) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_build_job_open: NULL options");
    tks_build_job *j = calloc(1, sizeof *j);
    if (!j) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    j->o = *opts;
    j->coordinator = coordinator;
    j->lock_fd = -1;
    j->t0 = omp_get_wtime();
    int rc = job_paths(j);
    if (!rc && coordinator) rc = coordinator_open(j);
    if (!rc && !coordinator) { /* the coordinator's build id goes into each unit's record */
        char path[PATH_MAX];
        rc = tks_path_join(path, sizeof path, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
        json_t *js = rc ? NULL : json_load_file(path, 0, NULL);
        const char *id = json_string_value(json_object_get(js, "build_id"));
        if (!rc && (!id || strlen(id) != 16))
            rc = tks_fail(TKS_ERR_RESUME, path, TKS_NONE, TKS_NONE,
                          "%s is missing or unreadable: this process cannot join the build of %s "
                          "(is %s on a filesystem every rank shares?)",
                          path, j->out, j->partial);
        else if (!rc)
            memcpy(j->build_id, id, 17);
        json_decref(js);
    }
    if (rc) {
        tks_build_job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

const tks_build_unit *tks_build_job_units(const tks_build_job *j, size_t *n) {
    *n = j->n_units;
    return j->units;
}

int tks_build_job_unit_done(const tks_build_job *j, size_t i) { return i < j->n_units && j->done[i]; }

int tks_build_job_planning(const tks_build_job *j) { return j->planning; }

int tks_build_job_run(tks_build_job *j, const tks_build_unit *u, tks_unit_stats *us) {
    const tks_build_opts *o = &j->o;
    double t0 = omp_get_wtime();
    memset(us, 0, sizeof *us);
    char dir[PATH_MAX], rec[PATH_MAX];
    int rc = unit_dir(j, u->index, dir, sizeof dir);
    if (!rc) rc = tks_path_join(rec, sizeof rec, dir, UNIT_RECORD);
    if (!rc) rc = reset_dir(dir);
    tks_input *in = NULL;
    tks_writer *w = NULL;
    if (!rc) rc = open_inputs(o, &in);
    if (!rc) rc = tks_input_seek(in, &u->start);
    if (!rc) rc = open_writer(o, j->spm, dir, 0, &w);
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    uint64_t empty = 0;
    reader rd = {.in = in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20),
                 .want = u->n_docs, .stop = o->stop};
    prefetch pf = {.r = &rd};
    if (!rc && u->n_docs > 0) prefetch_start(&pf);
    int done = u->n_docs == 0;
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = prefetch_take(&pf, &b))) break;
        done = b->end;
        if (!done) prefetch_start(&pf);
        if (b->n) rc = encode_batch(j->spm, b, threads);
        for (size_t i = 0; i < b->n && !rc; i++) {
            tks_ids *v = &b->ids[i];
            if (v->n == 0) {
                empty++;
                continue;
            }
            rc = add_specials(v, o, j->bos, j->eos);
            if (!rc) rc = tks_writer_add(w, v->ids, v->n, b->ordinal[i], NULL);
            us->docs_written++;
            us->tokens_written += v->n;
        }
        batch_trim(b, rd.batch_bytes);
        if (!rc && o->progress) {
            tks_build_progress p = {.bytes_text = b->text_seen, .docs_read = b->docs_seen,
                                    .docs_written = us->docs_written,
                                    .tokens_written = us->tokens_written,
                                    .seconds = omp_get_wtime() - t0};
            o->progress(&p, o->progress_ctx);
        }
        if (!rc && o->stop && *o->stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, j->partial, TKS_NONE, TKS_NONE,
                          "interrupted in unit %llu: the complete units are kept in %s; run the "
                          "same command with --resume to finish",
                          (unsigned long long)u->index, j->partial);
    }
    prefetch_free(&pf); /* a reader still running after an error is joined */
    uint64_t got_docs = rd.docs_read;
    us->text_bytes = rd.text;
    if (!rc && got_docs != u->n_docs)
        rc = tks_fail(TKS_ERR_INPUT, tks_input_n_files(in) > u->start.file ? tks_input_file(in, u->start.file) : NULL,
                      TKS_NONE, u->start.offset,
                      "unit %llu: %llu documents planned from input file %llu (entry %llu, byte "
                      "%llu), %llu found: the inputs changed during the build; build again",
                      (unsigned long long)u->index, (unsigned long long)u->n_docs,
                      (unsigned long long)u->start.file, (unsigned long long)u->start.entry,
                      (unsigned long long)u->start.offset, (unsigned long long)got_docs);
    if (!rc) rc = tks_writer_flush(w);
    if (!rc) { /* the record, last: the unit is complete */
        size_t ns;
        const tks_shard_info *si = tks_writer_shards(w, &ns);
        json_t *arr = json_array();
        for (size_t i = 0; i < ns; i++) json_array_append_new(arr, tks_shard_record(&si[i]));
        json_t *js = json_pack("{s:s, s:I, s:I, s:I, s:o}", "build_id", j->build_id, "unit",
                               (json_int_t)u->index, "n_docs", (json_int_t)u->n_docs,
                               "empty_after_tokenize", (json_int_t)empty, "shards", arr);
        char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
        json_decref(js);
        rc = text ? tks_write_file_atomic(rec, text, strlen(text))
                  : tks_fail(TKS_ERR_NOMEM, rec, TKS_NONE, TKS_NONE, "out of memory");
        free(text);
        us->shards = ns;
    }
    /* a failure names the unit: a rank's error is read on rank 0 */
    if (rc && tks_last_error()->code == rc) {
        tks_error e = *tks_last_error();
        char msg[sizeof e.message + 32];
        snprintf(msg, sizeof msg, "unit %llu: %s", (unsigned long long)u->index, e.message);
        snprintf(e.message, sizeof e.message, "%.*s", (int)sizeof e.message - 1, msg);
        tks_error_restore(&e);
    }
    us->seconds = omp_get_wtime() - t0;
    tks_writer_free(w);
    tks_input_free(in);
    return rc;
}

/* Gives a unit's shard its index in the dataset: the header's shard_index
 * and checksum (in place, fsync), then the rename to its final name. */
static int place_shard(const char *from, const char *to, uint32_t global, tks_shard_info *si) {
    tks_shard *sh = NULL;
    int rc = tks_shard_open(from, &sh);
    if (rc) return rc;
    tks_shard_header h = *tks_shard_hdr(sh);
    tks_shard_close(sh);
    uint8_t page[TKS_HEADER_SIZE];
    h.shard_index = global;
    tks_header_encode(&h, page);
    si->header_xxh3 = h.header_xxh3;
    int fd = open(from, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return tks_fail(tks_write_errno_code(errno), from, global, TKS_NONE, "cannot open %s: %s",
                        from, strerror(errno));
    rc = tks_pwrite_all(fd, page, sizeof page, 0, from);
    if (!rc && fsync(fd) != 0)
        rc = tks_fail(tks_write_errno_code(errno), from, global, TKS_NONE, "cannot fsync %s: %s",
                      from, strerror(errno));
    close(fd);
    if (!rc && rename(from, to) != 0)
        rc = tks_fail(TKS_ERR_IO, to, global, TKS_NONE, "cannot rename %s to %s: %s", from, to,
                      strerror(errno));
    return rc;
}

int tks_build_job_finish(tks_build_job *j, tks_build_stats *stats) {
    tks_build_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!j->coordinator)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_finish: only the coordinator finishes a build");
    if (j->planning)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                        "tks_build_job_finish: the units are not all planned");
    tks_shard_info *all = NULL;
    size_t n_all = 0, cap = 0;
    uint64_t empty = 0;
    int rc = 0;
    char dir[PATH_MAX], from[PATH_MAX], to[PATH_MAX], name[32];
    for (size_t k = 0; k < j->n_units && !rc; k++) {
        unit_record r;
        if (!unit_complete(j, k, n_all, &r)) {
            rc = tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                          "unit %zu in %s is missing or damaged: re-run the same command with "
                          "--resume to build it again",
                          k, j->partial);
            break;
        }
        empty += r.empty_after_tokenize;
        if (j->done[k]) stats->resumed_shards += r.n;
        unit_dir(j, k, dir, sizeof dir);
        for (size_t i = 0; i < r.n && !rc; i++) {
            uint64_t g = n_all;
            if (g > UINT32_MAX) {
                rc = tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE,
                              "more than 2^32 shards: raise --shard-tokens");
                break;
            }
            tks_shard_info si = r.shards[i];
            snprintf(name, sizeof name, "shard-%05llu.tks", (unsigned long long)g);
            rc = tks_path_join(from, sizeof from, dir, si.file);
            if (!rc) rc = tks_path_join(to, sizeof to, j->partial, name);
            if (rc) break;
            if (access(from, F_OK) == 0) {
                rc = place_shard(from, to, (uint32_t)g, &si);
            } else { /* placed by an earlier finish */
                tks_shard *sh = NULL;
                rc = tks_shard_open(to, &sh);
                if (!rc) si.header_xxh3 = tks_shard_hdr(sh)->header_xxh3;
                tks_shard_close(sh);
            }
            snprintf(si.file, sizeof si.file, "%s", name);
            si.index = (uint32_t)g;
            if (!rc && n_all == cap) {
                size_t c = cap ? 2 * cap : 64;
                if (tks_resize(&all, c, sizeof *all))
                    rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
                else cap = c;
            }
            if (!rc) all[n_all++] = si;
        }
        free(r.shards);
    }
    if (!rc) { /* a plain build's shards not kept, beyond the dataset's, and its state */
        tks_partial_clean(j->partial, n_all, PLAIN_NAME);
        rc = tks_fsync_dir(j->partial);
    }
    if (!rc && n_all == 0)
        rc = no_text(&j->input);
    if (!rc)
        rc = write_manifest(&j->o, j->partial, j->spm, j->desc, &j->input, all, n_all, empty, stats);
    if (!rc) {
        tks_path_join(to, sizeof to, j->partial, tks_partial_state_name(TKS_PARTIAL_BUILD));
        unlink(to);
        tks_path_join(to, sizeof to, j->partial, "in-flight.txt"); /* tokshard's report, if any */
        unlink(to);
        for (size_t k = 0; k < j->n_units; k++) {
            unit_dir(j, k, dir, sizeof dir);
            if (tks_path_join(from, sizeof from, dir, UNIT_RECORD) == 0) unlink(from);
            rmdir(dir);
        }
        rc = tks_partial_publish(TKS_PARTIAL_BUILD, j->partial, j->out);
    }
    stats->seconds = omp_get_wtime() - j->t0;
    encoder_report(j->spm, &j->o, stats);
    free(all);
    return rc;
}

void tks_build_job_free(tks_build_job *j) {
    if (!j) return;
    json_decref(j->desc);
    tks_input_free(j->plan_in);
    free(j->was);
    free(j->plain_shards);
    free(j->plain_ends);
    free(j->units);
    free(j->done);
    tks_spm_free(j->spm);
    tks_unlock(j->lock_fd, j->lock_path);
    free(j);
}

/* tks_build on a partial build by work units: its missing units, in order, here. */
static int build_units_here(const tks_build_opts *o, tks_build_stats *stats) {
    tks_build_job *j = NULL;
    int rc = tks_build_job_open(o, 1, &j);
    tks_build_unit u;
    while (!rc && (rc = tks_build_job_plan(j, &u)) == 1) {
        tks_unit_stats us;
        rc = tks_build_job_unit_done(j, u.index) ? 0 : tks_build_job_run(j, &u, &us);
    }
    if (!rc) rc = tks_build_job_finish(j, stats);
    tks_build_job_free(j);
    return rc;
}
