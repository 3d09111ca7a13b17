/* cuda_emu.cc — the CPU execution harness for the CUDA kernels (PLN_CUDA_EMU): the runtime behind
 * cuda_emu.h. Compiled WITHOUT the sanitizer-coverage flags of the kernel files: the trace
 * callbacks below must not trace themselves.
 *
 * Execution model: the blocks of a launch run interleaved, up to KMAX at once in a seeded order
 * ("blocks of a launch, interleaved"); inside a block every thread is a fiber (own stack, x86-64
 * register switch) that runs until it reaches __syncthreads, a warp collective or its end, then
 * yields to the scheduler here. A barrier releases when every thread
 * of the block waits at it; a warp collective completes when every lane of its mask has arrived,
 * and then computes each lane's result from all lanes' inputs (a shuffle reads the partner's
 * value as it was at the collective, never a later one).
 *
 * Checks: every load and store of the kernel files calls __sanitizer_cov_load/store*
 * (-fsanitize-coverage=trace-loads,trace-stores); two compares drop addresses outside shared
 * memory. Per shared byte a shadow keeps the last writer (thread, barrier epoch, warp-sync count)
 * and its readers since, and reports
 *   - races: two threads, one writing, with no __syncthreads between them and not ordered by a
 *     warp collective both took part in;
 *   - reads of shared bytes not written in this block's run;
 *   - dynamic shared accesses past the launch's smem bytes (a red zone follows the buffer);
 *   - divergent barriers: a thread exits while others wait at __syncthreads, threads wait at
 *     different __syncthreads, or a collective that can never complete (deadlock);
 *   - programmatic dependent launch: a kernel launched with the PDL attribute may run while the
 *     kernel before it still runs, and only griddepcontrol.wait makes that kernel's writes
 *     visible. Every global store (and atomic) of a running kernel is kept (16-byte granules with
 *     a byte mask); a PDL launch's threads that have not passed griddepcontrol.wait (themselves,
 *     or through a __syncthreads after another thread of the block did) may not read or write a
 *     byte the previous kernel wrote: as on the GPU, that byte may not be there yet;
 *   - global memory out of bounds: device buffers have red zones, and each scratch request of the
 *     backend is its own exact region (pln_emu_scratch_request);
 *   - global memory between blocks: a read of another block's store that no __threadfence has
 *     published yet, and two blocks storing to one byte in a launch ("stores between blocks").
 * A report prints kernel, block, threads and offset on stderr, fails the launch
 * (cudaGetLastError() = cudaErrorLaunchFailure, whose message is the report) and is counted
 * (emu.h).
 *
 * Memory is host memory (cudaMalloc is an aligned malloc, so ASan sees device buffers), copies
 * are memcpy, every stream runs in order at once, and graph capture records launches, copies and
 * memsets for replay. cuBLASLt finds no algorithm (the backend's in-house fallback runs) and NCCL
 * is not built (MPI stands in). */
#include "kernels/cuda/emu/emu.h"

#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <functional>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <map>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* The launch API of cuda_emu.h, without including it (it redefines the CUDA keywords). */
struct pln_emu_launch_cfg {
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    int pdl;
};
void pln_emu_launch_run(const pln_emu_launch_cfg &cfg, std::function<void()> body);

extern "C" {
uint3 pln_emu_thread_idx, pln_emu_block_idx;
dim3 pln_emu_block_dim, pln_emu_grid_dim;
}

/* The kernel files are compiled with inline-8bit-counters (trace-loads/stores need a coverage
 * mode); the counters themselves are not used. */
extern "C" void __sanitizer_cov_8bit_counters_init(uint8_t *, uint8_t *) {}

/* ---- fibers ---------------------------------------------------------------------------------- */
#if !defined(__x86_64__)
#error "the CPU harness switches fibers with x86-64 code: port pln_emu_ctx_switch"
#endif
/* Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
 * the stack pointer in *save and continues on the stack `to` (saved the same way). */
asm(R"(
    .text
    .globl pln_emu_ctx_switch
    .hidden pln_emu_ctx_switch
    .type pln_emu_ctx_switch,@function
pln_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pln_emu_ctx_switch,.-pln_emu_ctx_switch
)");
extern "C" void pln_emu_ctx_switch(void **save, void *to);

enum { F_RUN, F_BAR, F_WARP, F_DONE };
#define MAX_THREADS 1024
#define STACK_SIZE ((size_t)256 << 10)

struct fiber {
    void *sp;
    char *stack;               /* usable stack [stack, stack + STACK_SIZE), guard page below */
    uint3 tid;
    int lin, warp, lane;
    int state;
    const char *bar_site;
    uint32_t lane_sync;        /* the warp's sync count after the last collective it completed */
    int op, arg, width;
    unsigned mask;
    uint64_t val, res;
    uint32_t ab[6];
    float *c;
    const struct mma_desc *mma;   /* the parsed PTX of the lane's mma */
    void *asan_fake;
    bool waited;               /* past griddepcontrol.wait (its own, or a barrier after another thread's) */
};

static fiber *g_fib;                     /* the active block's threads (blk_ctx) */
static int g_nthreads;
static fiber *g_cur;
static void *g_sched_sp;
static const std::function<void()> *g_body;
static uint32_t *g_wsync;                /* per warp: collectives completed */
#ifdef EMU_ASAN
static void *g_sched_fake;
static const void *g_sched_bottom;
static size_t g_sched_size;
#endif

static void fiber_entry();

static void fiber_init(fiber *f)
{
    if (!f->stack) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        char *m = (char *)mmap(NULL, STACK_SIZE + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) { perror("pollen cuda harness: fiber stack"); abort(); }
        mprotect(m, page, PROT_NONE);   /* a stack overflow faults instead of corrupting a neighbour */
        f->stack = m + page;
    }
#ifdef EMU_ASAN
    /* the previous fiber on this stack ended by switching away: its frames' poison is stale */
    __asan_unpoison_memory_region(f->stack, STACK_SIZE);
#endif
    uint64_t *sp = (uint64_t *)(((uintptr_t)f->stack + STACK_SIZE) & ~(uintptr_t)15);
    *--sp = 0;                               /* fiber_entry's return address: it never returns */
    *--sp = (uint64_t)(uintptr_t)fiber_entry;
    for (int i = 0; i < 6; i++) *--sp = 0;   /* rbp rbx r12-r15 */
    *--sp = 0x1f80ull | (0x037full << 32);   /* MXCSR, x87 control word: the defaults */
    f->sp = sp;
    f->state = F_RUN;
    f->bar_site = NULL;
    f->lane_sync = 0;
    f->asan_fake = NULL;
    f->waited = false;
}

/* Scheduler -> fiber f, back when it blocks or ends. */
static void run_fiber(fiber *f)
{
    g_cur = f;
    pln_emu_thread_idx = f->tid;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&g_sched_fake, f->stack, STACK_SIZE);
#endif
    pln_emu_ctx_switch(&g_sched_sp, f->sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(g_sched_fake, NULL, NULL);
#endif
    g_cur = NULL;
}

/* Fiber -> scheduler. */
static void yield_fiber(void)
{
    fiber *f = g_cur;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(f->state == F_DONE ? NULL : &f->asan_fake, g_sched_bottom, g_sched_size);
#endif
    pln_emu_ctx_switch(&f->sp, g_sched_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &g_sched_bottom, &g_sched_size);
#endif
}

static void fiber_entry()
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &g_sched_bottom, &g_sched_size);
#endif
    (*g_body)();
    g_cur->state = F_DONE;
    yield_fiber();
    abort();   /* a finished fiber is never resumed */
}

/* ---- reports --------------------------------------------------------------------------------- */
static pthread_mutex_t g_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static const pln_emu_launch_cfg *g_cfg;   /* the running launch */
static bool g_failed;                     /* a check fired in the running launch */
static int g_reports_this_launch;
static size_t g_report_count;
static char g_last_report[1024];
static char g_error_text[1200];

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    g_failed = true;
    g_report_count++;
    if (g_reports_this_launch++ >= 3) return;   /* the first few say it; the count keeps the rest */
    char msg[900], line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "cuda harness: %s: block (%u,%u,%u): %s", g_cfg ? g_cfg->name : "?",
             pln_emu_block_idx.x, pln_emu_block_idx.y, pln_emu_block_idx.z, msg);
    fprintf(stderr, "%s\n", line);
    /* the launch's error is its first report: the cause, not what followed from it */
    if (g_reports_this_launch == 1) memcpy(g_last_report, line, sizeof line);
}

static const char *where(void *pc, char *buf, size_t cap)
{
    Dl_info di;
    if (pc && dladdr(pc, &di) && di.dli_fname)
        snprintf(buf, cap, "%s+0x%lx", di.dli_fname, (unsigned long)((uintptr_t)pc - (uintptr_t)di.dli_fbase));
    else snprintf(buf, cap, "%p", pc);
    return buf;
}

/* ---- shared memory: ranges and shadow --------------------------------------------------------- */
/* The static shared range: section .pln_shared of the executable, from its ELF section headers
 * (present even in a stripped binary), moved by the load bias of a position-independent one. */
static int main_bias(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(uintptr_t *)data = (uintptr_t)info->dlpi_addr;
    return 1;   /* the first object is the executable */
}

