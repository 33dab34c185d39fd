/* sample_plan.c - `tokshard sample-plan`: which samples each rank reads at
 * each step (docs/SAMPLING.md §8). Thin: parses flags, calls the sampler,
 * prints. Exit codes: 0 ok, 2 usage error or a dataset that cannot be opened.
 * Built into `tokshard`; with -DTKS_SAMPLE_PLAN_MAIN also a standalone
 * program (tokshard-sample-plan) for tests. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "tools/cli.h"
#include "trainer/trainer.h"

typedef unsigned long long ull;

static const char plan_usage[] =
    "usage: tokshard sample-plan DIR --seq-len L --global-batch B [--dp D] [--tp T]\n"
    "           [--steps S0:S1] [--seed S] [--micro-batch M] [--val-tokens N]\n"
    "           [--packing concat|best-fit [--pack-plans DIR]] [--json]\n"
    "       tokshard sample-plan --dataset NAME=DIR:W --dataset ... [--mix-at STEP:NAME=W,...]\n"
    "           --seq-len L --global-batch B [same options]   (a mixture; or --mix FILE.json)\n"
    "       tokshard sample-plan --run RUN_OR_CHECKPOINT [DIR] [--dp D] [--tp T]\n"
    "           [--steps S0:S1] [--json]\n"
    "  Prints the samples each rank (rank = dp_rank * T + tp_rank) reads at steps\n"
    "  S0..S1 (inclusive; --steps S means S:S): micro-batch, global sample, epoch,\n"
    "  window and its (shard, token offset, n_tokens) pieces. Steps count from 1,\n"
    "  as tokshard-train's do (default: step 1).\n"
    "  Defaults are tokshard-train's: --seed 1337 --val-tokens 64K, --micro-batch =\n"
    "  B / D; --dp 1 --tp 1 (the union over ranks does not depend on them).\n"
    "  --val-tokens N holds out the last N tokens (rounded down to whole windows)\n"
    "  and plans the rest. --packing best-fit: windows of whole documents packed by\n"
    "  best-fit decreasing (docs/SAMPLING.md section 10), with the padding and split\n"
    "  documents beside concat's on the same data [concat: the stream cut every L].\n"
    "  --pack-plans DIR keeps the best-fit plan in DIR's plan file for the dataset,\n"
    "  range and L (made when missing, checked when present): the file a run with\n"
    "  tokshard-train --pack-plans DIR then uses.\n"
    "  Sizes take K, M, G suffixes (powers of 1024); --seed and\n"
    "  --steps are plain integers.\n"
    "  --run takes seq-len, global batch, micro-batch, seed, validation split and\n"
    "  dataset (DIR overrides it if the data moved) from a run's newest checkpoint\n"
    "  (or the checkpoint given) and plans from the step after it by default; a\n"
    "  mixture's sources, weights, schedule and cursor come from it too.\n"
    "  A mixture prints each sample's source and its index in that source.\n";

/* An exact decimal integer (seeds and steps need all 64 bits, which
 * cli_parse_size's double does not keep). Returns 0 or -1. */
static int parse_u64(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

/* "S" or "S0:S1" (inclusive), 1 <= S0 <= S1. Returns 0 or -1. */
static int parse_steps(const char *s, uint64_t *s0, uint64_t *s1) {
    const char *colon = strchr(s, ':');
    if (!colon) {
        if (parse_u64(s, s0) || *s0 == 0) return -1;
        *s1 = *s0;
        return 0;
    }
    char a[64];
    size_t n = (size_t)(colon - s);
    if (n == 0 || n >= sizeof a) return -1;
    memcpy(a, s, n);
    a[n] = 0;
    if (parse_u64(a, s0) || parse_u64(colon + 1, s1) || *s0 == 0 || *s1 < *s0) return -1;
    return 0;
}

/* One sample's pieces as text ("shard 0 @ 1234 +129, shard 1 @ 0 +5"). */
static void print_pieces(const tks_sample_loc *loc) {
    for (uint32_t p = 0; p < loc->n_pieces; p++)
        printf("%sshard %u @ %llu +%llu", p ? ", " : "", loc->pieces[p].shard,
               (ull)loc->pieces[p].offset, (ull)loc->pieces[p].n_tokens);
    if (loc->n_pieces_total > loc->n_pieces)
        printf(", ... (%u pieces in all)", loc->n_pieces_total);
}

/* A packed window as JSON: all its pieces (documents and pieces of
 * documents, in stream order) and its real tokens; NULL on error. */
static json_t *json_packed(const tks_sampler *sm, uint64_t micro, uint64_t g, uint64_t epoch, uint64_t w) {
    size_t cap = (size_t)tks_sampler_seq_len(sm) + 1, n = 0;
    tks_sample_piece *pc = malloc(cap * sizeof *pc);
    if (!pc || tks_sampler_pieces(sm, w, pc, cap, &n)) {
        free(pc);
        if (!pc) tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        return NULL;
    }
    json_t *pieces = json_array();
    uint64_t real = 0;
    for (size_t p = 0; p < n && p < cap; p++) {
        json_array_append_new(pieces, json_pack("{s:I, s:I, s:I}", "shard", (json_int_t)pc[p].shard, "offset",
                                                (json_int_t)pc[p].offset, "n_tokens", (json_int_t)pc[p].n_tokens));
        real += pc[p].n_tokens;
    }
    free(pc);
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}", "micro", (json_int_t)micro, "sample", (json_int_t)g,
                     "epoch", (json_int_t)epoch, "window", (json_int_t)w, "n_real", (json_int_t)real, "pieces",
                     pieces);
}

