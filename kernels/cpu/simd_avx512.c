/* simd_avx512.c — AVX-512 micro kernels (chosen at run time when the CPU has AVX-512F; the rest
 * of the build stays baseline x86-64). 16 floats per vector; F16 weights widened with vcvtph2ps,
 * I8 weights with vpmovsxbd + vcvtdq2ps and scaled in registers: no matrix is ever converted.
 * A tile is up to 4 weight rows x 6 tokens of accumulators (24 of the 32 zmm registers), so each
 * weight vector loaded from memory serves 6 tokens and each activation vector 4 rows; F16 blocks of
 * more than 4 tokens take 6 x 4 tiles first (gemm_f16_avx512). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#ifdef PLN_CPU_X86
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT
#define UNROLL _Pragma("GCC unroll 6")
#define UNROLL16 _Pragma("GCC unroll 16")

INL __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
INL __m512 load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* PREFETCH_NOTE: in a GEMV (one token) a 4-row tile reads four short streams (a bloom-560m row
 * is 0.5-8 KiB), too short for the hardware prefetcher to ramp up on. The tile's rows are
 * contiguous, and so is the next tile after them, so the bytes the tile has consumed (across its
 * four rows) map to one sequential position in the matrix; pf_ahead4 requests the 4 cache lines
 * PF_AHEAD bytes past that position into L1, one call per 4 lines consumed: the whole GEMV is
 * prefetched as one stream 8 KiB ahead. Measured on 2 Zen 5 cores against a plain read of the
 * same bytes (interleaved passes, bloom-560m shapes): the int4 body 1.10-1.24x -> 0.96-1.07x the
 * read's time, the fp16 logits 1.14-1.21x -> 1.00-1.04x (the earlier prefetch, the next tile's
 * rows into L2, reached 26 -> 29 GB/s on Zen 4 where none was used). A prefetch past the end of
 * the matrix never faults. */
#define PF_AHEAD PLN_CPU_PF_AHEAD
#define pf_ahead4 pln_cpu_pf_ahead4

/* NR rows x NT tokens of F16 dot products over columns [k0, k1) of rows of length K (NR, NT
 * compile-time after inlining). add: accumulate into out (a later stretch of columns). */
INL void tile_f16(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                  const uint16_t *w, int64_t K, int64_t k0, int64_t k1, bool add, bool pf) {
    /* pf: the first token tile of its rows, the one that reads them from memory (PREFETCH_NOTE's
     * one sequential position for the tile's rows), PLN_CPU_PF_TILES ahead (0: none; tune.c) */
    __m512 acc[6][6];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = _mm512_setzero_ps();
    }
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        __m512 wv[6];
        if (NT == 1 && NR == 4 && (k & 31) == 0) pf_ahead4(w, 8 * k);   /* see PREFETCH_NOTE */
        else if (pf && (k & 31) == 0 && PLN_CPU_PF_TILES) {
            UNROLL for (int i = 0; i < NR; i++) _mm_prefetch((const char *)w + PLN_CPU_PF_TILES + NR * 2 * k + 64 * i, _MM_HINT_T0);
        }
        UNROLL for (int i = 0; i < NR; i++) wv[i] = load_f16(w + i * K + k);
        UNROLL for (int j = 0; j < NT; j++) {
            __m512 xv = _mm512_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) {
            float s = _mm512_reduce_add_ps(acc[i][j]);
            for (int64_t kk = k; kk < k1; kk++) s += pln_f16_to_f32(w[i * K + kk]) * x[j * ldx + kk];
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* I8 with one scale per group of columns; [k0, k1) covers whole groups. Per-channel weights (one
 * group) multiply the scale once at the end; grouped ones scale each widened weight vector
 * (shared by the NT tokens), except in a GEMV (gemv: the call has one token), whose groups are
 * summed unscaled. A batch's last lone token takes the scaled path, so that its result is the same
 * bits as in any other batch (cpu.h pln_cpu_set_batch_invariant). pf: the first token tile of its
 * rows prefetches as the GEMV does, at the weight kind's distance (simd_avx2.c TILE_PF_NOTE;
 * PREFETCH_NOTE's one sequential position for the 4 rows): on the Zen 5, [16384, 2048] at 8
 * tokens 1.67-1.81 -> 1.38-1.40 ms per-row int8, 2.25-2.28 -> 1.67-1.69 int8 g32; Llama-3.2-1B batch 8
 * per-row int8 106 -> 122-124 tokens/s, int8 g32 83 -> 111-114 (alternated twice, 2026-12-04
 * 23:22 UTC); [2048, 8192] and [3072, 2048], which the timing loop keeps in L3, 3-5 % slower. */
INL void tile_i8(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                 const int8_t *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0,
                 int64_t k1, bool add, bool gemv, bool pf) {
    int64_t ng = K / group;
    __m512 acc[4][6];
    float tail[4][6];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) { acc[i][j] = _mm512_setzero_ps(); tail[i][j] = 0.0f; }
    }
    if (ng == 1) {
        int64_t k = k0;
        for (; k + 16 <= k1; k += 16) {
            __m512 wv[4];
            if ((NT == 1 || pf) && NR == 4 && (k & 63) == 0) pf_ahead4(w, 4 * k);   /* see PREFETCH_NOTE; pf above */
            UNROLL for (int i = 0; i < NR; i++) wv[i] = load_i8(w + i * K + k);
            UNROLL for (int j = 0; j < NT; j++) {
                __m512 xv = _mm512_loadu_ps(x + j * ldx + k);
                UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
            }
        }
        for (; k < k1; k++) {
            UNROLL for (int i = 0; i < NR; i++) {
                UNROLL for (int j = 0; j < NT; j++) tail[i][j] += (float)w[i * K + k] * x[j * ldx + k];
            }
        }
    } else if (NT == 1 && gemv) {
        /* GEMV (decode): each row's group is summed unscaled in its own register and scaled by
         * one FMA per group: per 16 weights one widen and one FMA, as in the per-channel loop
         * (scaling every widened vector cost a multiply each) */
        for (int64_t g = k0 / group; g < k1 / group; g++) {
            __m512 ga[4];
            UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm512_setzero_ps();
            int64_t k = g * group, kend = k + group;
            for (; k + 16 <= kend; k += 16) {
                if (NR == 4 && (k & 63) == 0) {   /* see PREFETCH_NOTE; the scales: 2 bytes per group */
                    pf_ahead4(w, 4 * k);
                    _mm_prefetch((const char *)scale + (PF_AHEAD + 4 * k) * 2 / group, _MM_HINT_T0);
                }
                __m512 xv = _mm512_loadu_ps(x + k);
                UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm512_fmadd_ps(load_i8(w + i * K + k), xv, ga[i]);
            }
            UNROLL for (int i = 0; i < NR; i++) {
                float sf = _cvtsh_ss(scale[i * ng + g]);
                float t = 0.0f;
                for (int64_t kk = k; kk < kend; kk++) t += (float)w[i * K + kk] * x[kk];
                tail[i][0] += t * sf;
                acc[i][0] = _mm512_fmadd_ps(ga[i], _mm512_set1_ps(sf), acc[i][0]);
            }
        }
    } else {
        /* a block of tokens: each widened weight vector is scaled once and serves NT tokens */
        for (int64_t g = k0 / group; g < k1 / group; g++) {
            float sf[4];
            __m512 sv[4];
            UNROLL for (int i = 0; i < NR; i++) {
                sf[i] = _cvtsh_ss(scale[i * ng + g]);
                sv[i] = _mm512_set1_ps(sf[i]);
            }
            int64_t k = g * group, kend = k + group;
            for (; k + 16 <= kend; k += 16) {
                __m512 wv[4];
                if (pf && NR == 4 && (k & 63) == 0) pf_ahead4(w, 4 * k);
                UNROLL for (int i = 0; i < NR; i++) wv[i] = _mm512_mul_ps(load_i8(w + i * K + k), sv[i]);
                UNROLL for (int j = 0; j < NT; j++) {
                    __m512 xv = _mm512_loadu_ps(x + j * ldx + k);
                    UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
            for (; k < kend; k++) {
                UNROLL for (int i = 0; i < NR; i++) {
                    UNROLL for (int j = 0; j < NT; j++) tail[i][j] += (float)w[i * K + k] * sf[i] * x[j * ldx + k];
                }
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        float s_end = ng == 1 ? pln_f16_to_f32(scale[i]) : 1.0f;
        UNROLL for (int j = 0; j < NT; j++) {
            float s = (_mm512_reduce_add_ps(acc[i][j]) + tail[i][j]) * s_end;
            /* not fused into the add below: GCC contracts a * b + c where it sees one, and did so
             * in some of this tile's instantiations and not in others (an ASan build, per-row
             * int8 at 4096 columns), which gave a token other bits in a tile of 1 than of 2 */
            __asm__("" : "+x"(s));
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* One 32-column block of a packed int4 row (16 bytes, docs/FORMAT.md) as q in two 16-float
 * vectors, columns in order: low nibbles = columns 0..15, high nibbles = 16..31 (one mask, one
 * shift, one subtract of the +8 bias; no shuffle). */
INL void load_i4x32(const uint8_t *p, __m512 *v0, __m512 *v1) {
    const __m128i m = _mm_set1_epi8(0x0f), bias = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    *v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(b, m), bias)));
    *v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), bias)));
}

/* Packed int4, [k0, k1) whole groups (multiples of 32 columns). A GEMV (gemv: the call has one
 * token): each row's group is summed unscaled and scaled by one FMA per group; several tokens
 * (and a batch's last lone token, as tile_i8): the unpacked block is scaled once per row and serves
 * them all. */
INL void tile_i4(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                 const uint8_t *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0,
                 int64_t k1, bool add, bool gemv) {
    int64_t ng = K / group, rb = K / 2;
    __m512 acc[4][4];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = _mm512_setzero_ps();
    }
    for (int64_t g = k0 / group; g < k1 / group; g++) {
        int64_t kend = (g + 1) * group;
        if (NT == 1 && gemv) {
            __m512 ga[4];
            UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm512_setzero_ps();
            for (int64_t k = g * group; k < kend; k += 32) {
                if (NR == 4 && (k & 127) == 0) {   /* see PREFETCH_NOTE: 64 bytes = 128 columns */
                    pf_ahead4(w, 2 * k);
                    _mm_prefetch((const char *)scale + (PF_AHEAD + 2 * k) * 4 / group, _MM_HINT_T0);
                }
                __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
                UNROLL for (int i = 0; i < NR; i++) {
                    __m512 w0, w1;
                    load_i4x32(w + i * rb + k / 2, &w0, &w1);
                    ga[i] = _mm512_fmadd_ps(w0, x0, ga[i]);
                    ga[i] = _mm512_fmadd_ps(w1, x1, ga[i]);
                }
            }
            UNROLL for (int i = 0; i < NR; i++)
                acc[i][0] = _mm512_fmadd_ps(ga[i], _mm512_set1_ps(_cvtsh_ss(scale[i * ng + g])), acc[i][0]);
        } else {
            for (int64_t k = g * group; k < kend; k += 32) {
                UNROLL for (int i = 0; i < NR; i++) {
                    __m512 w0, w1, sv = _mm512_set1_ps(_cvtsh_ss(scale[i * ng + g]));
                    load_i4x32(w + i * rb + k / 2, &w0, &w1);
                    w0 = _mm512_mul_ps(w0, sv);
                    w1 = _mm512_mul_ps(w1, sv);
                    UNROLL for (int j = 0; j < NT; j++) {
                        const float *xj = x + j * ldx + k;
                        acc[i][j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xj), acc[i][j]);
                        acc[i][j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xj + 16), acc[i][j]);
                    }
                }
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) {
            float s = _mm512_reduce_add_ps(acc[i][j]);
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* Columns per pass when a block of tokens shares the weights: a tile's 4 rows of KSTEP columns
 * (16 KiB of F16) stay in L1 and the block's activations (PLN_CPU_TCHUNK x KSTEP floats, 512 KiB)
 * in L2 while every token tile reuses them. One pass when there are too few tokens to reuse
 * anything. (2048 measured a few % faster than 1024 on Zen 4: fewer horizontal sums.) */
#define KSTEP 2048

/* WIDEN_NOTE (simd_avx2.c's, with 16-float vectors): F16, per-row I8 and grouped I8 at
 * PLN_CPU_WIDEN_MIN tokens or more take a 4-row block WSUB columns (a stretch) at a time; the
 * first token tile of a stretch (tokens % 6 of them, 3 where that is 0) widens each weight
 * vector for its own tokens, stores it in an L1 buffer of floats (4 KiB) and prefetches the
 * stretch WIDEN_PF ahead in the order it reads it; float tiles of 4 rows x up to 6 tokens take
 * the other tokens from the buffer. Each result is the same sum in the same order as the tiles'
 * (16 lanes over the KSTEP pass, _mm512_reduce_add_ps, per-row I8 scaled after), so the bits do
 * not change. On the Intel Xeon VM of docs/BENCHMARKS.md, Llama-3.2-1B, the command of
 * simd_avx2.c's WIDEN_NOTE (alternated 2-3 times, 2026-12-06 02:54-02:58 UTC), tokens/s before
 * -> after: int8 g32 batch 2 / 3 / 5 / 8 26.1 / 26.6 / 38.4 / 47.9 -> 28.9 / 37.9 / 52.7 / 61.0;
 * fp16 19.7 / 26.1 / 42.8 / 57.7 -> 20.2 / 27.8 / 52.4 / 61.6; per-row int8 batch 8 63.7 -> 69.9.
 * Needs K % 16 == 0 (grouped: also group % 16 == 0 and group <= WSUB); other shapes take the
 * tiles. */
#define WSUB 256
#define WIDEN_T 24   /* tokens whose accumulators one pass keeps (6 KiB) */
#define WIDEN_PF 4   /* stretches ahead that the first token tile prefetches */
enum { WIDEN_F16, WIDEN_I8, WIDEN_I8G };

/* 4 rows x NT tokens of widened weights wf (16 floats of each row in turn per 16 columns, column
 * k0 first) over [k0, k1), a multiple of 16 columns, into the accumulators acc (token j's 4 at
 * acc + 4 j). */
INL void tile_f32w(const int NT, __m512 *acc, const float *x, int64_t ldx, const float *wf, int64_t k0, int64_t k1) {
    __m512 a[4][6];
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) a[i][j] = acc[4 * j + i];
    }
    for (int64_t k = k0; k < k1; k += 16) {
        __m512 wv[4];
        UNROLL for (int i = 0; i < 4; i++) wv[i] = _mm512_load_ps(wf + (k - k0) * 4 + i * 16);
        UNROLL for (int j = 0; j < NT; j++) {
            __m512 xv = _mm512_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < 4; i++) a[i][j] = _mm512_fmadd_ps(wv[i], xv, a[i][j]);
        }
    }
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[4 * j + i] = a[i][j];
    }
}

