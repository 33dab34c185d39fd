/* run.h - the resolved run that the files of trainer/run/ share: its sources,
 * samplers, blend, model shape and mesh shape (private to trainer/run/). */
#ifndef TKS_TRAINER_RUN_H
#define TKS_TRAINER_RUN_H

#include <stdint.h>

#include "dataset/dataset.h"
#include "tokenizer/tokenizer.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/perf/memplan.h"
#include "trainer/model/optim.h"
#include "trainer/perf/profile.h"
#include "trainer/trainer.h"

/* One source of the run: a dataset and its train and validation samplers
 * (a plain run has one, named after its directory). */
typedef struct source {
    char name[TKS_MIX_NAME_MAX];
    const char *dir;
    tks_dataset *ds;
    tks_sampler *train, *val;
    tks_token_range train_range, val_range; /* what they sample */
    uint64_t seed;                /* the train sampler's (a mixture: the source's own) */
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
    int plans_pending;            /* best-fit samplers wait for tks__run_plans (plan files) */
    int eval_only;                /* resolved for tks_train_eval: a resume's training checks off */
} run;

/* The run of options `in` resolved (defaults, a resume's checkpoint) and
 * checked, its datasets opened and samplers made (resolve.c). eval_only:
 * for an evaluation of the checkpoint in->resume (tks_train_eval): of the
 * resume's checks only the tokenizer's (dataset, schedule, packing,
 * documents and a mixture's sources are the evaluation's to choose), the
 * sampling flags given replace the checkpoint's, and validation windows
 * are required. Errors: the refusal of any check, naming the flag or the
 * dataset. */
int tks__run_resolve(const tks_train_opts *in, int eval_only, run *r);

/* The best-fit samplers whose plans live in files (o.pack_plans), made after
 * every rank resolved the same run: collective over the world unless
 * o.world (a dry run); then the validation check. A no-op otherwise. */
int tks__run_plans(run *r);

/* The packing --packing names (concat when NULL). */
tks_packing tks__run_packing(const tks_train_opts *o);

/* Closes what tks__run_resolve opened. */
void tks__run_free(run *r);

/* Errors unless every rank resolved the same run (the settings that change
 * what is trained). Collective over the mesh's world. */
int tks__run_same(const run *r);

/* The run's options as the checkpoint records them (JSON, into out[cap]). */
void tks__run_options_json(const run *r, char *out, size_t cap);

/* Deterministic kernels on `be` when the options ask for them (plan.c). */
int tks__run_use_deterministic(const tks_train_opts *o, tks_backend *be);

/* 1 when some source holds validation windows (eval.c). */
int tks__run_has_validation(const run *r);

/* The validation loss at `cursor` (eval.c): the weighted mean over the
 * sources (a plain run: its one source), each source's into by_source;
 * counts (may be NULL): per source k, counts[2k] the windows evaluated and
 * counts[2k+1] the targets (every rank's); *rc the error. tok, ids, tg,
 * doc: [micro, seq_len] scratch, doc NULL without documents. Collective. */
double tks__run_evaluate(run *r, tks_model *m, tks_mesh *mesh, uint64_t cursor, uint32_t *tok,
                         int32_t *ids, int32_t *tg, int32_t *doc, double *by_source, uint64_t *counts,
                         int *rc);

#endif /* TKS_TRAINER_RUN_H */
