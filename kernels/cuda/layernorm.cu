/* layernorm.cu — one block per token row (or, with pln_cuda_set_ln_split, several blocks per row in two launches), statistics in fp32. Rows of up to 32768 halves are
 * held in registers and read once; others are read in three passes (L1-resident after the first). The residual variant writes the fp16-rounded sum back to
 * x and normalizes that rounded value, as a fp16 model does. */
#include "kernels/cuda/layernorm.cuh"

#define LN_THREADS 256

/* VEC: the row is handled in 16-byte chunks of 8 halves (H % 8 == 0), else element by element. */
template <bool VEC>
__global__ void __launch_bounds__(LN_THREADS)
residual_ln_kernel(__half *x, const __half *y, const __half *bias, const __half *gamma,
                   const __half *beta, __half *out, const __half *in, int64_t H, float eps)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ float scratch[32];
    const int64_t r = blockIdx.x;
    const __half *src = in ? in + r * H : x + r * H;
    /* pass 0 (residual only): x = x + y + bias, rounded to fp16, in place. */
    if (!in) {
        __half *xr = x + r * H;
        const __half *yr = y ? y + r * H : nullptr;
        if (VEC) {
            for (int64_t i = threadIdx.x * 8; i < H; i += LN_THREADS * 8) {
                float a[8], b[8], c[8];
                pln_h8_to_f(*(const pln_h8 *)(xr + i), a);
                if (yr) pln_h8_to_f(*(const pln_h8 *)(yr + i), b); else for (int j = 0; j < 8; j++) b[j] = 0.0f;
                if (bias) pln_h8_to_f(*(const pln_h8 *)(bias + i), c); else for (int j = 0; j < 8; j++) c[j] = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) a[j] += b[j] + c[j];
                *(pln_h8 *)(xr + i) = pln_f_to_h8(a);
            }
        } else {
            for (int64_t i = threadIdx.x; i < H; i += LN_THREADS) {
                float v = __half2float(xr[i]);
                if (yr) v += __half2float(yr[i]);
                if (bias) v += __half2float(bias[i]);
                xr[i] = __float2half_rn(v);
            }
        }
        /* No barrier: below, each thread re-reads only the elements it has just written (the same
         * index pattern), and the block sums that follow synchronize the block anyway. */
    }
    float s = 0.0f;
    if (VEC) {
        for (int64_t i = threadIdx.x * 8; i < H; i += LN_THREADS * 8) {
            float a[8];
            pln_h8_to_f(*(const pln_h8 *)(src + i), a);
#pragma unroll
            for (int j = 0; j < 8; j++) s += a[j];
        }
    } else {
        for (int64_t i = threadIdx.x; i < H; i += LN_THREADS) s += __half2float(src[i]);
    }
    const float mean = pln_block_sum(s, scratch) / (float)H;
    float v2 = 0.0f;
    if (VEC) {
        for (int64_t i = threadIdx.x * 8; i < H; i += LN_THREADS * 8) {
            float a[8];
            pln_h8_to_f(*(const pln_h8 *)(src + i), a);
#pragma unroll
            for (int j = 0; j < 8; j++) { float d = a[j] - mean; v2 += d * d; }
        }
    } else {
        for (int64_t i = threadIdx.x; i < H; i += LN_THREADS) { float d = __half2float(src[i]) - mean; v2 += d * d; }
    }
    const float rstd = rsqrtf(pln_block_sum(v2, scratch) / (float)H + eps);
    /* Every thread has read its whole share before any writes when out == in: each thread only
     * rewrites the elements it read itself. */
    __half *o = out + r * H;
    if (VEC) {
        for (int64_t i = threadIdx.x * 8; i < H; i += LN_THREADS * 8) {
            float a[8], gm[8], bt[8];
            pln_h8_to_f(*(const pln_h8 *)(src + i), a);
            pln_h8_to_f(*(const pln_h8 *)(gamma + i), gm);
            pln_h8_to_f(*(const pln_h8 *)(beta + i), bt);
#pragma unroll
            for (int j = 0; j < 8; j++) a[j] = (a[j] - mean) * rstd * gm[j] + bt[j];
            *(pln_h8 *)(o + i) = pln_f_to_h8(a);
        }
    } else {
        for (int64_t i = threadIdx.x; i < H; i += LN_THREADS)
            o[i] = __float2half_rn((__half2float(src[i]) - mean) * rstd * __half2float(gamma[i]) + __half2float(beta[i]));
    }
}

