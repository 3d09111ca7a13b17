/* common.c — errors, dtypes, mappings, checksums, atomic output directories, progress. */
#include "formats/common.h"
#include "formats/numeric.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

int pln_env_flag(const char *name, bool *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (!strcmp(v, "0") || !strcmp(v, "1")) {
        *out = v[0] == '1';
        return 0;
    }
    return pln_errorf("%s=%s: expected 0 or 1 (unset it for the default)", name, v);
}

int pln_env_long(const char *name, long lo, long hi, long *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return pln_errorf("%s=%s: expected a whole number from %ld to %ld (unset it for the default)", name, v, lo, hi);
    *out = x;
    return 0;
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

/* ---- async-signal-safe output (for handlers: no stdio, no malloc) ---- */
static void sig_puts(const char *str) {
    size_t n = strlen(str);
    while (n) {
        ssize_t w = write(2, str, n);
        if (w <= 0) return;
        str += w;
        n -= (size_t)w;
    }
}

static void sig_putu(uint64_t v) {
    char b[24];
    int i = (int)sizeof b;
    b[--i] = 0;
    do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v && i > 0);
    sig_puts(b + i);
}

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGBUS: return "SIGBUS";
    case SIGQUIT: return "SIGQUIT";
    case SIGPIPE: return "SIGPIPE";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGALRM: return "SIGALRM";
    case SIGXCPU: return "SIGXCPU";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGIO: return "SIGIO";
    case SIGPWR: return "SIGPWR";
    case SIGSYS: return "SIGSYS";
    case SIGSTKFLT: return "SIGSTKFLT";
    default: return "a signal";
    }
}

/* Every signal whose default action ends the process and that comes from outside it (kill,
 * a terminal, a closed pipe, a timer, a CPU limit). The synchronous faults (SIGSEGV, SIGBUS,
 * SIGILL, SIGFPE, SIGABRT, SIGTRAP) are a bug's or the mapping handler's, not these; SIGXFSZ is
 * ignored instead, so an over-limit write fails with EFBIG and the ordinary error path cleans up. */
static const int g_term_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM,
                                     SIGXCPU, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSYS, SIGSTKFLT};
#define N_TERM_SIGNALS (int)(sizeof g_term_signals / sizeof g_term_signals[0])