static void find_static_shared(uintptr_t *lo, size_t *n)
{
    *lo = 0;
    *n = 0;
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) { perror("pollen cuda harness: /proc/self/exe"); abort(); }
    Elf64_Ehdr eh;
    bool ok = pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh && !memcmp(eh.e_ident, ELFMAG, SELFMAG) &&
              eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_shentsize == sizeof(Elf64_Shdr) && eh.e_shstrndx < eh.e_shnum;
    std::vector<Elf64_Shdr> sh(ok ? eh.e_shnum : 0);
    ok = ok && pread(fd, sh.data(), sh.size() * sizeof(Elf64_Shdr), (off_t)eh.e_shoff) == (ssize_t)(sh.size() * sizeof(Elf64_Shdr));
    std::vector<char> names(ok ? sh[eh.e_shstrndx].sh_size + 1 : 0);
    ok = ok && pread(fd, names.data(), names.size() - 1, (off_t)sh[eh.e_shstrndx].sh_offset) == (ssize_t)(names.size() - 1);
    close(fd);
    if (!ok) { fprintf(stderr, "pollen cuda harness: cannot read the ELF section headers of /proc/self/exe\n"); abort(); }
    uintptr_t bias = 0;
    dl_iterate_phdr(main_bias, &bias);
    for (const Elf64_Shdr &h : sh)
        if (h.sh_name < names.size() - 1 && !strcmp(&names[h.sh_name], ".pln_shared")) {
            *lo = bias + (uintptr_t)h.sh_addr;
            *n = (size_t)h.sh_size;
        }
}
#define RED_ZONE 256
#define NONE 0xffffu
#define MANY 0xfffeu

struct shadow {
    uint32_t gen;              /* == g_gen: written in this block's run */
    uint32_t wepoch, wsync;    /* barrier epoch and writer's warp-sync count at the last write */
    uint32_t repoch, rsync;    /* the same for the reads since (max sync count) */
    uint16_t wtid, rtid, rwarp;
    uint16_t early;            /* read before any write in this block: an uninitialised read or a race */
    uint16_t pending;          /* cp.async copies to this byte issued and not yet landed */
    uint16_t ptid;             /* the thread that issued the latest of them */
};

static uintptr_t g_sh_lo, g_sh_span;      /* static shared, checked only while a block runs */
static uintptr_t g_dyn_lo, g_dyn_span;    /* dynamic shared + red zone */
static size_t g_dyn_size;                 /* the launch's smem bytes */
static char *g_dyn_buf;
static size_t g_dyn_cap;
static shadow *g_shadow;
static size_t g_shadow_cap;
static uint32_t g_gen, g_epoch;
static size_t g_dlo, g_dhi;               /* the static shared bytes the active block has touched */
/* Bytes read before any write in this block. A write by another thread with no barrier between
 * makes it a race (the reader came first only by the harness's schedule); still unwritten at the
 * next barrier or the block's end, it was read uninitialised. */
static std::vector<std::pair<size_t, void *>> *g_early;
static size_t g_static_size;

static void shadow_reserve(size_t n)
{
    if (n <= g_shadow_cap) return;
    free(g_shadow);
    g_shadow = (shadow *)calloc(n, sizeof *g_shadow);
    if (!g_shadow) { fprintf(stderr, "pollen cuda harness: out of memory for the shared-memory shadow\n"); abort(); }
    g_shadow_cap = n;
    g_gen = 0;
}

static bool warp_ordered(const fiber *t, int other_warp, uint32_t other_sync)
{
    return other_warp == t->warp && t->lane_sync > other_sync;
}

static void race(const fiber *t, bool write, const char *kind, size_t off, bool dyn, int other, void *pc)
{
    char w[256];
    report("shared-memory race (%s): thread %d (warp %d) %s %s byte %zu; thread %s%d last %s it with no __syncthreads "
           "between and no warp sync of the same warp ordering them; at %s",
           kind, t->lin, t->warp, write ? "writes" : "reads", dyn ? "dynamic shared" : "static shared", off,
           other == MANY ? "(one of several) " : "", other == MANY ? -1 : other, strcmp(kind, "WAR") ? "wrote" : "read",
           where(pc, w, sizeof w));
}

__attribute__((noinline)) static void shared_access(size_t off, size_t n, bool write, bool dyn, void *pc)
{
    fiber *t = g_cur;
    if (!t) return;
    size_t base = dyn ? g_static_size : 0;
    if (dyn && off + n > g_dyn_size) {
        char w[256];
        report("dynamic shared memory overflow: thread %d %s %zu bytes at offset %zu of a %zu-byte launch smem; at %s",
               t->lin, write ? "writes" : "reads", n, off, g_dyn_size, where(pc, w, sizeof w));
        return;
    }
    if (!dyn) {
        if (off < g_dlo) g_dlo = off;
        if (off + n > g_dhi) g_dhi = off + n;
    }
    const uint32_t mysync = g_wsync[t->warp];
    for (size_t i = 0; i < n; i++) {
        shadow *s = &g_shadow[base + off + i];
        if (s->gen == g_gen && s->pending) {
            char w[256];
            report("thread %d %s %s byte %zu while a cp.async of thread %d to it is in flight (no "
                   "cp.async.wait_group covering its commit group yet); at %s", t->lin, write ? "writes" : "reads",
                   dyn ? "dynamic shared" : "static shared", off + i, s->ptid, where(pc, w, sizeof w));
            return;
        }
        if (!write) {
            if (s->gen != g_gen) {
                s->gen = g_gen; s->wtid = NONE; s->rtid = NONE; s->early = 1; s->pending = 0;
                g_early->push_back(std::make_pair(base + off + i, pc));
            }
            if (s->wtid != NONE && s->wtid != t->lin && s->wepoch == g_epoch &&
                !warp_ordered(t, s->wtid / 32, s->wsync)) {
                race(t, false, "RAW", off + i, dyn, s->wtid, pc);
                return;
            }
            if (s->rtid == NONE || s->repoch != g_epoch) {
                s->rtid = (uint16_t)t->lin; s->repoch = g_epoch; s->rwarp = (uint16_t)t->warp; s->rsync = mysync;
            } else if (s->rtid != t->lin) {
                s->rtid = MANY;
                if (s->rwarp != t->warp) s->rwarp = NONE;
                if (mysync > s->rsync) s->rsync = mysync;
            } else if (mysync > s->rsync) s->rsync = mysync;
        } else {
            if (s->gen != g_gen) {
                s->gen = g_gen; s->rtid = NONE; s->early = 0; s->pending = 0;
            } else if (s->early) {
                s->early = 0;
                if (s->rtid == t->lin) {
                    char w[256];
                    report("thread %d reads %s byte %zu before writing it: never written in this block before the read; "
                           "at %s", t->lin, dyn ? "dynamic shared" : "static shared", off + i, where(pc, w, sizeof w));
                    return;
                }
                if (s->rtid != NONE && s->repoch == g_epoch &&
                    !(s->rwarp != NONE && warp_ordered(t, s->rwarp, s->rsync))) {
                    char w[256];
                    report("shared-memory race (RAW): thread %d (warp %d) writes %s byte %zu that thread %s%d read with no "
                           "__syncthreads between and no warp sync of the same warp ordering them (the read could come "
                           "first); at %s", t->lin, t->warp, dyn ? "dynamic shared" : "static shared", off + i,
                           s->rtid == MANY ? "(one of several) " : "", s->rtid == MANY ? -1 : s->rtid,
                           where(pc, w, sizeof w));
                    return;
                }
                s->rtid = NONE;
            } else {
                if (s->wtid != NONE && s->wtid != t->lin && s->wepoch == g_epoch &&
                    !warp_ordered(t, s->wtid / 32, s->wsync)) {
                    race(t, true, "WAW", off + i, dyn, s->wtid, pc);
                    return;
                }
                if (s->rtid != NONE && s->rtid != t->lin && s->repoch == g_epoch &&
                    !(s->rwarp != NONE && warp_ordered(t, s->rwarp, s->rsync))) {
                    race(t, true, "WAR", off + i, dyn, s->rtid, pc);
                    return;
                }
                s->rtid = NONE;
            }
            s->wtid = (uint16_t)t->lin; s->wepoch = g_epoch; s->wsync = mysync;
        }
    }
}

/* ---- global memory: exact bounds, and stores between blocks ------------------------------------------
 * Bounds: every cudaMalloc block has a red zone of DEV_RZ bytes on each side (poisoned with 0xa5
 * like the block), and the backend's scratch is exact too: each pln_cuda_scratch request narrows
 * its allocation to the bytes asked for, for the launches made after it (a graph keeps what its
 * launches saw at capture). Any access of a kernel from a red zone or past the narrowed end is
 * reported, in every build (ASan adds use-after-free and host memory in the SANITIZE= build).
 *
 * Between blocks, the GPU's memory is weak: a block's plain stores may sit in its SM (L1, store
 * buffers) until a __threadfence() orders them before what follows (PTX fence.sc/acq_rel.gpu,
 * cumulative: it covers the thread's own stores and every store ordered before it by a
 * __syncthreads), or the kernel ends. Here every plain global store of a block is kept as
 * unpublished (per byte: the block and the store's sequence number) until then. Reported:
 *   - a block reading a byte that another block of the launch stored and has not published: on a
 *     GPU the read may return the old value (the split-K merge without its fence);
 *   - two blocks storing to the same byte in one launch with plain stores (not atomics): which one
 *     lands is a race, and one of them wrote into the other's part of a buffer.
 * Atomics (CUDA's are relaxed) publish nothing and are not stores here; a block's own stores are
 * always visible to itself. */
