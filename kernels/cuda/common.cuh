/* common.cuh — what every CUDA op file shares: checked CUDA/cuBLAS calls that print file, line
 * and a HINT, the supported-GPU tiers, fp16 vector helpers and warp/block reductions. */
#ifndef PLN_CUDA_COMMON_CUH
#define PLN_CUDA_COMMON_CUH

/* formats/common.h and kernels/backend.h are C headers without extern "C" guards. */
extern "C" {
#include "formats/common.h"
#include "kernels/backend.h"
}
#include "kernels/pln_math.h"

#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Hardware tiers: Ampere (sm_80: A100) is the oldest GPU the kernels are built for (cp.async,
 * bf16/fp16 tensor cores, 164 KB shared memory); Hopper (sm_90: H100/H200) runs the same
 * kernels from its own sm_90a build. */
#define PLN_CUDA_MIN_MAJOR 8
#define PLN_CUDA_HOPPER_MAJOR 9

/* A hint for the common CUDA failures, so the message says what to do next. */
static inline const char *pln_cuda_hint(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: use more ranks (--tp), int8 weights, or fewer concurrent sequences";
    case cudaErrorNoDevice:
        return "no CUDA device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES";
    case cudaErrorInsufficientDriver:
        return "the NVIDIA driver is older than this CUDA runtime: update the driver";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this GPU's architecture is not built: pollen builds sm_80 and sm_90a (CUDA_ARCHS in the Makefile)";
    case cudaErrorInvalidDevice:
        return "the device index is out of range: run at most one rank per GPU on each node (mpirun --map-by "
               "ppr:GPUS:node); when CUDA_VISIBLE_DEVICES gives each rank its own GPU pass --gpus-per-node 1 or --device 0";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel faulted: rerun under compute-sanitizer; the context is unusable, restart the process";
    default:
        return "rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing call";
    }
}

static inline int pln_cuda_check(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return 0;
    return pln_errorf("%s:%d: %s: %s (%s). HINT: %s", file, line, what, cudaGetErrorString(e),
                      cudaGetErrorName(e), pln_cuda_hint(e));
}

static inline int pln_cublas_check(cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    const char *hint = s == CUBLAS_STATUS_ALLOC_FAILED ? "the GPU is out of memory for cuBLASLt workspace"
                     : s == CUBLAS_STATUS_NOT_SUPPORTED ? "this shape/dtype/epilogue is not supported on this GPU: report the shape"
                     : s == CUBLAS_STATUS_ARCH_MISMATCH ? "this GPU is too old for cuBLASLt fp16 with fp32 accumulation (need sm_80+)"
                     : "rerun with CUBLASLT_LOG_LEVEL=2 to see why cuBLASLt refused";
    return pln_errorf("%s:%d: %s: %s (status %d). HINT: %s", file, line, what, cublasLtGetStatusString(s),
                      (int)s, hint);
}

/* Return -1 from the enclosing function (error recorded) when a call fails. */
#define cudaCheck(call) do { if (pln_cuda_check((call), #call, __FILE__, __LINE__)) return -1; } while (0)
#define cublasCheck(call) do { if (pln_cublas_check((call), #call, __FILE__, __LINE__)) return -1; } while (0)
/* After a kernel launch: catches bad launch configurations at once (asynchronous faults surface
 * at the next synchronizing call). */
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

/* Every kernel launch: PLN_LAUNCH(grid, block, smem, stream, kernel)(args...). Under nvcc it is
 * kernel<<<grid, block, smem, stream>>>(args...); in the CPU execution harness (PLN_CUDA_EMU,
 * kernels/cuda/emu/) an emulated launch that runs every thread as a fiber and logs the launch.
 * The kernel comes last because template arguments hold commas. */
/* Programmatic dependent launch (sm_90, docs/CUDA.md "Programmatic dependent launch"): when
 * pln_cuda_pdl is set, every launch carries cudaLaunchAttributeProgrammaticStreamSerialization, so
 * it may start while the previous kernel of the stream still runs; every kernel therefore calls
 * pln_pdl_wait() before it touches anything an earlier kernel writes, and pln_pdl_trigger() once
 * the next kernel may start. Set by pln_backend_cuda_create (sm_90 or newer, and PLN_PDL is not 0;
 * 0 on sm_80, where the launches are plain), changed by pln_cuda_set_pdl; read at each launch, so
 * a graph keeps the setting it was captured with. */