static json_t *json_sample(uint64_t micro, uint64_t g, uint64_t epoch, const tks_sample_loc *loc) {
    json_t *pieces = json_array();
    for (uint32_t p = 0; p < loc->n_pieces; p++)
        json_array_append_new(pieces, json_pack("{s:I, s:I, s:I}", "shard",
                                                (json_int_t)loc->pieces[p].shard, "offset",
                                                (json_int_t)loc->pieces[p].offset, "n_tokens",
                                                (json_int_t)loc->pieces[p].n_tokens));
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:[I, I], s:o}", "micro", (json_int_t)micro,
                          "sample", (json_int_t)g, "epoch", (json_int_t)epoch, "window",
                          (json_int_t)loc->window, "tokens", (json_int_t)loc->token_begin,
                          (json_int_t)(loc->token_begin + loc->n_tokens), "pieces", pieces);
    if (loc->n_pieces_total > loc->n_pieces)
        json_object_set_new(o, "n_pieces", json_integer(loc->n_pieces_total));
    return o;
}

/* What the flags and arguments of sample-plan say. */
typedef struct plan_args {
    const char *dir, *run_path, *mix_file;
    tks_mix_spec *mix;     /* --dataset, --mix-at (static) */
    uint64_t seq_len, global_batch, dp, tp, seed, micro, val_tokens;
    uint64_t s0, s1;
    int json, have_seq, have_batch, have_steps;
    int packing;           /* tks_packing */
    const char *pack_plans;/* --pack-plans: best-fit plan files there, or NULL (memory) */
    const char *data_flag; /* a flag that --run replaces */
} plan_args;

static void plan_help(void) { fputs(plan_usage, stdout); }

/* --seq-len, --global-batch, --dp, --tp, --micro-batch, --val-tokens
 * (f->ctx: the plan_args). */
static int set_count(const cli_flag *f, const char *name, const char *v) {
    plan_args *p = f->ctx;
    if (f->ptr == &p->seq_len) p->have_seq = 1;
    if (f->ptr == &p->global_batch) p->have_batch = 1;
    if (f->ptr != &p->dp && f->ptr != &p->tp) p->data_flag = f->name;
    if (!v) return cli_usage_error("%s needs a value", name);
    if (cli_parse_size(v, f->ptr))
        return cli_usage_error("%s %s: expected a non-negative integer such as 48, 64K or 1M", name, v);
    return 0;
}

static int set_seed(const cli_flag *f, const char *name, const char *v) {
    plan_args *p = f->ctx;
    p->data_flag = f->name;
    if (!v) return cli_usage_error("%s needs a value", name);
    if (parse_u64(v, f->ptr))
        return cli_usage_error("--seed %s: expected an integer in 0..%lld", v, (long long)INT64_MAX);
    return 0;
}

static int set_packing(const cli_flag *f, const char *name, const char *v) {
    plan_args *p = f->ctx;
    p->data_flag = f->name;
    if (!v) return cli_usage_error("%s needs a value", name);
    if (!strcmp(v, "concat")) p->packing = TKS_PACK_CONCAT;
    else if (!strcmp(v, "best-fit")) p->packing = TKS_PACK_BEST_FIT;
    else return cli_usage_error("--packing %s: expected concat or best-fit", v);
    return 0;
}

static int set_steps(const cli_flag *f, const char *name, const char *v) {
    plan_args *p = f->ctx;
    if (!v) return cli_usage_error("%s needs a value", name);
    p->have_steps = 1;
    if (parse_steps(v, &p->s0, &p->s1))
        return cli_usage_error("--steps %s: expected S0:S1 with 1 <= S0 <= S1 (steps S0 to S1; steps "
                               "count from 1, as tokshard-train's do), or a single step S", v);
    return 0;
}

