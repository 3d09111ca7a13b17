/* bench_decode.c — the CUDA backend's figures on one GPU, against ceilings measured in the same
 * run (nccl-tests / llm.c habit): device copy GB/s and fp16 GEMM TFLOP/s; then one TP-8 rank of
 * BLOOM-176B (70 layers, hidden 14336, 14 of 112 heads of 128, 4H/8 = 7168, vocab 31360 per
 * rank) with random weights made on the device (no files): decode ms/token and MBU at several
 * batch sizes, fp16 and int8, eager and replayed as a CUDA graph; prefill tokens/s; per-op GB/s of
 * the decode kernels; the int4 linears at BLOOM-176B's full (TP 1) width; and the Llama family's
 * decode ops at Llama-3.1-8B (TP 1) and Llama-3.1-70B (one TP-8 rank) widths (llama_ops). The
 * all-reduces of a real TP-8 run are no-ops here (one rank): the figures
 * are one rank's compute and memory time, without NVLink time.
 *
 *   bench_decode [--quick] [--ctx N] [--batches 1,8,32,128] [--iters N]
 *   bench_decode --load FILE        loader GB/s: FILE streamed into one device allocation
 *   bench_decode --sweep-only [N]   the GEMV split-k sweep (not in the default run), from its shape N (0-11) on
 *
 * Every figure is also printed as "RESULT <key> <value> <unit>" for tools/bench/gpu.sh. */
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/pln_math.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#define DIE(...) do { fprintf(stderr, "bench_decode: " __VA_ARGS__); fprintf(stderr, ": %s\n", pln_error()); exit(1); } while (0)
#define CU(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { fprintf(stderr, "bench_decode: %s: %s\n", #call, cudaGetErrorString(e_)); exit(1); } } while (0)

static pln_backend *be;
static cudaStream_t st;

static void result(const char *key, double v, const char *unit)
{
    printf("RESULT %s %.6g %s\n", key, v, unit);
    fflush(stdout);
}

static void *dalloc(size_t n)
{
    void *p = be->alloc(be, n ? n : 16);
    if (!p) DIE("alloc %zu bytes", n);
    return p;
}
static void fill(void *p, size_t n, pln_dtype dt, float lo, float hi)
{
    static uint64_t seed = 1;
    if (pln_cuda_fill_random(be, p, n, dt, lo, hi, seed++)) DIE("fill");
}

/* Milliseconds per call of fn over iters calls, after warm calls, timed with CUDA events. */
typedef int (*bench_fn)(void *arg, int iter);
static double time_ms(bench_fn fn, void *arg, int warm, int iters)
{
    for (int i = 0; i < warm; i++) if (fn(arg, i)) DIE("warm-up call");
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a)); CU(cudaEventCreate(&b));
    CU(cudaEventRecord(a, st));
    for (int i = 0; i < iters; i++) if (fn(arg, i)) DIE("timed call");
    CU(cudaEventRecord(b, st));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a); cudaEventDestroy(b);
    return ms / iters;
}

/* ---- ceilings ------------------------------------------------------------------------------- */
typedef struct { void *a, *b; size_t n; } copy_arg;
static int do_copy(void *arg, int it)
{
    copy_arg *c = arg;
    return cudaMemcpyAsync(it & 1 ? c->a : c->b, it & 1 ? c->b : c->a, c->n, cudaMemcpyDeviceToDevice, st) != cudaSuccess;
}
typedef struct { void *out, *in; pln_weight w; int32_t T; } lin_arg;
static int do_linear(void *arg, int it)
{
    lin_arg *l = arg;
    return be->linear(be, l->out, l->in, &l->w, NULL, l->T, false);
}

static double g_copy_gbs;
static void ceilings(void)
{
    copy_arg c = {NULL, NULL, (size_t)4 << 30};
    c.a = dalloc(c.n); c.b = dalloc(c.n);
    fill(c.a, c.n / 2, PLN_DTYPE_F16, -1, 1);
    double ms = time_ms(do_copy, &c, 3, 10);
    g_copy_gbs = 2.0 * (double)c.n / (ms * 1e-3) / 1e9;   /* bytes read + written */
    printf("device copy: %.0f GB/s (cudaMemcpy D2D of %zu MiB, read + write counted)\n", g_copy_gbs, c.n >> 20);
    result("copy_gbs", g_copy_gbs, "GB/s");
    be->free(be, c.a); be->free(be, c.b);

    const int64_t n = 8192;
    lin_arg l = {dalloc((size_t)n * n * 2), dalloc((size_t)n * n * 2), {PLN_DTYPE_F16, n, n, NULL, NULL, 0}, (int32_t)n};
    l.w.w = dalloc((size_t)n * n * 2);
    fill(l.in, (size_t)n * n, PLN_DTYPE_F16, -1, 1);
    fill((void *)l.w.w, (size_t)n * n, PLN_DTYPE_F16, -0.02f, 0.02f);
    ms = time_ms(do_linear, &l, 3, 10);
    double tf = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
    printf("fp16 GEMM (cuBLASLt, fp32 accumulate) %lldx%lldx%lld: %.0f TFLOP/s\n", (long long)n, (long long)n, (long long)n, tf);
    result("gemm_tflops", tf, "TFLOP/s");
    be->free(be, l.out); be->free(be, l.in); be->free(be, (void *)l.w.w);
}

/* ---- the TP-8 rank of BLOOM-176B ------------------------------------------------------------ */
#define NL 70
#define HID 14336
#define NHEAD 112
#define NHL 14
#define HD 128
#define FF (4 * HID / 8)
#define QKV (3 * HID / 8)
#define HL (HID / 8)
#define VR (250880 / 8)
#define BS 16

typedef struct {
    pln_weight qkv, dense, h4h, h4;
    uint16_t *b_qkv, *b_dense, *b_h4h, *b_4hh, *ln1w, *ln1b, *ln2w, *ln2b;
} layer_t;

typedef struct {
    bool int8;
    layer_t L[NL];
    pln_weight emb;
    uint16_t *wln_w, *wln_b, *lnf_w, *lnf_b;
    void *arena;
    uint64_t weight_bytes;   /* read once per step */
} model_t;

static pln_weight make_w(char **cur, int64_t rows, int64_t cols, bool int8, uint64_t *bytes)
{
    pln_weight w = {int8 ? PLN_DTYPE_I8 : PLN_DTYPE_F16, rows, cols, NULL, NULL, cols};
    size_t wb = (size_t)(rows * cols) * (int8 ? 1 : 2);
    w.w = *cur; *cur += pln_align_up(wb, 256);
    float amp = 1.0f / sqrtf((float)cols);
    if (int8) {
        fill((void *)w.w, (size_t)(rows * cols), PLN_DTYPE_I8, 0, 0);
        w.scale = (const uint16_t *)*cur; *cur += pln_align_up((size_t)rows * 2, 256);
        fill((void *)w.scale, (size_t)rows, PLN_DTYPE_F16, amp / 127 * 0.5f, amp / 127 * 1.5f);
        *bytes += (uint64_t)rows * 2;
    } else {
        fill((void *)w.w, (size_t)(rows * cols), PLN_DTYPE_F16, -amp, amp);
    }
    *bytes += wb;
    return w;
}
static uint16_t *make_v(char **cur, int64_t n, float lo, float hi)
{
    uint16_t *p = (uint16_t *)*cur;
    *cur += pln_align_up((size_t)n * 2, 256);
    fill(p, (size_t)n, PLN_DTYPE_F16, lo, hi);
    return p;
}

