/* cmd_serve.c — `pollen serve SHARDS`: rank 0 runs the HTTP server and the continuous-batching
 * scheduler, every other rank serves engine steps (`mpirun -np N` for a TP-N shard set).
 * SIGTERM/SIGINT/SIGHUP drain: new requests get 503, in-flight ones finish, then every rank exits 0. */
#include "formats/common.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/server.h"
#include "runtime/tokenizer.h"
#include "runtime/chat.h"
#include "formats/shard.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "tools/opt.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --chat-template FILE in pollen's own JSON form ({"system": ..., "user": ...}): a JSON object
 * that is not a tokenizer_config.json. Anything else is Jinja (a .jinja file, a
 * tokenizer_config.json, a model directory). */
static bool is_pollen_json_template(const char *path) {
    size_t n = 0;
    char *text = pln_read_small_file(path, (size_t)64 << 20, &n);
    if (!text) return false;   /* pln_chat_load names the problem */
    json_t *o = json_loadb(text, n, 0, NULL);
    free(text);
    bool r = json_is_object(o) && !json_object_get(o, "chat_template");
    json_decref(o);
    return r;
}

static void free_chat(pln_chat_template *t, pln_chat *jinja, char **names, int n_names) {
    pln_chat_template_free(t);
    pln_chat_free(jinja);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
}

/* --model-id VALUE as TGI means it, the model to load: a directory holding manifest.json. */
static bool is_shard_set(const char *path) {
    char *m = pln_xasprintf("%s/manifest.json", path);
    bool r = access(m, F_OK) == 0;
    free(m);
    return r;
}

/* ---- the tokenizer as the scheduler and server see it -------------------------------------- */

static int tok_encode(void *ctx, const char *text, bool add_special, int32_t **ids, int32_t *n) {
    size_t nn = 0;
    if (pln_tok_encode_special(ctx, text, strlen(text), add_special, ids, &nn)) return -1;
    *n = (int32_t)nn;
    return 0;
}

/* Raw bytes, not the lossy decode: the scheduler needs to see where a UTF-8 sequence is still
 * incomplete so it streams only finished characters. */
static char *tok_decode(void *ctx, const int32_t *ids, int32_t n, bool skip_special, size_t *len) {
    size_t total = 0, l;
    for (int32_t i = 0; i < n; i++)
        if (pln_tok_token_bytes(ctx, ids[i], &l) && !(skip_special && pln_tok_is_special(ctx, ids[i]))) total += l;
    char *out = pln_xmalloc(total + 1), *o = out;
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *b = pln_tok_token_bytes(ctx, ids[i], &l);
        if (!b || (skip_special && pln_tok_is_special(ctx, ids[i]))) continue;
        memcpy(o, b, l);
        o += l;
    }
    *o = 0;
    *len = total;
    return out;
}

static bool tok_special(void *ctx, int32_t id) { return pln_tok_is_special(ctx, id); }

/* --step-delay-ms (test only) stretches every step so tests can act while requests are running
 * on a tiny model: disconnects, overload, draining. */
static int g_step_delay_ms;
/* Set when a step failed because the rank group broke (watchdog or a lost peer): after a
 * moment of answering 503 (so probes and clients see why), the scheduler drains and the job ends. */
static pln_comm *g_comm;
static pln_sched *g_sched;
static bool g_group_lost;
static char g_group_msg[512];
#define LOST_LINGER_S 1
static pthread_t g_linger;
static bool g_linger_started;

static void *stop_after_linger(void *arg) {
    (void)arg;
    sleep(LOST_LINGER_S);
    pln_sched_stop(g_sched);
    return NULL;
}

/* Backstop for a hang the comm watchdog cannot see (a device collective or kernel that never
 * returns, a stuck rank 0, or TP 1): a thread watches the running step's age; past twice its
 * bound plus 5 s it says so, turns /health 503 (draining) and a second later ends the process
 * with exit 3, and the launcher ends the job. The scheduler is stuck inside that step, so the
 * requests in flight see their connections close rather than an error body. */
