/* test_http_hostile.c — the HTTP server against hostile clients, over raw sockets on loopback:
 *   - the framing decision (httpframe.h) as a table of header fields;
 *   - framing on the wire: ambiguous lengths (two Content-Lengths, Content-Length + Transfer-Encoding, bad
 *     Transfer-Encoding, a header name with a space) get 400 and a close, and the request
 *     smuggled behind them is never answered; over-limit bodies get 413 however they are framed
 *     (Content-Length, chunked, a 2^64-1 chunk followed by 8 MB, an overflowing chunk size,
 *     chunk extensions); garbage request lines get 400 or a prompt close;
 *   - /tokenize is capped by --max-input-tokens (422, TGI error shape) and every body by
 *     --max-body-bytes (413, TGI error shape);
 *   - slow clients: 60 connections sending a header byte every 200 ms, from one address and from
 *     twenty: the per-client limit refuses the surplus at once, the request deadline closes the
 *     rest (with a 408), and /health and /generate from another address answer throughout;
 *   - draining: with an idle keep-alive connection and a half-sent request the server stops at
 *     once; a request in flight completes first.
 * A small deterministic engine stands in for the model (token = byte). Ports are chosen by the
 * kernel; every wait is bounded. */
#include "runtime/httpframe.h"
#include "runtime/scheduler.h"
#include "runtime/server.h"
#include "tests/test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* ---- a tiny engine: every step emits 'a' for each sequence, after delay_us ------------------ */
typedef struct { int delay_us; } tiny_engine;

static int te_step(void *ctx, const pln_step_plan *plan, pln_step_out *out) {
    tiny_engine *e = ctx;
    if (plan->n_seqs == 0) return 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        out[i].token = plan->seqs[i].sample ? 'a' + 4 : -1;
        out[i].logprob = -0.5f;
    }
    if (e->delay_us) usleep((useconds_t)e->delay_us);
    return 0;
}

static void te_info(void *ctx, pln_engine_info *in) {
    memset(in, 0, sizeof *in);
    in->tp = 1;
    in->n_vocab = 260;
    in->hidden = 8;
    in->n_head = 1;
    in->n_layer = 1;
    in->dtype = "fp16";
    in->backend = "test";
    in->kv_blocks_total = 1024;
    in->kv_blocks_free = 1024;
    in->block_size = 16;
    in->max_seqs = 16;
    in->max_seq_len = 1024;
}

static int tt_encode(void *ctx, const char *text, bool add_special, int32_t **ids, int32_t *n) {
    (void)add_special;
    size_t l = strlen(text);
    *ids = malloc(sizeof(int32_t) * (l ? l : 1));
    for (size_t i = 0; i < l; i++) (*ids)[i] = (unsigned char)text[i] + 4;
    *n = (int32_t)l;
    return 0;
}
static char *tt_decode(void *ctx, const int32_t *ids, int32_t n, bool skip, size_t *len) {
    char *o = malloc((size_t)n + 1);
    size_t k = 0;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 4) o[k++] = (char)(ids[i] - 4);
    o[k] = 0;
    *len = k;
    return o;
}
static bool tt_special(void *ctx, int32_t id) { return id < 4; }

typedef struct {
    tiny_engine te;
    pln_sched *sched;
    pln_server *srv;
    pthread_t thr;
    int port;
} inst;

static void *sched_thread(void *a) { pln_sched_run(a); return NULL; }

static void inst_start(inst *in, const pln_serve_limits *lim, int delay_us) {
    memset(in, 0, sizeof *in);
    in->te.delay_us = delay_us;
    pln_sched_engine se = {.ctx = &in->te, .step = te_step, .get_info = te_info};
    pln_sched_tok st = {.ctx = NULL, .encode = tt_encode, .decode = tt_decode, .is_special = tt_special};
    in->sched = pln_sched_create(&se, &st, lim);
    if (!in->sched) { fprintf(stderr, "sched: %s\n", pln_error()); exit(2); }
    pln_server_opts so = {.host = "127.0.0.1", .port = 0, .model_id = "tiny", .lim = *lim};
    in->srv = pln_server_start(&so, in->sched, &st);
    if (!in->srv) { fprintf(stderr, "server: %s\n", pln_error()); exit(2); }
    in->port = pln_server_port(in->srv);
    pthread_create(&in->thr, NULL, sched_thread, in->sched);
}

