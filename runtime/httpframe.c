/* httpframe.c — request body framing from the header fields (see httpframe.h). */
#include "runtime/httpframe.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 §5.6.2 tchar */
static bool is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_token(const char *s) {
    if (!s || !*s) return false;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s)) return false;
    return true;
}

/* The value without optional whitespace around it: [*b, *e). */
static void trim_ows(const char *v, const char **b, const char **e) {
    const char *p = v ? v : "", *q = p + strlen(p);
    while (p < q && (*p == ' ' || *p == '\t')) p++;
    while (q > p && (q[-1] == ' ' || q[-1] == '\t')) q--;
    *b = p;
    *e = q;
}

/* 1*DIGIT. Returns 0 and the value, 1 when it overflows uint64 (a valid but impossible length),
 * -1 when it is not a number at all ("", "-1", "5, 5", "0x10", "+5"). */
static int parse_length(const char *v, uint64_t *out) {
    const char *b, *e;
    trim_ows(v, &b, &e);
    if (b == e) return -1;
    uint64_t x = 0;
    bool over = false;
    for (const char *p = b; p < e; p++) {
        if (*p < '0' || *p > '9') return -1;
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) over = true;
        else x = x * 10 + d;
    }
    *out = x;
    return over ? 1 : 0;
}

int pln_http_check_framing(const pln_http_field *f, size_t n, int64_t max_body, pln_api api, pln_frame *out,
                           pln_req_error *err) {
    memset(out, 0, sizeof *out);
    int n_cl = 0, n_te = 0;
    uint64_t cl = 0;
    bool cl_over = false;
    const char *te = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name = f[i].name ? f[i].name : "";
        if (!is_token(name))
            return pln_req_fail(err, api, 400, NULL,
                                "malformed header field name (%zu bytes): field names are tokens, without spaces "
                                "or control characters", strlen(name));
        if (!strcasecmp(name, "Content-Length")) {
            uint64_t v = 0;
            int rc = parse_length(f[i].value, &v);
            if (rc < 0)
                return pln_req_fail(err, api, 400, NULL, "Content-Length is not a decimal number of bytes");
            if (n_cl && (rc == 1) != cl_over)
                return pln_req_fail(err, api, 400, NULL, "conflicting Content-Length fields");
            if (n_cl && rc == 0 && v != cl)
                return pln_req_fail(err, api, 400, NULL, "conflicting Content-Length fields (%llu and %llu)",
                                    (unsigned long long)cl, (unsigned long long)v);
            cl = v;
            cl_over = rc == 1;
            n_cl++;
        } else if (!strcasecmp(name, "Transfer-Encoding")) {
            te = f[i].value ? f[i].value : "";
            n_te++;
        }
    }
    if (n_te) {
        if (n_cl)
            return pln_req_fail(err, api, 400, NULL, "both Transfer-Encoding and Content-Length: send one of them");
        const char *b, *e;
        trim_ows(te, &b, &e);
        if (n_te > 1 || e - b != 7 || strncasecmp(b, "chunked", 7))
            return pln_req_fail(err, api, 400, NULL, "Transfer-Encoding: only a single `chunked` is supported");
        out->kind = PLN_FRAME_CHUNKED;
        return 0;
    }
    if (!n_cl) return 0;
    if (cl_over || (max_body > 0 && cl > (uint64_t)max_body)) {
        if (cl_over) return pln_req_fail(err, api, 413, NULL, "Content-Length is over 2^64 - 1 bytes");
        return pln_req_fail(err, api, 413, NULL, "request body is %llu bytes; the limit is %lld (--max-body-bytes)",
                            (unsigned long long)cl, (long long)max_body);
    }
    out->kind = cl ? PLN_FRAME_LENGTH : PLN_FRAME_NONE;
    out->length = cl;
    return 0;
}

static int hex_val(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int pln_http_target_control(const char *target) {
    for (const unsigned char *p = (const unsigned char *)(target ? target : ""); *p; p++) {
        unsigned c = *p;
        if (c == '%' && hex_val(p[1]) >= 0 && hex_val(p[2]) >= 0) {
            c = (unsigned)(hex_val(p[1]) * 16 + hex_val(p[2]));
            p += 2;
        }
        if (c < 0x20 || c == 0x7f) return (int)c;
    }
    return -1;
}
