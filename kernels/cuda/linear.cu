/* linear.cu — the linear layers: tensor-core GEMV for decode, cuBLASLt and an int8 GEMM for
 * prefill and large batches, int4 GEMV and GEMM, a plain fallback for odd shapes. See linear.cuh. */
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/swiglu.cuh"

#include <pthread.h>
#include <stdlib.h>

/* ---- shared epilogue ----------------------------------------------------------------------- */
template <typename OT> __device__ __forceinline__ void store_out(OT *p, float v);
template <> __device__ __forceinline__ void store_out<__half>(__half *p, float v) { *p = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_out<float>(float *p, float v) { *p = v; }

template <typename OT>
__device__ __forceinline__ void epilogue(OT *out, int64_t N, int t, int64_t row, float v, float sc,
                                         const __half *bias, int epi, int64_t n_valid)
{
    v *= sc;
    if (bias) v += __half2float(bias[row]);
    if (epi == PLN_EPI_GELU) v = pln_gelu(v);
    if (row >= n_valid) v = -INFINITY;
    store_out(out + (int64_t)t * N + row, v);
}

/* The SwiGLU epilogue (PLN_EPI_SWIGLU): pair i < I = N / 2 of token t from gate row i (value g,
 * scale sg) and up row I + i (u, su) of the [gate ; up] weight; out is [T, I]. g and u are rounded
 * to the output dtype first, as linear would store them, so the result is bit for bit linear then
 * swiglu_kernel's. */
template <typename OT>
__device__ __forceinline__ void epilogue_swiglu(OT *out, int64_t I, int t, int64_t i, float g, float u, float sg,
                                                float su, const __half *bias)
{
    g *= sg;
    u *= su;
    if (bias) { g += __half2float(bias[i]); u += __half2float(bias[I + i]); }
    float v;
    if constexpr (sizeof(OT) == 2) v = pln_swiglu_h(__half2float(__float2half_rn(g)), __half2float(__float2half_rn(u)));
    else v = pln_silu(g) * u;
    store_out(out + (int64_t)t * I + i, v);
}

/* ---- GEMV: T <= NT tokens, 16 weight rows per block, 4 warps splitting k --------------------
 * A k-step is 32 columns (fp16: 16 bytes per lane per row) or 64 (int8: 16 int8 per lane). A
 * batch is GEMV_U steps of rows g and g+8 (8 16-byte loads per lane). Software-pipelined: two
 * register buffers alternate, the next batch's weight (and group-scale) loads are issued before
 * this batch's math, so 8 loads stay in flight through the math; each buffer feeds its own set of
 * accumulators (two independent mma chains), summed at the end. Steps past the end are
 * predicated off (no load, no mma), never a break, so the activation loads can be scheduled early. */
#define GEMV_WARPS 4
#define GEMV_U 4
/* The GEMV's largest token tile: it serves T <= GEMV_MAX_T (tiles of 8, 16 and GEMV_MAX_T);
 * AUTO sends fp16 above 16 tokens to cuBLASLt and int8/int4 above GEMV_MAX_T_Q to the GEMM. */
#define GEMV_MAX_T 32
#define GEMV_MAX_T_F16 16
#define GEMV_MAX_T_Q 32

template <bool I8, bool GROUPED>
__device__ __forceinline__ void gemv_load(int4 (&wa)[GEMV_U], int4 (&wb)[GEMV_U], __half2 (&sa)[GEMV_U],
                                          __half2 (&sb)[GEMV_U], int64_t s0, int64_t nsteps, const int4 *pa,
                                          const int4 *pb, bool va, bool vb, const __half *scale, int64_t ra,
                                          int64_t rb, int64_t sgroups, int64_t G, int q)
{
    constexpr int KS = I8 ? 64 : 32;
#pragma unroll
    for (int u = 0; u < GEMV_U; u++) {
        const int64_t s = s0 + (int64_t)u * GEMV_WARPS;
        const int4 z = make_int4(0, 0, 0, 0);
        wa[u] = (s < nsteps && va) ? pln_ld_stream(pa + s * 4) : z;
        wb[u] = (s < nsteps && vb) ? pln_ld_stream(pb + s * 4) : z;
        if (GROUPED) {
            const int64_t gi = (s * KS + 16 * q) / G;
            sa[u] = __half2half2(s < nsteps && va ? scale[ra * sgroups + gi] : __float2half(0.0f));
            sb[u] = __half2half2(s < nsteps && vb ? scale[rb * sgroups + gi] : __float2half(0.0f));
        }
    }
}

template <bool I8, bool GROUPED, int NT>
__device__ __forceinline__ void gemv_math(float (&acc)[NT / 8][4], const int4 (&wa)[GEMV_U],
                                          const int4 (&wb)[GEMV_U], const __half2 (&sa)[GEMV_U],
                                          const __half2 (&sb)[GEMV_U], int64_t s0, int64_t nsteps,
                                          const __half *x, int T, int64_t K, int g, int q)
{
    constexpr int KS = I8 ? 64 : 32;
    constexpr int NTILES = NT / 8;
#pragma unroll
    for (int u = 0; u < GEMV_U; u++) {
        const int64_t s = s0 + (int64_t)u * GEMV_WARPS;
        if (s < nsteps) {   /* warp-uniform */
            const int64_t k = s * KS + (I8 ? 16 : 8) * q;   /* this lane's first column */
            const uint32_t *A = (const uint32_t *)&wa[u];
            const uint32_t *B = (const uint32_t *)&wb[u];
            if (!I8) {
                uint32_t xv[NTILES][4];
#pragma unroll
                for (int n = 0; n < NTILES; n++) {
                    int t = n * 8 + g;
                    int4 v = t < T ? __ldg((const int4 *)(x + (int64_t)t * K + k)) : make_int4(0, 0, 0, 0);
                    xv[n][0] = v.x; xv[n][1] = v.y; xv[n][2] = v.z; xv[n][3] = v.w;
                }
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int n = 0; n < NTILES; n++)
                        pln_mma16816(acc[n], A[2 * j], B[2 * j], A[2 * j + 1], B[2 * j + 1],
                                     xv[n][2 * j], xv[n][2 * j + 1]);
            } else {
                uint32_t xv[NTILES][8];
#pragma unroll
                for (int n = 0; n < NTILES; n++) {
                    int t = n * 8 + g;
                    const int4 *xp = (const int4 *)(x + (int64_t)t * K + k);
                    int4 v0 = t < T ? __ldg(xp) : make_int4(0, 0, 0, 0);
                    int4 v1 = t < T ? __ldg(xp + 1) : make_int4(0, 0, 0, 0);
                    xv[n][0] = v0.x; xv[n][1] = v0.y; xv[n][2] = v0.z; xv[n][3] = v0.w;
                    xv[n][4] = v1.x; xv[n][5] = v1.y; xv[n][6] = v1.z; xv[n][7] = v1.w;
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    __half2 alo, ahi, blo, bhi;
                    pln_i8x4_to_h2x2(A[j], alo, ahi);
                    pln_i8x4_to_h2x2(B[j], blo, bhi);
                    if (GROUPED) {
                        alo = __hmul2(alo, sa[u]); ahi = __hmul2(ahi, sa[u]);
                        blo = __hmul2(blo, sb[u]); bhi = __hmul2(bhi, sb[u]);
                    }
#pragma unroll
                    for (int n = 0; n < NTILES; n++)
                        pln_mma16816(acc[n], pln_h2_bits(alo), pln_h2_bits(blo), pln_h2_bits(ahi),
                                     pln_h2_bits(bhi), xv[n][2 * j], xv[n][2 * j + 1]);
                }
            }
        }
    }
}

