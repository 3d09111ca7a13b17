/* backend.h — the ops the BLOOM model is written against, once, for every backend.
 *
 * A backend is a table of functions over opaque device pointers (host memory on the CPU
 * backend, GPU memory on the CUDA backend). The model never looks inside a buffer: it sizes
 * activations with be->act_size and KV entries with be->kv_size, and moves data across only with
 * upload/download. All ops are enqueued in order on the backend's one stream; download and sync
 * wait for it. Ops return 0, or -1 with pln_errorf() (a CUDA launch failure, say): the server turns
 * that into a request error, never a crash.
 *
 * Conventions
 *   T   tokens in this step (all sequences' new tokens, concatenated)
 *   H   hidden size (full; replicated on every rank)
 *   activations are row-major [T, width] in the backend's act dtype (CPU: F32, CUDA: F16)
 *   LayerNorm weights and biases are F16 in backend memory.
 *   weights are row-major [out, in] as in Hugging Face (y = x · Wᵀ + b), F16 or I8 + F16 scales.
 *
 * The CPU backend (kernels/cpu) is the reference: every CUDA op is checked against it.
 */
#ifndef PLN_BACKEND_H
#define PLN_BACKEND_H

#include "formats/common.h"
#include <stdbool.h>
#include <stdint.h>

/* The low bit of a prefetch distance in pf_ahead (and in the CPU tune's cache): the GEMVs' software
 * prefetch goes into L2 (prefetcht1), not L1 (prefetcht0); the distance is the value without it
 * (kernels/cpu/cpu.h PF_L2_NOTE). */
#define PLN_TUNE_PF_L2 1
#define PLN_TUNE_MAX_CANDIDATES 8
#define PLN_TUNE_MAX_KINDS 5
/* What a backend's tune hook chose (pln_backend.tune). */
typedef struct {
    const char *source;     /* "off" (defaults), "cached" or "measured" (static string) */
    int n_kinds;            /* weight kinds with a distance of their own */
    const char *kind[PLN_TUNE_MAX_KINDS];   /* their names (static strings: "fp16", "int8", ...) */
    int64_t pf_ahead[PLN_TUNE_MAX_KINDS];   /* each kind's prefetch distance in bytes (batch-1 GEMVs;
                                               "fp16_batch": the fp16 tiles of 5-31 tokens, 0 none),
                                               its low bit PLN_TUNE_PF_L2 the level */
    double gbs[PLN_TUNE_MAX_KINDS][PLN_TUNE_MAX_CANDIDATES];   /* "measured": GB/s at each candidate */
    char warning[640];      /* "" or what went wrong with the cache (the run goes on) */
    /* tune_model (the distances tried on the model's own decode steps): NULL when it did not run
     * (off, no hook, a model too small to stream from memory, several ranks), "cached" or
     * "measured"; model_ms[k][i]: "measured", the best step in ms with kind k at candidate i (0:
     * not tried) */
    const char *model_source;
    double model_ms[PLN_TUNE_MAX_KINDS][PLN_TUNE_MAX_CANDIDATES];
} pln_backend_tune;

/* A linear layer's weight as the kernels consume it (the shard stores exactly this). */
typedef struct {
    pln_dtype dtype;        /* PLN_DTYPE_F16, PLN_DTYPE_I8, or PLN_DTYPE_U8 = packed int4 */
    int64_t rows;           /* out features */
    int64_t cols;           /* in features (int4: a multiple of 32) */
    const void *w;          /* [rows, cols] row-major, F16 or I8; int4: [rows, cols / 2] bytes in
                             * the packed layout of docs/FORMAT.md (pln_i4_get in pln_math.h) */
    const uint16_t *scale;  /* I8/int4: F16 [rows, cols / group] (group = cols for per-channel) */
    int64_t group;          /* I8/int4: input columns per scale; == cols for per-output-channel
                             * (int8 only); int4: a multiple of 32 */
} pln_weight;

