/*
 * input.c - raw text -> documents. See the "Input" part of tokenize.h.
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
 * zero-copy). Lines are found with memchr; a line that lies inside one block
 * is handed out in place, one that spans blocks is assembled in `line`.
 * Documents are only buffered whole for --doc-split file and blank-line
 * paragraphs, and never beyond max_doc_bytes: the rest of a longer document
 * is read and dropped without being kept.
 */
#define _POSIX_C_SOURCE 200809L

#include "tokenize.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#define ZLIB_CONST
#include <zlib.h>

#define DEFAULT_MAX_DOC_BYTES (64ull << 20)
#define READ_BLOCK_BYTES ((size_t)1 << 20)
#define MAX_NEST 4 /* readers stacked over one entry: member.gz, gzip in xz, gzip in gzip */

/* A growable byte buffer; grows geometrically and is reused across documents. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

enum { GZ_MEMBER, GZ_BETWEEN, GZ_DONE };

/*
 * The bytes under one libarchive reader opened with archive_read_open: the
 * input file (level -1), or the data of the current entry of the reader
 * below (level k >= 0 reads the entry of in->a when k == 0, else of
 * in->lv[k - 1]). Inflated with zlib when it starts with the gzip magic,
 * passed through otherwise. Buffers and the zlib state are kept for reuse.
 */
typedef struct stream {
    tks_input *in;
    int level;
    int fd;                    /* level -1: the open input file */
    int pipe;                  /* level -1: fd is a pipe or device, non-blocking (wait_fd) */
    uint64_t start;            /* level -1: the file offset reading started at */
    unsigned char *rbuf;       /* level -1: READ_BLOCK_BYTES read from fd */
    const unsigned char *pp;   /* bytes already pulled, handed out next */
    size_t pn;
    unsigned char head[2];     /* the first byte(s), when the first block was 1 byte */
    size_t head_len;
    int eof;                   /* the source has no more bytes */
    uint64_t consumed;         /* bytes pulled from the source (file: bytes read from disk) */
    uint64_t handed;           /* bytes handed on (to inflate, or passed through) */
    int gzip;
    int gz_state;              /* GZ_MEMBER, GZ_BETWEEN (after a member's trailer), GZ_DONE */
    int zeros;                 /* zero bytes seen after the last member */
    uint64_t member;           /* 1-based number of the gzip member being inflated */
    z_stream z;
    int z_live;                /* inflateInit2 done */
    unsigned char *out;        /* READ_BLOCK_BYTES of inflated data */
} stream;

struct tks_input {
    tks_input_opts opts;
    char *jsonl_key;
    uint64_t max_doc;      /* resolved max_doc_bytes */
    size_t line_cap;       /* longest raw text line kept: max_doc + 1 (for a "\r") */
    size_t jsonl_cap;      /* longest raw JSONL record kept (escapes make it longer than its text) */

    char **files;
    uint64_t *sizes;
    struct file_meta {      /* what the listing saw: a regular file is re-checked against it */
        struct timespec mtime;
        int regular;
        dev_t dev;
        ino_t ino;
        int named;          /* given by the caller, not found in a directory */
    } *meta;
    char **skipped;         /* "path: why" of files left out under bad_input SKIP */
    size_t n_skipped;
    struct file_hash {      /* XXH3-128 of the file's bytes on disk, taken as they are read */
        uint8_t h[16];
        uint64_t bytes;
        int done;
    } *fh;
    size_t n_files, cap_files;
    XXH3_state_t *hst;      /* the current file's hash, fed by pull_raw (level -1) */
    uint64_t total_bytes;

    tks_input_stats st;
    int failed;            /* sticky: the error code of a failed tks_input_next */

    /* current file */
    size_t next_file;
    const char *path;
    struct archive *a;
    stream fs;             /* the bytes under `a` when it is fed by stream_read */
    int fs_on;             /* `a` reads fs (gzip, or not a regular file) */
    int src_rc;            /* an error raised inside a read callback (tks_fail done) */
    int is_archive;
    uint64_t entry_no;     /* regular entries of the current file started so far */
    int no_hash;           /* seeked (tks_input_seek): files are read in part, not hashed */
    int plain_seek;        /* the next file is opened at seek_off, as plain text */
    uint64_t seek_off;
    uint64_t bytes_in_done; /* compressed bytes of the files already closed */

    /* readers stacked over the current entry: lv[k] reads ns[k] */
    struct archive *lv[MAX_NEST];
    stream ns[MAX_NEST];
    int depth;

    /* current entry */
    int in_entry, entry_eof, entry_jsonl;
    int entry_by_name;     /* an archive member whose name has a compression suffix */
    int probed;            /* the first block of the top reader's entry was looked at */
    buf source;            /* "path" or "path:member", NUL-terminated */
    const char *cur, *end; /* unread part of the current block */
    uint64_t entry_off;    /* decompressed bytes of the entry delivered so far */
    uint64_t hole;         /* zeros of a sparse hole still to deliver before `pend` */
    const char *pend;
    size_t pend_len;
    uint64_t line_no;      /* lines started so far in the entry */

    buf line;              /* a line that spans blocks */
    buf para;              /* a paragraph or a whole entry */
    buf san;               /* UTF-8 sanitized copy of a document */
    json_t *json;          /* the record the last JSONL document points into */
};

/* ------------------------------------------------------------------------- */
/* UTF-8 (RFC 3629; Unicode Standard ch. 3, Table 3-7 "Well-Formed UTF-8 Byte
 * Sequences", and "U+FFFD Substitution of Maximal Subparts").                 */

