/* reader.c - open, validate and read shards in place (mmap, zero copy). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dataset/internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokshard's zero-copy reader serves little-endian ids in place: little-endian hosts only"
#endif

void tks__shard_name(char out[32], uint32_t index) { snprintf(out, 32, "shard-%05u.tks", index); }

static int all_zero(const uint8_t *p, size_t n, uint64_t base_off, uint64_t *first) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) {
            *first = base_off + i;
            return 0;
        }
    return 1;
}

uint64_t tks__padding_nonzero(const uint8_t *base, const tks_shard_header *h) {
    uint64_t at = TKS_NONE;
    if (!all_zero(base + TKS_HEADER_SIZE, h->tokens_offset - TKS_HEADER_SIZE, TKS_HEADER_SIZE, &at))
        return at;
    uint64_t end = h->tokens_offset + h->tokens_bytes;
    if (!all_zero(base + end, h->index_offset - end, end, &at)) return at;
    return TKS_NONE;
}

uint64_t tks__index_bad(const uint64_t *index, const tks_shard_header *h) {
    if (index[0] != 0) return 0;
    for (uint64_t d = 0; d < h->n_docs; d++)
        if (index[d + 1] <= index[d]) return d + 1;
    if (index[h->n_docs] != h->n_tokens) return h->n_docs;
    return TKS_NONE;
}

/* Validation shared by both open paths; on failure the caller frees s. */
static int validate(tks_shard *s) {
    const char *name = s->path;
    tks_shard_header *h = &s->h;
    int rc = tks_header_decode(s->base, s->size, name, h);
    if (rc) return rc;
    if (s->size != h->file_size)
        return tks_fail(TKS_ERR_TRUNCATED, name, h->shard_index, s->size,
                        "%s: file is %zu bytes but its header says %llu: the shard is %s; rebuild "
                        "it (or re-run the interrupted build with --resume)",
                        name, s->size, (unsigned long long)h->file_size,
                        s->size < h->file_size ? "truncated" : "followed by extra bytes");
    uint64_t pad = tks__padding_nonzero(s->base, h);
    if (pad != TKS_NONE)
        return tks_fail(TKS_ERR_PADDING, name, h->shard_index, pad,
                        "%s: padding byte at offset %llu is not zero: the file is corrupt", name,
                        (unsigned long long)pad);
    s->index = (const uint64_t *)(s->base + h->index_offset);
    s->table = (const uint64_t *)(s->base + h->table_offset);
    uint64_t tx = XXH3_64bits(s->table, h->table_bytes);
    if (tx != h->table_xxh3)
        return tks_fail(TKS_ERR_CHECKSUM, name, h->shard_index, h->table_offset,
                        "%s: checksum table (offset %llu) is corrupt: its XXH3 %016llx differs "
                        "from the header's %016llx",
                        name, (unsigned long long)h->table_offset, (unsigned long long)tx,
                        (unsigned long long)h->table_xxh3);
    uint64_t ix = XXH3_64bits(s->index, h->index_bytes);
    if (ix != s->table[h->n_chunks])
        return tks_fail(TKS_ERR_CHECKSUM, name, h->shard_index, h->index_offset,
                        "%s: document index (offset %llu) is corrupt: checksum mismatch", name,
                        (unsigned long long)h->index_offset);
    uint64_t d = tks__index_bad(s->index, h);
    if (d != TKS_NONE) {
        tks_fail(TKS_ERR_INDEX, name, h->shard_index, h->index_offset + 8 * d,
                 "%s: document index entry %llu (%llu) breaks monotonicity or does not end at "
                 "n_tokens %llu",
                 name, (unsigned long long)d, (unsigned long long)s->index[d],
                 (unsigned long long)h->n_tokens);
        tks_error_set_doc(d, TKS_NONE);
        return TKS_ERR_INDEX;
    }
    return 0;
}

static int make(const char *name, tks_shard **out) {
    *out = NULL;
    tks_shard *s = calloc(1, sizeof *s);
    if (!s) return tks_fail(TKS_ERR_NOMEM, name, TKS_NONE, TKS_NONE, "out of memory");
    snprintf(s->path, sizeof s->path, "%s", name ? name : "<memory>");
    *out = s;
    return 0;
}

