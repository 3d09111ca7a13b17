/* engine.c — the step engine over one rank's shards: plan broadcast from rank 0, KV blocks per
 * slot, the forward pass, and the exchange that lets rank 0 sample from a vocabulary split across
 * ranks without gathering whole logit rows.
 *
 * Candidate exchange: every rank takes the top k of its (processed) vocab slice per sampled row
 * plus the slice's max and sum of exp; an all-gather gives every rank the same candidate lists,
 * so the decision "do these candidates decide top-p?" (pln_sample_candidates_suffice) is made
 * identically everywhere and, only when they do not, full rows are gathered. The global
 * log-sum-exp is the online-softmax merge of the per-rank (max, sumexp) pairs, so log-probs are
 * exact whatever the TP size. */
#include "runtime/engine.h"
#include "kernels/backend.h"
#include "kernels/pln_math.h"
#include "runtime/comm.h"
#include "runtime/kvcache.h"
#include "runtime/loader.h"
#include "runtime/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CMD_STEP = 1, CMD_SHUTDOWN = 2 };
#define MIN_CANDIDATES 64

typedef struct {
    bool active;
    int32_t n_pos;               /* tokens already in the KV cache */
    uint8_t *seen_bits;          /* [ceil(n_vocab / 8)] distinct ids fed so far */
    int32_t *seen;               /* those ids, in first-seen order */
    int32_t n_seen, cap_seen;
    pln_rng rng;                 /* rank 0: seeded on the slot's first step */
    bool sampled;                /* a token was sampled: every token fed from now on was generated */
    bool shared;                 /* every position so far sits in shared blocks (may share more) */
    int32_t *hist;               /* [max_seq_len] tokens fed (block hashes, fork checks) */
    int32_t *gen_ids, *gen_cnt;  /* distinct generated ids fed so far and their counts (OpenAI
                                    presence / frequency penalties) */
    int32_t n_gen_ids, cap_gen;
} eng_slot;

/* The plan as it travels to the workers: a fixed header, then releases, sequences, tokens. */
typedef struct {
    int32_t cmd, n_seqs, n_release, want_logits, n_tokens, pad_;
} wire_head;
typedef struct {
    int32_t slot, n_new, sample, top_n, prompt_logprobs, next_token, share_from, pad_;
    pln_sample_params params;
} wire_seq;

/* A growable host or device buffer. */
typedef struct { void *p; size_t cap; } gbuf;

struct pln_engine {
    pln_engine_opts opts;
    char *shard_dir;
    char *backend_name;
    pln_comm *comm;
    int rank, tp;
    pln_backend *be;
    pln_backend_tune tune;      /* what the backend's tune hook chose (source NULL: none) */
    pln_loader *ld;
    pln_model *model;
    pln_kvcache kv;
    pln_model_config cfg;
    eng_slot *slots;
    int64_t step_no;
    int64_t fault_nan_step;     /* PLN_ENGINE_FAULT_NAN_ENV (0 = off) */
    bool fault_nan_onward;      /* "N+": that step and every later one */
    bool shut_down;
    double load_seconds;
    int64_t fork_tokens;
    /* host scratch */
    gbuf wire, ids, seq, pos, bt, rows, cand, gath, full, out_logits, lp_host[4];
    gbuf plp, plp_ids, plp_lp;   /* prompt log-prob results handed out in pln_step_out */
    /* device scratch for logit processing */
    gbuf d_pen, d_invt, d_off, d_seen;
};

static void *grow(gbuf *b, size_t n) {
    if (n > b->cap) { b->p = pln_xrealloc(b->p, n); b->cap = n; }
    return b->p;
}
static void *dgrow(pln_backend *be, gbuf *b, size_t n) {
    if (n == 0) n = 4;
    if (n > b->cap) {
        if (b->p) be->free(be, b->p);
        b->p = be->alloc(be, n);
        b->cap = b->p ? n : 0;
    }
    return b->p;
}

void pln_engine_opts_default(pln_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->device = -1;
    o->gpus_per_node = 0;
    o->max_seqs = 64;
    o->max_seq_len = 2048;
    o->kv_tokens = 0;
    o->block_size = 16;
}

int pln_engine_pick_device(int device, int gpus_per_node, int local_rank) {
    if (device < -1) return pln_errorf("device: %d is not a device index (>= 0, or -1 = pick by local rank)", device);
    if (gpus_per_node < 0)
        return pln_errorf("gpus_per_node: %d is not a GPU count (>= 1, or 0 = unset: one GPU per local rank)", gpus_per_node);
    if (local_rank < 0) return pln_errorf("local_rank: %d is negative (the launcher's node-local rank)", local_rank);
    if (device >= 0) return device;
    return gpus_per_node > 0 ? local_rank % gpus_per_node : local_rank;
}

double pln_engine_step_bound(double timeout_s, const char *backend, uint64_t weight_bytes, int64_t n_tokens) {
    if (timeout_s > 0) return timeout_s;
    if (timeout_s < 0) return 0;
    double rate = backend && !strcmp(backend, "cuda") ? 1e12 : 1e10;
    return 10.0 + 2.0 * (double)weight_bytes * (double)(n_tokens > 0 ? n_tokens : 1) / rate;
}

static double step_bound(const pln_engine *e, int64_t n_tokens) {
    if (e->tp == 1) return 0;   /* nothing to wait for */
    return pln_engine_step_bound(e->opts.step_timeout, e->backend_name, e->ld ? pln_loader_weight_bytes(e->ld) : 0,
                                 n_tokens);
}

/* The backend's message knows only the device index (and, when it is out of range, says how to
 * pick another); say which rank picked it and how. Never starts with "rank ": generate prints such
 * messages from rank 0 only. */
static void device_error_context(const pln_engine_opts *o, int rank, int local, int device) {
    char old[1024], how[64];
    snprintf(old, sizeof old, "%s", pln_error());
    if (o->device >= 0) snprintf(how, sizeof how, "--device %d", o->device);
    else if (o->gpus_per_node > 0) snprintf(how, sizeof how, "local rank %% --gpus-per-node %d", o->gpus_per_node);
    else snprintf(how, sizeof how, "its local rank; --gpus-per-node unset");
    pln_errorf("CUDA device %d for MPI rank %d (local rank %d on its node, from %s): %s", device, rank, local, how, old);
}

/* Every rank reports its status; returns the first failing rank, or -1 when all are fine, or -2
 * when the exchange itself failed (the comm has recorded why, a rank gone or stopped: callers keep
 * that message). */
static int agree(pln_comm *c, int rc) {
    int n = pln_comm_size(c);
    int32_t mine = rc ? 1 : 0, all[1024];
    if (n > 1024) return rc ? pln_comm_rank(c) : -1;
    if (pln_comm_allgather(c, &mine, all, sizeof mine)) return -2;
    for (int i = 0; i < n; i++) if (all[i]) return i;
    return -1;
}

/* The backend's calibration on this model's own decode step (kernels/cpu/tune.c
 * CPU_TUNE_MODEL_NOTE): one sequence of TUNE_CTX tokens in slot 0, put there by the first step
 * the backend asks for (none when its choice is cached or the tune is off), then each step
 * decodes one more token at the same position (its KV entry written over each time), the head's
 * logits included, as pollen bench's batch-1 steps do. One process only (TP 1): the backend
 * chooses how many steps to run, and several ranks' steps are collectives every rank must join.
 * The blocks are given back before the engine serves anything. */
#define TUNE_CTX 32
typedef struct { pln_engine *e; int32_t ctx; bool primed; } tune_ctx;

