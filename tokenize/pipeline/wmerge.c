/* wmerge.c - the merge phase of byte-level BPE training (tks_bpe_train):
 * the counted words (OUT.partial/words.cnt) sized against the memory limit,
 * given to the trainer (tokenizer/tokenizer.h, tks_bpe_trainer), the
 * tokenizer's files and training.json written in OUT.partial/publish, which
 * is renamed to OUT (pipeline.h, "Counting words"). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenize/pipeline/pipeline.h"

static void human(uint64_t b, char *out, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) x /= 1024, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", x, u[i]);
}

/* The words and bytes the merge phase holds: words.cnt's, less those
 * min_word_count leaves out (a pass over the file). */
static int sizes(tks__bt_job *j, const char *path, uint64_t *words, uint64_t *bytes) {
    tks__run_head h;
    int rc = tks__run_read_head(path, &h);
    if (rc) return rc;
    *words = h.words, *bytes = h.bytes;
    uint64_t min = j->o->min_word_count;
    if (min <= 1) return 0;
    tks__run_reader r;
    rc = tks__run_open(&r, path, j->run_buf);
    *words = *bytes = 0;
    int got;
    while (!rc && (got = tks__run_next(&r)) != 0) {
        if (got < 0) rc = got;
        else if (r.count >= min) ++*words, *bytes += r.len;
        else j->st.pruned_words++;
    }
    tks__run_reader_free(&r);
    return rc;
}

static int feed(tks__bt_job *j, tks_bpe_trainer *t, const char *path) {
    tks__run_reader r;
    int rc = tks__run_open(&r, path, j->run_buf), got;
    uint64_t min = j->o->min_word_count;
    while (!rc && (got = tks__run_next(&r)) != 0) {
        if (got < 0) rc = got;
        else if (r.count >= min) rc = tks_bpe_trainer_add(t, r.word, r.len, r.count);
    }
    tks__run_reader_free(&r);
    return rc;
}

static void on_merges(void *ctx, uint64_t merges, uint64_t target) {
    tks__bt_job *j = ctx;
    if (!j->o->progress) return;
    tks_bpe_train_progress p = {.phase = 2, .units = j->plan.n_units, .n_units = j->plan.n_units,
                                .runs = j->st.runs, .merges = merges, .target = target,
                                .seconds = omp_get_wtime() - j->t0};
    j->o->progress(&p, j->o->progress_ctx);
}

static const char *policy_name(tks_policy p) { return p == TKS_POLICY_SKIP ? "skip" : p == TKS_POLICY_FAIL ? "fail" : "replace"; }

/* training.json: what the tokenizer was trained from and with. Nothing in
 * it depends on the threads, the memory limit or the time taken. */
static json_t *training_record(const tks__bt_job *j, const tks_bpe_trainer *t) {
    const tks_bpe_train_opts *o = j->o;
    const tks_input_opts *io = &o->input;
    json_t *sp = json_array();
    for (size_t i = 0; sp && i < o->n_specials; i++) json_array_append_new(sp, json_string(o->specials[i]));
    json_t *prune = o->min_word_count > 1
                        ? json_pack("{s:I, s:I, s:s}", "min_word_count", (json_int_t)o->min_word_count,
                                    "words_left_out", (json_int_t)j->st.pruned_words, "note",
                                    "words seen fewer times than min_word_count were left out of the merge phase: "
                                    "the merges can differ from training on every word")
                        : json_null();
    static const char *const split[] = {"file", "line", "blank-line"};
    static const char *const fmt[] = {"auto", "text", "jsonl"};
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:b, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I}, "
                     "s:{s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:s}}",
                     "format", "tokshard train-tokenizer 1", "model", "byte-level BPE", "merges_of",
                     "Hugging Face tokenizers 0.23.3 BpeTrainer, initial alphabet ByteLevel.alphabet()",
                     "pattern", o->pattern, "regex", tks_pretok_regex(j->pt), "vocab_size",
                     (json_int_t)o->vocab_size, "vocab_trained", (json_int_t)tks_bpe_trainer_vocab_size(t),
                     "merges", (json_int_t)tks_bpe_trainer_merges(t), "min_frequency",
                     (json_int_t)o->min_frequency, "special_tokens", sp, "ignore_merges", o->ignore_merges,
                     "pruning", prune, "corpus", "files", (json_int_t)j->st.input.files, "documents",
                     (json_int_t)j->st.input.docs, "text_bytes", (json_int_t)j->st.input.bytes_text, "pieces",
                     (json_int_t)j->st.pieces, "words", (json_int_t)j->st.words, "word_bytes",
                     (json_int_t)j->st.word_bytes, "input", "doc_split", split[io->split % 3], "format",
                     fmt[io->format % 3], "jsonl_key", io->jsonl_key ? io->jsonl_key : "text", "invalid_utf8",
                     policy_name(io->invalid_utf8), "max_doc_bytes",
                     (json_int_t)(io->max_doc_bytes ? io->max_doc_bytes : (64ull << 20)), "long_doc",
                     policy_name(io->long_doc), "bad_record", policy_name(io->bad_record), "bad_input",
                     policy_name(io->bad_input));
}

