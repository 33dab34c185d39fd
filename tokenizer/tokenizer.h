/*
 * tokenizer.h - the tokenizer library's one public header. It holds:
 *   - sentencepiece models (tks_spm: the C++ library from Debian's
 *     libsentencepiece-dev, spm.cc) with tokshard's exact fast encoder
 *     (fastenc*.c, private), and sentencepiece training;
 *   - byte-level BPE tokenizers (tks_bpe) read from a Hugging Face
 *     tokenizer.json (bpe_load.c) or from a tiktoken ranks file with its
 *     pattern and special tokens (bpe_tiktoken.c), encoded exactly by
 *     bpe*.c, each parsed file kept in a per-user cache in compact form
 *     (bpe_cache.c) so that later loads skip the parse;
 *   - tks_tok, one handle over both kinds that the build pipeline, the
 *     trainer and the tools load and encode with (tok.c): the kind is told
 *     from the file's bytes, not its name;
 *   - the Hugging Face tokenizer.json writer (hf_tokenizer.c) and the
 *     comparison behind `tokshard verify-tokenizer` (verify.c).
 * The build pipeline (tokenize/), the trainer and interop use it; it depends
 * on common/ only.
 *
 * Thread safety: a loaded handle (tks_spm, tks_bpe, tks_tok) is immutable
 * apart from per-thread scratch it owns; its encode and decode calls may be
 * made concurrently from any number of threads. Setters (tks_*_set_*) are
 * not thread-safe: call them before encoding.
 * Errors are TKS_ERR_* codes with context in tks_last_error() (tks.h).
 */
#ifndef TKS_TOKENIZER_H
#define TKS_TOKENIZER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tks.h"
#include "common/tks_tokinfo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tks_spm tks_spm;

/* A growable id buffer. Zero-initialize, reuse across calls, free with
 * tks_ids_free. `n` ids are valid; `cap` is the allocated count. */
typedef struct tks_ids {
    uint32_t *ids;
    size_t n, cap;
} tks_ids;
void tks_ids_free(tks_ids *v);

/* Loads a sentencepiece model file (.model, serialized ModelProto).
 * Errors: TKS_ERR_IO (unreadable), TKS_ERR_TOKENIZER (not a valid model).
 * The handle is owned by the caller: tks_spm_free (accepts NULL). */
int tks_spm_load(const char *path, tks_spm **out);
void tks_spm_free(tks_spm *s);

/* Number of pieces; every id the model produces is < this. */
uint32_t tks_spm_vocab_size(const tks_spm *s);
/* Special ids, TKS_NO_ID when the model disables them. */
uint32_t tks_spm_bos_id(const tks_spm *s);
uint32_t tks_spm_eos_id(const tks_spm *s);
uint32_t tks_spm_pad_id(const tks_spm *s);
uint32_t tks_spm_unk_id(const tks_spm *s);
/* "unigram", "bpe", "word", "char" (read from the model's TrainerSpec), or "unknown". */
const char *tks_spm_model_type(const tks_spm *s);
/* XXH3-128 (canonical bytes) of the model file the handle was loaded from. */
const uint8_t *tks_spm_fingerprint(const tks_spm *s);

/*
 * Encodes `len` bytes of UTF-8 text (need not be NUL-terminated) into ids,
 * replacing out->ids[0..n). Same ids as `spm_encode --output_format=id` on
 * the same text. Errors: TKS_ERR_TOKENIZER, TKS_ERR_NOMEM.
 */
int tks_spm_encode(const tks_spm *s, const char *text, size_t len, tks_ids *out);
/* Where a long document may be cut without changing its ids (the rule and
 * its argument: tks_fast_next_cut, tokenizer/fastenc.h): BPE models with
 * remove_extra_whitespaces, add_dummy_prefix and escape_whitespaces on;
 * the first space at or after `from` that follows an ASCII letter or digit
 * the model's normalizer keeps as it is. 0: none, or the model admits no
 * cut. */
size_t tks_spm_next_cut(const tks_spm *s, const char *text, size_t len, size_t from);
/* Counts a document encoded in `parts` parts into the encoder stats
 * (cut_docs, cut_parts); thread-safe. */
void tks_spm_count_doc(const tks_spm *s, size_t parts);

/*
 * Encoders. A model loads with two: sentencepiece's, and tokshard's own
 * (tokenizer/fastenc.c: same ids, several times faster, memory bounded by the
 * longest word). tks_spm_encode uses the fast one whenever the model allows
 * it exactly: BPE or unigram, no user-defined or unused pieces, no
 * treat_whitespace_as_suffix, and no piece with U+2581 after another
 * character. Otherwise it uses sentencepiece.
 */
/* "fast" or "sentencepiece": what tks_spm_encode uses now. */
const char *tks_spm_encoder(const tks_spm *s);
/* NULL when the fast encoder is available, else why not (owned by the handle). */
const char *tks_spm_fast_unavailable(const tks_spm *s);
/* Selects the encoder of tks_spm_encode (not thread-safe: call before
 * encoding). fast = 1 when unavailable fails with TKS_ERR_TOKENIZER. */
int tks_spm_set_encoder(tks_spm *s, int fast);
/* Turns the fast encoder's word cache off (on = 0), to measure its miss
 * path; same ids either way. Not thread-safe: call before encoding. */
void tks_spm_set_word_cache(tks_spm *s, int on);
/* Always sentencepiece / always the fast encoder (TKS_ERR_ARG when unavailable). */
int tks_spm_encode_ref(const tks_spm *s, const char *text, size_t len, tks_ids *out);
int tks_spm_encode_fast(const tks_spm *s, const char *text, size_t len, tks_ids *out);
/* The fast encoder's word cache, summed over threads (zeros without it);
 * tks_encoder_stats is declared in common/tks.h. */
void tks_spm_encoder_stats(const tks_spm *s, tks_encoder_stats *st);

