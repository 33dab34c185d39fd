/* tks.c - error context, checksums of files, crash-safe writes. See tks.h. */
#define _GNU_SOURCE
#include "common/tks.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static _Thread_local tks_error g_err = {.code = 0, .shard = TKS_NONE, .offset = TKS_NONE,
                                        .doc = TKS_NONE, .line = TKS_NONE};

const char *tks_strerror(int code) {
    switch (code) {
    case TKS_OK: return "success";
    case TKS_ERR_IO: return "I/O error";
    case TKS_ERR_NOMEM: return "out of memory";
    case TKS_ERR_ARG: return "invalid argument";
    case TKS_ERR_MAGIC: return "not a tokshard file (bad magic)";
    case TKS_ERR_VERSION: return "unsupported format version";
    case TKS_ERR_HEADER: return "corrupt header";
    case TKS_ERR_TRUNCATED: return "file size does not match header";
    case TKS_ERR_BOUNDS: return "section out of bounds";
    case TKS_ERR_INDEX: return "corrupt document index";
    case TKS_ERR_CHECKSUM: return "checksum mismatch";
    case TKS_ERR_TOKEN_RANGE: return "token id out of range";
    case TKS_ERR_MANIFEST: return "bad manifest";
    case TKS_ERR_TOKENIZER: return "tokenizer error";
    case TKS_ERR_INPUT: return "unreadable input";
    case TKS_ERR_UTF8: return "invalid UTF-8";
    case TKS_ERR_JSONL: return "bad JSONL record";
    case TKS_ERR_DOC_TOO_LONG: return "document too long";
    case TKS_ERR_NOSPACE: return "no space left (disk full or file size limit)";
    case TKS_ERR_RESUME: return "cannot resume";
    case TKS_ERR_EXISTS: return "output already exists";
    case TKS_ERR_INTERRUPTED: return "interrupted";
    case TKS_ERR_PADDING: return "non-zero padding";
    case TKS_ERR_NONFINITE: return "training diverged (non-finite value)";
    case TKS_ERR_LOCKED: return "locked by another process";
    default: return "unknown error";
    }
}

const tks_error *tks_last_error(void) { return &g_err; }

void tks_clear_error(void) {
    memset(&g_err, 0, sizeof g_err);
    g_err.shard = g_err.offset = g_err.doc = g_err.line = TKS_NONE;
}

int tks_fail(int code, const char *file, uint64_t shard, uint64_t offset, const char *fmt, ...) {
    g_err.code = code;
    snprintf(g_err.file, sizeof g_err.file, "%s", file ? file : "");
    g_err.shard = shard;
    g_err.offset = offset;
    g_err.doc = TKS_NONE;
    g_err.line = TKS_NONE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err.message, sizeof g_err.message, fmt, ap);
    va_end(ap);
    return code;
}

void tks_error_set_doc(uint64_t doc, uint64_t line) {
    g_err.doc = doc;
    g_err.line = line;
}

void tks_error_restore(const tks_error *e) {
    if (e && e != &g_err) g_err = *e;
}

static const char *file_kind(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISDIR(m) ? "a directory" : "not a regular file";
}

int tks_open_regular(const char *path, const char *what, int *fd_out, struct stat *st_out) {
    *fd_out = -1;
    if (!what) what = "file";
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot open %s %s: %s", what, path,
                        strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot stat %s %s: %s", what, path,
                        strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "%s %s is %s, not a regular file: put the real file in its place", what,
                        path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read %s %s: %s", what, path,
                        strerror(e));
    }
    if (st_out) *st_out = st;
    *fd_out = fd;
    return 0;
}

int tks_map_file(const char *path, const char *what, const uint8_t **base, size_t *size) {
    *base = NULL;
    *size = 0;
    int fd;
    struct stat st;
    int rc = tks_open_regular(path, what, &fd, &st);
    if (rc) return rc;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot map %s %s: %s",
                            what ? what : "file", path, strerror(e));
        }
        *base = p;
        *size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void tks_unmap(const uint8_t *base, size_t size) {
    if (base && size) munmap((void *)base, size);
}

void *tks_alloc_table(size_t bytes) {
    if (!bytes) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    for (size_t o = 0; o < bytes; o += 4096) ((volatile char *)p)[o] = 0;
    return p;
}

void tks_free_table(void *p, size_t bytes) {
    if (p && bytes) munmap(p, bytes);
}

