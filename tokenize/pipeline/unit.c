/* unit.c - running one work unit (tks_build_job_run): a complete unit of an
 * earlier run kept when its inputs hash as recorded, otherwise its ranges
 * read on a reader thread, encoded in batches (batch.c) and written to its
 * shards while the rest of each batch is being encoded, its progress.json
 * rewritten at each sealed shard (the resume grain inside a unit), its
 * record written last. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

/* Code points of the written documents that the byte-level encoder's
 * Unicode leaves unassigned, and the documents that hold some (the
 * manifest's tokenizer record: a reference on a newer Unicode may give
 * other ids around them). */
typedef struct unassigned {
    uint64_t code_points, docs;
} unassigned;

/* ---------------------------------------------------------------------------
 * A unit's progress: the resume grain inside a unit
 *
 * Each time the unit's writer seals a shard, unit-NNNNN/progress.json records
 * what the sealed shards hold: `next`, the records the reader had handed out
 * before the end of the last sealed document (ordinals below it); those
 * records' counters (skipped by cause, empty after tokenizing, documents and
 * tokens written); the sealed shards; and the XXH3-128 of those records'
 * bytes in order. A resume of an unfinished unit keeps the sealed shards
 * that still match their record, reads the unit's input again from its start
 * without encoding the records below `next` (reading and decompressing are
 * an order of magnitude faster than encoding), checks the hash of their
 * bytes against the record (an input rewritten in place with its size and
 * time is refused), and encodes from there into the next shard number. The
 * unit's shards are then the bytes an uninterrupted build writes, for any
 * thread and process count, and a kill loses at most the shard being filled.
 * ------------------------------------------------------------------------- */
typedef struct progress {
    uint64_t next;                       /* records below this ordinal are in sealed shards or skipped */
    uint64_t empty;                      /* among them: documents that gave no token */
    deferred dj;                         /* among them: records skipped by cause */
    uint64_t docs_written, tokens_written;
    unassigned un;                       /* among them: code points unassigned in the encoder's Unicode */
    tks_shard_info *shards;              /* the shards sealed by an earlier run (kept), local numbering */
    size_t n;
    uint8_t docs_h[16];                  /* XXH3-128 of the records below next */
} progress;

/* One record into the running hash of a unit's records: its length, then
 * its bytes (a JSONL record as read, before decoding). */
static void hash_record(XXH3_state_t *h, const batch *b, size_t i) {
    uint64_t len = b->len[i];
    XXH3_128bits_update(h, &len, sizeof len);
    XXH3_128bits_update(h, b->arena + b->off[i], b->len[i]);
}

static void hash_digest(XXH3_state_t *h, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
    memcpy(out, c.digest, 16);
}

/* progress.json for unit k: p's counters, p's kept shards then the ones w
 * sealed. Written atomically, after the shard it follows was published. */
