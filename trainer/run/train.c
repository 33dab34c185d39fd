/* train.c - the training loop: opening a run, its steps, metrics,
 * checkpoints along the way, and closing it. Resolving the run is resolve.c,
 * the dry run plan.c, evaluation eval.c, generation generate.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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

/* ---- training ----------------------------------------------------------------- */

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
    uint64_t step;
    FILE *metrics;
    uint32_t *tok;        /* evaluation buffers */
    int32_t *ids, *tg, *doc; /* doc: document starts, NULL without --doc-mask/--reset-positions */
    char note[4096];      /* this step's log lines (sources starting an epoch) */
    tks_batch_loader *pf; /* the batch loader (sampler.h): the data cursor and the blend there */
    tks_train_state st;
    tks_checkpoint_tokenizer *ck_tok; /* what the checkpoints copy of the tokenizer (rank 0) */
    char ckdir[PATH_MAX], lock_path[PATH_MAX];
    char plans_dir[PATH_MAX];     /* RUN/plans: --pack-plans' default */
} trainer;

/* The run directory, before any device work: the checkpoint folder, the run
 * lock, no checkpoint past the start, metrics.jsonl cut back to the start. */
static int open_run_dir(trainer *t) {
    tks_train_opts *o = t->o;
    char path[PATH_MAX];
    int rc = 0;
    if (!o->out_dir) rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "--out RUN_DIR is required");
    if (!rc) rc = tks_path_join(t->ckdir, sizeof t->ckdir, o->out_dir, "checkpoints");
    if (!rc && t->lead) rc = tks_mkdir_p(t->ckdir);
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
    if (!rc) rc = tks__run_use_deterministic(o, t->be);
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
    tks_train_opts opts = *in;
    int rc = 0;
    if (opts.packing && !strcmp(opts.packing, "best-fit") && !opts.pack_plans && opts.out_dir) {
        rc = tks_path_join(t->plans_dir, sizeof t->plans_dir, opts.out_dir, "plans"); /* beside the run */
        opts.pack_plans = t->plans_dir;
    }
    rc = tks_mesh_world_agree(rc ? rc : tks__run_resolve(&opts, 0, &t->r));
    if (!rc) rc = tks__run_same(&t->r);
    /* best-fit plan files, made by the ranks together when missing */
    if (!rc) rc = tks_mesh_world_agree(tks__run_plans(&t->r));
    if (!rc) rc = tks_mesh_create(&t->r.shape, &t->mesh);
    if (rc) return rc;
    run *r = &t->r;
    tks_train_opts *o = t->o;
    t->lead = t->mesh->rank == 0;
    rc = open_compute(t, open_run_dir(t));
    if (!rc && o->resume) {
        rc = tks_checkpoint_load(o->resume, t->m, t->opt);
        if (!rc) rc = tks_model_refresh_compute(t->m);
        t->step = r->resumed.step;
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
    int mfd = -1;
    if (!rc && t->lead && (rc = tks_path_join(path, sizeof path, o->out_dir, "metrics.jsonl")) == 0 &&
        (rc = tks_open_own(path, O_WRONLY | O_CREAT | O_APPEND, "metrics file", &mfd)) == 0 &&
        !(t->metrics = fdopen(mfd, "a"))) {
        rc = tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "cannot open %s: %s", path, strerror(errno));
        close(mfd);
    }
    /* the tokenizer the checkpoints copy, parsed once for the whole run (the writer's) */
    if (!rc && t->lead && r->ds) rc = tks_checkpoint_tokenizer_open(tks_dataset_tokenizer_path(r->ds), &t->ck_tok);
    rc = tks_mesh_agree(t->mesh, rc);
    t->st = (tks_train_state){.seed = o->seed, .seq_len = o->seq_len, .global_batch = o->global_batch,
                              .val_tokens = o->val_tokens,
                              .manifest_xxh3 = r->ds ? tks_dataset_manifest_xxh3(r->ds) : 0};
    if (r->ds) memcpy(t->st.tokenizer_fp, tks_dataset_tokenizer(r->ds)->fingerprint, 16);
    tks__run_options_json(r, t->st.options_json, sizeof t->st.options_json);
    if (!rc) { /* the steps left from the run's first cursor (a resume: the checkpoint's) */
        tks_loader_config lc = {.blend = &r->blend, .vocab = r->cfg.vocab_size, .seq_len = o->seq_len,
                                .global_batch = o->global_batch, .micro = r->micro,
                                .dp = (uint32_t)t->mesh->dp, .dp_rank = (uint32_t)t->mesh->dp_rank,
                                .documents = o->doc_mask || o->reset_positions, .start = r->start,
                                .steps = t->step < o->steps ? o->steps - t->step : 0};
        for (uint32_t k = 0; k < r->n_src; k++) lc.train[k] = r->src[k].train;
        rc = tks_mesh_agree(t->mesh, tks_loader_open(&lc, &t->pf));
    }
    return rc;
}