template <bool I8, bool GROUPED, int NT, typename OT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(OT *__restrict__ out, const __half *__restrict__ x, const void *__restrict__ Wv,
            const __half *__restrict__ scale, int64_t G, const __half *__restrict__ bias, int T,
            int64_t N, int64_t K, int epi, int64_t n_valid, float *part, unsigned *cnt, int64_t per)
{
    constexpr int KS = I8 ? 64 : 32;            /* columns per warp step */
    constexpr int NTILES = NT / 8;
    constexpr int STRIDE = GEMV_WARPS * GEMV_U;  /* steps from one batch of a warp to its next */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    /* SwiGLU: the block's rows g are gate rows p0 + g, its rows g + 8 the matching up rows
     * I + p0 + g (8 pairs per block). After the loop I is rb - ra: no register holds it through
     * the loop (at NT 8, grouped int8, one more live value made ptxas spill). */
    const bool sw = epi == PLN_EPI_SWIGLU;
    const int64_t row0 = (int64_t)blockIdx.x * (sw ? 8 : 16);
    const int64_t ra = row0 + g, rb = sw ? (N >> 1) + row0 + g : row0 + g + 8;
    const bool va = ra < (sw ? (N >> 1) : N), vb = sw ? va : rb < N;
    const char *W = (const char *)Wv;
    const int64_t rowbytes = I8 ? K : K * 2;
    const int4 *pa = (const int4 *)(W + (va ? ra : 0) * rowbytes) + q;
    const int4 *pb = (const int4 *)(W + (vb ? rb : 0) * rowbytes) + q;
    /* split-k (gridDim.y > 1): this block's steps [sb, nsteps) of per each */
    const int64_t sb = (int64_t)blockIdx.y * per;
    const int64_t nsteps = K / KS < sb + per ? K / KS : sb + per;
    const int64_t sgroups = GROUPED ? K / G : 1;

    float acc[NTILES][4], acc2[NTILES][4];
#pragma unroll
    for (int n = 0; n < NTILES; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = acc2[n][i] = 0.0f;

    int4 wa0[GEMV_U], wb0[GEMV_U], wa1[GEMV_U], wb1[GEMV_U];
    __half2 sa0[GEMV_U], sb0[GEMV_U], sa1[GEMV_U], sb1[GEMV_U];
    /* Above 16 tokens one accumulator set serves both buffers: NT / 2 more fp32 registers per
     * chain would not fit beside the 8 weight loads in flight. */
    float (&accb)[NTILES][4] = NT <= 16 ? acc2 : acc;
    gemv_load<I8, GROUPED>(wa0, wb0, sa0, sb0, sb + warp, nsteps, pa, pb, va, vb, scale, ra, rb, sgroups, G, q);
    /* the weights never depend on the previous kernel: their first batch is in flight while it
     * finishes (programmatic dependent launch); the activations are read after the wait */
    pln_pdl_wait();
    for (int64_t s0 = sb + warp; s0 < nsteps; s0 += 2 * STRIDE) {
        gemv_load<I8, GROUPED>(wa1, wb1, sa1, sb1, s0 + STRIDE, nsteps, pa, pb, va, vb, scale, ra, rb, sgroups, G, q);
        gemv_math<I8, GROUPED, NT>(acc, wa0, wb0, sa0, sb0, s0, nsteps, x, T, K, g, q);
        gemv_load<I8, GROUPED>(wa0, wb0, sa0, sb0, s0 + 2 * STRIDE, nsteps, pa, pb, va, vb, scale, ra, rb, sgroups, G, q);
        gemv_math<I8, GROUPED, NT>(accb, wa1, wb1, sa1, sb1, s0 + STRIDE, nsteps, x, T, K, g, q);
    }
    if (NT <= 16) {
#pragma unroll
        for (int n = 0; n < NTILES; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[n][i] += acc2[n][i];
    }
    pln_pdl_trigger();   /* only the reduction is left: the next kernel may start its weight loads */

    /* Sum the four warps' k-slices. */
    __shared__ float red[GEMV_WARPS][16][NT + 1];
#pragma unroll
    for (int n = 0; n < NTILES; n++) {
        red[warp][g][n * 8 + 2 * q] = acc[n][0];
        red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
        red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
        red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
    }
    __syncthreads();
    const int kspl = gridDim.y;
    float *mine = kspl > 1 ? part + ((int64_t)blockIdx.x * kspl + blockIdx.y) * 16 * NT : nullptr;
    const int64_t I = rb - ra;   /* SwiGLU only */
    if (sw && kspl == 1) {
        for (int i = threadIdx.x; i < 8 * NT; i += blockDim.x) {
            const int t = i / 8, r = i % 8;
            const int64_t p = row0 + r;
            if (t >= T || p >= I) continue;
            float vg = 0.0f, vu = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) { vg += red[w][r][t]; vu += red[w][r + 8][t]; }
            const bool s1 = I8 && !GROUPED;
            epilogue_swiglu(out, I, t, p, vg, vu, s1 ? __half2float(scale[p]) : 1.0f,
                            s1 ? __half2float(scale[I + p]) : 1.0f, bias);
        }
        return;
    }
    for (int i = threadIdx.x; i < 16 * NT; i += blockDim.x) {
        int t = i / 16, r = i % 16;           /* consecutive threads: consecutive rows */
        int64_t row = row0 + r;
        if (t >= T || (sw ? r % 8 + row0 >= I : row >= N)) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < GEMV_WARPS; w++) v += red[w][r][t];
        if (kspl > 1) { mine[i] = v; continue; }
        float sc = (I8 && !GROUPED) ? __half2float(scale[row]) : 1.0f;
        epilogue(out, N, t, row, v, sc, bias, epi, n_valid);
    }
    if (kspl == 1) return;
    /* split-k: the last block of this row tile to arrive sums the splits' partials (fp32, in
     * split order) and runs the epilogue; it leaves the tile's counter zero again */
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = cnt + blockIdx.x;
        last = atomicAdd(c, 1u) == (unsigned)kspl - 1;
        if (last) atomicExch(c, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* 16-byte reads (4 rows of one token) through L2; elements no block wrote are never used */
    const float4 *tile = (const float4 *)(part + (int64_t)blockIdx.x * kspl * 16 * NT);
    if (sw) {
        /* a token's gate rows 0-7 are its float4s 0 and 1, the up rows 8-15 its float4s 2 and 3 */
        for (int i2 = threadIdx.x; i2 < 2 * NT; i2 += blockDim.x) {
            const int t = i2 / 2, j = i2 % 2;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
            for (int y = 0; y < kspl; y++) {
                const float4 pa = __ldcg(tile + (int64_t)y * 4 * NT + 4 * t + j);
                const float4 pb = __ldcg(tile + (int64_t)y * 4 * NT + 4 * t + j + 2);
                a.x += pa.x; a.y += pa.y; a.z += pa.z; a.w += pa.w;
                b.x += pb.x; b.y += pb.y; b.z += pb.z; b.w += pb.w;
            }
            const float va4[4] = {a.x, a.y, a.z, a.w}, vb4[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t p = row0 + 4 * j + e;
                if (t >= T || p >= I) continue;
                const bool s1 = I8 && !GROUPED;
                epilogue_swiglu(out, I, t, p, va4[e], vb4[e], s1 ? __half2float(scale[p]) : 1.0f,
                                s1 ? __half2float(scale[I + p]) : 1.0f, bias);
            }
        }
        return;
    }
    for (int i4 = threadIdx.x; i4 < 4 * NT; i4 += blockDim.x) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int y = 0; y < kspl; y++) {
            const float4 p = __ldcg(tile + (int64_t)y * 4 * NT + i4);
            v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
        }
        const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = 4 * i4 + j, t = i / 16, r = i % 16;
            const int64_t row = row0 + r;
            if (t >= T || row >= N) continue;
            float sc = (I8 && !GROUPED) ? __half2float(scale[row]) : 1.0f;
            epilogue(out, N, t, row, vv[j], sc, bias, epi, n_valid);
        }
    }
}

