/* checkpoint.c - save, verify and load checkpoint directories (checkpoint.h). */
#define _GNU_SOURCE
#include "trainer/ckpt/checkpoint.h"
#include "trainer/trainer.h"
#include "tokenizer/tokenizer.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/tks.h"
#include "common/tks_json.h"
#include "trainer/ckpt/safetensors.h"

#define STATE_FORMAT "tokshard-checkpoint"
static const char *const FILES[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                                    "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                    TKS_NO_TOKENIZER_NAME, "tiktoken.json", "tokenizer.tiktoken"};
#define N_FILES (sizeof FILES / sizeof FILES[0])

/* Shortest decimal that reads back as the same float, as a double. */
static double short_float(float f) {
    char b[32];
    tks_float_text(b, sizeof b, f);
    return strtod(b, NULL);
}

/* ---- one tensor at a time to the writer ----------------------------------------- */

/* Host allocation for a checkpoint. Test hook (builds with TKS_TEST_HOOKS):
 * TOKSHARD_TEST_CKPT_NOMEM=K makes this process's K-th call fail, so that an
 * allocation failure on one rank can be shown to end the job, not hang it. */
static void *ckpt_alloc(size_t bytes) {
#ifdef TKS_TEST_HOOKS
    static long calls = 0;
    const char *k = getenv("TOKSHARD_TEST_CKPT_NOMEM");
    if (k && ++calls == atol(k)) return NULL;
#endif
    return malloc(bytes ? bytes : 1);
}

/* Test hook (builds with TKS_TEST_HOOKS): TOKSHARD_TEST_CKPT_STOP=POINT:N
 * stops the process (SIGSTOP) the N-th time a save reaches POINT, so that the
 * test can kill -9 it there (the kill comes from the test, never from here).
 * Points: model, optimizer, config, tokenizer, state (each after that file is
 * complete), renamed (after the rename, before the directory's fsync),
 * pruning (before an old checkpoint is removed). */
static void stop_point(const char *point) {
#ifdef TKS_TEST_HOOKS
    static long seen = 0;
    const char *p = getenv("TOKSHARD_TEST_CKPT_STOP");
    size_t l = strlen(point);
    if (p && !strncmp(p, point, l) && (p[l] == 0 || p[l] == ':') &&
        ++seen == (p[l] == ':' ? atol(p + l + 1) : 1))
        raise(SIGSTOP);
#else
    (void)point;
#endif
}

typedef struct gctx {
    tks_mesh *mesh;               /* NULL: one process */
    tks_comm *tp, *shard, *world;
    int rep, shard_rank, tp_rank; /* this rank's coordinates */
    int writer;
    size_t sb, se;                /* this rank's ZeRO slice of the tp-local flat buffer */
} gctx;

static size_t blk_of(const tks_param *p) { return (size_t)(p->lrows * p->lcols); }

/*
 * The full unpadded tensor of parameter p at the writer, from one of three
 * tp-local flat sources (which: 0 weights, 1 exp_avg, 2 exp_avg_sq).
 * Moments are first gathered from the dp_shard slices that hold the block to
 * dp_shard rank 0, then every block goes over the tp group to tp rank 0:
 * only the ranks of replica 0 take part, and no rank holds more than this
 * tensor. Every rank of the world calls it for every tensor; the host
 * buffers are allocated first and the world agrees on that before any gather
 * (an allocation failing on one rank fails all, instead of leaving the
 * others in a collective). On the writer *full is malloc'd rows_real x cols.
 */
static int gather_tensor(gctx *g, tks_model *m, tks_optim *opt, const tks_param *p, int which,
                         float **full) {
    tks_backend *be = tks_model_backend(m);
    *full = NULL;
    size_t blk = blk_of(p), T = (size_t)g->tp->size, S = (size_t)g->shard->size;
    int tp_split = T > 1 && p->split != TKS_TP_REPLICATED;
    int in_rep0 = g->rep == 0, in_tp_gather = in_rep0 && g->shard_rank == 0;
    /* does this tp rank's block count? (an unsplit tensor: tp rank 0's only) */
    int my_block = tp_split || g->tp_rank == 0;
    float *block = NULL, *all = NULL, *piece = NULL;
    size_t a0 = p->offset, a1 = a0 + blk, lo = a0 > g->sb ? a0 : g->sb, hi = a1 < g->se ? a1 : g->se;
    size_t mine = which && lo < hi ? hi - lo : 0;
    int rc = 0;
    if (in_rep0 && my_block) {
        if (!(block = ckpt_alloc(blk * sizeof *block))) rc = TKS_ERR_NOMEM;
        if (which && mine && !(piece = ckpt_alloc(mine * sizeof *piece))) rc = TKS_ERR_NOMEM;
    }
    if (g->writer && !rc && !(all = ckpt_alloc((tp_split ? T : 1) * blk * sizeof *all))) rc = TKS_ERR_NOMEM;
    if (g->writer && !rc && !(*full = ckpt_alloc((size_t)(p->rows_real * p->cols) * sizeof **full)))
        rc = TKS_ERR_NOMEM;
    if (rc)
        rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE,
                      "out of memory gathering %s%s for the checkpoint (%zu bytes per block); free "
                      "memory or save from more processes",
                      p->name, which == 1 ? ".exp_avg" : which == 2 ? ".exp_avg_sq" : "", blk * 4);
    rc = tks_comm_agree(g->world, rc);
    if (!rc && in_rep0 && my_block) {
        if (!which) {
            be->ops->download(be, block, tks_model_weights(m) + p->offset, blk * sizeof *block);
        } else {
            /* dp_shard member d holds [d*ns, (d+1)*ns) of the flat buffer */
            size_t counts[1024], ns = g->se - g->sb;
            if (S > 1024) rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "dp_shard above 1024");
            for (size_t d = 0; d < S && !rc; d++) {
                size_t x = a0 > d * ns ? a0 : d * ns, y = a1 < (d + 1) * ns ? a1 : (d + 1) * ns;
                counts[d] = x < y ? (y - x) * sizeof(float) : 0;
            }
            const float *src = which == 1 ? tks_optim_m(opt) : tks_optim_v(opt);
            if (!rc && mine) be->ops->download(be, piece, src + (lo - g->sb), mine * sizeof *piece);
            if (!rc) rc = g->shard->t->gatherv_host(g->shard, g->shard_rank == 0 ? block : NULL, counts, piece, 0);
        }
    }
    if (!rc && in_tp_gather && my_block) {
        size_t counts[1024];
        if (T > 1024) rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tp above 1024");
        for (size_t t = 0; t < T && !rc; t++) counts[t] = tp_split || t == 0 ? blk * sizeof(float) : 0;
        if (!rc && T > 1) rc = g->tp->t->gatherv_host(g->tp, g->writer ? all : NULL, counts, block, 0);
        else if (!rc && g->writer) memcpy(all, block, blk * sizeof *all);
    } else if (!rc && in_tp_gather && T > 1) {
        /* an unsplit tensor: the other tp ranks send nothing but take part */
        size_t counts[1024] = {0};
        counts[0] = blk * sizeof(float);
        rc = g->tp->t->gatherv_host(g->tp, NULL, counts, NULL, 0);
    }
    if (!rc && g->writer) {
        if (p->split == TKS_TP_COLS && tp_split) {
            for (size_t t = 0; t < T; t++)
                for (uint64_t r = 0; r < p->rows_real; r++)
                    memcpy(*full + r * p->cols + t * p->lcols, all + (t * p->rows + r) * p->lcols,
                           (size_t)p->lcols * sizeof **full);
        } else {
            memcpy(*full, all, (size_t)(p->rows_real * p->cols) * sizeof **full);
        }
    }
    free(block);
    free(piece);
    free(all);
    if (rc) {
        free(*full);
        *full = NULL;
    }
    return rc;
}

