/* interop_cli.c - `tokshard import` and `tokshard export`, and the flags
 * `tokshard audit --format` shares with them. Thin: parses flags, calls
 * interop/, prints. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interop/interop.h"
#include "tokenizer/tokenizer.h"
#include "trainer/trainer.h"
#include "tools/cli.h"

static int parse_id(const char *flag, const char *v, uint32_t *out) {
    char *e;
    if (!v || *v < '0' || *v > '9') return cli_usage_error("%s needs a token id", flag);
    unsigned long long x = strtoull(v, &e, 10);
    if (*e || x >= TKS_NO_ID) return cli_usage_error("%s %s: expected a token id below 2^32 - 1", flag, v);
    *out = (uint32_t)x;
    return 0;
}

/* --eot, --eod */
static int set_id(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    return parse_id(f->name, v, f->ptr);
}

static int set_format(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v || tks_foreign_format_parse(v, f->ptr))
        return cli_usage_error("--format %s: expected megatron, llmc, raw or datatrove", v ? v : "");
    return 0;
}

static int set_dtype(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (v && !strcmp(v, "u16")) *(uint32_t *)f->ptr = 2;
    else if (v && !strcmp(v, "u32")) *(uint32_t *)f->ptr = 4;
    else return cli_usage_error("--dtype %s: expected u16 or u32", v ? v : "");
    return 0;
}

void cli_foreign_table(struct tks_foreign_opts *fo, cli_flag t[CLI_FOREIGN_FLAGS]) {
    const cli_flag flags[CLI_FOREIGN_FLAGS] = {
        {.name = "--format", .ptr = &fo->format, .set = set_format},
        {.name = "--dtype", .ptr = &fo->token_bytes, .set = set_dtype},
        {.name = "--eot", .ptr = &fo->eot_id, .set = set_id},
        {.name = "--eod", .ptr = &fo->eod_id, .set = set_id},
        {0},
    };
    memcpy(t, flags, sizeof flags);
}

static volatile sig_atomic_t g_stop = 0;

static int set_import_chunk(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    uint64_t x;
    if (!v || cli_parse_size(v, &x) || x < TKS_MIN_CHUNK_BYTES || x > TKS_MAX_CHUNK_BYTES || x % 4)
        return cli_usage_error("--chunk-bytes: expected a multiple of 4 in [64, 1G]");
    *(uint32_t *)f->ptr = (uint32_t)x;
    return 0;
}

