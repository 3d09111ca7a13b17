/* broken.cu — kernels that each break one rule of tests/sass/check.sh on purpose, so that
 * tests/e2e_sass.sh can show every check is able to fail (tests/sass/broken.expect lists them
 * and the failure each must produce), plus one kernel that breaks nothing (the control).
 * Compiled by the test only, for sm_90a, never linked into anything. */
#include <cuda_fp16.h>
#include <stdint.h>

/* The old pln_h8: a struct of four __half2 is copied member by member (__half2 has a
 * user-provided copy constructor), so a "16-byte" load becomes four 32-bit loads. */
struct __align__(16) old_h8 { __half2 h[4]; };

__global__ void __launch_bounds__(128) narrow_kernel(float *out, const __half *in)
{
    old_h8 v = ((const old_h8 *)in)[threadIdx.x];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) { float2 t = __half22float2(v.h[i]); s += t.x * t.y; }
    out[threadIdx.x] = s;
}

/* The same load through a uint4: one 128-bit load (the control: nothing here may fail). */
__global__ void __launch_bounds__(128) wide_kernel(float *out, const __half *in)
{
    uint4 u = ((const uint4 *)in)[threadIdx.x];
    out[threadIdx.x] = (float)(u.x ^ u.y ^ u.z ^ u.w);
}

/* A register array indexed by a value known only at run time lives in local memory: a stack
 * frame and LDL/STL, without any spill. */
__global__ void __launch_bounds__(128) local_kernel(float *out, const int *idx)
{
    float a[256];
    for (int i = 0; i < 256; i++) a[i] = out[i * 128 + threadIdx.x];
    a[idx[threadIdx.x] & 255] += 1.0f;
    out[threadIdx.x] = a[idx[threadIdx.x + 128] & 255];
}

/* 48 accumulators, each step mixing its neighbour in, all live across a loop, under launch bounds that leave 32 registers per thread
 * (1024 threads, 2 blocks per SM): ptxas must spill. */
__global__ void __launch_bounds__(1024, 2) spill_kernel(float *out, const float *in, int n)
{
    constexpr int N = 48;
    float acc[48];
#pragma unroll
    for (int i = 0; i < 48; i++) acc[i] = in[i * 1024 + threadIdx.x];   /* per thread: no uniform registers */
    for (int k = 0; k < n; k++) {
        float x = in[48 * 1024 + k];
#pragma unroll
        for (int i = 0; i < 48; i++) acc[i] = acc[i] * x + acc[(i + 1) % N];
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 48; i++) s += acc[i] * acc[(i + 7) % 48];
    out[threadIdx.x] = s;
}

/* No launch bounds, so ptxas may use up to 255 registers; broken.expect says it is launched with
 * 1024 threads (64 registers each), which its 96 accumulators exceed: the register budget check. */
__global__ void fat_kernel(float *out, const float *in, int n)
{
    constexpr int N = 96;
    float acc[96];
#pragma unroll
    for (int i = 0; i < 96; i++) acc[i] = in[i * 1024 + threadIdx.x];
    for (int k = 0; k < n; k++) {
        float x = in[96 * 1024 + k];
#pragma unroll
        for (int i = 0; i < 96; i++) acc[i] = acc[i] * x + acc[(i + 1) % N];
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 96; i++) s += acc[i] * acc[(i + 7) % 96];
    out[threadIdx.x] = s;
}

/* Programmatic dependent launch: a parameter load meant to overlap the previous kernel, issued
 * after griddepcontrol.wait instead of before it (no global load before the wait) ... */
__global__ void __launch_bounds__(128) late_prefetch_kernel(float *out, const float *w, const float *x)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    out[threadIdx.x] = w[threadIdx.x] * x[threadIdx.x];
}
/* ... and a kernel that never waits for its predecessor at all. */
__global__ void __launch_bounds__(128) nowait_kernel(float *out, const float *x)
{
    out[threadIdx.x] = 2.0f * x[threadIdx.x];
}
