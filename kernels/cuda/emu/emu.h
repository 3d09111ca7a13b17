/* emu.h — the C interface of the CPU execution harness for the CUDA kernels (cuda_emu.cc):
 * the launch log and the harness's reports, for tests. Only in emulated builds (PLN_CUDA_EMU). */
#ifndef PLN_CUDA_EMU_API_H
#define PLN_CUDA_EMU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One launch as the harness saw it (direct, or replayed from a graph). */
typedef struct {
    const char *kernel;        /* the kernel as written at the launch, e.g. "gemv_kernel<false, false, 8, OT>" */
    unsigned grid[3], block[3];
    size_t smem;               /* dynamic shared memory bytes */
    int failed;                /* a harness check fired in this launch */
} pln_emu_launch_rec;

/* Launches since the last reset (the log keeps the first 65536; the count goes on). */
size_t pln_emu_launch_count(void);
/* The i-th launch since the last reset, or NULL past the end of the kept log. */
const pln_emu_launch_rec *pln_emu_launch_at(size_t i);
void pln_emu_launch_reset(void);

/* Reports (races, divergent barriers, uninitialised or out-of-range shared reads, global memory
 * out of bounds or between blocks) since the last reset; the text of the first report of the
 * latest launch that had one ("" if none). Each report also fails its launch. */
size_t pln_emu_report_count(void);
const char *pln_emu_last_report(void);
void pln_emu_report_reset(void);

/* Fault injection for the self-test: while on, __threadfence() does nothing (every kernel runs as
 * if its fences were removed), so a kernel that needs one is shown to be reported without it. */
void pln_emu_drop_fences(int on);

/* The order in which the blocks of each launch are admitted and interleaved comes from this seed
 * (default: fixed, or PLN_EMU_SEED) and the launch's number since it was set: every launch runs
 * another order, the same in every run with the same seed. */
void pln_emu_set_seed(uint64_t seed);

/* The backend's scratch (pln_cuda_scratch): a request of n bytes at p, the start of a cudaMalloc
 * block. Launches made after it (and graph replays of them) may touch only [p, p + n) of that
 * block: each request is its own exact region, whatever the allocation's size. */
void pln_emu_scratch_request(const void *p, size_t n);

/* Internal to the harness (cuda_emu.h and cuda_emu.cc): warp collective and atomic op codes. */
enum { PLN_EMU_SYNCWARP, PLN_EMU_SHFL, PLN_EMU_SHFL_UP, PLN_EMU_SHFL_DOWN, PLN_EMU_SHFL_XOR, PLN_EMU_BALLOT,
       PLN_EMU_ANY, PLN_EMU_ALL, PLN_EMU_RED_ADD, PLN_EMU_RED_MIN, PLN_EMU_RED_MAX, PLN_EMU_RED_AND,
       PLN_EMU_RED_OR, PLN_EMU_RED_XOR, PLN_EMU_MMA };
enum { PLN_EMU_AT_ADD, PLN_EMU_AT_OR, PLN_EMU_AT_AND, PLN_EMU_AT_XOR, PLN_EMU_AT_MAX, PLN_EMU_AT_MIN,
       PLN_EMU_AT_EXCH, PLN_EMU_AT_CAS, PLN_EMU_AT_UMAX, PLN_EMU_AT_UMIN };

/* What the harness cannot run, for test output: cuBLASLt and NCCL. */
const char *pln_emu_not_exercised(void);

#ifdef __cplusplus
}
#endif

#endif