/*
 * s[0] >= 0x80, n >= 1 bytes available. Returns the length (2..4) of the
 * well-formed sequence at s, or -k where k >= 1 is the length of the maximal
 * subpart of an ill-formed sequence (the bytes that one U+FFFD replaces).
 */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    int len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates D800..DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else {
        return -1; /* continuation byte, C0, C1, F5..FF */
    }
    if (n < 2 || s[1] < lo || s[1] > hi) return -1;
    for (int k = 2; k < len; k++)
        if ((size_t)k >= n || (s[k] & 0xC0) != 0x80) return -k;
    return len;
}

#define HIGH_BITS 0x8080808080808080ull

/* Length of the pure-ASCII run at s (8 bytes per step). */
static size_t ascii_run(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (n - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & HIGH_BITS) break;
        i += 8;
    }
    while (i < n && s[i] < 0x80) i++;
    return i;
}

/* Offset of the first ill-formed byte in [s, s+n), or n when all is valid. */
static size_t utf8_first_invalid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        i += ascii_run(s + i, n - i);
        if (i == n) break;
        int k = utf8_seq(s + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

size_t tks_utf8_sanitize(const char *str, size_t n, char *out, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, o = 0, bad = 0;
    while (i < n) {
        size_t run = ascii_run(s + i, n - i);
        if (out && run) memcpy(out + o, s + i, run);
        i += run;
        o += run;
        if (i == n) break;
        int k = utf8_seq(s + i, n - i);
        if (k > 0) {
            if (out) memcpy(out + o, s + i, (size_t)k);
            i += (size_t)k;
            o += (size_t)k;
        } else {
            if (out) memcpy(out + o, "\xEF\xBF\xBD", 3);
            i += (size_t)-k;
            o += 3;
            bad++;
        }
    }
    if (out_len) *out_len = o;
    return bad;
}

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */

static int buf_reserve(buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                            "out of memory growing a %zu-byte input buffer", need);
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_append(buf *b, const void *p, size_t n) {
    if (n > SIZE_MAX - b->len)
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "input buffer size overflow");
    int rc = buf_reserve(b, b->len + n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static void buf_free(buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Whitespace-only (ASCII space, \t, \r, \v, \f); the empty string counts. */
static int is_blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f') return 0;
    }
    return 1;
}

/* Case-insensitive: does the first n bytes of s end with suf? */
static int ends_with(const char *s, size_t n, const char *suf) {
    size_t m = strlen(suf);
    return n >= m && strncasecmp(s + n - m, suf, m) == 0;
}

static const char *const k_archive_suffixes[] = {
    ".tar",  ".tar.gz",  ".tgz",     ".tar.xz", ".txz",    ".tar.zst", ".tar.zstd", ".tzst",
    ".tar.bz2", ".tbz2", ".tbz",     ".tar.lz4", ".tar.lzma", ".tar.lz", ".tar.z", ".zip",
};
static const char *const k_compress_suffixes[] = {
    ".gz", ".xz", ".zst", ".zstd", ".bz2", ".dz", ".lz4", ".lzma", ".lz", ".z",
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int is_archive_name(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_archive_suffixes); i++)
        if (ends_with(name, n, k_archive_suffixes[i])) return 1;
    return 0;
}

static int is_compressed_name(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_compress_suffixes); i++)
        if (ends_with(name, n, k_compress_suffixes[i])) return 1;
    return 0;
}

/* `ext` (".jsonl", ".json") before at most one compression suffix
 * ("x.jsonl.gz"). */
static int has_ext(const char *name, const char *ext) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_compress_suffixes); i++)
        if (ends_with(name, n, k_compress_suffixes[i])) {
            n -= strlen(k_compress_suffixes[i]);
            break;
        }
    return ends_with(name, n, ext);
}

/* ------------------------------------------------------------------------- */
/* options, file list                                                         */

void tks_input_opts_default(tks_input_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->split = TKS_SPLIT_FILE;
    o->format = TKS_FMT_AUTO;
    o->jsonl_key = NULL;
    o->invalid_utf8 = TKS_POLICY_REPLACE;
    o->max_doc_bytes = 0;
    o->long_doc = TKS_POLICY_SKIP;
    o->bad_record = TKS_POLICY_FAIL;
    o->bad_input = TKS_POLICY_FAIL;
}

static int add_file(tks_input *in, const char *path, const struct stat *st, int named) {
    if (in->n_files == in->cap_files) {
        size_t cap = in->cap_files ? in->cap_files * 2 : 16;
        char **f = realloc(in->files, cap * sizeof *f);
        if (!f) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
        in->files = f;
        uint64_t *s = realloc(in->sizes, cap * sizeof *s);
        if (!s) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
        in->sizes = s;
        struct file_hash *h = realloc(in->fh, cap * sizeof *h);
        if (!h) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
        in->fh = h;
        struct file_meta *fm = realloc(in->meta, cap * sizeof *fm);
        if (!fm) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
        in->meta = fm;
        in->cap_files = cap;
    }
    char *copy = strdup(path);
    if (!copy) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
    int regular = S_ISREG(st->st_mode);
    uint64_t size = regular ? (uint64_t)st->st_size : 0;
    in->files[in->n_files] = copy;
    in->sizes[in->n_files] = size;
    in->meta[in->n_files] = (struct file_meta){st->st_mtim, regular, st->st_dev, st->st_ino, named};
    memset(&in->fh[in->n_files], 0, sizeof in->fh[0]);
    in->n_files++;
    in->total_bytes += size;
    return 0;
}

