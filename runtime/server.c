/* server.c — HTTP routes of `pollen serve` over libmicrohttpd (see server.h).
 *
 * One thread per connection: a non-streaming request blocks its own thread until its job ends;
 * a streaming one returns a callback response whose reader blocks until the next token. While
 * waiting, both poll the socket for a hang-up so that a client that goes away cancels its job at
 * once (the scheduler then frees the slot and KV blocks within one step). */
#include "runtime/server.h"
#include "formats/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

enum { R_GENERATE, R_GENERATE_STREAM, R_TOKENIZE, R_HEALTH, R_INFO, R_METRICS, R_COMPLETIONS, R_MODELS,
       R_NOT_FOUND, R_COUNT };
static const char *const g_route_names[R_COUNT] = {"generate", "generate_stream", "tokenize", "health", "info",
                                                   "metrics", "completions", "models", "not_found"};
enum { O_SUCCESS, O_VALIDATION, O_OVERLOADED, O_GENERATION, O_UNAVAILABLE, O_CANCELLED, O_COUNT };
static const char *const g_outcome_names[O_COUNT] = {"success", "validation_error", "overloaded",
                                                     "generation_error", "unavailable", "cancelled"};

struct pln_server {
    struct MHD_Daemon *d;
    pln_sched *sched;
    pln_sched_tok tok;
    pln_serve_limits lim;
    char *model_id;
    char *host;
    int port;
    pln_engine_info info;
    time_t started;
    atomic_int open;                              /* connection contexts alive */
    atomic_ullong counts[R_COUNT][O_COUNT];
    atomic_ullong id_counter;
};

typedef struct {
    pln_server *srv;
    atomic_int refs;                /* connection + streaming response */
    int route;
    pln_api api;
    char *body;
    size_t len, cap;
    bool too_big, answered;
    int fd;
    pln_job *job;
    bool details;
    bool include_usage;
    char *full_prefix;              /* TGI return_full_text: the prompt, put before the text */
    bool openai_stream;
    char id[40];
    time_t created;
    /* streaming state */
    int32_t *consumed;              /* events sent per sequence */
    bool *seq_closed;               /* final event sent per sequence */
    char *out;                      /* formatted, not yet written */
    size_t out_len, out_off, out_cap;
    bool stream_done, gone;
    int outcome;
} conn_ctx;

static void ctx_unref(conn_ctx *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->job) pln_job_unref(c->job);
    atomic_fetch_sub(&c->srv->open, 1);
    free(c->body);
    free(c->full_prefix);
    free(c->consumed);
    free(c->seq_closed);
    free(c->out);
    free(c);
}

static void count(pln_server *s, int route, int outcome) { atomic_fetch_add(&s->counts[route][outcome], 1); }

static int outcome_of_status(int status) {
    if (status < 400) return O_SUCCESS;
    if (status == 429) return O_OVERLOADED;
    if (status == 503) return O_UNAVAILABLE;
    if (status == 424 || status >= 500) return O_GENERATION;
    return O_VALIDATION;
}

/* ---- responses ---------------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *con, int status, const char *ctype, char *text_owned) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text_owned), text_owned, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text_owned); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(con, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *con, int status, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) s = pln_xstrdup("{\"error\":\"could not serialize the response\",\"error_type\":\"generation\"}");
    return send_text(con, status, "application/json", s);
}

static enum MHD_Result send_error(conn_ctx *c, struct MHD_Connection *con, const pln_req_error *err) {
    c->outcome = outcome_of_status(err->status);
    c->answered = true;
    return send_text(con, err->status, "application/json", pln_req_error_json(c->api, err));
}

/* ---- connection hang-up ------------------------------------------------------------------- */

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int r = poll(&p, 1, 0);
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    while (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- JSON pieces -------------------------------------------------------------------------- */

static json_t *token_json(const pln_tok_event *e) {
    /* jansson refuses NaN/Inf (the whole event would be lost): a non-finite log-prob is null
     * (x - x is 0 exactly when x is finite) */
    bool finite = e->logprob - e->logprob == 0.0f;
    return json_pack("{s:i, s:s, s:o, s:b}", "id", (json_int_t)e->id, "text", e->text, "logprob",
                     finite ? json_real((double)e->logprob) : json_null(), "special", e->special);
}

static json_t *seed_json(const pln_job *j, const pln_seq *q) {
    return j->do_sample ? json_integer((json_int_t)q->seed) : json_null();
}

static const char *openai_finish(pln_finish f) {
    return f == PLN_FINISH_LENGTH ? "length" : "stop";
}

static json_t *openai_envelope(conn_ctx *c, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", c->id, "object", object, "created", (json_int_t)c->created,
                     "model", c->srv->model_id);
}