static void model_make(model_t *m, bool int8)
{
    memset(m, 0, sizeof *m);
    m->int8 = int8;
    size_t per = ((size_t)QKV * HID + (size_t)HID * HL + (size_t)FF * HID + (size_t)HID * FF) * (int8 ? 1 : 2) +
                 (size_t)(QKV + HID + FF + HID) * 2 * 2 + 8 * HID * 2 + 64 * 256;
    size_t total = per * NL + (size_t)VR * HID * 2 + 8 * HID * 2 + 16 * 256;
    m->arena = dalloc(total);
    char *cur = m->arena;
    uint64_t bytes = 0;
    m->emb = make_w(&cur, VR, HID, false, &bytes);
    m->wln_w = make_v(&cur, HID, 0.8f, 1.2f); m->wln_b = make_v(&cur, HID, -0.1f, 0.1f);
    for (int i = 0; i < NL; i++) {
        layer_t *L = &m->L[i];
        L->ln1w = make_v(&cur, HID, 0.8f, 1.2f); L->ln1b = make_v(&cur, HID, -0.1f, 0.1f);
        L->qkv = make_w(&cur, QKV, HID, int8, &bytes); L->b_qkv = make_v(&cur, QKV, -0.1f, 0.1f);
        L->dense = make_w(&cur, HID, HL, int8, &bytes); L->b_dense = make_v(&cur, HID, -0.1f, 0.1f);
        L->ln2w = make_v(&cur, HID, 0.8f, 1.2f); L->ln2b = make_v(&cur, HID, -0.1f, 0.1f);
        L->h4h = make_w(&cur, FF, HID, int8, &bytes); L->b_h4h = make_v(&cur, FF, -0.1f, 0.1f);
        L->h4 = make_w(&cur, HID, FF, int8, &bytes); L->b_4hh = make_v(&cur, HID, -0.1f, 0.1f);
    }
    m->lnf_w = make_v(&cur, HID, 0.8f, 1.2f); m->lnf_b = make_v(&cur, HID, -0.1f, 0.1f);
    PLN_ASSERT((size_t)(cur - (char *)m->arena) <= total);
    m->weight_bytes = bytes;
    if (be->sync(be)) DIE("weights");
}

/* Activations, KV cache and step inputs for up to T tokens of S sequences at context ctx. */
typedef struct {
    int32_t T, S, ctx, max_blocks;
    void *x, *ln, *y, *qkv, *attn, *h4, *sel;
    float *logits;
    int32_t *ids, *seq, *pos, *bt, *rows;
    float *slopes;
    void *k[NL], *v[NL];
    pln_attn_meta meta;
    uint64_t kv_bytes_read;
    float *vals, *rmax, *rsum;
    int32_t *tids;
} state_t;

static void state_make(state_t *s, int32_t T, int32_t S, int32_t ctx, bool prefill)
{
    memset(s, 0, sizeof *s);
    s->T = T; s->S = S; s->ctx = ctx;
    s->max_blocks = (ctx + BS) / BS;
    size_t a = 2;
    s->x = dalloc((size_t)T * HID * a); s->ln = dalloc((size_t)T * HID * a); s->y = dalloc((size_t)T * HID * a);
    s->qkv = dalloc((size_t)T * QKV * a); s->attn = dalloc((size_t)T * HL * a); s->h4 = dalloc((size_t)T * FF * a);
    s->sel = dalloc((size_t)S * HID * a); s->logits = dalloc((size_t)S * VR * 4);
    s->ids = dalloc((size_t)T * 4); s->seq = dalloc((size_t)T * 4); s->pos = dalloc((size_t)T * 4);
    s->bt = dalloc((size_t)S * s->max_blocks * 4); s->rows = dalloc((size_t)S * 4); s->slopes = dalloc(NHL * 4);
    int32_t *h = pln_xmalloc((size_t)(T > S * s->max_blocks ? T : S * s->max_blocks) * 4 + 4 * (size_t)T);
    /* decode: token t is sequence t at position ctx; prefill: one sequence, positions 0..T-1 */
    for (int t = 0; t < T; t++) h[t] = (int32_t)((t * 7919u) % 250000u);
    be->upload(be, s->ids, h, (size_t)T * 4);
    for (int t = 0; t < T; t++) h[t] = prefill ? 0 : t;
    be->upload(be, s->seq, h, (size_t)T * 4);
    for (int t = 0; t < T; t++) h[t] = prefill ? t : ctx;
    be->upload(be, s->pos, h, (size_t)T * 4);
    for (int i = 0; i < S * s->max_blocks; i++) h[i] = i;
    be->upload(be, s->bt, h, (size_t)S * s->max_blocks * 4);
    for (int i = 0; i < S; i++) h[i] = prefill ? T - 1 : i;
    be->upload(be, s->rows, h, (size_t)S * 4);
    float sl[NHL];
    for (int i = 0; i < NHL; i++) sl[i] = pln_alibi_slope(NHL + i, NHEAD);   /* rank 1's heads */
    be->upload(be, s->slopes, sl, sizeof sl);
    free(h);
    size_t pool = (size_t)S * s->max_blocks * NHL * BS * HD * 2;
    for (int i = 0; i < NL; i++) {
        s->k[i] = dalloc(pool); s->v[i] = dalloc(pool);
        fill(s->k[i], pool / 2, PLN_DTYPE_F16, -1, 1);
        fill(s->v[i], pool / 2, PLN_DTYPE_F16, -1, 1);
    }
    pln_attn_meta m = {T, S, BS, s->max_blocks, prefill ? T : ctx + 1, s->seq, s->pos, s->bt, 0, 0};
    s->meta = m;
    /* keys + values read by one decode step over all layers */
    s->kv_bytes_read = prefill ? 0 : (uint64_t)S * (ctx + 1) * NHL * HD * 2 * 2 * NL;
    s->vals = pln_xmalloc((size_t)S * 4); s->rmax = pln_xmalloc((size_t)S * 4); s->rsum = pln_xmalloc((size_t)S * 4);
    s->tids = pln_xmalloc((size_t)S * 4);
    if (be->sync(be)) DIE("state");
}

static void state_free(state_t *s)
{
    void *p[] = {s->x, s->ln, s->y, s->qkv, s->attn, s->h4, s->sel, s->logits, s->ids, s->seq, s->pos, s->bt, s->rows, s->slopes};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) be->free(be, p[i]);
    for (int i = 0; i < NL; i++) { be->free(be, s->k[i]); be->free(be, s->v[i]); }
    free(s->vals); free(s->rmax); free(s->rsum); free(s->tids);
}

/* One forward step on the device, as runtime/model.c orders it (the all-reduces after dense and
 * dense_4h_to_h are where a TP-8 run would call NCCL; here they are no-ops). */
