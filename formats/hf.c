/* hf.c — a Hugging Face checkpoint directory: config.json, index files, and one tensor list
 * over every weight file (safetensors or PyTorch zip), names without "transformer.". */
#include "formats/hf.h"
#include "formats/family.h"
#include "formats/safetensors.h"
#include "formats/shard.h"
#include "formats/torchzip.h"

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_MAX_BYTES (16u << 20)
#define INDEX_MAX_BYTES (256u << 20)
static const char PREFIX[] = "transformer.";

/* ---- config.json ---- */

int pln_hf_config_from_json(const void *json_obj, const char *where, pln_hf_config *cfg) {
    json_t *o = (json_t *)json_obj;
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(o)) return pln_errorf("%s: config is not a JSON object", where);
    json_t *mt = json_object_get(o, "model_type");
    if (mt && !json_is_string(mt)) return pln_errorf("%s: key \"model_type\" is not a string", where);
    const char *type = mt ? json_string_value(mt) : "bloom";   /* older BLOOM configs have none */
    if (strlen(type) >= sizeof cfg->model_type || !pln_family_by_model_type(type))
        return pln_errorf("%s: key \"model_type\" is \"%.40s\": not a model family pollen supports (it reads %s)", where, type,
                          pln_family_model_types());
    const pln_family *f = pln_family_by_model_type(type);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);
    if (f->config_from_json(o, where, cfg)) return -1;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);
    return 0;
}

int pln_hf_config_load(const char *path, pln_hf_config *cfg) {
    size_t n;
    memset(cfg, 0, sizeof *cfg);
    char *buf = pln_read_small_file(path, CONFIG_MAX_BYTES, &n);
    if (!buf) return -1;
    json_error_t jerr;
    json_t *o = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!o) return pln_errorf("%s: not valid JSON: %s (line %d, column %d)", path, jerr.text, jerr.line, jerr.column);
    int rc = pln_hf_config_from_json(o, path, cfg);
    json_decref(o);
    return rc;
}

int pln_bloom_config_load(const char *path, pln_hf_config *cfg) { return pln_hf_config_load(path, cfg); }
int pln_bloom_config_from_json(const void *o, const char *where, pln_hf_config *cfg) {
    return pln_hf_config_from_json(o, where, cfg);
}

/* ---- checkpoints ---- */

typedef struct {
    int n;
    bool *is_st;
    pln_safetensors *st;
    pln_torchzip *tz;
    int64_t *sorted;          /* tensor indices sorted by name, for find */
} ckpt_impl;

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static bool is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }
static bool is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static bool exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static char *dirname_of(const char *p) {
    const char *s = strrchr(p, '/');
    if (!s) return pln_xstrdup(".");
    if (s == p) return pln_xstrdup("/");
    return pln_xasprintf("%.*s", (int)(s - p), p);
}

static void add_file(pln_ckpt *ck, const char *path) {
    for (int i = 0; i < ck->n_files; i++)
        if (!strcmp(ck->files[i], path)) return;
    ck->files = pln_xrealloc(ck->files, (size_t)(ck->n_files + 1) * sizeof *ck->files);
    ck->files[ck->n_files++] = pln_xstrdup(path);
}

/* A directory without an index or the standard single-file names: take its only weight file. */
static int find_single(pln_ckpt *ck, const char *dir) {
    int fd = pln_open_file(dir, true);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return pln_errorf("%s: cannot open directory", dir); }
    struct dirent *e;
    char *found = NULL;
    int count = 0;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".safetensors") && !ends_with(e->d_name, ".bin")) continue;
        if (!strncmp(e->d_name, "reference", 9)) continue;
        count++;
        if (!found) found = pln_xasprintf("%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (count != 1) {
        free(found);
        return pln_errorf("%s: %s weight file (expected model.safetensors(.index.json), pytorch_model.bin(.index.json), "
                          "or exactly one .safetensors/.bin file)", dir, count ? "more than one" : "no");
    }
    add_file(ck, found);
    free(found);
    return 0;
}

typedef struct { char *name; char *file; } wmap_entry;

/* Reads an index file's weight_map; adds its shards (in order of first appearance) to ck. */
static int read_index(pln_ckpt *ck, const char *index_path, wmap_entry **map_out, size_t *n_out) {
    size_t len;
    char *buf = pln_read_small_file(index_path, INDEX_MAX_BYTES, &len);
    if (!buf) return -1;
    json_error_t jerr;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!o) return pln_errorf("%s: not valid JSON: %s (line %d, column %d)", index_path, jerr.text, jerr.line, jerr.column);
    json_t *wm = json_object_get(o, "weight_map");
    if (!json_is_object(wm)) { json_decref(o); return pln_errorf("%s: no \"weight_map\" object (not a checkpoint index)", index_path); }
    wmap_entry *m = pln_xcalloc(json_object_size(wm) + 1, sizeof *m);
    size_t n = 0;
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(wm, k, v) {
        const char *f = json_is_string(v) ? json_string_value(v) : NULL;
        /* Shard names are plain file names beside the index: refuse paths that leave the dir. */
        if (!f || !*f || f[0] == '/' || strstr(f, "..")) {
            rc = pln_errorf("%s: weight_map entry \"%s\" names a bad file (must be a file name beside the index)", index_path, k);
            break;
        }
        char *full = pln_xasprintf("%s/%s", ck->dir, f);
        if (!exists(full)) {
            rc = pln_errorf("%s: shard %s named by the index (for tensor \"%s\") does not exist", index_path, f, k);
            free(full);
            break;
        }
        add_file(ck, full);
        m[n].name = pln_xstrdup(k);
        m[n].file = full;
        n++;
    }
    json_decref(o);
    if (!rc && n == 0) rc = pln_errorf("%s: weight_map is empty", index_path);
    if (rc) {
        for (size_t i = 0; i < n; i++) { free(m[i].name); free(m[i].file); }
        free(m);
        return -1;
    }
    *map_out = m;
    *n_out = n;
    return 0;
}

static const char *strip(const char *name) {
    return strncmp(name, PREFIX, sizeof PREFIX - 1) ? name : name + sizeof PREFIX - 1;
}

