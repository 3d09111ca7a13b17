/* cmd_inspect.c — `pollen inspect PATH`: the config and tensor table of a Hugging Face checkpoint
 * (directory, .safetensors, .bin, index .json), a pollen shard set or a single rank file, with
 * optional per-tensor statistics, the first values of one tensor, and JSON output.
 *
 * Listing reads headers only (safetensors headers, zip directories and pickles, shard tables), so
 * it is fast on a 352 GB checkpoint; data pages are touched only for --stats and --tensor. */
#include "formats/common.h"
#include "formats/family.h"
#include "formats/hf.h"
#include "formats/shard.h"
#include "kernels/pln_math.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor as shown, whatever it came from. */
typedef struct {
    const char *name;
    pln_dtype dtype;
    int ndim;
    int64_t shape[PLN_MAX_DIMS];
    uint64_t nbytes;
    const char *file;
    uint64_t offset;
    int rank;                    /* TP rank for shards, -1 for checkpoints */
    const uint8_t *data;         /* NULL when not available */
    bool contiguous;
    bool has_xxh3;
    uint64_t xxh3;
    /* I8 weights (or U8 packed int4, i4) stored with an F16 "_scale" companion [rows, cols / G]. */
    bool i4;                     /* U8 [rows, cols / 2] + scales: 2 int4 values per byte */
    const uint16_t *scale;
    int64_t scale_cols;
    uint64_t scale_n;
} row;

typedef struct {
    bool ok;                     /* stats computed */
    const char *why;             /* reason when not */
    uint64_t n, nan, inf;
    double min, max, mean, std, absmax;
    bool scaled;                 /* dequantized via the _scale companion */
    double scale_min, scale_max;
} stats;

typedef struct {
    const char *path;
    const char *kind;            /* "checkpoint", "shard-set", "rank-file" */
    bool have_config;
    pln_hf_config config;
    row *rows;
    size_t n_rows;
    /* sources kept open while rows point into them */
    pln_ckpt ck;
    bool ck_open;
    pln_shardset *set;
    pln_shard **shards;
    int n_shards;
    json_t *manifest;            /* borrowed from set, or owned when read beside a rank file */
    bool manifest_owned;
    char **warnings;
    int n_warnings;
} source;

static void add_warning(source *s, const char *msg) {
    s->warnings = pln_xrealloc(s->warnings, (size_t)(s->n_warnings + 1) * sizeof *s->warnings);
    s->warnings[s->n_warnings++] = pln_xstrdup(msg);
}

static void add_shard_rows(source *s, const pln_shard *sh) {
    s->rows = pln_xrealloc(s->rows, (s->n_rows + sh->n_tensors + 1) * sizeof *s->rows);
    for (uint64_t i = 0; i < sh->n_tensors; i++) {
        const pln_shard_tensor *t = &sh->tensors[i];
        row *r = &s->rows[s->n_rows++];
        memset(r, 0, sizeof *r);
        r->name = t->name;
        r->dtype = t->dtype;
        r->ndim = t->ndim;
        for (int d = 0; d < t->ndim && d < PLN_MAX_DIMS; d++) r->shape[d] = t->shape[d];
        r->nbytes = t->nbytes;
        r->file = sh->path;
        r->offset = t->offset;
        r->rank = (int)sh->rank;
        r->data = pln_shard_data(sh, t);
        r->contiguous = true;
        r->has_xxh3 = true;
        r->xxh3 = t->xxh3;
        if ((t->dtype == PLN_DTYPE_I8 || t->dtype == PLN_DTYPE_U8) && t->ndim == 2 && i + 1 < sh->n_tensors) {
            const pln_shard_tensor *c = &sh->tensors[i + 1];
            size_t ln = strlen(t->name);
            bool i4 = t->dtype == PLN_DTYPE_U8;
            int64_t cols = i4 ? 2 * t->shape[1] : t->shape[1];   /* logical columns */
            if (!strncmp(c->name, t->name, ln) && !strcmp(c->name + ln, "_scale") && c->dtype == PLN_DTYPE_F16 &&
                c->ndim == 2 && c->shape[0] == t->shape[0] && c->shape[1] >= 1 && cols % c->shape[1] == 0 &&
                (!i4 || (cols / c->shape[1]) % 32 == 0)) {
                r->i4 = i4;
                r->scale = pln_shard_data(sh, c);
                r->scale_cols = c->shape[1];
                r->scale_n = (uint64_t)c->shape[0] * (uint64_t)c->shape[1];
            }
        }
    }
}

