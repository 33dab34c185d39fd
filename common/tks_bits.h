/* tks_bits.h - little-endian loads and stores of the file formats (shards,
 * safetensors, Megatron, llm.c, sentencepiece's protobuf fixed fields),
 * splitmix64 and the UTF-8 sequence rule, written once. Header-only: each is a few instructions and is
 * used in hot loops. */
#ifndef TKS_BITS_H
#define TKS_BITS_H
#include <stddef.h>
#include <stdint.h>

/* Little-endian 32/64-bit load from p (any alignment). */
static inline uint32_t tks_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t tks_le64(const uint8_t *p) {
    return (uint64_t)tks_le32(p) | (uint64_t)tks_le32(p + 4) << 32;
}

/* Little-endian 32/64-bit store of v at p (any alignment). */
static inline void tks_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void tks_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* splitmix64's output function (Steele, Lea, Flood 2014; S. Vigna,
 * https://prng.di.unimi.it/splitmix64.c): a bijection of 64-bit integers
 * with good avalanche. */
static inline uint64_t tks_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* 2^64 / golden ratio, odd: splitmix64's increment. */
#define TKS_GOLDEN64 UINT64_C(0x9E3779B97F4A7C15)

/* The next splitmix64 output of the generator whose state is *s. */
static inline uint64_t tks_splitmix64(uint64_t *s) { return tks_mix64(*s += TKS_GOLDEN64); }
/* UTF-8 (RFC 3629; Unicode Standard ch. 3, Table 3-7 "Well-Formed UTF-8 Byte
 * Sequences", and "U+FFFD Substitution of Maximal Subparts"). s[0] >= 0x80,
 * n >= 1 bytes available. Returns the length (2..4) of the well-formed
 * sequence at s, or -k where k >= 1 is the length of the maximal subpart of
 * an ill-formed sequence (the bytes that one U+FFFD replaces). A
 * well-formed sequence cut by the end of the n bytes gives -n with s[0] a
 * lead byte (0xC2..0xF4): tks_utf8_cut says so. */
static inline int tks_utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    int len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates D800..DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else {
        return -1; /* continuation byte, C0, C1, F5..FF */
    }
    if (n < 2) return -1;
    if (s[1] < lo || s[1] > hi) return -1;
    for (int k = 2; k < len; k++)
        if ((size_t)k >= n || (s[k] & 0xC0) != 0x80) return -k;
    return len;
}
/* 1 when tks_utf8_seq's result k for the n bytes at s is a well-formed
 * sequence that the n bytes end too early (more bytes may complete it). */
static inline int tks_utf8_cut(const unsigned char *s, size_t n, int k) {
    return k < 0 && (size_t)-k == n && s[0] >= 0xC2 && s[0] <= 0xF4;
}
#endif