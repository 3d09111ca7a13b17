/* test_tokenizer.c — the BLOOM tokenizer against the Hugging Face fixtures (every encoding,
 * decoding and token's bytes), streaming decode, edge cases, error messages, and a synthetic
 * BLOOM-size tokenizer.json (250680 tokens) for load time; then every other tokenizer.json family
 * of tests/fixtures/tokenizer/ (Mistral, Llama 2, Llama 3, Qwen2 and the component pipelines)
 * against tokenizers' ids, decodes and DecodeStream, the real Mistral vocabulary by hand, and
 * mutated files.
 *
 * Also a small benchmark (tools/bench/tokenizer.sh runs it):
 *   test_tokenizer --gen-synthetic OUT.json        write the synthetic BLOOM-size tokenizer.json
 *   test_tokenizer --bench TOKENIZER.json [TEXT]   load time, encode and decode throughput on TEXT
 *                                                  (default: the fixture texts repeated to 4 MB) */
#include "test.h"

#include "formats/common.h"
#include "runtime/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <zlib.h>

#define FIX_TOK "tests/fixtures/tokenizer/tokenizer.json"
#define FIX_ENC "tests/fixtures/tokenizer/encodings.json"

/* ---- helpers ------------------------------------------------------------------------------ */

static int32_t *ids_of(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s [", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "]\n");
}

