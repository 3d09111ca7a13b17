/* rmsnorm.cu — one block per token row, the mean of squares in fp32. Rows of up to 32768 halves
 * (H % 8 == 0, 16-byte aligned) are held in registers and read once, gamma issued before the PDL
 * wait (it is a parameter, never a previous kernel's output); other rows take the element kernel
 * (two passes, the second L1-resident). The residual variant writes the fp16-rounded sum back to x
 * and normalizes that rounded value, as a fp16 model does. Per element, as LlamaRMSNorm in fp16:
 * n = fp16(x * rstd), out = fp16(n * gamma). */
#include "kernels/cuda/rmsnorm.cuh"

#define RMS_THREADS 256

/* The row in registers: V 16-byte vectors per thread (blockDim.x * V * 8 >= H). in == NULL: the
 * residual form on x. */
template <int V>
__global__ void __launch_bounds__(1024)
rmsnorm_reg_kernel(__half *x, const __half *y, const __half *bias, const __half *gamma, __half *out,
                   const __half *in, int64_t H, float eps)
{
    __shared__ float scratch[32];
    const int64_t r = blockIdx.x, nv = H / 8;
    /* gamma first (V <= 2; V = 4 has no registers to spare under the 1024-thread budget of 64) */
    constexpr bool PF = V <= 2;
    pln_h8 gq[PF ? V : 1];
    if (PF) {
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int64_t v = threadIdx.x + (int64_t)u * blockDim.x;
            if (v < nv) gq[PF ? u : 0] = ((const pln_h8 *)gamma)[v];
        }
    }
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
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
                pln_h8_to_f(h, a[u]);   /* normalize the fp16-rounded sum */
            }
#pragma unroll
            for (int j = 0; j < 8; j++) s += a[u][j] * a[u][j];
        }
    }
    const float rstd = rsqrtf(pln_block_sum(s, scratch) / (float)H + eps);
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int64_t v = threadIdx.x + (int64_t)u * blockDim.x;
        if (v < nv) {
            float gm[8];
            pln_h8_to_f(PF ? gq[PF ? u : 0] : ((const pln_h8 *)gamma)[v], gm);
#pragma unroll
            for (int j = 0; j < 8; j++) a[u][j] = __half2float(__float2half_rn(a[u][j] * rstd)) * gm[j];
            ((pln_h8 *)(out + r * H))[v] = pln_f_to_h8(a[u]);
        }
    }
}

/* Any row: element by element. Every thread rewrites only the elements it read itself, after the
 * reduction, so out == in is safe. */
__global__ void __launch_bounds__(RMS_THREADS)
rmsnorm_kernel(__half *x, const __half *y, const __half *bias, const __half *gamma, __half *out, const __half *in,
               int64_t H, float eps)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ float scratch[32];
    const int64_t r = blockIdx.x;
    const __half *src = in ? in + r * H : x + r * H;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += RMS_THREADS) {
        float v;
        if (!in) {
            v = __half2float(x[r * H + i]);
            if (y) v += __half2float(y[r * H + i]);
            if (bias) v += __half2float(bias[i]);
            const __half h = __float2half_rn(v);
            x[r * H + i] = h;
            v = __half2float(h);
        } else {
            v = __half2float(src[i]);
        }
        s += v * v;
    }
    const float rstd = rsqrtf(pln_block_sum(s, scratch) / (float)H + eps);
    for (int64_t i = threadIdx.x; i < H; i += RMS_THREADS) {
        const float n = __half2float(__float2half_rn(__half2float(src[i]) * rstd));
        out[r * H + i] = __float2half_rn(n * __half2float(gamma[i]));
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int launch(pln_cuda_ctx *c, __half *x, const __half *y, const __half *bias, const __half *gamma, __half *out,
                  const __half *in, int32_t T, int64_t H, float eps)
{
    if (T <= 0) return 0;
    if (H <= 0) return pln_errorf("rmsnorm: bad row length %lld", (long long)H);
    const bool vec = H % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(bias) && aligned16(gamma) &&
                     aligned16(out) && aligned16(in);
    const int64_t nv = H / 8;
    if (vec && nv <= 4 * 1024) {
        const int threads = (int)(nv < 1024 ? (nv + 31) / 32 * 32 : 1024);
        const int V = (int)((nv + threads - 1) / threads);
        if (V == 1) PLN_LAUNCH(T, threads, 0, c->stream, rmsnorm_reg_kernel<1>)(x, y, bias, gamma, out, in, H, eps);
        else if (V == 2) PLN_LAUNCH(T, threads, 0, c->stream, rmsnorm_reg_kernel<2>)(x, y, bias, gamma, out, in, H, eps);
        else PLN_LAUNCH(T, threads, 0, c->stream, rmsnorm_reg_kernel<4>)(x, y, bias, gamma, out, in, H, eps);
    } else {
        PLN_LAUNCH(T, RMS_THREADS, 0, c->stream, rmsnorm_kernel)(x, y, bias, gamma, out, in, H, eps);
    }
    cudaCheckLaunch();
    return 0;
}

int pln_cuda_rmsnorm(pln_cuda_ctx *c, void *out, const void *in, const uint16_t *gamma, int32_t T, int64_t H,
                     float eps)
{
    return launch(c, nullptr, nullptr, nullptr, (const __half *)gamma, (__half *)out, (const __half *)in, T, H, eps);
}

int pln_cuda_residual_rmsnorm(pln_cuda_ctx *c, void *x, const void *y, const uint16_t *bias, const uint16_t *gamma,
                              void *ln_out, int32_t T, int64_t H, float eps)
{
    return launch(c, (__half *)x, (const __half *)y, (const __half *)bias, (const __half *)gamma, (__half *)ln_out,
                  nullptr, T, H, eps);
}
