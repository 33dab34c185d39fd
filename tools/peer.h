/*
 * The Python reference of a byte-level BPE tokenizer, for verify-tokenizer:
 * Hugging Face tokenizers for a tokenizer.json, tiktoken for a tiktoken
 * ranks file, run as a child process (tools/verify_peer.py, compiled in)
 * and asked for the ids of one document at a time over pipes.
 */
#ifndef TKS_TOOLS_PEER_H
#define TKS_TOOLS_PEER_H

#include "tokenizer/tokenizer.h"

typedef struct tks_peer tks_peer;

/*
 * Starts `python -c SCRIPT ...` for byte-level BPE tokenizer t loaded from
 * `path` (the tokenizer.json, or the tiktoken ranks file with t's pattern
 * and special tokens). python is run by execvp (no shell): a path, or a
 * name looked up in PATH. On success *out is the peer (owned by the caller:
 * tks_peer_stop) and tks_peer_name gives the library and its version.
 * Errors: TKS_ERR_ARG when t is not byte-level BPE; TKS_ERR_TOKENIZER when
 * python cannot be run, exits, or cannot import the library or read the
 * tokenizer (the message gives python's reason); TKS_ERR_NOMEM.
 */
int tks_peer_start(const char *python, const tks_tok *t, const char *path, tks_peer **out);

/* "tokenizers 0.23.3", "tiktoken 0.14.0". Owned by p. */
const char *tks_peer_name(const tks_peer *p);

/*
 * The peer's ids of text[0..len) into out (replacing its contents).
 * Returns 0, 1 when the peer did not take the text because it is not UTF-8
 * (out is left empty), or TKS_ERR_TOKENIZER when the peer stopped or
 * answered out of protocol (the message says which), TKS_ERR_NOMEM.
 */
int tks_peer_encode(tks_peer *p, const char *text, size_t len, tks_ids *out);

/* Closes the pipes, waits for the child and frees p (NULL is fine). */
void tks_peer_stop(tks_peer *p);

#endif
