/* model_llama.c — the Llama family's forward pass on one rank (model_type llama, mistral, qwen2;
 * layout "llama-tp-v1", docs/FORMAT.md), transformers 4.44's modeling_llama / _mistral / _qwen2
 * numerics over kernels/backend.h:
 *   embed (vocab-parallel, all-reduce) → per layer: RMSNorm → fused qkv [q | k | v] (+ q/k/v
 *   biases) → rotary on q and k → KV append + grouped-query attention over this rank's q heads
 *   (its KV heads split, or replicated when TP exceeds their count) → o_proj (row-parallel,
 *   all-reduce) → x += out (+ o bias), RMSNorm → fused [gate ; up] with silu(gate) * up in its
 *   epilogue (be->linear_swiglu; else a swiglu op after it) → down_proj
 *   (row-parallel, all-reduce) → x += out, next RMSNorm (or the final norm) → logits of this
 *   rank's vocab slice (lm_head, or the embedding when tied).
 * The rotary inverse frequencies are computed once on the host as transformers computes them
 * (pln_llama_inv_freq) and uploaded. */
#include "runtime/family.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint16_t *in_norm, *post_norm;
    pln_weight qkv;       const uint16_t *qkv_b;   /* NULL without q/k/v biases */
    pln_weight o;         const uint16_t *o_b;     /* NULL without an o bias */
    pln_weight gate_up, down;
} llama_layer;

typedef struct {
    llama_layer *layers;
    const uint16_t *norm;
    float *inv_freq;            /* device [head_dim / 2] */
    int32_t window;             /* Mistral's sliding_window (pln_attn_meta.window); 0 = none */
} llama_state;

/* KV heads per rank: split when tp divides them, else the one KV head a rank's q heads read
 * (formats/family_llama.c lays the rank files out so). */
static int32_t kv_local(const pln_hf_config *c, int tp) {
    return (int32_t)(c->n_kv_head % tp == 0 ? c->n_kv_head / tp : 1);
}

void pln_llama_inv_freq(const pln_hf_config *c, float *out) {
    int64_t d = c->head_dim, half = d / 2;
    /* modeling_rope_utils: inv_freq = 1 / base ** (arange(0, d, 2).float() / d), all in fp32 */
    float base = (float)c->rope_theta;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)d;
        out[i] = 1.0f / (float)pow((double)base, (double)e);
    }
    if (c->rope_type == PLN_ROPE_LINEAR) {
        float f = (float)c->rope_factor;
        for (int64_t i = 0; i < half; i++) out[i] = out[i] / f;
    } else if (c->rope_type == PLN_ROPE_LLAMA3) {
        /* _compute_llama3_parameters, operation for operation in fp32 (scalar / tensor is
         * tensor.reciprocal() * scalar in torch) */
        float factor = (float)c->rope_factor, low = (float)c->rope_low_freq_factor;
        float old = (float)c->rope_original_max;
        float low_wl = (float)((double)c->rope_original_max / c->rope_low_freq_factor);
        float high_wl = (float)((double)c->rope_original_max / c->rope_high_freq_factor);
        float two_pi = (float)(2.0 * M_PI), span = (float)(c->rope_high_freq_factor - c->rope_low_freq_factor);
        for (int64_t i = 0; i < half; i++) {
            float inv = out[i];
            float wl = (1.0f / inv) * two_pi;
            float llama = wl > low_wl ? inv / factor : inv;
            float smooth = ((1.0f / wl) * old - low) / span;
            float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
            bool medium = !(wl < high_wl) && !(wl > low_wl);
            out[i] = medium ? smoothed : llama;
        }
    }
}

static void llama_free(pln_model *m) {
    llama_state *s = m->fam;
    if (!s) return;
    if (s->inv_freq) m->be->free(m->be, s->inv_freq);
    free(s->layers);
    free(s);
    m->fam = NULL;
}

