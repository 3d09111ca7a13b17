/* common.c — errors, dtypes, mappings, checksums, atomic output directories, progress. */
#include "formats/common.h"
#include "kernels/pln_math.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- errors ---- */
static _Thread_local char g_err[1024];

int pln_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

int pln_error_context(const char *fmt, ...) {
    char ctx[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, g_err, sizeof old);
    size_t n = strnlen(ctx, sizeof ctx - 1);
    memcpy(g_err, ctx, n);
    g_err[n] = 0;
    strncat(g_err, ": ", sizeof g_err - strlen(g_err) - 1);
    strncat(g_err, old, sizeof g_err - strlen(g_err) - 1);
    return -1;
}

const char *pln_error(void) { return g_err; }

void pln_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pollen: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---- allocation ---- */
void *pln_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) pln_die("out of memory allocating %zu bytes", n);
    return p;
}
void *pln_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) pln_die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}
void *pln_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) pln_die("out of memory allocating %zu bytes", n);
    return q;
}
char *pln_xstrdup(const char *s) {
    char *p = strdup(s ? s : "");
    if (!p) pln_die("out of memory");
    return p;
}
char *pln_xasprintf(const char *fmt, ...) {
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    int r = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (r < 0) pln_die("out of memory");
    return s;
}

/* ---- dtypes ---- */
static const struct { const char *name; size_t size; } g_dtypes[PLN_DTYPE_COUNT] = {
    [PLN_DTYPE_F32] = {"F32", 4}, [PLN_DTYPE_F16] = {"F16", 2}, [PLN_DTYPE_BF16] = {"BF16", 2},
    [PLN_DTYPE_F64] = {"F64", 8}, [PLN_DTYPE_I8] = {"I8", 1},   [PLN_DTYPE_U8] = {"U8", 1},
    [PLN_DTYPE_I16] = {"I16", 2}, [PLN_DTYPE_I32] = {"I32", 4}, [PLN_DTYPE_I64] = {"I64", 8},
    [PLN_DTYPE_BOOL] = {"BOOL", 1},
};

size_t pln_dtype_size(pln_dtype dt) { return (unsigned)dt < PLN_DTYPE_COUNT ? g_dtypes[dt].size : 0; }
const char *pln_dtype_name(pln_dtype dt) { return (unsigned)dt < PLN_DTYPE_COUNT ? g_dtypes[dt].name : "?"; }

int pln_dtype_from_name(const char *name, pln_dtype *out) {
    for (int i = 0; i < PLN_DTYPE_COUNT; i++)
        if (strcmp(name, g_dtypes[i].name) == 0) { *out = (pln_dtype)i; return 0; }
    return pln_errorf("unknown dtype \"%s\" (known: F32 F16 BF16 F64 I8 U8 I16 I32 I64 BOOL)", name);
}

/* Checkpoint data need not be aligned (safetensors makes no promise), so every element is loaded
 * with memcpy, which compiles to a plain load where the target allows unaligned access. */
#define PLN_CONVERT(T, EXPR) do { const uint8_t *s = src; \
        for (uint64_t i = 0; i < n; i++) { T v; memcpy(&v, s + i * sizeof(T), sizeof(T)); dst[i] = (EXPR); } \
        return 0; } while (0)

int pln_to_f32(pln_dtype dt, const void *src, float *dst, uint64_t n) {
    switch (dt) {
    case PLN_DTYPE_F32: memcpy(dst, src, n * 4); return 0;
    case PLN_DTYPE_F16: PLN_CONVERT(uint16_t, pln_f16_to_f32(v));
    case PLN_DTYPE_BF16: PLN_CONVERT(uint16_t, pln_bf16_to_f32(v));
    case PLN_DTYPE_F64: PLN_CONVERT(double, (float)v);
    case PLN_DTYPE_I8: PLN_CONVERT(int8_t, (float)v);
    case PLN_DTYPE_U8: case PLN_DTYPE_BOOL: PLN_CONVERT(uint8_t, (float)v);
    case PLN_DTYPE_I16: PLN_CONVERT(int16_t, (float)v);
    case PLN_DTYPE_I32: PLN_CONVERT(int32_t, (float)v);
    case PLN_DTYPE_I64: PLN_CONVERT(int64_t, (float)v);
    default: return pln_errorf("cannot convert dtype %d to F32", (int)dt);
    }
}
#undef PLN_CONVERT

