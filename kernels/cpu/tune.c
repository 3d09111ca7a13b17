/* tune.c — the CPU backend's per-machine calibration: how far ahead the batch-1 GEMVs prefetch.
 *
 * CPU_TUNE_NOTE: the one-token GEMVs (simd_avx512.c PREFETCH_NOTE, simd_avx2.c) ask for the bytes
 * pln_cpu_pf_ahead past the position they read. The best distance is a property of the core and
 * its memory (how many lines the hardware prefetchers already keep in flight, the latency, the
 * bandwidth one core can draw): 8192 B was chosen by measurement on one Zen 5, and on another CPU
 * another distance can stream faster; and it is a property of the loop too: on a Zen 3 the fp16
 * GEMV streamed 30-33 GB/s (2 threads) 1 KiB ahead and 26 at 8 KiB, while int4 g32 streamed 30-31
 * at 8 KiB and 20 at 1 KiB (build/bench/gemv-bw --pf 0,1024,8192, twice, quiet), so one distance
 * for all cost one of them 15-35 %. So the backend measures once per machine and per weight kind
 * (cpu.h pln_cpu_pf_kind: fp16, int8 per row, int8 grouped, int4): a weight of that kind of twice
 * the last-level cache (64 to 128 MiB), the real GEMV (pln_cpu_linear at one token, on the
 * backend's threads, on the path --int-dot auto takes for that kind: the integer dot for int4,
 * the float GEMV for int8) at each candidate distance, PLN_CPU_TUNE_ROUNDS rounds visiting the
 * candidates in turn (a disturbance hits all of them alike), the best pass of each. The fastest
 * wins unless the default is within PLN_CPU_TUNE_KEEP (the tiles: _TILES) of it: then the default, so that noise
 * between equals never moves the choice. pln_cpu_linear then sets each call's distance from its
 * weight's kind. The result is cached per machine (CPU identity, the kernels' tier, threads,
 * memory) in $XDG_CACHE_HOME/pollen/cpu-tune.json (~/.cache without it), so the second or so it
 * takes is spent once. The distance decides only which lines are requested early: no result
 * depends on it (the GEMVs' arithmetic is the same at every value). PLN_CPU_PF_F16B
 * ("fp16_batch") is the fp16 tiles' distance (simd_avx2.c TILE_PF_NOTE), measured the same way on
 * an fp16 linear of TUNE_BATCH tokens; 0 there means no prefetch. */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t pln_cpu_pf_ahead = PLN_CPU_PF_AHEAD_DEFAULT;
int64_t pln_cpu_pf_tiles = PLN_CPU_PF_AHEAD_DEFAULT;
bool pln_cpu_pf_l2 = false;
int64_t pln_cpu_pf_by_kind[PLN_CPU_PF_KINDS] = {PLN_CPU_PF_AHEAD_DEFAULT, PLN_CPU_PF_AHEAD_DEFAULT,
                                                PLN_CPU_PF_AHEAD_DEFAULT, PLN_CPU_PF_AHEAD_DEFAULT,
                                                PLN_CPU_PF_AHEAD_DEFAULT};
const char *const pln_cpu_pf_kind_names[PLN_CPU_PF_KINDS] = {"fp16", "int8", "int8_grouped", "int4", "fp16_batch"};
_Static_assert(PLN_CPU_TUNE_N <= PLN_TUNE_MAX_CANDIDATES, "pln_backend_tune.gbs holds every candidate");
_Static_assert(PLN_CPU_PF_KINDS <= PLN_TUNE_MAX_KINDS, "pln_backend_tune holds every kind");

/* the last the default distance into L2 (PLN_TUNE_PF_L2, cpu.h PF_L2_NOTE), for the GEMVs' kinds
 * only. 16 KiB into L2 as well was tried and not kept: on the Intel VM the 128 MiB test weight
 * read int8 g32 level at 8 and 16 KiB into L2 (26.75 GB/s each) and the pick fell on 16 KiB, at
 * which the Llama-3.2-1B int8 g32 batch-1 step ran 17.7-18.1 tokens/s against 19.0-19.3 at 8
 * KiB into L1: the level is what the test weight shows best, the distance beyond it is not. */