/* Where each token of the step sits, for attention over the paged KV cache. All pointers are
 * device pointers (uploaded by the model); the scalar fields are host values.
 * KV cache: per layer one K pool and one V pool, each [n_blocks][n_head_local][block_size][head_dim]
 * in kv dtype. A sequence's key j lives in block block_table[s * max_blocks + j / block_size],
 * row j % block_size. Token t of the step belongs to sequence tok_seq[t] at position tok_pos[t]
 * (0-based, counting only that sequence's real tokens) and attends to keys 0..tok_pos[t]
 * (causal). ALiBi bias for key j is slope * j (softmax is shift-invariant, so this equals HF's
 * slope * (j - i) and its cumsum(mask)-1 positions: no padding exists here). */
typedef struct {
    int32_t n_tokens;            /* T */
    int32_t n_seqs;              /* S */
    int32_t block_size;
    int32_t max_blocks;          /* row stride of block_table */
    int32_t max_pos;             /* host: largest tok_pos + 1 in this step (sizes work) */
    const int32_t *tok_seq;      /* [T] */
    const int32_t *tok_pos;      /* [T] */
    const int32_t *block_table;  /* [S * max_blocks] */
    /* The head layout of qkv and of the cache (host value; 0 in every BLOOM step):
     *   0    BLOOM: qkv rows are per-head interleaved [n_head_local][3][head_dim], one KV head per
     *        q head (the cache holds n_head_local heads).
     *   > 0  grouped-query (Llama family): qkv rows are [q: n_head_local * head_dim |
     *        k: n_kv_head * head_dim | v: n_kv_head * head_dim]; the cache holds n_kv_head heads
     *        and q head h reads KV head h / (n_head_local / n_kv_head) (n_kv_head divides
     *        n_head_local). */
    int32_t n_kv_head;
    /* Sliding-window attention (host value; Mistral's sliding_window): > 0, token t attends only
     * to keys j with tok_pos[t] - window < j <= tok_pos[t] (transformers' mask: the token itself
     * and the window - 1 keys before it); 0 attends to every key 0..tok_pos[t]. The cache keeps
     * every key; the kernels skip the ones before the window. */
    int32_t window;
} pln_attn_meta;

/* Per-sequence logits processing, HF order: repetition penalty (divide positive, multiply
 * negative, once per distinct token seen), then temperature. Device pointers. */
typedef struct {
    int32_t n_rows;              /* S: rows of the logits buffer */
    const float *penalty;        /* [S] 1.0 = off */
    const float *inv_temperature;/* [S] 1.0 = off (greedy rows use 1.0) */
    const int32_t *seen_offsets; /* [S + 1] CSR offsets into seen_ids */
    const int32_t *seen_ids;     /* distinct token ids seen by each sequence (global ids) */
} pln_logit_proc;

/* What the linear op does to its result before storing it (the epilogue, while the tile is in
 * registers or cache). 0 and 1 are false and true: callers may still pass a bool for GeLU. */
typedef enum {
    PLN_EPI_NONE = 0,
    PLN_EPI_GELU = 1,      /* out = gelu(x · Wᵀ + b) (BLOOM's MLP, the tanh form) */
    /* The Llama MLP's gate: W is the fused [gate ; up] projection, rows [0, I) gate and [I, 2I)
     * up (I = W.rows / 2, the llama-tp-v1 layout), bias (if any) F16 [2I]; out is [T, I] with
     * out[t, i] = silu(g) * u, g and u row i and row I + i of (x · Wᵀ + b) as the backend's
     * activation dtype holds them: bit for bit what linear then swiglu gives. Only where the
     * backend sets linear_swiglu. */
    PLN_EPI_SWIGLU = 2,
} pln_epilogue;

typedef struct pln_backend pln_backend;
struct pln_backend {
    const char *name;            /* "cpu" or "cuda": for messages; code asks the fields below */
    bool host_memory;            /* buffers are host memory: collectives may read them directly
                                    (false: device memory, staged through the host without NCCL) */
    bool nccl_capable;           /* buffers are CUDA device memory that NCCL can all-reduce */
    size_t act_size;             /* bytes per activation element (4 on CPU, 2 on CUDA) */
    pln_dtype act_dtype;
    size_t kv_size;              /* bytes per KV-cache element */
    pln_dtype kv_dtype;
    void *impl;

