/*
 * input.c - raw text -> documents (see the "Input" part of tokenize.h): the
 * input object, its options and its list of files. tks_input_open walks the
 * paths given (directories in byte order of names), checks that each file
 * whose name promises compression starts with that format's magic and that
 * no file named otherwise than *.parquet starts with Parquet's, and
 * records what it saw of each file (size, time, identity) for the reader to
 * re-check. The bytes are read by stream.c (libarchive, zlib) and cut into
 * documents by docs.c (UTF-8, lines, paragraphs, JSONL records).
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 and realpath */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/input/input.h"

#define DEFAULT_MAX_DOC_BYTES (64ull << 20)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void buf_free(buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
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
    in->meta[in->n_files] = (struct file_meta){st->st_mtim, regular, st->st_dev, st->st_ino, named, in->cur_root, 0, 0, NULL};
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

static int add_path(tks_input *in, const char *path, int explicit_path, const dir_chain *up, int dfd,
                    const char *name);

static int walk_dir(tks_input *in, const char *path, const struct stat *st, const dir_chain *up) {
    for (const dir_chain *d = up; d; d = d->up)
        if (d->dev == st->st_dev && d->ino == st->st_ino) return 0; /* symlink loop */
    dir_chain here = {st->st_dev, st->st_ino, up};

    DIR *dir = opendir(path);
    if (!dir)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input directory %s: %s",
                        path, strerror(errno));
    /* the entries are looked at relative to the directory: no walk of the
     * whole path per file (a tree of 100,000 files is listed in a third of
     * the time) */
    int dfd = dup(dirfd(dir));
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
    if (!rc && dfd < 0)
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input directory %s: %s",
                      path, strerror(errno));
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
        rc = add_path(in, child, 0, &here, dfd, names[i]);
        free(child);
    }
    if (dfd >= 0) close(dfd);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

/* 1 when the real path of `path` lies inside one of the named paths (their
 * real paths, taken when the listing started). */
static int inside_roots(const tks_input *in, const char *path) {
    char real[PATH_MAX];
    if (!realpath(path, real)) return 1; /* unresolvable: reported when it is read */
    size_t rl = strlen(real);
    for (size_t i = 0; i < in->n_roots; i++) {
        const char *r = in->root_real ? in->root_real[i] : NULL;
        size_t n = r ? strlen(r) : 0;
        if (n && rl >= n && !strncmp(real, r, n) && (real[n] == '/' || real[n] == 0 || (n == 1 && r[0] == '/')))
            return 1;
    }
    return 0;
}

/* Records `path` as left out under --on-bad-input skip ("path: why", the
 * first wl bytes of why). */
static int add_skipped(tks_input *in, const char *path, const char *why, int wl) {
    size_t sl = strlen(path) + 2 + (size_t)wl + 1;
    char **sk = realloc(in->skipped, (in->n_skipped + 1) * sizeof *sk), *t = malloc(sl);
    if (sk) in->skipped = sk;
    if (!sk || !t) {
        free(t);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory listing inputs");
    }
    snprintf(t, sl, "%s: %.*s", path, wl, why);
    in->skipped[in->n_skipped++] = t;
    in->st.bad_inputs_skipped++;
    return 0;
}

/* explicit_path: named by the caller (followed and read whatever it is)
 * rather than found in a directory, where only regular files and symlinks to
 * them are read (symlinks to directories are not followed). */
