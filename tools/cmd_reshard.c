/* cmd_reshard.c — `pollen reshard SRC -o OUT --tp N --dtype fp16|int8|int4`: converts a Hugging Face
 * checkpoint into a shard set of its family's layout (formats/family.h; BLOOM: "bloom-tp-v1"),
 * streaming, in bounded memory, atomically.
 *
 * Order of work (how "written in kernel order" and "read once" hold together): every rank file
 * holds the same sequence of tensors (formats/tp.h), one per source tensor (plus int8 scales).
 * So the source tensors are visited once, in that sequence, and while a tensor is hot every
 * rank's slice of it is produced and appended to that rank's file: each rank file is written
 * front to back in kernel order, each source tensor is read once, front to back in row chunks.
 *   - row-split tensors (embedding, query_key_value, dense_h_to_4h and their biases): rank 0's
 *     rows, then rank 1's, ... — the source is read strictly sequentially;
 *   - column-split tensors (dense, dense_4h_to_h): each chunk of rows is cut into every rank's
 *     columns while it is in memory;
 *   - replicated tensors: converted once, the same bytes appended to every rank.
 * Reads are sequential inside each tensor; between tensors they jump within a file because HF
 * files order tensors by name, not by layer position (big contiguous runs either way).
 *
 * Memory: the source is mmapped; a chunk's pages are prefetched (MADV_WILLNEED) two chunks
 * ahead and dropped from this process (MADV_DONTNEED: the page cache keeps them, RSS does not)
 * once converted. Output goes through a fixed pool of 8 MiB page-aligned buffers to writer threads
 * (one per rank file, up to 8) that append them (checksumming as they go) while the next chunk is
 * converted on all cores. The writers use O_DIRECT where the file system takes it (formats/shard.c):
 * the disk reads the pool buffers directly, so no CPU time goes into copying the output into the
 * page cache; chunks are whole 4096-byte blocks so that path needs no staging copy. Peak memory is
 * the pool plus per-tensor int8 scales, whatever the model size. */
#include "formats/common.h"
#include "formats/family.h"
#include "formats/hf.h"
#include "formats/shard.h"
#include "formats/tp.h"
#include "kernels/pln_math.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define RS_BUF_BYTES (8u << 20)   /* one output chunk; a row of the largest allowed tensor fits */
#define RS_MAX_WRITERS 8           /* writer threads (one per rank file, up to this many) */
#define RS_MAX_BUFS (4 + 2 * RS_MAX_WRITERS)  /* converting some while the writers drain others */
#define RS_SCALE_LIMIT (512ull << 20)  /* int8 scales kept for one tensor, all ranks */
#define RS_QROWS 4                 /* int8 rows quantized together (pln_tp_quant_rows) */
#define RS_ALIGN 4096u             /* buffer alignment and chunk granularity for O_DIRECT writes */

/* ---- the writer thread ---- */
typedef struct {
    uint8_t *data;
    size_t n;
    int refs;
} rs_buf;

typedef enum { RS_OP_BEGIN, RS_OP_WRITE, RS_OP_END, RS_OP_STOP } rs_op_kind;
typedef struct rs_op {
    rs_op_kind kind;
    int rank;
    const char *name;
    rs_buf *buf;           /* WRITE from the pool (released after), or NULL */
    void *owned;           /* WRITE of a malloc'd block (freed after) */
    size_t n;
    struct rs_op *next;
} rs_op;

/* One writer thread per rank file (up to RS_MAX_WRITERS; rank r goes to writer r % n): page-cache
 * copies and checksums of different files proceed in parallel, each file's appends stay in order. */
typedef struct {
    pthread_t thread;
    pthread_cond_t cv;
    rs_op *head, *tail;
    struct rs_pipe *pipe;
} rs_writer;

typedef struct rs_pipe {
    pthread_mutex_t mu;            /* guards the queues, the pool and the failure state */
    pthread_cond_t cv_buf;
    rs_writer thr[RS_MAX_WRITERS];
    int n_thr;
    rs_buf bufs[RS_MAX_BUFS];
    rs_buf *free_bufs[RS_MAX_BUFS];
    int n_bufs, n_free;
    pln_shard_writer **writers;
    bool failed;
    char err[1024];
    uint64_t written, fail_after;   /* fault injection: PLN_FAULT_ENOSPC_AFTER bytes (all files) */
    unsigned delay_ms;              /* fault injection: PLN_FAULT_DELAY_MS per write (a slow disk) */
} rs_pipe;

static void pipe_release(rs_pipe *p, rs_buf *b) {
    pthread_mutex_lock(&p->mu);
    if (--b->refs == 0) {
        p->free_bufs[p->n_free++] = b;
        pthread_cond_broadcast(&p->cv_buf);
    }
    pthread_mutex_unlock(&p->mu);
}

static void pipe_fail(rs_pipe *p, const char *msg) {
    pthread_mutex_lock(&p->mu);
    if (!p->failed) snprintf(p->err, sizeof p->err, "%s", msg);
    p->failed = true;
    pthread_cond_broadcast(&p->cv_buf);
    pthread_mutex_unlock(&p->mu);
}

