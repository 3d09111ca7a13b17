/* loader.cu — see loader.cuh. O_DIRECT reads need 4 KiB-aligned offsets, lengths and buffers:
 * reads start at the aligned-down offset and the copy skips the head; the last read may run past
 * the range (or end short at end of file). Without O_DIRECT (tmpfs, some network file systems)
 * the same loop runs on buffered reads with a sequential read-ahead hint. */
#include "kernels/cuda/loader.cuh"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define LOAD_ALIGN 4096

static int read_full(int fd, char *buf, size_t len, uint64_t at, size_t *got, const char *path)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, buf + done, len - done, (off_t)(at + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && done == 0) return -2;   /* O_DIRECT refused: caller retries buffered */
            return pln_errorf("%s: read at offset %llu: %s", path, (unsigned long long)(at + done), strerror(errno));
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

int pln_cuda_load_file(pln_cuda_ctx *c, void *dst, const char *path, uint64_t off, uint64_t nbytes, double *rate)
{
    double t0 = pln_now();
    if (rate) *rate = 0.0;
    if (nbytes == 0) return 0;
    bool direct = true;
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) { direct = false; fd = open(path, O_RDONLY | O_CLOEXEC); }
    if (fd < 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
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
        uint64_t skip = (off + copied) - pos;               /* head bytes before the range (first read only) */
        uint64_t want = nbytes - copied + skip;
        size_t len = want < PLN_LOAD_CHUNK ? (size_t)pln_align_up(want, LOAD_ALIGN) : PLN_LOAD_CHUNK;
        size_t got = 0;
        int r = read_full(fd, buf[b], len, pos, &got, path);
        if (r == -2 && direct) {
            close(fd);
            direct = false;
            fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) { pln_errorf("%s: cannot reopen: %s", path, strerror(errno)); goto out; }
            r = read_full(fd, buf[b], len, pos, &got, path);
        }
        if (r == -2) r = pln_errorf("%s: read at offset %llu: invalid argument", path, (unsigned long long)pos);
        if (r == 0 && got <= skip) r = pln_errorf("%s: file ends at %llu, before the %llu bytes at offset %llu were read",
                                                   path, (unsigned long long)(pos + got), (unsigned long long)nbytes,
                                                   (unsigned long long)off);
        if (r) goto out;
        uint64_t n = got - skip;
        if (n > nbytes - copied) n = nbytes - copied;
        e = cudaMemcpyAsync((char *)dst + copied, buf[b] + skip, n, cudaMemcpyHostToDevice, c->stream);
        if (pln_cuda_check(e, "cudaMemcpyAsync", __FILE__, __LINE__)) goto out;
        if (pln_cuda_check(cudaEventRecord(done_ev[b], c->stream), "cudaEventRecord", __FILE__, __LINE__)) goto out;
        copied += n;
        pos += got;
        b ^= 1;
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
        pln_error_context("load %s (%llu bytes at offset %llu)", path, (unsigned long long)nbytes, (unsigned long long)off);
    }
    for (int i = 0; i < 2; i++) {
        if (done_ev[i]) cudaEventDestroy(done_ev[i]);
        if (buf[i]) cudaFreeHost(buf[i]);
    }
    if (fd >= 0) close(fd);
    return rc;
}