static int forward(model_t *m, state_t *s)
{
    const int32_t T = s->T;
    const float eps = 1e-5f;
    int rc = 0;
    rc |= be->embed(be, s->x, s->ids, T, m->emb.w, 0, VR, HID);
    rc |= be->layernorm(be, s->x, s->x, m->wln_w, m->wln_b, T, HID, eps);
    rc |= be->layernorm(be, s->ln, s->x, m->L[0].ln1w, m->L[0].ln1b, T, HID, eps);
    for (int i = 0; i < NL && !rc; i++) {
        layer_t *L = &m->L[i];
        rc |= be->linear(be, s->qkv, s->ln, &L->qkv, L->b_qkv, T, false);
        if (be->append_attention)   /* as runtime/model.c: fused on decode steps */
            rc |= be->append_attention(be, s->attn, s->qkv, s->k[i], s->v[i], &s->meta, s->slopes, NHL, HD);
        else {
            rc |= be->kv_append(be, s->qkv, s->k[i], s->v[i], &s->meta, NHL, HD);
            rc |= be->attention(be, s->attn, s->qkv, s->k[i], s->v[i], &s->meta, s->slopes, NHL, HD);
        }
        rc |= be->linear(be, s->y, s->attn, &L->dense, NULL, T, false);
        /* all-reduce(y) here in TP 8 */
        rc |= be->residual_layernorm(be, s->x, s->y, L->b_dense, L->ln2w, L->ln2b, s->ln, T, HID, eps);
        rc |= be->linear(be, s->h4, s->ln, &L->h4h, L->b_h4h, T, true);
        rc |= be->linear(be, s->y, s->h4, &L->h4, NULL, T, false);
        /* all-reduce(y) here in TP 8 */
        const uint16_t *nw = i + 1 < NL ? m->L[i + 1].ln1w : m->lnf_w, *nb = i + 1 < NL ? m->L[i + 1].ln1b : m->lnf_b;
        rc |= be->residual_layernorm(be, s->x, s->y, L->b_4hh, nw, nb, s->ln, T, HID, eps);
    }
    rc |= be->gather_rows(be, s->sel, s->ln, s->rows, s->S, HID);
    rc |= be->logits(be, s->logits, s->sel, &m->emb, s->S, VR);
    return rc ? -1 : 0;
}

typedef struct { model_t *m; state_t *s; pln_cuda_graph *g; } step_arg;
static int do_step(void *arg, int it)
{
    step_arg *a = arg;
    if (forward(a->m, a->s)) return -1;
    return be->topk(be, a->s->logits, a->s->S, VR, 0, 1, a->s->vals, a->s->tids, a->s->rmax, a->s->rsum);
}
static int do_graph(void *arg, int it)
{
    step_arg *a = arg;
    return pln_cuda_graph_launch(be, a->g);
}

static void decode(model_t *m, int32_t B, int32_t ctx, int iters)
{
    state_t s;
    state_make(&s, B, B, ctx, false);
    step_arg a = {m, &s, NULL};
    double ms = time_ms(do_step, &a, 2, iters);
    /* graph: the forward only (topk downloads, so it stays outside) */
    int rc = forward(m, &s) || be->sync(be);
    rc = rc || pln_cuda_graph_begin(be);
    if (!rc) { int f = forward(m, &s); rc = pln_cuda_graph_end(be, &a.g) || f; }
    double gms = rc ? 0 : time_ms(do_graph, &a, 2, iters);
    if (rc) fprintf(stderr, "graph capture failed: %s\n", pln_error());
    double bytes = (double)m->weight_bytes + (double)s.kv_bytes_read;
    double best = gms > 0 && gms < ms ? gms : ms;
    double mbu = bytes / (best * 1e-3) / (g_copy_gbs * 1e9);
    const char *dt = m->int8 ? "int8" : "fp16";
    printf("decode %s batch %3d ctx %d: %.2f ms/step eager, %.2f ms/step graph, %.3f ms/token, %.0f tokens/s, "
           "%.1f GB read/step, MBU %.0f%% of the copy ceiling\n", dt, B, ctx, ms, gms, best / B, B / (best * 1e-3),
           bytes / 1e9, 100 * mbu);
    char key[96];
    snprintf(key, sizeof key, "decode_%s_b%d_ms_step", dt, B); result(key, best, "ms");
    snprintf(key, sizeof key, "decode_%s_b%d_ms_step_eager", dt, B); result(key, ms, "ms");
    snprintf(key, sizeof key, "decode_%s_b%d_ms_token", dt, B); result(key, best / B, "ms");
    snprintf(key, sizeof key, "decode_%s_b%d_tokens_s", dt, B); result(key, B / (best * 1e-3), "tokens/s");
    snprintf(key, sizeof key, "decode_%s_b%d_mbu", dt, B); result(key, 100 * mbu, "%");
    pln_cuda_graph_destroy(a.g);
    /* batch 1: the same step with programmatic dependent launch off (plain launches: what sm_80
     * and PLN_PDL=0 run), and with the LayerNorm rows split over several blocks */
    for (int var = 0; var < 2 && B == 1; var++) {
        const int pdl = pln_cuda_set_pdl(be, 0), lns = pln_cuda_set_ln_split(be, var == 1);
        if (var == 1) pln_cuda_set_pdl(be, pdl);
        step_arg v = {m, &s, NULL};
        double vms = time_ms(do_step, &v, 2, iters);
        int vrc = forward(m, &s) || be->sync(be) || pln_cuda_graph_begin(be);
        if (!vrc) { int f = forward(m, &s); vrc = pln_cuda_graph_end(be, &v.g) || f; }
        double vg = vrc ? 0 : time_ms(do_graph, &v, 2, iters);
        pln_cuda_graph_destroy(v.g);
        pln_cuda_set_pdl(be, pdl);
        pln_cuda_set_ln_split(be, lns);
        const char *what = var == 0 ? "nopdl" : "lnsplit";
        double vbest = vg > 0 && vg < vms ? vg : vms;
        printf("decode %s batch 1 ctx %d, %s: %.2f ms/step eager, %.2f ms/step graph (PDL %s, LayerNorm %s)\n", dt, ctx,
               var == 0 ? "programmatic dependent launch off" : "LayerNorm rows split", vms, vg,
               var == 0 ? "off" : (pdl ? "on" : "off (not sm_90)"), var == 1 ? "split" : "one block per row");
        snprintf(key, sizeof key, "decode_%s_b1_ms_step_%s", dt, what); result(key, vbest, "ms");
        snprintf(key, sizeof key, "decode_%s_b1_ms_step_eager_%s", dt, what); result(key, vms, "ms");
    }
    state_free(&s);
}

