/* model.h — the BLOOM forward pass of one rank, written once over kernels/backend.h and comm.h.
 *
 * The model holds pointers to the loader's weights, this rank's ALiBi slopes and scratch
 * activations sized for the largest step seen. A step is any mix of sequences at any positions
 * (prefill chunks and decodes together, no padding): tokens are concatenated, each with its
 * sequence index and position, and the paged KV cache gives every sequence its own keys. */
#ifndef PLN_MODEL_H
#define PLN_MODEL_H

#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/kvcache.h"
#include "runtime/loader.h"

typedef struct {
    const uint16_t *ln1_g, *ln1_b;
    pln_weight qkv;       const uint16_t *qkv_b;
    pln_weight dense;     const uint16_t *dense_b;
    const uint16_t *ln2_g, *ln2_b;
    pln_weight h_to_4h;   const uint16_t *h_to_4h_b;
    pln_weight fourh_to_h; const uint16_t *fourh_to_h_b;
} pln_layer;

typedef struct {
    pln_backend *be;
    pln_comm *comm;
    pln_model_config cfg;
    int32_t n_head_local, head_dim;
    int64_t H, Vr, v0;          /* hidden; vocab rows of this rank and the first one's global id */
    int64_t n_valid_local;      /* rows of the slice that are real tokens (the rest is padding) */
    pln_weight emb;             /* [Vr, H], the tied lm head too */
    pln_weight emb_host;        /* host view, for I8 embeddings looked up on the host */
    const uint16_t *emb_ln_g, *emb_ln_b, *lnf_g, *lnf_b;
    pln_layer *layers;
    float *slopes;              /* device [n_head_local] */
    /* scratch (device), sized for cap_tokens tokens / cap_rows logits rows / cap_bt table entries */
    int32_t cap_tokens, cap_rows, cap_bt;
    void *x, *ln, *qkv, *attn, *h4, *y, *sel;
    float *logits;
    int32_t *d_ids, *d_seq, *d_pos, *d_rows, *d_bt;
    float *host_emb;            /* host staging for I8 embedding rows */
} pln_model;

/* Builds the model from an open loader. NULL + error (a missing or misshapen tensor). */
pln_model *pln_model_create(pln_backend *be, pln_comm *comm, pln_loader *ld);
void pln_model_free(pln_model *m);

/* One forward step over T tokens (host arrays): ids[T], tok_seq[T] (index into the step's S
 * sequences), tok_pos[T]; block_table [S * kv->max_blocks] (host); the KV blocks must already be
 * reserved. Computes logits (F32, this rank's vocab slice [n_rows, Vr], pad rows -inf) of the
 * tokens listed in rows[n_rows] into *logits_out (device memory owned by the model, valid until
 * the next call). Collective: every rank calls it with the same arguments. On an op failure the
 * remaining collectives still run (so no rank hangs) and -1 + error is returned. */
int pln_model_forward(pln_model *m, pln_kvcache *kv, const int32_t *ids, int32_t T,
                      const int32_t *tok_seq, const int32_t *tok_pos, int32_t S,
                      const int32_t *block_table, const int32_t *rows, int32_t n_rows,
                      float **logits_out);

#endif
