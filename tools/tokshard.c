/* tokshard - the data tool: build, train-tokenizer, audit, inspect, cat.
 * Thin: parses flags, calls the libraries, prints, maps errors to exit codes
 * (0 ok, 1 problems found by audit, 2 usage or I/O error, 130 interrupted). */
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

/* A size flag's value into *x; 0 or an exit code after the error. */
static int size_value(const char *name, const char *v, uint64_t *x) {
    cli_flag t = {.type = CLI_SIZE, .ptr = x};
    return cli_set_by_type(&t, name, v);
}

/* Unknown-option errors name the command: "build: unknown option --x". */
#define UNKNOWN(cmd) cmd ": unknown option %s"

static int parse_policy(const char *flag, const char *v, tks_policy *p, int allow_replace) {
    if (allow_replace && strcmp(v, "replace") == 0) *p = TKS_POLICY_REPLACE;
    else if (strcmp(v, "skip") == 0) *p = TKS_POLICY_SKIP;
    else if (strcmp(v, "fail") == 0) *p = TKS_POLICY_FAIL;
    else
        return cli_usage_error("%s %s: expected %s", flag, v, allow_replace ? "replace, skip or fail" : "skip or fail");
    return 0;
}

/* --invalid-utf8 and the --on-* policies: f->meta lists the values as the
 * missing-value error says them ("replace, skip or fail", "fail or skip"). */
static int set_policy(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v) return cli_usage_error("%s needs %s", f->name, f->meta);
    return parse_policy(f->name, v, f->ptr, strstr(f->meta, "replace") != NULL);
}

/* --doc-split, --format: f->ctx lists the values (NULL-ended), stored as
 * their position in the list; f->meta says them ("file, line or blank-line"). */
static int set_choice(const cli_flag *f, const char *name, const char *v) {
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
static const char *const SPLIT_NAMES[] = {"file", "line", "blank-line", NULL}; /* tks_doc_split */
static const char *const FORMAT_NAMES[] = {"auto", "text", "jsonl", NULL};    /* tks_input_format */

static int set_jsonl_key(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v || !*v) return cli_usage_error("--jsonl-key needs a key name");
    *(const char **)f->ptr = v;
    return 0;
}

static int set_max_doc_bytes(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    uint64_t *x = f->ptr;
    if (!v || cli_parse_size(v, x) || *x == 0)
        return cli_usage_error("--max-doc-bytes %s: expected a size such as 1M", v ? v : "");
    return 0;
}

/* Input flags shared by build, train-tokenizer and verify-tokenizer: a table
 * over *io. */
#define INPUT_FLAGS(io)                                                                     \
    {                                                                                       \
        {.name = "--doc-split", .ptr = &(io)->split, .set = set_choice,                     \
         .meta = "file, line or blank-line", .ctx = (void *)SPLIT_NAMES},                   \
        {.name = "--format", .ptr = &(io)->format, .set = set_choice,                       \
         .meta = "auto, text or jsonl", .ctx = (void *)FORMAT_NAMES},                       \
        {.name = "--jsonl-key", .ptr = &(io)->jsonl_key, .set = set_jsonl_key},             \
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

static const char *INPUT_HELP =
    "  --doc-split file|line|blank-line  one document per file, per line, or per paragraph [file]\n"
    "  --format auto|text|jsonl     auto: *.jsonl (also compressed) is JSONL, the rest text [auto]\n"
    "  --jsonl-key KEY              JSONL field holding the text [text]\n"
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

/* ------------------------------------------------------------------------- */
/* build                                                                     */

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) {
    (void)sig;
    if (g_stop) _exit(EXIT_INTERRUPTED); /* second Ctrl-C: leave now (resume still works) */
    g_stop = 1;
}

