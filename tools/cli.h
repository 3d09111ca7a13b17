/* cli.h — small helpers the subcommands share (thread counts, OpenMP start-up policy). */
#ifndef PLN_CLI_H
#define PLN_CLI_H

/* Threads per rank: `requested` (> 0, from --threads) wins and is exported as OMP_NUM_THREADS so
 * the CPU backend honours it; else OMP_NUM_THREADS; else the node's cores split between the ranks
 * launched on it (OMPI_COMM_WORLD_LOCAL_SIZE, else `ranks`), never below 1. Applies the result with
 * omp_set_num_threads and returns it. Never fails. */
int pln_cli_threads(int requested, int ranks);

/* OpenMP's idle threads spin between parallel regions unless OMP_WAIT_POLICY is passive, and on a
 * machine with few cores that spinning takes the core a writer thread (and the kernel's page
 * copying) needs: measured on 2 cores, 5x the CPU time for the same conversion. libgomp reads the
 * policy only at start-up, so this re-executes the process once with it set (exec keeps the PID).
 * Returns only when OMP_WAIT_POLICY was already set or exec failed. argv excludes "pollen". */
void pln_cli_restart_with_passive_omp(int argc, char **argv);

#endif
