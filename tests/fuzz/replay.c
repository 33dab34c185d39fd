/*
 * replay.c - plain driver for the fuzz targets (after zstd's
 * tests/fuzz/regression_driver.c): calls LLVMFuzzerTestOneInput once on every
 * file given, directories walked recursively in name order, so a corpus is
 * replayed under ctest by a build without libFuzzer (gcc, sanitizers or not).
 *
 * Usage: <target>_replay PATH...  (files or corpus directories)
 * Exit status: 0 when every input ran and at least one input was found; 1
 * when a path cannot be read or no input was found (an empty or misnamed
 * corpus must fail the test, not pass it). A bug in the code under test
 * aborts inside the target (sanitizer report or abort()).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t g_inputs;

/* Reads a whole file into a malloc'd buffer (never NULL for size 0). */
static int read_all(const char *path, uint8_t **out, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (n == cap) {
            uint8_t *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f) || !b;
    fclose(f);
    if (err) {
        free(b);
        return -1;
    }
    *out = b;
    *size = n;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay(const char *path);

static int replay_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ".", "..", editor and libFuzzer temp files */
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len = strlen(path) + 1 + strlen(names[i]) + 1;
        char *child = malloc(len);
        if (!child) {
            rc = -1;
            break;
        }
        snprintf(child, len, "%s/%s", path, names[i]);
        rc = replay(child);
        free(child);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) fprintf(stderr, "replay: failed under %s\n", path);
    return rc;
}

static int replay(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: cannot stat %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) return replay_dir(path);
    uint8_t *buf;
    size_t size;
    if (read_all(path, &buf, &size) != 0) {
        fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (getenv("TKS_REPLAY_VERBOSE")) fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    /* An exact-size heap copy, so ASan catches reads past the end. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (size) memcpy(exact, buf, size);
    free(buf);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    g_inputs++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 1;
    }
    for (int i = 1; i < argc; i++)
        if (replay(argv[i]) != 0) return 1;
    if (g_inputs == 0) {
        fprintf(stderr, "replay: no input found in the given paths\n");
        return 1;
    }
    fprintf(stderr, "replay: %zu input(s) ran\n", g_inputs);
    return 0;
}