    /* ---- memory ---- */
    void *(*alloc)(pln_backend *be, size_t nbytes);             /* NULL + error when out of memory */
    void (*free)(pln_backend *be, void *p);
    int (*upload)(pln_backend *be, void *dst, const void *src_host, size_t nbytes);
    int (*download)(pln_backend *be, void *dst_host, const void *src, size_t nbytes);  /* waits */
    int (*memset0)(pln_backend *be, void *dst, size_t nbytes);
    int (*sync)(pln_backend *be);
    /* Makes host bytes (a mapped shard) usable as backend memory: the CPU backend returns src
     * itself (zero copy); CUDA copies into dst (device). */
    const void *(*weights_from_host)(pln_backend *be, void *dst, const void *src, size_t nbytes);
    /* Streams nbytes at offset off of the file at path into dst (backend memory) with large reads
     * (CUDA: O_DIRECT where possible, pinned double buffers overlapped with async copies).
     * NULL on backends that use the mapping in place (CPU). Returns bytes/s achieved in *rate.
     * on_bytes, when not NULL, sees every byte of the range once, in order, from the host staging
     * buffer while it is being copied (at = offset within the range): checksums while loading. */
    int (*load_file)(pln_backend *be, void *dst, const char *path, uint64_t off, uint64_t nbytes,
                     double *rate, void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n),
                     void *ctx);

    /* ---- ops ---- */
    /* out[t] = table[ids[t] - v0] for v0 <= ids[t] < v0 + vn, else zeros (vocab-parallel).
     * table: F16 [vn, H]. ids: device int32 [T]. */
    int (*embed)(pln_backend *be, void *out, const int32_t *ids, int32_t T, const uint16_t *table,
                 int64_t v0, int64_t vn, int64_t H);
    /* out = LayerNorm(in) * gamma + beta over the last dim (fp32 statistics). out may equal in. */
    int (*layernorm)(pln_backend *be, void *out, const void *in, const uint16_t *gamma,
                     const uint16_t *beta, int32_t T, int64_t H, float eps);
    /* Fused: x += y + bias (bias F16 [H], may be NULL); then ln_out = LayerNorm(x). */
    int (*residual_layernorm)(pln_backend *be, void *x, const void *y, const uint16_t *bias,
                              const uint16_t *gamma, const uint16_t *beta, void *ln_out,
                              int32_t T, int64_t H, float eps);
    /* out[T, W.rows] = in[T, W.cols] · Wᵀ (+ bias F16 [W.rows] if not NULL), then the epilogue
     * epi (PLN_EPI_GELU: GeLU; PLN_EPI_SWIGLU: out[T, W.rows / 2], see pln_epilogue). */
    int (*linear)(pln_backend *be, void *out, const void *in, const pln_weight *W,
                  const uint16_t *bias, int32_t T, pln_epilogue epi);
    /* Splits qkv [T, n_head_local * 3 * head_dim] (per-head interleaved q,k,v) and appends each
     * token's k and v to the layer's cache at (tok_seq, tok_pos). */
    int (*kv_append)(pln_backend *be, const void *qkv, void *k_cache, void *v_cache,
                     const pln_attn_meta *m, int32_t n_head_local, int32_t head_dim);
    /* out[T, n_head_local * head_dim] = softmax(q·kᵀ/sqrt(d) + slope*j, causal) · v, fp32 softmax.
     * q is read from qkv (as above); keys/values from the cache (kv_append ran first).
     * slopes: device fp32 [n_head_local], this rank's heads. */
    int (*attention)(pln_backend *be, void *out, const void *qkv, const void *k_cache,
                     const void *v_cache, const pln_attn_meta *m, const float *slopes,
                     int32_t n_head_local, int32_t head_dim);
    /* out[n, H] = in[rows[i], H] for i < n (rows: device int32). */
    int (*gather_rows)(pln_backend *be, void *out, const void *in, const int32_t *rows, int32_t n,
                       int64_t H);
    /* logits F32 [S, vn] = x[S, H] · tableᵀ (the tied embedding slice, F16 [vn, H] or I8 with
     * scales via W). Rows >= n_valid (vocab padding) are set to -inf. */
    int (*logits)(pln_backend *be, float *out, const void *x, const pln_weight *W, int32_t S,
                  int64_t n_valid);
    /* In-place repetition penalty and temperature on F32 logits [S, vn] of vocab slice
     * [v0, v0+vn). */
    int (*logit_process)(pln_backend *be, float *logits, int64_t v0, int64_t vn,
                         const pln_logit_proc *p);
    /* Per row: the k largest logits (ties: lower id first) with their ids (global = v0 + local),
     * and the row's max and sum(exp(l - max)). Outputs are HOST arrays: vals/ids [S, k],
     * row_max/row_sumexp [S]. k <= vn. */
    int (*topk)(pln_backend *be, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k,
                float *vals, int32_t *ids, float *row_max, float *row_sumexp);

    /* ---- the Llama family's ops (NULL on a backend that does not run the family yet) ---- */
    /* out = RMSNorm(in) * gamma over the last dim: y = x * rsqrt(mean(x^2) + eps) in fp32, rounded
     * to the activation dtype, then times gamma (transformers' LlamaRMSNorm order). out may equal in. */
    int (*rmsnorm)(pln_backend *be, void *out, const void *in, const uint16_t *gamma, int32_t T,
                   int64_t H, float eps);
    /* Fused: x += y (+ bias F16 [H] if not NULL); then ln_out = RMSNorm(x) * gamma. */
    int (*residual_rmsnorm)(pln_backend *be, void *x, const void *y, const uint16_t *bias,
                            const uint16_t *gamma, void *ln_out, int32_t T, int64_t H, float eps);
    /* Rotary position embedding, in place on the q and k heads of qkv in the grouped layout
     * (m->n_kv_head > 0; rows [T, (n_head_local + 2 * n_kv_head) * head_dim]); v is untouched.
     * Token t's heads rotate by angle a_i = (float)tok_pos[t] * inv_freq[i] (fp32 product, fp32
     * cos/sin), pairs (i, i + head_dim/2) for i < head_dim/2 (transformers' rotate_half):
     *   x'_i = x_i cos a_i - x_{i+d/2} sin a_i,  x'_{i+d/2} = x_{i+d/2} cos a_i + x_i sin a_i.
     * inv_freq: device fp32 [head_dim / 2], rope scaling already folded in (linear: / factor;
     * llama3: per frequency). */
    int (*rope)(pln_backend *be, void *qkv, const pln_attn_meta *m, const float *inv_freq,
                int32_t n_head_local, int32_t head_dim);
    /* out[T, I] = silu(in[T, 0:I]) * in[T, I:2I]: in is the fused gate|up projection [T, 2I]. */
    int (*swiglu)(pln_backend *be, void *out, const void *in, int32_t T, int64_t I);
    /* true: linear takes PLN_EPI_SWIGLU (the model then runs no swiglu op: one pass less over the
     * [T, 2I] projection, one launch less per layer on CUDA). */
    bool linear_swiglu;
    /* kv_append, attention and append_attention take m->n_kv_head > 0 as the grouped layout above,
     * and slopes == NULL as no positional bias (rotary models). */

    /* ---- optional: step graphs (NULL on backends without them, such as the CPU) ----
     * graph_begin records, instead of running, the ops enqueued after it on this thread;
     * graph_end stops recording and makes *g replayable (*g NULL: a new graph; else *g is
     * updated in place). graph_launch replays every recorded op with the arguments it was
     * recorded with (device pointers included): the caller keeps per-step inputs in fixed buffers
     * and uploads them before the launch (uploads and downloads are never recorded). Nothing may
     * allocate while recording, so a step is run once unrecorded first. graph_end after a failed
     * op still ends recording (and returns -1). graph_epoch changes whenever the backend moves a
     * buffer of its own that recorded ops refer to (its scratch grew): a graph recorded under
     * another epoch must be recorded again. */
    int (*graph_begin)(pln_backend *be);
    int (*graph_end)(pln_backend *be, void **g);
    int (*graph_launch)(pln_backend *be, void *g);
    void (*graph_free)(pln_backend *be, void *g);
    uint64_t (*graph_epoch)(pln_backend *be);

    /* ---- optional: the KV-cache dtype (NULL: only the backend's own kv_dtype) ----
     * Switches kv_dtype/kv_size; call it through pln_backend_set_kv_dtype, before any KV cache is
     * allocated. */
    int (*set_kv_dtype)(pln_backend *be, pln_dtype dt);

    /* ---- optional: the integer-dot path for int8 / int4 weights (NULL: the backend has none) ----
     * on: activations quantized to int8 per block of 32 columns and multiplied in integer
     * arithmetic (the CPU backend: kernels/cpu/cpu.h pln_cpu_set_int_dot); off: the float path. */
    void (*set_int_dot)(pln_backend *be, bool on);
    bool int_dot;               /* what set_int_dot last chose (or the backend's default) */

    /* ---- optional: batch invariance (NULL: the backend has no such mode) ----
     * on: every token's results are the same bits whatever else shares its step (the CPU backend:
     * no batched float path, kernels/cpu/cpu.h pln_cpu_set_batch_invariant); off: the fastest
     * kernels for the step's size, which may differ in the last bits. */
    void (*set_batch_invariant)(pln_backend *be, bool on);
    bool batch_invariant;       /* what set_batch_invariant last chose (or the backend's default) */

    /* ---- optional: a per-machine calibration of the kernels' speed (NULL: the backend has none) ----
     * mode "auto" (the cached result for this machine, else measure and cache it), "off" or NULL
     * (the built-in defaults) or "redo" (measure again and update the cache). It changes speed only,
     * never a result. -1 + error on a bad mode or out of memory; cache trouble is a warning in
     * out->warning, never an error (the CPU backend: kernels/cpu/tune.c CPU_TUNE_NOTE). */
    int (*tune)(pln_backend *be, const char *mode, pln_backend_tune *out);
    /* After tune, on a loaded model: step(ctx) runs one batch-1 decode step of it (0, or -1 +
     * error); the backend runs it at each choice of the kinds the step's weights use and keeps
     * the fastest (the CPU backend: kernels/cpu/tune.c CPU_TUNE_MODEL_NOTE). model_key names the
     * model (its layout, shapes and dtype) beside the machine in the cache; mode as tune's. It
     * is called by one process alone (a step of several ranks would need every rank to make the
     * same calls). quiet: no line on stderr while it measures. -1 + error when a step failed or
     * on a bad mode, a warning in out->warning on cache trouble. */
    int (*tune_model)(pln_backend *be, const char *mode, const char *model_key, int (*step)(void *ctx),
                      void *ctx, bool quiet, pln_backend_tune *out);

    /* ---- optional: kv_append and attention as one op (NULL: the model runs the two) ----
     * The same results as kv_append then attention with the same arguments; a backend may fuse
     * them (the CUDA decode kernel writes each token's k and v while it attends). */
    int (*append_attention)(pln_backend *be, void *out, const void *qkv, void *k_cache, void *v_cache,
                            const pln_attn_meta *m, const float *slopes, int32_t n_head_local,
                            int32_t head_dim);

    void (*destroy)(pln_backend *be);
};