/* ---- opening files ---- */
const char *pln_file_type_name(unsigned mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

static int wrong_type(const char *path, unsigned mode, bool want_dir) {
    if (want_dir) return pln_errorf("%s: is %s, not a directory", path, pln_file_type_name(mode));
    return pln_errorf("%s: is %s, not a regular file (pollen reads only regular files: put the file itself there)",
                      path, pln_file_type_name(mode));
}

int pln_open_file(const char *path, bool want_dir) {
    struct stat st;
    if (stat(path, &st) != 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
    if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) return wrong_type(path, st.st_mode, want_dir);
    /* O_NONBLOCK: if a FIFO or device was swapped in since the stat, the open still returns at
     * once and the fstat below names it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (want_dir ? O_DIRECTORY : 0));
    if (fd < 0) return pln_errorf("%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pln_errorf("%s: cannot stat: %s", path, strerror(e));
    }
    if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
        close(fd);
        return wrong_type(path, st.st_mode, want_dir);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return pln_errorf("%s: cannot clear O_NONBLOCK: %s", path, strerror(e));
    }
    return fd;
}

int pln_check_file(const char *path) {
    int fd = pln_open_file(path, false);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

/* Reads exactly n bytes at offset 0 of fd into buf. */
static int read_whole(int fd, void *buf, uint64_t n, const char *path) {
    uint64_t got = 0;
    while (got < n) {
        size_t want = n - got > (1u << 30) ? (1u << 30) : (size_t)(n - got);
        ssize_t r = pread(fd, (char *)buf + got, want, (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return pln_errorf("%s: read failed at byte %llu: %s", path, (unsigned long long)got, strerror(errno));
        }
        if (r == 0)
            return pln_errorf("%s: shrank while being read (%llu of %llu bytes there): the file is being changed; "
                              "copy it again", path, (unsigned long long)got, (unsigned long long)n);
        got += (uint64_t)r;
    }
    return 0;
}

/* ---- mappings and their SIGBUS handler ---- */
/* The registry the handler reads: slots are written under a lock, published by storing addr last
 * (release), read by the handler with acquire loads; a slot's path and fd stay valid while its
 * addr is non-zero. */
#define MAP_SLOTS 256
typedef struct {
    _Atomic uintptr_t addr;
    uint64_t size;
    int fd;
    char path[1024];
} map_slot;
static map_slot g_maps[MAP_SLOTS];
static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_no_mmap;
static char g_cleanup_path[PATH_MAX];
static void remove_tmp_signal_safe(void);

static char g_fault_hint[256];
void pln_map_fault_hint(const char *hint) { snprintf(g_fault_hint, sizeof g_fault_hint, "%s", hint ? hint : ""); }
void pln_map_set_no_mmap(bool on) { g_no_mmap = on; }
bool pln_map_no_mmap(void) { return g_no_mmap; }

static void sigbus_handler(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAP_SLOTS; i++) {
        uintptr_t base = atomic_load_explicit(&g_maps[i].addr, memory_order_acquire);
        if (!base || a < base || a - base >= g_maps[i].size) continue;
        const map_slot *m = &g_maps[i];
        uint64_t at = (uint64_t)(a - base);
        struct stat st;
        bool shrank = fstat(m->fd, &st) == 0 && (uint64_t)st.st_size <= at;
        sig_puts("\npollen: ");
        sig_puts(m->path);
        if (shrank) {
            sig_puts(" shrank while mapped: it was ");
            sig_putu(m->size);
            sig_puts(" bytes, is now ");
            sig_putu((uint64_t)st.st_size);
            sig_puts(", and byte ");
            sig_putu(at);
            sig_puts(" was needed. The file was changed under this running process: put the whole file back "
                     "(or make it again) and restart");
            if (g_fault_hint[0]) { sig_puts("; "); sig_puts(g_fault_hint); }
            sig_puts("\n");
        } else {
            sig_puts(": I/O error reading byte ");
            sig_putu(at);
            sig_puts(" of the mapped file (the storage under it failed); check the device and restart\n");
        }
        remove_tmp_signal_safe();
        _exit(1);
    }
    /* Not one of our mappings: a real bug. Take the default action (a core dump) on return. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
}

static void install_sigbus(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == sigbus_handler) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = sigbus_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

static void map_register(const pln_map *m) {
    pthread_mutex_lock(&g_maps_lock);
    install_sigbus();
    for (int i = 0; i < MAP_SLOTS; i++) {
        if (atomic_load_explicit(&g_maps[i].addr, memory_order_relaxed)) continue;
        g_maps[i].size = m->size;
        g_maps[i].fd = m->fd;
        snprintf(g_maps[i].path, sizeof g_maps[i].path, "%s", m->path);
        atomic_store_explicit(&g_maps[i].addr, (uintptr_t)m->data, memory_order_release);
        break;   /* a full table only loses the file's name in the message: the fault still kills */
    }
    pthread_mutex_unlock(&g_maps_lock);
}

static void map_unregister(const pln_map *m) {
    pthread_mutex_lock(&g_maps_lock);
    for (int i = 0; i < MAP_SLOTS; i++)
        if (atomic_load_explicit(&g_maps[i].addr, memory_order_relaxed) == (uintptr_t)m->data)
            atomic_store_explicit(&g_maps[i].addr, 0, memory_order_release);
    pthread_mutex_unlock(&g_maps_lock);
}

int pln_map_open(pln_map *m, const char *path) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    int fd = pln_open_file(path, false);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return pln_errorf("%s: cannot stat: %s", path, strerror(errno)); }
    m->size = (uint64_t)st.st_size;
    if (m->size > 0 && g_no_mmap) {
        /* Anonymous memory, read once: the page cache's later changes to the file cannot reach it. */
        void *p = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { close(fd); return pln_errorf("%s: cannot allocate %llu bytes to read it into (--no-mmap): %s", path, (unsigned long long)m->size, strerror(errno)); }
#ifdef MADV_HUGEPAGE
        madvise(p, m->size, MADV_HUGEPAGE);   /* before the read faults it in (MAP_HUGE_NOTE below) */
#endif
        if (read_whole(fd, p, m->size, path)) { munmap(p, m->size); close(fd); return -1; }
        mprotect(p, m->size, PROT_READ);
        m->data = p;
        m->in_memory = true;
    } else if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { close(fd); return pln_errorf("%s: cannot mmap %llu bytes: %s", path, (unsigned long long)m->size, strerror(errno)); }
        m->data = p;
    }
    m->fd = fd;
    m->path = pln_xstrdup(path);
    if (m->data && !m->in_memory) map_register(m);
    return 0;
}

void pln_map_advise_sequential(pln_map *m) {
    /* Two calls: madvise takes one advice value, not a set of flags (SEQUENTIAL | WILLNEED is
     * just WILLNEED). */
    if (!m->data) return;
    madvise((void *)m->data, m->size, MADV_SEQUENTIAL);
    madvise((void *)m->data, m->size, MADV_WILLNEED);
}