int tks_file_xxh3_128(const char *path, uint8_t out[16], uint64_t *size_out) {
    int fd, orc = tks_open_regular(path, NULL, &fd, NULL);
    if (orc) return orc;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        close(fd);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory hashing %s", path);
    }
    XXH3_128bits_reset(st);
    enum { BUFSZ = 1 << 20 };
    char *buf = malloc(BUFSZ);
    uint64_t total = 0;
    int rc = 0;
    if (!buf) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory hashing %s", path);
    while (!rc) {
        ssize_t n = read(fd, buf, BUFSZ);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, total, "read error in %s at byte %llu: %s",
                          path, (unsigned long long)total, strerror(errno));
            break;
        }
        if (n == 0) break;
        XXH3_128bits_update(st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    if (!rc) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
        memcpy(out, c.digest, 16);
        if (size_out) *size_out = total;
    }
    free(buf);
    XXH3_freeState(st);
    close(fd);
    return rc;
}

void tks_hex(const uint8_t *bytes, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[bytes[i] >> 4];
        out[2 * i + 1] = d[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int tks_unhex(const char *hex, uint8_t *bytes, size_t n) {
    if (!hex || strlen(hex) != 2 * n) return TKS_ERR_ARG;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return TKS_ERR_ARG;
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int tks_write_errno_code(int err) {
    return (err == ENOSPC || err == EFBIG || err == EDQUOT) ? TKS_ERR_NOSPACE : TKS_ERR_IO;
}

int tks_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            int code = tks_write_errno_code(e);
            return tks_fail(code, path, TKS_NONE, off,
                            code == TKS_ERR_NOSPACE
                                ? "cannot write %s at byte %llu: %s; free some space (or raise the "
                                  "file size limit) and re-run with --resume"
                                : "cannot write %s at byte %llu: %s",
                            path, (unsigned long long)off, strerror(e));
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int tks_mkdir_p(const char *d) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", d) >= (int)sizeof p)
        return tks_fail(TKS_ERR_IO, d, TKS_NONE, TKS_NONE, "cannot create %s: path too long", d);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return tks_fail(TKS_ERR_IO, d, TKS_NONE, TKS_NONE, "cannot create %s: %s", d, strerror(errno));
    return 0;
}

int tks_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tks_fail(TKS_ERR_IO, dir, TKS_NONE, TKS_NONE, "cannot open directory %s: %s", dir,
                        strerror(errno));
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = tks_fail(TKS_ERR_IO, dir, TKS_NONE, TKS_NONE, "cannot fsync directory %s: %s", dir,
                      strerror(errno));
    close(fd);
    return rc;
}

int tks_path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "path too long: %s/%s", dir, name);
    return 0;
}

void tks_text_printf(tks_text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (t->n + (size_t)k + 1 > t->cap) {
        size_t cap = (t->n + (size_t)k + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) return;
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n += (size_t)k;
}

int tks_resize(void *array, size_t n, size_t size) {
    void *p; /* read and written through memcpy: the pointer's type is the caller's */
    memcpy(&p, array, sizeof p);
    if (size && n > SIZE_MAX / size) return -1;
    p = realloc(p, n * size > 0 ? n * size : 1);
    if (!p) return -1;
    memcpy(array, &p, sizeof p);
    return 0;
}

/* ---- files of tokshard's own, never written through a planted link --------------- */

int tks_random(void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return tks_fail(TKS_ERR_IO, NULL, TKS_NONE, TKS_NONE, "no random bytes from the kernel (getrandom: %s)",
                            k < 0 ? strerror(errno) : "none");
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* "DIR/NAME" (or NAME alone when dir is NULL) into out[cap], for messages. */
static const char *shown(char *out, size_t cap, const char *dir, const char *name) {
    if (dir) snprintf(out, cap, "%s/%s", dir, name);
    else snprintf(out, cap, "%s", name);
    return out;
}

int tks_create_unique(int dirfd, const char *name, unsigned mode, char *tmp, size_t cap, int *fd_out) {
    *fd_out = -1;
    static const char digit[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    static _Atomic uint64_t counter;
    for (int attempt = 0; attempt < 64; attempt++) {
        uint8_t r[8];
        if (tks_random(r, sizeof r)) { /* no kernel randomness: the process, the time and a counter */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t v[4] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, counter++};
            uint64_t h = XXH3_64bits(v, sizeof v);
            memcpy(r, &h, sizeof r);
        }
        char suffix[9];
        for (int i = 0; i < 8; i++) suffix[i] = digit[r[i] % 36];
        suffix[8] = 0;
        if (snprintf(tmp, cap, "%s.tmp-%s", name, suffix) >= (int)cap)
            return tks_fail(TKS_ERR_ARG, name, TKS_NONE, TKS_NONE, "path too long: %s", name);
        /* O_EXCL: nothing that exists is opened, a link (even one to nowhere) included */
        int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
        if (fd >= 0) {
            *fd_out = fd;
            return 0;
        }
        if (errno != EEXIST)
            return tks_fail(tks_write_errno_code(errno), tmp, TKS_NONE, TKS_NONE, "cannot create %s: %s", tmp,
                            strerror(errno));
    }
    return tks_fail(TKS_ERR_IO, name, TKS_NONE, TKS_NONE,
                    "cannot create a temporary file beside %s: 64 random names were all taken; remove the "
                    "%s.tmp-* files", name, name);
}

/* Writes pieces[0..n) to a new unique temporary name beside `name` (relative
 * to dirfd), fsyncs it and renames it to `name`; then fsyncs the directory:
 * dirfd itself, or `name`'s directory under AT_FDCWD. dir: the directory's
 * name in messages (NULL under AT_FDCWD). */
static int publish_pieces(int dirfd, const char *dir, const char *name, const tks_piece *pieces, size_t n,
                          unsigned mode) {
    char tmp[PATH_MAX], where[2 * PATH_MAX];
    int fd, rc = tks_create_unique(dirfd, name, mode, tmp, sizeof tmp, &fd);
    if (rc && dir) { /* the message names the file without its directory: add it */
        char msg[sizeof tks_last_error()->message];
        memcpy(msg, tks_last_error()->message, sizeof msg);
        msg[sizeof msg - 1] = 0;
        return tks_fail(rc, shown(where, sizeof where, dir, name), TKS_NONE, TKS_NONE, "%s (in %s)", msg, dir);
    }
    if (rc) return rc;
    const char *t = shown(where, sizeof where, dir, tmp);
    uint64_t at = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (pieces[i].size) rc = tks_pwrite_all(fd, pieces[i].data, pieces[i].size, at, t);
        at += pieces[i].size;
    }
    if (!rc && fsync(fd) != 0)
        rc = tks_fail(tks_write_errno_code(errno), t, TKS_NONE, TKS_NONE, "cannot fsync %s: %s", t, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = tks_fail(tks_write_errno_code(errno), t, TKS_NONE, TKS_NONE, "cannot close %s: %s", t, strerror(errno));
    if (!rc && renameat(dirfd, tmp, dirfd, name) != 0) {
        char to[2 * PATH_MAX];
        shown(to, sizeof to, dir, name);
        rc = tks_fail(TKS_ERR_IO, to, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", t, to, strerror(errno));
    }
    if (rc) {
        unlinkat(dirfd, tmp, 0);
        return rc;
    }
    if (dirfd != AT_FDCWD) {
        if (fsync(dirfd) != 0 && errno != EINVAL)
            return tks_fail(TKS_ERR_IO, dir, TKS_NONE, TKS_NONE, "cannot fsync directory %s: %s", dir, strerror(errno));
        return 0;
    }
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s", name);
    return tks_fsync_dir(dirname(d));
}

int tks_write_file_atomic(const char *path, const void *data, size_t size) {
    tks_piece one = {data, size};
    return tks_write_file_pieces(path, &one, 1);
}

int tks_write_file_pieces(const char *path, const tks_piece *pieces, size_t n) {
    return publish_pieces(AT_FDCWD, NULL, path, pieces, n, 0644);
}

int tks_write_file_at(int dirfd, const char *dir, const char *name, const tks_piece *pieces, size_t n,
                      unsigned mode) {
    if (dirfd < 0 || !dir || !name || !*name || strchr(name, '/'))
        return tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "internal error: %s is not a file name of %s",
                        name ? name : "(null)", dir ? dir : "(null)");
    return publish_pieces(dirfd, dir, name, pieces, n, mode);
}

int tks_open_own(const char *path, int flags, const char *what, int *fd_out) {
    *fd_out = -1;
    if (!what) what = "file";
    flags &= O_WRONLY | O_RDWR | O_CREAT | O_APPEND;
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "the %s %s is a symbolic link: tokshard does not write through a link it did not make "
                        "(anyone who may write its directory could have planted it); remove the link (rm %s) "
                        "and run again", what, path, path);
    if (fd < 0 && errno == ENXIO) /* a FIFO or socket no one reads */
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "the %s %s is a FIFO or socket, not a regular file: remove it and run again", what, path);
    if (fd < 0)
        return tks_fail(tks_write_errno_code(errno), path, TKS_NONE, TKS_NONE,
                        "cannot open the %s %s: %s; check that its directory exists and is writable", what,
                        path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot stat the %s %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                      "the %s %s is %s, not a regular file: remove it and run again", what, path,
                      file_kind(st.st_mode));
    else if (st.st_uid != geteuid())
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                      "the %s %s belongs to user %lu, not to you (user %lu): tokshard writes only files of "
                      "yours; remove it (its owner can) or choose another directory, and run again", what, path,
                      (unsigned long)st.st_uid, (unsigned long)geteuid());
    else if (st.st_nlink != 1)
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                      "the %s %s has %lu links: another name shares its contents (a planted hard link), and "
                      "writing would change that file too; remove it (rm %s) and run again", what, path,
                      (unsigned long)st.st_nlink, path);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot open the %s %s: %s", what, path, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