const int64_t pln_cpu_tune_candidates[PLN_CPU_TUNE_N] = {0, 1024, 2048, 4096, 8192, 16384, 8192 | PLN_TUNE_PF_L2};

/* 5: a distance per weight kind and for the fp16 tiles, a GEMV's default kept within 5 % of the
 * fastest (cpu.h PLN_CPU_TUNE_KEEP), 8 KiB into L2 among the candidates (an odd value: 8193,
 * taken by PLN_CPU_TUNE_KEEP_LEVEL's rule); a version-1 file (one distance), version-2 one (no
 * fp16_batch), version-3 one (picked with the default kept within 2 %) or version-4 one (no L2
 * candidate) is pollen's own and is replaced */
#define TUNE_VERSION 5
#define TUNE_MAX_FILE (1 << 20)   /* a cache file larger than this is not pollen's */

int pln_cpu_tune_pick(const double *secs, int n, int dflt, double keep) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (secs[i] > 0 && (best < 0 || secs[i] < secs[best])) best = i;
    if (best < 0) return dflt;
    if (dflt >= 0 && dflt < n && secs[dflt] > 0 && secs[dflt] <= secs[best] * (1.0 + keep)) return dflt;
    return best;
}

int pln_cpu_tune_level(const double *secs, int l1) {
    for (int i = PLN_CPU_TUNE_N_L1; i < PLN_CPU_TUNE_N; i++)
        if (secs[i] > 0 && secs[l1] > 0 && secs[i] * (1.0 + PLN_CPU_TUNE_KEEP_LEVEL) < secs[l1]) return i;
    return l1;
}

static int default_index(void) {
    for (int i = 0; i < PLN_CPU_TUNE_N; i++)
        if (pln_cpu_tune_candidates[i] == PLN_CPU_PF_AHEAD_DEFAULT) return i;
    return -1;
}

/* kind's GEMV at every candidate (PLN_CPU_PF_F16B: an fp16 linear of TUNE_BATCH tokens, which
 * the tiles take); secs[i]: the best pass at candidate i, *bytes_out the bytes each pass reads.
 * Leaves the distances and the integer-dot and batch-invariant settings as it found them. -1 +
 * error when the weight cannot be allocated. */
#define TUNE_BATCH 8
static int measure(pln_cpu *c, pln_cpu_pf_kind kind, double secs[PLN_CPU_TUNE_N], int64_t *bytes_out) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    int64_t bytes = 2 * (int64_t)(llc > 0 ? llc : 32 << 20);
    if (bytes < (64 << 20)) bytes = 64 << 20;
    if (bytes > (128 << 20)) bytes = 128 << 20;
    /* PLN_CPU_TUNE_MIB: another size (1..1024 MiB), for the tests (a sanitized build reads 128 MiB
     * slowly) and for looking at the choice by hand */
    const char *env = getenv("PLN_CPU_TUNE_MIB");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > 1024) return pln_errorf("PLN_CPU_TUNE_MIB %s: give 1..1024", env);
        bytes = (int64_t)v << 20;
    }
    /* the kind's layout (FORMAT.md): fp16; int8 with one scale per row or per 32 columns; int4
     * (two per byte) with one per 32 */
    const bool f16 = kind == PLN_CPU_PF_F16 || kind == PLN_CPU_PF_F16B;
    const int T = kind == PLN_CPU_PF_F16B ? TUNE_BATCH : 1;
    const int64_t K = 4096, G = kind == PLN_CPU_PF_I8G || kind == PLN_CPU_PF_I4 ? 32 : K;
    const int64_t wbits = f16 ? 16 : kind == PLN_CPU_PF_I4 ? 4 : 8;
    const int64_t row_bytes = K * wbits / 8 + (f16 ? 0 : 2 * (K / G));
    const int64_t rows = bytes / row_bytes;
    const size_t wb = (size_t)(rows * K * wbits / 8), sb = f16 ? 0 : (size_t)(rows * (K / G)) * 2;
    bytes = (int64_t)(wb + sb);
    uint8_t *w = aligned_alloc(64, (wb + 63) / 64 * 64);
    uint16_t *sc = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL;
    float *x = malloc((size_t)(T * K) * sizeof *x), *out = malloc((size_t)(T * rows) * sizeof *out);
    if (!w || (sb && !sc) || !x || !out) {
        free(w); free(sc); free(x); free(out);
        return pln_errorf("cpu tune: out of memory for a %lld MiB test weight", (long long)(bytes >> 20));
    }
    /* finite values (F16 0x3c00 = 1.0, int8 and int4 1, scales 2^-10), every page touched before
     * the first timed pass */
    const int64_t nb = (int64_t)wb;
#pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c))
    for (int64_t i = 0; i < nb; i += 2) {
        uint16_t v = f16 ? 0x3c00 : kind == PLN_CPU_PF_I4 ? 0x9999 : 0x0101;
        memcpy(w + i, &v, 2);
    }
    for (size_t i = 0; i < sb / 2; i++) sc[i] = 0x1400;
    for (int64_t k = 0; k < T * K; k++) x[k] = 1.0f / (float)(k % K + 1 + k / K);
    pln_weight W = {.dtype = f16 ? PLN_DTYPE_F16 : kind == PLN_CPU_PF_I4 ? PLN_DTYPE_U8 : PLN_DTYPE_I8,
                    .rows = rows, .cols = K, .w = w, .scale = sc, .group = f16 ? 0 : G};
    int64_t saved = pln_cpu_pf_by_kind[kind];
    bool saved_idot = c->int_dot, saved_bi = c->batch_invariant;
    c->int_dot = kind == PLN_CPU_PF_I4;   /* --int-dot auto's path for the kind */
    c->batch_invariant = false;           /* the GEMV itself, not a 5-token step */
    pln_cpu_linear(c, out, rows, x, &W, rows, NULL, T, PLN_EPI_NONE);   /* warm-up */
    /* the fp16 tiles prefetch into L1 whatever the level: only the plain distances are theirs */
    const int n = kind == PLN_CPU_PF_F16B ? PLN_CPU_TUNE_N_L1 : PLN_CPU_TUNE_N;
    for (int i = 0; i < PLN_CPU_TUNE_N; i++) secs[i] = i < n ? 1e30 : 0.0;   /* 0: not measured */
    for (int r = 0; r < PLN_CPU_TUNE_ROUNDS; r++)
        for (int i = 0; i < n; i++) {
            pln_cpu_pf_by_kind[kind] = pln_cpu_tune_candidates[i];
            double t0 = pln_now();
            pln_cpu_linear(c, out, rows, x, &W, rows, NULL, T, PLN_EPI_NONE);
            double dt = pln_now() - t0;
            if (dt < secs[i]) secs[i] = dt;
        }
    pln_cpu_pf_by_kind[kind] = saved;
    c->int_dot = saved_idot;
    c->batch_invariant = saved_bi;
    *bytes_out = bytes;
    volatile float sink = out[T * rows / 2];
    (void)sink;
    free(w); free(sc); free(x); free(out);
    return 0;
}

/* ---- the cache file ---------------------------------------------------------------------- */

static char *cache_path(void) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return pln_xasprintf("%s/pollen/cpu-tune.json", xdg);
    const char *home = getenv("HOME");
    if (home && home[0] == '/') return pln_xasprintf("%s/.cache/pollen/cpu-tune.json", home);
    return NULL;
}

/* This machine as the cache knows it: the CPU, the kernels' tier, the threads and the memory. */
static char *machine_key(pln_cpu *c) {
    pln_cpu_host h;
    pln_cpu_host_describe(&h);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double gib = pages > 0 && psz > 0 ? (double)pages * (double)psz / (double)(1ull << 30) : 0.0;
    return pln_xasprintf("%s %s (family %d model %d stepping %d), %s, %d threads, %.1f GiB", h.vendor, h.name, h.family,
                         h.model, h.stepping, pln_cpu_isa_name(c->isa), pln_cpu_threads(c), gib);
}

typedef enum { CACHE_NONE, CACHE_OURS, CACHE_FOREIGN } cache_state;

