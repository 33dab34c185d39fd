/*
 * trainer.h - the public API of tokshard's trainer layer: train a LLaMA-style
 * model on a tokshard dataset, checkpoint it, and generate from it.
 * This is the layer's one public header: the sampler (data order,
 * docs/SAMPLING.md; its own library, tks_sampler) comes with it through
 * sampler.h; backend.h, comm.h, mesh.h, model.h, optim.h and checkpoint.h
 * are private to trainer/ (tests use them, tools do not).
 *
 * Errors are TKS_ERR_* codes with context in tks_last_error(); the library
 * never prints or exits: progress reaches the caller through callbacks.
 */
#ifndef TKS_TRAINER_H
#define TKS_TRAINER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "sampler/sampler.h"

/* The model's shape (Hugging Face LlamaConfig fields). */
typedef struct tks_model_config {
    uint32_t vocab_size;         /* V: real vocabulary (the tokenizer's) */
    uint32_t vocab_divisible_by; /* padding granularity per tp rank, default 64 */
    uint32_t dim;                /* C */
    uint32_t n_layers;
    uint32_t n_heads;            /* NH */
    uint32_t n_kv_heads;         /* NKV, divides NH */
    uint32_t ffn_dim;            /* F */
    uint32_t max_seq_len;
    float rope_theta;            /* 10000 */
    float norm_eps;              /* 1e-5 */
    float init_std;              /* 0.02 */
    int tie_embeddings;          /* lm_head shares model.embed_tokens.weight */
} tks_model_config;

typedef struct tks_step_info tks_step_info;


enum { TKS_GIVEN_SEQ_LEN = 1u, TKS_GIVEN_GLOBAL_BATCH = 2u, TKS_GIVEN_SEED = 4u, TKS_GIVEN_VAL_TOKENS = 8u };