#define DEV_RZ 256
#define GPAGE 4096
struct dev_alloc {
    uintptr_t rz_lo, lo, hi, rz_hi;   /* [rz_lo, lo) red zone, [lo, hi) the n bytes asked for, then red zone */
    uintptr_t hi_eff;                 /* hi, or the end of the latest scratch request the running launch saw */
    size_t n;
};
static std::map<uintptr_t, dev_alloc> g_allocs;   /* rz_lo -> allocation */
typedef std::vector<std::pair<uintptr_t, size_t>> requests;
static std::map<uintptr_t, size_t> g_requests;    /* allocation start -> bytes of its latest scratch request */
enum { G_LOAD, G_STORE, G_ATOMIC };

struct gpage {                  /* the running launch's plain stores to one page of device memory */
    uint32_t wblk[GPAGE];       /* 1 + linear index of the block that stored the byte, 0: none */
    uint32_t pend[GPAGE];       /* that store's sequence number while unpublished, 0: published */
};
static std::unordered_map<uintptr_t, gpage *> g_gpages;   /* page number -> its shadow */
static std::vector<gpage *> g_gpage_free;
struct pcache { uintptr_t page; uint32_t gen; uint8_t kind; gpage *gp; };
enum { PK_HOST, PK_INSIDE, PK_EDGE };   /* no device memory / inside one allocation / bounds to check */
#define PCACHE 4096
static pcache g_pcache[PCACHE];         /* direct-mapped: most accesses resolve with one compare */
static uint32_t g_pcache_gen = 1;
static uint32_t g_blk;                  /* 1 + linear index of the running block */
static uint32_t g_store_seq;
struct pstore { uintptr_t a; uint32_t n, seq; };
static std::vector<pstore> *g_pst;       /* the running block's unpublished stores since its last barrier, per thread */
static std::vector<pstore> *g_pst_old;   /* ... and from before that barrier */
static bool g_drop_fences;

static void pcache_flush(void)
{
    if (++g_pcache_gen == 0) {
        memset(g_pcache, 0, sizeof g_pcache);
        g_pcache_gen = 1;
    }
}

static pcache *page_info(uintptr_t page)
{
    pcache *e = &g_pcache[page & (PCACHE - 1)];
    if (e->gen == g_pcache_gen && e->page == page) return e;
    e->page = page;
    e->gen = g_pcache_gen;
    e->kind = PK_HOST;
    e->gp = NULL;
    const uintptr_t P = page * GPAGE, Q = P + GPAGE;
    auto it = g_allocs.upper_bound(Q - 1);
    if (it != g_allocs.begin()) {
        const dev_alloc &d = (--it)->second;   /* the last allocation starting in or before the page */
        if (d.lo <= P && Q <= d.hi_eff) e->kind = PK_INSIDE;
        else if (d.rz_hi > P || d.rz_lo >= P) e->kind = PK_EDGE;
    }
    if (e->kind != PK_HOST) {
        auto g = g_gpages.find(page);
        if (g != g_gpages.end()) e->gp = g->second;
    }
    return e;
}

static const dev_alloc *alloc_of(uintptr_t x)
{
    auto it = g_allocs.upper_bound(x);
    if (it == g_allocs.begin()) return NULL;
    --it;
    return x < it->second.rz_hi ? &it->second : NULL;
}

static gpage *gpage_get(uintptr_t page)
{
    auto g = g_gpages.find(page);
    if (g != g_gpages.end()) return g->second;
    gpage *gp;
    if (!g_gpage_free.empty()) { gp = g_gpage_free.back(); g_gpage_free.pop_back(); }
    else if (!(gp = (gpage *)malloc(sizeof *gp))) { fprintf(stderr, "pollen cuda harness: out of memory for the global shadow\n"); abort(); }
    memset(gp, 0, sizeof *gp);
    g_gpages[page] = gp;
    return gp;
}

/* The launch ended: every store is visible; the shadow pages go back to the pool. */
static void gpages_release(void)
{
    for (auto &g : g_gpages) g_gpage_free.push_back(g.second);
    g_gpages.clear();
    pcache_flush();
}

static const char *block_name(uint32_t blk, char *buf, size_t cap)
{
    const uint32_t l = blk - 1, gx = pln_emu_grid_dim.x, gy = pln_emu_grid_dim.y;
    snprintf(buf, cap, "(%u,%u,%u)", l % gx, l / gx % gy, l / (gx * gy));
    return buf;
}

static void blocks_access(pcache *e, uintptr_t page, uintptr_t a, size_t n, bool write, void *pc)
{
    const fiber *t = g_cur;
    gpage *gp = e->gp;
    if (!gp) {
        if (!write) return;   /* no block stored to this page in this launch */
        gp = e->gp = gpage_get(page);
    }
    const size_t off = a % GPAGE;
    if (!write) {
        for (size_t i = 0; i < n; i++) {
            const uint32_t w = gp->wblk[off + i];
            if (w && w != g_blk && gp->pend[off + i]) {
                char b[64], wh[256];
                const dev_alloc *d = alloc_of(a + i);
                report("global memory: thread %d reads byte %zu of a %zu-byte device buffer that block %s stored in this "
                       "launch with no __threadfence() after the store: on a GPU it may not be visible to this block yet "
                       "(the read may return the old value); at %s", t->lin, d ? (size_t)(a + i - d->lo) : 0,
                       d ? d->n : 0, block_name(w, b, sizeof b), where(pc, wh, sizeof wh));
                return;
            }
        }
        return;
    }
    if (++g_store_seq == 0) g_store_seq = 1;
    for (size_t i = 0; i < n; i++) {
        const uint32_t w = gp->wblk[off + i];
        if (w && w != g_blk) {
            char b[64], wh[256];
            const dev_alloc *d = alloc_of(a + i);
            report("global memory: cross-block write race: thread %d stores to byte %zu of a %zu-byte device buffer that "
                   "block %s also stored to in this launch (plain stores, no atomic: which one lands is undefined, and one "
                   "block writes into another's part); at %s", t->lin, d ? (size_t)(a + i - d->lo) : 0, d ? d->n : 0,
                   block_name(w, b, sizeof b), where(pc, wh, sizeof wh));
            return;
        }
        gp->wblk[off + i] = g_blk;
        gp->pend[off + i] = g_store_seq;
    }
    g_pst[t->lin].push_back(pstore{a, (uint32_t)n, g_store_seq});
}

static void pdl_access(uintptr_t a, size_t n, bool write, void *pc);

/* Every global access of a running block: bounds, then the checks between blocks and PDL's. */
static void global_access(uintptr_t a, size_t n, int kind, void *pc)
{
    if (!g_cur || !n) return;
    const uintptr_t page = a / GPAGE;
    if ((a % GPAGE) + n > GPAGE) {   /* straddles two pages */
        const size_t first = GPAGE - a % GPAGE;
        global_access(a, first, kind, pc);
        global_access(a + first, n - first, kind, pc);
        return;
    }
    pcache *e = page_info(page);
    if (e->kind == PK_HOST) return;   /* a fiber's stack, host memory */
    if (e->kind == PK_EDGE) {
        const dev_alloc *d = alloc_of(a);
        if (!d) return;
        if (a < d->lo || a + n > d->hi_eff) {
            char wh[256];
            const bool req = d->hi_eff != d->hi;
            report("global memory out of bounds: thread %d %s %zu bytes at offset %lld of a %zu-byte %s%s; at %s",
                   g_cur->lin, kind == G_LOAD ? "reads" : kind == G_STORE ? "writes" : "updates atomically", n,
                   (long long)(a - d->lo), (size_t)(d->hi_eff - d->lo), req ? "scratch request" : "device allocation",
                   req ? " (pln_cuda_scratch: each request is its own region)" : "", where(pc, wh, sizeof wh));
            return;
        }
    }
    pdl_access(a, n, kind != G_LOAD, pc);
    if (kind != G_ATOMIC) blocks_access(e, page, a, n, kind == G_STORE, pc);
}

static void publish(const pstore &s)
{
    for (uintptr_t x = s.a; x < s.a + s.n; x++) {
        auto g = g_gpages.find(x / GPAGE);
        if (g == g_gpages.end()) continue;
        gpage *gp = g->second;
        if (gp->wblk[x % GPAGE] == g_blk && gp->pend[x % GPAGE] == s.seq) gp->pend[x % GPAGE] = 0;
    }
}

/* __threadfence(): this thread's stores, and every store of its block before its last
 * __syncthreads, become visible to the other blocks. */
extern "C" void pln_emu_threadfence(void)
{
    fiber *t = g_cur;
    if (!t || g_drop_fences) return;
    for (const pstore &s : g_pst[t->lin]) publish(s);
    g_pst[t->lin].clear();
    for (const pstore &s : *g_pst_old) publish(s);
    g_pst_old->clear();
}

extern "C" void pln_emu_drop_fences(int on) { g_drop_fences = on != 0; }

extern "C" void pln_emu_scratch_request(const void *p, size_t n)
{
    pthread_mutex_lock(&g_lock);
    g_requests[(uintptr_t)p] = n;
    pthread_mutex_unlock(&g_lock);
}

/* A barrier released: what each thread stored before it is ordered before every thread's fence. */
static void pst_barrier(void)
{
    for (int i = 0; i < g_nthreads; i++) {
        g_pst_old->insert(g_pst_old->end(), g_pst[i].begin(), g_pst[i].end());
        g_pst[i].clear();
    }
}

