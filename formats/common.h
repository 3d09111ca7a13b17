/* common.h — what every pollen module shares: error reporting, dtypes, mapped files,
 * checked allocation and arithmetic, checksums, atomic output directories, progress bars.
 *
 * Error convention (NCCL/redis style): library functions return 0 (or a valid pointer) on
 * success and -1 (or NULL) on failure after recording a message with pln_errorf(); the caller
 * reads it with pln_error(). The message names the file, tensor or field and says what to do.
 * Tools may then pln_die(); the server runtime never dies on a request's error. */
#ifndef PLN_COMMON_H
#define PLN_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PLN_VERSION_STRING "0.1.0"

/* ---- errors ------------------------------------------------------------------------------ */
/* Records a message in thread-local storage and returns -1. Never fails. */
int pln_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefixes the current error message ("CONTEXT: previous message"); returns -1. */
int pln_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded on this thread ("" if none). Valid until the next pln_errorf. */
const char *pln_error(void);
/* For tools: prints "pollen: message" to stderr and exits 1. */
void pln_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Assertions that stay on in release builds, for invariants that must never break. */
#define PLN_ASSERT(x) do { if (!(x)) pln_die("%s:%d: assertion failed: %s", __FILE__, __LINE__, #x); } while (0)

/* ---- environment switches ------------------------------------------------------------- */
/* ENV_NOTE: pollen's documented environment switches (PLN_GRAPHS, PLN_CPU_INT_DOT, PLN_NCCL, ...)
 * are read through these, so a value they do not take is refused, naming the variable, instead
 * of read as off ("on" or "true" for a 0/1 switch had silently meant 0). Unset or empty leaves
 * the default the caller put in *out. */
/* A 0/1 switch: "0" or "1"; anything else -1 + pln_errorf. */
int pln_env_flag(const char *name, bool *out);
/* A whole number in [lo, hi]; anything else -1 + pln_errorf. */
int pln_env_long(const char *name, long lo, long hi, long *out);

/* ---- allocation (die on out-of-memory: only for sizes the program itself chose) ---------- */
void *pln_xmalloc(size_t n);
void *pln_xcalloc(size_t n, size_t size);
void *pln_xrealloc(void *p, size_t n);
char *pln_xstrdup(const char *s);
char *pln_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- checked arithmetic: return true on overflow ------------------------------------------ */
static inline bool pln_mul_overflow(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline bool pln_add_overflow(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out); }
static inline uint64_t pln_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- dtypes (names are the safetensors spellings) ----------------------------------------- */
typedef enum {
    PLN_DTYPE_F32 = 0, PLN_DTYPE_F16 = 1, PLN_DTYPE_BF16 = 2, PLN_DTYPE_F64 = 3,
    PLN_DTYPE_I8 = 4, PLN_DTYPE_U8 = 5, PLN_DTYPE_I16 = 6, PLN_DTYPE_I32 = 7,
    PLN_DTYPE_I64 = 8, PLN_DTYPE_BOOL = 9, PLN_DTYPE_COUNT
} pln_dtype;
/* Bytes per element; 0 for an invalid dtype. */
size_t pln_dtype_size(pln_dtype dt);
/* "F32", "F16", "BF16", ...; "?" for an invalid dtype. */
const char *pln_dtype_name(pln_dtype dt);
/* Parses a safetensors dtype name; -1 (with error) if unknown. */
int pln_dtype_from_name(const char *name, pln_dtype *out);
/* Converts n elements of src (F32/F16/BF16/F64/I8/...) to float. -1 if the dtype is not numeric. */
int pln_to_f32(pln_dtype dt, const void *src, float *dst, uint64_t n);

/* ---- tensors as found in a checkpoint or shard ------------------------------------------- */
#define PLN_MAX_DIMS 8
typedef struct {
    char *name;              /* owned; checkpoint readers give the name without "transformer." */
    pln_dtype dtype;
    int ndim;
    int64_t shape[PLN_MAX_DIMS];
    const uint8_t *data;     /* points into a mapping; NULL when only headers were read */
    uint64_t nbytes;
    const char *file;        /* file holding the data (borrowed) */
    uint64_t file_offset;    /* byte offset of the data in that file */
    bool contiguous;         /* false for strided PyTorch views (readers record, reshard refuses) */
} pln_tensor;
uint64_t pln_tensor_numel(const pln_tensor *t);
/* "[3, 64]" into buf. */
const char *pln_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

