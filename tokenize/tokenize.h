/*
 * tokenize.h - the public API of tokshard's tokenize layer: reading raw text
 * (plain, compressed, archives, through libarchive) into documents, and the
 * OpenMP build pipeline that tokenizes documents into a dataset.
 * The tokenizer models are the tokenizer library's (tokenizer/tokenizer.h):
 * this header names its handle, tks_tok, without including it.
 *
 * Errors are TKS_ERR_* codes with context (file, line, document) in
 * tks_last_error(); nothing here prints or exits.
 */
#ifndef TKS_TOKENIZE_H
#define TKS_TOKENIZE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "dataset/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded tokenizer model (tokenizer/tokenizer.h). */
typedef struct tks_tok tks_tok;

/* ---------------------------------------------------------------------------
 * Input: files, directories, compressed streams and archives -> documents
 * ------------------------------------------------------------------------- */
typedef enum { TKS_SPLIT_FILE = 0, TKS_SPLIT_LINE, TKS_SPLIT_BLANK } tks_doc_split;
/* TKS_FMT_AUTO: entries named *.jsonl (also compressed: *.jsonl.gz) are JSON
 * Lines, everything else is text, *.json included (source archives are full of
 * JSON files that are not JSON Lines; pass TKS_FMT_JSONL for JSONL named *.json). */
typedef enum { TKS_FMT_AUTO = 0, TKS_FMT_TEXT, TKS_FMT_JSONL } tks_input_format;
typedef enum { TKS_POLICY_REPLACE = 0, TKS_POLICY_SKIP, TKS_POLICY_FAIL } tks_policy;

typedef struct tks_input_opts {
    tks_doc_split split;        /* text documents: whole entry, each line, or blank-line paragraphs */
    tks_input_format format;    /* AUTO: ".jsonl"/".json" (before any compression suffix) -> JSONL */
    const char *jsonl_key;      /* NULL = "text" */
    tks_policy invalid_utf8;    /* REPLACE (U+FFFD per maximal invalid subsequence), SKIP, FAIL */
    uint64_t max_doc_bytes;     /* 0 = 64 MiB */
    tks_policy long_doc;        /* SKIP (default) or FAIL */
    tks_policy bad_record;      /* JSONL line unparsable or without the key: FAIL (default) or SKIP */
    tks_policy bad_input;       /* a file whose name promises compression (x.gz, x.tar.zst) but
                                 * whose bytes are not in that format, a Parquet file under
                                 * another name than *.parquet, a *.parquet file without a
                                 * readable text column: FAIL (default; checked by
                                 * tks_input_open) or SKIP (left out, listed by
                                 * tks_input_skipped_file, counted in bad_inputs_skipped) */
    /* When non-NULL and set non-zero (a SIGINT/SIGTERM handler), reading ends
     * with TKS_ERR_INTERRUPTED at the next block of at most 1 MiB (also
     * inside one document), the next Parquet row, or within 0.2 s of a wait
     * for a pipe's writer or data. */
    volatile sig_atomic_t *stop;
    /* 1: a JSONL record is yielded as its line (tks_doc.json = 1), undecoded:
     * the caller decodes it with tks_jsonl_decode, on any thread, and applies
     * the record policies (bad_record, long_doc, empty) to what that says.
     * The build does so to decode records on its encoding threads. */
    int defer_json;
    /* Symbolic links to files found inside the named directories: 0 (the
     * default) follows them wherever they point, counting in links_outside
     * those whose target lies outside every named path; 1 leaves every such
     * link out, counted in links_skipped. A path named by the caller is
     * followed either way. */
    int no_follow_links;
    /* The column of a Parquet input (a file named *.parquet, read with
     * Apache Arrow's reader where the build has it: tokenize/parquet.h) that
     * holds the documents, one per row; NULL = "text". */
    const char *parquet_column;
} tks_input_opts;

/* Sets the defaults documented above. */
void tks_input_opts_default(tks_input_opts *o);

/* One document. `text` is valid UTF-8 (after the UTF-8 policy) and stays
 * valid until the next tks_input_next call. */
typedef struct tks_doc {
    const char *text;
    size_t len;                 /* bytes, >= 1 */
    uint64_t ordinal;           /* 0-based position among the documents yielded */
    uint64_t line;              /* 1-based line of its start in its entry */
    const char *source;         /* "path" or "archive.tar.gz:member" (owned by the input) */
    int json;                   /* 1: text is an undecoded JSONL record (defer_json) */
    /* Where it is, as a build records it (tks_doc_prov, dataset.h): */
    uint64_t file;              /* the input file: its index in the listing (tks_input_file) */
    uint32_t entry;             /* an archive's regular member, 1-based; a Parquet file's row
                                 * group, 0-based; 0 for any other file */
    uint64_t offset;            /* bytes of the decompressed entry before its first byte (a
                                 * JSON Lines record's, after a byte order mark); Parquet:
                                 * rows of its row group before it */
    uint64_t raw_len;           /* bytes it spans in its entry: the text before the UTF-8
                                 * policy, a JSON Lines record's line, a Parquet value */
} tks_doc;

/* What tks_jsonl_decode found in a JSONL record. */
typedef enum {
    TKS_JSONL_OK = 0,    /* *text holds the key's string: valid UTF-8 without NUL */
    TKS_JSONL_BAD,       /* not a JSON object with a string under the key (why says which) */
    TKS_JSONL_LONG,      /* the string is longer than max_doc bytes */
    TKS_JSONL_EMPTY      /* the string is empty */
} tks_jsonl_status;

