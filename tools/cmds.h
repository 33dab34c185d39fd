/*
 * cmds.h - the commands of the data tool (tokshard-full, tools/tokshard.c
 * dispatches to them) and the flag parsers they share (cmd_flags.c). Each
 * command takes the arguments after its name and returns the exit code
 * (cli.h: 0, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED).
 */
#ifndef TKS_TOOLS_CMDS_H
#define TKS_TOOLS_CMDS_H

#include <stdint.h>

#include "tokenize/tokenize.h"
#include "dataset/dataset.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"

int cli_build(int argc, char **argv);
int cli_train_tokenizer(int argc, char **argv);
int cli_verify_tokenizer(int argc, char **argv);
int cli_audit(int argc, char **argv);
/* audit --against-source of the dataset `path` (cmd_audit_source.c);
 * seed_given 0: a seed is drawn and printed. */
int cli_audit_source(const char *path, tks_source_audit_opts *o, int seed_given, int as_json);
int cli_inspect(int argc, char **argv);
int cli_cat(int argc, char **argv);

/* Unknown-option errors name the command: "build: unknown option --x". */
#define UNKNOWN(cmd) cmd ": unknown option %s"

/* Flag parsers (cli_flag.set): a size (64M), an input policy, one of the
 * names in f->ctx, a JSONL key, the longest document. size_value and
 * parse_policy are their plain forms; each returns 0 or an exit code after
 * printing the error. */
int size_value(const char *name, const char *v, uint64_t *x);
int set_int(const cli_flag *f, const char *name, const char *v);
int parse_policy(const char *flag, const char *v, tks_policy *p, int allow_replace);
int set_policy(const cli_flag *f, const char *name, const char *v);
int set_choice(const cli_flag *f, const char *name, const char *v);
int set_name(const cli_flag *f, const char *name, const char *v);
int set_max_doc_bytes(const cli_flag *f, const char *name, const char *v);
extern const char *const SPLIT_NAMES[];  /* tks_doc_split */
extern const char *const FORMAT_NAMES[]; /* tks_input_format */

/* The input flags of build and verify-tokenizer (tks_input_opts *io), and
 * their lines of the help page. */
#define INPUT_FLAGS(io)                                                                     \
    {                                                                                       \
        {.name = "--doc-split", .ptr = &(io)->split, .set = set_choice,                     \
         .meta = "file, line or blank-line", .ctx = (void *)SPLIT_NAMES},                   \
        {.name = "--format", .ptr = &(io)->format, .set = set_choice,                       \
         .meta = "auto, text or jsonl", .ctx = (void *)FORMAT_NAMES},                       \
        {.name = "--jsonl-key", .ptr = &(io)->jsonl_key, .set = set_name},             \
        {.name = "--parquet-column", .ptr = &(io)->parquet_column, .set = set_name},   \
        {.name = "--invalid-utf8", .ptr = &(io)->invalid_utf8, .set = set_policy,           \
         .meta = "replace, skip or fail"},                                                  \
        {.name = "--max-doc-bytes", .ptr = &(io)->max_doc_bytes, .set = set_max_doc_bytes}, \
        {.name = "--on-long-doc", .ptr = &(io)->long_doc, .set = set_policy,                \
         .meta = "skip or fail"},                                                           \
        {.name = "--on-bad-input", .ptr = &(io)->bad_input, .set = set_policy,              \
         .meta = "fail or skip"},                                                           \
        {.name = "--on-bad-record", .ptr = &(io)->bad_record, .set = set_policy,            \
         .meta = "fail or skip"},                                                           \
        {.name = "--no-follow-links", .type = CLI_BOOL, .ptr = &(io)->no_follow_links},     \
        {0},                                                                                \
    }

extern const char *const INPUT_HELP;

/* What inspect and cat read (view.c): a dataset directory (ds) or a single
 * shard (one), and its tokenizer when asked for (want_tokenizer: 0 no, 1
 * yes, an error without one, 2 when the dataset has one). */
typedef struct view {
    tks_dataset *ds;
    tks_shard *one;
    tks_tok *tk;
} view;
int open_view(const char *path, view *v, int want_tokenizer);
int parse_view_args(const char *name, const cli_flag *flags, int argc, char **argv,
                           const char **path);
void close_view(view *v);
size_t view_n(const view *v);
const tks_shard *view_shard(const view *v, size_t i);

#endif /* TKS_TOOLS_CMDS_H */
