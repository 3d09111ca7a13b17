/* test_family.c — the model-family seam (formats/family.h, runtime/family.h): config.json's
 * model_type and a set's layout id lead to one family on both sides, and anything else is refused
 * with an error naming the field and what this pollen reads. */
#include "formats/family.h"
#include "formats/safetensors.h"
#include "runtime/family.h"
#include "tests/test.h"

static char *write_cfg(const char *name, const char *text) {
    char *p = pln_xasprintf("%s/%s", test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    if (!f) { perror(p); exit(2); }
    fputs(text, f);
    fclose(f);
    return p;
}

static void test_registry(void) {
    const pln_family *b = pln_family_by_model_type("bloom");
    CHECK(b == &pln_family_bloom, "model_type bloom -> the BLOOM family");
    CHECK(pln_family_by_model_type("") == b && pln_family_by_model_type(NULL) == b, "no model_type is BLOOM (older configs)");
    CHECK(pln_family_by_layout("bloom-tp-v1") == b, "layout bloom-tp-v1 -> BLOOM");
    CHECK(!strcmp(b->layout, PLN_LAYOUT_BLOOM_TP_V1), "BLOOM's layout id is unchanged");
    CHECK(pln_family_by_model_type("gpt2") == NULL && strstr(pln_error(), "\"gpt2\"") && strstr(pln_error(), "\"bloom\""),
          "unknown model_type refused, naming it and the known ones: %s", pln_error());
    CHECK(pln_family_by_layout("gpt2-tp-v1") == NULL && strstr(pln_error(), "gpt2-tp-v1") && strstr(pln_error(), "bloom-tp-v1"),
          "unknown layout refused: %s", pln_error());
    CHECK(pln_model_family_by_layout("bloom-tp-v1") == &pln_model_family_bloom, "the runtime runs bloom-tp-v1");
    CHECK(pln_model_family_by_layout("nope") == NULL && strstr(pln_error(), "\"nope\"") && strstr(pln_error(), "bloom-tp-v1"),
          "the runtime refuses an unknown layout: %s", pln_error());
    /* every formats-side family has a runtime side under the same layout id */
    CHECK(pln_model_family_by_layout(pln_family_bloom.layout) != NULL, "BLOOM runs");
}

static void test_config_dispatch(void) {
    pln_hf_config c;
    char *p = write_cfg("bloom.json", "{\"model_type\":\"bloom\",\"vocab_size\":10,\"hidden_size\":8,\"n_head\":2,\"n_layer\":1}");
    CHECK(pln_hf_config_load(p, &c) == 0 && !strcmp(c.model_type, "bloom") && pln_family_of(&c) == &pln_family_bloom,
          "bloom config: %s", pln_error());
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 2, "BLOOM's eos as a one-element list");
    free(p);
    p = write_cfg("t5.json", "{\"model_type\":\"t5\",\"vocab_size\":10,\"hidden_size\":8,\"n_head\":2,\"n_layer\":1}");
    CHECK(pln_hf_config_load(p, &c) == -1 && strstr(pln_error(), p) && strstr(pln_error(), "\"model_type\"") &&
          strstr(pln_error(), "\"t5\""), "unknown model_type names the file and the key: %s", pln_error());
    free(p);
    p = write_cfg("num.json", "{\"model_type\":7,\"vocab_size\":10}");
    CHECK(pln_hf_config_load(p, &c) == -1 && strstr(pln_error(), "\"model_type\""), "model_type not a string: %s", pln_error());
    free(p);
}

#define LLAMA_BASE "\"vocab_size\":1003,\"hidden_size\":64,\"intermediate_size\":128,\"num_attention_heads\":4,\"num_hidden_layers\":2"

