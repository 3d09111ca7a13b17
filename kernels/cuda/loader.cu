/* loader.cu — see loader.cuh. The file side (large parallel reads, O_DIRECT, alignment, end of
 * file, the buffered fallback) is formats/stream.c, tested on the CPU; this file supplies the
 * pinned buffers and the asynchronous copies to the device. */
#include "kernels/cuda/loader.cuh"

extern "C" {
#include "formats/stream.h"
}

#include <stdlib.h>
#include <string.h>

typedef struct {
    pln_cuda_ctx *c;
    char *dst;
    cudaEvent_t done[2];
    void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n);
    void *ctx;
} load_sink;

/* Buffer b may be refilled once its previous copy to the device has finished. */
static int sink_wait(void *ctx, int b)
{
    load_sink *k = (load_sink *)ctx;
    return pln_cuda_check(cudaEventSynchronize(k->done[b]), "cudaEventSynchronize", __FILE__, __LINE__);
}

static int sink_put(void *ctx, int b, uint64_t at, const void *p, size_t n)
{
    load_sink *k = (load_sink *)ctx;
    cudaCheck(cudaMemcpyAsync(k->dst + at, p, n, cudaMemcpyHostToDevice, k->c->stream));
    cudaCheck(cudaEventRecord(k->done[b], k->c->stream));
    /* The DMA only reads the buffer: checksumming it meanwhile overlaps the two. */
    if (k->on_bytes) k->on_bytes(k->ctx, at, p, n);
    return 0;
}

int pln_cuda_load_file(pln_cuda_ctx *c, void *dst, const char *path, uint64_t off, uint64_t nbytes, double *rate,
                       void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n), void *ctx)
{
    if (rate) *rate = 0.0;
    if (nbytes == 0) return 0;
    const double t0 = pln_now();
    load_sink k = {c, (char *)dst, {nullptr, nullptr}, on_bytes, ctx};
    pln_stream_opts o;
    memset(&o, 0, sizeof o);
    o.chunk = PLN_LOAD_CHUNK;
    o.threads = PLN_LOAD_THREADS;
    bool direct = false;   /* PLN_LOAD_DIRECT=0/1 forces it (formats/common.h ENV_NOTE); unset: -1, try */
    if (pln_env_flag("PLN_LOAD_DIRECT", &direct)) return -1;
    const char *force = getenv("PLN_LOAD_DIRECT");
    o.direct = force && *force ? direct : -1;
    o.wait = sink_wait;
    o.put = sink_put;
    o.ctx = &k;
    const size_t cap = PLN_LOAD_CHUNK + PLN_STREAM_ALIGN;
    int rc = -1;
    pln_stream_stats st;
    cudaError_t e = cudaHostAlloc(&o.buf[0], cap, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaHostAlloc(&o.buf[1], cap, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&k.done[0], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&k.done[1], cudaEventDisableTiming);
    if (!pln_cuda_check(e, "pinned load buffers", __FILE__, __LINE__) &&
        pln_stream_file(path, off, nbytes, &o, &st) == 0 &&
        !pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) {
        rc = 0;
        const double dt = pln_now() - t0;   /* the last copy's wait included */
        if (rate) *rate = dt > 0 ? (double)nbytes / dt : 0.0;
    }
    if (rc) cudaStreamSynchronize(c->stream);   /* no copy may still read the buffers freed below */
    for (int i = 0; i < 2; i++) {
        if (k.done[i]) cudaEventDestroy(k.done[i]);
        if (o.buf[i]) cudaFreeHost(o.buf[i]);
    }
    return rc;
}
