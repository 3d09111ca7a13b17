/* cmd_perplexity.c — `pollen perplexity SET --file TEXT [--kl-base BASE]`: the quality meter.
 * Sliding-window perplexity of a shard set on a text, with its uncertainty; against a base set
 * (usually the fp16 one) the KL divergence of the two next-token distributions, top-1 agreement
 * and the worst tokens, as llama.cpp's perplexity tool reports them. Runs at any TP under mpirun
 * like generate; the base set must have the same TP and vocabulary.
 *
 * Windows: C tokens (--ctx) starting every S tokens (--stride, default C/2). Each target token
 * (every token but the first) is scored exactly once, in the first window that holds it after
 * the ones already scored: the first window scores its targets 1..C-1, every later one only its
 * last S, so each of those has at least C-S tokens of context. With S = C the windows do not
 * overlap and the first token of each window is not scored.
 *
 * KL: the base set runs first; the raw logits of its scored rows go to an unlinked temporary file
 * (TMPDIR, 4 x vocab bytes per scored token), then the set under test runs and reads them back.
 * Both passes compute every statistic in double from the same float logits in the same order, so
 * a set against itself gives KL 0 exactly. */
#include "formats/common.h"
#include "formats/shard.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/tokenizer.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "tools/opt.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PPL_MAX_FILE (256u << 20)   /* text files beyond this are refused (tokenizing is the cost) */

typedef struct { int64_t b, e, lo; } ppl_window;   /* feed ids [b, e); score targets [lo, e) */

/* What a pass measures per scored token (rank 0). */
typedef struct {
    double *nll;                /* -log p(target) */
    double *kl;                 /* KL(base || this), only with a base */
    int32_t *top1;              /* argmax of the logits (first on ties) */
    int64_t n;                  /* scored tokens */
    int64_t n_vocab;
    char dtype[16];
    int32_t tp;
    bool int_dot;               /* the set ran on the integer-dot path */
} ppl_pass;

typedef struct {
    const char *dir;
    pln_engine_opts eo;
    bool quiet;
} ppl_run;

/* Windows of C tokens every S over n tokens; returns their count (>= 1). */
static int64_t plan_windows(int64_t n, int64_t C, int64_t S, ppl_window **out) {
    int64_t cap = 1 + (n > C ? (n - C + S - 1) / S : 0), k = 0, scored_to = 1;
    ppl_window *w = pln_xcalloc((size_t)cap, sizeof *w);
    for (int64_t b = 0;; b += S) {
        int64_t e = b + C < n ? b + C : n;
        int64_t lo = b + 1 > scored_to ? b + 1 : scored_to;
        PLN_ASSERT(k < cap);
        w[k++] = (ppl_window){b, e, lo};
        scored_to = e;
        if (e == n) break;
    }
    *out = w;
    return k;
}

/* log-sum-exp and argmax of one row, in double (the first maximum on ties). */
static double row_lse(const float *x, int64_t V, int32_t *argmax) {
    int64_t am = 0;
    for (int64_t i = 1; i < V; i++) if (x[i] > x[am]) am = i;
    double m = x[am], s = 0;
    for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - m);
    *argmax = (int32_t)am;
    return m + log(s);
}

/* KL(p_base || p_this) of two raw logit rows with their log-sum-exps. Exactly 0 for equal rows:
 * every term is p * (a - a). */
static double row_kl(const float *base, double lse_b, const float *x, double lse_x, int64_t V) {
    double kl = 0;
    for (int64_t i = 0; i < V; i++) {
        double lb = (double)base[i] - lse_b, lx = (double)x[i] - lse_x;
        kl += exp(lb) * (lb - lx);
    }
    return kl;
}

