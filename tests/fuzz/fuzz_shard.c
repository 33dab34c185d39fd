/*
 * fuzz_shard.c - the shard reader (dataset/reader.c, format.c) on arbitrary
 * bytes: tks_shard_open_mem must refuse or accept without reading outside the
 * buffer, and an accepted shard must be fully readable: every document through
 * tks_shard_read, every chunk through tks_shard_verify_chunk, and the reader's
 * answers must agree with the header it validated.
 *
 * Each input is tried as it is, then (when that changes it) with its
 * checksums recomputed (fuzz_fix.h), so that mutated header fields, index
 * entries and token ids reach the checks that sit behind the checksums.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_fix.h"

/* Reads document d through the public API and checks the ids. */
static void read_doc(const tks_shard *s, const uint64_t *index, uint64_t d, uint32_t *ids) {
    const tks_shard_header *h = tks_shard_hdr(s);
    uint64_t off = index[d], n = index[d + 1] - index[d];
    int rc = tks_shard_read(s, off, n, 0, ids);
    /* max_token_id < vocab_size is validated, but ids themselves are only
     * covered by the chunk checksums: an out-of-range id must be reported. */
    FUZZ_CHECK(rc == 0 || rc == TKS_ERR_TOKEN_RANGE);
    const void *tok = tks_shard_tokens(s);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = tks_shard_token_at(tok, h->token_bytes, off + i);
        FUZZ_CHECK(ids[i] == id);
        if (rc == 0) FUZZ_CHECK(id < h->vocab_size);
    }
    if (rc == TKS_ERR_TOKEN_RANGE) {
        const tks_error *e = tks_last_error();
        FUZZ_CHECK(e->code == TKS_ERR_TOKEN_RANGE);
        FUZZ_CHECK(e->offset >= off && e->offset < off + n);
        FUZZ_CHECK(e->doc == d); /* documents are never empty: the search lands on d */
        FUZZ_CHECK(ids[e->offset - off] >= h->vocab_size);
    }
    /* A model vocabulary below the shard's is honoured too. */
    if (h->vocab_size > 1) {
        uint32_t lim = h->max_token_id ? h->max_token_id : 1;
        rc = tks_shard_read(s, off, n, lim, ids);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_TOKEN_RANGE);
    }
}

/* Opens buf (8-byte aligned, exactly size bytes) and reads all of it. */
static void check_shard(const uint8_t *buf, size_t size) {
    tks_shard *s = NULL;
    int rc = tks_shard_open_mem(buf, size, "fuzz.tks", &s);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0 && s == NULL);
        FUZZ_CHECK(tks_last_error()->code == rc);
        FUZZ_CHECK(tks_strerror(rc) != NULL);
        return;
    }
    FUZZ_CHECK(s != NULL);
    const tks_shard_header *h = tks_shard_hdr(s);
    /* What open promises (dataset.h, docs/FORMAT.md). */
    FUZZ_CHECK(h->file_size == size);
    FUZZ_CHECK(h->token_bytes == (h->vocab_size <= TKS_U16_MAX_VOCAB ? 2u : 4u));
    FUZZ_CHECK(h->n_docs >= 1 && h->n_tokens >= h->n_docs);
    FUZZ_CHECK(h->max_token_id < h->vocab_size && h->min_token_id <= h->max_token_id);
    FUZZ_CHECK(h->tokens_offset + h->tokens_bytes <= h->index_offset);
    FUZZ_CHECK(h->index_offset + h->index_bytes <= h->table_offset);
    FUZZ_CHECK(h->table_offset + h->table_bytes == h->file_size);
    FUZZ_CHECK(h->n_chunks * (uint64_t)h->chunk_bytes >= h->tokens_bytes);
    FUZZ_CHECK((const uint8_t *)tks_shard_tokens(s) == buf + h->tokens_offset);

    const uint64_t *index = tks_shard_doc_index(s);
    FUZZ_CHECK(index[0] == 0 && index[h->n_docs] == h->n_tokens);
    uint64_t longest = 0;
    for (uint64_t d = 0; d < h->n_docs; d++) {
        FUZZ_CHECK(index[d + 1] > index[d]);
        if (index[d + 1] - index[d] > longest) longest = index[d + 1] - index[d];
    }
    uint32_t *ids = malloc((size_t)longest * sizeof *ids);
    FUZZ_SETUP(ids != NULL);
    for (uint64_t d = 0; d < h->n_docs; d++) read_doc(s, index, d, ids);
    free(ids);

    /* Ranges outside the shard are refused, whatever the overflow. */
    uint32_t one;
    FUZZ_CHECK(tks_shard_read(s, h->n_tokens, 1, 0, &one) == TKS_ERR_BOUNDS);
    FUZZ_CHECK(tks_shard_read(s, 1, UINT64_MAX, 0, &one) == TKS_ERR_BOUNDS);
    FUZZ_CHECK(tks_shard_read(s, UINT64_MAX, 1, 0, &one) == TKS_ERR_BOUNDS);
    FUZZ_CHECK(tks_shard_read(s, h->n_tokens, 0, 0, &one) == 0);

    for (uint64_t c = 0; c < h->n_chunks; c++) {
        rc = tks_shard_verify_chunk(s, c);
        FUZZ_CHECK(rc == 0 || rc == TKS_ERR_CHECKSUM);
    }
    FUZZ_CHECK(tks_shard_verify_chunk(s, h->n_chunks) == TKS_ERR_ARG);
    FUZZ_CHECK(tks_shard_verify_chunk(s, UINT64_MAX) == TKS_ERR_ARG);

    tks_shard_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The API wants 8-byte aligned bytes (the index and table are read as
     * uint64_t in place); malloc's alignment is at least that. The copy is
     * exactly `size` bytes so ASan sees any read past the end. */
    uint8_t *buf = calloc(size ? size : 1, 1);
    FUZZ_SETUP(buf != NULL);
    FUZZ_SETUP(((uintptr_t)buf & 7) == 0);
    if (size) memcpy(buf, data, size);
    check_shard(buf, size);
    fuzz_fix_checksums(buf, size);
    if (size && memcmp(buf, data, size) != 0) check_shard(buf, size);
    free(buf);
    return 0;
}
