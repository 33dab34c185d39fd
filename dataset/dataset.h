/*
 * dataset.h - the whole public API of tokshard's dataset layer: the shard
 * format (docs/FORMAT.md, versions 1 and 2), the shard writer, the zero-copy
 * shard reader, datasets (a manifest plus shards) and the audit.
 *
 * Conventions: every function returns 0 or a negative TKS_ERR_* code (tks.h)
 * and records the context (file, shard, offset, document) of a failure in
 * tks_last_error(). Nothing here prints or exits. Token ids are uint32_t in
 * memory whatever the on-disk dtype; "vocab_size" is always an exclusive upper
 * bound for ids.
 */
#ifndef TKS_DATASET_H
#define TKS_DATASET_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "common/tks_tokinfo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Format constants (docs/FORMAT.md)
 * ------------------------------------------------------------------------- */
#define TKS_MAGIC "TKSHARD\x1a"          /* 8 bytes at offset 0 */
#define TKS_FORMAT_V1 1u                 /* a shard without provenance (an import, older builds) */
#define TKS_FORMAT_V2 2u                 /* a shard with its documents' provenance section */
#define TKS_FORMAT_VERSION TKS_FORMAT_V2 /* the newest version this library reads and writes */
#define TKS_PROV_RECORD_BYTES 24u        /* one document's provenance record (tks_doc_prov) */
#define TKS_HEADER_SIZE 256u             /* bytes; the header checksum covers [0, 248) */
#define TKS_TOKEN_ALIGN 4096u            /* token section offset alignment (mmap page) */
#define TKS_DEFAULT_CHUNK_BYTES (1u << 20)
#define TKS_MIN_CHUNK_BYTES 64u          /* chunk_bytes: multiple of 4 in [64, 2^30] */
#define TKS_MAX_CHUNK_BYTES (1u << 30)
#define TKS_U16_MAX_VOCAB 65536u         /* vocab_size <= this: uint16 tokens, else uint32 */
#define TKS_MANIFEST_NAME "manifest.json"
#define TKS_MANIFEST_FORMAT "tokshard-dataset"

/* Decoded shard header. Field meanings and byte offsets: docs/FORMAT.md. */
typedef struct tks_shard_header {
    uint32_t version;        /* TKS_FORMAT_V1, or TKS_FORMAT_V2 (a provenance section) */
    uint32_t header_size;    /* TKS_HEADER_SIZE */
    uint32_t token_bytes;    /* 2 (uint16) or 4 (uint32); 2 iff vocab_size <= 65536 */
    uint32_t vocab_size;     /* exclusive upper bound of every token id, >= 1 */
    uint32_t bos_id, eos_id, pad_id; /* TKS_NO_ID when absent */
    uint32_t chunk_bytes;    /* bytes of token section per checksum chunk */
    uint8_t tokenizer_fp[16];/* XXH3-128 (canonical, big-endian) of the tokenizer model file */
    uint64_t n_docs;         /* documents, >= 1 */
    uint64_t n_tokens;       /* tokens, >= n_docs (documents are never empty) */
    uint32_t min_token_id;   /* smallest id present */
    uint32_t max_token_id;   /* largest id present, < vocab_size */
    uint64_t tokens_offset;  /* = TKS_TOKEN_ALIGN */
    uint64_t tokens_bytes;   /* = n_tokens * token_bytes */
    uint64_t index_offset;   /* = round_up(tokens_offset + tokens_bytes, 8) */
    uint64_t index_bytes;    /* = (n_docs + 1) * 8 */
    uint64_t table_offset;   /* = index_offset + index_bytes */
    uint64_t table_bytes;    /* = (n_chunks + 1) * 8 */
    uint64_t n_chunks;       /* = ceil(tokens_bytes / chunk_bytes) */
    uint64_t file_size;      /* = table_offset + table_bytes (+ prov_bytes in version 2) */
    uint32_t shard_index;    /* position of this shard in its dataset */
    uint32_t flags;          /* 0 */
    uint64_t table_xxh3;     /* XXH3-64 of the checksum table bytes */
    uint64_t prov_offset;    /* version 2: = table_offset + table_bytes; 0 in version 1 */
    uint64_t prov_bytes;     /* version 2: = n_docs * TKS_PROV_RECORD_BYTES; 0 in version 1 */
    uint64_t prov_xxh3;      /* version 2: XXH3-64 of the provenance section; 0 in version 1 */
    uint64_t header_xxh3;    /* XXH3-64 of header bytes [0, 248) */
} tks_shard_header;

