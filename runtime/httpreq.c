/* httpreq.c — request body parsing and validation for the HTTP server (see httpreq.h).
 * Ranges follow text-generation-inference's validation (strictly positive max_new_tokens,
 * temperature, top_k, repetition_penalty; top_p in (0, 1]) and the OpenAI completions API
 * (temperature in [0, 2], 0 meaning greedy). Every message names the parameter and the allowed
 * range, because it is what a client developer reads first. */
#include "runtime/httpreq.h"
#include "runtime/chat.h"
#include "formats/common.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void pln_serve_limits_default(pln_serve_limits *l) {
    memset(l, 0, sizeof *l);
    l->max_concurrent_requests = 128;
    l->max_input_tokens = 1024;
    l->max_total_tokens = 2048;
    l->max_body_bytes = 1 << 20;
    l->max_connections = 256;
    l->timeout_s = 60;
    l->request_timeout_s = 30;
    l->max_connections_per_client = 64;
    l->max_batch_tokens = 512;
    l->max_stop_sequences = 4;
    l->max_stop_bytes = 256;
    l->max_prompts = 16;
    l->default_max_new_tokens = 100;
    l->max_best_of = 4;
    l->max_top_n_tokens = PLN_TOP_MAX;
}

static const char *error_type(pln_api api, int status) {
    if (api == PLN_API_TGI) {
        switch (status) {
        case 429: return "overloaded";
        case 424: case 500: return "generation";
        case 503: return "unhealthy";
        case 404: return "not_found";
        case 405: return "method_not_allowed";
        case 401: return "unauthorized";
        default: return "validation";
        }
    }
    switch (status) {
    case 429: return "rate_limit_error";
    case 500: case 503: return "server_error";
    default: return "invalid_request_error";
    }
}

int pln_req_fail(pln_req_error *err, pln_api api, int status, const char *param, const char *fmt, ...) {
    memset(err, 0, sizeof *err);
    err->status = status;
    err->type = error_type(api, status);
    if (param) snprintf(err->param, sizeof err->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *pln_req_error_json(pln_api api, const pln_req_error *err) {
    json_t *o;
    /* Messages are built from our own text plus at most a parameter name, but a name taken from
     * the body could carry invalid UTF-8, which jansson refuses: sanitize first. */
    char *msg = pln_utf8_sanitize(err->message, strlen(err->message), NULL);
    if (api == PLN_API_TGI) {
        o = json_pack("{s:s, s:s}", "error", msg, "error_type", err->type ? err->type : "validation");
    } else {
        json_t *inner = json_pack("{s:s, s:s}", "message", msg, "type", err->type ? err->type : "invalid_request_error");
        json_object_set_new(inner, "param", err->param[0] ? json_string(err->param) : json_null());
        json_object_set_new(inner, "code", err->code[0] ? json_string(err->code) : json_null());
        o = json_pack("{s:o}", "error", inner);
    }
    free(msg);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s ? s : pln_xstrdup("{\"error\":\"internal error\"}");
}

void pln_gen_request_free(pln_gen_request *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n_prompts; i++) free(r->prompts[i]);
    free(r->prompts);
    for (int32_t i = 0; r->prompt_ids && i < r->n_prompts; i++) free(r->prompt_ids[i]);
    free(r->prompt_ids);
    free(r->n_prompt_ids);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->model);
    memset(r, 0, sizeof *r);
}

/* Kept here rather than calling the sampler's so the parser stays a leaf (the fuzz target links
 * nothing else); the values are sampler.h's documented defaults. */
static void sample_defaults(pln_sample_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->typical_p = 1.0f;
}

/* ---- shared pieces ------------------------------------------------------------------------ */