static int write_config(const char *path, const tks_model_config *c, const tks_train_state *st) {
    (void)st;
    json_t *j = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b, s:s, s:f, s:s, s:b, s:b, s:I}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size",
        (json_int_t)c->vocab_size, "hidden_size", (json_int_t)c->dim, "intermediate_size",
        (json_int_t)c->ffn_dim, "num_hidden_layers", (json_int_t)c->n_layers,
        "num_attention_heads", (json_int_t)c->n_heads, "num_key_value_heads",
        (json_int_t)c->n_kv_heads, "max_position_embeddings", (json_int_t)c->max_seq_len,
        "rms_norm_eps", short_float(c->norm_eps), "rope_theta", short_float(c->rope_theta),
        "tie_word_embeddings", c->tie_embeddings, "hidden_act", "silu", "initializer_range",
        short_float(c->init_std), "torch_dtype", "float32", "attention_bias", 0, "mlp_bias", 0,
        "tokshard_vocab_divisible_by", (json_int_t)c->vocab_divisible_by);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    int rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static int rm_rf(const char *p) { return nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* Removes a directory crash-safely: renamed to NAME.del first (a name
 * nothing takes for a checkpoint), then deleted; a crash in between leaves
 * NAME.del, removed by the next prune. */
static int remove_dir(const char *p) {
    char del[PATH_MAX];
    if (snprintf(del, sizeof del, "%s.del", p) >= (int)sizeof del)
        return tks_fail(TKS_ERR_ARG, p, TKS_NONE, TKS_NONE, "path too long: %s", p);
    if (rename(p, del) != 0 || rm_rf(del) != 0)
        return tks_fail(TKS_ERR_IO, p, TKS_NONE, TKS_NONE,
                        "cannot remove old checkpoint %s: %s; remove it by hand", p, strerror(errno));
    return 0;
}

static void parent_of(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s", dir);
    char *sl = strrchr(out, '/');
    if (sl) *sl = 0;
    else snprintf(out, cap, ".");
    if (!out[0]) snprintf(out, cap, "/");
}

/* A checkpoint being saved: what the writer holds until it publishes. */
typedef struct save_ctx {
    const char *dir;
    char tmp[PATH_MAX], parent[PATH_MAX], lock_path[PATH_MAX];
    int lock_fd, made_tmp;
    tks_st_tensor *t;      /* the tensors of each file (2 * np entries) */
    char (*names)[96];
    tks_st_stream *out[2]; /* model.safetensors, optimizer.safetensors */
} save_ctx;

/* The writer's checks before anything is written: the save lock, no
 * directory of this step yet, a fresh DIR.tmp. */
static int save_begin(save_ctx *s, const tks_train_state *st) {
    const char *dir = s->dir;
    parent_of(dir, s->parent, sizeof s->parent);
    int rc = 0;
    if (snprintf(s->tmp, sizeof s->tmp, "%s.tmp", dir) >= (int)sizeof s->tmp)
        rc = tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "checkpoint path too long: %s", dir);
    if (!rc) rc = tks_path_join(s->lock_path, sizeof s->lock_path, s->parent, "save.lock");
    if (!rc) rc = tks_lock(s->lock_path, "tokshard-train checkpoint save", &s->lock_fd);
    struct stat sb;
    if (!rc && stat(dir, &sb) == 0)
        rc = tks_fail(TKS_ERR_EXISTS, dir, TKS_NONE, TKS_NONE,
                      "checkpoint %s already exists: this run directory already went past step "
                      "%llu; resume from its newest checkpoint (--resume latest) or use another "
                      "--out", dir, (unsigned long long)st->step);
    if (!rc) rm_rf(s->tmp); /* a leftover of a crash during an earlier save */
    if (!rc && mkdir(s->tmp, 0755) != 0)
        rc = tks_fail(tks_write_errno_code(errno), s->tmp, TKS_NONE, TKS_NONE,
                      "cannot create %s: %s; check that %s is writable and has space", s->tmp,
                      strerror(errno), s->parent);
    s->made_tmp = !rc;
    return rc;
}