/* ---- plain fallback: one warp per (row, token), any shape -------------------------------- */
enum { NAIVE_F16 = 0, NAIVE_I8 = 1, NAIVE_I4 = 2 };

/* Weight (row rr, column k) of a [N, K] matrix as the CPU reference reads it: fp16, int8 times
 * its group's scale, or packed int4 (pln_i4_get) times its group's scale. */
template <int WT>
__device__ __forceinline__ float naive_weight(const void *Wv, const __half *scale, int64_t G, int64_t K, int64_t rr,
                                              int64_t k)
{
    if constexpr (WT == NAIVE_F16) return __half2float(((const __half *)Wv)[rr * K + k]);
    else if constexpr (WT == NAIVE_I8)
        return pln_dequant_i8(((const int8_t *)Wv)[rr * K + k], __half2float(scale[rr * (K / G) + k / G]));
    else
        return pln_dequant_i4(pln_i4_get((const uint8_t *)Wv + rr * (K / 2), k), __half2float(scale[rr * (K / G) + k / G]));
}

/* Every dtype's fallback (int4: any column count that is a multiple of 32, unaligned pointers):
 * one warp per (output, token); with the SwiGLU epilogue the warp sums gate row i and up row
 * N / 2 + i in turn. */
template <typename OT, int WT>
__global__ void linear_naive_kernel(OT *out, const __half *x, const void *Wv, const __half *scale, int64_t G,
                                    const __half *bias, int T, int64_t N, int64_t K, int epi, int64_t n_valid)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    const bool sw = epi == PLN_EPI_SWIGLU;
    const int64_t NO = sw ? N / 2 : N;   /* outputs per token: SwiGLU pairs gate row i with up row N / 2 + i */
    if (wid >= (int64_t)T * NO) return;
    int t = (int)(wid / NO);
    int64_t row = wid % NO;
    float s = 0.0f, su = 0.0f;
    for (int h = 0; h < (sw ? 2 : 1); h++) {
        const int64_t rr = row + h * NO;
        float a = 0.0f;
        for (int64_t k = lane; k < K; k += 32) a += naive_weight<WT>(Wv, scale, G, K, rr, k) * __half2float(x[(int64_t)t * K + k]);
        a = pln_warp_sum(a);
        if (h == 0) s = a; else su = a;
    }
    if (lane != 0) return;
    if (sw) epilogue_swiglu(out, NO, t, row, s, su, 1.0f, 1.0f, bias);
    else epilogue(out, N, t, row, s, 1.0f, bias, epi, n_valid);
}

/* ---- int4 (packed, docs/FORMAT.md "int4 weight-only") ------------------------------------------
 * A lane's 16-byte load is one 32-column block of a row, inside one scale group (G is a multiple
 * of 32). Word i of the block holds columns 4i..4i+3 in its low nibbles and 16+4i..16+4i+3 in its
 * high ones, each as q + 8. Masking two nibbles (bytes 0 and 2, or 1 and 3, of the word, after a
 * shift of 0/4/8/12) under the exponent of 1024.0 (0x6400 | n is the fp16 value 1024 + n) gives
 * two fp16 weights at once, and one subtraction of 1032 makes them q exactly; the pairs come out
 * as columns (4i, 4i+2), (4i+1, 4i+3), (16+4i, 16+4i+2), (16+4i+1, 16+4i+3). The activations
 * are paired the same way with byte permutes, so the mma (which sums over whatever k order A and
 * B agree on) needs no reordering of the weights. The scale multiplies the fp16 weights before
 * the mma (the lanes of one mma hold different groups), as the grouped int8 kernels do. */
__device__ __forceinline__ void i4x8_to_h2x4(uint32_t w, __half2 s, __half2 h[4])
{
    const uint32_t m = 0x000f000fu, e = 0x64006400u;
    const __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6408));   /* 1032 */
    h[0] = __hmul2(__hsub2(pln_bits_h2((w & m) | e), bias), s);
    h[1] = __hmul2(__hsub2(pln_bits_h2(((w >> 8) & m) | e), bias), s);
    h[2] = __hmul2(__hsub2(pln_bits_h2(((w >> 4) & m) | e), bias), s);
    h[3] = __hmul2(__hsub2(pln_bits_h2(((w >> 12) & m) | e), bias), s);
}

/* Four consecutive fp16 activations (two words) -> the pairs (0, 2) and (1, 3). */
__device__ __forceinline__ void x_pairs(uint2 v, uint32_t &p02, uint32_t &p13)
{
    p02 = __byte_perm(v.x, v.y, 0x5410);
    p13 = __byte_perm(v.x, v.y, 0x7632);
}

/* GEMV for T <= NT: as gemv_kernel, 16 rows per block, 4 warps splitting k, GEMV_U 16-byte
 * loads of rows g and g+8 in flight per lane; a warp step is 128 columns (a block per lane). */
template <int NT, typename OT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_i4_kernel(OT *__restrict__ out, const __half *__restrict__ x, const uint8_t *__restrict__ W,
               const __half *__restrict__ scale, int64_t G, const __half *__restrict__ bias, int T,
               int64_t N, int64_t K, int epi, int64_t n_valid)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    constexpr int NTILES = NT / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    /* SwiGLU: rows g gate p0 + g, rows g + 8 up I + p0 + g, as in gemv_kernel */
    const bool sw = epi == PLN_EPI_SWIGLU;
    const int64_t I = N / 2;
    const int64_t row0 = (int64_t)blockIdx.x * (sw ? 8 : 16);
    const int64_t ra = row0 + g, rb = sw ? I + row0 + g : row0 + g + 8;
    const bool va = ra < (sw ? I : N), vb = sw ? va : rb < N;
    const int64_t rowbytes = K / 2;
    const int4 *pa = (const int4 *)(W + (va ? ra : 0) * rowbytes) + q;
    const int4 *pb = (const int4 *)(W + (vb ? rb : 0) * rowbytes) + q;
    const int64_t nsteps = K / 128, sgroups = K / G;

    float acc[NTILES][4];
#pragma unroll
    for (int n = 0; n < NTILES; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int64_t s0 = warp; s0 < nsteps; s0 += GEMV_WARPS * GEMV_U) {
        int4 wa[GEMV_U], wb[GEMV_U];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            int64_t s = s0 + (int64_t)u * GEMV_WARPS;
            int4 z = make_int4(0, 0, 0, 0);
            wa[u] = (s < nsteps && va) ? pln_ld_stream(pa + s * 4) : z;
            wb[u] = (s < nsteps && vb) ? pln_ld_stream(pb + s * 4) : z;
        }
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            int64_t s = s0 + (int64_t)u * GEMV_WARPS;
            if (s >= nsteps) break;
            const int64_t k = s * 128 + 32 * q;   /* this lane's block */
            const int64_t gi = k / G;
            const __half2 sa = __half2half2(va ? scale[ra * sgroups + gi] : __float2half(0.0f));
            const __half2 sb = __half2half2(vb ? scale[rb * sgroups + gi] : __float2half(0.0f));
            const uint32_t *A = (const uint32_t *)&wa[u];
            const uint32_t *B = (const uint32_t *)&wb[u];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                __half2 ha[4], hb[4];
                i4x8_to_h2x4(A[i], sa, ha);
                i4x8_to_h2x4(B[i], sb, hb);