/*
 * Decodes one JSONL record (line[0..len), a byte order mark and blank
 * records already dropped by the reader). Records go through RapidJSON's
 * reader (tokenize/jsonl_fast.cc) where its verdict and string are
 * jansson's, else through jansson, which words the reason of every bad
 * record: the results are jansson's either way. *text, *n bytes: the key's
 * string, in *root (jansson; the caller json_decref's it, NULL is fine) or,
 * when *root is NULL, in this thread's buffer until this thread's next
 * call. why[cap]: the reason of TKS_JSONL_BAD. Thread-safe (per-thread
 * buffer, no shared state).
 */
tks_jsonl_status tks_jsonl_decode(const char *line, size_t len, const char *key, uint64_t max_doc,
                                  struct json_t **root, const char **text, size_t *n, char *why, size_t cap);
/* The same with jansson alone (the reference the tests compare with). */
tks_jsonl_status tks__jsonl_decode_jansson(const char *line, size_t len, const char *key, uint64_t max_doc,
                                           struct json_t **root, const char **text, size_t *n, char *why,
                                           size_t cap);

typedef struct tks_input_stats {
    uint64_t files;             /* input files opened */
    uint64_t entries;           /* regular entries read (a plain file is one entry) */
    uint64_t bytes_in;          /* bytes consumed from disk (compressed size) */
    uint64_t bytes_text;        /* decompressed bytes read */
    uint64_t docs;              /* documents yielded */
    uint64_t empty_skipped;     /* empty documents (zero bytes after splitting) */
    uint64_t utf8_invalid_docs; /* documents that had invalid UTF-8 */
    uint64_t utf8_replaced;     /* invalid sequences replaced by U+FFFD */
    uint64_t utf8_skipped;      /* documents skipped for invalid UTF-8 */
    uint64_t long_skipped;      /* documents over max_doc_bytes, skipped */
    uint64_t bad_records_skipped; /* JSONL records skipped */
    uint64_t binary_skipped;    /* entries skipped because they contain NUL bytes */
    uint64_t json_as_text;      /* entries named *.json read as text by TKS_FMT_AUTO */
    uint64_t bad_inputs_skipped; /* files left out under bad_input SKIP (tks_input_skipped_file) */
    uint64_t links_outside;     /* files read through a symlink whose target is outside the named paths */
    uint64_t links_skipped;     /* symlinks to files left out (no_follow_links) */
} tks_input_stats;

typedef struct tks_input tks_input;

/*
 * Prepares to read `paths` in order; directories are walked recursively in
 * byte order of names (so the document order is reproducible); symlinks to
 * files are followed, hidden entries are read. Nothing is decompressed yet,
 * but each regular file has its first bytes looked at: when its name
 * promises compression or a compressed archive, they are compared with
 * that format's magic (gzip, xz, zstd, bzip2, lz4, lzip, compress, zip), and
 * a file that starts with Parquet's magic PAR1 under another name than
 * *.parquet is a bad input (it is never read as text); each file named
 * *.parquet has its footer and its document column (parquet_column)
 * checked, and its row groups recorded (a file that is not Parquet, or
 * lacks a text column of that name, is a bad input). A path given
 * explicitly may be a pipe (read once, as it comes); inside a directory
 * only regular files and symlinks to them are read. While reading, a
 * regular file whose size or modification time changes from what was
 * listed here, or that ends before its listed size, fails with
 * TKS_ERR_INPUT naming it.
 * Errors: TKS_ERR_IO (a path missing or unreadable, named), TKS_ERR_INPUT (a
 * file not in the format its name promises, or a Parquet file named otherwise,
 * under bad_input FAIL), TKS_ERR_ARG (a file reached twice from the paths
 * given: the first in input order that repeats an earlier one is named).
 */
int tks_input_open(const char *const *paths, size_t n, const tks_input_opts *opts,
                   tks_input **out);

/* The Apache Arrow version whose Parquet reader this build uses ("26.0.1"),
 * or NULL when it was built without Parquet support (parquet_column). */
const char *tks_input_parquet_reader(void);

/* The files left out under bad_input SKIP, in listing order: "PATH: why"
 * (owned by the input, valid until tks_input_free); NULL past the end. */
const char *tks_input_skipped_file(const tks_input *in, size_t i);

/* The expanded list of input files (after walking directories). */
size_t tks_input_n_files(const tks_input *in);
const char *tks_input_file(const tks_input *in, size_t i);
uint64_t tks_input_file_size(const tks_input *in, size_t i);
/* Sum of the input files' sizes on disk (for progress ETA). */
uint64_t tks_input_total_bytes(const tks_input *in);
/* The XXH3-128 (canonical, big-endian bytes, as tks_file_xxh3_128) of input
 * file i's bytes on disk and their count, taken while the reader read them: a
 * file is read once. Available once the reader has moved past the file (it
 * returned a document of a later file, or 0 at the end of the inputs).
 * out: 16 bytes; bytes may be NULL. Errors: TKS_ERR_ARG (i out of range, or
 * the file not read to its end yet, or its reading failed). */
int tks_input_file_xxh3(const tks_input *in, size_t i, uint8_t out[16], uint64_t *bytes);

/*
 * Yields the next document: returns 1 and fills *doc, 0 at the end of all
 * input, or a negative code: TKS_ERR_INPUT (corrupt archive or compressed
 * stream: names file and entry), TKS_ERR_UTF8, TKS_ERR_JSONL (names
 * file:line), TKS_ERR_DOC_TOO_LONG (under FAIL policies), TKS_ERR_IO.
 */
