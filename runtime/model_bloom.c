/* model_bloom.c — BLOOM's forward pass on one rank (Megatron-style TP), exactly modeling_bloom.py's
 * numerics: embed (vocab-parallel, all-reduce) → word_embeddings_layernorm → per layer
 * LN1 → fused QKV (+bias) → KV append + ALiBi attention over this rank's heads → dense (row-
 * parallel, all-reduce) → x += out + dense.bias, LN2 → h_to_4h (+bias, GeLU) → 4h_to_h (row-
 * parallel, all-reduce) → x += out + bias, next LN1 (or ln_f) → logits of this rank's vocab slice
 * (the tied embedding). The layout is "bloom-tp-v1" (docs/FORMAT.md). */
#include "runtime/family.h"
#include "formats/shard.h"
#include "kernels/pln_math.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint16_t *ln1_g, *ln1_b;
    pln_weight qkv;       const uint16_t *qkv_b;
    pln_weight dense;     const uint16_t *dense_b;
    const uint16_t *ln2_g, *ln2_b;
    pln_weight h_to_4h;   const uint16_t *h_to_4h_b;
    pln_weight fourh_to_h; const uint16_t *fourh_to_h_b;
} bloom_layer;

typedef struct {
    const uint16_t *emb_ln_g, *emb_ln_b, *lnf_g, *lnf_b;
    bloom_layer *layers;
    float *slopes;              /* device [n_head_local] */
} bloom_state;

static void bloom_free(pln_model *m) {
    bloom_state *s = m->fam;
    if (!s) return;
    if (s->slopes) m->be->free(m->be, s->slopes);
    free(s->layers);
    free(s);
    m->fam = NULL;
}

static int bloom_create(pln_model *m, pln_loader *ld) {
    const pln_model_config *c = &m->cfg;
    pln_backend *be = m->be;
    int tp = c->tp;
    if (c->hidden % c->n_head || c->n_head % tp)
        return pln_errorf("model config: hidden %lld, n_head %lld, tp %d are inconsistent (need hidden %% n_head == 0, "
                          "n_head %% tp == 0)", (long long)c->hidden, (long long)c->n_head, tp);
    bloom_state *s = pln_xcalloc(1, sizeof *s);
    m->fam = s;
    m->head_dim = (int32_t)(c->hidden / c->n_head);
    m->n_head_local = (int32_t)(c->n_head / tp);
    m->n_kv_local = m->n_head_local;
    int64_t H = m->H, Hl = H / tp, F = 4 * H / tp;
    m->w_qkv = 3 * Hl;
    m->w_attn = Hl;
    m->w_h4 = F;
    m->w_h4b = 0;

    char name[128];
    int rc = 0;
    rc |= pln_loader_weight(ld, "word_embeddings.weight", m->Vr, H, &m->emb);
    if (!rc && m->emb.dtype == PLN_DTYPE_I8)
        rc |= pln_loader_weight_host(ld, "word_embeddings.weight", m->Vr, H, &m->emb_host);
    m->lm = m->emb;   /* tied */
    if (!rc) rc |= pln_loader_f16(ld, "word_embeddings_layernorm.weight", H, &s->emb_ln_g);
    if (!rc) rc |= pln_loader_f16(ld, "word_embeddings_layernorm.bias", H, &s->emb_ln_b);
    s->layers = pln_xcalloc((size_t)c->n_layer, sizeof *s->layers);
    for (int64_t i = 0; i < c->n_layer && !rc; i++) {
        bloom_layer *L = &s->layers[i];
#define F16(field, suffix, n) do { snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= pln_loader_f16(ld, name, n, &L->field); } while (0)
#define LIN(field, suffix, r, cc) do { snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= pln_loader_weight(ld, name, r, cc, &L->field); \
        m->layer_macs += (int64_t)(r) * (cc); } while (0)
        F16(ln1_g, "input_layernorm.weight", H);
        F16(ln1_b, "input_layernorm.bias", H);
        LIN(qkv, "self_attention.query_key_value.weight", 3 * Hl, H);
        F16(qkv_b, "self_attention.query_key_value.bias", 3 * Hl);
        LIN(dense, "self_attention.dense.weight", H, Hl);
        F16(dense_b, "self_attention.dense.bias", H);
        F16(ln2_g, "post_attention_layernorm.weight", H);
        F16(ln2_b, "post_attention_layernorm.bias", H);
        LIN(h_to_4h, "mlp.dense_h_to_4h.weight", F, H);
        F16(h_to_4h_b, "mlp.dense_h_to_4h.bias", F);
        LIN(fourh_to_h, "mlp.dense_4h_to_h.weight", H, F);
        F16(fourh_to_h_b, "mlp.dense_4h_to_h.bias", H);
#undef F16
#undef LIN
    }
    if (!rc) rc |= pln_loader_f16(ld, "ln_f.weight", H, &s->lnf_g);
    if (!rc) rc |= pln_loader_f16(ld, "ln_f.bias", H, &s->lnf_b);
    if (rc) return -1;

    /* ALiBi slopes of this rank's heads: global head index rank * h_l + j. */
    float slopes[4096];
    if (m->n_head_local > 4096) return pln_errorf("model: %d heads per rank is over 4096", m->n_head_local);
    for (int32_t j = 0; j < m->n_head_local; j++)
        slopes[j] = pln_alibi_slope(c->rank * m->n_head_local + j, (int)c->n_head);
    s->slopes = be->alloc(be, (size_t)m->n_head_local * sizeof(float));
    if (!s->slopes || be->upload(be, s->slopes, slopes, (size_t)m->n_head_local * sizeof(float))) return -1;
    return 0;
}

