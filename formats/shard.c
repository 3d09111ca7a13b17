/* shard.c — the pollen shard format: rank-file writer, validating mmap reader, manifest.json,
 * shard-set open and the bloom-tp-v1 tensor list. docs/FORMAT.md is the specification. */
#include "formats/shard.h"
#include "formats/family.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- little-endian helpers (explicit, so the format does not depend on the host) ---------- */
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* Preamble field offsets (docs/FORMAT.md, "Preamble"). */
enum {
    P_MAGIC = 0, P_VERSION = 8, P_PREAMBLE_SIZE = 12, P_ALIGNMENT = 16, P_RANK = 20, P_N_RANKS = 24,
    P_FLAGS = 28, P_N_TENSORS = 32, P_TABLE_OFFSET = 40, P_TABLE_SIZE = 48, P_DATA_OFFSET = 56,
    P_DATA_SIZE = 64, P_FILE_SIZE = 72, P_LAYOUT = 80, P_TABLE_XXH3 = 112, P_PREAMBLE_XXH3 = 120,
};
/* Table entry field offsets (docs/FORMAT.md, "Tensor table"). */
enum {
    E_NAME = 0, E_DTYPE = 128, E_NDIM = 132, E_SHAPE = 136, E_OFFSET = 200, E_NBYTES = 208,
    E_XXH3 = 216, E_RESERVED = 224,
};

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* Names are identifiers: printable ASCII without spaces. */
static bool name_char_ok(unsigned char c) { return c > 0x20 && c < 0x7f; }

int pln_shard_spec_nbytes(const pln_shard_spec *s, uint64_t *out) {
    const char *nm = s->name ? s->name : "(null)";
    size_t es = pln_dtype_size(s->dtype);
    if (!es) return pln_errorf("tensor %s: invalid dtype %d", nm, (int)s->dtype);
    if (s->ndim < 1 || s->ndim > PLN_SHARD_MAX_DIMS)
        return pln_errorf("tensor %s: ndim %d outside 1..%d", nm, (int)s->ndim, PLN_SHARD_MAX_DIMS);
    uint64_t n = es;
    for (int i = 0; i < s->ndim; i++) {
        if (s->shape[i] < 0) return pln_errorf("tensor %s: negative dimension %lld", nm, (long long)s->shape[i]);
        if (pln_mul_overflow(n, (uint64_t)s->shape[i], &n))
            return pln_errorf("tensor %s: element count times dtype size overflows 64 bits", nm);
    }
    *out = n;
    return 0;
}

/* ---- name index: open addressing over FNV-1a, slots hold index+1 ---------------------------- */
typedef struct {
    uint64_t mask;
    uint32_t *slots;
} name_index;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static name_index *index_new(size_t n) {
    name_index *ix = pln_xcalloc(1, sizeof *ix);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n) cap *= 2;
    ix->mask = cap - 1;
    ix->slots = pln_xcalloc(cap, sizeof *ix->slots);
    return ix;
}

static void index_free(name_index *ix) {
    if (!ix) return;
    free(ix->slots);
    free(ix);
}

/* Inserts names[i]; returns the index of an existing equal name, or -1 if inserted. */
static int64_t index_insert(name_index *ix, const pln_shard_tensor *t, uint32_t i) {
    for (uint64_t h = fnv1a(t[i].name);; h++) {
        uint32_t *sl = &ix->slots[h & ix->mask];
        if (!*sl) { *sl = i + 1; return -1; }
        if (!strcmp(t[*sl - 1].name, t[i].name)) return (int64_t)(*sl - 1);
    }
}

static int64_t index_find(const name_index *ix, const pln_shard_tensor *t, const char *name) {
    for (uint64_t h = fnv1a(name);; h++) {
        uint32_t sl = ix->slots[h & ix->mask];
        if (!sl) return -1;
        if (!strcmp(t[sl - 1].name, name)) return sl - 1;
    }
}

/* ---- writer ------------------------------------------------------------------------------
 * Data goes to disk with O_DIRECT where the file system allows it: the kernel then DMAs straight
 * from the caller's buffers instead of copying every byte into the page cache first (that copy
 * was most of a warm reshard's CPU time), and the final fsync has only metadata left to flush.
 * O_DIRECT needs block-aligned offsets, lengths and buffers: tensors start at 4096-aligned offsets
 * and callers that want the zero-copy path pass 4096-aligned buffers of whole blocks; everything
 * else (a tensor's last partial block, small or unaligned writes) is staged in a small aligned
 * bounce buffer and written zero-padded to the block, which only covers the zero padding before
 * the next aligned tensor offset. The bytes on disk are the same as with buffered writes.
 * PLN_WRITE_DIRECT=0 forces buffered writes, =1 forces O_DIRECT (a refusal is an error); unset,
 * a file system that refuses O_DIRECT (EINVAL, e.g. tmpfs on older kernels) gets buffered writes.
 * PLN_FAULT_DIRECT_EINVAL makes every direct write fail with EINVAL, to test that fallback. */
#define SHARD_BLOCK 4096u                /* O_DIRECT alignment used for offsets, lengths, buffers */
#define SHARD_BOUNCE_BYTES (64u << 10)   /* staging for unaligned pieces (per writer, lazily) */
_Static_assert(PLN_SHARD_ALIGN % SHARD_BLOCK == 0, "padding a tensor's last block must stay in its alignment gap");

typedef enum { WRITE_AUTO, WRITE_BUFFERED, WRITE_DIRECT } write_mode;

struct pln_shard_writer {
    char *path, *part;
    int fd;
    char layout[PLN_SHARD_LAYOUT_MAX];
    uint32_t rank, n_ranks;
    size_t n;
    pln_shard_tensor *t;
    uint64_t table_size, data_offset, data_size, file_size;
    size_t next;                 /* index of the next tensor to begin */
    bool in_tensor;              /* between begin and end (tensor index next - 1) */
    uint64_t written;            /* bytes of the current tensor written so far */
    bool hashing;                /* the writer computes the current tensor's checksum */
    XXH3_state_t *st;
    write_mode mode;             /* from PLN_WRITE_DIRECT */
    bool direct;                 /* fd is open with O_DIRECT */
    bool fault_einval;           /* PLN_FAULT_DIRECT_EINVAL: direct writes fail as on a refusing fs */
    uint8_t *bounce;             /* SHARD_BOUNCE_BYTES, SHARD_BLOCK-aligned, or NULL */
    uint64_t bounce_off;         /* file offset of bounce[0] (block-aligned) */
    size_t bounce_len;           /* bytes staged */
};

static int pwrite_all(int fd, const void *data, size_t n, uint64_t off, const char *path) {
    const uint8_t *p = data;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return pln_errorf("%s: write of %zu bytes at offset %llu failed: %s", path, n,
                              (unsigned long long)off, strerror(errno));
        }
        if (w == 0) return pln_errorf("%s: write returned 0 at offset %llu", path, (unsigned long long)off);
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static void writer_free(pln_shard_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->st) XXH3_freeState(w->st);
    free(w->bounce);
    free(w->t);
    free(w->path);
    free(w->part);
    free(w);
}

static void *aligned_alloc_or_die(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, SHARD_BLOCK, n ? n : SHARD_BLOCK)) pln_die("out of memory (%zu aligned bytes)", n);
    return p;
}

/* PLN_WRITE_DIRECT: 0 buffered writes, 1 O_DIRECT, unset: chosen per file (common.h ENV_NOTE) */
static int write_mode_from_env(write_mode *m) {
    const char *e = getenv("PLN_WRITE_DIRECT");
    bool direct = false;
    *m = WRITE_AUTO;
    if (pln_env_flag("PLN_WRITE_DIRECT", &direct)) return -1;
    if (e && *e) *m = direct ? WRITE_DIRECT : WRITE_BUFFERED;
    return 0;
}

/* Writes at off; in O_DIRECT mode off, n and data must be block-aligned. A file system that
 * accepted O_DIRECT at open but refuses the write (EINVAL) gets the rest buffered, unless
 * PLN_WRITE_DIRECT=1 asked for O_DIRECT. */