static void *writer_main(void *arg) {
    rs_writer *t = arg;
    rs_pipe *p = t->pipe;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!t->head) pthread_cond_wait(&t->cv, &p->mu);
        rs_op *op = t->head;
        t->head = op->next;
        if (!t->head) t->tail = NULL;
        bool failed = p->failed;
        pthread_mutex_unlock(&p->mu);
        if (op->kind == RS_OP_STOP) { free(op); return NULL; }
        int rc = 0;
        if (!failed) {
            pln_shard_writer *w = p->writers[op->rank];
            if (op->kind == RS_OP_BEGIN) rc = pln_shard_writer_begin(w, op->name, NULL);
            else if (op->kind == RS_OP_END) rc = pln_shard_writer_end(w);
            else {
                const void *d = op->buf ? (const void *)op->buf->data : op->owned;
                if (p->delay_ms) usleep(p->delay_ms * 1000u);
                uint64_t before = __atomic_fetch_add(&p->written, (uint64_t)op->n, __ATOMIC_RELAXED);
                if (p->fail_after && before + op->n > p->fail_after)
                    rc = pln_errorf("rank-%d: write failed: %s (PLN_FAULT_ENOSPC_AFTER)", op->rank, strerror(ENOSPC));
                else
                    rc = pln_shard_writer_write(w, d, op->n);
            }
            if (rc) pipe_fail(p, pln_error());
        }
        if (op->buf) pipe_release(p, op->buf);
        free(op->owned);
        free(op);
    }
}

static void pipe_push(rs_pipe *p, rs_op_kind kind, int rank, const char *name, rs_buf *buf, void *owned, size_t n) {
    rs_op *op = pln_xcalloc(1, sizeof *op);
    op->kind = kind; op->rank = rank; op->name = name; op->buf = buf; op->owned = owned; op->n = n;
    rs_writer *t = &p->thr[rank % p->n_thr];
    pthread_mutex_lock(&p->mu);
    if (t->tail) t->tail->next = op; else t->head = op;
    t->tail = op;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&p->mu);
}

/* A free pool buffer with refs references, or NULL once a writer has failed. */
static double g_wait_s;  /* time the converter waited for a free buffer (PLN_RESHARD_TIMING) */
static rs_buf *pipe_acquire(rs_pipe *p, int refs) {
    double t0 = pln_now();
    pthread_mutex_lock(&p->mu);
    while (!p->n_free && !p->failed) pthread_cond_wait(&p->cv_buf, &p->mu);
    rs_buf *b = p->failed ? NULL : p->free_bufs[--p->n_free];
    if (b) b->refs = refs;
    pthread_mutex_unlock(&p->mu);
    g_wait_s += pln_now() - t0;
    return b;
}

static bool pipe_failed(rs_pipe *p) {
    pthread_mutex_lock(&p->mu);
    bool f = p->failed;
    pthread_mutex_unlock(&p->mu);
    return f;
}

static void *rs_alloc_aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, RS_ALIGN, n ? n : RS_ALIGN)) pln_die("out of memory (%zu bytes)", n);
    return p;
}

static void pipe_start(rs_pipe *p, pln_shard_writer **writers, int tp) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_buf, NULL);
    p->n_thr = tp < RS_MAX_WRITERS ? tp : RS_MAX_WRITERS;
    p->n_bufs = 4 + 2 * p->n_thr;
    for (int i = 0; i < p->n_bufs; i++) {
        /* page-aligned, so O_DIRECT writers take them as they are (formats/shard.h) */
        p->bufs[i].data = rs_alloc_aligned(RS_BUF_BYTES);
        p->free_bufs[p->n_free++] = &p->bufs[i];
    }
    p->writers = writers;
    const char *f = getenv("PLN_FAULT_ENOSPC_AFTER");
    if (f) p->fail_after = strtoull(f, NULL, 10);
    const char *dl = getenv("PLN_FAULT_DELAY_MS");
    if (dl) p->delay_ms = (unsigned)strtoul(dl, NULL, 10);
    for (int i = 0; i < p->n_thr; i++) {
        p->thr[i].pipe = p;
        pthread_cond_init(&p->thr[i].cv, NULL);
        if (pthread_create(&p->thr[i].thread, NULL, writer_main, &p->thr[i])) pln_die("cannot start a writer thread");
    }
}

/* Drains the queues and joins; returns -1 with the first writer error if one failed. */
static int pipe_stop(rs_pipe *p) {
    for (int i = 0; i < p->n_thr; i++) pipe_push(p, RS_OP_STOP, i, NULL, NULL, NULL, 0);
    for (int i = 0; i < p->n_thr; i++) {
        pthread_join(p->thr[i].thread, NULL);
        pthread_cond_destroy(&p->thr[i].cv);
    }
    for (int i = 0; i < p->n_bufs; i++) free(p->bufs[i].data);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_buf);
    if (p->failed) return pln_errorf("%s", p->err);
    return 0;
}

/* ---- per-tensor statistics (manifest and summary) ---- */
typedef struct {
    const pln_tp_entry *e0;    /* rank 0's entry */
    const pln_tensor *src;
    uint64_t clamped;
    bool quant;
    pln_tp_qerr qerr;
} rs_stat;

/* ---- conversion of one chunk ---- */
typedef struct {
    const pln_tp_entry *e;     /* this rank's entry */
    const pln_tp_src *src;     /* its source tensor(s) */
    uint16_t *scales;          /* this rank's scale buffer (int8), [shape0, shape1/group] */
    uint64_t clamped, nonfinite;
    pln_tp_qerr *row_err;      /* scratch, one per row of the chunk */
} rs_job;

