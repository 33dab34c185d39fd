/* tokshard-train - train a LLaMA-style model on a tokshard dataset (CPU).
 * Thin: flags (one table, so --help lists every flag with its real default),
 * progress printing, the loss plot (gnuplot), exit codes. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/cli.h"
#include "trainer/cuda/tks_cuda.h"
#include "trainer/trainer.h"

/* A flag of the table: its value's range (numbers: lo..hi, `open` bit 0
 * excludes lo, bit 1 excludes hi) is checked when it is parsed and shown by --help. */
#define FLAG(name, type, ptr, help, meta, lo, hi, open) {name, NULL, type, ptr, NULL, help, meta, lo, hi, open, NULL}
#define BIG CLI_BIG
#define UINT64_MAX_D 18446744073709551615.0

static tks_train_opts O;
static int dry_run, quiet, no_plot, check_mesh, step_model, eval_only;
static const char *plot_only, *mix_file, *mix_at_shown; /* mix_at_shown: --help's default */
static tks_mix_spec MIX; /* --dataset (each one), --mix-at */

/* --dataset DIR or NAME=DIR[:WEIGHT], once per source */
static int set_dataset(const cli_flag *f, const char *name, const char *v) {
    (void)f;
    if (!v) return cli_usage_error("%s needs a value: DIR, or NAME=DIR:WEIGHT per source", name);
    return tks_mix_add_dataset(&MIX, v) ? cli_usage_error("%s", tks_last_error()->message) : 0;
}

/* --mix-at STEP:NAME=W,... (several allowed) */
static int set_mix_at(const cli_flag *f, const char *name, const char *v) {
    (void)f;
    if (!v) return cli_usage_error("%s needs a value: STEP:NAME=WEIGHT[,NAME=WEIGHT...]", name);
    return tks_mix_add_change(&MIX, v) ? cli_usage_error("%s", tks_last_error()->message) : 0;
}

