/* test_cuda_e2e.c — the engine on the CUDA backend at TP 1 against the transformers fixtures:
 * prefill logits at every position within rel L2 1e-2 (fp16 activations), the 20 greedy tokens of
 * HF generate identical, the four prompts batched (prefills and decodes of different lengths in
 * one step, so decode attention runs at several positions at once), int8 and int4 (groups of 32)
 * sets against the CPU engine on the same set, and decode steps replayed as CUDA graphs against
 * the same steps op by op; the Llama family (llama-gqa, qwen2-bias, llama3-tied, and mistral-sw
 * with a sliding window of 8) in fp16 against transformers too. Shard sets are made with `pollen reshard` from tests/fixtures. On the
 * CPU harness also the launch budget: kernels per layer of one decode step, from the launch log
 * (`--launches DIR`: only that, on a bloom-4h set, for tests/gpu/e2e_cuda_tp.sh at TP 2).
 *
 *   build/tests-gpu/test_cuda_e2e      (needs a GPU; SKIP without one or without `pollen reshard`)
 *   build/tests-gpu/test_cuda_e2e --cpu-as-gpu    the harness checking itself: "cpu" in place of "cuda"
 *   build/emu/tests-gpu/test_cuda_e2e  the same with every CUDA kernel run on the CPU (kernels/cuda/emu) */
#include "tests/test.h"
#include "tests/fixture_ref.h"
#include "tests/fixture_set.h"
#include "formats/safetensors.h"
#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#ifdef PLN_CUDA_EMU
#include "kernels/cuda/emu/emu.h"
#endif

#define V 1003
#define NGEN 20

static pln_comm *g_comm;
static const char *g_gpu = "cuda";   /* the backend under test */

static pln_engine *open_set(const char *dir, const char *backend)
{
    pln_engine_opts o;
    pln_engine_opts_default(&o);
    o.shard_dir = dir;
    o.backend = backend;
    o.device = getenv("PLN_CUDA_DEVICE") ? atoi(getenv("PLN_CUDA_DEVICE")) : 0;
    o.max_seqs = 8;
    o.max_seq_len = 64;
    o.block_size = 4;
    o.quiet = true;
    o.verify = true;
    pln_engine *e = pln_engine_open(&o, g_comm);
    if (!e) fprintf(stderr, "engine open %s (%s): %s\n", dir, backend, pln_error());
    return e;
}

/* Prefill logits of every prompt, each alone: out[i] [n_i, V]. */
static int prefills(pln_engine *e, const ref_t *r, float *out[NPROMPT])
{
    for (int i = 0; i < NPROMPT; i++) {
        pln_step_seq s = fixture_seq(0, r->ids[i], r->n[i], false);
        int32_t rel = 0;
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true, .n_release = 1, .release = &rel};
        pln_step_out o;
        if (pln_engine_step(e, &p, &o)) { fprintf(stderr, "step: %s\n", pln_error()); return -1; }
        memcpy(out[i], o.logits, (size_t)r->n[i] * V * 4);
    }
    int32_t z = 0;
    pln_step_plan pr = {.n_release = 1, .release = &z};
    return pln_engine_step(e, &pr, NULL);
}

/* Greedy continuations, prompt i joining at step i: gen[i][0..NGEN). */
static int greedy(pln_engine *e, const ref_t *r, int32_t gen[NPROMPT][NGEN])
{
    int32_t last[NPROMPT];
    int ng[NPROMPT] = {0};
    for (int step = 0; step < NGEN + NPROMPT - 1; step++) {
        pln_step_seq s[NPROMPT];
        int map[NPROMPT], ns = 0;
        for (int i = 0; i < NPROMPT; i++) {
            if (step < i || ng[i] >= NGEN) continue;
            s[ns] = step == i ? fixture_seq(4 + i, r->ids[i], r->n[i], true) : fixture_seq(4 + i, &last[i], 1, true);
            map[ns++] = i;
        }
        pln_step_plan p = {.n_seqs = ns, .seqs = s};
        pln_step_out o[NPROMPT];
        if (pln_engine_step(e, &p, o)) { fprintf(stderr, "greedy step %d: %s\n", step, pln_error()); return -1; }
        for (int j = 0; j < ns; j++) {
            int i = map[j];
            gen[i][ng[i]++] = o[j].token;
            last[i] = o[j].token;
        }
    }
    int32_t rel[NPROMPT] = {4, 5, 6, 7};
    pln_step_plan pr = {.n_release = NPROMPT, .release = rel};
    return pln_engine_step(e, &pr, NULL);
}

static void check_fp16(const char *label, const char *dir, const ref_t *r)
{
    pln_engine *e = open_set(dir, g_gpu);
    CHECK(e != NULL, "%s: engine opens on %s", label, g_gpu);
    if (!e) return;
    float *got[NPROMPT];
    for (int i = 0; i < NPROMPT; i++) got[i] = pln_xmalloc((size_t)r->n[i] * V * 4);
    int rc = prefills(e, r, got);
    CHECK(rc == 0, "%s: prefills", label);
    for (int i = 0; i < NPROMPT && rc == 0; i++) {
        double rel = test_rel_l2(got[i], r->logits[i], (size_t)r->n[i] * V);
        printf("%s %s fp16 prompt%d logits vs transformers: rel L2 %.3g %s\n", label, g_gpu, i, rel, rel <= 1e-2 ? "OK" : "NOT OK");
        CHECK(rel <= 1e-2, "%s: prompt%d rel L2 %.3g > 1e-2", label, i, rel);
    }
    int32_t gen[NPROMPT][NGEN];
    rc = greedy(e, r, gen);
    CHECK(rc == 0, "%s: greedy", label);
    for (int i = 0; i < NPROMPT && rc == 0; i++) {
        int same = r->gn[i] >= r->n[i] + NGEN;
        for (int t = 0; t < NGEN && same; t++) same = gen[i][t] == r->gids[i][r->n[i] + t];
        printf("%s %s fp16 greedy%d: ids %s %s\n", label, g_gpu, i, same ? "identical" : "DIFFER", same ? "OK" : "NOT OK");
        CHECK(same, "%s: greedy%d ids differ from transformers", label, i);
    }
    for (int i = 0; i < NPROMPT; i++) free(got[i]);
    pln_engine_close(e);
}

/* int8 (or int4) on cuda against the same set on cpu (the same quantized weights): rel L2 <= 1e-2,
 * same greedy ids.
 * One engine at a time: both would attach to the one comm. */
static int run_int8(const char *dir, const char *backend, const ref_t *r, float *lg[NPROMPT], int32_t gen[NPROMPT][NGEN])
{
    pln_engine *e = open_set(dir, backend);
    if (!e) return -1;
    int rc = prefills(e, r, lg);
    if (!rc) rc = greedy(e, r, gen);
    pln_engine_close(e);
    return rc;
}

static void check_int8(const char *label, const char *dir, const ref_t *r)
{
    float *a[NPROMPT], *b[NPROMPT];
    for (int i = 0; i < NPROMPT; i++) { a[i] = pln_xmalloc((size_t)r->n[i] * V * 4); b[i] = pln_xmalloc((size_t)r->n[i] * V * 4); }
    int32_t ga[NPROMPT][NGEN], gb[NPROMPT][NGEN];
    int rc = run_int8(dir, "cpu", r, a, ga);
    CHECK(rc == 0, "%s: int8 on cpu", label);
    if (!rc) {
        rc = run_int8(dir, g_gpu, r, b, gb);
        CHECK(rc == 0, "%s: int8 on cuda", label);
    }
    for (int i = 0; i < NPROMPT && rc == 0; i++) {
        double rel = test_rel_l2(b[i], a[i], (size_t)r->n[i] * V);
        printf("%s %s int8 prompt%d logits vs cpu int8: rel L2 %.3g %s\n", label, g_gpu, i, rel, rel <= 1e-2 ? "OK" : "NOT OK");
        CHECK(rel <= 1e-2, "%s: int8 prompt%d rel L2 %.3g > 1e-2", label, i, rel);
    }
    if (rc == 0) {
        int same = memcmp(ga, gb, sizeof ga) == 0;
        printf("%s %s int8 greedy ids vs cpu int8: %s %s\n", label, g_gpu, same ? "identical" : "DIFFER", same ? "OK" : "NOT OK");
        CHECK(same, "%s: int8 greedy ids differ between cuda and cpu", label);
    }
    for (int i = 0; i < NPROMPT; i++) { free(a[i]); free(b[i]); }
}

