/* reread.c - one input file's documents read again where a build found
 * them (tks_source: tokshard audit --against-source).
 *
 * The reader is the build's own: a view over one range of a one-file
 * listing (tks__input_view), opened with the build's options, so a
 * document's bytes are split, checked and decoded by the same code, JSON
 * Lines records by tks_jsonl_decode as the build's encoding threads do.
 * Where a document is found depends on the file:
 *   - a plain file (text or JSON Lines as it is on disk): the range starts
 *     at the document's offset, which is a file offset; one pread away (a
 *     document within 64 KiB after the last one read is read on to);
 *   - a Parquet file: its row group is read from its first row to the row;
 *   - a compressed file or an archive: read from its start (a compressed
 *     stream cannot be entered in the middle), and on, for the documents
 *     asked for later in the same file in increasing order of member and
 *     offset, an archive's members before the document's skipped whole
 *     (decompressed, not split into documents); a document before the last
 *     one read starts over.
 * A document is found when the reader yields one at exactly its member and
 * offset; none there (the reader passed it, or the file ended) means the
 * file is not what it was. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/input/input.h"

/* A plain file's reader reads on to a later document up to this far past
 * the last one, rather than opening the file at the new offset (a pread:
 * cheaper than reading much more than a block on). */
#define READ_ON_BYTES ((uint64_t)64 << 10)

struct tks_source {
    tks_input *ls;        /* the one-file listing */
    int kind;             /* TKS_SOURCE_* */
    tks__range rg;        /* the range `cur` reads (cur borrows it) */
    tks_input *cur;       /* the reader, or NULL */
    int have_last;        /* cur yielded a document: last_entry, last_off */
    uint32_t last_entry;
    uint64_t last_off;
    json_t *root;         /* the decoded record of the last JSON Lines document */
};

