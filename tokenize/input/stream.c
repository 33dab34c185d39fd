/*
 * stream.c - the bytes of the inputs, through libarchive.
 *
 * Every byte is streamed through libarchive: plain files and compressed
 * streams (xz, lzma, zstd, bzip2, lz4, lzip, compress) use the "raw" format
 * on top of filter auto-detection; names that look like archives (.tar,
 * .tar.gz, .tgz, ..., .zip) use the tar and zip formats. An archive member
 * with a compression suffix (data.tar:part-0.jsonl.zst) is decompressed by a
 * second libarchive reader fed from the first.
 * Nothing is extracted to disk and no external program is run.
 *
 * gzip (and dictzip, which is gzip) is not left to libarchive: its gzip
 * filter (3.6.2, archive_read_support_filter_gzip.c: "TODO: Verify the length
 * and CRC") never checks the member trailer, so damaged data that still
 * inflates would be read as silently altered text. Any stream that starts
 * with the gzip magic 1f 8b (RFC 1952 section 2.3.1), whatever its name, is
 * inflated here with zlib, which checks every member's CRC32 and ISIZE, and
 * the result is handed to libarchive through archive_read_open: under the
 * tar/zip formats for a compressed archive, or as the data of a nested reader
 * when a member, or the data inside another compression (x.gz.xz), is gzip.
 * Readers stack up to MAX_NEST deep over one entry.
 *
 * The decompressed bytes of an entry arrive as blocks (archive_read_data_block,
 * zero-copy), handed to docs.c one block at a time (tks__entry_fill).
 */
#define _POSIX_C_SOURCE 200809L

#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/input/input.h"

#define READ_BLOCK_BYTES ((size_t)1 << 20)

enum { GZ_MEMBER, GZ_BETWEEN, GZ_DONE };

/* ------------------------------------------------------------------------- */
/* libarchive streaming                                                       */

/* Errors that come from the system rather than from the bytes. */
static int archive_code(int err) {
    switch (err) {
    case ENOMEM: return TKS_ERR_NOMEM;
    case EIO: case EACCES: case EPERM: case ENOENT: case ENOTDIR: case EISDIR:
    case ELOOP: case EMFILE: case ENFILE: case ENXIO: case ESTALE:
        return TKS_ERR_IO;
    default: return TKS_ERR_INPUT;
    }
}

/* `a` failed; `where` is the file or "archive:member" concerned. */
static int archive_failure(struct archive *a, const char *where) {
    int err = archive_errno(a);
    const char *msg = archive_error_string(a);
    if (!msg) msg = "unknown error";
    int code = archive_code(err);
    if (code == TKS_ERR_INPUT)
        return tks_fail(code, where, TKS_NONE, TKS_NONE,
                        "%s: the input is corrupt or truncated (%s); check or re-download the file",
                        where, msg);
    return tks_fail(code, where, TKS_NONE, TKS_NONE, "cannot read %s: %s", where, msg);
}

/* An error inside a read callback: kept (the first one) so that whatever
 * libarchive makes of the failed read, the caller reports this one. */
static int src_fail(tks_input *in, int rc) {
    if (!in->src_rc) in->src_rc = rc;
    return in->src_rc;
}

/* A libarchive call on `a` failed; `where` names the file or "archive:member". */
static int read_failure(tks_input *in, struct archive *a, const char *where) {
    return in->src_rc ? in->src_rc : archive_failure(a, where);
}

static void update_bytes_in(tks_input *in) {
    uint64_t b = 0;
    if (in->fs_on) {
        b = in->fs.consumed;
    } else if (in->a) {
        la_int64_t x = archive_filter_bytes(in->a, -1);
        b = x > 0 ? (uint64_t)x : 0;
    }
    in->st.bytes_in = in->bytes_in_done + b;
}

/* Registers the decompressors that libarchive links in (the bzip2, liblzma,
 * ... versions are NULL otherwise), except gzip, which stream_read inflates
 * so that its checksums are verified (see the top of this file). Not
 * archive_read_support_filter_all: it would also run external programs
 * (lrzip, grzip, lzop) and uudecode a text that happens to start with
 * "begin 644 name". */
