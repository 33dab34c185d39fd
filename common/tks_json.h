/* tks_json.h - jansson's json_load_file for files a user may have replaced:
 * a FIFO or device in place of a checkpoint's or a dataset's JSON file is
 * refused instead of blocking the reader for ever. Header-only: its includers
 * link jansson already, tks_common does not. */
#ifndef TKS_JSON_H
#define TKS_JSON_H
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tks.h"
#include "common/tks_bits.h"

/* As json_load_file(path, flags, err), through tks_open_regular: NULL with
 * err->text set when the file is missing, not a regular file or not JSON.
 * The caller owns the returned reference. */
static inline json_t *tks_json_load_regular(const char *path, size_t flags, json_error_t *err) {
    int fd;
    if (tks_open_regular(path, NULL, &fd, NULL)) {
        const char *m = tks_last_error()->message; /* cut to jansson's 160 bytes */
        size_t n = strlen(m) < sizeof err->text ? strlen(m) : sizeof err->text - 1;
        memcpy(err->text, m, n);
        err->text[n] = 0;
        err->line = err->column = -1;
        err->position = 0;
        snprintf(err->source, sizeof err->source, "%s", "<file>");
        return NULL;
    }
    json_t *j = json_loadfd(fd, flags, err);
    close(fd);
    return j;
}

/* A file name as a JSON string, losslessly: as it is when it is UTF-8
 * (jansson refuses other strings: json_string gives NULL), else with each
 * byte of an invalid sequence written \xNN and every backslash doubled, so
 * that the name is unambiguous (Latin-1 "caf\xe9.txt"). NULL only when out
 * of memory. The caller owns the reference. */
static inline json_t *tks_json_path(const char *path) {
    json_t *s = json_string(path);
    if (s) return s;
    size_t n = strlen(path);
    char *out = malloc(4 * n + 1);
    if (!out) return NULL;
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)path;
    for (size_t i = 0; i < n;) {
        int k = u[i] < 0x80 ? 1 : tks_utf8_seq(u + i, n - i);
        if (k < 0) { /* the ill-formed bytes, each as \xNN */
            for (int b = 0; b < -k; b++) o += (size_t)snprintf(out + o, 5, "\\x%02x", u[i++]);
        } else if (u[i] == '\\') {
            out[o++] = '\\', out[o++] = '\\';
            i++;
        } else {
            memcpy(out + o, path + i, (size_t)k);
            o += (size_t)k, i += (size_t)k;
        }
    }
    out[o] = 0;
    s = json_string(out);
    free(out);
    return s;
}
#endif
