/* gemv-bw.c — how close each batch-1 decode GEMV comes to the memory, per thread: pollen's own
 * kernels (the CPU backend's linear at one token, as a decode step calls it) on an fp16, int8 per
 * row, int8 g32, int4 g32 and int4 g128 weight far larger than the last-level cache, on one thread
 * and on all of them, beside a STREAM copy and a plain streaming read of the same size on the same
 * threads, measured in the same run. Reports GB/s of weight bytes (scales included) and the share
 * of the copy's (STREAM convention: bytes read + written); the read is the ceiling a GEMV could
 * reach. int4 runs the integer-dot path, as pollen's --int-dot auto does for int4 sets; fp16 and
 * int8 the float path.
 *
 *   make CUDA=0 build/bench/gemv-bw && build/bench/gemv-bw [--mib N] [--passes N] [--cols K] [--pf B,B,...]
 *
 * --mib: each matrix's size (default: 8 x the last-level cache, at least 256 MiB); --passes: timed
 * passes per figure (default 7; the median and the best are printed); --cols: K (default 4096).
 * The machine, its load average and the command line are printed first: figures from a loaded
 * machine measure the other jobs too (compare only within one run, or on a quiet machine).
 * --pf: the GEMVs' prefetch distances in bytes to compare (kernels/cpu/tune.c CPU_TUNE_NOTE), each
 * pass visiting them in turn; a distance ending in "l2" (8192l2) prefetches into L2, not L1
 * (kernels/cpu/cpu.h PF_L2_NOTE); default: the built-in one. */
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <immintrin.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *msg) {
    fprintf(stderr, "gemv-bw: %s\n", msg);
    exit(1);
}

static void *xalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) die("out of memory (lower --mib)");
    return p;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static void fill(void *p, size_t n) {
    uint64_t *q = p;
    for (size_t i = 0; i < n / 8; i++) q[i] = next();
    for (size_t i = n / 8 * 8; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)next();
}

/* one line of /proc/cpuinfo's first processor ("" if absent) */
static void cpuinfo(const char *key, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && (line[kl] == ' ' || line[kl] == '\t' || line[kl] == ':')) {
            char *v = strchr(line, ':');
            if (v) {
                v += v[1] == ' ' ? 2 : 1;
                v[strcspn(v, "\n")] = 0;
                snprintf(out, n, "%s", v);
            }
            break;
        }
    fclose(f);
}

static void print_machine(int argc, char **argv, size_t bytes, int64_t K) {
    char model[256], fam[32], mod[32], flags[8192], load[128] = "", llc[64] = "?";
    cpuinfo("model name", model, sizeof model);
    cpuinfo("cpu family", fam, sizeof fam);
    cpuinfo("model", mod, sizeof mod);
    cpuinfo("flags", flags, sizeof flags);
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fgets(load, sizeof load, f)) load[strcspn(load, "\n")] = 0;
        fclose(f);
    }
    f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        if (fgets(llc, sizeof llc, f)) llc[strcspn(llc, "\n")] = 0;
        fclose(f);
    }
    printf("# %s (family %s model %s), %d cores for this process, LLC %s, load average %s\n", model, fam, mod,
           omp_get_num_procs(), llc, load);
    printf("# flags:");
    static const char *keep[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                 "avx512_bf16", "avx_vnni", "avx512_fp16"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        const char *p = flags;
        size_t kl = strlen(keep[i]);
        while ((p = strstr(p, keep[i])) && !((p == flags || p[-1] == ' ') && (p[kl] == ' ' || p[kl] == 0))) p += kl;
        if (p) printf(" %s", keep[i]);
    }
    printf("\n# $");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    printf("   (matrices of %.0f MiB, K = %lld; GB/s = 1e9 bytes/s)\n", (double)bytes / 1048576.0, (long long)K);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct { double med, best; } timing;

static timing summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return (timing){t[n / 2], t[0]};
}

/* a plain read of n bytes on nth threads: 256-bit loads where the CPU has AVX2, four chains */
static uint64_t read_sink;
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
static uint64_t read_plain(const uint8_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        const uint64_t *q = (const uint64_t *)(const void *)(p + i);
        s0 ^= q[0];
        s1 ^= q[1];
        s2 ^= q[2];
        s3 ^= q[3];
    }
    return s0 ^ s1 ^ s2 ^ s3;
}
static double time_read(const uint8_t *p, size_t n, int nth) {
    bool avx2 = __builtin_cpu_supports("avx2");
    size_t per = (n / (size_t)nth + 4095) / 4096 * 4096;
    double t0 = now();
    uint64_t s = 0;
    #pragma omp parallel num_threads(nth) reduction(^ : s)
    {
        size_t a = per * (size_t)omp_get_thread_num();
        if (a < n) {
            size_t m = a + per <= n ? per : n - a;
            s ^= avx2 ? read_avx2(p + a, m) : read_plain(p + a, m);
        }
    }
    read_sink ^= s;
    return now() - t0;
}

