/* rmsnorm.cuh — RMSNorm, and the fused residual (+ bias) + RMSNorm of every Llama block boundary.
 * fp16 in and out, the mean of squares in fp32; transformers' LlamaRMSNorm order: x * rsqrt(mean
 * + eps) rounded to fp16, then times the weight (rounded again). */
#ifndef PLN_CUDA_RMSNORM_CUH
#define PLN_CUDA_RMSNORM_CUH

#include "kernels/cuda/common.cuh"

/* out = RMSNorm(in) * gamma; out may equal in. */
int pln_cuda_rmsnorm(pln_cuda_ctx *c, void *out, const void *in, const uint16_t *gamma, int32_t T, int64_t H,
                     float eps);
/* x += y (+ bias; both may be NULL), rounded to fp16; ln_out = RMSNorm(x) * gamma. */
int pln_cuda_residual_rmsnorm(pln_cuda_ctx *c, void *x, const void *y, const uint16_t *bias, const uint16_t *gamma,
                              void *ln_out, int32_t T, int64_t H, float eps);

#endif
