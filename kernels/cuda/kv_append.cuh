/* kv_append.cuh — splits the fused QKV output (per-head interleaved q, k, v) and appends each
 * token's k and v to the paged KV cache of kernels/backend.h. */
#ifndef PLN_CUDA_KV_APPEND_CUH
#define PLN_CUDA_KV_APPEND_CUH

#include "kernels/cuda/common.cuh"

int pln_cuda_kv_append(pln_cuda_ctx *c, const void *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head_local, int32_t head_dim);

#endif