/* Reads the cache file at path: CACHE_NONE when there is none (root NULL), CACHE_OURS with the
 * parsed root, CACHE_FOREIGN (root NULL, why says what) when something else is there. */
static cache_state cache_read(const char *path, json_t **root, char *why, size_t nwhy) {
    *root = NULL;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return CACHE_NONE;   /* writing says why it cannot */
        snprintf(why, nwhy, "cannot be read: %s", strerror(errno));
        return CACHE_FOREIGN;
    }
    if (!S_ISREG(st.st_mode)) { snprintf(why, nwhy, "is not a regular file"); return CACHE_FOREIGN; }
    if (st.st_size > TUNE_MAX_FILE) {
        snprintf(why, nwhy, "is %lld bytes, larger than a cache of pollen's (at most %d)", (long long)st.st_size, TUNE_MAX_FILE);
        return CACHE_FOREIGN;
    }
    json_error_t err;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!j) { snprintf(why, nwhy, "is not JSON (line %d: %s)", err.line, err.text); return CACHE_FOREIGN; }
    json_t *v = json_object_get(j, "version"), *m = json_object_get(j, "machines");
    json_int_t ver = json_is_integer(v) ? json_integer_value(v) : -1;
    if (!json_is_object(j) || ver < 1 || ver > TUNE_VERSION || !json_is_object(m)) {
        snprintf(why, nwhy, "is not a version-%d pollen CPU tune cache (an object with \"version\": %d and "
                 "\"machines\")", TUNE_VERSION, TUNE_VERSION);
        json_decref(j);
        return CACHE_FOREIGN;
    }
    if (ver < TUNE_VERSION) {   /* pollen's own older cache (one distance for every kind, no fp16_batch,
                                 * picked by the 2 % rule, or no L2 candidate): measured again, replaced */
        json_object_set_new(j, "version", json_integer(TUNE_VERSION));
        json_object_set_new(j, "machines", json_object());
    }
    *root = j;
    return CACHE_OURS;
}

/* The cached distances for key, one per kind: 0 and pf[], 1 when there is no entry, -1 (why) when
 * the entry is not one pollen writes. */
static int cache_lookup(json_t *root, const char *key, int64_t pf[PLN_CPU_PF_KINDS], char *why, size_t nwhy) {
    json_t *e = json_object_get(json_object_get(root, "machines"), key);
    if (!e) return 1;
    json_t *o = json_object_get(e, "pf_ahead");
    if (!json_is_object(e) || !json_is_object(o)) {
        snprintf(why, nwhy, "its entry for this machine has no object \"pf_ahead\"");
        return -1;
    }
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) {
        json_t *v = json_object_get(o, pln_cpu_pf_kind_names[k]);
        if (!json_is_integer(v)) {
            snprintf(why, nwhy, "its entry for this machine has no integer \"pf_ahead\" \"%s\"", pln_cpu_pf_kind_names[k]);
            return -1;
        }
        int i = 0;
        while (i < PLN_CPU_TUNE_N && json_integer_value(v) != pln_cpu_tune_candidates[i]) i++;
        if (i == PLN_CPU_TUNE_N) {
            snprintf(why, nwhy, "its entry for this machine has \"pf_ahead\" \"%s\": %lld, not one of the distances "
                     "measured (0, 1024, 2048, 4096, 8192, 16384; 8193: 8192 into L2)", pln_cpu_pf_kind_names[k],
                     (long long)json_integer_value(v));
            return -1;
        }
        pf[k] = pln_cpu_tune_candidates[i];
    }
    return 0;
}

/* Writes root to path atomically (a temporary file in the same directory, then rename), making
 * the directory if needed. -1 + error on failure (nothing half-written is left). */
