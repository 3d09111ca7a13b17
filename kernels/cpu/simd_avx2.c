/* simd_avx2.c — AVX2 + FMA + F16C micro kernels (chosen at run time; the rest of the build stays
 * baseline x86-64). 8 floats per vector; F16 weights widened with vcvtph2ps, I8 weights with
 * vpmovsxbd + vcvtdq2ps and scaled in registers: no matrix is ever converted. A tile is up to
 * 4 weight rows x 2 tokens of accumulators (8 of the 16 ymm registers), so each weight vector
 * loaded from memory serves 2 tokens and each activation vector 4 rows; from 2 tokens, where K
 * is a multiple of 8, the weights are widened once per step into an L1 buffer that float tiles
 * read (WIDEN_NOTE). Steps of PLN_CPU_PANEL_MIN tokens or more take the batched float path
 * instead (PANEL_NOTE below). */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#ifdef PLN_CPU_X86
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")

INL __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
INL __m256 load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
INL float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* PREFETCH_NOTE: as in simd_avx512.c: a GEMV tile's four rows are contiguous and the next
 * tile follows them, so pf_ahead4 prefetches the whole GEMV as one stream PF_AHEAD bytes ahead of
 * the position the tile's consumed bytes map to (into L1; a prefetch past the end of the matrix
 * never faults). */
#define PF_AHEAD PLN_CPU_PF_AHEAD
#define pf_ahead4 pln_cpu_pf_ahead4

/* NR rows x NT tokens of F16 dot products over columns [k0, k1) of rows of length K (NR, NT
 * compile-time after inlining). add: accumulate into out (a later stretch of columns). */
INL void tile_f16(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                  const uint16_t *w, int64_t K, int64_t k0, int64_t k1, bool add, bool pf) {
    __m256 acc[4][2];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    }
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
        __m256 wv[4];
        if (NT == 1 && NR == 4 && (k & 31) == 0) pf_ahead4(w, 8 * k);   /* see PREFETCH_NOTE */
        else if (pf && NR == 4 && (k & 31) == 0 && PLN_CPU_PF_TILES) {   /* TILE_PF_NOTE */
            UNROLL for (int i = 0; i < 4; i++) _mm_prefetch((const char *)w + PLN_CPU_PF_TILES + 8 * k + 64 * i, _MM_HINT_T0);
        }
        UNROLL for (int i = 0; i < NR; i++) wv[i] = load_f16(w + i * K + k);
        UNROLL for (int j = 0; j < NT; j++) {
            __m256 xv = _mm256_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) {
            float s = hsum(acc[i][j]);
            for (int64_t kk = k; kk < k1; kk++) s += pln_f16_to_f32(w[i * K + kk]) * x[j * ldx + kk];
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* I8 with one scale per group of columns; [k0, k1) covers whole groups. Per-channel weights (one
 * group) multiply the scale once at the end; grouped ones scale each widened weight vector
 * (shared by the NT tokens), except in a GEMV (gemv: the call has one token), whose groups are
 * summed unscaled. A batch's last lone token takes the scaled path, so that its result is the same
 * bits as in any other batch (cpu.h pln_cpu_set_batch_invariant). */
INL void tile_i8(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                 const int8_t *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0,
                 int64_t k1, bool add, bool gemv, bool pf) {
    int64_t ng = K / group;
    __m256 acc[4][2];
    float tail[4][2];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) { acc[i][j] = _mm256_setzero_ps(); tail[i][j] = 0.0f; }
    }
    if (ng == 1) {
        int64_t k = k0;
        for (; k + 8 <= k1; k += 8) {
            __m256 wv[4];
            if ((NT == 1 || pf) && NR == 4 && (k & 63) == 0) pf_ahead4(w, 4 * k);   /* PREFETCH_NOTE, TILE_PF_NOTE */
            UNROLL for (int i = 0; i < NR; i++) wv[i] = load_i8(w + i * K + k);
            UNROLL for (int j = 0; j < NT; j++) {
                __m256 xv = _mm256_loadu_ps(x + j * ldx + k);
                UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
            }
        }
        for (; k < k1; k++) {
            UNROLL for (int i = 0; i < NR; i++) {
                UNROLL for (int j = 0; j < NT; j++) tail[i][j] += (float)w[i * K + k] * x[j * ldx + k];
            }
        }
    } else if (NT == 1 && gemv) {
        /* GEMV (decode): each row's group is summed unscaled in its own register and scaled by
         * one FMA per group: per 8 weights one widen and one FMA, as in the per-channel loop
         * (scaling every widened vector cost a multiply each and halved the rate) */
        for (int64_t g = k0 / group; g < k1 / group; g++) {
            __m256 ga[4];
            UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm256_setzero_ps();
            const int64_t gl = group == 32 ? 32 : group;   /* G32_UNROLL_NOTE */
            int64_t k = g * gl, kend = k + gl;
            UNROLL for (; k + 8 <= kend; k += 8) {
                if (NR == 4 && (k & 63) == 0) {   /* see PREFETCH_NOTE; the scales: 2 bytes per group */
                    pf_ahead4(w, 4 * k);
                    _mm_prefetch((const char *)scale + (PF_AHEAD + 4 * k) * 2 / group, _MM_HINT_T0);
                }
                __m256 xv = _mm256_loadu_ps(x + k);
                UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm256_fmadd_ps(load_i8(w + i * K + k), xv, ga[i]);
            }
            UNROLL for (int i = 0; i < NR; i++) {
                float sf = _cvtsh_ss(scale[i * ng + g]);
                float t = 0.0f;
                for (int64_t kk = k; kk < kend; kk++) t += (float)w[i * K + kk] * x[kk];
                tail[i][0] += t * sf;
                acc[i][0] = _mm256_fmadd_ps(ga[i], _mm256_set1_ps(sf), acc[i][0]);
            }
        }
    } else {
        /* a block of tokens: each widened weight vector is scaled once and serves NT tokens */
        for (int64_t g = k0 / group; g < k1 / group; g++) {
            float sf[4];
            __m256 sv[4];
            UNROLL for (int i = 0; i < NR; i++) {
                sf[i] = _cvtsh_ss(scale[i * ng + g]);
                sv[i] = _mm256_set1_ps(sf[i]);
            }
            const int64_t gl = group == 32 ? 32 : group;   /* G32_UNROLL_NOTE */
            int64_t k = g * gl, kend = k + gl;
            UNROLL for (; k + 8 <= kend; k += 8) {
                __m256 wv[4];
                if (pf && NR == 4 && (k & 63) == 0) pf_ahead4(w, 4 * k);   /* TILE_PF_NOTE */
                UNROLL for (int i = 0; i < NR; i++) wv[i] = _mm256_mul_ps(load_i8(w + i * K + k), sv[i]);
                UNROLL for (int j = 0; j < NT; j++) {
                    __m256 xv = _mm256_loadu_ps(x + j * ldx + k);
                    UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
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
            float s = (hsum(acc[i][j]) + tail[i][j]) * s_end;
            /* not fused into the add below: GCC contracts a * b + c where it sees one, and did so
             * in some of this tile's instantiations and not in others (an ASan build, per-row
             * int8 at 4096 columns), which gave a token other bits in a tile of 1 than of 2 */
            __asm__("" : "+x"(s));
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* One 32-column block of a packed int4 row (16 bytes, docs/FORMAT.md) as q in four 8-float
 * vectors, columns in order: the low nibbles are columns 0..15, the high ones 16..31, so one
 * mask, one shift and a subtract of the +8 bias unpack it with no shuffle. */
INL void load_i4x32(const uint8_t *p, __m256 v[4]) {
    const __m128i m = _mm_set1_epi8(0x0f), bias = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(b, m), bias);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), bias);
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
}

/* TILE_PF_NOTE: a block of tokens reads each 4-row group's weights from memory in its first token
 * tile and from cache in the others, so without help the memory sits idle while those run. The
 * first token tile of a grouped I8 4-row group (the 2 x 4 tile of its first two rows, or the 4 x 2
 * tile) prefetches as the GEMV does (PREFETCH_NOTE: PF_AHEAD bytes ahead of the position its
 * consumed bytes map to, through the next group). Llama-3.2-1B at batch 8 on the Zen 3
 * (`pollen bench <set> --prompt-len 8 --batch 8 --context 32 --steps 16 --kv-dtype f16 --threads 2
 * --mbu off`, 11 alternated pairs, 2026-12-04 01:20-01:30 UTC): int8 g32 faster in 9 of them,
 * by 1.075x at the median (0.92-1.16x); the same prefetch in the fp16 tiles ran slower in each of
 * 3 pairs (24.7-31.9 against 30.4-34.7 tokens/s) and in per-row int8 was mixed (on that machine).
 * On the Zen 5's AVX2 tier the fp16 one runs faster (fp16 [65536, 2048] at 5 / 8 / 16 tokens
 * +8 / +14 / +4-6 %, Llama-3.2-1B fp16 batch 8 58.2-59.1 -> 62.0-62.2 tokens/s, alternated three
 * times, 2026-12-04 22:06 UTC), so the fp16 tiles' prefetch (both tiers) is the calibration's
 * choice: PLN_CPU_PF_TILES, the distance tune.c measures for an fp16 linear of 8 tokens ("fp16_batch";
 * 0: none; PLN_CPU_PF_AHEAD_DEFAULT without it). The per-row I8 tiles' first token tile
 * prefetches as the grouped ones do (on [16384, 2048] at 8 tokens any distance from 8 to 32 KiB
 * measured the same, 1 to 4 KiB slower): on the Zen 5, AVX2 tier,
 * that linear 3.34-3.48 -> 2.79-2.85 ms, Llama-3.2-1B per-row int8 batch 8 54.5-56.5 -> 62.9-65.5
 * tokens/s (alternated three times, 2026-12-04 23:20 UTC); the AVX-512 tiles (simd_avx512.c
 * tile_i8) do the same for per-row and grouped I8. Since WIDEN_NOTE, steps of 2 tokens or more
 * take these tiles only where K is not a multiple of the vector width (or a grouped weight's
 * group does not fit a stretch), so the fp16_batch distance matters only there. */
/* G32_UNROLL_NOTE: a grouped I8 loop over one group's columns takes the group size as the
 * constant 32 where it is 32 (its four 8-column steps unrolled, no loop exit per group): on the
 * Zen 5, [2048, 8192] g32 at 8 tokens in the 2 x 4 tiles 1.97-2.01 -> 1.45-1.46 ms, [16384, 2048]
 * 3.04-3.16 -> 2.78-2.88; Llama-3.2-1B int8 g32 batch 8 63.8-65.5 -> 70.1-70.6 tokens/s
 * (alternated twice, 2026-12-04 23:28 UTC), batch 1 unchanged. The same in simd_avx512.c's
 * 16-column steps measured no change, so it has none. Bits unchanged. */
/* TILE24_NOTE: grouped I8 from 4 tokens: 2 rows x 4 tokens of accumulators (8 registers, as the
 * 4 x 2 tile), so each weight vector, sign-extended, converted and scaled once, serves 4 tokens
 * instead of 2 (per 64 multiply-adds 2 of each of those three instead of 4) and each activation
 * vector 2 rows instead of 4. Each result is the same sum in the same order as tile_i8's (8 lanes
 * over [k0, k1), each widened vector scaled, summed horizontally), so a token's bits do not depend
 * on which tile took it. On Zen 3 (2 threads, Llama-3.2-1B shapes at 8 tokens,
 * `test_kernels_cpu --bench-panel 8`, alternated 5 times) it took 0.8-0.85x the time of the 4 x 2
 * tile; for F16 and per-row I8, which widen more cheaply, it measured slower and is not used.
 * Needs group % 8 == 0. */
INL void tile_i8g_2x4(float *out, int64_t ldo, const float *x, int64_t ldx, const int8_t *w,
                      const uint16_t *scale, int64_t group, int64_t K, int64_t k0, int64_t k1, bool add, bool pf) {
    __m256 a[2][4];
    UNROLL for (int i = 0; i < 2; i++) {
        UNROLL for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    }
    int64_t ng = K / group;
    for (int64_t g = k0 / group; g < k1 / group; g++) {
        __m256 s0 = _mm256_set1_ps(_cvtsh_ss(scale[g])), s1 = _mm256_set1_ps(_cvtsh_ss(scale[ng + g]));
        const int64_t gl = group == 32 ? 32 : group;   /* G32_UNROLL_NOTE */
        UNROLL for (int64_t k = g * gl; k < (g + 1) * gl; k += 8) {
            if (pf && (k & 63) == 0) pf_ahead4(w, 4 * k);   /* this pair and the next: 4 rows (TILE_PF_NOTE) */
            __m256 v0 = _mm256_mul_ps(load_i8(w + k), s0), v1 = _mm256_mul_ps(load_i8(w + K + k), s1);
            UNROLL for (int j = 0; j < 4; j++) {
                __m256 xv = _mm256_loadu_ps(x + j * ldx + k);
                a[0][j] = _mm256_fmadd_ps(v0, xv, a[0][j]);
                a[1][j] = _mm256_fmadd_ps(v1, xv, a[1][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < 2; i++) {
        UNROLL for (int j = 0; j < 4; j++) {
            float sum = hsum(a[i][j]) + 0.0f;   /* as tile_i8's (+ its zero tail): a -0 sum becomes +0 alike */
            out[j * ldo + i] = add ? out[j * ldo + i] + sum : sum;
        }
    }
}

/* Packed int4, [k0, k1) whole groups (multiples of 32 columns). A GEMV (gemv: the call has one
 * token): each row's group is summed unscaled and scaled by one FMA per group; several tokens
 * (and a batch's last lone token, as tile_i8): the unpacked block is scaled once per row and serves
 * them all. */
INL void tile_i4(const int NR, const int NT, float *out, int64_t ldo, const float *x, int64_t ldx,
                 const uint8_t *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0,
                 int64_t k1, bool add, bool gemv) {
    int64_t ng = K / group, rb = K / 2;
    __m256 acc[4][2];
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    }
    for (int64_t g = k0 / group; g < k1 / group; g++) {
        int64_t kend = (g + 1) * group;
        if (NT == 1 && gemv) {
            __m256 ga[4];
            UNROLL for (int i = 0; i < NR; i++) ga[i] = _mm256_setzero_ps();
            for (int64_t k = g * group; k < kend; k += 32) {
                if (NR == 4 && (k & 127) == 0) {   /* see PREFETCH_NOTE: 64 bytes = 128 columns */
                    pf_ahead4(w, 2 * k);
                    _mm_prefetch((const char *)scale + (PF_AHEAD + 2 * k) * 4 / group, _MM_HINT_T0);
                }
                __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
                __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
                UNROLL for (int i = 0; i < NR; i++) {
                    __m256 wv[4];
                    load_i4x32(w + i * rb + k / 2, wv);
                    ga[i] = _mm256_fmadd_ps(wv[0], x0, ga[i]);
                    ga[i] = _mm256_fmadd_ps(wv[1], x1, ga[i]);
                    ga[i] = _mm256_fmadd_ps(wv[2], x2, ga[i]);
                    ga[i] = _mm256_fmadd_ps(wv[3], x3, ga[i]);
                }
            }
            UNROLL for (int i = 0; i < NR; i++)
                acc[i][0] = _mm256_fmadd_ps(ga[i], _mm256_set1_ps(_cvtsh_ss(scale[i * ng + g])), acc[i][0]);
        } else {
            for (int64_t k = g * group; k < kend; k += 32) {
                UNROLL for (int i = 0; i < NR; i++) {
                    __m256 wv[4], sv = _mm256_set1_ps(_cvtsh_ss(scale[i * ng + g]));
                    load_i4x32(w + i * rb + k / 2, wv);
                    UNROLL for (int q = 0; q < 4; q++) wv[q] = _mm256_mul_ps(wv[q], sv);
                    UNROLL for (int j = 0; j < NT; j++) {
                        const float *xj = x + j * ldx + k;
                        acc[i][j] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xj), acc[i][j]);
                        acc[i][j] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xj + 8), acc[i][j]);
                        acc[i][j] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xj + 16), acc[i][j]);
                        acc[i][j] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xj + 24), acc[i][j]);
                    }
                }
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) {
        UNROLL for (int j = 0; j < NT; j++) {
            float s = hsum(acc[i][j]);
            out[j * ldo + i] = add ? out[j * ldo + i] + s : s;
        }
    }
}

/* Columns per pass when a block of tokens shares the weights: a tile's 4 rows of KSTEP columns
 * stay in L1 and the block's activations (PLN_CPU_TCHUNK x KSTEP floats) in L2 while every token
 * tile reuses them. One pass when there are too few tokens to reuse anything. */
#define KSTEP 1024

/* WIDEN_NOTE: F16, per-row I8 and grouped I8 at PLN_CPU_WIDEN_MIN tokens or more take a 4-row
 * block WSUB columns (a stretch) at a time: the first token tile of a stretch widens each weight
 * vector (vcvtph2ps; vpmovsxbd + vcvtdq2ps, scaled where grouped) for its own 1-3 tokens and
 * stores it in an L1 buffer of floats (4 KiB), and float tiles of 4 rows x 3 tokens take the
 * other tokens from there; the accumulators live in memory between stretches, so the KSTEP pass's
 * activations need not stay in L1 (8 tokens of them are 32 KiB). A weight vector is widened once
 * per step, not once per 2 or 4 tokens (TILE24_NOTE), and the first tile (the one that reads the
 * weights from memory, the shortest: tokens % 3, else 3) prefetches the stretch WIDEN_PF ahead in
 * the order it reads it, its 4 rows interleaved (pf_ahead4's one stream ahead of a 4-row block
 * reaches its last rows late). Each widened vector is the very value the tiles compute and each
 * result the same sum in the same order (8 lanes over the KSTEP pass, summed horizontally, per-row
 * I8 scaled after), so the bits do not change. On the Intel Xeon VM of docs/BENCHMARKS.md,
 * PLN_CPU_ISA=avx2, Llama-3.2-1B (`pollen bench <set> --prompt-len 8 --batch B --context 32
 * --steps 16 --kv-dtype f16 --threads 2 --mbu off`, alternated 3-6 times, 2026-12-06 02:20-02:47
 * UTC), tokens/s before -> after: int8 g32 batch 8 39.0 -> 49.4, batch 2 / 3 / 4 / 5 / 7
 * 25.1 / 24.0 / 34.5 / 30.7 / 32.3 -> 26.9 / 31.7 / 38.6 / 42.6 / 49.1; fp16 batch 8 43.7 -> 51.6,
 * batch 3 26.0 -> 27.6; per-row int8 batch 8 43.2 -> 53.5, batch 3 34.5 -> 37.8. Measured
 * slower there (int8 g32, batch 8): the first tile at 3 tokens and the last at 2 (45.1 against
 * 49.4), every vector widened before any tile (41.2 against 43.2 for the first tile at 3), two
 * 4-row blocks sharing a stretch (42.7 against 44.8), each int8 scaled by one FMA after an
 * integer add of 0x4B400000 (39.6 against 43.4; the conversions are not the bound), and
 * prefetching 1, 2 or 8 stretches ahead measured as 4 does. Needs K % 8 == 0 (grouped: also
 * group % 8 == 0 and group <= WSUB); other shapes take the tiles. */
#define WSUB 256
#define WIDEN_T 24   /* tokens whose accumulators one pass keeps (3 KiB) */
#define WIDEN_PF 4   /* stretches ahead that the first token tile prefetches */
enum { WIDEN_F16, WIDEN_I8, WIDEN_I8G };

/* 4 rows x NT tokens of widened weights wf (8 floats of each row in turn per 8 columns, column k0
 * first) over [k0, k1), a multiple of 8 columns, into the accumulators acc (token j's 4 at
 * acc + 4 j). */
INL void tile_f32w(const int NT, __m256 *acc, const float *x, int64_t ldx, const float *wf, int64_t k0, int64_t k1) {
    __m256 a[4][3];
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) a[i][j] = acc[4 * j + i];
    }
    for (int64_t k = k0; k < k1; k += 8) {
        UNROLL for (int j = 0; j < NT; j++) {
            __m256 xv = _mm256_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < 4; i++) a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(wf + (k - k0) * 4 + i * 8), xv, a[i][j]);
        }
    }
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[4 * j + i] = a[i][j];
    }
}

/* The first token tile of a stretch [k0, k1) (whole groups): widens the 4 rows' weights (KIND)
 * into wf and uses each vector at once for its NT tokens; prefetches the stretch at pw (NULL:
 * none; rows rb bytes apart). */
INL void tile_widen(const int KIND, const int NT, __m256 *acc, const float *x, int64_t ldx, float *wf,
                    const void *w, const uint16_t *scale, int64_t group, int64_t K, int64_t k0, int64_t k1,
                    const char *pw) {
    const int64_t es = KIND == WIDEN_F16 ? 2 : 1, rb = es * K;
    const int64_t gl = KIND != WIDEN_I8G ? k1 - k0 : group == 32 ? 32 : group;   /* G32_UNROLL_NOTE */
    const int64_t ng = KIND == WIDEN_I8G ? K / group : 1;
    __m256 a[4][3];
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) a[i][j] = acc[4 * j + i];
    }
    /* grouped: gl is the group, so each pass of the loop below is the next group (no division
     * per group: an idiv there took 5-10 % of a batch-8 step's samples) */
    const uint16_t *sg = KIND == WIDEN_I8G ? scale + k0 / group : NULL;
    for (int64_t g0 = k0; g0 < k1; g0 += gl) {
        __m256 sv[4];
        if (KIND == WIDEN_I8G) {
            UNROLL for (int i = 0; i < 4; i++) sv[i] = _mm256_set1_ps(_cvtsh_ss(sg[i * ng]));
            sg++;
        }
        for (int64_t k = g0; k < g0 + gl; k += 8) {
            /* line q of the stretch ahead, rows interleaved: 4 rows x 64 bytes per 64 / es columns */
            if (pw && ((k - k0) & (16 / es - 1)) == 0) {
                int64_t q = (k - k0) / (16 / es);
                _mm_prefetch(pw + (q & 3) * rb + (q >> 2) * 64, _MM_HINT_T0);
            }
            __m256 xv[3];
            UNROLL for (int j = 0; j < NT; j++) xv[j] = _mm256_loadu_ps(x + j * ldx + k);
            UNROLL for (int i = 0; i < 4; i++) {
                __m256 wv;
                if (KIND == WIDEN_F16) wv = load_f16((const uint16_t *)w + i * K + k);
                else if (KIND == WIDEN_I8) wv = load_i8((const int8_t *)w + i * K + k);
                else wv = _mm256_mul_ps(load_i8((const int8_t *)w + i * K + k), sv[i]);
                _mm256_store_ps(wf + (k - k0) * 4 + i * 8, wv);
                UNROLL for (int j = 0; j < NT; j++) a[i][j] = _mm256_fmadd_ps(wv, xv[j], a[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < 4; i++) {
        UNROLL for (int j = 0; j < NT; j++) acc[4 * j + i] = a[i][j];
    }
}

/* One KSTEP pass [k0, k1) (whole groups) of a 4-row block of KIND for nt tokens (WIDEN_NOTE);
 * add: accumulate into out (a later pass). The sums end as the tiles' do: F16 tile_f16's,
 * per-row I8 tile_i8's (its zero tail, then its scale), grouped I8 tile_i8's and tile_i8g_2x4's. */
INL void gemm_widen(const int KIND, float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt, const void *w,
                    const uint16_t *scale, int64_t group, int64_t K, int64_t k0, int64_t k1, bool add) {
    float wf[4 * WSUB] __attribute__((aligned(32)));
    __m256 acc[4 * WIDEN_T];
    const int64_t es = KIND == WIDEN_F16 ? 2 : 1;
    const int64_t ws = KIND == WIDEN_I8G ? WSUB / group * group : WSUB;
    for (int64_t t0 = 0; t0 < nt; t0 += WIDEN_T) {
        int64_t tn = nt - t0 < WIDEN_T ? nt - t0 : WIDEN_T;
        const float *xt = x + t0 * ldx;
        for (int64_t i = 0; i < 4 * tn; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t s0 = k0; s0 < k1; s0 += ws) {
            int64_t s1 = k1 - s0 < ws ? k1 : s0 + ws, t;
            const char *pw = NULL;
            if (t0 == 0) {   /* the stretch WIDEN_PF ahead: these rows, else the next 4 (prefetches never fault) */
                int64_t c = s0 + WIDEN_PF * ws;
                pw = c < K ? (const char *)w + es * c : c - K < K ? (const char *)w + es * (4 * K + c - K) : NULL;
            }
            if (tn % 3 == 1) { tile_widen(KIND, 1, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); t = 1; }
            else if (tn % 3 == 2) { tile_widen(KIND, 2, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); t = 2; }
            else { tile_widen(KIND, 3, acc, xt, ldx, wf, w, scale, group, K, s0, s1, pw); t = 3; }
            for (; t < tn; t += 3) tile_f32w(3, acc + 4 * t, xt + t * ldx, ldx, wf, s0, s1);
        }
        for (int64_t j = 0; j < tn; j++) {
            UNROLL for (int i = 0; i < 4; i++) {
                float sum = hsum(acc[4 * j + i]);
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

/* 2-4 tokens whose activations fit in 32 KiB take fp16 and per-row int8 rows one at a time, as
 * the GEMV (simd_avx512.c F16_ROWS_NOTE): the 4-row tiles read four streams a row apart.
 * Llama-3.2-1B, PLN_CPU_ISA=avx2, Zen 5, batch 2/3/4: fp16 +26 / +28 / +36 %, per-row int8
 * +46 / +12 / +36 % (docs/ARCHITECTURE.md). */
#define ROWS2_X 8192
#ifndef ROWS2_MAX
#define ROWS2_MAX 4
#endif
static void gemv_rows2(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt, const void *w,
                       const uint16_t *scale, int64_t nr, int64_t K);

static TGT void gemm_f16_avx2(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                                const uint16_t *w, int64_t nr, int64_t K) {
    if (nt >= 2 && nt <= ROWS2_MAX && nt * K <= ROWS2_X) {
        gemv_rows2(out, ldo, x, ldx, nt, w, NULL, nr, K);
        return;
    }
    int64_t ks = nt > 2 ? KSTEP : K, r0 = 0;
    if (nt >= PLN_CPU_WIDEN_MIN && K % 8 == 0)   /* WIDEN_NOTE */
        r0 = rows_widen(WIDEN_F16, out, ldo, x, ldx, nt, w, NULL, K, nr, K, ks);
    for (int64_t r = r0; r < nr; r += 4) {
        const uint16_t *wr = w + r * K;
        float *o = out + r;
        for (int64_t k0 = 0; k0 < K; k0 += ks) {
            int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
            bool add = k0 > 0;
            if (nr - r >= 4) {
                for (; t + 2 <= nt; t += 2) tile_f16(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, t == 0);
                for (; t < nt; t++) tile_f16(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, K, k0, k1, add, false);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 2 <= nt; t += 2) tile_f16(1, 2, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, K, k0, k1, add, false);
                    for (; t < nt; t++) tile_f16(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, K, k0, k1, add, false);
                }
            }
        }
    }
}

static TGT void gemm_i8_avx2(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                               const int8_t *w, const uint16_t *scale, int64_t group, int64_t nr,
                               int64_t K) {
    int64_t ng = K / group;
    if (ng == 1 && nt >= 2 && nt <= ROWS2_MAX && nt * K <= ROWS2_X) {
        gemv_rows2(out, ldo, x, ldx, nt, w, scale, nr, K);
        return;
    }
    /* passes cover whole groups */
    int64_t ks = nt <= 2 ? K : ng == 1 ? KSTEP : group * (KSTEP / group > 0 ? KSTEP / group : 1);
    int64_t r0 = 0;
    if (nt >= PLN_CPU_WIDEN_MIN && K % 8 == 0 && (ng == 1 || (group % 8 == 0 && group <= WSUB)))   /* WIDEN_NOTE */
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
                if (ng > 1 && group % 8 == 0)   /* TILE24_NOTE */
                    for (; t + 4 <= nt; t += 4) {
                        tile_i8g_2x4(o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, t == 0);
                        tile_i8g_2x4(o + t * ldo + 2, ldo, x + t * ldx, ldx, wr + 2 * K, sr + 2 * ng, group, K, k0, k1, add, false);
                    }
                for (; t + 2 <= nt; t += 2) tile_i8(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, t == 0);
                for (; t < nt; t++) tile_i8(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1, false);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 2 <= nt; t += 2) tile_i8(1, 2, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, sr + i * ng, group, K, k0, k1, add, nt == 1, false);
                    for (; t < nt; t++) tile_i8(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * K, sr + i * ng, group, K, k0, k1, add, nt == 1, false);
                }
            }
        }
    }
}