void tks__add_filters(struct archive *a) {
    if (archive_bzlib_version()) archive_read_support_filter_bzip2(a);
    if (archive_liblzma_version()) {
        archive_read_support_filter_xz(a);
        archive_read_support_filter_lzma(a);
        archive_read_support_filter_lzip(a);
    }
    if (archive_libzstd_version()) archive_read_support_filter_zstd(a);
    if (archive_liblz4_version()) archive_read_support_filter_lz4(a);
    archive_read_support_filter_compress(a); /* built in */
}

/* ------------------------------------------------------------------------- */
/* streams under libarchive: the file, or an entry of the reader below;       */
/* gzip inflated with zlib (RFC 1952)                                         */

static const char *stream_where(const stream *s) {
    return s->level < 0 ? s->in->path : s->in->source.p;
}

/* Starts a stream over `fd` (level -1) or over the entry of the reader below
 * (level >= 0, fd -1); buffers and the zlib state are kept from earlier use. */
static void stream_begin(stream *s, tks_input *in, int level, int fd) {
    s->in = in;
    s->level = level;
    s->fd = fd;
    s->pipe = 0;
    s->start = 0;
    s->pp = NULL;
    s->pn = 0;
    s->head_len = 0;
    s->eof = 0;
    s->consumed = s->handed = 0;
    s->gzip = 0;
    s->gz_state = GZ_DONE;
    s->zeros = 0;
    s->member = 0;
}

/* Ends the use of a stream (closes the file); keeps its buffers. */
static void stream_end(stream *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    s->gzip = 0;
}

void tks__stream_free(stream *s) {
    stream_end(s);
    if (s->z_live) inflateEnd(&s->z);
    s->z_live = 0;
    free(s->rbuf);
    free(s->out);
    s->rbuf = s->out = NULL;
}

/* Waits until the non-blocking pipe `fd` can be read (data, or its writer
 * gone), 0.2 s at a time so that opts.stop is seen: 0, or TKS_ERR_INTERRUPTED. */
static int wait_fd(tks_input *in, int fd) {
    for (;;) {
        if (in->opts.stop && *in->opts.stop)
            return tks_fail(TKS_ERR_INTERRUPTED, in->path, TKS_NONE, TKS_NONE,
                            "interrupted while waiting for %s", in->path);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, 200);
        if (r > 0 || (r < 0 && errno != EINTR)) return 0; /* the read tells what happened */
    }
}

/* A regular file read to its end (or to the end of its range): the offset
 * reached, its size and its modification time must still be what the
 * listing saw (a file cut, grown or rewritten while the build read it is not
 * a dataset anyone can reproduce). */
static int check_unchanged(tks_input *in, uint64_t read_bytes, int fd) {
    size_t i = in->next_file - 1;
    const struct file_meta *m = &in->meta[i];
    if (!m->regular) return 0;
    struct stat st;
    int have = fd >= 0 ? fstat(fd, &st) == 0 : stat(in->path, &st) == 0;
    uint64_t listed = in->sizes[i], expected = in->limit ? in->limit : listed;
    if (have && read_bytes == expected && (uint64_t)st.st_size == listed &&
        st.st_mtim.tv_sec == m->mtime.tv_sec && st.st_mtim.tv_nsec == m->mtime.tv_nsec)
        return 0;
    return tks_fail(TKS_ERR_INPUT, in->path, TKS_NONE, read_bytes,
                    "%s changed while it was read: %llu bytes when listed, %llu read, %llu now%s; "
                    "let whatever writes it finish, then build again",
                    in->path, (unsigned long long)listed, (unsigned long long)read_bytes,
                    have ? (unsigned long long)st.st_size : 0ull,
                    have && (st.st_mtim.tv_sec != m->mtime.tv_sec || st.st_mtim.tv_nsec != m->mtime.tv_nsec)
                        ? ", modification time changed" : "");
}

