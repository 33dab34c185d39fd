/*
 * spm.cc - tokshard's C API over sentencepiece 0.1.97 (see tokenizer.h). The one
 * C++ file of the project: every entry point catches C++ exceptions and
 * turns them into TKS_ERR_* codes, so nothing throws across the C boundary.
 */
#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/fastenc.h"

#include <atomic>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <exception>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <xxhash.h>



namespace spm = sentencepiece;

struct tks_spm {
    spm::SentencePieceProcessor sp;
    std::vector<std::string> pieces; /* (V) piece strings, for tks_spm_piece */
    uint32_t vocab_size;
    uint32_t bos_id, eos_id, pad_id, unk_id; /* TKS_NO_ID when disabled */
    const char *model_type;                  /* static string */
    uint8_t fingerprint[16];                 /* XXH3-128, canonical bytes */
    tks_fast *fast = nullptr;                /* tokshard's exact encoder, or NULL */
    tks_fast *cuts = nullptr;                /* a cut analysis only (user-defined symbols) */
    char fast_why[256] = "";                 /* why fast is NULL */
    bool use_fast = false;                   /* tks_spm_encode goes through `fast` */
    mutable std::atomic<uint64_t> cut_docs{0}, cut_parts{0}; /* tks_spm_count_doc */
    ~tks_spm() {
        tks_fast_free(fast);
        tks_fast_free(cuts);
    }
};

/* Maps the exception being handled to a code, with `what` naming the call. */
static int fail_exception(const char *file, const char *what) {
    try {
        throw;
    } catch (const std::bad_alloc &) {
        return tks_fail(TKS_ERR_NOMEM, file, TKS_NONE, TKS_NONE, "out of memory in %s", what);
    } catch (const std::exception &e) {
        return tks_fail(TKS_ERR_TOKENIZER, file, TKS_NONE, TKS_NONE, "sentencepiece failed in %s: %s",
                        what, e.what());
    } catch (...) {
        return tks_fail(TKS_ERR_TOKENIZER, file, TKS_NONE, TKS_NONE,
                        "sentencepiece failed in %s: unknown exception", what);
    }
}

static uint32_t special_id(int id) { return id < 0 ? TKS_NO_ID : (uint32_t)id; }

/* ---------------------------------------------------------------------------
 * model_type from the serialized ModelProto. Debian ships no
 * sentencepiece_model.pb.h, so this walks the protobuf wire format by hand
 * (https://protobuf.dev/programming-guides/encoding/). The bytes are untrusted:
 * every read is bounds-checked.
 * ------------------------------------------------------------------------- */

/* Reads a base-128 varint at *p (< end); false when truncated or > 10 bytes. */
static bool pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return false;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/*
 * Calls fn(field, wire_type, value, data, len) for each field of the message
 * in [p, end): value for varints, (data, len) for length-delimited fields.
 * Returns false on malformed bytes (truncation, groups, bad wire type).
 */
template <typename Fn> static bool pb_walk(const uint8_t *p, const uint8_t *end, Fn fn) {
    while (p < end) {
        uint64_t key, v = 0;
        if (!pb_varint(&p, end, &key)) return false;
        uint64_t field = key >> 3;
        unsigned wt = (unsigned)(key & 7);
        const uint8_t *data = nullptr;
        size_t len = 0;
        switch (wt) {
        case 0: /* varint */
            if (!pb_varint(&p, end, &v)) return false;
            break;
        case 1: /* 64-bit */
            if (end - p < 8) return false;
            p += 8;
            break;
        case 2: /* length-delimited */
            if (!pb_varint(&p, end, &v) || v > (uint64_t)(end - p)) return false;
            data = p;
            len = (size_t)v;
            p += len;
            break;
        case 5: /* 32-bit */
            if (end - p < 4) return false;
            p += 4;
            break;
        default: /* 3/4: deprecated groups (unused by sentencepiece), 6/7: invalid */
            return false;
        }
        if (field == 0) return false;
        fn(field, wt, v, data, len);
    }
    return true;
}

/*
 * Field numbers from sentencepiece_model.proto: ModelProto.trainer_spec = 2
 * (message), TrainerSpec.model_type = 3 (enum ModelType: UNIGRAM 1, BPE 2,
 * WORD 3, CHAR 4; [default = UNIGRAM]). Mirrors proto2 parsing, which is what
 * sentencepiece itself acts on: the last valid value wins, values outside the
 * enum are kept as unknown fields and do not change it, and an absent field
 * reads as the default. "unknown" only for bytes that do not parse.
 */
static const char *model_type_of(const uint8_t *buf, size_t n) {
    static const char *const names[] = {"unknown", "unigram", "bpe", "word", "char"};
    int type = 1;
    bool ok = true;
    bool top = pb_walk(buf, buf + n, [&](uint64_t f, unsigned wt, uint64_t, const uint8_t *d,
                                         size_t len) {
        if (f != 2 || wt != 2) return;
        ok = ok && pb_walk(d, d + len, [&](uint64_t f2, unsigned wt2, uint64_t v, const uint8_t *,
                                           size_t) {
            if (f2 == 3 && wt2 == 0 && v >= 1 && v <= 4) type = (int)v;
        });
    });
    return top && ok ? names[type] : names[0];
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */

/* A serialized protobuf message is at most 2 GiB - 1 (protobuf's limit). */
#define TKS_SPM_MAX_MODEL_BYTES 0x7fffffffull

extern "C" int tks_spm_load(const char *path, tks_spm **out) {
    if (!out) return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "tks_spm_load: out is NULL");
    *out = nullptr;
    if (!path) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_spm_load: path is NULL");
    const uint8_t *base;
    size_t size;
    int rc = tks_map_file(path, "tokenizer model", &base, &size);
    if (rc) return rc;
    rc = tks__spm_load_bytes(path, base, size, out);
    tks_unmap(base, size);
    return rc;
}

extern "C" int tks__spm_load_bytes(const char *path, const uint8_t *base, size_t size, tks_spm **out) {
    *out = nullptr;
    if ((unsigned long long)size > TKS_SPM_MAX_MODEL_BYTES)
        return tks_fail(TKS_ERR_TOKENIZER, path, TKS_NONE, TKS_NONE,
                        "%s is not a sentencepiece model (%llu bytes, over protobuf's 2 GiB "
                        "limit): pass the .model file written by `tokshard train-tokenizer` "
                        "or spm_train",
                        path, (unsigned long long)size);
    tks_spm *s = nullptr;
    try {
        std::string bytes = size ? std::string((const char *)base, size) : std::string();
        int rc = 0;
        s = new tks_spm();
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
        memcpy(s->fingerprint, c.digest, 16);
        /* Walked before sentencepiece sees the bytes, so that every file,
         * valid or not, goes through the walker (tests feed it truncations). */
        s->model_type = model_type_of((const uint8_t *)bytes.data(), bytes.size());
        spm::util::Status st = s->sp.LoadFromSerializedProto(bytes);
        int n = st.ok() ? s->sp.GetPieceSize() : 0;
        if (!st.ok() || n <= 0) {
            /* sentencepiece's message for unparsable bytes is a source line. */
            std::string why = bytes.empty()                        ? "it is empty"
                              : !strcmp(s->model_type, "unknown") ? "not a complete protobuf message"
                              : st.ok()                           ? "it has no pieces"
                                                                  : st.message();
            delete s;
            return tks_fail(TKS_ERR_TOKENIZER, path, TKS_NONE, TKS_NONE,
                            "%s is not a sentencepiece model (%s): pass the .model file written "
                            "by `tokshard train-tokenizer` or spm_train",
                            path, why.c_str());
        }
        s->vocab_size = (uint32_t)n;
        s->bos_id = special_id(s->sp.bos_id());
        s->eos_id = special_id(s->sp.eos_id());
        s->pad_id = special_id(s->sp.pad_id());
        s->unk_id = special_id(s->sp.unk_id());
        s->pieces.reserve((size_t)n);
        for (int i = 0; i < n; i++) s->pieces.push_back(s->sp.IdToPiece(i));
        rc = tks_fast_load((const uint8_t *)bytes.data(), bytes.size(), &s->fast, s->fast_why,
                           sizeof s->fast_why);
        if (rc < 0) throw std::bad_alloc();
        if (rc == 2) {
            s->cuts = s->fast;
            s->fast = nullptr;
        }
        uint32_t fast_n = s->fast ? tks_fast_n_pieces(s->fast) : 0;
        if (s->fast && fast_n != (uint32_t)n) {
            /* our reading of the proto disagrees with sentencepiece's */
            tks_fast_free(s->fast);
            s->fast = nullptr;
            snprintf(s->fast_why, sizeof s->fast_why,
                     "tokshard reads %u pieces where sentencepiece reads %d", fast_n, n);
        }
        s->use_fast = s->fast != nullptr;
    } catch (...) {
        delete s;
        return fail_exception(path, "tks_spm_load");
    }
    *out = s;
    return 0;
}

extern "C" void tks_spm_free(tks_spm *s) { delete s; }

extern "C" uint32_t tks_spm_vocab_size(const tks_spm *s) { return s->vocab_size; }
extern "C" uint32_t tks_spm_bos_id(const tks_spm *s) { return s->bos_id; }
extern "C" uint32_t tks_spm_eos_id(const tks_spm *s) { return s->eos_id; }
extern "C" uint32_t tks_spm_pad_id(const tks_spm *s) { return s->pad_id; }
extern "C" uint32_t tks_spm_unk_id(const tks_spm *s) { return s->unk_id; }
extern "C" const char *tks_spm_model_type(const tks_spm *s) { return s->model_type; }
extern "C" const uint8_t *tks_spm_fingerprint(const tks_spm *s) { return s->fingerprint; }

extern "C" const char *tks_spm_piece(const tks_spm *s, uint32_t id) {
    return id < s->vocab_size ? s->pieces[id].c_str() : nullptr;
}

extern "C" void tks_ids_free(tks_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = nullptr;
    v->n = v->cap = 0;
}

/* ---------------------------------------------------------------------------
 * Encode / decode. The handle is never written after loading, so these are
 * safe on one handle from many threads; scratch vectors are per thread.
 * ------------------------------------------------------------------------- */

static thread_local std::vector<int> t_ids;

/* Keeps at most 4 MiB of scratch per thread after an unusually long text. */
static void trim_scratch() {
    if (t_ids.capacity() > (1u << 20)) std::vector<int>().swap(t_ids);
}

extern "C" const char *tks_spm_encoder(const tks_spm *s) {
    return s->use_fast ? "fast" : "sentencepiece";
}
extern "C" const char *tks_spm_fast_unavailable(const tks_spm *s) {
    return s->fast ? NULL : s->fast_why;
}
extern "C" int tks_spm_set_encoder(tks_spm *s, int fast) {
    if (fast && !s->fast)
        return tks_fail(TKS_ERR_TOKENIZER, NULL, TKS_NONE, TKS_NONE,
                        "the fast encoder cannot encode this model exactly (%s): use sentencepiece",
                        s->fast_why);
    s->use_fast = fast != 0;
    return 0;
}
extern "C" void tks_spm_set_word_cache(tks_spm *s, int on) {
    if (s->fast) tks_fast_set_cache(s->fast, on);
}
extern "C" void tks_spm_encoder_stats(const tks_spm *s, tks_encoder_stats *st) {
    memset(st, 0, sizeof *st);
    st->cut_docs = s->cut_docs.load(std::memory_order_relaxed);
    st->cut_parts = s->cut_parts.load(std::memory_order_relaxed);
    if (!s->fast) return;
    tks_fast_stats f;
    tks_fast_get_stats(s->fast, &f);
    st->words = f.words;
    st->word_hits = f.word_hits;
    st->bytes = f.bytes;
    st->hit_bytes = f.hit_bytes;
    st->bound_misses = f.bound_misses;
}

extern "C" int tks_spm_encode_fast(const tks_spm *s, const char *text, size_t len, tks_ids *out) {
    if (!s || !s->fast)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_spm_encode_fast: no fast encoder for this model (%s)",
                        s ? s->fast_why : "NULL handle");
    int rc = tks_fast_encode(s->fast, text, len, out);
    return rc == 1 ? tks_spm_encode_ref(s, text, len, out) : rc;
}

