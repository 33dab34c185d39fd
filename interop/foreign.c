/* foreign.c - reads other projects' token datasets in place and checks their
 * structure: Megatron-LM indexed datasets, llm.c shards, raw (nanoGPT)
 * token files and datatrove .ds files. Layouts: docs/INTEROP.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interop/internal.h"
#include "common/tks_bits.h"

int tks_foreign_format_parse(const char *name, tks_foreign_format *out) {
    if (!strcmp(name, "megatron")) *out = TKS_FOREIGN_MEGATRON;
    else if (!strcmp(name, "llmc")) *out = TKS_FOREIGN_LLMC;
    else if (!strcmp(name, "raw")) *out = TKS_FOREIGN_RAW;
    else if (!strcmp(name, "datatrove")) *out = TKS_FOREIGN_DATATROVE;
    else return TKS_ERR_ARG;
    return 0;
}

const char *tks_foreign_format_name(tks_foreign_format f) {
    switch (f) {
    case TKS_FOREIGN_MEGATRON: return "megatron";
    case TKS_FOREIGN_LLMC: return "llmc";
    case TKS_FOREIGN_RAW: return "raw";
    case TKS_FOREIGN_DATATROVE: return "datatrove";
    }
    return "?";
}

void tks_foreign_opts_default(tks_foreign_opts *o) {
    memset(o, 0, sizeof *o);
    o->eot_id = TKS_NO_ID;
    o->eod_id = TKS_NO_ID;
}

int tks__problem(tks__plist *pl, int code, const char *file, uint64_t token_off, uint64_t byte_off,
                 uint64_t doc, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pl->strict) {
        tks_fail(code, file, TKS_NONE, byte_off != TKS_NONE ? byte_off : token_off, "%s", msg);
        tks_error_set_doc(doc, 0);
        return code;
    }
    tks_audit_report_add(pl->r, pl->max, 0, code, file, TKS_NONE, TKS_NONE, token_off, byte_off,
                         doc, "%s", msg);
    return 0;
}


static uint32_t fd_size(fdtype t) {
    switch (t) {
    case FD_U8: case FD_I8: return 1;
    case FD_I16: case FD_U16: return 2;
    case FD_I32: case FD_U32: return 4;
    case FD_I64: return 8;
    }
    return 0;
}

int64_t tks__foreign_token(const tks__foreign *f, uint64_t i) {
    const uint8_t *p = f->data + f->tokens_offset + i * f->token_bytes;
    switch (f->dtype) {
    case FD_U8: return p[0];
    case FD_I8: return (int8_t)p[0];
    case FD_U16: return (uint16_t)(p[0] | p[1] << 8);
    case FD_I16: return (int16_t)(uint16_t)(p[0] | p[1] << 8);
    case FD_U32: return tks_le32(p);
    case FD_I32: return (int32_t)tks_le32(p);
    case FD_I64: return (int64_t)tks_le64(p);
    }
    return -1;
}

/* Maps a whole file read-only; an empty file maps to (NULL, 0). */
/* Maps a whole file read-only, for one pass in order; an empty file maps to (NULL, 0). */
static int map_file(const char *path, const uint8_t **base, size_t *size) {
    int rc = tks_map_file(path, NULL, base, size);
    if (!rc && *size) madvise((void *)*base, *size, MADV_SEQUENTIAL);
    return rc;
}

void tks__foreign_close(tks__foreign *f) {
    tks_unmap(f->data, f->data_size);
    tks_unmap(f->idx, f->idx_size);
    free(f->doc_start);
    memset(f, 0, sizeof *f);
}

static int alloc_starts(tks__foreign *f, uint64_t n_docs) {
    f->n_docs = n_docs;
    f->doc_start = malloc((size_t)(n_docs + 1) * sizeof *f->doc_start);
    if (!f->doc_start)
        return tks_fail(TKS_ERR_NOMEM, f->data_path, TKS_NONE, TKS_NONE,
                        "out of memory for %llu document offsets", (unsigned long long)n_docs);
    return 0;
}