void pln_map_advise_huge(pln_map *m) {
    /* MAP_HUGE_NOTE: 2 MiB pages where the kernel and file system offer them (THP "madvise" mode,
     * large page-cache folios), asked for as a rank file is opened, before anything reads it: a
     * page fault then reads a whole 2 MiB folio into the page cache, and a later process maps
     * those with one entry each. A decode step streams every weight once, and with 4 KiB pages
     * each 2 KiB row pair costs a TLB miss and a page walk that the hardware prefetchers do not
     * cross. Asked for only by the loader, as this once was, a `pollen verify` of a set not yet
     * cached left a third of it in small folios, which every later `serve` then mapped with 4 KiB
     * pages: Llama-3.2-1B fp16, batch-1 decode 27.0-27.8 against 28.7-29.0 tokens/s
     * (docs/ARCHITECTURE.md). The first reader of a cold file pays for assembling the folios
     * (THP defrag "madvise" compacts on fault), whichever command it is. Checkpoints that reshard
     * reads once are not advised. Advice only: refused, nothing changes. */
#ifdef MADV_HUGEPAGE
    if (m->data && !m->in_memory) madvise((void *)m->data, m->size, MADV_HUGEPAGE);
#else
    (void)m;
#endif
}

void pln_map_close(pln_map *m) {
    if (m->data && !m->in_memory && m->fd >= 0) map_unregister(m);
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    free(m->path);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

char *pln_read_small_file(const char *path, size_t max_bytes, size_t *len_out) {
    int fd = pln_open_file(path, false);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); pln_errorf("%s: cannot stat: %s", path, strerror(errno)); return NULL; }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        pln_errorf("%s: file is %lld bytes, more than the %zu allowed for it", path, (long long)st.st_size, max_bytes);
        return NULL;
    }
    char *buf = pln_xmalloc((size_t)st.st_size + 1);
    int r = read_whole(fd, buf, (uint64_t)st.st_size, path);
    close(fd);
    if (r) { free(buf); return NULL; }
    buf[st.st_size] = 0;
    if (len_out) *len_out = (size_t)st.st_size;
    return buf;
}

uint64_t pln_xxh3(const void *data, size_t n) { return XXH3_64bits(data, n); }

/* ---- atomic output directories ---- */
/* Recursive removal, only ever of the temporary directory this process created (mkdir'ed with a
 * fresh name in pln_outdir_begin): never of anything a user could have named. */
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

static char *parent_dir(const char *path) {
    char *p = pln_xstrdup(path);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    char *s = strrchr(p, '/');
    if (!s) { free(p); return pln_xstrdup("."); }
    if (s == p) s[1] = 0; else *s = 0;
    return p;
}

/* The last component of path, without trailing slashes (owned). */
static char *base_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    return pln_xasprintf("%.*s", (int)(n - b), path + b);
}

/* path without trailing slashes ("/" stays "/"), owned: "out/" must name out itself, not a place
 * inside it (its temporary sibling is "out.tmp-...", and a link "out/" would be followed). */
static char *trimmed(const char *path) {
    char *p = pln_xstrdup(path);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    return p;
}

/* ---- signals while an output is being written ----
 * The temporary directory is flat (pollen writes no subdirectories into it), so the handler can
 * empty and remove it with async-signal-safe system calls only: open, getdents64, unlinkat, rmdir.
 * It retries because a thread that did not take the signal may create a file meanwhile. */
static volatile sig_atomic_t g_committing, g_pending_sig;

/* A temporary file (pln_write_file_atomic, the safetensors writer) being written, for the same
 * handlers: its path, published by g_cleanup_file_set. */
static char g_cleanup_file[PATH_MAX];
static volatile sig_atomic_t g_cleanup_file_set;

void pln_tmpfile_cleanup_on_signal(const char *tmp_file) {
    g_cleanup_file_set = 0;
    if (!tmp_file) return;
    snprintf(g_cleanup_file, sizeof g_cleanup_file, "%s", tmp_file);
    g_cleanup_file_set = 1;
}