static int write_at(pln_shard_writer *w, const void *data, size_t n, uint64_t off) {
    const uint8_t *p = data;
    while (n && w->direct) {
        ssize_t r = w->fault_einval ? (errno = EINVAL, -1) : pwrite(w->fd, p, n, (off_t)off);
        if (r > 0) { p += r; n -= (size_t)r; off += (uint64_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL && w->mode == WRITE_AUTO) {
            int fl = fcntl(w->fd, F_GETFL);
            if (fl < 0 || fcntl(w->fd, F_SETFL, fl & ~O_DIRECT) < 0)
                return pln_errorf("%s: cannot switch from O_DIRECT to buffered writes: %s", w->part, strerror(errno));
            w->direct = false;
            break;
        }
        if (r < 0 && errno == EINVAL)
            return pln_errorf("%s: the file system refused an O_DIRECT write of %zu bytes at offset %llu "
                              "(PLN_WRITE_DIRECT=1); unset PLN_WRITE_DIRECT to fall back to buffered writes",
                              w->part, n, (unsigned long long)off);
        if (r == 0) return pln_errorf("%s: write returned 0 at offset %llu", w->part, (unsigned long long)off);
        return pln_errorf("%s: write of %zu bytes at offset %llu failed: %s", w->part, n, (unsigned long long)off, strerror(errno));
    }
    return n ? pwrite_all(w->fd, p, n, off, w->part) : 0;
}

/* Writes the staged bytes, zero-padded to a whole block. Called when the stage ends on a block
 * boundary or at the end of a tensor (the padding then lands in the gap before the next tensor,
 * which is zeros in the file anyway). */
static int bounce_flush(pln_shard_writer *w) {
    if (!w->bounce_len) return 0;
    size_t n = (size_t)pln_align_up(w->bounce_len, SHARD_BLOCK);
    memset(w->bounce + w->bounce_len, 0, n - w->bounce_len);
    w->bounce_len = 0;
    return write_at(w, w->bounce, n, w->bounce_off);
}

/* Appends n bytes at file offset pos: whole aligned blocks straight from the caller's buffer,
 * the rest through the bounce buffer. */
static int direct_append(pln_shard_writer *w, const uint8_t *p, size_t n, uint64_t pos) {
    while (n) {
        bool aligned = (uintptr_t)p % SHARD_BLOCK == 0 && n >= SHARD_BLOCK;
        if (aligned && w->bounce_len && w->bounce_len % SHARD_BLOCK == 0 && bounce_flush(w)) return -1;
        if (aligned && !w->bounce_len && pos % SHARD_BLOCK == 0) {
            size_t m = n / SHARD_BLOCK * SHARD_BLOCK;
            if (write_at(w, p, m, pos)) return -1;
            p += m; n -= m; pos += m;
            continue;
        }
        if (!w->bounce) w->bounce = aligned_alloc_or_die(SHARD_BOUNCE_BYTES);
        if (!w->bounce_len) w->bounce_off = pos;
        /* direct writes and mid-tensor flushes end on block boundaries, tensors start on them */
        PLN_ASSERT(w->bounce_off % SHARD_BLOCK == 0 && w->bounce_off + w->bounce_len == pos);
        size_t take = SHARD_BOUNCE_BYTES - w->bounce_len;
        if (take > n) take = n;
        memcpy(w->bounce + w->bounce_len, p, take);
        w->bounce_len += take;
        p += take; n -= take; pos += take;
        if (w->bounce_len == SHARD_BOUNCE_BYTES && bounce_flush(w)) return -1;
    }
    return 0;
}

bool pln_shard_writer_direct(const pln_shard_writer *w) { return w->direct; }

pln_shard_writer *pln_shard_writer_create(const char *path, const char *layout, uint32_t rank,
                                          uint32_t n_ranks, const pln_shard_spec *specs, size_t n) {
    if (!layout || !*layout || strlen(layout) >= PLN_SHARD_LAYOUT_MAX) {
        pln_errorf("%s: layout name must be 1..%d bytes", path, PLN_SHARD_LAYOUT_MAX - 1);
        return NULL;
    }
    for (const char *c = layout; *c; c++)
        if (!name_char_ok((unsigned char)*c)) { pln_errorf("%s: layout name \"%s\" has a bad character", path, layout); return NULL; }
    if (n_ranks == 0 || rank >= n_ranks) {
        pln_errorf("%s: rank %u is not below the number of ranks %u", path, rank, n_ranks);
        return NULL;
    }
    if (n > PLN_SHARD_MAX_TENSORS) {
        pln_errorf("%s: %zu tensors, more than the format allows (%u)", path, n, PLN_SHARD_MAX_TENSORS);
        return NULL;
    }
    pln_shard_writer *w = pln_xcalloc(1, sizeof *w);
    w->fd = -1;
    w->path = pln_xstrdup(path);
    w->part = pln_xasprintf("%s.part", path);
    snprintf(w->layout, sizeof w->layout, "%s", layout);
    w->rank = rank;
    w->n_ranks = n_ranks;
    w->n = n;
    w->t = pln_xcalloc(n ? n : 1, sizeof *w->t);
    w->table_size = (uint64_t)n * PLN_SHARD_ENTRY_SIZE;
    w->data_offset = pln_align_up(PLN_SHARD_PREAMBLE_SIZE + w->table_size, PLN_SHARD_ALIGN);
    uint64_t pos = w->data_offset;
    name_index *ix = index_new(n);
    for (size_t i = 0; i < n; i++) {
        const pln_shard_spec *s = &specs[i];
        pln_shard_tensor *t = &w->t[i];
        if (!s->name || !*s->name || strlen(s->name) >= PLN_SHARD_NAME_MAX) {
            pln_errorf("%s: tensor #%zu: name must be 1..%d bytes", path, i, PLN_SHARD_NAME_MAX - 1);
            goto fail;
        }
        for (const char *c = s->name; *c; c++)
            if (!name_char_ok((unsigned char)*c)) {
                pln_errorf("%s: tensor \"%s\": names are printable ASCII without spaces", path, s->name);
                goto fail;
            }
        if (pln_shard_spec_nbytes(s, &t->nbytes)) { pln_error_context("%s", path); goto fail; }
        snprintf(t->name, sizeof t->name, "%s", s->name);
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        for (int d = 0; d < s->ndim; d++) t->shape[d] = s->shape[d];
        int64_t dup = index_insert(ix, w->t, (uint32_t)i);
        if (dup >= 0) { pln_errorf("%s: tensor \"%s\" listed twice (#%lld and #%zu)", path, s->name, (long long)dup, i); goto fail; }
        t->offset = pln_align_up(pos, PLN_SHARD_ALIGN);
        if (t->offset < pos || pln_add_overflow(t->offset, t->nbytes, &pos)) {
            pln_errorf("%s: tensor \"%s\": file size overflows 64 bits", path, s->name);
            goto fail;
        }
    }
    index_free(ix);
    ix = NULL;
    w->file_size = pln_align_up(pos, PLN_SHARD_ALIGN);
    if (w->file_size < pos || w->file_size > (uint64_t)INT64_MAX) { pln_errorf("%s: file size overflows", path); goto fail; }
    w->data_size = w->file_size - w->data_offset;
    if (write_mode_from_env(&w->mode)) { pln_error_context("%s", w->part); goto fail; }
    w->fault_einval = getenv("PLN_FAULT_DIRECT_EINVAL") != NULL;
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (w->mode != WRITE_BUFFERED) {
        w->fd = open(w->part, flags | O_DIRECT, 0644);
        w->direct = w->fd >= 0;
        if (w->fd < 0 && (errno != EINVAL || w->mode == WRITE_DIRECT)) {
            int e = errno;
            if (e == EINVAL) unlink(w->part);  /* the file may exist: Linux checks O_DIRECT after creating it */
            pln_errorf("%s: cannot create%s: %s", w->part,
                       e == EINVAL ? " with O_DIRECT (PLN_WRITE_DIRECT=1; the file system refuses it; unset PLN_WRITE_DIRECT to fall back to buffered writes)" : "",
                       strerror(e));
            goto fail;
        }
    }
    if (w->fd < 0) w->fd = open(w->part, flags, 0644);
    if (w->fd < 0) { pln_errorf("%s: cannot create: %s", w->part, strerror(errno)); goto fail; }
    /* Sparse up front: padding and the not-yet-written header read as zeros. */
    if (ftruncate(w->fd, (off_t)w->file_size) != 0) {
        pln_errorf("%s: cannot size the file to %llu bytes: %s", w->part, (unsigned long long)w->file_size, strerror(errno));
        unlink(w->part);
        goto fail;
    }
    w->st = XXH3_createState();
    if (!w->st) pln_die("out of memory");
    return w;
fail:
    index_free(ix);
    writer_free(w);
    return NULL;
}

uint64_t pln_shard_writer_offset(const pln_shard_writer *w, size_t i) { return i < w->n ? w->t[i].offset : 0; }
uint64_t pln_shard_writer_nbytes(const pln_shard_writer *w, size_t i) { return i < w->n ? w->t[i].nbytes : 0; }

int pln_shard_writer_begin(pln_shard_writer *w, const char *name, const uint64_t *xxh3) {
    if (w->in_tensor)
        return pln_errorf("%s: tensor \"%s\" begun before \"%s\" was ended", w->path, name, w->t[w->next - 1].name);
    if (w->next >= w->n) return pln_errorf("%s: tensor \"%s\" is beyond the %zu tensors laid out", w->path, name, w->n);
    pln_shard_tensor *t = &w->t[w->next];
    if (strcmp(name, t->name))
        return pln_errorf("%s: tensor \"%s\" written where \"%s\" (#%zu) comes next; tensors must be written in table order",
                          w->path, name, t->name, w->next);
    w->next++;
    w->in_tensor = true;
    w->written = 0;
    w->hashing = xxh3 == NULL;
    if (xxh3) t->xxh3 = *xxh3;
    else XXH3_64bits_reset(w->st);
    return 0;
}

int pln_shard_writer_write(pln_shard_writer *w, const void *data, size_t n) {
    if (!w->in_tensor) return pln_errorf("%s: data written outside a tensor (call begin first)", w->path);
    pln_shard_tensor *t = &w->t[w->next - 1];
    if (n > t->nbytes - w->written)
        return pln_errorf("%s: tensor \"%s\": %llu + %zu bytes written, more than its %llu bytes", w->path, t->name,
                          (unsigned long long)w->written, n, (unsigned long long)t->nbytes);
    if (n == 0) return 0;
    uint64_t pos = t->offset + w->written;
    if (w->direct || w->bounce_len) {
        if (direct_append(w, data, n, pos)) return -1;
    } else if (pwrite_all(w->fd, data, n, pos, w->part)) {
        return -1;
    }
    if (w->hashing) XXH3_64bits_update(w->st, data, n);
    w->written += n;
    return 0;
}

int pln_shard_writer_end(pln_shard_writer *w) {
    if (!w->in_tensor) return pln_errorf("%s: end without begin", w->path);
    pln_shard_tensor *t = &w->t[w->next - 1];
    if (w->written != t->nbytes)
        return pln_errorf("%s: tensor \"%s\": %llu of its %llu bytes written", w->path, t->name,
                          (unsigned long long)w->written, (unsigned long long)t->nbytes);
    if (bounce_flush(w)) return -1;
    if (w->hashing) t->xxh3 = XXH3_64bits_digest(w->st);
    w->in_tensor = false;
    return 0;
}

int pln_shard_writer_put(pln_shard_writer *w, const char *name, const void *data, uint64_t nbytes,
                         const uint64_t *xxh3) {
    if (pln_shard_writer_begin(w, name, xxh3)) return -1;
    if (nbytes > SIZE_MAX) return pln_errorf("%s: tensor \"%s\" too large for this host", w->path, name);
    if (pln_shard_writer_write(w, data, (size_t)nbytes)) return -1;
    return pln_shard_writer_end(w);
}

static void encode_entry(uint8_t *e, const pln_shard_tensor *t) {
    memset(e, 0, PLN_SHARD_ENTRY_SIZE);
    memcpy(e + E_NAME, t->name, strlen(t->name));
    wr32(e + E_DTYPE, (uint32_t)t->dtype);
    wr32(e + E_NDIM, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) wr64(e + E_SHAPE + 8 * d, (uint64_t)t->shape[d]);
    wr64(e + E_OFFSET, t->offset);
    wr64(e + E_NBYTES, t->nbytes);
    wr64(e + E_XXH3, t->xxh3);
}

int pln_shard_writer_finish(pln_shard_writer *w, pln_shard_file_info *info) {
    int rc = -1;
    uint8_t *hdr = NULL;
    if (w->in_tensor) { pln_errorf("%s: tensor \"%s\" was not ended", w->path, w->t[w->next - 1].name); goto out; }
    if (w->next != w->n) {
        pln_errorf("%s: only %zu of %zu tensors written (next: \"%s\")", w->path, w->next, w->n, w->t[w->next].name);
        goto out;
    }
    size_t hsz = PLN_SHARD_PREAMBLE_SIZE + (size_t)w->table_size;
    /* whole blocks for O_DIRECT: the padding up to data_offset is zeros in the file anyway */
    size_t hsz_blocks = (size_t)pln_align_up(hsz, SHARD_BLOCK);
    PLN_ASSERT(hsz_blocks <= w->data_offset);
    hdr = aligned_alloc_or_die(hsz_blocks);
    memset(hdr, 0, hsz_blocks);
    for (size_t i = 0; i < w->n; i++) encode_entry(hdr + PLN_SHARD_PREAMBLE_SIZE + i * PLN_SHARD_ENTRY_SIZE, &w->t[i]);
    memcpy(hdr + P_MAGIC, PLN_SHARD_MAGIC, 8);
    wr32(hdr + P_VERSION, PLN_SHARD_VERSION);
    wr32(hdr + P_PREAMBLE_SIZE, PLN_SHARD_PREAMBLE_SIZE);
    wr32(hdr + P_ALIGNMENT, PLN_SHARD_ALIGN);
    wr32(hdr + P_RANK, w->rank);
    wr32(hdr + P_N_RANKS, w->n_ranks);
    wr32(hdr + P_FLAGS, 0);
    wr64(hdr + P_N_TENSORS, w->n);
    wr64(hdr + P_TABLE_OFFSET, PLN_SHARD_PREAMBLE_SIZE);
    wr64(hdr + P_TABLE_SIZE, w->table_size);
    wr64(hdr + P_DATA_OFFSET, w->data_offset);
    wr64(hdr + P_DATA_SIZE, w->data_size);
    wr64(hdr + P_FILE_SIZE, w->file_size);
    memcpy(hdr + P_LAYOUT, w->layout, strlen(w->layout));
    wr64(hdr + P_TABLE_XXH3, pln_xxh3(hdr + PLN_SHARD_PREAMBLE_SIZE, (size_t)w->table_size));
    uint64_t hx = pln_xxh3(hdr, P_PREAMBLE_XXH3);
    wr64(hdr + P_PREAMBLE_XXH3, hx);
    if (write_at(w, hdr, hsz_blocks, 0)) goto out;
    /* the exact size, whatever the last padded write covered */
    if (ftruncate(w->fd, (off_t)w->file_size) != 0) {
        pln_errorf("%s: cannot set the size to %llu bytes: %s", w->part, (unsigned long long)w->file_size, strerror(errno));
        goto out;
    }
    if (fsync(w->fd) != 0) { pln_errorf("%s: fsync failed: %s", w->part, strerror(errno)); goto out; }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) { pln_errorf("%s: close failed: %s", w->part, strerror(errno)); goto out; }
    if (rename(w->part, w->path) != 0) { pln_errorf("%s: cannot rename %s into place: %s", w->path, w->part, strerror(errno)); goto out; }
    if (info) { info->file_size = w->file_size; info->header_xxh3 = hx; }
    rc = 0;
out:
    if (rc) unlink(w->part);
    free(hdr);
    writer_free(w);
    return rc;
}