static int write_progress(const tks_build_job *j, uint64_t k, const progress *p, tks_writer *w) {
    json_t *shards = json_array();
    size_t ns;
    const tks_shard_info *si = tks_writer_shards(w, &ns);
    for (size_t i = 0; i < p->n; i++) json_array_append_new(shards, tks_shard_record(&p->shards[i]));
    for (size_t i = 0; i < ns; i++) json_array_append_new(shards, tks_shard_record(&si[i]));
    char hx[33], path[PATH_MAX];
    tks_hex(p->docs_h, 16, hx);
    json_t *js = json_pack("{s:s, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:I, s:I, s:s, s:o}",
                           "build_id", j->build_id, "unit", (json_int_t)k, "next", (json_int_t)p->next,
                           "empty_after_tokenize", (json_int_t)p->empty, "skipped", "all",
                           (json_int_t)p->dj.skipped, "bad", (json_int_t)p->dj.bad, "long",
                           (json_int_t)p->dj.too_long, "empty", (json_int_t)p->dj.empty, "docs_written",
                           (json_int_t)p->docs_written, "tokens_written", (json_int_t)p->tokens_written,
                           "unassigned", (json_int_t)p->un.code_points, "unassigned_docs",
                           (json_int_t)p->un.docs, "docs_xxh3", hx, "shards", shards);
    char *text = js ? json_dumps(js, JSON_INDENT(1)) : NULL;
    json_decref(js);
    int rc = text ? tks__unit_file(j, k, UNIT_PROGRESS, path, sizeof path)
                  : tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static uint64_t uint_at(const json_t *o, const char *key) {
    json_int_t v = json_integer_value(json_object_get(o, key));
    return v > 0 ? (uint64_t)v : 0;
}

/* Unit k's progress from an earlier run, when it is this build's and every
 * shard it lists is in the unit's directory as recorded: 1 with *p filled
 * (p->shards the caller's), else 0 (the unit is built from its start). */
static int read_progress(const tks_build_job *j, uint64_t k, progress *p) {
    char path[PATH_MAX], dir[PATH_MAX], sp[PATH_MAX];
    memset(p, 0, sizeof *p);
    if (tks__unit_dir(j, k, dir, sizeof dir) || tks__unit_file(j, k, UNIT_PROGRESS, path, sizeof path) ||
        access(path, F_OK) != 0)
        return 0;
    json_t *js = json_load_file(path, 0, NULL), *arr = json_object_get(js, "shards"),
           *sk = json_object_get(js, "skipped");
    const char *id = json_string_value(json_object_get(js, "build_id")),
               *hx = json_string_value(json_object_get(js, "docs_xxh3"));
    size_t m = json_array_size(arr);
    int ok = js && id && !strcmp(id, j->build_id) && uint_at(js, "unit") == k && json_is_array(arr) && m &&
             json_is_object(sk) && hx && strlen(hx) == 32 && tks_unhex(hx, p->docs_h, 16) == 0 &&
             (p->shards = calloc(m, sizeof *p->shards));
    for (size_t i = 0; ok && i < m; i++)
        ok = tks_shard_record_read(json_array_get(arr, i), i, &p->shards[i]) == 0 &&
             tks_path_join(sp, sizeof sp, dir, p->shards[i].file) == 0 &&
             tks__job_shard_recorded(sp, &p->shards[i], (uint32_t)i, (uint32_t)i, i);
    if (ok) {
        p->n = m;
        p->next = uint_at(js, "next");
        p->empty = uint_at(js, "empty_after_tokenize");
        p->dj = (deferred){uint_at(sk, "all"), uint_at(sk, "bad"), uint_at(sk, "long"), uint_at(sk, "empty")};
        p->docs_written = uint_at(js, "docs_written");
        p->tokens_written = uint_at(js, "tokens_written");
        p->un = (unassigned){uint_at(js, "unassigned"), uint_at(js, "unassigned_docs")};
        ok = p->next > 0;
    }
    json_decref(js);
    tks_clear_error();
    if (!ok) {
        free(p->shards);
        memset(p, 0, sizeof *p);
    }
    return ok;
}

/* A resumed unit's directory: everything but its kept shards and
 * progress.json goes (the shard being filled when the run stopped, a shard
 * sealed after the last progress.json). */
static void keep_progress_only(const char *dir, const progress *p) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[PATH_MAX];
    while (d && (e = readdir(d))) {
        int keep = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, UNIT_PROGRESS);
        for (size_t i = 0; i < p->n && !keep; i++) keep = !strcmp(e->d_name, p->shards[i].file);
        if (!keep && tks_path_join(path, sizeof path, dir, e->d_name) == 0) unlink(path);
    }
    if (d) closedir(d);
}

/* The record of a unit just built: its ranges with their hashes, counters
 * and shards (local numbering). NULL when out of memory. */
static json_t *new_record(const tks_build_job *j, uint64_t k, const tks_input *in, const tks__range *r,
                          size_t nr, const tks_shard_info *si, size_t ns, uint64_t empty, const deferred *d,
                          const unassigned *un) {
    json_t *ranges = json_array(), *shards = json_array();
    for (size_t i = 0; i < nr; i++) {
        char hx[33];
        tks_hex(tks__input_range_xxh3(in, i), 16, hx);
        json_t *g = json_pack("{s:I, s:I, s:I, s:b, s:s}", "file", (json_int_t)r[i].file, "start",
                              (json_int_t)r[i].start, "end", (json_int_t)r[i].end, "whole", (int)r[i].whole,
                              "xxh3_128", hx);
        if (g && r[i].whole == TKS__RANGE_PARQUET) /* start and end are row groups */
            json_object_set_new(g, "parquet", json_true());
        json_array_append_new(ranges, g);
    }
    for (size_t i = 0; i < ns; i++) json_array_append_new(shards, tks_shard_record(&si[i]));
    tks_input_stats st = *tks_input_get_stats(in);
    st.docs -= d->skipped;
    st.bad_records_skipped += d->bad;
    st.long_skipped += d->too_long;
    st.empty_skipped += d->empty;
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "build_id", j->build_id, "unit", (json_int_t)k,
                     "empty_after_tokenize", (json_int_t)empty, "unassigned", (json_int_t)un->code_points,
                     "unassigned_docs", (json_int_t)un->docs, "stats", tks__stats_json(&st), "ranges", ranges,
                     "shards", shards);
}

