/* httpreq.h — parsing and validation of the server's request bodies (TGI /generate,
 * /generate_stream, /tokenize; OpenAI /v1/completions) as pure functions: bytes in, a request
 * struct or a ready-to-send error out. No I/O, no globals, so the fuzz target and the validation
 * table test call exactly what the server calls.
 *
 * Error convention: the parse functions return 0, or -1 after filling *err with the HTTP status,
 * the error type (TGI "validation", OpenAI "invalid_request_error"), the offending parameter and a
 * message that says what is allowed. Nothing to free on failure. */
#ifndef PLN_HTTPREQ_H
#define PLN_HTTPREQ_H

#include "runtime/sampler.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Server limits: every one is a `pollen serve` flag and is shown by GET /info. */
typedef struct {
    int32_t max_concurrent_requests;  /* sequences admitted (running + waiting); over it: 429 */
    int32_t max_input_tokens;         /* prompt tokens */
    int32_t max_total_tokens;         /* prompt + max_new_tokens */
    int64_t max_body_bytes;           /* request body; over it: 413 */
    int32_t max_connections;          /* open HTTP connections */
    int32_t timeout_s;                /* idle connection timeout */
    int32_t request_timeout_s;        /* a request's whole head and body must arrive within it */
    int32_t max_connections_per_client; /* open connections from one client address (0: no limit) */
    int32_t max_batch_tokens;         /* token budget of one engine step */
    int32_t max_stop_sequences;
    int32_t max_stop_bytes;           /* length of one stop sequence */
    int32_t max_prompts;              /* OpenAI: prompts in one list */
    int32_t default_max_new_tokens;   /* TGI default; OpenAI's default max_tokens is 16 */
    int32_t max_best_of;              /* TGI best_of, OpenAI n and best_of */
    int32_t max_top_n_tokens;         /* TGI top_n_tokens, OpenAI logprobs (<= PLN_TOP_MAX) */
} pln_serve_limits;


void pln_serve_limits_default(pln_serve_limits *l);

typedef enum { PLN_API_TGI = 0, PLN_API_OPENAI = 1 } pln_api;

typedef struct {
    int status;              /* 400, 404, 413, 422, 429, 500, 503, ... */
    const char *type;        /* TGI: validation|overloaded|generation|unhealthy; OpenAI: invalid_request_error|... */
    char param[64];          /* OpenAI "param" ("" = null) */
    char code[48];           /* OpenAI "code" ("" = null) */
    char message[640];       /* long enough for the longest message (the chat route's missing-template advice) */
} pln_req_error;