static const cli_flag FLAGS[] = {
    {"--dataset", NULL, CLI_STR, &O.dataset_dir, set_dataset, "tokshard dataset directory (required); several as NAME=DIR:WEIGHT make a mixture (weights relative to each other)", "DIR", 0, 0, 0, NULL},
    FLAG("--mix", CLI_STR, &mix_file, "a mixture's sources and schedule from a JSON file (instead of --dataset)", "FILE", 0, 0, 0),
    {"--mix-at", NULL, CLI_STR, &mix_at_shown, set_mix_at, "from step STEP on, draw the named sources with these weights (others: none); repeatable", "STEP:NAME=W,...", 0, 0, 0, NULL},
    FLAG("--warn-repeats", CLI_U64, &O.warn_repeats, "warn when a source is read for more than this many repeats (epochs after its first)", "N", 0, BIG, 0),
    FLAG("--doc-mask", CLI_BOOL, &O.doc_mask, "attention stays inside each document of a packed window (block-causal, from the shards' document index)", NULL, 0, 0, 0),
    FLAG("--packing", CLI_STR, &O.packing, "concat (the stream cut every seq_len tokens, the default) or best-fit (whole documents packed into windows by best-fit decreasing, the rest padding kept out of the loss; docs/SAMPLING.md section 10)", "MODE", 0, 0, 0),
    FLAG("--pack-plans", CLI_STR, &O.pack_plans, "with --packing best-fit: the directory of the packing plan files, one per dataset, token range and seq-len, made by the ranks together when missing, checked whole when used (default RUN_DIR/plans; docs/SAMPLING.md section 10)", "DIR", 0, 0, 0),
    FLAG("--reset-positions", CLI_BOOL, &O.reset_positions, "RoPE positions restart at each document of a packed window", NULL, 0, 0, 0),
    FLAG("--out", CLI_STR, &O.out_dir, "run directory: checkpoints/, metrics.jsonl, loss.svg (required)", "DIR", 0, 0, 0),
    FLAG("--resume", CLI_STR, &O.resume, "checkpoint directory to continue from, or 'latest' (in --out)", "DIR", 0, 0, 0),
    FLAG("--steps", CLI_U64, &O.steps, "optimizer steps in total", "N", 1, BIG, 0),
    FLAG("--stop-at", CLI_U64, &O.stop_at, "save a checkpoint and exit after this step (0 = run all --steps)", "N", 0, BIG, 0),
    FLAG("--change-schedule", CLI_BOOL, &O.change_schedule, "on --resume, accept --steps/--lr/--min-lr/--warmup other than the checkpoint's run", NULL, 0, 0, 0),
    FLAG("--seq-len", CLI_U32, &O.seq_len, "tokens per sample", "N", 1, 1048576, 0),
    FLAG("--global-batch", CLI_U64, &O.global_batch, "samples per optimizer step", "N", 1, 1073741824, 0),
    FLAG("--micro-batch", CLI_U64, &O.micro_batch, "samples per forward/backward (0 = whole batch)", "N", 0, 1073741824, 0),
    FLAG("--seed", CLI_U64, &O.seed, "data order and initialization seed", "N", 0, UINT64_MAX_D, 0),
    FLAG("--vocab-size", CLI_U32, &O.model.vocab_size, "model vocabulary (0 = the dataset's)", "N", 0, 2147483648, 0),
    FLAG("--vocab-divisible-by", CLI_U32, &O.model.vocab_divisible_by, "pad the vocabulary to a multiple of this (inside the process only; 0 = 64)", "N", 0, 1048576, 0),
    FLAG("--dim", CLI_U32, &O.model.dim, "model dimension", "N", 1, 131072, 0),
    FLAG("--n-layers", CLI_U32, &O.model.n_layers, "transformer layers", "N", 1, 4096, 0),
    FLAG("--n-heads", CLI_U32, &O.model.n_heads, "attention heads", "N", 1, 4096, 0),
    FLAG("--n-kv-heads", CLI_U32, &O.model.n_kv_heads, "key/value heads (GQA; 0 = n-heads)", "N", 0, 4096, 0),
    FLAG("--ffn-dim", CLI_U32, &O.model.ffn_dim, "SwiGLU hidden dimension (0 = round_up(8/3 dim, 32))", "N", 0, 1048576, 0),
    FLAG("--max-seq-len", CLI_U32, &O.model.max_seq_len, "longest context (0 = --seq-len)", "N", 0, 1048576, 0),
    FLAG("--rope-theta", CLI_FLOAT, &O.model.rope_theta, "RoPE base (0 = 10000)", "F", 0, 1000000000.0, 0),
    FLAG("--norm-eps", CLI_FLOAT, &O.model.norm_eps, "RMSNorm epsilon (0 = 1e-5)", "F", 0, 1, 0),
    FLAG("--init-std", CLI_FLOAT, &O.model.init_std, "initialization std (0 = 0.02)", "F", 0, 10, 0),
    FLAG("--tie-embeddings", CLI_BOOL, &O.model.tie_embeddings, "lm_head shares the embedding", NULL, 0, 0, 0),
    FLAG("--lr", CLI_FLOAT, &O.lr, "peak learning rate", "F", 0, 1e30, 1),
    FLAG("--min-lr", CLI_FLOAT, &O.min_lr, "learning rate at the end of the cosine decay", "F", 0, 10, 0),
    FLAG("--warmup", CLI_U64, &O.warmup_steps, "linear warmup steps", "N", 0, BIG, 0),
    FLAG("--beta1", CLI_FLOAT, &O.beta1, "AdamW beta1", "F", 0, 1, 2),
    FLAG("--beta2", CLI_FLOAT, &O.beta2, "AdamW beta2", "F", 0, 1, 2),
    FLAG("--adam-eps", CLI_FLOAT, &O.adam_eps, "AdamW epsilon", "F", 0, 1, 0),
    FLAG("--weight-decay", CLI_FLOAT, &O.weight_decay, "AdamW decoupled weight decay (matrices only)", "F", 0, 10, 0),
    FLAG("--grad-clip", CLI_FLOAT, &O.grad_clip, "max global gradient norm (0 = off)", "F", 0, 1000000000.0, 0),
    FLAG("--val-tokens", CLI_U64, &O.val_tokens, "tokens held out from the end of the dataset for validation", "N", 0, BIG, 0),
    FLAG("--val-dataset", CLI_STR, &O.val_dataset_dir, "separate validation dataset (instead of --val-tokens)", "DIR", 0, 0, 0),
    FLAG("--eval-every", CLI_U64, &O.eval_every, "steps between validation runs (0 = never)", "N", 0, BIG, 0),
    FLAG("--eval-batches", CLI_U64, &O.eval_batches, "global batches per validation run", "N", 1, 1048576, 0),
    FLAG("--save-every", CLI_U64, &O.save_every, "steps between checkpoints (0 = only at the end)", "N", 0, BIG, 0),
    FLAG("--keep", CLI_U32, &O.keep_checkpoints, "checkpoints kept (0 = all)", "N", 0, 1048576, 0),
    FLAG("--profile", CLI_U64, &O.profile_steps, "time every backend op over the first N steps and print a table (CUDA: events around each op, read once per step)", "N", 0, BIG, 0),
    FLAG("--roofline", CLI_STR, &O.roofline, "price each op on this roofline for --profile and --step-model: h100, h200, a100 or BF16_TFLOPS,FP32_TFLOPS,MEMORY_GBS,LINK_GBS (default: the GPU's own preset; --step-model: h100)", "SPEC", 0, 0, 0),
    FLAG("--step-model", CLI_BOOL, &step_model, "print the model of one training step on --roofline (per op: calls, FLOPs, bytes, time; predicted MFU) and exit; needs the model flags and --vocab-size or --dataset", NULL, 0, 0, 0),
    FLAG("--threads", CLI_U32, &O.threads, "CPU threads per process (0 = all cores)", "N", 0, 1024, 0),
    FLAG("--device", CLI_STR, &O.device, "compute backend: cpu, cuda or auto (cuda when built in, else cpu; default auto)", "NAME", 0, 0, 0),
    FLAG("--comm", CLI_STR, &O.comm, "collectives between processes: auto (NCCL under --device cuda, else MPI), mpi (under cuda: through host memory) or nccl; default auto", "NAME", 0, 0, 0),
    FLAG("--dtype", CLI_STR, &O.dtype, "fp32 (the reference) or bf16 (bf16 weights and activations, fp32 master weights, gradients and AdamW moments); default fp32", "NAME", 0, 0, 0),
    FLAG("--deterministic", CLI_BOOL, &O.deterministic, "identical bits run to run on every backend: the GPU's deterministic attention backward, slower and with a T x T workspace per head (the CPU always is)", NULL, 0, 0, 0),
    FLAG("--tp", CLI_U32, &O.tp, "tensor-parallel degree (0 = 1)", "N", 0, 65536, 0),
    FLAG("--dp-shard", CLI_U32, &O.dp_shard, "data-parallel degree sharding gradients and AdamW state (0 = the rest of the world)", "N", 0, 1048576, 0),
    FLAG("--dp-replicate", CLI_U32, &O.dp_replicate, "data-parallel replicas of the shards (0 = 1)", "N", 0, 1048576, 0),
    FLAG("--world", CLI_U32, &O.world, "plan for this many processes (with --dry-run, without mpirun)", "N", 0, 4194304, 0),
    FLAG("--eval-only", CLI_BOOL, &eval_only, "evaluate the --resume checkpoint on the validation windows of --dataset and exit (nothing trained or written): the loss per source under --packing, --doc-mask and --reset-positions as given here, on --eval-batches global batches; --seq-len, --global-batch, --val-tokens and --seed are the checkpoint's unless given; prints the losses and a JSON line", NULL, 0, 0, 0),
    FLAG("--dry-run", CLI_BOOL, &dry_run, "print the resolved run, model size, memory and first samples; train nothing", NULL, 0, 0, 0),
    FLAG("--check-mesh", CLI_BOOL, &check_mesh, "build the communicators, verify them against the plan, print the groups that exist, and exit", NULL, 0, 0, 0),
    FLAG("--no-plot", CLI_BOOL, &no_plot, "do not write loss.svg at the end", NULL, 0, 0, 0),
    FLAG("--plot", CLI_STR, &plot_only, "only (re)draw RUN_DIR/loss.svg from RUN_DIR/metrics.jsonl", "DIR", 0, 0, 0),
    FLAG("--quiet", CLI_BOOL, &quiet, "no per-step progress lines", NULL, 0, 0, 0),
    {0},
};
static void help(void) {
    printf("tokshard-train - train a LLaMA-style model on a tokshard dataset (CPU reference backend)\n\n"
           "usage: tokshard-train --dataset DIR --out RUN_DIR [options]\n\n");
    cli_flags_help(FLAGS);
    printf("\nCtrl-C saves a checkpoint and exits; continue with --resume latest.\n"
           "exit codes: 0 ok, 2 usage or data error, 130 interrupted (checkpoint saved)\n");
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    if (g_stop) _exit(EXIT_INTERRUPTED);
    g_stop = 1;
}