/* The directories being walked, innermost first (to skip symlink loops). */
typedef struct dir_chain {
    dev_t dev;
    ino_t ino;
    const struct dir_chain *up;
} dir_chain;

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* (dev, ino, listing index) of check_once */
typedef struct file_key {
    dev_t dev;
    ino_t ino;
    size_t i;
} file_key;
static int cmp_file_key(const void *a, const void *b) {
    const file_key *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int add_path(tks_input *in, const char *path, int explicit_path, const dir_chain *up);

static int walk_dir(tks_input *in, const char *path, const struct stat *st, const dir_chain *up) {
    for (const dir_chain *d = up; d; d = d->up)
        if (d->dev == st->st_dev && d->ino == st->st_ino) return 0; /* symlink loop */
    dir_chain here = {st->st_dev, st->st_ino, up};

    DIR *dir = opendir(path);
    if (!dir)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input directory %s: %s",
                        path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(dir);
        if (!de) {
            if (errno)
                rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                              "cannot list input directory %s: %s", path, strerror(errno));
            break;
        }
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing %s", path);
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing %s", path);
            break;
        }
        n++;
    }
    closedir(dir);
    if (!rc && n) qsort(names, n, sizeof *names, cmp_names);

    size_t plen = strlen(path);
    while (plen > 1 && path[plen - 1] == '/') plen--; /* "dir/" + name -> "dir/name" */
    for (size_t i = 0; i < n && !rc; i++) {
        size_t nlen = strlen(names[i]);
        char *child = malloc(plen + 1 + nlen + 1);
        if (!child) {
            rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing %s", path);
            break;
        }
        memcpy(child, path, plen);
        size_t k = plen;
        if (!(plen == 1 && path[0] == '/')) child[k++] = '/';
        memcpy(child + k, names[i], nlen + 1);
        rc = add_path(in, child, 0, &here);
        free(child);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

/* explicit_path: named by the caller (followed and read whatever it is)
 * rather than found in a directory, where only regular files and symlinks to
 * them are read (symlinks to directories are not followed). */
static int add_path(tks_input *in, const char *path, int explicit_path, const dir_chain *up) {
    struct stat st;
    int r = explicit_path ? stat(path, &st) : lstat(path, &st);
    if (r == 0 && S_ISLNK(st.st_mode)) {
        r = stat(path, &st);
        if (r == 0 && S_ISDIR(st.st_mode)) return 0; /* not followed: duplicates, loops */
    }
    if (r != 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input %s: %s", path,
                        strerror(errno));
    if (S_ISDIR(st.st_mode)) return walk_dir(in, path, &st, up);
    if (!explicit_path && !S_ISREG(st.st_mode)) return 0; /* fifo, socket, device */
    if (access(path, R_OK) != 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input %s: %s", path,
                        strerror(errno));
    return add_file(in, path, &st, explicit_path);
}

/* ------------------------------------------------------------------------- */
/* compressed names whose bytes are not compressed                            */

/* The formats a file name can promise, and how each one starts. */
typedef struct magic {
    const char *name;
    size_t len;
    const unsigned char *bytes;
} magic;
#define M(s) (sizeof(s) - 1), (const unsigned char *)(s)
static const magic k_magics[] = {
    {"gzip", M("\x1f\x8b")},          {"xz", M("\xfd" "7zXZ\0")},
    {"zstd", M("\x28\xb5\x2f\xfd")},  {"bzip2", M("BZh")},
    {"lz4", M("\x04\x22\x4d\x18")},   {"lzip", M("LZIP")},
    {"compress (.Z)", M("\x1f\x9d")}, {"zip", M("PK\x03\x04")},
    {"zip", M("PK\x05\x06")},         {"zstd", M("\x50\x2a\x4d\x18")}, /* skippable frame */
};
#undef M
/* name suffix -> the k_magics names accepted (longest suffixes first) */
static const struct { const char *suffix, *fmt, *alt; } k_promise[] = {
    {".tar.gz", "gzip", NULL},  {".tgz", "gzip", NULL},    {".tar.xz", "xz", NULL},
    {".txz", "xz", NULL},       {".tar.zst", "zstd", NULL}, {".tar.zstd", "zstd", NULL},
    {".tzst", "zstd", NULL},    {".tar.bz2", "bzip2", NULL}, {".tbz2", "bzip2", NULL},
    {".tbz", "bzip2", NULL},    {".tar.lz4", "lz4", NULL}, {".tar.lz", "lzip", NULL},
    {".tar.z", "compress (.Z)", "gzip"}, {".zip", "zip", NULL}, {".gz", "gzip", NULL},
    {".dz", "gzip", NULL},      {".xz", "xz", NULL},       {".zst", "zstd", NULL},
    {".zstd", "zstd", NULL},    {".bz2", "bzip2", NULL},   {".lz4", "lz4", NULL},
    {".lz", "lzip", NULL},      {".z", "compress (.Z)", "gzip"},
};

static const char *magic_of(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < COUNT(k_magics); i++)
        if (n >= k_magics[i].len && !memcmp(b, k_magics[i].bytes, k_magics[i].len))
            return k_magics[i].name;
    return NULL;
}

/* 0 when the regular file `path` starts as its name promises (or promises
 * nothing checkable, or is empty); 1 with `why` filled when it does not; an
 * error when it cannot be read. */