/* Opens the safetensors stream of each file: the model's parameters, then
 * (with an optimizer) both AdamW moments of each parameter. */
static int save_open_streams(save_ctx *s, const tks_param *P, size_t np, int n_files) {
    char path[PATH_MAX];
    s->t = calloc(2 * np, sizeof *s->t);
    s->names = calloc(2 * np, sizeof *s->names);
    if (!s->t || !s->names) return tks_fail(TKS_ERR_NOMEM, s->dir, TKS_NONE, TKS_NONE, "out of memory");
    tks_st_kv meta[] = {{"format", "pt"}, {"producer", "tokshard " TKS_VERSION_STRING}};
    int rc = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        size_t nt = f ? 2 * np : np;
        for (size_t j = 0; j < nt; j++) {
            const tks_param *p = &P[f ? j / 2 : j];
            if (f) snprintf(s->names[j], sizeof s->names[j], "%s.%s", p->name, j % 2 ? "exp_avg_sq" : "exp_avg");
            else snprintf(s->names[j], sizeof s->names[j], "%s", p->name);
            s->t[j] = (tks_st_tensor){.name = s->names[j], .dtype = TKS_ST_F32, .ndim = (size_t)p->ndim,
                                      .shape = {p->rows_real, p->ndim == 2 ? p->cols : 0},
                                      .nbytes = (size_t)(p->rows_real * p->cols) * sizeof(float)};
        }
        rc = tks_path_join(path, sizeof path, s->tmp, f ? "optimizer.safetensors" : "model.safetensors");
        if (!rc) rc = tks_st_stream_open(path, s->t, nt, meta, 2, &s->out[f]);
    }
    return rc;
}

/* The tensors, one at a time: gathered to the writer, written, freed.
 * Collective over the world. */