typedef struct tks_train_opts {
    const char *dataset_dir;      /* tokshard dataset (manifest.json + shards); NULL with mix */
    const tks_mix_spec *mix;      /* a mixture of named sources (borrowed), or NULL: dataset_dir
                                   * alone, the plain single-dataset run */
    uint64_t warn_repeats;        /* warn (on_step's note) when a source is repeated more than
                                   * this many times: when it starts its epoch warn_repeats + 2
                                   * (1-based); 0 warns at the first repeat; default 4 */
    int doc_mask;                 /* attention inside each packed document only (block-causal
                                   * from the shards' document index) */
    int reset_positions;          /* RoPE positions restart at each document */
    const char *packing;          /* "concat" (NULL, the default) or "best-fit": windows of whole
                                   * documents (docs/SAMPLING.md §10), padding kept out of the loss */
    const char *pack_plans;       /* best-fit: directory of the plan files (tks_sampler_create_planned,
                                   * made by the ranks together when missing); NULL: RUN/plans for
                                   * tks_train, memory for tks_train_plan */
    const char *val_dataset_dir;  /* optional separate validation dataset (else --val-tokens) */
    const char *out_dir;          /* run directory: checkpoints/, metrics.jsonl, loss.svg */
    const char *resume;           /* checkpoint dir to resume from, or NULL */
    tks_model_config model;       /* vocab_size 0 = the dataset's vocab_size */
    uint64_t steps;               /* optimizer steps in total (including resumed ones) */
    uint64_t stop_at;             /* save and return after this step (0 = steps); the schedule
                                   * still spans `steps`, so a resumed run continues it */
    int change_schedule;          /* resume: allow steps, lr, min_lr or warmup_steps to differ
                                   * from the checkpoint's run (the learning rate jumps to the
                                   * new schedule's value); refused otherwise */
    uint32_t given;               /* TKS_GIVEN_* bits: which of seq_len, global_batch, seed and
                                   * val_tokens the caller set itself. A resume takes the
                                   * checkpoint's values of the others and refuses a given one
                                   * that differs from the checkpoint's (the samples of the
                                   * steps to come depend on them) */
    uint32_t seq_len;
    uint64_t global_batch;        /* samples per optimizer step, all ranks together */
    uint64_t micro_batch;         /* samples per forward/backward (0 = whole per-rank batch) */
    uint64_t seed;
    float lr, min_lr, beta1, beta2, adam_eps, weight_decay, grad_clip;
    uint64_t warmup_steps;
    uint64_t val_tokens;          /* held out from the end of the dataset's token stream */
    uint64_t eval_every;          /* 0 = never */
    uint64_t eval_batches;        /* global batches per evaluation */
    uint64_t save_every;          /* 0 = only at the end */
    unsigned keep_checkpoints;    /* newest K kept (0 = all) */
    int threads;                  /* 0 = OpenMP default */
    const char *device;           /* "cpu", "cuda", "auto" (NULL = auto) */
    const char *comm;             /* collectives: "auto" (NULL: NCCL under cuda, else MPI),
                                   * "mpi", "nccl" (docs/GPU.md) */
    const char *dtype;            /* "fp32" (NULL) or "bf16": compute dtype (mixed precision) */
    int deterministic;            /* run-to-run identical bits on every backend: the
                                   * deterministic algorithms where a backend's fast ones are
                                   * not (cuDNN's attention backward), at their speed and
                                   * memory cost (tks_backend_kind.set_deterministic) */
    /* parallel layout (docs/PARALLELISM.md): 0 = default (tp 1, dp_replicate 1,
     * dp_shard = the rest of the world) */
    int tp, dp_shard, dp_replicate;
    int world;                    /* plan for this many processes (dry runs); 0 = as launched */
    /* --profile: time every backend op (the backend kind's timer: the host
     * clock on the CPU, CUDA events on the GPU, read once per step) over the first
     * profile_steps steps of this run (0 = off); rank 0's table (op, calls,
     * ms, ms per step, share, TFLOP/s or GB/s, the roofline's predicted ms;
     * collectives and data loading are
     * not backend ops) goes to on_profile once they are done, or at the end
     * of a run that stops sooner */
    uint64_t profile_steps;
    void (*on_profile)(const char *table, void *ctx);
    /* the roofline that prices each profiled call (tks_roofline_parse's
     * spec; NULL: the preset matching a GPU's name, none on the CPU) */
    const char *roofline;
    /* progress: called once per step and once per evaluation on the calling thread */
    void (*on_step)(const tks_step_info *info, void *ctx);
    void *ctx;
    volatile sig_atomic_t *stop;  /* set (e.g. by SIGINT): save a checkpoint and return */
} tks_train_opts;

struct tks_step_info {
    uint64_t step;                /* 1-based step just finished */
    uint64_t steps;               /* total */
    int is_eval;                  /* 1: val_loss is set, the rest describes the last step */
    double loss;                  /* mean training loss of the step (nats per token) */
    double val_loss;
    double lr, grad_norm;         /* grad_norm before clipping */
    double tokens_per_s;          /* this step's throughput (all ranks) */
    uint64_t comm_bytes[4];       /* payload bytes this rank handed to collectives this step,
                                   * by kind (comm.h: all-reduce, reduce-scatter, all-gather,
                                   * broadcast), over all its groups */
    double elapsed_s, eta_s;
    double host_wait_s;           /* seconds so far the host waited on the backend (sync, reads) */
    const char *checkpoint;       /* non-NULL when a checkpoint was just written */
    /* a mixture's evaluation: val_loss is the mean of the sources' losses
     * weighted by the weights of the phase in force, each source's loss in
     * val_by_source[k] (NAN where a source has no validation window) */
    uint32_t n_sources;           /* 0 for a plain run */
    const char *const *source_names;
    const double *val_by_source;
    const char *note;             /* lines to log (a source starting an epoch), or NULL */
    int note_is_warning;          /* the note holds a warning (--warn-repeats) */
};

/* Sets the defaults: LLaMA-ish small model (dim 256, 4 layers, 8 heads, 4 kv
 * heads), seq_len 256, global batch 16, lr 3e-3 -> 3e-4, warmup 20, betas
 * (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, eval every 50 steps. */
void tks_train_opts_default(tks_train_opts *o);

