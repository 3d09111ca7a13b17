/* cuda_backend.h — what the CUDA backend exposes beyond kernels/backend.h, callable from C:
 * its device and stream (for NCCL) and the decode-step CUDA graph helper.
 * Only built with PLN_HAVE_CUDA. */
#ifndef PLN_CUDA_BACKEND_H
#define PLN_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend.h"

/* The CUDA device index of a backend made by pln_backend_cuda_create, or -1 (with an error) if be
 * is not a cuda backend. */
int pln_cuda_device(pln_backend *be);
/* The backend's stream (a cudaStream_t), or NULL (with an error) if be is not a cuda backend. */
void *pln_cuda_stream(pln_backend *be);

/* Forces the linear kernel (0 auto, 1 GEMV, 2 GEMM/cuBLASLt, 3 plain) — for benchmarks and
 * tests; the backend starts on auto. Returns the previous value, or -1 if be is not cuda. */
int pln_cuda_set_linear_path(pln_backend *be, int path);
/* Prefill-heavy steps on the query-tiled attention kernel (1) or the split-key kernel (0, the
 * default until the GPU check has compared them; PLN_CUDA_PREFILL_TILED=1 also turns it on).
 * Returns the previous value, or -1 if be is not cuda. */
int pln_cuda_set_prefill_tiled(pln_backend *be, int on);

/* Bounds the split-key attention's partial states per launch (bytes; 0 = the default, 256 MiB):
 * longer steps run in token groups. For tests. Returns the previous value, or -1 if be is not
 * cuda. */
long long pln_cuda_set_attn_scratch(pln_backend *be, long long bytes);

/* The flash-decoding attention kernel (decode steps, docs/CUDA.md "Attention"): 0 = automatic
 * (decode-shaped steps, splits sized to fill the SMs), n > 0 = every step on it with n key splits
 * (for tests of the split edge cases), n < 0 = never (the split-key kernel everywhere).
 * PLN_CUDA_ATTN_SPLITS sets the start value. Returns the previous value, or -1000000 if be is not
 * cuda. */
int pln_cuda_set_attn_splits(pln_backend *be, int splits);

/* The fp16/int8 GEMV's and the int8/int4 GEMM's split of k over blocks: 0 = automatic (grids
 * too small to fill the GPU are split), n > 0 = n splits (at most one per k-step) for tests.
 * Returns the previous value, or -1 if be is not cuda. */
int pln_cuda_set_gemv_splits(pln_backend *be, int splits);

/* Programmatic dependent launch (docs/CUDA.md): on = 1 lets every later launch overlap the
 * previous kernel's tail (sm_90 and newer only: on sm_80 it stays off), 0 = plain launches. The
 * backend starts with it on for sm_90 unless PLN_PDL=0. Process-wide (the launch macro reads it);
 * graphs keep the setting they were captured with. Returns the previous value, or -1 if be is not
 * cuda. */
int pln_cuda_set_pdl(pln_backend *be, int on);

/* LayerNorm rows (layernorm, residual_layernorm) over several blocks of 1024 halves each, in two
 * launches (statistics per slice, then merge and normalize: docs/CUDA.md "LayerNorm"), instead of
 * one block per row: on = 1, off = 0 (the default; PLN_CUDA_LN_SPLIT=1 sets it on). Only rows of
 * a multiple of 8 halves on 16-byte aligned pointers; others keep the one-block kernels. Returns
 * the previous value, or -1 if be is not cuda. */
int pln_cuda_set_ln_split(pln_backend *be, int on);

/* Fills n elements of dt in device memory with seeded random values (F16/F32 uniform in
 * [lo, hi), I8 uniform in [-127, 127], I32 integers in [lo, hi)), on the backend's stream. */
int pln_cuda_fill_random(pln_backend *be, void *p, size_t n, pln_dtype dt, float lo, float hi, uint64_t seed);

/* ---- CUDA graphs for decode steps ------------------------------------------------------------
 * A decode step is ~600 small launches for BLOOM-176B; replaying them as one graph removes the
 * launch gaps. How the engine uses it, once shapes settle (same batch size):
 *   1. run the step once normally (this sizes the backend's scratch and cuBLASLt plans: nothing
 *      may allocate during capture);
 *   2. keep every per-step input in fixed device buffers (token ids, tok_seq, tok_pos, block
 *      table, sampling params), uploaded with be->upload BEFORE launching the graph — uploads
 *      and downloads are not part of the graph;
 *   3. capture with m->max_pos set to an upper bound (max_blocks * block_size): attention sizes
 *      its key splits from it, and splits past a token's position cost almost nothing;
 *   4. pln_cuda_graph_begin(be); enqueue the step's ops (embed .. logits, all-reduces included:
 *      NCCL collectives can be captured); pln_cuda_graph_end(be, &g) — a second end on the
 *      same g updates it in place when only pointers or sizes changed;
 *   5. each step: upload inputs, pln_cuda_graph_launch(be, g), then topk (which downloads).
 * Ops return errors during capture like any other time; on error call pln_cuda_graph_end to
 * leave capture mode and do not launch. */
typedef struct pln_cuda_graph pln_cuda_graph;
/* Starts capturing the ops this thread enqueues on be's stream. */
int pln_cuda_graph_begin(pln_backend *be);
/* Ends the capture. *g NULL: instantiates a new graph into *g; else updates *g in place (or
 * re-instantiates it when the captured topology changed). -1 with an error on failure. */
int pln_cuda_graph_end(pln_backend *be, pln_cuda_graph **g);
/* Enqueues the whole captured step on be's stream. */
int pln_cuda_graph_launch(pln_backend *be, pln_cuda_graph *g);
void pln_cuda_graph_destroy(pln_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif
