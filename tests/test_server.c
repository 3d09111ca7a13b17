/* test_server.c — the HTTP server and the scheduler over real HTTP on 127.0.0.1, driven by a
 * deterministic test engine (so every behaviour is checked without model weights): routes and
 * shapes, the validation table over the wire, streamed text == non-streamed text (UTF-8 split
 * across tokens, stop sequences both ways), identical concurrent greedy requests, overload → 429
 * at once, a client that disconnects mid-stream (slot and KV blocks freed, seen in /metrics),
 * fault injection (error event, /health 503, memory freed) and draining (in-flight finishes, new
 * requests get 503). Ports are chosen by the kernel (port 0); every wait is bounded. */
#include "runtime/scheduler.h"
#include "runtime/server.h"
#include "runtime/chat.h"
#include "tests/test.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

/* ---- the test engine ------------------------------------------------------------------------
 * Tokens are bytes: id = byte + 4 (ids 0..3 are <unk> <s> </s> <pad>). The greedy next token of a
 * slot depends only on its first prompt token and position, so identical requests agree:
 *   prompt starting '!': three letters then EOS;   prompt starting '~': the bytes of "é€" over
 *   and over (UTF-8 split across tokens);          otherwise 'a' + (first + pos) % 26.
 * Sampling mixes the seed in. Each step sleeps delay_us; step fail_at (counting steps that feed
 * tokens) fails and releases the plan's slots, as the real engine does; step nan_at reports its
 * sampled rows nonfinite (NaN logits), as the real engine does for a corrupt model. */
#define FE_SLOTS 8
#define FE_BLOCK 4
#define FE_BLOCKS 96
typedef struct {
    pthread_mutex_t mu;
    bool active[FE_SLOTS];
    int32_t n_pos[FE_SLOTS], first[FE_SLOTS], n_gen[FE_SLOTS];
    int64_t used[FE_SLOTS];
    int64_t n_free;
    int64_t step_no;
    int64_t fail_at;
    int64_t nan_at;            /* this step's sampled rows are nonfinite (NaN logits), no token */
    int delay_us;
    int max_batch_seen;
    int max_tokens_seen;       /* tokens fed in one step */
} fake_engine;

static void fe_release(fake_engine *f, int32_t s) {
    if (!f->active[s]) return;
    f->n_free += f->used[s];
    f->used[s] = 0;
    f->active[s] = false;
}

static int32_t fe_next(fake_engine *f, int32_t s, const pln_sample_params *p) {
    static const unsigned char utf[] = {0xC3, 0xA9, 0xE2, 0x82, 0xAC};
    int32_t first = f->first[s], pos = f->n_pos[s], g = f->n_gen[s];
    if (first == '!' + 4 && g == 3) return PLN_EOS_ID;
    if (first == '~' + 4) return utf[g % 5] + 4;
    int32_t k = (first + pos) % 26;
    if (p->do_sample) k = (int32_t)((p->seed * 7 + (uint64_t)pos * 13) % 26);
    return 'a' + k + 4;
}

static int fe_step(void *ctx, const pln_step_plan *plan, pln_step_out *out) {
    fake_engine *f = ctx;
    pthread_mutex_lock(&f->mu);
    for (int32_t i = 0; i < plan->n_release; i++) fe_release(f, plan->release[i]);
    if (plan->n_seqs == 0) { pthread_mutex_unlock(&f->mu); return 0; }
    f->step_no++;
    if (plan->n_seqs > f->max_batch_seen) f->max_batch_seen = plan->n_seqs;
    int ntok = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) ntok += plan->seqs[i].n_new;
    if (ntok > f->max_tokens_seen) f->max_tokens_seen = ntok;
    if (f->fail_at && f->step_no == f->fail_at) {
        for (int32_t i = 0; i < plan->n_seqs; i++) fe_release(f, plan->seqs[i].slot);
        pthread_mutex_unlock(&f->mu);
        return pln_errorf("forward pass: injected failure at step %lld", (long long)f->step_no);
    }
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        const pln_step_seq *q = &plan->seqs[i];
        int32_t s = q->slot;
        if (!f->active[s]) { f->active[s] = true; f->n_pos[s] = 0; f->first[s] = q->tokens[0]; f->n_gen[s] = 0; f->used[s] = 0; }
        f->n_pos[s] += q->n_new;
        int64_t want = (f->n_pos[s] + FE_BLOCK - 1) / FE_BLOCK;
        f->n_free -= want - f->used[s];
        f->used[s] = want;
        out[i].token = -1;
        if (q->sample && f->nan_at && f->step_no == f->nan_at) {
            out[i].nonfinite = true;
        } else if (q->sample) {
            out[i].token = fe_next(f, s, &q->params);
            out[i].logprob = -0.25f;
            f->n_gen[s]++;
        }
    }
    int d = f->delay_us;
    pthread_mutex_unlock(&f->mu);
    if (d) usleep((useconds_t)d);
    return 0;
}

static void fe_info(void *ctx, pln_engine_info *in) {
    fake_engine *f = ctx;
    memset(in, 0, sizeof *in);
    in->tp = 1;
    in->n_vocab = 260;
    in->hidden = 8;
    in->n_head = 1;
    in->n_layer = 1;
    in->dtype = "fp16";
    in->backend = "test";
    in->kv_blocks_total = FE_BLOCKS;
    pthread_mutex_lock(&f->mu);
    in->kv_blocks_free = f->n_free;
    pthread_mutex_unlock(&f->mu);
    in->block_size = FE_BLOCK;
    in->max_seqs = FE_SLOTS;
    in->max_seq_len = 256;
}

static const char *const g_specials[4] = {"<unk>", "<s>", "</s>", "<pad>"};
static int ft_encode(void *ctx, const char *text, bool add_special, int32_t **ids, int32_t *n) {
    (void)add_special;
    size_t l = strlen(text);
    *ids = malloc(sizeof(int32_t) * (l ? l : 1));
    for (size_t i = 0; i < l; i++) (*ids)[i] = (unsigned char)text[i] + 4;
    *n = (int32_t)l;
    return 0;
}
static char *ft_decode(void *ctx, const int32_t *ids, int32_t n, bool skip, size_t *len) {
    char *o = malloc((size_t)n * 6 + 1);
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 4) { if (!skip) { strcpy(o + k, g_specials[ids[i]]); k += strlen(g_specials[ids[i]]); } }
        else o[k++] = (char)(ids[i] - 4);
    }
    o[k] = 0;
    *len = k;
    return o;
}
static bool ft_special(void *ctx, int32_t id) { return id < 4; }

/* ---- one server instance -------------------------------------------------------------------- */
typedef struct {
    fake_engine fe;
    pln_sched *sched;
    pln_server *srv;
    pthread_t thr;
    int port;
} inst;

static void *sched_thread(void *a) { pln_sched_run(a); return NULL; }
static const pln_chat_template *g_chat;   /* the next instance's --chat-template (NULL: none) */
static const char *const *g_names;         /* the next instance's --served-model-name */
static int g_n_names;
static const char *g_api_key;               /* the next instance's --api-key */
static FILE *g_log;                          /* where the next instance's request lines go (NULL: stderr) */
static bool g_log_json, g_no_log;            /* --log-format json, --log-requests off */
static const char *g_host = "127.0.0.1";     /* the next instance's --host */

static void inst_start(inst *in, const pln_serve_limits *lim, int delay_us, int64_t fail_at) {
    memset(in, 0, sizeof *in);
    pthread_mutex_init(&in->fe.mu, NULL);
    in->fe.n_free = FE_BLOCKS;
    in->fe.delay_us = delay_us;
    in->fe.fail_at = fail_at;
    pln_sched_engine se = {.ctx = &in->fe, .step = fe_step, .get_info = fe_info};
    pln_sched_tok st = {.ctx = NULL, .encode = ft_encode, .decode = ft_decode, .is_special = ft_special};
    in->sched = pln_sched_create(&se, &st, lim);
    if (!in->sched) { fprintf(stderr, "sched: %s\n", pln_error()); exit(2); }
    pln_server_opts so = {.host = "127.0.0.1", .port = 0, .model_id = "fake-model-tp1-fp16-set", .lim = *lim, .chat_template = g_chat,
                          .served_names = g_names, .n_served_names = g_n_names};
    so.host = g_host;
    so.api_key = g_api_key;
    so.log = g_log;
    so.log_json = g_log_json;
    so.no_request_log = g_no_log;
    in->srv = pln_server_start(&so, in->sched, &st);
    if (!in->srv) { fprintf(stderr, "server: %s\n", pln_error()); exit(2); }
    in->port = pln_server_port(in->srv);
    pthread_create(&in->thr, NULL, sched_thread, in->sched);
}

static void inst_stop(inst *in) {
    pln_sched_stop(in->sched);
    pthread_join(in->thr, NULL);
    pln_server_stop(in->srv, 5.0);
    pln_sched_free(in->sched);
}

/* ---- a tiny HTTP/1.0 client (no chunked encoding; the server closes at the end) ------------- */
typedef struct { int status; char *body; double secs; } resp;

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {20, 0};   /* bounded: no test waits forever */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

static int send_req(int fd, const char *method, const char *path, const char *body, size_t blen) {
    char head[512];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, body ? blen : 0);
    if (write(fd, head, (size_t)n) != n) return -1;
    size_t off = 0;
    while (body && off < blen) {
        ssize_t w = write(fd, body + off, blen - off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

static resp http(int port, const char *method, const char *path, const char *body) {
    resp r = {0, NULL, 0};
    double t0 = pln_now();
    int fd = connect_to(port);
    if (fd < 0) { r.body = strdup(""); return r; }
    send_req(fd, method, path, body, body ? strlen(body) : 0);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 2048 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = 0;
    sscanf(buf, "HTTP/1.%*d %d", &r.status);
    char *b = strstr(buf, "\r\n\r\n");
    r.body = strdup(b ? b + 4 : "");
    free(buf);
    r.secs = pln_now() - t0;
    return r;
}

/* A request with extra header lines (each ending in \r\n) to addr (IPv4 or IPv6) at port; the
 * head of the answer goes to *head (malloc'd) when asked for. */
typedef struct { int status; char *head, *body; } resp2;
static resp2 http2(int family, const char *addr, int port, const char *method, const char *path, const char *headers,
                   const char *body) {
    resp2 r = {0, strdup(""), strdup("")};
    int fd = socket(family, SOCK_STREAM, 0);
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    socklen_t sl;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, addr, &a6->sin6_addr);
        sl = sizeof *a6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, addr, &a4->sin_addr);
        sl = sizeof *a4;
    }
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sl)) { if (fd >= 0) close(fd); return r; }
    size_t bl = body ? strlen(body) : 0;
    char *req = pln_xasprintf("%s %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n%s",
                              method, path, bl, headers ? headers : "", body ? body : "");
    ssize_t w = write(fd, req, strlen(req));
    (void)w;
    free(req);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 2048 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = 0;
    sscanf(buf, "HTTP/1.%*d %d", &r.status);
    char *b = strstr(buf, "\r\n\r\n");
    free(r.head);
    free(r.body);
    r.head = b ? strndup(buf, (size_t)(b - buf)) : strdup(buf);
    r.body = strdup(b ? b + 4 : "");
    free(buf);
    return r;
}
static void resp2_free(resp2 *r) { free(r->head); free(r->body); }

static json_t *jparse(const char *s) { return json_loads(s, JSON_DECODE_ANY, NULL); }
static const char *jstr(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

/* Value of a Prometheus sample line "name value" (first match), -1 if absent. */
static double metric(int port, const char *name) {
    resp r = http(port, "GET", "/metrics", NULL);
    double v = -1;
    size_t nl = strlen(name);
    for (char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, nl) && p[nl] == ' ') { v = atof(p + nl + 1); break; }
    free(r.body);
    return v;
}

/* SSE "data:" payloads of a stream body; returns how many (≤ max). */
static int sse_events(char *body, char **out, int max) {
    int n = 0;
    for (char *p = strstr(body, "data: "); p && n < max; p = strstr(p, "data: ")) {
        p += 6;
        char *e = strstr(p, "\n\n");
        if (!e) break;
        *e = 0;
        out[n++] = p;
        p = e + 2;
    }
    return n;
}

/* Generated text of /generate (TGI) for a body. */
static char *tgi_text(int port, const char *body, int *status) {
    resp r = http(port, "POST", "/generate", body);
    *status = r.status;
    json_t *o = jparse(r.body);
    char *t = strdup(o && jstr(o, "generated_text") ? jstr(o, "generated_text") : "<none>");
    json_decref(o);
    free(r.body);
    return t;
}

/* Concatenated text of a TGI stream; *final gets the last event's generated_text. */
static char *tgi_stream_text(int port, const char *body, char **final, int *n_events, json_t **last_out) {
    resp r = http(port, "POST", "/generate_stream", body);
    char *ev[600];
    int n = sse_events(r.body, ev, 600);
    size_t cap = 4096;
    char *acc = calloc(1, cap);
    *final = strdup("<none>");
    for (int i = 0; i < n; i++) {
        json_t *o = jparse(ev[i]);
        json_t *tk = json_object_get(o, "token");
        if (tk && !json_is_true(json_object_get(tk, "special"))) strncat(acc, json_string_value(json_object_get(tk, "text")), cap - strlen(acc) - 1);
        if (i == n - 1) {
            if (jstr(o, "generated_text")) { free(*final); *final = strdup(jstr(o, "generated_text")); }
            if (last_out) *last_out = json_incref(o);
        }
        json_decref(o);
    }
    *n_events = n;
    free(r.body);
    return acc;
}

/* Concatenated text of an OpenAI stream (choice 0) and whether it ended with [DONE]. */
static char *oai_stream_text(int port, const char *body, bool *done, char *finish, size_t fcap) {
    resp r = http(port, "POST", "/v1/completions", body);
    char *ev[600];
    int n = sse_events(r.body, ev, 600);
    char *acc = calloc(1, 4096);
    *done = n > 0 && !strcmp(ev[n - 1], "[DONE]");
    for (int i = 0; i < n; i++) {
        json_t *o = jparse(ev[i]);
        json_t *c = json_array_get(json_object_get(o, "choices"), 0);
        if (c) {
            strncat(acc, jstr(c, "text"), 4095 - strlen(acc));
            if (jstr(c, "finish_reason")) snprintf(finish, fcap, "%s", jstr(c, "finish_reason"));
        }
        json_decref(o);
    }
    free(r.body);
    return acc;
}

static char *oai_text(int port, const char *body, int *status, char *finish, size_t fcap) {
    resp r = http(port, "POST", "/v1/completions", body);
    *status = r.status;
    json_t *o = jparse(r.body);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    char *t = strdup(c && jstr(c, "text") ? jstr(c, "text") : "<none>");
    if (c && jstr(c, "finish_reason")) snprintf(finish, fcap, "%s", jstr(c, "finish_reason"));
    json_decref(o);
    free(r.body);
    return t;
}

typedef struct { int port; const char *body; char *text; int status; } par_arg;
static void *par_generate(void *a) {
    par_arg *p = a;
    p->text = tgi_text(p->port, p->body, &p->status);
    return NULL;
}

/* Opens a stream, reads until the first event arrived, returns the fd (caller closes). */
static int open_stream(int port, const char *body) {
    int fd = connect_to(port);
    if (fd < 0) return -1;
    send_req(fd, "POST", "/generate_stream", body, strlen(body));
    char buf[4096];
    size_t len = 0;
    double t0 = pln_now();
    while (pln_now() - t0 < 10) {
        ssize_t k = read(fd, buf + len, sizeof buf - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
        buf[len] = 0;
        if (strstr(buf, "data: ")) return fd;
        if (len > sizeof buf - 100) len = 0;
    }
    close(fd);
    return -1;
}

/* Waits for a state the server reports; secs is what a quiet machine needs, and at least 30 s are
 * allowed (a hang guard: a loaded machine is slow, not wrong). */
static bool wait_metric(int port, const char *name, double want, double secs) {
    if (secs < 30) secs = 30;
    double t0 = pln_now();
    while (pln_now() - t0 < secs) {
        if (metric(port, name) == want) return true;
        usleep(10000);
    }
    return false;
}

/* The routes and shapes the real clients use: the TGI compatibility route (an array, or SSE by
 * `stream`), the chat route's explanation, a JSON 404, OpenAI n / best_of / logprobs / echo and
 * TGI best_of_sequences, over the wire. */
static void test_compat(int port) {
    const char *b = "{\"inputs\":\"abc\",\"parameters\":{\"max_new_tokens\":5}}";
    int st;
    char *want = tgi_text(port, b, &st);
    resp r = http(port, "POST", "/", b);
    json_t *o = jparse(r.body);
    CHECK(r.status == 200 && json_is_array(o) && json_array_size(o) == 1 &&
              !strcmp(jstr(json_array_get(o, 0), "generated_text"), want),
          "POST / answers [{generated_text}] like /generate: %s", r.body);
    json_decref(o);
    free(r.body);
    r = http(port, "POST", "/", "{\"inputs\":\"abc\",\"stream\":true,\"parameters\":{\"max_new_tokens\":5}}");
    char *ev[64];
    int n = sse_events(r.body, ev, 64);
    o = n > 0 ? jparse(ev[n - 1]) : NULL;
    CHECK(r.status == 200 && n == 5 && o && jstr(o, "generated_text") && !strcmp(jstr(o, "generated_text"), want),
          "POST / with stream: 5 events, the last with the same text (%d events)", n);
    json_decref(o);
    free(r.body);
    free(want);

    r = http(port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    o = jparse(r.body);
    json_t *e = json_object_get(o, "error");
    CHECK(r.status == 400 && e && !strcmp(jstr(e, "type"), "invalid_request_error") &&
              !strcmp(jstr(e, "code"), "chat_template_missing") && strstr(jstr(e, "message"), "/v1/completions"),
          "chat without a template: 400 in the OpenAI shape, pointing at /v1/completions: %s", r.body);
    const char *cm = e ? jstr(e, "message") : NULL;
    const char *tail = "(see docs/SERVING.md)";
    CHECK(cm && strlen(cm) > strlen(tail) && !strcmp(cm + strlen(cm) - strlen(tail), tail),
          "chat without a template: the whole advice arrives, not cut short: %s", cm ? cm : "(none)");
    json_decref(o);
    free(r.body);
    r = http(port, "GET", "/no/such/route", NULL);
    o = jparse(r.body);
    CHECK(r.status == 404 && o && !strcmp(jstr(o, "error_type"), "not_found"), "unknown route: JSON 404 %s", r.body);
    json_decref(o);
    free(r.body);

    r = http(port, "POST", "/v1/completions", "{\"prompt\":\"abc\",\"max_tokens\":4,\"temperature\":0,\"n\":2,\"logprobs\":0,\"echo\":true}");
    o = jparse(r.body);
    json_t *ch = json_object_get(o, "choices");
    json_t *c0 = json_array_get(ch, 0), *c1 = json_array_get(ch, 1);
    json_t *lp = json_object_get(c0, "logprobs");
    CHECK(r.status == 200 && json_array_size(ch) == 2 && json_integer_value(json_object_get(c1, "index")) == 1 &&
              !strcmp(jstr(c0, "text"), jstr(c1, "text")) && !strncmp(jstr(c0, "text"), "abc", 3),
          "n=2 echo: two choices starting with the prompt: %s", r.body);
    /* echo + logprobs: 3 prompt tokens (the test engine scores none: null) then 4 generated at -0.25 */
    json_t *tl = json_object_get(lp, "token_logprobs"), *to = json_object_get(lp, "text_offset");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 7 && json_is_null(json_array_get(tl, 0)) &&
              json_real_value(json_array_get(tl, 6)) == -0.25 && json_integer_value(json_array_get(to, 3)) == 3 &&
              json_integer_value(json_array_get(to, 6)) == 6,
          "logprobs: tokens, token_logprobs, text_offset: %s", r.body);
    CHECK(json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")) == 8 &&
              json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")) == 3,
          "usage: the prompt once, both completions");
    json_decref(o);
    free(r.body);

    r = http(port, "POST", "/generate", "{\"inputs\":\"abc\",\"parameters\":{\"max_new_tokens\":4,\"do_sample\":true,\"best_of\":3,\"details\":true}}");
    o = jparse(r.body);
    json_t *d = json_object_get(o, "details");
    CHECK(r.status == 200 && json_array_size(json_object_get(d, "best_of_sequences")) == 2 &&
              jstr(json_array_get(json_object_get(d, "best_of_sequences"), 0), "generated_text"),
          "best_of 3: the answer and two best_of_sequences: %s", r.body);
    json_decref(o);
    free(r.body);
}

/* /v1/chat/completions with a template: the messages are rendered into one prompt and answered
 * exactly as /v1/completions answers that prompt, in the chat shapes, streamed or not. */
static void test_chat(const pln_serve_limits *lim) {
    static char empty[] = "", u[] = "U:", nl[] = "|", gp[] = "A:";
    static char *stops[] = {nl};
    static const pln_chat_template tpl = {.prefix = {empty, u, empty}, .suffix = {nl, nl, nl}, .generation_prompt = gp,
                                          .stop = stops, .n_stop = 1};
    g_chat = &tpl;
    inst C;
    inst_start(&C, lim, 0, 0);
    g_chat = NULL;
    int st;
    char fin[32] = "";
    char *want = oai_text(C.port, "{\"prompt\":\"sys|U:hi|A:\",\"max_tokens\":6,\"temperature\":0,\"stop\":\"|\"}", &st, fin, sizeof fin);
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi\"}],"
                       "\"max_tokens\":6,\"temperature\":0";
    char b1[512];
    snprintf(b1, sizeof b1, "%s}", body);
    resp r = http(C.port, "POST", "/v1/chat/completions", b1);
    json_t *o = jparse(r.body);
    json_t *c0 = json_array_get(json_object_get(o, "choices"), 0), *msg = json_object_get(c0, "message");
    CHECK(r.status == 200 && !strcmp(jstr(o, "object"), "chat.completion") && !strncmp(jstr(o, "id"), "chatcmpl-", 9) &&
              !strcmp(jstr(msg, "role"), "assistant") && !strcmp(jstr(msg, "content"), want),
          "chat answer == completion of the rendered prompt '%s': %s", want, r.body);
    json_decref(o);
    free(r.body);
    snprintf(b1, sizeof b1, "%s,\"stream\":true}", body);
    r = http(C.port, "POST", "/v1/chat/completions", b1);
    char *ev[64], acc[256] = "";
    int n = sse_events(r.body, ev, 64);
    bool role_first = false;
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i], "[DONE]")) continue;
        json_t *e = jparse(ev[i]);
        json_t *d = json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta");
        if (i == 0) role_first = jstr(d, "role") && !strcmp(jstr(d, "role"), "assistant") &&
                                 !strcmp(jstr(e, "object"), "chat.completion.chunk");
        if (jstr(d, "content")) strncat(acc, jstr(d, "content"), sizeof acc - strlen(acc) - 1);
        json_decref(e);
    }
    CHECK(n > 1 && !strcmp(ev[n - 1], "[DONE]") && role_first && !strcmp(acc, want),
          "chat stream: role first, deltas add up ('%s' vs '%s'), [DONE] last", acc, want);
    free(r.body);
    free(want);
    inst_stop(&C);
}