static json_t *load_object(pln_api api, const char *body, size_t len, const pln_serve_limits *lim,
                           pln_req_error *err) {
    if (lim->max_body_bytes > 0 && (uint64_t)len > (uint64_t)lim->max_body_bytes) {
        pln_req_fail(err, api, 413, NULL, "request body is %zu bytes; the limit is %lld (--max-body-bytes)",
                     len, (long long)lim->max_body_bytes);
        return NULL;
    }
    int bad = api == PLN_API_TGI ? 422 : 400;
    if (!body || len == 0) { pln_req_fail(err, api, bad, NULL, "empty request body: send a JSON object"); return NULL; }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        pln_req_fail(err, api, bad, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        pln_req_fail(err, api, bad, NULL, "request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* Value of key, or NULL when absent or null (JSON null means "use the default"). */
static json_t *opt(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

static int get_int(pln_api api, json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   bool *present, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    json_t *v = opt(obj, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!json_is_integer(v))
        return pln_req_fail(err, api, bad, key, "`%s` must be an integer", key);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        if (lo == 1 && x < 1) return pln_req_fail(err, api, bad, key, "`%s` must be strictly positive (got %lld)", key, (long long)x);
        return pln_req_fail(err, api, bad, key, "`%s` must be between %lld and %lld (got %lld)", key,
                            (long long)lo, (long long)hi, (long long)x);
    }
    *out = x;
    return 0;
}

/* A number in (lo, hi] when lo_open, else [lo, hi]. */
static int get_num(pln_api api, json_t *obj, const char *key, double lo, bool lo_open, double hi,
                   double *out, bool *present, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    json_t *v = opt(obj, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!json_is_number(v)) return pln_req_fail(err, api, bad, key, "`%s` must be a number", key);
    double x = json_number_value(v);
    /* The value is used as a float: a positive double that rounds to 0.0f is not positive. */
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi || (lo_open && lo == 0 && (float)x <= 0.0f)) {
        if (lo_open && lo == 0 && (float)x <= 0.0f)
            return pln_req_fail(err, api, bad, key, "`%s` must be strictly positive (got %g)", key, x);
        return pln_req_fail(err, api, bad, key, "`%s` must be in %s%g, %g] (got %g)", key, lo_open ? "(" : "[", lo, hi, x);
    }
    *out = x;
    return 0;
}

static int get_bool(pln_api api, json_t *obj, const char *key, bool *out, bool *present, pln_req_error *err) {
    json_t *v = opt(obj, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!json_is_boolean(v))
        return pln_req_fail(err, api, api == PLN_API_TGI ? 422 : 400, key, "`%s` must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int get_stop(pln_api api, json_t *obj, const pln_serve_limits *lim, pln_gen_request *r, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    json_t *v = opt(obj, "stop");
    if (!v) return 0;
    json_t *arr = NULL;
    if (json_is_string(v) && api == PLN_API_OPENAI) {
        arr = json_array();
        json_array_append(arr, v);
    } else if (json_is_array(v)) {
        arr = json_incref(v);
    } else {
        return pln_req_fail(err, api, bad, "stop", api == PLN_API_TGI ? "`stop` must be an array of strings"
                                                                      : "`stop` must be a string or an array of strings");
    }
    size_t n = json_array_size(arr);
    if (n > (size_t)lim->max_stop_sequences) {
        json_decref(arr);
        return pln_req_fail(err, api, bad, "stop", "`stop` has %zu sequences; at most %d are allowed", n, lim->max_stop_sequences);
    }
    r->stop = pln_xcalloc(n ? n : 1, sizeof *r->stop);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i);
        if (!json_is_string(s)) { json_decref(arr); return pln_req_fail(err, api, bad, "stop", "`stop[%zu]` must be a string", i); }
        size_t sl = json_string_length(s);
        if (sl == 0) { json_decref(arr); return pln_req_fail(err, api, bad, "stop", "`stop[%zu]` cannot be empty", i); }
        if (sl > (size_t)lim->max_stop_bytes) {
            json_decref(arr);
            return pln_req_fail(err, api, bad, "stop", "`stop[%zu]` is %zu bytes; at most %d are allowed", i, sl, lim->max_stop_bytes);
        }
        r->stop[r->n_stop++] = pln_xstrdup(json_string_value(s));
    }
    json_decref(arr);
    return 0;
}

static int get_prompt_string(pln_api api, json_t *v, const char *what, char **out, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    const char *param = api == PLN_API_TGI ? "inputs" : "prompt";
    if (!json_is_string(v)) return pln_req_fail(err, api, bad, param, "`%s` must be a string", what);
    if (json_string_length(v) == 0) return pln_req_fail(err, api, bad, param, "`%s` cannot be empty", what);
    *out = pln_xstrdup(json_string_value(v));
    return 0;
}

/* A list of token ids (what names it in errors): integers from 0 to INT32_MAX, at least one. */
static int get_id_list(pln_api api, json_t *a, const char *what, int32_t **ids, int32_t *n, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    size_t k = json_array_size(a);
    if (k == 0) return pln_req_fail(err, api, bad, "prompt", "`%s` cannot be empty", what);
    if (k > INT32_MAX) return pln_req_fail(err, api, bad, "prompt", "`%s` has too many token ids", what);
    int32_t *out = pln_xmalloc(sizeof(int32_t) * k);
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(a, i);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x > INT32_MAX) {
            free(out);
            return pln_req_fail(err, api, bad, "prompt", "`%s[%zu]` must be a token id (an integer from 0)", what, i);
        }
        out[i] = (int32_t)x;
    }
    *ids = out;
    *n = (int32_t)k;
    return 0;
}

/* ---- TGI ---------------------------------------------------------------------------------- */

/* The TGI parameters beyond the sampling ones, checked as TGI's validation does (its messages). */
static int tgi_extras(json_t *p, const pln_serve_limits *lim, pln_gen_request *r, bool sampling, pln_req_error *err) {
    const pln_api api = PLN_API_TGI;
    int64_t iv;
    double dv;
    bool have, b = false;
    if (get_bool(api, p, "watermark", &b, NULL, err)) return -1;
    if (b) return pln_req_fail(err, api, 422, "watermark", "`watermark` is not supported by this server");
    static const char *const refused[] = {"grammar", "adapter_id"};
    for (size_t i = 0; i < 2; i++)
        if (opt(p, refused[i]))
            return pln_req_fail(err, api, 422, refused[i], "`%s` is not supported by this server", refused[i]);
    if (get_num(api, p, "typical_p", 0, true, 1, &dv, &have, err)) return -1;
    if (have) { r->sample.typical_p = (float)dv; sampling |= dv < 1.0; r->sample.do_sample |= dv < 1.0; }
    if (get_bool(api, p, "decoder_input_details", &r->prompt_logprobs, NULL, err)) return -1;
    if (r->prompt_logprobs && r->stream)
        return pln_req_fail(err, api, 422, "decoder_input_details",
                            "`decoder_input_details` == true is not supported when streaming tokens");
    if (get_int(api, p, "top_n_tokens", 0, INT32_MAX, &iv, &have, err)) return -1;
    if (have && iv > lim->max_top_n_tokens)
        return pln_req_fail(err, api, 422, "top_n_tokens", "`top_n_tokens` must be >= 0 and <= %d. Given: %lld",
                            lim->max_top_n_tokens, (long long)iv);
    if (have) r->top_n = (int32_t)iv;
    if (get_int(api, p, "truncate", 1, INT32_MAX, &iv, &have, err)) return -1;
    if (have && iv > lim->max_input_tokens)
        return pln_req_fail(err, api, 422, "truncate", "`truncate` must be strictly positive and less than %d. Given: %lld",
                            lim->max_input_tokens + 1, (long long)iv);
    if (have) r->truncate = (int32_t)iv;
    if (get_int(api, p, "best_of", 1, INT32_MAX, &iv, &have, err)) return -1;
    if (have && iv > lim->max_best_of)
        return pln_req_fail(err, api, 422, "best_of", "`best_of` must be > 0 and <= %d. Given: %lld", lim->max_best_of,
                            (long long)iv);
    if (have && iv > 1) {
        if (!sampling) return pln_req_fail(err, api, 422, "best_of", "you must use sampling when `best_of` is > 1");
        if (r->seed_set) return pln_req_fail(err, api, 422, "seed", "`seed` must not be set when `best_of` > 1");
        if (r->stream)
            return pln_req_fail(err, api, 422, "best_of", "`best_of` != 1 is not supported when streaming tokens");
        r->best_of = (int32_t)iv;
    }
    return 0;
}