void pln_shard_writer_abort(pln_shard_writer *w) {
    if (!w) return;
    unlink(w->part);
    writer_free(w);
}

/* ---- reader ------------------------------------------------------------------------------ */
static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* Reads a NUL-terminated, zero-padded field of printable characters. */
static int read_name_field(const uint8_t *p, size_t cap, char *out, const char *path, const char *what) {
    size_t len = strnlen((const char *)p, cap);
    if (len == cap) return pln_errorf("%s: %s is not NUL-terminated within its %zu bytes", path, what, cap);
    if (len == 0) return pln_errorf("%s: %s is empty", path, what);
    for (size_t i = 0; i < len; i++)
        if (!name_char_ok(p[i])) return pln_errorf("%s: %s has a non-printable byte 0x%02x at %zu", path, what, p[i], i);
    if (!all_zero(p + len, cap - len)) return pln_errorf("%s: %s has non-zero bytes after its NUL", path, what);
    memcpy(out, p, len + 1);
    return 0;
}

static int shard_validate(pln_shard *s) {
    const char *path = s->path;
    const uint8_t *b = s->map.data;
    uint64_t fsz = s->map.size;
    if (fsz < PLN_SHARD_PREAMBLE_SIZE)
        return pln_errorf("%s: file is %llu bytes, shorter than the %u-byte preamble (truncated, or not a pollen rank file)",
                          path, (unsigned long long)fsz, PLN_SHARD_PREAMBLE_SIZE);
    if (memcmp(b + P_MAGIC, PLN_SHARD_MAGIC, 8))
        return pln_errorf("%s: bad magic (not a pollen rank file; expected \"%s\")", path, PLN_SHARD_MAGIC);
    s->version = rd32(b + P_VERSION);
    if (s->version != PLN_SHARD_VERSION)
        return pln_errorf("%s: rank file version %u is not supported (this pollen reads version %u); re-run reshard with this pollen",
                          path, s->version, PLN_SHARD_VERSION);
    if (rd32(b + P_PREAMBLE_SIZE) != PLN_SHARD_PREAMBLE_SIZE)
        return pln_errorf("%s: preamble size %u, expected %u", path, rd32(b + P_PREAMBLE_SIZE), PLN_SHARD_PREAMBLE_SIZE);
    uint64_t hx = rd64(b + P_PREAMBLE_XXH3), hc = pln_xxh3(b, P_PREAMBLE_XXH3);
    if (hx != hc)
        return pln_errorf("%s: preamble checksum mismatch (stored %016llx, computed %016llx): the header is corrupt",
                          path, (unsigned long long)hx, (unsigned long long)hc);
    s->header_xxh3 = hx;
    s->alignment = rd32(b + P_ALIGNMENT);
    if (!is_pow2(s->alignment) || s->alignment < PLN_SHARD_ALIGN || s->alignment > (1u << 30))
        return pln_errorf("%s: alignment %u is not a power of two in [%u, 2^30]", path, s->alignment, PLN_SHARD_ALIGN);
    s->rank = rd32(b + P_RANK);
    s->n_ranks = rd32(b + P_N_RANKS);
    if (s->n_ranks == 0 || s->rank >= s->n_ranks)
        return pln_errorf("%s: rank %u is not below the number of ranks %u", path, s->rank, s->n_ranks);
    if (rd32(b + P_FLAGS) != 0) return pln_errorf("%s: unknown flags 0x%08x (a newer pollen wrote this file)", path, rd32(b + P_FLAGS));
    if (read_name_field(b + P_LAYOUT, PLN_SHARD_LAYOUT_MAX, s->layout, path, "layout field")) return -1;
    s->n_tensors = rd64(b + P_N_TENSORS);
    s->table_offset = rd64(b + P_TABLE_OFFSET);
    s->table_size = rd64(b + P_TABLE_SIZE);
    s->data_offset = rd64(b + P_DATA_OFFSET);
    s->data_size = rd64(b + P_DATA_SIZE);
    s->file_size = rd64(b + P_FILE_SIZE);
    if (s->file_size != fsz)
        return pln_errorf("%s: file is %llu bytes but its header says %llu (truncated or extended; re-copy or re-run reshard)",
                          path, (unsigned long long)fsz, (unsigned long long)s->file_size);
    if (s->n_tensors > PLN_SHARD_MAX_TENSORS)
        return pln_errorf("%s: tensor count %llu exceeds the format's limit %u", path, (unsigned long long)s->n_tensors, PLN_SHARD_MAX_TENSORS);
    if (s->table_offset != PLN_SHARD_PREAMBLE_SIZE)
        return pln_errorf("%s: table offset %llu, expected %u", path, (unsigned long long)s->table_offset, PLN_SHARD_PREAMBLE_SIZE);
    if (s->table_size != s->n_tensors * PLN_SHARD_ENTRY_SIZE)
        return pln_errorf("%s: table size %llu does not equal %llu tensors x %u bytes", path,
                          (unsigned long long)s->table_size, (unsigned long long)s->n_tensors, PLN_SHARD_ENTRY_SIZE);
    uint64_t table_end = s->table_offset + s->table_size;   /* both bounded above: no overflow */
    if (table_end > fsz)
        return pln_errorf("%s: tensor table (%llu entries) runs past the end of the %llu-byte file (truncated?)", path,
                          (unsigned long long)s->n_tensors, (unsigned long long)fsz);
    if (s->data_offset % s->alignment || s->data_offset < table_end)
        return pln_errorf("%s: data offset %llu is not aligned to %u or overlaps the table (ends at %llu)", path,
                          (unsigned long long)s->data_offset, s->alignment, (unsigned long long)table_end);
    uint64_t data_end;
    if (pln_add_overflow(s->data_offset, s->data_size, &data_end) || data_end != fsz)
        return pln_errorf("%s: data region [%llu, +%llu) does not end at the end of the %llu-byte file", path,
                          (unsigned long long)s->data_offset, (unsigned long long)s->data_size, (unsigned long long)fsz);
    const uint8_t *tab = b + s->table_offset;
    uint64_t tx = rd64(b + P_TABLE_XXH3), tc = pln_xxh3(tab, (size_t)s->table_size);
    if (tx != tc)
        return pln_errorf("%s: tensor table checksum mismatch (stored %016llx, computed %016llx): the header is corrupt",
                          path, (unsigned long long)tx, (unsigned long long)tc);

    s->tensors = pln_xcalloc(s->n_tensors ? s->n_tensors : 1, sizeof *s->tensors);
    name_index *ix = index_new((size_t)s->n_tensors);
    s->index = ix;
    uint64_t prev_end = s->data_offset;
    const char *prev = NULL;
    for (uint64_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *e = tab + i * PLN_SHARD_ENTRY_SIZE;
        pln_shard_tensor *t = &s->tensors[i];
        char what[64];
        snprintf(what, sizeof what, "tensor #%llu name", (unsigned long long)i);
        if (read_name_field(e + E_NAME, PLN_SHARD_NAME_MAX, t->name, path, what)) return -1;
        uint32_t dt = rd32(e + E_DTYPE), nd = rd32(e + E_NDIM);
        if (dt >= PLN_DTYPE_COUNT) return pln_errorf("%s: tensor \"%s\": unknown dtype code %u", path, t->name, dt);
        if (nd < 1 || nd > PLN_SHARD_MAX_DIMS) return pln_errorf("%s: tensor \"%s\": ndim %u outside 1..%d", path, t->name, nd, PLN_SHARD_MAX_DIMS);
        t->dtype = (pln_dtype)dt;
        t->ndim = (int32_t)nd;
        uint64_t numel_bytes = pln_dtype_size(t->dtype);
        for (uint32_t d = 0; d < PLN_SHARD_MAX_DIMS; d++) {
            uint64_t v = rd64(e + E_SHAPE + 8 * d);
            if (d >= nd) {
                if (v) return pln_errorf("%s: tensor \"%s\": unused dimension %u is %llu, not 0", path, t->name, d, (unsigned long long)v);
                continue;
            }
            if (v > (uint64_t)INT64_MAX) return pln_errorf("%s: tensor \"%s\": dimension %u is negative or too large", path, t->name, d);
            t->shape[d] = (int64_t)v;
            if (pln_mul_overflow(numel_bytes, v, &numel_bytes))
                return pln_errorf("%s: tensor \"%s\": shape overflows 64 bits", path, t->name);
        }
        t->offset = rd64(e + E_OFFSET);
        t->nbytes = rd64(e + E_NBYTES);
        t->xxh3 = rd64(e + E_XXH3);
        if (!all_zero(e + E_RESERVED, PLN_SHARD_ENTRY_SIZE - E_RESERVED))
            return pln_errorf("%s: tensor \"%s\": reserved bytes are not zero", path, t->name);
        if (t->nbytes != numel_bytes)
            return pln_errorf("%s: tensor \"%s\": %llu bytes recorded but shape x dtype size is %llu", path, t->name,
                              (unsigned long long)t->nbytes, (unsigned long long)numel_bytes);
        if (t->offset % s->alignment)
            return pln_errorf("%s: tensor \"%s\": offset %llu is not aligned to %u", path, t->name, (unsigned long long)t->offset, s->alignment);
        if (t->offset < prev_end) {
            if (prev)
                return pln_errorf("%s: tensor \"%s\": offset %llu overlaps the previous tensor \"%s\" (ends at %llu); tensors must be stored in table order without overlap",
                                  path, t->name, (unsigned long long)t->offset, prev, (unsigned long long)prev_end);
            return pln_errorf("%s: tensor \"%s\": offset %llu is before the data region (starts at %llu)", path, t->name,
                              (unsigned long long)t->offset, (unsigned long long)s->data_offset);
        }
        uint64_t end;
        if (pln_add_overflow(t->offset, t->nbytes, &end) || end > data_end)
            return pln_errorf("%s: tensor \"%s\": bytes [%llu, +%llu) run past the end of the %llu-byte file (truncated?)", path,
                              t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)fsz);
        int64_t dup = index_insert(ix, s->tensors, (uint32_t)i);
        if (dup >= 0)
            return pln_errorf("%s: tensor name \"%s\" appears twice (#%lld and #%llu)", path, t->name, (long long)dup, (unsigned long long)i);
        prev_end = end;
        prev = t->name;
    }
    return 0;
}

