/* format.c - shard header encoding, decoding and canonical layout (docs/FORMAT.md). */
#include <string.h>
#include <xxhash.h>

#include "dataset/dataset.h"
#include "dataset/internal.h"

/* Byte offsets of header fields (docs/FORMAT.md, "Header"). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_SIZE = 12, H_TOKEN_BYTES = 16, H_VOCAB = 20,
    H_BOS = 24, H_EOS = 28, H_PAD = 32, H_CHUNK = 36, H_FP = 40, H_NDOCS = 56,
    H_NTOKENS = 64, H_MIN = 72, H_MAX = 76, H_TOK_OFF = 80, H_TOK_BYTES = 88,
    H_IDX_OFF = 96, H_IDX_BYTES = 104, H_TAB_OFF = 112, H_TAB_BYTES = 120,
    H_NCHUNKS = 128, H_FILE_SIZE = 136, H_SHARD = 144, H_FLAGS = 148, H_TAB_XXH = 152,
    H_PROV_OFF = 160, H_PROV_BYTES = 168, H_PROV_XXH = 176, /* version 2; reserved in version 1 */
    H_RESERVED = 184, H_CHECKSUM = 248
};

/* A provenance record's fields (docs/FORMAT.md, "Provenance section"). */
enum { P_FILE = 0, P_ENTRY = 4, P_OFFSET = 8, P_LENGTH = 16, P_TEXT = 20 };

void tks_prov_encode(const tks_doc_prov *p, uint8_t out[TKS_PROV_RECORD_BYTES]) {
    tks_put_le32(out + P_FILE, p->file);
    tks_put_le32(out + P_ENTRY, p->entry);
    tks_put_le64(out + P_OFFSET, p->offset);
    tks_put_le32(out + P_LENGTH, p->length);
    tks_put_le32(out + P_TEXT, p->text_xxh);
}

void tks_prov_decode(const uint8_t in[TKS_PROV_RECORD_BYTES], tks_doc_prov *p) {
    p->file = tks_le32(in + P_FILE);
    p->entry = tks_le32(in + P_ENTRY);
    p->offset = tks_le64(in + P_OFFSET);
    p->length = tks_le32(in + P_LENGTH);
    p->text_xxh = tks_le32(in + P_TEXT);
}



void tks_header_layout(tks_shard_header *h) {
    if (h->version != TKS_FORMAT_V2) h->version = TKS_FORMAT_V1;
    h->header_size = TKS_HEADER_SIZE;
    h->tokens_offset = TKS_TOKEN_ALIGN;
    h->tokens_bytes = h->n_tokens * h->token_bytes;
    h->index_offset = (h->tokens_offset + h->tokens_bytes + 7) & ~(uint64_t)7;
    h->index_bytes = (h->n_docs + 1) * 8;
    h->table_offset = h->index_offset + h->index_bytes;
    h->n_chunks = h->chunk_bytes ? (h->tokens_bytes + h->chunk_bytes - 1) / h->chunk_bytes : 0;
    h->table_bytes = (h->n_chunks + 1) * 8;
    h->file_size = h->table_offset + h->table_bytes;
    h->prov_offset = h->prov_bytes = 0;
    if (h->version == TKS_FORMAT_V2) { /* the provenance section closes the file */
        h->prov_offset = h->file_size;
        h->prov_bytes = h->n_docs * TKS_PROV_RECORD_BYTES;
        h->file_size += h->prov_bytes;
    }
}

