/* comm.c — collectives between ranks: one rank without a launcher, MPI between processes started
 * by mpirun/srun (host buffers), and NCCL for device buffers when the CUDA backend is attached.
 *
 * MPI is started only when the environment says a launcher started us, so `pollen generate` on one
 * rank never needs mpirun. Every call is collective and keeps the same order on every rank.
 *
 * Why every host collective is nonblocking + a polling wait of our own: Open MPI's blocking calls
 * spin at 100 % of a core for as long as they wait. An idle rank of `pollen serve` waits for the
 * next step plan for minutes, and two ranks that share a core (an oversubscribed node, or two
 * "nodes" of one machine whose launchers each bind their local rank 0 to core 0) then take turns
 * spinning for a whole scheduler time slice: a decode step took tens of ms instead of a fraction
 * of one. Our wait spins briefly, then yields, then sleeps with a backoff capped at 1 ms (2 ms
 * once idle), and it can give up at a deadline, which is what the step watchdog needs (comm.h). */
#include "runtime/comm.h"
#include "kernels/backend.h"
#include "kernels/pln_math.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if __has_include(<mpi.h>)
#include <mpi.h>
#define PLN_HAVE_MPI 1
#endif

#if defined(PLN_HAVE_CUDA) && __has_include("kernels/cuda/nccl.h")
#include "kernels/cuda/nccl.h"
#endif
#if defined(PLN_HAVE_CUDA) && defined(PLN_NCCL_ID_BYTES) && !defined(PLN_CUDA_EMU)   /* the CPU harness: MPI */
#define PLN_HAVE_NCCL 1
/* NCCL lives in libpollen-cuda.so with the CUDA backend (kernels/backend.c): weak references,
 * set where the CUDA objects are linked in (tests/gpu), else looked up in the library, which the
 * CUDA backend attached here has opened already. */
#pragma weak pln_nccl_get_unique_id
#pragma weak pln_nccl_create
#pragma weak pln_nccl_allreduce
#pragma weak pln_nccl_destroy
static struct {
    int (*get_unique_id)(void *, size_t);
    pln_nccl *(*create)(int, int, const void *, size_t, pln_backend *);
    int (*allreduce)(pln_nccl *, void *, size_t, pln_dtype);
    void (*destroy)(pln_nccl *);
} g_nccl;

static int nccl_resolve(void) {
    if (g_nccl.destroy) return 0;
    if (pln_nccl_destroy) {
        g_nccl.get_unique_id = pln_nccl_get_unique_id;
        g_nccl.create = pln_nccl_create;
        g_nccl.allreduce = pln_nccl_allreduce;
        g_nccl.destroy = pln_nccl_destroy;
        return 0;
    }
    void *a = pln_cuda_lib_sym("pln_nccl_get_unique_id"), *b = a ? pln_cuda_lib_sym("pln_nccl_create") : NULL;
    void *d = b ? pln_cuda_lib_sym("pln_nccl_allreduce") : NULL, *e = d ? pln_cuda_lib_sym("pln_nccl_destroy") : NULL;
    if (!e) return -1;
    *(void **)&g_nccl.get_unique_id = a;
    *(void **)&g_nccl.create = b;
    *(void **)&g_nccl.allreduce = d;
    *(void **)&g_nccl.destroy = e;
    return 0;
}
#endif

struct pln_comm {
    int rank, size, local_rank, local_size;
    bool local_from_mpi;      /* local rank from MPI's node split (else the environment or 0) */
    const char *local_env;    /* the launcher variable that names the local rank, if any */
    int local_env_value;
    char node[256];           /* MPI processor name (host name) */
    bool mpi;                 /* MPI_Init_thread ran here (and MPI_Finalize is ours) */
    /* waiting and the step watchdog */
    int64_t seq;              /* collectives started (the same count on every rank) */
    double deadline;          /* pln_now() past which a wait fails; 0 = none */
    double bound;             /* the bound the deadline came from (for messages) */
    bool broken;
    char *broken_msg;
    int64_t *arrived;         /* rank 0: the latest collective each rank reported waiting in */
    int32_t *node_peers;      /* rank 0: [world rank, pid] of the other ranks on its node */
    int n_node_peers;
#ifdef PLN_HAVE_MPI
    MPI_Comm ctl;             /* arrival reports (worker -> rank 0), apart from the collectives */
    MPI_Request ctl_req;      /* rank 0: the posted receive of the next report */
    int64_t ctl_msg;
#endif
    pln_backend *be;          /* attached backend (device buffers) */
#ifdef PLN_HAVE_NCCL
    pln_nccl *nccl;           /* NCCL communicator when the attached backend is CUDA */
#else
    void *nccl;
#endif
    void *host_buf;           /* staging for device buffers on backends without NCCL */
    size_t host_cap;
};