/* Drains the scheduler, then stops the server; returns the seconds pln_server_stop took. */
static double inst_stop(inst *in, double grace) {
    pln_sched_stop(in->sched);
    pthread_join(in->thr, NULL);
    double t0 = pln_now();
    pln_server_stop(in->srv, grace);
    double dt = pln_now() - t0;
    pln_sched_free(in->sched);
    return dt;
}

/* ---- a raw client: exact bytes out, whatever comes back, bounded in time ------------------- */

/* A connected non-blocking socket to 127.0.0.1:port from source address src (NULL: any). Every
 * address of 127.0.0.0/8 is loopback on Linux, so distinct sources stand for distinct clients. */
static int dial(int port, const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (src) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &b.sin_addr);
        if (bind(fd, (struct sockaddr *)&b, sizeof b)) { close(fd); return -1; }
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

typedef struct {
    int status;          /* of the first response; 0: none */
    int n_responses;     /* status lines seen */
    bool closed;         /* the server closed (EOF or reset) within the wait */
    double secs;         /* until closed, or the wait */
    char *data;          /* everything read, NUL-terminated */
    size_t len;
} raw_result;

static int count_status_lines(const char *d) {
    int n = 0;
    for (const char *p = d; (p = strstr(p, "HTTP/1.")); p++)
        if (p == d || p[-1] == '\n') n++;
    return n;
}

/* Sends req[0..len) (as far as the server lets it) while reading, until the server closes or
 * wait_s passes. */
static raw_result raw_on(int fd, const void *req, size_t len, double wait_s) {
    raw_result r = {0};
    size_t cap = 1 << 16, off = 0;
    r.data = malloc(cap);
    double t0 = pln_now();
    bool can_send = true;
    while (pln_now() - t0 < wait_s) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (can_send && off < len ? POLLOUT : 0)};
        if (poll(&p, 1, 20) < 0) break;
        if (p.revents & POLLOUT) {
            ssize_t w = send(fd, (const char *)req + off, len - off, MSG_NOSIGNAL);
            if (w > 0) off += (size_t)w;
            else if (w < 0 && errno != EAGAIN) can_send = false;
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (r.len + 4096 > cap) r.data = realloc(r.data, cap *= 2);
            ssize_t k = recv(fd, r.data + r.len, cap - r.len - 1, 0);
            if (k > 0) r.len += (size_t)k;
            else if (k == 0 || errno != EAGAIN) { r.closed = true; break; }
        }
    }
    r.secs = pln_now() - t0;
    r.data[r.len] = 0;
    sscanf(r.data, "HTTP/1.%*d %d", &r.status);
    r.n_responses = count_status_lines(r.data);
    return r;
}

static raw_result raw(int port, const char *src, const void *req, size_t len, double wait_s) {
    int fd = dial(port, src);
    if (fd < 0) { raw_result r = {0}; r.data = strdup(""); return r; }
    raw_result r = raw_on(fd, req, len, wait_s);
    close(fd);
    return r;
}

static raw_result raw_str(int port, const char *req, double wait_s) { return raw(port, NULL, req, strlen(req), wait_s); }

