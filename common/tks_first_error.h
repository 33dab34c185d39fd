/*
 * The first error in an order (a document's place, a group's index) met by
 * the threads of an OpenMP loop, whichever thread meets it: errors are per
 * thread (tks_last_error), so the one recorded is copied here and restored
 * on the caller's thread at the end. Header only; include it from a
 * translation unit built with OpenMP (its pragmas are OpenMP's).
 *
 * Use: every thread that fails at place `at` calls tks_first_error_note;
 * work at place i is skipped when tks_first_error_before(f, i) says an
 * error was met before it (work before the first error is always done, so
 * the error reported is the first in order, not the first in time).
 */
#ifndef TKS_FIRST_ERROR_H
#define TKS_FIRST_ERROR_H

#include <stdint.h>

#include "common/tks.h"

typedef struct tks_first_error {
    uint64_t at; /* the place of the first error; UINT64_MAX: none yet */
    tks_error e; /* its context, copied from the thread that met it */
} tks_first_error;

#define TKS_FIRST_ERROR_NONE {UINT64_MAX, {0}}

/* Records the calling thread's last error as met at `at` when it comes
 * before the one recorded. */
static inline void tks_first_error_note(tks_first_error *f, uint64_t at) {
#pragma omp critical(tks_first_error)
    if (at < f->at) {
        f->e = *tks_last_error();
#pragma omp atomic write
        f->at = at;
    }
}

/* 1 when an error was recorded at a place before `at`. */
static inline int tks_first_error_before(tks_first_error *f, uint64_t at) {
    uint64_t first;
#pragma omp atomic read
    first = f->at;
    return first < at;
}

/* 0 when no error was recorded; else the error restored on the calling
 * thread and its code (`fallback` when it carries none). */
static inline int tks_first_error_result(const tks_first_error *f, int fallback) {
    if (f->at == UINT64_MAX) return 0;
    tks_error_restore(&f->e);
    return f->e.code ? f->e.code : fallback;
}

#endif
