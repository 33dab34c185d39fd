/* train.c - a training run: resolving and checking it, dry-run planning,
 * the batch loader, the training loop, evaluation and checkpoints along the
 * way. Generation is generate.c. */
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

#include "dataset/dataset.h"
#include "tokenizer/tokenizer.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/perf/memplan.h"
#include "trainer/model/optim.h"
#include "trainer/perf/profile.h"
#include "trainer/trainer.h"

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

/* ---- the resolved run ------------------------------------------------------- */

/* One source of the run: a dataset and its train and validation samplers
 * (a plain run has one, named after its directory). */
typedef struct source {
    char name[TKS_MIX_NAME_MAX];
    const char *dir;
    tks_dataset *ds;
    tks_sampler *train, *val;
} source;

typedef struct run {
    tks_train_opts o;             /* after resume overrides */
    uint32_t n_src;
    int mixed;                    /* named sources (a mixture, docs/SAMPLING.md §9) */
    source src[TKS_MIX_MAX_SOURCES];
    tks_blend blend;              /* which source each global sample comes from */
    tks_blend_state start;        /* the blend at the run's first cursor (a resume: the checkpoint's) */
    tks_dataset *ds, *val_ds;     /* ds: source 0's dataset */
    tks_sampler *train, *val;     /* source 0's samplers */
    tks_model_config cfg;
    tks_train_state resumed;      /* valid when o.resume */
    tks_mesh_shape shape;
    uint64_t per_rank, n_micro, micro; /* samples per dp rank per step, micro-batches, their size */
    tks_dtype dtype;              /* --dtype */
} run;

static void run_free(run *r) {
    for (uint32_t k = 0; k < r->n_src; k++) {
        tks_sampler_free(r->src[k].train);
        tks_sampler_free(r->src[k].val);
        tks_dataset_close(r->src[k].ds);
    }
    tks_dataset_close(r->val_ds);
}

/* The learning rate of 1-based step s under a schedule (tks_lr_at). */
static double lr_at(uint64_t s, double lr, double min_lr, uint64_t warmup, uint64_t steps) {
    tks_adamw_opts a = {.lr = (float)lr, .min_lr = (float)min_lr, .warmup = warmup, .total = steps};
    return tks_lr_at(&a, s - 1);
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
    uint64_t s = st->step + 1;
    return tks_fail(TKS_ERR_ARG, o->resume, TKS_NONE, TKS_NONE,
                    "the checkpoint %s was trained with --steps %llu --lr %g --min-lr %g --warmup %llu; "
                    "this run asks for --steps %llu --lr %g --min-lr %g --warmup %llu, so the "
                    "learning rate of step %llu would be %.3g instead of %.3g. Resume with the "
                    "checkpoint's values, or pass --change-schedule to continue on the new schedule",
                    o->resume, (unsigned long long)steps, lr, min_lr, (unsigned long long)warm,
                    (unsigned long long)o->steps, (double)o->lr, (double)o->min_lr,
                    (unsigned long long)o->warmup_steps, (unsigned long long)s,
                    lr_at(s, o->lr, o->min_lr, o->warmup_steps, o->steps),
                    lr_at(s, lr, min_lr, warm, steps));
}

/* --doc-mask and --reset-positions change what the model computes from the
 * same samples: a resumed run keeps the checkpoint's (absent: off). */