int pln_req_parse_generate(const char *body, size_t len, const pln_serve_limits *lim,
                           pln_gen_request *r, pln_req_error *err) {
    const pln_api api = PLN_API_TGI;
    memset(r, 0, sizeof *r);
    r->api = api;
    sample_defaults(&r->sample);
    r->max_new_tokens = lim->default_max_new_tokens;
    r->n = r->best_of = 1;
    r->prompt_field = "inputs";
    r->max_tokens_field = "max_new_tokens";
    r->add_special = true;   /* TGI encodes inputs with add_special_tokens=true */
    json_t *root = load_object(api, body, len, lim, err);
    if (!root) return -1;
    if (get_bool(api, root, "stream", &r->stream, NULL, err)) goto fail;
    json_t *in = json_object_get(root, "inputs");
    if (!in) { json_decref(root); return pln_req_fail(err, api, 422, "inputs", "missing field `inputs`"); }
    r->prompts = pln_xcalloc(1, sizeof *r->prompts);
    if (get_prompt_string(api, in, "inputs", &r->prompts[0], err)) goto fail;
    r->n_prompts = 1;

    json_t *p = json_object_get(root, "parameters");
    if (p && !json_is_null(p) && !json_is_object(p)) {
        pln_req_fail(err, api, 422, "parameters", "`parameters` must be an object");
        goto fail;
    }
    if (p && json_is_object(p)) {
        int64_t iv;
        double dv;
        bool have, b;
        if (get_int(api, p, "max_new_tokens", 1, lim->max_total_tokens, &iv, &have, err)) goto fail;
        if (have) r->max_new_tokens = (int32_t)iv;
        bool sampling = false;
        if (get_num(api, p, "temperature", 0, true, 100, &dv, &have, err)) goto fail;
        if (have) { r->sample.temperature = (float)dv; sampling |= dv != 1.0; }
        if (get_int(api, p, "top_k", 1, INT32_MAX, &iv, &have, err)) goto fail;
        if (have) { r->sample.top_k = (int32_t)iv; sampling = true; }
        if (get_num(api, p, "top_p", 0, true, 1, &dv, &have, err)) goto fail;
        if (have) { r->sample.top_p = (float)dv; sampling |= dv < 1.0; }
        if (get_num(api, p, "repetition_penalty", 0, true, 100, &dv, &have, err)) goto fail;
        if (have) r->sample.repetition_penalty = (float)dv;
        b = false;
        if (get_bool(api, p, "do_sample", &b, NULL, err)) goto fail;
        /* TGI samples when asked to, or when any warper (temperature, top-k, top-p) is set. */
        r->sample.do_sample = b || sampling;
        if (get_int(api, p, "seed", 0, INT64_MAX, &iv, &have, err)) goto fail;
        if (have) { r->sample.seed = (uint64_t)iv; r->seed_set = true; }
        if (get_bool(api, p, "details", &r->details, NULL, err)) goto fail;
        if (get_bool(api, p, "return_full_text", &r->return_full_text, NULL, err)) goto fail;
        if (get_stop(api, p, lim, r, err)) goto fail;
        if (tgi_extras(p, lim, r, sampling || b, err)) goto fail;
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    pln_gen_request_free(r);
    return -1;
}

int pln_req_parse_tokenize(const char *body, size_t len, const pln_serve_limits *lim, char **text_out,
                           pln_req_error *err) {
    *text_out = NULL;
    json_t *root = load_object(PLN_API_TGI, body, len, lim, err);
    if (!root) return -1;
    json_t *in = json_object_get(root, "inputs");
    int rc = in ? get_prompt_string(PLN_API_TGI, in, "inputs", text_out, err)
                : pln_req_fail(err, PLN_API_TGI, 422, "inputs", "missing field `inputs`");
    json_decref(root);
    return rc;
}

int pln_req_parse_tokenize_any(const char *body, size_t len, const pln_serve_limits *lim, pln_tokenize_request *out,
                               pln_req_error *err) {
    memset(out, 0, sizeof *out);
    out->add_special = true;
    /* the form decides the error shape, so it is found first (a body that is no object is TGI's) */
    json_t *peek = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    bool vllm = json_is_object(peek) && json_object_get(peek, "prompt") && !json_object_get(peek, "inputs");
    json_decref(peek);
    if (!vllm) return pln_req_parse_tokenize(body, len, lim, &out->text, err);
    const pln_api api = PLN_API_OPENAI;
    out->vllm = true;
    json_t *root = load_object(api, body, len, lim, err);
    if (!root) return -1;
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
        if (!rc && strcmp(key, "prompt") && strcmp(key, "model") && strcmp(key, "add_special_tokens") && strcmp(key, "return_token_strs"))
            rc = pln_req_fail(err, api, 400, key, "Unrecognized request argument supplied: %s", key);
    if (!rc) rc = get_prompt_string(api, json_object_get(root, "prompt"), "prompt", &out->text, err);
    if (!rc) rc = get_bool(api, root, "add_special_tokens", &out->add_special, NULL, err);
    if (!rc) rc = get_bool(api, root, "return_token_strs", &out->token_strs, NULL, err);
    json_t *m = rc ? NULL : opt(root, "model");
    if (m && !json_is_string(m)) rc = pln_req_fail(err, api, 400, "model", "`model` must be a string");
    else if (m) out->model = pln_xstrdup(json_string_value(m));
    json_decref(root);
    if (rc) pln_tokenize_request_free(out);
    return rc;
}

void pln_tokenize_request_free(pln_tokenize_request *r) {
    free(r->text);
    free(r->model);
    r->text = r->model = NULL;
}

/* ---- vLLM /detokenize --------------------------------------------------------------------- */

int pln_req_parse_detokenize(const char *body, size_t len, const pln_serve_limits *lim, int32_t **ids, int32_t *n,
                             char **model, pln_req_error *err) {
    const pln_api api = PLN_API_OPENAI;
    *ids = NULL;
    *n = 0;
    *model = NULL;
    json_t *root = load_object(api, body, len, lim, err);
    if (!root) return -1;
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
        if (!rc && strcmp(key, "tokens") && strcmp(key, "model"))
            rc = pln_req_fail(err, api, 400, key, "Unrecognized request argument supplied: %s (send {\"tokens\": [id, ...]})", key);
    json_t *t = json_object_get(root, "tokens"), *m = opt(root, "model");
    if (!rc && !json_is_array(t)) rc = pln_req_fail(err, api, 400, "tokens", "`tokens` must be a list of token ids");
    if (!rc && json_array_size(t) > (size_t)lim->max_total_tokens)
        rc = pln_req_fail(err, api, 400, "tokens", "`tokens` has %zu ids; at most %d are allowed (--max-total-tokens)",
                          json_array_size(t), lim->max_total_tokens);
    if (!rc && m && !json_is_string(m)) rc = pln_req_fail(err, api, 400, "model", "`model` must be a string");
    if (!rc && json_array_size(t) > 0) {
        rc = get_id_list(api, t, "tokens", ids, n, err);
        if (rc) snprintf(err->param, sizeof err->param, "tokens");
    }
    if (!rc && m) *model = pln_xstrdup(json_string_value(m));
    if (!rc && !*ids) *ids = pln_xmalloc(sizeof(int32_t));
    json_decref(root);
    return rc;
}

/* ---- OpenAI ------------------------------------------------------------------------------- */

/* The OpenAI API answers a field it does not know with 400 "Unrecognized request argument
 * supplied: NAME"; so does this server, rather than ignoring what a client thinks it asked for. */
static int openai_unknown_field(json_t *root, pln_req_error *err) {
    static const char *const known[] = {
        "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
        "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user",
        "seed", "top_k", "repetition_penalty", "typical_p", "add_special_tokens"};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++) ok = !strcmp(key, known[i]);
        if (!ok) return pln_req_fail(err, PLN_API_OPENAI, 400, key, "Unrecognized request argument supplied: %s", key);
    }
    return 0;
}