/* Decodes ids to text. *text is malloc'd, NUL-terminated, owned by the caller.
 * Ids >= vocab size are refused with TKS_ERR_TOKEN_RANGE. */
int tks_spm_decode(const tks_spm *s, const uint32_t *ids, size_t n, char **text, size_t *len);

/* The piece string of one id (e.g. "▁the"); NULL when id >= vocab size.
 * Owned by the handle. */
const char *tks_spm_piece(const tks_spm *s, uint32_t id);

/*
 * Byte-level BPE tokenizers read from a Hugging Face tokenizer.json (GPT-2,
 * Llama 3, Qwen 2 and the like: bpe_load.c) or from a tiktoken ranks file
 * with its pattern (bpe_tiktoken.c), encoded by bpe.c. For a tokenizer.json
 * tks_bpe_encode gives the ids of Hugging Face `tokenizers` (0.20) reading
 * the same file and encoding the same text with add_special_tokens=False
 * and special tokens not matched in the text (encode_special_tokens=True):
 * text that contains "<|endoftext|>" is encoded as those characters, never
 * as the special id (tks_bpe_set_allow_special gives tokenizers' default
 * instead). Added tokens that are not special are matched in the text, as
 * tokenizers does. For a tiktoken file the ids are tiktoken's
 * encode_ordinary (0.14) with the same ranks, pattern and special tokens.
 *
 * Supported exactly, and nothing else (anything else is refused at load,
 * naming the key):
 *   model: BPE with vocab, merges ("a b" strings or [a, b] pairs),
 *     ignore_merges; dropout, unk_token, continuing_subword_prefix and
 *     end_of_word_suffix null (or "" for the last two), byte_fallback false;
 *   normalizer: null, NFC, or a Sequence of NFC (utf8proc's Unicode data);
 *   pre_tokenizer: ByteLevel (add_prefix_space false; use_regex true: GPT-2's
 *     regex, false: none), or a Sequence of Split pre-tokenizers (a Regex or
 *     String pattern, any behavior, invert) followed by one ByteLevel. The
 *     regexes run in PCRE2 (UTF and Unicode properties, JIT when available);
 *     a pattern that can match the empty string, or that uses \h, \H or
 *     POSIX bracket classes (read otherwise by tokenizers' Oniguruma), is
 *     refused;
 *   decoder: ByteLevel; post_processor: null, ByteLevel, TemplateProcessing
 *     or a Sequence of them (never applied: encode adds no special token);
 *   truncation and padding null;
 *   added_tokens: ids in the vocab (same id) or after it; the ids of the
 *     model and the added tokens must be exactly 0 .. vocab size - 1; no
 *     two with the same text; lstrip, rstrip and single_word false (a
 *     special token with one of them is refused only when special tokens
 *     are allowed in the text).
 *
 * Thread safety: a loaded tks_bpe is immutable apart from per-thread
 * scratch it owns (and a per-token memo every thread writes the same
 * values into, with atomics); tks_bpe_encode and tks_bpe_decode may be
 * called concurrently on the same handle. Memory of an encode is O(longest
 * pre-token), time O(n log n) in a pre-token's length.
 */
typedef struct tks_bpe tks_bpe;

/*
 * Loads a tokenizer.json at `path` into *out (set to NULL on failure). The
 * handle is owned by the caller: tks_bpe_free.
 * Errors: TKS_ERR_ARG (NULL argument), TKS_ERR_IO (unreadable, not a regular
 * file), TKS_ERR_TOKENIZER (not valid JSON: the context's line is set; or a
 * component or key outside what is supported; or a merge naming a token not
 * in the vocab, duplicate ids, ids with holes: the message names the file
 * and the key), TKS_ERR_NOMEM.
 *
 * The tokenizer cache: after a parse, the handle's tables are written in a
 * compact form to $TOKSHARD_CACHE_DIR (else $XDG_CACHE_HOME/tokshard, else
 * $HOME/.cache/tokshard; TOKSHARD_CACHE_DIR=off turns it off) under the
 * file's XXH3-128; the next load of the same bytes maps that file instead
 * of parsing (a 9 MB, 128k-id tokenizer.json: 0.2 s parsed, 4 ms cached).
 * The directory is used only when it belongs to the user and no one else
 * may write it (else tks_bpe_cache_note says why, and every load parses);
 * entries are written under new random names (never through a link) and
 * read only when they are the user's, not writable by others, carry
 * checksums under the user's own key (the directory's cache.key: an entry
 * edited or from another user or machine fails them), and pass every check
 * (this build's identity, the source's fingerprint and size, every table's
 * ranges); one that fails is ignored and rewritten; failing to write one is
 * not an error. tokenizer/bpe_cache.c gives the format and the promise.
 */
int tks_bpe_load(const char *path, tks_bpe **out);
/* 1 when the handle's tables came from the tokenizer cache. */
int tks_bpe_from_cache(const tks_bpe *b);
/* Why the tokenizer cache was left unused for this load: a sentence naming
 * the directory, what is wrong with it (another user's, writable by others,
 * a key file that is not private) and what to do; "" when the cache was
 * used, written or is off. Owned by the handle; the library never prints
 * it: the caller shows it once. */
const char *tks_bpe_cache_note(const tks_bpe *b);
/* The XXH3-128 (canonical bytes) of the tables the handle encodes with, in
 * the tokenizer cache's compact form (bpe_cache.c), taken from the tables
 * themselves (a pass over them: a few milliseconds for a 128k-id
 * tokenizer): the same whether they were parsed or mapped from a cache
 * entry, for one tokshard build. Into out[16]: 1, or 0 when out of memory
 * (out unset). */
int tks_bpe_tables_xxh3(const tks_bpe *b, uint8_t out[16]);
/* Frees the handle and every thread's scratch. Accepts NULL. No encode or
 * decode may be running on it. */
void tks_bpe_free(tks_bpe *b);