/* dfd >= 0: the path is `name` in the directory open as dfd. */
static int add_path(tks_input *in, const char *path, int explicit_path, const dir_chain *up, int dfd,
                    const char *name) {
    struct stat st;
    int at = dfd >= 0 ? dfd : AT_FDCWD;
    const char *rel = dfd >= 0 ? name : path;
    int r = fstatat(at, rel, &st, explicit_path ? 0 : AT_SYMLINK_NOFOLLOW), link = 0;
    if (r == 0 && S_ISLNK(st.st_mode)) {
        link = 1;
        if (in->opts.no_follow_links) { /* --no-follow-links: a link found in a tree is left out */
            in->st.links_skipped++;
            return 0;
        }
        r = fstatat(at, rel, &st, 0);
        if (r == 0 && S_ISDIR(st.st_mode)) return 0; /* not followed: duplicates, loops */
        if (r == 0 && S_ISREG(st.st_mode) && !inside_roots(in, path)) in->st.links_outside++;
    }
    if (r != 0 && link && (errno == ENOENT || errno == ELOOP)) { /* a link to nothing, found in a tree */
        const char *why = errno == ENOENT ? "a symbolic link to a missing file" : "a symbolic link in a loop";
        if (in->opts.bad_input == TKS_POLICY_SKIP) return add_skipped(in, path, why, (int)strlen(why));
        return tks_fail(TKS_ERR_INPUT, path, TKS_NONE, TKS_NONE,
                        "%s is %s: remove it, or pass --on-bad-input skip to leave such files out (listed in "
                        "the summary and the manifest)",
                        path, why);
    }
    if (r != 0)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot read input %s: %s", path,
                        strerror(errno));
    if (S_ISDIR(st.st_mode)) return walk_dir(in, path, &st, up);
    if (!explicit_path && !S_ISREG(st.st_mode)) return 0; /* fifo, socket, device */
    /* a file in a directory whose mode grants this process reading is not
     * asked again (one system call per file less); an ACL that still
     * refuses it is reported when the file is opened */
    uid_t me = geteuid();
    int readable = !explicit_path && (me == 0 || (st.st_mode & S_IROTH) ||
                                      (st.st_uid == me && (st.st_mode & S_IRUSR)));
    if (!readable && faccessat(at, rel, R_OK, 0) != 0)
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
 * nothing checkable, or is empty) and is not a Parquet file under another
 * name; 1 with `why` filled when it breaks its name's promise, 2 with `why`
 * a whole message when it starts with Parquet's magic but is not named
 * *.parquet (only those are read as Parquet: refused here, with the other
 * checks of the listing, rather than when a work unit reaches it); an error
 * when it cannot be read. Every regular input is opened here for its first
 * 16 bytes. */