static void prefill(model_t *m, int32_t T, bool tiled)
{
    state_t s;
    state_make(&s, T, 1, T, true);
    step_arg a = {m, &s, NULL};
    pln_cuda_set_prefill_tiled(be, tiled);
    double ms = time_ms(do_step, &a, 1, 3);
    pln_cuda_set_prefill_tiled(be, 0);
    double flops = 2.0 * (double)(m->weight_bytes / (m->int8 ? 1 : 2)) * T;
    const char *dt = m->int8 ? "int8" : "fp16", *att = tiled ? "_tiled" : "";
    printf("prefill %s %d tokens (%s attention): %.1f ms, %.0f tokens/s, %.0f TFLOP/s in the linears\n", dt, T,
           tiled ? "query-tiled" : "split-key", ms, T / (ms * 1e-3), flops / (ms * 1e-3) / 1e12);
    char key[96];
    snprintf(key, sizeof key, "prefill_%s_%d%s_tokens_s", dt, T, att); result(key, T / (ms * 1e-3), "tokens/s");
    snprintf(key, sizeof key, "prefill_%s_%d%s_ms", dt, T, att); result(key, ms, "ms");
    state_free(&s);
}

/* ---- per-op GB/s of the decode kernels (layers rotated so nothing stays in L2) --------------- */
typedef struct { model_t *m; state_t *s; int which; } op_arg;
static int do_op(void *arg, int it)
{
    op_arg *o = arg;
    layer_t *L = &o->m->L[it % NL];
    state_t *s = o->s;
    switch (o->which) {
    case 0: return be->linear(be, s->qkv, s->ln, &L->qkv, L->b_qkv, s->T, false);
    case 1: return be->linear(be, s->y, s->attn, &L->dense, NULL, s->T, false);
    case 2: return be->linear(be, s->h4, s->ln, &L->h4h, L->b_h4h, s->T, true);
    case 3: return be->linear(be, s->y, s->h4, &L->h4, NULL, s->T, false);
    case 4:   /* the step's attention: with the KV append fused where the backend has it */
        if (be->append_attention)
            return be->append_attention(be, s->attn, s->qkv, s->k[it % NL], s->v[it % NL], &s->meta, s->slopes, NHL, HD);
        return be->attention(be, s->attn, s->qkv, s->k[it % NL], s->v[it % NL], &s->meta, s->slopes, NHL, HD);
    case 5: return be->residual_layernorm(be, s->x, s->y, L->b_dense, L->ln2w, L->ln2b, s->ln, s->T, HID, 1e-5f);
    case 6: return be->logits(be, s->logits, s->sel, &o->m->emb, s->S, VR);
    case 7: return be->kv_append(be, s->qkv, s->k[it % NL], s->v[it % NL], &s->meta, NHL, HD);
    case 8: {   /* residual + LayerNorm with the rows split over several blocks */
        int was = pln_cuda_set_ln_split(be, 1);
        int rc = be->residual_layernorm(be, s->x, s->y, L->b_dense, L->ln2w, L->ln2b, s->ln, s->T, HID, 1e-5f);
        pln_cuda_set_ln_split(be, was);
        return rc;
    }
    }
    return -1;
}

static double wbytes(const pln_weight *w)
{
    return (double)(w->rows * w->cols) * (w->dtype == PLN_DTYPE_I8 ? 1 : 2) + (w->scale ? (double)w->rows * (w->cols / w->group) * 2 : 0);
}

static void per_op(model_t *m, int32_t B, int32_t ctx)
{
    state_t s;
    state_make(&s, B, B, ctx, false);
    const char *names[] = {"query_key_value", "dense", "dense_h_to_4h+gelu", "dense_4h_to_h", "attention", "residual+layernorm", "logits", "kv_append",
                           "residual+layernorm-split"};
    const char *dt = m->int8 ? "int8" : "fp16";
    for (int w = 0; w < 9; w++) {
        if (m->int8 && (w == 4 || w >= 5)) continue;   /* the same kernels as fp16 */
        op_arg o = {m, &s, w};
        double ms = time_ms(do_op, &o, 3, 2 * NL);
        double bytes = 0;
        layer_t *L = &m->L[0];
        switch (w) {
        case 0: bytes = wbytes(&L->qkv) + (double)B * (HID + QKV) * 2; break;
        case 1: bytes = wbytes(&L->dense) + (double)B * (HL + HID) * 2; break;
        case 2: bytes = wbytes(&L->h4h) + (double)B * (HID + FF) * 2; break;
        case 3: bytes = wbytes(&L->h4) + (double)B * (FF + HID) * 2; break;
        case 4: bytes = (double)B * (ctx + 1) * NHL * HD * 2 * 2 + (double)B * (QKV + HL) * 2 +
                        (be->append_attention ? (double)B * NHL * HD * 2 * 2 : 0); break;   /* + the appended k, v */
        case 5: case 8: bytes = (double)B * HID * 2 * 4; break;
        case 6: bytes = wbytes(&m->emb) + (double)B * (HID * 2 + VR * 4); break;
        case 7: bytes = (double)B * NHL * HD * 2 * 2 * 2; break;
        }
        double gbs = bytes / (ms * 1e-3) / 1e9;
        printf("  op %-20s %s batch %3d: %8.1f us  %7.0f GB/s  (%3.0f%% of copy)\n", names[w], dt, B, ms * 1e3, gbs, 100 * gbs / g_copy_gbs);
        char key[96];
        snprintf(key, sizeof key, "op_%s_%s_b%d_gbs", names[w], dt, B); result(key, gbs, "GB/s");
        /* the time per call: tools/bench/gpu.sh multiplies it by the calls per decode step */
        snprintf(key, sizeof key, "op_%s_%s_b%d_us", names[w], dt, B); result(key, ms * 1e3, "us");
    }
    /* GEMV against cuBLASLt / the int8 GEMM for the biggest matrix, T = 1..16 */
    if (B == 1) {
        for (int32_t T = 1; T <= 16; T *= 2) {
            state_t t;
            state_make(&t, T, T, 16, false);
            op_arg o = {m, &t, 2};
            pln_cuda_set_linear_path(be, 1);
            double g = time_ms(do_op, &o, 3, NL);
            pln_cuda_set_linear_path(be, 2);
            double c = time_ms(do_op, &o, 3, NL);
            pln_cuda_set_linear_path(be, 0);
            double bytes = wbytes(&m->L[0].h4h);
            printf("  dense_h_to_4h %s T %2d: GEMV %.0f GB/s, %s %.0f GB/s\n", dt, T, bytes / (g * 1e-3) / 1e9,
                   m->int8 ? "int8 GEMM" : "cuBLASLt", bytes / (c * 1e-3) / 1e9);
            char key[96];
            snprintf(key, sizeof key, "gemv_vs_gemm_%s_T%d_gemv_gbs", dt, T); result(key, bytes / (g * 1e-3) / 1e9, "GB/s");
            snprintf(key, sizeof key, "gemv_vs_gemm_%s_T%d_gemm_gbs", dt, T); result(key, bytes / (c * 1e-3) / 1e9, "GB/s");
            state_free(&t);
        }
    }
    state_free(&s);
}

/* ---- the linears of one TP-8 rank by batch (issue #11: batch 128 at >= 60x batch 1's tokens/s) --
 * Each of the four [out, in] shapes of a TP-8 rank of BLOOM-176B at T = 1, 8, 32, 64, 128 in fp16
 * (the GEMV to 16 tokens, cuBLASLt above), int8 per row, int8 g128 and int4 g128 (the GEMV to
 * GEMV_MAX_T_Q tokens, the cp.async GEMM above): time per call and TFLOP/s side by side; at 32 and
 * 64 tokens the quantized ones also forced onto each kernel (where the GEMV/GEMM crossover lies).
 * Then one layer's four linears summed per batch, and batch 128's tokens/s over batch 1's. */
