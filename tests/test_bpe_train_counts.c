/* test_bpe_train_counts.c - byte-level BPE training's counts past 32 bits
 * (ctest bpe_train_counts): no corpus in a test can hold a word 2^32 times,
 * so the counts are given directly.
 *
 * - the trainer (tks_bpe_trainer_add / _run / _write): words whose counts,
 *   or whose pairs' summed counts, are over 2^31 and 2^32, against a pair
 *   that a 32-bit count (tokenizers' i32, or a u32) would put first: the
 *   merges must follow the true counts;
 * - the counting's runs (tokenize/pipeline/wruns.c): one word in three runs
 *   with counts near 2^63 / 3 each, merged into one run: its count and the
 *   run's total are the exact sums.
 *
 * Usage: test_bpe_train_counts WORKDIR */
#define _GNU_SOURCE
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"
#include "tokenize/pipeline/pipeline.h"
#include "tokenizer/tokenizer.h"

typedef struct word {
    const char *text;
    uint64_t count;
} word;

/* Trains on words[0..n) to 256 + `merges` ids and returns the merges as
 * "left right" strings (the caller frees the array, NULL on failure). The
 * words are ASCII letters, whose byte-level characters are themselves. */
static json_t *train(const char *dir, const word *words, size_t n, uint32_t merges) {
    tks_bpe_train_cfg cfg = {.vocab_size = 256 + merges, .threads = 2};
    tks_bpe_trainer *t = NULL;
    int rc = tks_bpe_trainer_create(&cfg, &t);
    for (size_t i = 0; !rc && i < n; i++) rc = tks_bpe_trainer_add(t, words[i].text, strlen(words[i].text), words[i].count);
    if (!rc) rc = tks_bpe_trainer_run(t, NULL, NULL, NULL);
    mkdir(dir, 0755);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    tks_bpe_write_opts w = {.pattern = "gpt2"};
    if (!rc) rc = fd < 0 ? -1 : tks_bpe_trainer_write(t, &w, fd, dir);
    if (fd >= 0) close(fd);
    tks_bpe_trainer_free(t);
    CHECK(rc == 0, "training in %s failed: %s", dir, tks_last_error()->message);
    if (rc) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *js = json_load_file(path, 0, NULL);
    json_t *m = json_incref(json_object_get(json_object_get(js, "model"), "merges"));
    json_decref(js);
    CHECK(json_is_array(m), "%s has no merges", path);
    return m;
}

/* The merge at `rank` as "left right" (tokenizers writes pairs as arrays or
 * as strings). */
static const char *merge_at(json_t *m, size_t rank, char *buf, size_t cap) {
    json_t *e = json_array_get(m, rank);
    if (json_is_string(e)) return json_string_value(e);
    if (json_is_array(e) && json_array_size(e) == 2) {
        snprintf(buf, cap, "%s %s", json_string_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)));
        return buf;
    }
    return "";
}

static void expect_merges(const char *what, json_t *m, const char *const *want, size_t n) {
    char buf[64];
    CHECK(m && json_array_size(m) == n, "%s: %zu merges, want %zu", what, m ? json_array_size(m) : 0, n);
    for (size_t i = 0; m && i < n && i < json_array_size(m); i++)
        CHECK(!strcmp(merge_at(m, i, buf, sizeof buf), want[i]), "%s: merge %zu is \"%s\", want \"%s\"", what, i,
              merge_at(m, i, buf, sizeof buf), want[i]);
}

static void trainer_counts(const char *work) {
    char dir[4096];
    /* "ab" 2^32 + 5 times (5 in a u32, and in tokenizers' i32), "cd" 2^32 - 1
     * times (-1 in an i32, the largest u32): "a b" first */
    word a[] = {{"ab", (1ull << 32) + 5}, {"cd", (1ull << 32) - 1}};
    snprintf(dir, sizeof dir, "%s/word-over-2^32", work);
    json_t *m = train(dir, a, 2, 2);
    expect_merges("a word seen 2^32 + 5 times", m, (const char *const[]){"a b", "c d"}, 2);
    json_decref(m);
    /* "a b" in two words of 2^31 each: its pair count 2^32 (0 in 32 bits),
     * against "c d" 1,000 times */
    word b[] = {{"xab", 1ull << 31}, {"yab", 1ull << 31}, {"cd", 1000}};
    snprintf(dir, sizeof dir, "%s/pair-sum-2^32", work);
    m = train(dir, b, 3, 1);
    expect_merges("a pair summed to 2^32", m, (const char *const[]){"a b"}, 1);
    json_decref(m);
    /* counts over 2^31 that differ only above bit 31: "ef" 2^33 + 7 times
     * against "gh" 2^32 + 9 times (9 > 7 in 32 bits): "e f" first, then the
     * counts at the low bits order "g h" before "x y" */
    word c[] = {{"ef", (1ull << 33) + 7}, {"gh", (1ull << 32) + 9}, {"xy", 3000000000ull}};
    snprintf(dir, sizeof dir, "%s/above-bit-31", work);
    m = train(dir, c, 3, 3);
    expect_merges("counts apart above bit 31", m, (const char *const[]){"e f", "g h", "x y"}, 3);
    json_decref(m);
}

static void run_counts(const char *work) {
    const uint64_t big = (1ull << 63) / 3 + 12345;
    char in[3][4096], out[4096];
    const char *names[3] = {in[0], in[1], in[2]};
    for (int r = 0; r < 3; r++) {
        snprintf(in[r], sizeof in[r], "%s/run-%d", work, r);
        tks__run_writer w;
        int rc = tks__run_create(&w, in[r], 4096);
        if (!rc) rc = tks__run_put(&w, "alpha", 5, 7);
        if (!rc) rc = tks__run_put(&w, "beta", 4, big);
        if (!rc) rc = tks__run_finish(&w);
        tks__run_writer_free(&w);
        CHECK(rc == 0, "writing run %d: %s", r, tks_last_error()->message);
    }
    snprintf(out, sizeof out, "%s/run-merged", work);
    int rc = tks__runs_merge(names, 3, out, 4096, NULL);
    CHECK(rc == 0, "merging runs: %s", tks_last_error()->message);
    tks__run_reader r;
    rc = rc ? rc : tks__run_open(&r, out, 4096);
    uint64_t beta = 0, alpha = 0;
    int got;
    while (!rc && (got = tks__run_next(&r)) > 0) {
        if (r.len == 4 && !memcmp(r.word, "beta", 4)) beta = r.count;
        if (r.len == 5 && !memcmp(r.word, "alpha", 5)) alpha = r.count;
    }
    CHECK(!rc && alpha == 21 && beta == 3 * big, "merged counts alpha %llu beta %llu, want 21 and %llu",
          (unsigned long long)alpha, (unsigned long long)beta, (unsigned long long)(3 * big));
    CHECK(!rc && r.head.total == 3 * big + 21 && r.head.words == 2, "merged run's header: %llu words, total %llu",
          (unsigned long long)r.head.words, (unsigned long long)r.head.total);
    if (!rc) tks__run_reader_free(&r);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_bpe_train_counts WORKDIR\n");
        return 2;
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", argv[1], argv[1]);
    if (system(cmd) != 0) return 2;
    trainer_counts(argv[1]);
    run_counts(argv[1]);
    return check_exit("bpe_train_counts");
}