/* Serializes h into 256 bytes (little-endian), computing header_xxh3 (written
 * back into h). Reserved bytes are zero. */
void tks_header_encode(tks_shard_header *h, uint8_t out[TKS_HEADER_SIZE]);

/*
 * Parses and validates a header: magic, version, header size, checksum, dtype
 * against vocab, canonical section layout, id range. `name` is used in error
 * messages (may be NULL). `n` is the number of bytes available at `buf`.
 * Errors: TKS_ERR_TRUNCATED (n < 256), TKS_ERR_MAGIC, TKS_ERR_VERSION,
 * TKS_ERR_HEADER (checksum or inconsistent fields).
 */
int tks_header_decode(const uint8_t *buf, size_t n, const char *name, tks_shard_header *h);

/* Canonical layout: fills tokens_offset..file_size (and, for version 2,
 * prov_offset and prov_bytes) from version (0 is taken as TKS_FORMAT_V1),
 * token_bytes, n_docs, n_tokens and chunk_bytes. Used by the writer and by
 * validation. */
void tks_header_layout(tks_shard_header *h);

/*
 * Where a document came from (docs/FORMAT.md, "Provenance section"): one
 * record per document of a version 2 shard, written by `tokshard build`,
 * read back by `tokshard audit --against-source`. On disk: 24 bytes,
 * little-endian, in this order.
 */
typedef struct tks_doc_prov {
    uint32_t file;     /* the input: index into the manifest's provenance.inputs */
    uint32_t entry;    /* an archive's regular member, 1-based; a Parquet file's row group,
                        * 0-based; 0 for any other file */
    uint64_t offset;   /* text and JSON Lines: bytes of the decompressed entry before the
                        * document's first byte; Parquet: rows of its row group before it */
    uint32_t length;   /* bytes the document spans in its entry (a JSON Lines record's line,
                        * text before the UTF-8 policy; a Parquet value's), UINT32_MAX when
                        * 4 GiB or more */
    uint32_t text_xxh; /* the low 32 bits of the XXH3-64 (seed 0) of the text the build
                        * encoded (after decoding and the UTF-8 policy) */
} tks_doc_prov;

/* The 24 bytes of a record (out) and back. */
void tks_prov_encode(const tks_doc_prov *p, uint8_t out[TKS_PROV_RECORD_BYTES]);
void tks_prov_decode(const uint8_t in[TKS_PROV_RECORD_BYTES], tks_doc_prov *p);

/* ---------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------- */
typedef struct tks_writer tks_writer;

typedef struct tks_writer_opts {
    const char *dir;          /* output directory; must exist */
    uint32_t vocab_size;      /* ids must be < vocab_size */
    uint32_t bos_id, eos_id, pad_id; /* TKS_NO_ID when absent */
    uint8_t tokenizer_fp[16];
    uint64_t shard_tokens;    /* a shard is closed once it holds >= this many tokens; >= 1 */
    uint32_t chunk_bytes;     /* 0 = TKS_DEFAULT_CHUNK_BYTES */
    uint32_t first_shard;     /* index of the first shard this writer writes (resume) */
    int provenance;           /* 1: every document comes with its tks_doc_prov
                               * (tks_writer_add_prov) and the shards are version 2;
                               * 0: version 1 shards, byte for byte as before it */
} tks_writer_opts;

/* What the writer knows about a shard it published. */
typedef struct tks_shard_info {
    char file[32];            /* "shard-00000.tks" (relative to the dataset dir) */
    uint32_t index;
    uint64_t file_bytes, n_docs, n_tokens;
    uint32_t min_token_id, max_token_id;
    uint64_t header_xxh3;
    uint32_t version;         /* the shard's format version: TKS_FORMAT_V1 or V2 */
} tks_shard_info;

/* Creates a writer. Errors: TKS_ERR_ARG (bad options), TKS_ERR_NOMEM. The
 * writer owns nothing on disk until the first document arrives. */
int tks_writer_create(const tks_writer_opts *opts, tks_writer **out);

