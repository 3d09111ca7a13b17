/* tp.h — tensor-parallel split plans, as pure functions: what a plan entry is, the builders every
 * family's plan uses (formats/family.h: each family has its own), and BLOOM's "bloom-tp-v1" plan.
 *
 * For a config, a TP size, a rank and a dtype choice, a plan lists the rank file's tensors in the
 * exact order the forward pass reads them (see docs/FORMAT.md), and for each: the source tensor
 * it comes from (or, fused, the row ranges of several), the rows and columns of the source it
 * takes, the zero rows appended (vocabulary padding) and the transform (fp16 rounding or int8 /
 * int4 quantization). reshard writes what the plan says; verify reads it back with the same plan,
 * so the two cannot disagree.
 *
 * Also here: the per-element conversions both need (fp16 round-to-nearest-even with clamp
 * counting, symmetric int8 quantization with its error statistics), written once. */
#ifndef PLN_TP_H
#define PLN_TP_H

#include "formats/common.h"
#include "formats/hf.h"

#define PLN_TP_LAYOUT "bloom-tp-v1"
#define PLN_TP_NAME_MAX 96

/* The part of a BLOOM config the split depends on. */
typedef struct {
    int64_t vocab_size, hidden, n_head, n_layer;
} pln_tp_model;

typedef struct {
    int tp;                   /* number of ranks, >= 1 */
    bool int8;                /* int8 weight-only for the four linear weights of every layer */
    bool int4;                /* int4 weight-only for them instead (packed, grouped: needs group_size) */
    int64_t group_size;       /* input columns per scale; 0 = one scale per output channel (int8 only) */
    bool quantize_embedding;  /* int8 for word_embeddings.weight (needs int8 or int4) */
} pln_tp_opts;

typedef enum {
    PLN_TP_SPLIT_NONE = 0,    /* replicated on every rank (LayerNorms, row-parallel biases) */
    PLN_TP_SPLIT_ROWS,        /* contiguous block of rows (dim 0) */
    PLN_TP_SPLIT_COLS,        /* contiguous block of columns (dim 1) */
} pln_tp_split;

typedef enum {
    PLN_TP_TO_F16 = 0,        /* round to fp16 (RNE), out-of-range values clamped and counted */
    PLN_TP_QUANT_I8,          /* symmetric int8; the entry after it holds its scales */
    PLN_TP_QUANT_SCALE,       /* F16 scales [rows, cols/group] of the entry before it */
    PLN_TP_QUANT_I4,          /* symmetric int4, packed two per byte (U8 [rows, cols/2]); scales follow */
} pln_tp_transform;

/* A row range of one source tensor: a piece of a fused rank tensor (see pln_tp_entry.segs). */
#define PLN_TP_MAX_SEGS 3
typedef struct {
    char source[PLN_TP_NAME_MAX];  /* source tensor, without "transformer." */
    int64_t src_rows;              /* its rows (dim 0) as config.json implies */
    int64_t row0, rows;            /* rows taken: [row0, row0 + rows) */
} pln_tp_seg;

/* One rank tensor. 1-D tensors are seen as [n, 1] matrices so every slice is rows x columns. */
typedef struct {
    char name[PLN_TP_NAME_MAX];    /* rank tensor name ("h.3.mlp.dense_4h_to_h.weight_scale") */
    char source[PLN_TP_NAME_MAX];  /* source tensor, without "transformer." */
    pln_tp_transform transform;
    pln_tp_split split;
    pln_dtype dtype;               /* F16, I8, or U8 (packed int4) */
    int ndim;                      /* 1 or 2 */
    int64_t shape[2];              /* rank tensor shape (shape[1] = 1 when ndim == 1) */
    int src_ndim;
    int64_t src_shape[2];          /* source shape the config implies (src_shape[1] = 1 for 1-D) */
    int64_t row0, rows;            /* source rows taken: [row0, row0 + rows) */
    int64_t pad_rows;              /* zero rows written after them */
    int64_t col0, cols;            /* source columns taken: [col0, col0 + cols) */
    int64_t group;                 /* columns per scale for I8/I4 and scale entries, else 0 */
    /* A fused rank tensor (the Llama family's [q | k | v] and [gate ; up]): n_segs > 0 row ranges
     * of several source tensors, stacked in order. Then split is PLN_TP_SPLIT_ROWS, source is a
     * name for messages and records only, row0 = 0, rows = the segments' rows summed, and
     * src_shape = [that sum, columns] (each segment's own source is [src_rows, columns]). */
    int n_segs;
    pln_tp_seg segs[PLN_TP_MAX_SEGS];
} pln_tp_entry;