static TGT void gemm_i4_avx2(float *out, int64_t ldo, const float *x, int64_t ldx, int64_t nt,
                             const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr,
                             int64_t K) {
    int64_t ng = K / group, rb = K / 2;
    /* passes cover whole groups */
    int64_t ks = nt <= 2 ? K : group * (KSTEP / group > 0 ? KSTEP / group : 1);
    for (int64_t r = 0; r < nr; r += 4) {
        const uint8_t *wr = w + r * rb;
        const uint16_t *sr = scale + r * ng;
        float *o = out + r;
        for (int64_t k0 = 0; k0 < K; k0 += ks) {
            int64_t k1 = K - k0 < ks ? K : k0 + ks, t = 0;
            bool add = k0 > 0;
            if (nr - r >= 4) {
                for (; t + 2 <= nt; t += 2) tile_i4(4, 2, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1);
                for (; t < nt; t++) tile_i4(4, 1, o + t * ldo, ldo, x + t * ldx, ldx, wr, sr, group, K, k0, k1, add, nt == 1);
            } else {
                for (int64_t i = 0; i < nr - r; i++) {
                    for (t = 0; t + 2 <= nt; t += 2) tile_i4(1, 2, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * rb, sr + i * ng, group, K, k0, k1, add, nt == 1);
                    for (; t < nt; t++) tile_i4(1, 1, o + t * ldo + i, ldo, x + t * ldx, ldx, wr + i * rb, sr + i * ng, group, K, k0, k1, add, nt == 1);
                }
            }
        }
    }
}

/* ---- the one-token GEMV (cpu.h gemv; simd_avx512.c GEMV_NOTE) -----------------------------
 * Rows one at a time, each thread's run of rows one sequential stream, the prefetch PF_AHEAD
 * bytes ahead of the read; four accumulators per row, 32 columns per step (a line of F16, half
 * a line of I8); grouped weights sum each group unscaled (in two or four partial sums) and
 * scale it with one FMA into one of two accumulators. Kept out of line for
 * tests/e2e_cpu_prefetch.sh. */
INL void pf_line(const void *p) { pln_cpu_pf((const char *)p + PF_AHEAD); }
INL __m256 scale_at(const uint16_t *scale, int64_t g) { return _mm256_set1_ps(_cvtsh_ss(scale[g])); }

static TGT __attribute__((noinline)) void gemv_f16_row(float *out, const float *x, const uint16_t *w, int64_t K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        pf_line(w + k);
        a0 = _mm256_fmadd_ps(load_f16(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(load_f16(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(load_f16(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(load_f16(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(load_f16(w + k), _mm256_loadu_ps(x + k), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++) s += pln_f16_to_f32(w[k]) * x[k];
    *out = s;
}

/* gemv_f16_row's loop (gemv_i8_row's per-row one) for 2-4 tokens: each widened vector into every
 * token's AC accumulators (four for two tokens, as the GEMV; two for three or four, which is what
 * 16 ymm registers hold); per-row int8 applies the row's scale at the end (ROWS2_X). */
INL __m256 rows2_ld(const void *w, int64_t k, bool i8) {
    return i8 ? load_i8((const int8_t *)w + k) : load_f16((const uint16_t *)w + k);
}
INL float rows2_at(const void *w, int64_t k, bool i8) {
    return i8 ? (float)((const int8_t *)w)[k] : pln_f16_to_f32(((const uint16_t *)w)[k]);
}
INL void gemv_rows2_row(const int NT, const int AC, const bool I8, float *out, int64_t ldo, const float *x,
                        int64_t ldx, const void *w, float sc, int64_t K) {
    __m256 a[4][4];
    UNROLL for (int j = 0; j < NT; j++) {
        UNROLL for (int c = 0; c < AC; c++) a[j][c] = _mm256_setzero_ps();
    }
    const int64_t step = 8 * AC;
    int64_t k = 0;
    for (; k + step <= K; k += step) {
        if ((k & (I8 ? 63 : 31)) == 0) pf_line((const char *)w + (I8 ? 1 : 2) * k);   /* a line per 64 bytes */
        __m256 wv[4];
        UNROLL for (int c = 0; c < AC; c++) wv[c] = rows2_ld(w, k + 8 * c, I8);
        UNROLL for (int j = 0; j < NT; j++) {
            const float *xj = x + j * ldx + k;
            UNROLL for (int c = 0; c < AC; c++) a[j][c] = _mm256_fmadd_ps(wv[c], _mm256_loadu_ps(xj + 8 * c), a[j][c]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 wv = rows2_ld(w, k, I8);
        UNROLL for (int j = 0; j < NT; j++) a[j][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * ldx + k), a[j][0]);
    }
    UNROLL for (int j = 0; j < NT; j++) {
        __m256 t = AC == 4 ? _mm256_add_ps(_mm256_add_ps(a[j][0], a[j][1]), _mm256_add_ps(a[j][2], a[j][3]))
                           : _mm256_add_ps(a[j][0], a[j][1]);
        float s = hsum(t);
        for (int64_t kk = k; kk < K; kk++) s += rows2_at(w, kk, I8) * x[j * ldx + kk];
        out[j * ldo] = I8 ? s * sc : s;
    }
}

/* nr rows of fp16 (scale NULL) or per-row int8 weights against nt = 2-4 tokens. */
static TGT __attribute__((noinline)) void gemv_rows2(float *out, int64_t ldo, const float *x, int64_t ldx,
                                                    int64_t nt, const void *w, const uint16_t *scale, int64_t nr,
                                                    int64_t K) {
    const bool i8 = scale != NULL;
    for (int64_t r = 0; r < nr; r++) {
        const void *wr = (const char *)w + r * K * (i8 ? 1 : 2);
        float sc = i8 ? _cvtsh_ss(scale[r]) : 1.0f;
        if (i8) {
            if (nt == 2) gemv_rows2_row(2, 4, true, out + r, ldo, x, ldx, wr, sc, K);
            else if (nt == 3) gemv_rows2_row(3, 2, true, out + r, ldo, x, ldx, wr, sc, K);
            else gemv_rows2_row(4, 2, true, out + r, ldo, x, ldx, wr, sc, K);
        } else {
            if (nt == 2) gemv_rows2_row(2, 4, false, out + r, ldo, x, ldx, wr, sc, K);
            else if (nt == 3) gemv_rows2_row(3, 2, false, out + r, ldo, x, ldx, wr, sc, K);
            else gemv_rows2_row(4, 2, false, out + r, ldo, x, ldx, wr, sc, K);
        }
    }
}

/* 32 columns of I8 into four partial sums */
INL void i8x32(const int8_t *w, const float *x, __m256 *p0, __m256 *p1, __m256 *p2, __m256 *p3) {
    *p0 = _mm256_fmadd_ps(load_i8(w), _mm256_loadu_ps(x), *p0);
    *p1 = _mm256_fmadd_ps(load_i8(w + 8), _mm256_loadu_ps(x + 8), *p1);
    *p2 = _mm256_fmadd_ps(load_i8(w + 16), _mm256_loadu_ps(x + 16), *p2);
    *p3 = _mm256_fmadd_ps(load_i8(w + 24), _mm256_loadu_ps(x + 24), *p3);
}
INL __m256 sum4(__m256 p0, __m256 p1, __m256 p2, __m256 p3) {
    return _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
}

static TGT __attribute__((noinline)) void gemv_i8_row(float *out, const float *x, const int8_t *w,
                                                      const uint16_t *scale, int64_t group, int64_t K) {
    int64_t ng = K / group, k = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float s = 0.0f;
    if (ng == 1) {
        for (; k + 32 <= K; k += 32) {
            if ((k & 63) == 0) pf_line(w + k);
            i8x32(w + k, x + k, &a0, &a1, &a2, &a3);
        }
        for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(load_i8(w + k), _mm256_loadu_ps(x + k), a0);
        s = hsum(sum4(a0, a1, a2, a3));
        for (; k < K; k++) s += (float)w[k] * x[k];
        *out = s * _cvtsh_ss(scale[0]);
        return;
    }
    if (group % 32 == 0) {
        int64_t g = 0;
        if (group == 32) {
            /* G32_NOTE: eight groups of 32 at a time, each summed in two products and two FMAs
             * into one vector, the eight vectors reduced to one of eight group sums by
             * vhaddps and one lane swap, scaled by one FMA with the eight scales widened at once:
             * per group 5 float operations and 0.4 for the reduction instead of 7 and a scalar
             * scale widened and broadcast (the per-group overhead kept this GEMV at 69-74 % of the
             * read on the Zen 3, docs/BENCHMARKS.md) */
            for (; g + 8 <= ng; g += 8, k += 256) {
                __m256 P[8];
                UNROLL8 for (int q = 0; q < 8; q++) {
                    const int8_t *wq = w + k + 32 * q;
                    const float *xq = x + k + 32 * q;
                    if ((q & 1) == 0) pf_line(wq);
                    __m256 e0 = _mm256_mul_ps(load_i8(wq), _mm256_loadu_ps(xq));
                    __m256 e1 = _mm256_mul_ps(load_i8(wq + 8), _mm256_loadu_ps(xq + 8));
                    e0 = _mm256_fmadd_ps(load_i8(wq + 16), _mm256_loadu_ps(xq + 16), e0);
                    e1 = _mm256_fmadd_ps(load_i8(wq + 24), _mm256_loadu_ps(xq + 24), e1);
                    P[q] = _mm256_add_ps(e0, e1);
                }
                __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(P[0], P[1]), _mm256_hadd_ps(P[2], P[3]));
                __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(P[4], P[5]), _mm256_hadd_ps(P[6], P[7]));
                __m256 S = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
                __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scale + g)));
                if (g & 8) a1 = _mm256_fmadd_ps(S, sc, a1);
                else a0 = _mm256_fmadd_ps(S, sc, a0);
            }
        }
        for (; g < ng; g++) {
            __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
            for (int64_t kend = k + group; k < kend; k += 32) {
                if ((k & 63) == 0) pf_line(w + k);
                i8x32(w + k, x + k, &p0, &p1, &p2, &p3);
            }
            if (g & 1) a1 = _mm256_fmadd_ps(sum4(p0, p1, p2, p3), scale_at(scale, g), a1);
            else a0 = _mm256_fmadd_ps(sum4(p0, p1, p2, p3), scale_at(scale, g), a0);
        }
    } else {   /* other group sizes: 8 columns at a time, a scalar tail per group */
        for (int64_t g = 0; g < ng; g++) {
            __m256 p0 = _mm256_setzero_ps();
            int64_t kend = k + group;
            for (; k + 8 <= kend; k += 8) {
                if ((k & 63) == 0) pf_line(w + k);
                p0 = _mm256_fmadd_ps(load_i8(w + k), _mm256_loadu_ps(x + k), p0);
            }
            float t = 0.0f;
            for (; k < kend; k++) t += (float)w[k] * x[k];
            s += t * _cvtsh_ss(scale[g]);
            a0 = _mm256_fmadd_ps(p0, scale_at(scale, g), a0);
        }
    }
    *out = hsum(_mm256_add_ps(a0, a1)) + s;
}

static TGT __attribute__((noinline)) void gemv_i4_row(float *out, const float *x, const uint8_t *w,
                                                      const uint16_t *scale, int64_t group, int64_t K) {
    int64_t ng = K / group, k = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int64_t g = 0; g < ng; g++) {
        __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
        for (int64_t kend = k + group; k < kend; k += 32) {
            __m256 v[4];
            if ((k & 127) == 0) pf_line(w + k / 2);
            load_i4x32(w + k / 2, v);
            p0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + k), p0);
            p1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + k + 8), p1);
            p2 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + k + 16), p2);
            p3 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + k + 24), p3);
        }
        if (g & 1) a1 = _mm256_fmadd_ps(sum4(p0, p1, p2, p3), scale_at(scale, g), a1);
        else a0 = _mm256_fmadd_ps(sum4(p0, p1, p2, p3), scale_at(scale, g), a0);
    }
    *out = hsum(_mm256_add_ps(a0, a1));
}