/* The next block from the source: 1 (*p, *n set, n >= 1), 0 at its end, or an error. */
static int pull_raw(stream *s, const unsigned char **p, size_t *n) {
    tks_input *in = s->in;
    if (s->eof) return 0;
    if (s->level < 0) {
        ssize_t r = 0;
        size_t want = READ_BLOCK_BYTES;
        uint64_t at = s->start + s->consumed;
        if (in->limit && in->limit - at < want) want = at < in->limit ? (size_t)(in->limit - at) : 0;
        for (; want;) { /* a range read to its end reads nothing more */
            r = read(s->fd, s->rbuf, want);
            if (r >= 0) break;
            if (errno == EINTR) continue;
            if (!s->pipe || (errno != EAGAIN && errno != EWOULDBLOCK)) break;
            int w = wait_fd(in, s->fd); /* a pipe with nothing yet: wait, interruptibly */
            if (w) return src_fail(in, w);
        }
        if (r < 0) {
            int err = errno;
            return src_fail(in, tks_fail(TKS_ERR_IO, in->path, TKS_NONE, s->consumed,
                                         "cannot read %s: %s", in->path, strerror(err)));
        }
        if (r == 0) {
            int c = check_unchanged(in, s->start + s->consumed, s->fd);
            if (c) return src_fail(in, c);
            s->eof = 1;
            return 0;
        }
        s->consumed += (uint64_t)r;
        XXH3_128bits_update(in->hst, s->rbuf, (size_t)r);
        *p = s->rbuf;
        *n = (size_t)r;
        return 1;
    }
    struct archive *below = s->level == 0 ? in->a : in->lv[s->level - 1];
    for (;;) {
        const void *b;
        size_t size;
        la_int64_t off; /* holes in compressed data are not expected; they are not filled */
        int r = archive_read_data_block(below, &b, &size, &off);
        update_bytes_in(in);
        if (r == ARCHIVE_EOF) {
            s->eof = 1;
            return 0;
        }
        if (r != ARCHIVE_OK) return src_fail(in, read_failure(in, below, in->source.p));
        if (size) {
            s->consumed += size;
            *p = b;
            *n = size;
            return 1;
        }
    }
}

/* Hands on the next at most `max` bytes: those pulled while looking for the
 * magic first, then fresh blocks. 1, 0 at the end, or an error. */
static int src_next(stream *s, const unsigned char **p, size_t *n, size_t max) {
    if (s->head_len) {
        *p = s->head;
        *n = s->head_len;
        s->head_len = 0;
    } else if (s->pn) {
        *p = s->pp;
        *n = s->pn;
        s->pn = 0;
    } else {
        int r = pull_raw(s, p, n);
        if (r <= 0) return r;
    }
    if (*n > max) { /* keep the rest for the next call */
        s->pp = *p + max;
        s->pn = *n - max;
        *n = max;
    }
    s->handed += *n;
    return 1;
}

/* Looks at the first two bytes (the bytes in [pp, pp + pn) come first) and
 * prepares to inflate when they are the gzip magic. 0 or an error. */
static int stream_start(stream *s) {
    tks_input *in = s->in;
    const unsigned char *p;
    size_t n;
    int r;
    if (!s->pn) {
        if ((r = pull_raw(s, &p, &n)) <= 0) return r; /* empty: passed through */
        s->pp = p;
        s->pn = n;
    }
    if (s->pn == 1) { /* the magic may straddle two blocks: keep the byte */
        s->head[0] = s->pp[0];
        s->head_len = 1;
        s->pn = 0;
        if ((r = pull_raw(s, &p, &n)) < 0) return r;
        if (r) {
            s->head[s->head_len++] = p[0];
            s->pp = p + 1;
            s->pn = n - 1;
        }
    }
    const unsigned char *m = s->head_len ? s->head : s->pp;
    size_t avail = s->head_len ? s->head_len : s->pn;
    s->gzip = avail >= 2 && m[0] == 0x1f && m[1] == 0x8b;
    if (!s->gzip) return 0;
    if (!s->out && !(s->out = malloc(READ_BLOCK_BYTES)))
        return src_fail(in, tks_fail(TKS_ERR_NOMEM, stream_where(s), TKS_NONE, TKS_NONE,
                                     "out of memory opening %s", stream_where(s)));
    /* windowBits 15 + 16: the gzip wrapper only; inflate checks each member's
     * CRC32 and ISIZE and reports Z_DATA_ERROR when they differ (zlib.h). */
    int zr = Z_OK;
    if (!s->z_live) {
        memset(&s->z, 0, sizeof s->z);
        zr = inflateInit2(&s->z, 15 + 16);
        s->z_live = zr == Z_OK;
    } else {
        zr = inflateReset(&s->z);
    }
    if (zr != Z_OK)
        return src_fail(in, tks_fail(TKS_ERR_NOMEM, stream_where(s), TKS_NONE, TKS_NONE,
                                     "cannot start zlib to read %s (zlib error %d)",
                                     stream_where(s), zr));
    s->z.next_in = NULL;
    s->z.avail_in = 0;
    s->gz_state = GZ_MEMBER;
    s->member = 1;
    return 0;
}

