/* test_engine.c — the CPU runtime end to end at TP 1, in process, against the transformers
 * fixtures: prefill logits at every position, 20-step greedy continuations with log-probs,
 * batches of different lengths at different positions, chunked prefill, the left-padded batch
 * reference, int8 shards within a bound derived from the recorded quantization error, sampling,
 * invalid plans, an injected forward failure and injected NaN logits.
 *
 * Also the comparison helper of tests/e2e_generate.sh (TP > 1 runs under mpirun write their logits
 * with `pollen generate --dump-logits`):
 *   test_engine --cmp-dump A.safetensors B.safetensors TOL       rel L2 of "logits" A vs B <= TOL
 *   test_engine --cmp-ref DUMP REF.safetensors I TOL             rows of prompt I's prefill vs
 *                                                                REF's prompt{I}.logits */
#include "tests/test.h"
#include "tests/fixture_ref.h"
#include "tests/fixture_set.h"
#include "formats/safetensors.h"
#include "formats/shard.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/kvcache.h"

#include <jansson.h>
#include <malloc.h>

#define V 1003

static pln_comm *g_comm;
static const char *g_kv_dtype;   /* the engines' --kv-dtype (NULL: the backend's own, f32 on cpu) */
static bool g_batch_invariant;   /* the engines' --batch-invariant */
static const char *g_backend;    /* the engines' backend (NULL: cpu) */

/* "cpu-noswiglu": the CPU backend without the SwiGLU epilogue (linear_swiglu false), so the Llama
 * model runs linear then the swiglu op, as on a backend that lacks the epilogue. The copy shares
 * the CPU backend's context. */
static pln_backend *g_noswiglu_inner;
static void noswiglu_destroy(pln_backend *be) {
    g_noswiglu_inner->destroy(g_noswiglu_inner);
    free(be);
}
static pln_backend *noswiglu_create(int device) {
    (void)device;
    pln_backend *in = pln_backend_cpu_create();
    if (!in) return NULL;
    pln_backend *be = pln_xmalloc(sizeof *be);
    *be = *in;
    be->name = "cpu-noswiglu";
    be->linear_swiglu = false;
    be->destroy = noswiglu_destroy;
    g_noswiglu_inner = in;
    return be;
}

static pln_engine *open_set(const char *dir, int fail_at, int64_t kv_tokens) {
    pln_engine_opts o;
    pln_engine_opts_default(&o);
    o.shard_dir = dir;
    o.max_seqs = 8;
    o.max_seq_len = 64;
    o.block_size = 4;    /* small blocks: sequences span several, exercising the block tables */
    o.kv_tokens = kv_tokens;
    o.quiet = true;
    o.verify = true;
    o.fail_at_step = fail_at;
    o.kv_dtype = g_kv_dtype;
    o.batch_invariant = g_batch_invariant;
    if (g_backend) o.backend = g_backend;
    pln_engine *e = pln_engine_open(&o, g_comm);
    if (!e) fprintf(stderr, "engine open %s: %s\n", dir, pln_error());
    return e;
}

/* Prefill of prompt i alone (released after): logits [n, V] copied into out. */
static int prefill_alone(pln_engine *e, const ref_t *r, int i, float *out) {
    pln_step_seq s = fixture_seq(0, r->ids[i], r->n[i], false);
    int32_t rel = 0;
    pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true, .n_release = 1, .release = &rel};
    pln_step_out o;
    if (pln_engine_step(e, &p, &o)) { fprintf(stderr, "step: %s\n", pln_error()); return -1; }
    memcpy(out, o.logits, (size_t)r->n[i] * V * 4);
    return 0;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (d > m) m = d; }
    return m;
}

