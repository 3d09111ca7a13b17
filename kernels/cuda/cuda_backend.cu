/* cuda_backend.cu — the CUDA backend: device selection and checks, stream, memory, and the op
 * table of kernels/backend.h wired to the fused kernels of kernels/cuda/ (one op.cu + op.cuh
 * each). fp16 activations and KV cache, fp32 accumulation and softmax. */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/graph.cuh"
#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/loader.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sample.cuh"
#include "kernels/cuda/swiglu.cuh"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char cuda_name[] = "cuda";
#define LT_WORKSPACE ((size_t)32 << 20)

pln_cuda_ctx *pln_cuda_ctx_of(pln_backend *be)
{
    if (!be || be->name != cuda_name) { pln_errorf("not a cuda backend"); return NULL; }
    return (pln_cuda_ctx *)be->impl;
}

extern "C" int pln_cuda_device(pln_backend *be)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    return c ? c->device : -1;
}

extern "C" void *pln_cuda_stream(pln_backend *be)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    return c ? (void *)c->stream : NULL;
}

extern "C" int pln_cuda_set_linear_path(pln_backend *be, int path)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    int old = (int)c->linear_path;
    c->linear_path = (pln_linear_path)path;
    return old;
}

extern "C" int pln_cuda_set_prefill_tiled(pln_backend *be, int on)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    int old = c->attn_tiled ? 1 : 0;
    c->attn_tiled = on != 0;
    return old;
}

extern "C" long long pln_cuda_set_attn_scratch(pln_backend *be, long long bytes)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    long long old = (long long)c->attn_scratch;
    c->attn_scratch = bytes > 0 ? (size_t)bytes : 0;
    return old;
}

extern "C" int pln_cuda_set_attn_splits(pln_backend *be, int splits)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1000000;
    int old = c->attn_splits;
    c->attn_splits = splits;
    return old;
}

int pln_cuda_pdl = 0;

extern "C" int pln_cuda_set_ln_split(pln_backend *be, int on)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    int old = c->ln_split;
    c->ln_split = on != 0;
    return old;
}

extern "C" int pln_cuda_set_pdl(pln_backend *be, int on)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    int old = pln_cuda_pdl;
    pln_cuda_pdl = on && c->cc_major >= PLN_CUDA_HOPPER_MAJOR;
    return old;
}

extern "C" int pln_cuda_set_gemv_splits(pln_backend *be, int splits)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    int old = c->gemv_splits;
    c->gemv_splits = splits > 0 ? splits : 0;
    return old;
}

static bool capturing(pln_cuda_ctx *c)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(c->stream, &st);
    return st != cudaStreamCaptureStatusNone;
}

void *pln_cuda_scratch(pln_cuda_ctx *c, size_t n)
{
#ifdef PLN_CUDA_EMU
    /* the CPU harness: the launches after this request may touch n bytes, not the whole buffer */
    if (n <= c->scratch_size) { pln_emu_scratch_request(c->scratch, n); return c->scratch; }
#else
    if (n <= c->scratch_size) return c->scratch;
#endif
    if (capturing(c)) {
        pln_errorf("cuda scratch: %zu bytes needed during graph capture (have %zu). HINT: run the step once "
                   "uncaptured before capturing it", n, c->scratch_size);
        return NULL;
    }
    size_t want = n + n / 4;
    void *p = NULL;
    if (pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) return NULL;
    if (pln_cuda_check(cudaMalloc(&p, want), "cudaMalloc(scratch)", __FILE__, __LINE__)) return NULL;
    if (c->scratch) cudaFree(c->scratch);
    c->scratch = p;
    c->scratch_size = want;
    c->epoch++;
#ifdef PLN_CUDA_EMU
    pln_emu_scratch_request(p, n);
#endif
    return p;
}

unsigned *pln_cuda_attn_counters(pln_cuda_ctx *c, size_t n)
{
    if (n <= c->attn_count_n) return c->attn_count;
    if (capturing(c)) {
        pln_errorf("cuda attention counters: %zu needed during graph capture (have %zu). HINT: run the step once "
                   "uncaptured before capturing it", n, c->attn_count_n);
        return NULL;
    }
    size_t want = n + n / 4 + 64;
    void *p = NULL;
    if (pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) return NULL;
    if (pln_cuda_check(cudaMalloc(&p, want * sizeof(unsigned)), "cudaMalloc(attention counters)", __FILE__, __LINE__))
        return NULL;
    if (pln_cuda_check(cudaMemset(p, 0, want * sizeof(unsigned)), "cudaMemset(attention counters)", __FILE__, __LINE__)) {
        cudaFree(p);
        return NULL;
    }
    if (c->attn_count) cudaFree(c->attn_count);
    c->attn_count = (unsigned *)p;
    c->attn_count_n = want;
    c->epoch++;
    return c->attn_count;
}