/* The source tensors of one entry: t[0] for a plain entry, t[0..n_segs) for a fused one. */
typedef struct {
    const pln_tensor *t[PLN_TP_MAX_SEGS];
} pln_tp_src;

/* Where local row lr (0 <= lr < e->rows) of entry e starts in its source (at column e->col0). */
const uint8_t *pln_tp_src_row(const pln_tp_entry *e, const pln_tp_src *s, int64_t lr);

/* ---- building plans (for each family's plan) ---- */
typedef struct {
    pln_tp_entry *e;
    size_t n, cap;
    const pln_tp_opts *o;
    int rank;
} pln_tp_builder;
/* A replicated 1-D tensor of n values (fp16). */
void pln_tp_add_vector(pln_tp_builder *b, const char *name, int64_t n);
/* A 1-D tensor of n values split in tp contiguous blocks. */
void pln_tp_add_vector_split(pln_tp_builder *b, const char *name, int64_t n);
/* A matrix [R, C]: rows split (padded to padded_rows first), columns split, or whole; int8
 * (quant 8) or packed int4 (quant 4) followed by its scale entry, else fp16 (quant 0). */
void pln_tp_add_matrix(pln_tp_builder *b, const char *name, int64_t R, int64_t C, pln_tp_split split,
                       int64_t padded_rows, int quant);
/* A fused tensor (name; source: the name messages use) of C columns (C == 1: 1-D) made of the
 * segments' rows in order, quantized as pln_tp_add_matrix's quant says (matrices only). */
void pln_tp_add_fused(pln_tp_builder *b, const char *name, const char *source, int64_t C, const pln_tp_seg *segs,
                      int n_segs, int quant);

/* The split-relevant part of a parsed config.json (the fields every family has). */
pln_tp_model pln_tp_model_of(const pln_hf_config *c);

/* Vocabulary rounded up to a multiple of tp (pad rows are zero and never sampled). */
int64_t pln_tp_vocab_padded(int64_t vocab_size, int tp);

/* ---- BLOOM's "bloom-tp-v1" plan (formats/family_bloom.c binds it to the family) ---- */

/* Checks that the model can be split tp ways with these options. -1 with an error saying what
 * to change: n_head % tp != 0 lists every TP size that works; a group size that does not divide
 * a rank's input dimension lists the dimensions. */
int pln_tp_check(const pln_tp_model *m, const pln_tp_opts *o);

/* The rank's tensors in file order. *out is allocated (free() it); -1 with an error when
 * pln_tp_check fails or rank is out of range. */
int pln_tp_plan(const pln_tp_model *m, const pln_tp_opts *o, int rank, pln_tp_entry **out, size_t *n_out);

/* True for the weight entries of a quantized matrix (I8 or I4; the next entry holds its scales). */
bool pln_tp_is_quant(const pln_tp_entry *e);
/* Bytes of one stored row of a matrix entry: cols x 2 (F16), cols (I8), cols / 2 (packed I4). */
size_t pln_tp_row_bytes(const pln_tp_entry *e);

/* The relative CPU cost of converting one source byte into entry e, for progress and ETA: fp16
 * rounding (or copy) 1, int8 2, int4 4 + 256 / group (the scale search: 6 at G = 128, 12 at
 * G = 32), scale entries 0 (made with their weight). Ratios of reshard's CPU time per source byte
 * on bloom-560m (docs/BENCHMARKS.md, "Reshard"). */
uint32_t pln_tp_work_per_byte(const pln_tp_entry *e);

/* Bytes of the rank tensor (rows + pad_rows for the data, per-group scales for scale entries). */
uint64_t pln_tp_entry_nbytes(const pln_tp_entry *e);

/* Looks up the source tensor(s) of every plan entry in ck and checks them before anything is
 * written: present, the shape config.json implies, a convertible dtype (the same for every
 * segment of a fused entry), contiguous, data mapped. srcs[i] gets the tensors of entry i (scale
 * entries: their weight's). -1 with an error naming the tensor (and its file) and what disagrees. */
int pln_tp_find_sources(const pln_ckpt *ck, const pln_tp_entry *plan, size_t n, pln_tp_src *srcs);

/* ---- conversions ------------------------------------------------------------------------ */

/* Source dtypes reshard accepts for weights: F32, F16, BF16 (what BLOOM checkpoints hold). */
bool pln_tp_dtype_convertible(pln_dtype dt);

/* Converts n source values (F32, F16, BF16) to fp16 by round-to-nearest-even. Values whose
 * magnitude rounds past fp16's range are stored as +-65504 and counted in *clamps; NaN and
 * infinities are counted in *nonfinite (stored as they are) so the caller can refuse the tensor.
 * An F16 source is copied bit for bit. */
