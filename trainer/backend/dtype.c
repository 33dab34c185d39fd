/* dtype.c - bf16 <-> fp32 conversions (backend.h): one definition for the
 * backends, the comm and the checkpoints. */
#include <stdint.h>
#include <string.h>

#include "trainer/backend/backend.h"

uint16_t tks_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float tks_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
