/* httpframe.h — how a request's body is framed, decided from its header fields before a byte of
 * the body is read. A pure function (no I/O, no globals) so the fuzz target and the tests call
 * exactly what the server calls.
 *
 * The rules are those of RFC 9112 §6 as the careful proxies apply them (nginx, HAProxy): every
 * request whose length two parsers could read differently is refused, because a proxy in front
 * and pollen behind it would then disagree on where the next request starts (request smuggling).
 *   - header names are tokens: "Content-Length : 5" is not a Content-Length, and no parser may
 *     be left to guess whether it is;
 *   - Content-Length is 1 to 18 decimal digits; several Content-Length fields must agree;
 *   - Transfer-Encoding is accepted only as exactly `chunked` (one field, any case) and never
 *     together with Content-Length;
 *   - a declared length over the body limit is refused before the body is read.
 * Bodies that turn out too long while they arrive (chunked) are the server's to stop. */
#ifndef PLN_HTTPFRAME_H
#define PLN_HTTPFRAME_H

#include "runtime/httpreq.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;
    const char *value;
} pln_http_field;

typedef enum {
    PLN_FRAME_NONE = 0,        /* no body */
    PLN_FRAME_LENGTH = 1,      /* Content-Length bytes */
    PLN_FRAME_CHUNKED = 2,     /* chunked; the length is known only at the end */
} pln_frame_kind;

typedef struct {
    pln_frame_kind kind;
    uint64_t length;           /* PLN_FRAME_LENGTH: the declared length */
} pln_frame;

/* Checks the n header fields of one request. max_body <= 0 means no limit. Returns 0 and fills
 * *out, or -1 with *err: 400 for ambiguous or malformed framing (the connection must then be
 * closed, since where the next request starts is unknown), 413 for a declared length over
 * max_body. api picks the error body's shape. Never fails otherwise. */
int pln_http_check_framing(const pln_http_field *f, size_t n, int64_t max_body, pln_api api, pln_frame *out,
                           pln_req_error *err);

/* The first control byte (0x00-0x1f, 0x7f) in a raw request target, raw or percent-encoded
 * ("%00", "%0a", "%7F"), as 0..127; -1 when there is none. libmicrohttpd decodes the target into
 * a C string, so "/generate%00x" would reach the routes as "/generate": the server refuses any
 * target with a control byte (400) before it routes it. */
int pln_http_target_control(const char *target);

#endif
