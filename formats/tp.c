/* tp.c — split plans: the entry builders every family uses, the "bloom-tp-v1" plan, fused entries'
 * source rows, and the fp16 / int8 / int4 conversions (see tp.h). */
#include "formats/tp.h"
#include "formats/numeric.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>   /* x86-64 baseline: the int8 and fp16->f32 paths below; plain C elsewhere */
#define TP_SSE2 1
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>   /* an AVX2 int8 path chosen at run time; the build stays baseline */
#define TP_AVX2 1
#endif
#endif

int64_t pln_tp_vocab_padded(int64_t vocab_size, int tp) {
    if (tp < 1) return vocab_size;
    return (vocab_size + tp - 1) / tp * tp;
}

static int check_model(const pln_tp_model *m) {
    if (m->vocab_size < 1 || m->hidden < 1 || m->n_head < 1 || m->n_layer < 0)
        return pln_errorf("config.json: vocab_size %lld, hidden_size %lld, n_head %lld, n_layer %lld: all must be positive",
                          (long long)m->vocab_size, (long long)m->hidden, (long long)m->n_head, (long long)m->n_layer);
    if (m->hidden % m->n_head)
        return pln_errorf("config.json: hidden_size %lld is not a multiple of n_head %lld", (long long)m->hidden, (long long)m->n_head);
    /* Keep every byte count far from overflow: 2^40 elements per tensor is 4000x BLOOM-176B's. */
    if (m->hidden > (1 << 20) || m->vocab_size > (1 << 24) || m->n_layer > 10000 || m->n_head > m->hidden)
        return pln_errorf("config.json: sizes out of range (hidden_size %lld, vocab_size %lld, n_layer %lld)",
                          (long long)m->hidden, (long long)m->vocab_size, (long long)m->n_layer);
    return 0;
}

int pln_tp_check(const pln_tp_model *m, const pln_tp_opts *o) {
    if (check_model(m)) return -1;
    if (o->tp < 1) return pln_errorf("--tp %d: the TP size must be at least 1", o->tp);
    if (m->n_head % o->tp) {
        char list[512];
        size_t n = 0;
        list[0] = 0;
        for (int64_t t = 1; t <= m->n_head && n < sizeof list - 24; t++)
            if (m->n_head % t == 0) n += (size_t)snprintf(list + n, sizeof list - n, "%s%lld", n ? ", " : "", (long long)t);
        return pln_errorf("--tp %d: n_head %lld is not divisible by %d (each rank needs whole attention heads); TP sizes that work: %s",
                          o->tp, (long long)m->n_head, o->tp, list);
    }
    if (o->int8 && o->int4) return pln_errorf("--dtype: int8 and int4 exclude each other");
    if (o->quantize_embedding && !o->int8 && !o->int4)
        return pln_errorf("--quantize-embedding needs --dtype int8 or int4");
    if (o->group_size < 0) return pln_errorf("--group-size %lld: must be positive", (long long)o->group_size);
    if (o->int4 && o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
        return pln_errorf("--group-size %lld: int4 needs 32, 64 or 128 (the packed layout works in blocks of 32 columns)",
                          (long long)o->group_size);
    if ((o->int8 || o->int4) && o->group_size > 0) {
        int64_t H = m->hidden, tp = o->tp;
        int64_t dims[3] = {H, H / tp, 4 * H / tp};
        for (int i = 0; i < 3; i++)
            if (dims[i] % o->group_size)
                return pln_errorf("--group-size %lld does not divide the input dimensions of the rank slices "
                                  "(%lld for query_key_value/dense_h_to_4h%s, %lld for self_attention.dense, %lld for dense_4h_to_h at TP %d); "
                                  "pick a divisor of %lld",
                                  (long long)o->group_size, (long long)H, o->quantize_embedding ? "/word_embeddings" : "",
                                  (long long)(H / tp), (long long)(4 * H / tp), o->tp, (long long)(H / tp));
    }
    return 0;
}

/* ---- plan construction ---- */
typedef pln_tp_builder plan_buf;

static pln_tp_entry *push(plan_buf *b) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->e = pln_xrealloc(b->e, b->cap * sizeof *b->e);
    }
    pln_tp_entry *e = &b->e[b->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static void set_names(pln_tp_entry *e, const char *name) {
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->source, sizeof e->source, "%s", name);
}

void pln_tp_add_vector(plan_buf *b, const char *name, int64_t n) {
    pln_tp_entry *e = push(b);
    set_names(e, name);
    e->transform = PLN_TP_TO_F16;
    e->split = PLN_TP_SPLIT_NONE;
    e->dtype = PLN_DTYPE_F16;
    e->ndim = e->src_ndim = 1;
    e->shape[0] = e->src_shape[0] = n;
    e->shape[1] = e->src_shape[1] = 1;
    e->row0 = 0; e->rows = n; e->col0 = 0; e->cols = 1;
}

void pln_tp_add_vector_split(plan_buf *b, const char *name, int64_t n) {
    pln_tp_add_vector(b, name, n);
    pln_tp_entry *e = &b->e[b->n - 1];
    int64_t per = n / b->o->tp;
    e->split = PLN_TP_SPLIT_ROWS;
    e->shape[0] = per;
    e->row0 = per * b->rank;
    e->rows = per;
}

/* The scale entry after the weight entry e (just quantized as quant 8 or 4). */
static void add_scales(plan_buf *b, pln_tp_entry *e, int quant) {
    e->transform = quant == 4 ? PLN_TP_QUANT_I4 : PLN_TP_QUANT_I8;
    e->dtype = quant == 4 ? PLN_DTYPE_U8 : PLN_DTYPE_I8;
    e->group = b->o->group_size ? b->o->group_size : e->cols;
    pln_tp_entry w = *e;
    if (quant == 4) e->shape[1] /= 2;   /* two weights per byte */
    pln_tp_entry *s = push(b);
    *s = w;
    size_t len = strlen(w.name);
    PLN_ASSERT(len + sizeof "_scale" <= sizeof s->name);
    memcpy(s->name + len, "_scale", sizeof "_scale");
    s->transform = PLN_TP_QUANT_SCALE;
    s->dtype = PLN_DTYPE_F16;
    s->shape[1] = w.shape[1] / w.group;
}

void pln_tp_add_fused(plan_buf *b, const char *name, const char *source, int64_t C, const pln_tp_seg *segs, int n_segs,
                      int quant) {
    PLN_ASSERT(n_segs >= 1 && n_segs <= PLN_TP_MAX_SEGS && (C > 1 || !quant));
    pln_tp_entry *e = push(b);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->source, sizeof e->source, "%s", source);
    int64_t rows = 0;
    for (int k = 0; k < n_segs; k++) { e->segs[k] = segs[k]; rows += segs[k].rows; }
    e->n_segs = n_segs;
    e->split = PLN_TP_SPLIT_ROWS;
    e->ndim = e->src_ndim = C > 1 ? 2 : 1;
    e->src_shape[0] = e->shape[0] = rows;
    e->src_shape[1] = e->shape[1] = C;
    e->row0 = 0; e->rows = rows; e->col0 = 0; e->cols = C;
    e->transform = PLN_TP_TO_F16;
    e->dtype = PLN_DTYPE_F16;
    if (quant) add_scales(b, e, quant);
}

const uint8_t *pln_tp_src_row(const pln_tp_entry *e, const pln_tp_src *s, int64_t lr) {
    size_t esz = pln_dtype_size(s->t[0]->dtype), cols = (size_t)e->src_shape[1];
    if (!e->n_segs) return s->t[0]->data + ((size_t)(e->row0 + lr) * cols + (size_t)e->col0) * esz;
    for (int k = 0; k < e->n_segs; k++) {
        if (lr < e->segs[k].rows) return s->t[k]->data + ((size_t)(e->segs[k].row0 + lr) * cols + (size_t)e->col0) * esz;
        lr -= e->segs[k].rows;
    }
    PLN_ASSERT(!"row past the fused entry's segments");
    return NULL;
}

void pln_tp_add_matrix(plan_buf *b, const char *name, int64_t R, int64_t C, pln_tp_split split,
                       int64_t padded_rows, int quant) {
    int tp = b->o->tp, r = b->rank;
    pln_tp_entry *e = push(b);
    set_names(e, name);
    e->split = split;
    e->ndim = e->src_ndim = 2;
    e->src_shape[0] = R; e->src_shape[1] = C;
    if (split == PLN_TP_SPLIT_ROWS) {
        int64_t per = padded_rows / tp, first = per * r, end = first + per;
        int64_t real_end = end < R ? end : R;
        e->row0 = first;
        e->rows = real_end > first ? real_end - first : 0;
        e->pad_rows = per - e->rows;
        e->col0 = 0; e->cols = C;
        e->shape[0] = per; e->shape[1] = C;
    } else if (split == PLN_TP_SPLIT_COLS) {
        int64_t per = C / tp;
        e->row0 = 0; e->rows = R;
        e->col0 = per * r; e->cols = per;
        e->shape[0] = R; e->shape[1] = per;
    } else {
        e->row0 = 0; e->rows = R; e->col0 = 0; e->cols = C;
        e->shape[0] = R; e->shape[1] = C;
    }
    if (!quant) {
        e->transform = PLN_TP_TO_F16;
        e->dtype = PLN_DTYPE_F16;
        return;
    }
    add_scales(b, e, quant);
}

int pln_tp_plan(const pln_tp_model *m, const pln_tp_opts *o, int rank, pln_tp_entry **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (pln_tp_check(m, o)) return -1;
    if (rank < 0 || rank >= o->tp) return pln_errorf("rank %d out of range for TP %d", rank, o->tp);
    plan_buf b = {.o = o, .rank = rank};
    int64_t H = m->hidden;
    char name[PLN_TP_NAME_MAX];
    /* the embedding is int8 at most: it is also the logits matrix, the most sensitive one */
    int lin = o->int4 ? 4 : o->int8 ? 8 : 0;
    pln_tp_add_matrix(&b, "word_embeddings.weight", m->vocab_size, H, PLN_TP_SPLIT_ROWS,
               pln_tp_vocab_padded(m->vocab_size, o->tp), o->quantize_embedding ? 8 : 0);
    pln_tp_add_vector(&b, "word_embeddings_layernorm.weight", H);
    pln_tp_add_vector(&b, "word_embeddings_layernorm.bias", H);
    for (int64_t i = 0; i < m->n_layer; i++) {
#define NM(suffix) (snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix), name)
        pln_tp_add_vector(&b, NM("input_layernorm.weight"), H);
        pln_tp_add_vector(&b, NM("input_layernorm.bias"), H);
        pln_tp_add_matrix(&b, NM("self_attention.query_key_value.weight"), 3 * H, H, PLN_TP_SPLIT_ROWS, 3 * H, lin);
        pln_tp_add_vector_split(&b, NM("self_attention.query_key_value.bias"), 3 * H);
        pln_tp_add_matrix(&b, NM("self_attention.dense.weight"), H, H, PLN_TP_SPLIT_COLS, H, lin);
        pln_tp_add_vector(&b, NM("self_attention.dense.bias"), H);
        pln_tp_add_vector(&b, NM("post_attention_layernorm.weight"), H);
        pln_tp_add_vector(&b, NM("post_attention_layernorm.bias"), H);
        pln_tp_add_matrix(&b, NM("mlp.dense_h_to_4h.weight"), 4 * H, H, PLN_TP_SPLIT_ROWS, 4 * H, lin);
        pln_tp_add_vector_split(&b, NM("mlp.dense_h_to_4h.bias"), 4 * H);
        pln_tp_add_matrix(&b, NM("mlp.dense_4h_to_h.weight"), H, 4 * H, PLN_TP_SPLIT_COLS, H, lin);
        pln_tp_add_vector(&b, NM("mlp.dense_4h_to_h.bias"), H);
#undef NM
    }
    pln_tp_add_vector(&b, "ln_f.weight", H);
    pln_tp_add_vector(&b, "ln_f.bias", H);
    *out = b.e;
    *n_out = b.n;
    return 0;
}

pln_tp_model pln_tp_model_of(const pln_hf_config *c) {
    pln_tp_model m = {.vocab_size = c->vocab_size, .hidden = c->hidden_size, .n_head = c->n_head, .n_layer = c->n_layer};
    return m;
}

/* One source tensor (name, its shape [rows, cols] or [rows] as config.json implies): present, that
 * shape, convertible, contiguous, mapped. NULL + error. */
static const pln_tensor *find_source(const pln_ckpt *ck, const char *name, int ndim, int64_t rows, int64_t cols) {
    const pln_tensor *t = pln_ckpt_find(ck, name);
    if (!t) {
        pln_errorf("%s: missing tensor %s (a %s checkpoint with n_layer %d needs it; is the checkpoint complete?)", ck->path, name,
                   ck->has_config && ck->config.model_type[0] ? ck->config.model_type : "bloom",
                   (int)(ck->has_config ? ck->config.n_layer : 0));
        return NULL;
    }
    char got[96], want[96];
    int64_t shape[2] = {rows, cols};
    bool same = t->ndim == ndim && t->shape[0] == rows && (ndim == 1 || t->shape[1] == cols);
    if (!same) {
        pln_errorf("%s: tensor %s has shape %s but config.json (hidden_size %lld, vocab_size %lld) implies %s",
                   t->file ? t->file : ck->path, name, pln_shape_str(t->shape, t->ndim, got, sizeof got),
                   (long long)ck->config.hidden_size, (long long)ck->config.vocab_size, pln_shape_str(shape, ndim, want, sizeof want));
        return NULL;
    }
    if (!pln_tp_dtype_convertible(t->dtype)) {
        pln_errorf("%s: tensor %s has dtype %s, which cannot be converted to fp16/int8 (F32, F16 and BF16 can)",
                   t->file ? t->file : ck->path, name, pln_dtype_name(t->dtype));
        return NULL;
    }
    if (!t->contiguous) {
        pln_errorf("%s: tensor %s is a strided view; re-save the checkpoint (e.g. with safetensors) so it is contiguous",
                   t->file ? t->file : ck->path, name);
        return NULL;
    }
    uint64_t want_bytes = (uint64_t)rows * (uint64_t)cols * pln_dtype_size(t->dtype);
    if (!t->data || t->nbytes != want_bytes) {
        pln_errorf("%s: tensor %s: %llu data bytes, expected %llu", t->file ? t->file : ck->path, name,
                   (unsigned long long)t->nbytes, (unsigned long long)want_bytes);
        return NULL;
    }
    return t;
}

int pln_tp_find_sources(const pln_ckpt *ck, const pln_tp_entry *plan, size_t n, pln_tp_src *srcs) {
    for (size_t i = 0; i < n; i++) {
        const pln_tp_entry *e = &plan[i];
        memset(&srcs[i], 0, sizeof srcs[i]);
        if (e->transform == PLN_TP_QUANT_SCALE) { if (i) srcs[i] = srcs[i - 1]; continue; }
        if (!e->n_segs) {
            if (!(srcs[i].t[0] = find_source(ck, e->source, e->src_ndim, e->src_shape[0], e->src_shape[1]))) return -1;
            continue;
        }
        for (int k = 0; k < e->n_segs; k++) {
            const pln_tensor *t = find_source(ck, e->segs[k].source, e->src_ndim, e->segs[k].src_rows, e->src_shape[1]);
            if (!t) return -1;
            if (k && t->dtype != srcs[i].t[0]->dtype)
                return pln_errorf("%s: tensors %s (%s) and %s (%s) are fused into %s and must have one dtype; re-save the checkpoint in one dtype",
                                  t->file ? t->file : ck->path, e->segs[0].source, pln_dtype_name(srcs[i].t[0]->dtype),
                                  e->segs[k].source, pln_dtype_name(t->dtype), e->name);
            srcs[i].t[k] = t;
        }
    }
    return 0;
}

bool pln_tp_is_quant(const pln_tp_entry *e) {
    return e->transform == PLN_TP_QUANT_I8 || e->transform == PLN_TP_QUANT_I4;
}

size_t pln_tp_row_bytes(const pln_tp_entry *e) {
    if (e->transform == PLN_TP_QUANT_I4) return (size_t)e->cols / 2;
    return (size_t)e->cols * (e->transform == PLN_TP_QUANT_I8 ? 1 : 2);
}

uint32_t pln_tp_work_per_byte(const pln_tp_entry *e) {
    switch (e->transform) {
    case PLN_TP_TO_F16: return 1;
    case PLN_TP_QUANT_I8: return 2;
    case PLN_TP_QUANT_I4: return e->group > 0 ? 4 + (uint32_t)(256 / e->group) : 6;
    default: return 0;
    }
}

uint64_t pln_tp_entry_nbytes(const pln_tp_entry *e) {
    return (uint64_t)e->shape[0] * (uint64_t)e->shape[1] * pln_dtype_size(e->dtype);
}

/* ---- conversions ---- */
bool pln_tp_dtype_convertible(pln_dtype dt) {
    return dt == PLN_DTYPE_F32 || dt == PLN_DTYPE_F16 || dt == PLN_DTYPE_BF16;
}

static inline uint16_t f32_to_f16_counted(float f, uint64_t *clamps, uint64_t *nonfinite) {
    uint32_t ax = pln_f32_bits(f) & 0x7fffffffu;
    if (ax >= 0x7f800000u) { (*nonfinite)++; return pln_f32_to_f16(f); }
    if (ax >= 0x477ff000u) { /* rounds to >= 65520, past fp16's largest finite value */
        (*clamps)++;
        return (uint16_t)(((pln_f32_bits(f) >> 16) & 0x8000) | 0x7bff);
    }
    return pln_f32_to_f16(f);
}

/* Copies n fp16 values and counts the infinities and NaNs (exponent field all ones) in one pass,
 * four values per 64-bit word: the one-value-at-a-time loop ran at ~2 cycles a value, a large
 * part of a warm fp16 reshard. A lane's exponent field e = v & 0x7c00 is at most 0x7c00, so
 * e + 0x0400 reaches bit 15 exactly when e == 0x7c00 and never carries into the next lane; the
 * per-lane tallies are 16-bit, so they are folded into nf at least every 65535 words. */
static uint64_t f16_copy_count_nonfinite(const void *src, uint16_t *dst, size_t n) {
    const uint8_t *s = src;
    uint8_t *d = (uint8_t *)dst;
    size_t words = n / 4, w = 0;
    uint64_t nf = 0;
    while (w < words) {
        size_t end = words - w > 65535 ? w + 65535 : words;
        uint64_t lanes = 0;
        for (; w < end; w++) {
            uint64_t x;
            memcpy(&x, s + 8 * w, 8);     /* unaligned-safe; compiles to one load */
            memcpy(d + 8 * w, &x, 8);
            lanes += (((x & 0x7c007c007c007c00ull) + 0x0400040004000400ull) >> 15) & 0x0001000100010001ull;
        }
        nf += (lanes & 0xffff) + (lanes >> 16 & 0xffff) + (lanes >> 32 & 0xffff) + (lanes >> 48);
    }
    for (size_t i = 4 * words; i < n; i++) {
        uint16_t v;
        memcpy(&v, s + 2 * i, 2);
        nf += (v & 0x7c00) == 0x7c00;
        dst[i] = v;
    }
    return nf;
}

void pln_tp_to_f16(pln_dtype src_dt, const void *src, uint16_t *dst, size_t n,
                   uint64_t *clamps, uint64_t *nonfinite) {
    uint64_t c = 0, nf = 0;
    switch (src_dt) {
    case PLN_DTYPE_F16: nf += f16_copy_count_nonfinite(src, dst, n); break;
    case PLN_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16_counted(pln_bf16_to_f32(s[i]), &c, &nf);
        break;
    }
    case PLN_DTYPE_F32: {
        const float *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16_counted(s[i], &c, &nf);
        break;
    }
    default:
        memset(dst, 0, n * 2);
        nf += n;
        break;
    }
    *clamps += c;
    *nonfinite += nf;
}