void *pln_cuda_host_pinned(pln_cuda_ctx *c, size_t n)
{
    if (n <= c->host_pinned_size) return c->host_pinned;
    void *p = NULL;
    if (pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) return NULL;
    if (pln_cuda_check(cudaHostAlloc(&p, n, cudaHostAllocDefault), "cudaHostAlloc", __FILE__, __LINE__)) return NULL;
    if (c->host_pinned) cudaFreeHost(c->host_pinned);
    c->host_pinned = p;
    c->host_pinned_size = n;
    return p;
}

/* Every entry point selects the backend's device first: a server thread other than the one
 * that created the backend may call in, and the current device is per thread. */
#define CTX(be) pln_cuda_ctx *c = (pln_cuda_ctx *)(be)->impl; cudaCheck(cudaSetDevice(c->device))

/* ---- memory ------------------------------------------------------------------------------ */
static void *cu_alloc(pln_backend *be, size_t nbytes)
{
    pln_cuda_ctx *c = (pln_cuda_ctx *)be->impl;
    void *p = NULL;
    if (pln_cuda_check(cudaSetDevice(c->device), "cudaSetDevice", __FILE__, __LINE__)) return NULL;
    cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        char a[32], b[32];
        pln_errorf("cuda alloc of %s on device %d failed (%s free): %s. HINT: %s", pln_human_bytes((double)nbytes, a, sizeof a),
                   c->device, pln_human_bytes((double)fr, b, sizeof b), cudaGetErrorString(e), pln_cuda_hint(e));
        return NULL;
    }
    return p;
}

static void cu_free(pln_backend *be, void *p)
{
    if (!p) return;
    pln_cuda_ctx *c = (pln_cuda_ctx *)be->impl;
    cudaSetDevice(c->device);
    cudaFree(p);
}

static int cu_upload(pln_backend *be, void *dst, const void *src, size_t n)
{
    CTX(be);
    if (n) cudaCheck(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

static int cu_download(pln_backend *be, void *dst, const void *src, size_t n)
{
    CTX(be);
    if (n) cudaCheck(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream));
    cudaCheck(cudaStreamSynchronize(c->stream));
    return 0;
}

static int cu_memset0(pln_backend *be, void *dst, size_t n)
{
    CTX(be);
    if (n) cudaCheck(cudaMemsetAsync(dst, 0, n, c->stream));
    return 0;
}

static int cu_sync(pln_backend *be)
{
    CTX(be);
    cudaCheck(cudaStreamSynchronize(c->stream));
    return 0;
}

/* dst NULL: allocates the device copy (the caller frees it with be->free). */
static const void *cu_weights_from_host(pln_backend *be, void *dst, const void *src, size_t n)
{
    pln_cuda_ctx *c = (pln_cuda_ctx *)be->impl;
    if (pln_cuda_check(cudaSetDevice(c->device), "cudaSetDevice", __FILE__, __LINE__)) return NULL;
    if (!dst && !(dst = cu_alloc(be, n))) return NULL;
    if (pln_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream), "cudaMemcpyAsync(weights)",
                       __FILE__, __LINE__))
        return NULL;
    if (pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) return NULL;
    return dst;
}

static int cu_load_file(pln_backend *be, void *dst, const char *path, uint64_t off, uint64_t n, double *rate,
                        void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n), void *ctx)
{
    CTX(be);
    return pln_cuda_load_file(c, dst, path, off, n, rate, on_bytes, ctx);
}

/* ---- ops --------------------------------------------------------------------------------- */
static int cu_embed(pln_backend *be, void *out, const int32_t *ids, int32_t T, const uint16_t *table, int64_t v0,
                    int64_t vn, int64_t H)
{
    CTX(be);
    return pln_cuda_embed(c, out, ids, T, table, v0, vn, H);
}

static int cu_layernorm(pln_backend *be, void *out, const void *in, const uint16_t *gamma, const uint16_t *beta,
                        int32_t T, int64_t H, float eps)
{
    CTX(be);
    return pln_cuda_layernorm(c, out, in, gamma, beta, T, H, eps);
}

static int cu_residual_layernorm(pln_backend *be, void *x, const void *y, const uint16_t *bias, const uint16_t *gamma,
                                 const uint16_t *beta, void *ln_out, int32_t T, int64_t H, float eps)
{
    CTX(be);
    return pln_cuda_residual_layernorm(c, x, y, bias, gamma, beta, ln_out, T, H, eps);
}