bool pln_comm_launched(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                 "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE", "I_MPI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    /* srun sets SLURM_STEP_ID and SLURM_PROCID for each task (an sbatch script alone does not). */
    return getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID") && getenv("SLURM_NTASKS");
}

const char *pln_comm_mpi_kind(void) {
#if defined(PLN_HAVE_MPI) && defined(OPEN_MPI)
    return "open-mpi";
#elif defined(PLN_HAVE_MPI)
    return "mpi";
#else
    return NULL;
#endif
}

int pln_comm_env_local_rank(const char *(*get)(const char *name), const char **var) {
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID",
                                 "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID"};
    *var = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = get(vars[i]);
        if (!v) continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        /* The first variable set decides: a launcher that sets a malformed value is not second-
         * guessed with another launcher's leftovers. */
        if (end == v || *end || errno || x < 0 || x > 1 << 20) return -1;
        *var = vars[i];
        return (int)x;
    }
    return -1;
}

static const char *env_get(const char *name) { return getenv(name); }

/* ---- waiting ------------------------------------------------------------------------------ */

/* Spin this long, then yield the core until YIELD_S, then sleep from SLEEP_MIN_NS doubling up to
 * SLEEP_MAX_NS, and after IDLE_S of waiting (idleness, or a step so long that 2 ms do not matter) up to
 * SLEEP_IDLE_NS: each wake-up costs ~10 us of kernel time, so 1 ms sleeps would keep an idle rank
 * at ~1 % of a core (twice that on a loaded virtual machine), 2 ms at half of it. Yielding
 * only briefly matters: a waiter that keeps yielding to a peer on its core is picked again
 * for up to the scheduler's wake-up granularity (~1 ms), so it sleeps soon instead. A rank past
 * REPORT_S in one wait tells rank 0 it has arrived (watchdog). */
#define SPIN_S 20e-6
#define YIELD_S 200e-6
#define SLEEP_MIN_NS 10000L
#define SLEEP_MAX_NS 1000000L
#define IDLE_S 0.1
#define SLEEP_IDLE_NS 2000000L
#define REPORT_S 20e-3

static int broken_error(pln_comm *c) { return pln_errorf("%s", c->broken_msg); }

#ifdef PLN_HAVE_MPI
/* Records the current error as the comm's last word; every later call repeats it. */
static int comm_break(pln_comm *c) {
    c->broken = true;
    free(c->broken_msg);
    c->broken_msg = pln_xstrdup(pln_error());
    return -1;
}

static int mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return pln_errorf("MPI %s failed: %.*s", what, len, msg);
}

/* Rank 0: takes in every arrival report that has come. */
static void ctl_drain(pln_comm *c) {
    for (int guard = 0; guard < 4 * c->size && c->ctl_req != MPI_REQUEST_NULL; guard++) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(&c->ctl_req, &done, &st) != MPI_SUCCESS || !done) return;
        if (st.MPI_SOURCE > 0 && st.MPI_SOURCE < c->size && c->ctl_msg > c->arrived[st.MPI_SOURCE])
            c->arrived[st.MPI_SOURCE] = c->ctl_msg;
        MPI_Irecv(&c->ctl_msg, 1, MPI_INT64_T, MPI_ANY_SOURCE, 1, c->ctl, &c->ctl_req);
    }
}

/* Rank 0: a rank on this node that has exited or been killed. Shared memory does not notice a
 * dead peer (TCP does, as an error): without this, rank 0 would wait out the step bound while the
 * launcher is already tearing the job down. Returns the rank or -1. */
static int node_peer_gone(pln_comm *c, int *pid_out) {
    for (int i = 0; i < c->n_node_peers; i++) {
        int pid = c->node_peers[2 * i + 1];
        bool gone = kill(pid, 0) != 0 && errno == ESRCH;
        if (!gone) {
            char path[64], st[256];
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            /* procfs, not a user's file: its size reads 0, so pln_read_small_file cannot read it */
            FILE *f = fopen(path, "r");
            if (f) {
                size_t n = fread(st, 1, sizeof st - 1, f);
                st[n] = 0;
                fclose(f);
                const char *e = strrchr(st, ')');
                gone = e && (e[2] == 'Z' || e[2] == 'X');   /* exited, not yet reaped */
            }
        }
        if (gone) { *pid_out = pid; return c->node_peers[2 * i]; }
    }
    return -1;
}