/* n, best_of, logprobs, echo, penalties, suffix, logit_bias, typical_p (OpenAI's ranges). */
static int openai_extras(json_t *root, const pln_serve_limits *lim, pln_gen_request *r, pln_req_error *err) {
    const pln_api api = PLN_API_OPENAI;
    int64_t iv;
    double dv;
    bool have;
    json_t *sf = opt(root, "suffix");
    if (sf && !(json_is_string(sf) && json_string_length(sf) == 0))
        return pln_req_fail(err, api, 400, "suffix",
                            "`suffix` is not supported: BLOOM was not trained to fill in the middle; send the text before the gap as `prompt`");
    json_t *lb = opt(root, "logit_bias");
    if (lb && !(json_is_object(lb) && json_object_size(lb) == 0))
        return pln_req_fail(err, api, 400, "logit_bias", "`logit_bias` is not supported (only an empty object is accepted)");
    json_t *u = opt(root, "user");
    if (u && !json_is_string(u)) return pln_req_fail(err, api, 400, "user", "`user` must be a string");
    if (get_int(api, root, "n", 1, lim->max_best_of, &iv, &have, err)) return -1;
    if (have) r->n = r->best_of = (int32_t)iv;
    if (get_int(api, root, "best_of", 1, lim->max_best_of, &iv, &have, err)) return -1;
    if (have) {
        if (iv < r->n)
            return pln_req_fail(err, api, 400, "best_of", "`best_of` must be greater than or equal to `n` (got best_of %lld, n %d)",
                                (long long)iv, r->n);
        r->best_of = (int32_t)iv;
    }
    if (r->stream && r->best_of > r->n)
        return pln_req_fail(err, api, 400, "best_of", "`best_of` greater than `n` cannot be streamed");
    if (get_int(api, root, "logprobs", 0, lim->max_top_n_tokens, &iv, &have, err)) return -1;
    if (have) { r->logprobs = true; r->top_n = (int32_t)iv; }
    if (get_bool(api, root, "echo", &r->echo, NULL, err)) return -1;
    r->prompt_logprobs = r->echo && r->logprobs;
    if (get_num(api, root, "presence_penalty", -2, false, 2, &dv, &have, err)) return -1;
    if (have) r->sample.presence_penalty = (float)dv;
    if (get_num(api, root, "frequency_penalty", -2, false, 2, &dv, &have, err)) return -1;
    if (have) r->sample.frequency_penalty = (float)dv;
    if (get_num(api, root, "typical_p", 0, true, 1, &dv, &have, err)) return -1;
    if (have) r->sample.typical_p = (float)dv;
    return 0;
}

