/* test_kernels_cpu.c — every op of the CPU backend, on every instruction-set tier this CPU has
 * (the reference loops, portable C, AVX2, AVX-512), against naive double-precision references
 * written here: random inputs, odd sizes, T = 1 and T > 1, several sequences at different
 * positions in one attention call over scattered KV blocks, int8 per channel and per group,
 * top-k ties, vocab padding, the HF repetition-penalty rule; the Llama family's RMSNorm, rotary,
 * SwiGLU and grouped-query attention (prefill, mixed and decode steps, f32 and f16 KV).
 *
 *   build/tests/test_kernels_cpu            the checks (a few seconds)
 *   build/tests/test_kernels_cpu --bench [T...]   GEMV/GEMM bandwidth and FLOP/s against a STREAM-style
 *                                           copy measured in the same run (tools/bench/kernels_cpu.sh)
 *   build/tests/test_kernels_cpu --bench-panel [T...]   the batched float path against the tiles,
 *                                           interleaved, on Llama-3.2-1B's shapes; PLN_BENCH_KIND
 *                                           (a prefix: "F16", "I8 g32") and PLN_BENCH_SHAPE (first
 *                                           letters: "gd" for gate|up and down) keep only those */
#include "tests/test.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"
#include "formats/tp.h"

#include <float.h>
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdint.h>

/* ---- random inputs ------------------------------------------------------------------------- */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)(rnd_u32() & 0xffffff) / 16777216.0f; }
static float *rnd_vec(size_t n, float lo, float hi) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = rnd_f(lo, hi);
    return v;
}
static uint16_t *rnd_f16(size_t n, float lo, float hi) {
    uint16_t *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = pln_f32_to_f16(rnd_f(lo, hi));
    return v;
}
static double h2d(uint16_t h) { return (double)pln_f16_to_f32(h); }

static pln_backend *g_be;
static const char *g_isa = "?";

/* Runs body once per supported instruction-set tier. */
#define FOR_EACH_ISA(isa_var) \
    for (int isa_var = 0; isa_var < PLN_CPU_ISA_COUNT; isa_var++) \
        if (pln_cpu_isa_supported((pln_cpu_isa)isa_var) && \
            !pln_cpu_set_isa(g_be, (pln_cpu_isa)isa_var) && (g_isa = pln_cpu_isa_name((pln_cpu_isa)isa_var)))

/* ---- embed, gather ------------------------------------------------------------------------- */
static void test_embed(void) {
    int64_t H = 13, v0 = 10, vn = 7;
    uint16_t *table = rnd_f16((size_t)(vn * H), -2, 2);
    int32_t ids[6] = {10, 16, 9, 17, 12, 0};
    float out[6 * 13];
    FOR_EACH_ISA(isa) {
        memset(out, 0x7f, sizeof out);
        CHECK(g_be->embed(g_be, out, ids, 6, table, v0, vn, H) == 0, "embed: %s", pln_error());
        int bad = 0;
        for (int t = 0; t < 6; t++)
            for (int64_t i = 0; i < H; i++) {
                double want = ids[t] >= v0 && ids[t] < v0 + vn ? h2d(table[(ids[t] - v0) * H + i]) : 0.0;
                bad += out[t * H + i] != (float)want;
            }
        CHECK(bad == 0, "embed [%s]: %d wrong elements (out-of-slice ids must give zeros)", g_isa, bad);
    }
    /* gather_rows: the last token of each sequence */
    float in[5 * 13], g[3 * 13];
    for (int i = 0; i < 5 * 13; i++) in[i] = (float)i;
    int32_t rows[3] = {4, 0, 2};
    CHECK(g_be->gather_rows(g_be, g, in, rows, 3, 13) == 0, "gather_rows: %s", pln_error());
    int bad = 0;
    for (int i = 0; i < 3; i++) for (int j = 0; j < 13; j++) bad += g[i * 13 + j] != in[rows[i] * 13 + j];
    CHECK(bad == 0, "gather_rows: %d wrong", bad);
    free(table);
}

/* ---- layernorm ------------------------------------------------------------------------------ */
static void ref_layernorm(double *out, const double *in, const uint16_t *gm, const uint16_t *bt,
                          int T, int64_t H, double eps) {
    for (int t = 0; t < T; t++) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < H; i++) mean += in[t * H + i];
        mean /= H;
        for (int64_t i = 0; i < H; i++) var += (in[t * H + i] - mean) * (in[t * H + i] - mean);
        var /= H;
        for (int64_t i = 0; i < H; i++)
            out[t * H + i] = (in[t * H + i] - mean) / sqrt(var + eps) * h2d(gm[i]) + h2d(bt[i]);
    }
}

static void test_layernorm(void) {
    static const int Ts[] = {1, 3, 9};
    static const int64_t Hs[] = {1, 7, 64, 257, 1024};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++) {
            int T = Ts[a]; int64_t H = Hs[b]; size_t n = (size_t)(T * H);
            float *x = rnd_vec(n, -3, 5), *y = rnd_vec(n, -1, 1), *o = malloc(n * 4), *x2 = malloc(n * 4);
            uint16_t *gm = rnd_f16((size_t)H, 0.5f, 1.5f), *bt = rnd_f16((size_t)H, -0.5f, 0.5f),
                     *bias = rnd_f16((size_t)H, -1, 1);
            double *xd = malloc(n * 8), *want = malloc(n * 8);
            float eps = 1e-5f;
            for (size_t i = 0; i < n; i++) xd[i] = x[i];
            ref_layernorm(want, xd, gm, bt, T, H, eps);
            FOR_EACH_ISA(isa) {
                CHECK(g_be->layernorm(g_be, o, x, gm, bt, T, H, eps) == 0, "layernorm: %s", pln_error());
                double md = 0; for (size_t i = 0; i < n; i++) md = fmax(md, fabs(o[i] - want[i]));
                CHECK(md < 2e-5, "layernorm [%s] T=%d H=%lld: max diff %g", g_isa, T, (long long)H, md);
                /* in place */
                memcpy(x2, x, n * 4);
                CHECK(g_be->layernorm(g_be, x2, x2, gm, bt, T, H, eps) == 0, "layernorm in place");
                CHECK(!memcmp(x2, o, n * 4), "layernorm [%s]: in place differs from out of place", g_isa);
            }
            /* residual + bias + layernorm, with and without the bias */
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                double *xr = malloc(n * 8), *wr = malloc(n * 8);
                for (size_t i = 0; i < n; i++) xr[i] = (double)x[i] + y[i] + (with_bias ? h2d(bias[i % H]) : 0);
                ref_layernorm(wr, xr, gm, bt, T, H, eps);
                FOR_EACH_ISA(isa) {
                    memcpy(x2, x, n * 4);
                    CHECK(g_be->residual_layernorm(g_be, x2, y, with_bias ? bias : NULL, gm, bt, o, T, H, eps) == 0,
                          "residual_layernorm: %s", pln_error());
                    double mx = 0, mo = 0;
                    for (size_t i = 0; i < n; i++) { mx = fmax(mx, fabs(x2[i] - xr[i])); mo = fmax(mo, fabs(o[i] - wr[i])); }
                    CHECK(mx < 1e-5 && mo < 2e-5, "residual_layernorm [%s] T=%d H=%lld bias=%d: x diff %g, ln diff %g",
                          g_isa, T, (long long)H, with_bias, mx, mo);
                }
                free(xr); free(wr);
            }
            free(x); free(y); free(o); free(x2); free(gm); free(bt); free(bias); free(xd); free(want);
        }
}

/* ---- linear / logits ----------------------------------------------------------------------- */
typedef struct {
    pln_weight W;
    void *w; uint16_t *scale;
} test_weight;

/* Weight kinds: F16, I8 (true), packed int4. */
#define WQ_I8 1
#define WQ_I4 4

/* F16 weight, I8 (group = 0: per channel) or int4 (group a multiple of 32) quantized the way
 * reshard does. */
static test_weight make_weight(int64_t rows, int64_t cols, int i8, int64_t group) {
    test_weight tw = {0};
    tw.W.rows = rows; tw.W.cols = cols;
    float *wf = rnd_vec((size_t)(rows * cols), -1, 1);
    if (i8 == WQ_I4) {
        int64_t ng = cols / group;
        uint8_t *q = malloc((size_t)(rows * cols / 2));
        tw.scale = malloc((size_t)(rows * ng) * 2);
        pln_tp_qerr e = {0};
        for (int64_t r = 0; r < rows; r++)
            pln_tp_quant_row_i4(wf + r * cols, cols, group, PLN_TP_I4_SEARCH, q + r * (cols / 2), tw.scale + r * ng, &e);
        tw.W.dtype = PLN_DTYPE_U8; tw.W.w = tw.w = q; tw.W.scale = tw.scale; tw.W.group = group;
    } else if (!i8) {
        uint16_t *w = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) w[i] = pln_f32_to_f16(wf[i]);
        tw.W.dtype = PLN_DTYPE_F16; tw.W.w = tw.w = w;
    } else {
        int64_t G = group ? group : cols, ng = cols / G;
        int8_t *q = malloc((size_t)(rows * cols));
        tw.scale = malloc((size_t)(rows * ng) * 2);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < ng; g++) {
                float amax = 0;
                for (int64_t k = g * G; k < (g + 1) * G; k++) amax = fmaxf(amax, fabsf(wf[r * cols + k]));
                uint16_t sh = pln_f32_to_f16(amax > 0 ? amax / 127.0f : 1.0f);
                tw.scale[r * ng + g] = sh;
                float inv = 1.0f / pln_f16_to_f32(sh);
                for (int64_t k = g * G; k < (g + 1) * G; k++) q[r * cols + k] = pln_quant_i8(wf[r * cols + k], inv);
            }
        tw.W.dtype = PLN_DTYPE_I8; tw.W.w = tw.w = q; tw.W.scale = tw.scale; tw.W.group = G;
    }
    free(wf);
    return tw;
}

static double w_at(const pln_weight *W, int64_t r, int64_t k) {
    if (W->dtype == PLN_DTYPE_F16) return h2d(((const uint16_t *)W->w)[r * W->cols + k]);
    if (W->dtype == PLN_DTYPE_U8)
        return (double)pln_i4_get((const uint8_t *)W->w + r * (W->cols / 2), k) * h2d(W->scale[r * (W->cols / W->group) + k / W->group]);
    return (double)((const int8_t *)W->w)[r * W->cols + k] * h2d(W->scale[r * (W->cols / W->group) + k / W->group]);
}

static double gelu_d(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x))); }

static void test_linear_case(int64_t rows, int64_t cols, int T, int i8, int64_t group, bool bias_on, bool gelu) {
    test_weight tw = make_weight(rows, cols, i8, group);
    float *x = rnd_vec((size_t)(T * cols), -1, 1), *o = malloc((size_t)(T * rows) * 4);
    uint16_t *bias = bias_on ? rnd_f16((size_t)rows, -0.5f, 0.5f) : NULL;
    double *want = malloc((size_t)(T * rows) * 8), *mag = malloc((size_t)(T * rows) * 8);
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < cols; k++) { double p = x[t * cols + k] * w_at(&tw.W, r, k); s += p; m += fabs(p); }
            if (bias) { s += h2d(bias[r]); m += fabs(h2d(bias[r])); }
            want[t * rows + r] = gelu ? gelu_d(s) : s;
            mag[t * rows + r] = m;
        }
    FOR_EACH_ISA(isa) {
        memset(o, 0xff, (size_t)(T * rows) * 4);
        CHECK(g_be->linear(g_be, o, x, &tw.W, bias, T, gelu) == 0, "linear: %s", pln_error());
        int bad = 0; double worst = 0;
        for (int64_t i = 0; i < T * rows; i++) {
            double d = fabs(o[i] - want[i]), tol = 2e-6 * mag[i] + 1e-6;
            if (!(d <= tol)) bad++;
            worst = fmax(worst, d / (mag[i] + 1e-30));
        }
        CHECK(bad == 0, "linear [%s] %s%s [%lld, %lld] T=%d bias=%d gelu=%d: %d wrong, worst rel %g", g_isa,
              i8 == WQ_I4 ? "I4" : i8 ? "I8" : "F16", i8 ? (group ? "/group" : "/channel") : "", (long long)rows, (long long)cols,
              T, bias_on, gelu, bad, worst);
    }
    free(tw.w); free(tw.scale); free(x); free(o); free(bias); free(want); free(mag);
}

static void test_linear(void) {
    static const int64_t shapes[][2] = {{1, 1}, {5, 7}, {37, 33}, {64, 128}, {19, 300}, {8, 64}};
    static const int Ts[] = {1, 2, 3, 5, 70};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t ti = 0; ti < 5; ti++) {
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            int T = Ts[ti];
            bool b = (s + ti) % 2, g = (s + ti) % 3 == 0;
            test_linear_case(rows, cols, T, false, 0, b, g);
            test_linear_case(rows, cols, T, true, 0, !b, g);
            /* groups: a multiple of both vector widths, and one that is not (tail paths) */
            if (cols % 32 == 0) test_linear_case(rows, cols, T, true, 32, b, !g);
            if (cols % 12 == 0) test_linear_case(rows, cols, T, true, 12, b, g);
            if (cols % 20 == 0) test_linear_case(rows, cols, T, true, 20, !b, false);
        }
    /* fp16 and per-row int8 at 2-4 tokens, rows one at a time (simd_avx512.c F16_ROWS_NOTE):
     * 64-column steps, a 16-column and a scalar tail; and past its 32 KiB of activations (the
     * tiles) */
    for (int T = 2; T <= 4; T++) {
        test_linear_case(37, 1000, T, false, 0, T % 2, T == 3);
        test_linear_case(21, 4104, T, false, 0, T % 2 == 0, false);
        test_linear_case(37, 1000, T, true, 0, T % 2 == 0, T == 2);   /* int8 per row, the same */
        test_linear_case(21, 4104, T, true, 0, T % 2, false);
    }
    /* a wider one: several row chunks and threads */
    test_linear_case(203, 512, 9, false, 0, true, true);
    test_linear_case(203, 512, 9, true, 64, true, false);
    test_linear_case(203, 512, 1, true, 0, false, false);
    /* long rows: several passes over the columns for a block of tokens (groups below and above
     * a pass, and not a multiple of the vector width) */
    test_linear_case(37, 2100, 9, false, 0, true, false);
    test_linear_case(37, 2100, 9, true, 0, false, true);
    test_linear_case(37, 2100, 9, true, 700, true, false);
    test_linear_case(37, 2100, 70, true, 12, false, false);
    test_linear_case(6, 3000, 5, true, 1500, true, true);
    /* the one-token GEMV (simd_avx512.c GEMV_NOTE): rows of 64-column steps plus a 16-column
     * and a scalar tail, groups of 32 with an odd last group, groups of a multiple of 64, other
     * groups, and enough rows for several runs per thread */
    test_linear_case(37, 2100, 1, false, 0, true, false);
    test_linear_case(37, 2100, 1, true, 0, false, true);
    test_linear_case(9, 96, 1, true, 32, false, false);
    test_linear_case(9, 384, 1, true, 64, true, false);
    test_linear_case(9, 512, 1, true, 128, false, true);
    test_linear_case(9, 2100, 1, true, 700, false, false);
    test_linear_case(9, 160, 1, WQ_I4, 32, false, false);
    test_linear_case(9, 320, 1, WQ_I4, 64, true, false);
    test_linear_case(1031, 256, 1, false, 0, true, true);
    test_linear_case(1031, 256, 1, true, 32, false, false);
    /* int8 groups of 32 in blocks of eight (simd_avx2.c G32_NOTE): 11 groups (one block and
     * three left), 33 (four blocks, both accumulators, one left) */
    test_linear_case(9, 352, 1, true, 32, true, false);
    test_linear_case(5, 1056, 1, true, 32, false, true);
    test_linear_case(1031, 256, 1, WQ_I4, 128, false, false);
    /* int4: every group size reshard writes, each tile shape (1..6 tokens, 1..4 rows and the
     * row tail), one and several passes over the columns */
    static const int64_t g4[] = {32, 64, 128};
    static const int T4[] = {1, 2, 3, 4, 5, 7, 70};
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t ti = 0; ti < sizeof T4 / sizeof T4[0]; ti++) {
            test_linear_case(1, 128, T4[ti], WQ_I4, g4[gi], ti % 2, false);
            test_linear_case(7, 256, T4[ti], WQ_I4, g4[gi], true, ti % 3 == 0);
            test_linear_case(37, 384, T4[ti], WQ_I4, g4[gi], false, false);
        }
    test_linear_case(203, 512, 9, WQ_I4, 128, true, false);
    test_linear_case(21, 4096, 9, WQ_I4, 32, false, true);
    test_linear_case(21, 4096, 1, WQ_I4, 128, false, false);
    /* the batched float path (pln_cpu_panel_min tokens and more on AVX2 and AVX-512): full and
     * part-full 32-token panels (a last one of <= 16 or > 16 tokens, and on AVX2 halves of <= 8 or
     * > 8), several passes over the token blocks, row counts that leave a part-full micro tile
     * (12 rows on AVX-512, 6 on AVX2) or 48-row unit, columns that leave a part block (fp16,
     * per-row int8) and groups that straddle the 16- or 8-column vectors */
    static const int TP[] = {32, 33, 47, 48, 52, 60, 64, 84, 90, 100, 300};
    for (size_t ti = 0; ti < sizeof TP / sizeof TP[0]; ti++) {
        int T = TP[ti];
        test_linear_case(5, 7, T, false, 0, true, false);
        test_linear_case(49, 300, T, false, 0, ti % 2, ti % 3 == 0);
        test_linear_case(11, 2100, T, true, 0, true, ti % 2);
        test_linear_case(13, 2100, T, true, 700, false, false);
        test_linear_case(13, 300, T, true, 12, true, false);
        test_linear_case(97, 256, T, true, 32, ti % 2, false);
        test_linear_case(37, 384, T, WQ_I4, 32 << (ti % 3), true, ti % 2);
    }
    test_linear_case(61, 4096, 40, WQ_I4, 128, false, true);
    test_linear_case(203, 1040, 96, false, 0, true, true);
    /* grouped int8 at one token (the GEMV path that sums a group before scaling it) on the row
     * tail and several rows */
    test_linear_case(9, 4096, 1, true, 32, false, false);
    test_linear_case(9, 4096, 1, true, 128, true, false);
    /* the one-token GEMV's long steps beside their tails: int8 g32 in 512-column blocks then a
     * whole line and an odd group (1600 = 3 x 512 + 64, 1056 = 2 x 512 + 32); fp16 in 128-column
     * steps then a 64-column one and a 16-column one (1104 = 8 x 128 + 64 + 16) */
    test_linear_case(7, 1600, 1, true, 32, true, false);
    test_linear_case(7, 1056, 1, true, 32, false, true);
    test_linear_case(7, 1104, 1, false, 0, false, false);
}

