/* server.c — HTTP routes of `pollen serve` over libmicrohttpd (see server.h).
 *
 * One thread per connection: a non-streaming request blocks its own thread until its job ends;
 * a streaming one returns a callback response whose reader blocks until the next token. While
 * waiting, both poll the socket for a hang-up so that a client that goes away cancels its job at
 * once (the scheduler then frees the slot and KV blocks within one step). */
#include "runtime/server.h"
#include "formats/common.h"
#include "runtime/httpframe.h"
#include "runtime/httprelay.h"
#include "runtime/openapi.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { R_GENERATE, R_GENERATE_STREAM, R_TOKENIZE, R_HEALTH, R_INFO, R_METRICS, R_COMPLETIONS, R_MODELS,
       R_ROOT, R_CHAT, R_DETOKENIZE, R_VERSION, R_DOCS, R_OPENAPI, R_NOT_FOUND, R_COUNT };
static const char *const g_route_names[R_COUNT] = {"generate", "generate_stream", "tokenize", "health", "info",
                                                   "metrics", "completions", "models", "compat", "chat_completions",
                                                   "detokenize", "version", "docs", "openapi", "not_found"};
enum { O_SUCCESS, O_VALIDATION, O_OVERLOADED, O_GENERATION, O_UNAVAILABLE, O_CANCELLED, O_UNAUTHORIZED, O_COUNT };
static const char *const g_outcome_names[O_COUNT] = {"success", "validation_error", "overloaded",
                                                     "generation_error", "unavailable", "cancelled", "unauthorized"};

/* The routes (pln_server_routes). `auth`: the route needs the --api-key. A route is protected
 * when text-generation-inference or vLLM protects it: TGI's key guards its generation routes and
 * /tokenize (not /health, /info, /metrics, /v1/models, /docs); vLLM's guards every /v1 path (not
 * /health, /metrics, /version, /tokenize, /detokenize, /docs, /openapi.json). What is left open
 * costs no generation and shows nothing of a request: liveness, limits, counters, documentation.
 * The paths with a parameter match by prefix (route_of). */
static const struct route_def {
    const char *path;
    int route;
    bool post, auth;
} g_routes[] = {
    {"/generate", R_GENERATE, true, true},
    {"/generate_stream", R_GENERATE_STREAM, true, true},
    {"/", R_ROOT, true, true},
    {"/tokenize", R_TOKENIZE, true, true},
    {"/detokenize", R_DETOKENIZE, true, true},
    {"/v1/completions", R_COMPLETIONS, true, true},
    {"/v1/chat/completions", R_CHAT, true, true},
    {"/v1/models", R_MODELS, false, true},
    {"/v1/models/{model}", R_MODELS, false, true},
    {"/health", R_HEALTH, false, false},
    {"/info", R_INFO, false, false},
    {"/metrics", R_METRICS, false, false},
    {"/version", R_VERSION, false, false},
    {"/docs", R_DOCS, false, false},
    {"/openapi.json", R_OPENAPI, false, false},
};
#define N_ROUTES ((int)(sizeof g_routes / sizeof g_routes[0]))

static pln_route_info g_route_info[N_ROUTES];
static void fill_route_info(void) {
    for (int i = 0; i < N_ROUTES; i++)
        g_route_info[i] = (pln_route_info){g_routes[i].post ? "POST" : "GET", g_routes[i].path, g_routes[i].auth};
}

const pln_route_info *pln_server_routes(int *n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_route_info);
    *n = N_ROUTES;
    return g_route_info;
}

#define PLN_MAX_LISTEN 8   /* addresses --host may resolve to that are listened on */

struct pln_server {
    struct MHD_Daemon *d;
    pln_sched *sched;
    pln_sched_tok tok;
    pln_serve_limits lim;
    char *model_id;
    char **names;                       /* --served-model-name: more names accepted and listed */
    int n_names;
    char *host;
    int port;
    pln_engine_info info;
    const pln_chat_template *chat;      /* NULL: no chat template */
    time_t started;
    atomic_int open;                              /* connection contexts alive */
    atomic_ullong counts[R_COUNT][O_COUNT];
    atomic_ullong id_counter;
    /* the connection guard (see "connection guard" below) */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    struct guard_conn *guard_head;
    pthread_t guard_thr;
    bool guard_running, guard_stop;
    atomic_int in_flight;                         /* requests received whole, not yet answered */
    atomic_ullong deadline_closed;                /* connections shut by --request-timeout */
    atomic_int tcp_open;                          /* client connections accepted, not yet closed */
    /* the listening socket and the thread that accepts on it (see httprelay.h) */
    int listen_fd[PLN_MAX_LISTEN];
    int n_listen;
    pthread_t acc_thr[PLN_MAX_LISTEN];
    int n_acc;
    /* --api-key (NULL: none) */
    char *api_key;
    size_t api_key_len;
    /* request lines */
    bool log_requests, log_json;
    int log_fd;
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
    /* token details (route layer: see the "token details" section) */
    int32_t top_n;                  /* alternatives per token */
    bool logprobs;                  /* OpenAI: a logprobs object per choice */
    bool echo;                      /* OpenAI: the prompt starts the text */
    bool root;                      /* TGI compatibility route: a non-streamed answer is an array */
    bool chat;                      /* OpenAI chat: chat.completion(.chunk) shapes */
    char **prompts;                 /* the request's prompt texts (echo) */
    int32_t n_prompts;
    int64_t *text_off;              /* streaming OpenAI logprobs: text_offset reached per sequence */
    char id[40];
    char *model_query;              /* GET /v1/models/{id}: the id asked for */
    time_t created;
    /* streaming state */
    int32_t *consumed;              /* events sent per sequence */
    bool *seq_closed;               /* final event sent per sequence */
    char *out;                      /* formatted, not yet written */
    size_t out_len, out_off, out_cap;
    bool stream_done, gone;
    int outcome;
    /* framing layer */
    pln_frame_kind frame;           /* how the body is framed (checked on the first call) */
    bool in_flight;                 /* counted in srv->in_flight */
    double rejected_at;             /* too_big: when the raw 413 was sent (0: not yet) */
    /* the request line (see "request log") */
    int status;                     /* of the response queued (0: none) */
    char method[16];
    char path[192];
    double t_start;                 /* the request's head arrived */
} conn_ctx;

static void ctx_unref(conn_ctx *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->job) pln_job_unref(c->job);
    atomic_fetch_sub(&c->srv->open, 1);
    free(c->body);
    free(c->model_query);
    free(c->full_prefix);
    for (int32_t i = 0; i < c->n_prompts; i++) free(c->prompts[i]);
    free(c->prompts);
    free(c->text_off);
    free(c->consumed);
    free(c->seq_closed);
    free(c->out);
    free(c);
}

static void count(pln_server *s, int route, int outcome) { atomic_fetch_add(&s->counts[route][outcome], 1); }

static int outcome_of_status(int status) {
    if (status < 400) return O_SUCCESS;
    if (status == 429) return O_OVERLOADED;
    if (status == 401) return O_UNAUTHORIZED;
    if (status == 503) return O_UNAVAILABLE;
    if (status == 424 || status >= 500) return O_GENERATION;
    return O_VALIDATION;
}

/* ---- responses ---------------------------------------------------------------------------- */

/* Every response carries the request's id (the one its log line names). */
static void add_common_headers(conn_ctx *c, struct MHD_Response *r) {
    MHD_add_response_header(r, "X-Request-Id", c->id);
}

static enum MHD_Result queue(conn_ctx *c, struct MHD_Connection *con, int status, struct MHD_Response *r) {
    add_common_headers(c, r);
    c->status = status;
    enum MHD_Result ret = MHD_queue_response(con, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(conn_ctx *c, struct MHD_Connection *con, int status, const char *ctype, char *text_owned) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text_owned), text_owned, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text_owned); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    return queue(c, con, status, r);
}

static enum MHD_Result send_json(conn_ctx *c, struct MHD_Connection *con, int status, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) s = pln_xstrdup("{\"error\":\"could not serialize the response\",\"error_type\":\"generation\"}");
    return send_text(c, con, status, "application/json", s);
}