static void close_run(trainer *t) {
    tks_backend *be = t->be;
    tks_loader_close(t->pf);
    tks_checkpoint_tokenizer_free(t->ck_tok);
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
    tks__run_free(&t->r);
}

/* Forward and backward of every micro-batch of the step, with the gradient
 * buckets of the last backward started as their layers complete. */
static int step_micro_batches(trainer *t, float scale) {
    run *r = &t->r;
    int rc = 0;
    for (uint64_t k = 0; k < r->n_micro && !rc; k++) {
        /* micro-batch k of this step, loaded and range-checked (the loader
         * stages the next one while this one computes) */
        tks_loaded_batch b;
        rc = tks_loader_next(t->pf, &b);
        /* a bad batch on any rank stops every rank, before any compute on it */
        rc = tks_mesh_agree(t->mesh, rc);
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
    /* the loss is the mean over the step's training targets (every rank's) */
    double tokens_step = (double)tks_loader_step_targets(t->pf);
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
    if (!rc && world->size > 1) rc = tks_comm_allreduce_sum(world, dred, 3);
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
    if (shc->size > 1) rc = tks_comm_allgather(shc, w, w + t->sb, t->n_slice);
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
    const tks_blend_state *at = tks_loader_at(t->pf);
    t->st.step = t->step;
    t->st.cursor = at->sample;
    int rc = mix_record(&t->r, at, &t->st);
    if (!rc) rc = tks_path_join(ck, PATH_MAX, t->ckdir, name);
    if (!rc && if_absent) {
        tks_comm *world = t->mesh->group[TKS_GROUP_WORLD];
        struct stat sbuf;
        float exists = (float)(t->lead && stat(ck, &sbuf) == 0);
        if (world->size > 1) rc = world->t->broadcast_bytes(world, &exists, sizeof exists, 0); /* host data */
        if (!rc && exists != 0) return tks_mesh_agree(t->mesh, rc);
    }
    if (!rc) rc = tks_checkpoint_save(ck, t->m, t->opt, &t->st, t->ck_tok, t->mesh);
    if (!rc && prune && t->lead) rc = tks_checkpoint_prune(t->ckdir, t->o->keep_checkpoints);
    return tks_mesh_agree(t->mesh, rc);
}

/* t->note for the step just done (the blend `before` it, the loader's
 * after): a line for each source that started a new epoch in it (its own
 * epochs: count / windows), a warning where one is now repeated more than
 * --warn-repeats times. */
static void epoch_notes(trainer *t, const tks_blend_state *before) {
    const run *r = &t->r;
    const tks_blend_state *after = tks_loader_at(t->pf);
    size_t n = 0;
    t->note[0] = 0;
    for (uint32_t k = 0; k < r->n_src && n < sizeof t->note; k++) {
        uint64_t nw = tks_sampler_n_windows(r->src[k].train), a = after->count[k], b = before->count[k];
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

/* The evaluation's line of metrics.jsonl (rank 0): the loss, and a
 * mixture's loss per source (null where a source has no validation window),
 * and the packing when it is not concat. */
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
    /* the validation windows are packed as the training ones: a loss is
     * comparable with another run's only under the same packing */
    if (tks__run_packing(t->o) == TKS_PACK_BEST_FIT) fputs(", \"packing\": \"best-fit\"", f);
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
        tks_blend_state before = *tks_loader_at(t.pf);
        tks_loader_advance(t.pf); /* the cursor to the next step's samples */
        epoch_notes(&t, &before);
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
        if (tks__run_has_validation(&t.r) && o->eval_every && (t.step % o->eval_every == 0 || last)) {
            info.is_eval = 1;
            /* the loader reads the same dataset: let its batch land first (kept) */
            (void)tks_loader_wait(t.pf);
            info.val_loss = tks__run_evaluate(&t.r, t.m, t.mesh, tks_loader_at(t.pf)->sample, t.tok, t.ids, t.tg, t.doc, by_source,
                                          NULL, &rc);
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