/* Fidelity of one fp16 set against its reference; prefill logits (all prompts) go to alone[]. */
static void check_set(const char *label, const char *dir, const ref_t *r, float *alone[NPROMPT], double tol) {
    pln_engine *e = open_set(dir, 0, 0);
    CHECK(e != NULL, "%s: engine opens", label);
    if (!e) return;
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    CHECK(info.n_vocab == V && info.tp == 1, "%s: info vocab %lld tp %d", label, (long long)info.n_vocab, info.tp);
    CHECK(info.kv_dtype && !strcmp(info.kv_dtype, g_kv_dtype ? g_kv_dtype : "f32"), "%s: info kv_dtype %s", label,
          info.kv_dtype ? info.kv_dtype : "(null)");
    int64_t free0 = info.kv_blocks_free;

    /* Prefill logits at every position, each prompt alone. */
    for (int i = 0; i < NPROMPT; i++) {
        if (prefill_alone(e, r, i, alone[i])) { CHECK(0, "%s: prefill %d", label, i); continue; }
        double rel = test_rel_l2(alone[i], r->logits[i], (size_t)r->n[i] * V);
        printf("%s prompt%d prefill logits rel L2 %.3g (max |diff| %.3g) %s\n", label, i, rel,
               max_abs_diff(alone[i], r->logits[i], (size_t)r->n[i] * V), rel <= tol ? "OK" : "NOT OK");
        CHECK(rel <= tol, "%s: prompt%d prefill rel L2 %.3g > %.3g", label, i, rel, tol);
    }

    /* The same prompts as one batched step: every row equals the prompt alone, bit for bit in the
     * batch-invariant mode; otherwise the batch (more tokens than each prompt) may take the
     * batched float path, whose sums are ordered differently (kernels/cpu/cpu.h): fp32 rounding,
     * which an F16 KV cache can turn into one f16 step (2^-11 relative) of a cached element where
     * the two values fall on either side of a rounding boundary (bloom-6h on the AVX2 panel:
     * 1.2e-5 and 2.3e-5), hence its looser bound. */
    double batch_tol = g_kv_dtype && !strcmp(g_kv_dtype, "f16") ? 1e-4 : 1e-5;
    {
        pln_step_seq s[NPROMPT];
        for (int i = 0; i < NPROMPT; i++) s[i] = fixture_seq(i, r->ids[i], r->n[i], false);
        int32_t rel[NPROMPT] = {0, 1, 2, 3};
        /* prefill_alone leaves slot 0 holding its last prompt: free it before this step. */
        pln_step_plan p = {.n_seqs = NPROMPT, .seqs = s, .want_logits = true, .n_release = 1, .release = rel};
        pln_step_out o[NPROMPT];
        int rc = pln_engine_step(e, &p, o);
        CHECK(rc == 0, "%s: batched prefill: %s", label, pln_error());
        for (int i = 0; i < NPROMPT && rc == 0; i++) {
            double d = test_rel_l2(o[i].logits, alone[i], (size_t)r->n[i] * V);
            if (g_batch_invariant)
                CHECK(!memcmp(o[i].logits, alone[i], (size_t)r->n[i] * V * 4),
                      "%s: batched prefill row %d is not alone's bits: rel %.3g", label, i, d);
            else
                CHECK(d <= batch_tol, "%s: batched prefill row %d differs from alone: rel %.3g (bound %g)", label, i, d,
                      batch_tol);
        }
        pln_step_plan pr = {.n_release = NPROMPT, .release = rel};
        CHECK(pln_engine_step(e, &pr, NULL) == 0, "%s: release", label);
    }

    /* Chunked prefill (3 tokens, then the rest) gives the same logits. */
    {
        int i = 3, c = 3;
        pln_step_seq s = fixture_seq(5, r->ids[i], c, false);
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true};
        pln_step_out o;
        float *got = pln_xmalloc((size_t)r->n[i] * V * 4);
        int rc = pln_engine_step(e, &p, &o);
        if (!rc) memcpy(got, o.logits, (size_t)c * V * 4);
        s = fixture_seq(5, r->ids[i] + c, r->n[i] - c, false);
        if (!rc) rc = pln_engine_step(e, &p, &o);
        if (!rc) memcpy(got + (size_t)c * V, o.logits, (size_t)(r->n[i] - c) * V * 4);
        CHECK(rc == 0, "%s: chunked prefill: %s", label, pln_error());
        double d = test_rel_l2(got, alone[i], (size_t)r->n[i] * V);
        CHECK(d <= 1e-6, "%s: chunked prefill differs: rel %.3g", label, d);
        int32_t five = 5;
        pln_step_plan pr = {.n_release = 1, .release = &five};
        pln_engine_step(e, &pr, NULL);
        free(got);
    }

    /* Greedy: sequence i joins at step i, so steps mix prefills and decodes of different lengths
     * at different positions. Each must reproduce HF generate's 20 tokens and log-probs. */
    {
        int32_t gen[NPROMPT][20], last[NPROMPT];
        float lp[NPROMPT][20];
        int ng[NPROMPT] = {0};
        bool fail = false;
        for (int step = 0; step < 20 + NPROMPT - 1 && !fail; step++) {
            pln_step_seq s[NPROMPT];
            int map[NPROMPT], ns = 0;
            for (int i = 0; i < NPROMPT; i++) {
                if (step < i || ng[i] >= 20) continue;
                if (step == i) s[ns] = fixture_seq(4 + i, r->ids[i], r->n[i], true);
                else s[ns] = fixture_seq(4 + i, &last[i], 1, true);
                s[ns].slot = 4 + i;
                map[ns++] = i;
            }
            pln_step_plan p = {.n_seqs = ns, .seqs = s};
            pln_step_out o[NPROMPT];
            if (pln_engine_step(e, &p, o)) { fail = true; CHECK(0, "%s: greedy step %d: %s", label, step, pln_error()); break; }
            for (int j = 0; j < ns; j++) {
                int i = map[j];
                gen[i][ng[i]] = o[j].token;
                lp[i][ng[i]] = o[j].logprob;
                ng[i]++;
                last[i] = o[j].token;
            }
        }
        for (int i = 0; i < NPROMPT && !fail; i++) {
            int same = 1;
            double maxlp = 0;
            for (int t = 0; t < 20; t++) {
                if (gen[i][t] != r->gids[i][r->n[i] + t]) same = 0;
                double d = fabs(lp[i][t] - r->glp[i][t]);
                if (d > maxlp) maxlp = d;
            }
            printf("%s greedy%d: ids %s, logprob max |diff| %.3g\n", label, i, same ? "identical" : "DIFFER", maxlp);
            CHECK(same, "%s: greedy%d ids differ from transformers", label, i);
            CHECK(maxlp <= 2 * tol, "%s: greedy%d logprob max diff %.3g > %.3g", label, i, maxlp, 2 * tol);
        }
        int32_t rel[NPROMPT] = {4, 5, 6, 7};
        pln_step_plan pr = {.n_release = NPROMPT, .release = rel};
        CHECK(pln_engine_step(e, &pr, NULL) == 0, "%s: release", label);
        /* Each sequence decoded alone gives what it gave inside the mixed batch. */
        for (int i = 0; i < NPROMPT && !fail; i++) {
            int32_t lt = 0;
            double maxd = 0;
            int same = 1;
            for (int t = 0; t < 20; t++) {
                pln_step_seq s1 = t == 0 ? fixture_seq(6, r->ids[i], r->n[i], true) : fixture_seq(6, &lt, 1, true);
                int32_t six = 6;
                pln_step_plan p1 = {.n_seqs = 1, .seqs = &s1, .n_release = t == 0, .release = &six};
                pln_step_out o1;
                if (pln_engine_step(e, &p1, &o1)) { same = 0; break; }
                if (o1.token != gen[i][t]) same = 0;
                if (fabs(o1.logprob - lp[i][t]) > maxd) maxd = fabs(o1.logprob - lp[i][t]);
                lt = o1.token;
            }
            CHECK(same && maxd <= 1e-5, "%s: seq %d alone vs in the batch: ids %s, logprob diff %.3g", label, i,
                  same ? "same" : "DIFFER", maxd);
        }
        int32_t six = 6;
        pln_step_plan p6 = {.n_release = 1, .release = &six};
        pln_engine_step(e, &p6, NULL);
    }

    /* The left-padded batch reference, at its real positions. */
    {
        for (int64_t b = 0; b < r->B; b++) {
            int32_t toks[64];
            int64_t where[64];
            int32_t n = 0;
            for (int64_t j = 0; j < r->L && n < 64; j++)
                if (r->bmask[b * r->L + j]) { where[n] = j; toks[n++] = r->bids[b * r->L + j]; }
            pln_step_seq s = fixture_seq(0, toks, n, false);
            int32_t rel = 0;
            pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true, .n_release = 1, .release = &rel};
            pln_step_out o;
            if (pln_engine_step(e, &p, &o)) { CHECK(0, "%s: batch row %lld: %s", label, (long long)b, pln_error()); continue; }
            double num = 0, den = 0;
            for (int32_t t = 0; t < n; t++) {
                const float *want = r->blogits + ((size_t)b * r->L + (size_t)where[t]) * V;
                for (int v = 0; v < V; v++) { double d = o.logits[(size_t)t * V + v] - want[v]; num += d * d; den += (double)want[v] * want[v]; }
            }
            double relv = sqrt(num / den);
            CHECK(relv <= tol, "%s: left-padded batch row %lld rel L2 %.3g > %.3g", label, (long long)b, relv, tol);
        }
        int32_t z = 0;
        pln_step_plan pr = {.n_release = 1, .release = &z};
        pln_engine_step(e, &pr, NULL);
    }
    pln_engine_get_info(e, &info);
    CHECK(info.kv_blocks_free == free0, "%s: every KV block is free again (%lld of %lld)", label,
          (long long)info.kv_blocks_free, (long long)free0);
    pln_engine_close(e);
}