static int cache_write(const char *path, json_t *root) {
    char *dir = pln_xstrdup(path);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    /* the parents of pollen/ (~/.cache) may be missing too */
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            pln_errorf("cannot create %s: %s", dir, strerror(e));
            free(dir);
            return -1;
        }
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        pln_errorf("cannot create %s: %s", dir, strerror(e));
        free(dir);
        return -1;
    }
    free(dir);
    char *tmp = pln_xasprintf("%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        int e = errno;
        pln_errorf("cannot create %s: %s", tmp, strerror(e));
        free(tmp);
        return -1;
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(4));
    size_t n = text ? strlen(text) : 0;
    int rc = text && write(fd, text, n) == (ssize_t)n && write(fd, "\n", 1) == 1 ? 0 : -1;
    int e = errno;
    free(text);
    if (close(fd) != 0 && !rc) { rc = -1; e = errno; }
    if (!rc && rename(tmp, path) != 0) { rc = -1; e = errno; }
    if (rc) {
        pln_errorf("cannot write %s: %s", path, strerror(e));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

/* {"<candidate>": v[i]} for each candidate with v[i] > 0 (0: not measured) */
static json_t *by_candidate(const double v[PLN_CPU_TUNE_N]) {
    json_t *o = json_object();
    for (int i = 0; i < PLN_CPU_TUNE_N; i++) {
        if (v[i] <= 0) continue;
        char n[24];
        snprintf(n, sizeof n, "%lld", (long long)pln_cpu_tune_candidates[i]);
        json_object_set_new(o, n, json_real(v[i]));
    }
    return o;
}

/* The time now as the cache records it ("" if the clock cannot say) */
static void utc_now(char when[32]) {
    time_t now = time(NULL);
    struct tm tm;
    when[0] = '\0';
    if (gmtime_r(&now, &tm)) strftime(when, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- the mode ---------------------------------------------------------------------------- */

/* The distances in use, reported in out. */
static void report(pln_backend_tune *out, const char *source) {
    out->source = source;
    out->n_kinds = PLN_CPU_PF_KINDS;
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) {
        out->kind[k] = pln_cpu_pf_kind_names[k];
        out->pf_ahead[k] = pln_cpu_pf_by_kind[k];
    }
}

int pln_cpu_tune(pln_backend *be, const char *mode, pln_backend_tune *out) {
    pln_cpu *c = pln_cpu_of(be);
    memset(out, 0, sizeof *out);
    if (!mode || !*mode) mode = "off";
    if (strcmp(mode, "auto") && strcmp(mode, "off") && strcmp(mode, "redo"))
        return pln_errorf("cpu_tune \"%s\" is not one of auto, off, redo", mode);
    if (!strcmp(mode, "off")) {
        for (int k = 0; k < PLN_CPU_PF_KINDS; k++) pln_cpu_pf_by_kind[k] = PLN_CPU_PF_AHEAD_DEFAULT;
        report(out, "off");
        return 0;
    }
    char *path = cache_path(), *key = machine_key(c);
    char why[320] = "";
    json_t *root = NULL;
    cache_state cs = path ? cache_read(path, &root, why, sizeof why) : CACHE_NONE;
    if (cs == CACHE_FOREIGN)
        snprintf(out->warning, sizeof out->warning, "%s %s; the CPU tune is measured but not cached (the file is "
                 "left as it is: move it away to cache again)", path, why);
    if (cs == CACHE_OURS && !strcmp(mode, "auto")) {
        int64_t pf[PLN_CPU_PF_KINDS];
        int lr = cache_lookup(root, key, pf, why, sizeof why);
        if (lr == 0) {
            memcpy(pln_cpu_pf_by_kind, pf, sizeof pf);
            report(out, "cached");
            json_decref(root);
            free(path); free(key);
            return 0;
        }
        if (lr < 0)
            snprintf(out->warning, sizeof out->warning, "%s: %s; measuring again", path, why);
    }
    double secs[PLN_CPU_PF_KINDS][PLN_CPU_TUNE_N];
    int64_t bytes[PLN_CPU_PF_KINDS];
    int64_t pick[PLN_CPU_PF_KINDS];
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) {
        if (measure(c, (pln_cpu_pf_kind)k, secs[k], &bytes[k])) {
            json_decref(root);
            free(path); free(key);
            return -1;
        }
        double keep = k == PLN_CPU_PF_F16B ? PLN_CPU_TUNE_KEEP_TILES : PLN_CPU_TUNE_KEEP;
        pick[k] = pln_cpu_tune_candidates[pln_cpu_tune_level(secs[k], pln_cpu_tune_pick(secs[k], PLN_CPU_TUNE_N_L1, default_index(), keep))];
    }
    memcpy(pln_cpu_pf_by_kind, pick, sizeof pick);
    report(out, "measured");
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++)
        for (int i = 0; i < PLN_CPU_TUNE_N; i++) out->gbs[k][i] = secs[k][i] > 0 ? (double)bytes[k] / secs[k][i] / 1e9 : 0.0;
    if (path && cs != CACHE_FOREIGN) {
        if (!root) root = json_pack("{s:i, s:{}}", "version", TUNE_VERSION, "machines");
        json_t *pfo = json_object(), *g = json_object();
        for (int k = 0; k < PLN_CPU_PF_KINDS; k++) {
            json_object_set_new(pfo, pln_cpu_pf_kind_names[k], json_integer(pick[k]));
            json_object_set_new(g, pln_cpu_pf_kind_names[k], by_candidate(out->gbs[k]));
        }
        char when[32];
        utc_now(when);
        json_object_set_new(json_object_get(root, "machines"), key,
                            json_pack("{s:o, s:o, s:I, s:s}", "pf_ahead", pfo, "gemv_gbs", g, "weight_mib",
                                      (json_int_t)(bytes[PLN_CPU_PF_F16] >> 20), "measured_at", when));
        if (cache_write(path, root))
            snprintf(out->warning, sizeof out->warning, "cpu tune: %s; measured again at each start until it can "
                     "be written (--cpu-tune off skips the measurement)", pln_error());
    }
    json_decref(root);
    free(path); free(key);
    return 0;
}

