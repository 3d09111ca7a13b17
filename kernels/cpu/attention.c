/* attention.c — KV-cache append and causal attention (ALiBi or none) over the paged cache on the CPU.
 *
 * Cache layout (backend.h): per layer [n_blocks][n_kv][block_size][head_dim] F32, or F16 when
 * the backend's kv_dtype says so (kv_append rounds to nearest even, attention converts back
 * exactly: the result is F32 attention over the rounded keys and values); a sequence's
 * key j is row j % block_size of block block_table[s * max_blocks + j / block_size]. Within a
 * block one head's keys are contiguous rows, which is what the fast path walks.
 * Scores = q·k / sqrt(head_dim) + slope * j (HF's baddbmm(alibi, q, kᵀ, alpha = 1/sqrt(d))); no
 * slopes (rotary models): slope 0, transformers' Llama q·kᵀ * d^-0.5.
 * Head layouts (pln_attn_meta.n_kv_head): BLOOM's per-head interleaved q, k, v with one KV head
 * per q head (n_kv = n_head), or grouped-query with all q heads, then the k heads, then the v
 * heads, q head h reading KV head h / (n_head / n_kv). One code path serves both: qkv_layout says
 * where a head's rows are, and BLOOM is the group of one.
 * Sliding window (pln_attn_meta.window > 0): a query at position p reads keys
 * p - window < j <= p only; the keys before are never visited (key_start). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Where a token's heads sit in its qkv row (floats), and the cache's head count. */
typedef struct {
    int64_t stride;          /* one token's row */
    int64_t q_step;          /* q head h at h * q_step */
    int64_t kv_step, k0, v0; /* KV head g: k at k0 + g * kv_step, v at v0 + g * kv_step */
    int32_t n_kv;            /* heads in the cache */
    int32_t group;           /* q heads per KV head */
} qkv_layout;

static qkv_layout layout_of(const pln_attn_meta *m, int32_t n_head, int32_t head_dim) {
    int64_t d = head_dim;
    if (m->n_kv_head <= 0)   /* per head q, k, v (HF's [n_head, 3, head_dim] view) */
        return (qkv_layout){3 * n_head * d, 3 * d, 3 * d, d, 2 * d, n_head, 1};
    int64_t nk = m->n_kv_head;
    return (qkv_layout){(n_head + 2 * nk) * d, d, d, n_head * d, (n_head + nk) * d, m->n_kv_head,
                        n_head / m->n_kv_head};
}

/* Row j of sequence s, head h, in a K or V pool of n_head heads. */
static inline int64_t kv_offset(const pln_attn_meta *m, int32_t s, int32_t j, int32_t h,
                                int32_t n_head, int32_t head_dim) {
    int64_t b = m->block_table[(int64_t)s * m->max_blocks + j / m->block_size];
    return ((b * n_head + h) * m->block_size + j % m->block_size) * head_dim;
}

/* The first key a query at position pos reads: 0, or the start of its sliding window. */
static inline int32_t key_start(const pln_attn_meta *m, int32_t pos) {
    return m->window > 0 && pos >= m->window ? pos - m->window + 1 : 0;
}

/* n values of src into a cache row at element offset off. */
static inline void put_row(void *cache, int64_t off, const float *src, int32_t n, bool f16) {
    if (!f16) { memcpy((float *)cache + off, src, (size_t)n * sizeof(float)); return; }
    uint16_t *dst = (uint16_t *)cache + off;
    for (int32_t d = 0; d < n; d++) dst[d] = pln_f32_to_f16(src[d]);
}

/* Element i of a cache, as F32 (exact for F16). */
static inline float kv_at(const void *cache, int64_t i, bool f16) {
    return f16 ? pln_f16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

static void append_token(const float *qkv, void *k_cache, void *v_cache, const pln_attn_meta *m,
                         const qkv_layout *L, int32_t t, int32_t head_dim, bool f16) {
    int32_t s = m->tok_seq[t], j = m->tok_pos[t];
    const float *row = qkv + t * L->stride;
    for (int32_t g = 0; g < L->n_kv; g++) {
        int64_t off = kv_offset(m, s, j, g, L->n_kv, head_dim);
        put_row(k_cache, off, row + L->k0 + g * L->kv_step, head_dim, f16);
        put_row(v_cache, off, row + L->v0 + g * L->kv_step, head_dim, f16);
    }
}

void pln_cpu_kv_append(pln_cpu *c, const float *qkv, void *k_cache, void *v_cache,
                       const pln_attn_meta *m, int32_t n_head, int32_t head_dim, bool f16) {
    int32_t T = m->n_tokens;
    qkv_layout L = layout_of(m, n_head, head_dim);
    if (c->isa == PLN_CPU_ISA_REF) {
        for (int32_t t = 0; t < T; t++) append_token(qkv, k_cache, v_cache, m, &L, t, head_dim, f16);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 8)
    for (int32_t t = 0; t < T; t++) append_token(qkv, k_cache, v_cache, m, &L, t, head_dim, f16);
}

/* The reference: all scores of a (token, head) into a buffer, max, exp, normalise, weigh V.
 * h: the KV head the query reads, of the cache's n_kv. */
static void attend_ref(float *o, const float *q, const void *k_cache, const void *v_cache,
                       const pln_attn_meta *m, int32_t s, int32_t pos, int32_t h, float slope,
                       int32_t n_kv, int32_t head_dim, float *scores, bool f16) {
    float scale = 1.0f / sqrtf((float)head_dim);
    float mx = -INFINITY;
    int32_t j0 = key_start(m, pos);
    for (int32_t j = j0; j <= pos; j++) {
        int64_t kj = kv_offset(m, s, j, h, n_kv, head_dim);
        float dot = 0.0f;
        for (int32_t d = 0; d < head_dim; d++) dot += q[d] * kv_at(k_cache, kj + d, f16);
        scores[j] = dot * scale + slope * (float)j;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0.0f;
    for (int32_t j = j0; j <= pos; j++) { scores[j] = expf(scores[j] - mx); sum += scores[j]; }
    for (int32_t d = 0; d < head_dim; d++) o[d] = 0.0f;
    for (int32_t j = j0; j <= pos; j++) {
        int64_t vj = kv_offset(m, s, j, h, n_kv, head_dim);
        float p = scores[j] / sum;
        for (int32_t d = 0; d < head_dim; d++) o[d] += p * kv_at(v_cache, vj + d, f16);
    }
}

/* Keys scored at a time: a stretch of one block's contiguous rows. */
#define KCHUNK 64

/* Queries of one head (consecutive tokens of one sequence) that walk the keys together. */
#define QGROUP 8

/* The fast path: one pass over the keys with an online softmax. Per stretch of keys: scores,
 * the stretch's max, then the running state (max m, sum l) and the unnormalised output are
 * rescaled by exp(m_old - m_new) as the stretch's weighted values are added.
 * nq <= QGROUP queries of sequence s that read KV head h of the cache's n_kv (query i at qkv +
 * i * qkv_stride, position pos[i], output at out + i * out_stride: a prefill's consecutive tokens
 * of one head, or one decode token's q heads of one KV group) share the walk: each stretch is
 * located once and read from cache by all of them, and their independent updates overlap in the
 * core where one query's chain (scores -> max -> exp -> o) would leave it idle. Every query's
 * arithmetic is the same whoever shares its walk (the stretches end at block and KCHUNK
 * boundaries, the last one at its own position): the batch-invariant promise. A sliding window
 * keeps it: the walk starts at the stretch (block start + a multiple of KCHUNK) that holds the
 * group's first key, and each query's first stretch starts at its own first key. */
static void attend_online(const pln_cpu_kernels *k, float *out, int64_t out_stride, const float *qkv,
                          int64_t qkv_stride, int32_t nq, const void *k_cache, const void *v_cache,
                          const pln_attn_meta *m, int32_t s, const int32_t *pos, int32_t h, float slope,
                          int32_t n_kv, int32_t head_dim, bool prefetch, bool f16) {
    size_t esz = f16 ? 2 : 4;
    float scale = 1.0f / sqrtf((float)head_dim);
    float sc[QGROUP][KCHUNK];
    pln_softmax_state st[QGROUP];
    int32_t last = 0, first = INT32_MAX, lo[QGROUP];
    for (int32_t i = 0; i < nq; i++) {
        st[i] = (pln_softmax_state){-INFINITY, 0.0f};
        memset(out + i * out_stride, 0, (size_t)head_dim * sizeof(float));
        if (pos[i] > last) last = pos[i];
        lo[i] = key_start(m, pos[i]);
        if (lo[i] < first) first = lo[i];
    }
    int32_t b0 = first - first % m->block_size;
    for (int32_t j0 = b0 + (first - b0) / KCHUNK * KCHUNK; j0 <= last;) {
        int32_t in_block = m->block_size - j0 % m->block_size;
        int32_t n = last + 1 - j0;
        if (n > in_block) n = in_block;
        if (n > KCHUNK) n = KCHUNK;
        int64_t off = kv_offset(m, s, j0, h, n_kv, head_dim);
        if (prefetch && j0 + n <= last) {
            /* the next stretch usually lives in another block, where the hardware prefetcher
             * would start cold: ask for its rows while this stretch is computed (decode only:
             * a prefill's keys are already in cache, read by the previous token) */
            int32_t j1 = j0 + n, n1 = m->block_size - j1 % m->block_size;
            if (n1 > last + 1 - j1) n1 = last + 1 - j1;
            if (n1 > KCHUNK) n1 = KCHUNK;
            int64_t off1 = kv_offset(m, s, j1, h, n_kv, head_dim);
            const char *kp = (const char *)k_cache + off1 * esz, *vp = (const char *)v_cache + off1 * esz;
            for (int64_t b = 0; b < (int64_t)n1 * head_dim * (int64_t)esz; b += 64) {
                __builtin_prefetch(kp + b);
                __builtin_prefetch(vp + b);
            }
        }
        for (int32_t qi = 0; qi < nq; qi++) {
            if (pos[qi] < j0 || lo[qi] >= j0 + n) continue;
            int32_t js = lo[qi] > j0 ? lo[qi] : j0;                            /* window: keys >= lo */
            int32_t nk = pos[qi] + 1 - js < j0 + n - js ? pos[qi] + 1 - js : j0 + n - js;   /* causal: keys <= pos */
            int64_t qoff = off + (int64_t)(js - j0) * head_dim;
            const float *q = qkv + qi * qkv_stride;
            float *o = out + qi * out_stride, *c_sc = sc[qi];
            if (f16) k->dots_f16(c_sc, q, (const uint16_t *)k_cache + qoff, nk, head_dim);
            else k->dots(c_sc, q, (const float *)k_cache + qoff, nk, head_dim);
            float bm = k->score_max(c_sc, nk, scale, slope, js);
            float m_new = st[qi].m > bm ? st[qi].m : bm;
            /* exp(0) = 1 exactly: no call when the running max holds (the usual case) */
            float c = st[qi].m == -INFINITY ? 0.0f : st[qi].m == m_new ? 1.0f : expf(st[qi].m - m_new);
            float l = st[qi].s * c + k->exp_sum(c_sc, nk, m_new);
            if (f16) k->weighted_sum_f16(o, c, c_sc, (const uint16_t *)v_cache + qoff, nk, head_dim);
            else k->weighted_sum(o, c, c_sc, (const float *)v_cache + qoff, nk, head_dim);
            st[qi].m = m_new; st[qi].s = l;
        }
        j0 += n;
    }
    for (int32_t qi = 0; qi < nq; qi++) {
        float inv = 1.0f / st[qi].s, *o = out + qi * out_stride;
        for (int32_t d = 0; d < head_dim; d++) o[d] *= inv;
    }
}

int pln_cpu_attention(pln_cpu *c, float *out, const float *qkv, const void *k_cache,
                      const void *v_cache, const pln_attn_meta *m, const float *slopes,
                      int32_t n_head, int32_t head_dim, bool f16) {
    int32_t T = m->n_tokens;
    qkv_layout L = layout_of(m, n_head, head_dim);
    int64_t out_stride = (int64_t)n_head * head_dim;
    if (c->isa == PLN_CPU_ISA_REF) {
        float *scores = malloc((size_t)(m->max_pos > 0 ? m->max_pos : 1) * sizeof *scores);
        if (!scores) return pln_errorf("attention: out of memory for %d scores", m->max_pos);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < n_head; h++)
                attend_ref(out + t * out_stride + (int64_t)h * head_dim, qkv + t * L.stride + h * L.q_step,
                           k_cache, v_cache, m, m->tok_seq[t], m->tok_pos[t], h / L.group,
                           slopes ? slopes[h] : 0.0f, L.n_kv, head_dim, scores, f16);
        free(scores);
        return 0;
    }
    const pln_cpu_kernels *k = c->k;
    bool decode = T <= m->n_seqs;
    /* work items: groups of up to QGROUP consecutive tokens of one sequence (a prefill's
     * neighbours; decode tokens are each their own sequence, so groups of one) */
    int32_t *grp = malloc(((size_t)T + 1) * sizeof *grp), n_grp = 0;
    if (!grp) return pln_errorf("attention: out of memory for %d tokens", T);
    for (int32_t t = 0; t < T; t++)
        if (t == 0 || t - grp[n_grp - 1] >= QGROUP || m->tok_seq[t] != m->tok_seq[t - 1]) grp[n_grp++] = t;
    grp[n_grp] = T;
    int64_t n_work = (int64_t)n_grp * n_head;
    int32_t span = m->window > 0 && m->window < m->max_pos ? m->window : m->max_pos;   /* keys per query, at most */
    /* guided: each thread's first run of items is whole heads (a prefill's heads cost alike),
     * which it then reads from its own cache instead of alternating groups with the other threads
     * over the same keys (cpu.h NEIGHBOUR_NOTE: bloom-560m fp16 prefill of 512 tokens, the two
     * vCPUs far apart, one binary alternating the two schedules: 547-600 tokens/s with single
     * items handed out, median 591, against 596-630 guided, median 612; Llama-3.2-1B 194-222
     * against 202-226); the last items go one at a time, and a descheduled thread's share still
     * goes to the others */
    #pragma omp parallel for schedule(guided) num_threads(pln_cpu_threads(c)) if (n_work > 1 && (int64_t)span * T * n_head * head_dim > 32768)
    for (int64_t w = 0; w < n_work; w++) {
        /* head-major: consecutive items are a prefill's consecutive tokens of one head, which
         * read the same keys and values while they are still in cache (and, grouped-query, the
         * next q heads of the same KV head) */
        int32_t h = (int32_t)(w / n_grp), g = (int32_t)(w % n_grp), t = grp[g], nt = grp[g + 1] - t;
        int32_t kvh = h / L.group, hg = h % L.group;
        float slope = slopes ? slopes[h] : 0.0f;
        if (nt == 1 && L.group > 1 && !slopes) {
            /* a lone token (decode): up to QGROUP q heads of its KV group walk the keys together,
             * so each stretch of K and V comes from memory once for all of them (one slope for
             * all: rotary models, the grouped ones); the item of the first head of each such run
             * does the run, the others nothing */
            if (hg % QGROUP) continue;
            int32_t nq = L.group - hg < QGROUP ? L.group - hg : QGROUP, pos[QGROUP];
            for (int32_t i = 0; i < nq; i++) pos[i] = m->tok_pos[t];
            attend_online(k, out + t * out_stride + (int64_t)h * head_dim, head_dim,
                          qkv + t * L.stride + h * L.q_step, L.q_step, nq, k_cache, v_cache, m,
                          m->tok_seq[t], pos, kvh, slope, L.n_kv, head_dim, decode, f16);
            continue;
        }
        attend_online(k, out + t * out_stride + (int64_t)h * head_dim, out_stride,
                      qkv + t * L.stride + h * L.q_step, L.stride, nt, k_cache, v_cache, m,
                      m->tok_seq[t], m->tok_pos + t, kvh, slope, L.n_kv, head_dim, decode, f16);
    }
    free(grp);
    return 0;
}
