/* cmd_synth.c — `pollen synth --model bloom-1b7 -o DIR`: writes a random checkpoint of a supported
 * family in Hugging Face's layout (config.json with the real model's values, sharded safetensors
 * with model.safetensors.index.json, tokenizer.json) for tests and benchmarks, at disk speed. The
 * tensors are the ones the family's TP-1 plan reads (formats/family.h), under the names
 * save_pretrained gives them.
 *
 * Shards are cut in module order like save_pretrained, and inside each file the data is ordered
 * by tensor name like the safetensors library writes it, so a reader sees real-world access
 * patterns. Values come from a xoshiro256** stream per 64 Ki-element block, seeded from (seed,
 * tensor, block): identical for any thread count, generated in parallel a chunk at a time. */
#include "formats/common.h"
#include "formats/family.h"
#include "formats/tp.h"
#include "kernels/pln_math.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SY_BLOCK (1u << 16)          /* elements per independently seeded block */
#define SY_CHUNK_BLOCKS 128          /* blocks per generated chunk (16 MiB of fp16) */

typedef struct { const char *name; int64_t hidden, n_head, n_layer; bool spelled_176b; } sy_model;
/* bigscience/bloom-* config.json values (vocab 250880 for all of them). */
static const sy_model g_models[] = {
    {"bloom-560m", 1024, 16, 24, false}, {"bloom-1b1", 1536, 16, 24, false}, {"bloom-1b7", 2048, 16, 24, false},
    {"bloom-3b", 2560, 32, 30, false},   {"bloom-7b1", 4096, 32, 30, false}, {"bloom-176b", 14336, 112, 70, true},
};

/* Real Llama-family shapes: their config.json as published (meta-llama, mistralai, Qwen). */
typedef struct { const char *name; const char *config; } sy_json_model;
static const sy_json_model g_json_models[] = {
    {"llama-3.2-1b",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 2048,"
     " \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
     " \"head_dim\": 64, \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
     " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
     " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
     " \"attention_bias\": false, \"mlp_bias\": false, \"bos_token_id\": 128000, \"eos_token_id\": 128001}"},
    {"llama-3.1-8b",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 4096,"
     " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
     " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
     " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": false,"
     " \"attention_bias\": false, \"mlp_bias\": false, \"bos_token_id\": 128000, \"eos_token_id\": 128001}"},
    {"llama-3.1-70b",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 8192,"
     " \"intermediate_size\": 28672, \"num_hidden_layers\": 80, \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
     " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
     " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": false,"
     " \"attention_bias\": false, \"mlp_bias\": false, \"bos_token_id\": 128000, \"eos_token_id\": 128001}"},
    {"mistral-7b",
     "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", \"vocab_size\": 32000, \"hidden_size\": 4096,"
     " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
     " \"sliding_window\": 4096, \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}"},
    {"qwen2.5-7b",
     "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 152064, \"hidden_size\": 3584,"
     " \"intermediate_size\": 18944, \"num_hidden_layers\": 28, \"num_attention_heads\": 28, \"num_key_value_heads\": 4,"
     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072, \"max_window_layers\": 28, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000.0, \"sliding_window\": 131072, \"use_sliding_window\": false, \"tie_word_embeddings\": false,"
     " \"bos_token_id\": 151643, \"eos_token_id\": 151643}"},
};
#define SY_KNOWN "bloom-560m, bloom-1b1, bloom-1b7, bloom-3b, bloom-7b1, bloom-176b, llama-3.2-1b, llama-3.1-8b, llama-3.1-70b, mistral-7b, qwen2.5-7b"

