/* model.c — BLOOM's forward pass on one rank (Megatron-style TP), exactly modeling_bloom.py's
 * numerics: embed (vocab-parallel, all-reduce) → word_embeddings_layernorm → per layer
 * LN1 → fused QKV (+bias) → KV append + ALiBi attention over this rank's heads → dense (row-
 * parallel, all-reduce) → x += out + dense.bias, LN2 → h_to_4h (+bias, GeLU) → 4h_to_h (row-
 * parallel, all-reduce) → x += out + bias, next LN1 (or ln_f) → logits of this rank's vocab slice. */
#include "runtime/model.h"
#include "kernels/pln_math.h"

#include <stdlib.h>
#include <string.h>

static int get_f16(pln_loader *ld, const char *name, int64_t n, const uint16_t **out) {
    return pln_loader_f16(ld, name, n, out);
}

pln_model *pln_model_create(pln_backend *be, pln_comm *comm, pln_loader *ld) {
    const pln_model_config *c = pln_loader_config(ld);
    pln_model *m = pln_xcalloc(1, sizeof *m);
    m->be = be;
    m->comm = comm;
    m->cfg = *c;
    int tp = c->tp;
    if (c->hidden % c->n_head || c->n_head % tp || c->vocab_padded % tp || c->vocab_padded < c->vocab_size) {
        pln_errorf("model config: hidden %lld, n_head %lld, vocab_padded %lld, tp %d are inconsistent "
                   "(need hidden %% n_head == 0, n_head %% tp == 0, vocab_padded %% tp == 0)",
                   (long long)c->hidden, (long long)c->n_head, (long long)c->vocab_padded, tp);
        free(m);
        return NULL;
    }
    m->H = c->hidden;
    m->head_dim = (int32_t)(c->hidden / c->n_head);
    m->n_head_local = (int32_t)(c->n_head / tp);
    m->Vr = c->vocab_padded / tp;
    m->v0 = (int64_t)c->rank * m->Vr;
    int64_t nv = c->vocab_size - m->v0;
    m->n_valid_local = nv < 0 ? 0 : nv > m->Vr ? m->Vr : nv;
    int64_t H = m->H, Hl = H / tp, F = 4 * H / tp;

    char name[128];
    int rc = 0;
    rc |= pln_loader_weight(ld, "word_embeddings.weight", m->Vr, H, &m->emb);
    if (!rc && m->emb.dtype == PLN_DTYPE_I8)
        rc |= pln_loader_weight_host(ld, "word_embeddings.weight", m->Vr, H, &m->emb_host);
    if (!rc) rc |= get_f16(ld, "word_embeddings_layernorm.weight", H, &m->emb_ln_g);
    if (!rc) rc |= get_f16(ld, "word_embeddings_layernorm.bias", H, &m->emb_ln_b);
    m->layers = pln_xcalloc((size_t)c->n_layer, sizeof *m->layers);
    for (int64_t i = 0; i < c->n_layer && !rc; i++) {
        pln_layer *L = &m->layers[i];
#define F16(field, suffix, n) do { snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= get_f16(ld, name, n, &L->field); } while (0)
#define LIN(field, suffix, r, cc) do { snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= pln_loader_weight(ld, name, r, cc, &L->field); } while (0)
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
    if (!rc) rc |= get_f16(ld, "ln_f.weight", H, &m->lnf_g);
    if (!rc) rc |= get_f16(ld, "ln_f.bias", H, &m->lnf_b);
    if (rc) { pln_model_free(m); return NULL; }

    /* ALiBi slopes of this rank's heads: global head index rank * h_l + j. */
    float slopes[4096];
    if (m->n_head_local > 4096) { pln_errorf("model: %d heads per rank is over 4096", m->n_head_local); pln_model_free(m); return NULL; }
    for (int32_t j = 0; j < m->n_head_local; j++)
        slopes[j] = pln_alibi_slope(c->rank * m->n_head_local + j, (int)c->n_head);
    const char *ge = getenv("PLN_GRAPHS");
    m->graphs_on = be->graph_begin && be->graph_end && be->graph_launch && be->graph_free && be->graph_epoch &&
                   pln_comm_allreduce_recordable(comm) && !(ge && !strcmp(ge, "0"));
    m->slopes = be->alloc(be, (size_t)m->n_head_local * sizeof(float));
    if (!m->slopes || be->upload(be, m->slopes, slopes, (size_t)m->n_head_local * sizeof(float))) {
        pln_model_free(m);
        return NULL;
    }
    return m;
}

static void free_scratch(pln_model *m, bool tokens, bool rows, bool bt) {
    pln_backend *be = m->be;
#define FR(p) do { if (p) be->free(be, (void *)(p)); (p) = NULL; } while (0)
    if (tokens) {
        FR(m->x); FR(m->ln); FR(m->qkv); FR(m->attn); FR(m->h4); FR(m->y);
        FR(m->d_ids); FR(m->d_seq); FR(m->d_pos);
        free(m->host_emb); m->host_emb = NULL;
        m->cap_tokens = 0;
    }
    if (rows) { FR(m->sel); FR(m->logits); FR(m->d_rows); m->cap_rows = 0; }
    if (bt) { FR(m->d_bt); m->cap_bt = 0; }
#undef FR
}

static void graphs_clear(pln_model *m) {
    for (int i = 0; i < PLN_MODEL_GRAPHS; i++) {
        if (m->graphs[i].g) m->be->graph_free(m->be, m->graphs[i].g);
        memset(&m->graphs[i], 0, sizeof m->graphs[i]);
    }
}

void pln_model_set_graphs(pln_model *m, bool on) {
    if (!on) graphs_clear(m);
    m->graphs_on = on && m->be->graph_begin && m->be->graph_end && m->be->graph_launch && m->be->graph_free &&
                   m->be->graph_epoch && pln_comm_allreduce_recordable(m->comm);
}

void pln_model_free(pln_model *m) {
    if (!m) return;
    graphs_clear(m);
    free_scratch(m, true, true, true);
    if (m->slopes) m->be->free(m->be, m->slopes);
    free(m->layers);
    free(m);
}

/* Grows the scratch buffers (never shrinks: steps are bounded by the engine's limits). */
static int ensure_scratch(pln_model *m, int32_t T, int32_t R, int32_t nbt) {
    pln_backend *be = m->be;
    size_t a = be->act_size;
    int tp = m->cfg.tp;
    size_t H = (size_t)m->H, Hl = H / (size_t)tp, F = 4 * H / (size_t)tp;
    if (T > m->cap_tokens) {
        free_scratch(m, true, false, false);
        size_t t = (size_t)T;
        m->x = be->alloc(be, t * H * a);
        m->ln = be->alloc(be, t * H * a);
        m->y = be->alloc(be, t * H * a);
        m->qkv = be->alloc(be, t * 3 * Hl * a);
        m->attn = be->alloc(be, t * Hl * a);
        m->h4 = be->alloc(be, t * F * a);
        m->d_ids = be->alloc(be, t * 4);
        m->d_seq = be->alloc(be, t * 4);
        m->d_pos = be->alloc(be, t * 4);
        if (!m->x || !m->ln || !m->y || !m->qkv || !m->attn || !m->h4 || !m->d_ids || !m->d_seq || !m->d_pos) {
            free_scratch(m, true, false, false);
            return pln_error_context("model: activations for %d tokens", T);
        }
        if (m->emb.dtype == PLN_DTYPE_I8) m->host_emb = pln_xmalloc(t * H * sizeof(float));
        m->cap_tokens = T;
        m->scratch_gen++;
    }
    if (R > m->cap_rows) {
        free_scratch(m, false, true, false);
        m->sel = be->alloc(be, (size_t)R * H * a);
        m->logits = be->alloc(be, (size_t)R * (size_t)m->Vr * sizeof(float));
        m->d_rows = be->alloc(be, (size_t)R * 4);
        if (!m->sel || !m->logits || !m->d_rows) {
            free_scratch(m, false, true, false);
            return pln_error_context("model: logits for %d rows", R);
        }
        m->cap_rows = R;
        m->scratch_gen++;
    }
    if (nbt > m->cap_bt) {
        free_scratch(m, false, false, true);
        m->d_bt = be->alloc(be, (size_t)nbt * 4);
        if (!m->d_bt) return pln_error_context("model: block table of %d entries", nbt);
        m->cap_bt = nbt;
        m->scratch_gen++;
    }
    return 0;
}

/* Embedding rows of an I8 vocab slice, dequantized on the host and uploaded (the backend's embed
 * op takes F16 tables only; an I8 embedding is the rare --quantize-embedding case). */
static int embed_i8_host(pln_model *m, const int32_t *ids, int32_t T) {
    const pln_weight *W = &m->emb_host;
    int64_t H = m->H, ng = W->cols / W->group;
    float *out = m->host_emb;
    for (int32_t t = 0; t < T; t++) {
        float *o = out + (size_t)t * H;
        int64_t r = (int64_t)ids[t] - m->v0;
        if (r < 0 || r >= m->Vr) { memset(o, 0, (size_t)H * sizeof(float)); continue; }
        const int8_t *q = (const int8_t *)W->w + r * W->cols;
        const uint16_t *s = W->scale + r * ng;
        for (int64_t j = 0; j < H; j++) o[j] = pln_dequant_i8(q[j], pln_f16_to_f32(s[j / W->group]));
    }
    size_t n = (size_t)T * (size_t)H;
    if (m->be->act_dtype == PLN_DTYPE_F16) {
        uint16_t *h = (uint16_t *)out;   /* in place: element i (2 bytes) never overtakes float i */
        for (size_t i = 0; i < n; i++) h[i] = pln_f32_to_f16(out[i]);
        return m->be->upload(m->be, m->x, h, n * 2);
    }
    return m->be->upload(m->be, m->x, out, n * sizeof(float));
}

/* The step's ops from the embedding to the logits, all on the backend's stream (the inputs are
 * in m->d_* already). Ops stop at the first failure, but collectives keep their order so no rank
 * is left waiting. Returns 0 or -1. */
static int enqueue_step(pln_model *m, pln_kvcache *kv, const pln_attn_meta *meta, const int32_t *ids, int32_t T,
                        int32_t n_rows) {
    pln_backend *be = m->be;
    const int64_t H = m->H;
    const float eps = m->cfg.eps;
    const pln_dtype adt = be->act_dtype;
    int rc = 0;
#define OP(call) do { if (rc == 0 && (call) != 0) rc = -1; } while (0)
#define ALLREDUCE(buf) do { if (pln_comm_allreduce(m->comm, buf, (size_t)T * (size_t)H, adt) != 0 && rc == 0) rc = -1; } while (0)
    if (m->emb.dtype == PLN_DTYPE_I8) OP(embed_i8_host(m, ids, T));
    else OP(be->embed(be, m->x, m->d_ids, T, (const uint16_t *)m->emb.w, m->v0, m->Vr, H));
    ALLREDUCE(m->x);
    OP(be->layernorm(be, m->x, m->x, m->emb_ln_g, m->emb_ln_b, T, H, eps));
    if (m->cfg.n_layer > 0) OP(be->layernorm(be, m->ln, m->x, m->layers[0].ln1_g, m->layers[0].ln1_b, T, H, eps));
    else OP(be->layernorm(be, m->ln, m->x, m->lnf_g, m->lnf_b, T, H, eps));
    for (int64_t i = 0; i < m->cfg.n_layer; i++) {
        const pln_layer *L = &m->layers[i];
        OP(be->linear(be, m->qkv, m->ln, &L->qkv, L->qkv_b, T, false));
        if (be->append_attention)   /* fused where the backend can (one launch on CUDA decode steps) */
            OP(be->append_attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, m->slopes,
                                    m->n_head_local, m->head_dim));
        else {
            OP(be->kv_append(be, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, m->n_head_local, m->head_dim));
            OP(be->attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], meta, m->slopes,
                             m->n_head_local, m->head_dim));
        }
        OP(be->linear(be, m->y, m->attn, &L->dense, NULL, T, false));
        ALLREDUCE(m->y);
        OP(be->residual_layernorm(be, m->x, m->y, L->dense_b, L->ln2_g, L->ln2_b, m->ln, T, H, eps));
        OP(be->linear(be, m->h4, m->ln, &L->h_to_4h, L->h_to_4h_b, T, true));
        OP(be->linear(be, m->y, m->h4, &L->fourh_to_h, NULL, T, false));
        ALLREDUCE(m->y);
        const uint16_t *ng = i + 1 < m->cfg.n_layer ? m->layers[i + 1].ln1_g : m->lnf_g;
        const uint16_t *nb = i + 1 < m->cfg.n_layer ? m->layers[i + 1].ln1_b : m->lnf_b;
        OP(be->residual_layernorm(be, m->x, m->y, L->fourh_to_h_b, ng, nb, m->ln, T, H, eps));
    }
    if (n_rows > 0) {
        OP(be->gather_rows(be, m->sel, m->ln, m->d_rows, n_rows, H));
        OP(be->logits(be, m->logits, m->sel, &m->emb, n_rows, m->n_valid_local));
    }
