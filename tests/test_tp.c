/* test_tp.c — the "bloom-tp-v1" split plan and the fp16/int8 conversions, against values
 * computed by hand. */
#include "formats/hf.h"
#include "formats/shard.h"
#include "formats/tp.h"
#include "kernels/pln_math.h"
#include "tests/test.h"

#include <stdlib.h>

static const pln_tp_entry *find(const pln_tp_entry *e, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

static void test_order_and_shapes(void) {
    pln_tp_model m = {.vocab_size = 1003, .hidden = 96, .n_head = 6, .n_layer = 2};
    pln_tp_opts o = {.tp = 3};
    pln_tp_entry *e;
    size_t n;
    CHECK(pln_tp_plan(&m, &o, 1, &e, &n) == 0, "plan: %s", pln_error());
    CHECK(n == 3 + 2 * 12 + 2, "fp16 plan has %zu tensors, want 29", n);
    static const char *want[] = {
        "word_embeddings.weight", "word_embeddings_layernorm.weight", "word_embeddings_layernorm.bias",
        "h.0.input_layernorm.weight", "h.0.input_layernorm.bias",
        "h.0.self_attention.query_key_value.weight", "h.0.self_attention.query_key_value.bias",
        "h.0.self_attention.dense.weight", "h.0.self_attention.dense.bias",
        "h.0.post_attention_layernorm.weight", "h.0.post_attention_layernorm.bias",
        "h.0.mlp.dense_h_to_4h.weight", "h.0.mlp.dense_h_to_4h.bias",
        "h.0.mlp.dense_4h_to_h.weight", "h.0.mlp.dense_4h_to_h.bias", "h.1.input_layernorm.weight"};
    for (size_t i = 0; i < sizeof want / sizeof want[0] && i < n; i++)
        CHECK(!strcmp(e[i].name, want[i]), "entry %zu is %s, want %s", i, e[i].name, want[i]);
    CHECK(!strcmp(e[n - 2].name, "ln_f.weight") && !strcmp(e[n - 1].name, "ln_f.bias"), "ln_f last");
    /* vocab 1003 padded to 1005 for TP 3: 335 rows per rank, rank 1 takes rows 335..669. */
    CHECK(pln_tp_vocab_padded(1003, 3) == 1005, "padded vocab");
    CHECK(e[0].shape[0] == 335 && e[0].shape[1] == 96 && e[0].row0 == 335 && e[0].rows == 335 && e[0].pad_rows == 0,
          "embedding rank 1: shape [%lld, %lld] row0 %lld rows %lld pad %lld", (long long)e[0].shape[0],
          (long long)e[0].shape[1], (long long)e[0].row0, (long long)e[0].rows, (long long)e[0].pad_rows);
    const pln_tp_entry *q = find(e, n, "h.1.self_attention.query_key_value.weight");
    CHECK(q && q->shape[0] == 96 && q->shape[1] == 96 && q->row0 == 96 && q->rows == 96 && q->split == PLN_TP_SPLIT_ROWS,
          "qkv rank 1 of 3 takes rows [96, 192)");
    const pln_tp_entry *qb = find(e, n, "h.1.self_attention.query_key_value.bias");
    CHECK(qb && qb->ndim == 1 && qb->shape[0] == 96 && qb->row0 == 96 && qb->cols == 1, "qkv bias rank 1");
    const pln_tp_entry *d = find(e, n, "h.0.self_attention.dense.weight");
    CHECK(d && d->shape[0] == 96 && d->shape[1] == 32 && d->col0 == 32 && d->cols == 32 && d->rows == 96, "dense columns [32, 64)");
    const pln_tp_entry *db = find(e, n, "h.0.self_attention.dense.bias");
    CHECK(db && db->shape[0] == 96 && db->split == PLN_TP_SPLIT_NONE, "dense bias replicated");
    const pln_tp_entry *up = find(e, n, "h.0.mlp.dense_h_to_4h.weight");
    CHECK(up && up->shape[0] == 128 && up->row0 == 128 && up->src_shape[0] == 384, "h_to_4h rows [128, 256)");
    const pln_tp_entry *dn = find(e, n, "h.0.mlp.dense_4h_to_h.weight");
    CHECK(dn && dn->shape[0] == 96 && dn->shape[1] == 128 && dn->col0 == 128 && dn->src_shape[1] == 384, "4h_to_h columns [128, 256)");
    for (size_t i = 0; i < n; i++) CHECK(e[i].dtype == PLN_DTYPE_F16, "%s is F16", e[i].name);
    free(e);
}

/* Every source element is taken by exactly one rank (split tensors) or by every rank
 * (replicated); pad rows exist only in the embedding and only at the end of the vocabulary. */
static void test_coverage(int64_t heads, int64_t hidden, int tp) {
    pln_tp_model m = {.vocab_size = 1003, .hidden = hidden, .n_head = heads, .n_layer = 1};
    pln_tp_opts o = {.tp = tp, .int8 = true};
    pln_tp_entry *plans[8];
    size_t n[8];
    for (int r = 0; r < tp; r++) CHECK(pln_tp_plan(&m, &o, r, &plans[r], &n[r]) == 0, "plan %s", pln_error());
    for (size_t i = 0; i < n[0]; i++) {
        const pln_tp_entry *e0 = &plans[0][i];
        if (e0->transform == PLN_TP_QUANT_SCALE) continue;
        int64_t R = e0->src_shape[0], C = e0->src_shape[1];
        unsigned char *seen = calloc((size_t)(R * C), 1);
        int64_t pads = 0;
        for (int r = 0; r < tp; r++) {
            const pln_tp_entry *e = &plans[r][i];
            CHECK(!strcmp(e->name, e0->name), "same order on every rank");
            pads += e->pad_rows;
            CHECK(e->rows + e->pad_rows == e->shape[0] && e->cols == e->shape[1], "%s: shape = slice + pad", e->name);
            for (int64_t a = e->row0; a < e->row0 + e->rows; a++)
                for (int64_t b = e->col0; b < e->col0 + e->cols; b++) seen[a * C + b]++;
        }
        int want = e0->split == PLN_TP_SPLIT_NONE ? tp : 1;
        int64_t bad = 0;
        for (int64_t k = 0; k < R * C; k++) bad += seen[k] != want;
        CHECK(bad == 0, "%s TP %d: %lld source elements not covered %d time(s)", e0->name, tp, (long long)bad, want);
        int64_t want_pad = !strcmp(e0->name, "word_embeddings.weight") ? pln_tp_vocab_padded(1003, tp) - 1003 : 0;
        CHECK(pads == want_pad, "%s TP %d: %lld pad rows, want %lld", e0->name, tp, (long long)pads, (long long)want_pad);
        free(seen);
    }
    for (int r = 0; r < tp; r++) free(plans[r]);
}

/* Rank r's qkv rows are heads [r*h/N, (r+1)*h/N), each with its q, k, v rows: in HF's layout row
 * (head*3 + part)*head_dim + d, so rank r's local row j maps to head r*h/N + j/(3*head_dim). */
static void test_qkv_heads(void) {
    int64_t heads = 6, hidden = 96, hd = 16;
    pln_tp_model m = {.vocab_size = 1003, .hidden = hidden, .n_head = heads, .n_layer = 1};
    for (int tp = 1; tp <= 6; tp++) {
        if (heads % tp) continue;
        pln_tp_opts o = {.tp = tp};
        for (int r = 0; r < tp; r++) {
            pln_tp_entry *e;
            size_t n;
            pln_tp_plan(&m, &o, r, &e, &n);
            const pln_tp_entry *q = find(e, n, "h.0.self_attention.query_key_value.weight");
            int ok = q != NULL;
            for (int64_t j = 0; q && j < q->shape[0]; j++) {
                int64_t src_row = q->row0 + j;
                int64_t head = src_row / (3 * hd), part = (src_row / hd) % 3, d = src_row % hd;
                int64_t want_head = r * heads / tp + j / (3 * hd), want_part = (j / hd) % 3, want_d = j % hd;
                ok &= head == want_head && part == want_part && d == want_d;
            }
            CHECK(ok, "TP %d rank %d: qkv rows are heads [%lld, %lld) with q,k,v", tp, r,
                  (long long)(r * heads / tp), (long long)((r + 1) * heads / tp));
            free(e);
        }
    }
}

static void test_errors(void) {
    pln_tp_model m = {.vocab_size = 1003, .hidden = 96, .n_head = 6, .n_layer = 2};
    pln_tp_opts o = {.tp = 4};
    pln_tp_entry *e;
    size_t n;
    CHECK(pln_tp_plan(&m, &o, 0, &e, &n) == -1, "TP 4 of 6 heads refused");
    CHECK(strstr(pln_error(), "TP sizes that work: 1, 2, 3, 6") != NULL, "error lists sizes: %s", pln_error());
    o.tp = 2;
    o.int8 = true;
    o.group_size = 64; /* 96 is not a multiple of 64 */
    CHECK(pln_tp_check(&m, &o) == -1 && strstr(pln_error(), "--group-size 64"), "bad group: %s", pln_error());
    o.group_size = 16;
    CHECK(pln_tp_check(&m, &o) == 0, "group 16 ok: %s", pln_error());
    pln_tp_opts o2 = {.tp = 2, .quantize_embedding = true};
    CHECK(pln_tp_check(&m, &o2) == -1, "--quantize-embedding needs int8");
    CHECK(pln_tp_plan(&m, &(pln_tp_opts){.tp = 2}, 2, &e, &n) == -1, "rank out of range");
    pln_tp_model bad = m;
    bad.hidden = 100;
    CHECK(pln_tp_check(&bad, &(pln_tp_opts){.tp = 1}) == -1 && strstr(pln_error(), "hidden_size"), "hidden %% n_head");
}

static void test_int8_plan(void) {
    pln_tp_model m = {.vocab_size = 1003, .hidden = 64, .n_head = 4, .n_layer = 1};
    pln_tp_opts o = {.tp = 4, .int8 = true, .group_size = 16, .quantize_embedding = true};
    pln_tp_entry *e;
    size_t n;
    CHECK(pln_tp_plan(&m, &o, 3, &e, &n) == 0, "int8 plan: %s", pln_error());
    CHECK(n == 4 + 16 + 2, "int8 plan has %zu tensors", n);
    CHECK(e[0].dtype == PLN_DTYPE_I8 && !strcmp(e[1].name, "word_embeddings.weight_scale") && e[1].shape[1] == 4,
          "embedding int8 + scale [rows, 64/16]");
    /* vocab 1003 -> 1004, 251 rows per rank: rank 3 takes 753..1002 (250 rows) + 1 pad row. */
    CHECK(e[0].row0 == 753 && e[0].rows == 250 && e[0].pad_rows == 1 && e[1].pad_rows == 1, "rank 3 pads one vocab row");
    const pln_tp_entry *d = find(e, n, "h.0.self_attention.dense.weight");
    CHECK(d && d[1].transform == PLN_TP_QUANT_SCALE && !strcmp(d[1].name, "h.0.self_attention.dense.weight_scale") &&
          d[1].shape[0] == 64 && d[1].shape[1] == 1 && d->group == 16, "dense scale [64, 16/16]");
    CHECK(pln_tp_entry_nbytes(d) == 64 * 16 && pln_tp_entry_nbytes(&d[1]) == 64 * 2, "nbytes");
    CHECK(!strcmp(d[2].name, "h.0.self_attention.dense.bias"), "bias after scale");
    free(e);
    o.group_size = 0;
    o.quantize_embedding = false;
    pln_tp_plan(&m, &o, 0, &e, &n);
    CHECK(e[0].dtype == PLN_DTYPE_F16, "embedding stays F16");
    const pln_tp_entry *up = find(e, n, "h.0.mlp.dense_h_to_4h.weight_scale");
    CHECK(up && up->shape[0] == 64 && up->shape[1] == 1 && up->group == 64, "per-channel scale");
    free(e);
}

static void test_f16(void) {
    uint64_t c = 0, nf = 0;
    float in[] = {1.0f, 65504.0f, 65519.0f, 65520.0f, -1e6f, 1.0009765625f + 0.00048828125f, 5.96e-8f, INFINITY};
    uint16_t out[8];
    pln_tp_to_f16(PLN_DTYPE_F32, in, out, 8, &c, &nf);
    CHECK(out[0] == 0x3c00 && out[1] == 0x7bff && out[2] == 0x7bff, "1.0, max, 65519 rounds to max");
    CHECK(out[3] == 0x7bff && out[4] == 0xfbff, "65520 and -1e6 clamp to +-65504");
    CHECK(c == 2, "clamps counted: %llu", (unsigned long long)c);
    CHECK(out[5] == 0x3c02, "tie 1+1.5*2^-10 rounds to even (0x3c02), got 0x%04x", out[5]);
    CHECK(out[6] == 0x0001, "smallest subnormal");
    CHECK(nf == 1, "inf counted as non-finite");
    /* bf16 source: 1.5 (0x3fc0), 70000 (0x4789) clamps */
    uint16_t bf[] = {0x3fc0, 0x4789, 0xc789};
    c = nf = 0;
    pln_tp_to_f16(PLN_DTYPE_BF16, bf, out, 3, &c, &nf);
    CHECK(out[0] == 0x3e00 && out[1] == 0x7bff && out[2] == 0xfbff && c == 2 && nf == 0, "bf16 -> f16");
    uint16_t h[] = {0x1234, 0x7c00, 0xfe00};
    c = nf = 0;
    pln_tp_to_f16(PLN_DTYPE_F16, h, out, 3, &c, &nf);
    CHECK(out[0] == 0x1234 && nf == 2 && c == 0, "f16 copied bit for bit, inf/nan counted");
    /* exhaustive: every bf16 value converts as RNE of its exact float value */
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t bb = (uint16_t)b, o1;
        uint64_t c1 = 0, n1 = 0;
        pln_tp_to_f16(PLN_DTYPE_BF16, &bb, &o1, 1, &c1, &n1);
        float f = pln_bf16_to_f32(bb);
        if (!isfinite(f)) continue;
        if (fabsf(f) >= 65520.0f) { bad += c1 != 1; continue; }
        /* nearest: no other fp16 is closer */
        double v = pln_f16_to_f32(o1), d = fabs(v - f);
        double up = pln_f16_to_f32((uint16_t)(o1 + 1)), dn = (o1 & 0x7fff) ? pln_f16_to_f32((uint16_t)(o1 - 1)) : v;
        if (fabs(up - f) < d || fabs(dn - f) < d) bad++;
    }
    CHECK(bad == 0, "%d bf16 values not rounded to nearest", bad);
    float ff[] = {1.0f, NAN};
    float fo[2];
    nf = 0;
    pln_tp_to_f32(PLN_DTYPE_F32, ff, fo, 2, &nf);
    CHECK(nf == 1 && fo[0] == 1.0f, "to_f32 counts NaN");
    nf = 0;
    pln_tp_to_f32(PLN_DTYPE_I32, ff, fo, 2, &nf);
    CHECK(nf == 2, "unconvertible dtype is all non-finite");
    CHECK(!pln_tp_dtype_convertible(PLN_DTYPE_I64) && pln_tp_dtype_convertible(PLN_DTYPE_BF16), "convertible");
}

