/* rope.cuh — rotary position embedding in place on the q and k heads of the grouped qkv layout
 * (backend.h rope), as transformers computes it in fp16: angles (float)pos * inv_freq[i] in fp32,
 * cos and sin in fp32 rounded to fp16, then q * cos + rotate_half(q) * sin with each product and
 * the sum rounded to fp16. */
#ifndef PLN_CUDA_ROPE_CUH
#define PLN_CUDA_ROPE_CUH

#include "kernels/cuda/common.cuh"

int pln_cuda_rope(pln_cuda_ctx *c, void *qkv, const pln_attn_meta *m, const float *inv_freq, int32_t n_head_local,
                  int32_t head_dim);

#endif