static TGT void gemv_avx2(float *out, const float *x, const pln_weight *W, int64_t r0, int64_t nr) {
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
 * The layout and arithmetic of simd_avx512.c's version, 8 rows per 256-bit vector: each 64-byte
 * group of the repacked rows is two vectors (rows 0-7, rows 8-15). With AVX-VNNI one vpdpbusd
 * per 8 rows x 4 columns x token (unsigned weights q + off, the block's accumulator started at
 * -off * sum xq). Without it vpmaddubsw + vpmaddwd: int4's unsigned nibbles (0..15) times int8
 * pairs cannot saturate int16, int8's q + 128 could, so int8 weights use the sign trick instead
 * (|q| unsigned times x with q's sign, no offset). A tile is 8 rows x up to 4 tokens. One int4
 * token takes the GEMV below instead (no repack).
 * I4_SUM16_NOTE: int4 without VNNI sums a block's 8 vpmaddubsw products in int16 and widens once
 * (one vpmaddwd per block and token instead of 8): a product pair is at most 2 * 15 * 127 = 3810,
 * eight of them 30480 < 32767, so nothing saturates and the integers, hence the results, are the
 * ones the per-group widening gave. The sign trick's int8 pairs reach 2 * 128 * 127 and cannot be
 * summed so.
 * SUM16_CHAIN_NOTE: integer additions are associative, so GCC (12) rebuilt each token's chain of
 * products over a block's 8 groups into a tree: every product of the block live at once, 32 of
 * them for 4 tokens, in 16 ymm registers, and the tile spilled to the stack in its inner loop
 * (the object's stack references in gemm_q8_avx2_base: 626, 445 with the chains kept). An empty
 * asm on each accumulator after each addition keeps the chain in order. Llama-3.2-1B int4 g32 at
 * batch 8 on the Zen 3 (no VNNI; `pollen bench <set> --prompt-len 8 --batch 8 --context 32
 * --steps 16 --kv-dtype f16 --threads 2 --mbu off`, alternated 3 times, 2026-12-04 01:00 UTC):
 * 26.8-30.6 -> 37.3-40.0 tokens/s. The VNNI form accumulates in its own instruction and had no
 * such spills.
 * Q8_KBLOCKS_NOTE: the blocks are walked in stretches of Q8_KBLOCKS (512 columns), each stretch
 * over every token tile and, inside a token tile, every 8-row half, the partial sums added into
 * out. Token-interleaved activations put one token tile's 4 bytes of a 4-column group on a line
 * with the next 3 tiles', 4 nt bytes from the next group's: walking a whole row per tile, as this
 * once did, touched K / 4 lines per tile (128 KiB at K = 8192) and found them gone from L1 by the
 * next tile. A stretch's lines (8 KiB for 16 tokens) and its 32 rows of repacked weights (16 KiB)
 * stay in L1 while the tiles reuse them. Llama-3.2-1B int4 g128, 512-token prefill, 2 threads on
 * the Zen 3 (no VNNI): 43-48 tokens/s before both changes, 55-65 after (docs/BENCHMARKS.md). */
#define Q8UNROLL _Pragma("GCC unroll 8")
#define Q8_KBLOCKS 16

static inline int32_t q8_ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One 32-column block of int8 row r as 32 unsigned bytes q + 128, columns in order. */
INL __m256i q8_row_block(const void *w, int64_t r, int64_t b, int64_t K) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const int8_t *)w + r * K + 32 * b)),
                            _mm256_set1_epi8((char)0x80));
}

/* REPACK_I4_NOTE: int4 transposes the packed bytes first and unpacks the nibbles after: a
 * block's 16 stored bytes of row r are 4-byte words whose low nibbles are group g's columns and
 * whose high nibbles are group g + 4's, so rows r (low lane) and r + 4 (high lane) loaded into one
 * vector, four such vectors transposed in 4-byte words (8 unpacks) give word g of 8 rows, and one
 * mask (group g) or shift and mask (group g + 4) makes each a whole 32-byte store of the output.
 * Unpacking each row first, as int8's loop below does with its bytes, took 2.7x the time (one
 * thread, in cache), and at 8 tokens the repack had been a third of an int4 decode step's linear
 * time (Llama-3.2-1B int4 g32, batch 8, Zen 3: 26 % of the step against 52 % for the dots). */
INL void q8_repack_i4(uint8_t *wp, const uint8_t *w, int64_t nr, int64_t K, int64_t b0, int64_t b1) {
    static const uint8_t zero[16];
    const __m256i m = _mm256_set1_epi8(0x0f);
    int64_t rb = K / 2;
    for (int h = 0; h < 2; h++) {
        const uint8_t *r[8];
        int64_t step[8];   /* a missing row reads the zeros in place */
        for (int i = 0; i < 8; i++) {
            bool have = 8 * h + i < nr;
            r[i] = have ? w + (8 * h + i) * rb : zero;
            step[i] = have ? 16 : 0;
        }
        uint8_t *o = wp + 512 * b0 + 32 * h;
        for (int64_t b = b0; b < b1; b++, o += 512) {
            __m256i v[4];
            for (int i = 0; i < 4; i++)
                v[i] = _mm256_loadu2_m128i((const __m128i *)(r[i + 4] + b * step[i + 4]), (const __m128i *)(r[i] + b * step[i]));
            __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                            _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
            for (int g = 0; g < 4; g++) {
                _mm256_storeu_si256((__m256i *)(o + 64 * g), _mm256_and_si256(u[g], m));
                _mm256_storeu_si256((__m256i *)(o + 64 * (g + 4)), _mm256_and_si256(_mm256_srli_epi16(u[g], 4), m));
            }
        }
    }
}

/* Blocks [b0, b1) of pln_cpu_q8_repack's output. */
INL void q8_repack_blocks(uint8_t *wp, const void *w, bool i4, int64_t nr, int64_t K, int64_t b0, int64_t b1) {
    if (i4) {   /* REPACK_I4_NOTE */
        q8_repack_i4(wp, w, nr, K, b0, b1);
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        uint8_t *o = wp + 512 * b;
        for (int64_t q = 0; q < 4; q++) {
            /* four rows' blocks, transposed in 4-byte words: u_g holds group g (low lane) and
             * g + 4 (high lane) of the four rows */
            __m256i rw[4];
            for (int i = 0; i < 4; i++)
                rw[i] = 4 * q + i < nr ? q8_row_block(w, 4 * q + i, b, K) : _mm256_setzero_si256();
            __m256i t0 = _mm256_unpacklo_epi32(rw[0], rw[1]), t1 = _mm256_unpackhi_epi32(rw[0], rw[1]);
            __m256i t2 = _mm256_unpacklo_epi32(rw[2], rw[3]), t3 = _mm256_unpackhi_epi32(rw[2], rw[3]);
            __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                            _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
            for (int g = 0; g < 4; g++) {
                _mm_storeu_si128((__m128i *)(o + 64 * g + 16 * q), _mm256_castsi256_si128(u[g]));
                _mm_storeu_si128((__m128i *)(o + 64 * (g + 4) + 16 * q), _mm256_extracti128_si256(u[g], 1));
            }
        }
    }
}

TGT void pln_cpu_q8_repack(uint8_t *wp, const void *w, bool i4, int64_t nr, int64_t K) {
    q8_repack_blocks(wp, w, i4, nr, K, 0, K / 32);
}

INL __m256i q8_dot_base(__m256i acc, __m256i wu, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wu, x), _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni"))) __m256i q8_dot_vnni(__m256i acc, __m256i wu, __m256i x) {
    return _mm256_dpbusd_avx_epi32(acc, wu, x);
}

/* NT tokens x the 8 repacked rows 8 h .. 8 h + 7 (h < 4; wp: their set of 16); n: the rows that
 * exist. wsf: row scales per group [ng][32] (grouped) or NULL with wrow [32] (per row, at the end). sgn: int8
 * weights by the sign trick (no offset). */
