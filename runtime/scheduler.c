/* scheduler.c — continuous batching over the engine's step API (see scheduler.h).
 *
 * One loop iteration = one engine step:
 *   1. drop cancelled sequences (their slots go on the release list of this very step);
 *   2. admit waiting sequences in arrival order while a slot and enough KV blocks for
 *      prompt + max_new_tokens are free (reserving up front means a running sequence can never
 *      run out of cache half-way; the rest wait, bounded by max_concurrent_requests);
 *   3. plan: one token for every decoding sequence first (running requests are never starved),
 *      then prompt chunks of the waiting-to-prefill sequences from the remaining token budget
 *      (at least a quarter of it, so a full decode batch cannot starve new arrivals either);
 *   4. step, then turn each sampled token into an event, check EOS / stop / length, and finish
 *      sequences at once (their slot is released in the next step's plan).
 * Lock order: scheduler mutex, then a job's mutex. The engine is called without locks held. */
#include "runtime/scheduler.h"
#include "formats/common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const double pln_hist_bounds_seconds[PLN_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                          0.25, 0.5, 1, 2.5, 5, 10, 30};
const double pln_hist_bounds_batch[PLN_HIST_BUCKETS] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256};

const char *pln_finish_name(pln_finish f) {
    switch (f) {
    case PLN_FINISH_LENGTH: return "length";
    case PLN_FINISH_EOS: return "eos_token";
    case PLN_FINISH_STOP: return "stop_sequence";
    case PLN_FINISH_ERROR: return "error";
    case PLN_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

struct pln_sched {
    pln_sched_engine eng;
    pln_sched_tok tok;
    pln_serve_limits lim;
    pln_engine_info info;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pln_job *head, *tail;          /* active jobs in arrival order (scheduler holds a ref) */
    int32_t n_active;              /* sequences queued or running */
    bool stopping, unhealthy;
    char reason[256];
    int32_t *free_slots;
    int32_t n_free_slots;
    bool *slot_claimed;            /* the engine has seen the slot (it must be released there) */
    int32_t *release;              /* slots to release in the next plan */
    int32_t n_release;
    int64_t blocks_reserved;
    pln_rng rng;
    pln_sched_stats st;
    /* step buffers (scheduler thread only) */
    pln_step_seq *plan_seqs;
    pln_seq **plan_owner;
    pln_job **plan_job;
    pln_step_out *outs;
    int32_t *plan_release;
};

/* ---- jobs --------------------------------------------------------------------------------- */

pln_job *pln_job_create(const pln_gen_request *req, int32_t *const *prompt_ids, const int32_t *n_prompt) {
    pln_job *j = pln_xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->api = req->api;
    j->max_tokens_field = req->max_tokens_field ? req->max_tokens_field : req->api == PLN_API_TGI ? "max_new_tokens" : "max_tokens";
    j->n_prompts = req->n_prompts;
    j->best_of = req->best_of > 0 ? req->best_of : 1;
    j->n_answer = req->n > 0 && req->n <= j->best_of ? req->n : j->best_of;
    j->top_n = req->top_n;
    j->prompt_logprobs = req->prompt_logprobs;
    j->n_seqs = req->n_prompts * j->best_of;
    j->seqs = pln_xcalloc((size_t)j->n_seqs, sizeof *j->seqs);
    j->max_new_tokens = req->max_new_tokens;
    j->sample = req->sample;
    j->do_sample = !pln_sample_is_greedy(&req->sample);   /* a tiny temperature is greedy */
    j->seed_set = req->seed_set;
    j->n_stop = req->n_stop;
    j->stop = pln_xcalloc((size_t)(j->n_stop ? j->n_stop : 1), sizeof *j->stop);
    for (int32_t i = 0; i < j->n_stop; i++) j->stop[i] = pln_xstrdup(req->stop[i]);
    j->stop_excluded = req->api == PLN_API_OPENAI;
    double now = pln_now();
    for (int32_t i = 0; i < j->n_seqs; i++) {
        pln_seq *q = &j->seqs[i];
        int32_t pi = i / j->best_of, k = i % j->best_of;
        q->prompt_index = pi;
        q->n_prompt = n_prompt[pi];
        q->prompt_ids = pln_xmalloc(sizeof(int32_t) * (size_t)(n_prompt[pi] ? n_prompt[pi] : 1));
        memcpy(q->prompt_ids, prompt_ids[pi], sizeof(int32_t) * (size_t)n_prompt[pi]);
        q->slot = -1;
        q->queued = true;
        q->t_submit = now;
        /* siblings of one prompt must not draw the same tokens: a seed derived from the request's
         * (a splitmix64 step), kept within int64 for JSON */
        uint64_t sd = req->sample.seed;
        if (k > 0) {
            sd += 0x9E3779B97F4A7C15ull * (uint64_t)k;
            sd = (sd ^ (sd >> 30)) * 0xBF58476D1CE4E5B9ull;
            sd = (sd ^ (sd >> 27)) * 0x94D049BB133111EBull;
            sd = (sd ^ (sd >> 31)) >> 1;
        }
        q->seed = sd;
        q->gen = pln_xmalloc(sizeof(int32_t) * (size_t)(j->max_new_tokens + 1));
        q->text_ids = pln_xmalloc(sizeof(int32_t) * (size_t)(j->max_new_tokens + 1));
        if (j->prompt_logprobs) {
            q->prompt_lp = pln_xmalloc(sizeof(float) * (size_t)(q->n_prompt ? q->n_prompt : 1));
            for (int32_t t = 0; t < q->n_prompt; t++) q->prompt_lp[t] = NAN;
            if (j->top_n > 0) q->prompt_top = pln_xcalloc((size_t)q->n_prompt * (size_t)j->top_n, sizeof *q->prompt_top);
        }
    }
    return j;
}

static void job_free(pln_job *j) {
    for (int32_t i = 0; i < j->n_seqs; i++) {
        pln_seq *q = &j->seqs[i];
        for (int32_t e = 0; e < q->n_events; e++) {
            free(q->events[e].text);
            free(q->events[e].delta);
            for (int32_t t = 0; t < q->events[e].n_top; t++) free(q->events[e].top[t].text);
        }
        free(q->prompt_lp);
        free(q->prompt_top);
        free(q->events);
        free(q->prompt_ids);
        free(q->gen);
        free(q->text_ids);
        free(q->text);
        free(q->error);
    }
    free(j->seqs);
    for (int32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->stop);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void pln_job_rank(const pln_job *j, int32_t p, int32_t *order) {
    int32_t b = j->best_of;
    for (int32_t k = 0; k < b; k++) {   /* insertion sort: best_of is small */
        int32_t i = p * b + k, at = k;
        while (at > 0 && j->seqs[order[at - 1]].logprob_sum < j->seqs[i].logprob_sum) { order[at] = order[at - 1]; at--; }
        order[at] = i;
    }
}

void pln_job_unref(pln_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

void pln_job_cancel(pln_job *j) {
    pthread_mutex_lock(&j->mu);
    j->cancelled = true;
    pthread_mutex_unlock(&j->mu);
}

/* ---- scheduler ---------------------------------------------------------------------------- */

pln_sched *pln_sched_create(const pln_sched_engine *eng, const pln_sched_tok *tok, const pln_serve_limits *lim) {
    pln_sched *s = pln_xcalloc(1, sizeof *s);
    s->eng = *eng;
    s->tok = *tok;
    s->lim = *lim;
    eng->get_info(eng->ctx, &s->info);
    if (s->info.max_seqs <= 0 || s->info.block_size <= 0 || s->info.kv_blocks_total <= 0) {
        pln_errorf("scheduler: engine reports %d slots, block size %d, %lld KV blocks; all must be positive",
                   s->info.max_seqs, s->info.block_size, (long long)s->info.kv_blocks_total);
        free(s);
        return NULL;
    }
    if (lim->max_total_tokens > s->info.max_seq_len) {
        int32_t m = s->info.max_seq_len;
        free(s);
        pln_errorf("--max-total-tokens %d exceeds the engine's longest sequence %d: lower it or raise the engine's max_seq_len",
                   lim->max_total_tokens, m);
        return NULL;
    }
    if (lim->max_batch_tokens < 1 || lim->max_concurrent_requests < 1) {
        free(s);
        pln_errorf("--max-batch-tokens and --max-concurrent-requests must be at least 1");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int32_t n = s->info.max_seqs;
    s->free_slots = pln_xmalloc(sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) s->free_slots[i] = n - 1 - i;   /* pop gives slot 0 first */
    s->n_free_slots = n;
    s->slot_claimed = pln_xcalloc((size_t)n, sizeof *s->slot_claimed);
    s->release = pln_xmalloc(sizeof(int32_t) * (size_t)n);
    s->plan_release = pln_xmalloc(sizeof(int32_t) * (size_t)n);
    s->plan_seqs = pln_xcalloc((size_t)n, sizeof *s->plan_seqs);
    s->plan_owner = pln_xcalloc((size_t)n, sizeof *s->plan_owner);
    s->plan_job = pln_xcalloc((size_t)n, sizeof *s->plan_job);
    s->outs = pln_xcalloc((size_t)n, sizeof *s->outs);
    {
        /* Seeds drawn for requests without one: from the clock, so two runs differ (as TGI's do). */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
        for (int i = 0; i < 4; i++) {   /* splitmix64 */
            x += 0x9E3779B97F4A7C15ull;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s->rng.s[i] = z ^ (z >> 31);
        }
    }
    s->st.healthy = true;
    s->st.kv_blocks_total = s->info.kv_blocks_total;
    s->st.kv_blocks_free = s->info.kv_blocks_free;
    s->st.prefix_cache = s->info.prefix_cache;
    s->st.block_size = s->info.block_size;
    s->st.max_seqs = s->info.max_seqs;
    return s;
}

static uint64_t next_seed(pln_sched *s) {
    /* xoshiro256** step on the scheduler's own state (under s->mu) */
    uint64_t *q = s->rng.s;
    uint64_t r = ((q[1] * 5) << 7 | (q[1] * 5) >> 57) * 9;
    uint64_t t = q[1] << 17;
    q[2] ^= q[0]; q[3] ^= q[1]; q[1] ^= q[2]; q[0] ^= q[3]; q[2] ^= t;
    q[3] = (q[3] << 45) | (q[3] >> 19);
    return r >> 1;   /* fits a JSON integer (int64) */
}

void pln_sched_free(pln_sched *s) {
    if (!s) return;
    while (s->head) { pln_job *j = s->head; s->head = j->next; pln_job_unref(j); }
    free(s->free_slots);
    free(s->slot_claimed);
    free(s->release);
    free(s->plan_release);
    free(s->plan_seqs);
    free(s->plan_owner);
    free(s->plan_job);
    free(s->outs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static int64_t blocks_for(const pln_sched *s, int64_t tokens) {
    return (tokens + s->info.block_size - 1) / s->info.block_size;
}

int pln_sched_submit(pln_sched *s, pln_job *j, pln_req_error *err) {
    pln_api api = j->api;
    /* The engine refuses a whole step over one bad parameter set; refuse the request instead. */
    pln_sample_params sp = j->sample;
    sp.do_sample = j->do_sample;
    if (pln_sample_params_check(&sp))
        return pln_req_fail(err, api, api == PLN_API_TGI ? 422 : 400, NULL, "%s", pln_error());
    for (int32_t i = 0; i < j->n_seqs; i++)
        for (int32_t k = 0; k < j->seqs[i].n_prompt; k++)
            if (j->seqs[i].prompt_ids[k] < 0 || j->seqs[i].prompt_ids[k] >= s->info.n_vocab)
                return pln_req_fail(err, api, api == PLN_API_TGI ? 422 : 400, NULL,
                                    "prompt token id %d is outside the model's vocabulary (%lld): the tokenizer does not match the shards",
                                    j->seqs[i].prompt_ids[k], (long long)s->info.n_vocab);
    for (int32_t i = 0; i < j->n_seqs; i++) {
        int64_t need = blocks_for(s, (int64_t)j->seqs[i].n_prompt + j->max_new_tokens);
        if (need > s->info.kv_blocks_total)
            return pln_req_fail(err, api, api == PLN_API_TGI ? 422 : 400, j->max_tokens_field,
                                "the prompt + `%s` need %lld KV blocks of %d tokens; the cache holds %lld", j->max_tokens_field,
                                (long long)need, s->info.block_size, (long long)s->info.kv_blocks_total);
    }
    /* More sequences than may ever be in flight at once: no wait makes room, so this is the
     * client's request to change, not a retryable 429. */
    if (j->n_seqs > s->lim.max_concurrent_requests) {
        const char *bo = api == PLN_API_TGI || j->best_of > j->n_answer ? "best_of" : "n";
        const char *field = j->best_of > 1 ? bo : api == PLN_API_TGI ? "inputs" : "prompt";
        return pln_req_fail(err, api, api == PLN_API_TGI ? 422 : 400, field,
                            "the request needs %d sequences (%d prompt%s x `%s` %d), more than the %d the server runs at "
                            "once (--max-concurrent-requests %d): send fewer prompts or a smaller `%s`",
                            j->n_seqs, j->n_prompts, j->n_prompts == 1 ? "" : "s", bo, j->best_of,
                            s->lim.max_concurrent_requests, s->lim.max_concurrent_requests, j->best_of > 1 ? bo : "prompt");
    }
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->unhealthy) {
        rc = pln_req_fail(err, api, 503, NULL, "server is unhealthy: %s", s->reason);
    } else if (s->stopping) {
        rc = pln_req_fail(err, api, 503, NULL, "server is shutting down");
    } else if (s->n_active + j->n_seqs > s->lim.max_concurrent_requests) {
        rc = pln_req_fail(err, api, 429, NULL, "Model is overloaded: %d sequences in flight, the limit is %d (--max-concurrent-requests)",
                          s->n_active, s->lim.max_concurrent_requests);
        if (api == PLN_API_OPENAI) snprintf(err->code, sizeof err->code, "rate_limit_exceeded");
    } else {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        j->next = NULL;
        if (s->tail) s->tail->next = j; else s->head = j;
        s->tail = j;
        s->n_active += j->n_seqs;
        s->st.queued += j->n_seqs;
        for (int32_t i = 0; i < j->n_seqs; i++) {
            pln_seq *q = &j->seqs[i];
            if (j->do_sample && !j->seed_set) q->seed = next_seed(s);
        }
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void pln_sched_stop(pln_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s->st.draining = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void hist_add(pln_hist *h, const double *bounds, double v) {
    h->count++;
    h->sum += v;
    for (int i = 0; i < PLN_HIST_BUCKETS; i++)
        if (v <= bounds[i]) h->buckets[i]++;
}

/* Returns a sequence's slot (under s->mu): the engine must forget it in the next plan if it ever
 * saw it; unless the engine already dropped it (after a failed step). */
static void give_back_slot(pln_sched *s, pln_seq *q, bool engine_dropped) {
    if (q->slot >= 0) {
        if (s->slot_claimed[q->slot] && !engine_dropped) s->release[s->n_release++] = q->slot;
        else s->free_slots[s->n_free_slots++] = q->slot;
        s->slot_claimed[q->slot] = false;
        q->slot = -1;
    }
    s->blocks_reserved -= q->blocks_reserved;
    q->blocks_reserved = 0;
}

/* Scheduler half of ending a sequence (under s->mu). */
static void finish_sched(pln_sched *s, pln_seq *q, pln_finish why, bool engine_dropped) {
    give_back_slot(s, q, engine_dropped);
    if (q->queued) s->st.queued--; else s->st.running--;
    q->queued = false;
    s->n_active--;
    s->st.finished[why]++;
    if (why != PLN_FINISH_ERROR && why != PLN_FINISH_CANCELLED && q->n_gen > 1 && q->t_first > 0)
        hist_add(&s->st.tpot, pln_hist_bounds_seconds, (pln_now() - q->t_first) / (q->n_gen - 1));
}

/* Job half (under j->mu): after this the HTTP side may read everything in q. */
static void finish_job_locked(pln_job *j, pln_seq *q, pln_finish why, const char *error) {
    if (!q->text) q->text = pln_xstrdup("");
    if (error) q->error = pln_xstrdup(error);
    q->t_done = pln_now();
    q->finish = why;
    j->n_finished++;
    pthread_cond_broadcast(&j->cv);
}

/* Ends a sequence (under s->mu; takes the job's mutex). */
static void finish_seq(pln_sched *s, pln_job *j, pln_seq *q, pln_finish why, const char *error, bool engine_dropped) {
    if (q->finish != PLN_FINISH_NONE) return;
    finish_sched(s, q, why, engine_dropped);
    pthread_mutex_lock(&j->mu);
    finish_job_locked(j, q, why, error);
    pthread_mutex_unlock(&j->mu);
}

static size_t find_stop(const pln_job *j, const char *text, size_t len, size_t *stop_len) {
    size_t best = (size_t)-1;
    for (int32_t i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        const char *p = memmem(text, len, j->stop[i], sl);
        if (p && (size_t)(p - text) < best) { best = (size_t)(p - text); *stop_len = sl; }
    }
    return best;
}

/* Bytes at the end of text that could be the start of a stop sequence: held back from the
 * stream when the stop sequence is cut from the text (OpenAI), so nothing streamed is ever
 * taken back. */
static size_t stop_holdback(const pln_job *j, const char *text, size_t len) {
    size_t hold = 0;
    for (int32_t i = 0; i < j->n_stop; i++) {
        size_t sl = strlen(j->stop[i]);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, j->stop[i], k)) { hold = k; break; }
    }
    return hold;
}

static void push_event(pln_seq *q, pln_tok_event ev) {
    if (q->n_events == q->cap_events) {
        q->cap_events = q->cap_events ? q->cap_events * 2 : 16;
        q->events = pln_xrealloc(q->events, sizeof *q->events * (size_t)q->cap_events);
    }
    q->events[q->n_events++] = ev;
}

/* Whether tok ends generation: one of the model's end ids (config.json's eos_token_id, one or a
 * list); an engine that names none ends on BLOOM's </s>. */
static bool is_eos(const pln_sched *s, int32_t tok) {
    if (s->info.n_eos <= 0) return tok == PLN_EOS_ID;
    for (int32_t i = 0; i < s->info.n_eos && i < PLN_MAX_EOS; i++)
        if (tok == s->info.eos_ids[i]) return true;
    return false;
}

/* A sampled token for q (under s->mu). */
static void on_token(pln_sched *s, pln_job *j, pln_seq *q, const pln_step_out *o) {
    int32_t tok = o->token;
    float logprob = o->logprob;
    double now = pln_now();
    if (q->n_gen == 0) {
        q->t_first = now;
        hist_add(&s->st.ttft, pln_hist_bounds_seconds, now - q->t_submit);
    }
    q->gen[q->n_gen++] = tok;
    q->logprob_sum += logprob;
    s->st.generated_tokens++;
    pln_finish why = PLN_FINISH_NONE;
    if (is_eos(s, tok)) why = PLN_FINISH_EOS;
    else q->text_ids[q->n_text++] = tok;

    size_t full_len = 0;
    char *full = s->tok.decode(s->tok.ctx, q->text_ids, q->n_text, false, &full_len);
    if (!full) { full = pln_xstrdup(""); full_len = 0; }
    size_t final_len = full_len;
    if (why == PLN_FINISH_NONE && j->n_stop) {
        size_t sl = 0, p = find_stop(j, full, full_len, &sl);
        if (p != (size_t)-1) {
            why = PLN_FINISH_STOP;
            if (j->stop_excluded) final_len = p;
        }
    }
    if (why == PLN_FINISH_NONE && q->n_gen >= j->max_new_tokens) why = PLN_FINISH_LENGTH;

    size_t safe;
    if (why != PLN_FINISH_NONE) {
        safe = final_len;
    } else {
        safe = pln_utf8_complete_len(full, full_len);
        if (j->stop_excluded && j->n_stop) {
            size_t h = stop_holdback(j, full, full_len);
            if (full_len - h < safe) safe = full_len - h;
        }
    }
    if (safe < q->emitted) safe = q->emitted;
    pln_tok_event ev = {.id = tok, .logprob = logprob};
    ev.special = s->tok.is_special ? s->tok.is_special(s->tok.ctx, tok) : tok < 4;
    size_t tl = 0;
    char *raw = s->tok.decode(s->tok.ctx, &tok, 1, false, &tl);
    ev.text = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
    free(raw);
    for (int32_t t = 0; t < o->n_top && t < j->top_n && t < PLN_TOP_MAX; t++) {
        pln_tok_alt *a = &ev.top[ev.n_top++];
        a->id = o->top_ids[t];
        a->logprob = o->top_logprobs[t];
        raw = s->tok.decode(s->tok.ctx, &a->id, 1, false, &tl);
        a->text = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
        free(raw);
    }
    ev.delta = pln_utf8_sanitize(full + q->emitted, safe - q->emitted, NULL);
    q->emitted = safe;

    /* The last event and the finish land under one lock, so a reader never sees the last
     * token without knowing it is the last. */
    if (why != PLN_FINISH_NONE) finish_sched(s, q, why, false);
    pthread_mutex_lock(&j->mu);
    push_event(q, ev);
    if (why != PLN_FINISH_NONE) {
        q->text = pln_utf8_sanitize(full, final_len, NULL);
        finish_job_locked(j, q, why, NULL);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(full);
}

/* Prompt scoring results of one chunk (under s->mu; the HTTP side reads them only once the
 * sequence has finished). Row r scores token n_fed + r + 1. */
static void store_prompt_logprobs(pln_job *j, pln_seq *q, const pln_step_seq *ps, const pln_step_out *o) {
    if (!q->prompt_lp || !o->prompt_lp) return;
    for (int32_t r = 0; r < ps->n_new; r++) {
        int32_t at = q->n_fed + r + 1;
        if (at >= q->n_prompt) break;
        q->prompt_lp[at] = o->prompt_lp[r];
        for (int32_t t = 0; q->prompt_top && t < j->top_n; t++) {
            q->prompt_top[(size_t)at * j->top_n + t].id = o->prompt_top_ids[(size_t)r * PLN_TOP_MAX + t];
            q->prompt_top[(size_t)at * j->top_n + t].logprob = o->prompt_top_lp[(size_t)r * PLN_TOP_MAX + t];
        }
    }
}

static void remove_finished_jobs(pln_sched *s) {
    pln_job *prev = NULL, *j = s->head;
    while (j) {
        pln_job *next = j->next;
        if (j->n_finished == j->n_seqs) {
            if (prev) prev->next = next; else s->head = next;
            if (s->tail == j) s->tail = prev;
            pln_job_unref(j);
        } else {
            prev = j;
        }
        j = next;
    }
}

/* Fails every unfinished sequence (after a failed step, every job in flight gets the error). */
static void fail_all(pln_sched *s, const char *msg) {
    for (pln_job *j = s->head; j; j = j->next)
        for (int32_t i = 0; i < j->n_seqs; i++) finish_seq(s, j, &j->seqs[i], PLN_FINISH_ERROR, msg, false);
}

int pln_sched_run(pln_sched *s) {
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* 1. cancellations */
        for (pln_job *j = s->head; j; j = j->next) {
            pthread_mutex_lock(&j->mu);
            bool c = j->cancelled;
            pthread_mutex_unlock(&j->mu);
            if (c)
                for (int32_t i = 0; i < j->n_seqs; i++) finish_seq(s, j, &j->seqs[i], PLN_FINISH_CANCELLED, "client disconnected", false);
        }
        remove_finished_jobs(s);
        /* 2. admission, in arrival order */
        bool blocked = false;
        for (pln_job *j = s->head; j && !blocked; j = j->next) {
            for (int32_t i = 0; i < j->n_seqs; i++) {
                pln_seq *q = &j->seqs[i];
                if (!q->queued || q->finish != PLN_FINISH_NONE) continue;
                /* n > 1 / best_of: a prompt's other sequences start once the first has its prompt
                 * in the KV cache, and share its full blocks instead of computing them again */
                const pln_seq *first = &j->seqs[i - i % j->best_of];
                if (first != q && first->finish == PLN_FINISH_NONE && (first->queued || first->n_fed < first->n_prompt))
                    continue;
                int64_t need = blocks_for(s, (int64_t)q->n_prompt + j->max_new_tokens);
                if (s->n_free_slots == 0 || s->blocks_reserved + need > s->info.kv_blocks_total) { blocked = true; break; }
                q->slot = s->free_slots[--s->n_free_slots];
                q->blocks_reserved = need;
                s->blocks_reserved += need;
                q->queued = false;
                pthread_mutex_lock(&j->mu);   /* read by the HTTP side's request log */
                q->t_admit = pln_now();
                pthread_mutex_unlock(&j->mu);
                s->st.queued--;
                s->st.running++;
            }
        }
        /* 3. plan */
        int32_t n = 0, n_decode = 0;
        for (pln_job *j = s->head; j; j = j->next)
            for (int32_t i = 0; i < j->n_seqs; i++) {
                pln_seq *q = &j->seqs[i];
                if (q->slot < 0 || q->finish != PLN_FINISH_NONE || q->n_fed < q->n_prompt) continue;
                pln_step_seq *ps = &s->plan_seqs[n];
                ps->slot = q->slot;
                ps->n_new = 1;
                ps->tokens = &q->gen[q->n_gen - 1];
                ps->sample = true;
                ps->prompt_logprobs = false;
                ps->next_token = -1;
                ps->share_from = 0;
                s->plan_owner[n] = q;
                s->plan_job[n] = j;
                n++;
                n_decode++;
            }
        int32_t budget = s->lim.max_batch_tokens - n_decode;
        if (budget < s->lim.max_batch_tokens / 4) budget = s->lim.max_batch_tokens / 4;
        if (budget < 1) budget = 1;
        int32_t n_tokens = n_decode;
        for (pln_job *j = s->head; j && budget > 0; j = j->next)
            for (int32_t i = 0; i < j->n_seqs && budget > 0; i++) {
                pln_seq *q = &j->seqs[i];
                if (q->slot < 0 || q->finish != PLN_FINISH_NONE || q->n_fed >= q->n_prompt) continue;
                int32_t chunk = q->n_prompt - q->n_fed;
                if (chunk > budget) chunk = budget;
                budget -= chunk;
                n_tokens += chunk;
                pln_step_seq *ps = &s->plan_seqs[n];
                ps->slot = q->slot;
                ps->n_new = chunk;
                ps->tokens = q->prompt_ids + q->n_fed;
                ps->sample = q->n_fed + chunk == q->n_prompt;
                ps->prompt_logprobs = j->prompt_logprobs;
                ps->next_token = ps->sample ? -1 : q->prompt_ids[q->n_fed + chunk];
                const pln_seq *first = &j->seqs[(q - j->seqs) - (q - j->seqs) % j->best_of];
                ps->share_from = q->n_fed == 0 && first != q && first->slot >= 0 && first->finish == PLN_FINISH_NONE &&
                                         first->n_fed == first->n_prompt ? first->slot + 1 : 0;
                s->plan_owner[n] = q;
                s->plan_job[n] = j;
                n++;
            }
        for (int32_t k = 0; k < n; k++) {
            pln_job *j = s->plan_job[k];
            s->plan_seqs[k].params = j->sample;
            s->plan_seqs[k].params.do_sample = j->do_sample;
            s->plan_seqs[k].params.seed = s->plan_owner[k]->seed;
            s->plan_seqs[k].top_n = j->top_n;
        }
        int32_t n_rel = s->n_release;
        memcpy(s->plan_release, s->release, sizeof(int32_t) * (size_t)n_rel);

        if (n == 0 && n_rel == 0) {
            if (s->stopping && s->n_active == 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            continue;
        }
        for (int32_t k = 0; k < n; k++) s->slot_claimed[s->plan_seqs[k].slot] = true;

        /* 4. step, without the lock: HTTP threads keep submitting and cancelling meanwhile */
        pthread_mutex_unlock(&s->mu);
        pln_step_plan plan = {.n_seqs = n, .seqs = s->plan_seqs, .n_release = n_rel, .release = s->plan_release};
        memset(s->outs, 0, sizeof *s->outs * (size_t)(n ? n : 1));
        int rc = s->eng.step(s->eng.ctx, &plan, s->outs);
        char msg[300] = "";
        if (rc) snprintf(msg, sizeof msg, "%s", pln_error());
        pln_engine_info info;
        s->eng.get_info(s->eng.ctx, &info);
        pthread_mutex_lock(&s->mu);

        /* released slots are free again (the engine drops them before running even a failed step) */
        for (int32_t k = 0; k < n_rel; k++) s->free_slots[s->n_free_slots++] = s->plan_release[k];
        memmove(s->release, s->release + n_rel, sizeof(int32_t) * (size_t)(s->n_release - n_rel));
        s->n_release -= n_rel;
        s->st.steps++;
        s->st.kv_blocks_free = info.kv_blocks_free;
        s->st.kv_blocks_total = info.kv_blocks_total;
        s->st.prefix_cache = info.prefix_cache;
        s->st.kv_blocks_cached = info.kv_blocks_cached;
        s->st.prefix_query_tokens = info.prefix_query_tokens;
        s->st.prefix_hit_tokens = info.prefix_hit_tokens;
        s->st.fork_tokens = info.fork_tokens;
        if (n) {
            s->st.last_batch_size = n;
            s->st.last_batch_tokens = n_tokens;
            hist_add(&s->st.batch, pln_hist_bounds_batch, n);
        }
        if (rc) {
            /* The engine released every slot of the plan; fail those, then everything else in
             * flight, and report unhealthy: a forward pass that fails once is not trusted again. */
            for (int32_t k = 0; k < n; k++)
                finish_seq(s, s->plan_job[k], s->plan_owner[k], PLN_FINISH_ERROR, msg, true);
            s->unhealthy = true;
            s->st.healthy = false;
            snprintf(s->reason, sizeof s->reason, "generation failed: %s", msg);
            snprintf(s->st.unhealthy_reason, sizeof s->st.unhealthy_reason, "%s", s->reason);
            fail_all(s, msg);
        } else {
            for (int32_t k = 0; k < n; k++) {
                pln_seq *q = s->plan_owner[k];
                pln_job *j = s->plan_job[k];
                if (q->n_fed < q->n_prompt) {
                    if (s->plan_seqs[k].prompt_logprobs) store_prompt_logprobs(j, q, &s->plan_seqs[k], &s->outs[k]);
                    q->n_fed += s->plan_seqs[k].n_new;
                    s->st.prompt_tokens += (uint64_t)s->plan_seqs[k].n_new;
                }
                if (!s->plan_seqs[k].sample || q->finish != PLN_FINISH_NONE) continue;
                if (s->outs[k].nonfinite) {   /* this sequence only; the engine stays trusted */
                    finish_seq(s, j, q, PLN_FINISH_ERROR, PLN_NONFINITE_MSG, false);
                    continue;
                }
                on_token(s, j, q, &s->outs[k]);
            }
        }
        remove_finished_jobs(s);
        s->st.kv_blocks_reserved = s->blocks_reserved;
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void pln_sched_get_stats(pln_sched *s, pln_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->kv_blocks_reserved = s->blocks_reserved;
    pthread_mutex_unlock(&s->mu);
}

void pln_sched_engine_info(pln_sched *s, pln_engine_info *info) { *info = s->info; }
