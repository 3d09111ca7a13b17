/* launch.h — a TP-N shard set starts its own N ranks: `pollen generate|serve|bench|perplexity SET`
 * run by hand (no launcher around it) re-runs the very same command under `mpirun -np N` and waits
 * for it, the way TGI's --num-shard and vLLM's --tensor-parallel-size start their workers. Under a
 * launcher (mpirun, srun, MPICH's hydra) nothing changes; multi-node runs keep their own mpirun. */
#ifndef PLN_LAUNCH_H
#define PLN_LAUNCH_H

#include <stdbool.h>

/* Call after the command's options are parsed and before pln_comm_init. cmd is the subcommand
 * ("generate"), argv its arguments as main passed them (argv[0] = cmd). When this process is not
 * under a launcher, no_launch is false and set_dir's manifest says TP > 1, runs
 *   mpirun -np N [--allow-run-as-root] [--oversubscribe] -q --bind-to none <this pollen> <cmd argv...>
 * (the arguments kept exactly; the flags only where they apply, with Open MPI), first printing
 * that command line on stderr, shell-quoted, unless quiet. SIGINT/SIGTERM/SIGHUP sent to this
 * process go to rank 0 (a server then drains, as at TP 1); a second one, or one before rank 0
 * runs, goes to mpirun, which ends every rank. Returns the job's exit status (a death by signal
 * as 128 + the signal), or 1 with a message naming what to install when mpirun is missing.
 * Returns -1 when the command should run here as it always did: under a launcher, TP 1,
 * --no-launch, or a set whose manifest cannot be read (the command itself then says why). */
int pln_launch_self(const char *cmd, const char *set_dir, int argc, char **argv, bool no_launch, bool quiet);

/* Called by every pollen at start: in a rank of a job pln_launch_self started, tells the process
 * that started it that a rank runs (mpirun -q hides mpirun's own failures, so that process says
 * when mpirun ended before any rank ran). Nothing elsewhere. */
void pln_launch_rank_started(void);

#endif