/* ---- random numbers ---- */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
typedef struct { uint64_t s[4]; } sy_rng;
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t rng_next(sy_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}
static void rng_seed(sy_rng *r, uint64_t seed, uint64_t tensor, uint64_t block) {
    uint64_t x = seed ^ (tensor * 0x100000001b3ull) ^ (block << 20);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

/* ---- tensors ---- */
typedef enum { SY_WEIGHT, SY_BIAS, SY_LN_WEIGHT, SY_LN_BIAS } sy_kind;
typedef struct {
    char name[PLN_TP_NAME_MAX + 16];   /* with "transformer." */
    int ndim;
    int64_t shape[2];
    sy_kind kind;
    uint64_t nbytes, offset;           /* offset within its file's data buffer */
    int file;
    uint64_t index;                    /* seed stream */
} sy_tensor;

/* Fills n elements starting at element e0 of tensor t (e0 a multiple of SY_BLOCK). */
static void gen_values(const sy_tensor *t, uint64_t seed, bool bf16, uint64_t e0, uint64_t n, uint16_t *out) {
    float lo, span;
    switch (t->kind) {
    case SY_WEIGHT: lo = -0.0346f; span = 0.0692f; break;   /* uniform, std 0.02 (HF's init) */
    case SY_BIAS: lo = -0.02f; span = 0.04f; break;
    case SY_LN_WEIGHT: lo = 0.9f; span = 0.2f; break;
    default: lo = -0.05f; span = 0.1f; break;
    }
    int64_t nblocks = (int64_t)((n + SY_BLOCK - 1) / SY_BLOCK);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        sy_rng r;
        rng_seed(&r, seed, t->index, e0 / SY_BLOCK + (uint64_t)b);
        uint64_t i0 = (uint64_t)b * SY_BLOCK, i1 = i0 + SY_BLOCK < n ? i0 + SY_BLOCK : n;
        for (uint64_t i = i0; i < i1; i += 2) {
            uint64_t v = rng_next(&r);
            float f0 = lo + span * (float)(uint32_t)(v >> 40) * (1.0f / 16777216.0f);
            float f1 = lo + span * (float)(uint32_t)((v >> 8) & 0xffffff) * (1.0f / 16777216.0f);
            out[i] = bf16 ? pln_f32_to_bf16(f0) : pln_f32_to_f16(f0);
            if (i + 1 < i1) out[i + 1] = bf16 ? pln_f32_to_bf16(f1) : pln_f32_to_f16(f1);
        }
    }
}

/* Fault injection for tests: PLN_FAULT_DELAY_MS per write (a slow disk), as in reshard, so a
 * signal can land mid-way on a small model. */
static unsigned g_delay_ms;

static int write_all(int fd, const void *data, size_t n, const char *path) {
    if (g_delay_ms) usleep(g_delay_ms * 1000u);
    const uint8_t *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return pln_errorf("%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const sy_tensor *const *)a)->name, (*(const sy_tensor *const *)b)->name);
}

/* Writes one safetensors file holding tensors[0..n) (data in name order). */
static int write_file(const char *path, sy_tensor **ts, size_t n, uint64_t seed, bool bf16, uint16_t *buf, pln_progress *pg) {
    qsort(ts, n, sizeof *ts, cmp_by_name);
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < ts[i]->ndim; d++) json_array_append_new(shape, json_integer(ts[i]->shape[d]));
        ts[i]->offset = off;
        json_object_set_new(h, ts[i]->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", bf16 ? "BF16" : "F16", "shape", shape,
                                                      "data_offsets", (json_int_t)off, (json_int_t)(off + ts[i]->nbytes)));
        off += ts[i]->nbytes;
    }
    char *hj = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t hl = strlen(hj), padded = (hl + 7) / 8 * 8;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { free(hj); return pln_errorf("%s: cannot create: %s", path, strerror(errno)); }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    char *hp = pln_xmalloc(padded);
    memcpy(hp, hj, hl);
    memset(hp + hl, ' ', padded - hl);
    int rc = write_all(fd, len8, 8, path) || write_all(fd, hp, padded, path) ? -1 : 0;
    free(hj);
    free(hp);
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t numel = ts[i]->nbytes / 2, chunk = (uint64_t)SY_BLOCK * SY_CHUNK_BLOCKS;
        for (uint64_t e0 = 0; e0 < numel && !rc; e0 += chunk) {
            uint64_t m = numel - e0 < chunk ? numel - e0 : chunk;
            gen_values(ts[i], seed, bf16, e0, m, buf);
            rc = write_all(fd, buf, m * 2, path);
            pln_progress_add(pg, m * 2);
        }
    }
    if (close(fd) && !rc) rc = pln_errorf("%s: close failed: %s", path, strerror(errno));
    return rc;
}