#define DEF_GEMM_Q8(NAME, ATTR, DOTV, VNNI)                                                                     \
    static inline __attribute__((always_inline)) ATTR void NAME##_tile(                                         \
        const int NT, const bool sgn, const bool s16, float *out, int64_t ldo, const int8_t *xq, const float *xs, \
        const int32_t *xsum, int64_t ldq, int32_t off, const uint8_t *wp, int h, const float *wsf,              \
        const float *wrow, int64_t group, int64_t K, int n, int64_t b0, int64_t b1, bool add) {                 \
        int64_t bpg = group / 32, gi = b0 / bpg, gb = b0 % bpg;                                                  \
        __m256 fa[4];                                                                                            \
        Q8UNROLL for (int j = 0; j < NT; j++) fa[j] = _mm256_setzero_ps();                                       \
        for (int64_t b = b0; b < b1; b++) {                                                                      \
            __m256i ia[4];                                                                                       \
            const uint8_t *wb = wp + 512 * b + 32 * (h & 1);                                                     \
            const int8_t *xg = xq + 32 * b * ldq;                                                                \
            if (s16) {   /* int4 without VNNI: the block's 8 groups summed in int16 (I4_SUM16_NOTE); the     \
                          * offset term joins after the loop, which then holds 4 fewer registers */           \
                __m256i p16[4], wv = _mm256_load_si256((const __m256i *)wb);                                    \
                Q8UNROLL for (int j = 0; j < NT; j++)                                                            \
                    p16[j] = _mm256_maddubs_epi16(wv, _mm256_set1_epi32(q8_ld32(xg + 4 * j)));                   \
                Q8UNROLL for (int g = 1; g < 8; g++) {                                                           \
                    xg += 4 * ldq;                                                                               \
                    __asm__("" : "+r"(xg));                                                                      \
                    wv = _mm256_load_si256((const __m256i *)(wb + 64 * g));                                      \
                    Q8UNROLL for (int j = 0; j < NT; j++) {                                                      \
                        p16[j] = _mm256_add_epi16(p16[j], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(q8_ld32(xg + 4 * j)))); \
                        __asm__("" : "+x"(p16[j]));   /* SUM16_CHAIN_NOTE */                                     \
                    }                                                                                            \
                }                                                                                                \
                Q8UNROLL for (int j = 0; j < NT; j++)                                                            \
                    ia[j] = _mm256_add_epi32(_mm256_set1_epi32(-off * xsum[b * ldq + j]),                        \
                                             _mm256_madd_epi16(p16[j], _mm256_set1_epi16(1)));                   \
            } else {                                                                                             \
            Q8UNROLL for (int j = 0; j < NT; j++) ia[j] = _mm256_set1_epi32(sgn ? 0 : -off * xsum[b * ldq + j]); \
            Q8UNROLL for (int g = 0; g < 8; g++, xg += 4 * ldq) {                                                \
                __asm__("" : "+r"(xg)); /* one walking pointer (simd_avx512.c) */                               \
                __m256i wv = _mm256_load_si256((const __m256i *)(wb + 64 * g));                                  \
                if (sgn) {                                                                                       \
                    __m256i ws8 = _mm256_xor_si256(wv, _mm256_set1_epi8((char)0x80)), aw = _mm256_abs_epi8(ws8); \
                    Q8UNROLL for (int j = 0; j < NT; j++) {                                                      \
                        ia[j] = q8_dot_base(ia[j], aw, _mm256_sign_epi8(_mm256_set1_epi32(q8_ld32(xg + 4 * j)), ws8)); \
                        __asm__("" : "+x"(ia[j]));   /* SUM16_CHAIN_NOTE */                                      \
                    }                                                                                            \
                } else {                                                                                         \
                    Q8UNROLL for (int j = 0; j < NT; j++) {                                                      \
                        ia[j] = DOTV(ia[j], wv, _mm256_set1_epi32(q8_ld32(xg + 4 * j)));                         \
                        __asm__("" : "+x"(ia[j]));   /* SUM16_CHAIN_NOTE */                                      \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            }                                                                                                    \
            if (wsf) {                                                                                           \
                __m256 sc = _mm256_loadu_ps(wsf + gi * 32 + 8 * h);                                              \
                Q8UNROLL for (int j = 0; j < NT; j++)                                                            \
                    fa[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[j]), _mm256_mul_ps(sc, _mm256_set1_ps(xs[b * ldq + j])), fa[j]); \
            } else {                                                                                             \
                Q8UNROLL for (int j = 0; j < NT; j++)                                                            \
                    fa[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[j]), _mm256_set1_ps(xs[b * ldq + j]), fa[j]);   \
            }                                                                                                    \
            if (++gb == bpg) { gb = 0; gi++; }                                                                   \
        }                                                                                                        \
        __m256 wr = wsf ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(wrow + 8 * h);                                  \
        Q8UNROLL for (int j = 0; j < NT; j++) {                                                                  \
            __m256 r = _mm256_mul_ps(fa[j], wr);                                                                 \
            /* the product rounded on its own, as it was when it went through memory: GCC would    \
             * contract it with the addition below into an FMA in some tiles and not others (the     \
             * sanitized build's batch-invariance test saw per-row int8 tokens differ) */           \
            __asm__("" : "+x"(r));                                                                               \
            if (n == 8) {   /* a whole 8-row half: the stretch's sums added as one vector */                     \
                if (add) r = _mm256_add_ps(_mm256_loadu_ps(out + j * ldo), r);                                   \
                _mm256_storeu_ps(out + j * ldo, r);                                                              \
            } else {                                                                                             \
                float v[8];                                                                                      \
                _mm256_storeu_ps(v, r);                                                                          \
                if (add) for (int i = 0; i < n; i++) out[j * ldo + i] += v[i];                                   \
                else memcpy(out + j * ldo, v, (size_t)n * sizeof(float));                                       \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    /* a token tile of tn = 4, 2 or 1 tokens over blocks [b0, b1), added into out past the first stretch */    \
    static inline __attribute__((always_inline)) ATTR void NAME##_tiles(                                        \
        int tn, const bool sgn, const bool s16, float *out, int64_t ldo, const int8_t *xq, const float *xs,      \
        const int32_t *xsum, int64_t ldq, int32_t off, const uint8_t *wp, int h, const float *wsf,              \
        const float *wrow, int64_t group, int64_t K, int n, int64_t b0, int64_t b1) {                            \
        if (tn == 4) NAME##_tile(4, sgn, s16, out, ldo, xq, xs, xsum, ldq, off, wp, h, wsf, wrow, group, K, n, b0, b1, b0 > 0); \
        else if (tn == 2) NAME##_tile(2, sgn, s16, out, ldo, xq, xs, xsum, ldq, off, wp, h, wsf, wrow, group, K, n, b0, b1, b0 > 0); \
        else NAME##_tile(1, sgn, s16, out, ldo, xq, xs, xsum, ldq, off, wp, h, wsf, wrow, group, K, n, b0, b1, b0 > 0); \
    }                                                                                                            \
    static ATTR void NAME(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,      \
                          int64_t nt, int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group, \
                          int64_t nr, int64_t K) {                                                               \
        int64_t nb = K / 32, ng = K / group, ns = nr > 16 ? 2 : 1, sstride = 512 * nb;                           \
        uint8_t *raw = pln_xmalloc((size_t)(ns * sstride) + 64);                                                 \
        uint8_t *wp = raw + (64 - (uintptr_t)raw % 64) % 64;                                                     \
        float *wsf = ng > 1 ? pln_xmalloc((size_t)ng * 32 * sizeof(float)) : NULL;                              \
        float wrow[32];                                                                                          \
        for (int64_t i = 0; i < 32; i++) {                                                                       \
            if (ng == 1) wrow[i] = i < nr ? _cvtsh_ss(scale[i]) : 0.0f;                                          \
            else for (int64_t g = 0; g < ng; g++) wsf[g * 32 + i] = i < nr ? _cvtsh_ss(scale[i * ng + g]) : 0.0f; \
        }                                                                                                        \
        int32_t off = i4 ? 8 : 128;                                                                              \
        const int64_t kq = Q8_KBLOCKS;   /* Q8_KBLOCKS_NOTE */                                                   \
        /* 1: int8 by the sign trick; 2: int4 summed in int16 (I4_SUM16_NOTE); 0: VNNI */                       \
        int mode = !VNNI && !i4 ? 1 : !VNNI ? 2 : 0;                                                             \
        int64_t rowb = i4 ? K / 2 : K;                                                                           \
        for (int64_t b0 = 0; b0 < nb; b0 += kq) {                                                                \
            int64_t b1 = nb - b0 < kq ? nb : b0 + kq;                                                            \
            /* each stretch repacked just before its tiles, which then find it in L1 (REPACK_I4_NOTE) */          \
            for (int64_t s = 0; s < ns; s++)                                                                     \
                q8_repack_blocks(wp + s * sstride, (const uint8_t *)w + 16 * s * rowb, i4,                       \
                                 nr - 16 * s < 16 ? nr - 16 * s : 16, K, b0, b1);                                \
            for (int64_t t = 0; t < nt;) {                                                                       \
                int tn = nt - t >= 4 ? 4 : nt - t >= 2 ? 2 : 1;                                                  \
                for (int h = 0; h < 4 && 8 * h < nr; h++) {                                                      \
                    int n = nr - 8 * h < 8 ? (int)(nr - 8 * h) : 8;                                              \
                    const uint8_t *wph = wp + (h / 2) * sstride;                                                 \
                    float *o = out + 8 * h + t * ldo;                                                            \
                    const int8_t *xt = xq + 4 * t;                                                               \
                    if (mode == 1) NAME##_tiles(tn, true, false, o, ldo, xt, xs + t, xsum + t, ldq, off, wph, h, wsf, wrow, group, K, n, b0, b1); \
                    else if (mode == 2) NAME##_tiles(tn, false, true, o, ldo, xt, xs + t, xsum + t, ldq, off, wph, h, wsf, wrow, group, K, n, b0, b1); \
                    else NAME##_tiles(tn, false, false, o, ldo, xt, xs + t, xsum + t, ldq, off, wph, h, wsf, wrow, group, K, n, b0, b1); \
                }                                                                                                \
                t += tn;                                                                                         \
            }                                                                                                    \
        }                                                                                                        \
        free(raw);                                                                                               \
        free(wsf);                                                                                               \
    }
DEF_GEMM_Q8(gemm_q8_avx2_base, TGT, q8_dot_base, false)
DEF_GEMM_Q8(gemm_q8_avx2_vnni, __attribute__((target("avx2,fma,f16c,avxvnni"))), q8_dot_vnni, true)

/* Two blocks' worth of unsigned weights lo, hi against activations xlo, xhi, added to c. The
 * vpmaddubsw form sums the two products in int16 before widening (see below: no saturation). */
INL __m256i q8_dot2_base(__m256i c, __m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    return _mm256_add_epi32(c, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni"))) __m256i q8_dot2_vnni(
    __m256i c, __m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(c, lo, xlo), hi, xhi);
}

/* The activations of one token's pair of blocks b, b + 1 (plain rows) as the int4 GEMV's tile
 * below uses them: x[0] the low halves (columns 0-15 of block b in the low 128-bit lane, of b + 1
 * in the high one), x[1] the high halves (columns 16-31), x[2] the blocks' -8 sum xq corrections
 * in lanes 0 and 4, x[3] their scales in lanes 0-3 and 4-7 (a float vector's bits). */
INL void q4_pair_x(__m256i x[4], const int8_t *xq, const float *xs, const int32_t *xsum, int64_t b) {
    __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32 * b));
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32 * b + 32));
    x[0] = _mm256_permute2x128_si256(x0, x1, 0x20);
    x[1] = _mm256_permute2x128_si256(x0, x1, 0x31);
    x[2] = _mm256_setr_epi32(-8 * xsum[b], 0, 0, 0, -8 * xsum[b + 1], 0, 0, 0);
    x[3] = _mm256_castps_si256(_mm256_setr_m128(_mm_set1_ps(xs[b]), _mm_set1_ps(xs[b + 1])));
}

/* One int4 token (decode GEMV), as simd_avx512.c's q4_tile, 256 bits wide: no repack and
 * nothing per call, the rows read as stored. One 32-byte load of a row's pair of blocks, masked
 * and shifted, gives the low nibbles of both (columns 0-15 of the first block in the low 128-bit
 * lane, of the second in the high one) and the high nibbles (columns 16-31); the pair's
 * activations are laid out once per tile in that order (two lane permutes of the plain row) and
 * serve its 4 rows. Per row and pair: two vpmaddubsw summed in int16 (a product pair u x is at
 * most 15 * 127 * 2 = 3810, two of them 7620: no saturation) and one vpmaddwd by ones, or two
 * vpdpbusd with AVX-VNNI; each block's offset correction -8 sum xq in lane 0 / 4; one convert
 * and one FMA by the blocks' scales in lanes 0-3 / 4-7 (times the row's group scales when
 * grouped; per-row weights multiply their scale once at the end). A lone tail block (odd K / 32)
 * unpacks to one vector with its columns in order, the plain activation row's order. */
