/* cmd_verify.c — `pollen verify OUT [--source SRC]`: checks a shard set end to end.
 *
 * Without --source: the manifest, its config block, the tokenizer and config.json against their
 * recorded checksums (manifest version 2) and config.json against the manifest, every rank file's
 * size and header checksum, the tensor table against its family's plan (formats/family.h), every tensor's XXH3
 * (a bad one is named), that all padding bytes are zero and every int8/int4 scale finite and
 * positive. With --source: every source tensor is rebuilt from its slices on all ranks (int8 and
 * int4 dequantized)
 * and compared element by element with the source: fp16 must equal the round-to-nearest-even
 * fp16 of the source bit for bit (so an fp16 source must come back exactly), int8/int4 must stay
 * within half a quantization step of the source everywhere (int4: plus what the scale search
 * chose to clip) and reproduce the relative-RMS and
 * max-abs errors the manifest records; vocabulary pad rows must be zero. Streaming, row chunks
 * at a time, so a set of any size verifies in bounded memory. */
#include "formats/common.h"
#include "formats/family.h"
#include "formats/hf.h"
#include "formats/shard.h"
#include "formats/tp.h"
#include "kernels/pln_math.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define VF_CHUNK_ELEMS (4u << 20)

typedef struct {
    int n_fail;
    char first[1024];
    json_t *problems;   /* --json: every problem's message */
} vf_result;

/* --quiet: only problems (stderr) and the verdict; --json: one JSON object on stdout instead of
 * the text (problems still on stderr as they come). */
static bool g_quiet, g_json;