/* An OpenAI error answer: status, "code" and a piece of "message". */
static bool oai_error(resp r, int status, const char *code, const char *msg_part) {
    json_t *o = jparse(r.body), *e = json_object_get(o, "error");
    bool ok = r.status == status && e && (!code || (jstr(e, "code") && !strcmp(jstr(e, "code"), code))) &&
              jstr(e, "message") && strstr(jstr(e, "message"), msg_part);
    json_decref(o);
    return ok;
}

/* /v1/chat/completions with the model's own Jinja template (what serve loads from the set's
 * tokenizer_config.json): the messages reach the template as they are (text parts joined, a tool
 * call's JSON arguments parsed), the special tokens and tools are its variables, the answer is
 * the completion of the rendered prompt; raise_exception and render errors are 400s with the
 * template's message or line. Then the model names: --served-model-name aliases, "tgi" and
 * "dummy" accepted, anything else 404; GET /v1/models lists the names, /v1/models/{id} answers. */
static void test_chat_jinja(const pln_serve_limits *lim) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/jinja-set", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"chat_template\": "
          "\"{{ bos_token }}{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
          "{{ raise_exception('System message must come first') }}{% endif %}"
          "{% if m.role == 'boom' %}\\n{{ m.nothing.x }}{% endif %}"
          "[{{ m.role }}]{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}"
          "{% endfor %}{% if tools %}(T:{{ tools | map(attribute='function.name') | join(',') }}){% endif %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}{% if enable_thinking is defined and not enable_thinking %}/nothink{% endif %}\"}", f);
    fclose(f);
    pln_chat *chat = pln_chat_load(dir, NULL, NULL);
    CHECK(chat != NULL, "load the set's template: %s", pln_error());
    if (!chat) return;
    static const char *const names[] = {"alias-a", "org/alias-b"};
    pln_chat_template tpl = {.jinja = chat};
    g_chat = &tpl;
    g_names = names;
    g_n_names = 2;
    inst C;
    inst_start(&C, lim, 0, 0);
    g_chat = NULL;
    g_names = NULL;
    g_n_names = 0;
    int st;
    char fin[32] = "";
    char *want = oai_text(C.port, "{\"prompt\":\"<s>[system]sys[user]hi[assistant]\",\"max_tokens\":5,\"temperature\":0}", &st, fin, sizeof fin);
    resp r = http(C.port, "POST", "/v1/chat/completions",
                  "{\"model\":\"fake-model-tp1-fp16-set\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"h\"},{\"type\":\"text\",\"text\":\"i\"}]}],"
                  "\"max_tokens\":5,\"temperature\":0}");
    json_t *o = jparse(r.body);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(r.status == 200 && want && jstr(msg, "content") && !strcmp(jstr(msg, "content"), want) &&
              json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")) == 33,
          "jinja chat == completion of '<s>[system]sys[user]hi[assistant]' (33 prompt tokens; text parts joined): %s", r.body);
    json_decref(o);
    free(r.body);
    free(want);
    /* tools and a tool call reach the template; the arguments string arrives as a mapping; a null
     * content prints as jinja2 prints None */
    want = oai_text(C.port, "{\"prompt\":\"<s>[user]q[assistant]None{\\\"c\\\": 1}(T:f1,f2)[assistant]\",\"max_tokens\":3,\"temperature\":0}",
                    &st, fin, sizeof fin);
    r = http(C.port, "POST", "/v1/chat/completions",
             "{\"model\":\"tgi\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
             "\"tool_calls\":[{\"id\":\"x\",\"type\":\"function\",\"function\":{\"name\":\"f1\",\"arguments\":\"{\\\"c\\\":1}\"}}]}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f1\"}},{\"type\":\"function\",\"function\":{\"name\":\"f2\"}}],"
             "\"tool_choice\":\"auto\",\"max_tokens\":3,\"temperature\":0}");
    o = jparse(r.body);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(r.status == 200 && want && jstr(msg, "content") && !strcmp(jstr(msg, "content"), want),
          "tools and parsed tool-call arguments rendered (model \"tgi\" accepted): %s", r.body);
    json_decref(o);
    free(r.body);
    free(want);
    /* vLLM's chat_template_kwargs and add_generation_prompt reach the template */
    want = oai_text(C.port, "{\"prompt\":\"<s>[user]q/nothink\",\"max_tokens\":3,\"temperature\":0}", &st, fin, sizeof fin);
    r = http(C.port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"chat_template_kwargs\":{\"enable_thinking\":false},"
             "\"add_generation_prompt\":false,\"max_tokens\":3,\"temperature\":0}");
    o = jparse(r.body);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(r.status == 200 && want && jstr(msg, "content") && !strcmp(jstr(msg, "content"), want),
          "chat_template_kwargs and add_generation_prompt false rendered ('<s>[user]q/nothink'): %s", r.body);
    json_decref(o);
    free(r.body);
    free(want);
    r = http(C.port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"chat_template_kwargs\":{\"messages\":[]}}");
    CHECK(oai_error(r, 400, NULL, "may not set `messages`"), "chat_template_kwargs may not replace the messages: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"chat_template_kwargs\":[1]}");
    CHECK(oai_error(r, 400, NULL, "must be a JSON object"), "chat_template_kwargs must be an object: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"late\"}]}");
    CHECK(oai_error(r, 400, "chat_template_error", "refuses this conversation: System message must come first"),
          "raise_exception: 400 with the template's message: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"boom\",\"content\":\"a\"}]}");
    CHECK(oai_error(r, 400, "chat_template_error", "tokenizer_config.json (chat_template):2: 'dict object' has no attribute 'nothing'"),
          "a render error: 400 naming the template line: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions", "{\"messages\":[{\"content\":\"no role\"}]}");
    CHECK(oai_error(r, 400, NULL, "must be an object with a string `role`"), "a message without a role: 400: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":\"required\"}");
    CHECK(oai_error(r, 400, NULL, "tool_choice"), "tool_choice required: 400: %s", r.body);
    free(r.body);
    r = http(C.port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":{}}");
    CHECK(oai_error(r, 400, NULL, "`tools` must be a list"), "tools not a list: 400: %s", r.body);
    free(r.body);
    /* model names */
    const char *const ok_names[] = {"fake-model-tp1-fp16-set", "alias-a", "org/alias-b", "tgi", "dummy"};
    for (int i = 0; i < 5; i++) {
        char b[256];
        snprintf(b, sizeof b, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":1}", ok_names[i]);
        r = http(C.port, "POST", "/v1/chat/completions", b);
        CHECK(r.status == 200, "model \"%s\" accepted by chat: %d %s", ok_names[i], r.status, r.body);
        free(r.body);
        snprintf(b, sizeof b, "{\"model\":\"%s\",\"prompt\":\"a\",\"max_tokens\":1}", ok_names[i]);
        r = http(C.port, "POST", "/v1/completions", b);
        CHECK(r.status == 200, "model \"%s\" accepted by completions: %d %s", ok_names[i], r.status, r.body);
        free(r.body);
    }
    r = http(C.port, "POST", "/v1/chat/completions", "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}");
    CHECK(oai_error(r, 404, "model_not_found", "The model `other` does not exist"), "an unknown model: 404: %s", r.body);
    free(r.body);
    r = http(C.port, "GET", "/v1/models", NULL);
    o = jparse(r.body);
    json_t *data = json_object_get(o, "data");
    CHECK(r.status == 200 && json_array_size(data) == 3 && !strcmp(jstr(json_array_get(data, 0), "id"), "fake-model-tp1-fp16-set") &&
              !strcmp(jstr(json_array_get(data, 1), "id"), "alias-a") && !strcmp(jstr(json_array_get(data, 2), "id"), "org/alias-b"),
          "/v1/models lists the served names: %s", r.body);
    json_decref(o);
    free(r.body);
    r = http(C.port, "GET", "/v1/models/org/alias-b", NULL);
    o = jparse(r.body);
    CHECK(r.status == 200 && !strcmp(jstr(o, "id"), "org/alias-b") && !strcmp(jstr(o, "object"), "model"),
          "GET /v1/models/{id}: %s", r.body);
    json_decref(o);
    free(r.body);
    r = http(C.port, "GET", "/v1/models/nope", NULL);
    CHECK(oai_error(r, 404, "model_not_found", "`nope` does not exist"), "GET /v1/models/{unknown}: 404: %s", r.body);
    free(r.body);
    inst_stop(&C);
    pln_chat_free(chat);
}