/* ---- on the model's own steps ------------------------------------------------------------ */

/* CPU_TUNE_MODEL_NOTE: the test weight above is one long stream; a model's step is a few hundred
 * smaller ones (Llama-3.2-1B: 12, 8, 64 and 32 MiB in fp16 per layer, then the head), each
 * started cold after a norm or attention and each ending where its prefetch runs on past it, so
 * the distance that streams one weight fastest is not always the model's. On the Intel Xeon VM
 * (AVX-512, 2 threads) the test weight put fp16 at 8 KiB into L2, where the Llama-3.2-1B fp16
 * batch-1 step ran 11.1-11.2 tokens/s, against 11.9-12.1 at 2 KiB into L1, which the weight had
 * ranked 5-7 % behind; it put int8 g32 5-9 % faster into L2, and the model ran 6 % slower so
 * (2026-12-05, docs/BENCHMARKS.md). So once a model is loaded, the engine (one process, TP 1)
 * hands the backend its decode step, and the backend counts the bytes each weight kind's GEMVs
 * read in one step (count_kinds), then, for each kind with at least PLN_CPU_TUNE_MODEL_SHARE of
 * them, largest first, times the whole step at every candidate, PLN_CPU_TUNE_ROUNDS rounds
 * visiting the candidates in turn, the best step of each, and keeps the fastest unless the test
 * weight's choice is within PLN_CPU_TUNE_KEEP of it (so noise between equals never moves it); the
 * next kind is tried with that one's choice in place. The L2 candidate competes as any other:
 * the model's own step needs no margin for a disagreement (PLN_CPU_TUNE_KEEP_LEVEL). The result
 * is cached beside the machine's, keyed by the machine and the model (its layout, shapes, dtype
 * and bytes, and the integer-dot and batch-invariant modes, which run other kernels), at most
 * TUNE_MODEL_MAX models (the oldest dropped). The step reuses one sequence's KV blocks at one
 * position, so it costs what a decode step costs: 2 + kinds x candidates x rounds steps
 * (Llama-3.2-1B fp16, 2 threads: 23 steps, about 2 s, once). A model whose step reads less
 * than PLN_CPU_TUNE_MODEL_MIB keeps the test weight's choice. */
#define TUNE_MODEL_MAX 32

static int candidate_index(json_t *v) {
    if (!json_is_integer(v)) return -1;
    for (int i = 0; i < PLN_CPU_TUNE_N; i++)
        if (json_integer_value(v) == pln_cpu_tune_candidates[i]) return i;
    return -1;
}