#pragma unroll
                for (int n = 0; n < NTILES; n++) {
                    const int t = n * 8 + g;
                    const __half *xp = x + (int64_t)t * K + k + 4 * i;
                    uint2 lo = t < T ? __ldg((const uint2 *)xp) : make_uint2(0, 0);
                    uint2 hi = t < T ? __ldg((const uint2 *)(xp + 16)) : make_uint2(0, 0);
                    uint32_t l02, l13, h02, h13;
                    x_pairs(lo, l02, l13);
                    x_pairs(hi, h02, h13);
                    pln_mma16816(acc[n], pln_h2_bits(ha[0]), pln_h2_bits(hb[0]), pln_h2_bits(ha[1]),
                                 pln_h2_bits(hb[1]), l02, l13);
                    pln_mma16816(acc[n], pln_h2_bits(ha[2]), pln_h2_bits(hb[2]), pln_h2_bits(ha[3]),
                                 pln_h2_bits(hb[3]), h02, h13);
                }
            }
        }
    }

    /* Sum the four warps' k-slices. */
    __shared__ float red[GEMV_WARPS][16][NT + 1];
#pragma unroll
    for (int n = 0; n < NTILES; n++) {
        red[warp][g][n * 8 + 2 * q] = acc[n][0];
        red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
        red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
        red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
    }
    __syncthreads();
    if (sw) {
        for (int i = threadIdx.x; i < 8 * NT; i += blockDim.x) {
            const int t = i / 8, r = i % 8;
            const int64_t p = row0 + r;
            if (t >= T || p >= I) continue;
            float vg = 0.0f, vu = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) { vg += red[w][r][t]; vu += red[w][r + 8][t]; }
            epilogue_swiglu(out, I, t, p, vg, vu, 1.0f, 1.0f, bias);
        }
        return;
    }
    for (int i = threadIdx.x; i < 16 * NT; i += blockDim.x) {
        int t = i / 16, r = i % 16;
        int64_t row = row0 + r;
        if (t >= T || row >= N) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < GEMV_WARPS; w++) v += red[w][r][t];
        epilogue(out, N, t, row, v, 1.0f, bias, epi, n_valid);
    }
}

/* ---- GEMM for the quantized weights above the GEMV: int8 (per channel or grouped) and int4 --------
 * One template for the three: a block is 64 weight rows (4 warps of 16) x BT tokens; a k-step is
 * KS columns, one 16-byte chunk per lane and weight row (int8: 64 columns, int4: 128, i.e. one
 * 32-column block per lane); they differ only in that width and in the dequantization.
 * GEMM_STAGES-deep cp.async pipeline: step kk's weights (each lane copies the two 16-byte chunks
 * it alone reads back, rows g and g+8) and its BT x KS activation tile (shared by the 4 warps)
 * go global -> shared with cp.async.cg, GEMM_STAGES - 1 steps ahead of the math, one commit group
 * per step. Per step: wait until step kk's group has landed (wait_group<STAGES-2>), one
 * __syncthreads (everyone's copies of step kk are visible, and everyone is done with the buffer of
 * step kk-1, which the next issue overwrites), issue step kk+STAGES-1, then the mma's on step kk.
 * Tokens past T and rows past N are zero-filled by the copy (src-size 0), so the math has no
 * predicates. Scales: per-channel int8 once in the epilogue, grouped int8 and int4 multiply the
 * fp16 weights in registers (a lane's chunk never straddles a group). Static shared memory
 * (< 48 KB): int8 BT 64: 3 x (9216 + 4096) = 39936 bytes; int4 BT 32: 3 x (8704 + 4096) = 38400. */
#define GEMM_STAGES 3
enum { WQ_I8 = 0, WQ_I8G = 1, WQ_I4 = 2 };

/* One pipeline stage's copies (k-step kk), in two halves: this thread's two weight chunks
 * (gemm_issue_w; the weights never depend on the previous kernel, so the prologue issues them
 * before pln_pdl_wait) and its share of the BT x KS activation tile (gemm_issue_x, after the
 * wait; tokens past T zero-filled). */
__device__ __forceinline__ void gemm_issue_w(int4 (*ws)[128], const uint8_t *pa, const uint8_t *pb, bool va, bool vb,
                                             int kk)
{
    const int tid = threadIdx.x;
    pln_cp_async16(&ws[0][tid], pa + (int64_t)kk * 64, va);
    pln_cp_async16(&ws[1][tid], pb + (int64_t)kk * 64, vb);
}
template <int KS, int BT>
__device__ __forceinline__ void gemm_issue_x(__half *xs, const __half *x, int T, int t0, int64_t K, int kk)
{
    constexpr int XS = KS + 8, CH = KS / 8;
    const int tid = threadIdx.x;
#pragma unroll
    for (int r = 0; r < BT * CH / 128; r++) {
        const int i = tid + 128 * r, t = i / CH, c = i % CH;
        const bool ok = t0 + t < T;
        pln_cp_async16(&xs[t * XS + c * 8], x + (int64_t)(ok ? t0 + t : 0) * K + (int64_t)kk * KS + c * 8, ok);
    }
}