static double time_copy(uint8_t *dst, const uint8_t *src, size_t n, int nth) {
    double t0 = now();
    size_t per = (n / (size_t)nth + 4095) / 4096 * 4096;
    #pragma omp parallel num_threads(nth)
    {
        size_t a = per * (size_t)omp_get_thread_num();
        if (a < n) memcpy(dst + a, src + a, a + per <= n ? per : n - a);
    }
    return now() - t0;
}

typedef struct {
    const char *name;
    pln_dtype dtype;
    int64_t group;   /* 0: per row */
    int wbits;
} kind;

int main(int argc, char **argv) {
    size_t mib = 0;
    int passes = 7;
    int64_t K = 4096;
    int64_t pfs[16];
    int npf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) K = atol(argv[++i]);
        else if (!strcmp(argv[i], "--pf") && i + 1 < argc) {
            static char list[256];   /* a copy: strtok would cut argv, which the header prints */
            snprintf(list, sizeof list, "%s", argv[++i]);
            for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
                if (npf == 16) die("--pf: at most 16 distances");
                char *end;
                long v = strtol(t, &end, 10);
                bool l2 = !strcmp(end, "l2") || !strcmp(end, "L2");
                if ((*end && !l2) || v < 0 || v > (1 << 20) || v % 64)
                    die("--pf: give byte distances, multiples of 64, 0..1048576, each optionally followed by l2");
                pfs[npf++] = v | (l2 ? PLN_TUNE_PF_L2 : 0);
            }
        } else {
            fprintf(stderr, "usage: %s [--mib N] [--passes N] [--cols K] [--pf B,B,...]\n", argv[0]);
            return 2;
        }
    }
    if (passes < 1 || passes > 1000) die("--passes: give 1..1000");
    if (K < 512 || K % 512) die("--cols: give a multiple of 512 (every group size divides it)");
    if (!mib) {
        size_t llc = 32;
        FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
        if (f) {
            unsigned long v = 0;
            if (fscanf(f, "%lu", &v) == 1 && v) llc = (v + 1023) / 1024;
            fclose(f);
        }
        mib = 8 * llc < 256 ? 256 : 8 * llc;
    }
    if (mib < 16 || mib > 65536) die("--mib: give 16..65536");
    if (!npf) pfs[npf++] = PLN_CPU_PF_AHEAD_DEFAULT;
    size_t bytes = mib << 20;
    print_machine(argc, argv, bytes, K);

    pln_backend *be = pln_backend_create("cpu", 0);
    if (!be) die("no cpu backend");
    int all = omp_get_max_threads();
    printf("# pollen cpu tier %s, threads 1 and %d; median (best) of %d passes\n",
           pln_cpu_isa_name(pln_cpu_of(be)->isa), all, passes);

    uint8_t *src = xalloc(bytes), *dst = xalloc(bytes);
    fill(src, bytes);
    memset(dst, 1, bytes);
    float *x = xalloc((size_t)K * sizeof(float));
    for (int64_t i = 0; i < K; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;

    int nths[2] = {1, all};
    double copy_gbs[2], read_gbs[2];
    printf("%-20s %8s %22s %22s\n", "", "", "1 thread", "all threads");
    printf("%-20s %8s %22s %22s\n", "", "", "GB/s      % of copy", "GB/s      % of copy");
    for (int t = 0; t < 2; t++) {
        double tc[1000], tr[1000];
        time_copy(dst, src, bytes, nths[t]);
        for (int p = 0; p < passes; p++) tc[p] = time_copy(dst, src, bytes, nths[t]);
        for (int p = 0; p < passes; p++) tr[p] = time_read(src, bytes, nths[t]);
        timing c = summarize(tc, passes), r = summarize(tr, passes);
        copy_gbs[t] = 2.0 * (double)bytes / c.med / 1e9;
        read_gbs[t] = (double)bytes / r.med / 1e9;
        printf("# %s: copy %.1f (%.1f) GB/s, read %.1f (%.1f) GB/s\n", t ? "all threads" : "1 thread", copy_gbs[t],
               2.0 * (double)bytes / c.best / 1e9, read_gbs[t], (double)bytes / r.best / 1e9);
    }
    printf("%-20s %8.1f %8s %13.1f %8s   (STREAM copy, read + written)\n", "copy", copy_gbs[0], "100", copy_gbs[1],
           "100");
    printf("%-20s %8.1f %8.0f %13.1f %8.0f\n", "read", read_gbs[0], 100 * read_gbs[0] / copy_gbs[0], read_gbs[1],
           100 * read_gbs[1] / copy_gbs[1]);

    static const kind kinds[] = {
        {"fp16", PLN_DTYPE_F16, 0, 16}, {"int8 row", PLN_DTYPE_I8, 0, 8}, {"int8 g32", PLN_DTYPE_I8, 32, 8},
        {"int4 g32", PLN_DTYPE_U8, 32, 4}, {"int4 g128", PLN_DTYPE_U8, 128, 4},
    };
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        const kind *kd = &kinds[ki];
        int64_t G = kd->group ? kd->group : K;
        /* rows so that the weights (plus scales) fill the matrix size */
        double row_bytes = (double)K * kd->wbits / 8 + (kd->dtype == PLN_DTYPE_F16 ? 0 : 2.0 * (double)(K / G));
        int64_t R = (int64_t)((double)bytes / row_bytes) / 64 * 64;
        size_t wb = (size_t)(R * K * kd->wbits / 8), sb = kd->dtype == PLN_DTYPE_F16 ? 0 : (size_t)(R * (K / G)) * 2;
        pln_weight W;
        memset(&W, 0, sizeof W);
        W.dtype = kd->dtype;
        W.rows = R;
        W.cols = K;
        W.group = kd->dtype == PLN_DTYPE_F16 ? 0 : G;
        uint8_t *w = src;   /* the copy's source, reused: any bytes are weights */
        uint16_t *sc = NULL;
        if (wb + sb > bytes) die("internal: matrix larger than the buffer");
        if (kd->dtype == PLN_DTYPE_F16) {
            uint16_t *h = (uint16_t *)(void *)w;   /* finite values: sign, exponent around 1, mantissa */
            for (size_t i = 0; i < wb / 2; i++) h[i] = (uint16_t)(0x3800 | (next() & 0x83ff));
        } else {
            sc = (uint16_t *)(void *)(w + wb);
            for (size_t i = 0; i < sb / 2; i++) sc[i] = pln_f32_to_f16(0.01f);
        }
        W.w = w;
        W.scale = sc;
        float *out = xalloc((size_t)R * sizeof(float));
        if (be->set_int_dot) be->set_int_dot(be, kd->dtype == PLN_DTYPE_U8);
        double gbs[2][16];
        for (int t = 0; t < 2; t++) {
            static double tm[16][1000];
            pln_cpu_set_threads(be, nths[t]);
            if (be->linear(be, out, x, &W, NULL, 1, false)) die("linear failed");
            /* the distances in turn within each pass, so a disturbance hits them alike */
            for (int p = 0; p < passes; p++)
                for (int d = 0; d < npf; d++) {
                    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) pln_cpu_pf_by_kind[k] = pfs[d];
                    double t0 = now();
                    if (be->linear(be, out, x, &W, NULL, 1, false)) die("linear failed");
                    tm[d][p] = now() - t0;
                }
            for (int d = 0; d < npf; d++) {
                timing m = summarize(tm[d], passes);
                gbs[t][d] = (double)(wb + sb) / m.med / 1e9;
            }
        }
        for (int d = 0; d < npf; d++) {
            char label[48];
            if (npf > 1)
                snprintf(label, sizeof label, "%s pf %lld%s", kd->name, (long long)(pfs[d] & ~(int64_t)PLN_TUNE_PF_L2),
                         pfs[d] & PLN_TUNE_PF_L2 ? " l2" : "");
            else snprintf(label, sizeof label, "%s", kd->name);
            printf("%-20s %8.1f %8.0f %13.1f %8.0f\n", label, gbs[0][d], 100 * gbs[0][d] / copy_gbs[0], gbs[1][d],
                   100 * gbs[1][d] / copy_gbs[1]);
        }
        free(out);
    }
    free(src);
    free(dst);
    free(x);
    pln_backend_destroy(be);
    return 0;
}