/* Rank 0, at a deadline: gives the others' reports a moment to come in, then names the ranks that
 * never reported arriving at collective seq. */
static int name_missing(pln_comm *c, int64_t seq, const char *what) {
    double until = pln_now() + 5 * REPORT_S + 0.1;
    char who[512] = "";
    size_t len = 0;
    int n_missing = 0;
    for (;;) {
        ctl_drain(c);
        n_missing = 0;
        for (int r = 1; r < c->size; r++) if (c->arrived[r] < seq) n_missing++;
        if (n_missing == 0 || pln_now() > until) break;
        struct timespec ts = {0, SLEEP_MAX_NS};
        nanosleep(&ts, NULL);
    }
    for (int r = 1; r < c->size && len + 16 < sizeof who; r++)
        if (c->arrived[r] < seq) len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", r);
    if (n_missing == 0)
        return pln_errorf("step did not complete within %.3g s (the step timeout): every rank reached collective %lld "
                          "(%s) but it did not complete; the network between the ranks stopped delivering",
                          c->bound, (long long)seq, what);
    return pln_errorf("rank%s %s stopped answering: %s never reached collective %lld (%s) within %.3g s "
                      "(the step timeout); is it stopped (SIGSTOP), swapping, or its host unreachable?",
                      n_missing > 1 ? "s" : "", who, n_missing > 1 ? "they" : "it", (long long)seq, what, c->bound);
}

/* Completes req by polling (see the file comment). seq is the collective's number. */
static int comm_wait(pln_comm *c, MPI_Request *req, int64_t seq, const char *what) {
    double t0 = pln_now(), next_peer_check = t0 + REPORT_S;
    long sleep_ns = SLEEP_MIN_NS;
    bool reported = false;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char what2[64];
            snprintf(what2, sizeof what2, "%s (collective %lld)", what, (long long)seq);
            mpi_check(rc, what2);
            pln_error_context("rank %d: a peer failed or its connection broke", c->rank);
            return comm_break(c);
        }
        if (done) return 0;
        if (c->rank == 0 && c->arrived) ctl_drain(c);
        double now = pln_now(), el = now - t0;
        if (!reported && el > REPORT_S && c->rank != 0) {
            /* Fire and forget: eager-sized, completes locally; rank 0 may be long gone. */
            MPI_Request r;
            int64_t msg = seq;
            if (MPI_Isend(&msg, 1, MPI_INT64_T, 0, 1, c->ctl, &r) == MPI_SUCCESS) {
                int d = 0;
                MPI_Test(&r, &d, MPI_STATUS_IGNORE);
                if (!d) MPI_Request_free(&r);
            }
            reported = true;
        }
        if (c->n_node_peers && now > next_peer_check) {
            next_peer_check = now + REPORT_S;
            int pid = 0, gone = node_peer_gone(c, &pid);
            if (gone >= 0) {
                pln_errorf("rank %d (pid %d) is gone: it exited or was killed while rank 0 waited in collective %lld (%s)",
                           gone, pid, (long long)seq, what);
                return comm_break(c);
            }
        }
        if (c->deadline > 0 && now > c->deadline) {
            /* The request stays active (a collective cannot be cancelled): the comm is done for. */
            if (c->rank == 0) name_missing(c, seq, what);
            else
                pln_errorf("rank %d: step did not complete within %.3g s (the step timeout): waited in collective %lld (%s) "
                           "for the other ranks", c->rank, c->bound, (long long)seq, what);
            return comm_break(c);
        }
        if (el < SPIN_S) continue;
        if (el < YIELD_S) { sched_yield(); continue; }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        long cap = el > IDLE_S ? SLEEP_IDLE_NS : SLEEP_MAX_NS;
        if (sleep_ns < cap) sleep_ns = sleep_ns * 2 > cap ? cap : sleep_ns * 2;
    }
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
    c->local_size = 1;
    c->local_env_value = pln_comm_env_local_rank(env_get, &c->local_env);
    if (c->local_env_value >= 0) c->local_rank = c->local_env_value;
    if (gethostname(c->node, sizeof c->node - 1)) snprintf(c->node, sizeof c->node, "?");
    if (!pln_comm_launched()) { c->local_rank = 0; return c; }
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
        MPI_Comm_size(node, &c->local_size);
        /* Rank 0 keeps the pids of its node's other ranks, to notice one that dies. */
        int32_t me[2] = {c->rank, (int32_t)getpid()};
        int32_t *all = pln_xmalloc((size_t)c->local_size * sizeof me);
        if (MPI_Allgather(me, 2, MPI_INT32_T, all, 2, MPI_INT32_T, node) == MPI_SUCCESS && c->rank == 0) {
            c->node_peers = pln_xmalloc((size_t)c->local_size * sizeof me);
            for (int i = 0; i < c->local_size; i++)
                if (all[2 * i] != 0) {
                    c->node_peers[2 * c->n_node_peers] = all[2 * i];
                    c->node_peers[2 * c->n_node_peers + 1] = all[2 * i + 1];
                    c->n_node_peers++;
                }
        }
        free(all);
        MPI_Comm_free(&node);
        c->local_from_mpi = true;
    }
    int len = 0;
    if (MPI_Get_processor_name(c->node, &len) != MPI_SUCCESS) len = 0;
    c->node[len < (int)sizeof c->node ? len : (int)sizeof c->node - 1] = 0;
    MPI_Op_create(f16_sum, 1, &g_f16_sum_op);
    c->ctl_req = MPI_REQUEST_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->ctl) != MPI_SUCCESS) pln_die("MPI_Comm_dup failed at start-up");
    if (c->rank == 0) {
        c->arrived = pln_xcalloc((size_t)c->size, sizeof *c->arrived);
        MPI_Irecv(&c->ctl_msg, 1, MPI_INT64_T, MPI_ANY_SOURCE, 1, c->ctl, &c->ctl_req);
    }
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
int pln_comm_local_size(const pln_comm *c) { return c->local_size; }

