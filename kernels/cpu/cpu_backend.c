/* cpu_backend.c — the CPU backend's table: host memory, argument checks, instruction-set choice.
 * The ops themselves live one per file (embed.c, layernorm.c, rmsnorm.c, linear.c, rope.c, swiglu.c,
 * attention.c, sample.c). */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- instruction sets ---------------------------------------------------------------------- */
static const char *const g_isa_names[PLN_CPU_ISA_COUNT] = {"ref", "c", "avx2", "avx512"};

const char *pln_cpu_isa_name(pln_cpu_isa isa) {
    return (unsigned)isa < PLN_CPU_ISA_COUNT ? g_isa_names[isa] : "?";
}

#ifdef PLN_CPU_X86
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". The
 * builtin's "avx2" already includes the OS's consent to save ymm state. */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

bool pln_cpu_isa_supported(pln_cpu_isa isa) {
    switch (isa) {
    case PLN_CPU_ISA_REF: case PLN_CPU_ISA_C: return true;
#ifdef PLN_CPU_X86
    case PLN_CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case PLN_CPU_ISA_AVX512:
        __builtin_cpu_init();
        return pln_cpu_isa_supported(PLN_CPU_ISA_AVX2) && __builtin_cpu_supports("avx512f");
#endif
    default: return false;
    }
}

static const pln_cpu_kernels *kernels_of(pln_cpu_isa isa) {
    switch (isa) {
    case PLN_CPU_ISA_C: return &pln_cpu_kernels_c;
#ifdef PLN_CPU_X86
    case PLN_CPU_ISA_AVX2: return &pln_cpu_kernels_avx2;
    case PLN_CPU_ISA_AVX512: return &pln_cpu_kernels_avx512;
#endif
    default: return NULL;
    }
}

/* The environment's switches, each refused with its name where its value is not one it takes
 * (formats/common.h ENV_NOTE); the flags land in *idot, *bi, *nv (left as given when unset). */
static int cpu_env(bool *idot, bool *bi, bool *nv) {
    const char *isa = getenv("PLN_CPU_ISA");
    if (isa && *isa) {
        bool named = false;
        for (int i = 0; i < PLN_CPU_ISA_COUNT; i++) named |= !strcmp(isa, g_isa_names[i]);
        if (!named)
            return pln_errorf("cpu backend: PLN_CPU_ISA=%s: expected one of ref, c, avx2, avx512 (unset it for the best "
                              "this CPU has, %s)", isa, pln_cpu_isa_name(pln_cpu_isa_best()));
    }
    if (pln_env_flag("PLN_CPU_INT_DOT", idot) || pln_env_flag("PLN_CPU_BATCH_INVARIANT", bi) ||
        pln_env_flag("PLN_CPU_NO_VNNI", nv))
        return pln_error_context("cpu backend");
    return 0;
}

int pln_cpu_env_check(void) {
    bool idot, bi, nv;
    return cpu_env(&idot, &bi, &nv);
}

pln_cpu_isa pln_cpu_isa_best(void) {
    pln_cpu_isa best = PLN_CPU_ISA_C;
    for (int i = PLN_CPU_ISA_COUNT - 1; i > PLN_CPU_ISA_C; i--)
        if (pln_cpu_isa_supported((pln_cpu_isa)i)) { best = (pln_cpu_isa)i; break; }
    /* An operator (or a benchmark) may ask for a lower tier, never a higher one. */
    const char *env = getenv("PLN_CPU_ISA");
    if (env && *env)
        for (int i = 0; i < PLN_CPU_ISA_COUNT; i++)
            if (!strcmp(env, g_isa_names[i]) && i < (int)best) best = (pln_cpu_isa)i;
    return best;
}

int pln_cpu_set_isa(pln_backend *be, pln_cpu_isa isa) {
    if (!pln_cpu_isa_supported(isa))
        return pln_errorf("cpu backend: instruction set \"%s\" is not supported by this CPU",
                          pln_cpu_isa_name(isa));
    pln_cpu *c = pln_cpu_of(be);
    c->isa = isa;
    c->k = kernels_of(isa);
    return 0;
}

