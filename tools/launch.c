/* launch.c — a TP-N shard set starts its own N ranks (see launch.h): the parent finds mpirun,
 * re-runs its own command line under it and then only relays signals and the exit status. It
 * reads the set's manifest and nothing else: it never maps a rank file or opens a port. */
#include "tools/launch.h"
#include "formats/common.h"
#include "formats/shard.h"
#include "runtime/comm.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Set in mpirun's environment (so in every rank's): a rank never launches again, even under an
 * MPI whose variables pln_comm_launched does not know. */
#define LAUNCHED_ENV "PLN_LAUNCHED"
/* The pid of the process that ran mpirun: each rank sends it SIGUSR1 once it runs. */
#define LAUNCH_PID_ENV "PLN_LAUNCH_PID"

void pln_launch_rank_started(void) {
    const char *s = getenv(LAUNCH_PID_ENV);
    if (!s) return;
    char *end;
    long pid = strtol(s, &end, 10);
    if (*end == 0 && pid > 1) kill((pid_t)pid, SIGUSR1);
    unsetenv(LAUNCH_PID_ENV);   /* once: not from what this rank may run in turn */
}

/* PATH lookup as execvp does it; NULL when not found. */
static char *find_in_path(const char *name) {
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        char *cand = n ? pln_xasprintf("%.*s/%s", (int)n, p, name) : pln_xasprintf("./%s", name);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) return cand;
        free(cand);
        if (!colon) return NULL;
        p = colon + 1;
    }
}

/* Physical cores this process may run on (Open MPI's default slot count is the core count, not
 * the hardware threads): distinct (package, core) pairs of the CPUs in the affinity mask. */
static int usable_cores(void) {
    cpu_set_t cs;
    if (sched_getaffinity(0, sizeof cs, &cs)) return (int)sysconf(_SC_NPROCESSORS_ONLN);
    int n_cpus = CPU_COUNT(&cs), n = 0;
    long *seen = pln_xcalloc((size_t)n_cpus + 1, sizeof *seen);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &cs)) continue;
        long pkg = 0, core = cpu;
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        FILE *f = fopen(path, "r");
        if (f) { if (fscanf(f, "%ld", &pkg) != 1) pkg = 0; fclose(f); }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        f = fopen(path, "r");
        if (f) { if (fscanf(f, "%ld", &core) != 1) core = cpu; fclose(f); }
        long key = pkg * 1000003L + core;
        bool dup = false;
        for (int i = 0; i < n && !dup; i++) dup = seen[i] == key;
        if (!dup && n < n_cpus) seen[n++] = key;
    }
    free(seen);
    return n > 0 ? n : 1;
}

/* Appends s to buf, single-quoted when the shell would read anything in it specially. */
static void append_quoted(char **buf, size_t *len, size_t *cap, const char *s) {
    bool plain = *s != 0;
    for (const char *c = s; *c && plain; c++)
        plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("_@%+=:,./-", *c);
    size_t need = *len + 4 * strlen(s) + 4;
    if (need > *cap) { *cap = need * 2; *buf = pln_xrealloc(*buf, *cap); }
    char *o = *buf + *len;
    if (*len) *o++ = ' ';
    if (plain) {
        o += sprintf(o, "%s", s);
    } else {
        *o++ = '\'';
        for (const char *c = s; *c; c++) {
            if (*c == '\'') { memcpy(o, "'\\''", 4); o += 4; }
            else *o++ = *c;
        }
        *o++ = '\'';
    }
    *o = 0;
    *len = (size_t)(o - *buf);
}

/* True when process pid's environment says it is rank 0. */
static bool is_rank0(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t len = 0, cap = 1 << 16;
    char *env = pln_xmalloc(cap + 1);
    size_t got;
    while ((got = fread(env + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) env = pln_xrealloc(env, (cap *= 2) + 1);
    }
    fclose(f);
    env[len] = 0;
    bool yes = false;
    for (size_t i = 0; i < len && !yes; i += strlen(env + i) + 1)
        yes = !strcmp(env + i, "OMPI_COMM_WORLD_RANK=0") || !strcmp(env + i, "PMIX_RANK=0") || !strcmp(env + i, "PMI_RANK=0");
    free(env);
    return yes;
}

/* The pid of rank 0 among mpirun's children (the ranks on this node), told by the rank variable
 * of their environment; 0 when it does not run (yet). */
static pid_t find_rank0(pid_t mpirun) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], stat_buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(stat_buf, 1, sizeof stat_buf - 1, f);
        fclose(f);
        stat_buf[n] = 0;
        /* "pid (comm) state ppid ...": the name may hold anything, so parse after its last ')'. */
        char *rp = strrchr(stat_buf, ')');
        char state;
        int ppid;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != mpirun) continue;
        if (is_rank0((int)pid)) found = (pid_t)pid;
    }
    closedir(d);
    return found;
}

