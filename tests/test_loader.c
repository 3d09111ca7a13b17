/* test_loader.c — the loader's streaming path (backends with load_file, i.e. CUDA), on the CPU.
 *
 * "cpu-stream" is the CPU backend with a load_file that preads the range in pieces of a chosen
 * size into backend memory and hands each piece to on_bytes, as the CUDA loader does from its
 * pinned buffers. Checked: weights arrive byte for byte; --verify checksums every tensor while
 * loading whatever the piece size (pieces that end mid-tensor or inside alignment padding, at
 * several phases); a flipped byte inside a tensor fails the load naming that tensor; a flipped byte in
 * the padding between tensors does not; the engine on cpu-stream gives the plain CPU backend's
 * logits bit for bit and reports a load rate; with --no-mmap the file is read once into memory and
 * that copy is what the backend gets (and verifies), unaffected by a later truncation. */
#include "tests/test.h"
#include "tests/fixture_set.h"
#include "formats/shard.h"
#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/loader.h"
#include "formats/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t g_piece = 1 << 20;   /* load_file piece size */
static int g_pieces;               /* pieces handed to on_bytes by the last load */

/* g_piece == 0: the pieces come from formats/stream.c (what the CUDA loader uses), O_DIRECT
 * forced, 12 KiB chunks, copied into backend memory by the consumer. */
typedef struct {
    char *dst;
    void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t len);
    void *ctx;
} copy_sink;
static int copy_put(void *ctx, int b, uint64_t at, const void *p, size_t n) {
    (void)b;
    copy_sink *k = ctx;
    memcpy(k->dst + at, p, n);
    if (k->on_bytes) k->on_bytes(k->ctx, at, p, n);
    g_pieces++;
    return 0;
}

