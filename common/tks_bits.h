/* tks_bits.h - little-endian loads and stores of the file formats (shards,
 * safetensors, Megatron, llm.c, sentencepiece's protobuf fixed fields) and
 * splitmix64, written once. Header-only: each is a few instructions and is
 * used in hot loops. */
#ifndef TKS_BITS_H
#define TKS_BITS_H
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
#endif
