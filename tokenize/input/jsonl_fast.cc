// jsonl_fast.cc - the fast paths of tks_jsonl_decode (docs.c): a JSON Lines
// record read into the one string the build needs, instead of jansson's tree
// of objects per record.
//
// jansson stays the reference. A fast path decides a record only when
// jansson would accept it and give the same string; every other record, and
// every bad one (for jansson's wording of the reason), goes back to jansson
// (return 0). Two of them, the first that decides:
//   - flat records (simple_record): an object whose values are strings,
//     numbers, true, false or null, the wanted key's string decoded in one
//     pass from the record into the output, 16 bytes at a time where there is
//     nothing to decode; anything else it leaves to the next path: a nested
//     object or array, a number with an exponent or over 18 digits, an
//     escaped NUL, a surrogate escape that is not a pair, a control character,
//     bytes that are not UTF-8;
//   - RapidJSON's SAX reader (Debian's rapidjson-dev, header only), over any
//     record, below.
// RapidJSON's reader validates the structure, the UTF-8 of the input,
// the escapes, unescaped control characters, surrogate pairs and trailing
// content as jansson does; where the two differ the handler stops:
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <rapidjson/reader.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

// ---- flat records ----------------------------------------------------------

inline bool json_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline int hex4(const unsigned char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d = c - '0' <= 9 ? c - '0' : (c | 0x20) - 'a' <= 5 ? (c | 0x20) - 'a' + 10 : 16;
        if (d > 15) return -1;
        v = v << 4 | (int)d;
    }
    return v;
}

// The length of the UTF-8 sequence at p[0..n) (p[0] >= 0x80) as Rust's str
// and jansson take it (no overlong form, no surrogate, nothing above
// U+10FFFF), or 0 when it is not one.
inline size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) k = 1;
    else if (c >= 0xE0 && c <= 0xEF) k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (k >= n || p[1] < lo || p[1] > hi) return 0;
    for (size_t j = 2; j <= k; j++)
        if ((p[j] & 0xC0) != 0x80) return 0;
    return k + 1;
}

inline void put_utf8(std::string *out, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    out->append(b, n);
}

// The string whose opening quote is at p[*i]: decoded into *out (when out
// is not null), *i moved past its closing quote. false when this path
// cannot vouch for it (see the top).
bool json_string(const unsigned char *p, size_t n, size_t *i, std::string *out) {
    size_t at = *i + 1;
    if (out) out->clear();
    for (;;) {
        size_t run = at;
#if defined(__SSE2__)
        // 16 bytes a step while none is a quote, a backslash, a control
        // character or a byte of a multi-byte sequence
        const __m128i quote = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), c1f = _mm_set1_epi8(0x1F);
        while (run + 16 <= n) {
            __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + run));
            __m128i sp = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bs)),
                                      _mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f));
            unsigned m = (unsigned)(_mm_movemask_epi8(sp) | _mm_movemask_epi8(v));
            if (m) {
                run += (size_t)__builtin_ctz(m);
                break;
            }
            run += 16;
        }
#endif
        while (run < n && p[run] != '"' && p[run] != '\\' && p[run] >= 0x20 && p[run] < 0x80) run++;
        if (out && run > at) out->append(reinterpret_cast<const char *>(p + at), run - at);
        at = run;
        if (at >= n) return false;
        unsigned c = p[at];
        if (c == '"') {
            *i = at + 1;
            return true;
        }
        if (c < 0x20) return false;
        if (c >= 0x80) {
            size_t k = utf8_seq(p + at, n - at);
            if (!k) return false;
            if (out) out->append(reinterpret_cast<const char *>(p + at), k);
            at += k;
            continue;
        }
        // an escape
        if (at + 1 >= n) return false;
        unsigned e = p[at + 1], r;
        switch (e) {
        case '"': r = '"'; break;
        case '\\': r = '\\'; break;
        case '/': r = '/'; break;
        case 'b': r = '\b'; break;
        case 'f': r = '\f'; break;
        case 'n': r = '\n'; break;
        case 'r': r = '\r'; break;
        case 't': r = '\t'; break;
        case 'u': {
            int u = at + 6 <= n ? hex4(p + at + 2) : -1;
            if (u <= 0 || (u >= 0xDC00 && u <= 0xDFFF)) return false; // NUL, a lone low surrogate
            if (u >= 0xD800 && u <= 0xDBFF) {                        // a pair, or refused
                int l = at + 12 <= n && p[at + 6] == '\\' && p[at + 7] == 'u' ? hex4(p + at + 8) : -1;
                if (l < 0xDC00 || l > 0xDFFF) return false;
                if (out) put_utf8(out, 0x10000 + (((unsigned)u - 0xD800) << 10) + ((unsigned)l - 0xDC00));
                at += 12;
                continue;
            }
            if (out) put_utf8(out, (unsigned)u);
            at += 6;
            continue;
        }
        default: return false;
        }
        if (out) out->push_back((char)r);
        at += 2;
    }
}

// A number, true, false or null at p[*i] as jansson reads it, *i past it;
// false when not one this path vouches for (an exponent, over 18 digits, a
// nested value).
bool json_scalar(const unsigned char *p, size_t n, size_t *i) {
    size_t at = *i;
    static const char *const lit[] = {"true", "false", "null"};
    for (const char *l : lit)
        if (n - at >= std::strlen(l) && !std::memcmp(p + at, l, std::strlen(l))) {
            *i = at + std::strlen(l);
            return true;
        }
    size_t digits = 0;
    if (at < n && p[at] == '-') at++;
    if (at < n && p[at] == '0') at++, digits++;
    else if (at < n && p[at] >= '1' && p[at] <= '9')
        while (at < n && p[at] >= '0' && p[at] <= '9') at++, digits++;
    else return false;
    if (at < n && p[at] == '.') {
        size_t f = ++at;
        while (at < n && p[at] >= '0' && p[at] <= '9') at++, digits++;
        if (at == f) return false;
    }
    if (digits > 18 || (at < n && (p[at] == 'e' || p[at] == 'E'))) return false;
    *i = at;
    return true;
}

// A flat record: 1 with *out the last string under `key` at the top level,
// 0 when this path cannot vouch for the record.
int simple_record(const unsigned char *p, size_t n, const char *key, std::string *out) {
    size_t i = 0, kl = std::strlen(key);
    bool found = false;
    thread_local std::string k;
    while (i < n && json_ws(p[i])) i++;
    if (i >= n || p[i] != '{') return 0;
    i++;
    while (i < n && json_ws(p[i])) i++;
    if (i < n && p[i] == '}') return 0; // no key: jansson says so
    for (;;) {
        if (i >= n || p[i] != '"') return 0;
        size_t k0 = i;
        if (!json_string(p, n, &i, &k)) return 0;
        // a key without escapes is its bytes between the quotes
        bool want = k.size() == kl && !std::memcmp(k.data(), key, kl);
        (void)k0;
        while (i < n && json_ws(p[i])) i++;
        if (i >= n || p[i] != ':') return 0;
        i++;
        while (i < n && json_ws(p[i])) i++;
        if (i >= n) return 0;
        if (p[i] == '"') {
            if (!json_string(p, n, &i, want ? out : nullptr)) return 0;
            if (want) found = true;
        } else {
            if (!json_scalar(p, n, &i)) return 0;
            if (want) found = false; // the last value is not a string: jansson's message
        }
        while (i < n && json_ws(p[i])) i++;
        if (i < n && p[i] == ',') {
            i++;
            while (i < n && json_ws(p[i])) i++;
            continue;
        }
        if (i < n && p[i] == '}') break;
        return 0;
    }
    i++;
    while (i < n && json_ws(p[i])) i++;
    return i == n && found ? 1 : 0;
}

// Bytes RapidJSON writes for an escaped lone surrogate (U+D800..U+DFFF as
// if it were a code point): never in valid UTF-8, and never unescaped in an
// input RapidJSON validated.
bool has_surrogate(const char *s, size_t n) {
    for (const char *p = static_cast<const char *>(std::memchr(s, 0xED, n)); p;
         p = static_cast<const char *>(std::memchr(p + 1, 0xED, n - static_cast<size_t>(p + 1 - s))))
        if (p + 1 < s + n && static_cast<unsigned char>(p[1]) >= 0xA0) return true;
    return false;
}

