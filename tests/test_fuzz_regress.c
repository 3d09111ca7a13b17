/* test_fuzz_regress.c — replays every saved fuzz input (tests/fuzz/regressions/<target>/, plus the
 * seeds in tests/fuzz/seeds/<target>/) through its fuzz target, in the normal and the sanitizer
 * build, so a crash found once by `make fuzz` stays fixed. The targets are compiled in here with
 * their entry point renamed, so fuzz_*.c files must keep their helpers static and uniquely named. */
#include "tests/test.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>

typedef int (*fuzz_fn)(const uint8_t *, size_t);

#define LLVMFuzzerTestOneInput fuzz_one_safetensors
#include "tests/fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_one_torchzip
#include "tests/fuzz/fuzz_torchzip.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_one_hfconfig
#include "tests/fuzz/fuzz_hfconfig.c"
#undef LLVMFuzzerTestOneInput
#if __has_include("tests/fuzz/fuzz_shard.c")
#define LLVMFuzzerTestOneInput fuzz_one_shard
#include "tests/fuzz/fuzz_shard.c"
#undef LLVMFuzzerTestOneInput
#define HAVE_FUZZ_SHARD 1
#endif
#if __has_include("tests/fuzz/fuzz_request.c")
#define LLVMFuzzerTestOneInput fuzz_one_request
#include "tests/fuzz/fuzz_request.c"
#undef LLVMFuzzerTestOneInput
#define HAVE_FUZZ_REQUEST 1
#endif
#if __has_include("tests/fuzz/fuzz_manifest.c")
#define LLVMFuzzerTestOneInput fuzz_one_manifest
#include "tests/fuzz/fuzz_manifest.c"
#undef LLVMFuzzerTestOneInput
#define HAVE_FUZZ_MANIFEST 1
#endif

#if __has_include("tests/fuzz/fuzz_jinja.c")
#define LLVMFuzzerTestOneInput fuzz_one_jinja
#include "tests/fuzz/fuzz_jinja.c"
#undef LLVMFuzzerTestOneInput
#define HAVE_FUZZ_JINJA 1
#endif

static const struct { const char *name; fuzz_fn fn; } g_targets[] = {
    {"fuzz_safetensors", fuzz_one_safetensors},
    {"fuzz_torchzip", fuzz_one_torchzip},
    {"fuzz_hfconfig", fuzz_one_hfconfig},
#ifdef HAVE_FUZZ_SHARD
    {"fuzz_shard", fuzz_one_shard},
#endif
#ifdef HAVE_FUZZ_REQUEST
    {"fuzz_request", fuzz_one_request},
#endif
#ifdef HAVE_FUZZ_MANIFEST
    {"fuzz_manifest", fuzz_one_manifest},
#endif
#ifdef HAVE_FUZZ_JINJA
    {"fuzz_jinja", fuzz_one_jinja},
#endif
};

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    *n = len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    fclose(f);
    return b;
}

/* Runs fn over every regular file in dir; returns how many. */
static int replay_dir(const char *dir, fuzz_fn fn) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        size_t n;
        uint8_t *b = slurp(path, &n);
        if (!b) continue;
        /* libFuzzer hands the target an exact-size heap copy; do the same so ASan sees overreads */
        uint8_t *exact = malloc(n ? n : 1);
        memcpy(exact, b, n);
        int rc = fn(exact, n);
        CHECK(rc == 0, "%s: target returned %d", path, rc);
        free(exact);
        free(b);
        count++;
    }
    closedir(d);
    return count;
}

int main(void) {
    test_begin("test_fuzz_regress");
    for (size_t i = 0; i < sizeof g_targets / sizeof g_targets[0]; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fuzz/regressions/%s", g_targets[i].name);
        int nr = replay_dir(dir, g_targets[i].fn);
        snprintf(dir, sizeof dir, "tests/fuzz/seeds/%s", g_targets[i].name);
        int ns = replay_dir(dir, g_targets[i].fn);
        CHECK(1, "replayed");
        printf("  %-18s %d regression inputs, %d seeds replayed without a crash\n", g_targets[i].name, nr, ns);
    }
#ifdef HAVE_FUZZ_MANIFEST
    /* the six seed manifests (TP 2 fp16, TP 2 int8, TP 1; versions 1 and 2) must pass the placeholder rank files'
     * size checks and be accepted, or the target would only ever exercise the rejection paths */
    CHECK(fm_state == 1, "fuzz_manifest: scratch directory made (%s)", fm_root);
    CHECK(fm_accepted >= 6, "fuzz_manifest: %ld inputs accepted by pln_shardset_open (want >= 6: every seed)", fm_accepted);
#endif
    /* a regressions folder whose target is not compiled in here would be silently skipped: say so */
    DIR *d = opendir("tests/fuzz/regressions");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        bool known = false;
        for (size_t i = 0; i < sizeof g_targets / sizeof g_targets[0]; i++) known |= !strcmp(e->d_name, g_targets[i].name);
        CHECK(known, "tests/fuzz/regressions/%s has no matching fuzz target in test_fuzz_regress.c", e->d_name);
    }
    if (d) closedir(d);
    return test_done();
}
