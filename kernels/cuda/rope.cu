/* rope.cu — one block per token: the token's cos and sin (head_dim / 2 of each, fp32 angles, then
 * fp16 as transformers casts them) into shared memory once, then every q and k head of its row
 * rotated in place, 8 pairs per thread with 16-byte loads and stores where head_dim % 16 == 0 and
 * qkv is 16-byte aligned, pair by pair otherwise. Not fused into kv_append or attention: one
 * launch per layer that reads and writes the q and k rows once (the decode kernel's fused append
 * then reads the rotated k from qkv). */
#include "kernels/cuda/rope.cuh"
#include "kernels/pln_math.h"

#define ROPE_THREADS 128

/* One pair in fp16 arithmetic: each product rounded, then the sum (torch's three fp16 kernels). */
__device__ __forceinline__ float rope_h(float a, float ca, float b, float sb, bool minus)
{
    const float p = __half2float(__float2half_rn(pln_mul_rn(a, ca)));
    const float q = __half2float(__float2half_rn(pln_mul_rn(b, sb)));
    return minus ? p - q : p + q;
}

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(__half *qkv, const int32_t *tok_pos, const float *inv_freq, int n_rot, int64_t stride, int D, bool vec)
{
    __shared__ float cs[256];   /* cos [D / 2] then sin [D / 2], fp16-rounded; D <= 256 */
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int t = blockIdx.x, half = D / 2;
    const int pos = tok_pos[t];
    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        const float a = pln_mul_rn((float)pos, inv_freq[i]);
        cs[i] = __half2float(__float2half_rn(cosf(a)));
        cs[half + i] = __half2float(__float2half_rn(sinf(a)));
    }
    __syncthreads();
    __half *row = qkv + (int64_t)t * stride;
    if (vec) {   /* 8 pairs per item: halves i..i+7 and their partners i+half.. */
        const int per = half / 8;
        for (int it = threadIdx.x; it < n_rot * per; it += ROPE_THREADS) {
            const int h = it / per, i0 = (it % per) * 8;
            __half *x = row + (int64_t)h * D + i0;
            float a[8], b[8], ya[8], yb[8];
            pln_h8_to_f(*(const pln_h8 *)x, a);
            pln_h8_to_f(*(const pln_h8 *)(x + half), b);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float c = cs[i0 + j], s = cs[half + i0 + j];
                ya[j] = rope_h(a[j], c, b[j], s, true);
                yb[j] = rope_h(b[j], c, a[j], s, false);
            }
            *(pln_h8 *)x = pln_f_to_h8(ya);
            *(pln_h8 *)(x + half) = pln_f_to_h8(yb);
        }
    } else {
        for (int it = threadIdx.x; it < n_rot * half; it += ROPE_THREADS) {
            const int h = it / half, i = it % half;
            __half *x = row + (int64_t)h * D + i;
            const float a = __half2float(x[0]), b = __half2float(x[half]), c = cs[i], s = cs[half + i];
            x[0] = __float2half_rn(rope_h(a, c, b, s, true));
            x[half] = __float2half_rn(rope_h(b, c, a, s, false));
        }
    }
}

int pln_cuda_rope(pln_cuda_ctx *c, void *qkv, const pln_attn_meta *m, const float *inv_freq, int32_t n_head_local,
                  int32_t head_dim)
{
    if (m->n_tokens <= 0) return 0;
    if (m->n_kv_head <= 0 || n_head_local % m->n_kv_head != 0)
        return pln_errorf("rope: needs the grouped-query layout (n_kv_head > 0 dividing the %d q heads), got %d",
                          n_head_local, m->n_kv_head);
    if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256)
        return pln_errorf("rope: head_dim %d is not supported (even, at most 256)", head_dim);
    const int64_t stride = (int64_t)(n_head_local + 2 * m->n_kv_head) * head_dim;
    const bool vec = head_dim % 16 == 0 && ((uintptr_t)qkv & 15) == 0;
    PLN_LAUNCH(dim3((unsigned)m->n_tokens), ROPE_THREADS, 0, c->stream, rope_kernel)(
        (__half *)qkv, m->tok_pos, inv_freq, n_head_local + m->n_kv_head, stride, head_dim, vec);
    cudaCheckLaunch();
    return 0;
}