pln_shard *pln_shard_open(const char *path) {
    pln_shard *s = pln_xcalloc(1, sizeof *s);
    if (pln_map_open(&s->map, path)) { free(s); return NULL; }
    pln_map_advise_huge(&s->map);   /* before anything reads it (common.c MAP_HUGE_NOTE) */
    s->path = s->map.path;
    if (shard_validate(s)) { pln_shard_close(s); return NULL; }
    return s;
}

pln_shard *pln_shard_open_mem(const uint8_t *data, uint64_t size, const char *where) {
    pln_shard *s = pln_xcalloc(1, sizeof *s);
    s->borrowed = true;
    s->map.fd = -1;
    s->map.data = data;
    s->map.size = size;
    s->map.path = pln_xstrdup(where);
    s->path = s->map.path;
    if (shard_validate(s)) { pln_shard_close(s); return NULL; }
    return s;
}

void pln_shard_close(pln_shard *s) {
    if (!s) return;
    index_free(s->index);
    free(s->tensors);
    if (s->borrowed) free(s->map.path);
    else pln_map_close(&s->map);
    free(s);
}

const pln_shard_tensor *pln_shard_find(const pln_shard *s, const char *name) {
    int64_t i = index_find(s->index, s->tensors, name);
    if (i < 0) { pln_errorf("%s: no tensor \"%s\"", s->path, name); return NULL; }
    return &s->tensors[i];
}

const void *pln_shard_data(const pln_shard *s, const pln_shard_tensor *t) {
    /* Every offset was checked against the file size at open; an empty tensor has no bytes. */
    return t->nbytes ? s->map.data + t->offset : (const void *)s->map.data;
}

void pln_shard_tensor_view(const pln_shard *s, const pln_shard_tensor *t, pln_tensor *out) {
    memset(out, 0, sizeof *out);
    out->name = (char *)t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < PLN_MAX_DIMS; d++) out->shape[d] = t->shape[d];
    out->data = pln_shard_data(s, t);
    out->nbytes = t->nbytes;
    out->file = s->path;
    out->file_offset = t->offset;
    out->contiguous = true;
}

int pln_shard_verify_tensor(const pln_shard *s, const pln_shard_tensor *t) {
    uint64_t h = pln_xxh3(pln_shard_data(s, t), (size_t)t->nbytes);
    if (h != t->xxh3)
        return pln_errorf("%s: tensor \"%s\": checksum mismatch (stored %016llx, computed %016llx): the data is corrupt; re-copy the file or re-run reshard",
                          s->path, t->name, (unsigned long long)t->xxh3, (unsigned long long)h);
    return 0;
}

int64_t pln_shard_verify_all(const pln_shard *s, char ***bad_names) {
    int64_t n = (int64_t)s->n_tensors;
    uint8_t *bad = pln_xcalloc((size_t)(n ? n : 1), 1);
    /* Big tensors dominate; dynamic scheduling keeps the threads busy. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        bad[i] = pln_xxh3(pln_shard_data(s, t), (size_t)t->nbytes) != t->xxh3;
    }
    int64_t nbad = 0;
    char **names = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (!bad[i]) continue;
        if (nbad == 0) pln_shard_verify_tensor(s, &s->tensors[i]);   /* records the message */
        if (bad_names) {
            names = pln_xrealloc(names, (size_t)(nbad + 1) * sizeof *names);
            names[nbad] = pln_xstrdup(s->tensors[i].name);
        }
        nbad++;
    }
    free(bad);
    if (bad_names) *bad_names = names;
    else free(names);
    return nbad;
}

/* ---- manifest ------------------------------------------------------------------------------ */
const char *pln_shard_file_name(uint32_t rank, uint32_t n_ranks, char *buf, size_t len) {
    snprintf(buf, len, "rank-%u-of-%u.pln", rank, n_ranks);
    return buf;
}

static json_t *config_to_json(const pln_hf_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "n_head", json_integer(c->n_head));
    json_object_set_new(o, "n_layer", json_integer(c->n_layer));
    json_object_set_new(o, "layer_norm_epsilon", json_real(c->layer_norm_epsilon));
    json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    json_object_set_new(o, "pad_token_id", json_integer(c->pad_token_id));
    json_object_set_new(o, "torch_dtype", json_string(c->torch_dtype));
    pln_family_of(c)->manifest_put(c, o);
    return o;
}