/* Creates a backend by name ("cpu", "cuda"). device: CUDA device index (ignored on CPU).
 * NULL + error if the name is unknown or the backend is not built / no device is present. */
pln_backend *pln_backend_create(const char *name, int device);
void pln_backend_destroy(pln_backend *be);
/* The KV cache's element type: the CPU backend keeps F32 (default, the exact reference) or F16;
 * CUDA only F16. 0 when be already uses dt or switched to it; -1 + error naming the backend and
 * what it supports otherwise. Call right after creating the backend. */
int pln_backend_set_kv_dtype(pln_backend *be, pln_dtype dt);
/* KV dtypes as --kv-dtype spells them: "f32", "f16" (else the dtype's own name). parse: 0, or
 * -1 + error naming opt, the bad value and the choices. */
const char *pln_kv_dtype_name(pln_dtype dt);
int pln_kv_dtype_parse(const char *opt, const char *s, pln_dtype *out);
/* Adds a backend under a new name for pln_backend_create (and so for --backend): a wrapper
 * around another backend, say. At most 8; -1 + error when full or the name is taken. */
int pln_backend_register(const char *name, pln_backend *(*create)(int device));

/* Backend constructors (kernels/cpu/cpu_backend.c, kernels/cuda/cuda_backend.cu). */
pln_backend *pln_backend_cpu_create(void);
/* Host memory bandwidth, the CPU backend's ceiling: a STREAM-style copy of two arrays of `bytes`
 * each over OpenMP's threads, counted as read + write bytes per second (GB/s), best of 5 after a
 * warm-up pass. For MBU figures in benchmarks. */
