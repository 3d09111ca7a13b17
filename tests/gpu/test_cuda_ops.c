/* test_cuda_ops.c — every op of the CUDA backend against the CPU backend (the reference), the
 * habit of llm.c's dev/cuda: random inputs rounded to fp16 so both backends see the same values,
 * outputs poisoned with NaN before each call (an element the kernel forgets shows up), relative L2
 * error and the largest difference per op with OK / NOT OK. Shapes: tiny and odd ones (the test
 * fixtures' 4 heads of 16, a vocab slice of 1003 rows), and BLOOM-176B's per-rank shapes at TP 8
 * (hidden 14336, 14 heads of 128, 4H/8 = 7168, vocab 250880/8 = 31360). Every linear case runs
 * on each kernel (GEMV, GEMM/cuBLASLt, plain) as well as the automatic choice. The Llama family's
 * ops (RMSNorm, rotary, SwiGLU) and grouped-query attention on every attention path, with
 * Llama-3.1-8B's and a Llama-3.1-70B TP-8 rank's shapes in the full run.
 *
 *   build/tests-gpu/test_cuda_ops            all checks (needs a GPU, sm_80+)
 *   build/tests-gpu/test_cuda_ops --probe    exit 0 if a usable GPU exists, else print why, exit 77
 *   build/tests-gpu/test_cuda_ops --quick    skip the BLOOM-size shapes
 *   build/tests-gpu/test_cuda_ops --cpu-as-gpu   the harness checking itself without a GPU: the CPU
 *                                            backend on both sides (CUDA-only checks skipped)
 *   build/emu/tests-gpu/test_cuda_ops        the same checks with every CUDA kernel run on the CPU,
 *                                            thread by thread under the race checks (kernels/cuda/emu;
 *                                            the small shapes: --quick is implied) */
#include "tests/test.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/pln_math.h"

#include <fcntl.h>
#include <stdint.h>
#include <xxhash.h>
#ifdef PLN_CUDA_EMU
#include "kernels/cuda/emu/emu.h"
#endif

/* ---- random inputs ------------------------------------------------------------------------- */
static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd_u32(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)(rnd_u32() & 0xffffff) / 16777216.0f; }
/* Values already representable in fp16, so the fp32 CPU and the fp16 GPU start equal. */
static float *rnd_act(size_t n, float lo, float hi)
{
    float *v = pln_xmalloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = pln_f16_to_f32(pln_f32_to_f16(rnd_f(lo, hi)));
    return v;
}
static uint16_t *rnd_f16(size_t n, float lo, float hi)
{
    uint16_t *v = pln_xmalloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = pln_f32_to_f16(rnd_f(lo, hi));
    return v;
}

static pln_backend *g_cpu, *g_gpu;
static bool g_quick, g_self;   /* g_self: --cpu-as-gpu */

static void set_path(int path)
{
    if (!g_self) pln_cuda_set_linear_path(g_gpu, path);
}

/* ---- moving data in either backend's dtype --------------------------------------------------- */
static void *dalloc(pln_backend *be, size_t n)
{
    void *p = be->alloc(be, n ? n : 16);
    if (!p) { fprintf(stderr, "alloc %zu on %s: %s\n", n, be->name, pln_error()); exit(2); }
    return p;
}
static void *up(pln_backend *be, const void *h, size_t n)
{
    void *d = dalloc(be, n);
    if (be->upload(be, d, h, n)) { fprintf(stderr, "upload: %s\n", pln_error()); exit(2); }
    return d;
}
/* Activations from float (already fp16-exact) into be's act dtype. */
static void *up_act(pln_backend *be, const float *h, size_t n)
{
    if (be->act_dtype == PLN_DTYPE_F32) return up(be, h, n * 4);
    uint16_t *t = pln_xmalloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) t[i] = pln_f32_to_f16(h[i]);
    void *d = up(be, t, n * 2);
    free(t);
    return d;
}
static void down_act(pln_backend *be, float *h, const void *d, size_t n)
{
    if (be->act_dtype == PLN_DTYPE_F32) { be->download(be, h, d, n * 4); return; }
    uint16_t *t = pln_xmalloc(n * 2 + 2);
    be->download(be, t, d, n * 2);
    for (size_t i = 0; i < n; i++) h[i] = pln_f16_to_f32(t[i]);
    free(t);
}
/* A buffer of n bytes filled with 0xff: NaN in fp16 and fp32, -1 in int32. */
static void *poisoned(pln_backend *be, size_t n)
{
    void *d = dalloc(be, n);
    uint8_t *h = pln_xmalloc(n + 1);
    memset(h, 0xff, n);
    be->upload(be, d, h, n);
    free(h);
    return d;
}
static void poison(pln_backend *be, void *d, size_t n)
{
    uint8_t *h = pln_xmalloc(n + 1);
    memset(h, 0xff, n);
    be->upload(be, d, h, n);
    free(h);
}

/* ---- the verdict ----------------------------------------------------------------------------- */
static void report(const char *op, const char *shape, const float *got, const float *want, size_t n, double tol)
{
    double maxd = 0;
    size_t nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) && got[i] == want[i]) continue;
        double d = fabs((double)got[i] - want[i]);
        if (!(d == d)) { nan++; continue; }
        if (d > maxd) maxd = d;
    }
    /* -inf entries (vocab padding) must match exactly and are left out of the L2 norms. */
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i])) { if (got[i] != want[i]) nan++; continue; }
        double d = (double)got[i] - want[i];
        num += d * d; den += (double)want[i] * want[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    bool ok = nan == 0 && rel <= tol;
    printf("%-16s %-44s rel %.2e  max|d| %.2e%s  %s\n", op, shape, rel, maxd, nan ? "  (NaN/unwritten!)" : "",
           ok ? "OK" : "NOT OK");
    CHECK(ok, "%s %s: relative error %.3g (tol %.3g), %zu bad elements", op, shape, rel, tol, nan);
}

/* The relative L2 error of report() can hide one wrong element among hundreds of thousands (a
 * boundary row, the last token of a tile): every element must also lie within frac of the
 * output's RMS. Names the worst element as [t, row] so a failing kernel says where it went wrong. */
static void report_elems(const char *op, const char *shape, const float *got, const float *want, size_t n,
                         int64_t width, double frac)
{
    double ss = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i])) { ss += (double)want[i] * want[i]; nf++; }
    double bound = frac * (nf ? sqrt(ss / nf) : 1.0) + 1e-6, worst = 0;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(want[i])) continue;
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= bound)) { bad++; if (!(d <= worst)) { worst = d; at = i; } }
    }
    if (bad)
        printf("%-16s %-44s %zu elements off by > %.2e, worst [t %lld, row %lld]: got %g want %g  NOT OK\n", op, shape,
               bad, bound, (long long)(at / (size_t)width), (long long)(at % (size_t)width), got[at], want[at]);
    CHECK(bad == 0, "%s %s: %zu elements beyond %.3g", op, shape, bad, bound);
}

/* ---- embedding, gather ----------------------------------------------------------------------- */
static void test_embed(int64_t vn, int64_t H, int64_t v0, int32_t T)
{
    char shape[96];
    snprintf(shape, sizeof shape, "vn %lld H %lld v0 %lld T %d", (long long)vn, (long long)H, (long long)v0, T);
    uint16_t *table = rnd_f16((size_t)(vn * H), -1, 1);
    int32_t *ids = pln_xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(rnd_u32() % (uint32_t)(vn * 3));   /* some outside the slice */
    float *want = pln_xmalloc((size_t)T * H * 4), *got = pln_xmalloc((size_t)T * H * 4);
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        void *tab = up(be, table, (size_t)(vn * H) * 2), *di = up(be, ids, (size_t)T * 4);
        void *out = poisoned(be, (size_t)T * H * be->act_size);
        CHECK(be->embed(be, out, di, T, tab, v0, vn, H) == 0, "embed: %s", pln_error());
        down_act(be, b ? got : want, out, (size_t)T * H);
        /* gather rows T-1..0 of the embedding output */
        int32_t *rows = pln_xmalloc((size_t)T * 4);
        for (int t = 0; t < T; t++) rows[t] = T - 1 - t;
        void *dr = up(be, rows, (size_t)T * 4), *g2 = poisoned(be, (size_t)T * H * be->act_size);
        CHECK(be->gather_rows(be, g2, out, dr, T, H) == 0, "gather: %s", pln_error());
        float *tmp = pln_xmalloc((size_t)T * H * 4);
        down_act(be, tmp, g2, (size_t)T * H);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < H; i++) bad += tmp[t * H + i] != (b ? got : want)[(T - 1 - t) * H + i];
        CHECK(bad == 0, "gather_rows on %s: %d wrong", be->name, bad);
        free(tmp); free(rows);
        be->free(be, tab); be->free(be, di); be->free(be, out); be->free(be, dr); be->free(be, g2);
    }
    report("embed", shape, got, want, (size_t)T * H, 0.0);
    free(table); free(ids); free(want); free(got);
}

/* ---- layernorm, residual + bias + layernorm -------------------------------------------------- */
static int g_ln_split;   /* the cuda backend runs LayerNorm rows over several blocks (pln_cuda_set_ln_split) */
static void test_layernorm(int32_t T, int64_t H)
{
    char shape[96];
    snprintf(shape, sizeof shape, "T %d H %lld%s", T, (long long)H, g_ln_split ? " split" : "");
    size_t n = (size_t)T * H;
    float *x = rnd_act(n, -4, 6), *y = rnd_act(n, -2, 2);
    uint16_t *gm = rnd_f16((size_t)H, 0.5f, 1.5f), *bt = rnd_f16((size_t)H, -0.5f, 0.5f), *bias = rnd_f16((size_t)H, -1, 1);
    float *want[3], *got[3];
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        float **res = b ? got : want;
        for (int i = 0; i < 3; i++) res[i] = pln_xmalloc(n * 4);
        void *dx = up_act(be, x, n), *dy = up_act(be, y, n);
        void *g = up(be, gm, (size_t)H * 2), *be_ = up(be, bt, (size_t)H * 2), *bi = up(be, bias, (size_t)H * 2);
        void *o = poisoned(be, n * be->act_size);
        CHECK(be->layernorm(be, o, dx, g, be_, T, H, 1e-5f) == 0, "layernorm: %s", pln_error());
        down_act(be, res[0], o, n);
        poison(be, o, n * be->act_size);
        CHECK(be->residual_layernorm(be, dx, dy, bi, g, be_, o, T, H, 1e-5f) == 0, "residual_layernorm: %s", pln_error());
        down_act(be, res[1], o, n);
        down_act(be, res[2], dx, n);
        /* in place: out == in */
        CHECK(be->layernorm(be, dx, dx, g, be_, T, H, 1e-5f) == 0, "layernorm in place: %s", pln_error());
        be->free(be, dx); be->free(be, dy); be->free(be, g); be->free(be, be_); be->free(be, bi); be->free(be, o);
    }
    report("layernorm", shape, got[0], want[0], n, 2e-3);
    report("residual+ln", shape, got[1], want[1], n, 2e-3);
    report("residual sum", shape, got[2], want[2], n, 1e-3);
    for (int i = 0; i < 3; i++) { free(want[i]); free(got[i]); }
    free(x); free(y); free(gm); free(bt); free(bias);
}

/* ---- linear: fp16, int8 per channel, int8 per group, int4 (U8 packed); every kernel path ------ */
typedef struct {
    pln_dtype dt;
    int64_t rows, cols, group;
    uint16_t *w16;
    int8_t *w8;
    uint16_t *scale;
    uint8_t *w4;                 /* PLN_DTYPE_U8: packed int4 [rows, cols / 2] */
} host_weight;