int cli_import(int argc, char **argv) {
    tks_import_opts o = {0};
    tks_foreign_opts_default(&o.foreign);
    int quiet = 0;
    cli_flag foreign[CLI_FOREIGN_FLAGS];
    cli_foreign_table(&o.foreign, foreign);
    const cli_flag flags[] = {
        {.name = "--output", .alias = "-o", .type = CLI_STR, .ptr = &o.out_dir, .set = cli_set_or_say,
         .ctx = "--output needs a directory"},
        {.name = "--tokenizer", .type = CLI_STR, .ptr = &o.tokenizer_path, .set = cli_set_or_say,
         .ctx = "--tokenizer needs a .model file, a tokenizer.json or a tiktoken file"},
        {.name = "--pattern", .type = CLI_STR, .ptr = &o.pattern},
        {.name = "--special-tokens", .type = CLI_STR, .ptr = &o.special_tokens},
        {.name = "--vocab-size", .type = CLI_U32, .ptr = &o.vocab_size, .set = cli_set_or_say,
         .lo = 1, .hi = TKS_NO_ID - 1, .ctx = "--vocab-size needs a number in 1..2^32-2"},
        {.name = "--shard-tokens", .type = CLI_U64, .ptr = &o.shard_tokens, .set = cli_set_or_say,
         .lo = 1, .hi = 18446744073709551615.0, .ctx = "--shard-tokens needs a number such as 16M"},
        {.name = "--chunk-bytes", .ptr = &o.chunk_bytes, .set = set_import_chunk},
        {.name = "--resume", .type = CLI_BOOL, .ptr = &o.resume},
        {.name = "--quiet", .alias = "-q", .type = CLI_BOOL, .ptr = &quiet},
        {0},
    };
    cli_one src = {NULL, "import: one SOURCE only (got %s and %s)"};
    cli_command cmd = {.shared = foreign, .flags = flags, .unknown = "import: unknown option %s",
                       .positional = cli_take_one, .ctx = &src};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSED) return rc;
    o.src = src.value;
    if (!o.foreign.format) return cli_usage_error("import: --format megatron|llmc|raw|datatrove is required");
    if (!o.src) return cli_usage_error("import: give the SOURCE (Megatron PREFIX, llm.c/raw file or datatrove .ds)");
    if (!o.out_dir) return cli_usage_error("import: --output DIR is required");
    if (!o.tokenizer_path && !o.vocab_size)
        return cli_usage_error("import: --tokenizer MODEL (the tokenizer the ids come from) or --vocab-size N is required");
    cli_stop_on_signals(&g_stop);
    o.stop = &g_stop;
    tks_import_stats st;
    if (tks_import(&o, &st)) return cli_lib_error();
    if (!quiet) {
        printf("imported %s (%s) into %s\n", o.src, tks_foreign_format_name(o.foreign.format), o.out_dir);
        printf("  documents     %llu read, %llu written, %llu empty skipped%s\n",
               (unsigned long long)st.docs_read, (unsigned long long)st.docs_written,
               (unsigned long long)st.empty_skipped,
               st.continued_first ? " (the first continues a document from the previous file)" : "");
        printf("  tokens        %llu, ids in [%u, %u], vocab %u\n", (unsigned long long)st.tokens_written,
               st.min_token_id, st.max_token_id, st.vocab_size);
        printf("  shards        %llu", (unsigned long long)st.shards);
        if (st.resumed_shards) printf(" (%llu kept from the interrupted run)", (unsigned long long)st.resumed_shards);
        printf("\n  elapsed       %.2f s\n", st.seconds);
    }
    return 0;
}

static int set_export_format(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    tks_foreign_format *fm = f->ptr;
    if (!v || tks_foreign_format_parse(v, fm) || (*fm != TKS_FOREIGN_MEGATRON && *fm != TKS_FOREIGN_LLMC))
        return cli_usage_error("--format %s: export writes megatron or llmc", v ? v : "");
    return 0;
}

/* DIR PREFIX of export, CHECKPOINT DIR of export-hf: two positional
 * arguments; `third` is the error for a third (a format given it). */
typedef struct two_args {
    const char *v[2];
    const char *third;
} two_args;

static int take_two(const char *arg, void *ctx) {
    two_args *t = ctx;
    if (!t->v[0]) t->v[0] = arg;
    else if (!t->v[1]) t->v[1] = arg;
    else return cli_usage_error(t->third, arg);
    return 0;
}

/* Parses the flags and up to two positional arguments into args->v
 * (`unknown`: the error for an unknown option): CLI_PARSED or an exit code. */
static int parse_two(const cli_flag *flags, const char *unknown, two_args *args, int argc, char **argv) {
    cli_command cmd = {.flags = flags, .unknown = unknown, .positional = take_two, .ctx = args};
    return cli_parse(&cmd, argc, argv);
}

