/* generate.c - sampling text from a checkpoint (tks_generate, trainer.h):
 * temperature and top-p (nucleus) sampling over the model's logits, a KV
 * cache that slides when the context is full. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/trainer.h"
#include "common/tks_bits.h"

/* ---- generation ------------------------------------------------------------------ */

typedef struct prob_id {
    float p;
    uint32_t id;
} prob_id;
static int by_prob_desc(const void *a, const void *b) {
    float x = ((const prob_id *)a)->p, y = ((const prob_id *)b)->p;
    return x < y ? 1 : x > y ? -1 : 0;
}


/* Samples from logits with temperature and nucleus (top-p) filtering. */
static uint32_t sample(float *logits, uint32_t V, float temp, float top_p, uint64_t *rng,
                       prob_id *scratch) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return best;
    double sum = 0;
    for (uint32_t i = 0; i < V; i++) {
        scratch[i].p = expf((logits[i] - logits[best]) / temp);
        scratch[i].id = i;
        sum += scratch[i].p;
    }
    qsort(scratch, V, sizeof *scratch, by_prob_desc);
    double keep = 0;
    uint32_t n = 0;
    while (n < V && (n == 0 || keep < top_p * sum)) keep += scratch[n++].p;
    double u = (double)(tks_splitmix64(rng) >> 11) / 9007199254740992.0 * keep, acc = 0;
    for (uint32_t i = 0; i < n; i++)
        if ((acc += scratch[i].p) >= u) return scratch[i].id;
    return scratch[n - 1].id;
}

/* The prompt's ids into *enc: a prompt that is not UTF-8 is refused for
 * what it is, the prompt (the tokenizer's own message speaks of a build's
 * input and its options). */
static int encode_prompt(const tks_tok *tk, const char *prompt, tks_ids *enc) {
    int rc = tks_tok_encode(tk, prompt ? prompt : "", prompt ? strlen(prompt) : 0, enc);
    if (rc != TKS_ERR_UTF8) return rc;
    return tks_fail(TKS_ERR_UTF8, NULL, TKS_NONE, tks_last_error()->offset,
                    "the prompt is not valid UTF-8 (at byte %llu): give --prompt as UTF-8 text "
                    "(convert it first, for example with iconv)",
                    (unsigned long long)tks_last_error()->offset);
}

