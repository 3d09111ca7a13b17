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
/* True when a launcher started this process as one of several ranks (what pln_comm_init looks
 * for): OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS (MPICH/Intel MPI
 * hydra), MV2_COMM_WORLD_SIZE, I_MPI_RANK, or srun's SLURM_STEP_ID + SLURM_PROCID + SLURM_NTASKS. */
bool pln_comm_launched(void);
/* The MPI pollen was built with: "open-mpi", "mpi" (another one, e.g. MPICH), or NULL when it was
 * built without MPI (every process is then a single rank). */
const char *pln_comm_mpi_kind(void);
int pln_comm_rank(const pln_comm *c);
int pln_comm_size(const pln_comm *c);
/* The rank's index on its node (for picking a GPU) and the ranks on that node: from MPI's
 * shared-memory split (MPI_COMM_TYPE_SHARED, the node as the launcher placed the ranks), else from
 * the launcher's environment (pln_comm_env_local_rank), else 0 of 1. */
int pln_comm_local_rank(const pln_comm *c);
int pln_comm_local_size(const pln_comm *c);
/* The node-local rank a launcher advertises in the environment, first found of:
 * OMPI_COMM_WORLD_LOCAL_RANK (Open MPI mpirun), PMIX_LOCAL_RANK (PMIx launchers), SLURM_LOCALID
 * (Slurm srun, with PMIx or PMI2), MPI_LOCALRANKID (MPICH/Intel MPI Hydra), MV2_COMM_WORLD_LOCAL_RANK
 * (MVAPICH2), PALS_LOCAL_RANKID (Cray PALS). get looks a name up (getenv in production). Returns
 * the value (>= 0) and sets *var to the variable's name, or -1 (and *var NULL) when none is set or
 * the first one set is not a whole non-negative integer. Pure apart from get. */
int pln_comm_env_local_rank(const char *(*get)(const char *name), const char **var);
/* One line saying where this rank runs and how its local rank was found, e.g.
 * "rank 1 of 4 (pid 4242) on node n2: local rank 1 of 2 (MPI node split; OMPI_COMM_WORLD_LOCAL_RANK=1)". */
void pln_comm_describe(const pln_comm *c, char *buf, size_t n);
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

/* Waiting. Host collectives are started nonblocking and completed by polling: a short spin, then
 * yielding the core, then sleeps that back off to 1 ms (2 ms once a wait passes 100 ms). A rank
 * waiting for work therefore uses about 1 % of a core or less, and ranks that share a core
 * (oversubscribed, or bound to the same core by launchers on different "nodes" of one machine)
 * hand it to each other instead of spinning out their time slices; the first message after an idle spell is seen within about 2 ms.
 *
 * Step watchdog: after pln_comm_step_begin(c, bound_s) (bound_s > 0) every collective must
 * complete within bound_s seconds of that call, until pln_comm_step_end(c). When one does not,
 * it fails with a message naming the ranks that never arrived at it (rank 0 learns who has
 * arrived from small reports that ranks waiting longer than a few tens of milliseconds send it),
 * and the comm is broken: every later call fails at once with that same message, and
 * pln_comm_free aborts the whole job (MPI_Abort) instead of finalizing, so every rank exits
 * non-zero. An MPI error in a collective (a peer that died) breaks the comm the same way. */
void pln_comm_step_begin(pln_comm *c, double bound_s);
void pln_comm_step_end(pln_comm *c);
/* True once a collective timed out or failed (see above). */
bool pln_comm_broken(const pln_comm *c);

/* Finalizes MPI if it was started; aborts the job (every rank, exit status 3) when the comm is
 * broken, since peers stuck in a collective can never finalize. */
void pln_comm_free(pln_comm *c);

#endif
