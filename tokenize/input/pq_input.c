/* pq_input.c - the documents of a Parquet input: one per row of its document
 * column (tks_input_opts.parquet_column), row group by row group through
 * tokenize/parquet.h. The listing read each file's footer (input.c,
 * check_parquet); a work unit reads a run of row groups (plan.c), a plain
 * reader every row group. The rows go through the same policies as text: a
 * null or empty row is an empty document (skipped, counted), a row over
 * max_doc_bytes follows long_doc, invalid UTF-8 and NUL bytes (a binary
 * column) follow invalid_utf8 and the binary rule (policy.c, tks__emit). A
 * document's line is its 1-based row number in the file. */
#include <string.h>

#include "tokenize/input/input.h"

const char *tks_input_parquet_reader(void) { return tks_pq_available() ? tks_pq_version() : NULL; }

int tks__pq_open_file(tks_input *in, uint64_t g0, uint64_t g1) {
    size_t i = in->next_file++;
    const struct file_meta *m = &in->meta[i];
    in->path = in->files[i];
    in->source.len = 0;
    int rc = tks__buf_append(&in->source, in->path, strlen(in->path) + 1);
    if (rc) return rc;
    in->source.len--;
    in->cur_fh = in->ranges ? &in->rh[in->next_range - 1] : in->fh ? &in->fh[i] : NULL;
    if (g0 == 0) {
        in->st.files++;
        in->st.entries++;
    }
    rc = tks_pq_open(in->path, in->opts.parquet_column ? in->opts.parquet_column : "text", &in->pqr);
    if (rc) return rc;
    /* the footer must still be the one the listing read (a file rewritten
     * since would be cut at other row groups) */
    const tks_pq_group *g = tks_pq_groups(in->pqr);
    int same = tks_pq_n_groups(in->pqr) == m->pq_n;
    for (uint32_t k = 0; same && k < m->pq_n; k++)
        same = !memcmp(&g[k], &m->pq[k], sizeof g[k]);
    if (!same)
        return tks_fail(TKS_ERR_INPUT, in->path, TKS_NONE, TKS_NONE,
                        "%s changed since the build listed it (its Parquet footer differs): let "
                        "whatever writes it finish, then build again", in->path);
    in->pq_g = (size_t)g0;
    in->pq_end = (size_t)(g1 < m->pq_n ? g1 : m->pq_n);
    in->pq_in_group = 0;
    in->pq_row = 0;
    for (size_t k = 0; k < in->pq_g; k++) in->pq_row += m->pq[k].rows;
    return 0;
}

static void pq_close(tks_input *in) {
    if (!in->pqr) return;
    tks_pq_close(in->pqr);
    in->pqr = NULL;
}

/* The hash of what was read, once every row group of the file or range was:
 * the bytes its column chunks span (a range), or the whole file. */
static int finish(tks_input *in) {
    struct file_hash *fh = in->cur_fh;
    size_t file = (size_t)(in->next_file - 1);
    uint64_t a, b;
    uint64_t g0 = in->ranges ? in->ranges[in->next_range - 1].start : 0;
    tks__pq_span(in, file, g0, in->pq_end, &a, &b);
    in->st.bytes_in += b - a;
    int rc = 0;
    if (fh && !fh->done && !in->no_hash) {
        if (in->ranges) {
            tks__range r = in->ranges[in->next_range - 1];
            rc = tks__range_hash(in, &r, fh->h);
            fh->bytes = b - a;
        } else {
            rc = tks_file_xxh3_128(in->path, fh->h, &fh->bytes);
        }
        fh->done = !rc;
    }
    pq_close(in);
    return rc;
}

int tks__pq_next_doc(tks_input *in, tks_doc *doc) {
    for (;;) {
        if (tks__stopped(in->opts.stop))
            return tks_fail(TKS_ERR_INTERRUPTED, in->path, TKS_NONE, TKS_NONE,
                            "interrupted while reading %s (row %llu)", in->path,
                            (unsigned long long)in->pq_row);
        if (!in->pq_in_group) {
            if (in->pq_g >= in->pq_end) return finish(in);
            int rc = tks_pq_start(in->pqr, in->pq_g);
            if (rc) return rc;
            in->pq_in_group = 1;
            in->pq_row0 = in->pq_row;
        }
        const char *s;
        size_t n;
        int null = 0;
        int r = tks_pq_next(in->pqr, &s, &n, &null);
        if (r < 0) return r;
        if (r == 0) {
            in->pq_in_group = 0;
            in->pq_g++;
            continue;
        }
        uint64_t row = ++in->pq_row;
        in->st.bytes_text += n;
        if (null || n == 0) {
            in->st.empty_skipped++;
            continue;
        }
        if (n > in->max_doc) {
            if ((r = tks__too_long(in, row)) < 0) return r;
            continue;
        }
        if ((r = tks__emit(in, s, n, row, TKS_NONE, doc)) != 0) {
            doc->entry = (uint32_t)in->pq_g; /* its row group, and its row there */
            doc->offset = row - 1 - in->pq_row0;
            return r;
        }
    }
}