/* SwiGLU in the gate|up projection's epilogue (linear.c SWIGLU_NOTE): on every tier, weight kind,
 * path (GEMV, tiles, the batched float path, the integer-dot path, the batch-invariant mode) and
 * row count (I not a multiple of the 16-, 32- or 48-row units), bit for bit what linear without an
 * epilogue then swiglu give, and within fp32 rounding of silu(g) * u in double. */
static void test_linear_swiglu_case(int64_t I, int64_t cols, int T, int kind, int64_t group, bool bias_on) {
    test_weight tw = make_weight(2 * I, cols, kind, group);
    float *x = rnd_vec((size_t)(T * cols), -1, 1), *o = malloc((size_t)(T * I) * 4);
    float *h = malloc((size_t)(T * 2 * I) * 4), *ref = malloc((size_t)(T * I) * 4);
    uint16_t *bias = bias_on ? rnd_f16((size_t)(2 * I), -0.5f, 0.5f) : NULL;
    static const char *kn[] = {"F16", "I8", "", "", "I4"};
    for (int mode = 0; mode < 3; mode++) {   /* float path, integer-dot path, batch-invariant */
        if (mode == 1 && kind == 0) continue;
        pln_cpu_set_int_dot(g_be, mode == 1);
        pln_cpu_set_batch_invariant(g_be, mode == 2);
        FOR_EACH_ISA(isa) {
            memset(o, 0xff, (size_t)(T * I) * 4);
            CHECK(g_be->linear(g_be, h, x, &tw.W, bias, T, PLN_EPI_NONE) == 0, "linear: %s", pln_error());
            CHECK(g_be->swiglu(g_be, ref, h, T, I) == 0, "swiglu: %s", pln_error());
            CHECK(g_be->linear(g_be, o, x, &tw.W, bias, T, PLN_EPI_SWIGLU) == 0, "linear swiglu: %s", pln_error());
            int bad = 0, far = 0;
            for (int t = 0; t < T; t++)
                for (int64_t i = 0; i < I; i++) {
                    float got = o[t * I + i];
                    bad += memcmp(&got, &ref[t * I + i], 4) != 0;
                    double g = h[t * 2 * I + i], u = h[t * 2 * I + I + i], want = g / (1 + exp(-g)) * u;
                    far += !(fabs(got - want) <= 8 * FLT_EPSILON * fabs(want) + 1e-30);
                }
            CHECK(bad == 0 && far == 0, "linear swiglu [%s] %s%s I=%lld K=%lld T=%d bias=%d mode=%d: %d differ from "
                  "linear then swiglu, %d from silu(g) * u", g_isa, kn[kind], group ? "/group" : "", (long long)I,
                  (long long)cols, T, bias_on, mode, bad, far);
        }
    }
    pln_cpu_set_int_dot(g_be, false);
    pln_cpu_set_batch_invariant(g_be, false);
    free(tw.w); free(tw.scale); free(x); free(o); free(h); free(ref); free(bias);
}

static void test_linear_swiglu(void) {
    static const int Ts[] = {1, 2, 3, 5, 9, 40, 70};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti];
        bool b = ti % 2;
        test_linear_swiglu_case(37, 128, T, 0, 0, b);        /* fp16 */
        test_linear_swiglu_case(64, 256, T, 1, 0, !b);      /* int8 per row */
        test_linear_swiglu_case(37, 256, T, 1, 32, b);      /* int8 grouped */
        test_linear_swiglu_case(53, 256, T, WQ_I4, 64, b);  /* int4 */
    }
    test_linear_swiglu_case(1, 64, 3, 0, 0, true);          /* one pair */
    test_linear_swiglu_case(100, 512, 1, WQ_I4, 128, false);
    /* the wrong shapes are refused */
    test_weight tw = make_weight(3, 64, 0, 0);
    float x[64] = {0}, o[8];
    CHECK(g_be->linear(g_be, o, x, &tw.W, NULL, 1, PLN_EPI_SWIGLU) == -1 && strstr(pln_error(), "even"),
          "SwiGLU on 3 rows: want an error naming the even row count, got \"%s\"", pln_error());
    CHECK(g_be->linear_swiglu, "the cpu backend reports the SwiGLU epilogue");
    free(tw.w); free(tw.scale);
}

/* The integer-dot path (off by default): on int8 weights at T >= 2 and int4 ones at any T, every tier (with and
 * without VNNI) agrees with the C tier to fp32 rounding; every tier equals the integer reference
 * (activations quantized per block of 32, exact integer dots, one scale product per block, summed
 * in double) up to fp32 summation order; and the error it adds against the exact float result is
 * measured and bounded. */
static void test_int_dot_case(int64_t rows, int64_t cols, int T, int kind, int64_t group, bool bias_on, bool gelu,
                              double *worst_rel) {
    test_weight tw = make_weight(rows, cols, kind, group);
    const pln_weight *W = &tw.W;
    float *x = rnd_vec((size_t)(T * cols), -1, 1), *o = malloc((size_t)(T * rows) * 4), *first = malloc((size_t)(T * rows) * 4);
    uint16_t *bias = bias_on ? rnd_f16((size_t)rows, -0.5f, 0.5f) : NULL;
    float *exact = malloc((size_t)(T * rows) * 4), *defn = malloc((size_t)(T * rows) * 4);
    int8_t *xq = malloc((size_t)cols);
    float *xs = malloc((size_t)(cols / 32) * 4);
    int32_t *xsum = malloc((size_t)(cols / 32) * 4);
    for (int t = 0; t < T; t++) {
        pln_cpu_quant_act(x + t * cols, cols, xq, xs, xsum);
        for (int64_t b = 0; b < cols / 32; b++) {
            int32_t n = 0;
            for (int i = 0; i < 32; i++) n += xq[32 * b + i];
            CHECK(n == xsum[b], "quant_act: block %lld sums to %d, reported %d", (long long)b, n, xsum[b]);
        }
        for (int64_t r = 0; r < rows; r++) {
            double se = 0, sq = 0;
            for (int64_t k = 0; k < cols; k++) {
                se += x[t * cols + k] * w_at(W, r, k);
                sq += (double)xq[k] * xs[k / 32] * w_at(W, r, k);
            }
            if (bias) { se += h2d(bias[r]); sq += h2d(bias[r]); }
            exact[t * rows + r] = (float)(gelu ? gelu_d(se) : se);
            defn[t * rows + r] = (float)(gelu ? gelu_d(sq) : sq);
        }
    }
    const char *name = kind == WQ_I4 ? "I4" : "I8";
    bool have_first = false;
    pln_cpu_set_int_dot(g_be, true);
    /* every tier, the SIMD ones with VNNI (where the CPU has it) and with vpmaddubsw */
    for (int pass = 0; pass < 2 * PLN_CPU_ISA_COUNT; pass++) {
        int isa = pass % PLN_CPU_ISA_COUNT;
        pln_cpu_no_vnni = pass >= PLN_CPU_ISA_COUNT;
        if (isa < PLN_CPU_ISA_C || !pln_cpu_isa_supported((pln_cpu_isa)isa) || pln_cpu_set_isa(g_be, (pln_cpu_isa)isa)) continue;
        memset(o, 0xff, (size_t)(T * rows) * 4);
        CHECK(g_be->linear(g_be, o, x, W, bias, T, gelu) == 0, "int-dot linear: %s", pln_error());
        if (T <= 8) {   /* the same call again: the same bits (no order depends on threads or timing) */
            float *again = malloc((size_t)(T * rows) * 4);
            CHECK(g_be->linear(g_be, again, x, W, bias, T, gelu) == 0, "int-dot linear: %s", pln_error());
            CHECK(!memcmp(o, again, (size_t)(T * rows) * 4), "int-dot %s g%lld T=%d: tier %s%s differs between two runs",
                  kind == WQ_I4 ? "I4" : "I8", (long long)group, T, pln_cpu_isa_name((pln_cpu_isa)isa),
                  pln_cpu_no_vnni ? " (no VNNI)" : "");
            free(again);
        }
        if (T == 1 && kind == WQ_I4 && (isa == PLN_CPU_ISA_AVX512 || isa == PLN_CPU_ISA_AVX2)) {
            /* one int4 token (the GEMV: simd_avx512.c gemv_q4_vnni512 where the shape allows,
             * simd_avx2.c's with AVX-VNNI and with vpmaddubsw): bit for bit what the same token
             * gets beside another in gemm_q4n */
            float *x2 = malloc((size_t)(2 * cols) * 4), *o2 = malloc((size_t)(2 * rows) * 4);
            memcpy(x2, x, (size_t)cols * 4);
            memcpy(x2 + cols, x, (size_t)cols * 4);
            CHECK(g_be->linear(g_be, o2, x2, W, bias, 2, gelu) == 0, "int-dot linear: %s", pln_error());
            CHECK(!memcmp(o, o2, (size_t)rows * 4) && !memcmp(o, o2 + rows, (size_t)rows * 4),
                  "int-dot I4 g%lld [%lld, %lld]: one token differs from the same token in a batch of 2", (long long)group,
                  (long long)rows, (long long)cols);
            free(x2);
            free(o2);
            /* and each token of a batch of 3, 8, 11 or 16 different ones (gemm_q4b where the
             * shape allows: segments per token count; AVX-512 4-row and single-row tiles, token
             * tiles of 3, 2 and 1; AVX2 token tiles of 8 and of every remainder) gets the bits it
             * gets alone */
            static const int Bs[] = {3, 8, 11, 16};
            for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++) {
                int B = Bs[bi];
                float *xb = rnd_vec((size_t)(B * cols), -1, 1), *ob = malloc((size_t)(B * rows) * 4);
                float *o1 = malloc((size_t)rows * 4);
                CHECK(g_be->linear(g_be, ob, xb, W, bias, B, gelu) == 0, "int-dot linear: %s", pln_error());
                int bad = 0;
                for (int j = 0; j < B; j++) {
                    CHECK(g_be->linear(g_be, o1, xb + (int64_t)j * cols, W, bias, 1, gelu) == 0, "int-dot linear: %s",
                          pln_error());
                    bad += memcmp(o1, ob + (int64_t)j * rows, (size_t)rows * 4) != 0;
                }
                CHECK(bad == 0, "int-dot I4 g%lld [%lld, %lld]: %d of %d tokens of a batch differ from the same token alone",
                      (long long)group, (long long)rows, (long long)cols, bad, B);
                free(xb);
                free(ob);
                free(o1);
            }
        }
        if (kind != WQ_I4 && T < pln_cpu_q8_min(pln_cpu_of(g_be)->k)) {
            /* one int8 token, or fewer than the tier's pln_cpu_q8_min: the float path, bit for bit
             * (cpu.h Q8_MIN_NOTE) */
            float *fl = malloc((size_t)(T * rows) * 4);
            pln_cpu_set_int_dot(g_be, false);
            CHECK(g_be->linear(g_be, fl, x, W, bias, T, gelu) == 0, "linear: %s", pln_error());
            pln_cpu_set_int_dot(g_be, true);
            CHECK(!memcmp(o, fl, (size_t)(T * rows) * 4), "int-dot on, %d int8 token(s), tier %s%s: the float path", T,
                  pln_cpu_isa_name((pln_cpu_isa)isa), pln_cpu_no_vnni ? " (no VNNI)" : "");
            free(fl);
            if (T == 1) continue;
            /* the batch-invariant mode takes gemm_q8 at every step size (a step of fewer than
             * PLN_CPU_BI_MIN_TOKENS as one of that many): the tier's tiles at this T, held to the
             * definition below */
            pln_cpu_set_batch_invariant(g_be, true);
            CHECK(g_be->linear(g_be, o, x, W, bias, T, gelu) == 0, "int-dot linear: %s", pln_error());
            pln_cpu_set_batch_invariant(g_be, false);
        }
        /* the integer dots are exact: what is left is fp32 summation order (and GeLU's form) */
        double rdt = test_rel_l2(o, defn, (size_t)(T * rows));
        CHECK(rdt < 2e-6, "int-dot %s g%lld [%lld, %lld] T=%d: tier %s%s rel L2 %.3g from the integer reference", name,
              (long long)group, (long long)rows, (long long)cols, T, pln_cpu_isa_name((pln_cpu_isa)isa),
              pln_cpu_no_vnni ? " (no VNNI)" : "", rdt);
        if (!have_first) { memcpy(first, o, (size_t)(T * rows) * 4); have_first = true; }
        else
            CHECK(test_rel_l2(o, first, (size_t)(T * rows)) < 1e-6, "int-dot %s g%lld T=%d: tier %s%s far from the C tier",
                  name, (long long)group, T, pln_cpu_isa_name((pln_cpu_isa)isa), pln_cpu_no_vnni ? " (no VNNI)" : "");
    }
    pln_cpu_no_vnni = false;
    pln_cpu_set_int_dot(g_be, false);
    pln_cpu_set_isa(g_be, pln_cpu_isa_best());
    if (!have_first) {
        free(tw.w); free(tw.scale); free(x); free(o); free(first); free(bias); free(exact); free(defn); free(xq); free(xs); free(xsum);
        return;
    }
    double rd = test_rel_l2(first, defn, (size_t)(T * rows)), re = test_rel_l2(first, exact, (size_t)(T * rows));
    CHECK(rd < 2e-6, "int-dot %s g%lld [%lld, %lld] T=%d: rel L2 %.3g from its definition", name, (long long)group,
          (long long)rows, (long long)cols, T, rd);
    CHECK(re > 0 && re < 1.5e-2, "int-dot %s g%lld [%lld, %lld] T=%d: rel L2 %.3g from the exact result", name,
          (long long)group, (long long)rows, (long long)cols, T, re);
    if (re > *worst_rel) *worst_rel = re;
    free(tw.w); free(tw.scale); free(x); free(o); free(first); free(bias); free(exact); free(defn); free(xq); free(xs); free(xsum);
}

/* The SIMD tiers' kernel tables beside the instruction set each needs (tests skip the ones this
 * CPU lacks). */
static const pln_cpu_kernels *const tiers[] = {&pln_cpu_kernels_c,
#ifdef PLN_CPU_X86
                                               &pln_cpu_kernels_avx2, &pln_cpu_kernels_avx512,
#endif
};
static const pln_cpu_isa isas[] = {PLN_CPU_ISA_C,
#ifdef PLN_CPU_X86
                                   PLN_CPU_ISA_AVX2, PLN_CPU_ISA_AVX512,
#endif
};

/* Every tier's quant_act writes what pln_cpu_quant_act computes, bit for bit, at the places
 * gemm_q8 reads (one token: plain rows; several: token-interleaved): random blocks, an all-zero
 * block, products that land on .5 (round half to even), a NaN (ignored by the block's max). */
static void test_quant_act_tiers(void) {
    const int64_t K = 256, nb = K / 32;
    static const int nts[] = {1, 3, 7};
    for (size_t ni = 0; ni < sizeof nts / sizeof nts[0]; ni++) {
        int nt = nts[ni];
        float *x = rnd_vec((size_t)(nt * K), -3, 3);
        for (int t = 0; t < nt; t++) {
            for (int i = 0; i < 32; i++) x[t * K + 32 + i] = 0.0f;                 /* block 1: zeros */
            for (int i = 0; i < 32; i++) x[t * K + 64 + i] = (float)(i - 16) * 0.5f; /* block 2: ties */
            x[t * K + 64 + 31] = 127.0f;   /* amax 127: inv 1, x * inv = k + 0.5 exactly */
            x[t * K + 100] = NAN;          /* block 3 */
        }
        int8_t *qr = malloc((size_t)(nt * K)), *qt = malloc((size_t)(nt * K));
        float *sr = malloc((size_t)(nt * nb) * 4), *st = malloc((size_t)(nt * nb) * 4);
        int32_t *ur = malloc((size_t)(nt * nb) * 4), *ut = malloc((size_t)(nt * nb) * 4);
        for (int t = 0; t < nt; t++) pln_cpu_quant_act_il(x, K, qr, sr, ur, nt, t, t + 1);   /* token by token */
        for (size_t k = 0; k < sizeof tiers / sizeof tiers[0]; k++) {
            if (!pln_cpu_isa_supported(isas[k])) continue;
            memset(qt, 0x55, (size_t)(nt * K));
            if (nt == 7) {   /* a run split unevenly, as linear.c splits tokens between threads */
                tiers[k]->quant_act(x, K, qt, st, ut, nt, 0, 2);
                tiers[k]->quant_act(x, K, qt, st, ut, nt, 2, 7);
            } else
                tiers[k]->quant_act(x, K, qt, st, ut, nt, 0, nt);
            /* the NaN's block (3): its byte is whatever the conversion makes of NaN; the rest must match */
            bool same = !memcmp(sr, st, (size_t)(nt * nb) * 4);
            for (int64_t i = 0; i < nt * K; i++) {
                int64_t g = i / 4 / nt, col = 4 * g + i % 4;   /* interleaved byte i is column col */
                if (col / 32 == 3) continue;
                same = same && qr[i] == qt[i];
            }
            for (int64_t i = 0; i < nt * nb; i++) same = same && (i / nt == 3 || ur[i] == ut[i]);
            CHECK(same, "quant_act: tier %s, %d token(s): differs from pln_cpu_quant_act", tiers[k]->name, nt);
        }
        /* ties went to even: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2 */
        int8_t tie[4];
        for (int j = 0; j < 4; j++) {
            int col = 64 + (j == 0 ? 17 : j == 1 ? 19 : j == 2 ? 15 : 13);
            tie[j] = qr[4 * ((col / 4) * nt) + col % 4];
        }
        CHECK(tie[0] == 0 && tie[1] == 2 && tie[2] == 0 && tie[3] == -2, "quant_act: ties to even, got %d %d %d %d",
              tie[0], tie[1], tie[2], tie[3]);
        free(x); free(qr); free(qt); free(sr); free(st); free(ur); free(ut);
    }
}

/* The integer-dot path's weight repack (cpu.h pln_cpu_q8_repack) byte for byte against its
 * definition: every row count of a 16-row set (rows past nr zero), int4 (stored nibbles, low ones
 * a block's columns 0-15) and int8 (q + 128), one block and many. */
/* The integer-dot layout's stride (cpu.h Q8_LDQ_NOTE): the token count itself up to 16 (the
 * groups side by side), past that a whole, odd number of 16-token cache lines, never more than
 * 32 tokens of padding. */
/* The FMA peak's loop (pln_cpu_fma_gflops) on every tier: it counts 2 flops per lane per
 * multiply-add, and runs every one of them: its chains' sum is the recurrence a = a b + c run n
 * times here on each chain (fused on the SIMD tiers, a multiply and an add in C), which a loop
 * that skipped steps or chains would miss. */
static void test_fma_chains(void) {
    static const int lanes[] = {1, 8, 16};
    const int64_t n = 100000;
    for (size_t k = 0; k < sizeof tiers / sizeof tiers[0]; k++) {
        if (!pln_cpu_isa_supported(isas[k])) continue;
        double want = 0;
        for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) {
            volatile float b = 0.999999f, c = 1e-7f;   /* volatile: no contraction of the C form */
            float a = 1.0f + 1e-3f * (float)i;
            for (int64_t j = 0; j < n; j++) a = k ? fmaf(a, b, c) : a * b + c;
            want += lanes[k] * (double)a;
        }
        float sink = 0.0f;
        double flops = tiers[k]->fma_chains(n, &sink);
        CHECK(flops == 2.0 * lanes[k] * PLN_CPU_FMA_CHAINS * (double)n, "fma_chains (%s): %g flops for %lld steps",
              pln_cpu_isa_name(isas[k]), flops, (long long)n);
        CHECK(fabs(sink - want) <= 1e-5 * want, "fma_chains (%s): chains sum to %.7g, want %.7g",
              pln_cpu_isa_name(isas[k]), (double)sink, want);
        float s2 = 0.0f;
        tiers[k]->fma_chains(n / 2, &s2);
        CHECK(fabs(s2 - sink) > 1e-3 * sink, "fma_chains (%s): half the steps give another value (%.7g, %.7g)",
              pln_cpu_isa_name(isas[k]), (double)s2, (double)sink);
    }
}

/* THREAD_GAP_NOTE's rule: whole 64 KiB units, and at least 64 KiB beyond the buffer. */
static void test_thread_stride(void) {
    const size_t u = 16384;   /* 64 KiB of floats */
    int bad = 0;
    for (size_t n = 0; n <= 3 * u + 7; n += n < 70 ? 1 : 997) {
        size_t s = pln_cpu_thread_stride(n);
        if (s % u || s < n + u || s >= n + 2 * u) {
            if (bad++ < 3) CHECK(0, "pln_cpu_thread_stride(%zu) = %zu", n, s);
        }
    }
    CHECK(bad == 0, "pln_cpu_thread_stride: %d sizes off its rule", bad);
    CHECK(pln_cpu_thread_stride(PLN_CPU_PANEL_SCRATCH) == 3 * u && pln_cpu_thread_stride(64) == u + u,
          "pln_cpu_thread_stride: panel scratch -> %zu, 64 -> %zu", pln_cpu_thread_stride(PLN_CPU_PANEL_SCRATCH),
          pln_cpu_thread_stride(64));
}

/* WORK_NOTE's buffers: 64-byte aligned, kept when a call needs less, grown when it needs more; and
 * what a call leaves in them never reaches another call's results: a backend whose every buffer
 * holds NaN bytes gives, bit for bit, what a fresh one gives, on the batched float path and the
 * integer-dot path, with and without SwiGLU. */
static void test_work_buffers(void) {
    pln_backend *be = pln_backend_create("cpu", 0), *fresh = pln_backend_create("cpu", 0);
    CHECK(be && fresh, "cpu backend: %s", pln_error());
    if (!be || !fresh) return;
    pln_cpu *c = pln_cpu_of(be);
    void *a = pln_cpu_work(c, PLN_CPU_WORK_X, 100);
    CHECK(a && (uintptr_t)a % 64 == 0, "pln_cpu_work: %p not 64-byte aligned", a);
    CHECK(pln_cpu_work(c, PLN_CPU_WORK_X, 64) == a, "pln_cpu_work: a smaller request did not keep the buffer");
    size_t big = (size_t)3 << 20;
    for (int s = 0; s < PLN_CPU_WORK_N; s++) {
        unsigned char *b = pln_cpu_work(c, (pln_cpu_work_slot)s, big);
        CHECK(b && (uintptr_t)b % 64 == 0 && c->work[s].n >= big, "pln_cpu_work slot %d: grown to %zu", s, c->work[s].n);
        memset(b, 0xff, big);   /* NaN floats, -1 bytes and ints */
    }
    static const struct { int kind; int64_t group; bool int_dot; } cases[] = {
        {0, 0, false}, {WQ_I8, 32, false}, {WQ_I8, 32, true}, {WQ_I4, 32, true}, {WQ_I8, 0, true}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int sw = 0; sw < 2; sw++) {
            int64_t rows = 200, K = 256;
            int T = 40;   /* the batched float path (PLN_CPU_PANEL_MIN) or the integer dot */
            test_weight tw = make_weight(rows, K, cases[ci].kind, cases[ci].group);
            int64_t n_out = sw ? rows / 2 : rows;
            float *x = rnd_vec((size_t)(T * K), -1, 1), *o1 = malloc((size_t)(T * n_out) * 4), *o2 = malloc((size_t)(T * n_out) * 4);
            pln_cpu_set_int_dot(be, cases[ci].int_dot);
            pln_cpu_set_int_dot(fresh, cases[ci].int_dot);
            pln_epilogue epi = sw ? PLN_EPI_SWIGLU : PLN_EPI_NONE;
            CHECK(be->linear(be, o1, x, &tw.W, NULL, T, epi) == 0 && fresh->linear(fresh, o2, x, &tw.W, NULL, T, epi) == 0,
                  "linear: %s", pln_error());
            int bad = 0;
            for (int64_t i = 0; i < T * n_out; i++) bad += memcmp(&o1[i], &o2[i], 4) != 0 || o1[i] != o1[i];
            CHECK(bad == 0, "work buffers holding NaN: kind %d group %lld int-dot %d swiglu %d: %d outputs differ from a fresh backend's",
                  cases[ci].kind, (long long)cases[ci].group, cases[ci].int_dot, sw, bad);
            free(tw.w); free(tw.scale); free(x); free(o1); free(o2);
        }
    pln_backend_destroy(be);
    pln_backend_destroy(fresh);
}

static void test_q8_ldq(void) {
    int bad = 0;
    for (int64_t nt = 1; nt <= 1100; nt++) {
        int64_t l = pln_cpu_q8_ldq(nt);
        if (nt <= 16 ? l != nt : l < nt || l % 16 || (l / 16) % 2 != 1 || l >= nt + 32) {
            if (bad++ < 3) CHECK(0, "pln_cpu_q8_ldq(%lld) = %lld", (long long)nt, (long long)l);
        }
    }
    CHECK(bad == 0, "pln_cpu_q8_ldq: %d token counts with a stride off its rule", bad);
    CHECK(pln_cpu_q8_ldq(512) == 528 && pln_cpu_q8_ldq(32) == 48 && pln_cpu_q8_ldq(48) == 48,
          "pln_cpu_q8_ldq: 512 -> %lld, 32 -> %lld, 48 -> %lld", (long long)pln_cpu_q8_ldq(512),
          (long long)pln_cpu_q8_ldq(32), (long long)pln_cpu_q8_ldq(48));
}

static void test_q8_repack(void) {
#ifdef PLN_CPU_X86
    if (!pln_cpu_isa_supported(PLN_CPU_ISA_AVX2)) return;
    static const int64_t Ks[] = {32, 96, 544};
    for (int i4 = 0; i4 < 2; i4++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki], rowb = i4 ? K / 2 : K, nb = K / 32;
            uint8_t *w = malloc((size_t)(16 * rowb)), *wp = aligned_alloc(64, (size_t)(512 * nb));
            for (int64_t i = 0; i < 16 * rowb; i++) w[i] = (uint8_t)(rand() >> 7);
            int bad = 0;
            for (int pass = 0; pass < 32; pass++) {
                int nr = pass % 16 + 1;
                bool wide = pass >= 16;   /* the AVX-512 version */
                if (wide && !pln_cpu_isa_supported(PLN_CPU_ISA_AVX512)) break;
                memset(wp, 0xAA, (size_t)(512 * nb));
                if (wide) pln_cpu_q8_repack_avx512(wp, w, i4, nr, K);
                else pln_cpu_q8_repack(wp, w, i4, nr, K);
                for (int64_t b = 0; b < nb; b++)
                    for (int g = 0; g < 8; g++)
                        for (int r = 0; r < 16; r++)
                            for (int c = 0; c < 4; c++) {
                                int64_t col = 4 * g + c;   /* column in the block */
                                uint8_t want = 0;
                                if (r < nr && i4) {
                                    uint8_t byte = w[r * rowb + 16 * b + col % 16];
                                    want = col < 16 ? byte & 15 : byte >> 4;
                                } else if (r < nr)
                                    want = w[r * rowb + 32 * b + col] ^ 0x80;
                                bad += wp[512 * b + 64 * g + 4 * r + c] != want;
                            }
            }
            CHECK(!bad, "q8_repack (and its AVX-512 version) %s, K %lld, 1-16 rows: %d bytes differ from the layout", i4 ? "int4" : "int8",
                  (long long)K, bad);
            free(w);
            free(wp);
        }
#endif
}

static void test_int_dot(void) {
    double worst = 0;
    test_quant_act_tiers();
    test_q8_ldq();
    test_q8_repack();
    /* T: one token (the GEMV), the tile remainders (1, 2, 4 of 8 tokens; 1, 2 of 4) and more than
     * a chunk of PLN_CPU_TCHUNK; rows: not multiples of the 16-row chunk or the 4-row GEMV tile;
     * K: one group (per row) and many, an odd number of 32-column blocks (the GEMV's lone tail
     * block), groups of 96 (a pair of blocks straddles two groups) */
    static const int Ts[] = {1, 2, 3, 5, 8, 15, 70, 515};   /* 515: past linear.c's 512-token batch */
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti];
        test_int_dot_case(37, 256, T, WQ_I8, 0, true, false, &worst);
        test_int_dot_case(19, 384, T, WQ_I8, 32, false, true, &worst);
        test_int_dot_case(21, 384, T, WQ_I8, 96, true, true, &worst);
        test_int_dot_case(33, 416, T, WQ_I8, 32, false, false, &worst);
        test_int_dot_case(6, 96, T, WQ_I8, 0, false, false, &worst);
        test_int_dot_case(37, 384, T, WQ_I4, 32, true, false, &worst);
        test_int_dot_case(9, 512, T, WQ_I4, 128, false, false, &worst);
        test_int_dot_case(40, 256, T, WQ_I4, 64, true, true, &worst);
        test_int_dot_case(13, 288, T, WQ_I4, 96, false, false, &worst);
        test_int_dot_case(16, 224, T, WQ_I4, 224, true, false, &worst);
        /* K past one stretch of the AVX2 tiles' 512 columns (simd_avx2.c Q8_KBLOCKS_NOTE): 33
         * blocks (stretches of 16, 16, 1), groups of 96 split by a stretch's end; per row */
        test_int_dot_case(37, 1056, T, WQ_I4, 96, true, false, &worst);
        test_int_dot_case(19, 1088, T, WQ_I8, 32, false, false, &worst);
        test_int_dot_case(21, 800, T, WQ_I8, 0, true, true, &worst);
        if (T == 1) {
            /* the int4 GEMVs: many groups of 32 with an odd block count (every pair of blocks
             * straddles two groups, then the lone tail) on 3 tail rows; a long per-row K, odd */
            test_int_dot_case(23, 1056, T, WQ_I4, 32, false, false, &worst);
            test_int_dot_case(11, 320, T, WQ_I4, 32, false, true, &worst);   /* 10 blocks: a two-block tail line */
            test_int_dot_case(5, 192, T, WQ_I4, 64, true, false, &worst);    /* 6 blocks in groups of 64 */
            test_int_dot_case(7, 2080, T, WQ_I4, 2080, true, false, &worst);
            /* the whole-line GEMV: two segments of lines (33 lines), groups of 384 whose lines
             * straddle the segment boundary, groups of 256 */
            test_int_dot_case(70, 4224, T, WQ_I4, 32, false, false, &worst);
            test_int_dot_case(6, 4608, T, WQ_I4, 384, true, false, &worst);
            test_int_dot_case(13, 1024, T, WQ_I4, 256, false, true, &worst);
        }
    }
    printf("integer-dot path: worst rel L2 against the exact float result %.3g (activations rounded to int8 per "
           "block of 32)\n", worst);
    /* a shape the blocks do not fit: the float path, bit for bit */
    pln_cpu_set_int_dot(g_be, true);
    test_weight tw = make_weight(7, 96, WQ_I8, 48);
    float *x = rnd_vec(2 * 96, -1, 1), a[14], b[14];
    for (int T = 1; T <= 2; T++) {
        pln_cpu_set_int_dot(g_be, true);
        CHECK(g_be->linear(g_be, a, x, &tw.W, NULL, T, false) == 0, "linear");
        pln_cpu_set_int_dot(g_be, false);
        CHECK(g_be->linear(g_be, b, x, &tw.W, NULL, T, false) == 0, "linear");
        CHECK(!memcmp(a, b, (size_t)(7 * T) * 4), "int-dot on, groups of 48 (not whole blocks of 32), T=%d: the float path", T);
    }
    free(tw.w); free(tw.scale); free(x);
}

/* The SIMD epilogue's GeLU (exp form) against the tanh form in double, over the whole range,
 * including the saturated tails and signed zero. */