static enum MHD_Result send_error(conn_ctx *c, struct MHD_Connection *con, const pln_req_error *err) {
    c->outcome = outcome_of_status(err->status);
    c->answered = true;
    return send_text(c, con, err->status, "application/json", pln_req_error_json(c->api, err));
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

/* ---- token details (TGI details / top_tokens / prefill, OpenAI logprobs) -------------------- */

/* A log-prob as JSON: null when there is none (the first prompt token) or it is not finite. */
static json_t *lp_json(float v) { return isfinite(v) ? json_real((double)v) : json_null(); }

static char *tok_text(const pln_server *s, int32_t id) {
    size_t tl = 0;
    char *raw = s->tok.decode(s->tok.ctx, &id, 1, false, &tl);
    char *t = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
    free(raw);
    return t;
}

static bool tok_special(const pln_server *s, int32_t id) {
    return s->tok.is_special ? s->tok.is_special(s->tok.ctx, id) : id < 4;
}

/* TGI Token {id, text, logprob, special} of an alternative. */
static json_t *alt_json(const pln_server *s, const pln_tok_alt *a) {
    char *t = a->text ? NULL : tok_text(s, a->id);
    json_t *o = json_pack("{s:i, s:s, s:o, s:b}", "id", (json_int_t)a->id, "text", a->text ? a->text : t, "logprob",
                          lp_json(a->logprob), "special", tok_special(s, a->id));
    free(t);
    return o;
}

static json_t *tgi_top_tokens(const pln_server *s, const pln_tok_event *e) {
    json_t *a = json_array();
    for (int32_t t = 0; t < e->n_top; t++) json_array_append_new(a, alt_json(s, &e->top[t]));
    return a;
}

/* TGI prefill: [{id, text, logprob}] of the prompt, the first logprob null; [] unless
 * decoder_input_details. */
static json_t *tgi_prefill(const pln_server *s, const pln_seq *q) {
    json_t *a = json_array();
    for (int32_t i = 0; q->prompt_lp && i < q->n_prompt; i++) {
        char *t = tok_text(s, q->prompt_ids[i]);
        json_array_append_new(a, json_pack("{s:i, s:s, s:o}", "id", (json_int_t)q->prompt_ids[i], "text", t, "logprob",
                                           lp_json(i ? q->prompt_lp[i] : NAN)));
        free(t);
    }
    return a;
}

/* OpenAI logprobs {tokens, token_logprobs, top_logprobs, text_offset} of the events ev[0..n) of
 * q, after the prompt's tokens when with_prompt (echo). *off is the text offset reached so far
 * (advanced by each token's text). */
static json_t *openai_logprobs(const pln_server *s, const pln_job *j, const pln_seq *q, const pln_tok_event *ev,
                               int32_t n, bool with_prompt, int64_t *off) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int32_t i = 0; with_prompt && i < q->n_prompt; i++) {
        char *t = tok_text(s, q->prompt_ids[i]);
        json_array_append_new(toks, json_string(t));
        json_array_append_new(lps, lp_json(i && q->prompt_lp ? q->prompt_lp[i] : NAN));
        if (i == 0 || !q->prompt_lp) {
            json_array_append_new(tops, json_null());
        } else {
            json_t *d = json_object();
            for (int32_t k = 0; q->prompt_top && k < j->top_n; k++) {
                const pln_tok_alt *a = &q->prompt_top[(size_t)i * j->top_n + k];
                if (a->id < 0) continue;
                char *at = tok_text(s, a->id);
                json_object_set_new(d, at, lp_json(a->logprob));
                free(at);
            }
            json_array_append_new(tops, d);
        }
        json_array_append_new(offs, json_integer(*off));
        *off += (int64_t)strlen(t);
        free(t);
    }
    for (int32_t i = 0; i < n; i++) {
        const pln_tok_event *e = &ev[i];
        json_array_append_new(toks, json_string(e->text));
        json_array_append_new(lps, lp_json(e->logprob));
        json_t *d = json_object();
        for (int32_t k = 0; k < e->n_top; k++) json_object_set_new(d, e->top[k].text, lp_json(e->top[k].logprob));
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer(*off));
        *off += (int64_t)strlen(e->text);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