/* generated_text as TGI returns it (with the prompt first when return_full_text). */
static json_t *generated_text_json(const conn_ctx *c, const pln_seq *q) {
    if (!c->full_prefix) return json_string(q->text);
    char *t = pln_xasprintf("%s%s", c->full_prefix, q->text);
    json_t *v = json_string(t);
    free(t);
    return v;
}

/* ---- non-streaming generation ------------------------------------------------------------- */

static enum MHD_Result finish_blocking(conn_ctx *c, struct MHD_Connection *con) {
    pln_job *j = c->job;
    pthread_mutex_lock(&j->mu);
    while (j->n_finished < j->n_seqs) {
        timed_wait(&j->cv, &j->mu, 50);
        if (j->n_finished < j->n_seqs && peer_gone(c->fd)) {
            j->cancelled = true;
            pthread_mutex_unlock(&j->mu);
            c->outcome = O_CANCELLED;
            c->answered = true;
            return MHD_NO;   /* close the connection; the scheduler drops the job */
        }
    }
    pthread_mutex_unlock(&j->mu);
    /* finished: the scheduler no longer writes this job's sequences */
    for (int32_t i = 0; i < j->n_seqs; i++) {
        pln_seq *q = &j->seqs[i];
        if (q->finish == PLN_FINISH_ERROR || q->finish == PLN_FINISH_CANCELLED) {
            pln_req_error err;
            pln_req_fail(&err, c->api, c->api == PLN_API_TGI ? 424 : 500, NULL, "generation failed: %s",
                         q->error ? q->error : pln_finish_name(q->finish));
            return send_error(c, con, &err);
        }
    }
    c->outcome = O_SUCCESS;
    c->answered = true;
    if (c->api == PLN_API_TGI) {
        pln_seq *q = &j->seqs[0];
        json_t *o = json_pack("{s:o}", "generated_text", generated_text_json(c, q));
        if (c->details) {
            json_t *toks = json_array();
            for (int32_t e = 0; e < q->n_events; e++) json_array_append_new(toks, token_json(&q->events[e]));
            json_t *d = json_pack("{s:s, s:i, s:o, s:[], s:o}", "finish_reason", pln_finish_name(q->finish),
                                  "generated_tokens", (json_int_t)q->n_gen, "seed", seed_json(j, q), "prefill",
                                  "tokens", toks);
            json_object_set_new(o, "details", d);
        }
        return send_json(con, 200, o);
    }
    json_t *o = openai_envelope(c, "text_completion");
    json_t *choices = json_array();
    json_int_t pt = 0, ct = 0;
    for (int32_t i = 0; i < j->n_seqs; i++) {
        pln_seq *q = &j->seqs[i];
        json_array_append_new(choices, json_pack("{s:s, s:i, s:n, s:s}", "text", q->text, "index", (json_int_t)i,
                                                 "logprobs", "finish_reason", openai_finish(q->finish)));
        pt += q->n_prompt;
        ct += q->n_gen;
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", pt, "completion_tokens", ct,
                                              "total_tokens", pt + ct));
    return send_json(con, 200, o);
}

/* ---- streaming ---------------------------------------------------------------------------- */

static void out_append(conn_ctx *c, const char *s, size_t n) {
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2 + 256;
        c->out = pln_xrealloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
}

static void out_event(conn_ctx *c, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return;
    out_append(c, "data: ", 6);
    out_append(c, s, strlen(s));
    out_append(c, "\n\n", 2);
    free(s);
}

/* Formats what is new in the job (under its mutex). Returns true when something was added or the
 * stream is complete. */