/* Streams ids one at a time through a buffer of the documented size; returns malloc'd text. */
static char *stream_decode(const pln_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
    size_t cap = 3 * pln_tok_max_token_bytes(t) + 12;
    size_t total = 16;
    for (size_t i = 0; i < n; i++) total += cap;
    char *out = malloc(total), *buf = malloc(cap);
    size_t o = 0;
    pln_tok_stream st = {0};
    for (size_t i = 0; i < n; i++) {
        size_t k = pln_tok_stream_push(t, &st, ids[i], skip, buf, cap);
        memcpy(out + o, buf, k);
        o += k;
    }
    o += pln_tok_stream_flush(t, &st, out + o, 12);
    out[o] = 0;
    free(buf);
    *len = o;
    return out;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* ---- fixture checks ----------------------------------------------------------------------- */

static void test_fixture(const pln_tokenizer *t, json_t *enc, const char *label) {
    CHECK(pln_tok_vocab_size(t) == json_integer_value(json_object_get(enc, "vocab_size")),
          "%s: vocab size %lld", label, (long long)pln_tok_vocab_size(t));
    /* every encoding case, exactly */
    json_t *cases = json_object_get(enc, "cases");
    size_t i, bad = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text");
        size_t nw;
        int32_t *want = ids_of(json_object_get(c, "ids"), &nw);
        int32_t *got = NULL;
        size_t ng = 0;
        int rc = pln_tok_encode(t, json_string_value(text), json_string_length(text), &got, &ng);
        bool ok = rc == 0 && same_ids(got, ng, want, nw);
        if (!ok && bad++ < 5) {
            fprintf(stderr, "%s: encode case %zu \"%s\" (rc %d %s)\n", label, i, json_string_value(text), rc, pln_error());
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        /* streaming the case's ids gives the full decode, and it round-trips to the text */
        size_t dl, sl;
        char *full = pln_tok_decode(t, want, nw, false, &dl);
        char *str = stream_decode(t, want, nw, false, &sl);
        if (dl != sl || memcmp(full, str, dl) != 0 || dl != json_string_length(text) ||
            memcmp(full, json_string_value(text), dl) != 0) {
            if (bad++ < 5) fprintf(stderr, "%s: case %zu: decode/stream round trip differs\n", label, i);
        }
        free(full); free(str); free(got); free(want);
    }
    CHECK(bad == 0, "%s: %zu of %zu encoding cases differ from transformers", label, bad, json_array_size(cases));
    printf("%s: %zu encoding cases: %s\n", label, json_array_size(cases), bad ? "NOT OK" : "OK");

    /* every decode case (including random ids with partial UTF-8), full and streamed */
    json_t *decs = json_object_get(enc, "decodes");
    bad = 0;
    json_array_foreach(decs, i, c) {
        json_t *text = json_object_get(c, "text");
        size_t n, dl, sl;
        int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
        char *full = pln_tok_decode(t, ids, n, false, &dl);
        char *str = stream_decode(t, ids, n, false, &sl);
        bool ok = dl == json_string_length(text) && memcmp(full, json_string_value(text), dl) == 0 &&
                  sl == dl && memcmp(str, full, dl) == 0 && full[dl] == 0;
        if (!ok && bad++ < 5) {
            fprintf(stderr, "%s: decode case %zu: want \"%s\" got \"%s\" stream \"%s\"\n", label, i,
                    json_string_value(text), full, str);
            print_ids("ids", ids, n);
        }
        free(full); free(str); free(ids);
    }
    CHECK(bad == 0, "%s: %zu of %zu decode cases differ", label, bad, json_array_size(decs));
    printf("%s: %zu decode cases (full and streamed): %s\n", label, json_array_size(decs), bad ? "NOT OK" : "OK");

    /* every token's raw bytes and its spelling */
    json_t *toks = json_object_get(enc, "tokens");
    bad = 0;
    json_array_foreach(toks, i, c) {
        int32_t id = (int32_t)json_integer_value(json_object_get(c, "id"));
        const char *hex = json_string_value(json_object_get(c, "bytes_hex"));
        size_t hl = strlen(hex), len = 0;
        const uint8_t *b = pln_tok_token_bytes(t, id, &len);
        bool ok = b && len * 2 == hl;
        for (size_t k = 0; ok && k < len; k++) ok = b[k] == (uint8_t)(hexval(hex[2 * k]) * 16 + hexval(hex[2 * k + 1]));
        ok = ok && pln_tok_token_id(t, json_string_value(json_object_get(c, "token"))) == id;
        if (!ok && bad++ < 5) fprintf(stderr, "%s: token %d: bytes or spelling differ (want %s)\n", label, id, hex);
    }
    CHECK(bad == 0 && json_array_size(toks) == 1000, "%s: %zu of %zu token byte strings differ", label, bad,
          json_array_size(toks));
    printf("%s: %zu token byte strings: %s\n", label, json_array_size(toks), bad ? "NOT OK" : "OK");
}

static void check_encode(const pln_tokenizer *t, const char *text, const int32_t *want, size_t nw) {
    int32_t *got = NULL;
    size_t ng = 0;
    int rc = pln_tok_encode(t, text, strlen(text), &got, &ng);
    CHECK(rc == 0 && same_ids(got, ng, want, nw), "encode \"%s\" (rc %d, %zu ids)", text, rc, ng);
    free(got);
}

static void test_edges(const pln_tokenizer *t) {
    int32_t *ids = NULL;
    size_t n = 99;
    CHECK(pln_tok_encode(t, "", 0, &ids, &n) == 0 && n == 0 && ids == NULL, "empty text gives no ids");
    check_encode(t, " ", (int32_t[]){224}, 1);
    check_encode(t, "  ", (int32_t[]){321}, 1);
    check_encode(t, "Hello <s> world", (int32_t[]){679, 224, 1, 511}, 4);
    check_encode(t, "<s><s>", (int32_t[]){1, 1}, 2);
    check_encode(t, "a<pad>b", (int32_t[]){68, 3, 69}, 3);
    /* only spaces: long runs stay whole pieces of the Split and round-trip */
    char spaces[1001];
    memset(spaces, ' ', 1000); spaces[1000] = 0;
    CHECK(pln_tok_encode(t, spaces, 1000, &ids, &n) == 0 && n > 0, "1000 spaces encode");
    size_t dl;
    char *d = pln_tok_decode(t, ids, n, false, &dl);
    CHECK(dl == 1000 && memcmp(d, spaces, 1000) == 0, "1000 spaces round-trip");
    free(d); free(ids);

    /* invalid UTF-8 is rejected with the offset */
    static const char *bad[] = {"ab\xff", "\xc3", "a\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "x\xe2\x82"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        ids = (int32_t *)1;
        int rc = pln_tok_encode(t, bad[k], strlen(bad[k]), &ids, &n);
        CHECK(rc == -1 && ids == NULL && n == 0 && strstr(pln_error(), "not valid UTF-8") && strstr(pln_error(), "offset"),
              "invalid UTF-8 case %zu rejected (rc %d: %s)", k, rc, pln_error());
    }
    /* embedded NUL is valid UTF-8 */
    CHECK(pln_tok_encode(t, "a\0b", 3, &ids, &n) == 0 && n >= 2, "NUL inside text encodes");
    d = pln_tok_decode(t, ids, n, false, &dl);
    CHECK(dl == 3 && memcmp(d, "a\0b", 3) == 0, "NUL round-trips");
    free(d); free(ids);

    /* decode: skip_special, out-of-range ids skipped, specials */
    int32_t sp[] = {1, 679, 2, -5, 1000, 3};
    d = pln_tok_decode(t, sp, 6, true, &dl);
    CHECK(strcmp(d, "Hello") == 0 && dl == 5, "skip_special decode: \"%s\"", d);
    free(d);
    d = pln_tok_decode(t, sp, 6, false, &dl);
    CHECK(strcmp(d, "<s>Hello</s><pad>") == 0, "decode with specials: \"%s\"", d);
    free(d);
    CHECK(pln_tok_is_special(t, 0) && pln_tok_is_special(t, 3) && !pln_tok_is_special(t, 4) &&
          !pln_tok_is_special(t, -1) && !pln_tok_is_special(t, 1000), "is_special");
    CHECK(pln_tok_token_id(t, "</s>") == 2 && pln_tok_token_id(t, "Ġ") == 224 && pln_tok_token_id(t, "nope!?") == -1,
          "token_id");
    size_t bl = 7;
    CHECK(pln_tok_token_bytes(t, 1000, &bl) == NULL && bl == 0 && pln_tok_token_bytes(t, -1, &bl) == NULL, "token_bytes range");

    /* streaming: a 4-byte character fed as single-byte tokens appears only when complete */
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) byte_tok[b] = -1;
    for (int32_t id = 0; id < pln_tok_vocab_size(t); id++) {
        const uint8_t *tb = pln_tok_token_bytes(t, id, &bl);
        if (tb && bl == 1 && !pln_tok_is_special(t, id)) byte_tok[tb[0]] = id;
    }
    static const uint8_t woman[4] = {0xF0, 0x9F, 0x91, 0xA9};   /* U+1F469 */
    if (byte_tok[0xF0] >= 0 && byte_tok[0x9F] >= 0 && byte_tok[0x91] >= 0 && byte_tok[0xA9] >= 0) {
        pln_tok_stream st = {0};
        char out[64];
        size_t w[4];
        for (int k = 0; k < 4; k++) w[k] = pln_tok_stream_push(t, &st, byte_tok[woman[k]], false, out, sizeof out);
        CHECK(w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == 4 && memcmp(out, woman, 4) == 0,
              "stream holds partial UTF-8 (%zu %zu %zu %zu)", w[0], w[1], w[2], w[3]);
        /* a skipped special while a sequence is pending: the sequence continues */
        st = (pln_tok_stream){0};
        pln_tok_stream_push(t, &st, byte_tok[0xF0], true, out, sizeof out);
        CHECK(pln_tok_stream_push(t, &st, 2, true, out, sizeof out) == 0, "skipped special writes nothing");
        CHECK(st.n_pend == 1, "pending byte kept across a skipped special");
        /* a special that is not skipped breaks it: U+FFFD then "</s>" */
        size_t k = pln_tok_stream_push(t, &st, 2, false, out, sizeof out);
        CHECK(k == 7 && memcmp(out, "\xEF\xBF\xBD</s>", 7) == 0 && st.n_pend == 0, "special breaks a pending sequence");
        pln_tok_stream_push(t, &st, byte_tok[0xF0], false, out, sizeof out);
        pln_tok_stream_push(t, &st, byte_tok[0x9F], false, out, sizeof out);
        CHECK(pln_tok_stream_flush(t, &st, out, sizeof out) == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0 && st.n_pend == 0,
              "flush writes one U+FFFD for a pending prefix");
        /* invalid continuation: one U+FFFD for the prefix, then the byte starts afresh */
        st = (pln_tok_stream){0};
        pln_tok_stream_push(t, &st, byte_tok[0xF0], false, out, sizeof out);
        k = pln_tok_stream_push(t, &st, byte_tok['A'], false, out, sizeof out);
        CHECK(k == 4 && memcmp(out, "\xEF\xBF\xBD" "A", 4) == 0, "invalid continuation");
    } else {
        CHECK(0, "the fixture vocabulary lacks single-byte tokens F0 9F 91 A9");
    }
}

/* Random valid UTF-8 texts round-trip through encode + decode, and a long single-character run
 * (worst case for BPE: one 100 kB piece) stays fast. */