/* OpenAI chat logprobs {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. */
static json_t *bytes_json(const char *t) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}
static json_t *chat_logprobs(const pln_tok_event *ev, int32_t n) {
    json_t *content = json_array();
    for (int32_t i = 0; i < n; i++) {
        json_t *top = json_array();
        for (int32_t k = 0; k < ev[i].n_top; k++)
            json_array_append_new(top, json_pack("{s:s, s:o, s:o}", "token", ev[i].top[k].text, "logprob",
                                                 lp_json(ev[i].top[k].logprob), "bytes", bytes_json(ev[i].top[k].text)));
        json_array_append_new(content, json_pack("{s:s, s:o, s:o, s:o}", "token", ev[i].text, "logprob", lp_json(ev[i].logprob),
                                                 "bytes", bytes_json(ev[i].text), "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* TGI details of one sequence (generate: with prefill and tokens). */
static json_t *tgi_details(const conn_ctx *c, const pln_job *j, const pln_seq *q) {
    json_t *toks = json_array();
    for (int32_t e = 0; e < q->n_events; e++) json_array_append_new(toks, token_json(&q->events[e]));
    json_t *d = json_pack("{s:s, s:i, s:o, s:o, s:o}", "finish_reason", pln_finish_name(q->finish), "generated_tokens",
                          (json_int_t)q->n_gen, "seed", seed_json(j, q), "prefill", tgi_prefill(c->srv, q), "tokens", toks);
    if (c->top_n > 0) {
        json_t *tt = json_array();
        for (int32_t e = 0; e < q->n_events; e++) json_array_append_new(tt, tgi_top_tokens(c->srv, &q->events[e]));
        json_object_set_new(d, "top_tokens", tt);
    }
    return d;
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
    int32_t *order = pln_xmalloc(sizeof(int32_t) * (size_t)j->best_of);
    if (c->api == PLN_API_TGI) {
        pln_job_rank(j, 0, order);
        pln_seq *q = &j->seqs[order[0]];
        json_t *o = json_pack("{s:o}", "generated_text", generated_text_json(c, q));
        if (c->details) {
            json_t *d = tgi_details(c, j, q);
            if (j->best_of > 1) {
                json_t *bo = json_array();
                for (int32_t k = 1; k < j->best_of; k++) {
                    pln_seq *b = &j->seqs[order[k]];
                    json_t *bd = tgi_details(c, j, b);
                    json_object_set_new(bd, "generated_text", generated_text_json(c, b));
                    json_array_append_new(bo, bd);
                }
                json_object_set_new(d, "best_of_sequences", bo);
            }
            json_object_set_new(o, "details", d);
        }
        free(order);
        /* the compatibility route answers a list, as TGI's does */
        return send_json(c, con, 200, c->root ? json_pack("[o]", o) : o);
    }
    json_t *o = openai_envelope(c, c->chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    json_int_t pt = 0, ct = 0;
    for (int32_t i = 0; i < j->n_seqs; i++) ct += j->seqs[i].n_gen;
    for (int32_t p = 0; p < j->n_prompts; p++) {
        pln_job_rank(j, p, order);
        pt += j->seqs[order[0]].n_prompt;
        for (int32_t k = 0; k < j->n_answer; k++) {
            pln_seq *q = &j->seqs[order[k]];
            if (c->chat) {
                json_array_append_new(choices, json_pack("{s:i, s:{s:s, s:s}, s:o, s:s}", "index", (json_int_t)(p * j->n_answer + k),
                                                         "message", "role", "assistant", "content", q->text, "logprobs",
                                                         c->logprobs ? chat_logprobs(q->events, q->n_events) : json_null(),
                                                         "finish_reason", openai_finish(q->finish)));
                continue;
            }
            char *text = c->echo ? pln_xasprintf("%s%s", c->prompts[p], q->text) : pln_xstrdup(q->text);
            int64_t off = 0;
            json_t *lp = c->logprobs ? openai_logprobs(c->srv, j, q, q->events, q->n_events, c->echo, &off) : json_null();
            json_array_append_new(choices, json_pack("{s:s, s:i, s:o, s:s}", "text", text, "index",
                                                     (json_int_t)(p * j->n_answer + k), "logprobs", lp,
                                                     "finish_reason", openai_finish(q->finish)));
            free(text);
        }
    }
    free(order);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", pt, "completion_tokens", ct,
                                              "total_tokens", pt + ct));
    return send_json(c, con, 200, o);
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
                if (c->top_n > 0) json_object_set_new(o, "top_tokens", tgi_top_tokens(c->srv, e));
                if (last) {
                    json_object_set_new(o, "generated_text", generated_text_json(c, q));
                    json_object_set_new(o, "details", json_pack("{s:s, s:i, s:o}", "finish_reason", pln_finish_name(q->finish),
                                                                "generated_tokens", (json_int_t)q->n_gen, "seed", seed_json(j, q)));
                } else {
                    json_object_set_new(o, "generated_text", json_null());
                    json_object_set_new(o, "details", json_null());
                }
                out_event(c, o);
            } else if (c->chat) {
                json_t *o = openai_envelope(c, "chat.completion.chunk");
                json_t *delta = k == 0 ? json_pack("{s:s, s:s}", "role", "assistant", "content", e->delta)
                                       : json_pack("{s:s}", "content", e->delta);
                json_object_set_new(o, "choices", json_pack("[{s:i, s:o, s:o, s:o}]", "index", (json_int_t)i, "delta", delta,
                                                            "logprobs", c->logprobs ? chat_logprobs(e, 1) : json_null(),
                                                            "finish_reason",
                                                            last ? json_string(openai_finish(q->finish)) : json_null()));
                out_event(c, o);
            } else if (e->delta[0] || last || c->logprobs) {
                /* with echo the prompt goes first, in the chunk of the first token */
                bool with_prompt = c->echo && k == 0;
                char *text = with_prompt ? pln_xasprintf("%s%s", c->prompts[q->prompt_index], e->delta) : pln_xstrdup(e->delta);
                json_t *lp = c->logprobs ? openai_logprobs(c->srv, j, q, e, 1, with_prompt, &c->text_off[i]) : json_null();
                json_t *o = openai_envelope(c, "text_completion");
                json_object_set_new(o, "choices", json_pack("[{s:s, s:i, s:o, s:o}]", "text", text, "index", (json_int_t)i,
                                                            "logprobs", lp, "finish_reason",
                                                            last ? json_string(openai_finish(q->finish)) : json_null()));
                free(text);
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
                for (int32_t i = 0; i < j->n_seqs; i++) {   /* each prompt once, every sequence generated */
                    if (i % j->best_of == 0) pt += j->seqs[i].n_prompt;
                    ct += j->seqs[i].n_gen;
                }
                json_t *o = openai_envelope(c, c->chat ? "chat.completion.chunk" : "text_completion");
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

/* ---- model names ------------------------------------------------------------------------- */

/* The OpenAI routes check "model" as vLLM does against the names served (--served-model-name
 * aliases included), and accept, as TGI does, the placeholders clients send when the user names
 * no model: "tgi" (TGI's documented name, older huggingface_hub) and "dummy" (huggingface_hub's
 * chat_completion given a URL). */
static bool model_name_ok(const pln_server *s, const char *m) {
    if (!strcmp(m, s->model_id) || !strcmp(m, "tgi") || !strcmp(m, "dummy")) return true;
    for (int i = 0; i < s->n_names; i++) if (!strcmp(m, s->names[i])) return true;
    return false;
}

/* ---- generation routes -------------------------------------------------------------------- */

static enum MHD_Result handle_generate(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_gen_request req;
    pln_req_error err;
    int rc = c->route == R_COMPLETIONS ? pln_req_parse_completions(c->body, c->len, &s->lim, &req, &err)
             : c->route == R_CHAT      ? pln_req_parse_chat(c->body, c->len, &s->lim, s->chat, &req, &err)
                                       : pln_req_parse_generate(c->body, c->len, &s->lim, &req, &err);
    if (rc) return send_error(c, con, &err);
    bool stream = c->route == R_GENERATE_STREAM ||
                  ((c->route == R_COMPLETIONS || c->route == R_ROOT || c->route == R_CHAT) && req.stream);
    if (c->route == R_GENERATE_STREAM && (req.best_of > 1 || req.prompt_logprobs)) {
        /* the body had no `stream`: the route streams, so TGI's streaming rules apply */
        pln_req_fail(&err, c->api, 422, req.best_of > 1 ? "best_of" : "decoder_input_details", "%s",
                     req.best_of > 1 ? "`best_of` != 1 is not supported when streaming tokens"
                                     : "`decoder_input_details` == true is not supported when streaming tokens");
        pln_gen_request_free(&req);
        return send_error(c, con, &err);
    }
    if (req.api == PLN_API_OPENAI && req.model && !model_name_ok(s, req.model)) {
        pln_req_fail(&err, c->api, 404, "model", "The model `%s` does not exist; this server serves `%s`%s (and accepts "
                     "\"tgi\" and \"dummy\", the names clients send when given none)", req.model, s->model_id,
                     s->n_names ? " under the names of --served-model-name" : "");
        snprintf(err.code, sizeof err.code, "model_not_found");
        pln_gen_request_free(&req);
        return send_error(c, con, &err);
    }
    int32_t **ids = pln_xcalloc((size_t)req.n_prompts, sizeof *ids);
    int32_t *n_ids = pln_xcalloc((size_t)req.n_prompts, sizeof *n_ids);
    rc = 0;
    for (int32_t i = 0; i < req.n_prompts && !rc; i++) {
        if (req.prompt_ids && req.prompt_ids[i]) {
            /* token ids: used as they are (no special tokens added), checked against the vocabulary;
             * their text stands for the prompt where one is shown (echo) */
            for (int32_t k = 0; k < req.n_prompt_ids[i] && !rc; k++)
                if (req.prompt_ids[i][k] >= s->info.n_vocab) {
                    char where[48];
                    if (req.prompt_ids_flat) snprintf(where, sizeof where, "prompt[%d]", k);
                    else snprintf(where, sizeof where, "prompt[%d][%d]", i, k);
                    rc = pln_req_fail(&err, c->api, 400, "prompt", "`%s` is token id %d, outside the vocabulary (ids 0 to %lld)",
                                      where, req.prompt_ids[i][k], (long long)s->info.n_vocab - 1);
                }
            if (rc) break;
            ids[i] = req.prompt_ids[i];
            n_ids[i] = req.n_prompt_ids[i];
            req.prompt_ids[i] = NULL;
            size_t tl = 0;
            char *raw = s->tok.decode(s->tok.ctx, ids[i], n_ids[i], false, &tl);
            free(req.prompts[i]);
            req.prompts[i] = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
            free(raw);
        } else if (s->tok.encode(s->tok.ctx, req.prompts[i], req.add_special, &ids[i], &n_ids[i])) {
            rc = pln_req_fail(&err, c->api, c->api == PLN_API_TGI ? 422 : 400, c->api == PLN_API_TGI ? "inputs" : "prompt",
                              "could not tokenize the prompt: %s", pln_error());
            break;
        }
        if (req.truncate > 0 && n_ids[i] > req.truncate) {
            /* TGI keeps the last `truncate` tokens */
            memmove(ids[i], ids[i] + (n_ids[i] - req.truncate), sizeof(int32_t) * (size_t)req.truncate);
            n_ids[i] = req.truncate;
        }
        rc = pln_req_check_lengths(req.api, req.prompt_field, req.max_tokens_field, n_ids[i], req.max_new_tokens, &s->lim, &err);
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
    c->top_n = req.top_n;
    c->logprobs = req.logprobs;
    c->echo = req.echo;
    c->root = c->route == R_ROOT;
    c->chat = req.chat;
    for (int32_t i = 0; req.prompt_ids && i < req.n_prompts; i++) {   /* those not moved into ids[] (an error) */
        free(req.prompt_ids[i]);
        req.prompt_ids[i] = NULL;
    }
    c->n_prompts = req.n_prompts;
    c->prompts = req.prompts;          /* taken over: echo needs them */
    req.prompts = NULL;
    req.n_prompts = 0;
    if (req.return_full_text && req.api == PLN_API_TGI) c->full_prefix = pln_xstrdup(c->prompts[0]);
    pln_gen_request_free(&req);
    if (rc) {
        pln_job_unref(job);
        return send_error(c, con, &err);
    }
    c->job = job;
    snprintf(c->id, sizeof c->id, "%s-%llx%04llx", c->chat ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             (unsigned long long)atomic_fetch_add(&s->id_counter, 1) & 0xFFFF);
    c->created = time(NULL);
    if (!stream) return finish_blocking(c, con);

    c->consumed = pln_xcalloc((size_t)job->n_seqs, sizeof *c->consumed);
    c->seq_closed = pln_xcalloc((size_t)job->n_seqs, sizeof *c->seq_closed);
    c->text_off = pln_xcalloc((size_t)job->n_seqs, sizeof *c->text_off);
    atomic_fetch_add(&c->refs, 1);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, stream_free);
    if (!r) { ctx_unref(c); pln_job_cancel(job); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    c->answered = true;
    c->outcome = O_CANCELLED;   /* until the stream completes */
    return queue(c, con, 200, r);
}

/* TGI's /tokenize {"inputs"} -> [{id, text, start, stop}], or vLLM's {"prompt"} -> {count,
 * max_model_len, tokens[, token_strs]} (the body's form decides). */
static enum MHD_Result handle_tokenize(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_req_error err;
    pln_tokenize_request tr;
    int rc = pln_req_parse_tokenize_any(c->body, c->len, &s->lim, &tr, &err);
    if (tr.vllm) c->api = PLN_API_OPENAI;
    if (rc) return send_error(c, con, &err);
    if (tr.model && !model_name_ok(s, tr.model)) {
        pln_req_fail(&err, PLN_API_OPENAI, 404, "model", "The model `%s` does not exist; this server serves `%s`", tr.model, s->model_id);
        snprintf(err.code, sizeof err.code, "model_not_found");
        pln_tokenize_request_free(&tr);
        return send_error(c, con, &err);
    }
    int32_t *ids = NULL, n = 0;
    /* as /generate encodes `inputs` (TGI's /tokenize: add_special_tokens=true) */
    if (s->tok.encode(s->tok.ctx, tr.text, tr.add_special, &ids, &n)) {
        pln_req_fail(&err, c->api, c->api == PLN_API_TGI ? 422 : 400, tr.vllm ? "prompt" : "inputs", "could not tokenize: %s", pln_error());
        pln_tokenize_request_free(&tr);
        return send_error(c, con, &err);
    }
    pln_tokenize_request_free(&tr);
    /* The same cap as /generate: the reply (an object per token) and the memory to build it
     * grow with the token count, so they stay bounded by --max-input-tokens. */
    if (pln_req_check_lengths(c->api, NULL, NULL, n, 0, &s->lim, &err)) {
        free(ids);
        return send_error(c, con, &err);
    }
    json_t *out;
    if (tr.vllm) {
        json_t *toks = json_array(), *strs = tr.token_strs ? json_array() : NULL;
        for (int32_t i = 0; i < n; i++) {
            json_array_append_new(toks, json_integer(ids[i]));
            if (strs) {
                char *t = tok_text(s, ids[i]);
                json_array_append_new(strs, json_string(t));
                free(t);
            }
        }
        out = json_pack("{s:i, s:i, s:o}", "count", (json_int_t)n, "max_model_len", (json_int_t)s->lim.max_total_tokens, "tokens", toks);
        if (strs) json_object_set_new(out, "token_strs", strs);
    } else {
        out = json_array();
        size_t off = 0;
        for (int32_t i = 0; i < n; i++) {
            size_t tl = 0;
            char *raw = s->tok.decode(s->tok.ctx, &ids[i], 1, false, &tl);
            char *t = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
            json_array_append_new(out, json_pack("{s:i, s:s, s:I, s:I}", "id", (json_int_t)ids[i], "text", t,
                                                 "start", (json_int_t)off, "stop", (json_int_t)(off + tl)));
            off += tl;
            free(raw);
            free(t);
        }
    }
    free(ids);
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(c, con, 200, out);
}

/* ---- OpenAI chat -------------------------------------------------------------------------- */

/* A set without a chat template (BLOOM ships none): rather than guess one, say so and point at
 * /v1/completions. */
static enum MHD_Result handle_chat(conn_ctx *c, struct MHD_Connection *con) {
    if (c->srv->chat) return handle_generate(c, con);
    pln_req_error err;
    pln_req_fail(&err, PLN_API_OPENAI, 400, "messages",
                 "`%s` has no chat template (its set has no chat_template.jinja or tokenizer_config.json "
                 "chat_template; BLOOM models ship none), so /v1/chat/completions cannot turn messages into a "
                 "prompt. Send the text as `prompt` to /v1/completions instead, or start the server with "
                 "--chat-template FILE (see docs/SERVING.md)", c->srv->model_id);
    snprintf(err.code, sizeof err.code, "chat_template_missing");
    return send_error(c, con, &err);
}

/* ---- GET routes --------------------------------------------------------------------------- */

static enum MHD_Result handle_health(conn_ctx *c, struct MHD_Connection *con) {
    pln_sched_stats st;
    pln_sched_get_stats(c->srv->sched, &st);
    c->answered = true;
    if (st.healthy && !st.draining) { c->outcome = O_SUCCESS; return send_json(c, con, 200, json_object()); }
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
    json_object_set_new(o, "request_timeout_s", json_integer(l->request_timeout_s));
    json_object_set_new(o, "max_connections_per_client", json_integer(l->max_connections_per_client));
    json_object_set_new(o, "max_stop_sequences", json_integer(l->max_stop_sequences));
    json_object_set_new(o, "max_prompts", json_integer(l->max_prompts));
    json_object_set_new(o, "default_max_new_tokens", json_integer(l->default_max_new_tokens));
    json_object_set_new(o, "max_seqs", json_integer(in->max_seqs));
    json_object_set_new(o, "kv_block_size", json_integer(in->block_size));
    json_object_set_new(o, "kv_dtype", json_string(in->kv_dtype ? in->kv_dtype : "?"));
    json_object_set_new(o, "kv_blocks", json_integer(in->kv_blocks_total));
    json_object_set_new(o, "prefix_cache", json_boolean(in->prefix_cache));
    json_object_set_new(o, "max_best_of", json_integer(l->max_best_of));
    json_object_set_new(o, "max_top_n_tokens", json_integer(l->max_top_n_tokens));
    json_object_set_new(o, "n_vocab", json_integer(in->n_vocab));
    json_object_set_new(o, "hidden_size", json_integer(in->hidden));
    json_object_set_new(o, "n_head", json_integer(in->n_head));
    json_object_set_new(o, "n_layer", json_integer(in->n_layer));
    json_object_set_new(o, "eos_token_id", json_integer(in->n_eos > 0 ? in->eos_ids[0] : PLN_EOS_ID));
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(c, con, 200, o);
}

static json_t *model_json(const pln_server *s, const char *id) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created", (json_int_t)s->started, "owned_by", "pollen");
}

static enum MHD_Result handle_models(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    json_t *o;
    if (c->model_query) {   /* GET /v1/models/{id} */
        if (!model_name_ok(s, c->model_query)) {
            pln_req_error err;
            pln_req_fail(&err, PLN_API_OPENAI, 404, "model", "The model `%s` does not exist; this server serves `%s`",
                         c->model_query, s->model_id);
            snprintf(err.code, sizeof err.code, "model_not_found");
            return send_error(c, con, &err);
        }
        o = model_json(s, c->model_query);
    } else {
        json_t *data = json_array();
        json_array_append_new(data, model_json(s, s->model_id));
        for (int i = 0; i < s->n_names; i++)
            if (strcmp(s->names[i], s->model_id)) json_array_append_new(data, model_json(s, s->names[i]));
        o = json_pack("{s:s, s:o}", "object", "list", "data", data);
    }
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(c, con, 200, o);
}

/* vLLM's POST /detokenize {"tokens": [id, ...], "model"?} -> {"prompt": text}: the ids' text
 * as the tokenizer decodes them, special tokens included; an id outside the vocabulary is a 400
 * naming its index. */
static enum MHD_Result handle_detokenize(conn_ctx *c, struct MHD_Connection *con) {
    pln_server *s = c->srv;
    pln_req_error err;
    int32_t *ids = NULL, n = 0;
    char *model = NULL;
    if (pln_req_parse_detokenize(c->body, c->len, &s->lim, &ids, &n, &model, &err)) return send_error(c, con, &err);
    if (model && !model_name_ok(s, model)) {
        pln_req_fail(&err, PLN_API_OPENAI, 404, "model", "The model `%s` does not exist; this server serves `%s`", model, s->model_id);
        snprintf(err.code, sizeof err.code, "model_not_found");
        free(model);
        free(ids);
        return send_error(c, con, &err);
    }
    free(model);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= s->info.n_vocab) {
            pln_req_fail(&err, PLN_API_OPENAI, 400, "tokens", "`tokens[%d]` is %d, outside the vocabulary (ids 0 to %lld)", i, ids[i],
                         (long long)s->info.n_vocab - 1);
            free(ids);
            return send_error(c, con, &err);
        }
    size_t tl = 0;
    char *raw = n ? s->tok.decode(s->tok.ctx, ids, n, false, &tl) : NULL;
    char *t = pln_utf8_sanitize(raw ? raw : "", raw ? tl : 0, NULL);
    free(raw);
    free(ids);
    c->outcome = O_SUCCESS;
    c->answered = true;
    json_t *o = json_pack("{s:s}", "prompt", t);
    free(t);
    return send_json(c, con, 200, o);
}

/* GET /version {"version"} as vLLM answers. */
static enum MHD_Result handle_version(conn_ctx *c, struct MHD_Connection *con) {
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_json(c, con, 200, json_pack("{s:s}", "version", PLN_VERSION_STRING));
}

/* GET /openapi.json: docs/openapi.json as it is in the repository. */
static enum MHD_Result handle_openapi(conn_ctx *c, struct MHD_Connection *con) {
    size_t n = 0;
    const char *doc = pln_openapi_json(&n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)doc, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    c->outcome = O_SUCCESS;
    c->answered = true;
    return queue(c, con, 200, r);
}

/* GET /docs: a page that lists the routes and points at /openapi.json (no script, nothing
 * fetched from elsewhere: the server may have no way out). */
static enum MHD_Result handle_docs(conn_ctx *c, struct MHD_Connection *con) {
    int n = 0;
    const pln_route_info *rt = pln_server_routes(&n);
    char *page = pln_xasprintf("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>pollen serve</title></head><body>\n"
                               "<h1>pollen serve %s</h1>\n<p>The API as OpenAPI 3: <a href=\"/openapi.json\">/openapi.json</a>. "
                               "Parameters, errors and limits: docs/SERVING.md.</p>\n<ul>\n", PLN_VERSION_STRING);
    for (int i = 0; i < n; i++) {
        char *more = pln_xasprintf("%s<li><code>%s %s</code>%s</li>\n", page, rt[i].method, rt[i].path,
                                   rt[i].auth && c->srv->api_key ? " (API key)" : "");
        free(page);
        page = more;
    }
    char *all = pln_xasprintf("%s</ul>\n</body></html>\n", page);
    free(page);
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_text(c, con, 200, "text/html; charset=utf-8", all);
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
    sb_printf(&b, "# HELP pln_kv_blocks_cached Full KV blocks kept in the prefix cache.\n# TYPE pln_kv_blocks_cached gauge\npln_kv_blocks_cached %lld\n",
              (long long)st.kv_blocks_cached);
    sb_printf(&b, "# HELP pln_prefix_cache_query_tokens_total Prompt tokens looked up in the prefix cache (whole blocks).\n"
                  "# TYPE pln_prefix_cache_query_tokens_total counter\npln_prefix_cache_query_tokens_total %lld\n",
              (long long)st.prefix_query_tokens);
    sb_printf(&b, "# HELP pln_prefix_cache_hit_tokens_total Prompt tokens found in the prefix cache (not computed again).\n"
                  "# TYPE pln_prefix_cache_hit_tokens_total counter\npln_prefix_cache_hit_tokens_total %lld\n",
              (long long)st.prefix_hit_tokens);
    sb_printf(&b, "# HELP pln_kv_fork_tokens_total Prompt tokens whose KV blocks a sequence shared from a sibling (n, best_of).\n"
                  "# TYPE pln_kv_fork_tokens_total counter\npln_kv_fork_tokens_total %lld\n", (long long)st.fork_tokens);
    sb_printf(&b, "# HELP pln_healthy 1 when generation works and the server is not draining.\n# TYPE pln_healthy gauge\npln_healthy %d\n",
              st.healthy && !st.draining);
    sb_printf(&b, "# HELP pln_open_connections Connections being served.\n# TYPE pln_open_connections gauge\npln_open_connections %d\n",
              atomic_load(&s->open));
    sb_printf(&b, "# HELP pln_client_connections TCP connections accepted and not yet closed (this one included), whatever "
                  "they have sent.\n# TYPE pln_client_connections gauge\npln_client_connections %d\n", pln_server_client_connections(s));
    sb_printf(&b, "# HELP pln_request_timeouts_total Connections closed because a request did not arrive whole within --request-timeout.\n"
                  "# TYPE pln_request_timeouts_total counter\npln_request_timeouts_total %llu\n",
              (unsigned long long)atomic_load(&s->deadline_closed));
    metric_hist(&b, "pln_time_to_first_token_seconds", "Time from arrival to the first generated token.", &st.ttft, pln_hist_bounds_seconds);
    metric_hist(&b, "pln_time_per_output_token_seconds", "Mean time between generated tokens of a finished sequence.", &st.tpot,
                pln_hist_bounds_seconds);
    metric_hist(&b, "pln_batch_size_sequences", "Sequences per engine step.", &st.batch, pln_hist_bounds_batch);
    c->outcome = O_SUCCESS;
    c->answered = true;
    return send_text(c, con, 200, "text/plain; version=0.0.4", b.p);
}

/* ---- connection guard: a deadline for every request ----------------------------------------
 * libmicrohttpd 0.9.x has only an idle timeout, which every byte resets: a client that sends one
 * header byte a second holds its connection (and, thread per connection, a thread) for as long
 * as it likes, and a few hundred such clients lock everyone else out. It has no deadline for a
 * whole request, and while it reads a head nothing of ours runs on that connection's thread. So a
 * watchdog thread keeps every connection (MHD_OPTION_NOTIFY_CONNECTION reports each), the time it
 * became ready for its current request (accepted, or its previous response sent) and whether that
 * request has arrived whole. One that has not arrived within --request-timeout is shut down:
 * shutdown(2) on its socket wakes libmicrohttpd's poll, which then closes the connection as a
 * hang-up. A client that had begun a request first gets a 408; an idle keep-alive connection is
 * closed quietly, as nginx does at keepalive_timeout. Using the fd under guard_mu is safe: the
 * CLOSED notification, which unlinks the entry under that lock, comes before libmicrohttpd closes
 * the socket, so the number cannot have been reused. */
typedef struct guard_conn {
    struct guard_conn *prev, *next;
    int fd;
    double ready_at;        /* when the connection became ready for its current request */
    bool started;           /* the current request's first line has arrived */
    bool busy;              /* the current request arrived whole: being answered, no deadline */
    bool answered;          /* a response was queued before the body: libmicrohttpd writes it */
    bool shut;              /* already shut down by the watchdog */
    int target_ctl;         /* the current request target's first control byte, -1: none */
    const char *target;     /* the current request target as guard_on_uri saw it, and its length */
    size_t target_len;
} guard_conn;

static guard_conn *guard_of(struct MHD_Connection *con) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void guard_on_connection(void *cls, struct MHD_Connection *con, void **socket_context,
                                enum MHD_ConnectionNotificationCode code) {
    pln_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        guard_conn *g = pln_xcalloc(1, sizeof *g);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
        g->fd = ci ? ci->connect_fd : -1;
        g->ready_at = pln_now();
        g->target_ctl = -1;
        pthread_mutex_lock(&s->guard_mu);
        g->next = s->guard_head;
        if (g->next) g->next->prev = g;
        s->guard_head = g;
        pthread_mutex_unlock(&s->guard_mu);
        *socket_context = g;
        atomic_fetch_add(&s->tcp_open, 1);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        guard_conn *g = *socket_context;
        if (!g) return;
        pthread_mutex_lock(&s->guard_mu);
        if (g->prev) g->prev->next = g->next;
        else s->guard_head = g->next;
        if (g->next) g->next->prev = g->prev;
        pthread_mutex_unlock(&s->guard_mu);
        free(g);
        *socket_context = NULL;
        atomic_fetch_sub(&s->tcp_open, 1);
    }
}

/* MHD_OPTION_URI_LOG_CALLBACK: the first line of a request has arrived; uri is the target as sent,
 * before libmicrohttpd decodes it (the only place a "%00" can still be seen). Returns the initial
 * request context, which must stay NULL (on_request allocates its own). */
static void *guard_on_uri(void *cls, const char *uri, struct MHD_Connection *con) {
    pln_server *s = cls;
    guard_conn *g = guard_of(con);
    if (g) {
        int ctl = pln_http_target_control(uri);
        pthread_mutex_lock(&s->guard_mu);
        g->started = true;
        g->target_ctl = ctl;
        g->target = uri;
        g->target_len = strlen(uri);
        pthread_mutex_unlock(&s->guard_mu);
    }
    return NULL;
}

/* The control byte guard_on_uri found in this request's target; -1: none. A raw NUL ends the C
 * string libmicrohttpd hands over, so it is found by position instead: libmicrohttpd parses the
 * request line in place, the target running up to the last space, which it overwrites with the
 * NUL that ends the target, and the version right after it. A version further on than the end of
 * the target seen means the target had a NUL of its own. (tests/test_http_hostile.c holds this:
 * a raw NUL is refused, a query string is not.) */
static int guard_target_control(pln_server *s, struct MHD_Connection *con, const char *version) {
    guard_conn *g = guard_of(con);
    if (!g) return -1;
    pthread_mutex_lock(&s->guard_mu);
    int ctl = g->target_ctl;
    const char *t = g->target;
    size_t tl = g->target_len;
    pthread_mutex_unlock(&s->guard_mu);
    if (ctl < 0 && t && version && version > t + tl + 1 && version - t < 65536 && !strncmp(version, "HTTP/", 5)) ctl = 0;
    return ctl;
}

typedef enum { GUARD_ARRIVED, GUARD_ANSWERED_EARLY, GUARD_DONE } guard_event;

static void guard_note(pln_server *s, struct MHD_Connection *con, guard_event ev) {
    guard_conn *g = guard_of(con);
    if (!g) return;
    pthread_mutex_lock(&s->guard_mu);
    switch (ev) {
    case GUARD_ARRIVED: g->busy = true; break;
    case GUARD_ANSWERED_EARLY: g->answered = true; break;
    case GUARD_DONE: g->busy = g->started = g->answered = false; g->target_ctl = -1; g->target = NULL; g->ready_at = pln_now(); break;
    }
    pthread_mutex_unlock(&s->guard_mu);
}

/* Writes a complete error response straight to the socket, for the two cases libmicrohttpd gives
 * no way to answer: a request past its deadline (nothing of ours runs on its thread), and a body
 * found too long while it arrives (0.9.x refuses to queue a response between the head and the end
 * of the body, and a chunked body may never end). Best effort and non-blocking: the connection is
 * closed right after, so nothing else is written on it. */
static void send_raw_error(int fd, pln_api api, const pln_req_error *err, const char *reason) {
    char *body = pln_req_error_json(api, err);
    char *msg = pln_xasprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                              "Connection: close\r\n\r\n%s", err->status, reason, strlen(body), body);
    ssize_t w = send(fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    free(msg);
    free(body);
}

static void *guard_thread(void *arg) {
    pln_server *s = arg;
    const double limit = s->lim.request_timeout_s;
    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        timed_wait(&s->guard_cv, &s->guard_mu, 100);
        double now = pln_now();
        for (guard_conn *g = s->guard_head; g; g = g->next) {
            if (g->busy || g->shut || g->fd < 0 || now - g->ready_at < limit) continue;
            if (g->started && !g->answered) {
                pln_req_error err;
                pln_req_fail(&err, PLN_API_TGI, 408, NULL,
                             "the request did not arrive whole within %d s (--request-timeout)", s->lim.request_timeout_s);
                send_raw_error(g->fd, PLN_API_TGI, &err, "Request Timeout");
            }
            shutdown(g->fd, SHUT_RDWR);
            g->shut = true;
            atomic_fetch_add(&s->deadline_closed, 1);
        }
    }
    pthread_mutex_unlock(&s->guard_mu);
    return NULL;
}

static void guard_start(pln_server *s) {
    pthread_mutex_init(&s->guard_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    if (s->lim.request_timeout_s > 0) s->guard_running = !pthread_create(&s->guard_thr, NULL, guard_thread, s);
}

static void guard_stop(pln_server *s) {
    if (s->guard_running) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cv);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard_thr, NULL);
        s->guard_running = false;
    }
}