/* The first token tile of a stretch [k0, k1) (whole groups): widens the 4 rows' weights (KIND)
 * into wf and uses each vector at once for its NT tokens; prefetches the stretch at pw (NULL:
 * none; rows rb bytes apart). */
INL void tile_widen(const int KIND, const int NT, __m512 *acc, const float *x, int64_t ldx, float *wf,
                    const void *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0, int64_t k1,
                    const char *pw) {
    const int64_t es = KIND == WIDEN_F16 ? 2 : 1, rb = es * K;
    const int64_t gl = KIND != WIDEN_I8G ? k1 - k0 : group == 32 ? 32 : group;
    const int64_t ng = KIND == WIDEN_I8G ? K / group : 1;
    __m512 a[4][6];
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) a[i][j] = acc[4 * j + i];
    }
    /* grouped: gl is the group, so each pass of the loop below is the next group (no division
     * per group: an idiv there took 5-10 % of a batch-8 step's samples) */
    const uint16_t *sg = KIND == WIDEN_I8G ? scale + k0 / group : NULL;
    for (int64_t g0 = k0; g0 < k1; g0 += gl) {
        __m512 sv[4];
        if (KIND == WIDEN_I8G) {
            UNROLL for (int i = 0; i < 4; i++) sv[i] = _mm512_set1_ps(_cvtsh_ss(sg[i * ng]));
            sg++;
        }
        for (int64_t k = g0; k < g0 + gl; k += 16) {
            if (pw) {   /* lines es q .. of the stretch ahead, rows interleaved: 4 rows x 64 bytes per 64 / es columns */
                int64_t q = (k - k0) / 16;
                UNROLL for (int e = 0; e < es; e++) {
                    int64_t l = es * q + e;
                    _mm_prefetch(pw + (l & 3) * rb + (l >> 2) * 64, _MM_HINT_T0);
                }
            }
            __m512 xv[6];
            UNROLL for (int j = 0; j < NT; j++) xv[j] = _mm512_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < 4; i++) {
                __m512 wv;
                if (KIND == WIDEN_F16) wv = load_f16((const uint16_t *)w + i * K + k);
                else if (KIND == WIDEN_I8) wv = load_i8((const int8_t *)w + i * K + k);
                else wv = _mm512_mul_ps(load_i8((const int8_t *)w + i * K + k), sv[i]);
                _mm512_store_ps(wf + (k - k0) * 4 + i * 16, wv);
                UNROLL for (int j = 0; j < NT; j++) a[i][j] = _mm512_fmadd_ps(wv, xv[j], a[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[4 * j + i] = a[i][j];
    }
}

/* One KSTEP pass [k0, k1) (whole groups) of a 4-row block of KIND for nt tokens (WIDEN_NOTE);
 * add: accumulate into out (a later pass). The sums end as the tiles' do: F16 tile_f16's,
 * per-row I8 tile_i8's (its zero tail, then its scale), grouped I8 tile_i8's. */
INL void gemm_widen(const int KIND, float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt, const void *w,
                    const uint16_t *scale, int64_t group, int64_t K, int64_t k0, int64_t k1, bool add) {
    float wf[4 * WSUB] __attribute__((aligned(64)));
    __m512 acc[4 * WIDEN_T];
    const int64_t es = KIND == WIDEN_F16 ? 2 : 1;
    const int64_t ws = KIND == WIDEN_I8G ? WSUB / group * group : WSUB;
    for (int64_t t0 = 0; t0 < nt; t0 += WIDEN_T) {
        int64_t tn = nt - t0 < WIDEN_T ? nt - t0 : WIDEN_T, f = tn % 6 ? tn % 6 : 3;
        const float *xt = x + t0 * ldx;
        for (int64_t i = 0; i < 4 * tn; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t s0 = k0; s0 < k1; s0 += ws) {
            int64_t s1 = k1 - s0 < ws ? k1 : s0 + ws, t = f;
            const char *pw = NULL;
            if (t0 == 0) {   /* the stretch WIDEN_PF ahead: these rows, else the next 4 (prefetches never fault) */
                int64_t c = s0 + WIDEN_PF * ws;
                pw = c < K ? (const char *)w + es * c : c - K < K ? (const char *)w + es * (4 * K + c - K) : NULL;
            }
            switch (f) {
            case 1: tile_widen(KIND, 1, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); break;
            case 2: tile_widen(KIND, 2, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); break;
            case 3: tile_widen(KIND, 3, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); break;
            case 4: tile_widen(KIND, 4, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); break;
            default: tile_widen(KIND, 5, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); break;
            }
            for (; t + 6 <= tn; t += 6) tile_f32w(6, acc + 4 * t, xt + t * ldx, ldx, wf, s0, s1);
            if (t < tn) tile_f32w(3, acc + 4 * t, xt + t * ldx, ldx, wf, s0, s1);   /* f == 3: 3 left */
        }
        for (int64_t j = 0; j < tn; j++) {
            UNROLL for (int i = 0; i < 4; i++) {
                float sum = _mm512_reduce_add_ps(acc[4 * j + i]);
                if (KIND == WIDEN_I8) sum = (sum + 0.0f) * pln_f16_to_f32(scale[i]);
                else if (KIND == WIDEN_I8G) sum = sum + 0.0f;
                __asm__("" : "+x"(sum));   /* as tile_i8's: not contracted into the add below */
                float *o = out + (t0 + j) * ldo + i;
                *o = add ? *o + sum : sum;
            }
        }
    }
}

/* The whole 4-row blocks of nr rows through gemm_widen, each in passes of ks columns; returns the
 * first row left (nr % 4 of them). */
INL int64_t rows_widen(const int KIND, float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                       const void *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K, int64_t ks) {
    const int64_t es = KIND == WIDEN_F16 ? 2 : 1, ng = KIND == WIDEN_I8G ? K / group : 1;
    int64_t r = 0;
    for (; nr - r >= 4; r += 4)
        for (int64_t k0 = 0; k0 < K; k0 += ks)
            gemm_widen(KIND, out + r, ldo, x, ldx, nt, (const char *)w + es * r * K, scale ? scale + r * ng : NULL,
                       group, K, k0, K - k0 < ks ? K : k0 + ks, k0 > 0);
    return r;
}

/* F16_ROWS_NOTE: 2-4 tokens whose activations fit in 32 KiB (nt K floats) take the rows one at
 * a time (gemv_rows), as the GEMV does: the 4-row tiles read four streams a row apart and ran
 * at 0.7x the GEMV's bandwidth at 2 tokens ([128256, 2048], Llama-3.2-1B's tied output, Zen 5, 2
 * threads: 15.5 ms against 11.5; rows: 12.3). Past 4 tokens, or activations that leave L1 (K =
 * 8192 at 2 tokens), the per-token activation loads of one row cost more than the streams: 8
 * tokens ran 19.7 -> 32.4 ms, and 4 tokens of the whole Llama-3.2-1B fp16 step 5-10 % slower
 * with its down_proj (K 8192) included. Whole steps, old and new interleaved three times (pollen
 * bench, fp16): Llama-3.2-1B batch 2/3/4 25-27 / 36-37 / 49-51 -> 32 / 43-45 / 55-57 tokens/s,
 * bloom-560m 56-59 / 83-84 / 105-107 -> 69-71 / 98 / 126-128. */
#define F16_ROWS_MAX 4
#define F16_ROWS_X 8192
static void gemv_rows_n(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt, const void *w,
                        const uint16_t *scale, int64_t nr, int64_t K);
static TGT void gemm_f16_avx512(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                                const uint16_t *w, int64_t nr, int64_t K) {
    if (nt <= F16_ROWS_MAX && nt * K <= F16_ROWS_X) {   /* F16_ROWS_NOTE */
        gemv_rows_n(out, ldo, x, ldx, nt, w, NULL, nr, K);
        return;
    }
    int64_t ks = nt > 4 ? KSTEP : K;
    if (nt >= PLN_CPU_WIDEN_MIN && K % 16 == 0) {   /* WIDEN_NOTE */
        int64_t r0 = rows_widen(WIDEN_F16, out, ldo, x, ldx, nt, w, NULL, K, nr, K, ks);
        out += r0;
        w += r0 * K;
        nr -= r0;
    } else if (nt > 4) {
        /* 6 rows x 4 tokens first: each activation vector loaded from L2 serves 6 rows instead
         * of 4 (the activations, not the weights, are what streams from L2 here); measured
         * 5-10 % faster on a 512-token bloom-560m prefill than 4 x 6 tiles alone. The rows that
         * do not make a 6 (16-row chunks: 6 + 6 + 4) take the 4 x 6 tiles below. */
        int64_t r = 0;
        for (; r + 6 <= nr; r += 6) {
            const uint16_t *wr = w + r * K;
            float *o = out + r;
            for (int64_t k0 = 0; k0 < K; k0 += ks) {
                int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
                bool add = k0 > 0;
                for (; t + 4 <= nt; t += 4) tile_f16(6, 4, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t + 2 <= nt; t += 2) tile_f16(6, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t < nt; t++) tile_f16(6, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
            }
        }
        out += r;
        w += r * K;
        nr -= r;
    }
    for (int64_t r = 0; r < nr; r += 4) {
        const uint16_t *wr = w + r * K;
        float *o = out + r;
        for (int64_t k0 = 0; k0 < K; k0 += ks) {
            int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
            bool add = k0 > 0;
            if (nr - r >= 4) {
                for (; t + 6 <= nt; t += 6) tile_f16(4, 6, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t + 4 <= nt; t += 4) tile_f16(4, 4, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t + 2 <= nt; t += 2) tile_f16(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t < nt; t++) tile_f16(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 4 <= nt; t += 4) tile_f16(1, 4, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, K, k0, k1, add, t == 0);
                    for (; t < nt; t++) tile_f16(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, K, k0, k1, add, t == 0);
                }
            }
        }
    }
}

static TGT void gemm_i8_avx512(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                               const int8_t *w, const uint16_t *scale, int64_t group, int64_t nr,
                               int64_t K) {
    int64_t ng = K / group;
    if (ng == 1 && nt <= F16_ROWS_MAX && nt * K <= F16_ROWS_X) {   /* per row: F16_ROWS_NOTE */
        gemv_rows_n(out, ldo, x, ldx, nt, w, scale, nr, K);
        return;
    }
    /* passes cover whole groups */
    int64_t ks = nt <= 4 ? K : ng == 1 ? KSTEP : group * (KSTEP / group > 0 ? KSTEP / group : 1), r0 = 0;
    if (nt >= PLN_CPU_WIDEN_MIN && K % 16 == 0 && (ng == 1 || (group % 16 == 0 && group <= WSUB)))   /* WIDEN_NOTE */
        r0 = ng == 1 ? rows_widen(WIDEN_I8, out, ldo, x, ldx, nt, w, scale, K, nr, K, ks)
                     : rows_widen(WIDEN_I8G, out, ldo, x, ldx, nt, w, scale, group, nr, K, ks);
    for (int64_t r = r0; r < nr; r += 4) {
        const int8_t *wr = w + r * K;
        const uint16_t *sr = scale + r * ng;
        float *o = out + r;
        for (int64_t k0 = 0; k0 < K; k0 += ks) {
            int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
            bool add = k0 > 0;
            if (nr - r >= 4) {
                /* 4 x 6 needs 24 accumulators + 4 weights + 1 activation: per-channel only (a
                 * grouped tile also holds 4 scales) */
                if (ng == 1)
                    for (; t + 6 <= nt; t += 6) tile_i8(4, 6, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, t == 0);
                for (; t + 4 <= nt; t += 4) tile_i8(4, 4, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, t == 0);
                for (; t + 2 <= nt; t += 2) tile_i8(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, t == 0);
                for (; t < nt; t++) tile_i8(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, false);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 4 <= nt; t += 4) tile_i8(1, 4, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, sr + i * ng, group, K, k0, k1, add, nt == 1, false);
                    for (; t < nt; t++) tile_i8(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, sr + i * ng, group, K, k0, k1, add, nt == 1, false);
                }
            }
        }
    }
}

