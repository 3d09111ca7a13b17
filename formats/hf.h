/* hf.h — a Hugging Face BLOOM checkpoint: config.json, and the weights as one tensor list however
 * they are stored (one or several .safetensors or PyTorch .bin files, with or without an index
 * file), with the "transformer." prefix of save_pretrained removed from names. */
#ifndef PLN_HF_H
#define PLN_HF_H

#include "formats/common.h"

typedef struct {
    int64_t vocab_size, hidden_size, n_head, n_layer;
    double layer_norm_epsilon;           /* 1e-5 when absent */
    int64_t bos_token_id, eos_token_id, pad_token_id;   /* 1, 2, 3 when absent */
    char torch_dtype[16];                /* "float16", "bfloat16", "float32" or "" when absent */
} pln_bloom_config;

/* Reads config.json. Accepts both key spellings (n_embed | hidden_size, n_head |
 * num_attention_heads, n_layer | num_hidden_layers). Rejects model_type other than "bloom",
 * apply_residual_connection_post_layernorm true, hidden_size % n_head != 0, non-positive sizes
 * and files that are not JSON; the error names the file and the key. */
int pln_bloom_config_load(const char *config_json_path, pln_bloom_config *cfg);
/* Same, from a parsed JSON object (json_t *); `where` names it in errors. */
int pln_bloom_config_from_json(const void *json_obj, const char *where, pln_bloom_config *cfg);

typedef struct pln_ckpt {
    char *path;                /* as given */
    char *dir;                 /* directory holding the files */
    bool has_config;           /* config.json found (in dir) and valid */
    pln_bloom_config config;
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