/* A request with more sequences (prompts x n/best_of) than --max-concurrent-requests can never
 * be admitted, whatever else is running: a 4xx naming both numbers and the field, on every route
 * that takes n or best_of, never the retryable 429 (which says "wait and retry"). */
static void test_never_admitted(const pln_serve_limits *base) {
    static char empty[] = "", u[] = "U:", nl[] = "|", gp[] = "A:";
    static const pln_chat_template tpl = {.prefix = {empty, u, empty}, .suffix = {nl, nl, nl}, .generation_prompt = gp};
    pln_serve_limits lim = *base;
    lim.max_concurrent_requests = 2;
    g_chat = &tpl;
    inst I;
    inst_start(&I, &lim, 0, 0);
    g_chat = NULL;
    static const struct { const char *route, *body; int status; const char *field, *need; } t[] = {
        {"/generate", "{\"inputs\":\"a\",\"parameters\":{\"best_of\":3,\"do_sample\":true}}", 422, "best_of", "3 sequences"},
        {"/", "{\"inputs\":\"a\",\"parameters\":{\"best_of\":4,\"do_sample\":true}}", 422, "best_of", "4 sequences"},
        {"/v1/completions", "{\"prompt\":\"a\",\"n\":3}", 400, "n", "3 sequences"},
        {"/v1/completions", "{\"prompt\":\"a\",\"n\":1,\"best_of\":3}", 400, "best_of", "3 sequences"},
        {"/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"n\":2}", 400, "n", "4 sequences (2 prompts x `n` 2)"},
        {"/v1/completions", "{\"prompt\":[\"a\",\"b\",\"c\"]}", 400, "prompt", "3 sequences (3 prompts x `n` 1)"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3}", 400, "n", "3 sequences"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        resp r = http(I.port, "POST", t[i].route, t[i].body);
        json_t *o = jparse(r.body);
        json_t *e = t[i].status == 400 ? json_object_get(o, "error") : o;
        const char *msg = jstr(e, t[i].status == 400 ? "message" : "error");
        bool shape = t[i].status == 400 ? jstr(e, "param") && !strcmp(jstr(e, "param"), t[i].field)
                                         : jstr(e, "error_type") && !strcmp(jstr(e, "error_type"), "validation");
        CHECK(r.status == t[i].status && shape && msg && strstr(msg, t[i].need) && strstr(msg, "--max-concurrent-requests 2") &&
                  strstr(msg, t[i].field),
              "%s %s over --max-concurrent-requests 2: %d naming `%s`, both numbers (%d %s)", t[i].route, t[i].body,
              t[i].status, t[i].field, r.status, r.body);
        json_decref(o);
        free(r.body);
    }
    CHECK(metric(I.port, "pln_requests_total{route=\"generate\",outcome=\"overloaded\"}") == 0 &&
              metric(I.port, "pln_requests_total{route=\"generate\",outcome=\"validation_error\"}") == 1,
          "counted as a validation error, not as overload");
    /* at the limit it is admitted */
    resp r = http(I.port, "POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"max_tokens\":2}");
    CHECK(r.status == 200, "2 prompts x n 1 at --max-concurrent-requests 2: admitted (%d %s)", r.status, r.body);
    free(r.body);
    inst_stop(&I);
}

/* ---- serving features: API key, request log, HEAD, /docs, /openapi.json, /version,
 * /detokenize, token-id prompts, --host names and IPv6 ----------------------------------------- */

/* A body each route accepts (a path with its parameter filled in). */
static const char *route_path(const pln_route_info *ri) {
    return !strcmp(ri->path, "/v1/models/{model}") ? "/v1/models/tgi" : ri->path;   /* "tgi": a name every server accepts */
}
static const char *route_body(const char *path) {
    if (!strcmp(path, "/tokenize")) return "{\"inputs\":\"ab\"}";
    if (!strcmp(path, "/detokenize")) return "{\"tokens\":[101,102]}";
    if (!strcmp(path, "/v1/completions")) return "{\"prompt\":\"ab\",\"max_tokens\":2}";
    if (!strcmp(path, "/v1/chat/completions")) return "{\"messages\":[{\"role\":\"user\",\"content\":\"ab\"}],\"max_tokens\":2}";
    return "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":2}}";
}

/* Waits (bounded) until the log file holds a line with every one of the given parts. The line of
 * a request is written once its response has gone out, so it may come a moment after the answer. */
static char *wait_log_line(FILE *f, const char *a, const char *b, const char *c) {
    for (double t0 = pln_now(); pln_now() - t0 < 30; usleep(5000)) {
        fflush(f);
        long end = ftell(f);
        char *all = calloc(1, (size_t)end + 1);
        if (pread(fileno(f), all, (size_t)end, 0) < 0) { free(all); continue; }
        for (char *line = all, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl) *nl = 0;
            if (strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c))) {
                char *r = strdup(line);
                free(all);
                return r;
            }
        }
        free(all);
    }
    return NULL;
}

static void test_api_key_and_log(const pln_serve_limits *lim) {
    static const char *const key = "k3y-S3cret-value";
    FILE *log = tmpfile();
    g_api_key = key;
    g_log = log;
    g_log_json = true;
    inst K;
    inst_start(&K, lim, 0, 0);
    g_api_key = NULL;
    g_log = NULL;
    g_log_json = false;
    int n = 0;
    const pln_route_info *rt = pln_server_routes(&n);
    CHECK(n >= 15, "route table (%d routes)", n);
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    for (int i = 0; i < n; i++) {
        const char *path = route_path(&rt[i]);
        const char *body = !strcmp(rt[i].method, "POST") ? route_body(path) : NULL;
        resp2 no = http2(AF_INET, "127.0.0.1", K.port, rt[i].method, path, NULL, body);
        resp2 yes = http2(AF_INET, "127.0.0.1", K.port, rt[i].method, path, auth, body);
        if (rt[i].auth) {
            json_t *o = jparse(no.body);
            bool oai = !strncmp(path, "/v1/", 4) || !strcmp(path, "/detokenize");
            json_t *e = oai ? json_object_get(o, "error") : o;
            const char *msg = e ? jstr(e, oai ? "message" : "error") : NULL;
            CHECK(no.status == 401 && strstr(no.head, "WWW-Authenticate: Bearer") && msg && strstr(msg, "Authorization: Bearer") &&
                      (oai ? !strcmp(jstr(e, "code") ? jstr(e, "code") : "", "invalid_api_key")
                           : !strcmp(jstr(o, "error_type") ? jstr(o, "error_type") : "", "unauthorized")),
                  "%s %s without the key -> 401 with WWW-Authenticate and a JSON error (%d %s)", rt[i].method, path, no.status, no.body);
            json_decref(o);
        } else {
            CHECK(no.status == 200, "%s %s is open without the key (%d)", rt[i].method, path, no.status);
        }
        /* chat: no template on this instance, so a 400 that says so (not a 401) */
        int want = !strcmp(path, "/v1/chat/completions") ? 400 : 200;
        CHECK(yes.status == want, "%s %s with the key -> %d (%d %s)", rt[i].method, path, want, yes.status, yes.body);
        resp2_free(&no);
        resp2_free(&yes);
    }
    /* keys that are not the key, and spellings of the right one */
    static const char *const wrong[] = {"Authorization: Bearer k3y-S3cret-valu\r\n", "Authorization: Bearer k3y-S3cret-valuee\r\n",
                                        "Authorization: Bearer K3Y-S3CRET-VALUE\r\n", "Authorization: Basic k3y-S3cret-value\r\n",
                                        "Authorization: k3y-S3cret-value\r\n", "Authorization: Bearer\r\n", "Authorization: Bearer \r\n",
                                        "X-Api-Key: k3y-S3cret-value\r\n"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        resp2 r = http2(AF_INET, "127.0.0.1", K.port, "POST", "/generate", wrong[i], route_body("/generate"));
        CHECK(r.status == 401, "wrong credentials %.40s -> 401 (%d)", wrong[i], r.status);
        resp2_free(&r);
    }
    resp2 r = http2(AF_INET, "127.0.0.1", K.port, "POST", "/generate", "Authorization: bearer   k3y-S3cret-value  \r\n",
                    route_body("/generate"));
    CHECK(r.status == 200, "scheme in any case, spaces around the key -> 200 (%d)", r.status);
    resp2_free(&r);
    r = http2(AF_INET, "127.0.0.1", K.port, "GET", "/info", NULL, NULL);
    CHECK(r.status == 200 && !strstr(r.body, key), "/info does not show the key");
    resp2_free(&r);
    /* the request log: one JSON object per line, the failed requests too, never the key */
    r = http2(AF_INET, "127.0.0.1", K.port, "POST", "/generate", auth, "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":3}}");
    char want_id[64] = "";
    char *xid = strstr(r.head, "X-Request-Id: ");
    if (xid) sscanf(xid + 14, "%63[^\r\n]", want_id);
    CHECK(r.status == 200 && want_id[0], "X-Request-Id on the answer (%s)", want_id);
    resp2_free(&r);
    char idq[96];
    snprintf(idq, sizeof idq, "\"id\":\"%s\"", want_id);
    char *line = wait_log_line(log, idq, NULL, NULL);
    json_t *o = line ? jparse(line) : NULL;
    CHECK(o && !strcmp(jstr(o, "method"), "POST") && !strcmp(jstr(o, "path"), "/generate") && !strcmp(jstr(o, "route"), "generate") &&
              json_integer_value(json_object_get(o, "status")) == 200 && !strcmp(jstr(o, "outcome"), "success") &&
              json_integer_value(json_object_get(o, "tokens_in")) == 2 && json_integer_value(json_object_get(o, "tokens_out")) == 3 &&
              json_is_number(json_object_get(o, "queue_ms")) && json_is_number(json_object_get(o, "inference_ms")) &&
              json_is_number(json_object_get(o, "total_ms")) && jstr(o, "timestamp"),
          "JSON request line of a generation: %s", line ? line : "(none)");
    json_decref(o);
    free(line);
    line = wait_log_line(log, "\"status\":401", "\"route\":\"completions\"", NULL);
    o = line ? jparse(line) : NULL;
    CHECK(o && !strcmp(jstr(o, "outcome"), "unauthorized") && json_is_null(json_object_get(o, "queue_ms")) &&
              json_integer_value(json_object_get(o, "tokens_out")) == 0,
          "a refused request has its line too: %s", line ? line : "(none)");
    json_decref(o);
    free(line);
    r = http2(AF_INET, "127.0.0.1", K.port, "GET", "/caf%C3%A9%ff", NULL, NULL);   /* not UTF-8 once decoded */
    CHECK(r.status == 404, "a path that is not UTF-8 -> 404 (%d)", r.status);
    resp2_free(&r);
    line = wait_log_line(log, "\"path\":\"/caf\xc3\xa9\xef\xbf\xbd\"", "\"route\":\"not_found\"", NULL);
    CHECK(line != NULL, "its line has the path as valid UTF-8 (U+FFFD for the bad byte)");
    free(line);
    fflush(log);
    long end = ftell(log);
    char *all = calloc(1, (size_t)end + 1);
    CHECK(pread(fileno(log), all, (size_t)end, 0) == end, "read the log");
    CHECK(!strstr(all, key) && !strstr(all, "S3cret"), "the key is in no log line");
    int lines = 0, bad = 0;
    for (char *p = all, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        json_t *x = jparse(p);
        lines++;
        if (!json_is_object(x) || !jstr(x, "id") || !json_is_integer(json_object_get(x, "status"))) bad++;
        json_decref(x);
    }
    CHECK(lines >= 2 * n && bad == 0, "every line is a JSON object (%d lines, %d not)", lines, bad);
    free(all);
    /* --host: a name the machine cannot resolve, and an empty one, are refused naming the value */
    pln_sched_tok st = {.ctx = NULL, .encode = ft_encode, .decode = ft_decode, .is_special = ft_special};
    pln_server_opts bad_host = {.host = "no-such-host.invalid", .port = 0, .lim = *lim};
    pln_server *none = pln_server_start(&bad_host, K.sched, &st);
    CHECK(!none && strstr(pln_error(), "--host no-such-host.invalid") && strstr(pln_error(), "cannot resolve"),
          "unresolvable --host: %s", pln_error());
    bad_host.host = "[]";
    none = pln_server_start(&bad_host, K.sched, &st);
    CHECK(!none && strstr(pln_error(), "--host []"), "empty --host: %s", pln_error());
    inst_stop(&K);
    fclose(log);

    /* --log-requests off: nothing */
    log = tmpfile();
    g_log = log;
    g_no_log = true;
    inst Q;
    inst_start(&Q, lim, 0, 0);
    g_log = NULL;
    g_no_log = false;
    resp rr = http(Q.port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":2}}");
    CHECK(rr.status == 200, "generate (log off)");
    free(rr.body);
    rr = http(Q.port, "GET", "/nope", NULL);
    free(rr.body);
    inst_stop(&Q);   /* every request has completed once the server is stopped */
    fflush(log);
    CHECK(ftell(log) == 0, "--log-requests off: no line (%ld bytes)", ftell(log));
    fclose(log);
}

