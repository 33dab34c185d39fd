/*
 * load.h - private to tokenizer/: the loaders of each tokenizer kind from the
 * bytes of its file, already read. tks_tok_load_opts (tok.c) maps the file
 * once, tells its kind from its first bytes and hands the same bytes to the
 * loader; the public loaders (tks_spm_load, tks_bpe_load,
 * tks_bpe_load_tiktoken, tokenizer.h) map the file and call these. `path`
 * names the file in messages and in the handle; the bytes are borrowed for
 * the call. Errors and ownership: as the public loader's.
 */
#ifndef TKS_TOKENIZER_LOAD_H
#define TKS_TOKENIZER_LOAD_H

#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

int tks__spm_load_bytes(const char *path, const uint8_t *base, size_t size, tks_spm **out);
/* no_cache: 1 to parse the file whatever the tokenizer cache holds, and
 * write no cache entry (tks_tok_opts.no_cache). */
int tks__bpe_load_bytes(const char *path, const uint8_t *base, size_t size, int no_cache, tks_bpe **out);
int tks__bpe_load_tiktoken_bytes(const char *path, const uint8_t *base, size_t size, const tks_tiktoken_opts *o,
                                 int no_cache, tks_bpe **out);
/* 1 when the bytes' first line looks like a ranks file ("BASE64 RANK"). */
int tks__tiktoken_sniff_bytes(const uint8_t *base, size_t size);

#ifdef __cplusplus
}
#endif

#endif
