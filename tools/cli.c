/* cli.c — helpers the subcommands share; see cli.h. */
#include "tools/cli.h"
#include "formats/common.h"
#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/engine.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int pln_cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = 0;
    /* strtoll skips leading blanks and takes "0x" only with base 0; a blank-led value is a typo. */
    bool ok = s && *s && !isspace((unsigned char)*s);
    if (ok) x = strtoll(s, &end, 10);
    if (!ok || end == s || *end || errno == ERANGE)
        return pln_errorf("%s \"%s\": not an integer (expected one in [%lld, %lld])", opt, s ? s : "",
                          (long long)lo, (long long)hi);
    if (x < lo || x > hi)
        return pln_errorf("%s %lld: out of range (expected an integer in [%lld, %lld])", opt, x, (long long)lo,
                          (long long)hi);
    *out = x;
    return 0;
}

/* "[0, 1]", "(0, inf)": the range as the error message shows it. */
static void range_str(char *b, size_t n, double lo, bool lo_inclusive, double hi) {
    snprintf(b, n, "%c%g, %g%c", lo_inclusive ? '[' : '(', lo, hi, isinf(hi) ? ')' : ']');
}

int pln_cli_parse_float(const char *opt, const char *s, double lo, bool lo_inclusive, double hi, double *out) {
    char *end = NULL, range[96];
    double x = 0;
    range_str(range, sizeof range, lo, lo_inclusive, hi);
    bool ok = s && *s && !isspace((unsigned char)*s);
    if (ok) x = strtod(s, &end);
    if (!ok || end == s || *end || !isfinite(x))
        return pln_errorf("%s \"%s\": not a finite number (expected one in %s)", opt, s ? s : "", range);
    if (x < lo || (x == lo && !lo_inclusive) || x > hi)
        return pln_errorf("%s %s: out of range (expected a number in %s)", opt, s, range);
    /* Every consumer stores a float: a value beyond its range would turn into inf there. */
    if (fabs(x) > FLT_MAX) return pln_errorf("%s %s: too large (a float holds at most %g)", opt, s, (double)FLT_MAX);
    *out = x;
    return 0;
}

int64_t pln_cli_int(const char *opt, const char *s, int64_t lo, int64_t hi) {
    int64_t v = 0;
    if (pln_cli_parse_int(opt, s, lo, hi, &v)) pln_die("%s", pln_error());
    return v;
}

double pln_cli_float(const char *opt, const char *s, double lo, bool lo_inclusive, double hi) {
    double v = 0;
    if (pln_cli_parse_float(opt, s, lo, lo_inclusive, hi, &v)) pln_die("%s", pln_error());
    return v;
}

int pln_cli_threads(int requested, int ranks) {
    int threads = requested;
    if (threads > 0) {
        char tb[16];
        snprintf(tb, sizeof tb, "%d", threads);
        setenv("OMP_NUM_THREADS", tb, 1);
    } else if (getenv("OMP_NUM_THREADS")) {
        threads = omp_get_max_threads();
    } else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int local = ls ? atoi(ls) : ranks;
        threads = (int)(cores / (local > 0 ? local : 1));
    }
    if (threads < 1) threads = 1;
    omp_set_num_threads(threads);
    return threads;
}

void pln_cli_restart_with_passive_omp(int argc, char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    char **av = pln_xcalloc((size_t)argc + 2, sizeof *av);
    av[0] = (char *)"pollen";
    for (int i = 0; i < argc; i++) av[i + 1] = argv[i];
    execv("/proc/self/exe", av);
    free(av);  /* exec failed: carry on with spinning threads */
}

const char *pln_cli_int_dot(const char *backend, const char *int_dot) {
    if (!int_dot) {
        const char *env = getenv("PLN_CPU_INT_DOT");
        return env && *env ? NULL : "auto";
    }
    if (pln_engine_int_dot_choice("--int-dot", int_dot, NULL) < 0) pln_die("%s", pln_error());
    if (backend && strcmp(backend, "cpu") && !strcmp(int_dot, "on"))
        pln_die("--int-dot on: the integer-dot path is the cpu backend's; use --backend cpu, or --int-dot off or auto");
    return int_dot;
}

const char *pln_cli_cpu_tune(const char *cpu_tune) {
    const char *from = "--cpu-tune";
    if (!cpu_tune) {
        cpu_tune = getenv("POLLEN_CPU_TUNE");
        from = "POLLEN_CPU_TUNE";
        if (!cpu_tune || !*cpu_tune) return "auto";
    }
    if (strcmp(cpu_tune, "auto") && strcmp(cpu_tune, "off") && strcmp(cpu_tune, "redo"))
        pln_die("%s: '%s' is not one of auto, off, redo", from, cpu_tune);
    return cpu_tune;
}

void pln_cli_batch_invariant(const char *backend, bool on) {
    if (on && backend && strcmp(backend, "cpu"))
        pln_die("--batch-invariant: the batch-invariant mode is the cpu backend's; use --backend cpu, or leave "
                "the flag off");
}

const char *pln_cli_kv_dtype(const char *backend, const char *kv_dtype) {
    if (!kv_dtype) return NULL;
    pln_dtype dt;
    if (pln_kv_dtype_parse("--kv-dtype", kv_dtype, &dt)) pln_die("%s", pln_error());
    if (backend && !strcmp(backend, "cuda") && dt != PLN_DTYPE_F16)
        pln_die("--kv-dtype %s: the cuda backend keeps its KV cache in f16 only; use --kv-dtype f16 "
                "(its default) or --backend cpu", kv_dtype);
    return kv_dtype;
}

int pln_cli_parse_step_timeout(const char *opt, const char *s, void *dst) {
    double *out = dst;
    if (!strcmp(s, "auto")) { *out = 0; return 0; }
    if (!strcmp(s, "off")) { *out = -1; return 0; }
    if (pln_cli_parse_float(opt, s, 0, false, 86400, out)) {
        char *m = pln_xstrdup(pln_error());
        pln_errorf("%s (or \"auto\": derived from the model size; \"off\": no watchdog)", m);
        free(m);
        return -1;
    }
    return 0;
}

double pln_cli_step_timeout(const char *opt, const char *s) {
    double v = 0;
    if (pln_cli_parse_step_timeout(opt, s, &v)) pln_die("%s", pln_error());
    return v;
}

void pln_cli_print_placement(const struct pln_comm *c, int device, int gpus_per_node, const char *backend) {
    char where[512], how[96];
    pln_comm_describe(c, where, sizeof where);
    int local = pln_comm_local_rank(c);
    int dev = pln_engine_pick_device(device, gpus_per_node, local);
    if (device >= 0) snprintf(how, sizeof how, "--device %d", device);
    else if (gpus_per_node > 0) snprintf(how, sizeof how, "local rank %d %% --gpus-per-node %d", local, gpus_per_node);
    else snprintf(how, sizeof how, "local rank %d; --gpus-per-node unset", local);
    fprintf(stderr, "pollen: placement: %s; cuda device %d (%s)%s\n", where, dev, how,
            backend && !strcmp(backend, "cuda") ? "" : " [unused: cpu backend]");
}
