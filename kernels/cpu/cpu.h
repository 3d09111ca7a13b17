/* cpu.h — private to the CPU backend (the files of kernels/cpu/) and its tests.
 *
 * Every op has two implementations:
 *   - the reference (PLN_CPU_ISA_REF): plain, single-threaded C loops written to be read and
 *     trusted; it is what tests/test_kernels_cpu.c checks against double precision, and what the
 *     fast paths and the CUDA kernels are checked against;
 *   - the fast path: OpenMP across output rows / heads / tokens, with the inner loops ("micro
 *     kernels") taken from a table chosen at run time for the CPU (portable C, AVX2+FMA+F16C,
 *     AVX-512).
 * Threads: each backend has its own team size, used by every parallel region it runs (nothing
 * process-wide is set). Default: OpenMP's (OMP_NUM_THREADS, else the cores this process may run
 * on), except that several MPI ranks on one unbound machine (OMPI_COMM_WORLD_LOCAL_SIZE or
 * MPI_LOCALNRANKS > 1, no OMP_NUM_THREADS, affinity = all CPUs) split its cores between them
 * instead of each starting a thread per core. pln_cpu_set_threads overrides.
 * Activations are F32. The KV cache is F32 (kv_size 4) by default, the exact reference; F16
 * (kv_size 2, pln_backend_set_kv_dtype) halves its memory and the bytes decode attention reads:
 * kv_append rounds to nearest even and attention converts back exactly, so the only difference
 * from F32 is that rounding. */
#ifndef PLN_CPU_H
#define PLN_CPU_H

#include "kernels/backend.h"
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum {
    PLN_CPU_ISA_REF = 0,     /* reference loops, one thread */
    PLN_CPU_ISA_C,           /* portable C micro kernels, OpenMP */
    PLN_CPU_ISA_AVX2,        /* AVX2 + FMA + F16C */
    PLN_CPU_ISA_AVX512,      /* AVX-512F (+ F16C, FMA) */
    PLN_CPU_ISA_COUNT
} pln_cpu_isa;

/* The linear driver hands the micro kernels at most this many tokens at a time: their
 * activations stay in cache while a block of weight rows streams past, so each weight row is
 * read from memory once per PLN_CPU_TCHUNK tokens. */
#define PLN_CPU_TCHUNK 64

/* Steps of this many tokens or more (below PLN_CPU_PANEL_MIN) widen each 4-row block's weights
 * once per step into an L1 buffer that float tiles read (simd_avx2.c WIDEN_NOTE). */
#define PLN_CPU_WIDEN_MIN 2

/* The batched float path (gemm_panel): used from this many tokens (fewer would leave its 32-token
 * tiles part empty: at 16 and 24 tokens it measured 0.7-0.8x the tiles above on fp16 and int8;
 * a tier may start later for fp16 and per-row int8: panel_min_plain, pln_cpu_panel_min);
 * rows per call (the unit of parallel work); per-thread scratch in floats. */
#define PLN_CPU_PANEL_MIN 32
#define PLN_CPU_PANEL_ROWS 48
#define PLN_CPU_PANEL_SCRATCH (PLN_CPU_PANEL_ROWS * (128 + 256))
/* PANEL_PF_NOTE: while a panel call computes one block of its rows' columns it prefetches the
 * block after next (the next one is already on its way): one block ahead, the widening of each
 * block still waited on memory for a quarter of the panel's time with 32 tokens (fp16 [128256,
 * 2048], Llama-3.2-1B's tied output, Zen 5, 2 threads, `perf annotate`), two ahead for an eighth:
 * 32 tokens 52-54 -> 47 ms, 64 tokens 88 -> 80-84 ms, 256 tokens level. */
#define PANEL_PF_BLOCKS 2

/* Inner loops of one instruction set. All pointers are host memory; no alignment required. */
typedef struct {
    const char *name;
    /* out[t * ldo + r] = sum_k x[t * ldx + k] * w[r * K + k] for t < nt <= PLN_CPU_TCHUNK,
     * r < nr, K = cols. F16: w is the first of nr rows. I8: rows dequantized in registers,
     * w = q * scale[r * (K / group) + k / group] (scale points at the same first row). */
    void (*gemm_f16)(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                     const uint16_t *w, int64_t nr, int64_t K);
    void (*gemm_i8)(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                    const int8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K);
    /* Packed int4 (docs/FORMAT.md): w is the first of nr rows of K/2 bytes, w = q * scale[r *
     * (K / group) + k / group] with q = pln_i4_get(row, k); group % 32 == 0, K % group == 0. */
    void (*gemm_i4)(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                    const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K);
    /* The batched float path (AVX2 and AVX-512, NULL in the C tier; simd_avx512.c PANEL_NOTE,
     * simd_avx2.c PANEL_NOTE): from PLN_CPU_PANEL_MIN tokens the driver packs the activations
     * once, pack_x writing panels p0 <= p < p1 of 32 tokens each (xp + 32 p K: column k of the
     * panel's tokens at [32 k ..], tokens past nt zero; xp 64-byte aligned; the same layout in
     * both tiers), and gemm_panel computes out[t * ldo + i] for all nt tokens and rows r0 + i, i <
     * nr <= PLN_CPU_PANEL_ROWS, of W (any dtype, the same products as above), then adds bias + r0
     * (may be NULL) and applies GeLU if gelu; scratch: PLN_CPU_PANEL_SCRATCH floats, 64-byte
     * aligned, this thread's own. Each output is a sum over blocks of the tier's KC columns in
     * one fp32 accumulator, the block sums added in order: its bits depend on neither the
     * threads nor the number of tokens. */
    /* One token (decode) on the float path, not in batch-invariant mode (NULL where the tier
     * has none; simd_avx512.c GEMV_NOTE): out[i] = the products above for rows r0 + i, i < nr,
     * of W (any dtype), x one token's K floats. Rows are read one at a time, in order. */
    void (*gemv)(float *out, const float *x, const pln_weight *W, int64_t r0, int64_t nr);
    void (*pack_x)(float *xp, const float *x, int64_t ldx, int64_t nt, int64_t K, int64_t p0, int64_t p1);
    void (*gemm_panel)(float *out, int64_t ldo, const float *xp, int64_t nt, const pln_weight *W, int64_t r0,
                       int64_t nr, const uint16_t *bias, bool gelu, float *scratch);
    /* The tokens from which F16 and per-row int8 weights take gemm_panel, where more than
     * PLN_CPU_PANEL_MIN (0: PLN_CPU_PANEL_MIN; pln_cpu_panel_min): their tiles scale nothing per
     * group, so a tier may find them level with the panel at fewer tokens (AVX2 on Zen 3 did not,
     * measured in the model: simd_avx2.c PANEL_MIN_PLAIN). */
    int32_t panel_min_plain;
    /* The integer-dot path (pln_cpu_set_int_dot): activations quantized per block of 32 columns,
     * token-interleaved so that a tile of tokens finds its operands side by side: xq holds int8
     * column k of token t at xq[4 * ((k / 4) * ldq + t) + k % 4] (4-byte groups of columns, all nt
     * tokens' groups together, ldq = pln_cpu_q8_ldq(nt) >= nt apart), xs fp32 and xsum int32
     * [K / 32][ldq] (block b of token t at [b * ldq + t]: its scale, and its sum of xq for the
     * kernels that offset the weights to unsigned bytes). At nt = 1 these are plain rows. w is I8
     * (rows of K bytes) or, when i4, packed int4 (rows of K / 2 bytes), group % 32 == 0, nr <= 32.
     * For every block b the integer dot d = sum_{k in b} xq[t][k] * q[r][k] is exact; out[t * ldo
     * + r] = sum over b of d * (xs[t][b] * scale[r][32 b / group]) in fp32 (the tiers differ only
     * in summation order; per-row weights, one group, may apply the weight scale once at the end). */
    void (*gemm_q8)(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                    int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group, int64_t nr, int64_t K);
    /* The fewest tokens of int8 weights a step runs on gemm_q8 outside the batch-invariant mode
     * (0: 2); fewer take the float tiles, exact, as one int8 token always does (Q8_MIN_NOTE). */
    int32_t q8_min;
    /* int4 weights at 2 <= nt <= PLN_CPU_Q4N_MAX tokens on the integer-dot path without the repack
     * (NULL where the tier has none; the AVX-512 one runs the AVX2 one where the CPU lacks VNNI:
     * pln_cpu_has_q4n). Each token's bits are those the tier's int4 GEMV gives it alone. The
     * activations are plain rows, as quant_act writes them at nt = 1, one per token: token t's
     * xq at xq + t K, its block scales and sums at xs / xsum + t (K / 32). The result is
     * gemm_q8's definition. */
    void (*gemm_q4n)(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                     const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K);
    /* The integer-dot path's activations: tokens t0 <= t < t1 (token t at x + t K, K % 32 == 0),
     * quantized per block of 32 as pln_cpu_quant_act does, bit for bit, and written where gemm_q8
     * reads them for its ldq (4-byte groups at xq + 4 (g ldq + t), block scales and sums at [b ldq
     * + t]). Blocks outermost: a run of tokens fills each cache line of xq in one go. */
    void (*quant_act)(const float *x, int64_t K, int8_t *xq, float *xs, int32_t *xsum, int64_t ldq, int64_t t0,
                      int64_t t1);
    /* Attention over n contiguous cache rows of length d (one block's stretch, one head):
     * scores[i] = q · k[i*d ..], and o = o * c + sum_i p[i] * v[i*d ..]. */
    void (*dots)(float *scores, const float *q, const float *k, int64_t n, int64_t d);
    void (*weighted_sum)(float *o, float c, const float *p, const float *v, int64_t n, int64_t d);
    /* The same over an F16 cache: bit for bit what the F32 versions give on the converted rows. */
    void (*dots_f16)(float *scores, const float *q, const uint16_t *k, int64_t n, int64_t d);
    void (*weighted_sum_f16)(float *o, float c, const float *p, const uint16_t *v, int64_t n, int64_t d);
    /* The linear epilogue on one output row: o += bias (F16, may be NULL), then GeLU if gelu.
     * The SIMD GeLU is x / (1 + exp(-2u)), u = 0.79788456 x (1 + 0.044715 x²): the same function
     * as pln_gelu's tanh form, within a few ulp. */
    void (*bias_gelu)(float *o, const uint16_t *bias, int64_t n, bool gelu);
    /* sum_i exp(x[i] - mx) for a row whose max is mx (finite); -inf entries add nothing
     * (the SIMD versions: below 1e-37 each). */
    float (*sum_exp)(const float *x, int64_t n, float mx);
    /* x[i] = exp(x[i] - mx) in place for i < n, returns their sum (an attention stretch's
     * softmax numerators; mx >= every x[i], finite; the SIMD exp is the one of sum_exp). */
    float (*exp_sum)(float *x, int64_t n, float mx);
    /* An attention stretch's scores from its dots, in place: x[i] = x[i] * scale + slope * (j0 + i)
     * (the SIMD tiers may fuse the multiply-add: equal within one rounding); returns their max
     * (-inf when n == 0). */
    float (*score_max)(float *x, int64_t n, float scale, float slope, int32_t j0);
    /* SwiGLU's pass: out[i] = silu(g[i]) * u[i] for i < n (the SIMD SiLU is g / (1 + exp(-g)) with
     * the tier's exp: pln_silu within a few ulp). */
    void (*silu_mul)(float *out, const float *g, const float *u, int64_t n);
    /* The compute ceiling's loop (pln_cpu_fma_gflops): FMA_CHAINS independent chains of fp32
     * fused multiply-adds on the tier's widest vectors, iters steps each; returns the floating-
     * point operations done (2 per lane per FMA) and stores a value of the chains in *sink (so
     * that no compiler drops them). */
    double (*fma_chains)(int64_t iters, float *sink);
} pln_cpu_kernels;

