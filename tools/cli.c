/* cli.c — helpers the subcommands share; see cli.h. */
#include "tools/cli.h"
#include "formats/common.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