static int tune_step(void *p) {
    tune_ctx *t = p;
    pln_engine *e = t->e;
    float *logits;
    if (!t->primed) {
        t->primed = true;
        if (pln_kv_reserve(&e->kv, 0, t->ctx + 1)) return -1;
        int32_t ids[TUNE_CTX], seq[TUNE_CTX], pos[TUNE_CTX], row = t->ctx - 1;
        for (int32_t i = 0; i < t->ctx; i++) {
            ids[i] = (int32_t)(((int64_t)i * 7919 + 13) % e->cfg.vocab_size);
            seq[i] = 0;
            pos[i] = i;
        }
        if (t->ctx > 0 && pln_model_forward(e->model, &e->kv, ids, t->ctx, seq, pos, 1, pln_kv_table(&e->kv, 0), &row, 1,
                                            &logits))
            return -1;
    }
    int32_t id = (int32_t)(7919 % e->cfg.vocab_size), seq = 0, row = 0, pos = t->ctx;
    return pln_model_forward(e->model, &e->kv, &id, 1, &seq, &pos, 1, pln_kv_table(&e->kv, 0), &row, 1, &logits);
}

static int tune_on_model(pln_engine *e, const char *mode, bool quiet) {
    /* what decides which kernels the step runs and what they read */
    char *key = pln_xasprintf("%s, hidden %lld, %lld layers, %lld heads, vocabulary %lld, %s group %lld, %llu bytes, "
                              "int-dot %s, batch-invariant %s", e->cfg.layout, (long long)e->cfg.hidden,
                              (long long)e->cfg.n_layer, (long long)e->cfg.n_head, (long long)e->cfg.vocab_size,
                              e->cfg.dtype, (long long)e->cfg.group_size,
                              (unsigned long long)pln_loader_weight_bytes(e->ld), e->be->int_dot ? "on" : "off",
                              e->be->batch_invariant ? "on" : "off");
    tune_ctx t = {e, e->opts.max_seq_len - 1 < TUNE_CTX ? e->opts.max_seq_len - 1 : TUNE_CTX, false};
    e->tune.warning[0] = '\0';   /* tune's own was printed */
    int rc = e->be->tune_model(e->be, mode, key, tune_step, &t, quiet, &e->tune);
    free(key);
    if (!rc && e->tune.warning[0]) fprintf(stderr, "pollen: warning: %s\n", e->tune.warning);
    if (t.primed) pln_kv_release(&e->kv, 0);
    return rc;
}

static void slot_reset(pln_engine *e, int32_t s) {
    eng_slot *sl = &e->slots[s];
    for (int32_t i = 0; i < sl->n_seen; i++) sl->seen_bits[sl->seen[i] >> 3] &= (uint8_t)~(1u << (sl->seen[i] & 7));
    sl->n_seen = 0;
    sl->n_pos = 0;
    sl->active = false;
    sl->sampled = false;
    sl->n_gen_ids = 0;
}

/* Counts a generated token fed back into slot (presence / frequency penalties). */
static void slot_count_gen(eng_slot *sl, int32_t id) {
    for (int32_t i = 0; i < sl->n_gen_ids; i++)
        if (sl->gen_ids[i] == id) { sl->gen_cnt[i]++; return; }
    if (sl->n_gen_ids == sl->cap_gen) {
        sl->cap_gen = sl->cap_gen ? 2 * sl->cap_gen : 32;
        sl->gen_ids = pln_xrealloc(sl->gen_ids, (size_t)sl->cap_gen * sizeof(int32_t));
        sl->gen_cnt = pln_xrealloc(sl->gen_cnt, (size_t)sl->cap_gen * sizeof(int32_t));
    }
    sl->gen_ids[sl->n_gen_ids] = id;
    sl->gen_cnt[sl->n_gen_ids++] = 1;
}

static bool has_pf_penalty(const pln_sample_params *p) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* OpenAI's presence + frequency penalty of id in slot (what is subtracted from its logit). */
static float pf_penalty(const eng_slot *sl, const pln_sample_params *p, int32_t id) {
    for (int32_t i = 0; i < sl->n_gen_ids; i++)
        if (sl->gen_ids[i] == id) return p->frequency_penalty * (float)sl->gen_cnt[i] + p->presence_penalty;
    return 0.0f;
}

static void slot_release(pln_engine *e, int32_t s) {
    if (s < 0 || s >= e->opts.max_seqs) return;
    pln_kv_release(&e->kv, s);
    slot_reset(e, s);
}

static void slot_see(pln_engine *e, eng_slot *sl, int32_t id) {
    if (id < 0 || id >= e->cfg.vocab_size) return;
    uint8_t bit = (uint8_t)(1u << (id & 7));
    if (sl->seen_bits[id >> 3] & bit) return;
    sl->seen_bits[id >> 3] |= bit;
    if (sl->n_seen == sl->cap_seen) {
        sl->cap_seen = sl->cap_seen ? 2 * sl->cap_seen : 64;
        sl->seen = pln_xrealloc(sl->seen, (size_t)sl->cap_seen * sizeof(int32_t));
    }
    sl->seen[sl->n_seen++] = id;
}

static bool slot_has_seen(const pln_engine *e, int32_t s, int32_t id) {
    if (id < 0 || id >= e->cfg.vocab_size) return false;
    return e->slots[s].seen_bits[id >> 3] & (1u << (id & 7));
}

int pln_engine_int_dot_choice(const char *opt, const char *s, const char *dtype) {
    if (!s || !*s) return 2;
    if (!strcmp(s, "on")) return 1;
    if (!strcmp(s, "off")) return 0;
    /* auto: int4's rounding of the weights dwarfs the int8 rounding of the activations; int8 and
     * fp16 sets keep the exact float path (docs/ARCHITECTURE.md, "The integer-dot path") */
    if (!strcmp(s, "auto")) return dtype && !strcmp(dtype, "int4");
    return pln_errorf("%s: '%s' is not one of on, off, auto", opt, s);
}

