/* check.h - the harness of the C tests: CHECK(cond, fmt, ...) counts a failure
 * and says where, what and why; main returns check_exit("name"). Each test is
 * a ctest test that fails by exit code. */
#ifndef TKS_TEST_CHECK_H
#define TKS_TEST_CHECK_H

#include <stdio.h>

static int failures = 0;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

/* 0 when every check passed, else 1, with a summary line. */
static inline int check_exit(const char *name) {
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif
