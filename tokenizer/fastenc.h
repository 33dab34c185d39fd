/*
 * fastenc.h - tokshard's own encoder for sentencepiece models (private to
 * the tokenizer library; the public entry points are in tokenizer.h). It reads the
 * serialized ModelProto itself and produces exactly the ids sentencepiece
 * 0.1.97 produces, for BPE and unigram models whose pieces never join a word
 * to the whitespace before the next one (checked at load, see
 * tks_fast_load). Text is normalized as the model's NormalizerSpec says
 * (precompiled charsmap, add_dummy_prefix, remove_extra_whitespaces,
 * escape_whitespaces), cut into words at each U+2581 that follows another
 * character (and between ASCII letters and punctuation where no piece joins
 * them), and each word is encoded on its own: BPE words through a
 * per-thread cache, unigram words by Viterbi carrying the running path score
 * so that float rounding matches a whole-text Viterbi. Memory is O(longest
 * word), whatever the text's length.
 *
 * Thread safety: a loaded tks_fast is immutable apart from its per-thread
 * caches; tks_fast_encode may run concurrently on one handle.
 */
#ifndef TKS_FASTENC_H
#define TKS_FASTENC_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tks_fast tks_fast;

/*
 * Builds the fast encoder from a serialized ModelProto that sentencepiece
 * has already loaded. Returns:
 *   0  *out set: the fast path encodes this model exactly;
 *   1  *out NULL, a one-line reason in why[0..why_len): the model is outside
 *      what the fast path reproduces exactly (sentencepiece must encode);
 *   2  *out set and the reason in `why`: a BPE model with user-defined
 *      symbols; the handle must not encode (tks_fast_seg_only is 1), but
 *      tks_fast_next_cut works;
 *   TKS_ERR_NOMEM.
 */
int tks_fast_load(const uint8_t *proto, size_t n, tks_fast **out, char *why, size_t why_len);
/* 1 for a handle tks_fast_load returned 2 for (cuts only, no encoding). */
int tks_fast_seg_only(const tks_fast *f);

/*
 * Where sentencepiece's input may be cut without changing its ids: the first
 * position p >= from (p > 0) holding a space that follows an ASCII letter or
 * digit, or 0 when there is none or the model admits no cut. Encoding
 * t[0..p) and t[p..len) separately and concatenating the ids gives the ids of
 * t, for BPE models with add_dummy_prefix, remove_extra_whitespaces and
 * escape_whitespaces on, U+2581 a normal piece, no piece with U+2581 after
 * another character, no user-defined symbol containing a space, and a space
 * and the letter before it that normalize to themselves whatever follows:
 *   - normalization: the first part ends with the letter (no trailing space
 *     to drop); the second starts with spaces, which sentencepiece drops as
 *     leading whitespace before adding the dummy U+2581, where the whole text
 *     has the one U+2581 that the collapsed run of spaces becomes; both then
 *     continue identically (in the whole text the spaces after the first are
 *     dropped as repeated whitespace);
 *   - BPE: no merge spans a U+2581 that follows another character, and
 *     merges are independent on either side; the second part starts with
 *     U+2581, a known piece, so no unknown piece merges across the cut.
 * Unigram models get no cut: the Viterbi path score is a float sum over the
 * whole text, and restarting it at a cut can change a near tie.
 */
size_t tks_fast_next_cut(const tks_fast *f, const char *t, size_t len, size_t from);
void tks_fast_free(tks_fast *f);

/* Encodes like tks_spm_encode. Returns 0, or 1 (out->n = 0) when this text
 * must go to sentencepiece instead (the model's charsmap produced bytes that
 * are not valid UTF-8, which sentencepiece's own charsmaps never do).
 * Errors: TKS_ERR_NOMEM, TKS_ERR_ARG. */
int tks_fast_encode(const tks_fast *f, const char *text, size_t len, tks_ids *out);

/* Per-thread cache counters summed over the threads that used `f`.
 * bound_misses: unigram words found in the cache but decoded again, because
 * float rounding at the current path score could change the cached path
 * (fastenc.c explains the bound). */
typedef struct tks_fast_stats {
    uint64_t words, word_hits, bytes, hit_bytes, bound_misses;
} tks_fast_stats;
void tks_fast_get_stats(const tks_fast *f, tks_fast_stats *st);

uint32_t tks_fast_n_pieces(const tks_fast *f);
/* Turns the word cache off (on = 0) or on; not thread-safe. */
void tks_fast_set_cache(tks_fast *f, int on);
/* Model kind: "bpe" or "unigram". */
const char *tks_fast_kind(const tks_fast *f);

#ifdef __cplusplus
}
#endif
#endif /* TKS_FASTENC_H */