/* Converts local rows [lr0, lr0+nr) of the entry (rows >= e->rows are zero padding) into out. */
static void convert_rows(rs_job *j, int64_t lr0, int64_t nr, uint8_t *out) {
    const pln_tp_entry *e = j->e;
    const pln_tensor *t = j->src->t[0];
    int64_t cols = e->cols;
    bool quant = pln_tp_is_quant(e), i4 = e->transform == PLN_TP_QUANT_I4;
    int64_t ngroups = quant ? cols / e->group : 0;
    size_t out_row = pln_tp_row_bytes(e);
    uint64_t clamped = 0, nonfinite = 0;
    for (int64_t i = 0; i < nr; i++) j->row_err[i] = (pln_tp_qerr){0};
    /* small tensors stay on this thread: waking the team costs more than the work */
#pragma omp parallel reduction(+ : clamped, nonfinite) if (nr * cols >= 65536)
    {
        if (!quant) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < nr; i++) {
                int64_t lr = lr0 + i;
                uint8_t *o = out + (size_t)i * out_row;
                if (lr >= e->rows) { memset(o, 0, out_row); continue; }  /* vocabulary padding */
                const uint8_t *s = pln_tp_src_row(e, j->src, lr);
                pln_tp_to_f16(t->dtype, s, (uint16_t *)o, (size_t)cols, &clamped, &nonfinite);
            }
        } else {
            /* int8/int4: blocks of RS_QROWS rows, quantized together (pln_tp_quant_rows: same results
             * as row by row, several times faster) */
            float *tmp = pln_xmalloc((size_t)RS_QROWS * (size_t)cols * sizeof(float));
            int64_t nblocks = (nr + RS_QROWS - 1) / RS_QROWS;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nblocks; b++) {
                int64_t i0 = b * RS_QROWS, n = nr - i0 < RS_QROWS ? nr - i0 : RS_QROWS, real = 0;
                for (int64_t k = 0; k < n; k++) {
                    int64_t lr = lr0 + i0 + k;
                    if (lr >= e->rows) { /* vocabulary padding (always the last rows): zero rows, scale 1 */
                        memset(out + (size_t)(i0 + k) * out_row, i4 ? 0x88 : 0, out_row);   /* int4 zero: nibble 8 */
                        for (int64_t g = 0; g < ngroups; g++) j->scales[lr * ngroups + g] = 0x3c00;
                        continue;
                    }
                    const uint8_t *s = pln_tp_src_row(e, j->src, lr);
                    pln_tp_to_f32(t->dtype, s, tmp + (size_t)k * (size_t)cols, (size_t)cols, &nonfinite);
                    real = k + 1;
                }
                if (i4)   /* the scale search dominates; rows are independent */
                    for (int64_t k = 0; k < real; k++)
                        pln_tp_quant_row_i4(tmp + (size_t)k * (size_t)cols, cols, e->group, PLN_TP_I4_SEARCH,
                                            out + (size_t)(i0 + k) * out_row, j->scales + (lr0 + i0 + k) * ngroups,
                                            &j->row_err[i0 + k]);
                else
                    pln_tp_quant_rows(tmp, (size_t)cols, real, cols, e->group, (int8_t *)(out + (size_t)i0 * out_row),
                                      j->scales + (lr0 + i0) * ngroups, &j->row_err[i0]);
            }
            free(tmp);
        }
    }
    j->clamped += clamped;
    j->nonfinite += nonfinite;
}

/* The page-aligned span of source rows [r0, r1) (all columns) inside the mapping. */
static void src_span(const pln_tensor *t, int64_t r0, int64_t r1, uint8_t **a, size_t *len) {
    size_t row = (size_t)(t->ndim == 2 ? t->shape[1] : 1) * pln_dtype_size(t->dtype);
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t s = (uintptr_t)(t->data + (size_t)r0 * row), e = (uintptr_t)(t->data + (size_t)r1 * row);
    uintptr_t lo = s / pg * pg, hi = (e + pg - 1) / pg * pg;
    *a = (uint8_t *)lo;
    *len = hi > lo ? (size_t)(hi - lo) : 0;
}

static void src_prefetch(const pln_tensor *t, int64_t r0, int64_t r1) {
    int64_t rows = t->shape[0];
    if (r0 >= rows) return;
    if (r1 > rows) r1 = rows;
    uint8_t *a; size_t len;
    src_span(t, r0, r1, &a, &len);
    if (len) madvise(a, len, MADV_WILLNEED);
}

/* Drops converted rows from this process (not from the page cache): keeps RSS bounded. A page
 * shared with the neighbour tensor may be dropped early; it then faults in again from cache. */
static void src_release(const pln_tensor *t, int64_t r0, int64_t r1) {
    uint8_t *a; size_t len;
    src_span(t, r0, r1, &a, &len);
    if (len) madvise(a, len, MADV_DONTNEED);
}

/* ---- the conversion ---- */
typedef struct {
    int tp;
    pln_tp_entry **plans;      /* [tp] */
    size_t n;
    pln_tp_src *srcs;          /* [n] by entry index (rank-independent) */
    rs_stat *stats;            /* [n] */
    rs_pipe pipe;
    pln_progress progress;
} rs_ctx;

static uint64_t rs_gcd(uint64_t a, uint64_t b) {
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}

static int64_t chunk_rows(const pln_tp_entry *e) {
    size_t row = pln_tp_row_bytes(e);
    int64_t k = (int64_t)(RS_BUF_BYTES / row);
    PLN_ASSERT(k >= 1);
    /* Chunks of whole 4096-byte blocks where the row size allows: an O_DIRECT writer then sends
     * every chunk but a tensor's last straight from the pool buffer (no staging copy). */
    int64_t step = (int64_t)(RS_ALIGN / rs_gcd(row, RS_ALIGN));
    if (k >= step) k = k / step * step;
    return k;
}

