/* test_torchzip.c — PyTorch zip checkpoints and the safe unpickler, on pickles and zips built here
 * by hand the way torch.save lays them out (stored and deflated entries, ZIP64, a folder that is
 * not "archive/", protocol 2 and 4 opcodes, tied weights, strided views) and on hostile ones. */
#include "formats/torchzip.h"
#include "kernels/pln_math.h"
#include "tests/test.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/resource.h>

/* ---- a tiny pickle writer ---- */
typedef struct { uint8_t *b; size_t n, cap; int memo; } pk;
static void put(pk *p, const void *d, size_t n) {
    if (p->n + n > p->cap) { p->cap = (p->n + n) * 2 + 64; p->b = pln_xrealloc(p->b, p->cap); }
    memcpy(p->b + p->n, d, n);
    p->n += n;
}
static void op(pk *p, uint8_t o) { put(p, &o, 1); }
static void u32(pk *p, uint32_t v) { uint8_t b[4] = {v, v >> 8, v >> 16, v >> 24}; put(p, b, 4); }
static void str(pk *p, const char *s) { op(p, 'X'); u32(p, (uint32_t)strlen(s)); put(p, s, strlen(s)); }
static void sstr(pk *p, const char *s) { op(p, 0x8c); op(p, (uint8_t)strlen(s)); put(p, s, strlen(s)); }
static void memo(pk *p) { op(p, 'q'); op(p, (uint8_t)p->memo++); }
static void integer(pk *p, int64_t v) {
    if (v >= 0 && v < 256) { op(p, 'K'); op(p, (uint8_t)v); }
    else if (v >= 0 && v < 65536) { op(p, 'M'); op(p, (uint8_t)v); op(p, (uint8_t)(v >> 8)); }
    else { op(p, 0x8a); op(p, 8); for (int i = 0; i < 8; i++) op(p, (uint8_t)((uint64_t)v >> (8 * i))); }
}
static void global(pk *p, const char *mod, const char *name) {
    op(p, 'c'); put(p, mod, strlen(mod)); op(p, '\n'); put(p, name, strlen(name)); op(p, '\n');
}
static void tuple(pk *p, const int64_t *v, int n) { op(p, '('); for (int i = 0; i < n; i++) integer(p, v[i]); op(p, 't'); }

typedef struct { const char *name, *stype, *key; int64_t numel, off; int nd; int64_t shape[4], stride[4]; } tspec;

/* One state-dict value exactly as torch.save writes it (protocol 2). */
static void tensor_v2(pk *p, const tspec *t) {
    global(p, "torch._utils", "_rebuild_tensor_v2"); memo(p);
    op(p, '(');
    op(p, '('); str(p, "storage"); global(p, "torch", t->stype); str(p, t->key); str(p, "cpu"); integer(p, t->numel); op(p, 't');
    op(p, 'Q');
    integer(p, t->off);
    tuple(p, t->shape, t->nd);
    tuple(p, t->stride, t->nd);
    op(p, 0x89);
    global(p, "collections", "OrderedDict"); op(p, ')'); op(p, 'R');
    op(p, 't');
    op(p, 'R'); memo(p);
}

static float g_f32[12];
static uint16_t g_f16[3], g_bf16[1];

static const tspec g_specs[] = {
    {"transformer.w", "FloatStorage", "0", 12, 0, 2, {3, 4}, {4, 1}},
    {"row2", "FloatStorage", "0", 12, 8, 1, {4}, {1}},
    {"wT", "FloatStorage", "0", 12, 0, 2, {4, 3}, {1, 4}},
    {"h", "HalfStorage", "1", 3, 0, 1, {3}, {1}},
    {"s", "BFloat16Storage", "2", 1, 0, 0, {0}, {0}},
};
#define N_SPECS 5

/* A protocol-2 plain-dict state dict of g_specs, plus "tied" = the same tensor object as "transformer.w". */
static pk pickle_v2(void) {
    pk p = {0};
    op(&p, 0x80); op(&p, 2);
    op(&p, '}'); memo(&p);
    op(&p, '(');
    int w_memo = -1;
    for (int i = 0; i < N_SPECS; i++) {
        str(&p, g_specs[i].name);
        tensor_v2(&p, &g_specs[i]);
        if (i == 0) w_memo = p.memo - 1;
    }
    str(&p, "tied"); op(&p, 'h'); op(&p, (uint8_t)w_memo);
    op(&p, 'u');
    op(&p, '.');
    return p;
}

/* Protocol 4 flavour: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, an OrderedDict with a
 * _metadata BUILD, _rebuild_parameter, and _rebuild_tensor_v3 over an UntypedStorage. */
static pk pickle_v4(void) {
    pk p = {0};
    op(&p, 0x80); op(&p, 4);
    op(&p, 0x95); for (int i = 0; i < 8; i++) op(&p, 0);
    sstr(&p, "collections"); op(&p, 0x94); sstr(&p, "OrderedDict"); op(&p, 0x94); op(&p, 0x93); op(&p, 0x94);
    op(&p, ')'); op(&p, 'R'); op(&p, 0x94);
    op(&p, '(');
    /* "p": Parameter(v2 tensor) */
    sstr(&p, "p");
    global(&p, "torch._utils", "_rebuild_parameter");
    op(&p, '(');
    tensor_v2(&p, &g_specs[0]);
    op(&p, 0x88);
    global(&p, "collections", "OrderedDict"); op(&p, ')'); op(&p, 'R');
    op(&p, 't'); op(&p, 'R');
    /* "u": v3 over untyped storage "1" (6 bytes) viewed as float16 [3] */
    sstr(&p, "u");
    global(&p, "torch._utils", "_rebuild_tensor_v3");
    op(&p, '(');
    op(&p, '('); sstr(&p, "storage"); global(&p, "torch", "UntypedStorage"); sstr(&p, "1"); sstr(&p, "cpu"); integer(&p, 6); op(&p, 't');
    op(&p, 'Q');
    integer(&p, 0);
    int64_t sh[1] = {3}, st[1] = {1};
    tuple(&p, sh, 1);
    integer(&p, st[0]); op(&p, 0x85);   /* the stride as TUPLE1 */
    op(&p, 0x89);
    global(&p, "collections", "OrderedDict"); op(&p, ')'); op(&p, 'R');
    global(&p, "torch", "float16");
    op(&p, 't'); op(&p, 'R');
    op(&p, 'u');
    /* state: {"_metadata": OrderedDict()} applied with BUILD, as nn.Module.state_dict() pickles */
    op(&p, '}'); sstr(&p, "_metadata"); global(&p, "collections", "OrderedDict"); op(&p, ')'); op(&p, 'R'); op(&p, 's');
    op(&p, 'b');
    op(&p, '.');
    return p;
}

/* ---- zips written with libarchive ---- */
typedef struct { const char *name; const void *data; size_t n; } zent;

static uint8_t *make_zip(const zent *e, int n, const char *compression, bool zip64, size_t *out_n) {
    size_t cap = 1 << 20, used = 0;
    uint8_t *buf = pln_xmalloc(cap);
    struct archive *a = archive_write_new();
    archive_write_set_format_zip(a);
    char opt[64];
    snprintf(opt, sizeof opt, "zip:compression=%s", compression);
    PLN_ASSERT(archive_write_set_options(a, opt) == ARCHIVE_OK);
    if (zip64) PLN_ASSERT(archive_write_set_options(a, "zip:zip64") == ARCHIVE_OK);
    archive_write_set_bytes_in_last_block(a, 1);
    PLN_ASSERT(archive_write_open_memory(a, buf, cap, &used) == ARCHIVE_OK);
    for (int i = 0; i < n; i++) {
        struct archive_entry *en = archive_entry_new();
        archive_entry_set_pathname(en, e[i].name);
        archive_entry_set_size(en, (la_int64_t)e[i].n);
        archive_entry_set_filetype(en, AE_IFREG);
        archive_entry_set_perm(en, 0644);
        PLN_ASSERT(archive_write_header(a, en) == ARCHIVE_OK);
        if (e[i].n) PLN_ASSERT(archive_write_data(a, e[i].data, e[i].n) == (la_ssize_t)e[i].n);
        archive_entry_free(en);
    }
    PLN_ASSERT(archive_write_close(a) == ARCHIVE_OK);
    archive_write_free(a);
    *out_n = used;
    return buf;
}

