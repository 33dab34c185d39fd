/* checkpoint.c - save, verify and load checkpoint directories (checkpoint.h). */
#define _GNU_SOURCE
#include "checkpoint.h"
#include "../tokenize/spm.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/tks.h"
#include "safetensors.h"

#define STATE_FORMAT "tokshard-checkpoint"
static const char *const FILES[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                                    "tokenizer.model", "tokenizer.json", "tokenizer_config.json"};
#define N_FILES (sizeof FILES / sizeof FILES[0])

/* Shortest decimal that reads back as the same float, as a double. */
static double short_float(float f) {
    char b[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        double d = strtod(b, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;
}

/* ---- full tensors on the host --------------------------------------------- */

/*
 * The full, unpadded tensor of parameter p, assembled on the host from the
 * tp-local flat buffer `flat` (device, laid out like the weights): blocks of
 * the tp group are all-gathered, rows (column-parallel, vocab) concatenated or
 * columns (row-parallel) interleaved, padding rows dropped. Collective over
 * the tp group. Returns malloc'd rows_real x cols floats, or NULL.
 */
static float *full_tensor(tks_model *m, const tks_param *p, const float *flat, int *rc) {
    tks_backend *be = tks_model_backend(m);
    tks_comm *tp = tks_model_tp(m);
    int T = tp ? tp->size : 1;
    size_t blk = (size_t)(p->lrows * p->lcols);
    size_t n_all = blk * (size_t)T, n_full = (size_t)(p->rows * p->cols);
    float *all = malloc((n_all > 0 ? n_all : 1) * sizeof *all);
    float *full = malloc((n_full > 0 ? n_full : 1) * sizeof *full);
    if (!all || !full) goto oom;
    if (T > 1 && p->split != TKS_SPLIT_NONE) {
        float *d = be->alloc(be, blk * (size_t)T * sizeof *d);
        if (!d) goto oom;
        *rc = tp->allgather(tp, d, flat + p->offset, blk);
        be->download(be, all, d, blk * (size_t)T * sizeof *all);
        be->free(be, d);
        if (*rc) goto fail;
    } else {
        T = 1;
        be->download(be, all, flat + p->offset, blk * sizeof *all);
    }
    if (p->split == TKS_SPLIT_COLS && T > 1) {
        for (int t = 0; t < T; t++)
            for (uint64_t r = 0; r < p->rows; r++)
                memcpy(full + r * p->cols + (uint64_t)t * p->lcols, all + ((size_t)t * p->rows + r) * p->lcols,
                       (size_t)p->lcols * sizeof *full);
    } else {
        memcpy(full, all, (size_t)(p->rows * p->cols) * sizeof *full);
    }
    free(all);
    return full; /* the first rows_real rows are the unpadded tensor */
oom:
    *rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory gathering %s", p->name);
fail:
    free(all);
    free(full);
    return NULL;
}

/* The tp-local flat buffer of one AdamW moment: the dp_shard slices gathered. */
static float *full_moment(tks_model *m, tks_optim *opt, int which, tks_comm *dp_shard, int *rc) {
    tks_backend *be = tks_model_backend(m);
    size_t n = tks_model_n_flat(m), b = tks_optim_begin(opt), e = tks_optim_end(opt);
    float *d = be->alloc(be, n * sizeof *d);
    if (!d) {
        *rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        return NULL;
    }
    const float *src = which ? tks_optim_v(opt) : tks_optim_m(opt);
    if (dp_shard && dp_shard->size > 1) {
        be->copy(be, d + b, src, (e - b) * sizeof *d);
        *rc = dp_shard->allgather(dp_shard, d, d + b, e - b);
    } else {
        be->copy(be, d + b, src, (e - b) * sizeof *d);
    }
    return d;
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

int tks_checkpoint_save(const char *dir, tks_model *m, tks_optim *opt, const tks_train_state *st,
                        const char *tokenizer_path, tks_comm *dp_shard, int writer) {
    int rc = 0;
    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    if (writer) {
        struct stat sb;
        if (stat(dir, &sb) == 0)
            rc = tks_fail(TKS_ERR_EXISTS, dir, TKS_NONE, TKS_NONE, "checkpoint %s already exists", dir);
        rm_rf(tmp); /* a leftover of a crash during an earlier save */
        if (!rc && mkdir(tmp, 0755) != 0)
            rc = tks_fail(tks_write_errno_code(errno), tmp, TKS_NONE, TKS_NONE,
                          "cannot create %s: %s", tmp, strerror(errno));
    }
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    tks_st_tensor *t = calloc(2 * np, sizeof *t);
    float **bufs = calloc(2 * np, sizeof *bufs);
    char (*names)[96] = calloc(2 * np, sizeof *names);
    if (!t || !bufs || !names) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    tks_st_kv meta[] = {{"format", "pt"}, {"producer", "tokshard " TKS_VERSION_STRING}};
    /* model.safetensors, then optimizer.safetensors: every rank gathers (the
     * collectives need it), the writer writes */
    const float *flats[3] = {tks_model_weights(m), NULL, NULL};
    int n_files = 1;
    if (opt) {
        int r1 = 0, r2 = 0;
        flats[1] = full_moment(m, opt, 0, dp_shard, &r1);
        flats[2] = full_moment(m, opt, 1, dp_shard, &r2);
        if (!rc) rc = r1 ? r1 : r2;
        n_files = 2;
    }
    for (int f = 0; f < n_files; f++) {
        size_t nt = f ? 2 * np : np;
        for (size_t i = 0; i < np; i++)
            for (int k = 0; k < (f ? 2 : 1); k++) {
                size_t j = f ? 2 * i + (size_t)k : i;
                int r = 0;
                bufs[j] = rc ? NULL : full_tensor(m, &P[i], flats[f ? 1 + k : 0], &r);
                if (!rc) rc = r;
                if (f) snprintf(names[j], sizeof names[j], "%s.%s", P[i].name, k ? "exp_avg_sq" : "exp_avg");
                else snprintf(names[j], sizeof names[j], "%s", P[i].name);
                t[j] = (tks_st_tensor){.name = names[j], .dtype = TKS_ST_F32, .ndim = (size_t)P[i].ndim,
                                       .shape = {P[i].rows_real, P[i].ndim == 2 ? P[i].cols : 0},
                                       .data = bufs[j],
                                       .nbytes = (size_t)(P[i].rows_real * P[i].cols) * sizeof(float)};
            }
        if (!rc && writer && (rc = tks_path_join(path, sizeof path, tmp, f ? "optimizer.safetensors" : "model.safetensors")) == 0)
            rc = tks_st_write(path, t, nt, meta, 2);
        for (size_t j = 0; j < 2 * np; j++) free(bufs[j]), bufs[j] = NULL;
    }
    tks_backend *be = tks_model_backend(m);
    if (flats[1]) be->free(be, (void *)flats[1]);
    if (flats[2]) be->free(be, (void *)flats[2]);
    free(t);
    free(bufs);
    free(names);
    if (!writer) return rc;
    if (!rc && (rc = tks_path_join(path, sizeof path, tmp, "config.json")) == 0)
        rc = write_config(path, tks_model_config_of(m), st);
    if (!rc && tokenizer_path && (rc = tks_path_join(path, sizeof path, tmp, "tokenizer.model")) == 0)
        rc = tks_copy_file_atomic(tokenizer_path, path);
    /* tokenizer.json, tokenizer_config.json and the special ids in config.json,
     * so that transformers loads the checkpoint as model and tokenizer; a
     * tokenizer that has no fast equivalent (word/char models, an imported
     * dataset's tokenizer.none) leaves the slow tokenizer.model only */
    if (!rc && tokenizer_path && (rc = tks_hf_tokenizer_write(tokenizer_path, tmp)) == TKS_ERR_TOKENIZER) {
        tks_clear_error();
        rc = 0;
    }
    /* trainer_state.json last, with the checksum of every other file */
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
    if (!rc) {
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
        files = NULL;
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(j);
        if (!text) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
        if (!rc && (rc = tks_path_join(path, sizeof path, tmp, "trainer_state.json")) == 0)
            rc = tks_write_file_atomic(path, text, strlen(text));
        free(text);
    }
    json_decref(files);
    if (!rc && rename(tmp, dir) != 0)
        rc = tks_fail(TKS_ERR_IO, dir, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", tmp, dir,
                      strerror(errno));
    if (!rc) {
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", dir);
        char *sl = strrchr(parent, '/');
        rc = tks_fsync_dir(sl ? (*sl = 0, parent[0] ? parent : "/") : ".");
    } else {
        rm_rf(tmp);
    }
    return rc;
}

/* ---- reading ------------------------------------------------------------------ */

static int bad_ckpt(const char *dir, const char *what) {
    return tks_fail(TKS_ERR_MANIFEST, dir, TKS_NONE, TKS_NONE,
                    "%s is not a usable checkpoint: %s; resume from another checkpoint (the run "
                    "directory keeps the last ones)",
                    dir, what);
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
    json_t *s = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!s) {
        snprintf(why, sizeof why, "trainer_state.json is missing or unreadable (%s)", e.text);
        return bad_ckpt(dir, why);
    }
    const char *fmt = json_string_value(json_object_get(s, "format"));
    json_t *files = json_object_get(s, "files");
    const char *mx = json_string_value(json_object_get(s, "dataset_manifest_xxh3"));
    const char *fp = json_string_value(json_object_get(s, "tokenizer_fingerprint"));
    uint64_t seq = 0;
    int rc = 0;
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
    /* every file's checksum; model.safetensors and config.json must be there */
    for (size_t i = 0; i < N_FILES && !rc; i++) {
        const char *want = json_string_value(json_object_get(files, FILES[i]));
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
    if (rc) return rc;
    tks_path_join(path, sizeof path, dir, "config.json");
    json_t *c = json_load_file(path, 0, &e);
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

/* Loads one tensor of shape [rows_real, cols] into the local block (device). */
static int load_block(tks_model *m, tks_st_file *f, const char *name, const tks_param *p, float *dst,
                      const char *file) {
    tks_backend *be = tks_model_backend(m);
    uint64_t shape[2] = {p->rows_real, p->cols};
    size_t full = (size_t)(p->rows_real * p->cols);
    float *h = malloc((full ? full : 1) * sizeof *h);
    if (!h) return tks_fail(TKS_ERR_NOMEM, file, TKS_NONE, TKS_NONE, "out of memory");
    int rc = tks_st_read_f32(f, name, shape, (size_t)p->ndim, h);
    if (!rc) {
        /* local block = rows [row0, row0+lrows) x cols [col0, col0+lcols), padding rows zero */
        float *blk = calloc((size_t)(p->lrows * p->lcols) + 1, sizeof *blk);
        if (!blk) rc = tks_fail(TKS_ERR_NOMEM, file, TKS_NONE, TKS_NONE, "out of memory");
        for (uint64_t r = 0; blk && r < p->lrows; r++) {
            uint64_t gr = p->row0 + r;
            if (gr >= p->rows_real) break;
            memcpy(blk + r * p->lcols, h + gr * p->cols + p->col0, (size_t)p->lcols * sizeof *blk);
        }
        if (blk) be->upload(be, dst, blk, (size_t)(p->lrows * p->lcols) * sizeof *blk);
        free(blk);
    }
    free(h);
    return rc;
}

int tks_checkpoint_load(const char *dir, tks_model *m, tks_optim *opt) {
    char path[PATH_MAX];
    size_t np;
    const tks_param *P = tks_model_params(m, &np);
    tks_backend *be = tks_model_backend(m);
    tks_st_file *f = NULL;
    int rc = tks_path_join(path, sizeof path, dir, "model.safetensors");
    if (!rc) rc = tks_st_open(path, &f);
    for (size_t i = 0; i < np && !rc; i++) rc = load_block(m, f, P[i].name, &P[i], P[i].w, path);
    tks_st_close(f);
    f = NULL;
    if (rc || !opt) return rc;
    rc = tks_path_join(path, sizeof path, dir, "optimizer.safetensors");
    if (!rc && access(path, F_OK) != 0)
        return bad_ckpt(dir, "optimizer.safetensors is missing (a weights-only checkpoint cannot resume training)");
    if (!rc) rc = tks_st_open(path, &f);
    /* each moment into a tp-local flat buffer, then this rank's slice of it */
    size_t n = tks_model_n_flat(m), b0 = tks_optim_begin(opt), e0 = tks_optim_end(opt);
    float *flat = be->alloc(be, n * sizeof *flat);
    if (!rc && !flat) rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    char nm[96];
    for (int k = 0; k < 2 && !rc; k++) {
        for (size_t i = 0; i < np && !rc; i++) {
            snprintf(nm, sizeof nm, "%s.%s", P[i].name, k ? "exp_avg_sq" : "exp_avg");
            rc = load_block(m, f, nm, &P[i], flat + P[i].offset, path);
        }
        if (!rc) be->copy(be, k ? tks_optim_v(opt) : tks_optim_m(opt), flat + b0, (e0 - b0) * sizeof *flat);
    }
    if (flat) be->free(be, flat);
    tks_st_close(f);
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
    for (size_t i = 0; i < n; i++) {
        if (keep && i + keep < n) {
            char p[PATH_MAX];
            tks_path_join(p, sizeof p, parent, v[i]);
            if (rm_rf(p) != 0)
                rc = tks_fail(TKS_ERR_IO, p, TKS_NONE, TKS_NONE, "cannot remove old checkpoint %s", p);
        }
        free(v[i]);
    }
    free(v);
    return rc;
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