static TGT void gemm_i4_avx512(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                               const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr,
                               int64_t K) {
    int64_t ng = K / group, rb = K / 2;
    /* passes cover whole groups */
    int64_t ks = nt <= 4 ? K : group * (KSTEP / group > 0 ? KSTEP / group : 1);
    for (int64_t r = 0; r < nr; r += 4) {
        const uint8_t *wr = w + r * rb;
        const uint16_t *sr = scale + r * ng;
        float *o = out + r;
        for (int64_t k0 = 0; k0 < K; k0 += ks) {
            int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
            bool add = k0 > 0;
            if (nr - r >= 4) {
                for (; t + 4 <= nt; t += 4) tile_i4(4, 4, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1);
                for (; t + 2 <= nt; t += 2) tile_i4(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1);
                for (; t < nt; t++) tile_i4(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 4 <= nt; t += 4) tile_i4(1, 4, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * rb, sr + i * ng, group, K, k0, k1, add, nt == 1);
                    for (; t < nt; t++) tile_i4(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * rb, sr + i * ng, group, K, k0, k1, add, nt == 1);
                }
            }
        }
    }
}

/* ---- the one-token GEMV (cpu.h gemv) -------------------------------------------------------
 * GEMV_NOTE: a decode step reads every weight once, so it runs at the speed the weights stream
 * from memory. A 4-row tile reads four streams a row apart (the rows are contiguous, so a run of
 * rows is one stretch of memory read at four places at once); one row at a time reads the run as
 * one sequential stream, which the hardware prefetcher follows, and the software prefetch
 * PF_AHEAD bytes ahead of it is exact (it lands on the bytes this thread reads next, the next
 * row's included). Measured on 2 Zen 5 cores, fp16, both threads streaming (tools/bench/
 * gemv-streams.c: interleaved, rows of 1-16 KiB): where a plain read ran at 55-70 GB/s the 4-row
 * tiles read 35-50 and one row at a time 54-68; where the read ran at 36-47 GB/s, one row at a
 * time was 0.95-1.4x the tiles (the least on 2 KiB rows, whose four places are close). In the
 * model: docs/ARCHITECTURE.md, "The batched float path". Each row keeps four accumulators (128 columns of F16, two per accumulator, or a cache line of I8, per step): one
 * would be a chain of FMAs 16 columns per latency, slower than the memory. The sums are ordered
 * differently from the tiles', so a lone token's results differ in the last bits from the same
 * token's in a batch; batch-invariant mode keeps the tiles (cpu.h pln_cpu_set_batch_invariant).
 * The row functions stay out of line so that tests/e2e_cpu_prefetch.sh can count their
 * prefetches by symbol. */
INL void pf_line(const void *p) { pln_cpu_pf((const char *)p + PF_AHEAD); }

static TGT __attribute__((noinline)) void gemv_f16_row(float *out, const float *x, const uint16_t *w, int64_t K) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    /* 128 columns (256 bytes) a step: the loop's own increments, compare and branch are then 4
     * of 24 instructions, not 4 of 14 (tools/bench/gemv-mca.sh: 6.0 instructions per 64 bytes,
     * as llama.cpp's F16 decode loop, was 7.0). Each accumulator takes the same columns in the
     * same order as at 64 a step, so the sums are the same bits. */
    for (; k + 128 <= K; k += 128) {
        pf_line(w + k);
        pf_line(w + k + 32);
        pf_line(w + k + 64);
        pf_line(w + k + 96);
        a0 = _mm512_fmadd_ps(load_f16(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(load_f16(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(load_f16(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(load_f16(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        a0 = _mm512_fmadd_ps(load_f16(w + k + 64), _mm512_loadu_ps(x + k + 64), a0);
        a1 = _mm512_fmadd_ps(load_f16(w + k + 80), _mm512_loadu_ps(x + k + 80), a1);
        a2 = _mm512_fmadd_ps(load_f16(w + k + 96), _mm512_loadu_ps(x + k + 96), a2);
        a3 = _mm512_fmadd_ps(load_f16(w + k + 112), _mm512_loadu_ps(x + k + 112), a3);
    }
    if (k + 64 <= K) {
        pf_line(w + k);
        pf_line(w + k + 32);
        a0 = _mm512_fmadd_ps(load_f16(w + k), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(load_f16(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(load_f16(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(load_f16(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        k += 64;
    }
    for (; k + 16 <= K; k += 16) a0 = _mm512_fmadd_ps(load_f16(w + k), _mm512_loadu_ps(x + k), a0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; k < K; k++) s += pln_f16_to_f32(w[k]) * x[k];
    *out = s;
}

/* gemv_f16_row (and gemv_i8_row's per-row loop) for NT (2-4) tokens: each row read once as one
 * sequential stream (GEMV_NOTE), each 16-column vector widened once and multiplied into every
 * token's four accumulators (the 4-row tiles read four streams a row apart: F16_ROWS_NOTE in
 * gemm_f16_avx512). Each token's sums are ordered as the one-token loop orders them; per-row int8
 * applies the row's scale once at the end. */
INL __m512 rows_ld(const void *w, int64_t k, bool i8) {
    return i8 ? load_i8((const int8_t *)w + k) : load_f16((const uint16_t *)w + k);
}
INL float rows_at(const void *w, int64_t k, bool i8) {
    return i8 ? (float)((const int8_t *)w)[k] : pln_f16_to_f32(((const uint16_t *)w)[k]);
}
INL void gemv_rows(const int NT, const bool I8, float *out, int64_t ldo, const float *x, int64_t ldx,
                   const void *w, float sc, int64_t K) {
    __m512 a[4][4];
    UNROLL for (int j = 0; j < NT; j++) a[j][0] = a[j][1] = a[j][2] = a[j][3] = _mm512_setzero_ps();
    const int64_t eb = I8 ? 1 : 2;   /* bytes per weight */
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        pf_line((const char *)w + eb * k);
        if (!I8) pf_line((const char *)w + eb * k + 64);
        __m512 w0 = rows_ld(w, k, I8), w1 = rows_ld(w, k + 16, I8), w2 = rows_ld(w, k + 32, I8), w3 = rows_ld(w, k + 48, I8);
        UNROLL for (int j = 0; j < NT; j++) {
            const float *xj = x + j * ldx + k;
            a[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xj), a[j][0]);
            a[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xj + 16), a[j][1]);
            a[j][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xj + 32), a[j][2]);
            a[j][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xj + 48), a[j][3]);
        }
    }
    for (; k + 16 <= K; k += 16) {
        __m512 wv = rows_ld(w, k, I8);
        UNROLL for (int j = 0; j < NT; j++) a[j][0] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + j * ldx + k), a[j][0]);
    }
    UNROLL for (int j = 0; j < NT; j++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[j][0], a[j][1]), _mm512_add_ps(a[j][2], a[j][3])));
        for (int64_t kk = k; kk < K; kk++) s += rows_at(w, kk, I8) * x[j * ldx + kk];
        out[j * ldo] = I8 ? s * sc : s;
    }
}

/* nr rows of fp16 (scale NULL) or per-row int8 weights against nt tokens, 4 at a time. */
static TGT __attribute__((noinline)) void gemv_rows_n(float *out, int64_t ldo, const float *x, int64_t ldx,
                                                     int64_t nt, const void *w, const uint16_t *scale, int64_t nr,
                                                     int64_t K) {
    const bool i8 = scale != NULL;
    for (int64_t r = 0; r < nr; r++) {
        const void *wr = (const char *)w + r * K * (i8 ? 1 : 2);
        float sc = i8 ? _cvtsh_ss(scale[r]) : 1.0f;
        for (int64_t t = 0; t < nt; t += 4) {
            float *o = out + t * ldo + r;
            const float *xt = x + t * ldx;
            int64_t n = nt - t;
            if (i8) {
                if (n >= 4) gemv_rows(4, true, o, ldo, xt, ldx, wr, sc, K);
                else if (n == 3) gemv_rows(3, true, o, ldo, xt, ldx, wr, sc, K);
                else if (n == 2) gemv_rows(2, true, o, ldo, xt, ldx, wr, sc, K);
                else gemv_rows(1, true, o, ldo, xt, ldx, wr, sc, K);
            } else {
                if (n >= 4) gemv_rows(4, false, o, ldo, xt, ldx, wr, sc, K);
                else if (n == 3) gemv_rows(3, false, o, ldo, xt, ldx, wr, sc, K);
                else if (n == 2) gemv_rows(2, false, o, ldo, xt, ldx, wr, sc, K);
                else gemv_rows(1, false, o, ldo, xt, ldx, wr, sc, K);
            }
        }
    }
}

INL __m512 scale_at(const uint16_t *scale, int64_t g) { return _mm512_set1_ps(_cvtsh_ss(scale[g])); }

/* I8: per-row weights (ng == 1) scale the row's sum once. Grouped ones sum each group unscaled
 * and scale it with one FMA, a line (64 columns) per step: groups of 32 two per line, each into
 * its own accumulator; groups of a multiple of 64 in four partial sums. Every index into the
 * accumulators is a compile-time constant (a variable one keeps them in memory). */
static TGT __attribute__((noinline)) void gemv_i8_row(float *out, const float *x, const int8_t *w, const uint16_t *scale, int64_t group,
                            int64_t K) {
    int64_t ng = K / group, k = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float s = 0.0f;
    if (ng == 1) {
        for (; k + 64 <= K; k += 64) {
            pf_line(w + k);
            a0 = _mm512_fmadd_ps(load_i8(w + k), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(load_i8(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(load_i8(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(load_i8(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        }
        for (; k + 16 <= K; k += 16) a0 = _mm512_fmadd_ps(load_i8(w + k), _mm512_loadu_ps(x + k), a0);
        s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        for (; k < K; k++) s += (float)w[k] * x[k];
        *out = s * _cvtsh_ss(scale[0]);
        return;
    }
    if (group == 32) {
        /* The scales of 16 groups (512 columns) are widened at once and each is then broadcast
         * from memory as the FMA's operand, a load-port operation: one group's own scalar load,
         * widening and register broadcast had taken three slots of the two vector ports the
         * byte widening also needs (tools/bench/gemv-mca.sh, Zen 4 model: 10.2 -> 9.1 cycles per
         * 64 bytes; llama.cpp's Q8_0 vec_dot 8.5). The 64-column steps stay a rolled loop, each
         * with its prefetch in place: unrolled, GCC gathered the block's eight prefetches at its
         * start, which had measured slower. The same scales, products and sums: the results are
         * unchanged. */
        float sb[16] __attribute__((aligned(64)));
        for (; k + 512 <= K; k += 512) {
            _mm512_store_ps(sb, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(scale + k / 32))));
            __asm__("" : "+m"(sb));   /* keep sb in memory: the broadcasts below are loads */
            _Pragma("GCC unroll 1") for (int j = 0; j < 16; j += 2) {
                const int8_t *wj = w + k + 32 * j;
                const float *xj = x + k + 32 * j;
                pf_line(wj);
                __m512 g0 = _mm512_mul_ps(load_i8(wj), _mm512_loadu_ps(xj));
                __m512 g1 = _mm512_mul_ps(load_i8(wj + 32), _mm512_loadu_ps(xj + 32));
                g0 = _mm512_fmadd_ps(load_i8(wj + 16), _mm512_loadu_ps(xj + 16), g0);
                g1 = _mm512_fmadd_ps(load_i8(wj + 48), _mm512_loadu_ps(xj + 48), g1);
                a0 = _mm512_fmadd_ps(g0, _mm512_set1_ps(sb[j]), a0);
                a1 = _mm512_fmadd_ps(g1, _mm512_set1_ps(sb[j + 1]), a1);
            }
        }
        for (; k + 64 <= K; k += 64) {
            pf_line(w + k);
            __m512 g0 = _mm512_mul_ps(load_i8(w + k), _mm512_loadu_ps(x + k));
            __m512 g1 = _mm512_mul_ps(load_i8(w + k + 32), _mm512_loadu_ps(x + k + 32));
            g0 = _mm512_fmadd_ps(load_i8(w + k + 16), _mm512_loadu_ps(x + k + 16), g0);
            g1 = _mm512_fmadd_ps(load_i8(w + k + 48), _mm512_loadu_ps(x + k + 48), g1);
            a0 = _mm512_fmadd_ps(g0, scale_at(scale, k / 32), a0);
            a1 = _mm512_fmadd_ps(g1, scale_at(scale, k / 32 + 1), a1);
        }
        if (k < K) {   /* an odd last group */
            __m512 g0 = _mm512_mul_ps(load_i8(w + k), _mm512_loadu_ps(x + k));
            g0 = _mm512_fmadd_ps(load_i8(w + k + 16), _mm512_loadu_ps(x + k + 16), g0);
            a0 = _mm512_fmadd_ps(g0, scale_at(scale, k / 32), a0);
        }
    } else if (group % 64 == 0) {
        for (int64_t g = 0; g < ng; g++) {
            __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
            for (int64_t kend = k + group; k < kend; k += 64) {
                pf_line(w + k);
                p0 = _mm512_fmadd_ps(load_i8(w + k), _mm512_loadu_ps(x + k), p0);
                p1 = _mm512_fmadd_ps(load_i8(w + k + 16), _mm512_loadu_ps(x + k + 16), p1);
                p2 = _mm512_fmadd_ps(load_i8(w + k + 32), _mm512_loadu_ps(x + k + 32), p2);
                p3 = _mm512_fmadd_ps(load_i8(w + k + 48), _mm512_loadu_ps(x + k + 48), p3);
            }
            a0 = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(p0, p1), _mm512_add_ps(p2, p3)), scale_at(scale, g), a0);
        }
    } else {   /* other group sizes: 16 columns at a time, a scalar tail per group */
        for (int64_t g = 0; g < ng; g++) {
            __m512 p0 = _mm512_setzero_ps();
            int64_t kend = k + group;
            for (; k + 16 <= kend; k += 16) {
                if ((k & 63) == 0) pf_line(w + k);
                p0 = _mm512_fmadd_ps(load_i8(w + k), _mm512_loadu_ps(x + k), p0);
            }
            float t = 0.0f;
            for (; k < kend; k++) t += (float)w[k] * x[k];
            s += t * _cvtsh_ss(scale[g]);
            a0 = _mm512_fmadd_ps(p0, scale_at(scale, g), a0);
        }
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + s;
}

/* Packed int4 on the float path (the integer-dot path has its own GEMV, gemm_q4n at nt = 1): two
 * 32-column blocks (32 bytes) per step, groups as gemv_i8_row's. */
static TGT __attribute__((noinline)) void gemv_i4_row(float *out, const float *x, const uint8_t *w, const uint16_t *scale, int64_t group,
                            int64_t K) {
    int64_t ng = K / group, k = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    if (group == 32) {
        for (; k + 64 <= K; k += 64) {
            __m512 w0, w1, w2, w3;
            if ((k & 127) == 0) pf_line(w + k / 2);
            load_i4x32(w + k / 2, &w0, &w1);
            load_i4x32(w + k / 2 + 16, &w2, &w3);
            __m512 g0 = _mm512_mul_ps(w0, _mm512_loadu_ps(x + k)), g1 = _mm512_mul_ps(w2, _mm512_loadu_ps(x + k + 32));
            g0 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), g0);
            g1 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + k + 48), g1);
            a0 = _mm512_fmadd_ps(g0, scale_at(scale, k / 32), a0);
            a1 = _mm512_fmadd_ps(g1, scale_at(scale, k / 32 + 1), a1);
        }
        if (k < K) {
            __m512 w0, w1;
            load_i4x32(w + k / 2, &w0, &w1);
            __m512 g0 = _mm512_mul_ps(w0, _mm512_loadu_ps(x + k));
            g0 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), g0);
            a0 = _mm512_fmadd_ps(g0, scale_at(scale, k / 32), a0);
        }
    } else {   /* group % 64 == 0 */
        for (int64_t g = 0; g < ng; g++) {
            __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
            for (int64_t kend = k + group; k < kend; k += 64) {
                __m512 w0, w1, w2, w3;
                if ((k & 127) == 0) pf_line(w + k / 2);
                load_i4x32(w + k / 2, &w0, &w1);
                load_i4x32(w + k / 2 + 16, &w2, &w3);
                p0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), p0);
                p1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), p1);
                p2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + k + 32), p2);
                p3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + k + 48), p3);
            }
            a0 = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(p0, p1), _mm512_add_ps(p2, p3)), scale_at(scale, g), a0);
        }
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static TGT void gemv_avx512(float *out, const float *x, const pln_weight *W, int64_t r0, int64_t nr) {
    int64_t K = W->cols;
    for (int64_t r = r0; r < r0 + nr; r++) {
        if (W->dtype == PLN_DTYPE_F16)
            gemv_f16_row(out + r - r0, x, (const uint16_t *)W->w + r * K, K);
        else if (W->dtype == PLN_DTYPE_U8)
            gemv_i4_row(out + r - r0, x, (const uint8_t *)W->w + r * (K / 2), W->scale + r * (K / W->group), W->group, K);
        else
            gemv_i8_row(out + r - r0, x, (const int8_t *)W->w + r * K, W->scale + r * (K / W->group), W->group, K);
    }
}

/* ---- the integer-dot path (pln_cpu_set_int_dot) -------------------------------------------
 * AVX-512 VNNI (with BW for the nibble unpack); other AVX-512 CPUs run the AVX2 file's version.
 * Both use the weights as unsigned bytes u = q + off (int4: the stored nibble, off 8; int8: q xor
 * 0x80, off 128) against signed activation bytes, and start each block's int32 accumulator at
 * -off * (the block's sum of xq), so the block dot is exact: sum u x - off sum x = sum q x.
 *
 * Several tokens (prefill, batched decode): the chunk's rows are repacked once per call, 16 at a
 * time (pln_cpu_q8_repack; the buffer stays in L2 while every token of the chunk passes) so that
 * one 64-byte vector holds 4 columns of 16 rows, and one vpdpbusd against a broadcast 4-byte
 * activation group advances 16 rows x 4 columns. A tile is 32 rows x 6 tokens (or 16 x 8) of
 * int32 block accumulators; per block of 32 columns and token one convert and one FMA per 16 rows
 * (by the token's block scale, times the row scales as a vector when grouped; per-row weights
 * multiply their scale once at the end).
 *
 * One int4 token (decode GEMV) and 2 to PLN_CPU_Q4N_MAX int4 tokens (q4_tile): no repack, the
 * rows are read as stored, a 64-byte line (four blocks) at a time, the activations put in the
 * line's order in registers. (linear.c runs
 * int8 GEMVs on the float path: an int8 GEMV by integer dot measured slower than it; a lone int8
 * token here takes the tile.) */
#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VINL static inline __attribute__((always_inline)) VNNI512

#define Q8UNROLL _Pragma("GCC unroll 8")

static inline int32_t q8_ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* NT tokens x NS sets of 16 repacked rows (set s at wp + s * sstride); m[s]: the rows of set s
 * that exist (stored); cor [nt][nb]: -off * each block's sum of xq; wsf: the row scales per group
 * [ng][32] (grouped) or NULL with wrow [32] (per row, applied at the end). Two sets share each
 * broadcast activation group: half the loads per vpdpbusd of one set. */
VINL void q8_tile(const int NS, const int NT, float *out, int64_t ldo, const int8_t *xq, const float *xs,
                  const int32_t *cor, int64_t ldq, const uint8_t *wp, int64_t sstride, const float *wsf,
                  const float *wrow, int64_t group, int64_t K, const __mmask16 *m) {
    int64_t nb = K / 32, bpg = group / 32, gi = 0, gb = 0;   /* block b is in group gi (gb-th of it) */
    __m512 fa[2][8];
    Q8UNROLL for (int s = 0; s < NS; s++) {
        Q8UNROLL for (int j = 0; j < NT; j++) fa[s][j] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        __m512i ia[2][8];
        Q8UNROLL for (int j = 0; j < NT; j++) {
            ia[0][j] = _mm512_set1_epi32(cor[b * ldq + j]);
            if (NS == 2) ia[1][j] = ia[0][j];
        }
        const uint8_t *wb = wp + 512 * b;
        const int8_t *xg = xq + 32 * b * ldq;
        /* one pointer walks the groups, the tokens are constant offsets from it; the empty asm
         * keeps the compiler from precomputing eight group pointers (they spill) */
        Q8UNROLL for (int g = 0; g < 8; g++, xg += 4 * ldq) {
            __asm__("" : "+r"(xg));
            __m512i w0 = _mm512_load_si512((const void *)(wb + 64 * g)), w1;
            if (NS == 2) w1 = _mm512_load_si512((const void *)(wb + sstride + 64 * g));
            Q8UNROLL for (int j = 0; j < NT; j++) {
                __m512i xv = _mm512_set1_epi32(q8_ld32(xg + 4 * j));
                ia[0][j] = _mm512_dpbusd_epi32(ia[0][j], w0, xv);
                if (NS == 2) ia[1][j] = _mm512_dpbusd_epi32(ia[1][j], w1, xv);
            }
        }
        if (wsf) {
            const float *sg = wsf + gi * 32;
            Q8UNROLL for (int s = 0; s < NS; s++) {
                __m512 sc = _mm512_loadu_ps(sg + 16 * s);
                Q8UNROLL for (int j = 0; j < NT; j++)
                    fa[s][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[s][j]), _mm512_mul_ps(sc, _mm512_set1_ps(xs[b * ldq + j])), fa[s][j]);
            }
        } else {
            Q8UNROLL for (int s = 0; s < NS; s++) {
                Q8UNROLL for (int j = 0; j < NT; j++)
                    fa[s][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[s][j]), _mm512_set1_ps(xs[b * ldq + j]), fa[s][j]);
            }
        }
        if (++gb == bpg) { gb = 0; gi++; }
    }
    Q8UNROLL for (int s = 0; s < NS; s++) {
        __m512 wr = wsf ? _mm512_set1_ps(1.0f) : _mm512_loadu_ps(wrow + 16 * s);
        Q8UNROLL for (int j = 0; j < NT; j++) _mm512_mask_storeu_ps(out + j * ldo + 16 * s, m[s], _mm512_mul_ps(fa[s][j], wr));
    }
}

/* int4 without a repack, a row's 64-byte line (four blocks, 128 columns) at a time: NR rows from
 * row r0 x NT tokens (compile-time after inlining). One token is the decode GEMV; 2 to
 * PLN_CPU_Q4N_MAX tokens (gemm_q4n) take the same loop, since at a few tokens a repack of the
 * rows costs more than the integer dots it feeds (at batch 8 on bloom-560m int4 g32 the repack
 * tiles' repack took 28.8 % of the step against 14.9 % for their dots, `perf`). The activations
 * are plain rows: token t's xq at xq + t K, its block scales and sums at [t nb + b].
 * A line's low nibbles (mask) and high nibbles (shift, mask) are the first and second 16 columns
 * of its four blocks, one block per 128-bit lane, so two vpdpbusd into one accumulator (started
 * at the blocks' -8 sum xq corrections in lanes 0, 4, 8, 12) give each lane one block's partial
 * dot; one convert and one FMA by the four blocks' activation scales times the row's group scales
 * finish the line. Each token's activations are put in that order in registers (two 64-byte
 * loads, two lane shuffles per line, shared by the NR rows). Half the instructions per weight of
 * a pair-at-a-time loop (a 32-byte broadcast load per two blocks), which had been the limit at
 * batch 1 when the memory runs fast. A tail of 1-3 blocks loads with masks (never past a row). */