#undef OP
#undef ALLREDUCE
    return rc;
}

/* The graph slot for (T, n_rows, max_pos): the existing one, else a free or least recently used
 * slot (its graph freed) keyed anew with g NULL. */
static struct pln_model_graph *graph_slot(pln_model *m, int32_t T, int32_t n_rows, int32_t max_pos) {
    struct pln_model_graph *lru = &m->graphs[0];
    for (int i = 0; i < PLN_MODEL_GRAPHS; i++) {
        struct pln_model_graph *e = &m->graphs[i];
        if (e->T == T && e->n_rows == n_rows && e->max_pos == max_pos) return e;
        if (e->last_use < lru->last_use) lru = e;
    }
    if (lru->g) m->be->graph_free(m->be, lru->g);
    memset(lru, 0, sizeof *lru);
    lru->T = T;
    lru->n_rows = n_rows;
    lru->max_pos = max_pos;
    return lru;
}

/* Records the step into slot e. Every rank takes part in the agreement (one allgather) so that a
 * failure anywhere turns graphs off everywhere. Returns 0 when e->g is ready to launch. */
static int graph_record(pln_model *m, pln_kvcache *kv, struct pln_model_graph *e, const pln_attn_meta *meta,
                        const int32_t *ids, int32_t T, int32_t n_rows) {
    pln_backend *be = m->be;
    int rc = be->graph_begin(be);
    if (!rc) {
        int op_rc = enqueue_step(m, kv, meta, ids, T, n_rows);
        void *g = e->g;
        int end_rc = be->graph_end(be, &g);
        e->g = g;
        rc = op_rc || end_rc ? -1 : 0;
    }
    if (rc) pln_error_context("recording a decode step of %d tokens as a graph", T);
    int tp = pln_comm_size(m->comm);
    if (tp > 1) {
        int32_t mine = rc ? 1 : 0, *all = pln_xmalloc((size_t)tp * sizeof *all);
        if (pln_comm_allgather(m->comm, &mine, all, sizeof mine)) rc = -1;
        else for (int i = 0; i < tp; i++) if (all[i]) rc = -1;
        free(all);
    }
    if (rc) {
        fprintf(stderr, "pollen: rank %d: decode steps run op by op from now on (%s)\n", m->cfg.rank,
                pln_error());
        pln_model_set_graphs(m, false);
        return -1;
    }
    e->gen = m->scratch_gen;
    e->epoch = be->graph_epoch(be);
    m->graph_stats.recorded++;
    return 0;
}