/* ---- opening files ------------------------------------------------------------------------- */
/* Every file pollen reads is opened here: the path is checked to be a regular file (a directory
 * with want_dir) before it is opened, then opened read-only with O_NONBLOCK (so a FIFO, a device or
 * a file swapped in between cannot block the open), checked again with fstat, and returned in
 * blocking mode (O_CLOEXEC). -1 with an error naming the path and what it is ("is a FIFO (named
 * pipe), not a regular file") otherwise. Devices are refused before any open(): opening one can
 * have effects. */
int pln_open_file(const char *path, bool want_dir);
/* 0 when path is a regular file pln_open_file would open; -1 with its error otherwise. */
int pln_check_file(const char *path);
/* "a FIFO (named pipe)", "a socket", "a character device", ... for a st_mode. */
const char *pln_file_type_name(unsigned mode);

/* ---- read-only file mappings -------------------------------------------------------------- */
typedef struct {
    char *path;
    int fd;
    const uint8_t *data;     /* NULL for an empty file */
    uint64_t size;
    bool in_memory;          /* read into anonymous memory (pln_map_set_no_mmap), not mapped */
} pln_map;
/* Maps path read-only (or, after pln_map_set_no_mmap(true), reads it whole into anonymous memory).
 * -1 with an error naming the path on failure.
 *
 * A mapped file that shrinks while mapped would kill the process with SIGBUS at the first access
 * past its new end. Every mapping is registered with a SIGBUS handler that names the file ("PATH
 * shrank while mapped"), removes a registered temporary output (pln_outdir_begin) and exits 1
 * without a core dump. The handler is (re)installed by each pln_map_open, so it wins over one an
 * MPI library installed at start-up. */
int pln_map_open(pln_map *m, const char *path);
/* --no-mmap: later pln_map_open calls read whole files into anonymous memory (read(2) at open time;
 * nothing can change under the process afterwards). Process-wide; for the runtime commands. */
void pln_map_set_no_mmap(bool on);
bool pln_map_no_mmap(void);
/* Words the SIGBUS message adds after "restart" (say, the command's --no-mmap); copied. */
void pln_map_fault_hint(const char *hint);
/* Asks the kernel to read the whole mapping ahead, in order (MADV_SEQUENTIAL, then MADV_WILLNEED). */
void pln_map_advise_sequential(pln_map *m);
/* Asks for 2 MiB pages on a file mapping (MADV_HUGEPAGE) before it is read: rank files, whose
 * weights are streamed by every decode step (common.c MAP_HUGE_NOTE). */
void pln_map_advise_huge(pln_map *m);
void pln_map_close(pln_map *m);
/* Reads a whole small file (config.json, index files) into a NUL-terminated buffer, refusing
 * files over max_bytes. NULL with an error on failure. */
char *pln_read_small_file(const char *path, size_t max_bytes, size_t *len_out);

/* ---- checksums ---------------------------------------------------------------------------- */
uint64_t pln_xxh3(const void *data, size_t n);
/* Parallel XXH3 over large buffers is not the same function; pln_xxh3 is the one and only
 * checksum of the shard format (see docs/FORMAT.md). */

/* ---- atomic output directories ------------------------------------------------------------ */
/* The marker `pollen synth` writes into its checkpoints, so --force knows one as pollen's own. */
#define PLN_SYNTH_MARKER "pollen-synth.json"
/* Refuses (-1 + error) an output path that could touch one of the n paths in protect (the
 * sources of the command): out being one of them, an ancestor of one (replacing out would remove
 * it), or inside one that is a directory. Real paths are compared by device and inode of every
 * ancestor, so symlinks, "..", relative spellings and bind mounts are all seen through. Entries
 * that do not exist, or are NULL, are skipped. An out that is itself a symbolic link is refused
 * (replacing it would replace the link, not what it points to). Call before writing anything. */
