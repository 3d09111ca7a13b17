/* cli.h — small helpers the subcommands share (checked option values, thread counts, OpenMP
 * start-up policy). */
#ifndef PLN_CLI_H
#define PLN_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* The largest CUDA device index --device accepts (a sanity bound, not a hardware limit). */
#define PLN_CLI_MAX_DEVICE 1023

/* An option's integer value: the whole string in base 10 (no sign games: "12abc", "", " 3" and
 * "0x10" are refused), within [lo, hi]. 0, or -1 with an error naming the option, the bad value
 * and the range. */
int pln_cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* An option's real value: the whole string, finite (no nan/inf) and within float's range, within
 * lo..hi, where lo itself is allowed only when lo_inclusive (top_p is in (0, 1], temperature in
 * [0, inf)); hi is inclusive (INFINITY: no upper bound). 0, or -1 with an error naming the option,
 * the bad value and the range. */
int pln_cli_parse_float(const char *opt, const char *s, double lo, bool lo_inclusive, double hi, double *out);
/* The same for argument parsing: die with the message ("pollen: --top-p 2: ...") on a bad value. */
int64_t pln_cli_int(const char *opt, const char *s, int64_t lo, int64_t hi);
double pln_cli_float(const char *opt, const char *s, double lo, bool lo_inclusive, double hi);

/* --kv-dtype: "f32" or "f16" (returned as given) on a backend that has it: cuda's KV cache is F16
 * only, so f32 there is refused. backend NULL = cpu. Dies with a message naming the option. */
const char *pln_cli_kv_dtype(const char *backend, const char *kv_dtype);

/* --int-dot on|off|auto (pln_engine_opts.int_dot): the value given, checked (dies with a message
 * naming the option on anything else; on is refused on a backend other than cpu); unset: NULL
 * when PLN_CPU_INT_DOT is set (the backend's default from it), else "auto". backend NULL = cpu. */
const char *pln_cli_int_dot(const char *backend, const char *int_dot);
/* --cpu-tune auto|off|redo (pln_engine_opts.cpu_tune): the value given, else $POLLEN_CPU_TUNE,
 * else "auto"; dies with a message naming the option (or the variable) on anything else. */
const char *pln_cli_cpu_tune(const char *cpu_tune);
/* Dies with a clear message when --batch-invariant is asked of a backend without the mode. */
void pln_cli_batch_invariant(const char *backend, bool on);
/* The option-table lines (tools/opt.h) of --int-dot and --batch-invariant, shared by generate,
 * serve, bench and perplexity; eo is a pln_engine_opts. */
#define PLN_CLI_INT_DOT_OPTS(eo) \
    PLN_O_STR("int-dot", 0, (eo).int_dot, "on|off|auto", \
              "cpu, int8/int4 weights: activations rounded to int8 per block of 32 and multiplied in integer " \
              "arithmetic (faster prefill and batches); auto (the default): on for int4 sets, off for int8 and " \
              "fp16 (docs/ARCHITECTURE.md)"), \
    PLN_O_FLAG("batch-invariant", 0, (eo).batch_invariant, \
               "cpu: every token's results the same bits whatever shares its step (a prefix-cache hit, a " \
               "batch); slower batches and prefill (docs/ARCHITECTURE.md)"), \
    PLN_O_STR("cpu-tune", 0, (eo).cpu_tune, "auto|off|redo", \
              "cpu: the prefetch distances (the decode GEMVs' per weight kind, the fp16 tiles') measured once per " \
              "machine and cached " \
              "(~/.cache/pollen/cpu-tune.json); off: the built-in default; redo: measure again (speed " \
              "only, never a result; default auto, or $POLLEN_CPU_TUNE)")

/* Threads per rank: `requested` (> 0, from --threads) wins and is exported as OMP_NUM_THREADS so
 * the CPU backend honours it; else OMP_NUM_THREADS; else the node's cores split between the ranks
 * launched on it (OMPI_COMM_WORLD_LOCAL_SIZE, else `ranks`: pass pln_comm_local_size, the ranks on
 * this node), never below 1. Applies the result with
 * omp_set_num_threads and returns it. Never fails. */
int pln_cli_threads(int requested, int ranks);

/* OpenMP's idle threads spin between parallel regions unless OMP_WAIT_POLICY is passive, and on a
 * machine with few cores that spinning takes the core a writer thread (and the kernel's page
 * copying) needs: measured on 2 cores, 5x the CPU time for the same conversion. libgomp reads the
 * policy only at start-up, so this re-executes the process once with it set (exec keeps the PID).
 * Returns only when OMP_WAIT_POLICY was already set or exec failed. argv excludes "pollen". */
void pln_cli_restart_with_passive_omp(int argc, char **argv);

/* --step-timeout VALUE: seconds (> 0, at most a day), "auto" (0: derived per step from the model
 * size, pln_engine_step_bound) or "off" (-1). Dies with a message naming the option on a bad value. */
double pln_cli_step_timeout(const char *opt, const char *s);
/* The same as an option parser (tools/opt.h PLN_OPT_FN): dst is a double; 0, or -1 with the
 * message recorded (pln_error). */
int pln_cli_parse_step_timeout(const char *opt, const char *s, void *dst);

/* --show-placement: prints to stderr, on every rank, where it runs and which CUDA device it picks:
 * "pollen: placement: rank 1 of 4 (pid 4242) on node n2: local rank 1 of 2 (MPI node split;
 * OMPI_COMM_WORLD_LOCAL_RANK=1); cuda device 1 (local rank 1 % --gpus-per-node 2)". */
struct pln_comm;
void pln_cli_print_placement(const struct pln_comm *c, int device, int gpus_per_node, const char *backend);

#endif
