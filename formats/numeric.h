/* numeric.h — the number encodings of pln shards and Hugging Face checkpoints: IEEE half and
 * bfloat16 to and from float (bit exact), the int8 weight rounding, and the packed int4 layout
 * (docs/FORMAT.md). The ground floor both formats/ (readers, writers, reshard) and kernels/ (the
 * backends, through kernels/pln_math.h) use: everything is static inline and marked
 * __host__ __device__ under nvcc, so the CPU tests exercise the very code the GPU kernels run. */
#ifndef PLN_NUMERIC_H
#define PLN_NUMERIC_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__CUDACC__)
#define PLN_HD __host__ __device__ __forceinline__
#else
#define PLN_HD static inline
#endif

PLN_HD uint32_t pln_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u; memcpy(&u, &f, 4); return u;
#endif
}
PLN_HD float pln_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f; memcpy(&f, &u, 4); return f;
#endif
}

/* IEEE half -> float, exact for every input (subnormals, inf, NaN). */
PLN_HD float pln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    return pln_bits_f32(bits);
}

/* float -> IEEE half, round to nearest even; overflow gives ±inf, NaN stays NaN. */
PLN_HD uint16_t pln_f32_to_f16(float f) {
    uint32_t x = pln_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - ... : places the value at 2^-24 units */
        uint32_t r = m >> (shift - 0);
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        /* value in units of 2^-24 is m * 2^(e-150) / 2^-24 = m >> (126 - e) */
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127->15 */
    uint32_t lsb = (r >> 13) & 1;
    r += 0xfff + lsb;
    return (uint16_t)(sign | (r >> 13));
}

/* bfloat16 -> float is a shift. */
PLN_HD float pln_bf16_to_f32(uint16_t b) { return pln_bits_f32((uint32_t)b << 16); }

/* float -> bfloat16, round to nearest even (used by tests and synth). */
PLN_HD uint16_t pln_f32_to_bf16(float f) {
    uint32_t x = pln_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#define PLN_F16_MAX 65504.0f

/* Symmetric int8 weight-only dequantization: w = q * scale. */
PLN_HD float pln_dequant_i8(int8_t q, float scale) { return (float)q * scale; }

/* Rounds x/scale to the nearest int8 in [-127, 127] (ties away from zero, like roundf). */
PLN_HD int8_t pln_quant_i8(float x, float inv_scale) {
    float v = roundf(x * inv_scale);
    if (v > 127.0f) v = 127.0f;
    if (v < -127.0f) v = -127.0f;
    return (int8_t)v;
}

/* Packed int4 (docs/FORMAT.md, "int4 weight-only"): a row of C columns (C % 32 == 0) is C/2
 * bytes; the 32 columns of block b = k / 32 are the 16 bytes at 16·b, byte j holding column
 * 32b + j in its low nibble and column 32b + 16 + j in its high nibble, each as q + 8 with q in
 * [-8, 7]. One 16-byte load gives a whole block: the low nibbles (x & 0x0f) are its first 16
 * columns in order, the high ones (x >> 4) its last 16, so SIMD unpacks with one mask and one
 * shift and no shuffle. w = q * scale[row, k / G]. */
PLN_HD int pln_i4_get(const uint8_t *row, int64_t k) {
    uint8_t b = row[(k >> 5) * 16 + (k & 15)];
    return (int)((k & 16) ? b >> 4 : b & 15) - 8;
}
PLN_HD void pln_i4_set(uint8_t *row, int64_t k, int q) {
    uint8_t *b = &row[(k >> 5) * 16 + (k & 15)];
    uint8_t v = (uint8_t)(q + 8) & 15;
    *b = (k & 16) ? (uint8_t)((*b & 0x0f) | (v << 4)) : (uint8_t)((*b & 0xf0) | v);
}
PLN_HD float pln_dequant_i4(int q, float scale) { return (float)q * scale; }

#endif
