/* sample.cu — repetition penalty and temperature kernels; top-k as a stable segmented radix sort
 * of each row (descending, ids ascending on input, so ties keep the lower id first) plus one
 * reduction per row for max and sum of exponentials. */
#include "kernels/cuda/sample.cuh"

#include <cub/device/device_segmented_radix_sort.cuh>
#include <string.h>

/* One block per row. A seen id listed twice is still penalised once (HF gathers, changes and
 * scatters back): a per-row bitmap in global scratch marks ids already done; atomicOr tells each
 * thread whether it is the first to claim its id. */
__global__ void penalty_kernel(float *logits, int64_t v0, int64_t vn, const float *penalty,
                               const int32_t *off, const int32_t *seen, uint32_t *bitmap, int64_t words)
{
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
        penalty_kernel<<<p->n_rows, 256, 0, c->stream>>>(logits, v0, vn, p->penalty, p->seen_offsets, p->seen_ids,
                                                         bm, words);
        cudaCheckLaunch();
    }
    if (p->inv_temperature) {
        dim3 grid((unsigned)pln_cdiv(vn, 256 * 8) > 0 ? (unsigned)pln_cdiv(vn, 256 * 8) : 1u, (unsigned)p->n_rows);
        temperature_kernel<<<grid, 256, 0, c->stream>>>(logits, vn, p->inv_temperature);
        cudaCheckLaunch();
    }
    return 0;
}

/* Sort keys as the CPU backend orders candidates: NaN ranks below everything (-inf) and -0.0
 * ties with +0.0 (lower id first); ids 0..vn-1 per row; row offsets. */
__global__ void prep_kernel(const float *logits, float *keys, int32_t *ids, int32_t *offsets, int S, int64_t vn)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)S * vn) {
        float v = logits[i];
        keys[i] = v != v ? -INFINITY : (v == 0.0f ? 0.0f : v);
        ids[i] = (int32_t)(i % vn);
    }
    if (i <= S) offsets[i] = (int32_t)(i * vn);
}

/* Row max and sum(exp(l - max)); NaN logits are ignored. -inf rows give max -inf, sum 0. */
__global__ void rowstat_kernel(const float *logits, int64_t vn, float *mx, float *se)
{
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

/* Packs the first k of each sorted row, with global ids, next to the row stats. */
__global__ void pack_kernel(const float *sk, const int32_t *sv, int64_t vn, int k, int64_t v0, float *ovals,
                            int32_t *oids)
{
    const int s = blockIdx.x;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        ovals[(int64_t)s * k + i] = sk[(int64_t)s * vn + i];
        oids[(int64_t)s * k + i] = (int32_t)(v0 + sv[(int64_t)s * vn + i]);
    }
}

int pln_cuda_topk(pln_cuda_ctx *c, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k,
                  float *vals, int32_t *ids, float *row_max, float *row_sumexp)
{
    if (S <= 0) return 0;
    if (k < 0 || k > vn) return pln_errorf("topk: k = %d must be in 0..%lld", k, (long long)vn);
    if ((int64_t)S * vn > INT32_MAX) return pln_errorf("topk: %d rows of %lld logits is too many at once", S, (long long)vn);
    const int64_t n = (int64_t)S * vn;
    const size_t nb = pln_align_up((size_t)n * 4, 256);
    size_t temp = 0;
    if (k > 0)
        cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(
            nullptr, temp, (const float *)nullptr, (float *)nullptr, (const int32_t *)nullptr, (int32_t *)nullptr,
            (int)n, S, (const int32_t *)nullptr, (const int32_t *)nullptr, 0, 32, c->stream));
    /* packed results (what crosses to the host): vals [S, k], ids [S, k], max [S], sumexp [S] */
    const size_t packed = (size_t)S * k * 8 + (size_t)S * 8;
    const size_t need = (k > 0 ? nb * 4 + pln_align_up((size_t)(S + 1) * 4, 256) + temp : 0) + pln_align_up(packed, 256);
    char *w = (char *)pln_cuda_scratch(c, need);
    if (!w) return -1;
    char *pk = w; w += pln_align_up(packed, 256);
    float *pvals = (float *)pk;
    int32_t *pids = (int32_t *)(pk + (size_t)S * k * 4);
    float *pmax = (float *)(pk + (size_t)S * k * 8);
    float *psum = pmax + S;
    rowstat_kernel<<<S, 256, 0, c->stream>>>(logits, vn, pmax, psum);
    cudaCheckLaunch();
    if (k > 0) {
        float *keys_in = (float *)w; w += nb;
        float *keys_out = (float *)w; w += nb;
        int32_t *ids_in = (int32_t *)w; w += nb;
        int32_t *ids_out = (int32_t *)w; w += nb;
        int32_t *offs = (int32_t *)w; w += pln_align_up((size_t)(S + 1) * 4, 256);
        prep_kernel<<<pln_cdiv(n + 1, 256), 256, 0, c->stream>>>(logits, keys_in, ids_in, offs, S, vn);
        cudaCheckLaunch();
        /* Radix sort is stable: equal keys keep their input order, i.e. lower id first. */
        cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(
            w, temp, keys_in, keys_out, ids_in, ids_out, (int)n, S, offs, offs + 1, 0, 32, c->stream));
        pack_kernel<<<S, 128, 0, c->stream>>>(keys_out, ids_out, vn, k, v0, pvals, pids);
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