static int check_promise(const char *path, char *why, size_t cap) {
    size_t n = strlen(path);
    const char *fmt = NULL, *alt = NULL, *suffix = NULL;
    for (size_t i = 0; i < COUNT(k_promise) && !fmt; i++)
        if (tks__name_ends_with(path, n, k_promise[i].suffix))
            fmt = k_promise[i].fmt, alt = k_promise[i].alt, suffix = k_promise[i].suffix;
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
    if (got >= 4 && !memcmp(b, "PAR1", 4)) {
        snprintf(why, cap, "starts with PAR1, the magic of a Parquet file, and only files named *.parquet "
                 "are read as Parquet (never as text): rename it to *.parquet, or remove it from the inputs");
        return 2;
    }
    if (!fmt) return 0;
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

/* Refuses a file reached twice from different paths the caller gave: named
 * twice, named and also found in a named directory, or found in two named
 * directories that overlap (a directory twice, a directory and one of its
 * subdirectories, a directory and a symlink to it), by path, symlink or hard
 * link: its documents would be in the dataset twice without anyone having
 * asked for it. Inside one named directory, links to the same file are read
 * as they are (the tree's own layout). */
static int check_once(const tks_input *in) {
    size_t n = in->n_files;
    file_key *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory listing inputs");
    for (size_t i = 0; i < n; i++) k[i] = (file_key){in->meta[i].dev, in->meta[i].ino, i};
    qsort(k, n, sizeof *k, cmp_file_key);
    /* the file reached again first in input order (not the one whose
     * identity sorts first), and the earliest listing of it that it repeats:
     * the message does not depend on inode numbers */
    size_t again = SIZE_MAX, before = 0;
    for (size_t g = 0, e; g < n; g = e) { /* k[g, e): one file, listed in input order */
        for (e = g + 1; e < n && k[e].dev == k[g].dev && k[e].ino == k[g].ino;) e++;
        for (size_t b = g + 1; b < e && k[b].i < again; b++) {
            const struct file_meta *mb = &in->meta[k[b].i];
            for (size_t a = g; a < b && mb->regular; a++) {
                const struct file_meta *ma = &in->meta[k[a].i];
                if (mb->named || ma->named || mb->root != ma->root) {
                    again = k[b].i, before = k[a].i;
                    break;
                }
            }
        }
    }
    free(k);
    if (again == SIZE_MAX) return 0;
    return tks_fail(TKS_ERR_ARG, in->files[again], TKS_NONE, TKS_NONE,
                    "%s is the same file as %s, listed earlier: each input is read once; "
                    "remove one of them from the inputs (inputs that overlap: a directory "
                    "given twice, or with one of its subdirectories or a link to it)",
                    in->files[again], in->files[before]);
}

/* A verdict line "i\t!message\n": the message whole, on one line. */
static int pq_refuse(size_t i, const char *msg, buf *out) {
    char head[32];
    int n = snprintf(head, sizeof head, "%zu\t!", i), rc = tks__buf_append(out, head, (size_t)n);
    for (const char *c = msg; !rc && *c; c++) rc = tks__buf_append(out, *c == '\n' ? " " : c, 1);
    return rc ? rc : tks__buf_append(out, "\n", 1);
}

/* A file named *.parquet: "i\t=PQ rows bytes start end ...\n" (its row
 * groups, from its footer) when it is a Parquet file with a readable
 * document column, else "i\t!why\n". Errors: TKS_ERR_NOMEM. */
static int check_parquet(const tks_input *in, size_t i, buf *out) {
    const char *path = in->files[i];
    if (!in->meta[i].regular)
        return pq_refuse(i, "a Parquet file is read from a regular file (its footer is at its end), "
                            "not from a pipe or a device: copy it to a file", out);
    tks_pq *p = NULL;
    const char *col = in->opts.parquet_column ? in->opts.parquet_column : "text";
    int rc = tks_pq_open(path, col, &p);
    if (rc == TKS_ERR_NOMEM) return rc;
    if (rc) {
        const tks_error *e = tks_last_error();
        char msg[1024];
        const char *m = e && e->message[0] ? e->message : "not a readable Parquet file";
        size_t pl = strlen(path);
        if (!strncmp(m, path, pl) && m[pl] == ':' && m[pl + 1] == ' ') m += pl + 2; /* named by the list */
        snprintf(msg, sizeof msg, "%s", m);
        return pq_refuse(i, msg, out);
    }
    char line[128];
    int n = snprintf(line, sizeof line, "%zu\t=PQ", i);
    rc = tks__buf_append(out, line, (size_t)n);
    const tks_pq_group *g = tks_pq_groups(p);
    for (size_t k = 0; k < tks_pq_n_groups(p) && !rc; k++) {
        n = snprintf(line, sizeof line, " %llu %llu %llu %llu", (unsigned long long)g[k].rows,
                     (unsigned long long)g[k].bytes, (unsigned long long)g[k].start,
                     (unsigned long long)g[k].end);
        rc = tks__buf_append(out, line, (size_t)n);
    }
    if (!rc) rc = tks__buf_append(out, "\n", 1);
    tks_pq_close(p);
    return rc;
}

static int is_parquet_name(const char *path) { return tks__name_ends_with(path, strlen(path), ".parquet"); }

int tks__input_check_promises(const tks_input *in, size_t part, size_t parts, buf *out) {
    for (size_t i = part; i < in->n_files; i += parts ? parts : 1) {
        char why[256], line[320];
        if (is_parquet_name(in->files[i])) {
            int r = check_parquet(in, i, out);
            if (r) return r;
            continue;
        }
        int r = in->meta[i].regular ? check_promise(in->files[i], why, sizeof why) : 0;
        if (r < 0) return r;
        if (r == 0) continue;
        if (r == 2) {
            if ((r = pq_refuse(i, why, out))) return r;
            continue;
        }
        int n = snprintf(line, sizeof line, "%zu\t%s\n", i, why);
        if ((r = tks__buf_append(out, line, (size_t)n))) return r;
    }
    return 0;
}

/* 1 when the n bytes at s (not NUL-terminated) hold the string t. */
static int holds(const char *s, size_t n, const char *t) {
    size_t k = strlen(t);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, t, k)) return 1;
    return 0;
}

/* Parquet file i's row groups from its verdict line [p, nl): the groups'
 * "rows bytes start end" quadruples. */