static int save_tensors(gctx *g, save_ctx *s, tks_model *m, tks_optim *opt, int n_files) {
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    int rc = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        size_t nt = f ? 2 * np : np;
        for (size_t j = 0; j < nt && !rc; j++) {
            float *full = NULL;
            rc = gather_tensor(g, m, opt, &P[f ? j / 2 : j], f ? 1 + (int)(j % 2) : 0, &full);
            if (!rc && g->writer) rc = tks_st_stream_put(s->out[f], j, full);
            free(full);
            rc = tks_comm_agree(g->world, rc);
        }
        if (!rc && g->writer) {
            rc = tks_st_stream_commit(s->out[f]);
            s->out[f] = NULL;
            if (!rc) stop_point(f ? "optimizer" : "model");
        }
        rc = tks_comm_agree(g->world, rc);
    }
    return rc;
}

struct tks_checkpoint_tokenizer {
    char *path;  /* the dataset's tokenizer file */
    tks_tok *tok; /* parsed: tokenizer.json and tiktoken.json (the byte-level kinds); else NULL */
    tks_hf_spm *hf; /* a sentencepiece model's fast-tokenizer form; NULL for the other kinds and for
                     * models without one (word/char, no whitespace escaping) */
};

/* The file name part of path. */
static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

void tks_checkpoint_tokenizer_free(tks_checkpoint_tokenizer *t) {
    if (!t) return;
    tks_tok_free(t->tok);
    tks_hf_spm_free(t->hf);
    free(t->path);
    free(t);
}

int tks_checkpoint_tokenizer_open(const char *path, tks_checkpoint_tokenizer **out) {
    *out = NULL;
    if (!path) return 0;
    tks_checkpoint_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    }
    const char *name = base_name(path);
    int rc = 0;
    if (!strcmp(name, "tokenizer.json") || !strcmp(name, "tiktoken.json")) rc = tks_tok_load(path, &t->tok);
    else if (strcmp(name, TKS_NO_TOKENIZER_NAME) && (rc = tks_hf_spm_convert(path, &t->hf)) == TKS_ERR_TOKENIZER) {
        tks_clear_error(); /* no fast equivalent: the checkpoints carry tokenizer.model alone */
        rc = 0;
    }
    if (rc) tks_checkpoint_tokenizer_free(t);
    else *out = t;
    return rc;
}

/* tokenizer.model (or the note tokenizer.none of a dataset imported without
 * a tokenizer, kept under that name: it is not a model), then tokenizer.json
 * and tokenizer_config.json so that transformers loads the checkpoint as
 * model and tokenizer; a tokenizer without a fast equivalent (word/char
 * models) leaves the slow tokenizer.model only. A byte-level BPE dataset's
 * tokenizer.json is copied as it is, with its tokenizer_config.json; a
 * tiktoken tokenizer's descriptor and ranks (tiktoken.json and
 * tokenizer.tiktoken) likewise. */
static int save_tokenizer(const char *tmp, const tks_checkpoint_tokenizer *tk) {
    if (!tk) return 0;
    char path[PATH_MAX];
    const char *name = base_name(tk->path);
    if (tk->tok) /* parsed once, when the run opened it */
        return !strcmp(name, "tokenizer.json") ? tks_hf_bpe_write(tk->tok, tk->path, tmp)
                                                : tks_tok_save(tk->tok, tk->path, tmp);
    int no_tok = !strcmp(name, TKS_NO_TOKENIZER_NAME);
    int rc = tks_path_join(path, sizeof path, tmp, no_tok ? TKS_NO_TOKENIZER_NAME : "tokenizer.model");
    if (!rc) rc = tks_copy_file_atomic(tk->path, path);
    if (!rc && tk->hf) rc = tks_hf_spm_write(tk->hf, tmp);
    return rc;
}

/* trainer_state.json, written last, with the checksum of every other file. */
static int save_state(const char *dir, const char *tmp, const tks_train_state *st) {
    char path[PATH_MAX];
    int rc = 0;
    json_t *files = json_object();
    for (size_t i = 0; i < N_FILES && !rc; i++) {
        uint8_t h[16];
        char hx[33];
        tks_path_join(path, sizeof path, tmp, FILES[i]);
        if (access(path, F_OK) != 0) continue;
        if ((rc = tks_file_xxh3_128(path, h, NULL))) break;
        tks_hex(h, 16, hx);
        json_object_set_new(files, FILES[i], json_string(hx));
    }
    if (rc) {
        json_decref(files);
        return rc;
    }
    char mx[17], fp[33];
    snprintf(mx, sizeof mx, "%016llx", (unsigned long long)st->manifest_xxh3);
    tks_hex(st->tokenizer_fp, 16, fp);
    json_error_t e;
    json_t *opts = json_loads(st->options_json[0] ? st->options_json : "{}", 0, &e);
    json_t *j = json_pack(
        "{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:o, s:o, s:s}", "format", STATE_FORMAT,
        "version", 1, "step", (json_int_t)st->step, "cursor", (json_int_t)st->cursor, "seed",
        (json_int_t)st->seed, "seq_len", (json_int_t)st->seq_len, "global_batch",
        (json_int_t)st->global_batch, "val_tokens", (json_int_t)st->val_tokens,
        "dataset_manifest_xxh3", mx, "tokenizer_fingerprint", fp, "options",
        opts ? opts : json_object(), "files", files,
        "rng", "counter-based (splitmix64 keyed by seed): no state beyond the seed and cursor");
    if (j && st->mix_json[0]) {
        json_t *mix = json_loads(st->mix_json, 0, &e);
        if (!mix) rc = tks_fail(TKS_ERR_ARG, dir, TKS_NONE, TKS_NONE, "the mixture's record is not JSON");
        else json_object_set_new(j, "mix", mix);
    }
    char *text = j && !rc ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    if (!text && !rc) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc && (rc = tks_path_join(path, sizeof path, tmp, "trainer_state.json")) == 0)
        rc = tks_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* DIR.tmp renamed to DIR (and the parent synced), or removed on error:
 * nothing half-written stays behind (a crash leaves NAME.tmp, never NAME). */