template <int WQ, int BT, typename OT>
__global__ void __launch_bounds__(128)
gemm_wq_kernel(OT *__restrict__ out, const __half *__restrict__ x, const uint8_t *__restrict__ W,
               const __half *__restrict__ scale, int64_t G, const __half *__restrict__ bias, int T,
               int64_t N, int64_t K, int epi, int64_t n_valid, float *part, unsigned *cnt, int per)
{
    constexpr bool I4 = WQ == WQ_I4;
    constexpr int KS = I4 ? 128 : 64;   /* columns per k-step */
    constexpr int XS = KS + 8;          /* halves per staged token row: 16-byte reads conflict-free */
    constexpr int CH = KS / 8;          /* 16-byte chunks per token row and step */
    constexpr int NTILES = BT / 8;
    static_assert(BT % 8 == 0 && BT * CH % 128 == 0, "whole tile copies per thread");
    __shared__ __align__(16) __half xs[GEMM_STAGES][BT * XS];
    __shared__ __align__(16) int4 ws[GEMM_STAGES][2][128];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    /* SwiGLU: a warp's rows g are gate rows p0 + g, its rows g + 8 the up rows I + p0 + g (32
     * pairs per block): each lane holds a pair's gate and up sums for the same tokens */
    const bool sw = epi == PLN_EPI_SWIGLU;
    const int64_t I = N / 2;
    const int64_t row0 = (int64_t)blockIdx.x * (sw ? 32 : 64) + warp * (sw ? 8 : 16);
    const int t0 = blockIdx.y * BT;
    const int64_t ra = row0 + g, rb = sw ? I + row0 + g : row0 + g + 8;
    const bool va = ra < (sw ? I : N), vb = sw ? va : rb < N;
    const int64_t rowbytes = I4 ? K / 2 : K;   /* either way 64 bytes per row and step */
    const uint8_t *pa = W + (va ? ra : 0) * rowbytes + 16 * q;
    const uint8_t *pb = W + (vb ? rb : 0) * rowbytes + 16 * q;
    /* split-k (gridDim.z > 1): this block's steps [kb, ke) */
    const int kb = (int)blockIdx.z * per, ke = (int)(K / KS) < kb + per ? (int)(K / KS) : kb + per;
    const int64_t sgroups = WQ == WQ_I8 ? 1 : K / G;


    float acc[NTILES][4];
#pragma unroll
    for (int n = 0; n < NTILES; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    /* Prologue: the first GEMM_STAGES - 1 steps' weights go out before the wait (they overlap
     * the previous kernel's tail under programmatic dependent launch), their activations after
     * it. Group st holds step st's activations, group 0 also every prologue weight chunk: the
     * wait_group that covers step st's activations covers its weights too. */
#pragma unroll
    for (int st = 0; st < GEMM_STAGES - 1; st++)
        if (kb + st < ke) gemm_issue_w(ws[st], pa, pb, va, vb, kb + st);
    pln_pdl_wait();   /* the activations (and split-k's partials and counters) below */
#pragma unroll
    for (int st = 0; st < GEMM_STAGES - 1; st++) {
        if (kb + st < ke) gemm_issue_x<KS, BT>(xs[st], x, T, t0, K, kb + st);
        pln_cp_async_commit();   /* empty groups keep the count uniform */
    }
    int buf = 0, nbuf = GEMM_STAGES - 1;   /* the stage read now, the stage issued now */
    for (int kk = kb; kk < ke; kk++) {
        pln_cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        if (kk + GEMM_STAGES - 1 < ke) {
            gemm_issue_w(ws[nbuf], pa, pb, va, vb, kk + GEMM_STAGES - 1);
            gemm_issue_x<KS, BT>(xs[nbuf], x, T, t0, K, kk + GEMM_STAGES - 1);
        }
        pln_cp_async_commit();
        nbuf = nbuf == GEMM_STAGES - 1 ? 0 : nbuf + 1;
        __half2 sa = __half2half2(__float2half(1.0f)), sb = sa;
        if (WQ != WQ_I8) {
            /* 32-bit: a 64-bit division is a called subroutine (a stack frame in the SASS) */
            const int gi = (kk * KS + (I4 ? 32 : 16) * q) / (int)G;
            sa = __half2half2(va ? __ldg(scale + ra * sgroups + gi) : __float2half(0.0f));
            sb = __half2half2(vb ? __ldg(scale + rb * sgroups + gi) : __float2half(0.0f));
        }
        const int4 ca = ws[buf][0][tid], cb = ws[buf][1][tid];
        const uint32_t *A = (const uint32_t *)&ca;
        const uint32_t *B = (const uint32_t *)&cb;
        const __half *xb = xs[buf];
        if (!I4) {
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                int4 xv[NTILES];
#pragma unroll
                for (int n = 0; n < NTILES; n++) xv[n] = *(const int4 *)&xb[(n * 8 + g) * XS + 16 * q + 8 * jj];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * jj + h;
                    __half2 alo, ahi, blo, bhi;
                    pln_i8x4_to_h2x2(A[j], alo, ahi);
                    pln_i8x4_to_h2x2(B[j], blo, bhi);
                    if (WQ == WQ_I8G) {
                        alo = __hmul2(alo, sa); ahi = __hmul2(ahi, sa);
                        blo = __hmul2(blo, sb); bhi = __hmul2(bhi, sb);
                    }
#pragma unroll
                    for (int n = 0; n < NTILES; n++) {
                        const uint32_t *xw = (const uint32_t *)&xv[n];
                        pln_mma16816(acc[n], pln_h2_bits(alo), pln_h2_bits(blo), pln_h2_bits(ahi),
                                     pln_h2_bits(bhi), xw[2 * h], xw[2 * h + 1]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                __half2 ha[4], hb[4];
                i4x8_to_h2x4(A[i], sa, ha);
                i4x8_to_h2x4(B[i], sb, hb);
#pragma unroll
                for (int n = 0; n < NTILES; n++) {
                    const __half *xr = &xb[(n * 8 + g) * XS + 32 * q + 4 * i];
                    uint32_t l02, l13, h02, h13;
                    x_pairs(*(const uint2 *)xr, l02, l13);
                    x_pairs(*(const uint2 *)(xr + 16), h02, h13);
                    pln_mma16816(acc[n], pln_h2_bits(ha[0]), pln_h2_bits(hb[0]), pln_h2_bits(ha[1]),
                                 pln_h2_bits(hb[1]), l02, l13);
                    pln_mma16816(acc[n], pln_h2_bits(ha[2]), pln_h2_bits(hb[2]), pln_h2_bits(ha[3]),
                                 pln_h2_bits(hb[3]), h02, h13);
                }
            }
        }
        buf = buf == GEMM_STAGES - 1 ? 0 : buf + 1;
    }
    pln_cp_async_wait<0>();   /* nothing may be in flight at exit (only empty groups are left) */
    pln_pdl_trigger();   /* only the epilogue (or split-k's reduction) is left */
    const int kspl = gridDim.z;
    if (kspl > 1) {
        /* split-k: every block writes its fp32 tile ([token][row] of 64 x BT) and counts in on the
         * tile's arrival counter; the last to arrive sums the splits in split order (its own read
         * back too, so the order never depends on who came last), runs the epilogue and leaves
         * the counter zero again, as the GEMV does */
        const int tix = blockIdx.y * gridDim.x + blockIdx.x;
        float *tile = part + (int64_t)tix * kspl * 64 * BT;
        float *mine = tile + (int64_t)blockIdx.z * 64 * BT;
        const int lr = warp * 16 + g;
#pragma unroll
        for (int n = 0; n < NTILES; n++) {
            const int lt = n * 8 + 2 * q;
            mine[lt * 64 + lr] = acc[n][0];
            mine[(lt + 1) * 64 + lr] = acc[n][1];
            mine[lt * 64 + lr + 8] = acc[n][2];
            mine[(lt + 1) * 64 + lr + 8] = acc[n][3];
        }
        __shared__ bool last;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            last = atomicAdd(cnt + tix, 1u) == (unsigned)kspl - 1;
            if (last) atomicExch(cnt + tix, 0u);
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        /* 16-byte reads (4 rows of one token) through L2, the splits in a loop kept rolled */
        const float4 *t4 = (const float4 *)tile;
        if (sw) {
            /* token t, warp w: local rows 16 w + 0..7 gate (float4s 4 w, 4 w + 1 of the token's 16),
             * 16 w + 8..15 up (4 w + 2, 4 w + 3) */
            for (int i2 = tid; i2 < 8 * BT; i2 += 128) {
                const int lt = i2 / 8, w = (i2 % 8) / 2, j = i2 % 2;
                const int64_t at = (int64_t)lt * 16 + 4 * w + j;
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
#pragma unroll 1
                for (int y = 0; y < kspl; y++) {
                    const float4 pa = __ldcg(t4 + (int64_t)y * 16 * BT + at);
                    const float4 pb = __ldcg(t4 + (int64_t)y * 16 * BT + at + 2);
                    a.x += pa.x; a.y += pa.y; a.z += pa.z; a.w += pa.w;
                    b.x += pb.x; b.y += pb.y; b.z += pb.z; b.w += pb.w;
                }
                const float va4[4] = {a.x, a.y, a.z, a.w}, vb4[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = t0 + lt;
                    const int64_t p = (int64_t)blockIdx.x * 32 + 8 * w + 4 * j + e;
                    if (t >= T || p >= I) continue;
                    epilogue_swiglu(out, I, t, p, va4[e], vb4[e], WQ == WQ_I8 ? __half2float(scale[p]) : 1.0f,
                                    WQ == WQ_I8 ? __half2float(scale[I + p]) : 1.0f, bias);
                }
            }
            return;
        }
        for (int i4 = tid; i4 < 16 * BT; i4 += 128) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
            for (int y = 0; y < kspl; y++) {
                const float4 p = __ldcg(t4 + (int64_t)y * 16 * BT + i4);
                v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
            }
            const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = 4 * i4 + j, t = t0 + i / 64;
                const int64_t row = (int64_t)blockIdx.x * 64 + i % 64;
                if (t >= T || row >= N) continue;
                epilogue(out, N, t, row, vv[j], WQ == WQ_I8 ? __half2float(scale[row]) : 1.0f, bias, epi, n_valid);
            }
        }
        return;
    }
    float sca = 1.0f, scb = 1.0f;
    if (WQ == WQ_I8) {
        if (va) sca = __half2float(scale[ra]);
        if (vb) scb = __half2float(scale[rb]);
    }
    if (sw) {
#pragma unroll
        for (int n = 0; n < NTILES; n++) {
            int t = t0 + n * 8 + 2 * q;
            if (va && t < T) epilogue_swiglu(out, I, t, ra, acc[n][0], acc[n][2], sca, scb, bias);
            if (va && t + 1 < T) epilogue_swiglu(out, I, t + 1, ra, acc[n][1], acc[n][3], sca, scb, bias);
        }
        return;
    }
#pragma unroll
    for (int n = 0; n < NTILES; n++) {
        int t = t0 + n * 8 + 2 * q;
        if (va && t < T) epilogue(out, N, t, ra, acc[n][0], sca, bias, epi, n_valid);
        if (va && t + 1 < T) epilogue(out, N, t + 1, ra, acc[n][1], sca, bias, epi, n_valid);
        if (vb && t < T) epilogue(out, N, t, rb, acc[n][2], scb, bias, epi, n_valid);
        if (vb && t + 1 < T) epilogue(out, N, t + 1, rb, acc[n][3], scb, bias, epi, n_valid);
    }
}