/* Finishes a tensor's error statistics and checks it was clean. */
static int tensor_done(rs_ctx *c, size_t i, rs_job *jobs, int njobs) {
    rs_stat *st = &c->stats[i];
    uint64_t nonfinite = 0;
    for (int r = 0; r < njobs; r++) { st->clamped += jobs[r].clamped; nonfinite += jobs[r].nonfinite; }
    if (nonfinite)
        return pln_errorf("%s: tensor %s holds %llu NaN/infinite values; the source checkpoint is corrupt",
                          st->src->file ? st->src->file : "source", st->src->name, (unsigned long long)nonfinite);
    return 0;
}

static void merge_rows(rs_stat *st, const pln_tp_qerr *row_err, int64_t nr) {
    for (int64_t i = 0; i < nr; i++) pln_tp_qerr_merge(&st->qerr, &row_err[i]);
}

/* Converts entry index i (a source tensor) for every rank. */
static int convert_tensor(rs_ctx *c, size_t i) {
    const pln_tp_entry *e0 = &c->plans[0][i];
    const pln_tensor *t = c->srcs[i].t[0];
    int tp = c->tp;
    bool quant = pln_tp_is_quant(e0);
    rs_stat *st = &c->stats[i];
    st->e0 = e0; st->src = t; st->quant = quant;
    int64_t k = chunk_rows(e0);
    size_t esz = pln_dtype_size(t->dtype);
    uint64_t work = pln_tp_work_per_byte(e0);   /* the progress bar's units per source byte */
    rs_job jobs[tp];
    memset(jobs, 0, sizeof jobs);
    uint64_t scale_bytes = 0;
    /* a chunk never holds more rows than the tensor (a bias's chunk of 8 MiB would be 4M rows, and
     * their error slots 128 MiB per rank) */
    int64_t kerr = k < e0->rows + e0->pad_rows ? k : e0->rows + e0->pad_rows;
    for (int r = 0; r < tp; r++) {
        jobs[r].e = &c->plans[r][i];
        jobs[r].src = &c->srcs[i];
        jobs[r].row_err = pln_xmalloc((size_t)(kerr > 0 ? kerr : 1) * sizeof(pln_tp_qerr));
        if (quant) {
            uint64_t nb = pln_tp_entry_nbytes(&c->plans[r][i + 1]);
            scale_bytes += nb;
            if (scale_bytes > RS_SCALE_LIMIT) {
                for (int q = 0; q <= r; q++) { free(jobs[q].row_err); free(jobs[q].scales); }
                return pln_errorf("%s: --group-size %lld gives %llu MB of scales for one tensor; use a larger group",
                                  e0->source, (long long)e0->group, (unsigned long long)(scale_bytes >> 20));
            }
            jobs[r].scales = rs_alloc_aligned(nb);  /* handed to the writer whole: aligned for O_DIRECT */
        }
    }
    int rc = 0;
    size_t row_out = pln_tp_row_bytes(e0);
    if (e0->split == PLN_TP_SPLIT_ROWS) {
        /* Every rank's next chunk in turn, so every writer thread (one per rank file) has work
         * at once (one rank after the other left all but one writer idle, and a single O_DIRECT
         * stream does not keep the disk busy). Each rank's rows are still read front to back: tp
         * sequential streams through the source. The int8 error statistics are merged at the end
         * rank after rank, row by row: the same order, hence the same sums, as before. */
        int64_t total = e0->rows + e0->pad_rows;   /* the same for every rank */
        pln_tp_qerr *errs = quant ? pln_xcalloc((size_t)tp * (size_t)total, sizeof *errs) : NULL;
        for (int r = 0; r < tp; r++) pipe_push(&c->pipe, RS_OP_BEGIN, r, jobs[r].e->name, NULL, NULL, 0);
        for (int64_t lr = 0; lr < total && !rc; lr += k) {
            int64_t nr = total - lr < k ? total - lr : k;
            for (int r = 0; r < tp; r++) {
                const pln_tp_entry *e = jobs[r].e;
                if (!e->n_segs) src_prefetch(t, e->row0 + lr + k, e->row0 + lr + 3 * k);
                rs_buf *b = pipe_acquire(&c->pipe, 1);
                if (!b) { rc = -1; break; }
                pln_tp_qerr *scratch = jobs[r].row_err;
                if (quant) jobs[r].row_err = errs + (size_t)r * (size_t)total + lr;
                convert_rows(&jobs[r], lr, nr, b->data);
                jobs[r].row_err = scratch;
                pipe_push(&c->pipe, RS_OP_WRITE, r, NULL, b, NULL, (size_t)nr * row_out);
                int64_t real = lr >= e->rows ? 0 : (e->rows - lr < nr ? e->rows - lr : nr);
                if (real && !e->n_segs) src_release(t, e->row0 + lr, e->row0 + lr + real);
                uint64_t nb = (uint64_t)real * (uint64_t)e->cols * esz;
                pln_progress_add_work(&c->progress, nb, nb * work);
            }
        }
        for (int r = 0; r < tp && !rc; r++) pipe_push(&c->pipe, RS_OP_END, r, NULL, NULL, NULL, 0);
        /* a fused tensor's sources, read rank by rank in pieces, are dropped once all ranks have theirs */
        for (int g = 0; g < e0->n_segs; g++) src_release(c->srcs[i].t[g], 0, c->srcs[i].t[g]->shape[0]);
        if (quant && !rc)
            for (int r = 0; r < tp; r++) merge_rows(st, errs + (size_t)r * (size_t)total, total);
        free(errs);
    } else {
        /* Columns split or replicated: every rank takes a part of (or all of) each chunk. */
        for (int r = 0; r < tp; r++) pipe_push(&c->pipe, RS_OP_BEGIN, r, jobs[r].e->name, NULL, NULL, 0);
        int64_t rows = e0->rows;
        for (int64_t lr = 0; lr < rows && !rc; lr += k) {
            int64_t nr = rows - lr < k ? rows - lr : k;
            src_prefetch(t, lr + k, lr + 3 * k);
            if (e0->split == PLN_TP_SPLIT_NONE) {
                rs_buf *b = pipe_acquire(&c->pipe, tp);
                if (!b) { rc = -1; break; }
                convert_rows(&jobs[0], lr, nr, b->data);
                merge_rows(st, jobs[0].row_err, nr);
                for (int r = 0; r < tp; r++) pipe_push(&c->pipe, RS_OP_WRITE, r, NULL, b, NULL, (size_t)nr * row_out);
                if (quant) for (int r = 1; r < tp; r++)
                    memcpy(jobs[r].scales + lr * (e0->cols / e0->group), jobs[0].scales + lr * (e0->cols / e0->group),
                           (size_t)nr * (size_t)(e0->cols / e0->group) * 2);
            } else {
                for (int r = 0; r < tp; r++) {
                    rs_buf *b = pipe_acquire(&c->pipe, 1);
                    if (!b) { rc = -1; break; }
                    convert_rows(&jobs[r], lr, nr, b->data);
                    merge_rows(st, jobs[r].row_err, nr);
                    pipe_push(&c->pipe, RS_OP_WRITE, r, NULL, b, NULL, (size_t)nr * row_out);
                }
            }
            src_release(t, lr, lr + nr);
            uint64_t nb = (uint64_t)nr * (uint64_t)e0->src_shape[1] * esz;
            pln_progress_add_work(&c->progress, nb, nb * work);
        }
        for (int r = 0; r < tp && !rc; r++) pipe_push(&c->pipe, RS_OP_END, r, NULL, NULL, NULL, 0);
    }
    if (!rc && quant) {
        for (int r = 0; r < tp; r++) {
            const pln_tp_entry *se = &c->plans[r][i + 1];
            pipe_push(&c->pipe, RS_OP_BEGIN, r, se->name, NULL, NULL, 0);
            pipe_push(&c->pipe, RS_OP_WRITE, r, NULL, NULL, jobs[r].scales, pln_tp_entry_nbytes(se));
            jobs[r].scales = NULL;  /* the writer frees it */
            pipe_push(&c->pipe, RS_OP_END, r, NULL, NULL, NULL, 0);
        }
    }
    if (!rc) rc = tensor_done(c, i, jobs, tp);
    else rc = -1;
    for (int r = 0; r < tp; r++) { free(jobs[r].row_err); free(jobs[r].scales); }
    return rc;
}

