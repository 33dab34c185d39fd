/* loader.c - the batch loader: a step's micro-batch of one data-parallel
 * rank read from the blend and the sources' windows into [micro, seq_len]
 * arrays, by a host thread one micro-batch ahead of the model
 * (tks_loader_*, sampler.h). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler.h"

#ifdef TKS_TEST_HOOKS
static const char *g_pad_id, *g_pad_targets;
static void read_pad_hooks(void) {
    g_pad_id = getenv("TOKSHARD_TEST_PAD_ID");
    g_pad_targets = getenv("TOKSHARD_TEST_PAD_TARGETS");
}
#endif

int tks_sampler_load_row(tks_sampler *s, uint64_t w, uint32_t vocab, uint32_t *tok, int32_t *ids,
                         int32_t *targets, int32_t *doc, uint64_t i) {
    uint32_t T = tks_sampler_seq_len(s);
    uint64_t real = 0;
    int rc = tks_sampler_read_window(s, w, vocab, tok, &real);
    if (!rc && doc) rc = tks_sampler_doc_starts(s, w, doc + i * T);
    if (rc) return rc;
    for (uint32_t t = 0; t < T; t++) {
        ids[i * T + t] = (int32_t)tok[t];
        /* a packed window's padding predicts nothing: ignored by the loss */
        targets[i * T + t] = t + 1 < real ? (int32_t)tok[t + 1] : -1;
    }
#ifdef TKS_TEST_HOOKS
    /* Test hooks (tests/test_parallel.sh packing): TOKSHARD_TEST_PAD_ID=N
     * gives the padding id N instead of 0, which must change no loss;
     * TOKSHARD_TEST_PAD_TARGETS=1 also lets the padding predict itself, the
     * mistake that check must catch. Read once, not at every row. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_pad_hooks);
    const char *pid = g_pad_id, *ptg = g_pad_targets;
    if (pid && real <= T) {
        int32_t v = (int32_t)(strtoul(pid, NULL, 10) % (vocab ? vocab : 1));
        for (uint32_t t = (uint32_t)real; t < T; t++) ids[i * T + t] = v;
        if (ptg && real >= 1)
            for (uint32_t t = (uint32_t)real - 1; t < T; t++) targets[i * T + t] = v;
    }
#endif
    return 0;
}

/* Two stages: the thread fills one while the model reads the other. The
 * error of a bad batch travels with the batch (the thread's error context
 * is copied to the caller). */
struct tks_batch_loader {
    tks_loader_config c;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, job, busy, quit;
    /* the job: micro-batch k of the step whose data cursor is `cursor`, the
     * blend at that cursor being `at` */
    tks_blend_state at;
    uint64_t cursor, k;
    int slot;                       /* the stage the job fills */
    uint32_t *tok;                  /* the thread's window scratch (seq_len + 1) */
    tks_blend_pick *picks;          /* the thread's picks scratch (micro) */
    int32_t *ids[2], *tg[2];        /* two stages of [micro, seq_len] */
    int32_t *doc[2];                /* their document starts (NULL without documents) */
    int rc;                         /* the last job's result */
    tks_error err;                  /* its error context when rc != 0 */
};

/* Reads global samples [first, first + n) into stage `slot`: each sample's
 * source and index in that source from the blend, starting from `at` (a
 * blend state at or before first), then the source's window. */
static int load_batch(tks_batch_loader *l, uint64_t first, uint64_t n, int slot) {
    int rc = tks_blend_picks(l->c.blend, &l->at, first, n, l->picks);
    for (uint64_t i = 0; i < n && !rc; i++) {
        tks_sampler *s = l->c.train[l->picks[i].source];
        rc = tks_sampler_load_row(s, tks_sampler_window(s, l->picks[i].index), l->c.vocab, l->tok,
                                  l->ids[slot], l->tg[slot], l->doc[slot], i);
    }
    return rc;
}

static void *loader_main(void *arg) {
    tks_batch_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->job && !l->quit) pthread_cond_wait(&l->cv, &l->mu);
        if (l->quit) break;
        l->job = 0;
        l->busy = 1;
        pthread_mutex_unlock(&l->mu);
        uint64_t first, cnt, mf, mc;
        int rc = tks_sampler_rank_slice_at(l->cursor, l->c.global_batch, l->c.dp, l->c.dp_rank, &first,
                                           &cnt);
        if (!rc) rc = tks_sampler_micro_slice(first, cnt, l->c.micro, l->k, &mf, &mc);
        if (!rc) rc = load_batch(l, mf, mc, l->slot);
        pthread_mutex_lock(&l->mu);
        l->rc = rc;
        if (rc) l->err = *tks_last_error();
        l->busy = 0;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int tks_loader_open(const tks_loader_config *c, tks_batch_loader **out) {
    *out = NULL;
    tks_batch_loader *l = calloc(1, sizeof *l);
    if (!l) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch loader)");
    l->c = *c;
    size_t N = (size_t)c->micro * c->seq_len;
    l->tok = malloc((c->seq_len + 1) * sizeof *l->tok);
    l->picks = malloc(c->micro * sizeof *l->picks);
    int fail = !l->tok || !l->picks;
    for (int i = 0; i < 2; i++) {
        l->ids[i] = malloc(N * sizeof *l->ids[i]);
        l->tg[i] = malloc(N * sizeof *l->tg[i]);
        if (c->documents) l->doc[i] = malloc(N * sizeof *l->doc[i]);
        fail |= !l->ids[i] || !l->tg[i] || (c->documents && !l->doc[i]);
    }
    if (fail) {
        tks_loader_close(l);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch staging)");
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int e = pthread_create(&l->th, NULL, loader_main, l);
    if (e != 0) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        tks_loader_close(l);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                        "cannot start the batch loader thread: %s", strerror(e));
    }
    l->started = 1;
    *out = l;
    return 0;
}

void tks_loader_start(tks_batch_loader *l, uint64_t cursor, const tks_blend_state *at, uint64_t k,
                      int slot) {
    pthread_mutex_lock(&l->mu);
    l->cursor = cursor;
    l->at = *at;
    l->k = k;
    l->slot = slot;
    l->job = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int tks_loader_wait(tks_batch_loader *l) {
    pthread_mutex_lock(&l->mu);
    while (l->job || l->busy) pthread_cond_wait(&l->cv, &l->mu);
    int rc = l->rc;
    if (rc) tks_error_restore(&l->err);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

tks_loaded_batch tks_loader_batch(const tks_batch_loader *l, int slot) {
    return (tks_loaded_batch){.ids = l->ids[slot], .targets = l->tg[slot], .doc = l->doc[slot]};
}

void tks_loader_close(tks_batch_loader *l) {
    if (!l) return;
    if (l->started) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->th, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    free(l->tok);
    free(l->picks);
    for (int i = 0; i < 2; i++) {
        free(l->ids[i]);
        free(l->tg[i]);
        free(l->doc[i]);
    }
    free(l);
}