static bool format_new(conn_ctx *c) {
    pln_job *j = c->job;
    bool added = false;
    for (int32_t i = 0; i < j->n_seqs; i++) {
        pln_seq *q = &j->seqs[i];
        if (c->seq_closed[i]) continue;
        bool fin = q->finish != PLN_FINISH_NONE;
        bool failed = q->finish == PLN_FINISH_ERROR || q->finish == PLN_FINISH_CANCELLED;
        while (c->consumed[i] < q->n_events) {
            int32_t k = c->consumed[i]++;
            const pln_tok_event *e = &q->events[k];
            bool last = fin && !failed && k == q->n_events - 1;
            if (c->api == PLN_API_TGI) {
                json_t *o = json_pack("{s:i, s:o}", "index", (json_int_t)k + 1, "token", token_json(e));
                if (last) {
                    json_object_set_new(o, "generated_text", generated_text_json(c, q));
                    json_object_set_new(o, "details", json_pack("{s:s, s:i, s:o}", "finish_reason", pln_finish_name(q->finish),
                                                                "generated_tokens", (json_int_t)q->n_gen, "seed", seed_json(j, q)));
                } else {
                    json_object_set_new(o, "generated_text", json_null());
                    json_object_set_new(o, "details", json_null());
                }
                out_event(c, o);
            } else if (e->delta[0] || last) {
                json_t *o = openai_envelope(c, "text_completion");
                json_object_set_new(o, "choices", json_pack("[{s:s, s:i, s:n, s:o}]", "text", e->delta, "index", (json_int_t)i,
                                                            "logprobs", "finish_reason",
                                                            last ? json_string(openai_finish(q->finish)) : json_null()));
                out_event(c, o);
            }
            added = true;
        }
        if (fin) {
            if (failed) {
                pln_req_error err;
                pln_req_fail(&err, c->api, c->api == PLN_API_TGI ? 424 : 500, NULL, "generation failed: %s",
                             q->error ? q->error : pln_finish_name(q->finish));
                char *s = pln_req_error_json(c->api, &err);
                out_append(c, "data: ", 6);
                out_append(c, s, strlen(s));
                out_append(c, "\n\n", 2);
                free(s);
                c->outcome = O_GENERATION;
            }
            c->seq_closed[i] = true;
            added = true;
        }
    }
    if (j->n_finished == j->n_seqs) {
        bool all_closed = true;
        for (int32_t i = 0; i < j->n_seqs; i++) all_closed &= c->seq_closed[i];
        if (all_closed && !c->stream_done) {
            if (c->api == PLN_API_OPENAI && c->include_usage) {
                json_int_t pt = 0, ct = 0;
                for (int32_t i = 0; i < j->n_seqs; i++) { pt += j->seqs[i].n_prompt; ct += j->seqs[i].n_gen; }
                json_t *o = openai_envelope(c, "text_completion");
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", pt, "completion_tokens", ct,
                                                          "total_tokens", pt + ct));
                out_event(c, o);
            }
            if (c->api == PLN_API_OPENAI) out_append(c, "data: [DONE]\n\n", 14);
            c->stream_done = true;
            if (c->outcome != O_GENERATION) c->outcome = O_SUCCESS;
            added = true;
        }
    }
    return added;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    conn_ctx *c = cls;
    /* Checked on every call, not only when idle: a stream that produces a token every step
     * would otherwise notice a vanished client only when a write fails. */
    if (!c->stream_done && peer_gone(c->fd)) {
        pln_job_cancel(c->job);
        c->gone = true;
        c->outcome = O_CANCELLED;
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    while (c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&c->job->mu);
        bool got = format_new(c);
        if (!got) timed_wait(&c->job->cv, &c->job->mu, 50);
        pthread_mutex_unlock(&c->job->mu);
        if (!got && peer_gone(c->fd)) {
            pln_job_cancel(c->job);
            c->gone = true;
            c->outcome = O_CANCELLED;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = c->out_len - c->out_off;
    if (n > max) n = max;
    memcpy(buf, c->out + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { ctx_unref(cls); }

/* ---- generation routes -------------------------------------------------------------------- */

static enum MHD_Result handle_generate(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_gen_request req;
    pln_req_error err;
    int rc = c->route == R_COMPLETIONS ? pln_req_parse_completions(c->body, c->len, &s->lim, &req, &err)
                                       : pln_req_parse_generate(c->body, c->len, &s->lim, &req, &err);
    if (rc) return send_error(c, con, &err);
    bool stream = c->route == R_GENERATE_STREAM || (c->route == R_COMPLETIONS && req.stream);
    if (req.api == PLN_API_OPENAI && req.model && strcmp(req.model, s->model_id)) {
        pln_req_fail(&err, c->api, 404, "model", "The model `%s` does not exist; this server serves `%s`", req.model, s->model_id);
        snprintf(err.code, sizeof err.code, "model_not_found");
        pln_gen_request_free(&req);
        return send_error(c, con, &err);
    }
    int32_t **ids = pln_xcalloc((size_t)req.n_prompts, sizeof *ids);
    int32_t *n_ids = pln_xcalloc((size_t)req.n_prompts, sizeof *n_ids);
    rc = 0;
    for (int32_t i = 0; i < req.n_prompts && !rc; i++) {
        if (s->tok.encode(s->tok.ctx, req.prompts[i], &ids[i], &n_ids[i])) {
            rc = pln_req_fail(&err, c->api, c->api == PLN_API_TGI ? 422 : 400, c->api == PLN_API_TGI ? "inputs" : "prompt",
                              "could not tokenize the prompt: %s", pln_error());
            break;
        }
        rc = pln_req_check_lengths(req.api, n_ids[i], req.max_new_tokens, &s->lim, &err);
    }
    pln_job *job = NULL;
    if (!rc) {
        job = pln_job_create(&req, ids, n_ids);
        rc = pln_sched_submit(s->sched, job, &err);
    }
    for (int32_t i = 0; i < req.n_prompts; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    c->details = req.details;
    c->include_usage = req.include_usage;
    if (req.return_full_text && req.api == PLN_API_TGI) c->full_prefix = pln_xstrdup(req.prompts[0]);
    pln_gen_request_free(&req);
    if (rc) {
        pln_job_unref(job);
        return send_error(c, con, &err);
    }
    c->job = job;
    snprintf(c->id, sizeof c->id, "cmpl-%llx%04llx", (unsigned long long)time(NULL),
             (unsigned long long)atomic_fetch_add(&s->id_counter, 1) & 0xFFFF);
    c->created = time(NULL);
    if (!stream) return finish_blocking(c, con);

    c->consumed = pln_xcalloc((size_t)job->n_seqs, sizeof *c->consumed);
    c->seq_closed = pln_xcalloc((size_t)job->n_seqs, sizeof *c->seq_closed);
    atomic_fetch_add(&c->refs, 1);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, stream_free);
    if (!r) { ctx_unref(c); pln_job_cancel(job); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    c->answered = true;
    c->outcome = O_CANCELLED;   /* until the stream completes */
    enum MHD_Result ret = MHD_queue_response(con, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_tokenize(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_req_error err;
    char *text = NULL;
    if (pln_req_parse_tokenize(c->body, c->len, &s->lim, &text, &err)) return send_error(c, con, &err);
    int32_t *ids = NULL, n = 0;
    if (s->tok.encode(s->tok.ctx, text, &ids, &n)) {
        free(text);
        pln_req_fail(&err, PLN_API_TGI, 422, "inputs", "could not tokenize: %s", pln_error());
        return send_error(c, con, &err);
    }
    free(text);
    json_t *arr = json_array();
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t tl = 0;
        char *raw = s->tok.decode(s->tok.ctx, &ids[i], 1, false, &tl);
        char *t = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
        json_array_append_new(arr, json_pack("{s:i, s:s, s:I, s:I}", "id", (json_int_t)ids[i], "text", t,
                                             "start", (json_int_t)off, "stop", (json_int_t)(off + tl)));
        off += tl;
        free(raw);
        free(t);
    }
    free(ids);
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(con, 200, arr);
}

/* ---- GET routes --------------------------------------------------------------------------- */

static enum MHD_Result handle_health(conn_ctx *c, struct MHD_Connection *con) {
    pln_sched_stats st;
    pln_sched_get_stats(c->srv->sched, &st);
    c->answered = true;
    if (st.healthy && !st.draining) { c->outcome = O_SUCCESS; return send_json(con, 200, json_object()); }
    pln_req_error err;
    pln_req_fail(&err, PLN_API_TGI, 503, NULL, "%s", st.draining ? "server is shutting down" : st.unhealthy_reason);
    return send_error(c, con, &err);
}

static enum MHD_Result handle_info(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    const pln_engine_info *in = &s->info;
    const pln_serve_limits *l = &s->lim;
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:s}", "model_id", s->model_id, "model_dtype", in->dtype ? in->dtype : "?",
                          "model_device_type", in->backend ? in->backend : "?", "tp", (json_int_t)in->tp,
                          "version", PLN_VERSION_STRING);
    json_object_set_new(o, "max_concurrent_requests", json_integer(l->max_concurrent_requests));
    json_object_set_new(o, "max_input_tokens", json_integer(l->max_input_tokens));
    json_object_set_new(o, "max_total_tokens", json_integer(l->max_total_tokens));
    json_object_set_new(o, "max_batch_tokens", json_integer(l->max_batch_tokens));
    json_object_set_new(o, "max_batch_total_tokens", json_integer((json_int_t)in->kv_blocks_total * in->block_size));
    json_object_set_new(o, "max_body_bytes", json_integer(l->max_body_bytes));
    json_object_set_new(o, "max_connections", json_integer(l->max_connections));
    json_object_set_new(o, "timeout_s", json_integer(l->timeout_s));
    json_object_set_new(o, "max_stop_sequences", json_integer(l->max_stop_sequences));
    json_object_set_new(o, "max_prompts", json_integer(l->max_prompts));
    json_object_set_new(o, "default_max_new_tokens", json_integer(l->default_max_new_tokens));
    json_object_set_new(o, "max_seqs", json_integer(in->max_seqs));
    json_object_set_new(o, "kv_block_size", json_integer(in->block_size));
    json_object_set_new(o, "kv_dtype", json_string(in->kv_dtype ? in->kv_dtype : "?"));
    json_object_set_new(o, "kv_blocks", json_integer(in->kv_blocks_total));
    json_object_set_new(o, "n_vocab", json_integer(in->n_vocab));
    json_object_set_new(o, "hidden_size", json_integer(in->hidden));
    json_object_set_new(o, "n_head", json_integer(in->n_head));
    json_object_set_new(o, "n_layer", json_integer(in->n_layer));
    json_object_set_new(o, "eos_token_id", json_integer(PLN_EOS_ID));
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(con, 200, o);
}

static enum MHD_Result handle_models(conn_ctx *c, struct MHD_Connection *con) {
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", c->srv->model_id,
                          "object", "model", "created", (json_int_t)c->srv->started, "owned_by", "pollen");
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(con, 200, o);
}

typedef struct { char *p; size_t len, cap; } sbuf;
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
        b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 1024;
        b->p = pln_xrealloc(b->p, b->cap);
    }
}