#ifndef TP_SSE2
/* fp16 -> f32 by table (256 KB, L2-resident): the exact pln_f16_to_f32 without its branches. */
static float g_f16_table[65536];
static pthread_once_t g_f16_once = PTHREAD_ONCE_INIT;
static void f16_table_init(void) {
    for (uint32_t i = 0; i < 65536; i++) g_f16_table[i] = pln_f16_to_f32((uint16_t)i);
}
#else
/* Four fp16 values (low 16 bits of each 32-bit lane) -> float, bit-identical to pln_f16_to_f32
 * for all 65536 inputs (test_tp checks): move exponent and mantissa into place and rebias;
 * inf/NaN get the float exponent 255; zeros and subnormals are renormalized exactly by one float
 * subtraction (2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24). *inf_mask: lanes that are inf/NaN. */
static inline __m128 f16x4_to_f32(__m128i h, __m128i *inf_mask) {
    const __m128i expm = _mm_set1_epi32(0x0f800000);          /* 0x7c00 << 13 */
    __m128i o = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);
    __m128i e = _mm_and_si128(o, expm);
    o = _mm_add_epi32(o, _mm_set1_epi32((127 - 15) << 23));
    __m128i inf = _mm_cmpeq_epi32(e, expm);
    o = _mm_add_epi32(o, _mm_and_si128(inf, _mm_set1_epi32((128 - 16) << 23)));
    __m128i zero = _mm_cmpeq_epi32(e, _mm_setzero_si128());
    __m128 sub = _mm_sub_ps(_mm_castsi128_ps(_mm_add_epi32(o, _mm_set1_epi32(1 << 23))),
                            _mm_castsi128_ps(_mm_set1_epi32(113 << 23)));
    o = _mm_or_si128(_mm_and_si128(zero, _mm_castps_si128(sub)), _mm_andnot_si128(zero, o));
    o = _mm_or_si128(o, _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16));
    *inf_mask = inf;
    return _mm_castsi128_ps(o);
}

/* n fp16 values -> float, eight at a time; returns the number of inf/NaN among them. */
static uint64_t f16_to_f32_sse2(const uint16_t *s, float *d, size_t n) {
    uint64_t nf = 0;
    size_t i = 0;
    while (i + 8 <= n) {
        /* 32-bit lane tallies: fold well before they could wrap */
        size_t end = i + (n - i) / 8 * 8, cap = i + ((size_t)1 << 28);
        if (end > cap) end = cap;
        __m128i acc = _mm_setzero_si128();
        for (; i < end; i += 8) {
            __m128i x = _mm_loadu_si128((const __m128i *)(s + i)), m0, m1;
            _mm_storeu_ps(d + i, f16x4_to_f32(_mm_unpacklo_epi16(x, _mm_setzero_si128()), &m0));
            _mm_storeu_ps(d + i + 4, f16x4_to_f32(_mm_unpackhi_epi16(x, _mm_setzero_si128()), &m1));
            acc = _mm_sub_epi32(acc, _mm_add_epi32(m0, m1));
        }
        uint32_t l[4];
        _mm_storeu_si128((__m128i *)l, acc);
        nf += (uint64_t)l[0] + l[1] + l[2] + l[3];
    }
    for (; i < n; i++) {
        d[i] = pln_f16_to_f32(s[i]);
        nf += (s[i] & 0x7c00) == 0x7c00;
    }
    return nf;
}
#endif

void pln_tp_to_f32(pln_dtype src_dt, const void *src, float *dst, size_t n, uint64_t *nonfinite) {
    uint64_t nf = 0;
    switch (src_dt) {
    case PLN_DTYPE_F16: {
#ifdef TP_SSE2
        /* the table lookup was a quarter of int8 conversion's time; this is ~1 op per value */
        *nonfinite += f16_to_f32_sse2(src, dst, n);
        return;
#else
        pthread_once(&g_f16_once, f16_table_init);
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = g_f16_table[s[i]];
        break;
#endif
    }
    case PLN_DTYPE_BF16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = pln_bf16_to_f32(s[i]); break; }
    case PLN_DTYPE_F32: memcpy(dst, src, n * 4); break;
    default: memset(dst, 0, n * 4); *nonfinite += n; return;
    }
    /* on the bits: an integer compare vectorizes, isfinite() does not */
    const uint32_t *b = (const uint32_t *)dst;
    for (size_t i = 0; i < n; i++) nf += (b[i] & 0x7f800000u) == 0x7f800000u;
    *nonfinite += nf;
}

void pln_tp_qerr_merge(pln_tp_qerr *into, const pln_tp_qerr *add) {
    into->err2 += add->err2;
    into->ref2 += add->ref2;
    if (add->max_abs > into->max_abs) into->max_abs = add->max_abs;
    into->n += add->n;
}

double pln_tp_qerr_rel_rms(const pln_tp_qerr *e) {
    if (e->ref2 > 0) return sqrt(e->err2 / e->ref2);
    return e->err2 > 0 ? INFINITY : 0.0;
}

uint16_t pln_tp_scale_f16(float absmax) {
    if (!(absmax > 0)) return 0x3c00; /* 1.0: the group is all zero, q will be all zero */
    float s = absmax / 127.0f;
    if (s > PLN_F16_MAX) return 0x7bff;
    uint16_t h = pln_f32_to_f16(s);
    if ((h & 0x7fff) == 0) h = 0x0001; /* smallest subnormal: tiny groups quantize to ~0 */
    return h;
}

/* pln_quant_i8 without the libm call: x86-64's baseline has no packed round instruction, so
 * roundf() is a function call per element (most of int8 conversion's time). Clamping first keeps
 * the float->int conversion defined (NaN clamps too), and for |v| <= 127 the fraction v - (int)v
 * is exact, so "add one step away from zero when |fraction| >= 0.5" is exactly roundf's tie rule.
 * test_tp checks it against pln_quant_i8. */
static inline int8_t quant_fast(float x, float inv) {
    float v = x * inv;
    v = v == v ? v : 0.0f;               /* NaN (a rejected tensor anyway): keep the cast defined */
    v = v < 127.0f ? v : 127.0f;         /* ternaries, not fminf: these vectorize (minps/maxps) */
    v = v > -127.0f ? v : -127.0f;
    int t = (int)v;
    float frac = v - (float)t;
    t += (frac >= 0.5f) - (frac <= -0.5f);
    return (int8_t)t;
}

int8_t pln_tp_quant_one(float x, float inv_scale) { return quant_fast(x, inv_scale); }

/* Scalar on purpose: with double sums in one fixed order the recorded error is the same on every
 * machine and build. Vectorized float variants measured no faster here (memory-bound: the
 * source row is read once from memory either way), so they did not earn the complexity. */
void pln_tp_quant_row(const float *restrict w, int64_t cols, int64_t group, int8_t *restrict q,
                      uint16_t *restrict scales, pln_tp_qerr *err) {
    double se = 0, sr = 0, m = 0;
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        int64_t end = g0 + group;
        float amax = 0;
        for (int64_t j = g0; j < end; j++) { float a = fabsf(w[j]); amax = a > amax ? a : amax; }
        uint16_t sh = pln_tp_scale_f16(amax);
        scales[gi] = sh;
        float sc = pln_f16_to_f32(sh), inv = 1.0f / sc;
        for (int64_t j = g0; j < end; j++) {
            int8_t v = quant_fast(w[j], inv);
            q[j] = v;
            double d = (double)w[j] - (double)pln_dequant_i8(v, sc);
            se += d * d;
            sr += (double)w[j] * w[j];
            m = fabs(d) > m ? fabs(d) : m;
        }
    }
    err->err2 += se;
    err->ref2 += sr;
    if (m > err->max_abs) err->max_abs = m;
    err->n += (uint64_t)cols;
}

