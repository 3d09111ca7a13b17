/* cmd_bench.c — `pollen bench SHARDS`: prefill tokens/s for one long prompt, and decode ms/token at
 * several batch sizes, each beside the memory-bandwidth ceiling measured in the same run (a
 * STREAM-style copy) as model bandwidth utilisation:
 *   MBU = (weight bytes + KV bytes read per step) / step time / copy bandwidth,
 * at TP 1 the median over the steps of that ratio, each step beside a copy measured just before it.
 * Run under mpirun for TP > 1 (the copy bandwidth is then rank 0's share of the node, measured
 * once at the start). */
#include "formats/common.h"
#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "tools/opt.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* STREAM "copy" (c[i] = a[i]) over arrays far larger than the caches; counts bytes read plus
 * bytes written, as STREAM does. Best of several passes, in GB/s. */
static int64_t *parse_list(const char *s, int *n) {
    int64_t *v = pln_xmalloc(64 * sizeof(int64_t));
    *n = 0;
    while (*s && *n < 64) {
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s || x < 1) pln_die("--batch: \"%s\" is not a list like 1,8,32", s);
        v[(*n)++] = x;
        s = *end == ',' ? end + 1 : end;
    }
    return v;
}

/* The median of v[0..n) (n >= 1); sorts v. */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Keys that the queries at positions p0 .. p0 + n - 1 read in causal attention (each its own
 * position and every one before it, at most window of them when window > 0). */
static double keys_read(int64_t p0, int64_t n, int64_t window) {
    double k = 0;
    for (int64_t p = p0; p < p0 + n; p++) k += (double)(window > 0 && p + 1 > window ? window : p + 1);
    return k;
}

/* FLOPs of a step over all ranks (2 per multiply-add): tokens through the layers, rows of
 * logits, keys read in attention (pln_engine_info's counts are one rank's share). The arithmetic
 * done: at a TP above the KV-head count every rank computes the projections of the KV heads it
 * holds, replicated ones included. */
static double step_flops(const pln_engine_info *in, double tokens, double rows, double keys) {
    return 2.0 * in->tp * (tokens * (double)in->layer_macs_per_token + rows * (double)in->lm_macs_per_row +
                           keys * (double)in->attn_macs_per_key);
}