/*
 * Appends one document of n >= 1 ids. Shards are written to
 * "shard-NNNNN.tks.tmp" and published (fsync, rename) when they reach
 * shard_tokens; *published (may be NULL) is set to 1 when this call published
 * a shard, else 0. `doc_ordinal` identifies the document in error messages.
 * Errors: TKS_ERR_TOKEN_RANGE (an id >= vocab_size: names the document and
 * the position in it; nothing of the document is written), TKS_ERR_ARG (n == 0),
 * TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_writer_add(tks_writer *w, const uint32_t *ids, size_t n, uint64_t doc_ordinal,
                   int *published);

/* tks_writer_add with the document's provenance (copied), for a writer
 * created with `provenance` set (TKS_ERR_ARG otherwise, and when a writer
 * with provenance is given prov NULL or tks_writer_add). Costs 24 bytes of
 * memory per document of the open shard until it is published. Errors: as
 * tks_writer_add. */
int tks_writer_add_prov(tks_writer *w, const uint32_t *ids, size_t n, uint64_t doc_ordinal,
                        const tks_doc_prov *prov, int *published);

/* Publishes the current shard if it holds any document. Errors as above. */
int tks_writer_flush(tks_writer *w);

/* The shards this writer has published, in order. Owned by the writer. */
const tks_shard_info *tks_writer_shards(const tks_writer *w, size_t *n);

/* Frees the writer; an unpublished shard's temporary file is removed.
 * Accepts NULL. */
void tks_writer_free(tks_writer *w);

/* ---------------------------------------------------------------------------
 * Reader: one shard, memory-mapped, zero copy
 * ------------------------------------------------------------------------- */
typedef struct tks_shard tks_shard;

/*
 * Opens and validates a shard in O(header + index + table) time: header (see
 * tks_header_decode), real file size, zero padding, table checksum, index
 * checksum and index monotonicity (index[0] = 0, strictly increasing,
 * index[n_docs] = n_tokens). Token chunks are not hashed here
 * (tks_shard_verify_chunks does that). Never reads outside the file.
 * Errors: TKS_ERR_IO, TKS_ERR_TRUNCATED, TKS_ERR_MAGIC, TKS_ERR_VERSION,
 * TKS_ERR_HEADER, TKS_ERR_BOUNDS, TKS_ERR_PADDING, TKS_ERR_CHECKSUM,
 * TKS_ERR_INDEX, TKS_ERR_NOMEM.
 */
int tks_shard_open(const char *path, tks_shard **out);

/* As tks_shard_open over bytes in memory; no copy is made: `data` must
 * outlive the shard. `name` is used in messages (may be NULL). */
int tks_shard_open_mem(const void *data, size_t size, const char *name, tks_shard **out);

/* How a shard's mapped bytes will be read, passed to the kernel as madvise()
 * advice (read-ahead and page reclaim). An opened shard has no advice
 * (TKS_ACCESS_NORMAL): a reader that scans whole shards (cat, inspect)
 * advises SEQUENTIAL, the training sampler, which reads windows in permuted
 * order, RANDOM. Advice only: it never changes what is read, and a shard in
 * memory (tks_shard_open_mem) or a refused madvise is left as it is. */
typedef enum { TKS_ACCESS_NORMAL = 0, TKS_ACCESS_SEQUENTIAL, TKS_ACCESS_RANDOM } tks_access;
void tks_shard_advise(const tks_shard *s, tks_access how);

/* Unmaps and frees. Accepts NULL. */
void tks_shard_close(tks_shard *s);

const tks_shard_header *tks_shard_hdr(const tks_shard *s);
const char *tks_shard_path(const tks_shard *s);
/* Raw token section: n_tokens little-endian values of token_bytes each. */
const void *tks_shard_tokens(const tks_shard *s);
/* Document index: n_docs + 1 cumulative token offsets. */
const uint64_t *tks_shard_doc_index(const tks_shard *s);

/* Token i (i < n_tokens), widened to uint32. No range check beyond i. */
static inline uint32_t tks_shard_token_at(const void *tokens, uint32_t token_bytes, uint64_t i) {
    return token_bytes == 2 ? ((const uint16_t *)tokens)[i] : ((const uint32_t *)tokens)[i];
}