/* Chains in fma_chains: enough to fill 2-3 FMA pipes of latency 4-5 (AVX2: 12 of the 16 ymm
 * registers; the others hold the operands). */
#define PLN_CPU_FMA_CHAINS 12

/* The step size from which linear.c runs W on the tier's gemm_panel (where it has one). */
static inline int32_t pln_cpu_panel_min(const pln_cpu_kernels *k, const pln_weight *W) {
    bool plain = W->dtype == PLN_DTYPE_F16 || (W->dtype == PLN_DTYPE_I8 && W->group == W->cols);
    return plain && k->panel_min_plain > PLN_CPU_PANEL_MIN ? k->panel_min_plain : PLN_CPU_PANEL_MIN;
}

/* Q8_MIN_NOTE: gemm_q8 repacks each 32-row chunk of int8 weights for the tokens of the call
 * (pln_cpu_q8_repack): 16 row streams read, a buffer written and read back. At a few tokens that
 * costs more than the integer dots save, and the float path's tiles (the weights widened once in
 * registers for every token) are faster; from a dozen tokens on the dots win. The tokens of int8
 * weights from which a step on the integer-dot path runs gemm_q8 (the batch-invariant mode takes
 * it at every step size, so that no step size changes a token's bits). */
static inline int32_t pln_cpu_q8_min(const pln_cpu_kernels *k) { return k->q8_min > 2 ? k->q8_min : 2; }

extern const pln_cpu_kernels pln_cpu_kernels_c;
#if defined(__x86_64__) || defined(__i386__)
extern const pln_cpu_kernels pln_cpu_kernels_avx2;
extern const pln_cpu_kernels pln_cpu_kernels_avx512;
#define PLN_CPU_X86 1
#endif

/* WORK_NOTE: the large buffers one linear call needs for its duration (the packed activations, the
 * quantized tokens and their scales, each thread's scratch and SwiGLU tile) are the backend's,
 * kept from call to call and grown when a call needs more (pln_cpu_work), not allocated and freed
 * by every call: allocated per call, a prefill's multi-MiB panels came from freshly mapped pages
 * whenever glibc mapped the allocation (and unmapped it on free), and the call paid the page
 * faults and zeroing. Llama-3.2-1B's fp16 down projection ([2048, 8192] x 512 tokens, the batched
 * float path, 2 threads, AVX-512, Zen 5 VM, 2026-12-05 09:27-09:31 UTC, quiet, `test_kernels_cpu
 * --bench-panel 512` before and after alternated, six runs each): 39.0-45.8 ms (median 42.4)
 * allocating per call, 38.8-44.2 (median 40.7) on kept buffers; the other shapes level. The
 * buffers hold the largest call's size for the backend's life (a prefill chunk's packed
 * activations: T x K floats), as llama.cpp keeps one work buffer sized for its largest op. A
 * backend's calls come from one thread at a time (the engine's); the OpenMP threads inside a call
 * share its buffers. */