/* The cached choice for key in root's "models": 0 (pf[] set for the kinds it holds), 1 when
 * there is none, -1 (why) when the entry is not one pollen writes. */
static int model_lookup(json_t *root, const char *key, int64_t pf[PLN_CPU_PF_KINDS], char *why, size_t nwhy) {
    json_t *models = json_object_get(root, "models");
    if (!models) return 1;
    if (!json_is_object(models)) { snprintf(why, nwhy, "its \"models\" is not an object"); return -1; }
    json_t *e = json_object_get(models, key), *o = json_object_get(e, "pf_ahead");
    if (!e) return 1;
    if (!json_is_object(o)) { snprintf(why, nwhy, "its entry for this model has no object \"pf_ahead\""); return -1; }
    const char *name;
    json_t *v;
    json_object_foreach(o, name, v) {
        int k = 0;
        while (k < PLN_CPU_PF_F16B && strcmp(name, pln_cpu_pf_kind_names[k])) k++;
        int i = candidate_index(v);
        if (k == PLN_CPU_PF_F16B || i < 0) {
            snprintf(why, nwhy, "its entry for this model has \"pf_ahead\" \"%.40s\" not a GEMV kind (fp16, int8, "
                     "int8_grouped, int4) with one of the distances measured", name);
            return -1;
        }
        pf[k] = pln_cpu_tune_candidates[i];
    }
    return 0;
}

/* Drops the oldest entries of root's "models" until fewer than TUNE_MODEL_MAX are left. */
static void models_trim(json_t *models) {
    while (json_object_size(models) >= TUNE_MODEL_MAX) {
        const char *name, *oldest = NULL, *oldest_at = NULL;
        json_t *v;
        json_object_foreach(models, name, v) {
            const char *at = json_string_value(json_object_get(v, "measured_at"));
            if (!at) at = "";
            if (!oldest || strcmp(at, oldest_at) < 0) { oldest = name; oldest_at = at; }
        }
        json_object_del(models, oldest);
    }
}