void tks_header_encode(tks_shard_header *h, uint8_t out[TKS_HEADER_SIZE]) {
    memset(out, 0, TKS_HEADER_SIZE);
    memcpy(out + H_MAGIC, TKS_MAGIC, 8);
    tks_put_le32(out + H_VERSION, h->version);
    tks_put_le32(out + H_HEADER_SIZE, h->header_size);
    tks_put_le32(out + H_TOKEN_BYTES, h->token_bytes);
    tks_put_le32(out + H_VOCAB, h->vocab_size);
    tks_put_le32(out + H_BOS, h->bos_id);
    tks_put_le32(out + H_EOS, h->eos_id);
    tks_put_le32(out + H_PAD, h->pad_id);
    tks_put_le32(out + H_CHUNK, h->chunk_bytes);
    memcpy(out + H_FP, h->tokenizer_fp, 16);
    tks_put_le64(out + H_NDOCS, h->n_docs);
    tks_put_le64(out + H_NTOKENS, h->n_tokens);
    tks_put_le32(out + H_MIN, h->min_token_id);
    tks_put_le32(out + H_MAX, h->max_token_id);
    tks_put_le64(out + H_TOK_OFF, h->tokens_offset);
    tks_put_le64(out + H_TOK_BYTES, h->tokens_bytes);
    tks_put_le64(out + H_IDX_OFF, h->index_offset);
    tks_put_le64(out + H_IDX_BYTES, h->index_bytes);
    tks_put_le64(out + H_TAB_OFF, h->table_offset);
    tks_put_le64(out + H_TAB_BYTES, h->table_bytes);
    tks_put_le64(out + H_NCHUNKS, h->n_chunks);
    tks_put_le64(out + H_FILE_SIZE, h->file_size);
    tks_put_le32(out + H_SHARD, h->shard_index);
    tks_put_le32(out + H_FLAGS, h->flags);
    tks_put_le64(out + H_TAB_XXH, h->table_xxh3);
    if (h->version == TKS_FORMAT_V2) { /* zero in version 1: its reserved bytes */
        tks_put_le64(out + H_PROV_OFF, h->prov_offset);
        tks_put_le64(out + H_PROV_BYTES, h->prov_bytes);
        tks_put_le64(out + H_PROV_XXH, h->prov_xxh3);
    }
    h->header_xxh3 = XXH3_64bits(out, H_CHECKSUM);
    tks_put_le64(out + H_CHECKSUM, h->header_xxh3);
}

static int bad(const char *name, const char *what, uint64_t a, uint64_t b) {
    return tks_fail(TKS_ERR_HEADER, name, TKS_NONE, TKS_NONE,
                    "%s: corrupt header: %s (%llu, expected %llu); the shard cannot be trusted: "
                    "rebuild it with `tokshard build`",
                    name, what, (unsigned long long)a, (unsigned long long)b);
}

