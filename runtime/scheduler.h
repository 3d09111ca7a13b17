/* scheduler.h — continuous batching on rank 0: admits generation jobs, packs every engine step
 * with one decode token per running sequence plus chunks of waiting prompts (a token budget per
 * step), samples with each sequence's own parameters, detects EOS / stop sequences / length, and
 * releases a finished or abandoned sequence's slot and KV blocks in the very next step.
 *
 * Threads: pln_sched_run() is the only caller of the engine (rank 0's main thread, so MPI is
 * only ever used from one thread). HTTP threads submit jobs, read their events and cancel them;
 * a job has its own mutex and condition variable and is reference counted between the two sides.
 *
 * The engine and the tokenizer are reached through small interfaces so the same scheduler runs
 * over the real engine (runtime/engine.h) and over a test engine. */
#ifndef PLN_SCHEDULER_H
#define PLN_SCHEDULER_H

#include "runtime/engine.h"
#include "runtime/httpreq.h"
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define PLN_EOS_ID 2   /* BLOOM's </s>: the end id when the engine names none (pln_engine_info.eos_ids) */

typedef struct {
    void *ctx;
    /* pln_engine_step semantics (engine.h). */
    int (*step)(void *ctx, const pln_step_plan *plan, pln_step_out *out);
    void (*get_info)(void *ctx, pln_engine_info *info);
} pln_sched_engine;

typedef struct {
    void *ctx;
    /* Encodes text; *ids is malloc'd. add_special applies the tokenizer's post-processor (Llama's
     * BOS; add_special_tokens=True), as text prompts are; a rendered chat template, which writes
     * its own specials, is encoded without. -1 + pln_errorf on failure. Must be thread-safe. */
    int (*encode)(void *ctx, const char *text, bool add_special, int32_t **ids, int32_t *n);
    /* Raw bytes of ids concatenated (special tokens as their text when !skip_special); malloc'd,
     * NUL-terminated, may end inside a UTF-8 sequence. NULL on failure. Thread-safe. */
    char *(*decode)(void *ctx, const int32_t *ids, int32_t n, bool skip_special, size_t *len);
    /* True for special tokens (<unk> <s> </s> <pad>). */
    bool (*is_special)(void *ctx, int32_t id);
} pln_sched_tok;

typedef enum {
    PLN_FINISH_NONE = 0, PLN_FINISH_LENGTH, PLN_FINISH_EOS, PLN_FINISH_STOP,
    PLN_FINISH_ERROR, PLN_FINISH_CANCELLED
} pln_finish;
/* TGI names: "length", "eos_token", "stop_sequence", "error", "cancelled". */
const char *pln_finish_name(pln_finish f);

/* An alternative token (TGI top_tokens, OpenAI top_logprobs). */
typedef struct {
    int32_t id;
    float logprob;
    char *text;       /* sanitized UTF-8 */
} pln_tok_alt;

/* One generated token as the HTTP side sees it. */
typedef struct {
    int32_t id;
    float logprob;
    bool special;
    int32_t n_top;    /* the job's top_n (fewer only if the vocabulary is smaller) */
    pln_tok_alt top[PLN_TOP_MAX];
    char *text;       /* this token's own text, sanitized UTF-8 (details / TGI stream token.text) */
    char *delta;      /* text that became final with this token (stream "text"); concatenating
                         every delta gives exactly the final generated text */
} pln_tok_event;

typedef struct {
    /* set at creation */
    int32_t *prompt_ids;
    int32_t n_prompt;
    int32_t prompt_index;         /* which of the request's prompts (sequences of one prompt are
                                     consecutive: best_of of them) */
    /* prompt_logprobs: prompt_lp[i] is the log-prob of prompt token i given the ones before
     * (NAN for i = 0), prompt_top[i * top_n ...] its alternatives (text NULL); complete once the
     * first token is out */
    float *prompt_lp;
    pln_tok_alt *prompt_top;
    /* guarded by the job's mutex; written by the scheduler */
    pln_tok_event *events;
    int32_t n_events, cap_events;
    pln_finish finish;            /* NONE while running */
    char *text;                   /* final generated text (set with finish) */
    char *error;                  /* message when finish == ERROR */
    uint64_t seed;                /* the seed used (drawn when the request had none) */
    double logprob_sum;           /* of the generated tokens (best_of ranks by it) */
    double t_submit, t_first, t_done;
    double t_admit;               /* given a slot (0: never) */
    /* scheduler-private */
    int32_t slot;                 /* -1 until admitted */
    int32_t n_fed;                /* prompt tokens fed so far */
    int32_t *gen;                 /* generated ids (EOS included) */
    int32_t n_gen;
    int32_t *text_ids;            /* generated ids that make up the text (EOS excluded) */
    int32_t n_text;
    size_t emitted;               /* bytes of text already handed out as deltas */
    int64_t blocks_reserved;
    bool queued;                  /* still waiting for a slot */
} pln_seq;

