/* engine.h — the inference engine: BLOOM over one rank's shards, with sequence slots, a paged KV
 * cache and a step API that both `pollen generate` and the server's scheduler drive.
 *
 * Process model: every rank opens the engine with the same options. Rank 0 calls
 * pln_engine_step() with a plan; the engine broadcasts the plan to the other ranks, every rank
 * runs the forward pass (all-reducing the row-parallel outputs), the ranks' top-k candidates are
 * gathered to rank 0, and rank 0 samples. Ranks != 0 sit in pln_engine_worker_loop() until rank 0
 * calls pln_engine_shutdown(). With one rank no launcher is needed.
 *
 * Sequences live in slots 0..max_seqs-1. A slot is claimed by the first step that feeds it and
 * keeps its KV blocks and token history until released in a plan. Full KV blocks are shared
 * between slots (kvcache.h): a fresh slot takes the full blocks of its prompt from the prefix
 * cache or from the sibling named by share_from, and computes only the rest; the block holding
 * the token it samples after is always its own. Sharing is skipped for want_logits plans and
 * prompt_logprobs sequences (they need every row's logits). Tokens of a prompt may be fed
 * in several steps (chunked prefill); any step may mix prefills and decodes of different lengths. */
#ifndef PLN_ENGINE_H
#define PLN_ENGINE_H

#include "runtime/sampler.h"
#include "formats/common.h"
#include "formats/hf.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct pln_comm pln_comm;
typedef struct pln_engine pln_engine;

typedef struct {
    const char *shard_dir;
    const char *backend;        /* "cpu" (default) or "cuda" */
    int device;                 /* CUDA device; -1 = picked by pln_engine_pick_device */
    int gpus_per_node;          /* GPUs per node for picking the device (0 = unset) */
    int32_t max_seqs;           /* sequence slots (default 64) */
    int32_t max_seq_len;        /* longest sequence, prompt + generated (default 2048) */
    int64_t kv_tokens;          /* KV capacity in tokens over all slots (0 = max_seqs * max_seq_len) */
    int32_t block_size;         /* KV block size in tokens (default 16) */
    const char *kv_dtype;       /* KV-cache dtype "f32" or "f16"; NULL/"" = the backend's own
                                   (cpu f32, the exact reference; cuda f16, its only one) */
    const char *int_dot;        /* the CPU integer-dot path for int8/int4 weights: "on", "off" or
                                   "auto" (on for int4 sets, off for the rest: docs/ARCHITECTURE.md
                                   "The integer-dot path"); NULL/"" = the backend's default
                                   (PLN_CPU_INT_DOT=1 on, else off). "on" on a backend without
                                   one is an error; "auto" there runs the backend's own kernels. */
    bool batch_invariant;       /* every token's results the same bits whatever shares its step
                                   (cpu: kernels/cpu/cpu.h pln_cpu_set_batch_invariant); false =
                                   the backend's default (PLN_CPU_BATCH_INVARIANT=1 on, else off).
                                   true on a backend without the mode is an error. */
    const char *cpu_tune;       /* the backend's per-machine calibration (kernels/backend.h tune):
                                   "auto" (cached, else measured once and cached), "off" (the
                                   built-in defaults) or "redo"; NULL/"" = "off" (the CLI's
                                   default is "auto": tools/cli.h). Speed only. */
    bool populate;              /* fault the mapped shard in at load */
    bool verify;                /* check tensor checksums at load */
    bool quiet;                 /* no progress output */
    int32_t fail_at_step;       /* test-only fault injection: step N's forward fails (0 = off) */
    bool no_prefix_cache;       /* off: full KV blocks are not cached for later requests (forks of
                                   one prompt's sequences still share blocks) */
    bool no_block_sharing;      /* test only: no sharing at all (prefix cache off, share_from ignored),
                                   the reference that sharing must match */
    double step_timeout;        /* step watchdog, seconds (TP > 1): > 0 this bound for every step,
                                   0 derived per step (pln_engine_step_bound), < 0 off */
} pln_engine_opts;

void pln_engine_opts_default(pln_engine_opts *o);

/* Whether --int-dot s (NULL/"" = unset) turns the integer-dot path on for a set of dtype ("fp16",
 * "int8", "int4"): 1 on, 0 off, 2 unset (the backend's default); -1 + error naming opt, the value
 * and the choices for anything else. Pure. */