/* Decode steps replayed as CUDA graphs (the default) against the same steps op by op
 * (PLN_GRAPHS=0): the four prompts prefilled together, then 12 decode steps at batch 4 with every
 * row's logits kept. The graph run's attention covers a rounded-up key range (empty splits), so
 * the sums are not bit-identical: rel L2 <= 1e-3 and identical greedy ids. */
static int decode_run(const char *dir, const ref_t *r, const char *graphs, float *out, int32_t *toks)
{
    setenv("PLN_GRAPHS", graphs, 1);
    pln_engine *e = open_set(dir, g_gpu);
    setenv("PLN_GRAPHS", "1", 1);
    if (!e) return -1;
    int32_t last[NPROMPT];
    size_t at = 0;
    int rc = 0, nt = 0;
    for (int step = 0; step < 13 && !rc; step++) {
        pln_step_seq s[NPROMPT];
        for (int i = 0; i < NPROMPT; i++)
            s[i] = step == 0 ? fixture_seq(i, r->ids[i], r->n[i], true) : fixture_seq(i, &last[i], 1, true);
        pln_step_plan p = {.n_seqs = NPROMPT, .seqs = s, .want_logits = true};
        pln_step_out o[NPROMPT];
        rc = pln_engine_step(e, &p, o);
        if (rc) { fprintf(stderr, "decode step %d: %s\n", step, pln_error()); break; }
        for (int i = 0; i < NPROMPT; i++) {
            last[i] = o[i].token;
            toks[nt++] = o[i].token;
            if (step > 0) { memcpy(out + at, o[i].logits, (size_t)V * 4); at += V; }
        }
    }
    pln_engine_close(e);
    return rc;
}

static void check_graphs(const char *label, const char *dir, const ref_t *r)
{
    size_t n = (size_t)12 * NPROMPT * V;
    float *a = pln_xmalloc(n * 4), *b = pln_xmalloc(n * 4);
    int32_t ta[13 * NPROMPT], tb[13 * NPROMPT];
    int rc = decode_run(dir, r, "0", a, ta);
    CHECK(rc == 0, "%s: decode op by op", label);
    if (!rc) {
        rc = decode_run(dir, r, "1", b, tb);
        CHECK(rc == 0, "%s: decode with graphs", label);
    }
    if (!rc) {
        double rel = test_rel_l2(b, a, n);
        int same = memcmp(ta, tb, sizeof ta) == 0;
        printf("%s %s decode as graphs vs op by op: logits rel L2 %.3g, ids %s %s\n", label, g_gpu, rel,
               same ? "identical" : "DIFFER", rel <= 1e-3 && same ? "OK" : "NOT OK");
        CHECK(rel <= 1e-3, "%s: graph decode logits rel L2 %.3g > 1e-3", label, rel);
        CHECK(same, "%s: graph decode ids differ from op by op", label);
    }
    free(a);
    free(b);
}

#ifdef PLN_CUDA_EMU
/* Kernel launches per layer of one decode step (batch 1, op by op) may not exceed this: a kernel
 * added to the layer loop fails the test; a fusion lowers it (docs/CUDA.md "Launch budget"). The
 * all-reduces are not counted (NCCL does not run on the harness; on a GPU they add 2 per layer at
 * TP > 1). */
#define LAUNCH_BUDGET_PER_LAYER 7
/* The Llama family's layer: qkv GEMV (biases in its epilogue), rotary, attention with the KV
 * append fused, o_proj GEMV, residual + RMSNorm, gate|up GEMV with SwiGLU in its epilogue, down_proj
 * GEMV, residual + RMSNorm (9 with SwiGLU as a launch of its own). */