int pln_path_guard(const char *out, const char *const *protect, int n);
/* Creates a temporary sibling "FINAL.tmp-PID-N" to write into (holding the marker ".pollen-tmp"
 * until the commit) and registers it for removal on every terminating signal and SIGBUS (SIGXFSZ
 * is ignored so an over-limit write fails instead). First removes the temporary siblings of FINAL
 * that a process no longer running on this host left (its marker says so; only plain files in
 * it), saying so on stderr. An existing FINAL must be a directory; a non-empty one is refused
 * unless force, and even with force only an earlier pollen output is replaced: a shard set (its
 * manifest.json says "pollen-shards") or a `pollen synth` checkpoint (PLN_SYNTH_MARKER), holding
 * only the files pollen writes. Anything else is refused with what it holds (a few names and a
 * count). Returns the temporary path (owned) or NULL with an error. */
char *pln_outdir_begin(const char *final_path, bool force);
/* fsyncs every file in tmp and the directory, replaces FINAL and fsyncs the parent. An old FINAL
 * is moved aside, and only the files pollen writes are deleted from it (never anything else: an
 * old directory that gained other files is left as FINAL.old-PID, with a warning). Signals wait
 * until the renames are done. -1 with an error on failure (tmp is then left for
 * pln_outdir_abort). */
int pln_outdir_commit(const char *tmp_path, const char *final_path);
/* Removes the temporary directory and everything in it. Never fails. */
void pln_outdir_abort(const char *tmp_path);
/* Registers tmp_path (or, NULL, nothing) for removal if the process gets a terminating signal
 * (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1/2, SIGALRM, SIGXCPU, ...) before
 * commit/abort: the handler writes why, removes it with async-signal-safe calls and dies of the
 * signal. pln_outdir_begin already does this. */
void pln_outdir_cleanup_on_signal(const char *tmp_path);
/* Registers one temporary file (or, NULL, none) for removal by the same handlers: a single-file
 * writer's "PATH.tmp-PID" while it is written (pln_write_file_atomic does this itself). */
void pln_tmpfile_cleanup_on_signal(const char *tmp_file);
/* For commands with no output directory: every terminating signal prints "pollen WHO: interrupted
 * by SIGTERM", removes a registered temporary file and ends the process by that signal at any
 * phase; SIGXFSZ is ignored. who is copied. */
void pln_exit_on_signal(const char *who);
/* fsync a path (file or directory). */
int pln_fsync_path(const char *path);
/* Writes a whole file atomically (tmp + fsync + rename). */
int pln_write_file_atomic(const char *path, const void *data, size_t n);
/* Copies src to dst (used to carry config.json / tokenizer.json). */
int pln_copy_file(const char *src, const char *dst);

/* ---- time and progress -------------------------------------------------------------------- */
double pln_now(void);   /* monotonic seconds */
typedef struct {
    const char *label;
    uint64_t total, done;            /* bytes: what the bar prints, and the rate */
    uint64_t work_total, work_done;  /* what the bar's fill and the ETA count (bytes unless set) */
    double t0, last_draw;
    bool enabled;          /* false when quiet or stderr is not a terminal */
} pln_progress;
/* Enabled only when !quiet and stderr is a terminal. */
void pln_progress_init(pln_progress *p, const char *label, uint64_t total_bytes, bool quiet);
/* Makes the fill and the ETA count units of work instead of bytes (a job whose bytes cost
 * unequal time: reshard's fp16 copy against its int4 search); total_work as init's bytes. */
void pln_progress_set_work(pln_progress *p, uint64_t total_work);
/* Adds n bytes (and n units of work); redraws at most 10 times a second: bar, bytes, rate, ETA.
 * Thread-safe enough for one updater; call from one thread. */
void pln_progress_add(pln_progress *p, uint64_t n);
/* Adds n bytes that cost `work` units (after pln_progress_set_work). */
void pln_progress_add_work(pln_progress *p, uint64_t n, uint64_t work);
/* Seconds left when `done` of `total` units took `elapsed` seconds, at the same pace; 0 before
 * any progress and once done reaches total. */
double pln_progress_eta(double elapsed, uint64_t done, uint64_t total);
void pln_progress_done(pln_progress *p);
/* "1.23 GB" */
const char *pln_human_bytes(double bytes, char *buf, size_t len);

#endif