static atomic_llong g_step_t0_ms;       /* start of the running step, ms of pln_now(); 0 = none */
static atomic_llong g_step_bound_ms;
static double g_step_timeout;
static uint64_t g_weight_bytes;
static const char *g_backend;

static void *backstop_thread(void *arg) {
    (void)arg;
    for (;;) {
        usleep(100000);
        long long t0 = atomic_load(&g_step_t0_ms), b = atomic_load(&g_step_bound_ms);
        if (!t0 || b <= 0) continue;
        double age = pln_now() - (double)t0 / 1e3, limit = 2.0 * (double)b / 1e3 + 5;
        if (age < limit) continue;
        fprintf(stderr, "pollen serve: a step has run %.1f s, past twice its bound (%.3g s, --step-timeout) plus 5 s, "
                        "and has not returned (a device collective or kernel that hangs?); /health is 503; exiting in %d s\n",
                age, (double)b / 1e3, LOST_LINGER_S);
        pln_sched_stop(g_sched);
        sleep(LOST_LINGER_S);
        fflush(NULL);
        _exit(3);
    }
    return NULL;
}

static int eng_step(void *ctx, const pln_step_plan *p, pln_step_out *o) {
    int64_t n_tokens = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) n_tokens += p->seqs[i].n_new;
    double bound = pln_engine_step_bound(g_step_timeout, g_backend, g_weight_bytes, n_tokens);
    atomic_store(&g_step_bound_ms, (long long)(bound * 1e3));
    atomic_store(&g_step_t0_ms, (long long)(pln_now() * 1e3));
    if (g_step_delay_ms && p->n_seqs) usleep((useconds_t)g_step_delay_ms * 1000);
    int rc = pln_engine_step(ctx, p, o);
    atomic_store(&g_step_t0_ms, 0);
    if (rc && !g_group_lost && g_comm && pln_comm_broken(g_comm)) {
        g_group_lost = true;
        snprintf(g_group_msg, sizeof g_group_msg, "%s", pln_error());
        fprintf(stderr, "pollen serve: %s\npollen serve: failing the requests in flight; /health is 503; exiting in %d s\n",
                g_group_msg, LOST_LINGER_S);
        /* Joined before the scheduler is freed: a signal may end the drain before the linger. */
        if (pthread_create(&g_linger, NULL, stop_after_linger, NULL) == 0) g_linger_started = true;
        else pln_sched_stop(g_sched);
    }
    return rc;
}
static void eng_info(void *ctx, pln_engine_info *i) { pln_engine_get_info(ctx, i); }

/* ---- signals: blocked everywhere, taken by one thread -------------------------------------
 * The thread starts before anything else, so a signal is never ignored: while the process starts
 * (MPI, loading weights, the tokenizer) it ends it at once; once rank 0 serves, it drains. On the
 * other ranks it then does nothing: rank 0's drain ends them. */
typedef struct {
    sigset_t set;
    pthread_mutex_t mu;
    pln_sched *sched;          /* set once rank 0 serves */
    bool serving;              /* this rank is past start-up */
} sig_ctx;

static void *signal_thread(void *arg) {
    sig_ctx *c = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&c->set, &sig)) continue;
        if (sig == SIGUSR1) return NULL;   /* main is done */
        const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGINT";
        pthread_mutex_lock(&c->mu);
        pln_sched *sched = c->sched;
        bool serving = c->serving;
        pthread_mutex_unlock(&c->mu);
        if (!serving) {
            /* Nothing to drain and nothing written yet: stop now, whatever start-up is doing. */
            fprintf(stderr, "pollen serve: %s during start-up: exiting\n", name);
            _exit(128 + sig);
        }
        if (!sched) continue;
        fprintf(stderr, "pollen serve: %s: draining (new requests get 503, in-flight ones finish)\n", name);
        pln_sched_stop(sched);
    }
}

static void stop_signal_thread(pthread_t t) {
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
}