int pln_model_forward(pln_model *m, pln_kvcache *kv, const int32_t *ids, int32_t T,
                      const int32_t *tok_seq, const int32_t *tok_pos, int32_t S,
                      const int32_t *block_table, const int32_t *rows, int32_t n_rows,
                      float **logits_out) {
    pln_backend *be = m->be;
    *logits_out = NULL;
    if (T < 1 || S < 1 || n_rows < 0) return pln_errorf("model forward: %d tokens, %d sequences", T, S);
    int32_t nbt = S * kv->max_blocks;
    if (ensure_scratch(m, T, n_rows > 0 ? n_rows : 1, nbt)) return -1;
    int32_t max_pos = 0;
    for (int32_t t = 0; t < T; t++) if (tok_pos[t] + 1 > max_pos) max_pos = tok_pos[t] + 1;

    /* A decode step may run as a graph: its attention length bound is rounded up so that one
     * graph serves many steps (keys past a token's position cost an empty split). */
    bool decode = m->graphs_on && T == S && n_rows > 0 && m->emb.dtype != PLN_DTYPE_I8;
    if (decode) {
        int32_t cap = kv->max_blocks * kv->block_size, b = 128;
        while (b < max_pos) b *= 2;
        max_pos = b < cap ? b : cap > max_pos ? cap : max_pos;
    }

    int rc = 0;
#define OP(call) do { if (rc == 0 && (call) != 0) rc = -1; } while (0)
    OP(be->upload(be, m->d_ids, ids, (size_t)T * 4));
    OP(be->upload(be, m->d_seq, tok_seq, (size_t)T * 4));
    OP(be->upload(be, m->d_pos, tok_pos, (size_t)T * 4));
    OP(be->upload(be, m->d_bt, block_table, (size_t)nbt * 4));
    if (n_rows > 0) OP(be->upload(be, m->d_rows, rows, (size_t)n_rows * 4));
#undef OP
    pln_attn_meta meta = {
        .n_tokens = T, .n_seqs = S, .block_size = kv->block_size, .max_blocks = kv->max_blocks,
        .max_pos = max_pos, .tok_seq = m->d_seq, .tok_pos = m->d_pos, .block_table = m->d_bt,
    };

    /* Every input the decision reads (shapes, scratch growth, the backend's epoch) is the same on
     * every rank, so all ranks replay, record or run op by op together. */
    bool done = false;
    if (decode && rc == 0) {
        struct pln_model_graph *e = graph_slot(m, T, n_rows, max_pos);
        e->last_use = ++m->graph_clock;
        bool fresh = e->g && e->gen == m->scratch_gen && e->epoch == be->graph_epoch(be);
        /* The first step of a shape runs op by op: it sizes every buffer the recording needs. */
        if (fresh || (e->runs > 0 && graph_record(m, kv, e, &meta, ids, T, n_rows) == 0)) {
            if (be->graph_launch(be, e->g) != 0) rc = -1;
            else m->graph_stats.replayed++;
            done = true;
        }
        e->runs++;
    }
    if (!done) {
        if (enqueue_step(m, kv, &meta, ids, T, n_rows) != 0 && rc == 0) rc = -1;
        m->graph_stats.eager++;
    }
    *logits_out = m->logits;
    if (rc) return pln_error_context("forward pass (rank %d)", m->cfg.rank);
    return 0;
}