/* The records a resumed unit read again without encoding must be those the
 * sealed shards came from. */
static int check_skipped(const tks_build_job *j, uint64_t k, XXH3_state_t *dh, const progress *pg) {
    uint8_t h[16];
    hash_digest(dh, h);
    if (!memcmp(h, pg->docs_h, 16)) return 0;
    return tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                    "cannot resume unit %llu: its first %llu records are not the ones its %zu kept shards "
                    "were made from (an input was changed in place since the interrupted build); "
                    "remove %s and build again",
                    (unsigned long long)k, (unsigned long long)pg->next, pg->n, j->partial);
}

/* What a unit's batches are written with: the writer, the counters, the
 * hash of the records read and the resume state (unit_batches). */
typedef struct sink {
    tks_build_job *j;
    uint64_t k;
    const tks_input *in;
    tks_writer *w;
    tks_unit_stats *us;
    uint64_t *empty;
    deferred *dj;
    unassigned *un;
    progress *pg;
    XXH3_state_t *dh;
    uint64_t skip;  /* records the kept shards hold (0 once checked) */
    size_t first;   /* the batch's records before this one are skipped, not encoded */
    size_t next;    /* the batch's next record to write */
} sink;

/* Record i of the batch: hashed, then skipped (kept shards hold it, or a
 * bad record under a skip policy) or written. */
static int sink_one(sink *c, batch *b, size_t i) {
    const tks_build_opts *o = &c->j->o;
    hash_record(c->dh, b, i);
    if (i < c->first) {
        if (b->ordinal[i] + 1 != c->skip) return 0;
        c->skip = 0;
        return check_skipped(c->j, c->k, c->dh, c->pg);
    }
    if (b->status[i] != TKS_JSONL_OK) return tks__deferred_skip(c->in, b, i, c->dj);
    tks_ids *v = &b->ids[i];
    if (v->n == 0) {
        ++*c->empty;
        return 0;
    }
    int sealed = 0;
    int rc = tks__add_specials(v, o, c->j->bos, c->j->eos);
    if (!rc) rc = tks_writer_add_prov(c->w, v->ids, v->n, b->ordinal[i] - c->dj->skipped, &b->prov[i], &sealed);
    c->us->docs_written++;
    c->us->tokens_written += v->n;
    c->un->code_points += b->unassigned[i];
    c->un->docs += b->unassigned[i] > 0;
    if (!rc && sealed) { /* a shard sealed: what it and the ones before hold */
        progress *pg = c->pg;
        pg->next = b->ordinal[i] + 1;
        pg->empty = *c->empty;
        pg->dj = *c->dj;
        pg->docs_written = c->us->docs_written;
        pg->tokens_written = c->us->tokens_written;
        pg->un = *c->un;
        hash_digest(c->dh, pg->docs_h);
        rc = write_progress(c->j, c->k, pg, c->w);
    }
    return rc;
}

/* tks__drain: the batch's records from the cursor on, in order, as far as
 * they are finished (a skipped one always is); a record whose encoding
 * failed stops it (the encoder's error is the batch's). */
static int sink_drain(void *ctx, batch *b) {
    sink *c = ctx;
    int rc = 0;
    while (!rc && c->next < b->n) {
        size_t i = c->next;
        if (i >= c->first && (!__atomic_load_n(&b->done[i], __ATOMIC_ACQUIRE) || b->err[i])) break;
        c->next++;
        rc = sink_one(c, b, i);
    }
    return rc;
}

