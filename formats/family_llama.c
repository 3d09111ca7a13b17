/* family_llama.c — the Llama family (family.h): config.json of model_type "llama", "mistral" and
 * "qwen2" as transformers 4.44 reads them, and the "llama-tp-v1" layout (docs/FORMAT.md): per layer
 * the q/k/v projections fused per rank as [q | k | v] in the grouped-query layout backend.h
 * describes, gate and up fused per rank as [gate_r ; up_r] for the swiglu op, o and down
 * row-parallel, vocab-parallel embed_tokens and lm_head (tied: the embedding), RMSNorms replicated.
 * The rank file's table is derived from the plan itself (one definition for reshard, verify and
 * the loader). The forward pass is runtime/model_llama.c. */
#include "formats/family.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_LAYOUT "llama-tp-v1"

/* ---- config.json ---- */

/* An integer key: absent or null -> *found false; else must be an integer. */
static int get_int(json_t *o, const char *where, const char *k, int64_t *out, bool *found) {
    json_t *v = json_object_get(o, k);
    *found = false;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return pln_errorf("%s: key \"%s\" must be an integer", where, k);
    *out = json_integer_value(v);
    *found = true;
    return 0;
}

static int need_pos(json_t *o, const char *where, const char *k, int64_t *out) {
    bool found;
    if (get_int(o, where, k, out, &found)) return -1;
    if (!found) return pln_errorf("%s: missing key \"%s\"", where, k);
    if (*out <= 0) return pln_errorf("%s: key \"%s\" must be positive, got %lld", where, k, (long long)*out);
    return 0;
}

static int get_num(json_t *o, const char *where, const char *ctx, const char *k, double *out, bool need) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return need ? pln_errorf("%s: key \"%s%s\" is missing (it is needed)", where, ctx, k) : 0;
    if (!json_is_number(v)) return pln_errorf("%s: key \"%s%s\" must be a number", where, ctx, k);
    *out = json_number_value(v);
    if (!(isfinite(*out) && *out > 0)) return pln_errorf("%s: key \"%s%s\" must be positive and finite, got %g", where, ctx, k, *out);
    return 0;
}

static bool get_bool(json_t *o, const char *k, bool dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* rope_scaling: null, or an object whose "rope_type" (or older "type") is default, linear or
 * llama3 (transformers' modeling_rope_utils). Anything else is refused, naming the key. */
static int parse_rope_scaling(json_t *o, const char *where, pln_hf_config *c) {
    c->rope_type = PLN_ROPE_NONE;
    json_t *rs = json_object_get(o, "rope_scaling");
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return pln_errorf("%s: key \"rope_scaling\" must be null or an object", where);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(rs, "type");
    if (!json_is_string(t)) return pln_errorf("%s: key \"rope_scaling\" has no \"rope_type\" (or \"type\") string", where);
    const char *type = json_string_value(t);
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "linear")) {
        c->rope_type = PLN_ROPE_LINEAR;
        return get_num(rs, where, "rope_scaling.", "factor", &c->rope_factor, true);
    }
    if (!strcmp(type, "llama3")) {
        c->rope_type = PLN_ROPE_LLAMA3;
        double om = 0;
        if (get_num(rs, where, "rope_scaling.", "factor", &c->rope_factor, true) ||
            get_num(rs, where, "rope_scaling.", "low_freq_factor", &c->rope_low_freq_factor, true) ||
            get_num(rs, where, "rope_scaling.", "high_freq_factor", &c->rope_high_freq_factor, true) ||
            get_num(rs, where, "rope_scaling.", "original_max_position_embeddings", &om, true)) return -1;
        if (om != floor(om) || om > 1e9) return pln_errorf("%s: key \"rope_scaling.original_max_position_embeddings\" must be an integer", where);
        c->rope_original_max = (int64_t)om;
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return pln_errorf("%s: key \"rope_scaling.high_freq_factor\" (%g) must exceed \"low_freq_factor\" (%g)", where,
                              c->rope_high_freq_factor, c->rope_low_freq_factor);
        return 0;
    }
    return pln_errorf("%s: key \"rope_scaling\" has type \"%.40s\", which pollen does not support (it runs null, \"default\", "
                      "\"linear\" and \"llama3\")", where, type);
}

