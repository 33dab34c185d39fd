/* resolve.c - a training run resolved from its options and checked: its
 * sources and samplers, the blend, a resume's checks against its checkpoint,
 * and the settings every rank must share. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "trainer/run/run.h"

void tks_train_opts_default(tks_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->model.dim = 256;
    o->model.n_layers = 4;
    o->model.n_heads = 8;
    o->model.n_kv_heads = 4;
    o->model.max_seq_len = 256;
    o->steps = 200;
    o->seq_len = 256;
    o->global_batch = 16;
    o->seed = TKS_DEFAULT_SEED;
    o->lr = 3e-3f;
    o->min_lr = 3e-4f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->adam_eps = 1e-8f;
    o->weight_decay = 0.1f;
    o->grad_clip = 1.0f;
    o->warmup_steps = 20;
    o->val_tokens = TKS_DEFAULT_VAL_TOKENS;
    o->eval_every = 50;
    o->eval_batches = 4;
    o->keep_checkpoints = 3;
    o->warn_repeats = 4;
}

void tks__run_free(run *r) {
    for (uint32_t k = 0; k < r->n_src; k++) {
        tks_sampler_free(r->src[k].train);
        tks_sampler_free(r->src[k].val);
        tks_dataset_close(r->src[k].ds);
    }
    tks_dataset_close(r->val_ds);
}

/* A learning-rate schedule (tks_adamw_opts' lr, min_lr, warmup, total). */
typedef struct sched {
    double lr, min_lr;
    uint64_t warmup, steps;
} sched;

/* The learning rate of 1-based step s under schedule c (tks_lr_at). */
static float lr_at(uint64_t s, const sched *c) {
    tks_adamw_opts a = {.lr = (float)c->lr, .min_lr = (float)c->min_lr, .warmup = c->warmup, .total = c->steps};
    return tks_lr_at(&a, s - 1);
}

/* The first step from s on whose learning rate differs between schedules a
 * and b, or 0 when none does. Under the same peak and warmup the rates are
 * equal through the warmup, so the search starts after it; it looks at most
 * a million steps further, then at the last step of the longer schedule
 * (from there on each is its min_lr). */
static uint64_t first_lr_change(uint64_t s, const sched *a, const sched *b) {
    uint64_t from = s, last = (a->steps > b->steps ? a->steps : b->steps) + 1;
    if ((float)a->lr == (float)b->lr && a->warmup == b->warmup && from <= a->warmup) from = a->warmup + 1;
    for (uint64_t t = from; t <= last && t - from <= 1000000; t++)
        if (lr_at(t, a) != lr_at(t, b)) return t;
    return lr_at(last, a) != lr_at(last, b) ? last : 0;
}

/* A resumed run continues the checkpoint's learning-rate schedule: steps,
 * lr, min_lr and warmup_steps as recorded, unless --change-schedule. And
 * --steps may not be below the checkpoint's step (equal: nothing is trained,
 * the checkpoint is written again, under this run's layout). */
static int same_schedule(const tks_train_opts *o, const tks_train_state *st) {
    if (o->steps < st->step)
        return tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                        "the checkpoint %s is at step %llu, past --steps %llu (the total, resumed "
                        "steps included): nothing would be trained; give --steps above %llu",
                        o->resume, (unsigned long long)st->step, (unsigned long long)o->steps,
                        (unsigned long long)st->step);
    if (o->steps == st->step) return 0; /* no step: the checkpoint is saved again (another layout) */
    json_t *j = json_loads(st->options_json, 0, NULL);
    json_t *js = json_object_get(j, "steps"), *jl = json_object_get(j, "lr"),
           *jm = json_object_get(j, "min_lr"), *jw = json_object_get(j, "warmup_steps");
    if (!json_is_integer(js) || !json_is_number(jl) || !json_is_number(jm) || !json_is_integer(jw)) {
        json_decref(j);
        return 0; /* not recorded: nothing to compare with */
    }
    uint64_t steps = (uint64_t)json_integer_value(js), warm = (uint64_t)json_integer_value(jw);
    double lr = json_number_value(jl), min_lr = json_number_value(jm);
    json_decref(j);
    if (o->change_schedule ||
        (steps == o->steps && warm == o->warmup_steps && (float)lr == o->lr && (float)min_lr == o->min_lr))
        return 0;
    /* the first step whose rate changes, and both rates to as many digits as
     * tell them apart (the next step's may be the same: a longer --steps
     * changes nothing inside the warmup) */
    const sched was = {lr, min_lr, warm, steps}, now = {o->lr, o->min_lr, o->warmup_steps, o->steps};
    uint64_t s = first_lr_change(st->step + 1, &was, &now);
    char a[32] = "", b[32] = "", rates[160] = "";
    if (s) {
        tks_float_text(a, sizeof a, lr_at(s, &now));
        tks_float_text(b, sizeof b, lr_at(s, &was));
        snprintf(rates, sizeof rates, ", so the learning rate would change from step %llu on (%s instead of %s)",
                 (unsigned long long)s, a, b);
    } else {
        snprintf(rates, sizeof rates, ", which gives each step from %llu on the learning rate the "
                 "checkpoint's schedule gives it (only the recorded schedule changes)",
                 (unsigned long long)st->step + 1);
    }
    return tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                    "the checkpoint %s was trained with --steps %llu --lr %g --min-lr %g --warmup %llu; "
                    "this run asks for --steps %llu --lr %g --min-lr %g --warmup %llu%s. Resume with the "
                    "checkpoint's values, or pass --change-schedule to continue on the new schedule",
                    o->resume, (unsigned long long)steps, lr, min_lr, (unsigned long long)warm,
                    (unsigned long long)o->steps, (double)o->lr, (double)o->min_lr,
                    (unsigned long long)o->warmup_steps, rates);
}