/* The gzip data is damaged: `zr` is inflate's code, or Z_OK when the input
 * ended inside a member or non-gzip bytes follow the last one. */
static int gz_failure(stream *s, int zr) {
    const char *where = stream_where(s);
    unsigned long long m = s->member, at = s->handed - s->z.avail_in;
    const char *zmsg = s->z.msg ? s->z.msg : "unknown error";
    char what[256];
    if (zr == Z_MEM_ERROR)
        return src_fail(s->in, tks_fail(TKS_ERR_NOMEM, where, TKS_NONE, TKS_NONE,
                                        "out of memory inflating %s", where));
    if (zr == Z_OK && s->gz_state == GZ_MEMBER)
        snprintf(what, sizeof what,
                 "the gzip data ends inside member %llu, before its CRC32 and length "
                 "trailer (after %llu compressed bytes)", m, at);
    else if (zr == Z_OK)
        snprintf(what, sizeof what,
                 "the bytes at compressed offset %llu, after gzip member %llu, are not a "
                 "gzip member", at, m);
    else if (!strcmp(zmsg, "incorrect data check"))
        snprintf(what, sizeof what,
                 "gzip checksum mismatch: the CRC32 in the trailer of gzip member %llu "
                 "(checked at compressed offset %llu) does not match the decompressed data", m, at);
    else if (!strcmp(zmsg, "incorrect length check"))
        snprintf(what, sizeof what,
                 "gzip length mismatch: the length (ISIZE) in the trailer of gzip member %llu "
                 "(checked at compressed offset %llu) does not match the decompressed data", m, at);
    else
        snprintf(what, sizeof what, "gzip member %llu is invalid at compressed offset %llu (%s)",
                 m, at, zmsg);
    return src_fail(s->in, tks_fail(TKS_ERR_INPUT, where, TKS_NONE, TKS_NONE,
                                    "%s: the input is corrupt or truncated: %s; re-download or "
                                    "re-create the file", where, what));
}

/* Inflates into s->out until it is full or the input ends, member after
 * member (a gzip file may be several concatenated members; zero bytes after
 * the last are padding). The number of bytes, 0 at the end, or -1. */
static la_ssize_t gz_fill(stream *s) {
    z_stream *z = &s->z;
    z->next_out = s->out;
    z->avail_out = (uInt)READ_BLOCK_BYTES;
    while (z->avail_out && s->gz_state != GZ_DONE) {
        if (!z->avail_in) {
            const unsigned char *p;
            size_t n;
            int r = src_next(s, &p, &n, (size_t)1 << 30);
            if (r < 0) return -1;
            if (r == 0) {
                if (s->gz_state == GZ_MEMBER) {
                    gz_failure(s, Z_OK);
                    return -1;
                }
                s->gz_state = GZ_DONE;
                break;
            }
            z->next_in = p;
            z->avail_in = (uInt)n;
        }
        if (s->gz_state == GZ_BETWEEN) {
            while (z->avail_in && *z->next_in == 0) {
                z->next_in++;
                z->avail_in--;
                s->zeros = 1;
            }
            if (!z->avail_in) continue;
            if (s->zeros || *z->next_in != 0x1f) {
                gz_failure(s, Z_OK);
                return -1;
            }
            inflateReset(z);
            s->member++;
            s->gz_state = GZ_MEMBER;
        }
        int zr = inflate(z, Z_NO_FLUSH);
        if (zr == Z_STREAM_END) s->gz_state = GZ_BETWEEN; /* trailer checked */
        else if (zr != Z_OK) {
            gz_failure(s, zr);
            return -1;
        }
    }
    return (la_ssize_t)(READ_BLOCK_BYTES - z->avail_out);
}