static void test_gelu(void) {
    enum { N = 2003 };
    float x[N], o[N];
    uint16_t bias[N];
    for (int i = 0; i < N; i++) { x[i] = -15.0f + 30.0f * (float)i / (N - 1); bias[i] = pln_f32_to_f16(i % 2 ? 0.25f : -0.5f); }
    x[0] = -100.0f; x[1] = 100.0f; x[2] = 0.0f; x[3] = -0.0f; x[4] = 1e-30f; x[5] = -88.5f;
    for (int isa = PLN_CPU_ISA_C; isa < PLN_CPU_ISA_COUNT; isa++) {
        if (!pln_cpu_isa_supported((pln_cpu_isa)isa)) continue;
        pln_cpu_set_isa(g_be, (pln_cpu_isa)isa);
        const pln_cpu_kernels *k = pln_cpu_of(g_be)->k;
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            memcpy(o, x, sizeof o);
            k->bias_gelu(o, with_bias ? bias : NULL, N, true);
            int bad = 0; double worst = 0;
            for (int i = 0; i < N; i++) {
                double v = (double)x[i] + (with_bias ? h2d(bias[i]) : 0.0), want = gelu_d(v);
                double d = fabs(o[i] - want), tol = 4e-7 * fabs(v) + 1e-30;
                if (!(d <= tol)) bad++;
                worst = fmax(worst, d / (fabs(v) + 1e-30));
            }
            CHECK(bad == 0, "bias_gelu [%s] bias=%d: %d outside 4e-7*|x|, worst %g", k->name, with_bias, bad, worst);
        }
    }
}

/* Batch invariance (cpu.h pln_cpu_set_batch_invariant): in the batch-invariant mode a token's
 * outputs are the same bits at every step size from one token up, for every weight kind, with the
 * integer-dot path off and on, on every tier (with and without VNNI): a one-token step (a decode,
 * or the suffix a prefix-cache hit leaves) included. By default the batched float path
 * (pln_cpu_panel_min tokens and more) is invariant among its own step sizes and within fp32
 * rounding of the tiles. */
static void test_batch_invariance(void) {
    static const struct { int kind; int64_t group; const char *name; } kinds[] = {
        {0, 0, "F16"}, {WQ_I8, 0, "I8/channel"}, {WQ_I8, 32, "I8/g32"}, {WQ_I4, 128, "I4/g128"}, {WQ_I4, 32, "I4/g32"}};
    /* 4096 columns: rows longer than every tier's KSTEP, which batches sum in passes */
    const int64_t rows = 37;
    for (int ci = 0; ci < 2; ci++) {
    const int64_t cols = ci ? 4096 : 1024;
    float *x = rnd_vec(100 * cols, -1, 1), *a = malloc(100 * rows * 4), *b = malloc(100 * rows * 4);
    uint16_t *bias = rnd_f16(rows, -0.5f, 0.5f);
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        test_weight tw = make_weight(rows, cols, kinds[kd].kind, kinds[kd].group);
        pln_cpu_set_batch_invariant(g_be, true);
        for (int pass = 0; pass < 2 * PLN_CPU_ISA_COUNT; pass++) {
            int isa = pass % PLN_CPU_ISA_COUNT;
            pln_cpu_no_vnni = pass >= PLN_CPU_ISA_COUNT;
            if (isa < PLN_CPU_ISA_C || !pln_cpu_isa_supported((pln_cpu_isa)isa) || pln_cpu_set_isa(g_be, (pln_cpu_isa)isa)) continue;
            for (int id = 0; id < 2; id++) {
                pln_cpu_set_int_dot(g_be, id);
                g_be->linear(g_be, a, x, &tw.W, bias, 100, true);
                int bad = 0, bad_t = 0;
                /* 1..20, 51, and 65 and 66: a last block of one and two tokens past the first
                 * PLN_CPU_TCHUNK, whose tiles must sum as a full block's do */
                static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 51, 65, 66};
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    int T = Ts[ti];
                    g_be->linear(g_be, b, x, &tw.W, bias, T, true);
                    int n = T;
                    if (memcmp(a, b, (size_t)(n * rows) * 4)) { bad++; if (!bad_t) bad_t = T; }
                }
                CHECK(bad == 0, "batch-invariant %s K=%lld, tier %s%s, int-dot %s: %d step sizes differ from T=100 (first T=%d)",
                      kinds[kd].name, (long long)cols, pln_cpu_isa_name((pln_cpu_isa)isa), pln_cpu_no_vnni ? " (no VNNI)" : "",
                      id ? "on" : "off", bad, bad_t);
            }
        }
        pln_cpu_no_vnni = false;
        pln_cpu_set_int_dot(g_be, false);
        /* default: T >= pln_cpu_panel_min among themselves bit for bit, fewer within rounding; on
         * every tier, and on those with a batched float path (AVX2, AVX-512) T = 100 is not the
         * tiles' bits (the batch-invariant mode's), so the path was taken */
        FOR_EACH_ISA(isa) {
            if (isa < PLN_CPU_ISA_C) continue;
            pln_cpu_set_batch_invariant(g_be, true);
            g_be->linear(g_be, a, x, &tw.W, bias, 100, true);
            pln_cpu_set_batch_invariant(g_be, false);
            g_be->linear(g_be, b, x, &tw.W, bias, 100, true);
            bool panel = pln_cpu_of(g_be)->k->gemm_panel != NULL;
            CHECK(panel == (isa == PLN_CPU_ISA_AVX2 || isa == PLN_CPU_ISA_AVX512), "tier %s: has a batched float path", g_isa);
            CHECK(panel == (memcmp(a, b, (size_t)(100 * rows) * 4) != 0),
                  "default %s, tier %s: T=100 %s the tiles' bits", kinds[kd].name, g_isa, panel ? "has" : "lacks");
            for (int T = pln_cpu_panel_min(pln_cpu_of(g_be)->k, &tw.W); T <= 80; T += 16) {
                g_be->linear(g_be, a, x, &tw.W, bias, T, true);
                CHECK(!memcmp(a, b, (size_t)(T * rows) * 4), "default %s, tier %s: T=%d differs from T=100", kinds[kd].name,
                      g_isa, T);
            }
            g_be->linear(g_be, a, x, &tw.W, bias, 5, true);
            double d = test_rel_l2(a, b, (size_t)(5 * rows));
            CHECK(d <= 1e-5, "default %s, tier %s: T=5 against T=100: rel %.3g", kinds[kd].name, g_isa, d);
        }
        pln_cpu_set_isa(g_be, pln_cpu_isa_best());
        free(tw.w); free(tw.scale);
    }
    free(x); free(a); free(b); free(bias);
    }
    /* The integer-dot path quantizes and runs up to 512 tokens at once: 513 tokens leave a
     * block of one, whose token must still get its bits (K = 1024, one int8 and one int4 kind) */
    {
        const int64_t cols = 1024, big = 520;
        float *x = rnd_vec(big * cols, -1, 1), *a = malloc(big * rows * 4), *b = malloc(big * rows * 4);
        for (int kd = 0; kd < 2; kd++) {
            test_weight tw = make_weight(rows, cols, kd ? WQ_I4 : WQ_I8, 32);
            pln_cpu_set_batch_invariant(g_be, true);
            pln_cpu_set_int_dot(g_be, true);
            FOR_EACH_ISA(isa) {
                if (isa < PLN_CPU_ISA_C) continue;
                g_be->linear(g_be, a, x, &tw.W, NULL, big, false);
                for (int T = 513; T <= 514; T++) {
                    g_be->linear(g_be, b, x, &tw.W, NULL, T, false);
                    CHECK(!memcmp(a, b, (size_t)(T * rows) * 4), "batch-invariant %s, int-dot on, tier %s: T=%d differs from T=%d",
                          kd ? "I4/g32" : "I8/g32", g_isa, T, (int)big);
                }
            }
            pln_cpu_set_int_dot(g_be, false);
            pln_cpu_set_batch_invariant(g_be, false);
            pln_cpu_set_isa(g_be, pln_cpu_isa_best());
            free(tw.w); free(tw.scale);
        }
        free(x); free(a); free(b);
    }
}

/* Threads split whole output rows: one thread or several give the very same bits. */
static void test_threads(void) {
    test_weight tw = make_weight(301, 700, true, 0);
    float *x = rnd_vec(9 * 700, -1, 1), *a = malloc(9 * 301 * 4), *b = malloc(9 * 301 * 4);
    pln_cpu_set_threads(g_be, 1);
    CHECK(pln_cpu_threads(pln_cpu_of(g_be)) == 1, "set_threads(1)");
    g_be->linear(g_be, a, x, &tw.W, NULL, 9, true);
    pln_cpu_set_threads(g_be, 3);
    g_be->linear(g_be, b, x, &tw.W, NULL, 9, true);
    CHECK(!memcmp(a, b, 9 * 301 * 4), "linear: 1 thread and 3 threads differ");
    /* the batched float path too (its units of rows are fixed, whichever thread takes them, and
     * its panels packed by whichever threads arrive first: linear.c PACK_NOTE); 70 tokens: past
     * every tier's pln_cpu_panel_min for these per-row int8 weights, in three panels */
    float *xb = rnd_vec(70 * 700, -1, 1), *c1 = malloc(70 * 301 * 4), *c3 = malloc(70 * 301 * 4);
    pln_cpu_set_threads(g_be, 1);
    g_be->linear(g_be, c1, xb, &tw.W, NULL, 70, false);
    pln_cpu_set_threads(g_be, 3);
    g_be->linear(g_be, c3, xb, &tw.W, NULL, 70, false);
    CHECK(!memcmp(c1, c3, 70 * 301 * 4), "linear, 70 tokens: 1 thread and 3 threads differ");
    free(xb); free(c1); free(c3);
    pln_cpu_set_threads(g_be, 0);
    CHECK(pln_cpu_threads(pln_cpu_of(g_be)) == omp_get_max_threads(), "set_threads(0): OpenMP's default");
    free(tw.w); free(tw.scale); free(x); free(a); free(b);
}

static void test_logits(void) {
    for (int i8 = 0; i8 < 2; i8++) {
        int64_t vn = 29, H = 40, n_valid = 23;
        int S = 3;
        test_weight tw = make_weight(vn, H, i8, i8 ? 8 : 0);
        float *x = rnd_vec((size_t)(S * H), -1, 1), *o = malloc((size_t)(S * vn) * 4);
        FOR_EACH_ISA(isa) {
            CHECK(g_be->logits(g_be, o, x, &tw.W, S, n_valid) == 0, "logits: %s", pln_error());
            int bad = 0;
            for (int s = 0; s < S; s++)
                for (int64_t r = 0; r < vn; r++) {
                    float got = o[s * vn + r];
                    if (r >= n_valid) { bad += !(isinf(got) && got < 0); continue; }
                    double want = 0, m = 0;
                    for (int64_t k = 0; k < H; k++) { want += x[s * H + k] * w_at(&tw.W, r, k); m += fabs(x[s * H + k] * w_at(&tw.W, r, k)); }
                    bad += !(fabs(got - want) <= 2e-6 * m + 1e-6);
                }
            CHECK(bad == 0, "logits [%s] %s: %d wrong (rows >= n_valid must be -inf)", g_isa, i8 ? "I8" : "F16", bad);
        }
        free(tw.w); free(tw.scale); free(x); free(o);
    }
}