tks_packing tks__run_packing(const tks_train_opts *o) {
    return o->packing && !strcmp(o->packing, "best-fit") ? TKS_PACK_BEST_FIT : TKS_PACK_CONCAT;
}

/* --doc-mask and --reset-positions change what the model computes from the
 * same samples, --packing the samples: a resumed run keeps the checkpoint's
 * (absent: off, concat). */
static int same_documents(const tks_train_opts *o, const tks_train_state *st) {
    json_t *j = json_loads(st->options_json, 0, NULL);
    int dm = json_is_true(json_object_get(j, "doc_mask")), rp = json_is_true(json_object_get(j, "reset_positions"));
    const char *pk = json_string_value(json_object_get(j, "packing"));
    int was_bf = pk && !strcmp(pk, "best-fit"), is_bf = tks__run_packing(o) == TKS_PACK_BEST_FIT;
    json_decref(j);
    if (was_bf != is_bf)
        return tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                        "the checkpoint %s was trained with --packing %s: resume with --packing %s (the "
                        "windows, and so the data order, differ between packings)",
                        o->resume, was_bf ? "best-fit" : "concat", was_bf ? "best-fit" : "concat");
    if (dm == (o->doc_mask != 0) && rp == (o->reset_positions != 0)) return 0;
    const char *flag = dm != (o->doc_mask != 0) ? "--doc-mask" : "--reset-positions";
    int was = dm != (o->doc_mask != 0) ? dm : rp;
    return tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                    "the checkpoint %s was trained %s %s: resume %s it (the model learned %s)",
                    o->resume, was ? "with" : "without", flag, was ? "with" : "without",
                    was ? "with it" : "without it");
}

/* The sources of the run, each dataset opened: a mixture's named sources
 * (checked first: names, weights, schedule) or the plain --dataset. Every
 * source must share source 0's tokenizer. */
static int open_sources(run *r) {
    const tks_train_opts *o = &r->o;
    const tks_mix_spec *m = o->mix;
    int rc = 0;
    r->mixed = m && m->named;
    if (r->mixed) {
        if ((rc = tks_mix_check(m, o->steps))) return rc;
        if (o->val_dataset_dir)
            return tks_fail(TKS_ERR_ARG, o->val_dataset_dir, TKS_NONE, TKS_NONE,
                            "--val-dataset %s: a mixture holds out --val-tokens of each source "
                            "instead (a validation loss per source); drop --val-dataset",
                            o->val_dataset_dir);
        r->n_src = m->n_sources;
    } else {
        const char *dir = m ? m->sources[0].dir : o->dataset_dir;
        if (!dir) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "--dataset DIR is required");
        r->n_src = 1;
        r->src[0].dir = dir;
        const char *base = strrchr(dir, '/');
        snprintf(r->src[0].name, sizeof r->src[0].name, "%.63s", base && base[1] ? base + 1 : dir);
    }
    for (uint32_t k = 0; k < r->n_src && !rc; k++) {
        source *s = &r->src[k];
        if (r->mixed) {
            s->dir = m->sources[k].dir;
            snprintf(s->name, sizeof s->name, "%s", m->sources[k].name);
        }
        if ((rc = tks_dataset_open(s->dir, &s->ds))) break;
        const uint8_t *fp = tks_dataset_tokenizer(s->ds)->fingerprint,
                      *fp0 = tks_dataset_tokenizer(r->src[0].ds)->fingerprint;
        if (memcmp(fp, fp0, 16) != 0) {
            char a[33], b[33];
            tks_hex(fp0, 16, a);
            tks_hex(fp, 16, b);
            rc = tks_fail(TKS_ERR_TOKENIZER, s->dir, TKS_NONE, TKS_NONE,
                          "sources %s (%s) and %s (%s) were built with different tokenizers "
                          "(fingerprints %s and %s): the same id means different text in each; "
                          "rebuild %s with %s's tokenizer",
                          r->src[0].name, r->src[0].dir, s->name, s->dir, a, b, s->name,
                          r->src[0].name);
        }
    }
    r->ds = r->src[0].ds;
    return rc;
}