pln_engine *pln_engine_open(const pln_engine_opts *opts, pln_comm *comm) {
    double t0 = pln_now();
    pln_engine *e = pln_xcalloc(1, sizeof *e);
    e->opts = *opts;
    e->shard_dir = pln_xstrdup(opts->shard_dir);
    e->backend_name = pln_xstrdup(opts->backend && *opts->backend ? opts->backend : "cpu");
    e->opts.shard_dir = e->shard_dir;
    e->opts.backend = e->backend_name;
    if (e->opts.max_seqs < 1) e->opts.max_seqs = 64;
    if (e->opts.max_seq_len < 1) e->opts.max_seq_len = 2048;
    if (e->opts.block_size < 1) e->opts.block_size = 16;
    e->comm = comm;
    const char *fault = getenv(PLN_ENGINE_FAULT_NAN_ENV);
    if (fault && *fault) {
        char *end = NULL;
        e->fault_nan_step = strtoll(fault, &end, 10);
        e->fault_nan_onward = end && *end == '+';
    }
    e->rank = pln_comm_rank(comm);
    e->tp = pln_comm_size(comm);
    int bad;

    int local = pln_comm_local_rank(comm);
    int device = pln_engine_pick_device(opts->device, opts->gpus_per_node, local);
    e->be = device < 0 ? NULL : pln_backend_create(e->backend_name, device);
    if (!e->be && device >= 0 && !strcmp(e->backend_name, "cuda")) device_error_context(opts, e->rank, local, device);
    int rc = e->be ? 0 : -1;
    if (!rc && opts->kv_dtype && *opts->kv_dtype) {
        /* before anything sizes or allocates the KV cache */
        pln_dtype kv_dt;
        if (pln_kv_dtype_parse("kv_dtype", opts->kv_dtype, &kv_dt) || pln_backend_set_kv_dtype(e->be, kv_dt))
            rc = -1;
    }
    e->opts.kv_dtype = NULL;    /* opts->kv_dtype is the caller's; the backend now holds it */
    if ((bad = agree(comm, rc)) != -1) goto fail_rank;
    if (pln_comm_attach_backend(comm, e->be)) rc = -1;
    if ((bad = agree(comm, rc)) != -1) goto fail_rank;

    pln_loader_opts lo = {.populate = opts->populate, .verify = opts->verify, .quiet = opts->quiet || e->rank != 0};
    e->ld = pln_loader_open(e->shard_dir, e->rank, e->tp, e->be, &lo);
    if (!e->ld) rc = -1;
    if (!rc) {
        e->cfg = *pln_loader_config(e->ld);
        int idot = pln_engine_int_dot_choice("int_dot", opts->int_dot, e->cfg.dtype);
        if (idot < 0) rc = -1;
        else if (idot == 1 && !e->be->set_int_dot && !strcmp(opts->int_dot, "on"))
            rc = pln_errorf("int_dot on: the %s backend has no integer-dot path (it is the cpu backend's); "
                            "use --int-dot off or auto", e->backend_name);
        /* auto on an int4 set asks for the path only where the backend has one: elsewhere (cuda)
         * the backend's own kernels run, as with off */
        else if (idot != 2 && e->be->set_int_dot)
            e->be->set_int_dot(e->be, idot == 1);
    }
    e->opts.int_dot = NULL;     /* the caller's; the backend now holds the choice */
    if (!rc && opts->batch_invariant) {
        if (!e->be->set_batch_invariant)
            rc = pln_errorf("batch_invariant: the %s backend has no batch-invariant mode (it is the cpu "
                            "backend's); leave --batch-invariant off", e->backend_name);
        else
            e->be->set_batch_invariant(e->be, true);
    }
    if (!rc && e->be->tune) {
        /* once the set is known good, before the model allocates its buffers and KV cache */
        if (e->be->tune(e->be, opts->cpu_tune, &e->tune)) rc = -1;
        else if (e->tune.warning[0] && e->rank == 0)   /* a warning, not progress: --quiet keeps it */
            fprintf(stderr, "pollen: warning: %s\n", e->tune.warning);
    }
    e->opts.cpu_tune = NULL;    /* the caller's */
    if (!rc) {
        e->model = pln_model_create(e->be, comm, e->ld);
        if (!e->model) rc = -1;
    }
    if (!rc) {
        pln_model *m = e->model;
        uint64_t per_tok = pln_kv_bytes_per_token(e->be, (int32_t)e->cfg.n_layer, m->n_kv_local, m->head_dim);
        int64_t tokens = e->opts.kv_tokens;
        if (tokens <= 0) {
            /* Default: room for every slot at full length, capped at max(1 GiB, half the weights). */
            uint64_t budget = pln_loader_weight_bytes(e->ld) / 2;
            if (budget < (1ull << 30)) budget = 1ull << 30;
            tokens = (int64_t)e->opts.max_seqs * e->opts.max_seq_len;
            if (per_tok && (uint64_t)tokens > budget / per_tok) tokens = (int64_t)(budget / per_tok);
            if (tokens < e->opts.max_seq_len) tokens = e->opts.max_seq_len;
        }
        int64_t nb = (tokens + e->opts.block_size - 1) / e->opts.block_size;
        if (nb > INT32_MAX) nb = INT32_MAX;
        if (pln_kv_init(&e->kv, e->be, (int32_t)e->cfg.n_layer, m->n_kv_local, m->head_dim, (int32_t)nb,
                        e->opts.block_size, e->opts.max_seqs, e->opts.max_seq_len))
            rc = -1;
    }
    if ((bad = agree(comm, rc)) != -1) goto fail_rank;
    if (e->tp == 1 && e->be->tune_model && tune_on_model(e, opts->cpu_tune, opts->quiet)) goto fail_rank;

    e->slots = pln_xcalloc((size_t)e->opts.max_seqs, sizeof *e->slots);
    for (int32_t s = 0; s < e->opts.max_seqs; s++) {
        e->slots[s].seen_bits = pln_xcalloc((size_t)(e->cfg.vocab_size + 7) / 8, 1);
        e->slots[s].hist = pln_xmalloc((size_t)e->opts.max_seq_len * sizeof(int32_t));
    }
    if (!e->opts.no_prefix_cache && !e->opts.no_block_sharing && pln_kv_prefix_enable(&e->kv)) goto fail_rank;
    e->load_seconds = pln_now() - t0;
    return e;

fail_rank:
    if (!rc && bad >= 0) pln_errorf("rank %d of %d failed to start (its message is on its stderr)", bad, e->tp);
    pln_engine_close(e);
    return NULL;
}

static void gfree(gbuf *b) { free(b->p); b->p = NULL; b->cap = 0; }
static void dfree(pln_backend *be, gbuf *b) { if (b->p && be) be->free(be, b->p); b->p = NULL; b->cap = 0; }

void pln_engine_close(pln_engine *e) {
    if (!e) return;
    if (e->rank == 0 && e->slots && !e->shut_down) pln_engine_shutdown(e);
    if (e->slots) {
        for (int32_t s = 0; s < e->opts.max_seqs; s++) {
            free(e->slots[s].seen_bits); free(e->slots[s].seen); free(e->slots[s].gen_ids); free(e->slots[s].gen_cnt);
            free(e->slots[s].hist);
        }
        free(e->slots);
    }
    dfree(e->be, &e->d_pen); dfree(e->be, &e->d_invt); dfree(e->be, &e->d_off); dfree(e->be, &e->d_seen);
    if (e->kv.k_pool) pln_kv_free(&e->kv);
    pln_model_free(e->model);
    pln_loader_close(e->ld);
    if (e->be) pln_backend_destroy(e->be);
    gbuf *hb[] = {&e->wire, &e->ids, &e->seq, &e->pos, &e->bt, &e->rows, &e->cand, &e->gath, &e->full,
                  &e->out_logits, &e->lp_host[0], &e->lp_host[1], &e->lp_host[2], &e->lp_host[3],
                  &e->plp, &e->plp_ids, &e->plp_lp};
    for (size_t i = 0; i < sizeof hb / sizeof hb[0]; i++) gfree(hb[i]);
    free(e->shard_dir);
    free(e->backend_name);
    free(e);
}