static json_t *builtin_config(const sy_model *m, int64_t layers, bool bf16) {
    json_t *c = json_pack("{s:b, s:[s], s:f, s:b, s:b, s:I, s:I, s:f, s:f, s:f, s:s, s:n, s:I, s:I, s:I, s:b, s:b, s:b, s:b, s:s, s:s, s:I, s:b, s:I}",
                          "apply_residual_connection_post_layernorm", 0, "architectures", "BloomForCausalLM",
                          "attention_dropout", 0.0, "attention_softmax_in_fp32", 1, "bias_dropout_fusion", 1,
                          "bos_token_id", (json_int_t)1, "eos_token_id", (json_int_t)2, "hidden_dropout", 0.0,
                          "initializer_range", 0.02, "layer_norm_epsilon", 1e-5, "model_type", "bloom", "n_inner",
                          "offset_alibi", (json_int_t)100, "pad_token_id", (json_int_t)3, "pretraining_tp",
                          (json_int_t)(m->spelled_176b ? 4 : 1), "skip_bias_add", 1, "skip_bias_add_qkv", 0,
                          "slow_but_exact", 0, "masked_softmax_fusion", 1, "torch_dtype", bf16 ? "bfloat16" : "float16",
                          "transformers_version", "4.44.2", "unk_token_id", (json_int_t)0, "use_cache", 1,
                          "vocab_size", (json_int_t)250880);
    /* bigscience/bloom spells the sizes n_embed / num_attention_heads; the small ones do not. */
    json_object_set_new(c, m->spelled_176b ? "n_embed" : "hidden_size", json_integer(m->hidden));
    json_object_set_new(c, m->spelled_176b ? "num_attention_heads" : "n_head", json_integer(m->n_head));
    json_object_set_new(c, "n_layer", json_integer(layers >= 0 ? layers : m->n_layer));
    return c;
}

static const char *find_tokenizer(const char *given) {
    if (given) return given;
    static char path[4200];
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        snprintf(path, sizeof path, "%s/../tests/fixtures/tokenizer/tokenizer.json", exe);
        if (access(path, R_OK) == 0) return path;
    }
    if (access("tests/fixtures/tokenizer/tokenizer.json", R_OK) == 0) return "tests/fixtures/tokenizer/tokenizer.json";
    return NULL;
}

