/* cuda_backend.cu — the CUDA backend: device, stream, memory, and the op table of
 * kernels/backend.h wired to the fused kernels of kernels/cuda/ (one op.cu + op.cuh each). */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

#include <stdlib.h>
#include <string.h>

struct pln_cuda {
    int device;
    cudaStream_t stream;
};

static const char cuda_name[] = "cuda";

extern "C" int pln_cuda_device(pln_backend *be)
{
    if (!be || be->name != cuda_name) return pln_errorf("pln_cuda_device: not a cuda backend");
    return ((pln_cuda *)be->impl)->device;
}

extern "C" void *pln_cuda_stream(pln_backend *be)
{
    if (!be || be->name != cuda_name) { pln_errorf("pln_cuda_stream: not a cuda backend"); return NULL; }
    return (void *)((pln_cuda *)be->impl)->stream;
}

extern "C" pln_backend *pln_backend_cuda_create(int device)
{
    pln_errorf("cuda backend (device %d): not available yet in this build", device);
    return NULL;
}
