/*
 * tks_tokinfo.h - the tokenizer record of a dataset's manifest
 * (docs/FORMAT.md): what the dataset library reads and checks, and what the
 * tokenizer library fills from a loaded tokenizer (tks_tokenizer_record,
 * tokenizer.h). Shared here so that neither library includes the other.
 */
#ifndef TKS_TOKINFO_H
#define TKS_TOKINFO_H

#include <stdint.h>

#define TKS_MAX_RESERVED 64

/* The tokenizer file of a dataset imported with a vocabulary size and no
 * tokenizer (model_type "none"): a text note, never a model; checkpoints
 * keep it under the same name. */
#define TKS_NO_TOKENIZER_NAME "tokenizer.none"

typedef struct tks_tokenizer_info {
    char file[256];           /* tokenizer file name inside the dataset dir */
    uint8_t fingerprint[16];  /* XXH3-128 of the tokenizer file */
    uint32_t vocab_size;
    char model_type[16];      /* "bpe", "unigram", "word", "char"; "none" (TKS_NO_TOKENIZER_NAME) */
    uint32_t bos_id, eos_id, pad_id, unk_id; /* TKS_NO_ID when absent */
    /* The ids no text produces: the special tokens (BOS, EOS and pad among
     * them) and the ids that are no token (a tiktoken file's gaps), as
     * sorted, disjoint, inclusive ranges [lo, hi] below vocab_size. 0 ranges:
     * not recorded (an older manifest, or a tokenizer with more than
     * TKS_MAX_RESERVED ranges). The audit reports such an id inside a
     * document; a BOS at a document's start and an EOS at its end are what
     * --prepend-bos and --append-eos write. */
    uint32_t reserved[TKS_MAX_RESERVED][2];
    uint32_t n_reserved;
    /* 1: documents were encoded with special tokens' text turned into their
     * ids (build --allow-special-in-text): special ids inside documents are
     * expected, and the audit does not look for them. */
    int special_from_text;
    /* XXH3-128 of the dataset's tokenizer_config.json (BOS, EOS and pad of a
     * tokenizer.json), which the fingerprint does not cover; has_config 0:
     * the dataset has none (or an older manifest did not record it). The
     * manifest writer records it when the file is there; opening the
     * dataset checks it. */
    uint8_t config_xxh3[16];
    int has_config;
    /* A build with a byte-level BPE tokenizer: the Unicode version of its
     * pre-tokenizer's tables (PCRE2's, "14.0.0"), the code points in the
     * dataset's documents that this Unicode leaves unassigned and the
     * documents that hold some. Hugging Face tokenizers and tiktoken on a
     * newer Unicode may pre-tokenize those documents otherwise, so their
     * ids may differ from the dataset's. unicode "": not recorded (a
     * sentencepiece model, an import, an older manifest; the counts are 0). */
    char unicode[16];
    uint64_t unassigned, unassigned_docs;
    /* XXH3-128 of the compact tables a byte-level tokenizer encoded the
     * dataset with (tks_bpe_tables_xxh3, tokenizer.h): the tokenizer cache's
     * form, the same whether the build parsed the file or mapped a cache
     * entry; a tokenizer cache entry altered by someone holding its key
     * shows as another digest than the file's parse by the same tokshard.
     * has_tables 0: not recorded (a sentencepiece model, an older manifest). */
    uint8_t tables_xxh3[16];
    int has_tables;
} tks_tokenizer_info;

#endif /* TKS_TOKINFO_H */