/* HEAD wherever GET; /docs, /openapi.json (every route documented, nothing documented that is not
 * served), /version, /detokenize, token-id prompts. */
static void test_routes_more(int port) {
    int n = 0;
    const pln_route_info *rt = pln_server_routes(&n);
    for (int i = 0; i < n; i++) {
        const char *path = route_path(&rt[i]);
        if (!strcmp(rt[i].method, "GET")) {
            resp2 g = http2(AF_INET, "127.0.0.1", port, "GET", path, NULL, NULL);
            resp2 h = http2(AF_INET, "127.0.0.1", port, "HEAD", path, NULL, NULL);
            char *ct_g = strstr(g.head, "Content-Type:"), *ct_h = strstr(h.head, "Content-Type:");
            size_t lg = ct_g ? strcspn(ct_g, "\r\n") : 0, lh = ct_h ? strcspn(ct_h, "\r\n") : 0;
            CHECK(g.status == 200 && h.status == g.status && h.body[0] == 0 && ct_g && ct_h && lg == lh && !strncmp(ct_g, ct_h, lg),
                  "HEAD %s: the status and Content-Type of GET (%d vs %d), no body (%zu bytes)", path, h.status, g.status,
                  strlen(h.body));
            resp2_free(&g);
            resp2_free(&h);
        } else {
            resp2 h = http2(AF_INET, "127.0.0.1", port, "HEAD", path, NULL, NULL);
            CHECK(h.status == 405, "HEAD %s (a POST route) -> 405 (%d)", path, h.status);
            resp2_free(&h);
        }
    }
    /* /openapi.json: the file in docs/, verbatim; every route in it with its method and key */
    resp r = http(port, "GET", "/openapi.json", NULL);
    size_t flen = 0;
    char *file = NULL;
    FILE *f = fopen("docs/openapi.json", "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        flen = (size_t)ftell(f);
        rewind(f);
        file = calloc(1, flen + 1);
        if (fread(file, 1, flen, f) != flen) flen = 0;
        fclose(f);
    }
    CHECK(r.status == 200 && file && !strcmp(r.body, file), "/openapi.json is docs/openapi.json verbatim");
    free(file);
    json_t *doc = jparse(r.body), *paths = json_object_get(doc, "paths");
    CHECK(doc && !strncmp(jstr(doc, "openapi") ? jstr(doc, "openapi") : "", "3.", 2) && json_is_object(paths),
          "/openapi.json is an OpenAPI 3 document");
    for (int i = 0; i < n; i++) {
        char m[8];
        snprintf(m, sizeof m, "%s", rt[i].method);
        for (char *p = m; *p; p++) *p = (char)(*p - 'A' + 'a');
        json_t *op = json_object_get(json_object_get(paths, rt[i].path), m);
        json_t *sec = json_object_get(op, "security");
        CHECK(op && json_is_object(json_object_get(op, "responses")), "docs/openapi.json documents %s %s", rt[i].method, rt[i].path);
        CHECK(op && json_is_array(sec) && (json_array_size(sec) > 0) == rt[i].auth, "docs/openapi.json: %s %s %s the API key",
              rt[i].method, rt[i].path, rt[i].auth ? "needs" : "does not need");
    }
    const char *pk;
    json_t *pv;
    json_object_foreach(paths, pk, pv) {
        bool served = false;
        for (int i = 0; i < n; i++) served |= !strcmp(rt[i].path, pk);
        CHECK(served, "docs/openapi.json documents %s, which the server answers", pk);
    }
    json_decref(doc);
    free(r.body);
    r = http(port, "GET", "/docs", NULL);
    bool all = r.status == 200 && strstr(r.body, "<html") && strstr(r.body, "href=\"/openapi.json\"");
    for (int i = 0; i < n; i++) all &= strstr(r.body, rt[i].path) != NULL;
    CHECK(all, "/docs: a page naming every route and linking /openapi.json (%d)", r.status);
    free(r.body);
    r = http(port, "GET", "/version", NULL);
    json_t *o = jparse(r.body);
    CHECK(r.status == 200 && o && !strcmp(jstr(o, "version"), PLN_VERSION_STRING), "/version %s", r.body);
    json_decref(o);
    free(r.body);

    /* /detokenize (vLLM's shape) */
    static const struct { const char *body; int status; const char *want; } dt[] = {
        {"{\"tokens\":[108,105,112,112,115]}", 200, "{\"prompt\":\"hello\"}"},
        {"{\"tokens\":[1,101,2],\"model\":\"tgi\"}", 200, "{\"prompt\":\"<s>a</s>\"}"},
        {"{\"tokens\":[]}", 200, "{\"prompt\":\"\"}"},
        {"{\"tokens\":[101,260]}", 400, "`tokens[1]` is 260, outside the vocabulary (ids 0 to 259)"},
        {"{\"tokens\":[-1]}", 400, "`tokens[0]` must be a token id"},
        {"{\"tokens\":[101,1.5]}", 400, "`tokens[1]` must be a token id"},
        {"{\"tokens\":\"ab\"}", 400, "`tokens` must be a list of token ids"},
        {"{}", 400, "`tokens` must be a list of token ids"},
        {"{\"tokens\":[101],\"model\":\"other\"}", 404, "does not exist"},
        {"{\"tokens\":[101],\"prompt\":\"x\"}", 400, "Unrecognized request argument supplied: prompt"},
    };
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        r = http(port, "POST", "/detokenize", dt[i].body);
        CHECK(r.status == dt[i].status && strstr(r.body, dt[i].want) && (dt[i].status == 200 || strstr(r.body, "\"error\":{")),
              "/detokenize %s -> %d %s", dt[i].body, r.status, r.body);
        free(r.body);
    }

    /* /tokenize in vLLM's form ({"prompt"}); TGI's form ({"inputs"}) unchanged */
    static const struct { const char *body; int status; const char *want; } tk[] = {
        {"{\"prompt\":\"hey\"}", 200, "{\"count\":3,\"max_model_len\":200,\"tokens\":[108,105,125]}"},
        {"{\"prompt\":\"hey\",\"add_special_tokens\":false,\"return_token_strs\":true,\"model\":\"tgi\"}", 200,
         "{\"count\":3,\"max_model_len\":200,\"tokens\":[108,105,125],\"token_strs\":[\"h\",\"e\",\"y\"]}"},
        {"{\"prompt\":\"\"}", 400, "`prompt` cannot be empty"},
        {"{\"prompt\":3}", 400, "`prompt` must be a string"},
        {"{\"prompt\":\"hey\",\"messages\":[]}", 400, "Unrecognized request argument supplied: messages"},
        {"{\"prompt\":\"hey\",\"model\":\"other\"}", 404, "model_not_found"},
        {"{\"inputs\":\"hey\"}", 200, "[{\"id\":108,\"text\":\"h\",\"start\":0,\"stop\":1},"},
        {"{\"inputs\":\"hey\",\"prompt\":\"x\"}", 200, "[{\"id\":108,"},
    };
    for (size_t i = 0; i < sizeof tk / sizeof tk[0]; i++) {
        r = http(port, "POST", "/tokenize", tk[i].body);
        bool shape = tk[i].status == 200 || strstr(r.body, "{\"error\":{\"message\"");
        CHECK(r.status == tk[i].status && shape && (tk[i].status == 200 ? !strncmp(r.body, tk[i].want, strlen(tk[i].want)) : strstr(r.body, tk[i].want) != NULL),
              "/tokenize %s -> %d %s (%d %s)", tk[i].body, tk[i].status, tk[i].want, r.status, r.body);
        free(r.body);
    }

    /* token ids as prompts: the same answer as the text whose ids they are ('a' = 101, 'b' = 102) */
    static const struct { const char *ids, *text; } same[] = {
        {"[101,102]", "\"ab\""},
        {"[[101,102],[108,105,112,112,115]]", "[\"ab\",\"hello\"]"},
        {"[[101,102],\"hello\"]", "[\"ab\",\"hello\"]"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char b1[256], b2[256];
        snprintf(b1, sizeof b1, "{\"prompt\":%s,\"max_tokens\":4,\"temperature\":0,\"echo\":true}", same[i].ids);
        snprintf(b2, sizeof b2, "{\"prompt\":%s,\"max_tokens\":4,\"temperature\":0,\"echo\":true}", same[i].text);
        resp a = http(port, "POST", "/v1/completions", b1), b = http(port, "POST", "/v1/completions", b2);
        json_t *oa = jparse(a.body), *ob = jparse(b.body);
        json_t *ca = json_object_get(oa, "choices"), *cb = json_object_get(ob, "choices");
        bool eq = a.status == 200 && b.status == 200 && json_array_size(ca) == json_array_size(cb) && json_array_size(ca) > 0;
        for (size_t k = 0; eq && k < json_array_size(ca); k++)
            eq = !strcmp(jstr(json_array_get(ca, k), "text"), jstr(json_array_get(cb, k), "text"));
        eq = eq && json_integer_value(json_object_get(json_object_get(oa, "usage"), "prompt_tokens")) ==
                       json_integer_value(json_object_get(json_object_get(ob, "usage"), "prompt_tokens"));
        CHECK(eq && !strncmp(jstr(json_array_get(ca, 0), "text"), "ab", 2), "prompt %s answers as %s (echo included): %s", same[i].ids,
              same[i].text, a.body);
        json_decref(oa);
        json_decref(ob);
        free(a.body);
        free(b.body);
    }
    static const struct { const char *prompt, *msg; } badp[] = {
        {"[]", "`prompt` cannot be an empty list"},
        {"[[]]", "`prompt[0]` cannot be empty"},
        {"[[101],[]]", "`prompt[1]` cannot be empty"},
        {"[101,999]", "`prompt[1]` is token id 999, outside the vocabulary (ids 0 to 259)"},
        {"[[101],[102,5000]]", "`prompt[1][1]` is token id 5000, outside the vocabulary"},
        {"[101,\"a\"]", "`prompt[1]` must be a token id"},
        {"[-3]", "`prompt[0]` must be a token id"},
        {"[[101,2147483648]]", "`prompt[0][1]` must be a token id"},
        {"[7]", "`prompt[0]`"},   /* fits the vocabulary: answered (checked below) */
        {"[{\"a\":1}]", "`prompt[0]` must be a string or a list of token ids"},
        {"5", "`prompt` must be a string, a list of strings, a list of token ids or a list of lists of token ids"},
    };
    for (size_t i = 0; i < sizeof badp / sizeof badp[0]; i++) {
        char b[256];
        snprintf(b, sizeof b, "{\"prompt\":%s,\"max_tokens\":2}", badp[i].prompt);
        r = http(port, "POST", "/v1/completions", b);
        if (!strcmp(badp[i].prompt, "[7]")) {
            CHECK(r.status == 200, "prompt [7] (a special-range id inside the vocabulary) -> 200 (%d %s)", r.status, r.body);
        } else {
            o = jparse(r.body);
            json_t *e = json_object_get(o, "error");
            CHECK(r.status == 400 && e && strstr(jstr(e, "message"), badp[i].msg) && !strcmp(jstr(e, "param"), "prompt"),
                  "prompt %s -> 400 %s (%d %s)", badp[i].prompt, badp[i].msg, r.status, r.body);
            json_decref(o);
        }
        free(r.body);
    }
}