static int stream_load_file(pln_backend *be, void *dst, const char *path, uint64_t off, uint64_t n, double *rate,
                            void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t len), void *ctx) {
    double t0 = pln_now();
    if (g_piece == 0) {
        g_pieces = 0;
        copy_sink k = {dst, on_bytes, ctx};
        pln_stream_opts o = {.chunk = 3 * PLN_STREAM_ALIGN, .threads = 2, .direct = 1, .put = copy_put, .ctx = &k};
        o.buf[0] = aligned_alloc(PLN_STREAM_ALIGN, 4 * PLN_STREAM_ALIGN);
        o.buf[1] = aligned_alloc(PLN_STREAM_ALIGN, 4 * PLN_STREAM_ALIGN);
        pln_stream_stats st;
        int rc = pln_stream_file(path, off, n, &o, &st);
        free(o.buf[0]);
        free(o.buf[1]);
        if (rate) *rate = st.seconds > 0 ? (double)n / st.seconds : 1.0;
        return rc;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
    g_pieces = 0;
    for (uint64_t at = 0; at < n;) {
        size_t len = n - at < g_piece ? (size_t)(n - at) : g_piece;
        ssize_t r = pread(fd, (char *)dst + at, len, (off_t)(off + at));
        if (r <= 0) { close(fd); return pln_errorf("%s: read at %llu failed", path, (unsigned long long)(off + at)); }
        if (on_bytes) on_bytes(ctx, at, (char *)dst + at, (size_t)r);
        g_pieces++;
        at += (uint64_t)r;
    }
    close(fd);
    double dt = pln_now() - t0;
    if (rate) *rate = dt > 0 ? (double)n / dt : 1.0;
    return 0;
}

/* As the CUDA backend does with dst NULL: a copy in backend memory the caller frees. */
static int g_host_copies;
static const void *stream_weights_from_host(pln_backend *be, void *dst, const void *src, size_t n) {
    if (!dst && !(dst = be->alloc(be, n ? n : 1))) return NULL;
    memcpy(dst, src, n);
    g_host_copies++;
    return dst;
}

static int g_load_calls;
static int counting_load_file(pln_backend *be, void *dst, const char *path, uint64_t off, uint64_t n, double *rate,
                              void (*on_bytes)(void *ctx, uint64_t at, const void *p, size_t len), void *ctx) {
    g_load_calls++;
    return stream_load_file(be, dst, path, off, n, rate, on_bytes, ctx);
}

static pln_backend *stream_create(int device) {
    (void)device;
    pln_backend *be = pln_backend_cpu_create();
    if (be) {
        be->load_file = counting_load_file;
        be->weights_from_host = stream_weights_from_host;
    }
    return be;
}

static pln_comm *g_comm;

static int sh(const char *cmd) {
    int rc = system(cmd);
    if (rc) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Flips one byte of dir's rank file at absolute offset at. */
static int flip(const char *dir, uint64_t at) {
    char *p = pln_xasprintf("%s/rank-0-of-1.pln", dir);
    int fd = open(p, O_RDWR);
    free(p);
    if (fd < 0) return -1;
    uint8_t b = 0;
    int rc = pread(fd, &b, 1, (off_t)at) == 1 ? 0 : -1;
    b ^= 0x5a;
    if (!rc && pwrite(fd, &b, 1, (off_t)at) != 1) rc = -1;
    close(fd);
    return rc;
}

static pln_loader *open_loader(const char *dir, pln_backend *be, bool verify) {
    pln_loader_opts o = {.verify = verify, .quiet = true};
    return pln_loader_open(dir, 0, 1, be, &o);
}

/* Every tensor of the loaded weights equals the file's bytes. */
static bool same_as_file(pln_loader *l, const pln_shard *s) {
    for (uint64_t i = 0; i < s->n_tensors; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        if (t->dtype != PLN_DTYPE_F16) continue;
        const uint16_t *got;
        if (pln_loader_f16(l, t->name, (int64_t)(t->nbytes / 2), &got)) return false;
        if (memcmp(got, pln_shard_data(s, t), t->nbytes) != 0) return false;
    }
    return true;
}

static void check_pieces(const char *dir, const pln_shard *s) {
    pln_backend *be = pln_backend_create("cpu-stream", 0);
    size_t sizes[] = {1 << 20, 4095, 4097, 12345, (size_t)1 << 30, 0 /* formats/stream.c */};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        g_piece = sizes[k];
        pln_loader *l = open_loader(dir, be, true);
        CHECK(l != NULL, "piece %zu: verified load: %s", g_piece, l ? "" : pln_error());
        if (!l) continue;
        bool same = same_as_file(l, s);
        char what[64];
        if (g_piece) snprintf(what, sizeof what, "%zu bytes", g_piece);
        else snprintf(what, sizeof what, "formats/stream.c (O_DIRECT, 12 KiB)");
        printf("streamed load, --verify, pieces of %s (%d pieces): %s, weights %s\n", what, g_pieces,
               "checksums OK", same ? "identical to the file" : "DIFFER");
        CHECK(same, "piece %zu: loaded weights equal the file", g_piece);
        CHECK(pln_loader_rate(l) > 0, "piece %zu: a load rate is reported", g_piece);
        pln_loader_close(l);
    }
    g_piece = 1 << 20;
    pln_backend_destroy(be);
}

static void check_corrupt(const char *dir, const pln_shard *s) {
    pln_backend *be = pln_backend_create("cpu-stream", 0);
    /* a byte inside the third tensor */
    const pln_shard_tensor *t = &s->tensors[2];
    char *bad = pln_xasprintf("%s/corrupt", test_tmpdir());
    char *cmd = pln_xasprintf("rm -rf %s && cp -r %s %s", bad, dir, bad);
    CHECK(sh(cmd) == 0, "copy the set");
    free(cmd);
    CHECK(flip(bad, t->offset + t->nbytes / 2) == 0, "flip a byte of %s", t->name);
    g_piece = 4097;
    pln_loader *l = open_loader(bad, be, true);
    CHECK(l == NULL, "a flipped byte in %s fails a verified load", t->name);
    if (!l) {
        printf("flipped byte in %s: %s\n", t->name, pln_error());
        CHECK(strstr(pln_error(), t->name) != NULL, "the error names %s: %s", t->name, pln_error());
        CHECK(strstr(pln_error(), "while loading") != NULL, "the error says it was found while loading: %s", pln_error());
        CHECK(strstr(pln_error(), "rank-0-of-1.pln") != NULL, "the error names the file: %s", pln_error());
    }
    pln_loader_close(l);
    /* without --verify the same file loads (the flip goes unnoticed: that is what --verify is for) */
    l = open_loader(bad, be, false);
    CHECK(l != NULL, "unverified load of the flipped set opens");
    pln_loader_close(l);

    /* a flipped byte in the padding between two tensors is not part of any checksum */
    cmd = pln_xasprintf("rm -rf %s && cp -r %s %s", bad, dir, bad);
    CHECK(sh(cmd) == 0, "copy the set again");
    free(cmd);
    uint64_t gap = 0;
    for (uint64_t i = 0; i + 1 < s->n_tensors && !gap; i++)
        if (s->tensors[i].offset + s->tensors[i].nbytes < s->tensors[i + 1].offset)
            gap = s->tensors[i].offset + s->tensors[i].nbytes;
    CHECK(gap != 0, "the set has padding between tensors");
    if (gap) {
        CHECK(flip(bad, gap) == 0, "flip a padding byte");
        l = open_loader(bad, be, true);
        CHECK(l != NULL, "a flipped padding byte does not fail a verified load: %s", l ? "" : pln_error());
        pln_loader_close(l);
    }
    free(bad);
    g_piece = 1 << 20;
    pln_backend_destroy(be);
}

/* The VmFlags line of /proc/self/smaps for the mapping that starts at addr, into flags (empty if
 * none was found). */
static void vma_flags(const void *addr, char *flags, size_t n) {
    flags[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = lo == (uintptr_t)addr;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            snprintf(flags, n, "%.200s", line + 8);
            break;
        }
    }
    fclose(f);
}

