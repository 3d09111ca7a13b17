/* sample.cu — repetition penalty and temperature kernels; top-k as a radix select per row (the
 * k candidates found in four histogram passes, then ranked; ties keep the lower id first) plus
 * one reduction per row for max and sum of exponentials. */
#include "kernels/cuda/sample.cuh"

#include <string.h>

/* One block per row. A seen id listed twice is still penalised once (HF gathers, changes and
 * scatters back): a per-row bitmap in global scratch marks ids already done; atomicOr tells each
 * thread whether it is the first to claim its id. */
__global__ void penalty_kernel(float *logits, int64_t v0, int64_t vn, const float *penalty,
                               const int32_t *off, const int32_t *seen, uint32_t *bitmap, int64_t words)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int s = blockIdx.x;
    const float pen = penalty[s];
    if (pen == 1.0f) return;
    uint32_t *bm = bitmap + (int64_t)s * words;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) bm[i] = 0;
    __syncthreads();
    for (int i = off[s] + threadIdx.x; i < off[s + 1]; i += blockDim.x) {
        int64_t id = (int64_t)seen[i] - v0;
        if (id < 0 || id >= vn) continue;
        uint32_t bit = 1u << (id & 31);
        if (atomicOr(&bm[id >> 5], bit) & bit) continue;
        float *l = logits + (int64_t)s * vn + id;
        *l = *l > 0.0f ? *l / pen : *l * pen;
    }
}

__global__ void temperature_kernel(float *logits, int64_t vn, const float *inv_t)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int s = blockIdx.y;
    const float it = inv_t[s];
    if (it == 1.0f) return;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < vn; i += (int64_t)gridDim.x * blockDim.x)
        logits[(int64_t)s * vn + i] *= it;
}

int pln_cuda_logit_process(pln_cuda_ctx *c, float *logits, int64_t v0, int64_t vn, const pln_logit_proc *p)
{
    if (p->n_rows <= 0) return 0;
    if (p->penalty && p->seen_offsets && p->seen_ids) {
        const int64_t words = (vn + 31) / 32;
        uint32_t *bm = (uint32_t *)pln_cuda_scratch(c, (size_t)p->n_rows * words * 4);
        if (!bm) return -1;
        PLN_LAUNCH(p->n_rows, 256, 0, c->stream, penalty_kernel)(logits, v0, vn, p->penalty, p->seen_offsets, p->seen_ids,
                                                         bm, words);
        cudaCheckLaunch();
    }
    if (p->inv_temperature) {
        dim3 grid((unsigned)pln_cdiv(vn, 256 * 8) > 0 ? (unsigned)pln_cdiv(vn, 256 * 8) : 1u, (unsigned)p->n_rows);
        PLN_LAUNCH(grid, 256, 0, c->stream, temperature_kernel)(logits, vn, p->inv_temperature);
        cudaCheckLaunch();
    }
    return 0;
}

/* Row max and sum(exp(l - max)); NaN logits are ignored. -inf rows give max -inf, sum 0. */
__global__ void rowstat_kernel(const float *logits, int64_t vn, float *mx, float *se)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ float scratch[32];
    const float *r = logits + (int64_t)blockIdx.x * vn;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < vn; i += blockDim.x) m = fmaxf(m, r[i]);
    m = pln_block_max(m, scratch);
    float s = 0.0f;
    if (m != -INFINITY)
        for (int64_t i = threadIdx.x; i < vn; i += blockDim.x) { float v = r[i]; if (v == v) s += expf(v - m); }
    s = pln_block_sum(s, scratch);
    if (threadIdx.x == 0) { mx[blockIdx.x] = m; se[blockIdx.x] = s; }
}

/* ---- top-k: a radix select per row (one block), then only the k candidates are ranked ----------
 * Keys order candidates as the CPU backend does: NaN ranks as -inf and -0.0 ties +0.0, mapped to
 * unsigned integers that compare like the floats. Four 8-bit histogram passes (most significant
 * first) find the k-th largest key T and how many keys equal to T are needed; one pass in index
 * order then collects every key above T and the needed keys equal to T with the lowest ids (ties
 * keep the lower id), and each candidate's rank among the k is counted. No full-row sort. */
#define TOPK_THREADS 256