/* Without a delimiter the whole token stream is one document (none when empty). */
static int one_document(tks__foreign *f) {
    int rc = alloc_starts(f, f->n_tokens ? 1 : 0);
    if (rc) return rc;
    f->doc_start[0] = 0;
    f->doc_start[f->n_docs] = f->n_tokens;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Megatron: PREFIX.idx + PREFIX.bin (megatron-core indexed_dataset.py,
 * _IndexWriter.write and _IndexReader.__init__)
 * ------------------------------------------------------------------------- */
static int megatron_dtype(uint8_t code, fdtype *t) {
    switch (code) { /* indexed_dataset.py DType */
    case 1: *t = FD_U8; return 0;
    case 2: *t = FD_I8; return 0;
    case 3: *t = FD_I16; return 0;
    case 4: *t = FD_I32; return 0;
    case 5: *t = FD_I64; return 0;
    case 8: *t = FD_U16; return 0;
    default: return -1; /* 6 float64, 7 float32, or unknown */
    }
}

/* Megatron's document indices doc_p[D1] (b: the index file's bytes, for
 * offsets): 0 = doc[0] <= doc[1] <= ... <= doc[D1 - 1] = S. A bad one is a
 * problem (pl) and sets *fatal; returns tks__problem's stop code. */
static int check_megatron_docs(tks__plist *pl, const char *ip, const uint8_t *b, const uint8_t *doc_p,
                               uint64_t D1, uint64_t S, int *fatal) {
    int rc;
    uint64_t prev = 0;
    for (uint64_t d = 0; d < D1; d++) {
        uint64_t v = tks_le64(doc_p + 8 * d);
        int bad = (d == 0 && v != 0) || v < prev || v > S || (d == D1 - 1 && v != S);
        if (bad) {
            *fatal = 1;
            if ((rc = tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, (uint64_t)(doc_p - b) + 8 * d, d ? d - 1 : 0,
                                   "%s: document index %llu is %llu (previous %llu, %llu sequences): "
                                   "document indices must start at 0, never decrease and end at the "
                                   "sequence count", ip, (unsigned long long)d, (unsigned long long)v,
                                   (unsigned long long)prev, (unsigned long long)S)))
                return rc;
            break;
        }
        prev = v;
    }
    return 0;
}