/*
 * tiktoken files. A ranks file (tiktoken's format: one "BASE64 RANK" line
 * per token, ranks 0 .. n-1) holds no pattern and no special tokens, so
 * they come with it:
 *   pattern: a name (gpt2 = r50k, cl100k, o200k: tiktoken's encodings;
 *     llama3: Meta's; qwen2: Qwen 2's), a tokenizer.json whose
 *     pre_tokenizer is one Split regex then ByteLevel (or ByteLevel with its
 *     regex: GPT-2's), or any other text, taken as the regex. The regex runs
 *     in PCRE2 as the ones of a tokenizer.json, with $ at the end of the
 *     text only (Rust's reading);
 *   special_tokens: "TEXT=ID[,TEXT=ID...]"; NULL: the named encoding's
 *     (tiktoken's: gpt2 <|endoftext|>=50256; cl100k its five; o200k its
 *     two; none for llama3 and qwen2), or the added tokens of the
 *     tokenizer.json given as the pattern. Special ids come after the
 *     ranks; ids between the ranks and them, or between them, are gaps: no
 *     token (tks_bpe_is_token), refused by decode.
 */
typedef struct tks_tiktoken_opts {
    const char *pattern;
    const char *special_tokens;
} tks_tiktoken_opts;

/* The regex of a named pattern (above), or NULL. Static storage. */
const char *tks_tiktoken_pattern(const char *name);
/* 1 when the file's first line is "BASE64 RANK", as a tiktoken ranks
 * file's is; 0 otherwise or when it cannot be read. */
int tks_tiktoken_sniff(const char *path);

/*
 * Loads the ranks file at `path` with o's pattern and special tokens into
 * *out (NULL on failure; the caller frees it with tks_bpe_free).
 * Errors: TKS_ERR_ARG (no pattern; a --special-tokens item that is not
 * TEXT=ID, an id that is a rank or repeated), TKS_ERR_IO, TKS_ERR_TOKENIZER
 * (a line that is not "BASE64 RANK" or whose token is not base64, a rank
 * repeated or leaving a gap, a byte with no rank of its own, a pattern
 * PCRE2 refuses or that can match the empty string: the message names the
 * file and the line), TKS_ERR_NOMEM.
 * tks_bpe_load also loads a tiktoken tokenizer from its descriptor (below).
 */
int tks_bpe_load_tiktoken(const char *path, const tks_tiktoken_opts *o, tks_bpe **out);

/*
 * The descriptor of a tiktoken tokenizer: a JSON object {"type":
 * "tiktoken", "ranks_file": "tokenizer.tiktoken", "ranks_xxh3": its
 * XXH3-128, "pattern_name", "pattern", "special_tokens": [[TEXT, ID], ...]}
 * in its canonical bytes, which the tokenizer's fingerprint is the XXH3-128
 * of. Saved as tiktoken.json beside a copy of the ranks file named
 * tokenizer.tiktoken, it loads back (tks_bpe_load, tks_tok_load) as the
 * same tokenizer. *text is malloc'd and NUL-terminated (*len bytes without
 * the NUL; len may be NULL), owned by the caller.
 * Errors: TKS_ERR_ARG (not a tiktoken tokenizer), TKS_ERR_NOMEM.
 */
int tks_bpe_tiktoken_json(const tks_bpe *b, char **text, size_t *len);
/* The ranks file a tiktoken tokenizer was loaded from, else NULL. Owned by b. */
const char *tks_bpe_tiktoken_ranks(const tks_bpe *b);
/*
 * A tiktoken tokenizer as a Hugging Face tokenizer.json, built as
 * transformers' TikTokenConverter builds one: the ranks as the vocab (bytes
 * in ByteLevel's characters), every split of a token into two tokens as a
 * merge (ordered by the token's rank, then the halves' ranks),
 * ignore_merges, the pattern as a Split regex, the special tokens as added
 * tokens. tokenizers then gives tiktoken's ids except where two merges make
 * the same token from overlapping pairs of one piece (tiktoken merges the
 * leftmost; tokenizers the one listed first), which real tokenizers'
 * ranks make rare. *text is malloc'd, owned by the caller.
 * Errors: TKS_ERR_ARG (not a tiktoken tokenizer), TKS_ERR_NOMEM.
 */
int tks_bpe_tiktoken_hf_json(const tks_bpe *b, char **text);

/*
 * Special tokens in the text: off (0, the default), their text is encoded
 * as text; on, each is encoded as its id (Hugging Face tokenizers' default,
 * encode_special_tokens=False). Not thread-safe: call before encoding.
 * Errors: TKS_ERR_TOKENIZER when a special token sets lstrip, rstrip or
 * single_word (not reproduced): the message names it.
 */
int tks_bpe_set_allow_special(tks_bpe *b, int on);
/* Turns the word cache off (on = 0) or on, to time the miss path; same ids.
 * Not thread-safe: call before encoding. */
void tks_bpe_set_word_cache(tks_bpe *b, int on);
/* Pieces encoded and found in the word caches, and special tokens found in
 * the text, summed over the threads that encoded with b. */
void tks_bpe_encoder_stats(const tks_bpe *b, tks_encoder_stats *st);
/* The Unicode version of the regex engine's tables (PCRE2's, "14.0.0" in
 * Debian 12): code points it leaves unassigned are counted in
 * tks_encoder_stats.unassigned, since a reference on a newer Unicode
 * (tokenizers, tiktoken) may pre-tokenize them otherwise. */
const char *tks_bpe_unicode_version(void);

/* Number of ids (the model's vocab and the added tokens); every id the
 * tokenizer produces or decodes is < this. */
uint32_t tks_bpe_vocab_size(const tks_bpe *b);
/* XXH3-128 (canonical bytes) of the file the handle was loaded from, as
 * tks_spm_fingerprint. Owned by the handle. */
const uint8_t *tks_bpe_fingerprint(const tks_bpe *b);
/* 1 when `id` is an added token marked special, else 0 (also for ids out
 * of range). */
