/* cmd_verify_tokenizer.c - verify-tokenizer: our encoders against their reference
 * libraries on the inputs (tokshard verify-tokenizer). */
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
    int rc = tks_tok_load_opts(path, tks_tiktoken_sniff(path) ? to : &none, t);
    if (!rc) cli_note_once(tks_tok_cache_note(*t));
    return rc;
}

int cli_verify_tokenizer(int argc, char **argv) {
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
