/* loader.c - the batch loader: the one owner of a run's data cursor. Each
 * step's micro-batches of one data-parallel rank read from the blend and the
 * sources' windows into [micro, seq_len] arrays by a host thread one
 * micro-batch ahead of the model; the step's training targets counted over
 * its whole global batch; the blend advanced from step to step
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
 * is copied to the caller). The step fields belong to the caller's thread;
 * the job fields are set under mu while the thread is idle. */
struct tks_batch_loader {
    tks_loader_config c;
    uint64_t n_micro;               /* micro-batches per rank per step */
    /* the step the caller is at */
    uint64_t step;                  /* steps since c.start, loaded while < c.steps */
    uint64_t taken;                 /* its micro-batches handed out */
    tks_blend_state at;             /* the blend at its start (at.sample: its data cursor) */
    int walked;                     /* targets and end hold this step's */
    uint64_t targets;               /* its training targets over the whole global batch */
    tks_blend_state end;            /* the blend after its global batch */
    int slot;                       /* the stage handed out last; jobs fill the other */
    /* the thread and its job: micro-batch job_k of step job_step, whose
     * blend at its start is job_at, into stage job_slot */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, job, busy, quit;
    int pending;                    /* a job was started and its batch not handed out yet */
    uint64_t job_step, job_k;
    int job_slot;
    tks_blend_state job_at;
    uint32_t *tok;                  /* the thread's window scratch (seq_len + 1) */
    tks_blend_pick *picks;          /* the thread's picks scratch (micro) */
    int32_t *ids[2], *tg[2];        /* two stages of [micro, seq_len] */
    int32_t *doc[2];                /* their document starts (NULL without documents) */
    int rc;                         /* the last job's result */
    tks_error err;                  /* its error context when rc != 0 */
};

/* Reads micro-batch k of this rank's slice of the step whose blend at its
 * start is `at` into stage `slot`: each global sample's source and index in
 * that source from the blend, then the source's window. */