static void fmt_time(double s, char *out, size_t n) {
    if (!(s >= 0) || s > 1e7) snprintf(out, n, "?");
    else if (s >= 3600) snprintf(out, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(out, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(out, n, "%.0fs", s);
}

static void on_profile(const char *table, void *ctx) {
    (void)ctx;
    printf("backend ops over the profiled steps:\n%s", table);
    fflush(stdout);
}

static void on_step(const tks_step_info *i, void *ctx) {
    (void)ctx;
    if (quiet && !i->checkpoint && !(i->note && i->note_is_warning)) return;
    char eta[16];
    fmt_time(i->eta_s, eta, sizeof eta);
    if (!quiet)
        printf("step %5llu/%llu | loss %.4f | lr %.2e | grad norm %.3f | %6.0f tok/s | ETA %s\n",
               (unsigned long long)i->step, (unsigned long long)i->steps, i->loss, i->lr,
               i->grad_norm, i->tokens_per_s, eta);
    if (i->note && !quiet) fputs(i->note, stdout);
    if (i->note && i->note_is_warning) { /* warnings also in quiet runs, on stderr */
        fflush(stdout);
        fprintf(stderr, "%s", i->note);
    }
    if (i->is_eval) {
        printf("step %5llu: validation loss %.4f", (unsigned long long)i->step, i->val_loss);
        for (uint32_t k = 0; k < i->n_sources; k++)
            printf("%s%s %.4f", k ? ", " : " (weighted mean; ", i->source_names[k], i->val_by_source[k]);
        printf(i->n_sources ? ")\n" : "\n");
    }
    if (i->checkpoint) printf("checkpoint %s\n", i->checkpoint);
    fflush(stdout);
}

/* One (step, value) point of the loss curve. */
typedef struct { unsigned long long step; double v; size_t line; } point;
typedef struct { point *p; size_t n, cap; } series;

static int series_add(series *s, unsigned long long step, double v, size_t line) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        point *p = realloc(s->p, cap * sizeof *p);
        if (!p) return -1;
        s->p = p, s->cap = cap;
    }
    s->p[s->n++] = (point){step, v, line};
    return 0;
}