static host_weight make_weight(pln_dtype dt, int64_t rows, int64_t cols, int64_t group)
{
    host_weight h = {dt, rows, cols, group, NULL, NULL, NULL, NULL};
    float amp = 1.0f / sqrtf((float)cols);
    if (dt == PLN_DTYPE_F16) { h.w16 = rnd_f16((size_t)(rows * cols), -amp * 2, amp * 2); return h; }
    if (dt == PLN_DTYPE_U8) {   /* every nibble value, -8 included */
        h.w4 = pln_xmalloc((size_t)(rows * cols / 2));
        for (int64_t i = 0; i < rows * cols / 2; i++) h.w4[i] = (uint8_t)rnd_u32();
        h.scale = rnd_f16((size_t)(rows * (cols / group)), amp / 8 * 0.5f, amp / 8 * 2);
        return h;
    }
    if (group <= 0) h.group = cols;
    h.w8 = pln_xmalloc((size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) h.w8[i] = (int8_t)((int)(rnd_u32() % 255) - 127);
    h.scale = rnd_f16((size_t)(rows * (cols / h.group)), amp / 127 * 0.5f, amp / 127 * 2);
    return h;
}
static void free_host_weight(host_weight *h) { free(h->w16); free(h->w8); free(h->scale); free(h->w4); }

static pln_weight up_weight(pln_backend *be, const host_weight *h, void **bufs)
{
    pln_weight w = {h->dt, h->rows, h->cols, NULL, NULL, h->group};
    if (h->dt == PLN_DTYPE_F16) {
        w.w = bufs[0] = up(be, h->w16, (size_t)(h->rows * h->cols) * 2);
        bufs[1] = NULL;
    } else if (h->dt == PLN_DTYPE_U8) {
        w.w = bufs[0] = up(be, h->w4, (size_t)(h->rows * h->cols / 2));
        w.scale = bufs[1] = up(be, h->scale, (size_t)(h->rows * (h->cols / h->group)) * 2);
    } else {
        w.w = bufs[0] = up(be, h->w8, (size_t)(h->rows * h->cols));
        w.scale = bufs[1] = up(be, h->scale, (size_t)(h->rows * (h->cols / h->group)) * 2);
    }
    return w;
}

static const char *path_name[] = {"auto", "gemv", "gemm", "plain", "gemv/k3", "gemm/k3"};

static void test_linear_ex(pln_dtype dt, int64_t rows, int64_t cols, int64_t group, int32_t T, bool bias, bool gelu,
                           int bias_off, int in_off, int w_off);
static void test_linear_off(pln_dtype dt, int64_t rows, int64_t cols, int64_t group, int32_t T, bool bias, bool gelu,
                            int bias_off)
{
    test_linear_ex(dt, rows, cols, group, T, bias, gelu, bias_off, 0, 0);
}
static void test_linear(pln_dtype dt, int64_t rows, int64_t cols, int64_t group, int32_t T, bool bias, bool gelu)
{
    test_linear_ex(dt, rows, cols, group, T, bias, gelu, 0, 0, 0);
}

/* Offsets into the device allocations, to reach the fallbacks for pointers the fast kernels
 * cannot take: bias_off halves (bias not 16-byte aligned: cuBLASLt's epilogue is skipped),
 * in_off halves (input not 16-byte aligned), w_off bytes (weight rows not 16-byte aligned). */
static void test_linear_ex(pln_dtype dt, int64_t rows, int64_t cols, int64_t group, int32_t T, bool bias, bool gelu,
                           int bias_off, int in_off, int w_off)
{
    char shape[128];
    snprintf(shape, sizeof shape, "%s%s [%lld x %lld] T %d%s%s", dt == PLN_DTYPE_F16 ? "f16" : dt == PLN_DTYPE_U8 ? "i4" : "i8",
             dt == PLN_DTYPE_I8 ? (group > 0 && group != cols ? "/g" : "/ch") : "", (long long)rows, (long long)cols, T,
             bias ? (bias_off ? " +bias(unaligned)" : " +bias") : "", gelu ? " +gelu" : "");
    if ((dt == PLN_DTYPE_I8 || dt == PLN_DTYPE_U8) && group > 0 && group != cols) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " G%lld", (long long)group);
    if (in_off) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " in+%d", in_off);
    if (w_off) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " w+%dB", w_off);
    host_weight hw = make_weight(dt, rows, cols, group);
    uint16_t *hb = rnd_f16((size_t)rows, -0.5f, 0.5f);
    size_t nin = (size_t)T * cols, nout = (size_t)T * rows;
    float *x = rnd_act(nin, -1, 1);
    float *want = pln_xmalloc(nout * 4), *got = pln_xmalloc(nout * 4);

    void *cb[2];
    pln_weight cw = up_weight(g_cpu, &hw, cb);
    void *cx = up_act(g_cpu, x, nin), *cbias = bias ? up(g_cpu, hb, (size_t)rows * 2) : NULL;
    void *co = poisoned(g_cpu, nout * 4);
    CHECK(g_cpu->linear(g_cpu, co, cx, &cw, cbias, T, gelu) == 0, "cpu linear: %s", pln_error());
    down_act(g_cpu, want, co, nout);

    void *gb[2];
    pln_weight gw = up_weight(g_gpu, &hw, gb);
    void *gw_buf = NULL;
    if (w_off) {   /* the same weight w_off bytes into a larger allocation */
        size_t wbytes = (size_t)(rows * cols) * (dt == PLN_DTYPE_F16 ? 4 : dt == PLN_DTYPE_U8 ? 1 : 2) / 2;
        gw_buf = dalloc(g_gpu, wbytes + (size_t)w_off);
        gw.w = (uint8_t *)gw_buf + w_off;
        g_gpu->upload(g_gpu, (void *)gw.w, dt == PLN_DTYPE_F16 ? (const void *)hw.w16 : dt == PLN_DTYPE_U8 ? (const void *)hw.w4
                                                                                     : (const void *)hw.w8, wbytes);
    }
    void *gx_buf = NULL, *gx = NULL, *gbias_buf = NULL, *gbias = NULL;
    if (in_off) {
        uint16_t *t16 = pln_xmalloc(nin * 2 + 2);
        for (size_t i = 0; i < nin; i++) t16[i] = pln_f32_to_f16(x[i]);
        size_t asz = g_gpu->act_size;
        gx_buf = dalloc(g_gpu, (nin + (size_t)in_off) * asz);
        gx = (uint8_t *)gx_buf + (size_t)in_off * asz;
        if (asz == 4) g_gpu->upload(g_gpu, gx, x, nin * 4);   /* --cpu-as-gpu */
        else g_gpu->upload(g_gpu, gx, t16, nin * 2);
        free(t16);
    } else {
        gx = gx_buf = up_act(g_gpu, x, nin);
    }
    if (bias) {
        gbias_buf = dalloc(g_gpu, (size_t)(rows + bias_off) * 2);
        gbias = (uint16_t *)gbias_buf + bias_off;
        g_gpu->upload(g_gpu, gbias, hb, (size_t)rows * 2);
    }
    void *go = dalloc(g_gpu, nout * g_gpu->act_size);
    /* The input as a kernel's output (gather_rows, identity) right before the linear, as in the
     * model: under programmatic dependent launch (on in the harness, which reports sm_90) every
     * read of it before the linear's griddepcontrol.wait, a cp.async included, is reported. Not
     * with in_off, whose unaligned input is the point. */
    void *gxk = NULL, *drows = NULL;
    if (!in_off && !g_self) {
        int32_t *ident = pln_xmalloc((size_t)T * 4);
        for (int t = 0; t < T; t++) ident[t] = t;
        drows = up(g_gpu, ident, (size_t)T * 4);
        gxk = dalloc(g_gpu, nin * g_gpu->act_size);
        free(ident);
    }
    /* 4: the GEMV with k split over 3 blocks per row tile; 5: the quantized GEMM split the same way */
    for (int path = 0; path < 6; path++) {
        if ((path == 1 || path == 4) && T > 32) continue;   /* the GEMV's largest tile (linear.cu GEMV_MAX_T) */
        if (path == 4 && (g_self || dt == PLN_DTYPE_U8)) continue;
        if (path == 5 && (g_self || dt == PLN_DTYPE_F16)) continue;
        if (path == 3 && rows * cols * (int64_t)T > ((int64_t)1 << 31)) continue;   /* the plain kernel is slow */
        poison(g_gpu, go, nout * g_gpu->act_size);
        if (g_self && path) continue;
        set_path(path == 4 ? 1 : path == 5 ? 2 : path);
        if (path >= 4) pln_cuda_set_gemv_splits(g_gpu, 3);
        if (gxk) CHECK(g_gpu->gather_rows(g_gpu, gxk, gx, drows, T, cols) == 0, "gather (linear input): %s", pln_error());
        CHECK(g_gpu->linear(g_gpu, go, gxk ? gxk : gx, &gw, gbias, T, gelu) == 0, "cuda linear (%s): %s", path_name[path],
              pln_error());
        if (path >= 4) pln_cuda_set_gemv_splits(g_gpu, 0);
        down_act(g_gpu, got, go, nout);
        char op[32];
        snprintf(op, sizeof op, "linear/%s", path_name[path]);
        report(op, shape, got, want, nout, 5e-3);
        report_elems(op, shape, got, want, nout, rows, 0.1);
    }
    set_path(0);
    g_cpu->free(g_cpu, cb[0]); g_cpu->free(g_cpu, cb[1]); g_cpu->free(g_cpu, cx); g_cpu->free(g_cpu, cbias); g_cpu->free(g_cpu, co);
    g_gpu->free(g_gpu, gb[0]); g_gpu->free(g_gpu, gb[1]); g_gpu->free(g_gpu, gx_buf); g_gpu->free(g_gpu, gbias_buf); g_gpu->free(g_gpu, go);
    g_gpu->free(g_gpu, gw_buf); g_gpu->free(g_gpu, gxk); g_gpu->free(g_gpu, drows);
    free_host_weight(&hw); free(hb); free(x); free(want); free(got);
}

/* SwiGLU in the gate|up linear's epilogue (backend.h PLN_EPI_SWIGLU), on every path (GEMV, GEMM
 * or cuBLASLt, the plain kernels, split-k): bit for bit linear then swiglu on the same backend,
 * and within the linear's bounds of the CPU backend's fused result. rows = 2 I. */
