/* embed.cuh — vocab-parallel embedding lookup, and gathering activation rows. */
#ifndef PLN_CUDA_EMBED_CUH
#define PLN_CUDA_EMBED_CUH

#include "kernels/cuda/common.cuh"

/* out[t] = table[ids[t] - v0] when v0 <= ids[t] < v0 + vn, else zeros (the all-reduce over ranks
 * then assembles the full embedding). ids: device int32 [T]; table F16 [vn, H]. */
int pln_cuda_embed(pln_cuda_ctx *c, void *out, const int32_t *ids, int32_t T, const uint16_t *table,
                   int64_t v0, int64_t vn, int64_t H);
/* out[i] = in[rows[i]] for i < n (rows: device int32), rows of H halves. */
int pln_cuda_gather_rows(pln_cuda_ctx *c, void *out, const void *in, const int32_t *rows, int32_t n, int64_t H);

#endif