int tks_bpe_is_special(const tks_bpe *b, uint32_t id);
/* 1 when `id` is a token: below the vocabulary size and not one of the
 * gaps a tiktoken tokenizer can have between its ranks and its specials. */
int tks_bpe_is_token(const tks_bpe *b, uint32_t id);
/* The bytes id decodes to (*len of them, not NUL-terminated; len may be
 * NULL), or NULL when id is no token (tks_bpe_is_token). Owned by the handle. */
const char *tks_bpe_token_bytes(const tks_bpe *b, uint32_t id, size_t *len);

/*
 * Encodes `len` bytes of UTF-8 text (need not be NUL-terminated; text may be
 * NULL when len is 0) into ids, replacing out->ids[0..n).
 * Errors: TKS_ERR_ARG (NULL b or out), TKS_ERR_UTF8 (the text is not valid
 * UTF-8: the context's offset is the first bad byte), TKS_ERR_TOKENIZER (the
 * regex engine failed), TKS_ERR_NOMEM. On error out->n is 0.
 */
int tks_bpe_encode(const tks_bpe *b, const char *text, size_t len, tks_ids *out);
/*
 * Where a long document may be cut so that encoding the parts one by one
 * (tks_bpe_encode_part) and concatenating their ids gives exactly the ids
 * of tks_bpe_encode on the whole: the first p >= from (p >= 1) where t[p-1]
 * is an ASCII letter, t[p] is ASCII but neither a letter nor an apostrophe,
 * and no added token occurs across p; 0 when there is none, or when the
 * tokenizer admits no cut (its pre-tokenizer is not one of the five
 * patterns bpe_pretok.c matches by hand). Why the ids cannot change:
 *   - added tokens are matched leftmost-longest from the left; no token
 *     occurrence spans p (every occurrence is checked, taken or not), so
 *     the scan of t[0..p) finds the tokens the whole scan finds before p,
 *     and both scans restart at p. Tokens matched after NFC are checked on
 *     the raw bytes, and then only where the bytes within the longest such
 *     token's length of p are ASCII, which NFC leaves as they are.
 *   - NFC: t[p] is ASCII, a starter that never composes with what comes
 *     before it, so NFC(t[0..p)) NFC(t[p..)) = NFC(t); t[p-1], an ASCII
 *     letter, stays itself.
 *   - the pre-tokenizer: in the GPT-2, Llama 3, Qwen 2, cl100k and o200k
 *     patterns a letter is only ever followed, inside one match, by another
 *     letter, a combining mark (o200k) or the apostrophe of a contraction;
 *     so the match holding t[p-1] ends at p wherever the scan started, and
 *     the next starts at p. No alternative looks behind its start, and the
 *     ones that look ahead (\s+(?!\S), cl100k's \s++$) only do so over
 *     whitespace, which the letter at p-1 ends; so the part before p gets
 *     the same pieces when its text stops at p, and the part after gets the
 *     whole text's pieces from p on.
 *   - BPE works inside one piece, so each piece's ids are the same.
 * tests/test_bpe.c checks the rule by cutting real documents at every
 * candidate; a text with no such pair (one letterless run) is not cut.
 */
size_t tks_bpe_next_cut(const tks_bpe *b, const char *t, size_t len, size_t from);
/* tks_bpe_encode of one part of a document cut by tks_bpe_next_cut: the
 * same ids and errors (a TKS_ERR_UTF8 offset is within the part), but the
 * document is not counted into the encoder's unassigned_docs; the count of
 * unassigned code points in the part goes to *unassigned (may be NULL), and
 * tks_bpe_count_doc, given their sum and the number of parts, counts the
 * document once (and into the encoder stats' cut_docs and cut_parts). */
int tks_bpe_encode_part(const tks_bpe *b, const char *text, size_t len, tks_ids *out, uint64_t *unassigned);
void tks_bpe_count_doc(const tks_bpe *b, uint64_t unassigned, size_t parts);
/* tks_bpe_encode of a whole document (counted as tks_bpe_encode counts it),
 * its count of unassigned code points also into *unassigned (may be NULL):
 * the build records, per document, what the encoder's
 * statistics only sum. */
int tks_bpe_encode_doc(const tks_bpe *b, const char *text, size_t len, tks_ids *out, uint64_t *unassigned);
/* The reference encoder: the same pre-tokenizer (PCRE2), then each piece
 * through the plain rule (after every merge all pairs looked up again, the
 * lowest rank and leftmost merged: O(n^2) in a piece up to 64 KiB; longer
 * pieces through the heap of tks_bpe_encode), without the word cache. Same
 * ids as tks_bpe_encode, which verify-tokenizer and the fuzzer check; much
 * slower. Errors as tks_bpe_encode. */
int tks_bpe_encode_ref(const tks_bpe *b, const char *text, size_t len, tks_ids *out);

/*
 * Decodes ids to bytes as tokenizers' ByteLevel decoder does: each token's
 * characters through GPT-2's byte table, or, for a token with a character
 * outside it (most special tokens), its UTF-8 text. The result need not be
 * valid UTF-8 (tokenizers then replaces bad sequences with U+FFFD).
 * *text is malloc'd, NUL-terminated and owned by the caller; *len (len may
 * be NULL) is its length without the NUL.
 * Errors: TKS_ERR_ARG, TKS_ERR_TOKEN_RANGE (an id >= vocab size, or a gap:
 * the context's offset is its position), TKS_ERR_NOMEM.
 */
int tks_bpe_decode(const tks_bpe *b, const uint32_t *ids, size_t n, char **text, size_t *len);

/*
 * One handle over every kind, for the pipeline (build, audit, cat, inspect,
 * import, the trainer): tks_tok_load reads a sentencepiece model, a
 * byte-level BPE tokenizer.json, a tiktoken ranks file (with a pattern) or
 * tokshard's tiktoken descriptor, told apart by the file's content, never
 * by its name. For the byte-level kinds the BOS, EOS, pad and unk ids come
 * from the tokenizer_config.json beside the file (transformers' "bos_token"
 * etc.), TKS_NO_ID when it or the key is absent; a tiktoken tokenizer
 * without one has <|endoftext|> as its EOS when that is one of its special
 * tokens. Thread safety as the kind's.
 */