/* The fast paths (fp16 copy-and-count, fp16 -> float, int8 rows in blocks) against the plain
 * per-value definitions, bit for bit, including unaligned pointers and odd lengths. */
static void test_fast_paths(void) {
    /* every fp16 value, with a one-element offset so the vector loads are unaligned */
    uint16_t *all = malloc((65536 + 8) * 2);
    float *f = malloc((65536 + 8) * 4);
    uint16_t *cp = malloc((65536 + 8) * 2);
    for (uint32_t i = 0; i < 65536; i++) all[i + 1] = (uint16_t)i;
    int bad = 0;
    for (size_t n = 0; n <= 65536; n += (n < 40 ? 1 : 65536 - 40)) {
        uint64_t nf = 0, nf_want = 0, c = 0, nf16 = 0;
        pln_tp_to_f32(PLN_DTYPE_F16, all + 1, f + 1, n, &nf);
        pln_tp_to_f16(PLN_DTYPE_F16, all + 1, cp + 1, n, &c, &nf16);
        for (size_t i = 0; i < n; i++) {
            float want = pln_f16_to_f32(all[i + 1]);
            bad += memcmp(&f[i + 1], &want, 4) != 0;
            bad += cp[i + 1] != all[i + 1];
            nf_want += (all[i + 1] & 0x7c00) == 0x7c00;
        }
        CHECK(nf == nf_want && nf16 == nf_want && c == 0, "n %zu: non-finite counted %llu / %llu, want %llu", n,
              (unsigned long long)nf, (unsigned long long)nf16, (unsigned long long)nf_want);
    }
    CHECK(bad == 0, "%d fp16 values differ from pln_f16_to_f32 / the source bits", bad);
    /* bf16 -> fp16 (a table): every value, against pln_f32_to_f16 with the clamp to +-65504, and
     * the clamp and inf/NaN counts */
    uint16_t *o16 = malloc((65536 + 8) * 2);
    uint64_t c = 0, nf = 0, c_want = 0, nf_want = 0;
    pln_tp_to_f16(PLN_DTYPE_BF16, all + 1, o16 + 1, 65536, &c, &nf);
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float v = pln_bf16_to_f32((uint16_t)i);
        uint16_t want = pln_f32_to_f16(v);
        if (!isfinite(v)) nf_want++;
        else if (fabsf(v) >= 65520.0f) { c_want++; want = (uint16_t)((i & 0x8000) | 0x7bff); }
        bad += o16[i + 1] != want;
    }
    CHECK(bad == 0 && c == c_want && nf == nf_want, "bf16 -> fp16: %d values differ; clamps %llu (want %llu), non-finite %llu (want %llu)",
          bad, (unsigned long long)c, (unsigned long long)c_want, (unsigned long long)nf, (unsigned long long)nf_want);
    free(o16);
    free(all); free(f); free(cp);

    /* int8 in blocks of rows == row by row, for group sizes that take the block path (multiples
     * of 4) and one that does not, and row counts that leave a remainder */
    int64_t groups[] = {16, 64, 6, 4, 12};   /* AVX2 path (x % 8), SSE2 path (x % 4), plain C */
    uint32_t x = 99;
    for (int gi = 0; gi < 5; gi++) {
        int64_t cols = 96 - 96 % groups[gi], group = groups[gi], ng = cols / group;
        for (int64_t nr = 1; nr <= 9; nr += 4) {
            float *w = malloc((size_t)(nr * cols) * sizeof(float));
            for (int64_t i = 0; i < nr * cols; i++) {
                x = x * 1664525u + 1013904223u;
                float v = ((float)(x >> 8) / 16777216.0f - 0.5f) * (i % 7 == 0 ? 3.0f : 0.05f);
                w[i] = (i / cols == 1) ? 0.0f : v;            /* one all-zero row: scale 1 */
                if (i % 41 == 3) w[i] = v * 1e-30f;           /* tiny values next to normal ones */
            }
            int8_t *q1 = malloc((size_t)(nr * cols)), *q2 = malloc((size_t)(nr * cols));
            uint16_t *s1 = malloc((size_t)(nr * ng) * 2), *s2 = malloc((size_t)(nr * ng) * 2);
            pln_tp_qerr *e1 = calloc((size_t)nr, sizeof *e1), *e2 = calloc((size_t)nr, sizeof *e2);
            for (int64_t r = 0; r < nr; r++) pln_tp_quant_row(w + r * cols, cols, group, q1 + r * cols, s1 + r * ng, &e1[r]);
            pln_tp_quant_rows(w, (size_t)cols, nr, cols, group, q2, s2, e2);
            CHECK(!memcmp(q1, q2, (size_t)(nr * cols)) && !memcmp(s1, s2, (size_t)(nr * ng) * 2),
                  "quant_rows group %lld, %lld rows: q/scales differ from quant_row", (long long)group, (long long)nr);
            CHECK(!memcmp(e1, e2, (size_t)nr * sizeof *e1), "quant_rows group %lld, %lld rows: error sums differ (not bit-identical)",
                  (long long)group, (long long)nr);
            free(w); free(q1); free(q2); free(s1); free(s2); free(e1); free(e2);
        }
    }
}

