/*
 * fuzz_fix.h - recomputes the checksums of a (mutated) shard image the way
 * the writer does (docs/FORMAT.md: chunk hashes and the index hash in the
 * checksum table, XXH3-64 of the table at header byte 152, XXH3-64 of header
 * bytes [0, 248) at byte 248). A fuzzer cannot forge a 64-bit hash, so
 * without this every mutation of a header field, the index or a token stops
 * at the first checksum; with it the checks behind the checksums (canonical
 * layout, padding, index monotonicity, id ranges) see mutated values.
 *
 * Only sections that lie inside the buffer (by the header's own offsets) are
 * rewritten, so any bytes are safe to fix.
 */
#ifndef TKS_FUZZ_FIX_H
#define TKS_FUZZ_FIX_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

static inline uint64_t fuzz_get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static inline void fuzz_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* [off, off + len) inside [0, size) without overflow. */
static inline int fuzz_inside(uint64_t off, uint64_t len, size_t size) {
    return off <= size && len <= size - off;
}

/* Fixes the checksums of the shard image b (size bytes) in place. */
static inline void fuzz_fix_checksums(uint8_t *b, size_t size) {
    if (size < 256) return;
    uint64_t chunk = (uint64_t)b[36] | (uint64_t)b[37] << 8 | (uint64_t)b[38] << 16 |
                     (uint64_t)b[39] << 24;
    uint64_t tok_off = fuzz_get64(b + 80), tok_bytes = fuzz_get64(b + 88);
    uint64_t idx_off = fuzz_get64(b + 96), idx_bytes = fuzz_get64(b + 104);
    uint64_t tab_off = fuzz_get64(b + 112), tab_bytes = fuzz_get64(b + 120);
    uint64_t n_chunks = fuzz_get64(b + 128);
    if (fuzz_inside(tab_off, tab_bytes, size) && n_chunks < tab_bytes / 8) {
        uint8_t *table = b + tab_off;
        if (chunk && fuzz_inside(tok_off, tok_bytes, size))
            for (uint64_t c = 0; c < n_chunks && c * chunk < tok_bytes; c++) {
                uint64_t off = c * chunk;
                uint64_t len = tok_bytes - off < chunk ? tok_bytes - off : chunk;
                fuzz_put64(table + 8 * c, XXH3_64bits(b + tok_off + off, (size_t)len));
            }
        if (fuzz_inside(idx_off, idx_bytes, size))
            fuzz_put64(table + 8 * n_chunks, XXH3_64bits(b + idx_off, (size_t)idx_bytes));
        fuzz_put64(b + 152, XXH3_64bits(table, (size_t)tab_bytes));
    }
    fuzz_put64(b + 248, XXH3_64bits(b, 248));
}

#endif
