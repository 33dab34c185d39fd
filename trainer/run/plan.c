/* plan.c - the dry run: what a run would read, train and hold in memory,
 * without touching a device (tks_train_plan, trainer.h). */
#define _GNU_SOURCE
#include <errno.h>
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

/* ---- dry run ---------------------------------------------------------------- */

/* --deterministic on a backend whose fast paths are not (before its model) */
int tks__run_use_deterministic(const tks_train_opts *o, tks_backend *be) {
    return o->deterministic && be->kind->set_deterministic ? be->kind->set_deterministic(be, 1) : 0;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* The data lines of the plan: each source, the schedule, the windows. */
static void plan_data(tks_text *b, const run *r) {
    const uint64_t B = r->o.global_batch;
    for (uint32_t k = 0; k < r->n_src; k++) {
        const source *s = &r->src[k];
        uint64_t nw = tks_sampler_n_windows(s->train);
        if (!r->mixed)
            tks_text_printf(b, "  dataset        %s (%llu tokens in %zu shards, vocab %u)\n", s->dir,
                (unsigned long long)tks_dataset_n_tokens(s->ds), tks_dataset_n_shards(s->ds),
                tks_dataset_tokenizer(s->ds)->vocab_size);
        else
            tks_text_printf(b,
                            "  source %-7s %s (%llu tokens in %zu shards, vocab %u), weight %g: %llu train "
                            "windows, %llu validation\n",
                            s->name, s->dir, (unsigned long long)tks_dataset_n_tokens(s->ds),
                            tks_dataset_n_shards(s->ds), tks_dataset_tokenizer(s->ds)->vocab_size,
                            r->o.mix->sources[k].weight, (unsigned long long)nw,
                            (unsigned long long)(s->val ? tks_sampler_n_windows(s->val) : 0));
    }
    for (uint32_t p = 1; p < r->blend.n_phases; p++) {
        tks_text_printf(b, "  from step %llu (sample %llu):", (unsigned long long)(r->blend.start[p] / B + 1),
            (unsigned long long)r->blend.start[p]);
        for (uint32_t k = 0; k < r->n_src; k++)
            tks_text_printf(b, " %s %.4f", r->src[k].name, (double)r->blend.W[p][k] / (double)r->blend.S[p]);
        tks_text_printf(b, "\n");
    }
    if (!r->mixed)
        tks_text_printf(b, "  train windows  %llu (epoch = %.2f steps), validation windows %llu\n",
            (unsigned long long)tks_sampler_n_windows(r->train),
            (double)tks_sampler_n_windows(r->train) / (double)B,
            (unsigned long long)(r->val ? tks_sampler_n_windows(r->val) : 0));
    if (tks__run_packing(&r->o) == TKS_PACK_BEST_FIT) {
        tks_pack_stats st;
        if (!tks_sampler_pack_stats(r->train, &st))
            tks_text_printf(b, "  packing        best-fit: whole documents per window, %.3f%% padding (kept out of "
                            "the loss), %llu of %llu documents split\n",
                            st.capacity ? 100.0 * (double)st.pad_tokens / (double)st.capacity : 0.0,
                            (unsigned long long)st.docs_split, (unsigned long long)st.docs);
    }
    if (r->o.doc_mask || r->o.reset_positions)
        tks_text_printf(b, "  documents      %s%s%s (from the shards' document index)\n",
            r->o.doc_mask ? "attention inside each document (--doc-mask)" : "",
            r->o.doc_mask && r->o.reset_positions ? ", " : "",
            r->o.reset_positions ? "RoPE positions restart per document (--reset-positions)" : "");
}

/* The first steps' samples of the plan, per dp rank (the first four). */
static void plan_samples(tks_text *b, const run *r) {
    tks_text_printf(b, "first steps' samples (global sample -> %swindow: shard:offset)\n",
                    r->mixed ? "source/" : "");
    uint32_t dp = (uint32_t)(r->shape.dp_replicate * r->shape.dp_shard);
    const uint64_t B = r->o.global_batch;
    tks_blend_pick pk[6];
    for (uint64_t s = 0; s < 2 && s < r->o.steps; s++) {
        tks_text_printf(b, "  step %llu:\n",
                        (unsigned long long)((r->o.resume ? r->resumed.step : 0) + s + 1));
        for (uint32_t d = 0; d < dp && d < 4; d++) {
            uint64_t first, cnt;
            tks_sampler_rank_slice_at(r->start.sample + s * B, B, dp, d, &first, &cnt);
            uint64_t n = cnt < 6 ? cnt : 6;
            tks_blend_picks(&r->blend, &r->start, first, n, pk);
            tks_text_printf(b, "    dp rank %u (tp ranks read the same):", d);
            for (uint64_t i = 0; i < n; i++) {
                tks_sample_loc loc;
                const source *src = &r->src[pk[i].source];
                uint64_t w = tks_sampler_window(src->train, pk[i].index);
                tks_sampler_locate(src->train, w, &loc);
                tks_text_printf(b, " %llu->%s%s%llu:%u:%llu", (unsigned long long)(first + i),
                                r->mixed ? src->name : "", r->mixed ? "/" : "", (unsigned long long)w,
                                loc.pieces[0].shard, (unsigned long long)loc.pieces[0].offset);
            }
            tks_text_printf(b, cnt > 6 ? " ...\n" : "\n");
        }
        if (dp > 4)
            tks_text_printf(b, "    ... %u more dp ranks (tokshard sample-plan shows them all)\n", dp - 4);
    }
}

int tks_train_plan(const tks_train_opts *in, char **summary) {
    run r;
    /* under mpirun every rank plans: a failure on one rank is every rank's */
    int rc = in->world ? tks__run_resolve(in, 0, &r) : tks_mesh_world_agree(tks__run_resolve(in, 0, &r));
    if (!rc) rc = in->world ? tks__run_plans(&r) : tks_mesh_world_agree(tks__run_plans(&r));
    if (rc || !summary) {
        tks__run_free(&r);
        return rc;
    }
    const tks_model_config *c = &r.cfg;
    tks_text b = {0};
    uint64_t P = tks_model_n_params(c), VP = tks_model_padded_vocab(c, 1);
    uint64_t HD = c->dim / c->n_heads, N = r.micro * r.o.seq_len, T = r.o.seq_len;
    uint64_t Pp = P + (VP - c->vocab_size) * c->dim * (c->tie_embeddings ? 1 : 2);
    /* activations as the model allocates them (flash attention: linear in T),
     * with the workspace of the backend the run would use */
    tks_backend *pbe = NULL;
    rc = tks_backend_create(r.o.device, r.o.threads, &pbe);
    if (!rc && (rc = tks__run_use_deterministic(&r.o, pbe))) pbe->ops->destroy(pbe);
    if (rc) {
        tks__run_free(&r);
        return rc;
    }
    double act = (double)tks_model_activation_bytes(c, r.shape.tp, (int)r.micro, (int)T, r.dtype, pbe);
    /* one rank of this layout on this backend, and the comm it would use */
    tks_mem_plan mp;
    int comm_kind = 0;
    char mem_line[600] = "";
    rc = tks_mem_plan_make(c, &r.shape, (int)r.micro, (int)T, r.dtype, pbe, &mp);
    if (!rc) tks_mem_plan_format(&mp, mem_line, sizeof mem_line);
    if (!rc)
        rc = tks_mesh_comm_resolve(r.o.comm, pbe->kind,
                                   r.shape.dp_replicate * r.shape.dp_shard * r.shape.tp, &comm_kind);
    const char *be_name = pbe->kind->name;
    const tks_backend_kind *be_kind = pbe->kind;
    /* which attention runs, and which backward (--deterministic) */
    char attention[160] = "tokshard's own";
    if (!rc && be_kind->attention_name) be_kind->attention_name(pbe, r.dtype, attention, sizeof attention);
    pbe->ops->destroy(pbe);
    if (rc) {
        tks__run_free(&r);
        return rc;
    }
    (void)N;
    double cw = r.dtype == TKS_F32 ? 0.0 : (double)tks_dtype_size(r.dtype) * (double)Pp;
    tks_text_printf(&b, "run\n");
    plan_data(&b, &r);
    if (r.o.resume)
        tks_text_printf(&b, "  resume         %s (step %llu, cursor %llu samples)\n", r.o.resume,
            (unsigned long long)r.resumed.step, (unsigned long long)r.resumed.cursor);
    tks_text_printf(&b, "  output         %s\n", r.o.out_dir ? r.o.out_dir : "(none)");
    tks_text_printf(&b, "  steps          %llu x %llu samples x %u tokens = %llu tokens/step\n",
        (unsigned long long)r.o.steps, (unsigned long long)r.o.global_batch, r.o.seq_len,
        (unsigned long long)(r.o.global_batch * r.o.seq_len));
    tks_text_printf(&b, "  micro-batches  %llu of %llu samples per step (gradient accumulation)\n",
        (unsigned long long)r.n_micro, (unsigned long long)r.micro);
    tks_text_printf(&b, "  optimizer      AdamW lr %g -> %g (warmup %llu, cosine), betas (%g, %g), eps %g, "
        "weight decay %g, clip %g\n", r.o.lr, r.o.min_lr, (unsigned long long)r.o.warmup_steps,
        r.o.beta1, r.o.beta2, r.o.adam_eps, r.o.weight_decay, r.o.grad_clip);
    tks_text_printf(&b, "model (LLaMA)\n  vocab_size     %u (padded to %llu inside the process; padding is "
        "masked and never saved)\n", c->vocab_size, (unsigned long long)VP);
    tks_text_printf(&b, "  dim %u, layers %u, heads %u, kv heads %u (head dim %llu), ffn %u, max_seq_len %u, "
        "rope_theta %g, eps %g, tied embeddings %s\n", c->dim, c->n_layers, c->n_heads,
        c->n_kv_heads, (unsigned long long)HD, c->ffn_dim, c->max_seq_len, c->rope_theta,
        c->norm_eps, c->tie_embeddings ? "yes" : "no");
    tks_text_printf(&b, "  parameters     %llu (%.2f M)\n", (unsigned long long)P, P / 1e6);
    tks_text_printf(&b, "memory estimate (%s, one process with tp %d)\n  weights %.1f MiB (fp32 master), "
        "compute copy %.1f MiB, gradients %.1f MiB, AdamW moments %.1f MiB, activations %.1f MiB "
        "(%.0f bytes); total %.1f MiB\n", tks_dtype_name(r.dtype), r.shape.tp, mib(4.0 * Pp), mib(cw),
        mib(4.0 * Pp), mib(8.0 * Pp), mib(act), act, mib(16.0 * Pp + cw + act));
    char *mesh = tks_mesh_describe(&r.shape);
    if (mesh) tks_text_printf(&b, "%s", mesh);
    free(mesh);
    tks_text_printf(&b, "  comm: %s\n",
        tks_mesh_comm_kind_name(comm_kind, be_kind, r.shape.dp_replicate * r.shape.dp_shard * r.shape.tp));
    tks_text_printf(&b, "  device memory per rank (%s backend): %s\n", be_name, mem_line);
    tks_text_printf(&b, "  attention: %s%s%s\n", attention, r.o.doc_mask ? "; block-causal per document" : "",
        r.o.deterministic ? "; --deterministic" : "");
    tks_text_printf(&b,
                    "  per rank: vocab rows %llu (padded vocab %llu / tp %d), %u heads, %u kv heads, ffn %u; "
                    "optimizer state %.1f MiB\n",
                    (unsigned long long)(tks_model_padded_vocab(c, r.shape.tp) / (uint64_t)r.shape.tp),
                    (unsigned long long)tks_model_padded_vocab(c, r.shape.tp), r.shape.tp,
                    c->n_heads / (uint32_t)r.shape.tp, c->n_kv_heads / (uint32_t)r.shape.tp,
                    c->ffn_dim / (uint32_t)r.shape.tp, mib(8.0 * Pp / r.shape.tp / r.shape.dp_shard));
    plan_samples(&b, &r);
    *summary = b.s;
    tks__run_free(&r);
    return 0;
}