/* Every opened rank file is advised MADV_HUGEPAGE before it is read (formats/common.c
 * MAP_HUGE_NOTE), not only by the loader: a `verify` that faults a set in first must leave it in
 * 2 MiB folios. The advice shows as "hg" in the mapping's VmFlags whatever the file system does
 * with it. */
static void check_map_hugepage(const char *dir, const pln_shard *s) {
    void *probe = mmap(NULL, 1 << 21, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool thp = probe != MAP_FAILED && madvise(probe, 1 << 21, MADV_HUGEPAGE) == 0;
    if (probe != MAP_FAILED) munmap(probe, 1 << 21);
    if (!thp) {
        printf("SKIP: this kernel takes no MADV_HUGEPAGE (no transparent huge pages)\n");
        return;
    }
    char flags[256];
    vma_flags(s->map.data, flags, sizeof flags);
    CHECK(flags[0] != 0, "the rank file's mapping is in /proc/self/smaps");
    CHECK(strstr(flags, " hg") != NULL, "an opened rank file (as verify opens it) is advised MADV_HUGEPAGE: VmFlags%s", flags);
    /* a checkpoint that reshard reads once is not advised (pln_map_open alone) */
    char *path = pln_xasprintf("%s/manifest.json", dir);
    pln_map m;
    CHECK(pln_map_open(&m, path) == 0, "map %s: %s", path, pln_error());
    vma_flags(m.data, flags, sizeof flags);
    CHECK(flags[0] != 0 && strstr(flags, " hg") == NULL, "a file mapped by pln_map_open alone is not advised: VmFlags%s", flags);
    pln_map_close(&m);
    free(path);
    printf("rank files advised MADV_HUGEPAGE as they are opened: checked\n");
}

/* --no-mmap (pln_map_set_no_mmap): the rank file is read into anonymous memory once; a load_file
 * backend is then given that copy (weights_from_host) instead of reading the file again, --verify
 * checks the copy, and the weights stay intact when the file is truncated afterwards. */
static void check_no_mmap(const char *dir, const pln_shard *s) {
    pln_backend *be = pln_backend_create("cpu-stream", 0);
    char *copy = pln_xasprintf("%s/nommap", test_tmpdir());
    char *cmd = pln_xasprintf("rm -rf %s && cp -r %s %s", copy, dir, copy);
    CHECK(sh(cmd) == 0, "copy the set");
    free(cmd);
    pln_map_set_no_mmap(true);
    g_load_calls = g_host_copies = 0;
    pln_loader *l = open_loader(copy, be, true);
    CHECK(l != NULL, "--no-mmap: verified load: %s", l ? "" : pln_error());
    CHECK(g_load_calls == 0 && g_host_copies == 1, "--no-mmap: the file is read once (load_file %d, host copies %d)",
          g_load_calls, g_host_copies);
    if (l) {
        char *rank = pln_xasprintf("%s/rank-0-of-1.pln", copy);
        CHECK(truncate(rank, 4096) == 0, "truncate the rank file under the loaded weights");
        free(rank);
        bool same = same_as_file(l, s);   /* reads l's memory only: a mapping would fault here */
        printf("--no-mmap load (copy handed to the backend), file truncated afterwards: weights %s\n",
               same ? "identical to the file" : "DIFFER");
        CHECK(same, "--no-mmap: weights equal the original file after it was truncated");
        pln_loader_close(l);
    }
    /* a flipped byte is found by --verify on the in-memory copy */
    cmd = pln_xasprintf("rm -rf %s && cp -r %s %s", copy, dir, copy);
    CHECK(sh(cmd) == 0, "copy the set again");
    free(cmd);
    const pln_shard_tensor *t = &s->tensors[1];
    CHECK(flip(copy, t->offset + t->nbytes / 3) == 0, "flip a byte of %s", t->name);
    l = open_loader(copy, be, true);
    CHECK(l == NULL && strstr(pln_error(), t->name), "--no-mmap --verify: a flipped byte in %s fails the load: %s",
          t->name, l ? "(loaded)" : pln_error());
    pln_loader_close(l);
    pln_map_set_no_mmap(false);
    free(copy);
    pln_backend_destroy(be);
}

/* The engine on cpu-stream: same logits as cpu, bit for bit, and a load rate in its info. */
static void check_engine(const char *dir) {
    int32_t ids[6] = {5, 17, 230, 41, 999, 3};
    float *want = NULL;
    const char *bes[2] = {"cpu", "cpu-stream"};
    for (int k = 0; k < 2; k++) {
        pln_engine_opts o;
        pln_engine_opts_default(&o);
        o.shard_dir = dir;
        o.backend = bes[k];
        o.max_seqs = 2;
        o.max_seq_len = 32;
        o.quiet = true;
        o.verify = true;
        pln_engine *e = pln_engine_open(&o, g_comm);
        CHECK(e != NULL, "engine on %s opens: %s", bes[k], e ? "" : pln_error());
        if (!e) continue;
        pln_step_seq s;
        memset(&s, 0, sizeof s);
        s.n_new = 6;
        s.tokens = ids;
        pln_sample_params_default(&s.params);
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true};
        pln_step_out out;
        int rc = pln_engine_step(e, &p, &out);
        CHECK(rc == 0, "step on %s: %s", bes[k], rc ? pln_error() : "");
        pln_engine_info info;
        pln_engine_get_info(e, &info);
        if (k == 0) {
            CHECK(info.load_bytes_per_s == 0, "cpu maps in place: no load rate");
            if (!rc) { want = pln_xmalloc(6 * (size_t)info.n_vocab * 4); memcpy(want, out.logits, 6 * (size_t)info.n_vocab * 4); }
        } else {
            CHECK(info.load_bytes_per_s > 0, "cpu-stream reports a load rate");
            bool same = !rc && want && !memcmp(want, out.logits, 6 * (size_t)info.n_vocab * 4);
            printf("engine on cpu-stream (--verify): prefill logits %s\n", same ? "identical to cpu" : "DIFFER");
            CHECK(same, "cpu-stream logits equal cpu's");
        }
        pln_engine_close(e);
    }
    free(want);
}

int main(int argc, char **argv) {
    test_begin("test_loader");
    g_comm = pln_comm_init(&argc, &argv);
    if (!fixture_can_reshard()) {
        printf("SKIP: this build has no `pollen reshard` (needed to make a shard set from the fixtures)\n");
        pln_comm_free(g_comm);
        return test_done();
    }
    char *dir = fixture_reshard("bloom-4h", "fp16-st", 1, "fp16");
    CHECK(dir != NULL, "reshard bloom-4h to TP 1 fp16");
    if (!dir) { pln_comm_free(g_comm); return test_done(); }
    CHECK(pln_backend_register("cpu-stream", stream_create) == 0, "register cpu-stream");
    pln_shardset *set = pln_shardset_open(dir);
    pln_shard *s = set ? pln_shardset_open_rank(set, 0) : NULL;
    CHECK(s != NULL, "open the rank file: %s", s ? "" : pln_error());
    if (s) {
        check_map_hugepage(dir, s);
        check_pieces(dir, s);
        check_corrupt(dir, s);
        check_no_mmap(dir, s);
        check_engine(dir);
        pln_shard_close(s);
    }
    pln_shardset_close(set);
    free(dir);
    pln_comm_free(g_comm);
    return test_done();
}