/* Rank 0: checks a plan before anything is broadcast, so an invalid plan changes nothing. */
static int validate(pln_engine *e, const pln_step_plan *p) {
    int32_t ms = e->opts.max_seqs;
    if (p->n_seqs < 0 || p->n_release < 0 || p->n_seqs > ms || p->n_release > ms)
        return pln_errorf("step plan: %d sequences and %d releases (0..%d each)", p->n_seqs, p->n_release, ms);
    if ((p->n_seqs && !p->seqs) || (p->n_release && !p->release))
        return pln_errorf("step plan: NULL sequence or release array");
    bool *rel = pln_xcalloc((size_t)ms, 1), *used = pln_xcalloc((size_t)ms, 1);
    int rc = 0;
    int64_t free_blocks = e->kv.n_free, need = 0;
    for (int32_t i = 0; i < p->n_release && !rc; i++) {
        int32_t s = p->release[i];
        if (s < 0 || s >= ms) { rc = pln_errorf("step plan: release of unknown slot %d (slots 0..%d)", s, ms - 1); break; }
        rel[s] = true;
    }
    /* shared blocks come free only when every slot holding them goes */
    if (!rc && p->n_release) free_blocks += pln_kv_free_after_release(&e->kv, rel);
    for (int32_t i = 0; i < p->n_seqs && !rc; i++) {
        const pln_step_seq *q = &p->seqs[i];
        int32_t s = q->slot;
        if (s < 0 || s >= ms) { rc = pln_errorf("step plan: unknown slot %d (slots 0..%d)", s, ms - 1); break; }
        if (used[s]) { rc = pln_errorf("step plan: slot %d appears twice", s); break; }
        used[s] = true;
        if (q->n_new < 1 || !q->tokens) { rc = pln_errorf("step plan: slot %d feeds %d tokens (need >= 1)", s, q->n_new); break; }
        for (int32_t j = 0; j < q->n_new; j++)
            if (q->tokens[j] < 0 || q->tokens[j] >= e->cfg.vocab_size) {
                rc = pln_errorf("step plan: slot %d: token id %d out of range [0, %lld)", s, q->tokens[j],
                                (long long)e->cfg.vocab_size);
                break;
            }
        if (rc) break;
        if (q->sample && pln_sample_params_check(&q->params)) { rc = pln_error_context("slot %d", s); break; }
        if (q->share_from < 0 || q->share_from > ms) { rc = pln_errorf("step plan: slot %d: share_from %d (0..%d)", s, q->share_from, ms); break; }
        if (q->top_n < 0 || q->top_n > PLN_TOP_MAX) { rc = pln_errorf("step plan: slot %d: top_n %d (0..%d)", s, q->top_n, PLN_TOP_MAX); break; }
        if (q->prompt_logprobs && q->next_token >= e->cfg.vocab_size) {
            rc = pln_errorf("step plan: slot %d: next_token %d out of range", s, q->next_token);
            break;
        }
        int64_t have = (e->slots[s].active && !rel[s]) ? e->slots[s].n_pos : 0;
        if (have + q->n_new > e->opts.max_seq_len) {
            rc = pln_errorf("step plan: slot %d would hold %lld tokens, over max_seq_len %d", s,
                            (long long)(have + q->n_new), e->opts.max_seq_len);
            break;
        }
        int64_t bs = e->kv.block_size;
        int64_t held = (e->slots[s].active && !rel[s]) ? e->kv.n_used[s] : 0;
        int64_t want = (have + q->n_new + bs - 1) / bs;
        if (want > held) need += want - held;
    }
    if (!rc && need > free_blocks)
        rc = pln_errorf("step plan: out of KV blocks (%lld needed, %lld free of %d); release sequences or "
                        "raise the KV capacity", (long long)need, (long long)free_blocks, e->kv.n_blocks);
    free(rel);
    free(used);
    return rc;
}

/* Packs a plan for the workers; returns its payload size (after the header). */
static size_t pack(pln_engine *e, const pln_step_plan *p, wire_head *h) {
    int64_t nt = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) nt += p->seqs[i].n_new;
    *h = (wire_head){.cmd = CMD_STEP, .n_seqs = p->n_seqs, .n_release = p->n_release,
                     .want_logits = p->want_logits, .n_tokens = (int32_t)nt};
    size_t n = (size_t)p->n_release * 4 + (size_t)p->n_seqs * sizeof(wire_seq) + (size_t)nt * 4;
    uint8_t *b = grow(&e->wire, n + 1), *o = b;
    if (p->n_release) memcpy(o, p->release, (size_t)p->n_release * 4);
    o += (size_t)p->n_release * 4;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        wire_seq w = {.slot = p->seqs[i].slot, .n_new = p->seqs[i].n_new, .sample = p->seqs[i].sample,
                      .top_n = p->seqs[i].top_n, .prompt_logprobs = p->seqs[i].prompt_logprobs,
                      .next_token = p->seqs[i].next_token, .share_from = p->seqs[i].share_from,
                      .params = p->seqs[i].params};
        memcpy(o, &w, sizeof w);
        o += sizeof w;
    }
    for (int32_t i = 0; i < p->n_seqs; i++) {
        memcpy(o, p->seqs[i].tokens, (size_t)p->seqs[i].n_new * 4);
        o += (size_t)p->seqs[i].n_new * 4;
    }
    return n;
}

/* Workers: rebuilds the plan from the wire (the arrays point into e->wire and seqs). */
static int unpack(pln_engine *e, const wire_head *h, pln_step_plan *p, pln_step_seq **seqs_out) {
    const uint8_t *o = e->wire.p;
    memset(p, 0, sizeof *p);
    p->n_seqs = h->n_seqs;
    p->n_release = h->n_release;
    p->want_logits = h->want_logits;
    p->release = (const int32_t *)o;
    o += (size_t)h->n_release * 4;
    pln_step_seq *seqs = pln_xcalloc((size_t)(h->n_seqs > 0 ? h->n_seqs : 1), sizeof *seqs);
    for (int32_t i = 0; i < h->n_seqs; i++) {
        wire_seq w;
        memcpy(&w, o, sizeof w);
        o += sizeof w;
        seqs[i].slot = w.slot;
        seqs[i].n_new = w.n_new;
        seqs[i].sample = w.sample;
        seqs[i].top_n = w.top_n;
        seqs[i].prompt_logprobs = w.prompt_logprobs;
        seqs[i].next_token = w.next_token;
        seqs[i].share_from = w.share_from;
        seqs[i].params = w.params;
    }
    for (int32_t i = 0; i < h->n_seqs; i++) {
        seqs[i].tokens = (const int32_t *)o;
        o += (size_t)seqs[i].n_new * 4;
    }
    p->seqs = seqs;
    *seqs_out = seqs;
    return 0;
}

/* Keeps the best cap (value, id) pairs in bv/bi, best first: larger value, lower id on ties. */
static void top_insert(float *bv, int32_t *bi, int32_t *nb, int32_t cap, float v, int32_t id) {
    int32_t at;
    if (*nb < cap) {
        at = (*nb)++;
    } else {
        at = cap - 1;
        if (bv[at] > v || (bv[at] == v && bi[at] < id)) return;
    }
    while (at > 0 && (bv[at - 1] < v || (bv[at - 1] == v && bi[at - 1] > id))) {
        bv[at] = bv[at - 1]; bi[at] = bi[at - 1]; at--;
    }
    bv[at] = v; bi[at] = id;
}

static bool row_is_greedy(const pln_sample_params *p) { return pln_sample_is_greedy(p); }

/* The raw logit of tok from its processed value among the candidates: undo the presence /
 * frequency penalty, the temperature (it = 1 / temperature) and the repetition penalty. */
static float raw_value(const pln_engine *e, const pln_step_seq *q, const float *vals, const int32_t *ids, int32_t n,
                       int32_t tok, float it) {
    float v = 0;
    for (int32_t j = 0; j < n; j++) if (ids[j] == tok) { v = vals[j]; break; }
    float pr = q->params.repetition_penalty > 0 ? q->params.repetition_penalty : 1.0f;
    if (pr == 1.0f && it == 1.0f && !has_pf_penalty(&q->params)) return v;
    /* full rows had the presence / frequency penalty applied in place (scaled by it) */
    if (has_pf_penalty(&q->params)) v += pf_penalty(&e->slots[q->slot], &q->params, tok) * it;
    float raw = v / it;
    if (pr != 1.0f && slot_has_seen(e, q->slot, tok)) raw = raw > 0 ? raw * pr : raw / pr;
    return raw;
}