static int save_publish(save_ctx *s, int rc) {
    if (!rc && rename(s->tmp, s->dir) != 0)
        rc = tks_fail(TKS_ERR_IO, s->dir, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", s->tmp, s->dir,
                      strerror(errno));
    if (!rc) {
        stop_point("renamed");
        rc = tks_fsync_dir(s->parent);
    } else if (s->made_tmp) {
        rm_rf(s->tmp);
    }
    tks_unlock(s->lock_fd, s->lock_path[0] ? s->lock_path : NULL);
    return rc;
}

int tks_checkpoint_save(const char *dir, tks_model *m, tks_optim *opt, const tks_train_state *st,
                        const tks_checkpoint_tokenizer *tok, tks_mesh *mesh) {
    gctx g = {.mesh = mesh, .tp = tks_comm_self(), .shard = tks_comm_self(), .world = tks_comm_self(), .writer = 1};
    if (mesh) {
        g.tp = mesh->group[TKS_GROUP_TP];
        g.shard = mesh->group[TKS_GROUP_DP_SHARD];
        g.world = mesh->group[TKS_GROUP_WORLD];
        g.rep = mesh->rep;
        g.shard_rank = mesh->shard;
        g.tp_rank = mesh->tp_rank;
        g.writer = mesh->rank == 0;
    }
    g.sb = opt ? tks_optim_begin(opt) : 0;
    g.se = opt ? tks_optim_end(opt) : tks_model_n_flat(m);
    save_ctx s = {.dir = dir, .lock_fd = -1};
    int n_files = opt ? 2 : 1, rc = 0;
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    /* the writer's checks and files come first; every rank learns their
     * outcome before any gather (an existing step directory, an unwritable
     * parent or a held lock fails the whole job with the writer's message) */
    if (g.writer) {
        rc = save_begin(&s, st);
        if (!rc) rc = save_open_streams(&s, P, np, n_files);
    }
    rc = tks_comm_agree(g.world, rc);
    if (!rc) rc = save_tensors(&g, &s, m, opt, n_files);
    for (int f = 0; f < 2; f++) tks_st_stream_abort(s.out[f]);
    free(s.t);
    free(s.names);
    if (!g.writer) return rc;
    char path[PATH_MAX];
    if (!rc && (rc = tks_path_join(path, sizeof path, s.tmp, "config.json")) == 0)
        rc = write_config(path, tks_model_config_of(m), st);
    if (!rc) stop_point("config");
    if (!rc) rc = save_tokenizer(s.tmp, tok);
    if (!rc) stop_point("tokenizer");
    if (!rc) rc = save_state(dir, s.tmp, st);
    if (!rc) stop_point("state");
    return save_publish(&s, rc);
}

/* ---- reading ------------------------------------------------------------------ */

static int bad_ckpt(const char *dir, const char *what) {
    return tks_fail(TKS_ERR_MANIFEST, dir, TKS_NONE, TKS_NONE,
                    "%s is not a usable checkpoint: %s; resume from another checkpoint (the run "
                    "directory keeps the last ones)",
                    dir, what);
}

/* The refusal of a value that is not a finite number: element `at` of
 * tensor t of `file` in checkpoint dir, with its index in t's shape. */
