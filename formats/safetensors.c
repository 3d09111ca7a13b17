/* safetensors.c — hostile-input reader and a small atomic writer for .safetensors files
 * (layout and rules in safetensors.h). */
#include "formats/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rd_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Reads a JSON integer >= 0 (jansson already refuses integers beyond int64). */
static int get_nonneg(const json_t *v, const char *where, const char *tname, const char *field, uint64_t *out) {
    if (!json_is_integer(v))
        return pln_errorf("%s: tensor \"%s\": %s must be a list of integers", where, tname, field);
    json_int_t x = json_integer_value(v);
    if (x < 0) return pln_errorf("%s: tensor \"%s\": %s holds a negative value %lld", where, tname, field, (long long)x);
    *out = (uint64_t)x;
    return 0;
}

typedef struct { uint64_t begin, end; int64_t idx; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int parse_tensor(pln_tensor *t, const char *name, json_t *info, const char *where) {
    if (!json_is_object(info)) return pln_errorf("%s: tensor \"%s\": entry is not a JSON object", where, name);
    json_t *jd = json_object_get(info, "dtype"), *js = json_object_get(info, "shape"), *jo = json_object_get(info, "data_offsets");
    if (!json_is_string(jd)) return pln_errorf("%s: tensor \"%s\": missing or non-string \"dtype\"", where, name);
    if (!json_is_array(js)) return pln_errorf("%s: tensor \"%s\": missing or non-list \"shape\"", where, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return pln_errorf("%s: tensor \"%s\": \"data_offsets\" must be a list [begin, end]", where, name);
    if (pln_dtype_from_name(json_string_value(jd), &t->dtype) != 0)
        return pln_error_context("%s: tensor \"%s\"", where, name);
    size_t nd = json_array_size(js);
    if (nd > PLN_MAX_DIMS)
        return pln_errorf("%s: tensor \"%s\": %zu dimensions, more than the %d supported", where, name, nd, PLN_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_nonneg(json_array_get(js, i), where, name, "shape", &d)) return -1;
        t->shape[i] = (int64_t)d;
        if (pln_mul_overflow(numel, d, &numel))
            return pln_errorf("%s: tensor \"%s\": element count of shape overflows 64 bits", where, name);
    }
    uint64_t nbytes, b, e;
    if (pln_mul_overflow(numel, pln_dtype_size(t->dtype), &nbytes))
        return pln_errorf("%s: tensor \"%s\": byte size of shape overflows 64 bits", where, name);
    if (get_nonneg(json_array_get(jo, 0), where, name, "data_offsets", &b) ||
        get_nonneg(json_array_get(jo, 1), where, name, "data_offsets", &e)) return -1;
    if (e < b) return pln_errorf("%s: tensor \"%s\": data_offsets [%llu, %llu] end before begin", where, name,
                                 (unsigned long long)b, (unsigned long long)e);
    if (e - b != nbytes) {
        char sb[128];
        return pln_errorf("%s: tensor \"%s\": %s %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                          where, name, pln_dtype_name(t->dtype), pln_shape_str(t->shape, t->ndim, sb, sizeof sb),
                          (unsigned long long)nbytes, (unsigned long long)b, (unsigned long long)e,
                          (unsigned long long)(e - b));
    }
    t->nbytes = nbytes;
    t->file_offset = b;   /* relative to the buffer until the caller adds data_start */
    t->contiguous = true;
    return 0;
}

static int check_metadata(json_t *meta, const char *where) {
    if (!json_is_object(meta)) return pln_errorf("%s: \"__metadata__\" must be an object of strings", where);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v)
        if (!json_is_string(v)) return pln_errorf("%s: \"__metadata__\" key \"%s\" is not a string", where, k);
    return 0;
}

