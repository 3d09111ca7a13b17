/* rope.c — rotary position embedding on the CPU, in place on the q and k heads of the grouped
 * qkv layout (backend.h rope): transformers' rotate_half convention, angles (float)pos * inv_freq[i]
 * as one fp32 product, cosf/sinf in fp32, and x cos and rotate_half(x) sin rounded separately
 * before their sum, the order of torch's q * cos + rotate_half(q) * sin. */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <stdlib.h>

/* One head's pairs (i, i + d/2) rotated by cos c[i], sin s[i]. */
static void rotate_head(float *x, const float *c, const float *s, int32_t half) {
    for (int32_t i = 0; i < half; i++) {
        float x0 = x[i], x1 = x[i + half];
        x[i] = pln_rope_lo(x0, x1, c[i], s[i]);
        x[i + half] = pln_rope_hi(x0, x1, c[i], s[i]);
    }
}

/* Token t: its angles once, then every q and k head (the first n_rot heads of its row). */
static void rope_token(float *row, int32_t pos, const float *inv_freq, int32_t n_rot,
                       int32_t head_dim, float *cs) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        cs[i] = cosf(a);
        cs[half + i] = sinf(a);
    }
    for (int32_t h = 0; h < n_rot; h++) rotate_head(row + (int64_t)h * head_dim, cs, cs + half, half);
}

int pln_cpu_rope(pln_cpu *c, float *qkv, const pln_attn_meta *m, const float *inv_freq,
                 int32_t n_head, int32_t head_dim) {
    int32_t T = m->n_tokens, n_rot = n_head + m->n_kv_head;
    int64_t stride = (int64_t)(n_head + 2 * m->n_kv_head) * head_dim;
    if (c->isa == PLN_CPU_ISA_REF) {
        float *cs = malloc((size_t)head_dim * sizeof *cs);
        if (!cs) return pln_errorf("rope: out of memory for head_dim %d", head_dim);
        for (int32_t t = 0; t < T; t++) rope_token(qkv + t * stride, m->tok_pos[t], inv_freq, n_rot, head_dim, cs);
        free(cs);
        return 0;
    }
    int nth = pln_cpu_threads(c);
    size_t cs_stride = pln_cpu_thread_stride((size_t)head_dim);   /* THREAD_GAP_NOTE */
    float *cs = malloc((size_t)nth * cs_stride * sizeof *cs);
    if (!cs) return pln_errorf("rope: out of memory for %d threads' angles", nth);
    #pragma omp parallel num_threads(nth) if (T > 1 && (int64_t)T * stride > 32768)
    {
        float *mine = cs + (size_t)omp_get_thread_num() * cs_stride;
        #pragma omp for schedule(static)
        for (int32_t t = 0; t < T; t++) rope_token(qkv + t * stride, m->tok_pos[t], inv_freq, n_rot, head_dim, mine);
    }
    free(cs);
    return 0;
}
