/* cmd_build.c - build: raw text in, a checked dataset out (tokshard build). */
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

static volatile sig_atomic_t g_stop = 0;

static void progress_line(const tks_build_progress *p, void *ctx) {
    (void)ctx;
    char in[32], tot[32];
    cli_human_bytes((double)p->bytes_in, in, sizeof in);
    cli_human_bytes((double)p->total_bytes_in, tot, sizeof tot);
    double mbs = p->seconds > 0 ? p->bytes_text / 1e6 / p->seconds : 0;
    char eta[32] = "";
    if (p->total_bytes_in && p->bytes_in && p->bytes_in <= p->total_bytes_in) {
        double rem = p->seconds * ((double)p->total_bytes_in / (double)p->bytes_in - 1);
        snprintf(eta, sizeof eta, "  ETA %.0fs", rem);
    }
    fprintf(stderr, "\r%s / %s read, %llu docs, %llu tokens in %llu shards, %.1f MB/s text%s   ", in,
            tot, (unsigned long long)p->docs_read, (unsigned long long)p->tokens_written,
            (unsigned long long)p->shards, mbs, eta);
    fflush(stderr);
}

/* Under mpirun, rank 0's progress line: every 2 s, from the ranks' reports. */
static void ranks_progress_line(const tks_build_world_progress *p, void *ctx) {
    (void)ctx;
    double el = p->seconds, rate = el > 0 ? (double)p->text_bytes / el : 0;
    fprintf(stderr, "units %llu/%llu done (%llu kept), %.1f MB/s", (unsigned long long)p->units,
            (unsigned long long)p->n_units, (unsigned long long)p->kept, rate / 1e6);
    if (p->bytes && p->bytes < p->total_bytes)
        fprintf(stderr, ", ETA %.0fs", el * (double)(p->total_bytes - p->bytes) / (double)p->bytes);
    for (size_t r = 0; r < p->n_ranks && p->n_ranks <= 8; r++) {
        fprintf(stderr, " | rank %zu: %llu units %.1f MB/s", r, (unsigned long long)p->ranks[r].units,
                el > 0 ? (double)p->ranks[r].text_bytes / el / 1e6 : 0.0);
        if (p->ranks[r].unit) fprintf(stderr, " (unit %llu)", (unsigned long long)p->ranks[r].unit - 1);
    }
    if (p->n_ranks > 8)
        fprintf(stderr, " | %zu ranks, %llu building, %llu-%llu units each", p->n_ranks,
                (unsigned long long)p->building, (unsigned long long)p->units_min,
                (unsigned long long)p->units_max);
    fprintf(stderr, "\n");
}