static void remove_tmp_signal_safe(void) {
    if (g_cleanup_file_set) unlink(g_cleanup_file);
    if (!g_cleanup_path[0]) return;
    for (int attempt = 0; attempt < 5; attempt++) {
        int dfd = open(g_cleanup_path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0) return;
        char buf[8192] __attribute__((aligned(8)));
        for (;;) {
            long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
            if (n <= 0) break;
            for (long off = 0; off < n;) {
                /* struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[] */
                unsigned short reclen;
                memcpy(&reclen, buf + off + 16, sizeof reclen);
                const char *name = buf + off + 19;
                if (strcmp(name, ".") && strcmp(name, "..")) unlinkat(dfd, name, 0);
                off += reclen;
            }
        }
        close(dfd);
        if (rmdir(g_cleanup_path) == 0 || errno == ENOENT) return;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void die_of(int sig) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    sigset_t un;
    sigemptyset(&un);
    sigaddset(&un, sig);
    pthread_sigmask(SIG_UNBLOCK, &un, NULL);
    raise(sig);
    _exit(128 + sig);
}

static void outdir_signal_handler(int sig) {
    if (g_committing) { g_pending_sig = sig; return; }   /* the renames finish first */
    if (g_cleanup_path[0]) {
        sig_puts("\npollen: interrupted by ");
        sig_puts(sig_name(sig));
        sig_puts("; removing the temporary output ");
        sig_puts(g_cleanup_path);
        sig_puts("\n");
    }
    remove_tmp_signal_safe();
    die_of(sig);
}

static void set_handler(int sig, void (*h)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_TERM_SIGNALS; i++) sigaddset(&sa.sa_mask, g_term_signals[i]);
    sigaction(sig, &sa, NULL);
}

static void exit_signal_handler(int sig);

/* Every terminating signal to h; SIGXFSZ ignored (see g_term_signals). SIGINT, SIGTERM and SIGHUP
 * are always taken (a background job starts with SIGINT ignored, and must still stop on it). The
 * others only where they would terminate: a signal the launcher set to be ignored (nohup, a
 * shell's background job) does not end the process, and a handler someone else installed (a
 * profiler's SIGPROF) is theirs. */
static void outdir_signal_handler(int sig);
static void set_term_handlers(void (*h)(int)) {
    for (int i = 0; i < N_TERM_SIGNALS; i++) {
        int sig = g_term_signals[i];
        struct sigaction old;
        bool always = sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
        if (!always && sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_DFL &&
            old.sa_handler != exit_signal_handler && old.sa_handler != outdir_signal_handler)
            continue;
        set_handler(sig, h);
    }
    signal(SIGXFSZ, SIG_IGN);
}

void pln_outdir_cleanup_on_signal(const char *tmp_path) {
    snprintf(g_cleanup_path, sizeof g_cleanup_path, "%s", tmp_path ? tmp_path : "");
    if (tmp_path) set_term_handlers(outdir_signal_handler);
}

static char g_exit_who[64];
static bool g_exit_quiet_term;
static void exit_signal_handler(int sig) {
    if (g_committing) { g_pending_sig = sig; return; }
    if (sig == SIGPIPE) { remove_tmp_signal_safe(); die_of(sig); }   /* `pollen inspect | head`: quietly, as before */
    if (sig == SIGTERM && g_exit_quiet_term) { remove_tmp_signal_safe(); die_of(sig); }
    sig_puts("\npollen");
    if (g_exit_who[0]) { sig_puts(" "); sig_puts(g_exit_who); }
    sig_puts(": interrupted by ");
    sig_puts(sig_name(sig));
    sig_puts("\n");
    remove_tmp_signal_safe();
    die_of(sig);
}

void pln_exit_on_signal(const char *who) {
    snprintf(g_exit_who, sizeof g_exit_who, "%s", who ? who : "");
    /* A rank other than 0 of a set pollen started itself (tools/launch.c sets PLN_LAUNCHED) gets
     * no signal of the user's (they go to rank 0): a SIGTERM there is mpirun ending the job after
     * another rank failed, and that rank has said why. */
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = getenv("PMIX_RANK");
    if (!rank) rank = getenv("PMI_RANK");
    g_exit_quiet_term = getenv("PLN_LAUNCHED") && rank && strcmp(rank, "0") != 0;
    set_term_handlers(exit_signal_handler);
}

/* ---- what is in a directory, and whether it is an earlier pollen output ---- */
typedef struct { char **v; size_t n; } name_list;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void names_free(name_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* The entries of dir but "." and "..", sorted. -1 with an error when it cannot be read. */
static int list_dir(const char *dir, name_list *l) {
    memset(l, 0, sizeof *l);
    int fd = pln_open_file(dir, true);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return pln_errorf("%s: cannot read: %s", dir, strerror(errno)); }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        l->v = pln_xrealloc(l->v, (l->n + 1) * sizeof *l->v);
        l->v[l->n++] = pln_xstrdup(e->d_name);
    }
    closedir(d);
    if (l->n) qsort(l->v, l->n, sizeof *l->v, cmp_str);
    return 0;
}