/* libarchive's read callback over a stream. */
static la_ssize_t stream_read(struct archive *a, void *ctx, const void **out) {
    stream *s = ctx;
    la_ssize_t n = -1;
    if (!s->in->src_rc) {
        if (s->gzip) {
            n = gz_fill(s);
            *out = s->out;
        } else {
            const unsigned char *p = NULL;
            size_t len = 0;
            int r = src_next(s, &p, &len, (size_t)1 << 30);
            n = r < 0 ? -1 : (la_ssize_t)len;
            *out = p;
        }
    }
    if (n < 0) /* -1: ARCHIVE_ERRNO_MISC (archive_private.h); in->src_rc says what failed */
        archive_set_error(a, -1, "%s", tks_last_error()->message);
    return n;
}

/* Inflates what libarchive left unread (after the end of a tar archive, or
 * after an xz stream inside gzip) so that every trailer is checked.
 * 0, or the error of this or an earlier read. */
static int stream_finish(stream *s) {
    while (!s->in->src_rc && s->gzip && s->gz_state != GZ_DONE)
        if (gz_fill(s) < 0) break;
    return s->in->src_rc;
}

/* ------------------------------------------------------------------------- */
/* files and entries                                                          */

static void close_nested(tks_input *in) {
    while (in->depth) {
        in->depth--;
        archive_read_free(in->lv[in->depth]);
        in->lv[in->depth] = NULL;
        stream_end(&in->ns[in->depth]);
    }
}

/* The current file's XXH3-128, once it was read without error: the bytes
 * libarchive left unread (after the end of a tar, the rest of a file) are read
 * and hashed here, so the hash covers the whole file in one pass. A zip, which
 * libarchive reads by seeking, is hashed in a second pass over what the page
 * cache still holds. */
static void finish_hash(tks_input *in) {
    struct file_hash *fh = in->cur_fh;
    if (!fh || in->src_rc || in->failed || fh->done || in->no_hash) return;
    if (in->fs_on) {
        const unsigned char *p;
        size_t n;
        while (pull_raw(&in->fs, &p, &n) > 0) {
        }
        if (in->src_rc) return;
        XXH128_hash_t h = XXH3_128bits_digest(in->hst);
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, h);
        memcpy(fh->h, c.digest, 16);
        fh->bytes = in->fs.consumed;
    } else if (tks_file_xxh3_128(in->path, fh->h, &fh->bytes) != 0 ||
               src_fail(in, check_unchanged(in, fh->bytes, -1))) {
        return; /* a zip changed while libarchive read it: src_rc tells */
    }
    fh->done = 1;
}

void tks__close_file(tks_input *in) {
    if (in->pqr) { /* a Parquet file left before its end (an error, an interrupt) */
        tks_pq_close(in->pqr);
        in->pqr = NULL;
    }
    close_nested(in);
    if (in->a) finish_hash(in);
    update_bytes_in(in);
    in->bytes_in_done = in->st.bytes_in;
    if (in->a) archive_read_free(in->a);
    in->a = NULL;
    if (in->fs_on) stream_end(&in->fs);
    in->fs_on = 0;
    in->in_entry = 0;
}

/* Opens the next file: through stream_read (our reads, hashed, gzip
 * inflated by zlib), except a regular zip file, which libarchive opens itself
 * to seek in. */