/* 1 when blends a and b assign every global sample below n (all of them
 * when n is UINT64_MAX) alike: the same phases, weights and starts. */
static int blend_same_before(const tks_blend *a, const tks_blend *b, uint64_t n) {
    if (a->n_sources != b->n_sources) return 0;
    uint32_t pa = 0, pb = 0;
    for (;;) {
        int ia = pa < a->n_phases && a->start[pa] < n, ib = pb < b->n_phases && b->start[pb] < n;
        if (ia != ib) return 0;
        if (!ia) return 1;
        if (a->start[pa] != b->start[pb] || a->S[pa] != b->S[pb] ||
            memcmp(a->W[pa], b->W[pb], a->n_sources * sizeof a->W[0][0]))
            return 0;
        pa++, pb++;
    }
}

/* A resumed mixture: the checkpoint's sources (names, order, datasets)
 * must be this run's, and its blend this run's up to the cursor (all of it
 * without --change-schedule); r->start is the checkpoint's cursor. */
static int resume_mixture(run *r) {
    const tks_train_opts *o = &r->o;
    const tks_train_state *st = &r->resumed;
    if (!st->mix_json[0] || !r->mixed)
        return tks_fail(TKS_ERR_RESUME, o->resume, TKS_NONE, TKS_NONE,
                        "the checkpoint %s was trained on %s, this run asks for %s: resume with "
                        "the checkpoint's --dataset flags",
                        o->resume, st->mix_json[0] ? "a mixture of named sources" : "one plain dataset",
                        r->mixed ? "a mixture" : "one plain dataset");
    tks_mix_spec *ck = malloc(sizeof *ck);
    tks_blend *cb = malloc(sizeof *cb);
    uint64_t mx[TKS_MIX_MAX_SOURCES];
    int rc = ck && cb ? tks_mix_from_json(st->mix_json, ck, &r->start, mx)
                      : tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (uint32_t k = 0; !rc && k < r->n_src; k++) {
        if (ck->n_sources != r->n_src || strcmp(ck->sources[k].name, r->src[k].name)) {
            char names[1024] = "";
            for (uint32_t j = 0, n = 0; j < ck->n_sources && n < sizeof names; j++)
                n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", j ? ", " : "", ck->sources[j].name);
            rc = tks_fail(TKS_ERR_RESUME, o->resume, TKS_NONE, TKS_NONE,
                          "the checkpoint %s was trained on the sources %s (in this order); give "
                          "the same --dataset NAME=DIR:WEIGHT sources to resume it",
                          o->resume, names);
        } else if (mx[k] != tks_dataset_manifest_xxh3(r->src[k].ds)) {
            rc = tks_fail(TKS_ERR_RESUME, r->src[k].dir, TKS_NONE, TKS_NONE,
                          "source %s: %s is another dataset than the checkpoint %s was trained on "
                          "(manifest XXH3 %016llx, this one %016llx; it was at %s): its cursor "
                          "means nothing here; give the original dataset",
                          r->src[k].name, r->src[k].dir, o->resume, (unsigned long long)mx[k],
                          (unsigned long long)tks_dataset_manifest_xxh3(r->src[k].ds),
                          ck->sources[k].dir);
        }
    }
    if (!rc) rc = tks_mix_blend(ck, st->global_batch, cb);
    if (!rc && r->start.sample != st->cursor)
        rc = tks_fail(TKS_ERR_MANIFEST, o->resume, TKS_NONE, TKS_NONE,
                      "%s: the mixture's cursor (%llu samples) is not the checkpoint's (%llu)",
                      o->resume, (unsigned long long)r->start.sample, (unsigned long long)st->cursor);
    if (!rc && !blend_same_before(cb, &r->blend, o->change_schedule ? st->cursor : UINT64_MAX))
        rc = tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                      "the weights or --mix-at schedule differ from the checkpoint %s's%s: %s",
                      o->resume, o->change_schedule ? " before its step" : "",
                      o->change_schedule
                          ? "steps already trained cannot change their mixture; give the "
                            "checkpoint's weights and schedule up to its step"
                          : "resume with the same weights and schedule, or pass --change-schedule "
                            "to change the mixture of the steps still to come");
    free(ck);
    free(cb);
    return rc;
}