void pln_cpu_set_int_dot(pln_backend *be, bool on) { pln_cpu_of(be)->int_dot = be->int_dot = on; }
void pln_cpu_set_batch_invariant(pln_backend *be, bool on) {
    pln_cpu_of(be)->batch_invariant = be->batch_invariant = on;
}
bool pln_cpu_no_vnni;

/* ---- threads ----------------------------------------------------------------------------- */
/* Ranks launched together on one machine without binding would each start a thread per core
 * (2 ranks on 16 cores: 32 spinning threads); give each rank its share instead. A launcher that
 * bound the rank to some cores, or an explicit OMP_NUM_THREADS, already says what to use. */
static int default_threads(void) {
    if (getenv("OMP_NUM_THREADS")) return 0;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!ls) ls = getenv("MPI_LOCALNRANKS");
    int local = ls ? atoi(ls) : 1;
    if (local <= 1) return 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online <= 0 || CPU_COUNT(&set) < online) return 0;
    long n = online / local;
    return n < 1 ? 1 : (int)n;
}

void pln_cpu_set_threads(pln_backend *be, int n) { pln_cpu_of(be)->n_threads = n > 0 ? n : 0; }

/* ---- memory ---------------------------------------------------------------------------------- */
static void *cpu_alloc(pln_backend *be, size_t nbytes) {
    /* 64-byte alignment (a cache line, one AVX-512 vector); aligned_alloc wants a multiple. */
    size_t n = nbytes ? (nbytes + 63) / 64 * 64 : 64;
    if (n < nbytes) { pln_errorf("cpu backend: allocation of %zu bytes overflows", nbytes); return NULL; }
    void *p = aligned_alloc(64, n);
    if (!p) {
        char buf[32];
        pln_errorf("cpu backend: out of memory allocating %s; lower --max-seqs/--kv-tokens or "
                   "use more ranks", pln_human_bytes((double)nbytes, buf, sizeof buf));
    }
    return p;
}
static void cpu_free(pln_backend *be, void *p) { free(p); }
static int cpu_upload(pln_backend *be, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    return 0;
}
static int cpu_download(pln_backend *be, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    return 0;
}
static int cpu_memset0(pln_backend *be, void *dst, size_t n) {
    if (n) memset(dst, 0, n);
    return 0;
}
static int cpu_sync(pln_backend *be) { return 0; }
static const void *cpu_weights_from_host(pln_backend *be, void *dst, const void *src, size_t n) {
    return src; /* the mapping is used in place: no copy, no conversion */
}

/* ---- ops: check arguments, then run ------------------------------------------------------ */
#define NEED(cond, ...) do { if (!(cond)) return pln_errorf(__VA_ARGS__); } while (0)

static int check_weight(const char *op, const pln_weight *W) {
    NEED(W, "%s: weight is NULL", op);
    NEED(W->rows > 0 && W->cols > 0, "%s: weight shape [%lld, %lld] is empty", op,
         (long long)W->rows, (long long)W->cols);
    NEED(W->w, "%s: weight data is NULL", op);
    if (W->dtype == PLN_DTYPE_F16) return 0;
    NEED(W->dtype == PLN_DTYPE_I8 || W->dtype == PLN_DTYPE_U8,
         "%s: weight dtype %s is not supported (F16, I8 or packed int4 U8 + F16 scales)",
         op, pln_dtype_name(W->dtype));
    NEED(W->scale, "%s: quantized weight has no scales", op);
    NEED(W->group > 0 && W->cols % W->group == 0,
         "%s: group size %lld does not divide the %lld input columns", op,
         (long long)W->group, (long long)W->cols);
    NEED(W->dtype != PLN_DTYPE_U8 || W->group % 32 == 0,
         "%s: int4 group size %lld is not a multiple of 32 (the packed block)", op, (long long)W->group);
    return 0;
}

static int cpu_embed(pln_backend *be, void *out, const int32_t *ids, int32_t T,
                     const uint16_t *table, int64_t v0, int64_t vn, int64_t H) {
    NEED(T >= 0 && H > 0 && vn >= 0, "embed: bad sizes T=%d H=%lld vn=%lld", T, (long long)H, (long long)vn);
    NEED(T == 0 || (out && ids && (table || vn == 0)), "embed: NULL buffer");
    pln_cpu_embed(pln_cpu_of(be), out, ids, T, table, v0, vn, H);
    return 0;
}

