/* test_safetensors.c — the safetensors reader on good files (written by our writer, by hand with an
 * unaligned header, and the fixtures written by HF's safetensors) and on hostile ones: every rule
 * of the reference implementation gives a clear error naming the file, and nothing crashes. */
#include "formats/safetensors.h"
#include "tests/test.h"

#include <stdint.h>
#include <sys/resource.h>

static char *tmp_path(const char *name) { return pln_xasprintf("%s/%s", test_tmpdir(), name); }

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

/* A safetensors image from a header string and a data buffer (header length as given). */
static uint8_t *make_st(const char *hdr, const void *data, size_t dlen, size_t *n_out) {
    size_t hl = strlen(hdr);
    uint8_t *b = pln_xmalloc(8 + hl + dlen);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    *n_out = 8 + hl + dlen;
    return b;
}

/* Writes hdr+data to a file named name and expects open to fail with an error that names the
 * file and contains `want`. */
static void expect_bad(const char *name, const char *hdr, size_t dlen, const char *want) {
    static uint8_t zeros[4096];
    size_t n;
    uint8_t *img = make_st(hdr, zeros, dlen, &n);
    char *p = tmp_path(name);
    write_bytes(p, img, n);
    pln_safetensors st;
    int rc = pln_safetensors_open(&st, p);
    CHECK(rc == -1, "%s: expected an error", name);
    CHECK(strstr(pln_error(), p) != NULL, "%s: error does not name the file: %s", name, pln_error());
    CHECK(strstr(pln_error(), want) != NULL, "%s: error lacks \"%s\": %s", name, want, pln_error());
    printf("  %-22s -> %s\n", name, pln_error());
    if (rc == 0) pln_safetensors_close(&st);
    free(p);
    free(img);
}

static void test_roundtrip(void) {
    float a[6] = {1, -2, 3.5f, 4, 5, 6};
    uint16_t h[5] = {0x3c00, 0xc000, 0x3800, 0, 0x7bff};
    int8_t q[3] = {-128, 0, 127};
    pln_tensor ts[4] = {
        {.name = "transformer.a", .dtype = PLN_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = (const uint8_t *)a, .nbytes = 24},
        {.name = "b", .dtype = PLN_DTYPE_F16, .ndim = 1, .shape = {5}, .data = (const uint8_t *)h, .nbytes = 10},
        {.name = "empty", .dtype = PLN_DTYPE_BF16, .ndim = 2, .shape = {0, 7}, .data = NULL, .nbytes = 0},
        {.name = "q", .dtype = PLN_DTYPE_I8, .ndim = 1, .shape = {3}, .data = (const uint8_t *)q, .nbytes = 3},
    };
    const char *meta[] = {"format", "pt", "note", "ünïcode"};
    char *p = tmp_path("good.safetensors");
    CHECK(pln_safetensors_write(p, ts, 4, meta, 2) == 0, "write: %s", pln_error());
    pln_safetensors st;
    CHECK(pln_safetensors_open(&st, p) == 0, "open: %s", pln_error());
    CHECK(st.n_tensors == 4, "n_tensors %lld", (long long)st.n_tensors);
    CHECK(st.metadata_json && strstr(st.metadata_json, "\"format\":\"pt\""), "metadata %s", st.metadata_json ? st.metadata_json : "(null)");
    CHECK(st.header_len % 8 == 0, "writer pads the header to 8");
    for (int i = 0; i < 4; i++) {
        const pln_tensor *t = pln_safetensors_find(&st, ts[i].name);
        CHECK(t != NULL, "find %s", ts[i].name);
        if (!t) continue;
        CHECK(!strcmp(t->name, st.tensors[i].name), "header order kept: %s", st.tensors[i].name);
        CHECK(t->dtype == ts[i].dtype && t->ndim == ts[i].ndim && t->nbytes == ts[i].nbytes, "%s: dtype/shape/nbytes", t->name);
        CHECK(!memcmp(t->shape, ts[i].shape, sizeof t->shape), "%s: shape", t->name);
        CHECK(t->nbytes == 0 || !memcmp(t->data, ts[i].data, t->nbytes), "%s: bytes", t->name);
        CHECK(t->data == st.map.data + t->file_offset, "%s: data points into the mapping (zero copy)", t->name);
        CHECK(t->contiguous && t->file && !strcmp(t->file, p), "%s: file", t->name);
    }
    CHECK(pln_safetensors_find(&st, "nope") == NULL, "find missing");
    pln_safetensors_close(&st);
    pln_safetensors_close(&st);   /* double close is safe */

    /* writer refuses inconsistent nbytes and duplicate names */
    pln_tensor bad = ts[0];
    bad.nbytes = 20;
    CHECK(pln_safetensors_write(p, &bad, 1, NULL, 0) == -1 && strstr(pln_error(), "transformer.a"), "writer checks nbytes: %s", pln_error());
    pln_tensor dup[2] = {ts[1], ts[1]};
    CHECK(pln_safetensors_write(p, dup, 2, NULL, 0) == -1 && strstr(pln_error(), "duplicate"), "writer refuses duplicates: %s", pln_error());
    free(p);
}

/* A header whose length is not a multiple of 8 leaves tensors unaligned; that is allowed. */
static void test_unaligned(void) {
    double d[2] = {1.25, -7.5};
    const char *hdr = "{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}";
    size_t n;
    uint8_t *img = make_st(hdr, d, 16, &n);
    char *p = tmp_path("unaligned.safetensors");
    write_bytes(p, img, n);
    pln_safetensors st;
    CHECK(pln_safetensors_open(&st, p) == 0, "unaligned open: %s", pln_error());
    if (st.n_tensors == 1) {
        const pln_tensor *t = &st.tensors[0];
        CHECK(((uintptr_t)t->data & 7) != 0, "data really is unaligned (header %zu bytes)", strlen(hdr));
        double back[2];   /* consumers must copy (or use memcpy-based loads): no alignment is promised */
        memcpy(back, t->data, 16);
        CHECK(back[0] == 1.25 && back[1] == -7.5, "unaligned values");
        CHECK(st.metadata_json == NULL, "no metadata");
    }
    pln_safetensors_close(&st);
    free(p);
    free(img);
}

static void test_bad(void) {
    /* sizes below: F32 [2] = 8 bytes */
    expect_bad("unknown-dtype", "{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
    expect_bad("shape-mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12 bytes");
    expect_bad("shape-overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows");
    expect_bad("bytes-overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,2],\"data_offsets\":[0,8]}}", 8, "overflows");
    expect_bad("negative-dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "negative");
    expect_bad("too-many-dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "dimensions");
    expect_bad("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
    expect_bad("gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, "gap");
    expect_bad("gap-at-start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "gap");
    expect_bad("trailing-bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9, "trailing");
    expect_bad("past-end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the end");
    expect_bad("end-before-begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "end before begin");
    expect_bad("duplicate-names", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate");
    expect_bad("not-json", "{\"a\": nope}", 0, "not valid UTF-8 JSON");
    expect_bad("bad-utf8", "{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "not valid UTF-8 JSON");
    expect_bad("not-object", "[1, 2]", 0, "does not start");
    expect_bad("entry-not-object", "{\"a\": 3}", 0, "not a JSON object");
    expect_bad("missing-offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_bad("float-shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "integers");
    expect_bad("metadata-nonstring", "{\"__metadata__\":{\"k\":1}}", 0, "__metadata__");

    /* header size past the end of the file, and over the 100 MB limit */
    uint8_t raw[16] = {0};
    raw[0] = 200;
    char *p = tmp_path("header-past-eof");
    write_bytes(p, raw, sizeof raw);
    pln_safetensors st;
    CHECK(pln_safetensors_open(&st, p) == -1 && strstr(pln_error(), "past the end") && strstr(pln_error(), p), "header past EOF: %s", pln_error());
    printf("  %-22s -> %s\n", "header-past-eof", pln_error());
    free(p);
    memset(raw, 0xff, 8);
    p = tmp_path("header-huge");
    write_bytes(p, raw, sizeof raw);
    CHECK(pln_safetensors_open(&st, p) == -1 && strstr(pln_error(), "100 MB"), "header huge: %s", pln_error());
    free(p);
    p = tmp_path("tiny");
    write_bytes(p, raw, 5);
    CHECK(pln_safetensors_open(&st, p) == -1 && strstr(pln_error(), "too small"), "tiny: %s", pln_error());
    free(p);
    p = tmp_path("empty");
    write_bytes(p, raw, 0);
    CHECK(pln_safetensors_open(&st, p) == -1 && strstr(pln_error(), "too small"), "empty: %s", pln_error());
    free(p);
    CHECK(pln_safetensors_open(&st, "/nonexistent/x.safetensors") == -1 && strstr(pln_error(), "/nonexistent/x.safetensors"),
          "missing file: %s", pln_error());
}

/* Every prefix of a valid file must fail cleanly (in memory, under the sanitizers in CI). */
static void test_truncation(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    pln_tensor ts[2] = {
        {.name = "w", .dtype = PLN_DTYPE_F32, .ndim = 2, .shape = {2, 2}, .data = (const uint8_t *)a, .nbytes = 16},
        {.name = "b", .dtype = PLN_DTYPE_F32, .ndim = 1, .shape = {2}, .data = (const uint8_t *)(a + 4), .nbytes = 8},
    };
    char *p = tmp_path("trunc.safetensors");
    CHECK(pln_safetensors_write(p, ts, 2, NULL, 0) == 0, "write: %s", pln_error());
    size_t n;
    char *whole = pln_read_small_file(p, 1 << 20, &n);
    int failed = 0;
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *img = pln_xmalloc(cut + 1);
        memcpy(img, whole, cut);
        pln_safetensors st;
        int rc = pln_safetensors_parse(&st, img, cut, "cut");
        if (rc != -1 || strncmp(pln_error(), "cut: ", 5)) failed++;
        if (rc == 0) pln_safetensors_close(&st);
        free(img);
    }
    CHECK(failed == 0, "%d of %zu truncated prefixes did not fail with a named error", failed, n);
    pln_safetensors st;
    CHECK(pln_safetensors_parse(&st, (const uint8_t *)whole, n, "whole") == 0, "whole file parses: %s", pln_error());
    pln_safetensors_close(&st);
    printf("  truncated at %zu cut points: all rejected\n", n);
    free(whole);
    free(p);
}

/* The reference logits written by HF's safetensors (save_file). */
static void test_fixture(void) {
    const char *p = "tests/fixtures/models/bloom-4h/reference-f16.safetensors";
    pln_safetensors st;
    if (access(p, R_OK) != 0) { printf("SKIP fixture %s missing\n", p); return; }
    CHECK(pln_safetensors_open(&st, p) == 0, "fixture: %s", pln_error());
    const pln_tensor *ids = pln_safetensors_find(&st, "prompt0.ids"), *lg = pln_safetensors_find(&st, "prompt0.logits");
    const pln_tensor *bl = pln_safetensors_find(&st, "batch.logits"), *bi = pln_safetensors_find(&st, "batch.ids");
    CHECK(ids && ids->dtype == PLN_DTYPE_I32 && ids->ndim == 1 && ids->shape[0] >= 4 && ids->shape[0] <= 24, "prompt0.ids");
    CHECK(lg && ids && lg->dtype == PLN_DTYPE_F32 && lg->ndim == 2 && lg->shape[0] == ids->shape[0] && lg->shape[1] == 1003, "prompt0.logits");
    CHECK(bl && bi && bl->ndim == 3 && bl->shape[0] == bi->shape[0] && bl->shape[1] == bi->shape[1] && bl->shape[2] == 1003, "batch.logits");
    if (ids) {
        int32_t v[32];
        memcpy(v, ids->data, ids->nbytes);
        int ok = 1;
        for (int64_t i = 0; i < ids->shape[0]; i++) ok &= v[i] >= 0 && v[i] < 1000;
        CHECK(ok, "prompt0.ids within the tokenizer vocabulary");
    }
    for (int i = 0; i < 4; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "greedy%d.logprobs", i);
        const pln_tensor *t = pln_safetensors_find(&st, nm);
        CHECK(t && t->dtype == PLN_DTYPE_F32 && t->ndim == 1 && t->shape[0] == 20, "%s", nm);
    }
    CHECK(st.n_tensors == 19, "fixture holds 19 tensors, got %lld", (long long)st.n_tensors);
    pln_safetensors_close(&st);
}

/* A BLOOM-176B-sized embedding (7.2 GB, sparse file): opening reads the header only. */
static void test_big_sparse(void) {
    const char *hdr = "{\"word_embeddings.weight\":{\"dtype\":\"BF16\",\"shape\":[250880,14336],\"data_offsets\":[0,7193231360]}}";
    size_t n;
    uint8_t *img = make_st(hdr, NULL, 0, &n);
    char *p = tmp_path("big.safetensors");
    FILE *f = fopen(p, "wb");
    bool ok = f && fwrite(img, 1, n, f) == n && ftruncate(fileno(f), (off_t)(n + 7193231360ull)) == 0;
    if (f) ok &= fclose(f) == 0;
    free(img);
    if (!ok) { printf("SKIP big sparse file: cannot create it here\n"); free(p); return; }
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    pln_safetensors st;
    int rc = pln_safetensors_open(&st, p);
    getrusage(RUSAGE_SELF, &r1);
    long faults = (r1.ru_minflt - r0.ru_minflt) + (r1.ru_majflt - r0.ru_majflt);
    CHECK(rc == 0 && st.n_tensors == 1 && st.tensors[0].nbytes == 7193231360ull, "big sparse: %s", pln_error());
    CHECK(faults < 20000, "opening touched %ld pages (the data is 1.8 million)", faults);
    printf("  7.2 GB safetensors opened with %ld page faults (header only)\n", faults);
    if (rc == 0) pln_safetensors_close(&st);
    unlink(p);
    free(p);
}

int main(void) {
    test_begin("test_safetensors");
    test_roundtrip();
    test_unaligned();
    test_bad();
    test_truncation();
    test_fixture();
    test_big_sparse();
    return test_done();
}