int cmd_synth(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *tok = NULL, *dtype = "fp16";
    uint64_t seed = 0, shard_size = 1000000000ull;
    int64_t layers = -1;
    bool force = false, quiet = false;
    pln_opt opts[] = {
        PLN_O_STR("model", 'm', model, "NAME", SY_KNOWN ", or a config.json", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("output", 'o', out, "CHECKPOINT", "checkpoint directory to create (appears atomically)", .flags = PLN_OPT_REQUIRED),
        PLN_O_INT("seed", 's', seed, 0, INT64_MAX, "S", "random seed (default {})"),
        PLN_O_INT("layers", 0, layers, 0, INT32_MAX, "K", "keep only K layers (config.json says K)"),
        PLN_O_ENUM("dtype", 0, dtype, "fp16|bf16", "stored dtype (default {})"),
        PLN_O_INT("shard-size", 0, shard_size, 1, INT64_MAX, "BYTES", "split the weights into files of at most this size (default 1e9)"),
        PLN_O_STR("tokenizer", 0, tok, "PATH", "tokenizer.json to copy (default: the test fixture's)"),
        PLN_O_FLAG("force", 'f', force, "replace an earlier pollen output (a synth checkpoint or a shard set) at CHECKPOINT"),
        PLN_O_FLAG("quiet", 'q', quiet, "no progress bar"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "synth", .synopsis = "pollen synth --model NAME|CONFIG.json -o CHECKPOINT [options]", .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    bool bf16 = !strcmp(dtype, "bf16");
    pln_cli_restart_with_passive_omp(argc, argv);
    json_t *cfg = NULL;
    const char *cfg_file = NULL;   /* --model given as a file */
    for (size_t i = 0; i < sizeof g_models / sizeof g_models[0]; i++)
        if (!strcmp(model, g_models[i].name)) cfg = builtin_config(&g_models[i], layers, bf16);
    bool builtin_json = false;
    for (size_t i = 0; i < sizeof g_json_models / sizeof g_json_models[0] && !cfg; i++)
        if (!strcmp(model, g_json_models[i].name)) {
            cfg = json_loads(g_json_models[i].config, 0, NULL);
            PLN_ASSERT(cfg);
            builtin_json = true;
        }
    if (!cfg || builtin_json) {
        if (!builtin_json) {
            json_error_t je;
            size_t clen = 0;
            cfg_file = model;
            /* Read through pln_read_small_file: a FIFO or device given as --model is named, not waited on. */
            char *ctext = pln_read_small_file(model, 1u << 20, &clen);
            cfg = ctext ? json_loadb(ctext, clen, 0, &je) : NULL;
            free(ctext);
            if (!cfg || !json_is_object(cfg))
                pln_die("--model %s: not a known model (" SY_KNOWN ") nor a readable config.json (%s)",
                        model, cfg ? "not an object" : ctext ? je.text : pln_error());
        }
        json_t *mt = json_object_get(cfg, "model_type");
        const pln_family *f = pln_family_by_model_type(json_is_string(mt) ? json_string_value(mt) : NULL);
        if (!f) pln_die("--model %s: %s", model, pln_error());
        if (layers >= 0) json_object_set_new(cfg, f->layers_key, json_integer(layers));
        json_object_set_new(cfg, "torch_dtype", json_string(bf16 ? "bfloat16" : "float16"));
    }
    pln_hf_config bc;
    if (pln_hf_config_from_json(cfg, model, &bc)) pln_die("%s", pln_error());
    const pln_family *fam = pln_family_of(&bc);

    /* The tensors the family's TP-1 plan reads, in its order (the forward pass's, which is about
     * the module order save_pretrained iterates), each fused entry's sources one by one. */
    pln_tp_entry *plan = NULL;
    size_t np = 0;
    if (fam->tp_plan(&bc, &(pln_tp_opts){.tp = 1}, 0, &plan, &np)) pln_die("--model %s: %s", model, pln_error());
    size_t nt = 0, k = 0;
    for (size_t i = 0; i < np; i++)
        if (plan[i].transform != PLN_TP_QUANT_SCALE) nt += plan[i].n_segs ? (size_t)plan[i].n_segs : 1;
    sy_tensor *ts = pln_xcalloc(nt, sizeof *ts);
    for (size_t i = 0; i < np; i++) {
        const pln_tp_entry *e = &plan[i];
        if (e->transform == PLN_TP_QUANT_SCALE) continue;
        for (int g = 0; g < (e->n_segs ? e->n_segs : 1); g++) {
            sy_tensor *t = &ts[k];
            const char *src = e->n_segs ? e->segs[g].source : e->source;
            snprintf(t->name, sizeof t->name, "%s%s", fam->hf_prefix, src);
            t->ndim = e->src_ndim;
            t->shape[0] = e->n_segs ? e->segs[g].src_rows : e->src_shape[0];
            t->shape[1] = e->src_ndim == 2 ? e->src_shape[1] : 0;
            /* 1-D: a norm's weight, a norm's bias (BLOOM's LayerNorms) or a projection's bias */
            size_t nl = strlen(src);
            bool bias = nl > 5 && !strcmp(src + nl - 5, ".bias"), norm = strstr(src, "norm") || !strncmp(src, "ln_", 3);
            t->kind = t->ndim == 2 ? SY_WEIGHT : !bias ? SY_LN_WEIGHT : norm ? SY_LN_BIAS : SY_BIAS;
            t->index = k;
            t->nbytes = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1) * 2;
            k++;
        }
    }
    free(plan);
    PLN_ASSERT(k == nt);
    /* Shards in module order, each at most shard_size (a bigger tensor gets a file of its own). */
    int n_files = 0;
    uint64_t cur = 0, total = 0;
    for (size_t i = 0; i < nt; i++) {
        if (i == 0 || (cur + ts[i].nbytes > shard_size && cur > 0)) { n_files++; cur = 0; }
        ts[i].file = n_files - 1;
        cur += ts[i].nbytes;
        total += ts[i].nbytes;
    }

    const char *dl = getenv("PLN_FAULT_DELAY_MS");
    if (dl) g_delay_ms = (unsigned)atoi(dl);
    const char *tok_src = find_tokenizer(tok);
    if (tok_src && pln_check_file(tok_src)) pln_die("--tokenizer: %s", pln_error());
    /* The files synth reads must survive it: the output may not be, hold or lie inside them. */
    const char *protect[2] = {tok_src, cfg_file};
    if (pln_path_guard(out, protect, 2)) pln_die("refusing to write the output: %s", pln_error());
    /* Signals from here on: common.c's handler removes the temporary output and ends the process. */
    char *tmp = pln_outdir_begin(out, force);
    if (!tmp) pln_die("%s", pln_error());
    pln_progress pg;
    pln_progress_init(&pg, "synth", total, quiet);
    uint16_t *buf = pln_xmalloc((size_t)SY_BLOCK * SY_CHUNK_BLOCKS * 2);
    sy_tensor **group = pln_xcalloc(nt, sizeof *group);
    json_t *wmap = json_object();
    int rc = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        char fname[64];
        if (n_files == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, n_files);
        size_t ng = 0;
        for (size_t i = 0; i < nt; i++)
            if (ts[i].file == f) { group[ng++] = &ts[i]; json_object_set_new(wmap, ts[i].name, json_string(fname)); }
        char *path = pln_xasprintf("%s/%s", tmp, fname);
        rc = write_file(path, group, ng, seed, bf16, buf, &pg);
        free(path);
    }
    pln_progress_done(&pg);
    if (!rc && n_files > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        char *s = json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS);
        char *path = pln_xasprintf("%s/model.safetensors.index.json", tmp);
        rc = pln_write_file_atomic(path, s, strlen(s));
        free(path);
        free(s);
        json_decref(idx);
    } else {
        json_decref(wmap);
    }
    if (!rc) {
        char *s = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS);
        char *path = pln_xasprintf("%s/config.json", tmp);
        rc = pln_write_file_atomic(path, s, strlen(s));
        free(path);
        free(s);
    }
    if (!rc) {
        /* The marker that makes this checkpoint pollen's own: --force may replace it later. */
        json_t *mk = json_pack("{s:s, s:s, s:s, s:I}", "tool", "pollen synth", "version", PLN_VERSION_STRING,
                               "model", model, "seed", (json_int_t)seed);
        char *s = json_dumps(mk, JSON_INDENT(2) | JSON_SORT_KEYS);
        char *path = pln_xasprintf("%s/%s", tmp, PLN_SYNTH_MARKER);
        rc = pln_write_file_atomic(path, s, strlen(s));
        free(path);
        free(s);
        json_decref(mk);
    }
    if (!rc && tok_src) {
        char *path = pln_xasprintf("%s/tokenizer.json", tmp);
        rc = pln_copy_file(tok_src, path);
        free(path);
    } else if (!rc && !quiet) {
        fprintf(stderr, "pollen: warning: no tokenizer.json found (pass --tokenizer PATH); the checkpoint will have none\n");
    }
    if (!rc && pln_outdir_commit(tmp, out)) rc = -1;
    if (rc) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", pln_error());
        pln_outdir_abort(tmp);
        pln_die("synth failed, nothing written to %s: %s", out, reason);
    }
    if (!quiet) {
        char a[32];
        fprintf(stderr, "wrote %s: %s, %lld layers, %s %s in %d file%s\n", out, model, (long long)bc.n_layer,
                pln_human_bytes((double)total, a, sizeof a), bf16 ? "bf16" : "fp16", n_files, n_files == 1 ? "" : "s");
    }
    free(buf);
    free(group);
    free(ts);
    free(tmp);
    json_decref(cfg);
    return 0;
}