static int write_record(int dirfd, const char *dir, json_t *js) {
    char *text = js ? json_dumps(js, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    int rc = text ? 0 : tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    size_t n = text ? strlen(text) : 0;
    char *t2 = rc ? NULL : realloc(text, n + 2);
    if (!rc && !t2) rc = tks_fail(TKS_ERR_NOMEM, dir, TKS_NONE, TKS_NONE, "out of memory");
    if (!rc) {
        text = t2, text[n] = '\n';
        tks_piece piece = {text, n + 1};
        rc = tks_write_file_at(dirfd, dir, "training.json", &piece, 1, 0644);
    }
    free(text);
    return rc;
}

int tks__bt_open_dir(const char *path, const char *what, int *fd_out) {
    struct stat sb;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    *fd_out = -1;
    if (fd < 0) {
        int e = errno;
        struct stat lb;
        int link = lstat(path, &lb) == 0 && S_ISLNK(lb.st_mode);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "%s %s is %s: remove it and run again", what, path,
                        link ? "a symbolic link (never followed)" : e == ENOTDIR ? "not a directory" : strerror(e));
    }
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid()) {
        close(fd);
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "%s %s is not your own directory: remove it and run again",
                        what, path);
    }
    *fd_out = fd;
    return 0;
}

void tks__bt_remove_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR) unlink(path); /* a link or a file at that name: itself */
        return;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(fd, e->d_name, 0);
    closedir(d);
    rmdir(path);
}

/* The trainer's files written in a new OUT.partial/publish through its
 * descriptor (no link planted in it or at its name is followed), made
 * durable, and the directory renamed whole to OUT. */
static int publish(tks__bt_job *j, const tks_bpe_trainer *t) {
    const tks_bpe_train_opts *o = j->o;
    char pub[PATH_MAX], parent[PATH_MAX];
    int dfd = -1;
    int rc = tks_path_join(pub, sizeof pub, j->partial, "publish");
    if (!rc) {
        tks__bt_remove_dir(pub); /* an earlier run's, unfinished */
        if (mkdir(pub, 0755) != 0)
            rc = tks_fail(tks_write_errno_code(errno), pub, TKS_NONE, TKS_NONE, "cannot create %s: %s", pub,
                          strerror(errno));
    }
    if (!rc) rc = tks__bt_open_dir(pub, "the output being written,", &dfd);
    tks_bpe_write_opts w = {.pattern = o->pattern, .ignore_merges = o->ignore_merges, .bos_token = o->bos_token,
                            .eos_token = o->eos_token, .pad_token = o->pad_token, .tiktoken = o->tiktoken};
    if (!rc) rc = tks_bpe_trainer_write(t, &w, dfd, pub);
    json_t *rec = rc ? NULL : training_record(j, t);
    if (!rc) rc = write_record(dfd, pub, rec);
    json_decref(rec);
    if (!rc && fsync(dfd) != 0)
        rc = tks_fail(TKS_ERR_IO, pub, TKS_NONE, TKS_NONE, "cannot sync %s: %s", pub, strerror(errno));
    if (dfd >= 0) close(dfd);
    if (!rc && rename(pub, j->out) != 0)
        rc = tks_fail(tks_write_errno_code(errno), j->out, TKS_NONE, TKS_NONE,
                      "cannot rename %s to %s: %s; the trained tokenizer is kept in %s (remove what is at %s and "
                      "run the same command with --resume)",
                      pub, j->out, strerror(errno), pub, j->out);
    const char *slash = strrchr(j->out, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - j->out) + (slash == j->out) : 1,
             slash ? j->out : ".");
    if (!rc) rc = tks_fsync_dir(parent);
    if (!rc) tks__bt_remove_dir(j->partial);
    return rc;
}

int tks__wtrain_finish(tks__bt_job *j) {
    const tks_bpe_train_opts *o = j->o;
    char path[PATH_MAX];
    uint64_t words = 0, bytes = 0;
    double t0 = omp_get_wtime();
    int rc = tks_path_join(path, sizeof path, j->partial, "words.cnt");
    if (!rc) rc = sizes(j, path, &words, &bytes);
    if (rc) return rc;
    j->st.words = words;
    j->st.word_bytes = bytes;
    j->st.memory = j->memory;
    j->st.merge_memory = tks_bpe_trainer_memory(words, bytes, o->vocab_size, j->threads);
    if (o->merge_phase) o->merge_phase(words, bytes, j->st.merge_memory, j->memory, o->progress_ctx);
    if (j->st.merge_memory > j->memory) {
        char need[32], have[32];
        human(j->st.merge_memory, need, sizeof need);
        human(j->memory, have, sizeof have);
        return tks_fail(TKS_ERR_NOMEM, j->partial, TKS_NONE, TKS_NONE,
                        "the merge phase would hold %s (%llu distinct words of 2 bytes or more, %llu bytes, "
                        "vocabulary %u) and --memory is %s: re-run with --resume and --memory %llu or more "
                        "(the counts in %s are kept), or leave rare words out with --min-word-count N "
                        "(changes the result)",
                        need, (unsigned long long)words, (unsigned long long)bytes, o->vocab_size, have,
                        (unsigned long long)j->st.merge_memory, j->partial);
    }
    tks_bpe_train_cfg cfg = {.vocab_size = o->vocab_size, .min_frequency = o->min_frequency,
                             .specials = o->specials, .n_specials = o->n_specials, .threads = j->threads};
    tks_bpe_trainer *t = NULL;
    rc = tks_bpe_trainer_create(&cfg, &t);
    if (!rc) rc = tks_bpe_trainer_reserve(t, words, bytes);
    if (!rc) rc = feed(j, t, path);
    if (!rc) rc = tks_bpe_trainer_run(t, on_merges, j, o->stop);
    if (!rc) {
        j->st.vocab_size = tks_bpe_trainer_vocab_size(t);
        j->st.merges = tks_bpe_trainer_merges(t);
        j->st.merge_peak = tks_bpe_trainer_peak(t);
        j->st.merge_seconds = omp_get_wtime() - t0;
        rc = publish(j, t);
    }
    tks_bpe_trainer_free(t);
    return rc;
}