static void pst_clear(void)
{
    for (int i = 0; i < g_nthreads; i++) g_pst[i].clear();
    g_pst_old->clear();
}

/* ---- programmatic dependent launch ------------------------------------------------------------ */
/* Global bytes written: 16-byte granule address -> mask of its bytes and the kernel that wrote them last. */
struct written { uint16_t mask; const char *by; };
typedef std::unordered_map<uintptr_t, written> byteset;
static byteset g_pdl_writes;          /* by the running kernel */
static byteset g_pdl_pred;            /* by the kernel(s) the running one may overlap */
static bool g_pdl_in_block;           /* a block is running: global accesses are kept/checked */
static bool g_pdl_check;              /* ... of a PDL launch with writes before it to check against */
static bool g_pdl_blk_waited;         /* a thread of the running block passed griddepcontrol.wait */
static bool g_pdl_blk_triggered;      /* ... called griddepcontrol.launch_dependents */
/* Some block of the running launch waited before it let dependents start (its trigger or its
 * exit): then its predecessor had completed before any dependent could start. Without one, a
 * dependent may overlap the predecessor too. */
static bool g_pdl_ordered;
static bool g_pdl_reported;

static inline uint16_t granule_mask(uintptr_t g, uintptr_t a, size_t n)
{
    const uintptr_t lo = a > g ? a - g : 0, hi = a + n < g + 16 ? a + n - g : 16;
    return (uint16_t)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

static void pdl_access(uintptr_t a, size_t n, bool write, void *pc)
{
    fiber *t = g_cur;
    if (!t || !n || !(write || (g_pdl_check && !t->waited))) return;   /* a is device memory (global_access) */
    for (uintptr_t g = a & ~(uintptr_t)15; g < a + n; g += 16) {
        const uint16_t m = granule_mask(g, a, n);
        if (g_pdl_check && !t->waited && !g_pdl_reported) {
            auto it = g_pdl_pred.find(g);
            if (it != g_pdl_pred.end() && (it->second.mask & m)) {
                char w[256];
                g_pdl_reported = true;   /* once per launch: the first access says it */
                report("programmatic dependent launch: thread %d %s %zu bytes at %p that the previous kernel %s writes, "
                       "before griddepcontrol.wait (pln_pdl_wait): on a GPU they may not be written yet; at %s",
                       t->lin, write ? "writes" : "reads", n, (void *)a, it->second.by ? it->second.by : "?",
                       where(pc, w, sizeof w));
            }
        }
        if (write) {
            written &w = g_pdl_writes[g];
            w.mask |= m;
            w.by = g_cfg ? g_cfg->name : NULL;
        }
    }
}

extern "C" void pln_emu_griddep_wait(void)
{
    fiber *f = g_cur;
    if (!f) return;
    f->waited = true;
    g_pdl_blk_waited = true;
}

extern "C" void pln_emu_griddep_launch(void)
{
    if (!g_cur || g_pdl_blk_triggered) return;
    g_pdl_blk_triggered = true;
    if (g_pdl_blk_waited) g_pdl_ordered = true;
}

/* The next kernel cannot overlap any earlier one (a copy, a memset or a synchronization came between). */
static void pdl_barrier(void)
{
    g_pdl_pred.clear();
}

static inline __attribute__((always_inline)) void access(const void *p, size_t n, bool write, void *pc)
{
    uintptr_t a = (uintptr_t)p;
    if (a - g_sh_lo < g_sh_span) shared_access(a - g_sh_lo, n, write, false, pc);
    else if (a - g_dyn_lo < g_dyn_span) shared_access(a - g_dyn_lo, n, write, true, pc);
    else if (g_pdl_in_block) global_access(a, n, write ? G_STORE : G_LOAD, pc);
}

#define TRACE(n, T)                                                                                              \
    extern "C" void __sanitizer_cov_load##n(T *p) { access(p, n, false, __builtin_return_address(0)); }        \
    extern "C" void __sanitizer_cov_store##n(T *p) { access(p, n, true, __builtin_return_address(0)); }
TRACE(1, uint8_t)
TRACE(2, uint16_t)
TRACE(4, uint32_t)
TRACE(8, uint64_t)
TRACE(16, __int128)

extern "C" void *pln_emu_dynamic_shared(void) { return g_dyn_buf; }

/* Early reads still not written: read uninitialised. */
static void flush_early(void)
{
    for (const auto &e : *g_early) {
        shadow *s = &g_shadow[e.first];
        if (s->gen != g_gen || !s->early) continue;
        s->early = 0;
        const bool dyn = e.first >= g_static_size;
        char w[256];
        report("read of %s byte %zu never written in this block (thread %s%d); at %s",
               dyn ? "dynamic shared" : "static shared", dyn ? e.first - g_static_size : e.first,
               s->rtid == MANY ? "one of several, e.g. " : "", s->rtid == MANY ? -1 : s->rtid,
               where(e.second, w, sizeof w));
    }
    g_early->clear();
}

/* ---- barriers and warp collectives ------------------------------------------------------------- */
extern "C" void pln_emu_syncthreads(const char *site)
{
    fiber *f = g_cur;
    if (!f) return;
    f->state = F_BAR;
    f->bar_site = site;
    yield_fiber();
}

static uint64_t lane_val(int w, int lane) { return g_fib[w * 32 + lane].val; }

/* ---- mma: the PTX text of the instruction, parsed ------------------------------------------------
 * mma.cuh hands the harness the very string nvcc assembles (PLN_MMA16816_PTX) with the asm
 * operands in order: %0-%3 the fp32 accumulators, %4-%9 the b32 inputs. The opcode must be the one
 * variant implemented here; the D, A, B and C groups say which operand holds which fragment
 * register, so a swap in the text changes what the harness computes, as it would on the GPU. */
struct mma_desc {
    const char *ptx;
    char err[240];          /* "" when the text is one the harness runs */
    int d[4], a[4], b[2], c[4];
};

static const char *mma_group(const char *p, int *ops, int want, int lo, int hi, const char *name, char *err, size_t cap)
{
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (*p++ != '{') { snprintf(err, cap, "expected '{' before the %s registers", name); return NULL; }
    int n = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '}') { p++; break; }
        if (*p == ',') { p++; continue; }
        if (*p != '%' || p[1] < '0' || p[1] > '9') { snprintf(err, cap, "%s: expected %%N, got '%.12s'", name, p); return NULL; }
        const int v = (int)strtol(p + 1, (char **)&p, 10);
        if (n >= want) { snprintf(err, cap, "%s has more than %d registers (m16n8k16 .f16/.f32)", name, want); return NULL; }
        if (v < lo || v > hi) {
            snprintf(err, cap, "%s register %%%d is not one of the %s operands %%%d-%%%d", name, v,
                     lo == 0 ? "fp32 accumulator" : "b32 input", lo, hi);
            return NULL;
        }
        ops[n++] = v;
    }
    if (n != want) { snprintf(err, cap, "%s has %d registers, m16n8k16 with these types needs %d", name, n, want); return NULL; }
    return p;
}

static const mma_desc *mma_parse(const char *ptx)
{
    static std::vector<mma_desc *> cache;   /* by the address of the text: parsed once */
    for (const mma_desc *d : cache)
        if (d->ptx == ptx) return d;
    mma_desc *d = (mma_desc *)calloc(1, sizeof *d);
    if (!d) abort();
    d->ptx = ptx;
    static const char op[] = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
    const char *p = ptx;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strcspn(p, " \t");
    if (n != sizeof op - 1 || strncmp(p, op, n) != 0)
        snprintf(d->err, sizeof d->err, "unsupported instruction '%.*s' (the harness runs %s)", (int)(n < 80 ? n : 80), p, op);
    else {
        p += n;
        if ((p = mma_group(p, d->d, 4, 0, 3, "D", d->err, sizeof d->err)) &&
            (p = mma_group(p, d->a, 4, 4, 9, "A", d->err, sizeof d->err)) &&
            (p = mma_group(p, d->b, 2, 4, 9, "B", d->err, sizeof d->err)) &&
            (p = mma_group(p, d->c, 4, 0, 3, "C", d->err, sizeof d->err))) {
            while (*p == ' ' || *p == '\t') p++;
            if (*p != ';') snprintf(d->err, sizeof d->err, "expected ';' after the C registers");
        }
    }
    cache.push_back(d);
    return d;
}

