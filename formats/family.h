/* family.h — a model family as the formats layer knows it: one description per family (its
 * config.json, its manifest fields, its TP split plan and its layout id), and the registry that
 * maps config.json's "model_type" and a set's layout id to it.
 *
 * Code outside the family files asks the family (pln_family_of, pln_family_by_layout) for what it
 * needs and never tests which family it is. The runtime side of a family (its forward pass over
 * kernels/backend.h) is runtime/family.h, keyed by the same layout id.
 *
 * Families: formats/family_bloom.c ("bloom", layout "bloom-tp-v1"), formats/family_llama.c ("llama",
 * "mistral", "qwen2"; layout "llama-tp-v1"). */
#ifndef PLN_FAMILY_H
#define PLN_FAMILY_H

#include "formats/hf.h"
#include "formats/shard.h"
#include "formats/tp.h"

#include <jansson.h>

typedef struct pln_family pln_family;
struct pln_family {
    const char *name;                    /* "bloom" */
    const char *const *model_types;      /* config.json "model_type" values it reads; NULL-terminated */
    const char *layout;                  /* the layout id of its shard sets */
    const char *hf_prefix;               /* what save_pretrained puts before its tensor names ("transformer.") */
    const char *layers_key;              /* config.json's layer count key ("n_layer", "num_hidden_layers") */

    /* config.json (a JSON object) into cfg, model_type already checked to be one of ours: every
     * field of the family, defaults filled in. -1 + error naming `where` and the key. */
    int (*config_from_json)(json_t *o, const char *where, pln_hf_config *cfg);
    /* What a shard set of this family needs beyond a valid config (e.g. the special ids the
     * runtime relies on). -1 + error naming `where`. */
    int (*config_servable)(const pln_hf_config *c, const char *where);
    /* The manifest's config block: the family's own fields beyond the common ones (model_type
     * included where the family writes it), added to / read from the object o. get: -1 + error
     * naming path and the key. BLOOM writes none (its manifests predate families). */
    void (*manifest_put)(const pln_hf_config *c, json_t *o);
    int (*manifest_get)(json_t *o, const char *path, pln_hf_config *c);
    /* Appends the family's fields to the canonical text of the config block (docs/FORMAT.md,
     * "Checksums of the small files"): returns the bytes added (< len), or -1 if len is too small. */
    int (*canonical_extra)(const pln_hf_config *c, char *buf, size_t len);
    /* The family's fields of the manifest's config (m) against config.json's (f); -1 + error
     * naming the field and fpath / mpath. */
    int (*config_agrees)(const pln_hf_config *m, const pln_hf_config *f, const char *fpath, const char *mpath);

    /* Whether the model splits tp ways with these options (-1 + error saying what to change), and
     * rank's tensors in file order (formats/tp.h: *out malloc'd). */
    int (*tp_check)(const pln_hf_config *c, const pln_tp_opts *o);
    int (*tp_plan)(const pln_hf_config *c, const pln_tp_opts *o, int rank, pln_tp_entry **out, size_t *n);
    /* The rank file's tensor table as the loader checks it (shard.h's pln_layout_* contract). */
    pln_shard_spec *(*layout_specs)(const pln_layout_params *p, int32_t rank, size_t *n);
};

/* The family reading config.json's model_type ("" or NULL: "bloom"). NULL + error listing the
 * model types this pollen reads. */
const pln_family *pln_family_by_model_type(const char *model_type);
/* The family of a set's layout id. NULL + error listing the known layouts. */
const pln_family *pln_family_by_layout(const char *layout);
/* The family of a parsed config (its model_type). Never NULL for a config that parsed. */
const pln_family *pln_family_of(const pln_hf_config *c);
/* "bloom, llama, ..." and "bloom-tp-v1, ...": for messages. */
const char *pln_family_model_types(void);
const char *pln_family_layouts(void);

/* The families, each described in its own file. */
extern const pln_family pln_family_bloom;
extern const pln_family pln_family_llama;

#endif
