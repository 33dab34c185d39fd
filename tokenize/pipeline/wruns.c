/* wruns.c - sorted runs of counted words on disk, for byte-level BPE
 * training (tks_bpe_train): the run file's format, its writer and reader,
 * and the k-way merge of runs into one (pipeline.h, "Counting words").
 *
 * A run file (little-endian):
 *   0  "TKSWORDS"            magic
 *   8  u32 version (1), u32 flags (0)
 *   16 u64 words, u64 bytes  distinct words and their bytes
 *   32 u64 total             the sum of their counts
 *   40 u64 body bytes, u64 body XXH3-64
 *   56 u64 XXH3-64 of bytes 0..56
 *   64 body: per word, ascending by bytes (a prefix before what it
 *      prefixes), a varint length, the bytes, a varint count >= 1
 * A run is written to NAME.tmp-XXXXXXXX (tks_create_unique: a new random
 * name, created with O_EXCL|O_NOFOLLOW), made durable and renamed: a run
 * under its own name is whole. Its reader checks the header, the file's size, each
 * record's bounds and order, and the body's checksum at its end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

#define RUN_MAGIC "TKSWORDS"
#define RUN_HEAD 64

static void le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int io_fail(const char *path, const char *what) {
    int e = errno;
    return tks_fail(e == ENOSPC || e == EDQUOT || e == EFBIG ? TKS_ERR_NOSPACE : TKS_ERR_IO, path, TKS_NONE,
                    TKS_NONE, "%s %s: %s", what, path, strerror(e));
}

/* ---------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------- */
static int flush(tks__run_writer *w) {
    for (size_t o = 0; o < w->n;) {
        ssize_t k = write(w->fd, w->buf + o, w->n - o);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return io_fail(w->tmp, "writing");
        o += (size_t)k;
    }
    XXH3_64bits_update(w->h, w->buf, w->n);
    w->body += w->n;
    w->n = 0;
    return 0;
}

int tks__run_create(tks__run_writer *w, const char *path, size_t buf_bytes) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "path too long: %s", path);
    w->cap = buf_bytes < 4096 ? 4096 : buf_bytes;
    w->buf = malloc(w->cap);
    w->h = XXH3_createState();
    if (!w->buf || !w->h) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory (run writer)");
    XXH3_64bits_reset(w->h);
    /* a new random name, created exclusively: never a planted link's target */
    int rc = tks_create_unique(AT_FDCWD, path, 0644, w->tmp, sizeof w->tmp, &w->fd);
    if (rc) return rc;
    uint8_t zero[RUN_HEAD] = {0};
    if (pwrite(w->fd, zero, RUN_HEAD, 0) != RUN_HEAD) return io_fail(w->tmp, "writing");
    if (lseek(w->fd, RUN_HEAD, SEEK_SET) < 0) return io_fail(w->tmp, "seeking");
    return 0;
}

static size_t varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) p[n++] = (uint8_t)(v | 0x80), v >>= 7;
    p[n++] = (uint8_t)v;
    return n;
}

int tks__run_put(tks__run_writer *w, const char *word, size_t len, uint64_t count) {
    if (w->n + len + 20 > w->cap) {
        int rc = flush(w);
        if (rc) return rc;
    }
    uint8_t *p = (uint8_t *)w->buf + w->n;
    if (len + 20 > w->cap) { /* a word longer than the buffer: written through */
        size_t k = varint(p, len);
        w->n += k;
        int rc = flush(w);
        for (size_t o = 0; !rc && o < len;) {
            size_t m = len - o < w->cap ? len - o : w->cap;
            memcpy(w->buf, word + o, m);
            w->n = m;
            o += m;
            rc = flush(w);
        }
        if (rc) return rc;
        w->n = varint((uint8_t *)w->buf, count);
    } else {
        size_t k = varint(p, len);
        memcpy(p + k, word, len);
        k += len;
        k += varint(p + k, count);
        w->n += k;
    }
    w->head.words++;
    w->head.bytes += len;
    w->head.total += count;
    return 0;
}

int tks__run_finish(tks__run_writer *w) {
    int rc = flush(w);
    if (rc) return rc;
    uint8_t h[RUN_HEAD] = {0};
    memcpy(h, RUN_MAGIC, 8);
    h[8] = 1;
    le64(h + 16, w->head.words);
    le64(h + 24, w->head.bytes);
    le64(h + 32, w->head.total);
    le64(h + 40, w->body);
    le64(h + 48, XXH3_64bits_digest(w->h));
    le64(h + 56, XXH3_64bits(h, 56));
    if (pwrite(w->fd, h, RUN_HEAD, 0) != RUN_HEAD) return io_fail(w->tmp, "writing");
    if (fsync(w->fd) != 0) return io_fail(w->tmp, "syncing");
    if (close(w->fd) != 0) {
        w->fd = -1;
        return io_fail(w->tmp, "closing");
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) return io_fail(w->path, "renaming to");
    return 0;
}