static int bloom_enqueue(pln_model *m, pln_kvcache *kv, const pln_attn_meta *meta, int32_t T, int32_t n_rows,
                         bool failed) {
    pln_backend *be = m->be;
    const bloom_state *s = m->fam;
    const int64_t H = m->H;
    const float eps = m->cfg.eps;
    const pln_dtype adt = be->act_dtype;
    int rc = failed ? -1 : 0;
#define OP(call) do { if (rc == 0 && (call) != 0) rc = -1; } while (0)
#define ALLREDUCE(buf) do { if (pln_comm_allreduce(m->comm, buf, (size_t)T * (size_t)H, adt) != 0 && rc == 0) rc = -1; } while (0)
    OP(be->layernorm(be, m->x, m->x, s->emb_ln_g, s->emb_ln_b, T, H, eps));
    if (m->cfg.n_layer > 0) OP(be->layernorm(be, m->ln, m->x, s->layers[0].ln1_g, s->layers[0].ln1_b, T, H, eps));
    else OP(be->layernorm(be, m->ln, m->x, s->lnf_g, s->lnf_b, T, H, eps));
    for (int64_t i = 0; i < m->cfg.n_layer; i++) {
        const bloom_layer *L = &s->layers[i];
        OP(be->linear(be, m->qkv, m->ln, &L->qkv, L->qkv_b, T, PLN_EPI_NONE));
        if (be->append_attention)   /* fused where the backend can (one launch on CUDA decode steps) */
            OP(be->append_attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, s->slopes,
                                    m->n_head_local, m->head_dim));
        else {
            OP(be->kv_append(be, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, m->n_head_local, m->head_dim));
            OP(be->attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, s->slopes,
                             m->n_head_local, m->head_dim));
        }
        OP(be->linear(be, m->y, m->attn, &L->dense, NULL, T, PLN_EPI_NONE));
        ALLREDUCE(m->y);
        OP(be->residual_layernorm(be, m->x, m->y, L->dense_b, L->ln2_g, L->ln2_b, m->ln, T, H, eps));
        OP(be->linear(be, m->h4, m->ln, &L->h_to_4h, L->h_to_4h_b, T, PLN_EPI_GELU));
        OP(be->linear(be, m->y, m->h4, &L->fourh_to_h, NULL, T, PLN_EPI_NONE));
        ALLREDUCE(m->y);
        const uint16_t *ng = i + 1 < m->cfg.n_layer ? s->layers[i + 1].ln1_g : s->lnf_g;
        const uint16_t *nb = i + 1 < m->cfg.n_layer ? s->layers[i + 1].ln1_b : s->lnf_b;
        OP(be->residual_layernorm(be, m->x, m->y, L->fourh_to_h_b, ng, nb, m->ln, T, H, eps));
    }
    if (n_rows > 0) {
        OP(be->gather_rows(be, m->sel, m->ln, m->d_rows, n_rows, H));
        OP(be->logits(be, m->logits, m->sel, &m->lm, n_rows, m->n_valid_local));
    }
#undef OP
#undef ALLREDUCE
    return rc;
}

const pln_model_family pln_model_family_bloom = {
    .layout = PLN_LAYOUT_BLOOM_TP_V1,
    .create = bloom_create,
    .enqueue = bloom_enqueue,
    .free = bloom_free,
};
