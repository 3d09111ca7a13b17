/* stream.h — reads a byte range of a file at disk speed into two staging buffers that a consumer
 * drains while the next one fills (the CUDA loader copies each to the device). Reads are large,
 * split over several threads, and use O_DIRECT when the range is not already in the page cache
 * (no double copy, no page-cache pollution with tens of GB of weights); buffered when it is.
 *
 * O_DIRECT needs 4 KiB-aligned offsets, lengths and buffers: reads start at the aligned-down
 * offset and the consumer is handed only the range's bytes. A file system that refuses O_DIRECT
 * (at open or at the first read) gets the same loop on buffered reads. */
#ifndef PLN_STREAM_H
#define PLN_STREAM_H

#include "formats/common.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PLN_STREAM_ALIGN 4096

typedef struct {
    /* Two staging buffers of at least chunk + PLN_STREAM_ALIGN bytes each (the caller allocates
     * them: pinned memory for a GPU copy, say); PLN_STREAM_ALIGN-aligned for O_DIRECT, which is
     * not used when they are not. */
    void *buf[2];
    size_t chunk;               /* bytes read per fill (a multiple of PLN_STREAM_ALIGN) */
    int threads;                /* reader threads per fill (1..16) */
    int direct;                 /* -1: O_DIRECT when less than half the range is cached; 0/1 force */
    /* Before buffer b is refilled: wait until its previous consumer is done with it. */
    int (*wait)(void *ctx, int b);
    /* Piece [at, at + n) of the range (at counted from the range's start) is in p, inside buffer
     * b; the consumer may start an asynchronous copy and return. Pieces arrive in order. */
    int (*put)(void *ctx, int b, uint64_t at, const void *p, size_t n);
    void *ctx;
} pln_stream_opts;

typedef struct {
    double seconds;             /* wall time of the whole call */
    bool used_direct;           /* O_DIRECT reads were used (to the end) */
    int pieces;                 /* calls to put */
} pln_stream_stats;

/* Streams nbytes at offset off of path through the buffers. 0, or -1 with an error naming the
 * file and the offset (a short file, a read error, a consumer's failure). */
int pln_stream_file(const char *path, uint64_t off, uint64_t nbytes, const pln_stream_opts *o,
                    pln_stream_stats *st);

/* Fraction of [off, off + n) of the open file fd in the page cache (0 when it cannot tell). */
double pln_stream_cached_fraction(int fd, uint64_t off, uint64_t n);

#endif