/* ---- GeLU/-inf pass for the cuBLASLt path when an epilogue cannot do it ------------------- */
template <typename OT>
__global__ void post_kernel(OT *out, int T, int64_t N, const __half *bias, int gelu, int64_t n_valid)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * N) return;
    int64_t row = i % N;
    float v;
    if constexpr (sizeof(OT) == 2) v = __half2float(out[i]); else v = out[i];
    if (bias) v += __half2float(bias[row]);
    if (gelu) v = pln_gelu(v);
    if (row >= n_valid) v = -INFINITY;
    store_out(out + i, v);
}

/* ---- cuBLASLt: row-major out[T,N] = x[T,K] · W[N,K]ᵀ is column-major outᵀ[N,T] = W·xᵀ,
 * i.e. A = W (K x N column-major, transposed), B = x (K x T column-major). Plans are cached
 * per shape: heuristics cost tens of microseconds of host time, a decode step has ~300 calls. */
typedef struct {
    int64_t N, K; int T; int epi; bool f32; bool used;
    uint32_t align;   /* packed pointer alignments A|B|D|bias, each log2 of bytes (<= 8: 256) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} lt_plan;
#define LT_PLANS 128
static lt_plan lt_plans[LT_PLANS];
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;

static void lt_plan_free(lt_plan *p)
{
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    p->used = false;
}

void pln_cuda_linear_release(void)
{
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < LT_PLANS; i++) lt_plan_free(&lt_plans[i]);
    pthread_mutex_unlock(&lt_lock);
}

/* log2 of the largest power of two (at most 256) dividing the address: cuBLASLt's heuristics
 * assume 256-byte aligned operands unless told otherwise, and pick kernels that rely on it. */
static uint32_t align_log2(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t l = 0;
    while (l < 8 && !(a & ((uintptr_t)1 << l))) l++;
    return l;
}

static int lt_plan_make(pln_cuda_ctx *c, lt_plan *p, int64_t N, int64_t K, int T, int epi, bool f32, uint32_t align)
{
    cublasLtEpilogue_t e = (cublasLtEpilogue_t)epi;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        cudaDataType_t bt = CUDA_R_16F;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16F, K, N, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16F, K, T, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d, f32 ? CUDA_R_32F : CUDA_R_16F, N, T, N));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->lt_ws_size;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al[4] = {1u << (align & 15), 1u << ((align >> 4) & 15), 1u << ((align >> 8) & 15), 1u << ((align >> 12) & 15)};
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], 4));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    p->used = true;
    if (pln_cublas_check(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__)) {
        lt_plan_free(p);
        pln_error_context("linear [%lld x %lld] for %d tokens", (long long)N, (long long)K, T);
        return st == CUBLAS_STATUS_NOT_SUPPORTED ? 1 : -1;   /* 1: no algorithm for this shape */
    }
    p->algo = h.algo;
    p->N = N; p->K = K; p->T = T; p->epi = epi; p->f32 = f32; p->align = align;
    return 0;
}

/* 0 when enqueued; 1 when cuBLASLt has no algorithm for the shape (the caller falls back); -1 on
 * an error. */
static int linear_cublaslt(pln_cuda_ctx *c, void *out, bool f32, const void *in, const pln_weight *W,
                           const uint16_t *bias, int T, bool gelu)
{
    int epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (bias) epi = (gelu && c->gelu_epilogue) ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else if (gelu && c->gelu_epilogue) epi = CUBLASLT_EPILOGUE_GELU;
    pthread_mutex_lock(&lt_lock);
    lt_plan *p = NULL;
    const uint32_t align = align_log2(W->w) | align_log2(in) << 4 | align_log2(out) << 8 |
                           (bias ? align_log2(bias) : 8u) << 12;
    unsigned hsh = (unsigned)(W->rows * 31 + W->cols * 17 + T * 7 + epi * 3 + f32 + align);
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan *e = &lt_plans[(hsh + i) % LT_PLANS];
        if (e->used && e->N == W->rows && e->K == W->cols && e->T == T && e->epi == epi && e->f32 == f32 &&
            e->align == align) { p = e; break; }
        if (!e->used) { p = e; break; }
    }
    if (!p) { p = &lt_plans[hsh % LT_PLANS]; lt_plan_free(p); }
    int made = p->used ? 0 : lt_plan_make(c, p, W->rows, W->cols, T, epi, f32, align);
    if (made) {
        pthread_mutex_unlock(&lt_lock);
        return made;
    }
    /* The bias pointer lives in the shared descriptor: set it and enqueue under the lock. */
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (bias) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(c->lt, p->op, &one, W->w, p->a, in, p->b, &zero, out, p->d, out, p->d, &p->algo,
                            c->lt_ws, c->lt_ws_size, c->stream);
    pthread_mutex_unlock(&lt_lock);
    if (pln_cublas_check(st, "cublasLtMatmul", __FILE__, __LINE__))
        return pln_error_context("linear [%lld x %lld] for %d tokens", (long long)W->rows, (long long)W->cols, T);
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------------------ */
/* Blocks of one GEMV instance that an SM holds at once (its registers decide: 114-178 per thread
 * on sm_90, so 2-4 blocks of 128 threads), asked of the runtime once per instance. */
template <bool I8, bool GROUPED, int NT, typename OT>
static int gemv_resident(void)
{
    static int n = 0;   /* every thread that races here stores the same value */
    int v = __atomic_load_n(&n, __ATOMIC_RELAXED);
    if (v > 0) return v;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gemv_kernel<I8, GROUPED, NT, OT>, GEMV_WARPS * 32, 0) !=
            cudaSuccess || v < 1) {
        (void)cudaGetLastError();
        v = 1;
    }
    __atomic_store_n(&n, v, __ATOMIC_RELAXED);
    return v;
}

/* Grids: 16 rows per block. Split-k (gridDim.y blocks per row tile, the last of a tile to finish
 * reducing, in gemv_kernel) only as far as one wave holds: the largest split whose blocks are
 * all resident at once (row tiles x split <= resident blocks per SM x SMs), each split at least
 * one pipelined round per warp (16 steps). Swept on an H200 over the decode linears of
 * BLOOM-176B (TP 8) and Llama-3.1-8B/70B (TP 1/8), fp16 and int8, 1 and 8 tokens (bench_decode
 * --sweep-only): a second wave never paid, except for QKV of BLOOM's rank (336 tiles:
 * split 3, 4-8 % faster than 1), and filling the first did (70B's QKV, 80 tiles: split 6, 2.4x
 * faster than 1 in fp16; 8B's o_proj and down_proj, 256 tiles: split 2, 1.1-1.3x); the rule picks
 * the best split in 22 of those 24 cases at 1 token (not BLOOM's QKV). The rule it replaces (at
 * least 4 blocks per SM, rounded up) was 5-38 % slower than the best in 14 of them. At 16-32
 * tokens and in int8 groups of 128, BLOOM's QKV and dense_h_to_4h take 3-4 splits (several waves)
 * 10-29 % faster than this rule's 1 (docs/CUDA.md). */