/* The checkpoint's settings taken over (its model; seq_len, seed, global
 * batch and validation split, each unless given and the run evaluates). */
static int resume_settings(run *r) {
    tks_train_opts *o = &r->o;
    const tks_train_state *st = &r->resumed;
    int keep = r->eval_only; /* keep the given ones */
    if (!keep || !(o->given & TKS_GIVEN_SEQ_LEN)) o->seq_len = st->seq_len;
    if (!keep || !(o->given & TKS_GIVEN_SEED)) o->seed = st->seed;
    if (!keep || !(o->given & TKS_GIVEN_GLOBAL_BATCH)) o->global_batch = st->global_batch;
    if (!keep || !(o->given & TKS_GIVEN_VAL_TOKENS)) o->val_tokens = st->val_tokens;
    return 0;
}

/* The resume checks of the checkpoint (tokenizer, dataset, schedule) and
 * its settings taken over: seq_len, seed, global batch, validation split.
 * An evaluation (r->eval_only) checks the tokenizer only. */
static int resume_checks(run *r) {
    tks_train_opts *o = &r->o;
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(r->ds);
    tks_model_config ck;
    int rc = tks_checkpoint_peek(o->resume, &ck, &r->resumed);
    if (rc) return rc;
    r->cfg = ck; /* the model is the checkpoint's */
    if (memcmp(r->resumed.tokenizer_fp, ti->fingerprint, 16) != 0) {
        char a[33], b[33];
        tks_hex(r->resumed.tokenizer_fp, 16, a);
        tks_hex(ti->fingerprint, 16, b);
        return tks_fail(TKS_ERR_TOKENIZER, r->src[0].dir, TKS_NONE, TKS_NONE,
                        "the checkpoint %s was trained with tokenizer %s but dataset %s was "
                        "built with tokenizer %s: the token ids mean different things; resume "
                        "on the original dataset or rebuild this one with the checkpoint's "
                        "tokenizer.model",
                        o->resume, a, r->src[0].dir, b);
    }
    /* an evaluation may use any dataset of the tokenizer, any packing and
     * document settings, and flags of its own: a given sampling flag
     * replaces the checkpoint's, the others take it */
    if (r->eval_only) return resume_settings(r);
    if (!r->mixed && !r->resumed.mix_json[0] &&
        r->resumed.manifest_xxh3 != tks_dataset_manifest_xxh3(r->ds))
        return tks_fail(TKS_ERR_RESUME, r->src[0].dir, TKS_NONE, TKS_NONE,
                        "the checkpoint %s was trained on another dataset (manifest XXH3 "
                        "%016llx, this one %016llx): its data cursor means nothing here; "
                        "resume with the original --dataset",
                        o->resume, (unsigned long long)r->resumed.manifest_xxh3,
                        (unsigned long long)tks_dataset_manifest_xxh3(r->ds));
    if ((rc = same_schedule(o, &r->resumed))) return rc;
    if ((rc = same_documents(o, &r->resumed))) return rc;
    /* a sampling flag given with a value other than the checkpoint's is
     * refused, naming both; one not given takes the checkpoint's */
    static const char *const flag[] = {"--seq-len", "--global-batch", "--seed", "--val-tokens"};
    const uint64_t now[] = {o->seq_len, o->global_batch, o->seed, o->val_tokens},
                   was[] = {r->resumed.seq_len, r->resumed.global_batch, r->resumed.seed, r->resumed.val_tokens};
    for (int i = 0; i < 4; i++)
        if ((o->given & (1u << i)) && now[i] != was[i])
            return tks_fail(TKS_ERR_RESUME, o->resume, TKS_NONE, TKS_NONE,
                            "%s %llu differs from the checkpoint %s's %llu: the samples of the steps to "
                            "come depend on it; resume with %s %llu (or without the flag), or start a new "
                            "run", flag[i], (unsigned long long)now[i], o->resume, (unsigned long long)was[i],
                            flag[i], (unsigned long long)was[i]);
    return resume_settings(r);
}