int pln_cpu_tune_model(pln_backend *be, const char *mode, const char *model_key, int (*step)(void *ctx), void *ctx,
                       bool quiet, pln_backend_tune *out) {
    pln_cpu *c = pln_cpu_of(be);
    out->model_source = NULL;
    memset(out->model_ms, 0, sizeof out->model_ms);
    if (!mode || !*mode) mode = "off";
    if (strcmp(mode, "auto") && strcmp(mode, "off") && strcmp(mode, "redo"))
        return pln_errorf("cpu_tune \"%s\" is not one of auto, off, redo", mode);
    if (!strcmp(mode, "off") || c->isa == PLN_CPU_ISA_REF) return 0;   /* the reference tier prefetches nothing */
    char *path = cache_path(), *mkey = machine_key(c), *key = pln_xasprintf("%s | %s", mkey, model_key);
    free(mkey);
    char why[320] = "";
    json_t *root = NULL;
    cache_state cs = path ? cache_read(path, &root, why, sizeof why) : CACHE_NONE;
    int rc = 0;
    if (cs == CACHE_OURS && !strcmp(mode, "auto")) {
        int64_t pf[PLN_CPU_PF_KINDS];
        memcpy(pf, pln_cpu_pf_by_kind, sizeof pf);
        int lr = model_lookup(root, key, pf, why, sizeof why);
        if (lr == 0) {
            memcpy(pln_cpu_pf_by_kind, pf, sizeof pf);
            out->model_source = "cached";
            report(out, out->source);
            goto done;
        }
        if (lr < 0 && !out->warning[0])
            snprintf(out->warning, sizeof out->warning, "%s: %s; measuring again", path, why);
    }
    /* which kinds the step reads, and how much: one step counted, one more to warm up */
    memset(c->kind_bytes, 0, sizeof c->kind_bytes);
    c->count_kinds = true;
    rc = step(ctx);
    c->count_kinds = false;
    if (!rc) rc = step(ctx);
    if (rc) goto done;
    int64_t total = 0;
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++) total += c->kind_bytes[k];
    int64_t floor_mib = PLN_CPU_TUNE_MODEL_MIB;
    const char *env = getenv("PLN_CPU_TUNE_MODEL_MIB");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > 1 << 20) { rc = pln_errorf("PLN_CPU_TUNE_MODEL_MIB %s: give 0..1048576", env); goto done; }
        floor_mib = v;
    }
    if (total == 0 || total < floor_mib << 20) goto done;   /* out of memory's reach: the test weight's choice */
    int order[PLN_CPU_PF_KINDS], n_kinds = 0;
    for (int k = 0; k < PLN_CPU_PF_KINDS; k++)
        if (c->kind_bytes[k] > 0 && (double)c->kind_bytes[k] >= PLN_CPU_TUNE_MODEL_SHARE * (double)total) order[n_kinds++] = k;
    for (int a = 1; a < n_kinds; a++)   /* largest first */
        for (int b = a; b > 0 && c->kind_bytes[order[b]] > c->kind_bytes[order[b - 1]]; b--) {
            int t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
        }
    if (!quiet)
        fprintf(stderr, "pollen: cpu tune: timing this model's decode step at each prefetch distance (%d steps, once per "
                "machine and model; --cpu-tune off skips it)\n", n_kinds * PLN_CPU_TUNE_N * PLN_CPU_TUNE_ROUNDS);
    double secs[PLN_CPU_PF_KINDS][PLN_CPU_TUNE_N];
    for (int o = 0; o < n_kinds && !rc; o++) {
        int k = order[o], cur = 0;
        while (cur < PLN_CPU_TUNE_N - 1 && pln_cpu_tune_candidates[cur] != pln_cpu_pf_by_kind[k]) cur++;
        for (int i = 0; i < PLN_CPU_TUNE_N; i++) secs[k][i] = 1e30;
        for (int r = 0; r < PLN_CPU_TUNE_ROUNDS && !rc; r++)
            for (int i = 0; i < PLN_CPU_TUNE_N && !rc; i++) {
                pln_cpu_pf_by_kind[k] = pln_cpu_tune_candidates[i];
                double t0 = pln_now();
                rc = step(ctx);
                double dt = pln_now() - t0;
                if (dt < secs[k][i]) secs[k][i] = dt;
            }
        pln_cpu_pf_by_kind[k] = pln_cpu_tune_candidates[pln_cpu_tune_pick(secs[k], PLN_CPU_TUNE_N, cur, PLN_CPU_TUNE_KEEP)];
        for (int i = 0; i < PLN_CPU_TUNE_N; i++) out->model_ms[k][i] = secs[k][i] * 1e3;
    }
    if (rc) goto done;
    out->model_source = "measured";
    report(out, out->source);
    if (path && cs != CACHE_FOREIGN) {
        if (!root) root = json_pack("{s:i, s:{}}", "version", TUNE_VERSION, "machines");
        json_t *models = json_object_get(root, "models");
        if (!json_is_object(models)) {
            models = json_object();
            json_object_set_new(root, "models", models);
        }
        json_object_del(models, key);   /* replaced, not counted against the others */
        models_trim(models);
        json_t *pfo = json_object(), *ms = json_object();
        for (int o = 0; o < n_kinds; o++) {
            int k = order[o];
            json_object_set_new(pfo, pln_cpu_pf_kind_names[k], json_integer(pln_cpu_pf_by_kind[k]));
            json_object_set_new(ms, pln_cpu_pf_kind_names[k], by_candidate(out->model_ms[k]));
        }
        char when[32];
        utc_now(when);
        json_object_set_new(models, key, json_pack("{s:o, s:o, s:s}", "pf_ahead", pfo, "step_ms", ms, "measured_at", when));
        if (cache_write(path, root) && !out->warning[0])
            snprintf(out->warning, sizeof out->warning, "cpu tune: %s; the model's steps are timed again at each start "
                     "until it can be written (--cpu-tune off skips it)", pln_error());
    }
done:
    c->count_kinds = false;
    json_decref(root);
    free(path); free(key);
    return rc;
}