/* bos_token_id / eos_token_id: an integer, a list of integers, or null. */
static int parse_ids(json_t *o, const char *where, const char *k, int64_t *ids, int32_t *n, int32_t max) {
    json_t *v = json_object_get(o, k);
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) { ids[(*n)++] = json_integer_value(v); return 0; }
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > (size_t)max)
        return pln_errorf("%s: key \"%s\" must be an integer or a list of 1 to %d integers", where, k, (int)max);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) return pln_errorf("%s: key \"%s\"[%zu] must be an integer", where, k, i);
        ids[(*n)++] = json_integer_value(e);
    }
    return 0;
}

static int llama_config_from_json(json_t *o, const char *where, pln_hf_config *c) {
    const char *type = c->model_type;
    if (need_pos(o, where, "vocab_size", &c->vocab_size) || need_pos(o, where, "hidden_size", &c->hidden_size) ||
        need_pos(o, where, "intermediate_size", &c->intermediate_size) ||
        need_pos(o, where, "num_attention_heads", &c->n_head) || need_pos(o, where, "num_hidden_layers", &c->n_layer)) return -1;
    if (c->vocab_size > (1ll << 31) || c->hidden_size > (1ll << 20) || c->intermediate_size > (1ll << 22) ||
        c->n_layer > 100000 || c->n_head > c->hidden_size)
        return pln_errorf("%s: vocab_size/hidden_size/intermediate_size/num_hidden_layers/num_attention_heads out of range "
                          "(%lld/%lld/%lld/%lld/%lld)", where, (long long)c->vocab_size, (long long)c->hidden_size,
                          (long long)c->intermediate_size, (long long)c->n_layer, (long long)c->n_head);
    bool found;
    if (get_int(o, where, "num_key_value_heads", &c->n_kv_head, &found)) return -1;
    if (!found) c->n_kv_head = c->n_head;
    if (c->n_kv_head < 1 || c->n_head % c->n_kv_head)
        return pln_errorf("%s: key \"num_key_value_heads\" (%lld) must be positive and divide \"num_attention_heads\" (%lld)", where,
                          (long long)c->n_kv_head, (long long)c->n_head);
    if (get_int(o, where, "head_dim", &c->head_dim, &found)) return -1;
    if (!found) {
        if (c->hidden_size % c->n_head)
            return pln_errorf("%s: key \"hidden_size\" (%lld) is not divisible by \"num_attention_heads\" (%lld) and no \"head_dim\" is given",
                              where, (long long)c->hidden_size, (long long)c->n_head);
        c->head_dim = c->hidden_size / c->n_head;
    }
    if (c->head_dim < 2 || c->head_dim % 2 || c->head_dim > 1024)
        return pln_errorf("%s: key \"head_dim\" (%lld) must be even and in 2..1024 (rotary pairs the two halves of a head)", where,
                          (long long)c->head_dim);
    if (c->hidden_size % c->n_head)
        return pln_errorf("%s: key \"hidden_size\" (%lld) is not divisible by \"num_attention_heads\" (%lld); pollen's shard sets need it",
                          where, (long long)c->hidden_size, (long long)c->n_head);
    c->layer_norm_epsilon = 1e-6;
    if (get_num(o, where, "", "rms_norm_eps", &c->layer_norm_epsilon, false)) return -1;
    if (c->layer_norm_epsilon >= 1) return pln_errorf("%s: key \"rms_norm_eps\" must be in (0, 1)", where);
    c->rope_theta = 10000.0;
    if (get_num(o, where, "", "rope_theta", &c->rope_theta, false)) return -1;
    if (parse_rope_scaling(o, where, c)) return -1;
    /* transformers 4.44's Mistral and Qwen2 rotary ignores rope_scaling: refuse rather than guess */
    if (c->rope_type != PLN_ROPE_NONE && strcmp(type, "llama"))
        return pln_errorf("%s: key \"rope_scaling\" is set for model_type \"%s\", whose transformers implementation (4.44) "
                          "ignores it; pollen runs it for \"llama\" only", where, type);
    c->max_position_embeddings = 2048;
    if (get_int(o, where, "max_position_embeddings", &c->max_position_embeddings, &found)) return -1;
    if (c->max_position_embeddings < 1) return pln_errorf("%s: key \"max_position_embeddings\" must be positive", where);
    /* Mistral attends within a window on every layer (pln_attn_meta.window); Qwen2 only with
     * use_sliding_window, and then on the layers from max_window_layers on: refused. */
    c->sliding_window = 0;
    bool qwen2 = !strcmp(type, "qwen2");
    if (!qwen2 || get_bool(o, "use_sliding_window", false)) {
        if (get_int(o, where, "sliding_window", &c->sliding_window, &found)) return -1;
        if (found && c->sliding_window < 1) return pln_errorf("%s: key \"sliding_window\" must be positive or null", where);
        if (qwen2 && found)
            return pln_errorf("%s: key \"use_sliding_window\" is true; pollen runs Qwen2's per-layer sliding windows "
                              "(\"max_window_layers\") not yet, only Mistral's window on every layer (set "
                              "\"use_sliding_window\" to false if the model was trained so)", where);
        if (!found) c->sliding_window = 0;
    }
    c->tie_word_embeddings = get_bool(o, "tie_word_embeddings", false);
    bool attn_bias = get_bool(o, "attention_bias", false);
    c->qkv_bias = qwen2 || attn_bias;
    c->o_bias = !qwen2 && attn_bias;
    if (get_bool(o, "mlp_bias", false))
        return pln_errorf("%s: key \"mlp_bias\" is true; pollen runs Llama-family MLPs without biases", where);
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
        return pln_errorf("%s: key \"hidden_act\" must be \"silu\" (the SwiGLU MLP)", where);
    int64_t bos[1];
    int32_t nb = 0;
    if (parse_ids(o, where, "bos_token_id", bos, &nb, 1)) return -1;
    if (parse_ids(o, where, "eos_token_id", c->eos_ids, &c->n_eos, PLN_MAX_EOS)) return -1;
    if (c->n_eos == 0) { c->eos_ids[0] = 2; c->n_eos = 1; }   /* LlamaConfig's default */
    c->eos_token_id = c->eos_ids[0];
    c->bos_token_id = nb ? bos[0] : 1;
    int64_t pad = 0;
    if (get_int(o, where, "pad_token_id", &pad, &found)) return -1;
    c->pad_token_id = found ? pad : c->eos_token_id;   /* generate() pads with eos when unset */
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size)
            return pln_errorf("%s: key \"eos_token_id\" (%lld) is outside the vocabulary [0, %lld)", where, (long long)c->eos_ids[i],
                              (long long)c->vocab_size);
    if (c->bos_token_id < 0 || c->bos_token_id >= c->vocab_size || c->pad_token_id < 0 || c->pad_token_id >= c->vocab_size)
        return pln_errorf("%s: key \"%s\" (%lld) is outside the vocabulary [0, %lld)", where,
                          c->bos_token_id < 0 || c->bos_token_id >= c->vocab_size ? "bos_token_id" : "pad_token_id",
                          (long long)(c->bos_token_id < 0 || c->bos_token_id >= c->vocab_size ? c->bos_token_id : c->pad_token_id),
                          (long long)c->vocab_size);
    json_t *td = json_object_get(o, "torch_dtype");
    if (td && json_is_string(td)) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", json_string_value(td));
    return 0;
}