/* Source s's train and validation samplers over its ranges: best-fit plans
 * in files made with the world W (tks__run_plans), else as --packing says. */
static int source_samplers(run *r, source *s, const tks_pack_world *W) {
    const tks_train_opts *o = &r->o;
    const tks_token_range tr = s->train_range, va = s->val_range;
    tks_dataset *vds = r->val_ds ? r->val_ds : s->ds;
    tks_packing pk = tks__run_packing(o);
    int rc = W ? tks_sampler_create_planned(s->ds, tr.begin, tr.end, o->seq_len, s->seed, o->threads, o->pack_plans,
                                            W, &s->train)
               : tks_sampler_create_packed(s->ds, tr.begin, tr.end, o->seq_len, s->seed, pk, o->threads, &s->train);
    if (rc || va.end <= va.begin) return rc;
    return W ? tks_sampler_create_planned(vds, va.begin, va.end, o->seq_len, o->seed, o->threads, o->pack_plans, W,
                                          &s->val)
             : tks_sampler_create_packed(vds, va.begin, va.end, o->seq_len, o->seed, pk, o->threads, &s->val);
}

/* Each source's train and validation samplers (its last --val-tokens
 * tokens, or the --val-dataset of a plain run) and the blend. */
static int make_samplers(run *r) {
    const tks_train_opts *o = &r->o;
    int rc = 0;
    for (uint32_t k = 0; k < r->n_src && !rc; k++) {
        source *s = &r->src[k];
        tks_token_range tr, va;
        if (o->val_dataset_dir) {
            if ((rc = tks_dataset_open(o->val_dataset_dir, &r->val_ds))) return rc;
            if (memcmp(tks_dataset_tokenizer(r->val_ds)->fingerprint,
                       tks_dataset_tokenizer(s->ds)->fingerprint, 16) != 0)
                return tks_fail(TKS_ERR_TOKENIZER, o->val_dataset_dir, TKS_NONE, TKS_NONE,
                                "validation dataset %s was built with another tokenizer than %s",
                                o->val_dataset_dir, s->dir);
            tr = (tks_token_range){0, tks_dataset_n_tokens(s->ds)};
            va = (tks_token_range){0, tks_dataset_n_tokens(r->val_ds)};
        } else if ((rc = tks_split_tokens(tks_dataset_n_tokens(s->ds), o->val_tokens, o->seq_len, &tr,
                                          &va))) {
            if (r->mixed) {
                tks_error e = *tks_last_error();
                rc = tks_fail(e.code, s->dir, TKS_NONE, TKS_NONE, "source %s (%s): %s", s->name, s->dir,
                              e.message);
            }
            return rc;
        }
        s->train_range = tr;
        s->val_range = va;
        s->seed = r->mixed ? tks_source_seed(o->seed, s->name) : o->seed; /* its own order */
        if (tks__run_packing(o) == TKS_PACK_BEST_FIT && o->pack_plans) { /* tks__run_plans, after the ranks agree */
            r->plans_pending = 1;
            continue;
        }
        rc = source_samplers(r, s, NULL);
    }
    r->train = r->src[0].train;
    r->val = r->src[0].val;
    return rc;
}

/* With evaluation on, every source's validation split must hold at least
 * one micro-batch for each data-parallel rank (an evaluation uses whole
 * rounds of them): a source with fewer would have no loss (NaN) and, in a
 * mixture, drop out of the weighted mean unseen. Refused before step 1,
 * naming the source and the numbers. */