int tks_header_decode(const uint8_t *buf, size_t n, const char *name, tks_shard_header *h) {
    if (!name) name = "<shard>";
    /* another project's files, named by what their first bytes are
     * (docs/INTEROP.md: megatron-core's MMIDIDX index, llm.c's int32 magic) */
    uint32_t m = n >= 4 ? tks_le32(buf) : 0;
    const char *other = n >= 9 && !memcmp(buf, "MMIDIDX\0\0", 9)
                            ? "a Megatron index (.idx); audit it with `tokshard audit --format megatron PREFIX`"
                        : m == 20240520u || m == 20240801u
                            ? "an llm.c token file; audit it with `tokshard audit --format llmc FILE`"
                            : NULL;
    if (other) return tks_fail(TKS_ERR_MAGIC, name, TKS_NONE, 0, "%s is %s, not a tokshard shard", name, other);
    if (n < TKS_HEADER_SIZE)
        return tks_fail(TKS_ERR_TRUNCATED, name, TKS_NONE, n,
                        "%s: file is %zu bytes, shorter than the %u-byte header: truncated or not a "
                        "shard",
                        name, n, TKS_HEADER_SIZE);
    if (memcmp(buf, TKS_MAGIC, 8) != 0)
        return tks_fail(TKS_ERR_MAGIC, name, TKS_NONE, 0,
                        "%s: not a tokshard shard (bad magic at byte 0)", name);
    memset(h, 0, sizeof *h);
    h->version = tks_le32(buf + H_VERSION);
    if (h->version != TKS_FORMAT_V1 && h->version != TKS_FORMAT_V2)
        return tks_fail(TKS_ERR_VERSION, name, TKS_NONE, H_VERSION,
                        "%s: format version %u, this tokshard reads versions %u and %u: use a matching "
                        "tokshard or rebuild the dataset",
                        name, h->version, TKS_FORMAT_V1, TKS_FORMAT_V2);
    h->header_size = tks_le32(buf + H_HEADER_SIZE);
    h->header_xxh3 = tks_le64(buf + H_CHECKSUM);
    uint64_t want = XXH3_64bits(buf, H_CHECKSUM);
    if (want != h->header_xxh3)
        return tks_fail(TKS_ERR_HEADER, name, TKS_NONE, 0,
                        "%s: header checksum mismatch (stored %016llx, computed %016llx): the "
                        "header is corrupt; rebuild the shard",
                        name, (unsigned long long)h->header_xxh3, (unsigned long long)want);
    h->token_bytes = tks_le32(buf + H_TOKEN_BYTES);
    h->vocab_size = tks_le32(buf + H_VOCAB);
    h->bos_id = tks_le32(buf + H_BOS);
    h->eos_id = tks_le32(buf + H_EOS);
    h->pad_id = tks_le32(buf + H_PAD);
    h->chunk_bytes = tks_le32(buf + H_CHUNK);
    memcpy(h->tokenizer_fp, buf + H_FP, 16);
    h->n_docs = tks_le64(buf + H_NDOCS);
    h->n_tokens = tks_le64(buf + H_NTOKENS);
    h->min_token_id = tks_le32(buf + H_MIN);
    h->max_token_id = tks_le32(buf + H_MAX);
    h->tokens_offset = tks_le64(buf + H_TOK_OFF);
    h->tokens_bytes = tks_le64(buf + H_TOK_BYTES);
    h->index_offset = tks_le64(buf + H_IDX_OFF);
    h->index_bytes = tks_le64(buf + H_IDX_BYTES);
    h->table_offset = tks_le64(buf + H_TAB_OFF);
    h->table_bytes = tks_le64(buf + H_TAB_BYTES);
    h->n_chunks = tks_le64(buf + H_NCHUNKS);
    h->file_size = tks_le64(buf + H_FILE_SIZE);
    h->shard_index = tks_le32(buf + H_SHARD);
    h->flags = tks_le32(buf + H_FLAGS);
    h->table_xxh3 = tks_le64(buf + H_TAB_XXH);
    int v2 = h->version == TKS_FORMAT_V2;
    if (v2) {
        h->prov_offset = tks_le64(buf + H_PROV_OFF);
        h->prov_bytes = tks_le64(buf + H_PROV_BYTES);
        h->prov_xxh3 = tks_le64(buf + H_PROV_XXH);
    }

    /* The checksum matched, so these are the writer's values; still refuse
     * anything a correct writer cannot produce (a forged or buggy header). */
    if (h->header_size != TKS_HEADER_SIZE) return bad(name, "header_size", h->header_size, TKS_HEADER_SIZE);
    for (int i = v2 ? H_RESERVED : H_PROV_OFF; i < H_CHECKSUM; i++)
        if (buf[i]) return bad(name, "reserved byte not zero", (uint64_t)i, 0);
    if (h->flags) return bad(name, "flags", h->flags, 0);
    if (h->vocab_size == 0) return bad(name, "vocab_size", 0, 1);
    uint32_t tb = h->vocab_size <= TKS_U16_MAX_VOCAB ? 2 : 4;
    if (h->token_bytes != tb) return bad(name, "token_bytes for this vocab_size", h->token_bytes, tb);
    if (h->chunk_bytes < TKS_MIN_CHUNK_BYTES || h->chunk_bytes > TKS_MAX_CHUNK_BYTES ||
        h->chunk_bytes % 4)
        return bad(name, "chunk_bytes", h->chunk_bytes, TKS_DEFAULT_CHUNK_BYTES);
    if (h->n_docs == 0) return bad(name, "n_docs", 0, 1);
    if (h->n_tokens < h->n_docs) return bad(name, "n_tokens below n_docs", h->n_tokens, h->n_docs);
    /* Bound the counts so the layout arithmetic cannot overflow (2^56 bytes). */
    if (h->n_tokens > (UINT64_C(1) << 54) || h->n_docs > (UINT64_C(1) << 53))
        return bad(name, "n_tokens/n_docs implausibly large", h->n_tokens, 0);
    if (h->min_token_id > h->max_token_id) return bad(name, "min_token_id > max_token_id", h->min_token_id, h->max_token_id);
    if (h->max_token_id >= h->vocab_size)
        return tks_fail(TKS_ERR_TOKEN_RANGE, name, TKS_NONE, TKS_NONE,
                        "%s: max token id %u is not below vocab_size %u: the shard holds ids "
                        "outside its vocabulary; rebuild it with the right tokenizer",
                        name, h->max_token_id, h->vocab_size);
    tks_shard_header c = *h;
    tks_header_layout(&c);
    const struct { const char *what; uint64_t got, want; } f[] = {
        {"tokens_offset", h->tokens_offset, c.tokens_offset},
        {"tokens_bytes", h->tokens_bytes, c.tokens_bytes},
        {"index_offset", h->index_offset, c.index_offset},
        {"index_bytes", h->index_bytes, c.index_bytes},
        {"table_offset", h->table_offset, c.table_offset},
        {"table_bytes", h->table_bytes, c.table_bytes},
        {"n_chunks", h->n_chunks, c.n_chunks},
        {"file_size", h->file_size, c.file_size},
        {"prov_offset", h->prov_offset, c.prov_offset},
        {"prov_bytes", h->prov_bytes, c.prov_bytes},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].got != f[i].want) return bad(name, f[i].what, f[i].got, f[i].want);
    return 0;
}
