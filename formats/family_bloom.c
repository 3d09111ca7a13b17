/* family_bloom.c — BLOOM as a model family (family.h): bigscience/bloom's config.json, the
 * "bloom-tp-v1" layout (its split plan is pln_tp_plan in formats/tp.c and its table
 * pln_layout_bloom_tp_v1 in formats/shard.c, two definitions that tests/test_tp.c holds equal).
 * The forward pass is runtime/model_bloom.c. */
#include "formats/family.h"

#include <string.h>

/* The special ids the runtime relies on: generation ends on BLOOM's </s> (id 2) in the scheduler,
 * the server's /info and generate, so a set whose config says otherwise cannot be served right. */
#define BLOOM_EOS_ID 2

/* Reads an integer under either spelling; both present must agree. *found false when absent. */
static int get_int2(json_t *o, const char *where, const char *k1, const char *k2, int64_t *out, bool *found) {
    json_t *v1 = json_object_get(o, k1), *v2 = k2 ? json_object_get(o, k2) : NULL;
    *found = false;
    if (v1 && json_is_null(v1)) v1 = NULL;
    if (v2 && json_is_null(v2)) v2 = NULL;
    if (v1 && !json_is_integer(v1)) return pln_errorf("%s: key \"%s\" must be an integer", where, k1);
    if (v2 && !json_is_integer(v2)) return pln_errorf("%s: key \"%s\" must be an integer", where, k2);
    if (v1 && v2 && json_integer_value(v1) != json_integer_value(v2))
        return pln_errorf("%s: keys \"%s\" (%lld) and \"%s\" (%lld) disagree", where, k1,
                          (long long)json_integer_value(v1), k2, (long long)json_integer_value(v2));
    json_t *v = v1 ? v1 : v2;
    if (!v) return 0;
    *out = json_integer_value(v);
    *found = true;
    return 0;
}

static int need_pos(json_t *o, const char *where, const char *k1, const char *k2, int64_t *out) {
    bool found;
    if (get_int2(o, where, k1, k2, out, &found)) return -1;
    if (!found) return pln_errorf("%s: missing key \"%s\"%s%s%s", where, k1, k2 ? " (or \"" : "", k2 ? k2 : "", k2 ? "\")" : "");
    if (*out <= 0) return pln_errorf("%s: key \"%s\" must be positive, got %lld", where, k1, (long long)*out);
    return 0;
}

static int bloom_config_from_json(json_t *o, const char *where, pln_hf_config *cfg) {
    json_t *post = json_object_get(o, "apply_residual_connection_post_layernorm");
    if (post && json_is_true(post))
        return pln_errorf("%s: key \"apply_residual_connection_post_layernorm\" is true; no BLOOM model uses that and "
                          "pollen does not support it", where);
    if (need_pos(o, where, "vocab_size", NULL, &cfg->vocab_size) ||
        need_pos(o, where, "hidden_size", "n_embed", &cfg->hidden_size) ||
        need_pos(o, where, "n_head", "num_attention_heads", &cfg->n_head) ||
        need_pos(o, where, "n_layer", "num_hidden_layers", &cfg->n_layer)) return -1;
    if (cfg->hidden_size % cfg->n_head)
        return pln_errorf("%s: key \"hidden_size\" (%lld) is not divisible by \"n_head\" (%lld)", where,
                          (long long)cfg->hidden_size, (long long)cfg->n_head);
    /* Bound sizes so later products (vocab × hidden, 4 × hidden²) cannot overflow 64 bits. */
    if (cfg->vocab_size > (1ll << 31) || cfg->hidden_size > (1ll << 20) || cfg->n_layer > 100000)
        return pln_errorf("%s: vocab_size/hidden_size/n_layer out of range (%lld/%lld/%lld)", where,
                          (long long)cfg->vocab_size, (long long)cfg->hidden_size, (long long)cfg->n_layer);
    cfg->layer_norm_epsilon = 1e-5;
    json_t *eps = json_object_get(o, "layer_norm_epsilon");
    if (eps && !json_is_null(eps)) {
        if (!json_is_number(eps) || json_number_value(eps) <= 0 || json_number_value(eps) >= 1)
            return pln_errorf("%s: key \"layer_norm_epsilon\" must be a number in (0, 1)", where);
        cfg->layer_norm_epsilon = json_number_value(eps);
    }
    const char *ids[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t *dst[3] = {&cfg->bos_token_id, &cfg->eos_token_id, &cfg->pad_token_id};
    int64_t defaults[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        bool found;
        if (get_int2(o, where, ids[k], NULL, dst[k], &found)) return -1;
        if (!found) *dst[k] = defaults[k];
        if (*dst[k] < 0 || *dst[k] >= cfg->vocab_size)
            return pln_errorf("%s: key \"%s\" (%lld) is outside the vocabulary [0, %lld)", where, ids[k],
                              (long long)*dst[k], (long long)cfg->vocab_size);
    }
    cfg->n_eos = 1;
    cfg->eos_ids[0] = cfg->eos_token_id;
    json_t *td = json_object_get(o, "torch_dtype");
    if (td && json_is_string(td)) snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", json_string_value(td));
    return 0;
}

static int bloom_servable(const pln_hf_config *c, const char *where) {
    if (c->eos_token_id != BLOOM_EOS_ID)
        return pln_errorf("%s: config.\"eos_token_id\" is %lld; pollen serves BLOOM models, whose </s> is id %d (re-run reshard "
                          "from a BLOOM checkpoint)", where, (long long)c->eos_token_id, BLOOM_EOS_ID);
    return 0;
}

/* BLOOM's manifests predate families: the config block holds the common fields only. */
static void bloom_manifest_put(const pln_hf_config *c, json_t *o) { (void)c; (void)o; }

static int bloom_manifest_get(json_t *o, const char *path, pln_hf_config *c) {
    (void)o; (void)path;
    c->n_eos = 1;
    c->eos_ids[0] = c->eos_token_id;
    return 0;
}

static int bloom_canonical_extra(const pln_hf_config *c, char *buf, size_t len) {
    (void)c;
    if (len) buf[0] = 0;
    return len ? 0 : -1;
}

static int bloom_agrees(const pln_hf_config *m, const pln_hf_config *f, const char *fpath, const char *mpath) {
    (void)m; (void)f; (void)fpath; (void)mpath;
    return 0;
}

static int bloom_tp_check(const pln_hf_config *c, const pln_tp_opts *o) {
    pln_tp_model m = pln_tp_model_of(c);
    return pln_tp_check(&m, o);
}

static int bloom_tp_plan(const pln_hf_config *c, const pln_tp_opts *o, int rank, pln_tp_entry **out, size_t *n) {
    pln_tp_model m = pln_tp_model_of(c);
    return pln_tp_plan(&m, o, rank, out, n);
}

static const char *const BLOOM_TYPES[] = {"bloom", NULL};

const pln_family pln_family_bloom = {
    .name = "bloom",
    .model_types = BLOOM_TYPES,
    .layout = PLN_LAYOUT_BLOOM_TP_V1,
    .hf_prefix = "transformer.",
    .layers_key = "n_layer",
    .config_from_json = bloom_config_from_json,
    .config_servable = bloom_servable,
    .manifest_put = bloom_manifest_put,
    .manifest_get = bloom_manifest_get,
    .canonical_extra = bloom_canonical_extra,
    .config_agrees = bloom_agrees,
    .tp_check = bloom_tp_check,
    .tp_plan = bloom_tp_plan,
    .layout_specs = pln_layout_bloom_tp_v1,
};