int tks_input_next(tks_input *in, tks_doc *doc);

/* A place in the inputs where a search for the next document starts (work
 * units, tks_build): file index, regular entry of that file (archive member;
 * a plain or compressed file has one), decompressed bytes of the entry before
 * it, lines of the entry before it, and the ordinal of the next document. */
typedef struct tks_input_pos {
    uint64_t file, entry, offset, line, ordinal;
    uint32_t plain;   /* 1: the file is read as it is on disk (not an archive, not
                       * compressed), so `offset` is a file offset: seek goes there at once */
    uint32_t reserved;
} tks_input_pos;

/* The position after the last document tks_input_next returned (before the
 * first call: the start). Always 0. */
int tks_input_tell(const tks_input *in, tks_input_pos *pos);

/*
 * Moves a freshly opened input (no tks_input_next yet) to `pos`, which an
 * input opened on the same paths and options returned from tks_input_tell:
 * the documents that follow are those that followed there, with the same
 * ordinals. A plain file is entered by lseek; an archive's earlier members
 * and a compressed entry's earlier bytes are read and dropped (a compressed
 * stream cannot be entered in the middle). Inputs read after a seek are not
 * hashed (tks_input_file_xxh3 fails for them), and the input's statistics
 * count only what was read from `pos` on.
 * Errors: TKS_ERR_ARG (already read, or pos beyond the inputs), every
 * tks_input_next error met on the way.
 */
int tks_input_seek(tks_input *in, const tks_input_pos *pos);

const tks_input_stats *tks_input_get_stats(const tks_input *in);
void tks_input_free(tks_input *in);

/* ---------------------------------------------------------------------------
 * Sources: one input file's documents read again where a build found them
 * (tokshard audit --against-source; docs/FORMAT.md, "Provenance section")
 * ------------------------------------------------------------------------- */
typedef struct tks_source tks_source;
/* How a document of the file is reached (tks_source_kind): */
#define TKS_SOURCE_PLAIN 0   /* text or JSON Lines as on disk: a seek to its offset */
#define TKS_SOURCE_STREAM 1  /* compressed or an archive: read from the start, on for later ones */
#define TKS_SOURCE_PARQUET 2 /* Parquet: its row group read up to its row */

/* Opens the input file `path` (one regular file: an entry of a build's
 * listing) to read with the build's options o (the bad_input policy is
 * FAIL here). Errors: those of tks_input_open (TKS_ERR_IO: missing or
 * unreadable; TKS_ERR_INPUT: no longer in the format its name promises). */
int tks_source_open(const char *path, const tks_input_opts *o, tks_source **out);
int tks_source_kind(const tks_source *s);
/* The file's size as listed when it was opened. */
uint64_t tks_source_size(const tks_source *s);
/* Reads the document a build recorded at (entry, offset) (tks_doc_prov's
 * entry and offset) into *doc, decoded as the build decoded it (a JSON Lines
 * record's text under the build's key; every policy of o): 1, and doc->text
 * stays valid until the next call; 0 when no document starts there now
 * (why[cap] says what is there instead); or a reading error (TKS_ERR_INPUT,
 * TKS_ERR_IO, ...; the next call starts over). Reads of one STREAM file are
 * fastest in increasing order of (entry, offset). */
int tks_source_read(tks_source *s, uint32_t entry, uint64_t offset, tks_doc *doc, char *why, size_t cap);
/* The XXH3-128 a build recorded for a part of the file (the manifest's
 * provenance.inputs): whole 1, the whole file's bytes; else the bytes
 * [start, end) of a plain file, or those spanned by the row groups
 * [start, end) of a Parquet file. Errors: TKS_ERR_IO, TKS_ERR_INPUT. */
int tks_source_hash(tks_source *s, uint64_t start, uint64_t end, int whole, uint8_t out[16]);
void tks_source_free(tks_source *s);

/* ---------------------------------------------------------------------------
 * Audit against the sources (tokshard audit --against-source)
 * ------------------------------------------------------------------------- */
#define TKS_SOURCE_SAMPLE_DEFAULT 300u /* documents when neither sample nor all is given */

typedef struct tks_source_audit_opts {
    const char *tokenizer_path;  /* NULL: the dataset's copy of its tokenizer */
    const char *pattern, *special_tokens; /* tokenizer_path a tiktoken ranks file: tks_tok_opts */
    uint64_t sample;             /* documents to check, chosen from seed; 0 = TKS_SOURCE_SAMPLE_DEFAULT */
    int all;                     /* 1: every document */
    uint64_t seed;               /* the sample's seed (every rank must pass the same) */
    int threads;                 /* encoding threads; 0 = OpenMP's default */
    size_t max_problems;         /* problems recorded (0 = 1000); all are counted */
    unsigned rank, n_ranks;      /* this process's run of the sample (0, 0: all of it) */
} tks_source_audit_opts;

/* What one process's audit against the sources did (sums over ranks but
 * dataset_docs, sampled, spm_library and tokenizer, which are the same on
 * every rank, and seconds: the slowest rank's). */