/* ---- KV cache + attention ------------------------------------------------------------------ */
static void test_attention_case(int n_head, int head_dim, int block_size, bool long_ctx) {
    enum { S = 4 };
    /* per sequence: tokens already in the cache, and tokens fed in this step (long: prefills
     * whose query groups and 16-key score blocks cross many KV blocks, causal tails included) */
    int32_t prior[S] = {0, 9, 5, 16}, fed[S] = {7, 1, 3, 1};
    if (long_ctx) {
        static const int32_t lp[S] = {0, 70, 37, 100}, lf[S] = {41, 1, 19, 2};
        memcpy(prior, lp, sizeof prior);
        memcpy(fed, lf, sizeof fed);
    }
    int max_len = 0;
    for (int s = 0; s < S; s++) if (prior[s] + fed[s] > max_len) max_len = prior[s] + fed[s];
    int32_t max_blocks = (max_len + block_size - 1) / block_size + 1;
    int32_t n_blocks = S * max_blocks + 3;
    /* scatter blocks: a random permutation of the pool */
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { int j = (int)(rnd_u32() % (uint32_t)(i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int32_t *table = malloc((size_t)(S * max_blocks) * 4);
    for (int i = 0; i < S * max_blocks; i++) table[i] = perm[i];
    int64_t width = (int64_t)n_head * 3 * head_dim, ow = (int64_t)n_head * head_dim;
    /* each sequence's full qkv history */
    float *hist[S];
    for (int s = 0; s < S; s++) hist[s] = rnd_vec((size_t)((prior[s] + fed[s]) * width), -1, 1);
    float slopes[16];
    for (int h = 0; h < n_head; h++) slopes[h] = pln_alibi_slope(h, n_head);
    size_t pool = (size_t)n_blocks * n_head * block_size * head_dim;
    float *kc = malloc(pool * 4), *vc = malloc(pool * 4);

    /* step tokens, sequences interleaved the way a scheduler would concatenate them */
    int T1 = 0, T2 = 0;
    for (int s = 0; s < S; s++) { T1 += prior[s]; T2 += fed[s]; }
    float *qkv1 = malloc((size_t)((T1 ? T1 : 1) * width) * 4), *qkv2 = malloc((size_t)(T2 * width) * 4);
    int32_t *seq1 = malloc((size_t)(T1 ? T1 : 1) * 4), *pos1 = malloc((size_t)(T1 ? T1 : 1) * 4);
    int32_t seq2[64], pos2[64];
    int t = 0;
    for (int s = 0; s < S; s++)
        for (int j = 0; j < prior[s]; j++, t++) {
            seq1[t] = s; pos1[t] = j;
            memcpy(qkv1 + t * width, hist[s] + j * width, (size_t)width * 4);
        }
    t = 0;
    for (int s = S - 1; s >= 0; s--)
        for (int j = prior[s]; j < prior[s] + fed[s]; j++, t++) {
            seq2[t] = s; pos2[t] = j;
            memcpy(qkv2 + t * width, hist[s] + j * width, (size_t)width * 4);
        }
    /* double reference */
    double *want = malloc((size_t)(T2 * ow) * 8);
    for (t = 0; t < T2; t++) {
        int s = seq2[t], p = pos2[t];
        for (int h = 0; h < n_head; h++) {
            const float *q = hist[s] + p * width + h * 3 * head_dim;
            double sc[128], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                const float *k = hist[s] + j * width + (h * 3 + 1) * head_dim;
                double d = 0;
                for (int e = 0; e < head_dim; e++) d += (double)q[e] * k[e];
                sc[j] = d / sqrt((double)head_dim) + (double)slopes[h] * j;
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
            for (int e = 0; e < head_dim; e++) {
                double acc = 0;
                for (int j = 0; j <= p; j++) acc += sc[j] / sum * hist[s][j * width + (h * 3 + 2) * head_dim + e];
                want[t * ow + h * head_dim + e] = acc;
            }
        }
    }
    float *out = malloc((size_t)(T2 * ow) * 4);
    FOR_EACH_ISA(isa) {
        for (size_t i = 0; i < pool; i++) { kc[i] = NAN; vc[i] = NAN; }   /* unwritten rows must never be read */
        pln_attn_meta m1 = {T1, S, block_size, max_blocks, max_len, seq1, pos1, table, 0, 0};
        pln_attn_meta m2 = {T2, S, block_size, max_blocks, max_len, seq2, pos2, table, 0, 0};
        CHECK(g_be->kv_append(g_be, qkv1, kc, vc, &m1, n_head, head_dim) == 0, "kv_append 1: %s", pln_error());
        CHECK(g_be->kv_append(g_be, qkv2, kc, vc, &m2, n_head, head_dim) == 0, "kv_append 2: %s", pln_error());
        /* the cache layout exactly as backend.h defines it */
        int bad = 0;
        for (int s = 0; s < S; s++)
            for (int j = 0; j < prior[s] + fed[s]; j++)
                for (int h = 0; h < n_head; h++) {
                    int64_t off = (((int64_t)table[s * max_blocks + j / block_size] * n_head + h) * block_size + j % block_size) * head_dim;
                    bad += memcmp(kc + off, hist[s] + j * width + (h * 3 + 1) * head_dim, (size_t)head_dim * 4) != 0;
                    bad += memcmp(vc + off, hist[s] + j * width + (h * 3 + 2) * head_dim, (size_t)head_dim * 4) != 0;
                }
        CHECK(bad == 0, "kv_append [%s] heads=%d d=%d bs=%d: %d rows misplaced", g_isa, n_head, head_dim, block_size, bad);
        CHECK(g_be->attention(g_be, out, qkv2, kc, vc, &m2, slopes, n_head, head_dim) == 0, "attention: %s", pln_error());
        double md = 0;
        for (int64_t i = 0; i < T2 * ow; i++) md = fmax(md, fabs(out[i] - want[i]));
        CHECK(md < 2e-6, "attention [%s] heads=%d d=%d bs=%d: max diff %g", g_isa, n_head, head_dim, block_size, md);
    }
    /* a bad block table is an error, not a wild write */
    int32_t saved = table[1 * max_blocks + 0];
    table[1 * max_blocks + 0] = -1;
    pln_attn_meta mb = {T2, S, block_size, max_blocks, max_len, seq2, pos2, table, 0, 0};
    CHECK(g_be->attention(g_be, out, qkv2, kc, vc, &mb, slopes, n_head, head_dim) == -1 && strstr(pln_error(), "block"),
          "attention with an unassigned block: want an error, got \"%s\"", pln_error());
    table[1 * max_blocks + 0] = saved;
    for (int s = 0; s < S; s++) free(hist[s]);
    free(perm); free(table); free(kc); free(vc); free(qkv1); free(qkv2); free(seq1); free(pos1); free(want); free(out);
}

static void test_attention(void) {
    test_attention_case(3, 8, 4, false);
    test_attention_case(2, 13, 5, false);
    test_attention_case(4, 64, 16, false);
    test_attention_case(1, 128, 3, false);
    test_attention_case(2, 64, 16, true);
    test_attention_case(2, 128, 48, true);
    test_attention_case(1, 80, 32, true);
    test_attention_case(1, 24, 7, true);
    /* ALiBi slopes against DESIGN.md's formula, powers of two and not */
    static const int heads[] = {1, 6, 8, 12, 16, 112};
    for (size_t i = 0; i < 6; i++) {
        int n = heads[i], p = 1 << (int)floor(log2(n)), bad = 0;
        double base = pow(2, -pow(2, -(log2(p) - 3))), extra = pow(2, -pow(2, -(log2(2 * p) - 3)));
        for (int h = 0; h < n; h++) {
            double want = h < p ? pow(base, h + 1) : pow(extra, 2 * (h - p) + 1);
            bad += fabs(pln_alibi_slope(h, n) - want) > 1e-7 * want;
        }
        CHECK(bad == 0, "alibi slopes n_head=%d: %d wrong", n, bad);
    }
}

/* F16 KV cache: kv_append stores round-to-nearest-even halves, and attention over them must equal,
 * bit for bit, F32-cache attention over keys/values rounded the same way (conversion is the only
 * difference), in every instruction set. Contexts span many blocks and several 64-key stretches;
 * both a mixed prefill step and a pure decode step (which prefetches) are run. */
static void test_attention_f16_case(int n_head, int head_dim, int block_size, bool decode) {
    enum { S = 3 };
    int32_t prior[S] = {0, 150, 37}, fed[S] = {9, 1, 5};
    if (decode) { prior[0] = 70; fed[0] = 1; fed[2] = 1; }
    int max_len = 0;
    for (int s = 0; s < S; s++) if (prior[s] + fed[s] > max_len) max_len = prior[s] + fed[s];
    int32_t max_blocks = (max_len + block_size - 1) / block_size;
    int32_t n_blocks = S * max_blocks;
    int32_t *table = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { int j = (int)(rnd_u32() % (uint32_t)(i + 1)); int32_t x = table[i]; table[i] = table[j]; table[j] = x; }
    int64_t width = (int64_t)n_head * 3 * head_dim, ow = (int64_t)n_head * head_dim;
    float slopes[16];
    for (int h = 0; h < n_head; h++) slopes[h] = pln_alibi_slope(h, n_head);
    int T1 = 0, T2 = 0;
    for (int s = 0; s < S; s++) { T1 += prior[s]; T2 += fed[s]; }
    /* step 1 fills the prior tokens, step 2 feeds the rest; *r: k and v rounded through F16 */
    float *qkv1 = rnd_vec((size_t)(T1 * width), -2, 2), *qkv2 = rnd_vec((size_t)(T2 * width), -2, 2);
    float *r1 = malloc((size_t)(T1 * width) * 4), *r2 = malloc((size_t)(T2 * width) * 4);
    memcpy(r1, qkv1, (size_t)(T1 * width) * 4);
    memcpy(r2, qkv2, (size_t)(T2 * width) * 4);
    for (int64_t i = 0; i < T1 * width; i++) if ((i / head_dim) % 3) r1[i] = pln_f16_to_f32(pln_f32_to_f16(r1[i]));
    for (int64_t i = 0; i < T2 * width; i++) if ((i / head_dim) % 3) r2[i] = pln_f16_to_f32(pln_f32_to_f16(r2[i]));
    int32_t *seq1 = malloc((size_t)T1 * 4), *pos1 = malloc((size_t)T1 * 4), seq2[32], pos2[32];
    int t = 0;
    for (int s = 0; s < S; s++) for (int j = 0; j < prior[s]; j++, t++) { seq1[t] = s; pos1[t] = j; }
    t = 0;
    for (int s = S - 1; s >= 0; s--) for (int j = prior[s]; j < prior[s] + fed[s]; j++, t++) { seq2[t] = s; pos2[t] = j; }
    pln_attn_meta m1 = {T1, S, block_size, max_blocks, max_len, seq1, pos1, table, 0, 0};
    pln_attn_meta m2 = {T2, S, block_size, max_blocks, max_len, seq2, pos2, table, 0, 0};
    size_t pool = (size_t)n_blocks * n_head * block_size * head_dim;
    float *kc = malloc(pool * 4), *vc = malloc(pool * 4);
    uint16_t *kh = malloc(pool * 2), *vh = malloc(pool * 2);
    float *o32 = malloc((size_t)(T2 * ow) * 4), *o16 = malloc((size_t)(T2 * ow) * 4);
    pln_backend *be16 = pln_backend_create("cpu", 0);
    CHECK(be16 && pln_backend_set_kv_dtype(be16, PLN_DTYPE_F16) == 0 && be16->kv_size == 2 && be16->kv_dtype == PLN_DTYPE_F16,
          "cpu backend switches to an F16 KV cache: %s", pln_error());
    FOR_EACH_ISA(isa) {
        pln_cpu_set_isa(be16, (pln_cpu_isa)isa);
        memset(kc, 0, pool * 4); memset(vc, 0, pool * 4);
        for (size_t i = 0; i < pool; i++) kh[i] = vh[i] = 0x7e00;   /* NaN: unwritten rows must never be read */
        CHECK(g_be->kv_append(g_be, r1, kc, vc, &m1, n_head, head_dim) == 0 &&
              g_be->kv_append(g_be, r2, kc, vc, &m2, n_head, head_dim) == 0, "kv_append f32: %s", pln_error());
        CHECK(be16->kv_append(be16, qkv1, kh, vh, &m1, n_head, head_dim) == 0 &&
              be16->kv_append(be16, qkv2, kh, vh, &m2, n_head, head_dim) == 0, "kv_append f16: %s", pln_error());
        /* every written half is the nearest-even rounding of what the F32 cache holds */
        int bad = 0;
        for (int s = 0; s < S; s++)
            for (int j = 0; j < prior[s] + fed[s]; j++)
                for (int h = 0; h < n_head; h++) {
                    int64_t off = (((int64_t)table[s * max_blocks + j / block_size] * n_head + h) * block_size + j % block_size) * head_dim;
                    for (int e = 0; e < head_dim; e++)
                        bad += kh[off + e] != pln_f32_to_f16(kc[off + e]) || vh[off + e] != pln_f32_to_f16(vc[off + e]);
                }
        CHECK(bad == 0, "kv_append f16 [%s] d=%d bs=%d: %d halves wrong", g_isa, head_dim, block_size, bad);
        CHECK(g_be->attention(g_be, o32, r2, kc, vc, &m2, slopes, n_head, head_dim) == 0, "attention f32: %s", pln_error());
        CHECK(be16->attention(be16, o16, qkv2, kh, vh, &m2, slopes, n_head, head_dim) == 0, "attention f16: %s", pln_error());
        int diff = 0;
        for (int64_t i = 0; i < T2 * ow; i++) diff += memcmp(&o32[i], &o16[i], 4) != 0 || isnan(o16[i]);
        CHECK(diff == 0, "attention f16 [%s] heads=%d d=%d bs=%d %s: %d of %lld outputs differ from f32 over the rounded cache",
              g_isa, n_head, head_dim, block_size, decode ? "decode" : "prefill", diff, (long long)(T2 * ow));
    }
    pln_backend_destroy(be16);
    free(table); free(qkv1); free(qkv2); free(r1); free(r2); free(seq1); free(pos1);
    free(kc); free(vc); free(kh); free(vh); free(o32); free(o16);
}

static void test_attention_f16(void) {
    static const int dims[] = {64, 80, 128, 13}, bss[] = {16, 5, 32, 7};
    for (int i = 0; i < 4; i++) {
        test_attention_f16_case(2, dims[i], bss[i], false);
        test_attention_f16_case(3, dims[i], bss[(i + 1) % 4], true);
    }
    /* the switch: back to F32 works; a dtype the CPU has no kernels for is an error */
    pln_backend *be = pln_backend_create("cpu", 0);
    CHECK(pln_backend_set_kv_dtype(be, PLN_DTYPE_F16) == 0 && pln_backend_set_kv_dtype(be, PLN_DTYPE_F32) == 0 &&
          be->kv_size == 4 && be->kv_dtype == PLN_DTYPE_F32, "cpu backend: f16 then f32 KV");
    CHECK(pln_backend_set_kv_dtype(be, PLN_DTYPE_BF16) == -1 && strstr(pln_error(), "f32 or f16"),
          "cpu backend: a BF16 KV cache is refused, got \"%s\"", pln_error());
    pln_dtype dt;
    CHECK(pln_kv_dtype_parse("--kv-dtype", "f16", &dt) == 0 && dt == PLN_DTYPE_F16 &&
          pln_kv_dtype_parse("--kv-dtype", "F16", &dt) == -1 && strstr(pln_error(), "--kv-dtype F16"),
          "kv dtype names: f16 parses, F16 is refused with the option named (\"%s\")", pln_error());
    pln_backend_destroy(be);
}

/* ---- the Llama family: RMSNorm, rotary, SwiGLU, grouped-query attention ------------------- */
/* Tolerances follow from fp32 rounding (u = FLT_EPSILON / 2): a sum of n terms in one chain is
 * within (n - 1) u of the exact sum relative to the sum of magnitudes, each further operation adds
 * one u. A mutation (eps dropped, halves swapped, a q head reading the wrong KV head) moves the
 * results by orders of magnitude more. */
static void ref_rmsnorm(double *out, const double *in, const uint16_t *gm, int T, int64_t H, double eps) {
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int64_t i = 0; i < H; i++) ss += in[t * H + i] * in[t * H + i];
        double r = 1.0 / sqrt(ss / H + eps);
        for (int64_t i = 0; i < H; i++) out[t * H + i] = in[t * H + i] * r * h2d(gm[i]);
    }
}

static void test_rmsnorm(void) {
    static const int Ts[] = {1, 3, 9};
    static const int64_t Hs[] = {1, 7, 64, 257, 4096};
    const double u = FLT_EPSILON / 2;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++)
            for (int small = 0; small < 2; small++) {
                /* small: rows of mean square ~3e-5, where eps (1e-5 as Llama 2, 1e-6 as Llama 3)
                 * changes the result by percents: a dropped or misplaced eps fails */
                int T = Ts[a]; int64_t H = Hs[b]; size_t n = (size_t)(T * H);
                float sc = small ? 0.01f : 3.0f, eps = small ? 1e-5f : 1e-6f;
                float *x = rnd_vec(n, -sc, sc), *y = rnd_vec(n, -sc / 3, sc / 3), *o = malloc(n * 4), *x2 = malloc(n * 4);
                uint16_t *gm = rnd_f16((size_t)H, 0.5f, 1.5f), *bias = rnd_f16((size_t)H, -sc / 3, sc / 3);
                double *xd = malloc(n * 8), *want = malloc(n * 8);
                for (size_t i = 0; i < n; i++) xd[i] = x[i];
                ref_rmsnorm(want, xd, gm, T, H, eps);
                /* mean of squares: H - 1 u for the sum, 3 u more to the rstd, 2 u the products */
                double tol = ((double)H / 2 + 8) * u;
                FOR_EACH_ISA(isa) {
                    CHECK(g_be->rmsnorm(g_be, o, x, gm, T, H, eps) == 0, "rmsnorm: %s", pln_error());
                    int bad = 0; double md = 0;
                    for (size_t i = 0; i < n; i++) {
                        double d = fabs(o[i] - want[i]);
                        md = fmax(md, d);
                        bad += !(d <= tol * fabs(want[i]) + 1e-30);
                    }
                    CHECK(bad == 0, "rmsnorm [%s] T=%d H=%lld eps=%g: %d wrong, max diff %g", g_isa, T, (long long)H, eps, bad, md);
                    memcpy(x2, x, n * 4);
                    CHECK(g_be->rmsnorm(g_be, x2, x2, gm, T, H, eps) == 0 && !memcmp(x2, o, n * 4),
                          "rmsnorm [%s]: in place differs from out of place", g_isa);
                }
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    /* x += y (+ bias) exactly as fp32 adds it; then the norm of that x */
                    float *xw = malloc(n * 4);
                    double *wr = malloc(n * 8);
                    for (size_t i = 0; i < n; i++) {
                        xw[i] = x[i] + (y[i] + (with_bias ? pln_f16_to_f32(bias[i % H]) : 0.0f));
                        xd[i] = xw[i];
                    }
                    ref_rmsnorm(wr, xd, gm, T, H, eps);
                    FOR_EACH_ISA(isa) {
                        memcpy(x2, x, n * 4);
                        CHECK(g_be->residual_rmsnorm(g_be, x2, y, with_bias ? bias : NULL, gm, o, T, H, eps) == 0,
                              "residual_rmsnorm: %s", pln_error());
                        int bad = 0;
                        for (size_t i = 0; i < n; i++) bad += !(fabs(o[i] - wr[i]) <= tol * fabs(wr[i]) + 1e-30);
                        CHECK(!memcmp(x2, xw, n * 4) && bad == 0, "residual_rmsnorm [%s] T=%d H=%lld bias=%d: x %s, %d norms wrong",
                              g_isa, T, (long long)H, with_bias, memcmp(x2, xw, n * 4) ? "differs" : "exact", bad);
                    }
                    free(xw); free(wr);
                }
                free(x); free(y); free(o); free(x2); free(gm); free(bias); free(xd); free(want);
            }
}

/* inv_freq as transformers computes it (_compute_default_rope_parameters, in fp32), optionally with
 * the llama3 scaling of _compute_llama3_parameters (factor 8, low 1, high 4, original 8192). */
static void rope_inv_freq(float *inv, int head_dim, double theta, bool llama3) {
    for (int i = 0; i < head_dim / 2; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv[i] = 1.0f / powf((float)theta, e);
        if (!llama3) continue;
        double factor = 8, lo = 1, hi = 4, old = 8192, f = inv[i];
        double wavelen = 2 * M_PI / f, low_wl = old / lo, high_wl = old / hi;
        double v = wavelen > low_wl ? f / factor : f;
        if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
            double smooth = (old / wavelen - lo) / (hi - lo);
            v = (1 - smooth) * v / factor + smooth * v;
        }
        inv[i] = (float)v;
    }
}

static void test_rope_case(int n_head, int n_kv, int head_dim, double theta, bool llama3) {
    static const int32_t positions[] = {0, 1, 7, 100, 4095, 8191, 32767, 131071};
    enum { T = 8 };
    int64_t width = (int64_t)(n_head + 2 * n_kv) * head_dim;
    int half = head_dim / 2;
    float inv[256];
    rope_inv_freq(inv, head_dim, theta, llama3);
    float *x = rnd_vec((size_t)(T * width), -2, 2), *got = malloc((size_t)(T * width) * 4);
    int32_t seq[T], table[1] = {0};
    int32_t pos[T];
    for (int t = 0; t < T; t++) { seq[t] = 0; pos[t] = positions[(t * 5) % T]; }   /* out of order */
    pln_attn_meta m = {T, 1, 1 << 20, 1, 0, seq, pos, table, n_kv, 0};
    FOR_EACH_ISA(isa) {
        memcpy(got, x, (size_t)(T * width) * 4);
        CHECK(g_be->rope(g_be, got, &m, inv, n_head, head_dim) == 0, "rope: %s", pln_error());
        int bad = 0, vbad = 0; double md = 0;
        for (int t = 0; t < T; t++) {
            const float *r = x + t * width;
            for (int h = 0; h < n_head + n_kv; h++)
                for (int i = 0; i < half; i++) {
                    /* the angle is the fp32 product (as torch's); its cosine and sine exact */
                    double a = (double)((float)pos[t] * inv[i]), c = cos(a), s = sin(a);
                    double x0 = r[h * head_dim + i], x1 = r[h * head_dim + half + i];
                    double w0 = x0 * c - x1 * s, w1 = x1 * c + x0 * s;
                    /* cosf/sinf within 1 ulp, two products and a sum: 3 FLT_EPSILON of the terms */
                    double tol = 3 * FLT_EPSILON * (fabs(x0) + fabs(x1));
                    double d0 = fabs(got[t * width + h * head_dim + i] - w0), d1 = fabs(got[t * width + h * head_dim + half + i] - w1);
                    md = fmax(md, fmax(d0, d1));
                    bad += !(d0 <= tol) + !(d1 <= tol);
                }
            vbad += memcmp(got + t * width + (n_head + n_kv) * head_dim, r + (n_head + n_kv) * head_dim,
                           (size_t)(n_kv * head_dim) * 4) != 0;
        }
        CHECK(bad == 0 && vbad == 0, "rope [%s] heads %d/%d d=%d theta=%g%s: %d wrong (max diff %g), %d v rows touched",
              g_isa, n_head, n_kv, head_dim, theta, llama3 ? " llama3" : "", bad, md, vbad);
    }
    free(x); free(got);
}