typedef enum {
    PLN_CPU_WORK_X,       /* packed panels (batched float path) or quantized tokens (integer dot) */
    PLN_CPU_WORK_XS,      /* the quantized tokens' scales */
    PLN_CPU_WORK_XSUM,    /* the quantized tokens' sums */
    PLN_CPU_WORK_SCR,     /* each thread's gemm_panel scratch, THREAD_GAP_NOTE's stride apart */
    PLN_CPU_WORK_SU,      /* each thread's SwiGLU up tile, the same stride apart */
    PLN_CPU_WORK_N
} pln_cpu_work_slot;

typedef struct {
    pln_cpu_isa isa;
    const pln_cpu_kernels *k;    /* NULL for PLN_CPU_ISA_REF */
    struct { void *p; size_t n; } work[PLN_CPU_WORK_N];   /* WORK_NOTE */
    int n_threads;               /* 0: OpenMP's default team */
    bool int_dot;                /* int8/int4 weights: the integer-dot path (off by default;
                                    PLN_CPU_INT_DOT=1 or pln_cpu_set_int_dot) */
    bool batch_invariant;        /* no batched float path (pln_cpu_set_batch_invariant) */
    bool count_kinds;            /* pln_cpu_linear adds each one-token call's weight bytes to
                                    kind_bytes[its kind] (tune.c CPU_TUNE_MODEL_NOTE) */
    int64_t kind_bytes[PLN_TUNE_MAX_KINDS];
} pln_cpu;

static inline pln_cpu *pln_cpu_of(pln_backend *be) { return (pln_cpu *)be->impl; }

/* Slot s of c's work buffers (WORK_NOTE), at least bytes long and 64-byte aligned; its contents
 * are not kept when it grows. Dies on out-of-memory as pln_xmalloc does. */
void *pln_cpu_work(pln_cpu *c, pln_cpu_work_slot s, size_t bytes);

/* The best instruction set this CPU supports (PLN_CPU_ISA env var may lower it: "ref", "c",
 * "avx2", "avx512"). */
pln_cpu_isa pln_cpu_isa_best(void);
bool pln_cpu_isa_supported(pln_cpu_isa isa);
const char *pln_cpu_isa_name(pln_cpu_isa isa);
/* Threads of this backend's parallel regions (n <= 0: OpenMP's default). */
void pln_cpu_set_threads(pln_backend *be, int n);
/* The team size of an op's parallel region. Here, not in cpu_backend.c, so the ops below the
 * backend table need nothing from the file that builds it. */
static inline int pln_cpu_threads(const pln_cpu *c) {
    return c->n_threads > 0 ? c->n_threads : omp_get_max_threads();
}

/* Switches an existing CPU backend to isa (tests compare tiers). -1 + error if unsupported. */
int pln_cpu_set_isa(pln_backend *be, pln_cpu_isa isa);
/* The integer-dot path for int8 weights at steps of pln_cpu_q8_min+ tokens (prefill, batched
 * decode; 2+ in the batch-invariant mode) and int4 weights at every step (linear.c use_int_dot;
 * --int-dot, pln_engine_opts.int_dot): each token's activations are quantized per block of 32
 * columns to int8 (scale absmax / 127, round to nearest) and multiplied with the integer weights
 * in integer arithmetic (vpdpbusd with AVX-512 VNNI or AVX-VNNI, vpmaddubsw on AVX2), one fp32
 * scale product per block. Off by default: it adds
 * the activations' rounding (measured by test_kernels_cpu, tests/e2e_generate.sh and
 * docs/ARCHITECTURE.md) to the weights'; the float path stays the reference. The reference tier
 * (PLN_CPU_ISA_REF) never uses it. The default comes from PLN_CPU_INT_DOT=1. */
void pln_cpu_set_int_dot(pln_backend *be, bool on);
/* Batch invariance. By default, steps of PLN_CPU_PANEL_MIN tokens or more run the batched float
 * path (gemm_panel) and one-token steps the GEMV (gemv), whose sums are ordered differently from
 * the tiles' that the step sizes between use: a
 * token's results then depend, in the last bits (relative ~1e-6), on how many tokens share its
 * step (a batched prefill against each prompt alone, a prompt's suffix after a prefix-cache hit
 * against the whole prompt). On: the tiles for every step size, so the results are the same bits
 * whatever the batch, from one token up, for every weight kind, with the integer-dot path off or
 * on: steps of fewer than PLN_CPU_BI_MIN_TOKENS run as steps of that many, and no block of a
 * longer step is left with fewer (65 tokens: blocks of 60 and 5; linear.c), and int4
 * weights on the integer-dot path take gemm_q4n at every step size. Tested by
 * test_kernels_cpu, tests/test_engine.c and tests/e2e_share.sh. The default comes from
 * PLN_CPU_BATCH_INVARIANT=1. */