#ifdef TP_SSE2
/* quant_fast on four lanes, the same operations in the same float precision (so the same
 * results): clamp (NaN -> 0), truncate, then one step away from zero when |fraction| >= 0.5. */
static inline __m128i quant4_lanes(__m128 x, __m128 inv) {
    __m128 v = _mm_mul_ps(x, inv);
    v = _mm_and_ps(v, _mm_cmpord_ps(v, v));
    v = _mm_min_ps(v, _mm_set1_ps(127.0f));
    v = _mm_max_ps(v, _mm_set1_ps(-127.0f));
    __m128i t = _mm_cvttps_epi32(v);
    __m128 frac = _mm_sub_ps(v, _mm_cvtepi32_ps(t));
    /* compare masks are -1 where true: t + (frac >= .5) - (frac <= -.5) */
    t = _mm_sub_epi32(t, _mm_castps_si128(_mm_cmpge_ps(frac, _mm_set1_ps(0.5f))));
    return _mm_add_epi32(t, _mm_castps_si128(_mm_cmple_ps(frac, _mm_set1_ps(-0.5f))));
}

static inline float hmax4(__m128 a) {
    float l[4];
    _mm_storeu_ps(l, a);
    float m = l[0];
    for (int i = 1; i < 4; i++) m = l[i] > m ? l[i] : m;
    return m;
}

/* Four rows at once (group % 4 == 0). Each row's double sums run in the scalar code's order
 * (element by element, group after group); the rows sit in separate SIMD lanes, so the four
 * sequential chains overlap instead of each waiting on its own add latency. */
static void quant_rows4(const float *w, size_t ld, int64_t cols, int64_t group, int8_t *q,
                        uint16_t *scales, pln_tp_qerr *err) {
    int64_t ngroups = cols / group;
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128d dabs = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffll));
    __m128d se01 = _mm_setzero_pd(), se23 = _mm_setzero_pd(), sr01 = _mm_setzero_pd(), sr23 = _mm_setzero_pd();
    __m128d m01 = _mm_setzero_pd(), m23 = _mm_setzero_pd();
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        __m128 inv[4], sc[4];
        for (int r = 0; r < 4; r++) {
            const float *x = w + (size_t)r * ld;
            __m128 a = _mm_setzero_ps();
            for (int64_t j = g0; j < g0 + group; j += 4) a = _mm_max_ps(_mm_and_ps(_mm_loadu_ps(x + j), absmask), a);
            uint16_t sh = pln_tp_scale_f16(hmax4(a));   /* max ignores NaN lanes, as the scalar loop does */
            scales[r * ngroups + gi] = sh;
            float f = pln_f16_to_f32(sh);
            sc[r] = _mm_set1_ps(f);
            inv[r] = _mm_set1_ps(1.0f / f);
        }
        for (int64_t j = g0; j < g0 + group; j += 4) {
            __m128 wv[4], dq[4];
            for (int r = 0; r < 4; r++) {
                wv[r] = _mm_loadu_ps(w + (size_t)r * ld + j);
                __m128i t = quant4_lanes(wv[r], inv[r]);
                __m128i b = _mm_packs_epi16(_mm_packs_epi32(t, t), _mm_setzero_si128());
                int32_t b4 = _mm_cvtsi128_si32(b);
                memcpy(q + (size_t)r * (size_t)cols + j, &b4, 4);
                dq[r] = _mm_mul_ps(_mm_cvtepi32_ps(t), sc[r]);   /* pln_dequant_i8: (float)q * scale */
            }
            /* columns j..j+3 as vectors over the four rows */
            __m128 t0 = _mm_unpacklo_ps(wv[0], wv[1]), t1 = _mm_unpacklo_ps(wv[2], wv[3]);
            __m128 t2 = _mm_unpackhi_ps(wv[0], wv[1]), t3 = _mm_unpackhi_ps(wv[2], wv[3]);
            __m128 wc[4] = {_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0), _mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2)};
            t0 = _mm_unpacklo_ps(dq[0], dq[1]); t1 = _mm_unpacklo_ps(dq[2], dq[3]);
            t2 = _mm_unpackhi_ps(dq[0], dq[1]); t3 = _mm_unpackhi_ps(dq[2], dq[3]);
            __m128 dc[4] = {_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0), _mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2)};
            for (int c = 0; c < 4; c++) {
                __m128d w01 = _mm_cvtps_pd(wc[c]), w23 = _mm_cvtps_pd(_mm_movehl_ps(wc[c], wc[c]));
                __m128d d01 = _mm_sub_pd(w01, _mm_cvtps_pd(dc[c]));
                __m128d d23 = _mm_sub_pd(w23, _mm_cvtps_pd(_mm_movehl_ps(dc[c], dc[c])));
                se01 = _mm_add_pd(se01, _mm_mul_pd(d01, d01));
                se23 = _mm_add_pd(se23, _mm_mul_pd(d23, d23));
                sr01 = _mm_add_pd(sr01, _mm_mul_pd(w01, w01));
                sr23 = _mm_add_pd(sr23, _mm_mul_pd(w23, w23));
                m01 = _mm_max_pd(_mm_and_pd(d01, dabs), m01);   /* a NaN |d| keeps m, as the scalar test does */
                m23 = _mm_max_pd(_mm_and_pd(d23, dabs), m23);
            }
        }
    }
    double se[4], sr[4], m[4];
    _mm_storeu_pd(se, se01); _mm_storeu_pd(se + 2, se23);
    _mm_storeu_pd(sr, sr01); _mm_storeu_pd(sr + 2, sr23);
    _mm_storeu_pd(m, m01); _mm_storeu_pd(m + 2, m23);
    for (int r = 0; r < 4; r++) {
        err[r].err2 += se[r];
        err[r].ref2 += sr[r];
        if (m[r] > err[r].max_abs) err[r].max_abs = m[r];
        err[r].n += (uint64_t)cols;
    }
}
#endif

#ifdef TP_AVX2
/* quant_rows4 with 8-wide floats and the four rows' double sums in one 4-wide vector (group % 8
 * == 0). "avx2" only, deliberately not "fma": a fused multiply-add would round d*d + se once
 * instead of twice and change the recorded sums. */
