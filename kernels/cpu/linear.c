/* linear.c — y = x · Wᵀ (+ bias) (then GeLU, or SwiGLU) from F16, I8 or packed int4 weights, fp32
 * accumulation; also the logits (the tied embedding slice, rows beyond n_valid left to the caller).
 *
 * Fast path: the weight is read from memory once per PLN_CPU_TCHUNK tokens. Threads take the
 * output rows 64 at a time (a contiguous 64-row stretch of W each), the micro kernel reuses each
 * weight vector for a block of tokens held in registers, and the epilogue (bias, GeLU) runs on
 * the tile while it is still in cache.
 *
 * SWIGLU_NOTE: with PLN_EPI_SWIGLU the unit of work is a stretch of output columns i of [T, I]:
 * every path computes the gate rows r0 + i into the output and the matching up rows I + r0 + i
 * into a small scratch tile with the very kernels it uses for any other rows, then silu_mul
 * combines the two while both are in cache. The [T, 2I] projection is never written out, and each
 * value is the one linear then swiglu would give (the same products, the same silu_mul). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* Rows per unit of parallel work: small enough to balance 2..64 threads on 2048 rows, large
 * enough that each unit streams several KiB of weights. */
#define RCHUNK 16
/* The integer-dot path's rows per unit: its tiles are 32 rows wide (cpu.h gemm_q8). */
#define QCHUNK 32
/* Tokens quantized at once for the integer-dot path (QTOK x K bytes: 7 MiB at BLOOM-176B width). */
#define QTOK 512

/* STREAM_NOTE: memory-bound steps (GEMVs, a few int4 tokens) hand out their row chunks guided:
 * each grab is the chunks left over the threads (libgomp; OpenMP asks for proportional to it), so
 * the first runs are long contiguous streams for the prefetch (simd_avx512.c PREFETCH_NOTE, GEMV_NOTE) and the last ones single
 * chunks, so both threads stream to the end: a lone thread draws less of the memory bandwidth
 * than two. A descheduled thread's remaining chunks still go to the others. Measured on bloom-1b7
 * int8 at batch 1 (2 Zen 5 cores, interleaved, each step beside its own copy): 89.8-92.3 % of the
 * copy, against 84.2-89.4 % with runs of a quarter of each thread's share; one chunk at a time had
 * measured 1.2-1.3x slower than a plain read of the same bytes (bloom-560m int4 g32). */

static float weight_at(const pln_weight *W, int64_t r, int64_t k) {
    if (W->dtype == PLN_DTYPE_F16) return pln_f16_to_f32(((const uint16_t *)W->w)[r * W->cols + k]);
    float scale = pln_f16_to_f32(W->scale[r * (W->cols / W->group) + k / W->group]);
    if (W->dtype == PLN_DTYPE_U8) return pln_dequant_i4(pln_i4_get((const uint8_t *)W->w + r * (W->cols / 2), k), scale);
    return pln_dequant_i8(((const int8_t *)W->w)[r * W->cols + k], scale);
}

static float dot_ref(const float *x, const pln_weight *W, int64_t r, const uint16_t *bias) {
    float acc = 0.0f;
    for (int64_t k = 0; k < W->cols; k++) acc += x[k] * weight_at(W, r, k);
    if (bias) acc += pln_f16_to_f32(bias[r]);
    return acc;
}

/* The reference: one dot product per output, written the obvious way. */
static void linear_ref(float *out, int64_t ldo, const float *in, const pln_weight *W,
                       int64_t n_rows, const uint16_t *bias, int32_t T, pln_epilogue epi) {
    int64_t K = W->cols, I = n_rows / 2;
    for (int32_t t = 0; t < T; t++) {
        if (epi == PLN_EPI_SWIGLU) {
            for (int64_t i = 0; i < I; i++)
                out[t * ldo + i] = pln_silu(dot_ref(in + t * K, W, i, bias)) * dot_ref(in + t * K, W, I + i, bias);
            continue;
        }
        for (int64_t r = 0; r < n_rows; r++) {
            float acc = dot_ref(in + t * K, W, r, bias);
            out[t * ldo + r] = epi == PLN_EPI_GELU ? pln_gelu(acc) : acc;
        }
    }
}

/* The SwiGLU epilogue of a tile (SWIGLU_NOTE): o[t * ldo + i] holds gate row r0 + i of token t,
 * u[t * ldu + i] up row I + r0 + i, i < nr; o becomes silu(gate + bias) * (up + bias). */
static void swiglu_tile(const pln_cpu_kernels *k, float *o, int64_t ldo, float *u, int64_t ldu, int64_t nt,
                        const uint16_t *bias, int64_t r0, int64_t I, int64_t nr) {
    for (int64_t t = 0; t < nt; t++) {
        if (bias) {
            k->bias_gelu(o + t * ldo, bias + r0, nr, false);
            k->bias_gelu(u + t * ldu, bias + I + r0, nr, false);
        }
        k->silu_mul(o + t * ldo, o + t * ldo, u + t * ldu, nr);
    }
}

/* rows rr .. rr + nr of W against nt tokens (ldx K) into out (ldo): the tier's tiled kernels */
static void gemm_rows(const pln_cpu_kernels *k, float *out, int64_t ldo, const float *x, int64_t nt,
                      const pln_weight *W, int64_t rr, int64_t nr) {
    int64_t K = W->cols;
    if (W->dtype == PLN_DTYPE_F16)
        k->gemm_f16(out, ldo, x, K, nt, (const uint16_t *)W->w + rr * K, nr, K);
    else if (W->dtype == PLN_DTYPE_U8)
        k->gemm_i4(out, ldo, x, K, nt, (const uint8_t *)W->w + rr * (K / 2), W->scale + rr * (K / W->group), W->group,
                   nr, K);
    else
        k->gemm_i8(out, ldo, x, K, nt, (const int8_t *)W->w + rr * K, W->scale + rr * (K / W->group), W->group, nr, K);
}

void pln_cpu_quant_act(const float *x, int64_t K, int8_t *q, float *s, int32_t *sum) {
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float sc = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        s[b] = sc;
        int32_t n = 0;
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(xb[i] * inv);   /* |v| <= 127 by construction */
            q[32 * b + i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
            n += q[32 * b + i];
        }
        sum[b] = n;
    }
}

void pln_cpu_quant_act_il(const float *x, int64_t K, int8_t *xq, float *xs, int32_t *xsum, int64_t ldq, int64_t t0,
                          int64_t t1) {
    int8_t q[32];
    for (int64_t b = 0; b < K / 32; b++)
        for (int64_t t = t0; t < t1; t++) {
            pln_cpu_quant_act(x + t * K + 32 * b, 32, q, xs + b * ldq + t, xsum + b * ldq + t);
            for (int g = 0; g < 8; g++) memcpy(xq + 4 * ((8 * b + g) * ldq + t), q + 4 * g, 4);
        }
}

/* The integer-dot path applies: asked for, quantized weights in whole 32-column blocks, and int4
 * at any step, int8 at steps of the tier's pln_cpu_q8_min tokens or more (2 in the
 * batch-invariant mode): a few int8 tokens run faster on the float path's tiles, and an int8 GEMV
 * by integer dot measured slower than the float path's (cpu.h Q8_MIN_NOTE, docs/ARCHITECTURE.md
 * "The integer-dot path"). */
static bool use_int_dot(const pln_cpu *c, const pln_weight *W, int32_t T) {
    return c->int_dot && W->dtype != PLN_DTYPE_F16 && W->cols % 32 == 0 && W->group % 32 == 0 &&
           (W->dtype == PLN_DTYPE_U8 || T >= (c->batch_invariant ? 2 : pln_cpu_q8_min(c->k)));
}

/* gemm_q4n exists for this tier (cpu.h) */
static bool use_q4n(const pln_cpu_kernels *k) { return k->gemm_q4n != NULL; }

void pln_cpu_linear(pln_cpu *c, float *out, int64_t ldo, const float *in, const pln_weight *W,
                    int64_t n_rows, const uint16_t *bias, int32_t T, pln_epilogue epi) {
    if (c->isa == PLN_CPU_ISA_REF) { linear_ref(out, ldo, in, W, n_rows, bias, T, epi); return; }
    /* this weight kind's prefetch distance (cpu.h), set before any thread of this call reads it */
    pln_cpu_pf_kind kind = pln_cpu_pf_kind_of(W);
    int64_t pf = pln_cpu_pf_by_kind[kind];
    if (c->count_kinds && T == 1)   /* tune.c CPU_TUNE_MODEL_NOTE */
        c->kind_bytes[kind] += n_rows * W->cols * (W->dtype == PLN_DTYPE_F16 ? 2 : 1) / (W->dtype == PLN_DTYPE_U8 ? 2 : 1);
    pln_cpu_pf_ahead = pf & ~(int64_t)PLN_TUNE_PF_L2;
    pln_cpu_pf_l2 = (pf & PLN_TUNE_PF_L2) != 0;   /* PF_L2_NOTE (cpu.h) */
    pln_cpu_pf_tiles = pln_cpu_pf_by_kind[PLN_CPU_PF_F16B] & ~(int64_t)PLN_TUNE_PF_L2;
    const pln_cpu_kernels *k = c->k;
    int64_t K = W->cols;
    const bool gelu = epi == PLN_EPI_GELU, sw = epi == PLN_EPI_SWIGLU;
    /* the output columns the work is split over: with SwiGLU one per gate/up pair */
    const int64_t I = n_rows / 2, n_out = sw ? I : n_rows;
    if (T < PLN_CPU_BI_MIN_TOKENS && c->batch_invariant) {
        /* A few tokens do not take a batch's kernels: the one-token GEMV, grouped sums scaled once
         * per group, an int8 token off the integer-dot path, and rows summed in one pass instead
         * of KSTEP-column passes (nt <= 4 on AVX-512, <= 2 on AVX2). In the batch-invariant mode
         * such a step runs as a batch of PLN_CPU_BI_MIN_TOKENS (its last token repeated) and keeps
         * its own rows, so a decode step or the short suffix a prefix-cache hit leaves gets the
         * bits it would get in any batch. A few-token step reads every weight for little work, so
         * the repeats cost compute, not memory traffic. */
        const int32_t P = PLN_CPU_BI_MIN_TOKENS;
        float *xp = pln_xmalloc((size_t)(P * K) * sizeof(float)), *op = pln_xmalloc((size_t)(P * n_out) * sizeof(float));
        for (int32_t t = 0; t < P; t++) memcpy(xp + t * K, in + (t < T ? t : T - 1) * K, (size_t)K * sizeof(float));
        pln_cpu_linear(c, op, n_out, xp, W, n_rows, bias, P, epi);
        for (int32_t t = 0; t < T; t++) memcpy(out + t * ldo, op + t * n_out, (size_t)n_out * sizeof(float));
        free(xp);
        free(op);
        return;
    }
    int64_t n_chunks = (n_out + RCHUNK - 1) / RCHUNK;
    if (use_int_dot(c, W, T)) {
        /* one chunk of QCHUNK rows against the nt quantized tokens at xq */
#define Q_ROWS(dst, ld, rr, nr)                                                                       \
    do {                                                                                              \
        const uint8_t *wc = (const uint8_t *)W->w + (rr) * rb;                                        \
        const uint16_t *sc = W->scale + (rr) * (K / W->group);                                        \
        if (plain) k->gemm_q4n(dst, ld, xq, xs, xsum, nt, wc, sc, W->group, nr, K);                   \
        else k->gemm_q8(dst, ld, xq, xs, xsum, nt, lq, wc, i4, sc, W->group, nr, K);                  \
    } while (0)
#define Q_CHUNK(ch)                                                                                   \
    do {                                                                                              \
        int64_t r0 = (ch) * QCHUNK, nr = n_out - r0 < QCHUNK ? n_out - r0 : QCHUNK;                   \
        Q_ROWS(o + r0, ldo, r0, nr);                                                                  \
        if (sw) {                                                                                     \
            Q_ROWS(su, QCHUNK, I + r0, nr);                                                           \
            swiglu_tile(k, o + r0, ldo, su, QCHUNK, nt, bias, r0, I, nr);                             \
        } else if (bias || gelu)                                                                      \
            for (int64_t t = 0; t < nt; t++) k->bias_gelu(o + t * ldo + r0, bias ? bias + r0 : NULL, nr, gelu); \
    } while (0)
        /* Up to QTOK tokens are quantized once, straight into gemm_q8's token-interleaved layout,
         * then every row chunk repacks its weights once and passes all of them: a 512-token
         * prefill repacks each weight once, not once per 64 tokens (profiled: the repack and a
         * scalar quantization had cost as much as the integer dots themselves). */
        bool i4 = W->dtype == PLN_DTYPE_U8;
        int64_t rb = i4 ? K / 2 : K, nb = K / 32, n_qchunks = (n_out + QCHUNK - 1) / QCHUNK;
        int64_t qt = T < QTOK ? T : QTOK;
        /* a few int4 tokens: plain-row activations and gemm_q4n, no repack (T <= QTOK); in the
         * batch-invariant mode every int4 step takes it, so no step size changes a token's bits */
        bool plain = i4 && T >= 2 && (T <= PLN_CPU_Q4N_MAX || c->batch_invariant) && use_q4n(k);
        /* the interleaved layout's stride (Q8_LDQ_NOTE); plain rows for q4n */
        int64_t qld = plain ? qt : pln_cpu_q8_ldq(qt);
        /* WORK_NOTE (cpu.h): the backend's buffers, kept from call to call */
        int8_t *xq = pln_cpu_work(c, PLN_CPU_WORK_X, (size_t)qld * (size_t)K);
        float *xs = pln_cpu_work(c, PLN_CPU_WORK_XS, (size_t)qld * (size_t)nb * sizeof(float));
        int32_t *xsum = pln_cpu_work(c, PLN_CPU_WORK_XSUM, (size_t)qld * (size_t)nb * sizeof(int32_t));
        /* SwiGLU: each thread's up tile, [nt][QCHUNK] */
        int nth = pln_cpu_threads(c);
        size_t su_stride = pln_cpu_thread_stride((size_t)qt * QCHUNK);   /* THREAD_GAP_NOTE */
        float *su_all = sw ? pln_cpu_work(c, PLN_CPU_WORK_SU, (size_t)nth * su_stride * sizeof(float)) : NULL;
        for (int64_t t0 = 0, nt, lq; t0 < T; t0 += nt) {
            nt = T - t0 < QTOK ? T - t0 : QTOK;
            /* batch-invariant: no last block of fewer than PLN_CPU_BI_MIN_TOKENS (one int4 token
             * takes a GEMV), as for the tiles below */
            if (c->batch_invariant && T - t0 > QTOK && T - t0 - QTOK < PLN_CPU_BI_MIN_TOKENS) nt = T - t0 - PLN_CPU_BI_MIN_TOKENS;
            lq = pln_cpu_q8_ldq(nt);
            #pragma omp parallel num_threads(nth) if (n_rows * K * nt > 65536)
            {
                float *su = sw ? su_all + (size_t)omp_get_thread_num() * su_stride : NULL;
                if (plain) {
                    #pragma omp for schedule(static)
                    for (int64_t t = 0; t < nt; t++)
                        k->quant_act(in + (t0 + t) * K, K, xq + t * K, xs + t * nb, xsum + t * nb, 1, 0, 1);
                } else {
                    /* runs of 16 tokens: each fills whole cache lines of xq */
                    #pragma omp for schedule(static)
                    for (int64_t t = 0; t < nt; t += 16)
                        k->quant_act(in + t0 * K, K, xq, xs, xsum, lq, t, t + 16 < nt ? t + 16 : nt);
                }
                float *o = out + t0 * ldo;
                /* guided: a GEMV or a few int4 tokens (T <= PLN_CPU_Q4N_MAX) streams the weights
                 * (STREAM_NOTE), and at any count each thread's chunks lie side by side
                 * (NEIGHBOUR_NOTE, cpu.h) */
                #pragma omp for schedule(guided)
                for (int64_t ch = 0; ch < n_qchunks; ch++) Q_CHUNK(ch);
            }
        }
#undef Q_CHUNK
#undef Q_ROWS
        return;
    }
    if (T == 1 && k->gemv && !c->batch_invariant) {
        /* One token (simd_avx512.c GEMV_NOTE): runs of chunks, each run's rows read in order
         * (STREAM_NOTE) */
        #pragma omp parallel for schedule(guided) num_threads(pln_cpu_threads(c)) if (n_rows * K > 65536)
        for (int64_t ch = 0; ch < n_chunks; ch++) {
            int64_t r0 = ch * RCHUNK, nr = n_out - r0 < RCHUNK ? n_out - r0 : RCHUNK;
            k->gemv(out + r0, in, W, r0, nr);
            if (sw) {
                float su[RCHUNK];
                k->gemv(su, in, W, I + r0, nr);
                swiglu_tile(k, out + r0, ldo, su, RCHUNK, 1, bias, r0, I, nr);
            } else if (bias || gelu)
                k->bias_gelu(out + r0, bias ? bias + r0 : NULL, nr, gelu);
        }
        return;
    }
    if (k->gemm_panel && T >= pln_cpu_panel_min(k, W) && !c->batch_invariant) {
        /* The batched float path (simd_avx512.c and simd_avx2.c PANEL_NOTE): the activations
         * packed once, then each unit of PLN_CPU_PANEL_ROWS rows widens its weights once for all T
         * tokens. */
        int nth = pln_cpu_threads(c);
        int64_t np = (T + 31) / 32, n_pc = (n_out + PLN_CPU_PANEL_ROWS - 1) / PLN_CPU_PANEL_ROWS;
        /* WORK_NOTE (cpu.h): the backend's buffers, kept from call to call */
        float *xp = pln_cpu_work(c, PLN_CPU_WORK_X, (size_t)np * 32 * (size_t)K * sizeof(float));
        /* each thread's scratch and SwiGLU tile THREAD_GAP_NOTE's stride apart */
        size_t scr_stride = pln_cpu_thread_stride(PLN_CPU_PANEL_SCRATCH);
        size_t su_stride = pln_cpu_thread_stride((size_t)T * PLN_CPU_PANEL_ROWS);
        float *scr = pln_cpu_work(c, PLN_CPU_WORK_SCR, (size_t)nth * scr_stride * sizeof(float));
        /* SwiGLU: each thread's up tile, [T][PLN_CPU_PANEL_ROWS] */
        float *su_all = sw ? pln_cpu_work(c, PLN_CPU_WORK_SU, (size_t)nth * su_stride * sizeof(float)) : NULL;
        int64_t packed = 0;   /* panels packed so far */
        #pragma omp parallel num_threads(nth)
        {
            /* PACK_NOTE: the threads take panels to pack as they arrive and then wait only until
             * every panel is packed, not for every thread: with a barrier here, on a machine whose
             * cores are shared with other jobs, the threads that had packed waited for one the OS
             * had not yet run (2 threads, AVX2, grouped int8 on Llama-3.2-1B's qkv at 32 tokens:
             * 0.77x the tiles, which need no such wait, with the barrier, 1.03-1.20x without; one
             * thread alone ran it 1.7x faster than the tiles). */
            #pragma omp for schedule(dynamic) nowait
            for (int64_t p = 0; p < np; p++) {
                k->pack_x(xp, in, K, T, K, p, p + 1);
                __atomic_fetch_add(&packed, 1, __ATOMIC_RELEASE);
            }
            /* a short spin, then yield: the panel still being packed may belong to a thread
             * waiting for this very core */
            for (int spin = 0; __atomic_load_n(&packed, __ATOMIC_ACQUIRE) < np; spin++) {
                if (spin >= 2000) sched_yield();
#ifdef PLN_CPU_X86
                else _mm_pause();
#endif
            }
            float *s = scr + (size_t)omp_get_thread_num() * scr_stride;
            float *su = sw ? su_all + (size_t)omp_get_thread_num() * su_stride : NULL;
            /* guided: each thread's panel rows side by side (NEIGHBOUR_NOTE, cpu.h) */
            #pragma omp for schedule(guided)
            for (int64_t ch = 0; ch < n_pc; ch++) {
                int64_t r0 = ch * PLN_CPU_PANEL_ROWS, nr = n_out - r0 < PLN_CPU_PANEL_ROWS ? n_out - r0 : PLN_CPU_PANEL_ROWS;
                if (sw) {
                    k->gemm_panel(out + r0, ldo, xp, T, W, r0, nr, NULL, false, s);
                    k->gemm_panel(su, PLN_CPU_PANEL_ROWS, xp, T, W, I + r0, nr, NULL, false, s);
                    swiglu_tile(k, out + r0, ldo, su, PLN_CPU_PANEL_ROWS, T, bias, r0, I, nr);
                } else
                    k->gemm_panel(out + r0, ldo, xp, T, W, r0, nr, bias ? bias + r0 : NULL, gelu, s);
            }
        }
        return;
    }
    /* One parallel region for all the token blocks (a 512-token prefill has 8): the items are in
     * block order, so a thread's run of them reads one block's activations after another, the
     * threads meet at one barrier per call instead of one per block, and a block's last rows
     * overlap the next block's first instead of leaving a thread idle at each block's end.
     * guided: when ranks or other work share the cores, a descheduled thread's rows are taken
     * by the others instead of stalling the whole step, and each thread's rows lie side by side
     * (NEIGHBOUR_NOTE, cpu.h). */
    int64_t n_blk = (T + PLN_CPU_TCHUNK - 1) / PLN_CPU_TCHUNK, last0 = (n_blk - 1) * PLN_CPU_TCHUNK;
    /* In the batch-invariant mode no block is left with fewer than PLN_CPU_BI_MIN_TOKENS tokens
     * (the tiers' kernels sum a block of 1 or 2 as a GEMV or in one pass): the last one takes its
     * missing tokens from the block before it (65 tokens: 60 and 5, not 64 and 1). */
    if (c->batch_invariant && n_blk > 1 && T - last0 < PLN_CPU_BI_MIN_TOKENS) last0 = T - PLN_CPU_BI_MIN_TOKENS;
    #pragma omp parallel for schedule(guided) num_threads(pln_cpu_threads(c)) if (n_rows * K * T > 65536)
    for (int64_t it = 0; it < n_blk * n_chunks; it++) {
        int64_t b = it / n_chunks, ch = it % n_chunks;
        int64_t t0 = b == n_blk - 1 ? last0 : b * PLN_CPU_TCHUNK;
        int64_t t1 = b == n_blk - 1 ? T : b == n_blk - 2 ? last0 : t0 + PLN_CPU_TCHUNK;
        int64_t nt = t1 - t0;
        const float *x = in + t0 * K;
        float *o = out + t0 * ldo;
        int64_t r0 = ch * RCHUNK, nr = n_out - r0 < RCHUNK ? n_out - r0 : RCHUNK;
        gemm_rows(k, o + r0, ldo, x, nt, W, r0, nr);
        if (sw) {
            float su[PLN_CPU_TCHUNK * RCHUNK];
            gemm_rows(k, su, RCHUNK, x, nt, W, I + r0, nr);
            swiglu_tile(k, o + r0, ldo, su, RCHUNK, nt, bias, r0, I, nr);
        } else if (bias || gelu)
            for (int64_t t = 0; t < nt; t++)
                k->bias_gelu(o + t * ldo + r0, bias ? bias + r0 : NULL, nr, gelu);
    }
}