int pln_req_parse_completions(const char *body, size_t len, const pln_serve_limits *lim,
                              pln_gen_request *r, pln_req_error *err) {
    const pln_api api = PLN_API_OPENAI;
    memset(r, 0, sizeof *r);
    r->api = api;
    sample_defaults(&r->sample);
    r->max_new_tokens = 16;
    r->n = r->best_of = 1;
    r->prompt_field = "prompt";
    r->max_tokens_field = "max_tokens";
    r->add_special = true;   /* vLLM's default */
    json_t *root = load_object(api, body, len, lim, err);
    if (!root) return -1;
    if (openai_unknown_field(root, err)) goto fail;
    int64_t iv;
    double dv;
    bool have;
    json_t *pr = json_object_get(root, "prompt");
    if (!pr || json_is_null(pr)) { pln_req_fail(err, api, 400, "prompt", "missing field `prompt`"); goto fail; }
    if (json_is_array(pr) && json_is_integer(json_array_get(pr, 0))) {
        /* one prompt as token ids */
        r->prompts = pln_xcalloc(1, sizeof *r->prompts);
        r->prompt_ids = pln_xcalloc(1, sizeof *r->prompt_ids);
        r->n_prompt_ids = pln_xcalloc(1, sizeof *r->n_prompt_ids);
        r->n_prompts = 1;
        r->prompt_ids_flat = true;
        if (get_id_list(api, pr, "prompt", &r->prompt_ids[0], &r->n_prompt_ids[0], err)) goto fail;
    } else if (json_is_array(pr)) {
        size_t n = json_array_size(pr);
        if (n == 0) { pln_req_fail(err, api, 400, "prompt", "`prompt` cannot be an empty list"); goto fail; }
        if (n > (size_t)lim->max_prompts) {
            pln_req_fail(err, api, 400, "prompt", "`prompt` has %zu entries; at most %d are allowed", n, lim->max_prompts);
            goto fail;
        }
        r->prompts = pln_xcalloc(n, sizeof *r->prompts);
        r->prompt_ids = pln_xcalloc(n, sizeof *r->prompt_ids);
        r->n_prompt_ids = pln_xcalloc(n, sizeof *r->n_prompt_ids);
        for (size_t i = 0; i < n; i++) {
            char what[32];
            snprintf(what, sizeof what, "prompt[%zu]", i);
            json_t *e = json_array_get(pr, i);
            r->n_prompts++;
            if (json_is_array(e)) {
                if (get_id_list(api, e, what, &r->prompt_ids[i], &r->n_prompt_ids[i], err)) goto fail;
            } else if (!json_is_string(e)) {
                pln_req_fail(err, api, 400, "prompt", "`%s` must be a string or a list of token ids", what);
                goto fail;
            } else if (get_prompt_string(api, e, what, &r->prompts[i], err)) {
                goto fail;
            }
        }
    } else {
        r->prompts = pln_xcalloc(1, sizeof *r->prompts);
        if (!json_is_string(pr)) {
            pln_req_fail(err, api, 400, "prompt", "`prompt` must be a string, a list of strings, a list of token ids or a "
                                                  "list of lists of token ids");
            goto fail;
        }
        if (get_prompt_string(api, pr, "prompt", &r->prompts[0], err)) goto fail;
        r->n_prompts = 1;
    }
    json_t *m = opt(root, "model");
    if (m) {
        if (!json_is_string(m)) { pln_req_fail(err, api, 400, "model", "`model` must be a string"); goto fail; }
        r->model = pln_xstrdup(json_string_value(m));
    }
    if (get_int(api, root, "max_tokens", 1, lim->max_total_tokens, &iv, &have, err)) goto fail;
    if (have) r->max_new_tokens = (int32_t)iv;
    double temperature = 1.0;
    if (get_num(api, root, "temperature", 0, false, 2, &temperature, NULL, err)) goto fail;
    if (get_num(api, root, "top_p", 0, true, 1, &dv, &have, err)) goto fail;
    if (have) r->sample.top_p = (float)dv;
    if (get_int(api, root, "top_k", 1, INT32_MAX, &iv, &have, err)) goto fail;
    if (have) r->sample.top_k = (int32_t)iv;
    if (get_num(api, root, "repetition_penalty", 0, true, 100, &dv, &have, err)) goto fail;
    if (have) r->sample.repetition_penalty = (float)dv;
    /* OpenAI: temperature 0 is greedy; anything else samples. */
    if ((float)temperature == 0.0f) {
        r->sample.do_sample = false;
    } else {
        r->sample.do_sample = true;
        r->sample.temperature = (float)temperature;
    }
    if (get_int(api, root, "seed", 0, INT64_MAX, &iv, &have, err)) goto fail;
    if (have) { r->sample.seed = (uint64_t)iv; r->seed_set = true; }
    if (get_bool(api, root, "stream", &r->stream, NULL, err)) goto fail;
    if (get_bool(api, root, "add_special_tokens", &r->add_special, NULL, err)) goto fail;
    json_t *so = opt(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) { pln_req_fail(err, api, 400, "stream_options", "`stream_options` must be an object"); goto fail; }
        if (get_bool(api, so, "include_usage", &r->include_usage, NULL, err)) goto fail;
    }
    if (get_stop(api, root, lim, r, err)) goto fail;
    if (openai_extras(root, lim, r, err)) goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    pln_gen_request_free(r);
    return -1;
}

/* ---- OpenAI chat ------------------------------------------------------------------------- */

static const char *const g_chat_roles[PLN_CHAT_ROLES] = {"system", "user", "assistant"};

void pln_chat_template_free(pln_chat_template *t) {
    if (!t) return;
    for (int i = 0; i < PLN_CHAT_ROLES; i++) { free(t->prefix[i]); free(t->suffix[i]); }
    free(t->generation_prompt);
    for (int32_t i = 0; i < t->n_stop; i++) free(t->stop[i]);
    free(t->stop);
    memset(t, 0, sizeof *t);
}

static int tpl_string(const char *path, json_t *o, const char *key, const char *where, char **out) {
    json_t *v = json_object_get(o, key);
    if (!v) { *out = pln_xstrdup(""); return 0; }
    if (!json_is_string(v)) return pln_errorf("%s: `%s%s` must be a string", path, where, key);
    *out = pln_xstrdup(json_string_value(v));
    return 0;
}