void pln_cpu_set_batch_invariant(pln_backend *be, bool on);
/* true: the integer-dot path uses vpmaddubsw even where the CPU has VNNI (set from
 * PLN_CPU_NO_VNNI=1 when a backend is created; tests flip it to cover both). */
extern bool pln_cpu_no_vnni;
/* The activation quantization of the integer-dot path, exposed for its test: x [K] (K % 32 == 0)
 * -> q [K], s [K / 32], sum [K / 32] (each block's sum of q). */
void pln_cpu_quant_act(const float *x, int64_t K, int8_t *q, float *s, int32_t *sum);
/* The same into gemm_q8's token-interleaved layout (the kernels' quant_act in plain C). */
void pln_cpu_quant_act_il(const float *x, int64_t K, int8_t *xq, float *xs, int32_t *xsum, int64_t ldq, int64_t t0,
                          int64_t t1);
/* Q8_LDQ_NOTE: the integer-dot layout's stride for nt tokens (cpu.h gemm_q8). Up to 16 tokens
 * their groups lie side by side (ldq = nt). Past that ldq is nt rounded up to an odd number of
 * 16-token cache lines: with ldq = nt = 512 the 4-column groups of one block were 2 KiB apart, a
 * tile's 128 lines of a stretch (simd_avx2.c Q8_KBLOCKS_NOTE) fell in 2 of the L1's 64 sets and
 * evicted one another before the next 8 rows (or the next tile of the line's 16 tokens) came
 * back to them. An odd number of lines apart they spread over every set: AVX2 with VNNI, the
 * tier's gemm_q8 alone on 32 rows x [2048] x 512 tokens, one Zen 5 core, 3.4 -> 4.8 vpdpbusd per
 * ns (whole shapes and Llama-3.2-1B prefill, with their commands: docs/ARCHITECTURE.md "The
 * integer-dot path"). Tried on that shape and not kept: each
 * token's dots in two chains (even and odd groups; no change), and each 4-token tile's stretch
 * copied to a compact buffer first (0.90-0.93x with this stride; with the stride of 2 KiB it
 * only traded the tile's misses for the copy's); the tokens laid out in groups of 16, each
 * group's lines in a row (the same speed as this stride, on both tiers, for a larger change). */
static inline int64_t pln_cpu_q8_ldq(int64_t nt) {
    if (nt <= 16) return nt;
    int64_t lines = (nt + 15) / 16;
    return 16 * (lines | 1);
}

/* THREAD_GAP_NOTE: the stride, in floats, from one thread's scratch to the next one's in an
 * allocation they share: its size rounded up to 64 KiB, plus 64 KiB between them. Packed back to
 * back (each thread's gemm_panel scratch PLN_CPU_PANEL_SCRATCH floats after the last one's), the
 * batched float path ran 18 % slower with two threads than as two one-thread processes on the
 * same two cores (Zen 5 VM, AVX2, the tier's gemm_panel alone on [3072, 2048] x 512 tokens:
 * 217-222 against 271 GFLOP/s) whenever the VM's prefill "swing" was on; a gap of 4-32 KiB
 * between the threads' buffers changed nothing, 48 KiB or more (or one allocation per thread)
 * gave 252-269 GFLOP/s in the same minutes. Llama-3.2-1B fp16 prefill in those minutes: AVX2
 * 101 -> 118-120 tokens/s, AVX-512 182-186 -> 208-209, batch 32 124 -> 143-144 (docs/
 * BENCHMARKS.md). Those minutes are the ones where the VM's two vCPUs sit far apart (NEIGHBOUR_NOTE);
 * the gap is cheap. */
static inline size_t pln_cpu_thread_stride(size_t floats) {
    const size_t g = (size_t)64 * 1024 / sizeof(float);
    return (floats + g - 1) / g * g + g;
}

/* NEIGHBOUR_NOTE: what one thread writes lies away from what another writes. On the 2-vCPU Zen 5
 * VM the two vCPUs sit, for seconds or minutes at a time, either near each other (a cache line
 * handed from one to the other in 37-65 ns by a long ping-pong, 20-45 ns as `pollen bench
 * --copy-only`'s best-of-three core-to-core figure) or far apart (155-210 ns). Far apart the
 * two-thread copy doubles (80-84 against 47-48 GB/s): each vCPU then has its own path to memory. Far apart, the FMA peak and each thread alone are unchanged, but two
 * threads writing neighbouring cache lines (each thread's scratch packed after the last one's:
 * THREAD_GAP_NOTE; row chunks of 32 outputs handed out one at a time, so that one token's outputs
 * alternate between the threads every 128 bytes) lose a quarter of their speed or more: the
 * integer-dot path's kernel on 2 threads (AVX2, [3072, 2048] x 128-512 tokens) ran 400-420 GOP/s
 * with its chunks dealt one at a time and 580-650 with each thread's chunks side by side, which
 * made no difference near (37-55 ns: 515-625 against 550-655). So row chunks are handed out
 * guided (each grab the chunks left over the threads: long runs first, single chunks at the end,
 * a descheduled thread's share still taken by the other): Llama-3.2-1B int4 g32 AVX2 prefill of
 * 256 tokens 194-206 -> 256-260 tokens/s far, 263 -> 275-282 near; batch 32 111-118 -> 128-130;
 * grouped int8 batch 8 67-71 -> 73-77 (old and new binary alternated). The batched float path's
 * rows (48-row panel calls, 2 a grab before) too: BLOOM bloom-560m fp16 (AVX-512) prefill 554-624
 * -> 566-614 tokens/s, 5 of 6 alternated pairs ahead, batch 32 273-311 -> 282-330 (4 of 6);
 * Llama-3.2-1B fp16 the same within noise. */

