/* nccl.c — NCCL communicator per process, all-reduce in place on the cuda backend's stream. */
#include "kernels/cuda/nccl.h"
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(PLN_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "PLN_NCCL_ID_BYTES must match NCCL");

struct pln_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size;
};

/* Records "what: NCCL message (code). HINT: ..." and returns -1. */
static int nccl_fail(const char *what, ncclResult_t r)
{
    const char *hint = "set NCCL_DEBUG=INFO and rerun to see which rank or transport failed";
    if (r == ncclSystemError || r == ncclRemoteError)
        hint = "check that every rank can reach the others (NCCL_SOCKET_IFNAME, firewall) and that "
               "all ranks were started by the same mpirun; NCCL_DEBUG=INFO shows the transport";
    else if (r == ncclInvalidUsage || r == ncclInvalidArgument)
        hint = "every rank must call the collectives in the same order with the same count and dtype";
    return pln_errorf("%s: %s (ncclResult %d). HINT: %s", what, ncclGetErrorString(r), (int)r, hint);
}

int pln_nccl_get_unique_id(void *out, size_t cap)
{
    if (!out || cap < NCCL_UNIQUE_ID_BYTES)
        return pln_errorf("pln_nccl_get_unique_id: buffer of %zu bytes, need %d", cap,
                          NCCL_UNIQUE_ID_BYTES);
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail("ncclGetUniqueId", r);
    memcpy(out, id.internal, NCCL_UNIQUE_ID_BYTES);
    return NCCL_UNIQUE_ID_BYTES;
}

pln_nccl *pln_nccl_create(int rank, int size, const void *id, size_t id_len, pln_backend *be)
{
    if (!id || id_len != NCCL_UNIQUE_ID_BYTES) {
        pln_errorf("pln_nccl_create: unique id of %zu bytes, need %d (broadcast all of it from rank 0)",
                   id_len, NCCL_UNIQUE_ID_BYTES);
        return NULL;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        pln_errorf("pln_nccl_create: rank %d of %d is out of range", rank, size);
        return NULL;
    }
    int dev = pln_cuda_device(be);
    void *stream = pln_cuda_stream(be);
    if (dev < 0 || !stream) {
        pln_error_context("pln_nccl_create: NCCL needs the cuda backend");
        return NULL;
    }
    cudaError_t ce = cudaSetDevice(dev);
    if (ce != cudaSuccess) {
        pln_errorf("pln_nccl_create: cudaSetDevice(%d): %s", dev, cudaGetErrorString(ce));
        return NULL;
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, NCCL_UNIQUE_ID_BYTES);
    pln_nccl *n = pln_xcalloc(1, sizeof *n);
    ncclResult_t r = ncclCommInitRank(&n->comm, size, uid, rank);
    if (r != ncclSuccess) {
        nccl_fail("ncclCommInitRank", r);
        pln_error_context("pln_nccl_create: rank %d of %d on device %d", rank, size, dev);
        free(n);
        return NULL;
    }
    n->stream = (cudaStream_t)stream;
    n->rank = rank;
    n->size = size;
    return n;
}

int pln_nccl_allreduce(pln_nccl *n, void *buf, size_t count, pln_dtype dt)
{
    if (!n) return pln_errorf("pln_nccl_allreduce: no communicator");
    ncclDataType_t t;
    switch (dt) {
    case PLN_DTYPE_F32: t = ncclFloat32; break;
    case PLN_DTYPE_F16: t = ncclFloat16; break;
    case PLN_DTYPE_BF16: t = ncclBfloat16; break;
    default: return pln_errorf("pln_nccl_allreduce: dtype %s is not supported (F32, F16, BF16)",
                               pln_dtype_name(dt));
    }
    if (count == 0) return 0;
    ncclResult_t r = ncclAllReduce(buf, buf, count, t, ncclSum, n->comm, n->stream);
    if (r != ncclSuccess) return nccl_fail("ncclAllReduce", r);
    return 0;
}

void pln_nccl_destroy(pln_nccl *n)
{
    if (!n) return;
    ncclCommDestroy(n->comm);
    free(n);
}