int cli_export(int argc, char **argv) {
    tks_export_opts o = {0};
    o.eot_id = TKS_NO_ID;
    two_args args = {{NULL, NULL}, "export: expected DIR PREFIX (got a third argument %s)"};
    const cli_flag flags[] = {
        {.name = "--format", .ptr = &o.format, .set = set_export_format},
        {.name = "--copy", .type = CLI_BOOL, .ptr = &o.copy},
        {.name = "--eot", .ptr = &o.eot_id, .set = set_id},
        {0},
    };
    int rc = parse_two(flags, "export: unknown option %s", &args, argc, argv);
    if (rc != CLI_PARSED) return rc;
    const char *dir = args.v[0], *prefix = args.v[1];
    if (!o.format) return cli_usage_error("export: --format megatron|llmc is required");
    if (!dir || !prefix) return cli_usage_error("export: give the dataset DIR and the output PREFIX");
    if (o.eot_id != TKS_NO_ID && o.format != TKS_FOREIGN_LLMC)
        return cli_usage_error("export: --eot applies to --format llmc only");
    tks_export_stats st;
    if (tks_export(dir, prefix, &o, &st)) return cli_lib_error();
    if (st.docs_end_eot && st.eot_inserted)
        fprintf(stderr, "%s: warning: %llu of %llu documents already end with --eot %u (the dataset "
                "was built with --append-eos): llm.c delimits documents by a leading EOT, so those "
                "boundaries now hold two. Build the dataset without --append-eos to export it for "
                "llm.c, or give --eot an id that is not the dataset's EOS\n",
                cli_prog, (unsigned long long)st.docs_end_eot, (unsigned long long)st.docs,
                o.eot_id);
    printf("exported %s as %s: %llu file set(s) %s_NNNNN, %llu documents, %llu tokens, %.1f MB written%s\n",
           dir, tks_foreign_format_name(o.format), (unsigned long long)st.files, prefix,
           (unsigned long long)st.docs, (unsigned long long)st.tokens, st.bytes_written / 1e6,
           o.format == TKS_FOREIGN_MEGATRON && !o.copy ? " (the .bin files are links to the shards)" : "");
    return 0;
}

int cli_export_hf(int argc, char **argv) {
    two_args args = {{NULL, NULL}, "export-hf: expected CHECKPOINT DIR (got a third argument %s)"};
    const char *model = NULL;
    tks_tok_opts to = {0};
    const cli_flag flags[] = {
        {.name = "--tokenizer", .type = CLI_STR, .ptr = &model, .set = cli_set_or_say,
         .ctx = "--tokenizer needs a .model file, a tokenizer.json or a tiktoken file"},
        {.name = "--pattern", .type = CLI_STR, .ptr = &to.pattern},
        {.name = "--special-tokens", .type = CLI_STR, .ptr = &to.special_tokens},
        {0},
    };
    int rc = parse_two(flags, "export-hf: unknown option %s", &args, argc, argv);
    if (rc != CLI_PARSED) return rc;
    const char *ckpt = args.v[0], *dir = args.v[1];
    if (model) { /* the tokenizer alone: tokenizer.json and tokenizer_config.json into DIR */
        if (!ckpt || dir) return cli_usage_error("export-hf --tokenizer MODEL DIR: one DIR");
        dir = ckpt;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cli_usage_error("export-hf: cannot create %s: %s", dir, strerror(errno));
        tks_tok *t = NULL;
        if (tks_tok_load_opts(model, &to, &t)) return cli_lib_error();
        cli_note_once(tks_tok_cache_note(t));
        int spm = tks_tok_spm(t) != NULL;
        rc = spm ? tks_hf_tokenizer_write(model, dir) : tks_hf_bpe_write(t, model, dir);
        tks_tok_free(t);
        if (rc) return cli_lib_error();
        printf("wrote %s/tokenizer.json and tokenizer_config.json for %s", dir, model);
        if (spm) printf(" (copy the model as %s/tokenizer.model for use_fast=False)", dir);
        printf("\n");
        return 0;
    }
    if (!ckpt || !dir) return cli_usage_error("export-hf: give a CHECKPOINT (or run directory) and the output DIR");
    int no_tok = 0;
    if (tks_export_hf(ckpt, dir, &no_tok)) return cli_lib_error();
    if (no_tok) {
        printf("exported %s to %s: model.safetensors, config.json (load with transformers' "
               "AutoModelForCausalLM)\n", ckpt, dir);
        fprintf(stderr, "%s: note: no tokenizer exported: the model was trained on a dataset imported "
                "with --vocab-size and no tokenizer; add the tokenizer the ids came from "
                "(`tokshard export-hf --tokenizer MODEL %s`)\n", cli_prog, dir);
        return 0;
    }
    char slow[PATH_MAX];
    int has_model = snprintf(slow, sizeof slow, "%s/tokenizer.model", dir) < (int)sizeof slow && access(slow, F_OK) == 0;
    printf("exported %s to %s: model.safetensors, config.json, %stokenizer.json, "
           "tokenizer_config.json (load with transformers' AutoModelForCausalLM and AutoTokenizer)\n", ckpt, dir,
           has_model ? "tokenizer.model, " : "");
    return 0;
}