void pln_tp_to_f16(pln_dtype src_dt, const void *src, uint16_t *dst, size_t n,
                   uint64_t *clamps, uint64_t *nonfinite);

/* Reads n values of a convertible dtype as float. NaN/inf are counted in *nonfinite. */
void pln_tp_to_f32(pln_dtype src_dt, const void *src, float *dst, size_t n, uint64_t *nonfinite);

/* Quantization error statistics: summed over elements, merged across rows and ranks. */
typedef struct {
    double err2;      /* sum (w - q*scale)^2 */
    double ref2;      /* sum w^2 */
    double max_abs;   /* max |w - q*scale| */
    uint64_t n;
} pln_tp_qerr;
void pln_tp_qerr_merge(pln_tp_qerr *into, const pln_tp_qerr *add);
/* sqrt(err2 / ref2); 0 when the reference is all zero and so is the error. */
double pln_tp_qerr_rel_rms(const pln_tp_qerr *e);

/* The fp16 scale of a group with absolute maximum absmax: absmax/127 rounded to fp16, 1.0 for an
 * all-zero group (q is all zero), never zero or infinite. */
uint16_t pln_tp_scale_f16(float absmax);

/* Quantizes one row of cols values in groups of `group` columns (group divides cols): q gets
 * round(w/scale) clamped to +-127, scales gets cols/group fp16 scales. The scale actually stored
 * (fp16) is the one used to quantize, so dequantization q*scale is what the error measures.
 * Adds this row's error to *err (accumulated in a fixed order: deterministic). */
void pln_tp_quant_row(const float *w, int64_t cols, int64_t group, int8_t *q, uint16_t *scales,
                      pln_tp_qerr *err);

/* pln_tp_quant_row on nr rows: row r reads w + r*ld and writes q + r*cols, scales +
 * r*(cols/group) and err[r]. Bit-identical to nr calls of pln_tp_quant_row (each row's sums keep
 * their order; rows are interleaved so those sequential sums overlap), just faster. */
void pln_tp_quant_rows(const float *w, size_t ld, int64_t nr, int64_t cols, int64_t group, int8_t *q,
                       uint16_t *scales, pln_tp_qerr *err);

/* The rounding pln_tp_quant_row uses: identical to pln_quant_i8 (formats/numeric.h) for every
 * input, without a libm call. Exposed for the test that proves it. */
int8_t pln_tp_quant_one(float x, float inv_scale);

/* ---- int4 ------------------------------------------------------------------------------
 * Symmetric: w ~ q * scale with q in [-8, 7], one fp16 scale per group of G columns (G a
 * multiple of 32), packed as docs/FORMAT.md says (pln_i4_* in formats/numeric.h). */

/* How a group's int4 scale is chosen. */
typedef enum {
    PLN_TP_I4_ABSMAX = 0,  /* scale = fp16(absmax / 7): no value clipped (the baseline) */
    PLN_TP_I4_SEARCH,      /* the scale of least weighted squared error (weights w^2 + mean(w^2) of
                            * the group) over a grid of clipping ratios (what reshard writes) */
} pln_tp_i4_method;

/* Quantizes one row of cols values (cols % 32 == 0, group % 32 == 0, group divides cols) into
 * cols/2 packed bytes and cols/group fp16 scales; adds the row's error to *err (per-group float
 * sums in a fixed lane order, added up in double: deterministic). The error is measured with the
 * stored (fp16) scale. Uses AVX-512 or AVX2 where the CPU has them; every result is bit-identical
 * to the plain C path's. Thread-safe. */
void pln_tp_quant_row_i4(const float *w, int64_t cols, int64_t group, pln_tp_i4_method method,
                         uint8_t *packed, uint16_t *scales, pln_tp_qerr *err);
/* The code paths of pln_tp_quant_row_i4. */
typedef enum { PLN_TP_ISA_C = 0, PLN_TP_ISA_AVX2, PLN_TP_ISA_AVX512 } pln_tp_isa;
/* pln_tp_quant_row_i4 on the given path; false (nothing written) when this build or CPU lacks it.
 * For the test that holds every SIMD path to the C one. */
bool pln_tp_quant_row_i4_isa(pln_tp_isa isa, const float *w, int64_t cols, int64_t group, pln_tp_i4_method method,
                             uint8_t *packed, uint16_t *scales, pln_tp_qerr *err);
/* The search's score of scale s for one group x[0..n) (n % 32 == 0, n <= 4096) on the given path:
 * its weighted squared error. false when the path is missing. For the test that holds every
 * path's scores to the C path's bits (a score differing in its last bit rarely changes a choice). */
bool pln_tp_i4_score_isa(pln_tp_isa isa, const float *x, int64_t n, float s, float *score);

#endif