static void test_rope(void) {
    test_rope_case(4, 2, 64, 10000, false);      /* Llama 2 style */
    test_rope_case(8, 2, 128, 500000, true);     /* Llama 3.1 */
    test_rope_case(4, 4, 128, 1000000, false);   /* Qwen2 style theta, MHA */
    test_rope_case(3, 1, 16, 10000, false);
    test_rope_case(2, 1, 6, 10000, true);
    /* llama3 scaling: the low frequencies divided by 8, the high ones untouched, between blended */
    float a[64], b[64];
    rope_inv_freq(a, 128, 500000, false);
    rope_inv_freq(b, 128, 500000, true);
    CHECK(a[0] == b[0] && fabs(b[63] - a[63] / 8) <= 1e-7 * a[63] && b[34] < a[34] && b[34] > a[34] / 8,
          "llama3 inv_freq: %g/%g, %g/%g, %g/%g", a[0], b[0], a[63], b[63], a[34], b[34]);
    /* the BLOOM layout has no rotary heads; odd head_dim has no pairs */
    int32_t seq[1] = {0}, pos[1] = {0}, table[1] = {0};
    float q[3 * 8] = {0}, inv[4] = {1, 1, 1, 1};
    pln_attn_meta m0 = {1, 1, 16, 1, 1, seq, pos, table, 0, 0};
    CHECK(g_be->rope(g_be, q, &m0, inv, 1, 8) == -1 && strstr(pln_error(), "grouped"),
          "rope on the BLOOM layout: want an error, got \"%s\"", pln_error());
}

static void test_swiglu(void) {
    static const int Ts[] = {1, 3, 9};
    static const int64_t Is[] = {1, 7, 16, 100, 1000};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++) {
            int T = Ts[a]; int64_t I = Is[b];
            float *in = rnd_vec((size_t)(T * 2 * I), -12, 12), *o = malloc((size_t)(T * I) * 4);
            in[0] = -100.0f;             /* exp(-g) past fp32's range: silu -> -0 */
            if (I > 3) in[3] = 100.0f;   /* exp(-g) -> 0: silu -> g */
            FOR_EACH_ISA(isa) {
                CHECK(g_be->swiglu(g_be, o, in, T, I) == 0, "swiglu: %s", pln_error());
                int bad = 0; double md = 0;
                for (int t = 0; t < T; t++)
                    for (int64_t i = 0; i < I; i++) {
                        double g = in[t * 2 * I + i], up = in[t * 2 * I + I + i];
                        double want = g / (1 + exp(-g)) * up, d = fabs(o[t * I + i] - want);
                        /* exp within a few ulp, the add, the division, the product */
                        md = fmax(md, d / (fabs(want) + 1e-30));
                        bad += !(d <= 4 * FLT_EPSILON * fabs(want) + 1e-30);
                    }
                CHECK(bad == 0, "swiglu [%s] T=%d I=%lld: %d wrong (max rel %g)", g_isa, T, (long long)I, bad, md);
            }
            free(in); free(o);
        }
}

/* Grouped-query attention over the paged cache: S sequences through three steps (a prefill of
 * each one's first tokens, a mixed step of prefill chunks and single decode tokens, then a pure
 * decode step), every output against a double-precision reference over the whole history, where
 * q head h reads KV head h / (n_head / n_kv). f16: the KV cache in F16, the reference over keys
 * and values rounded the same way. Every token's output must also be the same bits when it is
 * attended alone (batch invariance). window > 0: a sliding window, the reference over keys
 * pos - window < j <= pos only. */
static void test_gqa_case(int n_head, int n_kv, int head_dim, int block_size, bool f16, bool alibi, int window) {
    enum { S = 4, STEPS = 3 };
    /* tokens per sequence in each step (0: the sequence sits the step out) */
    static const int32_t fed[STEPS][S] = {{5, 70, 1, 33}, {1, 9, 1, 1}, {1, 1, 1, 1}};
    int32_t len[S] = {0};
    for (int s = 0; s < S; s++) for (int k = 0; k < STEPS; k++) len[s] += fed[k][s];
    int max_len = 0;
    for (int s = 0; s < S; s++) if (len[s] > max_len) max_len = len[s];
    int32_t max_blocks = (max_len + block_size - 1) / block_size + 1, n_blocks = S * max_blocks + 2;
    int32_t *table = malloc((size_t)(S * max_blocks) * 4), *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { int j = (int)(rnd_u32() % (uint32_t)(i + 1)); int32_t x = perm[i]; perm[i] = perm[j]; perm[j] = x; }
    for (int i = 0; i < S * max_blocks; i++) table[i] = perm[i];
    int64_t width = (int64_t)(n_head + 2 * n_kv) * head_dim, ow = (int64_t)n_head * head_dim;
    int64_t k0 = (int64_t)n_head * head_dim, v0 = (int64_t)(n_head + n_kv) * head_dim;
    float *hist[S];   /* each sequence's qkv rows; r: k and v as the cache holds them */
    double *hr[S];
    for (int s = 0; s < S; s++) {
        hist[s] = rnd_vec((size_t)(len[s] * width), -1, 1);
        hr[s] = malloc((size_t)(len[s] * width) * 8);
        for (int64_t i = 0; i < len[s] * width; i++)
            hr[s][i] = f16 && i % width >= k0 ? h2d(pln_f32_to_f16(hist[s][i])) : hist[s][i];
    }
    float slopes[64];
    for (int h = 0; h < n_head; h++) slopes[h] = pln_alibi_slope(h, n_head);
    pln_backend *be = pln_backend_create("cpu", 0);
    CHECK(be && pln_backend_set_kv_dtype(be, f16 ? PLN_DTYPE_F16 : PLN_DTYPE_F32) == 0, "gqa backend: %s", pln_error());
    size_t pool = (size_t)n_blocks * n_kv * block_size * head_dim, esz = f16 ? 2 : 4;
    void *kc = malloc(pool * esz), *vc = malloc(pool * esz);
    float *qkv = malloc((size_t)(128 * width) * 4), *out = malloc((size_t)(128 * ow) * 4), *one = malloc((size_t)ow * 4);
    double *want = malloc((size_t)(128 * ow) * 8), sc[256];
    int32_t seq[128], pos[128];
    for (int isa = 0; isa < PLN_CPU_ISA_COUNT; isa++) {
        if (!pln_cpu_isa_supported((pln_cpu_isa)isa) || pln_cpu_set_isa(be, (pln_cpu_isa)isa)) continue;
        const char *iname = pln_cpu_isa_name((pln_cpu_isa)isa);
        memset(kc, 0xff, pool * esz); memset(vc, 0xff, pool * esz);   /* NaN: unwritten rows must never be read */
        int32_t done[S] = {0};
        for (int k = 0; k < STEPS; k++) {
            int T = 0;
            for (int s = S - 1; s >= 0; s--)   /* sequences in the order a scheduler might put them */
                for (int j = done[s]; j < done[s] + fed[k][s]; j++, T++) {
                    seq[T] = s; pos[T] = j;
                    memcpy(qkv + T * width, hist[s] + j * width, (size_t)width * 4);
                }
            for (int s = 0; s < S; s++) done[s] += fed[k][s];
            pln_attn_meta m = {T, S, block_size, max_blocks, max_len, seq, pos, table, n_kv, window};
            CHECK(be->kv_append(be, qkv, kc, vc, &m, n_head, head_dim) == 0, "gqa kv_append: %s", pln_error());
            CHECK(be->attention(be, out, qkv, kc, vc, &m, alibi ? slopes : NULL, n_head, head_dim) == 0,
                  "gqa attention: %s", pln_error());
            for (int t = 0; t < T; t++) {
                int s = seq[t], p = pos[t];
                for (int h = 0; h < n_head; h++) {
                    int g = h / (n_head / n_kv);
                    const double *q = hr[s] + p * width + h * head_dim;   /* q is never rounded */
                    double mx = -INFINITY, sum = 0;
                    int lo = window > 0 && p >= window ? p - window + 1 : 0;
                    for (int j = lo; j <= p; j++) {
                        const double *kr = hr[s] + j * width + k0 + g * head_dim;
                        double d = 0;
                        for (int e = 0; e < head_dim; e++) d += q[e] * kr[e];
                        sc[j] = d / sqrt((double)head_dim) + (alibi ? (double)slopes[h] * j : 0.0);
                        mx = fmax(mx, sc[j]);
                    }
                    for (int j = lo; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                    for (int e = 0; e < head_dim; e++) {
                        double acc = 0;
                        for (int j = lo; j <= p; j++) acc += sc[j] / sum * hr[s][j * width + v0 + g * head_dim + e];
                        want[t * ow + h * head_dim + e] = acc;
                    }
                }
            }
            double md = 0;
            for (int64_t i = 0; i < T * ow; i++) md = fmax(md, fabs(out[i] - want[i]));
            CHECK(md < 2e-6, "gqa attention [%s] heads %d/%d d=%d bs=%d kv %s%s window %d step %d (%d tokens): max diff %g",
                  iname, n_head, n_kv, head_dim, block_size, f16 ? "f16" : "f32", alibi ? " alibi" : "", window, k, T, md);
            /* the cache rows exactly where backend.h puts them */
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int g = 0; g < n_kv; g++) {
                    int64_t off = (((int64_t)table[seq[t] * max_blocks + pos[t] / block_size] * n_kv + g) * block_size +
                                   pos[t] % block_size) * head_dim;
                    for (int e = 0; e < head_dim; e++) {
                        float kw = qkv[t * width + k0 + g * head_dim + e], vw = qkv[t * width + v0 + g * head_dim + e];
                        if (f16) bad += ((uint16_t *)kc)[off + e] != pln_f32_to_f16(kw) || ((uint16_t *)vc)[off + e] != pln_f32_to_f16(vw);
                        else bad += ((float *)kc)[off + e] != kw || ((float *)vc)[off + e] != vw;
                    }
                }
            CHECK(bad == 0, "gqa kv_append [%s] heads %d/%d step %d: %d values misplaced", iname, n_head, n_kv, k, bad);
            /* batch invariance: each token alone gives its bits of the shared step */
            int diff = 0;
            for (int t = 0; t < T; t++) {
                pln_attn_meta m1 = {1, S, block_size, max_blocks, max_len, seq + t, pos + t, table, n_kv, window};
                CHECK(be->attention(be, one, qkv + t * width, kc, vc, &m1, alibi ? slopes : NULL, n_head, head_dim) == 0,
                      "gqa attention alone: %s", pln_error());
                diff += memcmp(one, out + t * ow, (size_t)ow * 4) != 0;
            }
            CHECK(diff == 0, "gqa attention [%s] heads %d/%d d=%d kv %s window %d step %d: %d of %d tokens differ when attended alone",
                  iname, n_head, n_kv, head_dim, f16 ? "f16" : "f32", window, k, diff, T);
        }
    }
    pln_backend_destroy(be);
    for (int s = 0; s < S; s++) { free(hist[s]); free(hr[s]); }
    free(table); free(perm); free(kc); free(vc); free(qkv); free(out); free(one); free(want);
}

static void test_gqa(void) {
    for (int f16 = 0; f16 < 2; f16++) {
        test_gqa_case(8, 1, 64, 16, f16, false, 0);
        test_gqa_case(8, 2, 128, 16, f16, false, 0);
        test_gqa_case(4, 4, 64, 7, f16, false, 0);      /* n_kv == n_head: MHA in the grouped layout */
        test_gqa_case(32, 2, 16, 5, f16, false, 0);     /* 16 q heads per KV head: two decode runs */
        test_gqa_case(6, 3, 24, 32, f16, true, 0);      /* ALiBi in the grouped layout */
        /* Mistral's sliding window: shorter than a block, across blocks, the token alone, and
         * inside a block longer than a stretch (keys 0..63 | 64..127 of a 128-row block) */
        test_gqa_case(8, 2, 64, 16, f16, false, 8);
        test_gqa_case(4, 2, 16, 5, f16, false, 33);
        test_gqa_case(4, 1, 32, 16, f16, false, 1);
        test_gqa_case(8, 2, 64, 128, f16, false, 70);
        test_gqa_case(6, 3, 24, 32, f16, true, 12);     /* with ALiBi: slopes at the window's keys */
    }
    /* a KV-head count that does not divide the q heads is refused */
    int32_t seq[1] = {0}, pos[1] = {0}, table[1] = {0};
    float q[8 * 5] = {0}, o[8 * 3], kc[64], vc[64];
    pln_attn_meta m = {1, 1, 4, 1, 1, seq, pos, table, 2, 0};
    CHECK(g_be->attention(g_be, o, q, kc, vc, &m, NULL, 3, 8) == -1 && strstr(pln_error(), "KV heads"),
          "3 q heads over 2 KV heads: want an error, got \"%s\"", pln_error());
}

/* ---- logit processing, top-k ------------------------------------------------------------- */
static void test_logit_process(void) {
    int64_t v0 = 100, vn = 50;
    enum { S = 3 };
    float pen[S] = {1.3f, 1.0f, 0.8f}, it[S] = {1.0f / 0.7f, 1.0f, 2.0f};
    /* duplicates and ids of other ranks' slices must not change anything twice */
    int32_t seen[] = {100, 105, 105, 149, 7, 300, 120, /* row 1 */ 101, 102, /* row 2 */ 110, 111, 110};
    int32_t offs[S + 1] = {0, 7, 9, 12};
    float *l = rnd_vec((size_t)(S * vn), -4, 4), *got = malloc((size_t)(S * vn) * 4);
    l[5] = 0.0f;   /* exactly zero: the "else" branch (multiply) */
    pln_logit_proc p = {S, pen, it, offs, seen};
    FOR_EACH_ISA(isa) {
        memcpy(got, l, (size_t)(S * vn) * 4);
        CHECK(g_be->logit_process(g_be, got, v0, vn, &p) == 0, "logit_process: %s", pln_error());
        int bad = 0;
        for (int s = 0; s < S; s++)
            for (int64_t i = 0; i < vn; i++) {
                double v = l[s * vn + i];
                bool in_seen = false;
                for (int j = offs[s]; j < offs[s + 1]; j++) in_seen |= seen[j] == v0 + i;
                if (in_seen) v = v > 0 ? v / pen[s] : v * pen[s];
                v *= it[s];
                bad += fabs(got[s * vn + i] - v) > 1e-6 * fabs(v) + 1e-7;
            }
        CHECK(bad == 0, "logit_process [%s]: %d wrong (HF rule: divide positive, multiply others, once per id; then temperature)", g_isa, bad);
    }
    free(l); free(got);
}