int pln_engine_int_dot_choice(const char *opt, const char *s, const char *dtype);

/* The CUDA device a rank uses: an explicit device (>= 0, the same on every rank: a single-GPU
 * run, or CUDA_VISIBLE_DEVICES set per rank) wins; else with gpus_per_node N > 0 the node-local
 * rank modulo N; else the node-local rank (mpirun's one process per GPU). -1 (unset) is allowed
 * for device; gpus_per_node 0 means unset. Returns the device, or -1 with an error naming the
 * field when device < -1, gpus_per_node < 0 or local_rank < 0. Pure: touches no device. */
int pln_engine_pick_device(int device, int gpus_per_node, int local_rank);

/* The step watchdog's bound in seconds for a step feeding n_tokens tokens (0 = no bound):
 * timeout_s itself when > 0; 0 when timeout_s < 0; else derived from the model size: 10 s plus
 * the step's arithmetic (2 FLOP per weight byte per token, int8 or fp16 alike, pessimistic) at
 * 10 GFLOP/s on the CPU backend or 1 TFLOP/s on CUDA. Rank 0 fails a step past its bound with
 * a message naming the rank that stopped answering (comm.h); the other ranks wait twice the
 * bound plus 5 s, so rank 0 speaks first. Pure. */
double pln_engine_step_bound(double timeout_s, const char *backend, uint64_t weight_bytes, int64_t n_tokens);

/* Opens this rank's shard of the set (the comm's rank and size must match the set's TP; else a
 * clear error). NULL + error on failure. */
pln_engine *pln_engine_open(const pln_engine_opts *opts, pln_comm *comm);
void pln_engine_close(pln_engine *e);

typedef struct {
    int32_t slot;
    int32_t n_new;              /* tokens fed this step (>= 1) */
    const int32_t *tokens;      /* [n_new] */
    bool sample;                /* sample a next token after this step's last token */
    pln_sample_params params;   /* used when sample (seeded on the slot's first step) */
    int32_t top_n;              /* sample: also return the top_n (<= PLN_TOP_MAX) most likely tokens */
    bool prompt_logprobs;       /* return the log-prob of each fed token's successor (prompt scoring):
                                   logits are computed for every fed row, so only when asked */
    int32_t next_token;         /* prompt_logprobs: the token after this chunk (-1: none, e.g. the
                                   prompt's end, where the sampled token takes over) */
    int32_t share_from;         /* slot + 1 of a running sequence with the same prompt whose full KV
                                   blocks a fresh slot shares instead of computing them (n > 1,
                                   best_of); 0 = none. Checked token by token: a mismatch just
                                   shares less */
} pln_step_seq;

typedef struct {
    int32_t n_seqs;
    const pln_step_seq *seqs;
    int32_t n_release;          /* slots to free before this step runs */
    const int32_t *release;
    bool want_logits;           /* tests: return full-vocab raw logits of every fed token */
} pln_step_plan;

typedef struct {
    int32_t token;              /* sampled id (-1 when !sample, or when nonfinite) */
    bool nonfinite;             /* sample: this row's logits were not finite (NaN or infinite on some
                                   rank: corrupt weights or an overflow), so nothing was sampled and
                                   the sequence must end with an error; the slot stays claimed and
                                   the step counts as done (other rows are unaffected) */
    float logprob;              /* log-softmax of the raw logits at that id */
    int32_t n_top;              /* top_n: the most likely tokens of the sampling distribution (the
                                   candidates after penalties and temperature, best first), each with
                                   its log-prob under the raw logits like `logprob` */
    int32_t top_ids[PLN_TOP_MAX];
    float top_logprobs[PLN_TOP_MAX];
    /* prompt_logprobs (engine-owned, valid until the next step): row j (0 <= j < n_new) scores the
     * token after fed token j (tokens[j + 1], or next_token for the last row; NAN when there is
     * none): its raw log-prob in prompt_lp[j], and the top_n most likely raw tokens in
     * prompt_top_ids / prompt_top_lp[j * PLN_TOP_MAX + 0 .. top_n) (id -1 past the vocabulary). */
    const float *prompt_lp;
    const int32_t *prompt_top_ids;
    const float *prompt_top_lp;
    float *logits;              /* want_logits: [n_new, n_vocab] raw logits (engine-owned,
                                   valid until the next step) */
} pln_step_out;