/* Per sampled row: processed candidates merged over ranks, sampling on rank 0. */
static int sample_rows(pln_engine *e, const pln_step_plan *p, const int32_t *srow_seq, int32_t ns,
                       float *logits, pln_step_out *out) {
    pln_backend *be = e->be;
    pln_model *m = e->model;
    int64_t Vr = m->Vr, V = e->cfg.vocab_size;
    int tp = e->tp;

    /* Logit processing inputs; raw statistics first when processing changes the row. */
    float *pen = grow(&e->lp_host[0], (size_t)ns * 4), *invt = grow(&e->lp_host[1], (size_t)ns * 4);
    int32_t *off = grow(&e->lp_host[2], (size_t)(ns + 1) * 4);
    bool nontrivial = false;
    int64_t kmax = MIN_CANDIDATES;
    off[0] = 0;
    for (int32_t r = 0; r < ns; r++) {
        const pln_step_seq *q = &p->seqs[srow_seq[r]];
        pen[r] = q->params.repetition_penalty > 0 ? q->params.repetition_penalty : 1.0f;
        invt[r] = row_is_greedy(&q->params) || q->params.temperature <= 0 ? 1.0f : 1.0f / q->params.temperature;
        if (pen[r] != 1.0f || invt[r] != 1.0f) nontrivial = true;
        /* One more than top_k: a tie at the k-th value then shows as an extra candidate, and
         * pln_sample_candidates_suffice can tell a complete top-k set from a cut one.
         * A top_k at or above the vocabulary keeps every token: it asks no candidates (and its +1
         * is taken in 64 bits, so INT32_MAX does not overflow). */
        int64_t want = q->params.top_k > 0 && q->params.top_k < V ? (int64_t)q->params.top_k + 1 : 0;
        if (want > kmax) kmax = want;
        off[r + 1] = off[r] + (pen[r] != 1.0f ? e->slots[q->slot].n_seen : 0);
    }
    int32_t k = (int32_t)(kmax < Vr ? kmax : Vr);

    /* Per-rank package: vals[ns*k] ids[ns*k] max[ns] sumexp[ns] rawmax[ns] rawsumexp[ns]. */
    size_t pk = (size_t)ns * k * 8 + (size_t)ns * 16;
    uint8_t *mine = grow(&e->cand, pk);
    float *vals = (float *)mine;
    int32_t *ids = (int32_t *)(mine + (size_t)ns * k * 4);
    float *rmax = (float *)(mine + (size_t)ns * k * 8), *rsum = rmax + ns, *wmax = rsum + ns, *wsum = wmax + ns;
    int rc = 0;
    if (nontrivial) {
        rc = be->topk(be, logits, ns, Vr, m->v0, 1, vals, ids, wmax, wsum);
        int32_t *seen = grow(&e->lp_host[3], (size_t)(off[ns] > 0 ? off[ns] : 1) * 4);
        for (int32_t r = 0; r < ns && !rc; r++)
            if (off[r + 1] > off[r])
                memcpy(seen + off[r], e->slots[p->seqs[srow_seq[r]].slot].seen, (size_t)(off[r + 1] - off[r]) * 4);
        void *dp = dgrow(be, &e->d_pen, (size_t)ns * 4), *di = dgrow(be, &e->d_invt, (size_t)ns * 4);
        void *dof = dgrow(be, &e->d_off, (size_t)(ns + 1) * 4), *ds = dgrow(be, &e->d_seen, (size_t)(off[ns] + 1) * 4);
        if (!rc && (!dp || !di || !dof || !ds)) rc = -1;
        if (!rc) rc = be->upload(be, dp, pen, (size_t)ns * 4);
        if (!rc) rc = be->upload(be, di, invt, (size_t)ns * 4);
        if (!rc) rc = be->upload(be, dof, off, (size_t)(ns + 1) * 4);
        if (!rc && off[ns]) rc = be->upload(be, ds, seen, (size_t)off[ns] * 4);
        pln_logit_proc lp = {.n_rows = ns, .penalty = dp, .inv_temperature = di, .seen_offsets = dof, .seen_ids = ds};
        if (!rc) rc = be->logit_process(be, logits, m->v0, Vr, &lp);
    }
    if (!rc) rc = be->topk(be, logits, ns, Vr, m->v0, k, vals, ids, rmax, rsum);
    if (!nontrivial) { memcpy(wmax, rmax, (size_t)ns * 4); memcpy(wsum, rsum, (size_t)ns * 4); }
    /* Agree on success before the exchange so every rank makes the same collective calls. */
    int bad = agree(e->comm, rc);
    if (bad != -1) {
        if (!rc && bad >= 0) pln_errorf("sampling failed on rank %d (its message is on its stderr)", bad);
        return -1;
    }
    uint8_t *all = grow(&e->gath, pk * (size_t)tp);
    if (pln_comm_allgather(e->comm, mine, all, pk)) return -1;

    /* Rows whose candidates cannot decide top-p get their full processed row gathered. */
    float *cv = grow(&e->lp_host[0], (size_t)tp * k * 4 + 4);
    pen = NULL; invt = NULL;   /* lp_host[0] reused: pen/invt no longer needed */
    int32_t *ci = pln_xmalloc((size_t)tp * k * 4 + 4);
    float *lse = pln_xmalloc((size_t)ns * 4), *rawlse = pln_xmalloc((size_t)ns * 4);
    int32_t *full_rows = pln_xmalloc((size_t)ns * 4), nf = 0;
    for (int32_t r = 0; r < ns; r++) {
        pln_softmax_state st = {-INFINITY, 0}, ws = {-INFINITY, 0};
        int32_t n = 0;
        for (int q = 0; q < tp; q++) {
            const uint8_t *b = all + pk * (size_t)q;
            const float *qv = (const float *)b + (size_t)r * k;
            const int32_t *qi = (const int32_t *)(b + (size_t)ns * k * 4) + (size_t)r * k;
            const float *qm = (const float *)(b + (size_t)ns * k * 8);
            st = pln_softmax_merge(st, (pln_softmax_state){qm[r], qm[ns + r]});
            ws = pln_softmax_merge(ws, (pln_softmax_state){qm[2 * ns + r], qm[3 * ns + r]});
            for (int32_t j = 0; j < k; j++)
                if (qi[j] >= 0 && qi[j] < V && qv[j] != -INFINITY) { cv[n] = qv[j]; ci[n] = qi[j]; n++; }
        }
        lse[r] = st.m + logf(st.s);
        rawlse[r] = ws.m + logf(ws.s);
        const pln_sample_params *sp = &p->seqs[srow_seq[r]].params;
        /* presence / frequency penalties change logits the candidates may not include: full row */
        if (n < 1 || has_pf_penalty(sp) || (!row_is_greedy(sp) && !pln_sample_candidates_suffice(sp, cv, n, lse[r], V)))
            full_rows[nf++] = r;
    }
    float *full = NULL;
    if (nf > 0) {
        /* Every rank computed the same nf: gather those rows whole. */
        size_t rb = (size_t)Vr * 4;
        float *minef = grow(&e->full, rb * (size_t)nf * (size_t)(tp + 1));
        float *allf = minef + (size_t)Vr * nf;
        for (int32_t i = 0; i < nf && !rc; i++)
            rc = be->download(be, minef + (size_t)i * Vr, logits + (size_t)full_rows[i] * Vr, rb);
        if (agree(e->comm, rc) != -1 || pln_comm_allgather(e->comm, minef, allf, rb * (size_t)nf)) {
            free(ci); free(lse); free(rawlse); free(full_rows);
            return pln_errorf("full-row logits exchange failed");
        }
        full = allf;
    }

    if (e->rank == 0) {
        int32_t fi = 0;
        for (int32_t r = 0; r < ns; r++) {
            int32_t si = srow_seq[r];
            const pln_step_seq *q = &p->seqs[si];
            const float *use_v = cv;
            const int32_t *use_i = ci;
            int32_t n = 0;
            float *fv = NULL;
            int32_t *fids = NULL;
            if (fi < nf && full_rows[fi] == r) {
                fv = pln_xmalloc((size_t)V * 4);
                fids = pln_xmalloc((size_t)V * 4);
                for (int qr = 0; qr < tp; qr++) {
                    const float *src = full + ((size_t)qr * nf + fi) * Vr;
                    for (int64_t j = 0; j < Vr; j++) {
                        int64_t g = (int64_t)qr * Vr + j;
                        if (g < V) { fv[g] = src[j]; fids[g] = (int32_t)g; }
                    }
                }
                use_v = fv; use_i = fids; n = (int32_t)V;
                fi++;
            } else {
                for (int qq = 0; qq < tp; qq++) {
                    const uint8_t *b = all + pk * (size_t)qq;
                    const float *qv = (const float *)b + (size_t)r * k;
                    const int32_t *qi = (const int32_t *)(b + (size_t)ns * k * 4) + (size_t)r * k;
                    for (int32_t j = 0; j < k; j++)
                        if (qi[j] >= 0 && qi[j] < V && qv[j] != -INFINITY) { cv[n] = qv[j]; ci[n] = qi[j]; n++; }
                }
            }
            /* NaN or infinite logits on any rank show in its raw row statistics (a NaN row has
             * max -inf, an infinite logit max +inf, either a NaN softmax sum): sampling from
             * them would produce a meaningless token and a NaN log-prob, so the row fails. */
            bool finite = isfinite(lse[r]);
            for (int qq = 0; qq < tp; qq++) {
                const float *qm = (const float *)(all + pk * (size_t)qq + (size_t)ns * k * 8);
                finite &= isfinite(qm[2 * ns + r]) && isfinite(qm[3 * ns + r]) && isfinite(qm[r]) && isfinite(qm[ns + r]);
            }
            if (!finite) {
                /* fi already moved past this row when its full row was taken above */
                out[si].nonfinite = true;
                free(fv);
                free(fids);
                continue;
            }
            pln_sample_params sp = q->params;
            if (row_is_greedy(&sp)) sp.do_sample = false;
            float it = row_is_greedy(&q->params) || q->params.temperature <= 0 ? 1.0f : 1.0f / q->params.temperature;
            const eng_slot *sl = &e->slots[q->slot];
            float row_lse = lse[r];
            if (fv && has_pf_penalty(&q->params) && sl->n_gen_ids > 0) {
                /* OpenAI order: penalties on the logits, then temperature; the row is already
                 * divided by it, so the penalty is too. The pick's normaliser changes with them. */
                for (int32_t g = 0; g < sl->n_gen_ids; g++) {
                    int32_t id = sl->gen_ids[g];
                    if (id >= 0 && id < V) fv[id] -= pf_penalty(sl, &q->params, id) * it;
                }
                double mx = -INFINITY, acc = 0;
                for (int64_t g = 0; g < V; g++) if (fv[g] > mx) mx = fv[g];
                for (int64_t g = 0; g < V; g++) acc += exp((double)fv[g] - mx);
                row_lse = (float)(mx + log(acc));
            }
            int32_t tok = pln_sample_pick(&sp, &e->slots[q->slot].rng, use_v, use_i, n, row_lse, NULL);
            float raw = raw_value(e, q, use_v, use_i, n, tok, it);
            out[si].n_top = 0;
            if (q->top_n > 0) {
                /* the top_n best candidates of the sampling distribution */
                float tv[PLN_TOP_MAX];
                int32_t nt = 0;
                for (int32_t j = 0; j < n; j++)
                    if (!isnan(use_v[j]) && use_v[j] != -INFINITY) top_insert(tv, out[si].top_ids, &nt, q->top_n, use_v[j], use_i[j]);
                for (int32_t t = 0; t < nt; t++)
                    out[si].top_logprobs[t] = raw_value(e, q, use_v, use_i, n, out[si].top_ids[t], it) - rawlse[r];
                out[si].n_top = nt;
            }
            out[si].token = tok;
            out[si].logprob = raw - rawlse[r];
            if (!isfinite(out[si].logprob)) { out[si].token = -1; out[si].nonfinite = true; }
            free(fv);
            free(fids);
        }
    }
    free(ci); free(lse); free(rawlse); free(full_rows);
    return 0;
}