static bool safe_file_name(const char *s) {
    return s && *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

int pln_config_canonical(const pln_hf_config *c, char *buf, size_t len) {
    uint64_t eps_bits;
    memcpy(&eps_bits, &c->layer_norm_epsilon, sizeof eps_bits);
    int n = snprintf(buf, len,
                     "vocab_size=%lld\nhidden_size=%lld\nn_head=%lld\nn_layer=%lld\nlayer_norm_epsilon=%016llx\n"
                     "bos_token_id=%lld\neos_token_id=%lld\npad_token_id=%lld\ntorch_dtype=%.*s\n",
                     (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_head, (long long)c->n_layer,
                     (unsigned long long)eps_bits, (long long)c->bos_token_id, (long long)c->eos_token_id,
                     (long long)c->pad_token_id, (int)strnlen(c->torch_dtype, sizeof c->torch_dtype), c->torch_dtype);
    if (n < 0 || (size_t)n >= len) return -1;
    int k = pln_family_of(c)->canonical_extra(c, buf + n, len - (size_t)n);
    return k < 0 || (size_t)(n + k) >= len ? -1 : n + k;
}

uint64_t pln_config_xxh3(const pln_hf_config *c) {
    char buf[2048];
    int n = pln_config_canonical(c, buf, sizeof buf);
    PLN_ASSERT(n > 0);   /* bounded fields always fit */
    return pln_xxh3(buf, (size_t)n);
}

/* The small files of a set (tokenizer, config.json) are read whole: this bounds them. BLOOM's
 * tokenizer.json is 14 MB. */
#define SMALL_FILE_MAX ((size_t)256 << 20)

/* XXH3 of DIR/name into hex[17]; -1 + error naming the file. */
static int small_file_hex(const char *dir, const char *name, char hex[17]) {
    char *path = pln_xasprintf("%s/%s", dir, name);
    size_t n = 0;
    char *text = pln_read_small_file(path, SMALL_FILE_MAX, &n);
    free(path);
    if (!text) return -1;
    snprintf(hex, 17, "%016llx", (unsigned long long)pln_xxh3(text, n));
    free(text);
    return 0;
}

int pln_manifest_write(const char *dir, const pln_manifest *m) {
    if (m->tp < 1) return pln_errorf("%s: manifest: tp %d must be >= 1", dir, (int)m->tp);
    if (!m->dtype || (strcmp(m->dtype, "fp16") && strcmp(m->dtype, "int8") && strcmp(m->dtype, "int4")))
        return pln_errorf("%s: manifest: dtype must be \"fp16\", \"int8\" or \"int4\"", dir);
    const pln_family *fam = pln_family_of(&m->config);
    if (!m->layout || strcmp(m->layout, fam->layout))
        return pln_errorf("%s: manifest: layout \"%s\" is not the %s family's \"%s\"", dir, m->layout ? m->layout : "(null)",
                          fam->name, fam->layout);
    if (!m->files) return pln_errorf("%s: manifest: no files", dir);
    if ((m->tokenizer && !safe_file_name(m->tokenizer)) || (m->hf_config && !safe_file_name(m->hf_config)) ||
        (m->tokenizer_config && !safe_file_name(m->tokenizer_config)) || (m->chat_template && !safe_file_name(m->chat_template)))
        return pln_errorf("%s: manifest: tokenizer/hf_config/tokenizer_config/chat_template must be plain file names in the set directory", dir);
    if (fam->config_servable(&m->config, dir)) return pln_error_context("%s: manifest", dir);
    char tok_hex[17], cfg_hex[17], blk_hex[17];
    if (m->tokenizer && small_file_hex(dir, m->tokenizer, tok_hex)) return -1;
    if (m->hf_config && small_file_hex(dir, m->hf_config, cfg_hex)) return -1;
    char tc_hex[17], ct_hex[17];
    if (m->tokenizer_config && small_file_hex(dir, m->tokenizer_config, tc_hex)) return -1;
    if (m->chat_template && small_file_hex(dir, m->chat_template, ct_hex)) return -1;
    snprintf(blk_hex, sizeof blk_hex, "%016llx", (unsigned long long)pln_config_xxh3(&m->config));
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(PLN_MANIFEST_FORMAT));
    json_object_set_new(root, "version", json_integer(PLN_MANIFEST_VERSION));
    json_object_set_new(root, "layout", json_string(m->layout));
    json_object_set_new(root, "tp", json_integer(m->tp));
    json_object_set_new(root, "dtype", json_string(m->dtype));
    json_object_set_new(root, "group_size", json_integer(m->group_size));
    json_object_set_new(root, "quantize_embedding", json_boolean(m->quantize_embedding));
    json_object_set_new(root, "vocab_padded", json_integer(m->vocab_padded));
    json_object_set_new(root, "config", config_to_json(&m->config));
    json_t *files = json_array();
    for (int32_t r = 0; r < m->tp; r++) {
        char want[64], hex[17];
        pln_shard_file_name((uint32_t)r, (uint32_t)m->tp, want, sizeof want);
        if (strcmp(m->files[r].name, want)) {
            json_decref(files);
            json_decref(root);
            return pln_errorf("%s: manifest: file of rank %d is named \"%s\", expected \"%s\"", dir, (int)r, m->files[r].name, want);
        }
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->files[r].xxh3);
        json_t *f = json_object();
        json_object_set_new(f, "name", json_string(m->files[r].name));
        json_object_set_new(f, "rank", json_integer(r));
        json_object_set_new(f, "size", json_integer((json_int_t)m->files[r].size));
        json_object_set_new(f, "xxh3", json_string(hex));
        json_array_append_new(files, f);
    }
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "tokenizer", m->tokenizer ? json_string(m->tokenizer) : json_null());
    json_object_set_new(root, "hf_config", m->hf_config ? json_string(m->hf_config) : json_null());
    json_object_set_new(root, "config_xxh3", json_string(blk_hex));
    json_object_set_new(root, "tokenizer_xxh3", m->tokenizer ? json_string(tok_hex) : json_null());
    json_object_set_new(root, "hf_config_xxh3", m->hf_config ? json_string(cfg_hex) : json_null());
    /* the chat files are optional keys: a set written before they existed simply has none */
    if (m->tokenizer_config) {
        json_object_set_new(root, "tokenizer_config", json_string(m->tokenizer_config));
        json_object_set_new(root, "tokenizer_config_xxh3", json_string(tc_hex));
    }
    if (m->chat_template) {
        json_object_set_new(root, "chat_template", json_string(m->chat_template));
        json_object_set_new(root, "chat_template_xxh3", json_string(ct_hex));
    }
    if (m->extra) {
        if (!json_is_object(m->extra)) { json_decref(root); return pln_errorf("%s: manifest: extra fields must be a JSON object", dir); }
        const char *key;
        json_t *val;
        json_object_foreach(m->extra, key, val) {
            if (json_object_get(root, key)) {
                json_decref(root);
                return pln_errorf("%s: manifest: extra field \"%s\" collides with a standard field", dir, key);
            }
            json_object_set(root, key, val);
        }
    }
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text) return pln_errorf("%s: manifest: cannot serialize (a non-finite number?)", dir);
    size_t len = strlen(text);
    text = pln_xrealloc(text, len + 2);
    text[len++] = '\n';
    text[len] = 0;
    char *path = pln_xasprintf("%s/%s", dir, PLN_MANIFEST_NAME);
    int rc = pln_write_file_atomic(path, text, len);
    free(path);
    free(text);
    return rc;
}

/* ---- shard set ------------------------------------------------------------------------------- */
static int get_int(json_t *o, const char *key, int64_t *out, const char *path, const char *ctx) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return pln_errorf("%s: %s\"%s\" is missing or not an integer", path, ctx, key);
    *out = json_integer_value(v);
    return 0;
}

static int get_str(json_t *o, const char *key, const char **out, const char *path, const char *ctx) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return pln_errorf("%s: %s\"%s\" is missing or not a string", path, ctx, key);
    *out = json_string_value(v);
    return 0;
}