static void test_linear_swiglu(pln_dtype dt, int64_t I, int64_t cols, int64_t group, int32_t T, bool bias)
{
    char shape[128];
    snprintf(shape, sizeof shape, "%s [%lld x %lld] T %d%s G%lld", dt == PLN_DTYPE_F16 ? "f16" : dt == PLN_DTYPE_U8 ? "i4" : "i8",
             (long long)(2 * I), (long long)cols, T, bias ? " +bias" : "", (long long)group);
    host_weight hw = make_weight(dt, 2 * I, cols, group);
    uint16_t *hb = rnd_f16((size_t)(2 * I), -0.5f, 0.5f);
    size_t nin = (size_t)T * cols, nout = (size_t)T * I;
    float *x = rnd_act(nin, -1, 1);
    float *want = pln_xmalloc(nout * 4), *got = pln_xmalloc(nout * 4), *two = pln_xmalloc(nout * 4);
    void *cb[2];
    pln_weight cw = up_weight(g_cpu, &hw, cb);
    void *cx = up_act(g_cpu, x, nin), *cbias = bias ? up(g_cpu, hb, (size_t)(2 * I) * 2) : NULL;
    void *co = poisoned(g_cpu, nout * 4);
    CHECK(g_cpu->linear(g_cpu, co, cx, &cw, cbias, T, PLN_EPI_SWIGLU) == 0, "cpu linear swiglu: %s", pln_error());
    down_act(g_cpu, want, co, nout);
    void *gb[2];
    pln_weight gw = up_weight(g_gpu, &hw, gb);
    void *gx = up_act(g_gpu, x, nin), *gbias = bias ? up(g_gpu, hb, (size_t)(2 * I) * 2) : NULL;
    void *go = dalloc(g_gpu, nout * g_gpu->act_size), *gh = dalloc(g_gpu, 2 * nout * g_gpu->act_size);
    CHECK(g_gpu->linear_swiglu, "the %s backend reports the SwiGLU epilogue", g_gpu->name);
    for (int path = 0; path < 6; path++) {
        if ((path == 1 || path == 4) && T > 32) continue;
        if (path == 4 && (g_self || dt == PLN_DTYPE_U8)) continue;
        if (path == 5 && (g_self || dt == PLN_DTYPE_F16)) continue;
        if (g_self && path) continue;
        set_path(path == 4 ? 1 : path == 5 ? 2 : path);
        if (path >= 4) pln_cuda_set_gemv_splits(g_gpu, 3);
        poison(g_gpu, go, nout * g_gpu->act_size);
        CHECK(g_gpu->linear(g_gpu, gh, gx, &gw, gbias, T, PLN_EPI_NONE) == 0, "cuda linear (%s): %s", path_name[path], pln_error());
        CHECK(g_gpu->swiglu(g_gpu, go, gh, T, I) == 0, "cuda swiglu: %s", pln_error());
        down_act(g_gpu, two, go, nout);
        poison(g_gpu, go, nout * g_gpu->act_size);
        CHECK(g_gpu->linear(g_gpu, go, gx, &gw, gbias, T, PLN_EPI_SWIGLU) == 0, "cuda linear swiglu (%s): %s", path_name[path],
              pln_error());
        if (path >= 4) pln_cuda_set_gemv_splits(g_gpu, 0);
        down_act(g_gpu, got, go, nout);
        size_t differ = 0;
        for (size_t i = 0; i < nout; i++) differ += memcmp(&got[i], &two[i], 4) != 0;
        printf("linear+swiglu/%s %s: %zu of %zu differ from linear then swiglu %s\n", path_name[path], shape, differ, nout,
               differ ? "NOT OK" : "OK");
        CHECK(differ == 0, "linear+swiglu/%s %s: %zu outputs differ from linear then swiglu", path_name[path], shape, differ);
        char op[40];
        snprintf(op, sizeof op, "linear+swiglu/%s", path_name[path]);
        report(op, shape, got, want, nout, 5e-3);
        report_elems(op, shape, got, want, nout, I, 0.1);
    }
    set_path(0);
    /* an odd row count is no [gate ; up] pair */
    pln_weight odd = gw;
    odd.rows = 2 * I - 1;
    CHECK(g_gpu->linear(g_gpu, go, gx, &odd, NULL, T, PLN_EPI_SWIGLU) != 0, "SwiGLU on %lld rows must fail", (long long)odd.rows);
    g_cpu->free(g_cpu, cb[0]); g_cpu->free(g_cpu, cb[1]); g_cpu->free(g_cpu, cx); g_cpu->free(g_cpu, cbias); g_cpu->free(g_cpu, co);
    g_gpu->free(g_gpu, gb[0]); g_gpu->free(g_gpu, gb[1]); g_gpu->free(g_gpu, gx); g_gpu->free(g_gpu, gbias); g_gpu->free(g_gpu, go);
    g_gpu->free(g_gpu, gh);
    free_host_weight(&hw); free(hb); free(x); free(want); free(got); free(two);
}

/* ---- logits (F32 out, padding rows -inf), logit_process, topk --------------------------------- */
/* Each kernel path (as linear), including the cuBLASLt F32 output with the -inf pass after it
 * (S > 16 on fp16) and the int8 GEMM's F32 epilogue over several 64-token tiles. */
static void test_logits(pln_dtype dt, int64_t vn, int64_t H, int64_t group, int32_t S, int64_t n_valid)
{
    char shape[96];
    snprintf(shape, sizeof shape, "%s vn %lld H %lld S %d valid %lld", dt == PLN_DTYPE_F16 ? "f16" : "i8", (long long)vn,
             (long long)H, S, (long long)n_valid);
    if (dt == PLN_DTYPE_I8 && group > 0 && group != H)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " G%lld", (long long)group);
    host_weight hw = make_weight(dt, vn, H, group);
    float *x = rnd_act((size_t)S * H, -2, 2);
    size_t n = (size_t)S * vn;
    float *want = pln_xmalloc(n * 4), *got = pln_xmalloc(n * 4);
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        void *wb[2];
        pln_weight w = up_weight(be, &hw, wb);
        void *dx = up_act(be, x, (size_t)S * H), *o = dalloc(be, n * 4);
        for (int path = 0; path < (b ? 4 : 1); path++) {
            if (path == 1 && S > 16) continue;
            if (path == 3 && vn * H * (int64_t)S > ((int64_t)1 << 31)) continue;
            if (g_self && path) continue;
            poison(be, o, n * 4);
            if (b) set_path(path);
            CHECK(be->logits(be, o, dx, &w, S, n_valid) == 0, "logits on %s (%s): %s", be->name, path_name[path], pln_error());
            be->download(be, b ? got : want, o, n * 4);
            if (!b) continue;
            char op[32];
            snprintf(op, sizeof op, "logits/%s", path_name[path]);
            report(op, shape, got, want, n, 2e-3);
            report_elems(op, shape, got, want, n, vn, 0.05);
        }
        if (b) set_path(0);
        be->free(be, wb[0]); be->free(be, wb[1]); be->free(be, dx); be->free(be, o);
    }
    free_host_weight(&hw); free(x); free(want); free(got);
}

/* cuBLASLt plans are cached per (shape, T, epilogue, alignment) in 128 slots: more distinct
 * shapes than slots evict plans, and coming back to an evicted shape must plan it again. */
static void test_lt_plans(void)
{
    const int64_t N = 72, K = 64;
    host_weight hw = make_weight(PLN_DTYPE_F16, N, K, 0);
    uint16_t *hb = rnd_f16((size_t)N, -0.5f, 0.5f);
    const int32_t Tmax = 160;
    float *x = rnd_act((size_t)Tmax * K, -1, 1);
    float *want = pln_xmalloc((size_t)Tmax * N * 4), *got = pln_xmalloc((size_t)Tmax * N * 4);
    void *cb[2], *gb[2];
    pln_weight cw = up_weight(g_cpu, &hw, cb), gw = up_weight(g_gpu, &hw, gb);
    void *cx = up_act(g_cpu, x, (size_t)Tmax * K), *gx = up_act(g_gpu, x, (size_t)Tmax * K);
    void *cbias = up(g_cpu, hb, (size_t)N * 2), *gbias = up(g_gpu, hb, (size_t)N * 2);
    void *co = dalloc(g_cpu, (size_t)Tmax * N * 4), *go = dalloc(g_gpu, (size_t)Tmax * N * g_gpu->act_size);
    double worst = 0;
    int calls = 0, failed = 0;
    for (int round = 0; round < 2; round++)
        for (int32_t T = 17; T <= (round ? 40 : Tmax); T++) {
            bool gelu = T % 2, with_bias = T % 3 != 0;
            poison(g_gpu, go, (size_t)T * N * g_gpu->act_size);
            int rc = g_cpu->linear(g_cpu, co, cx, &cw, with_bias ? cbias : NULL, T, gelu);
            rc |= g_gpu->linear(g_gpu, go, gx, &gw, with_bias ? gbias : NULL, T, gelu);
            calls++;
            if (rc) { failed++; continue; }
            down_act(g_cpu, want, co, (size_t)T * N);
            down_act(g_gpu, got, go, (size_t)T * N);
            double num = 0, den = 0;
            for (size_t i = 0; i < (size_t)T * N; i++) {
                double d = (double)got[i] - want[i];
                num += d * d; den += (double)want[i] * want[i];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!(rel <= worst)) worst = rel;   /* NaN sticks */
        }
    bool ok = failed == 0 && worst <= 5e-3;
    printf("%-16s %-44s rel %.2e  %d calls, %d failed  %s\n", "linear/plans", "f16 [72 x 64] T 17..160, then 17..40", worst,
           calls, failed, ok ? "OK" : "NOT OK");
    CHECK(ok, "cuBLASLt plan cache: worst relative error %.3g, %d of %d calls failed (%s)", worst, failed, calls,
          failed ? pln_error() : "");
    g_cpu->free(g_cpu, cb[0]); g_cpu->free(g_cpu, cx); g_cpu->free(g_cpu, cbias); g_cpu->free(g_cpu, co);
    g_gpu->free(g_gpu, gb[0]); g_gpu->free(g_gpu, gx); g_gpu->free(g_gpu, gbias); g_gpu->free(g_gpu, go);
    free_host_weight(&hw); free(hb); free(x); free(want); free(got);
}

static void test_sampling(int32_t S, int64_t vn, int64_t v0, int32_t k, bool ties)
{
    char shape[96];
    snprintf(shape, sizeof shape, "S %d vn %lld v0 %lld k %d%s", S, (long long)vn, (long long)v0, k, ties ? " ties" : "");
    size_t n = (size_t)S * vn;
    float *l = pln_xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) l[i] = ties ? (float)(rnd_u32() % 7) : rnd_f(-10, 10);
    if (vn > 3) l[vn - 1] = -INFINITY;   /* a padding-like row end */
    /* a row that is all padding (a rank whose vocab slice is all past n_valid): max -inf, sum 0,
     * the k lowest ids */
    if (!ties && S >= 3 && vn < 2000)
        for (int64_t i = 0; i < vn; i++) l[2 * vn + i] = -INFINITY;
    float *pen = pln_xmalloc((size_t)S * 4), *it = pln_xmalloc((size_t)S * 4);
    int32_t *off = pln_xmalloc((size_t)(S + 1) * 4), *seen = pln_xmalloc((size_t)S * 8 * 4);
    off[0] = 0;
    for (int s = 0; s < S; s++) {
        pen[s] = s % 2 ? 1.3f : 1.0f;
        it[s] = s % 3 ? 1.0f / 0.7f : 1.0f;
        for (int j = 0; j < 8; j++) seen[s * 8 + j] = (int32_t)(v0 - 2 + (int64_t)j * (vn / 7 + 1));   /* some outside the slice */
        seen[s * 8 + 7] = seen[s * 8 + 1];   /* listed twice: still penalised once */
        off[s + 1] = off[s] + 8;
    }
    float *pw = pln_xmalloc(n * 4), *pg = pln_xmalloc(n * 4);
    float *vw = pln_xmalloc((size_t)S * k * 4), *vg = pln_xmalloc((size_t)S * k * 4);
    int32_t *iw = pln_xmalloc((size_t)S * k * 4), *ig = pln_xmalloc((size_t)S * k * 4);
    float mw[64], mg[64], sw[64], sg[64];
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        void *dl = up(be, l, n * 4);
        void *dp = up(be, pen, (size_t)S * 4), *dt = up(be, it, (size_t)S * 4);
        void *doff = up(be, off, (size_t)(S + 1) * 4), *dseen = up(be, seen, (size_t)S * 8 * 4);
        pln_logit_proc p = {S, dp, dt, doff, dseen};
        CHECK(be->logit_process(be, dl, v0, vn, &p) == 0, "logit_process on %s: %s", be->name, pln_error());
        be->download(be, b ? pg : pw, dl, n * 4);
        float *vv = b ? vg : vw, *mm = b ? mg : mw, *ss = b ? sg : sw;
        int32_t *ii = b ? ig : iw;
        memset(vv, 0xff, (size_t)S * k * 4); memset(ii, 0xff, (size_t)S * k * 4);
        CHECK(be->topk(be, dl, S, vn, v0, k, vv, ii, mm, ss) == 0, "topk on %s: %s", be->name, pln_error());
        be->free(be, dl); be->free(be, dp); be->free(be, dt); be->free(be, doff); be->free(be, dseen);
    }
    report("logit_process", shape, pg, pw, n, 1e-6);
    int idbad = 0;
    for (int i = 0; i < S * k; i++) idbad += iw[i] != ig[i];
    printf("%-16s %-44s ids %d/%d differ  %s\n", "topk", shape, idbad, S * k, idbad ? "NOT OK" : "OK");
    CHECK(idbad == 0, "topk %s: %d ids differ (ties must go to the lower id)", shape, idbad);
    report("topk vals", shape, vg, vw, (size_t)S * k, 1e-6);
    report("topk max", shape, mg, mw, (size_t)S, 1e-6);
    report("topk sumexp", shape, sg, sw, (size_t)S, 1e-5);
    free(l); free(pen); free(it); free(off); free(seen); free(pw); free(pg); free(vw); free(vg); free(iw); free(ig);
}