/* --dataset NAME=DIR:W (or DIR), --mix-at STEP:NAME=W,... (f->ctx: the plan_args) */
static int set_source(const cli_flag *f, const char *name, const char *v) {
    plan_args *p = f->ctx;
    p->data_flag = f->name;
    if (!v) return cli_usage_error("%s needs a value", name);
    int rc = !strcmp(f->name, "--dataset") ? tks_mix_add_dataset(p->mix, v) : tks_mix_add_change(p->mix, v);
    return rc ? cli_usage_error("%s", tks_last_error()->message) : 0;
}

static int set_json(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (v) return cli_usage_error("--json takes no value");
    *(int *)f->ptr = 1;
    return 0;
}

/* Parses the command line into *p (defaults first). Returns CLI_PARSED or
 * the exit code. */
static int parse_plan_args(int argc, char **argv, plan_args *p) {
    static tks_mix_spec mix;
    memset(&mix, 0, sizeof mix);
    *p = (plan_args){.dp = 1, .tp = 1, .seed = TKS_DEFAULT_SEED, .mix = &mix,
                     .val_tokens = TKS_DEFAULT_VAL_TOKENS, .s0 = 1, .s1 = 1};
    const cli_flag flags[] = {
        {.name = "--json", .ptr = &p->json, .type = CLI_BOOL, .set = set_json},
        {.name = "--seq-len", .ptr = &p->seq_len, .set = set_count, .ctx = p},
        {.name = "--global-batch", .ptr = &p->global_batch, .set = set_count, .ctx = p},
        {.name = "--dp", .ptr = &p->dp, .set = set_count, .ctx = p},
        {.name = "--tp", .ptr = &p->tp, .set = set_count, .ctx = p},
        {.name = "--micro-batch", .ptr = &p->micro, .set = set_count, .ctx = p},
        {.name = "--val-tokens", .ptr = &p->val_tokens, .set = set_count, .ctx = p},
        {.name = "--seed", .ptr = &p->seed, .set = set_seed, .ctx = p},
        {.name = "--packing", .set = set_packing, .ctx = p},
        {.name = "--pack-plans", .type = CLI_STR, .ptr = &p->pack_plans},
        {.name = "--steps", .set = set_steps, .ctx = p},
        {.name = "--run", .type = CLI_STR, .ptr = &p->run_path},
        {.name = "--dataset", .set = set_source, .ctx = p},
        {.name = "--mix-at", .set = set_source, .ctx = p},
        {.name = "--mix", .type = CLI_STR, .ptr = &p->mix_file},
        {0},
    };
    cli_one dir = {NULL, "one dataset DIR only (got %s and %s)"};
    cli_command cmd = {.flags = flags,
                       .unknown = "unknown option %s (options: --seq-len --global-batch --dp --tp "
                                  "--steps --seed --micro-batch --val-tokens --packing --pack-plans --run --dataset "
                                  "--mix --mix-at --json)",
                       .positional = cli_take_one, .help = plan_help, .ctx = &dir};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc == CLI_PARSED && p->pack_plans && p->packing != TKS_PACK_BEST_FIT)
        rc = cli_usage_error("--pack-plans %s: plan files are for --packing best-fit (concat needs no plan)",
                             p->pack_plans);
    p->dir = dir.value;
    if (rc == CLI_PARSED && p->mix_file) {
        if (mix.n_sources || p->dir)
            return cli_usage_error("--mix %s and --dataset or DIR both name the data: give one", p->mix_file);
        uint32_t nc = mix.n_changes;
        tks_mix_change keep[TKS_MIX_MAX_CHANGES];
        memcpy(keep, mix.changes, nc * sizeof keep[0]);
        if (tks_mix_load(&mix, p->mix_file)) return cli_usage_error("%s", tks_last_error()->message);
        for (uint32_t i = 0; i < nc && mix.n_changes < TKS_MIX_MAX_CHANGES; i++) mix.changes[mix.n_changes++] = keep[i];
        p->data_flag = "--mix";
    }
    if (rc == CLI_PARSED && mix.n_sources && !mix.named) { /* --dataset DIR: the positional's form */
        if (p->dir) return cli_usage_error("one dataset DIR only (got %s and %s)", p->dir, mix.sources[0].dir);
        p->dir = mix.sources[0].dir;
        mix.n_sources = 0;
    }
    if (rc == CLI_PARSED && mix.named && p->dir)
        return cli_usage_error("a dataset DIR and named --dataset sources: give every source as NAME=DIR:WEIGHT");
    if (rc == CLI_PARSED && !mix.named && mix.n_changes)
        return cli_usage_error("--mix-at needs named sources: --dataset NAME=DIR:WEIGHT");
    return rc;
}

