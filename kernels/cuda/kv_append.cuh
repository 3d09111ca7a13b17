/* kv_append.cuh — splits the fused QKV output and appends each token's k and v to the paged KV
 * cache of kernels/backend.h, in either head layout (pln_attn_meta.n_kv_head); and that layout,
 * which the attention kernels read q, k and v by as well. */
#ifndef PLN_CUDA_KV_APPEND_CUH
#define PLN_CUDA_KV_APPEND_CUH

#include "kernels/cuda/common.cuh"

/* Where a token's heads sit in its qkv row (in halves), and the cache's head count: BLOOM's per
 * head interleaved q, k, v (one KV head per q head), or grouped-query with all q heads, then the
 * k heads, then the v heads (q head h reads KV head h / group). Passed to kernels by value. */
struct pln_qkv_layout {
    int64_t stride;   /* one token's row */
    int q_step;       /* q head h at h * q_step */
    int kv_step;      /* KV head g: k at k0 + g * kv_step, v at v0 + g * kv_step */
    int k0, v0;
    int nkv;          /* heads in the cache */
    int group;        /* q heads per KV head */
};

static inline pln_qkv_layout pln_qkv_layout_of(const pln_attn_meta *m, int nh, int D)
{
    pln_qkv_layout L;
    if (m->n_kv_head <= 0) {
        L.stride = (int64_t)3 * nh * D; L.q_step = 3 * D; L.kv_step = 3 * D; L.k0 = D; L.v0 = 2 * D;
        L.nkv = nh; L.group = 1;
    } else {
        const int nk = m->n_kv_head;
        L.stride = (int64_t)(nh + 2 * nk) * D; L.q_step = D; L.kv_step = D; L.k0 = nh * D; L.v0 = (nh + nk) * D;
        L.nkv = nk; L.group = nh / nk;
    }
    return L;
}

int pln_cuda_kv_append(pln_cuda_ctx *c, const void *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head_local, int32_t head_dim);

#endif
