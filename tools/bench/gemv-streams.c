/* gemv-streams.c — why the one-token GEMV reads its rows one at a time (kernels/cpu/simd_avx512.c
 * GEMV_NOTE). Two threads stream an fp16 [R, K] matrix (16 MiB, cycled through 512 MiB of copies
 * so that every pass reads memory) four ways, interleaved, best of the rounds:
 *   read      a plain read of the same bytes (the ceiling)
 *   tile4     4-row tiles (four places a row apart) with the tiles' prefetch (cpu.h pf_ahead4)
 *   tile4-np  4-row tiles, no software prefetch
 *   row       one row at a time, 4 accumulators, a prefetch 8 KiB ahead (the GEMV's scheme)
 * Each thread takes half the rows. Build and run (x86-64 with AVX-512):
 *   cc -O2 -march=native -fopenmp tools/bench/gemv-streams.c -o /tmp/gemv-streams
 *   /tmp/gemv-streams [K=2048] [rounds=5]
 * Quiet machine only: another job turns the figures into scheduler noise. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int64_t K, R;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __m512 lf(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static float v_read(const uint16_t *w, const float *x, float *o, int64_t r0, int64_t r1) {
    const char *p = (const char *)(w + r0 * K), *e = (const char *)(w + r1 * K);
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (; p < e; p += 256) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512(p));
        b = _mm512_xor_si512(b, _mm512_loadu_si512(p + 64));
        c = _mm512_xor_si512(c, _mm512_loadu_si512(p + 128));
        d = _mm512_xor_si512(d, _mm512_loadu_si512(p + 192));
    }
    (void)x; (void)o;
    return (float)_mm512_reduce_add_epi32(_mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
}

static inline float tile4(const uint16_t *w, const float *x, float *o, int64_t r0, int64_t r1, int pf) {
    for (int64_t r = r0; r < r1; r += 4) {
        const uint16_t *t = w + r * K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < K; k += 16) {
            if (pf && (k & 31) == 0) {
                const char *p = (const char *)t + 8192 + 8 * k;
                _mm_prefetch(p, _MM_HINT_T0); _mm_prefetch(p + 64, _MM_HINT_T0);
                _mm_prefetch(p + 128, _MM_HINT_T0); _mm_prefetch(p + 192, _MM_HINT_T0);
            }
            __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(lf(t + k), xv, a0);
            a1 = _mm512_fmadd_ps(lf(t + K + k), xv, a1);
            a2 = _mm512_fmadd_ps(lf(t + 2 * K + k), xv, a2);
            a3 = _mm512_fmadd_ps(lf(t + 3 * K + k), xv, a3);
        }
        o[r] = _mm512_reduce_add_ps(a0); o[r + 1] = _mm512_reduce_add_ps(a1);
        o[r + 2] = _mm512_reduce_add_ps(a2); o[r + 3] = _mm512_reduce_add_ps(a3);
    }
    return o[r0];
}
static float v_tile4(const uint16_t *w, const float *x, float *o, int64_t r0, int64_t r1) { return tile4(w, x, o, r0, r1, 1); }
static float v_tile4np(const uint16_t *w, const float *x, float *o, int64_t r0, int64_t r1) { return tile4(w, x, o, r0, r1, 0); }

static float v_row(const uint16_t *w, const float *x, float *o, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *t = w + r * K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < K; k += 64) {
            _mm_prefetch((const char *)(t + k) + 8192, _MM_HINT_T0);
            _mm_prefetch((const char *)(t + k) + 8192 + 64, _MM_HINT_T0);
            a0 = _mm512_fmadd_ps(lf(t + k), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(lf(t + k + 16), _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(lf(t + k + 32), _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(lf(t + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        }
        o[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
    return o[r0];
}

int main(int argc, char **argv) {
    K = argc > 1 ? atoll(argv[1]) : 2048;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (K < 64 || K % 64) { fprintf(stderr, "K must be a positive multiple of 64\n"); return 2; }
    R = ((int64_t)16 << 20) / (2 * K) / 8 * 8;
    size_t wb = (size_t)(R * K * 2);
    int nc = (int)(((size_t)512 << 20) / wb);
    uint16_t **W = malloc((size_t)nc * sizeof *W);
    for (int c = 0; c < nc; c++) {
        W[c] = aligned_alloc(64, wb);
        if (!W[c]) { fprintf(stderr, "out of memory\n"); return 1; }
        for (size_t i = 0; i < (size_t)(R * K); i++) W[c][i] = (uint16_t)(0x3c00 ^ (i & 0x3ff));
    }
    float *x = aligned_alloc(64, (size_t)K * 4), *o = aligned_alloc(64, (size_t)R * 4);
    for (int64_t i = 0; i < K; i++) x[i] = 1e-3f * (float)i;
    struct { const char *name; float (*f)(const uint16_t *, const float *, float *, int64_t, int64_t); } v[] = {
        {"read", v_read}, {"tile4", v_tile4}, {"tile4-np", v_tile4np}, {"row", v_row}};
    int nv = sizeof v / sizeof v[0];
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    float sink = 0;
    for (int round = 0; round < rounds; round++)
        for (int i = 0; i < nv; i++) {
            double t0 = now();
            for (int c = 0; c < 2 * nc; c++) {
                float s = 0;
                #pragma omp parallel num_threads(2) reduction(+:s)
                {
                    int64_t h = R / 2, r0 = omp_get_thread_num() * h;
                    s += v[i].f(W[c % nc], x, o, r0, r0 + h);
                }
                sink += s;
            }
            double dt = (now() - t0) / (2 * nc);
            if (dt < best[i]) best[i] = dt;
        }
    printf("fp16 [%lld, %lld] (rows of %lld bytes), 2 threads, best of %d:", (long long)R, (long long)K, (long long)(2 * K), rounds);
    for (int i = 0; i < nv; i++) printf("  %s %.1f GB/s", v[i].name, wb / best[i] / 1e9);
    printf("%s\n", sink == 12345.0f ? " " : "");
    return 0;
}
