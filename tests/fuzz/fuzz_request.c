/* fuzz_request.c — libFuzzer target: any bytes as a request body for every route's parser
 * (TGI /generate, /tokenize, OpenAI /v1/completions and /v1/chat/completions), then the error serializer and the UTF-8
 * helpers on the same bytes. Accepted requests must satisfy the ranges the scheduler relies on;
 * rejected ones must carry a 4xx status and serialize to JSON. The same bytes, read as a request
 * head ("name: value" lines), go through the body-framing check (httpframe.h): it must decide
 * one framing or refuse with 400/413, and never accept a length over the limit. The relay's
 * framing follower (httprelay.h) reads them, bare and behind a chunked head, whole and in pieces:
 * the same verdict either way. */
#include "runtime/httpframe.h"
#include "runtime/httprelay.h"
#include "runtime/httpreq.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void check_request(const pln_gen_request *r, const pln_serve_limits *lim) {
    if (r->n_prompts < 1 || r->n_prompts > lim->max_prompts) __builtin_trap();
    for (int32_t i = 0; i < r->n_prompts; i++) {
        if (r->prompt_ids && r->prompt_ids[i]) {   /* token ids: at least one, none negative, no text yet */
            if (r->prompts[i] || r->n_prompt_ids[i] < 1) __builtin_trap();
            for (int32_t k = 0; k < r->n_prompt_ids[i]; k++) if (r->prompt_ids[i][k] < 0) __builtin_trap();
        } else if (!r->prompts[i] || !r->prompts[i][0]) {
            __builtin_trap();
        }
    }
    if (r->max_new_tokens < 1 || r->max_new_tokens > lim->max_total_tokens) __builtin_trap();
    const pln_sample_params *p = &r->sample;
    if (!(p->temperature > 0) || !isfinite(p->temperature)) __builtin_trap();
    if (!(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0 || !(p->repetition_penalty > 0)) __builtin_trap();
    if (r->n_stop > lim->max_stop_sequences) __builtin_trap();
    for (int32_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i][0] || strlen(r->stop[i]) > (size_t)lim->max_stop_bytes) __builtin_trap();
    if (r->n < 1 || r->best_of < r->n || r->best_of > lim->max_best_of) __builtin_trap();
    if (r->top_n < 0 || r->top_n > PLN_TOP_MAX || r->top_n > lim->max_top_n_tokens) __builtin_trap();
    if (!(p->typical_p > 0 && p->typical_p <= 1) || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        __builtin_trap();
    if (r->truncate < 0 || r->truncate > lim->max_input_tokens) __builtin_trap();
}

static void check_error(const pln_req_error *e, pln_api api) {
    if (e->status < 400 || e->status > 499 || !e->type) __builtin_trap();
    char *js = pln_req_error_json(api, e);
    json_t *o = json_loads(js, 0, NULL);
    if (!o) __builtin_trap();
    json_decref(o);
    free(js);
}

static void check_framing_of(const uint8_t *data, size_t size) {
    char *head = malloc(size + 1);
    memcpy(head, data, size);
    head[size] = 0;   /* a NUL inside the input ends that field early, as it would in libmicrohttpd */
    pln_http_field f[64];
    size_t n = 0;
    int n_te = 0, n_cl = 0;
    for (char *line = head, *next; line && n < 64; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        f[n++] = (pln_http_field){line, colon + 1};
        n_te += !strcasecmp(line, "Transfer-Encoding");
        n_cl += !strcasecmp(line, "Content-Length");
    }
    int64_t max_body = size ? (int64_t)data[0] * 997 : 0;   /* 0: no limit */
    pln_frame fr;
    pln_req_error err;
    if (pln_http_check_framing(f, n, max_body, PLN_API_TGI, &fr, &err) == 0) {
        if (fr.kind == PLN_FRAME_CHUNKED && (n_te != 1 || n_cl)) __builtin_trap();
        if (fr.kind != PLN_FRAME_CHUNKED && n_te) __builtin_trap();
        if (fr.kind == PLN_FRAME_LENGTH && (!n_cl || !fr.length || (max_body > 0 && fr.length > (uint64_t)max_body))) __builtin_trap();
        if (fr.kind == PLN_FRAME_NONE && fr.length) __builtin_trap();
    } else {
        if (err.status != 400 && err.status != 413) __builtin_trap();
        check_error(&err, PLN_API_TGI);
    }
    free(head);
}

/* The relay's framing follower (httprelay.h) on the bytes as they come and behind a chunked head:
 * its verdict and state do not depend on how the bytes are split (a TCP stream splits anywhere). */