/* The fast path: the whole row held in registers (V 16-byte vectors per thread, up to 1024
 * threads, so H <= 32768), read once from global memory: one pass instead of three, which
 * matters at decode where one row is one block and the kernel is latency bound; gamma and beta
 * are loaded before the reductions (V <= 2: BLOOM-176B's 14336 is V = 2). */
template <int V>
__global__ void __launch_bounds__(1024)
residual_ln_reg_kernel(__half *x, const __half *y, const __half *bias, const __half *gamma,
                       const __half *beta, __half *out, const __half *in, int64_t H, float eps)
{
    __shared__ float scratch[32];
    const int64_t r = blockIdx.x;
    const int64_t nv = H / 8;
    /* gamma and beta are issued first (for V <= 2; V = 4 has no registers to spare under the
     * 1024-thread budget of 64), so their latency hides behind the row loads and the reductions
     * instead of following them */
    constexpr bool PF = V <= 2;
    pln_h8 gq[PF ? V : 1], bq[PF ? V : 1];
    if (PF) {
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int64_t v = threadIdx.x + (int64_t)u * blockDim.x;
            if (v < nv) { gq[u] = ((const pln_h8 *)gamma)[v]; bq[u] = ((const pln_h8 *)beta)[v]; }
        }
    }
    /* gamma and beta are parameters, never a previous kernel's output: with programmatic
     * dependent launch their loads overlap the previous kernel's tail */
    pln_pdl_wait();
    pln_pdl_trigger();
    float a[V][8];
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int64_t v = threadIdx.x + (int64_t)u * blockDim.x;
        if (v < nv) {
            pln_h8_to_f(((const pln_h8 *)((in ? in : x) + r * H))[v], a[u]);
            if (!in) {
                float b[8];
                if (y) { pln_h8_to_f(((const pln_h8 *)(y + r * H))[v], b); for (int j = 0; j < 8; j++) a[u][j] += b[j]; }
                if (bias) { pln_h8_to_f(((const pln_h8 *)bias)[v], b); for (int j = 0; j < 8; j++) a[u][j] += b[j]; }
                pln_h8 h = pln_f_to_h8(a[u]);
                ((pln_h8 *)(x + r * H))[v] = h;
                pln_h8_to_f(h, a[u]);   /* normalize the fp16-rounded sum, as a fp16 model does */
            }
#pragma unroll
            for (int j = 0; j < 8; j++) s += a[u][j];
        }
    }
    const float mean = pln_block_sum(s, scratch) / (float)H;
    float v2 = 0.0f;
#pragma unroll
    for (int u = 0; u < V; u++)
        if (threadIdx.x + (int64_t)u * blockDim.x < nv)
#pragma unroll
            for (int j = 0; j < 8; j++) { float d = a[u][j] - mean; v2 += d * d; }
    const float rstd = rsqrtf(pln_block_sum(v2, scratch) / (float)H + eps);
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int64_t v = threadIdx.x + (int64_t)u * blockDim.x;
        if (v < nv) {
            float gm[8], bt[8];
            pln_h8_to_f(PF ? gq[PF ? u : 0] : ((const pln_h8 *)gamma)[v], gm);
            pln_h8_to_f(PF ? bq[PF ? u : 0] : ((const pln_h8 *)beta)[v], bt);
#pragma unroll
            for (int j = 0; j < 8; j++) a[u][j] = (a[u][j] - mean) * rstd * gm[j] + bt[j];
            ((pln_h8 *)(out + r * H))[v] = pln_f_to_h8(a[u]);
        }
    }
}

