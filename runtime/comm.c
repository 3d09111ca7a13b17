/* comm.c — collectives between ranks: one rank without a launcher, MPI between processes started
 * by mpirun/srun (host buffers), and NCCL for device buffers when the CUDA backend is attached.
 *
 * MPI is started only when the environment says a launcher started us, so `pollen generate` on one
 * rank never needs mpirun. Every call is collective and keeps the same order on every rank. */
#include "runtime/comm.h"
#include "kernels/backend.h"
#include "kernels/pln_math.h"

#include <stdlib.h>
#include <string.h>

#if __has_include(<mpi.h>)
#include <mpi.h>
#define PLN_HAVE_MPI 1
#endif

#if defined(PLN_HAVE_CUDA) && __has_include("kernels/cuda/nccl.h")
#include "kernels/cuda/nccl.h"
#endif
#if defined(PLN_HAVE_CUDA) && defined(PLN_NCCL_ID_BYTES) && !defined(PLN_CUDA_EMU)   /* the CPU harness: MPI */
#define PLN_HAVE_NCCL 1
#endif

struct pln_comm {
    int rank, size, local_rank;
    bool mpi;                 /* MPI_Init_thread ran here (and MPI_Finalize is ours) */
    pln_backend *be;          /* attached backend (device buffers) */
#ifdef PLN_HAVE_NCCL
    pln_nccl *nccl;           /* NCCL communicator when the attached backend is CUDA */
#else
    void *nccl;
#endif
    void *host_buf;           /* staging for device buffers on backends without NCCL */
    size_t host_cap;
};

/* True when a launcher started this process as one of several ranks. */
static bool launched_by_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                 "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE", "I_MPI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    /* srun sets SLURM_STEP_ID and SLURM_PROCID for each task (an sbatch script alone does not). */
    return getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID") && getenv("SLURM_NTASKS");
}

#ifdef PLN_HAVE_MPI
static int mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return pln_errorf("MPI %s failed: %.*s", what, len, msg);
}

/* Sum of IEEE halves, for host F16 all-reduces (fp32 accumulation per pair). */
static void f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = pln_f32_to_f16(pln_f16_to_f32(a[i]) + pln_f16_to_f32(b[i]));
}
static MPI_Op g_f16_sum_op = MPI_OP_NULL;
#endif

pln_comm *pln_comm_init(int *argc, char ***argv) {
    pln_comm *c = pln_xcalloc(1, sizeof *c);
    c->size = 1;
    if (!launched_by_mpi()) return c;
#ifdef PLN_HAVE_MPI
    int provided = 0;
    /* SERIALIZED: the thread driving steps need not be the one that started MPI (a server may
     * run its scheduler on another thread); calls never overlap. */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        pln_die("MPI_Init_thread failed (launched by mpirun/srun, but MPI could not start)");
    if (provided < MPI_THREAD_SERIALIZED)
        fprintf(stderr, "pollen: warning: this MPI provides thread level %d < MPI_THREAD_SERIALIZED; "
                        "drive every step from the main thread\n", provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    c->mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &c->local_rank);
        MPI_Comm_free(&node);
    }
    MPI_Op_create(f16_sum, 1, &g_f16_sum_op);
#else
    (void)argc; (void)argv;
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    if (s && atoi(s) > 1)
        pln_die("started by an MPI launcher with %s ranks, but this pollen was built without MPI; "
                "install libopenmpi-dev (make deps) and rebuild", s);
#endif
    return c;
}

int pln_comm_rank(const pln_comm *c) { return c->rank; }
int pln_comm_size(const pln_comm *c) { return c->size; }
int pln_comm_local_rank(const pln_comm *c) { return c->local_rank; }

bool pln_comm_allreduce_recordable(const pln_comm *c) {
    return c->size == 1 || c->nccl != NULL;
}