/* One source of a plan: a plain dataset or a mixture's named source. */
typedef struct psrc {
    const char *name, *dir;
    double weight;
    uint64_t seed;                 /* its permutations' seed */
    tks_dataset *ds;
    tks_sampler *sm;
    uint64_t n_tok, nw, n_val;     /* dataset tokens, train windows, validation windows */
    tks_token_range train, val;
    tks_pack_stats st, concat;     /* the packing's figures, and concat's on the same range */
} psrc;

/* A plan: the settings (after --run), the batch layout, the sources and the blend. */
typedef struct plan {
    plan_args a;
    tks_run_sampling run;          /* with --run */
    uint64_t run_step, run_cursor; /* the checkpoint's step and samples consumed, with --run */
    uint64_t per_rank, n_micro, mb; /* samples per dp rank per step, micro-batches, their size */
    int mixed;                     /* named sources (docs/SAMPLING.md §9) */
    uint32_t n_src;
    psrc src[TKS_MIX_MAX_SOURCES];
    tks_blend blend;
    tks_blend_state run_state;     /* the blend at the checkpoint's cursor (--run of a mixture) */
    tks_blend_state cur;           /* the blend at the step being planned */
    tks_blend_pick *picks;         /* a rank's picks at one step (per_rank) */
} plan;

/* --run: the settings of the run's checkpoint. Returns CLI_PARSED or the exit code. */
static int take_run(plan *pl) {
    plan_args *p = &pl->a;
    if (p->data_flag)
        return cli_usage_error("%s cannot be combined with --run: the run's checkpoint "
                               "records it", p->data_flag);
    tks_run_sampling *run = &pl->run;
    if (tks_train_read_sampling(p->run_path, run)) return cli_lib_error();
    if (run->mix_json[0]) {
        if (p->dir)
            return cli_usage_error("%s: the run trained on a mixture, whose sources its checkpoint "
                                   "records; a DIR cannot replace them", p->dir);
        if (tks_mix_from_json(run->mix_json, p->mix, &pl->run_state, NULL)) return cli_lib_error();
    } else if (!p->dir) {
        p->dir = run->dataset;
    }
    p->seq_len = run->seq_len, p->have_seq = 1;
    p->global_batch = run->global_batch, p->have_batch = 1;
    p->micro = run->micro_batch;
    p->seed = run->seed;
    p->val_tokens = run->val_dataset ? 0 : run->val_tokens;
    pl->run_step = run->step, pl->run_cursor = run->cursor;
    if (!p->have_steps) p->s0 = p->s1 = pl->run_step + 1;
    return CLI_PARSED;
}

/* The settings' ranges and the batch layout. Returns CLI_PARSED or the exit code. */
static int check_settings(plan *pl) {
    const plan_args *p = &pl->a;
    if (!p->dir && !p->mix->named) return cli_usage_error("give a dataset DIR (or --run RUN_DIR)");
    if (!p->have_seq)
        return cli_usage_error("--seq-len L is required (tokens per training sequence)");
    if (!p->have_batch)
        return cli_usage_error("--global-batch B is required (samples per step, all ranks)");
    if (p->seq_len == 0 || p->seq_len > UINT32_MAX)
        return cli_usage_error("--seq-len %llu: expected 1..%u", (ull)p->seq_len, UINT32_MAX);
    if (p->global_batch == 0)
        return cli_usage_error("--global-batch 0: expected at least 1 sample per step");
    if (p->dp == 0 || p->dp > 65536) return cli_usage_error("--dp %llu: expected 1..65536", (ull)p->dp);
    if (p->tp == 0 || p->tp > 65536) return cli_usage_error("--tp %llu: expected 1..65536", (ull)p->tp);
    if (p->seed > INT64_MAX) /* JSON integers are signed 64-bit */
        return cli_usage_error("--seed %llu: expected 0..%lld", (ull)p->seed, (long long)INT64_MAX);
    if (p->s1 > INT64_MAX / p->global_batch - pl->run_cursor / p->global_batch - 1)
        return cli_usage_error("--steps %llu:%llu with --global-batch %llu: sample indices "
                               "beyond 2^63; plan earlier steps", (ull)p->s0, (ull)p->s1,
                               (ull)p->global_batch);
    if (tks_batch_check(p->global_batch, (uint32_t)p->dp, p->micro, &pl->per_rank, &pl->n_micro)) {
        char mflag[48] = "";
        if (p->micro) snprintf(mflag, sizeof mflag, ", --micro-batch %llu", (ull)p->micro);
        return cli_usage_error("--global-batch %llu, --dp %llu%s: %s", (ull)p->global_batch,
                               (ull)p->dp, mflag, tks_last_error()->message);
    }
    pl->mb = pl->per_rank / pl->n_micro;
    return CLI_PARSED;
}