static char *tmp_path(const char *name) { return pln_xasprintf("%s/%s", test_tmpdir(), name); }
static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

/* A checkpoint zip "FOLDER/data.pkl" + storages, written to a file; returns its path. */
static char *write_ckpt(const char *file, const char *folder, const pk *pkl, const char *compression, bool zip64) {
    char n0[128], n1[128], n2[128], n3[128], n4[128];
    snprintf(n0, sizeof n0, "%s/data.pkl", folder);
    snprintf(n1, sizeof n1, "%s/data/0", folder);
    snprintf(n2, sizeof n2, "%s/data/1", folder);
    snprintf(n3, sizeof n3, "%s/data/2", folder);
    snprintf(n4, sizeof n4, "%s/version", folder);
    zent e[5] = {{n0, pkl->b, pkl->n}, {n1, g_f32, sizeof g_f32}, {n2, g_f16, sizeof g_f16}, {n3, g_bf16, sizeof g_bf16}, {n4, "3\n", 2}};
    size_t zn;
    uint8_t *z = make_zip(e, 5, compression, zip64, &zn);
    char *p = tmp_path(file);
    write_bytes(p, z, zn);
    free(z);
    return p;
}

static void check_good(const pln_torchzip *tz, const char *what) {
    const pln_tensor *w = pln_torchzip_find(tz, "transformer.w"), *tied = pln_torchzip_find(tz, "tied");
    const pln_tensor *row = pln_torchzip_find(tz, "row2"), *wt = pln_torchzip_find(tz, "wT");
    const pln_tensor *h = pln_torchzip_find(tz, "h"), *s = pln_torchzip_find(tz, "s");
    CHECK(tz->n_tensors == 6, "%s: 6 tensors, got %lld", what, (long long)tz->n_tensors);
    CHECK(!strcmp(tz->prefix, "mymodel/"), "%s: prefix %s", what, tz->prefix);
    CHECK(w && w->dtype == PLN_DTYPE_F32 && w->ndim == 2 && w->shape[0] == 3 && w->shape[1] == 4 && w->nbytes == 48 && w->contiguous,
          "%s: w", what);
    CHECK(w && !memcmp(w->data, g_f32, 48), "%s: w values", what);
    CHECK(w && tied && tied->data == w->data && tied->nbytes == w->nbytes, "%s: tied shares w's bytes", what);
    CHECK(w && row && row->data == w->data + 32 && row->nbytes == 16 && row->contiguous, "%s: storage offset in elements", what);
    float r0;
    if (row) memcpy(&r0, row->data, 4);
    CHECK(row && r0 == g_f32[8], "%s: row2[0] = storage[8]", what);
    CHECK(wt && !wt->contiguous && wt->data == w->data && wt->nbytes == 48, "%s: transposed view recorded non-contiguous", what);
    CHECK(h && h->dtype == PLN_DTYPE_F16 && h->nbytes == 6 && !memcmp(h->data, g_f16, 6), "%s: half tensor", what);
    CHECK(s && s->dtype == PLN_DTYPE_BF16 && s->ndim == 0 && s->nbytes == 2 && !memcmp(s->data, g_bf16, 2), "%s: bf16 scalar", what);
    CHECK(w && w->data == tz->map.data + w->file_offset, "%s: zero copy into the mapping", what);
}

static void expect_fail(const char *what, const char *path, const char *want) {
    pln_torchzip tz;
    int rc = pln_torchzip_open(&tz, path);
    CHECK(rc == -1, "%s: expected an error", what);
    CHECK(strstr(pln_error(), path) != NULL, "%s: error does not name the file: %s", what, pln_error());
    CHECK(strstr(pln_error(), want) != NULL, "%s: error lacks \"%s\": %s", what, want, pln_error());
    printf("  %-20s -> %s\n", what, pln_error());
    if (rc == 0) pln_torchzip_close(&tz);
}