static void scan_in(const uint8_t *data, size_t size, size_t piece, pln_scan *s, int *got) {
    pln_scan_init(s);
    *got = 0;
    for (size_t off = 0; off < size && !*got; off += piece)
        *got = pln_scan_feed(s, (const char *)data + off, size - off < piece ? size - off : piece);
}

static void check_relay_scan(const uint8_t *data, size_t size) {
    static const char head[] = "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    uint8_t *buf = malloc(sizeof head + size);
    memcpy(buf, head, sizeof head - 1);
    if (size) memcpy(buf + sizeof head - 1, data, size);
    for (int with_head = 0; with_head < 2; with_head++) {
        const uint8_t *b = with_head ? buf : data;
        size_t n = with_head ? sizeof head - 1 + size : size;
        pln_scan whole, split;
        int g1, g2;
        scan_in(b, n, n ? n : 1, &whole, &g1);
        scan_in(b, n, 1 + (size ? data[0] % 13 : 0), &split, &g2);
        if (g1 != g2 || (!g1 && whole.st != split.st)) __builtin_trap();
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pln_serve_limits lim;
    pln_serve_limits_default(&lim);
    lim.max_body_bytes = 1 << 16;
    const char *body = (const char *)data;
    pln_gen_request r;
    pln_req_error err;
    if (pln_req_parse_generate(body, size, &lim, &r, &err) == 0) {
        check_request(&r, &lim);
        if (r.n_prompts != 1) __builtin_trap();
        pln_gen_request_free(&r);
    } else {
        check_error(&err, PLN_API_TGI);
    }
    if (pln_req_parse_completions(body, size, &lim, &r, &err) == 0) {
        check_request(&r, &lim);
        pln_gen_request_free(&r);
    } else {
        check_error(&err, PLN_API_OPENAI);
    }
    /* chat, with a fixed template (the loader reads files; this target reads none) */
    static char empty[] = "", u[] = "U: ", nl[] = "\n", gp[] = "A:";
    static char *stops[] = {nl};
    pln_chat_template tpl = {.prefix = {empty, u, empty}, .suffix = {nl, nl, nl}, .generation_prompt = gp,
                             .stop = stops, .n_stop = 1};
    if (pln_req_parse_chat(body, size, &lim, &tpl, &r, &err) == 0) {
        /* the template's stop sequences come on top of the client's (they are not the client's) */
        pln_serve_limits chat_lim = lim;
        chat_lim.max_stop_sequences += tpl.n_stop;
        check_request(&r, &chat_lim);
        if (r.n_stop < tpl.n_stop || strcmp(r.stop[r.n_stop - 1], nl)) __builtin_trap();
        if (!r.chat || r.n_prompts != 1) __builtin_trap();
        pln_gen_request_free(&r);
    } else {
        check_error(&err, PLN_API_OPENAI);
    }
    char *text = NULL;
    if (pln_req_parse_tokenize(body, size, &lim, &text, &err) == 0) {
        if (!text || !text[0]) __builtin_trap();
        free(text);
    } else {
        check_error(&err, PLN_API_TGI);
    }
    pln_tokenize_request tr;
    if (pln_req_parse_tokenize_any(body, size, &lim, &tr, &err) == 0) {
        if (!tr.text || !tr.text[0]) __builtin_trap();
        pln_tokenize_request_free(&tr);
    } else {
        check_error(&err, tr.vllm ? PLN_API_OPENAI : PLN_API_TGI);
    }
    int32_t *ids = NULL, n_ids = 0;
    char *model = NULL;
    if (pln_req_parse_detokenize(body, size, &lim, &ids, &n_ids, &model, &err) == 0) {
        if (!ids || n_ids < 0 || n_ids > lim.max_total_tokens) __builtin_trap();
        for (int32_t i = 0; i < n_ids; i++) if (ids[i] < 0) __builtin_trap();
        free(ids);
        free(model);
    } else {
        check_error(&err, PLN_API_OPENAI);
        if (ids || model) __builtin_trap();
    }
    /* UTF-8: the sanitized copy is valid (complete to its end) and never shorter in characters */
    size_t n = 0;
    char *s = pln_utf8_sanitize(body, size, &n);
    if (pln_utf8_complete_len(s, n) != n || strlen(s) > n) __builtin_trap();
    free(s);
    if (pln_utf8_complete_len(body, size) > size) __builtin_trap();
    check_framing_of(data, size);
    check_relay_scan(data, size);
    return 0;
}