static void test_quant(void) {
    /* One row, two groups of 4: hand-computed. Group 0 absmax 1.27 -> scale 0.01 (fp16 0.01000213...). */
    float w[8] = {1.27f, -0.5f, 0.0f, 0.004f, 0, 0, 0, 0};
    int8_t q[8];
    uint16_t s[2];
    pln_tp_qerr err = {0};
    pln_tp_quant_row(w, 8, 4, q, s, &err);
    float s0 = pln_f16_to_f32(s[0]);
    CHECK(s[0] == pln_f32_to_f16(1.27f / 127.0f), "scale = absmax/127 in fp16");
    CHECK(q[0] == 127 && q[1] == (int8_t)roundf(-0.5f / s0) && q[2] == 0 && q[3] == 0, "q = round(w/scale): %d %d %d %d", q[0], q[1], q[2], q[3]);
    CHECK(s[1] == 0x3c00 && q[4] == 0 && q[7] == 0, "zero group: scale 1, q 0");
    double want_max = 0, e2 = 0, r2 = 0;
    for (int j = 0; j < 4; j++) {
        double d = fabs((double)w[j] - q[j] * (double)s0);
        if (d > want_max) want_max = d;
        e2 += d * d;
        r2 += (double)w[j] * w[j];
    }
    CHECK_CLOSE(err.max_abs, want_max, 1e-12, "max abs error");
    CHECK_CLOSE(pln_tp_qerr_rel_rms(&err), sqrt(e2 / r2), 1e-12, "relative rms");
    CHECK(err.max_abs <= s0 / 2 + 1e-9, "error at most half a step");
    CHECK(err.n == 8, "count");
    /* scale range: huge and tiny groups */
    CHECK(pln_tp_scale_f16(1e9f) == 0x7bff && pln_tp_scale_f16(1e-12f) == 0x0001 && pln_tp_scale_f16(0) == 0x3c00, "scale clamps");
    /* per-channel on a random row: error within half a step everywhere */
    float row[256];
    int8_t qq[256];
    uint16_t ss[1];
    uint32_t x = 12345;
    for (int j = 0; j < 256; j++) { x = x * 1664525u + 1013904223u; row[j] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.2f; }
    pln_tp_qerr e3 = {0};
    pln_tp_quant_row(row, 256, 256, qq, ss, &e3);
    float sc = pln_f16_to_f32(ss[0]);
    int worst = 0;
    for (int j = 0; j < 256; j++) worst |= fabsf(row[j] - qq[j] * sc) > sc * 0.5f * 1.0001f;
    CHECK(!worst && pln_tp_qerr_rel_rms(&e3) < 0.01, "per-channel error bound (rel rms %.4g)", pln_tp_qerr_rel_rms(&e3));
    /* the fast rounding equals pln_quant_i8 everywhere: ties, near-ties, clamps, NaN-free extremes */
    int diff = 0;
    float invs[] = {1.0f, 3.0f, 0.37f, 100.0f, 12345.0f};
    for (int k = 0; k < 5; k++)
        for (int32_t i = -300000; i <= 300000; i++) {
            float v = (float)i / 1024.0f;                 /* hits exact .5 ties at many scales */
            diff += pln_tp_quant_one(v, invs[k]) != pln_quant_i8(v, invs[k]);
            float y = nextafterf(v, 1e9f), z = nextafterf(v, -1e9f);
            diff += pln_tp_quant_one(y, invs[k]) != pln_quant_i8(y, invs[k]);
            diff += pln_tp_quant_one(z, invs[k]) != pln_quant_i8(z, invs[k]);
        }
    uint32_t st = 7;
    for (int i = 0; i < 1000000; i++) {
        st = st * 1664525u + 1013904223u;
        float v = pln_bits_f32(st & 0xbfffffffu);       /* random finite floats of every exponent */
        if (!isfinite(v)) continue;
        diff += pln_tp_quant_one(v, 1.0f) != pln_quant_i8(v, 1.0f);
    }
    diff += pln_tp_quant_one(1e30f, 1.0f) != 127 || pln_tp_quant_one(-1e30f, 1.0f) != -127;
    CHECK(diff == 0, "fast int8 rounding differs from pln_quant_i8 in %d cases", diff);
    pln_tp_qerr a = {1, 4, 0.5, 2}, b = {3, 12, 0.25, 3};
    pln_tp_qerr_merge(&a, &b);
    CHECK(a.err2 == 4 && a.ref2 == 16 && a.max_abs == 0.5 && a.n == 5 && pln_tp_qerr_rel_rms(&a) == 0.5, "merge");
}