static int nonfinite_ckpt(const char *dir, const char *file, const tks_st_info *t, uint64_t at, double v) {
    char idx[160] = "", shape[160] = "";
    size_t ni = 0, ns = 0;
    uint64_t rest = at, pos[TKS_ST_MAX_DIMS];
    for (size_t d = t->ndim; d-- > 0;) {
        pos[d] = t->shape[d] ? rest % t->shape[d] : 0;
        rest = t->shape[d] ? rest / t->shape[d] : 0;
    }
    for (size_t d = 0; d < t->ndim && ni < sizeof idx && ns < sizeof shape; d++) {
        ni += (size_t)snprintf(idx + ni, sizeof idx - ni, "%s%llu", d ? ", " : "", (unsigned long long)pos[d]);
        ns += (size_t)snprintf(shape + ns, sizeof shape - ns, "%s%llu", d ? ", " : "",
                               (unsigned long long)t->shape[d]);
    }
    return tks_fail(TKS_ERR_NONFINITE, dir, TKS_NONE, TKS_NONE,
                    "%s is not a usable checkpoint: %s holds %s in %s at element %llu (index [%s] of "
                    "shape [%s]): a model or optimizer state with NaN or infinite values cannot "
                    "generate, be exported or train; use an earlier checkpoint (the run directory "
                    "keeps the last ones) and, if training diverged there, resume it with a lower "
                    "--lr and --change-schedule",
                    dir, file, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", t->name,
                    (unsigned long long)at, idx, shape);
}

/* Every floating-point value of the tensors of `file` in checkpoint dir
 * (whose checksum was verified) is a finite number, or the refusal naming
 * the first that is not. */
static int check_finite(const char *dir, const char *file) {
    char path[PATH_MAX];
    tks_st_file *f = NULL;
    int rc = tks_path_join(path, sizeof path, dir, file);
    if (!rc) rc = tks_st_open(path, &f);
    for (size_t i = 0; !rc && i < tks_st_n_tensors(f); i++) {
        tks_st_info t;
        uint64_t at = 0;
        double v = 0;
        rc = tks_st_tensor_at(f, i, &t);
        if (!rc && tks_st_find_nonfinite(&t, &at, &v)) rc = nonfinite_ckpt(dir, file, &t, at, v);
    }
    tks_st_close(f);
    return rc;
}

static int get_u(json_t *o, const char *k, uint64_t *v) {
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x) || json_integer_value(x) < 0) return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