static int load_micro(tks_batch_loader *l, const tks_blend_state *at, uint64_t k, int slot) {
    uint64_t first = 0, cnt = 0, mf = 0, mc = 0;
    int rc = tks_sampler_rank_slice_at(at->sample, l->c.global_batch, l->c.dp, l->c.dp_rank, &first, &cnt);
    if (!rc) rc = tks_sampler_micro_slice(first, cnt, l->c.micro, k, &mf, &mc);
    if (!rc) rc = tks_blend_picks(l->c.blend, at, mf, mc, l->picks);
    for (uint64_t i = 0; i < mc && !rc; i++) {
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
        tks_blend_state at = l->job_at;
        uint64_t k = l->job_k;
        int slot = l->job_slot;
        pthread_mutex_unlock(&l->mu);
        int rc = load_micro(l, &at, k, slot);
        pthread_mutex_lock(&l->mu);
        l->rc = rc;
        if (rc) l->err = *tks_last_error();
        l->busy = 0;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Starts loading micro-batch k of step `step` (blend `at` at its start) into
 * the stage not handed out, once the job in flight (if any) is done. */
static void start_job(tks_batch_loader *l, uint64_t step, uint64_t k, const tks_blend_state *at) {
    pthread_mutex_lock(&l->mu);
    while (l->job || l->busy) pthread_cond_wait(&l->cv, &l->mu);
    l->job_step = step;
    l->job_k = k;
    l->job_slot = 1 - l->slot;
    l->job_at = *at;
    l->job = 1;
    l->pending = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* The current step's global batch walked once through the blend: its
 * training targets (CONCAT: seq_len per window; BEST_FIT: each window's real
 * tokens - 1, its padding having none) and the blend after it. */
static const tks_blend_state *walk_step(tks_batch_loader *l) {
    if (l->walked) return &l->end;
    tks_blend_state st = l->at;
    uint64_t n = 0;
    for (uint64_t i = 0; i < l->c.global_batch; i++) {
        tks_blend_pick pk = tks_blend_next(l->c.blend, &st);
        tks_sampler *s = l->c.train[pk.source];
        if (tks_sampler_packing(s) == TKS_PACK_CONCAT) {
            n += l->c.seq_len;
            continue;
        }
        uint64_t real = tks_sampler_window_real(s, tks_sampler_window(s, pk.index));
        n += real > 1 ? real - 1 : 0;
    }
    l->end = st;
    l->targets = n ? n : 1;
    l->walked = 1;
    return &l->end;
}

static int bad_config(const char *what) {
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "batch loader: %s", what);
}

/* The checks of tks_loader_open; fills n_micro and micro (0: the per-rank batch). */
static int check_config(tks_loader_config *c, uint64_t *n_micro) {
    if (!c->blend || c->blend->n_sources == 0 || c->blend->n_sources > TKS_BLEND_MAX_SOURCES)
        return bad_config("no blend, or a blend without sources");
    for (uint32_t k = 0; k < c->blend->n_sources; k++)
        if (!c->train[k]) return bad_config("a source of the blend has no training sampler");
    if (c->seq_len == 0) return bad_config("seq_len is 0");
    if (c->dp_rank >= c->dp) return bad_config("dp_rank is not below dp");
    uint64_t per_rank;
    int rc = tks_batch_check(c->global_batch, c->dp, c->micro, &per_rank, n_micro);
    if (!rc && c->micro == 0) c->micro = per_rank;
    return rc;
}

int tks_loader_open(const tks_loader_config *c, tks_batch_loader **out) {
    if (!out) return bad_config("out is NULL");
    *out = NULL;
    if (!c) return bad_config("config is NULL");
    tks_loader_config cc = *c;
    uint64_t n_micro = 0;
    int rc = check_config(&cc, &n_micro);
    if (rc) return rc;
    tks_batch_loader *l = calloc(1, sizeof *l);
    if (!l) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (batch loader)");
    l->c = cc;
    l->n_micro = n_micro;
    l->at = cc.start;
    l->slot = 1; /* the first job fills stage 0 */
    size_t N = (size_t)cc.micro * cc.seq_len;
    l->tok = malloc((cc.seq_len + 1) * sizeof *l->tok);
    l->picks = malloc(cc.micro * sizeof *l->picks);
    int fail = !l->tok || !l->picks;
    for (int i = 0; i < 2; i++) {
        l->ids[i] = malloc(N * sizeof *l->ids[i]);
        l->tg[i] = malloc(N * sizeof *l->tg[i]);
        if (cc.documents) l->doc[i] = malloc(N * sizeof *l->doc[i]);
        fail |= !l->ids[i] || !l->tg[i] || (cc.documents && !l->doc[i]);
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
    if (cc.steps > 0) start_job(l, 0, 0, &l->at);
    *out = l;
    return 0;
}

const tks_blend_state *tks_loader_at(const tks_batch_loader *l) { return &l->at; }

uint64_t tks_loader_step_targets(tks_batch_loader *l) {
    walk_step(l);
    return l->targets;
}

int tks_loader_next(tks_batch_loader *l, tks_loaded_batch *out) {
    *out = (tks_loaded_batch){0};
    if (l->step >= l->c.steps || l->taken >= l->n_micro)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "batch loader: no micro-batch left in step %llu (it loads %llu steps of %llu "
                        "micro-batches): advance to the next step first",
                        (unsigned long long)l->step, (unsigned long long)l->c.steps,
                        (unsigned long long)l->n_micro);
    if (!l->pending || l->job_step != l->step || l->job_k != l->taken) start_job(l, l->step, l->taken, &l->at);
    int rc = tks_loader_wait(l);
    l->pending = 0;
    l->slot = l->job_slot;
    l->taken++;
    /* stage the next one while this one computes: the step's next
     * micro-batch, or the next step's first, from the blend after this step */
    if (l->taken < l->n_micro) start_job(l, l->step, l->taken, &l->at);
    else if (l->step + 1 < l->c.steps) start_job(l, l->step + 1, 0, walk_step(l));
    *out = (tks_loaded_batch){.ids = l->ids[l->slot], .targets = l->tg[l->slot], .doc = l->doc[l->slot]};
    return rc;
}

void tks_loader_advance(tks_batch_loader *l) {
    l->at = *walk_step(l);
    l->step++;
    l->taken = 0;
    l->walked = 0;
}

int tks_loader_wait(tks_batch_loader *l) {
    pthread_mutex_lock(&l->mu);
    while (l->job || l->busy) pthread_cond_wait(&l->cv, &l->mu);
    int rc = l->pending ? l->rc : 0;
    if (rc) tks_error_restore(&l->err);
    pthread_mutex_unlock(&l->mu);
    return rc;
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
