/* linear.cuh — out[T, rows] = in[T, cols] · Wᵀ (+ bias) (+ GeLU, or SwiGLU: out[T, rows / 2]),
 * fp16, int8 or int4 weight-only. epi is a pln_epilogue (backend.h).
 * SwiGLU in the GEMVs and the quantized GEMM: a warp's two row sets (g and g + 8) are a gate row
 * and its up row, so the pair meets in one lane (GEMM) or one block's reduction (GEMV); the plain
 * kernels compute both dots per warp; fp16 on cuBLASLt (no such epilogue there) writes the
 * projection to scratch and runs swiglu_kernel after it.
 *   T <= 16: a memory-bound tensor-core GEMV (16-byte weight loads, 8 in flight per lane,
 *            split along k inside the block), fp16 or int8 dequantized in registers;
 *   T  > 16: cuBLASLt fp16 with bias/GeLU epilogues, or an int8 tensor-core GEMM that
 *            dequantizes in registers (never an fp16 copy of the weights);
 *   int4 (packed, docs/FORMAT.md): a GEMV (T <= 16) and a GEMM that unpack 32 weights per
 *            16-byte load to fp16 in registers (mask + OR under 1024.0's exponent, byte-permuted
 *            activations), fp32 accumulation in the mma;
 *   other shapes (cols not a multiple of 64, group not a multiple of 16; int4: cols not a
 *            multiple of 128): a plain kernel.
 * out is F16 unless out_f32 (the logits); rows >= n_valid are set to -inf (vocab padding). */
#ifndef PLN_CUDA_LINEAR_CUH
#define PLN_CUDA_LINEAR_CUH

#include "kernels/cuda/common.cuh"

int pln_cuda_linear(pln_cuda_ctx *c, void *out, bool out_f32, const void *in, const pln_weight *W,
                    const uint16_t *bias, int32_t T, int epi, int64_t n_valid);
/* Releases the cuBLASLt plan cache (at backend destruction). */
void pln_cuda_linear_release(void);

#endif