static int same_documents(const tks_train_opts *o, const tks_train_state *st) {
    json_t *j = json_loads(st->options_json, 0, NULL);
    int dm = json_is_true(json_object_get(j, "doc_mask")), rp = json_is_true(json_object_get(j, "reset_positions"));
    json_decref(j);
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

/* The resume checks of the checkpoint (tokenizer, dataset, schedule) and
 * its settings taken over: seq_len, seed, global batch, validation split. */
static int resume_checks(run *r) {
    tks_train_opts *o = &r->o;
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(r->ds);
    tks_model_config ck;
    int rc = tks_checkpoint_peek(o->resume, &ck, &r->resumed);
    if (rc) return rc;
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
    r->cfg = ck;                 /* the model is the checkpoint's */
    o->seq_len = r->resumed.seq_len;
    o->seed = r->resumed.seed;
    o->global_batch = r->resumed.global_batch;
    o->val_tokens = r->resumed.val_tokens;
    return 0;
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
        uint64_t seed = r->mixed ? tks_source_seed(o->seed, s->name) : o->seed; /* its own order */
        if ((rc = tks_sampler_create(s->ds, tr.begin, tr.end, o->seq_len, seed, &s->train))) return rc;
        if (va.end > va.begin)
            rc = tks_sampler_create(r->val_ds ? r->val_ds : s->ds, va.begin, va.end, o->seq_len, o->seed,
                                    &s->val);
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
    if (!o->eval_every || (!any && !o->val_dataset_dir)) return 0; /* no evaluation */
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

static int resolve(const tks_train_opts *in, run *r) {
    memset(r, 0, sizeof *r);
    r->o = *in;
    tks_train_opts *o = &r->o;
    int rc = open_sources(r);
    if (rc) return rc;
    const tks_tokenizer_info *ti = tks_dataset_tokenizer(r->ds);
    r->cfg = o->model;
    if (o->resume && (rc = resume_checks(r))) return rc;
    if ((rc = make_blend(r))) return rc;
    if (o->resume && (r->mixed || r->resumed.mix_json[0]) && (rc = resume_mixture(r))) return rc;
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
    return rc ? rc : check_validation(r);
}

/* ---- dry run ---------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void say(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(sbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) return;
        b->s = s;
        b->cap = cap;
    }
}

/* --deterministic on a backend whose fast paths are not (before its model) */
static int use_deterministic(const tks_train_opts *o, tks_backend *be) {
    return o->deterministic && be->kind->set_deterministic ? be->kind->set_deterministic(be, 1) : 0;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* The data lines of the plan: each source, the schedule, the windows. */
static void plan_data(sbuf *b, const run *r) {
    const uint64_t B = r->o.global_batch;
    for (uint32_t k = 0; k < r->n_src; k++) {
        const source *s = &r->src[k];
        uint64_t nw = tks_sampler_n_windows(s->train);
        if (!r->mixed)
            say(b, "  dataset        %s (%llu tokens in %zu shards, vocab %u)\n", s->dir,
                (unsigned long long)tks_dataset_n_tokens(s->ds), tks_dataset_n_shards(s->ds),
                tks_dataset_tokenizer(s->ds)->vocab_size);
        else
            say(b, "  source %-7s %s (%llu tokens in %zu shards, vocab %u), weight %g: %llu train "
                "windows, %llu validation\n", s->name, s->dir,
                (unsigned long long)tks_dataset_n_tokens(s->ds), tks_dataset_n_shards(s->ds),
                tks_dataset_tokenizer(s->ds)->vocab_size, r->o.mix->sources[k].weight,
                (unsigned long long)nw, (unsigned long long)(s->val ? tks_sampler_n_windows(s->val) : 0));
    }
    for (uint32_t p = 1; p < r->blend.n_phases; p++) {
        say(b, "  from step %llu (sample %llu):", (unsigned long long)(r->blend.start[p] / B + 1),
            (unsigned long long)r->blend.start[p]);
        for (uint32_t k = 0; k < r->n_src; k++)
            say(b, " %s %.4f", r->src[k].name, (double)r->blend.W[p][k] / (double)r->blend.S[p]);
        say(b, "\n");
    }
    if (!r->mixed)
        say(b, "  train windows  %llu (epoch = %.2f steps), validation windows %llu\n",
            (unsigned long long)tks_sampler_n_windows(r->train),
            (double)tks_sampler_n_windows(r->train) / (double)B,
            (unsigned long long)(r->val ? tks_sampler_n_windows(r->val) : 0));
    if (r->o.doc_mask || r->o.reset_positions)
        say(b, "  documents      %s%s%s (from the shards' document index)\n",
            r->o.doc_mask ? "attention inside each document (--doc-mask)" : "",
            r->o.doc_mask && r->o.reset_positions ? ", " : "",
            r->o.reset_positions ? "RoPE positions restart per document (--reset-positions)" : "");
}

/* The first steps' samples of the plan, per dp rank (the first four). */
static void plan_samples(sbuf *b, const run *r) {
    say(b, "first steps' samples (global sample -> %swindow: shard:offset)\n", r->mixed ? "source/" : "");
    uint32_t dp = (uint32_t)(r->shape.dp_replicate * r->shape.dp_shard);
    const uint64_t B = r->o.global_batch;
    tks_blend_pick pk[6];
    for (uint64_t s = 0; s < 2 && s < r->o.steps; s++) {
        say(b, "  step %llu:\n", (unsigned long long)((r->o.resume ? r->resumed.step : 0) + s + 1));
        for (uint32_t d = 0; d < dp && d < 4; d++) {
            uint64_t first, cnt;
            tks_sampler_rank_slice_at(r->start.sample + s * B, B, dp, d, &first, &cnt);
            uint64_t n = cnt < 6 ? cnt : 6;
            tks_blend_picks(&r->blend, &r->start, first, n, pk);
            say(b, "    dp rank %u (tp ranks read the same):", d);
            for (uint64_t i = 0; i < n; i++) {
                tks_sample_loc loc;
                const source *src = &r->src[pk[i].source];
                uint64_t w = tks_sampler_window(src->train, pk[i].index);
                tks_sampler_locate(src->train, w, &loc);
                say(b, " %llu->%s%s%llu:%u:%llu", (unsigned long long)(first + i), r->mixed ? src->name : "",
                    r->mixed ? "/" : "", (unsigned long long)w, loc.pieces[0].shard,
                    (unsigned long long)loc.pieces[0].offset);
            }
            say(b, cnt > 6 ? " ...\n" : "\n");
        }
        if (dp > 4) say(b, "    ... %u more dp ranks (tokshard sample-plan shows them all)\n", dp - 4);
    }
}

int tks_train_plan(const tks_train_opts *in, char **summary) {
    run r;
    /* under mpirun every rank plans: a failure on one rank is every rank's */
    int rc = in->world ? resolve(in, &r) : tks_mesh_world_agree(resolve(in, &r));
    if (rc || !summary) {
        run_free(&r);
        return rc;
    }
    const tks_model_config *c = &r.cfg;
    sbuf b = {0};
    uint64_t P = tks_model_n_params(c), VP = tks_model_padded_vocab(c, 1);
    uint64_t HD = c->dim / c->n_heads, N = r.micro * r.o.seq_len, T = r.o.seq_len;
    uint64_t Pp = P + (VP - c->vocab_size) * c->dim * (c->tie_embeddings ? 1 : 2);
    /* activations as the model allocates them (flash attention: linear in T),
     * with the workspace of the backend the run would use */
    tks_backend *pbe = NULL;
    rc = tks_backend_create(r.o.device, r.o.threads, &pbe);
    if (!rc && (rc = use_deterministic(&r.o, pbe))) pbe->ops->destroy(pbe);
    if (rc) {
        run_free(&r);
        return rc;
    }
    double act = (double)tks_model_activation_bytes(c, r.shape.tp, (int)r.micro, (int)T, r.dtype, pbe);
    /* one rank of this layout on this backend, and the comm it would use */
    tks_mem_plan mp;
    int comm_kind = 0;
    char mem_line[600] = "";
    rc = tks_mem_plan_make(c, &r.shape, (int)r.micro, (int)T, r.dtype, pbe, &mp);
    if (!rc) tks_mem_plan_format(&mp, mem_line, sizeof mem_line);
    if (!rc)
        rc = tks_mesh_comm_resolve(r.o.comm, pbe->kind,
                                   r.shape.dp_replicate * r.shape.dp_shard * r.shape.tp, &comm_kind);
    const char *be_name = pbe->kind->name;
    const tks_backend_kind *be_kind = pbe->kind;
    /* which attention runs, and which backward (--deterministic) */
    char attention[160] = "tokshard's own";
    if (!rc && be_kind->attention_name) be_kind->attention_name(pbe, r.dtype, attention, sizeof attention);
    pbe->ops->destroy(pbe);
    if (rc) {
        run_free(&r);
        return rc;
    }
    (void)N;
    double cw = r.dtype == TKS_F32 ? 0.0 : (double)tks_dtype_size(r.dtype) * (double)Pp;
    say(&b, "run\n");
    plan_data(&b, &r);
    if (r.o.resume)
        say(&b, "  resume         %s (step %llu, cursor %llu samples)\n", r.o.resume,
            (unsigned long long)r.resumed.step, (unsigned long long)r.resumed.cursor);
    say(&b, "  output         %s\n", r.o.out_dir ? r.o.out_dir : "(none)");
    say(&b, "  steps          %llu x %llu samples x %u tokens = %llu tokens/step\n",
        (unsigned long long)r.o.steps, (unsigned long long)r.o.global_batch, r.o.seq_len,
        (unsigned long long)(r.o.global_batch * r.o.seq_len));
    say(&b, "  micro-batches  %llu of %llu samples per step (gradient accumulation)\n",
        (unsigned long long)r.n_micro, (unsigned long long)r.micro);
    say(&b, "  optimizer      AdamW lr %g -> %g (warmup %llu, cosine), betas (%g, %g), eps %g, "
        "weight decay %g, clip %g\n", r.o.lr, r.o.min_lr, (unsigned long long)r.o.warmup_steps,
        r.o.beta1, r.o.beta2, r.o.adam_eps, r.o.weight_decay, r.o.grad_clip);
    say(&b, "model (LLaMA)\n  vocab_size     %u (padded to %llu inside the process; padding is "
        "masked and never saved)\n", c->vocab_size, (unsigned long long)VP);
    say(&b, "  dim %u, layers %u, heads %u, kv heads %u (head dim %llu), ffn %u, max_seq_len %u, "
        "rope_theta %g, eps %g, tied embeddings %s\n", c->dim, c->n_layers, c->n_heads,
        c->n_kv_heads, (unsigned long long)HD, c->ffn_dim, c->max_seq_len, c->rope_theta,
        c->norm_eps, c->tie_embeddings ? "yes" : "no");
    say(&b, "  parameters     %llu (%.2f M)\n", (unsigned long long)P, P / 1e6);
    say(&b, "memory estimate (%s, one process with tp %d)\n  weights %.1f MiB (fp32 master), "
        "compute copy %.1f MiB, gradients %.1f MiB, AdamW moments %.1f MiB, activations %.1f MiB "
        "(%.0f bytes); total %.1f MiB\n", tks_dtype_name(r.dtype), r.shape.tp, mib(4.0 * Pp), mib(cw),
        mib(4.0 * Pp), mib(8.0 * Pp), mib(act), act, mib(16.0 * Pp + cw + act));
    char *mesh = tks_mesh_describe(&r.shape);
    if (mesh) say(&b, "%s", mesh);
    free(mesh);
    say(&b, "  comm: %s\n",
        tks_mesh_comm_kind_name(comm_kind, be_kind, r.shape.dp_replicate * r.shape.dp_shard * r.shape.tp));
    say(&b, "  device memory per rank (%s backend): %s\n", be_name, mem_line);
    say(&b, "  attention: %s%s%s\n", attention, r.o.doc_mask ? "; block-causal per document" : "",
        r.o.deterministic ? "; --deterministic" : "");
    say(&b, "  per rank: vocab rows %llu (padded vocab %llu / tp %d), %u heads, %u kv heads, ffn %u; "
        "optimizer state %.1f MiB\n", (unsigned long long)(tks_model_padded_vocab(c, r.shape.tp) / (uint64_t)r.shape.tp),
        (unsigned long long)tks_model_padded_vocab(c, r.shape.tp), r.shape.tp, c->n_heads / (uint32_t)r.shape.tp,
        c->n_kv_heads / (uint32_t)r.shape.tp, c->ffn_dim / (uint32_t)r.shape.tp,
        mib(8.0 * Pp / r.shape.tp / r.shape.dp_shard));
    plan_samples(&b, &r);
    *summary = b.s;
    run_free(&r);
    return 0;
}

/* ---- training ----------------------------------------------------------------- */

static int mkdir_p(const char *d) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", d);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return tks_fail(TKS_ERR_IO, d, TKS_NONE, TKS_NONE, "cannot create %s: %s", d, strerror(errno));
    return 0;
}

/* The datasets are recorded by absolute path, so that `sample-plan --run`
 * finds them from any directory (as given when realpath fails). A
 * mixture's sources are in the checkpoint's "mix" record instead of
 * "dataset". */
static void options_json(const run *r, char *out, size_t cap) {
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
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9)) : NULL;
    snprintf(out, cap, "%s", t ? t : "{}");
    free(t);
    json_decref(j);
}

