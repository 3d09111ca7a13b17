/* test_sampler.c — HF sampling semantics on small hand-computed distributions: parameter checks,
 * the RNG against reference values, greedy ties, top-k ties, top-p boundaries, top-k + top-p,
 * seeded determinism (also across simulated TP splits of the vocabulary), empirical frequencies,
 * and the reference repetition penalty + temperature. */
#include "test.h"

#include "formats/common.h"
#include "runtime/sampler.h"

#include <stdint.h>

static pln_sample_params sampling(float temperature, int32_t top_k, float top_p, uint64_t seed) {
    pln_sample_params p;
    pln_sample_params_default(&p);
    p.do_sample = true;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.seed = seed;
    return p;
}

static float lse_of(const float *v, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) if (v[i] > mx) mx = v[i];
    for (int i = 0; i < n; i++) s += exp((double)v[i] - mx);
    return (float)(mx + log(s));
}

static void test_params(void) {
    pln_sample_params p;
    pln_sample_params_default(&p);
    CHECK(!p.do_sample && p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.repetition_penalty == 1.0f &&
          p.seed == 0, "defaults");
    CHECK(pln_sample_params_check(&p) == 0, "defaults valid: %s", pln_error());
    struct { const char *field; pln_sample_params p; } bad[14];
    int nb = 0;
    for (int i = 0; i < 14; i++) pln_sample_params_default(&bad[i].p);
    bad[nb].field = "temperature"; bad[nb].p.do_sample = true; bad[nb].p.temperature = 0; nb++;
    bad[nb].field = "temperature"; bad[nb].p.temperature = -1; nb++;
    bad[nb].field = "temperature"; bad[nb].p.temperature = NAN; nb++;
    bad[nb].field = "temperature"; bad[nb].p.do_sample = true; bad[nb].p.temperature = INFINITY; nb++;
    bad[nb].field = "top_p"; bad[nb].p.top_p = 0; nb++;
    bad[nb].field = "top_p"; bad[nb].p.top_p = 1.5f; nb++;
    bad[nb].field = "top_p"; bad[nb].p.top_p = NAN; nb++;
    bad[nb].field = "top_k"; bad[nb].p.top_k = -1; nb++;
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = 0; nb++;
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = -2; nb++;
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = NAN; nb++;
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = INFINITY; nb++;
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = 1e-6f; nb++;   /* divides into overflow */
    bad[nb].field = "repetition_penalty"; bad[nb].p.repetition_penalty = 1e-40f; nb++;
    for (int i = 0; i < nb; i++) {
        int rc = pln_sample_params_check(&bad[i].p);
        CHECK(rc == -1 && strncmp(pln_error(), bad[i].field, strlen(bad[i].field)) == 0,
              "bad case %d must fail naming %s: rc %d \"%s\"", i, bad[i].field, rc, pln_error());
    }
    pln_sample_params ok = sampling(0.7f, 50, 0.9f, 1);
    ok.repetition_penalty = 1.2f;
    CHECK(pln_sample_params_check(&ok) == 0, "typical sampling params valid: %s", pln_error());
    ok.do_sample = false; ok.temperature = 0;
    CHECK(pln_sample_params_check(&ok) == 0, "greedy with temperature 0 valid: %s", pln_error());
    ok = sampling(1.0f, 0, 1.0f, 0);
    ok.top_p = 1e-9f;
    CHECK(pln_sample_params_check(&ok) == 0, "tiny top_p valid");
    ok.repetition_penalty = PLN_SAMPLE_MIN_PENALTY;
    CHECK(pln_sample_params_check(&ok) == 0, "repetition_penalty at its floor valid: %s", pln_error());
    ok.top_k = INT32_MAX;
    CHECK(pln_sample_params_check(&ok) == 0, "top_k INT32_MAX valid (keeps every token)");
    /* greedy below the temperature floor, sampling at and above it */
    const struct { float t; bool greedy; } g[] = {{0, true}, {1e-45f, true}, {1e-38f, true}, {9.9e-6f, true},
                                                 {PLN_SAMPLE_MIN_TEMPERATURE, false}, {1e-4f, false}, {1, false}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        pln_sample_params q = sampling(g[i].t, 0, 1.0f, 0);
        CHECK(pln_sample_is_greedy(&q) == g[i].greedy, "temperature %g greedy %d", (double)g[i].t, g[i].greedy);
    }
    pln_sample_params q = sampling(1.0f, 0, 1.0f, 0);
    q.do_sample = false;
    CHECK(pln_sample_is_greedy(&q), "do_sample false is greedy");
}

static void test_rng(void) {
    /* xoshiro256** reference vectors: state {1,2,3,4} (the authors' and rand_xoshiro's test) */
    pln_rng r = {{1, 2, 3, 4}};
    uint64_t want[4] = {11520ull, 0ull, 1509978240ull, 1215971899390074240ull};
    for (int i = 0; i < 4; i++) {
        uint64_t v = pln_rng_next(&r);
        CHECK(v == want[i], "xoshiro256** output %d: %llu want %llu", i, (unsigned long long)v, (unsigned long long)want[i]);
    }
    /* splitmix64 seeding: seed 0 gives the well-known first splitmix64 output 0xe220a8397b1dcdaf */
    pln_rng_seed(&r, 0);
    CHECK(r.s[0] == 0xe220a8397b1dcdafull && r.s[1] == 0x6e789e6aa1b965f4ull, "splitmix64 seeding");
    uint64_t w0[3] = {11091344671253066420ull, 13793997310169335082ull, 1900383378846508768ull};
    for (int i = 0; i < 3; i++) CHECK(pln_rng_next(&r) == w0[i], "seed 0 output %d", i);
    pln_rng_seed(&r, 42);
    uint64_t w42[3] = {1546998764402558742ull, 6990951692964543102ull, 12544586762248559009ull};
    for (int i = 0; i < 3; i++) CHECK(pln_rng_next(&r) == w42[i], "seed 42 output %d", i);
    /* uniform: [0, 1), mean 1/2 */
    pln_rng_seed(&r, 7);
    double sum = 0, mn = 1, mx = 0;
    for (int i = 0; i < 100000; i++) {
        double u = pln_rng_uniform(&r);
        sum += u;
        if (u < mn) mn = u;
        if (u > mx) mx = u;
    }
    CHECK(mn >= 0 && mx < 1 && fabs(sum / 100000 - 0.5) < 0.005, "uniform range/mean: [%g, %g] mean %g", mn, mx, sum / 1e5);
}

static void test_greedy(void) {
    pln_sample_params g;
    pln_sample_params_default(&g);
    pln_rng r;
    pln_rng_seed(&r, 1);
    float v[5] = {1.0f, 3.0f, 2.0f, 3.0f, NAN};
    int32_t ids[5] = {10, 7, 3, 5, 1};
    float lp;
    pln_rng before = r;
    int32_t t = pln_sample_pick(&g, &r, v, ids, 5, lse_of(v, 4), &lp);
    CHECK(t == 5, "greedy tie takes the lowest id: got %d", t);
    CHECK_CLOSE(lp, 3.0f - lse_of(v, 4), 1e-6, "greedy logprob");
    CHECK(memcmp(&before, &r, sizeof r) == 0, "greedy does not consume the RNG");
    /* temperature 0 with do_sample behaves as greedy */
    pln_sample_params t0 = sampling(0.0f, 0, 1.0f, 0);
    CHECK(pln_sample_pick(&t0, &r, v, ids, 5, 0, NULL) == 5, "temperature 0 = greedy");
    float ninf[3] = {-INFINITY, -INFINITY, NAN};
    int32_t nid[3] = {9, 4, 2};
    pln_sample_params s = sampling(1, 0, 1, 0);
    t = pln_sample_pick(&s, &r, ninf, nid, 3, -INFINITY, NULL);
    CHECK(t == 2 || t == 4 || t == 9, "all -inf/NaN still returns a candidate (%d)", t);
    /* NaN is never chosen while a real value exists */
    float nv[3] = {NAN, -5.0f, NAN};
    int32_t nvi[3] = {0, 1, 2};
    for (int i = 0; i < 50; i++) CHECK(pln_sample_pick(&s, &r, nv, nvi, 3, -5.0f, NULL) == 1, "NaN never sampled");
}