/* ---- attention against float64 -------------------------------------------------------------
 * The backends' attention against a float64 computation on the same fp16 inputs, with slopes
 * recomputed in double from their definition (DESIGN.md), not from pln_alibi_slope: a wrong slope
 * in the shared math fails here even though both backends agree. Each output element gets its own
 * bound from what the kernels round (they compute in fp32 and round the output once):
 *   u_out |ref|                                    the output's rounding (fp16: 2^-11, fp32: 2^-24)
 * + 2 (2 (n + 2) 2^-24 + 2^-20) sum_j p_j |v_j|       sums over the n keys and the rescaling of the
 *                                                  online softmax in fp32, the exp's error
 * + 2 sum_j p_j e_j |v_j - ref|                     each score's fp32 error e_j (the dot product over
 *                                                  D terms, slope x position, the max subtracted)
 *                                                  moves its weight by e_j relative
 * so it grows with the length and the magnitudes and stays near fp16's half ulp at small ones:
 * a 0.1 % slope error is beyond it (checked below on every shape), as is anything that
 * overflows (a softmax without its max subtraction, at the large-magnitude shapes). */
static double alibi_slope64(int h, int n_head)
{
    int p = 1;
    while (p * 2 <= n_head) p *= 2;
    if (h < p) return pow(2.0, -8.0 / p * (h + 1));
    return pow(2.0, -4.0 / p * (2 * (h - p) + 1));
}

/* ref and tol [Tq, nh, D] for queries t (qkv row qrow[t], sequence qseq[t] at qpos[t]) over the keys
 * j <= qpos[t] whose qkv rows are krow[seq * kstride + j]; window > 0: only the keys
 * qpos[t] - window < j (a sliding window). */
static void attn_ref64(int32_t Tq, const float *const *qrow, const int32_t *qseq, const int32_t *qpos,
                       const float *const *krow, int32_t kstride, int32_t nh, int32_t D, int32_t n_head,
                       int32_t h0, int32_t window, double u_out, double *ref, double *tol)
{
    const double e32 = ldexp(1.0, -24), sq = sqrt((double)D);
    double *sc = pln_xmalloc((size_t)kstride * sizeof *sc), *es = pln_xmalloc((size_t)kstride * sizeof *es);
    for (int32_t t = 0; t < Tq; t++)
        for (int32_t h = 0; h < nh; h++) {
            const double slope = alibi_slope64(h0 + h, n_head);
            const float *q = qrow[t] + (size_t)h * 3 * D;
            const int32_t n = qpos[t] + 1, j0 = window > 0 && n > window ? n - window : 0;
            double m = -INFINITY;
            for (int32_t j = j0; j < n; j++) {
                const float *k = krow[(size_t)qseq[t] * kstride + j] + (size_t)h * 3 * D + D;
                double dot = 0, mag = 0;
                for (int32_t i = 0; i < D; i++) { dot += (double)q[i] * k[i]; mag += fabs((double)q[i] * k[i]); }
                sc[j] = dot / sq + slope * j;
                es[j] = e32 * (D * mag / sq + 2 * fabs(slope * j));
                if (sc[j] > m) m = sc[j];
            }
            double z = 0;
            for (int32_t j = j0; j < n; j++) { sc[j] = exp(sc[j] - m); z += sc[j]; es[j] += 2 * e32 * fabs(m); }
            for (int32_t d = 0; d < D; d++) {
                double r = 0, pv = 0;
                for (int32_t j = j0; j < n; j++) {
                    const double v = krow[(size_t)qseq[t] * kstride + j][(size_t)h * 3 * D + 2 * D + d];
                    r += sc[j] / z * v;
                    pv += sc[j] / z * fabs(v);
                }
                double se = 0;
                for (int32_t j = j0; j < n; j++)
                    se += sc[j] / z * es[j] * fabs(krow[(size_t)qseq[t] * kstride + j][(size_t)h * 3 * D + 2 * D + d] - r);
                const size_t o = ((size_t)t * nh + h) * D + d;
                ref[o] = r;
                tol[o] = u_out * fabs(r) + 2 * (2 * (n - j0 + 2) * e32 + ldexp(1.0, -20)) * pv + 2 * se + 1e-30;
            }
        }
    free(sc);
    free(es);
}

/* Elements of got beyond their bound (a NaN is beyond any), and the verdict line unless quiet. */
static size_t report64(const char *op, const char *shape, const float *got, const double *ref, const double *tol,
                       size_t n, bool quiet)
{
    size_t bad = 0, at = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol[i])) bad++;
        const double r = d == d ? d / tol[i] : INFINITY;
        if (!(r <= worst)) { worst = r; at = i; }
    }
    if (!quiet)
        printf("%-16s %-44s f64: worst %.2f of its bound (got %.6g want %.6g)  %s\n", op, shape, worst, got[at], ref[at],
               bad ? "NOT OK" : "OK");
    return bad;
}

/* ---- kv_append + attention over a scattered paged cache ---------------------------------------
 * ctx[s] tokens of sequence s are fed as a prefill step (every token attends causally), then one
 * decode token per sequence. n_head is the model's, heads h0.. are this rank's. nkv 0: BLOOM's
 * interleaved heads with ALiBi; nkv > 0: the grouped-query layout with nkv KV heads, ALiBi when
 * alibi, else no positional bias (slopes NULL: the Llama family). mag: the inputs' magnitude (large
 * ones make a softmax without its max subtraction overflow). window > 0: a sliding window
 * (pln_attn_meta.window) on every step. The float64 check below covers BLOOM's layout (nkv 0). */
static void test_attention_ex(int32_t nh, int32_t nkv, bool alibi, int32_t D, int32_t n_head, int32_t h0, int32_t S,
                              const int32_t *ctx, int32_t block_size, float mag, int32_t window)
{
    char shape[128];
    int32_t T = 0, maxc = 0;
    for (int s = 0; s < S; s++) { T += ctx[s]; if (ctx[s] > maxc) maxc = ctx[s]; }
    char win[24] = "";
    if (window > 0) snprintf(win, sizeof win, ", window %d", window);
    if (nkv > 0)
        snprintf(shape, sizeof shape, "gqa %d/%d x %d%s, %d seqs, ctx up to %d, bs %d%s%s", nh, nkv, D,
                 alibi ? " alibi" : "", S, maxc + 1, block_size, mag > 2 ? ", large" : "", win);
    else
        snprintf(shape, sizeof shape, "heads %d x %d, %d seqs, ctx up to %d, bs %d%s%s", nh, D, S, maxc + 1, block_size,
                 mag > 2 ? ", large" : "", win);
    const int32_t cache_heads = nkv > 0 ? nkv : nh;
    const int32_t max_blocks = (maxc + 1 + block_size - 1) / block_size;
    const int32_t n_blocks = S * max_blocks + 3;
    /* scattered block table: a random permutation of the pool */
    int32_t *perm = pln_xmalloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { int j = (int)(rnd_u32() % (uint32_t)(i + 1)); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int32_t *bt = pln_xmalloc((size_t)S * max_blocks * 4);
    for (int i = 0; i < S * max_blocks; i++) bt[i] = perm[i];
    /* prefill step tokens, then the decode step */
    int32_t *ps = pln_xmalloc((size_t)T * 4), *pp = pln_xmalloc((size_t)T * 4), *ds = pln_xmalloc((size_t)S * 4),
            *dp = pln_xmalloc((size_t)S * 4);
    for (int s = 0, t = 0; s < S; s++) {
        for (int j = 0; j < ctx[s]; j++, t++) { ps[t] = s; pp[t] = j; }
        ds[s] = s; dp[s] = ctx[s];
    }
    float slopes[256];
    for (int h = 0; h < nh; h++) slopes[h] = pln_alibi_slope(h0 + h, n_head);
    const size_t W = nkv > 0 ? (size_t)(nh + 2 * nkv) * D : (size_t)nh * 3 * D;
    float *qkv_p = rnd_act((size_t)T * W, -mag, mag), *qkv_d = rnd_act((size_t)S * W, -mag, mag);
    /* the same decode step with every slope 0.1 % too large: the float64 check must reject it */
    float slopes_off[256];
    for (int h = 0; h < nh; h++) slopes_off[h] = slopes[h] * 1.001f;
    float *got_off[2] = {pln_xmalloc((size_t)S * nh * D * 4), pln_xmalloc((size_t)S * nh * D * 4)};
    size_t np = (size_t)T * nh * D, nd = (size_t)S * nh * D;
    float *got_t = pln_xmalloc(np * 4), *got_g = pln_xmalloc(np * 4), *got_f = pln_xmalloc(np * 4);
    enum { NSPLITCASE = 6 };
    static const int splitcase[NSPLITCASE] = {1, 2, 3, 7, 701, -1};
    float *got_x[NSPLITCASE], *got_fa[2] = {pln_xmalloc(nd * 4), pln_xmalloc(nd * 4)};
    for (int k = 0; k < NSPLITCASE; k++) got_x[k] = pln_xmalloc(nd * 4);
    float *want_p = pln_xmalloc(np * 4), *got_p = pln_xmalloc(np * 4), *want_d = pln_xmalloc(nd * 4), *got_d = pln_xmalloc(nd * 4);
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        size_t cache = (size_t)n_blocks * cache_heads * block_size * D * be->kv_size;
        void *kc = poisoned(be, cache), *vc = poisoned(be, cache);
        void *dbt = up(be, bt, (size_t)S * max_blocks * 4), *dsl = nkv == 0 || alibi ? up(be, slopes, (size_t)nh * 4) : NULL;
        void *dps = up(be, ps, (size_t)T * 4), *dpp = up(be, pp, (size_t)T * 4);
        void *dds = up(be, ds, (size_t)S * 4), *ddp = up(be, dp, (size_t)S * 4);
        pln_attn_meta mp = {T, S, block_size, max_blocks, maxc, dps, dpp, dbt, nkv, window};
        pln_attn_meta md = {S, S, block_size, max_blocks, maxc + 1, dds, ddp, dbt, nkv, window};
        void *qp = up_act(be, qkv_p, (size_t)T * W), *qd = up_act(be, qkv_d, (size_t)S * W);
        void *op = poisoned(be, np * be->act_size), *od = poisoned(be, nd * be->act_size);
        CHECK(be->kv_append(be, qp, kc, vc, &mp, nh, D) == 0, "kv_append on %s: %s", be->name, pln_error());
        CHECK(be->attention(be, op, qp, kc, vc, &mp, dsl, nh, D) == 0, "attention (prefill) on %s: %s", be->name, pln_error());
        if (b == 1 && !g_self) {   /* the query-tiled prefill kernel on the same inputs */
            void *ot = poisoned(be, np * be->act_size);
            pln_cuda_set_prefill_tiled(be, 1);
            CHECK(be->attention(be, ot, qp, kc, vc, &mp, dsl, nh, D) == 0, "attention (tiled prefill): %s", pln_error());
            pln_cuda_set_prefill_tiled(be, 0);
            down_act(be, got_t, ot, np);
            /* the split-key kernel in token groups (partial states bounded to a few tokens' worth) */
            long long old = pln_cuda_set_attn_scratch(be, 3 * 4096);
            CHECK(be->attention(be, ot, qp, kc, vc, &mp, dsl, nh, D) == 0, "attention (grouped prefill): %s", pln_error());
            pln_cuda_set_attn_scratch(be, old);
            down_act(be, got_g, ot, np);
            be->free(be, ot);
        }
        /* the fused kv_append + attention of decode steps, on copies of the cache before the
         * decode step's append (auto splits and 7): outputs against the CPU, and the caches it
         * leaves bit for bit equal to kv_append's */
        void *fkc[2] = {NULL, NULL}, *fvc[2] = {NULL, NULL};
        if (b == 1 && !g_self && be->append_attention) {
            uint8_t *hk = pln_xmalloc(cache), *hv = pln_xmalloc(cache);
            be->download(be, hk, kc, cache);
            be->download(be, hv, vc, cache);
            for (int f = 0; f < 2; f++) {
                fkc[f] = up(be, hk, cache);
                fvc[f] = up(be, hv, cache);
                void *of = poisoned(be, nd * be->act_size);
                int old = pln_cuda_set_attn_splits(be, f ? 7 : 0);
                CHECK(be->append_attention(be, of, qd, fkc[f], fvc[f], &md, dsl, nh, D) == 0,
                      "append_attention (decode, splits %d): %s", f ? 7 : 0, pln_error());
                pln_cuda_set_attn_splits(be, old);
                down_act(be, got_fa[f], of, nd);
                be->free(be, of);
            }
            free(hk);
            free(hv);
        }
        CHECK(be->kv_append(be, qd, kc, vc, &md, nh, D) == 0, "kv_append on %s: %s", be->name, pln_error());
        CHECK(be->attention(be, od, qd, kc, vc, &md, dsl, nh, D) == 0, "attention (decode) on %s: %s", be->name, pln_error());
        if (nkv == 0) {
            void *dso = up(be, slopes_off, (size_t)nh * 4), *oo = poisoned(be, nd * be->act_size);
            CHECK(be->attention(be, oo, qd, kc, vc, &md, dso, nh, D) == 0, "attention (decode, slopes off) on %s: %s",
                  be->name, pln_error());
            down_act(be, got_off[b], oo, nd);
            be->free(be, dso);
            be->free(be, oo);
        }
        if (fkc[0]) {
            uint8_t *a = pln_xmalloc(cache), *bb = pln_xmalloc(cache);
            for (int f = 0; f < 2; f++) {
                int same = 1;
                be->download(be, a, kc, cache);
                be->download(be, bb, fkc[f], cache);
                same &= memcmp(a, bb, cache) == 0;
                be->download(be, a, vc, cache);
                be->download(be, bb, fvc[f], cache);
                same &= memcmp(a, bb, cache) == 0;
                printf("%-16s %-44s %s\n", "kv fused append", shape, same ? "caches identical  OK" : "caches DIFFER  NOT OK");
                CHECK(same, "append_attention (splits %d): the K/V caches differ from kv_append's (%s)", f ? 7 : 0, shape);
                be->free(be, fkc[f]);
                be->free(be, fvc[f]);
            }
            free(a);
            free(bb);
        }
        if (b == 1 && !g_self) {
            /* the decode step with the flash-decoding kernel's split count forced (1, 2, 3, 7 and
             * more splits than keys: empty splits), with the split-key kernel (-1), and the prefill
             * step on the flash-decoding kernel (every token its own causal bound) */
            void *ox = poisoned(be, (nd > np ? nd : np) * be->act_size);
            for (int k = 0; k < NSPLITCASE; k++) {
                int old = pln_cuda_set_attn_splits(be, splitcase[k]);
                CHECK(be->attention(be, ox, qd, kc, vc, &md, dsl, nh, D) == 0, "attention (decode, splits %d): %s",
                      splitcase[k], pln_error());
                pln_cuda_set_attn_splits(be, old);
                down_act(be, got_x[k], ox, nd);
            }
            int old = pln_cuda_set_attn_splits(be, 3);
            CHECK(be->attention(be, ox, qp, kc, vc, &mp, dsl, nh, D) == 0, "attention (prefill, flash-decoding): %s",
                  pln_error());
            pln_cuda_set_attn_splits(be, old);
            down_act(be, got_f, ox, np);
            be->free(be, ox);
        }
        down_act(be, b ? got_p : want_p, op, np);
        down_act(be, b ? got_d : want_d, od, nd);
        be->free(be, kc); be->free(be, vc); be->free(be, dbt); if (dsl) be->free(be, dsl);
        be->free(be, dps); be->free(be, dpp);
        be->free(be, dds); be->free(be, ddp); be->free(be, qp); be->free(be, qd); be->free(be, op); be->free(be, od);
    }
    report("attn prefill", shape, got_p, want_p, np, 5e-3);
    report("attn decode", shape, got_d, want_d, nd, 5e-3);
    if (!g_self) report("attn prefill/tiled", shape, got_t, want_p, np, 5e-3);
    if (!g_self) report("attn prefill/grouped", shape, got_g, want_p, np, 5e-3);
    if (!g_self) report("attn prefill/flash-decoding", shape, got_f, want_p, np, 5e-3);
    for (int k = 0; k < NSPLITCASE && !g_self; k++) {
        char what[64];
        snprintf(what, sizeof what, splitcase[k] < 0 ? "attn decode/split-key" : "attn decode/splits=%d", splitcase[k]);
        report(what, shape, got_x[k], want_d, nd, 5e-3);
    }
    if (!g_self) report("attn decode/fused append", shape, got_fa[0], want_d, nd, 5e-3);
    if (!g_self) report("attn decode/fused splits=7", shape, got_fa[1], want_d, nd, 5e-3);

    /* every path of both backends against float64 (BLOOM's layout) */
    if (nkv == 0) {
        int32_t *off = pln_xmalloc((size_t)S * 4);
        for (int s = 0, o = 0; s < S; s++) { off[s] = o; o += ctx[s]; }
        const int32_t kstride = maxc + 1;
        const float **krow = pln_xmalloc((size_t)S * kstride * sizeof *krow);
        const float **qp_rows = pln_xmalloc((size_t)T * sizeof *qp_rows), **qd_rows = pln_xmalloc((size_t)S * sizeof *qd_rows);
        for (int s = 0; s < S; s++)
            for (int j = 0; j <= ctx[s]; j++)
                krow[(size_t)s * kstride + j] = j < ctx[s] ? qkv_p + (size_t)(off[s] + j) * W : qkv_d + (size_t)s * W;
        for (int t = 0; t < T; t++) qp_rows[t] = qkv_p + (size_t)t * W;
        for (int s = 0; s < S; s++) qd_rows[s] = qkv_d + (size_t)s * W;
        double *rp = pln_xmalloc(np * 8), *tp16 = pln_xmalloc(np * 8), *tp32 = pln_xmalloc(np * 8);
        double *rd = pln_xmalloc(nd * 8), *td16 = pln_xmalloc(nd * 8), *td32 = pln_xmalloc(nd * 8);
        const double u16 = ldexp(1.0, -11), u32 = ldexp(1.0, -24);
        const double ucpu = g_cpu->act_dtype == PLN_DTYPE_F32 ? u32 : u16, ugpu = g_gpu->act_dtype == PLN_DTYPE_F32 ? u32 : u16;
        attn_ref64(T, qp_rows, ps, pp, krow, kstride, nh, D, n_head, h0, window, ucpu, rp, tp32);
        attn_ref64(T, qp_rows, ps, pp, krow, kstride, nh, D, n_head, h0, window, ugpu, rp, tp16);
        attn_ref64(S, qd_rows, ds, dp, krow, kstride, nh, D, n_head, h0, window, ucpu, rd, td32);
        attn_ref64(S, qd_rows, ds, dp, krow, kstride, nh, D, n_head, h0, window, ugpu, rd, td16);
        typedef struct { const char *op; const float *got; bool prefill, gpu; } f64case;
        f64case cases[16];
        char splitname[NSPLITCASE][32];
        int nc = 0;
        cases[nc++] = (f64case){"f64 prefill cpu", want_p, true, false};
        cases[nc++] = (f64case){"f64 decode cpu", want_d, false, false};
        cases[nc++] = (f64case){"f64 prefill", got_p, true, true};
        cases[nc++] = (f64case){"f64 decode", got_d, false, true};
        if (!g_self) {
            cases[nc++] = (f64case){"f64 pf/tiled", got_t, true, true};
            cases[nc++] = (f64case){"f64 pf/grouped", got_g, true, true};
            cases[nc++] = (f64case){"f64 pf/flash-dec", got_f, true, true};
            cases[nc++] = (f64case){"f64 dec/fused", got_fa[0], false, true};
            cases[nc++] = (f64case){"f64 dec/fused 7", got_fa[1], false, true};
            for (int k = 0; k < NSPLITCASE; k++) {
                snprintf(splitname[k], sizeof splitname[k], splitcase[k] < 0 ? "f64 dec/split-key" : "f64 dec/splits=%d",
                         splitcase[k]);
                cases[nc++] = (f64case){splitname[k], got_x[k], false, true};
            }
        }
        for (int c = 0; c < nc; c++) {
            const double *tol = cases[c].prefill ? (cases[c].gpu ? tp16 : tp32) : (cases[c].gpu ? td16 : td32);
            size_t bad = report64(cases[c].op, shape, cases[c].got, cases[c].prefill ? rp : rd, tol,
                                  cases[c].prefill ? np : nd, false);
            CHECK(bad == 0, "%s %s: %zu elements beyond their float64 bound", cases[c].op, shape, bad);
        }
        /* the slopes 0.1 % off: beyond the bound on both backends (not at the large magnitudes,
         * where one key takes all the weight and the slopes cannot matter) */
        for (int b = 0; b < 2 && mag <= 2; b++) {
            size_t bad = report64("", shape, got_off[b], rd, b ? td16 : td32, nd, true);
            printf("%-16s %-44s %zu of %zu elements beyond the bound  %s\n", b ? "f64 slope+0.1%" : "f64 slope+0.1% cpu",
                   shape, bad, nd, bad ? "OK (rejected)" : "NOT OK (passed)");
            CHECK(bad > 0, "%s: decode with every slope 0.1 %% off passes the float64 check on %s", shape, bes[b]->name);
        }
        free(off); free(krow); free(qp_rows); free(qd_rows);
        free(rp); free(tp16); free(tp32); free(rd); free(td16); free(td32);
    }
    free(got_off[0]);
    free(got_off[1]);
    for (int k = 0; k < NSPLITCASE; k++) free(got_x[k]);
    free(got_fa[0]);
    free(got_fa[1]);
    free(got_f);
    free(got_t);
    free(got_g);
    free(perm); free(bt); free(ps); free(pp); free(ds); free(dp); free(qkv_p); free(qkv_d);
    free(want_p); free(got_p); free(want_d); free(got_d);
}