static void expect_llama_fail(const char *name, const char *json, const char *want) {
    char *p = write_cfg(name, json);
    pln_hf_config c;
    CHECK(pln_hf_config_load(p, &c) == -1 && strstr(pln_error(), p) && strstr(pln_error(), want),
          "%s: refused naming the file and \"%s\": %s", name, want, pln_error());
    printf("  %-16s -> %s\n", name, pln_error());
    free(p);
}

static void test_llama_config(void) {
    pln_hf_config c;
    /* defaults: KV heads = q heads, head_dim = H / n_head, rms_norm_eps 1e-6, theta 1e4, untied */
    char *p = write_cfg("llama-min.json", "{\"model_type\":\"llama\"," LLAMA_BASE "}");
    CHECK(pln_hf_config_load(p, &c) == 0, "minimal llama: %s", pln_error());
    CHECK(pln_family_of(&c) == &pln_family_llama && !strcmp(pln_family_of(&c)->layout, "llama-tp-v1"), "llama family");
    CHECK(c.n_kv_head == 4 && c.head_dim == 16 && c.layer_norm_epsilon == 1e-6 && c.rope_theta == 10000.0 &&
          c.rope_type == PLN_ROPE_NONE && !c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && c.sliding_window == 0,
          "llama defaults");
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 2 && c.bos_token_id == 1 && c.pad_token_id == 2, "llama default ids (pad = eos)");
    free(p);
    /* Llama 3.1's spelling: eos as a list, rope_scaling llama3 under "rope_type", given head_dim */
    p = write_cfg("llama31.json", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"num_key_value_heads\":2,\"head_dim\":16,"
                  "\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"bos_token_id\":1,\"eos_token_id\":[2,7,9],"
                  "\"pad_token_id\":null,\"tie_word_embeddings\":true,\"rope_scaling\":{\"rope_type\":\"llama3\","
                  "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}");
    CHECK(pln_hf_config_load(p, &c) == 0, "llama 3.1 style: %s", pln_error());
    CHECK(c.n_kv_head == 2 && c.rope_type == PLN_ROPE_LLAMA3 && c.rope_factor == 8.0 && c.rope_original_max == 8192 &&
          c.tie_word_embeddings && c.n_eos == 3 && c.eos_ids[2] == 9 && c.eos_token_id == 2 && c.pad_token_id == 2,
          "llama 3.1 fields");
    free(p);
    /* the older "type" spelling of rope_scaling; Qwen2's biases; Mistral's window */
    p = write_cfg("linear.json", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}");
    CHECK(pln_hf_config_load(p, &c) == 0 && c.rope_type == PLN_ROPE_LINEAR && c.rope_factor == 2.0, "linear: %s", pln_error());
    free(p);
    p = write_cfg("qwen2.json", "{\"model_type\":\"qwen2\"," LLAMA_BASE ",\"use_sliding_window\":false,\"sliding_window\":4096}");
    CHECK(pln_hf_config_load(p, &c) == 0 && c.qkv_bias && !c.o_bias && c.sliding_window == 0, "qwen2: %s", pln_error());
    free(p);
    p = write_cfg("mistral.json", "{\"model_type\":\"mistral\"," LLAMA_BASE ",\"sliding_window\":4096}");
    CHECK(pln_hf_config_load(p, &c) == 0 && c.sliding_window == 4096 && !c.qkv_bias, "mistral: %s", pln_error());
    free(p);
    p = write_cfg("attn-bias.json", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"attention_bias\":true}");
    CHECK(pln_hf_config_load(p, &c) == 0 && c.qkv_bias && c.o_bias, "llama attention_bias: %s", pln_error());
    free(p);
    /* refusals name the key */
    expect_llama_fail("yarn", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
                      "\"rope_scaling\" has type \"yarn\"");
    expect_llama_fail("dynamic", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4}}",
                      "\"rope_scaling\"");
    expect_llama_fail("llama3-partial", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
                      "\"rope_scaling.low_freq_factor\"");
    expect_llama_fail("kv-divide", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"num_key_value_heads\":3}", "\"num_key_value_heads\"");
    expect_llama_fail("no-inter", "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_attention_heads\":2,"
                      "\"num_hidden_layers\":1}", "\"intermediate_size\"");
    expect_llama_fail("eos-outside", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"eos_token_id\":[2,5000]}", "\"eos_token_id\"");
    expect_llama_fail("mlp-bias", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"mlp_bias\":true}", "\"mlp_bias\"");
    expect_llama_fail("act", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"hidden_act\":\"gelu\"}", "\"hidden_act\"");
    expect_llama_fail("qwen2-window", "{\"model_type\":\"qwen2\"," LLAMA_BASE ",\"use_sliding_window\":true,\"sliding_window\":64}",
                      "\"use_sliding_window\"");
    expect_llama_fail("mistral-rope", "{\"model_type\":\"mistral\"," LLAMA_BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}",
                      "\"rope_scaling\" is set for model_type \"mistral\"");
    expect_llama_fail("odd-head-dim", "{\"model_type\":\"llama\"," LLAMA_BASE ",\"head_dim\":15}", "\"head_dim\"");
}