/* --host localhost, ::1 and [::1] (where the machine has an IPv6 loopback). */
static bool have_ipv6_loopback(void) {
    FILE *f = fopen("/proc/net/if_inet6", "r");
    if (!f) return false;
    char line[256];
    bool lo = false;
    while (fgets(line, sizeof line, f)) lo |= !strncmp(line, "00000000000000000000000000000001", 32);
    fclose(f);
    return lo;
}

static void test_hosts(const pln_serve_limits *lim) {
    static const char *const hosts[] = {"localhost", "::1", "[::1]", "::"};
    bool v6 = have_ipv6_loopback();
    if (!v6) printf("SKIP: --host ::1, [::1] and :: (no IPv6 loopback in /proc/net/if_inet6)\n");
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        bool needs6 = strchr(hosts[i], ':') != NULL;
        if (needs6 && !v6) continue;
        g_host = hosts[i];
        g_no_log = true;
        inst H;
        inst_start(&H, lim, 0, 0);
        g_host = "127.0.0.1";
        g_no_log = false;
        resp2 r = needs6 ? http2(AF_INET6, "::1", H.port, "GET", "/health", NULL, NULL)
                         : http2(AF_INET, "127.0.0.1", H.port, "GET", "/health", NULL, NULL);
        CHECK(r.status == 200, "--host %s: /health over %s (%d)", hosts[i], needs6 ? "::1" : "127.0.0.1", r.status);
        resp2_free(&r);
        if (!strcmp(hosts[i], "::")) {   /* every interface: IPv4 too, where the system maps it (Linux's default) */
            r = http2(AF_INET, "127.0.0.1", H.port, "GET", "/health", NULL, NULL);
            CHECK(r.status == 200, "--host ::: /health over 127.0.0.1 too (%d)", r.status);
            resp2_free(&r);
        }
        inst_stop(&H);
    }
}