void pln_comm_describe(const pln_comm *c, char *buf, size_t n) {
    char env[96] = "no launcher variable";
    if (c->local_env) snprintf(env, sizeof env, "%s=%d", c->local_env, c->local_env_value);
    snprintf(buf, n, "rank %d of %d (pid %d) on node %s: local rank %d of %d (%s; %s)", c->rank, c->size, (int)getpid(), c->node,
             c->local_rank, c->local_size, c->local_from_mpi ? "MPI node split" : c->size > 1 ? "launcher environment" : "one rank",
             env);
}

void pln_comm_step_begin(pln_comm *c, double bound_s) {
    c->bound = bound_s;
    c->deadline = bound_s > 0 ? pln_now() + bound_s : 0;
}
void pln_comm_step_end(pln_comm *c) { c->deadline = 0; }
bool pln_comm_broken(const pln_comm *c) { return c->broken; }

bool pln_comm_allreduce_recordable(const pln_comm *c) {
    return c->size == 1 || c->nccl != NULL;
}

int pln_comm_attach_backend(pln_comm *c, pln_backend *be) {
    c->be = be;
    if (c->size == 1 || !be->nccl_capable) return 0;
    /* PLN_NCCL=0: all-reduce through host memory over MPI instead. Slow, but it lets several
     * ranks share one GPU (NCCL refuses that), so TP > 1 can be checked on a one-GPU machine. */
    bool nccl_on = true;   /* formats/common.h ENV_NOTE; every rank reads the same environment */
    if (pln_env_flag("PLN_NCCL", &nccl_on)) return -1;
    if (!nccl_on) return 0;
#ifdef PLN_HAVE_NCCL
    uint8_t id[PLN_NCCL_ID_BYTES] = {0};
    int rc = nccl_resolve();
    if (rc == 0 && c->rank == 0 && g_nccl.get_unique_id(id, sizeof id) < 0) rc = -1;
    /* Rank 0 sends the id (or a failure flag) so no rank waits forever in NCCL init. */
    int32_t ok = rc == 0;
    if (pln_comm_bcast(c, &ok, sizeof ok, 0) != 0) return -1;
    if (!ok) return c->rank == 0 ? -1 : pln_errorf("NCCL unique id failed on rank 0");
    if (pln_comm_bcast(c, id, sizeof id, 0) != 0) return -1;
    if (rc) return -1;
    c->nccl = g_nccl.create(c->rank, c->size, id, sizeof id, be);
    if (!c->nccl) return pln_error_context("NCCL init on rank %d of %d", c->rank, c->size);
    return 0;
#else
    /* Without NCCL, device buffers go through host staging over MPI (correct, not fast). */
    return 0;
#endif
}

#ifdef PLN_HAVE_MPI
/* Starts a collective (rc from its MPI_I* call) and waits for it. */
static int run_coll(pln_comm *c, int rc, MPI_Request *req, int64_t seq, const char *what) {
    if (rc != MPI_SUCCESS) {
        mpi_check(rc, what);
        return comm_break(c);
    }
    return comm_wait(c, req, seq, what);
}

