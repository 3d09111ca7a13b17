/* sampler.c — Hugging Face sampling semantics on the host (see sampler.h): parameter checks,
 * the seeded RNG, greedy / top-k / top-p picks over candidates merged from ranks, and the
 * reference repetition penalty + temperature the CPU backend and the tests are checked against. */
#include "runtime/sampler.h"

#include "formats/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Top-p compares the cumulative mass with p in double precision; HF does it in float32, so a
 * mass within this of p is taken as reaching it (a set whose mass is "exactly p" stops there). */
#define SAMPLE_TOP_P_EPS 1e-7

void pln_sample_params_default(pln_sample_params *p) {
    memset(p, 0, sizeof *p);
    p->do_sample = false;
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->seed = 0;
}

int pln_sample_params_check(const pln_sample_params *p) {
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return pln_errorf("temperature: must be a finite number >= 0 (got %g)", (double)p->temperature);
    if (p->do_sample && p->temperature <= 0.0f)
        return pln_errorf("temperature: must be > 0 when do_sample is true (got %g); use do_sample=false for greedy",
                          (double)p->temperature);
    if (p->top_k < 0) return pln_errorf("top_k: must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return pln_errorf("top_p: must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f))
        return pln_errorf("repetition_penalty: must be a finite number > 0 (1 = off), got %g",
                          (double)p->repetition_penalty);
    return 0;
}

/* ---- RNG: xoshiro256** (Blackman & Vigna), seeded by splitmix64 ------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void pln_rng_seed(pln_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pln_rng_next(pln_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double pln_rng_uniform(pln_rng *r) { return (double)(pln_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- candidates ---------------------------------------------------------------------------- */

typedef struct { float v; int32_t id; } cand;

/* NaN ranks below everything (a broken logit must never be chosen over a real one). */
static inline float cand_key(float v) { return isnan(v) ? -INFINITY : v; }

/* Canonical order: larger value first, lower id on ties. The draw walks the kept set in this
 * order, so the same seed picks the same token whatever order (and TP size) candidates came in. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    float kx = cand_key(x->v), ky = cand_key(y->v);
    if (kx != ky) return kx > ky ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static cand *cand_sorted(const float *vals, const int32_t *ids, int32_t n) {
    cand *c = pln_xmalloc((size_t)n * sizeof *c);
    for (int32_t i = 0; i < n; i++) { c[i].v = cand_key(vals[i]); c[i].id = ids ? ids[i] : i; }
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    return c;
}

static bool is_greedy(const pln_sample_params *p) { return !p->do_sample || p->temperature == 0.0f; }

/* Number of leading sorted candidates top-k keeps: every one >= the k-th value (ties kept). */
static int32_t topk_keep(const cand *c, int32_t n, int32_t top_k) {
    if (top_k <= 0 || top_k >= n) return n;
    float kth = c[top_k - 1].v;
    int32_t m = top_k;
    while (m < n && c[m].v >= kth) m++;
    return m;
}

static double lse_of(const cand *c, int32_t m) {
    double mx = c[0].v, s = 0;
    if (mx == -INFINITY) return -INFINITY;
    for (int32_t i = 0; i < m; i++) s += exp((double)c[i].v - mx);
    return mx + log(s);
}

/* Number of leading candidates top-p keeps: the smallest prefix whose mass (relative to
 * norm_lse) reaches p, at least one. *reached says whether the mass reached p within m. */
static int32_t topp_keep(const cand *c, int32_t m, float top_p, double norm_lse, bool *reached) {
    *reached = true;
    if (top_p >= 1.0f) return m;
    double cum = 0;
    for (int32_t i = 0; i < m; i++) {
        cum += exp((double)c[i].v - norm_lse);
        if (cum >= (double)top_p - SAMPLE_TOP_P_EPS) return i + 1;
    }
    *reached = false;
    return m;
}

int32_t pln_sample_pick(const pln_sample_params *p, pln_rng *rng, const float *vals, const int32_t *ids,
                        int32_t n, float lse, float *logprob_out) {
    PLN_ASSERT(n >= 1);
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        float a = cand_key(vals[i]), b = cand_key(vals[best]);
        if (a > b || (a == b && ids[i] < ids[best])) best = i;
    }
    int32_t chosen = best;
    if (!is_greedy(p) && cand_key(vals[best]) != -INFINITY) {
        cand *g = cand_sorted(vals, ids, n);
        int32_t m = topk_keep(g, n, p->top_k);
        /* HF order: TopK sets the others to -inf before TopP's softmax, so with top-k active
         * the top-p mass is relative to the kept set; otherwise to the whole vocabulary. */
        double norm = (p->top_k > 0 && n > p->top_k) ? lse_of(g, m) : (double)lse;
        bool reached;
        m = topp_keep(g, m, p->top_p, norm, &reached);
        double mx = g[0].v, total = 0;
        for (int32_t i = 0; i < m; i++) total += exp((double)g[i].v - mx);
        double u = pln_rng_uniform(rng) * total, cum = 0;
        int32_t pick = m - 1;
        for (int32_t i = 0; i < m; i++) {
            cum += exp((double)g[i].v - mx);
            if (u < cum) { pick = i; break; }
        }
        for (int32_t i = 0; i < n; i++) if (ids[i] == g[pick].id) { chosen = i; break; }
        free(g);
    }
    if (logprob_out) *logprob_out = cand_key(vals[chosen]) - lse;
    return ids[chosen];
}

bool pln_sample_candidates_suffice(const pln_sample_params *p, const float *vals, int32_t n, float lse,
                                   int64_t vocab) {
    if (n < 1) return false;
    if (is_greedy(p) || (int64_t)n >= vocab) return true;
    bool topk_on = p->top_k > 0 && (int64_t)p->top_k < vocab;
    if (!topk_on && p->top_p >= 1.0f) return false;     /* plain sampling draws from every token */
    cand *c = cand_sorted(vals, NULL, n);
    bool ok;
    if (topk_on) {
        if (n <= p->top_k) { free(c); return false; }
        /* A tie at the k-th value may continue past a rank's candidate list: then only the
         * full row decides. (Callers send more than top_k candidates per rank, so a tie that
         * was cut shows up here as more than top_k values >= the k-th.) */
        int32_t m = topk_keep(c, n, p->top_k);
        ok = m == p->top_k;
    } else {
        bool reached;
        topp_keep(c, n, p->top_p, (double)lse, &reached);
        ok = reached;
    }
    free(c);
    return ok;
}

/* ---- reference logits processing ---------------------------------------------------------- */

void pln_logits_apply_penalty_temp(float *logits, int64_t n, const int32_t *seen, int n_seen, float penalty,
                                   float temperature) {
    if (penalty != 1.0f && penalty > 0.0f && n_seen > 0) {
        /* HF gathers the seen logits, changes them, scatters them back: a repeated id is
         * penalised once. A bitmap marks what was done. */
        uint8_t *done = pln_xcalloc((size_t)(n + 7) / 8, 1);
        for (int i = 0; i < n_seen; i++) {
            int64_t id = seen[i];
            if (id < 0 || id >= n || (done[id >> 3] & (1u << (id & 7)))) continue;
            done[id >> 3] |= (uint8_t)(1u << (id & 7));
            logits[id] = logits[id] < 0.0f ? logits[id] * penalty : logits[id] / penalty;
        }
        free(done);
    }
    if (temperature > 0.0f && temperature != 1.0f)
        for (int64_t i = 0; i < n; i++) logits[i] = logits[i] / temperature;
}