/*
 * Everything that can be checked without computing: dataset vs model vocab
 * (a dataset vocab larger than the model's is refused, naming both), the
 * tokenizer fingerprint of a resumed checkpoint against the dataset's, the
 * batch layout, the config, the split. Fills `summary` (may be NULL) with a
 * human-readable description of the resolved run (config, parameters, memory
 * estimate, first steps' samples) for --dry-run. summary is malloc'd.
 */
int tks_train_plan(const tks_train_opts *o, char **summary);

/* Trains. Returns 0 when the steps are done or a stop was requested (a
 * checkpoint is saved in both cases). Under mpirun every rank calls it with
 * the same options; only world rank 0 writes metrics, checkpoints and calls
 * on_step. An error on any rank stops every rank with that rank's message.
 * Errors: TKS_ERR_ARG (an option, a layout, ranks launched with different
 * settings, --steps or a schedule the checkpoint does not allow), TKS_ERR_EXISTS
 * (a checkpoint directory in the way), TKS_ERR_RESUME and TKS_ERR_TOKENIZER (a
 * checkpoint of another dataset or tokenizer), TKS_ERR_TOKEN_RANGE (ids the
 * model's vocabulary cannot hold, before anything is allocated or in a batch),
 * TKS_ERR_NONFINITE (divergence, or a resumed checkpoint holding NaN or inf),
 * TKS_ERR_NOMEM, TKS_ERR_IO and TKS_ERR_NOSPACE (run directory, metrics,
 * checkpoints), and every error of
 * tks_dataset_open, tks_checkpoint_peek and the backend's creation. A stop
 * request is not an error: it returns 0 after the checkpoint is saved. */
int tks_train(const tks_train_opts *o);

/* World rank of this process (0 without mpirun); initializes MPI if needed. */
int tks_train_rank(void);

/* Finalizes MPI if the trainer initialized it. Call once before exit. */
void tks_train_finalize(void);

/*
 * --check-mesh: builds the communicators of the layout tp x dp_shard x
 * dp_replicate (0 = default, as in tks_train_opts) for the processes mpirun
 * started, verifies every group against the plan (a difference is
 * TKS_ERR_ARG naming both member lists), and gathers the groups as every
 * rank's communicators have them. On world rank 0 *report (malloc'd) holds
 * the plan and the groups as built; elsewhere it is NULL. Collective.
 */
int tks_train_check_mesh(int tp, int dp_shard, int dp_replicate, char **report);

/* A device's roofline: the peaks the step model and --profile's predicted
 * column price each op with (docs/GPU.md, "The step model"). */
typedef struct tks_roofline {
    const char *name;             /* "h100", "h200", "a100" or "custom" */
    double bf16_tflops;           /* dense tensor-core peak, bf16 inputs (TFLOP/s) */
    double fp32_tflops;           /* fp32 products without TF32 (TFLOP/s) */
    double mem_gbs;               /* device memory bandwidth (GB/s, 1e9 bytes) */
    double link_gbs;              /* host <-> device (GB/s) */
    double flops_eff, mem_eff;    /* achievable fractions of the two peaks (1 for custom) */
    double launch_us;             /* host cost of one op call, for the launch floor */
} tks_roofline;

/* spec: a preset ("h100", "h200", "a100": vendor peaks, stepmodel.c cites
 * them) or four positive numbers "BF16_TFLOPS,FP32_TFLOPS,MEMORY_GBS,LINK_GBS"
 * (achievable fractions 1). Errors: TKS_ERR_ARG naming the spec and the forms. */
int tks_roofline_parse(const char *spec, tks_roofline *out);
/* The preset whose GPU name the description contains (H100, H200, A100):
 * 1 and *out set, else 0. */
int tks_roofline_for_device(const char *description, tks_roofline *out);

/* The step model: one optimizer step of cfg (defaults filled in as training
 * does; vocab_size must be set) with `accum` micro-batches of B x T samples
 * on one device (tp 1) in dtype "fp32" or "bf16", op for op as the trainer
 * issues them, each priced on hw's roofline: per op the calls, FLOPs, bytes,
 * predicted time, share and what bounds it; then the predicted step time,
 * tokens/s, MFU (torchtitan's FLOPs per token against hw's bf16 peak) and
 * the launch floor. *report: malloc'd text the caller frees. Collectives
 * and data loading are not in it. Errors: tks_model_config_check's,
 * TKS_ERR_ARG (dtype, sizes), TKS_ERR_NOMEM. */