/* Tokens of int4 weights gemm_q4n takes (more: the repack tiles of gemm_q8, whose repack is
 * then shared by enough tokens; bloom-560m int4 steps measured gemm_q4n 2-6 % ahead at 16
 * tokens and 8 % behind at 32). */
#define PLN_CPU_Q4N_MAX 16
/* The batch-invariant mode runs steps of fewer tokens as steps of this many (linear.c): every
 * tier's kernels treat a batch of 5 or more like any larger one. */
#define PLN_CPU_BI_MIN_TOKENS 5
/* Whether the AVX-512 tier's own gemm_q4n can run here (AVX-512 VNNI + BW + VL, pln_cpu_no_vnni
 * unset); where not, it runs the AVX2 tier's. */
bool pln_cpu_has_q4n(void);

/* The batch-1 GEMVs' prefetch (simd_avx512.c PREFETCH_NOTE): the 4 cache lines
 * PLN_CPU_PF_AHEAD bytes past the sequential position `done` bytes into a 4-row tile, into L1.
 * always_inline: as a plain static inline, called from the always_inline target("avx512f...")
 * tiles, GCC 12 dropped every call (a function with no side effects to it) and batch-1 int8
 * decode ran 1.6x slower. */
#define PLN_CPU_PF_AHEAD_DEFAULT 8192
/* The distance in use: pln_cpu_linear sets it from pln_cpu_pf_by_kind for its weight's kind
 * before its threads start; every GEMV and tile reads it. Process-wide, as the CPU backend's
 * calls are: one linear at a time (an engine's steps run one after another). */
extern int64_t pln_cpu_pf_ahead;
#define PLN_CPU_PF_AHEAD pln_cpu_pf_ahead
/* PF_L2_NOTE: and the level it prefetches into, set beside it from the same value's low bit
 * (PLN_TUNE_PF_L2): false, L1 (prefetcht0); true, L2 (prefetcht1). On the 2-vCPU Intel Xeon VM
 * with AMX (family 6 model 167 as it reports itself), each GEMV streamed 8-22 % more into L2 than
 * into L1 at the same distance, up to or past a plain read of the same bytes (build/bench/gemv-bw --mib
 * 1024 --passes 3 --pf 0,8192,16384 against a build with every hint T1, then T2, 2026-12-05 22:05
 * UTC, quiet, 2 threads, 8 KiB: fp16 23.7 -> 27.4 GB/s, int8 per row 20.5 -> 25.0, int8 g32 22.8
 * -> 24.7, int4 g32 22.0 -> 25.7, int4 g128 22.3 -> 24.2; a plain read 25.7): each L1 prefetch
 * holds one of the core's few L1 fill buffers until its line arrives from memory, an L2 one a
 * slot of the larger L2 miss queue, and the line then reaches L1 from L2 in time. Whether that
 * pays is the machine's (the Zen 5 the defaults were chosen on streamed near its read at L1), so
 * it is a candidate of the calibration (tune.c), not a default. */
extern bool pln_cpu_pf_l2;
/* The fp16 tiles' distance (the multi-token tiles' first token tile, TILE_PF_NOTE; 0: no
 * prefetch), set beside it from pln_cpu_pf_by_kind[PLN_CPU_PF_F16B]. */
extern int64_t pln_cpu_pf_tiles;
#define PLN_CPU_PF_TILES pln_cpu_pf_tiles

/* The weight kinds whose GEMVs get a distance of their own (CPU_TUNE_NOTE: on one Zen 3 the
 * fp16 GEMV streamed fastest 1 KiB ahead and the int4 one 8 KiB ahead, each losing 15-35 % at
 * the other's distance), and the fp16 tiles of a few tokens (PLN_CPU_PF_F16B, TILE_PF_NOTE:
 * their prefetch ran slower on one Zen 3 and faster on one Zen 5), what kernels/cpu/tune.c
 * measured for each (the default until then), and their names in the cache file, `pollen bench`
 * and its JSON. */