static int check_validation(const run *r) {
    const tks_train_opts *o = &r->o;
    uint64_t dp = (uint64_t)r->shape.dp_replicate * r->shape.dp_shard, per = r->micro * dp;
    int any = 0;
    for (uint32_t k = 0; k < r->n_src; k++) any |= r->src[k].val != NULL;
    if (r->eval_only && !any)
        return tks_fail(TKS_ERR_ARG, r->src[0].dir, TKS_NONE, TKS_NONE,
                        "--eval-only: there are no validation windows (--val-tokens %llu): give "
                        "--val-tokens N (at least --seq-len + 1) or --val-dataset DIR",
                        (unsigned long long)o->val_tokens);
    if (!r->eval_only && (!o->eval_every || (!any && !o->val_dataset_dir))) return 0; /* no evaluation */
    for (uint32_t k = 0; k < r->n_src; k++) {
        uint64_t nw = r->src[k].val ? tks_sampler_n_windows(r->src[k].val) : 0;
        if (nw >= per) continue;
        char who[300];
        if (r->mixed) snprintf(who, sizeof who, "source %s (%s): its", r->src[k].name, r->src[k].dir);
        else snprintf(who, sizeof who, "the");
        return tks_fail(TKS_ERR_ARG, r->src[k].dir, TKS_NONE, TKS_NONE,
                        "%s validation split holds %llu windows of --seq-len %u, fewer than one "
                        "micro-batch on each data-parallel rank (%llu x dp %llu = %llu), so it would "
                        "have no validation loss: raise --val-tokens (%llu now) to at least %llu, lower "
                        "--micro-batch, or set --eval-every 0",
                        who, (unsigned long long)nw, o->seq_len, (unsigned long long)r->micro,
                        (unsigned long long)dp, (unsigned long long)per, (unsigned long long)o->val_tokens,
                        (unsigned long long)(per * ((uint64_t)o->seq_len + 1)));
    }
    return 0;
}

/* This run's blend: the mixture's (its phases start at (step - 1) x the
 * global batch), or one source with weight 1 (sample g is the source's g). */
static int make_blend(run *r) {
    if (r->mixed) return tks_mix_blend(r->o.mix, r->o.global_batch, &r->blend);
    const uint64_t zero = 0;
    const double one = 1.0;
    return tks_blend_init(&r->blend, 1, 1, &zero, &one, NULL);
}

int tks__run_resolve(const tks_train_opts *in, int eval_only, run *r) {
    memset(r, 0, sizeof *r);
    r->o = *in;
    r->eval_only = eval_only;
    tks_train_opts *o = &r->o;
    if (o->packing && strcmp(o->packing, "concat") && strcmp(o->packing, "best-fit"))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--packing %s: use concat (the stream cut every seq_len tokens) or best-fit "
                        "(whole documents packed into windows)", o->packing);
    int rc = open_sources(r);
    if (rc) return rc;
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(r->ds);
    r->cfg = o->model;
    if (o->resume && (rc = resume_checks(r))) return rc;
    if ((rc = make_blend(r))) return rc;
    if (o->resume && !eval_only && (r->mixed || r->resumed.mix_json[0]) && (rc = resume_mixture(r))) return rc;
    if (o->resume && !r->mixed) r->start = (tks_blend_state){.sample = r->resumed.cursor,
                                                            .count = {r->resumed.cursor},
                                                            .phase_count = {r->resumed.cursor}};
    if (!o->dtype || !strcmp(o->dtype, "fp32")) r->dtype = TKS_F32;
    else if (!strcmp(o->dtype, "bf16")) r->dtype = TKS_BF16;
    else
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--dtype %s: use fp32 (the reference) or bf16 (mixed precision)", o->dtype);
    if (!r->cfg.vocab_size) r->cfg.vocab_size = ti->vocab_size;
    if (!r->cfg.max_seq_len || r->cfg.max_seq_len < o->seq_len) r->cfg.max_seq_len = o->seq_len;
    tks_model_config_defaults(&r->cfg);
    /* vocabulary safety of every source, before anything is allocated
     * (docs/MOTIVATION.md, failure 1) */
    for (uint32_t k = 0; k < r->n_src; k++) {
        const source *s = &r->src[k];
        uint32_t v = tks_dataset_tokenizer(s->ds)->vocab_size;
        if (v > r->cfg.vocab_size)
            return tks_fail(TKS_ERR_TOKEN_RANGE, s->dir, TKS_NONE, TKS_NONE,
                            "%s%s%sdataset %s was built for vocab_size %u (max token id %u) but the "
                            "model has vocab_size %u: ids above %u would index past the embedding; "
                            "use --vocab-size %u (or more), or a dataset built with the model's "
                            "tokenizer", r->mixed ? "source " : "", r->mixed ? s->name : "",
                            r->mixed ? ": " : "", s->dir, v, tks_dataset_max_token_id(s->ds),
                            r->cfg.vocab_size, r->cfg.vocab_size - 1, v);
    }
    int world = o->world, rank = 0;
    if (!world && (rc = tks_mesh_world(&world, &rank))) return rc;
    if ((rc = tks_mesh_resolve(world, o->tp, o->dp_shard, o->dp_replicate, &r->shape))) return rc;
    if ((rc = tks_model_config_check(&r->cfg, r->shape.tp))) return rc;
    if (o->seq_len == 0 || o->seq_len > r->cfg.max_seq_len)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--seq-len %u must be in 1..max_seq_len %u", o->seq_len, r->cfg.max_seq_len);
    if ((rc = tks_batch_check(o->global_batch, (uint32_t)(r->shape.dp_replicate * r->shape.dp_shard),
                              o->micro_batch, &r->per_rank, &r->n_micro)))
        return rc;
    r->micro = r->per_rank / r->n_micro;
    rc = make_samplers(r);
    return rc || r->plans_pending ? rc : check_validation(r);
}

