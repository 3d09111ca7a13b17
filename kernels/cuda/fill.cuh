/* fill.cuh — random device data without a host copy (benchmarks build BLOOM-176B-size weights
 * on the device in milliseconds, no files). */
#ifndef PLN_CUDA_FILL_CUH
#define PLN_CUDA_FILL_CUH

#include "kernels/cuda/common.cuh"

/* n elements of dt (F16: uniform in [lo, hi); I8: uniform in [-127, 127]; I32/F32 likewise
 * from lo/hi) from a counter-based hash of (seed, index): the same seed gives the same data. */
int pln_cuda_fill(pln_cuda_ctx *c, void *p, size_t n, pln_dtype dt, float lo, float hi, uint64_t seed);

#endif