static int cpu_layernorm(pln_backend *be, void *out, const void *in, const uint16_t *gamma,
                         const uint16_t *beta, int32_t T, int64_t H, float eps) {
    NEED(T >= 0 && H > 0, "layernorm: bad sizes T=%d H=%lld", T, (long long)H);
    NEED(T == 0 || (out && in && gamma && beta), "layernorm: NULL buffer");
    pln_cpu_layernorm(pln_cpu_of(be), out, in, gamma, beta, T, H, eps);
    return 0;
}

static int cpu_residual_layernorm(pln_backend *be, void *x, const void *y, const uint16_t *bias,
                                  const uint16_t *gamma, const uint16_t *beta, void *ln_out,
                                  int32_t T, int64_t H, float eps) {
    NEED(T >= 0 && H > 0, "residual_layernorm: bad sizes T=%d H=%lld", T, (long long)H);
    NEED(T == 0 || (x && ln_out && gamma && beta), "residual_layernorm: NULL buffer");
    pln_cpu_residual_layernorm(pln_cpu_of(be), x, y, bias, gamma, beta, ln_out, T, H, eps);
    return 0;
}

static int cpu_linear(pln_backend *be, void *out, const void *in, const pln_weight *W,
                      const uint16_t *bias, int32_t T, pln_epilogue epi) {
    if (check_weight("linear", W)) return -1;
    NEED(T >= 0, "linear: bad token count %d", T);
    NEED(T == 0 || (out && in), "linear: NULL buffer");
    NEED(epi == PLN_EPI_NONE || epi == PLN_EPI_GELU || (epi == PLN_EPI_SWIGLU && W->rows % 2 == 0),
         "linear: epilogue %d on [%lld, %lld] (SwiGLU needs an even row count: [gate ; up])", (int)epi,
         (long long)W->rows, (long long)W->cols);
    pln_cpu_linear(pln_cpu_of(be), out, epi == PLN_EPI_SWIGLU ? W->rows / 2 : W->rows, in, W, W->rows, bias, T, epi);
    return 0;
}

/* Every token's sequence, position and blocks up to its position must be valid: a bad table
 * would make the kernels write outside the cache. attention also needs max_pos to size work. */
static int check_meta(const char *op, const pln_attn_meta *m, int32_t n_head, int32_t head_dim,
                      bool need_max_pos) {
    NEED(m, "%s: no attention metadata", op);
    NEED(n_head > 0 && head_dim > 0, "%s: bad head count %d / head_dim %d", op, n_head, head_dim);
    NEED(m->n_kv_head >= 0 && (m->n_kv_head == 0 || n_head % m->n_kv_head == 0),
         "%s: %d KV heads do not divide the %d q heads (grouped-query layout)", op, m->n_kv_head, n_head);
    NEED(m->window >= 0, "%s: sliding window %d must be 0 (none) or positive", op, m->window);
    NEED(m->n_tokens >= 0 && m->n_seqs >= 0 && m->block_size > 0 && m->max_blocks > 0,
         "%s: bad metadata (tokens %d, seqs %d, block_size %d, max_blocks %d)", op, m->n_tokens,
         m->n_seqs, m->block_size, m->max_blocks);
    if (m->n_tokens == 0) return 0;
    NEED(m->tok_seq && m->tok_pos && m->block_table, "%s: NULL metadata array", op);
    int64_t cap = (int64_t)m->block_size * m->max_blocks;
    for (int32_t t = 0; t < m->n_tokens; t++) {
        int32_t s = m->tok_seq[t], p = m->tok_pos[t];
        NEED(s >= 0 && s < m->n_seqs, "%s: token %d: sequence %d out of range [0, %d)", op, t, s, m->n_seqs);
        NEED(p >= 0 && p < cap, "%s: token %d: position %d out of range [0, %lld)", op, t, p, (long long)cap);
        NEED(!need_max_pos || p < m->max_pos, "%s: token %d: position %d >= max_pos %d", op, t, p, m->max_pos);
        for (int32_t b = 0; b <= p / m->block_size; b++)
            NEED(m->block_table[(int64_t)s * m->max_blocks + b] >= 0,
                 "%s: sequence %d: block %d of the block table is unassigned", op, s, b);
    }
    return 0;
}