/* A checkpoint's record of a mixture at blend state `at` (st->mix_json). */
static int mix_record(const run *r, const tks_blend_state *at, tks_train_state *st) {
    if (!r->mixed) return 0;
    char (*abs)[PATH_MAX] = malloc(r->n_src * sizeof *abs);
    const char *dirs[TKS_MIX_MAX_SOURCES];
    uint64_t mx[TKS_MIX_MAX_SOURCES];
    if (!abs) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    for (uint32_t k = 0; k < r->n_src; k++) {
        if (!realpath(r->src[k].dir, abs[k])) snprintf(abs[k], sizeof abs[k], "%s", r->src[k].dir);
        dirs[k] = abs[k];
        mx[k] = tks_dataset_manifest_xxh3(r->src[k].ds);
    }
    int rc = tks_mix_record(r->o.mix, dirs, mx, at, st->mix_json, sizeof st->mix_json);
    free(abs);
    return rc;
}

/* The phase weights in force after `cursor` samples (the phase of the last
 * sample trained; the first phase before any), as fractions. */
static void weights_at(const run *r, uint64_t cursor, double *w) {
    uint32_t p = 0;
    while (p + 1 < r->blend.n_phases && r->blend.start[p + 1] < (cursor ? cursor : 1)) p++;
    for (uint32_t k = 0; k < r->n_src; k++) w[k] = (double)r->blend.W[p][k] / (double)r->blend.S[p];
}

/*
 * Validation loss: per source, the first eval_batches global batches of its
 * validation sampler (the same windows at every evaluation), split over the
 * data-parallel ranks like training batches; by_source[k] its mean token
 * loss (NAN without a validation window). Returns a plain run's loss, or a
 * mixture's mean of the sources' losses weighted by the weights in force
 * after `cursor` samples. doc: document starts scratch ([micro, seq_len]) or
 * NULL without documents. Collective.
 */
