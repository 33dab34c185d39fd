/* interop_cli.c - `tokshard import` and `tokshard export`, and the flags
 * `tokshard audit --format` shares with them. Thin: parses flags, calls
 * interop/, prints. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/interop.h"
#include "tokenizer/tokenizer.h"
#include "trainer/trainer.h"
#include "cli.h"

int cli_import(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_export_hf(int argc, char **argv);
int cli_foreign_flag(cli_args *a, tks_foreign_opts *fo, int *consumed);

static int parse_id(const char *flag, const char *v, uint32_t *out) {
    char *e;
    if (!v || *v < '0' || *v > '9') return cli_usage_error("%s needs a token id", flag);
    unsigned long long x = strtoull(v, &e, 10);
    if (*e || x >= TKS_NO_ID) return cli_usage_error("%s %s: expected a token id below 2^32 - 1", flag, v);
    *out = (uint32_t)x;
    return 0;
}

/* --format, --dtype, --eot, --eod. Sets *consumed; returns 0 or an exit code. */
int cli_foreign_flag(cli_args *a, tks_foreign_opts *fo, int *consumed) {
    *consumed = 1;
    const char *v;
    if (!strcmp(a->name, "--format")) {
        v = cli_value(a);
        if (!v || tks_foreign_format_parse(v, &fo->format))
            return cli_usage_error("--format %s: expected megatron, llmc, raw or datatrove", v ? v : "");
    } else if (!strcmp(a->name, "--dtype")) {
        v = cli_value(a);
        if (v && !strcmp(v, "u16")) fo->token_bytes = 2;
        else if (v && !strcmp(v, "u32")) fo->token_bytes = 4;
        else return cli_usage_error("--dtype %s: expected u16 or u32", v ? v : "");
    } else if (!strcmp(a->name, "--eot")) {
        return parse_id("--eot", cli_value(a), &fo->eot_id);
    } else if (!strcmp(a->name, "--eod")) {
        return parse_id("--eod", cli_value(a), &fo->eod_id);
    } else {
        *consumed = 0;
    }
    return 0;
}

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) {
    (void)sig;
    if (g_stop) _exit(EXIT_INTERRUPTED);
    g_stop = 1;
}

int cli_import(int argc, char **argv) {
    tks_import_opts o = {0};
    tks_foreign_opts_default(&o.foreign);
    uint64_t v64;
    cli_args a = {argc, 0, argv, NULL, {0}};
    const char *pos, *v;
    int quiet = 0;
    while (cli_next(&a, &pos)) {
        if (pos) {
            if (o.src) return cli_usage_error("import: one SOURCE only (got %s and %s)", o.src, pos);
            o.src = pos;
            continue;
        }
        int used, r = cli_foreign_flag(&a, &o.foreign, &used);
        if (r) return r;
        if (used) continue;
        if (!strcmp(a.name, "--output") || !strcmp(a.name, "-o")) {
            if (!(o.out_dir = cli_value(&a))) return cli_usage_error("--output needs a directory");
        } else if (!strcmp(a.name, "--tokenizer")) {
            if (!(o.tokenizer_path = cli_value(&a))) return cli_usage_error("--tokenizer needs a .model file");
        } else if (!strcmp(a.name, "--vocab-size")) {
            if (!(v = cli_value(&a)) || cli_parse_size(v, &v64) || v64 == 0 || v64 >= TKS_NO_ID)
                return cli_usage_error("--vocab-size needs a number in 1..2^32-2");
            o.vocab_size = (uint32_t)v64;
        } else if (!strcmp(a.name, "--shard-tokens")) {
            if (!(v = cli_value(&a)) || cli_parse_size(v, &o.shard_tokens) || !o.shard_tokens)
                return cli_usage_error("--shard-tokens needs a number such as 16M");
        } else if (!strcmp(a.name, "--chunk-bytes")) {
            if (!(v = cli_value(&a)) || cli_parse_size(v, &v64) || v64 < TKS_MIN_CHUNK_BYTES ||
                v64 > TKS_MAX_CHUNK_BYTES || v64 % 4)
                return cli_usage_error("--chunk-bytes: expected a multiple of 4 in [64, 1G]");
            o.chunk_bytes = (uint32_t)v64;
        } else if (!strcmp(a.name, "--resume")) {
            o.resume = 1;
        } else if (!strcmp(a.name, "--quiet") || !strcmp(a.name, "-q")) {
            quiet = 1;
        } else {
            return cli_usage_error("import: unknown option %s", a.name);
        }
    }
    if (!o.foreign.format) return cli_usage_error("import: --format megatron|llmc|raw|datatrove is required");
    if (!o.src) return cli_usage_error("import: give the SOURCE (Megatron PREFIX, llm.c/raw file or datatrove .ds)");
    if (!o.out_dir) return cli_usage_error("import: --output DIR is required");
    if (!o.tokenizer_path && !o.vocab_size)
        return cli_usage_error("import: --tokenizer MODEL (the tokenizer the ids come from) or --vocab-size N is required");
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
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

int cli_export(int argc, char **argv) {
    tks_export_opts o = {0};
    o.eot_id = TKS_NO_ID;
    const char *dir = NULL, *prefix = NULL, *pos, *v;
    cli_args a = {argc, 0, argv, NULL, {0}};
    while (cli_next(&a, &pos)) {
        if (pos) {
            if (!dir) dir = pos;
            else if (!prefix) prefix = pos;
            else return cli_usage_error("export: expected DIR PREFIX (got a third argument %s)", pos);
        } else if (!strcmp(a.name, "--format")) {
            v = cli_value(&a);
            if (!v || tks_foreign_format_parse(v, &o.format) ||
                (o.format != TKS_FOREIGN_MEGATRON && o.format != TKS_FOREIGN_LLMC))
                return cli_usage_error("--format %s: export writes megatron or llmc", v ? v : "");
        } else if (!strcmp(a.name, "--copy")) {
            o.copy = 1;
        } else if (!strcmp(a.name, "--eot")) {
            int r = parse_id("--eot", cli_value(&a), &o.eot_id);
            if (r) return r;
        } else {
            return cli_usage_error("export: unknown option %s", a.name);
        }
    }
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
    const char *ckpt = NULL, *dir = NULL, *pos, *model = NULL;
    cli_args a = {argc, 0, argv, NULL, {0}};
    while (cli_next(&a, &pos)) {
        if (!pos && !strcmp(a.name, "--tokenizer")) {
            if (!(model = cli_value(&a))) return cli_usage_error("--tokenizer needs a .model file");
            continue;
        }
        if (!pos) return cli_usage_error("export-hf: unknown option %s", a.name);
        if (!ckpt) ckpt = pos;
        else if (!dir) dir = pos;
        else return cli_usage_error("export-hf: expected CHECKPOINT DIR (got a third argument %s)", pos);
    }
    if (model) { /* the tokenizer alone: tokenizer.json and tokenizer_config.json into DIR */
        if (!ckpt || dir) return cli_usage_error("export-hf --tokenizer MODEL DIR: one DIR");
        dir = ckpt;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cli_usage_error("export-hf: cannot create %s: %s", dir, strerror(errno));
        if (tks_hf_tokenizer_write(model, dir)) return cli_lib_error();
        printf("wrote %s/tokenizer.json and tokenizer_config.json for %s (copy the model as "
               "%s/tokenizer.model for use_fast=False)\n", dir, model, dir);
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
    printf("exported %s to %s: model.safetensors, config.json, tokenizer.model, tokenizer.json, "
           "tokenizer_config.json (load with transformers' AutoModelForCausalLM and AutoTokenizer)\n", ckpt, dir);
    return 0;
}