static int open_megatron(const char *prefix, tks__plist *pl, tks__foreign *f) {
    int rc;
    if (snprintf(f->index_path, sizeof f->index_path, "%s.idx", prefix) >= (int)sizeof f->index_path ||
        snprintf(f->data_path, sizeof f->data_path, "%s.bin", prefix) >= (int)sizeof f->data_path)
        return tks_fail(TKS_ERR_ARG, prefix, TKS_NONE, TKS_NONE, "path too long: %s", prefix);
    if ((rc = map_file(f->index_path, &f->idx, &f->idx_size))) return rc;
    if ((rc = map_file(f->data_path, &f->data, &f->data_size))) return rc;
    const char *ip = f->index_path;
    const uint8_t *b = f->idx;
    if (f->idx_size < TKS_MEGATRON_HEADER_BYTES)
        return tks__problem(pl, TKS_ERR_TRUNCATED, ip, TKS_NONE, f->idx_size, TKS_NONE,
                            "%s has %zu bytes, less than the %u-byte header: the index is truncated; "
                            "re-run Megatron's preprocess_data.py", ip, f->idx_size, TKS_MEGATRON_HEADER_BYTES);
    if (memcmp(b, TKS_MEGATRON_MAGIC, 9) != 0)
        return tks__problem(pl, TKS_ERR_MAGIC, ip, TKS_NONE, 0, TKS_NONE,
                            "%s does not start with MMIDIDX\\0\\0: not a Megatron indexed dataset "
                            "(an old lazy/cached index?); check the --format and the path", ip);
    uint64_t version = tks_le64(b + 9);
    if (version != 1)
        return tks__problem(pl, TKS_ERR_VERSION, ip, TKS_NONE, 9, TKS_NONE,
                            "%s has index version %llu; megatron-core reads version 1 only", ip,
                            (unsigned long long)version);
    uint8_t code = b[17];
    if (megatron_dtype(code, &f->dtype))
        return tks__problem(pl, TKS_ERR_HEADER, ip, TKS_NONE, 17, TKS_NONE,
                            "%s has dtype code %u, which is not an integer type (8 uint16 and 4 "
                            "int32 are what preprocess_data.py writes)", ip, code);
    f->token_bytes = fd_size(f->dtype);
    uint64_t S = tks_le64(b + 18), D1 = tks_le64(b + 26);
    /* layout: lengths int32[S], pointers int64[S], document indices int64[D1],
     * and, for multimodal datasets only, modes int8[S] */
    uint64_t need = TKS_MEGATRON_HEADER_BYTES;
    int overflow = S > (UINT64_MAX / 32) || D1 > (UINT64_MAX / 32);
    if (!overflow) need += 12 * S + 8 * D1;
    if (overflow)
        return tks__problem(pl, TKS_ERR_HEADER, ip, TKS_NONE, 18, TKS_NONE,
                            "%s: its header claims %llu sequences and %llu document indices, more "
                            "than any file can hold (over 2^64 bytes): the header is corrupt; "
                            "re-run preprocess_data.py",
                            ip, (unsigned long long)S, (unsigned long long)D1);
    if (f->idx_size != need && f->idx_size != need + S)
        return tks__problem(pl, TKS_ERR_TRUNCATED, ip, TKS_NONE, f->idx_size, TKS_NONE,
                            "%s has %zu bytes but its header (%llu sequences, %llu document "
                            "indices) needs %llu: the index is truncated or not from this "
                            "header; re-run preprocess_data.py",
                            ip, f->idx_size, (unsigned long long)S, (unsigned long long)D1,
                            (unsigned long long)need);
    if (D1 == 0)
        return tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, 26, TKS_NONE,
                            "%s has no document indices (megatron-core always writes a leading 0)", ip);
    const uint8_t *len_p = b + TKS_MEGATRON_HEADER_BYTES, *ptr_p = len_p + 4 * S, *doc_p = ptr_p + 8 * S;
    int fatal = 0;
    /* sequences: non-negative lengths, pointers equal to the cumulative byte
     * counts from 0, as megatron-core's builder writes them; or from the token
     * section of a tokshard shard, which is what `tokshard export --format
     * megatron` links as the .bin (zero copy) */
    int is_shard = f->data_size >= TKS_HEADER_SIZE && memcmp(f->data, TKS_MAGIC, 8) == 0;
    uint64_t base = is_shard ? TKS_TOKEN_ALIGN : 0;
    uint64_t cum = base;
    for (uint64_t i = 0; i < S; i++) {
        int32_t len = (int32_t)tks_le32(len_p + 4 * i);
        uint64_t ptr = tks_le64(ptr_p + 8 * i);
        if (len < 0) {
            fatal = 1;
            if ((rc = tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, TKS_MEGATRON_HEADER_BYTES + 4 * i, TKS_NONE,
                                   "%s: sequence %llu has negative length %d", ip, (unsigned long long)i, len)))
                return rc;
            break;
        }
        if (ptr != cum) {
            fatal = 1;
            if ((rc = tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, (uint64_t)(ptr_p - b) + 8 * i, TKS_NONE,
                                   "%s: sequence %llu points at byte %lld of the .bin but the "
                                   "lengths before it end at byte %llu: the .idx does not describe "
                                   "this .bin (re-run preprocess_data.py)",
                                   ip, (unsigned long long)i, (long long)(int64_t)ptr, /* int64 in the file */
                                   (unsigned long long)cum)))
                return rc;
            break;
        }
        cum += (uint64_t)len * f->token_bytes;
        if (cum > f->data_size) break; /* reported below; also keeps cum from wrapping */
    }
    if (!fatal && (is_shard ? cum > f->data_size : cum != f->data_size)) {
        fatal = 1;
        if ((rc = tks__problem(pl, TKS_ERR_TRUNCATED, f->data_path, TKS_NONE, f->data_size, TKS_NONE,
                               "%s has %zu bytes but %s describes %llu (%llu tokens of %u bytes): "
                               "the .bin is %s", f->data_path, f->data_size, ip, (unsigned long long)cum,
                               (unsigned long long)((cum - base) / f->token_bytes), f->token_bytes,
                               cum > f->data_size ? "truncated" : "longer than its index")))
            return rc;
    }
    if ((rc = check_megatron_docs(pl, ip, b, doc_p, D1, S, &fatal))) return rc;
    if (fatal) return 0;
    f->n_tokens = (cum - base) / f->token_bytes;
    f->tokens_offset = base;
    if ((rc = alloc_starts(f, D1 - 1))) return rc;
    /* document d starts at the pointer of its first sequence */
    for (uint64_t d = 0; d < D1; d++) {
        uint64_t seq = tks_le64(doc_p + 8 * d);
        f->doc_start[d] = seq < S ? (tks_le64(ptr_p + 8 * seq) - base) / f->token_bytes : f->n_tokens;
    }
    f->readable = 1;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Flat token files: llm.c (header + tokens), raw (tokens), datatrove (.ds +
 * .ds.index). Boundaries from delimiters or from the index.
 * ------------------------------------------------------------------------- */