static int cu_rmsnorm(pln_backend *be, void *out, const void *in, const uint16_t *gamma, int32_t T, int64_t H,
                      float eps)
{
    CTX(be);
    return pln_cuda_rmsnorm(c, out, in, gamma, T, H, eps);
}

static int cu_residual_rmsnorm(pln_backend *be, void *x, const void *y, const uint16_t *bias, const uint16_t *gamma,
                               void *ln_out, int32_t T, int64_t H, float eps)
{
    CTX(be);
    return pln_cuda_residual_rmsnorm(c, x, y, bias, gamma, ln_out, T, H, eps);
}

static int cu_rope(pln_backend *be, void *qkv, const pln_attn_meta *m, const float *inv_freq, int32_t n_head_local,
                   int32_t head_dim)
{
    CTX(be);
    return pln_cuda_rope(c, qkv, m, inv_freq, n_head_local, head_dim);
}

static int cu_swiglu(pln_backend *be, void *out, const void *in, int32_t T, int64_t I)
{
    CTX(be);
    return pln_cuda_swiglu(c, out, in, T, I);
}

static int cu_linear(pln_backend *be, void *out, const void *in, const pln_weight *W, const uint16_t *bias, int32_t T,
                     pln_epilogue epi)
{
    CTX(be);
    return pln_cuda_linear(c, out, false, in, W, bias, T, (int)epi, W->rows);
}

static int cu_kv_append(pln_backend *be, const void *qkv, void *k_cache, void *v_cache, const pln_attn_meta *m,
                        int32_t n_head_local, int32_t head_dim)
{
    CTX(be);
    return pln_cuda_kv_append(c, qkv, k_cache, v_cache, m, n_head_local, head_dim);
}

static int cu_attention(pln_backend *be, void *out, const void *qkv, const void *k_cache, const void *v_cache,
                        const pln_attn_meta *m, const float *slopes, int32_t n_head_local, int32_t head_dim)
{
    CTX(be);
    return pln_cuda_attention(c, out, qkv, k_cache, v_cache, m, slopes, n_head_local, head_dim);
}

static int cu_append_attention(pln_backend *be, void *out, const void *qkv, void *k_cache, void *v_cache,
                               const pln_attn_meta *m, const float *slopes, int32_t n_head_local, int32_t head_dim)
{
    CTX(be);
    return pln_cuda_append_attention(c, out, qkv, k_cache, v_cache, m, slopes, n_head_local, head_dim);
}

static int cu_gather_rows(pln_backend *be, void *out, const void *in, const int32_t *rows, int32_t n, int64_t H)
{
    CTX(be);
    return pln_cuda_gather_rows(c, out, in, rows, n, H);
}

static int cu_logits(pln_backend *be, float *out, const void *x, const pln_weight *W, int32_t S, int64_t n_valid)
{
    CTX(be);
    return pln_cuda_linear(c, out, true, x, W, NULL, S, PLN_EPI_NONE, n_valid);
}

static int cu_logit_process(pln_backend *be, float *logits, int64_t v0, int64_t vn, const pln_logit_proc *p)
{
    CTX(be);
    return pln_cuda_logit_process(c, logits, v0, vn, p);
}

static int cu_topk(pln_backend *be, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k, float *vals,
                   int32_t *ids, float *row_max, float *row_sumexp)
{
    CTX(be);
    return pln_cuda_topk(c, logits, S, vn, v0, k, vals, ids, row_max, row_sumexp);
}