/* Documents over this many bytes go to sentencepiece in segments of about
 * TKS_SEGMENT_BYTES, where the model allows exact cuts (tks_fast_next_cut):
 * sentencepiece needs ~130 bytes of memory per byte of its input. */
#define TKS_SEGMENT_MIN (2u << 20)
#define TKS_SEGMENT_BYTES (512u << 10)

static int encode_segmented(const tks_spm *s, const tks_fast *cuts, const char *text, size_t len,
                            tks_ids *out) {
    tks_ids part = {nullptr, 0, 0};
    size_t start = 0, n = 0;
    int rc = 0;
    while (!rc && start < len) {
        size_t end = len;
        if (len - start > TKS_SEGMENT_BYTES + TKS_SEGMENT_BYTES / 2) {
            size_t cut = tks_fast_next_cut(cuts, text, len, start + TKS_SEGMENT_BYTES);
            if (cut) end = cut;
        }
        rc = tks_spm_encode_ref(s, text + start, end - start, &part);
        if (!rc && n + part.n > out->cap) {
            size_t cap = out->cap < 64 ? 64 : out->cap;
            while (cap < n + part.n) cap *= 2;
            uint32_t *p = (uint32_t *)realloc(out->ids, cap * sizeof(uint32_t));
            if (!p) rc = tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory");
            else out->ids = p, out->cap = cap;
        }
        if (!rc) {
            if (part.n) memcpy(out->ids + n, part.ids, part.n * sizeof(uint32_t));
            n += part.n;
        }
        start = end;
    }
    tks_ids_free(&part);
    out->n = rc ? 0 : n;
    return rc;
}

extern "C" int tks_spm_encode(const tks_spm *s, const char *text, size_t len, tks_ids *out) {
    if (s && s->use_fast) {
        int rc = tks_fast_encode(s->fast, text, len, out);
        if (rc != 1) return rc;
        /* a text the fast encoder cannot do exactly (see fastenc.h) */
    }
    const tks_fast *cuts = s ? (s->fast ? s->fast : s->cuts) : nullptr;
    if (cuts && out && text && len >= TKS_SEGMENT_MIN) return encode_segmented(s, cuts, text, len, out);
    return tks_spm_encode_ref(s, text, len, out);
}

extern "C" void tks_spm_count_doc(const tks_spm *s, size_t parts) {
    s->cut_docs.fetch_add(1, std::memory_order_relaxed);
    s->cut_parts.fetch_add(parts, std::memory_order_relaxed);
}

extern "C" size_t tks_spm_next_cut(const tks_spm *s, const char *text, size_t len, size_t from) {
    const tks_fast *cuts = s ? (s->fast ? s->fast : s->cuts) : nullptr;
    return cuts && text ? tks_fast_next_cut(cuts, text, len, from) : 0;
}

extern "C" int tks_spm_encode_ref(const tks_spm *s, const char *text, size_t len, tks_ids *out) {
    if (!s || !out || (!text && len))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_spm_encode: NULL argument");
    try {
        spm::util::Status st = s->sp.Encode(absl::string_view(text ? text : "", len), &t_ids);
        if (!st.ok())
            return tks_fail(TKS_ERR_TOKENIZER, NULL, TKS_NONE, TKS_NONE,
                            "sentencepiece cannot encode a text of %zu bytes: %s", len, st.message());
        size_t n = t_ids.size();
        if (n > out->cap) {
            size_t cap = out->cap < 64 ? 64 : out->cap;
            while (cap < n) cap = cap > SIZE_MAX / 2 ? n : cap * 2;
            if (cap > SIZE_MAX / sizeof(uint32_t)) throw std::bad_alloc();
            uint32_t *p = (uint32_t *)realloc(out->ids, cap * sizeof(uint32_t));
            if (!p) throw std::bad_alloc();
            out->ids = p;
            out->cap = cap;
        }
        for (size_t i = 0; i < n; i++) out->ids[i] = (uint32_t)t_ids[i];
        out->n = n;
        trim_scratch();
    } catch (...) {
        return fail_exception(NULL, "tks_spm_encode");
    }
    return 0;
}