/* Document starts from a delimiter: llm.c prepends it (a document starts at
 * each delimiter), nanoGPT appends it (a document starts after each one). */
static int split_on_delimiter(tks__foreign *f, uint32_t eot, int prepended) {
    uint64_t n = 0, cap = 1024;
    uint64_t *s = malloc(cap * sizeof *s);
    if (!s) return tks_fail(TKS_ERR_NOMEM, f->data_path, TKS_NONE, TKS_NONE, "out of memory");
    s[n++] = 0;
    for (uint64_t i = 0; i < f->n_tokens; i++) {
        if (tks__foreign_token(f, i) != (int64_t)eot) continue;
        uint64_t start = prepended ? i : i + 1;
        if (start == 0 || start == f->n_tokens || start == s[n - 1]) continue;
        if (n + 1 >= cap) {
            uint64_t *p = realloc(s, 2 * cap * sizeof *s);
            if (!p) {
                free(s);
                return tks_fail(TKS_ERR_NOMEM, f->data_path, TKS_NONE, TKS_NONE, "out of memory");
            }
            s = p;
            cap *= 2;
        }
        s[n++] = start;
    }
    s[n] = f->n_tokens;
    f->doc_start = s;
    f->n_docs = f->n_tokens ? n : 0;
    return 0;
}

