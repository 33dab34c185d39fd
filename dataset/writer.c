/* writer.c - stream documents into shards: tokens go to "shard-NNNNN.tks.tmp"
 * as they arrive, chunk checksums are computed on the fly, and the header,
 * index, checksum table and (version 2) provenance section are written when
 * the shard is closed; then fsync and rename publish it. Memory: one write
 * buffer, the shard's document index and its checksum table (8 bytes per
 * document and per chunk), and its provenance records (24 bytes per
 * document). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "dataset/internal.h"

#define WBUF_BYTES (1u << 20)

typedef struct u64vec {
    uint64_t *v;
    size_t n, cap;
} u64vec;

static int u64_push(u64vec *a, uint64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1024;
        uint64_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (shard index)");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

struct tks_writer {
    tks_writer_opts o;
    char dir[PATH_MAX];
    uint32_t token_bytes;
    /* current shard */
    int fd;                 /* -1 when no shard is open */
    char tmp_path[PATH_MAX];
    uint32_t shard;         /* index of the current / next shard */
    uint64_t n_tokens;
    uint32_t min_id, max_id;
    u64vec index;           /* cumulative offsets, starts with 0 */
    u64vec table;           /* finished chunk hashes */
    uint8_t *prov;          /* provenance records of the shard's documents (o.provenance) */
    size_t prov_cap;        /* bytes allocated; the shard's n_docs records are in use */
    XXH3_state_t *chunk;    /* hash of the chunk being filled */
    uint64_t chunk_fill;    /* bytes in it */
    uint8_t *wbuf;
    size_t wfill;
    uint64_t file_off;      /* where wbuf goes */
    /* published */
    tks_shard_info *shards;
    size_t n_shards, cap_shards;
};

int tks_writer_create(const tks_writer_opts *opts, tks_writer **out) {
    *out = NULL;
    if (!opts || !opts->dir || opts->vocab_size == 0 || opts->shard_tokens == 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "writer needs an output dir, vocab_size >= 1 and shard_tokens >= 1");
    uint32_t cb = opts->chunk_bytes ? opts->chunk_bytes : TKS_DEFAULT_CHUNK_BYTES;
    if (cb < TKS_MIN_CHUNK_BYTES || cb > TKS_MAX_CHUNK_BYTES || cb % 4)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--chunk-bytes %u: must be a multiple of 4 in [%u, %u]", cb,
                        TKS_MIN_CHUNK_BYTES, TKS_MAX_CHUNK_BYTES);
    tks_writer *w = calloc(1, sizeof *w);
    if (!w) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    w->o = *opts;
    w->o.chunk_bytes = cb;
    w->o.provenance = opts->provenance != 0;
    snprintf(w->dir, sizeof w->dir, "%s", opts->dir);
    w->o.dir = w->dir;
    w->token_bytes = opts->vocab_size <= TKS_U16_MAX_VOCAB ? 2 : 4;
    w->fd = -1;
    w->shard = opts->first_shard;
    w->wbuf = malloc(WBUF_BYTES);
    w->chunk = XXH3_createState();
    if (!w->wbuf || !w->chunk) {
        tks_writer_free(w);
        return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
    }
    *out = w;
    return 0;
}

static int open_shard(tks_writer *w) {
    char name[32];
    tks__shard_name(name, w->shard);
    if (snprintf(w->tmp_path, sizeof w->tmp_path, "%s/%s.tmp", w->dir, name) >= (int)sizeof w->tmp_path)
        return tks_fail(TKS_ERR_ARG, w->dir, w->shard, TKS_NONE, "output path too long");
    /* a fixed name in the build's own directory: a leftover (or anything
     * put there) is removed and the file created anew, never opened through
     * a link (O_EXCL, O_NOFOLLOW) */
    unlink(w->tmp_path);
    w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return tks_fail(tks_write_errno_code(errno), w->tmp_path, w->shard, TKS_NONE,
                        "cannot create %s: %s", w->tmp_path, strerror(errno));
    w->n_tokens = 0;
    w->min_id = UINT32_MAX;
    w->max_id = 0;
    w->index.n = 0;
    w->table.n = 0;
    w->chunk_fill = 0;
    XXH3_64bits_reset(w->chunk);
    w->wfill = 0;
    w->file_off = TKS_TOKEN_ALIGN;
    return u64_push(&w->index, 0);
}

static int flush_wbuf(tks_writer *w) {
    if (!w->wfill) return 0;
    int rc = tks_pwrite_all(w->fd, w->wbuf, w->wfill, w->file_off, w->tmp_path);
    if (rc) return rc;
    /* the kernel starts writing the range back now (advice: its result is
     * not looked at, the fsync at the seal is the guarantee and reports
     * errors), so that the seal's fsync does not wait for the whole shard
     * while the encoding threads wait for the seal (12 MB: 6.5 ms) */
    (void)sync_file_range(w->fd, (off_t)w->file_off, (off_t)w->wfill, SYNC_FILE_RANGE_WRITE);
    w->file_off += w->wfill;
    w->wfill = 0;
    return 0;
}