template <bool I8, bool GROUPED, typename OT>
static int launch_gemv(pln_cuda_ctx *c, OT *out, const __half *x, const pln_weight *W, const __half *b,
                       int T, int epi, int64_t n_valid)
{
    /* SwiGLU: 8 gate/up pairs per block (gemv_kernel) */
    const int blocks = epi == PLN_EPI_SWIGLU ? pln_cdiv(W->rows / 2, 8) : pln_cdiv(W->rows, 16);
    const int64_t nsteps = W->cols / (I8 ? 64 : 32);
    const int resident = T <= 8 ? gemv_resident<I8, GROUPED, 8, OT>()
                         : T <= 16 ? gemv_resident<I8, GROUPED, 16, OT>() : gemv_resident<I8, GROUPED, GEMV_MAX_T, OT>();
    const int64_t wave = (int64_t)resident * (c->sm_count > 0 ? c->sm_count : 1);
    int64_t kspl = blocks < wave ? wave / blocks : 1;
    const int64_t most = nsteps / (GEMV_WARPS * GEMV_U);
    if (kspl > most) kspl = most;
    if (kspl < 1) kspl = 1;
    if (c->gemv_splits > 0) kspl = c->gemv_splits < nsteps ? c->gemv_splits : (nsteps > 0 ? nsteps : 1);
    const int64_t per = pln_cdiv(nsteps, kspl);
    float *part = nullptr;
    unsigned *cnt = nullptr;
    if (kspl > 1) {
        const int nt = T <= 8 ? 8 : T <= 16 ? 16 : GEMV_MAX_T;   /* the kernel's NT below */
        part = (float *)pln_cuda_scratch(c, (size_t)blocks * kspl * 16 * nt * sizeof(float));
        if (!part) return -1;
        cnt = pln_cuda_attn_counters(c, (size_t)blocks);
        if (!cnt) return -1;
    }
    dim3 grid((unsigned)blocks, (unsigned)kspl);
    const __half *sc = (const __half *)W->scale;
    if (T <= 8)
        PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_kernel<I8, GROUPED, 8, OT>)(
            out, x, W->w, sc, W->group, b, T, W->rows, W->cols, epi, n_valid, part, cnt, per);
    else if (T <= 16)
        PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_kernel<I8, GROUPED, 16, OT>)(
            out, x, W->w, sc, W->group, b, T, W->rows, W->cols, epi, n_valid, part, cnt, per);
    else
        PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_kernel<I8, GROUPED, GEMV_MAX_T, OT>)(
            out, x, W->w, sc, W->group, b, T, W->rows, W->cols, epi, n_valid, part, cnt, per);
    return 0;
}

/* The quantized GEMM: 64-token tiles for int8 above 32 tokens, 32-token tiles otherwise (int4's
 * 128-column steps would need 64 KB of shared memory for 64 tokens in 3 stages). A grid of fewer
 * tiles than GEMM_FILL_PER_SM blocks per SM (QKV of a TP-8 BLOOM-176B rank at 64 tokens: 84 tiles
 * on 132 SMs) splits k over gridDim.z blocks of at least GEMM_MIN_SPLIT_STEPS steps each; the
 * last block of a tile to finish reduces (split-k in gemm_wq_kernel). -1 on an error. */
#define GEMM_FILL_PER_SM 2
#define GEMM_MIN_SPLIT_STEPS 8
template <int WQ, typename OT>
static int launch_gemm(pln_cuda_ctx *c, OT *out, const __half *x, const uint8_t *w, const pln_weight *W,
                       const __half *b, int T, int epi, int64_t n_valid)
{
    const __half *sc = (const __half *)W->scale;
    const int bt = WQ != WQ_I4 && T > 32 ? 64 : 32;
    const int nk = (int)(W->cols / (WQ == WQ_I4 ? 128 : 64));
    /* SwiGLU: 32 gate/up pairs per block (gemm_wq_kernel) */
    const int row_tiles = epi == PLN_EPI_SWIGLU ? pln_cdiv(W->rows / 2, 32) : pln_cdiv(W->rows, 64);
    const int64_t tiles = (int64_t)row_tiles * pln_cdiv(T, bt);
    const int64_t target = (int64_t)GEMM_FILL_PER_SM * (c->sm_count > 0 ? c->sm_count : 1);
    int64_t kspl = 1;
    if (tiles < target) {
        kspl = pln_cdiv(target, tiles);
        if (kspl > nk / GEMM_MIN_SPLIT_STEPS) kspl = nk / GEMM_MIN_SPLIT_STEPS;
        if (kspl < 1) kspl = 1;
    }
    if (c->gemv_splits > 0) kspl = c->gemv_splits < nk ? c->gemv_splits : (nk > 0 ? nk : 1);
    const int per = pln_cdiv(nk, kspl);
    float *part = nullptr;
    unsigned *cnt = nullptr;
    if (kspl > 1) {
        part = (float *)pln_cuda_scratch(c, (size_t)tiles * kspl * 64 * bt * sizeof(float));
        if (!part) return -1;
        cnt = pln_cuda_attn_counters(c, (size_t)tiles);
        if (!cnt) return -1;
    }
    dim3 grid((unsigned)row_tiles, (unsigned)pln_cdiv(T, bt), (unsigned)kspl);
    if (bt == 64)
        PLN_LAUNCH(grid, 128, 0, c->stream, gemm_wq_kernel<WQ, WQ == WQ_I4 ? 32 : 64, OT>)(
            out, x, w, sc, W->group, b, T, W->rows, W->cols, epi, n_valid, part, cnt, per);
    else
        PLN_LAUNCH(grid, 128, 0, c->stream, gemm_wq_kernel<WQ, 32, OT>)(out, x, w, sc, W->group, b, T, W->rows,
                                                                         W->cols, epi, n_valid, part, cnt, per);
    return 0;
}

/* int4 weights: the GEMV (T <= 16), the GEMM, or the plain kernel (columns not a multiple of
 * the 128-column step, or pointers not 16-byte aligned), by the same path rules as linear_typed. */
template <typename OT>
static int linear_i4_typed(pln_cuda_ctx *c, OT *out, const void *in, const pln_weight *W,
                           const uint16_t *bias, int T, int epi, int64_t n_valid)
{
    const __half *x = (const __half *)in;
    const __half *b = (const __half *)bias;
    const __half *sc = (const __half *)W->scale;
    const uint8_t *w = (const uint8_t *)W->w;
    const bool sw = epi == PLN_EPI_SWIGLU;
    const int64_t n_out = sw ? W->rows / 2 : W->rows;   /* outputs per token */
    const bool fast = W->cols % 128 == 0 && W->group % 32 == 0 && ((uintptr_t)W->w % 16 == 0) &&
                      ((uintptr_t)in % 16 == 0);
    pln_linear_path path = c->linear_path;
    if (path == PLN_LINEAR_AUTO) path = T <= GEMV_MAX_T_Q ? PLN_LINEAR_GEMV : PLN_LINEAR_GEMM;
    if (path == PLN_LINEAR_GEMV && T > GEMV_MAX_T) path = PLN_LINEAR_GEMM;
    if (!fast) path = PLN_LINEAR_NAIVE;
    const int ig = epi;
    if (path == PLN_LINEAR_GEMV) {
        dim3 grid((unsigned)(sw ? pln_cdiv(n_out, 8) : pln_cdiv(W->rows, 16)));
        if (T <= 8)
            PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_i4_kernel<8, OT>)(out, x, w, sc, W->group, b, T,
                                                                                  W->rows, W->cols, ig, n_valid);
        else if (T <= 16)
            PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_i4_kernel<16, OT>)(out, x, w, sc, W->group, b, T,
                                                                                   W->rows, W->cols, ig, n_valid);
        else
            PLN_LAUNCH(grid, GEMV_WARPS * 32, 0, c->stream, gemv_i4_kernel<GEMV_MAX_T, OT>)(
                out, x, w, sc, W->group, b, T, W->rows, W->cols, ig, n_valid);
    } else if (path == PLN_LINEAR_GEMM) {
        if (launch_gemm<WQ_I4, OT>(c, out, x, w, W, b, T, ig, n_valid)) return -1;
    } else {
        int64_t threads = (int64_t)T * n_out * 32;
        PLN_LAUNCH(pln_cdiv(threads, 256), 256, 0, c->stream, linear_naive_kernel<OT, NAIVE_I4>)(
            out, x, w, sc, W->group, b, T, W->rows, W->cols, ig, n_valid);
    }
    cudaCheckLaunch();
    return 0;
}