static uint64_t g_lcg = 88172645463325252ull;
static int32_t rand_token(int64_t vocab) {
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)(4 + (g_lcg >> 33) % (uint64_t)(vocab - 4));
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *batches = "1,8,32";
    int64_t prompt_len = 512, context = 32, steps = 16, stream_mib = 512;
    int threads = 0;
    bool json = false, no_mmap = false, no_launch = false, copy_only = false;
    const char *mbu_mode = "steps";
    pln_engine_opts eo;
    pln_engine_opts_default(&eo);
    eo.populate = true;
    eo.no_block_sharing = true;   /* repeated prompts must be computed, not found in the prefix cache */
    pln_opt opts[] = {
        PLN_O_POS("SET", dir, "the shard set (required, except with --copy-only)"),
        PLN_O_STR("model", 'm', dir, "SET", "the shard set (instead of the positional SET)"),
        PLN_O_INT("prompt-len", 'p', prompt_len, 1, 1 << 20, "N", "prefill: one prompt of N random tokens (default {})"),
        PLN_O_STR("batch", 'b', batches, "B,B,...", "decode batch sizes, each measured in turn (default {})"),
        PLN_O_INT("context", 'c', context, 1, 1 << 20, "N", "tokens of context of every decode sequence (default {})"),
        PLN_O_INT("steps", 'n', steps, 1, 1 << 20, "N", "decode steps timed per batch size (default {})"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "threads per rank (default: cores / ranks on the node)"),
        PLN_O_INT("stream-mib", 0, stream_mib, 8, 1 << 16, "N", "MiB of the STREAM copy that measures the memory ceiling (default {})"),
        PLN_O_ENUM("mbu", 0, mbu_mode, "steps|start|off", "when that copy runs (default {}; see below)"),
        PLN_O_FLAG("json", 0, json, "print the results as one JSON object"),
        PLN_O_FLAG("copy-only", 0, copy_only, "measure the machine alone (no SET), with --threads: the STREAM copy (GB/s), the FMA peak (GFLOP/s) and the first two CPUs' core-to-core latency (ns)"),
        PLN_O_STR("backend", 0, eo.backend, "cpu|cuda", "(default cpu)"),
        PLN_O_INT("device", 0, eo.device, 0, PLN_CLI_MAX_DEVICE, "D", "CUDA device of every rank (default: picked from the node-local rank)"),
        PLN_O_INT("gpus-per-node", 0, eo.gpus_per_node, 1, PLN_CLI_MAX_DEVICE + 1, "N",
                  "CUDA device = node-local rank % N (default: the node-local rank)"),
        PLN_O_STR("kv-dtype", 0, eo.kv_dtype, "f32|f16", "KV-cache dtype (default: the backend's own)"),
        PLN_CLI_INT_DOT_OPTS(eo),
        PLN_O_FLAG("no-mmap", 0, no_mmap, "read the rank file into memory instead of mapping it"),
        PLN_O_FLAG("no-launch", 0, no_launch, "run as one process even when SET is TP > 1 (by default pollen starts the set's N ranks itself under mpirun; under mpirun/srun it never does)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {
        .cmd = "bench", .synopsis = "pollen bench SET [options]\n       pollen bench --copy-only [--threads N] [--stream-mib N] [--json]", .opts = opts, .rank = pln_opt_env_rank(),
        .epilog = "\nprefill: one prompt of --prompt-len random tokens; decode: each batch size B runs B sequences of\n"
                  "--context tokens for --steps steps. MBU (CPU backend) uses a STREAM copy measured here. --mbu steps\n"
                  "(default): at TP 1 the median over the steps of each step's bandwidth over a copy measured just\n"
                  "before it (arrays of --stream-mib/4, at least 64 MiB; under mpirun the copy at start-up).\n"
                  "--mbu start: the copy at start-up only, the steps back to back (the copies between steps evict\n"
                  "the caches: a model that fits in the last-level cache then reads from memory). --mbu off: no\n"
                  "copy, no MBU. A GPU's ceiling is measured by tools/bench/gpu.sh instead. The host CPU (vendor,\n"
                  "family/model/stepping, the SIMD tier the CPU kernels dispatch to) is printed on stderr, and with\n"
                  "--json as cpu_* fields.\n",
    };
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_cpu_host host;
    pln_cpu_host_describe(&host);
    if (copy_only) {
        const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
        if (dir || (ws && strcmp(ws, "1"))) {
            int rc = pln_opt_usage_error(&cmd, "--copy-only takes no SET and runs on one rank (got %s)", dir ? dir : "mpirun");
            pln_opt_free(&cmd);
            return rc;
        }
        pln_opt_free(&cmd);
        if (pln_cpu_env_check()) pln_die("%s", pln_error());
        threads = pln_cli_threads(threads, 1);
        double gbs = pln_cpu_copy_gbs((size_t)stream_mib << 20), gfl = pln_cpu_fma_gflops(), c2c = pln_cpu_c2c_ns();
        if (json) {
            json_t *o = json_pack("{s:f, s:f, s:o, s:i, s:I, s:s, s:s, s:i, s:i, s:i, s:s}", "stream_copy_gbs", gbs, "fma_peak_gflops", gfl,
                                  "core_to_core_ns", c2c > 0 ? json_real(c2c) : json_null(), "threads", threads,
                                  "stream_mib", (json_int_t)stream_mib, "cpu_name", host.name, "cpu_vendor", host.vendor,
                                  "cpu_family", host.family, "cpu_model", host.model, "cpu_stepping", host.stepping, "cpu_isa", host.isa);
            char *js = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
            puts(js);
            free(js);
            json_decref(o);
        } else {
            fprintf(stderr, "cpu: %s (%s, family %d model %d stepping %d); CPU kernels: %s\n", host.name, host.vendor,
                    host.family, host.model, host.stepping, host.isa);
            printf("STREAM copy: %.1f GB/s (%d threads, %lld MiB arrays, read + write bytes)\n", gbs, threads, (long long)stream_mib);
            printf("FMA peak: %.1f GFLOP/s (%d threads, fp32 multiply-adds, %s kernels)\n", gfl, threads, host.isa);
            if (c2c > 0) printf("core to core: %.1f ns (a cache line from the first allowed CPU to the second, one way)\n", c2c);
            else printf("core to core: n/a (fewer than two CPUs allowed, or the two threads could not run pinned)\n");
        }
        return 0;
    }
    if (!dir) { int rc = pln_opt_usage_error(&cmd, "missing SET"); pln_opt_free(&cmd); return rc; }
    pln_opt_free(&cmd);
    pln_map_set_no_mmap(no_mmap);
    int launched = pln_launch_self("bench", dir, argc, argv, no_launch, json);
    if (launched >= 0) return launched;
    pln_comm *comm = pln_comm_init(&argc, &argv);
    int rank = pln_comm_rank(comm);
    pln_map_fault_hint("--no-mmap reads the rank file into memory instead of mapping it");
    if (rank == 0 && !json)
        fprintf(stderr, "cpu: %s (%s, family %d model %d stepping %d); CPU kernels: %s\n", host.name, host.vendor,
                host.family, host.model, host.stepping, host.isa);
    int nb = 0;
    int64_t *bs = parse_list(batches, &nb), maxb = 1;
    for (int i = 0; i < nb; i++) if (bs[i] > maxb) maxb = bs[i];
    eo.kv_dtype = pln_cli_kv_dtype(eo.backend, eo.kv_dtype);
    eo.int_dot = pln_cli_int_dot(eo.backend, eo.int_dot);
    pln_cli_batch_invariant(eo.backend, eo.batch_invariant);
    eo.cpu_tune = pln_cli_cpu_tune(eo.cpu_tune);
    threads = pln_cli_threads(threads, pln_comm_local_size(comm));
    /* Host memory bandwidth is the ceiling only for the CPU backend's weights. */
    const bool on_cpu = !eo.backend || !strcmp(eo.backend, "cpu");
    const bool copy = on_cpu && strcmp(mbu_mode, "off");
    double bw = rank == 0 && copy ? pln_cpu_copy_gbs((size_t)stream_mib << 20) : 0;
    /* the compute-bound figures' ceiling, where one process has the cores (under mpirun the
     * ranks share them, so a peak measured by one would not be its share) */
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    double peak = rank == 0 && on_cpu && (!ws || !strcmp(ws, "1")) ? pln_cpu_fma_gflops() : 0;
    /* the copy beside each decode step: arrays of a quarter of that, at least 64 MiB (twice a
     * large last-level cache) unless --stream-mib is smaller */
    int64_t pair_mib = stream_mib / 4 > 64 ? stream_mib / 4 : stream_mib < 64 ? stream_mib : 64;

    eo.shard_dir = dir;
    eo.quiet = true;
    eo.max_seqs = (int32_t)maxb;
    eo.max_seq_len = (int32_t)((prompt_len > context + steps ? prompt_len : context + steps) + 1);
    eo.kv_tokens = (prompt_len > maxb * (context + steps + eo.block_size) ? prompt_len : maxb * (context + steps + eo.block_size)) + eo.block_size;
    double t0 = pln_now();
    pln_engine *e = pln_engine_open(&eo, comm);
    if (!e) { fprintf(stderr, "pollen: rank %d: %s\n", rank, pln_error()); pln_comm_free(comm); return 1; }
    double t_load = pln_now() - t0;
    if (rank != 0) {
        int rc = pln_engine_worker_loop(e);
        pln_engine_close(e);
        pln_comm_free(comm);
        free(bs);
        return rc ? 1 : 0;
    }
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    char hb[32], cp[96];
    if (!on_cpu) snprintf(cp, sizeof cp, "not measured: the backend is not the CPU, so no MBU is reported");
    else if (!copy) snprintf(cp, sizeof cp, "not measured (--mbu off)");
    else snprintf(cp, sizeof cp, "%.1f GB/s (%lld MiB arrays)", bw, (long long)stream_mib);
    if (!json)
        printf("pollen bench %s: TP %d %s%s, KV %s, %lld layers, hidden %lld, vocab %lld; %s of weights per rank; %d threads/rank\n"
               "load %.2f s (populate); STREAM copy %s\n",
               dir, info.tp, info.dtype, info.int_dot ? " (int-dot)" : "", info.kv_dtype, (long long)info.n_layer, (long long)info.hidden, (long long)info.n_vocab,
               pln_human_bytes((double)info.weight_bytes, hb, sizeof hb), threads, t_load, cp);
    if (!json && info.cpu_tune) {
        printf("cpu tune: %s (--cpu-tune)%s%s, prefetch ahead (bytes):", info.cpu_tune,
               info.cpu_tune_model ? ", on this model's steps: " : "", info.cpu_tune_model ? info.cpu_tune_model : "");
        for (int i = 0; i < info.cpu_pf_kinds; i++)
            printf("%s %s %lld%s", i ? "," : "", info.cpu_pf_kind[i], (long long)(info.cpu_pf_ahead[i] & ~(int64_t)PLN_TUNE_PF_L2),
                   info.cpu_pf_ahead[i] & PLN_TUNE_PF_L2 ? " into L2" : "");
        printf("\n");
    }

    pln_sample_params sp;
    pln_sample_params_default(&sp);
    int64_t maxtok = prompt_len > context ? prompt_len : context;
    int32_t *toks = pln_xmalloc((size_t)(maxb * maxtok + maxb) * 4);
    for (int64_t i = 0; i < maxb * maxtok + maxb; i++) toks[i] = rand_token(info.n_vocab);
    pln_step_seq *seqs = pln_xcalloc((size_t)maxb, sizeof *seqs);
    pln_step_out *outs = pln_xcalloc((size_t)maxb, sizeof *outs);
    int32_t *rel = pln_xmalloc((size_t)maxb * 4), *last = pln_xmalloc((size_t)maxb * 4);
    for (int64_t i = 0; i < maxb; i++) rel[i] = (int32_t)i;

    /* Prefill: the best of two runs of one prompt_len-token prompt. */
    double best_pf = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        seqs[0] = (pln_step_seq){.slot = 0, .n_new = (int32_t)prompt_len, .tokens = toks, .sample = true, .params = sp};
        pln_step_plan p = {.n_seqs = 1, .seqs = seqs, .n_release = 1, .release = rel};
        double ts = pln_now();
        if (pln_engine_step(e, &p, outs)) pln_die("prefill: %s", pln_error());
        double dt = pln_now() - ts;
        if (dt < best_pf) best_pf = dt;
    }
    pln_step_plan pr = {.n_release = 1, .release = rel};
    pln_engine_step(e, &pr, NULL);
    json_t *root = json_object(), *dec = json_array();
    json_object_set_new(root, "decode", dec);
    double pf_gflops = step_flops(&info, (double)prompt_len, 1, keys_read(0, prompt_len, info.attn_window)) / best_pf / 1e9;
    /* the rate beside its ceiling: the FMA peak where the weights are multiplied in fp32; on the
     * integer-dot path the same count of operations is integer arithmetic, whose ceiling the
     * FMA peak is not */
    char pk[96];
    if (info.int_dot) snprintf(pk, sizeof pk, "%.1f GOP/s (integer-dot path)", pf_gflops);
    else if (peak > 0) snprintf(pk, sizeof pk, "%.1f GFLOP/s (%.0f%% of the FMA peak, %.0f GFLOP/s)", pf_gflops, 100 * pf_gflops / peak, peak);
    else snprintf(pk, sizeof pk, "%.1f GFLOP/s", pf_gflops);
    if (!json) printf("prefill %lld tokens: %.3f s, %.1f tokens/s, %s\n", (long long)prompt_len, best_pf, prompt_len / best_pf, pk);

    /* the arrays of the copy beside each decode step (the comment in the loop), once for all
     * batch sizes */
    const bool adjacent = bw > 0 && info.tp == 1 && !strcmp(mbu_mode, "steps");
    size_t pn = adjacent ? (size_t)pair_mib << 17 : 0;   /* doubles per array */
    double *pa = NULL, *pc = NULL;
    if (adjacent) {
        pa = pln_xmalloc(pn * sizeof(double));
        pc = pln_xmalloc(pn * sizeof(double));
        for (size_t i = 0; i < pn; i++) { pa[i] = (double)i; pc[i] = 0; }
    }
    for (int bi = 0; bi < nb; bi++) {
        int64_t B = bs[bi];
        for (int64_t b = 0; b < B; b++)
            seqs[b] = (pln_step_seq){.slot = (int32_t)b, .n_new = (int32_t)context, .tokens = toks + b * context, .sample = true, .params = sp};
        pln_step_plan p = {.n_seqs = (int32_t)B, .seqs = seqs};
        if (pln_engine_step(e, &p, outs)) pln_die("batch %lld context: %s", (long long)B, pln_error());
        for (int64_t b = 0; b < B; b++) last[b] = outs[b].token;
        /* The ceiling beside each step: at TP 1 every step is timed right after one measurement
         * of the copy (best of 2 passes on pa/pc), and MBU is the median over the
         * steps of each step's bandwidth over its own copy's. This VM's memory bandwidth moves by
         * 1.5-2x within seconds, so a copy measured before and after a batch's steps can belong to
         * another regime than the steps themselves. Under mpirun the other ranks would be polling
         * meanwhile, so the start-up figure stays. */
        double *ratio = pln_xmalloc((size_t)steps * sizeof(double)), *cbw = pln_xmalloc((size_t)steps * sizeof(double));
        double tot = 0, best = 1e30;
        for (int64_t s = 0; s < steps; s++) {
            for (int64_t b = 0; b < B; b++)
                seqs[b] = (pln_step_seq){.slot = (int32_t)b, .n_new = 1, .tokens = &last[b], .sample = true, .params = sp};
            cbw[s] = adjacent ? pln_cpu_copy_pass_gbs(pc, pa, pn, 2) : bw;
            double ts = pln_now();
            if (pln_engine_step(e, &p, outs)) pln_die("decode: %s", pln_error());
            double dt = pln_now() - ts;
            tot += dt;
            if (dt < best) best = dt;
            for (int64_t b = 0; b < B; b++) last[b] = outs[b].token;
            /* this step read every weight once and each sequence's context + s + 1 tokens of KV */
            double rd = (double)info.weight_bytes + (double)B * (double)(context + s + 1) * (double)info.kv_bytes_per_token;
            ratio[s] = cbw[s] > 0 ? rd / dt / (cbw[s] * 1e9) : 0;
        }
        double step = tot / (double)steps;
        /* Bytes one decode step reads: every weight once, plus each sequence's keys and values
         * (context + the steps so far, on average context + steps/2). */
        double kv = (double)B * ((double)context + (double)steps / 2.0) * (double)info.kv_bytes_per_token;
        double bytes = (double)info.weight_bytes + kv;
        double bw_b = median(cbw, steps), mbu = median(ratio, steps);
        double keys = 0;
        for (int64_t st = 0; st < steps; st++) keys += (double)B * keys_read(context + st, 1, info.attn_window);
        double gflops = step_flops(&info, (double)B * steps, (double)B * steps, keys) / tot / 1e9;
        double mbu_lo = ratio[0], mbu_hi = ratio[steps - 1];   /* sorted by median() */
        free(ratio);
        free(cbw);
        if (!json) {
            char m[48] = "MBU    n/a";
            if (bw_b > 0) snprintf(m, sizeof m, "MBU %5.1f%% of %.1f GB/s", 100 * mbu, bw_b);
            char f[48];
            if (info.int_dot) snprintf(f, sizeof f, "%.1f GOP/s", gflops);
            else if (peak > 0) snprintf(f, sizeof f, "%.1f GFLOP/s = %.0f%% of FMA", gflops, 100 * gflops / peak);
            else snprintf(f, sizeof f, "%.1f GFLOP/s", gflops);
            printf("decode batch %3lld: %8.2f ms/step, %7.2f ms/token, %8.1f tokens/s, %s, %s (%.2f GB/step incl. %.1f MB KV)\n",
                   (long long)B, step * 1e3, step * 1e3 / (double)B, (double)B / step, m, f, bytes / 1e9, kv / 1e6);
        }
        json_array_append_new(dec, json_pack("{s:I, s:f, s:f, s:f, s:o, s:o, s:o, s:o, s:f, s:f}", "batch", (json_int_t)B, "ms_per_step", step * 1e3,
                                             "ms_per_token", step * 1e3 / (double)B, "tokens_per_s", (double)B / step,
                                             "mbu", bw_b > 0 ? json_real(mbu) : json_null(),
                                             "mbu_min", bw_b > 0 ? json_real(mbu_lo) : json_null(),
                                             "mbu_max", bw_b > 0 ? json_real(mbu_hi) : json_null(),
                                             "copy_gbs", bw_b > 0 ? json_real(bw_b) : json_null(), "best_ms_per_step", best * 1e3,
                                             "gops", gflops));
        pln_step_plan rp = {.n_release = (int32_t)B, .release = rel};
        pln_engine_step(e, &rp, NULL);
    }
    if (json) {
        json_object_set_new(root, "shards", json_string(dir));
        json_object_set_new(root, "tp", json_integer(info.tp));
        json_object_set_new(root, "dtype", json_string(info.dtype));
        json_object_set_new(root, "kv_dtype", json_string(info.kv_dtype));
        json_object_set_new(root, "int_dot", json_boolean(info.int_dot));
        json_object_set_new(root, "batch_invariant", json_boolean(info.batch_invariant));
        json_object_set_new(root, "threads_per_rank", json_integer(threads));
        json_object_set_new(root, "weight_bytes_per_rank", json_integer((json_int_t)info.weight_bytes));
        json_object_set_new(root, "stream_copy_gbs", bw > 0 ? json_real(bw) : json_null());
        /* where the ceiling came from: beside each step, at start-up only (also --mbu steps under
         * mpirun), or nowhere */
        json_object_set_new(root, "mbu_mode", json_string(bw <= 0 ? "off" : info.tp == 1 && !strcmp(mbu_mode, "steps") ? "steps" : "start"));
        json_object_set_new(root, "load_s", json_real(t_load));
        json_object_set_new(root, "prefill_tokens", json_integer(prompt_len));
        json_object_set_new(root, "prefill_tokens_per_s", json_real(prompt_len / best_pf));
        /* 2 per multiply-add (fp32, or integer on the integer-dot path: int_dot) */
        json_object_set_new(root, "prefill_gops", json_real(pf_gflops));
        json_object_set_new(root, "fma_peak_gflops", peak > 0 ? json_real(peak) : json_null());
        /* this rank's multiply-adds per token in the layers, per logits row, per attention key */
        json_object_set_new(root, "layer_macs_per_token", json_integer(info.layer_macs_per_token));
        json_object_set_new(root, "lm_macs_per_row", json_integer(info.lm_macs_per_row));
        json_object_set_new(root, "attn_macs_per_key", json_integer(info.attn_macs_per_key));
        json_object_set_new(root, "context", json_integer(context));
        json_object_set_new(root, "cpu_name", json_string(host.name));
        json_object_set_new(root, "cpu_vendor", json_string(host.vendor));
        json_object_set_new(root, "cpu_family", json_integer(host.family));
        json_object_set_new(root, "cpu_model", json_integer(host.model));
        json_object_set_new(root, "cpu_stepping", json_integer(host.stepping));
        json_object_set_new(root, "cpu_isa", json_string(host.isa));
        json_object_set_new(root, "cpu_tune", info.cpu_tune ? json_string(info.cpu_tune) : json_null());
        json_object_set_new(root, "cpu_tune_model", info.cpu_tune_model ? json_string(info.cpu_tune_model) : json_null());
        /* each kind's distance in bytes, and whether it prefetches into L2 (kernels/backend.h PLN_TUNE_PF_L2) */
        json_t *pf = info.cpu_tune ? json_object() : json_null(), *l2 = info.cpu_tune ? json_object() : json_null();
        for (int i = 0; i < info.cpu_pf_kinds; i++) {
            json_object_set_new(pf, info.cpu_pf_kind[i], json_integer(info.cpu_pf_ahead[i] & ~(int64_t)PLN_TUNE_PF_L2));
            json_object_set_new(l2, info.cpu_pf_kind[i], json_boolean(info.cpu_pf_ahead[i] & PLN_TUNE_PF_L2));
        }
        json_object_set_new(root, "cpu_pf_ahead", pf);
        json_object_set_new(root, "cpu_pf_l2", l2);
        char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(6));
        puts(s);
        free(s);
    }
    json_decref(root);
    pln_engine_shutdown(e);
    pln_engine_close(e);
    pln_comm_free(comm);
    free(bs); free(toks); free(seqs); free(outs); free(rel); free(last); free(pa); free(pc);
    return 0;
}
