/* cmd_audit_source.c - tokshard audit DATA --against-source: the report of
 * tks_audit_source (tokenize.h), text or JSON, over MPI ranks when launched
 * by mpirun or srun (dist_audit_source). */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/cmds.h"
#include "tools/dist.h"

static json_t *num_or_null(uint64_t v) { return v == TKS_NONE ? json_null() : json_integer((json_int_t)v); }

static void print_json(const char *path, const tks_source_audit_opts *o, const tks_audit_report *r,
                       const tks_source_audit_stats *st) {
    json_t *probs = json_array();
    for (size_t i = 0; i < r->n_problems; i++) {
        const tks_audit_problem *p = &r->problems[i];
        json_array_append_new(probs, json_pack("{s:s, s:s, s:o, s:o, s:o, s:s}", "kind",
                                               p->code == TKS_ERR_INPUT ? "source changed" : "ids differ", "file",
                                               p->file, "shard", num_or_null(p->shard), "token_offset",
                                               num_or_null(p->token_offset), "doc", num_or_null(p->doc),
                                               "message", p->message));
    }
    json_t *j = json_pack("{s:s, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:f, s:I, s:o}", "path", path,
                          "ok", r->n_problems_total == 0, "all", o->all, "seed", (json_int_t)o->seed,
                          "dataset_documents", (json_int_t)st->dataset_docs, "sampled", (json_int_t)st->sampled,
                          "checked", (json_int_t)st->checked, "ids_differ", (json_int_t)st->ids_differ,
                          "source_changed", (json_int_t)st->changed, "tokens", (json_int_t)st->tokens,
                          "bytes", (json_int_t)st->bytes, "tokenizer", st->tokenizer, "seconds", st->seconds,
                          "problems_total", (json_int_t)r->n_problems_total, "problems", probs);
    json_object_set_new(j, "tables_match", st->tables ? json_boolean(st->tables > 0) : json_null());
    json_object_set_new(j, "sentencepiece_library",
                        st->spm_library == 1 ? json_pack("{s:I, s:I}", "checked", (json_int_t)st->spm_checked,
                                                         "ids_differ", (json_int_t)st->spm_differ)
                        : st->spm_library < 0 ? json_string("unavailable") : json_null());
    cli_json_print(j);
}

static void print_text(const char *path, const tks_source_audit_opts *o, const tks_audit_report *r,
                       const tks_source_audit_stats *st) {
    for (size_t i = 0; i < r->n_problems; i++) {
        const tks_audit_problem *p = &r->problems[i];
        printf("PROBLEM %s", p->file);
        if (p->code != TKS_ERR_INPUT && p->token_offset != TKS_NONE)
            printf(" token %llu", (unsigned long long)p->token_offset);
        printf(": %s\n", p->message);
    }
    if (r->n_problems < r->n_problems_total)
        printf("... and %zu more problems\n", r->n_problems_total - r->n_problems);
    char which[64];
    if (o->all) snprintf(which, sizeof which, "all %llu", (unsigned long long)st->sampled);
    else snprintf(which, sizeof which, "%llu (seed %llu)", (unsigned long long)st->sampled, (unsigned long long)o->seed);
    int bad = st->ids_differ || st->spm_differ || st->tables < 0;
    printf("%s: %s: %s of %llu documents read again from %llu input file%s and encoded again with %s, parsed from "
           "its file: %llu compared, %llu with ids that differ, %llu skipped (source changed); %llu ids, %.1f MB of "
           "text; %.2f s (reading %.2f s, hashing the inputs %.2f s, encoding %.2f s)\n",
           bad ? "FAILED" : st->changed ? "SOURCE CHANGED" : "OK", path, which, (unsigned long long)st->dataset_docs,
           (unsigned long long)st->inputs, st->inputs == 1 ? "" : "s", st->tokenizer,
           (unsigned long long)st->checked, (unsigned long long)st->ids_differ, (unsigned long long)st->changed,
           (unsigned long long)st->tokens, st->bytes / 1e6, st->seconds, st->seconds_read, st->seconds_hash,
           st->seconds_encode);
    if (st->tables)
        printf("tables: the manifest's tables_xxh3 is %s the tokenizer parsed from its file\n",
               st->tables > 0 ? "that of" : "NOT that of");
    if (st->spm_library == 1)
        printf("sentencepiece library: %llu documents compared, %llu with ids that differ\n",
               (unsigned long long)st->spm_checked, (unsigned long long)st->spm_differ);
    else if (st->spm_library < 0)
        printf("note: the sentencepiece library is not available to this tokshard: the ids were compared with "
               "tokshard's own encoder only\n");
    if (st->changed)
        printf("note: %llu sampled document%s skipped: %s source changed since the build (restore the inputs the "
               "build read, or build the dataset again from the current ones)\n",
               (unsigned long long)st->changed, st->changed == 1 ? " was" : "s were", st->changed == 1 ? "its" : "their");
}

int cli_audit_source(const char *path, tks_source_audit_opts *o, int seed_given, int as_json) {
    if (!seed_given) { /* a new sample each run, printed so that it can be run again */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        o->seed = ((uint64_t)t.tv_sec * 1000003u ^ (uint64_t)t.tv_nsec ^ (uint64_t)getpid() << 20) % 1000000007u;
    }
    tks_audit_report *r = NULL;
    tks_source_audit_stats st;
    int rank = 0;
    if (dist_audit_source(path, o, &r, &st, &rank)) return dist_finish(cli_lib_error());
    if (rank != 0) return dist_finish(0);
    if (as_json) print_json(path, o, r, &st);
    else print_text(path, o, r, &st);
    int rc = r->n_problems_total ? EXIT_PROBLEMS : 0;
    tks_audit_report_free(r);
    return dist_finish(rc);
}
