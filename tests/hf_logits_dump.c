/*
 * hf_logits_dump - tokshard's forward pass on a checkpoint, for the Hugging
 * Face interop test (tests/test_hf.py): loads CHECKPOINT with the CPU
 * backend, runs the ids of IDS_FILE (whitespace-separated, one sequence) and
 * writes the logits, float32 [T, V] row-major little-endian, to OUT.
 * Usage: hf_logits_dump CHECKPOINT IDS_FILE OUT
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/ckpt/checkpoint.h"
#include "trainer/model/model.h"

static int die(const char *what) {
    fprintf(stderr, "hf_logits_dump: %s: %s\n", what, tks_last_error()->message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: hf_logits_dump CHECKPOINT IDS_FILE OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) return perror(argv[2]), 1;
    int32_t *ids = NULL;
    int n = 0, cap = 0, v;
    while (fscanf(f, "%d", &v) == 1) {
        if (n == cap) ids = realloc(ids, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *ids);
        ids[n++] = v;
    }
    fclose(f);
    if (n < 2) return fprintf(stderr, "hf_logits_dump: %s: need at least 2 ids\n", argv[2]), 1;
    tks_model_config cfg;
    tks_train_state st;
    if (tks_checkpoint_peek(argv[1], &cfg, &st)) return die("peek");
    tks_backend *be = tks_cpu_backend_create(1);
    tks_model *m = NULL;
    if (tks_model_create(&cfg, be, NULL, 1, n, &m)) return die("create");
    if (tks_checkpoint_load(argv[1], m, NULL)) return die("load");
    int32_t *tg = calloc((size_t)n, sizeof *tg);
    for (int t = 0; t + 1 < n; t++) tg[t] = ids[t + 1];
    tg[n - 1] = ids[0];
    double loss;
    if (tks_model_forward(m, ids, tg, &loss)) return die("forward");
    uint32_t V = cfg.vocab_size, VP = tks_model_padded_vocab(&cfg, 1);
    float *lg = malloc((size_t)n * VP * sizeof *lg);
    be->ops->download(be, lg, tks_model_logits(m), (size_t)n * VP * sizeof *lg);
    FILE *o = fopen(argv[3], "wb");
    if (!o) return perror(argv[3]), 1;
    for (int t = 0; t < n; t++) fwrite(lg + (size_t)t * VP, sizeof *lg, V, o);
    if (fclose(o)) return perror(argv[3]), 1;
    free(lg), free(tg), free(ids);
    tks_model_free(m);
    be->ops->destroy(be);
    return 0;
}