int cmd_serve(int argc, char **argv) {
    /* Block the shutdown signals before MPI or the HTTP server start threads, so they all inherit
     * the mask and only the signal thread ever sees them (workers just wait for rank 0). */
    static sig_ctx sc = {.mu = PTHREAD_MUTEX_INITIALIZER};
    sigemptyset(&sc.set);
    sigaddset(&sc.set, SIGTERM);
    sigaddset(&sc.set, SIGINT);
    sigaddset(&sc.set, SIGHUP);    /* a closed terminal drains too, rather than dropping what is in flight */
    sigaddset(&sc.set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sc.set, NULL);
    signal(SIGPIPE, SIG_IGN);

    pln_engine_opts eo;
    pln_engine_opts_default(&eo);
    eo.max_seqs = 32;
    eo.kv_tokens = 16384;
    pln_server_opts so = {.host = "127.0.0.1", .port = 8080};
    pln_serve_limits_default(&so.lim);
    const char *port_file = NULL;
    bool input_set = false;
    int threads = 0;
    const char *chat_path = NULL, *served_names = NULL;
    pln_chat *jinja = NULL;
    char **names = NULL;
    int n_names = 0;
    pln_chat_template chat_tpl;
    memset(&chat_tpl, 0, sizeof chat_tpl);
    bool show_placement = false, no_mmap = false, no_launch = false;
    const char *log_requests = "on", *log_format = "text";
    int tp_given = 0;
    /* One line per option; every one also reads POLLEN_<NAME> (argv wins over it, it over the
     * default). Aliases are TGI's and vLLM's names for the same setting (docs/SERVING.md). */
    pln_opt opts[] = {
        PLN_O_POS("SET", eo.shard_dir, "the shard set"),
        PLN_O_STR("model", 'm', eo.shard_dir, "SET", "the shard set (instead of the positional SET)"),
        PLN_O_STR("host", 0, so.host, "ADDR",
                  "address or host name to listen on (default {}; 0.0.0.0 or :: for every interface; ::1 or "
                  "[::1]; a name such as localhost: every address it resolves to)", .aliases = "hostname"),
        PLN_O_INT("port", 0, so.port, 0, 65535, "N", "TCP port (default {}; 0 = any free port, see --port-file)"),
        PLN_O_STR("port-file", 0, port_file, "PATH", "write the bound port there once listening"),
        PLN_O_STR("model-id", 0, so.model_id, "NAME",
                  "name in /info, /v1/models (default: the shard directory's name); as in TGI, a shard set "
                  "directory (one holding manifest.json) given here with no SET is the set to serve"),
        PLN_O_INT("tensor-parallel-size", 0, tp_given, 1, 4096, "N",
                  "checked against the set's TP (the set decides it, and pollen starts its ranks)", .aliases = "num-shard"),
        PLN_O_STR("backend", 0, eo.backend, "cpu|cuda", "(default cpu)"),
        PLN_O_STR("kv-dtype", 0, eo.kv_dtype, "f32|f16", "KV-cache dtype (default f32 on cpu, f16 on cuda; f16 on cpu halves KV memory)"),
        PLN_CLI_INT_DOT_OPTS(eo),
        PLN_O_INT("device", 0, eo.device, 0, PLN_CLI_MAX_DEVICE, "D", "CUDA device of every rank (default: picked from the node-local rank)"),
        PLN_O_INT("gpus-per-node", 0, eo.gpus_per_node, 1, PLN_CLI_MAX_DEVICE + 1, "N",
                  "CUDA device = node-local rank % N (default: the node-local rank)"),
        PLN_O_INT("max-seqs", 0, eo.max_seqs, 1, 4096, "N", "engine sequence slots (default {})", .aliases = "max-num-seqs"),
        PLN_O_INT("kv-tokens", 'c', eo.kv_tokens, 1, INT32_MAX, "N", "KV-cache capacity in tokens over all slots (default {})",
                  .aliases = "max-batch-total-tokens"),
        PLN_O_INT("block-size", 0, eo.block_size, 1, 1024, "N", "KV block size in tokens (default {})"),
        PLN_O_FLAG("no-prefix-cache", 0, eo.no_prefix_cache, "do not keep full KV blocks for later requests with the same prefix"),
        PLN_O_STR("chat-template", 0, chat_path, "FILE",
                  "/v1/chat/completions renders this template instead of the set's own (tokenizer_config.json / "
                  "chat_template.jinja): a Jinja file, a tokenizer_config.json, or pollen's JSON form for BLOOM "
                  "(docs/SERVING.md)"),
        PLN_O_STR("served-model-name", 0, served_names, "A,B",
                  "names the OpenAI routes accept and /v1/models lists; the first is the name reported unless "
                  "--model-id is given"),
        PLN_O_INT("max-concurrent-requests", 0, so.lim.max_concurrent_requests, 1, 1000000, "N",
                  "sequences running or waiting; over it: 429 (default {})"),
        PLN_O_INT("max-input-tokens", 0, so.lim.max_input_tokens, 1, 1 << 24, "N", "prompt tokens (default {})",
                  .aliases = "max-input-length"),
        PLN_O_INT("max-total-tokens", 0, so.lim.max_total_tokens, 2, 1 << 24, "N", "prompt + new tokens (default {})",
                  .aliases = "max-model-len"),
        PLN_O_INT("max-body-bytes", 0, so.lim.max_body_bytes, 64, INT32_MAX, "N", "request body (default {})"),
        PLN_O_INT("max-connections", 0, so.lim.max_connections, 1, 100000, "N", "open HTTP connections (default {})"),
        PLN_O_INT("timeout", 0, so.lim.timeout_s, 0, 86400, "S", "idle connection timeout in seconds (default {})"),
        PLN_O_INT("request-timeout", 0, so.lim.request_timeout_s, 1, 86400, "S",
                  "each request's head and body must arrive within S seconds of the connection being ready for "
                  "it; also bounds keep-alive idling (default {})"),
        PLN_O_INT("max-connections-per-client", 0, so.lim.max_connections_per_client, 0, 100000, "N",
                  "open connections from one client address (default {}; 0 = no limit; behind a reverse proxy "
                  "every request comes from its address)"),
        PLN_O_INT("max-batch-tokens", 0, so.lim.max_batch_tokens, 1, 1 << 20, "N",
                  "tokens per engine step: decode tokens and prefill chunks together (default {})",
                  .aliases = "max-num-batched-tokens,max-batch-prefill-tokens"),
        PLN_O_INT("max-new-tokens", 0, so.lim.default_max_new_tokens, 1, 1 << 24, "N", "TGI default max_new_tokens (default {})"),
        PLN_O_INT("threads", 't', threads, 1, 4096, "N", "threads per rank (default: cores / ranks on the node)"),
        PLN_O_FN("step-timeout", 0, pln_cli_parse_step_timeout, eo.step_timeout, "S|auto|off",
                 "step watchdog (TP > 1): a step past S seconds fails every request in flight, /health turns "
                 "503 naming the rank that stopped answering, and every rank exits 3 (default auto: 10 s + the "
                 "step's work at a pessimistic rate); a step that never returns (any TP) ends the process after "
                 "2 S + 5 s"),
        PLN_O_FLAG("show-placement", 0, show_placement, "each rank prints its node, local rank and CUDA device to stderr"),
        PLN_O_FLAG("populate", 0, eo.populate, "fault the shard in at load"),
        PLN_O_FLAG("verify", 0, eo.verify, "check checksums at load"),
        PLN_O_FLAG("no-mmap", 0, no_mmap, "read the rank file into memory instead of mapping it"),
        PLN_O_FLAG("quiet", 'q', eo.quiet, "no progress lines"),
        PLN_O_INT("fail-at-step", 0, eo.fail_at_step, 0, INT32_MAX, "N", "test only: step N's forward fails", .flags = PLN_OPT_HIDDEN),
        PLN_O_INT("step-delay-ms", 0, g_step_delay_ms, 0, 10000, "MS", "test only: sleep before each step", .flags = PLN_OPT_HIDDEN),
        PLN_O_FLAG("no-block-sharing", 0, eo.no_block_sharing, "test only: no KV block sharing", .flags = PLN_OPT_HIDDEN),
        PLN_O_STR("api-key", 0, so.api_key, "KEY",
                  "generation, tokenizer and /v1 routes need \"Authorization: Bearer KEY\", else 401 (/health, /info, "
                  "/metrics, /version, /docs, /openapi.json stay open); POLLEN_API_KEY sets it without showing it in ps"),
        PLN_O_ENUM("log-requests", 0, log_requests, "on|off",
                   "a line per request on stderr: route, status, tokens, queue/inference/total time, request id (default {})"),
        PLN_O_ENUM("log-format", 0, log_format, "text|json",
                   "request lines as key=value text or one JSON object per line (default {})"),
        PLN_O_FLAG("no-launch", 0, no_launch, "run as one process even when SET is TP > 1 (by default pollen starts the set's N ranks itself under mpirun; under mpirun/srun it never does)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {.cmd = "serve", .synopsis = "pollen serve SET [options]",
                       .opts = opts, .env_prefix = "POLLEN_", .rank = pln_opt_env_rank()};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    input_set = pln_opt_given(&cmd, "max-input-tokens");
    /* TGI's --model-id names the model to load: a shard set there, with no SET, is the set. */
    if (!eo.shard_dir && so.model_id && is_shard_set(so.model_id)) {
        eo.shard_dir = so.model_id;
        so.model_id = NULL;
    }
    if (!eo.shard_dir) {
        int rc = so.model_id ? pln_opt_usage_error(&cmd, "missing SET (--model-id %s is not a shard set directory: no manifest.json there; "
                                                         "pollen serves sets made by pollen reshard)", so.model_id)
                             : pln_opt_usage_error(&cmd, "missing SET");
        pln_opt_free(&cmd);
        return rc;
    }
    if (tp_given) {
        pln_shardset *set = pln_shardset_open(eo.shard_dir);
        if (set && set->tp != tp_given) {
            int rc = pln_opt_usage_error(&cmd, "%s %d, but %s is a TP-%d set (its manifest.json): give %d or leave it out (the "
                                         "set decides; mpirun -np %d), or reshard the checkpoint with --tp %d",
                                         pln_opt_find(&cmd, "tensor-parallel-size")->spelled, tp_given, eo.shard_dir,
                                         (int)set->tp, (int)set->tp, (int)set->tp, tp_given);
            pln_shardset_close(set);
            pln_opt_free(&cmd);
            return rc;
        }
        if (set) pln_shardset_close(set);
    }
    pln_opt_free(&cmd);
    so.no_request_log = !strcmp(log_requests, "off");
    so.log_json = !strcmp(log_format, "json");
    if (so.api_key && !so.api_key[0])
        pln_die("--api-key (or POLLEN_API_KEY) is empty: give the key clients must send, or leave it out for no key");
    pln_map_set_no_mmap(no_mmap);
    /* Options are parsed and MPI has not started: the place to start the ranks a set needs. */
    int launched = pln_launch_self("serve", eo.shard_dir, argc, argv, no_launch, eo.quiet);
    if (launched >= 0) return launched;
    pln_map_fault_hint("--no-mmap reads the rank file into memory instead of mapping it");
    /* A signal that came during argument parsing is pending and taken here. */
    pthread_t sig_thr;
    if (pthread_create(&sig_thr, NULL, signal_thread, &sc)) pln_die("cannot start the signal thread");
    if (port_file) {
        const char *protect[1] = {eo.shard_dir};
        if (pln_path_guard(port_file, protect, 1)) pln_die("--port-file: %s", pln_error());
    }
    if (!input_set && so.lim.max_input_tokens >= so.lim.max_total_tokens) so.lim.max_input_tokens = so.lim.max_total_tokens - 1;
    if (so.lim.max_input_tokens >= so.lim.max_total_tokens)
        pln_die("--max-input-tokens (%d) must be below --max-total-tokens (%d)", so.lim.max_input_tokens, so.lim.max_total_tokens);
    eo.max_seq_len = so.lim.max_total_tokens;
    eo.kv_dtype = pln_cli_kv_dtype(eo.backend, eo.kv_dtype);
    eo.int_dot = pln_cli_int_dot(eo.backend, eo.int_dot);
    pln_cli_batch_invariant(eo.backend, eo.batch_invariant);
    eo.cpu_tune = pln_cli_cpu_tune(eo.cpu_tune);
    if (so.lim.default_max_new_tokens > so.lim.max_total_tokens - 1) so.lim.default_max_new_tokens = so.lim.max_total_tokens - 1;
    if (served_names) {
        char *dup = pln_xstrdup(served_names), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            while (*t == ' ') t++;
            size_t l = strlen(t);
            while (l && t[l - 1] == ' ') t[--l] = 0;
            if (!l) continue;
            names = pln_xrealloc(names, (size_t)(n_names + 1) * sizeof *names);
            names[n_names++] = pln_xstrdup(t);
        }
        free(dup);
        if (!n_names) pln_die("--served-model-name needs at least one name (A or A,B,...)");
        so.served_names = (const char *const *)names;
        so.n_served_names = n_names;
        if (!so.model_id) so.model_id = names[0];
    }
    /* Before anything loads, so a template pollen cannot render fails at once, naming the file,
     * line and construct: --chat-template FILE, else the set's own (none: BLOOM sets). */
    /* --chat-template names a file (a .jinja, a tokenizer_config.json, pollen's JSON form): a
     * directory, a FIFO or a device is named at once, before anything reads it. */
    if (chat_path && pln_check_file(chat_path)) pln_die("--chat-template %s", pln_error());
    if (chat_path && is_pollen_json_template(chat_path)) {
        if (pln_chat_template_load(chat_path, &chat_tpl)) pln_die("--chat-template %s", pln_error());
        so.chat_template = &chat_tpl;
    } else {
        bool absent = false;
        char *set_tc = pln_xasprintf("%s/tokenizer_config.json", eo.shard_dir);
        bool tc_exists = access(set_tc, F_OK) == 0;
        jinja = chat_path ? pln_chat_load(chat_path, tc_exists ? set_tc : NULL, NULL) : pln_chat_load(eo.shard_dir, NULL, &absent);
        free(set_tc);
        if (!jinja && chat_path) pln_die("--chat-template %s: %s", chat_path, pln_error());
        if (!jinja && !absent) pln_die("%s", pln_error());
        if (jinja) {
            chat_tpl.jinja = jinja;
            so.chat_template = &chat_tpl;
        }
    }

    pln_comm *comm = pln_comm_init(&argc, &argv);
    int rank = pln_comm_rank(comm);
    threads = pln_cli_threads(threads, pln_comm_local_size(comm));
    if (show_placement) pln_cli_print_placement(comm, eo.device, eo.gpus_per_node, eo.backend);
    pln_engine *eng = pln_engine_open(&eo, comm);
    if (!eng) {
        fprintf(stderr, "pollen serve: rank %d: %s\n", rank, pln_error());
        free_chat(&chat_tpl, jinja, names, n_names);
        stop_signal_thread(sig_thr);
        pln_comm_free(comm);
        return 1;
    }
    if (rank != 0) {
        pthread_mutex_lock(&sc.mu);
        sc.serving = true;
        pthread_mutex_unlock(&sc.mu);
        int rc = pln_engine_worker_loop(eng);
        if (rc) fprintf(stderr, "pollen serve: rank %d: %s\n", rank, pln_error());
        pln_engine_close(eng);
        free_chat(&chat_tpl, jinja, names, n_names);
        stop_signal_thread(sig_thr);
        pln_comm_free(comm);
        return rc ? 1 : 0;
    }

    int status = 1;
    const char *tokp = pln_engine_tokenizer_path(eng);
    pln_tokenizer *tok = tokp ? pln_tok_load(tokp) : NULL;
    pln_sched *sched = NULL;
    pln_server *srv = NULL;
    char *model_id = NULL;
    if (!tokp) fprintf(stderr, "pollen serve: %s: the manifest records no tokenizer (\"tokenizer\": null) and serving text needs one: "
                       "re-run reshard from a checkpoint that has tokenizer.json\n", eo.shard_dir);
    else if (!tok) fprintf(stderr, "pollen serve: %s\n", pln_error());
    if (!tok) goto out;
    pln_sched_engine se = {.ctx = eng, .step = eng_step, .get_info = eng_info};
    pln_sched_tok st = {.ctx = tok, .encode = tok_encode, .decode = tok_decode, .is_special = tok_special};
    sched = pln_sched_create(&se, &st, &so.lim);
    if (!sched) { fprintf(stderr, "pollen serve: %s\n", pln_error()); goto out; }
    g_comm = comm;
    g_sched = sched;
    if (!so.model_id) {
        size_t n = strlen(eo.shard_dir);
        while (n > 1 && eo.shard_dir[n - 1] == '/') n--;
        const char *b = eo.shard_dir;
        for (size_t k = 0; k < n; k++) if (eo.shard_dir[k] == '/' && k + 1 < n) b = eo.shard_dir + k + 1;
        model_id = pln_xasprintf("%.*s", (int)(eo.shard_dir + n - b), b);
        so.model_id = model_id;
    }
    srv = pln_server_start(&so, sched, &st);
    if (!srv) { fprintf(stderr, "pollen serve: %s\n", pln_error()); goto out; }
    /* From here a signal drains (pln_sched_run sees a stop made before it starts). */
    pthread_mutex_lock(&sc.mu);
    sc.sched = sched;
    sc.serving = true;
    pthread_mutex_unlock(&sc.mu);
    pln_engine_info info;
    pln_engine_get_info(eng, &info);
    bool v6 = strchr(so.host, ':') && so.host[0] != '[';   /* an IPv6 address goes in brackets in a URL */
    fprintf(stderr, "pollen serve: %s (tp %d, %s, %s) on http://%s%s%s:%d  [%d slots, %lld KV blocks of %d, %s%s] pid %d\n",
            so.model_id, info.tp, info.dtype, info.backend, v6 ? "[" : "", so.host, v6 ? "]" : "", pln_server_port(srv), info.max_seqs,
            (long long)info.kv_blocks_total, info.block_size, info.kv_dtype, info.int_dot ? ", int-dot" : "", (int)getpid());
    if (so.api_key) fprintf(stderr, "pollen serve: an API key is required (Authorization: Bearer) on the generation, tokenizer and /v1 routes\n");
    if (jinja) fprintf(stderr, "pollen serve: chat template: %s\n", pln_chat_source(jinja));
    if (info.load_bytes_per_s > 0)
        fprintf(stderr, "pollen serve: weights: %.2f GB per rank streamed to the device at %.2f GB/s (start-up %.1f s)\n",
                info.weight_bytes / 1e9, info.load_bytes_per_s / 1e9, info.load_seconds);
    if (port_file) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%d\n", pln_server_port(srv));
        if (pln_write_file_atomic(port_file, buf, (size_t)n)) fprintf(stderr, "pollen serve: %s\n", pln_error());
    }
    g_step_timeout = eo.step_timeout;
    g_weight_bytes = info.weight_bytes;
    g_backend = info.backend;
    pthread_t backstop;
    if (pthread_create(&backstop, NULL, backstop_thread, NULL) == 0) pthread_detach(backstop);
    pln_sched_run(sched);            /* returns once drained */
    pln_server_stop(srv, 30.0);      /* let the last responses reach their clients */
    srv = NULL;
    if (g_group_lost) {
        /* pln_comm_free aborts every rank (exit 3): the others are stuck or gone. */
        fprintf(stderr, "pollen serve: exiting: %s\n", g_group_msg);
        status = 3;
        goto out;
    }
    fprintf(stderr, "pollen serve: drained, exiting\n");
    status = 0;
out:
    pthread_mutex_lock(&sc.mu);
    sc.sched = NULL;                 /* freed below: a late signal must not reach it */
    pthread_mutex_unlock(&sc.mu);
    pln_server_stop(srv, 0);
    pln_engine_shutdown(eng);
    if (g_linger_started) pthread_join(g_linger, NULL);   /* it stops sched: not freed before */
    pln_sched_free(sched);
    pln_engine_close(eng);
    pln_tok_free(tok);
    free(model_id);
    free_chat(&chat_tpl, jinja, names, n_names);
    stop_signal_thread(sig_thr);
    pln_comm_free(comm);
    return status;
}
