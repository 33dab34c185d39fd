/* cli.c - see cli.h. */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/tks.h"

const char *cli_prog = "tokshard";

int cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cli_prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run `%s --help` for usage)\n", cli_prog);
    va_end(ap);
    return EXIT_USAGE;
}

int cli_lib_error(void) {
    const tks_error *e = tks_last_error();
    fprintf(stderr, "%s: error: %s\n", cli_prog, e->message[0] ? e->message : tks_strerror(e->code));
    return e->code == TKS_ERR_INTERRUPTED ? EXIT_INTERRUPTED : EXIT_USAGE;
}

int cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        default: return -1;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return -1;
    }
    v *= mul;
    if (v > 1.8e19 || v != floor(v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return -1;
    *out = (float)v;
    return 0;
}

int cli_next(cli_args *a, const char **positional) {
    *positional = NULL;
    a->val = NULL;
    if (a->i >= a->argc) return 0;
    char *s = a->argv[a->i++];
    if (strcmp(s, "--") == 0) {
        if (a->i < a->argc) *positional = a->argv[a->i++];
        return 1;
    }
    if (s[0] != '-' || s[1] == 0) {
        *positional = s;
        return 1;
    }
    const char *eq = strchr(s, '=');
    size_t n = eq ? (size_t)(eq - s) : strlen(s);
    if (n >= sizeof a->name) n = sizeof a->name - 1;
    memcpy(a->name, s, n);
    a->name[n] = 0;
    if (eq) a->val = eq + 1;
    return 1;
}

const char *cli_value(cli_args *a) {
    if (a->val) return a->val;
    if (a->i < a->argc) return a->val = a->argv[a->i++];
    return NULL;
}

void cli_json_print(json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2));
    puts(s);
    free(s);
    json_decref(j);
}