/* "a, b, c and 12 more" */
static char *describe(const name_list *l) {
    char buf[600];
    size_t o = 0;
    buf[0] = 0;
    size_t shown = l->n < 4 ? l->n : 3;
    for (size_t i = 0; i < shown && o < sizeof buf; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%.120s", i ? ", " : "", l->v[i]);
    if (l->n > shown && o < sizeof buf) snprintf(buf + o, sizeof buf - o, " and %zu more", l->n - shown);
    return pln_xstrdup(buf);
}

/* fmt holds one %u pair ("rank-%u-of-%u.pln"): name must be exactly what it prints. */
static bool matches_pair(const char *name, const char *fmt) {
    unsigned a = 0, b = 0;
    if (sscanf(name, fmt, &a, &b) != 2) return false;
    char want[128];
    snprintf(want, sizeof want, fmt, a, b);
    return !strcmp(want, name);
}

static bool shardset_name(const char *n) {
    return !strcmp(n, "manifest.json") || !strcmp(n, "config.json") || !strcmp(n, "tokenizer.json") ||
           !strcmp(n, "tokenizer_config.json") || !strcmp(n, "chat_template.jinja") || matches_pair(n, "rank-%u-of-%u.pln");
}

static bool synth_name(const char *n) {
    return !strcmp(n, PLN_SYNTH_MARKER) || !strcmp(n, "config.json") || !strcmp(n, "tokenizer.json") ||
           !strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json") ||
           matches_pair(n, "model-%05u-of-%05u.safetensors");
}

static bool has_name(const name_list *l, const char *n) {
    return l->n && bsearch(&n, l->v, l->n, sizeof *l->v, cmp_str) != NULL;
}

/* Which files of dir (listed in l) pollen wrote: a shard set (its manifest says pollen-shards) or a
 * synth checkpoint (the marker). NULL + error saying what dir holds when it is neither, or holds
 * anything else too. */
static bool (*pollen_output_names(const char *dir, const name_list *l))(const char *) {
    bool (*known)(const char *) = NULL;
    const char *kind = NULL;
    if (has_name(l, "manifest.json")) {
        char *mp = pln_xasprintf("%s/manifest.json", dir);
        char *text = pln_read_small_file(mp, 64u << 20, NULL);
        free(mp);
        if (text && strstr(text, "\"pollen-shards\"")) { known = shardset_name; kind = "pollen shard set"; }
        free(text);
    } else if (has_name(l, PLN_SYNTH_MARKER)) {
        known = synth_name;
        kind = "`pollen synth` checkpoint";
    }
    char *what = describe(l);
    if (!known) {
        pln_errorf("%s: holds %s, and is not an earlier pollen output (a shard set with its manifest.json, or a "
                   "checkpoint `pollen synth` marked with %s); --force replaces only those or an empty directory: "
                   "remove it yourself or choose another output path", dir, what, PLN_SYNTH_MARKER);
        free(what);
        return NULL;
    }
    for (size_t i = 0; i < l->n; i++) {
        if (known(l->v[i])) continue;
        pln_errorf("%s: is a %s but also holds %s, which pollen did not write (of: %s); --force deletes only what "
                   "pollen writes: move that away or choose another output path", dir, kind, l->v[i], what);
        free(what);
        return NULL;
    }
    free(what);
    return known;
}

/* Deletes the files pollen writes from dir, then dir itself; refuses (-1, nothing deleted) if dir
 * is not an earlier pollen output or holds anything else. Never recursive. */
static int remove_pollen_output(const char *dir) {
    name_list l;
    if (list_dir(dir, &l)) return -1;
    if (l.n && !pollen_output_names(dir, &l)) { names_free(&l); return -1; }
    int rc = 0;
    for (size_t i = 0; i < l.n && !rc; i++) {
        char *p = pln_xasprintf("%s/%s", dir, l.v[i]);
        if (unlink(p) != 0) rc = pln_errorf("%s: cannot delete: %s", p, strerror(errno));
        free(p);
    }
    names_free(&l);
    if (!rc && rmdir(dir) != 0) rc = pln_errorf("%s: cannot remove: %s", dir, strerror(errno));
    return rc;
}

/* ---- output paths that never touch a source ---- */
typedef struct { dev_t dev; ino_t ino; } file_id;

/* Identities of the real path rp and of each of its ancestors up to "/". */
static int ancestry(const char *rp, file_id **out, int *n) {
    char *p = pln_xstrdup(rp);
    *out = NULL;
    *n = 0;
    for (;;) {
        struct stat st;
        if (stat(p, &st) != 0) { int e = errno; free(p); free(*out); *out = NULL; return pln_errorf("%s: cannot stat: %s", rp, strerror(e)); }
        *out = pln_xrealloc(*out, (size_t)(*n + 1) * sizeof **out);
        (*out)[(*n)++] = (file_id){st.st_dev, st.st_ino};
        if (!strcmp(p, "/")) break;
        char *s = strrchr(p, '/');
        if (!s) break;
        if (s == p) s[1] = 0; else *s = 0;
    }
    free(p);
    return 0;
}

static bool id_in(const file_id *ids, int n, const struct stat *st) {
    for (int i = 0; i < n; i++)
        if (ids[i].dev == st->st_dev && ids[i].ino == st->st_ino) return true;
    return false;
}

static int path_guard(const char *out, const char *const *protect, int n);
int pln_path_guard(const char *out, const char *const *protect, int n) {
    char *t = trimmed(out);
    int rc = path_guard(t, protect, n);
    free(t);
    return rc;
}

static int path_guard(const char *out, const char *const *protect, int n) {
    struct stat ost;
    bool out_exists = lstat(out, &ost) == 0;
    if (!out_exists && errno != ENOENT) return pln_errorf("%s: cannot stat: %s", out, strerror(errno));
    if (out_exists && S_ISLNK(ost.st_mode)) {
        char target[PATH_MAX];
        char *rp = realpath(out, target);
        return pln_errorf("%s: is a symbolic link (to %s); give the output directory itself, not a link to it",
                          out, rp ? rp : "a path that does not resolve");
    }
    /* The real path whose ancestry decides "inside": out itself when it exists, else its parent
     * (which must exist: the temporary sibling is created there). */
    char *anchor = NULL;
    if (out_exists) {
        anchor = realpath(out, NULL);
    } else {
        char *b = base_of(out);
        bool bad = !*b || !strcmp(b, ".") || !strcmp(b, "..");
        free(b);
        if (bad) return pln_errorf("%s: name the output directory itself (not \".\" or \"..\")", out);
        char *parent = parent_dir(out);
        anchor = realpath(parent, NULL);
        if (!anchor) { int e = errno; pln_errorf("%s: its parent directory %s: %s", out, parent, strerror(e)); free(parent); return -1; }
        free(parent);
    }
    if (!anchor) return pln_errorf("%s: cannot resolve its real path: %s", out, strerror(errno));
    file_id *oa = NULL;
    int on = 0;
    if (ancestry(anchor, &oa, &on)) { free(anchor); return -1; }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        struct stat pst;
        if (!protect[i] || stat(protect[i], &pst) != 0) continue;
        char *prp = realpath(protect[i], NULL);
        if (!prp) continue;
        file_id *pa = NULL;
        int pn = 0;
        if (ancestry(prp, &pa, &pn)) { free(prp); rc = -1; break; }
        struct stat ost2;
        if (out_exists && stat(out, &ost2) == 0 && id_in(pa, pn, &ost2)) {
            if (ost2.st_dev == pst.st_dev && ost2.st_ino == pst.st_ino)
                rc = pln_errorf("%s: is the source %s itself (real path %s); the output must be a new directory "
                                "elsewhere", out, protect[i], prp);
            else
                rc = pln_errorf("%s: contains the source %s (real path %s); replacing it would destroy the "
                                "source: choose an output directory outside it", out, protect[i], prp);
        } else if (S_ISDIR(pst.st_mode) && id_in(oa, on, &pst)) {
            rc = pln_errorf("%s: lies inside the source directory %s (real path %s); write the output outside "
                            "the source tree", out, protect[i], prp);
        }
        free(pa);
        free(prp);
    }
    free(oa);
    free(anchor);
    return rc;
}

