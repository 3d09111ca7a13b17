/* loader.cuh — streams a byte range of a file into device memory: large reads (O_DIRECT where
 * the file system allows it) into two pinned buffers, each copied to the device asynchronously
 * while the other is being filled. */
#ifndef PLN_CUDA_LOADER_CUH
#define PLN_CUDA_LOADER_CUH

#include "kernels/cuda/common.cuh"

/* Bytes per pinned buffer (two are used). */
#define PLN_LOAD_CHUNK ((size_t)64 << 20)

/* Copies nbytes at offset off of path into dst (device). *rate = bytes/s over the whole call.
 * Waits until the data is on the device. -1 with an error naming the file otherwise. */
int pln_cuda_load_file(pln_cuda_ctx *c, void *dst, const char *path, uint64_t off, uint64_t nbytes, double *rate);

#endif
