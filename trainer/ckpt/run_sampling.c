/* run_sampling.c - the data-order settings of an existing run, read from one
 * of its checkpoints (tks_train_read_sampling, trainer.h). */
#define _GNU_SOURCE
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer/ckpt/checkpoint.h"
#include "trainer/trainer.h"

int tks_train_read_sampling(const char *path, tks_run_sampling *out) {
    memset(out, 0, sizeof *out);
    char state[PATH_MAX];
    struct stat sb;
    int rc = tks_path_join(state, sizeof state, path, "trainer_state.json");
    if (rc) return rc;
    if (stat(state, &sb) == 0) snprintf(out->checkpoint, sizeof out->checkpoint, "%s", path);
    else if ((rc = tks_train_latest_checkpoint(path, out->checkpoint, sizeof out->checkpoint)))
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE,
                        "%s is neither a checkpoint (no trainer_state.json) nor a run directory "
                        "with a complete checkpoint under checkpoints/; give a run's --out or one "
                        "of its checkpoints/step-N", path);
    tks_model_config cfg;
    tks_train_state st;
    if ((rc = tks_checkpoint_peek(out->checkpoint, &cfg, &st))) return rc;
    out->seq_len = st.seq_len;
    out->global_batch = st.global_batch;
    out->seed = st.seed;
    out->val_tokens = st.val_tokens;
    out->step = st.step;
    out->cursor = st.cursor;
    json_t *o = json_loads(st.options_json, 0, NULL);
    const char *ds = json_string_value(json_object_get(o, "dataset"));
    json_t *mb = json_object_get(o, "micro_batch");
    snprintf(out->mix_json, sizeof out->mix_json, "%s", st.mix_json);
    if (st.mix_json[0] && !ds) ds = ""; /* a mixture: its sources are in mix_json */
    if (!ds || !json_is_integer(mb) || json_integer_value(mb) < 0) {
        json_decref(o);
        return tks_fail(TKS_ERR_MANIFEST, out->checkpoint, TKS_NONE, TKS_NONE,
                        "%s/trainer_state.json: options lack the dataset or micro_batch (written by "
                        "an older tokshard?); give the dataset and flags to sample-plan instead",
                        out->checkpoint);
    }
    snprintf(out->dataset, sizeof out->dataset, "%s", ds);
    /* a relative path (a checkpoint written before paths were absolute) is
     * tried from here, then from the run directory (checkpoint/../..) */
    if (ds[0] && ds[0] != '/' && stat(ds, &sb) != 0) {
        char run[PATH_MAX], p[PATH_MAX];
        if (snprintf(run, sizeof run, "%s/../..", out->checkpoint) < (int)sizeof run &&
            tks_path_join(p, sizeof p, run, ds) == 0 && stat(p, &sb) == 0)
            snprintf(out->dataset, sizeof out->dataset, "%s", p);
    }
    out->micro_batch = (uint64_t)json_integer_value(mb);
    out->val_dataset = json_is_string(json_object_get(o, "val_dataset"));
    json_decref(o);
    return 0;
}