static void human_bytes(double b, char *out, size_t n) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void progress_line(const tks_build_progress *p, void *ctx) {
    (void)ctx;
    char in[32], tot[32];
    human_bytes((double)p->bytes_in, in, sizeof in);
    human_bytes((double)p->total_bytes_in, tot, sizeof tot);
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

static void print_build_summary(const tks_build_stats *s, const char *out) {
    const tks_input_stats *i = &s->input;
    printf("built %s\n", out);
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
    if (s->encoder_stats.special_in_text)
        printf("  special text  %llu special tokens' text (say <|endoftext|>) found in documents and encoded "
               "as text (--allow-special-in-text turns them into the special ids)\n",
               (unsigned long long)s->encoder_stats.special_in_text);
    if (s->encoder_stats.special_matched)
        printf("  special text  %llu special tokens' text in documents encoded as the special ids "
               "(--allow-special-in-text)\n", (unsigned long long)s->encoder_stats.special_matched);
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

static int cmd_build(int argc, char **argv) {
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
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    tks_build_stats st;
    int rank = 0;
    int rc = dist_build(&o, !quiet, &st, &rank);
    if (o.progress) fprintf(stderr, "\n");
    if (rc) return dist_finish(cli_lib_error());
    if (!quiet && rank == 0) print_build_summary(&st, o.out_dir);
    return dist_finish(0);
}

/* ------------------------------------------------------------------------- */
/* train-tokenizer                                                           */

typedef struct sentence_src {
    tks_input *in;
    tks_doc doc;
    size_t pos;       /* next byte of doc to split */
    int have_doc;
    uint64_t lines;
} sentence_src;

/* Yields the non-empty lines of every document. */
static int next_sentence(void *ctx, const char **text, size_t *len) {
    sentence_src *s = ctx;
    for (;;) {
        if (!s->have_doc) {
            int r = tks_input_next(s->in, &s->doc);
            if (r <= 0) return r;
            s->have_doc = 1;
            s->pos = 0;
        }
        if (s->pos >= s->doc.len) {
            s->have_doc = 0;
            continue;
        }
        const char *p = s->doc.text + s->pos;
        size_t rest = s->doc.len - s->pos;
        const char *nl = memchr(p, '\n', rest);
        size_t n = nl ? (size_t)(nl - p) : rest;
        s->pos += n + 1;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k == n) continue;
        *text = p;
        *len = n && p[n - 1] == '\r' ? n - 1 : n;
        s->lines++;
        return 1;
    }
}

static int set_model_type(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    if (strcmp(v, "bpe") && strcmp(v, "unigram") && strcmp(v, "word") && strcmp(v, "char"))
        return cli_usage_error("--model-type %s: expected bpe, unigram, word or char", v);
    *(const char **)f->ptr = v;
    return 0;
}

static int set_spm_vocab(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    if (x < 8 || x > 1000000) return cli_usage_error("--vocab-size %llu: expected 8..1000000", (unsigned long long)x);
    *(uint32_t *)f->ptr = (uint32_t)x;
    return 0;
}

static int set_coverage(const cli_flag *f, const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    double *c = f->ptr;
    char *e;
    *c = strtod(v, &e);
    if (*e || *c <= 0 || *c > 1)
        return cli_usage_error("--character-coverage %s: expected a number in (0, 1]", v);
    return 0;
}

/* --threads of train-tokenizer and audit: any size, as an int. */
static int set_int(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (!rc) *(int *)f->ptr = (int)x;
    return rc;
}

static int cmd_train_tokenizer(int argc, char **argv) {
    tks_spm_train_opts t = {.model_type = "bpe", .vocab_size = 8000, .input_sentence_size = 2000000,
                            .seed = 1234};
    tks_input_opts io;
    tks_input_opts_default(&io);
    io.split = TKS_SPLIT_FILE;
    const cli_flag input[] = INPUT_FLAGS(&io);
    const cli_flag flags[] = {
        {.name = "--output", .alias = "-o", .type = CLI_STR, .ptr = &t.model_prefix},
        {.name = "--model-type", .ptr = &t.model_type, .set = set_model_type},
        {.name = "--vocab-size", .ptr = &t.vocab_size, .set = set_spm_vocab},
        {.name = "--byte-fallback", .type = CLI_BOOL, .ptr = &t.byte_fallback},
        {.name = "--character-coverage", .ptr = &t.character_coverage, .set = set_coverage},
        {.name = "--input-sentence-size", .type = CLI_SIZE, .ptr = &t.input_sentence_size},
        {.name = "--threads", .ptr = &t.threads, .set = set_int},
        {0},
    };
    /* INPUT arguments are collected in place at the front of argv */
    cli_list in = {(const char **)argv, 0};
    cli_command cmd = {.shared = input, .flags = flags, .unknown = UNKNOWN("train-tokenizer"),
                       .positional = cli_take_all, .ctx = &in};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (!t.model_prefix) return cli_usage_error("train-tokenizer: --output PREFIX is required (writes PREFIX.model)");
    if (!in.n) return cli_usage_error("train-tokenizer: give at least one INPUT");
    if (!t.threads) t.threads = 1; /* the model depends on (and records) it: same default everywhere */
    sentence_src src = {0};
    int rc = tks_input_open(in.items, in.n, &io, &src.in);
    double t0 = omp_get_wtime();
    if (!rc) rc = tks_spm_train(&t, next_sentence, &src);
    if (rc == TKS_ERR_INPUT && src.lines == 0) { /* what was read, and what was left out */
        const tks_input_stats *is = tks_input_get_stats(src.in);
        tks_fail(rc, NULL, TKS_NONE, TKS_NONE,
                 "the inputs hold no non-empty line to train on: %llu files, %llu documents read; "
                 "left out: %llu empty, %llu invalid UTF-8 (--invalid-utf8), %llu too long, %llu "
                 "binary. Check the paths, --doc-split and those policies",
                 (unsigned long long)is->files, (unsigned long long)is->docs,
                 (unsigned long long)is->empty_skipped, (unsigned long long)is->utf8_skipped,
                 (unsigned long long)is->long_skipped, (unsigned long long)is->binary_skipped);
    }
    tks_input_free(src.in);
    if (rc) return cli_lib_error();
    printf("trained %s.model (%s, vocab %u) from %llu lines in %.1f s\n", t.model_prefix,
           t.model_type, t.vocab_size, (unsigned long long)src.lines, omp_get_wtime() - t0);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* verify-tokenizer                                                          */

/* Prints ids[lo..hi) of tokenizer t as "id(piece) ..." */
static void print_ids(const tks_tok *t, const tks_ids *v, size_t lo, size_t hi) {
    char piece[128];
    for (size_t i = lo; i < hi && i < v->n; i++) {
        const char *p = tks_tok_piece(t, v->ids[i], piece, sizeof piece);
        printf(" %u(%s)", v->ids[i], p ? p : "?");
    }
    if (hi < v->n) printf(" ...");
    printf("\n");
}

/* The documents of the TEXT inputs, for tks_spm_compare_docs; `doc` is the
 * last one read. */
typedef struct doc_src {
    tks_input *in;
    tks_doc doc;
} doc_src;

static int next_doc(void *ctx, const char **text, size_t *len) {
    doc_src *d = ctx;
    int got = tks_input_next(d->in, &d->doc);
    if (got > 0) {
        *text = d->doc.text;
        *len = d->doc.len;
    }
    return got;
}

static void print_difference(const tks_tok *t, const tks_spm_compare *c, const tks_doc *doc) {
    size_t i = c->first_diff, lo = i > 5 ? i - 5 : 0;
    const char *ref = tks_tok_spm(t) ? "sentencepiece" : "reference";
    printf("DIFFERENT ids for %s line %llu (document %llu, %zu bytes): first difference at "
           "id %zu of %zu (%s) / %zu (fast)\n",
           doc->source, (unsigned long long)doc->line, (unsigned long long)doc->ordinal, doc->len, i,
           c->ref.n, ref, c->fast.n);
    printf("  %-14s", ref);
    print_ids(t, &c->ref, lo, i + 6);
    printf("  fast:         ");
    print_ids(t, &c->fast, lo, i + 6);
    if (tks_tok_spm(t))
        printf("tokshard build would be wrong on this model: please report it with the model and "
               "this line; meanwhile build with --encoder sentencepiece\n");
    else
        printf("tokshard build would be wrong on this tokenizer: please report it with the tokenizer "
               "and this line\n");
}

static void print_agreement(const char *model, const tks_tok *t, const tks_spm_compare *c) {
    tks_encoder_stats es;
    tks_tok_encoder_stats(t, &es);
    const tks_spm *spm = tks_tok_spm(t);
    const char *ref = spm ? "sentencepiece" : "the reference BPE (PCRE2 pieces, plain merge loop)";
    double mb = c->bytes / 1e6;
    printf("%s (%s): identical ids from the fast encoder and %s on %llu documents (%.1f MB)\n", model,
           tks_tok_model_type(t), ref, (unsigned long long)c->docs, mb);
    printf("  %s %.2f MB/s, fast %.2f MB/s (1 thread); word cache hits %.1f%% of "
           "words, %.1f%% of bytes", spm ? "sentencepiece" : "reference",
           c->seconds_ref > 0 ? mb / c->seconds_ref : 0.0, c->seconds_fast > 0 ? mb / c->seconds_fast : 0.0,
           es.words ? 100.0 * es.word_hits / es.words : 0.0,
           es.bytes ? 100.0 * es.hit_bytes / es.bytes : 0.0);
    if (spm && !strcmp(tks_spm_model_type(spm), "unigram"))
        printf(" (%.2f%% of words found but decoded again: float rounding at the running "
               "score could change their path)",
               es.words ? 100.0 * es.bound_misses / es.words : 0.0);
    printf("\n");
}

/* One side of a comparison: a tokenizer of ours, or the Python reference
 * (peer) of one; `seconds` sums its encoding time. */
typedef struct side {
    const char *label;
    const tks_tok *t; /* prints the pieces of both sides' ids */
    tks_peer *peer;   /* NULL: t encodes */
    double seconds;
} side;

static int side_encode(side *s, const char *text, size_t len, tks_ids *out) {
    double t0 = omp_get_wtime();
    int rc = s->peer ? tks_peer_encode(s->peer, text, len, out) : tks_tok_encode(s->t, text, len, out);
    s->seconds += omp_get_wtime() - t0;
    return rc;
}

typedef struct compared {
    uint64_t docs, differ, bytes;
    uint64_t not_utf8; /* documents the peer did not take */
} compared;

/* Encodes every document of the TEXT inputs with a and b, printing the
 * first 5 that differ (source, line, document, the ids around the first
 * difference). Returns 0, or a tks error code. */
static int compare_sides(side *a, side *b, const char **inputs, size_t n_in, const tks_input_opts *io,
                         compared *r) {
    doc_src src = {0};
    tks_ids ia = {0}, ib = {0};
    int rc = tks_input_open(inputs, n_in, io, &src.in);
    const char *t;
    size_t len;
    int w = (int)(strlen(a->label) > strlen(b->label) ? strlen(a->label) : strlen(b->label)) + 1;
    while (!rc && (rc = next_doc(&src, &t, &len)) > 0) {
        rc = side_encode(a, t, len, &ia);
        if (!rc) rc = side_encode(b, t, len, &ib);
        if (rc == 1) { /* not UTF-8: the peer cannot say */
            r->not_utf8++;
            rc = 0;
            continue;
        }
        if (rc) break;
        r->docs++, r->bytes += len;
        if (ia.n == ib.n && (!ia.n || !memcmp(ia.ids, ib.ids, ia.n * sizeof *ia.ids))) continue;
        if (r->differ++ >= 5) continue;
        size_t i = 0;
        while (i < ia.n && i < ib.n && ia.ids[i] == ib.ids[i]) i++;
        size_t lo = i > 3 ? i - 3 : 0;
        printf("%s line %llu (document %llu, %zu bytes): first difference at id %zu of %zu (%s) / %zu (%s)\n",
               src.doc.source, (unsigned long long)src.doc.line, (unsigned long long)src.doc.ordinal, len, i, ia.n,
               a->label, ib.n, b->label);
        printf("  %s:%*s", a->label, (int)(w - strlen(a->label)), "");
        print_ids(a->t, &ia, lo, i + 4);
        printf("  %s:%*s", b->label, (int)(w - strlen(b->label)), "");
        print_ids(b->t, &ib, lo, i + 4);
    }
    tks_input_free(src.in);
    tks_ids_free(&ia);
    tks_ids_free(&ib);
    return rc < 0 ? rc : 0;
}

/* verify-tokenizer A B TEXT...: the documents on which two tokenizers give
 * other ids (a sentencepiece model, a tokenizer.json, or one of each) */
static int compare_two(const char *na, tks_tok *a, const char *nb, tks_tok *b, const char **inputs, size_t n_in,
                       const tks_input_opts *io) {
    side sa = {.label = "A", .t = a}, sb = {.label = "B", .t = b};
    compared r = {0};
    if (compare_sides(&sa, &sb, inputs, n_in, io, &r)) return cli_lib_error();
    if (!r.differ)
        printf("A %s (%s) and B %s (%s): identical ids on all %llu documents (%.1f MB)\n", na,
               tks_tok_model_type(a), nb, tks_tok_model_type(b), (unsigned long long)r.docs, r.bytes / 1e6);
    else
        printf("A %s (%s) and B %s (%s): DIFFERENT ids on %llu of %llu documents (%.4f%%)%s: datasets "
               "built with the two do not mean the same by an id; do not mix them\n",
               na, tks_tok_model_type(a), nb, tks_tok_model_type(b), (unsigned long long)r.differ,
               (unsigned long long)r.docs, r.docs ? 100.0 * (double)r.differ / (double)r.docs : 0.0,
               r.differ > 5 ? "; the first 5 above" : "");
    return r.differ ? EXIT_PROBLEMS : 0;
}

/* verify-tokenizer MODEL TEXT... for a byte-level BPE tokenizer, against its
 * Python reference (tokenizers or tiktoken, through `python`) */
static int compare_peer(const char *model, tks_tok *t, tks_peer *peer, const char *python, const char **inputs,
                        size_t n_in, const tks_input_opts *io) {
    side fast = {.label = "fast", .t = t}, ref = {.label = tks_peer_name(peer), .t = t, .peer = peer};
    compared r = {0};
    if (compare_sides(&fast, &ref, inputs, n_in, io, &r)) return cli_lib_error();
    double mb = r.bytes / 1e6;
    if (r.differ) {
        printf("%s (%s): DIFFERENT ids from the fast encoder and %s (%s) on %llu of %llu documents%s\n"
               "tokshard build would be wrong on this tokenizer: please report it with the tokenizer and "
               "these lines\n",
               model, tks_tok_model_type(t), tks_peer_name(peer), python, (unsigned long long)r.differ,
               (unsigned long long)r.docs, r.differ > 5 ? " (the first 5 above)" : "");
        return EXIT_PROBLEMS;
    }
    printf("%s (%s): identical ids from the fast encoder and %s (%s) on %llu documents (%.1f MB)\n", model,
           tks_tok_model_type(t), tks_peer_name(peer), python, (unsigned long long)r.docs, mb);
    printf("  %s %.2f MB/s (one thread, with the pipe), fast %.2f MB/s (1 thread)\n", tks_peer_name(peer),
           ref.seconds > 0 ? mb / ref.seconds : 0.0, fast.seconds > 0 ? mb / fast.seconds : 0.0);
    if (r.not_utf8)
        printf("  %llu documents not compared: not UTF-8, which %s cannot take (see --invalid-utf8)\n",
               (unsigned long long)r.not_utf8, tks_peer_name(peer));
    return 0;
}

/* A tokenizer of verify-tokenizer: --pattern and --special-tokens go to a
 * tiktoken ranks file only. */
static int load_for_verify(const char *path, const tks_tok_opts *to, tks_tok **t) {
    tks_tok_opts none = {0};
    return tks_tok_load_opts(path, tks_tiktoken_sniff(path) ? to : &none, t);
}

static int cmd_verify_tokenizer(int argc, char **argv) {
    tks_input_opts io;
    tks_input_opts_default(&io);
    io.split = TKS_SPLIT_LINE;
    int no_cache = 0;
    tks_tok_opts to = {0};
    const char *reference = "auto", *python = NULL;
    const cli_flag input[] = INPUT_FLAGS(&io);
    const cli_flag flags[] = {{.name = "--no-cache", .type = CLI_BOOL, .ptr = &no_cache},
                              {.name = "--pattern", .type = CLI_STR, .ptr = &to.pattern},
                              {.name = "--special-tokens", .type = CLI_STR, .ptr = &to.special_tokens},
                              {.name = "--reference", .type = CLI_STR, .ptr = &reference},
                              {.name = "--python", .type = CLI_STR, .ptr = &python},
                              {0}};
    /* MODEL and TEXT arguments are collected in place at the front of argv */
    cli_list in = {(const char **)argv, 0};
    cli_command cmd = {.shared = input, .flags = flags, .unknown = UNKNOWN("verify-tokenizer"),
                       .positional = cli_take_all, .ctx = &in};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (in.n < 2) return cli_usage_error("verify-tokenizer: give MODEL and at least one TEXT input");
    if (strcmp(reference, "auto") && strcmp(reference, "peer") && strcmp(reference, "own"))
        return cli_usage_error("verify-tokenizer: --reference is auto, peer or own, not \"%s\"", reference);
    const char *model = in.items[0];
    tks_tok *ta = NULL, *tb = NULL;
    if (load_for_verify(model, &to, &ta)) return cli_lib_error();
    /* A B TEXT...: B is a second tokenizer when it is named as one (*.model,
     * *.json, *.tiktoken) and loads as one; else it is text (never read whole
     * as a model) */
    const char *b = in.n >= 3 ? in.items[1] : NULL, *ext = b ? strrchr(b, '.') : NULL;
    if (ext && (!strcmp(ext, ".model") || !strcmp(ext, ".json") || !strcmp(ext, ".tiktoken")) &&
        load_for_verify(b, &to, &tb) == 0) {
        int rc = compare_two(model, ta, b, tb, in.items + 2, in.n - 2, &io);
        tks_tok_free(ta);
        tks_tok_free(tb);
        return rc;
    }
    tks_clear_error();
    tks_spm *spm = tks_tok_spm(ta);
    const char *why = spm ? tks_spm_fast_unavailable(spm) : NULL;
    if (why) {
        printf("%s (%s): no fast encoder (%s); tokshard build encodes it with sentencepiece, so "
               "there is nothing to verify\n",
               model, tks_spm_model_type(spm), why);
        tks_tok_free(ta);
        return 0;
    }
    if (no_cache && spm) tks_spm_set_word_cache(spm, 0);
    if (no_cache && !spm) tks_bpe_set_word_cache(tks_tok_bpe(ta), 0);
    if (!spm && strcmp(reference, "own")) {
        /* byte-level BPE: its Python reference where one is installed */
        const char *py = python ? python : getenv("TOKSHARD_PYTHON");
        if (!py || !*py) py = "python3";
        tks_peer *peer = NULL;
        if (tks_peer_start(py, ta, model, &peer) == 0) {
            int rc = compare_peer(model, ta, peer, py, in.items + 1, in.n - 1, &io);
            tks_peer_stop(peer);
            tks_tok_free(ta);
            return rc;
        }
        if (python || !strcmp(reference, "peer")) { /* asked for: its failure is the answer */
            tks_tok_free(ta);
            return cli_lib_error();
        }
        printf("no Python reference (%s)\n  comparing with tokshard's own reference instead\n",
               tks_last_error()->message);
        tks_clear_error();
    }
    doc_src src = {0};
    tks_spm_compare cmp = {0};
    int rc = tks_input_open(in.items + 1, in.n - 1, &io, &src.in);
    if (!rc) rc = tks_tok_compare_docs(ta, next_doc, &src, &cmp);
    if (!rc && cmp.differ) print_difference(ta, &cmp, &src.doc);
    else if (!rc) print_agreement(model, ta, &cmp);
    tks_input_free(src.in);
    tks_spm_compare_free(&cmp);
    tks_tok_free(ta);
    if (rc) return cli_lib_error();
    return cmp.differ ? EXIT_PROBLEMS : 0;
}

/* ------------------------------------------------------------------------- */
/* audit                                                                     */


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

static int cmd_audit(int argc, char **argv) {
    tks_audit_opts ao = {0};
    tks_foreign_opts fo;
    tks_foreign_opts_default(&fo);
    tks_tok_opts to = {0};
    int as_json = 0;
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
    /* --tokenizer: its fingerprint (a tiktoken file's covers its pattern) and
     * vocabulary; a file that does not load as a tokenizer is compared by
     * its bytes and reported by the audit */
    tks_tok *tk = NULL;
    if (ao.tokenizer_path && tks_tok_load_opts(ao.tokenizer_path, &to, &tk) == 0)
        ao.tokenizer_fp = tks_tok_fingerprint(tk);
    else if (ao.tokenizer_path && (to.pattern || to.special_tokens || fo.format))
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

/* ------------------------------------------------------------------------- */
/* inspect and cat: a dataset dir or a single shard                          */

typedef struct view {
    tks_dataset *ds;
    tks_shard *one;
    tks_tok *tk;
} view;

/* want_tokenizer: 0 no, 1 yes (an error without one), 2 when the dataset has one */
static int open_view(const char *path, view *v, int want_tokenizer) {
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
static int parse_view_args(const char *name, const cli_flag *flags, int argc, char **argv,
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

static void close_view(view *v) {
    tks_dataset_close(v->ds);
    tks_shard_close(v->one);
    tks_tok_free(v->tk);
}

static size_t view_n(const view *v) { return v->ds ? tks_dataset_n_shards(v->ds) : 1; }
static const tks_shard *view_shard(const view *v, size_t i) {
    return v->ds ? tks_dataset_shard(v->ds, i) : v->one;
}

static void inspect_json(const char *path, const view *v, const tks_stats *st, const char *fp) {
    const tks_shard_header *h0 = tks_shard_hdr(view_shard(v, 0));
    const tks_tokenizer_info *ti = v->ds ? tks_dataset_tokenizer(v->ds) : NULL;
    json_t *shards = json_array();
    for (size_t s = 0; s < view_n(v); s++) {
        const tks_shard_header *h = tks_shard_hdr(view_shard(v, s));
        json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "file",
                                                tks_shard_path(view_shard(v, s)), "index",
                                                (json_int_t)h->shard_index, "bytes", (json_int_t)h->file_size,
                                                "n_docs", (json_int_t)h->n_docs, "n_tokens",
                                                (json_int_t)h->n_tokens, "min_token_id",
                                                (json_int_t)h->min_token_id, "max_token_id",
                                                (json_int_t)h->max_token_id, "chunks", (json_int_t)h->n_chunks));
    }
    json_t *hj = json_array();
    for (int b = 0; b < 64; b++)
        if (st->doc_hist[b])
            json_array_append_new(hj, json_pack("{s:I, s:I, s:I}", "min_len", (json_int_t)(UINT64_C(1) << b),
                                                "max_len", (json_int_t)((UINT64_C(2) << b) - 1), "docs",
                                                (json_int_t)st->doc_hist[b]));
    json_t *tj = json_array();
    char piece[256];
    for (size_t k = 0; k < st->n_top; k++)
        json_array_append_new(tj, json_pack("{s:I, s:I, s:s?}", "id", (json_int_t)st->top[k], "count",
                                            (json_int_t)st->counts[st->top[k]], "piece",
                                            v->tk ? tks_tok_piece(v->tk, st->top[k], piece, sizeof piece)
                                                  : NULL));
    json_t *j = json_pack("{s:s, s:i, s:I, s:i, s:s, s:s?, s:I, s:I, s:I, s:o, s:o, s:o}", "path", path,
                          "format_version", (int)h0->version, "vocab_size", (json_int_t)st->vocab_size,
                          "token_bytes", (int)h0->token_bytes, "tokenizer_fingerprint", fp,
                          "model_type", ti ? ti->model_type : NULL, "n_shards", (json_int_t)view_n(v),
                          "n_docs", (json_int_t)st->n_docs, "n_tokens", (json_int_t)st->n_tokens,
                          "shards", shards, "doc_length_histogram", hj, "top_tokens", tj);
    cli_json_print(j);
}

static void inspect_text(const char *path, const view *v, const tks_stats *st, const char *fp) {
    const tks_shard_header *h0 = tks_shard_hdr(view_shard(v, 0));
    const tks_tokenizer_info *ti = v->ds ? tks_dataset_tokenizer(v->ds) : NULL;
    printf("%s: tokshard format v%u, %zu shard(s)\n", path, h0->version, view_n(v));
    printf("  tokenizer     %s%s%s, fingerprint %s\n", ti ? ti->file : "(shard only)",
           ti ? ", " : "", ti ? ti->model_type : "", fp);
    char sp[3][16];
    const uint32_t ids3[3] = {h0->bos_id, h0->eos_id, h0->pad_id};
    for (int k = 0; k < 3; k++)
        if (ids3[k] == TKS_NO_ID) snprintf(sp[k], sizeof sp[k], "none");
        else snprintf(sp[k], sizeof sp[k], "%u", ids3[k]);
    printf("  vocab_size    %u (uint%u ids), bos %s, eos %s, pad %s\n", st->vocab_size,
           8 * h0->token_bytes, sp[0], sp[1], sp[2]);
    printf("  documents     %llu\n  tokens        %llu (%.1f per document, min %llu, max %llu)\n",
           (unsigned long long)st->n_docs, (unsigned long long)st->n_tokens,
           st->n_docs ? (double)st->n_tokens / (double)st->n_docs : 0.0,
           (unsigned long long)st->min_doc_tokens, (unsigned long long)st->max_doc_tokens);
    printf("  chunk bytes   %u\n", h0->chunk_bytes);
    printf("  shards:\n");
    for (size_t s = 0; s < view_n(v); s++) {
        const tks_shard_header *h = tks_shard_hdr(view_shard(v, s));
        printf("    %-28s %10llu docs %12llu tokens  ids [%u, %u]  %llu bytes\n",
               tks_shard_path(view_shard(v, s)), (unsigned long long)h->n_docs,
               (unsigned long long)h->n_tokens, h->min_token_id, h->max_token_id,
               (unsigned long long)h->file_size);
    }
    printf("  document length (tokens):\n");
    uint64_t hmax = 1;
    for (int b = 0; b < 64; b++) if (st->doc_hist[b] > hmax) hmax = st->doc_hist[b];
    for (int b = 0; b < 64; b++)
        if (st->doc_hist[b]) {
            char range[48];
            snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)(UINT64_C(1) << b),
                     (unsigned long long)((UINT64_C(2) << b) - 1));
            int bar = (int)(40.0 * (double)st->doc_hist[b] / (double)hmax + 0.5);
            printf("    %-16s %10llu  %.*s\n", range, (unsigned long long)st->doc_hist[b], bar,
                   "########################################");
        }
    printf("  most frequent tokens:\n");
    char piece[256];
    for (size_t k = 0; k < st->n_top; k++) {
        uint64_t c = st->counts[st->top[k]];
        printf("    %8u %12llu  %5.2f%%  %s\n", st->top[k], (unsigned long long)c,
               st->n_tokens ? 100.0 * (double)c / (double)st->n_tokens : 0.0,
               v->tk ? tks_tok_piece(v->tk, st->top[k], piece, sizeof piece) : "");
    }
}

static int cmd_inspect(int argc, char **argv) {
    int as_json = 0;
    uint64_t top = 20;
    const cli_flag flags[] = {
        {.name = "--json", .type = CLI_BOOL, .ptr = &as_json},
        {.name = "--top", .type = CLI_SIZE, .ptr = &top},
        {0},
    };
    const char *path;
    int rc = parse_view_args("inspect", flags, argc, argv, &path);
    if (rc != CLI_PARSED) return rc;
    view v;
    rc = open_view(path, &v, 2);
    if (rc) return rc;
    const tks_shard **shards = malloc(view_n(&v) * sizeof *shards);
    tks_stats *st = NULL;
    for (size_t s = 0; shards && s < view_n(&v); s++) shards[s] = view_shard(&v, s);
    if (!shards) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    else rc = tks_stats_compute(shards, view_n(&v), top > SIZE_MAX ? SIZE_MAX : (size_t)top, &st);
    free(shards);
    if (rc) {
        close_view(&v);
        return cli_lib_error();
    }
    char fp[33];
    tks_hex(tks_shard_hdr(view_shard(&v, 0))->tokenizer_fp, 16, fp);
    if (as_json) inspect_json(path, &v, st, fp);
    else inspect_text(path, &v, st, fp);
    tks_stats_free(st);
    close_view(&v);
    return 0;
}

/* --text: decode (the default; undoes --ids). */
static int set_text(const cli_flag *f, const char *name, const char *v) {
    (void)name, (void)v;
    *(int *)f->ptr = 0;
    return 0;
}

/* One document on one line of a terminal: newline as \n, backslash as \\,
 * every other control character visible as \xNN (C0 and DEL) or \u00NN
 * (C1, U+0080-U+009F): a document's ESC, OSC, BEL or CR never reaches the
 * terminal as such (--raw writes the bytes). */
static void put_escaped(const char *text, size_t tl) {
    for (size_t i = 0; i < tl; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\t') putchar('\t');
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else if (c == 0xc2 && i + 1 < tl && (unsigned char)text[i + 1] >= 0x80 && (unsigned char)text[i + 1] <= 0x9f)
            printf("\\u%04x", (unsigned char)text[++i]);
        else putchar(c);
    }
}

static int cmd_cat(int argc, char **argv) {
    int mode_ids = 0, raw = 0;
    uint64_t only = TKS_NONE, limit = TKS_NONE;
    const cli_flag flags[] = {
        {.name = "--ids", .type = CLI_BOOL, .ptr = &mode_ids},
        {.name = "--text", .type = CLI_BOOL, .ptr = &mode_ids, .set = set_text},
        {.name = "--raw", .type = CLI_BOOL, .ptr = &raw},
        {.name = "--doc", .type = CLI_SIZE, .ptr = &only},
        {.name = "--limit", .type = CLI_SIZE, .ptr = &limit},
        {0},
    };
    const char *path;
    int rc = parse_view_args("cat", flags, argc, argv, &path);
    if (rc != CLI_PARSED) return rc;
    view v;
    rc = open_view(path, &v, !mode_ids);
    if (rc) return rc;
    if (!mode_ids && !v.tk) {
        close_view(&v);
        return cli_usage_error("cat: decoding text needs a dataset DIR (with its tokenizer); use --ids for a lone shard");
    }
    uint64_t g = 0, printed = 0;
    uint32_t *buf = NULL;
    size_t cap = 0;
    int found = only == TKS_NONE;
    for (size_t s = 0; s < view_n(&v) && printed < limit; s++) {
        const tks_shard *sh = view_shard(&v, s);
        const tks_shard_header *h = tks_shard_hdr(sh);
        const uint64_t *ix = tks_shard_doc_index(sh);
        if (only != TKS_NONE && only >= g + h->n_docs) {
            g += h->n_docs;
            continue;
        }
        for (uint64_t d = 0; d < h->n_docs && printed < limit; d++, g++) {
            if (only != TKS_NONE && g != only) continue;
            found = 1;
            uint64_t len = ix[d + 1] - ix[d];
            if (len > cap) {
                free(buf);
                cap = len;
                buf = malloc(cap * sizeof *buf);
            }
            if (tks_shard_read(sh, ix[d], len, 0, buf)) {
                free(buf);
                close_view(&v);
                return cli_lib_error();
            }
            if (mode_ids) {
                for (uint64_t i = 0; i < len; i++) printf(i ? " %u" : "%u", buf[i]);
                putchar('\n');
            } else {
                char *text;
                size_t tl;
                if (tks_tok_decode(v.tk, buf, len, &text, &tl)) {
                    free(buf);
                    close_view(&v);
                    return cli_lib_error();
                }
                if (raw) fwrite(text, 1, tl, stdout);
                else put_escaped(text, tl);
                putchar('\n');
                free(text);
            }
            printed++;
            if (only != TKS_NONE) break;
        }
        if (only != TKS_NONE && found) break;
    }
    free(buf);
    uint64_t total = 0; /* every shard's, whatever --limit let the loop see */
    for (size_t s = 0; s < view_n(&v); s++) total += tks_shard_hdr(view_shard(&v, s))->n_docs;
    close_view(&v);
    if (only != TKS_NONE && only >= total) {
        fprintf(stderr, "%s: error: --doc %llu: the dataset has %llu documents (0 to %llu)\n", cli_prog,
                (unsigned long long)only, (unsigned long long)total,
                (unsigned long long)(total ? total - 1 : 0));
        return EXIT_USAGE;
    }
    return fflush(stdout) == 0 ? 0 : EXIT_USAGE;
}

/* ------------------------------------------------------------------------- */

static void help(FILE *f) {
    fprintf(f,
            "tokshard " TKS_VERSION_STRING " - raw text to checksummed, vocab-validated token shards\n\n"
            "usage:\n"
            "  tokshard train-tokenizer --output PREFIX [options] INPUT...\n"
            "      --model-type bpe|unigram|word|char [bpe]   --vocab-size N [8000]   --byte-fallback\n"
            "      --character-coverage F [0.9995]  --input-sentence-size N [2000000]\n"
            "      --threads N [1: models depend on the thread count, so the default is fixed]\n"
            "  tokshard build --tokenizer TOKENIZER --output DIR [options] INPUT...\n"
            "      --threads N [all cores]    --shard-tokens N [16M]   --chunk-bytes N [1M]\n"
            "      --append-eos   --prepend-bos   --resume   --quiet\n"
            "      --unit-bytes N [1G: work units of at most N bytes of input; part of the output,\n"
            "        never of the launch: mpirun -np R tokshard build ... spreads units over R ranks]\n"
            "      --encoder auto|sentencepiece [auto: tokshard's fast encoder when it gives exactly\n"
            "        sentencepiece's ids for the model, else sentencepiece; the summary says which]\n"
            "      --allow-special-in-text   special tokens' text (<|endoftext|>) becomes their ids, as\n"
            "        Hugging Face tokenizers does by default [off: encoded as text, and counted]\n"
            "  TOKENIZER: a sentencepiece MODEL, a byte-level BPE tokenizer.json, a tiktoken ranks\n"
            "      file with --pattern gpt2|cl100k|o200k|llama3|llama3.1|qwen2|REGEX|tokenizer.json and\n"
            "      --special-tokens TEXT=ID,... [the named encoding's], or a dataset's tiktoken.json\n"
            "  tokshard verify-tokenizer MODEL TEXT... [input options; --doc-split line by default]\n"
            "      compares tokshard's fast encoder with the reference document by document:\n"
            "      sentencepiece for a MODEL; for byte-level BPE, Hugging Face tokenizers (a\n"
            "      tokenizer.json) or tiktoken (a ranks file) run by --python PATH [$TOKSHARD_PYTHON,\n"
            "      else python3], or tokshard's own (PCRE2 pieces, plain merge loop) when that\n"
            "      Python cannot import it; --reference peer|own insists on one [auto]\n"
            "      --no-cache: without the word cache (times the encoder's miss path)\n"
            "  tokshard verify-tokenizer A B TEXT...   the documents on which two tokenizers\n"
            "      (any two TOKENIZERs; --pattern and --special-tokens go to the tiktoken files) give\n"
            "      other ids\n"
            "  tokshard audit DIR|SHARD [--json] [--model-vocab N] [--tokenizer TOKENIZER] [--threads N]\n"
            "  tokshard audit --format megatron|llmc|raw|datatrove SOURCE (--model-vocab N | --tokenizer TOKENIZER)\n"
            "      [--eod ID] [--eot ID] [--dtype u16|u32] [--json]   another project's dataset, in place;\n"
            "      with --tokenizer, a special token's id inside a document is reported\n"
            "  tokshard import --format megatron|llmc|raw|datatrove SOURCE --output DIR\n"
            "      (--tokenizer TOKENIZER | --vocab-size N) [--eot ID] [--dtype u16|u32] [--shard-tokens N] [--resume]\n"
            "  tokshard export --format megatron|llmc DIR PREFIX [--copy] [--eot ID]\n"
            "  tokshard export-hf CHECKPOINT DIR   a checkpoint as a Hugging Face model + fast tokenizer\n"
            "  tokshard export-hf --tokenizer TOKENIZER DIR   tokenizer.json + tokenizer_config.json only\n"
            "  tokshard inspect DIR|SHARD [--json] [--top K]\n"
            "  tokshard cat DIR|SHARD [--doc N] [--limit N] [--ids|--text] [--raw]\n"
            "  tokshard sample-plan DIR --seq-len L --global-batch B [--dp D] [--tp T] [--steps S0:S1]\n"
            "      [--seed S] [--micro-batch M] [--val-tokens N] [--json]   which samples each rank reads\n"
            "  tokshard sample-plan --run RUN|CHECKPOINT [--steps S0:S1] [--dp D] [--tp T] [--json]\n"
            "      the same with a run's own settings, from its newest (or the given) checkpoint\n"
            "  tokshard sample-plan --dataset NAME=DIR:W ... [--mix-at STEP:NAME=W,...] --seq-len L ...\n"
            "      a mixture's plan (or --mix FILE.json): each sample's source and index in it\n\n"
            "input options (train-tokenizer and build):\n%s\n"
            "INPUT: files or directories (walked recursively, in name order): plain text, .gz .xz\n"
            ".zst .bz2 .dz, and .tar .tar.gz .tgz .tar.xz .tar.zst .tar.bz2 .zip archives.\n"
            "Sizes accept K, M, G suffixes (powers of 1024).\n\n"
            "exit codes: 0 ok, 1 audit found problems, 2 usage or I/O error, 130 interrupted\n"
            "(an interrupted build continues with the same command plus --resume).\n",
            INPUT_HELP);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        help(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub_argv = argv + 2;
    /* `tokshard build --help`: every command's usage is on the one help page */
    for (int i = 0; i < sub_argc && strcmp(sub_argv[i], "--"); i++)
        if (!strcmp(sub_argv[i], "--help") || !strcmp(sub_argv[i], "-h")) {
            help(stdout);
            return 0;
        }
    if (!strcmp(cmd, "build")) return cmd_build(sub_argc, sub_argv);
    if (!strcmp(cmd, "train-tokenizer")) return cmd_train_tokenizer(sub_argc, sub_argv);
    if (!strcmp(cmd, "audit")) return cmd_audit(sub_argc, sub_argv);
    if (!strcmp(cmd, "verify-tokenizer")) return cmd_verify_tokenizer(sub_argc, sub_argv);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(sub_argc, sub_argv);
    if (!strcmp(cmd, "cat")) return cmd_cat(sub_argc, sub_argv);
    if (!strcmp(cmd, "sample-plan")) return cli_sample_plan(sub_argc, sub_argv);
    if (!strcmp(cmd, "import")) return cli_import(sub_argc, sub_argv);
    if (!strcmp(cmd, "export")) return cli_export(sub_argc, sub_argv);
    if (!strcmp(cmd, "export-hf")) return cli_export_hf(sub_argc, sub_argv);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        help(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        puts("tokshard " TKS_VERSION_STRING);
        return 0;
    }
    return cli_usage_error("unknown command '%s'", cmd);
}