static int64_t g_sort_vn;
static const float *g_sort_row;
static int cmp_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_sort_row[i], y = g_sort_row[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

static void test_topk(void) {
    enum { S = 4 };
    int64_t vn = 301, v0 = 1000, n_valid = 290;
    float *l = malloc((size_t)(S * vn) * 4);
    for (int s = 0; s < S; s++)
        for (int64_t i = 0; i < vn; i++)
            /* few distinct values: many ties; vocab padding is -inf */
            l[s * vn + i] = i >= n_valid ? -INFINITY : (float)(int)(rnd_u32() % 7) - 3.0f + (s == 2 ? 0.5f * (float)(i % 3) : 0.0f);
    for (int64_t i = 0; i < vn; i++) l[3 * vn + i] = -INFINITY;   /* an all -inf row */
    static const int ks[] = {0, 1, 5, 64, 301};
    float vals[S * 301], rmax[S], rsum[S];
    int32_t ids[S * 301], order[301];
    for (size_t ki = 0; ki < 5; ki++) {
        int k = ks[ki];
        FOR_EACH_ISA(isa) {
            CHECK(g_be->topk(g_be, l, S, vn, v0, k, vals, ids, rmax, rsum) == 0, "topk: %s", pln_error());
            for (int s = 0; s < S; s++) {
                const float *row = l + s * vn;
                double mx = -INFINITY, sum = 0;
                for (int64_t i = 0; i < vn; i++) mx = fmax(mx, row[i]);
                if (mx != -INFINITY) for (int64_t i = 0; i < vn; i++) sum += exp(row[i] - mx);
                CHECK(rmax[s] == (float)mx, "topk [%s] row %d: max %g want %g", g_isa, s, rmax[s], mx);
                CHECK(fabs(rsum[s] - sum) <= 1e-5 * sum, "topk [%s] row %d: sumexp %g want %g", g_isa, s, rsum[s], sum);
                for (int64_t i = 0; i < vn; i++) order[i] = (int32_t)i;
                g_sort_row = row; g_sort_vn = vn;
                qsort(order, (size_t)vn, sizeof *order, cmp_desc);
                int bad = 0;
                for (int j = 0; j < k; j++)
                    bad += ids[s * k + j] != v0 + order[j] || !(vals[s * k + j] == row[order[j]] || (isinf(vals[s * k + j]) && isinf(row[order[j]])));
                CHECK(bad == 0, "topk [%s] row %d k=%d: %d wrong (ties: lower id first)", g_isa, s, k, bad);
            }
        }
    }
    CHECK(g_be->topk(g_be, l, S, vn, v0, (int32_t)vn + 1, vals, ids, rmax, rsum) == -1, "topk with k > vn must fail");
    free(l);

    /* every tier's ids, values and max the reference loop's, bit for bit (sample.c
     * TOPK_SCAN_NOTE: the skipped blocks): NaNs, ties with the heap's root, zeros of both signs as
     * the max, a row whose best sits in the last, partial block */
    {
        enum { R = 5, V = 1003 };
        float *lr = malloc((size_t)R * V * 4), rv[R * 40], rm[R], rs[R], tv[R * 40], tm[R];
        int32_t ri[R * 40], ti[R * 40];
        for (int s = 0; s < R; s++)
            for (int i = 0; i < V; i++) {
                float v = (float)(int)(rnd_u32() % 9) - 6.0f;
                if (s == 0 && i % 37 == 5) v = NAN;
                if (s == 1) v = i == 1 ? -0.0f : i == 16 ? 0.0f : -1.0f - (float)(i % 5);   /* -0 first, +0 in lane 0 */
                if (s == 2) v = i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : -2.0f;   /* +0 and -0 */
                if (s == 3 && i == V - 1) v = 100.0f;
                if (s == 4) v = i < 500 ? NAN : (float)(i % 4);
                lr[s * V + i] = v;
            }
        static const int kk[] = {1, 5, 40};
        for (size_t ki = 0; ki < 3; ki++) {
            int k = kk[ki];
            bool have = false;
            FOR_EACH_ISA(isa) {
                float *ov = have ? tv : rv, *om = have ? tm : rm;
                int32_t *oi = have ? ti : ri;
                CHECK(g_be->topk(g_be, lr, R, V, 7, k, ov, oi, om, rs) == 0, "topk: %s", pln_error());
                if (!have) { have = true; continue; }
                int bad = 0;
                for (int j = 0; j < R * k; j++) bad += ti[j] != ri[j] || memcmp(&tv[j], &rv[j], 4) != 0;
                for (int r = 0; r < R; r++) bad += memcmp(&tm[r], &rm[r], 4) != 0;
                CHECK(bad == 0, "topk [%s] k=%d: %d ids, values or maxima differ from the first tier's", g_isa, k, bad);
            }
        }
        free(lr);
    }

    /* a real vocabulary slice: the softmax sum over 250880 entries, padding included */
    int64_t big = 250880, valid = 250680;
    float *row = malloc((size_t)big * 4);
    for (int64_t i = 0; i < big; i++) row[i] = i >= valid ? -INFINITY : rnd_f(-20, 12);
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < big; i++) mx = fmax(mx, row[i]);
    for (int64_t i = 0; i < big; i++) sum += exp(row[i] - mx);
    int32_t top[8];
    for (int j = 0; j < 8; j++) {   /* selection: the j-th best by (value desc, id asc) */
        int64_t b = -1;
        for (int64_t i = 0; i < big; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= top[q] == i;
            if (!taken && (b < 0 || row[i] > row[b])) b = i;
        }
        top[j] = (int32_t)b;
    }
    FOR_EACH_ISA(isa) {
        float v8[8], m1, s1; int32_t i8[8];
        CHECK(g_be->topk(g_be, row, 1, big, 0, 8, v8, i8, &m1, &s1) == 0, "topk: %s", pln_error());
        CHECK(m1 == (float)mx && fabs(s1 - sum) <= 1e-5 * sum, "topk [%s] 250880: max %g sumexp %.7g want %g %.7g", g_isa, m1, s1, mx, sum);
        int bad = 0;
        for (int j = 0; j < 8; j++) bad += i8[j] != top[j];
        CHECK(bad == 0, "topk [%s] 250880: %d of the top 8 wrong", g_isa, bad);
    }
    free(row);
}

/* ---- errors -------------------------------------------------------------------------------- */
/* The per-machine calibration (kernels/cpu/tune.c CPU_TUNE_NOTE): its choice from given times,
 * its modes, and that no prefetch distance changes a GEMV's bits (every tier, every weight kind,
 * the integer-dot path too: the distance decides only which lines are asked for early). */
static void test_cpu_tune(void) {
    const int d8k = 4;   /* 8192, the default, in pln_cpu_tune_candidates */
    CHECK(pln_cpu_tune_candidates[d8k] == PLN_CPU_PF_AHEAD_DEFAULT, "the default is candidate %d", d8k);
    double faster[6] = {1.0, 0.9, 0.95, 1.0, 1.0, 1.0}, close[6] = {1.0, 0.995, 1.0, 1.0, 1.0, 1.0};
    double none[6] = {0}, no_default[6] = {1.0, 0.9, 0.95, 1.0, 0, 1.0}, tie[6] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    CHECK(pln_cpu_tune_pick(faster, 6, d8k, PLN_CPU_TUNE_KEEP) == 1, "a candidate 10 %% faster than the default wins");
    CHECK(pln_cpu_tune_pick(close, 6, d8k, PLN_CPU_TUNE_KEEP) == d8k, "the default within 0.5 %% of the fastest stays");
    double within[6] = {1.0, 0.962, 1.0, 1.0, 1.0, 1.0}, beyond[6] = {1.0, 0.94, 1.0, 1.0, 1.0, 1.0};
    CHECK(pln_cpu_tune_pick(within, 6, d8k, PLN_CPU_TUNE_KEEP) == d8k, "a GEMV's default 4 %% slower than the fastest stays");
    CHECK(pln_cpu_tune_pick(within, 6, d8k, PLN_CPU_TUNE_KEEP_TILES) == 1, "the tiles' default 4 %% slower than the fastest goes");
    CHECK(pln_cpu_tune_pick(beyond, 6, d8k, PLN_CPU_TUNE_KEEP) == 1, "the fastest 6 %% ahead of a GEMV's default wins");
    CHECK(pln_cpu_tune_pick(none, 6, d8k, PLN_CPU_TUNE_KEEP) == d8k, "nothing measured: the default");
    CHECK(pln_cpu_tune_pick(no_default, 6, d8k, PLN_CPU_TUNE_KEEP) == 1, "the default unmeasured: the fastest");
    CHECK(pln_cpu_tune_pick(tie, 6, d8k, PLN_CPU_TUNE_KEEP) == d8k, "a tie: the default");
    /* the level: the L2 candidate (the last) replaces the L1 pick only when more than 10 % faster */
    {
        double s[PLN_CPU_TUNE_N];
        for (int i = 0; i < PLN_CPU_TUNE_N; i++) s[i] = 1.0;
        const int l2 = PLN_CPU_TUNE_N - 1;
        s[l2] = 0.85;
        CHECK(pln_cpu_tune_level(s, d8k) == l2, "L2 15 %% faster than the L1 pick: L2");
        s[l2] = 0.93;
        CHECK(pln_cpu_tune_level(s, d8k) == d8k, "L2 7 %% faster than the L1 pick: the L1 pick");
        s[l2] = 0.0;
        CHECK(pln_cpu_tune_level(s, d8k) == d8k, "L2 not measured: the L1 pick");
        s[l2] = 0.85;
        s[1] = 0.9;   /* the pick is 1024 B now; L2 is only 5.9 % faster than it */
        CHECK(pln_cpu_tune_level(s, 1) == 1, "L2 measured against the L1 pick, not the default");
    }

    pln_backend_tune tu;
    CHECK(g_be->tune && g_be->tune(g_be, "sometimes", &tu) == -1 && strstr(pln_error(), "\"sometimes\" is not one of auto, off, redo"),
          "a bad mode is refused by name: %s", pln_error());
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) pln_cpu_pf_by_kind[k] = 1024;
    CHECK(g_be->tune(g_be, "off", &tu) == 0 && !strcmp(tu.source, "off") && tu.n_kinds == PLN_CPU_PF_KINDS,
          "off: every kind reported");
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++)
        CHECK(tu.pf_ahead[k] == PLN_CPU_PF_AHEAD_DEFAULT && pln_cpu_pf_by_kind[k] == PLN_CPU_PF_AHEAD_DEFAULT &&
              !strcmp(tu.kind[k], pln_cpu_pf_kind_names[k]), "off: the default distance for %s", pln_cpu_pf_kind_names[k]);
    /* a measurement leaves the modes as it found them (it measures each kind on its own path) */
    {
        char dir[] = "/tmp/pln-tune-XXXXXX";
        if (mkdtemp(dir)) {
            setenv("XDG_CACHE_HOME", dir, 1);
            setenv("PLN_CPU_TUNE_MIB", "1", 1);
            pln_cpu_set_batch_invariant(g_be, true);
            pln_cpu_set_int_dot(g_be, true);
            CHECK(g_be->tune(g_be, "redo", &tu) == 0 && !strcmp(tu.source, "measured"), "redo measures: %s", pln_error());
            CHECK(pln_cpu_of(g_be)->batch_invariant && pln_cpu_of(g_be)->int_dot, "the modes are restored after the tune");
            for (int k = 0; k < PLN_CPU_PF_KINDS; k++) {
                int ok = 0;
                for (int i = 0; i < PLN_CPU_TUNE_N; i++) ok |= tu.pf_ahead[k] == pln_cpu_tune_candidates[i];
                CHECK(ok && tu.pf_ahead[k] == pln_cpu_pf_by_kind[k], "%s: a measured candidate, in use", pln_cpu_pf_kind_names[k]);
                /* each GEMV kind measured at every candidate, the fp16 tiles at the L1 ones only */
                int n = k == PLN_CPU_PF_F16B ? PLN_CPU_TUNE_N_L1 : PLN_CPU_TUNE_N, measured = 0;
                for (int i = 0; i < PLN_CPU_TUNE_N; i++) measured += tu.gbs[k][i] > 0;
                CHECK(measured == n, "%s: %d of the %d candidates measured", pln_cpu_pf_kind_names[k], measured, n);
                CHECK(k != PLN_CPU_PF_F16B || !(tu.pf_ahead[k] & PLN_TUNE_PF_L2), "the fp16 tiles' pick is an L1 distance");
            }
            CHECK((pln_cpu_tune_candidates[PLN_CPU_TUNE_N - 1] & PLN_TUNE_PF_L2) &&
                  !(pln_cpu_tune_candidates[PLN_CPU_TUNE_N_L1 - 1] & PLN_TUNE_PF_L2), "the L2 candidates follow the L1 ones");
            pln_cpu_set_batch_invariant(g_be, false);
            pln_cpu_set_int_dot(g_be, false);
            CHECK(g_be->tune(g_be, "off", &tu) == 0, "back to off");
            char path[96];
            snprintf(path, sizeof path, "%s/pollen/cpu-tune.json", dir);
            unlink(path);
            snprintf(path, sizeof path, "%s/pollen", dir);
            rmdir(path);
            rmdir(dir);
            unsetenv("XDG_CACHE_HOME");
            unsetenv("PLN_CPU_TUNE_MIB");
        }
    }
    /* the kind each weight's GEMV takes its distance from */
    {
        pln_weight wf = {.dtype = PLN_DTYPE_F16, .cols = 1024}, wr = {.dtype = PLN_DTYPE_I8, .cols = 1024, .group = 1024},
                   wg = {.dtype = PLN_DTYPE_I8, .cols = 1024, .group = 32}, w4 = {.dtype = PLN_DTYPE_U8, .cols = 1024, .group = 128};
        CHECK(pln_cpu_pf_kind_of(&wf) == PLN_CPU_PF_F16 && pln_cpu_pf_kind_of(&wr) == PLN_CPU_PF_I8 &&
              pln_cpu_pf_kind_of(&wg) == PLN_CPU_PF_I8G && pln_cpu_pf_kind_of(&w4) == PLN_CPU_PF_I4,
              "weight kinds: fp16, int8 per row, int8 grouped, int4");
    }
    CHECK(g_be->tune(g_be, NULL, &tu) == 0 && !strcmp(tu.source, "off"), "NULL: off (the library's default)");

    static const struct { int kind; int64_t group; } kinds[] = {{0, 0}, {1, 0}, {1, 32}, {WQ_I4, 32}, {WQ_I4, 128}};
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        test_weight tw = make_weight(67, 1024, kinds[kd].kind, kinds[kd].group);
        float *x = rnd_vec(1024, -1, 1), *ref = malloc(67 * 4), *o = malloc(67 * 4);
        for (int idot = 0; idot < 2; idot++) {
            if (idot && kinds[kd].kind == 0) continue;
            pln_cpu_set_int_dot(g_be, idot);
            FOR_EACH_ISA(isa) {
                const int kd_kind = pln_cpu_pf_kind_of(&tw.W);
                pln_cpu_pf_by_kind[kd_kind] = PLN_CPU_PF_AHEAD_DEFAULT;
                CHECK(g_be->linear(g_be, ref, x, &tw.W, NULL, 1, PLN_EPI_NONE) == 0, "linear: %s", pln_error());
                int bad = 0, used = 0;
                for (int c = 0; c < PLN_CPU_TUNE_N; c++) {
                    pln_cpu_pf_by_kind[kd_kind] = pln_cpu_tune_candidates[c];
                    memset(o, 0xff, 67 * 4);
                    CHECK(g_be->linear(g_be, o, x, &tw.W, NULL, 1, PLN_EPI_NONE) == 0, "linear: %s", pln_error());
                    bad += memcmp(o, ref, 67 * 4) != 0;
                    /* the call ran at its kind's distance and level (the reference ISA has no
                     * prefetch): the value's low bit is the level (cpu.h PF_L2_NOTE) */
                    used += pln_cpu_pf_ahead == (pln_cpu_tune_candidates[c] & ~(int64_t)PLN_TUNE_PF_L2) &&
                            pln_cpu_pf_l2 == ((pln_cpu_tune_candidates[c] & PLN_TUNE_PF_L2) != 0);
                }
                CHECK(!strcmp(g_isa, "ref") || used == PLN_CPU_TUNE_N, "[%s] kind %d: %d of %d calls at their kind's distance",
                      g_isa, kinds[kd].kind, used, PLN_CPU_TUNE_N);
                CHECK(bad == 0, "[%s] kind %d group %lld idot %d: %d prefetch distances change the GEMV's bits", g_isa,
                      kinds[kd].kind, (long long)kinds[kd].group, idot, bad);
            }
        }
        pln_cpu_set_int_dot(g_be, false);
        for (int k = 0; k < PLN_CPU_PF_KINDS; k++) pln_cpu_pf_by_kind[k] = PLN_CPU_PF_AHEAD_DEFAULT;
        free(tw.w); free(tw.scale); free(x); free(ref); free(o);
    }
}

static void test_errors(void) {
    pln_backend *b = pln_backend_create("tpu", 0);
    CHECK(!b && strstr(pln_error(), "tpu"), "unknown backend: want NULL naming it, got \"%s\"", pln_error());
#ifndef PLN_HAVE_CUDA
    b = pln_backend_create("cuda", 0);
    CHECK(!b && strstr(pln_error(), "no CUDA backend"), "cuda in a CPU-only build: \"%s\"", pln_error());
#endif
    int8_t q[12] = {0};
    uint16_t sc[3] = {0x3c00, 0x3c00, 0x3c00};
    pln_weight W = {PLN_DTYPE_I8, 1, 12, q, sc, 5};
    float x[12] = {0}, o[1];
    CHECK(g_be->linear(g_be, o, x, &W, NULL, 1, false) == -1 && strstr(pln_error(), "group"),
          "I8 group 5 of 12 columns: want an error naming the group, got \"%s\"", pln_error());
    W.dtype = PLN_DTYPE_BF16;
    CHECK(g_be->linear(g_be, o, x, &W, NULL, 1, false) == -1, "BF16 weight must be refused");
    CHECK(g_be->load_file == NULL, "the CPU backend maps shards in place: load_file must be NULL");
    uint8_t host[16];
    CHECK(g_be->weights_from_host(g_be, NULL, host, sizeof host) == host, "weights_from_host must not copy");
    CHECK(g_be->act_size == 4 && g_be->act_dtype == PLN_DTYPE_F32 && g_be->kv_size == 4 && g_be->kv_dtype == PLN_DTYPE_F32,
          "cpu backend: F32 activations and KV");
}

