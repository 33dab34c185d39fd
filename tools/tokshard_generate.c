/* tokshard-generate - sample text from a trained checkpoint (KV cache, CPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "common/tks_bits.h"
#include "trainer/cuda/tks_cuda.h"
#include "trainer/trainer.h"

/* The prompt is printed with the first generated piece, so that a run that
 * fails (a damaged checkpoint) prints nothing on stdout. */
static int prompt_shown;

/* The output is UTF-8 whatever the model samples: a byte-level token may
 * hold part of a character, so bytes wait in `pend` until their sequence is
 * whole; a byte that starts no valid sequence, or a sequence left
 * incomplete at the end, is written as U+FFFD (as Python's
 * bytes.decode(errors="replace") does). */
static unsigned char pend[4];
static size_t npend;
static void put_utf8(const unsigned char *s, size_t n, int final) {
    unsigned char *all = malloc(npend + n + 1);
    if (!all) return;
    memcpy(all, pend, npend);
    if (n) memcpy(all + npend, s, n);
    size_t len = npend + n, i = 0;
    npend = 0;
    while (i < len) {
        int k = all[i] < 0x80 ? 1 : tks_utf8_seq(all + i, len - i);
        if (!final && tks_utf8_cut(all + i, len - i, k)) { /* wait for the rest */
            memcpy(pend, all + i, len - i);
            npend = len - i;
            break;
        }
        if (k > 0) fwrite(all + i, 1, (size_t)k, stdout);
        else fputs("\xEF\xBF\xBD", stdout);
        i += (size_t)(k > 0 ? k : -k);
    }
    free(all);
}

static void print_text(const char *text, size_t len, void *ctx) {
    if (!prompt_shown) fputs((const char *)ctx, stdout), prompt_shown = 1;
    put_utf8((const unsigned char *)text, len, 0);
    fflush(stdout);
}

static void help(void) {
    printf("tokshard-generate - sample text from a tokshard-train checkpoint\n\n"
           "usage: tokshard-generate --checkpoint DIR [--prompt TEXT] [options]\n"
           "  --checkpoint DIR   a checkpoint (RUN/checkpoints/step-N), or a run dir (its newest)\n"
           "  --prompt TEXT      text to continue [\"\"]\n"
           "  --max-tokens N     tokens to generate [100]\n"
           "  --min-tokens N     no end of text (EOS) before N tokens, at most --max-tokens [0]\n"
           "  --temperature F    0 = greedy [0.8]\n"
           "  --top-p F          nucleus sampling mass, 1 = off [0.9]\n"
           "  --seed N           sampling seed [1]\n"
           "  --threads N        CPU threads (0 = all cores) [0]\n"
           "The context is the model's max_seq_len tokens: a longer prompt keeps its most recent\n"
           "tokens, and generation that fills it goes on from its newest half (both said on stderr).\n"
           "\nexit codes: 0 ok, 2 usage error or unreadable checkpoint\n");
}

/* A bad value gets the message of an unknown option. */
static int bad_flag(const char *name, const char *v) {
    if (!v) return cli_usage_error("%s needs a value", name);
    return cli_usage_error("%s %s: unknown option or invalid value", name, v);
}

static int set_number(const cli_flag *f, const char *name, const char *v) {
    return v && !cli_parse_typed(f, v) ? 0 : bad_flag(name, v);
}

/* Options take a value, even the unknown ones. */
static int unknown_flag(cli_args *a, void *ctx) {
    (void)ctx;
    return bad_flag(a->name, cli_value(a));
}

int main(int argc, char **argv) {
    cli_prog = "tokshard-generate";
    tks_backend_register(tks_cuda_backend_kind()); /* NULL in a build without CUDA */
    tks_generate_stats gs;
    tks_generate_opts o = {.max_tokens = 100, .temperature = 0.8f, .top_p = 0.9f, .seed = 1,
                           .prompt = "", .on_text = print_text, .stats = &gs};
    uint32_t threads = 0;
    const cli_flag flags[] = {
        {.name = "--checkpoint", .type = CLI_STR, .ptr = &o.checkpoint},
        {.name = "--prompt", .type = CLI_STR, .ptr = &o.prompt},
        {.name = "--max-tokens", .type = CLI_U32, .ptr = &o.max_tokens, .set = set_number, .hi = 1000000},
        {.name = "--min-tokens", .type = CLI_U32, .ptr = &o.min_tokens, .set = set_number, .hi = 1000000},
        {.name = "--temperature", .type = CLI_FLOAT, .ptr = &o.temperature, .set = set_number, .hi = HUGE_VAL},
        {.name = "--top-p", .type = CLI_FLOAT, .ptr = &o.top_p, .set = set_number, .hi = 1, .open = 1},
        {.name = "--seed", .type = CLI_SIZE, .ptr = &o.seed, .set = set_number},
        {.name = "--threads", .type = CLI_U32, .ptr = &threads, .set = set_number, .hi = 1023},
        {0},
    };
    cli_command cmd = {.flags = flags, .on_unknown = unknown_flag, .help = help};
    int rc = cli_parse(&cmd, argc - 1, argv + 1);
    if (rc != CLI_PARSED) return rc;
    o.threads = (int)threads;
    if (!o.checkpoint) return cli_usage_error("--checkpoint DIR is required");
    char latest[4096];
    if (tks_train_latest_checkpoint(o.checkpoint, latest, sizeof latest) == 0) o.checkpoint = latest;
    o.ctx = (void *)o.prompt;
    rc = tks_generate(&o);
    if (rc) return cli_lib_error();
    if (!prompt_shown) fputs(o.prompt, stdout); /* EOS came first */
    put_utf8(NULL, 0, 1); /* a sequence the model left incomplete */
    putchar('\n');
    if (gs.prompt_dropped)
        fprintf(stderr, "%s: the prompt is %llu tokens and the model's context %u: its first %llu "
                "tokens were left out\n", cli_prog, (unsigned long long)gs.prompt_tokens, gs.context,
                (unsigned long long)gs.prompt_dropped);
    if (gs.slides)
        fprintf(stderr, "%s: the context (%u tokens) filled %llu time(s): generation went on from "
                "its newest half each time\n", cli_prog, gs.context, (unsigned long long)gs.slides);
    return 0;
}