static int cpu_kv_append(pln_backend *be, const void *qkv, void *k_cache, void *v_cache,
                         const pln_attn_meta *m, int32_t n_head, int32_t head_dim) {
    if (check_meta("kv_append", m, n_head, head_dim, false)) return -1;
    NEED(m->n_tokens == 0 || (qkv && k_cache && v_cache), "kv_append: NULL buffer");
    pln_cpu_kv_append(pln_cpu_of(be), qkv, k_cache, v_cache, m, n_head, head_dim,
                      be->kv_dtype == PLN_DTYPE_F16);
    return 0;
}

static int cpu_attention(pln_backend *be, void *out, const void *qkv, const void *k_cache,
                         const void *v_cache, const pln_attn_meta *m, const float *slopes,
                         int32_t n_head, int32_t head_dim) {
    if (check_meta("attention", m, n_head, head_dim, true)) return -1;
    NEED(m->n_tokens == 0 || (out && qkv && k_cache && v_cache), "attention: NULL buffer");
    return pln_cpu_attention(pln_cpu_of(be), out, qkv, k_cache, v_cache, m, slopes, n_head, head_dim,
                             be->kv_dtype == PLN_DTYPE_F16);
}

static int cpu_rmsnorm(pln_backend *be, void *out, const void *in, const uint16_t *gamma, int32_t T,
                       int64_t H, float eps) {
    NEED(T >= 0 && H > 0, "rmsnorm: bad sizes T=%d H=%lld", T, (long long)H);
    NEED(T == 0 || (out && in && gamma), "rmsnorm: NULL buffer");
    pln_cpu_rmsnorm(pln_cpu_of(be), out, in, gamma, T, H, eps);
    return 0;
}

static int cpu_residual_rmsnorm(pln_backend *be, void *x, const void *y, const uint16_t *bias,
                                const uint16_t *gamma, void *ln_out, int32_t T, int64_t H, float eps) {
    NEED(T >= 0 && H > 0, "residual_rmsnorm: bad sizes T=%d H=%lld", T, (long long)H);
    NEED(T == 0 || (x && ln_out && gamma), "residual_rmsnorm: NULL buffer");
    pln_cpu_residual_rmsnorm(pln_cpu_of(be), x, y, bias, gamma, ln_out, T, H, eps);
    return 0;
}

static int cpu_rope(pln_backend *be, void *qkv, const pln_attn_meta *m, const float *inv_freq,
                    int32_t n_head, int32_t head_dim) {
    if (check_meta("rope", m, n_head, head_dim, false)) return -1;
    NEED(m->n_kv_head > 0, "rope: needs the grouped-query layout (n_kv_head > 0), got %d", m->n_kv_head);
    NEED(head_dim % 2 == 0, "rope: head_dim %d is odd (rotary pairs i, i + head_dim/2)", head_dim);
    NEED(m->n_tokens == 0 || (qkv && inv_freq), "rope: NULL buffer");
    return pln_cpu_rope(pln_cpu_of(be), qkv, m, inv_freq, n_head, head_dim);
}

static int cpu_swiglu(pln_backend *be, void *out, const void *in, int32_t T, int64_t I) {
    NEED(T >= 0 && I > 0, "swiglu: bad sizes T=%d I=%lld", T, (long long)I);
    NEED(T == 0 || (out && in), "swiglu: NULL buffer");
    pln_cpu_swiglu(pln_cpu_of(be), out, in, T, I);
    return 0;
}

static int cpu_gather_rows(pln_backend *be, void *out, const void *in, const int32_t *rows,
                           int32_t n, int64_t H) {
    NEED(n >= 0 && H > 0, "gather_rows: bad sizes n=%d H=%lld", n, (long long)H);
    NEED(n == 0 || (out && in && rows), "gather_rows: NULL buffer");
    for (int32_t i = 0; i < n; i++) NEED(rows[i] >= 0, "gather_rows: row %d is negative", rows[i]);
    pln_cpu_gather_rows(pln_cpu_of(be), out, in, rows, n, H);
    return 0;
}

