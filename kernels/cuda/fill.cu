/* fill.cu — counter-based random fill (splitmix64 of seed + index), one element per thread step. */
#include "kernels/cuda/fill.cuh"
#include "kernels/cuda/cuda_backend.h"

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_kernel(void *p, size_t n, int dt, float lo, float hi, uint64_t seed)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed * 0x2545f4914f6cdd1dull + i);
        float u = (float)(r >> 40) * (1.0f / 16777216.0f);
        switch (dt) {
        case PLN_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(lo + (hi - lo) * u); break;
        case PLN_DTYPE_F32: ((float *)p)[i] = lo + (hi - lo) * u; break;
        case PLN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)((int)(r % 255u) - 127); break;
        case PLN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(lo + (float)(r % (uint64_t)(hi - lo > 1 ? hi - lo : 1))); break;
        default: break;
        }
    }
}

int pln_cuda_fill(pln_cuda_ctx *c, void *p, size_t n, pln_dtype dt, float lo, float hi, uint64_t seed)
{
    if (dt != PLN_DTYPE_F16 && dt != PLN_DTYPE_F32 && dt != PLN_DTYPE_I8 && dt != PLN_DTYPE_I32)
        return pln_errorf("fill: dtype %s is not supported", pln_dtype_name(dt));
    if (n == 0) return 0;
    int blocks = c->sm_count * 8;
    PLN_LAUNCH(blocks, 256, 0, c->stream, fill_kernel)(p, n, (int)dt, lo, hi, seed);
    cudaCheckLaunch();
    return 0;
}

extern "C" int pln_cuda_fill_random(pln_backend *be, void *p, size_t n, pln_dtype dt, float lo, float hi, uint64_t seed)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    cudaCheck(cudaSetDevice(c->device));
    return pln_cuda_fill(c, p, n, dt, lo, hi, seed);
}