int pln_launch_self(const char *cmd, const char *set_dir, int argc, char **argv, bool no_launch, bool quiet) {
    if (no_launch || !set_dir || getenv(LAUNCHED_ENV) || pln_comm_launched()) return -1;
    /* The manifest alone (small; no rank file is opened). A set that cannot be read is left to
     * the command, which says why exactly as it always did. */
    pln_shardset *set = pln_shardset_open(set_dir);
    if (!set) return -1;
    int tp = set->tp;
    pln_shardset_close(set);
    if (tp <= 1) return -1;

    const char *kind = pln_comm_mpi_kind();
    if (!kind) {
        fprintf(stderr, "pollen %s: %s is a TP-%d set: it runs as %d ranks, and this pollen was built without MPI "
                        "(install libopenmpi-dev and openmpi-bin, e.g. `make deps`, and rebuild)\n", cmd, set_dir, tp, tp);
        return 1;
    }
    char *mpirun = find_in_path("mpirun");
    if (!mpirun) {
        fprintf(stderr, "pollen %s: %s is a TP-%d set: it runs as %d ranks, which pollen starts with `mpirun`, and no mpirun "
                        "is on PATH: install it (apt-get install openmpi-bin), or start the %d ranks with a launcher of "
                        "your own (`srun -n %d pollen %s ...`; docs/SERVING.md, \"Ranks and launchers\")\n",
                cmd, set_dir, tp, tp, tp, tp, cmd);
        return 1;
    }
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "pollen %s: cannot find this program's own path (/proc/self/exe: %s) to start %d ranks: "
                        "run `mpirun -np %d pollen %s ...` yourself\n", cmd, strerror(errno), tp, tp, cmd);
        free(mpirun);
        return 1;
    }
    exe[el] = 0;

    char np[16];
    snprintf(np, sizeof np, "%d", tp);
    char **av = pln_xcalloc((size_t)argc + 10, sizeof *av);
    int n = 0;
    av[n++] = (char *)"mpirun";
    av[n++] = (char *)"-np";
    av[n++] = np;
    if (!strcmp(kind, "open-mpi")) {
        /* Open MPI refuses root unless asked (containers run as root), refuses more ranks than
         * cores unless asked, and binds each rank to one core by default: a rank's threads
         * (cores / ranks of them) need the cores of the node instead. */
        if (geteuid() == 0) av[n++] = (char *)"--allow-run-as-root";
        /* Every rank that fails says why itself; mpirun's boxes about a non-zero exit only
         * repeat it (a rank killed by a signal is reported below instead). */
        av[n++] = (char *)"-q";
        if (tp > usable_cores()) av[n++] = (char *)"--oversubscribe";
        av[n++] = (char *)"--bind-to";
        av[n++] = (char *)"none";
    }
    av[n++] = exe;
    for (int i = 0; i < argc; i++) av[n++] = argv[i];
    av[n] = NULL;

    char *line = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < n; i++) append_quoted(&line, &len, &cap, av[i]);
    if (!quiet)
        fprintf(stderr, "pollen: starting %d ranks: %s\n"
                        "pollen: (to start them with a launcher of your own, see docs/SERVING.md, \"Ranks and launchers\")\n",
                tp, line);
    fflush(stdout);
    fflush(stderr);

    /* Signals are taken synchronously below; mpirun gets a clean slate. */
    sigset_t wait_set, old;
    sigemptyset(&wait_set);
    sigaddset(&wait_set, SIGINT);
    sigaddset(&wait_set, SIGTERM);
    sigaddset(&wait_set, SIGHUP);
    sigaddset(&wait_set, SIGCHLD);
    sigaddset(&wait_set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &wait_set, &old);
    signal(SIGCHLD, SIG_DFL);   /* an ignored SIGCHLD (inherited) would reap mpirun out of our sight */
    /* Set here, not in the child (only async-signal-safe calls there): this process is the
     * launch too, and never launches again either. */
    setenv(LAUNCHED_ENV, "1", 1);
    pid_t parent = getpid();
    char parent_s[24];
    snprintf(parent_s, sizeof parent_s, "%d", (int)parent);
    setenv(LAUNCH_PID_ENV, parent_s, 1);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pollen %s: cannot start mpirun: fork: %s\n", cmd, strerror(errno));
        sigprocmask(SIG_SETMASK, &old, NULL);
        free(line);
        free(av);
        free(mpirun);
        return 1;
    }
    if (pid == 0) {
        /* Its own process group: a Ctrl-C at the terminal reaches this parent alone, which hands
         * it to rank 0 (a server drains); mpirun would abort the job on it. Ended with us. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(128 + SIGTERM);
        signal(SIGPIPE, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(mpirun, av);
        static const char msg[] = "pollen: cannot run mpirun (exec failed)\n";
        if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
        _exit(127);
    }
    setpgid(pid, pid);   /* also here, so no signal can find the child still in our group */
    free(av);
    free(mpirun);

    int forwarded = 0, status = 0;
    bool started = false;
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&wait_set, &si);
        if (sig < 0) continue;
        if (sig == SIGUSR1) { started = true; continue; }
        if (sig == SIGCHLD) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) break;
            if (w < 0 && errno != EINTR) { status = 1 << 8; break; }   /* cannot happen: it is our child */
            continue;
        }
        /* The first one goes to rank 0: serve drains and ends every rank, the other commands end
         * as they do at TP 1; another one (or one before rank 0 runs) to mpirun, which ends the
         * job. */
        pid_t to = forwarded++ ? 0 : find_rank0(pid);
        kill(to ? to : pid, sig);
    }
    signal(SIGUSR1, SIG_IGN);   /* a late rank's word, still pending, is dropped, not fatal */
    sigprocmask(SIG_SETMASK, &old, NULL);
    /* mpirun -q says nothing of a rank killed by a signal (it exits 128 + the signal), nor of its
     * own failures before any rank ran (the ranks say why they fail themselves). */
    if (WIFEXITED(status) && WEXITSTATUS(status) > 128 && !forwarded) {
        int rsig = WEXITSTATUS(status) - 128;
        fprintf(stderr, "pollen %s: a rank was killed by signal %d (%s)\n", cmd, rsig, strsignal(rsig));
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && !started && !forwarded) {
        fprintf(stderr, "pollen %s: mpirun exited with status %d before any rank ran; run its command without -q to "
                        "see why: %s\n", cmd, WEXITSTATUS(status), line);
    }
    free(line);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}
