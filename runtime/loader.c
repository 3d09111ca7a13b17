/* loader.c — this rank's file of a shard set, as backend memory: the manifest says the TP size and
 * config, the shard reader validates the rank file (and its table against the set's layout),
 * then the CPU backend uses the mapping in place and device backends stream the data region into
 * one allocation with large reads. */
#include "runtime/loader.h"
#include "formats/shard.h"
#include "runtime/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

struct pln_loader {
    pln_backend *be;
    pln_shardset *set;
    pln_shard *shard;
    pln_model_config cfg;
    const uint8_t *base;         /* backend memory holding the data region */
    void *owned;                 /* the allocation when the backend copied (load_file) */
    double seconds;
    double rate;                 /* bytes/s of load_file; 0 when the mapping is used in place */
    char *tokenizer_path;
};

/* Faults every page of the mapping in (parallel reads of one byte per page). */
static void populate(const pln_map *m) {
#ifdef MADV_POPULATE_READ
    if (madvise((void *)m->data, m->size, MADV_POPULATE_READ) == 0) return;
#endif
    volatile uint8_t sink = 0;
    uint64_t pages = (m->size + 4095) / 4096;
    uint8_t acc = 0;
#pragma omp parallel for reduction(^ : acc) schedule(static)
    for (uint64_t i = 0; i < pages; i++) acc ^= m->data[i * 4096];
    sink = acc;
    (void)sink;
}

/* --verify on backends that stream the file: every tensor is hashed as its bytes pass through
 * the staging buffers, so the file is read once. Tensors lie in offset order; the gaps between
 * them are alignment padding. */
typedef struct {
    const pln_shard *s;
    XXH3_state_t *st;
    uint64_t i;                  /* the tensor being hashed */
    uint64_t done;               /* its bytes hashed so far */
    int64_t bad;
    const char *first_bad;
} stream_verify;

static void verify_tensor_done(stream_verify *v, uint64_t digest) {
    const pln_shard_tensor *t = &v->s->tensors[v->i];
    if (digest != t->xxh3 && v->bad++ == 0) v->first_bad = t->name;
    v->i++;
    v->done = 0;
}

static void verify_bytes(void *ctx, uint64_t at, const void *p, size_t n) {
    stream_verify *v = ctx;
    const uint8_t *b = p;
    uint64_t pos = v->s->data_offset + at, end = pos + n;   /* absolute file offsets of b[0..n) */
    while (v->i < v->s->n_tensors) {
        const pln_shard_tensor *t = &v->s->tensors[v->i];
        if (t->nbytes == 0) { verify_tensor_done(v, XXH3_64bits(NULL, 0)); continue; }
        uint64_t from = t->offset + v->done, to = t->offset + t->nbytes;
        if (from >= end) return;                  /* the tensor starts in a later piece */
        if (from < pos) from = pos;               /* cannot happen: pieces arrive in order */
        uint64_t upto = to < end ? to : end;
        if (v->done == 0) XXH3_64bits_reset(v->st);
        XXH3_64bits_update(v->st, b + (from - pos), (size_t)(upto - from));
        v->done += upto - from;
        if (v->done < t->nbytes) return;          /* continues in the next piece */
        verify_tensor_done(v, XXH3_64bits_digest(v->st));
    }
}

/* What watches the streamed bytes: the checksums (--verify) and the progress bar. */
typedef struct {
    stream_verify *v;
    pln_progress *pg;
} load_watch;

static void watch_bytes(void *ctx, uint64_t at, const void *p, size_t n) {
    load_watch *w = ctx;
    if (w->v) verify_bytes(w->v, at, p, n);
    pln_progress_add(w->pg, n);
}