/* Fills err for api (the type follows from status) and returns -1. */
int pln_req_fail(pln_req_error *err, pln_api api, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One generation request, the union of what both APIs can say. */
typedef struct {
    pln_api api;
    char **prompts;          /* owned; n_prompts >= 1 (TGI: exactly 1); NULL for a prompt given as
                                token ids until the server decodes its ids (echo) */
    int32_t n_prompts;
    int32_t **prompt_ids;    /* OpenAI: prompt i given as token ids (NULL: none given so; each
                                entry NULL for a text prompt); ids >= 0, checked against the
                                vocabulary by the server */
    int32_t *n_prompt_ids;
    bool prompt_ids_flat;    /* `prompt` was one list of ids (errors say prompt[k], else prompt[i][k]) */
    int32_t max_new_tokens;
    pln_sample_params sample;
    bool seed_set;           /* false: the scheduler draws a seed (reported in details) */
    char **stop;             /* owned */
    int32_t n_stop;
    bool details;            /* TGI details / per-token info */
    bool stream;             /* OpenAI "stream" (TGI streams by route) */
    bool return_full_text;   /* TGI: generated_text starts with the prompt */
    bool include_usage;      /* OpenAI stream_options.include_usage: a last chunk with usage */
    char *model;             /* OpenAI "model" (NULL if absent) */
    int32_t n;               /* sequences answered per prompt (OpenAI n; TGI 1) */
    int32_t best_of;         /* sequences generated per prompt (>= n): the n with the highest total
                                log-prob are answered (TGI: the rest go to best_of_sequences) */
    int32_t top_n;           /* alternatives per token (TGI top_n_tokens, OpenAI logprobs); 0 = none */
    bool logprobs;           /* OpenAI: `logprobs` given (even 0): each choice gets a logprobs object */
    bool prompt_logprobs;    /* TGI decoder_input_details, OpenAI echo + logprobs: prompt log-probs */
    bool echo;               /* OpenAI: the text starts with the prompt */
    int32_t truncate;        /* TGI: keep only the last `truncate` prompt tokens (0 = off) */
    bool chat;               /* OpenAI chat: answered as chat.completion(.chunk) */
    /* The names the client used, for errors found after parsing (static strings): the prompt
     * ("inputs", "prompt", "messages") and the new-token limit ("max_new_tokens", "max_tokens",
     * "max_completion_tokens"). */
    const char *prompt_field, *max_tokens_field;
    bool add_special;        /* tokenize the prompt with the post-processor (BOS for Llama): true for
                                TGI and completions (add_special_tokens, default true), false for
                                chat (the template writes bos_token; add_special_tokens default false) */
} pln_gen_request;

/* TGI body {"inputs": str, "parameters": {...}, "stream": bool}. Unknown parameters are ignored
 * (as TGI does for ones it does not implement); known ones are checked for type and range;
 * `watermark` true, a `grammar` or an `adapter_id` are refused with 422 (not implemented).
 * `stream` is read into out->stream (only the root route `POST /` uses it). */
int pln_req_parse_generate(const char *body, size_t len, const pln_serve_limits *lim,
                           pln_gen_request *out, pln_req_error *err);
/* OpenAI body {"prompt": str | [str] | [id] | [[id]] (token ids as vLLM and OpenAI accept them),
 * "max_tokens", "temperature", "top_p", "stop", "stream",
 * "stream_options", "seed", "model", "n", "best_of", "logprobs", "echo", "presence_penalty",
 * "frequency_penalty", "logit_bias" (empty only), "user", "suffix" (refused: 400)} plus the
 * extensions "top_k", "repetition_penalty", "typical_p". Any other field is a 400
 * ("Unrecognized request argument supplied"), as the OpenAI API answers. */
int pln_req_parse_completions(const char *body, size_t len, const pln_serve_limits *lim,
                              pln_gen_request *out, pln_req_error *err);
/* A chat template (`pollen serve --chat-template FILE`): a JSON object
 *   {"system":    {"prefix": str, "suffix": str},   (each role optional; "" when absent)
 *    "user":      {"prefix": str, "suffix": str},
 *    "assistant": {"prefix": str, "suffix": str},
 *    "generation_prompt": str,                      (appended after the last message)
 *    "stop": [str, ...]}                            (added to every chat request's stop list)
 * A conversation becomes prefix(role) + content + suffix(role) per message, then
 * generation_prompt. Unknown keys are refused (a typo must not silently change prompts). */
#define PLN_CHAT_ROLES 3
struct pln_chat;
typedef struct {
    char *prefix[PLN_CHAT_ROLES], *suffix[PLN_CHAT_ROLES];   /* system, user, assistant */
    char *generation_prompt;
    char **stop;
    int32_t n_stop;
    /* The model's own Jinja template (runtime/chat.h; borrowed): when set, the fields above are
     * unused and the conversation is rendered as transformers' apply_chat_template does. */
    const struct pln_chat *jinja;
} pln_chat_template;
/* The largest chat template file read (a template is a few hundred bytes). */
#define PLN_CHAT_TEMPLATE_MAX_BYTES (1u << 20)
/* Loads and checks path, a regular file of at most PLN_CHAT_TEMPLATE_MAX_BYTES (opened with
 * pln_open_file); -1 + error naming the file and the field. */
int pln_chat_template_load(const char *path, pln_chat_template *t);
void pln_chat_template_free(pln_chat_template *t);

/* OpenAI /v1/chat/completions body {"messages": [{"role", "content"}], "model", "max_tokens" |
 * "max_completion_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
 * "seed", "presence_penalty", "frequency_penalty", "logprobs" (bool), "top_logprobs", "user",
 * "logit_bias", "tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt"} rendered
 * with tpl into one prompt, then checked as a
 * completions request. out->chat is set. Other fields: 400 as for completions.
 * With a Jinja template (tpl->jinja) the messages go to it as they are, except that a content
 * given as a list of text parts is joined into one string and a tool call's "arguments" JSON
 * string is parsed into an object (as vLLM does: templates expect a mapping); any role is
 * allowed (the template decides), "tools" reaches the template, "chat_template_kwargs" (vLLM's:
 * an object of more template variables, e.g. {"enable_thinking": false}) joins its variables and
 * "add_generation_prompt" (default true) is passed on. A template that refuses
 * the conversation (raise_exception) or fails to render is a 400 with its message
 * (code "chat_template_error"). With pollen's JSON form, "tools", "tool_choice",
 * "chat_template_kwargs" and "add_generation_prompt" are unrecognized arguments (400). */
int pln_req_parse_chat(const char *body, size_t len, const pln_serve_limits *lim, const pln_chat_template *tpl,
                       pln_gen_request *out, pln_req_error *err);

/* vLLM /detokenize body {"tokens": [id, ...], "model": str (optional)}: *ids (malloc'd, may be
 * empty) and *model (NULL when absent) are owned by the caller. Ids must be integers >= 0 (the
 * vocabulary bound is the server's check), at most max_total_tokens of them. */
int pln_req_parse_detokenize(const char *body, size_t len, const pln_serve_limits *lim, int32_t **ids, int32_t *n,
                             char **model, pln_req_error *err);
/* TGI /tokenize body {"inputs": str}; *text_out is owned by the caller. */
int pln_req_parse_tokenize(const char *body, size_t len, const pln_serve_limits *lim,
                           char **text_out, pln_req_error *err);
/* /tokenize in either form: TGI's {"inputs": str} (vllm false), or vLLM's {"prompt": str,
 * "model", "add_special_tokens" (default true), "return_token_strs"} (vllm true: errors in the
 * OpenAI shape, other fields refused). A body with "prompt" and no "inputs" is vLLM's. */
typedef struct {
    char *text, *model;       /* owned; model NULL when absent */
    bool vllm, add_special, token_strs;
} pln_tokenize_request;
int pln_req_parse_tokenize_any(const char *body, size_t len, const pln_serve_limits *lim, pln_tokenize_request *out,
                               pln_req_error *err);
void pln_tokenize_request_free(pln_tokenize_request *r);
void pln_gen_request_free(pln_gen_request *r);

/* The token-count checks done once the prompt is tokenized: empty prompt, over max_input_tokens,
 * prompt + max_new_tokens over max_total_tokens. The errors name prompt_field and max_field, the
 * fields the client sent (pln_gen_request's; NULL: the api's usual ones). */
int pln_req_check_lengths(pln_api api, const char *prompt_field, const char *max_field, int32_t n_input,
                          int32_t max_new_tokens, const pln_serve_limits *lim, pln_req_error *err);

/* Serializes an error body: TGI {"error","error_type"}; OpenAI {"error":{message,type,param,code}}.
 * Returns a malloc'd string. */
char *pln_req_error_json(pln_api api, const pln_req_error *err);

/* ---- UTF-8 helpers (generated bytes are not always valid UTF-8 at a token boundary) ---- */
/* Length of the longest prefix of s[0..n) that does not end inside an incomplete but so far
 * valid multi-byte sequence. Invalid bytes count as complete (they become U+FFFD on output). */
size_t pln_utf8_complete_len(const char *s, size_t n);
/* Copy of s[0..n) with each maximal invalid subpart (e.g. a truncated sequence) replaced by one
 * U+FFFD, as Rust's from_utf8_lossy and so Hugging Face decode do;
 * NUL-terminated, malloc'd; *out_len (if not NULL) gets its length. */
char *pln_utf8_sanitize(const char *s, size_t n, size_t *out_len);

#endif
