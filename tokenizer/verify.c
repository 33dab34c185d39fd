/* verify.c - an encoder against its reference, document by document
 * (tokshard verify-tokenizer): the fast encoder against sentencepiece, the
 * byte-level BPE encoder against its plain reference; the ids must be
 * identical. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tks_spm_compare_free(tks_spm_compare *c) {
    if (!c) return;
    tks_ids_free(&c->ref);
    tks_ids_free(&c->fast);
}

typedef struct pair {
    const tks_spm *spm;
    const tks_bpe *bpe;
} pair;

static int encode_ref(const pair *p, const char *text, size_t len, tks_ids *out) {
    return p->spm ? tks_spm_encode_ref(p->spm, text, len, out) : tks_bpe_encode_ref(p->bpe, text, len, out);
}

static int encode_fast(const pair *p, const char *text, size_t len, tks_ids *out) {
    return p->spm ? tks_spm_encode_fast(p->spm, text, len, out) : tks_bpe_encode(p->bpe, text, len, out);
}

static int compare(const pair *p, tks_sentence_fn next, void *ctx, tks_spm_compare *out) {
    memset(out, 0, sizeof *out);
    for (;;) {
        const char *text;
        size_t len;
        int got = next(ctx, &text, &len);
        if (got <= 0) return got;
        double t0 = now_s();
        int rc = encode_ref(p, text, len, &out->ref);
        double t1 = now_s();
        if (!rc) rc = encode_fast(p, text, len, &out->fast);
        out->seconds_ref += t1 - t0;
        out->seconds_fast += now_s() - t1;
        if (rc) return rc;
        out->docs++;
        out->bytes += len;
        const tks_ids *r = &out->ref, *f = &out->fast;
        size_t i = 0;
        while (i < r->n && i < f->n && r->ids[i] == f->ids[i]) i++;
        if (i < r->n || i < f->n) {
            out->differ = 1;
            out->first_diff = i;
            return 0;
        }
    }
}

int tks_spm_compare_docs(const tks_spm *s, tks_sentence_fn next, void *ctx, tks_spm_compare *out) {
    pair p = {s, NULL};
    return compare(&p, next, ctx, out);
}

int tks_tok_compare_docs(const tks_tok *t, tks_sentence_fn next, void *ctx, tks_spm_compare *out) {
    pair p = {tks_tok_spm(t), tks_tok_bpe(t)};
    return compare(&p, next, ctx, out);
}