typedef struct pln_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                     /* HTTP side + scheduler */
    pln_api api;
    int32_t n_seqs;               /* n_prompts * best_of */
    pln_seq *seqs;
    int32_t n_prompts, best_of, n_answer;   /* n_answer (OpenAI n) of every best_of are answered */
    int32_t top_n;
    bool prompt_logprobs;
    int32_t max_new_tokens;
    pln_sample_params sample;
    bool do_sample;
    bool seed_set;
    char **stop;                  /* owned copies */
    int32_t n_stop;
    bool stop_excluded;           /* OpenAI: text ends before the stop sequence; TGI keeps it */
    const char *max_tokens_field; /* the request's name for max_new_tokens (static; for errors) */
    bool cancelled;               /* set by the HTTP side (client gone) */
    int32_t n_finished;
    struct pln_job *next;         /* scheduler's list */
} pln_job;

/* Builds a job from a parsed request and its tokenized prompts (ids copied): best_of sequences
 * per prompt, the first with the request's seed, the others with seeds derived from it (or each
 * its own drawn seed). Never fails. The caller holds one reference. */
pln_job *pln_job_create(const pln_gen_request *req, int32_t *const *prompt_ids, const int32_t *n_prompt);
/* Once the job has finished: order[0..best_of) gets the indices of prompt p's sequences, highest
 * total log-prob first (lower index on ties); the first n_answer are the answer. */
void pln_job_rank(const pln_job *j, int32_t p, int32_t *order);
void pln_job_unref(pln_job *j);
/* Asks the scheduler to drop the job's sequences at the next step (client disconnected). */
void pln_job_cancel(pln_job *j);

typedef struct pln_sched pln_sched;

/* lim is copied. NULL + error if the engine info makes the limits impossible. */
pln_sched *pln_sched_create(const pln_sched_engine *eng, const pln_sched_tok *tok, const pln_serve_limits *lim);
void pln_sched_free(pln_sched *s);

/* Queues a job (takes its own reference). -1 with err filled: 429 when admitting it would exceed
 * max_concurrent_requests, 503 when draining or unhealthy, 422/400 when a sequence can never fit
 * the KV cache. Never blocks on the engine. */
int pln_sched_submit(pln_sched *s, pln_job *j, pln_req_error *err);

/* Runs steps until pln_sched_stop() was called and every job has finished (drain), then
 * returns 0. Call from one thread (the one that owns the engine). */
int pln_sched_run(pln_sched *s);
/* Refuse new jobs, finish the running ones, then let pln_sched_run return. Async-signal-safe
 * enough to call from a signal-watching thread (it only sets a flag and signals). */
void pln_sched_stop(pln_sched *s);

/* Snapshot for /health, /info and /metrics. */
#define PLN_HIST_BUCKETS 14
typedef struct {
    uint64_t count;
    double sum;
    uint64_t buckets[PLN_HIST_BUCKETS];   /* cumulative counts for pln_hist_bounds */
} pln_hist;
extern const double pln_hist_bounds_seconds[PLN_HIST_BUCKETS];
extern const double pln_hist_bounds_batch[PLN_HIST_BUCKETS];

typedef struct {
    bool healthy, draining;
    char unhealthy_reason[256];
    int32_t queued, running;        /* sequences */
    int32_t last_batch_size;        /* sequences in the last step */
    int32_t last_batch_tokens;
    uint64_t steps;
    uint64_t generated_tokens, prompt_tokens;
    uint64_t finished[PLN_FINISH_CANCELLED + 1];
    int64_t kv_blocks_total, kv_blocks_free, kv_blocks_reserved;
    bool prefix_cache;
    int64_t kv_blocks_cached, prefix_query_tokens, prefix_hit_tokens, fork_tokens;
    int32_t block_size, max_seqs;
    pln_hist ttft, tpot, batch;
} pln_sched_stats;
void pln_sched_get_stats(pln_sched *s, pln_sched_stats *st);
void pln_sched_engine_info(pln_sched *s, pln_engine_info *info);

#endif