static void close_plan(plan *pl) {
    for (uint32_t k = 0; k < pl->n_src; k++) {
        tks_sampler_free(pl->src[k].sm);
        tks_dataset_close(pl->src[k].ds);
    }
    free(pl->picks);
}

/* Opens each source's dataset, splits off its validation tokens and builds
 * its sampler; then the blend. Returns CLI_PARSED or the exit code
 * (everything closed on error). */
static int open_plan(plan *pl) {
    const plan_args *p = &pl->a;
    const tks_mix_spec *m = p->mix;
    pl->mixed = m->named;
    pl->n_src = pl->mixed ? m->n_sources : 1;
    int rc = CLI_PARSED;
    if (pl->mixed && tks_mix_blend(m, p->global_batch, &pl->blend)) return cli_usage_error("%s", tks_last_error()->message);
    if (!pl->mixed) {
        const uint64_t zero = 0;
        const double one = 1;
        tks_blend_init(&pl->blend, 1, 1, &zero, &one, NULL);
        pl->run_state = (tks_blend_state){.sample = pl->run_cursor, .count = {pl->run_cursor},
                                          .phase_count = {pl->run_cursor}};
    }
    pl->picks = malloc(pl->per_rank * sizeof *pl->picks);
    if (!pl->picks) return cli_usage_error("out of memory");
    for (uint32_t k = 0; k < pl->n_src && rc == CLI_PARSED; k++) {
        psrc *s = &pl->src[k];
        s->name = pl->mixed ? m->sources[k].name : p->dir;
        s->dir = pl->mixed ? m->sources[k].dir : p->dir;
        s->weight = pl->mixed ? m->sources[k].weight : 1.0;
        s->seed = pl->mixed ? tks_source_seed(p->seed, s->name) : p->seed;
        if (tks_dataset_open(s->dir, &s->ds)) {
            rc = cli_lib_error();
            break;
        }
        s->n_tok = tks_dataset_n_tokens(s->ds);
        if (tks_split_tokens(s->n_tok, p->val_tokens, (uint32_t)p->seq_len, &s->train, &s->val))
            rc = cli_usage_error("%s%s--seq-len %llu, --val-tokens %llu: %s", pl->mixed ? s->name : "",
                                 pl->mixed ? ": " : "", (ull)p->seq_len, (ull)p->val_tokens,
                                 tks_last_error()->message);
        else if (p->pack_plans && p->packing == TKS_PACK_BEST_FIT) {
            if (tks_sampler_create_planned(s->ds, s->train.begin, s->train.end, (uint32_t)p->seq_len, s->seed, 0,
                                           p->pack_plans, NULL, &s->sm))
                rc = cli_lib_error();
        } else if (tks_sampler_create_packed(s->ds, s->train.begin, s->train.end, (uint32_t)p->seq_len, s->seed,
                                             (tks_packing)p->packing, 0, &s->sm))
            rc = cli_usage_error("--seq-len %llu: %s", (ull)p->seq_len, tks_last_error()->message);
        if (rc == CLI_PARSED && p->packing != TKS_PACK_CONCAT) { /* concat's figures beside */
            tks_sampler *c = NULL;
            if (tks_sampler_pack_stats(s->sm, &s->st) ||
                tks_sampler_create(s->ds, s->train.begin, s->train.end, (uint32_t)p->seq_len, s->seed, &c) ||
                tks_sampler_pack_stats(c, &s->concat))
                rc = cli_lib_error();
            tks_sampler_free(c);
        }
        if (rc != CLI_PARSED) break;
        s->nw = tks_sampler_n_windows(s->sm);
        s->n_val = s->val.end > s->val.begin ? (s->val.end - s->val.begin - 1) / p->seq_len : 0;
    }
    if (rc != CLI_PARSED) close_plan(pl);
    return rc;
}