static char *outdir_begin(const char *final_path, bool force);
char *pln_outdir_begin(const char *final_path, bool force) {
    char *t = trimmed(final_path);
    char *tmp = outdir_begin(t, force);
    free(t);
    return tmp;
}

/* ---- temporary siblings: marked as pollen's, removed when their process is gone ----
 * Each temporary directory FINAL.tmp-PID-N holds PLN_TMP_MARKER ("pollen-tmp PID HOST") until the
 * commit. A later run for the same FINAL removes a sibling only when all of these hold: its name
 * has that form, it is a directory (not a link) of this user, its marker names the same PID and
 * this host, no process with that PID exists here, and it holds only plain files (what pollen
 * writes into it). Anything else is left alone. */
#define PLN_TMP_MARKER ".pollen-tmp"

static int write_tmp_marker(const char *tmp) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char *path = pln_xasprintf("%s/%s", tmp, PLN_TMP_MARKER);
    char *text = pln_xasprintf("pollen-tmp %d %s\n", (int)getpid(), host);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) rc = pln_errorf("%s: cannot write: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    free(text);
    free(path);
    return rc;
}

/* The PID in a "BASE.tmp-PID-N" name, or -1. */
static long tmp_name_pid(const char *name, const char *base) {
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) || strncmp(name + bl, ".tmp-", 5)) return -1;
    const char *p = name + bl + 5;
    char *e;
    if (*p < '0' || *p > '9') return -1;   /* digits only: strtol would take spaces and signs */
    long pid = strtol(p, &e, 10);
    if (*e != '-' || pid <= 0) return -1;
    const char *q = e + 1;
    if (*q < '0' || *q > '9') return -1;
    strtol(q, &e, 10);
    if (*e) return -1;
    return pid;
}