/* The Llama plan: GQA split and replication, fused segments, the table derived from it. */
static void test_llama_plan(void) {
    pln_hf_config c = {.vocab_size = 1003, .hidden_size = 128, .n_head = 8, .n_layer = 1, .layer_norm_epsilon = 1e-5,
                       .n_kv_head = 2, .head_dim = 16, .intermediate_size = 256, .rope_theta = 1e4, .n_eos = 1};
    snprintf(c.model_type, sizeof c.model_type, "llama");
    const pln_family *f = pln_family_of(&c);
    for (int tp = 1; tp <= 8; tp *= 2) {
        for (int r = 0; r < tp; r++) {
            pln_tp_entry *e = NULL;
            size_t n = 0;
            CHECK(f->tp_plan(&c, &(pln_tp_opts){.tp = tp}, r, &e, &n) == 0, "plan tp %d: %s", tp, pln_error());
            /* embed, in_norm, qkv, o, post_norm, gate_up, down, norm, lm_head */
            CHECK(n == 9, "tp %d: %zu entries", tp, n);
            if (n != 9) { free(e); continue; }
            const pln_tp_entry *q = &e[2], *gu = &e[5];
            int64_t hl = 8 / tp, kvl = tp <= 2 ? 2 / tp : 1, kv0 = tp <= 2 ? r * kvl : r * hl / 4;
            CHECK(q->n_segs == 3 && q->rows == (hl + 2 * kvl) * 16 && q->segs[0].row0 == r * hl * 16 && q->segs[1].row0 == kv0 * 16 &&
                  q->segs[2].row0 == kv0 * 16 && q->segs[1].rows == kvl * 16 && !strcmp(q->segs[1].source, "model.layers.0.self_attn.k_proj.weight"),
                  "tp %d rank %d: qkv segments (kv0 %lld)", tp, r, (long long)kv0);
            CHECK(gu->n_segs == 2 && gu->rows == 2 * 256 / tp && gu->segs[1].row0 == r * 256 / tp &&
                  !strcmp(gu->segs[1].source, "model.layers.0.mlp.up_proj.weight"), "tp %d: gate_up segments", tp);
            CHECK(e[3].split == PLN_TP_SPLIT_COLS && e[3].cols == 128 / tp && e[6].split == PLN_TP_SPLIT_COLS && e[6].cols == 256 / tp,
                  "tp %d: o and down row-parallel", tp);
            CHECK(!strcmp(e[8].name, "lm_head.weight") && e[8].shape[0] == pln_tp_vocab_padded(1003, tp) / tp, "tp %d: untied lm_head", tp);
            free(e);
        }
    }
    pln_tp_entry *e = NULL;
    size_t n = 0;
    CHECK(f->tp_plan(&c, &(pln_tp_opts){.tp = 3}, 0, &e, &n) == -1 && strstr(pln_error(), "TP sizes that work: 1, 2, 4, 8"),
          "tp 3 refused with the list: %s", pln_error());
    c.tie_word_embeddings = true;
    c.qkv_bias = true;
    CHECK(f->tp_plan(&c, &(pln_tp_opts){.tp = 2, .int8 = true}, 1, &e, &n) == 0, "int8 plan: %s", pln_error());
    /* embed, in_norm, qkv + scale, qkv bias, o + scale, post_norm, gate_up + scale, down + scale, norm; no lm_head */
    CHECK(n == 13 && e[3].transform == PLN_TP_QUANT_SCALE && !strcmp(e[4].name, "model.layers.0.self_attn.qkv_proj.bias") &&
          e[4].n_segs == 3 && e[4].ndim == 1 && !strcmp(e[n - 1].name, "model.norm.weight"), "tied, biased, int8: %zu entries", n);
    free(e);
    /* the loader's table is the plan's */
    pln_layout_params lp = {.config = &c, .tp = 2, .int8 = true, .vocab_padded = pln_tp_vocab_padded(1003, 2)};
    pln_shard_spec *sp = f->layout_specs(&lp, 1, &n);
    CHECK(sp && n == 13 && !strcmp(sp[2].name, "model.layers.0.self_attn.qkv_proj.weight") && sp[2].dtype == PLN_DTYPE_I8 &&
          sp[2].shape[0] == (4 + 2) * 16 && sp[2].shape[1] == 128, "layout specs from the plan");
    pln_layout_free(sp, n);
}