static int parse_hex64(const char *s, uint64_t *out) {
    if (strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static int parse_config(json_t *c, pln_hf_config *cfg, const char *path) {
    const char *ctx = "config.";
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(c)) return pln_errorf("%s: \"config\" is missing or not an object", path);
    if (get_int(c, "vocab_size", &cfg->vocab_size, path, ctx) || get_int(c, "hidden_size", &cfg->hidden_size, path, ctx) ||
        get_int(c, "n_head", &cfg->n_head, path, ctx) || get_int(c, "n_layer", &cfg->n_layer, path, ctx) ||
        get_int(c, "bos_token_id", &cfg->bos_token_id, path, ctx) || get_int(c, "eos_token_id", &cfg->eos_token_id, path, ctx) ||
        get_int(c, "pad_token_id", &cfg->pad_token_id, path, ctx))
        return -1;
    json_t *eps = json_object_get(c, "layer_norm_epsilon");
    if (!json_is_number(eps)) return pln_errorf("%s: config.\"layer_norm_epsilon\" is missing or not a number", path);
    cfg->layer_norm_epsilon = json_number_value(eps);
    json_t *td = json_object_get(c, "torch_dtype");
    if (td && !(json_is_string(td) && strlen(json_string_value(td)) < sizeof cfg->torch_dtype))
        return pln_errorf("%s: config.\"torch_dtype\" must be a string of at most %zu bytes", path, sizeof cfg->torch_dtype - 1);
    if (td) snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", json_string_value(td));
    if (cfg->vocab_size < 1 || cfg->hidden_size < 1 || cfg->n_head < 1 || cfg->n_layer < 1 ||
        cfg->vocab_size > (1ll << 31) || cfg->hidden_size > (1ll << 24) || cfg->n_layer > 100000 || cfg->n_head > cfg->hidden_size)
        return pln_errorf("%s: config: vocab_size %lld, hidden_size %lld, n_head %lld, n_layer %lld out of range", path,
                          (long long)cfg->vocab_size, (long long)cfg->hidden_size, (long long)cfg->n_head, (long long)cfg->n_layer);
    if (cfg->hidden_size % cfg->n_head)
        return pln_errorf("%s: config: hidden_size %lld is not a multiple of n_head %lld", path, (long long)cfg->hidden_size, (long long)cfg->n_head);
    if (!(cfg->layer_norm_epsilon > 0 && cfg->layer_norm_epsilon < 1))
        return pln_errorf("%s: config: layer_norm_epsilon %g out of range", path, cfg->layer_norm_epsilon);
    const char *ids[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t idv[3] = {cfg->bos_token_id, cfg->eos_token_id, cfg->pad_token_id};
    for (int k = 0; k < 3; k++)
        if (idv[k] < 0 || idv[k] >= cfg->vocab_size)
            return pln_errorf("%s: config.\"%s\" %lld is outside the vocabulary [0, %lld)", path, ids[k], (long long)idv[k],
                              (long long)cfg->vocab_size);
    json_t *mt = json_object_get(c, "model_type");
    if (mt && !(json_is_string(mt) && strlen(json_string_value(mt)) < sizeof cfg->model_type))
        return pln_errorf("%s: config.\"model_type\" must be a string of at most %zu bytes", path, sizeof cfg->model_type - 1);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt ? json_string_value(mt) : "bloom");
    const pln_family *fam = pln_family_by_model_type(cfg->model_type);
    if (!fam) return pln_error_context("%s: config", path);
    if (fam->manifest_get(c, path, cfg)) return -1;
    return fam->config_servable(cfg, path);
}

/* The manifest's file name `name` (its field `key`) as a path inside the set directory. The name
 * is a plain file name (checked by the caller); a symlink may still lead out of the directory,
 * so the real paths are compared. NULL + error when missing or outside. */
static char *inside_path(const char *dir, const char *key, const char *name) {
    char *p = pln_xasprintf("%s/%s", dir, name);
    char *real = realpath(p, NULL), *rdir = real ? realpath(dir, NULL) : NULL;
    if (!real) {
        pln_errorf("%s: %s (the manifest's \"%s\" names it; re-copy the set or re-run reshard)", p,
                   errno == ENOENT ? "missing" : strerror(errno), key);
    } else if (rdir) {
        size_t n = strlen(rdir);
        bool inside = n == 1 ? real[1] != 0 : !strncmp(real, rdir, n) && real[n] == '/';
        if (!inside)
            pln_errorf("%s: the manifest's \"%s\" leads out of the set directory (to %s); the set's files must be inside it",
                       p, key, real);
        else {
            free(real);
            free(rdir);
            return p;
        }
    } else {
        pln_errorf("%s: cannot resolve: %s", dir, strerror(errno));
    }
    free(real);
    free(rdir);
    free(p);
    return NULL;
}

/* Compares a checksum field (16 hex digits) of the manifest with XXH3 of bytes. */
static int check_xxh3_field(json_t *root, const char *key, uint64_t got, const char *path, const char *what) {
    json_t *v = json_object_get(root, key);
    uint64_t want = 0;
    if (!json_is_string(v) || parse_hex64(json_string_value(v), &want))
        return pln_errorf("%s: \"%s\" is missing or not 16 lower-case hex digits", path, key);
    if (want != got)
        return pln_errorf("%s: checksum mismatch (the manifest's %s is %016llx, computed %016llx): changed after reshard; "
                          "re-copy the set or re-run reshard", what, key, (unsigned long long)want, (unsigned long long)got);
    return 0;
}

/* config.json (already parsed as cfg) against the manifest's config, field by field. */
static int config_agrees(const pln_hf_config *m, const pln_hf_config *f, const char *fpath, const char *mpath) {
    const char *names[8] = {"vocab_size", "hidden_size", "n_head", "n_layer", "bos_token_id", "eos_token_id", "pad_token_id", NULL};
    int64_t mv[7] = {m->vocab_size, m->hidden_size, m->n_head, m->n_layer, m->bos_token_id, m->eos_token_id, m->pad_token_id};
    int64_t fv[7] = {f->vocab_size, f->hidden_size, f->n_head, f->n_layer, f->bos_token_id, f->eos_token_id, f->pad_token_id};
    for (int k = 0; names[k]; k++)
        if (mv[k] != fv[k])
            return pln_errorf("%s: %s is %lld but %s says config.%s %lld: one of them was edited; re-run reshard", fpath,
                              names[k], (long long)fv[k], mpath, names[k], (long long)mv[k]);
    if (m->layer_norm_epsilon != f->layer_norm_epsilon)
        return pln_errorf("%s: layer_norm_epsilon is %.17g but %s says config.layer_norm_epsilon %.17g: one of them was "
                          "edited; re-run reshard", fpath, f->layer_norm_epsilon, mpath, m->layer_norm_epsilon);
    if (strcmp(m->torch_dtype, f->torch_dtype))
        return pln_errorf("%s: torch_dtype is \"%s\" but %s says config.torch_dtype \"%s\": one of them was edited; re-run "
                          "reshard", fpath, f->torch_dtype, mpath, m->torch_dtype);
    if (pln_family_of(m) != pln_family_of(f))
        return pln_errorf("%s: model_type is \"%s\" but %s says config.model_type \"%s\": one of them was edited; re-run reshard",
                          fpath, f->model_type, mpath, m->model_type);
    return pln_family_of(m)->config_agrees(m, f, fpath, mpath);
}

/* The tokenizer and config.json of the set, and (version >= 2) every recorded small-file
 * checksum: what loading always checks, because these files are tiny. */
static int shardset_small_files(pln_shardset *set, const char *path) {
    json_t *root = set->json;
    bool v2 = set->version >= 2;
    /* config.json first: a disagreement with it names the edited field, the block checksum cannot */
    const char *keys[4] = {"hf_config", "tokenizer", "tokenizer_config", "chat_template"},
               *xkeys[4] = {"hf_config_xxh3", "tokenizer_xxh3", "tokenizer_config_xxh3", "chat_template_xxh3"};
    char **paths[4] = {&set->config_path, &set->tokenizer_path, &set->tokenizer_config_path, &set->chat_template_path};
    for (int i = 0; i < 4; i++) {
        if (i == 1 && v2) {
            char what[600];
            snprintf(what, sizeof what, "%s: config block", path);
            if (check_xxh3_field(root, "config_xxh3", pln_config_xxh3(&set->config), path, what)) return -1;
        }
        json_t *t = json_object_get(root, keys[i]);
        json_t *x = json_object_get(root, xkeys[i]);
        if (!t || json_is_null(t)) {
            if (v2 && x && !json_is_null(x))
                return pln_errorf("%s: \"%s\" must be null when \"%s\" is null", path, xkeys[i], keys[i]);
            continue;
        }
        if (!json_is_string(t) || !safe_file_name(json_string_value(t)))
            return pln_errorf("%s: \"%s\" must be a plain file name in the set directory", path, keys[i]);
        if (!(*paths[i] = inside_path(set->dir, keys[i], json_string_value(t)))) return -1;
        size_t len = 0;
        char *text = pln_read_small_file(*paths[i], SMALL_FILE_MAX, &len);
        if (!text) return -1;
        int rc = 0;
        if (v2) rc = check_xxh3_field(root, xkeys[i], pln_xxh3(text, len), path, *paths[i]);
        if (!rc && i == 0) {
            json_error_t jerr;
            json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
            pln_hf_config hc;
            if (!o) rc = pln_errorf("%s: not valid JSON: %s (line %d); re-copy the set or re-run reshard", *paths[i], jerr.text, jerr.line);
            else if (pln_hf_config_from_json(o, *paths[i], &hc)) rc = -1;
            else rc = config_agrees(&set->config, &hc, *paths[i], path);
            if (o) json_decref(o);
        }
        free(text);
        if (rc) return -1;
    }
    set->small_files_checked = v2;
    return 0;
}

static int shardset_parse(pln_shardset *set, const char *path) {
    json_t *root = set->json;
    const char *s = NULL;
    int64_t v = 0;
    if (!json_is_object(root)) return pln_errorf("%s: not a JSON object", path);
    if (get_str(root, "format", &s, path, "")) return -1;
    if (strcmp(s, PLN_MANIFEST_FORMAT)) return pln_errorf("%s: format \"%s\" is not \"%s\"", path, s, PLN_MANIFEST_FORMAT);
    if (get_int(root, "version", &v, path, "")) return -1;
    if (v < PLN_MANIFEST_VERSION_MIN || v > PLN_MANIFEST_VERSION)
        return pln_errorf("%s: manifest version %lld is not supported (this pollen reads versions %d to %d); re-run reshard with this pollen",
                          path, (long long)v, PLN_MANIFEST_VERSION_MIN, PLN_MANIFEST_VERSION);
    set->version = (uint32_t)v;
    if (get_str(root, "layout", &s, path, "")) return -1;
    if (!pln_family_by_layout(s)) return pln_error_context("%s", path);
    snprintf(set->layout, sizeof set->layout, "%s", s);
    if (get_int(root, "tp", &v, path, "")) return -1;
    if (v < 1 || v > 4096) return pln_errorf("%s: tp %lld out of range 1..4096", path, (long long)v);
    set->tp = (int32_t)v;
    json_t *files = json_object_get(root, "files");
    if (!json_is_array(files)) return pln_errorf("%s: \"files\" is missing or not an array", path);
    if (json_array_size(files) != (size_t)set->tp)
        return pln_errorf("%s: %zu rank files listed but tp is %d", path, json_array_size(files), (int)set->tp);
    if (get_str(root, "dtype", &s, path, "")) return -1;
    if (strcmp(s, "fp16") && strcmp(s, "int8") && strcmp(s, "int4"))
        return pln_errorf("%s: dtype \"%s\" is not \"fp16\", \"int8\" or \"int4\"", path, s);
    snprintf(set->dtype, sizeof set->dtype, "%s", s);
    if (get_int(root, "group_size", &set->group_size, path, "")) return -1;
    if (set->group_size < 0) return pln_errorf("%s: group_size %lld is negative", path, (long long)set->group_size);
    json_t *qe = json_object_get(root, "quantize_embedding");
    if (!json_is_boolean(qe)) return pln_errorf("%s: \"quantize_embedding\" is missing or not a boolean", path);
    set->quantize_embedding = json_is_true(qe);
    if (!strcmp(set->dtype, "int4") && set->group_size != 32 && set->group_size != 64 && set->group_size != 128)
        return pln_errorf("%s: group_size %lld: dtype \"int4\" needs 32, 64 or 128", path, (long long)set->group_size);
    if (!strcmp(set->dtype, "fp16") && (set->group_size != 0 || set->quantize_embedding))
        return pln_errorf("%s: \"%s\" must be %s for dtype \"fp16\"", path, set->group_size ? "group_size" : "quantize_embedding",
                          set->group_size ? "0" : "false");
    if (get_int(root, "vocab_padded", &set->vocab_padded, path, "")) return -1;
    if (parse_config(json_object_get(root, "config"), &set->config, path)) return -1;
    if (strcmp(pln_family_of(&set->config)->layout, set->layout))
        return pln_errorf("%s: layout \"%s\" does not fit config.model_type \"%s\" (whose layout is \"%s\")", path, set->layout,
                          set->config.model_type, pln_family_of(&set->config)->layout);
    if (set->vocab_padded != pln_vocab_padded(set->config.vocab_size, set->tp))
        return pln_errorf("%s: vocab_padded %lld is not vocab_size %lld rounded up to a multiple of tp %d", path,
                          (long long)set->vocab_padded, (long long)set->config.vocab_size, (int)set->tp);
    if (set->config.n_head % set->tp)
        return pln_errorf("%s: n_head %lld is not divisible by tp %d", path, (long long)set->config.n_head, (int)set->tp);
    set->files = pln_xcalloc((size_t)set->tp, sizeof *set->files);
    for (int32_t r = 0; r < set->tp; r++) {
        json_t *f = json_array_get(files, (size_t)r);
        char ctx[32], want[64];
        snprintf(ctx, sizeof ctx, "files[%d].", (int)r);
        if (!json_is_object(f)) return pln_errorf("%s: files[%d] is not an object", path, (int)r);
        const char *name = NULL, *hex = NULL;
        int64_t rank = 0, size = 0;
        if (get_str(f, "name", &name, path, ctx) || get_int(f, "rank", &rank, path, ctx) ||
            get_int(f, "size", &size, path, ctx) || get_str(f, "xxh3", &hex, path, ctx))
            return -1;
        if (rank != r) return pln_errorf("%s: files[%d] has rank %lld; files must be listed in rank order", path, (int)r, (long long)rank);
        pln_shard_file_name((uint32_t)r, (uint32_t)set->tp, want, sizeof want);
        if (strcmp(name, want)) return pln_errorf("%s: files[%d] is named \"%s\", expected \"%s\"", path, (int)r, name, want);
        if (size < 0) return pln_errorf("%s: files[%d].size is negative", path, (int)r);
        pln_shardset_file *sf = &set->files[r];
        snprintf(sf->name, sizeof sf->name, "%s", name);
        sf->size = (uint64_t)size;
        if (parse_hex64(hex, &sf->xxh3)) return pln_errorf("%s: files[%d].xxh3 \"%s\" is not 16 lower-case hex digits", path, (int)r, hex);
        sf->path = pln_xasprintf("%s/%s", set->dir, name);
        struct stat st;
        if (stat(sf->path, &st) != 0)
            return pln_errorf("%s: rank file missing (%s; the manifest lists %d rank files)", sf->path, strerror(errno), (int)set->tp);
        if (!S_ISREG(st.st_mode)) return pln_errorf("%s: is %s, not a regular file", sf->path, pln_file_type_name(st.st_mode));
        if ((uint64_t)st.st_size != sf->size)
            return pln_errorf("%s: file size %lld differs from the manifest's %llu (truncated or replaced; re-copy the set or re-run reshard)",
                              sf->path, (long long)st.st_size, (unsigned long long)sf->size);
    }
    return shardset_small_files(set, path);
}

/* A file where the set's directory belongs (a rank file, the manifest itself): say which
 * directory to give instead of "manifest.json: Not a directory". */
static void shardset_file_given(const char *file) {
    /* Only the magic is read, without blocking: the path was a regular file a moment ago, but it may
     * have been swapped for a FIFO since. */
    char magic[sizeof PLN_SHARD_MAGIC - 1] = {0};
    int fd = open(file, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat fst;
    bool rank_file = fd >= 0 && fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) &&
                     read(fd, magic, sizeof magic) == (ssize_t)sizeof magic && !memcmp(magic, PLN_SHARD_MAGIC, sizeof magic);
    if (fd >= 0) close(fd);
    const char *slash = strrchr(file, '/');
    const char *base = slash ? slash + 1 : file;
    char *parent = slash ? pln_xasprintf("%.*s", (int)(slash == file ? 1 : slash - file), file) : pln_xstrdup(".");
    if (rank_file)
        pln_errorf("%s is a rank file of a shard set; give the set's directory (%s)", file, parent);
    else if (!strcmp(base, PLN_MANIFEST_NAME))
        pln_errorf("%s is the manifest of a shard set; give the set's directory (%s)", file, parent);
    else
        pln_errorf("%s is a file, not a pollen shard set: give the directory that holds %s and the rank files "
                   "(make one with `pollen reshard`)", file, PLN_MANIFEST_NAME);
    free(parent);
}

pln_shardset *pln_shardset_open(const char *dir) {
    pln_shardset *set = pln_xcalloc(1, sizeof *set);
    set->dir = pln_xstrdup(dir);
    char *path = pln_xasprintf("%s/%s", dir, PLN_MANIFEST_NAME);
    size_t len;
    char *text = pln_read_small_file(path, 64u << 20, &len);
    if (!text) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISREG(st.st_mode))
            shardset_file_given(dir);
        else if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
            pln_errorf("%s: is %s, not a directory (a shard set is the directory `pollen reshard` writes)", dir,
                       pln_file_type_name(st.st_mode));
        else if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && stat(path, &st) != 0)
            pln_errorf("%s: no %s: not a pollen shard set (make one with `pollen reshard`)", dir, PLN_MANIFEST_NAME);
        goto fail;
    }
    json_error_t jerr;
    set->json = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!set->json) { pln_errorf("%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text); goto fail; }
    if (shardset_parse(set, path)) goto fail;
    free(path);
    return set;
fail:
    free(path);
    pln_shardset_close(set);
    return NULL;
}

void pln_shardset_close(pln_shardset *set) {
    if (!set) return;
    if (set->files)
        for (int32_t r = 0; r < set->tp; r++) free(set->files[r].path);
    free(set->files);
    free(set->tokenizer_path);
    free(set->config_path);
    free(set->tokenizer_config_path);
    free(set->chat_template_path);
    if (set->json) json_decref(set->json);
    free(set->dir);
    free(set);
}

static const char *spec_str(pln_dtype dt, int ndim, const int64_t *shape, char *buf, size_t len) {
    char sh[160];
    snprintf(buf, len, "%s %s", pln_dtype_name(dt), pln_shape_str(shape, ndim, sh, sizeof sh));
    return buf;
}

pln_shard *pln_shardset_open_rank(const pln_shardset *set, int32_t rank) {
    if (rank < 0 || rank >= set->tp) {
        pln_errorf("%s: rank %d is outside the set's tp %d (launch with exactly %d ranks)", set->dir, (int)rank, (int)set->tp, (int)set->tp);
        return NULL;
    }
    const pln_shardset_file *f = &set->files[rank];
    pln_shard *s = pln_shard_open(f->path);
    if (!s) return NULL;
    pln_layout_params lp = {&set->config, set->tp, !strcmp(set->dtype, "int8"), set->group_size, set->quantize_embedding, set->vocab_padded,
                            !strcmp(set->dtype, "int4")};
    pln_shard_spec *specs = NULL;
    size_t n = 0;
    if (s->rank != (uint32_t)rank || s->n_ranks != (uint32_t)set->tp) {
        pln_errorf("%s: file says rank %u of %u, manifest says rank %d of %d", f->path, s->rank, s->n_ranks, (int)rank, (int)set->tp);
        goto fail;
    }
    if (strcmp(s->layout, set->layout)) { pln_errorf("%s: layout \"%s\" differs from the manifest's \"%s\"", f->path, s->layout, set->layout); goto fail; }
    if (s->header_xxh3 != f->xxh3) {
        pln_errorf("%s: header checksum %016llx differs from the manifest's %016llx (file from another conversion?)", f->path,
                   (unsigned long long)s->header_xxh3, (unsigned long long)f->xxh3);
        goto fail;
    }
    specs = pln_family_by_layout(set->layout)->layout_specs(&lp, rank, &n);
    if (!specs) { pln_error_context("%s", f->path); goto fail; }
    for (size_t i = 0; i < n && i < s->n_tensors; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        bool same = !strcmp(t->name, specs[i].name) && t->dtype == specs[i].dtype && t->ndim == specs[i].ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == specs[i].shape[d];
        if (!same) {
            char a[200], b[200];
            pln_errorf("%s: tensor #%zu is \"%s\" %s but layout %s expects \"%s\" %s", f->path, i, t->name,
                       spec_str(t->dtype, t->ndim, t->shape, a, sizeof a), set->layout, specs[i].name,
                       spec_str(specs[i].dtype, specs[i].ndim, specs[i].shape, b, sizeof b));
            goto fail;
        }
    }
    if (n != s->n_tensors) {
        pln_errorf("%s: %llu tensors, but layout %s with this manifest's settings has %zu", f->path, (unsigned long long)s->n_tensors, set->layout, n);
        goto fail;
    }
    pln_layout_free(specs, n);
    return s;
fail:
    pln_layout_free(specs, n);
    pln_shard_close(s);
    return NULL;
}

/* ---- bloom-tp-v1 ------------------------------------------------------------------------------- */
int64_t pln_vocab_padded(int64_t vocab_size, int32_t tp) {
    return tp > 0 ? (vocab_size + tp - 1) / tp * tp : vocab_size;
}

typedef struct {
    pln_shard_spec *v;
    size_t n, cap;
} spec_list;

static void add_spec(spec_list *l, pln_dtype dt, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void add_spec(spec_list *l, pln_dtype dt, int ndim, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = pln_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    pln_shard_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    char *name = NULL;
    if (vasprintf(&name, fmt, ap) < 0) pln_die("out of memory");
    va_end(ap);
    s->name = name;
    s->dtype = dt;
    s->ndim = ndim;
    s->shape[0] = d0;
    if (ndim > 1) s->shape[1] = d1;
}

/* A linear weight [rows, cols]: F16 (bits 16), or I8 (bits 8) or packed int4 U8 [rows, cols / 2]
 * (bits 4) followed by its F16 scales [rows, cols / G]. */
static int add_linear(spec_list *l, int bits, int64_t group, int64_t rows, int64_t cols, const char *name) {
    if (bits == 16) { add_spec(l, PLN_DTYPE_F16, 2, rows, cols, "%s", name); return 0; }
    int64_t g = group ? group : cols;
    if (cols % g) return pln_errorf("%s: group size %lld does not divide its %lld input columns", name, (long long)g, (long long)cols);
    if (bits == 4 && g % 32) return pln_errorf("%s: int4 group size %lld is not a multiple of 32", name, (long long)g);
    if (bits == 4) add_spec(l, PLN_DTYPE_U8, 2, rows, cols / 2, "%s", name);
    else add_spec(l, PLN_DTYPE_I8, 2, rows, cols, "%s", name);
    add_spec(l, PLN_DTYPE_F16, 2, rows, cols / g, "%s_scale", name);
    return 0;
}

pln_shard_spec *pln_layout_bloom_tp_v1(const pln_layout_params *p, int32_t rank, size_t *n) {
    const pln_hf_config *c = p->config;
    int64_t H = c->hidden_size, tp = p->tp;
    *n = 0;
    if (tp < 1 || rank < 0 || rank >= tp) { pln_errorf("bloom-tp-v1: rank %d of tp %d", (int)rank, (int)tp); return NULL; }
    if (H < 1 || c->n_head < 1 || c->n_layer < 1 || c->vocab_size < 1) { pln_errorf("bloom-tp-v1: config has a non-positive size"); return NULL; }
    if (c->n_head % tp) { pln_errorf("bloom-tp-v1: n_head %lld is not divisible by tp %lld", (long long)c->n_head, (long long)tp); return NULL; }
    if (H % c->n_head) { pln_errorf("bloom-tp-v1: hidden_size %lld is not divisible by n_head %lld", (long long)H, (long long)c->n_head); return NULL; }
    if (p->vocab_padded < c->vocab_size || p->vocab_padded % tp) {
        pln_errorf("bloom-tp-v1: vocab_padded %lld must be >= vocab_size %lld and divisible by tp %lld", (long long)p->vocab_padded,
                   (long long)c->vocab_size, (long long)tp);
        return NULL;
    }
    bool quant = p->int8 || p->int4;
    if (p->int8 && p->int4) { pln_errorf("bloom-tp-v1: dtype int8 and int4 at once"); return NULL; }
    if (p->group_size < 0 || (!quant && p->group_size)) { pln_errorf("bloom-tp-v1: group_size %lld needs dtype int8 or int4", (long long)p->group_size); return NULL; }
    if (p->int4 && !p->group_size) { pln_errorf("bloom-tp-v1: dtype int4 needs a group_size"); return NULL; }
    if (p->quantize_embedding && !quant) { pln_errorf("bloom-tp-v1: quantize_embedding needs dtype int8 or int4"); return NULL; }
    int lin = p->int4 ? 4 : p->int8 ? 8 : 16;
    int64_t Vr = p->vocab_padded / tp, Hl = H / tp;
    spec_list l = {0};
    char nm[96];
    if (add_linear(&l, p->quantize_embedding ? 8 : 16, p->group_size, Vr, H, "word_embeddings.weight")) goto fail;
    add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "word_embeddings_layernorm.weight");
    add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "word_embeddings_layernorm.bias");
    for (int64_t i = 0; i < c->n_layer; i++) {
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.input_layernorm.weight", (long long)i);
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.input_layernorm.bias", (long long)i);
        snprintf(nm, sizeof nm, "h.%lld.self_attention.query_key_value.weight", (long long)i);
        if (add_linear(&l, lin, p->group_size, 3 * Hl, H, nm)) goto fail;
        add_spec(&l, PLN_DTYPE_F16, 1, 3 * Hl, 0, "h.%lld.self_attention.query_key_value.bias", (long long)i);
        snprintf(nm, sizeof nm, "h.%lld.self_attention.dense.weight", (long long)i);
        if (add_linear(&l, lin, p->group_size, H, Hl, nm)) goto fail;
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.self_attention.dense.bias", (long long)i);
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.post_attention_layernorm.weight", (long long)i);
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.post_attention_layernorm.bias", (long long)i);
        snprintf(nm, sizeof nm, "h.%lld.mlp.dense_h_to_4h.weight", (long long)i);
        if (add_linear(&l, lin, p->group_size, 4 * Hl, H, nm)) goto fail;
        add_spec(&l, PLN_DTYPE_F16, 1, 4 * Hl, 0, "h.%lld.mlp.dense_h_to_4h.bias", (long long)i);
        snprintf(nm, sizeof nm, "h.%lld.mlp.dense_4h_to_h.weight", (long long)i);
        if (add_linear(&l, lin, p->group_size, H, 4 * Hl, nm)) goto fail;
        add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "h.%lld.mlp.dense_4h_to_h.bias", (long long)i);
    }
    add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "ln_f.weight");
    add_spec(&l, PLN_DTYPE_F16, 1, H, 0, "ln_f.bias");
    *n = l.n;
    return l.v;
