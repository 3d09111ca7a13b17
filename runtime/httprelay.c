/* httprelay.c — a client connection relayed to libmicrohttpd, chunk-size lines measured on the
 * way (see httprelay.h). */
#include "runtime/httprelay.h"
#include "runtime/httpreq.h"
#include "formats/common.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- following the framing ---------------------------------------------------------------- */

void pln_scan_init(pln_scan *s) {
    memset(s, 0, sizeof *s);
    s->st = PLN_SCAN_HEAD;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The value of header field name in the head (the first one; NULL if absent), its length in *len;
 * *count gets how many there are. */
static const char *field(const pln_scan *s, const char *name, size_t *len, int *count) {
    const char *h = s->head, *end = s->head + s->head_len;
    const char *found = NULL;
    size_t nl = strlen(name);
    *count = 0;
    const char *line = memchr(h, '\n', (size_t)(end - h));   /* skip the request line */
    while (line && line < end) {
        line++;
        const char *e = memchr(line, '\n', (size_t)(end - line));
        if (!e) break;
        if ((size_t)(e - line) > nl && !strncasecmp(line, name, nl) && line[nl] == ':') {
            if (!found) {
                const char *v = line + nl + 1, *ve = e;
                while (v < ve && (*v == ' ' || *v == '\t')) v++;
                while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
                found = v;
                *len = (size_t)(ve - v);
            }
            (*count)++;
        }
        line = e;
    }
    return found;
}

/* A whole head has arrived: where its body goes. */
static void head_done(pln_scan *s) {
    const char *sp = memchr(s->head, ' ', s->head_len);
    s->openai = sp && s->head_len - (size_t)(sp + 1 - s->head) >= 4 && !strncmp(sp + 1, "/v1/", 4);
    size_t tl = 0, cl = 0;
    int nte, ncl;
    const char *te = field(s, "transfer-encoding", &tl, &nte);
    const char *clv = field(s, "content-length", &cl, &ncl);
    s->head_len = 0;
    s->head_nl = 0;
    if (nte) {   /* only a single `chunked` is served (httpframe.c answers the rest, 400) */
        s->st = nte == 1 && !ncl && tl == 7 && !strncasecmp(te, "chunked", 7) ? PLN_SCAN_CHUNK_LINE : PLN_SCAN_PASS;
        s->line_len = 0;
        s->chunk = 0;
        s->in_ext = s->digits = false;
        return;
    }
    if (!ncl) { s->st = PLN_SCAN_HEAD; return; }
    uint64_t v = 0;
    bool ok = ncl == 1 && cl > 0 && cl <= 18;
    for (size_t i = 0; ok && i < cl; i++) {
        if (clv[i] < '0' || clv[i] > '9') ok = false;
        else v = v * 10 + (uint64_t)(clv[i] - '0');
    }
    if (!ok) { s->st = PLN_SCAN_PASS; return; }   /* httpframe.c answers it */
    s->left = v;
    s->st = v ? PLN_SCAN_BODY : PLN_SCAN_HEAD;
}

int pln_scan_feed(pln_scan *s, const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        switch (s->st) {
        case PLN_SCAN_PASS:
            return 0;
        case PLN_SCAN_HEAD:
            if (s->head_len == 0 && (c == '\r' || c == '\n')) { i++; break; }   /* line ends before a request line */
            if (s->head_len >= sizeof s->head) { s->st = PLN_SCAN_PASS; return 0; }   /* libmicrohttpd answers 431 */
            s->head[s->head_len++] = c;
            if (c == '\n') s->head_nl++;
            else if (c != '\r') s->head_nl = 0;
            i++;
            if (s->head_nl == 2) head_done(s);
            break;
        case PLN_SCAN_BODY: {
            uint64_t k = n - i < s->left ? n - i : s->left;
            i += (size_t)k;
            s->left -= k;
            if (!s->left) s->st = PLN_SCAN_HEAD;
            break;
        }
        case PLN_SCAN_CHUNK_LINE:
            i++;
            if (++s->line_len > PLN_RELAY_MAX_CHUNK_LINE) return 1;
            if (c == '\n') {
                if (!s->digits) { s->st = PLN_SCAN_PASS; return 0; }   /* libmicrohttpd answers 400 */
                s->line_len = 0;
                if (s->chunk == 0) s->st = PLN_SCAN_TRAILER;
                else { s->left = s->chunk; s->st = PLN_SCAN_CHUNK_DATA; }
            } else if (c == '\r') {
            } else if (!s->in_ext && hexval(c) >= 0) {
                if (s->chunk >> 60) { s->st = PLN_SCAN_PASS; return 0; }   /* over 2^64: 413 there */
                s->chunk = s->chunk * 16 + (uint64_t)hexval(c);
                s->digits = true;
            } else if (c == ';' || c == ' ' || c == '\t') {
                s->in_ext = true;
            } else if (!s->in_ext) {
                s->st = PLN_SCAN_PASS;   /* not a size: 400 there */
                return 0;
            }
            break;
        case PLN_SCAN_CHUNK_DATA: {
            uint64_t k = n - i < s->left ? n - i : s->left;
            i += (size_t)k;
            s->left -= k;
            if (!s->left) s->st = PLN_SCAN_CHUNK_END;
            break;
        }
        case PLN_SCAN_CHUNK_END:
            i++;
            if (c == '\n') { s->st = PLN_SCAN_CHUNK_LINE; s->line_len = 0; s->chunk = 0; s->in_ext = s->digits = false; }
            else if (c != '\r') { s->st = PLN_SCAN_PASS; return 0; }
            break;
        case PLN_SCAN_TRAILER:
            i++;
            if (c == '\n') {
                if (s->line_len == 0) { s->st = PLN_SCAN_HEAD; s->head_len = 0; s->head_nl = 0; }
                s->line_len = 0;
            } else if (c != '\r') {
                s->line_len++;
            }
            break;
        }
    }
    return 0;
}

