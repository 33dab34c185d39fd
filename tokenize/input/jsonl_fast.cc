// jsonl_fast.cc - the fast path of tks_jsonl_decode (docs.c): a JSON Lines
// record read by RapidJSON's SAX reader (Debian's rapidjson-dev, header
// only) into the one string the build needs, instead of jansson's tree of
// objects per record.
//
// jansson stays the reference. This path decides a record only when jansson
// would accept it and give the same string; every other record, and every
// bad one (for jansson's wording of the reason), goes back to jansson
// (return 0). The reader validates the structure, the UTF-8 of the input,
// the escapes, unescaped control characters, surrogate pairs and trailing
// content as jansson does; where the two differ the handler stops:
//   - an integer literal outside int64 (jansson's json_int_t: "too big
//     integer") and a real that overflows a double (jansson: "real number
//     overflow"): numbers arrive as text and are checked here;
//   - a lone low surrogate (\udc00): RapidJSON writes it as three bytes that
//     are not UTF-8 (ED B0..BF ..), jansson refuses it;
//   - a NUL (\u0000) in an object key: jansson refuses it;
//   - nesting past 1,000 levels (jansson's limit is 2,048): jansson decides;
//   - a raw NUL byte in the record: jansson refuses it;
//   - duplicate keys: jansson keeps the last value, and so does this path.
// tests/test_input.c compares both paths on records made to hit each rule
// and on 20,000 mutated records.
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <rapidjson/reader.h>

namespace {

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