/* A mixture's sources and schedule as JSON (the plan's head). */
static void json_mixture(const plan *pl, json_t *head) {
    json_t *src = json_array(), *sch = json_array();
    const tks_blend *b = &pl->blend;
    for (uint32_t k = 0; k < pl->n_src; k++) {
        const psrc *s = &pl->src[k];
        char seed[17];
        snprintf(seed, sizeof seed, "%016llx", (ull)s->seed);
        json_array_append_new(src, json_pack("{s:s, s:s, s:f, s:s, s:I, s:I, s:[I, I], s:[I, I], s:I, s:I}",
                                             "name", s->name, "dataset", s->dir, "weight", s->weight,
                                             "seed_hex", seed, "n_tokens",
                                             (json_int_t)s->n_tok, "n_shards",
                                             (json_int_t)tks_dataset_n_shards(s->ds), "range",
                                             (json_int_t)s->train.begin, (json_int_t)s->train.end,
                                             "val_range", (json_int_t)s->val.begin, (json_int_t)s->val.end,
                                             "n_windows", (json_int_t)s->nw, "n_val_windows",
                                             (json_int_t)s->n_val));
    }
    /* the phases as the blend holds them: from sample start, weights as given */
    const tks_mix_spec *m = pl->a.mix;
    for (uint32_t p = 1; p < b->n_phases; p++) {
        uint64_t step = b->start[p] / pl->a.global_batch + 1;
        json_t *ws = json_object();
        for (uint32_t i = 0; i < m->n_changes; i++) {
            if (m->changes[i].step != step) continue;
            /* the change's own numbers, exactly as typed */
            char text[1024];
            snprintf(text, sizeof text, "%s", m->changes[i].text);
            for (char *save = NULL, *e = strtok_r(text, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(e, '=');
                if (eq) *eq = 0, json_object_set_new(ws, e, json_real(strtod(eq + 1, NULL)));
            }
        }
        json_array_append_new(sch, json_pack("{s:I, s:I, s:o}", "step", (json_int_t)step, "sample",
                                             (json_int_t)b->start[p], "weights", ws));
    }
    json_object_set_new(head, "sources", src);
    json_object_set_new(head, "schedule", sch);
}

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* The packing's figures beside concat's, as # lines. */
static void print_pack(const psrc *s) {
    const tks_pack_stats *b = &s->st, *c = &s->concat;
    printf("#   packing best-fit: %llu windows in %llu groups, padding %.3f%% of positions, %llu of %llu "
           "documents split (%.2f%%), %.2f documents or pieces per window; %s in %.3f s%s%s\n",
           (ull)b->windows, (ull)b->groups, pct(b->pad_tokens, b->capacity), (ull)b->docs_split, (ull)b->docs,
           pct(b->docs_split, b->docs), b->windows ? (double)b->pieces / (double)b->windows : 0.0,
           tks_sampler_plan_path(s->sm) ? "plan file made or checked" : "planned", b->seconds,
           tks_sampler_plan_path(s->sm) ? ": " : "", tks_sampler_plan_path(s->sm) ? tks_sampler_plan_path(s->sm) : "");
    printf("#   concat on the same range: %llu windows, padding 0%%, %llu of %llu documents split (%.2f%%; "
           "%llu of them fit in one window), %.2f documents or pieces per window; best-fit splits %.1f%% "
           "fewer\n",
           (ull)c->windows, (ull)c->docs_split, (ull)c->docs, pct(c->docs_split, c->docs), (ull)c->docs_split_short,
           c->windows ? (double)c->pieces / (double)c->windows : 0.0,
           c->docs_split ? 100.0 - pct(b->docs_split, c->docs_split) : 0.0);
}

static json_t *json_pack_stats(const tks_pack_stats *st) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "windows", (json_int_t)st->windows,
                     "tokens", (json_int_t)st->tokens, "capacity", (json_int_t)st->capacity, "pad_tokens",
                     (json_int_t)st->pad_tokens, "docs", (json_int_t)st->docs, "docs_split",
                     (json_int_t)st->docs_split, "docs_split_short", (json_int_t)st->docs_split_short,
                     "pieces", (json_int_t)st->pieces, "groups", (json_int_t)st->groups, "seconds", st->seconds);
}

/* The plan's head: its JSON object up to "steps":[, or the text's # lines.
 * Returns 0 or the exit code. */