static void mma_complete(int w)
{
    float A[16][16], B[16][8];
    const mma_desc *m = g_fib[w * 32].mma;
    for (int l = 0; l < 32; l++) {
        const fiber *f = &g_fib[w * 32 + l];
        if (f->mma != m) {
            report("warp %d: lanes 0 and %d run different mma instructions (%s | %s)", w, l, m->ptx, f->mma->ptx);
            return;
        }
    }
    if (m->err[0]) {
        report("mma: %s, in \"%s\"", m->err, m->ptx);
        return;
    }
    for (int l = 0; l < 32; l++) {
        const fiber *f = &g_fib[w * 32 + l];
        const int g = l >> 2, q = l & 3;
        float h[12];
        for (int i = 0; i < 6; i++) {   /* the A then B registers the text names, from the asm inputs */
            const uint32_t r = f->ab[i < 4 ? m->a[i] - 4 : m->b[i - 4] - 4];
            __half_raw lo, hi;
            lo.x = (unsigned short)(r & 0xffff);
            hi.x = (unsigned short)(r >> 16);
            h[2 * i] = __half2float(__half(lo));
            h[2 * i + 1] = __half2float(__half(hi));
        }
        /* PTX ISA, mma.m16n8k16 .f16: a0 (row g, cols 2q..2q+1), a1 (row g+8), a2 (row g, cols
         * 2q+8..), a3 (row g+8, cols 2q+8..); b0 (rows 2q..2q+1, col g), b1 (rows 2q+8..). */
        A[g][2 * q] = h[0]; A[g][2 * q + 1] = h[1];
        A[g + 8][2 * q] = h[2]; A[g + 8][2 * q + 1] = h[3];
        A[g][2 * q + 8] = h[4]; A[g][2 * q + 9] = h[5];
        A[g + 8][2 * q + 8] = h[6]; A[g + 8][2 * q + 9] = h[7];
        B[2 * q][g] = h[8]; B[2 * q + 1][g] = h[9];
        B[2 * q + 8][g] = h[10]; B[2 * q + 9][g] = h[11];
    }
    for (int l = 0; l < 32; l++) {
        fiber *f = &g_fib[w * 32 + l];
        const int g = l >> 2, q = l & 3;
        /* c0 (row g, col 2q), c1 (row g, col 2q+1), c2 (row g+8, col 2q), c3 (row g+8, col 2q+1):
         * D = A·B + C, C read in full before D is written (they are usually the same registers) */
        float d[4];
        for (int i = 0; i < 4; i++) {
            int r = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][col];
            d[i] = s + f->c[m->c[i]];
        }
        for (int i = 0; i < 4; i++) f->c[m->d[i]] = d[i];
    }
}

/* All lanes of the mask have arrived: every lane's result, then all of them run again. */
static void collective_complete(int w, unsigned mask)
{
    const fiber *first = NULL;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) { first = &g_fib[w * 32 + l]; break; }
    const int op = first->op;
    if (op == PLN_EMU_MMA) mma_complete(w);
    uint64_t ballot = 0, red = 0;
    bool any = false, all = true;
    bool red_init = false;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        const fiber *f = &g_fib[w * 32 + l];
        if (f->op != op) {
            report("warp %d: lanes meet at different collectives (lane %d at op %d, lane %d at op %d)", w,
                   first->lane, op, l, f->op);
        }
        if (f->val) ballot |= 1ull << l;
        any |= f->val != 0;
        all &= f->val != 0;
        uint64_t v = f->val;
        if (!red_init) { red = v; red_init = true; continue; }
        if (op == PLN_EMU_RED_ADD) red = (uint32_t)(red + v);
        else if (op == PLN_EMU_RED_MIN) red = first->arg ? ((int64_t)v < (int64_t)red ? v : red) : (v < red ? v : red);
        else if (op == PLN_EMU_RED_MAX) red = first->arg ? ((int64_t)v > (int64_t)red ? v : red) : (v > red ? v : red);
        else if (op == PLN_EMU_RED_AND) red &= v;
        else if (op == PLN_EMU_RED_OR) red |= v;
        else if (op == PLN_EMU_RED_XOR) red ^= v;
    }
    const uint32_t sync = ++g_wsync[w];
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        fiber *f = &g_fib[w * 32 + l];
        const int width = f->width > 0 && f->width <= 32 ? f->width : 32;
        const int seg = l & ~(width - 1), in = l - seg;
        int src = l;
        switch (op) {
        case PLN_EMU_SHFL: src = seg + ((f->arg % width) + width) % width; break;
        case PLN_EMU_SHFL_UP: src = in >= f->arg ? l - f->arg : l; break;
        case PLN_EMU_SHFL_DOWN: src = in + f->arg < width ? l + f->arg : l; break;
        case PLN_EMU_SHFL_XOR: src = l ^ f->arg; if ((src & ~(width - 1)) != seg || src > 31) src = l; break;
        default: break;
        }
        if (op >= PLN_EMU_SHFL && op <= PLN_EMU_SHFL_XOR) {
            if (!(mask >> src & 1))
                report("warp %d lane %d shuffles from lane %d, which is not in the mask 0x%08x", w, l, src, mask);
            f->res = lane_val(w, src);
        } else if (op == PLN_EMU_BALLOT) f->res = ballot;
        else if (op == PLN_EMU_ANY) f->res = any;
        else if (op == PLN_EMU_ALL) f->res = all;
        else if (op >= PLN_EMU_RED_ADD && op <= PLN_EMU_RED_XOR) f->res = red;
        f->state = F_RUN;
        f->lane_sync = sync;
    }
}

/* True when every lane of f's mask waits at a collective with the same mask. */
static bool collective_ready(const fiber *f)
{
    for (int l = 0; l < 32; l++) {
        if (!(f->mask >> l & 1)) continue;
        int i = f->warp * 32 + l;
        if (i >= g_nthreads) return false;   /* reported as a deadlock by the scheduler */
        if (g_fib[i].state != F_WARP || g_fib[i].mask != f->mask) return false;
    }
    return true;
}

static uint64_t arrive(fiber *f)
{
    if (!(f->mask >> f->lane & 1))
        report("thread %d (lane %d) calls a warp collective with mask 0x%08x that leaves it out", f->lin, f->lane, f->mask);
    f->state = F_WARP;
    if (collective_ready(f)) collective_complete(f->warp, f->mask);
    else yield_fiber();
    return f->res;
}

extern "C" uint64_t pln_emu_collective(int op, unsigned mask, uint64_t v, int arg, int width)
{
    fiber *f = g_cur;
    if (!f) return v;
    f->op = op; f->mask = mask; f->val = v; f->arg = arg; f->width = width;
    return arrive(f);
}

extern "C" void pln_emu_mma_ptx(const char *ptx, float c[4], const uint32_t in[6])
{
    fiber *f = g_cur;
    if (!f) return;
    f->op = PLN_EMU_MMA; f->mask = 0xffffffffu; f->val = 0; f->arg = 0; f->width = 32;
    memcpy(f->ab, in, sizeof f->ab);
    f->c = c;
    f->mma = mma_parse(ptx);
    arrive(f);
}


/* ---- cp.async ------------------------------------------------------------------------------------
 * Asynchronous copies as the PTX ISA defines them: the source is read at the issue (global memory
 * is not race-checked), the 16 bytes land in shared memory only when the issuing thread's
 * cp.async.wait_group covers the copy's commit group. Until then the destination bytes are marked
 * in flight, and any access to them is reported; the issue is checked as a write (against accesses
 * of other threads since the last barrier), and so is the landing (against accesses after it), so
 * reading another thread's copy after its wait without a __syncthreads is a race. Copies never
 * waited for are dropped at the end of the block, as their data would be. */
struct cp_copy {
    uintptr_t off;            /* byte offset in the shadow (static shared, then dynamic) */
    unsigned char data[16];
    uint32_t group;           /* the issuing thread's commit count at the issue */
    void *pc;
};
static std::vector<cp_copy> *g_cp;
static uint32_t *g_cp_commits;

static void cp_reset(void)
{
    for (int i = 0; i < g_nthreads; i++) {
        for (const cp_copy &c : g_cp[i])
            for (int b = 0; b < 16; b++) {
                shadow *s = &g_shadow[c.off + b];
                if (s->gen == g_gen && s->pending) s->pending--;
            }
        g_cp[i].clear();
        g_cp_commits[i] = 0;
    }
}

extern "C" void pln_emu_cp_async16(void *dst, const void *src, int src_bytes)
{
    fiber *t = g_cur;
    if (!t) { if (src_bytes) memcpy(dst, src, 16); else memset(dst, 0, 16); return; }
    void *pc = __builtin_return_address(0);
    char w[256];
    const uintptr_t a = (uintptr_t)dst;
    bool dyn;
    size_t off;
    if (a - g_sh_lo < g_sh_span) { dyn = false; off = a - g_sh_lo; }
    else if (a - g_dyn_lo < g_dyn_span) { dyn = true; off = a - g_dyn_lo; }
    else {
        report("thread %d: cp.async to %p, which is not shared memory; at %s", t->lin, dst, where(pc, w, sizeof w));
        return;
    }
    if ((a | (uintptr_t)src) & 15) {
        report("thread %d: cp.async of 16 bytes with a destination or source not 16-byte aligned (%p <- %p); at %s",
               t->lin, dst, src, where(pc, w, sizeof w));
        return;
    }
    if (src_bytes != 0 && src_bytes != 16) {
        report("thread %d: cp.async with %d source bytes (16 or 0 here); at %s", t->lin, src_bytes, where(pc, w, sizeof w));
        return;
    }
    const size_t before = g_reports_this_launch;
    shared_access(off, 16, true, dyn, pc);   /* the copy may land at any time from now on */
    if ((size_t)g_reports_this_launch != before) return;
    /* the source is read at the issue (the data may be fetched at any time from now on): under
     * programmatic dependent launch, before griddepcontrol.wait it may not be the previous
     * kernel's output */
    if (src_bytes && g_pdl_in_block) global_access((uintptr_t)src, 16, G_LOAD, pc);
    cp_copy c;
    c.off = (dyn ? g_static_size : 0) + off;
    if (src_bytes) memcpy(c.data, src, 16);
    else memset(c.data, 0, 16);
    c.group = g_cp_commits[t->lin];
    c.pc = pc;
    for (int b = 0; b < 16; b++) {
        shadow *s = &g_shadow[c.off + b];
        s->pending++;
        s->ptid = (uint16_t)t->lin;
    }
    g_cp[t->lin].push_back(c);
}

