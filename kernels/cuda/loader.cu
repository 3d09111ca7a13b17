/* loader.cu — see loader.cuh. O_DIRECT reads need 4 KiB-aligned offsets, lengths and buffers:
 * reads start at the aligned-down offset and the copy skips the head; the last read may run past
 * the range (or end short at end of file). When the file system refuses O_DIRECT (tmpfs, some
 * network file systems) the same loop runs on buffered reads. */
#include "kernels/cuda/loader.cuh"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LOAD_ALIGN 4096

/* One reader thread's share of a chunk. */
typedef struct {
    int fd;
    char *buf;
    size_t len;
    uint64_t at;
    size_t got;
    int err;          /* errno of a failed read, 0 if none */
} piece;

static void *read_piece(void *arg)
{
    piece *p = (piece *)arg;
    p->got = 0;
    p->err = 0;
    while (p->got < p->len) {
        ssize_t r = pread(p->fd, p->buf + p->got, p->len - p->got, (off_t)(p->at + p->got));
        if (r < 0) {
            if (errno == EINTR) continue;
            p->err = errno;
            break;
        }
        if (r == 0) break;
        p->got += (size_t)r;
    }
    return NULL;
}

/* Reads len bytes at file offset at into buf with up to PLN_LOAD_THREADS threads in parallel
 * (aligned pieces). *got = bytes read contiguously from the start (less at end of file).
 * Returns 0, an errno value on a read error. */
static int parallel_read(int fd, char *buf, size_t len, uint64_t at, size_t *got)
{
    piece ps[PLN_LOAD_THREADS];
    pthread_t th[PLN_LOAD_THREADS];
    bool started[PLN_LOAD_THREADS] = {false};
    size_t per = pln_align_up((len + PLN_LOAD_THREADS - 1) / PLN_LOAD_THREADS, LOAD_ALIGN);
    int n = 0;
    for (size_t o = 0; o < len; o += per, n++) {
        ps[n].fd = fd;
        ps[n].buf = buf + o;
        ps[n].len = len - o < per ? len - o : per;
        ps[n].at = at + o;
        /* small reads stay on this thread */
        started[n] = n > 0 && pthread_create(&th[n], NULL, read_piece, &ps[n]) == 0;
    }
    for (int i = 0; i < n; i++)
        if (!started[i]) read_piece(&ps[i]);
    for (int i = 0; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    *got = 0;
    for (int i = 0; i < n; i++) {
        if (ps[i].err) return ps[i].err;
        *got += ps[i].got;
        if (ps[i].got < ps[i].len) break;   /* end of file */
    }
    return 0;
}

/* Fraction of the range's pages in the page cache (mincore over a temporary mapping); 0 when
 * it cannot tell. */
static double cached_fraction(int fd, uint64_t off, uint64_t n)
{
    uint64_t a = off & ~(uint64_t)(LOAD_ALIGN - 1);
    size_t len = (size_t)(off + n - a);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)a);
    if (m == MAP_FAILED) return 0.0;
    size_t pages = (len + LOAD_ALIGN - 1) / LOAD_ALIGN;
    unsigned char *v = (unsigned char *)malloc(pages);
    double frac = 0.0;
    if (v && mincore(m, len, v) == 0) {
        size_t in = 0;
        for (size_t i = 0; i < pages; i++) in += v[i] & 1;
        frac = (double)in / (double)pages;
    }
    free(v);
    munmap(m, len);
    return frac;
}

