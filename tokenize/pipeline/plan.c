/* plan.c - the work units of a build, from the inputs' listing alone
 * (docs/SCALE.md, "Work units").
 *
 * Pieces: each input file is one piece, except a plain file (a regular file
 * whose name promises neither an archive nor compression) larger than
 * unit_bytes U whose documents can be told apart in its bytes (--doc-split
 * line or blank-line, or JSON Lines): that one is cut into the pieces
 * [kU, (k+1)U) of its bytes, k = 0, 1, ... Units: the pieces in input order,
 * a unit taking the next piece unless it holds some already and the piece
 * would bring it over U. A Parquet file's pieces are runs of its row groups
 * of about U column bytes (parquet_pieces). All of this is metadata (paths,
 * sizes, names, the Parquet footers' row groups read with the listing), the
 * same on every process: O(files + row groups), nothing else read.
 *
 * Where a cut lands, a document boundary, is the input's business
 * (tokenize/input/ranges.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

/* How file i may be cut: 0 never, 1 after any line end, 2 after a blank line. */
static int cut_kind(const tks_input *ls, size_t i, uint64_t unit_bytes) {
    const char *name = ls->files[i];
    if (!ls->meta[i].regular || ls->sizes[i] <= unit_bytes || tks__is_archive_name(name) ||
        tks__is_compressed_name(name))
        return 0;
    if (tks__input_is_jsonl(ls, name) || ls->opts.split == TKS_SPLIT_LINE) return 1;
    return ls->opts.split == TKS_SPLIT_BLANK ? 2 : 0;
}

/* The estimate of a piece's work the hand-out order uses: its bytes on disk,
 * four times for a compressed file or an archive (text compresses 3-5x). */
static uint64_t piece_weight(const tks_input *ls, const tks__piece *pc) {
    const char *name = ls->files[pc->file];
    uint64_t b = pc->bytes;
    if (pc->cut == TKS__RANGE_PARQUET) return b; /* the column's uncompressed bytes: text */
    return tks__is_archive_name(name) || tks__is_compressed_name(name) ? 4 * b : b;
}

static int push_piece(tks__plan *p, size_t *cap, tks__piece pc) {
    if (p->n_pieces == *cap) {
        size_t c = *cap ? 2 * *cap : 1024;
        if (tks_resize(&p->pieces, c, sizeof *p->pieces))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (plan)");
        *cap = c;
    }
    p->pieces[p->n_pieces++] = pc;
    return 0;
}

/* A Parquet file's pieces: runs of its row groups, a piece taking the next
 * row group unless it holds some already and the group's column bytes
 * (uncompressed, from the footer) would bring it over unit_bytes. A file
 * without row groups is one empty piece (it still counts as an input). */
static int parquet_pieces(const tks_input *ls, size_t i, uint64_t unit_bytes, tks__plan *p, size_t *cap) {
    const struct file_meta *m = &ls->meta[i];
    if (m->pq_n == 0) return push_piece(p, cap, (tks__piece){i, 0, 0, TKS__RANGE_PARQUET, 0, 0});
    uint64_t a = 0, bytes = 0;
    for (uint64_t g = 0; g < m->pq_n; g++) {
        uint64_t b = m->pq[g].bytes;
        if (g > a && b > unit_bytes - (bytes < unit_bytes ? bytes : unit_bytes)) {
            int rc = push_piece(p, cap, (tks__piece){i, a, g, TKS__RANGE_PARQUET, 0, bytes});
            if (rc) return rc;
            a = g;
            bytes = 0;
        }
        bytes += b;
    }
    return push_piece(p, cap, (tks__piece){i, a, m->pq_n, TKS__RANGE_PARQUET, 0, bytes});
}

/* Hand-out order: heavier units first, then by index (qsort_r over unit
 * indices; units[] passed, not kept in a global). */
static int by_weight(const void *a, const void *b, void *units) {
    const tks_build_unit *u = units, *x = &u[*(const uint64_t *)a], *y = &u[*(const uint64_t *)b];
    if (x->weight != y->weight) return x->weight < y->weight ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int tks__plan_make(const tks_input *ls, uint64_t unit_bytes, tks__plan *p) {
    memset(p, 0, sizeof *p);
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < ls->n_files && !rc; i++) {
        uint64_t size = ls->sizes[i];
        if (ls->meta[i].parquet) {
            rc = parquet_pieces(ls, i, unit_bytes, p, &cap);
            continue;
        }
        if (!cut_kind(ls, i, unit_bytes)) {
            rc = push_piece(p, &cap, (tks__piece){i, 0, size, 0, 0, size});
            continue;
        }
        for (uint64_t a = 0; a < size && !rc; a += unit_bytes) {
            uint64_t b = size - a > unit_bytes ? a + unit_bytes : size;
            rc = push_piece(p, &cap, (tks__piece){i, a, b, 1, 0, b - a});
        }
    }
    if (!rc && !(p->units = calloc(p->n_pieces ? p->n_pieces : 1, sizeof *p->units)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (plan)");
    tks_build_unit *u = NULL;
    for (size_t k = 0; k < p->n_pieces && !rc; k++) {
        uint64_t b = p->pieces[k].bytes;
        if (!u || (u->bytes > 0 && b > unit_bytes - (u->bytes < unit_bytes ? u->bytes : unit_bytes))) {
            u = &p->units[p->n_units];
            u->index = p->n_units++;
            u->first_piece = k;
        }
        u->n_pieces++;
        u->bytes += b;
        u->weight += piece_weight(ls, &p->pieces[k]);
    }
    if (!rc && !(p->order = malloc((p->n_units ? p->n_units : 1) * sizeof *p->order)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (plan)");
    if (!rc) {
        for (size_t k = 0; k < p->n_units; k++) p->order[k] = k;
        qsort_r(p->order, p->n_units, sizeof *p->order, by_weight, p->units);
    }
    if (rc) tks__plan_free(p);
    return rc;
}

void tks__plan_free(tks__plan *p) {
    free(p->pieces);
    free(p->units);
    free(p->order);
    memset(p, 0, sizeof *p);
}

int tks__unit_ranges(const tks_input *ls, const tks__plan *p, uint64_t unit, uint64_t unit_bytes,
                     tks__range **out, size_t *n) {
    const tks_build_unit *u = &p->units[unit];
    tks__range *r = calloc(u->n_pieces ? u->n_pieces : 1, sizeof *r);
    *out = r;
    *n = 0;
    if (!r) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    int rc = 0;
    for (uint64_t k = 0; k < u->n_pieces && !rc; k++) {
        const tks__piece *pc = &p->pieces[u->first_piece + k];
        if (pc->cut == TKS__RANGE_PARQUET) {
            r[(*n)++] = (tks__range){pc->file, pc->start, pc->end, TKS__RANGE_PARQUET, 0};
            continue;
        }
        int kind = pc->cut ? cut_kind(ls, pc->file, unit_bytes) : 0;
        if (!kind) r[(*n)++] = (tks__range){pc->file, 0, ls->sizes[pc->file], 1, 0};
        else rc = tks__cut_range(ls, pc->file, pc->start, pc->end, kind, r, n);
    }
    return rc;
}