int tks_generate(const tks_generate_opts *o) {
    if (o->min_tokens > o->max_tokens)
        return tks_fail(TKS_ERR_ARG, o->checkpoint, TKS_NONE, TKS_NONE,
                        "--min-tokens %u is above --max-tokens %u: generation stops at --max-tokens, "
                        "so that minimum can never be reached; give --min-tokens at most %u, or a "
                        "larger --max-tokens",
                        o->min_tokens, o->max_tokens, o->max_tokens);
    tks_model_config cfg;
    tks_train_state st;
    int rc = tks_checkpoint_peek(o->checkpoint, &cfg, &st);
    if (rc) return rc;
    char tp[PATH_MAX];
    tks_tok *tk = NULL;
    tks_backend *be = NULL;
    tks_model *m = NULL;
    tks_ids enc = {0};
    float *logits = NULL;
    prob_id *scratch = NULL;
    /* a sentencepiece model, a byte-level BPE tokenizer.json or a tiktoken descriptor */
    char none[PATH_MAX];
    if (!rc && tks_path_join(none, sizeof none, o->checkpoint, TKS_NO_TOKENIZER_NAME) == 0 &&
        access(none, F_OK) == 0)
        rc = tks_fail(TKS_ERR_TOKENIZER, o->checkpoint, TKS_NONE, TKS_NONE,
                      "%s was trained on a dataset imported without a tokenizer: there is no "
                      "tokenizer to turn a prompt into ids or ids into text", o->checkpoint);
    if (!rc) rc = tks_tok_find(o->checkpoint, tp, sizeof tp);
    if (!rc) rc = tks_tok_load(tp, &tk);
    if (!rc && memcmp(tks_tok_fingerprint(tk), st.tokenizer_fp, 16) != 0)
        rc = tks_fail(TKS_ERR_TOKENIZER, tp, TKS_NONE, TKS_NONE,
                      "%s is not the tokenizer the model was trained with", tp);
    if (!rc) rc = tks_backend_create("cpu", o->threads, &be);
    if (!rc) rc = tks_model_create(&cfg, be, NULL, 1, 1, &m);
    if (!rc) rc = tks_checkpoint_load(o->checkpoint, m, NULL);
    if (!rc) rc = tks_model_kv_reset(m);
    if (!rc) rc = encode_prompt(tk, o->prompt, &enc);
    logits = malloc(cfg.vocab_size * sizeof *logits);
    scratch = malloc(cfg.vocab_size * sizeof *scratch);
    if (!rc && (!logits || !scratch)) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    /* the context starts with BOS when the tokenizer has one */
    uint32_t bos = tk ? tks_tok_bos_id(tk) : TKS_NO_ID, eos = tk ? tks_tok_eos_id(tk) : TKS_NO_ID;
    const size_t L = cfg.max_seq_len;
    uint32_t *ctx = malloc((L + 1) * sizeof *ctx);
    size_t n = 0;
    tks_generate_stats stl = {0}, *gs = o->stats ? o->stats : &stl;
    memset(gs, 0, sizeof *gs);
    gs->context = cfg.max_seq_len;
    gs->prompt_tokens = enc.n;
    if (!ctx && !rc) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && bos != TKS_NO_ID) ctx[n++] = bos;
    /* the prompt's most recent tokens, leaving room for the first generated one */
    size_t room = L > n + 1 ? L - n - 1 : (L > n ? L - n : 0);
    size_t from = enc.n > room ? enc.n - room : 0;
    gs->prompt_dropped = rc ? 0 : from;
    for (size_t i = from; !rc && i < enc.n; i++) ctx[n++] = enc.ids[i];
    /* Without BOS an empty prompt leaves no token to predict from: start after
     * an EOS (what ends the previous document in a dataset built with
     * --append-eos), or refuse when the tokenizer has neither. */
    if (!rc && n == 0 && eos != TKS_NO_ID) ctx[n++] = eos;
    if (!rc && n == 0)
        rc = tks_fail(TKS_ERR_ARG, tp, TKS_NONE, TKS_NONE,
                      "the prompt is empty and %s has neither a BOS nor an EOS token to start "
                      "from: give a prompt (--prompt TEXT)", tp);
    uint64_t rng = o->seed ^ 0x5DEECE66Dull;
    int pos = 0;
    for (size_t i = 0; !rc && i < n; i++) rc = tks_model_decode_step(m, (int32_t)ctx[i], pos++, logits);
    /* ids that are no token (a tiktoken file's gaps between its ranks and its
     * special ids) are never sampled: nothing decodes them. An untrained or
     * small model gives them probability like any other id. */
    uint8_t *gap = rc ? NULL : calloc(cfg.vocab_size, 1);
    if (!rc && !gap) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (uint32_t id = 0; !rc && id < cfg.vocab_size; id++) gap[id] = !tks_tok_is_token(tk, id);
    for (uint32_t k = 0; !rc && k < o->max_tokens; k++) {
        for (uint32_t id = 0; id < cfg.vocab_size; id++)
            if (gap[id]) logits[id] = -INFINITY;
        if (k < o->min_tokens && eos < cfg.vocab_size) logits[eos] = -INFINITY; /* not yet */
        uint32_t next = sample(logits, cfg.vocab_size, o->temperature, o->top_p > 0 ? o->top_p : 1.0f,
                               &rng, scratch);
        if (next == eos) break;
        char *text = NULL;
        size_t len = 0;
        /* decode with the previous token so sentencepiece places spaces right */
        uint32_t pair[2] = {ctx[n - 1], next};
        char *prev = NULL;
        size_t plen = 0;
        rc = tks_tok_decode(tk, pair, 2, &text, &len);
        if (!rc) rc = tks_tok_decode(tk, pair, 1, &prev, &plen);
        if (!rc && o->on_text && len >= plen) o->on_text(text + plen, len - plen, o->ctx);
        free(text);
        free(prev);
        ctx[n++] = next; /* n == pos + 1 <= max_seq_len + 1 slots */
        gs->generated++;
        if (rc || (size_t)pos < L) {
            if (!rc) rc = tks_model_decode_step(m, (int32_t)next, pos++, logits);
            continue;
        }
        /* the context is full: restart from its newest half (BOS kept) */
        size_t head = bos != TKS_NO_ID ? 1 : 0, keep = L / 2 > head ? L / 2 - head : 1;
        memmove(ctx + head, ctx + n - keep, keep * sizeof *ctx);
        n = head + keep;
        gs->slides++;
        rc = tks_model_kv_reset(m);
        for (pos = 0; !rc && (size_t)pos < n; pos++) rc = tks_model_decode_step(m, (int32_t)ctx[pos], pos, logits);
    }
    free(ctx);
    free(logits);
    free(gap);
    free(scratch);
    tks_ids_free(&enc);
    tks_model_free(m);
    if (be) be->ops->destroy(be);
    tks_tok_free(tk);
    return rc;
}