static void cu_destroy(pln_backend *be)
{
    if (!be) return;
    pln_cuda_ctx *c = (pln_cuda_ctx *)be->impl;
    if (c) {
        cudaSetDevice(c->device);
        cudaStreamSynchronize(c->stream);
        pln_cuda_linear_release();
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->scratch) cudaFree(c->scratch);
        if (c->attn_count) cudaFree(c->attn_count);
        if (c->host_pinned) cudaFreeHost(c->host_pinned);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

/* Checks the device before anything is allocated, so the error says what is wrong with it. */
static int check_device(int device, cudaDeviceProp *prop)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess && access("/dev/nvidiactl", F_OK) != 0)
        return pln_errorf("cuda backend: no NVIDIA GPU or driver on this machine (/dev/nvidiactl is missing; CUDA "
                          "says: %s). HINT: use --backend cpu here", cudaGetErrorString(e));
    if (e != cudaSuccess)
        return pln_errorf("cuda backend: no usable CUDA device (%s). HINT: %s", cudaGetErrorString(e), pln_cuda_hint(e));
    if (n == 0) return pln_errorf("cuda backend: no CUDA device. HINT: %s", pln_cuda_hint(cudaErrorNoDevice));
    if (device < 0 || device >= n)
        return pln_errorf("cuda backend: device %d does not exist (%d visible). HINT: %s", device, n,
                          pln_cuda_hint(cudaErrorInvalidDevice));
    if (pln_cuda_check(cudaGetDeviceProperties(prop, device), "cudaGetDeviceProperties", __FILE__, __LINE__)) return -1;
    if (prop->major < PLN_CUDA_MIN_MAJOR)
        return pln_errorf("cuda backend: device %d is a %s (sm_%d%d); pollen's CUDA kernels need sm_80 or newer "
                          "(A100, H100, H200: fp16 tensor-core mma with fp32 accumulation). Use --backend cpu on this "
                          "machine", device, prop->name, prop->major, prop->minor);
    return 0;
}

extern "C" pln_backend *pln_backend_cuda_create(int device)
{
    cudaDeviceProp prop;
    if (check_device(device, &prop)) return NULL;
    pln_backend *be = (pln_backend *)calloc(1, sizeof *be);
    pln_cuda_ctx *c = (pln_cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be); free(c);
        pln_errorf("cuda backend: out of host memory");
        return NULL;
    }
    be->impl = c;
    be->name = cuda_name;
    be->nccl_capable = true;   /* device memory: NCCL all-reduces it, or the host stages it */
    c->device = device;
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    /* the environment's switches (formats/common.h ENV_NOTE) */
    bool no_gelu_epi = false, tiled = false, ln_split = false, pdl = true;
    long splits = 0;
    if (pln_env_flag("PLN_CUDA_NO_GELU_EPILOGUE", &no_gelu_epi) || pln_env_flag("PLN_CUDA_PREFILL_TILED", &tiled) ||
        pln_env_flag("PLN_CUDA_LN_SPLIT", &ln_split) || pln_env_flag("PLN_PDL", &pdl) ||
        pln_env_long("PLN_CUDA_ATTN_SPLITS", -1, 1024, &splits)) {
        pln_error_context("cuda backend");
        free(be); free(c);
        return NULL;
    }
    c->gelu_epilogue = !no_gelu_epi;
    c->attn_tiled = tiled;
    c->attn_splits = (int)splits;
    c->ln_split = ln_split;
    /* programmatic dependent launch needs sm_90; PLN_PDL=0 turns it off (to compare) */
    pln_cuda_pdl = prop.major >= PLN_CUDA_HOPPER_MAJOR && pdl;
    c->lt_ws_size = LT_WORKSPACE;
    be->destroy = cu_destroy;
    if (pln_cuda_check(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__) ||
        pln_cuda_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate", __FILE__, __LINE__) ||
        pln_cublas_check(cublasLtCreate(&c->lt), "cublasLtCreate", __FILE__, __LINE__) ||
        pln_cuda_check(cudaMalloc(&c->lt_ws, c->lt_ws_size), "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__)) {
        pln_error_context("cuda backend on device %d (%s)", device, prop.name);
        cu_destroy(be);
        return NULL;
    }
    be->act_size = 2;
    be->act_dtype = PLN_DTYPE_F16;
    be->kv_size = 2;
    be->kv_dtype = PLN_DTYPE_F16;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->memset0 = cu_memset0;
    be->sync = cu_sync;
    be->weights_from_host = cu_weights_from_host;
    be->load_file = cu_load_file;
    be->embed = cu_embed;
    be->layernorm = cu_layernorm;
    be->residual_layernorm = cu_residual_layernorm;
    be->rmsnorm = cu_rmsnorm;
    be->residual_rmsnorm = cu_residual_rmsnorm;
    be->rope = cu_rope;
    be->swiglu = cu_swiglu;
    be->linear_swiglu = true;
    be->linear = cu_linear;
    be->kv_append = cu_kv_append;
    be->attention = cu_attention;
    be->append_attention = cu_append_attention;
    be->gather_rows = cu_gather_rows;
    be->logits = cu_logits;
    be->logit_process = cu_logit_process;
    be->topk = cu_topk;
    be->graph_begin = pln_cuda_graph_op_begin;
    be->graph_end = pln_cuda_graph_op_end;
    be->graph_launch = pln_cuda_graph_op_launch;
    be->graph_free = pln_cuda_graph_op_free;
    be->graph_epoch = pln_cuda_graph_op_epoch;
    return be;
}
