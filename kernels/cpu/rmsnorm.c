/* rmsnorm.c — RMSNorm and the fused residual (+ bias) + RMSNorm on the CPU, in transformers'
 * LlamaRMSNorm order: the normalised row x * rsqrt(mean(x²) + eps) in fp32, rounded to the
 * activation dtype (F32 here: no rounding), then times the weight. Never folded into one factor
 * rsqrt * gamma: the two products round separately, as torch's do. */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <stdlib.h>

/* rsqrt(mean(x²) + eps) with eight partial sums (vectorisable without reassociating one chain,
 * and slightly more accurate than one). */
static float row_rstd(const float *in, int64_t H, float eps) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= H; i += 8)
        for (int j = 0; j < 8; j++) s[j] += in[i + j] * in[i + j];
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < H; i++) sum += in[i] * in[i];
    return 1.0f / sqrtf(sum / (float)H + eps);
}

/* The reference: the obvious loops, gamma converted per element. */
static void rmsnorm_row(float *out, const float *in, const uint16_t *gamma, int64_t H, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; i++) ss += in[i] * in[i];
    float rstd = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t i = 0; i < H; i++) {
        float n = in[i] * rstd;
        out[i] = pln_f16_to_f32(gamma[i]) * n;
    }
}

/* The fast path: g = gamma in fp32, converted once per call. */
static void rmsnorm_row_fast(float *out, const float *in, const float *g, int64_t H, float eps) {
    float rstd = row_rstd(in, H, eps);
    for (int64_t i = 0; i < H; i++) {
        float n = in[i] * rstd;
        out[i] = g[i] * n;
    }
}

static float *convert_f16(const uint16_t *v, int64_t H) {
    float *f = malloc((size_t)H * sizeof *f);
    if (f)
        for (int64_t i = 0; i < H; i++) f[i] = pln_f16_to_f32(v[i]);
    return f;
}

void pln_cpu_rmsnorm(pln_cpu *c, float *out, const float *in, const uint16_t *gamma, int32_t T,
                     int64_t H, float eps) {
    float *g = c->isa == PLN_CPU_ISA_REF ? NULL : convert_f16(gamma, H);
    if (!g) {   /* the reference, or no memory for the fast path's table */
        for (int32_t t = 0; t < T; t++) rmsnorm_row(out + t * H, in + t * H, gamma, H, eps);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++) rmsnorm_row_fast(out + t * H, in + t * H, g, H, eps);
    free(g);
}

void pln_cpu_residual_rmsnorm(pln_cpu *c, float *x, const float *y, const uint16_t *bias,
                              const uint16_t *gamma, float *ln_out, int32_t T, int64_t H, float eps) {
    float *g = c->isa == PLN_CPU_ISA_REF ? NULL : convert_f16(gamma, H);
    float *bf = g && bias ? convert_f16(bias, H) : NULL;
    if (!g || (bias && !bf)) {
        for (int32_t t = 0; t < T; t++) {
            float *xr = x + t * H;
            const float *yr = y ? y + t * H : NULL;
            for (int64_t i = 0; i < H; i++)
                xr[i] += (yr ? yr[i] : 0.0f) + (bias ? pln_f16_to_f32(bias[i]) : 0.0f);
            rmsnorm_row(ln_out + t * H, xr, gamma, H, eps);
        }
        free(g);
        return;
    }
    /* one pass over x while it is in cache: the residual add, then the norm of the new row */
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++) {
        float *xr = x + t * H;
        const float *yr = y ? y + t * H : NULL;
        if (bf && yr) {
            for (int64_t i = 0; i < H; i++) xr[i] += yr[i] + bf[i];
        } else if (bf) {
            for (int64_t i = 0; i < H; i++) xr[i] += bf[i];
        } else if (yr) {
            for (int64_t i = 0; i < H; i++) xr[i] += yr[i];
        }
        rmsnorm_row_fast(ln_out + t * H, xr, g, H, eps);
    }
    free(bf);
    free(g);
}