static double evaluate(run *r, tks_model *m, tks_mesh *mesh, uint64_t cursor, uint32_t *tok,
                       int32_t *ids, int32_t *tg, int32_t *doc, double *by_source, int *rc) {
    float acc[2 * TKS_MIX_MAX_SOURCES] = {0}; /* per source: loss sum, tokens */
    const uint64_t per = r->micro * (uint64_t)mesh->dp, T = r->o.seq_len;
    for (uint32_t k = 0; k < r->n_src && !*rc; k++) {
        tks_sampler *val = r->src[k].val;
        uint64_t nw = val ? tks_sampler_n_windows(val) : 0, total = r->o.eval_batches * r->o.global_batch;
        if (total > nw) total = nw;
        total -= total % per; /* whole rounds of every dp rank's micro-batch */
        for (uint64_t g = 0; g < total && !*rc; g += per) {
            double ls = 0;
            uint64_t first = g + (uint64_t)mesh->dp_rank * r->micro;
            for (uint64_t i = 0; i < r->micro && !*rc; i++)
                *rc = tks_sampler_load_row(val, first + i, r->cfg.vocab_size, tok, ids, tg, doc, i);
            *rc = tks_mesh_agree(mesh, *rc);
            if (!*rc && doc) *rc = tks_model_set_documents(m, doc, r->o.doc_mask, r->o.reset_positions);
            if (!*rc) *rc = tks_model_forward(m, ids, tg, &ls);
            acc[2 * k] += (float)ls;
            acc[2 * k + 1] += (float)(r->micro * T);
        }
    }
    if (!*rc && mesh->dp > 1) /* host data */
        *rc = tks_comm_host_sum(mesh->group[TKS_GROUP_DP], acc, 2 * (size_t)r->n_src);
    double w[TKS_MIX_MAX_SOURCES], num = 0, den = 0;
    weights_at(r, cursor, w);
    for (uint32_t k = 0; k < r->n_src; k++) {
        by_source[k] = acc[2 * k + 1] > 0 ? acc[2 * k] / acc[2 * k + 1] : NAN;
        if (isfinite(by_source[k]) && w[k] > 0) num += w[k] * by_source[k], den += w[k];
    }
    if (!r->mixed) return by_source[0];
    return den > 0 ? num / den : NAN;
}

/* The backend's device copy as the grad sync's copy hook (a failure is
 * sticky: the step's sync reports it). */
static void be_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    tks_backend *be = ctx;
    (void)be->ops->copy(be, dst, src, bytes);
}

/* Elements per gradient bucket: an eighth of this rank's slice, at least 4096
 * and at most 4 Mi (16 MiB of fp32, about what PyTorch DDP's 25 MB buckets
 * hold), so that small models still get several buckets to overlap. */
static size_t grad_bucket_elems(size_t n_slice) {
    size_t b = n_slice / 8;
    return b < 4096 ? 4096 : b > ((size_t)1 << 22) ? (size_t)1 << 22 : b;
}

/* Test hook (builds with TKS_TEST_HOOKS): TOKSHARD_TEST_NO_OVERLAP=1 starts
 * every gradient bucket after the backward instead of during it, so that a
 * test can show the two give bit-identical results. */
static int grad_overlap(void) {
#ifdef TKS_TEST_HOOKS
    const char *e = getenv("TOKSHARD_TEST_NO_OVERLAP");
    if (e && *e == '1') return 0;
#endif
    return 1;
}

static void comm_totals(tks_mesh *mesh, uint64_t out[4]) {
    memset(out, 0, 4 * sizeof *out);
    for (int k = 0; k < TKS_N_GROUPS; k++)
        for (int j = 0; j < 4; j++) out[j] += mesh->group[k]->bytes[j];
}

int tks_train_rank(void) {
    int w, r;
    return tks_mesh_world(&w, &r) ? 0 : r;
}

/* Refuses a run whose checkpoints directory already holds a step after the
 * one it starts from (`resume`: the checkpoint, NULL for a new run). */
static int no_later_checkpoint(const char *ckdir, uint64_t start, const char *resume) {
    char later[PATH_MAX];
    if (!tks_checkpoint_after(ckdir, start, later, sizeof later)) return 0;
    if (!resume)
        return tks_fail(TKS_ERR_EXISTS, later, TKS_NONE, TKS_NONE,
                        "%s exists: this run directory already holds checkpoints; continue it with "
                        "--resume latest, or choose another --out",
                        later);
    return tks_fail(TKS_ERR_EXISTS, later, TKS_NONE, TKS_NONE,
                    "%s is newer than the checkpoint this run resumes from (%s, step %llu): "
                    "training would stop when it reaches it. If it is damaged, move it (and any "
                    "newer step) out of the checkpoints directory, then resume again",
                    later, resume, (unsigned long long)start);
}

/* Rewrites metrics.jsonl (crash-safely) without the lines of steps after
 * `keep` and without a line cut by a kill; nothing to do when every line is
 * kept or there is no file. */
static int trim_metrics(const char *path, uint64_t keep) {
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                                                  "cannot read %s: %s", path, strerror(errno));
    char *line = NULL, *out = NULL;
    size_t cap = 0, n = 0, ocap = 0;
    ssize_t len;
    int dropped = 0, rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        json_t *j = line[len - 1] == '\n' ? json_loads(line, 0, NULL) : NULL;
        json_t *s = json_object_get(j, "step");
        int keep_it = json_is_integer(s) && json_integer_value(s) >= 0 &&
                      (uint64_t)json_integer_value(s) <= keep;
        json_decref(j);
        if (!keep_it) {
            dropped = 1;
            continue;
        }
        if (n + (size_t)len > ocap) {
            ocap = 2 * (n + (size_t)len) + 4096;
            char *o = realloc(out, ocap);
            if (!o) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
            else out = o;
        }
        if (!rc) memcpy(out + n, line, (size_t)len), n += (size_t)len;
    }
    fclose(f);
    free(line);
    if (!rc && dropped) rc = tks_write_file_atomic(path, out ? out : "", n);
    free(out);
    return rc;
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
static int same_run(const run *r) {
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

/* ---- one run of tks_train: open, step, record, save, close ------------------------ */

/* Everything a run holds between its steps. */
typedef struct trainer {
    run r;
    tks_train_opts *o; /* &r.o */
    tks_mesh *mesh;
    tks_backend *be;
    tks_model *m;
    tks_optim *opt;
    tks_adamw_opts ao;
    tks_grad_sync *gsync;
    float *gstage, *dred; /* device: gradient staging; the step's scalars [TKS_MEM_STEP_SCALARS] */
    double plan_bytes;    /* the memory plan's total for this rank (--dry-run's figure) */
    int lead, overlap, run_lock;
    double host_wait;     /* seconds the host spent blocked on the backend (sync, reads) */
    size_t n_slice, sb;   /* this rank's ZeRO slice of the tp-local flat buffer: [sb, sb + n_slice) */
    uint64_t step, cursor;
    tks_blend_state mix;  /* the blend after `cursor` samples: each source's count (the cursor of
                           * a mixture, saved with its checkpoints) */
    FILE *metrics;
    uint32_t *tok;        /* evaluation buffers */
    int32_t *ids, *tg, *doc; /* doc: document starts, NULL without --doc-mask/--reset-positions */
    char note[4096];      /* this step's log lines (sources starting an epoch) */
    tks_batch_loader *pf; /* the batch loader (sampler.h), NULL before the first step */
    int pf_slot;
    tks_train_state st;
    char ckdir[PATH_MAX], lock_path[PATH_MAX];
} trainer;

/* The run directory, before any device work: the checkpoint folder, the run
 * lock, no checkpoint past the start, metrics.jsonl cut back to the start. */
static int open_run_dir(trainer *t) {
    tks_train_opts *o = t->o;
    char path[PATH_MAX];
    int rc = 0;
    if (!o->out_dir) rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "--out RUN_DIR is required");
    if (!rc) rc = tks_path_join(t->ckdir, sizeof t->ckdir, o->out_dir, "checkpoints");
    if (!rc && t->lead) rc = mkdir_p(t->ckdir);
    /* one trainer per run directory: RUN/run.lock, held until the end */
    if (!rc && t->lead && (rc = tks_path_join(t->lock_path, sizeof t->lock_path, o->out_dir, "run.lock")) == 0)
        rc = tks_lock(t->lock_path, "tokshard-train", &t->run_lock);
    /* a later checkpoint would stop the run when it gets there, its compute
     * lost: refused now (the ranks agree in tks_mesh_use_backend) */
    uint64_t start = o->resume ? t->r.resumed.step : 0;
    if (!rc && t->lead) rc = no_later_checkpoint(t->ckdir, start, o->resume);
    /* metrics.jsonl keeps each step once: lines after the starting step (a run
     * that went on past its last checkpoint, or was killed in a save) go */
    if (!rc && t->lead && (rc = tks_path_join(path, sizeof path, o->out_dir, "metrics.jsonl")) == 0)
        rc = trim_metrics(path, start);
    return rc;
}

