/* model.h — the forward pass of one rank, written once over kernels/backend.h and comm.h for each
 * model family (runtime/family.h: the set's layout id picks it; BLOOM is runtime/model_bloom.c).
 *
 * The model holds pointers to the loader's weights, what its family's steps need (BLOOM: this
 * rank's ALiBi slopes) and scratch activations sized for the largest step seen. A step is any mix of sequences at any positions
 * (prefill chunks and decodes together, no padding): tokens are concatenated, each with its
 * sequence index and position, and the paged KV cache gives every sequence its own keys. */
#ifndef PLN_MODEL_H
#define PLN_MODEL_H

#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/kvcache.h"
#include "runtime/loader.h"

#define PLN_MODEL_GRAPHS 32

typedef struct pln_model_family pln_model_family;

typedef struct pln_model {
    pln_backend *be;
    pln_comm *comm;
    pln_model_config cfg;
    const pln_model_family *family;   /* runtime/family.h, from the set's layout */
    void *fam;                  /* the family's own state (its layers, ...) */
    int32_t n_head_local, head_dim;
    int32_t n_kv_local;         /* KV heads this rank's cache holds (BLOOM: n_head_local) */
    int64_t H, Vr, v0;          /* hidden; vocab rows of this rank and the first one's global id */
    int64_t n_valid_local;      /* rows of the slice that are real tokens (the rest is padding) */
    pln_weight emb;             /* [Vr, H] */
    pln_weight emb_host;        /* host view, for I8 embeddings looked up on the host */
    pln_weight lm;              /* [Vr, H]: the logits matrix (the embedding itself when tied) */
    int64_t layer_macs;         /* multiply-adds per token in the layers' linear weights, this
                                 * rank (set by the family as it loads them: a benchmark's FLOPs) */
    int32_t window;             /* keys a query reads at most (a sliding window); 0: all before it */
    /* scratch widths per token (set by the family): qkv, attention output, MLP up-projection
     * output, and a second MLP buffer (0: none) */
    int64_t w_qkv, w_attn, w_h4, w_h4b;
    /* scratch (device), sized for cap_tokens tokens / cap_rows logits rows / cap_bt table entries */
    int32_t cap_tokens, cap_rows, cap_bt;
    void *x, *ln, *qkv, *attn, *h4, *h4b, *y, *sel;
    float *logits;
    int32_t *d_ids, *d_seq, *d_pos, *d_rows, *d_bt;
    float *host_emb;            /* host staging for I8 embedding rows */
    uint64_t scratch_gen;       /* bumped whenever the scratch above moves */
    /* Decode steps replayed as backend graphs (see pln_model_forward). */
    bool graphs_on;
    struct pln_model_graph {
        int32_t T, n_rows, max_pos; /* the key: tokens (= sequences), logits rows, attention bound */
        int32_t runs;           /* steps of this shape so far */
        void *g;                /* NULL until recorded (the first step of a shape runs op by op) */
        uint64_t gen, epoch;    /* scratch_gen and backend epoch it was recorded under */
        uint64_t last_use;
    } graphs[PLN_MODEL_GRAPHS];
    uint64_t graph_clock;
    struct { uint64_t recorded, replayed, eager; } graph_stats;
} pln_model;

/* Builds the model from an open loader. NULL + error (a missing or misshapen tensor). */
pln_model *pln_model_create(pln_backend *be, pln_comm *comm, pln_loader *ld);
void pln_model_free(pln_model *m);

/* Decode steps as graphs, on backends that record them (CUDA): on by default there, unless the
 * environment sets PLN_GRAPHS=0. Turning them off frees the recorded graphs. Collective in
 * effect: every rank must make the same choice (NCCL requires a captured collective to be
 * captured on every rank). */
void pln_model_set_graphs(pln_model *m, bool on);

/* One forward step over T tokens (host arrays): ids[T], tok_seq[T] (index into the step's S
 * sequences), tok_pos[T]; block_table [S * kv->max_blocks] (host); the KV blocks must already be
 * reserved. Computes logits (F32, this rank's vocab slice [n_rows, Vr], pad rows -inf) of the
 * tokens listed in rows[n_rows] into *logits_out (device memory owned by the model, valid until
 * the next call). Collective: every rank calls it with the same arguments. On an op failure the
 * remaining collectives still run (so no rank hangs) and -1 + error is returned. */
/* Decode steps (one token per sequence, some logits wanted, F16 embedding) run as a graph once a
 * step of the same shape (T, n_rows, and max_pos rounded up to a power of two, at least 128,
 * at most the KV cache's per-sequence length) has run before: the first such step runs op by op, the second records and replays, later
 * ones replay. Inputs are uploaded into the model's fixed buffers before each replay. A graph
 * that cannot be recorded on some rank turns graphs off on every rank, and the step runs op by
 * op: results are the same either way. */
int pln_model_forward(pln_model *m, pln_kvcache *kv, const int32_t *ids, int32_t T,
                      const int32_t *tok_seq, const int32_t *tok_pos, int32_t S,
                      const int32_t *block_table, const int32_t *rows, int32_t n_rows,
                      float **logits_out);

#endif