void tks__run_writer_free(tks__run_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    w->fd = -1;
    free(w->buf);
    w->buf = NULL;
    XXH3_freeState(w->h);
    w->h = NULL;
}

/* ---------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------- */
static int bad_run(const tks__run_reader *r, const char *why) {
    return tks_fail(TKS_ERR_CHECKSUM, r->path, TKS_NONE, r->off,
                    "word run %s is damaged (%s at byte %llu): remove the output's .partial directory and "
                    "train again",
                    r->path, why, (unsigned long long)r->off);
}

int tks__run_read_head(const char *path, tks__run_head *out) {
    int fd;
    struct stat st;
    int rc = tks_open_regular(path, "word run", &fd, &st);
    if (rc) return rc;
    uint8_t h[RUN_HEAD];
    ssize_t k = pread(fd, h, RUN_HEAD, 0);
    close(fd);
    if (k != RUN_HEAD || memcmp(h, RUN_MAGIC, 8) || rd64(h + 56) != XXH3_64bits(h, 56) || h[8] != 1 ||
        rd64(h + 40) + RUN_HEAD != (uint64_t)st.st_size)
        return tks_fail(TKS_ERR_CHECKSUM, path, TKS_NONE, TKS_NONE,
                        "%s is not a whole word run (header or size): remove the output's .partial directory "
                        "and train again",
                        path);
    out->words = rd64(h + 16);
    out->bytes = rd64(h + 24);
    out->total = rd64(h + 32);
    out->body = rd64(h + 40);
    out->body_h = rd64(h + 48);
    return 0;
}

int tks__run_open(tks__run_reader *r, const char *path, size_t buf_bytes) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    int rc = tks__run_read_head(path, &r->head);
    if (rc) return rc;
    r->cap = buf_bytes < 4096 ? 4096 : buf_bytes;
    r->buf = malloc(r->cap);
    r->h = XXH3_createState();
    if (!r->buf || !r->h) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory (run reader)");
    XXH3_64bits_reset(r->h);
    if ((rc = tks_open_regular(path, "word run", &r->fd, NULL))) return rc;
    if (lseek(r->fd, RUN_HEAD, SEEK_SET) < 0) return io_fail(path, "seeking");
    r->left = r->head.body;
    return 0;
}

/* At least `need` bytes in the buffer from r->pos (or every byte left). */
static int fill(tks__run_reader *r, size_t need) {
    if (r->end - r->pos >= need) return 0;
    memmove(r->buf, r->buf + r->pos, r->end - r->pos);
    r->end -= r->pos;
    r->pos = 0;
    while (r->end < need && r->left) {
        size_t want = r->cap - r->end < r->left ? r->cap - r->end : (size_t)r->left;
        ssize_t k = read(r->fd, r->buf + r->end, want);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? io_fail(r->path, "reading") : bad_run(r, "the file ends early");
        XXH3_64bits_update(r->h, r->buf + r->end, (size_t)k);
        r->end += (size_t)k;
        r->left -= (uint64_t)k;
    }
    return 0;
}

static int get_varint(tks__run_reader *r, uint64_t *v) {
    int rc = fill(r, 10);
    if (rc) return rc;
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->pos == r->end) return bad_run(r, "a record runs past the end");
        uint8_t c = (uint8_t)r->buf[r->pos++];
        r->off++;
        *v |= (uint64_t)(c & 0x7F) << s;
        if (!(c & 0x80)) return 0;
    }
    return bad_run(r, "a number of over 64 bits");
}

static int word_cmp(const char *a, size_t na, const char *b, size_t nb) {
    int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : (na > nb) - (na < nb);
}

