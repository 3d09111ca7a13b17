/* embed.cu — row copies with 16-byte loads: one block per output row. */
#include "kernels/cuda/embed.cuh"

/* Copies src row (or zeros when src is NULL) into dst; 16 bytes at a time when both allow it. */
__device__ __forceinline__ void copy_row(__half *dst, const __half *src, int64_t H, bool vec)
{
    if (vec) {
        for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x)
            ((int4 *)dst)[i] = src ? __ldg((const int4 *)src + i) : make_int4(0, 0, 0, 0);
    } else {
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src ? src[i] : __float2half(0.0f);
    }
}

__global__ void embed_kernel(__half *out, const int32_t *ids, const __half *table, int64_t v0, int64_t vn,
                             int64_t H, bool vec)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    int64_t id = ids[blockIdx.x];
    const __half *src = (id >= v0 && id < v0 + vn) ? table + (id - v0) * H : nullptr;
    copy_row(out + (int64_t)blockIdx.x * H, src, H, vec);
}

__global__ void gather_kernel(__half *out, const __half *in, const int32_t *rows, int64_t H, bool vec)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    copy_row(out + (int64_t)blockIdx.x * H, in + (int64_t)rows[blockIdx.x] * H, H, vec);
}

static bool vec_ok(const void *a, const void *b, int64_t H)
{
    return H % 8 == 0 && ((uintptr_t)a & 15) == 0 && ((uintptr_t)b & 15) == 0;
}

int pln_cuda_embed(pln_cuda_ctx *c, void *out, const int32_t *ids, int32_t T, const uint16_t *table,
                   int64_t v0, int64_t vn, int64_t H)
{
    if (T <= 0) return 0;
    PLN_LAUNCH(T, 128, 0, c->stream, embed_kernel)((__half *)out, ids, (const __half *)table, v0, vn, H,
                                           vec_ok(out, table, H));
    cudaCheckLaunch();
    return 0;
}

int pln_cuda_gather_rows(pln_cuda_ctx *c, void *out, const void *in, const int32_t *rows, int32_t n, int64_t H)
{
    if (n <= 0) return 0;
    PLN_LAUNCH(n, 128, 0, c->stream, gather_kernel)((__half *)out, (const __half *)in, rows, H, vec_ok(out, in, H));
    cudaCheckLaunch();
    return 0;
}