/* ---- manifest extras ---- */
static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static json_t *source_json(const pln_ckpt *ck, const char *src_path) {
    json_t *files = json_array();
    uint64_t total = 0;
    for (int i = 0; i < ck->n_files; i++) {
        struct stat sb;
        uint64_t sz = stat(ck->files[i], &sb) == 0 ? (uint64_t)sb.st_size : 0;
        total += sz;
        json_array_append_new(files, json_pack("{s:s, s:I}", "name", base_name(ck->files[i]), "size", (json_int_t)sz));
    }
    /* The dtype most of the weight bytes are stored in. */
    uint64_t by[PLN_DTYPE_COUNT] = {0};
    for (int64_t i = 0; i < ck->n_tensors; i++)
        if ((unsigned)ck->tensors[i].dtype < PLN_DTYPE_COUNT) by[ck->tensors[i].dtype] += ck->tensors[i].nbytes;
    int best = 0;
    for (int d = 1; d < PLN_DTYPE_COUNT; d++) if (by[d] > by[best]) best = d;
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:I}", "path", src_path, "format", ck->format ? ck->format : "?",
                     "dtype", pln_dtype_name((pln_dtype)best), "torch_dtype", ck->config.torch_dtype,
                     "files", files, "total_bytes", (json_int_t)total);
}

static json_t *tensors_json(const rs_ctx *c) {
    json_t *o = json_object();
    for (size_t i = 0; i < c->n; i++) {
        const rs_stat *s = &c->stats[i];
        if (!s->e0) continue;
        json_t *shape = json_array();
        for (int d = 0; d < s->src->ndim; d++) {
            int64_t v = s->src->shape[d];   /* a fused tensor: its sources stacked */
            if (d == 0 && s->e0->n_segs) { v = 0; for (int k = 0; k < s->e0->n_segs; k++) v += s->e0->segs[k].src_rows; }
            json_array_append_new(shape, json_integer(v));
        }
        json_t *t = json_pack("{s:s, s:o, s:s, s:I}", "source_dtype", pln_dtype_name(s->src->dtype), "shape", shape,
                              "transform", !s->quant ? "fp16" : s->e0->transform == PLN_TP_QUANT_I4 ? "int4" : "int8",
                              "clamped", (json_int_t)s->clamped);
        if (s->quant) {
            json_object_set_new(t, "quant_rel_rms", json_real(pln_tp_qerr_rel_rms(&s->qerr)));
            json_object_set_new(t, "quant_max_abs", json_real(s->qerr.max_abs));
            json_object_set_new(t, "group", json_integer(s->e0->group));
        }
        json_object_set_new(o, s->e0->source, t);
    }
    return o;
}