/*
 * Copies tokens [offset, offset + n) into out (widened to uint32) and checks
 * each against `limit` (pass the model's vocab_size; 0 means the shard's
 * vocab_size). Errors: TKS_ERR_BOUNDS (range outside the shard),
 * TKS_ERR_TOKEN_RANGE (names the shard and the token offset of the first bad id).
 */
int tks_shard_read(const tks_shard *s, uint64_t offset, uint64_t n, uint32_t limit, uint32_t *out);

/* Hashes chunk `c` (< n_chunks) and compares with the table.
 * Errors: TKS_ERR_CHECKSUM (names chunk and its byte offset). */
int tks_shard_verify_chunk(const tks_shard *s, uint64_t c);

/* 1 when the shard has a provenance section (version 2), else 0. */
int tks_shard_has_prov(const tks_shard *s);

/* Document d's provenance record into *out. Not hashed here (opening checks
 * the section's place and size; tks_shard_verify_prov its bytes).
 * Errors: TKS_ERR_ARG (d >= n_docs, or a version 1 shard: no provenance,
 * named). */
int tks_shard_prov(const tks_shard *s, uint64_t d, tks_doc_prov *out);

/* Hashes the provenance section and compares with the header's prov_xxh3.
 * Errors: TKS_ERR_CHECKSUM (names the section's offset), TKS_ERR_ARG (a
 * version 1 shard). O(n_docs). */
int tks_shard_verify_prov(const tks_shard *s);

/* ---------------------------------------------------------------------------
 * Dataset: manifest.json + shards + tokenizer copy
 * ------------------------------------------------------------------------- */
typedef struct tks_dataset tks_dataset;

/* A byte-level BPE tokenizer's BOS, EOS and pad beside its tokenizer.json (transformers' file) */
#define TKS_TOKENIZER_CONFIG_NAME "tokenizer_config.json"


/*
 * Writes manifest.json atomically (last step of a build). `shards` are the
 * published shards in order; `provenance_json` is a JSON object text embedded
 * as "provenance" (inputs, options, tool version), may be NULL.
 * Errors: TKS_ERR_ARG (provenance not a JSON object), TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_manifest_write(const char *dir, const tks_tokenizer_info *tok, const tks_shard_info *shards,
                       size_t n_shards, uint32_t token_bytes, uint32_t chunk_bytes,
                       const char *provenance_json);
struct json_t;
/* As tks_manifest_write with the provenance as a JSON object (borrowed, may
 * be NULL): no text to parse again (a build of 100,000 files has a
 * provenance of 10 MB). */
int tks_manifest_write_json(const char *dir, const tks_tokenizer_info *tok, const tks_shard_info *shards,
                            size_t n_shards, uint32_t token_bytes, uint32_t chunk_bytes,
                            struct json_t *provenance);

/*
 * Opens a dataset: parses the manifest, opens every shard (tks_shard_open)
 * and checks each shard's header against the manifest (size, counts, max id,
 * header checksum, vocab, fingerprint, index). O(headers + indexes).
 * Errors: TKS_ERR_MANIFEST (missing, unparsable or inconsistent: a missing
 * manifest says the build is unfinished and to re-run with --resume), plus
 * every tks_shard_open error.
 */
int tks_dataset_open(const char *dir, tks_dataset **out);
void tks_dataset_close(tks_dataset *ds);

const char *tks_dataset_dir(const tks_dataset *ds);
const tks_tokenizer_info *tks_dataset_tokenizer(const tks_dataset *ds);
size_t tks_dataset_n_shards(const tks_dataset *ds);
const tks_shard *tks_dataset_shard(const tks_dataset *ds, size_t i);
uint64_t tks_dataset_n_tokens(const tks_dataset *ds);
uint64_t tks_dataset_n_docs(const tks_dataset *ds);
uint32_t tks_dataset_max_token_id(const tks_dataset *ds);
/* XXH3-64 of the manifest file's bytes (identifies the dataset in checkpoints). */
uint64_t tks_dataset_manifest_xxh3(const tks_dataset *ds);
/* Full path of the tokenizer copy in the dataset dir (owned by ds). */
const char *tks_dataset_tokenizer_path(const tks_dataset *ds);
/* The manifest's format_version: TKS_FORMAT_V1 (shards without provenance)
 * or TKS_FORMAT_V2 (every shard has its provenance section). */