static int world_sum(uint64_t *v, size_t n, void *ctx) {
    (void)ctx;
    return tks_mesh_world_sum_u64(v, n);
}

static int world_agree(int rc, void *ctx) {
    (void)ctx;
    return tks_mesh_world_agree(rc);
}

int tks__run_plans(run *r) {
    if (!r->plans_pending) return 0;
    const tks_train_opts *o = &r->o;
    tks_pack_world W = {.rank = 0, .size = 1, .sum_u64 = world_sum, .agree = world_agree};
    int rc = o->world ? 0 : tks_mesh_world(&W.size, &W.rank);
    if (rc) return rc;
    /* the same sources, ranges and order on every rank (tks__run_same) */
    for (uint32_t k = 0; k < r->n_src && !rc; k++) rc = source_samplers(r, &r->src[k], &W);
    r->plans_pending = 0;
    r->train = r->src[0].train;
    r->val = r->src[0].val;
    return rc ? rc : check_validation(r);
}

/* The datasets are recorded by absolute path, so that `sample-plan --run`
 * finds them from any directory (as given when realpath fails). A
 * mixture's sources are in the checkpoint's "mix" record instead of
 * "dataset". */
void tks__run_options_json(const run *r, char *out, size_t cap) {
    const tks_train_opts *o = &r->o;
    char ds[PATH_MAX], vds[PATH_MAX];
    if (!realpath(r->src[0].dir, ds)) snprintf(ds, sizeof ds, "%s", r->src[0].dir);
    if (o->val_dataset_dir && !realpath(o->val_dataset_dir, vds))
        snprintf(vds, sizeof vds, "%s", o->val_dataset_dir);
    json_t *j = json_pack("{s:I, s:i, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}",
                          "steps", (json_int_t)o->steps, "seq_len",
                          (int)o->seq_len, "global_batch", (json_int_t)o->global_batch,
                          "micro_batch", (json_int_t)r->micro, "seed", (json_int_t)o->seed, "lr",
                          (double)o->lr, "min_lr", (double)o->min_lr, "beta1", (double)o->beta1,
                          "beta2", (double)o->beta2, "adam_eps", (double)o->adam_eps,
                          "weight_decay", (double)o->weight_decay, "grad_clip",
                          (double)o->grad_clip, "warmup_steps", (json_int_t)o->warmup_steps,
                          "val_tokens", (json_int_t)o->val_tokens);
    if (j && !r->mixed) json_object_set_new(j, "dataset", json_string(ds));
    if (j && o->val_dataset_dir) json_object_set_new(j, "val_dataset", json_string(vds));
    if (j && o->doc_mask) json_object_set_new(j, "doc_mask", json_true());
    if (j && o->reset_positions) json_object_set_new(j, "reset_positions", json_true());
    if (j && tks__run_packing(o) == TKS_PACK_BEST_FIT) /* absent for concat: earlier checkpoints unchanged */
        json_object_set_new(j, "packing", json_string("best-fit"));
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9)) : NULL;
    snprintf(out, cap, "%s", t ? t : "{}");
    free(t);
    json_decref(j);
}

/* One setting of the resolved run that every rank must share. */
typedef struct {
    const char *flag;
    char value[48];
} run_field;

/* The resolved run as the settings that change what is trained: the data by
 * identity (manifest XXH3, not path: ranks may mount it in other places), the
 * checkpoint by its step. --threads and --out are left out (the results do
 * not depend on them; --out is used by rank 0 only). */