/* ---- framing: the head decides how the body is read, or the connection is refused ---------- */

static enum MHD_Result collect_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    struct { pln_http_field f[256]; size_t n; bool overflow; } *fs = cls;
    if (fs->n == 256) { fs->overflow = true; return MHD_NO; }
    fs->f[fs->n++] = (pln_http_field){key, value};
    return MHD_YES;
}

/* An error answered before the body has been read. When the body's end cannot be found (bad
 * framing) or is not worth waiting for (chunked), the connection is closed after the answer, as
 * RFC 9112 §6.3 requires, instead of being read on for a next request that may be smuggled. */
static enum MHD_Result send_early_error(conn_ctx *c, struct MHD_Connection *con, const pln_req_error *err, bool close) {
    c->outcome = outcome_of_status(err->status);
    c->answered = true;
    guard_note(c->srv, con, GUARD_ANSWERED_EARLY);
    char *text = pln_req_error_json(c->api, err);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (err->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    return queue(c, con, err->status, r);
}

/* First call of a request: checks its framing (httpframe.h). Returns 0, or -1 after answering. */
static int frame_check(conn_ctx *c, struct MHD_Connection *con, enum MHD_Result *ret) {
    struct { pln_http_field f[256]; size_t n; bool overflow; } fs;
    fs.n = 0;
    fs.overflow = false;
    MHD_get_connection_values(con, MHD_HEADER_KIND, collect_field, &fs);
    pln_req_error err;
    pln_frame fr;
    int rc;
    if (fs.overflow) rc = pln_req_fail(&err, c->api, 431, NULL, "more than 256 header fields");
    else rc = pln_http_check_framing(fs.f, fs.n, c->srv->lim.max_body_bytes, c->api, &fr, &err);
    if (!rc) { c->frame = fr.kind; return 0; }
    *ret = send_early_error(c, con, &err, true);
    return -1;
}

/* Body bytes: kept up to --max-body-bytes. Past it the request is answered 413 at once, however
 * the body is framed (a chunked body may announce 2^64-1 bytes and never end), the write side is
 * shut so the client sees the answer and the end, and what still arrives is read and dropped for
 * a moment (a lingering close, as nginx does, so the kernel does not reset the connection before
 * the client has read the 413). Returns MHD_NO when the connection must close. */
static enum MHD_Result frame_body(conn_ctx *c, struct MHD_Connection *con, const char *data, size_t n) {
    pln_server *s = c->srv;
    if (c->too_big) return pln_now() - c->rejected_at < 1.0 ? MHD_YES : MHD_NO;
    if (c->answered) return MHD_YES;   /* answered early: libmicrohttpd drops the rest */
    if (c->len + n > (size_t)s->lim.max_body_bytes) {
        pln_req_error err;
        pln_req_fail(&err, c->api, 413, NULL, "request body is over %lld bytes (--max-body-bytes)",
                     (long long)s->lim.max_body_bytes);
        c->too_big = true;
        c->outcome = O_VALIDATION;
        c->rejected_at = pln_now();
        guard_note(s, con, GUARD_ANSWERED_EARLY);
        send_raw_error(c->fd, c->api, &err, "Content Too Large");
        c->status = 413;
        shutdown(c->fd, SHUT_WR);
        free(c->body);
        c->body = NULL;
        c->len = c->cap = 0;
        return MHD_YES;
    }
    if (c->len + n + 1 > c->cap) {
        c->cap = (c->len + n + 1) * 2;
        if (c->cap > (size_t)s->lim.max_body_bytes + 1) c->cap = (size_t)s->lim.max_body_bytes + 1;
        c->body = pln_xrealloc(c->body, c->cap);
    }
    memcpy(c->body + c->len, data, n);
    c->len += n;
    return MHD_YES;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static const struct route_def *route_of(const char *url) {
    for (int i = 0; i < N_ROUTES; i++) {
        const char *p = g_routes[i].path, *brace = strchr(p, '{');
        if (!brace ? !strcmp(url, p) : !strncmp(url, p, (size_t)(brace - p)) && url[brace - p]) return &g_routes[i];
    }
    return NULL;
}

/* ---- the API key ---------------------------------------------------------------------------
 * "Authorization: Bearer KEY" (the scheme in any case, RFC 9110 §11.1). The key is compared in
 * time that depends on the length of what the client sent, never on where it first differs
 * from the key or on the key's length. */
static bool key_ok(const pln_server *s, const char *auth) {
    if (!auth) return false;
    while (*auth == ' ' || *auth == '\t') auth++;
    if (strncasecmp(auth, "Bearer", 6) || (auth[6] != ' ' && auth[6] != '\t')) return false;
    const char *t = auth + 7;
    while (*t == ' ' || *t == '\t') t++;
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t')) n--;
    volatile unsigned char diff = (unsigned char)(n != s->api_key_len);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(t[i] ^ s->api_key[i % s->api_key_len]);
    return diff == 0;
}

/* ---- request log -----------------------------------------------------------------------------
 * One line per request on stderr (rank 0), answered or failed: `--log-format text` (key=value)
 * or `json` (one object per line); `--log-requests off` silences them. Times in milliseconds:
 * queue (arrival at the scheduler to the first sequence admitted), inference (admitted to the
 * last sequence finished), total (head received to the response ended). The API key, headers
 * and bodies are never logged. */
/* src as one text field: bytes outside printable ASCII, and spaces, become '?' (dst as large as src's array). */
static void printable(char *dst, const char *src) {
    size_t k = 0;
    for (const char *p = src; *p; p++) dst[k++] = (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f ? *p : '?';
    dst[k] = 0;
}

static void log_request(pln_server *s, conn_ctx *c, double t_end) {
    if (!s->log_requests) return;
    long long tin = 0, tout = 0;
    double queue_ms = -1, infer_ms = -1;
    if (c->job) {
        pln_job *j = c->job;
        pthread_mutex_lock(&j->mu);
        double t_sub = 0, t_adm = 0, t_done = 0;
        for (int32_t i = 0; i < j->n_seqs; i++) {
            const pln_seq *q = &j->seqs[i];
            if (i % j->best_of == 0) tin += q->n_prompt;
            tout += q->n_gen;
            if (!t_sub || q->t_submit < t_sub) t_sub = q->t_submit;
            if (q->t_admit > 0 && (!t_adm || q->t_admit < t_adm)) t_adm = q->t_admit;
            if (q->t_done > t_done) t_done = q->t_done;
        }
        pthread_mutex_unlock(&j->mu);
        if (t_sub > 0) queue_ms = ((t_adm > 0 ? t_adm : t_done > 0 ? t_done : t_end) - t_sub) * 1e3;
        if (t_adm > 0) infer_ms = ((t_done > 0 ? t_done : t_end) - t_adm) * 1e3;
        if (queue_ms < 0 && t_sub > 0) queue_ms = 0;
    }
    double total_ms = (t_end - c->t_start) * 1e3;
    char *line;
    if (s->log_json) {
        time_t now = time(NULL);
        struct tm tm;
        char ts[32];
        gmtime_r(&now, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        /* what the client sent may be any bytes: made valid UTF-8 (jansson refuses anything else) */
        char *path = pln_utf8_sanitize(c->path, strlen(c->path), NULL);
        char *method = pln_utf8_sanitize(c->method, strlen(c->method), NULL);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:s}", "timestamp", ts, "event", "request", "id", c->id,
                              "method", method, "path", path, "route", g_route_names[c->route], "status",
                              (json_int_t)c->status, "outcome", g_outcome_names[c->outcome]);
        free(path);
        free(method);
        json_object_set_new(o, "tokens_in", json_integer(tin));
        json_object_set_new(o, "tokens_out", json_integer(tout));
        json_object_set_new(o, "queue_ms", queue_ms >= 0 ? json_real(queue_ms) : json_null());
        json_object_set_new(o, "inference_ms", infer_ms >= 0 ? json_real(infer_ms) : json_null());
        json_object_set_new(o, "total_ms", json_real(total_ms));
        char *j = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
        line = pln_xasprintf("%s\n", j ? j : "{}");
        free(j);
    } else {
        char q[32] = "-", in[32] = "-", path[sizeof c->path], method[sizeof c->method];
        printable(path, c->path);
        printable(method, c->method);
        if (queue_ms >= 0) snprintf(q, sizeof q, "%.3f", queue_ms);
        if (infer_ms >= 0) snprintf(in, sizeof in, "%.3f", infer_ms);
        line = pln_xasprintf("pollen serve: request id=%s method=%s path=%s route=%s status=%d outcome=%s tokens_in=%lld "
                             "tokens_out=%lld queue_ms=%s inference_ms=%s total_ms=%.3f\n",
                             c->id, method, path, g_route_names[c->route], c->status, g_outcome_names[c->outcome],
                             tin, tout, q, in, total_ms);
    }
    /* one write per line: lines of concurrent requests never interleave */
    size_t len = strlen(line), off = 0;
    while (off < len) {
        ssize_t w = write(s->log_fd, line + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(line);
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
        c->t_start = pln_now();
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->path, sizeof c->path, "%s", url);
        snprintf(c->id, sizeof c->id, "req-%llx%04llx", (unsigned long long)time(NULL),
                 (unsigned long long)atomic_fetch_add(&s->id_counter, 1) & 0xFFFF);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) c->fd = ci->connect_fd;
        const struct route_def *rd = route_of(url);
        bool known = rd != NULL, post = rd && rd->post;
        c->route = rd ? rd->route : R_NOT_FOUND;
        if (c->route == R_MODELS && strlen(url) > 11) c->model_query = pln_xstrdup(url + 11);
        /* vLLM's /detokenize answers as its OpenAI routes do */
        c->api = !strncmp(url, "/v1/", 4) || c->route == R_DETOKENIZE ? PLN_API_OPENAI : PLN_API_TGI;
        *con_cls = c;
        enum MHD_Result fret;
        if (frame_check(c, con, &fret)) return fret;
        pln_req_error err;
        bool body_left = c->frame != PLN_FRAME_NONE;
        /* A decoded NUL would cut "/generate%00x" down to "/generate": no route is chosen from a
         * target with a control byte in it. */
        int ctl = guard_target_control(s, con, version);
        if (ctl >= 0)
            return send_early_error(c, con, (pln_req_fail(&err, c->api, 400, NULL,
                                                          "the request target has a control byte (0x%02x, raw or "
                                                          "percent-encoded): refused", ctl), &err), true);
        if (!known)
            return send_early_error(c, con, (pln_req_fail(&err, c->api, 404, NULL, "no route %s %s", method, url), &err),
                                    body_left);
        /* HEAD wherever GET: libmicrohttpd sends the head of the GET answer without its body */
        if (post ? strcmp(method, "POST") : strcmp(method, "GET") && strcmp(method, "HEAD")) {
            pln_req_fail(&err, c->api, 405, NULL, "%s %s: use %s", method, url, post ? "POST" : "GET or HEAD");
            return send_early_error(c, con, &err, body_left);
        }
        if (rd->auth && s->api_key && !key_ok(s, MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))) {
            pln_req_fail(&err, c->api, 401, NULL, "%s %s needs the server's API key: send the header "
                         "\"Authorization: Bearer KEY\" (pollen serve --api-key)", method, url);
            if (c->api == PLN_API_OPENAI) snprintf(err.code, sizeof err.code, "invalid_api_key");
            return send_early_error(c, con, &err, body_left);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        enum MHD_Result br = frame_body(c, con, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return br;
    }
    if (c->too_big) return MHD_NO;   /* answered 413 already; close */
    guard_note(s, con, GUARD_ARRIVED);
    if (!c->in_flight) {
        c->in_flight = true;
        atomic_fetch_add(&s->in_flight, 1);
    }
    if (c->answered) return MHD_YES;
    switch (c->route) {
    case R_GENERATE: case R_GENERATE_STREAM: case R_COMPLETIONS: case R_ROOT: return handle_generate(c, con);
    case R_CHAT: return handle_chat(c, con);
    case R_TOKENIZE: return handle_tokenize(c, con);
    case R_HEALTH: return handle_health(c, con);
    case R_INFO: return handle_info(c, con);
    case R_METRICS: return handle_metrics(c, con);
    case R_MODELS: return handle_models(c, con);
    case R_DETOKENIZE: return handle_detokenize(c, con);
    case R_VERSION: return handle_version(c, con);
    case R_DOCS: return handle_docs(c, con);
    case R_OPENAPI: return handle_openapi(c, con);
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe) {
    pln_server *s = cls;
    guard_note(s, con, GUARD_DONE);
    conn_ctx *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (c->in_flight) atomic_fetch_sub(&s->in_flight, 1);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->job) {
        pln_job_cancel(c->job);
        if (c->outcome == O_SUCCESS && !c->stream_done) c->outcome = O_CANCELLED;
    }
    count(s, c->route, c->outcome);
    log_request(s, c, pln_now());
    ctx_unref(c);
}

/* Accepts client connections and hands each to libmicrohttpd through a relay (httprelay.h),
 * with the client's address, so its per-address limit counts clients. Ends when the listening
 * socket is shut down. */
typedef struct { pln_server *s; int fd; } acc_arg;

static void *accept_thread(void *arg) {
    acc_arg a = *(acc_arg *)arg;
    free(arg);
    pln_server *s = a.s;
    for (;;) {
        struct sockaddr_storage ca;
        socklen_t cl = sizeof ca;
        int fd = accept4(a.fd, (struct sockaddr *)&ca, &cl, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                struct timespec ts = {0, 10 * 1000000L};   /* out of descriptors: let some close */
                nanosleep(&ts, NULL);
                continue;
            }
            return NULL;   /* shut down (EINVAL) */
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   /* token events go out at once */
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp)) { close(fd); continue; }
        if (pln_relay_start(fd, sp[1])) { close(sp[0]); continue; }
        MHD_add_connection(s->d, sp[0], (struct sockaddr *)&ca, cl);   /* on refusal it closes sp[0] */
    }
}

/* --host VALUE as getaddrinfo resolves it: an IPv4 or IPv6 address (brackets allowed: "[::1]"),
 * or a host name ("localhost"). Every address returned is listened on, on one port (the first
 * socket's, when --port is 0), so "localhost" answers on 127.0.0.1 and ::1 alike. An IPv6
 * socket takes only IPv6 when IPv4 addresses are listened on beside it; alone ("::"), it takes
 * both where the system allows (Linux's default, net.ipv6.bindv6only=0). */
static int listen_on(pln_server *s, const char *host_arg, int port) {
    char host[256];
    size_t hl = strlen(host_arg);
    if (hl >= sizeof host) return pln_errorf("--host %.40s...: too long for an address or host name", host_arg);
    if (hl >= 2 && host_arg[0] == '[' && host_arg[hl - 1] == ']') snprintf(host, sizeof host, "%.*s", (int)(hl - 2), host_arg + 1);
    else snprintf(host, sizeof host, "%s", host_arg);
    if (!host[0]) return pln_errorf("--host %s: empty (use 127.0.0.1, ::1, 0.0.0.0, :: or a host name)", host_arg);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int g = getaddrinfo(host, ports, &hints, &res);
    if (g)
        return pln_errorf("--host %s: cannot resolve it (%s); give an IPv4 or IPv6 address (127.0.0.1, 0.0.0.0, ::1, ::) "
                          "or a host name this machine resolves", host_arg, gai_strerror(g));
    bool has4 = false;
    for (struct addrinfo *a = res; a; a = a->ai_next) has4 |= a->ai_family == AF_INET;
    int bound_port = port, rc = 0;
    for (struct addrinfo *a = res; a && s->n_listen < PLN_MAX_LISTEN; a = a->ai_next) {
        if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
        bool dup = false;   /* getaddrinfo may list an address twice (one line each in /etc/hosts) */
        for (struct addrinfo *b = res; b != a; b = b->ai_next)
            dup |= b->ai_addrlen == a->ai_addrlen && !memcmp(b->ai_addr, a->ai_addr, a->ai_addrlen);
        if (dup) continue;
        if (a->ai_family == AF_INET) ((struct sockaddr_in *)a->ai_addr)->sin_port = htons((uint16_t)bound_port);
        else ((struct sockaddr_in6 *)a->ai_addr)->sin6_port = htons((uint16_t)bound_port);
        char shown[INET6_ADDRSTRLEN] = "?";
        inet_ntop(a->ai_family, a->ai_family == AF_INET ? (void *)&((struct sockaddr_in *)a->ai_addr)->sin_addr
                                                        : (void *)&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr, shown, sizeof shown);
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        if (fd >= 0 && a->ai_family == AF_INET6 && has4) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, a->ai_addr, a->ai_addrlen) ||
            listen(fd, 256)) {
            rc = pln_errorf("--host %s: cannot listen on %s%s%s port %d (%s); pick another --port or --host", host_arg,
                            a->ai_family == AF_INET6 ? "[" : "", shown, a->ai_family == AF_INET6 ? "]" : "", bound_port, strerror(errno));
            if (fd >= 0) close(fd);
            break;
        }
        if (bound_port == 0) {
            struct sockaddr_storage b;
            socklen_t bl = sizeof b;
            if (!getsockname(fd, (struct sockaddr *)&b, &bl))
                bound_port = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port : ((struct sockaddr_in6 *)&b)->sin6_port);
        }
        s->listen_fd[s->n_listen++] = fd;
    }
    freeaddrinfo(res);
    if (!rc && s->n_listen == 0) rc = pln_errorf("--host %s: resolves to no IPv4 or IPv6 address", host_arg);
    if (rc) {
        for (int i = 0; i < s->n_listen; i++) close(s->listen_fd[i]);
        s->n_listen = 0;
        return -1;
    }
    s->port = bound_port;
    return 0;
}