uint32_t tks_dataset_format_version(const tks_dataset *ds);
/* The manifest's "provenance" object (inputs, options, stats) into *out, a
 * new jansson reference the caller releases (json_decref), or NULL when the
 * manifest has none (an import). manifest.json is read again and must be
 * the bytes the dataset was opened with. Errors: TKS_ERR_MANIFEST (it
 * changed since, or does not parse), TKS_ERR_IO, TKS_ERR_NOMEM. */
struct json_t;
int tks_dataset_provenance(const tks_dataset *ds, struct json_t **out);
/* tks_shard_advise on every shard of the dataset. */
void tks_dataset_advise(const tks_dataset *ds, tks_access how);

/* ---------------------------------------------------------------------------
 * OUT.partial: a dataset being written, and the state that resumes it
 *
 * `tokshard build` and `tokshard import` write a dataset OUT in OUT.partial/:
 * each shard is published there (fsync, rename), then a state file records
 * every published shard and the first document of the next one, so that a
 * run stopped at any point continues with --resume. OUT.partial becomes OUT
 * by one rename once manifest.json is written (tks_partial_publish). The two
 * kinds differ in the state file only:
 *   build:  build-state.json  {"build_id", "shards": [records, each with its
 *           "end_ordinal"], "next_ordinal", "empty_after_tokenize",
 *           "inputs_xxh3_128"}
 *   import: import-state.json {"import_id", "shards": [{"file",
 *           "header_xxh3"}], "next_doc"}
 * Messages name the command to run again ("remove OUT.partial and build
 * again", "... import again").
 * ------------------------------------------------------------------------- */
typedef enum { TKS_PARTIAL_BUILD = 0, TKS_PARTIAL_IMPORT } tks_partial_kind;

/* What survives a crash: the published shards and where the next one starts. */
typedef struct tks_partial_state {
    char id[33];                   /* the run's id (hex); a resume must present the same */
    tks_shard_info *shards;        /* published shards, in order (owned) */
    uint64_t *ends;                /* per shard: the document ordinal after its last document,
                                    * empty ones included; TKS_NONE when not recorded */
    size_t n_shards, cap;
    uint64_t next;                 /* first document not in a published shard */
    uint64_t empty_after_tokenize; /* build: documents before `next` that gave no token */
    char (*was)[33];               /* build, loaded: XXH3-128 (hex) of the inputs the
                                    * interrupted run had read, in input order (owned) */
    size_t n_was;
} tks_partial_state;

/* The state file's name in OUT.partial ("build-state.json", "import-state.json"). */
const char *tks_partial_state_name(tks_partial_kind kind);

/* out = out_dir without trailing '/', partial = out + ".partial", both in
 * buffers of cap bytes. Errors: TKS_ERR_ARG (a path does not fit). */
int tks_partial_paths(tks_partial_kind kind, const char *out_dir, char *out, char *partial,
                      size_t cap);

/* TKS_ERR_EXISTS when the dataset `out` already exists, else 0. */
int tks_partial_check_out(const char *out);

/* Creates the directory `partial`. Errors: TKS_ERR_IO, TKS_ERR_NOSPACE. */
int tks_partial_create(const char *partial);

/* Makes OUT.partial/`name` a copy of the tokenizer file `src` unless it is
 * there already (src NULL: the caller wrote it, tks_tok_save), and checks that the copy hashes (XXH3-128, as
 * tks_file_xxh3_128) to `fp`, the fingerprint of the tokenizer in use.
 * Errors: TKS_ERR_RESUME (a copy of another tokenizer), TKS_ERR_IO,
 * TKS_ERR_NOSPACE. */
int tks_partial_tokenizer(tks_partial_kind kind, const char *partial, const char *src,
                          const char *name, const uint8_t fp[16]);

/* Writes the state atomically. `inputs` (build only; may be NULL when
 * n_inputs is 0): the XXH3-128 (hex) of the inputs read so far, recorded for
 * a resume to compare. Errors: TKS_ERR_NOMEM, TKS_ERR_IO, TKS_ERR_NOSPACE. */
int tks_partial_state_save(tks_partial_kind kind, const char *partial, const tks_partial_state *st,
                           const char (*inputs)[33], size_t n_inputs);