int main(void) {
    test_begin("test_server");
    signal(SIGPIPE, SIG_IGN);
    pln_serve_limits lim;
    pln_serve_limits_default(&lim);
    lim.max_concurrent_requests = 6;
    lim.max_input_tokens = 64;
    lim.max_total_tokens = 200;
    lim.max_body_bytes = 4096;
    lim.max_batch_tokens = 16;
    lim.default_max_new_tokens = 10;
    inst A;
    FILE *log_a = tmpfile();   /* its request lines, in the default text form */
    g_log = log_a;
    inst_start(&A, &lim, 2000, 0);
    g_log = NULL;
    int port = A.port;
    CHECK(port > 0, "bound port %d", port);

    /* ---- GET routes ---- */
    resp r = http(port, "GET", "/health", NULL);
    CHECK(r.status == 200, "health %d", r.status);
    free(r.body);
    r = http(port, "GET", "/info", NULL);
    json_t *o = jparse(r.body);
    CHECK(r.status == 200 && o && !strcmp(jstr(o, "model_id"), "fake-model-tp1-fp16-set") &&
              json_integer_value(json_object_get(o, "max_concurrent_requests")) == 6 &&
              json_integer_value(json_object_get(o, "max_input_tokens")) == 64 &&
              json_integer_value(json_object_get(o, "max_total_tokens")) == 200 &&
              json_integer_value(json_object_get(o, "max_body_bytes")) == 4096 &&
              json_integer_value(json_object_get(o, "tp")) == 1 && !strcmp(jstr(o, "model_dtype"), "fp16"),
          "info %s", r.body);
    json_decref(o);
    free(r.body);
    r = http(port, "GET", "/v1/models", NULL);
    o = jparse(r.body);
    CHECK(r.status == 200 && !strcmp(jstr(json_array_get(json_object_get(o, "data"), 0), "id"), "fake-model-tp1-fp16-set"), "models %s", r.body);
    json_decref(o);
    free(r.body);
    test_compat(port);
    test_chat(&lim);
    test_chat_jinja(&lim);
    test_never_admitted(&lim);
    test_routes_more(port);
    test_api_key_and_log(&lim);
    test_hosts(&lim);

    /* ---- validation over the wire: status, error shape, message ---- */
    static const struct { const char *path, *body; int status; const char *msg; } bad[] = {
        {"/generate", "{not json", 422, "malformed JSON"},
        {"/generate", "[1,2]", 422, "must be a JSON object"},
        {"/generate", "{\"inputs\":\"\"}", 422, "cannot be empty"},
        {"/generate", "{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":0}}", 422, "strictly positive"},
        {"/generate", "{\"inputs\":\"hi\",\"parameters\":{\"temperature\":-1}}", 422, "strictly positive"},
        {"/generate", "{\"inputs\":\"hi\",\"parameters\":{\"top_p\":\"x\"}}", 422, "must be a number"},
        {"/generate", "{\"inputs\":\"0123456789012345678901234567890123456789012345678901234567890123456789\"}", 422, "--max-input-tokens"},
        {"/generate", "{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":199}}", 422, "--max-total-tokens"},
        {"/generate_stream", "{\"inputs\":\"hi\",\"parameters\":{\"seed\":-1}}", 422, "`seed`"},
        {"/tokenize", "{\"inputs\":7}", 422, "must be a string"},
        {"/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400, "strictly positive"},
        {"/v1/completions", "{\"prompt\":\"hi\",\"model\":\"other\"}", 404, "does not exist"},
        {"/v1/completions", "{oops", 400, "malformed JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(port, "POST", bad[i].path, bad[i].body);
        o = jparse(r.body);
        bool oai = !strncmp(bad[i].path, "/v1/", 4);
        json_t *e = oai ? json_object_get(o, "error") : o;
        const char *msg = e ? jstr(e, oai ? "message" : "error") : NULL;
        const char *typ = e ? jstr(e, oai ? "type" : "error_type") : NULL;
        CHECK(r.status == bad[i].status && msg && strstr(msg, bad[i].msg) && typ, "%s %s -> %d %s", bad[i].path, bad[i].body,
              r.status, r.body);
        json_decref(o);
        free(r.body);
    }
    char *big = malloc(6000);
    memset(big, 'x', 5999);
    big[5999] = 0;
    memcpy(big, "{\"inputs\":\"", 11);
    r = http(port, "POST", "/generate", big);
    CHECK(r.status == 413 && strstr(r.body, "--max-body-bytes"), "oversized body -> %d %s", r.status, r.body);
    free(r.body);
    free(big);
    r = http(port, "GET", "/nope", NULL);
    CHECK(r.status == 404, "unknown route %d", r.status);
    free(r.body);
    r = http(port, "GET", "/generate", NULL);
    CHECK(r.status == 405, "wrong method %d", r.status);
    free(r.body);
    r = http(port, "GET", "/health", NULL);
    CHECK(r.status == 200, "still healthy after bad requests (%d)", r.status);
    free(r.body);

    /* ---- /generate, details, /tokenize ---- */
    r = http(port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":5,\"details\":true}}");
    o = jparse(r.body);
    /* first 'a' (id 101), positions after feeding: 2,3,4,5,6 → letters (101+p)%26 */
    char want[8];
    for (int p = 2; p < 7; p++) want[p - 2] = (char)('a' + (101 + p) % 26);
    want[5] = 0;
    json_t *d = json_object_get(o, "details");
    CHECK(r.status == 200 && !strcmp(jstr(o, "generated_text"), want), "generate text %s want %s", r.body, want);
    CHECK(d && !strcmp(jstr(d, "finish_reason"), "length") && json_integer_value(json_object_get(d, "generated_tokens")) == 5 &&
              json_array_size(json_object_get(d, "tokens")) == 5 && json_is_null(json_object_get(d, "seed")),
          "details %s", r.body);
    json_decref(o);
    free(r.body);
    r = http(port, "POST", "/tokenize", "{\"inputs\":\"hey\"}");
    o = jparse(r.body);
    CHECK(r.status == 200 && json_array_size(o) == 3 && json_integer_value(json_object_get(json_array_get(o, 1), "id")) == 'e' + 4 &&
              json_integer_value(json_object_get(json_array_get(o, 2), "start")) == 2, "tokenize %s", r.body);
    json_decref(o);
    free(r.body);

    /* ---- TGI return_full_text, OpenAI stream_options.include_usage ---- */
    r = http(port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":5,\"return_full_text\":true}}");
    o = jparse(r.body);
    char full_want[16];
    snprintf(full_want, sizeof full_want, "ab%s", want);
    CHECK(o && !strcmp(jstr(o, "generated_text"), full_want), "return_full_text %s want %s", r.body, full_want);
    json_decref(o);
    free(r.body);
    r = http(port, "POST", "/v1/completions", "{\"prompt\":\"ab\",\"max_tokens\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    {
        char *ev[64];
        int nev = sse_events(r.body, ev, 64);
        json_t *u = nev >= 2 ? jparse(ev[nev - 2]) : NULL;
        json_t *us = json_object_get(u, "usage");
        CHECK(nev >= 2 && !strcmp(ev[nev - 1], "[DONE]") && json_array_size(json_object_get(u, "choices")) == 0 &&
                  json_integer_value(json_object_get(us, "completion_tokens")) == 3 &&
                  json_integer_value(json_object_get(us, "prompt_tokens")) == 2, "include_usage chunk");
        json_decref(u);
    }
    free(r.body);

    /* ---- a prompt longer than the step budget (16) is prefilled in chunks ---- */
    r = http(port, "POST", "/generate", "{\"inputs\":\"abxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\",\"parameters\":{\"max_new_tokens\":4}}");
    o = jparse(r.body);
    for (int p = 40; p < 44; p++) want[p - 40] = (char)('a' + (101 + p) % 26);
    want[4] = 0;
    CHECK(r.status == 200 && !strcmp(jstr(o, "generated_text"), want), "chunked prefill text %s want %s", r.body, want);
    CHECK(A.fe.max_tokens_seen <= 16, "no step over --max-batch-tokens (%d)", A.fe.max_tokens_seen);
    json_decref(o);
    free(r.body);

    /* ---- EOS ---- */
    r = http(port, "POST", "/generate", "{\"inputs\":\"!x\",\"parameters\":{\"max_new_tokens\":20,\"details\":true}}");
    o = jparse(r.body);
    d = json_object_get(o, "details");
    CHECK(d && !strcmp(jstr(d, "finish_reason"), "eos_token") && json_integer_value(json_object_get(d, "generated_tokens")) == 4 &&
              strlen(jstr(o, "generated_text")) == 3, "eos %s", r.body);
    json_decref(o);
    free(r.body);

    /* ---- streamed == non-streamed (TGI), UTF-8 split across tokens ---- */
    const char *bodies[] = {"{\"inputs\":\"hello\",\"parameters\":{\"max_new_tokens\":12}}",
                            "{\"inputs\":\"~u\",\"parameters\":{\"max_new_tokens\":12}}",
                            "{\"inputs\":\"~u\",\"parameters\":{\"max_new_tokens\":11}}"};
    for (int b = 0; b < 3; b++) {
        int st;
        char *plain = tgi_text(port, bodies[b], &st);
        char *final;
        int nev;
        json_t *last = NULL;
        char *streamed = tgi_stream_text(port, bodies[b], &final, &nev, &last);
        CHECK(st == 200 && !strcmp(plain, final), "stream final == generate: '%s' vs '%s'", final, plain);
        CHECK(nev == (b == 2 ? 11 : 12), "one event per token (%d)", nev);
        CHECK(last && json_object_get(last, "details") && !json_is_null(json_object_get(last, "details")), "last event has details");
        if (b > 0) {
            /* token texts of split UTF-8 are U+FFFD pieces; the final text is the real characters */
            CHECK(strstr(plain, "\xC3\xA9\xE2\x82\xAC") != NULL, "utf-8 text assembled: %s", plain);
            if (b == 2) CHECK(strstr(plain, "\xEF\xBF\xBD") != NULL, "cut sequence at the end -> U+FFFD");
        } else {
            CHECK(!strcmp(streamed, plain), "token texts concatenate to the text ('%s' vs '%s')", streamed, plain);
        }
        json_decref(last);
        free(plain);
        free(final);
        free(streamed);
    }
    /* OpenAI: deltas concatenate exactly to the non-streamed text, UTF-8 and stop sequences too */
    const char *ob[] = {"{\"prompt\":\"~u\",\"max_tokens\":12,\"temperature\":0",
                        "{\"prompt\":\"ab\",\"max_tokens\":12,\"temperature\":0,\"stop\":[\"gh\"]",
                        "{\"prompt\":\"~u\",\"max_tokens\":12,\"temperature\":0,\"stop\":\"\xE2\x82\xAC\""};
    const char *ob_want[] = {NULL, "zabcdef", "\xC3\xA9"};
    for (int b = 0; b < 3; b++) {
        char body1[256], body2[256], f1[32] = "", f2[32] = "";
        snprintf(body1, sizeof body1, "%s}", ob[b]);
        snprintf(body2, sizeof body2, "%s,\"stream\":true}", ob[b]);
        int st;
        bool done = false;
        char *plain = oai_text(port, body1, &st, f1, sizeof f1);
        char *streamed = oai_stream_text(port, body2, &done, f2, sizeof f2);
        CHECK(st == 200 && !strcmp(plain, streamed), "openai stream == non-stream: '%s' vs '%s'", streamed, plain);
        CHECK(done && !strcmp(f1, f2) && !strcmp(f1, b ? "stop" : "length"), "[DONE] and finish_reason %s/%s", f1, f2);
        if (ob_want[b]) CHECK(!strcmp(plain, ob_want[b]), "stop sequence cut: '%s' want '%s'", plain, ob_want[b]);
        free(plain);
        free(streamed);
    }
    /* TGI keeps the stop sequence */
    r = http(port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":12,\"stop\":[\"gh\"],\"details\":true}}");
    o = jparse(r.body);
    CHECK(!strcmp(jstr(o, "generated_text"), "zabcdefgh") && !strcmp(jstr(json_object_get(o, "details"), "finish_reason"), "stop_sequence"),
          "TGI stop %s", r.body);
    json_decref(o);
    free(r.body);
    /* OpenAI list prompt + usage */
    r = http(port, "POST", "/v1/completions", "{\"prompt\":[\"ab\",\"hello\"],\"max_tokens\":3,\"temperature\":0}");
    o = jparse(r.body);
    json_t *ch = json_object_get(o, "choices");
    json_t *u = json_object_get(o, "usage");
    CHECK(r.status == 200 && json_array_size(ch) == 2 && json_integer_value(json_object_get(json_array_get(ch, 1), "index")) == 1 &&
              json_integer_value(json_object_get(u, "prompt_tokens")) == 7 &&
              json_integer_value(json_object_get(u, "completion_tokens")) == 6 &&
              json_integer_value(json_object_get(u, "total_tokens")) == 13 && !strcmp(jstr(o, "object"), "text_completion"),
          "openai list %s", r.body);
    json_decref(o);
    free(r.body);
    /* sampling with a seed is reproducible and reported */
    r = http(port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":4,\"do_sample\":true,\"seed\":5,\"details\":true}}");
    resp r2 = http(port, "POST", "/generate", "{\"inputs\":\"ab\",\"parameters\":{\"max_new_tokens\":4,\"do_sample\":true,\"seed\":5,\"details\":true}}");
    o = jparse(r.body);
    CHECK(!strcmp(r.body, r2.body) && json_integer_value(json_object_get(json_object_get(o, "details"), "seed")) == 5, "seeded %s", r.body);
    json_decref(o);
    free(r.body);
    free(r2.body);

    /* ---- 4 identical concurrent greedy requests ---- */
    pthread_t th[4];
    par_arg pa[4];
    for (int i = 0; i < 4; i++) {
        pa[i] = (par_arg){port, "{\"inputs\":\"same prompt\",\"parameters\":{\"max_new_tokens\":20}}", NULL, 0};
        pthread_create(&th[i], NULL, par_generate, &pa[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        CHECK(pa[i].status == 200 && strlen(pa[i].text) == 20 && !strcmp(pa[i].text, pa[0].text), "concurrent %d: %s", i, pa[i].text);
    for (int i = 0; i < 4; i++) free(pa[i].text);
    CHECK(A.fe.max_batch_seen >= 2, "requests were batched together (max batch %d)", A.fe.max_batch_seen);

    /* ---- a short request behind long ones finishes before them ---- */
    int lfd[2];
    for (int i = 0; i < 2; i++) lfd[i] = open_stream(port, "{\"inputs\":\"long\",\"parameters\":{\"max_new_tokens\":180}}");
    r = http(port, "POST", "/generate", "{\"inputs\":\"short\",\"parameters\":{\"max_new_tokens\":5}}");
    /* answered while both long ones still run: it did not wait for them (steps, not seconds) */
    double still = metric(port, "pln_running_sequences");
    CHECK(r.status == 200 && still == 2, "short request behind long ones finished while they run (%g running; %.3f s)", still, r.secs);
    free(r.body);

    /* ---- client disconnect mid-stream: slot and KV blocks come back ---- */
    CHECK(metric(port, "pln_running_sequences") == 2, "two long streams running");
    for (int i = 0; i < 2; i++) if (lfd[i] >= 0) close(lfd[i]);
    CHECK(wait_metric(port, "pln_running_sequences", 0, 3.0), "disconnected streams left the batch");
    CHECK(wait_metric(port, "pln_kv_blocks_free", FE_BLOCKS, 3.0), "KV blocks freed after disconnect (%g free)",
          metric(port, "pln_kv_blocks_free"));
    CHECK(metric(port, "pln_kv_blocks_reserved") == 0, "no reservation left");
    CHECK(metric(port, "pln_sequences_finished_total{reason=\"cancelled\"}") == 2, "two cancelled sequences");

    /* ---- overload: more than max_concurrent_requests → 429 at once ---- */
    pthread_mutex_lock(&A.fe.mu);
    A.fe.delay_us = 20000;   /* slow steps: the six streams must still be running below */
    pthread_mutex_unlock(&A.fe.mu);
    int sfd[6];
    const char *busy = "{\"inputs\":\"busy\",\"parameters\":{\"max_new_tokens\":150}}";
    for (int i = 0; i < 6; i++) {
        sfd[i] = connect_to(port);
        send_req(sfd[i], "POST", "/generate_stream", busy, strlen(busy));
    }
    double nrun = 0, nq = 0;
    for (double t1 = pln_now(); pln_now() - t1 < 30.0; usleep(10000)) {
        nq = metric(port, "pln_queue_size");
        nrun = metric(port, "pln_running_sequences");
        if (nq == 4 && nrun == 2) break;
    }
    CHECK(nq == 4 && nrun == 2, "KV cache full: 2 run (39 of 96 blocks each), 4 wait: %g, %g", nrun, nq);
    for (int i = 0; i < 3; i++) {
        r = http(port, "POST", "/generate", "{\"inputs\":\"extra\"}");
        o = jparse(r.body);
        /* at once: answered while the six still hold every place (not queued until one ends) */
        double q = metric(port, "pln_queue_size"), run = metric(port, "pln_running_sequences");
        CHECK(r.status == 429 && !strcmp(jstr(o, "error_type"), "overloaded") && q == 4 && run == 2,
              "extra %d -> %d while 2 run and 4 wait (%g, %g; %.3f s): %s", i, r.status, run, q, r.secs, r.body);
        json_decref(o);
        free(r.body);
    }
    r = http(port, "POST", "/v1/completions", "{\"prompt\":\"extra\"}");
    o = jparse(r.body);
    CHECK(r.status == 429 && json_object_get(o, "error") && !strcmp(jstr(json_object_get(o, "error"), "code"), "rate_limit_exceeded"),
          "openai 429 %s", r.body);
    json_decref(o);
    free(r.body);
    for (int i = 0; i < 6; i++) if (sfd[i] >= 0) close(sfd[i]);
    CHECK(wait_metric(port, "pln_running_sequences", 0, 3.0), "overload streams gone");
    pthread_mutex_lock(&A.fe.mu);
    A.fe.delay_us = 2000;
    pthread_mutex_unlock(&A.fe.mu);
    CHECK(wait_metric(port, "pln_kv_blocks_free", FE_BLOCKS, 3.0), "KV blocks all free");
    CHECK(metric(port, "pln_requests_total{route=\"generate\",outcome=\"overloaded\"}") == 3, "overloaded counted");
    double ttft_count = metric(port, "pln_time_to_first_token_seconds_count");
    CHECK(ttft_count > 10, "TTFT histogram filled (%g)", ttft_count);
    CHECK(metric(port, "pln_generated_tokens_total") > 100, "tokens counted");

    /* ---- draining: in-flight finishes, new requests get 503 ---- */
    par_arg dr = {port, "{\"inputs\":\"drain me\",\"parameters\":{\"max_new_tokens\":60}}", NULL, 0};
    pthread_t dth;
    pthread_create(&dth, NULL, par_generate, &dr);
    double t0 = pln_now();
    while (metric(port, "pln_running_sequences") < 1 && pln_now() - t0 < 30) usleep(5000);
    pln_sched_stop(A.sched);
    r = http(port, "POST", "/generate", "{\"inputs\":\"late\"}");
    CHECK(r.status == 503, "new request while draining -> %d", r.status);
    free(r.body);
    r = http(port, "GET", "/health", NULL);
    CHECK(r.status == 503, "health while draining -> %d", r.status);
    free(r.body);
    pthread_join(dth, NULL);
    CHECK(dr.status == 200 && strlen(dr.text) == 60, "in-flight request finished while draining (%d, %zu chars)", dr.status,
          strlen(dr.text));
    free(dr.text);
    inst_stop(&A);
    {
        /* every request above has its line: the answered, the refused, the cancelled */
        static const char *const want_lines[][3] = {
            {"method=POST path=/generate route=generate status=200 outcome=success tokens_in=2 tokens_out=5 queue_ms=", NULL, NULL},
            {"route=generate status=422 outcome=validation_error tokens_in=0 tokens_out=0 queue_ms=- inference_ms=-", NULL, NULL},
            {"method=GET path=/nope route=not_found status=404", NULL, NULL},
            {"method=GET path=/generate route=generate status=405", NULL, NULL},
            {"route=generate status=413", NULL, NULL},
            {"route=generate status=429 outcome=overloaded", NULL, NULL},
            {"route=generate status=503 outcome=unavailable", NULL, NULL},
            {"route=generate_stream status=200 outcome=cancelled", NULL, NULL},
            {"path=/v1/completions route=completions status=200 outcome=success tokens_in=7 tokens_out=6", NULL, NULL},
        };
        for (size_t i = 0; i < sizeof want_lines / sizeof want_lines[0]; i++) {
            char *line = wait_log_line(log_a, want_lines[i][0], "pollen serve: request id=", "total_ms=");
            CHECK(line != NULL, "text request line with %s", want_lines[i][0]);
            free(line);
        }
        fclose(log_a);
    }

    /* ---- fault injection: step 6 fails ---- */
    inst B;
    inst_start(&B, &lim, 2000, 6);
    int sp = B.port;
    par_arg pb = {sp, "{\"inputs\":\"x\",\"parameters\":{\"max_new_tokens\":30}}", NULL, 0};
    pthread_t bth;
    pthread_create(&bth, NULL, par_generate, &pb);
    char *final;
    int nev;
    json_t *last = NULL;
    char *st_text = tgi_stream_text(sp, "{\"inputs\":\"y\",\"parameters\":{\"max_new_tokens\":30}}", &final, &nev, &last);
    pthread_join(bth, NULL);
    CHECK(last && !strcmp(jstr(last, "error_type") ? jstr(last, "error_type") : "", "generation") && strstr(jstr(last, "error"), "injected"),
          "stream ends with an error event");
    CHECK(pb.status == 424, "non-stream request gets 424 (%d)", pb.status);
    json_decref(last);
    free(final);
    free(st_text);
    free(pb.text);
    r = http(sp, "GET", "/health", NULL);
    CHECK(r.status == 503 && strstr(r.body, "injected"), "health 503 after a failed step: %d %s", r.status, r.body);
    free(r.body);
    CHECK(wait_metric(sp, "pln_kv_blocks_free", FE_BLOCKS, 3.0), "KV memory freed after the fault");
    CHECK(metric(sp, "pln_running_sequences") == 0, "nothing running after the fault");
    r = http(sp, "POST", "/generate", "{\"inputs\":\"after\"}");
    CHECK(r.status == 503, "new request on an unhealthy server -> %d", r.status);
    free(r.body);
    inst_stop(&B);

    /* ---- NaN logits: the sequences of that step fail, the server stays healthy ---- */
    inst N;
    inst_start(&N, &lim, 0, 0);
    int np = N.port;
    pthread_mutex_lock(&N.fe.mu);
    N.fe.nan_at = 3;   /* one request alone: prefill, one decode, then NaN */
    pthread_mutex_unlock(&N.fe.mu);
    r = http(np, "POST", "/generate", "{\"inputs\":\"x\",\"parameters\":{\"max_new_tokens\":30}}");
    CHECK(r.status == 424 && strstr(r.body, "non-finite logits") && strstr(r.body, "\"error_type\":\"generation\""),
          "NaN logits: the non-stream request gets 424 (%d %s)", r.status, r.body);
    free(r.body);
    pthread_mutex_lock(&N.fe.mu);
    N.fe.nan_at = N.fe.step_no + 3;
    pthread_mutex_unlock(&N.fe.mu);
    last = NULL;
    st_text = tgi_stream_text(np, "{\"inputs\":\"y\",\"parameters\":{\"max_new_tokens\":30}}", &final, &nev, &last);
    CHECK(nev == 3 && last && !strcmp(jstr(last, "error_type") ? jstr(last, "error_type") : "", "generation") &&
          strstr(jstr(last, "error"), "non-finite logits"), "NaN logits: two tokens, then an error event (%d events)", nev);
    json_decref(last);
    free(final);
    free(st_text);
    CHECK(metric(np, "pln_requests_total{route=\"generate\",outcome=\"generation_error\"}") == 1 &&
          metric(np, "pln_requests_total{route=\"generate_stream\",outcome=\"generation_error\"}") == 1 &&
          metric(np, "pln_requests_total{route=\"generate\",outcome=\"success\"}") == 0,
          "NaN logits: both requests counted as generation errors");
    CHECK(metric(np, "pln_sequences_finished_total{reason=\"error\"}") == 2, "NaN logits: two sequences finished with an error");
    CHECK(wait_metric(np, "pln_kv_blocks_free", FE_BLOCKS, 3.0), "NaN logits: KV memory freed");
    r = http(np, "GET", "/health", NULL);
    CHECK(r.status == 200, "NaN logits: still healthy (%d)", r.status);
    free(r.body);
    r = http(np, "POST", "/generate", "{\"inputs\":\"after\",\"parameters\":{\"max_new_tokens\":5}}");
    CHECK(r.status == 200 && strstr(r.body, "generated_text"), "NaN logits: the next request is served (%d)", r.status);
    free(r.body);
    inst_stop(&N);

    /* ---- connection limit and idle timeout ---- */
    pln_serve_limits lc = lim;
    lc.max_connections = 2;
    lc.timeout_s = 1;
    inst C;
    inst_start(&C, &lc, 0, 0);
    int idle[2] = {connect_to(C.port), connect_to(C.port)};
    for (t0 = pln_now(); pln_server_client_connections(C.srv) < 2 && pln_now() - t0 < 30;) usleep(5000);   /* both accepted */
    r = http(C.port, "GET", "/health", NULL);
    CHECK(r.status == 0, "a third connection over --max-connections 2 gets no answer (%d)", r.status);
    free(r.body);
    char byte;
    struct timeval tv1 = {30, 0};   /* a hang guard: the server's close ends the read (0), not this (-1) */
    setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv1, sizeof tv1);
    t0 = pln_now();
    ssize_t got = read(idle[0], &byte, 1);
    double idle_s = pln_now() - t0;
    CHECK(got == 0 && idle_s >= 0.9, "idle connection closed by --timeout 1, not before (read %zd after %.2f s)", got, idle_s);
    close(idle[0]);
    close(idle[1]);
    /* the second idle one has timed out as well: the server has let both go */
    for (t0 = pln_now(); pln_server_client_connections(C.srv) > 0 && pln_now() - t0 < 30;) usleep(10000);
    r = http(C.port, "GET", "/health", NULL);
    CHECK(r.status == 200, "served again once idle connections are gone (%d)", r.status);
    free(r.body);
    inst_stop(&C);
    return test_done();
}
