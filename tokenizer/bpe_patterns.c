/*
 * bpe_patterns.c - the named pre-tokenizer patterns: tokenizers' ByteLevel
 * regex and the encodings tiktoken and its users name, each with the
 * source it is copied from and its special tokens.
 */
#include <stddef.h>
#include <string.h>

#include "tokenizer/bpe_internal.h"

const char tks__bpe_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Named patterns, as their sources write them (raw strings). */
static const struct {
    const char *name, *pattern;
    const char *specials; /* the encoding's special tokens, "TEXT=ID,..." */
} NAMED[] = {
    /* tiktoken_ext/openai_public.py: r50k_pat_str (gpt2, r50k_base, p50k_base) */
    {"gpt2", "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s",
     "<|endoftext|>=50256"},
    {"r50k", "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s",
     "<|endoftext|>=50256"},
    /* tiktoken_ext/openai_public.py: cl100k_base */
    {"cl100k",
     "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|"
     "\\s*[\\r\\n]|\\s+(?!\\S)|\\s",
     "<|endoftext|>=100257,<|fim_prefix|>=100258,<|fim_middle|>=100259,<|fim_suffix|>=100260,"
     "<|endofprompt|>=100276"},
    /* tiktoken_ext/openai_public.py: o200k_base */
    {"o200k",
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
     "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "<|endoftext|>=199999,<|endofprompt|>=200018"},
    /* Meta's llama3 repository, llama/tokenizer.py: pat_str; the 256
     * special tokens of that file (Llama 3) and of llama-models' (Llama 3.1
     * and later) come from llama3_specials */
    {"llama3",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     NULL},
    {"llama3.1",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     NULL},
    /* transformers, models/qwen2/tokenization_qwen2.py: PRETOKENIZE_REGEX */
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     NULL},
};

const char *tks_tiktoken_pattern(const char *name) {
    for (size_t i = 0; name && i < sizeof NAMED / sizeof *NAMED; i++)
        if (!strcmp(NAMED[i].name, name)) return NAMED[i].pattern;
    return NULL;
}

const char *tks__bpe_named_specials(const char *name) {
    for (size_t i = 0; name && i < sizeof NAMED / sizeof *NAMED; i++)
        if (!strcmp(NAMED[i].name, name)) return NAMED[i].specials;
    return NULL;
}