static int open_llmc(const char *path, tks__plist *pl, tks__foreign *f) {
    int rc;
    snprintf(f->data_path, sizeof f->data_path, "%s", path);
    if ((rc = map_file(path, &f->data, &f->data_size))) return rc;
    if (f->data_size < TKS_LLMC_HEADER_BYTES)
        return tks__problem(pl, TKS_ERR_TRUNCATED, path, TKS_NONE, f->data_size, TKS_NONE,
                            "%s has %zu bytes, less than llm.c's %u-byte header: truncated", path,
                            f->data_size, TKS_LLMC_HEADER_BYTES);
    uint32_t magic = tks_le32(f->data), version = tks_le32(f->data + 4);
    int32_t ntok = (int32_t)tks_le32(f->data + 8);
    if (magic == TKS_LLMC_MAGIC_U16) f->dtype = FD_U16;
    else if (magic == TKS_LLMC_MAGIC_U32) f->dtype = FD_U32;
    else
        return tks__problem(pl, TKS_ERR_MAGIC, path, TKS_NONE, 0, TKS_NONE,
                            "%s has magic %u: an llm.c token file starts with %d (GPT-2, uint16) "
                            "or %d (Llama 3, uint32); a headerless file is --format raw", path,
                            magic, TKS_LLMC_MAGIC_U16, TKS_LLMC_MAGIC_U32);
    uint32_t want_version = magic == TKS_LLMC_MAGIC_U16 ? 1 : 7;
    if (version != want_version)
        return tks__problem(pl, TKS_ERR_VERSION, path, TKS_NONE, 4, TKS_NONE,
                            "%s has version %u; llm.c writes version %u with magic %u", path, version,
                            want_version, magic);
    f->token_bytes = fd_size(f->dtype);
    f->tokens_offset = TKS_LLMC_HEADER_BYTES;
    uint64_t want = TKS_LLMC_HEADER_BYTES + (uint64_t)(ntok < 0 ? 0 : ntok) * f->token_bytes;
    if (ntok < 0 || want != f->data_size)
        return tks__problem(pl, TKS_ERR_TRUNCATED, path, TKS_NONE, f->data_size, TKS_NONE,
                            "%s: the header counts %d tokens (%llu bytes with the header) but the "
                            "file has %zu bytes: truncated or not written by llm.c's write_datafile",
                            path, ntok, (unsigned long long)want, f->data_size);
    for (uint32_t i = 3; i < 256; i++)
        if (tks_le32(f->data + 4 * i) != 0)
            return tks__problem(pl, TKS_ERR_HEADER, path, TKS_NONE, 4 * i, TKS_NONE,
                                "%s: header int32 %u is not zero (llm.c writes zeros after the "
                                "count)", path, i);
    f->n_tokens = (uint64_t)ntok;
    if (f->o.eot_id != TKS_NO_ID) {
        if ((rc = split_on_delimiter(f, f->o.eot_id, 1))) return rc;
        if (f->n_tokens && tks__foreign_token(f, 0) != (int64_t)f->o.eot_id) f->continued_first = 1;
    } else if ((rc = one_document(f))) {
        return rc;
    }
    f->readable = 1;
    return 0;
}

static int open_raw(const char *path, tks__plist *pl, tks__foreign *f) {
    int rc;
    snprintf(f->data_path, sizeof f->data_path, "%s", path);
    if (f->o.token_bytes != 2 && f->o.token_bytes != 4)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE,
                        "%s: a raw token file has no header: give --dtype u16 (nanoGPT's train.bin) or u32", path);
    if ((rc = map_file(path, &f->data, &f->data_size))) return rc;
    f->dtype = f->o.token_bytes == 2 ? FD_U16 : FD_U32;
    f->token_bytes = f->o.token_bytes;
    if (f->data_size % f->token_bytes)
        return tks__problem(pl, TKS_ERR_TRUNCATED, path, TKS_NONE, f->data_size, TKS_NONE,
                            "%s has %zu bytes, not a multiple of %u: truncated, or not --dtype u%u",
                            path, f->data_size, f->token_bytes, 8 * f->token_bytes);
    f->n_tokens = f->data_size / f->token_bytes;
    if (f->o.eot_id != TKS_NO_ID) {
        if ((rc = split_on_delimiter(f, f->o.eot_id, 0))) return rc;
        if (f->n_tokens && tks__foreign_token(f, f->n_tokens - 1) != (int64_t)f->o.eot_id &&
            (rc = tks__problem(pl, TKS_ERR_TRUNCATED, path, f->n_tokens - 1, f->data_size - f->token_bytes,
                               f->n_docs - 1,
                               "%s does not end with the EOT %u that follows every document "
                               "(nanoGPT's prepare.py appends it): the file is truncated, or "
                               "--eot is not its delimiter", path, f->o.eot_id)))
            return rc;
    } else if ((rc = one_document(f))) {
        return rc;
    }
    f->readable = 1;
    return 0;
}