int tks_checkpoint_peek(const char *dir, tks_model_config *cfg, tks_train_state *st) {
    char path[PATH_MAX], why[PATH_MAX + 128];
    memset(st, 0, sizeof *st);
    memset(cfg, 0, sizeof *cfg);
    json_error_t e;
    tks_path_join(path, sizeof path, dir, "trainer_state.json");
    json_t *s = tks_json_load_regular(path, JSON_REJECT_DUPLICATES, &e);
    if (!s) {
        snprintf(why, sizeof why, "trainer_state.json is missing or unreadable (%s)", e.text);
        return bad_ckpt(dir, why);
    }
    const char *fmt = json_string_value(json_object_get(s, "format"));
    json_t *files = json_object_get(s, "files");
    const char *mx = json_string_value(json_object_get(s, "dataset_manifest_xxh3"));
    const char *fp = json_string_value(json_object_get(s, "tokenizer_fingerprint"));
    uint64_t seq = 0;
    int rc = 0, recorded[N_FILES] = {0};
    if (!fmt || strcmp(fmt, STATE_FORMAT) || !json_is_object(files) || !mx || !fp ||
        get_u(s, "step", &st->step) || get_u(s, "cursor", &st->cursor) ||
        get_u(s, "seed", &st->seed) || get_u(s, "seq_len", &seq) ||
        get_u(s, "global_batch", &st->global_batch) || get_u(s, "val_tokens", &st->val_tokens) ||
        tks_unhex(fp, st->tokenizer_fp, 16) || strlen(mx) != 16) {
        json_decref(s);
        return bad_ckpt(dir, "trainer_state.json lacks required fields");
    }
    st->seq_len = (uint32_t)seq;
    st->manifest_xxh3 = strtoull(mx, NULL, 16);
    json_t *opts = json_object_get(s, "options");
    char *ot = opts ? json_dumps(opts, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    snprintf(st->options_json, sizeof st->options_json, "%s", ot ? ot : "{}");
    free(ot);
    json_t *mix = json_object_get(s, "mix");
    char *mt = mix ? json_dumps(mix, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    if (mt && strlen(mt) >= sizeof st->mix_json) {
        free(mt);
        json_decref(s);
        return bad_ckpt(dir, "trainer_state.json's mixture record is too long");
    }
    snprintf(st->mix_json, sizeof st->mix_json, "%s", mt ? mt : "");
    free(mt);
    /* every file's checksum; model.safetensors and config.json must be there */
    for (size_t i = 0; i < N_FILES && !rc; i++) {
        const char *want = json_string_value(json_object_get(files, FILES[i]));
        recorded[i] = want != NULL;
        tks_path_join(path, sizeof path, dir, FILES[i]);
        if (!want) {
            if (i == 0 || i == 2) {
                snprintf(why, sizeof why, "%s is not recorded", FILES[i]);
                rc = bad_ckpt(dir, why);
            }
            continue;
        }
        uint8_t h[16];
        char hx[33];
        if (tks_file_xxh3_128(path, h, NULL)) {
            snprintf(why, sizeof why, "%s is missing", FILES[i]);
            rc = bad_ckpt(dir, why);
            break;
        }
        tks_hex(h, 16, hx);
        if (strcmp(hx, want)) {
            snprintf(why, sizeof why, "%s is corrupt (XXH3-128 %s, recorded %s)", FILES[i], hx, want);
            rc = bad_ckpt(dir, why);
        }
    }
    json_decref(s);
    /* the tensors: every weight and moment a finite number (a checkpoint of
     * a diverged run, or one rewritten with consistent checksums, is refused
     * here for every caller: resume, generation, export) */
    for (size_t i = 0; i < 2 && !rc; i++)
        if (recorded[i]) rc = check_finite(dir, FILES[i]);
    if (rc) return rc;
    tks_path_join(path, sizeof path, dir, "config.json");
    json_t *c = tks_json_load_regular(path, 0, &e);
    uint64_t v[8];
    if (!c || get_u(c, "vocab_size", &v[0]) || get_u(c, "hidden_size", &v[1]) ||
        get_u(c, "intermediate_size", &v[2]) || get_u(c, "num_hidden_layers", &v[3]) ||
        get_u(c, "num_attention_heads", &v[4]) || get_u(c, "num_key_value_heads", &v[5]) ||
        get_u(c, "max_position_embeddings", &v[6]) || !json_is_number(json_object_get(c, "rms_norm_eps")) ||
        !json_is_number(json_object_get(c, "rope_theta"))) {
        json_decref(c);
        return bad_ckpt(dir, "config.json is not a LlamaConfig");
    }
    cfg->vocab_size = (uint32_t)v[0];
    cfg->dim = (uint32_t)v[1];
    cfg->ffn_dim = (uint32_t)v[2];
    cfg->n_layers = (uint32_t)v[3];
    cfg->n_heads = (uint32_t)v[4];
    cfg->n_kv_heads = (uint32_t)v[5];
    cfg->max_seq_len = (uint32_t)v[6];
    cfg->norm_eps = (float)json_number_value(json_object_get(c, "rms_norm_eps"));
    cfg->rope_theta = (float)json_number_value(json_object_get(c, "rope_theta"));
    cfg->tie_embeddings = json_is_true(json_object_get(c, "tie_word_embeddings"));
    json_t *ir = json_object_get(c, "initializer_range");
    cfg->init_std = json_is_number(ir) ? (float)json_number_value(ir) : 0.02f;
    if (get_u(c, "tokshard_vocab_divisible_by", &v[7]) == 0) cfg->vocab_divisible_by = (uint32_t)v[7];
    json_decref(c);
    return 0;
}

/* The local block (host, lrows x lcols, padding rows zero) of tensor `name`
 * of shape [rows_real, cols]: one tensor at a time through the mapping. */
static int read_block(tks_st_file *f, const char *name, const tks_param *p, float *blk, const char *file) {
    uint64_t shape[2] = {p->rows_real, p->cols};
    size_t full = (size_t)(p->rows_real * p->cols);
    float *h = malloc((full ? full : 1) * sizeof *h);
    if (!h) return tks_fail(TKS_ERR_NOMEM, file, TKS_NONE, TKS_NONE, "out of memory reading %s", name);
    int rc = tks_st_read_f32(f, name, shape, (size_t)p->ndim, h);
    memset(blk, 0, (size_t)(p->lrows * p->lcols) * sizeof *blk);
    for (uint64_t r = 0; !rc && r < p->lrows; r++) {
        uint64_t gr = p->row0 + r;
        if (gr >= p->rows_real) break;
        memcpy(blk + r * p->lcols, h + gr * p->cols + p->col0, (size_t)p->lcols * sizeof *blk);
    }
    free(h);
    return rc;
}

int tks_checkpoint_load(const char *dir, tks_model *m, tks_optim *opt) {
    char path[PATH_MAX];
    size_t np, maxblk = 1;
    const tks_param *P = tks_model_params(m, &np);
    tks_backend *be = tks_model_backend(m);
    for (size_t i = 0; i < np; i++)
        if (blk_of(&P[i]) > maxblk) maxblk = blk_of(&P[i]);
    float *blk = malloc(maxblk * sizeof *blk);
    tks_st_file *f = NULL;
    int rc = blk ? tks_path_join(path, sizeof path, dir, "model.safetensors")
                 : tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory loading %s", dir);
    if (!rc) rc = tks_st_open(path, &f);
    for (size_t i = 0; i < np && !rc; i++) {
        rc = read_block(f, P[i].name, &P[i], blk, path);
        if (!rc) be->ops->upload(be, P[i].w, blk, blk_of(&P[i]) * sizeof *blk);
    }
    tks_st_close(f);
    f = NULL;
    if (!rc && opt) {
        rc = tks_path_join(path, sizeof path, dir, "optimizer.safetensors");
        if (!rc && access(path, F_OK) != 0)
            rc = bad_ckpt(dir, "optimizer.safetensors is missing (a weights-only checkpoint cannot resume training)");
        if (!rc) rc = tks_st_open(path, &f);
        /* each moment block, and of it only this rank's ZeRO slice [b0, e0) */
        size_t b0 = tks_optim_begin(opt), e0 = tks_optim_end(opt);
        char nm[96];
        for (int k = 0; k < 2 && !rc; k++)
            for (size_t i = 0; i < np && !rc; i++) {
                size_t a = P[i].offset, z = a + blk_of(&P[i]), lo = a > b0 ? a : b0, hi = z < e0 ? z : e0;
                if (lo >= hi) continue;
                snprintf(nm, sizeof nm, "%s.%s", P[i].name, k ? "exp_avg_sq" : "exp_avg");
                rc = read_block(f, nm, &P[i], blk, path);
                if (!rc)
                    be->ops->upload(be, (k ? tks_optim_v(opt) : tks_optim_m(opt)) + (lo - b0), blk + (lo - a),
                               (hi - lo) * sizeof *blk);
            }
        tks_st_close(f);
    }
    free(blk);
    return rc;
}

/* ---- listing -------------------------------------------------------------------- */

static int is_step_dir(const char *n) {
    size_t l = strlen(n);
    if (l < 6 || strncmp(n, "step-", 5) != 0) return 0;
    for (size_t i = 5; i < l; i++)
        if (n[i] < '0' || n[i] > '9') return 0;
    return 1;
}
static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char **list_steps(const char *parent, size_t *n) {
    *n = 0;
    DIR *d = opendir(parent);
    if (!d) return NULL;
    char **v = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (is_step_dir(e->d_name)) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                char **nv = realloc(v, cap * sizeof *nv);
                if (!nv) break;
                v = nv;
            }
            v[(*n)++] = strdup(e->d_name);
        }
    closedir(d);
    if (v) qsort(v, *n, sizeof *v, cmp_name); /* names are zero-padded: lexical = numeric */
    return v;
}