/* int4: packed U8 [rows, cols / 2] + F16 scales [rows, cols / G] for the four linear weights; the
 * embedding F16, or I8 with --quantize-embedding; group sizes the packing cannot hold refused. */
static void test_int4_plan(void) {
    pln_tp_model m = {.vocab_size = 1003, .hidden = 256, .n_head = 4, .n_layer = 1};
    pln_tp_opts o = {.tp = 2, .int4 = true, .group_size = 64, .quantize_embedding = true};
    pln_tp_entry *e;
    size_t n;
    CHECK(pln_tp_plan(&m, &o, 1, &e, &n) == 0, "int4 plan: %s", pln_error());
    CHECK(n == 4 + 16 + 2, "int4 plan has %zu tensors", n);
    CHECK(e[0].dtype == PLN_DTYPE_I8 && e[0].transform == PLN_TP_QUANT_I8 && e[1].shape[1] == 256 / 64, "embedding is int8 with groups of 64");
    const pln_tp_entry *q = &e[6], *qs = &e[7];   /* h.0 query_key_value weight and its scales */
    CHECK(!strcmp(q->name, "h.0.self_attention.query_key_value.weight") && q->dtype == PLN_DTYPE_U8 && q->transform == PLN_TP_QUANT_I4 &&
          q->shape[0] == 384 && q->shape[1] == 128 && q->cols == 256 && q->group == 64, "qkv: U8 [384, 128] of 256 columns, group 64");
    CHECK(pln_tp_row_bytes(q) == 128 && pln_tp_entry_nbytes(q) == 384 * 128, "qkv row bytes %zu", pln_tp_row_bytes(q));
    CHECK(qs->transform == PLN_TP_QUANT_SCALE && qs->dtype == PLN_DTYPE_F16 && qs->shape[0] == 384 && qs->shape[1] == 4, "qkv scales [384, 4]");
    const pln_tp_entry *d = &e[9];                /* dense: columns split, 128 per rank */
    CHECK(!strcmp(d->name, "h.0.self_attention.dense.weight") && d->shape[1] == 64 && d->cols == 128 && e[10].shape[1] == 2,
          "dense: U8 [256, 64] + scales [256, 2]");
    free(e);
    pln_tp_opts bad = {.tp = 1, .int4 = true, .group_size = 16};
    CHECK(pln_tp_check(&m, &bad) == -1 && strstr(pln_error(), "32, 64 or 128"), "int4 group 16 refused: %s", pln_error());
    bad.group_size = 0;
    CHECK(pln_tp_check(&m, &bad) == -1, "int4 without a group size refused");
    bad.group_size = 128; bad.tp = 4;   /* dense slices of 64 columns */
    CHECK(pln_tp_check(&m, &bad) == -1 && strstr(pln_error(), "does not divide"), "int4 g128 at TP 4 of hidden 256: %s", pln_error());
    pln_tp_opts both = {.tp = 1, .int4 = true, .int8 = true, .group_size = 32};
    CHECK(pln_tp_check(&m, &both) == -1, "int8 and int4 together refused");
}

/* Asymmetric int4 (levels 0..15, w ~ q * scale + min, min and scale fp16) with the same clipping
 * search on the range: only to measure whether a zero point would pay for its extra 2 bytes
 * per group and the kernel's extra term. */
static double asym_err(const float *w, int64_t n) {
    float lo = w[0], hi = w[0];
    for (int64_t j = 1; j < n; j++) { lo = fminf(lo, w[j]); hi = fmaxf(hi, w[j]); }
    double best = INFINITY;
    for (int c = 0; c <= 10; c++) {
        float shrink = 1.0f - 0.02f * (float)c;   /* clip both ends symmetrically about the middle */
        float mid = 0.5f * (lo + hi), half = 0.5f * (hi - lo) * shrink;
        float mn = pln_f16_to_f32(pln_f32_to_f16(mid - half));
        float s = pln_f16_to_f32(pln_f32_to_f16(2 * half / 15.0f));
        if (!(s > 0)) return 0;
        double e = 0;
        for (int64_t j = 0; j < n; j++) {
            float q = roundf((w[j] - mn) / s);
            q = q < 0 ? 0 : q > 15 ? 15 : q;
            double d = (double)w[j] - ((double)q * s + mn);
            e += d * d;
        }
        best = fmin(best, e);
    }
    return best;
}

/* The search's objective (formats/tp.c): squared error weighted by w^2 + mean(w^2) of the group,
 * here in double from the stored nibbles and scale. */
static double weighted_err(const float *w, int64_t n, const uint8_t *pk, uint16_t sc) {
    double msq = 0, e = 0, s = pln_f16_to_f32(sc);
    for (int64_t j = 0; j < n; j++) msq += (double)w[j] * w[j];
    msq /= (double)n;
    for (int64_t j = 0; j < n; j++) {
        double d = (double)w[j] - pln_i4_get(pk, j) * s;
        e += ((double)w[j] * w[j] + msq) * d * d;
    }
    return e;
}

/* int4 quantization: packing round-trips, exactly representable groups come back exactly, the
 * searched scale is never worse than absmax by its own objective on any group and clearly better
 * in plain weight error on Gaussian and heavy-tailed weights (the figures FORMAT.md quotes), and
 * the zero-point variant's error. */