static int parse_row_groups(tks_input *in, size_t i, const char *p, const char *nl) {
    struct file_meta *m = &in->meta[i];
    if (strncmp(p, "PQ", 2) != 0)
        return tks_fail(TKS_ERR_ARG, in->files[i], TKS_NONE, TKS_NONE, "malformed Parquet listing line");
    p += 2;
    size_t n = 0;
    for (const char *c = p; c < nl; c++) n += *c == ' ';
    n /= 4;
    free(m->pq);
    m->pq = NULL;
    m->pq_n = 0;
    m->parquet = 1;
    if (n && !(m->pq = calloc(n, sizeof *m->pq)))
        return tks_fail(TKS_ERR_NOMEM, in->files[i], TKS_NONE, TKS_NONE, "out of memory listing inputs");
    char *e = (char *)p;
    for (size_t k = 0; k < n; k++) {
        uint64_t v[4];
        for (int f = 0; f < 4; f++) v[f] = strtoull(e, &e, 10);
        m->pq[k] = (tks_pq_group){v[0], v[1], v[2], v[3]};
    }
    m->pq_n = (uint32_t)n;
    return 0;
}

/* A file whose bytes break its name's promise, and why (up to a "\n"). */
typedef struct verdict {
    size_t i;
    const char *why;
} verdict;
static int cmp_verdict(const void *a, const void *b) {
    size_t x = ((const verdict *)a)->i, y = ((const verdict *)b)->i;
    return x < y ? -1 : x > y;
}

int tks__input_settle(tks_input *in, const char *verdicts, size_t len) {
    size_t n = 0, cap = 0;
    verdict *bad = NULL;
    for (const char *p = verdicts, *end = verdicts + len; p < end;) { /* "i\twhy\n" lines */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        char *tab = NULL;
        size_t i = (size_t)strtoull(p, &tab, 10);
        if (!nl || !tab || *tab != '\t' || i >= in->n_files) break;
        if (n == cap && tks_resize(&bad, cap = cap ? 2 * cap : 16, sizeof *bad)) {
            free(bad);
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory listing inputs");
        }
        if (tab[1] == '=') { /* a Parquet file's row groups */
            int rc = parse_row_groups(in, i, tab + 2, nl);
            if (rc) {
                free(bad);
                return rc;
            }
        } else {
            bad[n++] = (verdict){i, tab + 1};
        }
        p = nl + 1;
    }
    if (n) qsort(bad, n, sizeof *bad, cmp_verdict);
    int rc = 0;
    size_t keep = 0, next = 0, i = 0;
    for (; i < in->n_files && !rc; i++) {
        const char *w = NULL;
        if (next < n && bad[next].i == i) w = bad[next++].why;
        int whole = w && *w == '!'; /* a message of its own (a Parquet file's) */
        if (whole) w++;
        if (w && in->opts.bad_input != TKS_POLICY_SKIP) {
            int wl = (int)(strchr(w, '\n') - w);
            if (whole)
                rc = tks_fail(TKS_ERR_INPUT, in->files[i], TKS_NONE, TKS_NONE, "%s: %.*s%s", in->files[i], wl, w,
                              holds(w, (size_t)wl, "--on-bad-input")
                                  ? "" : " (or pass --on-bad-input skip to leave such files out)");
            else
                rc = tks_fail(TKS_ERR_INPUT, in->files[i], TKS_NONE, 0,
                              "%s is %.*s: rename it to what it is, remove it from the inputs, or "
                              "pass --on-bad-input skip to leave such files out",
                              in->files[i], wl, w);
            break;
        }
        if (w) {
            if ((rc = add_skipped(in, in->files[i], w, (int)(strchr(w, '\n') - w)))) break;
            in->total_bytes -= in->sizes[i];
            free(in->files[i]);
            free(in->meta[i].pq);
            continue;
        }
        in->files[keep] = in->files[i], in->sizes[keep] = in->sizes[i], in->meta[keep] = in->meta[i];
        keep++;
    }
    for (; i < in->n_files; i++) /* after a failure: the rest kept as it is (freed by the caller) */
        in->files[keep] = in->files[i], in->sizes[keep] = in->sizes[i], in->meta[keep++] = in->meta[i];
    in->n_files = keep;
    free(bad);
    return rc;
}

/* Checks every regular file's promise; under SKIP drops the bad ones from
 * the list and records them, under FAIL refuses the first. */