int tks_checkpoint_prune(const char *parent, unsigned keep) {
    size_t n;
    char **v = list_steps(parent, &n);
    int rc = 0;
    /* leftovers of a crash: NAME.tmp (a save) and NAME.del (a prune) */
    DIR *d = opendir(parent);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || l < 9) continue;
        if (strcmp(e->d_name + l - 4, ".del") && strcmp(e->d_name + l - 4, ".tmp")) continue;
        char p[PATH_MAX];
        if (tks_path_join(p, sizeof p, parent, e->d_name) == 0 && !strcmp(e->d_name + l - 4, ".del")) rm_rf(p);
    }
    if (d) closedir(d);
    /* oldest first; the newest whole one is never removed (keep >= 1) */
    for (size_t i = 0; i < n; i++) {
        if (keep && i + keep < n && i + 1 < n) {
            char p[PATH_MAX];
            if (!rc && (rc = tks_path_join(p, sizeof p, parent, v[i])) == 0) {
                stop_point("pruning");
                rc = remove_dir(p);
            }
        }
        free(v[i]);
    }
    free(v);
    return rc;
}

int tks_checkpoint_after(const char *parent, uint64_t step, char *out, size_t cap) {
    size_t n;
    char **v = list_steps(parent, &n);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        if (!found && strtoull(v[i] + 5, NULL, 10) > step)
            found = tks_path_join(out, cap, parent, v[i]) == 0;
        free(v[i]);
    }
    free(v);
    return found;
}

int tks_checkpoint_latest(const char *parent, char *out, size_t cap) {
    size_t n;
    char **v = list_steps(parent, &n);
    int rc = n ? tks_path_join(out, cap, parent, v[n - 1])
               : tks_fail(TKS_ERR_IO, parent, TKS_NONE, TKS_NONE, "no checkpoint under %s", parent);
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
    return rc;
}

int tks_train_latest_checkpoint(const char *run_dir, char *out, size_t cap) {
    char ck[PATH_MAX];
    int rc = tks_path_join(ck, sizeof ck, run_dir, "checkpoints");
    return rc ? rc : tks_checkpoint_latest(ck, out, cap);
}