VINL void q4_tile(const int NR, const int NT, float *out, int64_t ldo, int64_t r0, const int8_t *xq,
                  const float *xs, const int32_t *xsum, const uint8_t *w, const uint16_t *scale, int64_t group,
                  int64_t K) {
    int64_t nb = K / 32, ng = K / group, rb = K / 2;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    /* lane l takes element l / 4: the line's block l / 4 */
    const __m512i lidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i m8 = _mm512_set1_epi32(-8);
    const uint8_t *wr = w + r0 * rb;
    const uint16_t *sr = scale + r0 * ng;
    __m512 f[4][4];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) f[i][j] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b += 4) {
        int64_t nq = nb - b < 4 ? nb - b : 4;   /* blocks in this line */
        __mmask64 wm = nq == 4 ? ~0ull : (1ull << (16 * nq)) - 1;
        int64_t g0 = 32 * b / group, g3 = (32 * b + 32 * nq - 32) / group;
        if (NR == 4) {   /* see PREFETCH_NOTE; the scales: 2 bytes per group */
            pf_ahead4(wr, 64 * b);
            if (ng > 1) _mm_prefetch((const char *)sr + (PF_AHEAD + 64 * b) * 4 / group, _MM_HINT_T0);
        }
        __m512i lo[4], hi[4];
        __m512 sc[4];
        UNROLL for (int i = 0; i < NR; i++) {
            const uint8_t *q = wr + i * rb + 16 * b;
            __m512i raw = nq == 4 ? _mm512_loadu_si512((const void *)q) : _mm512_maskz_loadu_epi8(wm, q);
            lo[i] = _mm512_and_si512(raw, nib);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
            if (ng == 1) {
                sc[i] = _mm512_set1_ps(1.0f);
            } else if (g0 == g3) {   /* one group covers the line */
                sc[i] = _mm512_set1_ps(_cvtsh_ss(sr[i * ng + g0]));
            } else if (group == 32 && nq == 4) {   /* a group per block: the four scales side by side */
                __m128 s = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(sr + i * ng + g0)));
                sc[i] = _mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(s));
            } else {   /* the line's blocks in two or more groups */
                float t[4] = {0, 0, 0, 0};
                for (int64_t q4 = 0; q4 < nq; q4++) t[q4] = _cvtsh_ss(sr[i * ng + (32 * (b + q4)) / group]);
                sc[i] = _mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(_mm_loadu_ps(t)));
            }
        }
        UNROLL for (int j = 0; j < NT; j++) {
            const int8_t *xj = xq + j * K + 32 * b;
            __m512i a, c;
            __m128 s4;
            __m128i c4;
            if (nq == 4) {
                a = _mm512_loadu_si512((const void *)xj);
                c = _mm512_loadu_si512((const void *)(xj + 64));
                s4 = _mm_loadu_ps(xs + j * nb + b);
                c4 = _mm_loadu_si128((const __m128i *)(const void *)(xsum + j * nb + b));
            } else {
                __mmask8 ms = (__mmask8)((1u << nq) - 1);
                a = _mm512_maskz_loadu_epi8(nq >= 2 ? ~0ull : 0xFFFFFFFFull, xj);
                c = _mm512_maskz_loadu_epi8(nq == 3 ? 0xFFFFFFFFull : 0, xj + 64);
                s4 = _mm_maskz_loadu_ps(ms, xs + j * nb + b);
                c4 = _mm_maskz_loadu_epi32(ms, xsum + j * nb + b);
            }
            /* a = [b lo, b hi, b+1 lo, b+1 hi], c = the same of b+2, b+3 (16-byte quarters) */
            __m512i xlo = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
            __m512i xhi = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
            __m512 sv = _mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(s4));
            __m512i cv = _mm512_mullo_epi32(_mm512_maskz_permutexvar_epi32(0x1111, lidx, _mm512_zextsi128_si512(c4)), m8);
            UNROLL for (int i = 0; i < NR; i++) {
                __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cv, lo[i], xlo), hi[i], xhi));
                f[i][j] = _mm512_fmadd_ps(d, ng == 1 ? sv : _mm512_mul_ps(sv, sc[i]), f[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        float rs = ng == 1 ? _cvtsh_ss(sr[i]) : 1.0f;
        UNROLL for (int j = 0; j < NT; j++) out[j * ldo + r0 + i] = _mm512_reduce_add_ps(f[i][j]) * rs;
    }
}

/* nt int4 tokens (plain-row activations, see q4_tile) times nr packed int4 rows: tiles of 4 rows x
 * 2 tokens (more tokens per tile run out of registers: 4 x 4 accumulators + the unpacked rows). */
static VNNI512 void gemm_q4n_vnni512(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,
                                     int64_t nt, const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr,
                                     int64_t K) {
    int64_t nb = K / 32;
#define Q4T(NR, NT) q4_tile(NR, NT, out + t * ldo, ldo, r, xq + t * K, xs + t * nb, xsum + t * nb, w, scale, group, K)
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4) {
        int64_t t = 0;
        for (; t + 2 <= nt; t += 2) Q4T(4, 2);
        for (; t < nt; t++) Q4T(4, 1);
    }
    for (; r < nr; r++) {
        int64_t t = 0;
        for (; t + 2 <= nt; t += 2) Q4T(1, 2);
        for (; t < nt; t++) Q4T(1, 1);
    }
#undef Q4T
}

/* The int4 decode GEMV (one token) for the common shapes: whole 128-column lines (K % 128 == 0)
 * and groups of 32 or of a multiple of 128. The same arithmetic as q4_tile at NT = 1, in the same
 * order, so its results are bit for bit q4_tile's (and a lone token's are those it has in a
 * batch of gemm_q4n), without q4_tile's per-line work for the general case: a division for the
 * line's groups, the branches on the tail and the group shape, the activations' lane shuffles
 * (identical for every row: here laid out once per call, per segment of Q4G_SEG lines, and read
 * from L1). perf had shown the general tile spilling its unpacked rows to the stack and an idiv
 * per line. */
#define Q4G_SEG 32
/* One token's 128-column line l of activations as q4_tile puts them in registers: x[0], x[1] the
 * low and high halves in the rows' nibble order, x[2] the blocks' -8 sum xq corrections in lanes
 * 0, 4, 8, 12, x[3] the block scales (xj: the line's 128 bytes, s and sum: its 4 blocks'). */
VINL void q4_line_x(__m512i *x, const int8_t *xj, const float *s, const int32_t *sum) {
    const __m512i lidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512i a = _mm512_loadu_si512((const void *)xj), c = _mm512_loadu_si512((const void *)(xj + 64));
    __m128 s4 = _mm_loadu_ps(s);
    __m128i c4 = _mm_loadu_si128((const __m128i *)(const void *)sum);
    x[0] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
    x[1] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
    x[2] = _mm512_mullo_epi32(_mm512_maskz_permutexvar_epi32(0x1111, lidx, _mm512_zextsi128_si512(c4)),
                              _mm512_set1_epi32(-8));
    x[3] = _mm512_castps_si512(_mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(s4)));
}
VINL void q4_gemv_tile(const int NR, const bool G32, __m512 *f, const uint8_t *wr, const uint16_t *sr, int64_t rb,
                       int64_t ng, int64_t lpg, const __m512i *xl, int64_t l0, int64_t l1) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i lidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = f[i];
    int64_t g = G32 ? 0 : l0 / lpg, lc = G32 ? 0 : l0 % lpg;   /* the line's group and its place in it */
    for (int64_t l = l0; l < l1; l++) {
        const __m512i *x = xl + 4 * (l - l0);
        if (NR == 4) {   /* see PREFETCH_NOTE; the scales: 2 bytes per group */
            pf_ahead4(wr, 256 * l);
            _mm_prefetch((const char *)sr + (PF_AHEAD + 256 * l) * 4 / (G32 ? 32 : 128 * lpg), _MM_HINT_T0);
        }
        UNROLL for (int i = 0; i < NR; i++) {
            __m512i raw = _mm512_loadu_si512((const void *)(wr + i * rb + 64 * l));
            __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
            __m512 sc;
            if (G32) {
                __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(sr + i * ng + 4 * l)));
                sc = _mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(s4));
            } else {
                sc = _mm512_set1_ps(_cvtsh_ss(sr[i * ng + g]));
            }
            __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x[2], lo, x[0]), hi, x[1]));
            a[i] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_castsi512_ps(x[3]), sc), a[i]);
        }
        if (!G32 && ++lc == lpg) { lc = 0; g++; }
    }
    UNROLL for (int i = 0; i < NR; i++) f[i] = a[i];
}

static VNNI512 void gemv_q4_vnni512(float *out, const int8_t *xq, const float *xs, const int32_t *xsum,
                                    const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    int64_t nl = K / 128, ng = K / group, rb = K / 2, lpg = group / 128;
    const bool g32 = group == 32;
    /* per line: the activations' low and high halves in the rows' nibble order, the -8 sum xq
     * corrections and the block scales, as q4_tile puts them in registers (q4_line_x) */
    __m512i xl[4 * Q4G_SEG];
    for (int64_t r0 = 0; r0 < nr; r0 += 32) {
        int64_t n = nr - r0 < 32 ? nr - r0 : 32;
        __m512 f[32];
        for (int64_t i = 0; i < n; i++) f[i] = _mm512_setzero_ps();
        for (int64_t l0 = 0; l0 < nl; l0 += Q4G_SEG) {
            int64_t l1 = nl - l0 < Q4G_SEG ? nl : l0 + Q4G_SEG;
            for (int64_t l = l0; l < l1; l++) q4_line_x(xl + 4 * (l - l0), xq + 128 * l, xs + 4 * l, xsum + 4 * l);
            const uint8_t *wr = w + r0 * rb;
            const uint16_t *sr = scale + r0 * ng;
            int64_t i = 0;
            if (g32) {
                for (; i + 4 <= n; i += 4) q4_gemv_tile(4, true, f + i, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, l0, l1);
                for (; i < n; i++) q4_gemv_tile(1, true, f + i, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, l0, l1);
            } else {
                for (; i + 4 <= n; i += 4) q4_gemv_tile(4, false, f + i, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, l0, l1);
                for (; i < n; i++) q4_gemv_tile(1, false, f + i, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, l0, l1);
            }
        }
        for (int64_t i = 0; i < n; i++) out[r0 + i] = _mm512_reduce_add_ps(f[i]);   /* q4_tile: times 1.0f, exact */
    }
}

/* Q4B_NOTE: 2 to PLN_CPU_Q4N_MAX int4 tokens (and any number in the batch-invariant mode) for
 * the GEMV's shapes: gemv_q4_vnni512's arithmetic in its order for each row and token, so every
 * token's bits are those it gets alone (and in q4_tile). q4_tile, which takes these tokens two at
 * a time, unpacked a row's line again for every pair and shuffled each token's activations again
 * for every 4 rows (84 operations per 16 vpdpbusd; Llama-3.2-1B int4 g32 at batch 8 spent twice
 * the time reading its weights would take in it). Here the tokens' activations are laid out once
 * per segment of lines (as the GEMV lays out one token's) and read from L1 by every row tile; a
 * 4-row tile unpacks its line once per Q4B_NT tokens held in registers, and a chunk of Q4B_ROWS
 * rows keeps its accumulators in L1 across the segments, so the weights stream from memory once.
 * Segments hold 64 token-lines (16 KiB of activations); groups of Q4B_TOK tokens at a time. */
#define Q4B_NT 3
#define Q4B_ROWS 32
#define Q4B_TOK 16
VINL void q4b_tile(const int NR, const int NT, const bool G32, __m512 *f, int64_t ldf, const uint8_t *wr,
                   const uint16_t *sr, int64_t rb, int64_t ng, int64_t lpg, const __m512i *xl, int64_t xlt,
                   int64_t l0, int64_t l1, const char *pw) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i lidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 a[4][Q4B_NT];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) a[i][j] = f[i * ldf + j];
    }
    int64_t g = G32 ? 0 : l0 / lpg, lc = G32 ? 0 : l0 % lpg;   /* the line's group and its place in it */
    for (int64_t l = l0; l < l1; l++) {
        const __m512i *x = xl + 4 * (l - l0);
        if (NR == 4 && pw) {   /* Q4B_PF_NOTE: the first token tile of a row tile reads memory */
            UNROLL for (int i = 0; i < 4; i++) _mm_prefetch(pw + i * rb + 64 * (l - l0), _MM_HINT_T0);
        }
        __m512i lo[4], hi[4];
        __m512 sc[4];
        UNROLL for (int i = 0; i < NR; i++) {
            __m512i raw = _mm512_loadu_si512((const void *)(wr + i * rb + 64 * l));
            lo[i] = _mm512_and_si512(raw, nib);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
            if (G32) {
                __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(sr + i * ng + 4 * l)));
                sc[i] = _mm512_permutexvar_ps(lidx, _mm512_zextps128_ps512(s4));
            } else {
                sc[i] = _mm512_set1_ps(_cvtsh_ss(sr[i * ng + g]));
            }
        }
        UNROLL for (int j = 0; j < NT; j++) {
            const __m512i *xj = x + j * xlt;
            __m512i xa = _mm512_load_si512((const void *)xj), xb = _mm512_load_si512((const void *)(xj + 1));
            __m512i cv = _mm512_load_si512((const void *)(xj + 2));
            __m512 sv = _mm512_castsi512_ps(_mm512_load_si512((const void *)(xj + 3)));
            UNROLL for (int i = 0; i < NR; i++) {
                __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cv, lo[i], xa), hi[i], xb));
                a[i][j] = _mm512_fmadd_ps(d, _mm512_mul_ps(sv, sc[i]), a[i][j]);
            }
        }
        if (!G32 && ++lc == lpg) { lc = 0; g++; }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) f[i * ldf + j] = a[i][j];
    }
}

/* The NR-row tiles of one segment: every token tile of Q4B_NT (then 2, 1) tokens. */
VINL void q4b_rows(const int NR, const bool G32, __m512 *f, int64_t tn, const uint8_t *wr, const uint16_t *sr,
                   int64_t rb, int64_t ng, int64_t lpg, const __m512i *xl, int64_t seg, int64_t l0, int64_t l1,
                   const char *pw) {
    int64_t j = 0;
    for (; j + Q4B_NT <= tn; j += Q4B_NT, pw = NULL)
        q4b_tile(NR, Q4B_NT, G32, f + j, tn, wr, sr, rb, ng, lpg, xl + 4 * seg * j, 4 * seg, l0, l1, pw);
    for (; j + 2 <= tn; j += 2, pw = NULL)
        q4b_tile(NR, 2, G32, f + j, tn, wr, sr, rb, ng, lpg, xl + 4 * seg * j, 4 * seg, l0, l1, pw);
    for (; j < tn; j++, pw = NULL)
        q4b_tile(NR, 1, G32, f + j, tn, wr, sr, rb, ng, lpg, xl + 4 * seg * j, 4 * seg, l0, l1, pw);
}

/* Q4B_PF_NOTE: a 4-row tile reads a segment of four rows a row apart, and the tiles go by
 * segments, so a prefetch at the GEMV's sequential position (pf_ahead4) named lines that the
 * tiles read at another time or not at all past the 32-row chunk's end ([131072, 2048] int4 g32 at
 * 8 tokens on a Zen 5: 8.2 ms out of cache against 0.86 for 16384 rows in L3). The first token
 * tile of each 4-row tile prefetches instead the segment of the 4-row tile PF_AHEAD bytes of
 * reading later, in the order the tiles take them (the next segment's first tiles, then the rows
 * after this chunk, which the call's thread mostly reads next: linear.c STREAM_NOTE), with that
 * tile's scales. Returns its first row's line l0 (a prefetch past the matrix never faults). */
VINL const char *q4b_pf_target(const uint8_t *w, const uint16_t *scale, int64_t r0, int64_t i, int64_t n,
                               int64_t l0, int64_t seg, int64_t nl, int64_t rb, int64_t ng, int64_t lpg, bool g32) {
    int64_t dt = (PF_AHEAD + 256 * seg - 1) / (256 * seg);   /* 4-row tiles ahead */
    int64_t nq = n / 4, q = i / 4 + dt, tl = l0, tr = r0;
    while (q >= nq) {
        q -= nq;
        tl += seg;
        if (tl >= nl) { tl = 0; tr += n; }
    }
    const char *pw = (const char *)(w + (tr + 4 * q) * rb + 64 * tl);
    /* its scales: 8 bytes a line per row with groups of 32, 2 per group of lpg lines else */
    const char *ps = (const char *)(scale + (tr + 4 * q) * ng + (g32 ? 4 * tl : tl / lpg));
    int64_t sb = g32 ? 8 * seg : 2 * (seg / lpg + 1);
    for (int64_t k = 0; k < 4; k++)
        for (int64_t b = 0; b < sb; b += 64) _mm_prefetch(ps + k * 2 * ng + b, _MM_HINT_T0);
    return pw;
}

static VNNI512 void gemm_q4b_vnni512(float *out, int64_t ldo, const int8_t *xq, const float *xs,
                                     const int32_t *xsum, int64_t nt, const uint8_t *w, const uint16_t *scale,
                                     int64_t group, int64_t nr, int64_t K) {
    int64_t nl = K / 128, ng = K / group, rb = K / 2, lpg = group / 128, nb = K / 32;
    const bool g32 = group == 32;
    __m512i xl[4 * 64];                  /* token j's line l0 + l at xl + 4 (j seg + l) */
    __m512 f[Q4B_ROWS * Q4B_TOK];        /* row i, token j at f[i tn + j] */
    for (int64_t t0 = 0; t0 < nt; t0 += Q4B_TOK) {
        int64_t tn = nt - t0 < Q4B_TOK ? nt - t0 : Q4B_TOK, seg = 64 / tn < 32 ? 64 / tn : 32;
        const int8_t *xq0 = xq + t0 * K;
        const float *xs0 = xs + t0 * nb;
        const int32_t *xsum0 = xsum + t0 * nb;
        for (int64_t r0 = 0; r0 < nr; r0 += Q4B_ROWS) {
            int64_t n = nr - r0 < Q4B_ROWS ? nr - r0 : Q4B_ROWS;
            for (int64_t i = 0; i < n * tn; i++) f[i] = _mm512_setzero_ps();
            for (int64_t l0 = 0; l0 < nl; l0 += seg) {
                int64_t l1 = nl - l0 < seg ? nl : l0 + seg;
                for (int64_t j = 0; j < tn; j++)   /* as gemv_q4_vnni512 lays out its token */
                    for (int64_t l = l0; l < l1; l++)
                        q4_line_x(xl + 4 * (j * seg + l - l0), xq0 + j * K + 128 * l, xs0 + j * nb + 4 * l,
                                  xsum0 + j * nb + 4 * l);
                const uint8_t *wr = w + r0 * rb;
                const uint16_t *sr = scale + r0 * ng;
                int64_t i = 0;
                if (g32) {
                    for (; i + 4 <= n; i += 4)
                        q4b_rows(4, true, f + i * tn, tn, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, seg, l0, l1,
                                 q4b_pf_target(w, scale, r0, i, n, l0, seg, nl, rb, ng, lpg, true));
                    for (; i < n; i++) q4b_rows(1, true, f + i * tn, tn, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, seg, l0, l1, NULL);
                } else {
                    for (; i + 4 <= n; i += 4)
                        q4b_rows(4, false, f + i * tn, tn, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, seg, l0, l1,
                                 q4b_pf_target(w, scale, r0, i, n, l0, seg, nl, rb, ng, lpg, false));
                    for (; i < n; i++) q4b_rows(1, false, f + i * tn, tn, wr + i * rb, sr + i * ng, rb, ng, lpg, xl, seg, l0, l1, NULL);
                }
            }
            for (int64_t j = 0; j < tn; j++)
                for (int64_t i = 0; i < n; i++)
                    out[(t0 + j) * ldo + r0 + i] = _mm512_reduce_add_ps(f[i * tn + j]);   /* as the GEMV's */
        }
    }
}

/* cpu.h gemm_q4n: gemm_q4b for the GEMV's shapes (Q4B_NOTE), q4_tile's loop for the rest; the
 * AVX2 tier's (AVX-VNNI or vpmaddubsw) on an AVX-512 CPU without VNNI, as gemm_q8's fallback. */
static void gemm_q4n_avx512(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,
                            int64_t nt, const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    if (!pln_cpu_has_q4n())
        pln_cpu_kernels_avx2.gemm_q4n(out, ldo, xq, xs, xsum, nt, w, scale, group, nr, K);
    else if (K % 128 == 0 && K / group > 1 && (group == 32 || group % 128 == 0))
        gemm_q4b_vnni512(out, ldo, xq, xs, xsum, nt, w, scale, group, nr, K);
    else
        gemm_q4n_vnni512(out, ldo, xq, xs, xsum, nt, w, scale, group, nr, K);
}

bool pln_cpu_has_q4n(void) {
    return !pln_cpu_no_vnni && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/* cpu.h pln_cpu_q8_repack_avx512: int4 as simd_avx2.c REPACK_I4_NOTE, 16 rows a vector: lane L of
 * vector i holds row 4 L + i's 16 stored bytes of the block, so the same two unpack stages give
 * word g of rows 0-15 in order in one vector, and a mask (group g) or shift and mask (g + 4) make
 * each a whole 64-byte line of the output: 44 instructions per block against the AVX2 version's
 * 72 (it was 8-12 % of a bloom-560m int4 g32 decode step at batch 32). */
TGT void pln_cpu_q8_repack_avx512(uint8_t *wp, const void *w, bool i4, int64_t nr, int64_t K) {
    if (!i4) {
        pln_cpu_q8_repack(wp, w, i4, nr, K);
        return;
    }
    static const uint8_t zero[16];
    const __m512i m = _mm512_set1_epi8(0x0f);
    int64_t rb = K / 2;
    const uint8_t *r[16];
    int64_t step[16];   /* a missing row reads the zeros in place */
    for (int i = 0; i < 16; i++) {
        bool have = i < nr;
        r[i] = have ? (const uint8_t *)w + i * rb : zero;
        step[i] = have ? 16 : 0;
    }
    for (int64_t b = 0; b < K / 32; b++) {
        __m512i v[4];
        if ((b & 3) == 0)   /* the rows are 16 streams read 16 bytes at a time: a line each, 1 KiB ahead */
            for (int i = 0; i < 16; i++) _mm_prefetch((const char *)(r[i] + b * step[i]) + 1024, _MM_HINT_T0);
        for (int i = 0; i < 4; i++) {
            __m512i a = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r[i] + b * step[i])));
            a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(r[4 + i] + b * step[4 + i])), 1);
            a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(r[8 + i] + b * step[8 + i])), 2);
            v[i] = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(r[12 + i] + b * step[12 + i])), 3);
        }
        __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
        __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
        __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
        uint8_t *o = wp + 512 * b;
        for (int g = 0; g < 4; g++) {
            _mm512_store_si512((void *)(o + 64 * g), _mm512_and_si512(u[g], m));
            _mm512_store_si512((void *)(o + 64 * (g + 4)), _mm512_and_si512(_mm512_srli_epi32(u[g], 4), m));
        }
    }
}

static VNNI512 void gemm_q8_vnni512(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,
                                    int64_t nt, int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group,
                                    int64_t nr, int64_t K) {
    if (nt == 1 && i4) {
        if (K % 128 == 0 && K / group > 1 && (group == 32 || group % 128 == 0))
            gemv_q4_vnni512(out, xq, xs, xsum, w, scale, group, nr, K);
        else
            gemm_q4n_vnni512(out, 0, xq, xs, xsum, 1, w, scale, group, nr, K);
        return;
    }
    int64_t nb = K / 32, ng = K / group, ns = nr > 16 ? 2 : 1, sstride = 512 * nb;
    uint8_t *raw = pln_xmalloc((size_t)(ns * sstride) + 64);
    uint8_t *wp = raw + (64 - (uintptr_t)raw % 64) % 64;   /* aligned: each vector one cache line */
    float *wsf = ng > 1 ? pln_xmalloc((size_t)ng * 32 * sizeof(float)) : NULL;
    int32_t *cor = pln_xmalloc((size_t)(ldq * nb) * sizeof(int32_t));
    float wrow[32];
    __mmask16 m[2];
    for (int64_t s = 0; s < ns; s++) {
        int64_t n = nr - 16 * s < 16 ? nr - 16 * s : 16;
        pln_cpu_q8_repack_avx512(wp + s * sstride, (const uint8_t *)w + 16 * s * (i4 ? K / 2 : K), i4, n, K);
        m[s] = (__mmask16)((1u << n) - 1);
    }
    for (int64_t i = 0; i < 32; i++) {
        if (ng == 1) wrow[i] = i < nr ? _cvtsh_ss(scale[i]) : 0.0f;
        else for (int64_t g = 0; g < ng; g++) wsf[g * 32 + i] = i < nr ? _cvtsh_ss(scale[i * ng + g]) : 0.0f;
    }
    int32_t off = i4 ? 8 : 128;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < nt; j++) cor[b * ldq + j] = -off * xsum[b * ldq + j];
    int64_t t = 0;
#define Q8_TILE(NS, NT) q8_tile(NS, NT, out + t * ldo, ldo, xq + 4 * t, xs + t, cor + t, ldq, wp, sstride, wsf, wrow, group, K, m)
    if (ns == 2) {
        for (; t + 6 <= nt; t += 6) Q8_TILE(2, 6);
        for (; t + 4 <= nt; t += 4) Q8_TILE(2, 4);
        for (; t + 2 <= nt; t += 2) Q8_TILE(2, 2);
        for (; t < nt; t++) Q8_TILE(2, 1);
    } else {
        for (; t + 8 <= nt; t += 8) Q8_TILE(1, 8);
        for (; t + 4 <= nt; t += 4) Q8_TILE(1, 4);
        for (; t + 2 <= nt; t += 2) Q8_TILE(1, 2);
        for (; t < nt; t++) Q8_TILE(1, 1);
    }
#undef Q8_TILE
    free(raw);
    free(wsf);
    free(cor);
}

/* int8 weights take gemm_q8 from this many tokens (cpu.h Q8_MIN_NOTE): Llama-3.2-1B decode on the
 * Intel Xeon of docs/BENCHMARKS.md (GenuineIntel family 6 model 167, AVX-512 VNNI, 2 threads,
 * quiet, `pollen bench --batch 2,4,8,9,10,11,12,16 --int-dot off|on`), tokens/s float / integer
 * dot: grouped int8 2: 31.5 / 18.4, 4: 52.9 / 33.8, 8: 69.8 / 57.1, 11: 82.5 / 72.5, 12: 73.1 /
 * 75.7, 16: 88.0 / 95.0; per row 8: 77.0 / 66.6, 10: 85.7 / 79.4, 11: 85.3 / 86.9, 16: 96.1 /
 * 106.4 (on the Zen 5 of that file, at 8: grouped 124.9 / 84.2, per row 136.8 / 97.5). */
#define Q8_MIN_AVX512 12

static void gemm_q8_avx512(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                           int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    if (!pln_cpu_no_vnni && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        gemm_q8_vnni512(out, ldo, xq, xs, xsum, nt, ldq, w, i4, scale, group, nr, K);
    else
        pln_cpu_kernels_avx2.gemm_q8(out, ldo, xq, xs, xsum, nt, ldq, w, i4, scale, group, nr, K);
}

/* pln_cpu_quant_act, 16 columns per vector, bit for bit: the same scalar scale and inverse, the
 * same fp32 product, rounded half to even by vcvtps2dq as nearbyintf does in the default mode. */
static TGT void quant_act_avx512(const float *x, int64_t K, int8_t *xq, float *xs, int32_t *xsum, int64_t ldq,
                                 int64_t t0, int64_t t1) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    /* token by token: each reads its row in order (block by block across the tokens, rows K
     * floats apart, 4 KiB at K = 1024, landed in one L1 set: the scattered stores below then
     * waited on those loads, 6.4 % of a bloom-560m int4 step at batch 32) */
    for (int64_t t = t0; t < t1; t++)
        for (int64_t b = 0; b < K / 32; b++) {
            const float *xb = x + t * K + 32 * b;
            __m512 a = _mm512_loadu_ps(xb), c = _mm512_loadu_ps(xb + 16);
            /* max(|x|, acc) keeps acc where |x| is NaN, as fmaxf does */
            float amax = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_abs_ps(a), _mm512_max_ps(_mm512_abs_ps(c), _mm512_setzero_ps())));
            float sc = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            __m512 iv = _mm512_set1_ps(inv);
            __m512i qa = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, iv)), lo), hi);
            __m512i qc = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(c, iv)), lo), hi);
            xs[b * ldq + t] = sc;
            xsum[b * ldq + t] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
            __m128i pa = _mm512_cvtsepi32_epi8(qa), pc = _mm512_cvtsepi32_epi8(qc);
            if (ldq == 1) {
                _mm_storeu_si128((__m128i *)(xq + 32 * b), pa);
                _mm_storeu_si128((__m128i *)(xq + 32 * b + 16), pc);
                continue;
            }
            int8_t *o = xq + 4 * (8 * b * ldq + t);
            int64_t st = 4 * ldq;
            _mm_storeu_si32(o, pa);
            _mm_storeu_si32(o + st, _mm_srli_si128(pa, 4));
            _mm_storeu_si32(o + 2 * st, _mm_srli_si128(pa, 8));
            _mm_storeu_si32(o + 3 * st, _mm_srli_si128(pa, 12));
            _mm_storeu_si32(o + 4 * st, pc);
            _mm_storeu_si32(o + 5 * st, _mm_srli_si128(pc, 4));
            _mm_storeu_si32(o + 6 * st, _mm_srli_si128(pc, 8));
            _mm_storeu_si32(o + 7 * st, _mm_srli_si128(pc, 12));
        }
}

/* The attention loops are written once over a row loader (inlined with f16 a constant): the
 * F16-cache versions do the same arithmetic in the same order on the exactly converted values,
 * so an F16 cache gives bit for bit what an F32 cache holding the same rounded rows gives. */
INL __m512 kv_ldv(const void *p, int64_t i, bool f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))) : _mm512_loadu_ps((const float *)p + i);
}
INL float kv_ld(const void *p, int64_t i, bool f16) {
    return f16 ? pln_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The 16 horizontal sums of a[0..15] as one vector (lane i = sum of a[i]): pairs are folded by
 * unpacks, then 128-bit lanes by shuffles, 30 instructions where 16 separate reductions take
 * about 100. */
INL __m512 hsum16(const __m512 *a) {
    __m512 b[8], c[4];
    UNROLL16 for (int i = 0; i < 8; i++)   /* per 128-bit lane: a2i, a2i+1, a2i, a2i+1 partials */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    UNROLL16 for (int i = 0; i < 4; i++) { /* per 128-bit lane: a4i .. a4i+3 partials */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* lanes (0, 2 | 1, 3) of two vectors, added: each 128-bit lane now holds two lanes' sums */
    __m512 f = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
    __m512 g = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(f, g, 0x88), _mm512_shuffle_f32x4(f, g, 0xdd));
}

/* Scores of 16 consecutive keys (rows of D, a multiple of 16; a compile-time constant after
 * inlining for the common head sizes, so the 16 rows are one pointer plus fixed offsets instead
 * of 16 registers). */
INL __m512 dots16(const float *q, const void *k, int64_t k0, const int64_t D, bool f16) {
    __m512 a[16];
    UNROLL16 for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
    for (int64_t e = 0; e < D; e += 16) {
        __m512 qv = _mm512_loadu_ps(q + e);
        UNROLL16 for (int j = 0; j < 16; j++) a[j] = _mm512_fmadd_ps(qv, kv_ldv(k, k0 + j * D + e, f16), a[j]);
    }
    return hsum16(a);
}

/* Sixteen keys at a time (a full KV block) share each load of q and one hsum16; then four at a
 * time. */
INL void dots_impl(float *scores, const float *q, const void *k, int64_t n, int64_t d, bool f16) {
    int64_t i = 0;
    if (d % 16 == 0)
        for (; i + 16 <= n; i += 16) {
            __m512 sv = d == 64 ? dots16(q, k, i * d, 64, f16) : d == 128 ? dots16(q, k, i * d, 128, f16) : dots16(q, k, i * d, d, f16);
            _mm512_storeu_ps(scores + i, sv);
        }
    for (; i + 4 <= n; i += 4) {
        const int64_t k0 = i * d;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        int64_t e = 0;
        for (; e + 16 <= d; e += 16) {
            __m512 qv = _mm512_loadu_ps(q + e);
            a0 = _mm512_fmadd_ps(qv, kv_ldv(k, k0 + e, f16), a0);
            a1 = _mm512_fmadd_ps(qv, kv_ldv(k, k0 + d + e, f16), a1);
            a2 = _mm512_fmadd_ps(qv, kv_ldv(k, k0 + 2 * d + e, f16), a2);
            a3 = _mm512_fmadd_ps(qv, kv_ldv(k, k0 + 3 * d + e, f16), a3);
        }
        float s0 = _mm512_reduce_add_ps(a0), s1 = _mm512_reduce_add_ps(a1), s2 = _mm512_reduce_add_ps(a2), s3 = _mm512_reduce_add_ps(a3);
        for (; e < d; e++) {
            s0 += q[e] * kv_ld(k, k0 + e, f16); s1 += q[e] * kv_ld(k, k0 + d + e, f16); s2 += q[e] * kv_ld(k, k0 + 2 * d + e, f16); s3 += q[e] * kv_ld(k, k0 + 3 * d + e, f16);
        }
        scores[i] = s0; scores[i + 1] = s1; scores[i + 2] = s2; scores[i + 3] = s3;
    }
    for (; i < n; i++) {
        __m512 a0 = _mm512_setzero_ps();
        int64_t e = 0;
        for (; e + 16 <= d; e += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), kv_ldv(k, i * d + e, f16), a0);
        float s0 = _mm512_reduce_add_ps(a0);
        for (; e < d; e++) s0 += q[e] * kv_ld(k, i * d + e, f16);
        scores[i] = s0;
    }
}

/* o is held in registers four vectors at a time (four independent FMA chains) while the
 * stretch's keys stream past: each vector of o is loaded and stored once per stretch. */
INL void weighted_sum_impl(float *o, float c, const float *p, const void *v, int64_t n, int64_t d, bool f16) {
    __m512 cv = _mm512_set1_ps(c);
    int64_t e = 0;
    for (; e + 4 * 16 <= d; e += 4 * 16) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(o + e), cv), a1 = _mm512_mul_ps(_mm512_loadu_ps(o + e + 16), cv);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(o + e + 2 * 16), cv), a3 = _mm512_mul_ps(_mm512_loadu_ps(o + e + 3 * 16), cv);
        for (int64_t i = 0; i < n; i++) {
            const int64_t vi = i * d + e;
            __m512 pv = _mm512_set1_ps(p[i]);
            a0 = _mm512_fmadd_ps(pv, kv_ldv(v, vi, f16), a0);
            a1 = _mm512_fmadd_ps(pv, kv_ldv(v, vi + 16, f16), a1);
            a2 = _mm512_fmadd_ps(pv, kv_ldv(v, vi + 2 * 16, f16), a2);
            a3 = _mm512_fmadd_ps(pv, kv_ldv(v, vi + 3 * 16, f16), a3);
        }
        _mm512_storeu_ps(o + e, a0); _mm512_storeu_ps(o + e + 16, a1);
        _mm512_storeu_ps(o + e + 2 * 16, a2); _mm512_storeu_ps(o + e + 3 * 16, a3);
    }
    for (; e + 16 <= d; e += 16) {
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(o + e), cv);
        for (int64_t i = 0; i < n; i++) acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i]), kv_ldv(v, i * d + e, f16), acc);
        _mm512_storeu_ps(o + e, acc);
    }
    for (; e < d; e++) {
        float acc = o[e] * c;
        for (int64_t i = 0; i < n; i++) acc += p[i] * kv_ld(v, i * d + e, f16);
        o[e] = acc;
    }
}

static TGT void dots_avx512(float *scores, const float *q, const float *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, false);
}
static TGT void dots_f16_avx512(float *scores, const float *q, const uint16_t *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, true);
}
static TGT void weighted_sum_avx512(float *o, float c, const float *p, const float *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, false);
}
static TGT void weighted_sum_f16_avx512(float *o, float c, const float *p, const uint16_t *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, true);
}

/* exp(x) for x <= 88: 2^n * e^r with |r| <= ln2/2 and Cephes' expf polynomial (about 1 ulp);
 * vscalefps does the 2^n and gives 0 for very negative x. */
INL __m512 exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

INL __m512 gelu512(__m512 x) {
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 u = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(-2.0f * 0.79788456f)),
                             _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(u)));
}

static TGT void bias_gelu_avx512(float *o, const uint16_t *bias, int64_t n, bool gelu) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(o + i);
        if (bias) v = _mm512_add_ps(v, load_f16(bias + i));
        if (gelu) v = gelu512(v);
        _mm512_storeu_ps(o + i, v);
    }
    for (; i < n; i++) {
        float v = o[i] + (bias ? pln_f16_to_f32(bias[i]) : 0.0f);
        o[i] = gelu ? pln_gelu(v) : v;
    }
}

static TGT double fma_chains_avx512(int64_t iters, float *sink) {
    __m512 a[PLN_CPU_FMA_CHAINS], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    UNROLL16 for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = _mm512_set1_ps(1.0f + 1e-3f * (float)i);
    for (int64_t n = 0; n < iters; n++) {
        UNROLL16 for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < PLN_CPU_FMA_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * PLN_CPU_FMA_CHAINS * (double)iters;
}

/* The tail as one masked vector: a row of any width takes no scalar exp. */
static TGT void silu_mul_avx512(float *out, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
    }
}

/* Four accumulators (the sum of a 250k-entry vocab row in fp32 lanes stays accurate to ~1e-6). */
static TGT float sum_exp_avx512(const float *x, int64_t n, float mx) {
    __m512 m = _mm512_set1_ps(mx), a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 * 16 <= n; i += 4 * 16) {
        a0 = _mm512_add_ps(a0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
        a1 = _mm512_add_ps(a1, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), m)));
        a2 = _mm512_add_ps(a2, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 2 * 16), m)));
        a3 = _mm512_add_ps(a3, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 3 * 16), m)));
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_add_ps(a0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m)));
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++) s += expf(x[i] - mx);
    return s;
}

/* A stretch of at most a block of keys: one masked vector for the tail, no scalar exp. */
static TGT float exp_sum_avx512(float *x, int64_t n, float mx) {
    __m512 m = _mm512_set1_ps(mx), a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, e);
        a = _mm512_add_ps(a, e);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
        _mm512_mask_storeu_ps(x + i, k, e);
        a = _mm512_mask_add_ps(a, k, a, e);
    }
    return _mm512_reduce_add_ps(a);
}

static TGT float score_max_avx512(float *x, int64_t n, float scale, float slope, int32_t j0) {
    __m512 sv = _mm512_set1_ps(scale), lv = _mm512_set1_ps(slope), mv = _mm512_set1_ps(-INFINITY);
    __m512i jv = _mm512_add_epi32(_mm512_set1_epi32(j0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv), _mm512_mul_ps(lv, _mm512_cvtepi32_ps(jv)));
        _mm512_mask_storeu_ps(x + i, k, v);
        mv = _mm512_mask_max_ps(mv, k, mv, v);
        jv = _mm512_add_epi32(jv, _mm512_set1_epi32(16));
    }
    return _mm512_reduce_max_ps(mv);
}

/* ---- The batched float path: packed activations, weights widened once per panel ----
 * PANEL_NOTE: at PLN_CPU_PANEL_MIN tokens or more (prefill, batched decode, the logits of a batch)
 * the dot-product tiles above reach about 60 % of this CPU's FMA peak: a 6 x 4 tile widens 6
 * weight vectors and loads 4 activation vectors for 24 FMAs, and sums each result horizontally at
 * the end (widening the rows once beforehand did not help: docs/ARCHITECTURE.md). Here the activations are packed
 * once per call (pack_x_avx512: 32 tokens side by side per column, the panel), a stretch of
 * weight rows is widened to fp32 once per KC columns (dequantized: q x scale is exact in fp32),
 * and the micro kernel keeps 12 rows x 32 tokens of results in 24 registers: per column, two
 * activation loads and twelve broadcast weights feed 24 FMAs, and no result is ever summed
 * horizontally. Each output is a sum over KC columns in one fp32 accumulator, and those block
 * sums are added in order (the same error bound as the lanes of the tiles above, a different
 * order: cpu.h pln_cpu_set_batch_invariant). The rows a call covers are fixed, so the bits do not
 * depend on the threads, nor on the number of tokens (every token's arithmetic is its own). */
#define PMR 12                      /* rows per micro tile */
#define PKC 128                     /* columns per block: PANEL_ROWS x PKC floats widened (24 KiB) */
#define PTB 256                     /* tokens per pass over the weights (PTB / 32 panels) */
_Static_assert(PLN_CPU_PANEL_ROWS % PMR == 0, "micro tiles fill a panel call");
_Static_assert(PLN_CPU_PANEL_SCRATCH >= PLN_CPU_PANEL_ROWS * PKC + PLN_CPU_PANEL_ROWS * PTB, "scratch holds wf and cb");

/* 16 vectors r[i] (16 floats each) transposed in place: r[c] becomes element c of every r[i]. */
INL void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {   /* u[4i + c], 128-bit lane l: rows 4i..4i+3 of column 4l + c */
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), w0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        __m512 v1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
    }
}

/* Panels p0 <= p < p1 of the tokens (cpu.h): xp + p 32 K holds column k of tokens 32p..32p+31 at
 * [32 k ..], tokens past nt as zeros. */
static TGT void pack_x_avx512(float *xp, const float *x, int64_t ldx, int64_t nt, int64_t K, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
        float *dst = xp + p * 32 * K;
        /* both halves of a column's line in turn, 16 columns at a time */
        for (int64_t k = 0; k < K; k += 16) {
            int64_t kn = K - k < 16 ? K - k : 16;
            __mmask16 m = (__mmask16)(kn == 16 ? 0xffff : (1u << kn) - 1);
            for (int h = 0; h < 2; h++) {
                int64_t t0 = 32 * p + 16 * h;
                __m512 r[16];
                if (t0 + 16 <= nt && kn == 16) {
                    UNROLL16 for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(x + (t0 + j) * ldx + k);
                } else {
                    for (int j = 0; j < 16; j++)
                        r[j] = t0 + j < nt ? _mm512_maskz_loadu_ps(m, x + (t0 + j) * ldx + k) : _mm512_setzero_ps();
                }
                transpose16(r);
                if (kn == 16) {
                    UNROLL16 for (int c = 0; c < 16; c++) _mm512_store_ps(dst + (k + c) * 32 + 16 * h, r[c]);
                } else {
                    for (int c = 0; c < kn; c++) _mm512_store_ps(dst + (k + c) * 32 + 16 * h, r[c]);
                }
            }
        }
    }
}

/* Rows [0, nr) of W from row r0, columns [k0, k0 + kc), widened to fp32 at wf[i * PKC + k - k0];
 * rows nr..nr_pad - 1 zeros. */
static TGT void widen_rows(float *wf, const pln_weight *W, int64_t r0, int64_t nr, int64_t nr_pad, int64_t k0,
                           int64_t kc) {
    int64_t K = W->cols, ng = W->dtype == PLN_DTYPE_F16 ? 1 : K / W->group, group = W->dtype == PLN_DTYPE_F16 ? K : W->group;
    for (int64_t i = 0; i < nr; i++) {
        float *d = wf + i * PKC;
        int64_t r = r0 + i, k = 0;
        if (W->dtype == PLN_DTYPE_F16) {
            const uint16_t *w = (const uint16_t *)W->w + r * K + k0;
            for (; k + 16 <= kc; k += 16) _mm512_store_ps(d + k, load_f16(w + k));
            for (; k < kc; k++) d[k] = pln_f16_to_f32(w[k]);
        } else if (W->dtype == PLN_DTYPE_I8) {
            const int8_t *w = (const int8_t *)W->w + r * K;
            const uint16_t *s = W->scale + r * ng;
            /* whole groups' vectors: one scale each (a vector across two groups: the loop below) */
            int64_t g = k0 / group, gend = (g + 1) * group - k0;   /* group g ends before column gend */
            __m512 sv = _mm512_set1_ps(_cvtsh_ss(s[g]));
            for (; k + 16 <= kc; k += 16) {
                if (k + 16 > gend) {
                    if (k != gend) break;
                    g++;
                    gend += group;
                    sv = _mm512_set1_ps(_cvtsh_ss(s[g]));
                    if (k + 16 > gend) break;
                }
                _mm512_store_ps(d + k, _mm512_mul_ps(load_i8(w + k0 + k), sv));
            }
            for (; k < kc; k++) d[k] = (float)w[k0 + k] * _cvtsh_ss(s[(k0 + k) / group]);
        } else {   /* int4: k0 and kc are multiples of 32; group is 32, 64 or 128 (FORMAT.md) */
            int gshift = group == 32 ? 5 : group == 64 ? 6 : group == 128 ? 7 : -1;
            const uint8_t *w = (const uint8_t *)W->w + r * (K / 2);
            const uint16_t *s = W->scale + r * ng;
            for (; k < kc; k += 32) {
                __m512 v0, v1, sv = _mm512_set1_ps(_cvtsh_ss(s[gshift >= 0 ? (k0 + k) >> gshift : (k0 + k) / group]));
                load_i4x32(w + (k0 + k) / 2, &v0, &v1);
                _mm512_store_ps(d + k, _mm512_mul_ps(v0, sv));
                _mm512_store_ps(d + k + 16, _mm512_mul_ps(v1, sv));
            }
        }
    }
    for (int64_t i = nr; i < nr_pad; i++) memset(wf + i * PKC, 0, (size_t)kc * sizeof(float));
}

/* The cache lines of the weights' next block (rows of rowb bytes, 1 << shift lines of each),
 * requested one per column of the micro kernel up to end: spread over the block's arithmetic,
 * a burst of them at the block's start measured slower than none (the requests queue behind
 * each other and stall the loads that feed the FMAs). */
/* With them, the next chunk of the activations (x, xn lines to go: simd_avx2.c XP_PF_NOTE). */
typedef struct { const char *base; int64_t rowb; int shift; int64_t next, end; const char *x; int64_t xn; } pf_stream;

INL void pf_step(pf_stream *s) {
    if (s->next < s->end) {
        _mm_prefetch(s->base + (s->next >> s->shift) * s->rowb + ((s->next & ((1 << s->shift) - 1)) << 6), _MM_HINT_T0);
        s->next++;
    }
    if (s->xn > 0) {
        _mm_prefetch(s->x, _MM_HINT_T0);
        s->x += 64;
        s->xn--;
    }
}

/* 12 rows (wf, PKC apart) x NV vectors of 16 tokens (xp, 32 floats per column), kc columns. */
INL void panel_mk(const int NV, __m512 acc[PMR][2], const float *wf, const float *xp, int64_t kc, pf_stream *pf) {
    UNROLL16 for (int i = 0; i < PMR; i++) {
        acc[i][0] = _mm512_setzero_ps();
        acc[i][1] = _mm512_setzero_ps();
    }
    _Pragma("GCC unroll 2") for (int64_t k = 0; k < kc; k++) {
        __m512 x0 = _mm512_load_ps(xp + 32 * k), x1 = NV == 2 ? _mm512_load_ps(xp + 32 * k + 16) : x0;
        pf_step(pf);
        UNROLL16 for (int i = 0; i < PMR; i++) {
            __m512 b = _mm512_set1_ps(wf[i * PKC + k]);
            acc[i][0] = _mm512_fmadd_ps(b, x0, acc[i][0]);
            if (NV == 2) acc[i][1] = _mm512_fmadd_ps(b, x1, acc[i][1]);
        }
    }
}

static TGT void gemm_panel_avx512(float *out, int64_t ldo, const float *xp, int64_t nt, const pln_weight *W,
                                  int64_t r0, int64_t nr, const uint16_t *bias, bool gelu, float *scratch) {
    int64_t K = W->cols, nr_pad = (nr + PMR - 1) / PMR * PMR;
    float *wf = scratch, *cb = scratch + PLN_CPU_PANEL_ROWS * PKC;
    int es2 = W->dtype == PLN_DTYPE_F16 ? 4 : W->dtype == PLN_DTYPE_I8 ? 2 : 1;   /* bytes per element x 2 */
    int64_t rowb = K * es2 / 2;
    int shift = W->dtype == PLN_DTYPE_F16 ? 2 : W->dtype == PLN_DTYPE_I8 ? 1 : 0;   /* lines per row of a block */
    /* int4 blocks hold whole 32-column blocks; KC is a multiple of 32 */
    for (int64_t t0 = 0; t0 < nt; t0 += PTB) {
        int64_t tn = nt - t0 < PTB ? nt - t0 : PTB, np = (tn + 31) / 32;
        for (int64_t k0 = 0; k0 < K; k0 += PKC) {
            int64_t kc = K - k0 < PKC ? K - k0 : PKC;
            bool first = k0 == 0, last = k0 + kc == K;
            widen_rows(wf, W, r0, nr, nr_pad, k0, kc);
            /* the block after next of these rows, or past their end a block of the rows after them
             * (PANEL_PF_NOTE) */
            int64_t k2 = k0 + PANEL_PF_BLOCKS * kc;
            pf_stream pf = {.base = (const char *)W->w + (k2 >= K ? (r0 + nr) * rowb + (k2 - K) * es2 / 2 : r0 * rowb + k2 * es2 / 2),
                            .rowb = rowb, .shift = shift, .next = 0};
            int64_t quota = (nr << shift) / (np * (nr_pad / PMR)) + 1;
            for (int64_t p = 0; p < np; p++) {
                const float *xb = xp + (t0 / 32 + p) * 32 * K + k0 * 32;
                int64_t pt = tn - 32 * p < 32 ? tn - 32 * p : 32;   /* tokens in this panel */
                /* simd_avx2.c XP_PF_NOTE: the activations' next chunk, spread over this panel's
                 * micro tiles */
                int64_t pa = p + 1, ka = k0 + pa / np * PKC, kn = K - ka < PKC ? K - ka : PKC;
                const char *xnext = ka < K ? (const char *)(xp + (t0 / 32 + pa % np) * 32 * K + ka * 32) : NULL;
                int64_t xcalls = nr_pad / PMR, xlines = xnext ? (kn * 2 + xcalls - 1) / xcalls : 0;
                for (int64_t m = 0; m < nr_pad; m += PMR) {
                    __m512 acc[PMR][2];
                    int64_t xi = m / PMR * xlines;   /* this call's share of the chunk */
                    pf.x = xnext ? xnext + xi * 64 : NULL;
                    pf.xn = xi < kn * 2 ? (kn * 2 - xi < xlines ? kn * 2 - xi : xlines) : 0;
                    pf.end = pf.next + quota < (nr << shift) ? pf.next + quota : (nr << shift);
                    if (pt > 16) panel_mk(2, acc, wf + m * PKC, xb, kc, &pf);
                    else panel_mk(1, acc, wf + m * PKC, xb, kc, &pf);
                    float *c = cb + (m / PMR * (PTB / 32) + p) * PMR * 32;   /* this tile's block sums */
                    UNROLL16 for (int i = 0; i < PMR; i++) {
                        for (int v = 0; v < 2; v++) {
                            __m512 s = acc[i][v];
                            if (!first) s = _mm512_add_ps(_mm512_load_ps(c + i * 32 + 16 * v), s);
                            _mm512_store_ps(c + i * 32 + 16 * v, s);
                        }
                    }
                    if (last) {
                        int64_t mr = nr - m < PMR ? nr - m : PMR;
                        for (int64_t j = 0; j < pt; j++)
                            for (int64_t i = 0; i < mr; i++) out[(t0 + 32 * p + j) * ldo + m + i] = c[i * 32 + j];
                    }
                }
                if (last && (bias || gelu))
                    for (int64_t j = 0; j < pt; j++) bias_gelu_avx512(out + (t0 + 32 * p + j) * ldo, bias, nr, gelu);
            }
        }
    }
}

const pln_cpu_kernels pln_cpu_kernels_avx512 = {
    .name = "avx512", .gemm_f16 = gemm_f16_avx512, .gemm_i8 = gemm_i8_avx512, .gemm_i4 = gemm_i4_avx512, .gemm_q8 = gemm_q8_avx512, .gemm_q4n = gemm_q4n_avx512, .quant_act = quant_act_avx512,
    .pack_x = pack_x_avx512, .gemm_panel = gemm_panel_avx512, .q8_min = Q8_MIN_AVX512, .gemv = gemv_avx512,
    .dots = dots_avx512, .weighted_sum = weighted_sum_avx512,
    .dots_f16 = dots_f16_avx512, .weighted_sum_f16 = weighted_sum_f16_avx512, .bias_gelu = bias_gelu_avx512,
    .sum_exp = sum_exp_avx512, .exp_sum = exp_sum_avx512, .score_max = score_max_avx512,
    .silu_mul = silu_mul_avx512, .fma_chains = fma_chains_avx512,
};
#endif