static void stop_accepting(pln_server *s) {
    for (int i = 0; i < s->n_listen; i++) shutdown(s->listen_fd[i], SHUT_RDWR);   /* accept() returns */
    for (int i = 0; i < s->n_acc; i++) pthread_join(s->acc_thr[i], NULL);
    s->n_acc = 0;
    for (int i = 0; i < s->n_listen; i++) close(s->listen_fd[i]);
    s->n_listen = 0;
}

static void server_free(pln_server *s) {
    free(s->model_id);
    for (int i = 0; i < s->n_names; i++) free(s->names[i]);
    free(s->names);
    free(s->host);
    if (s->api_key) explicit_bzero(s->api_key, s->api_key_len);
    free(s->api_key);
    free(s);
}

pln_server *pln_server_start(const pln_server_opts *o, pln_sched *sched, const pln_sched_tok *tok) {
    pln_server *s = pln_xcalloc(1, sizeof *s);
    s->sched = sched;
    s->tok = *tok;
    s->lim = o->lim;
    s->model_id = pln_xstrdup(o->model_id ? o->model_id : "bloom");
    if (o->n_served_names > 0) {
        s->names = pln_xcalloc((size_t)o->n_served_names, sizeof *s->names);
        for (int i = 0; i < o->n_served_names; i++) s->names[i] = pln_xstrdup(o->served_names[i]);
        s->n_names = o->n_served_names;
    }
    s->chat = o->chat_template;
    s->host = pln_xstrdup(o->host ? o->host : "127.0.0.1");
    if (o->api_key && o->api_key[0]) {
        s->api_key = pln_xstrdup(o->api_key);
        s->api_key_len = strlen(o->api_key);
    }
    s->log_requests = !o->no_request_log;
    s->log_json = o->log_json;
    s->log_fd = o->log ? fileno(o->log) : STDERR_FILENO;
    s->started = time(NULL);
    pln_sched_engine_info(sched, &s->info);
    /* The server listens itself and gives libmicrohttpd one end of a socket pair per connection,
     * the other end relayed to the client (httprelay.h: the chunk-size lines libmicrohttpd 0.9.x
     * would answer with a 500). */
    if (listen_on(s, s->host, o->port)) {
        server_free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    guard_start(s);
    /* Heads are bounded by libmicrohttpd's per-connection memory pool (its default 32 KiB: a
     * longer line or head gets 414/431 and a close); bodies by --max-body-bytes (frame_body). */
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->lim.max_connections > 0 ? o->lim.max_connections : 256),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(o->lim.max_connections_per_client > 0 ? o->lim.max_connections_per_client : 0),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->lim.timeout_s > 0 ? o->lim.timeout_s : 0),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, guard_on_connection, s,
                            MHD_OPTION_URI_LOG_CALLBACK, guard_on_uri, s,
                            MHD_OPTION_END);
    if (!s->d) {
        pln_errorf("%s:%d: cannot start the HTTP server (%s)", s->host, s->port, strerror(errno));
        guard_stop(s);
        stop_accepting(s);
        server_free(s);
        return NULL;
    }
    for (int i = 0; i < s->n_listen; i++) {
        acc_arg *a = pln_xmalloc(sizeof *a);
        *a = (acc_arg){s, s->listen_fd[i]};
        if (pthread_create(&s->acc_thr[s->n_acc], NULL, accept_thread, a)) {
            free(a);
            pln_errorf("%s:%d: cannot start the accepting thread", s->host, s->port);
            stop_accepting(s);
            MHD_stop_daemon(s->d);
            guard_stop(s);
            server_free(s);
            return NULL;
        }
        s->n_acc++;
    }
    return s;
}

int pln_server_port(const pln_server *s) { return s->port; }
int pln_server_open_responses(pln_server *s) { return atomic_load(&s->in_flight); }
/* libmicrohttpd's own count: it drops a connection from it only after releasing the connection's
 * place under the per-client limit (the CLOSED notification comes just before that), so a caller
 * that saw it fall may count on the place being free. */
int pln_server_client_connections(pln_server *s) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return di ? (int)di->num_connections : atomic_load(&s->tcp_open);
}

void pln_server_stop(pln_server *s, double grace_s) {
    if (!s) return;
    /* Only requests that arrived whole are waited for: an idle keep-alive connection, or one
     * still sending its request, has nothing in flight (it would get 503 anyway). */
    double t0 = pln_now();
    while (atomic_load(&s->in_flight) > 0 && pln_now() - t0 < grace_s) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    stop_accepting(s);   /* no new connections */
    guard_stop(s);
    MHD_stop_daemon(s->d);
    /* libmicrohttpd has closed its ends: the relays end (bounded, as they are) */
    for (double t1 = pln_now(); pln_relay_live() > 0 && pln_now() - t1 < 15;) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_destroy(&s->guard_mu);
    pthread_cond_destroy(&s->guard_cv);
    server_free(s);
}