static void test_good(void) {
    pk p = pickle_v2();
    char *path = write_ckpt("good.bin", "mymodel", &p, "store", false);
    pln_torchzip tz;
    CHECK(pln_torchzip_open(&tz, path) == 0, "open: %s", pln_error());
    if (tz.tensors) check_good(&tz, "stored");
    pln_torchzip_close(&tz);
    free(path);
    path = write_ckpt("good64.bin", "mymodel", &p, "store", true);
    CHECK(pln_torchzip_open(&tz, path) == 0, "open zip64: %s", pln_error());
    if (tz.tensors) check_good(&tz, "zip64");
    pln_torchzip_close(&tz);
    free(path);

    pk q = pickle_v4();
    path = write_ckpt("v4.bin", "archive", &q, "store", false);
    CHECK(pln_torchzip_open(&tz, path) == 0, "open v4: %s", pln_error());
    const pln_tensor *pp = pln_torchzip_find(&tz, "p"), *u = pln_torchzip_find(&tz, "u");
    CHECK(tz.n_tensors == 2 && tz.prefix && !strcmp(tz.prefix, "archive/"), "v4: 2 tensors under archive/");
    CHECK(pp && pp->dtype == PLN_DTYPE_F32 && pp->nbytes == 48 && !memcmp(pp->data, g_f32, 48), "v4: parameter");
    CHECK(u && u->dtype == PLN_DTYPE_F16 && u->ndim == 1 && u->shape[0] == 3 && !memcmp(u->data, g_f16, 6), "v4: v3 over untyped storage");
    pln_torchzip_close(&tz);
    free(path);

    /* compressed entry: the same archive deflated */
    path = write_ckpt("deflated.bin", "mymodel", &p, "deflate", false);
    expect_fail("compressed-entry", path, "is compressed");
    CHECK(strstr(pln_error(), "mymodel/data"), "names the entry: %s", pln_error());
    free(path);
    free(p.b);
    free(q.b);
}

static void expect_pickle_fail(const char *what, const pk *p, const char *want) {
    pln_pickle_tensor *t;
    int64_t n;
    int rc = pln_unpickle_state_dict(p->b, p->n, what, &t, &n);
    CHECK(rc == -1, "%s: expected an error", what);
    CHECK(strstr(pln_error(), want) != NULL, "%s: error lacks \"%s\": %s", what, want, pln_error());
    printf("  %-20s -> %s\n", what, pln_error());
    if (rc == 0) pln_pickle_tensors_free(t, n);
}

static void test_bad_pickles(void) {
    /* torch.load(weights_only=False) would run os.system here; we must refuse it by name. */
    pk p = {0};
    op(&p, 0x80); op(&p, 2); global(&p, "os", "system"); str(&p, "touch /tmp/pwned"); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    expect_pickle_fail("os.system", &p, "global os.system is not allowed");
    char *path = write_ckpt("evil.bin", "evil", &p, "store", false);
    expect_fail("evil-zip", path, "os.system");
    free(path);
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 4); sstr(&p, "builtins"); sstr(&p, "eval"); op(&p, 0x93); sstr(&p, "1+1"); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    expect_pickle_fail("builtins.eval", &p, "global builtins.eval is not allowed");
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "a"); integer(&p, 5); op(&p, 's'); op(&p, '.');
    expect_pickle_fail("not-a-tensor", &p, "\"a\" is not a tensor");
    free(p.b);

    p = (pk){0};
    tspec big = {"big", "FloatStorage", "0", 12, 0, 2, {(int64_t)1 << 62, 16}, {16, 1}};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "big"); tensor_v2(&p, &big); op(&p, 's'); op(&p, '.');
    path = write_ckpt("overflow.bin", "m", &p, "store", false);
    expect_fail("shape-overflow", path, "overflow");
    free(path);
    free(p.b);

    p = (pk){0};
    tspec past = {"past", "FloatStorage", "0", 12, 10, 1, {4}, {1}};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "past"); tensor_v2(&p, &past); op(&p, 's'); op(&p, '.');
    path = write_ckpt("past.bin", "m", &p, "store", false);
    expect_fail("view-past-storage", path, "storage 0 holds 12");
    free(path);
    free(p.b);

    p = (pk){0};
    tspec lie = {"lie", "FloatStorage", "0", 100, 0, 1, {100}, {1}};   /* storage entry has 48 bytes */
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "lie"); tensor_v2(&p, &lie); op(&p, 's'); op(&p, '.');
    path = write_ckpt("short-storage.bin", "m", &p, "store", false);
    expect_fail("storage-too-small", path, "needs 400 bytes");
    free(path);
    free(p.b);

    p = (pk){0};
    tspec miss = {"miss", "FloatStorage", "7", 1, 0, 1, {1}, {1}};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "miss"); tensor_v2(&p, &miss); op(&p, 's'); op(&p, '.');
    path = write_ckpt("missing-storage.bin", "m", &p, "store", false);
    expect_fail("missing-storage", path, "m/data/7 is missing");
    free(path);
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); op(&p, '(');
    str(&p, "d"); tensor_v2(&p, &g_specs[1]); str(&p, "d"); tensor_v2(&p, &g_specs[1]);
    op(&p, 'u'); op(&p, '.');
    expect_pickle_fail("duplicate-names", &p, "duplicate tensor name \"d\"");
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, 'I'); put(&p, "1\n", 2); op(&p, '.');
    expect_pickle_fail("text-opcode", &p, "not supported");
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, ']'); op(&p, '.');
    expect_pickle_fail("list-top", &p, "not a dict");
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, 's'); op(&p, '.');
    expect_pickle_fail("underflow", &p, "underflow");
    free(p.b);

    p = (pk){0};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); op(&p, 'r'); u32(&p, 0xfffffff0u); op(&p, '.');
    expect_pickle_fail("memo-jump", &p, "memo index");
    free(p.b);

    /* torch 2.x wraps tensor subclasses in _rebuild_from_type_v2(func, type, args, state) */
    for (int nested = 0; nested < 2; nested++) {
        p = (pk){0};
        op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, "ft");
        global(&p, "torch._tensor", "_rebuild_from_type_v2");
        op(&p, '(');
        global(&p, nested ? "torch._tensor" : "torch._utils", nested ? "_rebuild_from_type_v2" : "_rebuild_tensor_v2");
        global(&p, "torch.nn.parameter", "Parameter");
        op(&p, '(');
        op(&p, '('); str(&p, "storage"); global(&p, "torch", "FloatStorage"); str(&p, "0"); str(&p, "cpu"); integer(&p, 12); op(&p, 't');
        op(&p, 'Q'); integer(&p, 4);
        int64_t sh[1] = {8}, sd[1] = {1};
        tuple(&p, sh, 1); tuple(&p, sd, 1); op(&p, 0x89);
        global(&p, "collections", "OrderedDict"); op(&p, ')'); op(&p, 'R');
        op(&p, 't');
        op(&p, '}');
        op(&p, 't'); op(&p, 'R'); op(&p, 's'); op(&p, '.');
        if (nested) {
            expect_pickle_fail("from-type-nested", &p, "unsupported _rebuild_from_type_v2");
        } else {
            pln_pickle_tensor *t;
            int64_t n;
            int rc = pln_unpickle_state_dict(p.b, p.n, "from-type", &t, &n);
            CHECK(rc == 0 && n == 1 && t[0].storage_offset == 4 && t[0].shape[0] == 8 && t[0].dtype == PLN_DTYPE_F32,
                  "_rebuild_from_type_v2: %s", rc ? pln_error() : "wrong tensor");
            if (rc == 0) pln_pickle_tensors_free(t, n);
        }
        free(p.b);
    }

    /* every prefix of a valid pickle fails cleanly */
    p = pickle_v2();
    int bad = 0;
    for (size_t cut = 0; cut < p.n; cut++) {
        uint8_t *c = pln_xmalloc(cut + 1);
        memcpy(c, p.b, cut);
        pln_pickle_tensor *t;
        int64_t n;
        int rc = pln_unpickle_state_dict(c, cut, "cut", &t, &n);
        if (rc != -1 || strncmp(pln_error(), "cut", 3)) bad++;
        if (rc == 0) pln_pickle_tensors_free(t, n);
        free(c);
    }
    CHECK(bad == 0, "%d of %zu truncated pickles not rejected", bad, p.n);
    printf("  pickle truncated at %zu cut points: all rejected\n", p.n);
    free(p.b);
}