/* ---- command ---- */
int cmd_reshard(int argc, char **argv) {
    const char *out = NULL, *dtype = NULL, *src_path = NULL;
    pln_tp_opts o = {.tp = 0};
    bool force = false, quiet = false, stats = false;
    int threads = 0;
    pln_opt opts[] = {
        PLN_O_POS("CHECKPOINT", src_path, "the checkpoint", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("output", 'o', out, "SET", "shard set directory to create (appears atomically)", .flags = PLN_OPT_REQUIRED),
        PLN_O_INT("tp", 0, o.tp, 1, 4096, "N", "tensor-parallel size (must divide n_head)", .flags = PLN_OPT_REQUIRED),
        PLN_O_ENUM("dtype", 0, dtype, "fp16|int8|int4", "int8/int4: weight-only for the four linear weights of every layer",
                   .flags = PLN_OPT_REQUIRED),
        PLN_O_INT("group-size", 0, o.group_size, 1, 1 << 30, "G",
                  "one scale per G input columns; int8: default per output channel; int4: 32, 64 or 128 (default 128)"),
        PLN_O_FLAG("quantize-embedding", 0, o.quantize_embedding, "int8 word embeddings too (with int8 or int4)"),
        PLN_O_FLAG("force", 'f', force, "replace an earlier pollen output (a shard set or a synth checkpoint) at SET"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "conversion threads (default: all cores)"),
        PLN_O_FLAG("stats", 0, stats, "print the per-tensor table (clamped values; int8/int4: quantization error) on stdout"),
        PLN_O_FLAG("quiet", 'q', quiet, "no progress bar, no summary (warnings that change the set still show)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "reshard", .synopsis = "pollen reshard CHECKPOINT -o SET --tp N --dtype fp16|int8|int4 [options]",
                       .intro = "  CHECKPOINT: a Hugging Face checkpoint of a supported family (dir, .safetensors, .bin or index .json)\n",
                       .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    pln_cli_restart_with_passive_omp(argc, argv);
    if (!strcmp(dtype, "int8")) o.int8 = true;
    else if (!strcmp(dtype, "int4")) { o.int4 = true; if (!o.group_size) o.group_size = 128; }
    else if (strcmp(dtype, "fp16")) pln_die("--dtype %s: expected fp16, int8 or int4", dtype);
    if (o.group_size && !o.int8 && !o.int4) pln_die("--group-size needs --dtype int8 or int4");
    if (threads) omp_set_num_threads(threads);
    bool timing = false;   /* PLN_RESHARD_TIMING=1: where the time went (formats/common.h ENV_NOTE) */
    if (pln_env_flag("PLN_RESHARD_TIMING", &timing)) pln_die("%s", pln_error());
    double t0 = pln_now();

    pln_ckpt ck;
    if (pln_ckpt_open(&ck, src_path)) pln_die("%s", pln_error());
    if (!ck.has_config) pln_die("%s: no config.json beside the weights; reshard needs the model's config", src_path);
    const pln_family *fam = pln_family_of(&ck.config);
    if (fam->tp_check(&ck.config, &o)) pln_die("%s", pln_error());
    rs_ctx c = {.tp = o.tp};
    c.plans = pln_xcalloc((size_t)o.tp, sizeof *c.plans);
    for (int r = 0; r < o.tp; r++) {
        size_t n;
        if (fam->tp_plan(&ck.config, &o, r, &c.plans[r], &n)) pln_die("%s", pln_error());
        c.n = n;
    }
    c.srcs = pln_xcalloc(c.n, sizeof *c.srcs);
    c.stats = pln_xcalloc(c.n, sizeof *c.stats);
    if (pln_tp_find_sources(&ck, c.plans[0], c.n, c.srcs)) pln_die("%s", pln_error());
    /* Tensors the layout does not use: the tied lm_head is expected; anything else is worth a word. */
    /* The progress bar shows bytes read but fills (and estimates the time left) by work: an int4
     * byte costs several fp16 bytes, and the fp16 embedding comes first (pln_tp_work_per_byte). */
    uint64_t total_in = 0, total_work = 0;
    for (size_t i = 0; i < c.n; i++)
        if (c.plans[0][i].transform != PLN_TP_QUANT_SCALE)
            for (int k = 0; k < PLN_TP_MAX_SEGS && c.srcs[i].t[k]; k++) {
                total_in += c.srcs[i].t[k]->nbytes;
                total_work += c.srcs[i].t[k]->nbytes * pln_tp_work_per_byte(&c.plans[0][i]);
            }
    for (int64_t i = 0; i < ck.n_tensors; i++) {
        const char *nm = ck.tensors[i].name;
        if (!strcmp(nm, "lm_head.weight")) continue;
        bool used = false;
        for (size_t j = 0; j < c.n && !used; j++)
            for (int k = 0; k < PLN_TP_MAX_SEGS; k++) used |= c.srcs[j].t[k] == &ck.tensors[i];
        if (!used) fprintf(stderr, "pollen: warning: source tensor %s is not part of the %s layout; ignored\n", nm, fam->layout);
    }

    /* Nothing is written until the output is known not to touch any file the conversion reads:
     * the path given, the checkpoint's directory, every weight file, config.json, the tokenizer. */
    {
        int np = 0;
        const char **protect = pln_xcalloc((size_t)ck.n_files + 6, sizeof *protect);
        char *cfg_path = pln_xasprintf("%s/config.json", ck.dir);
        char *tc_path = pln_xasprintf("%s/tokenizer_config.json", ck.dir);
        char *ct_path = pln_xasprintf("%s/chat_template.jinja", ck.dir);
        protect[np++] = src_path;
        protect[np++] = ck.dir;
        protect[np++] = cfg_path;
        protect[np++] = ck.tokenizer_path;
        protect[np++] = tc_path;
        protect[np++] = ct_path;
        for (int i = 0; i < ck.n_files; i++) protect[np++] = ck.files[i];
        int grc = pln_path_guard(out, protect, np);
        free(cfg_path);
        free(tc_path);
        free(ct_path);
        free(protect);
        if (grc) pln_die("refusing to write the output: %s", pln_error());
    }
    /* Signals from here on: common.c's handler removes the temporary output and ends the process. */
    char *tmp = pln_outdir_begin(out, force);
    if (!tmp) pln_die("%s", pln_error());

    pln_shard_writer **writers = pln_xcalloc((size_t)o.tp, sizeof *writers);
    pln_manifest_file *files = pln_xcalloc((size_t)o.tp, sizeof *files);
    int rc = 0;
    double t_loop = pln_now();
    for (int r = 0; r < o.tp && !rc; r++) {
        pln_shard_spec *specs = pln_xcalloc(c.n, sizeof *specs);
        for (size_t i = 0; i < c.n; i++) {
            const pln_tp_entry *e = &c.plans[r][i];
            specs[i].name = e->name;
            specs[i].dtype = e->dtype;
            specs[i].ndim = e->ndim;
            specs[i].shape[0] = e->shape[0];
            if (e->ndim == 2) specs[i].shape[1] = e->shape[1];
        }
        pln_shard_file_name((uint32_t)r, (uint32_t)o.tp, files[r].name, sizeof files[r].name);
        char *path = pln_xasprintf("%s/%s", tmp, files[r].name);
        writers[r] = pln_shard_writer_create(path, fam->layout, (uint32_t)r, (uint32_t)o.tp, specs, c.n);
        if (!writers[r]) rc = -1;
        free(path);
        free(specs);
    }
    if (!rc) {
        t_loop = pln_now();
        pln_progress_init(&c.progress, "reshard", total_in, quiet);
        pln_progress_set_work(&c.progress, total_work);
        pipe_start(&c.pipe, writers, o.tp);
        for (size_t i = 0; i < c.n && !rc; i++) {
            if (c.plans[0][i].transform == PLN_TP_QUANT_SCALE) continue;
            rc = convert_tensor(&c, i);
            if (!rc && pipe_failed(&c.pipe)) rc = -1;
        }
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", pln_error());
        double t_conv = pln_now();
        int prc = pipe_stop(&c.pipe);
        if (timing)
            fprintf(stderr, "timing: open+plan %.2f s, convert %.2f s (waiting for buffers %.2f s), drain %.2f s, %s writes\n",
                    t_loop - t0, t_conv - t_loop, g_wait_s, pln_now() - t_conv,
                    pln_shard_writer_direct(writers[0]) ? "O_DIRECT" : "buffered");  /* the writer's error, if it failed, is the reason */
        if (rc && !prc) pln_errorf("%s", saved);
        if (prc) rc = -1;
        pln_progress_done(&c.progress);
    }
    double t_fin = pln_now();
    for (int r = 0; r < o.tp; r++) {
        if (!writers[r]) continue;
        if (rc) { pln_shard_writer_abort(writers[r]); continue; }
        pln_shard_file_info info;
        if (pln_shard_writer_finish(writers[r], &info)) { rc = -1; continue; }
        files[r].size = info.file_size;
        files[r].xxh3 = info.header_xxh3;
    }
    if (timing) fprintf(stderr, "timing: rank files finished (fsync) %.2f s\n", pln_now() - t_fin);
    /* config.json and tokenizer.json travel with the set. */
    char *cfg_src = pln_xasprintf("%s/config.json", ck.dir);
    char *cfg_dst = pln_xasprintf("%s/config.json", tmp);
    if (!rc && pln_copy_file(cfg_src, cfg_dst)) rc = -1;
    bool have_tok = ck.tokenizer_path != NULL;
    if (!rc && have_tok) {
        char *tok_dst = pln_xasprintf("%s/tokenizer.json", tmp);
        if (pln_copy_file(ck.tokenizer_path, tok_dst)) rc = -1;
        free(tok_dst);
    } else if (!rc) {
        /* Even under --quiet: the set it makes cannot serve text. */
        fprintf(stderr, "pollen: warning: %s has no tokenizer.json; the shard set will have none, so it cannot "
                "serve or take text prompts (only --token-ids): put the model's tokenizer.json beside the "
                "checkpoint and reshard again\n", src_path);
    }
    free(cfg_src);
    free(cfg_dst);
    /* The chat template (tokenizer_config.json's chat_template, or chat_template.jinja) and the
     * special tokens the template sees travel too: serve renders the model's own template. */
    const char *chat_names[2] = {"tokenizer_config.json", "chat_template.jinja"};
    bool have_chat[2] = {false, false};
    for (int i = 0; i < 2 && !rc; i++) {
        char *src = pln_xasprintf("%s/%s", ck.dir, chat_names[i]);
        struct stat cst;
        if (lstat(src, &cst) == 0) {
            char *dst = pln_xasprintf("%s/%s", tmp, chat_names[i]);
            if (pln_check_file(src) || pln_copy_file(src, dst)) rc = -1;
            else have_chat[i] = true;
            free(dst);
        }
        free(src);
    }
    if (!rc) {
        json_t *extra = json_object();
        json_object_set_new(extra, "source", source_json(&ck, src_path));
        json_object_set_new(extra, "tensors", tensors_json(&c));
        json_object_set_new(extra, "conversion", json_pack("{s:s, s:s, s:s, s:s}", "fp16",
                            "round to nearest even; values past +-65504 clamped to +-65504 and counted (tensors.*.clamped)",
                            "int8", "symmetric, per rank slice after the TP split: q = round(w/scale) in [-127, 127], scale = fp16(absmax/127) per group, 1.0 for an all-zero group",
                            "int4", "symmetric, per rank slice after the TP split, groups of group_size columns: q = round(w/scale) in [-8, 7], "
                                    "scale = the fp16 scale of least squared error, each value's weighted by w^2 + mean(w^2) of its group, "
                                    "among absmax/D for D = 7, 6.5..9.25 step 0.25, then the best D +-0.125 (clipping search); "
                                    "packed two per byte (docs/FORMAT.md)",
                            "tool", "pollen " PLN_VERSION_STRING " reshard"));
        pln_manifest man = {
            .config = ck.config, .tp = o.tp, .dtype = o.int4 ? "int4" : o.int8 ? "int8" : "fp16", .group_size = o.group_size,
            .quantize_embedding = o.quantize_embedding, .vocab_padded = pln_tp_vocab_padded(ck.config.vocab_size, o.tp),
            .layout = fam->layout, .files = files, .tokenizer = have_tok ? "tokenizer.json" : NULL,
            .hf_config = "config.json", .tokenizer_config = have_chat[0] ? chat_names[0] : NULL,
            .chat_template = have_chat[1] ? chat_names[1] : NULL, .extra = extra};
        if (pln_manifest_write(tmp, &man)) rc = -1;
        json_decref(extra);
    }
    double t_commit = pln_now();
    if (!rc && pln_outdir_commit(tmp, out)) rc = -1;
    if (timing) fprintf(stderr, "timing: finish+manifest %.2f s, commit (fsync, rename) %.2f s\n", t_commit - t_loop, pln_now() - t_commit);
    if (rc) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", pln_error());
        pln_outdir_abort(tmp);
        pln_die("reshard failed, nothing written to %s: %s", out, reason);
    }
    double dt = pln_now() - t0;
    uint64_t total_out = 0;
    for (int r = 0; r < o.tp; r++) total_out += files[r].size;
    /* The per-tensor table is a result asked for (stdout); the summary is chatter (stderr). */
    if (stats || !quiet) {
        char a[32], b[32], rate[32];
        uint64_t clamped = 0;
        const rs_stat *worst = NULL;
        for (size_t i = 0; i < c.n; i++) {
            const rs_stat *s = &c.stats[i];
            clamped += s->clamped;
            if (s->e0 && s->quant && (!worst || pln_tp_qerr_rel_rms(&s->qerr) > pln_tp_qerr_rel_rms(&worst->qerr))) worst = s;
        }
        bool q = o.int8 || o.int4 || o.quantize_embedding;
        if (stats && (q || clamped)) {
            printf("%-48s %-5s %-14s %9s", "tensor", "src", "shape", "clamped");
            if (q) printf(" %12s %12s %6s", "rel_rms", "max_abs", "group");
            printf("\n");
        }
        for (size_t i = 0; i < c.n && stats; i++) {
            const rs_stat *s = &c.stats[i];
            if (!s->e0 || (!s->quant && !s->clamped)) continue;
            char sh[64];
            printf("%-48s %-5s %-14s %9llu", s->e0->source, pln_dtype_name(s->src->dtype),
                   pln_shape_str(s->src->shape, s->src->ndim, sh, sizeof sh), (unsigned long long)s->clamped);
            if (s->quant) printf(" %12.4e %12.4e %6lld", pln_tp_qerr_rel_rms(&s->qerr), s->qerr.max_abs, (long long)s->e0->group);
            printf("\n");
        }
        if (stats && !clamped) printf("(no value needed clamping to fp16's range)\n");
        if (!quiet) {
            fprintf(stderr, "wrote %s: TP %d %s, %d file%s, %s from %s in %.2f s (%s/s in)\n", out, o.tp,
                    o.int4 ? "int4" : o.int8 ? "int8" : "fp16", o.tp, o.tp == 1 ? "" : "s", pln_human_bytes((double)total_out, a, sizeof a),
                    pln_human_bytes((double)total_in, b, sizeof b), dt,
                    pln_human_bytes(dt > 0 ? (double)total_in / dt : 0, rate, sizeof rate));
            if (worst)
                fprintf(stderr, "largest quantization error: rel_rms %.4e (%s); %llu value(s) clamped to fp16's range%s\n",
                        pln_tp_qerr_rel_rms(&worst->qerr), worst->e0->source, (unsigned long long)clamped,
                        stats ? "" : "; --stats prints every tensor");
            else if (clamped)
                fprintf(stderr, "%llu value(s) clamped to fp16's range%s\n", (unsigned long long)clamped,
                        stats ? "" : "; --stats prints every tensor");
        }
    }
    free(tmp);
    free(writers);
    free(files);
    for (int r = 0; r < o.tp; r++) free(c.plans[r]);
    free(c.plans);
    free(c.srcs);
    free(c.stats);
    pln_ckpt_close(&ck);
    return 0;
}
