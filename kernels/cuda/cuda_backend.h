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

#ifdef __cplusplus
}
#endif

#endif