static int open_shard_file(source *s, const char *path) {
    pln_shard *sh = pln_shard_open(path);
    if (!sh) return -1;
    s->kind = "rank-file";
    s->shards = pln_xcalloc(1, sizeof *s->shards);
    s->shards[0] = sh;
    s->n_shards = 1;
    add_shard_rows(s, sh);
    /* The config lives in the manifest beside the file, when there is one. */
    char *dir = pln_xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, strlen(dir) + 1, ".");
    struct stat st;
    char *mp = pln_xasprintf("%s/%s", dir, PLN_MANIFEST_NAME);
    if (stat(mp, &st) == 0) {
        pln_shardset *set = pln_shardset_open(dir);
        if (set) {
            s->have_config = true;
            s->config = set->config;
            s->manifest = json_incref(set->json);
            s->manifest_owned = true;
            pln_shardset_close(set);
        } else {
            char *w = pln_xasprintf("manifest beside the file not used: %s", pln_error());
            add_warning(s, w);
            free(w);
        }
    }
    free(mp);
    free(dir);
    return 0;
}

static int open_shard_set(source *s, const char *dir) {
    s->set = pln_shardset_open(dir);
    if (!s->set) return -1;
    s->kind = "shard-set";
    s->have_config = true;
    s->config = s->set->config;
    s->manifest = s->set->json;
    s->shards = pln_xcalloc((size_t)s->set->tp, sizeof *s->shards);
    for (int32_t r = 0; r < s->set->tp; r++) {
        pln_shard *sh = pln_shardset_open_rank(s->set, r);
        if (!sh) {
            /* Inspection is for when something looks wrong: show what is there if the file
             * itself is sound, and say what does not match. */
            char *w = pln_xasprintf("%s", pln_error());
            sh = pln_shard_open(s->set->files[r].path);
            if (!sh) { free(w); return -1; }
            add_warning(s, w);
            free(w);
        }
        s->shards[s->n_shards++] = sh;
        add_shard_rows(s, sh);
    }
    return 0;
}

static int open_checkpoint(source *s, const char *path) {
    if (pln_ckpt_open(&s->ck, path)) return -1;
    s->ck_open = true;
    s->kind = "checkpoint";
    s->have_config = s->ck.has_config;
    if (s->ck.has_config) s->config = s->ck.config;
    s->rows = pln_xcalloc((size_t)s->ck.n_tensors + 1, sizeof *s->rows);
    for (int64_t i = 0; i < s->ck.n_tensors; i++) {
        const pln_tensor *t = &s->ck.tensors[i];
        row *r = &s->rows[s->n_rows++];
        r->name = t->name;
        r->dtype = t->dtype;
        r->ndim = t->ndim;
        memcpy(r->shape, t->shape, sizeof r->shape);
        r->nbytes = t->nbytes;
        r->file = t->file;
        r->offset = t->file_offset;
        r->rank = -1;
        r->data = t->data;
        r->contiguous = t->contiguous;
    }
    return 0;
}

static bool has_magic(const char *path) {
    int fd = pln_open_file(path, false);   /* not a regular file: the reader's open names it */
    if (fd < 0) return false;
    char m[8];
    bool ok = pread(fd, m, 8, 0) == 8 && !memcmp(m, PLN_SHARD_MAGIC, 8);
    close(fd);
    return ok;
}

static int source_open(source *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->path = path;
    struct stat st;
    if (stat(path, &st) != 0) return pln_errorf("%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        char *mp = pln_xasprintf("%s/%s", path, PLN_MANIFEST_NAME);
        bool is_set = stat(mp, &st) == 0;
        free(mp);
        return is_set ? open_shard_set(s, path) : open_checkpoint(s, path);
    }
    return has_magic(path) ? open_shard_file(s, path) : open_checkpoint(s, path);
}

