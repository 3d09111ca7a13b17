/* model.c — what every family's forward pass shares (runtime/family.h): the vocabulary slice of
 * this rank, the step's inputs uploaded, the vocab-parallel embedding (all-reduced), the scratch
 * activations, and decode steps replayed as graphs. The family (chosen by the set's layout id)
 * loads its weights and enqueues the rest of each step: runtime/model_bloom.c for BLOOM. */
#include "runtime/model.h"
#include "runtime/family.h"
#include "kernels/pln_math.h"

#include <stdlib.h>
#include <string.h>

pln_model *pln_model_create(pln_backend *be, pln_comm *comm, pln_loader *ld) {
    const pln_model_config *c = pln_loader_config(ld);
    const pln_model_family *fam = pln_model_family_by_layout(c->layout);
    if (!fam) return NULL;
    pln_model *m = pln_xcalloc(1, sizeof *m);
    m->be = be;
    m->comm = comm;
    m->cfg = *c;
    m->family = fam;
    int tp = c->tp;
    if (tp < 1 || c->hidden < 1 || c->vocab_padded % tp || c->vocab_padded < c->vocab_size) {
        pln_errorf("model config: hidden %lld, vocab_padded %lld, vocab_size %lld, tp %d are inconsistent "
                   "(need vocab_padded %% tp == 0 and vocab_padded >= vocab_size)",
                   (long long)c->hidden, (long long)c->vocab_padded, (long long)c->vocab_size, tp);
        free(m);
        return NULL;
    }
    m->H = c->hidden;
    m->Vr = c->vocab_padded / tp;
    m->v0 = (int64_t)c->rank * m->Vr;
    int64_t nv = c->vocab_size - m->v0;
    m->n_valid_local = nv < 0 ? 0 : nv > m->Vr ? m->Vr : nv;
    if (fam->create(m, ld)) { pln_model_free(m); return NULL; }
    bool ge = true;   /* PLN_GRAPHS=0 turns them off (formats/common.h ENV_NOTE) */
    if (pln_env_flag("PLN_GRAPHS", &ge)) { pln_model_free(m); return NULL; }
    m->graphs_on = be->graph_begin && be->graph_end && be->graph_launch && be->graph_free && be->graph_epoch &&
                   pln_comm_allreduce_recordable(comm) && ge;
    return m;
}

static void free_scratch(pln_model *m, bool tokens, bool rows, bool bt) {
    pln_backend *be = m->be;
#define FR(p) do { if (p) be->free(be, (void *)(p)); (p) = NULL; } while (0)
    if (tokens) {
        FR(m->x); FR(m->ln); FR(m->qkv); FR(m->attn); FR(m->h4); FR(m->h4b); FR(m->y);
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
    if (m->family) m->family->free(m);
    free(m);
}

/* Grows the scratch buffers (never shrinks: steps are bounded by the engine's limits). */
static int ensure_scratch(pln_model *m, int32_t T, int32_t R, int32_t nbt) {
    pln_backend *be = m->be;
    size_t a = be->act_size;
    size_t H = (size_t)m->H;
    if (T > m->cap_tokens) {
        free_scratch(m, true, false, false);
        size_t t = (size_t)T;
        m->x = be->alloc(be, t * H * a);
        m->ln = be->alloc(be, t * H * a);
        m->y = be->alloc(be, t * H * a);
        m->qkv = be->alloc(be, t * (size_t)m->w_qkv * a);
        m->attn = be->alloc(be, t * (size_t)m->w_attn * a);
        m->h4 = be->alloc(be, t * (size_t)m->w_h4 * a);
        m->h4b = m->w_h4b ? be->alloc(be, t * (size_t)m->w_h4b * a) : NULL;
        m->d_ids = be->alloc(be, t * 4);
        m->d_seq = be->alloc(be, t * 4);
        m->d_pos = be->alloc(be, t * 4);
        if (!m->x || !m->ln || !m->y || !m->qkv || !m->attn || !m->h4 || (m->w_h4b && !m->h4b) || !m->d_ids || !m->d_seq ||
            !m->d_pos) {
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
 * in m->d_* already): the vocab-parallel embedding here, the rest by the family. Ops stop at the
 * first failure, but collectives keep their order so no rank is left waiting. Returns 0 or -1. */
static int enqueue_step(pln_model *m, pln_kvcache *kv, const pln_attn_meta *meta, const int32_t *ids, int32_t T,
                        int32_t n_rows) {
    pln_backend *be = m->be;
    int rc = 0;
    if (m->emb.dtype == PLN_DTYPE_I8) rc = embed_i8_host(m, ids, T);
    else rc = be->embed(be, m->x, m->d_ids, T, (const uint16_t *)m->emb.w, m->v0, m->Vr, m->H);
    if (pln_comm_allreduce(m->comm, m->x, (size_t)T * (size_t)m->H, be->act_dtype) != 0) rc = -1;
    if (m->family->enqueue(m, kv, meta, T, n_rows, rc != 0) != 0) rc = -1;
    return rc ? -1 : 0;
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