/* Removes dir if it is a stale temporary sibling (see above). 1 when removed, 0 when left. */
static int remove_if_stale(const char *dir, long pid) {
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) return 0;
    char *mp = pln_xasprintf("%s/%s", dir, PLN_TMP_MARKER);
    char *text = pln_read_small_file(mp, 512, NULL);
    free(mp);
    if (!text) return 0;
    char host[256] = "", mhost[256] = "";
    gethostname(host, sizeof host - 1);
    long mpid = -1;
    bool ok = sscanf(text, "pollen-tmp %ld %255s", &mpid, mhost) == 2 && mpid == pid && !strcmp(mhost, host);
    free(text);
    if (!ok || kill((pid_t)pid, 0) == 0 || errno != ESRCH) return 0;
    /* only plain files inside: a subdirectory or anything else means it is not (only) ours */
    name_list l;
    if (list_dir(dir, &l)) return 0;
    for (size_t i = 0; i < l.n && ok; i++) {
        char *p = pln_xasprintf("%s/%s", dir, l.v[i]);
        ok = lstat(p, &st) == 0 && S_ISREG(st.st_mode);
        free(p);
    }
    for (size_t i = 0; i < l.n && ok; i++) {   /* the marker last: a run stopped half-way is found again */
        if (!strcmp(l.v[i], PLN_TMP_MARKER)) continue;
        char *p = pln_xasprintf("%s/%s", dir, l.v[i]);
        ok = unlink(p) == 0;
        free(p);
    }
    names_free(&l);
    if (!ok) return 0;
    char *marker = pln_xasprintf("%s/%s", dir, PLN_TMP_MARKER);
    unlink(marker);
    free(marker);
    return rmdir(dir) == 0;
}

static void remove_stale_siblings(const char *final_path) {
    char *parent = parent_dir(final_path), *base = base_of(final_path);
    DIR *d = opendir(parent);
    name_list found = {0};
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (tmp_name_pid(e->d_name, base) > 0) {
                found.v = pln_xrealloc(found.v, (found.n + 1) * sizeof *found.v);
                found.v[found.n++] = pln_xstrdup(e->d_name);
            }
        closedir(d);
    }
    for (size_t i = 0; i < found.n; i++) {
        long pid = tmp_name_pid(found.v[i], base);
        char *p = pln_xasprintf("%s/%s", parent, found.v[i]);
        if (pid != (long)getpid() && remove_if_stale(p, pid))
            fprintf(stderr, "pollen: removed %s, a temporary output left by process %ld, which no longer runs\n", p, pid);
        free(p);
    }
    names_free(&found);
    free(parent);
    free(base);
}

static char *outdir_begin(const char *final_path, bool force) {
    struct stat st;
    if (lstat(final_path, &st) == 0) {
        if (S_ISLNK(st.st_mode)) {
            pln_errorf("%s: is a symbolic link; give the output directory itself, not a link to it", final_path);
            return NULL;
        }
        if (!S_ISDIR(st.st_mode)) {
            pln_errorf("%s: exists and is %s, not a directory", final_path, pln_file_type_name(st.st_mode));
            return NULL;
        }
        name_list l;
        if (list_dir(final_path, &l)) return NULL;
        if (l.n && !force) {
            char *what = describe(&l);
            pln_errorf("%s: exists and is not empty (holds %s); pass --force to replace an earlier pollen output",
                       final_path, what);
            free(what);
            names_free(&l);
            return NULL;
        }
        bool ok = !l.n || pollen_output_names(final_path, &l);
        names_free(&l);
        if (!ok) return NULL;
    }
    remove_stale_siblings(final_path);
    char *tmp = NULL;
    for (int attempt = 0; attempt < 100; attempt++) {
        tmp = pln_xasprintf("%s.tmp-%d-%d", final_path, (int)getpid(), attempt);
        if (mkdir(tmp, 0755) == 0) {
            pln_outdir_cleanup_on_signal(tmp);
            if (write_tmp_marker(tmp)) { pln_outdir_abort(tmp); free(tmp); return NULL; }
            return tmp;
        }
        int e = errno;
        free(tmp);
        if (e != EEXIST) { pln_errorf("%s: cannot create temporary directory beside it: %s", final_path, strerror(e)); return NULL; }
    }
    pln_errorf("%s: cannot create a temporary directory beside it", final_path);
    return NULL;
}