extern "C" void pln_emu_cp_async_commit(void)
{
    if (g_cur) g_cp_commits[g_cur->lin]++;
}

/* Lands this thread's copies of every commit group but the newest n. */
extern "C" void pln_emu_cp_async_wait(int n)
{
    fiber *t = g_cur;
    if (!t) return;
    std::vector<cp_copy> &v = g_cp[t->lin];
    const uint32_t commits = g_cp_commits[t->lin];
    if ((uint32_t)n >= commits) return;
    const uint32_t upto = commits - (uint32_t)n;   /* groups [0, upto) complete */
    size_t keep = 0;
    for (size_t i = 0; i < v.size(); i++) {
        const cp_copy &c = v[i];
        if (c.group >= upto) { v[keep++] = c; continue; }
        for (int b = 0; b < 16; b++) g_shadow[c.off + b].pending--;
        const bool dyn = c.off >= g_static_size;
        const size_t off = dyn ? c.off - g_static_size : c.off;
        memcpy((char *)(dyn ? g_dyn_lo : g_sh_lo) + off, c.data, 16);
        shared_access(off, 16, true, dyn, c.pc);
    }
    v.resize(keep);
}

/* ---- atomics ---------------------------------------------------------------------------------- */
extern "C" int pln_emu_atomic_i32(int op, void *p, int v, int cmp)
{
    if (g_pdl_in_block) global_access((uintptr_t)p, 4, G_ATOMIC, __builtin_return_address(0));
    int *q = (int *)p, old = *q;
    unsigned uo = (unsigned)old, uv = (unsigned)v;
    switch (op) {
    case PLN_EMU_AT_ADD: *q = (int)(uo + uv); break;
    case PLN_EMU_AT_OR: *q = (int)(uo | uv); break;
    case PLN_EMU_AT_AND: *q = (int)(uo & uv); break;
    case PLN_EMU_AT_XOR: *q = (int)(uo ^ uv); break;
    case PLN_EMU_AT_MAX: *q = old > v ? old : v; break;
    case PLN_EMU_AT_MIN: *q = old < v ? old : v; break;
    case PLN_EMU_AT_UMAX: *q = (int)(uo > uv ? uo : uv); break;
    case PLN_EMU_AT_UMIN: *q = (int)(uo < uv ? uo : uv); break;
    case PLN_EMU_AT_EXCH: *q = v; break;
    case PLN_EMU_AT_CAS: if (old == cmp) *q = v; break;
    default: break;
    }
    return old;
}
extern "C" float pln_emu_atomic_add_f32(float *p, float v)
{
    if (g_pdl_in_block) global_access((uintptr_t)p, 4, G_ATOMIC, __builtin_return_address(0));
    float o = *p;
    *p = o + v;
    return o;
}
extern "C" unsigned long long pln_emu_atomic_add_u64(unsigned long long *p, unsigned long long v)
{
    if (g_pdl_in_block) global_access((uintptr_t)p, 8, G_ATOMIC, __builtin_return_address(0));
    unsigned long long o = *p;
    *p = o + v;
    return o;
}

/* ---- blocks and launches ---------------------------------------------------------------------- */
static const char *state_name(int s)
{
    return s == F_RUN ? "running" : s == F_BAR ? "at __syncthreads" : s == F_WARP ? "at a warp collective" : "exited";
}

/* ---- blocks of a launch, interleaved ----------------------------------------------------------------
 * Up to KMAX blocks of a launch are resident at once, each with its own threads, warp state,
 * cp.async copies, unpublished stores, shared-memory shadow, dynamic shared buffer and static
 * shared bytes (the one .pln_shared section holds the active block's; the bytes a block touched
 * are saved and restored when another block becomes active). The scheduler admits blocks in a
 * shuffled order and runs a randomly chosen resident block for one round (each of its runnable
 * threads until it blocks, or a barrier's release) at a time: the blocks' fibers are scheduled
 * together, in an order fixed by the launch's seed (pln_emu_set_seed, PLN_EMU_SEED, and the
 * launch's number), so every launch sees another order and a run can be repeated. */
#define KMAX 4
struct blk_ctx {
    fiber fib[MAX_THREADS];
    uint32_t wsync[MAX_THREADS / 32];
    std::vector<cp_copy> cp[MAX_THREADS];
    uint32_t cp_commits[MAX_THREADS];
    std::vector<pstore> pst[MAX_THREADS];
    std::vector<pstore> pst_old;
    std::vector<std::pair<size_t, void *>> early;
    shadow *sh;
    size_t sh_cap;
    uint32_t gen, epoch;
    char *dyn;
    size_t dyn_cap;
    char *saved;             /* its static shared bytes while another block is active */
    size_t dlo, dhi;
    bool waited, triggered;
    uint3 idx;
    uint32_t blk;
};
static blk_ctx *g_ctxs[KMAX];
static blk_ctx *g_active;           /* whose state the globals above hold */
static blk_ctx *g_section_owner;    /* whose static shared bytes the section holds */
static uint64_t g_seed = 0x9e3779b97f4a7c15ull, g_launch_no;
static bool g_seed_read;

extern "C" void pln_emu_set_seed(uint64_t seed) { g_seed = seed; g_seed_read = true; g_launch_no = 0; }

static uint64_t rng_next(uint64_t *x)   /* splitmix64 */
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The static shared section has ASan's redzones between its variables in the SANITIZE= build: a
 * block's range is saved and restored without the checks (the redzone bytes are copied as they
 * are; no kernel reads them). Volatile, so the loop does not become a (checked) memcpy. */
#ifdef EMU_ASAN
__attribute__((no_sanitize("address"))) static void raw_copy(char *d, const char *s, size_t n)
{
    volatile char *vd = d;
    const volatile char *vs = s;
    for (size_t i = 0; i < n; i++) vd[i] = vs[i];
}
#else
static void raw_copy(char *d, const char *s, size_t n) { memcpy(d, s, n); }
#endif

static void ctx_leave(void)
{
    blk_ctx *c = g_active;
    if (!c) return;
    c->sh = g_shadow; c->sh_cap = g_shadow_cap; c->gen = g_gen; c->epoch = g_epoch;
    c->dyn = g_dyn_buf; c->dyn_cap = g_dyn_cap; c->dlo = g_dlo; c->dhi = g_dhi;
    c->waited = g_pdl_blk_waited; c->triggered = g_pdl_blk_triggered;
    c->idx = pln_emu_block_idx; c->blk = g_blk;
    g_active = NULL;
}

static void ctx_enter(blk_ctx *c)
{
    if (g_active == c) return;
    ctx_leave();
    g_fib = c->fib; g_wsync = c->wsync; g_cp = c->cp; g_cp_commits = c->cp_commits;
    g_pst = c->pst; g_pst_old = &c->pst_old; g_early = &c->early;
    g_shadow = c->sh; g_shadow_cap = c->sh_cap; g_gen = c->gen; g_epoch = c->epoch;
    g_dyn_buf = c->dyn; g_dyn_cap = c->dyn_cap; g_dyn_lo = (uintptr_t)c->dyn; g_dlo = c->dlo; g_dhi = c->dhi;
    g_pdl_blk_waited = c->waited; g_pdl_blk_triggered = c->triggered;
    pln_emu_block_idx = c->idx; g_blk = c->blk;
    if (g_section_owner != c && g_sh_lo) {
        blk_ctx *o = g_section_owner;
        if (o && o->dhi > o->dlo) raw_copy(o->saved + o->dlo, (char *)g_sh_lo + o->dlo, o->dhi - o->dlo);
        if (c->dhi > c->dlo) raw_copy((char *)g_sh_lo + c->dlo, c->saved + c->dlo, c->dhi - c->dlo);
        g_section_owner = c;
    }
    g_active = c;
}

/* Starts block idx in the active context. */
static void block_begin(uint3 idx, uint32_t blk)
{
    pln_emu_block_idx = idx;
    g_blk = blk;
    g_pdl_blk_waited = g_pdl_blk_triggered = false;
    g_dlo = SIZE_MAX;
    g_dhi = 0;
    const dim3 b = pln_emu_block_dim;
    g_nthreads = (int)(b.x * b.y * b.z);
    for (int i = 0; i < g_nthreads; i++) {
        fiber *f = &g_fib[i];
        fiber_init(f);
        f->lin = i;
        f->tid = make_uint3((unsigned)i % b.x, (unsigned)i / b.x % b.y, (unsigned)i / (b.x * b.y));
        f->warp = i / 32;
        f->lane = i % 32;
    }
    memset(g_wsync, 0, MAX_THREADS / 32 * sizeof *g_wsync);
    for (int i = 0; i < g_nthreads; i++) { g_cp[i].clear(); g_cp_commits[i] = 0; }
    g_early->clear();
    pst_clear();
    g_gen++;
    g_epoch++;
    if (g_gen == 0) {   /* wrapped: no stale shadow entry may look current */
        memset(g_shadow, 0, g_shadow_cap * sizeof *g_shadow);
        g_gen = 1;
    }
}

enum { B_RUNNING, B_DONE, B_FAILED };
/* One round of the active block: its runnable threads each until they block, or a barrier's
 * release, or its end; B_FAILED when it cannot finish (divergent barrier, deadlock). */
