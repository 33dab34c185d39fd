/* view.c - a dataset directory or a single shard, as inspect and cat read
 * it (tools/cmds.h). */
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

/* want_tokenizer: 0 no, 1 yes (an error without one), 2 when the dataset has one */
int open_view(const char *path, view *v, int want_tokenizer) {
    memset(v, 0, sizeof *v);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "%s: error: %s: %s\n", cli_prog, path, strerror(errno));
        return EXIT_USAGE;
    }
    if (S_ISDIR(sb.st_mode)) {
        if (tks_dataset_open(path, &v->ds)) return cli_lib_error();
        int none = !strcmp(tks_dataset_tokenizer(v->ds)->model_type, "none");
        if (want_tokenizer == 2 && none) want_tokenizer = 0; /* inspect: pieces when there are any */
        if (want_tokenizer && none) {
            fprintf(stderr, "%s: error: %s has no tokenizer (it was imported with --vocab-size): its ids "
                    "cannot be decoded; use --ids\n", cli_prog, path);
            tks_dataset_close(v->ds);
            return EXIT_USAGE;
        }
        if (want_tokenizer && tks_tok_load(tks_dataset_tokenizer_path(v->ds), &v->tk)) {
            int rc = cli_lib_error();
            tks_dataset_close(v->ds);
            return rc;
        }
        if (v->tk) cli_note_once(tks_tok_cache_note(v->tk));
    } else if (tks_shard_open(path, &v->one)) {
        return cli_lib_error();
    }
    /* inspect and cat scan documents in order */
    tks_dataset_advise(v->ds, TKS_ACCESS_SEQUENTIAL);
    tks_shard_advise(v->one, TKS_ACCESS_SEQUENTIAL);
    return 0;
}

/* The arguments of inspect and cat: flags, and one DIR or SHARD (*path).
 * Returns CLI_PARSED or the exit code. */
int parse_view_args(const char *name, const cli_flag *flags, int argc, char **argv,
                           const char **path) {
    char unknown[64], again[64];
    snprintf(unknown, sizeof unknown, "%s: unknown option %%s", name);
    snprintf(again, sizeof again, "%s: one DIR or SHARD only", name);
    cli_one arg = {NULL, again};
    cli_command cmd = {.flags = flags, .unknown = unknown, .positional = cli_take_one, .ctx = &arg};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!(*path = arg.value)) return cli_usage_error("%s: give a dataset DIR or a SHARD file", name);
    return CLI_PARSED;
}

void close_view(view *v) {
    tks_dataset_close(v->ds);
    tks_shard_close(v->one);
    tks_tok_free(v->tk);
}

size_t view_n(const view *v) { return v->ds ? tks_dataset_n_shards(v->ds) : 1; }
const tks_shard *view_shard(const view *v, size_t i) {
    return v->ds ? tks_dataset_shard(v->ds, i) : v->one;
}
