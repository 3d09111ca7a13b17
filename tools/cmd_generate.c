/* cmd_generate.c — `pollen generate SHARDS --prompt TEXT ...`: loads a shard set (one process per
 * rank under mpirun for TP>1), runs every prompt as one batch and streams the text as it comes.
 * --json prints ids, text, per-token log-probs and timings; --dump-logits (hidden, for tests)
 * writes the raw logits of every fed token to a safetensors file. */
#include "formats/common.h"
#include "formats/safetensors.h"
#include "formats/shard.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "tools/opt.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *text;            /* NULL for --token-ids prompts */
    int32_t *ids;
    size_t n_ids;
    int32_t *out;                /* generated ids */
    float *lp;
    int32_t n_out;
    char *gen;                   /* generated text (decoded incrementally) */
    size_t gen_len, gen_cap, printed;
    pln_tok_stream ts;
    bool done;
    const char *finish;
} gen_seq;

static int32_t *parse_ids(const char *s, size_t *n) {
    size_t cap = 16;
    int32_t *ids = pln_xmalloc(cap * 4);
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) pln_die("--token-ids: \"%s\" is not a list of ids like 1,2,3", s);
        if (*n == cap) ids = pln_xrealloc(ids, (cap *= 2) * 4);
        ids[(*n)++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
    }
    if (*n == 0) pln_die("--token-ids: empty list");
    return ids;
}