/* Appends token bytes: feeds chunk hashes (split at chunk boundaries) and the write buffer. */
static int put_bytes(tks_writer *w, const uint8_t *p, size_t n) {
    size_t done = 0;
    while (done < n) {
        size_t room = w->o.chunk_bytes - w->chunk_fill;
        size_t take = n - done < room ? n - done : room;
        XXH3_64bits_update(w->chunk, p + done, take);
        w->chunk_fill += take;
        if (w->chunk_fill == w->o.chunk_bytes) {
            int rc = u64_push(&w->table, XXH3_64bits_digest(w->chunk));
            if (rc) return rc;
            XXH3_64bits_reset(w->chunk);
            w->chunk_fill = 0;
        }
        done += take;
    }
    done = 0;
    while (done < n) {
        size_t take = n - done < WBUF_BYTES - w->wfill ? n - done : WBUF_BYTES - w->wfill;
        memcpy(w->wbuf + w->wfill, p + done, take);
        w->wfill += take;
        done += take;
        if (w->wfill == WBUF_BYTES) {
            int rc = flush_wbuf(w);
            if (rc) return rc;
        }
    }
    return 0;
}

static int publish(tks_writer *w) {
    int rc = flush_wbuf(w);
    if (rc) return rc;
    if (w->chunk_fill) {
        rc = u64_push(&w->table, XXH3_64bits_digest(w->chunk));
        if (rc) return rc;
    }
    tks_shard_header h = {0};
    h.version = w->o.provenance ? TKS_FORMAT_V2 : TKS_FORMAT_V1;
    h.token_bytes = w->token_bytes;
    h.vocab_size = w->o.vocab_size;
    h.bos_id = w->o.bos_id;
    h.eos_id = w->o.eos_id;
    h.pad_id = w->o.pad_id;
    h.chunk_bytes = w->o.chunk_bytes;
    memcpy(h.tokenizer_fp, w->o.tokenizer_fp, 16);
    h.n_docs = w->index.n - 1;
    h.n_tokens = w->n_tokens;
    h.min_token_id = w->min_id;
    h.max_token_id = w->max_id;
    h.shard_index = w->shard;
    tks_header_layout(&h);
    if (w->table.n != h.n_chunks)
        return tks_fail(TKS_ERR_ARG, w->tmp_path, w->shard, TKS_NONE,
                        "internal error: %zu chunk hashes for %llu chunks", w->table.n,
                        (unsigned long long)h.n_chunks);
    /* zero padding after the tokens, then index, then table (+ index hash) */
    uint64_t end = h.tokens_offset + h.tokens_bytes;
    static const uint8_t zeros[8];
    rc = tks_pwrite_all(w->fd, zeros, h.index_offset - end, end, w->tmp_path);
    if (!rc) rc = tks_pwrite_all(w->fd, w->index.v, h.index_bytes, h.index_offset, w->tmp_path);
    if (!rc) rc = u64_push(&w->table, XXH3_64bits(w->index.v, h.index_bytes));
    if (!rc) rc = tks_pwrite_all(w->fd, w->table.v, h.table_bytes, h.table_offset, w->tmp_path);
    if (!rc && h.prov_bytes) rc = tks_pwrite_all(w->fd, w->prov, h.prov_bytes, h.prov_offset, w->tmp_path);
    if (rc) return rc;
    h.table_xxh3 = XXH3_64bits(w->table.v, h.table_bytes);
    h.prov_xxh3 = h.prov_bytes ? XXH3_64bits(w->prov, h.prov_bytes) : 0;
    uint8_t page[TKS_TOKEN_ALIGN] = {0};
    tks_header_encode(&h, page);
    rc = tks_pwrite_all(w->fd, page, sizeof page, 0, w->tmp_path);
    if (rc) return rc;
    if (fsync(w->fd) != 0)
        return tks_fail(tks_write_errno_code(errno), w->tmp_path, w->shard, TKS_NONE,
                        "cannot fsync %s: %s", w->tmp_path, strerror(errno));
    close(w->fd);
    w->fd = -1;

    if (w->n_shards == w->cap_shards) {
        size_t cap = w->cap_shards ? 2 * w->cap_shards : 16;
        if (tks_resize(&w->shards, cap, sizeof *w->shards))
            return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
        w->cap_shards = cap;
    }
    tks_shard_info *si = &w->shards[w->n_shards];
    memset(si, 0, sizeof *si);
    tks__shard_name(si->file, w->shard);
    char final_path[PATH_MAX];
    rc = tks_path_join(final_path, sizeof final_path, w->dir, si->file);
    if (rc) return rc;
    if (rename(w->tmp_path, final_path) != 0)
        return tks_fail(TKS_ERR_IO, final_path, w->shard, TKS_NONE, "cannot rename %s to %s: %s",
                        w->tmp_path, final_path, strerror(errno));
    rc = tks_fsync_dir(w->dir);
    if (rc) return rc;
    si->index = w->shard;
    si->file_bytes = h.file_size;
    si->n_docs = h.n_docs;
    si->n_tokens = h.n_tokens;
    si->min_token_id = h.min_token_id;
    si->max_token_id = h.max_token_id;
    si->header_xxh3 = h.header_xxh3;
    si->version = h.version;
    w->n_shards++;
    w->shard++;
    return 0;
}