typedef struct tks_source_audit_stats {
    uint64_t dataset_docs;       /* documents in the dataset */
    uint64_t sampled;            /* documents in the sample (all ranks) */
    uint64_t checked;            /* re-read, re-encoded and compared */
    uint64_t ids_differ;         /* of those (or not comparable), ids not the shard's */
    uint64_t changed;            /* skipped: their source changed since the build */
    uint64_t spm_checked, spm_differ; /* also compared with the sentencepiece library's ids */
    uint64_t tokens;             /* ids compared */
    uint64_t bytes;              /* text re-read, bytes */
    uint64_t inputs, parts_hashed; /* input files opened; recorded parts hashed again */
    double seconds, seconds_read, seconds_hash, seconds_encode;
    int tables;                  /* the manifest's tables_xxh3 against the parsed tokenizer's: 1 the
                                  * same, -1 they differ (a problem), 0 not compared (rank 0's) */
    int spm_library;             /* 1: compared with sentencepiece; -1: a sentencepiece model, the
                                  * library unavailable; 0: a byte-level tokenizer */
    char tokenizer[512];         /* the tokenizer file parsed */
} tks_source_audit_stats;

/*
 * Audits the dataset `dir` against its sources: the sample's documents read
 * again where its provenance says the build read them (tks_source), with the
 * build's options (the manifest's provenance.options), encoded again with
 * the tokenizer parsed from its file (tks_tok_opts.no_cache), BOS and EOS
 * added as the build added them, and compared with the shard's ids. A
 * document whose input changed (its size, the recorded XXH3-128 of the part
 * holding it, or the text's own hash) is reported as "source changed"
 * (TKS_ERR_INPUT) and skipped; ids that differ are TKS_ERR_TOKENIZER
 * problems naming the shard, document, token offset, source and first
 * differing position; for a byte-level tokenizer, a manifest whose
 * tables_xxh3 is not the parsed tables' is a TKS_ERR_TOKENIZER problem too
 * (the build encoded with a cache entry that is not the file's). Problems
 * are ordered by the documents' places in the
 * inputs (tks_audit_merge joins the ranks' reports). Returns 0 when the
 * audit ran, whatever it found, with *report (tks_audit_report_free) and
 * *st; or an error: TKS_ERR_VERSION (shards without provenance: format
 * version 1), TKS_ERR_MANIFEST (no provenance.inputs), the dataset's and
 * the tokenizer's loading errors, TKS_ERR_CHECKSUM (a provenance section).
 */
int tks_audit_source(const char *dir, const tks_source_audit_opts *o, tks_audit_report **report,
                     tks_source_audit_stats *st);

/*
 * UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
 * Returns the number of maximal invalid subsequences in [s, s+n); when `out`
 * is not NULL writes the text with each one replaced by U+FFFD (EF BF BD) and
 * sets *out_len. `out` needs room for 3 * n bytes in the worst case.
 */
size_t tks_utf8_sanitize(const char *s, size_t n, char *out, size_t *out_len);

/* ---------------------------------------------------------------------------
 * Build: inputs -> tokenized, checksummed dataset
 * ------------------------------------------------------------------------- */
typedef struct tks_build_progress {
    uint64_t bytes_in, total_bytes_in; /* compressed bytes consumed / on disk (0 = unknown) */
    uint64_t bytes_text, docs_read, docs_written, tokens_written, shards;
    double seconds;
} tks_build_progress;

#define TKS_DEFAULT_UNIT_BYTES (1ull << 30)
/* The least unit_bytes: the window a cut is looked for in, and the bytes
 * of a file's start a unit looks at. A unit costs a directory, a record and
 * those reads; a plain file cut at every few bytes would make a build of
 * units that are nearly all empty (a document longer than a unit spans its
 * nominal bounds), their count no longer bounded by the documents'. */
#define TKS_MIN_UNIT_BYTES (64ull << 10)
/* The rule that makes work units of the inputs (docs/SCALE.md), recorded in
 * the provenance's options as "unit_rule". */
#define TKS_UNIT_RULE "listing-cuts/1"

typedef struct tks_build_opts {
    const char *tokenizer_path;
    const char *out_dir;        /* final dataset dir; must not exist. Work happens in OUT.partial */
    const char *const *inputs;
    size_t n_inputs;
    tks_input_opts input;
    int threads;                /* 0 = OpenMP default */
    int append_eos, prepend_bos;
    uint64_t shard_tokens;      /* 0 = 16 Mi tokens */
    uint32_t chunk_bytes;       /* 0 = TKS_DEFAULT_CHUNK_BYTES */
    uint64_t batch_bytes;       /* text per parallel batch; 0 = 8 MiB (a unit's first three
                                 * batches are an eighth, a quarter and a half of it) */
    uint64_t unit_bytes;        /* work unit size in bytes of input on disk; 0 =
                                 * TKS_DEFAULT_UNIT_BYTES, else at least TKS_MIN_UNIT_BYTES
                                 * (TKS_ERR_ARG below it). Units are made from the listing (see
                                 * "Build by work units" below); each is its own run of shards
                                 * (its last shard may be short). Part of the output, like
                                 * shard_tokens. */
    int resume;                 /* continue OUT.partial, keeping its complete work units */
    int encoder_sentencepiece;  /* 1: encode with sentencepiece even when the fast encoder
                                 * (same ids) could (see tks_spm_encode) */
    const char *pattern;        /* a tiktoken ranks file's pattern and special tokens */
    const char *special_tokens; /* (tks_tok_opts); NULL for the other kinds */
    int allow_special_in_text;  /* 1: special tokens' text becomes their ids (byte-level BPE) */
    /* Called on the calling thread after each batch (may be NULL). */
    void (*progress)(const tks_build_progress *p, void *ctx);
    void *progress_ctx;
    /* When non-NULL and set non-zero (e.g. by a SIGINT handler), the build
     * stops at the next batch boundary with TKS_ERR_INTERRUPTED. */
    volatile sig_atomic_t *stop;
} tks_build_opts;

