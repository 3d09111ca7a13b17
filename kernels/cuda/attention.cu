/* attention.cu — split-key attention (one block per token, head and key chunk) and the merge
 * of the chunks' partial softmax states. See attention.cuh. */
#include "kernels/cuda/attention.cuh"

#define ATTN_THREADS 128

__device__ __forceinline__ const __half *kv_row(const __half *cache, const int32_t *bt, int j, int bs, int nh,
                                                int h, int D)
{
    int blk = bt[j / bs];
    return cache + (((int64_t)blk * nh + h) * bs + j % bs) * D;
}

/* nsplit == 1: writes the normalized output. Else the chunk's state: pm/ps [T, nh, nsplit] and
 * pacc [T, nh, nsplit, D] (sum of exp(score - m) * v, not normalized). */
__global__ void __launch_bounds__(ATTN_THREADS)
attn_chunk_kernel(__half *out, float *pm, float *ps, float *pacc, const __half *qkv, const __half *kc,
                  const __half *vc, const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *block_table,
                  int bs, int max_blocks, const float *slopes, int nh, int D, int nsplit)
{
    __shared__ float qs[256];
    __shared__ float sc[PLN_ATTN_CHUNK];
    __shared__ float red[ATTN_THREADS * 8];
    __shared__ float scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
    const int seq = tok_seq[t], pos = tok_pos[t];
    const int j0 = sp * PLN_ATTN_CHUNK;
    const int j1 = min(j0 + PLN_ATTN_CHUNK, pos + 1);
    const int64_t pidx = ((int64_t)t * nh + h) * nsplit + sp;
    if (j0 >= j1) {   /* this chunk lies past the token's last key: an empty state */
        if (threadIdx.x == 0) { pm[pidx] = -INFINITY; ps[pidx] = 0.0f; }
        for (int d = threadIdx.x; d < D; d += ATTN_THREADS) pacc[pidx * D + d] = 0.0f;
        return;
    }
    const int32_t *bt = block_table + (int64_t)seq * max_blocks;
    const float slope = slopes[h];
    const float inv_norm = rsqrtf((float)D);
    const __half *q = qkv + ((int64_t)t * nh * 3 + (int64_t)h * 3) * D;
    for (int d = threadIdx.x; d < D; d += ATTN_THREADS) qs[d] = __half2float(q[d]) * inv_norm;
    __syncthreads();

    /* Scores: one thread per key, 16-byte loads along the key row, q broadcast from shared. */
    float lmax = -INFINITY;
    for (int j = j0 + threadIdx.x; j < j1; j += ATTN_THREADS) {
        const int4 *kr = (const int4 *)kv_row(kc, bt, j, bs, nh, h, D);
        float s = 0.0f;
#pragma unroll 8
        for (int d8 = 0; d8 < D / 8; d8++) {
            float kf[8];
            pln_h8_to_f(*(const pln_h8 *)&kr[d8], kf);
#pragma unroll
            for (int i = 0; i < 8; i++) s += qs[d8 * 8 + i] * kf[i];
        }
        s += slope * (float)j;
        sc[j - j0] = s;
        lmax = fmaxf(lmax, s);
    }
    const float m = pln_block_max(lmax, scratch);
    float lsum = 0.0f;
    for (int j = j0 + threadIdx.x; j < j1; j += ATTN_THREADS) {
        float p = __expf(sc[j - j0] - m);
        sc[j - j0] = p;
        lsum += p;
    }
    const float s = pln_block_sum(lsum, scratch);   /* its barriers also publish sc[] */

    /* p · V: R threads cover one value row with 16-byte loads, ATTN_THREADS / R rows at once. */
    const int R = D / 8, slots = ATTN_THREADS / R;
    const int slot = threadIdx.x / R, part = threadIdx.x % R;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (slot < slots) {
        for (int j = j0 + slot; j < j1; j += slots) {
            const pln_h8 *vr = (const pln_h8 *)kv_row(vc, bt, j, bs, nh, h, D) + part;
            float vf[8];
            pln_h8_to_f(*vr, vf);
            const float p = sc[j - j0];
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] += p * vf[i];
        }
#pragma unroll
        for (int i = 0; i < 8; i++) red[slot * D + part * 8 + i] = acc[i];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += ATTN_THREADS) {
        float v = 0.0f;
        for (int k = 0; k < slots; k++) v += red[k * D + d];
        if (nsplit == 1) out[(int64_t)t * nh * D + (int64_t)h * D + d] = __float2half_rn(v / s);
        else pacc[pidx * D + d] = v;
    }
    if (nsplit > 1 && threadIdx.x == 0) { pm[pidx] = m; ps[pidx] = s; }
}

/* One block per (token, head), one thread per output dimension. */
__global__ void attn_merge_kernel(__half *out, const float *pm, const float *ps, const float *pacc, int nh, int D,
                                  int nsplit)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int64_t base = ((int64_t)t * nh + h) * nsplit;
    pln_softmax_state st = {-INFINITY, 0.0f};
    for (int k = 0; k < nsplit; k++) {
        pln_softmax_state b = {pm[base + k], ps[base + k]};
        st = pln_softmax_merge(st, b);
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nsplit; k++)
            if (pm[base + k] != -INFINITY) v += pacc[(base + k) * D + d] * __expf(pm[base + k] - st.m);
        out[(int64_t)t * nh * D + (int64_t)h * D + d] = __float2half_rn(v / st.s);
    }
}

int pln_cuda_attention(pln_cuda_ctx *c, void *out, const void *qkv, const void *k_cache,
                       const void *v_cache, const pln_attn_meta *m, const float *slopes,
                       int32_t n_head_local, int32_t head_dim)
{
    const int T = m->n_tokens, nh = n_head_local, D = head_dim;
    if (T <= 0) return 0;
    if (D % 8 != 0 || D > 256 || D <= 0)
        return pln_errorf("attention: head_dim %d is not supported (a multiple of 8, at most 256)", D);
    if (((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15)
        return pln_errorf("attention: qkv and the KV cache must be 16-byte aligned");
    if (m->max_pos <= 0) return pln_errorf("attention: max_pos %d must be positive", m->max_pos);
    const int nsplit = pln_cdiv(m->max_pos, PLN_ATTN_CHUNK);
    float *pm = nullptr, *ps = nullptr, *pacc = nullptr;
    if (nsplit > 1) {
        size_t nst = (size_t)T * nh * nsplit;
        float *w = (float *)pln_cuda_scratch(c, nst * (2 + (size_t)D) * sizeof(float));
        if (!w) return -1;
        pm = w; ps = w + nst; pacc = w + 2 * nst;
    }
    dim3 grid((unsigned)T, (unsigned)nh, (unsigned)nsplit);
    attn_chunk_kernel<<<grid, ATTN_THREADS, 0, c->stream>>>(
        (__half *)out, pm, ps, pacc, (const __half *)qkv, (const __half *)k_cache, (const __half *)v_cache,
        m->tok_seq, m->tok_pos, m->block_table, m->block_size, m->max_blocks, slopes, nh, D, nsplit);
    cudaCheckLaunch();
    if (nsplit > 1) {
        attn_merge_kernel<<<dim3((unsigned)T, (unsigned)nh), D, 0, c->stream>>>((__half *)out, pm, ps, pacc, nh, D,
                                                                                nsplit);
        cudaCheckLaunch();
    }
    return 0;
}