static void source_close(source *s) {
    for (int i = 0; i < s->n_shards; i++) pln_shard_close(s->shards[i]);
    free(s->shards);
    if (s->manifest_owned) json_decref(s->manifest);
    pln_shardset_close(s->set);
    if (s->ck_open) pln_ckpt_close(&s->ck);
    for (int i = 0; i < s->n_warnings; i++) free(s->warnings[i]);
    free(s->warnings);
    free(s->rows);
}

/* ---- statistics ---------------------------------------------------------------------------- */
#define STAT_BLOCK 8192

static uint64_t row_numel(const row *r) {
    uint64_t n = 1;
    for (int d = 0; d < r->ndim; d++) n *= (uint64_t)r->shape[d];
    return r->i4 ? 2 * n : n;   /* values, not bytes */
}

/* Elements [i0, i0+n) of r as float (dequantized for I8 with scales). */
static void row_values(const row *r, uint64_t i0, uint64_t n, float *out) {
    if (r->i4) {
        uint64_t cols = 2 * (uint64_t)r->shape[1], g = cols / (uint64_t)r->scale_cols;
        for (uint64_t k = 0; k < n; k++) {
            uint64_t i = i0 + k, row_i = i / cols, col = i % cols;
            int q = pln_i4_get(r->data + row_i * (uint64_t)r->shape[1], (int64_t)col);
            out[k] = pln_dequant_i4(q, pln_f16_to_f32(r->scale[row_i * (uint64_t)r->scale_cols + col / g]));
        }
        return;
    }
    size_t es = pln_dtype_size(r->dtype);
    pln_to_f32(r->dtype, r->data + i0 * es, out, n);
    if (r->scale) {
        int64_t cols = r->shape[1], g = cols / r->scale_cols;
        for (uint64_t k = 0; k < n; k++) {
            uint64_t i = i0 + k, row_i = i / (uint64_t)cols, col = i % (uint64_t)cols;
            out[k] *= pln_f16_to_f32(r->scale[row_i * (uint64_t)r->scale_cols + col / (uint64_t)g]);
        }
    }
}

static void compute_stats(const row *r, stats *st) {
    memset(st, 0, sizeof *st);
    if (!r->data) { st->why = "no data"; return; }
    if (!r->contiguous) { st->why = "strided storage"; return; }
    if (r->dtype >= PLN_DTYPE_COUNT) { st->why = "unknown dtype"; return; }
    uint64_t n = row_numel(r);
    uint64_t nblocks = (n + STAT_BLOCK - 1) / STAT_BLOCK;
    double gmin = INFINITY, gmax = -INFINITY, gsum = 0, gsq = 0, gabs = 0;
    uint64_t gn = 0, gnan = 0, ginf = 0;
#pragma omp parallel
    {
        float *buf = pln_xmalloc(STAT_BLOCK * sizeof *buf);
        double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0, ab = 0;
        uint64_t cnt = 0, nan = 0, inf = 0;
#pragma omp for schedule(static)
        for (uint64_t b = 0; b < nblocks; b++) {
            uint64_t i0 = b * STAT_BLOCK, k = n - i0 < STAT_BLOCK ? n - i0 : STAT_BLOCK;
            row_values(r, i0, k, buf);
            for (uint64_t j = 0; j < k; j++) {
                float v = buf[j];
                if (isnan(v)) { nan++; continue; }
                if (isinf(v)) { inf++; continue; }
                double d = v;
                if (d < mn) mn = d;
                if (d > mx) mx = d;
                if (fabs(d) > ab) ab = fabs(d);
                sum += d;
                sq += d * d;
                cnt++;
            }
        }
#pragma omp critical
        {
            if (mn < gmin) gmin = mn;
            if (mx > gmax) gmax = mx;
            if (ab > gabs) gabs = ab;
            gsum += sum;
            gsq += sq;
            gn += cnt;
            gnan += nan;
            ginf += inf;
        }
        free(buf);
    }
    st->ok = true;
    st->n = gn;
    st->nan = gnan;
    st->inf = ginf;
    if (gn) {
        st->min = gmin;
        st->max = gmax;
        st->absmax = gabs;
        st->mean = gsum / (double)gn;
        double var = gsq / (double)gn - st->mean * st->mean;
        st->std = var > 0 ? sqrt(var) : 0;
    }
    if (r->scale) {
        st->scaled = true;
        double smn = INFINITY, smx = -INFINITY;
        for (uint64_t i = 0; i < r->scale_n; i++) {
            double v = pln_f16_to_f32(r->scale[i]);
            if (v < smn) smn = v;
            if (v > smx) smx = v;
        }
        st->scale_min = smn;
        st->scale_max = smx;
    }
}