typedef enum { PLN_CPU_PF_F16, PLN_CPU_PF_I8, PLN_CPU_PF_I8G, PLN_CPU_PF_I4, PLN_CPU_PF_F16B, PLN_CPU_PF_KINDS } pln_cpu_pf_kind;
extern int64_t pln_cpu_pf_by_kind[PLN_CPU_PF_KINDS];
extern const char *const pln_cpu_pf_kind_names[PLN_CPU_PF_KINDS];
static inline pln_cpu_pf_kind pln_cpu_pf_kind_of(const pln_weight *W) {
    if (W->dtype == PLN_DTYPE_F16) return PLN_CPU_PF_F16;
    if (W->dtype == PLN_DTYPE_U8) return PLN_CPU_PF_I4;
    return W->group > 0 && W->group < W->cols ? PLN_CPU_PF_I8G : PLN_CPU_PF_I8;
}
#ifdef PLN_CPU_X86
#include <xmmintrin.h>
/* One line of the batch-1 GEMVs' software prefetch, into the level pln_cpu_pf_l2 says (PF_L2_NOTE):
 * a branch the predictor learns once per call, since the hint of prefetch is an immediate. */
static inline __attribute__((always_inline)) void pln_cpu_pf(const void *p) {
    if (pln_cpu_pf_l2) _mm_prefetch((const char *)p, _MM_HINT_T1);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}
static inline __attribute__((always_inline)) void pln_cpu_pf_ahead4(const void *tile, int64_t done) {
    const char *p = (const char *)tile + PLN_CPU_PF_AHEAD + done;
    pln_cpu_pf(p);
    pln_cpu_pf(p + 64);
    pln_cpu_pf(p + 128);
    pln_cpu_pf(p + 192);
}
#endif

/* tune.c (CPU_TUNE_NOTE): the prefetch distances measured, in bytes (0: the line being read,
 * i.e. no software prefetch ahead), the rounds over them, and how close to the fastest the
 * default may be and still be kept. */
#define PLN_CPU_TUNE_N 7
/* the first this many candidates prefetch into L1: the fp16 tiles' (fp16_batch) choices */
#define PLN_CPU_TUNE_N_L1 6
#define PLN_CPU_TUNE_ROUNDS 3
/* The GEMVs' kinds: 5 %, not 2: on the 2-vCPU Zen 5 VM the measurement had put fp16 at 16 KiB, 2.6 % faster than
 * 8 KiB on its one 128 MiB weight (59.7 against 58.2 GB/s, 2026-12-04), and in the model the
 * Llama-3.2-1B fp16 batch-1 step then ran 26.2-26.7 tokens/s against 27.7-28.3 at 8 KiB
 * (2026-12-05 09:55 UTC, quiet, vCPUs far apart, `pollen bench <fp16 set> --batch 1 --steps 32`,
 * the cached distances and --cpu-tune off alternated seven times), and per-row int8, put at 16
 * KiB 2.8 % ahead, ran 46.8-47.0 against 47.2-48.2 tokens/s at 8 KiB: a gap of a few per cent on
 * the one weight is noise, or a property of that weight (one long stream), not of the model's
 * many smaller ones, each ending where its prefetch runs on past it. The gains the calibration
 * exists for are larger (Zen 3 fp16: 15-25 % at 1 KiB, CPU_TUNE_NOTE). The fp16 tiles' distance
 * (fp16_batch) keeps 2 %: measured on an 8-token linear, it agreed with the model (16 KiB, 4.4 %
 * ahead in the measurement; Llama-3.2-1B fp16 at batch 8 91-102 -> 100-106 tokens/s, the two
 * alternated the same way). */
#define PLN_CPU_TUNE_KEEP 0.05
#define PLN_CPU_TUNE_KEEP_TILES 0.02
extern const int64_t pln_cpu_tune_candidates[PLN_CPU_TUNE_N];
/* The candidate to use given each one's best time (secs[i] <= 0: not measured): the fastest,
 * unless dflt's time is within the fraction keep of it (PLN_CPU_TUNE_KEEP, or _TILES for the fp16
 * tiles). dflt when none was measured. */
int pln_cpu_tune_pick(const double *secs, int n, int dflt, double keep);
/* PLN_CPU_TUNE_KEEP_LEVEL: the L2 candidate (PF_L2_NOTE) replaces l1, the pick among the L1
 * distances, only when it is more than this fraction faster; else l1. secs as for pick. On the
 * Intel VM the 128 MiB test weight put int8 g32 5-9 % faster into L2, and in the model its
 * batch-1 step ran slower so (Llama-3.2-1B int8 g32: 17.8-18.2 tokens/s into L2, 18.4-19.6 into
 * L1, alternated three times, 2026-12-05 22:30 UTC, quiet), while fp16 measured 15-20 % faster
 * and gained 10-13 % in the model (10.0-10.4 -> 11.1-11.5 tokens/s), per-row int8 9-14 % and
 * 2-9 % (15.2-17.0 -> 16.7-17.4): a level switch must win by more than that disagreement. */