/* ---- the relay ------------------------------------------------------------------------------ */

static atomic_int g_live;   /* relay threads running */

#define RELAY_BUF 16384
typedef struct {
    int cfd, mfd;                     /* the client's socket, libmicrohttpd's end of the pair */
    char up[RELAY_BUF], down[RELAY_BUF];
    size_t up_off, up_len, down_off, down_len;
    pln_scan scan;
} relay;

/* The 413 for an over-long chunk-size line, in the API's shape, then the end of the connection. */
static void refuse(relay *r) {
    pln_req_error err;
    pln_api api = r->scan.openai ? PLN_API_OPENAI : PLN_API_TGI;
    pln_req_fail(&err, api, 413, NULL, "a chunk-size line (size and extensions) is over %d bytes", PLN_RELAY_MAX_CHUNK_LINE);
    char *body = pln_req_error_json(api, &err);
    char *msg = pln_xasprintf("HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                              "Connection: close\r\n\r\n%s", strlen(body), body);
    int fl = fcntl(r->cfd, F_GETFL);
    if (fl >= 0) fcntl(r->cfd, F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv = {5, 0};   /* a client that does not read gets no more than this */
    setsockopt(r->cfd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    ssize_t w = send(r->cfd, msg, strlen(msg), MSG_NOSIGNAL);
    (void)w;
    shutdown(r->cfd, SHUT_WR);
    free(msg);
    free(body);
    /* a lingering close, as for a 413 elsewhere: what still arrives is read and dropped for a
     * moment, so the kernel does not reset the connection before the client has read the answer */
    struct timeval rt = {1, 0};
    setsockopt(r->cfd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
    double t0 = pln_now();
    char sink[4096];
    while (pln_now() - t0 < 1.0 && recv(r->cfd, sink, sizeof sink, 0) > 0) {}
}

static void *relay_thread(void *arg) {
    relay *r = arg;
    bool c_eof = false, m_eof = false, up_shut = false;
    for (;;) {
        if (c_eof && !up_shut && r->up_len == 0) { shutdown(r->mfd, SHUT_WR); up_shut = true; }
        if (m_eof && r->down_len == 0) break;   /* libmicrohttpd is done with the connection */
        struct pollfd p[2] = {{.fd = r->cfd}, {.fd = r->mfd}};
        if (!c_eof && r->up_len == 0) p[0].events |= POLLIN;
        if (r->down_len) p[0].events |= POLLOUT;
        if (!m_eof && r->down_len == 0) p[1].events |= POLLIN;
        if (r->up_len) p[1].events |= POLLOUT;
        /* once libmicrohttpd has closed, a client that does not read its last bytes gets 10 s */
        int pr = poll(p, 2, m_eof ? 10000 : -1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) break;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR) && !c_eof && r->up_len == 0) {
            ssize_t k = recv(r->cfd, r->up, sizeof r->up, 0);
            if (k > 0) {
                if (pln_scan_feed(&r->scan, r->up, (size_t)k)) { refuse(r); break; }
                r->up_off = 0;
                r->up_len = (size_t)k;
            } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
                c_eof = true;
            }
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR) && !m_eof && r->down_len == 0) {
            ssize_t k = recv(r->mfd, r->down, sizeof r->down, 0);
            if (k > 0) { r->down_off = 0; r->down_len = (size_t)k; }
            else if (k == 0 || (errno != EAGAIN && errno != EINTR)) m_eof = true;
        }
        if (r->up_len && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(r->mfd, r->up + r->up_off, r->up_len, MSG_NOSIGNAL);
            if (w > 0) { r->up_off += (size_t)w; r->up_len -= (size_t)w; }
            else if (w < 0 && errno != EAGAIN && errno != EINTR) { r->up_len = 0; c_eof = true; }   /* it closed: drop */
        }
        if (r->down_len && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(r->cfd, r->down + r->down_off, r->down_len, MSG_NOSIGNAL);
            if (w > 0) { r->down_off += (size_t)w; r->down_len -= (size_t)w; }
            else if (w < 0 && errno != EAGAIN && errno != EINTR) break;   /* the client is gone */
        }
    }
    close(r->cfd);
    close(r->mfd);
    free(r);
    atomic_fetch_sub(&g_live, 1);
    return NULL;
}

int pln_relay_live(void) { return atomic_load(&g_live); }

int pln_relay_start(int client_fd, int mhd_fd) {
    relay *r = pln_xcalloc(1, sizeof *r);
    r->cfd = client_fd;
    r->mfd = mhd_fd;
    pln_scan_init(&r->scan);
    fcntl(client_fd, F_SETFL, fcntl(client_fd, F_GETFL) | O_NONBLOCK);
    fcntl(mhd_fd, F_SETFL, fcntl(mhd_fd, F_GETFL) | O_NONBLOCK);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 64 * 1024);
    pthread_t t;
    atomic_fetch_add(&g_live, 1);
    int rc = pthread_create(&t, &a, relay_thread, r);
    pthread_attr_destroy(&a);
    if (rc) {
        atomic_fetch_sub(&g_live, 1);
        close(client_fd);
        close(mhd_fd);
        free(r);
        return pln_errorf("cannot start a connection's relay thread: %s", strerror(rc));
    }
    return 0;
}