static void test_int4_quant(void) {
    uint8_t row[64];
    memset(row, 0, sizeof row);
    for (int k = 0; k < 128; k++) pln_i4_set(row, k, (k * 5) % 16 - 8);
    int bad = 0;
    for (int k = 0; k < 128; k++) bad += pln_i4_get(row, k) != (k * 5) % 16 - 8;
    CHECK(bad == 0, "int4 pack/unpack round trip: %d wrong", bad);
    CHECK((row[16] & 15) == (uint8_t)((32 * 5) % 16) && (row[16] >> 4) == (uint8_t)((48 * 5) % 16) && (row[0] >> 4) == (uint8_t)((16 * 5) % 16),
          "byte 16·b + j holds columns 32b + j (low) and 32b + 16 + j (high), as q + 8");
    /* values on the grid of a power-of-two scale: exact */
    float w[256];
    for (int j = 0; j < 64; j++) w[j] = 0.125f * (float)((j % 16) - 8);
    uint8_t pk[128];
    uint16_t sc[8];
    pln_tp_qerr e = {0};
    pln_tp_quant_row_i4(w, 64, 32, PLN_TP_I4_SEARCH, pk, sc, &e);
    CHECK(e.err2 == 0 && e.n == 64 && pln_f16_to_f32(sc[0]) == 0.125f, "on-grid values exact (err %g, scale %g)", e.err2, pln_f16_to_f32(sc[0]));
    /* an all-zero group: scale 1, q 0 (nibbles 8) */
    memset(w, 0, sizeof w);
    e = (pln_tp_qerr){0};
    pln_tp_quant_row_i4(w, 32, 32, PLN_TP_I4_SEARCH, pk, sc, &e);
    CHECK(sc[0] == 0x3c00 && pk[0] == 0x88 && pk[15] == 0x88 && e.err2 == 0, "zero group: scale 1.0, nibbles 8");
    /* Gaussian (Box-Muller) and heavy-tailed (Gaussian cubed) rows, groups of 32/64/128 */
    enum { N = 1 << 15 };
    float *g = malloc(N * sizeof *g), *h = malloc(N * sizeof *h);
    uint32_t st = 12345;
    for (int i = 0; i < N; i += 2) {
        st = st * 1664525u + 1013904223u; double u1 = ((st >> 8) + 1.0) / 16777217.0;
        st = st * 1664525u + 1013904223u; double u2 = (st >> 8) / 16777216.0;
        double r = sqrt(-2 * log(u1));
        g[i] = (float)(0.02 * r * cos(2 * M_PI * u2));
        g[i + 1] = (float)(0.02 * r * sin(2 * M_PI * u2));
    }
    for (int i = 0; i < N; i++) h[i] = g[i] * g[i] * g[i] * 2500.0f;
    uint8_t *p = malloc(N / 2);
    uint16_t *s = malloc(N / 32 * 2);
    const float *data[2] = {g, h};
    const char *dname[2] = {"gaussian", "heavy-tailed"};
    double sym_rms[2][3], zp_rms[2][3];
    for (int d = 0; d < 2; d++)
        for (int64_t G = 32, gi = 0; G <= 128; G *= 2, gi++) {
            pln_tp_qerr ea = {0}, es = {0};
            int worse = 0;
            for (int64_t g0 = 0; g0 < N; g0 += G) {
                pln_tp_qerr a1 = {0}, s1 = {0};
                pln_tp_quant_row_i4(data[d] + g0, G, G, PLN_TP_I4_ABSMAX, p, s, &a1);
                double wa = weighted_err(data[d] + g0, G, p, s[0]);
                pln_tp_quant_row_i4(data[d] + g0, G, G, PLN_TP_I4_SEARCH, p, s, &s1);
                /* the search compares in float: a near-tie may come out a rounding worse in double */
                worse += weighted_err(data[d] + g0, G, p, s[0]) > wa * (1 + 1e-5);
                pln_tp_qerr_merge(&ea, &a1);
                pln_tp_qerr_merge(&es, &s1);
            }
            double asym = 0;
            for (int64_t g0 = 0; g0 < N; g0 += G) asym += asym_err(data[d] + g0, G);
            double ra = pln_tp_qerr_rel_rms(&ea), rs = pln_tp_qerr_rel_rms(&es), rz = sqrt(asym / es.ref2);
            printf("int4 %-12s g%-3lld rel rms: absmax %.4f, searched %.4f (%.1f%% lower), zero-point %.4f (%+.1f%% vs searched)\n",
                   dname[d], (long long)G, ra, rs, 100 * (1 - rs / ra), rz, 100 * (rz / rs - 1));
            sym_rms[d][gi] = rs;
            zp_rms[d][gi] = rz;
            CHECK(worse == 0, "%s g%lld: the search made %d groups worse than absmax (weighted error)", dname[d], (long long)G, worse);
            CHECK(rs < 0.95 * ra, "%s g%lld: searched scale %.4f not clearly below absmax %.4f", dname[d], (long long)G, rs, ra);
        }
    /* At equal bytes a zero point buys little: its extra fp16 per group makes g128 cost 4.25 bits
     * per weight, what symmetric g64 costs; symmetric g64 (searched for the model's output, not for
     * the least weight error) comes within 5 % of zero-point g128 on Gaussian weights (whose
     * error the zero-point search minimizes) and is clearly better on heavy-tailed ones */
    for (int d = 0; d < 2; d++) {
        printf("int4 %-12s at 4.25 bits/weight: symmetric g64 %.4f, zero-point g128 %.4f\n", dname[d], sym_rms[d][1], zp_rms[d][2]);
        CHECK(sym_rms[d][1] <= zp_rms[d][2] * (d ? 0.95 : 1.05), "%s: zero-point g128 %.4f against symmetric g64 %.4f", dname[d],
              zp_rms[d][2], sym_rms[d][1]);
    }
    /* every SIMD path this CPU has (AVX2, AVX-512) and the C path: the same bytes, scales and
     * sums for Gaussian, heavy-tailed, zero, tiny, huge and NaN values, every group size */
    for (int isa = PLN_TP_ISA_AVX2; isa <= PLN_TP_ISA_AVX512; isa++) {
        enum { C = 512 };
        float *v = malloc(C * sizeof *v);
        uint8_t pa[C / 2], pc[C / 2];
        uint16_t sa[C / 32], scc[C / 32];
        int diff = 0, ran = 0;
        for (int rep = 0; rep < 40; rep++) {
            for (int j = 0; j < C; j++) v[j] = (rep & 1 ? h : g)[(rep * C + j) % N];
            if (rep % 5 == 2) for (int j = 0; j < 64; j++) v[j] = 0;                 /* an all-zero group */
            if (rep % 5 == 3) { v[7] = 1e30f; v[40] = -3e-41f; v[41] = 6e-8f; }     /* huge, subnormal, tiny */
            if (rep % 5 == 4) { v[3] = NAN; v[100] = -INFINITY; }
            for (int64_t G = 32; G <= 128; G *= 2) {
                pln_tp_qerr ea = {0}, ec = {0};
                if (!pln_tp_quant_row_i4_isa((pln_tp_isa)isa, v, C, G, PLN_TP_I4_SEARCH, pa, sa, &ea)) continue;
                ran++;
                pln_tp_quant_row_i4_isa(PLN_TP_ISA_C, v, C, G, PLN_TP_I4_SEARCH, pc, scc, &ec);
                bool same = !memcmp(pa, pc, sizeof pa) && !memcmp(sa, scc, (size_t)(C / G) * 2) &&
                            !memcmp(&ea, &ec, sizeof ea);
                diff += !same;
            }
        }
        /* the scores themselves, bit for bit: 480 groups x 14 scales around each group's absmax / 7 */
        int sdiff = 0, sran = 0;
        for (int k = 0; k < 480; k++) {
            int64_t G = 32 << (k % 3);
            const float *x = (k & 1 ? h : g) + (size_t)(k * 128) % (N - 128);
            float amax = 0;
            for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(x[j]));
            for (int c = 0; c < 14; c++) {
                float cs = pln_f16_to_f32(pln_f32_to_f16(amax / (6.5f + 0.25f * (float)c))), a = 0, b = 0;
                if (!pln_tp_i4_score_isa((pln_tp_isa)isa, x, G, cs, &a)) continue;
                pln_tp_i4_score_isa(PLN_TP_ISA_C, x, G, cs, &b);
                sran++;
                sdiff += memcmp(&a, &b, sizeof a) != 0;
            }
        }
        CHECK(sdiff == 0, "int4 %s scores differ from C's in %d of %d", isa == PLN_TP_ISA_AVX2 ? "AVX2" : "AVX-512", sdiff, sran);
        printf("int4 %s path: %s\n", isa == PLN_TP_ISA_AVX2 ? "AVX2" : "AVX-512", ran ? "checked against C" : "not on this CPU");
        CHECK(diff == 0, "int4 %s and C paths differ in %d of %d rows", isa == PLN_TP_ISA_AVX2 ? "AVX2" : "AVX-512", diff, ran);
        free(v);
    }
    free(g); free(h); free(p); free(s);
}

/* The plan and the shard format's own bloom-tp-v1 list (what the loader checks) must agree. */
/* bits: 16 (fp16), 8 or 4 (int4). */
static void test_matches_layout(int64_t heads, int64_t hidden, int tp, int bits, int64_t group, bool qemb) {
    bool int8 = bits == 8, int4 = bits == 4;
    pln_bloom_config cfg = {.vocab_size = 1003, .hidden_size = hidden, .n_head = heads, .n_layer = 3, .layer_norm_epsilon = 1e-5};
    pln_tp_model m = pln_tp_model_of(&cfg);
    pln_tp_opts o = {.tp = tp, .int8 = int8, .int4 = int4, .group_size = group, .quantize_embedding = qemb};
    pln_layout_params lp = {.config = &cfg, .tp = tp, .int8 = int8, .group_size = group, .quantize_embedding = qemb,
                            .vocab_padded = pln_tp_vocab_padded(1003, tp), .int4 = int4};
    for (int r = 0; r < tp; r++) {
        pln_tp_entry *e;
        size_t n, ln;
        CHECK(pln_tp_plan(&m, &o, r, &e, &n) == 0, "plan");
        pln_shard_spec *sp = pln_layout_bloom_tp_v1(&lp, r, &ln);
        CHECK(sp && ln == n, "layout: %s", sp ? "count differs" : pln_error());
        int bad = 0;
        for (size_t i = 0; sp && i < n && i < ln; i++)
            bad += strcmp(sp[i].name, e[i].name) || sp[i].dtype != e[i].dtype || sp[i].ndim != e[i].ndim ||
                   sp[i].shape[0] != e[i].shape[0] || (e[i].ndim == 2 && sp[i].shape[1] != e[i].shape[1]);
        CHECK(bad == 0, "TP %d rank %d %s: %d entries differ from pln_layout_bloom_tp_v1", tp, r, int4 ? "int4" : int8 ? "int8" : "fp16", bad);
        if (sp) pln_layout_free(sp, ln);
        free(e);
    }
    CHECK(pln_vocab_padded(1003, tp) == pln_tp_vocab_padded(1003, tp), "vocab padding agrees");
}

/* ---- rank files written by `pollen reshard`, read back with formats/shard.h ---- */
static int reshard(const char *src, const char *out, const char *args) {
    const char *b = getenv("PLN_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/pollen reshard %s -o %s %s --quiet --force", b ? b : "build", src, out, args);
    return system(cmd);
}

/* Source value (row, col) of a 1-D or 2-D tensor as float. */
static float src_at(const pln_tensor *t, int64_t row, int64_t col) {
    int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
    float f;
    uint64_t nf = 0;
    pln_tp_to_f32(t->dtype, t->data + (size_t)(row * cols + col) * pln_dtype_size(t->dtype), &f, 1, &nf);
    return f;
}

static const uint16_t *rank_f16(const pln_shard *s, const char *name, int64_t *rows, int64_t *cols) {
    const pln_shard_tensor *t = pln_shard_find(s, name);
    if (!t) return NULL;
    *rows = t->shape[0];
    *cols = t->ndim == 2 ? t->shape[1] : 1;
    return pln_shard_data(s, t);
}

/* bloom-6h (6 heads, head_dim 16, hidden 96) from fp32 at TP 3: rank r holds heads 2r, 2r+1. */
static void test_rank_files_fp16(void) {
    char out[600];
    snprintf(out, sizeof out, "%s/6h-tp3", test_tmpdir());
    const char *src = "tests/fixtures/models/bloom-6h/fp32-st";
    CHECK(reshard(src, out, "--tp 3 --dtype fp16") == 0, "reshard %s", src);
    pln_ckpt ck;
    if (pln_ckpt_open(&ck, src)) { CHECK(0, "open %s: %s", src, pln_error()); return; }
    const pln_tensor *qkv = pln_ckpt_find(&ck, "h.1.self_attention.query_key_value.weight");
    const pln_tensor *qkvb = pln_ckpt_find(&ck, "h.1.self_attention.query_key_value.bias");
    const pln_tensor *dense = pln_ckpt_find(&ck, "h.0.self_attention.dense.weight");
    const pln_tensor *down = pln_ckpt_find(&ck, "h.1.mlp.dense_4h_to_h.weight");
    const pln_tensor *emb = pln_ckpt_find(&ck, "word_embeddings.weight");
    const pln_tensor *db = pln_ckpt_find(&ck, "h.0.self_attention.dense.bias");
    CHECK(qkv && qkvb && dense && down && emb && db, "source tensors found");
    if (!(qkv && qkvb && dense && down && emb && db)) { pln_ckpt_close(&ck); return; }
    for (int r = 0; r < 3; r++) {
        char path[700];
        snprintf(path, sizeof path, "%s/rank-%d-of-3.pln", out, r);
        pln_shard *s = pln_shard_open(path);
        CHECK(s != NULL, "open %s: %s", path, pln_error());
        if (!s) continue;
        int64_t R, C;
        const uint16_t *q = rank_f16(s, "h.1.self_attention.query_key_value.weight", &R, &C);
        const uint16_t *qb = rank_f16(s, "h.1.self_attention.query_key_value.bias", &R, &C);
        int64_t bad = 0, checked = 0;
        for (int head = 2 * r; head < 2 * r + 2; head++)
            for (int part = 0; part < 3; part++)        /* q, k, v */
                for (int d = 0; d < 16; d++) {
                    int64_t local = (head - 2 * r) * 48 + part * 16 + d, global = head * 48 + part * 16 + d;
                    for (int c = 0; c < 96; c++, checked++)
                        bad += q[local * 96 + c] != pln_f32_to_f16(src_at(qkv, global, c));
                    bad += qb[local] != pln_f32_to_f16(src_at(qkvb, global, 0));
                }
        CHECK(q && qb && bad == 0 && checked == 2 * 48 * 96, "rank %d: qkv rows are heads %d,%d with q,k,v (%lld bad)", r, 2 * r,
              2 * r + 1, (long long)bad);
        const uint16_t *dw = rank_f16(s, "h.0.self_attention.dense.weight", &R, &C);
        bad = 0;
        for (int64_t i = 0; dw && i < 96; i++)
            for (int64_t j = 0; j < 32; j++) bad += dw[i * 32 + j] != pln_f32_to_f16(src_at(dense, i, r * 32 + j));
        CHECK(dw && R == 96 && C == 32 && bad == 0, "rank %d: dense holds input columns [%d, %d)", r, 32 * r, 32 * r + 32);
        const uint16_t *dn = rank_f16(s, "h.1.mlp.dense_4h_to_h.weight", &R, &C);
        bad = 0;
        for (int64_t i = 0; dn && i < 96; i++)
            for (int64_t j = 0; j < 128; j++) bad += dn[i * 128 + j] != pln_f32_to_f16(src_at(down, i, r * 128 + j));
        CHECK(dn && R == 96 && C == 128 && bad == 0, "rank %d: dense_4h_to_h holds columns [%d, %d)", r, 128 * r, 128 * r + 128);
        const uint16_t *b = rank_f16(s, "h.0.self_attention.dense.bias", &R, &C);
        bad = 0;
        for (int64_t i = 0; b && i < 96; i++) bad += b[i] != pln_f32_to_f16(src_at(db, i, 0));
        CHECK(b && R == 96 && bad == 0, "rank %d: row-parallel bias is full on every rank", r);
        /* vocab 1003 -> 1005 at TP 3: 335 rows each; rank 2 = rows 670..1002 + 2 zero rows */
        const uint16_t *e = rank_f16(s, "word_embeddings.weight", &R, &C);
        bad = 0;
        int64_t real = r < 2 ? 335 : 333;
        for (int64_t i = 0; e && i < 335; i++)
            for (int64_t j = 0; j < 96; j++) bad += e[i * 96 + j] != (i < real ? pln_f32_to_f16(src_at(emb, r * 335 + i, j)) : 0);
        CHECK(e && R == 335 && bad == 0, "rank %d: embedding rows [%d, %lld) then %lld zero pad rows", r, 335 * r,
              (long long)(335 * r + real), (long long)(335 - real));
        pln_shard_close(s);
    }
    pln_ckpt_close(&ck);
}

/* bloom-4h int8 at TP 4 with groups of 16: rank r's qkv rows are head r, dequantized within half a
 * step of the source; vocab 1003 -> 1004, rank 3 ends with one zero row. */