/* ---- benchmark ----------------------------------------------------------------------------- */
/* Weights are cycled through copies totalling 256 MiB so that every call reads them from memory,
 * not from the last-level cache, as a real model's layers do. */
static void bench_linear(int64_t rows, int64_t cols, int n_t, const int *Ts, double copy) {
    /* F16, I8 per output channel, I8 groups of 32, int4 groups of 128 and 32 */
    static const struct { int kind; int64_t group; const char *name; } kinds[] = {
        {0, 0, "F16    "}, {WQ_I8, 0, "I8     "}, {WQ_I8, 32, "I8 g32 "}, {WQ_I4, 128, "I4 g128"}, {WQ_I4, 32, "I4 g32 "}};
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        int i8 = kinds[kd].kind;
        test_weight tw = make_weight(rows, cols, i8, kinds[kd].group);
        size_t wbytes = (size_t)(rows * cols) * (i8 == WQ_I4 ? 1 : i8 ? 2 : 4) / 2;
        int n_copies = (int)(((size_t)256 << 20) / wbytes);
        pln_weight *Ws = malloc((size_t)n_copies * sizeof *Ws);
        for (int c = 0; c < n_copies; c++) {
            Ws[c] = tw.W;
            void *w = malloc(wbytes);
            memcpy(w, tw.w, wbytes);
            Ws[c].w = w;
        }
        double bytes = (double)wbytes + (i8 ? (double)rows * 2 * (double)(cols / tw.W.group) : 0);
        double tok1 = 0;
        /* quantized weights: the float path, then the integer-dot path (at T >= 2) */
        for (int idot = 0; idot < (i8 ? 2 : 1); idot++)
        for (int ti = 0; ti < n_t; ti++) {
            int T = Ts[ti];
            pln_cpu_set_int_dot(g_be, idot);
            float *x = rnd_vec((size_t)(T * cols), -1, 1), *o = malloc((size_t)(T * rows) * 4);
            int warm = n_copies / 2, reps = warm + (T == 1 ? 4 * n_copies : T <= 32 ? n_copies : n_copies / 2);
            double best = 1e30, total = 0;
            for (int r = 0; r < reps; r++) {
                double t0 = pln_now();
                g_be->linear(g_be, o, x, &Ws[r % n_copies], NULL, T, false);
                double dt = pln_now() - t0;
                best = fmin(best, dt);
                if (r >= warm) total += dt;
            }
            double mean = total / (reps - warm);
            double gbs = bytes / mean / 1e9, gflops = 2.0 * rows * cols * T / mean / 1e9;
            if (T == 1) tok1 = T / mean;
            printf("linear %s [%lld, %lld] T=%-3d mean %7.3f ms (best %7.3f)  %5.1f GB/s of weights = %3.0f%% of copy  %6.1f GFLOP/s  %7.0f tokens/s",
                   idot ? (kd == 1 ? "I8 idot" : kd == 2 ? "I8g32 i" : kd == 3 ? "I4g128 i" : "I4g32 i") : kinds[kd].name, (long long)rows, (long long)cols, T, mean * 1e3, best * 1e3, gbs,
                   100 * gbs / copy, gflops, T / mean);
            if (tok1 > 0) printf(" (%.1fx T=1)", T / mean / tok1);
            printf("\n");
            if (T == 1 && rows >= 64) {
                /* the same step from cache: its first rows up to 1 MiB (half a MiB per thread
                 * stays in L2), so the figure is the loop's own speed, its ceiling when the
                 * memory is fast */
                pln_weight Wc = Ws[0];
                int64_t rc = (int64_t)((double)(1 << 20) / (bytes / (double)rows)) / 64 * 64;
                Wc.rows = rc < 64 ? 64 : rc > rows ? rows : rc;
                double bc = 1e30;
                for (int r = 0; r < 2000; r++) {
                    double t0 = pln_now();
                    g_be->linear(g_be, o, x, &Wc, NULL, 1, false);
                    bc = fmin(bc, pln_now() - t0);
                }
                printf("linear %s%s [%lld, %lld] T=1   from cache (L2): best %7.4f ms  %5.1f GB/s of weights\n",
                       kinds[kd].name, idot ? " idot" : "", (long long)Wc.rows, (long long)cols, bc * 1e3,
                       bytes * (double)Wc.rows / (double)rows / bc / 1e9);
            }
            free(x); free(o);
        }
        pln_cpu_set_int_dot(g_be, false);
        for (int c = 0; c < n_copies; c++) free((void *)Ws[c].w);
        free(Ws); free(tw.w); free(tw.scale);
    }
}

/* Attention over a paged cache: decode (one token per sequence at position ctx-1) and a prefill
 * of ctx tokens, n_head heads of hd (bloom-1b7: 16 x 128, bloom-560m: 16 x 64); n_kv > 0: the
 * grouped-query layout without ALiBi (Llama-3.2-1B: 32 q / 8 KV heads of 64, Llama-3.1-8B: 32 / 8
 * of 128). */
static void bench_attention(int ctx, int n_seq, int n_head, int hd, int n_kv) {
    int bs = 16, cache_heads = n_kv > 0 ? n_kv : n_head;
    int32_t max_blocks = (ctx + bs - 1) / bs, n_blocks = max_blocks * n_seq;
    size_t pool = (size_t)n_blocks * cache_heads * bs * hd;
    float *kc = rnd_vec(pool, -1, 1), *vc = rnd_vec(pool, -1, 1);
    int32_t *table = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) table[i] = (i * 7919) % n_blocks;   /* scattered */
    uint16_t *kh = malloc(pool * 2), *vh = malloc(pool * 2);
    for (size_t i = 0; i < pool; i++) { kh[i] = pln_f32_to_f16(kc[i]); vh[i] = pln_f32_to_f16(vc[i]); }
    float slopes[64];
    for (int h = 0; h < n_head; h++) slopes[h] = pln_alibi_slope(h, n_head);
    const float *sl = n_kv > 0 ? NULL : slopes;
    const int64_t width = n_kv > 0 ? (int64_t)(n_head + 2 * n_kv) * hd : (int64_t)n_head * 3 * hd;
    for (int w = 0; w < 4; w++) {
        /* f32 then f16 KV cache (the same keys, rounded), each decode then prefill */
        int prefill = w & 1, f16 = w >> 1;
        const void *kp = f16 ? (const void *)kh : kc, *vp = f16 ? (const void *)vh : vc;
        pln_backend_set_kv_dtype(g_be, f16 ? PLN_DTYPE_F16 : PLN_DTYPE_F32);
        int T = prefill ? ctx : n_seq;
        int32_t *seq = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
        for (int t = 0; t < T; t++) { seq[t] = prefill ? 0 : t; pos[t] = prefill ? t : ctx - 1; }
        float *qkv = rnd_vec((size_t)(T * width), -1, 1), *out = malloc((size_t)T * n_head * hd * 4);
        pln_attn_meta m = {T, n_seq, bs, max_blocks, ctx, seq, pos, table, n_kv, 0};
        g_be->attention(g_be, out, qkv, kp, vp, &m, sl, n_head, hd);
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double t0 = pln_now();
            g_be->attention(g_be, out, qkv, kp, vp, &m, sl, n_head, hd);
            best = fmin(best, pln_now() - t0);
        }
        double keys = prefill ? (double)ctx * (ctx + 1) / 2 : (double)ctx * n_seq;
        double flops = keys * n_head * hd * 4;
        printf("attention %s %s KV ctx %d, %d seq, %dx%d heads (%d KV): %8.3f ms  %6.1f GFLOP/s  %5.1f GB/s of KV\n",
               prefill ? "prefill" : "decode ", f16 ? "f16" : "f32", ctx, prefill ? 1 : n_seq, n_head, hd, cache_heads,
               best * 1e3, flops / best / 1e9, prefill ? 0.0 : keys * cache_heads * hd * (f16 ? 4 : 8) / best / 1e9);
        free(seq); free(pos); free(qkv); free(out);
    }
    pln_backend_set_kv_dtype(g_be, PLN_DTYPE_F32);
    free(kc); free(vc); free(kh); free(vh); free(table);
}

/* The Llama MLP's gate|up projection (llama-3.2-1b: I 8192 of hidden 2048) with SwiGLU in the
 * linear's epilogue against linear then swiglu, interleaved call by call on the same weights (a
 * loaded machine slows both alike): the best of `reps` of each, ms. */
static void bench_swiglu(int64_t I, int64_t cols, int n_t, const int *Ts) {
    static const struct { int kind; int64_t group; const char *name; } kinds[] = {
        {0, 0, "F16    "}, {WQ_I8, 0, "I8     "}, {WQ_I4, 128, "I4 g128"}};
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        test_weight tw = make_weight(2 * I, cols, kinds[kd].kind, kinds[kd].group);
        for (int ti = 0; ti < n_t; ti++) {
            int T = Ts[ti];
            float *x = rnd_vec((size_t)(T * cols), -1, 1), *h = malloc((size_t)(T * 2 * I) * 4), *o = malloc((size_t)(T * I) * 4);
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < (T <= 8 ? 200 : 40); r++)
                for (int f = 0; f < 2; f++) {
                    double t0 = pln_now();
                    if (f) g_be->linear(g_be, o, x, &tw.W, NULL, T, PLN_EPI_SWIGLU);
                    else { g_be->linear(g_be, h, x, &tw.W, NULL, T, PLN_EPI_NONE); g_be->swiglu(g_be, o, h, T, I); }
                    best[f] = fmin(best[f], pln_now() - t0);
                }
            printf("gate|up [%lld x %lld] %s T %4d: linear then swiglu %8.3f ms, SwiGLU epilogue %8.3f ms (%.2fx)\n",
                   (long long)(2 * I), (long long)cols, kinds[kd].name, T, best[0] * 1e3, best[1] * 1e3, best[0] / best[1]);
            free(x); free(h); free(o);
        }
        free(tw.w); free(tw.scale);
    }
}

static int run_bench(int n_t, const int *Ts) {
    double copy = pln_cpu_copy_gbs((size_t)256 << 20);
    printf("threads %d (backend), isa %s\n", pln_cpu_threads(pln_cpu_of(g_be)), pln_cpu_isa_name(pln_cpu_isa_best()));
    printf("STREAM-style copy: %.1f GB/s (read+write, 256 MiB arrays)\n", copy);
    bench_linear(8192, 2048, n_t, Ts, copy);    /* bloom-1b7's dense_h_to_4h */
    bench_linear(2048, 8192, n_t, Ts, copy);    /* and dense_4h_to_h */
    bench_swiglu(8192, 2048, n_t, Ts);          /* llama-3.2-1b's gate|up with and without the SwiGLU epilogue */
    bench_attention(512, 8, 16, 128, 0);
    bench_attention(512, 8, 16, 64, 0);
    bench_attention(512, 8, 32, 64, 8);     /* Llama-3.2-1B */
    bench_attention(512, 8, 32, 128, 8);    /* Llama-3.1-8B */
    /* GeLU epilogue cost beside the GEMM it follows */
    {
        int64_t n = 32 * 8192;
        float *o = rnd_vec((size_t)n, -5, 5);
        const pln_cpu_kernels *k = pln_cpu_of(g_be)->k;
        double t0 = pln_now();
        for (int r = 0; r < 10; r++) k->bias_gelu(o, NULL, n, true);
        printf("bias_gelu %s: %.2f ns per element\n", k->name, (pln_now() - t0) / 10 / (double)n * 1e9);
        free(o);
    }
    return 0;
}

/* The batched float path against the tiles it replaces (--bench-panel [T...]): Llama-3.2-1B's
 * shapes (gate|up [16384 x 2048], down [2048 x 8192], qkv [3072 x 2048]) at T = 32, 64, 512 by
 * default, each weight kind on the float path, the tiles (the batch-invariant mode, which takes
 * them at every step size) and the panel called in turn on the same weights, so that a loaded
 * machine slows both alike: the best of each in GFLOP/s, and the median over the pairs of the
 * ratio of their times (the figure a shared machine's bursts of other work disturb least). */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_bench_panel(int n_t, const int *Ts) {
    static const struct { int64_t rows, cols; const char *name; } shapes[] = {
        {16384, 2048, "gate|up"}, {2048, 8192, "down   "}, {3072, 2048, "qkv    "}};
    static const struct { int kind; int64_t group; const char *name; } kinds[] = {
        {0, 0, "F16    "}, {WQ_I8, 0, "I8     "}, {WQ_I8, 32, "I8 g32 "}, {WQ_I4, 32, "I4 g32 "}};
    printf("threads %d (backend), isa %s\n", pln_cpu_threads(pln_cpu_of(g_be)), pln_cpu_of(g_be)->k ? pln_cpu_of(g_be)->k->name : "ref");
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
            int64_t rows = shapes[sh].rows, cols = shapes[sh].cols;
            const char *only_kind = getenv("PLN_BENCH_KIND"), *only_shape = getenv("PLN_BENCH_SHAPE");
            if (only_kind && strncmp(only_kind, kinds[kd].name, strlen(only_kind))) continue;
            if (only_shape && !strchr(only_shape, shapes[sh].name[0])) continue;
            test_weight tw = make_weight(rows, cols, kinds[kd].kind, kinds[kd].group);
            for (int ti = 0; ti < n_t; ti++) {
                int T = Ts[ti];
                float *x = rnd_vec((size_t)(T * cols), -1, 1), *o = malloc((size_t)(T * rows) * 4);
                double flop = 2.0 * (double)rows * (double)cols * T, best[2] = {1e30, 1e30}, ratio[64];
                int reps = flop > 2e10 ? 7 : flop > 2e9 ? 15 : 31;
                for (int r = 0; r <= reps; r++) {   /* the first pair warms up */
                    double dt[2];
                    for (int f = 0; f < 2; f++) {
                        pln_cpu_set_batch_invariant(g_be, !f);
                        double t0 = pln_now();
                        g_be->linear(g_be, o, x, &tw.W, NULL, T, PLN_EPI_NONE);
                        dt[f] = pln_now() - t0;
                    }
                    if (!r) continue;
                    for (int f = 0; f < 2; f++) best[f] = fmin(best[f], dt[f]);
                    ratio[r - 1] = dt[0] / dt[1];
                }
                qsort(ratio, (size_t)reps, sizeof ratio[0], cmp_double);
                printf("%s %s [%5lld x %4lld] T %4d: tiles %8.2f ms %6.1f GFLOP/s, panel %8.2f ms %6.1f GFLOP/s; "
                       "panel speed-up, median of %d pairs %.2fx (quartiles %.2f-%.2f)\n",
                       shapes[sh].name, kinds[kd].name, (long long)rows, (long long)cols, T, best[0] * 1e3, flop / best[0] / 1e9,
                       best[1] * 1e3, flop / best[1] / 1e9, reps, ratio[reps / 2], ratio[reps / 4], ratio[3 * reps / 4]);
                fflush(stdout);
                free(x); free(o);
            }
            free(tw.w); free(tw.scale);
        }
    pln_cpu_set_batch_invariant(g_be, false);
    return 0;
}

int main(int argc, char **argv) {
    test_begin("test_kernels_cpu");
    g_be = pln_backend_create("cpu", 0);
    if (!g_be) { fprintf(stderr, "cpu backend: %s\n", pln_error()); return 1; }
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        /* token counts to time: the arguments after --bench, else 1 8 32 128 */
        int Ts[16] = {1, 8, 32, 128}, n_t = argc > 2 ? 0 : 4;
        for (int i = 2; i < argc && n_t < 16; i++) if (atoi(argv[i]) > 0) Ts[n_t++] = atoi(argv[i]);
        return run_bench(n_t, Ts);
    }
    if (argc > 1 && !strcmp(argv[1], "--bench-panel")) {
        /* token counts to time: the arguments after --bench-panel, else 32 64 512 */
        int Ts[16] = {32, 64, 512}, n_t = argc > 2 ? 0 : 3;
        for (int i = 2; i < argc && n_t < 16; i++) if (atoi(argv[i]) > 0) Ts[n_t++] = atoi(argv[i]);
        return run_bench_panel(n_t, Ts);
    }
    printf("instruction sets:");
    for (int i = 0; i < PLN_CPU_ISA_COUNT; i++)
        if (pln_cpu_isa_supported((pln_cpu_isa)i)) printf(" %s", pln_cpu_isa_name((pln_cpu_isa)i));
    printf(" (default %s)\n", pln_cpu_isa_name(pln_cpu_isa_best()));
    test_embed();
    test_layernorm();
    test_linear();
    test_fma_chains();
    test_thread_stride();
    test_work_buffers();
    test_int_dot();
    test_logits();
    test_threads();
    test_batch_invariance();
    test_gelu();
    test_attention();
    test_attention_f16();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_linear_swiglu();
    test_gqa();
    test_logit_process();
    test_topk();
    test_errors();
    test_cpu_tune();
    pln_backend_destroy(g_be);
    return test_done();
}