// jansson's number rules: an integer literal must fit int64, a real must
// not overflow a double (strtod, as jansson's jsonp_strtod).
bool number_ok(const char *s, size_t n) {
    char buf[512];
    if (n >= sizeof buf) return false; /* jansson decides */
    std::memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    if (!std::strpbrk(buf, ".eE")) {
        (void)std::strtoll(buf, nullptr, 10);
        return errno != ERANGE;
    }
    double v = std::strtod(buf, nullptr);
    return !((v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE);
}

struct Handler : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Handler> {
    const char *key = nullptr;
    size_t key_len = 0;
    std::string *out = nullptr;
    int depth = 0;
    bool at_key = false;   // the depth-1 key just read is `key`
    bool found = false;    // the key's last value is a string (in *out)
    bool other = false;    // the key's last value is not a string

    // a value at depth 1 after `key`: a string or not
    void value(bool is_string) {
        if (depth == 1 && at_key) {
            found = is_string;
            other = !is_string;
        }
        at_key = false;
    }
    bool Null() { value(false); return depth > 0; }
    bool Bool(bool) { value(false); return depth > 0; }
    bool RawNumber(const char *s, rapidjson::SizeType n, bool) {
        value(false);
        return depth > 0 && number_ok(s, n);
    }
    bool String(const char *s, rapidjson::SizeType n, bool) {
        if (depth == 0 || has_surrogate(s, n)) return false;
        if (depth == 1 && at_key) out->assign(s, n);
        value(true);
        return true;
    }
    bool Key(const char *s, rapidjson::SizeType n, bool) {
        if (std::memchr(s, 0, n) || has_surrogate(s, n)) return false;
        at_key = depth == 1 && n == key_len && !std::memcmp(s, key, n);
        return true;
    }
    bool StartObject() {
        if (depth == 0 && (found || other)) return false;
        value(false);
        return ++depth <= 1000;
    }
    bool EndObject(rapidjson::SizeType) { --depth; return true; }
    bool StartArray() {
        value(false);
        return depth > 0 && ++depth <= 1000; /* the root must be an object */
    }
    bool EndArray(rapidjson::SizeType) { --depth; return true; }
};

}  // namespace

// The record line[0..len) when this path can decide it: 1 with *text, *n
// the string under `key` (its last occurrence at the top level), in this
// thread's buffer until this thread's next call; 0 when jansson must decide
// (not an object, no such key, not a string, a parse error, a rule above,
// or out of memory).
extern "C" int tks__jsonl_fast(const char *line, size_t len, const char *key, const char **text, size_t *n) {
    thread_local std::string copy, value;
    try {
        if (simple_record(reinterpret_cast<const unsigned char *>(line), len, key, &value)) {
            *text = value.data();
            *n = value.size();
            return 1;
        }
    } catch (...) {
        return 0;
    }
    /* a raw NUL would end the in-place stream early; jansson refuses it */
    if (std::memchr(line, 0, len)) return 0;
    try {
        Handler h;
        h.key = key;
        h.key_len = std::strlen(key);
        h.out = &value;
        /* parsed in place in a copy: strings and numbers are read where they
         * lie, so the reader needs no stack of its own (RapidJSON 1.1.0's
         * first push onto an empty stack is undefined behaviour); recursion
         * stops at the handler's 1,000 levels */
        copy.assign(line, len);
        rapidjson::InsituStringStream ss(&copy[0]);
        rapidjson::Reader reader;
        constexpr unsigned flags = rapidjson::kParseInsituFlag | rapidjson::kParseValidateEncodingFlag |
                                   rapidjson::kParseNumbersAsStringsFlag;
        if (reader.Parse<flags>(ss, h).IsError() || !h.found) return 0;
    } catch (...) {
        return 0;
    }
    *text = value.data();
    *n = value.size();
    return 1;
}