static void test_roundtrip(const pln_tokenizer *t, const char *label, uint64_t seed) {
    static const char *pool[] = {"a", "b", "e", "th", " ", "  ", "\t", "\n", "\r", ".", ",", "!", "?", "(", ")", "|",
                                 "[", "é", "ß", "ж", "的", "中", "…", "。", "ह", "ि", "ع", "😀", "\xc2\x85", "\u00a0",
                                 "\u3000", "0", "7", "<s>", "</s>", "<", ">", "\xef\xbf\xbd", "'"};
    size_t np = sizeof pool / sizeof *pool, bad = 0;
    uint64_t x = seed;
    char text[2048];
    for (int it = 0; it < 300; it++) {
        size_t len = 0;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((x >> 33) % 80);
        for (int j = 0; j < k; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const char *p = pool[(x >> 33) % np];
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        int32_t *ids;
        size_t n, dl;
        if (pln_tok_encode(t, text, len, &ids, &n) != 0) { bad++; continue; }
        char *d = pln_tok_decode(t, ids, n, false, &dl);
        if (dl != len || memcmp(d, text, len) != 0) bad++;
        free(d); free(ids);
    }
    CHECK(bad == 0, "%s: %zu of 300 random texts do not round-trip", label, bad);

    /* the run's unit: the letter or letter pair whose 64-byte run merges most (fewest ids), so
     * the merge heap works; a run nothing merges would test only the scan */
    char best_u[2] = {'x', 'x'};
    size_t best_n = 65;
    for (int u = 0; u < 26 * 27; u++) {
        char c0 = (char)('a' + u % 26), c1 = u < 26 ? c0 : (char)('a' + (u / 26 - 1));
        char r64[64];
        for (int i = 0; i < 64; i++) r64[i] = i & 1 ? c1 : c0;
        int32_t *ri;
        size_t rn;
        if (pln_tok_encode(t, r64, sizeof r64, &ri, &rn) == 0) {
            if (rn < best_n) { best_n = rn; best_u[0] = c0; best_u[1] = c1; }
            free(ri);
        }
    }
    CHECK(best_n <= 32, "%s: some letter run merges (best \"%.2s\": %zu ids for 64 bytes)", label, best_u, best_n);
    size_t big = 100000;
    char *run = malloc(big);
    for (size_t i = 0; i < big; i++) run[i] = best_u[i & 1];
    int32_t *ids;
    size_t n, dl;
    /* Linear, not quadratic: the steps the encoder counts (pln_tok_last_work, deterministic, no
     * clock) for 100 kB against 10 kB of the same run: linear is ~10x (n log n from the merge
     * heap ~12x), quadratic ~100x. The times are printed for the reader, never checked. */
    int32_t *sids;
    size_t sn;
    double t0 = pln_now();
    int rc = pln_tok_encode(t, run, big / 10, &sids, &sn);
    double t_small = pln_now() - t0;
    uint64_t w_small = pln_tok_last_work();
    if (!rc) free(sids);
    ids = NULL;
    uint64_t w_big = 0;
    double t_big = 0;
    if (!rc) {
        t0 = pln_now();
        rc = pln_tok_encode(t, run, big, &ids, &n);
        t_big = pln_now() - t0;
        w_big = pln_tok_last_work();
    }
    double ratio = (double)w_big / (double)(w_small ? w_small : 1);
    printf("%s: 100 kB run of \"%.2s\" %llu steps (%.4f s), 10 kB %llu steps (%.4f s): x%.2f\n", label, best_u,
           (unsigned long long)w_big, t_big, (unsigned long long)w_small, t_small, ratio);
    CHECK(rc == 0 && w_small >= big / 10 && ratio > 8 && ratio < 16,
          "%s: 100 kB single-character run: rc %d, %.1fx the steps of 10 kB (%llu; linear: ~10x)", label, rc, ratio,
          (unsigned long long)w_small);
    if (rc == 0) {
        char *d = pln_tok_decode(t, ids, n, false, &dl);
        CHECK(dl == big && memcmp(d, run, big) == 0, "%s: long run round-trips", label);
        free(d); free(ids);
    }
    free(run);
}

/* ---- threads ------------------------------------------------------------------------------ */

typedef struct { const pln_tokenizer *t; json_t *cases; int bad; } thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int rep = 0; rep < 3; rep++) {
        size_t i;
        json_t *c;
        json_array_foreach(a->cases, i, c) {
            json_t *text = json_object_get(c, "text");
            size_t nw, ng;
            int32_t *want = ids_of(json_object_get(c, "ids"), &nw), *got;
            if (pln_tok_encode(a->t, json_string_value(text), json_string_length(text), &got, &ng) != 0 ||
                !same_ids(got, ng, want, nw))
                a->bad++;
            else
                free(got);
            free(want);
        }
    }
    return NULL;
}

static void test_threads(const pln_tokenizer *t, json_t *enc) {
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, json_object_get(enc, "cases"), 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad += args[i].bad; }
    CHECK(bad == 0, "4 threads encoding at once: %d mismatches", bad);
}

/* ---- variants of the fixture file: merges as pairs, unsupported pipelines ------------------ */

static char *write_json(json_t *root, const char *name) {
    char *path = pln_xasprintf("%s/%s", test_tmpdir(), name);
    if (json_dump_file(root, path, JSON_COMPACT) != 0) { CHECK(0, "cannot write %s", path); }
    return path;
}

static void expect_load_error(json_t *root, const char *name, const char *needle) {
    char *path = write_json(root, name);
    pln_tokenizer *t = pln_tok_load(path);
    CHECK(t == NULL && strstr(pln_error(), needle) && strstr(pln_error(), path),
          "%s: load must fail naming \"%s\" and the file, got: %s", name, needle, t ? "(loaded)" : pln_error());
    pln_tok_free(t);
    free(path);
}