template <typename OT>
static int linear_typed(pln_cuda_ctx *c, OT *out, const void *in, const pln_weight *W,
                        const uint16_t *bias, int T, int epi, int64_t n_valid)
{
    const __half *x = (const __half *)in;
    const __half *b = (const __half *)bias;
    const bool i8 = W->dtype == PLN_DTYPE_I8;
    const bool sw = epi == PLN_EPI_SWIGLU, gelu = epi == PLN_EPI_GELU;
    const bool grouped = i8 && W->group != W->cols;
    /* Fast kernels need whole 16-byte steps: cols a multiple of 64 (int8 step) or 32 (fp16),
     * groups of whole 16-column chunks, 16-byte aligned rows. */
    bool fast = (i8 ? W->cols % 64 == 0 : W->cols % 32 == 0) && (!grouped || W->group % 16 == 0) &&
                ((uintptr_t)W->w % 16 == 0) && ((uintptr_t)in % 16 == 0);
    pln_linear_path path = c->linear_path;
    if (path == PLN_LINEAR_AUTO) path = T <= (i8 ? GEMV_MAX_T_Q : GEMV_MAX_T_F16) ? PLN_LINEAR_GEMV : PLN_LINEAR_GEMM;
    if (path == PLN_LINEAR_GEMV && T > GEMV_MAX_T) path = PLN_LINEAR_GEMM;
    if (!fast) path = PLN_LINEAR_NAIVE;
    const int ig = epi;

    if (path == PLN_LINEAR_GEMV) {
        int rc = !i8      ? launch_gemv<false, false, OT>(c, out, x, W, b, T, ig, n_valid)
                 : grouped ? launch_gemv<true, true, OT>(c, out, x, W, b, T, ig, n_valid)
                           : launch_gemv<true, false, OT>(c, out, x, W, b, T, ig, n_valid);
        if (rc) return -1;
        cudaCheckLaunch();
        return 0;
    }
    if (path == PLN_LINEAR_GEMM && i8) {
        if (grouped ? launch_gemm<WQ_I8G, OT>(c, out, x, (const uint8_t *)W->w, W, b, T, ig, n_valid)
                    : launch_gemm<WQ_I8, OT>(c, out, x, (const uint8_t *)W->w, W, b, T, ig, n_valid))
            return -1;
        cudaCheckLaunch();
        return 0;
    }
    if (path == PLN_LINEAR_GEMM) {
        /* The epilogue does bias (+ GeLU) when it can; a bias that is not 16-byte aligned, GeLU
         * when the epilogue is turned off, and the -inf padding rows go through post_kernel.
         * cuBLASLt has no SwiGLU epilogue: the [T, 2I] projection goes to scratch and
         * swiglu_kernel makes out of it (two launches, as linear then swiglu). */
        const bool lt_bias = bias && ((uintptr_t)bias & 15) == 0;
        const bool lt_gelu = gelu && c->gelu_epilogue && (lt_bias || !bias);
        OT *lt_out = out;
        if (sw) {
            if (sizeof(OT) != 2) return pln_errorf("linear: the SwiGLU epilogue writes fp16 activations only");
            lt_out = (OT *)pln_cuda_scratch(c, (size_t)T * (size_t)W->rows * sizeof(__half));
            if (!lt_out) return -1;
        }
        int lt = linear_cublaslt(c, lt_out, sizeof(OT) == 4, in, W, lt_bias ? bias : NULL, T, lt_gelu);
        if (lt < 0) return -1;
        if (lt > 0) {
            /* cuBLASLt has no algorithm for this shape: the plain kernel is slow but correct. */
            static bool said;
            if (!said) {
                said = true;
                fprintf(stderr, "pollen: %s; that shape runs on the plain kernel\n", pln_error());
            }
            goto naive;
        }
        const __half *pb = lt_bias ? nullptr : b;
        const bool pg = gelu && !lt_gelu;
        if (pb || pg || n_valid < W->rows) {
            int64_t n = (int64_t)T * W->rows;
            PLN_LAUNCH(pln_cdiv(n, 256), 256, 0, c->stream, post_kernel<OT>)(lt_out, T, W->rows, pb, pg ? 1 : 0, n_valid);
            cudaCheckLaunch();
        }
        if (sw) return pln_cuda_swiglu(c, out, lt_out, T, W->rows / 2);
        return 0;
    }
naive:
    int64_t threads = (int64_t)T * (sw ? W->rows / 2 : W->rows) * 32;
    if (i8)
        PLN_LAUNCH(pln_cdiv(threads, 256), 256, 0, c->stream, linear_naive_kernel<OT, NAIVE_I8>)(
            out, x, W->w, (const __half *)W->scale, W->group, b, T, W->rows, W->cols, ig, n_valid);
    else
        PLN_LAUNCH(pln_cdiv(threads, 256), 256, 0, c->stream, linear_naive_kernel<OT, NAIVE_F16>)(
            out, x, W->w, (const __half *)W->scale, 1, b, T, W->rows, W->cols, ig, n_valid);
    cudaCheckLaunch();
    return 0;
}

int pln_cuda_linear(pln_cuda_ctx *c, void *out, bool out_f32, const void *in, const pln_weight *W,
                    const uint16_t *bias, int32_t T, int epi, int64_t n_valid)
{
    if (T <= 0) return 0;
    if (epi != PLN_EPI_NONE && epi != PLN_EPI_GELU && epi != PLN_EPI_SWIGLU)
        return pln_errorf("linear: unknown epilogue %d", epi);
    if (epi == PLN_EPI_SWIGLU && (W->rows % 2 || out_f32))
        return pln_errorf("linear: the SwiGLU epilogue needs an even row count ([gate ; up], got %lld) and fp16 output",
                          (long long)W->rows);
    if (W->dtype == PLN_DTYPE_U8) {   /* packed int4 */
        if (!W->scale || W->group <= 0 || W->group % 32 || W->cols % W->group)
            return pln_errorf("linear: int4 weight [%lld, %lld] needs scales with a group that is a multiple of 32 and "
                              "divides the columns (group %lld)", (long long)W->rows, (long long)W->cols, (long long)W->group);
        if (n_valid > W->rows) n_valid = W->rows;
        if (out_f32) return linear_i4_typed<float>(c, (float *)out, in, W, bias, T, epi, n_valid);
        return linear_i4_typed<__half>(c, (__half *)out, in, W, bias, T, epi, n_valid);
    }
    if (W->dtype != PLN_DTYPE_F16 && W->dtype != PLN_DTYPE_I8)
        return pln_errorf("linear: weight dtype %s is not supported (F16, I8 or packed int4)", pln_dtype_name(W->dtype));
    if (W->dtype == PLN_DTYPE_I8 && (!W->scale || W->group <= 0 || W->cols % W->group != 0))
        return pln_errorf("linear: int8 weight [%lld, %lld] needs scales with a group dividing the columns (group %lld)",
                          (long long)W->rows, (long long)W->cols, (long long)W->group);
    if (n_valid > W->rows) n_valid = W->rows;
    if (out_f32) return linear_typed<float>(c, (float *)out, in, W, bias, T, epi, n_valid);
    return linear_typed<__half>(c, (__half *)out, in, W, bias, T, epi, n_valid);
}