#define TP_AVX2_TGT __attribute__((target("avx2")))
static inline TP_AVX2_TGT __m256i quant8_lanes(__m256 x, __m256 inv) {
    __m256 v = _mm256_mul_ps(x, inv);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
    v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));
    __m256i t = _mm256_cvttps_epi32(v);
    __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
    t = _mm256_sub_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
    return _mm256_add_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
}

static TP_AVX2_TGT void quant_rows4_avx2(const float *w, size_t ld, int64_t cols, int64_t group, int8_t *q,
                                         uint16_t *scales, pln_tp_qerr *err) {
    int64_t ngroups = cols / group;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256d dabs = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
    __m256d se = _mm256_setzero_pd(), sr = _mm256_setzero_pd(), m = _mm256_setzero_pd();
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        __m256 inv[4], sc[4];
        for (int r = 0; r < 4; r++) {
            const float *x = w + (size_t)r * ld;
            __m256 a = _mm256_setzero_ps();
            for (int64_t j = g0; j < g0 + group; j += 8) a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), a);
            __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            uint16_t sh = pln_tp_scale_f16(hmax4(a4));
            scales[r * ngroups + gi] = sh;
            float f = pln_f16_to_f32(sh);
            sc[r] = _mm256_set1_ps(f);
            inv[r] = _mm256_set1_ps(1.0f / f);
        }
        for (int64_t j = g0; j < g0 + group; j += 8) {
            __m128 wl[4], wh[4], dl[4], dh[4];
            for (int r = 0; r < 4; r++) {
                __m256 wv = _mm256_loadu_ps(w + (size_t)r * ld + j);
                __m256i t = quant8_lanes(wv, inv[r]);
                __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                _mm_storel_epi64((__m128i *)(q + (size_t)r * (size_t)cols + j), _mm_packs_epi16(p16, _mm_setzero_si128()));
                __m256 dq = _mm256_mul_ps(_mm256_cvtepi32_ps(t), sc[r]);   /* (float)q * scale */
                wl[r] = _mm256_castps256_ps128(wv); wh[r] = _mm256_extractf128_ps(wv, 1);
                dl[r] = _mm256_castps256_ps128(dq); dh[r] = _mm256_extractf128_ps(dq, 1);
            }
            __m128 wc[8], dc[8];
            for (int h = 0; h < 2; h++) {   /* columns j..j+3, then j+4..j+7, as vectors over the rows */
                __m128 *W = h ? wh : wl, *D = h ? dh : dl;
                __m128 t0 = _mm_unpacklo_ps(W[0], W[1]), t1 = _mm_unpacklo_ps(W[2], W[3]);
                __m128 t2 = _mm_unpackhi_ps(W[0], W[1]), t3 = _mm_unpackhi_ps(W[2], W[3]);
                wc[4 * h] = _mm_movelh_ps(t0, t1); wc[4 * h + 1] = _mm_movehl_ps(t1, t0);
                wc[4 * h + 2] = _mm_movelh_ps(t2, t3); wc[4 * h + 3] = _mm_movehl_ps(t3, t2);
                t0 = _mm_unpacklo_ps(D[0], D[1]); t1 = _mm_unpacklo_ps(D[2], D[3]);
                t2 = _mm_unpackhi_ps(D[0], D[1]); t3 = _mm_unpackhi_ps(D[2], D[3]);
                dc[4 * h] = _mm_movelh_ps(t0, t1); dc[4 * h + 1] = _mm_movehl_ps(t1, t0);
                dc[4 * h + 2] = _mm_movelh_ps(t2, t3); dc[4 * h + 3] = _mm_movehl_ps(t3, t2);
            }
            for (int c = 0; c < 8; c++) {
                __m256d wd = _mm256_cvtps_pd(wc[c]);
                __m256d d = _mm256_sub_pd(wd, _mm256_cvtps_pd(dc[c]));
                se = _mm256_add_pd(se, _mm256_mul_pd(d, d));
                sr = _mm256_add_pd(sr, _mm256_mul_pd(wd, wd));
                m = _mm256_max_pd(_mm256_and_pd(d, dabs), m);
            }
        }
    }
    double a[4], b[4], c[4];
    _mm256_storeu_pd(a, se); _mm256_storeu_pd(b, sr); _mm256_storeu_pd(c, m);
    for (int r = 0; r < 4; r++) {
        err[r].err2 += a[r];
        err[r].ref2 += b[r];
        if (c[r] > err[r].max_abs) err[r].max_abs = c[r];
        err[r].n += (uint64_t)cols;
    }
}
#endif

void pln_tp_quant_rows(const float *w, size_t ld, int64_t nr, int64_t cols, int64_t group, int8_t *q,
                       uint16_t *scales, pln_tp_qerr *err) {
    int64_t ngroups = cols / group, r = 0;
#ifdef TP_AVX2
    if (group % 8 == 0 && __builtin_cpu_supports("avx2"))
        for (; r + 4 <= nr; r += 4)
            quant_rows4_avx2(w + (size_t)r * ld, ld, cols, group, q + (size_t)r * (size_t)cols, scales + r * ngroups, err + r);
#endif
#ifdef TP_SSE2
    if (group % 4 == 0)
        for (; r + 4 <= nr; r += 4)
            quant_rows4(w + (size_t)r * ld, ld, cols, group, q + (size_t)r * (size_t)cols, scales + r * ngroups, err + r);
#endif
    for (; r < nr; r++)
        pln_tp_quant_row(w + (size_t)r * ld, cols, group, q + (size_t)r * (size_t)cols, scales + r * ngroups, err + r);
}

/* ---- int4 ---- */