static int block_step(void)
{
    bool ran = false;
    for (int i = 0; i < g_nthreads; i++)
        if (g_fib[i].state == F_RUN) { run_fiber(&g_fib[i]); ran = true; }
    if (ran) return B_RUNNING;
    int nbar = 0, nwarp = 0, ndone = 0, first_bar = -1, first_done = -1, first_warp = -1;
    for (int i = 0; i < g_nthreads; i++) {
        int st = g_fib[i].state;
        if (st == F_BAR) { nbar++; if (first_bar < 0) first_bar = i; }
        else if (st == F_WARP) { nwarp++; if (first_warp < 0) first_warp = i; }
        else if (st == F_DONE) { ndone++; if (first_done < 0) first_done = i; }
    }
    if (ndone == g_nthreads) { cp_reset(); flush_early(); pst_clear(); return B_DONE; }
    if (nbar == g_nthreads) {
        flush_early();
        const char *site = g_fib[0].bar_site;
        for (int i = 1; i < g_nthreads; i++)
            if (strcmp(g_fib[i].bar_site, site) != 0) {
                report("divergent barrier: thread 0 waits at __syncthreads %s, thread %d at __syncthreads %s",
                       site, i, g_fib[i].bar_site);
                return B_FAILED;
            }
        g_epoch++;
        pst_barrier();
        for (int i = 0; i < g_nthreads; i++) {
            g_fib[i].state = F_RUN;
            /* a thread past the barrier is ordered after every wait before it */
            if (g_pdl_blk_waited) g_fib[i].waited = true;
        }
        return B_RUNNING;
    }
    /* nothing can run: a barrier some thread never reaches, or a collective that never completes */
    if (nbar && ndone)
        report("divergent barrier: thread %d exited while thread %d waits at __syncthreads %s (%d of %d threads wait)",
               first_done, first_bar, g_fib[first_bar].bar_site, nbar, g_nthreads);
    else if (nwarp) {
        const fiber *f = &g_fib[first_warp];
        int other = -1;
        for (int l = 0; l < 32 && other < 0; l++) {
            int i = f->warp * 32 + l;
            if ((f->mask >> l & 1) && (i >= g_nthreads || g_fib[i].state != F_WARP || g_fib[i].mask != f->mask))
                other = i;
        }
        report("deadlock: thread %d waits at a warp collective (mask 0x%08x) that lane %d never joins (%s)", f->lin,
               f->mask, other % 32, other >= g_nthreads ? "no such thread in the block" : state_name(g_fib[other].state));
    } else
        report("deadlock: %d threads wait at __syncthreads, %d exited", nbar, ndone);
    cp_reset();
    g_early->clear();
    pst_clear();
    return B_FAILED;
}

/* Runs every block of the launch, interleaved (above). */
static void run_blocks(const pln_emu_launch_cfg &cfg, size_t st)
{
    if (!g_seed_read) {
        const char *e = getenv("PLN_EMU_SEED");
        if (e && *e) g_seed = strtoull(e, NULL, 0);
        g_seed_read = true;
    }
    uint64_t rng = g_seed ^ (0x100000001b3ull * ++g_launch_no);
    const uint64_t nb = (uint64_t)cfg.grid.x * cfg.grid.y * cfg.grid.z;
    std::vector<uint32_t> order(nb);
    for (uint64_t i = 0; i < nb; i++) order[i] = (uint32_t)i;
    for (uint64_t i = nb; i > 1; i--) std::swap(order[i - 1], order[rng_next(&rng) % i]);
    const int k = nb < KMAX ? (int)nb : KMAX;
    for (int i = 0; i < k; i++) {   /* each context sized for this launch */
        if (!g_ctxs[i]) {
            g_ctxs[i] = new blk_ctx();
            if (st && !(g_ctxs[i]->saved = (char *)calloc(1, st))) abort();
        }
        ctx_enter(g_ctxs[i]);
        shadow_reserve(st + cfg.smem + RED_ZONE);
        if (g_dyn_cap < cfg.smem + RED_ZONE) {
            free(g_dyn_buf);
            g_dyn_cap = cfg.smem + RED_ZONE;
            g_dyn_buf = (char *)aligned_alloc(256, (g_dyn_cap + 255) & ~(size_t)255);
            g_dyn_lo = (uintptr_t)g_dyn_buf;
        }
        ctx_leave();
    }
    blk_ctx *res[KMAX];
    bool busy[KMAX] = {false, false, false, false};
    int nres = 0;
    uint64_t next = 0;
    g_sh_span = st;
    g_dyn_span = cfg.smem + RED_ZONE;
    g_pdl_in_block = true;
    while (!g_failed && (next < nb || nres > 0)) {
        while (nres < k && next < nb) {
            int f = 0;
            while (busy[f]) f++;
            busy[f] = true;
            blk_ctx *c = g_ctxs[f];
            ctx_enter(c);
            const uint32_t l = order[next++];
            block_begin(make_uint3(l % cfg.grid.x, l / cfg.grid.x % cfg.grid.y, l / (cfg.grid.x * cfg.grid.y)), l + 1);
            res[nres++] = c;
        }
        const int r = (int)(rng_next(&rng) % (uint64_t)nres);
        ctx_enter(res[r]);
        const int bs = block_step();
        if (bs == B_RUNNING) continue;
        if (!g_pdl_blk_triggered && g_pdl_blk_waited) g_pdl_ordered = true;   /* exit: an implicit trigger */
        if (bs == B_FAILED) g_failed = true;
        for (int f = 0; f < k; f++)
            if (g_ctxs[f] == res[r]) busy[f] = false;
        res[r] = res[--nres];
    }
    ctx_leave();
    g_pdl_in_block = false;
    g_sh_span = g_dyn_span = 0;
}

struct stream_st;
struct node {   /* one captured operation */
    pln_emu_launch_cfg cfg;
    std::function<void()> body;   /* a kernel launch (cfg.name set) or a copy/memset */
    requests req;                 /* the scratch requests the launch saw */
};

struct emu_log {
    std::vector<pln_emu_launch_rec> recs;
    size_t count;
};
static emu_log g_log;
static thread_local cudaError_t g_last_error = cudaSuccess;
#define LOG_KEEP 65536

/* Runs a kernel now. */
static void execute(const pln_emu_launch_cfg &cfg, const std::function<void()> &body, const requests &req)
{
    pthread_mutex_lock(&g_lock);
    pln_emu_launch_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.kernel = cfg.name;
    rec.grid[0] = cfg.grid.x; rec.grid[1] = cfg.grid.y; rec.grid[2] = cfg.grid.z;
    rec.block[0] = cfg.block.x; rec.block[1] = cfg.block.y; rec.block[2] = cfg.block.z;
    rec.smem = cfg.smem;
    const unsigned long long nt = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
    bool bad = nt == 0 || nt > MAX_THREADS || cfg.block.z > 64 || cfg.grid.x == 0 || cfg.grid.y == 0 ||
               cfg.grid.z == 0 || cfg.grid.y > 65535 || cfg.grid.z > 65535 || cfg.grid.x > 2147483647u ||
               cfg.smem > 48 * 1024;
    if (bad) {
        snprintf(g_last_report, sizeof g_last_report,
                 "cuda harness: %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) smem %zu", cfg.name,
                 cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z, cfg.smem);
        fprintf(stderr, "%s\n", g_last_report);
        g_last_error = cudaErrorInvalidConfiguration;
        rec.failed = 1;
    } else {
        g_cfg = &cfg;
        g_failed = false;
        g_reports_this_launch = 0;
        pln_emu_grid_dim = cfg.grid;
        pln_emu_block_dim = cfg.block;
        g_body = &body;
        static uintptr_t sh_lo;
        static size_t st;
        static bool found;
        if (!found) { find_static_shared(&sh_lo, &st); found = true; }
        g_static_size = st;
        g_sh_lo = sh_lo;
        g_dyn_size = cfg.smem;
        g_pdl_writes.clear();
        /* each scratch allocation as narrow as the latest request this launch saw */
        std::vector<dev_alloc *> narrowed;
        for (const auto &r : req) {
            auto it = g_allocs.find(r.first - DEV_RZ);
            if (it == g_allocs.end() || it->second.lo != r.first) continue;   /* freed since the capture */
            it->second.hi_eff = it->second.lo + (r.second < it->second.n ? r.second : it->second.n);
            narrowed.push_back(&it->second);
        }
        pcache_flush();
        g_pdl_check = cfg.pdl && !g_pdl_pred.empty();
        g_pdl_ordered = false;
        g_pdl_reported = false;
        run_blocks(cfg, st);
        /* what the next launch may overlap: this kernel's writes, and, when this one let its
         * dependents start before it had waited itself, its predecessor's too */
        if (!(cfg.pdl && !g_pdl_ordered)) g_pdl_pred.clear();
        for (const auto &w : g_pdl_writes) {
            written &p = g_pdl_pred[w.first];
            p.mask |= w.second.mask;
            p.by = w.second.by;
        }
        g_pdl_writes.clear();
        gpages_release();
        for (dev_alloc *d : narrowed) d->hi_eff = d->hi;
        pcache_flush();
        if (g_failed) {
            g_last_error = cudaErrorLaunchFailure;
            rec.failed = 1;
        }
        g_cfg = NULL;
        g_body = NULL;
    }
    if (g_log.count < LOG_KEEP) g_log.recs.push_back(rec);
    g_log.count++;
    pthread_mutex_unlock(&g_lock);
}

