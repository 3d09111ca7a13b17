/* test_cuda_emu.cu — the CPU execution harness checking itself (kernels/cuda/emu): deliberately
 * broken tiny kernels, each of which must make its launch fail with the right report, next to
 * their fixed versions, which must pass and compute the right values; warp collectives (a
 * butterfly sum, ballot, a shuffle reading its partner's updated value, the m16n8k16 mma against
 * a plain matrix product); graph capture and replay; the launch log.
 * Built only into the emulated build: $(BUILD)/emu/tests-gpu/test_cuda_emu. */
#include "tests/test.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/emu/emu.h"
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <sys/wait.h>
#include <vector>

#define FULL 0xffffffffu
#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif

/* ---- kernels ------------------------------------------------------------------------------------ */
/* Each thread writes its slot and reads its neighbour's: across warps, a race without the barrier. */
__global__ void neighbour_kernel(int *out, int barrier)
{
    __shared__ int s[64];
    s[threadIdx.x] = (int)threadIdx.x * 10;
    if (barrier) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

/* One warp: ordered by __syncwarp, a race without it (independent thread scheduling). */
__global__ void warp_neighbour_kernel(int *out, int sync)
{
    __shared__ int w[32];
    w[threadIdx.x] = (int)threadIdx.x + 1;
    if (sync) __syncwarp();
    out[threadIdx.x] = w[(threadIdx.x + 1) % 32];
}

/* Write after read: thread 0 reads s[1], then thread 1 overwrites it with no barrier between. */
__global__ void war_kernel(int *out, int barrier)
{
    __shared__ int s[64];
    s[threadIdx.x] = 1;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s[40];
    if (barrier) __syncthreads();
    if (threadIdx.x == 40) s[40] = 2;
    __syncthreads();
    out[threadIdx.x + 1] = s[threadIdx.x];
}

/* Only some threads reach the barrier. */
__global__ void divergent_kernel(int *out)
{
    __shared__ int s[64];
    if (threadIdx.x < 16) {
        s[threadIdx.x] = 1;
        __syncthreads();
        out[threadIdx.x] = s[threadIdx.x];
    }
}

/* Every thread reaches a barrier, but not the same one. */
__global__ void two_sites_kernel(int *out)
{
    if (threadIdx.x < 32) {
        __syncthreads();
        out[threadIdx.x] = 1;
    } else {
        __syncthreads();
        out[threadIdx.x] = 2;
    }
}

/* Reads a shared slot nobody wrote in this block. */
__global__ void uninit_kernel(float *out, int all)
{
    __shared__ float u[64];
    if (all || threadIdx.x == 0) u[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = u[threadIdx.x];
}

/* Dynamic shared memory of the launch's smem bytes; past it is an overflow. */
__global__ void dynamic_kernel(float *out, int n)
{
    PLN_DYNAMIC_SHARED(float, d);
    if ((int)threadIdx.x < n) d[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if ((int)threadIdx.x < n) out[threadIdx.x] = d[n - 1 - threadIdx.x];
}

/* Static shared: an index one past the array (ASan's redzones in the SANITIZE build). */
__global__ void static_overflow_kernel(float *out, int n)
{
    __shared__ float a[64];
    __shared__ float b[64];
    a[threadIdx.x] = 1.0f;
    b[threadIdx.x] = 2.0f;
    __syncthreads();
    const float *p = a;   /* through a pointer, as kernels index: no compile-time bound to check */
    out[threadIdx.x] = p[threadIdx.x + n] + b[threadIdx.x];
}

/* A collective one lane never joins. */
__global__ void deadlock_kernel(int *out)
{
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_sync(FULL, (int)threadIdx.x, 0);
}

__global__ void collectives_kernel(float *sum, unsigned *ballot, int *partner, float *bsum)
{
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31;
    sum[threadIdx.x] = pln_warp_sum((float)lane);                    /* butterfly: 0 + .. + 31 */
    ballot[threadIdx.x] = __ballot_sync(FULL, lane % 3 == 0);
    int v = lane;
    v = __shfl_xor_sync(FULL, v, 1);                                   /* the partner's lane */
    v += 100;                                                          /* then each updates its copy */
    partner[threadIdx.x] = __shfl_xor_sync(FULL, v, 1);                /* own lane + 100: the update */
    bsum[threadIdx.x] = pln_block_sum((float)threadIdx.x, scratch);  /* over the block */
}

/* The other shuffles and votes, with CUDA's edge rules (out of range: the lane's own value). */
__global__ void shuffles_kernel(int *up, int *down, int *w8, unsigned *red, int *anyall)
{
    const int lane = threadIdx.x & 31;
    up[threadIdx.x] = __shfl_up_sync(FULL, lane, 3);
    down[threadIdx.x] = __shfl_down_sync(FULL, lane, 5);
    w8[threadIdx.x] = __shfl_sync(FULL, lane, 2, 8);
    red[threadIdx.x] = __reduce_add_sync(FULL, (unsigned)lane);
    anyall[threadIdx.x] = __any_sync(FULL, lane == 7) * 2 + __all_sync(FULL, lane < 31);
}

/* The mma's PTX text with a1 and a2 swapped in the A group (what nvcc would assemble if mma.cuh
 * said so), with B's two registers where A's four belong, and another variant. */
#define MMA_PTX_SWAPPED "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%6,%5,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#define MMA_PTX_AB "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%8,%9}, {%4,%5,%6,%7}, {%0,%1,%2,%3};\n"
#define MMA_PTX_ROWROW "mma.sync.aligned.m16n8k16.row.row.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"

/* D = A·B for one m16n8k16 tile, fragments loaded as the PTX ISA lays them out; variant 0 through
 * mma.cuh's pln_mma16816, 1-3 with the texts above. */
__global__ void mma_kernel(float *d, const __half *a, const __half *b, int variant)
{
    const int lane = threadIdx.x, g = lane >> 2, q = lane & 3;
    auto pack = [](__half lo, __half hi) {
        return (uint32_t)__half_as_ushort(lo) | (uint32_t)__half_as_ushort(hi) << 16;
    };
    uint32_t a0 = pack(a[g * 16 + 2 * q], a[g * 16 + 2 * q + 1]);
    uint32_t a1 = pack(a[(g + 8) * 16 + 2 * q], a[(g + 8) * 16 + 2 * q + 1]);
    uint32_t a2 = pack(a[g * 16 + 2 * q + 8], a[g * 16 + 2 * q + 9]);
    uint32_t a3 = pack(a[(g + 8) * 16 + 2 * q + 8], a[(g + 8) * 16 + 2 * q + 9]);
    uint32_t b0 = pack(b[(2 * q) * 8 + g], b[(2 * q + 1) * 8 + g]);
    uint32_t b1 = pack(b[(2 * q + 8) * 8 + g], b[(2 * q + 9) * 8 + g]);
    float c[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const uint32_t in[6] = {a0, a1, a2, a3, b0, b1};
    if (variant == 0) pln_mma16816(c, a0, a1, a2, a3, b0, b1);
    else if (variant == 1) PLN_MMA_EXEC(MMA_PTX_SWAPPED, c, in);
    else if (variant == 2) PLN_MMA_EXEC(MMA_PTX_AB, c, in);
    else PLN_MMA_EXEC(MMA_PTX_ROWROW, c, in);
    d[g * 8 + 2 * q] = c[0];
    d[g * 8 + 2 * q + 1] = c[1];
    d[(g + 8) * 8 + 2 * q] = c[2];
    d[(g + 8) * 8 + 2 * q + 1] = c[3];
}

__global__ void add_kernel(int *x, int v)
{
    x[threadIdx.x] += v;
}

/* Programmatic dependent launch: a producer, and consumers that read its output before or after
 * griddepcontrol.wait (pln_pdl_wait). */
__global__ void pdl_producer_kernel(int *x, int v)
{
    pln_pdl_wait();
    pln_pdl_trigger();
    x[threadIdx.x] = v + (int)threadIdx.x;
}
/* mode 0: reads x before its wait (broken); 1: after; 2: writes x before its wait (broken);
 * 3: only thread 0 waits, the others are ordered after it by __syncthreads */
__global__ void pdl_consumer_kernel(int *out, int *x, const int *w, int mode)
{
    const int a = w[threadIdx.x];   /* a parameter no kernel writes: fine before the wait */
    int b = 0;
    if (mode == 0) b = x[threadIdx.x];
    if (mode == 2) x[threadIdx.x] = 0;
    if (mode != 3 || threadIdx.x == 0) pln_pdl_wait();
    if (mode == 3) __syncthreads();
    if (mode != 0) b = x[threadIdx.x];
    out[threadIdx.x] = a + b;
}
/* Lets its dependents start before it waited itself: they may then overlap its predecessor too. */
__global__ void pdl_early_trigger_kernel(int *y)
{
    pln_pdl_trigger();
    pln_pdl_wait();
    y[threadIdx.x] = 1;
}

/* cp.async: each thread copies two 16-byte rows into shared memory in two commit groups (the
 * second zero-filled for odd threads). mode 0: wait for both, __syncthreads, read the neighbour's
 * slots (correct); 1: read its own first slot without any wait (still in flight); 2: wait, but
 * read the neighbour's slot with no __syncthreads (a race with the neighbour's landing copy);
 * 3: wait<1> and read the second group's slot (the newest group may still be in flight); 4: wait<1>
 * and read its own first-group slot (landed: correct). */
__global__ void cp_async_kernel(int *out, const int4 *src, int mode)
{
    __shared__ __align__(16) int4 s[2][64];
    const int i = (int)threadIdx.x;
    pln_cp_async16(&s[0][i], src + i, true);
    pln_cp_async_commit();
    pln_cp_async16(&s[1][i], src + 64 + i, i % 2 == 0);
    pln_cp_async_commit();
    if (mode == 1) { out[i] = s[0][i].x; return; }
    if (mode == 3 || mode == 4) {
        pln_cp_async_wait<1>();
        out[i] = mode == 3 ? s[1][i].x : s[0][i].x;
        return;
    }
    pln_cp_async_wait<0>();
    if (mode != 2) __syncthreads();
    const int j = (i + 1) % 64;
    out[i] = s[0][j].x + s[1][j].y;
}

/* cp.async under programmatic dependent launch: the weights w (no kernel writes them) may be
 * copied before the wait, the previous kernel's output x only after it. mode 0: x copied before
 * the wait (broken); 1: after (correct). 16 threads, one 16-byte chunk of each per thread. */
__global__ void pdl_cp_async_kernel(int *out, const int *x, const int *w, int mode)
{
    __shared__ __align__(16) int4 s[2][16];
    const int i = (int)threadIdx.x;
    pln_cp_async16(&s[0][i], (const int4 *)w + i, true);
    if (mode == 0) pln_cp_async16(&s[1][i], (const int4 *)x + i, true);
    pln_pdl_wait();
    if (mode == 1) pln_cp_async16(&s[1][i], (const int4 *)x + i, true);
    pln_cp_async_commit();
    pln_cp_async_wait<0>();
    const int *a = (const int *)&s[0][i], *b = (const int *)&s[1][i];
#pragma unroll
    for (int j = 0; j < 4; j++) out[4 * i + j] = a[j] + b[j];
}

/* ---- global memory between blocks ---------------------------------------------------------------- */
/* Each block stores its 32 slots; with overlap, block b starts at 31 b: its slot 0 is the previous
 * block's slot 31 (two blocks store the same int). */
__global__ void block_slots_kernel(int *out, int overlap)
{
    out[blockIdx.x * (overlap ? 31 : 32) + threadIdx.x] = (int)(blockIdx.x * 100 + threadIdx.x);
}

/* The split-K merge of the decode attention and the GEMV, reduced: each block stores its 64
 * partials, fences them (fence = 1), then thread 0 counts the block in; the last block to arrive
 * sums every block's partials. Without the fence the last block may read partials not yet visible. */
__global__ void split_merge_kernel(float *part, unsigned *cnt, float *out, int fence)
{
    __shared__ bool last;
    part[blockIdx.x * 64 + threadIdx.x] = (float)(blockIdx.x + 1) * (float)threadIdx.x;
    if (fence) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == gridDim.x - 1;
        if (last) atomicExch(cnt, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float v = 0.0f;
    for (unsigned b = 0; b < gridDim.x; b++) v += __ldcg(part + b * 64 + threadIdx.x);
    out[threadIdx.x] = v;
}

/* A top-k in the backend's layout (sample.cu: one block per row, the row's k candidate ids in
 * global scratch at cand + row * k, the scratch request ending with the last row's). Thread 0
 * picks the k largest by repeated selection (ties: the lower id), then the block writes each
 * candidate's value. broken = 1 also stores the end marker -1 after the k ids: one int into the
 * next row's candidates, and 4 bytes past the request for the last row; broken = 2 only the
 * former (every row but the last). */
__global__ void scratch_topk_kernel(const float *x, int n, int k, int32_t *cand, float *vals, int broken)
{
    const float *r = x + (int64_t)blockIdx.x * n;
    int32_t *c = cand + (int64_t)blockIdx.x * k;
    if (threadIdx.x == 0) {
        for (int i = 0; i < k; i++) {
            int best = -1;
            for (int j = 0; j < n; j++) {
                bool taken = false;
                for (int p = 0; p < i; p++) taken |= c[p] == j;
                if (!taken && (best < 0 || r[j] > r[best])) best = j;
            }
            c[i] = best;
        }
        if (broken == 1 || (broken == 2 && blockIdx.x + 1 < gridDim.x)) c[k] = -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += blockDim.x) vals[(int64_t)blockIdx.x * k + i] = r[c[i]];
}

/* Two blocks each count themselves in, pass a barrier, then read the other's count: whether the
 * other block has started yet depends only on how the harness interleaves them. */
__global__ void interleave_kernel(unsigned *flags, unsigned *seen)
{
    if (threadIdx.x == 0) atomicAdd(&flags[blockIdx.x], 1u);
    __syncthreads();
    if (threadIdx.x == 0) seen[blockIdx.x] = atomicAdd(&flags[1 - blockIdx.x], 0u);
}

/* Threads below n store out[threadIdx.x]; before: thread 0 also stores out[-1]. */
__global__ void global_edge_kernel(int *out, int n, int before)
{
    if (before && threadIdx.x == 0) out[-1] = 0;
    if ((int)threadIdx.x < n) out[threadIdx.x] = 1;
}

/* ---- checks -------------------------------------------------------------------------------------- */
/* Expects the last launch to have failed with a report containing `what` (NULL: to have passed). */
static void expect(const char *name, const char *what)
{
    cudaError_t e = cudaGetLastError();
    const char *rep = pln_emu_last_report();
    if (!what) {
        CHECK(e == cudaSuccess, "%s: expected a clean launch, got %s: %s", name, cudaGetErrorName(e), rep);
    } else {
        CHECK(e != cudaSuccess && strstr(rep, what) != NULL, "%s: expected a failed launch reporting \"%s\", got %s: %s",
              name, what, cudaGetErrorName(e), rep);
        CHECK(strstr(cudaGetErrorString(e), what) != NULL, "%s: the error string carries the report: %s", name,
              cudaGetErrorString(e));
    }
    printf("%-36s %s\n", name, (what ? e != cudaSuccess && strstr(rep, what) : e == cudaSuccess) ? "OK" : "NOT OK");
    pln_emu_report_reset();
}

template <typename T> static T *dev(size_t n)
{
    void *p = nullptr;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(2); }
    cudaMemset(p, 0, n * sizeof(T));
    return (T *)p;
}

/* The backend's flash-decoding attention (attention.cu, 4 key splits, one sequence of 70 keys, two
 * heads of 64) with the harness dropping every __threadfence(): the last split reads the others'
 * partial states unfenced. With the fences: no report, and the output equals the unsplit kernel's. */
static void check_decode_attention_fence(void)
{
    const int pdl = pln_cuda_pdl;   /* the backend turns programmatic dependent launch on (sm_90) */
    pln_backend *be = pln_backend_cuda_create(0);
    CHECK(be != NULL, "cuda backend on the harness: %s", pln_error());
    if (!be) return;
    const int nh = 2, D = 64, bs = 16, ctx = 70, nblk = (ctx + bs) / bs;
    const size_t cache = (size_t)nblk * nh * bs * D;
    std::vector<__half> hk(cache), hv(cache), hq((size_t)nh * 3 * D);
    uint32_t r = 12345;
    auto rnd = [&r]() { r = r * 1664525u + 1013904223u; return (float)((r >> 9) & 0x3fff) / 8192.0f - 1.0f; };
    for (size_t i = 0; i < cache; i++) { hk[i] = __float2half(rnd()); hv[i] = __float2half(rnd()); }
    for (auto &q : hq) q = __float2half(rnd());
    int32_t bt[8], seq = 0, pos = ctx;
    for (int i = 0; i < nblk; i++) bt[i] = nblk - 1 - i;   /* scattered */
    float slopes[2] = {0.5f, 0.25f};
    auto upl = [be](const void *h, size_t n) { void *d = be->alloc(be, n); be->upload(be, d, h, n); return d; };
    void *kc = upl(hk.data(), cache * 2), *vc = upl(hv.data(), cache * 2), *qkv = upl(hq.data(), hq.size() * 2);
    void *dbt = upl(bt, sizeof bt), *dseq = upl(&seq, 4), *dpos = upl(&pos, 4), *dsl = upl(slopes, sizeof slopes);
    void *o1 = be->alloc(be, (size_t)nh * D * 2), *o4 = be->alloc(be, (size_t)nh * D * 2);
    pln_attn_meta m = {1, 1, bs, nblk, ctx + 1, (const int32_t *)dseq, (const int32_t *)dpos, (const int32_t *)dbt, 0, 0};
    int old = pln_cuda_set_attn_splits(be, 1);
    CHECK(be->attention(be, o1, qkv, kc, vc, &m, (const float *)dsl, nh, D) == 0, "decode attention, 1 split: %s", pln_error());
    pln_cuda_set_attn_splits(be, 4);
    CHECK(be->attention(be, o4, qkv, kc, vc, &m, (const float *)dsl, nh, D) == 0, "decode attention, 4 splits: %s", pln_error());
    expect("decode attention, 4 splits, fenced", NULL);
    std::vector<__half> h1((size_t)nh * D), h4((size_t)nh * D);
    be->download(be, h1.data(), o1, h1.size() * 2);
    be->download(be, h4.data(), o4, h4.size() * 2);
    int bad = 0;
    for (size_t i = 0; i < h1.size(); i++) bad += fabsf(__half2float(h1[i]) - __half2float(h4[i])) > 2e-3f;
    CHECK(bad == 0, "decode attention: 4 splits differ from 1 in %d of %zu outputs", bad, h1.size());
    pln_emu_drop_fences(1);
    const int rc = be->attention(be, o4, qkv, kc, vc, &m, (const float *)dsl, nh, D);
    pln_emu_drop_fences(0);
    /* the op returns -1 and has taken the launch error: the report is the proof */
    const bool caught = rc != 0 && strstr(pln_emu_last_report(), "attn_decode_kernel") &&
                        strstr(pln_emu_last_report(), "no __threadfence() after the store");
    CHECK(caught, "decode attention without its fences: rc %d, report: %s", rc, pln_emu_last_report());
    printf("%-36s %s\n", "decode attention, fences removed", caught ? "OK" : "NOT OK");
    pln_emu_report_reset();
    pln_cuda_set_attn_splits(be, old);
    for (void *p : {kc, vc, qkv, dbt, dseq, dpos, dsl, o1, o4}) be->free(be, p);
    be->destroy(be);
    pln_cuda_pdl = pdl;
}

/* The top-k kernel's candidates in the backend's scratch, laid out as pln_cuda_topk does: the
 * request ends with the last row's candidates. */
static void check_scratch_topk(void)
{
    const int pdl = pln_cuda_pdl;
    pln_backend *be = pln_backend_cuda_create(0);
    CHECK(be != NULL, "cuda backend on the harness: %s", pln_error());
    if (!be) return;
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    pln_cuda_pdl = 0;   /* the kernel here has no griddepcontrol.wait: plain launches */
    const int n = 50, k = 5;
    for (int S = 3; S >= 1; S -= 2) {
        std::vector<float> hx((size_t)S * n);
        for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((i * 37) % 101);
        float *x = (float *)be->alloc(be, hx.size() * 4), *vals = (float *)be->alloc(be, (size_t)S * k * 4);
        be->upload(be, x, hx.data(), hx.size() * 4);
        for (int broken = 0; broken < (S > 1 ? 3 : 2); broken++) {
            const size_t packed = (size_t)S * k * 8 + (size_t)S * 8;   /* what precedes the candidates in sample.cu */
            char *w = (char *)pln_cuda_scratch(c, pln_align_up(packed, 256) + (size_t)S * k * 4);
            CHECK(w != NULL, "scratch: %s", pln_error());
            int32_t *cand = (int32_t *)(w + pln_align_up(packed, 256));
            PLN_LAUNCH(S, 32, 0, (cudaStream_t)pln_cuda_stream(be), scratch_topk_kernel)(x, n, k, cand, vals, broken);
            char name[96];
            snprintf(name, sizeof name, "top-k in scratch, %d row%s%s", S, S > 1 ? "s" : "",
                     broken == 1 ? ", k+1 ids" : broken == 2 ? ", k+1 ids but the last" : "");
            /* one row: past the end of the scratch request, inside the allocation (it holds more);
             * several rows: a row's extra id lands on the next row's first (two blocks store it),
             * and the last row's past the request: which is seen first depends on the blocks' order */
            const bool oob = S == 1 || strstr(pln_emu_last_report(), "scratch request");
            expect(name, !broken ? NULL : broken == 2 || !oob ? "cross-block write race"
                                                              : S == 1 ? "of a 276-byte scratch request" : "scratch request");
            if (broken && S == 1)
                CHECK(c->scratch_size > pln_align_up(packed, 256) + (size_t)S * k * 4,
                      "the overflow stays inside the scratch allocation (%zu bytes): only the request's bounds catch it",
                      c->scratch_size);
            if (!broken) {
                std::vector<float> hv((size_t)S * k);
                be->download(be, hv.data(), vals, hv.size() * 4);
                int bad = 0;
                for (int s = 0; s < S; s++) {
                    std::vector<float> row(hx.begin() + (size_t)s * n, hx.begin() + (size_t)(s + 1) * n);
                    std::sort(row.begin(), row.end(), [](float a, float b) { return a > b; });
                    for (int i = 0; i < k; i++) bad += hv[(size_t)s * k + i] != row[i];
                }
                CHECK(bad == 0, "top-k in scratch: %d of %d values wrong", bad, S * k);
            }
        }
        be->free(be, x);
        be->free(be, vals);
    }
    be->destroy(be);
    pln_cuda_pdl = pdl;
}

int main(void)
{
    test_begin("test_cuda_emu");
    printf("%s\n", pln_emu_not_exercised());
    cudaStream_t st;
    cudaStreamCreate(&st);
    int *out = dev<int>(256);
    int h[256];

    PLN_LAUNCH(1, 64, 0, st, neighbour_kernel)(out, 0);
    expect("race across warps (no barrier)", "race (RAW)");
    PLN_LAUNCH(1, 64, 0, st, neighbour_kernel)(out, 1);
    expect("the same with __syncthreads", NULL);
    cudaMemcpy(h, out, 64 * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += h[i] != ((i + 1) % 64) * 10;
    CHECK(bad == 0, "neighbour values: %d wrong", bad);

    PLN_LAUNCH(1, 32, 0, st, warp_neighbour_kernel)(out, 0);
    expect("race inside a warp (no __syncwarp)", "race (RAW)");
    PLN_LAUNCH(1, 32, 0, st, warp_neighbour_kernel)(out, 1);
    expect("the same ordered by __syncwarp", NULL);
    cudaMemcpy(h, out, 32 * 4, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < 32; i++) bad += h[i] != (i + 1) % 32 + 1;
    CHECK(bad == 0, "warp neighbour values: %d wrong", bad);

    {
        int4 hs[128];
        for (int i = 0; i < 128; i++) hs[i] = make_int4(1000 + i, 2000 + i, 0, 0);
        int4 *src = dev<int4>(128);
        cudaMemcpy(src, hs, sizeof hs, cudaMemcpyHostToDevice);
        PLN_LAUNCH(1, 64, 0, st, cp_async_kernel)(out, src, 0);
        expect("cp.async: wait_group, barrier, read", NULL);
        cudaMemcpy(h, out, 64 * 4, cudaMemcpyDeviceToHost);
        bad = 0;
        for (int i = 0; i < 64; i++) {
            const int j = (i + 1) % 64;
            bad += h[i] != 1000 + j + (j % 2 == 0 ? 2000 + 64 + j : 0);
        }
        CHECK(bad == 0, "cp.async values (odd rows zero-filled): %d wrong", bad);
        PLN_LAUNCH(1, 64, 0, st, cp_async_kernel)(out, src, 1);
        expect("cp.async: read before any wait", "while a cp.async of thread");
        PLN_LAUNCH(1, 64, 0, st, cp_async_kernel)(out, src, 2);
        expect("cp.async: waited, no __syncthreads", "race (RAW)");
        PLN_LAUNCH(1, 64, 0, st, cp_async_kernel)(out, src, 3);
        expect("cp.async: wait<1> leaves the newest group", "in flight");
        PLN_LAUNCH(1, 64, 0, st, cp_async_kernel)(out, src, 4);
        expect("cp.async: wait<1> lands the older group", NULL);
        cudaMemcpy(h, out, 64 * 4, cudaMemcpyDeviceToHost);
        bad = 0;
        for (int i = 0; i < 64; i++) bad += h[i] != 1000 + i;
        CHECK(bad == 0, "cp.async wait<1> values: %d wrong", bad);
        cudaFree(src);
    }

    /* global memory between blocks: one int stored by two blocks; a split-K merge with and
     * without its fence; the backend's decode attention with its fences removed */
    {
        int *g = dev<int>(256);
        PLN_LAUNCH(4, 32, 0, st, block_slots_kernel)(g, 0);
        expect("blocks store disjoint slots", NULL);
        cudaMemcpy(h, g, 128 * 4, cudaMemcpyDeviceToHost);
        bad = 0;
        for (int i = 0; i < 128; i++) bad += h[i] != (i / 32) * 100 + i % 32;
        CHECK(bad == 0, "block slots: %d wrong", bad);
        PLN_LAUNCH(4, 32, 0, st, block_slots_kernel)(g, 1);
        CHECK(strstr(pln_emu_last_report(), "byte 124 of a 1024-byte device buffer that block (0,0,0)") ||
                  strstr(pln_emu_last_report(), "byte 124 of a 1024-byte device buffer that block (1,0,0)") ||
                  strstr(pln_emu_last_report(), "of a 1024-byte device buffer that block (2,0,0)") ||
                  strstr(pln_emu_last_report(), "of a 1024-byte device buffer that block (3,0,0)"),
              "the race names the buffer and the other block: %s", pln_emu_last_report());
        expect("two blocks store one int", "cross-block write race");
        float *part = dev<float>(8 * 64), *mo = dev<float>(64);
        unsigned *cnt = dev<unsigned>(1);
        PLN_LAUNCH(8, 64, 0, st, split_merge_kernel)(part, cnt, mo, 1);
        expect("split-K merge, fenced", NULL);
        float hm[64];
        cudaMemcpy(hm, mo, sizeof hm, cudaMemcpyDeviceToHost);
        bad = 0;
        for (int i = 0; i < 64; i++) bad += hm[i] != 36.0f * (float)i;   /* (1 + .. + 8) i */
        CHECK(bad == 0, "split-K merge values: %d wrong (out[1] %g, want 36)", bad, hm[1]);
        PLN_LAUNCH(8, 64, 0, st, split_merge_kernel)(part, cnt, mo, 0);
        expect("split-K merge without its fence", "no __threadfence() after the store");
        cudaMemset(cnt, 0, 4);   /* the failed launch's last block still zeroed it; be explicit */
        pln_emu_drop_fences(1);
        PLN_LAUNCH(8, 64, 0, st, split_merge_kernel)(part, cnt, mo, 1);
        pln_emu_drop_fences(0);
        expect("split-K merge, fences dropped", "no __threadfence() after the store");
        PLN_LAUNCH(1, 64, 0, st, global_edge_kernel)(g + 192, 64, 0);
        expect("global: up to the allocation's end", NULL);
        PLN_LAUNCH(1, 64, 0, st, global_edge_kernel)(g + 193, 64, 0);
        CHECK(strstr(pln_emu_last_report(), "writes 4 bytes at offset 1024 of a 1024-byte device allocation") != NULL,
              "the overflow names the offset and the size: %s", pln_emu_last_report());
        expect("global: one int past the end", "out of bounds");
        PLN_LAUNCH(1, 64, 0, st, global_edge_kernel)(g, 10, 1);
        expect("global: 4 bytes before the start", "at offset -4");
        /* blocks run interleaved, in an order set by the seed: over a few seeds, each of two blocks
         * is seen both before and after the other started; the same seed, the same order */
        unsigned *fl = dev<unsigned>(2), *sn = dev<unsigned>(2);
        int pattern[4] = {0, 0, 0, 0};
        unsigned first[2] = {0, 0};
        for (int seed = 1; seed <= 16; seed++) {
            pln_emu_set_seed((uint64_t)seed);
            cudaMemset(fl, 0, 8);
            PLN_LAUNCH(2, 64, 0, st, interleave_kernel)(fl, sn);
            unsigned hsn[2];
            cudaMemcpy(hsn, sn, 8, cudaMemcpyDeviceToHost);
            pattern[(hsn[0] & 1) * 2 + (hsn[1] & 1)]++;
            if (seed == 1) { first[0] = hsn[0]; first[1] = hsn[1]; }
        }
        pln_emu_set_seed(1);
        cudaMemset(fl, 0, 8);
        PLN_LAUNCH(2, 64, 0, st, interleave_kernel)(fl, sn);
        unsigned again[2];
        cudaMemcpy(again, sn, 8, cudaMemcpyDeviceToHost);
        const int kinds = (pattern[0] > 0) + (pattern[1] > 0) + (pattern[2] > 0) + (pattern[3] > 0);
        CHECK(pattern[0] == 0, "a block saw the other not started while the other saw it not started either");
        CHECK(kinds >= 2 && pattern[3] > 0, "16 seeds gave %d orders (before/after: %d %d %d): blocks not interleaved",
              kinds, pattern[1], pattern[2], pattern[3]);
        CHECK(again[0] == first[0] && again[1] == first[1], "seed 1 twice: %u %u then %u %u", first[0], first[1],
              again[0], again[1]);
        printf("%-36s %s (one first: %d, other first: %d, both at once: %d of 16)\n", "blocks interleaved by seed",
               kinds >= 2 && pattern[3] > 0 ? "OK" : "NOT OK", pattern[1], pattern[2], pattern[3]);
        pln_emu_report_reset();
        cudaFree(fl); cudaFree(sn);
        cudaFree(g); cudaFree(part); cudaFree(mo); cudaFree(cnt);
        check_decode_attention_fence();
        check_scratch_topk();
    }

    PLN_LAUNCH(1, 64, 0, st, war_kernel)(out, 0);
    expect("write after read (no barrier)", "race (WAR)");
    PLN_LAUNCH(1, 64, 0, st, war_kernel)(out, 1);
    expect("the same with __syncthreads", NULL);

    PLN_LAUNCH(1, 64, 0, st, divergent_kernel)(out);
    expect("__syncthreads under a branch", "divergent barrier: thread 16 exited");
    PLN_LAUNCH(1, 64, 0, st, two_sites_kernel)(out);
    expect("two different __syncthreads", "divergent barrier: thread 0 waits at __syncthreads");

    float *fo = dev<float>(256);
    PLN_LAUNCH(1, 64, 0, st, uninit_kernel)(fo, 0);
    expect("read of unwritten shared memory", "never written in this block");
    PLN_LAUNCH(1, 64, 0, st, uninit_kernel)(fo, 1);
    expect("the same, all written", NULL);

    PLN_LAUNCH(1, 64, 64 * 4, st, dynamic_kernel)(fo, 64);
    expect("dynamic shared within smem", NULL);
    float hf[256];
    cudaMemcpy(hf, fo, 64 * 4, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < 64; i++) bad += hf[i] != (float)(63 - i);
    CHECK(bad == 0, "dynamic shared values: %d wrong", bad);
    PLN_LAUNCH(1, 64, 60 * 4, st, dynamic_kernel)(fo, 64);
    expect("dynamic shared past smem", "dynamic shared memory overflow");

    PLN_LAUNCH(1, 64, 0, st, static_overflow_kernel)(fo, 0);
    expect("static shared within bounds", NULL);
#ifdef HAVE_ASAN
    {   /* ASan aborts the process: in a child, its report on a pipe */
        int pfd[2];
        CHECK(pipe(pfd) == 0, "pipe");
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(pfd[1], 2);
            PLN_LAUNCH(1, 64, 0, st, static_overflow_kernel)(fo, 1);
            _exit(0);
        }
        close(pfd[1]);
        char buf[8192];
        size_t got = 0;
        ssize_t r;
        while (got < sizeof buf - 1 && (r = read(pfd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
        buf[got] = 0;
        close(pfd[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        bool caught = !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && strstr(buf, "global-buffer-overflow");
        printf("%-36s %s\n", "static shared past its array (ASan)", caught ? "OK" : "NOT OK");
        CHECK(caught, "static shared overflow: expected ASan's global-buffer-overflow, got status %d: %.300s", status, buf);
    }
#else
    printf("%-36s %s\n", "static shared past its array", "SKIP (an ASan check: make SANITIZE=address test)");
#endif

    PLN_LAUNCH(1, 32, 0, st, deadlock_kernel)(out);
    expect("shuffle a lane never joins", "deadlock");

    PLN_LAUNCH(1, 2000, 0, st, add_kernel)(out, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "2000 threads per block is an invalid configuration");
    pln_emu_report_reset();

    /* warp collectives */
    float *sum = dev<float>(128), *bsum = dev<float>(128);
    unsigned *bal = dev<unsigned>(128);
    int *par = dev<int>(128);
    PLN_LAUNCH(1, 128, 0, st, collectives_kernel)(sum, bal, par, bsum);
    expect("collectives", NULL);
    float hs[128], hb[128];
    unsigned hbal[128];
    int hp[128];
    cudaMemcpy(hs, sum, sizeof hs, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, bsum, sizeof hb, cudaMemcpyDeviceToHost);
    cudaMemcpy(hbal, bal, sizeof hbal, cudaMemcpyDeviceToHost);
    cudaMemcpy(hp, par, sizeof hp, cudaMemcpyDeviceToHost);
    unsigned want_ballot = 0;
    for (int l = 0; l < 32; l++) if (l % 3 == 0) want_ballot |= 1u << l;
    int bs = 0, bb = 0, bp = 0, bbs = 0;
    for (int i = 0; i < 128; i++) {
        bs += hs[i] != 496.0f;
        bb += hbal[i] != want_ballot;
        bp += hp[i] != (i & 31) + 100;
        bbs += hb[i] != 8128.0f;
    }
    printf("%-36s %s\n", "butterfly sum, ballot, partner update", bs + bb + bp + bbs == 0 ? "OK" : "NOT OK");
    CHECK(bs == 0, "warp butterfly sum: %d lanes not 496 (lane 0: %g)", bs, hs[0]);
    CHECK(bb == 0, "ballot: %d lanes wrong (lane 0: 0x%08x, want 0x%08x)", bb, hbal[0], want_ballot);
    CHECK(bp == 0, "shuffle after the partner's update: %d lanes wrong (lane 0: %d)", bp, hp[0]);
    CHECK(bbs == 0, "block sum: %d threads not 8128 (thread 0: %g)", bbs, hb[0]);

    int *sup = dev<int>(64), *sdown = dev<int>(64), *sw8 = dev<int>(64), *sany = dev<int>(64);
    unsigned *sred = dev<unsigned>(64);
    PLN_LAUNCH(1, 64, 0, st, shuffles_kernel)(sup, sdown, sw8, sred, sany);
    expect("shuffle up/down/width, reduce, any/all", NULL);
    int hu[64], hd[64], hw[64], ha8[64];
    unsigned hr[64];
    cudaMemcpy(hu, sup, sizeof hu, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd, sdown, sizeof hd, cudaMemcpyDeviceToHost);
    cudaMemcpy(hw, sw8, sizeof hw, cudaMemcpyDeviceToHost);
    cudaMemcpy(ha8, sany, sizeof ha8, cudaMemcpyDeviceToHost);
    cudaMemcpy(hr, sred, sizeof hr, cudaMemcpyDeviceToHost);
    int bsh = 0;
    for (int i = 0; i < 64; i++) {
        const int l = i & 31;
        bsh += hu[i] != (l >= 3 ? l - 3 : l);
        bsh += hd[i] != (l + 5 < 32 ? l + 5 : l);
        bsh += hw[i] != (l & ~7) + 2;
        bsh += hr[i] != 496u;
        bsh += ha8[i] != 2;
    }
    CHECK(bsh == 0, "shuffle up/down/width, reduce, any/all: %d values wrong (lane 1: up %d down %d w8 %d red %u any/all %d)",
          bsh, hu[1], hd[1], hw[1], hr[1], ha8[1]);
    cudaFree(sup); cudaFree(sdown); cudaFree(sw8); cudaFree(sany); cudaFree(sred);

    /* mma.m16n8k16 against the plain product */
    __half ha[256], hbm[128];
    float A[256], B[128];
    for (int i = 0; i < 256; i++) { A[i] = (float)((i * 7) % 11 - 5) * 0.25f; ha[i] = __float2half(A[i]); }
    for (int i = 0; i < 128; i++) { B[i] = (float)((i * 5) % 9 - 4) * 0.5f; hbm[i] = __float2half(B[i]); }
    __half *da = dev<__half>(256), *db = dev<__half>(128);
    float *dd = dev<float>(128);
    cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hbm, sizeof hbm, cudaMemcpyHostToDevice);
    auto mma_wrong = [&]() {
        float D[128];
        cudaMemcpy(D, dd, sizeof D, cudaMemcpyDeviceToHost);
        int wrong = 0;
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                float s = 1.0f;
                for (int k = 0; k < 16; k++) s += A[r * 16 + k] * B[k * 8 + n];
                wrong += fabsf(D[r * 8 + n] - s) > 1e-4f;
            }
        return wrong;
    };
    PLN_LAUNCH(1, 32, 0, st, mma_kernel)(dd, da, db, 0);
    expect("mma.m16n8k16", NULL);
    int bm = mma_wrong();
    CHECK(bm == 0, "mma: %d of 128 outputs differ from the plain product", bm);
    /* the harness computes what the text says: a1/a2 swapped in the PTX gives another product,
     * which the same check catches */
    PLN_LAUNCH(1, 32, 0, st, mma_kernel)(dd, da, db, 1);
    expect("mma with a1, a2 swapped in the PTX", NULL);
    bm = mma_wrong();
    CHECK(bm >= 64, "mma with swapped A registers: only %d of 128 outputs differ from the plain product", bm);
    printf("%-36s %s\n", "  ... and its product is wrong", bm >= 64 ? "OK" : "NOT OK");
    PLN_LAUNCH(1, 32, 0, st, mma_kernel)(dd, da, db, 2);
    expect("mma with B's registers as A", "A has 2 registers");
    PLN_LAUNCH(1, 32, 0, st, mma_kernel)(dd, da, db, 3);
    expect("mma .row.row (not implemented)", "unsupported instruction");

    /* graph capture: nothing runs while capturing; replays run the launches and copies in order */
    int *x = dev<int>(32);
    pln_emu_launch_reset();
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    PLN_LAUNCH(1, 32, 0, st, add_kernel)(x, 1);
    cudaMemcpyAsync(x + 16, x, 4, cudaMemcpyDeviceToDevice, st);
    PLN_LAUNCH(1, 32, 0, st, add_kernel)(x, 2);
    cudaGraph_t g;
    cudaStreamEndCapture(st, &g);
    cudaMemcpy(h, x, 32 * 4, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 0 && pln_emu_launch_count() == 0, "capture ran something: x[0] = %d, %zu launches", h[0],
          pln_emu_launch_count());
    cudaGraphExec_t ge;
    CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(ge, st) == cudaSuccess, "graph launch");
    cudaMemcpy(h, x, 32 * 4, cudaMemcpyDeviceToHost);
    /* x[16] is overwritten by the copy (x[0] after its +1 in that replay: 1, 4, 7), then +2 */
    CHECK(h[0] == 9 && h[1] == 9 && h[16] == 9, "3 replays of +1, copy, +2: x[0] %d x[1] %d x[16] %d (want 9 9 9)", h[0],
          h[1], h[16]);
    CHECK(pln_emu_launch_count() == 6, "launch log: %zu launches, want 6", pln_emu_launch_count());
    const pln_emu_launch_rec *rec = pln_emu_launch_at(0);
    CHECK(rec && !strcmp(rec->kernel, "add_kernel") && rec->block[0] == 32 && rec->grid[0] == 1,
          "launch log entry: %s block %u", rec ? rec->kernel : "(none)", rec ? rec->block[0] : 0);
    /* an update in place: the same topology, another value */
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    PLN_LAUNCH(1, 32, 0, st, add_kernel)(x, 10);
    cudaGraph_t g2;
    cudaStreamEndCapture(st, &g2);
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(ge, g2, &info) == cudaSuccess, "graph update");
    cudaGraphLaunch(ge, st);
    cudaMemcpy(h, x, 32 * 4, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 19, "updated graph: x[0] %d, want 19", h[0]);
    printf("%-36s %s\n", "graph capture, replay, update", h[0] == 19 ? "OK" : "NOT OK");
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaGraphDestroy(g2);
    /* a failing kernel inside a replay fails the launch of the graph */
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    PLN_LAUNCH(1, 64, 0, st, neighbour_kernel)(out, 0);
    cudaStreamEndCapture(st, &g);
    cudaGraphInstantiate(&ge, g, 0);
    CHECK(cudaGraphLaunch(ge, st) == cudaErrorLaunchFailure, "a racy kernel in a graph fails cudaGraphLaunch");
    cudaGetLastError();
    pln_emu_report_reset();
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    /* programmatic dependent launch: a read of the previous kernel's output before the wait is
     * reported even though the harness ran that kernel to its end first */
    int *px = dev<int>(64), *pw = dev<int>(64), *po = dev<int>(64), *py = dev<int>(64);
    int pwh[64];
    for (int i = 0; i < 64; i++) pwh[i] = 1000 * i;
    cudaMemcpy(pw, pwh, sizeof pwh, cudaMemcpyHostToDevice);
    pln_cuda_pdl = 1;
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    expect("pdl: producer", NULL);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    CHECK(strstr(pln_emu_last_report(), "thread 0 reads 4 bytes") && strstr(pln_emu_last_report(), "pdl_producer_kernel"),
          "pdl report names the access and the producer: %s", pln_emu_last_report());
    expect("pdl: read before griddepcontrol.wait", "before griddepcontrol.wait");
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 2);
    expect("pdl: write before griddepcontrol.wait", "writes 4 bytes");
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 1);
    expect("pdl: read after the wait", NULL);
    /* what a consumer that waited computes: its weight plus the producer's output */
    auto pdl_values = [&](const char *what) {
        int ho[64], bad = 0;
        cudaMemcpy(ho, po, sizeof ho, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 64; i++) bad += ho[i] != 1000 * i + 7 + i;
        CHECK(bad == 0, "%s: %d of 64 values wrong (out[1] %d, want 1008)", what, bad, ho[1]);
    };
    pdl_values("pdl consumer after its wait");
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 3);
    expect("pdl: one thread waits, a barrier orders", NULL);
    /* cp.async reads its source when issued: from the previous kernel's output only after the wait */
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 16, 0, st, pdl_cp_async_kernel)(po, px, pw, 0);
    CHECK(strstr(pln_emu_last_report(), "reads 16 bytes") && strstr(pln_emu_last_report(), "pdl_producer_kernel"),
          "pdl report names the cp.async read and the producer: %s", pln_emu_last_report());
    expect("pdl: cp.async of the output before the wait", "before griddepcontrol.wait");
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 16, 0, st, pdl_cp_async_kernel)(po, px, pw, 1);
    expect("pdl: cp.async of weights before, output after", NULL);
    pdl_values("pdl cp.async consumer");
    /* an early trigger chains: the consumer of the middle kernel may overlap the producer too */
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_early_trigger_kernel)(py);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    CHECK(strstr(pln_emu_last_report(), "kernel pdl_producer_kernel writes"), "pdl report names the writer two back: %s",
          pln_emu_last_report());
    expect("pdl: early trigger, read 2 back", "before griddepcontrol.wait");
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(py, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    expect("pdl: waited trigger, read 2 back", NULL);
    /* a copy between them: the consumer cannot overlap the producer */
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    cudaMemcpyAsync(py, pw, 4, cudaMemcpyDeviceToDevice, st);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    expect("pdl: a copy between", NULL);
    /* in a graph: the replay checks the same */
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    cudaStreamEndCapture(st, &g);
    cudaGraphInstantiate(&ge, g, 0);
    CHECK(cudaGraphLaunch(ge, st) == cudaErrorLaunchFailure, "a read before the wait in a graph fails cudaGraphLaunch");
    cudaGetLastError();
    printf("%-36s %s\n", "pdl: in a graph replay", strstr(pln_emu_last_report(), "griddepcontrol") ? "OK" : "NOT OK");
    pln_emu_report_reset();
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    /* without the attribute (sm_80, PLN_PDL=0) launches serialize: the same kernel is correct */
    pln_cuda_pdl = 0;
    PLN_LAUNCH(1, 64, 0, st, pdl_producer_kernel)(px, 7);
    PLN_LAUNCH(1, 64, 0, st, pdl_consumer_kernel)(po, px, pw, 0);
    expect("pdl off: plain launches", NULL);

    cudaFree(out); cudaFree(fo); cudaFree(sum); cudaFree(bsum); cudaFree(bal); cudaFree(par);
    cudaFree(da); cudaFree(db); cudaFree(dd); cudaFree(x); cudaFree(px); cudaFree(pw); cudaFree(po); cudaFree(py);
    cudaStreamDestroy(st);
    return test_done();
}
