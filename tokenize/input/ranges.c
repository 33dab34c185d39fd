/* ranges.c - byte ranges of input files: where a cut inside a plain file
 * lands (a document boundary), and the hashes a work unit records of what it
 * read (docs/SCALE.md, "Work units").
 *
 * A piece's nominal bounds are moved, by whoever reads the piece, to the
 * first document boundary at or after them (find_cut): a function of the
 * file's bytes only, so the unit that ends at a cut and the unit that starts
 * there find the same byte however many processes share the work. Before any
 * cut the file's first bytes are looked at as the reader would (a "plain"
 * name may hold gzip or xz data, which is then read whole by its first piece,
 * the other pieces being empty). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/input/input.h"

#define CUT_WINDOW ((size_t)64 << 10) /* bytes read per step around a cut */
#define HEAD_BYTES ((size_t)64 << 10) /* bytes looked at for a compressed format */

/* pread of up to n bytes at off: the count (0 at the end), or an error. */
static int read_at(int fd, const char *path, void *b, size_t n, uint64_t off, size_t *got) {
    ssize_t r;
    do r = pread(fd, b, n, (off_t)off);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, off, "cannot read %s at byte %llu: %s", path,
                        (unsigned long long)off, strerror(errno));
    *got = (size_t)r;
    return 0;
}

/* Is the line holding byte x - 1 blank up to x - 1 (exclusive)? Reads
 * backwards to the previous line end or the first byte that is not blank. */
static int blank_before(int fd, const char *path, uint64_t x, char *w, int *blank) {
    uint64_t end = x - 1; /* bytes [.., end) are looked at */
    *blank = 1;
    while (end > 0) {
        uint64_t a = end > CUT_WINDOW ? end - CUT_WINDOW : 0;
        size_t got = 0;
        int rc = read_at(fd, path, w, (size_t)(end - a), a, &got);
        if (rc) return rc;
        if (got < end - a)
            return tks_fail(TKS_ERR_INPUT, path, TKS_NONE, a + got,
                            "%s ended at byte %llu while it was read: let whatever writes it "
                            "finish, then build again", path, (unsigned long long)(a + got));
        for (size_t i = got; i-- > 0;) {
            unsigned char c = (unsigned char)w[i];
            if (c == '\n') return 0;
            if (!tks__blank_byte(c)) {
                *blank = 0;
                return 0;
            }
        }
        end = a;
    }
    return 0;
}

/* The reader was stopped (SIGINT, SIGTERM) while it looked for a cut. */
static int cut_interrupted(const char *path, uint64_t at) {
    return tks_fail(TKS_ERR_INTERRUPTED, path, TKS_NONE, at,
                    "interrupted while looking for a document boundary in %s (at byte %llu)", path,
                    (unsigned long long)at);
}

/* The cut for the nominal offset x of the plain file fd (path, size bytes):
 * the smallest document boundary p with x <= p < size, else size; x == 0
 * gives 0. A boundary is the offset after a "\n" (blank_lines 0: --doc-split
 * line, JSON Lines), or after the "\n" that ends a line of blank bytes only
 * (blank_lines 1: --doc-split blank-line). Looks no further than `limit`
 * (x < limit <= size): when p >= limit, *out is limit. So the start of a
 * piece that holds no boundary (a document longer than the unit goes over
 * it) costs a read of the piece, not of the rest of the document. The stop
 * flag is looked at between windows. Errors: TKS_ERR_IO, TKS_ERR_NOMEM,
 * TKS_ERR_INTERRUPTED. */
static int find_cut(int fd, const char *path, uint64_t size, uint64_t x, int blank_lines, uint64_t limit,
                    volatile sig_atomic_t *stop, uint64_t *out) {
    if (x == 0 || x >= size) {
        *out = x == 0 ? 0 : size;
        return 0;
    }
    *out = limit;
    char *w = malloc(CUT_WINDOW);
    if (!w) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    int blank = 1, rc = blank_lines ? blank_before(fd, path, x, w, &blank) : 0;
    /* a "\n" at offset at + i gives the boundary at + i + 1: those at limit - 1 or past it are not looked at */
    for (uint64_t at = x - 1; !rc && at < limit - 1;) {
        size_t got = 0, want = limit - 1 - at < CUT_WINDOW ? (size_t)(limit - 1 - at) : CUT_WINDOW;
        if (tks__stopped(stop)) rc = cut_interrupted(path, at);
        else rc = read_at(fd, path, w, want, at, &got);
        if (rc || got == 0) break; /* shorter than listed: the reader reports it */
        for (size_t i = 0; i < got; i++) {
            unsigned char c = (unsigned char)w[i];
            if (c == '\n') {
                if (!blank_lines || blank) {
                    *out = at + i + 1;
                    free(w);
                    return 0;
                }
                blank = 1;
            } else if (blank && !tks__blank_byte(c)) {
                blank = 0;
            }
        }
        at += got;
    }
    free(w);
    return rc;
}

/* 1 when the bytes b[0..n) (a file's first bytes) are read as plain text:
 * neither gzip (inflated by stream.c) nor a format libarchive's decompressors
 * take, the test stream.c's reader itself makes. 0, or an error. */
