/* parquet.h - one text column of a Parquet file, row group by row group,
 * read through Apache Arrow's C++ Parquet reader (libparquet, as the pyarrow
 * wheel ships it: tokenize/parquet.cc, built as the module
 * bin/tokshard-parquet.so, which tokenize/parquet_dl.c loads at the first
 * call; a module that cannot be loaded makes tks_pq_available 0 and
 * tks_pq_open an error naming why). A build without it (-DTKS_PARQUET=OFF,
 * or AUTO where pyarrow was not found) links tokenize/parquet_stub.c instead,
 * whose tks_pq_open refuses every file with the instruction to install it.
 *
 * A document is one row of the column: a `string`, `large_string`, `binary`
 * or `large_binary` Arrow column, stored as Parquet's BYTE_ARRAY physical type
 * (plain or dictionary encoded, any codec the reader supports), at the top
 * level of the schema, not repeated (Parquet format specification,
 * https://github.com/apache/parquet-format: LogicalTypes.md, Encodings.md).
 * A null row is reported as such (the input counts it as an empty document).
 * Page CRCs are verified where the writer stored them.
 *
 * Errors: every function returns 0 (or a count) or a TKS_ERR_* code with the
 * message recorded (tks_last_error): TKS_ERR_INPUT for a file that is not
 * Parquet, is damaged (bad footer, a page past the file or larger than it
 * declares, a CRC mismatch, fewer rows than the footer says) or lacks a
 * readable column of that name (the message lists the file's columns and
 * their types), naming the file and the row group. tks_pq_open reads only
 * the footer: damage inside a page is found when the page is read
 * (tks_pq_next). TKS_ERR_IO for a file
 * that cannot be opened; TKS_ERR_NOMEM. Not thread-safe per handle; handles
 * are independent. */
#ifndef TKS_TOKENIZE_PARQUET_H
#define TKS_TOKENIZE_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A row group as the footer describes it, for the column read. */
typedef struct tks_pq_group {
    uint64_t rows;       /* rows of the row group */
    uint64_t bytes;      /* the column chunk's uncompressed size (total_uncompressed_size) */
    uint64_t start, end; /* the column chunk's bytes in the file: [start, end) */
} tks_pq_group;

typedef struct tks_pq tks_pq;

/* 1 when this build reads Parquet (Arrow was found at build time), else 0. */
int tks_pq_available(void);
/* The Arrow version this build reads with ("26.0.1"), or "" without. */
const char *tks_pq_version(void);

/* Opens path and checks its footer and the column `column` (see above).
 * *out is owned by the caller: tks_pq_close. */
int tks_pq_open(const char *path, const char *column, tks_pq **out);
/* The file's row groups (footer order); valid until tks_pq_close. */
size_t tks_pq_n_groups(const tks_pq *p);
const tks_pq_group *tks_pq_groups(const tks_pq *p);
/* Positions the reader at the first row of row group g (< tks_pq_n_groups). */
int tks_pq_start(tks_pq *p, size_t g);
/* The next row of the row group begun by tks_pq_start: 1 with *s, *n (the
 * value's bytes, valid until the next call) and *is_null set; 0 once the
 * row group's rows are all read (and as many as the footer says); or an
 * error. */
int tks_pq_next(tks_pq *p, const char **s, size_t *n, int *is_null);
void tks_pq_close(tks_pq *p);

#ifdef __cplusplus
}
#endif

#endif
