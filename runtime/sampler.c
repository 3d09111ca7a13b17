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
    p->typical_p = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
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
    if (p->repetition_penalty < PLN_SAMPLE_MIN_PENALTY)
        return pln_errorf("repetition_penalty: must be >= %g (a smaller one divides the logits of seen tokens "
                          "into overflow), got %g", (double)PLN_SAMPLE_MIN_PENALTY, (double)p->repetition_penalty);
    if (!(p->typical_p >= 0.0f && p->typical_p <= 1.0f))
        return pln_errorf("typical_p: must be in [0, 1] (0 or 1 = off), got %g", (double)p->typical_p);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return pln_errorf("presence_penalty / frequency_penalty: must be finite (got %g, %g)",
                          (double)p->presence_penalty, (double)p->frequency_penalty);
    return 0;
}

static bool typical_on(const pln_sample_params *p) { return p->typical_p > 0.0f && p->typical_p < 1.0f; }

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

static int cand_cmp_id(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Canonical sort. Large sets (a top-p 0.999 over 250k logits keeps most of the row) use an LSD
 * radix sort on a 64-bit key: order-inverted float bits above, the id below — the same order as
 * cand_cmp (NaN is already -inf; -0 is made +0 as the comparison treats them equal). */
static uint32_t cand_fkey(float v) {
    uint32_t u;
    if (v == 0.0f) v = 0.0f;
    memcpy(&u, &v, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);   /* ascending as unsigned */
    return ~u;                                         /* descending */
}

static float cand_funkey(uint32_t k) {
    uint32_t u = ~k;
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static void cand_sort(cand *c, size_t n) {
    if (n < 512) { qsort(c, n, sizeof *c, cand_cmp); return; }
    uint64_t *k = pln_xmalloc(n * sizeof *k), *tmp = pln_xmalloc(n * sizeof *tmp);
    uint64_t all_or = 0, all_and = ~0ull;
    for (size_t i = 0; i < n; i++) {
        k[i] = ((uint64_t)cand_fkey(c[i].v) << 32) | (uint32_t)c[i].id;
        all_or |= k[i]; all_and &= k[i];
    }
    for (int shift = 0; shift < 64; shift += 8) {
        if ((((all_or ^ all_and) >> shift) & 0xFF) == 0) continue;   /* digit equal everywhere */
        size_t cnt[257] = {0};
        for (size_t i = 0; i < n; i++) cnt[((k[i] >> shift) & 0xFF) + 1]++;
        for (int d = 0; d < 256; d++) cnt[d + 1] += cnt[d];
        for (size_t i = 0; i < n; i++) tmp[cnt[(k[i] >> shift) & 0xFF]++] = k[i];
        uint64_t *t = k; k = tmp; tmp = t;
    }
    for (size_t i = 0; i < n; i++) { c[i].v = cand_funkey((uint32_t)(k[i] >> 32)); c[i].id = (int32_t)(uint32_t)k[i]; }
    free(k); free(tmp);
}

static cand *cand_sorted(const float *vals, const int32_t *ids, int32_t n) {
    cand *c = pln_xmalloc((size_t)n * sizeof *c);
    for (int32_t i = 0; i < n; i++) { c[i].v = cand_key(vals[i]); c[i].id = ids ? ids[i] : i; }
    cand_sort(c, (size_t)n);
    return c;
}

bool pln_sample_is_greedy(const pln_sample_params *p) {
    return !p->do_sample || !(p->temperature >= PLN_SAMPLE_MIN_TEMPERATURE);
}

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

/* The k-th largest key (k >= 1) of vals, by quickselect on a copy: O(n) on average. */
static float kth_largest(const float *vals, int32_t n, int32_t k) {
    float *a = pln_xmalloc((size_t)n * sizeof *a);
    for (int32_t i = 0; i < n; i++) a[i] = cand_key(vals[i]);
    int32_t lo = 0, hi = n - 1, want = k - 1;   /* position in descending order */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    while (lo < hi) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        float piv = a[lo + (int32_t)(x % (uint64_t)(hi - lo + 1))];
        /* three-way partition: > piv | == piv | < piv */
        int32_t lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            if (a[i] > piv) { float t = a[i]; a[i] = a[lt]; a[lt] = t; lt++; i++; }
            else if (a[i] < piv) { float t = a[i]; a[i] = a[gt]; a[gt] = t; gt--; }
            else i++;
        }
        if (want < lt) hi = lt - 1;
        else if (want > gt) lo = gt + 1;
        else { lo = hi = want; a[want] = piv; break; }
    }
    float r = a[want];
    free(a);
    return r;
}

/* The candidates whose key is >= tau, sorted canonically. */
static cand *cand_at_least(const float *vals, const int32_t *ids, int32_t n, float tau, int32_t *m_out) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) m += cand_key(vals[i]) >= tau;
    cand *c = pln_xmalloc((size_t)(m ? m : 1) * sizeof *c);
    m = 0;
    for (int32_t i = 0; i < n; i++)
        if (cand_key(vals[i]) >= tau) { c[m].v = cand_key(vals[i]); c[m].id = ids[i]; m++; }
    cand_sort(c, (size_t)m);
    *m_out = m;
    return c;
}

static inline bool cand_better(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

/* Rearranges c so that c[0..r) are the r best candidates (canonical order, ids distinct) with
 * r the smallest count whose mass sum exp(v - norm) reaches target; r = n if none does. */
static int32_t select_mass(cand *c, int32_t n, double target, double norm) {
    int32_t lo = 0, hi = n;
    double acc = 0;                 /* mass of c[0..lo), all better than c[lo..hi) */
    uint64_t x = 0x2545F4914F6CDD1Dull;
    while (hi - lo > 32) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int32_t pi = lo + (int32_t)(x % (uint64_t)(hi - lo));
        cand piv = c[pi];
        c[pi] = c[hi - 1];
        int32_t nb = lo;
        double mb = 0;
        for (int32_t i = lo; i < hi - 1; i++)
            if (cand_better(&c[i], &piv)) {
                mb += exp((double)c[i].v - norm);
                cand t = c[i]; c[i] = c[nb]; c[nb] = t;
                nb++;
            }
        c[hi - 1] = c[nb];
        c[nb] = piv;                /* c[lo..nb) better than piv, c[nb+1..hi) worse */
        if (acc + mb >= target) { hi = nb; continue; }
        acc += mb + exp((double)piv.v - norm);
        if (acc >= target) return nb + 1;
        lo = nb + 1;
    }
    qsort(c + lo, (size_t)(hi - lo), sizeof *c, cand_cmp);
    for (int32_t i = lo; i < hi; i++) {
        acc += exp((double)c[i].v - norm);
        if (acc >= target) return i + 1;
    }
    return hi < n ? hi : n;
}

/* Draws from the kept prefix c[0..m) (canonical order) in proportion to exp(value). */
static int32_t draw_sorted(const cand *c, int32_t m, pln_rng *rng) {
    double mx = c[0].v, total = 0;
    for (int32_t i = 0; i < m; i++) total += exp((double)c[i].v - mx);
    double u = pln_rng_uniform(rng) * total, cum = 0;
    for (int32_t i = 0; i < m; i++) {
        cum += exp((double)c[i].v - mx);
        if (u < cum) return c[i].id;
    }
    return c[m - 1].id;
}

/* HF TypicalLogitsWarper over the kept set c[0..m) (canonical order): returns the new count,
 * c[0..r) rearranged to the kept tokens in canonical order. */
typedef struct { double shift; cand c; } typ_item;
static int typ_cmp(const void *a, const void *b) {
    const typ_item *x = a, *y = b;
    if (x->shift != y->shift) return x->shift < y->shift ? -1 : 1;
    return cand_cmp(&x->c, &y->c);
}
static int32_t typical_keep(cand *c, int32_t m, float mass) {
    if (m <= 1) return m;
    double norm = lse_of(c, m), ent = 0;
    for (int32_t i = 0; i < m; i++) {
        double lp = (double)c[i].v - norm;
        if (isfinite(lp)) ent -= exp(lp) * lp;
    }
    typ_item *t = pln_xmalloc((size_t)m * sizeof *t);
    for (int32_t i = 0; i < m; i++) {
        double lp = (double)c[i].v - norm;
        t[i].shift = isfinite(lp) ? fabs(-lp - ent) : INFINITY;
        t[i].c = c[i];
    }
    qsort(t, (size_t)m, sizeof *t, typ_cmp);
    double cum = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < m; i++) {   /* last_ind = count(cumsum < mass), clamped to m - 1 */
        cum += exp((double)t[i].c.v - norm);
        if (cum < (double)mass) last = i + 1;
    }
    if (last > m - 1) last = m - 1;
    double bound = t[last].shift;
    int32_t r = 0;
    for (int32_t i = 0; i < m; i++)
        if (i == 0 || t[i].shift <= bound) c[r++] = t[i].c;   /* min_tokens_to_keep = 1 */
    free(t);
    cand_sort(c, (size_t)r);
    return r;
}

/* Sampling proper (not greedy; the best key is finite). The kept set is computed on a sorted
 * subset that provably contains it — the top-k value and its ties, or the values above a
 * threshold whose mass already reaches top_p — so a full 250k-entry row is not sorted whole.
 * The result is the same as sorting everything. */
static int32_t sample_draw(const pln_sample_params *p, pln_rng *rng, const float *vals, const int32_t *ids,
                           int32_t n, float lse, float mx) {
    bool topk_on = p->top_k > 0 && p->top_k < n;
    if (!topk_on && p->top_p >= 1.0f && !typical_on(p)) {
        /* plain sampling: every token, drawn in id order (the kept set is the whole row here,
         * whatever the TP size, so any fixed order is canonical) */
        cand *c = pln_xmalloc((size_t)n * sizeof *c);
        bool sorted = true;
        for (int32_t i = 0; i < n; i++) {
            c[i].v = cand_key(vals[i]); c[i].id = ids[i];
            if (i && ids[i] < ids[i - 1]) sorted = false;
        }
        if (!sorted) qsort(c, (size_t)n, sizeof *c, cand_cmp_id);
        double total = 0;
        for (int32_t i = 0; i < n; i++) total += exp((double)c[i].v - mx);
        double u = pln_rng_uniform(rng) * total, cum = 0;
        int32_t id = c[n - 1].id;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].v - mx);
            if (u < cum) { id = c[i].id; break; }
        }
        free(c);
        return id;
    }
    cand *g = NULL;
    int32_t m = 0;
    double norm = lse;
    if (topk_on) {
        /* HF order: TopK sets the others to -inf before TopP's softmax, so with top-k active
         * the top-p mass is relative to the kept set; otherwise to the whole vocabulary. */
        g = cand_at_least(vals, ids, n, kth_largest(vals, n, p->top_k), &m);
        norm = lse_of(g, m);
    } else if (n > 256 && p->top_p < 1.0f) {
        /* top-p alone: select (weighted quickselect, O(n)) the best candidates whose mass
         * reaches p plus a hair, then sort just those; the prefix sums over them are the very
         * sums a full sort would make, so the boundary is the same */
        g = pln_xmalloc((size_t)n * sizeof *g);
        for (int32_t i = 0; i < n; i++) { g[i].v = cand_key(vals[i]); g[i].id = ids[i]; }
        m = select_mass(g, n, (double)p->top_p - SAMPLE_TOP_P_EPS + 1e-9, norm);
        cand_sort(g, (size_t)m);
        bool reached;
        int32_t keep = topp_keep(g, m, p->top_p, norm, &reached);
        if (reached || m == n) {
            if (typical_on(p)) keep = typical_keep(g, keep, p->typical_p);
            int32_t id = draw_sorted(g, keep, rng);
            free(g);
            return id;
        }
        free(g);   /* rounding put the boundary outside the selection: sort everything */
        g = NULL;
    }
    if (!g) g = cand_at_least(vals, ids, n, -INFINITY, &m);
    bool reached;
    m = topp_keep(g, m, p->top_p, norm, &reached);
    if (typical_on(p)) m = typical_keep(g, m, p->typical_p);
    int32_t id = draw_sorted(g, m, rng);
    free(g);
    return id;
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
    float mx = cand_key(vals[best]);
    if (!pln_sample_is_greedy(p) && mx != -INFINITY) {
        int32_t id = sample_draw(p, rng, vals, ids, n, lse, mx);
        for (int32_t i = 0; i < n; i++) if (ids[i] == id) { chosen = i; break; }
    }
    if (logprob_out) *logprob_out = cand_key(vals[chosen]) - lse;
    return ids[chosen];
}

bool pln_sample_candidates_suffice(const pln_sample_params *p, const float *vals, int32_t n, float lse,
                                   int64_t vocab) {
    if (n < 1) return false;
    if (pln_sample_is_greedy(p) || (int64_t)n >= vocab) return true;
    bool topk_on = p->top_k > 0 && (int64_t)p->top_k < vocab;
    if (!topk_on && p->top_p >= 1.0f) return false;     /* plain sampling (or typical alone) draws from every token */
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
