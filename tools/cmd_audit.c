/* cmd_audit.c - audit: a dataset verified bit for bit (tokshard audit). */
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

static int set_model_vocab(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    if (x == 0 || x > UINT32_MAX) return cli_usage_error("--model-vocab must be in 1..2^32-1");
    *(uint32_t *)f->ptr = (uint32_t)x;
    return 0;
}

static int set_max_problems(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    *(size_t *)f->ptr = strtoull(v, NULL, 10);
    return 0;
}

int cli_audit(int argc, char **argv) {
    tks_audit_opts ao = {0};
    tks_foreign_opts fo;
    tks_foreign_opts_default(&fo);
    tks_tok_opts to = {0};
    int as_json = 0, against = 0, all = 0;
    uint64_t sample = 0, seed = UINT64_MAX;
    cli_flag foreign[CLI_FOREIGN_FLAGS];
    cli_foreign_table(&fo, foreign);
    const cli_flag flags[] = {
        {.name = "--json", .type = CLI_BOOL, .ptr = &as_json},
        {.name = "--model-vocab", .ptr = &ao.model_vocab, .set = set_model_vocab},
        {.name = "--tokenizer", .type = CLI_STR, .ptr = &ao.tokenizer_path},
        {.name = "--pattern", .type = CLI_STR, .ptr = &to.pattern},
        {.name = "--special-tokens", .type = CLI_STR, .ptr = &to.special_tokens},
        {.name = "--threads", .ptr = &ao.threads, .set = set_int},
        {.name = "--max-problems", .ptr = &ao.max_problems, .set = set_max_problems},
        {.name = "--against-source", .type = CLI_BOOL, .ptr = &against},
        {.name = "--sample", .type = CLI_U64, .ptr = &sample, .lo = 1, .hi = CLI_BIG},
        {.name = "--all", .type = CLI_BOOL, .ptr = &all},
        {.name = "--seed", .type = CLI_U64, .ptr = &seed, .lo = 0, .hi = CLI_BIG},
        {0},
    };
    cli_one arg = {NULL, "audit: one DIR or SHARD only (got %s and %s)"};
    cli_command cmd = {.shared = foreign, .flags = flags, .unknown = UNKNOWN("audit"), .positional = cli_take_one, .ctx = &arg};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    const char *path = arg.value;
    if (!path) return cli_usage_error("audit: give a dataset DIR or a SHARD file");
    if (!fo.format && (fo.token_bytes || fo.eot_id != TKS_NO_ID || fo.eod_id != TKS_NO_ID))
        return cli_usage_error("audit: --dtype, --eot and --eod need --format megatron|llmc|raw|datatrove");
    if ((to.pattern || to.special_tokens) && !ao.tokenizer_path)
        return cli_usage_error("audit: --pattern and --special-tokens go with --tokenizer FILE.tiktoken");
    if (!against && (sample || all || seed != UINT64_MAX))
        return cli_usage_error("audit: --sample, --all and --seed go with --against-source");
    if (against && sample && all)
        return cli_usage_error("audit --against-source: give --sample N or --all, not both");
    if (against && (fo.format || ao.model_vocab))
        return cli_usage_error("audit --against-source: a tokshard dataset built by tokshard build only "
                               "(--format and --model-vocab are for the plain audit)");
    if (against) {
        tks_source_audit_opts so = {.tokenizer_path = ao.tokenizer_path, .pattern = to.pattern,
                                    .special_tokens = to.special_tokens, .sample = sample, .all = all,
                                    .seed = seed == UINT64_MAX ? 0 : seed, .threads = ao.threads,
                                    .max_problems = ao.max_problems};
        return cli_audit_source(path, &so, seed != UINT64_MAX, as_json);
    }
    /* --tokenizer: its fingerprint (a tiktoken file's covers its pattern) and
     * vocabulary; a file that does not load as a tokenizer is compared by
     * its bytes and reported by the audit */
    tks_tok *tk = NULL;
    if (ao.tokenizer_path && tks_tok_load_opts(ao.tokenizer_path, &to, &tk) == 0) {
        ao.tokenizer_fp = tks_tok_fingerprint(tk);
        cli_note_once(tks_tok_cache_note(tk));
    } else if (ao.tokenizer_path && (to.pattern || to.special_tokens || fo.format))
        return cli_lib_error();
    tks_clear_error();
    tks_tokenizer_info ti;
    if (tk) tks_tokenizer_record(tk, &ti);
    if (fo.format && !ao.model_vocab && tk) ao.model_vocab = ti.vocab_size;
    if (fo.format && !ao.model_vocab) {
        tks_tok_free(tk);
        return cli_usage_error("audit --format %s: --model-vocab N is required (the embedding size every id "
                               "must fit), or --tokenizer TOKENIZER, whose vocabulary it then is",
                               tks_foreign_format_name(fo.format));
    }
    tks_audit_report *r;
    int rank = 0; /* under mpirun: ranks audit a share each, rank 0 reports */
    int arc;
    if (fo.format) /* a foreign dataset: one process audits it, the other ranks wait */
        arc = dist_rank() != 0 ? 1 : tks_foreign_audit(path, &fo, ao.model_vocab, tk ? &ti : NULL, ao.max_problems, &r);
    else
        arc = dist_audit(path, &ao, &r, &rank) != 0 ? -1 : rank != 0;
    if (arc) {
        tks_tok_free(tk);
        return dist_finish(arc > 0 ? 0 : cli_lib_error());
    }
    /* a tokenizer given on the command line must also agree on the vocabulary */
    if (tk && r->vocab_size && ti.vocab_size != r->vocab_size)
        tks_audit_report_add(r, ao.max_problems ? ao.max_problems : 1000, 0, TKS_ERR_TOKENIZER,
                             ao.tokenizer_path, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE, TKS_NONE,
                             "tokenizer vocab %u, dataset vocab %u", ti.vocab_size, r->vocab_size);
    tks_tok_free(tk);
    int rc = cli_audit_print(path, r, as_json, fo.format ? tks_foreign_format_name(fo.format) : NULL);
    tks_audit_report_free(r);
    return dist_finish(rc);
}
