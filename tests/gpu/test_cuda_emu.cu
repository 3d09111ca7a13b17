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

#include <sys/wait.h>

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

/* D = A·B for one m16n8k16 tile, fragments loaded as the PTX ISA lays them out. */
__global__ void mma_kernel(float *d, const __half *a, const __half *b)
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
    pln_mma16816(c, a0, a1, a2, a3, b0, b1);
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
    PLN_LAUNCH(1, 32, 0, st, mma_kernel)(dd, da, db);
    expect("mma.m16n8k16", NULL);
    float D[128];
    cudaMemcpy(D, dd, sizeof D, cudaMemcpyDeviceToHost);
    int bm = 0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float s = 1.0f;
            for (int k = 0; k < 16; k++) s += A[r * 16 + k] * B[k * 8 + n];
            bm += fabsf(D[r * 8 + n] - s) > 1e-4f;
        }
    CHECK(bm == 0, "mma: %d of 128 outputs differ from the plain product", bm);

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
