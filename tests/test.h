/* test.h — the tiny test harness every tests/test_*.c uses.
 * CHECK counts a pass or prints "FAIL file:line: message"; test_done() prints
 * "<name>: N passed, N failed" and returns the exit status. Tests run from the repository root
 * (fixtures at tests/fixtures/...); scratch files go under test_tmpdir(). */
#ifndef PLN_TEST_H
#define PLN_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

static int t_pass, t_fail;
static const char *t_name = "test";

#define CHECK(cond, ...) do { \
    if (cond) { t_pass++; } \
    else { t_fail++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* Like CHECK but also prints "OK"/"NOT OK" with the value, for numeric comparisons. */
#define CHECK_CLOSE(got, want, tol, what) do { \
    double g_ = (double)(got), w_ = (double)(want), d_ = fabs(g_ - w_); \
    CHECK(d_ <= (tol), "%s: got %.9g want %.9g (|diff| %.3g > tol %.3g)", (what), g_, w_, d_, (double)(tol)); \
    } while (0)

static inline void test_begin(const char *name) { t_name = name; }

static inline int test_done(void) {
    printf("%s: %d passed, %d failed\n", t_name, t_pass, t_fail);
    return t_fail ? 1 : 0;
}

/* A fresh scratch directory (removed by tests/run.sh's parent temp dir cleanup). */
static inline const char *test_tmpdir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *base = getenv("PLN_TEST_TMP");
        if (!base) base = getenv("TMPDIR");
        if (!base) base = "/tmp";
        snprintf(dir, sizeof dir, "%s/pln-%s-XXXXXX", base, t_name);
        if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    }
    return dir;
}

/* Relative L2 error ||a-b|| / ||b||. */
static inline double test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