int pln_cuda_load_file(pln_cuda_ctx *c, void *dst, const char *path, uint64_t off, uint64_t nbytes, double *rate,
                       void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t n), void *ctx)
{
    double t0 = pln_now();
    if (rate) *rate = 0.0;
    if (nbytes == 0) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
    const char *force = getenv("PLN_LOAD_DIRECT");
    bool direct = force ? atoi(force) != 0 : cached_fraction(fd, off, nbytes) < 0.5;
    if (direct) {
        int dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (dfd >= 0) { close(fd); fd = dfd; } else direct = false;
    }
    if (!direct) posix_fadvise(fd, (off_t)off, (off_t)nbytes, POSIX_FADV_SEQUENTIAL);

    char *buf[2] = {nullptr, nullptr};
    cudaEvent_t done_ev[2] = {nullptr, nullptr};
    int rc = -1;
    const size_t cap = PLN_LOAD_CHUNK + LOAD_ALIGN;
    uint64_t pos = off & ~(uint64_t)(LOAD_ALIGN - 1);   /* next file offset to read */
    uint64_t copied = 0;
    int b = 0;
    cudaError_t e = cudaHostAlloc((void **)&buf[0], cap, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&buf[1], cap, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done_ev[0], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done_ev[1], cudaEventDisableTiming);
    if (pln_cuda_check(e, "pinned load buffers", __FILE__, __LINE__)) goto out;

    while (copied < nbytes) {
        /* The buffer's previous copy must be finished before it is refilled. */
        if (pln_cuda_check(cudaEventSynchronize(done_ev[b]), "cudaEventSynchronize", __FILE__, __LINE__)) goto out;
        {
            uint64_t skip = (off + copied) - pos;           /* head bytes before the range (first read only) */
            uint64_t want = nbytes - copied + skip;
            size_t len = want < PLN_LOAD_CHUNK ? (size_t)pln_align_up(want, LOAD_ALIGN) : PLN_LOAD_CHUNK;
            size_t got = 0;
            int err = parallel_read(fd, buf[b], len, pos, &got);
            if (err == EINVAL && direct) {   /* O_DIRECT opened but refused: go buffered */
                int bfd = open(path, O_RDONLY | O_CLOEXEC);
                if (bfd < 0) { pln_errorf("%s: cannot reopen: %s", path, strerror(errno)); goto out; }
                close(fd);
                fd = bfd;
                direct = false;
                err = parallel_read(fd, buf[b], len, pos, &got);
            }
            if (err) {
                pln_errorf("%s: read at offset %llu: %s", path, (unsigned long long)pos, strerror(err));
                goto out;
            }
            if (got <= skip) {
                pln_errorf("%s: file ends at %llu, before the %llu bytes at offset %llu were read", path,
                           (unsigned long long)(pos + got), (unsigned long long)nbytes, (unsigned long long)off);
                goto out;
            }
            uint64_t n = got - skip;
            if (n > nbytes - copied) n = nbytes - copied;
            e = cudaMemcpyAsync((char *)dst + copied, buf[b] + skip, n, cudaMemcpyHostToDevice, c->stream);
            if (pln_cuda_check(e, "cudaMemcpyAsync", __FILE__, __LINE__)) goto out;
            if (pln_cuda_check(cudaEventRecord(done_ev[b], c->stream), "cudaEventRecord", __FILE__, __LINE__)) goto out;
            /* The DMA only reads the buffer: checksumming it meanwhile overlaps the two. */
            if (on_bytes) on_bytes(ctx, copied, buf[b] + skip, (size_t)n);
            copied += n;
            pos += got;
            b ^= 1;
        }
    }
    if (pln_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__)) goto out;
    rc = 0;
    if (rate) {
        double dt = pln_now() - t0;
        *rate = dt > 0 ? (double)nbytes / dt : 0.0;
    }
out:
    if (rc) {
        cudaStreamSynchronize(c->stream);
        pln_error_context("load %s (%llu bytes at offset %llu, %s reads)", path, (unsigned long long)nbytes,
                          (unsigned long long)off, direct ? "O_DIRECT" : "buffered");
    }
    for (int i = 0; i < 2; i++) {
        if (done_ev[i]) cudaEventDestroy(done_ev[i]);
        if (buf[i]) cudaFreeHost(buf[i]);
    }
    close(fd);
    return rc;
}