static void progress(bool on, const char *label, int64_t done, int64_t total, const ppl_pass *ps, double *last) {
    if (!on) return;
    double now = pln_now();
    if (done < total && now - *last < 0.1) return;
    *last = now;
    double s = 0;
    for (int64_t i = 0; i < ps->n; i++) s += ps->nll[i];
    int w = 30, fill = total ? (int)(w * done / total) : w;
    fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld tokens  ppl %.4f", label, fill, "==============================",
            w - fill, "", (long long)done, (long long)total, ps->n ? exp(s / (double)ps->n) : 0.0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* One pass over the windows with one set. Every rank calls it; ranks != 0 serve the steps.
 * store: the base pass writes its scored rows' logits there; base: the pass under test reads them.
 * 0, or -1 with an error (rank 0's pass fails on every rank together: the engine agrees). */
static int run_pass(pln_comm *comm, const ppl_run *r, const char *label, const int32_t *ids, int64_t n_ids,
                    const ppl_window *w, int64_t n_w, FILE *store, FILE *base, int64_t base_vocab, ppl_pass *ps) {
    int rank = pln_comm_rank(comm);
    pln_engine_opts eo = r->eo;
    eo.shard_dir = r->dir;
    eo.max_seqs = 1;
    eo.max_seq_len = (int32_t)(w[0].e - w[0].b);
    eo.kv_tokens = (int64_t)eo.max_seq_len + eo.block_size;
    eo.quiet = true;
    pln_engine *e = pln_engine_open(&eo, comm);
    if (!e) return pln_error_context("%s", r->dir);
    if (rank != 0) {
        int rc = pln_engine_worker_loop(e);
        pln_engine_close(e);
        return rc;
    }
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    int64_t V = info.n_vocab;
    ps->n_vocab = V;
    ps->tp = info.tp;
    snprintf(ps->dtype, sizeof ps->dtype, "%s", info.dtype);
    ps->int_dot = info.int_dot;
    int rc = 0;
    if (base && V != base_vocab)
        rc = pln_errorf("%s has a vocabulary of %lld but the base set %lld: compare sets of the same model",
                        r->dir, (long long)V, (long long)base_vocab);
    int64_t total = n_ids - 1;
    ps->nll = pln_xmalloc((size_t)total * sizeof(double));
    ps->top1 = pln_xmalloc((size_t)total * sizeof(int32_t));
    if (base) ps->kl = pln_xmalloc((size_t)total * sizeof(double));
    ps->n = 0;
    float *brow = base ? pln_xmalloc((size_t)V * 4) : NULL;
    bool bar = !r->quiet && isatty(2);
    double last = 0;
    int32_t release = 0;
    for (int64_t k = 0; k < n_w && rc == 0; k++) {
        pln_step_seq q = {.slot = 0, .n_new = (int32_t)(w[k].e - w[k].b), .tokens = ids + w[k].b};
        pln_step_plan plan = {.n_seqs = 1, .seqs = &q, .want_logits = true,
                              .n_release = k > 0, .release = &release};
        pln_step_out out;
        if (pln_engine_step(e, &plan, &out)) { rc = pln_error_context("window %lld of %lld", (long long)k + 1, (long long)n_w); break; }
        for (int64_t t = w[k].lo; t < w[k].e && rc == 0; t++) {
            const float *x = out.logits + (size_t)(t - 1 - w[k].b) * (size_t)V;
            int32_t am;
            double lse = row_lse(x, V, &am);
            if (!isfinite(lse) || !isfinite(x[ids[t]])) {
                rc = pln_errorf("token %lld: %s", (long long)t, PLN_NONFINITE_MSG);
                break;
            }
            ps->nll[ps->n] = lse - (double)x[ids[t]];
            ps->top1[ps->n] = am;
            if (store && fwrite(x, 4, (size_t)V, store) != (size_t)V)
                rc = pln_errorf("writing the base logits to a temporary file in %s: %s (set TMPDIR to a "
                                "filesystem with %.1f MB free)", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
                                strerror(errno), (double)total * (double)V * 4 / 1e6);
            if (base) {
                if (fread(brow, 4, (size_t)V, base) != (size_t)V) { rc = pln_errorf("reading back the base logits: %s", strerror(errno)); break; }
                int32_t bam;
                double lse_b = row_lse(brow, V, &bam);
                ps->kl[ps->n] = row_kl(brow, lse_b, x, lse, V);
            }
            ps->n++;
        }
        progress(bar, label, w[k].e - 1, total, ps, &last);
    }
    free(brow);
    pln_engine_shutdown(e);
    pln_engine_close(e);
    return rc;
}

static double mean_of(const double *v, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return n ? s / (double)n : 0;
}

/* Standard error of the mean (sample standard deviation / sqrt(n)); 0 below two values. */
static double sem_of(const double *v, int64_t n, double mean) {
    if (n < 2) return 0;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (v[i] - mean) * (v[i] - mean);
    return sqrt(s / (double)(n - 1) / (double)n);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted values (nearest rank, as llama.cpp's percentiles). */
static double quantile(const double *sorted, int64_t n, double q) {
    if (n == 0) return 0;
    int64_t i = (int64_t)ceil(q * (double)n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* The base set of --kl-base must score the same token ids over the same vocabulary on as many
 * ranks: checked here, before any pass, rather than failing mid-run on an id out of range. */
static void base_matches(const pln_shardset *set, const char *base_dir) {
    pln_shardset *b = pln_shardset_open(base_dir);
    if (!b) pln_die("--kl-base: %s", pln_error());
    if (b->tp != set->tp)
        pln_die("--kl-base %s: the base set is TP=%d and %s is TP=%d: compare sets of the same TP size (reshard the base "
                "with --tp %d)", base_dir, b->tp, set->dir, set->tp, set->tp);
    if (b->config.vocab_size != set->config.vocab_size)
        pln_die("--kl-base %s: the base set has a vocabulary of %lld and %s one of %lld: compare sets of the same model",
                base_dir, (long long)b->config.vocab_size, set->dir, (long long)set->config.vocab_size);
    if (!b->tokenizer_path)
        pln_die("--kl-base %s: the base set records no tokenizer, so it cannot be shown to share %s's", base_dir, set->dir);
    size_t na = 0, nb = 0;
    char *ta = pln_read_small_file(set->tokenizer_path, PPL_MAX_FILE, &na);
    if (!ta) pln_die("%s", pln_error());
    char *tb = pln_read_small_file(b->tokenizer_path, PPL_MAX_FILE, &nb);
    if (!tb) pln_die("--kl-base: %s", pln_error());
    if (na != nb || pln_xxh3(ta, na) != pln_xxh3(tb, nb) || memcmp(ta, tb, na))
        pln_die("--kl-base %s: its tokenizer (%s) differs from %s's (%s): the token ids of the text would mean other "
                "tokens; compare sets converted from the same model", base_dir, b->tokenizer_path, set->dir,
                set->tokenizer_path);
    free(ta);
    free(tb);
    pln_shardset_close(b);
}

int cmd_perplexity(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *base_dir = NULL;
    int64_t ctx = 512, stride = 0, max_tokens = 0;
    int threads = 0;
    bool json = false, per_token = false, quiet = false, no_launch = false;
    ppl_run r = {0};
    pln_engine_opts_default(&r.eo);
    pln_opt opts[] = {
        PLN_O_POS("SET", dir, "the shard set", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("model", 'm', dir, "SET", "the shard set (instead of the positional SET)"),
        PLN_O_STR("file", 'f', file, "TEXT",
                  "UTF-8 text to score (tokenized once with the set's tokenizer and its post-processor: a "
                  "Llama set's BOS comes first, never scored)", .flags = PLN_OPT_REQUIRED),
        PLN_O_INT("ctx", 'c', ctx, 2, 1 << 20, "N", "window length in tokens (default {}; the whole text if shorter)",
                  .aliases = "ctx-size"),
        PLN_O_INT("stride", 0, stride, 1, 1 << 20, "S", "a new window every S tokens; each scores its last S (default ctx/2)"),
        PLN_O_INT("max-tokens", 0, max_tokens, 2, INT32_MAX, "N", "score only the first N tokens of the text"),
        PLN_O_STR("kl-base", 0, base_dir, "BASE",
                  "also compare with BASE (same TP and vocabulary, e.g. the fp16 set): mean KL(BASE || SET), its "
                  "99th percentile and maximum, top-1 agreement"),
        PLN_O_FLAG("json", 0, json, "print the results as one JSON object"),
        PLN_O_FLAG("per-token", 0, per_token, "with --json: every scored token's id, NLL (and KL)"),
        PLN_O_STR("backend", 0, r.eo.backend, "cpu|cuda", "(default cpu)"),
        PLN_O_STR("kv-dtype", 0, r.eo.kv_dtype, "f32|f16", "KV-cache dtype (default: the backend's own)"),
        PLN_CLI_INT_DOT_OPTS(r.eo),
        PLN_O_INT("device", 0, r.eo.device, 0, PLN_CLI_MAX_DEVICE, "D", "CUDA device of every rank (default: picked from the node-local rank)"),
        PLN_O_INT("gpus-per-node", 0, r.eo.gpus_per_node, 1, PLN_CLI_MAX_DEVICE + 1, "N",
                  "CUDA device = node-local rank % N (default: the node-local rank)"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "threads per rank (default: cores / ranks on the node)"),
        PLN_O_FLAG("populate", 0, r.eo.populate, "fault the shard in at load"),
        PLN_O_FLAG("verify", 0, r.eo.verify, "check checksums at load"),
        PLN_O_FLAG("quiet", 'q', quiet, "no progress bar"),
        PLN_O_FLAG("no-launch", 0, no_launch, "run as one process even when SET is TP > 1 (by default pollen starts the set's N ranks itself under mpirun; under mpirun/srun it never does)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "perplexity", .synopsis = "pollen perplexity SET --file TEXT [options]", .opts = opts,
                       .rank = pln_opt_env_rank(),
                       .epilog = "\nPerplexity is exp(mean NLL) in nats per token, ± exp(mean) x the standard error of the mean.\n"};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    int launched = pln_launch_self("perplexity", dir, argc, argv, no_launch, quiet || json);
    if (launched >= 0) return launched;
    pln_comm *comm = pln_comm_init(&argc, &argv);
    int rank = pln_comm_rank(comm), size = pln_comm_size(comm);
    if (per_token && !json) pln_die("--per-token needs --json");
    if (stride > ctx) pln_die("--stride %lld: must not exceed --ctx %lld", (long long)stride, (long long)ctx);
    r.eo.kv_dtype = pln_cli_kv_dtype(r.eo.backend, r.eo.kv_dtype);
    r.eo.int_dot = pln_cli_int_dot(r.eo.backend, r.eo.int_dot);
    pln_cli_batch_invariant(r.eo.backend, r.eo.batch_invariant);
    r.eo.cpu_tune = pln_cli_cpu_tune(r.eo.cpu_tune);
    r.dir = dir;
    r.quiet = quiet || json;
    pln_cli_threads(threads, size);

    /* The text, tokenized on rank 0 with the set's tokenizer; the others need only the sizes. */
    int32_t *ids = NULL;
    int64_t hdr[3] = {0, 0, 0};   /* tokens, ctx, stride */
    if (rank == 0) {
        pln_shardset *set = pln_shardset_open(dir);
        if (!set) pln_die("%s", pln_error());
        if (!set->tokenizer_path)
            pln_die("%s: the manifest records no tokenizer (\"tokenizer\": null): re-run reshard from a checkpoint that "
                    "has tokenizer.json", dir);
        pln_tokenizer *tok = pln_tok_load(set->tokenizer_path);
        if (!tok) pln_die("%s", pln_error());
        if (base_dir) base_matches(set, base_dir);
        pln_shardset_close(set);
        size_t len = 0, n = 0;
        char *text = pln_read_small_file(file, PPL_MAX_FILE, &len);
        if (!text) pln_die("--file: %s", pln_error());
        /* The whole text with the post-processor, as transformers' perplexity recipe encodes it
         * (tokenizer(text)): Llama's BOS once at the start, never scored; BLOOM's adds nothing.
         * Later windows start mid-text without a BOS (llama.cpp instead puts BOS at each window's start). */
        if (pln_tok_encode_special(tok, text, len, true, &ids, &n)) pln_die("--file %s: %s", file, pln_error());
        free(text);
        pln_tok_free(tok);
        if (max_tokens && (int64_t)n > max_tokens) n = (size_t)max_tokens;
        if (n < 2) pln_die("--file %s: %zu token%s; perplexity needs at least 2", file, n, n == 1 ? "" : "s");
        if (ctx > (int64_t)n) ctx = (int64_t)n;   /* one window over a short text */
        if (!stride) stride = ctx / 2 > 0 ? ctx / 2 : 1;
        if (stride > ctx) stride = ctx;
        hdr[0] = (int64_t)n; hdr[1] = ctx; hdr[2] = stride;
    }
    if (pln_comm_bcast(comm, hdr, sizeof hdr, 0)) pln_die("%s", pln_error());
    int64_t n_ids = hdr[0];
    ctx = hdr[1];
    stride = hdr[2];
    ppl_window *w = NULL;
    int64_t n_w = plan_windows(n_ids, ctx, stride, &w);

    ppl_pass pb = {0}, pt = {0};
    FILE *tmp = NULL;
    int rc = 0;
    int32_t ok = 1;
    double t0 = pln_now();
    if (base_dir) {
        if (rank == 0) {
            const char *td = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
            char *path = pln_xasprintf("%s/pollen-ppl-XXXXXX", td);
            int fd = mkstemp(path);
            if (fd < 0) rc = pln_errorf("creating a temporary file in %s for the base logits: %s (set TMPDIR)", td, strerror(errno));
            else {
                unlink(path);   /* gone with the process, however it ends */
                tmp = fdopen(fd, "w+b");
                if (!tmp) { close(fd); rc = pln_errorf("fdopen: %s", strerror(errno)); }
            }
            free(path);
            ok = rc == 0;
        }
        if (pln_comm_bcast(comm, &ok, sizeof ok, 0)) pln_die("%s", pln_error());
        if (ok) {
            ppl_run rb = r;
            rb.dir = base_dir;
            rc = run_pass(comm, &rb, "base", ids, n_ids, w, n_w, tmp, NULL, 0, &pb);
            /* Rank 0 alone knows whether its side of the pass succeeded; the next one starts together. */
            if (rank == 0) {
                if (rc == 0 && (fflush(tmp) || fseek(tmp, 0, SEEK_SET)))
                    rc = pln_errorf("rewinding the base logits file: %s", strerror(errno));
                ok = rc == 0;
            }
            if (pln_comm_bcast(comm, &ok, sizeof ok, 0)) pln_die("%s", pln_error());
        }
    }
    if (ok) rc = run_pass(comm, &r, base_dir ? "set " : "ppl ", ids, n_ids, w, n_w, NULL, tmp, pb.n_vocab, &pt);
    if (tmp) fclose(tmp);
    double secs = pln_now() - t0;
    if (rank != 0 || rc || !ok) {
        if (rc) {
            if (size > 1) fprintf(stderr, "pollen: rank %d: %s\n", rank, pln_error());
            else fprintf(stderr, "pollen: %s\n", pln_error());
        }
        free(w); free(ids);
        free(pb.nll); free(pb.top1); free(pt.nll); free(pt.top1); free(pt.kl);
        pln_comm_free(comm);
        return rc || !ok ? 1 : 0;
    }

    /* Statistics (rank 0). */
    int64_t n = pt.n;
    double m = mean_of(pt.nll, n), se = sem_of(pt.nll, n, m);
    double ppl = exp(m), ppl_se = ppl * se;
    double bm = 0, bse = 0, dm = 0, dse = 0, klm = 0, klse = 0, klmed = 0, kl99 = 0, klmax = 0, agree = 0, agree_se = 0;
    if (base_dir) {
        PLN_ASSERT(pb.n == n);
        bm = mean_of(pb.nll, n);
        bse = sem_of(pb.nll, n, bm);
        double *d = pln_xmalloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) d[i] = pt.nll[i] - pb.nll[i];
        dm = mean_of(d, n);
        dse = sem_of(d, n, dm);
        klm = mean_of(pt.kl, n);
        klse = sem_of(pt.kl, n, klm);
        memcpy(d, pt.kl, (size_t)n * sizeof(double));
        qsort(d, (size_t)n, sizeof(double), cmp_double);
        klmed = quantile(d, n, 0.5);
        kl99 = quantile(d, n, 0.99);
        klmax = d[n - 1];
        free(d);
        int64_t same = 0;
        for (int64_t i = 0; i < n; i++) same += pt.top1[i] == pb.top1[i];
        agree = (double)same / (double)n;
        agree_se = n > 1 ? sqrt(agree * (1 - agree) / (double)(n - 1)) : 0;
    }
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "set", json_string(dir));
        json_object_set_new(o, "file", json_string(file));
        json_object_set_new(o, "dtype", json_string(pt.dtype));
        json_object_set_new(o, "int_dot", json_boolean(pt.int_dot));
        json_object_set_new(o, "tp", json_integer(pt.tp));
        json_object_set_new(o, "tokens", json_integer(n_ids));
        json_object_set_new(o, "scored", json_integer(n));
        json_object_set_new(o, "ctx", json_integer(ctx));
        json_object_set_new(o, "stride", json_integer(stride));
        json_object_set_new(o, "windows", json_integer(n_w));
        json_object_set_new(o, "nll_mean", json_real(m));
        json_object_set_new(o, "nll_stderr", json_real(se));
        json_object_set_new(o, "ppl", json_real(ppl));
        json_object_set_new(o, "ppl_stderr", json_real(ppl_se));
        if (base_dir) {
            json_t *b = json_object();
            json_object_set_new(b, "set", json_string(base_dir));
            json_object_set_new(b, "dtype", json_string(pb.dtype));
            json_object_set_new(b, "int_dot", json_boolean(pb.int_dot));
            json_object_set_new(b, "ppl", json_real(exp(bm)));
            json_object_set_new(b, "ppl_stderr", json_real(exp(bm) * bse));
            json_object_set_new(b, "ln_ppl_ratio", json_real(dm));
            json_object_set_new(b, "ln_ppl_ratio_stderr", json_real(dse));
            json_object_set_new(b, "kl_mean", json_real(klm));
            json_object_set_new(b, "kl_stderr", json_real(klse));
            json_object_set_new(b, "kl_median", json_real(klmed));
            json_object_set_new(b, "kl_p99", json_real(kl99));
            json_object_set_new(b, "kl_max", json_real(klmax));
            json_object_set_new(b, "top1_agreement", json_real(agree));
            json_object_set_new(b, "top1_agreement_stderr", json_real(agree_se));
            json_object_set_new(o, "base", b);
        }
        json_object_set_new(o, "seconds", json_real(secs));
        if (per_token) {
            json_t *ti = json_array(), *tn = json_array(), *tk = json_array();
            for (int64_t k = 0, j = 0; k < n_w; k++)
                for (int64_t t = w[k].lo; t < w[k].e; t++, j++) {
                    json_array_append_new(ti, json_integer(ids[t]));
                    json_array_append_new(tn, json_real(pt.nll[j]));
                    if (base_dir) json_array_append_new(tk, json_real(pt.kl[j]));
                }
            json_object_set_new(o, "target_ids", ti);
            json_object_set_new(o, "nll", tn);
            if (base_dir) json_object_set_new(o, "kl", tk);
            else json_decref(tk);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("%s: %lld tokens of %s, %lld scored in %lld windows of %lld (stride %lld), TP %d %s, %.1f s\n", dir,
               (long long)n_ids, file, (long long)n, (long long)n_w, (long long)ctx, (long long)stride, pt.tp, pt.dtype, secs);
        printf("perplexity        %.4f ± %.4f   (mean NLL %.5f ± %.5f nats/token)\n", ppl, ppl_se, m, se);
        if (base_dir) {
            printf("base perplexity   %.4f ± %.4f   (%s, %s)\n", exp(bm), exp(bm) * bse, base_dir, pb.dtype);
            /* %g: KL spans 1e-7 (int8) to 1 (a broken set); fixed decimals would print 0.000000 */
            printf("ln(PPL/PPL_base)  %.4g ± %.2g\n", dm, dse);
            printf("KL(base || set)   mean %.4g ± %.2g   median %.4g   99%% %.4g   max %.4g nats\n", klm, klse, klmed, kl99, klmax);
            printf("top-1 agreement   %.3f%% ± %.3f%%\n", 100 * agree, 100 * agree_se);
        }
    }
    free(w); free(ids);
    free(pb.nll); free(pb.top1); free(pt.nll); free(pt.top1); free(pt.kl);
    pln_comm_free(comm);
    return 0;
}