static int check_promises(tks_input *in) {
    buf v = {0};
    int rc = tks__input_check_promises(in, 0, 1, &v);
    if (!rc) rc = tks__input_settle(in, v.p ? v.p : "", v.len);
    free(v.p);
    return rc;
}

int tks__input_is_jsonl(const tks_input *in, const char *name) {
    return in->opts.format == TKS_FMT_JSONL || (in->opts.format == TKS_FMT_AUTO && tks__has_ext(name, ".jsonl"));
}

const char *tks_input_skipped_file(const tks_input *in, size_t i) {
    return in && i < in->n_skipped ? in->skipped[i] : NULL;
}

/* An input with the options o (checked by the caller) and no file yet.
 * *out is set even on failure (to be freed). */
static int input_new(const tks_input_opts *o, tks_input **out) {
    tks_input *in = *out = calloc(1, sizeof *in);
    if (!in) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    in->fs.fd = -1;
    for (int k = 0; k < MAX_NEST; k++) in->ns[k].fd = -1;
    in->opts = *o;
    in->jsonl_key = strdup(o->jsonl_key ? o->jsonl_key : "text");
    in->opts.jsonl_key = in->jsonl_key;
    in->max_doc = o->max_doc_bytes ? o->max_doc_bytes : DEFAULT_MAX_DOC_BYTES;
    in->line_cap = in->max_doc >= SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)in->max_doc + 1;
    /* A JSONL record is longer than its text (escapes, other keys): keep
     * records up to 4x the limit plus 64 KiB, treat longer ones as too long. */
    in->jsonl_cap = in->max_doc >= SIZE_MAX / 16 ? SIZE_MAX / 2 : (size_t)in->max_doc * 4 + 65536;
    if (!in->jsonl_key || !(in->hst = XXH3_createState()))
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    return 0;
}

static int input_open(const char *const *paths, size_t n, const tks_input_opts *opts, int promises,
                      tks_input **out);

int tks_input_open(const char *const *paths, size_t n, const tks_input_opts *opts,
                   tks_input **out) {
    return input_open(paths, n, opts, 1, out);
}

int tks__input_list(const char *const *paths, size_t n, const tks_input_opts *opts, tks_input **out) {
    return input_open(paths, n, opts, 0, out);
}