extern "C" int tks_spm_decode(const tks_spm *s, const uint32_t *ids, size_t n, char **text,
                              size_t *len) {
    if (text) *text = nullptr;
    if (len) *len = 0;
    if (!s || !text || (!ids && n))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_spm_decode: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= s->vocab_size)
            return tks_fail(TKS_ERR_TOKEN_RANGE, NULL, TKS_NONE, (uint64_t)i,
                            "token id %u at position %zu is out of range: the tokenizer's vocab "
                            "size is %u",
                            ids[i], i, s->vocab_size);
    try {
        t_ids.assign(ids, ids + n);
        std::string out;
        spm::util::Status st = s->sp.Decode(t_ids, &out);
        trim_scratch();
        if (!st.ok())
            return tks_fail(TKS_ERR_TOKENIZER, NULL, TKS_NONE, TKS_NONE,
                            "sentencepiece cannot decode %zu ids: %s", n, st.message());
        char *p = (char *)malloc(out.size() + 1);
        if (!p) throw std::bad_alloc();
        memcpy(p, out.data(), out.size());
        p[out.size()] = 0;
        *text = p;
        if (len) *len = out.size();
    } catch (...) {
        return fail_exception(NULL, "tks_spm_decode");
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------- */

/* Feeds sentencepiece from the C callback; remembers a callback failure and
 * its error context, which sentencepiece's Status cannot carry. */
class CallbackIterator : public spm::SentenceIterator {
  public:
    CallbackIterator(tks_sentence_fn next, void *ctx) : next_(next), ctx_(ctx) {}
    void Start() { Next(); }
    bool done() const override { return done_; }
    const std::string &value() const override { return value_; }
    void Next() override {
        if (done_) return;
        const char *t = nullptr;
        size_t n = 0;
        int rc = next_(ctx_, &t, &n);
        if (rc < 0 && tks_last_error()->code != rc) /* callback left no context */
            tks_fail(rc, NULL, TKS_NONE, TKS_NONE, "the training text callback failed: %s",
                     tks_strerror(rc));
        else if (rc > 0 && !t && n)
            rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                          "the training text callback returned NULL text of %zu bytes", n);
        if (rc < 0) {
            code_ = rc;
            err_ = *tks_last_error();
            done_ = true;
        } else if (rc == 0) {
            done_ = true;
        } else {
            value_.assign(t ? t : "", n);
        }
    }
    spm::util::Status status() const override {
        if (!code_) return spm::util::Status();
        return spm::util::Status(spm::util::StatusCode::kAborted, "training text callback failed");
    }
    int code_ = 0;     /* the callback's negative code, or 0 */
    tks_error err_{};  /* its error context */

  private:
    tks_sentence_fn next_;
    void *ctx_;
    std::string value_;
    bool done_ = false;
};

static std::string fmt_u64(uint64_t v) { return std::to_string((unsigned long long)v); }

/* PREFIX.vocab as sentencepiece writes it (TrainerInterface::SaveVocab):
 * "piece\tscore\n" with the score printed by an ostream. */
static std::string vocab_text(const spm::SentencePieceProcessor &sp) {
    std::ostringstream os;
    for (int i = 0; i < sp.GetPieceSize(); i++) os << sp.IdToPiece(i) << "\t" << sp.GetScore(i) << "\n";
    return os.str();
}