pln_loader *pln_loader_open(const char *dir, int rank, int size, pln_backend *be,
                            const pln_loader_opts *opts) {
    double t0 = pln_now();
    pln_loader *l = pln_xcalloc(1, sizeof *l);
    l->be = be;
    l->set = pln_shardset_open(dir);
    if (!l->set) goto fail;
    if (l->set->tp != size) {
        pln_errorf("%s: the shard set has TP=%d but %d rank%s started; run it with `mpirun -np %d` "
                   "(or reshard with --tp %d)", dir, l->set->tp, size, size == 1 ? " was" : "s were",
                   l->set->tp, size);
        goto fail;
    }
    if (!pln_model_family_by_layout(l->set->layout)) {
        pln_error_context("%s", dir);
        goto fail;
    }
    l->shard = pln_shardset_open_rank(l->set, rank);
    if (!l->shard) goto fail;
    /* Test hook: a slow load, so tests can signal a process or change its files mid-load. With
     * PLN_TEST_LOAD_GO the pause ends as soon as that path exists (the delay is then its bound):
     * a test that changes the file first and then creates the path cannot lose the race to a
     * loaded machine, whatever the scheduler does to it. */
    const char *delay = getenv("PLN_TEST_LOAD_DELAY_MS");
    if (delay && atoi(delay) > 0) {
        const char *go = getenv("PLN_TEST_LOAD_GO");
        if (go && !*go) go = NULL;
        fprintf(stderr, "pollen: PLN_TEST_LOAD_DELAY_MS: rank %d (pid %d) pausing %d ms with %s open%s%s\n", rank,
                (int)getpid(), atoi(delay), l->shard->path, go ? ", or until this exists: " : "", go ? go : "");
        if (!go) usleep((useconds_t)atoi(delay) * 1000);
        for (double until = pln_now() + atoi(delay) / 1000.0; go && pln_now() < until && access(go, F_OK) != 0;)
            usleep(10000);
    }
    /* Always, unlike the data checksums (--verify): the scales are a small part of the file, and a
     * NaN or infinite one would turn every logit into NaN without any error. */
    if (pln_layout_check_scales(l->shard)) goto fail;
    if (!l->set->small_files_checked && rank == 0)   /* a warning, not progress: --quiet keeps it */
        fprintf(stderr, "pollen: warning: %s: manifest version %u records no checksums of its config block, tokenizer and "
                "config.json (only their agreement was checked); re-run reshard to add them\n", dir, l->set->version);

    const pln_hf_config *bc = &l->set->config;
    pln_model_config *c = &l->cfg;
    c->vocab_size = bc->vocab_size;
    c->vocab_padded = l->set->vocab_padded;
    c->hidden = bc->hidden_size;
    c->n_head = bc->n_head;
    c->n_layer = bc->n_layer;
    c->eps = (float)bc->layer_norm_epsilon;
    c->tp = l->set->tp;
    c->rank = rank;
    c->eos_id = (int32_t)bc->eos_token_id;
    c->bos_id = (int32_t)bc->bos_token_id;
    c->pad_id = (int32_t)bc->pad_token_id;
    snprintf(c->dtype, sizeof c->dtype, "%s", l->set->dtype);
    c->group_size = l->set->group_size;
    c->quantize_embedding = l->set->quantize_embedding;
    snprintf(c->layout, sizeof c->layout, "%s", l->set->layout);
    c->hf = *bc;

    pln_shard *s = l->shard;
    /* Read-ahead of the whole mapping only where the mapping is the weights (CPU): a backend that
     * streams the file itself (CUDA, O_DIRECT) would otherwise read it twice. */
    /* Streamed with reads by the backend (load_file), or taken from host memory: the mapping, or
     * with --no-mmap the anonymous copy already read (never read a second time). */
    const bool stream = be->load_file && !s->map.in_memory;
    if (!stream) pln_map_advise_sequential(&s->map);
    /* 2 MiB pages: asked for when the rank file was opened (formats/common.c MAP_HUGE_NOTE). */
    if (opts && opts->populate && !stream) populate(&s->map);
    bool verify_now = opts && opts->verify && !stream;
    if (verify_now) {
        int64_t bad = pln_shard_verify_all(s, NULL);
        if (bad != 0) {
            pln_error_context("%s: %lld tensor%s failed checksum verification (re-copy or re-create the "
                              "set; `pollen verify` lists them)", s->path, (long long)bad, bad == 1 ? "" : "s");
            goto fail;
        }
    }
    const uint8_t *region = s->map.data + s->data_offset;
    if (stream) {
        double rate = 0;
        l->owned = be->alloc(be, s->data_size ? s->data_size : 1);
        if (!l->owned) { pln_error_context("%s: backend memory for %llu bytes of weights", s->path, (unsigned long long)s->data_size); goto fail; }
        stream_verify v = {.s = s};
        bool verify = opts && opts->verify;
        if (verify && !(v.st = XXH3_createState())) { pln_errorf("%s: out of memory for a checksum state", s->path); goto fail; }
        /* A bar on a terminal (rank 0 only: the caller makes the others quiet). */
        pln_progress pg;
        const char *base = strrchr(s->path, '/');
        pln_progress_init(&pg, base ? base + 1 : s->path, s->data_size, opts ? opts->quiet : false);
        load_watch w = {verify ? &v : NULL, &pg};
        int lrc = be->load_file(be, l->owned, s->path, s->data_offset, s->data_size, &rate, watch_bytes, &w);
        pln_progress_done(&pg);
        if (v.st) XXH3_freeState(v.st);
        if (lrc) {
            pln_error_context("%s: loading weights", s->path);
            goto fail;
        }
        if (verify && (v.bad || v.i < s->n_tensors)) {
            if (v.bad)
                pln_errorf("%s: %lld tensor%s failed checksum verification while loading, first %s (re-copy or "
                           "re-create the set; `pollen verify` lists them)", s->path, (long long)v.bad,
                           v.bad == 1 ? "" : "s", v.first_bad);
            else
                pln_errorf("%s: only %llu of %llu tensors were checked while loading", s->path,
                           (unsigned long long)v.i, (unsigned long long)s->n_tensors);
            goto fail;
        }
        l->base = l->owned;
        l->rate = rate;
    } else {
        l->base = be->weights_from_host(be, NULL, region, s->data_size);
        if (!l->base) { pln_error_context("%s: weights", s->path); goto fail; }
        if (l->base != region) l->owned = (void *)l->base;   /* a device copy (cuda, --no-mmap) */
    }
    /* The file the manifest names (checked at set open), or none: never a guessed name. */
    if (l->set->tokenizer_path) l->tokenizer_path = pln_xstrdup(l->set->tokenizer_path);
    l->seconds = pln_now() - t0;
    return l;
fail:
    pln_loader_close(l);
    return NULL;
}