int tks_shard_open(const char *path, tks_shard **out) {
    tks_shard *s;
    int rc = make(path, &s);
    if (rc) return rc;
    rc = tks_map_file(path, "shard", &s->base, &s->size);
    if (!rc) {
        s->mapped = 1;
        rc = validate(s);
    }
    if (rc) {
        tks_shard_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void tks_shard_advise(const tks_shard *s, tks_access how) {
    if (!s || !s->mapped) return;
    int advice = how == TKS_ACCESS_SEQUENTIAL ? MADV_SEQUENTIAL
               : how == TKS_ACCESS_RANDOM     ? MADV_RANDOM
                                              : MADV_NORMAL;
    (void)madvise((void *)s->base, s->size, advice);
}

void tks_shard_close(tks_shard *s) {
    if (!s) return;
    if (s->mapped) tks_unmap(s->base, s->size);
    free(s);
}

int tks_shard_open_mem(const void *data, size_t size, const char *name, tks_shard **out) {
    if (((uintptr_t)data & 7) != 0)
        return tks_fail(TKS_ERR_ARG, name, TKS_NONE, TKS_NONE,
                        "shard bytes must be 8-byte aligned in memory");
    tks_shard *s;
    int rc = make(name, &s);
    if (rc) return rc;
    s->base = data;
    s->size = size;
    rc = validate(s);
    if (rc) tks_shard_close(s);
    else *out = s;
    return rc;
}

const tks_shard_header *tks_shard_hdr(const tks_shard *s) { return &s->h; }
const char *tks_shard_path(const tks_shard *s) { return s->path; }
const void *tks_shard_tokens(const tks_shard *s) { return s->base + s->h.tokens_offset; }
const uint64_t *tks_shard_doc_index(const tks_shard *s) { return s->index; }

int tks_shard_read(const tks_shard *s, uint64_t offset, uint64_t n, uint32_t limit, uint32_t *out) {
    const tks_shard_header *h = &s->h;
    if (offset > h->n_tokens || n > h->n_tokens - offset)
        return tks_fail(TKS_ERR_BOUNDS, s->path, h->shard_index, offset,
                        "%s: tokens [%llu, %llu) are outside the shard's %llu tokens", s->path,
                        (unsigned long long)offset, (unsigned long long)(offset + n),
                        (unsigned long long)h->n_tokens);
    /* Ids must be below both the model's vocabulary and the shard's own: the
     * token bytes are not re-hashed here, so a flipped bit is caught too. */
    if (limit == 0 || limit > h->vocab_size) limit = h->vocab_size;
    const void *t = tks_shard_tokens(s);
    uint32_t bad = 0;
    if (h->token_bytes == 2) {
        const uint16_t *p = (const uint16_t *)t + offset;
        for (uint64_t i = 0; i < n; i++) {
            out[i] = p[i];
            bad |= (uint32_t)(p[i] >= limit);
        }
    } else {
        const uint32_t *p = (const uint32_t *)t + offset;
        for (uint64_t i = 0; i < n; i++) {
            out[i] = p[i];
            bad |= (uint32_t)(p[i] >= limit);
        }
    }
    if (!bad) return 0;
    for (uint64_t i = 0; i < n; i++)
        if (out[i] >= limit) {
            uint64_t at = offset + i;
            /* document holding token `at`: binary search of the index */
            uint64_t lo = 0, hi = h->n_docs;
            while (hi - lo > 1) {
                uint64_t mid = lo + (hi - lo) / 2;
                if (s->index[mid] <= at) lo = mid; else hi = mid;
            }
            tks_fail(TKS_ERR_TOKEN_RANGE, s->path, h->shard_index, at,
                     "%s (shard %u): token id %u at token offset %llu (document %llu) is not below "
                     "the vocabulary size %u: the data does not match this model; rebuild the "
                     "dataset with the model's tokenizer or give the model a larger vocabulary",
                     s->path, h->shard_index, out[i], (unsigned long long)at,
                     (unsigned long long)lo, limit);
            tks_error_set_doc(lo, TKS_NONE);
            return TKS_ERR_TOKEN_RANGE;
        }
    return 0;
}

int tks_shard_verify_chunk(const tks_shard *s, uint64_t c) {
    const tks_shard_header *h = &s->h;
    if (c >= h->n_chunks)
        return tks_fail(TKS_ERR_ARG, s->path, h->shard_index, TKS_NONE, "no chunk %llu",
                        (unsigned long long)c);
    uint64_t off = c * h->chunk_bytes;
    uint64_t len = h->tokens_bytes - off < h->chunk_bytes ? h->tokens_bytes - off : h->chunk_bytes;
    uint64_t x = XXH3_64bits(s->base + h->tokens_offset + off, len);
    if (x != s->table[c])
        return tks_fail(TKS_ERR_CHECKSUM, s->path, h->shard_index, h->tokens_offset + off,
                        "%s (shard %u): chunk %llu (bytes %llu..%llu, tokens from %llu) checksum "
                        "mismatch: the token data is corrupt; rebuild this shard",
                        s->path, h->shard_index, (unsigned long long)c,
                        (unsigned long long)(h->tokens_offset + off),
                        (unsigned long long)(h->tokens_offset + off + len),
                        (unsigned long long)(off / h->token_bytes));
    return 0;
}

int tks_shard_has_prov(const tks_shard *s) { return s->h.version == TKS_FORMAT_V2; }

static int no_prov(const tks_shard *s) {
    return tks_fail(TKS_ERR_ARG, s->path, s->h.shard_index, TKS_NONE,
                    "%s (shard %u) is format version %u: it records no provenance of its documents "
                    "(a dataset built before provenance, or imported); rebuild it with `tokshard build` "
                    "to audit it against its sources", s->path, s->h.shard_index, s->h.version);
}

int tks_shard_prov(const tks_shard *s, uint64_t d, tks_doc_prov *out) {
    const tks_shard_header *h = &s->h;
    if (h->version != TKS_FORMAT_V2) return no_prov(s);
    if (d >= h->n_docs)
        return tks_fail(TKS_ERR_ARG, s->path, h->shard_index, TKS_NONE, "%s: no document %llu (%llu documents)",
                        s->path, (unsigned long long)d, (unsigned long long)h->n_docs);
    tks_prov_decode(s->base + h->prov_offset + d * TKS_PROV_RECORD_BYTES, out);
    return 0;
}

int tks_shard_verify_prov(const tks_shard *s) {
    const tks_shard_header *h = &s->h;
    if (h->version != TKS_FORMAT_V2) return no_prov(s);
    uint64_t x = XXH3_64bits(s->base + h->prov_offset, h->prov_bytes);
    if (x != h->prov_xxh3)
        return tks_fail(TKS_ERR_CHECKSUM, s->path, h->shard_index, h->prov_offset,
                        "%s (shard %u): provenance section (bytes %llu..%llu) checksum mismatch: the record "
                        "of where its documents came from is corrupt; rebuild this shard",
                        s->path, h->shard_index, (unsigned long long)h->prov_offset,
                        (unsigned long long)(h->prov_offset + h->prov_bytes));
    return 0;
}