static void test_attention(int32_t nh, int32_t D, int32_t n_head, int32_t h0, int32_t S, const int32_t *ctx,
                           int32_t block_size, float mag)
{
    test_attention_ex(nh, 0, true, D, n_head, h0, S, ctx, block_size, mag, 0);
}

/* ---- the Llama family: RMSNorm, rotary, SwiGLU ----------------------------------------------
 * fp16 in and out here, fp32 on the CPU: the CUDA kernels round where transformers does in fp16
 * (the normalized row, the rotary products and cos/sin, SiLU), so they sit within a few fp16 ulps
 * of the CPU's fp32 results: tolerances of fp16's 2^-11 relative step, a little above. */
static void test_rmsnorm(int32_t T, int64_t H)
{
    char shape[96];
    snprintf(shape, sizeof shape, "T %d H %lld", T, (long long)H);
    size_t n = (size_t)T * H;
    float *x = rnd_act(n, -4, 6), *y = rnd_act(n, -2, 2);
    uint16_t *gm = rnd_f16((size_t)H, 0.5f, 1.5f), *bias = rnd_f16((size_t)H, -1, 1);
    float *want[4], *got[4];
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        float **res = b ? got : want;
        for (int i = 0; i < 4; i++) res[i] = pln_xmalloc(n * 4);
        void *dx = up_act(be, x, n), *dy = up_act(be, y, n);
        void *g = up(be, gm, (size_t)H * 2), *bi = up(be, bias, (size_t)H * 2);
        void *o = poisoned(be, n * be->act_size);
        CHECK(be->rmsnorm(be, o, dx, g, T, H, 1e-5f) == 0, "rmsnorm: %s", pln_error());
        down_act(be, res[0], o, n);
        /* in place: out == in */
        void *dx2 = up_act(be, x, n);
        CHECK(be->rmsnorm(be, dx2, dx2, g, T, H, 1e-5f) == 0, "rmsnorm in place: %s", pln_error());
        down_act(be, res[3], dx2, n);
        poison(be, o, n * be->act_size);
        CHECK(be->residual_rmsnorm(be, dx, dy, bi, g, o, T, H, 1e-6f) == 0, "residual_rmsnorm: %s", pln_error());
        down_act(be, res[1], o, n);
        down_act(be, res[2], dx, n);
        be->free(be, dx); be->free(be, dx2); be->free(be, dy); be->free(be, g); be->free(be, bi); be->free(be, o);
    }
    report("rmsnorm", shape, got[0], want[0], n, 2e-3);
    report_elems("rmsnorm", shape, got[0], want[0], n, H, 8e-3);
    report("rmsnorm in place", shape, got[3], want[0], n, 2e-3);
    report("residual+rms", shape, got[1], want[1], n, 2e-3);
    report_elems("residual+rms", shape, got[1], want[1], n, H, 8e-3);
    report("residual sum", shape, got[2], want[2], n, 1e-3);
    for (int i = 0; i < 4; i++) { free(want[i]); free(got[i]); }
    free(x); free(y); free(gm); free(bias);
}

/* rope on the q and k heads of a grouped qkv (v must come back untouched), positions up to
 * 131071 out of order; inv_freq as transformers builds it for theta (llama3 scaling: the low
 * frequencies / 8, a smooth blend between). */
static void test_rope(int32_t T, int32_t nh, int32_t nkv, int32_t D, double theta, bool llama3)
{
    char shape[96];
    snprintf(shape, sizeof shape, "T %d gqa %d/%d x %d theta %g%s", T, nh, nkv, D, theta, llama3 ? " llama3" : "");
    const size_t W = (size_t)(nh + 2 * nkv) * D, n = (size_t)T * W;
    float *x = rnd_act(n, -2, 2), inv[128];
    for (int i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / D);
        if (llama3) {
            double wl = 2 * M_PI / f, lo = 8192.0 / 1, hi = 8192.0 / 4;
            if (wl > lo) f /= 8;
            else if (wl >= hi) { double sm = (8192.0 / wl - 1) / 3; f = (1 - sm) * f / 8 + sm * f; }
        }
        inv[i] = (float)f;
    }
    static const int32_t posv[] = {0, 1, 5, 31, 100, 2047, 8191, 131071};
    int32_t *pos = pln_xmalloc((size_t)T * 4), *seq = pln_xmalloc((size_t)T * 4), bt[1] = {0};
    for (int t = 0; t < T; t++) { pos[t] = posv[(t * 3) % 8]; seq[t] = 0; }
    float *res[2];
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        res[b] = pln_xmalloc(n * 4);
        void *dq = up_act(be, x, n), *dp = up(be, pos, (size_t)T * 4), *dsq = up(be, seq, (size_t)T * 4);
        void *dbt = up(be, bt, 4), *di = up(be, inv, (size_t)D / 2 * 4);
        pln_attn_meta m = {T, 1, 1 << 20, 1, 0, dsq, dp, dbt, nkv, 0};
        CHECK(be->rope(be, dq, &m, di, nh, D) == 0, "rope on %s: %s", be->name, pln_error());
        down_act(be, res[b], dq, n);
        be->free(be, dq); be->free(be, dp); be->free(be, dsq); be->free(be, dbt); be->free(be, di);
    }
    report("rope", shape, res[1], res[0], n, 2e-3);
    report_elems("rope", shape, res[1], res[0], n, (int64_t)W, 8e-3);
    int vbad = 0;   /* v rows exactly as they went in */
    for (int t = 0; t < T; t++)
        for (size_t i = (size_t)(nh + nkv) * D; i < W; i++) vbad += res[1][t * W + i] != x[t * W + i];
    CHECK(vbad == 0, "rope %s: %d v elements changed", shape, vbad);
    free(x); free(pos); free(seq); free(res[0]); free(res[1]);
}

static void test_swiglu(int32_t T, int64_t I)
{
    char shape[96];
    snprintf(shape, sizeof shape, "T %d I %lld", T, (long long)I);
    float *x = rnd_act((size_t)T * 2 * I, -8, 8), *res[2];
    pln_backend *bes[2] = {g_cpu, g_gpu};
    for (int b = 0; b < 2; b++) {
        pln_backend *be = bes[b];
        res[b] = pln_xmalloc((size_t)T * I * 4);
        void *di = up_act(be, x, (size_t)T * 2 * I), *o = poisoned(be, (size_t)T * I * be->act_size);
        CHECK(be->swiglu(be, o, di, T, I) == 0, "swiglu on %s: %s", be->name, pln_error());
        down_act(be, res[b], o, (size_t)T * I);
        be->free(be, di); be->free(be, o);
    }
    report("swiglu", shape, res[1], res[0], (size_t)T * I, 2e-3);
    report_elems("swiglu", shape, res[1], res[0], (size_t)T * I, I, 8e-3);
    free(x); free(res[0]); free(res[1]);
}

/* ---- load_file: an unaligned range of a file, compared byte for byte ----------------------- */
/* on_bytes must see the range once, in order: a streaming XXH3 of what it saw equals the XXH3 of
 * the range. */
typedef struct { XXH3_state_t *st; uint64_t next; bool in_order; } seen_t;
static void seen_bytes(void *ctx, uint64_t at, const void *p, size_t n)
{
    seen_t *s = (seen_t *)ctx;
    if (at != s->next) s->in_order = false;
    XXH3_64bits_update(s->st, p, n);
    s->next = at + n;
}

static void test_load_file(size_t size, uint64_t off, uint64_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/load.bin", test_tmpdir());
    uint8_t *data = pln_xmalloc(size);
    for (size_t i = 0; i < size; i++) data[i] = (uint8_t)(rnd_u32() >> 3);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, size, f) == size, "write %s", path);
    if (f) fclose(f);
    void *d = poisoned(g_gpu, n);
    uint8_t *back = pln_xmalloc(n + 1);
    /* the automatic choice (cached: buffered), then O_DIRECT forced (aligned-down head, rounded-up
     * tail; file systems without it fall back to buffered reads) and buffered forced */
    const char *modes[3] = {NULL, "1", "0"}, *names[3] = {"auto", "O_DIRECT forced", "buffered forced"};
    for (int k = 0; k < 3; k++) {
        if (modes[k]) setenv("PLN_LOAD_DIRECT", modes[k], 1); else unsetenv("PLN_LOAD_DIRECT");
        poison(g_gpu, d, n);
        double rate = 0;
        seen_t seen = {XXH3_createState(), 0, true};
        XXH3_64bits_reset(seen.st);
        int rc = g_gpu->load_file(g_gpu, d, path, off, n, &rate, seen_bytes, &seen);
        CHECK(rc == 0, "load_file (%s): %s", names[k], pln_error());
        bool hashed = seen.in_order && seen.next == n && XXH3_64bits_digest(seen.st) == XXH3_64bits(data + off, n);
        printf("%-16s %-44s %s\n", "load_file", k ? names[k] : "checksum while loading (on_bytes)", hashed ? "OK" : "NOT OK");
        CHECK(hashed, "load_file (%s): on_bytes saw %llu bytes (in order: %d), or their XXH3 differs", names[k],
              (unsigned long long)seen.next, (int)seen.in_order);
        XXH3_freeState(seen.st);
        memset(back, 0, n);
        g_gpu->download(g_gpu, back, d, n);
        bool same = memcmp(back, data + off, n) == 0;
        printf("%-16s %-44s %s  (%.2f GB/s, page cache warm)\n", "load_file", names[k], same ? "OK" : "NOT OK", rate / 1e9);
        CHECK(same, "load_file (%s): bytes differ (size %zu off %llu n %llu)", names[k], size, (unsigned long long)off,
              (unsigned long long)n);
        /* past the end of the file: a clear error, no crash */
        CHECK(g_gpu->load_file(g_gpu, d, path, size - 10, 100, &rate, NULL, NULL) != 0, "load_file (%s) past the end must fail",
              names[k]);
        CHECK(strstr(pln_error(), "load.bin") != NULL, "error names the file: %s", pln_error());
    }
    unsetenv("PLN_LOAD_DIRECT");
    g_gpu->free(g_gpu, d);
    free(back); free(data);
    unlink(path);
}

