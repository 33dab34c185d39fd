/* tokshard - the data tool: build, train-tokenizer, audit, inspect, cat.
 * Thin: parses flags, calls the libraries, prints, maps errors to exit codes
 * (0 ok, 1 problems found by audit, 2 usage or I/O error, 130 interrupted). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "interop/interop.h"
#include "tokenize/tokenize.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/dist.h"
#include "tools/peer.h"
#include "tools/cmds.h"

/* ------------------------------------------------------------------------- */

static void help(FILE *f) {
    fprintf(f,
            "tokshard " TKS_VERSION_STRING " - raw text to checksummed, vocab-validated token shards\n\n"
            "usage:\n"
            "  tokshard train-tokenizer --model-type byte-bpe --output DIR [options] INPUT...\n"
            "      byte-level BPE with Hugging Face tokenizers' BpeTrainer's merges: DIR/tokenizer.json,\n"
            "      tokenizer_config.json, training.json\n"
            "      --vocab-size N [32000]   --pattern gpt2|llama3|cl100k|o200k|qwen2|REGEX [gpt2]\n"
            "      --special-tokens A,B  --bos-token T  --eos-token T  --pad-token T  --min-frequency N\n"
            "      --ignore-merges  --tiktoken (also tokenizer.tiktoken)  --threads N [all cores]\n"
            "      --memory BYTES [a quarter of RAM: counts spill to DIR.partial beyond it; a merge phase\n"
            "        over it is refused with its size]  --min-word-count N (prunes: changes the result)\n"
            "      --unit-bytes N [256M]  --resume (after Ctrl-C or a kill: keeps the counted units)  --quiet\n"
            "  tokshard train-tokenizer --output PREFIX [options] INPUT...   (a sentencepiece model)\n"
            "      --model-type bpe|unigram|word|char [bpe]   --vocab-size N [8000]   --byte-fallback\n"
            "      --character-coverage F [0.9995]  --input-sentence-size N [2000000]\n"
            "      --threads N [1: models depend on the thread count, so the default is fixed]\n"
            "  tokshard build --tokenizer TOKENIZER --output DIR [options] INPUT...\n"
            "      --threads N [all cores]    --shard-tokens N [16M]   --chunk-bytes N [1M]\n"
            "      --append-eos   --prepend-bos   --resume   --quiet\n"
            "      --unit-bytes N [1G: work units of at most N bytes of input; part of the output,\n"
            "        never of the launch: mpirun -np R tokshard build ... spreads units over R ranks]\n"
            "      --encoder auto|sentencepiece [auto: tokshard's fast encoder when it gives exactly\n"
            "        sentencepiece's ids for the model, else sentencepiece; the summary says which]\n"
            "      --allow-special-in-text   special tokens' text (<|endoftext|>) becomes their ids, as\n"
            "        Hugging Face tokenizers does by default [off: encoded as text, and counted]\n"
            "  TOKENIZER: a sentencepiece MODEL, a byte-level BPE tokenizer.json, a tiktoken ranks\n"
            "      file with --pattern gpt2|cl100k|o200k|llama3|llama3.1|qwen2|REGEX|tokenizer.json and\n"
            "      --special-tokens TEXT=ID,... [the named encoding's], or a dataset's tiktoken.json\n"
            "  tokshard verify-tokenizer MODEL TEXT... [input options; --doc-split line by default]\n"
            "      compares tokshard's fast encoder with the reference document by document:\n"
            "      sentencepiece for a MODEL; for byte-level BPE, Hugging Face tokenizers (a\n"
            "      tokenizer.json) or tiktoken (a ranks file) run by --python PATH [$TOKSHARD_PYTHON,\n"
            "      else python3], or tokshard's own (PCRE2 pieces, plain merge loop) when that\n"
            "      Python cannot import it; --reference peer|own insists on one [auto]\n"
            "      --no-cache: without the word cache (times the encoder's miss path)\n"
            "  tokshard verify-tokenizer A B TEXT...   the documents on which two tokenizers\n"
            "      (any two TOKENIZERs; --pattern and --special-tokens go to the tiktoken files) give\n"
            "      other ids\n"
            "  tokshard audit DIR|SHARD [--json] [--model-vocab N] [--tokenizer TOKENIZER] [--threads N]\n"
            "  tokshard audit DIR --against-source [--sample N (300) [--seed S] | --all] [--tokenizer TOKENIZER]\n"
            "      [--threads N] [--json]   documents read again from the inputs and encoded again with the\n"
            "      tokenizer parsed from its file, compared id by id; a changed input is reported and skipped\n"
            "  tokshard audit --format megatron|llmc|raw|datatrove SOURCE (--model-vocab N | --tokenizer TOKENIZER)\n"
            "      [--eod ID] [--eot ID] [--dtype u16|u32] [--json]   another project's dataset, in place;\n"
            "      with --tokenizer, a special token's id inside a document is reported\n"
            "  tokshard import --format megatron|llmc|raw|datatrove SOURCE --output DIR\n"
            "      (--tokenizer TOKENIZER | --vocab-size N) [--eot ID] [--dtype u16|u32] [--shard-tokens N] [--resume]\n"
            "  tokshard export --format megatron|llmc DIR PREFIX [--copy] [--eot ID]\n"
            "  tokshard export-hf CHECKPOINT DIR   a checkpoint as a Hugging Face model + fast tokenizer\n"
            "  tokshard export-hf --tokenizer TOKENIZER DIR   tokenizer.json + tokenizer_config.json only\n"
            "  tokshard inspect DIR|SHARD [--json] [--top K]\n"
            "  tokshard cat DIR|SHARD [--doc N] [--limit N] [--ids|--text] [--raw]\n"
            "  tokshard sample-plan DIR --seq-len L --global-batch B [--dp D] [--tp T] [--steps S0:S1]\n"
            "      [--seed S] [--micro-batch M] [--val-tokens N] [--json]   which samples each rank reads\n"
            "  tokshard sample-plan --run RUN|CHECKPOINT [--steps S0:S1] [--dp D] [--tp T] [--json]\n"
            "      the same with a run's own settings, from its newest (or the given) checkpoint\n"
            "  tokshard sample-plan --dataset NAME=DIR:W ... [--mix-at STEP:NAME=W,...] --seq-len L ...\n"
            "      a mixture's plan (or --mix FILE.json): each sample's source and index in it\n\n"
            "input options (train-tokenizer and build):\n%s\n"
            "INPUT: files or directories (walked recursively, in name order): plain text, .gz .xz\n"
            ".zst .bz2 .dz, and .tar .tar.gz .tgz .tar.xz .tar.zst .tar.bz2 .zip archives.\n"
            "Sizes accept K, M, G suffixes (powers of 1024).\n\n"
            "exit codes: 0 ok, 1 audit found problems, 2 usage or I/O error, 130 interrupted\n"
            "(an interrupted build continues with the same command plus --resume).\n",
            INPUT_HELP);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        help(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub_argv = argv + 2;
    /* `tokshard build --help`: every command's usage is on the one help page */
    for (int i = 0; i < sub_argc && strcmp(sub_argv[i], "--"); i++)
        if (!strcmp(sub_argv[i], "--help") || !strcmp(sub_argv[i], "-h")) {
            help(stdout);
            return 0;
        }
    if (!strcmp(cmd, "build")) return cli_build(sub_argc, sub_argv);
    if (!strcmp(cmd, "train-tokenizer")) return cli_train_tokenizer(sub_argc, sub_argv);
    if (!strcmp(cmd, "audit")) return cli_audit(sub_argc, sub_argv);
    if (!strcmp(cmd, "verify-tokenizer")) return cli_verify_tokenizer(sub_argc, sub_argv);
    if (!strcmp(cmd, "inspect")) return cli_inspect(sub_argc, sub_argv);
    if (!strcmp(cmd, "cat")) return cli_cat(sub_argc, sub_argv);
    if (!strcmp(cmd, "sample-plan")) return cli_sample_plan(sub_argc, sub_argv);
    if (!strcmp(cmd, "import")) return cli_import(sub_argc, sub_argv);
    if (!strcmp(cmd, "export")) return cli_export(sub_argc, sub_argv);
    if (!strcmp(cmd, "export-hf")) return cli_export_hf(sub_argc, sub_argv);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        help(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        puts("tokshard " TKS_VERSION_STRING);
        if (tks_input_parquet_reader()) printf("parquet input: Apache Arrow %s\n", tks_input_parquet_reader());
        else puts("parquet input: not available (a build without Arrow, or bin/tokshard-parquet.so missing beside the "
                  "programs: scripts/install-venv.sh installs pyarrow, then build again)");
        return 0;
    }
    return cli_usage_error("unknown command '%s'", cmd);
}