typedef struct tks_tok tks_tok;
#define TKS_TOK_BYTE_LEVEL_BPE "byte-level-bpe" /* model_type of the byte-level kinds */

/* How a tokenizer is loaded: a tiktoken ranks file's pattern and special
 * tokens (tks_tiktoken_opts; refused for the other kinds), whether special
 * tokens' text becomes their ids (tks_bpe_set_allow_special; refused for
 * sentencepiece models), and no_cache: 1 to parse a byte-level tokenizer
 * from its file whatever the tokenizer cache holds, reading and writing no
 * cache entry (tks_bpe_load), as an audit that must not trust what earlier
 * runs left does; tks_bpe_from_cache is then 0 (a sentencepiece model has
 * no cache). NULL or zeroed: the defaults. */
typedef struct tks_tok_opts {
    const char *pattern;
    const char *special_tokens;
    int allow_special;
    int no_cache;
} tks_tok_opts;

/* Loads `path` into *out (NULL on failure; owned by the caller: tks_tok_free).
 * Errors: tks_spm_load's, tks_bpe_load's or tks_bpe_load_tiktoken's;
 * TKS_ERR_ARG for options the kind does not take; TKS_ERR_TOKENIZER for a
 * tokenizer_config.json that does not parse or names a token that is not one
 * of the tokenizer's special tokens (the message names both files). */
int tks_tok_load(const char *path, tks_tok **out);
int tks_tok_load_opts(const char *path, const tks_tok_opts *o, tks_tok **out);
/* The tokenizer a dataset or checkpoint directory keeps: dir/tokenizer.model,
 * dir/tokenizer.json or dir/tiktoken.json, the first that exists, into
 * path[cap]. Errors: TKS_ERR_TOKENIZER (none), TKS_ERR_ARG (too long). */
int tks_tok_find(const char *dir, char *path, size_t cap);
/* Writes the tokenizer's files into the directory `dir`, each crash-safely
 * and only where dir has no file of that name yet: the file it was loaded
 * from (`src`) as tks_tok_file_name, or for a tiktoken tokenizer its
 * descriptor and its ranks as tokenizer.tiktoken; and the
 * tokenizer_config.json it was loaded with. tks_tok_load of
 * dir/tks_tok_file_name then gives the same tokenizer (same fingerprint).
 * Errors: TKS_ERR_IO, TKS_ERR_NOSPACE, TKS_ERR_NOMEM. */
int tks_tok_save(const tks_tok *t, const char *src, const char *dir);
/* 1 when id is one of the tokenizer's tokens (below its vocabulary size and
 * not a tiktoken gap). */
int tks_tok_is_token(const tks_tok *t, uint32_t id);
/* 1 when id is a special token: an added token marked special (byte-level),
 * or the BOS, EOS or pad of a sentencepiece model. */
int tks_tok_is_special(const tks_tok *t, uint32_t id);
void tks_tok_free(tks_tok *t);
/* The kind's own handle, or NULL when the tokenizer is of the other kind. */
tks_spm *tks_tok_spm(const tks_tok *t);
tks_bpe *tks_tok_bpe(const tks_tok *t);
uint32_t tks_tok_vocab_size(const tks_tok *t);
uint32_t tks_tok_bos_id(const tks_tok *t); /* TKS_NO_ID when none */
uint32_t tks_tok_eos_id(const tks_tok *t);
uint32_t tks_tok_pad_id(const tks_tok *t);
uint32_t tks_tok_unk_id(const tks_tok *t);
/* "bpe", "unigram", "word", "char" (sentencepiece) or TKS_TOK_BYTE_LEVEL_BPE */
const char *tks_tok_model_type(const tks_tok *t);
/* XXH3-128 of the file (16 bytes, owned by the handle) */
const uint8_t *tks_tok_fingerprint(const tks_tok *t);
/* The name a dataset or checkpoint keeps its copy under: "tokenizer.model",
 * "tokenizer.json" or (tiktoken) "tiktoken.json". */
const char *tks_tok_file_name(const tks_tok *t);
/* The tokenizer_config.json that gave a tokenizer.json's special ids, or NULL. */
const char *tks_tok_config_path(const tks_tok *t);
/* Long documents on several threads: tks_bpe_next_cut or, for a
 * sentencepiece model, tks_spm_next_cut (0: no cut admitted); parts encoded
 * with tks_tok_encode_part, the document then counted once with
 * tks_tok_count_doc(t, sum of the parts' *unassigned, number of parts). */
size_t tks_tok_next_cut(const tks_tok *t, const char *text, size_t len, size_t from);
int tks_tok_encode_part(const tks_tok *t, const char *text, size_t len, tks_ids *out, uint64_t *unassigned);
void tks_tok_count_doc(const tks_tok *t, uint64_t unassigned, size_t parts);
/* tks_tok_encode, and the document's code points that a byte-level
 * encoder's Unicode leaves unassigned into *unassigned (tks_bpe_encode_doc;
 * always 0 for a sentencepiece model; may be NULL). */
int tks_tok_encode_doc(const tks_tok *t, const char *text, size_t len, tks_ids *out, uint64_t *unassigned);
/* tks_spm_encode / tks_bpe_encode, tks_spm_decode / tks_bpe_decode */
int tks_tok_encode(const tks_tok *t, const char *text, size_t len, tks_ids *out);
int tks_tok_decode(const tks_tok *t, const uint32_t *ids, size_t n, char **text, size_t *len);
/* The token's text for display into buf (cap bytes, NUL-terminated; a BPE
 * token's control bytes as \xNN); NULL when id is out of range. */
