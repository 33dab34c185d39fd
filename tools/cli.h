/* cli.h - flag parsing and error printing shared by the tokshard executables.
 * CLI code only: it prints and picks exit codes; the libraries never do. */
#ifndef TKS_CLI_H
#define TKS_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define EXIT_PROBLEMS 1
#define EXIT_USAGE 2
#define EXIT_INTERRUPTED 130

/* The executable's name in messages ("tokshard", "tokshard-train"). */
extern const char *cli_prog;

/* Prints "PROG: <message>" and a hint to run help; returns EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the last library error; returns EXIT_INTERRUPTED or EXIT_USAGE. */
int cli_lib_error(void);
/* Prints "PROG: note: <note>" on stderr the first time a process passes a
 * non-empty note (a tokenizer cache left unused: tks_tok_cache_note), never
 * again; NULL or "" prints nothing. */
void cli_note_once(const char *note);
/* Installs the handler of SIGINT and SIGTERM for a long command that stops
 * cleanly: the first signal sets *flag to 1 (the command sees it at its next
 * check, says where it stopped and keeps what --resume needs); a second one
 * at least half a second later writes "PROG: interrupted again: leaving now"
 * on stderr and exits with EXIT_INTERRUPTED at once. A second signal sooner
 * is the same stop delivered twice and is ignored: timeout(1) sends its
 * signal to the command and then to the whole process group, and a launcher
 * may do the same. `flag` must outlive the process's use of the handler. */
void cli_stop_on_signals(volatile sig_atomic_t *flag);
/* "123", "64K", "16M", "2G" (powers of 1024), "1e6" -> *out. Returns 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);
/* A float; returns 0 or -1. */
int cli_parse_float(const char *s, float *out);
/* b bytes for a progress line, in powers of 1000: "512 B", "1.5 MB". */
void cli_human_bytes(double b, char *out, size_t n);

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

/* ---------------------------------------------------------------------------
 * Flag tables: every executable describes its flags in tables of cli_flag
 * and parses them with cli_parse; tokshard-train also prints its --help from
 * its table (cli_flags_help), with the real defaults and ranges. */
typedef enum {
    CLI_STR,   /* const char **: the value as given */
    CLI_BOOL,  /* int *: set to 1; takes no value */
    CLI_SIZE,  /* uint64_t *: cli_parse_size */
    CLI_U32,   /* uint32_t *: cli_parse_size, within [lo, hi] */
    CLI_U64,   /* uint64_t *: cli_parse_size, within [lo, hi] */
    CLI_FLOAT, /* float *: cli_parse_float, within [lo, hi] */
} cli_type;

typedef struct cli_flag cli_flag;
/* A flag's own parser. name: the flag as typed (the name or the alias); v:
 * for a CLI_BOOL its =value (NULL when none), else the =value or the next
 * argument (NULL when there is none). Returns 0, or an exit code after
 * printing the error. */
typedef int (*cli_set_fn)(const cli_flag *f, const char *name, const char *v);

struct cli_flag {
    const char *name;  /* "--output"; NULL ends a table */
    const char *alias; /* "-o", or NULL */
    cli_type type;
    void *ptr;         /* the destination: of the type's C type, or what `set` writes */
    cli_set_fn set;    /* NULL: parsed by type */
    const char *help;  /* cli_flags_help: what it does */
    const char *meta;  /* cli_flags_help: the value's name (DIR, N, F) */
    double lo, hi;     /* CLI_U32, CLI_U64, CLI_FLOAT: the allowed range */
    int open;          /* bit 0: lo excluded, bit 1: hi excluded */
    void *ctx;         /* for set: what else it needs (a message, the values, a context) */
};
/* A range's upper bound meaning "no limit worth showing" (--help says ">= lo"). */
#define CLI_BIG 1e12

/* A command: its flag tables, and what to do with what they do not name. */
typedef struct cli_command {
    const cli_flag *flags;  /* the command's own flags */
    const cli_flag *shared; /* flags shared with other commands (searched first), or NULL */
    /* the unknown-option error: a format with one %s (the option) */
    const char *unknown;
    /* replaces `unknown` when set: returns an exit code (a: the scanner at the option) */
    int (*on_unknown)(cli_args *a, void *ctx);
    /* a positional argument: returns 0 or an exit code; NULL: "unexpected argument" */
    int (*positional)(const char *arg, void *ctx);
    /* --help and -h print this and stop with 0; NULL: they are unknown options */
    void (*help)(void);
    void *ctx;
} cli_command;

/* cli_parse's result when every argument was taken and the command goes on. */
#define CLI_PARSED (-1)
/* Parses argv[0..argc) with c's tables. Returns CLI_PARSED, or the exit code
 * to stop with (0 after --help; EXIT_USAGE after printing a usage error). */
int cli_parse(const cli_command *c, int argc, char **argv);

/* Sets flag f from v (not NULL, unless a CLI_BOOL) by its type, printing
 * nothing. Returns 0, or -1 when v is not a value of the type or out of range. */
int cli_parse_typed(const cli_flag *f, const char *v);
/* Sets flag f from v by its type (the built-in parsers). Returns 0 or an exit
 * code after printing the error. */
int cli_set_by_type(const cli_flag *f, const char *name, const char *v);

/* A setter for flags with one message for every failure: parses v by f's
 * type and, when v is missing or bad, prints f->ctx (a const char *, the
 * whole message). */
int cli_set_or_say(const cli_flag *f, const char *name, const char *v);

/* Positional arguments. cli_take_one: a command's one positional argument;
 * ctx is a cli_one, whose `again` (a format given the first and the second
 * argument) is the error for a second one. cli_take_all: every positional,
 * in order; ctx is a cli_list. */
typedef struct cli_one {
    const char *value;
    const char *again;
} cli_one;
int cli_take_one(const char *arg, void *ctx);
typedef struct cli_list {
    const char **items; /* room for every argument (the command's argv may serve: an
                         * argument is stored in a slot the scanner has already read) */
    size_t n;
} cli_list;
int cli_take_all(const char *arg, void *ctx);

/* Prints one line per flag of table t: "  --name META  help (range) [default]",
 * the default being the destination's current value. */
void cli_flags_help(const cli_flag *t);

/* The commands of `tokshard` written in files of their own (the rest are in
 * tools/tokshard.c): each takes the arguments after the command's name and
 * returns the exit code. */
int cli_sample_plan(int argc, char **argv);  /* tools/sample_plan.c */
int cli_import(int argc, char **argv);       /* tools/interop_cli.c, as the next three */
int cli_export(int argc, char **argv);
int cli_export_hf(int argc, char **argv);
/* --format, --dtype, --eot and --eod of another project's dataset (audit
 * --format, import): fills t with a table over *fo, ended by an empty entry. */
#define CLI_FOREIGN_FLAGS 5
struct tks_foreign_opts;
void cli_foreign_table(struct tks_foreign_opts *fo, cli_flag t[CLI_FOREIGN_FLAGS]);

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

/* Writes to f, after "lead: ", the note on a byte-level dataset's code
 * points unassigned in the encoder's Unicode (the manifest's count: build,
 * inspect, audit); nothing when code_points is 0. (tools/audit_report.c) */
void cli_unassigned_note(FILE *f, const char *lead, const char *unicode, uint64_t code_points, uint64_t docs);

#endif