extern "C" int tks_spm_train(const tks_spm_train_opts *o, tks_sentence_fn next, void *ctx) {
    if (!o || !next || !o->model_prefix || !*o->model_prefix)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_spm_train: options, model_prefix and the text callback are required");
    const char *prefix = o->model_prefix;
    const char *type = o->model_type ? o->model_type : "";
    if (strcmp(type, "bpe") && strcmp(type, "unigram") && strcmp(type, "word") && strcmp(type, "char"))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "unknown tokenizer model type \"%s\": use bpe, unigram, word or char", type);
    if (o->vocab_size == 0 || o->vocab_size > INT32_MAX)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "vocab size %u is out of range",
                        o->vocab_size);
    if (!(o->character_coverage >= 0.0 && o->character_coverage <= 1.0))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "character coverage %g is not in [0, 1] (0 = default 0.9995)",
                        o->character_coverage);
    if (o->threads < 0)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "thread count %d is negative",
                        o->threads);
    /* util.h of sentencepiece: static_cast<unsigned int>(-1) means "seed from
     * std::random_device". */
    if (o->seed == UINT32_MAX)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "seed %u is reserved by sentencepiece (it means a random seed); pick "
                        "another",
                        o->seed);
    std::string model_path, vocab_path;
    try {
        model_path = std::string(prefix) + ".model";
        vocab_path = std::string(prefix) + ".vocab";
        std::unordered_map<std::string, std::string> kw;
        kw["model_type"] = type;
        kw["vocab_size"] = fmt_u64(o->vocab_size);
        kw["byte_fallback"] = o->byte_fallback ? "true" : "false";
        if (o->character_coverage > 0) {
            char b[64];
            snprintf(b, sizeof b, "%.17g", o->character_coverage);
            kw["character_coverage"] = b;
        }
        if (o->input_sentence_size) {
            kw["input_sentence_size"] = fmt_u64(o->input_sentence_size);
            kw["shuffle_input_sentence"] = "true";
        }
        if (o->max_sentence_length) kw["max_sentence_length"] = fmt_u64(o->max_sentence_length);
        kw["num_threads"] = fmt_u64(o->threads > 0 ? (uint64_t)o->threads : 1);
        /* Silences INFO and WARNING (process-wide: it is a global flag); 3
         * would also silence LOG(FATAL) messages before an abort. */
        kw["minloglevel"] = "2";

        /* In 0.1.97 the sampling of input_sentence_size sentences does not use
         * this seed but a fixed one (kSeed, trainer_interface.cc): for a given
         * thread count training is deterministic whatever the seed, which
         * only reaches options left off here. (Unigram results depend on the
         * thread count: its EM sums floats per thread.) */
        spm::SetRandomGeneratorSeed(o->seed);
        tks_clear_error();
        CallbackIterator it(next, ctx);
        it.Start();
        if (!it.code_ && it.done()) /* sentencepiece would only assert !sentences_.empty() */
            return tks_fail(TKS_ERR_INPUT, NULL, TKS_NONE, TKS_NONE,
                            "the training text holds no non-empty line: nothing to train %s on",
                            model_path.c_str());
        std::string model;
        spm::util::Status st =
            it.code_ ? spm::util::Status() : spm::SentencePieceTrainer::Train(kw, &it, &model);
        if (it.code_) {
            tks_error_restore(&it.err_);
            return it.code_;
        }
        if (!st.ok())
            return tks_fail(TKS_ERR_TOKENIZER, model_path.c_str(), TKS_NONE, TKS_NONE,
                            "sentencepiece training failed: %s", st.message());

        /* Sentencepiece returns the model instead of writing PREFIX.model and
         * PREFIX.vocab in place when no model_prefix is given (the two are
         * exclusive), so the model does not record its path: same text and
         * options, same bytes, wherever it is written. Both files go through
         * tks_write_file_atomic, after checking that the model loads, the
         * .model last so that it appears only once both are complete. */
        spm::SentencePieceProcessor sp;
        st = sp.LoadFromSerializedProto(model);
        if (!st.ok())
            return tks_fail(TKS_ERR_TOKENIZER, model_path.c_str(), TKS_NONE, TKS_NONE,
                            "sentencepiece produced a model it cannot load: %s", st.message());
        std::string vocab = vocab_text(sp);
        int rc = tks_write_file_atomic(vocab_path.c_str(), vocab.data(), vocab.size());
        if (!rc) rc = tks_write_file_atomic(model_path.c_str(), model.data(), model.size());
        return rc;
    } catch (...) {
        return fail_exception(model_path.empty() ? prefix : model_path.c_str(), "tks_spm_train");
    }
}