typedef struct tks_build_stats {
    tks_input_stats input;
    uint64_t docs_written, tokens_written, shards;
    uint64_t empty_after_tokenize; /* documents that produced no token (skipped) */
    uint64_t resumed_shards;       /* shards kept from an earlier interrupted run */
    uint64_t units, units_kept;    /* work units, and those kept from an earlier run */
    double plan_seconds;           /* once the tokenizer is loaded: listing, checks, units and
                                    * OUT.partial, before the first unit */
    double place_seconds;          /* the shards' global indices (this process's units) */
    double manifest_seconds;       /* the manifest, from every unit's result */
    uint64_t handouts;             /* units handed out (under mpirun, every rank's) */
    double handout_seconds_mean, handout_seconds_max; /* one hand-out's cost, under mpirun */
    uint32_t min_token_id, max_token_id, vocab_size;
    double seconds;
    char encoder[16];              /* the path the build took: "fast" or "sentencepiece", or
                                    * "byte-level-bpe" (a tokenizer.json) */
    char encoder_why[256];         /* why sentencepiece ("" with the fast encoder) */
    tks_encoder_stats encoder_stats; /* the fast encoder's word cache (this run's encoding) */
    uint64_t unassigned, unassigned_docs; /* the dataset's: code points in its documents that
                                    * the byte-level encoder's Unicode (tks_bpe_unicode_version)
                                    * leaves unassigned, and the documents holding them, units
                                    * kept from an interrupted run included; recorded in the
                                    * manifest's tokenizer record */
    char tokenizer_cache[1408];     /* why the tokenizer cache was left unused (tks_tok_cache_note),
                                    * or "" */
    char skipped_inputs[2048];     /* "PATH: why\n" for each input left out under bad_input
                                    * SKIP (input.bad_inputs_skipped of them); cut with a
                                    * note when longer: the manifest lists every one */
    int published_complete;        /* 1: under --resume, OUT.partial held this build's finished
                                    * dataset (the interrupted run wrote its manifest but did not
                                    * publish it): published as it was, nothing built; the
                                    * counts above are the dataset's, input and encoder
                                    * statistics are not known */
} tks_build_stats;

/* Sets defaults (all zero plus tks_input_opts_default). */
void tks_build_opts_default(tks_build_opts *o);

/* Loads o->tokenizer_path with the tokenizer options of o (pattern,
 * special tokens, special tokens in the text, encoder) into *tk (the
 * caller frees it: tks_tok_free). Errors: tks_tok_load_opts's. */
int tks_tokenizer_open(const tks_build_opts *o, tks_tok **tk);

/*
 * Builds a dataset: its work units one after the other in this process (see
 * "Build by work units" below). Output is byte-identical whatever the thread
 * count, whether or not it was interrupted and resumed, and to a build of the
 * same units under mpirun. Publishes OUT (renaming OUT.partial) only when
 * complete; on failure OUT does not exist and OUT.partial holds the complete
 * units and a resume state (none when the inputs held no text: then
 * OUT.partial is removed). Under resume, an OUT.partial whose manifest the
 * interrupted build wrote (stopped before publishing, or its rename
 * refused) is published as it is (stats->published_complete).
 * Errors: TKS_ERR_EXISTS (OUT exists, or OUT.partial exists without resume,
 * or OUT was made while the build ran), TKS_ERR_ARG (unit_bytes below
 * TKS_MIN_UNIT_BYTES, ...), TKS_ERR_RESUME, TKS_ERR_TOKENIZER,
 * TKS_ERR_INTERRUPTED (opts->stop: between batches or inside a document),
 * every input error, TKS_ERR_TOKEN_RANGE, TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_build(const tks_build_opts *opts, tks_build_stats *stats);

/* ---------------------------------------------------------------------------
 * Build by work units, for many processes (tokshard build under mpirun)
 *
 * Every build is cut into work units from the inputs' listing alone (paths,
 * sizes, names: nothing is read; docs/SCALE.md gives the rule): each file is
 * one piece, except a plain file larger than unit_bytes, cut near each
 * multiple of unit_bytes at the first document boundary, found by whoever
 * reads the piece; consecutive pieces make a unit of at most unit_bytes
 * (a single larger piece aside). Each unit is its own run of shards, built
 * into OUT.partial/unit-NNNNN/ with its record (unit.json) written last; the
 * dataset depends on the inputs and the options only, not on how the units
 * are spread. tks_build runs every unit in this process; under mpirun a
 * coordinator opens the job (lock, listing, OUT.partial), shares its listing
 * (tks_build_job_share) with the other processes (tks_build_job_join), any
 * process builds any unit, each places its units' shards once their global
 * index is known, and the coordinator writes the manifest and publishes OUT.
 * ------------------------------------------------------------------------- */
typedef struct tks_build_unit {
    uint64_t index;            /* unit number, from 0 in input order */
    uint64_t first_piece, n_pieces; /* the pieces of the inputs it holds */
    uint64_t bytes;            /* their bytes on disk (nominal, before the cuts) */
    uint64_t weight;           /* the hand-out order's estimate of its work: bytes, four
                                * times for compressed files and archives */
} tks_build_unit;

typedef struct tks_unit_stats {
    uint64_t docs_written, tokens_written, shards, text_bytes, bytes_in;
    int kept;                  /* 1: complete from an earlier run, verified, not built */
    uint64_t resumed_shards;   /* a unit built on from an earlier run: the shards it kept */
    double seconds;
} tks_unit_stats;

typedef struct tks_build_job tks_build_job;