__device__ __forceinline__ uint32_t topk_key(float v)
{
    v = v != v ? -INFINITY : (v == 0.0f ? 0.0f : v);
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* cand: k ids of scratch per row. Writes vals/ids [k] of row blockIdx.x, best first. */
__global__ void __launch_bounds__(TOPK_THREADS)
topk_kernel(const float *logits, int64_t vn, int k, int64_t v0, int32_t *cand, float *ovals, int32_t *oids)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_need;
    __shared__ int s_wg[TOPK_THREADS / 32], s_we[TOPK_THREADS / 32];
    const float *r = logits + (int64_t)blockIdx.x * vn;
    int32_t *cd = cand + (int64_t)blockIdx.x * k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned prefix = 0, need = (unsigned)k;
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        const unsigned hmask = pass == 0 ? 0u : 0xffffffffu << (shift + 8);
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < vn; i += blockDim.x) {
            const uint32_t u = topk_key(r[i]);
            if ((u & hmask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {   /* the bin holding the need-th largest of the keys still in play */
            unsigned acc = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (acc + hist[b] >= need) break;
                acc += hist[b];
            }
            s_prefix = prefix | ((unsigned)b << shift);
            s_need = need - acc;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        __syncthreads();   /* every thread has read s_prefix/s_need before the next pass */
    }
    /* prefix is T; keys above T fill cd[0, k - need), keys equal to T the rest, in id order */
    const unsigned n_gt = (unsigned)k - need;
    unsigned base_gt = 0, base_eq = 0;
    for (int64_t c0 = 0; c0 < vn; c0 += blockDim.x) {
        const int64_t i = c0 + threadIdx.x;
        const uint32_t u = i < vn ? topk_key(r[i]) : 0u;
        const bool gt = i < vn && u > prefix, eq = i < vn && u == prefix;
        const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) { s_wg[warp] = __popc(bg); s_we[warp] = __popc(be); }
        __syncthreads();
        unsigned og = base_gt, oe = base_eq, tg = 0, te = 0;
        for (int w = 0; w < nw; w++) {
            if (w < warp) { og += s_wg[w]; oe += s_we[w]; }
            tg += s_wg[w]; te += s_we[w];
        }
        const unsigned below = (1u << lane) - 1u;
        og += __popc(bg & below);
        oe += __popc(be & below);
        if (gt) cd[og] = (int32_t)i;
        if (eq && oe < need) cd[n_gt + oe] = (int32_t)i;
        base_gt += tg;
        base_eq += te;
        __syncthreads();   /* s_wg/s_we are rewritten for the next chunk */
    }
    /* rank each candidate among the k: larger key first, lower id on ties */
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const int32_t id = cd[i];
        const uint32_t u = topk_key(r[id]);
        int rank = 0;
        for (int j = 0; j < k; j++) {
            const int32_t jd = cd[j];
            const uint32_t w = topk_key(r[jd]);
            rank += w > u || (w == u && jd < id);
        }
        ovals[(int64_t)blockIdx.x * k + rank] = r[id];
        oids[(int64_t)blockIdx.x * k + rank] = (int32_t)(v0 + id);
    }
}

int pln_cuda_topk(pln_cuda_ctx *c, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k,
                  float *vals, int32_t *ids, float *row_max, float *row_sumexp)
{
    if (S <= 0) return 0;
    if (k < 0 || k > vn) return pln_errorf("topk: k = %d must be in 0..%lld", k, (long long)vn);
    if (vn > INT32_MAX) return pln_errorf("topk: a row of %lld logits is too long", (long long)vn);
    /* packed results (what crosses to the host): vals [S, k], ids [S, k], max [S], sumexp [S] */
    const size_t packed = (size_t)S * k * 8 + (size_t)S * 8;
    const size_t need = pln_align_up(packed, 256) + (size_t)S * k * 4;
    char *w = (char *)pln_cuda_scratch(c, need);
    if (!w) return -1;
    char *pk = w;
    int32_t *cand = (int32_t *)(w + pln_align_up(packed, 256));
    float *pvals = (float *)pk;
    int32_t *pids = (int32_t *)(pk + (size_t)S * k * 4);
    float *pmax = (float *)(pk + (size_t)S * k * 8);
    float *psum = pmax + S;
    PLN_LAUNCH(S, 256, 0, c->stream, rowstat_kernel)(logits, vn, pmax, psum);
    cudaCheckLaunch();
    if (k > 0) {
        PLN_LAUNCH(S, TOPK_THREADS, 0, c->stream, topk_kernel)(logits, vn, k, v0, cand, pvals, pids);
        cudaCheckLaunch();
    }
    char *h = (char *)pln_cuda_host_pinned(c, packed);
    if (!h) return -1;
    cudaCheck(cudaMemcpyAsync(h, pk, packed, cudaMemcpyDeviceToHost, c->stream));
    cudaCheck(cudaStreamSynchronize(c->stream));
    if (vals) memcpy(vals, h, (size_t)S * k * 4);
    if (ids) memcpy(ids, h + (size_t)S * k * 4, (size_t)S * k * 4);
    if (row_max) memcpy(row_max, h + (size_t)S * k * 8, (size_t)S * 4);
    if (row_sumexp) memcpy(row_sumexp, h + (size_t)S * k * 8 + (size_t)S * 4, (size_t)S * 4);
    return 0;
}