static void test_bad_files(void) {
    /* legacy torch.save (pre-1.6): a bare pickle starting with the magic number */
    uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    char *path = tmp_path("legacy.bin");
    write_bytes(path, legacy, sizeof legacy);
    expect_fail("legacy", path, "unsupported legacy format, re-save with torch >= 1.6");
    free(path);
    path = tmp_path("garbage.bin");
    write_bytes(path, "hello world", 11);
    expect_fail("not-zip", path, "not a PyTorch zip");
    free(path);
    path = tmp_path("empty.bin");
    write_bytes(path, "", 0);
    expect_fail("empty", path, "not a PyTorch zip");
    free(path);

    /* no data.pkl */
    zent e[1] = {{"m/data/0", g_f32, sizeof g_f32}};
    size_t zn;
    uint8_t *z = make_zip(e, 1, "store", false, &zn);
    path = tmp_path("nopkl.bin");
    write_bytes(path, z, zn);
    expect_fail("no-data.pkl", path, "no m/data.pkl");
    free(path);
    free(z);

    /* every prefix of a valid zip fails cleanly (in memory) */
    pk p = pickle_v2();
    char n0[] = "mymodel/data.pkl", n1[] = "mymodel/data/0", n2[] = "mymodel/data/1", n3[] = "mymodel/data/2";
    zent ze[4] = {{n0, p.b, p.n}, {n1, g_f32, sizeof g_f32}, {n2, g_f16, sizeof g_f16}, {n3, g_bf16, sizeof g_bf16}};
    for (int z64 = 0; z64 < 2; z64++) {
        z = make_zip(ze, 4, "store", z64, &zn);
        int bad = 0;
        for (size_t cut = 0; cut < zn; cut++) {
            uint8_t *c = pln_xmalloc(cut + 1);
            memcpy(c, z, cut);
            pln_torchzip tz;
            int rc = pln_torchzip_parse(&tz, c, cut, "cut");
            if (rc != -1 || strncmp(pln_error(), "cut", 3)) bad++;
            if (rc == 0) pln_torchzip_close(&tz);
            free(c);
        }
        pln_torchzip tz;
        CHECK(pln_torchzip_parse(&tz, z, zn, "whole") == 0, "whole zip parses: %s", pln_error());
        pln_torchzip_close(&tz);
        CHECK(bad == 0, "%d of %zu truncated zips (zip64 %d) not rejected", bad, zn, z64);
        printf("  zip%s truncated at %zu cut points: all rejected\n", z64 ? "64" : "", zn);
        free(z);
    }
    free(p.b);
}

/* A real file written by torch.save (torch 1.13, save_pretrained): tied lm_head shares storage. */
static void test_fixture(void) {
    const char *path = "tests/fixtures/models/bloom-4h/fp32-bin/pytorch_model-00001-of-00004.bin";
    if (access(path, R_OK) != 0) { printf("SKIP fixture %s missing\n", path); return; }
    pln_torchzip tz;
    CHECK(pln_torchzip_open(&tz, path) == 0, "fixture: %s", pln_error());
    const pln_tensor *we = pln_torchzip_find(&tz, "transformer.word_embeddings.weight"), *lm = pln_torchzip_find(&tz, "lm_head.weight");
    CHECK(tz.prefix && !strcmp(tz.prefix, "pytorch_model-00001-of-00004/"), "folder named after the file: %s", tz.prefix ? tz.prefix : "");
    CHECK(we && we->dtype == PLN_DTYPE_F32 && we->shape[0] == 1003 && we->shape[1] == 64 && we->contiguous, "word_embeddings");
    CHECK(we && lm && we->data == lm->data, "tied lm_head shares the embedding storage");
    pln_torchzip_close(&tz);
}

/* ---- BLOOM-176B's embedding: a 7.2 GB storage in a ZIP64 archive, as a sparse file ---- */
static void le(uint8_t *b, uint64_t v, int n) { for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i)); }

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

static void test_zip64_big(void) {
    const int64_t V = 250880, H = 14336;
    const uint64_t S = (uint64_t)V * H * 2;   /* bf16 bytes: 7,193,231,360 > 4 GiB */
    tspec emb = {"transformer.word_embeddings.weight", "BFloat16Storage", "0", V * H, 0, 2, {V, H}, {H, 1}};
    pk p = {0};
    op(&p, 0x80); op(&p, 2); op(&p, '}'); str(&p, emb.name); tensor_v2(&p, &emb); op(&p, 's'); op(&p, '.');
    const char *n0 = "big/data.pkl", *n1 = "big/data/0";
    size_t l0 = strlen(n0), l1 = strlen(n1);
    uint8_t h[256];
    char *path = tmp_path("bloom176b-emb.bin");
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "create %s", path);
    if (!f) return;
    /* local header 0 + pickle */
    memset(h, 0, 30);
    le(h, 0x04034b50, 4); le(h + 4, 45, 2); le(h + 18, p.n, 4); le(h + 22, p.n, 4); le(h + 26, l0, 2);
    fwrite(h, 1, 30, f); fwrite(n0, 1, l0, f); fwrite(p.b, 1, p.n, f);
    uint64_t off1 = 30 + l0 + p.n;
    /* local header 1 with a ZIP64 extra field holding the sizes */
    memset(h, 0, 30 + 20);
    le(h, 0x04034b50, 4); le(h + 4, 45, 2); le(h + 18, 0xffffffffu, 4); le(h + 22, 0xffffffffu, 4); le(h + 26, l1, 2); le(h + 28, 20, 2);
    fwrite(h, 1, 30, f); fwrite(n1, 1, l1, f);
    le(h, 1, 2); le(h + 2, 16, 2); le(h + 4, S, 8); le(h + 12, S, 8);
    fwrite(h, 1, 20, f);
    uint64_t data1 = off1 + 30 + l1 + 20, cd = data1 + S;
    bool ok = fseeko(f, (off_t)cd, SEEK_SET) == 0;
    /* central directory */
    memset(h, 0, 46);
    le(h, 0x02014b50, 4); le(h + 4, 45, 2); le(h + 6, 45, 2); le(h + 20, p.n, 4); le(h + 24, p.n, 4); le(h + 28, l0, 2);
    ok &= fwrite(h, 1, 46, f) == 46 && fwrite(n0, 1, l0, f) == l0;
    memset(h, 0, 46);
    le(h, 0x02014b50, 4); le(h + 4, 45, 2); le(h + 6, 45, 2); le(h + 20, 0xffffffffu, 4); le(h + 24, 0xffffffffu, 4);
    le(h + 28, l1, 2); le(h + 30, 20, 2); le(h + 42, off1, 4);
    ok &= fwrite(h, 1, 46, f) == 46 && fwrite(n1, 1, l1, f) == l1;
    le(h, 1, 2); le(h + 2, 16, 2); le(h + 4, S, 8); le(h + 12, S, 8);
    ok &= fwrite(h, 1, 20, f) == 20;
    uint64_t cd_size = 46 + l0 + 46 + l1 + 20, z64 = cd + cd_size;
    /* ZIP64 end of central directory record, locator, and the classic record pointing at them */
    memset(h, 0, 56 + 20 + 22);
    le(h, 0x06064b50, 4); le(h + 4, 44, 8); le(h + 12, 45, 2); le(h + 14, 45, 2); le(h + 24, 2, 8); le(h + 32, 2, 8);
    le(h + 40, cd_size, 8); le(h + 48, cd, 8);
    le(h + 56, 0x07064b50, 4); le(h + 64, z64, 8); le(h + 72, 1, 4);
    uint8_t *e = h + 76;
    le(e, 0x06054b50, 4); le(e + 8, 2, 2); le(e + 10, 2, 2); le(e + 12, cd_size, 4); le(e + 16, 0xffffffffu, 4);
    ok &= fwrite(h, 1, 98, f) == 98;
    ok &= fclose(f) == 0;
    free(p.b);
    if (!ok) { printf("SKIP zip64: cannot write a sparse 7.2 GB file here\n"); free(path); return; }
    pln_torchzip tz;
    long f0 = minor_faults();
    double t0 = pln_now();
    int rc = pln_torchzip_open(&tz, path);
    double dt = pln_now() - t0;
    long faults = minor_faults() - f0;
    CHECK(rc == 0, "zip64 7.2 GB: %s", pln_error());
    if (rc == 0) {
        const pln_tensor *t = &tz.tensors[0];
        CHECK(tz.n_tensors == 1 && t->dtype == PLN_DTYPE_BF16 && t->shape[0] == V && t->shape[1] == H && t->nbytes == S,
              "zip64: embedding [250880, 14336] bf16, %llu bytes", (unsigned long long)t->nbytes);
        CHECK(t->file_offset == data1 && tz.map.size == z64 + 98, "zip64: data offset %llu (want %llu)",
              (unsigned long long)t->file_offset, (unsigned long long)data1);
        /* listing must not read the 7.2 GB: a touched storage would fault ~1.8 million pages */
        CHECK(faults < 20000, "zip64: opening touched %ld pages", faults);
        printf("  zip64 7.2 GB storage listed in %.3f s with %ld page faults (headers only)\n", dt, faults);
        pln_torchzip_close(&tz);
    }
    unlink(path);
    free(path);
}