static int cpu_logits(pln_backend *be, float *out, const void *x, const pln_weight *W, int32_t S,
                      int64_t n_valid) {
    if (check_weight("logits", W)) return -1;
    NEED(S >= 0, "logits: bad row count %d", S);
    NEED(S == 0 || (out && x), "logits: NULL buffer");
    int64_t nv = n_valid < 0 ? 0 : n_valid > W->rows ? W->rows : n_valid;
    pln_cpu_linear(pln_cpu_of(be), out, W->rows, x, W, nv, NULL, S, PLN_EPI_NONE);
    for (int32_t s = 0; s < S; s++)
        for (int64_t r = nv; r < W->rows; r++) out[(int64_t)s * W->rows + r] = -INFINITY;
    return 0;
}

static int cpu_logit_process(pln_backend *be, float *logits, int64_t v0, int64_t vn,
                             const pln_logit_proc *p) {
    NEED(p && vn > 0 && p->n_rows >= 0, "logit_process: bad arguments");
    NEED(p->n_rows == 0 || (logits && p->penalty && p->inv_temperature && p->seen_offsets),
         "logit_process: NULL buffer");
    return pln_cpu_logit_process(pln_cpu_of(be), logits, v0, vn, p);
}

static int cpu_topk(pln_backend *be, const float *logits, int32_t S, int64_t vn, int64_t v0,
                    int32_t k, float *vals, int32_t *ids, float *row_max, float *row_sumexp) {
    NEED(S >= 0 && vn > 0 && k >= 0 && k <= vn, "topk: bad sizes S=%d vn=%lld k=%d (need 0 <= k <= vn)",
         S, (long long)vn, k);
    NEED(S == 0 || (logits && row_max && row_sumexp && (k == 0 || (vals && ids))), "topk: NULL buffer");
    pln_cpu_topk(pln_cpu_of(be), logits, S, vn, v0, k, vals, ids, row_max, row_sumexp);
    return 0;
}

/* F32 (the exact reference) or F16 (half the memory); set before the KV cache is allocated. */
static int cpu_set_kv_dtype(pln_backend *be, pln_dtype dt) {
    NEED(dt == PLN_DTYPE_F32 || dt == PLN_DTYPE_F16,
         "cpu backend: KV-cache dtype %s is not supported (f32 or f16)", pln_dtype_name(dt));
    be->kv_dtype = dt;
    be->kv_size = dt == PLN_DTYPE_F16 ? 2 : 4;
    return 0;
}

void *pln_cpu_work(pln_cpu *c, pln_cpu_work_slot s, size_t bytes) {
    if (bytes > c->work[s].n) {
        free(c->work[s].p);
        size_t n = (bytes + 63) / 64 * 64;
        c->work[s].p = aligned_alloc(64, n);
        c->work[s].n = c->work[s].p ? n : 0;
        if (!c->work[s].p) pln_die("out of memory allocating %zu bytes", bytes);
    }
    return c->work[s].p;
}

static void cpu_destroy(pln_backend *be) {
    if (!be) return;
    pln_cpu *c = be->impl;
    for (int s = 0; c && s < PLN_CPU_WORK_N; s++) free(c->work[s].p);
    free(be->impl);
    free(be);
}