#define PLN_CPU_TUNE_KEEP_LEVEL 0.10
int pln_cpu_tune_level(const double *secs, int l1);
/* The backend's tune hook (kernels/backend.h pln_backend.tune). */
int pln_cpu_tune(pln_backend *be, const char *mode, pln_backend_tune *out);
/* And its tune_model hook (tune.c CPU_TUNE_MODEL_NOTE): a model whose one-token step reads fewer
 * than PLN_CPU_TUNE_MODEL_MIB MiB of weights keeps the test weight's distances (its step reads
 * more from the caches than from memory; PLN_CPU_TUNE_MODEL_MIB in the environment sets another
 * floor, 0 for the tests); a kind is tried when its weights are at least PLN_CPU_TUNE_MODEL_SHARE
 * of the step's. */
#define PLN_CPU_TUNE_MODEL_MIB 64
#define PLN_CPU_TUNE_MODEL_SHARE 0.10
int pln_cpu_tune_model(pln_backend *be, const char *mode, const char *model_key, int (*step)(void *ctx),
                       void *ctx, bool quiet, pln_backend_tune *out);

/* The integer-dot path's repack of nr <= 16 rows of I8 (or, when i4, packed int4) weights, K %
 * 32 == 0, into wp [K / 32][8][16][4] bytes (64-byte aligned, 16 K bytes): for block b, 4-column
 * group g and row r, the 4 bytes at wp + 512 b + 64 g + 4 r are columns 32 b + 4 g .. + 3 of row r
 * as unsigned q + 8 (int4) or q + 128 (int8); rows nr..15 are zero. AVX2 (simd_avx2.c): call it
 * only where the CPU has AVX2. */
void pln_cpu_q8_repack(uint8_t *wp, const void *w, bool i4, int64_t nr, int64_t K);
/* The same layout, int4 16 rows at a time with AVX-512F (call it only where the CPU has it; int8
 * goes to pln_cpu_q8_repack, AVX2). */
void pln_cpu_q8_repack_avx512(uint8_t *wp, const void *w, bool i4, int64_t nr, int64_t K);

/* ---- ops (one file each; the backend table in cpu_backend.c checks arguments first) ---- */
/* embed.c */
void pln_cpu_embed(pln_cpu *c, float *out, const int32_t *ids, int32_t T, const uint16_t *table,
                   int64_t v0, int64_t vn, int64_t H);
void pln_cpu_gather_rows(pln_cpu *c, float *out, const float *in, const int32_t *rows, int32_t n,
                         int64_t H);
/* layernorm.c */
void pln_cpu_layernorm(pln_cpu *c, float *out, const float *in, const uint16_t *gamma,
                       const uint16_t *beta, int32_t T, int64_t H, float eps);
void pln_cpu_residual_layernorm(pln_cpu *c, float *x, const float *y, const uint16_t *bias,
                                const uint16_t *gamma, const uint16_t *beta, float *ln_out,
                                int32_t T, int64_t H, float eps);
/* linear.c: rows [0, n_rows) of W only (logits uses n_rows = n_valid); PLN_EPI_SWIGLU: n_rows = W->rows
 * (even), out [T, n_rows / 2] at stride ldo (linear.c SWIGLU_NOTE). */
void pln_cpu_linear(pln_cpu *c, float *out, int64_t ldo, const float *in, const pln_weight *W,
                    int64_t n_rows, const uint16_t *bias, int32_t T, pln_epilogue epi);
/* rmsnorm.c */
void pln_cpu_rmsnorm(pln_cpu *c, float *out, const float *in, const uint16_t *gamma, int32_t T,
                     int64_t H, float eps);
void pln_cpu_residual_rmsnorm(pln_cpu *c, float *x, const float *y, const uint16_t *bias,
                              const uint16_t *gamma, float *ln_out, int32_t T, int64_t H, float eps);
/* rope.c: the grouped layout (m->n_kv_head > 0). -1 + error when out of memory. */
int pln_cpu_rope(pln_cpu *c, float *qkv, const pln_attn_meta *m, const float *inv_freq,
                 int32_t n_head, int32_t head_dim);
/* swiglu.c */
void pln_cpu_swiglu(pln_cpu *c, float *out, const float *in, int32_t T, int64_t I);
/* attention.c: f16 = the caches are F16 (else F32); either head layout (m->n_kv_head), slopes
 * NULL = no positional bias. */
void pln_cpu_kv_append(pln_cpu *c, const float *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head, int32_t head_dim, bool f16);
int pln_cpu_attention(pln_cpu *c, float *out, const float *qkv, const void *k_cache,
                      const void *v_cache, const pln_attn_meta *m, const float *slopes,
                      int32_t n_head, int32_t head_dim, bool f16);
/* sample.c */
int pln_cpu_logit_process(pln_cpu *c, float *logits, int64_t v0, int64_t vn,
                          const pln_logit_proc *p);
void pln_cpu_topk(pln_cpu *c, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k,
                  float *vals, int32_t *ids, float *row_max, float *row_sumexp);

#endif