int pln_chat_template_load(const char *path, pln_chat_template *t) {
    memset(t, 0, sizeof *t);
    /* Through the one checked open: a FIFO, a directory or a device given as --chat-template is
     * named at once, never waited on or read without end. */
    size_t len;
    char *text = pln_read_small_file(path, PLN_CHAT_TEMPLATE_MAX_BYTES, &len);
    if (!text) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return pln_errorf("%s: not a chat template: %s (line %d)", path, je.text, je.line);
    int rc = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(root)) rc = pln_errorf("%s: a chat template is a JSON object (see docs/SERVING.md)", path);
    json_object_foreach(root, key, v) {
        if (rc) break;
        int role = -1;
        for (int i = 0; i < PLN_CHAT_ROLES; i++) if (!strcmp(key, g_chat_roles[i])) role = i;
        if (role < 0 && strcmp(key, "generation_prompt") && strcmp(key, "stop"))
            rc = pln_errorf("%s: unknown key `%s` (expected system, user, assistant, generation_prompt, stop)", path, key);
        else if (role >= 0 && !json_is_object(v))
            rc = pln_errorf("%s: `%s` must be an object {\"prefix\": str, \"suffix\": str}", path, key);
        const char *k2;
        json_t *v2;
        if (!rc && role >= 0)
            json_object_foreach(v, k2, v2)
                if (!rc && strcmp(k2, "prefix") && strcmp(k2, "suffix"))
                    rc = pln_errorf("%s: unknown key `%s.%s` (expected prefix, suffix)", path, key, k2);
    }
    for (int i = 0; i < PLN_CHAT_ROLES && !rc; i++) {
        json_t *r = json_object_get(root, g_chat_roles[i]);
        char where[32];
        snprintf(where, sizeof where, "%s.", g_chat_roles[i]);
        json_t *empty = json_object();
        rc = tpl_string(path, r ? r : empty, "prefix", where, &t->prefix[i]);
        if (!rc) rc = tpl_string(path, r ? r : empty, "suffix", where, &t->suffix[i]);
        json_decref(empty);
    }
    if (!rc) rc = tpl_string(path, root, "generation_prompt", "", &t->generation_prompt);
    json_t *st = rc ? NULL : json_object_get(root, "stop");
    if (st) {
        if (!json_is_array(st) || json_array_size(st) > 4) rc = pln_errorf("%s: `stop` must be a list of at most 4 strings", path);
        t->stop = pln_xcalloc(json_array_size(st) + 1, sizeof *t->stop);
        for (size_t i = 0; !rc && i < json_array_size(st); i++) {
            json_t *x = json_array_get(st, i);
            if (!json_is_string(x) || json_string_length(x) == 0 || json_string_length(x) > 256)
                rc = pln_errorf("%s: `stop[%zu]` must be a string of 1 to 256 bytes", path, i);
            else
                t->stop[t->n_stop++] = pln_xstrdup(json_string_value(x));
        }
    }
    json_decref(root);
    if (rc) pln_chat_template_free(t);
    return rc;
}

/* An error about field `from` becomes one about `to`: the param, and each `from` quoted in the
 * message. */
static void rename_param(pln_req_error *err, const char *from, const char *to) {
    if (!strcmp(from, to)) return;
    char qf[72], qt[72], out[sizeof err->message];
    snprintf(qf, sizeof qf, "`%s`", from);
    snprintf(qt, sizeof qt, "`%s`", to);
    size_t o = 0, lf = strlen(qf), lt = strlen(qt);
    for (const char *p = err->message; *p && o + 1 < sizeof out;) {
        if (!strncmp(p, qf, lf) && o + lt < sizeof out) { memcpy(out + o, qt, lt); o += lt; p += lf; }
        else out[o++] = *p++;
    }
    out[o] = 0;
    memcpy(err->message, out, o + 1);
    if (!strcmp(err->param, from)) snprintf(err->param, sizeof err->param, "%s", to);
}

/* Appends s to the growing buffer *b (length *n). */
static void cat(char **b, size_t *n, const char *s) {
    size_t l = strlen(s);
    *b = pln_xrealloc(*b, *n + l + 1);
    memcpy(*b + *n, s, l + 1);
    *n += l;
}

/* The messages as the Jinja template sees them (see httpreq.h), rendered with the generation
 * prompt. 0 with *out malloc'd, or -1 with err filled. */