const char *tks_tok_piece(const tks_tok *t, uint32_t id, char *buf, size_t cap);
/* The sentencepiece encoder choice (tks_spm_set_encoder); a tokenizer.json
 * refuses fast = 0 (TKS_ERR_ARG: it has one exact encoder, tokshard's). */
int tks_tok_set_encoder(tks_tok *t, int fast);
/* "fast" or "sentencepiece" (tks_spm_encoder), or TKS_TOK_BYTE_LEVEL_BPE */
const char *tks_tok_encoder(const tks_tok *t);
const char *tks_tok_fast_unavailable(const tks_tok *t); /* NULL for a tokenizer.json */
/* The word caches' hits and the special tokens found in the text. */
void tks_tok_encoder_stats(const tks_tok *t, tks_encoder_stats *st);
/* tks_bpe_cache_note of a byte-level tokenizer; "" for a sentencepiece
 * model (no cache). Owned by the handle. */
const char *tks_tok_cache_note(const tks_tok *t);

/*
 * Writes the model at `model_path` as a Hugging Face fast tokenizer into the
 * existing directory `dir`: tokenizer.json (normalizer with the model's
 * precompiled charsmap and sentencepiece's whitespace rules, Metaspace
 * pre-tokenizer, BPE with the merges transformers' converter derives or
 * Unigram with the scores, byte fallback, BOS template, decoder) and
 * tokenizer_config.json (special tokens; class LlamaTokenizer, so that
 * use_fast=False gives transformers' sentencepiece-backed tokenizer). When
 * dir/config.json exists (a checkpoint), its bos_token_id, eos_token_id and
 * pad_token_id are set from the model (null when absent). Every file is
 * written crash-safely. Choices and their sources: docs/INTEROP.md.
 * Errors: TKS_ERR_IO, TKS_ERR_TOKENIZER (not a sentencepiece model, or a
 * word/char model, or one without whitespace escaping: none has a fast
 * tokenizer equivalent), TKS_ERR_MANIFEST (config.json not a JSON object),
 * TKS_ERR_NOSPACE, TKS_ERR_NOMEM.
 */
int tks_hf_tokenizer_write(const char *model_path, const char *dir);

/* A sentencepiece model converted once (tks_hf_spm_convert) for writing
 * as a Hugging Face fast tokenizer as often as needed (each checkpoint). */
typedef struct tks_hf_spm tks_hf_spm;

/*
 * Converts the model at `model_path` as tks_hf_tokenizer_write does, keeping
 * tokenizer.json's and tokenizer_config.json's text and the bos/eos/pad ids
 * in memory; the model file is not read again. *out is owned by the caller
 * (tks_hf_spm_free) and NULL on error. Errors: tks_hf_tokenizer_write's
 * TKS_ERR_IO, TKS_ERR_TOKENIZER (no fast equivalent), TKS_ERR_NOMEM.
 */
int tks_hf_spm_convert(const char *model_path, tks_hf_spm **out);

/* Writes c into the existing directory `dir` as tks_hf_tokenizer_write does
 * (config.json patched when present). Errors: TKS_ERR_IO, TKS_ERR_NOSPACE,
 * TKS_ERR_MANIFEST, TKS_ERR_NOMEM. */
int tks_hf_spm_write(const tks_hf_spm *c, const char *dir);

/* Frees what tks_hf_spm_convert made. Accepts NULL. */
void tks_hf_spm_free(tks_hf_spm *c);

/* Training a new model. */
/*
 * Writes a byte-level BPE tokenizer as a Hugging Face fast tokenizer into the
 * existing directory `dir`: json_path (t's file) copied as tokenizer.json,
 * the tokenizer_config.json t was loaded with copied beside it (without one,
 * a minimal one naming PreTrainedTokenizerFast), and, when dir/config.json
 * exists (a checkpoint), its bos/eos/pad_token_id set from t. A file that is
 * already dir's is left as it is. Errors: TKS_ERR_IO, TKS_ERR_NOSPACE,
 * TKS_ERR_MANIFEST (config.json not a JSON object), TKS_ERR_NOMEM.
 */
int tks_hf_bpe_write(const tks_tok *t, const char *json_path, const char *dir);

typedef struct tks_spm_train_opts {
    const char *model_prefix;     /* writes PREFIX.model and PREFIX.vocab */
    const char *model_type;       /* "bpe" or "unigram" (also "word", "char") */
    uint32_t vocab_size;
    int byte_fallback;            /* 1: unknown UTF-8 bytes become <0xNN> pieces */
    double character_coverage;    /* 0 = sentencepiece default (0.9995) */
    uint64_t input_sentence_size; /* sample at most this many sentences; 0 = all */
    uint32_t max_sentence_length; /* bytes; longer sentences are skipped; 0 = default 4192 */
    int threads;                  /* 0 = 1. Unigram models depend on it, and every model
                                   * records it: fix it for reproducible models */
    uint32_t seed;                /* passed to SetRandomGeneratorSeed; sentencepiece 0.1.97's
                                   * sentence sampling ignores it (fixed internal seed) */
} tks_spm_train_opts;

/* Supplies the next training sentence: set *text and *len and return 1, or
 * return 0 at the end, or a negative TKS_ERR_* code to abort training. */
typedef int (*tks_sentence_fn)(void *ctx, const char **text, size_t *len);

/* Trains a model from the sentences `next` yields. Errors: TKS_ERR_ARG,
 * TKS_ERR_TOKENIZER (sentencepiece refused: its message is in the context),
 * or the code the callback returned. */
int tks_spm_train(const tks_spm_train_opts *opts, tks_sentence_fn next, void *ctx);

/* The fast encoder checked against its reference (tokshard verify-tokenizer):
 * sentencepiece for a model, tks_bpe_encode_ref for a byte-level tokenizer. */