int tks__open_file(tks_input *in) {
    const char *path = in->files[in->next_file++];
    in->path = path;
    in->source.len = 0;
    in->is_archive = tks__is_archive_name(path);
    in->src_rc = 0;
    in->cur_fh = in->ranges ? &in->rh[in->next_range - 1] : in->fh ? &in->fh[in->next_file - 1] : NULL;
    if (!in->from) in->st.files++; /* a file cut into ranges counts once, with its first */
    /* non-blocking: a FIFO whose writer never comes must not hang the build
     * in open(2), deaf to SIGINT/SIGTERM (pipes stay non-blocking: wait_fd) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read %s: %s", path,
                        strerror(errno));
    /* Every file but a zip is read here, block by block, and hashed as it is
     * read (the manifest records each input's XXH3-128): one pass over the
     * bytes. A zip's directory is at its end, so libarchive opens it itself
     * to seek there (finish_hash hashes it after). */
    struct stat st;
    size_t plen = strlen(path);
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot stat %s: %s", path, strerror(err));
    }
    int pipe = !S_ISREG(st.st_mode);
    if (!pipe) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    } else if (S_ISFIFO(st.st_mode)) {
        /* a FIFO opened without a writer reads as empty: wait for one (or for
         * the stop flag); a writer that came and went leaves POLLHUP */
        int w = wait_fd(in, fd);
        if (w) {
            close(fd);
            return w;
        }
    }
    int via_stream = !(!pipe && plen >= 4 && strcasecmp(path + plen - 4, ".zip") == 0);
    XXH3_128bits_reset(in->hst);
    in->entry_no = 0;
    int plain = in->plain_seek;
    in->plain_seek = 0;
    in->plain_open = plain;
    if (plain && lseek(fd, (off_t)in->seek_off, SEEK_SET) < 0) {
        int err = errno;
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, in->seek_off, "cannot seek to byte %llu of %s: %s",
                        (unsigned long long)in->seek_off, path, strerror(err));
    }
    if (via_stream) {
        stream_begin(&in->fs, in, -1, fd);
        in->fs.pipe = pipe;
        in->fs.start = plain ? in->seek_off : 0;
        in->fs_on = 1;
    } else {
        close(fd);
    }
    int rc = 0;
    struct archive *a = archive_read_new();
    if (!a) {
        rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory opening %s", path);
        goto fail;
    }
    in->a = a;
    if (!plain) tks__add_filters(a); /* text from the middle of a plain file: no magic to look for */
    if (in->is_archive) {
        archive_read_support_format_tar(a);
        archive_read_support_format_zip(a);
    } else {
        archive_read_support_format_raw(a);
        archive_read_support_format_empty(a);
    }
    if (via_stream) {
        if (!in->fs.rbuf && !(in->fs.rbuf = malloc(READ_BLOCK_BYTES))) {
            rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory opening %s",
                          path);
            goto fail;
        }
        if (!plain && (rc = stream_start(&in->fs)) < 0) goto fail;
        if (archive_read_open(a, &in->fs, NULL, stream_read, NULL) != ARCHIVE_OK) {
            rc = read_failure(in, a, path);
            goto fail;
        }
    } else if (archive_read_open_filename(a, path, READ_BLOCK_BYTES) != ARCHIVE_OK) {
        rc = read_failure(in, a, path);
        goto fail;
    }
    return 0;
fail:
    tks__close_file(in);
    return rc;
}

/* Stacks a reader over the data of the top reader's current entry, whose
 * first block [b, b + n) was just read: it inflates gzip, and for a member
 * named as compressed (depth 0) also runs libarchive's other decompressors.
 * 1, 0 when the data decompresses to nothing, or an error. */