int tks_step_model(const tks_model_config *cfg, int B, int T, int accum, const char *dtype,
                   const tks_roofline *hw, char **report);

/* A checkpoint's loss on validation windows (tks_train_eval). */
typedef struct tks_eval_result {
    uint64_t step;                /* the checkpoint's step */
    double val_loss;              /* a plain dataset's loss; a mixture's mean of its sources'
                                   * losses weighted as at the checkpoint's cursor (nats per
                                   * target) */
    uint32_t n_sources;           /* 1 for a plain dataset */
    char names[TKS_MIX_MAX_SOURCES][TKS_MIX_NAME_MAX];
    double by_source[TKS_MIX_MAX_SOURCES];   /* each source's mean loss (NAN: no window) */
    uint64_t windows[TKS_MIX_MAX_SOURCES];   /* windows evaluated, every rank's */
    uint64_t targets[TKS_MIX_MAX_SOURCES];   /* tokens predicted in them (padding excluded) */
    uint64_t val_windows[TKS_MIX_MAX_SOURCES]; /* windows in the source's validation split */
    tks_packing packing;          /* the windows' packing */
    uint32_t seq_len;
} tks_eval_result;

/*
 * The loss of checkpoint o->resume on validation windows, without training
 * (tokshard-train --eval-only): the windows a training run with the same
 * options evaluates (per source, the first eval_batches x global_batch of
 * its validation split, split over the data-parallel ranks), but packed as
 * o->packing says and computed with o->doc_mask and o->reset_positions as
 * given, whatever the checkpoint was trained with. The model is the
 * checkpoint's; seq_len, global_batch, seed and val_tokens are the
 * checkpoint's unless given (o->given), so that the same flags give the
 * loss of the training's own evaluation bit for bit. The dataset (or
 * mixture) may be any built with the checkpoint's tokenizer. Nothing is
 * written (best-fit plans stay in memory unless o->pack_plans). Under
 * mpirun every rank calls it with the same options. *out is filled on
 * success. Errors: TKS_ERR_ARG (no o->resume; no validation windows;
 * fewer than one micro-batch of them per data-parallel rank; an option),
 * TKS_ERR_TOKENIZER (a dataset of another tokenizer), the checkpoint's
 * (tks_train_read_sampling's: TKS_ERR_MANIFEST, TKS_ERR_NONFINITE),
 * tks_dataset_open's, TKS_ERR_TOKEN_RANGE, TKS_ERR_NOMEM and the backend's.
 */
int tks_train_eval(const tks_train_opts *o, tks_eval_result *out);

/* The newest complete checkpoint of a run directory (RUN/checkpoints/step-N)
 * into out (cap bytes). Errors: TKS_ERR_IO when there is none. */
int tks_train_latest_checkpoint(const char *run_dir, char *out, size_t cap);

/* What decides the samples a run reads (docs/SAMPLING.md), read back from
 * one of its checkpoints so that `tokshard sample-plan --run` shows exactly
 * what that run read and will read. */
typedef struct tks_run_sampling {
    char checkpoint[4096];        /* the checkpoint directory read */
    char mix_json[TKS_MIX_JSON_MAX]; /* a mixture's record (tks_mix_from_json), "" for a plain run */
    char dataset[4096];           /* the training dataset (absolute; a relative path of an older
                                   * checkpoint is resolved from here or the run directory);
                                   * "" for a mixture (its sources are in mix_json) */
    int val_dataset;              /* 1: validation used a separate dataset (no split) */
    uint32_t seq_len;
    uint64_t global_batch, micro_batch, seed, val_tokens;
    uint64_t step;                /* steps done when the checkpoint was written */
    uint64_t cursor;              /* global samples consumed by then */
} tks_run_sampling;

