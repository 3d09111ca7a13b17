/* test_shard.c — the pollen shard format: writer/reader round trip, alignment, checksums, hostile
 * files (truncation, bad magic/version, overlap, overflow, duplicates), manifest and shard set,
 * the small files' checksums and the manifest's field rules, int8 scale and padding checks, and
 * the bloom-tp-v1 tensor list.
 *
 * Also a helper mode for end-to-end tests:
 *   test_shard --write-sample DIR [--tp N] [--int8] [--group G] [--quantize-embedding]
 * writes a small, valid bloom-tp-v1 shard set (random fp16 / int8 values from a fixed seed,
 * tokenizer.json copied from the fixtures when present) without needing the converter;
 *   test_shard --write-special FILE
 * writes one rank file with known values (NaN, Inf, int8 with group scales) for inspect --stats;
 *   test_shard --write-sparse FILE
 * writes a sparse rank file declaring a 64 GiB tensor (listing must read headers only);
 *   test_shard --bench FILE
 * measures writer and checksum throughput on a 1 GiB rank file (removed afterwards). */
#include "formats/shard.h"
#include "kernels/pln_math.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>

/* ---- small helpers ------------------------------------------------------------------------ */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {   /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rndf(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

static uint8_t *slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static void spew(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    PLN_ASSERT(f);
    PLN_ASSERT(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static bool file_exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t rd64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* Recomputes the table and preamble checksums so a structural defect, not the checksum, is what
 * the reader reports. */
static size_t g_len;   /* length of the buffer rehash() works on */
static void rehash(uint8_t *b) {
    uint64_t n = rd64(b + 32);
    if (n <= 4096 && 128 + n * 256 <= g_len) wr64(b + 112, pln_xxh3(b + 128, (size_t)(n * 256)));
    wr64(b + 120, pln_xxh3(b, 120));
}

/* Opens a mutated copy; expects failure with a message containing `want` (and the path). */
static void expect_bad(const uint8_t *buf, size_t n, const char *want, const char *what) {
    char *p = pln_xasprintf("%s/bad.pln", test_tmpdir());
    spew(p, buf, n);
    pln_shard *s = pln_shard_open(p);
    CHECK(!s, "%s: opened a bad file", what);
    if (s) pln_shard_close(s);
    CHECK(strstr(pln_error(), p) != NULL, "%s: error does not name the file: %s", what, pln_error());
    CHECK(!want || strstr(pln_error(), want) != NULL, "%s: error \"%s\" lacks \"%s\"", what, pln_error(), want);
    free(p);
}

/* ---- a generic file with several dtypes ---------------------------------------------------- */
#define NT 6
static pln_shard_spec g_specs[NT] = {
    {"a.f32", PLN_DTYPE_F32, 2, {3, 5}},
    {"b.f16", PLN_DTYPE_F16, 1, {4099}},
    {"c.i8", PLN_DTYPE_I8, 2, {7, 1000}},
    {"c.i8_scale", PLN_DTYPE_F16, 2, {7, 1}},
    {"d.i32", PLN_DTYPE_I32, 3, {2, 3, 4}},
    {"e.bf16", PLN_DTYPE_BF16, 1, {1}},
};
static uint8_t *g_data[NT];
static uint64_t g_nbytes[NT];

static void make_data(void) {
    for (int i = 0; i < NT; i++) {
        PLN_ASSERT(pln_shard_spec_nbytes(&g_specs[i], &g_nbytes[i]) == 0);
        g_data[i] = malloc(g_nbytes[i]);
        for (uint64_t j = 0; j < g_nbytes[i]; j++) g_data[i][j] = (uint8_t)rnd();
    }
}

static char *write_generic(const char *name) {
    char *p = pln_xasprintf("%s/%s", test_tmpdir(), name);
    pln_shard_writer *w = pln_shard_writer_create(p, "test-v1", 1, 3, g_specs, NT);
    PLN_ASSERT(w);
    for (int i = 0; i < NT; i++) {
        if (i == 2) {   /* a precomputed checksum, written in uneven chunks */
            uint64_t h = pln_xxh3(g_data[i], g_nbytes[i]);
            PLN_ASSERT(pln_shard_writer_begin(w, g_specs[i].name, &h) == 0);
            for (uint64_t o = 0; o < g_nbytes[i]; o += 333) {
                uint64_t k = g_nbytes[i] - o < 333 ? g_nbytes[i] - o : 333;
                PLN_ASSERT(pln_shard_writer_write(w, g_data[i] + o, k) == 0);
            }
            PLN_ASSERT(pln_shard_writer_end(w) == 0);
        } else if (i == 1) {   /* computed checksum, two chunks */
            PLN_ASSERT(pln_shard_writer_begin(w, g_specs[i].name, NULL) == 0);
            PLN_ASSERT(pln_shard_writer_write(w, g_data[i], 5) == 0);
            PLN_ASSERT(pln_shard_writer_write(w, g_data[i] + 5, g_nbytes[i] - 5) == 0);
            PLN_ASSERT(pln_shard_writer_end(w) == 0);
        } else {
            PLN_ASSERT(pln_shard_writer_put(w, g_specs[i].name, g_data[i], g_nbytes[i], NULL) == 0);
        }
    }
    pln_shard_file_info info;
    PLN_ASSERT(pln_shard_writer_finish(w, &info) == 0);
    struct stat st;
    PLN_ASSERT(stat(p, &st) == 0);
    CHECK((uint64_t)st.st_size == info.file_size, "info.file_size %llu vs %lld", (unsigned long long)info.file_size, (long long)st.st_size);
    CHECK(st.st_size % 4096 == 0, "file size %lld not a multiple of 4096", (long long)st.st_size);
    return p;
}

static void test_round_trip(void) {
    char *p = write_generic("generic.pln");
    char *part = pln_xasprintf("%s.part", p);
    CHECK(!file_exists(part), "temporary .part left behind");
    free(part);
    pln_shard *s = pln_shard_open(p);
    CHECK(s, "open: %s", pln_error());
    if (!s) { free(p); return; }
    CHECK(s->n_tensors == NT, "n_tensors %llu", (unsigned long long)s->n_tensors);
    CHECK(s->rank == 1 && s->n_ranks == 3, "rank %u of %u", s->rank, s->n_ranks);
    CHECK(!strcmp(s->layout, "test-v1"), "layout %s", s->layout);
    CHECK(s->version == PLN_SHARD_VERSION && s->alignment == 4096, "version %u alignment %u", s->version, s->alignment);
    CHECK(s->data_offset % 4096 == 0 && s->data_offset >= 128 + NT * 256, "data offset %llu", (unsigned long long)s->data_offset);
    for (int i = 0; i < NT; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        CHECK(!strcmp(t->name, g_specs[i].name), "name %s", t->name);
        CHECK(t->dtype == g_specs[i].dtype && t->ndim == g_specs[i].ndim, "%s dtype/ndim", t->name);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == g_specs[i].shape[d], "%s shape[%d]", t->name, d);
        CHECK(t->offset % 4096 == 0, "%s offset %llu not aligned", t->name, (unsigned long long)t->offset);
        CHECK(t->nbytes == g_nbytes[i], "%s nbytes", t->name);
        CHECK(memcmp(pln_shard_data(s, t), g_data[i], g_nbytes[i]) == 0, "%s data differs", t->name);
        CHECK(t->xxh3 == pln_xxh3(g_data[i], g_nbytes[i]), "%s checksum", t->name);
        CHECK(pln_shard_find(s, t->name) == t, "find %s", t->name);
        if (i) CHECK(t->offset >= s->tensors[i - 1].offset + s->tensors[i - 1].nbytes, "%s overlaps", t->name);
    }
    /* Tensor 0 of 60 bytes then b.f16 (8198 bytes) at the next 4 KiB boundary. */
    CHECK(s->tensors[1].offset == s->tensors[0].offset + 4096, "b offset %llu", (unsigned long long)s->tensors[1].offset);
    CHECK(pln_shard_find(s, "nope") == NULL && strstr(pln_error(), "nope"), "find missing: %s", pln_error());
    CHECK(pln_shard_verify_all(s, NULL) == 0, "verify_all: %s", pln_error());
    pln_shard *m = pln_shard_open_mem(s->map.data, s->map.size, "in-memory");
    CHECK(m && m->n_tensors == NT && pln_shard_data(m, &m->tensors[2]) == pln_shard_data(s, &s->tensors[2]), "open_mem");
    pln_shard_close(m);
    CHECK(!pln_shard_open_mem(s->map.data, s->map.size - 1, "cut") && strstr(pln_error(), "cut: "), "open_mem truncated: %s", pln_error());
    pln_tensor v;
    pln_shard_tensor_view(s, &s->tensors[4], &v);
    CHECK(v.ndim == 3 && v.shape[2] == 4 && v.data == pln_shard_data(s, &s->tensors[4]) && v.file_offset == s->tensors[4].offset,
          "tensor view");
    pln_shard_close(s);
    free(p);
}

static void test_writer_errors(void) {
    char *p = pln_xasprintf("%s/werr.pln", test_tmpdir());
    char *part = pln_xasprintf("%s.part", p);
    pln_shard_writer *w = pln_shard_writer_create(p, "test-v1", 0, 1, g_specs, NT);
    PLN_ASSERT(w);
    CHECK(pln_shard_writer_offset(w, 1) == pln_shard_writer_offset(w, 0) + 4096, "writer offsets");
    CHECK(pln_shard_writer_begin(w, "b.f16", NULL) == -1 && strstr(pln_error(), "a.f32"), "out of order: %s", pln_error());
    CHECK(pln_shard_writer_write(w, "x", 1) == -1, "write outside a tensor");
    PLN_ASSERT(pln_shard_writer_begin(w, "a.f32", NULL) == 0);
    CHECK(pln_shard_writer_write(w, g_data[0], g_nbytes[0] + 1) == -1 && strstr(pln_error(), "a.f32"), "overrun: %s", pln_error());
    PLN_ASSERT(pln_shard_writer_write(w, g_data[0], 10) == 0);
    CHECK(pln_shard_writer_end(w) == -1 && strstr(pln_error(), "10 of its 60"), "short tensor: %s", pln_error());
    CHECK(file_exists(part), ".part exists while writing");
    CHECK(!file_exists(p), "final path absent while writing");
    CHECK(pln_shard_writer_finish(w, NULL) == -1, "finish with missing tensors");
    CHECK(!file_exists(part) && !file_exists(p), "failed finish leaves nothing");

    w = pln_shard_writer_create(p, "test-v1", 0, 1, g_specs, NT);
    PLN_ASSERT(w);
    PLN_ASSERT(pln_shard_writer_put(w, "a.f32", g_data[0], g_nbytes[0], NULL) == 0);
    pln_shard_writer_abort(w);
    CHECK(!file_exists(part) && !file_exists(p), "abort leaves nothing");

    pln_shard_spec dup[2] = {{"x", PLN_DTYPE_F16, 1, {2}}, {"x", PLN_DTYPE_F16, 1, {2}}};
    CHECK(!pln_shard_writer_create(p, "t", 0, 1, dup, 2) && strstr(pln_error(), "twice"), "dup names: %s", pln_error());
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    pln_shard_spec lg = {longname, PLN_DTYPE_F16, 1, {2}};
    CHECK(!pln_shard_writer_create(p, "t", 0, 1, &lg, 1), "long name");
    pln_shard_spec ov = {"big", PLN_DTYPE_F32, 3, {1ll << 40, 1ll << 20, 1ll << 10}};
    CHECK(!pln_shard_writer_create(p, "t", 0, 1, &ov, 1) && strstr(pln_error(), "overflow"), "overflow: %s", pln_error());
    pln_shard_spec ok1 = {"x", PLN_DTYPE_F16, 1, {2}};
    CHECK(!pln_shard_writer_create(p, "t", 2, 2, &ok1, 1), "rank >= n_ranks");
    CHECK(!file_exists(part) && !file_exists(p), "failed creates leave nothing");
    /* An empty file is valid. */
    w = pln_shard_writer_create(p, "t", 0, 1, NULL, 0);
    CHECK(w && pln_shard_writer_finish(w, NULL) == 0, "empty file: %s", pln_error());
    pln_shard *s = pln_shard_open(p);
    CHECK(s && s->n_tensors == 0, "open empty: %s", pln_error());
    pln_shard_close(s);
    free(p);
    free(part);
}

/* ---- O_DIRECT and buffered writes give the same bytes ----------------------------------------
 * Tensors sized to hit every path of the direct writer: whole aligned blocks straight from an
 * aligned buffer, a partial last block, chunks that end mid-block, an unaligned source buffer
 * larger than the 64 KiB staging buffer, tiny tensors and an empty one. */
#define NM 7
static pln_shard_spec g_mspecs[NM] = {
    {"big.f16", PLN_DTYPE_F16, 2, {40, 4096}},       /* 327680 bytes: whole blocks */
    {"tail.f16", PLN_DTYPE_F16, 1, {70001}},         /* 140002 bytes: partial last block */
    {"empty.f32", PLN_DTYPE_F32, 2, {0, 8}},
    {"chunks.i8", PLN_DTYPE_I8, 2, {100, 3000}},     /* written in 7000-byte chunks */
    {"unaligned.f32", PLN_DTYPE_F32, 1, {50000}},    /* from buffer + 3 */
    {"tiny.bf16", PLN_DTYPE_BF16, 1, {3}},
    {"mixed.f16", PLN_DTYPE_F16, 2, {8, 4096}},      /* 12 bytes, then whole blocks, then the rest */
};

/* Writes the NM tensors with the mode PLN_WRITE_DIRECT=mode (NULL: unset). Returns the path, or
 * NULL (error set) when the writer refused; *direct says whether it wrote with O_DIRECT. */
static char *write_mode_file(const char *name, const char *mode, const uint8_t *src, bool *direct) {
    if (mode) setenv("PLN_WRITE_DIRECT", mode, 1); else unsetenv("PLN_WRITE_DIRECT");
    char *p = pln_xasprintf("%s/%s", test_tmpdir(), name);
    pln_shard_writer *w = pln_shard_writer_create(p, "test-v1", 0, 1, g_mspecs, NM);
    unsetenv("PLN_WRITE_DIRECT");
    if (!w) { free(p); return NULL; }
    *direct = pln_shard_writer_direct(w);
    uint64_t off = 0;
    int rc = 0;
#define TRY(x) do { if (!rc && (x)) rc = -1; } while (0)   /* keep the first error */
    for (int i = 0; i < NM && !rc; i++) {
        uint64_t nb = 0;
        PLN_ASSERT(pln_shard_spec_nbytes(&g_mspecs[i], &nb) == 0);
        const uint8_t *d = src + off;   /* off is a multiple of 4096: aligned unless moved below */
        TRY(pln_shard_writer_begin(w, g_mspecs[i].name, NULL));
        if (i == 3) {
            for (uint64_t o = 0; o < nb && !rc; o += 7000) TRY(pln_shard_writer_write(w, d + o, nb - o < 7000 ? nb - o : 7000));
        } else if (i == 4) {
            TRY(pln_shard_writer_write(w, d + 3, nb));
        } else if (i == 6) {
            TRY(pln_shard_writer_write(w, d, 12));
            TRY(pln_shard_writer_write(w, d + 12, 4096 * 2 - 12));
            TRY(pln_shard_writer_write(w, d + 8192, nb - 8192));
        } else {
            TRY(pln_shard_writer_write(w, d, nb));
        }
        TRY(pln_shard_writer_end(w));
        off += pln_align_up(nb + 3, 4096);
    }
#undef TRY
    if (rc) { pln_shard_writer_abort(w); free(p); return NULL; }
    if (pln_shard_writer_finish(w, NULL)) { free(p); return NULL; }
    return p;
}

static void test_write_modes(void) {
    size_t total = 4u << 20;
    uint8_t *src = NULL;
    PLN_ASSERT(posix_memalign((void **)&src, 4096, total) == 0);
    for (size_t i = 0; i < total; i++) src[i] = (uint8_t)rnd();
    bool dir_b = true, dir_d = false, dir_a = false, dir_f = true;
    char *pb = write_mode_file("mode-buffered.pln", "0", src, &dir_b);
    CHECK(pb && !dir_b, "PLN_WRITE_DIRECT=0 writes buffered: %s", pb ? "" : pln_error());
    char *pd = write_mode_file("mode-direct.pln", "1", src, &dir_d);
    if (!pd && strstr(pln_error(), "O_DIRECT")) {
        printf("SKIP: O_DIRECT refused under %s (%s); the auto mode's fallback is still tested\n", test_tmpdir(), pln_error());
    } else {
        CHECK(pd && dir_d, "PLN_WRITE_DIRECT=1 writes with O_DIRECT: %s", pd ? "" : pln_error());
    }
    char *pa = write_mode_file("mode-auto.pln", NULL, src, &dir_a);
    CHECK(pa, "unset PLN_WRITE_DIRECT: %s", pa ? "" : pln_error());
    /* a file system that takes O_DIRECT at open but refuses the writes: the writer falls back */
    setenv("PLN_FAULT_DIRECT_EINVAL", "1", 1);
    char *pf = write_mode_file("mode-fallback.pln", NULL, src, &dir_f);
    CHECK(pf, "fallback to buffered after EINVAL: %s", pf ? "" : pln_error());
    char *pe = write_mode_file("mode-forced.pln", "1", src, &dir_f);
    CHECK(!pe && strstr(pln_error(), "refused an O_DIRECT write") && strstr(pln_error(), "PLN_WRITE_DIRECT"),
          "PLN_WRITE_DIRECT=1 makes a refused write an error: %s", pln_error());
    char *forced_part = pln_xasprintf("%s/mode-forced.pln.part", test_tmpdir());
    CHECK(!file_exists(forced_part), "a refused write leaves no .part");
    free(forced_part);
    free(pe);
    unsetenv("PLN_FAULT_DIRECT_EINVAL");
    setenv("PLN_WRITE_DIRECT", "yes", 1);
    pln_shard_writer *w = pln_shard_writer_create(pb ? pb : "x.pln", "t", 0, 1, g_mspecs, NM);
    unsetenv("PLN_WRITE_DIRECT");
    CHECK(!w && strstr(pln_error(), "PLN_WRITE_DIRECT=yes"), "bad PLN_WRITE_DIRECT named: %s", pln_error());
    pln_shard_writer_abort(w);

    size_t nb = 0, n2 = 0;
    uint8_t *ref = pb ? slurp(pb, &nb) : NULL;
    const char *others[3] = {pd, pa, pf};
    for (int k = 0; k < 3 && ref; k++) {
        if (!others[k]) continue;
        uint8_t *b = slurp(others[k], &n2);
        CHECK(b && n2 == nb && !memcmp(b, ref, nb), "%s differs from the buffered file (%zu vs %zu bytes)", others[k], n2, nb);
        free(b);
    }
    pln_shard *s = pb ? pln_shard_open(pb) : NULL;
    CHECK(s && pln_shard_verify_all(s, NULL) == 0, "buffered file verifies: %s", pln_error());
    if (s) {   /* and holds what was written (tensor 4 came from src + 3) */
        uint64_t off = 0;
        for (int i = 0; i < NM; i++) {
            const pln_shard_tensor *t = &s->tensors[i];
            const uint8_t *want = src + off + (i == 4 ? 3 : 0);
            CHECK(memcmp(pln_shard_data(s, t), want, t->nbytes) == 0, "%s: data differs", t->name);
            off += pln_align_up(t->nbytes + 3, 4096);
        }
        pln_shard_close(s);
    }
    free(ref);
    free(pb); free(pd); free(pa); free(pf);
    free(src);
}

static void test_corruption(void) {
    char *p = write_generic("corrupt.pln");
    size_t n = 0;
    uint8_t *orig = slurp(p, &n);
    uint8_t *b = malloc(n);
    g_len = n;

    /* A flipped data byte: open succeeds (data is not read), verification names the tensor. */
    pln_shard *s0 = pln_shard_open(p);
    PLN_ASSERT(s0);
    uint64_t off = s0->tensors[2].offset + 500;
    pln_shard_close(s0);
    memcpy(b, orig, n);
    b[off] ^= 0x10;
    char *q = pln_xasprintf("%s/flip.pln", test_tmpdir());
    spew(q, b, n);
    pln_shard *s = pln_shard_open(q);
    CHECK(s, "open flipped-data file: %s", pln_error());
    if (s) {
        CHECK(pln_shard_verify_tensor(s, &s->tensors[1]) == 0, "other tensor still verifies");
        CHECK(pln_shard_verify_tensor(s, &s->tensors[2]) == -1, "flip detected");
        CHECK(strstr(pln_error(), "c.i8") && strstr(pln_error(), "checksum mismatch") && strstr(pln_error(), q), "message: %s", pln_error());
        char **bad = NULL;
        CHECK(pln_shard_verify_all(s, &bad) == 1 && bad && !strcmp(bad[0], "c.i8"), "verify_all names c.i8");
        if (bad) { free(bad[0]); free(bad); }
        pln_shard_close(s);
    }
    free(q);

    /* Header bytes: any flip in preamble or table is caught at open. */
    for (size_t i = 0; i < 128 + NT * 256; i += 37) {
        memcpy(b, orig, n);
        b[i] ^= 0x01;
        char what[32];
        snprintf(what, sizeof what, "flip header byte %zu", i);
        expect_bad(b, n, NULL, what);
    }

    /* Truncation at many cut points, and one byte extra. */
    size_t cuts[] = {0, 1, 7, 8, 12, 64, 119, 127, 128, 129, 128 + 256, 128 + NT * 256 - 1, 4095, 4096, 4097, 8191, 8192, n / 2, n - 4096, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "truncated at %zu", cuts[i]);
        expect_bad(orig, cuts[i], NULL, what);
    }
    for (size_t c = 3; c < n; c += 1531) expect_bad(orig, c, NULL, "truncated (sweep)");
    memcpy(b, orig, n);
    uint8_t *longer = calloc(1, n + 1);
    memcpy(longer, orig, n);
    expect_bad(longer, n + 1, "header says", "one byte extra");
    free(longer);

    /* Bad magic / version. */
    memcpy(b, orig, n); b[0] = 'X';
    expect_bad(b, n, "bad magic", "bad magic");
    memcpy(b, orig, n); wr32(b + 8, 2); rehash(b);
    expect_bad(b, n, "version 2", "future version");
    memcpy(b, orig, n); wr32(b + 8, 0); rehash(b);
    expect_bad(b, n, "version 0", "version 0");

    /* Structural defects with valid checksums. */
    uint8_t *t0 = NULL;
#define ENTRY(i) (b + 128 + (i) * 256)
    memcpy(b, orig, n); wr64(ENTRY(1) + 200, rd64(ENTRY(0) + 200)); rehash(b);
    expect_bad(b, n, "overlaps", "overlapping offsets");
    memcpy(b, orig, n); wr64(ENTRY(3) + 200, rd64(ENTRY(2) + 200) + 4096); rehash(b);
    expect_bad(b, n, "overlaps", "overlap inside the previous tensor");
    memcpy(b, orig, n); wr64(ENTRY(1) + 200, rd64(ENTRY(1) + 200) + 8); rehash(b);
    expect_bad(b, n, "not aligned", "misaligned offset");
    memcpy(b, orig, n); wr64(ENTRY(5) + 200, n); rehash(b);
    expect_bad(b, n, "past the end", "offset at end of file");
    memcpy(b, orig, n); wr64(ENTRY(5) + 200, UINT64_MAX - 4095); rehash(b);
    expect_bad(b, n, "past the end", "offset wraps");
    memcpy(b, orig, n); wr64(ENTRY(0) + 200, 0); rehash(b);
    expect_bad(b, n, "before the data region", "offset inside header");
    memcpy(b, orig, n); memcpy(ENTRY(3), "c.i8\0", 5); memset(ENTRY(3) + 5, 0, 123); rehash(b);
    expect_bad(b, n, "appears twice", "duplicate names");
    memcpy(b, orig, n); wr64(b + 32, 1ull << 60); rehash(b);
    expect_bad(b, n, "tensor count", "count overflow");
    memcpy(b, orig, n); wr64(b + 32, 4000); wr64(b + 48, 4000 * 256); rehash(b);
    expect_bad(b, n, NULL, "count past file size");
    memcpy(b, orig, n); wr64(b + 32, NT + 1); rehash(b);
    expect_bad(b, n, "table size", "count vs table size");
    memcpy(b, orig, n); wr64(ENTRY(0) + 136, 1ull << 62); wr64(ENTRY(0) + 144, 1ull << 62); rehash(b);
    expect_bad(b, n, "overflow", "shape overflow");
    memcpy(b, orig, n); wr64(ENTRY(0) + 136, 1ull << 63); rehash(b);
    expect_bad(b, n, "dimension", "negative dimension");
    memcpy(b, orig, n); wr64(ENTRY(0) + 136, 4); rehash(b);
    expect_bad(b, n, "shape x dtype size", "shape/bytes mismatch");
    memcpy(b, orig, n); wr32(ENTRY(0) + 128, 99); rehash(b);
    expect_bad(b, n, "unknown dtype", "unknown dtype");
    memcpy(b, orig, n); wr32(ENTRY(0) + 132, 0); rehash(b);
    expect_bad(b, n, "ndim", "ndim 0");
    memcpy(b, orig, n); wr32(ENTRY(0) + 132, 9); rehash(b);
    expect_bad(b, n, "ndim", "ndim 9");
    memcpy(b, orig, n); memset(ENTRY(0), 'a', 128); rehash(b);
    expect_bad(b, n, "NUL", "unterminated name");
    memcpy(b, orig, n); ENTRY(0)[0] = 0; rehash(b);
    expect_bad(b, n, "empty", "empty name");
    memcpy(b, orig, n); ENTRY(0)[1] = '\n'; rehash(b);
    expect_bad(b, n, "non-printable", "control character in name");
    memcpy(b, orig, n); ENTRY(0)[240] = 1; rehash(b);
    expect_bad(b, n, "reserved", "reserved entry bytes");
    memcpy(b, orig, n); wr32(b + 28, 1); rehash(b);
    expect_bad(b, n, "flags", "unknown flags");
    memcpy(b, orig, n); wr32(b + 16, 4095); rehash(b);
    expect_bad(b, n, "alignment", "bad alignment");
    memcpy(b, orig, n); wr32(b + 20, 3); rehash(b);
    expect_bad(b, n, "rank", "rank >= n_ranks");
    memcpy(b, orig, n); wr64(b + 64, rd64(b + 64) - 4096); rehash(b);
    expect_bad(b, n, "data region", "data size short");
    memcpy(b, orig, n); wr64(b + 56, 128); rehash(b);
    expect_bad(b, n, "data offset", "unaligned data offset");
    memcpy(b, orig, n); memset(b + 80, 0, 32); rehash(b);
    expect_bad(b, n, "layout", "empty layout");
    (void)t0;
#undef ENTRY
    free(b);
    free(orig);
    free(p);
}

/* ---- bloom-tp-v1 sample sets --------------------------------------------------------------- */
static pln_bloom_config sample_config(void) {
    pln_bloom_config c = {.vocab_size = 1003, .hidden_size = 64, .n_head = 4, .n_layer = 2, .layer_norm_epsilon = 1e-5,
                          .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 3};
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "float16");
    return c;
}

/* Fills one tensor of the sample set: F16 values in [-1, 1) (LayerNorm weights near 1), I8 in
 * [-127, 127], scales positive. Pad rows of the embedding are zero, as the converter writes them. */
static void sample_fill(const pln_shard_spec *sp, uint8_t *buf, uint64_t nbytes, int64_t vocab_rows_valid) {
    uint64_t n = nbytes / pln_dtype_size(sp->dtype);
    bool scale = strstr(sp->name, "_scale") != NULL;
    bool lnw = strstr(sp->name, "layernorm.weight") || !strcmp(sp->name, "ln_f.weight");
    for (uint64_t i = 0; i < n; i++) {
        if (sp->dtype == PLN_DTYPE_I8) ((int8_t *)buf)[i] = (int8_t)((int)(rnd() % 255) - 127);
        else {
            float v = scale ? 0.001f + 0.01f * (rndf() + 1.0f) : lnw ? 1.0f + 0.1f * rndf() : 0.5f * rndf();
            ((uint16_t *)buf)[i] = pln_f32_to_f16(v);
        }
    }
    if (!strncmp(sp->name, "word_embeddings.weight", 22) && vocab_rows_valid < sp->shape[0]) {
        uint64_t row = nbytes / (uint64_t)sp->shape[0];
        memset(buf + (uint64_t)vocab_rows_valid * row, 0, (uint64_t)(sp->shape[0] - vocab_rows_valid) * row);
    }
}

static int write_sample_set(const char *dir, int32_t tp, bool int8, int64_t group, bool qemb, bool force) {
    pln_bloom_config cfg = sample_config();
    int64_t vp = pln_vocab_padded(cfg.vocab_size, tp);
    pln_layout_params lp = {&cfg, tp, int8, group, qemb, vp, false};
    char *tmp = pln_outdir_begin(dir, force);
    if (!tmp) return -1;
    pln_manifest_file *files = pln_xcalloc((size_t)tp, sizeof *files);
    int rc = -1;
    g_rng = 12345;
    for (int32_t r = 0; r < tp; r++) {
        size_t n;
        pln_shard_spec *specs = pln_layout_bloom_tp_v1(&lp, r, &n);
        if (!specs) goto out;
        pln_shard_file_name((uint32_t)r, (uint32_t)tp, files[r].name, sizeof files[r].name);
        char *path = pln_xasprintf("%s/%s", tmp, files[r].name);
        pln_shard_writer *w = pln_shard_writer_create(path, PLN_LAYOUT_BLOOM_TP_V1, (uint32_t)r, (uint32_t)tp, specs, n);
        free(path);
        if (!w) { pln_layout_free(specs, n); goto out; }
        int64_t vr = vp / tp, valid = cfg.vocab_size - (int64_t)r * vr;
        for (size_t i = 0; i < n; i++) {
            uint64_t nb = pln_shard_writer_nbytes(w, i);
            uint8_t *buf = pln_xmalloc(nb);
            sample_fill(&specs[i], buf, nb, valid < vr ? valid : vr);
            int e = pln_shard_writer_put(w, specs[i].name, buf, nb, NULL);
            free(buf);
            if (e) { pln_shard_writer_abort(w); pln_layout_free(specs, n); goto out; }
        }
        pln_layout_free(specs, n);
        pln_shard_file_info info;
        if (pln_shard_writer_finish(w, &info)) goto out;
        files[r].size = info.file_size;
        files[r].xxh3 = info.header_xxh3;
    }
    char *cj = pln_xasprintf("%s/config.json", tmp);
    char *ctext = pln_xasprintf("{\n  \"architectures\": [\"BloomForCausalLM\"],\n  \"model_type\": \"bloom\",\n  \"vocab_size\": %lld,\n"
                                "  \"hidden_size\": %lld,\n  \"n_head\": %lld,\n  \"n_layer\": %lld,\n  \"layer_norm_epsilon\": 1e-05,\n"
                                "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 3,\n  \"torch_dtype\": \"float16\"\n}\n",
                                (long long)cfg.vocab_size, (long long)cfg.hidden_size, (long long)cfg.n_head, (long long)cfg.n_layer);
    int e = pln_write_file_atomic(cj, ctext, strlen(ctext));
    free(cj);
    free(ctext);
    if (e) goto out;
    bool have_tok = file_exists("tests/fixtures/tokenizer/tokenizer.json");
    if (have_tok) {
        char *tj = pln_xasprintf("%s/tokenizer.json", tmp);
        e = pln_copy_file("tests/fixtures/tokenizer/tokenizer.json", tj);
        free(tj);
        if (e) goto out;
    }
    json_t *extra = json_pack("{s:{s:s,s:s}}", "source", "path", "test_shard --write-sample", "format", "random");
    pln_manifest m = {cfg, tp, int8 ? "int8" : "fp16", group, qemb, vp, PLN_LAYOUT_BLOOM_TP_V1, files,
                      have_tok ? "tokenizer.json" : NULL, "config.json", extra, NULL, NULL};
    e = pln_manifest_write(tmp, &m);
    json_decref(extra);
    if (e) goto out;
    if (pln_outdir_commit(tmp, dir)) goto out;
    rc = 0;
out:
    if (rc) pln_outdir_abort(tmp);
    free(tmp);
    free(files);
    return rc;
}

static void test_layout(void) {
    pln_bloom_config c = sample_config();
    pln_layout_params lp = {&c, 2, false, 0, false, pln_vocab_padded(c.vocab_size, 2), false};
    CHECK(lp.vocab_padded == 1004 && pln_vocab_padded(1003, 3) == 1005 && pln_vocab_padded(1003, 1) == 1003, "vocab padding");
    size_t n;
    pln_shard_spec *s = pln_layout_bloom_tp_v1(&lp, 1, &n);
    CHECK(s && n == 3 + 2 * 12 + 2, "fp16 count %zu", n);
    if (s) {
        CHECK(!strcmp(s[0].name, "word_embeddings.weight") && s[0].shape[0] == 502 && s[0].shape[1] == 64 && s[0].dtype == PLN_DTYPE_F16, "emb");
        CHECK(!strcmp(s[5].name, "h.0.self_attention.query_key_value.weight") && s[5].shape[0] == 96 && s[5].shape[1] == 64, "qkv %s", s[5].name);
        CHECK(!strcmp(s[7].name, "h.0.self_attention.dense.weight") && s[7].shape[0] == 64 && s[7].shape[1] == 32, "dense");
        CHECK(!strcmp(s[11].name, "h.0.mlp.dense_h_to_4h.weight") && s[11].shape[0] == 128 && s[11].shape[1] == 64, "h_to_4h");
        CHECK(!strcmp(s[13].name, "h.0.mlp.dense_4h_to_h.weight") && s[13].shape[0] == 64 && s[13].shape[1] == 128, "4h_to_h");
        CHECK(!strcmp(s[n - 1].name, "ln_f.bias"), "last %s", s[n - 1].name);
        pln_layout_free(s, n);
    }
    lp.int8 = true;
    lp.group_size = 16;
    lp.quantize_embedding = true;
    s = pln_layout_bloom_tp_v1(&lp, 0, &n);
    CHECK(s && n == 4 + 2 * 16 + 2, "int8 count %zu", n);
    if (s) {
        CHECK(s[0].dtype == PLN_DTYPE_I8 && !strcmp(s[1].name, "word_embeddings.weight_scale") && s[1].shape[1] == 4, "emb scale");
        CHECK(!strcmp(s[7].name, "h.0.self_attention.query_key_value.weight_scale") && s[7].shape[0] == 96 && s[7].shape[1] == 4, "qkv scale %s", s[7].name);
        CHECK(!strcmp(s[10].name, "h.0.self_attention.dense.weight_scale") && s[10].shape[1] == 2, "dense scale %s", s[10].name);
        pln_layout_free(s, n);
    }
    lp.group_size = 0;
    s = pln_layout_bloom_tp_v1(&lp, 0, &n);
    CHECK(s && s[1].shape[1] == 1, "per-channel scale has one column");
    pln_layout_free(s, n);
    lp.group_size = 48;
    CHECK(!pln_layout_bloom_tp_v1(&lp, 0, &n) && strstr(pln_error(), "group size 48"), "bad group: %s", pln_error());
    lp.group_size = 0;
    lp.tp = 3;
    lp.vocab_padded = 1005;
    CHECK(!pln_layout_bloom_tp_v1(&lp, 0, &n) && strstr(pln_error(), "n_head 4"), "tp 3 on 4 heads: %s", pln_error());
}

static void rewrite_manifest(const char *dir, const char *key, json_t *val) {
    char *p = pln_xasprintf("%s/manifest.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    PLN_ASSERT(j);
    json_object_set_new(j, key, val);
    PLN_ASSERT(json_dump_file(j, p, JSON_INDENT(1)) == 0);
    json_decref(j);
    free(p);
}

static char *copy_set(const char *src, const char *name) {
    char *d = pln_xasprintf("%s/%s", test_tmpdir(), name);
    char *cmd = pln_xasprintf("rm -rf '%s' && cp -r '%s' '%s'", d, src, d);
    PLN_ASSERT(system(cmd) == 0);
    free(cmd);
    return d;
}

static void test_shardset(void) {
    char *dir = pln_xasprintf("%s/set-int8", test_tmpdir());
    CHECK(write_sample_set(dir, 2, true, 0, false, false) == 0, "write sample: %s", pln_error());
    CHECK(write_sample_set(dir, 2, true, 0, false, false) == -1 && strstr(pln_error(), "--force"), "refuses to overwrite: %s", pln_error());
    pln_shardset *set = pln_shardset_open(dir);
    CHECK(set, "shardset_open: %s", pln_error());
    if (!set) return;
    CHECK(set->tp == 2 && !strcmp(set->dtype, "int8") && set->group_size == 0 && !set->quantize_embedding, "set fields");
    CHECK(set->vocab_padded == 1004 && set->config.vocab_size == 1003 && set->config.hidden_size == 64 &&
          set->config.n_head == 4 && set->config.n_layer == 2 && set->config.eos_token_id == 2, "config");
    CHECK_CLOSE(set->config.layer_norm_epsilon, 1e-5, 0, "layer_norm_epsilon");
    CHECK(!strcmp(set->config.torch_dtype, "float16"), "torch_dtype %s", set->config.torch_dtype);
    CHECK(set->config_path && strstr(set->config_path, "config.json"), "config path");
    json_t *src = json_object_get(set->json, "source");
    CHECK(json_is_object(src) && !strcmp(json_string_value(json_object_get(src, "format")), "random"), "extra fields kept");
    for (int r = 0; r < 2; r++) {
        pln_shard *s = pln_shardset_open_rank(set, r);
        CHECK(s, "open rank %d: %s", r, pln_error());
        if (!s) continue;
        CHECK(s->rank == (uint32_t)r && s->n_tensors == 37, "rank %d tensors %llu", r, (unsigned long long)s->n_tensors);
        CHECK(pln_shard_verify_all(s, NULL) == 0, "verify rank %d", r);
        const pln_shard_tensor *e = pln_shard_find(s, "word_embeddings.weight");
        CHECK(e && e->shape[0] == 502, "embedding rows");
        if (e && r == 1) {   /* rank 1 holds rows 502..1003; row 1003 (local 501) is padding */
            const uint16_t *d = pln_shard_data(s, e);
            bool zero = true;
            for (int k = 0; k < 64; k++) zero &= d[501 * 64 + k] == 0;
            CHECK(zero, "pad row is zero");
        }
        pln_shard_close(s);
    }
    CHECK(!pln_shardset_open_rank(set, 2) && strstr(pln_error(), "tp 2"), "rank 2 of 2: %s", pln_error());
    pln_shardset_close(set);

    /* A rank file from another set (other rank count) in its place. */
    char *fp16 = pln_xasprintf("%s/set-fp16", test_tmpdir());
    CHECK(write_sample_set(fp16, 1, false, 0, false, false) == 0, "write fp16 tp1: %s", pln_error());
    set = pln_shardset_open(fp16);
    CHECK(set && set->tp == 1 && !strcmp(set->dtype, "fp16") && set->vocab_padded == 1003, "fp16 set");
    pln_shard *s1 = set ? pln_shardset_open_rank(set, 0) : NULL;
    CHECK(s1 && s1->n_tensors == 29, "fp16 rank 0");
    pln_shard_close(s1);
    pln_shardset_close(set);

    /* Hostile manifests and sets: each a clear error naming the file. */
    char *d = copy_set(dir, "m1");
    rewrite_manifest(d, "tp", json_integer(3));
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "2 rank files listed but tp is 3"), "tp mismatch: %s", pln_error());
    free(d);
    d = copy_set(dir, "m2");
    rewrite_manifest(d, "layout", json_string("bloom-tp-v9"));
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "bloom-tp-v9") && strstr(pln_error(), "not known"), "layout: %s", pln_error());
    free(d);
    d = copy_set(dir, "m3");
    rewrite_manifest(d, "version", json_integer(7));
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "version 7"), "version: %s", pln_error());
    free(d);
    d = copy_set(dir, "m4");
    char *rf = pln_xasprintf("%s/rank-1-of-2.pln", d);
    PLN_ASSERT(truncate(rf, 4096) == 0);
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), rf) && strstr(pln_error(), "differs from the manifest"), "size: %s", pln_error());
    unlink(rf);
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), rf) && strstr(pln_error(), "missing"), "missing: %s", pln_error());
    free(rf);
    free(d);
    d = copy_set(dir, "m5");
    char *mp = pln_xasprintf("%s/manifest.json", d);
    spew(mp, "{\"format\": ", 11);
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "invalid JSON") && strstr(pln_error(), mp), "not JSON: %s", pln_error());
    unlink(mp);
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "not a pollen shard set"), "no manifest: %s", pln_error());
    free(mp);
    free(d);
    d = copy_set(dir, "m6");
    rewrite_manifest(d, "dtype", json_string("fp16"));   /* rank files hold int8: caught at open_rank */
    set = pln_shardset_open(d);
    CHECK(set, "dtype-swapped manifest parses");
    if (set) {
        CHECK(!pln_shardset_open_rank(set, 0) && strstr(pln_error(), "expects") && strstr(pln_error(), "rank-0-of-2.pln"), "layout check: %s", pln_error());
        pln_shardset_close(set);
    }
    free(d);
    d = copy_set(dir, "m7");
    json_t *files = json_pack("[{s:s,s:i,s:i,s:s},{s:s,s:i,s:i,s:s}]", "name", "../../etc/passwd", "rank", 0, "size", 1, "xxh3", "0000000000000000",
                              "name", "rank-1-of-2.pln", "rank", 1, "size", 1, "xxh3", "0000000000000000");
    rewrite_manifest(d, "files", files);
    CHECK(!pln_shardset_open(d) && strstr(pln_error(), "expected \"rank-0-of-2.pln\""), "path traversal: %s", pln_error());
    free(d);
    d = copy_set(dir, "m8");   /* rank file swapped with one of another conversion */
    char *a = pln_xasprintf("%s/rank-0-of-2.pln", d);
    char *b2 = pln_xasprintf("%s/rank-0-of-1.pln", fp16);
    char *cmd = pln_xasprintf("cp '%s' '%s'", b2, a);
    PLN_ASSERT(system(cmd) == 0);
    set = pln_shardset_open(d);
    CHECK(!set && strstr(pln_error(), a), "swapped file (size differs): %s", pln_error());
    pln_shardset_close(set);
    free(cmd); free(a); free(b2); free(d);

    /* Manifest writer refuses colliding extras and bad names. */
    pln_manifest_file f = {"rank-0-of-1.pln", 4096, 1};
    json_t *extra = json_pack("{s:i}", "tp", 5);
    pln_manifest m = {sample_config(), 1, "fp16", 0, false, 1003, PLN_LAYOUT_BLOOM_TP_V1, &f, NULL, NULL, extra, NULL, NULL};
    CHECK(pln_manifest_write(test_tmpdir(), &m) == -1 && strstr(pln_error(), "collides"), "colliding extra: %s", pln_error());
    json_decref(extra);
    m.extra = NULL;
    snprintf(f.name, sizeof f.name, "x.pln");
    CHECK(pln_manifest_write(test_tmpdir(), &m) == -1 && strstr(pln_error(), "expected"), "bad file name: %s", pln_error());
    free(fp16);
    free(dir);
}