/* ---- CUDA graph: a captured layernorm + linear replays to the same bytes -------------------- */
static void test_graph(void)
{
    const int32_t T = 2; const int64_t H = 256, N = 512;
    float *x = rnd_act((size_t)T * H, -1, 1);
    uint16_t *gm = rnd_f16((size_t)H, 0.5f, 1.5f), *bt = rnd_f16((size_t)H, -0.5f, 0.5f);
    host_weight hw = make_weight(PLN_DTYPE_F16, N, H, 0);
    void *wb[2];
    pln_weight w = up_weight(g_gpu, &hw, wb);
    void *dx = up_act(g_gpu, x, (size_t)T * H), *ln = dalloc(g_gpu, (size_t)T * H * 2), *o = dalloc(g_gpu, (size_t)T * N * 2);
    void *g = up(g_gpu, gm, (size_t)H * 2), *b = up(g_gpu, bt, (size_t)H * 2);
    float *direct = pln_xmalloc((size_t)T * N * 4), *replay = pln_xmalloc((size_t)T * N * 4);
    g_gpu->layernorm(g_gpu, ln, dx, g, b, T, H, 1e-5f);
    g_gpu->linear(g_gpu, o, ln, &w, NULL, T, true);
    down_act(g_gpu, direct, o, (size_t)T * N);
    poison(g_gpu, o, (size_t)T * N * 2);
    pln_cuda_graph *gr = NULL;
    int rc = pln_cuda_graph_begin(g_gpu);
    rc |= g_gpu->layernorm(g_gpu, ln, dx, g, b, T, H, 1e-5f);
    rc |= g_gpu->linear(g_gpu, o, ln, &w, NULL, T, true);
    rc |= pln_cuda_graph_end(g_gpu, &gr);
    CHECK(rc == 0, "graph capture: %s", pln_error());
    for (int i = 0; i < 3 && rc == 0; i++) rc |= pln_cuda_graph_launch(g_gpu, gr);
    down_act(g_gpu, replay, o, (size_t)T * N);
    bool same = memcmp(direct, replay, (size_t)T * N * 4) == 0;
    printf("%-16s %-44s %s\n", "cuda graph", "layernorm + linear replayed 3x", same && rc == 0 ? "OK" : "NOT OK");
    CHECK(same, "graph replay differs from direct launches");
    pln_cuda_graph_destroy(gr);
    g_gpu->free(g_gpu, wb[0]); g_gpu->free(g_gpu, dx); g_gpu->free(g_gpu, ln); g_gpu->free(g_gpu, o);
    g_gpu->free(g_gpu, g); g_gpu->free(g_gpu, b);
    free(x); free(gm); free(bt); free_host_weight(&hw); free(direct); free(replay);
}

/* ---- errors: bad arguments give messages, not crashes -------------------------------------- */
static void test_errors(void)
{
    pln_weight w = {PLN_DTYPE_I8, 16, 64, NULL, NULL, 64};
    void *o = dalloc(g_gpu, 1024), *x = dalloc(g_gpu, 1024);
    CHECK(g_gpu->linear(g_gpu, o, x, &w, NULL, 1, false) != 0, "int8 without scales must fail");
    CHECK(strstr(pln_error(), "scale") != NULL, "message mentions scales: %s", pln_error());
    uint16_t *s4 = dalloc(g_gpu, 64);
    pln_weight w4 = {PLN_DTYPE_U8, 16, 64, x, s4, 16};
    CHECK(g_gpu->linear(g_gpu, o, x, &w4, NULL, 1, false) != 0 && strstr(pln_error(), "multiple of 32"),
          "int4 with groups of 16 must fail naming the group rule: %s", pln_error());
    g_gpu->free(g_gpu, s4);
    pln_weight wb = {PLN_DTYPE_BF16, 16, 64, x, NULL, 0};
    CHECK(g_gpu->linear(g_gpu, o, x, &wb, NULL, 1, false) != 0, "bf16 weights must fail");
    /* the grouped-query contract: rotary needs the grouped layout, and the KV heads must divide
     * the q heads (checked before any launch: the metadata pointers are never read) */
    pln_attn_meta mg = {1, 1, 16, 1, 1, (const int32_t *)x, (const int32_t *)x, (const int32_t *)x, 0, 0};
    CHECK(g_gpu->rope(g_gpu, o, &mg, (const float *)x, 4, 8) != 0 && strstr(pln_error(), "grouped"),
          "rope on the BLOOM layout must fail naming the grouped layout: %s", pln_error());
    mg.n_kv_head = 3;
    CHECK(g_gpu->attention(g_gpu, o, x, x, x, &mg, NULL, 4, 8) != 0 && strstr(pln_error(), "KV heads"),
          "3 KV heads for 4 q heads must fail: %s", pln_error());
    CHECK(g_gpu->kv_append(g_gpu, x, o, o, &mg, 4, 8) != 0 && strstr(pln_error(), "KV heads"),
          "kv_append with 3 KV heads for 4 q heads must fail: %s", pln_error());
    CHECK(g_gpu->topk(g_gpu, (const float *)o, 1, 8, 0, 9, NULL, NULL, NULL, NULL) != 0, "k > vn must fail");
    void *huge = g_gpu->alloc(g_gpu, (size_t)1 << 50);
    CHECK(huge == NULL && strstr(pln_error(), "HINT") != NULL, "a 1 PiB alloc fails with a hint: %s", pln_error());
    g_gpu->free(g_gpu, o); g_gpu->free(g_gpu, x);
}

int main(int argc, char **argv)
{
    test_begin("test_cuda_ops");
    bool probe = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe")) probe = true;
        else if (!strcmp(argv[i], "--quick")) g_quick = true;
        else if (!strcmp(argv[i], "--cpu-as-gpu")) g_self = true;
    }
    const char *dev = getenv("PLN_CUDA_DEVICE");
    g_gpu = g_self ? pln_backend_cpu_create() : pln_backend_cuda_create(dev ? atoi(dev) : 0);
    if (!g_gpu) {
        printf("SKIP: no GPU (%s)\n", pln_error());
        return 77;
    }
    if (probe) { g_gpu->destroy(g_gpu); return 0; }
    g_cpu = pln_backend_cpu_create();
    if (!g_cpu) { fprintf(stderr, "cpu backend: %s\n", pln_error()); return 2; }
#ifdef PLN_CUDA_EMU
    /* The CPU harness runs every thread as a fiber: the BLOOM-size shapes would take hours. */
    g_quick = true;
    printf("%s\n", pln_emu_not_exercised());
