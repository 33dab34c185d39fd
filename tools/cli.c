/* cli.c - see cli.h. */
#define _POSIX_C_SOURCE 200809L
#include "tools/cli.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/tks.h"

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

void cli_note_once(const char *note) {
    static int said;
    if (!note || !*note || said) return;
    said = 1;
    fprintf(stderr, "%s: note: %s\n", cli_prog, note);
}

static volatile sig_atomic_t *g_stop_flag;
static struct timespec g_first_signal;

/* async-signal-safe: clock_gettime, strlen of a constant, write, _exit */
static void on_stop_signal(int sig) {
    (void)sig;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!*g_stop_flag) {
        g_first_signal = now;
        *g_stop_flag = 1;
        return;
    }
    double since = (double)(now.tv_sec - g_first_signal.tv_sec) + 1e-9 * (double)(now.tv_nsec - g_first_signal.tv_nsec);
    if (since < 0.5) return; /* the first stop, delivered again */
    static const char again[] = ": interrupted again: leaving now (what is complete is kept: run the same "
                                "command with --resume)\n";
    if (write(STDERR_FILENO, cli_prog, strlen(cli_prog)) < 0 || write(STDERR_FILENO, again, sizeof again - 1) < 0)
        _exit(EXIT_INTERRUPTED);
    _exit(EXIT_INTERRUPTED);
}

void cli_stop_on_signals(volatile sig_atomic_t *flag) {
    g_stop_flag = flag;
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
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

void cli_human_bytes(double b, char *out, size_t n) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
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

/* " (0 < F <= 10)": a range-checked flag's range, as --help and errors say it. */
static void range_text(const cli_flag *f, char *out, size_t n) {
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.15g", f->lo);
    snprintf(hi, sizeof hi, "%.15g", f->hi);
    if (f->hi >= CLI_BIG && f->type != CLI_FLOAT)
        snprintf(out, n, " (%s %s %s)", f->meta, f->open & 1 ? ">" : ">=", lo);
    else
        snprintf(out, n, " (%s %s %s %s %s)", lo, f->open & 1 ? "<" : "<=", f->meta,
                 f->open & 2 ? "<" : "<=", hi);
}

static void fmt_default(const cli_flag *f, char *out, size_t n) {
    switch (f->type) {
    case CLI_STR: snprintf(out, n, "%s", *(const char **)f->ptr ? *(const char **)f->ptr : "-"); break;
    case CLI_U32: snprintf(out, n, "%u", *(uint32_t *)f->ptr); break;
    case CLI_SIZE:
    case CLI_U64: snprintf(out, n, "%llu", (unsigned long long)*(uint64_t *)f->ptr); break;
    case CLI_FLOAT: snprintf(out, n, "%g", *(float *)f->ptr); break;
    case CLI_BOOL: snprintf(out, n, "%s", *(int *)f->ptr ? "on" : "off"); break;
    }
}

void cli_flags_help(const cli_flag *t) {
    for (const cli_flag *f = t; f->name; f++) {
        char d[64], nm[48], r[96] = "";
        fmt_default(f, d, sizeof d);
        snprintf(nm, sizeof nm, "%s%s%s", f->name, f->meta ? " " : "", f->meta ? f->meta : "");
        if (f->type == CLI_U32 || f->type == CLI_U64 || f->type == CLI_FLOAT)
            range_text(f, r, sizeof r);
        printf("  %-26s %s%s [%s]\n", nm, f->help, r, d);
    }
}

/* 1 when x lies in f's range. */
static int in_range(const cli_flag *f, double x) {
    return x >= f->lo && x <= f->hi && !(f->open & 1 && x == f->lo) && !(f->open & 2 && x == f->hi);
}

int cli_parse_typed(const cli_flag *f, const char *v) {
    uint64_t x;
    float y;
    switch (f->type) {
    case CLI_BOOL: *(int *)f->ptr = 1; return 0;
    case CLI_STR: *(const char **)f->ptr = v; return 0;
    case CLI_SIZE: return cli_parse_size(v, (uint64_t *)f->ptr);
    case CLI_U32:
    case CLI_U64:
        if (cli_parse_size(v, &x) || !in_range(f, (double)x)) return -1;
        if (f->type == CLI_U32) *(uint32_t *)f->ptr = (uint32_t)x;
        else *(uint64_t *)f->ptr = x;
        return 0;
    case CLI_FLOAT:
        /* the bounds as floats, as the value is: --lr 1e30 is (float)1e30 */
        if (cli_parse_float(v, &y) || !(y >= (float)f->lo && y <= (float)f->hi) ||
            (f->open & 1 && y == (float)f->lo) || (f->open & 2 && y == (float)f->hi))
            return -1;
        *(float *)f->ptr = y;
        return 0;
    }
    return -1;
}

int cli_set_by_type(const cli_flag *f, const char *name, const char *v) {
    if (f->type != CLI_BOOL && !v) return cli_usage_error("%s needs a value", name);
    if (!cli_parse_typed(f, v)) return 0;
    if (f->type == CLI_SIZE)
        return cli_usage_error("%s %s: expected a number such as 1000000, 64K, 16M or 2G", name, v);
    char r[96];
    range_text(f, r, sizeof r);
    return cli_usage_error("%s %s: expected a %s in range%s", name, v,
                           f->type == CLI_FLOAT ? "number" : "whole number", r);
}

int cli_set_or_say(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if ((v || f->type == CLI_BOOL) && !cli_parse_typed(f, v)) return 0;
    return cli_usage_error("%s", (const char *)f->ctx);
}

int cli_take_one(const char *arg, void *ctx) {
    cli_one *o = ctx;
    if (o->value) return cli_usage_error(o->again, o->value, arg);
    o->value = arg;
    return 0;
}

int cli_take_all(const char *arg, void *ctx) {
    cli_list *l = ctx;
    l->items[l->n++] = arg;
    return 0;
}

static const cli_flag *find_in(const cli_flag *t, const char *name) {
    for (const cli_flag *f = t; f && f->name; f++)
        if (!strcmp(name, f->name) || (f->alias && !strcmp(name, f->alias))) return f;
    return NULL;
}

static const cli_flag *find_flag(const cli_command *c, const char *name) {
    const cli_flag *f = find_in(c->shared, name);
    return f ? f : find_in(c->flags, name);
}

int cli_parse(const cli_command *c, int argc, char **argv) {
    cli_args a = {argc, 0, argv, NULL, {0}};
    const char *pos;
    while (cli_next(&a, &pos)) {
        int rc = 0;
        if (pos) {
            rc = c->positional ? c->positional(pos, c->ctx)
                               : cli_usage_error("unexpected argument '%s'", pos);
            if (rc) return rc;
            continue;
        }
        if (c->help && (!strcmp(a.name, "--help") || !strcmp(a.name, "-h"))) {
            c->help();
            return 0;
        }
        const cli_flag *f = find_flag(c, a.name);
        if (!f) return c->on_unknown ? c->on_unknown(&a, c->ctx) : cli_usage_error(c->unknown, a.name);
        const char *v = f->type == CLI_BOOL ? a.val : cli_value(&a);
        rc = f->set ? f->set(f, a.name, v) : cli_set_by_type(f, a.name, v);
        if (rc) return rc;
    }
    return CLI_PARSED;
}