/* ---- split rows: several blocks per row (pln_cuda_set_ln_split) -------------------------------
 * At batch 1 the kernels above put the whole row on one SM. Split, a row is LN_SPLIT_THREADS * 8
 * halves per block, in two launches: the first adds the residual to its slice and writes the
 * slice's mean and sum of squared deviations (M2); the second merges the row's partials (Chan's
 * pairwise update, in block order: every block gets the same statistics) and normalizes its slice. Its
 * gamma and beta are loaded before griddepcontrol.wait, so they overlap the first launch. */
#define LN_SPLIT_THREADS 128

__device__ __forceinline__ int ln_split_count(int64_t nv, int b)
{
    const int64_t left = nv - (int64_t)b * LN_SPLIT_THREADS;
    return (int)(left < LN_SPLIT_THREADS ? left : LN_SPLIT_THREADS) * 8;
}

/* grid (blocks per row, T). in == NULL: x += y + bias on the slice (rounded to fp16, in place),
 * statistics of the rounded sum; else statistics of in. part[row * gridDim.x + block] = (mean, M2). */
__global__ void __launch_bounds__(LN_SPLIT_THREADS)
ln_split_stats_kernel(__half *x, const __half *y, const __half *bias, const __half *in, float2 *part, int64_t H)
{
    __shared__ float scratch[32];
    const int64_t r = blockIdx.y, nv = H / 8;
    const int64_t v = (int64_t)blockIdx.x * LN_SPLIT_THREADS + threadIdx.x;
    const bool ok = v < nv;
    pln_h8 bq;
    if (!in && bias && ok) bq = ((const pln_h8 *)bias)[v];   /* a parameter: before the wait */
    pln_pdl_wait();
    pln_pdl_trigger();
    float a[8], s = 0.0f;
    if (ok) {
        pln_h8_to_f(((const pln_h8 *)((in ? in : x) + r * H))[v], a);
        if (!in) {
            float b[8];
            if (y) { pln_h8_to_f(((const pln_h8 *)(y + r * H))[v], b); for (int j = 0; j < 8; j++) a[j] += b[j]; }
            if (bias) { pln_h8_to_f(bq, b); for (int j = 0; j < 8; j++) a[j] += b[j]; }
            pln_h8 h = pln_f_to_h8(a);
            ((pln_h8 *)(x + r * H))[v] = h;
            pln_h8_to_f(h, a);   /* the statistics of the fp16-rounded sum, as a fp16 model has it */
        }
#pragma unroll
        for (int j = 0; j < 8; j++) s += a[j];
    }
    const float mean = pln_block_sum(s, scratch) / (float)ln_split_count(nv, blockIdx.x);
    float m2 = 0.0f;
    if (ok)
#pragma unroll
        for (int j = 0; j < 8; j++) { float d = a[j] - mean; m2 += d * d; }
    m2 = pln_block_sum(m2, scratch);
    if (threadIdx.x == 0) part[r * gridDim.x + blockIdx.x] = make_float2(mean, m2);
}

/* grid (blocks per row, T): out = LayerNorm(src) on the slice, from the row's partials. */
__global__ void __launch_bounds__(LN_SPLIT_THREADS)
ln_split_apply_kernel(const __half *src, const __half *gamma, const __half *beta, __half *out, const float2 *part,
                      int64_t H, float eps)
{
    const int64_t r = blockIdx.y, nv = H / 8;
    const int64_t v = (int64_t)blockIdx.x * LN_SPLIT_THREADS + threadIdx.x;
    const bool ok = v < nv;
    pln_h8 gq, bq;
    if (ok) { gq = ((const pln_h8 *)gamma)[v]; bq = ((const pln_h8 *)beta)[v]; }   /* parameters: before the wait */
    pln_pdl_wait();
    pln_pdl_trigger();
    /* Chan's pairwise update, one 8-byte partial at a time, in block order */
    const float2 *p = part + r * gridDim.x;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int b = 0; b < (int)gridDim.x; b++) {
        const float2 q = p[b];
        const float nb = (float)ln_split_count(nv, b), nn = n + nb, d = q.x - mean;
        mean += d * (nb / nn);
        m2 += q.y + d * d * (n * nb / nn);
        n = nn;
    }
    const float rstd = rsqrtf(m2 / (float)H + eps);
    if (!ok) return;
    float a[8], gm[8], bt[8];
    pln_h8_to_f(((const pln_h8 *)(src + r * H))[v], a);
    pln_h8_to_f(gq, gm);
    pln_h8_to_f(bq, bt);
