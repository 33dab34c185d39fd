/* cmd_train_tokenizer.c - train-tokenizer: a sentencepiece model, or a
 * byte-level BPE tokenizer (--model-type byte-bpe: tks_bpe_train), trained
 * on the inputs (tokshard train-tokenizer). */
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
    if (strcmp(v, "bpe") && strcmp(v, "unigram") && strcmp(v, "word") && strcmp(v, "char") && strcmp(v, "byte-bpe"))
        return cli_usage_error("--model-type %s: expected bpe, unigram, word, char or byte-bpe", v);
    *(const char **)f->ptr = v;
    return 0;
}

static int set_spm_vocab(const cli_flag *f, const char *name, const char *v) {
    uint64_t x;
    int rc = size_value(name, v, &x);
    if (rc) return rc;
    /* sentencepiece takes 8..1000000 (checked once the model type is known) */
    if (x < 1 || x > (1u << 31)) return cli_usage_error("--vocab-size %llu: expected 1..2^31", (unsigned long long)x);
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

static volatile sig_atomic_t g_stop = 0;

/* --special-tokens A,B,...: appended to the list (the flag may repeat). */
typedef struct name_list {
    const char **v;
    size_t n, cap;
    char *owned[64];
    size_t n_owned;
} name_list;

static int set_specials(const cli_flag *f, const char *name, const char *v) {
    name_list *l = f->ptr;
    if (!v) return cli_usage_error("%s needs a value", name);
    if (l->n_owned == sizeof l->owned / sizeof *l->owned) return cli_usage_error("%s given too often", name);
    char *copy = strdup(v);
    if (!copy) return cli_usage_error("out of memory");
    l->owned[l->n_owned++] = copy;
    for (char *tok = copy, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = 0;
        if (!*tok) return cli_usage_error("%s %s: an empty token name", name, v);
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 8;
            const char **nv = realloc(l->v, cap * sizeof *nv);
            if (!nv) return cli_usage_error("out of memory");
            l->v = nv;
            l->cap = cap;
        }
        l->v[l->n++] = tok;
    }
    return 0;
}

static void bpe_progress(const tks_bpe_train_progress *p, void *ctx) {
    (void)ctx;
    char in[32], tot[32];
    if (p->phase == 0) {
        cli_human_bytes((double)p->bytes_in, in, sizeof in);
        cli_human_bytes((double)p->total_bytes_in, tot, sizeof tot);
        double mbs = p->seconds > 0 ? p->bytes_text / 1e6 / p->seconds : 0;
        fprintf(stderr, "\rcounting: %s / %s read, %llu docs, %llu pieces, unit %llu/%llu, %llu runs, %.1f MB/s   ",
                in, tot, (unsigned long long)p->docs, (unsigned long long)p->pieces,
                (unsigned long long)(p->units < p->n_units ? p->units + 1 : p->units),
                (unsigned long long)p->n_units, (unsigned long long)p->runs, mbs);
    } else if (p->phase == 1) {
        fprintf(stderr, "\rmerging %llu runs of counted words ...%40s", (unsigned long long)p->runs, "");
    } else {
        fprintf(stderr, "\rmerges: %llu of at most %llu, %.0f s%30s", (unsigned long long)p->merges,
                (unsigned long long)p->target, p->seconds, "");
    }
    fflush(stderr);
}

static void bpe_merge_phase(uint64_t words, uint64_t bytes, uint64_t need, uint64_t limit, void *ctx) {
    (void)ctx;
    fprintf(stderr, "%smerge phase: %llu distinct words of 2 bytes or more (%.1f MB), about %.1f MB of the "
                    "--memory limit %.1f MB\n",
            isatty(STDERR_FILENO) ? "\n" : "", (unsigned long long)words, bytes / 1e6, need / 1e6, limit / 1e6);
}

/* --model-type byte-bpe */
static int train_byte_bpe(tks_bpe_train_opts *o, int quiet) {
    o->stop = &g_stop;
    cli_stop_on_signals(&g_stop);
    if (!quiet && isatty(STDERR_FILENO)) o->progress = bpe_progress;
    if (!quiet) o->merge_phase = bpe_merge_phase;
    tks_bpe_train_stats st;
    int rc = tks_bpe_train(o, &st);
    if (o->progress) fprintf(stderr, "\n");
    if (rc) return cli_lib_error();
    if (quiet) return 0;
    char text[32];
    cli_human_bytes((double)st.input.bytes_text, text, sizeof text);
    printf("trained %s: byte-level BPE, vocab %u, %llu merges, pattern %s\n", o->out_dir, st.vocab_size,
           (unsigned long long)st.merges, o->pattern);
    printf("  corpus   %llu files, %llu documents, %s of text, %llu pieces, %llu distinct words of 2+ bytes\n",
           (unsigned long long)st.input.files, (unsigned long long)st.input.docs, text,
           (unsigned long long)st.pieces, (unsigned long long)st.words);
    printf("  counting %llu units (%llu kept from an interrupted run), %llu runs\n", (unsigned long long)st.units,
           (unsigned long long)st.units_kept, (unsigned long long)st.runs);
    if (st.pruned_words)
        printf("  pruned   %llu words seen fewer than %llu times left out (recorded in training.json)\n",
               (unsigned long long)st.pruned_words, (unsigned long long)o->min_word_count);
    printf("  memory   merge phase %.1f MB (estimated %.1f MB, --memory %.1f MB)\n", st.merge_peak / 1e6,
           st.merge_memory / 1e6, st.memory / 1e6);
    printf("  time     %.1f s: counting %.1f s, merging runs %.1f s, merges %.1f s\n", st.seconds, st.count_seconds,
           st.runs_seconds, st.merge_seconds);
    return 0;
}