fail:
    pln_error_context("bloom-tp-v1");
    pln_layout_free(l.v, l.n);
    return NULL;
}

void pln_layout_free(pln_shard_spec *specs, size_t n) {
    if (!specs) return;
    for (size_t i = 0; i < n; i++) free((char *)specs[i].name);
    free(specs);
}

int pln_layout_check_scales(const pln_shard *s) {
    for (uint64_t i = 0; i < s->n_tensors; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        size_t nl = strlen(t->name);
        if (t->dtype != PLN_DTYPE_F16 || nl < 6 || strcmp(t->name + nl - 6, "_scale")) continue;
        const uint8_t *d = pln_shard_data(s, t);
        uint64_t n = t->nbytes / 2;
        for (uint64_t k = 0; k < n; k++) {
            uint16_t h = (uint16_t)(d[2 * k] | d[2 * k + 1] << 8);
            /* fp16 bits: positive, non-zero and finite is exactly 0x0001..0x7bff */
            if (h >= 1 && h <= 0x7bff) continue;
            int64_t cols = t->ndim == 2 && t->shape[1] > 0 ? t->shape[1] : 1;
            const char *what = (h & 0x7c00) == 0x7c00 ? ((h & 0x3ff) ? "NaN" : "infinite") : (h & 0x7fff) == 0 ? "zero" : "negative";
            return pln_errorf("%s: tensor \"%s\": scale [%lld, %lld] is %s (fp16 bits 0x%04x); scales must be finite and "
                              "positive: the file is corrupt; re-run reshard", s->path, t->name, (long long)(k / (uint64_t)cols),
                              (long long)(k % (uint64_t)cols), what, h);
        }
    }
    return 0;
}

/* First non-zero byte of [from, to) of the file, or `to`. */
static uint64_t first_nonzero(const pln_shard *s, uint64_t from, uint64_t to) {
    for (uint64_t o = from; o < to; o++)
        if (s->map.data[o]) return o;
    return to;
}

int pln_shard_check_padding(const pln_shard *s) {
    uint64_t at = s->table_offset + s->table_size;
    const char *after = "the tensor table";
    for (uint64_t i = 0; i <= s->n_tensors; i++) {
        uint64_t to = i < s->n_tensors ? s->tensors[i].offset : s->file_size;
        uint64_t nz = first_nonzero(s, at, to);
        if (nz < to)
            return pln_errorf("%s: padding byte at offset %llu (after %s%s%s) is 0x%02x, not zero as the format requires: the file "
                              "was changed after reshard; re-copy it or re-run reshard", s->path, (unsigned long long)nz,
                              i ? "tensor \"" : after, i ? s->tensors[i - 1].name : "", i ? "\"" : "", s->map.data[nz]);
        if (i < s->n_tensors) {
            at = s->tensors[i].offset + s->tensors[i].nbytes;
        }
    }
    return 0;
}
