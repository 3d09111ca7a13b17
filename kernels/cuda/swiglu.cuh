/* swiglu.cuh — the Llama MLP's gate on the fused gate|up projection: out[T, I] = silu(in[:, 0:I]) *
 * in[:, I:2I], as transformers computes it in fp16 (SiLU in fp32 rounded to fp16, the product
 * rounded again). */
#ifndef PLN_CUDA_SWIGLU_CUH
#define PLN_CUDA_SWIGLU_CUH

#include "kernels/cuda/common.cuh"

int pln_cuda_swiglu(pln_cuda_ctx *c, void *out, const void *in, int32_t T, int64_t I);

#endif
