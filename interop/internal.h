/* internal.h - private to interop/: the foreign-dataset reader shared by the
 * audit and the import. Not an API. */
#ifndef TKS_INTEROP_INTERNAL_H
#define TKS_INTEROP_INTERNAL_H

#include <limits.h>

#include "interop/interop.h"

/* Element types of foreign token arrays. Megatron's dtype codes
 * (indexed_dataset.py DType) map onto these; llm.c, raw and datatrove use
 * U16 or U32. */
typedef enum fdtype { FD_U8, FD_I8, FD_I16, FD_U16, FD_I32, FD_U32, FD_I64 } fdtype;

/* Collects problems: into an audit report (strict = 0), or as the first
 * error (strict = 1: tks_fail, and the caller stops). */
typedef struct tks__plist {
    tks_audit_report *r;
    size_t max;
    int strict;
} tks__plist;

/* Records a problem. Strict: returns `code` after tks_fail. Audit: returns 0
 * (the caller goes on). */
int tks__problem(tks__plist *pl, int code, const char *file, uint64_t token_off, uint64_t byte_off,
                 uint64_t doc, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* A foreign dataset, opened and structurally checked: tokens [0, n_tokens)
 * at data + tokens_offset, documents [doc_start[d], doc_start[d + 1]). */
typedef struct tks__foreign {
    tks_foreign_opts o;
    char data_path[PATH_MAX];   /* file holding the tokens */
    char index_path[PATH_MAX];  /* .idx / .ds.index, or "" */
    const uint8_t *data;        /* whole data file, mapped (NULL when empty) */
    size_t data_size;
    const uint8_t *idx;         /* whole index file, mapped */
    size_t idx_size;
    uint64_t tokens_offset;     /* byte offset of token 0 in the data file */
    uint64_t n_tokens;
    fdtype dtype;
    uint32_t token_bytes;
    uint64_t n_docs;
    uint64_t *doc_start;        /* n_docs + 1 token offsets, non-decreasing */
    uint64_t empty_docs;
    uint64_t continued_first;   /* llmc: the first document lacks its delimiter */
    int readable;               /* 1: tokens and doc_start can be trusted */
} tks__foreign;

/* Opens `path` in the given format and checks its structure, reporting each
 * problem to pl. Returns 0 (audit: also when problems were found; see
 * f->readable), or an error (strict: the first problem; always: TKS_ERR_IO
 * for a file that cannot be opened, TKS_ERR_NOMEM). */
int tks__foreign_open(const char *path, const tks_foreign_opts *o, tks__plist *pl, tks__foreign *f);
void tks__foreign_close(tks__foreign *f);

/* Token i as a signed 64-bit value. */
int64_t tks__foreign_token(const tks__foreign *f, uint64_t i);

#endif
