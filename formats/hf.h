/* hf.h — a Hugging Face checkpoint of a supported model family: config.json (read by the family
 * its "model_type" names, formats/family.h), and the weights as one tensor list however they are
 * stored (one or several .safetensors or PyTorch .bin files, with or without an index file), with
 * the "transformer." prefix of BLOOM's save_pretrained removed from names. */
#ifndef PLN_HF_H
#define PLN_HF_H

#include "formats/common.h"

/* Rotary scaling (the Llama family's config.json "rope_scaling"). */
typedef enum {
    PLN_ROPE_NONE = 0,                   /* null, or type "default" */
    PLN_ROPE_LINEAR,                     /* positions / factor */
    PLN_ROPE_LLAMA3,                     /* per-frequency, modeling_rope_utils' _compute_llama3_parameters */
} pln_rope_type;

#define PLN_MAX_EOS 8

/* The config of any supported family. The common fields first (every family fills them); the
 * rest belong to the Llama family and stay zero for BLOOM. model_type "" (a config built in code)
 * means "bloom". */
typedef struct {
    int64_t vocab_size, hidden_size, n_head, n_layer;
    double layer_norm_epsilon;           /* BLOOM: layer_norm_epsilon (1e-5 when absent); Llama: rms_norm_eps */
    int64_t bos_token_id, eos_token_id, pad_token_id;   /* BLOOM: 1, 2, 3 when absent; eos: the first of eos_ids */
    char torch_dtype[16];                /* "float16", "bfloat16", "float32" or "" when absent */
    char model_type[16];                 /* config.json's "model_type" ("bloom", "llama", "mistral", "qwen2") */
    /* ---- the Llama family ---- */
    int64_t n_kv_head;                   /* num_key_value_heads (default n_head) */
    int64_t head_dim;                    /* given, or hidden_size / n_head */
    int64_t intermediate_size;
    int64_t max_position_embeddings;
    int64_t sliding_window;              /* Mistral; 0 = none */
    double rope_theta;
    pln_rope_type rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max;           /* llama3: original_max_position_embeddings */
    bool tie_word_embeddings;
    bool qkv_bias;                       /* q/k/v projections carry biases (Qwen2; Llama's attention_bias) */
    bool o_bias;                         /* o_proj carries a bias (Llama's attention_bias) */
    int32_t n_eos;                       /* eos_token_id as a list (n_eos >= 1; BLOOM: 1) */
    int64_t eos_ids[PLN_MAX_EOS];
} pln_hf_config;

/* The name this type had when BLOOM was the only family. */
typedef pln_hf_config pln_bloom_config;

/* Reads config.json: "model_type" picks the family (formats/family.h; absent means "bloom", as
 * in older BLOOM configs), which reads the rest. BLOOM accepts both key spellings (n_embed |
 * hidden_size, n_head | num_attention_heads, n_layer | num_hidden_layers) and rejects
 * apply_residual_connection_post_layernorm true. Rejects an unknown model_type (listing the known
 * ones), hidden_size % n_head != 0, non-positive sizes and files that are not JSON; the error
 * names the file and the key. */
int pln_hf_config_load(const char *config_json_path, pln_hf_config *cfg);
/* Same, from a parsed JSON object (json_t *); `where` names it in errors. */
int pln_hf_config_from_json(const void *json_obj, const char *where, pln_hf_config *cfg);
/* The same two under their BLOOM-era names. */
int pln_bloom_config_load(const char *config_json_path, pln_hf_config *cfg);
int pln_bloom_config_from_json(const void *json_obj, const char *where, pln_hf_config *cfg);

typedef struct pln_ckpt {
    char *path;                /* as given */
    char *dir;                 /* directory holding the files */
    bool has_config;           /* config.json found (in dir) and valid */
    pln_hf_config config;
    char *tokenizer_path;      /* dir/tokenizer.json, NULL if none */
    const char *format;        /* "safetensors" | "pytorch" */
    int n_files;
    char **files;              /* full paths of the weight files */
    int64_t n_tensors;
    pln_tensor *tensors;       /* names without "transformer."; data points into mappings */
    void *impl;
} pln_ckpt;

/* Opens a checkpoint: a directory (index file, else model.safetensors, else pytorch_model.bin,
 * else the single *.safetensors / *.bin), a .safetensors file, a .bin file, or an index .json.
 * Reads only headers (safetensors JSON; zip directory, local headers and data.pkl). With an index,
 * a shard it names must exist and every tensor it maps to a file must be in that file. A
 * config.json beside the weights is loaded (has_config); an invalid one is an error.
 * -1 with an error naming the file and problem; on failure ck needs no close. */
int pln_ckpt_open(pln_ckpt *ck, const char *path);
/* The tensor called name (without prefix; a "transformer."-prefixed name is also accepted),
 * or NULL if absent. */
const pln_tensor *pln_ckpt_find(const pln_ckpt *ck, const char *name);
void pln_ckpt_close(pln_ckpt *ck);

#endif
