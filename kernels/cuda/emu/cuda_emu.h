/* cuda_emu.h — the CUDA built-ins for compiling the kernels/cuda .cu files as host C++: the CPU execution
 * harness (PLN_CUDA_EMU, docs/CUDA.md "Running the kernels on the CPU"). The Makefile passes it
 * with -include before anything else, so the kernels compile unchanged: the same source is
 * device code under nvcc and host code here, with no second copy of any kernel.
 *
 * What it maps: __global__/__device__ to plain functions; static __shared__ to static locals in
 * one ELF section (.pln_shared), so the harness knows the range and checks every access to it;
 * threadIdx/blockIdx/blockDim/gridDim to the running fiber's values; __syncthreads, __syncwarp
 * and the warp collectives (shuffles, votes, reductions, the m16n8k16 mma) to calls that yield
 * to the harness's scheduler (kernels/cuda/emu/cuda_emu.cc); griddepcontrol.wait/launch_dependents
 * (pln_pdl_wait/pln_pdl_trigger in common.cuh) to calls that feed its programmatic-dependent-launch
 * check; atomics, __ldg and the fast-math intrinsics to host equivalents. __half/__half2/__nv_bfloat16 and the vector types come from
 * the toolkit's own headers, which implement them for the host. */
#ifndef PLN_CUDA_EMU_H
#define PLN_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is for the host C++ build of kernels/cuda/*.cu"
#endif

/* Before the toolkit headers: they keep these definitions when they exist. */
#define __host__
#define __device__
#define __global__
#define __launch_bounds__(...)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <functional>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <utility>

#include "kernels/cuda/emu/emu.h"

/* Static shared memory: one range for all kernels, shared by the fibers of the running block.
 * The section name is not a C identifier on purpose: ASan leaves globals in such sections (whose
 * bounds the linker exports as __start_/__stop_ symbols) uninstrumented, and with redzones
 * between the variables an index past one __shared__ array is an ASan report in the SANITIZE
 * build. The harness finds the section in its own ELF section headers instead. */
#undef __shared__
#define __shared__ static __attribute__((section(".pln_shared"), used))
/* Dynamic shared memory of exactly the launch's smem bytes (red zone after it). */
#define PLN_EMU_DYNAMIC_SHARED(T, name) T *name = (T *)pln_emu_dynamic_shared()

extern "C" {
extern uint3 pln_emu_thread_idx, pln_emu_block_idx;
extern dim3 pln_emu_block_dim, pln_emu_grid_dim;
void *pln_emu_dynamic_shared(void);
void pln_emu_syncthreads(const char *site);
uint64_t pln_emu_collective(int op, unsigned mask, uint64_t v, int arg, int width);
/* mma.cuh: the instruction's PTX text (PLN_MMA16816_PTX), the accumulators %0-%3 and the inputs %4-%9 */
void pln_emu_mma_ptx(const char *ptx, float c[4], const uint32_t in[6]);
/* cp.async: 16 bytes global -> shared (src_bytes 16, or 0: zero fill), landing only at the
 * wait_group that covers its commit group (common.cuh: pln_cp_async16 and friends). */
void pln_emu_cp_async16(void *dst, const void *src, int src_bytes);
void pln_emu_cp_async_commit(void);
void pln_emu_cp_async_wait(int n);
int pln_emu_atomic_i32(int op, void *p, int v, int cmp);
float pln_emu_atomic_add_f32(float *p, float v);
unsigned long long pln_emu_atomic_add_u64(unsigned long long *p, unsigned long long v);
/* griddepcontrol.wait / .launch_dependents (programmatic dependent launch) */
void pln_emu_griddep_wait(void);
void pln_emu_griddep_launch(void);
void pln_emu_threadfence(void);
}

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx pln_emu_thread_idx
#define blockIdx pln_emu_block_idx
#define blockDim pln_emu_block_dim
#define gridDim pln_emu_grid_dim
#ifndef warpSize
#define warpSize 32
#endif

#define PLN_EMU_STR2(x) #x
#define PLN_EMU_STR(x) PLN_EMU_STR2(x)
#define __syncthreads() pln_emu_syncthreads(__FILE__ ":" PLN_EMU_STR(__LINE__))

static inline void __syncwarp(unsigned mask = 0xffffffffu) { pln_emu_collective(PLN_EMU_SYNCWARP, mask, 0, 0, 32); }