typedef struct tks_spm_compare {
    uint64_t docs, bytes;       /* documents encoded by both, and their bytes (the
                                 * differing one included) */
    double seconds_ref;         /* wall time in sentencepiece, seconds (one thread) */
    double seconds_fast;        /* wall time in the fast encoder, seconds */
    int differ;                 /* 1: the last document encoded gave different ids */
    size_t first_diff;          /* with differ: the index of the first differing id */
    tks_ids ref, fast;          /* the last document's ids from each encoder */
} tks_spm_compare;

/*
 * Encodes each document `next` yields (as tks_sentence_fn: 1 with a text, 0
 * at the end, or a negative code) with both encoders of s and compares the
 * ids, until the first document whose ids differ (out->differ = 1; it is the
 * last document `next` yielded) or the end. *out is overwritten; its id
 * buffers are owned by the caller: tks_spm_compare_free, also after an
 * error. Nothing is printed. Returns 0 whether or not the ids differ.
 * Errors: TKS_ERR_ARG (no fast encoder for this model:
 * tks_spm_fast_unavailable says why), TKS_ERR_TOKENIZER, TKS_ERR_NOMEM, or
 * the code `next` returned.
 */
int tks_spm_compare_docs(const tks_spm *s, tks_sentence_fn next, void *ctx, tks_spm_compare *out);
/* As tks_spm_compare_docs for either kind: a sentencepiece model's fast
 * encoder against sentencepiece, a byte-level tokenizer's encoder against
 * its reference (tks_bpe_encode_ref). Errors: tks_spm_compare_docs's. */
int tks_tok_compare_docs(const tks_tok *t, tks_sentence_fn next, void *ctx, tks_spm_compare *out);
/* Frees the id buffers of c (not c itself). Accepts NULL. */
void tks_spm_compare_free(tks_spm_compare *c);

/* The manifest's tokenizer record (tks_tokinfo.h) of a dataset built or
 * imported with tk, whose copy is stored as tks_tok_file_name(tk)
 * ("tokenizer.model", "tokenizer.json" or "tiktoken.json"): name,
 * fingerprint, vocabulary, model type, special ids, the ranges of ids no
 * text produces and, for a byte-level tokenizer, the digest of the tables
 * it encodes with (tks_bpe_tables_xxh3). tk is borrowed; no error. */
void tks_tokenizer_record(const tks_tok *tk, tks_tokenizer_info *out);

/* ---------------------------------------------------------------------------
 * Training byte-level BPE
 *
 * A pre-tokenizer without a vocabulary (tks_pretok, bpe_pieces.c) cuts text
 * into the pieces tks_bpe_encode would cut it into under the same pattern;
 * the trainer (tks_bpe_trainer, bpe_train.c) takes the distinct pieces
 * ("words") with their counts and learns the merges as Hugging Face
 * tokenizers' BpeTrainer (tokenizers 0.23.3, src/models/bpe/trainer.rs)
 * does with ByteLevel's 256-character initial alphabet; bpe_train_out.c
 * writes the result as tokenizer.json, tokenizer_config.json and a tiktoken
 * ranks file. The counting of the words over inputs of any size is the
 * tokenize layer's (tks_bpe_train, tokenize/tokenize.h).
 * ------------------------------------------------------------------------- */
typedef struct tks_pretok tks_pretok;

/* A pre-tokenizer for `pattern`: a name (gpt2: tokenizers' ByteLevel regex,
 * GPT-2's; llama3, cl100k, o200k, qwen2: tks_tiktoken_pattern's) or a
 * regex, read as a tokenizer.json's Split regex is (tks_bpe_load's rules:
 * PCRE2, refusing what Oniguruma reads otherwise and patterns that match
 * the empty string). *out is the caller's: tks_pretok_free (accepts NULL).
 * Errors: TKS_ERR_ARG (NULL or empty pattern), TKS_ERR_TOKENIZER (a regex
 * refused: the message says why), TKS_ERR_NOMEM. */
int tks_pretok_open(const char *pattern, tks_pretok **out);
void tks_pretok_free(tks_pretok *p);
/* The pattern's name, or NULL for a regex; and the regex the pieces follow.
 * Owned by p. */
const char *tks_pretok_name(const tks_pretok *p);
const char *tks_pretok_regex(const tks_pretok *p);
/* 1 when the pattern is one the hand matchers cut (bpe_pretok.c). */
int tks_pretok_hand_matched(const tks_pretok *p);

/* Receives pieces in runs: piece k of the run is text[start..ends[0]) for
 * k = 0, else text[ends[k-1]..ends[k]); n >= 1. Nonzero return stops the
 * cut and is returned by tks_pretok_pieces. */
typedef int (*tks_pretok_fn)(void *ctx, const char *text, size_t start, const size_t *ends, size_t n);

/*
 * Cuts text[0..len) (valid UTF-8; the caller checks) into its pieces, in
 * order, every byte in exactly one piece (matches of the regex and the text
 * between them), calling fn with runs of them. Thread-safe: any number of
 * threads may cut with one handle (each has its own PCRE2 scratch, kept by
 * the handle). Errors: TKS_ERR_TOKENIZER (the regex backtracks without
 * bound, or PCRE2 failed), TKS_ERR_NOMEM, or fn's return.
 */
int tks_pretok_pieces(const tks_pretok *p, const char *text, size_t len, tks_pretok_fn fn, void *ctx);
/* Where a long text may be cut so that the pieces of the parts are the
 * pieces of the whole: tks_bpe_next_cut's rule (tokenizer.h above), for the
 * hand-matched patterns; 0 when there is none or the pattern is a regex. */
size_t tks_pretok_next_cut(const tks_pretok *p, const char *t, size_t len, size_t from);

typedef struct tks_bpe_train_cfg {
    uint32_t vocab_size;         /* ids in all: the special tokens, the 256 byte tokens and the
                                  * merges' tokens (BpeTrainer's vocab_size), >= 1 */
    uint64_t min_frequency;      /* training stops at the first pair seen fewer times (its
                                  * min_frequency; 0 and 1: none) */
    const char *const *specials; /* special tokens' texts, ids 0.. in this order, a repeated
                                  * one once (its special_tokens); borrowed during create */
    size_t n_specials;
    int threads;                 /* threads of the merge steps; 0 = 1. The result does not
                                  * depend on it */
} tks_bpe_train_cfg;