static void batch_linears(void)
{
    const int64_t shp[4][2] = {{QKV, HID}, {HID, HL}, {FF, HID}, {HID, FF}};
    const char *names[4] = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
    const char *dts[4] = {"fp16", "int8", "int8g128", "int4g128"};
    const int32_t Ts[5] = {1, 8, 32, 64, 128};
    double layer[4][5] = {{0}};
    void *in = dalloc((size_t)128 * HID * 2), *out = dalloc((size_t)128 * HID * 2);   /* the widest side is HID */
    fill(in, (size_t)128 * HID, PLN_DTYPE_F16, -1, 1);
    printf("linears of one TP-8 rank by batch (us per call, TFLOP/s):\n");
    for (int w = 0; w < 4; w++) {
        const int64_t R = shp[w][0], C = shp[w][1];
        for (int d = 0; d < 4; d++) {
            const int64_t G = d == 1 ? C : 128;
            lin_arg l = {out, in, {d == 0 ? PLN_DTYPE_F16 : d == 3 ? PLN_DTYPE_U8 : PLN_DTYPE_I8, R, C, NULL, NULL, d ? G : 0}, 1};
            const size_t wb = (size_t)(R * C) * (d == 0 ? 2 : 1) / (d == 3 ? 2 : 1);
            l.w.w = dalloc(wb);
            fill((void *)l.w.w, d == 0 ? (size_t)(R * C) : wb, d == 0 ? PLN_DTYPE_F16 : PLN_DTYPE_I8, -0.02f, 0.02f);
            if (d) {
                l.w.scale = dalloc((size_t)(R * (C / G)) * 2);
                fill((void *)l.w.scale, (size_t)(R * (C / G)), PLN_DTYPE_F16, 1e-4f, 3e-4f);
            }
            for (int i = 0; i < 5; i++) {
                l.T = Ts[i];
                const double ms = time_ms(do_linear, &l, 2, 10);
                const double tf = 2.0 * (double)R * C * Ts[i] / (ms * 1e-3) / 1e12;
                layer[d][i] += ms * 1e3;
                printf("  %-16s [%5lld x %5lld] %-8s T %3d: %8.1f us %7.1f TFLOP/s\n", names[w], (long long)R,
                       (long long)C, dts[d], Ts[i], ms * 1e3, tf);
                char key[112];
                snprintf(key, sizeof key, "lin_%s_%s_T%d_us", names[w], dts[d], Ts[i]); result(key, ms * 1e3, "us");
                snprintf(key, sizeof key, "lin_%s_%s_T%d_tflops", names[w], dts[d], Ts[i]); result(key, tf, "TFLOP/s");
                if (d && (Ts[i] == 32 || Ts[i] == 64)) {   /* each quantized kernel forced */
                    for (int path = 1; path <= 2; path++) {
                        pln_cuda_set_linear_path(be, path);
                        const double pm = time_ms(do_linear, &l, 2, 10);
                        snprintf(key, sizeof key, "lin_%s_%s_T%d_%s_us", names[w], dts[d], Ts[i], path == 1 ? "gemv" : "gemm");
                        result(key, pm * 1e3, "us");
                    }
                    pln_cuda_set_linear_path(be, 0);
                }
            }
            be->free(be, (void *)l.w.w);
            if (l.w.scale) be->free(be, (void *)l.w.scale);
        }
    }
    for (int d = 0; d < 4; d++) {
        char key[112];
        for (int i = 0; i < 5; i++) {
            snprintf(key, sizeof key, "lin_layer_%s_T%d_us", dts[d], Ts[i]); result(key, layer[d][i], "us");
        }
        const double ratio = layer[d][4] > 0 ? 128.0 * layer[d][0] / layer[d][4] : 0;
        printf("  one layer's linears, %-8s: T 1 %.1f us, T 128 %.1f us: batch 128 gives %.1fx the tokens/s of batch 1 (goal >= 60x)\n",
               dts[d], layer[d][0], layer[d][4], ratio);
        snprintf(key, sizeof key, "lin_layer_%s_b128_over_b1", dts[d]); result(key, ratio, "x");
    }
    be->free(be, in); be->free(be, out);
}

/* ---- int4 at BLOOM-176B's full width (TP 1: the whole model on one 141 GB GPU) ----------------
 * The four linears of one layer as a TP-1 rank holds them, int4 with groups of 128: weight + scale
 * bytes per call against the copy ceiling, on the int4 GEMV (T <= 16) and GEMM, and the int4
 * prefill-shaped GEMM's TFLOP/s. Each matrix (100-400 MB) is far larger than L2, so every call
 * reads it from memory. */
static void int4_tp1(void)
{
    const int64_t G = 128;
    const int64_t shp[4][2] = {{3 * HID, HID}, {HID, HID}, {4 * HID, HID}, {HID, 4 * HID}};
    const char *names[4] = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
    const int32_t Ts[4] = {1, 8, 16, 512};
    void *in = dalloc((size_t)512 * 4 * HID * 2), *out = dalloc((size_t)512 * 4 * HID * 2);
    fill(in, (size_t)512 * 4 * HID, PLN_DTYPE_F16, -1, 1);
    for (int w = 0; w < 4; w++) {
        int64_t R = shp[w][0], C = shp[w][1];
        lin_arg l = {out, in, {PLN_DTYPE_U8, R, C, NULL, NULL, G}, 1};
        l.w.w = dalloc((size_t)(R * C / 2));
        l.w.scale = dalloc((size_t)(R * (C / G)) * 2);
        fill((void *)l.w.w, (size_t)(R * C / 2), PLN_DTYPE_I8, 0, 0);   /* any byte is two valid int4 */
        float amp = 1.0f / sqrtf((float)C);
        fill((void *)l.w.scale, (size_t)(R * (C / G)), PLN_DTYPE_F16, amp / 8 * 0.5f, amp / 8 * 1.5f);
        double bytes = (double)(R * C / 2) + (double)(R * (C / G)) * 2;
        for (int i = 0; i < 4; i++) {
            l.T = Ts[i];
            double ms = time_ms(do_linear, &l, 2, Ts[i] > 16 ? 3 : 10);
            double gbs = (bytes + (double)Ts[i] * (R + C) * 2) / (ms * 1e-3) / 1e9;
            double tf = 2.0 * (double)R * C * Ts[i] / (ms * 1e-3) / 1e12;
            printf("  int4 g128 TP 1 %-16s [%lld x %lld] T %3d: %8.1f us  %6.0f GB/s (%3.0f%% of copy)  %6.1f TFLOP/s\n",
                   names[w], (long long)R, (long long)C, Ts[i], ms * 1e3, gbs, 100 * gbs / g_copy_gbs, tf);
            char key[96];
            snprintf(key, sizeof key, "op_int4_tp1_%s_T%d_gbs", names[w], Ts[i]); result(key, gbs, "GB/s");
            snprintf(key, sizeof key, "op_int4_tp1_%s_T%d_us", names[w], Ts[i]); result(key, ms * 1e3, "us");
        }
        be->free(be, (void *)l.w.w); be->free(be, (void *)l.w.scale);
    }
    be->free(be, in); be->free(be, out);
}