/* ---- output ------------------------------------------------------------------------------- */
static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

typedef struct {
    uint64_t count[PLN_DTYPE_COUNT], bytes[PLN_DTYPE_COUNT];
} totals;

static json_t *config_json(const pln_hf_config *c) {
    json_t *o = json_pack("{s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:I,s:s}", "vocab_size", (json_int_t)c->vocab_size, "hidden_size",
                          (json_int_t)c->hidden_size, "n_head", (json_int_t)c->n_head, "n_layer", (json_int_t)c->n_layer,
                          "layer_norm_epsilon", c->layer_norm_epsilon, "bos_token_id", (json_int_t)c->bos_token_id, "eos_token_id",
                          (json_int_t)c->eos_token_id, "pad_token_id", (json_int_t)c->pad_token_id, "torch_dtype", c->torch_dtype);
    pln_family_of(c)->manifest_put(c, o);   /* the family's own fields (none for BLOOM) */
    return o;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *stats_json(const stats *st) {
    if (!st->ok) return json_pack("{s:s}", "skipped", st->why);
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)st->n));
    json_object_set_new(o, "min", st->n ? json_real(st->min) : json_null());
    json_object_set_new(o, "max", st->n ? json_real(st->max) : json_null());
    json_object_set_new(o, "mean", st->n ? json_real(st->mean) : json_null());
    json_object_set_new(o, "std", st->n ? json_real(st->std) : json_null());
    json_object_set_new(o, "absmax", st->n ? json_real(st->absmax) : json_null());
    json_object_set_new(o, "nan", json_integer((json_int_t)st->nan));
    json_object_set_new(o, "inf", json_integer((json_int_t)st->inf));
    if (st->scaled) {
        json_object_set_new(o, "dequantized", json_true());
        json_object_set_new(o, "scale_min", json_real(st->scale_min));
        json_object_set_new(o, "scale_max", json_real(st->scale_max));
    }
    return o;
}

