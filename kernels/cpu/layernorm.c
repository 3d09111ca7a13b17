/* layernorm.c — LayerNorm and the fused residual + bias + LayerNorm on the CPU (fp32 statistics,
 * two passes over the row for the variance: as accurate as torch's, and the row is in cache). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>

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

void pln_cpu_layernorm(pln_cpu *c, float *out, const float *in, const uint16_t *gamma,
                       const uint16_t *beta, int32_t T, int64_t H, float eps) {
    if (c->isa == PLN_CPU_ISA_REF) {
        for (int32_t t = 0; t < T; t++) layernorm_row(out + t * H, in + t * H, gamma, beta, H, eps);
        return;
    }
    #pragma omp parallel for schedule(static) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++) layernorm_row(out + t * H, in + t * H, gamma, beta, H, eps);
}

void pln_cpu_residual_layernorm(pln_cpu *c, float *x, const float *y, const uint16_t *bias,
                                const uint16_t *gamma, const uint16_t *beta, float *ln_out,
                                int32_t T, int64_t H, float eps) {
    if (c->isa == PLN_CPU_ISA_REF) {
        for (int32_t t = 0; t < T; t++)
            residual_layernorm_row(x + t * H, y ? y + t * H : NULL, bias, gamma, beta,
                                   ln_out + t * H, H, eps);
        return;
    }
    #pragma omp parallel for schedule(static) if (T > 1 && (int64_t)T * H > 32768)
    for (int32_t t = 0; t < T; t++)
        residual_layernorm_row(x + t * H, y ? y + t * H : NULL, bias, gamma, beta,
                               ln_out + t * H, H, eps);
}