static const char *body_of(const raw_result *r) {
    const char *b = strstr(r->data, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* A complete HTTP/1.0 request from src (the server closes after it): status and body. */
static raw_result http_from(int port, const char *src, const char *method, const char *path, const char *body) {
    char *req = pln_xasprintf("%s %s HTTP/1.0\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                              method, path, body ? strlen(body) : 0, body ? body : "");
    raw_result r = raw(port, src, req, strlen(req), 10.0);
    free(req);
    return r;
}

static double metric(int port, const char *name) {
    raw_result r = http_from(port, NULL, "GET", "/metrics", NULL);
    double v = -1;
    size_t nl = strlen(name);
    for (const char *p = body_of(&r); p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, nl) && p[nl] == ' ') { v = atof(p + nl + 1); break; }
    free(r.data);
    return v;
}

/* TGI error shape: {"error": str, "error_type": want_type} */
static bool tgi_error(const char *body, const char *want_type, const char *want_in_msg) {
    json_t *o = json_loads(body, 0, NULL);
    const char *e = json_string_value(json_object_get(o, "error"));
    const char *t = json_string_value(json_object_get(o, "error_type"));
    bool ok = e && t && !strcmp(t, want_type) && (!want_in_msg || strstr(e, want_in_msg));
    json_decref(o);
    return ok;
}

/* ---- framing ------------------------------------------------------------------------------- */

/* The framing decision itself, field by field (the wire tests below go through libmicrohttpd,
 * which settles some cases before it). */
static void test_framing_table(void) {
    static const struct { const char *what; pln_http_field f[3]; size_t n; int status; pln_frame_kind kind; uint64_t len; } t[] = {
        {"no body", {{"Host", "t"}}, 1, 0, PLN_FRAME_NONE, 0},
        {"length", {{"content-length", " 12 "}}, 1, 0, PLN_FRAME_LENGTH, 12},
        {"length 0", {{"Content-Length", "0"}}, 1, 0, PLN_FRAME_NONE, 0},
        {"leading zeros", {{"Content-Length", "0007"}}, 1, 0, PLN_FRAME_LENGTH, 7},
        {"equal duplicates", {{"Content-Length", "5"}, {"CONTENT-LENGTH", "5"}}, 2, 0, PLN_FRAME_LENGTH, 5},
        {"different duplicates", {{"Content-Length", "5"}, {"Content-Length", "50"}}, 2, 400, 0, 0},
        {"list value", {{"Content-Length", "5, 5"}}, 1, 400, 0, 0},
        {"negative", {{"Content-Length", "-1"}}, 1, 400, 0, 0},
        {"plus sign", {{"Content-Length", "+5"}}, 1, 400, 0, 0},
        {"hex", {{"Content-Length", "0x10"}}, 1, 400, 0, 0},
        {"empty", {{"Content-Length", ""}}, 1, 400, 0, 0},
        {"over the limit", {{"Content-Length", "1001"}}, 1, 413, 0, 0},
        {"at the limit", {{"Content-Length", "1000"}}, 1, 0, PLN_FRAME_LENGTH, 1000},
        {"2^64", {{"Content-Length", "18446744073709551616"}}, 1, 413, 0, 0},
        {"2^64 then a smaller one", {{"Content-Length", "18446744073709551616"}, {"Content-Length", "5"}}, 2, 400, 0, 0},
        {"chunked", {{"Transfer-Encoding", "chunked"}}, 1, 0, PLN_FRAME_CHUNKED, 0},
        {"CHUNKED with spaces", {{"transfer-encoding", "\t CHUNKED "}}, 1, 0, PLN_FRAME_CHUNKED, 0},
        {"chunked + length", {{"Transfer-Encoding", "chunked"}, {"Content-Length", "3"}}, 2, 400, 0, 0},
        {"length + chunked", {{"Content-Length", "3"}, {"Transfer-Encoding", "chunked"}}, 2, 400, 0, 0},
        {"gzip, chunked", {{"Transfer-Encoding", "gzip, chunked"}}, 1, 400, 0, 0},
        {"identity", {{"Transfer-Encoding", "identity"}}, 1, 400, 0, 0},
        {"xchunked", {{"Transfer-Encoding", "xchunked"}}, 1, 400, 0, 0},
        {"two fields", {{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}, 2, 400, 0, 0},
        {"space in a name", {{"Content-Length ", "5"}}, 1, 400, 0, 0},
        {"empty name", {{"", "5"}}, 1, 400, 0, 0},
        {"control byte in a name", {{"X-\x01", "5"}}, 1, 400, 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        pln_frame fr;
        pln_req_error err;
        int rc = pln_http_check_framing(t[i].f, t[i].n, 1000, PLN_API_TGI, &fr, &err);
        if (t[i].status == 0)
            CHECK(rc == 0 && fr.kind == t[i].kind && fr.length == t[i].len, "framing %s: rc %d kind %d length %llu (%s)", t[i].what,
                  rc, fr.kind, (unsigned long long)fr.length, rc ? err.message : "");
        else
            CHECK(rc == -1 && err.status == t[i].status && err.message[0], "framing %s: rc %d status %d, want %d", t[i].what, rc,
                  rc ? err.status : 0, t[i].status);
    }
}

static void test_framing(int port) {
    static const struct { const char *what, *req; int status; bool must_close; } cases[] = {
        {"two different Content-Length",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 15\r\nContent-Length: 3\r\n\r\n{\"inputs\":\"hi\"}", 400, true},
        {"Content-Length and Transfer-Encoding",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\n"
         "f\r\n{\"inputs\":\"hi\"}\r\n0\r\n\r\n", 400, true},
        {"Transfer-Encoding gzip", "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n{\"inputs\":\"hi\"}", 400, true},
        {"Transfer-Encoding chunked, chunked",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400, true},
        {"two Transfer-Encoding fields",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n", 400, true},
        {"space before the colon of Content-Length",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length : 15\r\n\r\n{\"inputs\":\"hi\"}", 400, true},
        {"Content-Length not a number", "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n", 400, true},
        {"Content-Length over the limit", "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 70000\r\n\r\n{", 413, true},
        {"Content-Length over 2^64", "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, true},
        {"chunk size over 2^64",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\naaaa", 413, true},
        {"garbage request line with spaces", "hello world foo\r\n\r\n", 400, true},
        {"malformed chunk size", "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, true},
        {"two identical Content-Length (allowed)",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 15\r\nContent-Length: 15\r\n\r\n"
         "{\"inputs\":\"hi\"}", 200, true},
        {"chunked with a chunk extension (allowed)",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5;name=value\r\n{\"inp\r\na\r\nuts\":\"hi\"}\r\n0\r\n\r\n", 200, true},
        {"Transfer-Encoding in another case (allowed)",
         "POST /tokenize HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: Chunked\r\n\r\n"
         "f\r\n{\"inputs\":\"hi\"}\r\n0\r\n\r\n", 200, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        raw_result r = raw_str(port, cases[i].req, 5.0);
        CHECK(r.status == cases[i].status, "%s: status %d, want %d (%.80s)", cases[i].what, r.status, cases[i].status, r.data);
        CHECK(!cases[i].must_close || (r.closed && r.secs < 3.0), "%s: connection closed at once (closed %d after %.2f s)",
              cases[i].what, r.closed, r.secs);
        if (cases[i].status >= 400 && strstr(r.data, "application/json"))
            CHECK(tgi_error(body_of(&r), "validation", NULL), "%s: TGI error body: %s", cases[i].what, body_of(&r));
        free(r.data);
    }

    /* Heads past libmicrohttpd's 32 KiB buffer: refused, not grown. */
    char *longh = malloc(40100);
    int m = sprintf(longh, "GET /health HTTP/1.1\r\nHost: t\r\nX-A: ");
    memset(longh + m, 'a', 40000);
    strcpy(longh + m + 40000, "\r\n\r\n");
    raw_result lr = raw_str(port, longh, 5.0);
    CHECK(lr.status == 431 && lr.closed, "a 40 KB header field: 431 and closed (%d, closed %d)", lr.status, lr.closed);
    free(lr.data);
    m = sprintf(longh, "GET /");
    memset(longh + m, 'a', 40000);
    strcpy(longh + m + 40000, " HTTP/1.1\r\nHost: t\r\n\r\n");
    lr = raw_str(port, longh, 5.0);
    CHECK(lr.status == 414 && lr.closed, "a 40 KB URI: 414 and closed (%d, closed %d)", lr.status, lr.closed);
    free(lr.data);
    free(longh);

    /* Smuggling: the bytes behind an ambiguous head must never be read as a second request. The
     * first Content-Length (5) would end the body early and leave "GET /health ..." as the next
     * request to a server that believed it. */
    const char *smuggle = "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 43\r\n\r\n"
                          "{\"a\":GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    raw_result r = raw_str(port, smuggle, 3.0);
    CHECK(r.status == 400 && r.n_responses == 1 && r.closed, "smuggled request not answered (status %d, %d responses, closed %d)",
          r.status, r.n_responses, r.closed);
    free(r.data);
    smuggle = "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
              "0\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    r = raw_str(port, smuggle, 3.0);
    CHECK(r.status == 400 && r.n_responses == 1 && r.closed, "TE+CL smuggle: status %d, %d responses, closed %d", r.status,
          r.n_responses, r.closed);
    free(r.data);

    /* Over-limit bodies whose length is known only as they arrive. The limit here is 64 KiB. */
    const char *head = "POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    size_t big = 8u << 20;
    char *buf = malloc(strlen(head) + 64 + big);
    int n = sprintf(buf, "%sffffffffffffffff\r\n", head);
    memset(buf + n, 'a', big);
    r = raw(port, NULL, buf, (size_t)n + big, 8.0);
    CHECK(r.status == 413 && r.closed && r.secs < 5.0, "chunk of 2^64-1 then 8 MB: 413 and closed (status %d, closed %d, %.2f s)",
          r.status, r.closed, r.secs);
    CHECK(tgi_error(body_of(&r), "validation", "--max-body-bytes"), "413 body in TGI shape: %s", body_of(&r));
    free(r.data);
    n = sprintf(buf, "%s", head);
    for (int k = 0; k < 40; k++) {   /* 40 chunks of 4 KiB with extensions: 160 KiB */
        n += sprintf(buf + n, "1000;k=%d\r\n", k);
        memset(buf + n, 'b', 4096);
        n += 4096;
        n += sprintf(buf + n, "\r\n");
    }
    n += sprintf(buf + n, "0\r\n\r\n");
    r = raw(port, NULL, buf, (size_t)n, 8.0);
    CHECK(r.status == 413 && r.closed, "160 KiB in small chunks with extensions: 413 and closed (status %d, closed %d)", r.status, r.closed);
    free(r.data);
    free(buf);

    /* Garbage: answered 400 or closed at once when a line ends; a line that never ends is closed
     * by the request deadline (2 s here), not held for the 60 s idle timeout. */
    r = raw_str(port, "GARBAGE\r\n\r\n", 5.0);
    CHECK(r.closed && r.secs < 1.5 && (r.status == 0 || r.status == 400), "garbage word: closed at once (%.2f s, status %d)",
          r.secs, r.status);
    free(r.data);
    r = raw_str(port, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 8.0);
    CHECK(r.closed && r.secs < 4.0, "binary garbage without a line end: closed by the deadline (closed %d after %.2f s)", r.closed,
          r.secs);
    free(r.data);

    /* The server still serves after all of it. */
    r = http_from(port, NULL, "POST", "/tokenize", "{\"inputs\":\"ok\"}");
    CHECK(r.status == 200, "served after the hostile requests (%d)", r.status);
    free(r.data);
}

/* ---- /tokenize and body caps ---------------------------------------------------------------- */

static void test_caps(int port) {
    size_t nin = 5000;
    char *text = malloc(nin + 32);
    int k = sprintf(text, "{\"inputs\":\"");
    memset(text + k, 'x', nin);
    strcpy(text + k + nin, "\"}");
    raw_result r = http_from(port, NULL, "POST", "/tokenize", text);
    CHECK(r.status == 422 && tgi_error(body_of(&r), "validation", "--max-input-tokens"),
          "/tokenize of 5000 tokens over --max-input-tokens 64: 422 (%d %s)", r.status, body_of(&r));
    CHECK(r.len < 1024, "the refusal is small (%zu bytes)", r.len);
    free(r.data);
    free(text);
    r = http_from(port, NULL, "POST", "/tokenize", "{\"inputs\":\"0123456789012345678901234567890123456789012345678901234567890123\"}");
    json_t *arr = json_loads(body_of(&r), 0, NULL);
    CHECK(r.status == 200 && json_array_size(arr) == 64, "/tokenize of exactly 64 tokens: 200 with 64 entries (%d)", r.status);
    json_decref(arr);
    free(r.data);

    /* Every route's body is capped, GET ones included. */
    char *huge = malloc(70001);
    memset(huge, ' ', 70000);
    huge[70000] = 0;
    static const char *const routes[][2] = {{"POST", "/tokenize"}, {"POST", "/generate"}, {"POST", "/v1/completions"},
                                            {"GET", "/health"}, {"POST", "/nowhere"}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        r = http_from(port, NULL, routes[i][0], routes[i][1], huge);
        CHECK(r.status == 413, "%s %s with a 70000-byte body: 413 (%d)", routes[i][0], routes[i][1], r.status);
        free(r.data);
    }
    free(huge);
}

/* ---- slow clients --------------------------------------------------------------------------- */

#define N_SLOW 60
typedef struct {
    int port;
    int fd[N_SLOW];
    const char *src[N_SLOW];
    double opened[N_SLOW], closed_at[N_SLOW];
    bool got_408[N_SLOW];
    double run_s;
} slow_ctx;

/* Each slow client sends a request line and then one header byte every 200 ms, never finishing
 * its head: each byte would reset an idle timeout. */
static void *slow_thread(void *arg) {
    slow_ctx *s = arg;
    static const char line[] = "POST /generate HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    for (int i = 0; i < N_SLOW; i++) {
        s->fd[i] = dial(s->port, s->src[i]);
        s->opened[i] = pln_now();
        s->closed_at[i] = 0;
        if (s->fd[i] >= 0) { ssize_t w = send(s->fd[i], line, sizeof line - 1, MSG_NOSIGNAL); (void)w; }
        else s->closed_at[i] = s->opened[i];
    }
    double t0 = pln_now();
    while (pln_now() - t0 < s->run_s) {
        for (int i = 0; i < N_SLOW; i++) {
            if (s->closed_at[i]) continue;
            char buf[512];
            ssize_t k = recv(s->fd[i], buf, sizeof buf - 1, 0);
            if (k > 0) { buf[k] = 0; if (strstr(buf, " 408 ")) s->got_408[i] = true; }
            if (k == 0 || (k < 0 && errno != EAGAIN) || send(s->fd[i], "a", 1, MSG_NOSIGNAL) < 0) {
                s->closed_at[i] = pln_now();
                continue;
            }
        }
        usleep(200000);
    }
    for (int i = 0; i < N_SLOW; i++) if (s->fd[i] >= 0) close(s->fd[i]);
    return NULL;
}

static void test_slow_clients(const pln_serve_limits *base) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 4 * N_SLOW + 64) {
        printf("SKIP slow clients: the fd limit (%llu) is below %d\n", (unsigned long long)rl.rlim_cur, 4 * N_SLOW + 64);
        return;
    }
    pln_serve_limits lim = *base;
    lim.max_connections = 64;
    lim.max_connections_per_client = 12;
    lim.request_timeout_s = 2;
    inst S;
    inst_start(&S, &lim, 1000);
    static char addrs[20][16];
    slow_ctx sc = {.port = S.port, .run_s = 4.5};
    /* 40 from one address (12 allowed), 20 from addresses of their own */
    for (int i = 0; i < N_SLOW; i++) {
        if (i < 40) sc.src[i] = "127.0.0.1";
        else { snprintf(addrs[i - 40], sizeof addrs[0], "127.0.0.%d", 10 + i - 40); sc.src[i] = addrs[i - 40]; }
    }
    pthread_t th;
    pthread_create(&th, NULL, slow_thread, &sc);
    usleep(300000);
    /* Meanwhile a normal client elsewhere keeps being answered. */
    int health_ok = 0, gen_ok = 0, rounds = 0;
    double worst = 0;
    double t0 = pln_now();
    while (pln_now() - t0 < 3.5) {
        raw_result h = http_from(S.port, "127.0.0.2", "GET", "/health", NULL);
        raw_result g = http_from(S.port, "127.0.0.2", "POST", "/generate", "{\"inputs\":\"x\",\"parameters\":{\"max_new_tokens\":4}}");
        health_ok += h.status == 200;
        gen_ok += g.status == 200 && strstr(g.data, "\"generated_text\":\"aaaa\"");
        if (h.secs > worst) worst = h.secs;
        if (g.secs > worst) worst = g.secs;
        rounds++;
        free(h.data);
        free(g.data);
        usleep(200000);
    }
    pthread_join(th, NULL);
    CHECK(rounds >= 4 && health_ok == rounds && gen_ok == rounds,
          "during the attack /health and /generate answered every time (%d/%d, %d/%d rounds)", health_ok, rounds, gen_ok, rounds);
    CHECK(worst < 2.0, "slowest normal answer during the attack %.2f s (< 2 s)", worst);
    int refused = 0, held = 0, held_ok = 0, with_408 = 0, still_open = 0;
    for (int i = 0; i < N_SLOW; i++) {
        if (!sc.closed_at[i]) { still_open++; continue; }
        double life = sc.closed_at[i] - sc.opened[i];
        if (life < 1.0) { refused += i < 40; continue; }
        held++;
        held_ok += life >= 1.5 && life < 3.5;
        with_408 += sc.got_408[i];
    }
    CHECK(still_open == 0, "every slow connection was closed (%d still open after %.1f s)", still_open, sc.run_s);
    CHECK(refused == 40 - 12, "the per-client limit (12) refused %d of the 40 from one address at once (want 28)", refused);
    CHECK(held == 12 + 20 && held_ok == held, "the %d held ones were closed by the 2 s deadline (%d in [1.5, 3.5) s; want 32)", held,
          held_ok);
    CHECK(with_408 == held, "each got a 408 first (%d of %d)", with_408, held);
    CHECK(metric(S.port, "pln_request_timeouts_total") == held, "pln_request_timeouts_total == %d (%g)", held,
          metric(S.port, "pln_request_timeouts_total"));
    inst_stop(&S, 5.0);
}

/* ---- draining ------------------------------------------------------------------------------- */

typedef struct { int port; raw_result r; } gen_arg;
static void *gen_thread(void *a) {
    gen_arg *g = a;
    g->r = http_from(g->port, NULL, "POST", "/generate", "{\"inputs\":\"x\",\"parameters\":{\"max_new_tokens\":40}}");
    return NULL;
}

static void test_drain(const pln_serve_limits *base) {
    pln_serve_limits l = *base, *lim = &l;
    l.request_timeout_s = 60;   /* longer than the grace: the deadline must not be what ends them */
    inst D;
    inst_start(&D, lim, 0);
    /* an idle keep-alive connection (one request answered) and a request half sent */
    int ka = dial(D.port, NULL);
    raw_result r = raw_on(ka, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n", 33, 1.0);
    CHECK(r.status == 200 && !r.closed, "keep-alive connection answered and left open (%d, closed %d)", r.status, r.closed);
    free(r.data);
    int half = dial(D.port, NULL);
    const char *part = "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"inputs\"";
    ssize_t w = send(half, part, strlen(part), MSG_NOSIGNAL);
    (void)w;
    usleep(200000);
    double dt = inst_stop(&D, 10.0);
    CHECK(dt < 1.0, "stop with an idle keep-alive and a half-sent request took %.2f s (grace 10 s)", dt);
    close(ka);
    close(half);

    /* a request in flight completes, then the server stops */
    inst_start(&D, lim, 20000);
    gen_arg g = {D.port, {0}};
    pthread_t th;
    pthread_create(&th, NULL, gen_thread, &g);
    usleep(150000);
    dt = inst_stop(&D, 10.0);
    pthread_join(th, NULL);
    CHECK(g.r.status == 200 && strstr(g.r.data, "\"generated_text\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""),
          "the request in flight completed while draining (%d)", g.r.status);
    CHECK(dt < 2.0, "and the server stopped right after it (%.2f s)", dt);
    free(g.r.data);
}

int main(void) {
    test_begin("test_http_hostile");
    signal(SIGPIPE, SIG_IGN);
    pln_serve_limits lim;
    pln_serve_limits_default(&lim);
    lim.max_input_tokens = 64;
    lim.max_total_tokens = 200;
    lim.max_body_bytes = 65536;
    lim.request_timeout_s = 2;

    test_framing_table();
    inst A;
    inst_start(&A, &lim, 0);
    test_framing(A.port);
    test_caps(A.port);
    inst_stop(&A, 5.0);

    test_slow_clients(&lim);
    test_drain(&lim);
    return test_done();
}