/* ---- the Llama family's decode ops (issue #24), op by op: no model, no files -------------------
 * Llama-3.1-8B at TP 1 (hidden 4096, 32 q / 8 KV heads of 128, intermediate 14336, 32 layers) and
 * one TP-8 rank of Llama-3.1-70B (hidden 8192, 64 / 8 heads over 8 ranks: 8 q / 1 KV head of 128,
 * intermediate 28672 / 8 = 3584, 80 layers), fp16 weights made on the device: per op, µs per call
 * and GB/s against the copy ceiling at batch 1 and 8, context ctx (the decode kernels' fused KV
 * append, grouped-query flash-decoding), then the sum of the kernels of one decode step (each
 * op once per layer, the residual + RMSNorm twice; no logits, no all-reduce). The KV caches are
 * rotated over LL_ROT copies and every matrix is larger than L2, so the calls read memory. */
#define LL_ROT 8
typedef struct { const char *name; int64_t hid, nq, nkv, inter; int layers; } llama_shape;
typedef struct {
    const llama_shape *sh;
    int32_t B, ctx;
    pln_weight qkv, o, gu, down;
    uint16_t *gamma;
    float *inv_freq;
    void *x, *y, *ln, *qkvb, *attn, *gub, *act;
    void *k[LL_ROT], *v[LL_ROT];
    int32_t *seq, *pos, *bt;
    pln_attn_meta meta;
    int which;
} llama_arg;

static int do_llama(void *arg, int it)
{
    llama_arg *a = arg;
    const int32_t B = a->B, D = 128, nq = (int32_t)a->sh->nq;
    switch (a->which) {
    case 0: return be->linear(be, a->qkvb, a->ln, &a->qkv, NULL, B, false);
    case 1: return be->rope(be, a->qkvb, &a->meta, a->inv_freq, nq, D);
    case 2: return be->append_attention(be, a->attn, a->qkvb, a->k[it % LL_ROT], a->v[it % LL_ROT], &a->meta, NULL, nq, D);
    case 3: return be->linear(be, a->y, a->attn, &a->o, NULL, B, false);
    case 4: return be->residual_rmsnorm(be, a->x, a->y, NULL, a->gamma, a->ln, B, a->sh->hid, 1e-5f);
    case 5: return be->linear(be, a->gub, a->ln, &a->gu, NULL, B, false);
    case 6: return be->swiglu(be, a->act, a->gub, B, a->sh->inter);
    case 7: return be->linear(be, a->y, a->act, &a->down, NULL, B, false);
    case 8: return be->linear(be, a->act, a->ln, &a->gu, NULL, B, PLN_EPI_SWIGLU);   /* what the model runs */
    }
    return -1;
}

static void llama_ops(int32_t ctx)
{
    static const llama_shape shapes[2] = {{"llama3.1-8b-tp1", 4096, 32, 8, 14336, 32},
                                          {"llama3.1-70b-tp8", 8192, 8, 1, 3584, 80}};
    /* gate_up_proj and swiglu apart, for comparison; the step sums gate_up+swiglu, the fused
     * epilogue the model runs (backend.h linear_swiglu) */
    static const char *names[9] = {"qkv_proj", "rope", "attention", "o_proj", "residual+rmsnorm", "gate_up_proj",
                                   "swiglu", "down_proj", "gate_up+swiglu"};
    const int32_t D = 128, BS_L = 16;
    for (int si = 0; si < 2; si++) {
        const llama_shape *sh = &shapes[si];
        const int64_t H = sh->hid, QW = (sh->nq + 2 * sh->nkv) * D, HQ = sh->nq * D, I = sh->inter;
        printf("%s: hidden %lld, %lld q / %lld KV heads of %d, intermediate %lld, %d layers, context %d\n", sh->name,
               (long long)H, (long long)sh->nq, (long long)sh->nkv, D, (long long)I, sh->layers, ctx);
        llama_arg a;
        memset(&a, 0, sizeof a);
        a.sh = sh;
        uint64_t wb = 0;
        char *arena = dalloc((size_t)(QW * H + H * HQ + 2 * I * H + H * I) * 2 + 8 * 256), *cur = arena;
        a.qkv = make_w(&cur, QW, H, false, &wb);
        a.o = make_w(&cur, H, HQ, false, &wb);
        a.gu = make_w(&cur, 2 * I, H, false, &wb);
        a.down = make_w(&cur, H, I, false, &wb);
        a.gamma = dalloc((size_t)H * 2);
        fill(a.gamma, (size_t)H, PLN_DTYPE_F16, 0.8f, 1.2f);
        float inv[64];
        for (int i = 0; i < D / 2; i++) inv[i] = powf(500000.0f, -(float)(2 * i) / D);
        a.inv_freq = dalloc(sizeof inv);
        be->upload(be, a.inv_freq, inv, sizeof inv);
        for (int bi = 0; bi < 2; bi++) {
            const int32_t B = bi ? 8 : 1, max_blocks = (ctx + BS_L) / BS_L;
            a.B = B; a.ctx = ctx;
            a.x = dalloc((size_t)B * H * 2); a.y = dalloc((size_t)B * H * 2); a.ln = dalloc((size_t)B * H * 2);
            a.qkvb = dalloc((size_t)B * QW * 2); a.attn = dalloc((size_t)B * HQ * 2);
            a.gub = dalloc((size_t)B * 2 * I * 2); a.act = dalloc((size_t)B * I * 2);
            fill(a.x, (size_t)B * H, PLN_DTYPE_F16, -1, 1); fill(a.y, (size_t)B * H, PLN_DTYPE_F16, -1, 1);
            fill(a.ln, (size_t)B * H, PLN_DTYPE_F16, -1, 1); fill(a.qkvb, (size_t)B * QW, PLN_DTYPE_F16, -1, 1);
            fill(a.attn, (size_t)B * HQ, PLN_DTYPE_F16, -1, 1); fill(a.gub, (size_t)B * 2 * I, PLN_DTYPE_F16, -4, 4);
            fill(a.act, (size_t)B * I, PLN_DTYPE_F16, -1, 1);
            const size_t pool = (size_t)B * max_blocks * sh->nkv * BS_L * D;
            for (int r = 0; r < LL_ROT; r++) {
                a.k[r] = dalloc(pool * 2); a.v[r] = dalloc(pool * 2);
                fill(a.k[r], pool, PLN_DTYPE_F16, -1, 1); fill(a.v[r], pool, PLN_DTYPE_F16, -1, 1);
            }
            int32_t *h = pln_xmalloc((size_t)B * max_blocks * 4);
            a.seq = dalloc((size_t)B * 4); a.pos = dalloc((size_t)B * 4); a.bt = dalloc((size_t)B * max_blocks * 4);
            for (int t = 0; t < B; t++) h[t] = t;
            be->upload(be, a.seq, h, (size_t)B * 4);
            for (int t = 0; t < B; t++) h[t] = ctx;
            be->upload(be, a.pos, h, (size_t)B * 4);
            for (int i = 0; i < B * max_blocks; i++) h[i] = i;
            be->upload(be, a.bt, h, (size_t)B * max_blocks * 4);
            free(h);
            pln_attn_meta m = {B, B, BS_L, max_blocks, ctx + 1, a.seq, a.pos, a.bt, (int32_t)sh->nkv, 0};
            a.meta = m;
            if (be->sync(be)) DIE("llama state");
            double step_ms = 0;
            for (int w = 0; w < 9; w++) {
                if (w == 8 && !be->linear_swiglu) continue;
                a.which = w;
                double ms = time_ms(do_llama, &a, 3, 4 * LL_ROT), bytes = 0;
                switch (w) {
                case 0: bytes = wbytes(&a.qkv) + (double)B * (H + QW) * 2; break;
                case 1: bytes = (double)B * (sh->nq + sh->nkv) * D * 2 * 2; break;
                case 2: bytes = (double)B * (ctx + 1) * sh->nkv * D * 2 * 2 + (double)B * (QW + HQ) * 2; break;
                case 3: bytes = wbytes(&a.o) + (double)B * (HQ + H) * 2; break;
                case 4: bytes = (double)B * H * 2 * 4 + (double)H * 2; break;
                case 5: bytes = wbytes(&a.gu) + (double)B * (H + 2 * I) * 2; break;
                case 6: bytes = (double)B * I * 2 * 3; break;
                case 7: bytes = wbytes(&a.down) + (double)B * (I + H) * 2; break;
                case 8: bytes = wbytes(&a.gu) + (double)B * (H + I) * 2; break;
                }
                const double gbs = bytes / (ms * 1e-3) / 1e9;
                const bool fused = be->linear_swiglu;
                if (!(fused && (w == 5 || w == 6))) step_ms += ms * sh->layers * (w == 4 ? 2 : 1);
                printf("  op %-18s %s batch %d: %8.1f us  %7.0f GB/s  (%3.0f%% of copy)\n", names[w], sh->name, B, ms * 1e3,
                       gbs, 100 * gbs / g_copy_gbs);
                char key[128];
                snprintf(key, sizeof key, "llama_%s_%s_b%d_us", sh->name, names[w], B); result(key, ms * 1e3, "us");
                snprintf(key, sizeof key, "llama_%s_%s_b%d_gbs", sh->name, names[w], B); result(key, gbs, "GB/s");
                if (w == 2) {   /* the flash-decoding splits forced, against the dispatch's choice above */
                    static const int fs[] = {1, 2, 4, 8, 16, 32, 64};
                    printf("    attention splits forced:");
                    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
                        pln_cuda_set_attn_splits(be, fs[k]);
                        const double fms = time_ms(do_llama, &a, 3, 4 * LL_ROT);
                        printf(" %d:%.1f", fs[k], fms * 1e3);
                        snprintf(key, sizeof key, "llama_%s_attention_b%d_split%d_us", sh->name, B, fs[k]);
                        result(key, fms * 1e3, "us");
                    }
                    pln_cuda_set_attn_splits(be, 0);
                    printf(" us\n");
                }
            }
            printf("  %s batch %d: the kernels of one decode step sum to %.3f ms (%d layers, no logits)\n", sh->name, B,
                   step_ms, sh->layers);
            char key[128];
            snprintf(key, sizeof key, "llama_%s_kernels_b%d_ms_step", sh->name, B); result(key, step_ms, "ms");
            void *p[] = {a.x, a.y, a.ln, a.qkvb, a.attn, a.gub, a.act, a.seq, a.pos, a.bt};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) be->free(be, p[i]);
            for (int r = 0; r < LL_ROT; r++) { be->free(be, a.k[r]); be->free(be, a.v[r]); }
        }
        be->free(be, arena); be->free(be, a.gamma); be->free(be, a.inv_freq);
    }
}

