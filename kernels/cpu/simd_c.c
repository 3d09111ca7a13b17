/* simd_c.c — the portable micro kernels (plain C, any CPU): the fallback where neither AVX2 nor
 * AVX-512 is available. Weights are converted to fp32 a short stretch at a time (never a whole
 * matrix) and each converted stretch is reused for every token of the block. */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <stdlib.h>

/* Columns converted at a time: 1 KiB of fp32, stays in L1 beside the tokens' activations. */
#define KSTEP 256

static void gemm_f16_c(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                       const uint16_t *w, int64_t nr, int64_t K) {
    float wf[KSTEP], acc[PLN_CPU_TCHUNK];
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t t = 0; t < nt; t++) acc[t] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += KSTEP) {
            int64_t n = K - k0 < KSTEP ? K - k0 : KSTEP;
            for (int64_t i = 0; i < n; i++) wf[i] = pln_f16_to_f32(w[r * K + k0 + i]);
            for (int64_t t = 0; t < nt; t++) {
                const float *xt = x + t * ldx + k0;
                float s = 0.0f;
                for (int64_t i = 0; i < n; i++) s += wf[i] * xt[i];
                acc[t] += s;
            }
        }
        for (int64_t t = 0; t < nt; t++) out[t * ldo + r] = acc[t];
    }
}

static void gemm_i8_c(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                      const int8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    float wf[KSTEP], acc[PLN_CPU_TCHUNK];
    int64_t ng = K / group;
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t t = 0; t < nt; t++) acc[t] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += KSTEP) {
            int64_t n = K - k0 < KSTEP ? K - k0 : KSTEP;
            for (int64_t i = 0; i < n; i++) {
                int64_t k = k0 + i;
                wf[i] = pln_dequant_i8(w[r * K + k], pln_f16_to_f32(scale[r * ng + k / group]));
            }
            for (int64_t t = 0; t < nt; t++) {
                const float *xt = x + t * ldx + k0;
                float s = 0.0f;
                for (int64_t i = 0; i < n; i++) s += wf[i] * xt[i];
                acc[t] += s;
            }
        }
        for (int64_t t = 0; t < nt; t++) out[t * ldo + r] = acc[t];
    }
}

static void gemm_i4_c(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                      const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    float wf[KSTEP], acc[PLN_CPU_TCHUNK];
    int64_t ng = K / group;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *row = w + r * (K / 2);
        for (int64_t t = 0; t < nt; t++) acc[t] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += KSTEP) {
            int64_t n = K - k0 < KSTEP ? K - k0 : KSTEP;
            for (int64_t i = 0; i < n; i++) {
                int64_t k = k0 + i;
                wf[i] = pln_dequant_i4(pln_i4_get(row, k), pln_f16_to_f32(scale[r * ng + k / group]));
            }
            for (int64_t t = 0; t < nt; t++) {
                const float *xt = x + t * ldx + k0;
                float s = 0.0f;
                for (int64_t i = 0; i < n; i++) s += wf[i] * xt[i];
                acc[t] += s;
            }
        }
        for (int64_t t = 0; t < nt; t++) out[t * ldo + r] = acc[t];
    }
}

/* The integer-dot path in plain C: the definition the SIMD versions are checked against (the
 * integer dots are exact; the fp32 accumulation is one fmaf per block, in block order). */
static void gemm_q8_c(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                      int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    (void)xsum;   /* signed bytes times signed bytes: no offset to correct */
    int64_t ng = K / group, nb = K / 32;
    int8_t *row = i4 ? pln_xmalloc((size_t)K) : NULL;
    for (int64_t r = 0; r < nr; r++) {
        const int8_t *wr = (const int8_t *)w + r * K;
        if (i4) {
            const uint8_t *p = (const uint8_t *)w + r * (K / 2);
            for (int64_t k = 0; k < K; k++) row[k] = (int8_t)pln_i4_get(p, k);
            wr = row;
        }
        for (int64_t t = 0; t < nt; t++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t d = 0;
                for (int64_t k = 32 * b; k < 32 * b + 32; k++) d += (int32_t)wr[k] * xq[4 * ((k / 4) * ldq + t) + k % 4];
                acc = fmaf((float)d, xs[b * ldq + t] * pln_f16_to_f32(scale[r * ng + 32 * b / group]), acc);
            }
            out[t * ldo + r] = acc;
        }
    }
    free(row);
}

/* The attention loops are written once over a row loader: the F16-cache versions do the same
 * arithmetic in the same order on the converted (exact) values, so an F16 cache gives exactly
 * what an F32 cache holding the same rounded keys and values gives. */
static inline float kv_ld(const void *p, int64_t i, bool f16) {
    return f16 ? pln_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void
dots_impl(float *scores, const float *q, const void *k, int64_t n, int64_t d, bool f16) {
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int64_t e = 0; e < d; e++) s += q[e] * kv_ld(k, i * d + e, f16);
        scores[i] = s;
    }
}

static inline __attribute__((always_inline)) void
weighted_sum_impl(float *o, float c, const float *p, const void *v, int64_t n, int64_t d, bool f16) {
    for (int64_t e = 0; e < d; e++) o[e] *= c;
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < d; e++) o[e] += p[i] * kv_ld(v, i * d + e, f16);
}

static void dots_c(float *scores, const float *q, const float *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, false);
}
static void dots_f16_c(float *scores, const float *q, const uint16_t *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, true);
}
static void weighted_sum_c(float *o, float c, const float *p, const float *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, false);
}
static void weighted_sum_f16_c(float *o, float c, const float *p, const uint16_t *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, true);
}

static void bias_gelu_c(float *o, const uint16_t *bias, int64_t n, bool gelu) {
    if (bias) for (int64_t i = 0; i < n; i++) o[i] += pln_f16_to_f32(bias[i]);
    if (gelu) for (int64_t i = 0; i < n; i++) o[i] = pln_gelu(o[i]);
}

static float sum_exp_c(const float *x, int64_t n, float mx) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += expf(x[i] - mx);
    return (float)s;
}

static float exp_sum_c(float *x, int64_t n, float mx) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) { x[i] = expf(x[i] - mx); s += x[i]; }
    return s;
}

static float score_max_c(float *x, int64_t n, float scale, float slope, int32_t j0) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        x[i] = x[i] * scale + slope * (float)(j0 + i);
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

static double fma_chains_c(int64_t iters, float *sink) {
    float a[PLN_CPU_FMA_CHAINS];
    for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = 1.0f + 1e-3f * (float)i;
    for (int64_t n = 0; n < iters; n++)
        for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = a[i] * 0.999999f + 1e-7f;
    float s = 0.0f;
    for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) s += a[i];
    *sink = s;
    return 2.0 * PLN_CPU_FMA_CHAINS * (double)iters;
}

static void silu_mul_c(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = pln_silu(g[i]) * u[i];
}

const pln_cpu_kernels pln_cpu_kernels_c = {
    .name = "c", .gemm_f16 = gemm_f16_c, .gemm_i8 = gemm_i8_c, .gemm_i4 = gemm_i4_c, .gemm_q8 = gemm_q8_c, .quant_act = pln_cpu_quant_act_il, .dots = dots_c,
    .weighted_sum = weighted_sum_c, .dots_f16 = dots_f16_c, .weighted_sum_f16 = weighted_sum_f16_c,
    .bias_gelu = bias_gelu_c, .sum_exp = sum_exp_c, .exp_sum = exp_sum_c,
    .score_max = score_max_c, .silu_mul = silu_mul_c, .fma_chains = fma_chains_c,
};