/* round(x * inv) clamped to [-8, 7], ties away from zero (quant_fast's rule on the int4 range). */
static inline int quant4(float x, float inv) {
    float v = x * inv;
    v = v == v ? v : 0.0f;
    v = v < 7.0f ? v : 7.0f;
    v = v > -8.0f ? v : -8.0f;
    int t = (int)v;
    float frac = v - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

/* A positive, finite fp16 scale for s (> 0 or not), as pln_tp_scale_f16 clamps. */
static uint16_t scale16(float s) {
    if (!(s > 0)) return 0x3c00;
    if (s > PLN_F16_MAX) return 0x7bff;
    uint16_t h = pln_f32_to_f16(s);
    return (h & 0x7fff) == 0 ? 0x0001 : h;
}

/* The search below scores a candidate scale by the squared error of the group's rounding, each
 * value's error weighted by w^2 + mean(w^2) over the group: an error on a large weight costs more
 * than the same error on a small one, because large weights are the ones whose products dominate
 * the layer's output (the calibration-free stand-in for activation-aware weighting; llama.cpp
 * weights its K-quant searches the same way, sigma^2 + x^2). Plain squared error, the previous
 * objective, clips the largest weights to round the bulk more finely: lower weight error (11-14 %
 * below absmax on Gaussian weights, against 9-10 % now) but a worse model. On bloom-kjv int4 g32 (tools/bench/quality.sh, windows of 128)
 * the mean KL to fp16 went from 1.96e-4 (plain squared error) to 1.59e-4, and at g128 from 3.28e-4
 * to 2.23e-4; Q4_0's rounding (absmax with the sign of the extreme on the -8 level, which needs a
 * negative scale the format does not have) measured 1.81e-4 and 2.18e-4 on the same meter.
 *
 * Sums over a group run in I4_LANES float lanes (element j in lane j % 16) reduced by one fixed
 * tree, in the C, AVX2 and AVX-512 paths alike, so all choose the same scale for every input (no
 * FMA in any: the Makefile builds this file with -ffp-contract=off, since a fused multiply-add
 * rounds differently; test_tp compares the paths' scores bit for bit). */
#define I4_LANES 16

static inline float lanes_sum16(const float *a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    float d0 = c[0] + c[2], d1 = c[1] + c[3];
    return d0 + d1;
}

/* The candidate clipping ratios D (scale = absmax / D): D = 7 first (absmax, nothing clipped; kept
 * unless another is strictly better), then a coarse grid, then the two neighbours at half the
 * coarse step around the best coarse D. The weighted error is a bumpy but broad curve of D; the
 * coarse-to-fine pass measured the same KL as every 1/8 step of 6.5..9.375 (24 candidates) with 14. */
#define I4_D_FIRST 7.0f
#define I4_D_LO 6.5f
#define I4_D_STEP 0.25f
#define I4_D_N 12              /* 6.5, 6.75, ..., 9.25 */

typedef struct {
    /* weights w^2 + mean(w^2) into wt; returns the group's absmax */
    float (*prep)(const float *x, int64_t n, float *wt);
    /* the weighted squared error of rounding x at scale s */
    float (*werr)(const float *x, const float *wt, int64_t n, float s);
    /* q = round(x / s) packed (n % 32 == 0) at packed; adds sum (x - q s)^2, sum x^2, max |x - q s| */
    void (*emit)(const float *x, int64_t n, float s, uint8_t *packed, float *e2, float *r2, float *mx);
} i4_ops;

static float prep_c(const float *x, int64_t n, float *wt) {
    float acc[I4_LANES] = {0}, amax = 0;
    for (int64_t j = 0; j < n; j += I4_LANES)
        for (int l = 0; l < I4_LANES; l++) {
            float v = x[j + l], a = fabsf(v);
            amax = a > amax ? a : amax;
            acc[l] += v * v;
        }
    float msq = lanes_sum16(acc) / (float)n;
    for (int64_t j = 0; j < n; j++) wt[j] = x[j] * x[j] + msq;
    return amax;
}

/* The search rounds half to even (one instruction in SIMD; here the 1.5 * 2^23 trick, exact for
 * |v| <= 2^22), the stored q half away from zero (quant4): at an exact tie both are the same
 * distance away, so only the last bits of a score can differ. The clamp is written so that a NaN
 * becomes 7 as SIMD min/max make it (its error is NaN either way, and never wins). */
static float werr_c(const float *x, const float *wt, int64_t n, float s) {
    float inv = 1.0f / s, acc[I4_LANES] = {0};
    for (int64_t j = 0; j < n; j += I4_LANES)
        for (int l = 0; l < I4_LANES; l++) {
            float v = x[j + l] * inv;
            v = v < 7.0f ? v : 7.0f;
            v = v > -8.0f ? v : -8.0f;
            float d = x[j + l] - ((v + 12582912.0f) - 12582912.0f) * s;   /* IEEE: no reassociation */
            acc[l] += wt[j + l] * (d * d);
        }
    return lanes_sum16(acc);
}

static void emit_c(const float *x, int64_t n, float s, uint8_t *packed, float *e2, float *r2, float *mx) {
    float inv = 1.0f / s, ae[I4_LANES] = {0}, ar[I4_LANES] = {0}, m = 0;
    for (int64_t j = 0; j < n; j += I4_LANES)
        for (int l = 0; l < I4_LANES; l++) {
            float v = x[j + l];
            int q = quant4(v, inv);
            pln_i4_set(packed, j + l, q);
            float d = v - (float)q * s;
            ae[l] += d * d;
            ar[l] += v * v;
            m = fabsf(d) > m ? fabsf(d) : m;
        }
    *e2 = lanes_sum16(ae);
    *r2 = lanes_sum16(ar);
    *mx = m;
}

#ifdef TP_AVX2
/* round(x * inv) clamped to [-8, 7], ties away from zero: quant4 on 8 lanes. */
static inline TP_AVX2_TGT __m256i q4_lanes8(__m256 x, __m256 inv) {
    __m256 v = _mm256_mul_ps(x, inv);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(v, _mm256_set1_ps(7.0f));
    v = _mm256_max_ps(v, _mm256_set1_ps(-8.0f));
    __m256i t = _mm256_cvttps_epi32(v);
    __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
    t = _mm256_sub_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
    return _mm256_add_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
}

/* lanes_sum16 of the 16 lanes (lo: 0..7, hi: 8..15), the same tree. */
static inline TP_AVX2_TGT float sum16_avx2(__m256 lo, __m256 hi) {
    __m256 b = _mm256_add_ps(lo, hi);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

static TP_AVX2_TGT float prep_avx2(const float *x, int64_t n, float *wt) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), m = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += I4_LANES) {
        __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
        m = _mm256_max_ps(_mm256_and_ps(v0, absmask), m);   /* a NaN lane is ignored, as in prep_c */
        m = _mm256_max_ps(_mm256_and_ps(v1, absmask), m);
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(v0, v0));
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(v1, v1));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    float amax = hmax4(m4);
    __m256 msq = _mm256_set1_ps(sum16_avx2(a0, a1) / (float)n);
    for (int64_t j = 0; j < n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        _mm256_storeu_ps(wt + j, _mm256_add_ps(_mm256_mul_ps(v, v), msq));
    }
    return amax;
}

static TP_AVX2_TGT float werr_avx2(const float *x, const float *wt, int64_t n, float s) {
    const __m256 inv = _mm256_set1_ps(1.0f / s), sv = _mm256_set1_ps(s);
    const __m256 hi = _mm256_set1_ps(7.0f), lo = _mm256_set1_ps(-8.0f);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += I4_LANES) {
        __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
        __m256 r0 = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(v0, inv), hi), lo);
        __m256 r1 = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(v1, inv), hi), lo);
        r0 = _mm256_round_ps(r0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r1 = _mm256_round_ps(r1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 d0 = _mm256_sub_ps(v0, _mm256_mul_ps(r0, sv)), d1 = _mm256_sub_ps(v1, _mm256_mul_ps(r1, sv));
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(wt + j), _mm256_mul_ps(d0, d0)));
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(wt + j + 8), _mm256_mul_ps(d1, d1)));
    }
    return sum16_avx2(a0, a1);
}