#define DEF_Q8_GEMV(NAME, ATTR, DOT1, DOT2)                                                                      \
    /* NR rows (compile-time after inlining) from w / scale, results to out[0 .. NR) */                          \
    static inline __attribute__((always_inline)) ATTR void NAME##_tile(                                          \
        const int NR, const int MODE, float *out, const int8_t *xq, const float *xs, const int32_t *xsum,        \
        const uint8_t *w, const uint16_t *scale, int64_t group, int64_t K) {                                     \
        int64_t nb = K / 32, ng = K / group, rb = K / 2, b = 0;                                                  \
        int64_t bpg = group / 32, g0 = 0, gb = 0;   /* block b is the gb-th of group g0 (no divides) */          \
        const char *spf = (const char *)scale + PF_AHEAD * 4 / group;   /* the scales' prefetch stream */        \
        const __m256i nib = _mm256_set1_epi8(0x0f);                                                              \
        /* two halves h0 h1 of a 4-byte word to h0 x4, h1 x4: one per block of the pair */                       \
        const __m128i spread = _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);                    \
        __m256 f[4];                                                                                             \
        UNROLL for (int i = 0; i < NR; i++) f[i] = _mm256_setzero_ps();                                          \
        for (; b + 2 <= nb; b += 2) {                                                                            \
            __m256i xp[4];                                                                                       \
            q4_pair_x(xp, xq, xs, xsum, b);                                                                      \
            __m256i xlo = xp[0], xhi = xp[1], c = xp[2];                                                         \
            __m256 s = _mm256_castsi256_ps(xp[3]);                                                               \
            int64_t g1 = gb + 1 == bpg ? g0 + 1 : g0;                                                            \
            if (NR == 4 && (b & 3) == 0) {   /* see PREFETCH_NOTE; the scales: 2 bytes per group */              \
                pf_ahead4(w, 64 * b);                                                                            \
                if (ng > 1) _mm_prefetch(spf + 8 * g0, _MM_HINT_T0);                                             \
            }                                                                                                    \
            UNROLL for (int i = 0; i < NR; i++) {                                                                \
                __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(w + i * rb + 16 * b));            \
                __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);      \
                __m256 d = _mm256_cvtepi32_ps(DOT2(c, lo, xlo, hi, xhi));                                        \
                if (MODE == 0 || (MODE == 3 && ng == 1)) {                                                       \
                    f[i] = _mm256_fmadd_ps(d, s, f[i]);                                                          \
                } else if (MODE == 1 || (MODE == 3 && g0 == g1)) {                                               \
                    f[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(s, _mm256_set1_ps(_cvtsh_ss(scale[i * ng + g0]))), f[i]); \
                } else {   /* the pair straddles two groups (g1 = g0 + 1): both scales side by side */           \
                    int32_t h2;                                                                                  \
                    memcpy(&h2, scale + i * ng + g0, 4);                                                         \
                    __m256 sc = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_cvtsi32_si128(h2), spread));                \
                    f[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(s, sc), f[i]);                                       \
                }                                                                                                \
            }                                                                                                    \
            for (gb += 2; gb >= bpg; gb -= bpg) g0++;                                                            \
        }                                                                                                        \
        if (b < nb) {                                                                                            \
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32 * b));                       \
            __m256i c = _mm256_setr_epi32(-8 * xsum[b], 0, 0, 0, 0, 0, 0, 0);                                    \
            __m256 s = _mm256_set1_ps(xs[b]);                                                                    \
            UNROLL for (int i = 0; i < NR; i++) {                                                                \
                __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(w + i * rb + 16 * b));               \
                __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(nib)),   \
                                             _mm_and_si128(v, _mm256_castsi256_si128(nib)));                     \
                __m256i d = DOT1(c, u, xv);                                                                      \
                __m256 sg = ng == 1 ? s : _mm256_mul_ps(s, _mm256_set1_ps(_cvtsh_ss(scale[i * ng + g0])));       \
                f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sg, f[i]);                                         \
            }                                                                                                    \
        }                                                                                                        \
        UNROLL for (int i = 0; i < NR; i++) out[i] = hsum(f[i]) * (ng == 1 ? _cvtsh_ss(scale[i]) : 1.0f);        \
    }                                                                                                            \
    /* One token times nr packed int4 rows (xq, xs, xsum: plain rows at nt = 1). */                              \
    static ATTR void NAME(float *out, const int8_t *xq, const float *xs, const int32_t *xsum, const uint8_t *w,  \
                          const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {                         \
        int64_t r = 0, ng = K / group, rb = K / 2;                                                               \
        /* Q4_GEMV_MODE_NOTE: the scales' case fixed per call, so the row loop has no branch on it (it  \
         * had two per row and pair of blocks, and spilled): 0 one group per row, 2 groups of 32 (each \
         * pair of blocks two groups), 1 an even number of blocks per group (a pair never straddles    \
         * two), 3 anything else. build/bench/gemv-bw --mib 256 --passes 5 --pf 8192, alternated 3      \
         * times on the Zen 3 (2026-12-04 01:35 UTC): int4 g32 on 2 threads 14.3-16.8 -> 14.6-18.8 GB/s, \
         * within what this VM's memory moves between runs (the read: 20.4-26.8). */                     \
        int64_t bpg = group / 32;                                                                        \
        int mode = ng == 1 ? 0 : bpg == 1 ? 2 : bpg % 2 == 0 ? 1 : 3;                                    \
        for (; r + 4 <= nr; r += 4) {                                                                    \
            const uint8_t *wr = w + r * rb;                                                              \
            const uint16_t *sr = scale + r * ng;                                                         \
            if (mode == 0) NAME##_tile(4, 0, out + r, xq, xs, xsum, wr, sr, group, K);                   \
            else if (mode == 1) NAME##_tile(4, 1, out + r, xq, xs, xsum, wr, sr, group, K);              \
            else if (mode == 2) NAME##_tile(4, 2, out + r, xq, xs, xsum, wr, sr, group, K);              \
            else NAME##_tile(4, 3, out + r, xq, xs, xsum, wr, sr, group, K);                             \
        }                                                                                                \
        for (; r < nr; r++) NAME##_tile(1, 3, out + r, xq, xs, xsum, w + r * rb, scale + r * ng, group, K); \
    }
DEF_Q8_GEMV(q8_gemv_avx2_base, TGT, q8_dot_base, q8_dot2_base)
DEF_Q8_GEMV(q8_gemv_avx2_vnni, __attribute__((target("avx2,fma,f16c,avxvnni"))), q8_dot_vnni, q8_dot2_vnni)

/* Q4B2_NOTE: 2 to PLN_CPU_Q4N_MAX int4 tokens (cpu.h gemm_q4n; every step in the batch-invariant
 * mode), as simd_avx512.c's Q4B_NOTE with 256-bit vectors: the GEMV's arithmetic above in its
 * order for each row and token (a pair of blocks at a time, one convert and one FMA by the
 * blocks' activation scales times the row's group scales), so every token's bits are those it
 * gets alone. Without it these tokens took gemm_q8's repack tiles: the rows repacked once per
 * call and each 4-byte activation group broadcast for one vpdpbusd of 8 rows (Llama-3.2-1B int4
 * g32 at batch 8 on the AVX2 tier: the int4 linears 74 % of a step, about 5x the time their
 * weights take to read). Here each token's activations are laid out once per segment of pairs
 * (q4_pair_x: 128 bytes a pair, read from L1 by every row), a row's pair is unpacked once for
 * up to Q4B2_NT tokens held in registers (3 registers for the row, Q4B2_NT accumulators, 2
 * temporaries: 13 of the 16), and a chunk of Q4B2_ROWS rows keeps its accumulators in L1 across
 * the segments, so the weights stream from memory once. Segments hold 128 token-pairs (16 KiB).
 * The shapes: whole pairs (K % 64 == 0) and groups of 32 or of a multiple of 64; any other shape
 * runs the GEMV token by token, which is the same arithmetic. Faster than the repack tiles with
 * and without VNNI at 2-16 tokens ([131072, 2048] g32 on a Zen 5, 2 threads: 1.25-1.46x with
 * vpmaddubsw, PLN_CPU_NO_VNNI=1); from 17 tokens the repack tiles lead.
 * Q4B2_PF_NOTE: a row tile reads one row's segment (the GEMV's 4-row tiles read four contiguous
 * rows, which pf_ahead4 follows as one stream); the first token tile of each row prefetches the
 * segment the row tile PF_AHEAD bytes of reading later will take, in the order the tiles take
 * them: out of cache [131072, 2048] g32 at 8 tokens 18.7 -> 12.9 ms (1.5 ms in L3). */
#define Q4B2_NT 8
#define Q4B2_ROWS 32
#define Q4B2_TOK 16
#define DEF_Q4B(NAME, ATTR, DOT2, GEMV)                                                                          \
    /* one row x NT tokens over pairs [p0, p1); f: the row's accumulators, token j at f[j] */                   \
    static inline __attribute__((always_inline)) ATTR void NAME##_tile(                                          \
        const int NT, const bool G32, __m256 *f, const uint8_t *wr, const uint16_t *sr, int64_t ppg,             \
        const __m256i *xl, int64_t xlt, int64_t p0, int64_t p1, const char *pw) {                                \
        const __m256i nib = _mm256_set1_epi8(0x0f);                                                              \
        const __m128i spread = _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);                    \
        __m256 a[Q4B2_NT];                                                                                       \
        Q8UNROLL for (int j = 0; j < NT; j++) a[j] = f[j];                                                       \
        int64_t g = G32 ? 0 : p0 / ppg, pc = G32 ? 0 : p0 % ppg;   /* the pair's group, its place in it */       \
        for (int64_t p = p0; p < p1; p++) {                                                                      \
            const __m256i *x = xl + 4 * (p - p0);                                                                \
            if (pw && ((p - p0) & 1) == 0) _mm_prefetch(pw + 32 * (p - p0), _MM_HINT_T0);   /* Q4B2_PF_NOTE */    \
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(wr + 32 * p));                        \
            __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);          \
            __m256 sc;                                                                                           \
            if (G32) {   /* the pair's two groups side by side, as the GEMV's mode 2 */                          \
                int32_t h2;                                                                                      \
                memcpy(&h2, sr + 2 * p, 4);                                                                      \
                sc = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_cvtsi32_si128(h2), spread));                           \
            } else {                                                                                             \
                sc = _mm256_set1_ps(_cvtsh_ss(sr[g]));                                                           \
            }                                                                                                    \
            Q8UNROLL for (int j = 0; j < NT; j++) {                                                              \
                const __m256i *xj = x + j * xlt;                                                                 \
                __m256 d = _mm256_cvtepi32_ps(DOT2(_mm256_load_si256(xj + 2), lo, _mm256_load_si256(xj), hi,    \
                                                   _mm256_load_si256(xj + 1)));                                  \
                a[j] = _mm256_fmadd_ps(d, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_load_si256(xj + 3)), sc), a[j]); \
            }                                                                                                    \
            if (!G32 && ++pc == ppg) { pc = 0; g++; }                                                            \
        }                                                                                                        \
        Q8UNROLL for (int j = 0; j < NT; j++) f[j] = a[j];                                                       \
    }                                                                                                            \
    /* every token tile of one row: Q4B2_NT at a time, then the rest in one */                                   \
    static inline __attribute__((always_inline)) ATTR void NAME##_row(                                           \
        const bool G32, __m256 *f, int64_t tn, const uint8_t *wr, const uint16_t *sr, int64_t ppg,               \
        const __m256i *xl, int64_t seg, int64_t p0, int64_t p1, const char *pw) {                                \
        int64_t j = 0;                                                                                           \
        for (; j + Q4B2_NT <= tn; j += Q4B2_NT, pw = NULL)                                                       \
            NAME##_tile(Q4B2_NT, G32, f + j, wr, sr, ppg, xl + 4 * seg * j, 4 * seg, p0, p1, pw);                \
        const __m256i *xj = xl + 4 * seg * j;                                                                    \
        switch (tn - j) {                                                                                        \
        case 7: NAME##_tile(7, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 6: NAME##_tile(6, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 5: NAME##_tile(5, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 4: NAME##_tile(4, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 3: NAME##_tile(3, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 2: NAME##_tile(2, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        case 1: NAME##_tile(1, G32, f + j, wr, sr, ppg, xj, 4 * seg, p0, p1, pw); break;                         \
        default: break;                                                                                          \
        }                                                                                                        \
    }                                                                                                            \
    /* nt tokens of plain-row activations (cpu.h gemm_q4n) times nr packed int4 rows */                          \
    static ATTR void NAME(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,       \
                          int64_t nt, const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr,        \
                          int64_t K) {                                                                           \
        int64_t nb = K / 32, np = K / 64, ng = K / group, rb = K / 2, ppg = group / 64;                          \
        if (K % 64 != 0 || ng == 1 || (group != 32 && group % 64 != 0)) {   /* the GEMV, token by token */       \
            for (int64_t t = 0; t < nt; t++)                                                                     \
                GEMV(out + t * ldo, xq + t * K, xs + t * nb, xsum + t * nb, w, scale, group, nr, K);             \
            return;                                                                                              \
        }                                                                                                        \
        const bool g32 = group == 32;                                                                            \
        __m256i xl[4 * 128];                   /* token j's pair p0 + p at xl + 4 (j seg + p) */                 \
        __m256 f[Q4B2_ROWS * Q4B2_TOK];        /* row i, token j at f[i tn + j] */                               \
        for (int64_t t0 = 0; t0 < nt; t0 += Q4B2_TOK) {                                                          \
            int64_t tn = nt - t0 < Q4B2_TOK ? nt - t0 : Q4B2_TOK, seg = 128 / tn < 64 ? 128 / tn : 64;           \
            const int8_t *xq0 = xq + t0 * K;                                                                     \
            const float *xs0 = xs + t0 * nb;                                                                     \
            const int32_t *xsum0 = xsum + t0 * nb;                                                               \
            for (int64_t r0 = 0; r0 < nr; r0 += Q4B2_ROWS) {                                                     \
                int64_t n = nr - r0 < Q4B2_ROWS ? nr - r0 : Q4B2_ROWS;                                           \
                for (int64_t i = 0; i < n * tn; i++) f[i] = _mm256_setzero_ps();                                 \
                for (int64_t p0 = 0; p0 < np; p0 += seg) {                                                       \
                    int64_t p1 = np - p0 < seg ? np : p0 + seg;                                                  \
                    for (int64_t j = 0; j < tn; j++)                                                             \
                        for (int64_t p = p0; p < p1; p++)                                                        \
                            q4_pair_x(xl + 4 * (j * seg + p - p0), xq0 + j * K, xs0 + j * nb, xsum0 + j * nb, 2 * p); \
                    /* Q4B2_PF_NOTE: the row segment read dr row tiles on (past this segment's rows:     \
                     * the next segment's first rows; past the last segment: the rows after these, which \
                     * the next chunk of the call's thread mostly is, STREAM_NOTE; a prefetch past the    \
                     * matrix never faults) */                                                            \
                    int64_t dr = (PF_AHEAD + 32 * seg - 1) / (32 * seg);                                         \
                    for (int64_t i = 0; i < n; i++) {                                                            \
                        const uint8_t *wr = w + (r0 + i) * rb;                                                   \
                        const uint16_t *sr = scale + (r0 + i) * ng;                                              \
                        int64_t ti = i + dr, tp = p0, tr = r0;   /* the target: row tr + ti, pairs from tp */    \
                        while (ti >= n) {                                                                        \
                            ti -= n;                                                                             \
                            tp += seg;                                                                           \
                            if (tp >= np) { tp = 0; tr += n; }                                                   \
                        }                                                                                        \
                        const char *pw = (const char *)w + (tr + ti) * rb + 32 * tp;                             \
                        /* the target's scales: 4 bytes a pair with groups of 32, fewer with larger ones */      \
                        const char *ps = (const char *)(scale + (tr + ti) * ng + 2 * tp / (g32 ? 1 : 2 * ppg));  \
                        for (int64_t q = 0; q < 4 * seg / (g32 ? 1 : 2 * ppg); q += 64) _mm_prefetch(ps + q, _MM_HINT_T0); \
                        if (g32) NAME##_row(true, f + i * tn, tn, wr, sr, ppg, xl, seg, p0, p1, pw);             \
                        else NAME##_row(false, f + i * tn, tn, wr, sr, ppg, xl, seg, p0, p1, pw);                \
                    }                                                                                            \
                }                                                                                                \
                for (int64_t j = 0; j < tn; j++)                                                                 \
                    for (int64_t i = 0; i < n; i++)                                                              \
                        out[(t0 + j) * ldo + r0 + i] = hsum(f[i * tn + j]);   /* the GEMV's: times 1.0f, exact */ \
            }                                                                                                    \
        }                                                                                                        \
    }
DEF_Q4B(gemm_q4b_avx2_base, TGT, q8_dot2_base, q8_gemv_avx2_base)
DEF_Q4B(gemm_q4b_avx2_vnni, __attribute__((target("avx2,fma,f16c,avxvnni"))), q8_dot2_vnni, q8_gemv_avx2_vnni)

/* cpu.h gemm_q4n (Q4B2_NOTE), with AVX-VNNI where the CPU has it */
static void gemm_q4n_avx2(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                          const uint8_t *w, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    if (!pln_cpu_no_vnni && __builtin_cpu_supports("avxvnni"))
        gemm_q4b_avx2_vnni(out, ldo, xq, xs, xsum, nt, w, scale, group, nr, K);
    else
        gemm_q4b_avx2_base(out, ldo, xq, xs, xsum, nt, w, scale, group, nr, K);
}

static void gemm_q8_avx2(float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum, int64_t nt,
                         int64_t ldq, const void *w, bool i4, const uint16_t *scale, int64_t group, int64_t nr, int64_t K) {
    bool vnni = !pln_cpu_no_vnni && __builtin_cpu_supports("avxvnni");
    if (nt == 1 && i4) {
        if (vnni) q8_gemv_avx2_vnni(out, xq, xs, xsum, w, scale, group, nr, K);
        else q8_gemv_avx2_base(out, xq, xs, xsum, w, scale, group, nr, K);
    } else if (vnni) {
        gemm_q8_avx2_vnni(out, ldo, xq, xs, xsum, nt, ldq, w, i4, scale, group, nr, K);
    } else {
        gemm_q8_avx2_base(out, ldo, xq, xs, xsum, nt, ldq, w, i4, scale, group, nr, K);
    }
}

/* The attention loops are written once over a row loader (inlined with f16 a constant): the
 * F16-cache versions do the same arithmetic in the same order on the exactly converted values,
 * so an F16 cache gives bit for bit what an F32 cache holding the same rounded rows gives. */
INL __m256 kv_ldv(const void *p, int64_t i, bool f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))) : _mm256_loadu_ps((const float *)p + i);
}
INL float kv_ld(const void *p, int64_t i, bool f16) {
    return f16 ? pln_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Four keys at a time share each load of q. */
INL void dots_impl(float *scores, const float *q, const void *k, int64_t n, int64_t d, bool f16) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const int64_t k0 = i * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int64_t e = 0;
        for (; e + 8 <= d; e += 8) {
            __m256 qv = _mm256_loadu_ps(q + e);
            a0 = _mm256_fmadd_ps(qv, kv_ldv(k, k0 + e, f16), a0);
            a1 = _mm256_fmadd_ps(qv, kv_ldv(k, k0 + d + e, f16), a1);
            a2 = _mm256_fmadd_ps(qv, kv_ldv(k, k0 + 2 * d + e, f16), a2);
            a3 = _mm256_fmadd_ps(qv, kv_ldv(k, k0 + 3 * d + e, f16), a3);
        }
        float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
        for (; e < d; e++) {
            s0 += q[e] * kv_ld(k, k0 + e, f16); s1 += q[e] * kv_ld(k, k0 + d + e, f16); s2 += q[e] * kv_ld(k, k0 + 2 * d + e, f16); s3 += q[e] * kv_ld(k, k0 + 3 * d + e, f16);
        }
        scores[i] = s0; scores[i + 1] = s1; scores[i + 2] = s2; scores[i + 3] = s3;
    }
    for (; i < n; i++) {
        __m256 a0 = _mm256_setzero_ps();
        int64_t e = 0;
        for (; e + 8 <= d; e += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), kv_ldv(k, i * d + e, f16), a0);
        float s0 = hsum(a0);
        for (; e < d; e++) s0 += q[e] * kv_ld(k, i * d + e, f16);
        scores[i] = s0;
    }
}

/* o is held in registers four vectors at a time (four independent FMA chains) while the
 * stretch's keys stream past: each vector of o is loaded and stored once per stretch. */
INL void weighted_sum_impl(float *o, float c, const float *p, const void *v, int64_t n, int64_t d, bool f16) {
    __m256 cv = _mm256_set1_ps(c);
    int64_t e = 0;
    for (; e + 4 * 8 <= d; e += 4 * 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + e), cv), a1 = _mm256_mul_ps(_mm256_loadu_ps(o + e + 8), cv);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o + e + 2 * 8), cv), a3 = _mm256_mul_ps(_mm256_loadu_ps(o + e + 3 * 8), cv);
        for (int64_t i = 0; i < n; i++) {
            const int64_t vi = i * d + e;
            __m256 pv = _mm256_set1_ps(p[i]);
            a0 = _mm256_fmadd_ps(pv, kv_ldv(v, vi, f16), a0);
            a1 = _mm256_fmadd_ps(pv, kv_ldv(v, vi + 8, f16), a1);
            a2 = _mm256_fmadd_ps(pv, kv_ldv(v, vi + 2 * 8, f16), a2);
            a3 = _mm256_fmadd_ps(pv, kv_ldv(v, vi + 3 * 8, f16), a3);
        }
        _mm256_storeu_ps(o + e, a0); _mm256_storeu_ps(o + e + 8, a1);
        _mm256_storeu_ps(o + e + 2 * 8, a2); _mm256_storeu_ps(o + e + 3 * 8, a3);
    }
    for (; e + 8 <= d; e += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + e), cv);
        for (int64_t i = 0; i < n; i++) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), kv_ldv(v, i * d + e, f16), acc);
        _mm256_storeu_ps(o + e, acc);
    }
    for (; e < d; e++) {
        float acc = o[e] * c;
        for (int64_t i = 0; i < n; i++) acc += p[i] * kv_ld(v, i * d + e, f16);
        o[e] = acc;
    }
}

static TGT void dots_avx2(float *scores, const float *q, const float *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, false);
}
static TGT void dots_f16_avx2(float *scores, const float *q, const uint16_t *k, int64_t n, int64_t d) {
    dots_impl(scores, q, k, n, d, true);
}
static TGT void weighted_sum_avx2(float *o, float c, const float *p, const float *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, false);
}
static TGT void weighted_sum_f16_avx2(float *o, float c, const float *p, const uint16_t *v, int64_t n, int64_t d) {
    weighted_sum_impl(o, c, p, v, n, d, true);
}

/* exp(x): 2^n * e^r with |r| <= ln2/2 and Cephes' expf polynomial (about 1 ulp); x is clamped
 * to [-87, 88] so 2^n stays a normal float (GeLU needs no more range). */
INL __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n + 127 into the exponent field; n is in [-126, 127] after the clamp */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

INL __m256 gelu256(__m256 x) {
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(-2.0f * 0.79788456f)),
                             _mm256_fmadd_ps(x2, _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(u)));
}

static TGT void bias_gelu_avx2(float *o, const uint16_t *bias, int64_t n, bool gelu) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(o + i);
        if (bias) v = _mm256_add_ps(v, load_f16(bias + i));
        if (gelu) v = gelu256(v);
        _mm256_storeu_ps(o + i, v);
    }
    for (; i < n; i++) {
        float v = o[i] + (bias ? pln_f16_to_f32(bias[i]) : 0.0f);
        o[i] = gelu ? pln_gelu(v) : v;
    }
}

/* Four accumulators (the sum of a 250k-entry vocab row in fp32 lanes stays accurate to ~1e-6). */
static TGT float sum_exp_avx2(const float *x, int64_t n, float mx) {
    __m256 m = _mm256_set1_ps(mx), a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 4 * 8 <= n; i += 4 * 8) {
        a0 = _mm256_add_ps(a0, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
        a1 = _mm256_add_ps(a1, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m)));
        a2 = _mm256_add_ps(a2, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 2 * 8), m)));
        a3 = _mm256_add_ps(a3, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 3 * 8), m)));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += expf(x[i] - mx);
    return s;
}

static TGT float exp_sum_avx2(float *x, int64_t n, float mx) {
    __m256 m = _mm256_set1_ps(mx), a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        a = _mm256_add_ps(a, e);
    }
    float s = hsum(a);
    for (; i < n; i++) { x[i] = expf(x[i] - mx); s += x[i]; }
    return s;
}

static TGT float score_max_avx2(float *x, int64_t n, float scale, float slope, int32_t j0) {
    __m256 sv = _mm256_set1_ps(scale), lv = _mm256_set1_ps(slope), mv = _mm256_set1_ps(-INFINITY);
    __m256i jv = _mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_mul_ps(lv, _mm256_cvtepi32_ps(jv)));
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(mv, v);
        jv = _mm256_add_epi32(jv, _mm256_set1_epi32(8));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; i < n; i++) {
        x[i] = x[i] * scale + slope * (float)(j0 + i);
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

static TGT double fma_chains_avx2(int64_t iters, float *sink) {
    __m256 a[PLN_CPU_FMA_CHAINS], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    _Pragma("GCC unroll 16") for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = _mm256_set1_ps(1.0f + 1e-3f * (float)i);
    for (int64_t n = 0; n < iters; n++) {
        _Pragma("GCC unroll 16") for (int i = 0; i < PLN_CPU_FMA_CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < PLN_CPU_FMA_CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    *sink = hsum(s);
    return 2.0 * 8 * PLN_CPU_FMA_CHAINS * (double)iters;
}

static TGT void silu_mul_avx2(float *out, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_xor_ps(x, sign))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = pln_silu(g[i]) * u[i];
}

/* pln_cpu_quant_act, 8 columns per vector, bit for bit (simd_avx512.c's quant_act_avx512 is the
 * same arithmetic): the scalar scale and inverse, the fp32 product, vcvtps2dq's round half to
 * even, the saturating packs (values are within +-127 already). */
static TGT void quant_act_avx2(const float *x, int64_t K, int8_t *xq, float *xs, int32_t *xsum, int64_t ldq,
                               int64_t t0, int64_t t1) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t t = t0; t < t1; t++)   /* token by token: simd_avx512.c quant_act_avx512 */
        for (int64_t b = 0; b < K / 32; b++) {
            const float *xb = x + t * K + 32 * b;
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);   /* NaN |x| keeps m, as fmaxf */
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float sc = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            __m256 iv = _mm256_set1_ps(inv);
            __m256i acc = _mm256_setzero_si256();
            int8_t q[32];
            for (int i = 0; i < 4; i++) {
                __m256i qi = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv)), lo), hi);
                acc = _mm256_add_epi32(acc, qi);
                __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
                _mm_storel_epi64((__m128i *)(q + 8 * i), _mm_packs_epi16(p16, p16));
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            xs[b * ldq + t] = sc;
            xsum[b * ldq + t] = _mm_cvtsi128_si32(s4);
            for (int g = 0; g < 8; g++) memcpy(xq + 4 * ((8 * b + g) * ldq + t), q + 4 * g, 4);
        }
}

/* ---- The batched float path: packed activations, weights widened once per panel ----
 * PANEL_NOTE (as simd_avx512.c's, with 8-float vectors): at PLN_CPU_PANEL_MIN tokens or more the
 * dot-product tiles above spend a widen per weight vector for only 2 tokens' FMAs and sum every
 * result horizontally. Here the activations are packed once per call (pack_x_avx2: the panel
 * layout linear.c shares with the AVX-512 tier, 32 tokens side by side per column), a stretch of
 * PLN_CPU_PANEL_ROWS weight rows is widened to fp32 once per PKC2 columns (dequantized: q x scale
 * is exact in fp32), and the micro kernel keeps 6 rows x 16 tokens of results in 12 of the 16 ymm
 * registers: per column, two activation loads and six broadcast weights feed 12 FMAs, and no
 * result is ever summed horizontally. Each output is a sum over PKC2 columns in one fp32
 * accumulator, and those block sums are added in order (the tiles' error bound, a different
 * order: cpu.h pln_cpu_set_batch_invariant). The rows a call covers are fixed and every token's
 * arithmetic is its own lane, so the bits depend neither on the threads nor on the number of
 * tokens. 6 x 16 rather than 3 x 32 (also 12 accumulators): a whole panel's column is 4 vectors,
 * which with the accumulators and a broadcast would need 17 registers; a 3 x 32 tile that loads
 * each activation vector once for its three rows (12 + 3 broadcasts + 1 = 16 registers, half the
 * broadcasts per FMA) measured the same on a Zen 5 (AVX2 tier, Llama-3.2-1B, 512-token prefill
 * and batch 32, interleaved: fp16 prefill 117.9-125.3 tokens/s against 117.4-124.4). Blocks of 64 columns
 * measured 0.75-0.85x of 128 on Zen 3 (more block sums to load and store per FMA), 256 0.92-1.0x
 * (one thread, in cache, interleaved). */
#define PMR2 6                      /* rows per micro tile */
#define PKC2 128                    /* columns per block: PANEL_ROWS x PKC2 floats widened (24 KiB) */
#define PTB2 256                    /* tokens per pass over the weights (PTB2 / 32 panels) */
/* F16 and per-row int8 take the panel from this many tokens (cpu.h panel_min_plain), as grouped
 * int8 and int4 do: on a quiet Zen 3, Llama-3.2-1B decode at batch 32 (`pollen bench --batch 32`,
 * 2 threads, alternated) ran 34.5-39.8 tokens/s on the tiles against 36.8-48.2 on the panel in
 * fp16, 31.0-32.1 against 39.1-40.2 in per-row int8 (a first choice of 64, from the kernels
 * alone on a loaded machine, had kept them on the tiles there). */
#define PANEL_MIN_PLAIN PLN_CPU_PANEL_MIN
/* int8 weights take gemm_q8 from this many tokens (cpu.h Q8_MIN_NOTE): Llama-3.2-1B decode on the
 * Intel Xeon of docs/BENCHMARKS.md (GenuineIntel family 6 model 167, PLN_CPU_ISA=avx2, 2 threads,
 * quiet, `pollen bench --batch 2,4,8,9,10,11,12,16 --int-dot off|on`), tokens/s float / integer
 * dot: grouped int8 2: 28.3 / 18.6, 4: 41.5 / 31.3, 8: 53.9 / 51.9, 9: 52.0 / 54.6, 12: 58.6 /
 * 66.9; per row 8: 58.2 / 58.2, 9: 60.8 / 61.8, 12: 62.4 / 72.4 (on the Zen 5 of that file, at 8:
 * grouped 74.5 / 74.2, per row 76.9 / 79.8). */
#define Q8_MIN_AVX2 9
_Static_assert(PLN_CPU_PANEL_ROWS % PMR2 == 0, "micro tiles fill a panel call");
_Static_assert(PKC2 % 32 == 0, "int4 blocks hold whole 32-column blocks");
_Static_assert(PLN_CPU_PANEL_SCRATCH >= PLN_CPU_PANEL_ROWS * PKC2 + PLN_CPU_PANEL_ROWS * PTB2, "scratch holds wf and cb");