static int open_nested(tks_input *in, const void *b, size_t n) {
    if (in->depth == MAX_NEST)
        return tks_fail(TKS_ERR_INPUT, in->source.p, TKS_NONE, TKS_NONE,
                        "%s: compressed data nested too deeply (gzip inside gzip, or inside "
                        "another compression, more than %d times); decompress it before "
                        "reading it", in->source.p, MAX_NEST);
    int by_name = in->depth == 0 && in->entry_by_name;
    stream *s = &in->ns[in->depth];
    stream_begin(s, in, in->depth, -1);
    s->pp = b;
    s->pn = n;
    int rc = stream_start(s);
    if (rc < 0) return rc;
    struct archive *m = archive_read_new();
    if (!m) return tks_fail(TKS_ERR_NOMEM, in->source.p, TKS_NONE, TKS_NONE, "out of memory");
    /* Not gzip after all (a 1-byte first block of 0x1f) and not named as
     * compressed: the bytes are passed through as they are. */
    if (s->gzip || by_name) tks__add_filters(m);
    archive_read_support_format_raw(m);
    archive_read_support_format_empty(m);
    in->lv[in->depth++] = m;
    in->probed = 0;
    struct archive_entry *e;
    int r = archive_read_open(m, s, NULL, stream_read, NULL);
    if (r == ARCHIVE_OK) r = archive_read_next_header(m, &e);
    if (r == ARCHIVE_EOF) return 0;
    if (r != ARCHIVE_OK) return read_failure(in, m, in->source.p);
    return 1;
}

/* Moves to the next regular entry of the current file: 1, 0 at its end, or an error. */
int tks__next_entry(tks_input *in) {
    close_nested(in);
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(in->a, &e);
        update_bytes_in(in);
        if (r == ARCHIVE_EOF) {
            /* libarchive stops reading at the end of a tar archive, and
             * clears a read error met while looking for its second empty
             * block: inflate the rest so that every gzip trailer is checked. */
            r = in->fs_on ? stream_finish(&in->fs) : 0;
            update_bytes_in(in);
            return r;
        }
        /* ARCHIVE_WARN leaves a readable entry (e.g. a member name that does
         * not convert to the current locale); RETRY/FATAL mean damage. */
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            size_t plen = strlen(in->path);
            if (in->is_archive && in->source.len > plen + 1) {
                char where[1024];
                snprintf(where, sizeof where, "%s (after member %s)", in->path,
                         in->source.p + plen + 1);
                return read_failure(in, in->a, where);
            }
            return read_failure(in, in->a, in->path);
        }
        if (archive_entry_filetype(e) != AE_IFREG) continue;
        if (archive_entry_hardlink(e) && archive_entry_size(e) == 0) continue; /* tar hard link */

        const char *member = NULL;
        in->source.len = 0;
        int rc = tks__buf_append(&in->source, in->path, strlen(in->path));
        if (!rc && in->is_archive) {
            member = archive_entry_pathname_utf8(e);
            if (!member) member = archive_entry_pathname(e);
            if (!member) member = "?";
            rc = tks__buf_append(&in->source, ":", 1);
            if (!rc) rc = tks__buf_append(&in->source, member, strlen(member));
        }
        if (!rc && in->from) { /* a range: its lines are counted from its first byte */
            char at[48];
            snprintf(at, sizeof at, " (from byte %llu)", (unsigned long long)in->from);
            rc = tks__buf_append(&in->source, at, strlen(at));
        }
        if (!rc) rc = tks__buf_append(&in->source, "", 1);
        if (rc) return rc;
        in->source.len--; /* keep the NUL out of len */

        in->in_entry = 1;
        in->entry_eof = 0;
        in->entry_off = 0;
        in->hole = 0;
        in->pend = NULL;
        in->pend_len = 0;
        in->cur = in->end = NULL;
        in->line_no = 0;
        /* auto: only *.jsonl is JSON Lines; a *.json (a config file in a source
         * archive, or one JSON document) is read as text and counted */
        const char *ename = member ? member : in->path;
        in->entry_jsonl = in->opts.format == TKS_FMT_JSONL ||
                          (in->opts.format == TKS_FMT_AUTO && tks__has_ext(ename, ".jsonl"));
        in->entry_by_name = member && tks__is_compressed_name(member);
        in->probed = 0;
        in->entry_no++;
        if (!in->from) { /* a file cut into ranges counts once, with its first */
            in->st.json_as_text += in->opts.format == TKS_FMT_AUTO && tks__has_ext(ename, ".json");
            in->st.entries++;
        }
        if (in->plain_open) { /* opened at fs.start: its offsets are the file's */
            in->entry_off = in->fs.start;
            in->probed = 1;
        }
        return 1;
    }
}