/* Room for the open shard's next provenance record: 0 or TKS_ERR_NOMEM. */
static int prov_reserve(tks_writer *w) {
    size_t used = (w->fd < 0 ? 0 : w->index.n - 1) * TKS_PROV_RECORD_BYTES;
    if (used + TKS_PROV_RECORD_BYTES <= w->prov_cap) return 0;
    size_t cap = w->prov_cap ? 2 * w->prov_cap : 1024 * TKS_PROV_RECORD_BYTES;
    uint8_t *p = realloc(w->prov, cap);
    if (!p) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (shard provenance)");
    w->prov = p;
    w->prov_cap = cap;
    return 0;
}

int tks_writer_add(tks_writer *w, const uint32_t *ids, size_t n, uint64_t doc_ordinal,
                   int *published) {
    return tks_writer_add_prov(w, ids, n, doc_ordinal, NULL, published);
}

int tks_writer_add_prov(tks_writer *w, const uint32_t *ids, size_t n, uint64_t doc_ordinal,
                        const tks_doc_prov *prov, int *published) {
    if (published) *published = 0;
    if ((prov != NULL) != w->o.provenance)
        return tks_fail(TKS_ERR_ARG, w->dir, w->shard, TKS_NONE,
                        "internal error: document %llu %s provenance, the writer was made %s it",
                        (unsigned long long)doc_ordinal, prov ? "comes with" : "lacks",
                        prov ? "without" : "with");
    if (n == 0)
        return tks_fail(TKS_ERR_ARG, w->dir, w->shard, TKS_NONE,
                        "document %llu is empty: documents must hold at least one token",
                        (unsigned long long)doc_ordinal);
    /* the range first (a loop without an exit, which compilers vectorize),
     * then the first bad id only when there is one */
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = ids[i] < lo ? ids[i] : lo;
        hi = ids[i] > hi ? ids[i] : hi;
    }
    for (size_t i = 0; hi >= w->o.vocab_size && i < n; i++) {
        if (ids[i] >= w->o.vocab_size) {
            tks_fail(TKS_ERR_TOKEN_RANGE, w->dir, w->shard, i,
                     "document %llu, position %zu: token id %u is not below vocab_size %u; "
                     "nothing of this document was written (the tokenizer and vocab_size "
                     "disagree: check --tokenizer)",
                     (unsigned long long)doc_ordinal, i, ids[i], w->o.vocab_size);
            tks_error_set_doc(doc_ordinal, TKS_NONE);
            return TKS_ERR_TOKEN_RANGE;
        }
    }
    int rc = 0;
    if (w->fd < 0 && (rc = open_shard(w))) return rc;
    if (prov && (rc = prov_reserve(w))) return rc;
    if (w->token_bytes == 4) {
        rc = put_bytes(w, (const uint8_t *)ids, n * 4);
    } else {
        uint16_t tmp[4096];
        for (size_t i = 0; i < n && !rc; i += 4096) {
            size_t m = n - i < 4096 ? n - i : 4096;
            for (size_t j = 0; j < m; j++) tmp[j] = (uint16_t)ids[i + j];
            rc = put_bytes(w, (const uint8_t *)tmp, m * 2);
        }
    }
    if (rc) return rc;
    w->n_tokens += n;
    w->min_id = lo < w->min_id ? lo : w->min_id;
    w->max_id = hi > w->max_id ? hi : w->max_id;
    if (prov) tks_prov_encode(prov, w->prov + (w->index.n - 1) * TKS_PROV_RECORD_BYTES);
    if ((rc = u64_push(&w->index, w->n_tokens))) return rc;
    if (w->n_tokens >= w->o.shard_tokens) {
        if ((rc = publish(w))) return rc;
        if (published) *published = 1;
    }
    return 0;
}

int tks_writer_flush(tks_writer *w) {
    if (w->fd < 0) return 0;
    return publish(w);
}

const tks_shard_info *tks_writer_shards(const tks_writer *w, size_t *n) {
    *n = w->n_shards;
    return w->shards;
}

void tks_writer_free(tks_writer *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp_path);
    }
    free(w->index.v);
    free(w->table.v);
    free(w->prov);
    if (w->chunk) XXH3_freeState(w->chunk);
    free(w->wbuf);
    free(w->shards);
    free(w);
}