/* The error of a sequence whose logits were not finite (pln_step_out.nonfinite). */
#define PLN_NONFINITE_MSG "the model produced non-finite logits (NaN or infinite): its weights may be corrupt " \
                          "(run `pollen verify` on the shard set)"

/* Test-only fault injection: with PLN_FAULT_NAN_LOGITS_AT_STEP=N in the environment (read at
 * open, on every rank), the sampled rows of step N (counting steps that feed tokens, from 1)
 * are overwritten with NaN after the forward pass, as corrupt weights would leave them; "N+"
 * does so at step N and every step after it. */
#define PLN_ENGINE_FAULT_NAN_ENV "PLN_FAULT_NAN_LOGITS_AT_STEP"

/* Rank 0 only. Runs one step; out has plan->n_seqs entries. -1 + error when the plan is invalid
 * (unknown slot, over max_seq_len, out of KV blocks) or the forward pass fails; after a forward
 * failure every slot in the plan is released and the engine stays usable. The plan's releases
 * take effect in every case (an invalid plan changes nothing else), unless the release list
 * itself names an unknown slot. */
int pln_engine_step(pln_engine *e, const pln_step_plan *plan, pln_step_out *out);
/* Ranks != 0: serve steps until shutdown. Returns 0 on a clean shutdown. */
int pln_engine_worker_loop(pln_engine *e);
/* Rank 0: tells the workers to leave their loop. */
void pln_engine_shutdown(pln_engine *e);

/* Facts for /info, generate --json and the scheduler. */
typedef struct {
    int32_t tp, rank;
    int64_t n_vocab;            /* real vocabulary (logits beyond are never sampled) */
    int64_t hidden, n_head, n_layer;
    const char *dtype;          /* "fp16", "int8" or "int4" */
    const char *backend;
    int64_t kv_blocks_total, kv_blocks_free;
    int32_t block_size, max_seqs, max_seq_len;
    const char *kv_dtype;       /* "f32" or "f16" */
    bool int_dot;               /* the integer-dot path is on and the set has weights it takes */
    bool batch_invariant;       /* the backend's batch-invariant mode is on */
    const char *cpu_tune;       /* where the backend's tuning came from: "off", "cached",
                                   "measured", or NULL when the backend has none */
    const char *cpu_tune_model; /* the distances timed on this model's own decode step
                                   (kernels/cpu/tune.c CPU_TUNE_MODEL_NOTE): "cached", "measured",
                                   or NULL where they were not (off, TP > 1, a small model) */
    int cpu_pf_kinds;           /* weight kinds with a prefetch distance (0: no tune) */
    const char *cpu_pf_kind[5]; /* their names ("fp16", "int8", "int8_grouped", "int4", "fp16_batch") */
    int64_t cpu_pf_ahead[5];    /* each kind's CPU prefetch distance in bytes (PLN_TUNE_MAX_KINDS),
                                   the low bit PLN_TUNE_PF_L2 set where it prefetches into L2 */
    double load_seconds;
    double load_bytes_per_s;    /* weights streamed to the device (CUDA); 0 when mapped in place */
    uint64_t weight_bytes;      /* this rank's */
    uint64_t kv_bytes_per_token;/* this rank's KV cache bytes per token (all layers, K and V) */
    /* The arithmetic of a step, this rank's share (every rank's is the same): multiply-adds per
     * token in the layers' linear weights, per row of logits, and per key each query reads in
     * attention (q.k and p.v over every layer's heads), and the keys a query reads at most (a
     * sliding window; 0: every key before it). */
    int64_t layer_macs_per_token, lm_macs_per_row, attn_macs_per_key;
    int32_t attn_window;
    bool prefix_cache;          /* automatic prefix caching on */
    int64_t kv_blocks_cached;   /* full blocks registered in the prefix cache */
    int64_t prefix_query_tokens;/* prompt tokens looked up in the prefix cache (whole blocks) */
    int64_t prefix_hit_tokens;  /* of those, found: their KV was not computed again */
    int64_t fork_tokens;        /* tokens whose KV blocks a sequence shared from a sibling */
    int32_t n_eos;              /* the ids that end generation (config.json's eos_token_id, one or a list) */
    int32_t eos_ids[PLN_MAX_EOS];
} pln_engine_info;
void pln_engine_get_info(const pln_engine *e, pln_engine_info *info);

/* The tokenizer file the set's manifest names (borrowed), or NULL when it names none. */
const char *pln_engine_tokenizer_path(const pln_engine *e);

#endif