double pln_cpu_copy_gbs(size_t bytes);
/* The CPU backend's compute ceiling: fp32 fused multiply-adds per second (GFLOP/s, 2 per lane
 * per FMA) over OpenMP's threads, each running independent chains on the widest vectors of the
 * tier the backend dispatches to (pln_cpu_isa_best: PLN_CPU_ISA may lower it), best of 5 passes
 * of a few milliseconds after a warm-up. For the compute-bound figures of benchmarks (prefill,
 * large batches), as the copy is for the memory-bound ones. */
double pln_cpu_fma_gflops(void);
/* How far apart the first two CPUs this process may run on are: the nanoseconds a cache line
 * takes to go from one to the other, one way (two threads pinned to them hand a counter back and
 * forth, best of 3 runs of up to 10000 round trips each, 0.3 s at most in all). 0 where fewer
 * than two CPUs are allowed, a thread cannot be pinned, or no run ends within the 0.3 s. On a VM this changes with where the host
 * places the vCPUs; kernels/cpu/cpu.h NEIGHBOUR_NOTE says what it costs. */
double pln_cpu_c2c_ns(void);
/* One measurement of that copy on arrays the caller holds (n doubles each, already touched): best
 * of `passes` passes, GB/s. For a ceiling measured right beside each timed step. */