/* A file written by torch.save itself (torch 1.13, kept as a fuzz seed): an nn.Linear state_dict
 * (OrderedDict with _metadata) plus a Parameter, a transposed view, a row view, a tied entry and
 * bf16 / int64 / bool tensors. weight = arange(24).reshape(4, 6), bias = arange(4). */
static void test_real_torch(void) {
    const char *path = "tests/fuzz/seeds/fuzz_torchzip/torch113_features.bin";
    pln_torchzip tz;
    CHECK(pln_torchzip_open(&tz, path) == 0, "torch.save file: %s", pln_error());
    if (!tz.tensors) return;
    CHECK(tz.n_tensors == 9 && !strcmp(tz.prefix, "torch113_features/"), "9 tensors under %s", tz.prefix);
    const pln_tensor *w = pln_torchzip_find(&tz, "weight"), *b = pln_torchzip_find(&tz, "bias");
    const pln_tensor *pa = pln_torchzip_find(&tz, "param"), *tr = pln_torchzip_find(&tz, "transposed");
    const pln_tensor *row = pln_torchzip_find(&tz, "row2"), *tied = pln_torchzip_find(&tz, "tied");
    const pln_tensor *bf = pln_torchzip_find(&tz, "bf"), *i64 = pln_torchzip_find(&tz, "i64"), *fl = pln_torchzip_find(&tz, "flag");
    bool wok = w && w->dtype == PLN_DTYPE_F32 && w->ndim == 2 && w->shape[0] == 4 && w->shape[1] == 6 && w->contiguous;
    for (int i = 0; wok && i < 24; i++) { float x; memcpy(&x, w->data + 4 * i, 4); wok = x == (float)i; }
    CHECK(wok, "weight = arange(24) [4, 6]");
    float x3;
    if (b) memcpy(&x3, b->data + 12, 4);
    CHECK(b && b->ndim == 1 && b->shape[0] == 4 && x3 == 3.0f, "bias");
    uint16_t h2;
    if (pa) memcpy(&h2, pa->data + 4, 2);
    CHECK(pa && pa->dtype == PLN_DTYPE_F16 && pa->shape[0] == 3 && pln_f16_to_f32(h2) == 2.0f, "Parameter (fp16)");
    CHECK(tr && !tr->contiguous && tr->shape[0] == 6 && tr->shape[1] == 4 && tr->nbytes == 96, "transposed view non-contiguous");
    float r0;
    if (row) memcpy(&r0, row->data, 4);
    CHECK(row && row->contiguous && row->shape[0] == 6 && r0 == 12.0f, "row view: storage offset 12");
    CHECK(tied && w && tied->data == w->data, "tied entry shares storage");
    uint16_t b0;
    int64_t l1;
    if (bf) memcpy(&b0, bf->data, 2);
    if (i64) memcpy(&l1, i64->data + 8, 8);
    CHECK(bf && bf->dtype == PLN_DTYPE_BF16 && pln_bf16_to_f32(b0) == 1.5f, "bf16");
    CHECK(i64 && i64->dtype == PLN_DTYPE_I64 && l1 == -9, "int64");
    CHECK(fl && fl->dtype == PLN_DTYPE_BOOL && fl->nbytes == 2 && fl->data[0] == 1 && fl->data[1] == 0, "bool");
    pln_torchzip_close(&tz);
}

int main(void) {
    test_begin("test_torchzip");
    for (int i = 0; i < 12; i++) g_f32[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 3; i++) g_f16[i] = pln_f32_to_f16((float)i + 0.25f);
    g_bf16[0] = pln_f32_to_bf16(-3.5f);
    test_good();
    test_bad_pickles();
    test_bad_files();
    test_fixture();
    test_real_torch();
    test_zip64_big();
    return test_done();
}