static void fail(vf_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(vf_result *r, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL  %s\n", msg);
    if (r->problems) json_array_append_new(r->problems, json_string(msg));
    if (!r->n_fail++) snprintf(r->first, sizeof r->first, "%s", msg);
}

static void release(const void *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), s = (uintptr_t)p, e = s + n;
    uintptr_t lo = s / pg * pg, hi = (e + pg - 1) / pg * pg;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Comparison of one rank slice (entry e, shard tensor data d[, scales sc]) with the source. */
typedef struct {
    uint64_t mismatched;      /* fp16: elements whose bits differ from RNE(source) */
    uint64_t over_bound;      /* int8: elements further than half a step from the source */
    uint64_t pad_nonzero;
    double max_abs;           /* max |shard value - source value| */
    pln_tp_qerr qerr;
} vf_cmp;

static void compare_slice(const pln_tp_entry *e, const pln_tp_src *srcs, const uint8_t *d, const uint16_t *sc, vf_cmp *out) {
    const pln_tensor *src = srcs->t[0];
    bool quant = pln_tp_is_quant(e), i4 = e->transform == PLN_TP_QUANT_I4;
    int64_t cols = e->cols, src_cols = e->src_shape[1], ng = quant ? cols / e->group : 0;
    size_t esz = pln_dtype_size(src->dtype), orow = pln_tp_row_bytes(e);
    int64_t total = e->rows + e->pad_rows;
    int64_t k = (int64_t)(VF_CHUNK_ELEMS / (uint64_t)cols);
    if (k < 1) k = 1;
    if (k > total && total > 0) k = total;   /* a bias: one chunk of its own rows, not 4M error slots */
    pln_tp_qerr *row_err = pln_xmalloc((size_t)k * sizeof *row_err);
    for (int64_t r0 = 0; r0 < total; r0 += k) {
        int64_t nr = total - r0 < k ? total - r0 : k;
        uint64_t mism = 0, over = 0, padnz = 0;
        double mx = out->max_abs;
#pragma omp parallel reduction(+ : mism, over, padnz) reduction(max : mx) if (nr * cols >= 65536)
        {
            float *w = pln_xmalloc((size_t)cols * sizeof(float));
            uint16_t *h = pln_xmalloc((size_t)cols * 2);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < nr; i++) {
                int64_t lr = r0 + i;
                const uint8_t *o = d + (size_t)lr * orow;
                row_err[i] = (pln_tp_qerr){0};
                if (lr >= e->rows) {
                    for (size_t b = 0; b < orow; b++) padnz += o[b] != (i4 ? 0x88 : 0);   /* int4 zero: nibbles 8 */
                    continue;
                }
                const uint8_t *s = pln_tp_src_row(e, srcs, lr);
                uint64_t nf = 0;
                pln_tp_to_f32(src->dtype, s, w, (size_t)cols, &nf);
                if (!quant) {
                    uint64_t cl = 0;
                    pln_tp_to_f16(src->dtype, s, h, (size_t)cols, &cl, &nf);
                    const uint16_t *got = (const uint16_t *)o;
                    for (int64_t j = 0; j < cols; j++) {
                        mism += got[j] != h[j];
                        double diff = fabs((double)pln_f16_to_f32(got[j]) - (double)w[j]);
                        if (diff > mx) mx = diff;
                    }
                } else {
                    const int8_t *q = (const int8_t *)o;
                    double e2 = 0, r2 = 0, rmx = 0;
                    for (int64_t j = 0; j < cols; j++) {
                        float s_ = pln_f16_to_f32(sc[lr * ng + j / e->group]);
                        double deq = i4 ? pln_dequant_i4(pln_i4_get(o, j), s_) : pln_dequant_i8(q[j], s_);
                        double diff = fabs(deq - (double)w[j]);
                        /* half a step, plus what clamping at the end levels costs (int8: when fp16
                         * rounded the scale down; int4: the clipping the scale search chose), plus
                         * float slack */
                        double top = i4 ? (w[j] < 0 ? 8.0 : 7.0) : 127.0;
                        double bound = 0.5 * s_ + fmax(0.0, fabs((double)w[j]) - top * s_) + 1e-6 * fabs((double)w[j]) + 1e-30;
                        over += !(diff <= bound) || !(s_ > 0);
                        e2 += diff * diff;
                        r2 += (double)w[j] * w[j];
                        if (diff > rmx) rmx = diff;
                    }
                    row_err[i] = (pln_tp_qerr){e2, r2, rmx, (uint64_t)cols};
                    if (rmx > mx) mx = rmx;
                }
            }
            free(w);
            free(h);
        }
        for (int64_t i = 0; i < nr; i++) pln_tp_qerr_merge(&out->qerr, &row_err[i]);
        out->mismatched += mism;
        out->over_bound += over;
        out->pad_nonzero += padnz;
        out->max_abs = mx;
        int64_t real_end = r0 + nr < e->rows ? r0 + nr : e->rows;
        if (real_end > r0 && !e->n_segs) release(src->data + (size_t)(e->row0 + r0) * (size_t)src_cols * esz, (size_t)(real_end - r0) * (size_t)src_cols * esz);
        release(d + (size_t)r0 * orow, (size_t)nr * orow);
    }
    free(row_err);
}

/* --json: {"ok", "set", "tp", "dtype", "tensors_checked", "small_files_checked", "source",
 * "problems": [...], "tensors": [per tensor against the source], "seconds"} on stdout; the exit
 * status as without it (0 ok, 1 problems). Frees the arrays. */
static int verdict_json(const char *dir, vf_result *res, const char *dtype, int tp, const int64_t *n_checked,
                        const char *source, json_t *tensors, bool small_checked, double dt) {
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_boolean(res->n_fail == 0));
    json_object_set_new(o, "set", json_string(dir));
    if (dtype) {
        json_object_set_new(o, "tp", json_integer(tp));
        json_object_set_new(o, "dtype", json_string(dtype));
        json_object_set_new(o, "tensors_checked", json_integer(n_checked ? *n_checked : 0));
        json_object_set_new(o, "small_files_checked", json_boolean(small_checked));
    }
    json_object_set_new(o, "source", source ? json_string(source) : json_null());
    json_object_set_new(o, "problems", res->problems);
    json_object_set_new(o, "tensors", tensors);
    json_object_set_new(o, "seconds", json_real(dt));
    char *txt = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    puts(txt);
    free(txt);
    json_decref(o);
    return res->n_fail ? 1 : 0;
}