static void test_variants(json_t *enc) {
    json_error_t err;
    json_t *root = json_load_file(FIX_TOK, 0, &err);
    CHECK(root != NULL, "fixture tokenizer.json parses");
    if (!root) return;
    /* merges in the [a, b] pair format give identical results */
    json_t *orig = json_deep_copy(root);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t i;
    json_t *m;
    bool strings = json_is_string(json_array_get(merges, 0));
    json_array_foreach(merges, i, m) {
        json_t *alt;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            alt = json_array();
            json_array_append_new(alt, json_stringn(s, (size_t)(sp - s)));
            json_array_append_new(alt, json_string(sp + 1));
        } else {
            char *joined = pln_xasprintf("%s %s", json_string_value(json_array_get(m, 0)),
                                         json_string_value(json_array_get(m, 1)));
            alt = json_string(joined);
            free(joined);
        }
        json_array_set_new(merges, i, alt);
    }
    char *path = write_json(root, "tokenizer-other-merges.json");
    pln_tokenizer *t = pln_tok_load(path);
    CHECK(t != NULL, "merges in the other format load: %s", pln_error());
    if (t) test_fixture(t, enc, strings ? "merges as pairs" : "merges as strings");
    pln_tok_free(t);
    free(path);

    json_t *v;
    v = json_deep_copy(orig);
    /* components pollen does not implement are refused by name and JSON path */
    json_object_set_new(v, "normalizer", json_pack("{s:s}", "type", "Precompiled"));
    expect_load_error(v, "bad-normalizer.json", "normalizer: normalizer \"Precompiled\" is not supported");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(v, "normalizer", json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "Sequence", "normalizers", "type",
                                                   "NFC", "type", "BertNormalizer"));
    expect_load_error(v, "bad-normalizer2.json", "normalizer.normalizers[1]: normalizer \"BertNormalizer\"");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(v, "pre_tokenizer", json_pack("{s:s}", "type", "UnicodeScripts"));
    expect_load_error(v, "bad-pre.json", "pre_tokenizer: pre_tokenizer \"UnicodeScripts\" is not supported");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(v, "truncation", json_pack("{s:i}", "max_length", 8));
    expect_load_error(v, "truncation.json", "truncation is set");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(v, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    expect_load_error(v, "bad-decoder.json", "decoder");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(json_object_get(v, "model"), "type", json_string("WordPiece"));
    expect_load_error(v, "bad-model.json", "model.type");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(json_array_get(json_object_get(json_object_get(v, "pre_tokenizer"), "pretokenizers"), 0),
                        "behavior", json_string("Bogus"));
    expect_load_error(v, "bad-behavior.json", "pre_tokenizer.pretokenizers[0].behavior \"Bogus\"");
    json_decref(v);
    v = json_deep_copy(orig);
    json_array_append_new(json_object_get(json_object_get(v, "model"), "merges"), json_string("zzzq qqqz"));
    expect_load_error(v, "bad-merge.json", "model.merges[");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_del(json_object_get(v, "model"), "vocab");
    expect_load_error(v, "no-vocab.json", "model.vocab");
    json_decref(v);
    v = json_deep_copy(orig);
    json_object_set_new(v, "post_processor", json_pack("{s:s}", "type", "TemplateProcessing"));
    expect_load_error(v, "bad-post.json", "post_processor");
    json_decref(v);

    /* no merges at all: read by jansson alone (the scanner wants both); every piece stays
     * single bytes */
    v = json_deep_copy(orig);
    json_object_del(json_object_get(v, "model"), "merges");
    path = write_json(v, "no-merges.json");
    pln_tokenizer *nm = pln_tok_load(path);
    CHECK(nm != NULL, "no merges loads: %s", pln_error());
    if (nm) {
        int32_t *ids;
        size_t n;
        CHECK(pln_tok_encode(nm, "Hello", 5, &ids, &n) == 0 && n == 5 && ids[0] == pln_tok_token_id(nm, "H"),
              "no merges: one id per byte");
        if (n) free(ids);
        CHECK(pln_tok_vocab_size(nm) == 1000, "no merges: vocab size");
    }
    pln_tok_free(nm);
    free(path);
    json_decref(v);

    /* hostile files: every truncation point in the first 4 kB and the vocabulary region, and
     * single-byte mutations, must load or fail cleanly (run under ASan in CI) */
    size_t flen;
    char *ftext = pln_read_small_file(FIX_TOK, 1 << 24, &flen);
    CHECK(ftext != NULL, "read fixture");
    char *mpath = pln_xasprintf("%s/mutant.json", test_tmpdir());
    int loaded = 0, failed = 0, unnamed = 0;
    uint64_t rs = 99;
    for (int k = 0; ftext && k < 600; k++) {
        size_t cut = flen;
        char *mb = malloc(flen + 1);
        memcpy(mb, ftext, flen);
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        if (k < 300) cut = k < 150 ? (size_t)k * 27 % flen : (size_t)(rs >> 33) % flen;
        else for (int j = 0; j < 1 + k % 3; j++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            mb[(rs >> 33) % flen] = "\"{}[],:0 a\x80\xff"[(rs >> 20) % 12];
        }
        FILE *mf = fopen(mpath, "wb");
        fwrite(mb, 1, cut, mf);
        fclose(mf);
        free(mb);
        pln_tokenizer *mt = pln_tok_load(mpath);
        if (mt) {
            loaded++;
            int32_t *ids;
            size_t n;
            if (pln_tok_encode(mt, "Hello world", 11, &ids, &n) == 0 && n) free(ids);
            pln_tok_free(mt);
        } else {
            failed++;
            if (!strstr(pln_error(), mpath)) unnamed++;
        }
    }
    printf("hostile files: %d loaded, %d refused\n", loaded, failed);
    CHECK(failed > 0 && unnamed == 0, "mutants: %d loaded, %d failed, %d errors without the path", loaded, failed, unnamed);
    free(mpath);
    free(ftext);

    v = json_deep_copy(orig);
    json_object_set_new(json_object_get(json_object_get(v, "model"), "vocab"), "hugeid", json_integer(2000000000));
    expect_load_error(v, "huge-id.json", "too large");
    json_decref(v);

    pln_tokenizer *x = pln_tok_load("/nonexistent/tokenizer.json");
    CHECK(x == NULL && strstr(pln_error(), "/nonexistent/tokenizer.json"), "missing file: %s", pln_error());
    char *junk = pln_xasprintf("%s/junk.json", test_tmpdir());
    FILE *f = fopen(junk, "w");
    fputs("{\"model\": [1, 2", f);
    fclose(f);
    x = pln_tok_load(junk);
    CHECK(x == NULL && strstr(pln_error(), "not valid JSON"), "truncated JSON: %s", pln_error());
    free(junk);
    json_decref(root);
    json_decref(orig);
}

/* ---- the other families (tests/fixtures/make_tokenizer_fixtures.py) ----------------------- */

/* Reads a gzip file whole; NULL if it cannot be read. */
static char *read_gz(const char *path, size_t *len) {
    gzFile g = gzopen(path, "rb");
    if (!g) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    int r;
    while ((r = gzread(g, buf + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)r;
        if (n == cap) { cap *= 2; buf = realloc(buf, cap + 1); }
    }
    gzclose(g);
    if (r < 0) { free(buf); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* tests/fixtures/tokenizer/<family>/tokenizer.json.gz, unpacked into the scratch directory. */
static char *family_json(const char *family) {
    char *gz = pln_xasprintf("tests/fixtures/tokenizer/%s/tokenizer.json.gz", family);
    size_t n = 0;
    char *text = read_gz(gz, &n);
    CHECK(text != NULL, "read %s", gz);
    free(gz);
    if (!text) return NULL;
    char *path = pln_xasprintf("%s/%s-tokenizer.json", test_tmpdir(), family);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
    free(text);
    return path;
}

static bool same_text(const char *got, size_t gl, json_t *want) {
    return json_is_string(want) && gl == json_string_length(want) && memcmp(got, json_string_value(want), gl) == 0;
}

static bool is_added(json_t *added, int32_t id) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a)
        if (json_integer_value(json_object_get(a, "id")) == id) return true;
    return false;
}

/* Every case of a family against `tokenizers`: ids without and with special tokens, token
 * spellings, decodes (with and without skipping specials, full and streamed), and streaming
 * never behind DecodeStream. */
static void test_family(const char *family) {
    char *path = family_json(family);
    char *cgz = pln_xasprintf("tests/fixtures/tokenizer/%s/cases.json.gz", family);
    size_t clen = 0;
    char *ctext = read_gz(cgz, &clen);
    json_error_t err;
    json_t *fx = ctext ? json_loadb(ctext, clen, JSON_ALLOW_NUL, &err) : NULL;
    CHECK(fx != NULL, "%s: %s", cgz, ctext ? err.text : "unreadable");
    free(ctext);
    free(cgz);
    pln_tokenizer *t = path ? pln_tok_load(path) : NULL;
    CHECK(t != NULL, "%s: load: %s", family, pln_error());
    if (!t || !fx) { pln_tok_free(t); json_decref(fx); free(path); return; }
    json_t *tj = json_load_file(path, 0, &err), *added = json_incref(json_object_get(tj, "added_tokens"));
    json_decref(tj);
    CHECK(pln_tok_vocab_size(t) == json_integer_value(json_object_get(fx, "vocab_size")), "%s: vocab size %lld",
          family, (long long)pln_tok_vocab_size(t));

    json_t *cases = json_object_get(fx, "cases"), *c;
    size_t i, bad = 0, bad_sp = 0, bad_tok = 0;
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text");
        size_t nw, nws, ng = 0, ngs = 0;
        int32_t *want = ids_of(json_object_get(c, "ids"), &nw), *ws = ids_of(json_object_get(c, "ids_special"), &nws);
        int32_t *got = NULL, *gs = NULL;
        int rc = pln_tok_encode(t, json_string_value(text), json_string_length(text), &got, &ng);
        int rs = pln_tok_encode_special(t, json_string_value(text), json_string_length(text), true, &gs, &ngs);
        if (!(rc == 0 && same_ids(got, ng, want, nw)) && bad++ < 5) {
            fprintf(stderr, "%s: encode case %zu \"%s\" (rc %d %s)\n", family, i, json_string_value(text), rc, pln_error());
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        if (!(rs == 0 && same_ids(gs, ngs, ws, nws)) && bad_sp++ < 5) {
            fprintf(stderr, "%s: encode case %zu with specials \"%s\"\n", family, i, json_string_value(text));
            print_ids("want", ws, nws);
            print_ids("got ", gs, ngs);
        }
        json_t *toks = json_object_get(c, "tokens");
        for (size_t k = 0; rc == 0 && k < ng && k < json_array_size(toks); k++) {
            if (is_added(added, got[k])) continue;       /* HF reports the matched text there */
            size_t sl;
            const char *s = pln_tok_token_str(t, got[k], &sl);
            if (!s || !same_text(s, sl, json_array_get(toks, k))) {
                if (bad_tok++ < 5) fprintf(stderr, "%s: case %zu token %zu spelling differs\n", family, i, k);
                break;
            }
        }
        free(got); free(gs); free(want); free(ws);
    }
    CHECK(bad == 0, "%s: %zu of %zu encodings differ from tokenizers", family, bad, json_array_size(cases));
    CHECK(bad_sp == 0, "%s: %zu of %zu encodings with specials differ", family, bad_sp, json_array_size(cases));
    CHECK(bad_tok == 0, "%s: %zu token spellings differ", family, bad_tok);
    printf("%s: %zu encodings (without and with specials): %s\n", family, json_array_size(cases),
           bad || bad_sp || bad_tok ? "NOT OK" : "OK");

    json_t *decs = json_object_get(fx, "decodes");
    size_t bad_full = 0, bad_skip = 0, bad_stream = 0;
    json_array_foreach(decs, i, c) {
        size_t n, dl, kl, sl;
        int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
        char *full = pln_tok_decode(t, ids, n, false, &dl);
        char *skip = pln_tok_decode(t, ids, n, true, &kl);
        char *str = stream_decode(t, ids, n, false, &sl);
        if (!same_text(full, dl, json_object_get(c, "text")) && bad_full++ < 5) {
            fprintf(stderr, "%s: decode case %zu: want \"%s\" got \"%s\"\n", family, i,
                    json_string_value(json_object_get(c, "text")), full);
            print_ids("ids", ids, n);
        }
        if (!same_text(skip, kl, json_object_get(c, "text_skip")) && bad_skip++ < 5)
            fprintf(stderr, "%s: decode case %zu (skip specials): want \"%s\" got \"%s\"\n", family, i,
                    json_string_value(json_object_get(c, "text_skip")), skip);
        /* the stream equals the full decode, except that a run of byte tokens is judged as it
         * arrives: a character the run completed before it turned invalid stays as it was */
        bool run_split = false;
        uint8_t run[64];
        size_t nr = 0;
        for (size_t k = 0; k <= n; k++) {
            size_t l0 = 0;
            const char *s0 = k < n ? pln_tok_token_str(t, ids[k], &l0) : NULL;
            if (s0 && l0 == 6 && memcmp(s0, "<0x", 3) == 0 && nr < sizeof run) {
                run[nr++] = (uint8_t)(hexval(s0[3]) * 16 + hexval(s0[4]));
                continue;
            }
            /* a run that starts with a complete character and is invalid as a whole */
            size_t q = 0;
            bool valid_head = false, valid_all = true;
            while (q < nr) {
                uint8_t c0 = run[q];
                size_t need = c0 < 0x80 ? 1 : c0 >= 0xC2 && c0 <= 0xDF ? 2 : c0 >= 0xE0 && c0 <= 0xEF ? 3 : c0 >= 0xF0 && c0 <= 0xF4 ? 4 : 0;
                bool okc = need > 0 && q + need <= nr;
                for (size_t z = 1; okc && z < need; z++) okc = (run[q + z] & 0xC0) == 0x80;
                if (!okc) { valid_all = false; break; }
                if (q == 0) valid_head = true;
                q += need;
            }
            if (valid_head && !valid_all) run_split = true;
            nr = 0;
        }
        if ((sl != dl || memcmp(str, full, dl) != 0) && !run_split && bad_stream++ < 5)
            fprintf(stderr, "%s: decode case %zu: stream \"%s\" != full \"%s\"\n", family, i, str, full);
        free(full); free(skip); free(str); free(ids);
    }
    CHECK(bad_full == 0, "%s: %zu of %zu decodes differ from tokenizers", family, bad_full, json_array_size(decs));
    CHECK(bad_skip == 0, "%s: %zu of %zu decodes skipping specials differ", family, bad_skip, json_array_size(decs));
    CHECK(bad_stream == 0, "%s: %zu streamed decodes differ from the full decode", family, bad_stream);
    printf("%s: %zu decodes (full, skip specials, streamed): %s\n", family, json_array_size(decs),
           bad_full || bad_skip || bad_stream ? "NOT OK" : "OK");

    /* DecodeStream emits text once it no longer ends in U+FFFD; pollen's stream emits every
     * complete character at once: at every step pollen's text so far starts with DecodeStream's */
    json_t *streams = json_object_get(fx, "streams");
    size_t bad_steps = 0;
    json_array_foreach(streams, i, c) {
        size_t n;
        int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
        json_t *steps = json_object_get(c, "steps");
        size_t cap = 3 * pln_tok_max_token_bytes(t) + 12, mine_n = 0, hf_n = 0;
        char *mine = malloc(n * cap + 16), *hf = malloc(n * cap * 4 + 16);
        pln_tok_stream st = {0};
        bool ok = true;
        for (size_t k = 0; k < n; k++) {
            mine_n += pln_tok_stream_push(t, &st, ids[k], false, mine + mine_n, cap);
            json_t *s = json_array_get(steps, k);
            if (json_is_string(s)) { memcpy(hf + hf_n, json_string_value(s), json_string_length(s)); hf_n += json_string_length(s); }
            if (hf_n > mine_n || memcmp(hf, mine, hf_n) != 0) ok = false;
        }
        if (!ok && bad_steps++ < 5) {
            fprintf(stderr, "%s: stream case %zu: DecodeStream \"%.*s\" vs pollen \"%.*s\"\n", family, i, (int)hf_n, hf,
                    (int)mine_n, mine);
            print_ids("ids", ids, n);
        }
        free(mine); free(hf); free(ids);
    }
    CHECK(bad_steps == 0, "%s: %zu of %zu streams fall behind or differ from DecodeStream", family, bad_steps,
          json_array_size(streams));
    printf("%s: %zu streams against DecodeStream: %s\n", family, json_array_size(streams), bad_steps ? "NOT OK" : "OK");
    pln_tok_free(t);
    json_decref(fx);
    json_decref(added);
    free(path);
}

/* Mutants of the components family's tokenizer.json (every pipeline component is in its first
 * few kB): each must load or fail with the file named, and what loads must encode, decode and
 * stream any text without a fault (ASan in CI). */
static void test_hostile_components(void) {
    size_t flen = 0;
    char *ftext = read_gz("tests/fixtures/tokenizer/components/tokenizer.json.gz", &flen);
    CHECK(ftext != NULL, "read components tokenizer");
    if (!ftext) return;
    const char *json_start = strstr(ftext, "\"model\"");
    size_t head = json_start ? (size_t)(json_start - ftext) : flen;
    char *mpath = pln_xasprintf("%s/mutant-components.json", test_tmpdir());
    int loaded = 0, failed = 0, unnamed = 0;
    uint64_t rs = 7;
    static const char *texts[] = {"Hello  <mask> world [SEP]  cat-dog=1234567 ¿Qué? 👩‍💻 İ", "", " ", "<both>", "a\n\tb"};
    for (int k = 0; k < 800; k++) {
        size_t cut = flen;
        char *mb = malloc(flen + 1);
        memcpy(mb, ftext, flen);
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        if (k < 200) cut = (size_t)(rs >> 33) % (head + 1);
        else for (int j = 0; j < 1 + k % 4; j++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            mb[(rs >> 33) % head] = "\"{}[],:019 -a\x80\xff"[(rs >> 20) % 16];
        }
        FILE *mf = fopen(mpath, "wb");
        fwrite(mb, 1, cut, mf);
        fclose(mf);
        free(mb);
        pln_tokenizer *mt = pln_tok_load(mpath);
        if (!mt) {
            failed++;
            if (!strstr(pln_error(), mpath)) unnamed++;
            continue;
        }
        loaded++;
        for (size_t q = 0; q < sizeof texts / sizeof *texts; q++) {
            int32_t *ids;
            size_t n, dl, sl;
            if (pln_tok_encode_special(mt, texts[q], strlen(texts[q]), true, &ids, &n) != 0) continue;
            char *d = pln_tok_decode(mt, ids, n, false, &dl);
            char *st = stream_decode(mt, ids, n, true, &sl);
            free(d); free(st); free(ids);
        }
        pln_tok_free(mt);
    }
    printf("hostile components files: %d loaded, %d refused\n", loaded, failed);
    CHECK(failed > 0 && loaded > 0 && unnamed == 0, "component mutants: %d loaded, %d failed, %d errors without the path",
          loaded, failed, unnamed);
    free(mpath);
    free(ftext);
}

/* The real Mistral vocabulary by hand: known ids, BOS, streaming of byte-fallback runs and of
 * the leading space the Strip decoder removes, token bytes, and refusals of what is not
 * implemented, by JSON path. */
static void test_mistral_edges(void) {
    char *path = family_json("mistral");
    pln_tokenizer *t = path ? pln_tok_load(path) : NULL;
    CHECK(t != NULL, "mistral: load: %s", pln_error());
    if (!t) { free(path); return; }
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(pln_tok_encode(t, "Hello world", 11, &ids, &n) == 0 && n == 2 && ids[0] == 22557 && ids[1] == 1526,
          "mistral: \"Hello world\" is [22557, 1526]");
    free(ids);
    CHECK(pln_tok_encode_special(t, "Hello world", 11, true, &ids, &n) == 0 && n == 3 && ids[0] == 1 && ids[1] == 22557,
          "mistral: with add_special <s> comes first");
    free(ids);
    CHECK(pln_tok_encode_special(t, "", 0, true, &ids, &n) == 0 && n == 1 && ids[0] == 1, "mistral: empty text is just <s>");
    free(ids);
    CHECK(pln_tok_encode(t, "\n", 1, &ids, &n) == 0 && n == 2 && ids[0] == 28705 && ids[1] == 13,
          "mistral: \"\\n\" is \"▁\" then the byte token <0x0A>");
    free(ids);

    char out[256];
    size_t cap = sizeof out;
    pln_tok_stream st = {0};
    int32_t e2 = pln_tok_token_id(t, "<0xE2>"), x82 = pln_tok_token_id(t, "<0x82>"), xac = pln_tok_token_id(t, "<0xAC>");
    CHECK(e2 == 229 && x82 == 133 && xac == 175, "mistral: byte tokens <0xE2> <0x82> <0xAC> are 229 133 175");
    size_t k1 = pln_tok_stream_push(t, &st, e2, false, out, cap);
    size_t k2 = pln_tok_stream_push(t, &st, x82, false, out, cap);
    size_t k3 = pln_tok_stream_push(t, &st, xac, false, out, cap);
    CHECK(k1 == 0 && k2 == 0 && k3 == 3 && memcmp(out, "\xe2\x82\xac", 3) == 0, "mistral: € streamed from its three bytes");
    CHECK(pln_tok_stream_flush(t, &st, out, cap) == 0, "mistral: nothing left after €");
    st = (pln_tok_stream){0};
    pln_tok_stream_push(t, &st, e2, false, out, cap);
    pln_tok_stream_push(t, &st, x82, false, out, cap);
    CHECK(pln_tok_stream_flush(t, &st, out, cap) == 6 && memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd", 6) == 0,
          "mistral: a cut-short run flushes one U+FFFD per byte (HF's ByteFallback)");
    st = (pln_tok_stream){0};
    k1 = pln_tok_stream_push(t, &st, 22557, false, out, cap);
    CHECK(k1 == 5 && memcmp(out, "Hello", 5) == 0, "mistral: the first token loses its leading space (Strip)");
    k2 = pln_tok_stream_push(t, &st, 1526, false, out, cap);
    CHECK(k2 == 6 && memcmp(out, " world", 6) == 0, "mistral: later tokens keep theirs");
    st = (pln_tok_stream){0};
    CHECK(pln_tok_stream_push(t, &st, 1, true, out, cap) == 0, "mistral: skipped <s> writes nothing");
    k1 = pln_tok_stream_push(t, &st, 22557, true, out, cap);
    CHECK(k1 == 5 && memcmp(out, "Hello", 5) == 0, "mistral: after a skipped <s> the first shown token is stripped");
    st = (pln_tok_stream){0};
    pln_tok_stream_push(t, &st, 1, false, out, cap);
    k1 = pln_tok_stream_push(t, &st, 22557, false, out, cap);
    CHECK(k1 == 6 && memcmp(out, " Hello", 6) == 0, "mistral: after a shown <s> the space stays (\"<s> Hello\")");
    size_t bl;
    const uint8_t *b = pln_tok_token_bytes(t, 13, &bl);
    CHECK(b && bl == 1 && b[0] == '\n', "mistral: <0x0A>'s bytes are one newline");
    b = pln_tok_token_bytes(t, 22557, &bl);
    CHECK(b && bl == 6 && memcmp(b, " Hello", 6) == 0, "mistral: ▁Hello's bytes are \" Hello\"");
    size_t sl;
    const char *sp = pln_tok_token_str(t, 22557, &sl);
    CHECK(sp && sl == 8 && memcmp(sp, "\xe2\x96\x81Hello", 8) == 0, "mistral: token 22557 is spelled ▁Hello");
    pln_tok_free(t);

    json_error_t err;
    json_t *orig = json_load_file(path, 0, &err), *v;
    CHECK(orig != NULL, "mistral json: %s", err.text);
    if (orig) {
        v = json_deep_copy(orig);
        json_object_set_new(json_array_get(json_object_get(json_object_get(v, "decoder"), "decoders"), 3), "stop",
                            json_integer(1));
        expect_load_error(v, "strip-stop.json", "decoder.decoders[3]: a Strip decoder after Fuse with stop > 0");
        json_decref(v);
        v = json_deep_copy(orig);
        json_object_set_new(json_object_get(v, "pre_tokenizer"), "replacement", json_string("ab"));
        expect_load_error(v, "metaspace-repl.json", "pre_tokenizer (Metaspace): \"replacement\" is not one character");
        json_decref(v);
        v = json_deep_copy(orig);
        json_object_del(json_object_get(json_object_get(v, "post_processor"), "special_tokens"), "<s>");
        expect_load_error(v, "template-ids.json", "post_processor: special token \"<s>\" has no entry");
        json_decref(v);
        v = json_deep_copy(orig);
        json_array_set_new(json_object_get(json_object_get(json_object_get(json_object_get(v, "post_processor"),
                                                                           "special_tokens"), "<s>"), "ids"),
                           0, json_integer(32000));
        expect_load_error(v, "template-range.json", "post_processor adds id 32000, which is not a token");
        json_decref(v);
        v = json_deep_copy(orig);
        json_object_set_new(json_object_get(v, "model"), "type", json_string("Unigram"));
        expect_load_error(v, "unigram.json", "model.type \"Unigram\" is not supported");
        json_decref(v);
        v = json_deep_copy(orig);
        json_object_set_new(json_object_get(v, "model"), "dropout", json_real(0.1));
        expect_load_error(v, "dropout.json", "model.dropout must be null");
        json_decref(v);
        v = json_deep_copy(orig);
        json_object_set_new(v, "decoder", json_pack("{s:s,s:[{s:s}]}", "type", "Sequence", "decoders", "type", "CTC"));
        expect_load_error(v, "ctc.json", "decoder.decoders[0]: decoder \"CTC\" is not supported");
        json_decref(v);
        json_decref(orig);
    }
    free(path);
}

/* ---- synthetic BLOOM-size tokenizer.json --------------------------------------------------- */

#define SYN_VOCAB 250680

typedef struct { char **keys; size_t mask; } str_set;

static uint64_t syn_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (uint8_t)*s; h *= 1099511628211ull; }
    return h ^ (h >> 31);
}

/* Inserts s (owned by the caller's table) if absent; returns false if already present. */
static bool set_add(str_set *s, char *k) {
    size_t i = syn_hash(k) & s->mask;
    while (s->keys[i]) {
        if (strcmp(s->keys[i], k) == 0) return false;
        i = (i + 1) & s->mask;
    }
    s->keys[i] = k;
    return true;
}

static void json_put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Writes a tokenizer.json with BLOOM's structure and size: 4 specials, the 256 ByteLevel
 * characters, then merges of an existing token with (mostly) a short one, each a new string.
 * Returns 0 on success. */
static int gen_synthetic(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    char **tok = calloc(SYN_VOCAB, sizeof *tok);
    int32_t *ma = calloc(SYN_VOCAB, sizeof *ma), *mb = calloc(SYN_VOCAB, sizeof *mb);
    str_set set = {calloc(1u << 20, sizeof(char *)), (1u << 20) - 1};
    static const char *specials[4] = {"<unk>", "<s>", "</s>", "<pad>"};
    for (int i = 0; i < 4; i++) { tok[i] = strdup(specials[i]); set_add(&set, tok[i]); }
    int n = 4;
    for (int b = 0, k = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + k++);
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); }
        tok[n] = strdup(u);
        set_add(&set, tok[n]);
        n++;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    while (n < SYN_VOCAB) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int a = 4 + (int)((x >> 20) % (uint64_t)(n - 4));
        int b = (x & 7) < 6 ? 4 + (int)((x >> 40) % 256) : 4 + (int)((x >> 40) % (uint64_t)((n - 4) < 4000 ? (n - 4) : 4000));
        size_t la = strlen(tok[a]), lb = strlen(tok[b]);
        if (la + lb > 48) continue;
        char *s = malloc(la + lb + 1);
        memcpy(s, tok[a], la); memcpy(s + la, tok[b], lb + 1);
        if (!set_add(&set, s)) { free(s); continue; }
        tok[n] = s; ma[n] = a; mb[n] = b;
        n++;
    }
    fputs("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[", f);
    for (int i = 0; i < 4; i++)
        fprintf(f, "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                   "\"normalized\":false,\"special\":true}", i ? "," : "", i, specials[i]);
    fputs("],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
          "\"pattern\":{\"Regex\":\" ?[^(\\\\s|[.,!?…。，、।۔،])]+\"},\"behavior\":\"Isolated\",\"invert\":false},"
          "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
          "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
          "\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
          "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
          "\"vocab\":{", f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        json_put_str(f, tok[i]);
        fprintf(f, ":%d", i);
    }
    fputs("},\"merges\":[", f);
    for (int i = 260; i < n; i++) {
        if (i > 260) fputc(',', f);
        fputc('"', f);
        for (int side = 0; side < 2; side++) {
            for (const char *s = tok[side ? mb[i] : ma[i]]; *s; s++) {
                if (*s == '"' || *s == '\\') fputc('\\', f);
                fputc(*s, f);
            }
            if (!side) fputc(' ', f);
        }
        fputc('"', f);
    }
    fputs("]}}\n", f);
    int rc = fclose(f);
    for (int i = 0; i < n; i++) free(tok[i]);
    free(tok); free(ma); free(mb); free(set.keys);
    return rc ? -1 : 0;
}

