/* tokshard_lean.c - the `tokshard` executable: a front end that runs
 * `tokshard audit` of a tokshard dataset itself and hands every other command
 * to the full tool (tokshard-full, next to it in the same directory) with
 * execv, same arguments, same process.
 *
 * Why: the full tool links sentencepiece, libarchive (and through it libxml2
 * and ICU), OpenBLAS and Open MPI, 31 shared libraries whose loading and
 * symbol binding cost about 10 ms of CPU per process start on a busy 2-core
 * machine (1 ms for a program linking only libc, jansson, libgomp and
 * libxxhash; bench/bench_audit.sh). An audit of a small dataset takes a few
 * ms, so that start-up was most of it. This executable links only what an
 * audit needs; a command it hands on costs one more exec (about 1 ms).
 *
 * It audits only when it understands every argument: `audit PATH` with
 * --json, --model-vocab, --threads, --max-problems. Anything else (another
 * command, --tokenizer, which needs sentencepiece for the vocabulary check,
 * --format for another project's dataset, a launch by mpirun/srun (also one
 * MPI does not connect, which the full tool refuses), an unknown
 * or malformed flag, whose message the full tool prints) goes to the full
 * tool, so both paths give the same output and exit code. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tks_launch.h"
#include "dataset/dataset.h"
#include "tools/cli.h"
#include "tools/dist.h"

#define FULL_NAME "tokshard-full"

/* Runs the full tool with this process's arguments; returns only on failure. */
static int exec_full(char **argv) {
    char self[PATH_MAX], full[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 && strchr(argv[0], '/')) {
        snprintf(self, sizeof self, "%s", argv[0]);
        n = (ssize_t)strlen(self);
    }
    if (n <= 0) {
        fprintf(stderr, "%s: error: cannot find this executable's directory (/proc/self/exe: %s) to "
                "run %s: run %s from its build directory by path\n", cli_prog, strerror(errno),
                FULL_NAME, FULL_NAME);
        return EXIT_USAGE;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    size_t dir = slash ? (size_t)(slash - self) + 1 : 0;
    if (dir + sizeof FULL_NAME > sizeof full) dir = 0;
    memcpy(full, self, dir);
    memcpy(full + dir, FULL_NAME, sizeof FULL_NAME);
    execv(full, argv);
    fprintf(stderr, "%s: error: cannot run %s: %s (it is built with tokshard: run `cmake --build "
            "build --target tokshard` and keep the two executables in one directory)\n",
            cli_prog, full, strerror(errno));
    return EXIT_USAGE;
}

/* What the setters below return when the full tool must run the command
 * (it prints the message of a malformed flag). */
#define HAND_OFF 1

/* --json, --model-vocab: by type. */
static int lean_typed(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (f->type == CLI_BOOL ? v != NULL : v == NULL) return HAND_OFF; /* --json=x, or no value */
    return cli_parse_typed(f, v) ? HAND_OFF : 0;
}

static int lean_threads(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    uint64_t x;
    if (!v || cli_parse_size(v, &x)) return HAND_OFF;
    *(int *)f->ptr = (int)x;
    return 0;
}

/* parsed exactly as tools/tokshard.c parses it */
static int lean_max_problems(const cli_flag *f, const char *name, const char *v) {
    (void)name;
    if (!v) return HAND_OFF;
    *(size_t *)f->ptr = strtoull(v, NULL, 10);
    return 0;
}

static int lean_unknown(cli_args *a, void *ctx) {
    (void)a, (void)ctx;
    return HAND_OFF;
}

static int lean_path(const char *arg, void *ctx) {
    const char **path = ctx;
    if (*path) return HAND_OFF;
    *path = arg;
    return 0;
}

/* `audit` arguments this front end understands: 1 and the options in *ao,
 * or 0 when the full tool must run the command. */
static int lean_audit_args(int argc, char **argv, tks_audit_opts *ao, const char **path, int *as_json) {
    const cli_flag flags[] = {
        {.name = "--json", .type = CLI_BOOL, .ptr = as_json, .set = lean_typed},
        {.name = "--model-vocab", .type = CLI_U32, .ptr = &ao->model_vocab, .set = lean_typed,
         .lo = 1, .hi = UINT32_MAX},
        {.name = "--threads", .ptr = &ao->threads, .set = lean_threads},
        {.name = "--max-problems", .ptr = &ao->max_problems, .set = lean_max_problems},
        {0},
    };
    cli_command cmd = {.flags = flags, .on_unknown = lean_unknown, .positional = lean_path, .ctx = path};
    return cli_parse(&cmd, argc, argv) == CLI_PARSED && *path != NULL;
}

int main(int argc, char **argv) {
    tks_audit_opts ao = {0};
    const char *path = NULL;
    int as_json = 0;
    if (argc < 2 || strcmp(argv[1], "audit") || dist_launched_many() || tks_launch_unconnected() ||
        !lean_audit_args(argc - 2, argv + 2, &ao, &path, &as_json))
        return exec_full(argv);
    tks_audit_report *r;
    if (tks_audit(path, &ao, &r) != 0) return cli_lib_error();
    int rc = cli_audit_print(path, r, as_json, NULL);
    tks_audit_report_free(r);
    return rc;
}