#define LAUNCH_BUDGET_PER_LAYER_LLAMA 8

/* The launch budget of one decode step (batch 1, position n, op by op) from the harness's launch
 * log: the launches between the first layer's norm and gather_rows (the logits' rows), divided by
 * the layers; head: the launches before the first layer (BLOOM: the embedding and its two
 * LayerNorms, 3; Llama: the embedding and the first RMSNorm, 2). Run at TP 1 here and at TP 2
 * under mpirun (--launches DIR, from tests/gpu/e2e_cuda_tp.sh). */
static void check_launches(const char *label, const char *dir, const ref_t *r, size_t head, int budget)
{
    setenv("PLN_GRAPHS", "0", 1);
    pln_engine *e = open_set(dir, g_gpu);
    setenv("PLN_GRAPHS", "1", 1);
    CHECK(e != NULL, "%s: engine opens", label);
    if (!e) return;
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    if (pln_comm_rank(g_comm) != 0) {   /* TP > 1: the other ranks follow rank 0's steps */
        CHECK(pln_engine_worker_loop(e) == 0, "%s: worker: %s", label, pln_error());
        pln_engine_close(e);
        return;
    }
    pln_step_seq s = fixture_seq(0, r->ids[0], r->n[0], true);
    pln_step_plan p = {.n_seqs = 1, .seqs = &s};
    pln_step_out o;
    int rc = pln_engine_step(e, &p, &o);
    CHECK(rc == 0, "%s: prefill: %s", label, rc ? pln_error() : "");
    int32_t tok = o.token;
    const size_t n0 = pln_emu_launch_count();
    s = fixture_seq(0, &tok, 1, true);
    if (!rc) rc = pln_engine_step(e, &p, &o);
    CHECK(rc == 0, "%s: decode step: %s", label, rc ? pln_error() : "");
    const size_t n = pln_emu_launch_count() - n0;
    size_t gather = 0;
    for (size_t i = 0; i < n && !gather; i++)
        if (strstr(pln_emu_launch_at(n0 + i)->kernel, "gather")) gather = i;
    const char *k0 = n ? pln_emu_launch_at(n0)->kernel : "";
    CHECK(rc == 0 && gather > head && strstr(k0, "embed"), "%s: the step starts with the embedding (%s) and gathers the "
          "logits' rows (launch %zu of %zu)", label, k0, gather, n);
    double per_layer = gather > head ? (double)(gather - head) / (double)info.n_layer : 1e9;
    printf("%s %s TP %d decode step at batch 1: %zu launches, %.2f per layer (budget %d) %s\n", label, g_gpu, info.tp, n,
           per_layer, budget, per_layer <= budget ? "OK" : "NOT OK");
    for (size_t i = 0; i < n; i++) {
        const pln_emu_launch_rec *l = pln_emu_launch_at(n0 + i);
        if (i < gather && i >= head && i < head + (gather - head) / (size_t)info.n_layer)
            printf("  layer 0 launch: %s grid %u,%u,%u block %u\n", l->kernel, l->grid[0], l->grid[1], l->grid[2], l->block[0]);
    }
    CHECK(per_layer <= budget, "%s: %.2f launches per layer > budget %d", label, per_layer, budget);
    pln_engine_shutdown(e);
    pln_engine_close(e);
}
#endif