int pln_comm_attach_backend(pln_comm *c, pln_backend *be) {
    c->be = be;
    if (c->size == 1 || strcmp(be->name, "cuda") != 0) return 0;
    /* PLN_NCCL=0: all-reduce through host memory over MPI instead. Slow, but it lets several
     * ranks share one GPU (NCCL refuses that), so TP > 1 can be checked on a one-GPU machine. */
    const char *nccl_env = getenv("PLN_NCCL");
    if (nccl_env && !strcmp(nccl_env, "0")) return 0;
#ifdef PLN_HAVE_NCCL
    uint8_t id[PLN_NCCL_ID_BYTES] = {0};
    int rc = 0;
    if (c->rank == 0 && pln_nccl_get_unique_id(id, sizeof id) < 0) rc = -1;
    /* Rank 0 sends the id (or a failure flag) so no rank waits forever in NCCL init. */
    int32_t ok = rc == 0;
    if (pln_comm_bcast(c, &ok, sizeof ok, 0) != 0) return -1;
    if (!ok) return c->rank == 0 ? -1 : pln_errorf("NCCL unique id failed on rank 0");
    if (pln_comm_bcast(c, id, sizeof id, 0) != 0) return -1;
    c->nccl = pln_nccl_create(c->rank, c->size, id, sizeof id, be);
    if (!c->nccl) return pln_error_context("NCCL init on rank %d of %d", c->rank, c->size);
    return 0;
#else
    /* Without NCCL, device buffers go through host staging over MPI (correct, not fast). */
    return 0;
#endif
}

#ifdef PLN_HAVE_MPI
static int mpi_allreduce_host(void *buf, size_t n, pln_dtype dtype) {
    MPI_Datatype dt = dtype == PLN_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = dtype == PLN_DTYPE_F32 ? MPI_SUM : g_f16_sum_op;
    /* MPI counts are int: reduce in chunks. */
    size_t esz = pln_dtype_size(dtype);
    for (size_t off = 0; off < n;) {
        size_t m = n - off > (size_t)1 << 30 ? (size_t)1 << 30 : n - off;
        if (mpi_check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)m, dt, op, MPI_COMM_WORLD), "Allreduce"))
            return -1;
        off += m;
    }
    return 0;
}
#endif

int pln_comm_allreduce(pln_comm *c, void *buf, size_t n, pln_dtype dtype) {
    if (dtype != PLN_DTYPE_F32 && dtype != PLN_DTYPE_F16)
        return pln_errorf("comm allreduce: dtype %s not supported (F32 or F16)", pln_dtype_name(dtype));
    if (c->size == 1 || n == 0) return 0;
#ifdef PLN_HAVE_NCCL
    if (c->nccl) return pln_nccl_allreduce(c->nccl, buf, n, dtype);
#endif
#ifdef PLN_HAVE_MPI
    if (c->be && strcmp(c->be->name, "cpu") != 0) {
        /* Device memory without NCCL: stage through the host. */
        size_t nb = n * pln_dtype_size(dtype);
        if (nb > c->host_cap) { free(c->host_buf); c->host_buf = pln_xmalloc(nb); c->host_cap = nb; }
        if (c->be->download(c->be, c->host_buf, buf, nb)) return -1;
        if (mpi_allreduce_host(c->host_buf, n, dtype)) return -1;
        return c->be->upload(c->be, buf, c->host_buf, nb);
    }
    return mpi_allreduce_host(buf, n, dtype);
#else
    return pln_errorf("comm allreduce: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_bcast(pln_comm *c, void *buf, size_t nbytes, int root) {
    if (c->size == 1 || nbytes == 0) return 0;
#ifdef PLN_HAVE_MPI
    for (size_t off = 0; off < nbytes;) {
        size_t m = nbytes - off > (size_t)1 << 30 ? (size_t)1 << 30 : nbytes - off;
        if (mpi_check(MPI_Bcast((char *)buf + off, (int)m, MPI_BYTE, root, MPI_COMM_WORLD), "Bcast")) return -1;
        off += m;
    }
    return 0;
#else
    return pln_errorf("comm bcast: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_allgather(pln_comm *c, const void *send, void *recv, size_t nbytes) {
    if (c->size == 1) { if (nbytes) memmove(recv, send, nbytes); return 0; }
#ifdef PLN_HAVE_MPI
    if (nbytes > (size_t)1 << 30)
        return pln_errorf("comm allgather: %zu bytes per rank is over the 1 GiB limit", nbytes);
    return mpi_check(MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, MPI_COMM_WORLD),
                     "Allgather");
#else
    return pln_errorf("comm allgather: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_barrier(pln_comm *c) {
    if (c->size == 1) return 0;
#ifdef PLN_HAVE_MPI
    return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "Barrier");
#else
    return 0;
#endif
}

void pln_comm_free(pln_comm *c) {
    if (!c) return;
#ifdef PLN_HAVE_NCCL
    if (c->nccl) pln_nccl_destroy(c->nccl);
#endif
    free(c->host_buf);
#ifdef PLN_HAVE_MPI
    if (c->mpi) {
        if (g_f16_sum_op != MPI_OP_NULL) MPI_Op_free(&g_f16_sum_op);
        MPI_Finalize();
    }
#endif
    free(c);
}