int tks_source_open(const char *path, const tks_input_opts *o, tks_source **out) {
    *out = NULL;
    tks_source *s = calloc(1, sizeof *s);
    if (!s) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    tks_input_opts io = *o;
    io.bad_input = TKS_POLICY_FAIL; /* a file no longer in its format is named, not left out */
    int rc = tks_input_open(&path, 1, &io, &s->ls);
    if (!rc && s->ls->n_files != 1)
        rc = tks_fail(TKS_ERR_INPUT, path, TKS_NONE, TKS_NONE,
                      "%s is no longer one regular file (the build read it as one)", path);
    int plain = 0;
    if (!rc && s->ls->meta[0].parquet) {
        s->kind = TKS_SOURCE_PARQUET;
    } else if (!rc) {
        if (!tks__is_archive_name(path) && !tks__is_compressed_name(path)) rc = tks__file_plain(s->ls, 0, &plain);
        s->kind = plain ? TKS_SOURCE_PLAIN : TKS_SOURCE_STREAM;
    }
    if (rc) {
        tks_source_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int tks_source_kind(const tks_source *s) { return s->kind; }
uint64_t tks_source_size(const tks_source *s) { return s->ls->sizes[0]; }

/* A new reader over s->rg. */
static int restart(tks_source *s, tks__range rg) {
    tks_input_free(s->cur);
    s->cur = NULL;
    s->have_last = 0;
    s->rg = rg;
    int rc = tks__input_view(s->ls, &s->rg, 1, s->ls->opts.stop, &s->cur);
    if (!rc) s->cur->no_hash = 1; /* left early, nothing read on to hash (tks_source_hash hashes) */
    return rc;
}

/* A reading error r: the reader dropped (its error is kept), the next read starts over. */
static int fail_read(tks_source *s, int r) {
    tks_input_free(s->cur);
    s->cur = NULL;
    s->have_last = 0;
    return r;
}

/* <0, 0 or >0 as (e1, o1) is before, at or after (e2, o2). */
static int cmp_place(uint32_t e1, uint64_t o1, uint32_t e2, uint64_t o2) {
    if (e1 != e2) return e1 < e2 ? -1 : 1;
    return o1 < o2 ? -1 : o1 > o2;
}

/* A JSON Lines record yielded undecoded: its text, as the build decodes it. */
static int decode_record(tks_source *s, tks_doc *doc, char *why, size_t cap) {
    const char *key = s->ls->opts.jsonl_key ? s->ls->opts.jsonl_key : "text";
    uint64_t max_doc = s->ls->opts.max_doc_bytes ? s->ls->opts.max_doc_bytes : (64u << 20);
    const char *text;
    size_t n;
    char w[300] = "";
    tks_jsonl_status st = tks_jsonl_decode(doc->text, doc->len, key, max_doc, &s->root, &text, &n, w, sizeof w);
    if (st != TKS_JSONL_OK) {
        snprintf(why, cap, "the JSON Lines record there no longer gives a document: %s",
                 st == TKS_JSONL_BAD ? w : st == TKS_JSONL_LONG ? "its text is over --max-doc-bytes" : "its text is empty");
        return 0;
    }
    doc->text = text;
    doc->len = n;
    doc->json = 0;
    return 1;
}

int tks_source_read(tks_source *s, uint32_t entry, uint64_t offset, tks_doc *doc, char *why, size_t cap) {
    json_decref(s->root);
    s->root = NULL;
    why[0] = 0;
    int rc = 0;
    uint64_t size = s->ls->sizes[0];
    if (s->kind == TKS_SOURCE_PLAIN) {
        if (entry != 0 || offset >= size) {
            snprintf(why, cap, "the file holds %llu bytes now, none at offset %llu", (unsigned long long)size,
                     (unsigned long long)offset);
            return 0;
        }
        /* a later document within a few blocks of the last one: read on to it */
        if (!s->cur || !s->have_last || cmp_place(s->last_entry, s->last_off, entry, offset) >= 0 ||
            offset - s->last_off > READ_ON_BYTES)
            rc = restart(s, (tks__range){0, offset, size, 0, 0});
    } else if (s->kind == TKS_SOURCE_PARQUET) {
        if (entry >= s->ls->meta[0].pq_n) {
            snprintf(why, cap, "the file has %u row groups now, no row group %u", s->ls->meta[0].pq_n, entry);
            return 0;
        }
        if (!s->cur || s->rg.start != entry || !s->have_last || s->last_off >= offset)
            rc = restart(s, (tks__range){0, entry, (uint64_t)entry + 1, TKS__RANGE_PARQUET, 0});
    } else if (!s->cur || !s->have_last || cmp_place(s->last_entry, s->last_off, entry, offset) >= 0) {
        rc = restart(s, (tks__range){0, 0, size, 1, 0});
    }
    if (rc) return rc;
    for (;;) {
        int r = tks_input_next(s->cur, doc);
        if (r < 0) return fail_read(s, r);
        if (r == 0) {
            s->have_last = 0;
            snprintf(why, cap, "the file ends before that place");
            return 0;
        }
        s->have_last = 1;
        s->last_entry = doc->entry;
        s->last_off = doc->offset;
        int c = cmp_place(doc->entry, doc->offset, entry, offset);
        if (c > 0) {
            snprintf(why, cap, "no document starts there now (the next one is at %s %u, offset %llu)",
                     s->kind == TKS_SOURCE_PARQUET ? "row group" : "member", doc->entry,
                     (unsigned long long)doc->offset);
            return 0;
        }
        if (c == 0) break;
        /* an archive's members before the document's: passed without reading their documents */
        while (c < 0 && s->cur->a && s->cur->is_archive && s->cur->in_entry && s->cur->entry_no < entry) {
            int e = tks__next_entry(s->cur);
            if (e < 0) return fail_read(s, e);
            if (e == 0) s->cur->in_entry = 0; /* the archive's end: the next read says so */
            if (e == 0) break;
        }
    }
    return doc->json ? decode_record(s, doc, why, cap) : 1;
}

int tks_source_hash(tks_source *s, uint64_t start, uint64_t end, int whole, uint8_t out[16]) {
    const char *path = s->ls->files[0];
    if (whole) return tks_file_xxh3_128(path, out, NULL);
    if (s->kind == TKS_SOURCE_PARQUET) {
        uint64_t a, b;
        tks__pq_span(s->ls, 0, start, end, &a, &b);
        return tks__range_xxh3(path, a, b, out);
    }
    return tks__range_xxh3(path, start, end, out);
}

void tks_source_free(tks_source *s) {
    if (!s) return;
    json_decref(s->root);
    tks_input_free(s->cur);
    tks_input_free(s->ls);
    free(s);
}