static void print_config(const source *s) {
    if (!s->have_config) { printf("config: (no config.json found)\n"); return; }
    const pln_hf_config *c = &s->config;
    printf("config: vocab_size %lld, hidden_size %lld, n_head %lld (head_dim %lld), n_layer %lld, layer_norm_epsilon %g,\n"
           "        bos %lld, eos %lld, pad %lld, torch_dtype %s\n",
           (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_head,
           (long long)(c->n_head ? c->hidden_size / c->n_head : 0), (long long)c->n_layer, c->layer_norm_epsilon,
           (long long)c->bos_token_id, (long long)c->eos_token_id, (long long)c->pad_token_id,
           c->torch_dtype[0] ? c->torch_dtype : "(unset)");
    json_t *fam = json_object();
    pln_family_of(c)->manifest_put(c, fam);
    if (json_object_size(fam)) {
        char *t = json_dumps(fam, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("        %s family: %s\n", pln_family_of(c)->name, t ? t : "?");
        free(t);
    }
    json_decref(fam);
}

static void print_header(const source *s) {
    printf("%s: %s\n", s->path, s->kind);
    if (s->set) {
        const pln_shardset *set = s->set;
        printf("set: manifest version %u, layout %s, tp %d, dtype %s", set->version, set->layout, (int)set->tp, set->dtype);
        if (!strcmp(set->dtype, "int8") || !strcmp(set->dtype, "int4")) {
            if (set->group_size) printf(" (group size %lld)", (long long)set->group_size);
            else printf(" (per output channel)");
            printf(", quantize_embedding %s", set->quantize_embedding ? "yes" : "no");
        }
        printf(", vocab_padded %lld\n", (long long)set->vocab_padded);
        for (int32_t r = 0; r < set->tp; r++)
            printf("  rank %d: %s  %llu bytes  xxh3 %016llx\n", (int)r, set->files[r].name, (unsigned long long)set->files[r].size,
                   (unsigned long long)set->files[r].xxh3);
        json_t *src = json_object_get(set->json, "source");
        const char *sp = json_string_value(json_object_get(src, "path"));
        const char *sf = json_string_value(json_object_get(src, "format"));
        if (sp) printf("source: %s%s%s%s\n", sp, sf ? " (" : "", sf ? sf : "", sf ? ")" : "");
        if (set->tokenizer_path) printf("tokenizer: %s\n", set->tokenizer_path);
    } else if (s->n_shards == 1) {
        const pln_shard *sh = s->shards[0];
        printf("rank file: version %u, layout %s, rank %u of %u, %llu tensors, alignment %u, %llu bytes, header xxh3 %016llx\n",
               sh->version, sh->layout, sh->rank, sh->n_ranks, (unsigned long long)sh->n_tensors, sh->alignment,
               (unsigned long long)sh->file_size, (unsigned long long)sh->header_xxh3);
    } else if (s->ck_open) {
        printf("format: %s, %d file%s\n", s->ck.format, s->ck.n_files, s->ck.n_files == 1 ? "" : "s");
        for (int i = 0; i < s->ck.n_files; i++) printf("  %s\n", s->ck.files[i]);
        if (s->ck.tokenizer_path) printf("tokenizer: %s\n", s->ck.tokenizer_path);
    }
    print_config(s);
    for (int i = 0; i < s->n_warnings; i++) printf("warning: %s\n", s->warnings[i]);
}

static int run(const char *path, bool want_stats, const char *only, int64_t head, bool as_json) {
    source s;
    if (source_open(&s, path)) {
        fprintf(stderr, "pollen inspect: %s\n", pln_error());
        return 1;
    }
    bool shards = s.n_shards > 0;
    /* Select rows. */
    size_t *sel = pln_xmalloc((s.n_rows + 1) * sizeof *sel);
    size_t n_sel = 0;
    for (size_t i = 0; i < s.n_rows; i++) {
        if (only) {
            const char *nm = s.rows[i].name;
            bool match = !strcmp(nm, only) || (!strncmp(only, "transformer.", 12) && !strcmp(nm, only + 12));
            if (!match) continue;
        }
        sel[n_sel++] = i;
    }
    if (only && n_sel == 0) {
        fprintf(stderr, "pollen inspect: %s: no tensor \"%s\" (run without --tensor to list them)\n", path, only);
        free(sel);
        source_close(&s);
        return 1;
    }
    stats *st = want_stats ? pln_xcalloc(n_sel + 1, sizeof *st) : NULL;
    if (want_stats)
        for (size_t k = 0; k < n_sel; k++) compute_stats(&s.rows[sel[k]], &st[k]);
    totals tot;
    memset(&tot, 0, sizeof tot);
    uint64_t all_bytes = 0;
    for (size_t k = 0; k < n_sel; k++) {
        const row *r = &s.rows[sel[k]];
        if (r->dtype < PLN_DTYPE_COUNT) { tot.count[r->dtype]++; tot.bytes[r->dtype] += r->nbytes; }
        all_bytes += r->nbytes;
    }

    if (as_json) {
        json_t *root = json_object();
        json_object_set_new(root, "path", json_string(path));
        json_object_set_new(root, "kind", json_string(s.kind));
        json_object_set_new(root, "config", s.have_config ? config_json(&s.config) : json_null());
        if (s.manifest) json_object_set(root, "manifest", s.manifest);
        if (s.ck_open) {
            json_object_set_new(root, "format", json_string(s.ck.format));
            json_t *fl = json_array();
            for (int i = 0; i < s.ck.n_files; i++) json_array_append_new(fl, json_string(s.ck.files[i]));
            json_object_set_new(root, "files", fl);
        }
        if (shards) {
            json_t *fl = json_array();
            for (int i = 0; i < s.n_shards; i++) {
                const pln_shard *sh = s.shards[i];
                char hx[17];
                snprintf(hx, sizeof hx, "%016llx", (unsigned long long)sh->header_xxh3);
                json_array_append_new(fl, json_pack("{s:s,s:i,s:i,s:s,s:i,s:I,s:I,s:s}", "path", sh->path, "rank", (int)sh->rank,
                                                    "n_ranks", (int)sh->n_ranks, "layout", sh->layout, "version", (int)sh->version,
                                                    "n_tensors", (json_int_t)sh->n_tensors, "size", (json_int_t)sh->file_size,
                                                    "header_xxh3", hx));
            }
            json_object_set_new(root, "files", fl);
        }
        json_t *tl = json_array();
        for (size_t k = 0; k < n_sel; k++) {
            const row *r = &s.rows[sel[k]];
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(r->name));
            json_object_set_new(o, "dtype", json_string(pln_dtype_name(r->dtype)));
            json_t *sh = json_array();
            for (int d = 0; d < r->ndim; d++) json_array_append_new(sh, json_integer(r->shape[d]));
            json_object_set_new(o, "shape", sh);
            json_object_set_new(o, "nbytes", json_integer((json_int_t)r->nbytes));
            json_object_set_new(o, "file", json_string(r->file ? r->file : ""));
            json_object_set_new(o, "offset", json_integer((json_int_t)r->offset));
            if (r->rank >= 0) json_object_set_new(o, "rank", json_integer(r->rank));
            if (r->has_xxh3) {
                char hx[17];
                snprintf(hx, sizeof hx, "%016llx", (unsigned long long)r->xxh3);
                json_object_set_new(o, "xxh3", json_string(hx));
            }
            if (!r->contiguous) json_object_set_new(o, "contiguous", json_false());
            if (st) json_object_set_new(o, "stats", stats_json(&st[k]));
            if (only && r->data && r->contiguous) {
                uint64_t n = row_numel(r), k2 = (uint64_t)head < n ? (uint64_t)head : n;
                float *v = pln_xmalloc((k2 + 1) * sizeof *v);
                row_values(r, 0, k2, v);
                json_t *hv = json_array();
                for (uint64_t j = 0; j < k2; j++) json_array_append_new(hv, num_or_null(v[j]));
                json_object_set_new(o, "head", hv);
                free(v);
            }
            json_array_append_new(tl, o);
        }
        json_object_set_new(root, "tensors", tl);
        json_t *to = json_object();
        for (int d = 0; d < PLN_DTYPE_COUNT; d++)
            if (tot.count[d])
                json_object_set_new(to, pln_dtype_name((pln_dtype)d), json_pack("{s:I,s:I}", "count", (json_int_t)tot.count[d], "bytes", (json_int_t)tot.bytes[d]));
        json_object_set_new(root, "totals", to);
        json_object_set_new(root, "total_bytes", json_integer((json_int_t)all_bytes));
        json_t *wl = json_array();
        for (int i = 0; i < s.n_warnings; i++) json_array_append_new(wl, json_string(s.warnings[i]));
        json_object_set_new(root, "warnings", wl);
        char *text = json_dumps(root, JSON_INDENT(2));
        json_decref(root);
        if (text) { fputs(text, stdout); fputc('\n', stdout); }
        free(text);
    } else {
        print_header(&s);
        int wname = 4, wshape = 5, wfile = 4;
        char buf[256];
        for (size_t k = 0; k < n_sel; k++) {
            const row *r = &s.rows[sel[k]];
            int l = (int)strlen(r->name);
            if (l > wname) wname = l;
            l = (int)strlen(pln_shape_str(r->shape, r->ndim, buf, sizeof buf));
            if (l > wshape) wshape = l;
            l = (int)strlen(base_name(r->file ? r->file : ""));
            if (l > wfile) wfile = l;
        }
        printf("\n");
        if (shards) printf("%-4s  ", "rank");
        printf("%-*s  %-5s  %-*s  %12s  %-*s  %12s", wname, "name", "dtype", wshape, "shape", "bytes", wfile, "file", "offset");
        if (st) printf("  %11s %11s %11s %11s %11s %5s %5s  %s", "min", "max", "mean", "std", "absmax", "nan", "inf", "scale range");
        printf("\n");
        for (size_t k = 0; k < n_sel; k++) {
            const row *r = &s.rows[sel[k]];
            if (shards) printf("%-4d  ", r->rank);
            printf("%-*s  %-5s  %-*s  %12llu  %-*s  %12llu", wname, r->name, pln_dtype_name(r->dtype), wshape,
                   pln_shape_str(r->shape, r->ndim, buf, sizeof buf), (unsigned long long)r->nbytes, wfile,
                   base_name(r->file ? r->file : ""), (unsigned long long)r->offset);
            if (st) {
                const stats *x = &st[k];
                if (!x->ok) printf("  (stats skipped: %s)", x->why);
                else if (!x->n) printf("  %11s %11s %11s %11s %11s %5llu %5llu", "-", "-", "-", "-", "-", (unsigned long long)x->nan, (unsigned long long)x->inf);
                else printf("  %11.4g %11.4g %11.4g %11.4g %11.4g %5llu %5llu", x->min, x->max, x->mean, x->std, x->absmax,
                            (unsigned long long)x->nan, (unsigned long long)x->inf);
                if (x->ok && x->scaled) printf("  [%.4g, %.4g]", x->scale_min, x->scale_max);
                /* What the converter recorded for this tensor (manifest "tensors"). */
                json_t *m = json_object_get(json_object_get(s.manifest, "tensors"), r->name);
                json_t *q = json_object_get(m, "quant_rel_rms"), *cl = json_object_get(m, "clamped");
                if (json_is_number(q)) printf("  quant rel rms %.3g", json_number_value(q));
                if (json_is_integer(cl) && json_integer_value(cl) > 0) printf("  clamped %lld", (long long)json_integer_value(cl));
            }
            if (!r->contiguous) printf("  (strided)");
            printf("\n");
        }
        printf("\ntotals:");
        for (int d = 0; d < PLN_DTYPE_COUNT; d++)
            if (tot.count[d])
                printf("  %s %llu tensors %s;", pln_dtype_name((pln_dtype)d), (unsigned long long)tot.count[d],
                       pln_human_bytes((double)tot.bytes[d], buf, sizeof buf));
        printf("  all %zu tensors %llu bytes (%s)\n", n_sel, (unsigned long long)all_bytes, pln_human_bytes((double)all_bytes, buf, sizeof buf));
        if (only) {
            for (size_t k = 0; k < n_sel; k++) {
                const row *r = &s.rows[sel[k]];
                if (!r->data || !r->contiguous) { printf("%s: values not available (%s)\n", r->name, r->data ? "strided storage" : "no data"); continue; }
                uint64_t n = row_numel(r), k2 = (uint64_t)head < n ? (uint64_t)head : n;
                float *v = pln_xmalloc((k2 + 1) * sizeof *v);
                row_values(r, 0, k2, v);
                if (shards) printf("rank %d ", r->rank);
                printf("%s first %llu of %llu%s:", r->name, (unsigned long long)k2, (unsigned long long)n, r->scale ? " (dequantized)" : "");
                for (uint64_t j = 0; j < k2; j++) printf(" %.6g", v[j]);
                printf("\n");
                free(v);
            }
        }
    }
    free(st);
    free(sel);
    source_close(&s);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    bool want_stats = false, as_json = false;
    const char *only = NULL, *path = NULL;
    int64_t head = 8;
    pln_opt opts[] = {
        PLN_O_POS("SET|CHECKPOINT", path, "what to show", .flags = PLN_OPT_REQUIRED),
        PLN_O_FLAG("stats", 's', want_stats,
                   "per tensor: min, max, mean, std, absmax, NaN and Inf counts (int8/int4: of the dequantized "
                   "values, with the scale range); reads all data"),
        PLN_O_STR("tensor", 0, only, "NAME", "show only tensor NAME (every rank of a shard set) and its first values"),
        PLN_O_INT("head", 'n', head, 0, 100000000, "K", "how many values --tensor prints (default {})"),
        PLN_O_FLAG("json", 0, as_json, "the same as JSON"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "inspect", .synopsis = "pollen inspect SET|CHECKPOINT [--stats] [--tensor NAME [--head K]] [--json]",
                       .intro = "\nSET|CHECKPOINT: a pollen shard set directory (manifest.json) or a single rank file (.pln); a\n"
                                "Hugging Face checkpoint directory, a .safetensors or .bin file, or an index .json.\n",
                       .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    bool head_set = pln_opt_given(&cmd, "head");
    pln_opt_free(&cmd);
    if (head_set && !only) { fprintf(stderr, "pollen inspect: --head needs --tensor NAME\n"); return 2; }
    return run(path, want_stats, only, head, as_json);
}