/* 16 int32 q (two vectors) as 16 bytes q + 8, in order. */
static inline TP_AVX2_TGT __m128i nib16(__m256i t0, __m256i t1) {
    __m128i a = _mm_packs_epi32(_mm256_castsi256_si128(t0), _mm256_extracti128_si256(t0, 1));
    __m128i b = _mm_packs_epi32(_mm256_castsi256_si128(t1), _mm256_extracti128_si256(t1, 1));
    return _mm_add_epi8(_mm_packs_epi16(a, b), _mm_set1_epi8(8));
}

static TP_AVX2_TGT void emit_avx2(const float *x, int64_t n, float s, uint8_t *packed, float *e2, float *r2, float *mx) {
    const __m256 inv = _mm256_set1_ps(1.0f / s), sv = _mm256_set1_ps(s);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 e[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, r[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 m = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 32) {   /* one packed block: columns j..j+15 low nibbles, j+16..j+31 high */
        __m256i t[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_loadu_ps(x + j + 8 * k);
            t[k] = q4_lanes8(v, inv);
            __m256 d = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(t[k]), sv));
            e[k & 1] = _mm256_add_ps(e[k & 1], _mm256_mul_ps(d, d));   /* element j + 8k + i is lane (8k + i) % 16 */
            r[k & 1] = _mm256_add_ps(r[k & 1], _mm256_mul_ps(v, v));
            m = _mm256_max_ps(_mm256_and_ps(d, absmask), m);
        }
        __m128i lo = nib16(t[0], t[1]), hi = nib16(t[2], t[3]);
        _mm_storeu_si128((__m128i *)(packed + j / 2), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
    }
    *e2 = sum16_avx2(e[0], e[1]);
    *r2 = sum16_avx2(r[0], r[1]);
    *mx = hmax4(_mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1)));
}

/* The search's inner loop 16 lanes wide: one vector is the 16 lanes, reduced by the same tree.
 * (The weights and the packing stay 8 wide: a small share of the time.) */
#define TP_AVX512_TGT __attribute__((target("avx512f")))
static TP_AVX512_TGT float werr_avx512(const float *x, const float *wt, int64_t n, float s) {
    const __m512 inv = _mm512_set1_ps(1.0f / s), sv = _mm512_set1_ps(s);
    const __m512 hi = _mm512_set1_ps(7.0f), lo = _mm512_set1_ps(-8.0f);
    __m512 a = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += I4_LANES) {
        __m512 v = _mm512_loadu_ps(x + j);
        __m512 r = _mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(v, inv), hi), lo);
        r = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 d = _mm512_sub_ps(v, _mm512_mul_ps(r, sv));
        a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(wt + j), _mm512_mul_ps(d, d)));
    }
    return sum16_avx2(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#endif

static const i4_ops I4_C = {prep_c, werr_c, emit_c};
#ifdef TP_AVX2
static const i4_ops I4_AVX2 = {prep_avx2, werr_avx2, emit_avx2};
static const i4_ops I4_AVX512 = {prep_avx2, werr_avx512, emit_avx2};
#endif

/* The ops of a path, or NULL when this build or CPU lacks it. */
static const i4_ops *i4_ops_of(pln_tp_isa isa) {
    switch (isa) {
    case PLN_TP_ISA_C: return &I4_C;
#ifdef TP_AVX2
    case PLN_TP_ISA_AVX2: return __builtin_cpu_supports("avx2") ? &I4_AVX2 : NULL;
    case PLN_TP_ISA_AVX512: return __builtin_cpu_supports("avx512f") ? &I4_AVX512 : NULL;
#endif
    default: return NULL;
    }
}

static const i4_ops *i4_ops_get(void) {
    for (int isa = PLN_TP_ISA_AVX512; isa > PLN_TP_ISA_C; isa--) {
        const i4_ops *o = i4_ops_of((pln_tp_isa)isa);
        if (o) return o;
    }
    return &I4_C;
}

static void quant_row_i4(const i4_ops *ops, const float *restrict w, int64_t cols, int64_t group,
                         pln_tp_i4_method method, uint8_t *restrict packed, uint16_t *restrict scales,
                         pln_tp_qerr *err) {
    PLN_ASSERT(group % 32 == 0 && group <= 4096 && cols % group == 0);
    float wt[4096];
    double se = 0, sr = 0, m = 0;
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        const float *x = w + g0;
        float amax = ops->prep(x, group, wt);
        uint16_t best = scale16(amax / I4_D_FIRST);
        if (method == PLN_TP_I4_SEARCH && amax > 0) {
            float best_e = ops->werr(x, wt, group, pln_f16_to_f32(best)), best_d = I4_D_FIRST;
            uint16_t tried = best;
            for (int c = 0; c < I4_D_N + 2; c++) {
                /* the coarse grid, then half a step either side of the best D so far */
                float d = c < I4_D_N ? I4_D_LO + I4_D_STEP * (float)c
                                     : best_d + (c == I4_D_N ? -0.5f : 0.5f) * I4_D_STEP;
                uint16_t h = scale16(amax / d);
                if (h == best || h == tried) continue;   /* same fp16 scale, same error */
                tried = h;
                float e = ops->werr(x, wt, group, pln_f16_to_f32(h));
                if (e < best_e) { best_e = e; best = h; if (c < I4_D_N) best_d = d; }
            }
        }
        scales[gi] = best;
        float e2, r2, mx;
        ops->emit(x, group, pln_f16_to_f32(best), packed + g0 / 2, &e2, &r2, &mx);
        se += e2;
        sr += r2;
        m = mx > m ? mx : m;
    }
    err->err2 += se;
    err->ref2 += sr;
    if (m > err->max_abs) err->max_abs = m;
    err->n += (uint64_t)cols;
}

void pln_tp_quant_row_i4(const float *w, int64_t cols, int64_t group, pln_tp_i4_method method,
                         uint8_t *packed, uint16_t *scales, pln_tp_qerr *err) {
    static const i4_ops *ops;
    const i4_ops *o = __atomic_load_n(&ops, __ATOMIC_ACQUIRE);
    if (!o) { o = i4_ops_get(); __atomic_store_n(&ops, o, __ATOMIC_RELEASE); }
    quant_row_i4(o, w, cols, group, method, packed, scales, err);
}

bool pln_tp_quant_row_i4_isa(pln_tp_isa isa, const float *w, int64_t cols, int64_t group, pln_tp_i4_method method,
                             uint8_t *packed, uint16_t *scales, pln_tp_qerr *err) {
    const i4_ops *o = i4_ops_of(isa);
    if (!o) return false;
    quant_row_i4(o, w, cols, group, method, packed, scales, err);
    return true;
}

bool pln_tp_i4_score_isa(pln_tp_isa isa, const float *x, int64_t n, float s, float *score) {
    const i4_ops *o = i4_ops_of(isa);
    if (!o || n % 32 || n > 4096) return false;
    float wt[4096];
    o->prep(x, n, wt);
    *score = o->werr(x, wt, n, s);
    return true;
}