static void print_build_summary(const tks_build_stats *s, const char *out) {
    const tks_input_stats *i = &s->input;
    printf("built %s\n", out);
    if (s->published_complete)
        printf("  resumed       the interrupted run had finished the dataset in %s.partial (its manifest "
               "written): published as it was\n", out);
    printf("  inputs        %llu files, %llu entries, %.1f MB read (%.1f MB of text)\n",
           (unsigned long long)i->files, (unsigned long long)i->entries, i->bytes_in / 1e6,
           i->bytes_text / 1e6);
    printf("  documents     %llu written", (unsigned long long)s->docs_written);
    if (s->resumed_shards) printf(" (%llu shards kept from the interrupted run)", (unsigned long long)s->resumed_shards);
    printf("\n  tokens        %llu (%.1f per document), ids in [%u, %u], vocab %u\n",
           (unsigned long long)s->tokens_written,
           s->docs_written ? (double)s->tokens_written / (double)s->docs_written : 0.0,
           s->min_token_id, s->max_token_id, s->vocab_size);
    printf("  shards        %llu\n", (unsigned long long)s->shards);
    printf("  units         %llu", (unsigned long long)s->units);
    if (s->units_kept) printf(" (%llu kept from the interrupted run)", (unsigned long long)s->units_kept);
    printf("\n  coordination  plan %.3f s, shards placed %.3f s, manifest %.3f s", s->plan_seconds,
           s->place_seconds, s->manifest_seconds);
    if (s->handouts)
        printf(", %llu hand-outs of %.0f us (at most %.0f us)", (unsigned long long)s->handouts,
               s->handout_seconds_mean * 1e6, s->handout_seconds_max * 1e6);
    printf("\n");
    printf("  skipped       %llu empty, %llu empty after tokenizing, %llu invalid UTF-8, %llu too "
           "long, %llu bad records, %llu binary\n",
           (unsigned long long)i->empty_skipped, (unsigned long long)s->empty_after_tokenize,
           (unsigned long long)i->utf8_skipped, (unsigned long long)i->long_skipped,
           (unsigned long long)i->bad_records_skipped, (unsigned long long)i->binary_skipped);
    if (i->links_outside)
        printf("  links         %llu files read through a symbolic link that leaves the named paths "
               "(--no-follow-links leaves links out)\n", (unsigned long long)i->links_outside);
    if (i->links_skipped)
        printf("  links         %llu symbolic links left out (--no-follow-links)\n",
               (unsigned long long)i->links_skipped);
    if (i->bad_inputs_skipped)
        printf("  bad inputs    %llu files left out (--on-bad-input skip):\n%s",
               (unsigned long long)i->bad_inputs_skipped, s->skipped_inputs);
    printf("  invalid UTF-8 %llu documents, %llu sequences replaced by U+FFFD\n",
           (unsigned long long)i->utf8_invalid_docs, (unsigned long long)i->utf8_replaced);
    if (!strcmp(s->encoder, "fast"))
        printf("  encoder       fast (exact sentencepiece ids; word cache hits %.1f%% of %llu words, "
               "%.1f%% of bytes)\n",
               s->encoder_stats.words ? 100.0 * s->encoder_stats.word_hits / s->encoder_stats.words : 0.0,
               (unsigned long long)s->encoder_stats.words,
               s->encoder_stats.bytes ? 100.0 * s->encoder_stats.hit_bytes / s->encoder_stats.bytes : 0.0);
    else if (!strcmp(s->encoder, "sentencepiece"))
        printf("  encoder       sentencepiece (%s)\n", s->encoder_why);
    else
        printf("  encoder       byte-level BPE (tokshard's encoder: the reference's ids; word cache hits "
               "%.1f%% of %llu pieces, %.1f%% of bytes)\n",
               s->encoder_stats.words ? 100.0 * s->encoder_stats.word_hits / s->encoder_stats.words : 0.0,
               (unsigned long long)s->encoder_stats.words,
               s->encoder_stats.bytes ? 100.0 * s->encoder_stats.hit_bytes / s->encoder_stats.bytes : 0.0);
    if (s->encoder_stats.cut_docs)
        printf("  long docs     %llu documents cut into %llu parts encoded on every thread (cuts where the "
               "tokenizer proves the ids unchanged)\n",
               (unsigned long long)s->encoder_stats.cut_docs, (unsigned long long)s->encoder_stats.cut_parts);
    if (s->encoder_stats.special_in_text)
        printf("  special text  %llu special tokens' text (say <|endoftext|>) found in documents and encoded "
               "as text (--allow-special-in-text turns them into the special ids)\n",
               (unsigned long long)s->encoder_stats.special_in_text);
    if (s->unassigned)
        printf("  unicode       %llu code points in %llu document%s are unassigned in Unicode %s (the "
               "regex engine's tables): tokenizers and tiktoken on a newer Unicode may split the text "
               "around them otherwise (README, byte-level BPE; the manifest records the counts)\n",
               (unsigned long long)s->unassigned, (unsigned long long)s->unassigned_docs,
               s->unassigned_docs == 1 ? "" : "s", tks_bpe_unicode_version());
    if (s->encoder_stats.special_matched)
        printf("  special text  %llu special tokens' text in documents encoded as the special ids "
               "(--allow-special-in-text)\n", (unsigned long long)s->encoder_stats.special_matched);
    if (s->tokenizer_cache[0]) printf("  note          %s\n", s->tokenizer_cache);
    if (i->json_as_text)
        printf("  note          %llu *.json inputs read as text (--format auto); if they are "
               "JSON Lines, build again with --format jsonl\n",
               (unsigned long long)i->json_as_text);
    printf("  elapsed       %.2f s, %.2f MB/s of text, %.0f tokens/s\n", s->seconds,
           s->seconds > 0 ? i->bytes_text / 1e6 / s->seconds : 0.0,
           s->seconds > 0 ? s->tokens_written / s->seconds : 0.0);
}

static int set_build_threads(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    if (x == 0 || x > 1024) return cli_usage_error("--threads %llu: expected 1..1024", (unsigned long long)x);
    *(int *)f->ptr = (int)x;
    return 0;
}

