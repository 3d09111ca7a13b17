/* family.h — a model family as the runtime knows it: its forward pass on one rank over
 * kernels/backend.h and comm.h, keyed by the layout id of its shard sets (formats/family.h
 * describes the same family to the formats layer).
 *
 * runtime/model.c owns what every family shares (the scratch activations, the step's inputs,
 * decode steps as graphs, the vocabulary slice); a family fills in the rest: its weights, the
 * per-rank head counts (the KV cache holds n_kv_local heads per rank), the widths of its scratch
 * buffers, and the ops of one step. Families: runtime/model_bloom.c, runtime/model_llama.c. */
#ifndef PLN_RUNTIME_FAMILY_H
#define PLN_RUNTIME_FAMILY_H

#include "runtime/model.h"

struct pln_model_family {
    const char *layout;          /* the layout id of the sets it runs */
    /* Finds the rank's tensors in ld (shapes from m->cfg; m->Vr, m->v0, m->n_valid_local are
     * set), sets m->emb (and m->emb_host for an I8 embedding), m->lm, n_head_local, n_kv_local,
     * head_dim and the scratch widths, keeps its own state in m->fam and uploads what its steps
     * need once. -1 + error naming the tensor; m->family->free cleans up after a failure. */
    int (*create)(pln_model *m, pln_loader *ld);
    /* The step's ops from the embedding to the logits of n_rows rows, all on the backend's stream
     * (inputs already in m->d_*; m->x holds the embedded, all-reduced tokens). failed: an earlier
     * op of the step failed. Issues no op after a failure (its own or an earlier one) but keeps
     * every collective, so no rank waits forever. 0, or -1 when any op failed. */
    int (*enqueue)(pln_model *m, pln_kvcache *kv, const pln_attn_meta *meta, int32_t T, int32_t n_rows, bool failed);
    void (*free)(pln_model *m);
};

/* The family running sets of this layout; NULL + error listing the layouts this runtime runs. */
const pln_model_family *pln_model_family_by_layout(const char *layout);

/* The families, each in its own file. */
extern const pln_model_family pln_model_family_bloom;
extern const pln_model_family pln_model_family_llama;

/* The Llama family's rotary inverse frequencies [head_dim / 2] for config c, computed as
 * transformers 4.44 computes them (modeling_rope_utils; fp32; linear and llama3 scaling folded in). */
void pln_llama_inv_freq(const pln_hf_config *c, float *out);

#endif