static int llama_servable(const pln_hf_config *c, const char *where) {
    (void)c; (void)where;
    return 0;
}

/* ---- the manifest's config block ---- */

static const char *rope_name(pln_rope_type t) {
    return t == PLN_ROPE_LINEAR ? "linear" : t == PLN_ROPE_LLAMA3 ? "llama3" : "none";
}

static void llama_manifest_put(const pln_hf_config *c, json_t *o) {
    json_object_set_new(o, "model_type", json_string(c->model_type));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_head));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_t *rs = json_object();
    json_object_set_new(rs, "rope_type", json_string(rope_name(c->rope_type)));
    json_object_set_new(rs, "factor", json_real(c->rope_factor));
    json_object_set_new(rs, "low_freq_factor", json_real(c->rope_low_freq_factor));
    json_object_set_new(rs, "high_freq_factor", json_real(c->rope_high_freq_factor));
    json_object_set_new(rs, "original_max_position_embeddings", json_integer(c->rope_original_max));
    json_object_set_new(o, "rope_scaling", rs);
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "qkv_bias", json_boolean(c->qkv_bias));
    json_object_set_new(o, "o_bias", json_boolean(c->o_bias));
    json_t *eos = json_array();
    for (int32_t i = 0; i < c->n_eos; i++) json_array_append_new(eos, json_integer(c->eos_ids[i]));
    json_object_set_new(o, "eos_token_ids", eos);
}

