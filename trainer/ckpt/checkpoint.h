/*
 * checkpoint.h - checkpoints as directories (private to trainer/):
 *
 *   step-00000100/
 *     model.safetensors      Hugging Face LLaMA names and shapes, unpadded
 *                            (model.embed_tokens.weight is exactly [vocab_size, dim])
 *     optimizer.safetensors  AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq", unpadded
 *     config.json            Hugging Face LlamaConfig
 *     tokenizer.model        the dataset's tokenizer (so a checkpoint generates on its own)
 *     trainer_state.json     step, data cursor, seed, dataset and tokenizer identity,
 *                            options, and the XXH3-128 of every other file
 *
 * A checkpoint is written as "step-N.tmp" and renamed when complete, so a
 * directory named step-N is always whole; loading verifies every checksum,
 * shape and config field and refuses anything partial or corrupt.
 */
#ifndef TKS_CHECKPOINT_H
#define TKS_CHECKPOINT_H

#include <stdint.h>

#include "trainer/comm/mesh.h"
#include "trainer/model/model.h"
#include "trainer/model/optim.h"

/* What a checkpoint remembers besides tensors. */
typedef struct tks_train_state {
    uint64_t step;               /* optimizer steps done */
    uint64_t cursor;             /* global samples consumed */
    uint64_t seed;               /* data order and init seed */
    uint32_t seq_len;
    uint64_t global_batch;
    uint64_t val_tokens;
    uint64_t manifest_xxh3;      /* dataset identity */
    uint8_t tokenizer_fp[16];    /* XXH3-128 of the tokenizer */
    char options_json[4096];     /* the run's options, for the record (compact JSON object) */
    char mix_json[TKS_MIX_JSON_MAX]; /* a mixture's record with its cursor (tks_mix_record),
                                  * "" for a plain run; trainer_state.json's "mix" */
} tks_train_state;

/* The dataset's tokenizer as a run's checkpoints carry it: its file and,
 * for the byte-level kinds (tokenizer.json, tiktoken.json), the tokenizer
 * parsed once, or for a sentencepiece model its Hugging Face form converted
 * once, so that each save writes it without parsing it again. */
typedef struct tks_checkpoint_tokenizer tks_checkpoint_tokenizer;

/*
 * Opens the tokenizer file `path` (a dataset's, tks_dataset_tokenizer_path;
 * NULL: none) for tks_checkpoint_save: tokenizer.json or tiktoken.json is
 * parsed now, with the tokenizer_config.json beside it; a sentencepiece
 * tokenizer.model is converted now to its tokenizer.json and
 * tokenizer_config.json (tks_hf_spm_convert; a model without a fast
 * equivalent gets none), and each save copies the model file itself, as it
 * does TKS_NO_TOKENIZER_NAME. *out is owned by the caller
 * (tks_checkpoint_tokenizer_free), NULL when path is. Errors: tks_tok_load's
 * (the file does not parse), tks_hf_spm_convert's TKS_ERR_IO, TKS_ERR_NOMEM.
 */
int tks_checkpoint_tokenizer_open(const char *path, tks_checkpoint_tokenizer **out);

/* Frees what tks_checkpoint_tokenizer_open made. Accepts NULL. */
void tks_checkpoint_tokenizer_free(tks_checkpoint_tokenizer *t);

/*
 * Writes checkpoint directory `dir` (must not exist; written as dir.tmp and
 * renamed when every file is complete, so a directory named step-N is always
 * whole; the save holds PARENT/save.lock). Every rank of `mesh` calls it
 * (NULL: one process). Tensors are gathered one at a time to the writer
 * (world rank 0): a weight's tp blocks over the tp group, a moment's
 * dp_shard slices over the dp_shard group first; only replica 0 takes part
 * and no rank holds more than one full tensor on the host. The writer's
 * checks (existing dir, lock, unwritable parent) and every allocation are
 * agreed by the whole world before any gather, so a failure on one rank
 * fails every rank with that rank's message instead of leaving the others in
 * a collective. `opt` may be NULL (weights only); tok (may be NULL: none;
 * read by the writer only, so other ranks may pass NULL) is copied into the
 * checkpoint with its Hugging Face files (tokenizer.json and
 * tokenizer_config.json).
 * Errors: TKS_ERR_IO, TKS_ERR_NOSPACE, TKS_ERR_EXISTS, TKS_ERR_NOMEM, TKS_ERR_LOCKED.
 */
int tks_checkpoint_save(const char *dir, tks_model *m, tks_optim *opt, const tks_train_state *st,
                        const tks_checkpoint_tokenizer *tok, tks_mesh *mesh);

/* Reads config.json and trainer_state.json, verifying the checksums of
 * every file, and checks that every value of model.safetensors and
 * optimizer.safetensors is a finite number (one read of each: the check
 * every loader of a checkpoint passes through before tks_checkpoint_load).
 * Errors: TKS_ERR_IO, TKS_ERR_MANIFEST (missing or corrupt file, checksum
 * mismatch: names the file and says what to do), tks_st_open's (a tensor
 * file that does not parse), TKS_ERR_NONFINITE (a NaN or an infinity:
 * names the file, the tensor and the first such element's index). */
int tks_checkpoint_peek(const char *dir, tks_model_config *cfg, tks_train_state *st);

/* Loads weights (and moments when opt is not NULL: only this rank's ZeRO
 * slice of them) into the model's local blocks, one tensor at a time;
 * padding rows are zeroed. No collective: callers agree on the result. Shapes must match the model's config
 * exactly. Checksums and finiteness are tks_checkpoint_peek's: call it first.
 * Errors: TKS_ERR_MANIFEST, TKS_ERR_HEADER, TKS_ERR_ARG (shape). */
int tks_checkpoint_load(const char *dir, tks_model *m, tks_optim *opt);

/* Removes all but the newest `keep` step-* directories under `parent`
 * (keep 0 = keep all; the newest is never removed), oldest first, each
 * renamed to NAME.del before it is deleted (so a crash never leaves a
 * half-deleted NAME), and leftover NAME.del directories. Returns 0 or
 * TKS_ERR_IO. */
int tks_checkpoint_prune(const char *parent, unsigned keep);

/* The newest complete checkpoint under `parent` into out (PATH_MAX), or
 * TKS_ERR_IO when there is none. */
int tks_checkpoint_latest(const char *parent, char *out, size_t cap);

/* The oldest step directory under `parent` (whole or not: a save would
 * collide with either) whose step is greater than `step`: 1 with its path in
 * out[cap], 0 when there is none (or no `parent`). */
int tks_checkpoint_after(const char *parent, uint64_t step, char *out, size_t cap);

#endif