#endif

    /* tiny and odd shapes (the fixtures: hidden 64/96, 4/6 heads of 16, vocab slice 1003) */
    test_embed(1003, 64, 0, 7);
    test_embed(502, 96, 501, 5);
    test_embed(37, 13, 3, 4);                         /* H not a multiple of 8: element path */
    test_layernorm(3, 64);
    test_layernorm(5, 13);
    test_layernorm(2, 16360);                         /* register path, 2 vectors per thread (gamma, beta prefetched) */
    test_layernorm(2, 24000);                         /* register path, 4 vectors per thread */
    test_layernorm(2, 40000);                         /* too long for the register path */
    /* several blocks per row (two launches): T of decode and prefill, hidden sizes from one
     * partial block to BLOOM-176B's 14 blocks, odd ones on the one-block element kernel */
    if (!g_self) {
        g_ln_split = 1;
        pln_cuda_set_ln_split(g_gpu, 1);
        const int32_t Tl[] = {1, 2, 7, 64};
        const int64_t Hl[] = {64, 1032, 14336, 13, 1001};
        for (size_t ti = 0; ti < sizeof Tl / sizeof Tl[0]; ti++)
            for (size_t hi = 0; hi < sizeof Hl / sizeof Hl[0]; hi++)
                test_layernorm(Tl[ti], Hl[hi]);
        pln_cuda_set_ln_split(g_gpu, 0);
        g_ln_split = 0;
        test_layernorm(1, 14336);                     /* the one-block register kernel at batch 1 */
        test_layernorm(7, 1001);
    }
    /* T: 1 and odd 7 (8-token GEMV), 9 and 16 (16-token GEMV), 17 (fp16: the first GEMM; int8 and
     * int4: the 32-token GEMV), 40 (a partial 64-token tile of the int8 GEMM), 130 (three tiles,
     * the last partial) */
    const int32_t Tsmall[] = {1, 7, 9, 16, 17, 40, 130};
    for (size_t ti = 0; ti < sizeof Tsmall / sizeof Tsmall[0]; ti++) {
        const int32_t T = Tsmall[ti];
        test_linear(PLN_DTYPE_F16, 192, 64, 0, T, true, false);
        test_linear(PLN_DTYPE_F16, 256, 64, 0, T, true, true);
        test_linear(PLN_DTYPE_F16, 1003, 96, 0, T, false, false);
        test_linear(PLN_DTYPE_I8, 192, 64, 0, T, true, false);
        test_linear(PLN_DTYPE_I8, 200, 256, 32, T, true, true);
        test_linear(PLN_DTYPE_I8, 96, 384, 0, T, true, false);
        test_linear(PLN_DTYPE_I8, 50, 72, 8, T, false, false);   /* odd group: plain kernel */
    }
    /* int4: groups of 32/64/128 on the GEMV (T <= 16: 8- and 16-token tiles), the GEMM (several
     * and partial 64-token tiles) and the plain kernel; 256 and 384 columns are 2 and 3 of the
     * 128-column steps (a step holding several groups when G = 32, part of one when G = 128);
     * 96 columns take the plain kernel on every path; an unaligned weight does too */
    for (size_t ti = 0; ti < sizeof Tsmall / sizeof Tsmall[0]; ti++) {
        const int32_t T = Tsmall[ti];
        test_linear(PLN_DTYPE_U8, 192, 256, 32, T, true, false);
        test_linear(PLN_DTYPE_U8, 200, 384, 128, T, true, true);
        test_linear(PLN_DTYPE_U8, 70, 256, 64, T, false, false);
        test_linear(PLN_DTYPE_U8, 40, 96, 32, T, true, false);
    }
    /* Batches 2..200 on the quantized kernels: the GEMV's 8/16/32-token tiles (2, 8, 17, 32; 17 and
     * 32 are AUTO's GEMV too), the cp.async GEMM's 32- and 64-token tiles above (33, 64, 65, 128,
     * 200: partial, whole and several tiles); odd row counts (a partial 64-row block and 16-row
     * tile); 5 k-steps, more than the 3 pipeline stages, so every stage buffer is reused; int8 per
     * row and grouped, int4 g32 and g128; and 96 columns, which take the plain kernel. */
    const int32_t Tbatch[] = {2, 8, 17, 32, 33, 64, 65, 128, 200};
    for (size_t ti = 0; ti < sizeof Tbatch / sizeof Tbatch[0]; ti++) {
        const int32_t T = Tbatch[ti];
        test_linear(PLN_DTYPE_I8, 67, 320, 0, T, true, false);
        test_linear(PLN_DTYPE_I8, 131, 320, 64, T, true, true);
        test_linear(PLN_DTYPE_U8, 67, 640, 32, T, true, false);
        test_linear(PLN_DTYPE_U8, 131, 640, 128, T, false, true);
        test_linear(PLN_DTYPE_I8, 35, 96, 0, T, false, false);
    }
    test_linear_ex(PLN_DTYPE_U8, 64, 256, 128, 3, true, false, 0, 0, 8);
    test_linear_ex(PLN_DTYPE_U8, 64, 256, 32, 20, true, false, 0, 4, 0);
    test_linear_off(PLN_DTYPE_F16, 256, 64, 0, 33, true, true, 1);   /* cuBLASLt with a misaligned bias */
    test_linear_off(PLN_DTYPE_F16, 256, 64, 0, 3, true, false, 3);
    /* groups that straddle the int8 k-step of 64 columns (48) and the smallest group (16) */
    /* long rows: the GEMV's pipeline runs several double-buffered rounds and ends part-way
     * through a batch (65 and 33 steps of 32 / 64 columns against rounds of 2 x 16 steps) */
    test_linear(PLN_DTYPE_F16, 40, 2080, 0, 1, true, false);
    test_linear(PLN_DTYPE_F16, 40, 2080, 0, 9, false, true);
    test_linear(PLN_DTYPE_I8, 40, 4160, 0, 1, true, false);
    test_linear(PLN_DTYPE_I8, 24, 2112, 64, 9, true, true);
    test_linear(PLN_DTYPE_I8, 70, 192, 48, 3, true, false);
    test_linear(PLN_DTYPE_I8, 70, 192, 48, 16, false, true);
    test_linear(PLN_DTYPE_I8, 70, 192, 48, 70, true, true);
    test_linear(PLN_DTYPE_I8, 33, 128, 16, 5, true, false);
    test_linear(PLN_DTYPE_I8, 33, 128, 16, 20, true, false);
    /* columns the fast kernels cannot step over: the plain kernel on every path */
    test_linear(PLN_DTYPE_I8, 40, 96, 0, 2, true, false);
    test_linear(PLN_DTYPE_I8, 40, 96, 0, 20, true, true);
    test_linear(PLN_DTYPE_F16, 24, 40, 0, 2, true, false);
    test_linear(PLN_DTYPE_F16, 24, 40, 0, 20, false, true);
    /* input or weight not 16-byte aligned: refused by the fast kernels, done by the plain one */
    test_linear_ex(PLN_DTYPE_F16, 64, 64, 0, 3, true, false, 0, 4, 0);
    test_linear_ex(PLN_DTYPE_F16, 64, 64, 0, 20, true, true, 0, 4, 0);
    test_linear_ex(PLN_DTYPE_I8, 64, 128, 0, 3, true, false, 0, 4, 0);
    test_linear_ex(PLN_DTYPE_F16, 64, 64, 0, 3, false, false, 0, 0, 2);
    test_linear_ex(PLN_DTYPE_F16, 64, 64, 0, 20, true, false, 0, 0, 2);
    test_linear_ex(PLN_DTYPE_I8, 64, 128, 32, 20, true, false, 0, 0, 8);
    test_lt_plans();
    test_logits(PLN_DTYPE_F16, 1003, 64, 0, 3, 1000);
    test_logits(PLN_DTYPE_F16, 1003, 64, 0, 20, 1000);
    test_logits(PLN_DTYPE_I8, 502, 96, 0, 2, 500);
    test_logits(PLN_DTYPE_I8, 502, 128, 0, 2, 500);
    test_logits(PLN_DTYPE_I8, 502, 128, 0, 70, 497);
    test_logits(PLN_DTYPE_I8, 200, 128, 32, 5, 190);
    test_logits(PLN_DTYPE_I8, 200, 128, 32, 20, 200);
    int32_t ctx_small[3] = {1, 7, 30};
    test_attention(4, 16, 4, 0, 3, ctx_small, 16, 2);
    test_attention(3, 16, 6, 3, 3, ctx_small, 4, 2);
    int32_t ctx_long[2] = {600, 257};                 /* several key splits */
    test_attention(2, 64, 16, 5, 2, ctx_long, 16, 2);
    int32_t ctx_80[3] = {5, 140, 260};              /* bloom-3b's head_dim 80: not a power of two */
    test_attention(2, 80, 32, 7, 3, ctx_80, 16, 2);
    int32_t ctx_256[2] = {128, 200};                /* the largest head_dim; a split boundary at 128 */
    test_attention(1, 256, 8, 0, 2, ctx_256, 16, 2);
    /* large-magnitude scores (|q·k|/sqrt(d) in the hundreds): exp overflows without the max
     * subtracted first, on every path */
    test_attention(4, 16, 4, 0, 3, ctx_small, 16, 40);
    int32_t ctx_mid[2] = {90, 33};
    test_attention(2, 64, 8, 2, 2, ctx_mid, 16, 40);
    /* the Llama family: grouped-query attention without positional bias, head_dim 64 and 128,
     * groups of 1 to 8 q heads per KV head (a run of 8 per block), 16 (two runs) and 7 (Qwen2's:
     * one run of 8 with a query idle), one ALiBi case in the grouped layout, long contexts on the
     * split-K path (the decode splits forced above included) */
    int32_t ctx_gqa[3] = {3, 40, 130};
    test_attention_ex(8, 2, false, 64, 8, 0, 3, ctx_gqa, 16, 2, 0);
    test_attention_ex(8, 1, false, 128, 8, 0, 3, ctx_gqa, 16, 2, 0);
    test_attention_ex(4, 4, false, 128, 4, 0, 3, ctx_gqa, 8, 2, 0);
    test_attention_ex(7, 1, false, 64, 7, 0, 3, ctx_gqa, 16, 2, 0);
    test_attention_ex(16, 1, false, 64, 16, 0, 3, ctx_gqa, 16, 2, 0);
    test_attention_ex(6, 3, true, 64, 6, 0, 3, ctx_gqa, 16, 2, 0);
    test_attention_ex(4, 2, false, 32, 4, 0, 3, ctx_gqa, 16, 2, 0);   /* head_dim 32: one q head per block */
    int32_t ctx_gqa_long[2] = {300, 520};
    test_attention_ex(2, 1, false, 128, 2, 0, 2, ctx_gqa_long, 16, 2, 0);
    /* Mistral's sliding window on every path (the float64 check too, in BLOOM's layout): shorter
     * than a block, the token alone, across the decode splits, inside the tiled prefill's chunks */
    test_attention_ex(8, 2, false, 64, 8, 0, 3, ctx_gqa, 16, 2, 8);
    test_attention_ex(4, 2, false, 128, 4, 0, 3, ctx_gqa, 16, 2, 1);
    test_attention_ex(2, 1, false, 128, 2, 0, 2, ctx_gqa_long, 16, 2, 100);
    test_attention_ex(2, 0, true, 64, 8, 2, 2, ctx_mid, 16, 2, 20);
    test_attention_ex(4, 0, true, 16, 4, 0, 3, ctx_small, 4, 2, 5);
    test_rmsnorm(3, 64);
    test_rmsnorm(5, 13);                              /* element path */
    test_rmsnorm(2, 4096);                            /* Llama-3.1-8B's hidden: register path */
    test_rmsnorm(1, 16384);                           /* 2 vectors per thread */
    test_rmsnorm(2, 24000);                           /* 4 vectors per thread */
    test_rmsnorm(2, 40000);                           /* too long for the register path */
    test_rope(9, 4, 2, 64, 10000, false);
    test_rope(8, 8, 2, 128, 500000, true);
    test_rope(5, 4, 4, 128, 1000000, false);
    test_rope(3, 3, 1, 24, 10000, false);             /* head_dim % 16 != 0: pair by pair */
    test_swiglu(3, 64);
    test_swiglu(2, 1000);
    test_swiglu(4, 13);                               /* element path */
    /* SwiGLU in the gate|up linear: fp16, int8 per row and grouped, int4; decode (GEMV), prefill
     * (GEMM / cuBLASLt), pairs not a multiple of a block's 8 or 32, columns the plain kernels take */
    test_linear_swiglu(PLN_DTYPE_F16, 64, 256, 0, 1, false);
    test_linear_swiglu(PLN_DTYPE_F16, 37, 128, 0, 20, true);
    test_linear_swiglu(PLN_DTYPE_I8, 64, 256, 256, 3, true);
    test_linear_swiglu(PLN_DTYPE_I8, 40, 256, 32, 40, false);
    test_linear_swiglu(PLN_DTYPE_U8, 37, 256, 32, 2, true);
    test_linear_swiglu(PLN_DTYPE_U8, 64, 256, 64, 40, false);
    test_linear_swiglu(PLN_DTYPE_F16, 5, 96, 0, 3, true);    /* 5 pairs: a part-full GEMV block */
    test_sampling(3, 1003, 0, 5, false);
    test_sampling(2, 502, 501, 1, false);
    test_sampling(4, 250, 0, 40, true);
    if (!g_self) {
        test_load_file(((size_t)3 << 20) + 4321, 12345, ((size_t)2 << 20) + 777);
        test_graph();
        test_errors();
    }

    if (!g_quick) {
        /* BLOOM-176B, one rank of TP 8: H 14336, 14 heads of 128 (of 112), 4H/8 7168, vocab 31360 */
        const int64_t H = 14336, H4 = 7168, V = 31360;
        test_embed(V, H, 2 * V, 8);
        test_layernorm(8, H);
        int32_t Ts[4] = {1, 8, 16, 32};
        for (int i = 0; i < 4; i++) {
            int32_t T = Ts[i];
            test_linear(PLN_DTYPE_F16, 3 * H / 8, H, 0, T, true, false);   /* query_key_value */
            test_linear(PLN_DTYPE_F16, H, H / 8, 0, T, false, false);      /* dense (row-parallel) */
            test_linear(PLN_DTYPE_F16, H4, H, 0, T, true, true);           /* dense_h_to_4h + GeLU */
            test_linear(PLN_DTYPE_F16, H, H4, 0, T, false, false);         /* dense_4h_to_h */
            test_linear(PLN_DTYPE_I8, 3 * H / 8, H, 0, T, true, false);
            test_linear(PLN_DTYPE_I8, H4, H, 128, T, true, true);
            test_linear(PLN_DTYPE_I8, H, H4, 0, T, false, false);
            test_linear(PLN_DTYPE_U8, 3 * H / 8, H, 128, T, true, false);  /* int4 g128 */
            test_linear(PLN_DTYPE_U8, H, H4, 128, T, false, false);
        }
        for (int32_t T = 64; T <= 128; T *= 2) {   /* the GEMM's 64-token tiles at the 176B shapes */
            test_linear(PLN_DTYPE_I8, H4, H, 128, T, true, true);
            test_linear(PLN_DTYPE_U8, 3 * H / 8, H, 128, T, true, false);
        }
        test_logits(PLN_DTYPE_F16, V, H, 0, 4, V);
        test_logits(PLN_DTYPE_F16, V, H, 0, 1, V - 200);
        int32_t ctx_bloom[4] = {1, 300, 700, 1300};
        test_attention(14, 128, 112, 14, 4, ctx_bloom, 16, 2);
        /* Llama-3.1-8B at TP 1 (32 q / 8 KV heads of 128, hidden 4096, intermediate 14336) and a
         * Llama-3.1-70B rank at TP 8 (8 q heads / 1 KV head, hidden 8192, 28672 / 8) */
        int32_t ctx_llama[4] = {1, 300, 700, 1300};
        test_attention_ex(32, 8, false, 128, 32, 0, 4, ctx_llama, 16, 2, 0);
        test_attention_ex(8, 1, false, 128, 64, 0, 4, ctx_llama, 16, 2, 0);
        test_rmsnorm(8, 4096);
        test_rmsnorm(8, 8192);
        test_rope(32, 32, 8, 128, 500000, true);
        test_swiglu(8, 14336);
        test_swiglu(8, 28672 / 8);
        test_sampling(4, V, V, 50, false);
        test_sampling(8, V, 0, 1, false);
    }
#ifdef PLN_CUDA_EMU
    printf("%zu kernel launches ran on the CPU harness, %zu reports\n", pln_emu_launch_count(), pln_emu_report_count());
    CHECK(pln_emu_launch_count() > 1000 && pln_emu_report_count() == 0, "harness: %zu launches, %zu reports (last: %s)",
          pln_emu_launch_count(), pln_emu_report_count(), pln_emu_last_report());
#endif
    g_gpu->destroy(g_gpu);
    g_cpu->destroy(g_cpu);
    return test_done();
}
