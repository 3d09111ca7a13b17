/* kv_append.cu — one block per (token, head): copies k and v rows into the token's cache slot
 * (block_table[seq][pos / block_size], row pos % block_size). q stays in the qkv buffer, where
 * attention reads it. */
#include "kernels/cuda/kv_append.cuh"

__global__ void kv_append_kernel(const __half *qkv, __half *kc, __half *vc, const int32_t *tok_seq,
                                 const int32_t *tok_pos, const int32_t *block_table, int block_size,
                                 int max_blocks, int nh, int D, bool vec)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int seq = tok_seq[t], pos = tok_pos[t];
    const int blk = block_table[(int64_t)seq * max_blocks + pos / block_size];
    const int64_t dst = (((int64_t)blk * nh + h) * block_size + pos % block_size) * D;
    const __half *k = qkv + ((int64_t)t * nh * 3 + (int64_t)h * 3 + 1) * D;
    const __half *v = k + D;
    if (vec) {
        for (int i = threadIdx.x; i < D / 8; i += blockDim.x) {
            ((int4 *)(kc + dst))[i] = ((const int4 *)k)[i];
            ((int4 *)(vc + dst))[i] = ((const int4 *)v)[i];
        }
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) { kc[dst + i] = k[i]; vc[dst + i] = v[i]; }
    }
}

int pln_cuda_kv_append(pln_cuda_ctx *c, const void *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head_local, int32_t head_dim)
{
    if (m->n_tokens <= 0) return 0;
    if (m->block_size <= 0 || head_dim <= 0 || n_head_local <= 0)
        return pln_errorf("kv_append: block_size %d, head_dim %d, heads %d must be positive",
                          m->block_size, head_dim, n_head_local);
    bool vec = head_dim % 8 == 0 && ((uintptr_t)qkv & 15) == 0 && ((uintptr_t)k_cache & 15) == 0 &&
               ((uintptr_t)v_cache & 15) == 0;
    dim3 grid((unsigned)m->n_tokens, (unsigned)n_head_local);
    PLN_LAUNCH(grid, 32, 0, c->stream, kv_append_kernel)((const __half *)qkv, (__half *)k_cache, (__half *)v_cache,
                                                 m->tok_seq, m->tok_pos, m->block_table, m->block_size,
                                                 m->max_blocks, n_head_local, head_dim, vec);
    cudaCheckLaunch();
    return 0;
}