/* --shard-tokens, --unit-bytes: at least 1. */
static int set_nonzero(const cli_flag *f, const char *name, const char *v) {
    int rc = size_value(name, v, f->ptr);
    if (!rc && !*(uint64_t *)f->ptr) rc = cli_usage_error("%s must be at least 1", f->name);
    return rc;
}

static int set_chunk_bytes(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    if (x < TKS_MIN_CHUNK_BYTES || x > TKS_MAX_CHUNK_BYTES || x % 4)
        return cli_usage_error("--chunk-bytes %llu: expected a multiple of 4 in [64, 1G]", (unsigned long long)x);
    *(uint32_t *)f->ptr = (uint32_t)x;
    return 0;
}

static int set_encoder(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    if (!strcmp(v, "auto")) *(int *)f->ptr = 0;
    else if (!strcmp(v, "sentencepiece")) *(int *)f->ptr = 1;
    else return cli_usage_error("--encoder %s: expected auto or sentencepiece", v);
    return 0;
}

int cli_build(int argc, char **argv) {
    tks_build_opts o;
    tks_build_opts_default(&o);
    int quiet = 0;
    const cli_flag input[] = INPUT_FLAGS(&o.input);
    const cli_flag flags[] = {
        {.name = "--tokenizer", .type = CLI_STR, .ptr = &o.tokenizer_path},
        {.name = "--output", .alias = "-o", .type = CLI_STR, .ptr = &o.out_dir},
        {.name = "--threads", .ptr = &o.threads, .set = set_build_threads},
        {.name = "--shard-tokens", .ptr = &o.shard_tokens, .set = set_nonzero},
        {.name = "--chunk-bytes", .ptr = &o.chunk_bytes, .set = set_chunk_bytes},
        {.name = "--batch-bytes", .type = CLI_SIZE, .ptr = &o.batch_bytes},
        {.name = "--unit-bytes", .ptr = &o.unit_bytes, .set = set_nonzero},
        {.name = "--append-eos", .type = CLI_BOOL, .ptr = &o.append_eos},
        {.name = "--prepend-bos", .type = CLI_BOOL, .ptr = &o.prepend_bos},
        {.name = "--resume", .type = CLI_BOOL, .ptr = &o.resume},
        {.name = "--encoder", .ptr = &o.encoder_sentencepiece, .set = set_encoder},
        {.name = "--pattern", .type = CLI_STR, .ptr = &o.pattern},
        {.name = "--special-tokens", .type = CLI_STR, .ptr = &o.special_tokens},
        {.name = "--allow-special-in-text", .type = CLI_BOOL, .ptr = &o.allow_special_in_text},
        {.name = "--quiet", .alias = "-q", .type = CLI_BOOL, .ptr = &quiet},
        {0},
    };
    /* INPUT arguments are collected in place at the front of argv */
    cli_list in = {(const char **)argv, 0};
    cli_command cmd = {.shared = input, .flags = flags, .unknown = UNKNOWN("build"), .positional = cli_take_all, .ctx = &in};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (!o.tokenizer_path) return cli_usage_error("build: --tokenizer MODEL is required");
    if (!o.out_dir) return cli_usage_error("build: --output DIR is required");
    if (!in.n) return cli_usage_error("build: give at least one INPUT file or directory");
    o.inputs = in.items;
    o.n_inputs = in.n;
    if (!quiet && isatty(STDERR_FILENO)) o.progress = progress_line;
    o.stop = &g_stop;
    cli_stop_on_signals(&g_stop);
    tks_build_stats st;
    int rank = 0;
    int rc = dist_build(&o, quiet ? NULL : ranks_progress_line, &st, &rank);
    /* a line feed ends the single process's progress line; under mpirun rank 0
     * writes one whatever --quiet says (its progress lines end in their own) */
    if (dist_launched_many() ? rank == 0 : o.progress != NULL) fprintf(stderr, "\n");
    if (rc) return dist_finish(cli_lib_error());
    if (!quiet && rank == 0) print_build_summary(&st, o.out_dir);
    else if (rank == 0) cli_note_once(st.tokenizer_cache); /* --quiet: said on stderr all the same */
    if (rank == 0 && st.unassigned) { /* whatever --quiet says: the ids may not be a reference's */
        fprintf(stderr, "%s: ", cli_prog);
        cli_unassigned_note(stderr, "warning", tks_bpe_unicode_version(), st.unassigned, st.unassigned_docs);
    }
    return dist_finish(0);
}
