/*
 * interop.h - the whole public API of tokshard's interop layer: other
 * projects' token datasets read in place (audit), converted into checksummed
 * tokshard datasets (import) and written from tokshard datasets (export).
 * Byte layouts and the sources they were read from: docs/INTEROP.md.
 *
 *   megatron   Megatron-LM indexed dataset: PREFIX.idx + PREFIX.bin
 *              (megatron-core, megatron/core/datasets/indexed_dataset.py)
 *   llmc       llm.c token shard: 256 int32 header, then tokens
 *              (llm.c, dev/data/data_common.py write_datafile)
 *   raw        headerless uint16/uint32 tokens (nanoGPT's train.bin)
 *   datatrove  datatrove DocumentTokenizer output: FILE.ds + FILE.ds.index
 *              (datatrove, src/datatrove/pipeline/tokens/tokenizer.py)
 *
 * Conventions as in dataset.h: functions return 0 or a negative TKS_ERR_*
 * code and record the file, token offset and document of a failure in
 * tks_last_error(); nothing here prints or exits.
 */
#ifndef TKS_INTEROP_H
#define TKS_INTEROP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "dataset/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tks_foreign_format {
    TKS_FOREIGN_MEGATRON = 1,
    TKS_FOREIGN_LLMC = 2,
    TKS_FOREIGN_RAW = 3,
    TKS_FOREIGN_DATATROVE = 4,
} tks_foreign_format;

/* "megatron", "llmc", "raw", "datatrove" -> *out. Returns 0 or TKS_ERR_ARG. */
int tks_foreign_format_parse(const char *name, tks_foreign_format *out);
const char *tks_foreign_format_name(tks_foreign_format f);

/* llm.c header magics and versions (dev/data/data_common.py HEADERS_INFO). */
#define TKS_LLMC_MAGIC_U16 20240520   /* version 1, uint16 tokens (GPT-2) */
#define TKS_LLMC_MAGIC_U32 20240801   /* version 7, uint32 tokens (Llama 3) */
#define TKS_LLMC_HEADER_BYTES 1024u   /* 256 int32 */
/* Megatron .idx magic (9 bytes) and the header size before the arrays. */
#define TKS_MEGATRON_MAGIC "MMIDIDX\0\0"
#define TKS_MEGATRON_HEADER_BYTES 34u /* magic 9, version 8, dtype 1, S 8, D+1 8 */

/* How to read a foreign dataset. */
typedef struct tks_foreign_opts {
    tks_foreign_format format;
    /* raw and datatrove: bytes per token, 2 or 4 (0: datatrove reads it
     * from FILE.ds.metadata; raw requires it). Ignored for megatron and llmc,
     * whose headers say it. */
    uint32_t token_bytes;
    /* llmc: the delimiter prepended to every document (llm.c's
     * <|endoftext|>); raw: the EOT appended to every document (nanoGPT).
     * TKS_NO_ID: no boundaries are known, the whole file is one document.
     * Ignored for megatron and datatrove, whose indexes hold boundaries. */
    uint32_t eot_id;
    /* megatron and datatrove, audit only: every document must end with this
     * id (preprocess_data.py --append-eod), TKS_NO_ID to skip the check. */
    uint32_t eod_id;
} tks_foreign_opts;

/* Defaults: no delimiter, no EOD check, token_bytes from the file. */
void tks_foreign_opts_default(tks_foreign_opts *o);

/*
 * Audits a foreign dataset in place: its structure (magic, version, dtype,
 * header counts against file sizes, index monotonicity, Megatron's pointers
 * against the cumulative lengths, datatrove's ends against the token count),
 * empty documents, the EOD at every document end when opts->eod_id is given,
 * and every id against `model_vocab` (> 0; negative ids of signed dtypes are
 * out of range too). `path` is the Megatron prefix (PREFIX.idx/.bin), the
 * llm.c or raw file, or the datatrove .ds file. Each problem names the file,
 * the token offset and byte offset in it and the document. The report has the
 * same shape as tks_audit's (n_shards counts data files) and is owned by the
 * caller (tks_audit_report_free). Returns 0 when the audit ran, whatever it
 * found; TKS_ERR_IO when a file cannot be opened, TKS_ERR_ARG for bad
 * options, TKS_ERR_NOMEM.
 * With `tok` (the tokenizer the ids are said to come from, tks_tokenizer_record;
 * may be NULL) the ids no text produces (its reserved ranges) are looked for
 * inside documents as tks_audit does: a BOS at a document's start and an EOS
 * at its end are expected, any other one is reported, the first of each
 * document.
 */
int tks_foreign_audit(const char *path, const tks_foreign_opts *opts, uint32_t model_vocab,
                      const tks_tokenizer_info *tok, size_t max_problems, tks_audit_report **out);

/* Import: a foreign dataset to a tokshard dataset. */
typedef struct tks_import_opts {
    const char *src;            /* as for tks_foreign_audit */
    tks_foreign_opts foreign;
    const char *out_dir;        /* written as OUT.partial/, renamed to OUT when complete */
    /* The tokenizer the ids belong to: copied into the dataset, its vocab
     * checks every id and its special ids go into the header. Or NULL with
     * vocab_size > 0: the dataset records no usable tokenizer (a note file
     * "tokenizer.none" stands in; `cat --ids`, audit, sample-plan and training
     * work, decoding does not). */
    const char *tokenizer_path;
    const char *pattern;        /* a tiktoken ranks file's pattern and special tokens */
    const char *special_tokens; /* (tks_tok_opts) */
    uint32_t vocab_size;
    uint64_t shard_tokens;      /* 0: 16M */
    uint32_t chunk_bytes;       /* 0: TKS_DEFAULT_CHUNK_BYTES */
    int resume;                 /* continue OUT.partial/ from its published shards */
    volatile sig_atomic_t *stop;/* set by a signal handler: stop cleanly (resumable) */
} tks_import_opts;

typedef struct tks_import_stats {
    uint64_t docs_read;         /* documents in the source */
    uint64_t docs_written;      /* documents in the tokshard dataset */
    uint64_t empty_skipped;     /* source documents with no tokens (never stored) */
    uint64_t continued_first;   /* llmc: first segment without its delimiter (a document
                                 * continued from the previous file) */
    uint64_t tokens_written;
    uint64_t shards;
    uint64_t resumed_shards;    /* shards kept from an interrupted import */
    uint32_t vocab_size, min_token_id, max_token_id;
    double seconds;
} tks_import_stats;

/*
 * Converts a foreign dataset into a tokshard dataset (docs/FORMAT.md): one
 * tokshard document per source document (Megatron: the concatenation of its
 * sequences; llm.c: from one delimiter to the next, delimiter included; raw:
 * up to and including each EOT; datatrove: per index entry), ids unchanged.
 * Streams the source (memory: one document plus O(documents) of boundary
 * offsets). Crash-safe and resumable like `tokshard build`: shards are
 * published one by one in OUT.partial/, which becomes OUT once the manifest is
 * written; with opts->resume the published shards are kept and the result is
 * byte-identical to an uninterrupted import.
 * Errors: every structural problem tks_foreign_audit reports (the first one
 * found), TKS_ERR_TOKEN_RANGE (an id outside the vocabulary: names the source
 * file, token offset and document), TKS_ERR_TOKENIZER, TKS_ERR_EXISTS (OUT
 * exists, or OUT.partial exists without resume), TKS_ERR_RESUME,
 * TKS_ERR_INTERRUPTED, TKS_ERR_IO, TKS_ERR_NOSPACE, TKS_ERR_NOMEM.
 */
int tks_import(const tks_import_opts *opts, tks_import_stats *stats);

/* Export: a tokshard dataset to another project's format. */
typedef struct tks_export_opts {
    tks_foreign_format format;  /* TKS_FOREIGN_MEGATRON or TKS_FOREIGN_LLMC */
    /* megatron: 0 = PREFIX_NNNNN.bin is a symbolic link to the shard and the
     * .idx points into its token section (zero copy); 1 = the .bin holds a
     * copy of the tokens. llmc always copies (its header precedes the tokens). */
    int copy;
    /* llmc: prepend this id to every document that does not already start
     * with it (llm.c's convention); TKS_NO_ID: tokens as stored. */
    uint32_t eot_id;
} tks_export_opts;

typedef struct tks_export_stats {
    uint64_t files;             /* data files written (one per shard) */
    uint64_t docs, tokens;      /* tokens: as written (with inserted delimiters) */
    uint64_t bytes_written;     /* bytes written (links count 0) */
    uint64_t docs_end_eot;      /* llmc: documents that already end with the --eot id (a dataset
                                 * built with --append-eos and EOS = --eot): each such boundary
                                 * holds two delimiters once EOT is prepended */
    uint64_t eot_inserted;      /* llmc: EOT ids prepended */
} tks_export_stats;

/*
 * Writes one foreign file set per shard of the dataset at `dataset_dir`:
 * megatron PREFIX_NNNNN.idx + PREFIX_NNNNN.bin (one sequence and one document
 * per tokshard document; uint16 ids as dtype uint16, uint32 ids as int32),
 * llmc PREFIX_NNNNN.bin (magic 20240520 v1 for uint16 shards, 20240801 v7 for
 * uint32). Every file is written crash-safely. The dataset is opened (and so
 * validated) first.
 * Errors: TKS_ERR_ARG (a shard Megatron or llm.c cannot represent: an id
 * above 2^31 - 1, a document longer than 2^31 - 1 tokens, an llm.c file of
 * 2^31 tokens or more; the message names the shard and the fix),
 * TKS_ERR_EXISTS (an output file exists), every tks_dataset_open error,
 * TKS_ERR_IO, TKS_ERR_NOSPACE, TKS_ERR_NOMEM.
 */
int tks_export(const char *dataset_dir, const char *prefix, const tks_export_opts *opts,
               tks_export_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* TKS_INTEROP_H */
