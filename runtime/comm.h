/* comm.h — collectives between ranks: a single rank (no launcher), MPI (one process per rank
 * under mpirun/srun; CPU buffers), and NCCL for device buffers (its unique id broadcast over MPI).
 *
 * All calls are collective: every rank calls them in the same order. They return 0 or -1 with an
 * error. */
#ifndef PLN_COMM_H
#define PLN_COMM_H

#include "formats/common.h"
#include <stdbool.h>
#include <stddef.h>

typedef struct pln_comm pln_comm;
typedef struct pln_backend pln_backend;

/* Initializes MPI when launched by mpirun/srun (detected from the environment), else a single
 * rank. Never NULL (dies with a clear message if MPI fails to start). MPI runs at
 * MPI_THREAD_SERIALIZED: any one thread at a time may make the calls below. */
pln_comm *pln_comm_init(int *argc, char ***argv);
int pln_comm_rank(const pln_comm *c);
int pln_comm_size(const pln_comm *c);
/* The rank's index on its node (for picking a GPU). */
int pln_comm_local_rank(const pln_comm *c);
/* Binds device collectives to a backend (NCCL on CUDA). Call once after creating the backend. */
int pln_comm_attach_backend(pln_comm *c, pln_backend *be);
/* In-place sum of n elements of dtype (F32 or F16) in backend memory, on the backend's stream. */
int pln_comm_allreduce(pln_comm *c, void *buf, size_t n, pln_dtype dtype);
/* True when pln_comm_allreduce only enqueues work on the attached backend's stream (one rank, or
 * NCCL), so it can be recorded into a backend graph; false when it moves data through the host. */
bool pln_comm_allreduce_recordable(const pln_comm *c);
/* Host buffers. */
int pln_comm_bcast(pln_comm *c, void *buf, size_t nbytes, int root);
/* Gathers nbytes from every rank into recv [size * nbytes] on every rank. */
int pln_comm_allgather(pln_comm *c, const void *send, void *recv, size_t nbytes);
int pln_comm_barrier(pln_comm *c);
/* Finalizes MPI if it was started. */
void pln_comm_free(pln_comm *c);

#endif