/*
 * The coordinator's job: takes OUT.lock, lists the inputs, plans the units
 * and prepares OUT.partial (fresh, or --resume of a build of the same
 * inputs and options, with or without mpirun and with any process count).
 * Errors: those of tks_build before its first document.
 */
int tks_build_job_open(const tks_build_opts *opts, tks_build_job **out);

/* Under mpirun, tks_build_job_open in steps that other processes share:
 * the coordinator's tks_build_job_open_list takes OUT.lock and lists the
 * inputs (no file opened); tks_build_job_share gives the listing as bytes
 * (*blob malloc'd, *len) for tks_build_job_join in each other process of
 * the same binary (which loads the tokenizer); every process checks its
 * share of the files' first bytes and Parquet footers (tks_build_job_check:
 * the files i = part, part + parts, ...; *verdicts malloc'd, *len bytes,
 * empty when all keep their promise); and every process settles its job
 * with all the verdicts put together (tks_build_job_settle: under
 * --on-bad-input fail, TKS_ERR_INPUT naming the first bad file, before
 * anything is written; under skip, the same files left out everywhere),
 * which plans the units and, on the coordinator, prepares OUT.partial.
 * Errors: those of tks_build before its first document; TKS_ERR_ARG for a
 * blob that is not a listing. */
int tks_build_job_open_list(const tks_build_opts *opts, tks_build_job **out);
int tks_build_job_share(const tks_build_job *job, void **blob, size_t *len);
int tks_build_job_join(const tks_build_opts *opts, const void *blob, size_t len, tks_build_job **out);
int tks_build_job_check(const tks_build_job *job, unsigned part, unsigned parts, void **verdicts, size_t *len);
int tks_build_job_settle(tks_build_job *job, const void *verdicts, size_t len);

/* The units (owned by the job) and the order to hand them out in: unit
 * indices, heaviest first (*n of each). */
const tks_build_unit *tks_build_job_units(const tks_build_job *job, size_t *n);
const uint64_t *tks_build_job_order(const tks_build_job *job);

/* Builds unit `unit` into OUT.partial/unit-NNNNN/, or keeps it when an
 * earlier run completed it: its record and shards verify and its input
 * ranges hash as they did (us->kept 1). opts->progress, if set, is called
 * after each batch with this job's totals, and opts->stop is honoured.
 * Errors: those of tks_build; TKS_ERR_RESUME when a kept unit's input
 * changed since (named). */
int tks_build_job_run(tks_build_job *job, uint64_t unit, tks_unit_stats *us);

/* The encoder statistics of the units this job ran (this process's
 * tokenizer; an MPI build sums them over the ranks). */
void tks_build_job_encoder_stats(const tks_build_job *job, tks_encoder_stats *st);

/* Shards of a unit this job ran (0 for one it did not run). */
uint64_t tks_build_job_unit_shards(const tks_build_job *job, uint64_t unit);

/* Once every unit is built: gives the shards of unit `unit` (run by this
 * job) their index in the dataset, from `base` (the shards of the units
 * before it: header rewritten in place and made durable, then renamed to
 * OUT.partial/shard-GGGGG.tks, where a resume finds them), and returns in
 * *result (malloc'd, *len bytes, 8-byte multiple) the unit's result for the
 * coordinator's tks_build_job_finish: its shards, counters and input
 * hashes, as bytes that only the same binary reads. Errors: TKS_ERR_IO,
 * TKS_ERR_NOSPACE, TKS_ERR_RESUME (a shard gone). */
int tks_build_job_place(tks_build_job *job, uint64_t unit, uint64_t base, void **result, size_t *len);

/* Once this process placed its units: makes their renames durable (an
 * fsync of OUT.partial; each rewritten header was made durable before its
 * rename). Errors: TKS_ERR_IO. */
int tks_build_job_sync(tks_build_job *job);

/* Coordinator: from every unit's result (tks_build_job_place's, back to
 * back in any order: len bytes at results, 8-byte aligned), the manifest in
 * OUT.partial; stats as tks_build's. Errors: TKS_ERR_RESUME (a unit
 * missing), TKS_ERR_INPUT (no document), TKS_ERR_IO, TKS_ERR_NOSPACE. */
int tks_build_job_finish(tks_build_job *job, const void *results, size_t len, tks_build_stats *stats);

/* Once the manifest is written: removes unit `unit`'s record and directory. */
void tks_build_job_clean(tks_build_job *job, uint64_t unit);

/* Coordinator, once every unit is cleaned: renames OUT.partial to OUT, then
 * removes the build state from OUT (tks_partial_publish). Errors:
 * TKS_ERR_EXISTS (an OUT made while the build ran: named; OUT.partial is
 * kept, complete, for --resume to publish), TKS_ERR_IO. */
int tks_build_job_publish(tks_build_job *job);

/* Releases the job (and the coordinator's lock). Accepts NULL. */
void tks_build_job_free(tks_build_job *job);

/* ---------------------------------------------------------------------------
 * A build spread over a world of processes (tokshard build under mpirun)
 *
 * Rank 0 opens the job and shares its listing; every rank then takes units,
 * heaviest first, from a counter in rank 0's shared memory (no rank answers
 * another), places its units' shards once a sum of the units' shard counts
 * gives their indices, and rank 0 writes the manifest and publishes OUT
 * (docs/SCALE.md). The library stays free of MPI: the caller passes its
 * world as the collectives below (tokshard's are MPI's, tools/dist_mpi.c).
 * ------------------------------------------------------------------------- */

