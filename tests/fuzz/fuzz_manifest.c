/* fuzz_manifest.c — libFuzzer target for the shard-set reader: any bytes as DIR/manifest.json, then
 * pln_shardset_open(DIR). A set it accepts must satisfy what callers rely on (tp, file names and
 * paths, dtype, vocab padding, config), and opening rank 0 must fail cleanly on the placeholder
 * rank files. Helpers are static and prefixed fm_: tests/test_fuzz_regress.c includes every target
 * into one file. */
#include "formats/shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The set's rank files are only stat()ed for existence and size, so sparse placeholders of the sizes
 * recorded in tests/fuzz/seeds/fuzz_manifest/ (made by `pollen reshard` from
 * tests/fixtures/models/bloom-4h/fp16-st) let inputs reach acceptance. The two TP 2 seeds record
 * different sizes for the same names, so each input is tried in two directories:
 *   fp16 TP 2: rank-{0,1}-of-2.pln 253952 bytes each; fp16 TP 1: rank-0-of-1.pln 417792 bytes;
 *   int8 TP 2 (--group-size 8): rank-{0,1}-of-2.pln 249856 bytes each. */
typedef struct { const char *name; long size; } fm_placeholder;
/* The small files every directory holds, byte for byte those the version-2 seeds record the
 * checksums of: the seeds were made by `pollen reshard` from a copy of
 * tests/fixtures/models/bloom-4h/fp16-st whose config.json and tokenizer.json were these. */
#define FM_CONFIG_JSON "{\"model_type\": \"bloom\", \"vocab_size\": 1003, \"hidden_size\": 64, \"n_head\": 4, " \
                       "\"n_layer\": 2, \"layer_norm_epsilon\": 1e-05, \"bos_token_id\": 1, \"eos_token_id\": 2, "  \
                       "\"pad_token_id\": 3, \"torch_dtype\": \"float16\"}\n"
#define FM_TOKENIZER_JSON "{\"fuzz_manifest\": \"placeholder tokenizer\"}\n"
static const struct { const char *name, *text; } fm_small[2] = {{"config.json", FM_CONFIG_JSON}, {"tokenizer.json", FM_TOKENIZER_JSON}};
static const fm_placeholder fm_set_a[] = {{"rank-0-of-2.pln", 253952}, {"rank-1-of-2.pln", 253952}, {"rank-0-of-1.pln", 417792}};
static const fm_placeholder fm_set_b[] = {{"rank-0-of-2.pln", 249856}, {"rank-1-of-2.pln", 249856}};
static const struct { const fm_placeholder *files; size_t n; } fm_sets[2] = {{fm_set_a, 3}, {fm_set_b, 2}};

static char fm_root[512];         /* the per-process scratch directory ("" until made) */
static char fm_dirs[2][600];      /* fm_root/a, fm_root/b */
static int fm_state;              /* 0 not yet tried, 1 ready, -1 failed */
static long fm_accepted;          /* inputs accepted so far: test_fuzz_regress checks the seeds get there */

static void fm_cleanup(void) {
    char p[1300];   /* room for any fm_dirs row plus a name, as the compiler counts it */
    for (size_t d = 0; d < 2; d++) {
        for (size_t i = 0; i < fm_sets[d].n; i++) {
            snprintf(p, sizeof p, "%s/%s", fm_dirs[d], fm_sets[d].files[i].name);
            unlink(p);
        }
        for (size_t i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/%s", fm_dirs[d], fm_small[i].name);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s", fm_dirs[d], PLN_MANIFEST_NAME);
        unlink(p);
        rmdir(fm_dirs[d]);
    }
    rmdir(fm_root);
}

static const char *fm_tmp_base(void) {
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

static int fm_setup(void) {
    if (fm_state) return fm_state;
    fm_state = -1;
    snprintf(fm_root, sizeof fm_root, "%s/pln-fuzz-manifest-XXXXXX", fm_tmp_base());
    if (!mkdtemp(fm_root)) { perror(fm_root); fm_root[0] = 0; return -1; }
    atexit(fm_cleanup);
    for (size_t d = 0; d < 2; d++) {
        snprintf(fm_dirs[d], sizeof fm_dirs[d], "%s/%c", fm_root, (char)('a' + d));
        if (mkdir(fm_dirs[d], 0700) != 0) { perror(fm_dirs[d]); return -1; }
        for (size_t i = 0; i < fm_sets[d].n; i++) {
            char p[1300];   /* room for any fm_dirs row plus a name, as the compiler counts it */
            snprintf(p, sizeof p, "%s/%s", fm_dirs[d], fm_sets[d].files[i].name);
            FILE *f = fopen(p, "wb");
            if (!f || ftruncate(fileno(f), fm_sets[d].files[i].size) != 0) { perror(p); if (f) fclose(f); return -1; }
            fclose(f);
        }
        for (size_t i = 0; i < 2; i++) {
            char p[1300];
            snprintf(p, sizeof p, "%s/%s", fm_dirs[d], fm_small[i].name);
            FILE *f = fopen(p, "wb");
            size_t n = strlen(fm_small[i].text);
            if (!f || fwrite(fm_small[i].text, 1, n, f) != n) { perror(p); if (f) fclose(f); return -1; }
            if (fclose(f) != 0) { perror(p); return -1; }
        }
    }
    fm_state = 1;
    return 1;
}

/* path must be exactly DIR "/" name with name a plain file name (no '/') */
static void fm_check_path(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (!path || strncmp(path, dir, n) || path[n] != '/' || !path[n + 1] || strchr(path + n + 1, '/')) __builtin_trap();
}

static void fm_check(const pln_shardset *set, const char *dir) {
    if (!set->dir || strcmp(set->dir, dir)) __builtin_trap();
    if (set->tp < 1 || set->tp > 4096 || !set->files) __builtin_trap();
    if (strcmp(set->dtype, "fp16") && strcmp(set->dtype, "int8")) __builtin_trap();
    if (set->group_size < 0) __builtin_trap();
    const pln_bloom_config *c = &set->config;
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->n_head < 1 || c->n_layer < 1 || c->hidden_size % c->n_head)
        __builtin_trap();
    if (c->n_head % set->tp) __builtin_trap();
    if (set->vocab_padded < c->vocab_size || set->vocab_padded % set->tp) __builtin_trap();
    for (int32_t r = 0; r < set->tp; r++) {
        const pln_shardset_file *f = &set->files[r];
        char want[64];
        snprintf(want, sizeof want, "rank-%d-of-%d.pln", (int)r, (int)set->tp);
        if (strcmp(f->name, want) || strchr(f->name, '/')) __builtin_trap();
        fm_check_path(f->path, dir);
        if (strcmp(f->path + strlen(dir) + 1, f->name)) __builtin_trap();
    }
    if (set->tokenizer_path) fm_check_path(set->tokenizer_path, dir);
    if (set->config_path) fm_check_path(set->config_path, dir);
    /* an accepted config agrees with config.json, the only one the directories hold */
    if (set->config_path && (c->vocab_size != 1003 || c->hidden_size != 64 || c->n_head != 4 || c->n_layer != 2)) __builtin_trap();
    if (set->small_files_checked != (set->version >= 2)) __builtin_trap();
    /* placeholders are all zeros: the rank reader must refuse them, and refuse ranks outside tp */
    pln_shard *s = pln_shardset_open_rank(set, 0);
    if (s) __builtin_trap();
    if (pln_shardset_open_rank(set, set->tp) || pln_shardset_open_rank(set, -1)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fm_setup() != 1) return 0;
    for (size_t d = 0; d < 2; d++) {
        char p[1300];   /* room for any fm_dirs row plus a name, as the compiler counts it */
        snprintf(p, sizeof p, "%s/%s", fm_dirs[d], PLN_MANIFEST_NAME);
        FILE *f = fopen(p, "wb");
        if (!f) continue;
        size_t w = size ? fwrite(data, 1, size, f) : 0;
        if (fclose(f) != 0 || w != size) continue;
        pln_shardset *set = pln_shardset_open(fm_dirs[d]);
        if (!set) continue;
        fm_check(set, fm_dirs[d]);
        fm_accepted++;
        pln_shardset_close(set);
    }
    return 0;
}