int pln_safetensors_parse(pln_safetensors *st, const uint8_t *data, uint64_t size, const char *where) {
    memset(st, 0, sizeof *st);
    st->map.fd = -1;
    if (size < 8)
        return pln_errorf("%s: file is %llu bytes, too small for the 8-byte header length of a safetensors file",
                          where, (unsigned long long)size);
    uint64_t n = rd_u64le(data);
    if (n > PLN_SAFETENSORS_MAX_HEADER)
        return pln_errorf("%s: header size %llu is over the 100 MB limit (corrupt or not a safetensors file)",
                          where, (unsigned long long)n);
    if (n > size - 8)
        return pln_errorf("%s: header size %llu runs past the end of the file (%llu bytes); file truncated?",
                          where, (unsigned long long)n, (unsigned long long)size);
    if (n < 2 || data[8] != '{')
        return pln_errorf("%s: header does not start with a JSON object '{' (not a safetensors file)", where);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data + 8, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && strstr(jerr.text, "duplicate object key"))
        return pln_errorf("%s: duplicate tensor name in the header: %s (line %d, column %d)", where, jerr.text,
                          jerr.line, jerr.column);
    if (!root) return pln_errorf("%s: header is not valid UTF-8 JSON: %s (line %d, column %d)", where, jerr.text,
                                 jerr.line, jerr.column);
    if (!json_is_object(root)) { json_decref(root); return pln_errorf("%s: header is not a JSON object", where); }

    uint64_t data_start = 8 + n, buf_size = size - data_start;
    size_t cap = json_object_size(root);
    st->tensors = pln_xcalloc(cap, sizeof *st->tensors);
    span *spans = pln_xcalloc(cap, sizeof *spans);
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((rc = check_metadata(val, where))) break;
            st->metadata_json = json_dumps(val, JSON_COMPACT | JSON_PRESERVE_ORDER);
            continue;
        }
        pln_tensor *t = &st->tensors[st->n_tensors];
        if ((rc = parse_tensor(t, key, val, where))) break;
        t->name = pln_xstrdup(key);
        spans[st->n_tensors] = (span){t->file_offset, t->file_offset + t->nbytes, st->n_tensors};
        st->n_tensors++;
    }
    json_decref(root);
    /* The offsets, sorted, must tile [0, buf_size) exactly: no gap, no overlap, nothing after. */
    if (!rc) {
        qsort(spans, (size_t)st->n_tensors, sizeof *spans, span_cmp);
        uint64_t pos = 0;
        for (int64_t i = 0; i < st->n_tensors && !rc; i++) {
            const char *nm = st->tensors[spans[i].idx].name;
            if (spans[i].begin > pos)
                rc = pln_errorf("%s: tensor \"%s\": gap in the data buffer: data begins at %llu but the previous tensor ends at %llu",
                                where, nm, (unsigned long long)spans[i].begin, (unsigned long long)pos);
            else if (spans[i].begin < pos)
                rc = pln_errorf("%s: tensor \"%s\": data [%llu, %llu) overlaps the previous tensor (which ends at %llu)",
                                where, nm, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                                (unsigned long long)pos);
            else if (spans[i].end > buf_size)
                rc = pln_errorf("%s: tensor \"%s\": data [%llu, %llu) runs past the end of the data buffer (%llu bytes); file truncated?",
                                where, nm, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                                (unsigned long long)buf_size);
            pos = spans[i].end;
        }
        if (!rc && pos != buf_size)
            rc = pln_errorf("%s: %llu trailing bytes after the last tensor's data (tensors end at %llu of %llu)",
                            where, (unsigned long long)(buf_size - pos), (unsigned long long)pos,
                            (unsigned long long)buf_size);
    }
    free(spans);
    if (rc) { pln_safetensors_close(st); return -1; }
    for (int64_t i = 0; i < st->n_tensors; i++) {
        pln_tensor *t = &st->tensors[i];
        t->file_offset += data_start;
        t->data = data + t->file_offset;
        t->file = where;
    }
    st->header_len = n;
    st->data_start = data_start;
    return 0;
}

int pln_safetensors_open(pln_safetensors *st, const char *path) {
    pln_map m;
    memset(st, 0, sizeof *st);
    st->map.fd = -1;
    if (pln_map_open(&m, path) != 0) return -1;
    /* Parse against the map's own path string so tensors' file pointers live as long as st. */
    if (pln_safetensors_parse(st, m.data, m.size, m.path) != 0) { pln_map_close(&m); return -1; }
    st->map = m;
    st->path = pln_xstrdup(path);
    return 0;
}

const pln_tensor *pln_safetensors_find(const pln_safetensors *st, const char *name) {
    for (int64_t i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

void pln_safetensors_close(pln_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st->metadata_json);
    free(st->path);
    if (st->map.data || st->map.fd >= 0) pln_map_close(&st->map);
    memset(st, 0, sizeof *st);
    st->map.fd = -1;
}

/* ---- writer ---- */
int pln_safetensors_write(const char *path, const pln_tensor *tensors, int64_t n,
                          const char *const *metadata, int n_meta) {
    json_t *root = json_object();
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(m, metadata[2 * i], json_string(metadata[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const pln_tensor *t = &tensors[i];
        uint64_t numel = 1, nb;
        bool ovf = false;
        for (int d = 0; d < t->ndim; d++) ovf |= t->shape[d] < 0 || pln_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        ovf |= pln_mul_overflow(numel, pln_dtype_size(t->dtype), &nb);
        if (ovf || nb != t->nbytes || pln_dtype_size(t->dtype) == 0 || t->ndim > PLN_MAX_DIMS) {
            json_decref(root);
            return pln_errorf("%s: tensor \"%s\": nbytes %llu does not match its dtype and shape", path, t->name,
                              (unsigned long long)t->nbytes);
        }
        if (json_object_get(root, t->name)) {
            json_decref(root);
            return pln_errorf("%s: duplicate tensor name \"%s\"", path, t->name);
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *info = json_object();
        json_object_set_new(info, "dtype", json_string(pln_dtype_name(t->dtype)));
        json_object_set_new(info, "shape", shape);
        json_object_set_new(info, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(root, t->name, info);
        off += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return pln_errorf("%s: cannot encode the header (tensor names must be valid UTF-8)", path);
    size_t hl = strlen(hdr), padded = (size_t)pln_align_up(hl, 8);   /* the reference pads to 8 with spaces */
    char *tmp = pln_xasprintf("%s.tmp-%d", path, (int)getpid());
    pln_tmpfile_cleanup_on_signal(tmp);   /* a signal meanwhile removes it (pollen's handlers) */
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(hdr); int e = errno; pln_tmpfile_cleanup_on_signal(NULL); free(tmp); return pln_errorf("%s: cannot create: %s", path, strerror(e)); }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = hl; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    for (int64_t i = 0; i < n && ok; i++)
        ok = tensors[i].nbytes == 0 || fwrite(tensors[i].data, 1, tensors[i].nbytes, f) == tensors[i].nbytes;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        pln_tmpfile_cleanup_on_signal(NULL);
        free(tmp);
        return pln_errorf("%s: write failed: %s", path, strerror(e));
    }
    pln_tmpfile_cleanup_on_signal(NULL);
    free(tmp);
    return 0;
}