/* Is the entry whose first block is [p, p + n) to be read through a stacked
 * reader? A member named as compressed, or data that starts with the gzip
 * magic (possibly cut after its first byte). Valid UTF-8 never starts with
 * 1f 8b (0x8b is a continuation byte), so no text is taken for gzip. */
static int wants_nested(const tks_input *in, const unsigned char *p, size_t n) {
    if (in->depth == 0 && in->entry_by_name) return 1;
    return p[0] == 0x1f && (n == 1 || p[1] == 0x8b);
}

static const char k_zeros[1];

/* Makes the next decompressed bytes of the entry available in [cur, end):
 * 1, 0 at the end of the entry, or an error. */
int tks__entry_fill(tks_input *in) {
    if (in->entry_eof) return 0;
    if (tks__stopped(in->opts.stop))
        return tks_fail(TKS_ERR_INTERRUPTED, in->source.p, TKS_NONE, in->entry_off,
                        "interrupted while reading %s (at byte %llu)", in->source.p,
                        (unsigned long long)in->entry_off);
    if (in->hole) {
        /* A sparse tar member's hole reads as zeros. It holds no newline, and
         * a document with a NUL byte is skipped as binary however many it has,
         * so the whole hole is delivered as ONE NUL in constant time: a tar
         * that declares a 2^60-byte hole cannot make the reader spin (found by
         * fuzz_input, tests/fuzz/corpus/fuzz_input/sparse_hole_1EiB.tar). */
        in->cur = k_zeros;
        in->end = k_zeros + 1;
        in->entry_off += in->hole;
        in->st.bytes_text += in->hole;
        in->hole = 0;
        return 1;
    }
    if (in->pend) {
        in->cur = in->pend;
        in->end = in->pend + in->pend_len;
        in->entry_off += in->pend_len;
        in->st.bytes_text += in->pend_len;
        in->pend = NULL;
        return 1;
    }
    for (;;) {
        struct archive *src = in->depth ? in->lv[in->depth - 1] : in->a;
        const void *b;
        size_t size;
        la_int64_t off;
        int r = archive_read_data_block(src, &b, &size, &off);
        update_bytes_in(in);
        int empty = r == ARCHIVE_EOF;
        if (!empty && r != ARCHIVE_OK) /* ARCHIVE_WARN is e.g. a zip CRC mismatch: bad data */
            return read_failure(in, src, in->source.p);
        if (!empty && size == 0) continue;
        if (!empty && !in->probed) {
            in->probed = 1;
            if (off <= 0 && in->entry_off == 0 && size >= 4 && !memcmp(b, "PAR1", 4))
                return tks_fail(TKS_ERR_INPUT, in->source.p, TKS_NONE, 0,
                                "%s starts with PAR1, the magic of a Parquet file, which is read as "
                                "Parquet only from a file named *.parquet on disk (not inside an "
                                "archive or a compressed stream): rename or extract it, or remove it "
                                "from the inputs", in->source.p);
            if (off <= 0 && in->entry_off == 0 && wants_nested(in, b, size)) {
                if ((r = open_nested(in, b, size)) < 0) return r;
                if (r == 1) continue; /* read from the new top */
                empty = 1;
            }
        }
        if (empty) {
            for (int k = in->depth; k-- > 0;) /* check the trailers of stacked gzip streams */
                if ((r = stream_finish(&in->ns[k])) < 0) return r;
            if (in->src_rc) return in->src_rc;
            in->entry_eof = 1;
            in->cur = in->end = NULL;
            return 0;
        }
        if (off > 0 && (uint64_t)off > in->entry_off) {
            in->hole = (uint64_t)off - in->entry_off;
            in->pend = b;
            in->pend_len = size;
            return tks__entry_fill(in);
        }
        in->cur = b;
        in->end = in->cur + size;
        in->entry_off += size;
        in->st.bytes_text += size;
        return 1;
    }
}