template <typename T> static inline uint64_t pln_emu_bits(T v)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> static inline T pln_emu_from_bits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return pln_emu_from_bits<T>(pln_emu_collective(PLN_EMU_SHFL, mask, pln_emu_bits(v), src, width));
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return pln_emu_from_bits<T>(pln_emu_collective(PLN_EMU_SHFL_UP, mask, pln_emu_bits(v), (int)delta, width));
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return pln_emu_from_bits<T>(pln_emu_collective(PLN_EMU_SHFL_DOWN, mask, pln_emu_bits(v), (int)delta, width));
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return pln_emu_from_bits<T>(pln_emu_collective(PLN_EMU_SHFL_XOR, mask, pln_emu_bits(v), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)pln_emu_collective(PLN_EMU_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) { return (int)pln_emu_collective(PLN_EMU_ANY, mask, pred != 0, 0, 32); }
static inline int __all_sync(unsigned mask, int pred) { return (int)pln_emu_collective(PLN_EMU_ALL, mask, pred != 0, 0, 32); }
static inline unsigned __activemask(void) { return 0xffffffffu; }
static inline unsigned __reduce_add_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_ADD, mask, v, 0, 32); }
static inline int __reduce_add_sync(unsigned mask, int v) { return (int)pln_emu_collective(PLN_EMU_RED_ADD, mask, (uint32_t)v, 0, 32); }
static inline unsigned __reduce_min_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_MIN, mask, v, 0, 32); }
static inline int __reduce_min_sync(unsigned mask, int v) { return (int)pln_emu_collective(PLN_EMU_RED_MIN, mask, (uint64_t)(int64_t)v, 1, 32); }
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_MAX, mask, v, 0, 32); }
static inline int __reduce_max_sync(unsigned mask, int v) { return (int)pln_emu_collective(PLN_EMU_RED_MAX, mask, (uint64_t)(int64_t)v, 1, 32); }
static inline unsigned __reduce_and_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_AND, mask, v, 0, 32); }
static inline unsigned __reduce_or_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_OR, mask, v, 0, 32); }
static inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) { return (unsigned)pln_emu_collective(PLN_EMU_RED_XOR, mask, v, 0, 32); }

/* Atomics: in the runtime (not instrumented: an atomic is not a race). Fibers switch only at
 * synchronization points, so each is indivisible. */
static inline int atomicAdd(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_ADD, p, v, 0); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_ADD, p, (int)v, 0); }
static inline float atomicAdd(float *p, float v) { return pln_emu_atomic_add_f32(p, v); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { return pln_emu_atomic_add_u64(p, v); }
static inline int atomicOr(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_OR, p, v, 0); }
static inline unsigned atomicOr(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_OR, p, (int)v, 0); }
static inline int atomicAnd(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_AND, p, v, 0); }
static inline unsigned atomicAnd(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_AND, p, (int)v, 0); }
static inline unsigned atomicXor(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_XOR, p, (int)v, 0); }
static inline int atomicMax(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_MAX, p, v, 0); }
static inline unsigned atomicMax(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_UMAX, p, (int)v, 0); }
static inline int atomicMin(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_MIN, p, v, 0); }
static inline unsigned atomicMin(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_UMIN, p, (int)v, 0); }
static inline int atomicExch(int *p, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_EXCH, p, v, 0); }
static inline unsigned atomicExch(unsigned *p, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_EXCH, p, (int)v, 0); }
static inline int atomicCAS(int *p, int cmp, int v) { return pln_emu_atomic_i32(PLN_EMU_AT_CAS, p, v, cmp); }
static inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) { return (unsigned)pln_emu_atomic_i32(PLN_EMU_AT_CAS, p, (int)v, (int)cmp); }
/* __threadfence publishes this thread's global stores (and those ordered before it by a
 * __syncthreads) to the other blocks (cuda_emu.cc: "stores between blocks"); a block-scope fence
 * orders nothing the harness does not already order. */
static inline void __threadfence(void) { pln_emu_threadfence(); }
static inline void __threadfence_block(void) {}

/* Cache-hinted loads and stores are plain accesses on the host. */
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline T __ldca(const T *p) { return *p; }
template <typename T> static inline T __ldlu(const T *p) { return *p; }
template <typename T> static inline T __ldcv(const T *p) { return *p; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
template <typename T> static inline void __stwt(T *p, T v) { *p = v; }

/* Integer and bit intrinsics. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t b = (uint64_t)y << 32 | x;   /* bytes 0-3: x, 4-7: y (PTX prmt, default mode) */
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((b >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }

/* Fast-math intrinsics: the exact host functions (the GPU's are approximations within the
 * tolerances the op tests allow). */
/* glibc declares these names itself: macros, not functions. */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __powf(x, y) powf(x, y)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanhf(x) tanhf(x)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

/* ---- launches: PLN_LAUNCH(grid, block, smem, stream, kernel)(args...) ------------------------
 * The arguments are converted to the kernel's parameter types and copied at the launch, as
 * CUDA does; the launch runs at once in the stream's order, or is recorded while the stream is
 * capturing a graph. A failed check shows in cudaGetLastError() as cudaErrorLaunchFailure. */
struct pln_emu_launch_cfg {
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    int pdl;   /* launched with programmatic stream serialization: may overlap the previous kernel */
};
void pln_emu_launch_run(const pln_emu_launch_cfg &cfg, std::function<void()> body);

template <typename... P> struct pln_emu_launcher_t {
    pln_emu_launch_cfg cfg;
    void (*fn)(P...);
    template <typename... A> void operator()(A &&...a) const
    {
        auto f = fn;
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        pln_emu_launch_run(cfg, [f, args]() { std::apply(f, args); });
    }
};
template <typename... P>
static inline pln_emu_launcher_t<P...> pln_emu_launcher(const char *name, dim3 grid, dim3 block, size_t smem,
                                                        cudaStream_t stream, int pdl, void (*fn)(P...))
{
    return pln_emu_launcher_t<P...>{{name, grid, block, smem, stream, pdl != 0}, fn};
}

#endif