typedef struct tks_bpe_trainer tks_bpe_trainer;

/* A trainer with c's settings (copied), holding no word yet. The caller
 * frees it: tks_bpe_trainer_free (accepts NULL). Errors: TKS_ERR_ARG
 * (vocab_size 0, a special token empty or not valid UTF-8, over 2^31 ids),
 * TKS_ERR_NOMEM. */
int tks_bpe_trainer_create(const tks_bpe_train_cfg *c, tks_bpe_trainer **out);
void tks_bpe_trainer_free(tks_bpe_trainer *t);

/* The bytes of memory the trainer holds at most, measured on real text
 * with a margin, for `words` distinct words of two bytes or more holding
 * `bytes` bytes in all (single bytes are left out: they hold no pair), a
 * vocabulary of vocab_size ids and `threads` threads: what tks_bpe_train
 * compares with its memory limit. */
uint64_t tks_bpe_trainer_memory(uint64_t words, uint64_t bytes, uint32_t vocab_size, int threads);

/* Room for `words` words of `bytes` bytes in all, allocated now (the
 * arrays otherwise grow by doubling). 0 or TKS_ERR_NOMEM. */
int tks_bpe_trainer_reserve(tks_bpe_trainer *t, uint64_t words, uint64_t bytes);

/* Adds a word: a piece's bytes w[0..len) and how often it was seen
 * (count >= 1). Each distinct word once, in any order: the result is the
 * same for every order. Words of one byte are counted and left out (every
 * byte is a token anyway). Errors: TKS_ERR_ARG (count 0, or more than
 * 2^32 - 1 words), TKS_ERR_NOMEM. */
int tks_bpe_trainer_add(tks_bpe_trainer *t, const char *w, size_t len, uint64_t count);

/* Progress of the merge loop: `merges` of at most `target` done. */
typedef void (*tks_bpe_train_progress_fn)(void *ctx, uint64_t merges, uint64_t target);

/*
 * Learns the merges from the words added, as BpeTrainer::do_train does:
 * ids 0.. the special tokens, then the 256 byte tokens by the code point
 * GPT-2's bytes_to_unicode gives each; every adjacent pair's count is the
 * sum of the counts of the words it occurs in (64-bit here; tokenizers'
 * i32 wraps past 2^31); a max-heap of (count, pair) entries, the pair of
 * the lowest (left id, right id) first among equal counts, each entry
 * holding the words it was found in; a popped entry whose count is stale is
 * pushed back with the current count; training stops at vocab_size ids, an
 * empty heap, or a count below 1 or min_frequency. A merge whose token is
 * already in the vocabulary (two merges making one string) makes no new id,
 * as BpeTrainer does; the merged pair's own count is left as it was, and
 * only the words of the popped entry are merged. progress (may be NULL) is
 * called every 1,000 merges; stop (may be NULL) set nonzero ends the loop
 * with TKS_ERR_INTERRUPTED. Once: a second call fails with TKS_ERR_ARG.
 * Errors: TKS_ERR_ARG, TKS_ERR_INTERRUPTED, TKS_ERR_NOMEM.
 */
int tks_bpe_trainer_run(tks_bpe_trainer *t, tks_bpe_train_progress_fn progress, void *ctx,
                        volatile sig_atomic_t *stop);

/* After tks_bpe_trainer_run: the number of ids, and of merges as
 * tokenizers saves them (a pair merged twice is kept at its last rank). */
uint32_t tks_bpe_trainer_vocab_size(const tks_bpe_trainer *t);
uint64_t tks_bpe_trainer_merges(const tks_bpe_trainer *t);
/* The most bytes the trainer's tables held (words, pair index, counts,
 * heap, vocabulary, the threads' step tables; sampled every 64 merges). */
uint64_t tks_bpe_trainer_peak(const tks_bpe_trainer *t);

/* How tks_bpe_trainer_write writes the tokenizer. */
typedef struct tks_bpe_write_opts {
    const char *pattern;        /* the tks_pretok name or regex the words were cut with */
    int ignore_merges;          /* the BPE model's ignore_merges */
    const char *bos_token, *eos_token, *pad_token; /* special tokens named in
                                 * tokenizer_config.json, or NULL */
    int tiktoken;               /* 1: also tokenizer.tiktoken and tiktoken.json */
} tks_bpe_write_opts;

/*
 * Writes the trained tokenizer into the directory open as `dirfd` (`dir`
 * names it in messages), each file crash-safely through that descriptor
 * (tks_write_file_at: never through a link planted at a file's name):
 * tokenizer.json (the special tokens as added tokens, no
 * normalizer, the pre-tokenizer ByteLevel with its regex for gpt2, else a
 * Sequence of Split(pattern, Isolated) and ByteLevel without regex, a BPE
 * model with the vocabulary by id and the merges by rank, a ByteLevel
 * decoder), tokenizer_config.json (PreTrainedTokenizerFast, the named BOS,
 * EOS and pad tokens, the added tokens), and with o->tiktoken the ranks
 * file tokenizer.tiktoken (rank = id - number of special tokens) with its
 * descriptor tiktoken.json (the pattern, the special tokens after the
 * ranks: tiktoken ids are shifted by that number). Errors: TKS_ERR_ARG
 * (not trained; a BOS, EOS or pad token that is not a special token; a
 * pattern cl100k's rewrite cannot carry), TKS_ERR_IO, TKS_ERR_NOSPACE,
 * TKS_ERR_NOMEM.
 */
int tks_bpe_trainer_write(const tks_bpe_trainer *t, const tks_bpe_write_opts *o, int dirfd, const char *dir);

#ifdef __cplusplus
}
#endif
#endif /* TKS_TOKENIZER_H */
