/* layernorm.cuh — LayerNorm, and the fused residual + bias + LayerNorm of every block boundary.
 * fp16 in and out, fp32 statistics (two passes over the row: mean, then variance). */
#ifndef PLN_CUDA_LAYERNORM_CUH
#define PLN_CUDA_LAYERNORM_CUH

#include "kernels/cuda/common.cuh"

/* out = LayerNorm(in) * gamma + beta; out may equal in. */
int pln_cuda_layernorm(pln_cuda_ctx *c, void *out, const void *in, const uint16_t *gamma,
                       const uint16_t *beta, int32_t T, int64_t H, float eps);
/* x += y + bias (bias may be NULL; y may be NULL for a plain LayerNorm of x); ln_out = LayerNorm(x). */
int pln_cuda_residual_layernorm(pln_cuda_ctx *c, void *x, const void *y, const uint16_t *bias,
                                const uint16_t *gamma, const uint16_t *beta, void *ln_out,
                                int32_t T, int64_t H, float eps);

#endif