static int idx_cmp(const void *a, const void *b, void *arg) {
    const pln_tensor *t = arg;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

static bool looks_like_zip(const char *path) {
    int fd = pln_open_file(path, false);   /* a FIFO or device is refused by the open that follows */
    if (fd < 0) return false;
    unsigned char b[4] = {0};
    ssize_t n = pread(fd, b, 4, 0);
    close(fd);
    return n == 4 && !memcmp(b, "PK\x03\x04", 4);
}

/* A pollen shard set (or one of its files) given where a Hugging Face checkpoint belongs: say so,
 * rather than "no weight file" or a bad safetensors header. -1 with that error, else 0. */
static int shard_set_given(const char *path, const char *dir) {
    char magic[sizeof PLN_SHARD_MAGIC - 1] = {0};
    bool rank_file = false;
    if (is_file(path)) {
        FILE *f = fopen(path, "rb");
        rank_file = f && fread(magic, 1, sizeof magic, f) == sizeof magic && !memcmp(magic, PLN_SHARD_MAGIC, sizeof magic);
        if (f) fclose(f);
    }
    char *manifest = pln_xasprintf("%s/%s", dir, PLN_MANIFEST_NAME);
    bool set = is_file(manifest) && (rank_file || is_dir(path) || !strcmp(path, manifest));
    char src[1024] = "";
    json_t *m = set ? json_load_file(manifest, 0, NULL) : NULL;
    const char *sp = json_string_value(json_object_get(json_object_get(m, "source"), "path"));
    if (sp) snprintf(src, sizeof src, " (%s, as its manifest records)", sp);
    json_decref(m);
    free(manifest);
    if (!rank_file && !set) return 0;
    return pln_errorf("%s is already a pollen shard set%s, not a Hugging Face checkpoint: give the checkpoint it was "
                      "made from%s; a set is used as it is, not resharded again", path,
                      rank_file && !is_dir(path) ? " file" : "", src);
}

int pln_ckpt_open(pln_ckpt *ck, const char *path) {
    memset(ck, 0, sizeof *ck);
    ck->path = pln_xstrdup(path);
    char *index = NULL;
    wmap_entry *wmap = NULL;
    size_t n_wmap = 0;
    int rc = 0;
    if (is_dir(path)) {
        ck->dir = pln_xstrdup(path);
        const char *cands[] = {"model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                               "pytorch_model.bin"};
        for (int i = 0; i < 4 && !index && !ck->n_files; i++) {
            char *p = pln_xasprintf("%s/%s", path, cands[i]);
            if (exists(p)) {   /* not only regular files: a FIFO there is named by the open, not skipped */
                if (ends_with(p, ".json")) index = pln_xstrdup(p);
                else add_file(ck, p);
            }
            free(p);
        }
        if (!index && !ck->n_files && shard_set_given(path, path)) goto fail;
        if (!index && !ck->n_files && find_single(ck, path)) goto fail;
    } else if (is_file(path)) {
        ck->dir = dirname_of(path);
        if (shard_set_given(path, ck->dir)) goto fail;
        if (ends_with(path, ".json")) index = pln_xstrdup(path);
        else add_file(ck, path);
    } else if (exists(path)) {
        rc = pln_check_file(path);   /* names what it is: a FIFO, a socket, a device */
        goto fail;
    } else {
        rc = pln_errorf("%s: no such file or directory", path);
        goto fail;
    }
    if (index && read_index(ck, index, &wmap, &n_wmap)) goto fail;

    /* config.json and tokenizer.json: whatever is there under that name is read (and a FIFO,
     * device or directory refused with its name) rather than silently taken as absent. */
    char *cfg = pln_xasprintf("%s/config.json", ck->dir);
    if (exists(cfg)) {
        if (pln_hf_config_load(cfg, &ck->config)) { free(cfg); goto fail; }
        ck->has_config = true;
    }
    free(cfg);
    char *tok = pln_xasprintf("%s/tokenizer.json", ck->dir);
    if (exists(tok)) {
        if (pln_check_file(tok)) { free(tok); goto fail; }
        ck->tokenizer_path = tok;
    } else {
        free(tok);
    }

    ckpt_impl *im = pln_xcalloc(1, sizeof *im);
    ck->impl = im;
    im->n = ck->n_files;
    im->is_st = pln_xcalloc((size_t)ck->n_files, sizeof *im->is_st);
    im->st = pln_xcalloc((size_t)ck->n_files, sizeof *im->st);
    im->tz = pln_xcalloc((size_t)ck->n_files, sizeof *im->tz);
    for (int i = 0; i < ck->n_files; i++) { im->st[i].map.fd = -1; im->tz[i].map.fd = -1; }
    int64_t total = 0;
    for (int i = 0; i < ck->n_files; i++) {
        const char *f = ck->files[i];
        im->is_st[i] = !looks_like_zip(f) && !ends_with(f, ".bin");
        if (im->is_st[i] ? pln_safetensors_open(&im->st[i], f) : pln_torchzip_open(&im->tz[i], f)) goto fail;
        if (i == 0) ck->format = im->is_st[i] ? "safetensors" : "pytorch";
        total += im->is_st[i] ? im->st[i].n_tensors : im->tz[i].n_tensors;
    }
    ck->tensors = pln_xcalloc((size_t)total + 1, sizeof *ck->tensors);
    for (int i = 0; i < ck->n_files; i++) {
        int64_t n = im->is_st[i] ? im->st[i].n_tensors : im->tz[i].n_tensors;
        const pln_tensor *src = im->is_st[i] ? im->st[i].tensors : im->tz[i].tensors;
        for (int64_t j = 0; j < n; j++) {
            pln_tensor *t = &ck->tensors[ck->n_tensors++];
            *t = src[j];
            t->name = pln_xstrdup(strip(src[j].name));
            t->file = ck->files[i];
        }
    }
    im->sorted = pln_xmalloc((size_t)ck->n_tensors * sizeof *im->sorted + 1);
    for (int64_t j = 0; j < ck->n_tensors; j++) im->sorted[j] = j;
    qsort_r(im->sorted, (size_t)ck->n_tensors, sizeof *im->sorted, idx_cmp, ck->tensors);
    for (int64_t j = 1; j < ck->n_tensors; j++) {
        const pln_tensor *a = &ck->tensors[im->sorted[j - 1]], *b = &ck->tensors[im->sorted[j]];
        if (!strcmp(a->name, b->name)) {
            rc = pln_errorf("%s: tensor \"%s\" appears twice (in %s and %s; with and without the \"transformer.\" prefix?)",
                            path, a->name, a->file, b->file);
            goto fail;
        }
    }
    /* Every tensor the index maps to a file must be in that file. */
    for (size_t k = 0; k < n_wmap; k++) {
        const pln_tensor *t = pln_ckpt_find(ck, strip(wmap[k].name));
        if (!t || strcmp(t->file, wmap[k].file)) {
            rc = pln_errorf("%s: tensor \"%s\" is mapped by the index to %s but is not in that file%s%s", index,
                            wmap[k].name, wmap[k].file, t ? "; it is in " : "", t ? t->file : "");
            goto fail;
        }
    }
    for (size_t k = 0; k < n_wmap; k++) { free(wmap[k].name); free(wmap[k].file); }
    free(wmap);
    free(index);
    return 0;
fail:
    (void)rc;
    for (size_t k = 0; k < n_wmap; k++) { free(wmap[k].name); free(wmap[k].file); }
    free(wmap);
    free(index);
    pln_ckpt_close(ck);
    return -1;
}

const pln_tensor *pln_ckpt_find(const pln_ckpt *ck, const char *name) {
    const ckpt_impl *im = ck->impl;
    if (!im || !im->sorted) return NULL;
    name = strip(name);
    int64_t lo = 0, hi = ck->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const pln_tensor *t = &ck->tensors[im->sorted[mid]];
        int c = strcmp(name, t->name);
        if (!c) return t;
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

void pln_ckpt_close(pln_ckpt *ck) {
    if (!ck) return;
    ckpt_impl *im = ck->impl;
    if (im) {
        for (int i = 0; i < im->n; i++) {
            if (im->is_st[i]) pln_safetensors_close(&im->st[i]);
            else pln_torchzip_close(&im->tz[i]);
        }
        free(im->is_st);
        free(im->st);
        free(im->tz);
        free(im->sorted);
        free(im);
    }
    for (int64_t j = 0; j < ck->n_tensors; j++) free(ck->tensors[j].name);
    free(ck->tensors);
    for (int i = 0; i < ck->n_files; i++) free(ck->files[i]);
    free(ck->files);
    free(ck->path);
    free(ck->dir);
    free(ck->tokenizer_path);
    memset(ck, 0, sizeof *ck);
}