/* ---- the GEMV's split-k, swept --------------------------------------------------------------
 * Every decode-shaped linear of the three models above (BLOOM-176B TP-8 rank, Llama-3.1-8B TP 1,
 * Llama-3.1-70B TP-8 rank), fp16, int8 per row and int8 in groups of 128, at 1, 8, 16 and (int8)
 * 32 tokens (the GEMV's 8-, 16- and 32-token tiles): µs per call with the split
 * chosen by the dispatch (auto) and with each split forced, so the rule can be read against the
 * best. Each matrix is copied until the copies pass 512 MB and the calls rotate over them: no call
 * finds its weights in L2. */
typedef struct { void *out, *in; pln_weight w[64]; int n; int32_t T; } rot_arg;
static int do_linear_rot(void *arg, int it)
{
    rot_arg *r = arg;
    return be->linear(be, r->out, r->in, &r->w[it % r->n], NULL, r->T, false);
}

static void gemv_splits(int from)
{
    static const struct { const char *model, *name; int64_t rows, cols; } shp[] = {
        {"bloom176b-tp8", "query_key_value", QKV, HID}, {"bloom176b-tp8", "dense", HID, HL},
        {"bloom176b-tp8", "dense_h_to_4h", FF, HID},    {"bloom176b-tp8", "dense_4h_to_h", HID, FF},
        {"llama3.1-8b-tp1", "qkv_proj", 6144, 4096},    {"llama3.1-8b-tp1", "o_proj", 4096, 4096},
        {"llama3.1-8b-tp1", "gate_up_proj", 28672, 4096}, {"llama3.1-8b-tp1", "down_proj", 4096, 14336},
        {"llama3.1-70b-tp8", "qkv_proj", 1280, 8192},   {"llama3.1-70b-tp8", "o_proj", 8192, 1024},
        {"llama3.1-70b-tp8", "gate_up_proj", 7168, 8192}, {"llama3.1-70b-tp8", "down_proj", 8192, 3584},
    };
    static const int splits[] = {0, 1, 2, 3, 4, 5, 6, 8, 12, 16};
    const int ns = (int)(sizeof splits / sizeof splits[0]);
    static const char *dn[3] = {"fp16", "int8", "int8g128"};
    rot_arg r;
    memset(&r, 0, sizeof r);
    r.in = dalloc((size_t)8 * 28672 * 2);
    r.out = dalloc((size_t)8 * 28672 * 2);
    fill(r.in, (size_t)8 * 28672, PLN_DTYPE_F16, -1, 1);
    printf("GEMV split-k swept (us per call; auto = the dispatch's choice; the matrices rotate past L2):\n");
    for (size_t si = (size_t)from; si < sizeof shp / sizeof shp[0]; si++) {
        for (int q = 0; q < 3; q++) {   /* fp16, int8 per row, int8 in groups of 128 */
            const int64_t R = shp[si].rows, C = shp[si].cols;
            const size_t one = (size_t)(R * C) * (q ? 1 : 2) + (q ? (size_t)R * (q == 2 ? C / 128 : 1) * 2 + 256 : 0) + 256;
            r.n = (int)((((size_t)512 << 20) + one - 1) / one);
            if (r.n < 2) r.n = 2;
            if (r.n > 64) r.n = 64;
            char *arena = dalloc(one * (size_t)r.n), *cur = arena;
            uint64_t wb = 0;
            for (int i = 0; i < r.n; i++) {
                if (q < 2) { r.w[i] = make_w(&cur, R, C, q == 1, &wb); continue; }
                pln_weight w = {PLN_DTYPE_I8, R, C, NULL, NULL, 128};
                w.w = cur; cur += pln_align_up((size_t)(R * C), 256);
                fill((void *)w.w, (size_t)(R * C), PLN_DTYPE_I8, 0, 0);
                w.scale = (const uint16_t *)cur; cur += pln_align_up((size_t)R * (C / 128) * 2, 256);
                fill((void *)w.scale, (size_t)R * (C / 128), PLN_DTYPE_F16, 1e-4f, 3e-4f);
                wb += (uint64_t)(R * C) + (uint64_t)R * (C / 128) * 2;
                r.w[i] = w;
            }
            /* the GEMV's token tiles: 8 (T 1 and 8), 16, 32 (quantized only: fp16 above 16 tokens is cuBLASLt's) */
            static const int32_t Ts[] = {1, 8, 16, 32};
            for (int ti = 0; ti < (q ? 4 : 3); ti++) {
                r.T = Ts[ti];
                double us[16], best = 1e30;
                int bi = 0;
                for (int k = 0; k < ns; k++) {
                    pln_cuda_set_gemv_splits(be, splits[k]);
                    us[k] = time_ms(do_linear_rot, &r, 2, 2 * r.n > 20 ? 2 * r.n : 20) * 1e3;
                    if (k > 0 && us[k] < best) { best = us[k]; bi = k; }
                }
                pln_cuda_set_gemv_splits(be, 0);
                const double gb = (double)wb / r.n;
                printf("  %-16s %-15s [%5lld x %5lld] %s T%d: auto %6.1f us (%4.0f GB/s); best split %2d %6.1f us (%4.0f GB/s);",
                       shp[si].model, shp[si].name, (long long)R, (long long)C, dn[q], r.T, us[0],
                       gb / (us[0] * 1e-6) / 1e9, splits[bi], best, gb / (best * 1e-6) / 1e9);
                for (int k = 1; k < ns; k++) printf(" %d:%.1f", splits[k], us[k]);
                printf("\n");
                char key[128];
                snprintf(key, sizeof key, "split_%s_%s_%s_T%d_auto_us", shp[si].model, shp[si].name, dn[q], r.T);
                result(key, us[0], "us");
                snprintf(key, sizeof key, "split_%s_%s_%s_T%d_best_us", shp[si].model, shp[si].name, dn[q], r.T);
                result(key, best, "us");
                snprintf(key, sizeof key, "split_%s_%s_%s_T%d_best_k", shp[si].model, shp[si].name, dn[q], r.T);
                result(key, splits[bi], "splits");
            }
            be->free(be, arena);
        }
    }
    be->free(be, r.in); be->free(be, r.out);
}