/* datatrove's FILE.ds.metadata: "tokenizer name|token size\ncount\n..." */
static uint32_t datatrove_token_size(const char *ds_path) {
    char mp[PATH_MAX], line[1024];
    if (snprintf(mp, sizeof mp, "%s.metadata", ds_path) >= (int)sizeof mp) return 0;
    FILE *fp = fopen(mp, "r");
    if (!fp) return 0;
    uint32_t ts = 0;
    if (fgets(line, sizeof line, fp)) {
        char *bar = strrchr(line, '|');
        if (bar) ts = (uint32_t)strtoul(bar + 1, NULL, 10);
    }
    fclose(fp);
    return ts == 2 || ts == 4 ? ts : 0;
}

static int open_datatrove(const char *path, tks__plist *pl, tks__foreign *f) {
    int rc;
    snprintf(f->data_path, sizeof f->data_path, "%s", path);
    if (snprintf(f->index_path, sizeof f->index_path, "%s.index", path) >= (int)sizeof f->index_path)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "path too long: %s", path);
    uint32_t tb = f->o.token_bytes ? f->o.token_bytes : datatrove_token_size(path);
    if (tb != 2 && tb != 4)
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE,
                        "%s: no %s.metadata says the token size: give --dtype u16 or u32", path, path);
    if ((rc = map_file(path, &f->data, &f->data_size))) return rc;
    if ((rc = map_file(f->index_path, &f->idx, &f->idx_size))) return rc;
    f->dtype = tb == 2 ? FD_U16 : FD_U32;
    f->token_bytes = tb;
    const char *ip = f->index_path;
    if (f->data_size % tb)
        return tks__problem(pl, TKS_ERR_TRUNCATED, path, TKS_NONE, f->data_size, TKS_NONE,
                            "%s has %zu bytes, not a multiple of the token size %u: truncated", path,
                            f->data_size, tb);
    if (f->idx_size % 8)
        return tks__problem(pl, TKS_ERR_TRUNCATED, ip, TKS_NONE, f->idx_size, TKS_NONE,
                            "%s has %zu bytes, not a multiple of 8 (uint64 document ends): truncated",
                            ip, f->idx_size);
    f->n_tokens = f->data_size / tb;
    uint64_t n = f->idx_size / 8, prev = 0;
    for (uint64_t d = 0; d < n; d++) {
        uint64_t e = tks_le64(f->idx + 8 * d);
        if (e < prev || e > f->n_tokens)
            return tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, 8 * d, d,
                                "%s: document %llu ends at token %llu (previous end %llu, %llu "
                                "tokens in %s): ends must never decrease nor pass the token count",
                                ip, (unsigned long long)d, (unsigned long long)e,
                                (unsigned long long)prev, (unsigned long long)f->n_tokens, path);
        prev = e;
    }
    if (prev != f->n_tokens)
        return tks__problem(pl, TKS_ERR_INDEX, ip, TKS_NONE, f->idx_size, n ? n - 1 : TKS_NONE,
                            "%s: the last document ends at token %llu but %s holds %llu tokens: the "
                            "index and the tokens do not belong together (or one is truncated)",
                            ip, (unsigned long long)prev, path, (unsigned long long)f->n_tokens);
    if ((rc = alloc_starts(f, n))) return rc;
    f->doc_start[0] = 0;
    for (uint64_t d = 0; d < n; d++) f->doc_start[d + 1] = tks_le64(f->idx + 8 * d);
    f->readable = 1;
    return 0;
}

int tks__foreign_open(const char *path, const tks_foreign_opts *o, tks__plist *pl, tks__foreign *f) {
    memset(f, 0, sizeof *f);
    f->o = *o;
    int rc;
    switch (o->format) {
    case TKS_FOREIGN_MEGATRON: rc = open_megatron(path, pl, f); break;
    case TKS_FOREIGN_LLMC: rc = open_llmc(path, pl, f); break;
    case TKS_FOREIGN_RAW: rc = open_raw(path, pl, f); break;
    case TKS_FOREIGN_DATATROVE: rc = open_datatrove(path, pl, f); break;
    default: return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "unknown foreign format %d", (int)o->format);
    }
    if (!rc && f->readable)
        for (uint64_t d = 0; d < f->n_docs; d++) f->empty_docs += f->doc_start[d] == f->doc_start[d + 1];
    return rc;
}