/* Prompt scoring: R raw logit rows (the fed tokens of the prompt_logprobs sequences, in plan
 * order) → per row the raw log-prob of the next token and the top_n raw alternatives. Each rank
 * sends, per row, its slice's top k, max and sum of exp, and the target's logit when the target
 * is in its slice (else -inf); rank 0 merges them, so the result does not depend on the TP size. */
static int prompt_rows(pln_engine *e, const pln_step_plan *p, float *logits, int32_t R, pln_step_out *out) {
    pln_backend *be = e->be;
    pln_model *m = e->model;
    int64_t Vr = m->Vr, V = e->cfg.vocab_size;
    int tp = e->tp;
    int32_t k = 1;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].prompt_logprobs && p->seqs[i].top_n > k) k = p->seqs[i].top_n;
    if (k > Vr) k = (int32_t)Vr;
    /* per row: vals[k] ids[k] max sum target */
    size_t per = (size_t)k * 8 + 12, pk = per * (size_t)R;
    uint8_t *mine = grow(&e->cand, pk);
    float *vals = pln_xmalloc((size_t)R * k * 4), *mx = pln_xmalloc((size_t)R * 4), *sm = pln_xmalloc((size_t)R * 4);
    int32_t *ids = pln_xmalloc((size_t)R * k * 4);
    int rc = be->topk(be, logits, R, Vr, m->v0, k, vals, ids, mx, sm);
    int32_t r = 0;
    for (int32_t i = 0; i < p->n_seqs && !rc; i++) {
        const pln_step_seq *q = &p->seqs[i];
        if (!q->prompt_logprobs) continue;
        for (int32_t j = 0; j < q->n_new && !rc; j++, r++) {
            int32_t tgt = j + 1 < q->n_new ? q->tokens[j + 1] : q->next_token;
            float tv = -INFINITY;
            if (tgt >= 0 && tgt >= m->v0 && tgt < m->v0 + Vr)
                rc = be->download(be, &tv, logits + (size_t)r * Vr + (tgt - m->v0), 4);
            uint8_t *o = mine + per * (size_t)r;
            memcpy(o, vals + (size_t)r * k, (size_t)k * 4);
            memcpy(o + (size_t)k * 4, ids + (size_t)r * k, (size_t)k * 4);
            memcpy(o + (size_t)k * 8, &mx[r], 4);
            memcpy(o + (size_t)k * 8 + 4, &sm[r], 4);
            memcpy(o + (size_t)k * 8 + 8, &tv, 4);
        }
    }
    free(vals); free(mx); free(sm); free(ids);
    int bad = agree(e->comm, rc);
    if (bad != -1) {
        if (!rc && bad >= 0) pln_errorf("prompt scoring failed on rank %d (its message is on its stderr)", bad);
        return -1;
    }
    uint8_t *all = grow(&e->gath, pk * (size_t)tp);
    if (pln_comm_allgather(e->comm, mine, all, pk)) return -1;
    if (e->rank != 0 || !out) return 0;
    float *lp = grow(&e->plp, (size_t)R * 4);
    int32_t *tid = grow(&e->plp_ids, (size_t)R * PLN_TOP_MAX * 4);
    float *tlp = grow(&e->plp_lp, (size_t)R * PLN_TOP_MAX * 4);
    r = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pln_step_seq *q = &p->seqs[i];
        if (!q->prompt_logprobs) continue;
        out[i].prompt_lp = lp + r;
        out[i].prompt_top_ids = tid + (size_t)r * PLN_TOP_MAX;
        out[i].prompt_top_lp = tlp + (size_t)r * PLN_TOP_MAX;
        for (int32_t j = 0; j < q->n_new; j++, r++) {
            pln_softmax_state st = {-INFINITY, 0};
            float tv = -INFINITY;
            int32_t *bi = tid + (size_t)r * PLN_TOP_MAX;
            float *bv = tlp + (size_t)r * PLN_TOP_MAX;
            int32_t nb = 0;
            for (int32_t c = 0; c < PLN_TOP_MAX; c++) { bi[c] = -1; bv[c] = NAN; }   /* fewer than top_n: id -1 */
            for (int qq = 0; qq < tp; qq++) {
                const uint8_t *o = all + pk * (size_t)qq + per * (size_t)r;
                float qm, qs, qt;
                memcpy(&qm, o + (size_t)k * 8, 4);
                memcpy(&qs, o + (size_t)k * 8 + 4, 4);
                memcpy(&qt, o + (size_t)k * 8 + 8, 4);
                st = pln_softmax_merge(st, (pln_softmax_state){qm, qs});
                if (qt > tv) tv = qt;
                for (int32_t c = 0; c < k && q->top_n > 0; c++) {
                    float v;
                    int32_t id;
                    memcpy(&v, o + (size_t)c * 4, 4);
                    memcpy(&id, o + (size_t)k * 4 + (size_t)c * 4, 4);
                    if (id < 0 || id >= V || isnan(v) || v == -INFINITY) continue;
                    top_insert(bv, bi, &nb, q->top_n, v, id);
                }
            }
            float lse = st.m + logf(st.s);
            int32_t tgt = j + 1 < q->n_new ? q->tokens[j + 1] : q->next_token;
            lp[r] = tgt >= 0 && tv != -INFINITY ? tv - lse : NAN;
            for (int32_t c = 0; c < nb; c++) bv[c] -= lse;
        }
    }
    return 0;
}