extern int pln_cuda_pdl;
#ifdef PLN_CUDA_EMU
#define PLN_LAUNCH(grid, block, smem, stream, ...) \
    pln_emu_launcher(#__VA_ARGS__, grid, block, smem, stream, pln_cuda_pdl, &__VA_ARGS__)
#else
template <typename... P> struct pln_launcher_t {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    void (*fn)(P...);
    /* errors show in cudaGetLastError(), as with <<<>>> (cudaCheckLaunch) */
    template <typename... A> void operator()(A &&...a) const
    {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = pln_cuda_pdl ? attr : nullptr;
        cfg.numAttrs = pln_cuda_pdl ? 1 : 0;
        (void)cudaLaunchKernelEx(&cfg, fn, static_cast<A &&>(a)...);
    }
};
template <typename... P>
static inline pln_launcher_t<P...> pln_launcher(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*fn)(P...))
{
    return pln_launcher_t<P...>{grid, block, smem, stream, fn};
}
#define PLN_LAUNCH(grid, block, smem, stream, ...) pln_launcher(grid, block, smem, stream, &__VA_ARGS__)
#endif
/* Device code: nvcc's device pass, and the CPU harness's host build of the same source. */
#if defined(__CUDACC__) || defined(PLN_CUDA_EMU)
#define PLN_CUDA_DEVICE_CODE 1
#endif
/* Dynamic shared memory (the launch's smem bytes): PLN_DYNAMIC_SHARED(float, buf); */
#ifdef PLN_CUDA_EMU
#define PLN_DYNAMIC_SHARED(T, name) PLN_EMU_DYNAMIC_SHARED(T, name)
#else
#define PLN_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