static int check_promise(const char *path, char *why, size_t cap) {
    size_t n = strlen(path);
    const char *fmt = NULL, *alt = NULL, *suffix = NULL;
    for (size_t i = 0; i < COUNT(k_promise) && !fmt; i++)
        if (ends_with(path, n, k_promise[i].suffix))
            fmt = k_promise[i].fmt, alt = k_promise[i].alt, suffix = k_promise[i].suffix;
    if (!fmt) return 0;
    int fd;
    int rc = tks_open_regular(path, "input", &fd, NULL);
    if (rc) return rc;
    unsigned char b[16];
    ssize_t got;
    do got = read(fd, b, sizeof b);
    while (got < 0 && errno == EINTR);
    int err = errno;
    close(fd);
    if (got < 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, 0, "cannot read %s: %s", path, strerror(err));
    if (got == 0) return 0; /* empty: no document either way */
    const char *is = magic_of(b, (size_t)got);
    if (is && (!strcmp(is, fmt) || (alt && !strcmp(is, alt)))) return 0;
    char first[64];
    size_t k = 0;
    int text = 1;
    for (ssize_t i = 0; i < got && i < 12; i++) text &= b[i] >= 0x20 ? b[i] < 0x7f : (b[i] == '\n' || b[i] == '\t' || b[i] == '\r');
    if (is) snprintf(first, sizeof first, "%s data", is);
    else if (text) {
        k = (size_t)snprintf(first, sizeof first, "text \"");
        for (ssize_t i = 0; i < got && i < 12; i++) first[k++] = b[i] < 0x20 ? ' ' : (char)b[i];
        snprintf(first + k, sizeof first - k, "...\"");
    } else {
        k = (size_t)snprintf(first, sizeof first, "bytes");
        for (ssize_t i = 0; i < got && i < 6; i++) k += (size_t)snprintf(first + k, sizeof first - k, " %02x", b[i]);
    }
    snprintf(why, cap, "named %s (%s) but starts with %s", suffix, fmt, first);
    return 1;
}

/* Refuses a file named twice, or named and also found in a named directory
 * (by path, symlink or hard link): its documents would be in the dataset
 * twice without anyone having asked for it. Inside the directories, links
 * to the same file are read as they are (the tree's own layout). */
static int check_once(const tks_input *in) {
    size_t n = in->n_files;
    file_key *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory listing inputs");
    for (size_t i = 0; i < n; i++) k[i] = (file_key){in->meta[i].dev, in->meta[i].ino, i};
    qsort(k, n, sizeof *k, cmp_file_key);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (k[i].dev == k[i - 1].dev && k[i].ino == k[i - 1].ino && in->meta[k[i].i].regular &&
            (in->meta[k[i].i].named || in->meta[k[i - 1].i].named))
            rc = tks_fail(TKS_ERR_ARG, in->files[k[i].i], TKS_NONE, TKS_NONE,
                          "%s is the same file as %s, listed earlier: each input is read once; "
                          "remove one of them from the inputs",
                          in->files[k[i].i], in->files[k[i - 1].i]);
    free(k);
    return rc;
}

/* Checks every regular file's promise; under SKIP drops the bad ones from
 * the list and records them, under FAIL refuses the first. */
static int check_promises(tks_input *in) {
    size_t keep = 0;
    for (size_t i = 0; i < in->n_files; i++) {
        char why[256];
        int r = in->meta[i].regular ? check_promise(in->files[i], why, sizeof why) : 0;
        if (r < 0) return r;
        if (r == 1 && in->opts.bad_input != TKS_POLICY_SKIP)
            return tks_fail(TKS_ERR_INPUT, in->files[i], TKS_NONE, 0,
                            "%s is %s: rename it to what it is, remove it from the inputs, or "
                            "pass --on-bad-input skip to leave such files out",
                            in->files[i], why);
        if (r == 1) {
            size_t len = strlen(in->files[i]) + 2 + strlen(why) + 1;
            char **sk = realloc(in->skipped, (in->n_skipped + 1) * sizeof *sk), *s = malloc(len);
            if (sk) in->skipped = sk;
            if (!sk || !s) {
                free(s);
                return tks_fail(TKS_ERR_NOMEM, in->files[i], TKS_NONE, TKS_NONE, "out of memory listing inputs");
            }
            snprintf(s, len, "%s: %s", in->files[i], why);
            in->skipped[in->n_skipped++] = s;
            in->st.bad_inputs_skipped++;
            in->total_bytes -= in->sizes[i];
            free(in->files[i]);
            continue;
        }
        in->files[keep] = in->files[i], in->sizes[keep] = in->sizes[i], in->meta[keep] = in->meta[i];
        keep++;
    }
    in->n_files = keep;
    return 0;
}

const char *tks_input_skipped_file(const tks_input *in, size_t i) {
    return in && i < in->n_skipped ? in->skipped[i] : NULL;
}