int pln_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return pln_errorf("%s: cannot open for fsync: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0 && e != EINVAL) return pln_errorf("%s: fsync failed: %s", path, strerror(e));
    return 0;
}

static int commit_renames(const char *tmp_path, const char *final_path) {
    char *marker = pln_xasprintf("%s/%s", tmp_path, PLN_TMP_MARKER);
    unlink(marker);   /* the output is whole: it is no longer a temporary one */
    free(marker);
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
    if (lstat(final_path, &st) == 0) {
        /* Replace: move the old one aside first so a crash never leaves neither. */
        char *old = pln_xasprintf("%s.old-%d", final_path, (int)getpid());
        if (rename(final_path, old) != 0) { int er = errno; free(old); return pln_errorf("%s: cannot move aside: %s", final_path, strerror(er)); }
        if (rename(tmp_path, final_path) != 0) {
            int er = errno;
            rename(old, final_path);
            free(old);
            return pln_errorf("%s: cannot rename into place: %s", final_path, strerror(er));
        }
        g_cleanup_path[0] = 0;
        if (remove_pollen_output(old))
            fprintf(stderr, "pollen: warning: the replaced output was left at %s: %s\n", old, pln_error());
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

int pln_outdir_commit(const char *tmp_path, const char *final_path) {
    char *t = trimmed(final_path);
    g_committing = 1;
    int rc = commit_renames(tmp_path, t);
    free(t);
    g_committing = 0;
    /* A signal that came during the renames: the handler runs now, with the output either fully
     * in place (nothing left to remove) or still only in tmp (removed). */
    if (g_pending_sig) raise(g_pending_sig);
    return rc;
}

void pln_outdir_abort(const char *tmp_path) {
    if (tmp_path) rm_rf(tmp_path);
    g_cleanup_path[0] = 0;
}

int pln_write_file_atomic(const char *path, const void *data, size_t n) {
    char *tmp = pln_xasprintf("%s.tmp-%d", path, (int)getpid());
    pln_tmpfile_cleanup_on_signal(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { int e = errno; pln_tmpfile_cleanup_on_signal(NULL); free(tmp); return pln_errorf("%s: cannot create: %s", path, strerror(e)); }
    const uint8_t *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd); unlink(tmp); pln_tmpfile_cleanup_on_signal(NULL); free(tmp);
            return pln_errorf("%s: write failed: %s", path, strerror(e));
        }
        p += w; left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) { int e = errno; unlink(tmp); pln_tmpfile_cleanup_on_signal(NULL); free(tmp); return pln_errorf("%s: fsync/close failed: %s", path, strerror(e)); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); pln_tmpfile_cleanup_on_signal(NULL); free(tmp); return pln_errorf("%s: rename failed: %s", path, strerror(e)); }
    pln_tmpfile_cleanup_on_signal(NULL); free(tmp);
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
    p->work_total = total;
    p->t0 = pln_now();
    p->enabled = !quiet && isatty(2);
}

void pln_progress_set_work(pln_progress *p, uint64_t total_work) { p->work_total = total_work; }

double pln_progress_eta(double elapsed, uint64_t done, uint64_t total) {
    if (!done || done >= total || !(elapsed > 0)) return 0;
    return elapsed * (double)(total - done) / (double)done;
}

static void progress_draw(pln_progress *p, bool final) {
    double t = pln_now() - p->t0;
    double frac = p->work_total ? (double)p->work_done / (double)p->work_total : 1.0;
    if (frac > 1) frac = 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    char a[32], b[32], r[32];
    double rate = t > 0 ? (double)p->done / t : 0;
    double eta = pln_progress_eta(t, p->work_done, p->work_total);
    fprintf(stderr, "\r%-10s [%s] %5.1f%%  %s / %s  %s/s  %s %3.0fs ", p->label, bar, 100 * frac,
            pln_human_bytes((double)p->done, a, sizeof a), pln_human_bytes((double)p->total, b, sizeof b),
            pln_human_bytes(rate, r, sizeof r), final ? "took" : "ETA", final ? t : eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

void pln_progress_add_work(pln_progress *p, uint64_t n, uint64_t work) {
    p->done += n;
    p->work_done += work;
    if (!p->enabled) return;
    double t = pln_now();
    if (t - p->last_draw < 0.1) return;
    p->last_draw = t;
    progress_draw(p, false);
}

void pln_progress_add(pln_progress *p, uint64_t n) { pln_progress_add_work(p, n, n); }

void pln_progress_done(pln_progress *p) {
    if (p->enabled) progress_draw(p, true);
}