/* One rank's progress, as it reports it after each unit. */
typedef struct tks_build_rank_progress {
    uint64_t units;      /* units it finished (kept ones included) */
    uint64_t kept;       /* of those, units kept from an earlier run */
    uint64_t text_bytes; /* their text, in bytes */
    uint64_t bytes;      /* their bytes on disk (tks_build_unit.bytes) */
    uint64_t unit;       /* the unit it builds now, plus 1; 0: none */
} tks_build_rank_progress;

/* The build's progress over every rank (rank 0 reads the ranks' reports). */
typedef struct tks_build_world_progress {
    uint64_t units, n_units;   /* units finished by all ranks, of n_units */
    uint64_t kept;             /* of those, units kept from an earlier run */
    uint64_t text_bytes;       /* the finished units' text, in bytes */
    uint64_t bytes, total_bytes; /* the finished units' bytes on disk, and every unit's */
    double seconds;            /* since tks_build_spread began */
    size_t n_ranks;
    const tks_build_rank_progress *ranks; /* n_ranks, in rank order; valid during the call */
    uint64_t building;         /* ranks building a unit now */
    uint64_t units_min, units_max; /* the fewest and most units a rank finished */
} tks_build_world_progress;

/*
 * The processes that build together and how they talk. The collectives
 * (bcast to shared_close) are called by every rank in the same order; each
 * returns 0, or an error code with the error set (tks_build_spread then
 * calls fail). Byte counts are size_t; the caller splits what its transport
 * cannot send at once. Called on the thread that called tks_build_spread.
 */
typedef struct tks_build_world {
    int rank, size;            /* this process's rank in [0, size) */
    /* n bytes at p from rank 0 to every rank (n the same on every rank) */
    int (*bcast)(void *p, size_t n, void *ctx);
    /* every rank's n bytes at mine, back to back in rank order, on rank 0:
     * *all malloc'd (the caller of the callback frees it), *len bytes; NULL
     * and 0 on the other ranks */
    int (*gather)(const void *mine, size_t n, void **all, size_t *len, void *ctx);
    /* elementwise maximum / sum of n values over the ranks, in place on every rank */
    int (*max_int)(int *v, size_t n, void *ctx);
    int (*sum_u64)(uint64_t *v, size_t n, void *ctx);
    /* returns once every rank called it; meanwhile calls wait(arg), when
     * not NULL, now and then (tokshard: every millisecond; rank 0 reports
     * the progress from it while the last units are built) */
    int (*barrier)(void (*wait)(void *arg), void *arg, void *ctx);
    /* n uint64_t in rank 0's memory, zeroed, that every rank reads and
     * writes one-sided (no other rank takes part) from shared_open's return
     * on every rank to shared_close: fetch_add adds v to element i and sets
     * *old to its value before; put writes v[0..n) to elements i..i+n-1 and
     * get reads them into v, each element atomically; all complete on return */
    int (*shared_open)(size_t n, void *ctx);
    int (*fetch_add)(size_t i, uint64_t v, uint64_t *old, void *ctx);
    int (*put)(size_t i, const uint64_t *v, size_t n, void *ctx);
    int (*get)(size_t i, uint64_t *v, size_t n, void *ctx);
    void (*shared_close)(void *ctx);
    /* optional (NULL: none). poll: rank 0, between the batches of its own
     * units: a turn of the transport's progress engine, for a transport that
     * serves the others' one-sided calls only then. progress: rank 0, at most
     * every 2 s and once when every unit is built. building: this rank starts
     * unit `unit` (-1: it builds none any more; partial: OUT.partial), what a
     * signal handler may tell when the job is killed */
    void (*poll)(void *ctx);
    void (*progress)(const tks_build_world_progress *p, void *ctx);
    void (*building)(int64_t unit, const char *partial, void *ctx);
    /* required: this rank cannot go on and the others cannot finish without
     * it (its error is set): unit `unit` failed (being built: what NULL;
     * else in the step `what`), or with unit -1 the step `what` did;
     * partial: OUT.partial, which keeps the complete units. It should stop every rank (MPI_Abort); when it returns,
     * tks_build_spread returns the error and the other ranks are left to the
     * launcher */
    void (*fail)(int64_t unit, const char *what, const char *partial, void *ctx);
    void *ctx;
} tks_build_world;

/*
 * Builds a dataset over the ranks of `world` (NULL or size 1: tks_build in
 * this process): the same dataset, byte for byte, as tks_build. Collective:
 * every rank calls it with the same opts. opts->progress and opts->stop are
 * not used (rank 0 reports through world->progress; a rank stops when it is
 * killed, and OUT.partial/in-flight/rank-RRRRR names the unit it was
 * building). A failed unit or step calls world->fail; a failure found on
 * every rank together (the start, the manifest, publishing) returns on
 * every rank: this rank's error, or one naming the rank that failed
 * (TKS_ERR_IO, or rank 0's code). *stats (may be NULL) is filled on rank 0
 * (the encoder statistics and hand-out timings of every rank); zeroed on
 * the others. Errors: those of tks_build; TKS_ERR_ARG (the output path too
 * long); the callbacks' codes.
 */
int tks_build_spread(const tks_build_opts *opts, const tks_build_world *world, tks_build_stats *stats);

