/* tks_json.h - jansson's json_load_file for files a user may have replaced:
 * a FIFO or device in place of a checkpoint's or a dataset's JSON file is
 * refused instead of blocking the reader for ever. Header-only: its includers
 * link jansson already, tks_common does not. */
#ifndef TKS_JSON_H
#define TKS_JSON_H
#include <jansson.h>
#include <stdio.h>
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
#endif