static int llama_create(pln_model *m, pln_loader *ld) {
    const pln_model_config *c = &m->cfg;
    const pln_hf_config *hc = &c->hf;
    pln_backend *be = m->be;
    int tp = c->tp;
    if (!be->rmsnorm || !be->residual_rmsnorm || !be->rope || (!be->swiglu && !be->linear_swiglu))
        return pln_errorf("the %s backend does not run the Llama family yet (it lacks the RMSNorm, rotary or SwiGLU op); "
                          "use --backend cpu", be->name);
    if (hc->n_kv_head < 1 || hc->head_dim < 2 || c->n_head % tp || hc->intermediate_size % tp ||
        (hc->n_kv_head % tp && tp % hc->n_kv_head))
        return pln_errorf("model config: num_attention_heads %lld, num_key_value_heads %lld, intermediate_size %lld do not split "
                          "over tp %d", (long long)c->n_head, (long long)hc->n_kv_head, (long long)hc->intermediate_size, tp);
    llama_state *s = pln_xcalloc(1, sizeof *s);
    m->fam = s;
    m->head_dim = (int32_t)hc->head_dim;
    m->n_head_local = (int32_t)(c->n_head / tp);
    m->n_kv_local = kv_local(hc, tp);
    /* a window at least as long as any context the cache can hold is no window */
    s->window = hc->sliding_window > 0 && hc->sliding_window < INT32_MAX ? (int32_t)hc->sliding_window : 0;
    m->window = s->window;
    int64_t H = m->H, D = hc->head_dim, A = (int64_t)m->n_head_local * D, Fl = hc->intermediate_size / tp;
    int64_t Q = (int64_t)(m->n_head_local + 2 * m->n_kv_local) * D;
    m->w_qkv = Q;
    m->w_attn = A;
    m->w_h4 = 2 * Fl;
    m->w_h4b = Fl;

    char name[160];
    int rc = 0;
    rc |= pln_loader_weight(ld, "model.embed_tokens.weight", m->Vr, H, &m->emb);
    if (!rc && m->emb.dtype == PLN_DTYPE_I8)
        rc |= pln_loader_weight_host(ld, "model.embed_tokens.weight", m->Vr, H, &m->emb_host);
    s->layers = pln_xcalloc((size_t)c->n_layer, sizeof *s->layers);
    for (int64_t i = 0; i < c->n_layer && !rc; i++) {
        llama_layer *L = &s->layers[i];
#define F16(field, suffix, n) do { snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= pln_loader_f16(ld, name, n, &L->field); } while (0)
#define LIN(field, suffix, r, cc) do { snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)i, suffix); \
        if (!rc) rc |= pln_loader_weight(ld, name, r, cc, &L->field); \
        m->layer_macs += (int64_t)(r) * (cc); } while (0)
        F16(in_norm, "input_layernorm.weight", H);
        LIN(qkv, "self_attn.qkv_proj.weight", Q, H);
        if (hc->qkv_bias) F16(qkv_b, "self_attn.qkv_proj.bias", Q);
        LIN(o, "self_attn.o_proj.weight", H, A);
        if (hc->o_bias) F16(o_b, "self_attn.o_proj.bias", H);
        F16(post_norm, "post_attention_layernorm.weight", H);
        LIN(gate_up, "mlp.gate_up_proj.weight", 2 * Fl, H);
        LIN(down, "mlp.down_proj.weight", H, Fl);
#undef F16
#undef LIN
    }
    if (!rc) rc |= pln_loader_f16(ld, "model.norm.weight", H, &s->norm);
    if (!rc) {
        if (hc->tie_word_embeddings) m->lm = m->emb;
        else rc |= pln_loader_weight(ld, "lm_head.weight", m->Vr, H, &m->lm);
    }
    if (rc) return -1;

    int64_t half = D / 2;
    float *f = pln_xmalloc((size_t)half * sizeof *f);
    pln_llama_inv_freq(hc, f);
    s->inv_freq = be->alloc(be, (size_t)half * sizeof(float));
    rc = !s->inv_freq || be->upload(be, s->inv_freq, f, (size_t)half * sizeof(float)) ? -1 : 0;
    free(f);
    return rc;
}

static int llama_enqueue(pln_model *m, pln_kvcache *kv, const pln_attn_meta *meta0, int32_t T, int32_t n_rows,
                         bool failed) {
    pln_backend *be = m->be;
    const llama_state *s = m->fam;
    const int64_t H = m->H, Fl = m->w_h4b;
    const float eps = m->cfg.eps;
    const pln_dtype adt = be->act_dtype;
    const int64_t nl = m->cfg.n_layer;
    pln_attn_meta meta = *meta0;
    meta.n_kv_head = m->n_kv_local;   /* the grouped-query layout */
    meta.window = s->window;
    int rc = failed ? -1 : 0;
#define OP(call) do { if (rc == 0 && (call) != 0) rc = -1; } while (0)
#define ALLREDUCE(buf) do { if (pln_comm_allreduce(m->comm, buf, (size_t)T * (size_t)H, adt) != 0 && rc == 0) rc = -1; } while (0)
    OP(be->rmsnorm(be, m->ln, m->x, nl > 0 ? s->layers[0].in_norm : s->norm, T, H, eps));
    for (int64_t i = 0; i < nl; i++) {
        const llama_layer *L = &s->layers[i];
        OP(be->linear(be, m->qkv, m->ln, &L->qkv, L->qkv_b, T, PLN_EPI_NONE));
        OP(be->rope(be, m->qkv, &meta, s->inv_freq, m->n_head_local, m->head_dim));
        if (be->append_attention)
            OP(be->append_attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], &meta, NULL, m->n_head_local,
                                    m->head_dim));
        else {
            OP(be->kv_append(be, m->qkv, kv->k_pool[i], kv->v_pool[i], &meta, m->n_head_local, m->head_dim));
            OP(be->attention(be, m->attn, m->qkv, kv->k_pool[i], kv->v_pool[i], &meta, NULL, m->n_head_local, m->head_dim));
        }
        OP(be->linear(be, m->y, m->attn, &L->o, NULL, T, PLN_EPI_NONE));
        ALLREDUCE(m->y);
        OP(be->residual_rmsnorm(be, m->x, m->y, L->o_b, L->post_norm, m->ln, T, H, eps));
        if (be->linear_swiglu)   /* silu(gate) * up in the gate|up projection's epilogue */
            OP(be->linear(be, m->h4b, m->ln, &L->gate_up, NULL, T, PLN_EPI_SWIGLU));
        else {
            OP(be->linear(be, m->h4, m->ln, &L->gate_up, NULL, T, PLN_EPI_NONE));
            OP(be->swiglu(be, m->h4b, m->h4, T, Fl));
        }
        OP(be->linear(be, m->y, m->h4b, &L->down, NULL, T, PLN_EPI_NONE));
        ALLREDUCE(m->y);
        OP(be->residual_rmsnorm(be, m->x, m->y, NULL, i + 1 < nl ? s->layers[i + 1].in_norm : s->norm, m->ln, T, H, eps));
    }
    if (n_rows > 0) {
        OP(be->gather_rows(be, m->sel, m->ln, m->d_rows, n_rows, H));
        OP(be->logits(be, m->logits, m->sel, &m->lm, n_rows, m->n_valid_local));
    }
#undef OP
#undef ALLREDUCE
    return rc;
}

const pln_model_family pln_model_family_llama = {
    .layout = "llama-tp-v1",
    .create = llama_create,
    .enqueue = llama_enqueue,
    .free = llama_free,
};