static inline int pln_cdiv(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* Which linear kernel to use: the bench forces one to compare them; the backend uses AUTO. */
typedef enum { PLN_LINEAR_AUTO = 0, PLN_LINEAR_GEMV = 1, PLN_LINEAR_GEMM = 2, PLN_LINEAR_NAIVE = 3 } pln_linear_path;

/* What every host launcher needs: the stream, the cuBLASLt handle and workspace, and one
 * growable device scratch buffer (attention partials, GEMV split-k partials, top-k candidates). Owned by the backend. */
typedef struct pln_cuda_ctx {
    int device;
    int sm_count;
    int cc_major, cc_minor;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_size;
    void *scratch;
    size_t scratch_size;
    pln_linear_path linear_path;
    bool gelu_epilogue;          /* false: cuBLASLt adds the bias only and GeLU runs as its own pass */
    bool attn_tiled;             /* prefill-heavy steps on the query-tiled attention kernel */
    size_t attn_scratch;         /* bound on split-key partial states per launch (0: PLN_ATTN_SCRATCH) */
    int attn_splits;             /* flash-decoding kernel: 0 auto, > 0 forced on with that many splits, < 0 off */
    int gemv_splits;             /* GEMV and quantized GEMM split-k: 0 auto (fill the SMs), n > 0 forced (tests) */
    int ln_split;                /* LayerNorm rows over several blocks (two launches) instead of one block per row */
    unsigned *attn_count;        /* arrival counters (flash-decoding merge, GEMV split-k), zero at rest */
    size_t attn_count_n;
    uint64_t epoch;              /* bumped whenever scratch moves: graphs recorded before are stale */
    void *host_pinned;           /* small pinned buffer for top-k results */
    size_t host_pinned_size;
} pln_cuda_ctx;

/* Returns scratch of at least n bytes, growing it outside stream capture (a decode step replayed
 * from a CUDA graph must have run once uncaptured first). NULL + error on failure. */
void *pln_cuda_scratch(pln_cuda_ctx *c, size_t n);
void *pln_cuda_host_pinned(pln_cuda_ctx *c, size_t n);
/* At least n zeroed counters (ctx->attn_count; each user leaves them zero again), grown like the
 * scratch: outside stream capture, bumping the epoch. NULL + error on failure. */
unsigned *pln_cuda_attn_counters(pln_cuda_ctx *c, size_t n);
/* The context of a cuda backend, or NULL with an error. */
pln_cuda_ctx *pln_cuda_ctx_of(pln_backend *be);

/* ---- device helpers ---------------------------------------------------------------------- */
#ifdef PLN_CUDA_DEVICE_CODE
/* griddepcontrol.wait: blocks until every kernel this one may overlap (programmatic dependent
 * launch) has completed and its memory is visible. Call it before the first access to anything a
 * previous kernel writes (or reads, if this kernel writes it); what comes before it (weights,
 * LayerNorm parameters, index arithmetic) overlaps the previous kernel's tail. A no-op when the
 * launch had no PDL attribute; nothing on sm_80. */
__device__ __forceinline__ void pln_pdl_wait(void)
{
#if defined(PLN_CUDA_EMU)
    pln_emu_griddep_wait();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* griddepcontrol.launch_dependents: the next kernel may be scheduled once every block has
 * called this or exited (its own pln_pdl_wait still waits for this whole grid to finish). Call
 * it after pln_pdl_wait, where the rest of this kernel no longer needs the SMs to itself. */
__device__ __forceinline__ void pln_pdl_trigger(void)
{
#if defined(PLN_CUDA_EMU)
    pln_emu_griddep_launch();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ float pln_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float pln_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * scratch: __shared__ float[32]. */
__device__ __forceinline__ float pln_block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = pln_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return pln_warp_sum(v);
}
__device__ __forceinline__ float pln_block_max(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = pln_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return pln_warp_max(v);
}

/* fp16 <-> fp32 through the hardware instructions. pln_math.h's bit-exact conversions give the
 * same results (round to nearest even) and stay the reference; these are just faster. */
__device__ __forceinline__ float pln_h2f(__half h) { return __half2float(h); }
__device__ __forceinline__ __half pln_f2h(float f) { return __float2half_rn(f); }
/* The Llama MLP's gate in fp16 as transformers computes it: SiLU in fp32 rounded to fp16, times
 * up, the product rounded by the caller's store (swiglu_kernel, and the linear's SwiGLU epilogue). */
__device__ __forceinline__ float pln_swiglu_h(float g, float u) { return __half2float(__float2half_rn(pln_silu(g))) * u; }

/* 16 bytes = 8 halves, loaded and stored in one instruction (LDG/STG/LDS/STS.128). The halves
 * travel as the raw bits of a uint4: a struct of four __half2 would be copied member by member
 * (__half2 has a user-provided copy constructor), i.e. as four 32-bit loads, which
 * tests/e2e_sass.sh catches. Words hold halves 2i (low 16 bits) and 2i+1 (high). */
struct __align__(16) pln_h8 { uint4 u; };
__device__ __forceinline__ __half2 pln_u32_to_h2(unsigned w)
{
    __half2_raw r;
    r.x = (unsigned short)(w & 0xffffu);
    r.y = (unsigned short)(w >> 16);
    return __half2(r);
}
__device__ __forceinline__ unsigned pln_h2_to_u32(__half2 h)
{
    __half2_raw r = h;
    return (unsigned)r.x | ((unsigned)r.y << 16);
}
__device__ __forceinline__ void pln_h8_to_f(const pln_h8 &v, float *f)
{
    const unsigned w[4] = { v.u.x, v.u.y, v.u.z, v.u.w };
#pragma unroll
    for (int i = 0; i < 4; i++) { float2 t = __half22float2(pln_u32_to_h2(w[i])); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ pln_h8 pln_f_to_h8(const float *f)
{
    pln_h8 v;
    v.u.x = pln_h2_to_u32(__floats2half2_rn(f[0], f[1]));
    v.u.y = pln_h2_to_u32(__floats2half2_rn(f[2], f[3]));
    v.u.z = pln_h2_to_u32(__floats2half2_rn(f[4], f[5]));
    v.u.w = pln_h2_to_u32(__floats2half2_rn(f[6], f[7]));
    return v;
}
/* Streams weights once: bypass L1 allocation so activations stay cached. */
__device__ __forceinline__ int4 pln_ld_stream(const int4 *p)
{
    return __ldcs(p);
}
/* cp.async (sm_80+): 16 bytes from global straight into shared memory, no registers, bypassing L1
 * (.cg). full = false copies nothing and fills zeros (src must still be a valid address: pass a
 * clamped one). The copies a thread issued since its last commit form one group; wait<N> blocks
 * until at most N of the thread's newest groups are still in flight. Other threads' copies are
 * visible only after their wait and a __syncthreads. In the CPU harness the copies land exactly
 * at that wait, and touching the bytes before it is reported (docs/CUDA.md). */
__device__ __forceinline__ void pln_cp_async16(void *smem, const void *gmem, bool full)
{
#ifdef PLN_CUDA_EMU
    pln_emu_cp_async16(smem, gmem, full ? 16 : 0);
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(full ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void pln_cp_async_commit(void)
{
#ifdef PLN_CUDA_EMU
    pln_emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void pln_cp_async_wait(void)
{
#ifdef PLN_CUDA_EMU
    pln_emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#endif

#endif