int cmd_verify(int argc, char **argv) {
    const char *source = NULL, *dir = NULL;
    bool strict = false;
    int threads = 0;
    pln_opt opts[] = {
        PLN_O_POS("SET", dir, "the shard set", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("source", 0, source, "CHECKPOINT", "also rebuild every tensor and compare it with the checkpoint it came from"),
        PLN_O_FLAG("strict", 0, strict, "also fail a set whose manifest (version 1) records no checksums of its small files"),
        PLN_O_FLAG("quiet", 'q', g_quiet, "print only the problems (stderr) and the verdict line"),
        PLN_O_FLAG("json", 0, g_json, "print the result as one JSON object on stdout (problems also on stderr)"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "threads (default: all cores)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "verify", .synopsis = "pollen verify SET [--source CHECKPOINT] [--strict] [--quiet | --json]",
                       .intro = "  SET: a shard set directory (manifest.json + rank files)\n", .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    if (threads) omp_set_num_threads(threads);
    vf_result res = {0};
    json_t *jtensors = NULL;
    if (g_json) { res.problems = json_array(); jtensors = json_array(); }
    double t0 = pln_now();

    pln_shardset *set = pln_shardset_open(dir);
    if (!set) {
        fail(&res, "%s", pln_error());
        if (g_json) return verdict_json(dir, &res, NULL, 0, NULL, source, jtensors, false, pln_now() - t0);
        printf("verify: FAILED — %s\n", res.first);
        return 1;
    }
    bool small_checked = set->small_files_checked;
    unsigned set_version = set->version;
    pln_tp_model m = pln_tp_model_of(&set->config);
    pln_tp_opts o = {.tp = set->tp, .int8 = !strcmp(set->dtype, "int8"), .int4 = !strcmp(set->dtype, "int4"),
                     .group_size = set->group_size, .quantize_embedding = set->quantize_embedding};
    int tp = set->tp;
    pln_tp_entry **plans = pln_xcalloc((size_t)tp, sizeof *plans);
    pln_shard **shards = pln_xcalloc((size_t)tp, sizeof *shards);
    size_t n = 0;
    int64_t n_checked = 0;
    for (int r = 0; r < tp; r++) {
        if (pln_family_of(&set->config)->tp_plan(&set->config, &o, r, &plans[r], &n)) { fail(&res, "%s: %s", dir, pln_error()); continue; }
        shards[r] = pln_shardset_open_rank(set, r);
        if (!shards[r]) { fail(&res, "%s", pln_error()); continue; }
        const pln_shard *s = shards[r];
        /* the table must be the plan (reshard and the loader share one definition, checked here) */
        if (s->n_tensors != n) fail(&res, "%s: %llu tensors, the %s plan has %zu", s->path, (unsigned long long)s->n_tensors, set->layout, n);
        for (size_t i = 0; i < n && i < s->n_tensors; i++) {
            const pln_shard_tensor *t = &s->tensors[i];
            const pln_tp_entry *e = &plans[r][i];
            bool ok = !strcmp(t->name, e->name) && t->dtype == e->dtype && t->ndim == e->ndim && t->shape[0] == e->shape[0] &&
                      (e->ndim == 1 || t->shape[1] == e->shape[1]);
            if (!ok) fail(&res, "%s: tensor %llu is %s %s, the plan says %s %s", s->path, (unsigned long long)i, t->name,
                          pln_dtype_name(t->dtype), e->name, pln_dtype_name(e->dtype));
        }
        /* what FORMAT.md promises beyond the checksums: zero padding, usable int8 scales */
        if (pln_shard_check_padding(s)) fail(&res, "%s", pln_error());
        if (pln_layout_check_scales(s)) fail(&res, "%s", pln_error());
        char **bad = NULL;
        int64_t nbad = pln_shard_verify_all(s, &bad);
        for (int64_t b = 0; b < nbad; b++) {
            fail(&res, "%s: tensor %s: checksum mismatch (data corrupted)", s->path, bad[b]);
            free(bad[b]);
        }
        free(bad);
        n_checked += (int64_t)s->n_tensors;
    }
    if (!g_quiet && !g_json) printf("checksums: %d rank file%s, %lld tensors checked, %d bad\n", tp, tp == 1 ? "" : "s", (long long)n_checked, res.n_fail);

    if (source && res.n_fail == 0) {
        pln_ckpt ck;
        if (pln_ckpt_open(&ck, source)) {
            fail(&res, "%s", pln_error());
        } else {
            pln_tp_model sm = ck.has_config ? pln_tp_model_of(&ck.config) : (pln_tp_model){0};
            if (memcmp(&sm, &m, sizeof m))
                fail(&res, "%s: config (vocab %lld, hidden %lld, n_head %lld, n_layer %lld) differs from the manifest's (%lld, %lld, %lld, %lld)",
                     source, (long long)sm.vocab_size, (long long)sm.hidden, (long long)sm.n_head, (long long)sm.n_layer,
                     (long long)m.vocab_size, (long long)m.hidden, (long long)m.n_head, (long long)m.n_layer);
            /* the family's own fields too (rotary, KV heads, end ids): weights alone do not show them */
            if (ck.has_config && !res.n_fail) {
                if (pln_family_of(&ck.config) != pln_family_of(&set->config))
                    fail(&res, "%s: config.json's model_type \"%s\" is not the set's \"%s\"", source, ck.config.model_type,
                         set->config.model_type);
                else if (pln_family_of(&set->config)->config_agrees(&set->config, &ck.config, source, dir))
                    fail(&res, "%s", pln_error());
            }
            pln_tp_src *srcs = pln_xcalloc(n, sizeof *srcs);
            if (!res.n_fail && pln_tp_find_sources(&ck, plans[0], n, srcs)) fail(&res, "%s", pln_error());
            json_t *rec = json_object_get(set->json, "tensors");
            if (!res.n_fail) {
                if (!g_quiet && !g_json)
                    printf("%-48s %-5s %-6s %12s %12s %12s  %s\n", "tensor", "src", "as", "max_abs", "rel_rms", "recorded", "result");
                for (size_t i = 0; i < n; i++) {
                    const pln_tp_entry *e0 = &plans[0][i];
                    if (e0->transform == PLN_TP_QUANT_SCALE) continue;
                    bool quant = pln_tp_is_quant(e0);
                    const char *as = e0->transform == PLN_TP_QUANT_I4 ? "int4" : quant ? "int8" : "fp16";
                    vf_cmp c = {0};
                    for (int r = 0; r < tp; r++) {
                        const pln_shard_tensor *t = &shards[r]->tensors[i];
                        const uint16_t *sc = quant ? pln_shard_data(shards[r], &shards[r]->tensors[i + 1]) : NULL;
                        compare_slice(&plans[r][i], &srcs[i], pln_shard_data(shards[r], t), sc, &c);
                    }
                    double rel = pln_tp_qerr_rel_rms(&c.qerr), rec_rel = NAN, rec_max = NAN;
                    json_t *rt = json_object_get(rec, e0->source);
                    if (quant && rt) {
                        rec_rel = json_number_value(json_object_get(rt, "quant_rel_rms"));
                        rec_max = json_number_value(json_object_get(rt, "quant_max_abs"));
                    }
                    char why[256] = "";
                    if (c.pad_nonzero) snprintf(why, sizeof why, "%llu non-zero bytes in vocabulary pad rows", (unsigned long long)c.pad_nonzero);
                    else if (!quant && c.mismatched)
                        snprintf(why, sizeof why, "%llu values differ from the source rounded to fp16", (unsigned long long)c.mismatched);
                    else if (quant && c.over_bound)
                        snprintf(why, sizeof why, "%llu values further than half a quantization step from the source", (unsigned long long)c.over_bound);
                    else if (quant && !rt) snprintf(why, sizeof why, "no quantization error recorded in the manifest");
                    /* the same double sums in another grouping: agree to ~1e-15; 1e-6 leaves room */
                    else if (quant && !(rel <= rec_rel * (1 + 1e-6) + 1e-12 && c.max_abs <= rec_max * (1 + 1e-6) + 1e-12))
                        snprintf(why, sizeof why, "error (rel rms %.4g, max %.4g) exceeds the recorded (%.4g, %.4g)", rel, c.max_abs, rec_rel, rec_max);
                    char rel_s[32] = "-", rec_s[32] = "-";
                    if (quant) {
                        snprintf(rel_s, sizeof rel_s, "%.4e", rel);
                        snprintf(rec_s, sizeof rec_s, "%.4e", rec_rel);
                    }
                    if (jtensors) {
                        json_t *jt = json_object();
                        json_object_set_new(jt, "tensor", json_string(e0->source));
                        json_object_set_new(jt, "src", json_string(pln_dtype_name(srcs[i].t[0]->dtype)));
                        json_object_set_new(jt, "as", json_string(as));
                        json_object_set_new(jt, "max_abs", json_real(c.max_abs));
                        if (quant) json_object_set_new(jt, "rel_rms", json_real(rel));
                        if (quant && rt) json_object_set_new(jt, "recorded_rel_rms", json_real(rec_rel));
                        json_object_set_new(jt, "ok", json_boolean(!why[0]));
                        if (why[0]) json_object_set_new(jt, "problem", json_string(why));
                        json_array_append_new(jtensors, jt);
                    }
                    if (!g_quiet && !g_json)
                        printf("%-48s %-5s %-6s %12.4e %12s %12s  %s%s%s\n", e0->source, pln_dtype_name(srcs[i].t[0]->dtype), as,
                               c.max_abs, rel_s, rec_s,
                               why[0] ? "FAIL" : quant ? "ok (within recorded error)" : srcs[i].t[0]->dtype == PLN_DTYPE_F16 ? "ok (bit-exact)" : "ok (= fp16 RNE of source)",
                               why[0] ? ": " : "", why);
                    if (why[0]) fail(&res, "%s: %s", e0->source, why);
                }
            }
            free(srcs);
            pln_ckpt_close(&ck);
        }
    }
    for (int r = 0; r < tp; r++) {
        if (shards[r]) pln_shard_close(shards[r]);
        free(plans[r]);
    }
    free(shards);
    free(plans);
    pln_shardset_close(set);
    double dt = pln_now() - t0;
    const char *dtn = o.int4 ? "int4" : o.int8 ? "int8" : "fp16";
    if (g_json) {
        if (!res.n_fail && !small_checked && strict)
            fail(&res, "%s: manifest version %u records no checksums of its config block, tokenizer and config.json "
                 "(--strict); re-run reshard to write a version %d manifest", dir, set_version, PLN_MANIFEST_VERSION);
        return verdict_json(dir, &res, dtn, tp, &n_checked, source, jtensors, small_checked, dt);
    }
    if (res.n_fail) {
        printf("verify: FAILED — %d problem%s; first: %s\n", res.n_fail, res.n_fail == 1 ? "" : "s", res.first);
        return 1;
    }
    if (!small_checked && strict) {
        printf("verify: FAILED — %s: manifest version %u records no checksums of its config block, tokenizer and "
               "config.json (--strict); re-run reshard to write a version %d manifest\n", dir, set_version, PLN_MANIFEST_VERSION);
        return 1;
    }
    if (!small_checked)
        fprintf(stderr, "note: manifest version 1 records no checksums of its config block, tokenizer and config.json (config.json "
               "was checked against the manifest); re-run reshard to add them\n");
    printf("verify: OK — %s: TP %d %s, manifest, %s, sizes, checksums, padding, scales%s (%.2f s)\n", dir, tp,
           dtn, small_checked ? "config/tokenizer checksums" : "config/tokenizer NOT checksummed (v1)",
           source ? ", and every tensor against the source" : "", dt);
    return 0;
}