/* Loads the state of an interrupted run into *st (zeroed by the caller; its
 * id is not read) and checks each recorded shard on disk: it must open
 * (tks_shard_open) with the recorded header checksum and its index; its
 * record is taken from its header. Errors: TKS_ERR_RESUME (the state missing,
 * malformed, of another run than want_id, or a shard missing or not the
 * recorded one; the message says what to remove), TKS_ERR_NOMEM. On error *st
 * holds what was loaded: tks_partial_state_free it. */
int tks_partial_state_load(tks_partial_kind kind, const char *partial, const char *want_id,
                           tks_partial_state *st);

/* Appends a published shard and the ordinal after its last document (end,
 * or TKS_NONE when unknown). Errors: TKS_ERR_NOMEM. */
int tks_partial_state_push(tks_partial_state *st, const tks_shard_info *s, uint64_t end);

/* Frees what the state owns (not st itself). Accepts a zeroed state. */
void tks_partial_state_free(tks_partial_state *st);

/* Removes from `partial` the shard files "shard-NNNNN.tks" numbered keep and
 * above, temporary files ("*.tmp*") and, when `also` is not NULL, the file
 * named `also`. Best effort: what cannot be removed is left. */
void tks_partial_clean(const char *partial, size_t keep, const char *also);

/* 1 when `partial` holds a shard file "shard-NNNNN.tks", else 0. */
int tks_partial_has_shards(const char *partial);

/* The totals of a dataset's shards (n >= 1 for a meaningful id range;
 * min_token_id is UINT32_MAX and max_token_id 0 when n is 0). */
typedef struct tks_shard_totals {
    uint64_t docs, tokens;
    uint32_t min_token_id, max_token_id;
} tks_shard_totals;
void tks_shard_totals_of(const tks_shard_info *shards, size_t n, tks_shard_totals *out);

/* tks_manifest_write into `partial` with the token width the vocabulary
 * needs (2 bytes up to TKS_U16_MAX_VOCAB ids, else 4); chunk_bytes 0 means
 * TKS_DEFAULT_CHUNK_BYTES. Errors: those of tks_manifest_write. */
int tks_partial_write_manifest(const char *partial, const tks_tokenizer_info *tok,
                               const tks_shard_info *shards, size_t n, uint32_t chunk_bytes,
                               const char *provenance_json);

/* Publishes the dataset: renames `partial` to `out`, syncs out's parent
 * directory, then removes the state file from out (a run stopped in
 * between leaves it there, beside the dataset: nothing reads it, and the
 * audit looks only at the manifest and shard files). Until the rename
 * succeeds the state stays in `partial`, which --resume then publishes.
 * Errors: TKS_ERR_EXISTS (`out` appeared since the run started: named,
 * `partial` kept), TKS_ERR_IO. */
int tks_partial_publish(tks_partial_kind kind, const char *partial, const char *out);

/* A shard's record in a state or unit file, as JSON (jansson's json_t, a new
 * reference the caller owns; NULL when out of memory): {"file", "bytes",
 * "n_docs", "n_tokens", "min_token_id", "max_token_id", "header_xxh3"}, and
 * "version": 2 for a version 2 shard (absent: version 1). */
struct json_t;
struct json_t *tks_shard_record(const tks_shard_info *s);

/* Reads record `rec` (as tks_shard_record wrote it) of shard i into *si:
 * 0, or -1 when it lacks its file name (or the name is too long) or its
 * header hash. Sets no error. */
int tks_shard_record_read(const struct json_t *rec, size_t i, tks_shard_info *si);

/* ---------------------------------------------------------------------------
 * Audit: verify everything, report every problem
 * ------------------------------------------------------------------------- */
typedef struct tks_audit_opts {
    uint32_t model_vocab;        /* 0 = not given; else ids must also be < this */
    const char *tokenizer_path;  /* NULL = not given; else its fingerprint must match */
    const uint8_t *tokenizer_fp; /* tokenizer_path's fingerprint (16 bytes) as its loader computes
                                  * it (a tiktoken file's covers its pattern); NULL: the XXH3-128
                                  * of the file, which is the fingerprint of the other kinds */
    int threads;                 /* 0 = OpenMP default */
    size_t max_problems;         /* stop recording after this many (0 = 1000) */
    /* Distributed audit (mpirun): with n_ranks > 1 this process audits only
     * shard range tks_audit_share(rank) and, on rank 0, the dataset-level
     * checks (manifest, stray shards, tokenizer); tks_audit_merge joins the
     * ranks' reports into the report one process makes. 0 = everything. */
    unsigned rank, n_ranks;
} tks_audit_opts;