/* ---- streams, events, graphs --------------------------------------------------------------------- */
struct CUstream_st {
    bool capturing;
    std::vector<node> *capture;
};
struct CUevent_st { int unused; };
struct CUgraph_st { std::vector<node> nodes; };
struct CUgraphExec_st { std::vector<node> nodes; };

static CUstream_st g_default_stream;
static CUstream_st *stream_of(cudaStream_t s) { return s ? s : &g_default_stream; }

/* Runs op now, or records it when the stream is capturing. */
static cudaError_t enqueue(cudaStream_t s, const pln_emu_launch_cfg *cfg, std::function<void()> op)
{
    CUstream_st *st = stream_of(s);
    if (st->capturing) {
        node n;
        if (cfg) n.cfg = *cfg;
        else memset(&n.cfg, 0, sizeof n.cfg);
        n.body = std::move(op);
        if (cfg) n.req.assign(g_requests.begin(), g_requests.end());
        st->capture->push_back(std::move(n));
        return cudaSuccess;
    }
    requests req(g_requests.begin(), g_requests.end());
    if (cfg) execute(*cfg, op, req);
    else { pdl_barrier(); op(); }
    return cudaSuccess;
}

/* A recorded node: its launch with the scratch requests it saw at capture. */
static cudaError_t replay(cudaStream_t s, const node &n)
{
    if (!n.cfg.name) return enqueue(s, NULL, n.body);
    CUstream_st *st = stream_of(s);
    if (st->capturing) { st->capture->push_back(n); return cudaSuccess; }
    execute(n.cfg, n.body, n.req);
    return cudaSuccess;
}

void pln_emu_launch_run(const pln_emu_launch_cfg &cfg, std::function<void()> body)
{
    enqueue(cfg.stream, &cfg, std::move(body));
}

/* ---- the CUDA runtime API ---------------------------------------------------------------------- */
#define DEVICE_MEMORY ((size_t)141 << 30)   /* what cudaMemGetInfo reports: an H200 */
static size_t g_allocated;
static std::unordered_map<void *, size_t> g_sizes;   /* live cudaMalloc blocks */

extern "C" {
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : (g_last_error = cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "pollen CPU harness (emulated sm_90)");
    p->major = 9; p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = DEVICE_MEMORY;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    p->regsPerBlock = 65536;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { pdl_barrier(); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { cudaError_t e = g_last_error; g_last_error = cudaSuccess; return e; }
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }
const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchFailure:   /* the harness's report says what went wrong */
        snprintf(g_error_text, sizeof g_error_text, "%s", g_last_report);
        return g_error_text;
    default: return "unknown error";
    }
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = NULL;
    if (n > DEVICE_MEMORY - g_allocated) return g_last_error = cudaErrorMemoryAllocation;
    size_t want = n ? (n + 255) & ~(size_t)255 : 256;
    char *b = NULL;
    if (posix_memalign((void **)&b, 256, want + 2 * DEV_RZ) != 0) return g_last_error = cudaErrorMemoryAllocation;
    /* fresh device memory is not zero on a GPU: make a kernel that relies on it fail here too;
     * the red zones on both sides are checked (global_access) */
    memset(b, 0xa5, want + 2 * DEV_RZ);
    void *m = b + DEV_RZ;
    *p = m;
    pthread_mutex_lock(&g_lock);
    g_allocated += n;
    g_sizes[m] = n;
    dev_alloc d;
    d.rz_lo = (uintptr_t)b;
    d.lo = (uintptr_t)m;
    d.hi = d.hi_eff = d.lo + n;
    d.rz_hi = d.lo + want + DEV_RZ;
    d.n = n;
    g_allocs[d.rz_lo] = d;
    pcache_flush();
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&g_lock);
    auto it = g_sizes.find(p);
    bool known = it != g_sizes.end();
    if (known) {
        g_allocated -= it->second;
        g_sizes.erase(it);
        g_allocs.erase((uintptr_t)p - DEV_RZ);
        g_requests.erase((uintptr_t)p);
        pcache_flush();
        pdl_barrier();   /* cudaFree waits for the device; the address may come back as another buffer */
    }
    pthread_mutex_unlock(&g_lock);
    if (!known) return g_last_error = cudaErrorInvalidValue;   /* not from cudaMalloc, or freed twice */
    free((char *)p - DEV_RZ);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    *p = NULL;
    if (n > DEVICE_MEMORY) return cudaErrorMemoryAllocation;
    if (posix_memalign(p, 4096, n ? n : 1) != 0) return cudaErrorMemoryAllocation;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot)
{
    *tot = DEVICE_MEMORY;
    *fr = DEVICE_MEMORY - g_allocated;
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    (void)k;
    pdl_barrier();
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k;
    if (!n) return cudaSuccess;
    return enqueue(st, NULL, [d, s, n]() { memmove(d, s, n); });
}
cudaError_t cudaMemset(void *d, int v, size_t n) { pdl_barrier(); memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st)
{
    return enqueue(st, NULL, [d, v, n]() { memset(d, v, n); });
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = new CUstream_st(); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) { (void)flags; return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { if (s) { delete s->capture; delete s; } return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!stream_of(s)->capturing) pdl_barrier();
    return stream_of(s)->capturing ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    *st = stream_of(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    CUstream_st *st = stream_of(s);
    if (st->capturing) return g_last_error = cudaErrorIllegalState;
    st->capturing = true;
    delete st->capture;
    st->capture = new std::vector<node>();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    CUstream_st *st = stream_of(s);
    if (!st->capturing) return g_last_error = cudaErrorIllegalState;
    st->capturing = false;
    CUgraph_st *graph = new CUgraph_st();
    graph->nodes = std::move(*st->capture);
    delete st->capture;
    st->capture = NULL;
    *g = graph;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    CUgraphExec_st *x = new CUgraphExec_st();
    x->nodes = g->nodes;
    *e = x;
    return cudaSuccess;
}
/* Always an in-place update: the harness has no topology to keep. */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info)
{
    if (info) memset(info, 0, sizeof *info);
    e->nodes = g->nodes;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    cudaError_t before = g_last_error;
    g_last_error = cudaSuccess;
    for (const node &n : e->nodes) {
        cudaError_t r = replay(s, n);
        if (r != cudaSuccess) return r;
        if (g_last_error != cudaSuccess) return cudaGetLastError();
    }
    g_last_error = before;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new CUevent_st(); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) { (void)flags; return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; pdl_barrier(); return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { (void)a; (void)b; *ms = 0.0f; return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) { (void)s; (void)e; (void)flags; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v) { (void)f; (void)a; (void)v; return cudaSuccess; }
/* Occupancy: the harness has no register file; it answers as an SM with 2048 threads and no
 * other limit would (16 blocks of 128), which only sizes split-k choices (tests force splits). */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f, int block, size_t smem,
                                                                   unsigned int flags)
{
    (void)f; (void)smem; (void)flags;
    if (block <= 0) return g_last_error = cudaErrorInvalidValue;
    *n = 2048 / block < 32 ? 2048 / block : 32;
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int block, size_t smem)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0);
}

/* ---- cuBLASLt: present, but never has an algorithm ----------------------------------------------- */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)malloc(16); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
const char *cublasLtGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED (cuBLASLt does not run in the CPU harness)"
                                            : "cuBLASLt status";
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t t)
{
    (void)c; (void)t;
    *d = (cublasLtMatmulDesc_t)calloc(1, sizeof **d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { free(d); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *b,
                                              size_t n)
{
    (void)d; (void)a; (void)b; (void)n;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t r, uint64_t c, int64_t ld)
{
    (void)t; (void)r; (void)c; (void)ld;
    *l = (cublasLtMatrixLayout_t)calloc(1, sizeof **l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(const cublasLtMatrixLayout_t l) { free(l); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = (cublasLtMatmulPreference_t)calloc(1, sizeof **p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(const cublasLtMatmulPreference_t p) { free(p); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *b, size_t n)
{
    (void)p; (void)a; (void)b; (void)n;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int want,
                                              cublasLtMatmulHeuristicResult_t *res, int *found)
{
    (void)h; (void)op; (void)a; (void)b; (void)c; (void)d; (void)pref; (void)want; (void)res;
    *found = 0;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wss, cudaStream_t s)
{
    (void)h; (void)op; (void)alpha; (void)A; (void)la; (void)B; (void)lb; (void)beta; (void)C; (void)lc; (void)D;
    (void)ld; (void)algo; (void)ws; (void)wss; (void)s;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* ---- emu.h ----------------------------------------------------------------------------------------- */
size_t pln_emu_launch_count(void) { return g_log.count; }
const pln_emu_launch_rec *pln_emu_launch_at(size_t i) { return i < g_log.recs.size() ? &g_log.recs[i] : NULL; }
void pln_emu_launch_reset(void)
{
    pthread_mutex_lock(&g_lock);
    g_log.recs.clear();
    g_log.count = 0;
    pthread_mutex_unlock(&g_lock);
}
size_t pln_emu_report_count(void) { return g_report_count; }
const char *pln_emu_last_report(void) { return g_last_report; }
void pln_emu_report_reset(void)
{
    g_report_count = 0;
    g_last_report[0] = 0;
}
const char *pln_emu_not_exercised(void)
{
    return "CUDA backend on the CPU harness: every in-house kernel runs thread by thread; cuBLASLt and NCCL are NOT "
           "exercised (cuBLASLt finds no algorithm, so its shapes run on the plain kernel; all-reduces go over MPI)";
}
}