void tks_float_text(char *out, size_t cap, float x) {
    for (int p = 6; p <= 9; p++) { /* 9 digits always read back (IEEE 754 binary32) */
        snprintf(out, cap, "%.*g", p, (double)x);
        if ((float)strtod(out, NULL) == x) return;
    }
}

int tks_copy_file_atomic(const char *src, const char *dst) {
    const uint8_t *base;
    size_t n;
    int rc = tks_map_file(src, NULL, &base, &n);
    if (rc) return rc;
    rc = tks_write_file_atomic(dst, n ? (const void *)base : "", n);
    tks_unmap(base, n);
    return rc;
}

/* ---- one writer at a time ----------------------------------------------------- */

int tks_lock(const char *path, const char *what, int *fd_out) {
    *fd_out = -1;
    for (int attempt = 0; attempt < 8; attempt++) {
        /* never a link: a lock file is truncated and written below */
        int fd, rc = tks_open_own(path, O_RDWR | O_CREAT, "lock file", &fd);
        if (rc) return rc;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            char holder[256] = "";
            ssize_t k = pread(fd, holder, sizeof holder - 1, 0);
            close(fd);
            holder[k > 0 ? k : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
            if (err != EWOULDBLOCK)
                return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot lock %s: %s", path,
                                strerror(err));
            long pid = 0;
            sscanf(holder, "pid %ld", &pid);
            char who[64] = "another process", stop[64] = "";
            if (pid > 0) {
                snprintf(who, sizeof who, "process %ld", pid);
                snprintf(stop, sizeof stop, " (kill -INT %ld)", pid);
            }
            return tks_fail(TKS_ERR_LOCKED, path, TKS_NONE, TKS_NONE,
                            "%s is locked by %s (%s): another writer is using this output; wait "
                            "for it to finish or stop it%s, then run again (the lock goes away "
                            "with its holder)",
                            path, who, holder[0] ? holder : "holder unknown", stop);
        }
        /* the file may have been removed by the previous holder's tks_unlock
         * between our open and flock: then lock the new file instead */
        struct stat a, b;
        if (fstat(fd, &a) != 0 || lstat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        char rec[320];
        int n = snprintf(rec, sizeof rec, "pid %ld: %s\n", (long)getpid(), what ? what : "");
        if (ftruncate(fd, 0) != 0 || pwrite(fd, rec, (size_t)n, 0) != n) {
            /* the lock is held all the same; only the message of a contender is poorer */
        }
        *fd_out = fd;
        return 0;
    }
    return tks_fail(TKS_ERR_LOCKED, path, TKS_NONE, TKS_NONE,
                    "%s keeps being replaced by other processes: another writer is using this "
                    "output; wait for it to finish, then run again", path);
}

void tks_unlock(int fd, const char *path) {
    if (fd < 0) return;
    /* the name is removed only while it is still the file locked (never what
     * took its place) */
    struct stat a, b;
    if (path && fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        unlink(path);
    close(fd);
}
