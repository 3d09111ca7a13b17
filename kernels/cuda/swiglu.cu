/* swiglu.cu — a memory-bound elementwise pass: grid (blocks along the row, T), 8 elements per
 * thread with 16-byte loads and stores where I % 8 == 0 and the buffers are 16-byte aligned,
 * element by element otherwise. SiLU is pln_math.h's pln_silu, the CPU backend's. */
#include "kernels/cuda/swiglu.cuh"
#include "kernels/pln_math.h"

#define SWIGLU_THREADS 256

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_kernel(__half *out, const __half *in, int64_t I, bool vec)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int64_t t = blockIdx.y;
    const __half *g = in + t * 2 * I, *u = g + I;
    __half *o = out + t * I;
    if (vec) {
        const int64_t v = (int64_t)blockIdx.x * SWIGLU_THREADS + threadIdx.x;
        if (v >= I / 8) return;
        float gf[8], uf[8];
        pln_h8_to_f(((const pln_h8 *)g)[v], gf);
        pln_h8_to_f(((const pln_h8 *)u)[v], uf);
#pragma unroll
        for (int j = 0; j < 8; j++) gf[j] = pln_swiglu_h(gf[j], uf[j]);
        ((pln_h8 *)o)[v] = pln_f_to_h8(gf);
    } else {
        for (int64_t i = (int64_t)blockIdx.x * SWIGLU_THREADS + threadIdx.x; i < I; i += (int64_t)gridDim.x * SWIGLU_THREADS)
            o[i] = __float2half_rn(pln_swiglu_h(__half2float(g[i]), __half2float(u[i])));
    }
}

int pln_cuda_swiglu(pln_cuda_ctx *c, void *out, const void *in, int32_t T, int64_t I)
{
    if (T <= 0) return 0;
    if (I <= 0) return pln_errorf("swiglu: bad width %lld", (long long)I);
    if (T > 65535) return pln_errorf("swiglu: %d tokens is over the 65535 of one launch", T);
    const bool vec = I % 8 == 0 && (((uintptr_t)out | (uintptr_t)in) & 15) == 0;
    const int64_t items = vec ? I / 8 : I;
    const unsigned nb = (unsigned)(vec ? pln_cdiv(items, SWIGLU_THREADS) : (items > 8 * SWIGLU_THREADS ? 8 : pln_cdiv(items, SWIGLU_THREADS)));
    PLN_LAUNCH(dim3(nb, (unsigned)T), SWIGLU_THREADS, 0, c->stream, swiglu_kernel)((__half *)out, (const __half *)in, I, vec);
    cudaCheckLaunch();
    return 0;
}
