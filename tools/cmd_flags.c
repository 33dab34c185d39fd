/* cmd_flags.c - flag parsers the data tool's commands share (tools/cmds.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "interop/interop.h"
#include "tokenize/tokenize.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/dist.h"
#include "tools/peer.h"
#include "tools/cmds.h"

/* A size flag's value into *x; 0 or an exit code after the error. */
int size_value(const char *name, const char *v, uint64_t *x) {
    cli_flag t = {.type = CLI_SIZE, .ptr = x};
    return cli_set_by_type(&t, name, v);
}

int parse_policy(const char *flag, const char *v, tks_policy *p, int allow_replace) {
    if (allow_replace && strcmp(v, "replace") == 0) *p = TKS_POLICY_REPLACE;
    else if (strcmp(v, "skip") == 0) *p = TKS_POLICY_SKIP;
    else if (strcmp(v, "fail") == 0) *p = TKS_POLICY_FAIL;
    else
        return cli_usage_error("%s %s: expected %s", flag, v, allow_replace ? "replace, skip or fail" : "skip or fail");
    return 0;
}

/* --invalid-utf8 and the --on-* policies: f->meta lists the values as the
 * missing-value error says them ("replace, skip or fail", "fail or skip"). */
int set_policy(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v) return cli_usage_error("%s needs %s", f->name, f->meta);
    return parse_policy(f->name, v, f->ptr, strstr(f->meta, "replace") != NULL);
}

/* --doc-split, --format: f->ctx lists the values (NULL-ended), stored as
 * their position in the list; f->meta says them ("file, line or blank-line"). */
int set_choice(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v) return cli_usage_error("%s needs %s", f->name, f->meta);
    const char *const *names = f->ctx;
    for (int i = 0; names[i]; i++)
        if (!strcmp(v, names[i])) {
            *(int *)f->ptr = i;
            return 0;
        }
    return cli_usage_error("%s %s: expected %s", f->name, v, f->meta);
}
const char *const SPLIT_NAMES[] = {"file", "line", "blank-line", NULL}; /* tks_doc_split */
const char *const FORMAT_NAMES[] = {"auto", "text", "jsonl", NULL};    /* tks_input_format */

int set_name(const cli_flag *f, const char *name, const char *v) {
    if (!v || !*v) return cli_usage_error("%s needs a name", name);
    *(const char **)f->ptr = v;
    return 0;
}

int set_max_doc_bytes(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    uint64_t *x = f->ptr;
    if (!v || cli_parse_size(v, x) || *x == 0)
        return cli_usage_error("--max-doc-bytes %s: expected a size such as 1M", v ? v : "");
    return 0;
}

/* Input flags shared by build, train-tokenizer and verify-tokenizer: a table
 * over *io. */

/* --threads of train-tokenizer and audit: any size, as an int. */
int set_int(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (!rc) *(int *)f->ptr = (int)x;
    return rc;
}

const char *const INPUT_HELP =
    "  --doc-split file|line|blank-line  one document per file, per line, or per paragraph [file]\n"
    "  --format auto|text|jsonl     auto: *.jsonl (also compressed) is JSONL, the rest text [auto]\n"
    "  --jsonl-key KEY              JSONL field holding the text [text]\n"
    "  --parquet-column NAME        *.parquet inputs: the column holding the text, one\n"
    "                               document per row (string or binary) [text]\n"
    "  --invalid-utf8 replace|skip|fail  U+FFFD for each bad sequence, skip the doc, or stop [replace]\n"
    "  --max-doc-bytes N            longest document, e.g. 64M [64M]\n"
    "  --on-long-doc skip|fail      what to do with longer documents [skip]\n"
    "  --on-bad-record fail|skip    JSONL lines that do not parse or lack the key [fail]\n"
    "  --on-bad-input fail|skip     files named as compressed (x.gz, x.tar.zst) whose bytes are\n"
    "                               not (and dangling symlinks in the trees): stop naming the\n"
    "                               file, or leave it out and list it [fail]\n"
    "  --no-follow-links            leave out symbolic links to files found inside the named\n"
    "                               directories (followed by default; the summary and the\n"
    "                               manifest count those that lead outside the named paths)\n";