static void metric_hist(sbuf *b, const char *name, const char *help, const pln_hist *h, const double *bounds) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < PLN_HIST_BUCKETS; i++)
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)h->buckets[i]);
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->count, name,
              h->sum, name, (unsigned long long)h->count);
}

static enum MHD_Result handle_metrics(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_sched_stats st;
    pln_sched_get_stats(s->sched, &st);
    sbuf b = {pln_xmalloc(8192), 0, 8192};
    b.p[0] = 0;
    sb_printf(&b, "# HELP pln_requests_total HTTP requests by route and outcome.\n# TYPE pln_requests_total counter\n");
    for (int r = 0; r < R_COUNT; r++)
        for (int o = 0; o < O_COUNT; o++) {
            unsigned long long v = atomic_load(&s->counts[r][o]);
            if (v || r == R_GENERATE || r == R_GENERATE_STREAM || r == R_COMPLETIONS)
                sb_printf(&b, "pln_requests_total{route=\"%s\",outcome=\"%s\"} %llu\n", g_route_names[r], g_outcome_names[o], v);
        }
    sb_printf(&b, "# HELP pln_sequences_finished_total Generated sequences by finish reason.\n# TYPE pln_sequences_finished_total counter\n");
    for (int f = PLN_FINISH_LENGTH; f <= PLN_FINISH_CANCELLED; f++)
        sb_printf(&b, "pln_sequences_finished_total{reason=\"%s\"} %llu\n", pln_finish_name((pln_finish)f),
                  (unsigned long long)st.finished[f]);
    sb_printf(&b, "# HELP pln_queue_size Sequences waiting for a slot.\n# TYPE pln_queue_size gauge\npln_queue_size %d\n", st.queued);
    sb_printf(&b, "# HELP pln_running_sequences Sequences holding a slot.\n# TYPE pln_running_sequences gauge\npln_running_sequences %d\n", st.running);
    sb_printf(&b, "# HELP pln_batch_size Sequences in the last engine step.\n# TYPE pln_batch_size gauge\npln_batch_size %d\n", st.last_batch_size);
    sb_printf(&b, "# HELP pln_batch_tokens Tokens in the last engine step.\n# TYPE pln_batch_tokens gauge\npln_batch_tokens %d\n", st.last_batch_tokens);
    sb_printf(&b, "# HELP pln_steps_total Engine steps run.\n# TYPE pln_steps_total counter\npln_steps_total %llu\n", (unsigned long long)st.steps);
    sb_printf(&b, "# HELP pln_generated_tokens_total Tokens generated.\n# TYPE pln_generated_tokens_total counter\npln_generated_tokens_total %llu\n",
              (unsigned long long)st.generated_tokens);
    sb_printf(&b, "# HELP pln_prompt_tokens_total Prompt tokens prefilled.\n# TYPE pln_prompt_tokens_total counter\npln_prompt_tokens_total %llu\n",
              (unsigned long long)st.prompt_tokens);
    sb_printf(&b, "# HELP pln_kv_blocks_total KV-cache blocks.\n# TYPE pln_kv_blocks_total gauge\npln_kv_blocks_total %lld\n", (long long)st.kv_blocks_total);
    sb_printf(&b, "# HELP pln_kv_blocks_free KV-cache blocks free in the engine.\n# TYPE pln_kv_blocks_free gauge\npln_kv_blocks_free %lld\n", (long long)st.kv_blocks_free);
    sb_printf(&b, "# HELP pln_kv_blocks_reserved KV-cache blocks reserved by admitted sequences.\n# TYPE pln_kv_blocks_reserved gauge\npln_kv_blocks_reserved %lld\n",
              (long long)st.kv_blocks_reserved);
    sb_printf(&b, "# HELP pln_kv_cache_usage Fraction of KV-cache blocks in use.\n# TYPE pln_kv_cache_usage gauge\npln_kv_cache_usage %.6f\n",
              st.kv_blocks_total ? (double)(st.kv_blocks_total - st.kv_blocks_free) / (double)st.kv_blocks_total : 0.0);
    sb_printf(&b, "# HELP pln_healthy 1 when generation works and the server is not draining.\n# TYPE pln_healthy gauge\npln_healthy %d\n",
              st.healthy && !st.draining);
    sb_printf(&b, "# HELP pln_open_connections Connections being served.\n# TYPE pln_open_connections gauge\npln_open_connections %d\n",
              atomic_load(&s->open));
    metric_hist(&b, "pln_time_to_first_token_seconds", "Time from arrival to the first generated token.", &st.ttft, pln_hist_bounds_seconds);
    metric_hist(&b, "pln_time_per_output_token_seconds", "Mean time between generated tokens of a finished sequence.", &st.tpot,
                pln_hist_bounds_seconds);
    metric_hist(&b, "pln_batch_size_sequences", "Sequences per engine step.", &st.batch, pln_hist_bounds_batch);
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_text(con, 200, "text/plain; version=0.0.4", b.p);
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static int route_of(const char *url, bool *is_post, bool *known) {
    static const struct { const char *path; int route; bool post; } t[] = {
        {"/generate", R_GENERATE, true},       {"/generate_stream", R_GENERATE_STREAM, true},
        {"/tokenize", R_TOKENIZE, true},       {"/health", R_HEALTH, false},
        {"/info", R_INFO, false},              {"/metrics", R_METRICS, false},
        {"/v1/completions", R_COMPLETIONS, true}, {"/v1/models", R_MODELS, false},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(url, t[i].path)) { *is_post = t[i].post; *known = true; return t[i].route; }
    *known = false;
    *is_post = false;
    return R_NOT_FOUND;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    pln_server *s = cls;
    conn_ctx *c = *con_cls;
    if (!c) {
        c = pln_xcalloc(1, sizeof *c);
        c->srv = s;
        atomic_init(&c->refs, 1);
        atomic_fetch_add(&s->open, 1);
        c->fd = -1;
        c->outcome = O_VALIDATION;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) c->fd = ci->connect_fd;
        bool post, known;
        c->route = route_of(url, &post, &known);
        c->api = !strncmp(url, "/v1/", 4) ? PLN_API_OPENAI : PLN_API_TGI;
        *con_cls = c;
        pln_req_error err;
        if (!known)
            return send_error(c, con, (pln_req_fail(&err, c->api, 404, NULL, "no route %s %s", method, url), &err));
        if (strcmp(method, post ? "POST" : "GET")) {
            pln_req_fail(&err, c->api, 405, NULL, "%s %s: use %s", method, url, post ? "POST" : "GET");
            return send_error(c, con, &err);
        }
        const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && s->lim.max_body_bytes > 0 && strtoull(cl, NULL, 10) > (unsigned long long)s->lim.max_body_bytes) {
            pln_req_fail(&err, c->api, 413, NULL, "request body is %s bytes; the limit is %lld (--max-body-bytes)", cl,
                         (long long)s->lim.max_body_bytes);
            return send_error(c, con, &err);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!c->answered && !c->too_big) {
            if (c->len + *upload_data_size > (size_t)s->lim.max_body_bytes) {
                c->too_big = true;
            } else {
                if (c->len + *upload_data_size + 1 > c->cap) {
                    c->cap = (c->len + *upload_data_size + 1) * 2;
                    c->body = pln_xrealloc(c->body, c->cap);
                }
                memcpy(c->body + c->len, upload_data, *upload_data_size);
                c->len += *upload_data_size;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->answered) return MHD_YES;
    pln_req_error err;
    if (c->too_big) {
        pln_req_fail(&err, c->api, 413, NULL, "request body is over %lld bytes (--max-body-bytes)", (long long)s->lim.max_body_bytes);
        return send_error(c, con, &err);
    }
    switch (c->route) {
    case R_GENERATE: case R_GENERATE_STREAM: case R_COMPLETIONS: return handle_generate(c, con);
    case R_TOKENIZE: return handle_tokenize(c, con);
    case R_HEALTH: return handle_health(c, con);
    case R_INFO: return handle_info(c, con);
    case R_METRICS: return handle_metrics(c, con);
    case R_MODELS: return handle_models(c, con);
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe) {
    pln_server *s = cls;
    conn_ctx *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->job) {
        pln_job_cancel(c->job);
        if (c->outcome == O_SUCCESS && !c->stream_done) c->outcome = O_CANCELLED;
    }
    count(s, c->route, c->outcome);
    ctx_unref(c);
}

pln_server *pln_server_start(const pln_server_opts *o, pln_sched *sched, const pln_sched_tok *tok) {
    pln_server *s = pln_xcalloc(1, sizeof *s);
    s->sched = sched;
    s->tok = *tok;
    s->lim = o->lim;
    s->model_id = pln_xstrdup(o->model_id ? o->model_id : "bloom");
    s->host = pln_xstrdup(o->host ? o->host : "127.0.0.1");
    s->started = time(NULL);
    pln_sched_engine_info(sched, &s->info);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, s->host, &addr.sin_addr) != 1) {
        pln_errorf("--host %s: not an IPv4 address (use 127.0.0.1 or 0.0.0.0)", s->host);
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->lim.max_connections > 0 ? o->lim.max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->lim.timeout_s > 0 ? o->lim.timeout_s : 0),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_END);
    if (!s->d) {
        pln_errorf("%s:%d: cannot listen (%s); pick another --port", s->host, o->port, strerror(errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    return s;
fail:
    free(s->model_id);
    free(s->host);
    free(s);
    return NULL;
}

int pln_server_port(const pln_server *s) { return s->port; }
int pln_server_open_responses(pln_server *s) { return atomic_load(&s->open); }

void pln_server_stop(pln_server *s, double grace_s) {
    if (!s) return;
    double t0 = pln_now();
    while (atomic_load(&s->open) > 0 && pln_now() - t0 < grace_s) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(s->d);
    free(s->model_id);
    free(s->host);
    free(s);
}
