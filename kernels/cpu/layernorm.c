/* layernorm.c — LayerNorm and the fused residual + bias + LayerNorm on the CPU (fp32 statistics,
 * two passes over the row for the variance: as accurate as torch's, and the row is in cache). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <stdlib.h>

/* mean and 1/sqrt(var + eps) of a row; eight partial sums so the compiler can use vectors
 * without reassociating a single chain (and it is slightly more accurate). */
static void row_stats(const float *in, int64_t H, float eps, float *mean_out, float *rstd_out) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= H; i += 8)
        for (int j = 0; j < 8; j++) s[j] += in[i + j];
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < H; i++) sum += in[i];
    float mean = sum / (float)H;
    for (int j = 0; j < 8; j++) s[j] = 0.0f;
    for (i = 0; i + 8 <= H; i += 8)
        for (int j = 0; j < 8; j++) { float d = in[i + j] - mean; s[j] += d * d; }
    float var = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < H; i++) { float d = in[i] - mean; var += d * d; }
    *mean_out = mean;
    *rstd_out = 1.0f / sqrtf(var / (float)H + eps);
}

/* The reference: the obvious loops. */
static void layernorm_row(float *out, const float *in, const uint16_t *gamma,
                          const uint16_t *beta, int64_t H, float eps) {
    float mean = 0.0f;
    for (int64_t i = 0; i < H; i++) mean += in[i];
    mean /= (float)H;
    float var = 0.0f;
    for (int64_t i = 0; i < H; i++) { float d = in[i] - mean; var += d * d; }
    var /= (float)H;
    float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < H; i++)
        out[i] = (in[i] - mean) * rstd * pln_f16_to_f32(gamma[i]) + pln_f16_to_f32(beta[i]);
}

/* The fast path: gamma and beta converted once per call (gb = [gamma | beta] in fp32). */
static void layernorm_row_fast(float *out, const float *in, const float *gb, int64_t H, float eps) {
    float mean, rstd;
    row_stats(in, H, eps, &mean, &rstd);
    for (int64_t i = 0; i < H; i++) out[i] = (in[i] - mean) * rstd * gb[i] + gb[H + i];
}

/* x += y + bias, then the LayerNorm of the new x: one pass over x while it is in cache. */
static void residual_layernorm_row(float *x, const float *y, const uint16_t *bias,
                                   const uint16_t *gamma, const uint16_t *beta, float *ln_out,
                                   int64_t H, float eps) {
    if (y && bias)
        for (int64_t i = 0; i < H; i++) x[i] += y[i] + pln_f16_to_f32(bias[i]);
    else if (y)
        for (int64_t i = 0; i < H; i++) x[i] += y[i];
    else if (bias)
        for (int64_t i = 0; i < H; i++) x[i] += pln_f16_to_f32(bias[i]);
    layernorm_row(ln_out, x, gamma, beta, H, eps);
}

static float *convert_gamma_beta(const uint16_t *gamma, const uint16_t *beta, int64_t H) {
    float *gb = malloc((size_t)H * 2 * sizeof *gb);
    if (!gb) return NULL;
    for (int64_t i = 0; i < H; i++) { gb[i] = pln_f16_to_f32(gamma[i]); gb[H + i] = pln_f16_to_f32(beta[i]); }
    return gb;
}

void pln_cpu_layernorm(pln_cpu *c, float *out, const float *in, const uint16_t *gamma,
                       const uint16_t *beta, int32_t T, int64_t H, float eps) {
    float *gb = c->isa == PLN_CPU_ISA_REF ? NULL : convert_gamma_beta(gamma, beta, H);
    if (!gb) {   /* the reference, or no memory for the fast path's table */
        for (int32_t t = 0; t < T; t++) layernorm_row(out + t * H, in + t * H, gamma, beta, H, eps);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++) layernorm_row_fast(out + t * H, in + t * H, gb, H, eps);
    free(gb);
}

void pln_cpu_residual_layernorm(pln_cpu *c, float *x, const float *y, const uint16_t *bias,
                                const uint16_t *gamma, const uint16_t *beta, float *ln_out,
                                int32_t T, int64_t H, float eps) {
    float *gb = c->isa == PLN_CPU_ISA_REF ? NULL : convert_gamma_beta(gamma, beta, H);
    if (!gb) {
        for (int32_t t = 0; t < T; t++)
            residual_layernorm_row(x + t * H, y ? y + t * H : NULL, bias, gamma, beta,
                                   ln_out + t * H, H, eps);
        return;
    }
    float *bf = NULL;
    if (bias && (bf = malloc((size_t)H * sizeof *bf)))
        for (int64_t i = 0; i < H; i++) bf[i] = pln_f16_to_f32(bias[i]);
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++) {
        float *xr = x + t * H;
        const float *yr = y ? y + t * H : NULL;
        if (bias && !bf) {
            for (int64_t i = 0; i < H; i++) xr[i] += (yr ? yr[i] : 0.0f) + pln_f16_to_f32(bias[i]);
        } else if (bf && yr) {
            for (int64_t i = 0; i < H; i++) xr[i] += yr[i] + bf[i];
        } else if (bf) {
            for (int64_t i = 0; i < H; i++) xr[i] += bf[i];
        } else if (yr) {
            for (int64_t i = 0; i < H; i++) xr[i] += yr[i];
        }
        layernorm_row_fast(ln_out + t * H, xr, gb, H, eps);
    }
    free(bf);
    free(gb);
}