static int mpi_allreduce_host(pln_comm *c, void *buf, size_t n, pln_dtype dtype) {
    MPI_Datatype dt = dtype == PLN_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = dtype == PLN_DTYPE_F32 ? MPI_SUM : g_f16_sum_op;
    /* MPI counts are int: reduce in chunks. */
    size_t esz = pln_dtype_size(dtype);
    for (size_t off = 0; off < n;) {
        size_t m = n - off > (size_t)1 << 30 ? (size_t)1 << 30 : n - off;
        MPI_Request req;
        int64_t seq = ++c->seq;
        if (run_coll(c, MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)m, dt, op, MPI_COMM_WORLD, &req), &req,
                     seq, "Allreduce"))
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
    if (c->broken) return broken_error(c);
#ifdef PLN_HAVE_NCCL
    if (c->nccl) return g_nccl.allreduce(c->nccl, buf, n, dtype);
#endif
#ifdef PLN_HAVE_MPI
    if (c->be && !c->be->host_memory) {
        /* Device memory without NCCL: stage through the host. */
        size_t nb = n * pln_dtype_size(dtype);
        if (nb > c->host_cap) { free(c->host_buf); c->host_buf = pln_xmalloc(nb); c->host_cap = nb; }
        if (c->be->download(c->be, c->host_buf, buf, nb)) return -1;
        if (mpi_allreduce_host(c, c->host_buf, n, dtype)) return -1;
        return c->be->upload(c->be, buf, c->host_buf, nb);
    }
    return mpi_allreduce_host(c, buf, n, dtype);
#else
    return pln_errorf("comm allreduce: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_bcast(pln_comm *c, void *buf, size_t nbytes, int root) {
    if (c->size == 1 || nbytes == 0) return 0;
    if (c->broken) return broken_error(c);
#ifdef PLN_HAVE_MPI
    for (size_t off = 0; off < nbytes;) {
        size_t m = nbytes - off > (size_t)1 << 30 ? (size_t)1 << 30 : nbytes - off;
        MPI_Request req;
        int64_t seq = ++c->seq;
        if (run_coll(c, MPI_Ibcast((char *)buf + off, (int)m, MPI_BYTE, root, MPI_COMM_WORLD, &req), &req, seq, "Bcast"))
            return -1;
        off += m;
    }
    return 0;
#else
    return pln_errorf("comm bcast: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_allgather(pln_comm *c, const void *send, void *recv, size_t nbytes) {
    if (c->size == 1) { if (nbytes) memmove(recv, send, nbytes); return 0; }
    if (c->broken) return broken_error(c);
#ifdef PLN_HAVE_MPI
    if (nbytes > (size_t)1 << 30)
        return pln_errorf("comm allgather: %zu bytes per rank is over the 1 GiB limit", nbytes);
    MPI_Request req;
    int64_t seq = ++c->seq;
    return run_coll(c, MPI_Iallgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, MPI_COMM_WORLD, &req), &req,
                    seq, "Allgather");
#else
    return pln_errorf("comm allgather: %d ranks but no MPI in this build", c->size);
#endif
}

int pln_comm_barrier(pln_comm *c) {
    if (c->size == 1) return 0;
    if (c->broken) return broken_error(c);
#ifdef PLN_HAVE_MPI
    MPI_Request req;
    int64_t seq = ++c->seq;
    return run_coll(c, MPI_Ibarrier(MPI_COMM_WORLD, &req), &req, seq, "Barrier");
#else
    return 0;
#endif
}

void pln_comm_free(pln_comm *c) {
    if (!c) return;
#ifdef PLN_HAVE_NCCL
    if (c->nccl) g_nccl.destroy(c->nccl);
#endif
    free(c->host_buf);
#ifdef PLN_HAVE_MPI
    if (c->mpi && c->broken) {
        /* Peers are stuck in (or gone from) a collective: finalizing would wait for them forever. */
        fprintf(stderr, "pollen: rank %d: aborting every rank: %s\n", c->rank, c->broken_msg);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
        _exit(3);
    }
    if (c->mpi) {
        if (c->ctl_req != MPI_REQUEST_NULL) {
            MPI_Cancel(&c->ctl_req);
            MPI_Wait(&c->ctl_req, MPI_STATUS_IGNORE);
        }
        MPI_Comm_free(&c->ctl);
        if (g_f16_sum_op != MPI_OP_NULL) MPI_Op_free(&g_f16_sum_op);
        MPI_Finalize();
    }
#endif
    free(c->arrived);
    free(c->node_peers);
    free(c->broken_msg);
    free(c);
}
