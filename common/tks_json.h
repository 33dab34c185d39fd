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
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)path[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = len && i + len <= n && (len == 1 || c >= 0xC2) && !(c == 0xF4 && len == 4 &&
                                                                      (unsigned char)path[i + 1] > 0x8F);
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)path[i + k] & 0xC0) == 0x80;
        if (ok && len == 3) { /* no overlong forms, no surrogates */
            unsigned char d = (unsigned char)path[i + 1];
            ok = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d >= 0xA0);
        }
        if (ok && len == 4) ok = !(c == 0xF0 && (unsigned char)path[i + 1] < 0x90) && c <= 0xF4;
        if (!ok) {
            o += (size_t)snprintf(out + o, 5, "\\x%02x", c);
            i++;
        } else if (c == '\\') {
            out[o++] = '\\', out[o++] = '\\';
            i++;
        } else {
            memcpy(out + o, path + i, len);
            o += len, i += len;
        }
    }
    out[o] = 0;
    s = json_string(out);
    free(out);
    return s;
}
#endif
