/* sample.cu — repetition penalty and temperature kernels; top-k as a stable segmented radix sort
 * of each row (descending, ids ascending on input, so ties keep the lower id first) plus one
 * reduction per row for max and sum of exponentials. */
#include "kernels/cuda/sample.cuh"

#include <cub/device/device_segmented_radix_sort.cuh>
#include <string.h>

/* One block per row: the row's seen ids are distinct, so threads touch distinct logits. */
__global__ void penalty_kernel(float *logits, int64_t v0, int64_t vn, const float *penalty,
                               const int32_t *off, const int32_t *seen)
{
    const int s = blockIdx.x;
    const float pen = penalty[s];
    if (pen == 1.0f) return;
    for (int i = off[s] + threadIdx.x; i < off[s + 1]; i += blockDim.x) {
        int64_t id = seen[i];
        if (id < v0 || id >= v0 + vn) continue;
        float *l = logits + (int64_t)s * vn + (id - v0);
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
        penalty_kernel<<<p->n_rows, 128, 0, c->stream>>>(logits, v0, vn, p->penalty, p->seen_offsets, p->seen_ids);
        cudaCheckLaunch();
    }
    if (p->inv_temperature) {
        dim3 grid((unsigned)pln_cdiv(vn, 256 * 8) > 0 ? (unsigned)pln_cdiv(vn, 256 * 8) : 1u, (unsigned)p->n_rows);
        temperature_kernel<<<grid, 256, 0, c->stream>>>(logits, vn, p->inv_temperature);
        cudaCheckLaunch();
    }
    return 0;
}

__global__ void iota_kernel(int32_t *ids, int32_t *offsets, int S, int64_t vn)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)S * vn) ids[i] = (int32_t)(i % vn);
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
    if (k <= 0 || k > vn) return pln_errorf("topk: k = %d must be in 1..%lld", k, (long long)vn);
    if ((int64_t)S * vn > INT32_MAX) return pln_errorf("topk: %d rows of %lld logits is too many at once", S, (long long)vn);
    const int64_t n = (int64_t)S * vn;
    /* scratch layout: ids_in, ids_out, keys_out, offsets, stats, packed results, cub temp */
    size_t temp = 0;
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, temp, (const float *)nullptr, (float *)nullptr, (const int32_t *)nullptr, (int32_t *)nullptr,
        (int)n, S, (const int32_t *)nullptr, (const int32_t *)nullptr, 0, 32, c->stream));
    size_t packed = (size_t)S * k * 8 + (size_t)S * 8;
    size_t need = pln_align_up((size_t)n * 4, 256) * 3 + pln_align_up((size_t)(S + 1) * 4, 256) +
                  pln_align_up(packed, 256) + temp;
    char *w = (char *)pln_cuda_scratch(c, need);
    if (!w) return -1;
    int32_t *ids_in = (int32_t *)w; w += pln_align_up((size_t)n * 4, 256);
    int32_t *ids_out = (int32_t *)w; w += pln_align_up((size_t)n * 4, 256);
    float *keys_out = (float *)w; w += pln_align_up((size_t)n * 4, 256);
    int32_t *offs = (int32_t *)w; w += pln_align_up((size_t)(S + 1) * 4, 256);
    char *pk = w; w += pln_align_up(packed, 256);
    float *pvals = (float *)pk;
    int32_t *pids = (int32_t *)(pk + (size_t)S * k * 4);
    float *pmax = (float *)(pk + (size_t)S * k * 8);
    float *psum = pmax + S;

    iota_kernel<<<pln_cdiv(n + 1, 256), 256, 0, c->stream>>>(ids_in, offs, S, vn);
    cudaCheckLaunch();
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        w, temp, logits, keys_out, ids_in, ids_out, (int)n, S, offs, offs + 1, 0, 32, c->stream));
    rowstat_kernel<<<S, 256, 0, c->stream>>>(logits, vn, pmax, psum);
    cudaCheckLaunch();
    pack_kernel<<<S, 128, 0, c->stream>>>(keys_out, ids_out, vn, k, v0, pvals, pids);
    cudaCheckLaunch();
    char *h = (char *)pln_cuda_host_pinned(c, packed);
    if (!h) return -1;
    cudaCheck(cudaMemcpyAsync(h, pk, packed, cudaMemcpyDeviceToHost, c->stream));
    cudaCheck(cudaStreamSynchronize(c->stream));
    memcpy(vals, h, (size_t)S * k * 4);
    memcpy(ids, h + (size_t)S * k * 4, (size_t)S * k * 4);
    memcpy(row_max, h + (size_t)S * k * 8, (size_t)S * 4);
    memcpy(row_sumexp, h + (size_t)S * k * 8 + (size_t)S * 4, (size_t)S * 4);
    return 0;
}
