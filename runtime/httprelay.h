/* httprelay.h — the bytes between a client and libmicrohttpd, watched for the one framing error
 * libmicrohttpd 0.9.x cannot answer with a 4xx.
 *
 * libmicrohttpd 0.9.75 reads a chunk-size line (size, extensions) into its connection buffer and
 * answers 500 from inside its read loop when the line does not fit: no application code runs in
 * between (1.0 answers 413). So the server accepts connections itself and hands libmicrohttpd one
 * end of a socket pair; a relay thread per connection copies the bytes both ways unchanged and
 * follows the request framing just far enough to measure each chunk-size line. A line longer than
 * PLN_RELAY_MAX_CHUNK_LINE gets a 413 in the API's error shape and the connection is closed.
 * Everything else (bad sizes, bad heads, ambiguous framing) is left to libmicrohttpd and to
 * httpframe.c, which answer it with 4xx themselves. */
#ifndef PLN_HTTPRELAY_H
#define PLN_HTTPRELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest chunk-size line (size, extensions, CRLF) relayed; libmicrohttpd's buffer holds
 * about 16 KiB of a line at 32 KiB per connection. */
#define PLN_RELAY_MAX_CHUNK_LINE 4096

/* The framing follower, a pure function of the bytes (tests feed it directly). */
typedef enum {
    PLN_SCAN_HEAD, PLN_SCAN_BODY, PLN_SCAN_CHUNK_LINE, PLN_SCAN_CHUNK_DATA, PLN_SCAN_CHUNK_END,
    PLN_SCAN_TRAILER, PLN_SCAN_PASS
} pln_scan_state;

typedef struct {
    pln_scan_state st;
    char head[40960];         /* the current head (libmicrohttpd refuses longer ones: 431) */
    size_t head_len;          /* bytes of the head seen (may exceed sizeof head) */
    int head_nl;              /* consecutive line ends at the end of the head so far */
    uint64_t left;            /* BODY / CHUNK_DATA: bytes still to pass */
    size_t line_len;          /* CHUNK_LINE / TRAILER: bytes of the current line */
    uint64_t chunk;           /* CHUNK_LINE: the size read so far */
    bool in_ext;              /* CHUNK_LINE: past the size (extensions, spaces) */
    bool digits;              /* CHUNK_LINE: a hex digit was seen */
    bool openai;              /* the current request's target starts with /v1/ */
} pln_scan;

void pln_scan_init(pln_scan *s);
/* Follows n more client bytes. Returns 0, or 1 when a chunk-size line is longer than
 * PLN_RELAY_MAX_CHUNK_LINE (the request must be refused). Anything it cannot follow (a head it
 * does not understand, a malformed chunk) switches it to PASS: libmicrohttpd answers those. */
int pln_scan_feed(pln_scan *s, const char *p, size_t n);

/* Relays client_fd <-> mhd_fd on a detached thread until either side ends; closes both. -1 when
 * the thread cannot start (both are then closed). */
int pln_relay_start(int client_fd, int mhd_fd);
/* Relay threads still running (process-wide): a server that stops waits for its own to end. */
int pln_relay_live(void);

#endif