/* ---- integrity of everything in a set (docs/FORMAT.md "Checksums of the small files") ----- */

/* Opens d and expects failure with every fragment in the message (NULL-terminated list). */
static void expect_set_fails(const char *d, const char *what, const char *frag1, const char *frag2) {
    pln_shardset *set = pln_shardset_open(d);
    CHECK(!set && strstr(pln_error(), frag1) && (!frag2 || strstr(pln_error(), frag2)), "%s: %s", what, set ? "accepted" : pln_error());
    pln_shardset_close(set);
}

/* Records the XXH3 of DIR/name as the manifest's key. */
static void resum(const char *d, const char *name, const char *key) {
    char *p = pln_xasprintf("%s/%s", d, name);
    size_t n;
    uint8_t *b = slurp(p, &n);
    PLN_ASSERT(b);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)pln_xxh3(b, n));
    rewrite_manifest(d, key, json_string(hex));
    free(b);
    free(p);
}

static void rewrite_config(const char *d, const char *key, json_t *val) {
    char *p = pln_xasprintf("%s/manifest.json", d);
    json_t *j = json_load_file(p, 0, NULL);
    PLN_ASSERT(j);
    json_object_set_new(json_object_get(j, "config"), key, val);
    PLN_ASSERT(json_dump_file(j, p, JSON_INDENT(1)) == 0);
    json_decref(j);
    free(p);
}

static void test_small_files(void) {
    /* the canonical text is part of the format: pin it */
    pln_bloom_config c = sample_config();
    char buf[512];
    int n = pln_config_canonical(&c, buf, sizeof buf);
    const char *want = "vocab_size=1003\nhidden_size=64\nn_head=4\nn_layer=2\nlayer_norm_epsilon=3ee4f8b588e368f1\n"
                       "bos_token_id=1\neos_token_id=2\npad_token_id=3\ntorch_dtype=float16\n";
    CHECK(n == (int)strlen(want) && !strcmp(buf, want), "canonical config text:\n%s", buf);
    CHECK(pln_config_canonical(&c, buf, 20) == -1, "short buffer refused");
    uint64_t h = pln_config_xxh3(&c);
    c.n_head = 2;
    CHECK(pln_config_xxh3(&c) != h, "n_head changes config_xxh3");

    char *dir = pln_xasprintf("%s/set-small", test_tmpdir());
    PLN_ASSERT(write_sample_set(dir, 2, false, 0, false, false) == 0);
    pln_shardset *set = pln_shardset_open(dir);
    CHECK(set && set->version == 2 && set->small_files_checked, "a written set is version 2, small files checked");
    if (set) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)pln_config_xxh3(&set->config));
        CHECK(!strcmp(json_string_value(json_object_get(set->json, "config_xxh3")), hex), "config_xxh3 recorded");
        CHECK(json_is_string(json_object_get(set->json, "hf_config_xxh3")), "hf_config_xxh3 recorded");
        CHECK(set->tokenizer_path && strstr(set->tokenizer_path, "/tokenizer.json"), "tokenizer path");
    }
    pln_shardset_close(set);

    char *d = copy_set(dir, "i1");
    rewrite_config(d, "n_head", json_integer(2));
    expect_set_fails(d, "manifest n_head edited", "config.json: n_head is 4", "config.n_head 2");
    free(d);
    d = copy_set(dir, "i2");   /* no config.json to compare with: the block checksum still catches it */
    rewrite_config(d, "n_head", json_integer(2));
    rewrite_manifest(d, "hf_config", json_null());
    rewrite_manifest(d, "hf_config_xxh3", json_null());
    expect_set_fails(d, "n_head edited, no config.json", "config block: checksum mismatch", "config_xxh3");
    free(d);
    d = copy_set(dir, "i3");
    char *cj = pln_xasprintf("%s/config.json", d);
    spew(cj, "{garbage", 8);
    expect_set_fails(d, "garbage config.json", "config.json: checksum mismatch", "hf_config_xxh3");
    resum(d, "config.json", "hf_config_xxh3");
    expect_set_fails(d, "garbage config.json, checksum recomputed", "config.json: not valid JSON", NULL);
    const char *other = "{\"model_type\": \"bloom\", \"vocab_size\": 1003, \"hidden_size\": 64, \"n_head\": 4, \"n_layer\": 3}";
    spew(cj, other, strlen(other));
    resum(d, "config.json", "hf_config_xxh3");
    expect_set_fails(d, "config.json with another n_layer", "n_layer is 3", "config.n_layer 2");
    unlink(cj);
    expect_set_fails(d, "config.json missing", "config.json: missing", "\"hf_config\"");
    free(cj);
    free(d);

    d = copy_set(dir, "i4");
    char *tj = pln_xasprintf("%s/tokenizer.json", d);
    if (file_exists(tj)) {
        FILE *f = fopen(tj, "ab");
        fputc(' ', f);
        fclose(f);
        expect_set_fails(d, "tokenizer edited", "tokenizer.json: checksum mismatch", "tokenizer_xxh3");
        /* a symlink out of the set, even to identical bytes, is refused; one inside is fine */
        char *out = pln_xasprintf("%s/outside.json", test_tmpdir());
        char *cmd = pln_xasprintf("cp '%s/tokenizer.json' '%s' && rm '%s' && ln -s '%s' '%s'", dir, out, tj, out, tj);
        PLN_ASSERT(system(cmd) == 0);
        expect_set_fails(d, "tokenizer symlinked out", "leads out of the set directory", "\"tokenizer\"");
        free(cmd);
        cmd = pln_xasprintf("rm '%s' && mkdir '%s/in' && cp '%s' '%s/in/t.json' && ln -s in/t.json '%s'", tj, d, out, d, tj);
        PLN_ASSERT(system(cmd) == 0);
        set = pln_shardset_open(d);
        CHECK(set, "tokenizer symlinked inside the set: %s", pln_error());
        pln_shardset_close(set);
        free(cmd);
        free(out);
        rewrite_manifest(d, "tokenizer", json_string("../set-small/tokenizer.json"));
        expect_set_fails(d, "tokenizer with ..", "\"tokenizer\" must be a plain file name", NULL);
        rewrite_manifest(d, "tokenizer", json_string("/etc/passwd"));
        expect_set_fails(d, "absolute tokenizer", "\"tokenizer\" must be a plain file name", NULL);
        rewrite_manifest(d, "tokenizer", json_string("nope.json"));
        expect_set_fails(d, "tokenizer missing", "nope.json: missing", NULL);
        rewrite_manifest(d, "tokenizer", json_null());
        expect_set_fails(d, "tokenizer_xxh3 without tokenizer", "\"tokenizer_xxh3\" must be null", NULL);
        rewrite_manifest(d, "tokenizer_xxh3", json_null());
        set = pln_shardset_open(d);
        CHECK(set && !set->tokenizer_path, "no tokenizer: accepted, no path");
        pln_shardset_close(set);
    } else {
        printf("  SKIP tokenizer checks (no fixture tokenizer)\n");
    }
    free(tj);
    free(d);

    /* field rules */
    struct { const char *key; json_t *val; bool config; const char *frag; } rules[] = {
        {"group_size", json_integer(4), false, "\"group_size\" must be 0"},
        {"quantize_embedding", json_true(), false, "\"quantize_embedding\" must be false"},
        {"eos_token_id", json_integer(5), true, "eos_token_id"},
        {"pad_token_id", json_integer(5000), true, "pad_token_id"},
        {"torch_dtype", json_integer(7), true, "torch_dtype"},
        {"config_xxh3", json_string("xyz"), false, "\"config_xxh3\" is missing or not 16"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        d = copy_set(dir, "i5");
        if (rules[i].config) rewrite_config(d, rules[i].key, rules[i].val);
        else rewrite_manifest(d, rules[i].key, rules[i].val);
        expect_set_fails(d, rules[i].key, rules[i].frag, NULL);
        free(d);
    }

    /* version 1 (no checksums) still opens; its config.json must still agree */
    d = copy_set(dir, "i6");
    rewrite_manifest(d, "version", json_integer(1));
    char *mp = pln_xasprintf("%s/manifest.json", d);
    json_t *j = json_load_file(mp, 0, NULL);
    json_object_del(j, "config_xxh3");
    json_object_del(j, "tokenizer_xxh3");
    json_object_del(j, "hf_config_xxh3");
    PLN_ASSERT(json_dump_file(j, mp, JSON_INDENT(1)) == 0);
    json_decref(j);
    set = pln_shardset_open(d);
    CHECK(set && set->version == 1 && !set->small_files_checked, "version 1 opens: %s", set ? "" : pln_error());
    pln_shardset_close(set);
    rewrite_config(d, "n_head", json_integer(2));
    expect_set_fails(d, "version 1, n_head edited", "n_head is 4", NULL);
    rewrite_manifest(d, "version", json_integer(3));
    expect_set_fails(d, "version 3", "versions 1 to 2", NULL);
    free(mp);
    free(d);
    free(dir);
}

/* Scales and padding on in-memory copies of a sample int8 rank file (open_mem checks neither). */
static void test_scales_padding(void) {
    char *dir = pln_xasprintf("%s/set-sp", test_tmpdir());
    PLN_ASSERT(write_sample_set(dir, 1, true, 16, false, false) == 0);
    char *rf = pln_xasprintf("%s/rank-0-of-1.pln", dir);
    size_t n;
    uint8_t *orig = slurp(rf, &n), *b = pln_xmalloc(n);
    PLN_ASSERT(orig);
    pln_shard *s = pln_shard_open_mem(orig, n, "sp.pln");
    PLN_ASSERT(s);
    CHECK(pln_layout_check_scales(s) == 0, "sample scales are valid: %s", pln_error());
    CHECK(pln_shard_check_padding(s) == 0, "sample padding is zero: %s", pln_error());
    const pln_shard_tensor *t = pln_shard_find(s, "h.1.mlp.dense_h_to_4h.weight_scale");
    PLN_ASSERT(t && t->ndim == 2 && t->shape[1] == 4);
    uint64_t at = t->offset + 2 * (3 * 4 + 2);   /* element [3, 2] */
    struct { uint16_t bits; const char *what; } cases[] = {
        {0x7e00, "NaN"}, {0x7c00, "infinite"}, {0xfc00, "infinite"}, {0x0000, "zero"}, {0x8000, "zero"},
        {0xbc00, "negative"}, {0x8001, "negative"}, {0x0001, NULL}, {0x7bff, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(b, orig, n);
        b[at] = (uint8_t)cases[i].bits;
        b[at + 1] = (uint8_t)(cases[i].bits >> 8);
        pln_shard *m = pln_shard_open_mem(b, n, "sp.pln");
        PLN_ASSERT(m);
        int rc = pln_layout_check_scales(m);
        if (cases[i].what)
            CHECK(rc == -1 && strstr(pln_error(), "sp.pln: tensor \"h.1.mlp.dense_h_to_4h.weight_scale\": scale [3, 2] is") &&
                  strstr(pln_error(), cases[i].what), "scale 0x%04x: %s", cases[i].bits, pln_error());
        else
            CHECK(rc == 0, "scale 0x%04x (finite, positive) accepted: %s", cases[i].bits, pln_error());
        pln_shard_close(m);
    }
    /* one non-zero byte in each kind of padding */
    const pln_shard_tensor *t0 = &s->tensors[0], *t1 = &s->tensors[1];
    uint64_t where[3] = {s->data_offset - 1, t0->offset + t0->nbytes, n - 1};
    const char *after[3] = {"after the tensor table", "after tensor \"word_embeddings.weight\"", "after tensor \"ln_f.bias\""};
    PLN_ASSERT(t1->offset > t0->offset + t0->nbytes);   /* the embedding's end is not aligned */
    for (int i = 0; i < 3; i++) {
        memcpy(b, orig, n);
        b[where[i]] = 0x80;
        pln_shard *m = pln_shard_open_mem(b, n, "sp.pln");
        PLN_ASSERT(m);
        char off[32];
        snprintf(off, sizeof off, "offset %llu", (unsigned long long)where[i]);
        CHECK(pln_shard_check_padding(m) == -1 && strstr(pln_error(), off) && strstr(pln_error(), after[i]) &&
              strstr(pln_error(), "0x80"), "padding byte %d: %s", i, pln_error());
        pln_shard_close(m);
    }
    pln_shard_close(s);
    free(b);
    free(orig);
    free(rf);
    free(dir);
}

/* A rank file with known statistics for `pollen inspect --stats` (layout "test-v1"):
 *   f32 [2, 4] = 1 -2 NaN Inf -Inf 0.5 3 -4
 *   q   I8 [2, 4] = 1 2 -3 4 / 127 -127 0 5 with q_scale F16 [2, 2] = 0.5 0.25 / 0.125 2 (group 2)
 * (dequantized: 0.5 1 -0.75 1 / 15.875 -15.875 0 10). */
static int write_special(const char *path) {
    pln_shard_spec sp[3] = {{"f32", PLN_DTYPE_F32, 2, {2, 4}}, {"q", PLN_DTYPE_I8, 2, {2, 4}}, {"q_scale", PLN_DTYPE_F16, 2, {2, 2}}};
    float f[8] = {1, -2, NAN, INFINITY, -INFINITY, 0.5f, 3, -4};
    int8_t q[8] = {1, 2, -3, 4, 127, -127, 0, 5};
    float sc[4] = {0.5f, 0.25f, 0.125f, 2.0f};
    uint16_t sh[4];
    for (int i = 0; i < 4; i++) sh[i] = pln_f32_to_f16(sc[i]);
    pln_shard_writer *w = pln_shard_writer_create(path, "test-v1", 0, 1, sp, 3);
    if (!w || pln_shard_writer_put(w, "f32", f, sizeof f, NULL) || pln_shard_writer_put(w, "q", q, sizeof q, NULL) ||
        pln_shard_writer_put(w, "q_scale", sh, sizeof sh, NULL)) {
        pln_shard_writer_abort(w);
        return -1;
    }
    return pln_shard_writer_finish(w, NULL);
}

/* A rank file declaring one F16 tensor of 2^35 elements (64 GiB), stored sparse: proves that
 * listing reads only the header. The data checksum is that of a small tensor, so verification
 * would fail; nothing reads that far. */
static int write_sparse(const char *path) {
    pln_shard_spec sp = {"huge", PLN_DTYPE_F16, 2, {4, 1024}};
    uint16_t z[4096] = {0};
    pln_shard_writer *w = pln_shard_writer_create(path, "test-v1", 0, 1, &sp, 1);
    if (!w || pln_shard_writer_put(w, "huge", z, sizeof z, NULL) || pln_shard_writer_finish(w, NULL)) {
        pln_shard_writer_abort(w);
        return -1;
    }
    size_t n = 0;
    uint8_t *b = slurp(path, &n);
    uint64_t rows = 1ull << 25, bytes = rows * 1024 * 2, doff = rd64(b + 56), size = doff + bytes;
    wr64(b + 128 + 136, rows);
    wr64(b + 128 + 208, bytes);
    wr64(b + 64, bytes);
    wr64(b + 72, size);
    g_len = n;
    rehash(b);
    spew(path, b, n);
    free(b);
    return truncate(path, (off_t)size) ? pln_errorf("%s: cannot extend: %s", path, strerror(errno)) : 0;
}


/* Writer and verifier throughput on a 1 GiB rank file (8 F16 tensors of 128 MiB). */
static int bench(const char *path) {
    enum { NB = 8 };
    const int64_t rows = 8192, cols = 8192;
    pln_shard_spec sp[NB];
    char names[NB][32];
    for (int i = 0; i < NB; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        sp[i] = (pln_shard_spec){names[i], PLN_DTYPE_F16, 2, {rows, cols}};
    }
    size_t chunk = 8u << 20;
    uint8_t *buf = malloc(chunk);
    for (size_t i = 0; i < chunk; i++) buf[i] = (uint8_t)rnd();
    double t0 = pln_now();
    pln_shard_writer *w = pln_shard_writer_create(path, "bench", 0, 1, sp, NB);
    if (!w) return -1;
    for (int i = 0; i < NB; i++) {
        if (pln_shard_writer_begin(w, names[i], NULL)) return -1;
        for (uint64_t o = 0; o < (uint64_t)rows * cols * 2; o += chunk)
            if (pln_shard_writer_write(w, buf, chunk)) return -1;
        if (pln_shard_writer_end(w)) return -1;
    }
    pln_shard_file_info info;
    if (pln_shard_writer_finish(w, &info)) return -1;
    double t1 = pln_now();
    pln_shard *s = pln_shard_open(path);
    if (!s) return -1;
    double t2 = pln_now();
    int64_t bad = pln_shard_verify_all(s, NULL);
    double t3 = pln_now();
    uint64_t h = 0;
    for (int i = 0; i < NB; i++) h += pln_xxh3(pln_shard_data(s, &s->tensors[i]), s->tensors[i].nbytes);
    double t4 = pln_now();
    double gb = (double)info.file_size / 1e9;
    /* The ceiling: the same bytes with plain write() + fsync, same disk, same run. */
    char *cp = pln_xasprintf("%s.ceiling", path);
    int fd = open(cp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    double c0 = pln_now();
    for (uint64_t o = 0; fd >= 0 && o < info.file_size; o += chunk)
        if (write(fd, buf, chunk) != (ssize_t)chunk) break;
    if (fd >= 0) { fsync(fd); close(fd); }
    double c1 = pln_now();
    unlink(cp);
    free(cp);
    printf("write (stream + XXH3 + fsync) %.2f GB: %.2f s = %.2f GB/s; plain write + fsync ceiling %.2f GB/s\n", gb, t1 - t0,
           gb / (t1 - t0), gb / (c1 - c0));
    printf("open + validate: %.3f ms\n", 1e3 * (t2 - t1));
    printf("verify_all (page cache, OpenMP): %.2f GB/s, %lld bad\n", gb / (t3 - t2), (long long)bad);
    printf("XXH3 one thread over the mapping: %.2f GB/s (%016llx)\n", gb / (t4 - t3), (unsigned long long)h);
    pln_shard_close(s);
    free(buf);
    unlink(path);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--bench")) {
        if (bench(argv[2])) pln_die("%s", pln_error());
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--write-sparse")) {
        if (write_sparse(argv[2])) pln_die("%s", pln_error());
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--write-special")) {
        if (write_special(argv[2])) pln_die("%s", pln_error());
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "--write-sample")) {
        int32_t tp = 2;
        bool int8 = false, qemb = false, force = false;
        int64_t group = 0;
        for (int i = 3; i < argc; i++) {
            if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoi(argv[++i]);
            else if (!strcmp(argv[i], "--int8")) int8 = true;
            else if (!strcmp(argv[i], "--group") && i + 1 < argc) group = atoll(argv[++i]);
            else if (!strcmp(argv[i], "--quantize-embedding")) qemb = true;
            else if (!strcmp(argv[i], "--force")) force = true;
            else pln_die("unknown option %s", argv[i]);
        }
        if (write_sample_set(argv[2], tp, int8, group, qemb, force)) pln_die("%s", pln_error());
        return 0;
    }
    test_begin("test_shard");
    make_data();
    test_round_trip();
    test_writer_errors();
    test_write_modes();
    test_corruption();
    test_layout();
    test_shardset();
    test_small_files();
    test_scales_padding();
    for (int i = 0; i < NT; i++) free(g_data[i]);
    return test_done();
}