/* Fills `out` from `path`: a checkpoint directory (has trainer_state.json) or
 * a run directory (its newest complete checkpoint). The checkpoint's files are
 * verified against their recorded checksums first, and its tensors hold
 * finite numbers only.
 * Errors: TKS_ERR_IO (no checkpoint under a run directory), TKS_ERR_MANIFEST
 * (a corrupt or incomplete checkpoint: the message names the file),
 * TKS_ERR_NONFINITE (a NaN or an infinity in a weight or an AdamW moment:
 * the message names the file, the tensor and the element). */
int tks_train_read_sampling(const char *path, tks_run_sampling *out);

/* Generation from a checkpoint with a KV cache. */
typedef struct tks_generate_opts {
    const char *checkpoint;       /* checkpoint dir (has tokenizer.model) */
    const char *prompt;           /* UTF-8 text; may be empty: the context then starts with
                                   * BOS, else EOS; a tokenizer with neither refuses it */
    uint32_t max_tokens;
    uint32_t min_tokens;          /* EOS is not drawn before this many tokens (its logit
                                   * masked, as Hugging Face's min_new_tokens); 0 = off;
                                   * at most max_tokens */
    float temperature;            /* 0 = greedy */
    float top_p;                  /* nucleus sampling (Holtzman et al. 2020); 1 = off */
    uint64_t seed;
    int threads;
    /* receives each piece of text as it is produced */
    void (*on_text)(const char *text, size_t len, void *ctx);
    void *ctx;
    struct tks_generate_stats *stats; /* may be NULL: what was cut, filled by tks_generate */
} tks_generate_opts;

/* What tks_generate had to leave out to stay within the model's context
 * (max_seq_len tokens). */
typedef struct tks_generate_stats {
    uint64_t prompt_tokens;       /* the prompt's tokens (without BOS) */
    uint64_t prompt_dropped;      /* its oldest tokens left out of the context */
    uint64_t generated;           /* tokens generated (an EOS ends early) */
    uint64_t slides;              /* times the context was full and restarted from its newest
                                   * half (the KV cache recomputed) */
    uint32_t context;             /* max_seq_len */
} tks_generate_stats;

/*
 * Continues o->prompt for up to o->max_tokens tokens (an EOS ends it, from
 * token o->min_tokens on). The
 * context is the model's max_seq_len tokens: a longer prompt keeps its most
 * recent tokens (after BOS), and when generation fills the context it
 * restarts from the newest half (BOS kept), recomputing the KV cache; both
 * are counted in o->stats. Errors: the checkpoint's (tks_checkpoint_peek,
 * tks_checkpoint_load; TKS_ERR_NONFINITE for a NaN or an infinity in its
 * weights), TKS_ERR_TOKENIZER (its tokenizer.model is not the
 * model's, or not a sentencepiece model), TKS_ERR_ARG (min_tokens above
 * max_tokens, checked first; an empty prompt with a tokenizer without BOS
 * and EOS), TKS_ERR_UTF8 (a prompt that is not UTF-8, for a tokenizer that
 * needs it: byte-level BPE, tiktoken), TKS_ERR_NOMEM.
 */
int tks_generate(const tks_generate_opts *o);

/*
 * Writes a clean Hugging Face model directory from a checkpoint (or a run
 * directory: its newest checkpoint), after verifying the checkpoint's
 * checksums: model.safetensors, config.json (with bos/eos/pad ids),
 * tokenizer.model, tokenizer.json and tokenizer_config.json
 * (tks_hf_tokenizer_write); no optimizer state. Written as DIR.tmp and
 * renamed. A model trained on a dataset imported without a tokenizer (its
 * checkpoint holds tokenizer.none) is exported without tokenizer files, and
 * *tokenizer_missing (may be NULL) is set to 1 (else 0).
 * Errors: TKS_ERR_EXISTS (DIR exists), TKS_ERR_MANIFEST (a corrupt or
 * incomplete checkpoint), TKS_ERR_NONFINITE (a NaN or an infinity in its
 * weights or optimizer state), TKS_ERR_TOKENIZER, TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_export_hf(const char *checkpoint, const char *out_dir, int *tokenizer_missing);

/*
 * The trainer's device-side step (forward, backward, global-norm clip and
 * AdamW, with the loss and the norm kept on the device) on one process,
 * timed over `steps` steps after `warmup` untimed ones, on uniform random
 * ids (a fixed generator, so every run sees the same batches). For the
 * benchmarks (bench/gpu): what it measures is the step the trainer runs,
 * without data loading or collectives.
 */