static int print_head(const plan *pl) {
    const plan_args *p = &pl->a;
    const psrc *s0 = &pl->src[0];
    if (!p->json) {
        for (uint32_t k = 0; k < pl->n_src; k++) {
            const psrc *s = &pl->src[k];
            if (pl->mixed)
                printf("# source %s: dataset %s, weight %g: %llu tokens in %zu shards\n", s->name, s->dir,
                       s->weight, (ull)s->n_tok, tks_dataset_n_shards(s->ds));
            else
                printf("# dataset %s: %llu tokens in %zu shards\n", p->dir, (ull)s->n_tok,
                       tks_dataset_n_shards(s->ds));
            printf("# %s%strain tokens [%llu, %llu): %llu windows of seq_len %llu + 1; validation "
                   "tokens [%llu, %llu): %llu windows\n", pl->mixed ? s->name : "", pl->mixed ? ": " : "",
                   (ull)s->train.begin, (ull)s->train.end, (ull)s->nw, (ull)p->seq_len,
                   (ull)s->val.begin, (ull)s->val.end, (ull)s->n_val);
            if (p->packing != TKS_PACK_CONCAT) print_pack(s);
        }
        for (uint32_t ph = 1; ph < pl->blend.n_phases; ph++) {
            printf("# from step %llu (sample %llu):", (ull)(pl->blend.start[ph] / p->global_batch + 1),
                   (ull)pl->blend.start[ph]);
            for (uint32_t k = 0; k < pl->n_src; k++)
                printf(" %s %.4f", pl->src[k].name, (double)pl->blend.W[ph][k] / (double)pl->blend.S[ph]);
            putchar('\n');
        }
        printf("# global batch %llu = dp %llu x %llu samples, %llu micro-batches of %llu; tp %llu "
               "(tp ranks read the same samples); seed %llu\n", (ull)p->global_batch, (ull)p->dp,
               (ull)pl->per_rank, (ull)pl->n_micro, (ull)pl->mb, (ull)p->tp, (ull)p->seed);
        if (p->run_path)
            printf("# from checkpoint %s: step %llu, %llu samples consumed\n", pl->run.checkpoint,
                   (ull)pl->run_step, (ull)pl->run_cursor);
        return 0;
    }
    json_t *head = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "seq_len", (json_int_t)p->seq_len,
                             "global_batch", (json_int_t)p->global_batch, "dp", (json_int_t)p->dp,
                             "tp", (json_int_t)p->tp, "micro_batch", (json_int_t)pl->mb, "seed",
                             (json_int_t)p->seed);
    if (head && pl->mixed) json_mixture(pl, head);
    else if (head) /* a plain dataset: its numbers at the top, as always */
        json_object_update_new(head, json_pack("{s:s, s:I, s:I, s:[I, I], s:[I, I], s:I, s:I}", "dataset",
                                               p->dir, "n_tokens", (json_int_t)s0->n_tok, "n_shards",
                                               (json_int_t)tks_dataset_n_shards(s0->ds), "range",
                                               (json_int_t)s0->train.begin, (json_int_t)s0->train.end,
                                               "val_range", (json_int_t)s0->val.begin,
                                               (json_int_t)s0->val.end, "n_windows", (json_int_t)s0->nw,
                                               "n_val_windows", (json_int_t)s0->n_val));
    if (head && p->packing != TKS_PACK_CONCAT) { /* per source, in source order */
        json_t *pk = json_array();
        for (uint32_t k = 0; k < pl->n_src; k++)
            json_array_append_new(pk, json_pack("{s:s, s:o, s:o}", "source", pl->src[k].name, "best_fit",
                                                json_pack_stats(&pl->src[k].st), "concat",
                                                json_pack_stats(&pl->src[k].concat)));
        json_object_set_new(head, "packing", json_string(tks_packing_name((tks_packing)p->packing)));
        json_object_set_new(head, "packing_stats", pk);
    }
    if (head && p->run_path)
        json_object_set_new(head, "checkpoint", json_pack("{s:s, s:I, s:I}", "path",
                                                          pl->run.checkpoint, "step",
                                                          (json_int_t)pl->run_step, "cursor",
                                                          (json_int_t)pl->run_cursor));
    char *h = head ? json_dumps(head, JSON_COMPACT) : NULL;
    json_decref(head);
    if (!h) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return EXIT_USAGE;
    }
    /* stream the steps: the head object without its closing brace, then
     * one step object at a time, so memory does not grow with --steps */
    h[strlen(h) - 1] = 0;
    printf("%s,\"steps\":[", h);
    free(h);
    return 0;
}

/* The samples of dp rank d, tp rank t at step `step`, whose share of the
 * step's samples is [first, first + count), picked from the blend at the
 * step's start (pl->cur): printed as text lines, or appended to `samples`
 * (JSON). Returns 0 or the exit code. */
