/* stream.c — see stream.h. */
#include "formats/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_THREADS 16

/* One reader thread's share of a fill. */
typedef struct {
    int fd;
    char *buf;
    size_t len;
    uint64_t at;
    size_t got;
    int err;          /* errno of a failed read, 0 if none */
} piece;

static void *read_piece(void *arg) {
    piece *p = arg;
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

/* Reads len bytes at file offset at into buf with up to `threads` threads (aligned pieces).
 * *got = bytes read contiguously from the start (less at end of file). 0, or an errno value. */
static int parallel_read(int fd, char *buf, size_t len, uint64_t at, int threads, size_t *got) {
    piece ps[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    size_t per = (size_t)pln_align_up((len + (size_t)threads - 1) / (size_t)threads, PLN_STREAM_ALIGN);
    int n = 0;
    for (size_t o = 0; o < len && n < MAX_THREADS; o += per, n++) {
        ps[n].fd = fd;
        ps[n].buf = buf + o;
        ps[n].len = len - o < per ? len - o : per;
        ps[n].at = at + o;
        /* the first piece stays on this thread */
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

double pln_stream_cached_fraction(int fd, uint64_t off, uint64_t n) {
    if (n == 0) return 1.0;
    uint64_t a = off & ~(uint64_t)(PLN_STREAM_ALIGN - 1);
    size_t len = (size_t)(off + n - a);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)a);
    if (m == MAP_FAILED) return 0.0;
    size_t pages = (len + PLN_STREAM_ALIGN - 1) / PLN_STREAM_ALIGN;
    unsigned char *v = malloc(pages);
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

int pln_stream_file(const char *path, uint64_t off, uint64_t nbytes, const pln_stream_opts *o,
                    pln_stream_stats *st) {
    double t0 = pln_now();
    pln_stream_stats dummy;
    if (!st) st = &dummy;
    memset(st, 0, sizeof *st);
    if (!o || !o->buf[0] || !o->buf[1] || !o->put || o->chunk == 0 || o->chunk % PLN_STREAM_ALIGN)
        return pln_errorf("%s: stream: two buffers, a consumer and a chunk that is a multiple of %d are needed", path,
                          PLN_STREAM_ALIGN);
    /* O_DIRECT reads into a buffer need its address aligned too: without it, read buffered. */
    const bool aligned = ((uintptr_t)o->buf[0] | (uintptr_t)o->buf[1]) % PLN_STREAM_ALIGN == 0;
    int threads = o->threads < 1 ? 1 : o->threads > MAX_THREADS ? MAX_THREADS : o->threads;
    int fd = pln_open_file(path, false);
    if (fd < 0) return -1;
    if (nbytes == 0) { close(fd); st->seconds = pln_now() - t0; return 0; }
    bool direct = aligned && (o->direct >= 0 ? o->direct != 0 : pln_stream_cached_fraction(fd, off, nbytes) < 0.5);
    if (direct) {
        int dfd = open(path, O_RDONLY | O_DIRECT | O_NONBLOCK | O_CLOEXEC);
        struct stat a, b;
        /* the same regular file as the checked open (not one swapped in since) */
        if (dfd >= 0 && fstat(dfd, &a) == 0 && fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
            fcntl(dfd, F_SETFL, fcntl(dfd, F_GETFL) & ~O_NONBLOCK) == 0) {
            close(fd);
            fd = dfd;
        } else {
            if (dfd >= 0) close(dfd);
            direct = false;
        }
    }
    if (!direct) posix_fadvise(fd, (off_t)off, (off_t)nbytes, POSIX_FADV_SEQUENTIAL);

    int rc = -1, b = 0;
    uint64_t pos = off & ~(uint64_t)(PLN_STREAM_ALIGN - 1);   /* next file offset to read */
    uint64_t done = 0;                                         /* bytes of the range handed over */
    while (done < nbytes) {
        if (o->wait && o->wait(o->ctx, b)) goto out;
        uint64_t skip = (off + done) - pos;     /* head bytes before the range (first read only) */
        uint64_t want = nbytes - done + skip;
        size_t len = want < o->chunk ? (size_t)pln_align_up(want, PLN_STREAM_ALIGN) : o->chunk;
        size_t got = 0;
        int err = parallel_read(fd, o->buf[b], len, pos, threads, &got);
        if (err == EINVAL && direct) {   /* O_DIRECT opened but refused: go buffered */
            int bfd = pln_open_file(path, false);
            if (bfd < 0) goto out;
            close(fd);
            fd = bfd;
            direct = false;
            posix_fadvise(fd, (off_t)off, (off_t)nbytes, POSIX_FADV_SEQUENTIAL);
            err = parallel_read(fd, o->buf[b], len, pos, threads, &got);
        }
        if (err) {
            pln_errorf("%s: read at offset %llu: %s", path, (unsigned long long)pos, strerror(err));
            goto out;
        }
        if (got <= skip) {
            pln_errorf("%s: the file ends at %llu, before the %llu bytes at offset %llu were read (a truncated "
                       "file: copy it again)", path, (unsigned long long)(pos + got), (unsigned long long)nbytes,
                       (unsigned long long)off);
            goto out;
        }
        uint64_t n = got - skip;
        if (n > nbytes - done) n = nbytes - done;
        if (o->put(o->ctx, b, done, (char *)o->buf[b] + skip, (size_t)n)) goto out;
        st->pieces++;
        done += n;
        pos += got;
        b ^= 1;
    }
    rc = 0;
out:
    if (rc)
        pln_error_context("%s: streaming %llu bytes at offset %llu (%s reads)", path, (unsigned long long)nbytes,
                          (unsigned long long)off, direct ? "O_DIRECT" : "buffered");
    close(fd);
    st->used_direct = direct;
    st->seconds = pln_now() - t0;
    return rc;
}