/* Reads, encodes and writes the unit's documents (the batches of the
 * reader thread; each written while the rest of it is being encoded);
 * *empty: documents that gave no token. pg: on entry what the kept shards
 * hold (next 0: nothing), then the progress as of the last shard sealed,
 * progress.json rewritten at each. */
static int unit_batches(tks_build_job *j, uint64_t k, tks_input *in, tks_writer *w, tks_unit_stats *us,
                        uint64_t *empty, deferred *dj, unassigned *un, progress *pg) {
    const tks_build_opts *o = &j->o;
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads(), rc = 0, done = 0;
    reader rd = {.in = in, .batch_bytes = o->batch_bytes ? o->batch_bytes : (8u << 20), .stop = o->stop};
    rd.fill = rd.batch_bytes / 8;
    prefetch pf = {.r = &rd};
    tks_build_progress base = j->prog;
    sink c = {.j = j, .k = k, .in = in, .w = w, .us = us, .empty = empty, .dj = dj, .un = un, .pg = pg,
              .skip = pg->next, .dh = XXH3_createState()};
    if (!c.dh) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    XXH3_128bits_reset(c.dh);
    tks__drain drain = {sink_drain, &c};
    tks__prefetch_start(&pf);
    while (!rc && !done) {
        batch *b = NULL;
        if ((rc = tks__prefetch_next(&pf, &b))) break;
        done = b->end;
        c.first = 0; /* records the kept shards hold: read, hashed, not encoded */
        while (c.first < b->n && b->ordinal[c.first] < c.skip) c.first++;
        c.next = 0;
        if (b->n > c.first) rc = tks__encode_batch(j->tk, b, c.first, threads, in->jsonl_key, in->max_doc, &drain);
        /* what is left of the batch: every record finished without error */
        if (!rc) rc = sink_drain(&c, b);
        tks__batch_trim(b, rd.batch_bytes);
        if (!rc && o->progress) {
            size_t ns;
            tks_writer_shards(w, &ns);
            tks_build_progress p = base;
            p.bytes_in += b->input.bytes_in;
            p.bytes_text += b->text_seen;
            p.docs_read += b->docs_seen;
            p.docs_written += us->docs_written;
            p.tokens_written += us->tokens_written;
            p.shards += ns;
            p.seconds = omp_get_wtime() - j->t0;
            o->progress(&p, o->progress_ctx);
        }
        if (!rc && o->stop && *o->stop) /* tks_build_job_run says what to do */
            rc = tks_fail(TKS_ERR_INTERRUPTED, j->partial, TKS_NONE, TKS_NONE, "interrupted");
    }
    tks__prefetch_free(&pf); /* a reader still running after an error is joined */
    XXH3_freeState(c.dh);
    if (!rc && c.skip)
        rc = tks_fail(TKS_ERR_RESUME, j->partial, TKS_NONE, TKS_NONE,
                      "cannot resume unit %llu: its input ends before the %llu records its kept shards "
                      "were made from (an input was changed in place since the interrupted build); "
                      "remove %s and build again",
                      (unsigned long long)k, (unsigned long long)pg->next, j->partial);
    us->text_bytes = rd.text;
    return rc;
}

/* Builds unit k into its directory, from the shards an earlier run sealed
 * (progress.json) or from its start; its record written last. */
