/* mma.cuh — tensor-core building blocks shared by the GEMV/GEMM kernels: one m16n8k16 fp16
 * mma with fp32 accumulation (sm_80+), and int8 -> fp16 conversion in registers.
 *
 * The k permutation trick: a dot product does not care in which order k is summed, so each lane
 * feeds the mma the values it loaded contiguously (16 bytes) instead of the fragment's canonical
 * columns, as long as A (weights) and B (activations) use the same permutation. Lane (g = lane/4,
 * q = lane%4) then needs, per mma, 4 consecutive k of weight rows g and g+8 and the same 4 k of
 * token g: one 8-byte word pair each, no shuffles and no shared-memory staging of the weights. */
#ifndef PLN_CUDA_MMA_CUH
#define PLN_CUDA_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(PLN_CUDA_EMU)
/* The instruction, once for both builds: nvcc assembles this text; the CPU harness parses the
 * same text (opcode, then the D, A, B, C register groups) and computes what it says, so the
 * operand order and the fragment layout cannot differ between the GPU and the harness. Operands
 * in asm order: %0-%3 the fp32 accumulators c[0..3] (read and written), %4-%9 the inputs in[0..5]. */
#define PLN_MMA16816_PTX                                                                                     \
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#ifdef PLN_CUDA_EMU   /* the CPU harness: a warp collective that reads the PTX text */
#define PLN_MMA_EXEC(ptx, c, in) pln_emu_mma_ptx(ptx, c, in)
#else
#define PLN_MMA_EXEC(ptx, c, in)                                                                             \
    asm volatile(ptx : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                        \
                 : "r"(in[0]), "r"(in[1]), "r"(in[2]), "r"(in[3]), "r"(in[4]), "r"(in[5]))
#endif

/* c += a · b for one 16x8x16 tile: a = {row g k0-1, row g+8 k0-1, row g k2-3, row g+8 k2-3},
 * b = {token g k0-1, token g k2-3} as half2 words; c = {row g tok 2q, 2q+1, row g+8 tok 2q, 2q+1}. */
__device__ __forceinline__ void pln_mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1)
{
    const uint32_t in[6] = {a0, a1, a2, a3, b0, b1};
    PLN_MMA_EXEC(PLN_MMA16816_PTX, c, in);
}

__device__ __forceinline__ uint32_t pln_h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 pln_bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

/* Four int8 in one word -> two half2 (bytes 0,1 and bytes 2,3), exact: bias each byte to
 * unsigned, splice it under the exponent of 1024.0 (0x64xx = 1024 + xx), subtract 1024 + 128.
 * Two byte permutes and two half2 subtractions for four weights. */
__device__ __forceinline__ void pln_i8x4_to_h2x2(uint32_t v, __half2 &lo, __half2 &hi)
{
    uint32_t u = v ^ 0x80808080u;
    uint32_t l = __byte_perm(u, 0x64646464u, 0x5140);
    uint32_t h = __byte_perm(u, 0x64646464u, 0x5342);
    const __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6480)); /* 1152 */
    lo = __hsub2(pln_bits_h2(l), bias);
    hi = __hsub2(pln_bits_h2(h), bias);
}
#endif

#endif
