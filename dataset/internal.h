/* internal.h - private to dataset/: shared by the reader, writer and audit. Not an API. */
#ifndef TKS_DATASET_INTERNAL_H
#define TKS_DATASET_INTERNAL_H

#include "dataset/dataset.h"
#include "common/tks_bits.h"


/* "shard-%05u.tks" */
void tks__shard_name(char out[32], uint32_t index);

struct tks_shard {
    const uint8_t *base;   /* whole file (mmap or caller's memory) */
    size_t size;
    int mapped;            /* 1: munmap on close */
    tks_shard_header h;
    const uint64_t *index; /* n_docs + 1 entries, inside base (8-aligned) */
    const uint64_t *table; /* n_chunks + 1 entries */
    char path[4096]; /* PATH_MAX */
};

/* First non-zero byte of the padding regions, or TKS_NONE. */
uint64_t tks__padding_nonzero(const uint8_t *base, const tks_shard_header *h);
/* First document d whose index entry breaks the rules (index[0] = 0, strictly
 * increasing, index[n_docs] = n_tokens), or TKS_NONE. */
uint64_t tks__index_bad(const uint64_t *index, const tks_shard_header *h);

/* manifest.c: parse manifest text (no shard opened); check a shard against its record. */
int tks__manifest_parse(const char *text, size_t len, const char *path, tks_tokenizer_info *tok,
                        tks_shard_info **shards_out, size_t *n_out, uint32_t *token_bytes,
                        uint32_t *chunk_bytes);
int tks__shard_matches(const tks_shard *s, const tks_shard_info *si, const tks_tokenizer_info *tok,
                       uint32_t token_bytes, uint32_t chunk_bytes);
/* Reads a whole (small) file into a malloc'd NUL-terminated buffer. */
int tks__read_small_file(const char *path, char **text, size_t *len);

#endif
