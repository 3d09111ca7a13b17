/* kv_append.cu — one block of KV_THREADS per token, covering all of the rank's KV heads: copies k
 * and v rows into the token's cache slot (block_table[seq][pos / block_size], row
 * pos % block_size). q stays in the qkv buffer, where attention reads it. Decode steps fuse this
 * into the flash-decoding attention kernel (attention.cu); this serves prefill and mixed steps.
 * (One 32-thread block per head, as before, capped an SM at 32 blocks: half its threads.) */
#include "kernels/cuda/kv_append.cuh"

#define KV_THREADS 128

__global__ void __launch_bounds__(KV_THREADS)
kv_append_kernel(const __half *qkv, __half *kc, __half *vc, const int32_t *tok_seq, const int32_t *tok_pos,
                 const int32_t *block_table, int block_size, int max_blocks, pln_qkv_layout L, int D, bool vec)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int t = blockIdx.x;
    const int seq = tok_seq[t], pos = tok_pos[t];
    const int blk = block_table[(int64_t)seq * max_blocks + pos / block_size];
    const int64_t slot = (int64_t)blk * L.nkv * block_size + pos % block_size;   /* head h: (slot + h * bs) * D */
    const int per = vec ? D / 8 : D;   /* pieces per head row */
    for (int i = threadIdx.x; i < L.nkv * per; i += KV_THREADS) {
        const int h = i / per, c = i % per;
        const int64_t dst = (slot + (int64_t)h * block_size) * D;
        const __half *k = qkv + (int64_t)t * L.stride + L.k0 + (int64_t)h * L.kv_step;
        const __half *v = qkv + (int64_t)t * L.stride + L.v0 + (int64_t)h * L.kv_step;
        if (vec) {
            ((int4 *)(kc + dst))[c] = ((const int4 *)k)[c];
            ((int4 *)(vc + dst))[c] = ((const int4 *)v)[c];
        } else {
            kc[dst + c] = k[c];
            vc[dst + c] = v[c];
        }
    }
}

int pln_cuda_kv_append(pln_cuda_ctx *c, const void *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head_local, int32_t head_dim)
{
    if (m->n_tokens <= 0) return 0;
    if (m->block_size <= 0 || head_dim <= 0 || n_head_local <= 0)
        return pln_errorf("kv_append: block_size %d, head_dim %d, heads %d must be positive",
                          m->block_size, head_dim, n_head_local);
    if (m->n_kv_head < 0 || (m->n_kv_head > 0 && n_head_local % m->n_kv_head != 0))
        return pln_errorf("kv_append: %d KV heads do not divide the %d q heads (grouped-query layout)",
                          m->n_kv_head, n_head_local);
    bool vec = head_dim % 8 == 0 && ((uintptr_t)qkv & 15) == 0 && ((uintptr_t)k_cache & 15) == 0 &&
               ((uintptr_t)v_cache & 15) == 0;
    PLN_LAUNCH(dim3((unsigned)m->n_tokens), KV_THREADS, 0, c->stream, kv_append_kernel)(
        (const __half *)qkv, (__half *)k_cache, (__half *)v_cache, m->tok_seq, m->tok_pos, m->block_table,
        m->block_size, m->max_blocks, pln_qkv_layout_of(m, n_head_local, head_dim), head_dim, vec);
    cudaCheckLaunch();
    return 0;
}