/* ---------------------------------------------------------------------------
 * Training a byte-level BPE tokenizer on inputs of any size
 *
 * The inputs are read as tks_build reads them (the same work units, input
 * options and policies; a reader thread and every thread cutting), each
 * document cut into pieces by the pre-tokenizer pattern (tks_pretok,
 * tokenizer/tokenizer.h) and the distinct pieces of two bytes or more
 * ("words") counted with 64-bit counts in per-thread tables of bounded
 * size, spilled to OUT.partial as sorted runs when full and at the end of
 * each unit. The runs are merged (k-way) into one sorted run of every word,
 * which the trainer (tks_bpe_trainer) then holds with its pair index: the
 * merge phase, whose size tks_bpe_trainer_memory gives before it starts,
 * and which is refused when over the memory limit. The vocabulary and
 * merges are Hugging Face tokenizers' BpeTrainer's (0.23.3) on the same
 * documents with the same pre-tokenizer and ByteLevel's alphabet, for any
 * thread count, memory limit and interruption. OUT is written in
 * OUT.partial/publish and renamed whole.
 * ------------------------------------------------------------------------- */
typedef struct tks_bpe_train_progress {
    int phase;                  /* 0 counting, 1 merging the runs, 2 the merges */
    uint64_t bytes_in, total_bytes_in; /* on disk, read / in all */
    uint64_t bytes_text, docs, pieces; /* text read, documents, pieces cut */
    uint64_t units, n_units, runs;     /* units counted (kept ones included), runs on disk */
    uint64_t merges, target;           /* phase 2: merges done, at most */
    double seconds;
} tks_bpe_train_progress;

typedef struct tks_bpe_train_opts {
    const char *out_dir;        /* the tokenizer's directory; must not exist */
    const char *const *inputs;
    size_t n_inputs;
    tks_input_opts input;
    const char *pattern;        /* gpt2, llama3, cl100k, o200k, qwen2, or a regex */
    uint32_t vocab_size;        /* ids in all, special tokens and the 256 bytes included */
    uint64_t min_frequency;     /* BpeTrainer's min_frequency (0, 1: none) */
    const char *const *specials;/* special tokens, ids 0.. */
    size_t n_specials;
    const char *bos_token, *eos_token, *pad_token; /* tokenizer_config.json's, or NULL */
    int ignore_merges;          /* the BPE model's ignore_merges */
    int tiktoken;               /* also tokenizer.tiktoken and tiktoken.json */
    int threads;                /* 0 = OpenMP default */
    uint64_t memory;            /* bytes the counting and the merge phase may hold; 0: a
                                 * quarter of the machine's memory */
    uint64_t unit_bytes;        /* work unit (the grain of --resume); 0: 256 MiB */
    uint64_t min_word_count;    /* words seen fewer times are left out of the merge phase:
                                 * changes the result, recorded in training.json; 0, 1: none */
    int resume;                 /* continue OUT.partial, keeping its counted units */
    void (*progress)(const tks_bpe_train_progress *p, void *ctx); /* may be NULL */
    /* called once before the merge phase with its size: distinct words (of 2 bytes or more),
     * their bytes, the bytes it will hold and the limit (may be NULL) */
    void (*merge_phase)(uint64_t words, uint64_t bytes, uint64_t need, uint64_t limit, void *ctx);
    void *progress_ctx;
    volatile sig_atomic_t *stop; /* set nonzero: stops at the next batch (TKS_ERR_INTERRUPTED) */
} tks_bpe_train_opts;

typedef struct tks_bpe_train_stats {
    tks_input_stats input;
    uint64_t pieces;            /* pieces cut */
    uint64_t words, word_bytes; /* distinct words of 2 bytes or more, their bytes */
    uint64_t pruned_words;      /* left out by min_word_count */
    uint64_t units, units_kept, runs;
    uint64_t merge_memory, memory; /* the merge phase's size (estimate), and the limit */
    uint64_t merge_peak;        /* what the trainer's tables held at most (tks_bpe_trainer_peak) */
    uint32_t vocab_size;
    uint64_t merges;
    double count_seconds, runs_seconds, merge_seconds, seconds;
} tks_bpe_train_stats;

/* Sets the defaults (zeros, tks_input_opts_default, pattern "gpt2", vocab
 * 32000). */
void tks_bpe_train_opts_default(tks_bpe_train_opts *o);

/*
 * Trains a byte-level BPE tokenizer on the inputs into o->out_dir:
 * tokenizer.json, tokenizer_config.json (tks_bpe_trainer_write), with
 * o->tiktoken tokenizer.tiktoken and tiktoken.json, and training.json (the
 * settings, the counts and any pruning). Interrupted (o->stop) or killed, a
 * run loses at most the unit it was counting; --resume (o->resume) goes on
 * from OUT.partial with the same inputs, input options, pattern and unit
 * size (the vocabulary settings may change). *st (may be NULL) the totals.
 * Errors: TKS_ERR_ARG (options), TKS_ERR_EXISTS (OUT exists, or OUT.partial
 * without resume), TKS_ERR_LOCKED, TKS_ERR_RESUME (OUT.partial is another
 * job's), TKS_ERR_NOMEM (the merge phase does not fit o->memory: the
 * message gives its size and what to do), TKS_ERR_INTERRUPTED, TKS_ERR_INPUT
 * (no text), every input and pre-tokenizer error, TKS_ERR_CHECKSUM (a
 * damaged run), TKS_ERR_IO, TKS_ERR_NOSPACE.
 */
int tks_bpe_train(const tks_bpe_train_opts *o, tks_bpe_train_stats *st);

/* What a build of OUT stopped by its launcher was doing: calls each(note,
 * arg) with each line of OUT.partial/in-flight/ ("unit 3 on rank 1"), in
 * the files' name order; note is valid during the call. Returns the number
 * of notes (0 when there is no such directory); never fails. */
size_t tks_build_in_flight(const char *out_dir, void (*each)(const char *note, void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* TKS_TOKENIZE_H */