uint64_t pln_tensor_numel(const pln_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

const char *pln_shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- mappings ---- */
int pln_map_open(pln_map *m, const char *path) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return pln_errorf("%s: cannot stat: %s", path, strerror(errno)); }
    if (!S_ISREG(st.st_mode)) { close(fd); return pln_errorf("%s: not a regular file", path); }
    m->size = (uint64_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { close(fd); return pln_errorf("%s: cannot mmap %llu bytes: %s", path, (unsigned long long)m->size, strerror(errno)); }
        m->data = p;
    }
    m->fd = fd;
    m->path = pln_xstrdup(path);
    return 0;
}

void pln_map_advise_sequential(pln_map *m) {
    /* Two calls: madvise takes one advice value, not a set of flags (SEQUENTIAL | WILLNEED is
     * just WILLNEED). */
    if (!m->data) return;
    madvise((void *)m->data, m->size, MADV_SEQUENTIAL);
    madvise((void *)m->data, m->size, MADV_WILLNEED);
}

void pln_map_close(pln_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    free(m->path);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

char *pln_read_small_file(const char *path, size_t max_bytes, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) { pln_errorf("%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) { fclose(f); pln_errorf("%s: not a regular file", path); return NULL; }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        pln_errorf("%s: file is %lld bytes, more than the %zu allowed for it", path, (long long)st.st_size, max_bytes);
        return NULL;
    }
    char *buf = pln_xmalloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (n != (size_t)st.st_size) { free(buf); pln_errorf("%s: short read", path); return NULL; }
    buf[n] = 0;
    if (len_out) *len_out = n;
    return buf;
}

uint64_t pln_xxh3(const void *data, size_t n) { return XXH3_64bits(data, n); }

/* ---- atomic output directories ---- */
static int rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                char *p = pln_xasprintf("%s/%s", path, e->d_name);
                rm_rf(p);
                free(p);
            }
            closedir(d);
        }
        return rmdir(path);
    }
    return unlink(path);
}

static bool dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return true;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { empty = false; break; }
    closedir(d);
    return empty;
}

static char *parent_dir(const char *path) {
    char *p = pln_xstrdup(path);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    char *s = strrchr(p, '/');
    if (!s) { free(p); return pln_xstrdup("."); }
    if (s == p) s[1] = 0; else *s = 0;
    return p;
}

/* Signal-time cleanup: only async-signal-safe work happens in the handler (unlink/rmdir of a
 * flat directory whose entries we list ahead is not possible), so the handler re-raises after
 * removing the directory recursively with a small fixed-depth walk. */
static char g_cleanup_path[4096];
static void cleanup_handler(int sig) {
    if (g_cleanup_path[0]) rm_rf(g_cleanup_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

void pln_outdir_cleanup_on_signal(const char *tmp_path) {
    snprintf(g_cleanup_path, sizeof g_cleanup_path, "%s", tmp_path ? tmp_path : "");
    if (tmp_path) {
        signal(SIGINT, cleanup_handler);
        signal(SIGTERM, cleanup_handler);
        signal(SIGHUP, cleanup_handler);
    }
}

char *pln_outdir_begin(const char *final_path, bool force) {
    struct stat st;
    if (stat(final_path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) { pln_errorf("%s: exists and is not a directory", final_path); return NULL; }
        if (!dir_is_empty(final_path) && !force) {
            pln_errorf("%s: exists and is not empty; pass --force to replace it", final_path);
            return NULL;
        }
    }
    char *tmp = NULL;
    for (int attempt = 0; attempt < 100; attempt++) {
        tmp = pln_xasprintf("%s.tmp-%d-%d", final_path, (int)getpid(), attempt);
        if (mkdir(tmp, 0755) == 0) return tmp;
        int e = errno;
        free(tmp);
        if (e != EEXIST) { pln_errorf("%s: cannot create temporary directory beside it: %s", final_path, strerror(e)); return NULL; }
    }
    pln_errorf("%s: cannot create a temporary directory beside it", final_path);
    return NULL;
}

int pln_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pln_errorf("%s: cannot open for fsync: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0 && e != EINVAL) return pln_errorf("%s: fsync failed: %s", path, strerror(e));
    return 0;
}

int pln_outdir_commit(const char *tmp_path, const char *final_path) {
    DIR *d = opendir(tmp_path);
    if (!d) return pln_errorf("%s: cannot open: %s", tmp_path, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = pln_xasprintf("%s/%s", tmp_path, e->d_name);
        int r = pln_fsync_path(p);
        free(p);
        if (r) { closedir(d); return -1; }
    }
    closedir(d);
    if (pln_fsync_path(tmp_path)) return -1;
    struct stat st;
    if (stat(final_path, &st) == 0) {
        /* Replace: move the old one aside first so a crash never leaves neither. */
        char *old = pln_xasprintf("%s.old-%d", final_path, (int)getpid());
        if (rename(final_path, old) != 0) { int er = errno; free(old); return pln_errorf("%s: cannot move aside: %s", final_path, strerror(er)); }
        if (rename(tmp_path, final_path) != 0) {
            int er = errno;
            rename(old, final_path);
            free(old);
            return pln_errorf("%s: cannot rename into place: %s", final_path, strerror(er));
        }
        rm_rf(old);
        free(old);
    } else if (rename(tmp_path, final_path) != 0) {
        return pln_errorf("%s: cannot rename %s into place: %s", final_path, tmp_path, strerror(errno));
    }
    g_cleanup_path[0] = 0;
    char *parent = parent_dir(final_path);
    pln_fsync_path(parent);
    free(parent);
    return 0;
}

void pln_outdir_abort(const char *tmp_path) {
    if (tmp_path) rm_rf(tmp_path);
    g_cleanup_path[0] = 0;
}

int pln_write_file_atomic(const char *path, const void *data, size_t n) {
    char *tmp = pln_xasprintf("%s.tmp-%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { int e = errno; free(tmp); return pln_errorf("%s: cannot create: %s", path, strerror(e)); }
    const uint8_t *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd); unlink(tmp); free(tmp);
            return pln_errorf("%s: write failed: %s", path, strerror(e));
        }
        p += w; left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) { int e = errno; unlink(tmp); free(tmp); return pln_errorf("%s: fsync/close failed: %s", path, strerror(e)); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); free(tmp); return pln_errorf("%s: rename failed: %s", path, strerror(e)); }
    free(tmp);
    return 0;
}

int pln_copy_file(const char *src, const char *dst) {
    pln_map m;
    if (pln_map_open(&m, src)) return -1;
    int r = pln_write_file_atomic(dst, m.data ? (const void *)m.data : "", m.size);
    pln_map_close(&m);
    return r;
}

/* ---- time and progress ---- */
double pln_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *pln_human_bytes(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000.0 && i < 4) { b /= 1000.0; i++; }
    snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

void pln_progress_init(pln_progress *p, const char *label, uint64_t total, bool quiet) {
    memset(p, 0, sizeof *p);
    p->label = label;
    p->total = total;
    p->t0 = pln_now();
    p->enabled = !quiet && isatty(2);
}

static void progress_draw(pln_progress *p, bool final) {
    double t = pln_now() - p->t0;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    char a[32], b[32], r[32];
    double rate = t > 0 ? (double)p->done / t : 0;
    double eta = rate > 0 ? (double)(p->total - (p->done < p->total ? p->done : p->total)) / rate : 0;
    fprintf(stderr, "\r%-10s [%s] %5.1f%%  %s / %s  %s/s  %s %3.0fs ", p->label, bar, 100 * frac,
            pln_human_bytes((double)p->done, a, sizeof a), pln_human_bytes((double)p->total, b, sizeof b),
            pln_human_bytes(rate, r, sizeof r), final ? "took" : "ETA", final ? t : eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

void pln_progress_add(pln_progress *p, uint64_t n) {
    p->done += n;
    if (!p->enabled) return;
    double t = pln_now();
    if (t - p->last_draw < 0.1) return;
    p->last_draw = t;
    progress_draw(p, false);
}

void pln_progress_done(pln_progress *p) {
    if (p->enabled) progress_draw(p, true);
}