pln_backend *pln_backend_cpu_create(void) {
    pln_backend *be = calloc(1, sizeof *be);
    pln_cpu *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be); free(c);
        pln_errorf("cpu backend: out of memory");
        return NULL;
    }
    be->name = "cpu";
    be->host_memory = true;
    be->act_size = 4; be->act_dtype = PLN_DTYPE_F32;
    be->kv_size = 4; be->kv_dtype = PLN_DTYPE_F32;
    be->impl = c;
    be->alloc = cpu_alloc; be->free = cpu_free; be->upload = cpu_upload;
    be->download = cpu_download; be->memset0 = cpu_memset0; be->sync = cpu_sync;
    be->weights_from_host = cpu_weights_from_host;
    be->load_file = NULL;
    be->embed = cpu_embed; be->layernorm = cpu_layernorm;
    be->residual_layernorm = cpu_residual_layernorm; be->linear = cpu_linear;
    be->kv_append = cpu_kv_append; be->attention = cpu_attention;
    be->gather_rows = cpu_gather_rows; be->logits = cpu_logits;
    be->logit_process = cpu_logit_process; be->topk = cpu_topk;
    be->rmsnorm = cpu_rmsnorm; be->residual_rmsnorm = cpu_residual_rmsnorm;
    be->rope = cpu_rope; be->swiglu = cpu_swiglu; be->linear_swiglu = true;
    be->set_kv_dtype = cpu_set_kv_dtype;
    be->destroy = cpu_destroy;
    pln_cpu_set_isa(be, pln_cpu_isa_best());
    c->n_threads = default_threads();
    be->set_int_dot = pln_cpu_set_int_dot;
    be->set_batch_invariant = pln_cpu_set_batch_invariant;
    be->tune = pln_cpu_tune;
    be->tune_model = pln_cpu_tune_model;
    bool idot = false, bi = false, nv = false;
    if (cpu_env(&idot, &bi, &nv)) {
        cpu_destroy(be);
        return NULL;
    }
    c->int_dot = be->int_dot = idot;
    c->batch_invariant = be->batch_invariant = bi;
    if (nv) pln_cpu_no_vnni = true;
    return be;
}

double pln_cpu_copy_pass_gbs(double *c, const double *a, size_t n, int passes) {
    double best = 1e30;
    for (int rep = 0; rep < passes; rep++) {
        double t0 = pln_now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) c[i] = a[i];
        double dt = pln_now() - t0;
        if (dt < best) best = dt;
    }
    volatile double sink = c[n / 2];
    (void)sink;
    return 2.0 * (double)n * sizeof(double) / best / 1e9;
}

void pln_cpu_host_describe(pln_cpu_host *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->vendor, sizeof out->vendor, "unknown");
    snprintf(out->name, sizeof out->name, "unknown");
    out->family = out->model = out->stepping = -1;
    out->isa = pln_cpu_isa_name(pln_cpu_isa_best());
#ifdef PLN_CPU_X86
    unsigned r[4], max;
    if (!__get_cpuid(0, &max, &r[1], &r[2], &r[3])) return;
    /* leaf 0: the vendor string in ebx, edx, ecx */
    memcpy(out->vendor, &r[1], 4);
    memcpy(out->vendor + 4, &r[3], 4);
    memcpy(out->vendor + 8, &r[2], 4);
    out->vendor[12] = '\0';
    if (max >= 1 && __get_cpuid(1, &r[0], &r[1], &r[2], &r[3])) {
        /* the displayed family adds the extended family only at 15, the model the extended
         * model only at family 6 or 15 (Intel SDM vol. 2A, CPUID; AMD APM vol. 3) */
        unsigned fam = (r[0] >> 8) & 0xf, mod = (r[0] >> 4) & 0xf;
        if (fam == 0xf) fam += (r[0] >> 20) & 0xff;
        if (fam == 0x6 || fam >= 0xf) mod += ((r[0] >> 16) & 0xf) << 4;
        out->family = (int)fam;
        out->model = (int)mod;
        out->stepping = (int)(r[0] & 0xf);
    }
    unsigned emax = __get_cpuid_max(0x80000000u, NULL);
    if (emax >= 0x80000004u) {
        char brand[49];
        for (unsigned l = 0; l < 3; l++) {
            __get_cpuid(0x80000002u + l, &r[0], &r[1], &r[2], &r[3]);
            memcpy(brand + 16 * l, r, 16);
        }
        brand[48] = '\0';
        const char *b = brand;
        while (*b == ' ') b++;
        size_t n = strlen(b);
        while (n > 0 && b[n - 1] == ' ') n--;
        if (n > 0) snprintf(out->name, sizeof out->name, "%.*s", (int)n, b);
    }
#endif
}

/* One pass of the FMA chains on every thread: GFLOP/s (0 when the loop's value is not a number,
 * which would mean it did not run as written). */
