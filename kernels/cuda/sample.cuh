/* sample.cuh — logits processing and per-row top-k on the GPU, so only k candidates per row
 * (plus the row's max and sum of exponentials, for top-p and log-probabilities) leave the device
 * and cross ranks. */
#ifndef PLN_CUDA_SAMPLE_CUH
#define PLN_CUDA_SAMPLE_CUH

#include "kernels/cuda/common.cuh"

/* In place on F32 logits [S, vn] of the vocab slice [v0, v0 + vn): repetition penalty over each
 * row's seen ids, then temperature. */
int pln_cuda_logit_process(pln_cuda_ctx *c, float *logits, int64_t v0, int64_t vn, const pln_logit_proc *p);
/* Per row the k largest (ties: lower id first), global ids, row max and sum(exp(l - max)).
 * Outputs are host arrays; waits for the stream. */
int pln_cuda_topk(pln_cuda_ctx *c, const float *logits, int32_t S, int64_t vn, int64_t v0, int32_t k,
                  float *vals, int32_t *ids, float *row_max, float *row_sumexp);

#endif