int tks_input_open(const char *const *paths, size_t n, const tks_input_opts *opts,
                   tks_input **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_input_open: out is NULL");
    *out = NULL;
    if (!paths || n == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "no input paths given");
    tks_input_opts o;
    if (opts) o = *opts;
    else tks_input_opts_default(&o);
    if (o.bad_input != TKS_POLICY_SKIP && o.bad_input != TKS_POLICY_FAIL) o.bad_input = TKS_POLICY_FAIL;
    if ((unsigned)o.split > TKS_SPLIT_BLANK || (unsigned)o.format > TKS_FMT_JSONL ||
        (unsigned)o.invalid_utf8 > TKS_POLICY_FAIL)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "invalid input options");
    if (o.long_doc != TKS_POLICY_SKIP && o.long_doc != TKS_POLICY_FAIL)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the long-document policy must be skip or fail");
    if (o.bad_record != TKS_POLICY_SKIP && o.bad_record != TKS_POLICY_FAIL)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "the bad-record policy must be skip or fail");
    for (size_t i = 0; i < n; i++)
        if (!paths[i] || !paths[i][0])
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "input path %zu is empty", i);

    tks_input *in = calloc(1, sizeof *in);
    if (!in) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    in->fs.fd = -1;
    for (int k = 0; k < MAX_NEST; k++) in->ns[k].fd = -1;
    in->opts = o;
    in->jsonl_key = strdup(o.jsonl_key ? o.jsonl_key : "text");
    in->opts.jsonl_key = in->jsonl_key;
    int rc = in->jsonl_key ? 0 : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    in->max_doc = o.max_doc_bytes ? o.max_doc_bytes : DEFAULT_MAX_DOC_BYTES;
    in->line_cap = in->max_doc >= SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)in->max_doc + 1;
    /* A JSONL record is longer than its text (escapes, other keys): keep
     * records up to 4x the limit plus 64 KiB, treat longer ones as too long. */
    in->jsonl_cap = in->max_doc >= SIZE_MAX / 16 ? SIZE_MAX / 2 : (size_t)in->max_doc * 4 + 65536;
    if (!rc && !(in->hst = XXH3_createState()))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) rc = add_path(in, paths[i], 1, NULL);
    if (!rc) rc = check_once(in);
    if (!rc) rc = check_promises(in);
    if (rc) {
        tks_input_free(in);
        return rc;
    }
    *out = in;
    return 0;
}

size_t tks_input_n_files(const tks_input *in) { return in ? in->n_files : 0; }

const char *tks_input_file(const tks_input *in, size_t i) {
    return in && i < in->n_files ? in->files[i] : NULL;
}

uint64_t tks_input_file_size(const tks_input *in, size_t i) {
    return in && i < in->n_files ? in->sizes[i] : 0;
}

uint64_t tks_input_total_bytes(const tks_input *in) { return in ? in->total_bytes : 0; }

int tks_input_file_xxh3(const tks_input *in, size_t i, uint8_t out[16], uint64_t *bytes) {
    if (!in || i >= in->n_files || !in->fh[i].done)
        return tks_fail(TKS_ERR_ARG, in && i < in->n_files ? in->files[i] : NULL, TKS_NONE,
                        TKS_NONE, "input %zu has not been read to its end yet", i);
    memcpy(out, in->fh[i].h, 16);
    if (bytes) *bytes = in->fh[i].bytes;
    return 0;
}