static double fma_pass(const pln_cpu_kernels *k, int64_t iters) {
    double flops = 0.0, t0 = pln_now();
    float sink = 0.0f;
#pragma omp parallel reduction(+ : flops, sink)
    {
        float s;
        flops += k->fma_chains(iters, &s);
        sink += s;
    }
    double dt = pln_now() - t0;
    return dt > 0 && sink == sink ? flops / dt / 1e9 : 0.0;
}

double pln_cpu_fma_gflops(void) {
    const pln_cpu_kernels *k = kernels_of(pln_cpu_isa_best());
    if (!k) k = &pln_cpu_kernels_c;   /* the reference loops: the C tier's plain multiply-adds */
    /* a warm-up of at least 30 ms: the threads start and the cores leave their idle clocks
     * (measured first thing in a process, the passes ran at 75 % of this without it) */
    for (double t0 = pln_now(); pln_now() - t0 < 0.03;) fma_pass(k, (int64_t)1 << 20);
    double best = 0.0;
    for (int pass = 0; pass < 5; pass++) {
        double g = fma_pass(k, (int64_t)1 << 23);
        if (g > best) best = g;
    }
    return best;
}

/* pln_cpu_c2c_ns: the line the two threads hand back and forth. The main thread writes odd
 * values and waits for the next even one; the partner answers each odd value with the next even
 * one and leaves on a negative one. */
static struct { _Atomic int64_t v; char pad[56]; } c2c_line __attribute__((aligned(128)));

static bool pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

static void *c2c_partner(void *arg) {
    if (!pin_to((int)(intptr_t)arg)) { atomic_store_explicit(&c2c_line.v, -2, memory_order_release); return NULL; }
    for (;;) {
        int64_t v = atomic_load_explicit(&c2c_line.v, memory_order_acquire);
        if (v < 0) return NULL;
        if (v & 1) atomic_store_explicit(&c2c_line.v, v + 1, memory_order_release);
#ifdef PLN_CPU_X86
        else _mm_pause();
#endif
    }
}

double pln_cpu_c2c_ns(void) {
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) < 2) return 0.0;
    int cpu[2], n = 0;
    for (int i = 0; i < CPU_SETSIZE && n < 2; i++) if (CPU_ISSET(i, &mine)) cpu[n++] = i;
    cpu_set_t before;
    if (pthread_getaffinity_np(pthread_self(), sizeof before, &before) != 0) return 0.0;
    atomic_store_explicit(&c2c_line.v, 0, memory_order_relaxed);
    pthread_t t;
    if (pthread_create(&t, NULL, c2c_partner, (void *)(intptr_t)cpu[1]) != 0) return 0.0;
    double best = 0.0, stop = pln_now() + 0.3;
    if (pin_to(cpu[0])) {
        int64_t v = 0;
        for (int run = 0; run < 3 && pln_now() < stop; run++) {
            double t0 = pln_now();
            int trips = 0;
            for (; trips < 10000; trips++) {
                atomic_store_explicit(&c2c_line.v, ++v, memory_order_release);
                int64_t got;
                for (int spin = 0; (got = atomic_load_explicit(&c2c_line.v, memory_order_acquire)) == v; spin++)
                    if ((spin & 1023) == 1023 && pln_now() > stop) break;
                if (got != v + 1) break;   /* the partner could not pin, or the time is up */
                v++;
            }
            if (trips < 10000) break;
            double ns = (pln_now() - t0) * 1e9 / (2.0 * trips);
            if (best == 0.0 || ns < best) best = ns;
        }
    }
    atomic_store_explicit(&c2c_line.v, -1, memory_order_release);
    pthread_join(t, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof before, &before);
    return best;
}

double pln_cpu_copy_gbs(size_t bytes) {
    size_t n = bytes / sizeof(double);
    if (n == 0) return 0.0;
    double *a = pln_xmalloc(n * sizeof(double)), *c = pln_xmalloc(n * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { a[i] = (double)i; c[i] = 0; }
    pln_cpu_copy_pass_gbs(c, a, n, 1);   /* warm-up */
    double gbs = pln_cpu_copy_pass_gbs(c, a, n, 5);
    free(a);
    free(c);
    return gbs;
}