typedef struct tks_step_bench_opts {
    const char *device;      /* a registered backend: "cpu", "cuda", "auto" */
    int threads;             /* CPU threads (0: OpenMP's default) */
    tks_model_config model;  /* zero fields take the trainer's defaults (ffn_dim, rope_theta, ...) */
    int B, T;                /* micro-batch: B sequences of T tokens, 2 <= T <= max_seq_len */
    int steps, warmup;       /* steps >= 1, warmup >= 0 */
    int bf16;                /* 1: bf16 activations and compute weights, else fp32 */
    int profile;             /* > 0: that many more steps after the timed ones, every op timed
                              * (tks_profile_attach, priced on the device's roofline preset);
                              * their table in the result's profile */
} tks_step_bench_opts;

typedef struct tks_step_bench_result {
    double step_s;           /* seconds per timed step (wall clock, mean) */
    double loss;             /* mean cross-entropy of the last step, nats */
    uint64_t params;         /* parameters of the model (tks_model_n_params) */
    size_t peak_bytes;       /* most device bytes held through the backend's alloc (0: not counted) */
    size_t reserved_bytes;   /* device bytes the backend holds outside alloc */
    double plan_bytes;       /* the memory plan of this run (--dry-run's), bytes */
    char backend[16];        /* "cpu", "cuda" */
    char device[512];        /* the device and library versions ("" when the backend says none) */
    char attention[128];     /* which attention kernel ran */
    char *profile;           /* with opts.profile > 0: tks_profile_report's table (malloc'd,
                              * the caller frees), else NULL */
} tks_step_bench_result;

/* Errors: TKS_ERR_ARG (a shape or count out of range, an unknown device),
 * TKS_ERR_NOMEM, and the backend's (TKS_ERR_IO for a device failure). */
int tks_step_bench(const tks_step_bench_opts *o, tks_step_bench_result *out);

/* The CPU backend's attention, forward and backward in fp32, on n_windows
 * windows of T tokens in batches of B (heads NH, kv heads NKV, head dim HD,
 * random q, k, v), with the causal mask and with the block-causal mask of
 * doc (host int32[n_windows, T], document starts as tks_sampler_doc_starts
 * gives them), alternating, reps times each: the fastest of each, in
 * seconds for all windows. For the benchmarks (bench/attn_docs.c). */
typedef struct tks_attention_bench_opts {
    int threads, B, T, NH, NKV, HD, reps, n_windows;
    const int32_t *doc;
} tks_attention_bench_opts;
typedef struct tks_attention_bench_result {
    double causal_s, doc_mask_s;
    double pairs_kept;       /* (query, key) pairs the block-causal mask keeps, of the causal's */
} tks_attention_bench_result;
/* Errors: TKS_ERR_ARG (sizes, fewer than B windows, doc NULL), TKS_ERR_NOMEM. */
int tks_attention_bench(const tks_attention_bench_opts *o, tks_attention_bench_result *out);

/*
 * Backends beyond the CPU reference. A backend library (trainer/cuda:
 * tks_cuda_backend_kind, trainer/cuda/tks_cuda.h) gives its kind; a program
 * registers it before its first run (tks_train, tks_generate), and --device
 * NAME then finds it. A program that registers none runs on the CPU only and
 * does not link the other backends' libraries. NULL is accepted and does
 * nothing (the kind of a build without that backend). Not thread-safe: call
 * it from main. The kind is borrowed for the life of the program.
 * Errors: TKS_ERR_ARG (another kind of the same name, or more than 8 kinds).
 */
typedef struct tks_backend_kind tks_backend_kind;
int tks_backend_register(const tks_backend_kind *kind);

#endif /* TKS_TRAINER_H */
