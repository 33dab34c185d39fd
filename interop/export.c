/* export.c - a tokshard dataset as Megatron indexed datasets (zero copy or
 * copied) and as llm.c token files. Layouts: docs/INTEROP.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interop/internal.h"
#include "common/tks_bits.h"


static int refuse_existing(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0)
        return tks_fail(TKS_ERR_EXISTS, path, TKS_NONE, TKS_NONE,
                        "%s already exists: choose another PREFIX or remove it", path);
    return 0;
}

/* Symbolic link dst -> target, made under a new random name beside it
 * (symlink(2) never replaces what is there) and published by rename so
 * that dst never exists half made. */
static int link_atomic(const char *target, const char *dst) {
    char tmp[PATH_MAX];
    int made = -1;
    for (int attempt = 0; attempt < 64 && made != 0; attempt++) {
        uint8_t r[8];
        int rc = tks_random(r, sizeof r);
        if (rc) return rc;
        if (snprintf(tmp, sizeof tmp, "%s.tmp-%02x%02x%02x%02x%02x%02x%02x%02x", dst, r[0], r[1], r[2], r[3],
                     r[4], r[5], r[6], r[7]) >= (int)sizeof tmp)
            return tks_fail(TKS_ERR_ARG, dst, TKS_NONE, TKS_NONE, "path too long: %s", dst);
        made = symlink(target, tmp);
        if (made != 0 && errno != EEXIST)
            return tks_fail(tks_write_errno_code(errno), dst, TKS_NONE, TKS_NONE,
                            "cannot create the link %s -> %s: %s", dst, target, strerror(errno));
    }
    if (made != 0)
        return tks_fail(TKS_ERR_IO, dst, TKS_NONE, TKS_NONE,
                        "cannot create the link %s: 64 random temporary names beside it were all taken; "
                        "remove the %s.tmp-* files", dst, dst);
    if (rename(tmp, dst) != 0) {
        int e = errno;
        unlink(tmp);
        return tks_fail(TKS_ERR_IO, dst, TKS_NONE, TKS_NONE, "cannot rename %s to %s: %s", tmp, dst,
                        strerror(e));
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", dst);
    char *sl = strrchr(dir, '/');
    if (sl) *sl = 0;
    return tks_fsync_dir(sl ? (dir[0] ? dir : "/") : ".");
}

/* Megatron .idx for one shard: S = n_docs sequences of one document each;
 * pointers are byte offsets into the .bin, which starts with the shard's
 * header when `base` = tokens_offset (the .bin is the shard) or with the
 * tokens when base = 0 (a copy). */
static int write_megatron_idx(const tks_shard *sh, const char *path, uint64_t base) {
    const tks_shard_header *h = tks_shard_hdr(sh);
    const uint64_t *ix = tks_shard_doc_index(sh);
    uint64_t S = h->n_docs;
    size_t size = TKS_MEGATRON_HEADER_BYTES + (size_t)(12 * S + 8 * (S + 1));
    uint8_t *b = malloc(size);
    if (!b) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory for %s", path);
    memcpy(b, TKS_MEGATRON_MAGIC, 9);
    tks_put_le64(b + 9, 1);
    b[17] = h->token_bytes == 2 ? 8 : 4; /* DType.uint16 or DType.int32 */
    tks_put_le64(b + 18, S);
    tks_put_le64(b + 26, S + 1);
    uint8_t *len_p = b + TKS_MEGATRON_HEADER_BYTES, *ptr_p = len_p + 4 * S, *doc_p = ptr_p + 8 * S;
    for (uint64_t d = 0; d < S; d++) {
        tks_put_le32(len_p + 4 * d, (uint32_t)(ix[d + 1] - ix[d]));
        tks_put_le64(ptr_p + 8 * d, base + ix[d] * h->token_bytes);
    }
    for (uint64_t d = 0; d <= S; d++) tks_put_le64(doc_p + 8 * d, d);
    int rc = tks_write_file_atomic(path, b, size);
    free(b);
    return rc;
}

/* What Megatron (int32 lengths, int32 ids) and llm.c (int32 count) cannot hold. */
static int check_representable(const tks_shard *sh, const tks_export_opts *o, uint64_t tokens_out) {
    const tks_shard_header *h = tks_shard_hdr(sh);
    const char *p = tks_shard_path(sh);
    if (h->max_token_id > INT32_MAX)
        return tks_fail(TKS_ERR_ARG, p, h->shard_index, TKS_NONE,
                        "%s holds id %u, above 2^31 - 1: %s stores ids as int32 and cannot hold it",
                        p, h->max_token_id, o->format == TKS_FOREIGN_MEGATRON ? "Megatron" : "llm.c");
    if (o->format == TKS_FOREIGN_MEGATRON) {
        const uint64_t *ix = tks_shard_doc_index(sh);
        for (uint64_t d = 0; d < h->n_docs; d++)
            if (ix[d + 1] - ix[d] > INT32_MAX) {
                tks_fail(TKS_ERR_ARG, p, h->shard_index, ix[d],
                         "%s: document %llu has %llu tokens; Megatron's sequence lengths are int32 "
                         "(at most 2^31 - 1 tokens): split the document before building",
                         p, (unsigned long long)d, (unsigned long long)(ix[d + 1] - ix[d]));
                tks_error_set_doc(d, 0);
                return TKS_ERR_ARG;
            }
    } else if (tokens_out >= (UINT64_C(1) << 31)) {
        return tks_fail(TKS_ERR_ARG, p, h->shard_index, TKS_NONE,
                        "%s would give an llm.c file of %llu tokens; llm.c's header counts tokens "
                        "in an int32 (below 2^31): rebuild with a smaller --shard-tokens",
                        p, (unsigned long long)tokens_out);
    }
    return 0;
}

/* Documents of the shard that do not start with `eot` (0 for TKS_NO_ID). */
static uint64_t llmc_inserted(const tks_shard *sh, uint32_t eot) {
    const tks_shard_header *h = tks_shard_hdr(sh);
    const uint64_t *ix = tks_shard_doc_index(sh);
    const void *tok = tks_shard_tokens(sh);
    uint64_t k = 0;
    if (eot != TKS_NO_ID)
        for (uint64_t d = 0; d < h->n_docs; d++) k += tks_shard_token_at(tok, h->token_bytes, ix[d]) != eot;
    return k;
}

static int export_llmc(const tks_shard *sh, const tks_export_opts *o, const char *path,
                       tks_export_stats *st) {
    const tks_shard_header *h = tks_shard_hdr(sh);
    const uint64_t *ix = tks_shard_doc_index(sh);
    const uint8_t *tok = tks_shard_tokens(sh);
    uint32_t tb = h->token_bytes;
    /* documents lacking the delimiter get it prepended */
    uint64_t inserted = llmc_inserted(sh, o->eot_id);
    uint64_t n_out = h->n_tokens + inserted;
    int rc = check_representable(sh, o, n_out);
    if (rc) return rc;
    if (o->eot_id != TKS_NO_ID && o->eot_id >= h->vocab_size)
        return tks_fail(TKS_ERR_ARG, tks_shard_path(sh), h->shard_index, TKS_NONE,
                        "--eot %u is outside the dataset's vocabulary [0, %u)", o->eot_id, h->vocab_size);
    uint8_t header[TKS_LLMC_HEADER_BYTES] = {0};
    tks_put_le32(header, tb == 2 ? TKS_LLMC_MAGIC_U16 : TKS_LLMC_MAGIC_U32);
    tks_put_le32(header + 4, tb == 2 ? 1 : 7);
    tks_put_le32(header + 8, (uint32_t)n_out);
    uint8_t eot[4];
    if (tb == 2) eot[0] = (uint8_t)o->eot_id, eot[1] = (uint8_t)(o->eot_id >> 8);
    else tks_put_le32(eot, o->eot_id);
    size_t n_pieces = 1 + (inserted ? 2 * (size_t)h->n_docs : 1);
    tks_piece *pc = malloc(n_pieces * sizeof *pc);
    if (!pc) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    size_t k = 0;
    pc[k++] = (tks_piece){header, sizeof header};
    if (!inserted) {
        pc[k++] = (tks_piece){tok, (size_t)(h->n_tokens * tb)};
    } else {
        for (uint64_t d = 0; d < h->n_docs; d++) {
            int need = tks_shard_token_at(tok, tb, ix[d]) != o->eot_id;
            pc[k++] = (tks_piece){eot, need ? tb : 0};
            pc[k++] = (tks_piece){tok + ix[d] * tb, (size_t)((ix[d + 1] - ix[d]) * tb)};
        }
    }
    rc = tks_write_file_pieces(path, pc, k);
    free(pc);
    if (!rc) {
        st->tokens += n_out;
        st->bytes_written += sizeof header + n_out * tb;
        st->eot_inserted += inserted;
        for (uint64_t d = 0; inserted && d < h->n_docs; d++)
            st->docs_end_eot += tks_shard_token_at(tok, tb, ix[d + 1] - 1) == o->eot_id;
    }
    return rc;
}

int tks_export(const char *dataset_dir, const char *prefix, const tks_export_opts *o,
               tks_export_stats *stats) {
    tks_export_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!dataset_dir || !prefix || !*prefix || !o ||
        (o->format != TKS_FOREIGN_MEGATRON && o->format != TKS_FOREIGN_LLMC))
        return tks_fail(TKS_ERR_ARG, prefix, TKS_NONE, TKS_NONE,
                        "export writes --format megatron or llmc, from a dataset DIR to a PREFIX");
    tks_dataset *ds = NULL;
    int rc = tks_dataset_open(dataset_dir, &ds);
    size_t n = rc ? 0 : tks_dataset_n_shards(ds);
    char bin[PATH_MAX], idx[PATH_MAX], target[PATH_MAX];
    /* refuse everything before writing anything */
    for (size_t i = 0; i < n && !rc; i++) {
        const tks_shard *sh = tks_dataset_shard(ds, i);
        if (snprintf(bin, sizeof bin, "%s_%05zu.bin", prefix, i) >= (int)sizeof bin ||
            snprintf(idx, sizeof idx, "%s_%05zu.idx", prefix, i) >= (int)sizeof idx)
            rc = tks_fail(TKS_ERR_ARG, prefix, TKS_NONE, TKS_NONE, "path too long: %s", prefix);
        if (!rc) rc = refuse_existing(bin);
        if (!rc && o->format == TKS_FOREIGN_MEGATRON) rc = refuse_existing(idx);
        if (!rc && o->format == TKS_FOREIGN_MEGATRON) rc = check_representable(sh, o, 0);
        if (!rc && o->format == TKS_FOREIGN_LLMC) {
            const tks_shard_header *h = tks_shard_hdr(sh);
            rc = check_representable(sh, o, h->n_tokens + llmc_inserted(sh, o->eot_id));
        }
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const tks_shard *sh = tks_dataset_shard(ds, i);
        const tks_shard_header *h = tks_shard_hdr(sh);
        snprintf(bin, sizeof bin, "%s_%05zu.bin", prefix, i);
        snprintf(idx, sizeof idx, "%s_%05zu.idx", prefix, i);
        if (o->format == TKS_FOREIGN_LLMC) {
            rc = export_llmc(sh, o, bin, stats);
        } else if (o->copy) {
            tks_piece pc = {tks_shard_tokens(sh), (size_t)h->tokens_bytes};
            rc = tks_write_file_pieces(bin, &pc, 1);
            if (!rc) rc = write_megatron_idx(sh, idx, 0);
            stats->tokens += h->n_tokens;
            stats->bytes_written += h->tokens_bytes;
        } else {
            if (!realpath(tks_shard_path(sh), target))
                rc = tks_fail(TKS_ERR_IO, tks_shard_path(sh), i, TKS_NONE, "cannot resolve %s: %s",
                              tks_shard_path(sh), strerror(errno));
            if (!rc) rc = link_atomic(target, bin);
            if (!rc) rc = write_megatron_idx(sh, idx, h->tokens_offset);
            stats->tokens += h->n_tokens;
        }
        if (!rc && o->format == TKS_FOREIGN_MEGATRON) {
            struct stat sb;
            if (stat(idx, &sb) == 0) stats->bytes_written += (uint64_t)sb.st_size;
        }
        stats->files++;
        stats->docs += h->n_docs;
    }
    tks_dataset_close(ds);
    return rc;
}
