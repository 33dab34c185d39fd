/* pb.h - the protobuf wire format, as far as a sentencepiece .model
 * (ModelProto) needs it: one reader for the fast encoder's loader
 * (fastenc_load.c) and the tokenizer.json writer (hf_tokenizer.c). Private
 * to tokenizer/. Source: https://protobuf.dev/programming-guides/encoding/
 * (varints; wire types 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit;
 * field number 0 invalid). */
#ifndef TKS_TOKENIZER_PB_H
#define TKS_TOKENIZER_PB_H
#include <stddef.h>
#include <stdint.h>

#include "common/tks_bits.h"

/* One field: its number, wire type, value (a varint, or the little-endian
 * 32/64-bit value of a fixed field) and bytes (length-delimited payload, or
 * the fixed field's bytes, which point into the message). */
typedef struct pb_field {
    uint64_t num;
    unsigned wt;
    uint64_t v;
    const uint8_t *data;
    size_t len;
} pb_field;

/* A varint at *p (advanced past it): 0, or -1 when it runs past end or is
 * longer than 10 bytes. */
static inline int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* The next field of the message at *p (advanced past it): 1, 0 at the end,
 * -1 on malformed bytes (a field that runs past end, wire types 3, 4, 6, 7,
 * field number 0). */
static inline int pb_next(const uint8_t **p, const uint8_t *end, pb_field *f) {
    if (*p >= end) return 0;
    uint64_t key;
    if (pb_varint(p, end, &key)) return -1;
    f->num = key >> 3;
    f->wt = (unsigned)(key & 7);
    f->v = 0;
    f->data = NULL;
    f->len = 0;
    switch (f->wt) {
    case 0:
        if (pb_varint(p, end, &f->v)) return -1;
        break;
    case 1:
    case 5:
        f->len = f->wt == 1 ? 8 : 4;
        if ((size_t)(end - *p) < f->len) return -1;
        f->data = *p;
        f->v = f->wt == 1 ? tks_le64(*p) : tks_le32(*p);
        *p += f->len;
        break;
    case 2:
        if (pb_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p)) return -1;
        f->data = *p;
        f->len = (size_t)f->v;
        *p += f->len;
        break;
    default:
        return -1;
    }
    return f->num == 0 ? -1 : 1;
}
#endif