#pragma unroll
    for (int j = 0; j < 8; j++) a[j] = (a[j] - mean) * rstd * gm[j] + bt[j];
    ((pln_h8 *)(out + r * H))[v] = pln_f_to_h8(a);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int launch(pln_cuda_ctx *c, __half *x, const __half *y, const __half *bias, const __half *gamma,
                  const __half *beta, __half *out, const __half *in, int32_t T, int64_t H, float eps)
{
    if (T <= 0) return 0;
    bool vec = H % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(bias) && aligned16(gamma) &&
               aligned16(beta) && aligned16(out) && aligned16(in);
    const int64_t nv = H / 8;
    if (vec && c->ln_split) {
        const int nb = pln_cdiv(nv, LN_SPLIT_THREADS);
        float2 *part = (float2 *)pln_cuda_scratch(c, (size_t)T * nb * sizeof(float2));
        if (!part) return -1;
        dim3 grid((unsigned)nb, (unsigned)T);
        PLN_LAUNCH(grid, LN_SPLIT_THREADS, 0, c->stream, ln_split_stats_kernel)(x, y, bias, in, part, H);
        cudaCheckLaunch();
        PLN_LAUNCH(grid, LN_SPLIT_THREADS, 0, c->stream, ln_split_apply_kernel)(in ? in : x, gamma, beta, out, part, H, eps);
    } else if (vec && nv <= 4 * 1024) {
        int threads = (int)(nv < 1024 ? (nv + 31) / 32 * 32 : 1024);
        int V = (int)((nv + threads - 1) / threads);
        if (V == 1) PLN_LAUNCH(T, threads, 0, c->stream, residual_ln_reg_kernel<1>)(x, y, bias, gamma, beta, out, in, H, eps);
        else if (V == 2) PLN_LAUNCH(T, threads, 0, c->stream, residual_ln_reg_kernel<2>)(x, y, bias, gamma, beta, out, in, H, eps);
        else PLN_LAUNCH(T, threads, 0, c->stream, residual_ln_reg_kernel<4>)(x, y, bias, gamma, beta, out, in, H, eps);
    } else if (vec) PLN_LAUNCH(T, LN_THREADS, 0, c->stream, residual_ln_kernel<true>)(x, y, bias, gamma, beta, out, in, H, eps);
    else PLN_LAUNCH(T, LN_THREADS, 0, c->stream, residual_ln_kernel<false>)(x, y, bias, gamma, beta, out, in, H, eps);
    cudaCheckLaunch();
    return 0;
}

int pln_cuda_layernorm(pln_cuda_ctx *c, void *out, const void *in, const uint16_t *gamma,
                       const uint16_t *beta, int32_t T, int64_t H, float eps)
{
    return launch(c, nullptr, nullptr, nullptr, (const __half *)gamma, (const __half *)beta, (__half *)out,
                  (const __half *)in, T, H, eps);
}

int pln_cuda_residual_layernorm(pln_cuda_ctx *c, void *x, const void *y, const uint16_t *bias,
                                const uint16_t *gamma, const uint16_t *beta, void *ln_out,
                                int32_t T, int64_t H, float eps)
{
    return launch(c, (__half *)x, (const __half *)y, (const __half *)bias, (const __half *)gamma,
                  (const __half *)beta, (__half *)ln_out, nullptr, T, H, eps);
}