/* The backend, the mesh's groups on it, the model, the optimizer and the
 * gradient sync; on a shortage of memory, which buffers to shrink. */
static int open_compute(trainer *t, int rc) {
    tks_train_opts *o = t->o;
    run *r = &t->r;
    if (!rc) rc = tks_backend_create(o->device, o->threads, &t->be);
    if (!rc) rc = use_deterministic(o, t->be);
    /* the groups on the backend: NCCL communicators under --device cuda (--comm) */
    rc = tks_mesh_use_backend(t->mesh, t->be, o->comm, rc);
    tks_mesh *mesh = t->mesh;
    tks_backend *be = t->be;
    if (!rc)
        rc = tks_model_create_dt(&r->cfg, be, mesh->group[TKS_GROUP_TP], (int)r->micro, (int)o->seq_len,
                                 (size_t)mesh->shape.dp_shard, r->dtype, &t->m);
    t->ao = (tks_adamw_opts){.lr = o->lr, .min_lr = o->min_lr, .warmup = o->warmup_steps,
                             .total = o->steps, .beta1 = o->beta1, .beta2 = o->beta2,
                             .eps = o->adam_eps, .weight_decay = o->weight_decay,
                             .grad_clip = o->grad_clip};
    size_t n_flat = t->m ? tks_model_n_flat(t->m) : 0;
    t->n_slice = n_flat / (size_t)mesh->shape.dp_shard;
    t->sb = (size_t)mesh->shard * t->n_slice;
    if (!rc) rc = tks_optim_create(t->m, &t->ao, t->sb, t->sb + t->n_slice, &t->opt);
    /* gradient sync over dp_shard and dp_replicate in buckets that the
     * backward starts as their gradients complete (mesh.h) */
    size_t n_stage = tks_mem_grad_stage_elems(&mesh->shape, n_flat);
    if (!rc && n_stage && !(t->gstage = be->ops->alloc(be, n_stage * sizeof *t->gstage)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                      "out of memory for the gradient staging buffer (%zu floats)", n_stage);
    if (!rc && mesh->dp > 1)
        rc = tks_grad_sync_create(mesh, tks_model_grads(t->m), n_flat, grad_bucket_elems(t->n_slice),
                                  t->gstage, be_copy, be, &t->gsync);
    t->overlap = grad_overlap();
    /* the step's device scalars: [0] gradient sum of squares, [1] loss sum, [2] stop flag */
    if (!rc && !(t->dred = be->ops->alloc(be, TKS_MEM_STEP_SCALARS * sizeof *t->dred)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    /* the plan of what was just allocated, for metrics.jsonl beside the real figure */
    tks_mem_plan plan;
    if (!rc && !tks_mem_plan_make(&r->cfg, &r->shape, (int)r->micro, (int)o->seq_len, r->dtype, be, &plan))
        t->plan_bytes = plan.total;
    /* which buffers to shrink, and how */
    if (rc == TKS_ERR_NOMEM && be)
        rc = tks_mem_explain_nomem(&r->cfg, &r->shape, (int)r->micro, (int)o->seq_len, r->dtype, be);
    return rc;
}

/* Resolves the run, builds the mesh, the run directory, the model and its
 * state (fresh or resumed), the batch loader and metrics.jsonl. Collective
 * over the world; on error the caller still calls close_run. */
static int open_run(const tks_train_opts *in, trainer *t) {
    memset(t, 0, sizeof *t);
    t->run_lock = -1;
    t->o = &t->r.o;
    /* every rank learns whether every rank could resolve the run before any
     * collective (a corrupt checkpoint or dataset on one rank only), then
     * that they all resolved the same run */
    int rc = tks_mesh_world_agree(resolve(in, &t->r));
    if (!rc) rc = same_run(&t->r);
    if (!rc) rc = tks_mesh_create(&t->r.shape, &t->mesh);
    if (rc) return rc;
    run *r = &t->r;
    tks_train_opts *o = t->o;
    t->lead = t->mesh->rank == 0;
    rc = open_compute(t, open_run_dir(t));
    t->mix = r->start;
    if (!rc && o->resume) {
        rc = tks_checkpoint_load(o->resume, t->m, t->opt);
        if (!rc) rc = tks_model_refresh_compute(t->m);
        t->step = r->resumed.step;
        t->cursor = r->resumed.cursor;
    } else if (!rc) {
        tks_model_init(t->m, o->seed);
    }
    size_t N = (size_t)(r->micro * o->seq_len);
    t->tok = malloc((o->seq_len + 1) * sizeof *t->tok);
    t->ids = malloc(N * sizeof *t->ids);
    t->tg = malloc(N * sizeof *t->tg);
    int docs = o->doc_mask || o->reset_positions;
    if (docs) t->doc = malloc(N * sizeof *t->doc);
    if (!rc && (!t->tok || !t->ids || !t->tg || (docs && !t->doc)))
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    char path[PATH_MAX];
    if (!rc && t->lead && (rc = tks_path_join(path, sizeof path, o->out_dir, "metrics.jsonl")) == 0 &&
        !(t->metrics = fopen(path, "a")))
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot open %s: %s", path, strerror(errno));
    rc = tks_mesh_agree(t->mesh, rc);
    t->st = (tks_train_state){.seed = o->seed, .seq_len = o->seq_len, .global_batch = o->global_batch,
                              .val_tokens = o->val_tokens,
                              .manifest_xxh3 = r->ds ? tks_dataset_manifest_xxh3(r->ds) : 0};
    if (r->ds) memcpy(t->st.tokenizer_fp, tks_dataset_tokenizer(r->ds)->fingerprint, 16);
    options_json(r, t->st.options_json, sizeof t->st.options_json);
    if (!rc && t->step < o->steps) {
        tks_loader_config lc = {.blend = &r->blend, .vocab = r->cfg.vocab_size, .seq_len = o->seq_len,
                                .global_batch = o->global_batch, .micro = r->micro,
                                .dp = (uint32_t)t->mesh->dp, .dp_rank = (uint32_t)t->mesh->dp_rank,
                                .documents = o->doc_mask || o->reset_positions};
        for (uint32_t k = 0; k < r->n_src; k++) lc.train[k] = r->src[k].train;
        rc = tks_loader_open(&lc, &t->pf);
        if (!rc) tks_loader_start(t->pf, t->cursor, &t->mix, 0, t->pf_slot);
        rc = tks_mesh_agree(t->mesh, rc);
    }
    return rc;
}

static void close_run(trainer *t) {
    tks_backend *be = t->be;
    tks_loader_close(t->pf);
    if (t->metrics) fclose(t->metrics);
    tks_unlock(t->run_lock, t->lock_path);
    free(t->tok);
    free(t->ids);
    free(t->tg);
    free(t->doc);
    tks_grad_sync_free(t->gsync);
    if (t->gstage) be->ops->free(be, t->gstage);
    if (t->dred) be->ops->free(be, t->dred);
    tks_optim_free(t->opt);
    tks_model_free(t->m);
    tks_profile_detach(be);
    tks_mesh_free(t->mesh); /* its device groups before the backend they run on */
    if (be) be->ops->destroy(be);
    run_free(&t->r);
}

/* Forward and backward of every micro-batch of the step, with the gradient
 * buckets of the last backward started as their layers complete. */
static int step_micro_batches(trainer *t, float scale) {
    run *r = &t->r;
    tks_batch_loader *pf = t->pf;
    int rc = 0;
    for (uint64_t k = 0; k < r->n_micro && !rc; k++) {
        rc = tks_loader_wait(pf); /* micro-batch k of this step, loaded and range-checked */
        int cur = t->pf_slot;
        /* stage the next one while this one computes */
        if (k + 1 < r->n_micro) {
            tks_loader_start(pf, t->cursor, &t->mix, k + 1, t->pf_slot = 1 - cur);
        } else if (t->step + 1 < t->o->steps) { /* the next step's, from the blend after this one */
            tks_blend_state next = t->mix;
            tks_blend_seek(&r->blend, &next, t->cursor + t->o->global_batch);
            tks_loader_start(pf, t->cursor + t->o->global_batch, &next, 0, t->pf_slot = 1 - cur);
        }
        /* a bad batch on any rank stops every rank, before any compute on it */
        rc = tks_mesh_agree(t->mesh, rc);
        tks_loaded_batch b = tks_loader_batch(pf, cur);
        if (!rc && b.doc) rc = tks_model_set_documents(t->m, b.doc, t->o->doc_mask, t->o->reset_positions);
        /* the loss is summed on the device; read once, after the step */
        if (!rc) rc = tks_model_forward_train(t->m, b.ids, b.targets, scale, t->dred + 1);
        /* the last micro-batch's backward starts the gradient buckets
         * as each layer completes (overlap) */
        tks_model_set_grads_ready(t->m, t->gsync && t->overlap && k + 1 == r->n_micro ? tks_grad_sync_hook : NULL,
                                  t->gsync);
        if (!rc) rc = tks_model_backward(t->m, scale);
    }
    tks_model_set_grads_ready(t->m, NULL, NULL);
    return rc;
}

/* A non-finite gradient norm: the optimizer skipped the update; the error
 * says where to resume from. */
static int diverged(const trainer *t, double gnorm, float loss) {
    char last[PATH_MAX];
    unsigned long long s = (unsigned long long)t->step + 1;
    if (tks_checkpoint_latest(t->ckdir, last, sizeof last) == 0)
        return tks_fail(TKS_ERR_NONFINITE, t->ckdir, TKS_NONE, TKS_NONE,
                        "step %llu: the gradient norm is %g (loss %g): training diverged; "
                        "resume from %s with a lower --lr and --change-schedule (or a lower "
                        "--grad-clip or a longer --warmup)",
                        s, gnorm, (double)loss, last);
    return tks_fail(TKS_ERR_NONFINITE, t->ckdir, TKS_NONE, TKS_NONE,
                    "step %llu: the gradient norm is %g (loss %g): training diverged "
                    "before any checkpoint was saved; start again with a lower --lr (or "
                    "a lower --grad-clip, a longer --warmup, or --save-every to keep "
                    "checkpoints along the way)",
                    s, gnorm, (double)loss);
}

/* One optimizer step: micro-batches, gradient sync, the step's scalars in
 * one world all-reduce, AdamW, the weights gathered back. Fills red[0..2]
 * (gradient sum of squares, mean loss, stop count) and *lr. Agreed over the
 * world. */
static int train_step(trainer *t, float red[3], float *lr) {
    tks_mesh *mesh = t->mesh;
    tks_backend *be = t->be;
    tks_comm *world = mesh->group[TKS_GROUP_WORLD], *shc = mesh->group[TKS_GROUP_DP_SHARD];
    double tokens_step = (double)(t->o->global_batch * t->o->seq_len);
    tks_model_zero_grad(t->m);
    int rc = be->ops->memzero(be, t->dred, 4 * sizeof *t->dred);
    if (t->gsync) tks_grad_sync_begin(t->gsync);
    if (!rc) rc = step_micro_batches(t, (float)(1.0 / tokens_step));
    /* gradients: reduce-scatter in dp_shard, all-reduce in dp_replicate
     * (HSDP), in place: what the backward did not start starts here. Every
     * rank gets here whatever rc, so every rank enters every bucket. */
    if (t->gsync) {
        int r2 = tks_grad_sync_end(t->gsync);
        if (!rc) rc = r2;
    }
    /* The step's scalars in ONE world all-reduce of dred[0..2] =
     * [gradient sum of squares, loss sum, stop count]: each rank adds only
     * what it owns, so the world sum counts everything once.
     *  - sumsq: this rank's dp_shard slice of its tp shard, on replica 0
     *    only (the replicas hold the same synchronised slices); tensors
     *    replicated over tp (RMSNorm weights) on tp rank 0 only;
     *  - loss: tp rank 0 only (every tp rank of a group computed the same
     *    per-token losses); each dp rank its own samples;
     *  - stop: 1 where this rank was asked to stop (a count).
     * The gradient norm stays on the device: the optimizer reads it there
     * to clip; the host reads it with the loss after the step. */
    float *dred = t->dred;
    if (!rc && mesh->rep == 0) rc = tks_optim_grad_sumsq(t->opt, dred, mesh->tp_rank == 0);
    if (!rc && mesh->tp_rank != 0) rc = be->ops->memzero(be, dred + 1, sizeof *dred);
    float stop = t->o->stop && *t->o->stop ? 1.0f : 0.0f;
    if (!rc) rc = be->ops->upload(be, dred + 2, &stop, sizeof stop);
    if (!rc && world->size > 1) rc = world->allreduce_sum(world, dred, 3);
    *lr = tks_lr_at(&t->ao, t->step);
    if (!rc) rc = tks_optim_step_dev(t->opt, (int64_t)t->step + 1, *lr, dred);
    if (!rc) {
        double w0 = omp_get_wtime();
        rc = be->ops->download(be, red, dred, 3 * sizeof *red);
        if (!rc) rc = be->ops->sync(be);
        t->host_wait += omp_get_wtime() - w0;
    }
    if ((rc = tks_mesh_agree(mesh, rc))) return rc;
    red[1] = (float)((double)red[1] / tokens_step);
    double gnorm = sqrt((double)red[0]);
    if (!isfinite(gnorm)) return diverged(t, gnorm, red[1]);
    float *w = tks_model_weights(t->m);
    if (shc->size > 1) rc = shc->allgather(shc, w, w + t->sb, t->n_slice);
    if (!rc && shc->size > 1) rc = tks_model_refresh_compute(t->m);
    return tks_mesh_agree(mesh, rc);
}

/* The step's line of metrics.jsonl (rank 0). */
static void write_metrics(trainer *t, const tks_step_info *info) {
    FILE *f = t->metrics;
    if (!f) return;
    fprintf(f, "{\"step\": %llu, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
            "\"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"host_wait_s\": %.6f",
            (unsigned long long)info->step, info->loss, info->lr, info->grad_norm, info->tokens_per_s,
            info->elapsed_s, info->host_wait_s);
    if (t->mesh->world > 1) /* rank 0's payload bytes per collective kind this step */
        fprintf(f, ", \"comm_bytes\": {\"allreduce\": %llu, \"reduce_scatter\": %llu, "
                "\"allgather\": %llu}", (unsigned long long)info->comm_bytes[TKS_COLL_ALLREDUCE],
                (unsigned long long)info->comm_bytes[TKS_COLL_REDUCE_SCATTER],
                (unsigned long long)info->comm_bytes[TKS_COLL_ALLGATHER]);
    if (t->gsync) /* gradient buckets this rank started during the backward (overlap) */
        fprintf(f, ", \"grad_buckets_early\": %zu", tks_grad_sync_started_early(t->gsync));
    const tks_backend_kind *k = t->be->kind;
    if (k->memory) { /* rank 0's device bytes at most so far (alloc's peak and the backend's own) and the plan */
        size_t now = 0, peak = 0;
        k->memory(t->be, &now, &peak);
        double held = (double)peak + (k->reserved ? (double)k->reserved(t->be) : 0.0);
        fprintf(f, ", \"device_bytes\": %.0f, \"plan_bytes\": %.0f", held, t->plan_bytes);
    }
    fputs("}\n", f);
}

/* Saves RUN/checkpoints/step-%08llu of the current step into ck (PATH_MAX).
 * if_absent: keep one that exists already (a run resumed at its last step).
 * Agreed over the world. */
static int save_checkpoint(trainer *t, char *ck, int if_absent, int prune) {
    char name[32];
    snprintf(name, sizeof name, "step-%08llu", (unsigned long long)t->step);
    t->st.step = t->step;
    t->st.cursor = t->cursor;
    int rc = mix_record(&t->r, &t->mix, &t->st);
    if (!rc) rc = tks_path_join(ck, PATH_MAX, t->ckdir, name);
    if (!rc && if_absent) {
        tks_comm *world = t->mesh->group[TKS_GROUP_WORLD];
        struct stat sbuf;
        float exists = (float)(t->lead && stat(ck, &sbuf) == 0);
        if (world->size > 1) rc = world->broadcast_bytes(world, &exists, sizeof exists, 0); /* host data */
        if (!rc && exists != 0) return tks_mesh_agree(t->mesh, rc);
    }
    if (!rc) rc = tks_checkpoint_save(ck, t->m, t->opt, &t->st, tks_dataset_tokenizer_path(t->r.ds), t->mesh);
    if (!rc && prune && t->lead) rc = tks_checkpoint_prune(t->ckdir, t->o->keep_checkpoints);
    return tks_mesh_agree(t->mesh, rc);
}

/* The blend advanced over the step just done (t->mix to t->cursor), and
 * t->note: a line for each source that started a new epoch in it (its own
 * epochs: count / windows), a warning where one is now repeated more than
 * --warn-repeats times. */
static void epoch_notes(trainer *t) {
    const run *r = &t->r;
    tks_blend_state before = t->mix;
    tks_blend_seek(&r->blend, &t->mix, t->cursor);
    size_t n = 0;
    t->note[0] = 0;
    for (uint32_t k = 0; k < r->n_src && n < sizeof t->note; k++) {
        uint64_t nw = tks_sampler_n_windows(r->src[k].train), a = t->mix.count[k], b = before.count[k];
        if (a == b || a == 0) continue;
        uint64_t e = (a - 1) / nw; /* the 0-based epoch of the last sample read */
        if (b > 0 && (b - 1) / nw == e) continue;
        if (e == 0) continue;      /* the first epoch starts with the run */
        n += (size_t)snprintf(t->note + n, sizeof t->note - n,
                              "%s%s starts epoch %llu at step %llu (its %llu windows read %llu "
                              "time%s so far)\n", r->mixed ? "source " : "dataset ", r->src[k].name,
                              (unsigned long long)e + 1, (unsigned long long)t->step,
                              (unsigned long long)nw, (unsigned long long)e, e == 1 ? "" : "s");
        if (e > t->o->warn_repeats && n < sizeof t->note)
            n += (size_t)snprintf(t->note + n, sizeof t->note - n,
                                  "warning: %s is now repeated %llu times, more than --warn-repeats %llu "
                                  "(returns of repeated data fall off after about 4 epochs: "
                                  "Muennighoff et al. 2023); add data, lower its weight, or raise "
                                  "--warn-repeats\n", r->src[k].name, (unsigned long long)e,
                                  (unsigned long long)t->o->warn_repeats);
    }
}

/* 1 when some source holds validation windows. */
static int has_validation(const run *r) {
    for (uint32_t k = 0; k < r->n_src; k++)
        if (r->src[k].val) return 1;
    return 0;
}

/* The evaluation's line of metrics.jsonl (rank 0): the loss, and a
 * mixture's loss per source (null where a source has no validation window). */
static void write_val_metrics(trainer *t, const tks_step_info *info) {
    FILE *f = t->metrics;
    if (!f) return;
    fprintf(f, "{\"step\": %llu, \"val_loss\": ", (unsigned long long)info->step);
    if (isfinite(info->val_loss)) fprintf(f, "%.6f", info->val_loss); /* never a bare nan: not JSON */
    else fputs("null", f);
    if (info->n_sources) {
        fputs(", \"val_loss_by_source\": {", f);
        for (uint32_t k = 0; k < info->n_sources; k++) {
            fprintf(f, "%s\"%s\": ", k ? ", " : "", info->source_names[k]);
            if (isfinite(info->val_by_source[k])) fprintf(f, "%.6f", info->val_by_source[k]);
            else fputs("null", f);
        }
        fputs("}", f);
    }
    fputs("}\n", f);
}

/* --profile: rank 0's table of the steps profiled so far, to on_profile. */
static void profile_report(trainer *t, uint64_t steps) {
    tks_profile_count(0);
    char *table = tks_profile_report(steps);
    if (t->lead && table && t->o->on_profile) t->o->on_profile(table, t->o->ctx);
    free(table);
}

/* --profile: the ops behind timing wrappers, each call priced on the
 * roofline asked for, or the preset of the GPU's name (none on the CPU) */
static int profile_attach(trainer *t) {
    tks_roofline hw, *use = NULL;
    if (t->o->roofline) {
        if (tks_roofline_parse(t->o->roofline, &hw)) return -1;
        use = &hw;
    } else if (t->be->kind != &tks_cpu_backend_kind && t->be->kind->describe) {
        char desc[512] = "";
        t->be->kind->describe(t->be, desc, sizeof desc);
        if (tks_roofline_for_device(desc, &hw)) use = &hw;
    }
    return tks_profile_attach(t->be, use);
}

int tks_train(const tks_train_opts *in) {
    trainer t;
    int rc = open_run(in, &t);
    tks_train_opts *o = t.o;
    if (o->profile_steps && t.be) rc = tks_mesh_agree(t.mesh, rc ? rc : profile_attach(&t));
    double t_start = omp_get_wtime(), tokens_step = (double)(o->global_batch * o->seq_len);
    uint64_t first_step = t.step, saved_step = UINT64_MAX, comm0[4], profiled = 0;
    while (!rc && t.step < o->steps) {
        double t0 = omp_get_wtime();
        float red[3], lr;
        comm_totals(t.mesh, comm0);
        int profiling = profiled < o->profile_steps;
        tks_profile_count(profiling);
        rc = train_step(&t, red, &lr);
        tks_profile_count(0);
        if (rc) break;
        int report = profiling && ++profiled == o->profile_steps;
        t.step++;
        t.cursor += o->global_batch;
        epoch_notes(&t);
        double now = omp_get_wtime();
        tks_step_info info = {.step = t.step, .steps = o->steps, .loss = red[1],
                              .lr = lr, .grad_norm = sqrt((double)red[0]),
                              .tokens_per_s = tokens_step / (now - t0),
                              .elapsed_s = now - t_start, .host_wait_s = t.host_wait};
        comm_totals(t.mesh, info.comm_bytes);
        for (int j = 0; j < 4; j++) info.comm_bytes[j] -= comm0[j];
        if (t.note[0]) info.note = t.note, info.note_is_warning = strstr(t.note, "warning") != NULL;
        info.eta_s = info.elapsed_s / (double)(t.step - first_step) * (double)(o->steps - t.step);
        write_metrics(&t, &info);
        int last = t.step == o->steps, stopping = red[2] > 0 || (o->stop_at && t.step >= o->stop_at);
        double by_source[TKS_MIX_MAX_SOURCES];
        const char *names[TKS_MIX_MAX_SOURCES];
        if (has_validation(&t.r) && o->eval_every && (t.step % o->eval_every == 0 || last)) {
            info.is_eval = 1;
            /* the loader reads the same dataset: let its batch land first (kept) */
            if (t.pf) (void)tks_loader_wait(t.pf);
            info.val_loss = evaluate(&t.r, t.m, t.mesh, t.cursor, t.tok, t.ids, t.tg, t.doc, by_source, &rc);
            if (rc) break;
            if (t.r.mixed) {
                for (uint32_t k = 0; k < t.r.n_src; k++) names[k] = t.r.src[k].name;
                info.n_sources = t.r.n_src, info.source_names = names, info.val_by_source = by_source;
            }
            write_val_metrics(&t, &info);
        }
        if (t.metrics) fflush(t.metrics);
        char ck[PATH_MAX] = "";
        if (last || stopping || (o->save_every && t.step % o->save_every == 0)) {
            if ((rc = save_checkpoint(&t, ck, 0, 1))) break;
            info.checkpoint = ck;
            saved_step = t.step;
        }
        if (o->on_step && t.lead) o->on_step(&info, o->ctx);
        if (report) profile_report(&t, profiled);
        if (stopping) break;
    }
    if (!rc && profiled && profiled < o->profile_steps) profile_report(&t, profiled);
    /* a run that ends (or resumes) at its last step always leaves that state in --out */
    if (!rc && t.step == o->steps && saved_step != t.step) {
        char ck[PATH_MAX];
        rc = save_checkpoint(&t, ck, 1, 0);
    }
    close_run(&t);
    return rc;
}

int tks_train_latest_checkpoint(const char *run_dir, char *out, size_t cap) {
    char ck[PATH_MAX];
    int rc = tks_path_join(ck, sizeof ck, run_dir, "checkpoints");
    return rc ? rc : tks_checkpoint_latest(ck, out, cap);
}