static int point_cmp(const void *a, const void *b) {
    const point *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

/* Writes s as a gnuplot data block named NAME, by step; where a step appears
 * more than once (a run resumed from an earlier checkpoint), the last line wins. */
static void series_write(FILE *f, const char *name, series *s) {
    qsort(s->p, s->n, sizeof *s->p, point_cmp);
    fprintf(f, "$%s << EOD\n", name);
    for (size_t i = 0; i < s->n; i++)
        if (i + 1 == s->n || s->p[i + 1].step != s->p[i].step)
            fprintf(f, "%llu %.9g\n", s->p[i].step, s->p[i].v);
    fputs("EOD\n", f);
}

/* Draws RUN/loss.svg from RUN/metrics.jsonl with gnuplot (Debian gnuplot-nox).
 * No shell and no path reaches gnuplot: the points are sent inline on its
 * standard input, and its standard output is a new RUN/loss.svg.tmp-XXXXXXXX
 * (tks_create_unique: never a file that was there), opened here and renamed
 * to loss.svg when gnuplot succeeds. */
static int plot(const char *run) {
    char path[PATH_MAX], tmp[PATH_MAX + 32], out[PATH_MAX];
    if (tks_path_join(path, sizeof path, run, "metrics.jsonl") ||
        tks_path_join(out, sizeof out, run, "loss.svg")) {
        fprintf(stderr, "%s: --plot: path too long: %s\n", cli_prog, run);
        return EXIT_USAGE;
    }
    FILE *m = fopen(path, "r");
    if (!m) {
        fprintf(stderr, "%s: cannot draw the loss curve: %s: %s\n", cli_prog, path, strerror(errno));
        return EXIT_USAGE;
    }
    series train = {0}, val = {0}, by[TKS_MIX_MAX_SOURCES] = {{0}};
    char names[TKS_MIX_MAX_SOURCES][TKS_MIX_NAME_MAX];
    size_t n_by = 0;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    int rc = 0;
    while (!rc && getline(&line, &cap, m) > 0) {
        lineno++;
        json_t *j = json_loads(line, 0, NULL);
        json_t *st = json_object_get(j, "step"), *l = json_object_get(j, "loss"),
               *vl = json_object_get(j, "val_loss");
        if (json_is_integer(st) && json_integer_value(st) >= 0) {
            unsigned long long s = (unsigned long long)json_integer_value(st);
            if (json_is_number(l)) rc = series_add(&train, s, json_number_value(l), lineno);
            if (!rc && json_is_number(vl)) rc = series_add(&val, s, json_number_value(vl), lineno);
            /* a mixture's validation loss per source: one curve each */
            const char *key;
            json_t *v;
            json_object_foreach(json_object_get(j, "val_loss_by_source"), key, v) {
                size_t k = 0;
                while (k < n_by && strcmp(names[k], key)) k++;
                if (strspn(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
                    strlen(key))
                    continue; /* not a source name: never into gnuplot's quotes */
                if (k == n_by && n_by < TKS_MIX_MAX_SOURCES && strlen(key) < TKS_MIX_NAME_MAX)
                    snprintf(names[n_by++], TKS_MIX_NAME_MAX, "%s", key);
                if (!rc && k < n_by && json_is_number(v)) rc = series_add(&by[k], s, json_number_value(v), lineno);
            }
        }
        json_decref(j); /* a line cut by a kill during a write is not a point */
    }
    free(line);
    fclose(m);
    if (rc || train.n == 0) {
        fprintf(stderr, "%s: cannot draw the loss curve: %s\n", cli_prog,
                rc ? "out of memory" : "no training step in metrics.jsonl");
        free(train.p), free(val.p);
        for (size_t k = 0; k < n_by; k++) free(by[k].p);
        return EXIT_USAGE;
    }
    int in[2] = {-1, -1}, fd = -1;
    if (tks_create_unique(AT_FDCWD, out, 0644, tmp, sizeof tmp, &fd)) {
        fprintf(stderr, "%s: could not draw %s: %s\n", cli_prog, out, tks_last_error()->message);
        free(train.p), free(val.p);
        for (size_t k = 0; k < n_by; k++) free(by[k].p);
        return EXIT_USAGE;
    }
    posix_spawn_file_actions_t fa;
    pid_t pid = -1;
    int spawned = -1;
    if (fd >= 0 && pipe2(in, O_CLOEXEC) == 0 && posix_spawn_file_actions_init(&fa) == 0) {
        posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
        posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
        char *argv[] = {"gnuplot", NULL};
        spawned = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
    }
    int err = spawned > 0 ? spawned : errno;
    if (in[0] >= 0) close(in[0]);
    if (fd >= 0) close(fd);
    if (spawned == 0) {
        /* a gnuplot that quits early makes these writes fail with EPIPE, not
         * kill this process: its exit status tells */
        struct sigaction ign = {.sa_handler = SIG_IGN}, old;
        sigaction(SIGPIPE, &ign, &old);
        FILE *g = fdopen(in[1], "w");
        if (g) {
            series_write(g, "train", &train);
            if (val.n) series_write(g, "val", &val);
            for (size_t k = 0; k < n_by; k++) {
                char nm[32];
                snprintf(nm, sizeof nm, "src%zu", k);
                series_write(g, nm, &by[k]);
            }
            fputs("set terminal svg size 800,480\nset output\n"
                  "set xlabel 'step'\nset ylabel 'loss (nats/token)'\nset grid\nset key top right\n", g);
            fprintf(g, "plot $train using 1:2 with lines title 'train'%s",
                    val.n ? (n_by ? ", $val using 1:2 with linespoints title 'validation (weighted mean)'"
                                  : ", $val using 1:2 with linespoints title 'validation'") : "");
            /* source names are [A-Za-z0-9_.-]: safe inside gnuplot's quotes */
            for (size_t k = 0; k < n_by; k++)
                fprintf(g, ", $src%zu using 1:2 with linespoints dashtype 2 title 'validation: %s'", k, names[k]);
            fputs("\n", g);
            fclose(g);
        } else close(in[1]);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        sigaction(SIGPIPE, &old, NULL);
        spawned = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
        err = 0;
    } else if (in[1] >= 0) close(in[1]);
    free(train.p), free(val.p);
    for (size_t k = 0; k < n_by; k++) free(by[k].p);
    if (spawned != 0 || rename(tmp, out) != 0) {
        if (fd >= 0) unlink(tmp);
        fprintf(stderr, "%s: could not draw %s (%s; scripts/install-deps.sh installs gnuplot-nox)\n",
                cli_prog, out, err ? strerror(err) : "gnuplot failed");
        return EXIT_USAGE;
    }
    printf("loss curve: %s\n", out);
    return 0;
}

static int run(int argc, char **argv);

int main(int argc, char **argv) {
    tks_backend_register(tks_cuda_backend_kind()); /* NULL in a build without CUDA */
    int rc = run(argc, argv);
    tks_train_finalize();
    return rc;
}

static int g_rank;

/* Errors are reported once, by world rank 0: every rank has the same one. */
static int rank_error(void) {
    if (g_rank == 0) return cli_lib_error();
    const tks_error *e = tks_last_error();
    return e->code == TKS_ERR_INTERRUPTED ? EXIT_INTERRUPTED : EXIT_USAGE;
}

/* --check-mesh: the groups as the communicators have them, gathered from every
 * rank, printed by rank 0 (each distinct group once). */
static int mesh_check(void) {
    char *report = NULL;
    if (tks_train_check_mesh(O.tp, O.dp_shard, O.dp_replicate, &report)) return rank_error();
    if (report) fputs(report, stdout);
    free(report);
    return 0;
}

/* --step-model: one step of the configured model on the roofline, without
 * data (the vocabulary from --vocab-size, else the dataset's manifest) */
static int print_step_model(void) {
    tks_roofline hw;
    if (tks_roofline_parse(O.roofline ? O.roofline : "h100", &hw)) return cli_lib_error();
    const char *dir = O.mix ? O.mix->sources[0].dir : O.dataset_dir;
    if (!O.model.vocab_size && dir) {
        tks_dataset *ds = NULL;
        if (tks_dataset_open(dir, &ds)) return cli_lib_error();
        O.model.vocab_size = tks_dataset_tokenizer(ds)->vocab_size;
        tks_dataset_close(ds);
    }
    if (!O.model.vocab_size) return cli_usage_error("--step-model needs --vocab-size N or --dataset DIR");
    uint64_t micro = O.micro_batch ? O.micro_batch : O.global_batch;
    if (O.global_batch % micro)
        return cli_usage_error("--global-batch %llu is not divisible by --micro-batch %llu",
                               (unsigned long long)O.global_batch, (unsigned long long)micro);
    if (micro > 1048576 || O.global_batch / micro > 1048576)
        return cli_usage_error("--step-model: --micro-batch and the number of micro-batches must be at most 1048576");
    char *report = NULL;
    if (tks_step_model(&O.model, (int)micro, (int)O.seq_len, (int)(O.global_batch / micro),
                       O.dtype ? O.dtype : "fp32", &hw, &report))
        return cli_lib_error();
    fputs(report, stdout);
    free(report);
    return 0;
}

/* A JSON string of s on stdout (escaped by jansson). */
static void json_str(const char *s) {
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(t ? t : "null", stdout);
    free(t);
    json_decref(j);
}

/* A loss as metrics.jsonl writes it: 6 decimals, null when there is none. */
static void json_loss(double v) {
    if (isfinite(v)) printf("%.6f", v);
    else fputs("null", stdout);
}

/* --eval-only: the checkpoint's validation loss, per source, on the
 * windows of the packing and document flags given; then one JSON line. */
static int print_eval(void) {
    tks_eval_result *e = malloc(sizeof *e);
    if (!e) return cli_usage_error("out of memory");
    g_rank = tks_train_rank();
    if (tks_train_eval(&O, e)) {
        free(e);
        return rank_error();
    }
    const char *pk = tks_packing_name(e->packing), *dm = O.doc_mask ? "on" : "off",
               *rp = O.reset_positions ? "on" : "off";
    if (g_rank == 0) {
        printf("checkpoint %s (step %llu): validation loss %.6f%s; packing %s, --doc-mask %s, "
               "--reset-positions %s, --seq-len %u\n",
               O.resume, (unsigned long long)e->step, e->val_loss, e->n_sources > 1 ? " (weighted mean)" : "",
               pk, dm, rp, e->seq_len);
        for (uint32_t k = 0; k < e->n_sources; k++)
            printf("  %s: %.6f on %llu of its %llu validation windows (%llu targets)\n", e->names[k],
                   e->by_source[k], (unsigned long long)e->windows[k], (unsigned long long)e->val_windows[k],
                   (unsigned long long)e->targets[k]);
        printf("{\"checkpoint\": ");
        json_str(O.resume);
        printf(", \"step\": %llu, \"packing\": \"%s\", \"doc_mask\": %s, \"reset_positions\": %s, "
               "\"seq_len\": %u, \"val_loss\": ", (unsigned long long)e->step, pk, O.doc_mask ? "true" : "false",
               O.reset_positions ? "true" : "false", e->seq_len);
        json_loss(e->val_loss);
        const char *keys[] = {"val_loss_by_source", "windows", "targets"};
        for (int f = 0; f < 3; f++) {
            printf(", \"%s\": {", keys[f]);
            for (uint32_t k = 0; k < e->n_sources; k++) {
                printf("%s", k ? ", " : "");
                json_str(e->names[k]);
                fputs(": ", stdout);
                if (f == 0) json_loss(e->by_source[k]);
                else printf("%llu", (unsigned long long)(f == 1 ? e->windows[k] : e->targets[k]));
            }
            putchar('}');
        }
        puts("}");
    }
    free(e);
    return 0;
}

static int run(int argc, char **argv) {
    cli_prog = "tokshard-train";
    tks_train_opts_default(&O);
    cli_command cmd = {.flags = FLAGS, .unknown = "unknown option %s", .help = help};
    int prc = cli_parse(&cmd, argc - 1, argv + 1);
    if (prc != CLI_PARSED) return prc;
    /* the sampling flags typed on this command line: a resume refuses one
     * that differs from the checkpoint's instead of replacing it silently */
    static const struct { const char *name; uint32_t bit; } sampling[] = {
        {"--seq-len", TKS_GIVEN_SEQ_LEN}, {"--global-batch", TKS_GIVEN_GLOBAL_BATCH},
        {"--seed", TKS_GIVEN_SEED}, {"--val-tokens", TKS_GIVEN_VAL_TOKENS}};
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof sampling / sizeof sampling[0]; k++) {
            size_t n = strlen(sampling[k].name);
            if (!strncmp(argv[i], sampling[k].name, n) && (argv[i][n] == 0 || argv[i][n] == '='))
                O.given |= sampling[k].bit;
        }
    if (plot_only) return plot(plot_only);
    if (check_mesh) {
        g_rank = tks_train_rank();
        return mesh_check();
    }
    if (mix_file && MIX.n_sources)
        return cli_usage_error("--mix %s and --dataset both name the data: give the sources in one of them", mix_file);
    if (mix_file) {
        uint32_t nc = MIX.n_changes;
        tks_mix_change keep[TKS_MIX_MAX_CHANGES];
        memcpy(keep, MIX.changes, nc * sizeof keep[0]); /* --mix-at adds to the file's schedule */
        if (tks_mix_load(&MIX, mix_file)) return cli_usage_error("%s", tks_last_error()->message);
        for (uint32_t i = 0; i < nc; i++) {
            if (MIX.n_changes >= TKS_MIX_MAX_CHANGES)
                return cli_usage_error("--mix-at: more than %d schedule changes", TKS_MIX_MAX_CHANGES);
            MIX.changes[MIX.n_changes++] = keep[i];
        }
    }
    if (MIX.named) O.mix = &MIX, O.dataset_dir = NULL;
    else if (MIX.n_sources) O.dataset_dir = MIX.sources[0].dir;
    if (!MIX.named && MIX.n_changes)
        return cli_usage_error("--mix-at needs named sources: --dataset NAME=DIR:WEIGHT");
    if (step_model) return print_step_model();
    if (!O.dataset_dir && !O.mix) return cli_usage_error("--dataset DIR is required");
    if (eval_only && !O.resume) return cli_usage_error("--eval-only needs --resume CHECKPOINT, the checkpoint to evaluate");
    if (!O.out_dir && !dry_run && !eval_only) return cli_usage_error("--out RUN_DIR is required");
    char latest[PATH_MAX];
    if (O.resume && !strcmp(O.resume, "latest")) {
        if (!O.out_dir) return cli_usage_error("--resume latest needs --out");
        if (tks_train_latest_checkpoint(O.out_dir, latest, sizeof latest)) return cli_lib_error();
        O.resume = latest;
    }
    if (eval_only) return print_eval();
    g_rank = O.world ? 0 : tks_train_rank();
    if (g_rank != 0) quiet = 1, no_plot = 1;
    char *summary = NULL;
    if (tks_train_plan(&O, &summary)) return rank_error();
    if (g_rank == 0 && (dry_run || !quiet)) fputs(summary, stdout);
    free(summary);
    if (dry_run) return 0;
    O.on_step = on_step;
    O.on_profile = on_profile;
    O.stop = &g_stop;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = tks_train(&O);
    if (rc) return rank_error();
    if (!no_plot) plot(O.out_dir);
    if (g_stop && g_rank == 0) {
        printf("interrupted: checkpoint saved; continue with --resume latest\n");
        return EXIT_INTERRUPTED;
    }
    return 0;
}