/* Draws many times and compares frequencies with want[] (probabilities over ids 0..n-1). */
static void check_freq(const char *what, const pln_sample_params *p, const float *v, int n, float lse,
                       const double *want, int draws) {
    int32_t ids[64];
    int cnt[64] = {0};
    for (int i = 0; i < n; i++) ids[i] = i;
    pln_rng r;
    pln_rng_seed(&r, p->seed);
    for (int d = 0; d < draws; d++) {
        int32_t t = pln_sample_pick(p, &r, v, ids, n, lse, NULL);
        if (t >= 0 && t < n) cnt[t]++;
    }
    for (int i = 0; i < n; i++) {
        double f = (double)cnt[i] / draws;
        double sd = sqrt(want[i] * (1 - want[i]) / draws);
        if (want[i] == 0) CHECK(cnt[i] == 0, "%s: id %d has probability 0 but was drawn %d times", what, i, cnt[i]);
        else CHECK(fabs(f - want[i]) <= 5 * sd + 1e-9, "%s: id %d frequency %.4f want %.4f (5 sd = %.4f)", what, i, f,
                   want[i], 5 * sd);
    }
}

static void test_topk_topp(void) {
    /* top-k ties at the k-th value are kept: values 2,1,1,1,0 and k = 2 keep ids 0..3 */
    float v[5] = {2, 1, 1, 1, 0};
    double e2 = exp(2.0), e1 = exp(1.0), z = e2 + 3 * e1;
    double want_k[5] = {e2 / z, e1 / z, e1 / z, e1 / z, 0};
    pln_sample_params p = sampling(1, 2, 1, 11);
    check_freq("top_k=2 with ties", &p, v, 5, lse_of(v, 5), want_k, 20000);
    p.top_k = 1;
    double want_k1[5] = {1, 0, 0, 0, 0};
    check_freq("top_k=1", &p, v, 5, lse_of(v, 5), want_k1, 500);

    /* top-p: probabilities 1/2, 1/4, 1/8, 1/8 (lse 0) */
    float q[4] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.125f)};
    p = sampling(1, 0, 0.5f, 12);
    double w05[4] = {1, 0, 0, 0};
    check_freq("top_p=0.5 (mass exactly p)", &p, q, 4, 0.0f, w05, 2000);
    p.top_p = 0.75f;
    double w075[4] = {2.0 / 3, 1.0 / 3, 0, 0};
    check_freq("top_p=0.75 (mass exactly p)", &p, q, 4, 0.0f, w075, 20000);
    p.top_p = 0.76f;
    double w076[4] = {0.5 / 0.875, 0.25 / 0.875, 0.125 / 0.875, 0};
    check_freq("top_p=0.76 (ties at the boundary: lower id first)", &p, q, 4, 0.0f, w076, 20000);
    p.top_p = 1e-9f;
    check_freq("tiny top_p keeps one", &p, q, 4, 0.0f, w05, 2000);
    p.top_p = 1.0f;
    double wall[4] = {0.5, 0.25, 0.125, 0.125};
    check_freq("no filtering", &p, q, 4, 0.0f, wall, 20000);

    /* top-p uses the WHOLE-vocabulary lse: the candidates below hold 0.5 + 0.25 of the mass and
     * the remaining 0.25 lies in tokens not passed; top_p 0.6 keeps ids 0 and 1 (0.5 < 0.6). */
    float part[2] = {logf(0.5f), logf(0.25f)};
    p = sampling(1, 0, 0.6f, 13);
    double wpart[2] = {2.0 / 3, 1.0 / 3};
    check_freq("top_p with whole-vocab lse", &p, part, 2, 0.0f, wpart, 20000);

    /* top-k then top-p: with k = 2 the mass is renormalised over the kept set (HF order):
     * 0.4, 0.3 → 4/7, 3/7, so top_p = 0.5 keeps only id 0 (over the whole vocab 0.4 < 0.5). */
    float r4[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    p = sampling(1, 2, 0.5f, 14);
    double wkp[4] = {1, 0, 0, 0};
    check_freq("top_k=2 then top_p=0.5", &p, r4, 4, 0.0f, wkp, 2000);
    p.top_p = 0.6f;
    double wkp2[4] = {4.0 / 7, 3.0 / 7, 0, 0};
    check_freq("top_k=2 then top_p=0.6", &p, r4, 4, 0.0f, wkp2, 20000);

    /* empirical frequencies of a 6-token distribution after temperature 0.7 (applied by the
     * caller: values are logits / 0.7) */
    float raw[6] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f}, t07[6];
    double w6[6], z6 = 0;
    for (int i = 0; i < 6; i++) { t07[i] = raw[i] / 0.7f; z6 += exp((double)t07[i]); }
    for (int i = 0; i < 6; i++) w6[i] = exp((double)t07[i]) / z6;
    p = sampling(0.7f, 0, 1.0f, 2024);
    check_freq("6 tokens, temperature 0.7, 20000 draws", &p, t07, 6, lse_of(t07, 6), w6, 20000);

    /* logprob_out under the processed distribution */
    pln_rng rr;
    pln_rng_seed(&rr, 3);
    int32_t ids6[6] = {0, 1, 2, 3, 4, 5};
    float lp;
    int32_t tk = pln_sample_pick(&p, &rr, t07, ids6, 6, lse_of(t07, 6), &lp);
    CHECK_CLOSE(lp, t07[tk] - lse_of(t07, 6), 1e-6, "sampled logprob");
}

static void test_determinism(void) {
    /* same seed → same sequence; candidate order does not matter; other seeds differ */
    enum { N = 40 };
    float v[N];
    int32_t ids[N], sh_ids[N];
    float sh_v[N];
    for (int i = 0; i < N; i++) { v[i] = sinf((float)i * 1.3f) * 2.0f; ids[i] = 100 + i; }
    for (int i = 0; i < N; i++) { int j = (i * 17 + 5) % N; sh_v[i] = v[j]; sh_ids[i] = ids[j]; }
    float lse = lse_of(v, N);
    pln_sample_params p = sampling(1.0f, 20, 0.9f, 77);
    pln_rng a, b, c;
    pln_rng_seed(&a, 77); pln_rng_seed(&b, 77); pln_rng_seed(&c, 78);
    int same = 0, diff = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = pln_sample_pick(&p, &a, v, ids, N, lse, NULL);
        int32_t y = pln_sample_pick(&p, &b, sh_v, sh_ids, N, lse, NULL);
        int32_t z = pln_sample_pick(&p, &c, v, ids, N, lse, NULL);
        same += x == y;
        diff += x != z;
    }
    CHECK(same == 200, "same seed, shuffled candidates: %d of 200 equal", same);
    CHECK(diff > 50, "another seed gives another sequence (%d of 200 differ)", diff);
}

/* Simulates the engine: the vocabulary split over tp ranks, each sending its top kr candidates;
 * when they suffice the pick uses them, else the full row. The tokens must not depend on tp. */
static int cmp_desc(const void *a, const void *b) {
    const float *x = a, *y = b;
    return (*x < *y) - (*x > *y);
}

static int32_t engine_pick(const pln_sample_params *p, pln_rng *r, const float *row, int64_t V, int tp, int32_t kr,
                           int *full_used) {
    float *cv = malloc(sizeof(float) * (size_t)(tp * kr + 1));
    int32_t *ci = malloc(sizeof(int32_t) * (size_t)(tp * kr + 1));
    int32_t n = 0;
    int64_t per = (V + tp - 1) / tp;
    for (int q = 0; q < tp; q++) {
        int64_t a = q * per, b = a + per < V ? a + per : V;
        /* top kr of the slice (value desc, id asc) by repeated selection: small sizes only */
        float *tmp = malloc(sizeof(float) * (size_t)(b - a));
        memcpy(tmp, row + a, sizeof(float) * (size_t)(b - a));
        qsort(tmp, (size_t)(b - a), sizeof(float), cmp_desc);
        int32_t k = kr < b - a ? kr : (int32_t)(b - a);
        float kth = tmp[k - 1];
        int32_t got = 0;
        for (int64_t i = a; i < b && got < k; i++) if (row[i] > kth) { cv[n] = row[i]; ci[n] = (int32_t)i; n++; got++; }
        for (int64_t i = a; i < b && got < k; i++) if (row[i] == kth) { cv[n] = row[i]; ci[n] = (int32_t)i; n++; got++; }
        free(tmp);
    }
    float lse = lse_of(row, (int)V);
    int32_t t;
    if (pln_sample_candidates_suffice(p, cv, n, lse, V)) {
        t = pln_sample_pick(p, r, cv, ci, n, lse, NULL);
    } else {
        int32_t *all = malloc(sizeof(int32_t) * (size_t)V);
        for (int64_t i = 0; i < V; i++) all[i] = (int32_t)i;
        t = pln_sample_pick(p, r, row, all, (int32_t)V, lse, NULL);
        free(all);
        (*full_used)++;
    }
    free(cv); free(ci);
    return t;
}

static void test_tp_invariance(void) {
    enum { V = 1003 };
    static float row[V];
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        row[i] = (float)((x >> 40) % 10000) / 1000.0f - 5.0f;   /* ties are likely: 10000 levels */
    }
    pln_sample_params cases[4] = {sampling(1, 0, 0.1f, 5), sampling(0.8f, 5, 1, 6), sampling(1, 50, 0.95f, 7),
                                  sampling(1, 0, 1, 8)};
    for (int c = 0; c < 4; c++) {
        int mismatch = 0, full = 0;
        for (int seed = 0; seed < 60; seed++) {
            int32_t ref = -1;
            for (int tp = 1; tp <= 4; tp++) {
                pln_rng r;
                pln_rng_seed(&r, (uint64_t)seed);
                int32_t kr = cases[c].top_k + 1 > 64 ? cases[c].top_k + 1 : 64;
                int32_t t = engine_pick(&cases[c], &r, row, V, tp, kr, &full);
                if (tp == 1) ref = t;
                else mismatch += t != ref;
            }
        }
        CHECK(mismatch == 0, "case %d: tokens differ across TP sizes %d times (full rows used %d)", c, mismatch, full);
    }
    /* plain sampling never suffices on candidates; greedy always does */
    pln_sample_params plain = sampling(1, 0, 1, 0), greedy;
    pln_sample_params_default(&greedy);
    float cv[3] = {1, 2, 3};
    CHECK(!pln_sample_candidates_suffice(&plain, cv, 3, 5.0f, 1000), "plain sampling needs the full row");
    CHECK(pln_sample_candidates_suffice(&plain, cv, 3, 5.0f, 3), "n >= vocab suffices");
    CHECK(pln_sample_candidates_suffice(&greedy, cv, 3, 5.0f, 1000), "greedy suffices");
    /* top-p: candidate mass 0.5+0.25 reaches 0.7 but not 0.8 */
    float q[2] = {logf(0.5f), logf(0.25f)};
    pln_sample_params tp7 = sampling(1, 0, 0.7f, 0), tp8 = sampling(1, 0, 0.8f, 0);
    CHECK(pln_sample_candidates_suffice(&tp7, q, 2, 0.0f, 100), "top_p reached within candidates");
    CHECK(!pln_sample_candidates_suffice(&tp8, q, 2, 0.0f, 100), "top_p not reached within candidates");
    /* top-k: bounded within candidates unless a tie at the k-th value may continue past them */
    float kv[4] = {3, 2, 1, 0}, kt[4] = {3, 2, 2, 0};
    pln_sample_params k2 = sampling(1, 2, 1, 0);
    CHECK(pln_sample_candidates_suffice(&k2, kv, 4, 4.0f, 100), "top_k bounded within candidates");
    CHECK(!pln_sample_candidates_suffice(&k2, kt, 4, 4.0f, 100), "tie at the k-th value: full row");
    CHECK(!pln_sample_candidates_suffice(&k2, kv, 2, 4.0f, 100), "only k candidates: cannot see ties");
}

/* Reference: sort everything (value desc, id asc), top-k with ties, top-p, draw — the plain
 * reading of sampler.h, against which the subset selection of pln_sample_pick is checked. */
typedef struct { float v; int32_t id; } rc_t;
static int rc_cmp(const void *a, const void *b) {
    const rc_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static int rc_cmp_id(const void *a, const void *b) {
    const rc_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t ref_pick(const pln_sample_params *p, pln_rng *r, const float *v, const int32_t *ids, int32_t n, float lse) {
    rc_t *c = malloc(sizeof(rc_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) { c[i].v = v[i]; c[i].id = ids[i]; }
    bool topk_on = p->top_k > 0 && p->top_k < n;
    int32_t m = n;
    double norm = lse;
    if (!topk_on && p->top_p >= 1.0f) {
        qsort(c, (size_t)n, sizeof *c, rc_cmp_id);
    } else {
        qsort(c, (size_t)n, sizeof *c, rc_cmp);
        if (topk_on) {
            m = p->top_k;
            while (m < n && c[m].v >= c[p->top_k - 1].v) m++;
            double mx = c[0].v, s = 0;
            for (int32_t i = 0; i < m; i++) s += exp((double)c[i].v - mx);
            norm = mx + log(s);
        }
        if (p->top_p < 1.0f) {
            double cum = 0;
            int32_t keep = m;
            for (int32_t i = 0; i < m; i++) {
                cum += exp((double)c[i].v - norm);
                if (cum >= (double)p->top_p - 1e-7) { keep = i + 1; break; }
            }
            m = keep;
        }
    }
    double mx = -INFINITY, total = 0, cum = 0;
    for (int32_t i = 0; i < m; i++) if (c[i].v > mx) mx = c[i].v;
    for (int32_t i = 0; i < m; i++) total += exp((double)c[i].v - mx);
    double u = pln_rng_uniform(r) * total;
    int32_t id = c[m - 1].id;
    for (int32_t i = 0; i < m; i++) {
        cum += exp((double)c[i].v - mx);
        if (u < cum) { id = c[i].id; break; }
    }
    free(c);
    return id;
}

static void test_large_rows(void) {
    enum { V = 250880 };
    float *v = malloc(sizeof(float) * V);
    int32_t *ids = malloc(sizeof(int32_t) * V), *rev = malloc(sizeof(int32_t) * V);
    float *rv = malloc(sizeof(float) * V);
    uint64_t x = 4242;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* a peaked row like real logits: most mass in a few hundred tokens, many ties */
        double u = (double)(x >> 11) * 0x1.0p-53;
        v[i] = (float)(-12.0 * u * u + (double)((x >> 3) % 4) * 0.25);
        if (i % 997 == 0) v[i] += 9.0f;
        ids[i] = i;
    }
    for (int i = 0; i < V; i++) { rev[i] = V - 1 - i; rv[i] = v[V - 1 - i]; }   /* same row, reversed order */
    float lse = lse_of(v, V);
    pln_sample_params cases[5] = {sampling(1, 0, 0.9f, 0), sampling(1, 40, 1, 0), sampling(1, 300, 0.5f, 0),
                                  sampling(1, 0, 1, 0), sampling(1, 0, 0.999f, 0)};
    for (int c = 0; c < 5; c++) {
        int bad = 0;
        double t_fast = 0;
        for (int seed = 0; seed < 8; seed++) {
            pln_rng a, b, d;
            pln_rng_seed(&a, (uint64_t)seed); pln_rng_seed(&b, (uint64_t)seed); pln_rng_seed(&d, (uint64_t)seed);
            double t0 = pln_now();
            int32_t got = pln_sample_pick(&cases[c], &a, v, ids, V, lse, NULL);
            t_fast += pln_now() - t0;
            int32_t got_rev = pln_sample_pick(&cases[c], &d, rv, rev, V, lse, NULL);
            int32_t want = ref_pick(&cases[c], &b, v, ids, V, lse);
            bad += got != want || got_rev != want;
        }
        CHECK(bad == 0, "large row case %d (top_k %d, top_p %g): %d of 8 picks differ from sort-everything",
              c, cases[c].top_k, (double)cases[c].top_p, bad);
        printf("pick over %d logits, top_k %d top_p %g: %.2f ms\n", V, cases[c].top_k, (double)cases[c].top_p,
               t_fast / 8 * 1e3);
    }
    free(v); free(ids); free(rev); free(rv);
}

static void test_penalty(void) {
    /* HF: seen ids (distinct) divided when > 0, multiplied when < 0; then / temperature */
    float l[6] = {2.0f, -2.0f, 0.0f, 1.0f, 3.0f, -1.0f};
    int32_t seen[7] = {0, 1, 2, 0, 7, -1, 0};
    pln_logits_apply_penalty_temp(l, 6, seen, 7, 2.0f, 0.5f);
    float want[6] = {2.0f, -8.0f, 0.0f, 2.0f, 6.0f, -2.0f};
    for (int i = 0; i < 6; i++) CHECK(l[i] == want[i], "penalty+temperature id %d: %g want %g", i, l[i], want[i]);
    /* penalty < 1 raises seen logits (HF allows it) */
    float m[3] = {1.5f, -1.5f, 4.0f};
    int32_t s2[2] = {0, 1};
    pln_logits_apply_penalty_temp(m, 3, s2, 2, 0.5f, 1.0f);
    CHECK(m[0] == 3.0f && m[1] == -0.75f && m[2] == 4.0f, "penalty 0.5: %g %g %g", m[0], m[1], m[2]);
    /* off: penalty 1 and temperature 1 change nothing; temperature divides (not * 1/t) */
    float o[2] = {0.3f, -0.7f};
    pln_logits_apply_penalty_temp(o, 2, s2, 2, 1.0f, 1.0f);
    CHECK(o[0] == 0.3f && o[1] == -0.7f, "penalty/temperature off");
    float d[1] = {1.0f};
    pln_logits_apply_penalty_temp(d, 1, NULL, 0, 1.0f, 3.0f);
    CHECK(d[0] == 1.0f / 3.0f, "temperature divides: %.9g", d[0]);
}

/* HF TypicalLogitsWarper on 6 logits {3,2,1,0,-1,-3}: the kept sets below come from running
 * HF's algorithm (entropy, |-logp - H| order, cumsum < mass) on them. Every seed must draw
 * inside the kept set, and over many seeds every kept token shows up. */
static void test_typical(void) {
    const float v[6] = {3, 2, 1, 0, -1, -3};
    const int32_t ids[6] = {0, 1, 2, 3, 4, 5};
    const struct { float mass; int n; int32_t keep[3]; } cases[] = {
        {0.2f, 1, {1}}, {0.5f, 2, {0, 1}}, {0.9f, 3, {0, 1, 2}}, {0.95f, 3, {0, 1, 2}}};
    float lse = 0;
    {
        double s = 0;
        for (int i = 0; i < 6; i++) s += exp((double)v[i] - 3.0);
        lse = (float)(3.0 + log(s));
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pln_sample_params p = sampling(1.0f, 0, 1.0f, 0);
        p.typical_p = cases[c].mass;
        bool seen[6] = {false};
        for (uint64_t seed = 0; seed < 400; seed++) {
            pln_rng r;
            pln_rng_seed(&r, seed);
            int32_t id = pln_sample_pick(&p, &r, v, ids, 6, lse, NULL);
            CHECK(id >= 0 && id < 6, "typical id in range");
            seen[id] = true;
        }
        int n = 0;
        for (int i = 0; i < 6; i++) n += seen[i];
        bool match = n == cases[c].n;
        for (int k = 0; k < cases[c].n; k++) match &= seen[cases[c].keep[k]];
        CHECK(match, "typical_p %.2f: drew %d distinct tokens, HF keeps %d", (double)cases[c].mass, n, cases[c].n);
        /* full candidates decide typical only through top-k / top-p */
        CHECK(!pln_sample_candidates_suffice(&p, v, 6, lse, 1000), "typical alone needs the full row");
    }
    pln_sample_params bad = sampling(1.0f, 0, 1.0f, 0);
    bad.typical_p = 1.5f;
    CHECK(pln_sample_params_check(&bad) == -1 && !strncmp(pln_error(), "typical_p", 9), "typical_p 1.5 refused");
    bad.typical_p = 1.0f;
    bad.presence_penalty = NAN;
    CHECK(pln_sample_params_check(&bad) == -1, "NaN presence_penalty refused");
}

int main(void) {
    test_begin("test_sampler");
    test_params();
    test_rng();
    test_greedy();
    test_topk_topp();
    test_determinism();
    test_tp_invariance();
    test_large_rows();
    test_penalty();
    test_typical();
    return test_done();
}