static int head_is_plain(const char *path, const void *b, size_t n, int *plain) {
    const unsigned char *u = b;
    *plain = 0;
    if (n >= 2 && u[0] == 0x1f && u[1] == 0x8b) return 0;
    struct archive *a = archive_read_new();
    if (!a) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    tks__add_filters(a);
    archive_read_support_format_raw(a);
    archive_read_support_format_empty(a);
    if (archive_read_open_memory(a, b, n) == ARCHIVE_OK)
        *plain = archive_filter_count(a) == 1 && archive_filter_code(a, 0) == ARCHIVE_FILTER_NONE;
    archive_read_free(a);
    return 0;
}

int tks__cut_range(const tks_input *ls, uint64_t file, uint64_t start, uint64_t end, int kind, tks__range *r,
                   size_t *n) {
    const char *path = ls->files[file];
    uint64_t size = ls->sizes[file];
    int fd = -1;
    struct stat st;
    int rc = tks_open_regular(path, "input", &fd, &st);
    const struct file_meta *m = &ls->meta[file];
    if (!rc && ((uint64_t)st.st_size != size || st.st_mtim.tv_sec != m->mtime.tv_sec ||
                st.st_mtim.tv_nsec != m->mtime.tv_nsec))
        rc = tks_fail(TKS_ERR_INPUT, path, TKS_NONE, TKS_NONE,
                      "%s changed since the build listed it: %llu bytes then, %llu now; let "
                      "whatever writes it finish, then build again",
                      path, (unsigned long long)size, (unsigned long long)st.st_size);
    char *head = rc ? NULL : malloc(HEAD_BYTES);
    if (!rc && !head) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    size_t got = 0;
    int plain = 0;
    if (!rc) rc = read_at(fd, path, head, size < HEAD_BYTES ? (size_t)size : HEAD_BYTES, 0, &got);
    if (!rc) rc = head_is_plain(path, head, got, &plain);
    free(head);
    uint64_t a = 0, b = size;
    if (!rc && !plain) { /* compressed under a plain name: the first piece reads it whole */
        if (start == 0) r[(*n)++] = (tks__range){file, 0, size, 1, 0};
    } else if (!rc) {
        /* a first cut at `end` or past it: no boundary in the piece, which is
         * empty (the cut at `end` is the same one) */
        rc = find_cut(fd, path, size, start, kind == 2, end, ls->opts.stop, &a);
        if (!rc && a < end) rc = find_cut(fd, path, size, end, kind == 2, size, ls->opts.stop, &b);
        if (!rc && a < end && a < b) r[(*n)++] = (tks__range){file, a, b, 0, 0};
    }
    if (fd >= 0) close(fd);
    return rc;
}

int tks__file_plain(const tks_input *ls, uint64_t file, int *plain) {
    const char *path = ls->files[file];
    uint64_t size = ls->sizes[file];
    int fd = -1;
    *plain = 0;
    int rc = tks_open_regular(path, "input", &fd, NULL);
    char *head = rc ? NULL : malloc(HEAD_BYTES);
    if (!rc && !head) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    size_t got = 0;
    if (!rc) rc = read_at(fd, path, head, size < HEAD_BYTES ? (size_t)size : HEAD_BYTES, 0, &got);
    if (!rc) rc = head_is_plain(path, head, got, plain);
    free(head);
    if (fd >= 0) close(fd);
    return rc;
}

int tks__range_xxh3(const char *path, uint64_t start, uint64_t end, uint8_t out[16]) {
    int fd = -1;
    int rc = tks_open_regular(path, "input", &fd, NULL);
    if (rc) return rc;
    XXH3_state_t *st = XXH3_createState();
    char *b = malloc((size_t)1 << 20);
    if (!st || !b) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) XXH3_128bits_reset(st);
    for (uint64_t at = start; !rc && at < end;) {
        size_t got = 0, want = end - at < ((size_t)1 << 20) ? (size_t)(end - at) : (size_t)1 << 20;
        rc = read_at(fd, path, b, want, at, &got);
        if (!rc && got == 0)
            rc = tks_fail(TKS_ERR_INPUT, path, TKS_NONE, at, "%s ends at byte %llu, before %llu",
                          path, (unsigned long long)at, (unsigned long long)end);
        if (!rc) XXH3_128bits_update(st, b, got);
        at += got;
    }
    if (!rc) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
        memcpy(out, c.digest, 16);
    }
    XXH3_freeState(st);
    free(b);
    close(fd);
    return rc;
}

void tks__pq_span(const tks_input *ls, uint64_t i, uint64_t g0, uint64_t g1, uint64_t *a, uint64_t *b) {
    const struct file_meta *m = &ls->meta[i];
    *a = *b = 0;
    for (uint64_t g = g0; g < g1 && g < m->pq_n; g++) {
        if (g == g0 || m->pq[g].start < *a) *a = m->pq[g].start;
        if (m->pq[g].end > *b) *b = m->pq[g].end;
    }
    if (*b < *a) *b = *a;
}

int tks__range_hash(const tks_input *ls, const tks__range *r, uint8_t out[16]) {
    const char *path = ls->files[r->file];
    if (r->whole == TKS__RANGE_PARQUET) {
        uint64_t a, b;
        tks__pq_span(ls, r->file, r->start, r->end, &a, &b);
        return tks__range_xxh3(path, a, b, out);
    }
    return r->whole ? tks_file_xxh3_128(path, out, NULL) : tks__range_xxh3(path, r->start, r->end, out);
}
