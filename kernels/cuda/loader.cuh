/* loader.cuh — streams a byte range of a file into device memory: large reads split over
 * several threads into two pinned buffers (formats/stream.h), each copied to the device
 * asynchronously while the other is being filled. O_DIRECT when the range is not already in the
 * page cache (no double copy, no cache pollution with 44 GB of weights); buffered reads when it
 * is (O_DIRECT would go back to the disk). PLN_LOAD_DIRECT=0/1 forces either. */
#ifndef PLN_CUDA_LOADER_CUH
#define PLN_CUDA_LOADER_CUH

#include "kernels/cuda/common.cuh"

/* Bytes per pinned buffer (two are used) and reader threads per buffer. */
#define PLN_LOAD_CHUNK ((size_t)64 << 20)
#define PLN_LOAD_THREADS 8

/* Copies nbytes at offset off of path into dst (device). *rate = bytes/s over the whole call.
 * on_bytes (optional) is called with each staged piece of the range, in order, while its copy to
 * the device runs. Waits until the data is on the device. -1 with an error naming the file
 * otherwise. */
int pln_cuda_load_file(pln_cuda_ctx *c, void *dst, const char *path, uint64_t off, uint64_t nbytes, double *rate,
                       void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n), void *ctx);

#endif