static size_t run_fields(const run *r, run_field *f) {
    const tks_train_opts *o = &r->o;
    const tks_model_config *c = &r->cfg;
    size_t n = 0;
#define RF(name, fmt, v) (f[n].flag = (name), snprintf(f[n].value, sizeof f[n].value, fmt, v), n++)
#define RU(name, v) RF(name, "%llu", (unsigned long long)(v))
#define RD(name, v) (f[n].flag = (name), tks_float_text(f[n].value, sizeof f[n].value, (v)), n++)
#define RS(name, v) RF(name, "%s", (v) ? (v) : "(default)")
    /* the data: the dataset's manifest, or a mixture's every source's and
     * the blend (its phases and weights) */
    uint64_t h = tks_dataset_manifest_xxh3(r->ds);
    if (r->mixed) {
        h = XXH3_64bits(&r->blend, sizeof r->blend);
        for (uint32_t k = 0; k < r->n_src; k++) {
            uint64_t mk = tks_dataset_manifest_xxh3(r->src[k].ds);
            h = XXH3_64bits_withSeed(&mk, sizeof mk, h);
        }
    }
    RF(r->mixed ? "--dataset (manifests and blend, XXH3)" : "--dataset (manifest XXH3)", "%016llx",
       (unsigned long long)h);
    RF("--val-dataset (manifest XXH3)", "%016llx",
       r->val_ds ? (unsigned long long)tks_dataset_manifest_xxh3(r->val_ds) : 0ull);
    RU("--resume (checkpoint step)", o->resume ? r->resumed.step : 0);
    RU("--vocab-size", c->vocab_size), RU("--vocab-divisible-by", c->vocab_divisible_by);
    RU("--dim", c->dim), RU("--n-layers", c->n_layers), RU("--n-heads", c->n_heads);
    RU("--n-kv-heads", c->n_kv_heads), RU("--ffn-dim", c->ffn_dim), RU("--max-seq-len", c->max_seq_len);
    RD("--rope-theta", c->rope_theta), RD("--norm-eps", c->norm_eps), RD("--init-std", c->init_std);
    RU("--tie-embeddings", c->tie_embeddings);
    RU("--steps", o->steps), RU("--stop-at", o->stop_at), RU("--seq-len", o->seq_len);
    RU("--global-batch", o->global_batch), RU("--micro-batch", o->micro_batch), RU("--seed", o->seed);
    RD("--lr", o->lr), RD("--min-lr", o->min_lr), RU("--warmup", o->warmup_steps);
    RD("--beta1", o->beta1), RD("--beta2", o->beta2), RD("--adam-eps", o->adam_eps);
    RD("--weight-decay", o->weight_decay), RD("--grad-clip", o->grad_clip);
    RU("--val-tokens", o->val_tokens), RU("--eval-every", o->eval_every);
    RU("--eval-batches", o->eval_batches), RU("--save-every", o->save_every);
    RU("--keep-checkpoints", o->keep_checkpoints), RS("--device", o->device);
    RS("--comm", o->comm), RS("--dtype", o->dtype), RU("--tp", o->tp), RU("--dp-shard", o->dp_shard);
    RU("--dp-replicate", o->dp_replicate);
    RU("--doc-mask", o->doc_mask), RU("--reset-positions", o->reset_positions);
    RU("--packing", tks__run_packing(o));
    RU("--warn-repeats", o->warn_repeats);
#undef RF
#undef RU
#undef RD
#undef RS
    return n;
}

/* Every rank mpirun started must train the same run: ranks launched with
 * different flags or datasets (an MPMD command line, a per-rank wrapper)
 * would otherwise train together and exit 0. Collective over the world. */
int tks__run_same(const run *r) {
    run_field f[64];
    uint64_t h[64];
    size_t n = run_fields(r, f), field;
    for (size_t i = 0; i < n; i++) h[i] = XXH3_64bits(f[i].value, strlen(f[i].value));
    int rank, others;
    if (!tks_mesh_world_same(h, n, &field, &rank, &others)) return 0;
    int world = 1, me = 0;
    tks_mesh_world(&world, &me);
    char *all = malloc((size_t)world * sizeof f[0].value);
    if (!all) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    tks_mesh_world_gather(f[field].value, sizeof f[0].value, all);
    int rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                      "the ranks were launched with different settings: %s is %s on rank 0 but %s "
                      "on rank %d%s; launch every rank with the same flags and dataset",
                      f[field].flag, all, all + (size_t)rank * sizeof f[0].value, rank,
                      others ? " (and on more ranks)" : "");
    free(all);
    return rc;
}