static int mget_int(json_t *o, const char *path, const char *k, int64_t *out, int64_t lo, int64_t hi) {
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v)) return pln_errorf("%s: config.\"%s\" is missing or not an integer", path, k);
    *out = json_integer_value(v);
    if (*out < lo || *out > hi) return pln_errorf("%s: config.\"%s\" %lld out of range [%lld, %lld]", path, k, (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

static int mget_num(json_t *o, const char *path, const char *k, double *out) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
        return pln_errorf("%s: config.\"%s\" is missing or not a non-negative number", path, k);
    *out = json_number_value(v);
    return 0;
}

static int mget_bool(json_t *o, const char *path, const char *k, bool *out) {
    json_t *v = json_object_get(o, k);
    if (!json_is_boolean(v)) return pln_errorf("%s: config.\"%s\" is missing or not a boolean", path, k);
    *out = json_is_true(v);
    return 0;
}

static int llama_manifest_get(json_t *o, const char *path, pln_hf_config *c) {
    if (mget_int(o, path, "num_key_value_heads", &c->n_kv_head, 1, c->n_head) ||
        mget_int(o, path, "head_dim", &c->head_dim, 2, 1024) ||
        mget_int(o, path, "intermediate_size", &c->intermediate_size, 1, 1ll << 22) ||
        mget_int(o, path, "max_position_embeddings", &c->max_position_embeddings, 1, 1ll << 40) ||
        mget_int(o, path, "sliding_window", &c->sliding_window, 0, 1ll << 40) ||
        mget_num(o, path, "rope_theta", &c->rope_theta) ||
        mget_bool(o, path, "tie_word_embeddings", &c->tie_word_embeddings) || mget_bool(o, path, "qkv_bias", &c->qkv_bias) ||
        mget_bool(o, path, "o_bias", &c->o_bias))
        return -1;
    if (c->n_head % c->n_kv_head || c->head_dim % 2 || !(c->rope_theta > 0))
        return pln_errorf("%s: config: num_key_value_heads %lld, head_dim %lld, rope_theta %g are inconsistent", path,
                          (long long)c->n_kv_head, (long long)c->head_dim, c->rope_theta);
    json_t *rs = json_object_get(o, "rope_scaling");
    json_t *t = json_is_object(rs) ? json_object_get(rs, "rope_type") : NULL;
    if (!json_is_string(t)) return pln_errorf("%s: config.\"rope_scaling\".\"rope_type\" is missing", path);
    const char *tn = json_string_value(t);
    c->rope_type = !strcmp(tn, "linear") ? PLN_ROPE_LINEAR : !strcmp(tn, "llama3") ? PLN_ROPE_LLAMA3 : PLN_ROPE_NONE;
    if (c->rope_type == PLN_ROPE_NONE && strcmp(tn, "none"))
        return pln_errorf("%s: config.\"rope_scaling\".\"rope_type\" \"%s\" is not none, linear or llama3", path, tn);
    if (mget_num(rs, path, "factor", &c->rope_factor) || mget_num(rs, path, "low_freq_factor", &c->rope_low_freq_factor) ||
        mget_num(rs, path, "high_freq_factor", &c->rope_high_freq_factor) ||
        mget_int(rs, path, "original_max_position_embeddings", &c->rope_original_max, 0, 1ll << 40))
        return -1;
    if (c->rope_type != PLN_ROPE_NONE && !(c->rope_factor > 0))
        return pln_errorf("%s: config.\"rope_scaling\".\"factor\" must be positive", path);
    json_t *eos = json_object_get(o, "eos_token_ids");
    if (!json_is_array(eos) || json_array_size(eos) < 1 || json_array_size(eos) > PLN_MAX_EOS)
        return pln_errorf("%s: config.\"eos_token_ids\" must be a list of 1 to %d ids", path, PLN_MAX_EOS);
    c->n_eos = (int32_t)json_array_size(eos);
    for (int32_t i = 0; i < c->n_eos; i++) {
        json_t *e = json_array_get(eos, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->vocab_size)
            return pln_errorf("%s: config.\"eos_token_ids\"[%d] is not an id of the vocabulary", path, (int)i);
        c->eos_ids[i] = json_integer_value(e);
    }
    if (c->eos_ids[0] != c->eos_token_id)
        return pln_errorf("%s: config.\"eos_token_ids\"[0] %lld differs from \"eos_token_id\" %lld", path, (long long)c->eos_ids[0],
                          (long long)c->eos_token_id);
    return 0;
}

static int llama_canonical_extra(const pln_hf_config *c, char *buf, size_t len) {
    uint64_t bits[5];
    double d[5] = {c->rope_theta, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor, 0};
    for (int i = 0; i < 5; i++) memcpy(&bits[i], &d[i], 8);
    int n = snprintf(buf, len,
                     "model_type=%s\nnum_key_value_heads=%lld\nhead_dim=%lld\nintermediate_size=%lld\nmax_position_embeddings=%lld\n"
                     "sliding_window=%lld\nrope_theta=%016llx\nrope_type=%s\nrope_factor=%016llx\nrope_low_freq_factor=%016llx\n"
                     "rope_high_freq_factor=%016llx\nrope_original_max_position_embeddings=%lld\ntie_word_embeddings=%d\n"
                     "qkv_bias=%d\no_bias=%d\neos_token_ids=",
                     c->model_type, (long long)c->n_kv_head, (long long)c->head_dim, (long long)c->intermediate_size,
                     (long long)c->max_position_embeddings, (long long)c->sliding_window, (unsigned long long)bits[0],
                     rope_name(c->rope_type), (unsigned long long)bits[1], (unsigned long long)bits[2], (unsigned long long)bits[3],
                     (long long)c->rope_original_max, c->tie_word_embeddings, c->qkv_bias, c->o_bias);
    if (n < 0 || (size_t)n >= len) return -1;
    for (int32_t i = 0; i < c->n_eos; i++) {
        int k = snprintf(buf + n, len - (size_t)n, "%s%lld", i ? "," : "", (long long)c->eos_ids[i]);
        if (k < 0 || (size_t)(n + k) >= len) return -1;
        n += k;
    }
    int k = snprintf(buf + n, len - (size_t)n, "\n");
    return k < 0 || (size_t)(n + k) >= len ? -1 : n + k;
}

static int llama_agrees(const pln_hf_config *m, const pln_hf_config *f, const char *fpath, const char *mpath) {
    char a[1024], b[1024];
    if (llama_canonical_extra(m, a, sizeof a) < 0 || llama_canonical_extra(f, b, sizeof b) < 0)
        return pln_errorf("%s: config too long to compare", fpath);
    /* name the first line (field) that differs */
    for (const char *p = a, *q = b; *p || *q;) {
        size_t lp = strcspn(p, "\n"), lq = strcspn(q, "\n");
        if (lp != lq || memcmp(p, q, lp))
            return pln_errorf("%s: %.*s but %s says %.*s: one of them was edited; re-run reshard", fpath, (int)lq, q, mpath, (int)lp, p);
        p += lp + (p[lp] != 0);
        q += lq + (q[lq] != 0);
    }
    return 0;
}

/* ---- the split ---- */

/* KV heads of rank r: [*kv0, *kv0 + *kv_l). Split when tp divides them; else each rank keeps the
 * one KV head its q heads read (tp a multiple of the KV-head count), as vLLM replicates them. */
static void kv_heads_of(const pln_hf_config *c, int tp, int rank, int64_t *kv0, int64_t *kv_l) {
    int64_t h_l = c->n_head / tp;
    if (c->n_kv_head % tp == 0) {
        *kv_l = c->n_kv_head / tp;
        *kv0 = *kv_l * rank;
    } else {
        *kv_l = 1;
        *kv0 = rank * h_l / (c->n_head / c->n_kv_head);
    }
}

static int llama_tp_check(const pln_hf_config *c, const pln_tp_opts *o) {
    if (o->tp < 1) return pln_errorf("--tp %d: the TP size must be at least 1", o->tp);
    bool ok = c->n_head % o->tp == 0 && (c->n_kv_head % o->tp == 0 || o->tp % c->n_kv_head == 0) &&
              c->intermediate_size % o->tp == 0;
    if (!ok) {
        char list[512];
        size_t n = 0;
        list[0] = 0;
        for (int64_t t = 1; t <= c->n_head && n < sizeof list - 24; t++)
            if (c->n_head % t == 0 && (c->n_kv_head % t == 0 || t % c->n_kv_head == 0) && c->intermediate_size % t == 0)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%lld", n ? ", " : "", (long long)t);
        return pln_errorf("--tp %d: num_attention_heads %lld, num_key_value_heads %lld and intermediate_size %lld do not split %d ways "
                          "(each rank needs whole q heads, whole or replicated KV heads, and an equal part of the MLP); TP sizes "
                          "that work: %s", o->tp, (long long)c->n_head, (long long)c->n_kv_head, (long long)c->intermediate_size,
                          o->tp, list);
    }
    if (o->int8 && o->int4) return pln_errorf("--dtype: int8 and int4 exclude each other");
    if (o->quantize_embedding && !o->int8 && !o->int4) return pln_errorf("--quantize-embedding needs --dtype int8 or int4");
    if (o->group_size < 0) return pln_errorf("--group-size %lld: must be positive", (long long)o->group_size);
    if (o->int4 && o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
        return pln_errorf("--group-size %lld: int4 needs 32, 64 or 128 (the packed layout works in blocks of 32 columns)",
                          (long long)o->group_size);
    if ((o->int8 || o->int4) && o->group_size > 0) {
        int64_t H = c->hidden_size, A = c->n_head * c->head_dim / o->tp, F = c->intermediate_size / o->tp;
        int64_t dims[3] = {H, A, F};
        for (int i = 0; i < 3; i++)
            if (dims[i] % o->group_size)
                return pln_errorf("--group-size %lld does not divide the input dimensions of the rank slices (%lld for "
                                  "qkv/gate_up%s, %lld for o_proj, %lld for down_proj at TP %d); pick a divisor of all three",
                                  (long long)o->group_size, (long long)H, o->quantize_embedding ? "/embed_tokens/lm_head" : "",
                                  (long long)A, (long long)F, o->tp);
    }
    return 0;
}

static int llama_tp_plan(const pln_hf_config *c, const pln_tp_opts *o, int rank, pln_tp_entry **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (llama_tp_check(c, o)) return -1;
    if (rank < 0 || rank >= o->tp) return pln_errorf("rank %d out of range for TP %d", rank, o->tp);
    pln_tp_builder b = {.o = o, .rank = rank};
    int tp = o->tp;
    int64_t H = c->hidden_size, D = c->head_dim, I = c->intermediate_size, V = c->vocab_size;
    int64_t h_l = c->n_head / tp, Fl = I / tp, kv0, kv_l;
    kv_heads_of(c, tp, rank, &kv0, &kv_l);
    int lin = o->int4 ? 4 : o->int8 ? 8 : 0, emb = o->quantize_embedding ? 8 : 0;
    char name[PLN_TP_NAME_MAX], src[PLN_TP_NAME_MAX];
    pln_tp_add_matrix(&b, "model.embed_tokens.weight", V, H, PLN_TP_SPLIT_ROWS, pln_tp_vocab_padded(V, tp), emb);
    for (int64_t i = 0; i < c->n_layer; i++) {
#define NM(buf, suffix) (snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)i, suffix), buf)
        pln_tp_add_vector(&b, NM(name, "input_layernorm.weight"), H);
        const char *sfx[2] = {"weight", "bias"};
        for (int k = 0; k < (c->qkv_bias ? 2 : 1); k++) {
            pln_tp_seg seg[3];
            const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
            int64_t r0[3] = {rank * h_l * D, kv0 * D, kv0 * D}, nr[3] = {h_l * D, kv_l * D, kv_l * D};
            int64_t all[3] = {c->n_head * D, c->n_kv_head * D, c->n_kv_head * D};
            for (int s = 0; s < 3; s++) {
                snprintf(seg[s].source, sizeof seg[s].source, "model.layers.%lld.self_attn.%s.%s", (long long)i, proj[s], sfx[k]);
                seg[s].src_rows = all[s];
                seg[s].row0 = r0[s];
                seg[s].rows = nr[s];
            }
            snprintf(name, sizeof name, "model.layers.%lld.self_attn.qkv_proj.%s", (long long)i, sfx[k]);
            snprintf(src, sizeof src, "model.layers.%lld.self_attn.{q,k,v}_proj.%s", (long long)i, sfx[k]);
            pln_tp_add_fused(&b, name, src, k ? 1 : H, seg, 3, k ? 0 : lin);
        }
        pln_tp_add_matrix(&b, NM(name, "self_attn.o_proj.weight"), H, c->n_head * D, PLN_TP_SPLIT_COLS, H, lin);
        if (c->o_bias) pln_tp_add_vector(&b, NM(name, "self_attn.o_proj.bias"), H);
        pln_tp_add_vector(&b, NM(name, "post_attention_layernorm.weight"), H);
        pln_tp_seg gu[2];
        const char *proj[2] = {"gate_proj", "up_proj"};
        for (int s = 0; s < 2; s++) {
            snprintf(gu[s].source, sizeof gu[s].source, "model.layers.%lld.mlp.%s.weight", (long long)i, proj[s]);
            gu[s].src_rows = I;
            gu[s].row0 = rank * Fl;
            gu[s].rows = Fl;
        }
        snprintf(src, sizeof src, "model.layers.%lld.mlp.{gate,up}_proj.weight", (long long)i);
        pln_tp_add_fused(&b, NM(name, "mlp.gate_up_proj.weight"), src, H, gu, 2, lin);
        pln_tp_add_matrix(&b, NM(name, "mlp.down_proj.weight"), H, I, PLN_TP_SPLIT_COLS, H, lin);
#undef NM
    }
    pln_tp_add_vector(&b, "model.norm.weight", H);
    if (!c->tie_word_embeddings)
        pln_tp_add_matrix(&b, "lm_head.weight", V, H, PLN_TP_SPLIT_ROWS, pln_tp_vocab_padded(V, tp), emb);
    *out = b.e;
    *n_out = b.n;
    return 0;
}

/* The table the loader checks, from the plan itself. */
static pln_shard_spec *llama_layout_specs(const pln_layout_params *p, int32_t rank, size_t *n) {
    *n = 0;
    pln_tp_opts o = {.tp = p->tp, .int8 = p->int8, .int4 = p->int4, .group_size = p->group_size,
                     .quantize_embedding = p->quantize_embedding};
    if (p->vocab_padded != pln_tp_vocab_padded(p->config->vocab_size, p->tp)) {
        pln_errorf(LLAMA_LAYOUT ": vocab_padded %lld is not vocab_size %lld rounded up to a multiple of tp %d",
                   (long long)p->vocab_padded, (long long)p->config->vocab_size, (int)p->tp);
        return NULL;
    }
    pln_tp_entry *e = NULL;
    size_t ne = 0;
    if (llama_tp_plan(p->config, &o, rank, &e, &ne)) { pln_error_context(LLAMA_LAYOUT); return NULL; }
    pln_shard_spec *s = pln_xcalloc(ne ? ne : 1, sizeof *s);
    for (size_t i = 0; i < ne; i++) {
        s[i].name = pln_xstrdup(e[i].name);
        s[i].dtype = e[i].dtype;
        s[i].ndim = e[i].ndim;
        s[i].shape[0] = e[i].shape[0];
        if (e[i].ndim == 2) s[i].shape[1] = e[i].shape[1];
    }
    free(e);
    *n = ne;
    return s;
}

static const char *const LLAMA_TYPES[] = {"llama", "mistral", "qwen2", NULL};

const pln_family pln_family_llama = {
    .name = "llama",
    .model_types = LLAMA_TYPES,
    .layout = LLAMA_LAYOUT,
    .hf_prefix = "",
    .layers_key = "num_hidden_layers",
    .config_from_json = llama_config_from_json,
    .config_servable = llama_servable,
    .manifest_put = llama_manifest_put,
    .manifest_get = llama_manifest_get,
    .canonical_extra = llama_canonical_extra,
    .config_agrees = llama_agrees,
    .tp_check = llama_tp_check,
    .tp_plan = llama_tp_plan,
    .layout_specs = llama_layout_specs,
};
