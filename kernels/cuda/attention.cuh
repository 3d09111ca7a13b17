/* attention.cuh — attention over the paged KV cache for decode and prefill alike:
 * softmax(q·kᵀ/sqrt(d) + slope·j, causal) · v with scale, ALiBi and the causal mask fused and an
 * fp32 online softmax. Each (token, head) is split along the keys into chunks of
 * PLN_ATTN_CHUNK keys (flash-decoding), so long contexts fill the GPU; the partial states are merged
 * with pln_softmax_merge. Scores exist only per chunk in shared memory: the full score matrix of
 * a long prompt is never materialized. head_dim must be a multiple of 8, at most 256.
 * Either head layout of pln_attn_meta (BLOOM's interleaved heads, or grouped-query: q head h reads
 * KV head h / (n_head / n_kv_head); pln_qkv_layout in kv_append.cuh); slopes NULL: no bias.
 * Decode steps (at most two tokens per sequence, power-of-two block sizes) run paged
 * flash-decoding instead: a lane group per key row with 16-byte loads, online softmax per group,
 * the q heads of one KV head (up to 8) in one block so each K/V row is read once for all of them,
 * splits sized to fill the SMs and merged by the last block to finish (one launch; ctx->attn_splits
 * forces or disables it).
 * Optionally (ctx->attn_tiled), prefill-heavy steps run a query-tiled kernel instead, where 16
 * consecutive tokens of a sequence share each K/V chunk staged in shared memory (head_dim 8, 16,
 * 32, 64 or 128). */
#ifndef PLN_CUDA_ATTENTION_CUH
#define PLN_CUDA_ATTENTION_CUH

#include "kernels/cuda/common.cuh"

#define PLN_ATTN_CHUNK 128
/* Default bound on the split-key partial states of one launch (ctx->attn_scratch): longer steps
 * run in token groups. */
#define PLN_ATTN_SCRATCH ((size_t)256 << 20)

int pln_cuda_attention(pln_cuda_ctx *c, void *out, const void *qkv, const void *k_cache,
                       const void *v_cache, const pln_attn_meta *m, const float *slopes,
                       int32_t n_head_local, int32_t head_dim);

/* kv_append then attention (backend.h append_attention): on decode steps with one token per
 * sequence and the flash-decoding kernel, one launch that takes each token's own key and value
 * from qkv and writes them to the cache as it goes; otherwise the two ops. */
int pln_cuda_append_attention(pln_cuda_ctx *c, void *out, const void *qkv, void *k_cache, void *v_cache,
                              const pln_attn_meta *m, const float *slopes, int32_t n_head_local,
                              int32_t head_dim);

#endif