typedef struct tks_audit_problem {
    int code;                    /* TKS_ERR_* class */
    uint64_t shard;              /* TKS_NONE when not shard-specific */
    uint64_t chunk;              /* TKS_NONE when not chunk-specific */
    uint64_t token_offset;       /* token offset in the shard, or TKS_NONE */
    uint64_t byte_offset;        /* byte offset in the file, or TKS_NONE */
    uint64_t doc;                /* document index in the shard, or TKS_NONE */
    char file[256];
    char message[384];
    uint64_t order;              /* position in a whole audit's report (merging) */
} tks_audit_problem;

typedef struct tks_audit_report {
    size_t n_problems;           /* recorded problems (<= max_problems) */
    size_t n_problems_total;     /* all problems found */
    tks_audit_problem *problems; /* owned by the report */
    uint64_t n_shards, n_chunks, n_docs, n_tokens, bytes_hashed;
    uint32_t vocab_size, min_token_id, max_token_id;
    int manifest_checked;        /* 1 when a dataset dir with manifest was audited */
    int tokenizer_checked;       /* 1 when a tokenizer fingerprint was compared */
    double seconds;              /* wall time of the audit */
    /* the manifest's record of a byte-level build (tks_tokenizer_info's
     * unicode, unassigned, unassigned_docs): documents whose ids a reference
     * on a newer Unicode may not give; "" and 0 when not recorded. A note,
     * not a problem. */
    char unicode[16];
    uint64_t unassigned, unassigned_docs;
} tks_audit_report;

/*
 * Audits a dataset directory or a single shard file. Returns 0 when the audit
 * ran, whatever it found (see report->n_problems_total), or a negative code
 * when it could not run at all (TKS_ERR_IO for a missing path, TKS_ERR_NOMEM).
 * The report is owned by the caller: tks_audit_report_free.
 */
int tks_audit(const char *path, const tks_audit_opts *opts, tks_audit_report **out);
void tks_audit_report_free(tks_audit_report *r);

/* Shards [*first, *end) of n_shards (of the given file sizes, in order) that
 * rank audits out of n_ranks: contiguous ranges of about equal bytes. */
void tks_audit_share(const uint64_t *sizes, size_t n_shards, unsigned rank, unsigned n_ranks,
                     size_t *first, size_t *end);

/* Joins the reports of ranks 0..n-1 of one distributed audit (tks_audit_opts
 * rank/n_ranks) into the report a single process makes: the same problems in
 * the same order (the first max_problems of them, 0 = 1000), totals and id
 * range. The parts are not changed. Errors: TKS_ERR_NOMEM. */
int tks_audit_merge(tks_audit_report *const *parts, size_t n, size_t max_problems,
                    tks_audit_report **out);

/* A report as bytes, for another process of the same binary (the bytes are
 * its struct and problems as they lie in memory, behind a magic):
 * tks_audit_report_pack sets *bytes (malloc'd, the caller frees it) and
 * *len; tks_audit_report_unpack reads the report at the front of `len`
 * bytes into *out (the caller frees it: tks_audit_report_free) and sets
 * *used to its length (reports packed back to back are read one after the
 * other). Errors: TKS_ERR_NOMEM; unpack: TKS_ERR_ARG for bytes that are
 * not a packed report, or cut short. */
int tks_audit_report_pack(const tks_audit_report *r, void **bytes, size_t *len);
int tks_audit_report_unpack(const void *bytes, size_t len, size_t *used, tks_audit_report **out);

/* The processes that audit together (tks_audit_spread). Both calls are
 * collective: every rank makes the same calls in the same order; each
 * returns 0, or an error code with the error set. The library stays free
 * of MPI; tokshard passes MPI's world (tools/dist_mpi.c). */
