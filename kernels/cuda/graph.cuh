/* graph.cuh — the backend table's graph ops (kernels/backend.h: graph_begin .. graph_epoch),
 * implemented with stream capture over the helpers declared in cuda_backend.h. */
#ifndef PLN_CUDA_GRAPH_CUH
#define PLN_CUDA_GRAPH_CUH

#include "kernels/cuda/common.cuh"

int pln_cuda_graph_op_begin(pln_backend *be);
int pln_cuda_graph_op_end(pln_backend *be, void **g);
int pln_cuda_graph_op_launch(pln_backend *be, void *g);
void pln_cuda_graph_op_free(pln_backend *be, void *g);
uint64_t pln_cuda_graph_op_epoch(pln_backend *be);

#endif
