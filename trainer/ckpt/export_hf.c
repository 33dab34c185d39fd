/* export_hf.c - a checkpoint as a clean Hugging Face model directory
 * (tks_export_hf, trainer.h): beside the checkpoint code that wrote it. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "common/tks.h"
#include "common/tks_tokinfo.h"
#include "tokenizer/tokenizer.h"
#include "trainer/trainer.h"

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int tks_export_hf(const char *checkpoint, const char *out_dir, int *tokenizer_missing) {
    if (!checkpoint || !out_dir || !*out_dir)
        return tks_fail(TKS_ERR_ARG, out_dir, TKS_NONE, TKS_NONE, "export-hf needs a CHECKPOINT and a DIR");
    struct stat sb;
    if (stat(out_dir, &sb) == 0)
        return tks_fail(TKS_ERR_EXISTS, out_dir, TKS_NONE, TKS_NONE,
                        "%s already exists: choose another DIR or remove it", out_dir);
    /* verifies every file of the checkpoint against its recorded checksum */
    tks_run_sampling rs;
    int rc = tks_train_read_sampling(checkpoint, &rs);
    if (rc) return rc;
    char tmp[PATH_MAX], src[PATH_MAX], dst[PATH_MAX];
    /* a folder of our own, created exclusively (mkdtemp): never a user's
     * DIR.tmp, which the export would otherwise fill and remove. An export
     * killed midway leaves its DIR.tmp-XXXXXX behind, nothing else. */
    if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", out_dir) >= (int)sizeof tmp)
        return tks_fail(TKS_ERR_ARG, out_dir, TKS_NONE, TKS_NONE, "path too long: %s", out_dir);
    if (!mkdtemp(tmp))
        return tks_fail(tks_write_errno_code(errno), tmp, TKS_NONE, TKS_NONE, "cannot create %s: %s", tmp,
                        strerror(errno));
    chmod(tmp, 0755);
    /* a model trained on a dataset without a tokenizer is exported without one */
    char none[PATH_MAX];
    int no_tok = tks_path_join(none, sizeof none, rs.checkpoint, TKS_NO_TOKENIZER_NAME) == 0 &&
                 access(none, F_OK) == 0;
    if (tokenizer_missing) *tokenizer_missing = no_tok;
    /* a byte-level BPE checkpoint has tokenizer.json (and its config), or a
     * tiktoken tokenizer's tiktoken.json and ranks, in place of a
     * sentencepiece tokenizer.model */
    char spm_model[PATH_MAX], bpe_json[PATH_MAX];
    int bpe = 0;
    if (!no_tok && tks_path_join(spm_model, sizeof spm_model, rs.checkpoint, "tokenizer.model") == 0 &&
        access(spm_model, F_OK) != 0 && tks_tok_find(rs.checkpoint, bpe_json, sizeof bpe_json) == 0)
        bpe = 1;
    tks_clear_error();
    static const char *const files[] = {"model.safetensors", "config.json", "tokenizer.model"};
    for (size_t i = 0; i < (no_tok || bpe ? 2u : 3u) && !rc; i++) {
        rc = tks_path_join(src, sizeof src, rs.checkpoint, files[i]);
        if (!rc) rc = tks_path_join(dst, sizeof dst, tmp, files[i]);
        if (!rc && access(src, F_OK) != 0)
            rc = tks_fail(TKS_ERR_MANIFEST, src, TKS_NONE, TKS_NONE,
                          "%s is missing: the checkpoint has no %s to export", src, files[i]);
        if (!rc) rc = tks_copy_file_atomic(src, dst);
    }
    if (!rc && bpe) {
        /* its tokenizer_config.json is read beside it and copied with it */
        tks_tok *t = NULL;
        rc = tks_tok_load(bpe_json, &t);
        if (!rc) rc = tks_hf_bpe_write(t, bpe_json, tmp);
        tks_tok_free(t);
    } else if (!rc && !no_tok) {
        rc = tks_path_join(dst, sizeof dst, tmp, "tokenizer.model");
        if (!rc) rc = tks_hf_tokenizer_write(dst, tmp);
    }
    if (!rc && rename(tmp, out_dir) != 0)
        rc = tks_fail(TKS_ERR_IO, out_dir, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", tmp, out_dir,
                      strerror(errno));
    if (rc) {
        nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        return rc;
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out_dir);
    char *sl = strrchr(parent, '/');
    return tks_fsync_dir(sl ? (*sl = 0, parent[0] ? parent : "/") : ".");
}