/* Fork: the fresh slot of q takes the leading full blocks of the slot named by share_from, as
 * many as hold the same tokens (at most limit). Returns the blocks taken. */
static int32_t share_fork(pln_engine *e, const pln_step_seq *q, int32_t limit) {
    int32_t src = q->share_from - 1, bs = e->kv.block_size;
    if (src == q->slot || !e->slots[src].active) return 0;
    int32_t nb = e->slots[src].n_pos / bs;
    if (nb > limit) nb = limit;
    int32_t same = 0;
    while (same < nb && !memcmp(e->slots[src].hist + (int64_t)same * bs, q->tokens + (int64_t)same * bs, (size_t)bs * 4)) same++;
    int32_t got = pln_kv_fork(&e->kv, q->slot, src, same);
    e->fork_tokens += (int64_t)got * bs;
    return got;
}

/* Runs one validated plan on this rank (every rank runs it). */
static int run_step(pln_engine *e, const pln_step_plan *p, pln_step_out *out) {
    pln_model *m = e->model;
    pln_backend *be = e->be;
    for (int32_t i = 0; i < p->n_release; i++) slot_release(e, p->release[i]);
    if (p->n_seqs == 0) return 0;
    e->step_no++;

    int64_t T = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) T += p->seqs[i].n_new;
    int32_t mb = e->kv.max_blocks;
    int32_t *ids = grow(&e->ids, (size_t)T * 4), *seq = grow(&e->seq, (size_t)T * 4), *pos = grow(&e->pos, (size_t)T * 4);
    int32_t *bt = grow(&e->bt, (size_t)p->n_seqs * mb * 4);
    int32_t *rows = grow(&e->rows, (size_t)(p->n_seqs + 2 * T) * 4);
    int32_t *srow_seq = pln_xmalloc((size_t)p->n_seqs * 4);
    int32_t *tok0 = pln_xmalloc((size_t)p->n_seqs * 4);   /* first token index of each sequence */
    int32_t ns = 0, t = 0, S = 0, bs = e->kv.block_size;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pln_step_seq *q = &p->seqs[i];
        eng_slot *sl = &e->slots[q->slot];
        if (!sl->active) {
            sl->active = true;
            sl->n_pos = 0;
            sl->shared = true;
            pln_rng_seed(&sl->rng, q->params.seed);
        }
        /* Share whole blocks while every earlier position was shared too; the block of the row
         * this step samples after stays the slot's own. Every rank takes the same decisions. */
        int32_t skip = 0;
        if (sl->shared && !e->opts.no_block_sharing && !p->want_logits && !q->prompt_logprobs && sl->n_pos % bs == 0 &&
            (int64_t)e->kv.n_used[q->slot] * bs == sl->n_pos) {
            int32_t limit = (q->n_new - (q->sample ? 1 : 0)) / bs, k = 0;
            if (sl->n_pos == 0 && q->share_from > 0) k = share_fork(e, q, limit);
            k += pln_kv_match(&e->kv, q->slot, q->tokens + (int64_t)k * bs, q->n_new - (int64_t)k * bs, limit - k);
            skip = k * bs;
        }
        if (skip < q->n_new) sl->shared = false;
        /* Validated on rank 0 against the same state: cannot fail here. */
        PLN_ASSERT(pln_kv_reserve(&e->kv, q->slot, (int64_t)sl->n_pos + q->n_new) == 0);
        tok0[i] = t;
        for (int32_t j = 0; j < q->n_new; j++) {
            sl->hist[sl->n_pos + j] = q->tokens[j];
            slot_see(e, sl, q->tokens[j]);
            if (sl->sampled) slot_count_gen(sl, q->tokens[j]);
        }
        if (skip < q->n_new) {
            memcpy(bt + (size_t)S * mb, pln_kv_table(&e->kv, q->slot), (size_t)mb * 4);
            for (int32_t j = skip; j < q->n_new; j++, t++) {
                ids[t] = q->tokens[j];
                seq[t] = S;
                pos[t] = sl->n_pos + j;
            }
            S++;
        }
        if (q->sample) { srow_seq[ns] = i; rows[ns++] = t - 1; sl->sampled = true; }
        if (out) memset(&out[i], 0, sizeof out[i]), out[i].token = -1;
    }
    T = t;   /* tokens computed: shared ones are not */
    int32_t nrows = ns;
    if (p->want_logits) for (int32_t j = 0; j < T; j++) rows[nrows++] = j;
    int32_t prow0 = nrows;   /* prompt-scoring rows follow */
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].prompt_logprobs)
            for (int32_t j = 0; j < p->seqs[i].n_new; j++) rows[nrows++] = tok0[i] + j;

    float *logits = NULL;
    int rc = 0;
    if (e->opts.fail_at_step > 0 && e->step_no == e->opts.fail_at_step)
        rc = pln_errorf("forward pass: injected failure at step %lld (fail_at_step)", (long long)e->step_no);
    else if (T > 0)   /* else every token of the step was shared: nothing to compute */
        rc = pln_model_forward(m, &e->kv, ids, (int32_t)T, seq, pos, S, bt, rows, nrows, &logits);
    int bad = agree(e->comm, rc);
    if (bad != -1) {
        if (!rc && bad >= 0) pln_errorf("forward pass failed on rank %d (its message is on its stderr)", bad);
        goto fail;
    }
    for (int32_t i = 0; i < p->n_seqs; i++) {
        eng_slot *sl = &e->slots[p->seqs[i].slot];
        sl->n_pos += p->seqs[i].n_new;
        pln_kv_commit(&e->kv, p->seqs[i].slot, sl->hist, sl->n_pos);
    }

    if (p->want_logits) {
        /* Raw rows first (sampling processes its rows in place, which come before these). */
        int64_t Vr = m->Vr, V = e->cfg.vocab_size;
        size_t nb = (size_t)T * Vr * 4;
        float *mine = grow(&e->full, nb * (size_t)(e->tp + 1));
        float *allr = mine + (size_t)T * Vr;
        rc = be->download(be, mine, logits + (size_t)ns * Vr, nb);
        if (agree(e->comm, rc) != -1 || pln_comm_allgather(e->comm, mine, allr, nb)) { rc = -1; goto fail; }
        if (e->rank == 0) {
            float *o = grow(&e->out_logits, (size_t)T * V * 4);
            for (int32_t q = 0; q < e->tp; q++)
                for (int64_t tt = 0; tt < T; tt++) {
                    int64_t g0 = (int64_t)q * Vr, n = V - g0 < Vr ? V - g0 : Vr;
                    if (n > 0) memcpy(o + tt * V + g0, allr + ((size_t)q * T + tt) * Vr, (size_t)n * 4);
                }
            if (out) {
                int64_t at = 0;
                for (int32_t i = 0; i < p->n_seqs; i++) { out[i].logits = o + at * V; at += p->seqs[i].n_new; }
            }
        }
    }
    if (ns > 0 && e->fault_nan_step > 0 &&
        (e->step_no == e->fault_nan_step || (e->fault_nan_onward && e->step_no > e->fault_nan_step))) {
        /* the sampled rows come first in logits; the raw rows of want_logits were copied above */
        size_t nb = (size_t)ns * (size_t)m->Vr * 4;
        float *nan_rows = pln_xmalloc(nb);
        for (size_t i = 0; i < nb / 4; i++) nan_rows[i] = NAN;
        rc = be->upload(be, logits, nan_rows, nb);
        free(nan_rows);
        if (agree(e->comm, rc) != -1) { rc = -1; goto fail; }
    }
    if (nrows > prow0 && prompt_rows(e, p, logits + (size_t)prow0 * m->Vr, nrows - prow0, out)) { rc = -1; goto fail; }
    if (ns > 0 && sample_rows(e, p, srow_seq, ns, logits, out)) { rc = -1; goto fail; }
    free(srow_seq);
    free(tok0);
    return 0;

