/*
 * fuzz_common.h - helpers shared by the fuzz targets (header only, static):
 * an invariant check that aborts (so libFuzzer and the replay driver both
 * report it as a crash) and temporary files written from fuzz bytes.
 */
#ifndef TKS_FUZZ_COMMON_H
#define TKS_FUZZ_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with the failed condition: a broken invariant is a finding. */
#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* Setup failures (cannot create a temp file) are not findings in the code
 * under test, but nothing useful can run after them either. */
#define FUZZ_SETUP(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: fuzz setup failed: %s (%s)\n", __FILE__, __LINE__, \
                    #cond, strerror(errno));                                             \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Writes all n bytes to fd from offset 0 and truncates the file to n. */
static inline void fuzz_write_fd(int fd, const void *data, size_t n) {
    FUZZ_SETUP(ftruncate(fd, 0) == 0);
    const char *p = data;
    off_t off = 0;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        FUZZ_SETUP(w > 0);
        p += w;
        off += w;
        n -= (size_t)w;
    }
}

/* Creates (or replaces) the file `path` with n bytes. */
static inline void fuzz_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    FUZZ_SETUP(f != NULL);
    FUZZ_SETUP(n == 0 || fwrite(data, 1, n, f) == n);
    FUZZ_SETUP(fclose(f) == 0);
}

#endif