double pln_cpu_copy_pass_gbs(double *c, const double *a, size_t n, int passes);
/* The host CPU as a benchmark reports it beside its figures: CPUID's vendor and brand strings,
 * family / model / stepping in decimal as /proc/cpuinfo shows them (the extended fields folded
 * in), and the instruction set the CPU backend dispatches to (PLN_CPU_ISA may lower it). Where
 * the CPU does not say (not x86): "unknown" and -1. This function can't fail. */
typedef struct {
    char vendor[16];        /* "GenuineIntel", "AuthenticAMD", ... */
    char name[64];          /* "AMD EPYC 9454 48-Core Processor", spaces trimmed */
    int family, model, stepping;
    const char *isa;        /* "avx512", "avx2", "c" (static string) */
} pln_cpu_host;
void pln_cpu_host_describe(pln_cpu_host *out);
/* The CPU backend's environment switches (PLN_CPU_ISA, PLN_CPU_INT_DOT, PLN_CPU_BATCH_INVARIANT,
 * PLN_CPU_NO_VNNI): 0 when each is unset or takes a value it accepts, else -1 + pln_errorf naming
 * it (formats/common.h ENV_NOTE). pln_backend_cpu_create checks them; a command that measures the
 * machine without a backend (bench --copy-only) calls this itself. */
int pln_cpu_env_check(void);
#ifdef PLN_HAVE_CUDA
pln_backend *pln_backend_cuda_create(int device);
#endif
#if defined(PLN_HAVE_CUDA) && !defined(PLN_CUDA_EMU)
/* The shared object that holds the CUDA backend (kernels/cuda/ and NCCL), looked for in the
 * directory of the running executable; it alone links cudart, cuBLASLt and NCCL. */
#define PLN_CUDA_LIB_NAME "libpollen-cuda.so"
#define PLN_CUDA_LIB_DEPS "libcudart, libcublasLt, libcublas, libnccl"
/* A symbol of that library, opened on first use (once per process). NULL with an error naming
 * the library, the missing file and what to do when it or a CUDA library cannot be loaded. */
void *pln_cuda_lib_sym(const char *name);
#endif

#endif