/* int8 vs fp16 shards: the bound comes from the recorded quantization errors (see the comment
 * in docs/ARCHITECTURE.md, "int8 fidelity"). */
static void check_int8(const char *label, const char *dir8, const ref_t *r, float *fp16[NPROMPT]) {
    pln_shardset *set = pln_shardset_open(dir8);
    CHECK(set != NULL, "%s: int8 set opens: %s", label, pln_error());
    if (!set) return;
    double sum2 = 0;
    int n_q = 0;
    json_t *tens = json_object_get(set->json, "tensors");
    const char *k;
    json_t *v;
    json_object_foreach(tens, k, v) {
        json_t *q = json_object_get(v, "quant_rel_rms");
        if (json_is_number(q)) { double x = json_number_value(q); sum2 += x * x; n_q++; }
    }
    pln_shardset_close(set);
    double eps = sqrt(sum2);
    double bound = 2.0 * eps;
    CHECK(n_q == 8, "%s: manifest records the quantization error of 8 linear weights (found %d)", label, n_q);
    pln_engine *e = open_set(dir8, 0, 0);
    CHECK(e != NULL, "%s: int8 engine opens", label);
    if (!e) return;
    float *got = pln_xmalloc(32 * V * 4);
    double num = 0, den = 0;
    for (int i = 0; i < NPROMPT; i++) {
        if (prefill_alone(e, r, i, got)) { CHECK(0, "%s: int8 prefill %d", label, i); continue; }
        for (size_t j = 0; j < (size_t)r->n[i] * V; j++) { double d = (double)got[j] - fp16[i][j]; num += d * d; den += (double)fp16[i][j] * fp16[i][j]; }
    }
    double rel = sqrt(num / den);
    printf("%s int8 vs fp16 logits rel L2 %.4g; sqrt(sum eps_i^2) = %.4g over %d weights; bound 2x = %.4g %s\n",
           label, rel, eps, n_q, bound, rel <= bound ? "OK" : "NOT OK");
    CHECK(rel <= bound, "%s: int8 rel L2 %.4g > bound %.4g", label, rel, bound);
    CHECK(rel > 0, "%s: int8 logits differ from fp16 at all", label);
    free(got);
    pln_engine_close(e);
}

/* A flipped byte inside a tensor: --verify refuses the set naming the tensor; without it the
 * loader (which never reads data at open) still opens it. */
static void check_corrupt(const char *dir) {
    pln_shardset *set = pln_shardset_open(dir);
    pln_shard *sh = set ? pln_shardset_open_rank(set, 0) : NULL;
    const pln_shard_tensor *t = sh ? pln_shard_find(sh, "h.1.mlp.dense_4h_to_h.weight") : NULL;
    CHECK(t != NULL, "corrupt: find a tensor: %s", pln_error());
    if (!t) { pln_shard_close(sh); pln_shardset_close(set); return; }
    uint64_t off = t->offset + t->nbytes / 2;
    char *path = pln_xstrdup(sh->path);
    pln_shard_close(sh);
    pln_shardset_close(set);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "corrupt: open %s", path);
    if (!f) { free(path); return; }
    fseeko(f, (off_t)off, SEEK_SET);
    int c = fgetc(f);
    fseeko(f, (off_t)off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    free(path);
    pln_engine *e = open_set(dir, 0, 0);   /* open_set verifies */
    CHECK(e == NULL && strstr(pln_error(), "dense_4h_to_h") && strstr(pln_error(), "checksum"),
          "a corrupted tensor fails --verify, naming it: %s", pln_error());
    pln_engine_close(e);
    pln_engine_opts o;
    pln_engine_opts_default(&o);
    o.shard_dir = dir;
    o.max_seqs = 2;
    o.max_seq_len = 32;
    o.quiet = true;
    e = pln_engine_open(&o, g_comm);
    CHECK(e != NULL, "without --verify the set opens: %s", e ? "" : pln_error());
    pln_engine_close(e);
}

/* NaN logits at one step (PLN_FAULT_NAN_LOGITS_AT_STEP): the rows sampled in that step come back
 * nonfinite with no token, the step succeeds, and the engine goes on exactly as before. */
static void check_nonfinite(const char *dir, const ref_t *r) {
    setenv(PLN_ENGINE_FAULT_NAN_ENV, "2", 1);
    pln_engine *e = open_set(dir, 0, 0);
    unsetenv(PLN_ENGINE_FAULT_NAN_ENV);
    if (!e) { CHECK(0, "nonfinite: engine opens"); return; }
    int32_t n0 = r->n[0];
    const int32_t *g = r->gids[0];   /* the prompt then transformers' greedy continuation */
    pln_step_seq s[2] = {fixture_seq(0, r->ids[0], n0, true), fixture_seq(1, r->ids[1], r->n[1], true)};
    pln_step_out o[2];
    pln_step_plan p = {.n_seqs = 2, .seqs = s};
    CHECK(pln_engine_step(e, &p, o) == 0 && !o[0].nonfinite && !o[1].nonfinite && o[0].token == g[n0],
          "step 1 (prefill) samples normally: %d vs %d", o[0].token, g[n0]);
    int32_t t0 = o[0].token, t1 = o[1].token;
    s[0] = fixture_seq(0, &t0, 1, true);
    s[1] = fixture_seq(1, &t1, 1, true);
    int rc = pln_engine_step(e, &p, o);
    CHECK(rc == 0, "a step with NaN logits still succeeds: %s", rc ? pln_error() : "");
    CHECK(o[0].nonfinite && o[1].nonfinite && o[0].token == -1 && o[1].token == -1, "both rows nonfinite, no token (%d %d)",
          o[0].token, o[1].token);
    /* slot 1 is given up (as the scheduler does); slot 0 goes on with the reference token */
    int32_t rel = 1, t2 = g[n0 + 1];
    s[0] = fixture_seq(0, &t2, 1, true);
    pln_step_plan p2 = {.n_seqs = 1, .seqs = s, .n_release = 1, .release = &rel};
    CHECK(pln_engine_step(e, &p2, o) == 0 && !o[0].nonfinite && o[0].token == g[n0 + 2] && isfinite(o[0].logprob),
          "the next step is exact again: %d vs %d", o[0].token, g[n0 + 2]);
    pln_engine_close(e);
}

/* Bytes the allocator hands out now (small blocks and mmap'd ones). */
static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A row found non-finite on the full-row path (plain sampling: the whole vocabulary gathered)
 * frees what it gathered: 200 such prefills leave the heap where 5 left it. Each leaked row
 * would keep two vocabulary-sized arrays (8 bytes a token); the bound is one row's worth. */
static void check_nonfinite_no_leak(const char *dir, const ref_t *r) {
    setenv(PLN_ENGINE_FAULT_NAN_ENV, "1+", 1);
    pln_engine *e = open_set(dir, 0, 0);
    unsetenv(PLN_ENGINE_FAULT_NAN_ENV);
    if (!e) { CHECK(0, "nonfinite leak: engine opens"); return; }
    size_t base = 0;
    int bad = 0;
    for (int it = 0; it < 205; it++) {
        if (it == 5) base = heap_in_use();
        pln_step_seq s = fixture_seq(0, r->ids[0], r->n[0], true);
        s.params.do_sample = true;       /* top_k off, top_p 1: the full row is gathered */
        s.params.seed = (uint64_t)it;
        int32_t rel = 0;
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .n_release = 1, .release = &rel};
        pln_step_out o;
        if (pln_engine_step(e, &p, &o) || !o.nonfinite) bad++;
    }
    size_t now = heap_in_use();
    CHECK(bad == 0, "every NaN row comes back nonfinite and the step succeeds (%d did not)", bad);
    CHECK(now < base + (size_t)V * 8, "200 nonfinite full rows leave the heap flat: %zu -> %zu bytes (+%lld)",
          base, now, (long long)now - (long long)base);
    pln_engine_close(e);
}

/* Parameters at their extremes: top_k INT32_MAX (whose +1 overflowed) and top_k at or above the
 * vocabulary keep every token, so they draw exactly what top_k 0 draws with the same seed; a
 * temperature far below PLN_SAMPLE_MIN_TEMPERATURE (its inverse is infinite in float) picks the
 * greedy token instead of overflowing the row into a non-finite failure. */
static void check_param_extremes(const char *dir, const ref_t *r) {
    pln_engine *e = open_set(dir, 0, 0);
    if (!e) { CHECK(0, "extremes: engine opens"); return; }
    const int32_t big[] = {0, INT32_MAX, V, V + 1, V - 1};
    int32_t tok[5];
    for (int i = 0; i < 5; i++) {
        pln_step_seq s = fixture_seq(0, r->ids[1], r->n[1], true);
        s.params.do_sample = true;
        s.params.top_k = big[i];
        s.params.seed = 77;
        int32_t rel = 0;
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .n_release = 1, .release = &rel};
        pln_step_out o;
        int rc = pln_engine_step(e, &p, &o);
        CHECK(rc == 0 && !o.nonfinite && o.token >= 0 && o.token < V, "top_k %d: a token (rc %d, %s)", big[i], rc,
              rc ? pln_error() : "");
        tok[i] = o.token;
    }
    CHECK(tok[1] == tok[0] && tok[2] == tok[0] && tok[3] == tok[0], "top_k INT32_MAX, V and V+1 draw top_k 0's token: %d %d %d vs %d",
          tok[1], tok[2], tok[3], tok[0]);
    const float tiny[] = {1e-40f, 1e-38f, 1e-6f};
    for (int i = 0; i < 3; i++) {
        pln_step_seq s = fixture_seq(0, r->ids[0], r->n[0], true);
        s.params.do_sample = true;
        s.params.temperature = tiny[i];
        s.params.seed = 5;
        int32_t rel = 0;
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .n_release = 1, .release = &rel};
        pln_step_out o;
        int rc = pln_engine_step(e, &p, &o);
        CHECK(rc == 0 && !o.nonfinite && o.token == r->gids[0][r->n[0]] && isfinite(o.logprob),
              "temperature %g samples greedily: token %d (transformers' greedy %d), nonfinite %d", (double)tiny[i], o.token,
              r->gids[0][r->n[0]], o.nonfinite);
    }
    pln_engine_close(e);
}

/* Seeded sampling, top-k/top-p, the full-row fallback and raw log-probs. */
static void check_sampling(const char *dir, const ref_t *r) {
    pln_engine *e = open_set(dir, 0, 0);
    if (!e) { CHECK(0, "sampling: engine opens"); return; }
    int32_t toks[2][12];
    for (int run = 0; run < 2; run++) {
        int32_t last = 0;
        for (int t = 0; t < 12; t++) {
            pln_step_seq s = t == 0 ? fixture_seq(1, r->ids[0], r->n[0], true) : fixture_seq(1, &last, 1, true);
            s.params.do_sample = true;
            s.params.temperature = 1.5f;
            s.params.top_k = 0;
            s.params.top_p = 0.98f;          /* 64 candidates of a flat row do not reach it: full-row path */
            s.params.repetition_penalty = 1.3f;
            s.params.seed = 1234;
            pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true};
            pln_step_out o;
            if (pln_engine_step(e, &p, &o)) { CHECK(0, "sampling step: %s", pln_error()); break; }
            /* The reported log-prob is the raw distribution's, whatever the processing. */
            const float *row = o.logits + (size_t)(s.n_new - 1) * V;
            double mx = -INFINITY, se = 0;
            for (int v = 0; v < V; v++) if (row[v] > mx) mx = row[v];
            for (int v = 0; v < V; v++) se += exp(row[v] - mx);
            double want = row[o.token] - mx - log(se);
            CHECK(o.token >= 0 && o.token < V, "sampled id %d in range", o.token);
            CHECK(fabs(o.logprob - want) <= 1e-4, "sampled logprob %.6f vs raw log-softmax %.6f", o.logprob, want);
            toks[run][t] = last = o.token;
        }
        int32_t one = 1;
        pln_step_plan pr = {.n_release = 1, .release = &one};
        pln_engine_step(e, &pr, NULL);
    }
    CHECK(memcmp(toks[0], toks[1], sizeof toks[0]) == 0, "same seed, same tokens");
    /* top_k = 3: every pick is among the row's 3 largest raw logits (no penalty, no temperature). */
    int ok = 1;
    for (int t = 0; t < 8; t++) {
        pln_step_seq s = fixture_seq(2, r->ids[1], r->n[1], true);
        s.params.do_sample = true;
        s.params.top_k = 3;
        s.params.seed = (uint64_t)t;
        int32_t two = 2;
        pln_step_plan p = {.n_seqs = 1, .seqs = &s, .want_logits = true, .n_release = 1, .release = &two};
        pln_step_out o;
        if (pln_engine_step(e, &p, &o)) { ok = 0; break; }
        const float *row = o.logits + (size_t)(s.n_new - 1) * V;
        int above = 0;
        for (int v = 0; v < V; v++) if (row[v] > row[o.token]) above++;
        if (above >= 3) ok = 0;
    }
    CHECK(ok, "top_k 3 picks among the 3 largest logits");
    pln_engine_close(e);
}

/* Invalid plans change nothing; an injected forward failure releases the plan's slots and the
 * engine keeps working. */
static void check_errors(const char *dir, const ref_t *r, const float *alone0) {
    pln_engine *e = open_set(dir, 3, 64);   /* 64 KV tokens = 16 blocks of 4 */
    if (!e) { CHECK(0, "errors: engine opens"); return; }
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    int64_t free0 = info.kv_blocks_free;
    pln_step_out o[2];
    pln_step_seq s = fixture_seq(99, r->ids[0], r->n[0], true);
    pln_step_plan p = {.n_seqs = 1, .seqs = &s};
    CHECK(pln_engine_step(e, &p, o) == -1 && strstr(pln_error(), "slot 99"), "unknown slot rejected: %s", pln_error());
    int32_t bad[2] = {5, 1003};
    s = fixture_seq(0, bad, 2, true);
    CHECK(pln_engine_step(e, &p, o) == -1 && strstr(pln_error(), "1003"), "token id out of range rejected: %s", pln_error());
    int32_t longp[70] = {0};
    s = fixture_seq(0, longp, 65, true);
    CHECK(pln_engine_step(e, &p, o) == -1 && strstr(pln_error(), "max_seq_len"), "over max_seq_len rejected: %s", pln_error());
    pln_step_seq two[2] = {fixture_seq(0, longp, 40, false), fixture_seq(1, longp, 40, false)};
    pln_step_plan p2 = {.n_seqs = 2, .seqs = two};
    CHECK(pln_engine_step(e, &p2, o) == -1 && strstr(pln_error(), "KV blocks"), "out of KV blocks rejected: %s", pln_error());
    pln_engine_get_info(e, &info);
    CHECK(info.kv_blocks_free == free0, "rejected plans hold no blocks");

    /* Steps 1 and 2 run (step 2 decodes), step 3 fails: its slots are released. */
    s = fixture_seq(0, r->ids[0], r->n[0], true);
    CHECK(pln_engine_step(e, &p, o) == 0, "step 1 runs");
    int32_t next = o[0].token;
    s = fixture_seq(0, &next, 1, true);
    CHECK(pln_engine_step(e, &p, o) == 0, "step 2 runs");
    s = fixture_seq(0, &next, 1, true);
    CHECK(pln_engine_step(e, &p, o) == -1 && strstr(pln_error(), "injected"), "step 3 fails: %s", pln_error());
    pln_engine_get_info(e, &info);
    CHECK(info.kv_blocks_free == free0, "failed step released its slot's blocks (%lld of %lld free)",
          (long long)info.kv_blocks_free, (long long)free0);
    /* The slot starts afresh and the engine computes the reference logits again. */
    s = fixture_seq(0, r->ids[0], r->n[0], false);
    pln_step_plan p3 = {.n_seqs = 1, .seqs = &s, .want_logits = true};
    int rc = pln_engine_step(e, &p3, o);
    CHECK(rc == 0, "step after the failure runs: %s", pln_error());
    if (rc == 0) CHECK(test_rel_l2(o[0].logits, alone0, (size_t)r->n[0] * V) <= 1e-6, "logits after the failure equal before");
    /* An invalid plan's releases still happen: slot 2 holds blocks, then is released by a plan
     * whose sequence is invalid. */
    s = fixture_seq(2, r->ids[0], r->n[0], false);
    int32_t zero = 0;
    pln_step_plan p4 = {.n_seqs = 1, .seqs = &s, .n_release = 1, .release = &zero};
    CHECK(pln_engine_step(e, &p4, o) == 0, "slot 2 prefill");
    int32_t two_rel = 2;
    pln_step_seq badseq = fixture_seq(99, r->ids[0], 1, false);
    pln_step_plan pb = {.n_seqs = 1, .seqs = &badseq, .n_release = 1, .release = &two_rel};
    CHECK(pln_engine_step(e, &pb, o) == -1 && strstr(pln_error(), "slot 99"), "invalid plan rejected: %s", pln_error());
    pln_engine_get_info(e, &info);
    CHECK(info.kv_blocks_free == free0, "its release happened anyway (%lld of %lld free)", (long long)info.kv_blocks_free,
          (long long)free0);
    pln_engine_close(e);
}

static int load_logits(pln_safetensors *st, const char *path, const float **l, int64_t *rows) {
    if (pln_safetensors_open(st, path)) { fprintf(stderr, "%s\n", pln_error()); return -1; }
    const pln_tensor *t = pln_safetensors_find(st, "logits");
    if (!t || t->dtype != PLN_DTYPE_F32 || t->ndim != 2) { fprintf(stderr, "%s: no F32 [rows, vocab] logits\n", path); return -1; }
    *l = (const float *)t->data;
    *rows = t->shape[0] * t->shape[1];
    return 0;
}

/* The KV cache's sharing bookkeeping, checked against its invariants after every call of a
 * seeded random workload (reserve, match, fork, commit, release) on a small cache: free blocks =
 * free list + evictable cached blocks, every reference counted, every cached block findable by
 * its own tokens, a slot's matched prefix equal to the tokens it asked for. Then eviction: once
 * other sequences need every block, a cached prefix is gone (matching finds nothing). */
static void check_kvcache(void) {
    pln_backend *be = pln_backend_create("cpu", 0);
    CHECK(be != NULL, "cpu backend");
    if (!be) return;
    pln_kvcache kv;
    enum { NB = 48, BS = 2, SLOTS = 6, MAXLEN = 24 };
    CHECK(pln_kv_init(&kv, be, 1, 1, 4, NB, BS, SLOTS, MAXLEN) == 0 && pln_kv_prefix_enable(&kv) == 0, "kv init");
    int32_t hist[SLOTS][MAXLEN], len[SLOTS] = {0};
    uint64_t x = 12345;
    int bad = 0, hits = 0;
    for (int it = 0; it < 4000 && !bad; it++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int32_t s = (int32_t)(x % SLOTS);
        if (len[s] > 0 && (x >> 8) % 4 == 0) {
            pln_kv_release(&kv, s);
            len[s] = 0;
        } else if (len[s] == 0) {
            /* a fresh sequence: a prompt over 3 tokens (so prefixes repeat), matched, then filled */
            int32_t n = 4 + (int32_t)((x >> 12) % 12);
            for (int32_t j = 0; j < n; j++) hist[s][j] = (int32_t)((x >> (20 + j % 8)) % 3);
            int32_t got = 0;
            int32_t src = (int32_t)((x >> 40) % SLOTS);
            if ((x >> 50) % 3 == 0 && src != s && len[src] >= BS && !memcmp(hist[src], hist[s], BS * 4))
                got = pln_kv_fork(&kv, s, src, 1);
            got += pln_kv_match(&kv, s, hist[s] + got * BS, n - got * BS, (n - 1) / BS - got);
            hits += got;
            if (pln_kv_reserve(&kv, s, n) == 0) {
                len[s] = n;
                pln_kv_commit(&kv, s, hist[s], n);
            } else {
                pln_kv_release(&kv, s);
            }
        } else if (len[s] < MAXLEN) {
            hist[s][len[s]] = (int32_t)((x >> 16) % 3);
            if (pln_kv_reserve(&kv, s, len[s] + 1) == 0) pln_kv_commit(&kv, s, hist[s], ++len[s]);
        }
        /* invariants */
        int32_t refs[NB] = {0}, lru = 0, cached = 0;
        for (int32_t q = 0; q < SLOTS; q++)
            for (int32_t i = 0; i < kv.n_used[q]; i++) refs[kv.tables[q * kv.max_blocks + i]]++;
        for (int32_t b = kv.lru_head; b >= 0; b = kv.lru_next[b]) lru++;
        for (int32_t b = 0; b < NB; b++) {
            if (refs[b] != kv.ref[b]) bad++;
            if (kv.cached[b]) {
                cached++;
                /* findable: match a throwaway copy of its tokens through the table */
                uint64_t mask = (uint64_t)kv.tcap - 1, i = kv.bhash[b] & mask;
                while (kv.table[i] >= 0 && kv.table[i] != b) i = (i + 1) & mask;
                if (kv.table[i] != b) bad++;
            }
        }
        if (kv.n_free != kv.n_free_list + lru || cached != kv.n_cached) bad++;
        /* a slot's blocks hold its own tokens: every cached block it holds carries them */
        for (int32_t q = 0; q < SLOTS; q++)
            for (int32_t i = 0; i < kv.n_used[q] && (i + 1) * BS <= len[q]; i++) {
                int32_t b = kv.tables[q * kv.max_blocks + i];
                if (kv.cached[b] && memcmp(kv.btok + b * BS, hist[q] + i * BS, BS * 4)) bad++;
            }
        if (bad) fprintf(stderr, "kvcache invariant broken at iteration %d\n", it);
    }
    CHECK(!bad, "kv cache invariants hold over 4000 random calls");
    CHECK(hits > 50, "the workload shares blocks (%d taken from the cache or a fork)", hits);
    for (int32_t q = 0; q < SLOTS; q++) pln_kv_release(&kv, q);
    CHECK(kv.n_free == NB, "all blocks free after releasing every slot (%d)", kv.n_free);
    /* eviction: cache a prefix, then let other tokens take every block */
    int32_t a[8] = {7, 7, 8, 8, 9, 9, 5, 5}, b2[MAXLEN];
    CHECK(pln_kv_reserve(&kv, 0, 8) == 0, "reserve prefix");
    pln_kv_commit(&kv, 0, a, 8);
    pln_kv_release(&kv, 0);
    CHECK(pln_kv_match(&kv, 1, a, 8, 3) == 3, "cached prefix matches");
    pln_kv_release(&kv, 1);
    int32_t taken = 0;
    for (int32_t q = 0; q < SLOTS; q++) {
        for (int32_t j = 0; j < MAXLEN; j++) b2[j] = 100 + q * MAXLEN + j;
        int32_t n = MAXLEN;
        while (n > 0 && pln_kv_reserve(&kv, q, n)) n -= BS;
        if (n > 0) pln_kv_commit(&kv, q, b2, n);
        taken += kv.n_used[q];
    }
    CHECK(taken == NB && kv.n_free == 0, "other sequences took every block (%d of %d)", taken, NB);
    CHECK(kv.evictions > 0, "cached blocks were evicted for them (%lld)", (long long)kv.evictions);
    for (int32_t q = 0; q < SLOTS; q++) pln_kv_release(&kv, q);
    CHECK(pln_kv_match(&kv, 2, a, 8, 3) < 3, "an evicted prefix no longer matches whole");
    pln_kv_release(&kv, 2);
    pln_kv_free(&kv);
    pln_backend_destroy(be);
}

/* Prompt scoring and token alternatives against the raw logits of the same rows (want_logits):
 * prompt 0 fed in two chunks (the first chunk's last row scores next_token), every row's
 * log-prob and top 3 equal log_softmax of the row; the sampled token's 3 alternatives equal the
 * last row's top 3. Then OpenAI presence / frequency penalties: each greedy pick equals the
 * argmax of the raw row minus the penalties of the tokens generated so far. */
static void check_scoring(const char *dir, const ref_t *r) {
    pln_engine *e = open_set(dir, 0, 0);
    CHECK(e != NULL, "scoring: engine opens");
    if (!e) return;
    int32_t n = r->n[0], h = n / 2;
    const int32_t *tok = r->ids[0];
    float *rows = pln_xmalloc((size_t)n * V * 4);
    int32_t at = 0, worst_top = 0;
    double worst = 0;
    float plp[64];
    int32_t pti[64][PLN_TOP_MAX], sampled = -1, alt_ids[3] = {-1, -1, -1};
    for (int c = 0; c < 2; c++) {
        int32_t len = c == 0 ? h : n - h;
        pln_step_seq sq = fixture_seq(0, tok + at, len, c == 1);
        sq.prompt_logprobs = true;
        sq.top_n = 3;
        sq.next_token = c == 0 ? tok[h] : -1;
        pln_step_plan p = {.n_seqs = 1, .seqs = &sq, .want_logits = true};
        pln_step_out o;
        CHECK(pln_engine_step(e, &p, &o) == 0, "scoring chunk %d: %s", c, pln_error());
        CHECK(o.prompt_lp != NULL, "chunk %d returns prompt log-probs", c);
        if (!o.prompt_lp) break;
        memcpy(rows + (size_t)at * V, o.logits, (size_t)len * V * 4);
        for (int32_t j = 0; j < len; j++) {
            plp[at + j] = o.prompt_lp[j];
            for (int t = 0; t < 3; t++) pti[at + j][t] = o.prompt_top_ids[j * PLN_TOP_MAX + t];
        }
        if (c == 1) {
            sampled = o.token;
            CHECK(o.n_top == 3, "sampled token has 3 alternatives (%d)", o.n_top);
            for (int t = 0; t < 3; t++) alt_ids[t] = o.top_ids[t];
            CHECK(fabs(o.top_logprobs[0] - o.logprob) < 1e-6 && o.top_ids[0] == o.token,
                  "greedy: the first alternative is the token itself");
        }
        at += len;
    }
    for (int32_t j = 0; j + 1 < n; j++) {
        const float *row = rows + (size_t)j * V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) if (row[v] > mx) mx = row[v];
        for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
        double lse = mx + log(sum), want = row[tok[j + 1]] - lse;
        if (fabs(plp[j] - want) > worst) worst = fabs(plp[j] - want);
        int32_t best[3] = {-1, -1, -1};
        for (int v = 0; v < V; v++)
            for (int t = 0; t < 3; t++)
                if (best[t] < 0 || row[v] > row[best[t]]) {
                    for (int u = 2; u > t; u--) best[u] = best[u - 1];
                    best[t] = v;
                    break;
                }
        for (int t = 0; t < 3; t++) if (pti[j][t] != best[t]) worst_top++;
        if (j == n - 2) {
            /* the last prompt row is the sampled row */
        }
    }
    CHECK(isnan(plp[n - 1]), "the prompt's last row has no successor (NAN)");
    CHECK(worst < 1e-4, "prompt log-probs == log_softmax of the raw rows (max |diff| %.3g)", worst);
    CHECK(worst_top == 0, "prompt top-3 ids == the rows' top 3 (%d differ)", worst_top);
    {
        const float *row = rows + (size_t)(n - 1) * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
        CHECK(sampled == best && alt_ids[0] == best, "greedy token %d == the last row's argmax %d", sampled, best);
    }
    /* presence / frequency penalties, greedy, 8 decode steps */
    int32_t rel = 0;
    pln_step_plan pr = {.n_release = 1, .release = &rel};
    pln_engine_step(e, &pr, NULL);
    int32_t cnt_ids[16], cnt[16], ncnt = 0, cur = -1, mismatches = 0;
    for (int st = 0; st < 9; st++) {
        pln_step_seq sq = fixture_seq(0, st == 0 ? tok : &cur, st == 0 ? n : 1, true);
        sq.params.presence_penalty = 1.5f;
        sq.params.frequency_penalty = 0.75f;
        pln_step_plan p = {.n_seqs = 1, .seqs = &sq, .want_logits = true};
        pln_step_out o;
        if (pln_engine_step(e, &p, &o)) { CHECK(0, "penalty step %d: %s", st, pln_error()); break; }
        if (st > 0) {   /* the fed token was generated */
            int k = 0;
            while (k < ncnt && cnt_ids[k] != cur) k++;
            if (k == ncnt) { cnt_ids[ncnt] = cur; cnt[ncnt++] = 0; }
            cnt[k]++;
        }
        const float *row = o.logits + (size_t)(sq.n_new - 1) * V;
        int32_t best = -1;
        float bv = -INFINITY;
        for (int v = 0; v < V; v++) {
            float x = row[v];
            for (int k = 0; k < ncnt; k++) if (cnt_ids[k] == v) x -= 0.75f * (float)cnt[k] + 1.5f;
            if (x > bv) { bv = x; best = v; }
        }
        mismatches += o.token != best;
        cur = o.token;
    }
    CHECK(mismatches == 0, "presence/frequency-penalised greedy picks == argmax of the penalised raw rows (%d differ)", mismatches);
    free(rows);
    pln_engine_close(e);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--cmp-dump")) {
        test_begin("cmp-dump");
        pln_safetensors a, b;
        const float *la, *lb;
        int64_t na, nb;
        if (load_logits(&a, argv[2], &la, &na) || load_logits(&b, argv[3], &lb, &nb)) return 2;
        CHECK(na == nb, "same logits shape (%lld vs %lld values)", (long long)na, (long long)nb);
        double rel = na == nb ? test_rel_l2(la, lb, (size_t)na) : 1;
        double tol = atof(argv[4]);
        printf("%s vs %s: logits rel L2 %.3g (tol %.3g) %s\n", argv[2], argv[3], rel, tol, rel <= tol ? "OK" : "NOT OK");
        CHECK(rel <= tol, "rel L2 %.3g > %.3g", rel, tol);
        return test_done();
    }
    if (argc == 5 && !strcmp(argv[1], "--cmp-ref")) {
        /* The dump of `generate --token-ids P0 ... --token-ids P3` starts with the four prompts'
         * prefill rows, in order. */
        test_begin("cmp-ref");
        pln_safetensors a;
        const float *la;
        int64_t na;
        ref_t r;
        if (load_logits(&a, argv[2], &la, &na) || ref_open(&r, argv[3])) return 2;
        double tol = atof(argv[4]);
        int64_t at = 0;
        for (int i = 0; i < NPROMPT; i++) {
            size_t n = (size_t)r.n[i] * V;
            CHECK(at + (int64_t)n <= na, "dump holds prompt %d's rows", i);
            if (at + (int64_t)n > na) break;
            double rel = test_rel_l2(la + at, r.logits[i], n);
            printf("%s prompt%d vs transformers: rel L2 %.3g (tol %.3g) %s\n", argv[2], i, rel, tol, rel <= tol ? "OK" : "NOT OK");
            CHECK(rel <= tol, "prompt%d rel L2 %.3g > %.3g", i, rel, tol);
            at += (int64_t)n;
        }
        return test_done();
    }
    if (argc == 3 && !strcmp(argv[1], "--print-ids")) {
        /* "--token-ids a,b,c" arguments for the four reference prompts. */
        ref_t r;
        if (ref_open(&r, argv[2])) return 2;
        for (int i = 0; i < NPROMPT; i++) {
            printf("--token-ids ");
            for (int j = 0; j < r.n[i]; j++) printf("%s%d", j ? "," : "", r.ids[i][j]);
            printf(i + 1 < NPROMPT ? " " : "\n");
        }
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "--cmp-greedy")) {
        /* generate --json results vs the reference greedy ids and log-probs. */
        test_begin("cmp-greedy");
        ref_t r;
        if (ref_open(&r, argv[3])) return 2;
        json_error_t err;
        json_t *root = json_load_file(argv[2], 0, &err);
        CHECK(root != NULL, "%s parses: %s", argv[2], err.text);
        json_t *res = json_object_get(root, "results");
        double tol = atof(argv[4]);
        CHECK(json_array_size(res) == NPROMPT, "%d results", NPROMPT);
        for (int i = 0; i < NPROMPT && json_array_size(res) == NPROMPT; i++) {
            json_t *o = json_array_get(res, (size_t)i), *ids = json_object_get(o, "ids"), *lp = json_object_get(o, "logprobs");
            int same = json_array_size(ids) == 20;
            double maxd = 0;
            for (int t = 0; t < 20 && same; t++) {
                if (json_integer_value(json_array_get(ids, (size_t)t)) != r.gids[i][r.n[i] + t]) same = 0;
                double d = fabs(json_number_value(json_array_get(lp, (size_t)t)) - r.glp[i][t]);
                if (d > maxd) maxd = d;
            }
            printf("%s greedy%d: ids %s, logprob max |diff| %.3g\n", argv[2], i, same ? "identical" : "DIFFER", maxd);
            CHECK(same, "greedy%d ids differ from transformers", i);
            CHECK(maxd <= tol, "greedy%d logprob diff %.3g > %.3g", i, maxd, tol);
        }
        json_decref(root);
        return test_done();
    }
    if (argc == 5 && !strcmp(argv[1], "--cmp-int8")) {
        /* int8/int4 logits vs fp16 logits within 2 sqrt(sum eps_i^2) of the quantized set's manifest. */
        test_begin("cmp-int8");
        pln_shardset *set = pln_shardset_open(argv[4]);
        CHECK(set != NULL, "int8 set opens: %s", pln_error());
        if (!set) return test_done();
        double sum2 = 0;
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(set->json, "tensors"), k, v) {
            json_t *q = json_object_get(v, "quant_rel_rms");
            if (json_is_number(q)) sum2 += json_number_value(q) * json_number_value(q);
        }
        pln_shardset_close(set);
        pln_safetensors a, b;
        const float *la, *lb;
        int64_t na, nb;
        if (load_logits(&a, argv[2], &la, &na) || load_logits(&b, argv[3], &lb, &nb)) return 2;
        CHECK(na == nb, "same shape");
        double rel = na == nb ? test_rel_l2(la, lb, (size_t)na) : 1, bound = 2 * sqrt(sum2);
        printf("quantized %s vs fp16 %s: rel L2 %.4g, bound 2 sqrt(sum eps^2) = %.4g %s\n", argv[2], argv[3], rel, bound, rel <= bound ? "OK" : "NOT OK");
        CHECK(rel <= bound && rel > 0, "int8 rel L2 %.4g vs bound %.4g", rel, bound);
        return test_done();
    }
    test_begin("test_engine");
    g_comm = pln_comm_init(&argc, &argv);
    CHECK(pln_backend_register("cpu-noswiglu", noswiglu_create) == 0, "register cpu-noswiglu: %s", pln_error());
    check_kvcache();
    if (!fixture_can_reshard()) {
        printf("SKIP: this build has no `pollen reshard` (needed to make shard sets from the fixtures)\n");
        pln_comm_free(g_comm);
        return test_done();
    }
    /* bf16 sources become fp16 shards exactly (bf16 has fewer mantissa bits), so they meet the
     * same bound against reference-bf16. */
    struct { const char *model, *src, *ref; double tol; } sets[] = {
        {"bloom-4h", "fp16-st", "reference-f16.safetensors", 1e-3},
        {"bloom-6h", "fp16-bin", "reference-f16.safetensors", 1e-3},
        {"bloom-4h", "bf16-st", "reference-bf16.safetensors", 1e-3},
        {"bloom-6h", "bf16-st", "reference-bf16.safetensors", 1e-3},
        /* the Llama family (tests/fixtures/make_llama_fixtures.py): grouped-query attention with an
         * untied head, llama3 rotary scaling with a tied head and one KV head, Qwen2's q/k/v
         * biases, Mistral; the CPU meets transformers' fp32 forward far inside BLOOM's bound */
        {"llama-gqa", "bf16-st", "reference-bf16.safetensors", 1e-5},
        {"llama3-tied", "fp16-bin", "reference-f16.safetensors", 1e-5},
        {"qwen2-bias", "fp32-bin", "reference-f16.safetensors", 1e-5},
        {"mistral-sw", "fp16-st", "reference-f16.safetensors", 1e-5},
    };
    float *alone[NPROMPT];
    for (int i = 0; i < NPROMPT; i++) alone[i] = pln_xmalloc(64 * V * 4);
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        char label[64], path[256];
        snprintf(label, sizeof label, "%s/%s", sets[k].model, sets[k].src);
        snprintf(path, sizeof path, "tests/fixtures/models/%s/%s", sets[k].model, sets[k].ref);
        ref_t r;
        if (ref_open(&r, path)) { CHECK(0, "%s: reference opens", label); continue; }
        char *dir = fixture_reshard(sets[k].model, sets[k].src, 1, "fp16");
        CHECK(dir != NULL, "%s: reshard to TP 1 fp16", label);
        if (dir) {
            check_set(label, dir, &r, alone, sets[k].tol);
            if (!strcmp(sets[k].model, "llama-gqa")) {
                /* the SwiGLU epilogue (the CPU backend's default) against linear then swiglu: the
                 * same bits in every prefill logit */
                char lns[112];
                snprintf(lns, sizeof lns, "%s linear then swiglu", label);
                float *two[NPROMPT];
                for (int i = 0; i < NPROMPT; i++) two[i] = pln_xmalloc(64 * V * 4);
                g_backend = "cpu-noswiglu";
                check_set(lns, dir, &r, two, sets[k].tol);
                g_backend = NULL;
                int same = 1;
                for (int i = 0; i < NPROMPT; i++) same &= memcmp(two[i], alone[i], (size_t)r.n[i] * V * 4) == 0;
                printf("%s: prefill logits with the SwiGLU epilogue and with linear then swiglu: %s %s\n", label,
                       same ? "identical" : "DIFFER", same ? "OK" : "NOT OK");
                CHECK(same, "%s: the SwiGLU epilogue changed the prefill logits", label);
                for (int i = 0; i < NPROMPT; i++) free(two[i]);
            }
            if (k <= 1) {
                /* an F16 KV cache (rounding is its only difference) meets the same bounds */
                char l16[80];
                snprintf(l16, sizeof l16, "%s kv-f16", label);
                float *a16[NPROMPT];
                for (int i = 0; i < NPROMPT; i++) a16[i] = pln_xmalloc(64 * V * 4);
                g_kv_dtype = "f16";
                check_set(l16, dir, &r, a16, sets[k].tol);
                g_kv_dtype = NULL;
                /* and the batch-invariant mode: a batched prefill is each prompt alone, bit for bit */
                snprintf(l16, sizeof l16, "%s batch-invariant", label);
                g_batch_invariant = true;
                check_set(l16, dir, &r, a16, sets[k].tol);
                g_batch_invariant = false;
                for (int i = 0; i < NPROMPT; i++) free(a16[i]);
            }
            if (k <= 1) {
                char *dir8 = fixture_reshard(sets[k].model, sets[k].src, 1, "int8");
                CHECK(dir8 != NULL, "%s: reshard to TP 1 int8", label);
                if (dir8) check_int8(label, dir8, &r, alone);
                if (dir8 && k == 0) check_corrupt(dir8);
                free(dir8);
                if (k == 0) {
                    check_sampling(dir, &r);
                    check_errors(dir, &r, alone[0]);
                    check_nonfinite(dir, &r);
                    check_nonfinite_no_leak(dir, &r);
                    check_param_extremes(dir, &r);
                    check_scoring(dir, &r);
                }
            }
        }
        free(dir);
        pln_safetensors_close(&r.st);
    }
    for (int i = 0; i < NPROMPT; i++) free(alone[i]);
    pln_comm_free(g_comm);
    return test_done();
}