static int input_open(const char *const *paths, size_t n, const tks_input_opts *opts, int promises,
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

    tks_input *in = NULL;
    int rc = input_new(&o, &in);
    if (!rc && !(in->root_real = calloc(n ? n : 1, sizeof *in->root_real)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory listing inputs");
    for (size_t i = 0; i < n && !rc; i++) {
        char real[PATH_MAX];
        if (realpath(paths[i], real)) in->root_real[i] = strdup(real);
        in->n_roots = i + 1;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        in->cur_root = (uint32_t)i;
        rc = add_path(in, paths[i], 1, NULL, -1, NULL);
    }
    if (!rc) rc = check_once(in);
    if (!rc && promises) rc = check_promises(in);
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
    if (!in || i >= in->n_files || !in->fh || !in->fh[i].done)
        return tks_fail(TKS_ERR_ARG, in && i < in->n_files ? in->files[i] : NULL, TKS_NONE,
                        TKS_NONE, "input %zu has not been read to its end yet", i);
    memcpy(out, in->fh[i].h, 16);
    if (bytes) *bytes = in->fh[i].bytes;
    return 0;
}

const tks_input_stats *tks_input_get_stats(const tks_input *in) { return in ? &in->st : NULL; }

void tks_input_free(tks_input *in) {
    if (!in) return;
    tks__close_file(in);
    tks__stream_free(&in->fs);
    for (int k = 0; k < MAX_NEST; k++) tks__stream_free(&in->ns[k]);
    if (in->json) json_decref(in->json);
    if (!in->borrowed) {
        for (size_t i = 0; i < in->n_files; i++) free(in->files[i]);
        free(in->files);
        free(in->sizes);
        for (size_t i = 0; in->meta && i < in->n_files; i++) free(in->meta[i].pq);
        free(in->meta);
        for (size_t i = 0; i < in->n_skipped; i++) free(in->skipped[i]);
        free(in->skipped);
    }
    for (size_t i = 0; in->root_real && i < in->n_roots; i++) free(in->root_real[i]);
    free(in->root_real);
    free(in->fh);
    free(in->rh);
    XXH3_freeState(in->hst);
    free(in->jsonl_key);
    buf_free(&in->source);
    buf_free(&in->line);
    buf_free(&in->para);
    buf_free(&in->san);
    free(in);
}


/* ------------------------------------------------------------------------- */
/* work units: readers over ranges of a listing, the listing as bytes         */

int tks__input_view(const tks_input *ls, const tks__range *r, size_t n, volatile sig_atomic_t *stop,
                    tks_input **out) {
    tks_input_opts o = ls->opts;
    if (stop) o.stop = stop;
    o.defer_json = 1; /* the build decodes JSONL records on its encoding threads */
    tks_input *in = NULL;
    int rc = input_new(&o, &in);
    if (!rc && !(in->rh = calloc(n ? n : 1, sizeof *in->rh)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (rc) {
        tks_input_free(in);
        return rc;
    }
    in->borrowed = 1;
    in->files = ls->files;
    in->sizes = ls->sizes;
    in->meta = ls->meta;
    in->n_files = in->cap_files = ls->n_files;
    in->total_bytes = ls->total_bytes;
    in->ranges = r;
    in->n_ranges = n;
    *out = in;
    return 0;
}

const uint8_t *tks__input_range_xxh3(const tks_input *in, size_t i) {
    return in->rh && i < in->n_ranges && in->rh[i].done ? in->rh[i].h : NULL;
}

/* The listing's wire form: "TKSL1", the file count, then per file its path
 * (length, bytes), size, modification time, identity and flags; native byte
 * order (every rank runs the same binary). */
#define LISTING_MAGIC "TKSL1"
typedef struct wire_file {
    uint64_t path_len, size, mtime_sec, mtime_nsec, dev, ino;
    uint32_t regular, named;
} wire_file;

int tks__input_pack(const tks_input *in, buf *out) {
    uint64_t n = in->n_files;
    int rc = tks__buf_append(out, LISTING_MAGIC, 5);
    if (!rc) rc = tks__buf_append(out, &n, sizeof n);
    for (size_t i = 0; i < in->n_files && !rc; i++) {
        const struct file_meta *m = &in->meta[i];
        wire_file w = {strlen(in->files[i]), in->sizes[i], (uint64_t)m->mtime.tv_sec,
                       (uint64_t)m->mtime.tv_nsec, (uint64_t)m->dev, (uint64_t)m->ino,
                       (uint32_t)m->regular, (uint32_t)m->named};
        rc = tks__buf_append(out, &w, sizeof w);
        if (!rc) rc = tks__buf_append(out, in->files[i], w.path_len);
    }
    return rc;
}

int tks__input_unpack(const void *p, size_t n, const tks_input_opts *o, tks_input **out) {
    const char *b = p, *end = b + n;
    uint64_t nf = 0;
    *out = NULL;
    if (n < 5 + sizeof nf || memcmp(b, LISTING_MAGIC, 5) != 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "not an input listing");
    memcpy(&nf, b + 5, sizeof nf);
    b += 5 + sizeof nf;
    tks_input *in = NULL;
    int rc = input_new(o, &in);
    for (uint64_t i = 0; i < nf && !rc; i++) {
        wire_file w;
        if ((size_t)(end - b) < sizeof w) break;
        memcpy(&w, b, sizeof w);
        b += sizeof w;
        if ((uint64_t)(end - b) < w.path_len || w.path_len >= PATH_MAX) break;
        char path[PATH_MAX];
        memcpy(path, b, w.path_len);
        path[w.path_len] = 0;
        b += w.path_len;
        struct stat st = {0};
        st.st_mode = w.regular ? S_IFREG : S_IFIFO;
        st.st_size = (off_t)w.size;
        st.st_mtim.tv_sec = (time_t)w.mtime_sec;
        st.st_mtim.tv_nsec = (long)w.mtime_nsec;
        st.st_dev = (dev_t)w.dev;
        st.st_ino = (ino_t)w.ino;
        rc = add_file(in, path, &st, (int)w.named);
    }
    if (!rc && (in->n_files != nf || b != end))
        rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "input listing cut short");
    if (rc) {
        tks_input_free(in);
        return rc;
    }
    *out = in;
    return 0;
}