int main(int argc, char **argv)
{
    test_begin("test_cuda_e2e");
    if (argc > 1 && !strcmp(argv[1], "--cpu-as-gpu")) g_gpu = "cpu";
    pln_backend *probe = pln_backend_create(g_gpu, 0);
    if (!probe) { printf("SKIP: no GPU (%s)\n", pln_error()); return 77; }
    pln_backend_destroy(probe);
    if (!fixture_can_reshard()) {
        printf("SKIP: this build has no `pollen reshard` (needed to make shard sets from the fixtures)\n");
        return 77;
    }
    g_comm = pln_comm_init(&argc, &argv);
#ifdef PLN_CUDA_EMU
    printf("%s\n", pln_emu_not_exercised());
    if (argc > 2 && !strcmp(argv[1], "--launches")) {   /* only the launch budget, on the set argv[2] (bloom-4h) */
        ref_t r;
        if (ref_open(&r, "tests/fixtures/models/bloom-4h/reference-f16.safetensors")) CHECK(0, "bloom-4h: reference opens");
        else { check_launches("bloom-4h", argv[2], &r, 3, LAUNCH_BUDGET_PER_LAYER); pln_safetensors_close(&r.st); }
        pln_comm_free(g_comm);
        return test_done();
    }
#endif
    struct { const char *model, *src; } sets[] = {{"bloom-4h", "fp16-st"}, {"bloom-6h", "fp16-bin"}};
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        char label[64], path[256];
        snprintf(label, sizeof label, "%s/%s", sets[k].model, sets[k].src);
        snprintf(path, sizeof path, "tests/fixtures/models/%s/reference-f16.safetensors", sets[k].model);
        ref_t r;
        if (ref_open(&r, path)) { CHECK(0, "%s: reference opens", label); continue; }
        char *dir = fixture_reshard(sets[k].model, sets[k].src, 1, "fp16");
        CHECK(dir != NULL, "%s: reshard fp16", label);
        if (dir) check_fp16(label, dir, &r);
        if (dir) check_graphs(label, dir, &r);
#ifdef PLN_CUDA_EMU
        if (dir) check_launches(label, dir, &r, 3, LAUNCH_BUDGET_PER_LAYER);
#endif
        if (dir && k == 0) {   /* LayerNorm rows over several blocks (two launches each), prefill and graphs */
            char ls[96];
            snprintf(ls, sizeof ls, "%s ln-split", label);
            setenv("PLN_CUDA_LN_SPLIT", "1", 1);
            check_fp16(ls, dir, &r);
            check_graphs(ls, dir, &r);
            unsetenv("PLN_CUDA_LN_SPLIT");
        }
        free(dir);
        dir = fixture_reshard(sets[k].model, sets[k].src, 1, "int8");
        CHECK(dir != NULL, "%s: reshard int8", label);
        if (dir) check_int8(label, dir, &r);
        free(dir);
        /* int4 in groups of 32: the fixtures' 64/96-column matrices take the plain int4 kernel,
         * dense_4h_to_h (256/384 columns) the int4 GEMV and GEMM */
        dir = pln_xasprintf("%s/%s-%s-tp1-int4g32", test_tmpdir(), sets[k].model, sets[k].src);
        char *cmd = pln_xasprintf("%s/pollen reshard tests/fixtures/models/%s/%s -o %s --tp 1 --dtype int4 --group-size 32 --quiet",
                                  fixture_build(), sets[k].model, sets[k].src, dir);
        int src = system(cmd);
        CHECK(src == 0, "%s: %s", label, cmd);
        char l4[96];
        snprintf(l4, sizeof l4, "%s int4 g32", label);
        if (src == 0) check_int8(l4, dir, &r);
        free(cmd);
        free(dir);
        pln_safetensors_close(&r.st);
    }
    /* The Llama family (RMSNorm, rotary, SwiGLU, grouped-query attention): fp16 against transformers'
     * fp32 forward with BLOOM's bounds. llama-gqa: 8 q / 2 KV heads, untied head (its bf16 weights
     * become fp16 exactly, so reference-bf16), and grouped decode as graphs; qwen2-bias: q/k/v
     * biases from fp32 weights; llama3-tied: one KV head, llama3 rotary scaling, tied head. Graphs
     * on one set only: on the harness they cost 5 s a set. int8 (per row) and int4 (groups of 32)
     * sets against the CPU engine on the same set, as BLOOM's, and the launch budget, on
     * llama-gqa and qwen2-bias. */
    struct { const char *model, *src, *ref; bool graphs, quant; } lsets[] = {
        {"llama-gqa", "bf16-st", "reference-bf16", true, true},
        {"qwen2-bias", "fp32-bin", "reference-f16", false, true},
        {"llama3-tied", "fp16-bin", "reference-f16", false, false},
    };
    for (size_t k = 0; k < sizeof lsets / sizeof lsets[0]; k++) {
        char label[64], path[256];
        snprintf(label, sizeof label, "%s/%s", lsets[k].model, lsets[k].src);
        snprintf(path, sizeof path, "tests/fixtures/models/%s/%s.safetensors", lsets[k].model, lsets[k].ref);
        ref_t r;
        if (ref_open(&r, path)) { CHECK(0, "%s: reference opens", label); continue; }
        char *dir = fixture_reshard(lsets[k].model, lsets[k].src, 1, "fp16");
        CHECK(dir != NULL, "%s: reshard fp16", label);
        if (dir) check_fp16(label, dir, &r);
        if (dir && lsets[k].graphs) check_graphs(label, dir, &r);
#ifdef PLN_CUDA_EMU
        if (dir && lsets[k].quant) check_launches(label, dir, &r, 2, LAUNCH_BUDGET_PER_LAYER_LLAMA);
#endif
        free(dir);
        if (lsets[k].quant) {
            dir = fixture_reshard(lsets[k].model, lsets[k].src, 1, "int8");
            CHECK(dir != NULL, "%s: reshard int8", label);
            if (dir) check_int8(label, dir, &r);
            free(dir);
            dir = pln_xasprintf("%s/%s-%s-tp1-int4g32", test_tmpdir(), lsets[k].model, lsets[k].src);
            char *cmd = pln_xasprintf("%s/pollen reshard tests/fixtures/models/%s/%s -o %s --tp 1 --dtype int4 --group-size 32 "
                                      "--quiet", fixture_build(), lsets[k].model, lsets[k].src, dir);
            int src = system(cmd);
            CHECK(src == 0, "%s: %s", label, cmd);
            char l4[96];
            snprintf(l4, sizeof l4, "%s int4 g32", label);
            if (src == 0) check_int8(l4, dir, &r);
            free(cmd);
            free(dir);
        }
        pln_safetensors_close(&r.st);
    }
    /* Mistral's sliding window: the mistral-sw weights with config.json's sliding_window set to 8
     * (weights unchanged) against transformers' reference-f16-window8, whose prompts and greedy
     * tokens run past the window; decode as graphs too (the window is a kernel argument they keep). */
    {
        const char *label = "mistral-sw/fp16-st window 8";
        ref_t r;
        if (ref_open(&r, "tests/fixtures/models/mistral-sw/reference-f16-window8.safetensors")) {
            CHECK(0, "%s: reference opens", label);
        } else {
            char *src = pln_xasprintf("%s/mistral-sw-window8", test_tmpdir());
            char *dir = pln_xasprintf("%s-tp1-fp16", src);
            char *cmd = pln_xasprintf("rm -rf %s && cp -r tests/fixtures/models/mistral-sw/fp16-st %s && "
                                      "sed -i 's/\"sliding_window\": 4096/\"sliding_window\": 8/' %s/config.json && "
                                      "grep -q '\"sliding_window\": 8' %s/config.json && "
                                      "%s/pollen reshard %s -o %s --tp 1 --dtype fp16 --quiet",
                                      src, src, src, src, fixture_build(), src, dir);
            int rc = system(cmd);
            CHECK(rc == 0, "%s: %s", label, cmd);
            if (rc == 0) {
                check_fp16(label, dir, &r);
                check_graphs(label, dir, &r);
            }
            free(cmd);
            free(dir);
            free(src);
            pln_safetensors_close(&r.st);
        }
    }
#ifdef PLN_CUDA_EMU
    printf("%zu kernel launches ran on the CPU harness, %zu reports\n", pln_emu_launch_count(), pln_emu_report_count());
    CHECK(pln_emu_launch_count() > 0 && pln_emu_report_count() == 0, "harness: %zu launches, %zu reports (last: %s)",
          pln_emu_launch_count(), pln_emu_report_count(), pln_emu_last_report());
#endif
    pln_comm_free(g_comm);
    return test_done();
}
