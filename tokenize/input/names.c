/* names.c - what a file's name promises to the input reader: an archive,
 * a compressed file, an extension under a compression suffix (internal.h). */
#define _XOPEN_SOURCE 700
#include <string.h>
#include <strings.h>

#include "tokenize/input/input.h"

int tks__name_ends_with(const char *s, size_t n, const char *suf) {
    size_t m = strlen(suf);
    if (n < m || (s[n - 1] | 0x20) != (suf[m - 1] | 0x20)) return 0; /* most names differ at the end */
    return strncasecmp(s + n - m, suf, m) == 0;
}

static const char *const k_archive_suffixes[] = {
    ".tar",  ".tar.gz",  ".tgz",     ".tar.xz", ".txz",    ".tar.zst", ".tar.zstd", ".tzst",
    ".tar.bz2", ".tbz2", ".tbz",     ".tar.lz4", ".tar.lzma", ".tar.lz", ".tar.z", ".zip",
};
static const char *const k_compress_suffixes[] = {
    ".gz", ".xz", ".zst", ".zstd", ".bz2", ".dz", ".lz4", ".lzma", ".lz", ".z",
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int tks__is_archive_name(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_archive_suffixes); i++)
        if (tks__name_ends_with(name, n, k_archive_suffixes[i])) return 1;
    return 0;
}

int tks__is_compressed_name(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_compress_suffixes); i++)
        if (tks__name_ends_with(name, n, k_compress_suffixes[i])) return 1;
    return 0;
}

/* `ext` (".jsonl", ".json") before at most one compression suffix
 * ("x.jsonl.gz"). */
int tks__has_ext(const char *name, const char *ext) {
    size_t n = strlen(name);
    for (size_t i = 0; i < COUNT(k_compress_suffixes); i++)
        if (tks__name_ends_with(name, n, k_compress_suffixes[i])) {
            n -= strlen(k_compress_suffixes[i]);
            break;
        }
    return tks__name_ends_with(name, n, ext);
}