fail:
    /* The slots in a failed plan are released on every rank: their KV state is unknown. */
    free(srow_seq);
    free(tok0);
    for (int32_t i = 0; i < p->n_seqs; i++) slot_release(e, p->seqs[i].slot);
    return -1;
}

int pln_engine_step(pln_engine *e, const pln_step_plan *plan, pln_step_out *out) {
    if (e->rank != 0) return pln_errorf("pln_engine_step: only rank 0 drives steps (rank %d)", e->rank);
    if (e->shut_down) return pln_errorf("pln_engine_step: engine was shut down");
    if (validate(e, plan)) {
        /* The plan's releases still take effect (the scheduler counts those slots free again),
         * provided the release list itself is valid. */
        bool rel_ok = plan->n_release > 0 && plan->release && plan->n_release <= e->opts.max_seqs;
        for (int32_t i = 0; rel_ok && i < plan->n_release; i++)
            if (plan->release[i] < 0 || plan->release[i] >= e->opts.max_seqs) rel_ok = false;
        if (rel_ok) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", pln_error());
            pln_step_plan rp = {.n_release = plan->n_release, .release = plan->release};
            pln_engine_step(e, &rp, NULL);
            pln_errorf("%s", msg);
        }
        return -1;
    }
    int64_t n_tokens = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) n_tokens += plan->seqs[i].n_new;
    pln_comm_step_begin(e->comm, step_bound(e, n_tokens));
    if (e->tp > 1) {
        wire_head h;
        size_t n = pack(e, plan, &h);
        if (pln_comm_bcast(e->comm, &h, sizeof h, 0) || pln_comm_bcast(e->comm, e->wire.p, n, 0)) {
            pln_comm_step_end(e->comm);
            return pln_error_context("broadcasting the step plan");
        }
    }
    int rc = run_step(e, plan, out);
    pln_comm_step_end(e->comm);
    return rc;
}

int pln_engine_worker_loop(pln_engine *e) {
    if (e->rank == 0) return pln_errorf("pln_engine_worker_loop: rank 0 drives steps");
    for (;;) {
        wire_head h;
        /* No bound while idle: the wait for the next plan sleeps (comm.h) for as long as it takes. */
        if (pln_comm_bcast(e->comm, &h, sizeof h, 0)) return pln_error_context("waiting for a step plan");
        if (h.cmd == CMD_SHUTDOWN) { e->shut_down = true; return 0; }
        if (h.cmd != CMD_STEP || h.n_seqs < 0 || h.n_release < 0 || h.n_tokens < 0)
            return pln_errorf("worker: malformed step plan header (cmd %d)", h.cmd);
        size_t n = (size_t)h.n_release * 4 + (size_t)h.n_seqs * sizeof(wire_seq) + (size_t)h.n_tokens * 4;
        grow(&e->wire, n + 1);
        double bound = step_bound(e, h.n_tokens);
        pln_comm_step_begin(e->comm, bound > 0 ? 2 * bound + 5 : 0);
        if (pln_comm_bcast(e->comm, e->wire.p, n, 0)) return pln_error_context("receiving a step plan");
        pln_step_plan p;
        pln_step_seq *seqs;
        unpack(e, &h, &p, &seqs);
        if (run_step(e, &p, NULL))
            fprintf(stderr, "pollen: rank %d: step %lld failed: %s\n", e->rank, (long long)e->step_no, pln_error());
        pln_comm_step_end(e->comm);
        free(seqs);
    }
}

void pln_engine_shutdown(pln_engine *e) {
    if (e->rank != 0 || e->shut_down) return;
    e->shut_down = true;
    if (e->tp > 1) {
        wire_head h = {.cmd = CMD_SHUTDOWN};
        pln_comm_bcast(e->comm, &h, sizeof h, 0);
    }
}

void pln_engine_get_info(const pln_engine *e, pln_engine_info *info) {
    memset(info, 0, sizeof *info);
    info->tp = e->tp;
    info->rank = e->rank;
    info->n_vocab = e->cfg.vocab_size;
    info->hidden = e->cfg.hidden;
    info->n_head = e->cfg.n_head;
    info->n_layer = e->cfg.n_layer;
    info->n_eos = e->cfg.hf.n_eos > 0 ? e->cfg.hf.n_eos : 1;
    for (int32_t i = 0; i < info->n_eos; i++)
        info->eos_ids[i] = (int32_t)(e->cfg.hf.n_eos > 0 ? e->cfg.hf.eos_ids[i] : e->cfg.eos_id);
    info->dtype = e->cfg.dtype;
    info->backend = e->backend_name;
    info->kv_dtype = e->be ? pln_kv_dtype_name(e->be->kv_dtype) : "?";
    /* on and applying: fp16 weights (but a quantized embedding) never take the path */
    info->batch_invariant = e->be && e->be->batch_invariant;
    info->cpu_tune = e->tune.source;
    info->cpu_tune_model = e->tune.model_source;
    _Static_assert(sizeof info->cpu_pf_ahead / sizeof info->cpu_pf_ahead[0] == PLN_TUNE_MAX_KINDS,
                   "pln_engine_info holds every tuned kind");
    info->cpu_pf_kinds = e->tune.source ? e->tune.n_kinds : 0;
    for (int i = 0; i < info->cpu_pf_kinds; i++) {
        info->cpu_pf_kind[i] = e->tune.kind[i];
        info->cpu_pf_ahead[i] = e->tune.pf_ahead[i];
    }
    info->int_dot = e->be && e->be->int_dot && (strcmp(e->cfg.dtype, "fp16") || e->cfg.quantize_embedding);
    info->kv_blocks_total = e->kv.n_blocks;
    info->kv_blocks_free = e->kv.n_free;
    info->prefix_cache = e->kv.prefix_on;
    info->kv_blocks_cached = e->kv.n_cached;
    info->prefix_query_tokens = e->kv.query_blocks * e->kv.block_size;
    info->prefix_hit_tokens = e->kv.hit_blocks * e->kv.block_size;
    info->fork_tokens = e->fork_tokens;
    info->block_size = e->kv.block_size;
    info->max_seqs = e->opts.max_seqs;
    info->max_seq_len = e->opts.max_seq_len;
    info->load_seconds = e->load_seconds;
    info->load_bytes_per_s = e->ld ? pln_loader_rate(e->ld) : 0;
    info->weight_bytes = e->ld ? pln_loader_weight_bytes(e->ld) : 0;
    if (e->model) {
        const pln_model *m = e->model;
        info->kv_bytes_per_token = pln_kv_bytes_per_token(e->be, (int32_t)e->cfg.n_layer, m->n_kv_local, m->head_dim);
        info->layer_macs_per_token = m->layer_macs;
        info->lm_macs_per_row = m->Vr * m->H;
        info->attn_macs_per_key = 2 * (int64_t)m->n_head_local * m->head_dim * e->cfg.n_layer;
        info->attn_window = m->window;
    }
}

const char *pln_engine_tokenizer_path(const pln_engine *e) { return pln_loader_tokenizer_path(e->ld); }