static void gen_append(gen_seq *g, const char *b, size_t n) {
    if (g->gen_len + n + 1 > g->gen_cap) {
        g->gen_cap = (g->gen_len + n + 1) * 2;
        g->gen = pln_xrealloc(g->gen, g->gen_cap);
    }
    memcpy(g->gen + g->gen_len, b, n);
    g->gen_len += n;
    g->gen[g->gen_len] = 0;
}

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *dump = NULL;
    pln_opt_list prompt_l = {0}, idlist_l = {0}, stop_l = {0};
    int threads = 0;
    int64_t max_new = 32;
    bool json = false, quiet = false, do_sample = false, show_placement = false, no_mmap = false, no_launch = false;
    pln_sample_params sp;
    pln_sample_params_default(&sp);
    pln_engine_opts eo;
    pln_engine_opts_default(&eo);
    pln_opt opts[] = {
        PLN_O_POS("SET", dir, "the shard set", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("model", 'm', dir, "SET", "the shard set, as llama.cpp's -m (instead of the positional SET)"),
        PLN_O_LIST("prompt", 'p', prompt_l, "TEXT",
                   "a prompt (repeatable: every prompt runs in one batch); tokenized with the tokenizer's "
                   "post-processor, as tokenizer(text) does: Llama's BOS first"),
        PLN_O_LIST("token-ids", 0, idlist_l, "1,2,3", "a prompt given as token ids (repeatable; skips the tokenizer, nothing added)"),
        PLN_O_INT("max-new-tokens", 'n', max_new, 1, 1 << 24, "N", "tokens to generate per prompt (default {})"),
        PLN_O_FLOAT("temperature", 0, sp.temperature, 0, true, INFINITY, "T",
                    "sampling temperature; T > 0 samples (default: greedy, as T = 0)"),
        PLN_O_INT("top-k", 0, sp.top_k, 0, INT32_MAX, "K", "sampling filter: the K most likely tokens (default off)"),
        PLN_O_FLOAT("top-p", 0, sp.top_p, 0, false, 1, "P", "sampling filter: the smallest set of tokens with mass P (default off)"),
        PLN_O_FLOAT("repetition-penalty", 0, sp.repetition_penalty, 0, false, INFINITY, "R", "HF repetition penalty (default {})"),
        PLN_O_FLAG("do-sample", 0, do_sample, "sample (implied by --temperature/--top-k/--top-p/--seed)"),
        PLN_O_INT("seed", 's', sp.seed, 0, INT64_MAX, "S", "random seed (default {})"),
        PLN_O_LIST("stop", 0, stop_l, "STR", "stop when the text contains STR (repeatable)"),
        PLN_O_FLAG("json", 0, json, "print ids, text, log-probs and timings as JSON"),
        PLN_O_STR("backend", 0, eo.backend, "cpu|cuda", "(default cpu)"),
        PLN_O_STR("kv-dtype", 0, eo.kv_dtype, "f32|f16",
                  "KV-cache dtype (default: f32 on cpu, the exact reference; f16 on cuda, its only one; f16 on cpu "
                  "halves KV memory)"),
        PLN_CLI_INT_DOT_OPTS(eo),
        PLN_O_INT("device", 0, eo.device, 0, PLN_CLI_MAX_DEVICE, "D", "CUDA device of every rank (default: picked from the node-local rank)"),
        PLN_O_INT("gpus-per-node", 0, eo.gpus_per_node, 1, PLN_CLI_MAX_DEVICE + 1, "N",
                  "CUDA device = node-local rank % N (default: the node-local rank)"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "threads per rank (default: cores / ranks on the node)"),
        PLN_O_FN("step-timeout", 0, pln_cli_parse_step_timeout, eo.step_timeout, "S|auto|off",
                 "step watchdog (TP > 1): a step past S seconds fails, naming the rank that stopped answering, "
                 "and every rank exits 3 (default auto)"),
        PLN_O_FLAG("show-placement", 0, show_placement, "each rank prints its node, local rank and CUDA device to stderr"),
        PLN_O_FLAG("populate", 0, eo.populate, "fault the shard in at load"),
        PLN_O_FLAG("verify", 0, eo.verify, "check checksums at load"),
        PLN_O_FLAG("no-mmap", 0, no_mmap,
                   "read the rank file into memory instead of mapping it (for file systems where a mapping is "
                   "fragile; needs RAM for the whole file)"),
        PLN_O_FLAG("quiet", 'q', quiet, "no progress, no streaming, no timings: only the results (text or JSON)"),
        PLN_O_STR("dump-logits", 0, dump, "FILE", "test only: the logits of every fed token to a safetensors file",
                  .flags = PLN_OPT_HIDDEN),
        PLN_O_INT("fail-at-step", 0, eo.fail_at_step, 0, INT32_MAX, "N", "test only: step N's forward fails",
                  .flags = PLN_OPT_HIDDEN),
        PLN_O_FLAG("no-launch", 0, no_launch, "run as one process even when SET is TP > 1 (by default pollen starts the set's N ranks itself under mpirun; under mpirun/srun it never does)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "generate", .synopsis = "pollen generate SET --prompt TEXT [--prompt TEXT ...] [options]",
                       .opts = opts, .rank = pln_opt_env_rank()};
    /* Options first, before MPI starts: a usage error is reported once, and a command that starts
     * its own ranks can do so here. */
    pln_opt_parse_or_exit(&cmd, argc, argv);
    if (prompt_l.n + idlist_l.n == 0) { int rc = pln_opt_usage_error(&cmd, "missing required option --prompt (or --token-ids)"); pln_opt_free(&cmd); return rc; }
    if (pln_opt_given(&cmd, "temperature") && sp.temperature > 0) do_sample = true;
    if (pln_opt_given(&cmd, "top-k") || pln_opt_given(&cmd, "top-p") || pln_opt_given(&cmd, "seed")) do_sample = true;
    pln_map_set_no_mmap(no_mmap);
    int launched = pln_launch_self("generate", dir, argc, argv, no_launch, quiet || json);
    if (launched >= 0) { pln_opt_free(&cmd); return launched; }
    pln_comm *comm = pln_comm_init(&argc, &argv);
    int rank = pln_comm_rank(comm), size = pln_comm_size(comm);
    int n_prompts = prompt_l.n, n_idlists = idlist_l.n, n_stops = stop_l.n;
    const char **prompts = prompt_l.v, **idlists = idlist_l.v, **stops = stop_l.v;
    pln_map_fault_hint("--no-mmap reads the rank file into memory instead of mapping it");
    if (dump) {
        const char *protect[1] = {dir};
        if (pln_path_guard(dump, protect, 1)) pln_die("--dump-logits: %s", pln_error());
    }
    if (sp.temperature == 0) do_sample = false;
    if (sp.temperature == 0) sp.temperature = 1.0f;
    sp.do_sample = do_sample;
    if (pln_sample_params_check(&sp)) pln_die("%s", pln_error());
    if (max_new < 1) pln_die("--max-new-tokens must be >= 1");
    eo.kv_dtype = pln_cli_kv_dtype(eo.backend, eo.kv_dtype);
    eo.int_dot = pln_cli_int_dot(eo.backend, eo.int_dot);
    pln_cli_batch_invariant(eo.backend, eo.batch_invariant);
    eo.cpu_tune = pln_cli_cpu_tune(eo.cpu_tune);
    threads = pln_cli_threads(threads, pln_comm_local_size(comm));
    if (show_placement) pln_cli_print_placement(comm, eo.device, eo.gpus_per_node, eo.backend);

    /* Prompts: token ids on rank 0 (the tokenizer lives there). */
    int n_seq = n_prompts + n_idlists;
    gen_seq *g = pln_xcalloc((size_t)n_seq, sizeof *g);
    pln_tokenizer *tok = NULL;

    eo.shard_dir = dir;
    eo.quiet = quiet || json;
    eo.max_seqs = n_seq;
    double t0 = pln_now();
    /* Sizes come from the prompts, known only after tokenizing; a cheap first pass on the ids. */
    if (rank == 0) {
        /* The tokenizer is the file the manifest names (the set's small files are checked here). */
        pln_shardset *set = pln_shardset_open(dir);
        if (!set) pln_die("%s", pln_error());
        if (set->tokenizer_path) {
            tok = pln_tok_load(set->tokenizer_path);
            if (!tok && n_prompts > 0) pln_die("%s", pln_error());
        } else if (n_prompts > 0) {
            pln_die("%s: the manifest records no tokenizer (\"tokenizer\": null): give prompts with --token-ids, or re-run "
                    "reshard from a checkpoint that has tokenizer.json", dir);
        }
        pln_shardset_close(set);
        for (int i = 0; i < n_prompts; i++) {
            g[i].text = prompts[i];
            /* with the post-processor, as transformers' tokenizer(text) and the server's routes
             * (Llama's BOS; BLOOM's adds nothing); --token-ids stay exactly as given */
            if (pln_tok_encode_special(tok, prompts[i], strlen(prompts[i]), true, &g[i].ids, &g[i].n_ids))
                pln_die("prompt %d: %s", i + 1, pln_error());
            if (g[i].n_ids == 0) pln_die("prompt %d encodes to no tokens", i + 1);
        }
        for (int i = 0; i < n_idlists; i++) g[n_prompts + i].ids = parse_ids(idlists[i], &g[n_prompts + i].n_ids);
    }
    int64_t longest = 0, total = 0;
    for (int i = 0; i < n_seq; i++) { if ((int64_t)g[i].n_ids > longest) longest = (int64_t)g[i].n_ids; total += (int64_t)g[i].n_ids; }
    int64_t lim[2] = {longest, total};
    if (pln_comm_bcast(comm, lim, sizeof lim, 0)) pln_die("%s", pln_error());
    eo.max_seq_len = (int32_t)(lim[0] + max_new);
    /* Each sequence rounds up to whole blocks. */
    eo.kv_tokens = lim[1] + (int64_t)n_seq * (max_new + eo.block_size);

    pln_engine *e = pln_engine_open(&eo, comm);
    if (!e) {
        if (rank == 0 || strncmp(pln_error(), "rank ", 5) != 0) {
            if (size > 1) fprintf(stderr, "pollen: rank %d: %s\n", rank, pln_error());
            else fprintf(stderr, "pollen: %s\n", pln_error());
        }
        pln_comm_free(comm);
        for (int i = 0; i < n_seq; i++) free(g[i].ids);
        free(g); pln_opt_free(&cmd);
        if (tok) pln_tok_free(tok);
        return 1;
    }
    double t_load = pln_now() - t0;
    if (rank != 0) {
        int rc = pln_engine_worker_loop(e);
        if (rc) fprintf(stderr, "pollen: rank %d: %s\n", rank, pln_error());
        pln_engine_close(e);
        pln_comm_free(comm);
        for (int i = 0; i < n_seq; i++) free(g[i].ids);
        free(g); pln_opt_free(&cmd);
        if (tok) pln_tok_free(tok);
        return rc ? 1 : 0;
    }
    pln_engine_info info;
    pln_engine_get_info(e, &info);
    /* generation ends on any of the model's end ids (config.json's eos_token_id: one or a list) */
    for (int i = 0; i < n_seq; i++) {
        g[i].out = pln_xmalloc((size_t)max_new * 4);
        g[i].lp = pln_xmalloc((size_t)max_new * 4);
    }
    bool stream = !json && !quiet && n_seq == 1 && tok;
    size_t hold = 0;   /* bytes kept back while streaming, in case they start a stop string */
    for (int i = 0; i < n_stops; i++) if (strlen(stops[i]) > hold) hold = strlen(stops[i]);
    if (hold) hold--;
    if (stream && g[0].text) { fputs(g[0].text, stdout); fflush(stdout); }

    /* Dumped logits: every fed token's row, in step order. */
    float *dl = NULL;
    int32_t *dl_ids = NULL;
    int64_t dl_rows = 0, dl_cap = 0;

    pln_step_seq *seqs = pln_xcalloc((size_t)n_seq, sizeof *seqs);
    pln_step_out *outs = pln_xcalloc((size_t)n_seq, sizeof *outs);
    int *map = pln_xcalloc((size_t)n_seq, sizeof(int));
    int32_t *last = pln_xcalloc((size_t)n_seq, sizeof(int32_t));
    double *step_ms = pln_xmalloc((size_t)max_new * sizeof(double));
    int n_steps = 0;
    double t_prefill = 0;
    int rc = 0;
    for (int64_t step = 0; step < max_new; step++) {
        int ns = 0;
        for (int i = 0; i < n_seq; i++) {
            if (g[i].done) continue;
            pln_step_seq *q = &seqs[ns];
            q->slot = i;
            q->sample = true;
            q->params = sp;
            if (step == 0) { q->n_new = (int32_t)g[i].n_ids; q->tokens = g[i].ids; }
            else { q->n_new = 1; q->tokens = &last[i]; }
            map[ns++] = i;
        }
        if (ns == 0) break;
        pln_step_plan plan = {.n_seqs = ns, .seqs = seqs, .want_logits = dump != NULL};
        double ts = pln_now();
        if (pln_engine_step(e, &plan, outs)) { fprintf(stderr, "pollen: step %lld: %s\n", (long long)step + 1, pln_error()); rc = 1; break; }
        int bad_row = -1;
        for (int j = 0; j < ns && bad_row < 0; j++) if (outs[j].nonfinite) bad_row = j;
        if (bad_row >= 0) {
            fprintf(stderr, "pollen: step %lld, sequence %d: %s\n", (long long)step + 1, map[bad_row] + 1, PLN_NONFINITE_MSG);
            rc = 1;
            break;
        }
        double dt = pln_now() - ts;
        if (step == 0) t_prefill = dt;
        else step_ms[n_steps++] = dt * 1e3;
        if (dump) {
            pln_engine_info in2;
            pln_engine_get_info(e, &in2);
            for (int j = 0; j < ns; j++) {
                int64_t n = seqs[j].n_new;
                if (dl_rows + n > dl_cap) {
                    dl_cap = (dl_rows + n) * 2;
                    dl = pln_xrealloc(dl, (size_t)dl_cap * (size_t)in2.n_vocab * 4);
                    dl_ids = pln_xrealloc(dl_ids, (size_t)dl_cap * 4);
                }
                memcpy(dl + dl_rows * in2.n_vocab, outs[j].logits, (size_t)n * (size_t)in2.n_vocab * 4);
                memcpy(dl_ids + dl_rows, seqs[j].tokens, (size_t)n * 4);
                dl_rows += n;
            }
        }
        for (int j = 0; j < ns; j++) {
            gen_seq *s = &g[map[j]];
            int32_t t = outs[j].token;
            s->out[s->n_out] = t;
            s->lp[s->n_out] = outs[j].logprob;
            s->n_out++;
            last[map[j]] = t;
            if (tok) {
                char buf[256];
                size_t n = pln_tok_stream_push(tok, &s->ts, t, true, buf, sizeof buf);
                gen_append(s, buf, n);
            }
            for (int32_t k = 0; k < info.n_eos && !s->done; k++)
                if (t == info.eos_ids[k]) { s->done = true; s->finish = "eos"; }
            for (int k = 0; k < n_stops && s->gen; k++) {
                char *hit = strstr(s->gen, stops[k]);
                if (hit) { s->gen_len = (size_t)(hit - s->gen); s->gen[s->gen_len] = 0; s->done = true; s->finish = "stop"; break; }
            }
            if (!s->done && s->n_out >= max_new) { s->done = true; s->finish = "length"; }
            if (s->done && tok) {
                char buf[16];
                size_t n = pln_tok_stream_flush(tok, &s->ts, buf, sizeof buf);
                if (strcmp(s->finish, "stop")) gen_append(s, buf, n);
            }
            if (stream) {
                size_t upto = s->done ? s->gen_len : (s->gen_len > hold ? s->gen_len - hold : 0);
                if (upto > s->printed) { fwrite(s->gen + s->printed, 1, upto - s->printed, stdout); fflush(stdout); s->printed = upto; }
            }
        }
        /* Finished sequences leave the batch at once, freeing their KV blocks. */
        int32_t rel[1024];
        int nr = 0;
        for (int j = 0; j < ns && nr < 1024; j++) if (g[map[j]].done) rel[nr++] = map[j];
        if (nr) {
            pln_step_plan rp = {.n_release = nr, .release = rel};
            pln_engine_step(e, &rp, NULL);
        }
    }
    if (stream) fputc('\n', stdout);

    double decode_ms = 0;
    for (int i = 0; i < n_steps; i++) decode_ms += step_ms[i];
    if (rc == 0 && json) {
        json_t *root = json_object(), *arr = json_array();
        for (int i = 0; i < n_seq; i++) {
            json_t *o = json_object(), *pi = json_array(), *gi = json_array(), *lp = json_array();
            for (size_t j = 0; j < g[i].n_ids; j++) json_array_append_new(pi, json_integer(g[i].ids[j]));
            for (int32_t j = 0; j < g[i].n_out; j++) {
                json_array_append_new(gi, json_integer(g[i].out[j]));
                json_array_append_new(lp, json_real(g[i].lp[j]));
            }
            if (g[i].text) json_object_set_new(o, "prompt", json_string(g[i].text));
            json_object_set_new(o, "prompt_ids", pi);
            json_object_set_new(o, "ids", gi);
            json_object_set_new(o, "logprobs", lp);
            if (tok) json_object_set_new(o, "text", json_stringn(g[i].gen ? g[i].gen : "", g[i].gen_len));
            json_object_set_new(o, "finish_reason", json_string(g[i].finish ? g[i].finish : "length"));
            json_array_append_new(arr, o);
        }
        json_object_set_new(root, "results", arr);
        json_t *tm = json_object(), *pt = json_array();
        json_object_set_new(tm, "load_s", json_real(t_load));
        if (info.load_bytes_per_s > 0) json_object_set_new(tm, "load_gb_per_s", json_real(info.load_bytes_per_s / 1e9));
        json_object_set_new(tm, "prefill_s", json_real(t_prefill));
        for (int i = 0; i < n_steps; i++) json_array_append_new(pt, json_real(step_ms[i]));
        json_object_set_new(tm, "per_token_ms", pt);
        json_object_set_new(tm, "decode_ms_per_step", json_real(n_steps ? decode_ms / n_steps : 0));
        json_object_set_new(root, "timings", tm);
        json_object_set_new(root, "tp", json_integer(info.tp));
        json_object_set_new(root, "dtype", json_string(info.dtype));
        json_object_set_new(root, "backend", json_string(info.backend));
        json_object_set_new(root, "kv_dtype", json_string(info.kv_dtype));
        json_object_set_new(root, "int_dot", json_boolean(info.int_dot));
        json_object_set_new(root, "threads_per_rank", json_integer(threads));
        char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
        puts(s);
        free(s);
        json_decref(root);
    } else if (rc == 0) {
        /* The results go to stdout, --quiet or not; the timings are chatter (stderr). One prompt
         * prints as the stream does (no "[1] "), so `--quiet > out.txt` holds the same text as a
         * streamed run; several are numbered. */
        if (!stream && tok)
            for (int i = 0; i < n_seq; i++) {
                if (n_seq > 1) printf("[%d] ", i + 1);
                printf("%s%s\n", g[i].text ? g[i].text : "", g[i].gen ? g[i].gen : "");
            }
        else if (!stream) {
            /* No tokenizer: the ids are the result (never an empty line). */
            for (int i = 0; i < n_seq; i++) {
                if (n_seq > 1) printf("[%d] ", i + 1);
                for (int32_t j = 0; j < g[i].n_out; j++) printf(j ? " %d" : "%d", (int)g[i].out[j]);
                printf("\n");
            }
            fprintf(stderr, "pollen: %s records no tokenizer, so the results above are token ids, not text (--json "
                    "adds log-probs); for text, reshard with the model's tokenizer.json beside the checkpoint\n", dir);
        }
        fflush(stdout);
        if (!quiet) {
            int64_t ptoks = 0;
            for (int i = 0; i < n_seq; i++) ptoks += (int64_t)g[i].n_ids;
            if (info.load_bytes_per_s > 0)
                fprintf(stderr, "weights: %.2f GB per rank streamed to the device at %.2f GB/s\n", info.weight_bytes / 1e9,
                        info.load_bytes_per_s / 1e9);
            fprintf(stderr, "load %.2f s | prefill %lld token%s in %.1f ms (%.0f tok/s) | decode %d step%s, %.2f ms/step "
                    "(batch %d, TP %d %s, %d thread%s/rank)\n", t_load, (long long)ptoks, ptoks == 1 ? "" : "s",
                    t_prefill * 1e3, t_prefill > 0 ? ptoks / t_prefill : 0.0, n_steps, n_steps == 1 ? "" : "s",
                    n_steps ? decode_ms / n_steps : 0.0, n_seq, info.tp, info.dtype, threads, threads == 1 ? "" : "s");
        }
    }
    if (rc == 0 && dump) {
        pln_tensor t[2];
        memset(t, 0, sizeof t);
        t[0].name = "logits"; t[0].dtype = PLN_DTYPE_F32; t[0].ndim = 2;
        t[0].shape[0] = dl_rows; t[0].shape[1] = info.n_vocab;
        t[0].data = (const uint8_t *)dl; t[0].nbytes = (uint64_t)dl_rows * (uint64_t)info.n_vocab * 4; t[0].contiguous = true;
        t[1].name = "ids"; t[1].dtype = PLN_DTYPE_I32; t[1].ndim = 1; t[1].shape[0] = dl_rows;
        t[1].data = (const uint8_t *)dl_ids; t[1].nbytes = (uint64_t)dl_rows * 4; t[1].contiguous = true;
        if (pln_safetensors_write(dump, t, 2, NULL, 0)) { fprintf(stderr, "pollen: %s\n", pln_error()); rc = 1; }
    }
    pln_engine_shutdown(e);
    pln_engine_close(e);
    pln_comm_free(comm);
    for (int i = 0; i < n_seq; i++) { free(g[i].ids); free(g[i].out); free(g[i].lp); free(g[i].gen); }
    free(g); free(seqs); free(outs); free(map); free(last); free(step_ms); free(dl); free(dl_ids);
    pln_opt_free(&cmd);
    if (tok) pln_tok_free(tok);
    return rc;
}