/* inv_freq as transformers computed it (reference-*.safetensors "rope.inv_freq"). */
static void test_inv_freq(void) {
    struct { const char *model, *ref; } m[] = {{"llama-gqa", "reference-bf16"}, {"llama3-tied", "reference-f16"},
                                               {"qwen2-bias", "reference-f16"}, {"mistral-sw", "reference-f16"}};
    const char *src[] = {"bf16-st", "fp16-bin", "fp32-bin", "fp16-st"};
    for (int k = 0; k < 4; k++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/models/%s/%s/config.json", m[k].model, src[k]);
        pln_hf_config c;
        if (pln_hf_config_load(path, &c)) { CHECK(0, "%s: %s", path, pln_error()); continue; }
        snprintf(path, sizeof path, "tests/fixtures/models/%s/%s.safetensors", m[k].model, m[k].ref);
        pln_safetensors st;
        if (pln_safetensors_open(&st, path)) { CHECK(0, "%s", pln_error()); continue; }
        const pln_tensor *t = pln_safetensors_find(&st, "rope.inv_freq");
        CHECK(t && t->shape[0] == c.head_dim / 2, "%s: rope.inv_freq [%lld]", m[k].model, (long long)c.head_dim / 2);
        if (t) {
            float got[512];
            pln_llama_inv_freq(&c, got);
            const float *want = (const float *)t->data;
            double worst = 0;
            for (int64_t i = 0; i < c.head_dim / 2; i++) {
                double rel = fabs((double)got[i] - want[i]) / fabs((double)want[i]);
                if (rel > worst) worst = rel;
            }
            /* fp32 throughout; torch's pow may differ from libm's by an ulp */
            printf("%s inv_freq (%s rope) max rel diff %.3g %s\n", m[k].model, c.rope_type == PLN_ROPE_LLAMA3 ? "llama3" : "plain",
                   worst, worst <= 2.5e-7 ? "OK" : "NOT OK");
            CHECK(worst <= 2.5e-7, "%s: inv_freq max rel diff %.3g", m[k].model, worst);
        }
        pln_safetensors_close(&st);
    }
}

int main(void) {
    test_begin("test_family");
    test_registry();
    test_config_dispatch();
    test_llama_config();
    test_llama_plan();
    test_inv_freq();
    return test_done();
}