/* 8 vectors r[i] (8 floats each) transposed in place: r[c] becomes element c of every r[i]. */
INL void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {   /* u[4i + c], 128-bit lane l: rows 4i..4i+3 of column 4l + c */
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* Panels p0 <= p < p1 of the tokens (cpu.h): xp + p 32 K holds column k of tokens 32p..32p+31 at
 * [32 k ..], tokens past nt as zeros. */
static TGT void pack_x_avx2(float *xp, const float *x, int64_t ldx, int64_t nt, int64_t K, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
        float *dst = xp + p * 32 * K;
        /* the four quarters of a column's line in turn, 8 columns at a time */
        for (int64_t k = 0; k < K; k += 8) {
            int64_t kn = K - k < 8 ? K - k : 8;
            for (int h = 0; h < 4; h++) {
                int64_t t0 = 32 * p + 8 * h;
                __m256 r[8];
                if (t0 + 8 <= nt && kn == 8) {
                    UNROLL8 for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(x + (t0 + j) * ldx + k);
                } else {
                    for (int j = 0; j < 8; j++) {
                        float b[8] = {0};
                        if (t0 + j < nt) memcpy(b, x + (t0 + j) * ldx + k, (size_t)kn * sizeof(float));
                        r[j] = _mm256_loadu_ps(b);
                    }
                }
                transpose8(r);
                if (kn == 8) {
                    UNROLL8 for (int c = 0; c < 8; c++) _mm256_store_ps(dst + (k + c) * 32 + 8 * h, r[c]);
                } else {
                    for (int c = 0; c < kn; c++) _mm256_store_ps(dst + (k + c) * 32 + 8 * h, r[c]);
                }
            }
        }
    }
}

/* Rows [0, nr) of W from row r0, columns [k0, k0 + kc), widened to fp32 at wf[i * PKC2 + k - k0];
 * rows nr..nr_pad - 1 zeros. */
static TGT void widen_rows(float *wf, const pln_weight *W, int64_t r0, int64_t nr, int64_t nr_pad, int64_t k0,
                           int64_t kc) {
    int64_t K = W->cols, ng = W->dtype == PLN_DTYPE_F16 ? 1 : K / W->group, group = W->dtype == PLN_DTYPE_F16 ? K : W->group;
    for (int64_t i = 0; i < nr; i++) {
        float *d = wf + i * PKC2;
        int64_t r = r0 + i, k = 0;
        if (W->dtype == PLN_DTYPE_F16) {
            const uint16_t *w = (const uint16_t *)W->w + r * K + k0;
            for (; k + 8 <= kc; k += 8) _mm256_store_ps(d + k, load_f16(w + k));
            for (; k < kc; k++) d[k] = pln_f16_to_f32(w[k]);
        } else if (W->dtype == PLN_DTYPE_I8) {
            const int8_t *w = (const int8_t *)W->w + r * K;
            const uint16_t *s = W->scale + r * ng;
            /* whole groups' vectors: one scale each (a vector across two groups: the loop below) */
            int64_t g = k0 / group, gend = (g + 1) * group - k0;   /* group g ends before column gend */
            __m256 sv = _mm256_set1_ps(_cvtsh_ss(s[g]));
            for (; k + 8 <= kc; k += 8) {
                if (k + 8 > gend) {
                    if (k != gend) break;
                    g++;
                    gend += group;
                    sv = _mm256_set1_ps(_cvtsh_ss(s[g]));
                    if (k + 8 > gend) break;
                }
                _mm256_store_ps(d + k, _mm256_mul_ps(load_i8(w + k0 + k), sv));
            }
            for (; k < kc; k++) d[k] = (float)w[k0 + k] * _cvtsh_ss(s[(k0 + k) / group]);
        } else {   /* int4: k0 and kc are multiples of 32; group is 32, 64 or 128 (FORMAT.md) */
            int gshift = group == 32 ? 5 : group == 64 ? 6 : group == 128 ? 7 : -1;
            const uint8_t *w = (const uint8_t *)W->w + r * (K / 2);
            const uint16_t *s = W->scale + r * ng;
            for (; k < kc; k += 32) {
                __m256 v[4], sv = _mm256_set1_ps(_cvtsh_ss(s[gshift >= 0 ? (k0 + k) >> gshift : (k0 + k) / group]));
                load_i4x32(w + (k0 + k) / 2, v);
                UNROLL for (int q = 0; q < 4; q++) _mm256_store_ps(d + k + 8 * q, _mm256_mul_ps(v[q], sv));
            }
        }
    }
    for (int64_t i = nr; i < nr_pad; i++) memset(wf + i * PKC2, 0, (size_t)kc * sizeof(float));
}

/* The weights' next block (rows of rowb bytes, 1 << shift pieces of ub bytes each, a piece at
 * most a cache line), requested one piece per 4 columns of the micro kernel up to end: spread
 * over the block's arithmetic, as simd_avx512.c's pf_stream, for the same reason. With them, the
 * next chunk of the activations (x, xn lines to go).
 * XP_PF_NOTE: a panel's chunk of the packed activations (PKC2 columns x 32 tokens, 16 KiB) is read
 * by every micro tile of the call and by no other call of this block, so each chunk arrives from
 * wherever the packing left it (a 512-token prefill packs 4 MiB at K = 2048, 16 MiB at 8192: past
 * L2) while the first micro tile waits for it: `perf annotate` of the AVX2 grouped int8 prefill
 * (Llama-3.2-1B, Intel Xeon VM, 2 threads) put the heaviest samples on the activation loads. Each
 * micro tile now requests its share of the chunk that comes next (the next panel's, or the next
 * block's first), one line per prefetch step. In one burst of 16 lines before each micro tile
 * instead, the requests stalled on the line fill buffers (10 % of the samples on the prefetch
 * loop) and gained half as much. Same machine, `test_kernels_cpu --bench-panel 512`, gate|up and
 * down, grouped int8, 2 threads, alternated: AVX2 198-204 -> 218-221 GFLOP/s (gate|up) and 177
 * -> 212-217 (down), AVX-512 292-304 -> 315-324 and 272-298 -> 310-340; the same prefill 512
 * `pollen bench` 87.5 -> 100.6 tokens/s (AVX2). T0 and T1 hints measured alike at 512 tokens;
 * T1 was 5-8 % slower on gate|up at 32-64 tokens. */
typedef struct { const char *base; int64_t rowb, ub; int shift; int64_t next, end; const char *x; int64_t xn; } pf_stream;

INL void pf_step(pf_stream *s) {
    if (s->next < s->end) {
        _mm_prefetch(s->base + (s->next >> s->shift) * s->rowb + (s->next & ((1 << s->shift) - 1)) * s->ub, _MM_HINT_T0);
        s->next++;
    }
    if (s->xn > 0) {
        _mm_prefetch(s->x, _MM_HINT_T0);
        s->x += 64;
        s->xn--;
    }
}

/* One column of the micro kernel: 6 broadcast weights x NV activation vectors. */
INL void panel_col(const int NV, __m256 acc[PMR2][2], const float *wf, const float *xk) {
    __m256 x0 = _mm256_load_ps(xk), x1 = NV == 2 ? _mm256_load_ps(xk + 8) : x0;
    UNROLL8 for (int i = 0; i < PMR2; i++) {
        __m256 b = _mm256_broadcast_ss(wf + i * PKC2);
        acc[i][0] = _mm256_fmadd_ps(b, x0, acc[i][0]);
        if (NV == 2) acc[i][1] = _mm256_fmadd_ps(b, x1, acc[i][1]);
    }
}

/* 6 rows (wf, PKC2 apart) x NV vectors of 8 tokens (xp, 32 floats per column), kc columns. One
 * prefetch per 4 columns: one per column (the AVX-512 kernel's rate) cost its address arithmetic
 * in a loop of 12 FMAs, 0-17 % slower on Zen 3 at 32-256 tokens (interleaved, one thread). */
INL void panel_mk(const int NV, __m256 acc[PMR2][2], const float *wf, const float *xp, int64_t kc, pf_stream *pf) {
    UNROLL8 for (int i = 0; i < PMR2; i++) {
        acc[i][0] = _mm256_setzero_ps();
        acc[i][1] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
        pf_step(pf);
        UNROLL8 for (int u = 0; u < 4; u++) panel_col(NV, acc, wf + k + u, xp + 32 * (k + u));
    }
    for (; k < kc; k++) panel_col(NV, acc, wf + k, xp + 32 * k);
}

static TGT void gemm_panel_avx2(float *out, int64_t ldo, const float *xp, int64_t nt, const pln_weight *W,
                                int64_t r0, int64_t nr, const uint16_t *bias, bool gelu, float *scratch) {
    int64_t K = W->cols, nr_pad = (nr + PMR2 - 1) / PMR2 * PMR2;
    float *wf = scratch, *cb = scratch + PLN_CPU_PANEL_ROWS * PKC2;
    int es2 = W->dtype == PLN_DTYPE_F16 ? 4 : W->dtype == PLN_DTYPE_I8 ? 2 : 1;   /* bytes per element x 2 */
    int64_t rowb = K * es2 / 2, blkb = PKC2 * es2 / 2;                              /* bytes of a row, of its block */
    int64_t ub = blkb < 64 ? blkb : 64;
    int shift = 0;
    while ((ub << shift) < blkb) shift++;                                           /* pieces per row of a block */
    for (int64_t t0 = 0; t0 < nt; t0 += PTB2) {
        int64_t tn = nt - t0 < PTB2 ? nt - t0 : PTB2, np = (tn + 31) / 32;
        for (int64_t k0 = 0; k0 < K; k0 += PKC2) {
            int64_t kc = K - k0 < PKC2 ? K - k0 : PKC2;
            bool first = k0 == 0, last = k0 + kc == K;
            widen_rows(wf, W, r0, nr, nr_pad, k0, kc);
            /* the block after next of these rows, or past their end a block of the rows after them
             * (PANEL_PF_NOTE) */
            int64_t k2 = k0 + PANEL_PF_BLOCKS * kc;
            pf_stream pf = {.base = (const char *)W->w + (k2 >= K ? (r0 + nr) * rowb + (k2 - K) * es2 / 2 : r0 * rowb + k2 * es2 / 2),
                            .rowb = rowb, .ub = ub, .shift = shift, .next = 0};
            int64_t quota = (nr << shift) / (np * (nr_pad / PMR2)) + 1;
            for (int64_t p = 0; p < np; p++) {
                const float *xb = xp + (t0 / 32 + p) * 32 * K + k0 * 32;
                int64_t pt = tn - 32 * p < 32 ? tn - 32 * p : 32;   /* tokens in this panel */
                /* XP_PF_NOTE: the activations' next chunk, spread over this panel's micro tiles */
                int64_t pa = p + 1, ka = k0 + pa / np * PKC2, kn = K - ka < PKC2 ? K - ka : PKC2;
                const char *xnext = ka < K ? (const char *)(xp + (t0 / 32 + pa % np) * 32 * K + ka * 32) : NULL;
                int64_t xcalls = nr_pad / PMR2 * 2, xlines = xnext ? (kn * 2 + xcalls - 1) / xcalls : 0;
                for (int64_t m = 0; m < nr_pad; m += PMR2) {
                    float *c = cb + (m / PMR2 * (PTB2 / 32) + p) * PMR2 * 32;   /* this tile's block sums */
                    pf.end = pf.next + quota < (nr << shift) ? pf.next + quota : (nr << shift);
                    /* the panel's two halves of 16 tokens: a half of at most 8 takes one vector */
                    for (int h = 0; h < 2 && 16 * h < pt; h++) {
                        int64_t xi = (m / PMR2 * 2 + h) * xlines;   /* this call's share of the chunk */
                        pf.x = xnext ? xnext + xi * 64 : NULL;
                        pf.xn = xi < kn * 2 ? (kn * 2 - xi < xlines ? kn * 2 - xi : xlines) : 0;
                        __m256 acc[PMR2][2];
                        int64_t ht = pt - 16 * h;
                        if (ht > 8) panel_mk(2, acc, wf + m * PKC2, xb + 16 * h, kc, &pf);
                        else panel_mk(1, acc, wf + m * PKC2, xb + 16 * h, kc, &pf);
                        UNROLL8 for (int i = 0; i < PMR2; i++) {
                            for (int v = 0; v < 2; v++) {
                                float *cv = c + i * 32 + 16 * h + 8 * v;
                                __m256 s = acc[i][v];
                                if (!first) s = _mm256_add_ps(_mm256_load_ps(cv), s);
                                _mm256_store_ps(cv, s);
                            }
                        }
                    }
                    if (last) {
                        int64_t mr = nr - m < PMR2 ? nr - m : PMR2;
                        for (int64_t j = 0; j < pt; j++)
                            for (int64_t i = 0; i < mr; i++) out[(t0 + 32 * p + j) * ldo + m + i] = c[i * 32 + j];
                    }
                }
                if (last && (bias || gelu))
                    for (int64_t j = 0; j < pt; j++) bias_gelu_avx2(out + (t0 + 32 * p + j) * ldo, bias, nr, gelu);
            }
        }
    }
}

const pln_cpu_kernels pln_cpu_kernels_avx2 = {
    .name = "avx2", .gemm_f16 = gemm_f16_avx2, .gemm_i8 = gemm_i8_avx2, .gemm_i4 = gemm_i4_avx2, .gemm_q8 = gemm_q8_avx2, .gemm_q4n = gemm_q4n_avx2, .quant_act = quant_act_avx2,
    .pack_x = pack_x_avx2, .gemm_panel = gemm_panel_avx2, .panel_min_plain = PANEL_MIN_PLAIN, .q8_min = Q8_MIN_AVX2, .gemv = gemv_avx2,
    .dots = dots_avx2, .weighted_sum = weighted_sum_avx2,
    .dots_f16 = dots_f16_avx2, .weighted_sum_f16 = weighted_sum_f16_avx2, .bias_gelu = bias_gelu_avx2,
    .sum_exp = sum_exp_avx2, .exp_sum = exp_sum_avx2, .score_max = score_max_avx2,
    .silu_mul = silu_mul_avx2, .fma_chains = fma_chains_avx2,
};
#endif