/* ---- loader ---------------------------------------------------------------------------------- */
static void load_hash(void *ctx, uint64_t at, const void *p, size_t n)
{
    (void)at;
    XXH3_64bits_update((XXH3_state_t *)ctx, p, n);
}

static int load(const char *path)
{
    struct stat sb;
    if (stat(path, &sb)) { perror(path); return 1; }
    void *d = dalloc((size_t)sb.st_size);
    double rate = 0, t0 = pln_now();
    if (be->load_file(be, d, path, 0, (uint64_t)sb.st_size, &rate, NULL, NULL)) DIE("load %s", path);
    double dt = pln_now() - t0;
    printf("load %s: %.2f GB in %.2f s = %.2f GB/s\n", path, sb.st_size / 1e9, dt, rate / 1e9);
    result("load_gbs", rate / 1e9, "GB/s");
    result("load_s", dt, "s");
    /* Again with a checksum of every byte while loading (what --verify costs; the file is in the
     * page cache by now, so compare with a warm load). */
    XXH3_state_t *hs = XXH3_createState();
    XXH3_64bits_reset(hs);
    double vrate = 0;
    if (be->load_file(be, d, path, 0, (uint64_t)sb.st_size, &vrate, load_hash, hs)) DIE("load %s", path);
    printf("load %s with XXH3 of every byte: %.2f GB/s (%016llx)\n", path, vrate / 1e9,
           (unsigned long long)XXH3_64bits_digest(hs));
    result("load_verify_gbs", vrate / 1e9, "GB/s");
    XXH3_freeState(hs);
    be->free(be, d);
    return 0;
}

int main(int argc, char **argv)
{
    bool quick = false;
    int ctx = 512, iters = 10;
    int batches[8] = {1, 8, 32, 128}, nb = 4;
    const char *load_path = NULL;
    int sweep_from = -1;   /* --sweep-only [N]: only the GEMV split sweep, from its shape N on */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--load") && i + 1 < argc) load_path = argv[++i];
        else if (!strcmp(argv[i], "--sweep-only")) sweep_from = i + 1 < argc && argv[i + 1][0] != '-' ? atoi(argv[++i]) : 0;
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            nb = 0;
            for (char *p = strtok(argv[++i], ","); p && nb < 8; p = strtok(NULL, ",")) batches[nb++] = atoi(p);
        } else { fprintf(stderr, "usage: bench_decode [--quick] [--ctx N] [--iters N] [--batches 1,8,..] | --load FILE | --sweep-only [N]\n"); return 2; }
    }
    const char *dev = getenv("PLN_CUDA_DEVICE");
    be = pln_backend_cuda_create(dev ? atoi(dev) : 0);
    if (!be) { printf("SKIP: no GPU (%s)\n", pln_error()); return 77; }
    st = (cudaStream_t)pln_cuda_stream(be);
    if (load_path) { int rc = load(load_path); be->destroy(be); return rc; }
    if (sweep_from >= 0) { gemv_splits(sweep_from); be->destroy(be); return 0; }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, pln_cuda_device(be));
    printf("device: %s, %d SMs, %.0f GB, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1e9, prop.major, prop.minor);
    printf("model: one TP-8 rank of BLOOM-176B (70 layers, hidden %d, %d heads of %d, 4H/8 %d, vocab %d); "
           "all-reduces are no-ops (single rank), context %d\n", HID, NHL, HD, FF, VR, ctx);
    ceilings();
    batch_linears();
    int4_tp1();
    llama_ops(ctx);
    for (int q = 0; q < 2; q++) {
        model_t m;
        model_make(&m, q == 1);
        printf("%s weights: %.2f GB per step\n", q ? "int8" : "fp16", m.weight_bytes / 1e9);
        result(q ? "weights_int8_gb" : "weights_fp16_gb", m.weight_bytes / 1e9, "GB");
        for (int i = 0; i < nb; i++) decode(&m, batches[i], ctx, quick ? 3 : iters);
        if (!quick) {
            prefill(&m, 512, false);
            prefill(&m, 512, true);
        }
        per_op(&m, 1, ctx);
        if (!quick) per_op(&m, 8, ctx);
        be->free(be, m.arena);
    }
    be->destroy(be);
    return 0;
}