static int unit_build(tks_build_job *j, uint64_t k, tks_unit_stats *us) {
    char dir[PATH_MAX], path[PATH_MAX];
    tks__range *r = NULL;
    size_t nr = 0, ns = 0;
    tks_input *in = NULL;
    tks_writer *w = NULL;
    tks_shard_info *all = NULL;
    progress pg;
    int rc = tks__unit_dir(j, k, dir, sizeof dir);
    int resumed = !rc && read_progress(j, k, &pg);
    if (!resumed) memset(&pg, 0, sizeof pg);
    uint64_t empty = pg.empty;
    deferred dj = pg.dj;
    unassigned un = pg.un;
    us->docs_written = pg.docs_written;
    us->tokens_written = pg.tokens_written;
    us->resumed_shards = pg.n;
    if (!rc) {
        if (resumed) keep_progress_only(dir, &pg);
        else rc = tks__reset_dir(dir);
    }
    if (!rc) rc = tks__unit_ranges(j->ls, &j->plan, k, j->unit_bytes, &r, &nr);
    if (!rc) rc = tks__input_view(j->ls, r, nr, j->o.stop, &in);
    if (!rc) rc = tks__open_writer(&j->o, j->tk, dir, (uint32_t)pg.n, &w);
    if (!rc) rc = unit_batches(j, k, in, w, us, &empty, &dj, &un, &pg);
    if (!rc) rc = tks_writer_flush(w);
    if (!rc) { /* the kept shards, then this run's */
        size_t nw;
        const tks_shard_info *si = tks_writer_shards(w, &nw);
        ns = pg.n + nw;
        if (!(all = calloc(ns ? ns : 1, sizeof *all))) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
        else {
            if (pg.n) memcpy(all, pg.shards, pg.n * sizeof *all);
            if (nw) memcpy(all + pg.n, si, nw * sizeof *all);
        }
    }
    json_t *rec = NULL;
    if (!rc && !(rec = new_record(j, k, in, r, nr, all, ns, empty, &dj, &un)))
        rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) rc = tks__unit_write_record(j, k, rec);
    if (!rc && tks__unit_file(j, k, UNIT_PROGRESS, path, sizeof path) == 0) unlink(path); /* unit.json says all */
    if (!rc) {
        unit_state *s = &j->us[k];
        s->shards = all;
        all = NULL;
        s->n = ns;
        s->rec = rec;
        rec = NULL;
        us->bytes_in = tks_input_get_stats(in)->bytes_in;
    }
    json_decref(rec);
    free(all);
    free(pg.shards);
    tks_writer_free(w);
    tks_input_free(in);
    free(r);
    return rc;
}

int tks_build_job_run(tks_build_job *j, uint64_t k, tks_unit_stats *us) {
    double t0 = omp_get_wtime();
    memset(us, 0, sizeof *us);
    if (k >= j->plan.n_units)
        return tks_fail(TKS_ERR_ARG, j->partial, TKS_NONE, TKS_NONE, "no unit %llu", (unsigned long long)k);
    unit_state *s = &j->us[k];
    json_decref(s->rec);
    free(s->shards);
    memset(s, 0, sizeof *s);
    int rc = 0;
    if (tks__unit_load_complete(j, k, &s->rec, &s->shards, &s->n)) { /* complete from an earlier run */
        rc = tks__unit_verify_ranges(j, k, s->rec);
        us->kept = !rc;
        us->text_bytes = (uint64_t)json_integer_value(json_object_get(json_object_get(s->rec, "stats"), "bytes_text"));
        us->bytes_in = (uint64_t)json_integer_value(json_object_get(json_object_get(s->rec, "stats"), "bytes_in"));
        for (size_t i = 0; i < s->n; i++) {
            us->docs_written += s->shards[i].n_docs;
            us->tokens_written += s->shards[i].n_tokens;
        }
    } else {
        rc = unit_build(j, k, us);
    }
    if (!rc) {
        s->ran = 1;
        us->shards = s->n;
        j->prog.bytes_in += us->bytes_in;
        j->prog.bytes_text += us->text_bytes;
        j->prog.docs_written += us->docs_written;
        j->prog.tokens_written += us->tokens_written;
        j->prog.shards += s->n;
    }
    if (rc == TKS_ERR_INTERRUPTED) { /* between batches, or where the reader was ("interrupted while ...") */
        char where[sizeof tks_last_error()->message];
        snprintf(where, sizeof where, "%s", tks_last_error()->message);
        if (strncmp(where, "interrupted while ", 18) != 0) snprintf(where, sizeof where, "interrupted");
        rc = tks_fail(TKS_ERR_INTERRUPTED, j->partial, TKS_NONE, TKS_NONE,
                      "unit %llu: %.300s: the complete units are kept in %s; run the same command with "
                      "--resume to finish", (unsigned long long)k, where, j->partial);
    } else if (rc && tks_last_error()->code == rc) {
        /* a failure names the unit: another process's error is read on its own */
        tks_error e = *tks_last_error();
        char msg[sizeof e.message + 32];
        snprintf(msg, sizeof msg, "unit %llu: %s", (unsigned long long)k, e.message);
        snprintf(e.message, sizeof e.message, "%.*s", (int)sizeof e.message - 1, msg);
        tks_error_restore(&e);
    }
    us->seconds = omp_get_wtime() - t0;
    return rc;
}