/* The flags one model kind takes and the other does not. */
static int check_kind(int byte_bpe, const char *const *set, size_t n_set) {
    static const char *const spm_only[] = {"--byte-fallback", "--character-coverage", "--input-sentence-size"};
    static const char *const bpe_only[] = {"--pattern", "--min-frequency", "--special-tokens", "--memory",
                                           "--resume", "--tiktoken", "--ignore-merges", "--bos-token",
                                           "--eos-token", "--pad-token", "--unit-bytes", "--min-word-count",
                                           "--quiet"};
    const char *const *bad = byte_bpe ? spm_only : bpe_only;
    size_t nb = byte_bpe ? sizeof spm_only / sizeof *spm_only : sizeof bpe_only / sizeof *bpe_only;
    for (size_t i = 0; i < n_set; i++)
        for (size_t k = 0; k < nb; k++)
            if (set[i] && !strcmp(set[i], bad[k]))
                return cli_usage_error("train-tokenizer: %s is for %s models only", bad[k],
                                       byte_bpe ? "sentencepiece" : "--model-type byte-bpe");
    return 0;
}

int cli_train_tokenizer(int argc, char **argv) {
    tks_spm_train_opts t = {.model_type = "bpe", .vocab_size = 0, .input_sentence_size = 2000000,
                            .seed = 1234};
    tks_bpe_train_opts b;
    tks_bpe_train_opts_default(&b);
    b.pattern = "gpt2";
    tks_input_opts io;
    tks_input_opts_default(&io);
    io.split = TKS_SPLIT_FILE;
    name_list specials = {0};
    int quiet = 0;
    const cli_flag input[] = INPUT_FLAGS(&io);
    const cli_flag flags[] = {
        {.name = "--output", .alias = "-o", .type = CLI_STR, .ptr = &t.model_prefix},
        {.name = "--model-type", .ptr = &t.model_type, .set = set_model_type},
        {.name = "--vocab-size", .ptr = &t.vocab_size, .set = set_spm_vocab},
        {.name = "--byte-fallback", .type = CLI_BOOL, .ptr = &t.byte_fallback},
        {.name = "--character-coverage", .ptr = &t.character_coverage, .set = set_coverage},
        {.name = "--input-sentence-size", .type = CLI_SIZE, .ptr = &t.input_sentence_size},
        {.name = "--threads", .ptr = &t.threads, .set = set_int},
        {.name = "--pattern", .type = CLI_STR, .ptr = &b.pattern},
        {.name = "--min-frequency", .type = CLI_SIZE, .ptr = &b.min_frequency},
        {.name = "--special-tokens", .ptr = &specials, .set = set_specials},
        {.name = "--memory", .type = CLI_SIZE, .ptr = &b.memory},
        {.name = "--unit-bytes", .type = CLI_SIZE, .ptr = &b.unit_bytes},
        {.name = "--min-word-count", .type = CLI_SIZE, .ptr = &b.min_word_count},
        {.name = "--resume", .type = CLI_BOOL, .ptr = &b.resume},
        {.name = "--tiktoken", .type = CLI_BOOL, .ptr = &b.tiktoken},
        {.name = "--ignore-merges", .type = CLI_BOOL, .ptr = &b.ignore_merges},
        {.name = "--bos-token", .type = CLI_STR, .ptr = &b.bos_token},
        {.name = "--eos-token", .type = CLI_STR, .ptr = &b.eos_token},
        {.name = "--pad-token", .type = CLI_STR, .ptr = &b.pad_token},
        {.name = "--quiet", .alias = "-q", .type = CLI_BOOL, .ptr = &quiet},
        {0},
    };
    /* INPUT arguments are collected in place at the front of argv; the
     * flags given are noted in `seen` to check them against the kind */
    const char *seen[64];
    size_t n_seen = 0;
    for (int i = 0; i < argc && n_seen < 64; i++)
        if (!strncmp(argv[i], "--", 2)) {
            static char names[64][40];
            snprintf(names[n_seen], sizeof names[n_seen], "%.*s", (int)strcspn(argv[i], "="), argv[i]);
            seen[n_seen] = names[n_seen];
            n_seen++;
        }
    cli_list in = {(const char **)argv, 0};
    cli_command cmd = {.shared = input, .flags = flags, .unknown = UNKNOWN("train-tokenizer"),
                       .positional = cli_take_all, .ctx = &in};
    int prc = cli_parse(&cmd, argc, argv);
    if (prc != CLI_PARSED) return prc;
    int byte_bpe = !strcmp(t.model_type, "byte-bpe");
    if ((prc = check_kind(byte_bpe, seen, n_seen))) return prc;
    if (!t.model_prefix)
        return cli_usage_error(byte_bpe ? "train-tokenizer: --output DIR is required (writes DIR/tokenizer.json)"
                                        : "train-tokenizer: --output PREFIX is required (writes PREFIX.model)");
    if (!in.n) return cli_usage_error("train-tokenizer: give at least one INPUT");
    if (byte_bpe) {
        b.out_dir = t.model_prefix;
        b.inputs = in.items;
        b.n_inputs = in.n;
        b.input = io;
        b.threads = t.threads;
        if (t.vocab_size) b.vocab_size = t.vocab_size;
        b.specials = specials.v;
        b.n_specials = specials.n;
        int rc = train_byte_bpe(&b, quiet);
        for (size_t i = 0; i < specials.n_owned; i++) free(specials.owned[i]);
        free(specials.v);
        return rc;
    }
    if (!t.vocab_size) t.vocab_size = 8000;
    if (t.vocab_size < 8 || t.vocab_size > 1000000)
        return cli_usage_error("--vocab-size %u: expected 8..1000000 for sentencepiece", t.vocab_size);
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
