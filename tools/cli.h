/* cli.h - flag parsing and error printing shared by the tokshard executables.
 * CLI code only: it prints and picks exit codes; the libraries never do. */
#ifndef TKS_CLI_H
#define TKS_CLI_H

#include <stdint.h>

#define EXIT_PROBLEMS 1
#define EXIT_USAGE 2
#define EXIT_INTERRUPTED 130

/* The executable's name in messages ("tokshard", "tokshard-train"). */
extern const char *cli_prog;

/* Prints "PROG: <message>" and a hint to run help; returns EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the last library error; returns EXIT_INTERRUPTED or EXIT_USAGE. */
int cli_lib_error(void);
/* "123", "64K", "16M", "2G" (powers of 1024), "1e6" -> *out. Returns 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);
/* A float; returns 0 or -1. */
int cli_parse_float(const char *s, float *out);

/* Flag scanner: --name value, --name=value, bare --flag, and positionals. */
typedef struct cli_args {
    int argc, i;
    char **argv;
    const char *val;   /* value of the current option, once need_val was called */
    char name[64];     /* current option name */
} cli_args;

/* Advances: returns 0 at the end; else 1 with *positional set (a positional
 * argument) or NULL (an option: see a->name). */
int cli_next(cli_args *a, const char **positional);
/* The current option's value (=value or the next argument), NULL if none. */
const char *cli_value(cli_args *a);

/* Prints j (a jansson json_t) to stdout, indented by 2, and a newline;
 * takes the reference to j. */
struct json_t;
void cli_json_print(struct json_t *j);

/* Prints an audit report of path to stdout, as text or (as_json) JSON;
 * foreign: the format's name for another project's dataset, else NULL.
 * Returns the exit code: EXIT_PROBLEMS if the report has problems, else 0.
 * (tools/audit_report.c; declared here so both executables share it, the
 * report type comes from dataset/dataset.h) */
struct tks_audit_report;
int cli_audit_print(const char *path, const struct tks_audit_report *r, int as_json, const char *foreign);

#endif