static int render_jinja(const struct pln_chat *chat, json_t *msgs, json_t *tools, bool gen, json_t *kwargs, char **out,
                        pln_req_error *err) {
    const pln_api api = PLN_API_OPENAI;
    json_t *m2 = json_array();
    int rc = 0;
    for (size_t i = 0; !rc && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu]` must be an object with a string `role`", i);
            break;
        }
        json_t *mc = json_deep_copy(m);
        json_t *ct = json_object_get(mc, "content");
        if (json_is_array(ct)) {   /* [{"type": "text", "text": str}, ...] joined, as TGI and vLLM do for text models */
            char *joined = NULL;
            size_t jn = 0;
            cat(&joined, &jn, "");
            for (size_t k = 0; !rc && k < json_array_size(ct); k++) {
                json_t *part = json_array_get(ct, k);
                const char *ty = json_string_value(json_object_get(part, "type"));
                const char *tx = json_string_value(json_object_get(part, "text"));
                if (!ty || strcmp(ty, "text") || !tx)
                    rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu].content[%zu]`: only {\"type\": \"text\", \"text\": str} parts are supported", i, k);
                else
                    cat(&joined, &jn, tx);
            }
            json_object_set_new(mc, "content", json_string(joined));
            free(joined);
        } else if (ct && !json_is_string(ct) && !json_is_null(ct)) {
            rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu].content` must be a string, null or a list of text parts", i);
        }
        json_t *calls = json_object_get(mc, "tool_calls");
        for (size_t k = 0; !rc && json_is_array(calls) && k < json_array_size(calls); k++) {
            json_t *fn = json_object_get(json_array_get(calls, k), "function");
            json_t *args = json_object_get(fn, "arguments");
            if (json_is_string(args)) {
                json_t *parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
                if (parsed) json_object_set_new(fn, "arguments", parsed);
            }
        }
        json_array_append_new(m2, mc);
    }
    if (!rc) {
        size_t n = 0;
        pln_jinja_status st = pln_chat_render(chat, m2, tools, gen, kwargs, NULL, out, &n);
        if (st == PLN_JINJA_RAISED)
            rc = pln_req_fail(err, api, 400, "messages", "the model's chat template refuses this conversation: %s", pln_error());
        else if (st != PLN_JINJA_OK)
            rc = pln_req_fail(err, api, 400, "messages", "the model's chat template could not render this conversation: %s", pln_error());
        if (rc) snprintf(err->code, sizeof err->code, "chat_template_error");
        else if (strlen(*out) != n) {
            free(*out);
            *out = NULL;
            rc = pln_req_fail(err, api, 400, "messages", "the rendered prompt contains a NUL byte");
        }
    }
    json_decref(m2);
    return rc;
}

int pln_req_parse_chat(const char *body, size_t len, const pln_serve_limits *lim, const pln_chat_template *tpl,
                       pln_gen_request *r, pln_req_error *err) {
    const pln_api api = PLN_API_OPENAI;
    memset(r, 0, sizeof *r);
    json_t *root = load_object(api, body, len, lim, err);
    if (!root) return -1;
    static const char *const known[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
        "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
        "user", "logit_bias", "top_k", "repetition_penalty", "typical_p", "add_special_tokens"};
    const char *key;
    json_t *v;
    int rc = 0;
    json_t *c = json_object();   /* the equivalent completions request */
    json_object_foreach(root, key, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++) ok = !strcmp(key, known[i]);
        /* tools only mean something to a Jinja template; pollen's JSON form has no place for them */
        if (tpl->jinja && (!strcmp(key, "tools") || !strcmp(key, "tool_choice") || !strcmp(key, "chat_template_kwargs") ||
                           !strcmp(key, "add_generation_prompt")))
            ok = true;
        if (!ok) { rc = pln_req_fail(err, api, 400, key, "Unrecognized request argument supplied: %s", key); break; }
        if (!strcmp(key, "messages") || !strcmp(key, "logprobs") || !strcmp(key, "top_logprobs") ||
            !strcmp(key, "max_completion_tokens") || !strcmp(key, "tools") || !strcmp(key, "tool_choice") ||
            !strcmp(key, "chat_template_kwargs") || !strcmp(key, "add_generation_prompt"))
            continue;
        json_object_set(c, key, v);
    }
    json_t *mc = opt(root, "max_completion_tokens");
    if (!rc && mc && !json_object_get(c, "max_tokens")) json_object_set(c, "max_tokens", mc);
    /* logprobs: true + top_logprobs N is completions' logprobs N */
    bool lp = false;
    if (!rc) rc = get_bool(api, root, "logprobs", &lp, NULL, err);
    json_t *tl = opt(root, "top_logprobs");
    if (!rc && tl && !lp) rc = pln_req_fail(err, api, 400, "top_logprobs", "`top_logprobs` needs `logprobs` true");
    if (!rc && lp) json_object_set_new(c, "logprobs", tl ? json_incref(tl) : json_integer(0));
    json_t *msgs = rc ? NULL : opt(root, "messages");
    if (!rc && (!msgs || !json_is_array(msgs) || json_array_size(msgs) == 0))
        rc = pln_req_fail(err, api, 400, "messages", "`messages` must be a non-empty list of {\"role\", \"content\"}");
    json_t *tools = rc ? NULL : opt(root, "tools");
    if (tools && json_is_null(tools)) tools = NULL;
    json_t *tc = rc ? NULL : opt(root, "tool_choice");
    if (!rc && tools && !json_is_array(tools)) rc = pln_req_fail(err, api, 400, "tools", "`tools` must be a list of tools");
    if (!rc && tc && !json_is_null(tc) && !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") || !strcmp(json_string_value(tc), "auto"))))
        rc = pln_req_fail(err, api, 400, "tool_choice", "`tool_choice` may be \"none\" or \"auto\": the answer comes back as text, "
                                                        "tool calls are not parsed out of it");
    char *prompt = NULL;
    size_t pn = 0;
    cat(&prompt, &pn, "");
    /* vLLM's extensions: more template variables, and the generation prompt left out (the
     * answer then continues the last message) */
    json_t *kwargs = rc ? NULL : opt(root, "chat_template_kwargs");
    if (!rc && kwargs && !json_is_null(kwargs) && pln_chat_check_extra(kwargs))
        rc = pln_req_fail(err, api, 400, "chat_template_kwargs", "`chat_template_kwargs`: %s", pln_error());
    bool gen = true;
    if (!rc && tpl->jinja) rc = get_bool(api, root, "add_generation_prompt", &gen, NULL, err);
    if (!rc && tpl->jinja) {
        char *rendered = NULL;
        rc = render_jinja(tpl->jinja, msgs, tools, gen, kwargs, &rendered, err);
        if (!rc) { free(prompt); prompt = rendered; }
    }
    for (size_t i = 0; !rc && !tpl->jinja && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        int ri = -1;
        for (int k = 0; role && k < PLN_CHAT_ROLES; k++) if (!strcmp(role, g_chat_roles[k])) ri = k;
        if (ri < 0) {
            rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu].role` must be system, user or assistant", i);
            break;
        }
        json_t *ct = json_object_get(m, "content");
        cat(&prompt, &pn, tpl->prefix[ri]);
        if (json_is_string(ct)) {
            cat(&prompt, &pn, json_string_value(ct));
        } else if (json_is_array(ct)) {   /* [{"type": "text", "text": str}, ...] */
            for (size_t k = 0; !rc && k < json_array_size(ct); k++) {
                json_t *part = json_array_get(ct, k);
                const char *ty = json_string_value(json_object_get(part, "type"));
                const char *tx = json_string_value(json_object_get(part, "text"));
                if (!ty || strcmp(ty, "text") || !tx)
                    rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu].content[%zu]`: only {\"type\": \"text\", \"text\": str} parts are supported", i, k);
                else
                    cat(&prompt, &pn, tx);
            }
        } else {
            rc = pln_req_fail(err, api, 400, "messages", "`messages[%zu].content` must be a string or a list of text parts", i);
        }
        cat(&prompt, &pn, tpl->suffix[ri]);
    }
    if (!rc) {
        if (!tpl->jinja) cat(&prompt, &pn, tpl->generation_prompt);
        json_object_set_new(c, "prompt", json_string(prompt));
        /* the template writes bos_token itself: vLLM's chat default is add_special_tokens false
         * (transformers' apply_chat_template(tokenize=True) encodes without specials) */
        if (!opt(c, "add_special_tokens")) json_object_set_new(c, "add_special_tokens", json_false());
    }
    /* the max_tokens the completions parser sees is max_completion_tokens when that was sent */
    const char *max_field = !rc && mc && !json_object_get(root, "max_tokens") ? "max_completion_tokens" : "max_tokens";
    const bool top_lp_sent = tl != NULL;   /* root (and tl with it) is released below */
    free(prompt);
    json_decref(root);
    if (rc) { json_decref(c); return -1; }
    char *cb = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    if (!cb) return pln_req_fail(err, api, 400, "messages", "`messages` must be valid UTF-8 text");
    pln_serve_limits l2 = *lim;
    l2.max_body_bytes = 0;   /* the rendered prompt may exceed the body limit the original met */
    rc = pln_req_parse_completions(cb, strlen(cb), &l2, r, err);
    free(cb);
    if (rc) {
        /* errors say what the chat client sent, not the completions request it became */
        rename_param(err, "prompt", "messages");
        rename_param(err, "max_tokens", max_field);
        if (top_lp_sent) rename_param(err, "logprobs", "top_logprobs");
        return rc;
    }
    r->chat = true;
    r->prompt_field = "messages";
    r->max_tokens_field = max_field;
    /* The template's stop sequences join the client's after the client's were checked: they are
     * the operator's, not counted against the client's limit of stop sequences. */
    if (tpl->n_stop) {
        r->stop = pln_xrealloc(r->stop, sizeof *r->stop * (size_t)(r->n_stop + tpl->n_stop));
        for (int32_t i = 0; i < tpl->n_stop; i++) r->stop[r->n_stop++] = pln_xstrdup(tpl->stop[i]);
    }
    return 0;
}

int pln_req_check_lengths(pln_api api, const char *prompt_field, const char *max_field, int32_t n_input,
                          int32_t max_new_tokens, const pln_serve_limits *lim, pln_req_error *err) {
    int bad = api == PLN_API_TGI ? 422 : 400;
    const char *param = prompt_field ? prompt_field : api == PLN_API_TGI ? "inputs" : "prompt";
    const char *mx = max_field ? max_field : api == PLN_API_TGI ? "max_new_tokens" : "max_tokens";
    if (n_input <= 0) return pln_req_fail(err, api, bad, param, "`%s` cannot be empty", param);
    if (n_input > lim->max_input_tokens)
        return pln_req_fail(err, api, bad, param, "`%s` must have less than %d tokens. Given: %d (--max-input-tokens)",
                            param, lim->max_input_tokens + 1, n_input);
    if ((int64_t)n_input + max_new_tokens > lim->max_total_tokens)
        return pln_req_fail(err, api, bad, mx,
                            "`%s` tokens + `%s` must be <= %d. Given: %d `%s` tokens and %d `%s` (--max-total-tokens)",
                            param, mx, lim->max_total_tokens, n_input, param, max_new_tokens, mx);
    return 0;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Classifies the sequence starting at s[i]: a valid one (returns its length 1..4), a valid
 * prefix running into the end (returns -k, k bytes), or an invalid maximal subpart (sets *bad,
 * returns its length: the lead byte plus the continuation bytes that were still acceptable).
 * One U+FFFD per maximal subpart is the Unicode-recommended practice that Rust's
 * String::from_utf8_lossy (and so Hugging Face tokenizers) follows. */
static int utf8_seq(const unsigned char *s, size_t n, size_t i, bool *bad) {
    unsigned c = s[i];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    *bad = false;
    if (c < 0x80) return 1;
    else if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *bad = true; return 1; }
    for (int k = 1; k <= need; k++) {
        if (i + k >= n) return -k;
        unsigned d = s[i + k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) { *bad = true; return k; }
    }
    return need + 1;
}

size_t pln_utf8_complete_len(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        bool bad;
        int k = utf8_seq(s, n, i, &bad);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

char *pln_utf8_sanitize(const char *str, size_t n, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    char *out = pln_xmalloc(n * 3 + 1);
    size_t o = 0, i = 0;
    while (i < n) {
        bool bad;
        int k = utf8_seq(s, n, i, &bad);
        if (k < 0) { k = -k; bad = true; }   /* truncated at the very end: one U+FFFD */
        if (bad) { memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; }
        else { memcpy(out + o, s + i, (size_t)k); o += (size_t)k; }
        i += (size_t)k;
    }
    out[o] = 0;
    if (out_len) *out_len = o;
    return out;
}