int tks__run_next(tks__run_reader *r) {
    if (r->done) return 0;
    if (r->end == r->pos && !r->left) {
        r->done = 1;
        if (r->count_seen != r->head.words) return bad_run(r, "fewer words than its header says");
        if (XXH3_64bits_digest(r->h) != r->head.body_h) return bad_run(r, "checksum");
        return 0;
    }
    uint64_t len, count;
    int rc = get_varint(r, &len);
    if (rc) return rc;
    if (len < 1 || len > r->head.bytes) return bad_run(r, "a word's length");
    /* the previous word stays in prev, for the order check */
    char *t = r->prev;
    size_t tc = r->pcap;
    r->prev = r->word, r->pcap = r->wcap, r->plen = r->len;
    r->word = t, r->wcap = tc;
    if (len > r->wcap) {
        size_t cap = r->wcap ? r->wcap : 64;
        while (cap < len) cap *= 2;
        char *p = realloc(r->word, cap);
        if (!p) return tks_fail(TKS_ERR_NOMEM, r->path, TKS_NONE, TKS_NONE, "out of memory (a %llu-byte word)",
                                (unsigned long long)len);
        r->word = p;
        r->wcap = cap;
    }
    for (size_t o = 0; o < len;) {
        if ((rc = fill(r, 1))) return rc;
        if (r->pos == r->end) return bad_run(r, "a word runs past the end");
        size_t m = r->end - r->pos < len - o ? r->end - r->pos : len - o;
        memcpy(r->word + o, r->buf + r->pos, m);
        r->pos += m;
        r->off += m;
        o += m;
    }
    r->len = len;
    if ((rc = get_varint(r, &count))) return rc;
    if (!count) return bad_run(r, "a count of 0");
    if (r->count_seen && word_cmp(r->prev, r->plen, r->word, r->len) >= 0) return bad_run(r, "words out of order");
    r->count = count;
    r->count_seen++;
    return 1;
}

void tks__run_reader_free(tks__run_reader *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    free(r->buf);
    free(r->word);
    free(r->prev);
    XXH3_freeState(r->h);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* ---------------------------------------------------------------------------
 * The k-way merge
 * ------------------------------------------------------------------------- */
static int rd_less(const tks__run_reader *a, const tks__run_reader *b) {
    return word_cmp(a->word, a->len, b->word, b->len) < 0;
}

static void sift_down(tks__run_reader *r, size_t *h, size_t n, size_t i) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && rd_less(&r[h[c + 1]], &r[h[c]])) c++;
        if (!rd_less(&r[h[c]], &r[h[i]])) return;
        size_t x = h[i];
        h[i] = h[c];
        h[c] = x;
        i = c;
    }
}

int tks__runs_merge(const char *const *in, size_t n, const char *out, size_t buf_bytes, volatile sig_atomic_t *stop) {
    tks__run_reader *r = calloc(n ? n : 1, sizeof *r);
    size_t *h = calloc(n ? n : 1, sizeof *h), hn = 0;
    tks__run_writer w;
    memset(&w, 0, sizeof w);
    w.fd = -1;
    int rc = r && h ? 0 : tks_fail(TKS_ERR_NOMEM, out, TKS_NONE, TKS_NONE, "out of memory (merging runs)");
    for (size_t i = 0; i < n; i++) r[i].fd = -1;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = tks__run_open(&r[i], in[i], buf_bytes);
        int got = rc ? 0 : tks__run_next(&r[i]);
        if (got < 0) rc = got;
        else if (got) h[hn++] = i;
    }
    for (size_t i = hn; !rc && i-- > 0;) sift_down(r, h, hn, i);
    if (!rc) rc = tks__run_create(&w, out, buf_bytes);
    char *cur = NULL;
    size_t cur_len = 0, cur_cap = 0;
    uint64_t steps = 0, cc = 0;
    int have = 0;
    while (!rc && hn) {
        tks__run_reader *top = &r[h[0]];
        if (have && cur_len == top->len && !memcmp(cur, top->word, cur_len)) {
            cc += top->count;
        } else {
            if (have) rc = tks__run_put(&w, cur, cur_len, cc);
            if (!rc && top->len > cur_cap) {
                char *p = realloc(cur, top->len);
                if (!p) rc = tks_fail(TKS_ERR_NOMEM, out, TKS_NONE, TKS_NONE, "out of memory (merging runs)");
                else cur = p, cur_cap = top->len;
            }
            if (!rc) memcpy(cur, top->word, top->len), cur_len = top->len, cc = top->count, have = 1;
        }
        int got = rc ? 0 : tks__run_next(top);
        if (got < 0) rc = got;
        else if (!got) h[0] = h[--hn];
        if (hn) sift_down(r, h, hn, 0);
        if (!rc && ++steps % 65536 == 0 && stop && *stop)
            rc = tks_fail(TKS_ERR_INTERRUPTED, out, TKS_NONE, TKS_NONE, "interrupted while merging word runs");
    }
    if (!rc && have) rc = tks__run_put(&w, cur, cur_len, cc);
    if (!rc) rc = tks__run_finish(&w);
    free(cur);
    tks__run_writer_free(&w);
    for (size_t i = 0; r && i < n; i++) tks__run_reader_free(&r[i]);
    free(r);
    free(h);
    return rc;
}