static int rank_samples(plan *pl, uint64_t step, uint64_t d, uint64_t t, uint64_t first,
                        uint64_t count, json_t *samples) {
    const uint64_t rank = d * pl->a.tp + t;
    if (tks_blend_picks(&pl->blend, &pl->cur, first, count, pl->picks))
        return cli_usage_error("%s", tks_last_error()->message);
    for (uint64_t m = 0; m < pl->n_micro; m++) {
        uint64_t mf, mc;
        if (tks_sampler_micro_slice(first, count, pl->mb, m, &mf, &mc))
            return cli_usage_error("%s", tks_last_error()->message);
        for (uint64_t g = mf; g < mf + mc; g++) {
            const tks_blend_pick *pk = &pl->picks[g - first];
            const psrc *s = &pl->src[pk->source];
            tks_sample_loc loc;
            uint64_t w = tks_sampler_window(s->sm, pk->index), epoch = pk->index / s->nw;
            if (tks_sampler_locate(s->sm, w, &loc)) return cli_usage_error("%s", tks_last_error()->message);
            if (samples) {
                json_t *o = tks_sampler_packing(s->sm) == TKS_PACK_CONCAT ? json_sample(m, g, epoch, &loc)
                                                                          : json_packed(s->sm, m, g, epoch, w);
                if (!o) return cli_lib_error();
                if (pl->mixed) {
                    json_object_set_new(o, "source", json_string(s->name));
                    json_object_set_new(o, "source_sample", json_integer((json_int_t)pk->index));
                }
                json_array_append_new(samples, o);
                continue;
            }
            printf("step %llu rank %llu dp %llu tp %llu micro %llu sample %llu ", (ull)step, (ull)rank,
                   (ull)d, (ull)t, (ull)m, (ull)g);
            if (pl->mixed) printf("source %s source_sample %llu ", s->name, (ull)pk->index);
            if (tks_sampler_packing(s->sm) == TKS_PACK_CONCAT)
                printf("epoch %llu window %llu tokens [%llu, %llu) ", (ull)epoch, (ull)w,
                       (ull)loc.token_begin, (ull)(loc.token_begin + loc.n_tokens));
            else /* packed: its documents' tokens, then padding */
                printf("epoch %llu window %llu real %llu of %llu ", (ull)epoch, (ull)w, (ull)loc.n_tokens,
                       (ull)(pl->a.seq_len + 1));
            print_pieces(&loc);
            putchar('\n');
        }
    }
    return 0;
}

/* Every rank's samples at one step. Returns 0 or the exit code. */
static int print_step(plan *pl, uint64_t step) {
    const plan_args *p = &pl->a;
    int rc = 0;
    json_t *ranks = p->json ? json_array() : NULL;
    /* global samples consumed before step s: (s - 1) B, or after a checkpoint
     * counted from its cursor (the trainer resumes from the cursor) */
    const uint64_t cursor = step > pl->run_step
                                ? pl->run_cursor + (step - pl->run_step - 1) * p->global_batch
                                : (step - 1) * p->global_batch;
    /* the blend there: from the checkpoint's state when at or after it, else from 0 */
    const tks_blend_state zero = {0}, *base = cursor >= pl->run_state.sample ? &pl->run_state : &zero;
    if (pl->cur.sample > cursor || pl->cur.sample < base->sample) pl->cur = *base;
    tks_blend_seek(&pl->blend, &pl->cur, cursor);
    for (uint64_t d = 0; d < p->dp && !rc; d++) {
        uint64_t first, count;
        if (tks_sampler_rank_slice_at(cursor, p->global_batch, (uint32_t)p->dp, (uint32_t)d,
                                      &first, &count)) {
            rc = cli_usage_error("%s", tks_last_error()->message);
            break;
        }
        for (uint64_t t = 0; t < p->tp && !rc; t++) {
            json_t *samples = p->json ? json_array() : NULL;
            rc = rank_samples(pl, step, d, t, first, count, samples);
            if (p->json)
                json_array_append_new(ranks, json_pack("{s:I, s:I, s:I, s:o}", "rank",
                                                       (json_int_t)(d * p->tp + t), "dp_rank",
                                                       (json_int_t)d, "tp_rank", (json_int_t)t,
                                                       "samples", samples));
        }
    }
    if (p->json) {
        json_t *st = json_pack("{s:I, s:o}", "step", (json_int_t)step, "ranks", ranks);
        char *txt = rc ? NULL : json_dumps(st, JSON_COMPACT);
        if (txt) printf("%s%s", step > p->s0 ? "," : "", txt);
        else if (!rc) rc = cli_usage_error("out of memory writing JSON");
        free(txt);
        json_decref(st);
    }
    return rc;
}

int cli_sample_plan(int argc, char **argv) {
    cli_prog = "tokshard sample-plan";
    static plan pl;
    memset(&pl, 0, sizeof pl);
    int rc = parse_plan_args(argc, argv, &pl.a);
    if (rc == CLI_PARSED && pl.a.run_path) rc = take_run(&pl);
    if (rc == CLI_PARSED) rc = check_settings(&pl);
    if (rc == CLI_PARSED) rc = open_plan(&pl);
    if (rc != CLI_PARSED) return rc;
    rc = print_head(&pl);
    for (uint64_t step = pl.a.s0; step <= pl.a.s1 && !rc; step++) rc = print_step(&pl, step);
    if (pl.a.json && !rc) printf("]}\n");
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "%s: error writing the plan: %s\n", cli_prog, strerror(errno));
        rc = EXIT_USAGE;
    }
    close_plan(&pl);
    return rc;
}

#ifdef TKS_SAMPLE_PLAN_MAIN
int main(int argc, char **argv) { return cli_sample_plan(argc - 1, argv + 1); }
#endif