typedef struct tks_audit_world {
    int rank, size;            /* this process's rank in [0, size) */
    /* elementwise maximum of n values over the ranks, in place on every rank */
    int (*max_int)(int *v, size_t n, void *ctx);
    /* every rank's n bytes at mine, back to back in rank order, on rank 0:
     * *all malloc'd (the caller of the callback frees it), *len bytes; NULL
     * and 0 on the other ranks */
    int (*gather)(const void *mine, size_t n, void **all, size_t *len, void *ctx);
    void *ctx;
} tks_audit_world;

/*
 * Audits path over the ranks of `world` (NULL or size 1: tks_audit in this
 * process): each rank audits its share of the shards (tks_audit_opts rank
 * and n_ranks set from world; opts must not be NULL) and rank 0 merges the
 * reports into *out (tks_audit_merge: the report of a single process);
 * *out is NULL on the other ranks. Collective over `world`.
 * Returns 0, or an error with its context: this rank's own (those of
 * tks_audit, TKS_ERR_NOMEM packing its report), and then on every other
 * rank TKS_ERR_IO naming path ("another rank could not audit"); on rank 0
 * also TKS_ERR_NOMEM or TKS_ERR_ARG (a rank's report did not arrive whole)
 * merging; or a callback's code. The report is owned by the caller.
 */
int tks_audit_spread(const char *path, const tks_audit_opts *opts, const tks_audit_world *world,
                     tks_audit_report **out);

/* ---------------------------------------------------------------------------
 * Audit reports written by other checks, and dataset statistics
 * ------------------------------------------------------------------------- */

/*
 * Records one problem in r, the way every check of a tokshard audit does:
 * counts it in r->n_problems_total and, while fewer than `cap` problems are
 * recorded (r->problems must hold at least cap entries), appends it.
 * order: the problem's tks_audit_problem.order, stored as given.
 * file: the file the problem is in (NULL: ""); shard, chunk, token_offset
 * (tokens), byte_offset (bytes in file) and doc: TKS_NONE where they do not
 * apply. The message is printf-formatted from fmt and cut to the record's
 * 383 bytes. Returns 1 when recorded, 0 when only counted; never fails.
 */
int tks_audit_report_add(tks_audit_report *r, size_t cap, uint64_t order, int code,
                         const char *file, uint64_t shard, uint64_t chunk, uint64_t token_offset,
                         uint64_t byte_offset, uint64_t doc, const char *fmt, ...)
    __attribute__((format(printf, 11, 12)));
/* tks_audit_report_add with the message's arguments as a va_list. */
int tks_audit_report_vadd(tks_audit_report *r, size_t cap, uint64_t order, int code,
                          const char *file, uint64_t shard, uint64_t chunk, uint64_t token_offset,
                          uint64_t byte_offset, uint64_t doc, const char *fmt, va_list ap)
    __attribute__((format(printf, 11, 0)));

/* What shards hold (tokshard inspect): documents, tokens, document lengths
 * and how often each id occurs. */
typedef struct tks_stats {
    uint64_t n_docs, n_tokens;
    uint64_t min_doc_tokens;     /* shortest document, tokens; UINT64_MAX when none */
    uint64_t max_doc_tokens;     /* longest document, tokens; 0 when none */
    uint64_t doc_hist[65];       /* [b]: documents of [2^b, 2^(b+1) - 1] tokens */
    uint32_t vocab_size;         /* the first shard's */
    uint64_t *counts;            /* vocab_size entries: occurrences of each id */
    uint32_t *top;               /* n_top ids, most frequent first (ties: smaller id first) */
    size_t n_top;                /* min(top, vocab_size) */
} tks_stats;

/*
 * Counts the documents, tokens, document lengths and id occurrences of
 * shards[0..n_shards) (a dataset's shards in order, or one shard), and picks
 * the `top` most frequent ids. Reads every token once, in parallel (OpenMP);
 * ids >= the first shard's vocab_size are not counted. The shards are
 * borrowed. *out is owned by the caller: tks_stats_free (accepts NULL).
 * Errors: TKS_ERR_ARG (n_shards == 0), TKS_ERR_NOMEM.
 */
int tks_stats_compute(const tks_shard *const *shards, size_t n_shards, size_t top,
                      tks_stats **out);
void tks_stats_free(tks_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* TKS_DATASET_H */