static void test_synthetic(void) {
    char *path = pln_xasprintf("%s/synthetic-bloom.json", test_tmpdir());
    CHECK(gen_synthetic(path) == 0, "synthetic tokenizer.json written");
    pln_map mp;
    uint64_t size = 0;
    if (pln_map_open(&mp, path) == 0) { size = mp.size; pln_map_close(&mp); }
    double t0 = pln_now();
    pln_tokenizer *t = pln_tok_load(path);
    double dt = pln_now() - t0;
    printf("synthetic BLOOM-size tokenizer.json: %.1f MB, %d tokens, loaded in %.3f s\n", size / 1e6, SYN_VOCAB, dt);
    CHECK(t != NULL, "synthetic loads: %s", pln_error());
    /* the load time is a figure (printed above; tools/bench/tokenizer.sh measures it), not a test */
    if (t) {
        CHECK(pln_tok_vocab_size(t) == SYN_VOCAB, "synthetic vocab %lld", (long long)pln_tok_vocab_size(t));
        test_roundtrip(t, "synthetic", 7);
    }
    pln_tok_free(t);
    unlink(path);
    free(path);
}

/* ---- benchmark mode ----------------------------------------------------------------------- */

static int bench(const char *tok_path, const char *text_path) {
    double best = 1e9, best_cpu = 1e9;
    pln_tokenizer *t = NULL;
    for (int r = 0; r < 3; r++) {
        /* CPU time too: on a shared machine the wall time mostly measures the neighbours */
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        double t0 = pln_now();
        pln_tokenizer *x = pln_tok_load(tok_path);
        double dt = pln_now() - t0;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
        if (!x) { fprintf(stderr, "%s\n", pln_error()); return 1; }
        if (dt < best) best = dt;
        if (cpu < best_cpu) best_cpu = cpu;
        if (t) pln_tok_free(t);
        t = x;
    }
    printf("load %s: %.3f s wall, %.3f s CPU (best of 3), %lld tokens\n", tok_path, best, best_cpu,
           (long long)pln_tok_vocab_size(t));
    char *text;
    size_t len = 0;
    if (text_path) {
        text = pln_read_small_file(text_path, (size_t)1 << 30, &len);
        if (!text) { fprintf(stderr, "%s\n", pln_error()); return 1; }
    } else {
        /* the fixture texts (several scripts, code, numbers, random mixes) repeated to 4 MB */
        json_error_t err;
        json_t *enc = json_load_file(FIX_ENC, 0, &err);
        if (!enc) { fprintf(stderr, "%s: %s\n", FIX_ENC, err.text); return 1; }
        size_t cap = 4u << 20;
        text = malloc(cap + 4096);
        while (len < cap) {
            size_t i;
            json_t *c;
            json_array_foreach(json_object_get(enc, "cases"), i, c) {
                json_t *s = json_object_get(c, "text");
                if (len + json_string_length(s) + 1 > cap + 4096) break;
                memcpy(text + len, json_string_value(s), json_string_length(s));
                len += json_string_length(s);
                text[len++] = ' ';
            }
        }
        json_decref(enc);
    }
    int32_t *ids;
    size_t n;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = pln_now();
        if (pln_tok_encode(t, text, len, &ids, &n) != 0) { fprintf(stderr, "%s\n", pln_error()); return 1; }
        double dt = pln_now() - t0;
        printf("encode (%s word cache): %.2f MB in %.3f s = %.2f MB/s, %zu tokens (%.2f bytes/token)\n",
               pass ? "warm" : "cold", len / 1e6, dt, len / 1e6 / dt, n, (double)len / (double)n);
        if (pass == 0) free(ids);
    }
    double t0 = pln_now();
    size_t dl;
    char *d = pln_tok_decode(t, ids, n, false, &dl);
    double dt = pln_now() - t0;
    printf("decode: %.2f MB/s, round trip %s\n", dl / 1e6 / dt, dl == len && memcmp(d, text, len) == 0 ? "OK" : "NOT OK");
    free(d); free(ids); free(text);
    pln_tok_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--gen-synthetic") == 0) {
        if (gen_synthetic(argv[2]) != 0) { perror(argv[2]); return 1; }
        return 0;
    }
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "--bench") == 0) return bench(argv[2], argc == 4 ? argv[3] : NULL);
    test_begin("test_tokenizer");
    json_error_t err;
    json_t *enc = json_load_file(FIX_ENC, JSON_ALLOW_NUL, &err);
    CHECK(enc != NULL, "%s: %s", FIX_ENC, err.text);
    pln_tokenizer *t = pln_tok_load(FIX_TOK);
    CHECK(t != NULL, "load %s: %s", FIX_TOK, pln_error());
    if (t && enc) {
        test_fixture(t, enc, "fixture");
        test_edges(t);
        test_roundtrip(t, "fixture", 1);
        test_threads(t, enc);
        test_variants(enc);
    }
    pln_tok_free(t);
    json_decref(enc);
    static const char *families[] = {"mistral", "llama2", "llama3", "qwen2", "components", "components2", "components3",
                                     "gpt2", "subword"};
    for (size_t k = 0; k < sizeof families / sizeof *families; k++) test_family(families[k]);
    test_mistral_edges();
    test_hostile_components();
    test_synthetic();
    return test_done();
}