static void test_rank_files_int8(void) {
    char out[600];
    snprintf(out, sizeof out, "%s/4h-tp4", test_tmpdir());
    const char *src = "tests/fixtures/models/bloom-4h/bf16-st";
    CHECK(reshard(src, out, "--tp 4 --dtype int8 --group-size 16") == 0, "reshard %s", src);
    pln_ckpt ck;
    if (pln_ckpt_open(&ck, src)) { CHECK(0, "open %s: %s", src, pln_error()); return; }
    const pln_tensor *qkv = pln_ckpt_find(&ck, "h.0.self_attention.query_key_value.weight");
    const pln_tensor *emb = pln_ckpt_find(&ck, "word_embeddings.weight");
    for (int r = 0; r < 4 && qkv && emb; r++) {
        char path[700];
        snprintf(path, sizeof path, "%s/rank-%d-of-4.pln", out, r);
        pln_shard *s = pln_shard_open(path);
        CHECK(s != NULL, "open %s: %s", path, pln_error());
        if (!s) continue;
        const pln_shard_tensor *tq = pln_shard_find(s, "h.0.self_attention.query_key_value.weight");
        const pln_shard_tensor *ts = pln_shard_find(s, "h.0.self_attention.query_key_value.weight_scale");
        CHECK(tq && ts && tq->dtype == PLN_DTYPE_I8 && tq->shape[0] == 48 && tq->shape[1] == 64 && ts->dtype == PLN_DTYPE_F16 &&
              ts->shape[0] == 48 && ts->shape[1] == 4 && ts == tq + 1, "rank %d: qkv I8 [48, 64] then its F16 scales [48, 4]", r);
        if (!(tq && ts)) { pln_shard_close(s); continue; }
        const int8_t *q = pln_shard_data(s, tq);
        const uint16_t *sc = pln_shard_data(s, ts);
        int64_t bad = 0;
        for (int part = 0; part < 3; part++)
            for (int d = 0; d < 16; d++) {
                int64_t local = part * 16 + d, global = r * 48 + part * 16 + d;
                for (int g = 0; g < 4; g++) {
                    float amax = 0;
                    for (int c = g * 16; c < g * 16 + 16; c++) amax = fmaxf(amax, fabsf(src_at(qkv, global, c)));
                    float step = pln_f16_to_f32(sc[local * 4 + g]);
                    bad += sc[local * 4 + g] != pln_f32_to_f16(amax / 127.0f);
                    for (int c = g * 16; c < g * 16 + 16; c++)
                        bad += fabsf(q[local * 64 + c] * step - src_at(qkv, global, c)) > 0.5f * step * 1.0001f;
                }
            }
        CHECK(bad == 0, "rank %d: int8 qkv rows = head %d's q,k,v within half a step, scale = absmax/127 (%lld bad)", r, r, (long long)bad);
        if (r == 3) {
            const pln_shard_tensor *te = pln_shard_find(s, "word_embeddings.weight");
            const uint16_t *e = pln_shard_data(s, te);
            int nz = 0, same = 1;
            for (int j = 0; j < 64; j++) {
                nz += e[250 * 64 + j] != 0;
                same &= e[249 * 64 + j] == pln_f32_to_f16(src_at(emb, 1002, j));
            }
            CHECK(te->shape[0] == 251 && nz == 0 && same, "rank 3: last vocab row 1002 then one zero pad row");
        }
        pln_shard_close(s);
    }
    pln_ckpt_close(&ck);
}

/* The progress bar's work units (pln_tp_work_per_byte) and its ETA: a BLOOM-560m-shaped int4
 * reshard spends most of its time after the fp16 embedding, so the embedding must not fill half
 * the bar (it is half the bytes). */
static void test_work_weights(void) {
    pln_tp_model m = {.vocab_size = 250880, .hidden = 1024, .n_head = 16, .n_layer = 24};
    const struct { bool int8, int4; int64_t g; uint32_t lin; } v[] = {
        {false, false, 0, 1}, {true, false, 0, 2}, {true, false, 128, 2}, {false, true, 32, 12}, {false, true, 64, 8}, {false, true, 128, 6}};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        pln_tp_opts o = {.tp = 1, .int8 = v[k].int8, .int4 = v[k].int4, .group_size = v[k].g};
        pln_tp_entry *e;
        size_t n;
        CHECK(pln_tp_plan(&m, &o, 0, &e, &n) == 0, "plan: %s", pln_error());
        uint64_t bytes = 0, work = 0, emb_bytes = 0, emb_work = 0;
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t w = pln_tp_work_per_byte(&e[i]);
            bool lin = e[i].transform == PLN_TP_QUANT_I8 || e[i].transform == PLN_TP_QUANT_I4 ||
                       (e[i].transform == PLN_TP_TO_F16 && e[i].ndim == 2 && strncmp(e[i].name, "word_", 5));
            if (e[i].transform == PLN_TP_QUANT_SCALE) { bad += w != 0; continue; }
            bad += lin ? w != v[k].lin : w != 1;
            uint64_t b = (uint64_t)(e[i].rows * e[i].cols) * 2;   /* an fp16 source */
            bytes += b; work += b * w;
            if (!strcmp(e[i].source, "word_embeddings.weight")) { emb_bytes += b; emb_work += b * w; }
        }
        CHECK(bad == 0, "%s g%lld: %d entries with the wrong work weight", v[k].int4 ? "int4" : v[k].int8 ? "int8" : "fp16",
              (long long)v[k].g, bad);
        if (v[k].int4 && v[k].g == 128) {
            double fb = (double)emb_bytes / (double)bytes, fw = (double)emb_work / (double)work;
            printf("bloom-560m int4 g128: the fp16 embedding is %.1f%% of the bytes, %.1f%% of the work\n", 100 * fb, 100 * fw);
            CHECK(fb > 0.45 && fw < 0.15, "embedding share: bytes %.3f work %.3f", fb, fw);
            /* the ETA after the embedding, at its pace: the rest at 6 units per byte */
            double t_emb = 1.0;   /* seconds the embedding took */
            double eta = pln_progress_eta(t_emb, emb_work, work);
            CHECK(fabs(eta - t_emb * (double)(work - emb_work) / (double)emb_work) < 1e-9 && eta > 5 * t_emb,
                  "ETA after the embedding %.2f s (embedding 1 s)", eta);
        }
        free(e);
    }
    CHECK(pln_progress_eta(10, 25, 100) == 30, "ETA 10 s for a quarter: 30 s left");
    CHECK(pln_progress_eta(10, 0, 100) == 0 && pln_progress_eta(10, 100, 100) == 0 && pln_progress_eta(0, 5, 100) == 0,
          "no ETA before progress, after the end, or at time 0");
}

int main(void) {
    test_begin("test_tp");
    test_order_and_shapes();
    test_coverage(4, 64, 1);
    test_coverage(4, 64, 2);
    test_coverage(4, 64, 4);
    test_coverage(6, 96, 3);
    test_qkv_heads();
    test_errors();
    test_int8_plan();
    test_f16();
    test_quant();
    test_fast_paths();
    test_matches_layout(4, 64, 4, 16, 0, false);
    test_matches_layout(6, 96, 3, 8, 0, false);
    test_matches_layout(6, 96, 2, 8, 16, true);
    test_matches_layout(4, 64, 1, 8, 32, false);
    test_matches_layout(4, 64, 2, 4, 32, false);
    test_matches_layout(6, 96, 3, 4, 32, true);
    test_matches_layout(4, 128, 1, 4, 128, true);
    test_int4_plan();
    test_work_weights();
    test_int4_quant();
    test_rank_files_fp16();
    test_rank_files_int8();
    return test_done();
}
