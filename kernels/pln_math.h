/* pln_math.h — per-element math shared by the CPU and CUDA backends and the tools: GeLU, SiLU,
 * the rotary pair, ALiBi slopes, the online-softmax merge, on top of the number encodings of formats/numeric.h.
 * Everything here is static inline and marked __host__ __device__ under nvcc, so the CPU tests
 * exercise the very code the GPU kernels run. Nothing here depends on a thread layout. */
#ifndef PLN_MATH_H
#define PLN_MATH_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#include "formats/numeric.h"

/* BLOOM's GeLU, the tanh form of modeling_bloom.py's bloom_gelu_forward. */
PLN_HD float pln_gelu(float x) {
    return x * 0.5f * (1.0f + tanhf(0.79788456f * x * (1.0f + 0.044715f * x * x)));
}

/* SiLU as torch computes it (x * sigmoid(x) = x / (1 + exp(-x))): the Llama MLP's gate. A very
 * negative x gives exp(-x) = inf and -0, the limit. */
PLN_HD float pln_silu(float x) { return x / (1.0f + expf(-x)); }

/* An fp32 product rounded on its own: never contracted with a following add into an FMA (nvcc
 * contracts by default), so each product rounds as torch's elementwise multiply does. */
PLN_HD float pln_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* The rotary pair (x0, x1) = (x_i, x_{i+d/2}) turned by an angle of cosine c and sine s, in
 * transformers' order q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1): each product
 * rounded, then the sum. */
PLN_HD float pln_rope_lo(float x0, float x1, float c, float s) { return pln_mul_rn(x0, c) - pln_mul_rn(x1, s); }
PLN_HD float pln_rope_hi(float x0, float x1, float c, float s) { return pln_mul_rn(x1, c) + pln_mul_rn(x0, s); }

/* ALiBi slope of head h (0-based) for n_head heads, exactly as modeling_bloom.py's
 * build_alibi_tensor: p = 2^floor(log2(n)); base = 2^(-(2^-(log2(p)-3))) = 2^(-8/p);
 * heads < p get base^(h+1); the others get extra^(1,3,5,...) with extra = 2^(-4/p). */
PLN_HD float pln_alibi_slope(int h, int n_head) {
    int p = 1;
    while (p * 2 <= n_head) p *= 2;
    if (h < p) {
        double base = pow(2.0, -8.0 / p);
        return (float)pow(base, h + 1);
    }
    double extra = pow(2.0, -4.0 / p);
    int k = h - p;               /* 0, 1, 2, ... -> exponents 1, 3, 5, ... */
    return (float)pow(extra, 2 * k + 1);
}

/* Online softmax merge (flash-decoding): two partial states (max m, sum of exp s) combined. */
typedef struct { float m; float s; } pln_softmax_state;
PLN_HD pln_softmax_state pln_softmax_merge(pln_softmax_state a, pln_softmax_state b) {
    pln_softmax_state r;
    if (a.m == -INFINITY) return b;
    if (b.m == -INFINITY) return a;
    r.m = a.m > b.m ? a.m : b.m;
    r.s = a.s * expf(a.m - r.m) + b.s * expf(b.m - r.m);
    return r;
}

#endif