void pln_loader_close(pln_loader *l) {
    if (!l) return;
    if (l->owned) l->be->free(l->be, l->owned);
    if (l->shard) pln_shard_close(l->shard);
    if (l->set) pln_shardset_close(l->set);
    free(l->tokenizer_path);
    free(l);
}

const pln_model_config *pln_loader_config(const pln_loader *l) { return &l->cfg; }
uint64_t pln_loader_weight_bytes(const pln_loader *l) { return l->shard->data_size; }
double pln_loader_seconds(const pln_loader *l) { return l->seconds; }
double pln_loader_rate(const pln_loader *l) { return l->rate; }
const char *pln_loader_tokenizer_path(const pln_loader *l) { return l->tokenizer_path; }

static const pln_shard_tensor *find(pln_loader *l, const char *name) {
    const pln_shard_tensor *t = pln_shard_find(l->shard, name);
    if (!t) pln_errorf("%s: no tensor %s (is this a %s set?)", l->shard->path, name, l->set->layout);
    return t;
}

static const void *dev_ptr(const pln_loader *l, const pln_shard_tensor *t) {
    return l->base + (t->offset - l->shard->data_offset);
}

int pln_loader_f16(pln_loader *l, const char *name, int64_t numel, const uint16_t **out) {
    const pln_shard_tensor *t = find(l, name);
    if (!t) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    if (t->dtype != PLN_DTYPE_F16 || n != numel)
        return pln_errorf("%s: tensor %s is %s with %lld elements, expected F16 with %lld", l->shard->path,
                          name, pln_dtype_name(t->dtype), (long long)n, (long long)numel);
    *out = dev_ptr(l, t);
    return 0;
}

static int weight(pln_loader *l, const char *name, int64_t rows, int64_t cols, pln_weight *out, bool host) {
    const pln_shard_tensor *t = find(l, name);
    if (!t) return -1;
    char sh[64];
    /* packed int4 (U8) holds two weights per byte: [rows, cols / 2] */
    int64_t stored = t->dtype == PLN_DTYPE_U8 ? cols / 2 : cols;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != stored || (t->dtype == PLN_DTYPE_U8 && cols % 32) ||
        (t->dtype != PLN_DTYPE_F16 && t->dtype != PLN_DTYPE_I8 && t->dtype != PLN_DTYPE_U8))
        return pln_errorf("%s: tensor %s is %s %s, expected F16 or I8 [%lld, %lld] (or U8, packed int4, with half the columns)", l->shard->path, name,
                          pln_dtype_name(t->dtype), pln_shape_str(t->shape, t->ndim, sh, sizeof sh),
                          (long long)rows, (long long)cols);
    memset(out, 0, sizeof *out);
    out->dtype = t->dtype;
    out->rows = rows;
    out->cols = cols;
    out->w = host ? pln_shard_data(l->shard, t) : dev_ptr(l, t);
    if (t->dtype == PLN_DTYPE_I8 || t->dtype == PLN_DTYPE_U8) {
        char sname[PLN_SHARD_NAME_MAX + 8];
        snprintf(sname, sizeof sname, "%s_scale", name);
        const pln_shard_tensor *st = find(l, sname);
        if (!st) return -1;
        if (st->ndim != 2 || st->shape[0] != rows || st->shape[1] < 1 || cols % st->shape[1] || st->dtype != PLN_DTYPE_F16)
            return pln_errorf("%s: tensor %s is %s %s, expected F16 [%lld, G] with G dividing %lld", l->shard->path,
                              sname, pln_dtype_name(st->dtype), pln_shape_str(st->shape, st->ndim, sh, sizeof sh),
                              (long long)rows, (long long)cols);
        out->scale = host ? pln_shard_data(l->shard, st) : dev_ptr(l, st);
        out->group = cols / st->shape[1];
        if (t->dtype == PLN_DTYPE_U8 && out->group % 32)
            return pln_errorf("%s: tensor %s: int4 groups of %lld columns; the packed layout needs a multiple of 32", l->shard->path,
                              sname, (long long)out->group);
    }
    return 0;
}

int pln_loader_weight(pln_loader *l, const char *name, int64_t rows, int64_t cols, pln_weight *out) {
    return weight(l, name, rows, cols, out, false);
}
int pln_loader_weight_host(pln_loader *l, const char *name, int64_t rows, int64_t cols, pln_weight *out) {
    return weight(l, name, rows, cols, out, true);
}
