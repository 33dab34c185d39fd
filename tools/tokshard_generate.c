/* tokshard-generate - sample text from a trained checkpoint (KV cache, CPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trainer/trainer.h"

/* The prompt is printed with the first generated piece, so that a run that
 * fails (a damaged checkpoint) prints nothing on stdout. */
static int prompt_shown;
static void print_text(const char *text, size_t len, void *ctx) {
    if (!prompt_shown) fputs((const char *)ctx, stdout), prompt_shown = 1;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void help(void) {
    printf("tokshard-generate - sample text from a tokshard-train checkpoint\n\n"
           "usage: tokshard-generate --checkpoint DIR [--prompt TEXT] [options]\n"
           "  --checkpoint DIR   a checkpoint (RUN/checkpoints/step-N), or a run dir (its newest)\n"
           "  --prompt TEXT      text to continue [\"\"]\n"
           "  --max-tokens N     tokens to generate [100]\n"
           "  --temperature F    0 = greedy [0.8]\n"
           "  --top-p F          nucleus sampling mass, 1 = off [0.9]\n"
           "  --seed N           sampling seed [1]\n"
           "  --threads N        CPU threads (0 = all cores) [0]\n"
           "The context is the model's max_seq_len tokens: a longer prompt keeps its most recent\n"
           "tokens, and generation that fills it goes on from its newest half (both said on stderr).\n"
           "\nexit codes: 0 ok, 2 usage error or unreadable checkpoint\n");
}

int main(int argc, char **argv) {
    cli_prog = "tokshard-generate";
    tks_backend_register(tks_cuda_backend_kind()); /* NULL in a build without CUDA */
    tks_generate_stats gs;
    tks_generate_opts o = {.max_tokens = 100, .temperature = 0.8f, .top_p = 0.9f, .seed = 1,
                           .prompt = "", .on_text = print_text, .stats = &gs};
    cli_args a = {argc - 1, 0, argv + 1, NULL, {0}};
    const char *pos, *v;
    uint64_t x;
    while (cli_next(&a, &pos)) {
        if (pos) return cli_usage_error("unexpected argument '%s'", pos);
        if (!strcmp(a.name, "--help") || !strcmp(a.name, "-h")) {
            help();
            return 0;
        }
        if (!(v = cli_value(&a))) return cli_usage_error("%s needs a value", a.name);
        if (!strcmp(a.name, "--checkpoint")) o.checkpoint = v;
        else if (!strcmp(a.name, "--prompt")) o.prompt = v;
        else if (!strcmp(a.name, "--max-tokens") && !cli_parse_size(v, &x) && x <= 1000000) o.max_tokens = (uint32_t)x;
        else if (!strcmp(a.name, "--temperature") && !cli_parse_float(v, &o.temperature) && o.temperature >= 0) {}
        else if (!strcmp(a.name, "--top-p") && !cli_parse_float(v, &o.top_p) && o.top_p > 0 && o.top_p <= 1) {}
        else if (!strcmp(a.name, "--seed") && !cli_parse_size(v, &o.seed)) {}
        else if (!strcmp(a.name, "--threads") && !cli_parse_size(v, &x) && x < 1024) o.threads = (int)x;
        else return cli_usage_error("%s %s: unknown option or invalid value", a.name, v);
    }
    if (!o.checkpoint) return cli_usage_error("--checkpoint DIR is required");
    char latest[4096];
    if (tks_train_latest_checkpoint(o.checkpoint, latest, sizeof latest) == 0) o.checkpoint = latest;
    o.ctx = (void *)o.prompt;
    int rc = tks_generate(&o);
    if (rc) return cli_lib_error();
    if (!prompt_shown) fputs(o.prompt, stdout); /* EOS came first */
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
