/* graph.cu — capture and replay of decode steps as CUDA graphs (see cuda_backend.h). */
#include "kernels/cuda/graph.cuh"
#include "kernels/cuda/cuda_backend.h"

#include <stdlib.h>

struct pln_cuda_graph {
    cudaGraphExec_t exec;
};

extern "C" int pln_cuda_graph_begin(pln_backend *be)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    /* Thread-local mode: other threads' unrelated CUDA calls (the server's) stay legal. */
    cudaCheck(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return 0;
}

extern "C" int pln_cuda_graph_end(pln_backend *be, pln_cuda_graph **g)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    cudaGraph_t graph = nullptr;
    cudaCheck(cudaStreamEndCapture(c->stream, &graph));
    int rc = 0;
    if (*g) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate((*g)->exec, graph, &info) != cudaSuccess) {
            cudaGetLastError();   /* clear the update failure: re-instantiate instead */
            cudaGraphExecDestroy((*g)->exec);
            (*g)->exec = nullptr;
            rc = pln_cuda_check(cudaGraphInstantiate(&(*g)->exec, graph, 0), "cudaGraphInstantiate", __FILE__, __LINE__);
        }
    } else {
        pln_cuda_graph *n = (pln_cuda_graph *)calloc(1, sizeof *n);
        if (!n) rc = pln_errorf("pln_cuda_graph_end: out of host memory");
        else if ((rc = pln_cuda_check(cudaGraphInstantiate(&n->exec, graph, 0), "cudaGraphInstantiate", __FILE__, __LINE__)))
            free(n);
        else *g = n;
    }
    cudaGraphDestroy(graph);
    return rc;
}

extern "C" int pln_cuda_graph_launch(pln_backend *be, pln_cuda_graph *g)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    if (!g || !g->exec) return pln_errorf("pln_cuda_graph_launch: no instantiated graph");
    cudaCheck(cudaGraphLaunch(g->exec, c->stream));
    return 0;
}

extern "C" void pln_cuda_graph_destroy(pln_cuda_graph *g)
{
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g);
}

/* ---- the backend table's graph ops ---------------------------------------------------------- */
int pln_cuda_graph_op_begin(pln_backend *be)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    cudaCheck(cudaSetDevice(c->device));
    return pln_cuda_graph_begin(be);
}

int pln_cuda_graph_op_end(pln_backend *be, void **g)
{
    pln_cuda_graph *cg = (pln_cuda_graph *)*g;
    int rc = pln_cuda_graph_end(be, &cg);
    *g = cg;
    return rc;
}

int pln_cuda_graph_op_launch(pln_backend *be, void *g)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    if (!c) return -1;
    cudaCheck(cudaSetDevice(c->device));
    return pln_cuda_graph_launch(be, (pln_cuda_graph *)g);
}

void pln_cuda_graph_op_free(pln_backend *be, void *g)
{
    (void)be;
    pln_cuda_graph_destroy((pln_cuda_graph *)g);
}

uint64_t pln_cuda_graph_op_epoch(pln_backend *be)
{
    pln_cuda_ctx *c = pln_cuda_ctx_of(be);
    return c ? c->epoch : 0;
}
