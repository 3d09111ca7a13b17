/* nccl.h — the NCCL wrapper runtime/comm.c uses when the backend is cuda.
 *
 * One communicator per process (one process per GPU). Rank 0 calls pln_nccl_get_unique_id, the
 * caller broadcasts the bytes over MPI, then every rank calls pln_nccl_create with the same id.
 * Collectives run in place on the backend's stream, so they are ordered with the ops around
 * them and the host never waits. Only built with PLN_HAVE_CUDA (kernels/cuda/ is compiled only
 * where nvcc exists): callers guard their use with #ifdef PLN_HAVE_CUDA.
 *
 * Errors: -1 / NULL with pln_errorf() naming the NCCL call, its message and a hint. */
#ifndef PLN_NCCL_H
#define PLN_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "formats/common.h"
#include "kernels/backend.h"

/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES): the size to broadcast. */
#define PLN_NCCL_ID_BYTES 128

typedef struct pln_nccl pln_nccl;

/* Writes a fresh unique id into out (cap >= PLN_NCCL_ID_BYTES). Call on rank 0 only. Returns the
 * number of bytes written, or -1 with an error. */
int pln_nccl_get_unique_id(void *out, size_t cap);

/* Joins the communicator of size ranks identified by id (id_len == PLN_NCCL_ID_BYTES). be must be
 * a cuda backend: its device and stream are used for every collective. Collective: every rank
 * calls it. NULL with an error on failure. */
pln_nccl *pln_nccl_create(int rank, int size, const void *id, size_t id_len, pln_backend *be);

/* In-place sum of count elements of dt (F32, F16 or BF16) in device memory, enqueued on the
 * backend's stream (returns without waiting). 0, or -1 with an error. */
int pln_nccl_allreduce(pln_nccl *n, void *buf, size_t count, pln_dtype dt);

/* Destroys the communicator. NULL is fine. Never fails. */
void pln_nccl_destroy(pln_nccl *n);

#ifdef __cplusplus
}
#endif

#endif
