/* loadgen.c — a small load generator for `pollen serve` (built by tools/bench/serve.sh with cc):
 * N client threads each send streaming /generate_stream requests back to back over loopback for
 * a bounded time, read the server-sent events as they arrive, and report throughput (generated
 * tokens/s), time to first token and time per output token (p50/p99) and failed requests.
 *
 *   loadgen --port P [--clients N] [--duration S] [--max-new-tokens M] [--prompt TEXT] [--label L]
 *   loadgen --port P --short-behind-long LONG_TOKENS SHORT_TOKENS
 * Prints one line of JSON per run. No dependencies beyond libc and pthreads. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int g_port = 8080, g_clients = 1, g_max_new = 32;
static double g_duration = 10;
static const char *g_prompt = "The history of the bloom";
static const char *g_label = "";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct { double ttft, tpot, total; int tokens; int ok; } result;

/* One streaming request; returns its timings (ok = 0 on any failure). */
static result one_request(int max_new) {
    result r = {0, 0, 0, 0, 0};
    double t0 = now();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {600, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return r; }
    char body[1024], req[1400];
    int bl = snprintf(body, sizeof body, "{\"inputs\":\"%s\",\"parameters\":{\"max_new_tokens\":%d}}", g_prompt, max_new);
    int rl = snprintf(req, sizeof req, "POST /generate_stream HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s", bl, body);
    if (write(fd, req, (size_t)rl) != rl) { close(fd); return r; }
    static __thread char buf[1 << 16];
    size_t len = 0;
    int events = 0, status = 0;
    double t_first = 0, t_last = 0;
    bool done = false, err = false;
    for (;;) {
        ssize_t k = read(fd, buf + len, sizeof buf - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
        buf[len] = 0;
        if (!status) sscanf(buf, "HTTP/1.%*d %d", &status);
        /* count complete events, keep the unfinished tail */
        char *p = buf, *e;
        while ((e = strstr(p, "\n\n"))) {
            *e = 0;   /* one event at a time */
            char *d = strstr(p, "data: ");
            if (d) {
                double t = now();
                if (strstr(d, "\"error\"")) err = true;
                else {
                    events++;
                    if (!t_first) t_first = t;
                    t_last = t;
                    if (strstr(d, "\"generated_text\":\"")) done = true;
                }
            }
            p = e + 2;
        }
        size_t rest = len - (size_t)(p - buf);
        memmove(buf, p, rest);
        len = rest;
    }
    close(fd);
    r.ok = status == 200 && done && !err;
    r.tokens = events;
    r.ttft = t_first ? t_first - t0 : 0;
    r.tpot = events > 1 ? (t_last - t_first) / (events - 1) : 0;
    r.total = now() - t0;
    return r;
}

typedef struct { result *res; int n, cap; double deadline; } client;

static void *client_main(void *arg) {
    client *c = arg;
    while (now() < c->deadline) {
        result r = one_request(g_max_new);
        if (c->n == c->cap) { c->cap = c->cap ? 2 * c->cap : 64; c->res = realloc(c->res, sizeof *c->res * (size_t)c->cap); }
        c->res[c->n++] = r;
        if (!r.ok) usleep(10000);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(double *v, int n, double p) {
    if (!n) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void *long_thread(void *arg) { *(result *)arg = one_request(g_max_new); return NULL; }

int main(int argc, char **argv) {
    int long_tok = 0, short_tok = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc) g_port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc) g_clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--duration") && i + 1 < argc) g_duration = atof(argv[++i]);
        else if (!strcmp(argv[i], "--max-new-tokens") && i + 1 < argc) g_max_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) g_prompt = argv[++i];
        else if (!strcmp(argv[i], "--label") && i + 1 < argc) g_label = argv[++i];
        else if (!strcmp(argv[i], "--short-behind-long") && i + 2 < argc) { long_tok = atoi(argv[++i]); short_tok = atoi(argv[++i]); }
        else { fprintf(stderr, "loadgen: unknown argument %s\n", argv[i]); return 2; }
    }
    if (g_clients < 1 || g_clients > 4096) { fprintf(stderr, "loadgen: --clients 1..4096\n"); return 2; }
    if (long_tok) {
        /* the short request alone, then behind a long one that started first */
        result alone = one_request(short_tok);
        result lr;
        g_max_new = long_tok;
        pthread_t th;
        double t0 = now();
        pthread_create(&th, NULL, long_thread, &lr);
        usleep(1500000);   /* the long one is decoding by now */
        result behind = one_request(short_tok);
        double short_done = now() - t0;
        pthread_join(th, NULL);
        printf("{\"label\":\"%s\",\"short_tokens\":%d,\"long_tokens\":%d,\"short_alone_s\":%.3f,\"short_behind_long_s\":%.3f,"
               "\"short_finished_at_s\":%.3f,\"long_total_s\":%.3f,\"ok\":%d}\n", g_label, short_tok, long_tok, alone.total,
               behind.total, short_done, lr.total, alone.ok && behind.ok && lr.ok);
        return alone.ok && behind.ok && lr.ok ? 0 : 1;
    }
    client *cs = calloc((size_t)g_clients, sizeof *cs);
    pthread_t *th = calloc((size_t)g_clients, sizeof *th);
    double t0 = now();
    for (int i = 0; i < g_clients; i++) {
        cs[i].deadline = t0 + g_duration;
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    for (int i = 0; i < g_clients; i++) pthread_join(th[i], NULL);
    double wall = now() - t0;
    int n = 0, ok = 0, failed = 0;
    long tokens = 0;
    for (int i = 0; i < g_clients; i++) n += cs[i].n;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot);
    int nt = 0;
    for (int i = 0; i < g_clients; i++)
        for (int k = 0; k < cs[i].n; k++) {
            result *r = &cs[i].res[k];
            tokens += r->tokens;
            if (!r->ok) { failed++; continue; }
            ok++;
            ttft[nt] = r->ttft;
            tpot[nt++] = r->tpot;
        }
    double p50t = pct(ttft, nt, 0.5), p99t = pct(ttft, nt, 0.99);
    double p50p = pct(tpot, nt, 0.5), p99p = pct(tpot, nt, 0.99);
    printf("{\"label\":\"%s\",\"clients\":%d,\"duration_s\":%.1f,\"wall_s\":%.2f,\"requests\":%d,\"failed\":%d,\"tokens\":%ld,"
           "\"tokens_per_s\":%.2f,\"ttft_p50_s\":%.3f,\"ttft_p99_s\":%.3f,\"tpot_p50_s\":%.4f,\"tpot_p99_s\":%.4f}\n",
           g_label, g_clients, g_duration, wall, ok + failed, failed, tokens, tokens / wall, p50t, p99t, p50p, p99p);
    return failed ? 1 : 0;
}