const tks_input_stats *tks_input_get_stats(const tks_input *in) { return in ? &in->st : NULL; }

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
static void add_filters(struct archive *a) {
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

static void stream_free(stream *s) {
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

/* A regular file read to its end: the bytes read, its size and its
 * modification time must still be what the listing saw (a file cut, grown or
 * rewritten while the build read it is not a dataset anyone can reproduce). */
static int check_unchanged(tks_input *in, uint64_t read_bytes, int fd) {
    size_t i = in->next_file - 1;
    const struct file_meta *m = &in->meta[i];
    if (!m->regular) return 0;
    struct stat st;
    int have = fd >= 0 ? fstat(fd, &st) == 0 : stat(in->path, &st) == 0;
    uint64_t listed = in->sizes[i];
    if (have && read_bytes == listed && (uint64_t)st.st_size == listed &&
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
        ssize_t r;
        for (;;) {
            r = read(s->fd, s->rbuf, READ_BLOCK_BYTES);
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
    struct file_hash *fh = &in->fh[in->next_file - 1];
    if (in->src_rc || in->failed || fh->done || in->no_hash) return;
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

static void close_file(tks_input *in) {
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
static int open_file(tks_input *in) {
    const char *path = in->files[in->next_file++];
    in->path = path;
    in->source.len = 0;
    in->is_archive = is_archive_name(path);
    in->src_rc = 0;
    in->st.files++;
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
    if (!plain) add_filters(a); /* text from the middle of a plain file: no magic to look for */
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
    close_file(in);
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
    if (s->gzip || by_name) add_filters(m);
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
static int next_entry(tks_input *in) {
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
        int rc = buf_append(&in->source, in->path, strlen(in->path));
        if (!rc && in->is_archive) {
            member = archive_entry_pathname_utf8(e);
            if (!member) member = archive_entry_pathname(e);
            if (!member) member = "?";
            rc = buf_append(&in->source, ":", 1);
            if (!rc) rc = buf_append(&in->source, member, strlen(member));
        }
        if (!rc) rc = buf_append(&in->source, "", 1);
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
                          (in->opts.format == TKS_FMT_AUTO && has_ext(ename, ".jsonl"));
        in->st.json_as_text += in->opts.format == TKS_FMT_AUTO && has_ext(ename, ".json");
        in->entry_by_name = member && is_compressed_name(member);
        in->probed = 0;
        in->st.entries++;
        in->entry_no++;
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
static int fill(tks_input *in) {
    if (in->entry_eof) return 0;
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
            return fill(in);
        }
        in->cur = b;
        in->end = in->cur + size;
        in->entry_off += size;
        in->st.bytes_text += size;
        return 1;
    }
}

typedef struct line {
    const char *p;   /* the line without its "\n" (and the "\r" before it) */
    size_t len;
    uint64_t no;     /* 1-based line number in the entry */
    uint64_t off;    /* offset of its first byte in the decompressed entry */
    int cr;          /* a "\r" before the "\n" was stripped */
    int too_long;    /* longer than the cap: p/len unset, the bytes were dropped */
    int blank;       /* when too_long: the dropped bytes were all whitespace */
} line;

/*
 * Reads the next line of the entry, keeping at most `cap` bytes (the line
 * without "\n"). Longer lines are consumed to their end without being kept,
 * unless `stop_early`, where it returns as soon as the line is known to be
 * too long. Returns 1, 0 at the end of the entry, or an error.
 */
static int read_line(tks_input *in, size_t cap, int stop_early, line *ln) {
    buf *lb = &in->line;
    lb->len = 0;
    int any = 0, too_long = 0, blank = 1, nl_seen = 0;
    const char *zp = NULL; /* in-place line */
    size_t zlen = 0;
    uint64_t start = in->entry_off;
    for (;;) {
        if (in->cur == in->end) {
            int r = fill(in);
            if (r < 0) return r;
            if (r == 0) {
                if (!any) return 0;
                break; /* last line without "\n" */
            }
        }
        if (!any) start = in->entry_off - (uint64_t)(in->end - in->cur);
        any = 1;
        size_t avail = (size_t)(in->end - in->cur);
        const char *nl = memchr(in->cur, '\n', avail);
        size_t take = nl ? (size_t)(nl - in->cur) : avail;
        if (!too_long) {
            if (lb->len == 0 && nl && take <= cap) {
                zp = in->cur;
                zlen = take;
                in->cur = nl + 1;
                nl_seen = 1;
                break;
            }
            if (take > cap - lb->len) {
                too_long = 1;
                blank = is_blank(lb->p, lb->len) && is_blank(in->cur, take);
                lb->len = 0;
                if (stop_early && !blank) { /* a blank line still ends a paragraph */
                    in->cur += take;
                    break;
                }
            } else {
                int rc = buf_append(lb, in->cur, take);
                if (rc) return rc;
            }
        } else if (blank) {
            blank = is_blank(in->cur, take);
        }
        in->cur += take;
        if (nl) {
            in->cur++;
            nl_seen = 1;
            break;
        }
    }
    memset(ln, 0, sizeof *ln);
    ln->no = ++in->line_no;
    ln->off = start;
    if (too_long) {
        ln->too_long = 1;
        ln->blank = blank;
        return 1;
    }
    ln->p = zp ? zp : lb->p;
    ln->len = zp ? zlen : lb->len;
    if (!ln->p) ln->p = ""; /* empty last line, never buffered */
    if (nl_seen && ln->len && ln->p[ln->len - 1] == '\r') {
        ln->len--;
        ln->cr = 1;
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* documents                                                                  */

static int too_long(tks_input *in, uint64_t line_no) {
    if (in->opts.long_doc == TKS_POLICY_FAIL) {
        int rc = tks_fail(TKS_ERR_DOC_TOO_LONG, in->source.p, TKS_NONE, TKS_NONE,
                          "%s:%llu: document longer than the limit of %llu bytes; raise "
                          "--max-doc-bytes or use --on-long-doc skip",
                          in->source.p, (unsigned long long)line_no,
                          (unsigned long long)in->max_doc);
        tks_error_set_doc(in->st.docs, line_no);
        return rc;
    }
    in->st.long_skipped++;
    return 0;
}

static int bad_record(tks_input *in, uint64_t line_no, const char *why) {
    if (in->opts.bad_record == TKS_POLICY_FAIL) {
        int rc = tks_fail(TKS_ERR_JSONL, in->source.p, TKS_NONE, TKS_NONE,
                          "%s:%llu: %s; fix the record or use --on-bad-record skip", in->source.p,
                          (unsigned long long)line_no, why);
        tks_error_set_doc(in->st.docs, line_no);
        return rc;
    }
    in->st.bad_records_skipped++;
    return 0;
}

/* Applies the NUL and UTF-8 policies and fills *doc: 1 yielded, 0 skipped, or
 * an error. `off`: where the text starts in the decompressed entry (TKS_NONE
 * when it is not a slice of it, as for JSONL). */
static int emit(tks_input *in, const char *p, size_t len, uint64_t line_no, uint64_t off,
                tks_doc *doc) {
    if (memchr(p, 0, len)) {
        in->st.binary_skipped++;
        return 0;
    }
    size_t bad = utf8_first_invalid(p, len);
    if (bad < len) {
        in->st.utf8_invalid_docs++;
        if (in->opts.invalid_utf8 == TKS_POLICY_FAIL) {
            int rc = tks_fail(TKS_ERR_UTF8, in->source.p, TKS_NONE,
                              off == TKS_NONE ? TKS_NONE : off + bad,
                              "%s:%llu: invalid UTF-8 at byte %zu of the document; fix the input "
                              "or use --invalid-utf8 replace (or skip)",
                              in->source.p, (unsigned long long)line_no, bad);
            tks_error_set_doc(in->st.docs, line_no);
            return rc;
        }
        if (in->opts.invalid_utf8 == TKS_POLICY_SKIP) {
            in->st.utf8_skipped++;
            return 0;
        }
        size_t out_len = 0;
        tks_utf8_sanitize(p + bad, len - bad, NULL, &out_len);
        if (out_len > SIZE_MAX - bad)
            return tks_fail(TKS_ERR_NOMEM, in->source.p, TKS_NONE, TKS_NONE, "document too large");
        int rc = buf_reserve(&in->san, bad + out_len);
        if (rc) return rc;
        memcpy(in->san.p, p, bad);
        in->st.utf8_replaced += tks_utf8_sanitize(p + bad, len - bad, in->san.p + bad, &out_len);
        p = in->san.p;
        len = bad + out_len;
    }
    doc->text = p;
    doc->len = len;
    doc->ordinal = in->st.docs++;
    doc->line = line_no;
    doc->source = in->source.p;
    return 1;
}

static int next_line_doc(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    for (;;) {
        line ln;
        int r = read_line(in, in->line_cap, stop_early, &ln);
        if (r <= 0) return r;
        if (ln.too_long || ln.len > in->max_doc) {
            if ((r = too_long(in, ln.no)) < 0) return r;
            continue;
        }
        if (ln.len == 0) {
            in->st.empty_skipped++;
            continue;
        }
        if ((r = emit(in, ln.p, ln.len, ln.no, ln.off, doc)) != 0) return r;
    }
}

/* Paragraphs: runs of lines that are not whitespace-only. Inner line breaks
 * are kept as they are in the input ("\n" or "\r\n"), the last one dropped. */
static int next_paragraph(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    buf *pa = &in->para;
    pa->len = 0;
    int have = 0, over = 0, prev_cr = 0;
    uint64_t first = 0, first_off = 0;
    for (;;) {
        line ln;
        int r = read_line(in, in->line_cap, stop_early, &ln);
        if (r < 0) return r;
        int blank = r == 0 || (ln.too_long ? ln.blank : is_blank(ln.p, ln.len));
        if (blank) {
            if (have) {
                int e = over ? too_long(in, first) : emit(in, pa->p, pa->len, first, first_off, doc);
                if (e != 0) return e; /* yielded, or an error */
                have = over = 0;
                pa->len = 0;
            }
            if (r == 0) return 0;
            continue;
        }
        if (!have) {
            have = 1;
            first = ln.no;
            first_off = ln.off;
        }
        if (over) continue;
        size_t sep = pa->len ? 1 + (size_t)prev_cr : 0;
        if (ln.too_long || ln.len + sep > in->max_doc - pa->len) {
            over = 1;
            if (stop_early) return too_long(in, first);
            continue;
        }
        if (sep) {
            if (prev_cr && (r = buf_append(pa, "\r", 1))) return r;
            if ((r = buf_append(pa, "\n", 1))) return r;
        }
        if ((r = buf_append(pa, ln.p, ln.len))) return r;
        prev_cr = ln.cr;
    }
}

/* The whole entry is one document. */
static int next_file_doc(tks_input *in, tks_doc *doc) {
    buf *pa = &in->para;
    pa->len = 0;
    int binary = 0, over = 0;
    for (;;) {
        int r = fill(in);
        if (r < 0) return r;
        if (r == 0) break;
        const char *p = in->cur;
        size_t n = (size_t)(in->end - in->cur);
        in->cur = in->end;
        if (binary || over) continue;
        if (memchr(p, 0, n)) {
            binary = 1;
            continue;
        }
        if (n > in->max_doc - pa->len) {
            over = 1;
            if (in->opts.long_doc == TKS_POLICY_FAIL) return too_long(in, 1);
            continue;
        }
        if ((r = buf_append(pa, p, n))) return r;
    }
    if (binary) {
        in->st.binary_skipped++;
        return 0;
    }
    if (over) return too_long(in, 1);
    if (pa->len == 0) {
        in->st.empty_skipped++;
        return 0;
    }
    return emit(in, pa->p, pa->len, 1, 0, doc);
}

static int next_jsonl_doc(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    for (;;) {
        line ln;
        int r = read_line(in, in->jsonl_cap, stop_early, &ln);
        if (r <= 0) return r;
        if (ln.too_long) {
            if (ln.blank) continue;
            if ((r = too_long(in, ln.no)) < 0) return r;
            continue;
        }
        const char *p = ln.p;
        size_t len = ln.len;
        if (ln.no == 1 && len >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) { /* byte order mark */
            p += 3;
            len -= 3;
        }
        if (is_blank(p, len)) continue;

        char why[400];
        json_error_t err;
        json_t *root = json_loadb(p, len, JSON_ALLOW_NUL, &err);
        json_t *v = NULL;
        if (!root)
            snprintf(why, sizeof why, "not valid JSON: %s (column %d)", err.text, err.column);
        else if (!json_is_object(root))
            snprintf(why, sizeof why, "not a JSON object");
        else if (!(v = json_object_get(root, in->jsonl_key)))
            snprintf(why, sizeof why, "no key \"%.200s\"", in->jsonl_key);
        else if (!json_is_string(v))
            snprintf(why, sizeof why, "the value of \"%.200s\" is not a string", in->jsonl_key);
        else if (memchr(json_string_value(v), 0, json_string_length(v)))
            snprintf(why, sizeof why, "the value of \"%.200s\" contains a NUL character (\\u0000)",
                     in->jsonl_key);
        else
            why[0] = 0;
        if (why[0]) {
            json_decref(root);
            if ((r = bad_record(in, ln.no, why)) < 0) return r;
            continue;
        }
        const char *text = json_string_value(v);
        size_t n = json_string_length(v);
        if (n > in->max_doc) {
            json_decref(root);
            if ((r = too_long(in, ln.no)) < 0) return r;
            continue;
        }
        if (n == 0) {
            json_decref(root);
            in->st.empty_skipped++;
            continue;
        }
        in->json = root; /* text points into it until the next call */
        if ((r = emit(in, text, n, ln.no, TKS_NONE, doc)) != 0) return r;
        json_decref(in->json);
        in->json = NULL;
    }
}

/* ------------------------------------------------------------------------- */
/* positions (work units)                                                     */

int tks_input_tell(const tks_input *in, tks_input_pos *pos) {
    memset(pos, 0, sizeof *pos);
    pos->ordinal = in->st.docs;
    if (!in->a) { /* between files */
        pos->file = in->next_file;
        return 0;
    }
    pos->file = in->next_file - 1;
    if (!in->in_entry || in->entry_eof) { /* the entry is done: the next one */
        if (!in->is_archive) {
            pos->file++;
        } else {
            pos->entry = in->entry_no;
        }
        return 0;
    }
    pos->entry = in->entry_no - 1;
    pos->offset = in->entry_off - (uint64_t)(in->end - in->cur);
    pos->line = in->line_no;
    /* a file read as it is on disk: its decompressed offsets are file offsets */
    pos->plain = !in->is_archive && in->fs_on && !in->fs.gzip && in->depth == 0 &&
                 archive_filter_count(in->a) == 1 && archive_filter_code(in->a, 0) == ARCHIVE_FILTER_NONE &&
                 archive_format(in->a) == ARCHIVE_FORMAT_RAW;
    return 0;
}

int tks_input_seek(tks_input *in, const tks_input_pos *pos) {
    if (in->a || in->next_file || in->st.docs)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_input_seek: the input was already read");
    if (pos->file > in->n_files || (pos->file == in->n_files && (pos->entry || pos->offset)))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_input_seek: file %llu of %zu", (unsigned long long)pos->file, in->n_files);
    in->no_hash = 1;
    in->next_file = (size_t)pos->file;
    in->st.docs = pos->ordinal;
    if (pos->file == in->n_files || (pos->entry == 0 && pos->offset == 0)) return 0;
    in->plain_seek = pos->plain && pos->entry == 0 && pos->offset > 0;
    in->seek_off = pos->offset;
    int plain = in->plain_seek, r = open_file(in);
    if (r < 0) return in->failed = r;
    for (uint64_t e = 0; e <= pos->entry; e++) { /* earlier members are read and dropped */
        if ((r = next_entry(in)) < 0) return in->failed = r;
        if (r == 0) { /* the position is past the last member: the next file */
            close_file(in);
            return 0;
        }
    }
    in->line_no = pos->line;
    if (plain) { /* opened at the offset */
        in->entry_off = pos->offset;
        in->probed = 1;
        return 0;
    }
    uint64_t left = pos->offset;
    while (left) {
        if (in->cur == in->end) {
            if ((r = fill(in)) < 0) return in->failed = r;
            if (r == 0) break;
        }
        size_t take = (size_t)(in->end - in->cur);
        if (take > left) take = (size_t)left;
        in->cur += take;
        left -= take;
    }
    return 0;
}

int tks_input_next(tks_input *in, tks_doc *doc) {
    if (!in || !doc) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_input_next: NULL argument");
    if (in->failed) return in->failed;
    if (in->json) {
        json_decref(in->json);
        in->json = NULL;
    }
    int r;
    for (;;) {
        if (!in->a) {
            if (in->next_file == in->n_files) return 0;
            if ((r = open_file(in)) < 0) break;
        }
        if (!in->in_entry) {
            if ((r = next_entry(in)) < 0) break;
            if (r == 0) {
                /* a plain file with no entry at all is empty: under
                 * --doc-split file, one empty document (counted) */
                if (!in->is_archive && in->entry_no == 0 && in->opts.split == TKS_SPLIT_FILE &&
                    in->opts.format != TKS_FMT_JSONL &&
                    !(in->opts.format == TKS_FMT_AUTO && has_ext(in->path, ".jsonl")))
                    in->st.empty_skipped++;
                close_file(in);
                continue;
            }
        }
        if (in->entry_eof) {
            in->in_entry = 0;
            continue;
        }
        if (in->entry_jsonl) r = next_jsonl_doc(in, doc);
        else if (in->opts.split == TKS_SPLIT_LINE) r = next_line_doc(in, doc);
        else if (in->opts.split == TKS_SPLIT_BLANK) r = next_paragraph(in, doc);
        else r = next_file_doc(in, doc);
        if (r == 1) return 1;
        if (r < 0) break;
        in->in_entry = 0;
    }
    in->failed = r;
    return r;
}

void tks_input_free(tks_input *in) {
    if (!in) return;
    close_file(in);
    stream_free(&in->fs);
    for (int k = 0; k < MAX_NEST; k++) stream_free(&in->ns[k]);
    if (in->json) json_decref(in->json);
    for (size_t i = 0; i < in->n_files; i++) free(in->files[i]);
    free(in->files);
    free(in->sizes);
    free(in->meta);
    for (size_t i = 0; i < in->n_skipped; i++) free(in->skipped[i]);
    free(in->skipped);
    free(in->fh);
    XXH3_freeState(in->hst);
    free(in->jsonl_key);
    buf_free(&in->source);
    buf_free(&in->line);
    buf_free(&in->para);
    buf_free(&in->san);
    free(in);
}
